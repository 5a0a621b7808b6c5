"""Learned parametrisations of the buckets, one module per injection site (q, k or v).

A q/k site hands attention a list of `LogitPiece` (terms added to the scaled logits) through
``logit_pieces``; a v site adds ``value_term`` to the output. Pieces are kept factorised
(a small table or a per-row lookup ``L`` plus the ``(n, n)`` bucket ids) so that fused kernels
(FlexAttention) can gather on the fly and no ``(n, n, d)`` tensor is ever built (spec section 5).

Parameter names follow the reference checkpoints: ``lookup_table_bias`` ``(Hs, nb)`` in bias mode,
``lookup_table_weight`` ``(Hs, d, nb)`` for contextual q/k and ``(Hs, nb, d)`` for contextual v;
the cross method nests two such tables as ``rp_rows`` and ``rp_cols``. ``nb`` always includes the
skip bucket (see `rpe.index`); a reference table saved without it (DETR, skip = 0) is zero-padded
on load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import RPEConfig, resolve_rpe
from .index import IndexSpec, bucket_ids, bucket_onehot, num_buckets

__all__ = [
    "LogitPiece",
    "RelativePositionTable",
    "CrossRelativePositionTable",
    "TransformerXLTerm",
    "build_rpe",
    "materialize_pieces",
]


@dataclass
class LogitPiece:
    """A term of the attention logits in factorised form.

    kind "table": ``values`` ``(Hs, nb)``, term ``values[h, ids[i, j]]``.
    kind "rows":  ``values`` ``(B, H, n, nb)``, term ``values[b, h, i, ids[i, j]]``.
    kind "dense": ``values`` broadcastable to ``(B, H, n, n)``, added as is (``ids`` unused).
    ``transposed`` swaps the pair: term(i, j) is the above evaluated at (j, i) (query-site terms).
    ``onehot`` (optional, "rows" only): ``(n, n, nb')`` one-hot of ``ids`` with ``nb'`` the width of
    ``values``; when given, the gather is a batched matrix product (`onehot_gather`).
    """

    kind: str
    values: Tensor
    ids: Tensor | None = None
    transposed: bool = False
    onehot: Tensor | None = None

    def materialize(self) -> Tensor:
        """The term as a tensor broadcastable to ``(B, H, n, n)``."""
        if self.kind == "dense":
            return self.values
        if self.kind == "table":
            term = self.values[:, self.ids].unsqueeze(0)  # (1, Hs, n, n)
        elif self.onehot is not None:
            term = onehot_gather(self.values, self.onehot)
        else:
            B, H, n, _ = self.values.shape
            term = torch.gather(self.values, -1, self.ids.expand(B, H, n, n))
        return term.transpose(-1, -2) if self.transposed else term


# Devices where the bucket gather and scatter-add run as batched one-hot matrix products. On CUDA
# that avoids atomics (deterministic gradients, fp32 accumulation) and measured faster: H200, bf16,
# DeiT-S shapes at batch 128, gather + its backward 0.45-0.49 ms vs 0.25-0.32 ms one-hot (two calls of
# scripts/profile_attention.py). On CPU gather/scatter_add is faster (2.4-2.8 vs 3.0-3.6 ms, batch 8).
ONEHOT_DEVICES = {"cuda"}


def onehot_gather(values: Tensor, onehot: Tensor) -> Tensor:
    """``term[b, h, i, j] = values[b, h, i, ids[i, j]]``: ``values`` ``(B, H, n, w)``, ``onehot``
    ``(n, n, w)`` -> ``(B, H, n, n)`` (a view with contiguous last dim), one ``(BH, w) @ (w, n)`` per query.
    """
    B, H, n, width = values.shape
    per_query = values.reshape(B * H, n, width).transpose(0, 1)  # (n, BH, w)
    return torch.bmm(per_query, onehot.transpose(1, 2)).transpose(0, 1).unflatten(0, (B, H))


def onehot_scatter(attn: Tensor, onehot: Tensor) -> Tensor:
    """``out[b, h, i, c] = sum_j attn[b, h, i, j] [ids[i, j] = c]``: ``(B, H, n, n)`` -> ``(B, H, n, w)``."""
    B, H, n, _ = attn.shape
    per_query = attn.reshape(B * H, n, n).transpose(0, 1)  # (n, BH, n)
    return torch.bmm(per_query, onehot).transpose(0, 1).unflatten(0, (B, H))


def bucket_rows(x: Tensor, table: Tensor, width: int) -> Tensor:
    """``x . r_b`` for every bucket: ``x`` ``(B, H, n, d)``, ``table`` ``(Hs, d, nb)`` -> ``(B, H, n, width)``;
    columns past ``nb`` are zero (padding to the one-hot width).
    """
    table = table.to(x.dtype)
    if width > table.shape[-1]:
        table = F.pad(table, (0, width - table.shape[-1]))
    return x @ table.unsqueeze(0)


def materialize_pieces(pieces: list[LogitPiece]) -> Tensor | None:
    """Sum of all pieces, broadcastable to ``(B, H, n, n)``; None for no pieces."""
    total = None
    for piece in pieces:
        term = piece.materialize()
        total = term if total is None else total + term
    return total


class RelativePositionTable(nn.Module):
    """One learned lookup table at one site (``"q"``, ``"k"`` or ``"v"``).

    Parameters: bias mode ``lookup_table_bias`` ``(Hs, nb)``; contextual q/k ``lookup_table_weight``
    ``(Hs, d, nb)``; contextual v ``lookup_table_weight`` ``(Hs, nb, d)``, where ``nb`` is the
    index's bucket count plus the skip bucket and ``Hs`` is 1 with shared heads.
    """

    def __init__(
        self,
        config: RPEConfig,
        site: str,
        head_dim: int,
        num_heads: int,
        axis: int | None = None,
        skip_bucket: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if site not in ("q", "k", "v"):
            raise ValueError(f"site={site!r} is not one of: q, k, v")
        self.site = site
        self.mode = config.mode
        self.index_spec = IndexSpec.from_config(config, axis=axis)
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.table_heads = 1 if config.shared_head else num_heads
        self.skip_bucket = skip_bucket
        # As in the reference, the shared skip-token bucket exists only in models built with skip tokens.
        self.num_buckets = num_buckets(self.index_spec) + int(skip_bucket)
        dd = {"device": device, "dtype": dtype}
        if self.mode == "bias":
            self.lookup_table_bias = nn.Parameter(torch.empty(self.table_heads, self.num_buckets, **dd))
            self._bucket_dim = 1
        elif site == "v":
            self.lookup_table_weight = nn.Parameter(
                torch.empty(self.table_heads, self.num_buckets, head_dim, **dd)
            )
            self._bucket_dim = 1
        else:
            self.lookup_table_weight = nn.Parameter(
                torch.empty(self.table_heads, head_dim, self.num_buckets, **dd)
            )
            self._bucket_dim = 2
        self.reset_parameters()

    @property
    def table(self) -> Tensor:
        return self.lookup_table_bias if self.mode == "bias" else self.lookup_table_weight

    def reset_parameters(self) -> None:
        """Zeros (DeiT reference), except Swin's bias table: truncated normal, std .02 (Swin reference).

        DETR's reference re-initialises every >1-d parameter Xavier-uniform; do that from outside.
        """
        if self.index_spec.method == "swin" and self.mode == "bias":
            nn.init.trunc_normal_(self.table, std=0.02)
        else:
            nn.init.zeros_(self.table)

    def bucket_ids(self, h: int, w: int, skip: int, device: torch.device) -> Tensor:
        """Cached ``(n, n)`` bucket ids for this table's index."""
        if skip and not self.skip_bucket:
            raise ValueError(
                f"the sequence has {skip} skip token(s) before the {h}x{w} grid but this RPE table was built"
                " with skip_bucket=False (no bucket for class/distillation tokens)"
            )
        return bucket_ids(self.index_spec, h, w, skip, device)

    def bucket_onehot(self, h: int, w: int, skip: int, device: torch.device, dtype: torch.dtype) -> Tensor | None:
        """Cached ``(n, n, nb')`` one-hot of the bucket ids on `ONEHOT_DEVICES`, else None (callers
        get `bucket_ids` first, which checks the skip bucket).

        ``nb'`` is the bucket count rounded up to a multiple of 8: bf16 tensor-core GEMMs need
        16-byte aligned rows (``nb = 50`` is not).
        """
        if device.type not in ONEHOT_DEVICES:
            return None
        width = self.num_buckets + (-self.num_buckets % 8)
        return bucket_onehot(self.index_spec, h, w, skip, device, width, dtype)

    @property
    def uses_scaled_keys(self) -> bool:
        """Whether `logit_pieces` reads ``k_scaled``: only a contextual query-site table does."""
        return self.site == "q" and self.mode != "bias"

    def logit_pieces(
        self, q_scaled: Tensor, k_scaled: Tensor | None, h: int, w: int, skip: int, scale: float
    ) -> list[LogitPiece]:
        """Logit terms; ``q_scaled``, ``k_scaled`` are ``s q``, ``s k`` ``(B, H, n, d)``, ``s = scale``.

        ``k_scaled`` may be None when `uses_scaled_keys` is false.
        """
        if self.site == "v":
            raise RuntimeError("a value-site table adds no logit term; call value_term")
        ids = self.bucket_ids(h, w, skip, q_scaled.device)
        transposed = self.site == "q"
        if self.mode == "bias":
            return [LogitPiece("table", self.lookup_table_bias.to(q_scaled.dtype), ids, transposed)]
        # key site: e_ij += (s q_i) . r_b(i,j); query site: e_ij += (s k_j) . r_b(j,i)
        x = k_scaled if transposed else q_scaled
        onehot = self.bucket_onehot(h, w, skip, x.device, x.dtype)
        width = self.num_buckets if onehot is None else onehot.shape[-1]
        return [LogitPiece("rows", bucket_rows(x, self.lookup_table_weight, width), ids, transposed, onehot)]

    def pair_embeddings(self, h: int, w: int, skip: int, device: torch.device) -> Tensor:
        """Every pair's encoding ``r_b(i,j)``: ``(Hs, n, n)`` in bias mode, else ``(Hs, n, n, d)``.

        Only the ``naive`` backend builds this (the cost baseline of the spec's section 5).
        """
        ids = self.bucket_ids(h, w, skip, device)
        if self.mode == "bias":
            return self.lookup_table_bias[:, ids]
        if self.site == "v":
            return self.lookup_table_weight[:, ids]
        return self.lookup_table_weight[:, :, ids].permute(0, 2, 3, 1)

    def value_term(self, attn: Tensor, h: int, w: int, skip: int) -> Tensor:
        """``z_i += sum_j a_ij r_b(i,j)`` from probabilities ``attn`` ``(B, H, n, n)`` -> ``(B, H, n, d)``."""
        B, H, n, _ = attn.shape
        ids = self.bucket_ids(h, w, skip, attn.device)
        table = self.lookup_table_weight.to(attn.dtype)  # (Hs, nb, d)
        onehot = self.bucket_onehot(h, w, skip, attn.device, attn.dtype)
        if onehot is None:
            per_bucket = attn.new_zeros(B, H, n, self.num_buckets)
            per_bucket = per_bucket.scatter_add(-1, ids.expand(B, H, n, n), attn)
        else:
            per_bucket = onehot_scatter(attn, onehot)  # (B, H, n, nb')
            table = F.pad(table, (0, 0, 0, onehot.shape[-1] - self.num_buckets))
        return per_bucket @ table.unsqueeze(0)

    def extra_repr(self) -> str:
        return (
            f"site={self.site!r}, mode={self.mode!r}, method={self.index_spec.method!r}, "
            f"shape={tuple(self.table.shape)}"
        )


class CrossRelativePositionTable(nn.Module):
    """Cross method: two tables, ``rp_rows`` (index of ``dr``) and ``rp_cols`` (of ``dc``), summed."""

    def __init__(
        self,
        config: RPEConfig,
        site: str,
        head_dim: int,
        num_heads: int,
        skip_bucket: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.site = site
        self.rp_rows = RelativePositionTable(
            config, site, head_dim, num_heads, axis=0, skip_bucket=skip_bucket, device=device, dtype=dtype
        )
        self.rp_cols = RelativePositionTable(
            config, site, head_dim, num_heads, axis=1, skip_bucket=skip_bucket, device=device, dtype=dtype
        )

    @property
    def uses_scaled_keys(self) -> bool:
        return self.rp_rows.uses_scaled_keys

    def logit_pieces(
        self, q_scaled: Tensor, k_scaled: Tensor | None, h: int, w: int, skip: int, scale: float
    ) -> list[LogitPiece]:
        return self.rp_rows.logit_pieces(q_scaled, k_scaled, h, w, skip, scale) + self.rp_cols.logit_pieces(
            q_scaled, k_scaled, h, w, skip, scale
        )

    def pair_embeddings(self, h: int, w: int, skip: int, device: torch.device) -> Tensor:
        return self.rp_rows.pair_embeddings(h, w, skip, device) + self.rp_cols.pair_embeddings(h, w, skip, device)

    def value_term(self, attn: Tensor, h: int, w: int, skip: int) -> Tensor:
        return self.rp_rows.value_term(attn, h, w, skip) + self.rp_cols.value_term(attn, h, w, skip)


class TransformerXLTerm(nn.Module):
    """Transformer-XL relative terms on a 2-D grid, at the key site.

    ``e_ij = s * (q_i.k_j + q_i.(W_R R_ij) + u.k_j + v'.(W_R R_ij))`` with ``R_ij`` the sinusoidal
    embedding of the exact offset ``(dr, dc) = p_i - p_j``: ``F = ceil(H d / 4)`` frequencies per
    axis, ``[sin, cos](dr f), [sin, cos](dc f)`` (so half the dims encode ``dr``, half ``dc``).
    ``W_R`` (``r_proj``, per layer, ``(H d) <- 4F``) projects to a key-like vector per head;
    ``u`` (``pos_bias_u``) and ``v'`` (``pos_bias_v``) are learned ``(H, d)``.
    ``W_R R`` is evaluated once per distinct offset, ``(2h-1)(2w-1)`` of them, and gathered like a
    contextual key table. Pairs with a skip token get no relative term (a zero column);
    ``u.k_j`` is a content term and applies to every key. Heads are never shared.
    Init: ``W_R`` truncated normal std .02, ``u = v' = 0``.
    """

    def __init__(
        self, config: RPEConfig, head_dim: int, num_heads: int, device: Any = None, dtype: Any = None
    ) -> None:
        super().__init__()
        self.site = "k"
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.index_spec = IndexSpec.from_config(config)
        self.frequencies = math.ceil(num_heads * head_dim / 4)
        dd = {"device": device, "dtype": dtype}
        self.r_proj = nn.Linear(4 * self.frequencies, num_heads * head_dim, bias=False, **dd)
        self.pos_bias_u = nn.Parameter(torch.empty(num_heads, head_dim, **dd))
        self.pos_bias_v = nn.Parameter(torch.empty(num_heads, head_dim, **dd))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.trunc_normal_(self.r_proj.weight, std=0.02)
        nn.init.zeros_(self.pos_bias_u)
        nn.init.zeros_(self.pos_bias_v)

    def offset_embedding(self, h: int, w: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """Sinusoids of all offsets in bucket-id order: ``((2h-1)(2w-1), 4F)``."""
        dr = torch.arange(-(h - 1), h, device=device, dtype=torch.float64).repeat_interleave(2 * w - 1)
        dc = torch.arange(-(w - 1), w, device=device, dtype=torch.float64).repeat(2 * h - 1)
        inv_freq = 10000.0 ** (
            -torch.arange(self.frequencies, device=device, dtype=torch.float64) / self.frequencies
        )
        parts = []
        for offset in (dr, dc):
            angle = offset[:, None] * inv_freq[None, :]
            parts += [angle.sin(), angle.cos()]
        return torch.cat(parts, dim=-1).to(dtype)

    uses_scaled_keys = True  # the content term u.k_j

    def logit_pieces(
        self, q_scaled: Tensor, k_scaled: Tensor | None, h: int, w: int, skip: int, scale: float
    ) -> list[LogitPiece]:
        ids = bucket_ids(self.index_spec, h, w, skip, q_scaled.device)
        dtype = q_scaled.dtype
        weight = self.r_proj.weight.to(dtype)
        projected = self.offset_embedding(h, w, q_scaled.device, dtype) @ weight.t()  # (n_off, H d)
        n_off = projected.shape[0]
        table = projected.view(n_off, self.num_heads, self.head_dim).permute(1, 2, 0)  # (H, d, n_off)
        table = torch.cat([table, table.new_zeros(self.num_heads, self.head_dim, 1)], dim=-1)
        # q_scaled = s q and the whole XL score is scaled by s, so u and v' are scaled here too
        query = q_scaled + scale * self.pos_bias_v.to(dtype)[None, :, None, :]
        rows = query @ table.unsqueeze(0)  # (B, H, n, n_off + 1)
        key_bias = (
            (k_scaled * self.pos_bias_u.to(dtype)[None, :, None, :]).sum(-1).unsqueeze(-2)
        )  # (B, H, 1, n)
        return [LogitPiece("rows", rows, ids), LogitPiece("dense", key_bias)]


def build_rpe(
    config: RPEConfig | Any,
    head_dim: int,
    num_heads: int,
    *,
    skip_bucket: bool = True,
    device: Any = None,
    dtype: Any = None,
) -> tuple[nn.Module | None, nn.Module | None, nn.Module | None]:
    """Build the ``(rpe_q, rpe_k, rpe_v)`` site modules of one attention layer (None where unused).

    ``config`` is anything `resolve_rpe` accepts. ``skip_bucket`` reserves the extra bucket shared by
    skip (class/distillation) tokens: True for DeiT (table of 49 + 1 at ratio 1.9, as in the reference
    DeiT checkpoints), False for backbones without such tokens (DETR, Swin: 49).
    """
    config = resolve_rpe(config)
    if not config.enabled:
        return None, None, None
    if config.method == "xl":
        return None, TransformerXLTerm(config, head_dim, num_heads, device=device, dtype=dtype), None
    table_cls = CrossRelativePositionTable if config.method == "cross" else RelativePositionTable
    sites = tuple(
        table_cls(config, site, head_dim, num_heads, skip_bucket=skip_bucket, device=device, dtype=dtype)
        if site in config.on
        else None
        for site in "qkv"
    )
    return sites  # type: ignore[return-value]
