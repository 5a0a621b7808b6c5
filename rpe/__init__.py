"""Position encodings (iRPE and friends, RoPE, ALiBi, ...) for vision transformers.

Offsets are **query minus key**, ``(dr, dc) = p_i - p_j``. `rpe.registry` holds every encoding by
method name, `rpe.base` the interface they implement, `rpe.index` the bucket index functions,
`rpe.tables` the learned bucket tables, `rpe.encodings` every other encoding (one module each) and
`rpe.attention` how attention asks them for their terms. Conventions and how to add an encoding:
docs/design.md.

Public API::

    from rpe import (RPEConfig, PRESETS, DEFAULT_PRESET, parse_shorthand, resolve_rpe, build_rpe,
                     rpe_attention, RPEAttention, RPESites, RPEConfigError)
"""

from . import encodings  # noqa: F401  (registers every encoding module)
from .attention import RPEAttention, RPESites, rpe_attention, split_grid
from .base import Description, LogitPiece, PositionEncoding
from .config import DEFAULT_PRESET, PRESETS, RPEConfig, RPEConfigError, build_rpe, parse_shorthand, resolve_rpe
from .encodings.xl import TransformerXLTerm
from .index import IndexSpec, bucket_ids, clear_bucket_cache, clip_index, piecewise_index, t5_bucket
from .registry import encoding, method_names, preset_names
from .tables import CrossRelativePositionTable, RelativePositionTable, is_swin_bias

__all__ = [
    "RPEConfig",
    "PRESETS",
    "DEFAULT_PRESET",
    "parse_shorthand",
    "resolve_rpe",
    "build_rpe",
    "encoding",
    "method_names",
    "preset_names",
    "rpe_attention",
    "RPEAttention",
    "RPESites",
    "RPEConfigError",
    "Description",
    "LogitPiece",
    "PositionEncoding",
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
    "is_swin_bias",
]
