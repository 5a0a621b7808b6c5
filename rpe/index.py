"""Index functions: a pair of grid cells -> bucket id, and a per-shape cache of the ids.

Conventions (docs/design.md)
---------------------------
* Tokens ``skip, ..., n-1`` lie on an ``h x w`` grid in row-major order: token ``skip + r*w + c``
  sits in cell ``(r, c)``. The first ``skip`` tokens (class, distillation) are not on the grid.
* The relative offset of the pair (query ``i``, key ``j``) is **query minus key**:
  ``(dr, dc) = p_i - p_j``. So a key to the upper-left of its query has positive ``dr, dc``.
* 1-D index ``g`` (``index="piecewise"``, iRPE): ``round(x)`` for ``|x| <= alpha``, otherwise
  ``sign(x) * min(B, round(alpha + ln(|x|/alpha) / ln(gamma/alpha) * (beta - alpha)))`` with
  ``alpha, beta, gamma = ratio, 2 ratio, 8 ratio`` and ``B = int(beta)``; round-half-to-even.
  ``index="clip"`` (Shaw 2018): ``clip(round(x), -B, B)`` with the same ``B``.
* 2-D methods, ``S = 2B + 1``:

  ==========  ==========================================================  ==================
  method      bucket id of ``(dr, dc)``                                     buckets (no skip)
  ==========  ==========================================================  ==================
  euclidean   ``g(round(sqrt(dr^2 + dc^2))) + B``                           ``S``
  quant       ``g(dr^2 + dc^2) + B`` (reference code: squared distance)     ``S``
  quant_rank  ``g(rank(sqrt(dr^2 + dc^2))) + B`` (the paper's variant:      ``S``
              rank among all distinct integer-vector norms 0, 1, 1.41, 2..)
  cross       two tables: rows ``g(dr) + B``, cols ``g(dc) + B``; summed    ``S`` each
  product     ``(g(dr) + B) * S + (g(dc) + B)``: row-major over a           ``S^2``
              ``S x S`` table whose row is the clipped row offset ``g(dr)``
              (``-B`` first) and whose column is ``g(dc)``
  swin        ``(dr + M-1) * (2M-1) + (dc + M-1)``, ``M = window``, exact   ``(2M-1)^2``
  t5          ``t5(dr) * num_buckets + t5(dc)``: T5's bidirectional bucket  ``num_buckets^2``
              applied per axis (half the buckets per sign, the first half
              of those exact, the rest log-spaced up to ``max_distance``) and
              combined as a product table, so that 2-D T5 stays directed like
              product. ``t5`` is fed query-minus-key (T5 itself uses
              key-minus-query; this only relabels buckets of a learned table).
  xl          exact offsets ``(dr + h-1) * (2w-1) + (dc + w-1)`` of the      ``(2h-1)(2w-1)``
              current grid (Transformer-XL embeds each offset sinusoidally)
  ==========  ==========================================================  ==================

* Skip tokens: every pair involving a skip token gets one shared extra bucket whose id is the
  no-skip count. Tables always reserve that bucket (width = no-skip count + 1) so that one module
  serves grids with and without class tokens; a DeiT-S product-1.9 table is ``(1, 64, 50)``.

Bucket ids depend only on the index parameters, ``(h, w, skip)`` and the device; `bucket_ids`
caches them in a bounded LRU (`rpe.base.ShapeCache`), so a forward on a known shape does no index work.

This module holds the index functions of the table above. Each bucket-table method registers its index
together with its encoding, in one row of `rpe.tables`; the exact-offset index ``xl``, which Transformer-XL,
CPB and ALiBi share, is registered here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .base import ShapeCache
from .config import RPEConfig

__all__ = [
    "IndexSpec",
    "IndexMethod",
    "INDEX_METHODS",
    "register_index",
    "piecewise_index",
    "clip_index",
    "t5_bucket",
    "grid_offsets",
    "bucket_ids",
    "bucket_onehot",
    "num_buckets",
    "clear_bucket_cache",
    "set_bucket_cache_size",
]


@dataclass(frozen=True)
class IndexSpec:
    """The index part of an `RPEConfig`; fields the method does not read are normalised (zero) so
    that the cache is shared. ``axis`` selects one table of the cross method (0 = rows, 1 = cols).
    """

    method: str
    index: str = "piecewise"
    ratio: float = 0.0
    window: int = 0
    num_buckets: int = 0
    max_distance: int = 0
    axis: int | None = None

    @classmethod
    def from_config(cls, config: RPEConfig, axis: int | None = None) -> IndexSpec:
        method = INDEX_METHODS.get(config.method)
        if method is None:
            raise ValueError(f"rpe.method={config.method!r} has no bucket index")
        return cls(config.method, axis=axis, **{name: getattr(config, name) for name in method.fields})

    @classmethod
    def tables_of(cls, config: RPEConfig) -> list[IndexSpec]:
        """The index of each table ``config`` builds per site (cross: rows and cols), [] without an index."""
        method = INDEX_METHODS.get(config.method)
        return [] if method is None else [cls.from_config(config, axis=axis) for axis in method.axes]

    @property
    def beta_int(self) -> int:
        return int(2.0 * self.ratio)


@dataclass(frozen=True)
class IndexMethod:
    """A bucket index: ``count(spec, h, w)`` buckets without the skip bucket, and
    ``grid_ids(spec, dr, dc, h, w)``: the bucket ids ``(h w, h w)`` long of the grid pairs' offsets.
    ``fields``: the `IndexSpec` fields it reads; ``axes``: the ``axis`` of each of its tables.
    """

    name: str
    fields: tuple[str, ...]
    count: Callable[[IndexSpec, int | None, int | None], int]
    grid_ids: Callable[[IndexSpec, Tensor, Tensor, int, int], Tensor]
    axes: tuple[int | None, ...] = (None,)


INDEX_METHODS: dict[str, IndexMethod] = {}


def register_index(method: IndexMethod) -> IndexMethod:
    """Make bucket index ``method.name`` available to `IndexSpec` and `bucket_ids`; a name may be registered once."""
    if method.name in INDEX_METHODS:
        raise ValueError(f"bucket index {method.name!r} is registered twice")
    INDEX_METHODS[method.name] = method
    return method


def piecewise_index(x: Tensor, alpha: float, beta: float, gamma: float) -> Tensor:
    """iRPE piecewise index ``g`` of offsets ``x`` (any shape) -> long in ``[-int(beta), int(beta)]``."""
    x = x.to(torch.float64)
    magnitude = x.abs()
    # clamp avoids log(0) in the branch that torch.where discards
    log_part = alpha + torch.log(magnitude.clamp(min=alpha) / alpha) / math.log(gamma / alpha) * (
        beta - alpha
    )
    far = torch.sign(x) * log_part.round().clamp(max=float(int(beta)))
    return torch.where(magnitude <= alpha, x.round(), far).to(torch.long)


def clip_index(x: Tensor, beta: float) -> Tensor:
    """Shaw et al. clip index: ``clip(round(x), -int(beta), int(beta))`` -> long tensor."""
    limit = float(int(beta))
    return x.to(torch.float64).round().clamp(-limit, limit).to(torch.long)


def t5_bucket(x: Tensor, num_buckets: int, max_distance: int) -> Tensor:
    """T5 bidirectional bucket of integer offsets ``x`` -> long tensor in ``[0, num_buckets)``.

    Half the buckets per sign (positive offsets use the upper half); within a sign the first
    ``num_buckets // 4`` distances are exact, the rest log-spaced up to ``max_distance``.
    """
    half = num_buckets // 2
    max_exact = half // 2
    x = x.to(torch.long)
    upper = (x > 0).to(torch.long) * half
    distance = x.abs()
    log_bucket = max_exact + (
        torch.log(distance.clamp(min=1).to(torch.float64) / max_exact)
        / math.log(max_distance / max_exact)
        * (half - max_exact)
    ).to(torch.long)
    log_bucket = log_bucket.clamp(max=half - 1)
    return upper + torch.where(distance < max_exact, distance, log_bucket)


def grid_offsets(h: int, w: int, device: torch.device | str | None = None) -> Tensor:
    """Query-minus-key offsets of all grid pairs: ``(h*w, h*w, 2)`` long, ``[..., 0] = dr``."""
    rows = torch.arange(h, device=device).repeat_interleave(w)
    cols = torch.arange(w, device=device).repeat(h)
    cells = torch.stack([rows, cols], dim=-1)
    return cells[:, None, :] - cells[None, :, :]


def _one_axis_index(spec: IndexSpec, x: Tensor) -> Tensor:
    if spec.index == "clip":
        return clip_index(x, 2.0 * spec.ratio)
    return piecewise_index(x, spec.ratio, 2.0 * spec.ratio, 8.0 * spec.ratio)


def _norm_rank(squared: Tensor) -> Tensor:
    """Rank of ``sqrt(squared)`` among all distinct norms of integer 2-vectors (0, 1, sqrt 2, 2, ...)."""
    largest = int(squared.max().item()) if squared.numel() else 0
    side = torch.arange(math.isqrt(largest) + 1, device=squared.device)
    sums = (side[:, None] ** 2 + side[None, :] ** 2).flatten()
    is_norm = torch.zeros(largest + 1, dtype=torch.long, device=squared.device)
    is_norm[sums[sums <= largest]] = 1
    rank_of = torch.cumsum(is_norm, 0) - is_norm
    return rank_of[squared]


def num_buckets(spec: IndexSpec, h: int | None = None, w: int | None = None) -> int:
    """Bucket count of one table WITHOUT the skip bucket (``xl`` needs the grid)."""
    return INDEX_METHODS[spec.method].count(spec, h, w)


def _grid_bucket_ids(spec: IndexSpec, h: int, w: int, device: torch.device) -> Tensor:
    """Bucket ids of grid pairs only: ``(h*w, h*w)`` long, see the module docstring."""
    offsets = grid_offsets(h, w, device)
    return INDEX_METHODS[spec.method].grid_ids(spec, offsets[..., 0], offsets[..., 1], h, w)


# --- the index methods of the module docstring's table (registered by rpe.tables, except xl) ---------
def side_count(spec: IndexSpec, h: int | None = None, w: int | None = None) -> int:
    """``S = 2B + 1``: the buckets of a piecewise/clip index of one quantity (euclidean, quant, cross)."""
    return 2 * spec.beta_int + 1


def product_count(spec: IndexSpec, h: int | None = None, w: int | None = None) -> int:
    return side_count(spec) ** 2


def swin_count(spec: IndexSpec, h: int | None = None, w: int | None = None) -> int:
    return (2 * spec.window - 1) ** 2


def t5_count(spec: IndexSpec, h: int | None = None, w: int | None = None) -> int:
    return spec.num_buckets**2


def euclidean_ids(spec: IndexSpec, dr: Tensor, dc: Tensor, h: int, w: int) -> Tensor:
    distance = (dr * dr + dc * dc).to(torch.float64).sqrt().round()
    return _one_axis_index(spec, distance) + spec.beta_int


def quant_ids(spec: IndexSpec, dr: Tensor, dc: Tensor, h: int, w: int) -> Tensor:
    return _one_axis_index(spec, dr * dr + dc * dc) + spec.beta_int


def quant_rank_ids(spec: IndexSpec, dr: Tensor, dc: Tensor, h: int, w: int) -> Tensor:
    return _one_axis_index(spec, _norm_rank(dr * dr + dc * dc)) + spec.beta_int


def cross_ids(spec: IndexSpec, dr: Tensor, dc: Tensor, h: int, w: int) -> Tensor:
    return _one_axis_index(spec, dr if spec.axis == 0 else dc) + spec.beta_int


def product_ids(spec: IndexSpec, dr: Tensor, dc: Tensor, h: int, w: int) -> Tensor:
    B = spec.beta_int
    return (_one_axis_index(spec, dr) + B) * (2 * B + 1) + (_one_axis_index(spec, dc) + B)


def swin_ids(spec: IndexSpec, dr: Tensor, dc: Tensor, h: int, w: int) -> Tensor:
    M = spec.window
    if h > M or w > M:
        raise ValueError(
            f"grid {h}x{w} does not fit the swin table of rpe.window={M}; raise rpe.window to >= {max(h, w)}"
        )
    return (dr + M - 1) * (2 * M - 1) + (dc + M - 1)


def t5_ids(spec: IndexSpec, dr: Tensor, dc: Tensor, h: int, w: int) -> Tensor:
    per_axis = spec.num_buckets
    return t5_bucket(dr, per_axis, spec.max_distance) * per_axis + t5_bucket(dc, per_axis, spec.max_distance)


def _xl_count(spec: IndexSpec, h: int | None, w: int | None) -> int:
    if h is None or w is None:
        raise ValueError("rpe.method='xl' has one bucket per offset of the grid: pass h and w")
    return (2 * h - 1) * (2 * w - 1)


def _exact_ids(spec: IndexSpec, dr: Tensor, dc: Tensor, h: int, w: int) -> Tensor:
    return (dr + h - 1) * (2 * w - 1) + (dc + w - 1)


register_index(IndexMethod("xl", (), _xl_count, _exact_ids))


def compute_bucket_ids(spec: IndexSpec, h: int, w: int, skip: int, device: torch.device) -> Tensor:
    """Bucket ids of all ``n = skip + h*w`` tokens: ``(n, n)`` long; skip pairs get the extra bucket."""
    grid_ids = _grid_bucket_ids(spec, h, w, device)
    if skip == 0:
        return grid_ids.contiguous()
    n = skip + h * w
    ids = torch.full((n, n), num_buckets(spec, h, w), dtype=torch.long, device=device)
    ids[skip:, skip:] = grid_ids
    return ids


_CACHE = ShapeCache(256)


def bucket_ids(spec: IndexSpec, h: int, w: int, skip: int, device: torch.device | str) -> Tensor:
    """Cached `compute_bucket_ids`: ``(n, n)`` long on ``device``; do not modify the result in place."""
    device = torch.device(device)
    key = (spec, h, w, skip, device.type, device.index)
    return _CACHE.get(key, lambda: compute_bucket_ids(spec, h, w, skip, device))


def bucket_onehot(
    spec: IndexSpec, h: int, w: int, skip: int, device: torch.device | str, width: int, dtype: torch.dtype
) -> Tensor:
    """Cached one-hot of `bucket_ids`: ``(n, n, width)`` in ``dtype``, ``width`` >= the bucket count.

    Turns the per-query bucket gather and its scatter-add gradient into batched matrix products
    (see `rpe.tables.LogitPiece`); ``(197, 197, 56)`` bf16 is 4.3 MB.
    """
    device = torch.device(device)
    key = ("onehot", spec, h, w, skip, device.type, device.index, width, dtype)
    return _CACHE.get(
        key, lambda: torch.nn.functional.one_hot(bucket_ids(spec, h, w, skip, device), width).to(dtype)
    )


def clear_bucket_cache() -> None:
    """Drop all cached bucket ids."""
    _CACHE.clear()


def set_bucket_cache_size(size: int) -> None:
    """Keep at most ``size`` shapes cached (DETR sees many padded batch shapes; default 256)."""
    _CACHE.resize(size)
