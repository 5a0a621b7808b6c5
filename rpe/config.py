"""Configuration of a relative position encoding: `RPEConfig`, named `PRESETS`, the reference
shorthand grammar (`parse_shorthand`) and `resolve_rpe`, which turns whatever a user or a Hydra
config hands over into a validated `RPEConfig`.

``method`` names a registered encoding (`rpe.registry`); the other fields are the knobs the
encodings read. Each encoding declares which (`rpe.registry.Encoding.fields`) and validates them; a
field it does not read must keep its default (one-line error otherwise), so that ``rpe=rope_axial
rpe.ratio=5`` is refused instead of training a plain RoPE model. For the bucket-table methods an
encoding is three independent choices (docs/design.md):

* an index (``method`` + ``index`` + ``ratio`` / ``window`` / ``num_buckets`` / ``max_distance``)
  mapping a pair of grid cells to a bucket id, see `rpe.index`;
* a parametrisation (``mode``: a scalar per bucket and head, ``bias``; or a vector per bucket,
  ``ctx``; ``shared_head`` shares it across heads);
* the injection sites (``on``: any subset of q, k, v).

Hydra passes the group ``rpe`` as a dict ``{"preset": <name or shorthand>, <field>: value|None}``;
``None`` means "keep the preset's value" (for a field the method does not read: its default); a value
that is not None is set by the user and must be a field the method reads.

`build_rpe` lives here too: this module depends on `rpe.registry`, never the other way round.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import registry
from .registry import PRESETS

if TYPE_CHECKING:
    from .registry import Sites

__all__ = [
    "MODES",
    "INDEXES",
    "BACKENDS",
    "BACKEND_DEVICES",
    "backend_devices",
    "backends_on",
    "check_backend_device",
    "RPEConfig",
    "RPEConfigError",
    "PRESETS",
    "DEFAULT_PRESET",
    "parse_shorthand",
    "resolve_rpe",
    "build_rpe",
]

# The RPE of a model whose RPE is not named, on every route: the command line's ``rpe`` group (configs/train.yaml,
# checked equal by a test), `resolve_rpe` without an argument, `models.create_model`, the backbone and Lightning
# module constructors and timm's untagged ``*_rpe`` names. It is iRPE's contextual product method on K, whose
# fields are `RPEConfig`'s defaults (so ``RPEConfig()`` is it too). ``None`` and "none" are no RPE.
DEFAULT_PRESET = "irpe_k"
# The positive normal float32 range (torch.finfo(torch.float32).tiny and .max), which RoPE's theta must lie in
FLOAT32_TINY, FLOAT32_MAX = 2.0**-126, (2 - 2.0**-23) * 2.0**127

MODES: tuple[str, ...] = ("bias", "ctx")
INDEXES: tuple[str, ...] = ("piecewise", "clip")
BACKENDS: tuple[str, ...] = ("auto", "sdpa", "eager", "flex", "naive", "triton")


@dataclasses.dataclass(frozen=True)
class BackendDevices:
    """The device kinds a backend trains on (forward and backward) and evaluates on (forward only); ``kernel``
    names what runs, ``note`` (``train_note`` for training) says more on where it runs."""

    train: tuple[str, ...]
    evaluate: tuple[str, ...]
    kernel: str
    note: str = ""
    train_note: str = ""


# Where each backend runs, by the kind of device of its tensors (Lightning's accelerators: cpu, cuda, mps,
# tpu). A backend not named runs on every device torch does (plain torch operations). torch's FlexAttention
# computes forwards on CPU and MPS in eager mode but has no backward pass there (NotImplementedError at the
# first training step); the fused Triton kernel is CUDA only (on CPU under Triton's interpreter, for tests).
# The run's checks (`lifecycle.settings.check_backend_devices`) and `rpe_attention` both read it.
BACKEND_DEVICES: dict[str, BackendDevices] = {
    "flex": BackendDevices(("cuda",), ("cuda", "cpu", "mps"), "torch's FlexAttention",
                           train_note="it has no backward pass on CPU or MPS"),
    "triton": BackendDevices(("cuda",), ("cuda",), "the fused Triton kernel", "on CPU only under TRITON_INTERPRET=1"),
}
SITES: str = "qkv"
# A product table has (4 ratio + 1)^2 buckets: at ratio 100 already 160801; far above, building it fails.
MAX_RATIO: float = 100.0


class RPEConfigError(ValueError):
    """A relative-position-encoding setting is invalid; the message is one line naming it."""


def triton_interpreted() -> bool:
    """Whether Triton's CPU interpreter is asked for (``TRITON_INTERPRET=1``): the Triton kernel then runs on CPU."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def _triton_missing() -> bool:
    return importlib.util.find_spec("triton") is None


def backend_devices(backend: str, training: bool) -> tuple[str, ...] | None:
    """The device kinds ``backend`` runs on to train (``training``) or to evaluate; None: every device."""
    if backend not in BACKEND_DEVICES:
        return None
    if backend == "triton" and _triton_missing():
        return ()
    rule = BACKEND_DEVICES[backend]
    devices = rule.train if training else rule.evaluate
    if backend == "triton" and triton_interpreted():
        devices = (*devices, "cpu")
    return devices


def backends_on(device: str, training: bool) -> tuple[str, ...]:
    """The backends that run on ``device`` to train (``training``) or to evaluate, in `BACKENDS` order."""
    runs = {b: backend_devices(b, training) for b in BACKENDS}
    return tuple(b for b, devices in runs.items() if devices is None or device in devices)


def check_backend_device(backend: str, device: str, training: bool, where: str | None = None) -> None:
    """Refuse, in one line naming the backend, the device and the backends that run there, ``backend`` on
    ``device`` (``cuda``, ``cpu``, ``mps``, ``tpu``) when `BACKEND_DEVICES` says it cannot train (``training``)
    or evaluate there; ``where`` says how the device was chosen (``trainer.accelerator=cpu``)."""
    devices = backend_devices(backend, training)
    if devices is None or device in devices:
        return
    task = "train" if training else "evaluate"
    rule = BACKEND_DEVICES[backend]
    note = rule.train_note if training and rule.train_note else rule.note
    note = f" ({note})" if note else ""
    why = ("the triton package is not installed (pip install triton)" if not devices else
           f"{rule.kernel} {'trains' if training else 'runs'} on {', '.join(devices)} only{note}")
    raise RPEConfigError(f"rpe.backend={backend} cannot {task} on {where or device}: {why}; valid backends to"
                         f" {task} on {device}: {', '.join(backends_on(device, training))}")


def _choices_error(name: str, value: Any, choices: tuple[str, ...]) -> RPEConfigError:
    return RPEConfigError(f"rpe.{name}={value!r} is not one of: {', '.join(choices)}")


def _unread_error(name: str, value: Any, method: str) -> RPEConfigError:
    reads = ", ".join((*registry.encoding(method).fields, "backend"))
    return RPEConfigError(
        f"rpe.{name}={value!r} is not read by rpe.method={method!r}, which reads only: {reads}; leave rpe.{name} unset"
    )


@dataclasses.dataclass(frozen=True)
class RPEConfig:
    """One relative position encoding, validated on construction.

    Fields:
        method: a registered encoding (`rpe.registry.method_names`; "none" disables RPE); the
            reference's alias ``euc`` is read as ``euclidean``.
        mode: "bias" (scalar per bucket, added to the scaled logits) or "ctx" (contextual: a vector
            per bucket, dotted with the scaled query/key, or summed into the output for V).
        on: injection sites, any non-empty subset of "qkv" in any order; stored canonically ("qk", ...).
        shared_head: one table for all heads (True) or one per head.
        ratio: piecewise/clip knob: alpha = ratio, beta = 2 ratio, gamma = 8 ratio.
        index: "piecewise" (iRPE) or "clip" (Shaw 2018) for euclidean/quant/quant_rank/cross/product.
        window: swin table side M; the grid must fit (h, w <= M).
        num_buckets, max_distance: T5 buckets per axis and the distance where they saturate.
        theta: rotary frequency base (RoPE); None = the encoding's default.
        hidden_dim: hidden width of the continuous position bias MLP.
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
    theta: float | None = None
    hidden_dim: int = 512
    backend: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", registry.canonical_method(self.method))
        if self.method not in registry.method_names():
            raise _choices_error("method", self.method, registry.method_names())
        reads = registry.encoding(self.method).fields
        for spec in dataclasses.fields(self):
            if spec.name not in ("method", "backend", *reads) and getattr(self, spec.name) != spec.default:
                raise _unread_error(spec.name, getattr(self, spec.name), self.method)
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
        if not self.ratio > 0:  # also refuses nan
            raise RPEConfigError(f"rpe.ratio={self.ratio!r} must be > 0")
        if not self.ratio <= MAX_RATIO:  # a shorthand (rpe-1e9-...) never passes the config-level check
            raise RPEConfigError(f"rpe.ratio={self.ratio!r} must be > 0 and <= {MAX_RATIO:g}")
        if not isinstance(self.shared_head, bool):
            raise RPEConfigError(f"rpe.shared_head={self.shared_head!r} must be true or false")
        if self.theta is not None:
            if isinstance(self.theta, bool) or not isinstance(self.theta, (int, float)) or not self.theta > 0:
                raise RPEConfigError(f"rpe.theta={self.theta!r} must be a positive number or null")
            object.__setattr__(self, "theta", float(self.theta))
            # the frequencies theta^(-2i/d) are computed in float32: 1e-300 is 0 there (then inf, and a NaN loss)
            if not FLOAT32_TINY <= self.theta <= FLOAT32_MAX:
                raise RPEConfigError(f"rpe.theta={self.theta!r} is not a float32 number (0 or infinite there, and the"
                                     f" frequencies theta^(-2i/d) with it); valid: {FLOAT32_TINY:.3g} to"
                                     f" {FLOAT32_MAX:.3g}, or null")
        for name, minimum in (("window", 1), ("num_buckets", 4), ("max_distance", 1), ("hidden_dim", 1)):
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
        validate = registry.encoding(self.method).validate
        if validate is not None:
            validate(self)

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
        """The reference flag ``rpe-{ratio}-{method}-{mode}-{shared}-{on}`` (index etc. not included);
        the method name alone for encodings that read none of mode, on, ratio (RoPE, ALiBi, XL, ...).
        """
        if not self.enabled:
            return "none"
        if not {"mode", "on", "ratio"} & set(registry.encoding(self.method).fields):
            return self.method
        return f"rpe-{self.ratio:g}-{self.method}-{self.mode}-{int(self.shared_head)}-{self.on}"


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RPEConfig))

registry.register(registry.Encoding(
    "none", build=lambda config, *args, **kwargs: (None, None, None), summary="no relative position encoding"
))
registry.register_preset("none", RPEConfig(method="none"))


def parse_shorthand(text: str) -> RPEConfig:
    """Parse the reference flag ``rpe-{ratio}-{method}-{mode}-{shared_head 0|1}-{on}``.

    Example: ``parse_shorthand("rpe-2.0-product-ctx-1-k")``; mode is ``ctx`` or ``bias``; the method
    is any registered one or the reference's alias ``euc`` (``rpe-2.0-euc-ctx-1-k``).
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
    try:
        return RPEConfig(method=method, mode=mode, on=on, shared_head=shared_text == "1", ratio=ratio)
    except RPEConfigError as err:  # name the shorthand the user wrote, not only the field it sets
        raise RPEConfigError(f"rpe shorthand {text!r}: {err}") from None


def _from_name(name: str) -> RPEConfig:
    if name in PRESETS:
        return PRESETS[name]
    if name.startswith("rpe-"):
        return parse_shorthand(name)
    raise RPEConfigError(
        f"rpe preset {name!r} is neither a preset ({', '.join(PRESETS)}) nor a shorthand rpe-{{ratio}}-..."
    )


def resolve_rpe(spec: RPEConfig | str | Mapping[str, Any] | None = DEFAULT_PRESET) -> RPEConfig:
    """Turn None (no RPE), an `RPEConfig`, a preset name, a shorthand, or a dict into an `RPEConfig`;
    without an argument, `DEFAULT_PRESET`.

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
        config = dataclasses.replace(base, **overrides) if overrides else base
        # a value set explicitly is refused for a field the method does not read even when it equals the
        # default (RPEConfig alone cannot tell it from unset): `rpe=none rpe.ratio=2` names the method to set
        reads = registry.encoding(config.method).fields
        for key, value in overrides.items():
            if key not in ("method", "backend", *reads):
                raise _unread_error(key, value, config.method)
        return config
    raise RPEConfigError(
        f"rpe spec of type {type(spec).__name__} is not supported; use None, RPEConfig, a preset name,"
        " a shorthand or a dict"
    )


def build_rpe(
    config: Any, head_dim: int, num_heads: int, *, skip_bucket: bool = True, device: Any = None, dtype: Any = None
) -> Sites:
    """Build the ``(rpe_q, rpe_k, rpe_v)`` modules of one attention layer (None where unused).

    ``config`` is anything `resolve_rpe` accepts. ``skip_bucket`` reserves the extra bucket shared
    by skip (class/distillation) tokens in bucket tables: True for DeiT (49 + 1 at ratio 1.9, as in the
    reference DeiT checkpoints), False for backbones without such tokens (DETR, Swin: 49).
    """
    config = resolve_rpe(config)
    return registry.encoding(config.method).build(
        config, head_dim, num_heads, skip_bucket=skip_bucket, device=device, dtype=dtype
    )
