"""The bucket-table encodings (iRPE, Shaw, Swin, T5): a learned table per injection site (q, k or v)
indexed by the bucket of a pair (`rpe.index`). Each bucket-table method is one row of `_BUCKET_METHODS`
below, which registers its bucket index (`rpe.index.register_index`) and its encoding
(`rpe.registry.register`) from the same fields; the presets follow.

A q/k site hands attention a list of `LogitPiece` (terms added to the scaled logits) through
``logit_pieces``; a v site adds ``value_term`` to the output. Pieces are kept factorised
(a small table or a per-row lookup ``L`` plus the ``(n, n)`` bucket ids) so that fused kernels
(FlexAttention) can gather on the fly and no ``(n, n, d)`` tensor is ever built.

Parameter names follow the reference checkpoints: ``lookup_table_bias`` ``(Hs, nb)`` in bias mode,
``lookup_table_weight`` ``(Hs, d, nb)`` for contextual q/k and ``(Hs, nb, d)`` for contextual v;
the cross method nests two such tables as ``rp_rows`` and ``rp_cols``. ``nb`` always includes the
skip bucket (see `rpe.index`); a reference table saved without it (DETR, skip = 0) is zero-padded
on load.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import index, registry
from .base import (
    ONEHOT_DEVICES,
    Description,
    LogitPiece,
    PositionEncoding,
    bucket_rows,
    materialize_pieces,
    offset_grid,
    onehot_gather,
    onehot_scatter,
)
from .config import RPEConfig, RPEConfigError
from .index import IndexMethod, IndexSpec, bucket_ids, bucket_onehot, num_buckets, register_index

__all__ = [
    "LogitPiece",
    "RelativePositionTable",
    "CrossRelativePositionTable",
    "ONEHOT_DEVICES",
    "bucket_rows",
    "is_swin_bias",
    "materialize_pieces",
    "offset_bucket_ids",
    "onehot_gather",
    "onehot_scatter",
]


def offset_bucket_ids(ids: Tensor, h: int, w: int) -> Tensor:
    """Bucket of each offset: ``ids`` ``(h w, h w)`` pair ids (row-major grid, no skip tokens) ->
    ``(2h-1, 2w-1)`` long, entry ``[dr + h-1, dc + w-1]`` = id of a pair with offset ``(dr, dc)``.

    Every offset with ``|dr| < h``, ``|dc| < w`` occurs on the grid: the query at
    ``(max(dr, 0), max(dc, 0))`` and the key at ``(max(-dr, 0), max(-dc, 0))``. Reading the ids of
    the real grid (not of a larger helper grid) keeps grid-dependent and window-limited indexes right.
    """
    dr, dc = offset_grid(h, w)
    dr, dc = dr.to(ids.device), dc.to(ids.device)
    query = dr.clamp(min=0) * w + dc.clamp(min=0)
    key = (-dr).clamp(min=0) * w + (-dc).clamp(min=0)
    return ids[query, key]


class RelativePositionTable(PositionEncoding):
    """One learned lookup table at one site (``"q"``, ``"k"`` or ``"v"``).

    Parameters: bias mode ``lookup_table_bias`` ``(Hs, nb)``; contextual q/k ``lookup_table_weight``
    ``(Hs, d, nb)``; contextual v ``lookup_table_weight`` ``(Hs, nb, d)``, where ``nb`` is the
    index's bucket count plus the skip bucket and ``Hs`` is 1 with shared heads.
    """

    has_skip_bucket = True

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
        self.name = config.method
        self.adds_logits = site != "v"
        self.adds_value = site == "v"
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

        Only the ``naive`` backend builds this (the cost baseline the efficient path is measured against).
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

    def value_tables(self, h: int, w: int, skip: int, device: torch.device) -> list[tuple[Tensor, Tensor]]:
        return [(self.bucket_ids(h, w, skip, device), self.lookup_table_weight)]

    def naive_logits(self, q: Tensor, k: Tensor, h: int, w: int, skip: int, scale: float) -> Tensor:
        """Contracts the materialised `pair_embeddings` ``(Hs, n, n, d)`` with ``s q`` (k site) or ``s k`` (q site)."""
        pairs = self.pair_embeddings(h, w, skip, q.device).to(q.dtype)
        if pairs.dim() == 3:  # bias mode; the query site reads the reversed pair
            return (pairs if self.site == "k" else pairs.transpose(-1, -2)).unsqueeze(0)
        pairs = pairs.expand(q.shape[1], -1, -1, -1)
        if self.site == "k":
            return torch.einsum("bhid,hijd->bhij", q * scale, pairs)
        return torch.einsum("bhjd,hjid->bhij", k * scale, pairs)

    def naive_value_term(self, attn: Tensor, h: int, w: int, skip: int) -> Tensor:
        pairs = self.pair_embeddings(h, w, skip, attn.device).to(attn.dtype).expand(attn.shape[1], -1, -1, -1)
        return torch.einsum("bhij,hijd->bhid", attn, pairs)

    def bucket_values(self) -> Tensor:
        """One number per head and bucket: ``(Hs, nb)`` float; bias values, or vector norms (contextual)."""
        with torch.no_grad():
            if self.mode == "bias":
                values = self.lookup_table_bias
            elif self.site == "v":
                values = self.lookup_table_weight.norm(dim=2)  # (Hs, nb, d)
            else:
                values = self.lookup_table_weight.norm(dim=1)  # (Hs, d, nb)
        return values.detach().float().cpu()

    def offset_heatmap(self, h: int, w: int) -> Tensor:
        """`bucket_values` at the bucket of each offset ``(dr, dc)``: ``(Hs, 2h-1, 2w-1)``. A q-site table
        reads the reversed pair, so its entry at ``d`` is the bucket of ``-d``.
        """
        per_offset = offset_bucket_ids(bucket_ids(self.index_spec, h, w, 0, "cpu"), h, w)
        if self.site == "q":
            per_offset = per_offset.flip(0, 1)  # offset -d sits at the point reflection of d
        return self.bucket_values()[:, per_offset]

    def describe(self, h: int, w: int) -> Description:
        shared = ", shared heads" if self.table_heads == 1 and self.num_heads > 1 else ""
        value = "bias" if self.mode == "bias" else "contextual, L2 norm of each bucket's vector"
        return Description(
            self.index_spec.method, self.site, f"{self.index_spec.method} {value}{shared}",
            [("", self.offset_heatmap(h, w))], signed=self.mode == "bias", buckets=self.num_buckets,
        )

    def extra_repr(self) -> str:
        return (
            f"site={self.site!r}, mode={self.mode!r}, method={self.index_spec.method!r}, "
            f"shape={tuple(self.table.shape)}"
        )


class CrossRelativePositionTable(PositionEncoding):
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
        self.name = config.method
        self.adds_logits = site != "v"
        self.adds_value = site == "v"
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

    def value_tables(self, h: int, w: int, skip: int, device: torch.device) -> list[tuple[Tensor, Tensor]]:
        return self.rp_rows.value_tables(h, w, skip, device) + self.rp_cols.value_tables(h, w, skip, device)

    def naive_logits(self, q: Tensor, k: Tensor, h: int, w: int, skip: int, scale: float) -> Tensor:
        return self.rp_rows.naive_logits(q, k, h, w, skip, scale) + self.rp_cols.naive_logits(q, k, h, w, skip, scale)

    def naive_value_term(self, attn: Tensor, h: int, w: int, skip: int) -> Tensor:
        return self.rp_rows.naive_value_term(attn, h, w, skip) + self.rp_cols.naive_value_term(attn, h, w, skip)

    def reset_parameters(self) -> None:
        self.rp_rows.reset_parameters()
        self.rp_cols.reset_parameters()

    def describe(self, h: int, w: int) -> Description:
        rows = self.rp_rows.describe(h, w)
        return dataclasses.replace(rows, panels=[
            ("rp_rows (depends on Δrow)", self.rp_rows.offset_heatmap(h, w)),
            ("rp_cols (depends on Δcol)", self.rp_cols.offset_heatmap(h, w)),
        ], buckets=self.rp_rows.num_buckets + self.rp_cols.num_buckets)


def _validate_table(config: RPEConfig) -> None:
    if config.mode == "bias" and "v" in config.on:
        raise RPEConfigError(
            f"rpe.mode='bias' with rpe.on={config.on!r}: bias mode is defined for q/k only, not v"
            " (use mode='ctx' for v)"
        )


def _build_tables(
    config: RPEConfig, head_dim: int, num_heads: int, *, skip_bucket: bool = True, device: Any = None,
    dtype: Any = None,
) -> registry.Sites:
    """One table per site of ``config.on`` (two, ``rp_rows`` and ``rp_cols``, for cross)."""
    table_cls = CrossRelativePositionTable if config.method == "cross" else RelativePositionTable
    return tuple(  # type: ignore[return-value]
        table_cls(config, site, head_dim, num_heads, skip_bucket=skip_bucket, device=device, dtype=dtype)
        if site in config.on
        else None
        for site in "qkv"
    )


def is_swin_bias(config: RPEConfig) -> bool:
    """Whether ``config`` is Swin's own bias (one scalar per window offset and head, on the logits):
    a Swin backbone then keeps timm's ``relative_position_bias_table`` instead of building a table.
    """
    return config.method == "swin" and config.mode == "bias" and config.on == "k" and not config.shared_head


def _fit_swin(config: RPEConfig, window: int) -> RPEConfig:
    """A table sized by the window (swin) is rebuilt for the attention window it serves."""
    return dataclasses.replace(config, window=window)


# What every table reads; each index reads its own fields on top (the `IndexSpec` fields).
TABLE_FIELDS: tuple[str, ...] = ("mode", "on", "shared_head")
_PIECEWISE = ("index", "ratio")
# name, index fields, bucket count, bucket ids, table axes, directed, aliases, summary
_BUCKET_METHODS = (
    ("euclidean", _PIECEWISE, index.side_count, index.euclidean_ids, (None,), False, ("euc",),
     "iRPE: bucket of the rounded Euclidean distance"),
    ("quant", _PIECEWISE, index.side_count, index.quant_ids, (None,), False, (),
     "iRPE: bucket of the squared distance (reference code)"),
    ("quant_rank", _PIECEWISE, index.side_count, index.quant_rank_ids, (None,), False, (),
     "iRPE: bucket of the distance's rank (the paper's quantisation)"),
    ("cross", _PIECEWISE, index.side_count, index.cross_ids, (0, 1), True, (),
     "iRPE: a row table and a column table, summed"),
    ("product", _PIECEWISE, index.product_count, index.product_ids, (None,), True, (),
     "iRPE / Shaw: one bucket per (row, column) offset pair"),
    ("swin", ("window",), index.swin_count, index.swin_ids, (None,), True, (),
     "Swin: one bucket per exact offset in an M x M window"),
    ("t5", ("num_buckets", "max_distance"), index.t5_count, index.t5_ids, (None,), True, (),
     "T5 buckets per axis, product table"),
)
for _name, _index_fields, _count, _ids, _axes, _directed, _aliases, _summary in _BUCKET_METHODS:
    register_index(IndexMethod(_name, _index_fields, _count, _ids, axes=_axes))
    registry.register(registry.Encoding(
        _name, _build_tables, _summary, TABLE_FIELDS + _index_fields, _validate_table, _aliases, _directed,
        fit_window=_fit_swin if _name == "swin" else None,
    ))

# Shaw et al. 2018 uses clip; ratio 1.9 gives B = int(2 * 1.9) = 3, i.e. offsets clipped to [-3, 3]
# per axis: the same 7x7 (+1 skip) table as irpe_k, so the two differ only in the index function.
for _name, _config in {
    "irpe_k": RPEConfig(method="product", mode="ctx", on="k", shared_head=True, ratio=1.9),
    "irpe_qk": RPEConfig(method="product", mode="ctx", on="qk", shared_head=True, ratio=1.9),
    "irpe_qkv": RPEConfig(method="product", mode="ctx", on="qkv", shared_head=True, ratio=1.9),
    "irpe_euc_k": RPEConfig(method="euclidean", mode="ctx", on="k", shared_head=True, ratio=20.0),
    "irpe_quant_k": RPEConfig(method="quant", mode="ctx", on="k", shared_head=True, ratio=33.0),
    "irpe_cross_k": RPEConfig(method="cross", mode="ctx", on="k", shared_head=True, ratio=20.0),
    "irpe_bias_k": RPEConfig(method="product", mode="bias", on="k", shared_head=False, ratio=1.9),
    "swin": RPEConfig(method="swin", mode="bias", on="k", shared_head=False, window=14),
    "shaw": RPEConfig(method="product", mode="ctx", on="kv", shared_head=True, ratio=1.9, index="clip"),
    "t5": RPEConfig(method="t5", mode="bias", on="k", shared_head=False, num_buckets=32, max_distance=128),
}.items():
    registry.register_preset(_name, _config)
