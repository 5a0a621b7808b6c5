"""The registry of position encodings: method name -> how to validate and build it, and the named presets.

Each encoding module (``rpe/tables.py`` for the bucket tables, ``rpe/encodings/*.py`` for the rest)
calls `register` once per method at import time with the `RPEConfig` fields the method reads, its
validation and its builder, and `register_preset` for its named presets. Everything else
(`rpe.config.RPEConfig`, `rpe.build_rpe`, the backbones, the tools, the tests) asks the registry.
This module imports nothing of `rpe`: `rpe.config` depends on it, not the other way round. The
procedure to add an encoding is in docs/design.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "Encoding", "register", "register_preset", "encoding", "method_names", "canonical_method", "preset_names",
    "PRESETS",
]

# (rpe_q, rpe_k, rpe_v): the module slots of an attention layer (None where unused)
Sites = tuple["nn.Module | None", "nn.Module | None", "nn.Module | None"]


@dataclass(frozen=True)
class Encoding:
    """One registered method; ``config`` below is an `rpe.RPEConfig`.

    ``build(config, head_dim, num_heads, skip_bucket=..., device=..., dtype=...)`` returns the
    three slots ``(rpe_q, rpe_k, rpe_v)`` (`rpe.base.PositionEncoding.build` for a single module in
    the key slot). ``fields``: the `RPEConfig` fields it reads besides ``method`` and ``backend``;
    `RPEConfig` refuses any other field set away from its default. ``validate(config)`` raises
    `rpe.RPEConfigError` (one line) for combinations of those fields it does not support.
    ``aliases``: other spellings accepted for the method (the reference's ``euc``). ``directed``:
    whether the encoding tells ``d`` from ``-d`` (None: n/a). ``fit_window(config, window)``
    (optional): the config to use inside an attention window of side ``window`` (encodings whose
    table is sized by the window).
    """

    name: str
    build: Callable[..., Sites]
    summary: str
    fields: tuple[str, ...] = ()
    validate: Callable[[Any], None] | None = None
    aliases: tuple[str, ...] = ()
    directed: bool | None = None
    fit_window: Callable[[Any, int], Any] | None = None


_ENCODINGS: dict[str, Encoding] = {}
_ALIASES: dict[str, str] = {}
PRESETS: dict[str, Any] = {}  # name -> RPEConfig


def register(spec: Encoding) -> Encoding:
    """Add ``spec`` under its name and aliases; a name may be registered once."""
    for name in (spec.name, *spec.aliases):
        if name in _ENCODINGS or name in _ALIASES:
            raise ValueError(f"position encoding {name!r} is registered twice")
    if len(set(spec.fields)) != len(spec.fields) or {"method", "backend"} & set(spec.fields):
        raise ValueError(f"position encoding {spec.name!r}: fields {spec.fields} repeat a name or list method/backend")
    _ENCODINGS[spec.name] = spec
    for alias in spec.aliases:
        _ALIASES[alias] = spec.name
    return spec


def register_preset(name: str, config: Any) -> Any:
    """Add a named preset (what ``rpe=<name>`` and ``rpe.preset=<name>`` select), an `RPEConfig`."""
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


def preset_names(*, per_site: bool | None = None) -> tuple[str, ...]:
    """Names of the presets that add a relative term (not ``none``), in registration order.

    ``per_site``: only those whose method places a module per injection site (reads ``on``: the bucket
    tables) when True, only the others (one module in the key slot: XL, Huang's, SASA's, RoPE, CPB,
    ALiBi, and whatever is added next) when False; all when None.
    """
    return tuple(
        name for name, config in PRESETS.items()
        if config.method != "none" and (per_site is None or ("on" in encoding(config.method).fields) == per_site)
    )
