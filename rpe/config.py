"""Configuration of a relative position encoding: `RPEConfig`, named `PRESETS`, the reference
shorthand grammar (`parse_shorthand`) and `resolve_rpe`, which turns whatever a user or a Hydra
config hands over into a validated `RPEConfig`.

An encoding is three independent choices (spec section 10):

* an index (``method`` + ``index`` + ``ratio`` / ``window`` / ``num_buckets`` / ``max_distance``)
  mapping a pair of grid cells to a bucket id, see `rpe.index`;
* a parametrisation (``mode``: a scalar per bucket and head, ``bias``; or a vector per bucket,
  ``ctx``; ``shared_head`` shares it across heads);
* the injection sites (``on``: any subset of q, k, v).

Hydra passes the group ``rpe`` as a dict ``{"preset": <name or shorthand>, <field>: value|None}``;
``None`` means "keep the preset's value".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = [
    "METHODS",
    "MODES",
    "INDEXES",
    "BACKENDS",
    "RPEConfig",
    "RPEConfigError",
    "PRESETS",
    "parse_shorthand",
    "resolve_rpe",
]

METHODS: tuple[str, ...] = (
    "none",
    "euclidean",
    "quant",
    "quant_rank",
    "cross",
    "product",
    "swin",
    "t5",
    "xl",
)
MODES: tuple[str, ...] = ("bias", "ctx")
INDEXES: tuple[str, ...] = ("piecewise", "clip")
BACKENDS: tuple[str, ...] = ("auto", "sdpa", "eager", "flex", "naive")
SITES: str = "qkv"


class RPEConfigError(ValueError):
    """A relative-position-encoding setting is invalid; the message is one line naming it."""


def _choices_error(name: str, value: Any, choices: tuple[str, ...]) -> RPEConfigError:
    return RPEConfigError(f"rpe.{name}={value!r} is not one of: {', '.join(choices)}")


@dataclasses.dataclass(frozen=True)
class RPEConfig:
    """One relative position encoding, validated on construction.

    Fields:
        method: index method, one of `METHODS` ("none" disables RPE).
        mode: "bias" (scalar per bucket, added to the scaled logits) or "ctx" (contextual: a vector
            per bucket, dotted with the scaled query/key, or summed into the output for V).
        on: injection sites, any non-empty subset of "qkv" in any order; stored canonically ("qk", ...).
        shared_head: one table for all heads (True) or one per head.
        ratio: piecewise/clip knob: alpha = ratio, beta = 2 ratio, gamma = 8 ratio.
        index: "piecewise" (iRPE) or "clip" (Shaw 2018) for euclidean/quant/quant_rank/cross/product.
        window: swin table side M; the grid must fit (h, w <= M).
        num_buckets, max_distance: T5 buckets per axis and the distance where they saturate.
        backend: attention kernel, one of `BACKENDS` (see `rpe.attention.rpe_attention`).
    """

    method: str = "product"
    mode: str = "ctx"
    on: str = "k"
    shared_head: bool = True
    ratio: float = 1.9
    index: str = "piecewise"
    window: int = 14
    num_buckets: int = 32
    max_distance: int = 128
    backend: str = "auto"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise _choices_error("method", self.method, METHODS)
        if self.mode not in MODES:
            raise _choices_error("mode", self.mode, MODES)
        if self.index not in INDEXES:
            raise _choices_error("index", self.index, INDEXES)
        if self.backend not in BACKENDS:
            raise _choices_error("backend", self.backend, BACKENDS)
        on = self.on
        if not isinstance(on, str) or not on or any(c not in SITES for c in on) or len(set(on)) != len(on):
            raise RPEConfigError(
                f"rpe.on={on!r} must be a non-empty subset of 'q', 'k', 'v' without repeats,"
                " e.g. 'k', 'qk', 'qkv'"
            )
        object.__setattr__(self, "on", "".join(c for c in SITES if c in on))
        if isinstance(self.ratio, bool) or not isinstance(self.ratio, (int, float)):
            raise RPEConfigError(f"rpe.ratio={self.ratio!r} must be a positive number")
        object.__setattr__(self, "ratio", float(self.ratio))
        if not self.ratio > 0:
            raise RPEConfigError(f"rpe.ratio={self.ratio!r} must be > 0")
        if not isinstance(self.shared_head, bool):
            raise RPEConfigError(f"rpe.shared_head={self.shared_head!r} must be true or false")
        for name, minimum in (("window", 1), ("num_buckets", 4), ("max_distance", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise RPEConfigError(f"rpe.{name}={value!r} must be an integer >= {minimum}")
        if self.num_buckets % 2:
            raise RPEConfigError(
                f"rpe.num_buckets={self.num_buckets!r} must be even (T5 splits the buckets per direction)"
            )
        if self.max_distance <= self.num_buckets // 4:
            raise RPEConfigError(
                f"rpe.max_distance={self.max_distance!r} must exceed"
                f" num_buckets // 4 = {self.num_buckets // 4}"
                " (the last exact T5 distance)"
            )
        if self.method == "none":
            return
        if self.mode == "bias" and "v" in self.on:
            raise RPEConfigError(
                f"rpe.mode='bias' with rpe.on={self.on!r}: bias mode is defined for q/k only, not v"
                " (use mode='ctx' for v)"
            )
        if self.method == "xl" and (self.on != "k" or self.mode != "ctx"):
            raise RPEConfigError(
                "rpe.method='xl' needs rpe.on='k' and rpe.mode='ctx'"
                f" (got on={self.on!r}, mode={self.mode!r}):"
                " the Transformer-XL terms are a single logit term"
            )

    @property
    def enabled(self) -> bool:
        """Whether this config adds any relative position term."""
        return self.method != "none"

    @property
    def alpha(self) -> float:
        return self.ratio

    @property
    def beta(self) -> float:
        return 2.0 * self.ratio

    @property
    def gamma(self) -> float:
        return 8.0 * self.ratio

    def shorthand(self) -> str:
        """The reference flag ``rpe-{ratio}-{method}-{mode}-{shared}-{on}`` (index etc. not included)."""
        if not self.enabled:
            return "none"
        return f"rpe-{self.ratio:g}-{self.method}-{self.mode}-{int(self.shared_head)}-{self.on}"


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RPEConfig))

# Shaw et al. 2018 uses clip; ratio 1.9 gives B = int(2 * 1.9) = 3, i.e. offsets clipped to [-3, 3]
# per axis: the same 7x7 (+1 skip) table as irpe_k, so the two differ only in the index function.
PRESETS: dict[str, RPEConfig] = {
    "none": RPEConfig(method="none"),
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
    "xl": RPEConfig(method="xl", mode="ctx", on="k", shared_head=False),
}


def parse_shorthand(text: str) -> RPEConfig:
    """Parse the reference flag ``rpe-{ratio}-{method}-{mode}-{shared_head 0|1}-{on}``.

    Example: ``parse_shorthand("rpe-2.0-product-ctx-1-k")``; mode is ``ctx`` or ``bias``.
    """
    grammar = "rpe-{ratio}-{method}-{ctx|bias}-{shared 0|1}-{on}, e.g. 'rpe-1.9-product-ctx-1-k'"
    parts = text.split("-") if isinstance(text, str) else []
    if len(parts) != 6 or parts[0] != "rpe":
        raise RPEConfigError(f"rpe shorthand {text!r} is malformed; expected {grammar}")
    _, ratio_text, method, mode, shared_text, on = parts
    try:
        ratio = float(ratio_text)
    except ValueError:
        raise RPEConfigError(
            f"rpe shorthand {text!r}: ratio {ratio_text!r} is not a number; expected {grammar}"
        ) from None
    if shared_text not in ("0", "1"):
        raise RPEConfigError(f"rpe shorthand {text!r}: shared_head {shared_text!r} must be 0 or 1")
    return RPEConfig(method=method, mode=mode, on=on, shared_head=shared_text == "1", ratio=ratio)


def _from_name(name: str) -> RPEConfig:
    if name in PRESETS:
        return PRESETS[name]
    if name.startswith("rpe-"):
        return parse_shorthand(name)
    raise RPEConfigError(
        f"rpe preset {name!r} is neither a preset ({', '.join(PRESETS)}) nor a shorthand rpe-{{ratio}}-..."
    )


def resolve_rpe(spec: RPEConfig | str | Mapping[str, Any] | None) -> RPEConfig:
    """Turn None, an `RPEConfig`, a preset name, a shorthand, or a dict into an `RPEConfig`.

    A dict holds ``preset`` (name or shorthand, default "none") plus field overrides; overrides
    whose value is None are ignored, which is how the Hydra group ``configs/rpe`` passes "unset".
    """
    if spec is None:
        return PRESETS["none"]
    if isinstance(spec, RPEConfig):
        return spec
    if isinstance(spec, str):
        return _from_name(spec)
    if isinstance(spec, Mapping):
        valid = ("preset",) + FIELDS
        unknown = [key for key in spec if key not in valid]
        if unknown:
            hint = ' (YAML reads an unquoted key `on` as true: write "on": ...)' if True in unknown else ""
            raise RPEConfigError(
                f"rpe has unknown key(s) {', '.join(map(repr, unknown))};"
                f" valid keys: {', '.join(valid)}{hint}"
            )
        preset = spec.get("preset")
        base = _from_name("none" if preset is None else str(preset))
        overrides = {key: value for key, value in spec.items() if key != "preset" and value is not None}
        # a preset name "none" has method none, so overriding only e.g. the ratio keeps RPE off;
        # that is intended: the method must be chosen explicitly.
        return dataclasses.replace(base, **overrides) if overrides else base
    raise RPEConfigError(
        f"rpe spec of type {type(spec).__name__} is not supported; use None, RPEConfig, a preset name,"
        " a shorthand or a dict"
    )
