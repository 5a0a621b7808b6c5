"""Relative position encodings (iRPE and friends) for vision transformers.

Offsets are **query minus key**, ``(dr, dc) = p_i - p_j``; see `rpe.index` for every index
function and how product bucket ids are laid out, `rpe.tables` for the learned tables and
`rpe.attention` for how the terms enter attention and which kernel is used.

Public API::

    from rpe import (RPEConfig, PRESETS, parse_shorthand, resolve_rpe, build_rpe,
                     rpe_attention, RPEAttention, RPEConfigError)
"""

from .attention import RPEAttention, rpe_attention, split_grid
from .config import PRESETS, RPEConfig, RPEConfigError, parse_shorthand, resolve_rpe
from .index import IndexSpec, bucket_ids, clear_bucket_cache, clip_index, piecewise_index, t5_bucket
from .tables import CrossRelativePositionTable, RelativePositionTable, TransformerXLTerm, build_rpe

__all__ = [
    "RPEConfig",
    "PRESETS",
    "parse_shorthand",
    "resolve_rpe",
    "build_rpe",
    "rpe_attention",
    "RPEAttention",
    "RPEConfigError",
    "split_grid",
    "IndexSpec",
    "bucket_ids",
    "clear_bucket_cache",
    "piecewise_index",
    "clip_index",
    "t5_bucket",
    "RelativePositionTable",
    "CrossRelativePositionTable",
    "TransformerXLTerm",
]
