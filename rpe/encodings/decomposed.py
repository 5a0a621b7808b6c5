"""The decomposed relative position of MViTv2 (Li et al. 2022), also ViTDet's and SAM's image encoder's.

A row table and a column table of head-dim vectors, read by the query alone (per head ``h``; ``q_i`` is not
multiplied by ``s``, as MViTv2 and SAM add the term, so their tables copy over unchanged)::

    e_ij = s q_i.k_j + q_i.R_h[dr + h-1] + q_i.R_w[dc + w-1],   (dr, dc) = p_i - p_j

On an ``h x w`` grid ``R_h`` is ``(2h-1, d)`` and ``R_w`` ``(2w-1, d)``. Parameters ``rpe_k.rel_pos_h``,
``rpe_k.rel_pos_w``: ``(Hs, 2M-1, d)``, ``M = rpe.window`` the side the tables are made for (14 in the preset:
DeiT's 14x14 patch grid at 224 px, SAM's windows), ``Hs = 1`` with ``shared_head`` (SAM's and MViTv2's
layout, the preset) or one table per head. On another grid each table is resampled along its offset axis to
``2h-1`` (``2w-1``) entries, as timm's ``get_rel_pos`` does: ``F.interpolate(mode="linear")`` (half-pixel
centres), so on an ``M x M`` grid the tables are read as they are, one entry per offset. A Swin layer sizes
its tables by its attention window (`fit_window`, SAM's windowed blocks). Pairs with a skip token (the class
token) get no term, as in MViTv2 (``has_cls_token``).

Factorised form (no ``(B, H, n, n)`` tensor is built here): two ``rows`` pieces, ``q_i . R_h[o]`` for every
row offset ``o``, ``(B, H, n, 2h)`` (the last column zero, for skip pairs), gathered with ids ``dr + h-1``
(``2h-1`` for skip pairs), ``(n, n)``; the same for columns. The ``1/s`` goes onto the small table, not onto
``s q``.

Init: zeros, as SAM and MViTv2. The gradient of an entry at zero is not zero (``sum of dL/de_ij q_i`` over
the pairs with that offset; no second zero factor), so training moves it from the first step. DETR's
Xavier-uniform re-init covers these tables as it covers every RPE table.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import registry
from ..base import Description, LogitPiece, PositionEncoding, bucket_rows
from ..config import RPEConfig

__all__ = ["DecomposedRelPos", "resize_table", "relative_embeddings"]


def resize_table(table: Tensor, length: int) -> Tensor:
    """``table`` ``(Hs, L, d)`` linearly resampled to ``(Hs, length, d)`` along the offset axis (timm's
    ``get_rel_pos``); returned as it is when ``L == length``."""
    if table.shape[1] == length:
        return table
    return F.interpolate(table.transpose(1, 2), size=length, mode="linear").transpose(1, 2)


def relative_embeddings(q_size: int, k_size: int, table: Tensor) -> Tensor:
    """``(Hs, q_size, k_size, d)``: the embedding of each (query, key) pair along one axis, as timm's
    ``get_rel_pos``: the table resized to ``2 max(q_size, k_size) - 1`` and, when the sizes differ, the
    shorter side's coordinates stretched to the longer one's. Self-attention (``q_size == k_size``) reads
    entry ``p_q - p_k + size - 1``."""
    length = 2 * max(q_size, k_size) - 1
    resized = resize_table(table, length)
    q_coords = torch.arange(q_size, dtype=torch.float32, device=table.device)[:, None] * max(k_size / q_size, 1.0)
    k_coords = torch.arange(k_size, dtype=torch.float32, device=table.device)[None, :] * max(q_size / k_size, 1.0)
    coords = (q_coords - k_coords) + (k_size - 1) * max(q_size / k_size, 1.0)
    return resized[:, coords.long()]


def _axis_ids(h: int, w: int, skip: int, device: torch.device) -> Tensor:
    """``(2, n, n)`` long: row-offset ids ``dr + h-1`` and column-offset ids ``dc + w-1``; skip pairs get
    ``2h-1`` and ``2w-1`` (the zero column)."""
    rows = torch.arange(h, device=device).repeat_interleave(w)
    cols = torch.arange(w, device=device).repeat(h)
    n = skip + h * w
    ids = torch.empty((2, n, n), dtype=torch.long, device=device)
    ids[0].fill_(2 * h - 1)
    ids[1].fill_(2 * w - 1)
    ids[0, skip:, skip:] = rows[:, None] - rows[None, :] + h - 1
    ids[1, skip:, skip:] = cols[:, None] - cols[None, :] + w - 1
    return ids


class DecomposedRelPos(PositionEncoding):
    """Key-site contextual term ``q_i.R_h[dr] + q_i.R_w[dc]`` with interpolated tables (module docstring)."""

    adds_logits = True

    def __init__(
        self, config: RPEConfig, head_dim: int, num_heads: int, device: Any = None, dtype: Any = None
    ) -> None:
        super().__init__()
        self.name = "decomposed"
        self.num_heads = num_heads
        self.window = config.window
        self.table_heads = 1 if config.shared_head else num_heads
        shape = (self.table_heads, 2 * config.window - 1, head_dim)
        self.rel_pos_h = nn.Parameter(torch.zeros(shape, device=device, dtype=dtype))
        self.rel_pos_w = nn.Parameter(torch.zeros(shape, device=device, dtype=dtype))

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.rel_pos_h)
        nn.init.zeros_(self.rel_pos_w)

    def tables(self, h: int, w: int) -> tuple[Tensor, Tensor]:
        """The tables of an ``h x w`` grid: ``(Hs, 2h-1, d)`` and ``(Hs, 2w-1, d)``, offset ``-(h-1)`` first."""
        return resize_table(self.rel_pos_h, 2 * h - 1), resize_table(self.rel_pos_w, 2 * w - 1)

    def _ids(self, h: int, w: int, skip: int, device: torch.device) -> tuple[Tensor, Tensor]:
        ids = self.cached(("ids", h, w, skip, device), lambda: _axis_ids(h, w, skip, device))
        return ids[0], ids[1]

    def logit_pieces(
        self, q_scaled: Tensor, k_scaled: Tensor | None, h: int, w: int, skip: int, scale: float
    ) -> list[LogitPiece]:
        row_ids, col_ids = self._ids(h, w, skip, q_scaled.device)
        rel_h, rel_w = self.tables(h, w)
        # the term reads q, not s q: 1/s on the (Hs, d, 2h-1) table instead of a pass over (B, H, n, d)
        rows = bucket_rows(q_scaled, rel_h.transpose(1, 2) / scale, 2 * h)
        cols = bucket_rows(q_scaled, rel_w.transpose(1, 2) / scale, 2 * w)
        return [LogitPiece("rows", rows, row_ids), LogitPiece("rows", cols, col_ids)]

    def naive_logits(self, q: Tensor, k: Tensor, h: int, w: int, skip: int, scale: float) -> Tensor:
        """Every pair's ``r_ij = R_h[dr] + R_w[dc]`` materialised, ``(Hs, n, n, d)``, then ``q_i.r_ij``."""
        rows = torch.arange(h, device=q.device).repeat_interleave(w)
        cols = torch.arange(w, device=q.device).repeat(h)
        by_rows = relative_embeddings(h, h, self.rel_pos_h)[:, rows[:, None], rows[None, :]]  # (Hs, hw, hw, d)
        by_cols = relative_embeddings(w, w, self.rel_pos_w)[:, cols[:, None], cols[None, :]]
        pairs = F.pad(by_rows + by_cols, (0, 0, skip, 0, skip, 0))  # skip pairs: zero
        pairs = pairs.to(q.dtype).expand(q.shape[1], -1, -1, -1)
        return torch.einsum("bhid,hijd->bhij", q, pairs)

    def describe(self, h: int, w: int) -> Description:
        """Panel: ``|R_h[dr] + R_w[dc]|`` per offset on the ``h x w`` grid (the tables resized to it)."""
        with torch.no_grad():
            rel_h, rel_w = (t.detach().float().cpu() for t in self.tables(h, w))
            norm = (rel_h[:, :, None, :] + rel_w[:, None, :, :]).norm(dim=-1)  # (Hs, 2h-1, 2w-1)
        return Description(
            "decomposed", "k", "decomposed (MViTv2/SAM): row and column offset embeddings, L2 norm of R_h + R_w",
            [("", norm)], signed=False, buckets=self.rel_pos_h.shape[1] + self.rel_pos_w.shape[1],
        )

    def extra_repr(self) -> str:
        return f"shape={tuple(self.rel_pos_h.shape)} x 2, window={self.window}"


def _fit_window(config: RPEConfig, window: int) -> RPEConfig:
    """Inside an attention window the tables are made for the window (SAM's windowed blocks)."""
    return dataclasses.replace(config, window=window)


registry.register(registry.Encoding(
    "decomposed", DecomposedRelPos.build,
    "MViTv2/SAM decomposed: q.R_h[dr] + q.R_w[dc], tables of rpe.window interpolated to the grid",
    fields=("shared_head", "window"), directed=True, fit_window=_fit_window,
))
registry.register_preset("decomposed", RPEConfig(method="decomposed"))
