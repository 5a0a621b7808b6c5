"""SASA's relative encoding (Ramachandran et al. 2019, "Stand-Alone Self-Attention in Vision Models"):

    e_ij = s q_i.(k_j + r_ij),   r_ij = [R[dr] (d/2 channels), C[dc] (d/2 channels)]

a row-offset embedding and a column-offset embedding of half the head dim each, concatenated. The
offsets are indexed per axis like iRPE's cross method (``index`` clip and ``ratio`` 6.5 in the
preset: ``B = 13``, one exact embedding per offset of a 14x14 grid), with the skip bucket for pairs
with a class token. Parameters ``rpe_k.rel_rows``, ``rpe_k.rel_cols``: ``(Hs, d/2, nb)``, zero-init.

timm counterpart: ``PosEmbedRel`` (`timm.layers.bottleneck_attn`; `timm.layers.halo_attn`'s with
``block_size = win_size`` on a square grid), whose ``height_rel`` ``(2h-1, d)`` and ``width_rel`` ``(2w-1, d)``
add ``q_i.height_rel[m_r] + q_i.width_rel[m_c]`` with one table for all heads. It differs in layout in two
ways; with shared heads (the preset) on a grid whose offsets are all exact (``h, w <= B + 1``) this module
equals it (`tests/test_rpe_sasa.py`) for ``height_rel[m] = [R[B + (h-1) - m], 0]`` and
``width_rel[m] = [0, C[B + (w-1) - m]]``:

* sign: timm indexes by key minus query, ``m_r = (r_j - r_i) + h - 1`` (its ``rel_logits_1d``), this module by
  query minus key (``dr = r_i - r_j``, bucket ``dr + B``), so timm's table is ours reversed along the offsets;
* width: timm's row and column embeddings each span the whole head dim, ours half each (rows the first half
  of ``q``, columns the second), so the other half of timm's is zero.

Scale: this term is ``s q.r``, timm's ``BottleneckAttn`` with ``scale_pos_embed=True``; its default (False)
adds ``q.r`` unscaled.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

from .. import registry
from ..base import Description, LogitPiece, PositionEncoding, bucket_rows
from ..config import RPEConfig, RPEConfigError
from ..index import IndexSpec, bucket_ids, num_buckets
from ..tables import offset_bucket_ids

__all__ = ["SASAEmbedding"]


class SASAEmbedding(PositionEncoding):
    """Key-site contextual term with a row half and a column half of the head dim (module docstring)."""

    adds_logits = True
    has_skip_bucket = True

    def __init__(
        self, config: RPEConfig, head_dim: int, num_heads: int, skip_bucket: bool = True, device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if head_dim % 2:
            raise RPEConfigError(f"rpe.method='sasa' splits the head dim in two halves; head_dim={head_dim} is odd")
        self.name = "sasa"
        cross = dataclasses.replace(config, method="cross")
        self.specs = (IndexSpec.from_config(cross, axis=0), IndexSpec.from_config(cross, axis=1))
        self.half = head_dim // 2
        self.num_heads = num_heads
        self.table_heads = 1 if config.shared_head else num_heads
        self.skip_bucket = skip_bucket
        self.num_buckets = num_buckets(self.specs[0]) + int(skip_bucket)
        shape = (self.table_heads, self.half, self.num_buckets)
        self.rel_rows = nn.Parameter(torch.zeros(shape, device=device, dtype=dtype))
        self.rel_cols = nn.Parameter(torch.zeros(shape, device=device, dtype=dtype))

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.rel_rows)
        nn.init.zeros_(self.rel_cols)

    def _ids(self, h: int, w: int, skip: int, device: torch.device) -> tuple[Tensor, Tensor]:
        if skip and not self.skip_bucket:
            raise ValueError(f"the sequence has {skip} skip token(s) but this SASA embedding has no skip bucket")
        return tuple(bucket_ids(spec, h, w, skip, device) for spec in self.specs)  # type: ignore[return-value]

    def logit_pieces(
        self, q_scaled: Tensor, k_scaled: Tensor | None, h: int, w: int, skip: int, scale: float
    ) -> list[LogitPiece]:
        row_ids, col_ids = self._ids(h, w, skip, q_scaled.device)
        rows = bucket_rows(q_scaled[..., : self.half], self.rel_rows, self.num_buckets)
        cols = bucket_rows(q_scaled[..., self.half :], self.rel_cols, self.num_buckets)
        return [LogitPiece("rows", rows, row_ids), LogitPiece("rows", cols, col_ids)]

    def naive_logits(self, q: Tensor, k: Tensor, h: int, w: int, skip: int, scale: float) -> Tensor:
        row_ids, col_ids = self._ids(h, w, skip, q.device)
        pairs = torch.cat([self.rel_rows[:, :, row_ids], self.rel_cols[:, :, col_ids]], dim=1)  # (Hs, d, n, n)
        pairs = pairs.permute(0, 2, 3, 1).to(q.dtype).expand(q.shape[1], -1, -1, -1)
        return torch.einsum("bhid,hijd->bhij", q * scale, pairs)

    def describe(self, h: int, w: int) -> Description:
        """Panel: ``|r_ij|`` per offset, ``sqrt(|R[dr]|^2 + |C[dc]|^2)``."""
        with torch.no_grad():
            rows = self.rel_rows.detach().float().cpu().norm(dim=1) ** 2  # (Hs, nb)
            cols = self.rel_cols.detach().float().cpu().norm(dim=1) ** 2
            row_off = offset_bucket_ids(bucket_ids(self.specs[0], h, w, 0, "cpu"), h, w)
            col_off = offset_bucket_ids(bucket_ids(self.specs[1], h, w, 0, "cpu"), h, w)
            norm = (rows[:, row_off] + cols[:, col_off]).sqrt()
        return Description(
            "sasa", "k", "SASA: row and column offset embeddings (d/2 each), L2 norm of r_ij", [("", norm)],
            signed=False, buckets=2 * self.num_buckets,
        )

    def extra_repr(self) -> str:
        return f"shape={tuple(self.rel_rows.shape)} x 2"


registry.register(registry.Encoding(
    "sasa", SASAEmbedding.build, "SASA: q.(k + [row emb d/2, col emb d/2])", fields=("shared_head", "ratio", "index"),
    directed=True,
))
registry.register_preset(
    "sasa", RPEConfig(method="sasa", shared_head=True, ratio=6.5, index="clip")
)
