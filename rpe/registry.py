"""The registry of position encodings: method name -> how to validate and build it.

Each encoding module (``rpe/tables.py`` for the bucket tables, ``rpe/encodings/*.py`` for the rest)
calls `register` at import time with its method name(s), the `RPEConfig` fields it reads, its
validation and its builder, and `register_preset` for its named presets. Everything else
(`rpe.config.RPEConfig`, `rpe.build_rpe`, the backbones, the tools) asks the registry. The
procedure to add an encoding is in docs/design.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from .config import RPEConfig

__all__ = [
    "Encoding", "build_rpe", "register", "register_preset", "encoding", "method_names", "canonical_method", "PRESETS",
]

# (rpe_q, rpe_k, rpe_v): the module slots of an attention layer (None where unused)
Sites = tuple["nn.Module | None", "nn.Module | None", "nn.Module | None"]


@dataclass(frozen=True)
class Encoding:
    """One registered method.

    ``build(config, head_dim, num_heads, skip_bucket=..., device=..., dtype=...)`` returns the
    three slots ``(rpe_q, rpe_k, rpe_v)``. ``validate(config)`` raises `rpe.RPEConfigError` (one
    line) for settings this method does not support. ``fields``: the `RPEConfig` fields it reads
    (besides method and backend). ``aliases``: other spellings accepted for the method (the
    reference's ``euc``). ``directed``: whether the encoding tells ``d`` from ``-d`` (None: n/a).
    ``fit_window(config, window)`` (optional): the config to use inside an attention window of side
    ``window`` (encodings whose table is sized by the window).
    """

    name: str
    build: Callable[..., Sites]
    summary: str
    fields: tuple[str, ...] = ()
    validate: Callable[[RPEConfig], None] | None = None
    aliases: tuple[str, ...] = ()
    directed: bool | None = None
    fit_window: Callable[[RPEConfig, int], RPEConfig] | None = None


_ENCODINGS: dict[str, Encoding] = {}
_ALIASES: dict[str, str] = {}
PRESETS: dict[str, RPEConfig] = {}


def register(spec: Encoding) -> Encoding:
    """Add ``spec`` under its name and aliases; a name may be registered once."""
    for name in (spec.name, *spec.aliases):
        if name in _ENCODINGS or name in _ALIASES:
            raise ValueError(f"position encoding {name!r} is registered twice")
    _ENCODINGS[spec.name] = spec
    for alias in spec.aliases:
        _ALIASES[alias] = spec.name
    return spec


def register_preset(name: str, config: RPEConfig) -> RPEConfig:
    """Add a named preset (what ``rpe=<name>`` and ``rpe.preset=<name>`` select)."""
    if name in PRESETS:
        raise ValueError(f"rpe preset {name!r} is registered twice")
    PRESETS[name] = config
    return config


def method_names() -> tuple[str, ...]:
    """Registered method names, in registration order (aliases not included)."""
    return tuple(_ENCODINGS)


def canonical_method(name: Any) -> Any:
    """``name`` with an alias replaced by its method (``euc`` -> ``euclidean``); else unchanged."""
    return _ALIASES.get(name, name) if isinstance(name, str) else name


def encoding(name: str) -> Encoding:
    """The registered method ``name`` (or alias); KeyError for an unknown one (`RPEConfig` reports it)."""
    return _ENCODINGS[canonical_method(name)]


def build_rpe(
    config: Any, head_dim: int, num_heads: int, *, skip_bucket: bool = True, device: Any = None, dtype: Any = None
) -> Sites:
    """Build the ``(rpe_q, rpe_k, rpe_v)`` modules of one attention layer (None where unused).

    ``config`` is anything `rpe.resolve_rpe` accepts. ``skip_bucket`` reserves the extra bucket shared
    by skip (class/distillation) tokens in bucket tables: True for DeiT (49 + 1 at ratio 1.9, as in the
    reference DeiT checkpoints), False for backbones without such tokens (DETR, Swin: 49).
    """
    from .config import resolve_rpe

    config = resolve_rpe(config)
    return encoding(config.method).build(
        config, head_dim, num_heads, skip_bucket=skip_bucket, device=device, dtype=dtype
    )
