"""Range and type checks of every numeric (and flag) setting of a composed config, before anything runs.

`SCHEMA` declares each setting once: a dotted key pattern (``*`` matches within one dotted segment) and its
type, a pydantic annotation whose union members are the setting's forms (an integer or a number with bounds, a
flag, fixed values such as ``-1`` or ``"auto"``, a list of such, null), each with what it means as its
``Field(description=...)``. `check_settings(cfg)` walks the config once: a value whose key matches a pattern must
validate against its type (pydantic, strict: ``true`` is no ``1``, ``2.0`` no integer, nan no number); any other
float must be finite. The first bad value raises a `SettingError` with one line,
``<key>=<value> must be <the valid forms>`` (the wording of the project's other setting errors, e.g.
``rpe.ratio=-1.0 must be > 0 ...``), whose words `describe` derives from the type's constraints. Keys a config
lacks are skipped, and unknown keys are Hydra's business (struct mode refuses them).

A new setting is one entry of `SCHEMA`. The first matching pattern wins, so put a specific key before a pattern
covering it.
"""

from __future__ import annotations

import math
import os
import re
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache, cached_property, lru_cache
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, GroupedMetadata, Gt, Le, Len, Lt
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import (
    AfterValidator,
    AllowInfNan,
    BeforeValidator,
    ConfigDict,
    Field,
    InstanceOf,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    StringConstraints,
    TypeAdapter,
    ValidationError,
)
from pydantic.fields import FieldInfo
from typing_extensions import TypedDict

from data.errors import DataConfigError
from data.relational import LABELS, OBJECT_MIN
from rpe.config import MAX_RATIO

__all__ = ["SCHEMA", "Setting", "SettingError", "DataSettingError", "better", "check_backend_devices",
           "check_settings", "check_schedule", "check_devices", "check_splits", "check_strategy",
           "configured_world_size", "decode_environment_values", "describe", "env_source", "mixup_keys",
           "run_device", "setting_for"]


class SettingError(ValueError):
    """A setting outside its valid range or of the wrong type; the message is one line naming it."""


class DataSettingError(SettingError, DataConfigError):
    """A bad ``data.*`` setting (a `DataConfigError` too, like every data error)."""


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


def show(value: Any, as_real: bool = False) -> str:
    """``value`` as a user would write it (YAML spelling; ``as_real`` shows an int as the float it stands for)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and as_real:
        return repr(float(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show(v, as_real) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show(v, as_real)}" for k, v in value.items()) + "}"
    return repr(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _join(parts: Sequence[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]


# ----------------------------------------------------------------------------- the schema's vocabulary
def note(meaning: str) -> FieldInfo:
    """What a form of a setting means (``note("0: off")``), said in parentheses after its range; for a form whose
    constraints say nothing in words (a string pattern, a mapping, a name), the whole description of it."""
    return Field(description=meaning)


def null(meaning: str) -> Any:
    """``null`` as a form of a setting, with what it means (``null("no EMA")``)."""
    return Annotated[None, note(meaning)]


def _same_type(kinds: frozenset[type]) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if type(value) not in kinds:
            raise ValueError(f"not one of the types {sorted(k.__name__ for k in kinds)}")
        return value

    return check


def one_of(*values: Any, meaning: str = "") -> Any:
    """Exactly one of ``values``, type included: pydantic's ``Literal`` alone takes ``True`` for ``1`` and ``1.0``
    for ``1`` (even strict), so the value's type must be one of theirs too."""
    metadata = (BeforeValidator(_same_type(frozenset(type(v) for v in values))), *([note(meaning)] if meaning else []))
    return Annotated[(Literal[values], *metadata)]


def text(pattern: str, description: str) -> Any:
    """A string matching ``pattern`` as a whole (Python's ``re``: the patterns use look-aheads)."""
    return Annotated[StrictStr, StringConstraints(pattern=rf"\A(?:{pattern})\Z"), note(description)]


@dataclass(frozen=True)
class Arguments:
    """Schema metadata of a mapping of keyword arguments: each key must be one of ``keys()`` (e.g. a class's
    constructor arguments); ``owner`` names what takes them and ``note`` says what else applies."""

    keys: Callable[[], tuple[str, ...]]
    owner: str
    note: str = ""

    def bad_key(self, key: str, value: dict[str, Any]) -> str | None:
        """The one-line refusal of the first key of ``value`` (the mapping at ``key``) that is not valid."""
        valid = self.keys()
        for name, item in value.items():
            if name not in valid:
                also = f" ({self.note})" if self.note else ""
                return (f"{key}.{name}={show(item)} is not an argument of {self.owner}; "
                        f"valid keys of {key}: {', '.join(valid)}{also}")
        return None


Real = Annotated[StrictFloat, AllowInfNan(False)]  # a finite number: an int or a float (not a bool, not a string)
PositiveInt = Annotated[StrictInt, Ge(1)]
Count = Annotated[StrictInt, Ge(0)]
Probability = Annotated[Real, Ge(0), Le(1)]
DropRate = Annotated[Real, Ge(0), Lt(1)]  # a drop rate of 1 zeroes every activation and scales by 1/0
NonNegative = Annotated[Real, Ge(0)]
Positive = Annotated[Real, Gt(0)]
UnitInterval = Annotated[Real, Gt(0), Le(1)]  # (0, 1]: a share that cannot be nothing
Seed = Annotated[StrictInt, Ge(0), Le(2**32 - 1)]  # numpy's (and Lightning's seed_everything's) seed range
Size = Annotated[list[PositiveInt], Len(2, 2)]
Flag = StrictBool
# Lightning's limit_*_batches / overfit_batches / val_check_interval: an int counts batches, a float is a
# fraction (so the int 0 is no fraction 0.0 there: val_check_interval=0 would check every 0th batch); a number
# that must be a float reads "a fraction"
Fraction = Annotated[InstanceOf[float], AllowInfNan(False), Ge(0), Le(1)]
# val_check_interval=0.0 would validate after every batch (Lightning rounds 0 batches up to 1)
EpochFraction = Annotated[InstanceOf[float], AllowInfNan(False), Gt(0), Le(1)]
Batches = Annotated[Count, note("batches")]
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")
PRECISIONS = ("transformer-engine", "transformer-engine-float16", "16-true", "16-mixed", "bf16-true", "bf16-mixed",
              "32-true", "64-true", "64", "32", "16", "bf16")
Time = text(r"(?!0+:0+:0+:0+$)\d+:\d{1,2}:\d{1,2}:\d{1,2}", "a duration 'DD:HH:MM:SS' longer than 0")


class TimedeltaArguments(TypedDict, total=False):
    """``datetime.timedelta``'s arguments (other keys pass here for `Arguments` to name)."""

    __pydantic_config__ = ConfigDict(extra="allow")
    weeks: NonNegative
    days: NonNegative
    hours: NonNegative
    minutes: NonNegative
    seconds: NonNegative
    milliseconds: NonNegative
    microseconds: NonNegative


TIMEDELTA_KEYS = tuple(TimedeltaArguments.__annotations__)


def _longer_than_zero(value: dict[str, Any]) -> dict[str, Any]:
    numbers = [v for k, v in value.items() if k in TIMEDELTA_KEYS]
    if any(v > 0 for v in numbers) or len(numbers) < len(value):  # an unknown key: `Arguments` names it
        return value
    raise ValueError("a duration of 0")


def _text_keys(value: Any) -> Any:
    """A mapping's keys as text: OmegaConf's may be ints (``{1: 2}`` on the command line), for `Arguments` to name."""
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else value


Timedelta = Annotated[TimedeltaArguments, BeforeValidator(_text_keys), AfterValidator(_longer_than_zero),
                      note("a mapping of datetime.timedelta arguments, each >= 0 and not all 0"),
                      Arguments(lambda: TIMEDELTA_KEYS, "datetime.timedelta")]
# '~' is the shell's: written inside a value (paths.log_dir='~/runs') it reaches Python as a folder named '~'
Folder = text(r"(?!~)(?s:.*\S.*)",
              "a folder path (not empty; a leading '~' is not expanded: write the home folder out)")
# A name (run_name, sweep_name...): any of YAML's scalars. Hydra reads ``run_name=nan`` as a float; it is a name.
Name = Annotated[StrictStr | StrictInt | StrictFloat | StrictBool | None, note("a name")]
# The module passes num_classes itself (from the data): a user's would be overwritten.
MIXUP_SET_BY_THE_MODULE = ("num_classes",)


@lru_cache(maxsize=1)
def mixup_keys() -> tuple[str, ...]:
    """The settings ``model.mixup`` may hold: ``timm.data.Mixup``'s arguments but those the module sets."""
    import inspect

    from timm.data import Mixup

    names = [n for n, p in inspect.signature(Mixup.__init__).parameters.items()
             if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return tuple(sorted(n for n in names if n not in MIXUP_SET_BY_THE_MODULE))


def _preset(form: Any) -> Any:
    return form | null("the preset's value")


# ----------------------------------------------------------------------------- the schema
SCHEMA: dict[str, Any] = {
    # -- top level (train.yaml, eval.yaml)
    "seed": Seed,
    "threads": PositiveInt | null("torch's default thread count"),
    **dict.fromkeys(("run_name", "name", "task_name", "sweep_name", "ablation"), Name),
    "resume": Flag,
    "test_after_fit": Flag,
    "print_config": Flag,
    "batch_size": PositiveInt | null("the run's batch size"),
    "throughput_batch": PositiveInt | null("no throughput measured"),
    # -- data: both data modules
    "data.batch_size": PositiveInt,
    "data.num_workers": Count,
    "data.pin_memory": Flag,
    "data.num_classes": PositiveInt | null("counted from the data"),
    "data.mean": Annotated[list[Probability], Len(3, 3)],
    "data.std": Annotated[list[Positive], Len(3, 3)],
    # -- data: ImageFolder (timm transforms)
    "data.img_size": PositiveInt,
    "data.eval_crop_pct": UnitInterval,
    "data.repeated_aug": Flag,
    "data.num_repeats": PositiveInt,
    "data.train_transform.scale": Annotated[list[UnitInterval], Len(2, 2)],
    "data.train_transform.ratio": Annotated[list[Positive], Len(2, 2)],
    "data.train_transform.hflip": Probability,
    "data.train_transform.vflip": Probability,
    "data.train_transform.color_jitter": NonNegative | Annotated[list[NonNegative], Len(3, 4)] | null("off"),
    "data.train_transform.*_prob": Probability,  # re_prob, color_jitter_prob, grayscale_prob, ...
    "data.train_transform.re_count": PositiveInt,
    "data.train_transform.re_num_splits": Count,
    "data.train_transform.crop_pct": UnitInterval | null("timm's default"),
    # -- data: COCO
    "data.train_scales": Annotated[list[PositiveInt], Len(1)],
    "data.max_size": PositiveInt | null("no limit"),
    "data.crop_scales": Annotated[list[PositiveInt], Len(1)] | null("no random crop"),
    "data.crop_size": Size,
    "data.hflip": Flag,
    "data.val_size": PositiveInt,
    # -- data: generators (relational shapes, digits, shapes-COCO)
    "data.generator.num_train": PositiveInt,
    "data.generator.num_val": PositiveInt,
    "data.generator.img_size": PositiveInt,
    "data.generator.patch_size": PositiveInt,
    "data.generator.seed": Seed,
    "data.generator.*_object_size": PositiveInt,
    # the eight direction sectors are 45 degrees wide: a margin of 22.5 on each side leaves no placement
    "data.generator.boundary_margin_deg": Annotated[Real, Ge(0), Lt(22.5)],
    "data.generator.noise_max": Annotated[StrictInt, Ge(1), Le(OBJECT_MIN - 50)],
    # label=distance: bin edges in patches (increasing: checked with the generator's other settings), and a
    # margin in pixels below half the narrowest bin (checked there too)
    "data.generator.label": one_of(*LABELS),
    "data.generator.distance_edges": Annotated[list[NonNegative], Len(1)] | null("the default bins"),
    "data.generator.distance_margin_px": NonNegative,
    # [top, left, bottom, right] px
    "data.generator.region": Annotated[list[Count], Len(4, 4)] | null("the whole canvas"),
    "data.generator.val_fraction": Annotated[Real, Gt(0), Lt(1)],
    "data.generator.image_size": Size,
    "data.generator.object_size": Size,
    "data.generator.max_objects": PositiveInt,
    "data.generator.max_overlap": Probability,
    # -- model: classification (backbone kwargs, DeiT recipe)
    "model.net.img_size": PositiveInt,
    "model.net.*drop*_rate": DropRate,  # drop_rate, drop_path_rate, attn_drop_rate, proj_drop_rate, ...
    "model.net.peg_blocks": Annotated[list[Count], Len(1)] | null("[0]"),
    "model.net.patch_size": PositiveInt,
    "model.net.embed_dim": PositiveInt,
    "model.net.depth": PositiveInt,
    # a list: one count per stage (Swin)
    "model.net.num_heads": PositiveInt | Annotated[list[PositiveInt], Len(1)],
    "model.net.depths": Annotated[list[PositiveInt], Len(1)],  # blocks per stage (Swin)
    "model.net.window_size": PositiveInt,
    "model.net.mlp_ratio": Positive,
    "model.optimizer.lr": Positive,
    "model.optimizer.lr_base_batch": PositiveInt,
    "model.optimizer.weight_decay": NonNegative,
    "model.optimizer.betas": Annotated[list[Annotated[Real, Ge(0), Lt(1)]], Len(2, 2)],
    "model.optimizer.eps": Positive,
    "model.optimizer.pos_lr_scale": Positive,
    "model.optimizer.pos_weight_decay": NonNegative | null("the decay of the parameter's own group"),
    "model.scheduler.warmup_epochs": NonNegative,
    "model.scheduler.warmup_lr": NonNegative,
    "model.scheduler.min_lr": NonNegative,
    "model.mixup": Annotated[dict, note("a mapping of timm Mixup settings"),
                             Arguments(mixup_keys, "timm.data.Mixup", "num_classes comes from the data")]
                   | null("no mixup"),
    "model.mixup.mixup_alpha": NonNegative,
    "model.mixup.cutmix_alpha": NonNegative,
    "model.mixup.cutmix_minmax": Annotated[list[UnitInterval], Len(2, 2)] | null("off"),
    "model.mixup.prob": Probability,
    "model.mixup.switch_prob": Probability,
    "model.mixup.label_smoothing": Probability,
    "model.mixup.correct_lam": Flag,
    "model.mixup.multi_label": Flag,
    "model.mixup.mode": one_of("batch", "pair", "elem"),  # timm treats any other mode as 'batch'
    "model.label_smoothing": Probability,
    # 0 would silently mean "no EMA" (the module tests `if ema_decay`), 1 an average that never moves
    "model.ema_decay": Annotated[Real, Gt(0), Lt(1)] | null("no EMA"),
    "model.compile": Flag,
    # -- model: DETR
    "model.backbone.channels": Annotated[list[PositiveInt], Len(3, 3)],
    "model.backbone.stem_stride": PositiveInt,
    "model.hidden_dim": PositiveInt,
    "model.nheads": PositiveInt,
    "model.enc_layers": Count,
    "model.dec_layers": PositiveInt,
    "model.dim_feedforward": PositiveInt,
    "model.dropout": DropRate,
    "model.num_queries": PositiveInt,
    "model.pre_norm": Flag,
    "model.aux_loss": Flag,
    "model.set_cost_*": NonNegative,
    "model.*_loss_coef": NonNegative,
    "model.eos_coef": Probability,
    "model.lr": Positive,
    "model.lr_backbone": Annotated[NonNegative, note("0 freezes the backbone")],
    "model.weight_decay": NonNegative,
    "model.lr_drop": PositiveInt,
    "model.lr_gamma": UnitInterval,
    # -- rpe: null keeps the preset's value. A product table has (4 ratio + 1)^2 buckets: ratio 100 is
    # already 160801 of them (MAX_RATIO, also enforced by rpe.RPEConfig for shorthands)
    "rpe.ratio": _preset(Annotated[Real, Gt(0), Le(MAX_RATIO)]),
    "rpe.window": _preset(PositiveInt),
    "rpe.num_buckets": _preset(Annotated[StrictInt, Ge(4)]),
    "rpe.max_distance": _preset(PositiveInt),
    "rpe.theta": _preset(Positive),
    "rpe.hidden_dim": _preset(PositiveInt),
    "rpe.shared_head": _preset(Flag),
    # -- trainer (Lightning's Trainer arguments, in the forms Lightning accepts)
    "trainer.devices": PositiveInt | one_of(-1, meaning="all") | one_of("auto") | Annotated[list[Count], Len(1)]
                       | text(r"-1|\d+|\d+(,\d+)*,?", "a string of device ids such as '0,1'"),
    "trainer.num_nodes": PositiveInt,
    # Lightning's accelerator names ("gpu": cuda or mps); check_devices checks that the machine has one
    "trainer.accelerator": one_of(*ACCELERATORS),
    # Lightning's precision names (lightning.fabric.connector._PRECISION_INPUT)
    "trainer.precision": one_of(16, 32, 64) | text("|".join(map(re.escape, PRECISIONS)),
                                                   "a precision name such as '32-true' or 'bf16-mixed'"),
    "trainer.max_epochs": one_of(-1, meaning="unlimited") | PositiveInt | null("Lightning's default"),
    "trainer.min_epochs": Count | null("none"),
    "trainer.max_steps": one_of(-1, meaning="unlimited") | PositiveInt,
    "trainer.min_steps": Count | null("none"),
    "trainer.max_time": Time | Timedelta | null("no limit"),
    "paths.log_dir": Folder,
    "paths.data_dir": Folder,
    "trainer.limit_*_batches": Batches | Fraction | null("all batches"),
    "trainer.overfit_batches": Batches | Fraction,
    "trainer.val_check_interval": Annotated[PositiveInt, note("batches")] | EpochFraction | Time | Timedelta
                                  | null("once per epoch"),
    "trainer.check_val_every_n_epoch": PositiveInt | null("by val_check_interval only"),
    "trainer.num_sanity_val_steps": one_of(-1, meaning="all") | Count | null("Lightning's default"),
    "trainer.log_every_n_steps": Annotated[Count, note("0: no step logging")] | null("Lightning's default"),
    "trainer.gradient_clip_val": NonNegative | null("no clipping"),
    "trainer.gradient_clip_algorithm": one_of("norm", "value") | null("Lightning's default (norm)"),
    "trainer.accumulate_grad_batches": PositiveInt,
    "trainer.reload_dataloaders_every_n_epochs": Count,
    "trainer.fast_dev_run": Flag | Batches,
    "trainer.deterministic": Flag | one_of("warn") | null("Lightning's default"),
    "trainer.benchmark": Flag | null("Lightning's default"),
    "trainer.inference_mode": Flag,
    "trainer.detect_anomaly": Flag,
    "trainer.sync_batchnorm": Flag,
    "trainer.use_distributed_sampler": Flag,
    "trainer.barebones": Flag,
    "trainer.enable_*": Flag | null("Lightning's default"),  # model_summary, progress_bar, checkpointing
    # -- callbacks
    "callbacks.progress_bar.refresh_rate": Annotated[Count, note("0: off")],
    "callbacks.last_checkpoint.every_n_train_steps": PositiveInt | null("at epoch ends only"),
    "callbacks.model_checkpoint.save_top_k": one_of(-1, meaning="all") | Count,
    "callbacks.model_checkpoint.mode": one_of("min", "max"),
    "callbacks.model_checkpoint.every_n_epochs": Count | null("Lightning's default"),
    "callbacks.model_checkpoint.every_n_train_steps": Count | null("Lightning's default"),
    "callbacks.model_checkpoint.save_last": Flag | one_of("link") | null("off"),
    "callbacks.model_checkpoint.auto_insert_metric_name": Flag,
    "callbacks.model_checkpoint.enable_version_counter": Flag,
    "callbacks.model_checkpoint.save_weights_only": Flag,
    "callbacks.model_checkpoint.save_on_train_epoch_end": Flag | null("Lightning's default"),
    "callbacks.step_cost.warmup_steps": Count,
}


# ----------------------------------------------------------------------------- reading the schema
def forms(annotation: Any) -> tuple[Any, ...]:
    """The forms a setting's type takes: the members of its union (a type that is no union: itself)."""
    if get_origin(annotation) in (Union, types.UnionType):
        return get_args(annotation)
    return (annotation,)


def unpacked(annotation: Any) -> tuple[Any, tuple[Any, ...]]:
    """``(type, metadata)`` of ``Annotated[type, *metadata]`` (nested ones are flat); a bare type has none.
    The constraints of a ``Field(ge=...)`` or an ``Interval(gt=..., le=...)`` count as metadata of their own."""
    if get_origin(annotation) is not Annotated:
        return annotation, ()
    base, *metadata = get_args(annotation)
    flat: list[Any] = []
    for item in metadata:
        flat.append(item)
        if isinstance(item, FieldInfo):
            flat.extend(item.metadata)
        elif isinstance(item, GroupedMetadata):
            flat.extend(item)
    return base, tuple(flat)


_BOUND_WORDS = ((Gt, "gt", ">"), (Ge, "ge", ">="), (Lt, "lt", "<"), (Le, "le", "<="))


def _number_words(base: type, metadata: tuple[Any, ...]) -> str:
    noun = "an integer" if base is int else "a fraction" if any(isinstance(m, InstanceOf) for m in metadata) else ""
    bounds = [f"{sign} {_num(getattr(m, name))}" for kind, name, sign in _BOUND_WORDS for m in metadata
              if isinstance(m, kind)]
    return f"{noun} {' and '.join(bounds)}".strip() or "a finite number"


def _words(base: Any, metadata: tuple[Any, ...]) -> str | None:
    """What a form's type and constraints say in words; None where they say nothing a user could read (a string
    pattern, a mapping, a union of scalars): its description says it."""
    if base is type(None):
        return "null"
    if base is bool:
        return "true or false"
    if get_origin(base) is Literal:
        return _join([show(v) for v in get_args(base)])
    if base in (int, float):
        return _number_words(base, metadata)
    if get_origin(base) is list:
        length = next((m for m in metadata if isinstance(m, Len)), Len(0))
        low, high = length.min_length, length.max_length
        size = f"{low} or more" if high is None else " or ".join(str(n) for n in range(low, high + 1))
        return f"a list of {size} values, each {describe(get_args(base)[0])}"
    return None


def describe(annotation: Any) -> str:
    """The valid values of a setting's type in words, e.g. ``an integer >= 1 or null (no limit)``: each form's
    words from its constraints (`_words`), followed by its description in parentheses; a form without words is
    its description. A form with neither raises TypeError: the schema must say what every setting takes."""
    parts = []
    for form in forms(annotation):
        base, metadata = unpacked(form)
        meaning = next((m.description for m in metadata if isinstance(m, FieldInfo) and m.description), "")
        words = _words(base, metadata)
        if words is None and not meaning:
            raise TypeError(f"the form {form!r} has no words of its own: give it a note(...) saying what it takes")
        parts.append(meaning if words is None else f"{words} ({meaning})" if meaning else words)
    return _join(parts)


def _leaves(annotation: Any) -> Iterator[tuple[Any, tuple[Any, ...]]]:
    """``(type, metadata)`` of each form, a list's item in its place."""
    for form in forms(annotation):
        base, metadata = unpacked(form)
        if get_origin(base) is list:
            yield from _leaves(get_args(base)[0])
        else:
            yield base, metadata


def _takes_text(base: Any) -> bool:
    """A form's type is a string (a pattern), fixed strings, or a union with a string among its members."""
    if get_origin(base) is Literal:
        return all(isinstance(v, str) for v in get_args(base))
    if get_origin(base) in (Union, types.UnionType):
        return any(_takes_text(unpacked(member)[0]) for member in get_args(base))
    return base is str


# Strict: true is no 1, 2.0 no integer, '8' no number; Python's re: the string patterns use look-aheads
_VALIDATION = ConfigDict(strict=True, regex_engine="python-re")


@dataclass(frozen=True)
class Setting:
    """The settings whose dotted key matches ``pattern`` (``*``: within one segment) and their type."""

    pattern: str
    annotation: Any

    @cached_property
    def regex(self) -> re.Pattern[str]:
        return re.compile("[^.]*".join(re.escape(part) for part in self.pattern.split("*")))

    @cached_property
    def _adapter(self) -> TypeAdapter[Any]:  # built on first use: most commands read few of the settings
        return TypeAdapter(self.annotation, config=_VALIDATION)

    def accepts(self, value: Any) -> bool:
        try:
            self._adapter.validate_python(list(value) if isinstance(value, tuple) else value, strict=True)
        except ValidationError:
            return False
        return True

    def describe(self) -> str:
        return describe(self.annotation)

    @cached_property
    def is_real(self) -> bool:
        """Its numbers are all reals: an int given for it is shown as the float it stands for."""
        numbers = [base for base, _ in _leaves(self.annotation) if base in (int, float)]
        return bool(numbers) and all(base is float for base in numbers)

    @cached_property
    def typed(self) -> bool:
        """Whether it takes a value that is not a string (a number, a flag, null, a list or a mapping), and no
        string stands for it (a name takes any scalar: a string is one)."""
        return any(not _takes_text(base) for base, _ in _leaves(self.annotation))

    @cached_property
    def arguments(self) -> Arguments | None:
        """The keys its mapping form takes (`Arguments`), where it has one."""
        return next((m for form in forms(self.annotation) for m in unpacked(form)[1] if isinstance(m, Arguments)),
                    None)


SETTINGS: tuple[Setting, ...] = tuple(Setting(pattern, annotation) for pattern, annotation in SCHEMA.items())
_COMPILED: tuple[tuple[re.Pattern[str], Setting], ...] = tuple((s.regex, s) for s in SETTINGS)
SKIPPED = ("hydra",)  # Hydra's own config (present when composed with return_hydra_config) is not a setting


def setting_for(key: str) -> Setting | None:
    """The first setting whose pattern matches the dotted ``key`` (``None``: only the nan/inf check applies)."""
    return next((s for regex, s in _COMPILED if regex.fullmatch(key)), None)


# ----------------------------------------------------------------------------- the check
def _children(node: DictConfig | ListConfig, prefix: str) -> Iterator[tuple[str, Any]]:
    """``(dotted key, resolved value)`` of each child; missing (``???``) values and interpolations that
    cannot be resolved here are left out: instantiating them fails later with its own message."""
    keys = list(node.keys()) if isinstance(node, DictConfig) else range(len(node))
    for key in keys:
        path = f"{prefix}.{key}" if prefix else str(key)
        if not prefix and path in SKIPPED:
            continue
        try:
            if OmegaConf.is_missing(node, key):
                continue
            yield path, node[key]
        except OmegaConfBaseException:
            continue


def _plain(value: Any) -> Any:
    if isinstance(value, (DictConfig, ListConfig)):
        return None if value._is_none() else OmegaConf.to_container(value, resolve=True)
    return value


def _fail(key: str, message: str) -> SettingError:
    error = (DataSettingError if key.split(".")[0] == "data" else SettingError)(message)
    error.key = key  # for `check_settings`, which names the environment variable a bad value came from
    return error


def env_source(cfg: DictConfig, key: str) -> str | None:
    """The environment variable ``key``'s value came from: its config value is ``${oc.env:NAME[,default]}`` and
    NAME is set (so the user never typed the key: a message naming only the key would not say what to fix)."""
    return _set_variable(_raw_value(cfg, key))


_ENV_VALUE = re.compile(r"\$\{\s*oc\.env:\s*([A-Za-z_]\w*)\s*(,.*)?\}", re.DOTALL)


def _set_variable(raw: Any) -> str | None:
    """NAME of a raw config value ``${oc.env:NAME[,default]}`` whose variable is set, else None."""
    found = _ENV_VALUE.fullmatch(str(raw)) if isinstance(raw, str) else None
    return found.group(1) if found and found.group(1) in os.environ else None


def _unset_with_default(raw: Any) -> str | None:
    """NAME of a raw config value ``${oc.env:NAME,default}`` whose variable is not set (OmegaConf then gives the
    default as a string, as it gives a set variable's text), else None."""
    found = _ENV_VALUE.fullmatch(str(raw)) if isinstance(raw, str) else None
    return found.group(1) if found and found.group(2) and found.group(1) not in os.environ else None


def _raw_value(cfg: DictConfig, key: str) -> Any:
    """The unresolved value of ``key`` in ``cfg`` (its interpolation's text), or None."""
    parent_key, _, leaf = key.rpartition(".")
    try:
        parent = OmegaConf.select(cfg, parent_key, throw_on_resolution_failure=False) if parent_key else cfg
        if not isinstance(parent, DictConfig) or leaf not in parent:
            return None
        return parent._get_node(leaf)._value()
    except (OmegaConfBaseException, AttributeError):
        return None


def _environment_keys(cfg: DictConfig) -> Iterator[str]:
    """The dotted keys of ``cfg`` (Hydra's node aside) whose value is an environment variable's text: a set
    variable (`env_source`), or the default of an unset one."""
    def walk(node: Any, prefix: str) -> Iterator[str]:
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, dict) and not (not prefix and path in SKIPPED):
                yield from walk(value, path)
            elif _set_variable(value) is not None or _unset_with_default(value) is not None:
                yield path

    yield from walk(OmegaConf.to_container(cfg, resolve=False), "")


def _spelled(text: str) -> tuple[bool, Any]:
    """``(True, value)``: what ``text`` spells as a command-line value, as Hydra reads ``key=<text>`` (``'1'`` is
    1, ``'1e-3'`` 0.001, ``'true'`` True, ``'null'`` None); ``(False, None)`` where it is no value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return True, OverridesParser.create().parse_override(f"key={text}").value()
    except (HydraException, ValueError):
        return False, None


def decode_environment_values(cfg: DictConfig) -> None:
    """Each setting whose value is an environment variable (``${oc.env:NAME}``, which OmegaConf gives as a
    string) becomes the value the variable's text spells where its type takes that value and not the string:
    ``threads=${oc.env:OMP_NUM_THREADS}`` with ``OMP_NUM_THREADS=1`` is ``threads=1``, as on the command line.
    Done in place, before a run's identity is taken, so the run records, hashes and uses the value. A text
    that spells no valid value stays, for `check_settings` to refuse naming the variable."""
    from omegaconf import open_dict, read_write

    for key in list(_environment_keys(cfg)):
        setting = setting_for(key)
        parent_key, _, leaf = key.rpartition(".")
        try:
            parent = OmegaConf.select(cfg, parent_key, throw_on_resolution_failure=False) if parent_key else cfg
            value = parent[leaf] if isinstance(parent, DictConfig) else None
        except OmegaConfBaseException:  # a variable that cannot be resolved here: named by its own check
            continue
        if setting is None or not isinstance(value, str) or setting.accepts(value):
            continue
        spelled, decoded = _spelled(value)
        if spelled and not isinstance(decoded, str) and setting.accepts(decoded):
            with read_write(parent), open_dict(parent):
                parent[leaf] = decoded


def _non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def check_value(key: str, value: Any) -> None:
    """The type of ``key`` (`setting_for`) on one value, alone: `SettingError` (one line) where it refuses it."""
    _check(key, value)


def _check(key: str, value: Any) -> None:
    setting = setting_for(key)
    if setting is not None:
        try:
            plain = _plain(value)
        except OmegaConfBaseException:  # an element that cannot be resolved here: left to instantiation
            return
        if not setting.accepts(plain):
            bad_float = _non_finite(plain) or (
                isinstance(plain, list) and any(_non_finite(v) for v in plain)
            )
            must = "must be a finite number; valid:" if bad_float else "must be"
            raise _fail(key, f"{key}={show(plain, setting.is_real)} {must} {setting.describe()}")
        if setting.arguments is not None and isinstance(plain, dict):
            problem = setting.arguments.bad_key(key, plain)
            if problem is not None:
                raise _fail(key, problem)
        if not isinstance(value, DictConfig):
            return
    if isinstance(value, (DictConfig, ListConfig)):
        if not value._is_none():
            for child_key, child in _children(value, key):
                _check(child_key, child)
    elif _non_finite(value):
        raise _fail(key, f"{key}={show(value)} must be a finite number")


def _preset_row(cfg: DictConfig, row: str) -> bool:
    """``row`` names an RPE preset in a sweep whose lookups take such a name without an entry in ``rows``
    (configs/sweep/compare.yaml: ``rpe.preset`` falls back to the row's name)."""
    from rpe.config import PRESETS

    if row not in PRESETS:
        return False
    try:
        return OmegaConf.select(cfg, "rpe.preset", throw_on_resolution_failure=True) == row
    except OmegaConfBaseException:
        return False


def check_settings(cfg: DictConfig, config_name: str | None = None) -> None:
    """Raise `SettingError` (one line) at the first setting of ``cfg`` outside its valid range or type.

    Checks every key matched by `SCHEMA` and refuses nan/inf anywhere else. ``data.*`` settings raise the
    `DataSettingError` subclass (also a `data.errors.DataConfigError`). ``config_name`` (``train``, ``eval``)
    is the entry point's root config, whose root keys alone are accepted (None: any entry point's).
    """
    rows, row = cfg.get("rows"), cfg.get("row")
    if isinstance(rows, DictConfig) and row is not None and str(row) not in rows and not _preset_row(cfg, str(row)):
        raise SettingError(f"row={row} is not a row of sweep {cfg.get('sweep_name')}; valid: {', '.join(rows)}")
    decode_environment_values(cfg)
    for key, value in _children(cfg, ""):
        try:
            _check(key, value)
        except SettingError as err:
            raise _named_by_environment(cfg, err) from None
    for node in CONSTRUCTED_NODES:
        _check_constructor_keys(cfg, node)
    try:
        _refuse_interpolation_text(cfg)
    except SettingError as err:
        raise _named_by_environment(cfg, err) from None
    _check_root_keys(cfg, config_name)
    _check_output_dir_setting(cfg)
    _check_checkpoint_callbacks(cfg)
    check_profiler_files(cfg, config_name)
    _check_trainer_built_by_job(cfg, config_name)
    _check_sweeper_direction(cfg)
    _check_logger_folders(cfg)
    _check_head_widths(cfg)


# (heads, width): attention splits the width into equal shares, one per head (DETR's transformer; DeiT's blocks)
HEAD_WIDTHS = (("model.nheads", "model.hidden_dim"), ("model.net.num_heads", "model.net.embed_dim"))


def _check_head_widths(cfg: DictConfig) -> None:
    """A head count that does not divide its width: the model's own check came only as "width 128 is not
    divisible by 3 heads", naming neither setting nor the counts that fit."""
    heads = OmegaConf.select(cfg, "model.net.num_heads", default=None, throw_on_resolution_failure=False)
    name = str(OmegaConf.select(cfg, "model.net.name", default="", throw_on_resolution_failure=False))
    if OmegaConf.is_list(heads) and "swin" not in name:  # a count per stage: Swin's (its backbone checks them)
        raise SettingError(f"model.net.num_heads={list(heads)} is a list (one head count per stage), which only Swin's"
                           f" stages take; {name} has one head count for every block: valid: an integer >= 1")
    for heads_key, width_key in HEAD_WIDTHS:
        heads = OmegaConf.select(cfg, heads_key, default=None, throw_on_resolution_failure=False)
        width = OmegaConf.select(cfg, width_key, default=None, throw_on_resolution_failure=False)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (heads, width)) or \
                width % heads == 0:
            continue  # a list per stage (Swin), unset, or out of range (its own type check names it)
        fits = [str(n) for n in range(1, width + 1) if width % n == 0]
        raise SettingError(f"{heads_key}={heads} must divide {width_key}={width} (each attention head gets an equal"
                           f" share of the width); valid: {heads_key}=<one of: {', '.join(fits)}>, or a"
                           f" {width_key} that {heads} divides")


# ``paths.output_dir`` is the dir Hydra made for the job (paths.log_dir/run_name, a sweep's job dir): every record,
# checkpoint and logger folder of the run goes there, so a value of its own would write them into another folder
# (another run's, whose checkpoints it would overwrite) while the run's own dir stayed empty.
OUTPUT_DIR = "${hydra:runtime.output_dir}"


def _check_output_dir_setting(cfg: DictConfig) -> None:
    """Refuse a ``paths.output_dir`` other than `OUTPUT_DIR` in one line naming the keys that place a run."""
    paths = cfg.get("paths")
    if not isinstance(paths, DictConfig) or "output_dir" not in paths:
        return
    raw = OmegaConf.to_container(paths, resolve=False).get("output_dir")
    if raw != OUTPUT_DIR:
        raise SettingError(f"paths.output_dir={raw!r} is not a setting: it is the dir Hydra makes for the run"
                           f" ({OUTPUT_DIR}), where its records and checkpoints go; valid: paths.log_dir=<folder>"
                           " run_name=<name> (a sweep: hydra.sweep.dir=<folder>)")


# The keys that name folders a run reads or writes: the folders (paths.*) first, so that a value a data root takes
# from one of them is named where it was given.
PATH_KEYS = ("paths.*", "data.root", "data_root", "testset.data.root")


def _refuse_interpolation_text(cfg: DictConfig) -> None:
    """A folder key whose resolved value holds ``${`` (an escaped ``\\${...}`` given on the command line, or a
    variable's text): the checks read the literal folder, but every copy of the config a job reads back (the one
    it trains with, its DDP workers', the saved config.yaml) resolves it as an interpolation again, so the run
    would read another folder than the checked one, and eval.py refuses its record. One line naming the key."""
    for pattern in PATH_KEYS:
        parent, _, leaf = pattern.rpartition(".")
        node = OmegaConf.select(cfg, parent, default=None, throw_on_resolution_failure=False) if parent else cfg
        if not isinstance(node, DictConfig) or node._is_none():
            continue
        for key in (list(node.keys()) if leaf == "*" else [leaf] if leaf in node else []):
            if f"{parent}.{key}" == "paths.log_dir":
                continue  # any '$' in a run's or sweep's dir is refused with the run dir (`cli.refuse_dollar`)
            try:
                value = node[key]
            except OmegaConfBaseException:
                continue  # a value that reads what is not known here (Hydra's runtime): the job's config
            if isinstance(value, str) and "${" in value:
                raise _fail(f"{parent}.{key}" if parent else str(key),
                            f"{parent + '.' if parent else ''}{key}={value!r} holds '${{', which every reading of"
                            " the run's config (the job's, its saved config.yaml) resolves as an interpolation: the"
                            " run would read another folder than the one checked; valid: a folder path without '${'")


def _named_by_environment(cfg: DictConfig, err: SettingError) -> SettingError:
    """``err`` naming the environment variable its value came from (`env_source`), where it came from one; for
    a setting of a number, flag or null, what the variable's text must spell (`decode_environment_values`)."""
    key = getattr(err, "key", None)
    name = env_source(cfg, key) if key else None
    message = str(err)
    unset = _unset_with_default(_raw_value(cfg, key)) if key and name is None else None
    if unset is not None and message.startswith(f"{key}="):  # the default's text, given as a string
        raw = _raw_value(cfg, key)
        problem = message[len(key) + 1:].replace(" must be ", " must spell ", 1)
        renamed = type(err)(f"{key}={raw}: {unset} is not set, and its default {problem}; valid: set {unset}, or a"
                            " default that spells a valid value")
        renamed.key = key
        return renamed
    if name is None or not message.startswith(f"{key}="):
        return err
    setting, problem = setting_for(key), message[len(key) + 1:]
    if setting is not None and setting.typed and isinstance(OmegaConf.select(cfg, key, default=None), str):
        valid = setting.describe()
        problem = f"{os.environ[name]!r} must spell {'a number ' if valid[:1] in '<>' else ''}{valid}"
    renamed = type(err)(f"environment variable {name}={problem}; {key} reads it: set {name} to a valid value, or"
                        " unset it for the config's default")
    renamed.key = key
    return renamed


# Where a run's checkpoints live and what they are called: the test after fit, a rerun, eval.py and the
# tables read <run dir>/checkpoints/best.ckpt and last.ckpt, so these are not settings.
_CHECKPOINT_DIR = "${paths.output_dir}/checkpoints"
_CHECKPOINT_FILES = {"model_checkpoint": "best", "last_checkpoint": "last"}


def _is_run_checkpoint_dir(cfg: DictConfig, name: str) -> bool:
    """Whether ``callbacks.<name>.dirpath`` resolves to ``<paths.output_dir>/checkpoints`` (a run dir's
    resolved config.yaml, which DDP workers load, holds it as a plain path)."""
    from pathlib import Path

    try:
        dirpath = OmegaConf.select(cfg, f"callbacks.{name}.dirpath", throw_on_resolution_failure=True)
        output_dir = OmegaConf.select(cfg, "paths.output_dir", throw_on_resolution_failure=True)
    except OmegaConfBaseException:
        return False
    if dirpath is None or output_dir is None:
        return False
    return Path(str(dirpath)) == Path(str(output_dir)) / "checkpoints"


def run_dir_of(cfg: DictConfig) -> str | None:
    """The run's dir, ``paths.output_dir``, absolute; None where it is not known (the command line's check of a
    sweep, whose jobs' dirs Hydra names as it launches them)."""
    try:
        value = OmegaConf.select(cfg, "paths.output_dir", throw_on_resolution_failure=True)
    except OmegaConfBaseException:
        return None
    return os.path.abspath(str(value)) if value is not None and str(value).strip() else None


def job_path(cfg: DictConfig, path: Any) -> str:
    """``path`` made absolute as the job will resolve it: a relative path from the run dir where
    ``hydra.job.chdir=true`` makes that the job's working dir, else from this working dir. (The job's own config
    has no ``hydra`` node: the job already runs in its working dir.)"""
    text = str(path)
    chdir = OmegaConf.select(cfg, "hydra.job.chdir", default=None, throw_on_resolution_failure=False)
    run_dir = run_dir_of(cfg) if chdir is True else None
    # joined, not normalised: a `..` after a link stays for `check_destination` to read as the system does
    return os.path.join(run_dir if run_dir is not None else os.getcwd(), text)


def _check_inside_run_dir(cfg: DictConfig, name: str, node: str | None = None, what: str = "a callback") -> None:
    """``callbacks.<name>.dirpath`` (or ``<node>.dirpath``, e.g. ``trainer.profiler``) lies inside the run's own dir
    (``paths.output_dir``): a callback's or a profiler's files, like the run's, never land in another run's dir or
    anywhere else."""
    from pathlib import Path

    node = node or f"callbacks.{name}"
    given = OmegaConf.select(cfg, node, throw_on_resolution_failure=False)
    text = OmegaConf.to_container(given, resolve=False).get("dirpath") if isinstance(given, DictConfig) else None
    try:
        dirpath = OmegaConf.select(cfg, f"{node}.dirpath", throw_on_resolution_failure=True)
    except OmegaConfBaseException:
        return  # a dirpath that reads the job's own values: the job checks its own config again
    folder = run_dir_of(cfg)
    if dirpath is None or folder is None:
        return  # the run dir is not known here (a sweep job's): the job checks its own config again
    run_dir = Path(os.path.realpath(folder))
    target = Path(os.path.realpath(job_path(cfg, dirpath)))  # `..` and links read as the system reads them
    if target != run_dir and run_dir not in target.parents:
        raise SettingError(f"{node}.dirpath={text} lies outside the run's dir ({run_dir}): {what} writes only into"
                           f" its own run's dir; valid: a folder inside it, e.g. {node}.dirpath=${{paths.output_dir}}"
                           f"/{name}")


# Trainer arguments the job builds itself (lifecycle.job.build_trainer) from their own config groups: a value
# under trainer.* would be replaced without a word
TRAINER_BUILT_BY_JOB = {"callbacks": "+callbacks.<name>={_target_: ...} (the callbacks group)",
                        "logger": "logger=<one of configs/logger>, or +logger.<name>={_target_: ...}",
                        "plugins": "leave it out (the job's checkpoint writes are atomic through its own plugin)"}


def _is_eval(cfg: DictConfig, config_name: str | None) -> bool:
    """``cfg`` is eval.py's config (eval.py's command line, or scripts/evaluate_testsets.py's evaluations)."""
    return config_name == "eval" or (config_name is None and cfg.get("task_name") == "eval")


# eval.py builds its Trainer with none of a config's callbacks, loggers or plugins (`lifecycle.job.build_trainer`)
EVAL_TRAINER_BUILT = "leave it out (eval.py builds the Trainer's callbacks, loggers and plugins itself)"


def _check_trainer_built_by_job(cfg: DictConfig, config_name: str | None = None) -> None:
    """Refuse ``trainer.callbacks``, ``trainer.logger`` and ``trainer.plugins`` (`TRAINER_BUILT_BY_JOB`) in one line:
    train.py's and eval.py's (and scripts/evaluate_testsets.py's) Trainer alike, each with its own valid choices."""
    trainer = cfg.get("trainer")
    if not isinstance(trainer, DictConfig):
        return
    for key, valid in TRAINER_BUILT_BY_JOB.items():
        if key in trainer:
            raise SettingError(f"trainer.{key} is not a setting: the job builds the Trainer's {key} itself and would"
                               " drop this value without a word; valid:"
                               f" {EVAL_TRAINER_BUILT if _is_eval(cfg, config_name) else valid}")


# Where eval.py (and scripts/evaluate_testsets.py) may write a profiler's report: they only read runs and data, and
# write into a run only its test-set result (testsets/), so a report has a folder of its own
EVAL_PROFILER_FOLDERS = ("a folder outside every run dir, data root, sweep dir and archive (e.g."
                         " trainer.profiler.dirpath=profiles), or trainer.profiler=simple (its report printed)")


def check_profiler_files(cfg: DictConfig, config_name: str | None = None) -> None:
    """A profiler given as an object (``trainer.profiler={_target_: ..., dirpath: ..., filename: ...}``) writes
    ``<dirpath>/<stage>-<filename>.txt``: its file name is a name, not a path (one with a ``/`` or ``..`` would
    lead out of the folder), and its folder lies inside the run's dir for train.py; for eval.py's config
    (``config_name`` ``eval``: eval.py, scripts/evaluate_testsets.py) outside every run dir, data root, sweep dir
    and archive (`_check_eval_profiler_folder`)."""
    eval_config = _is_eval(cfg, config_name)
    profiler = OmegaConf.select(cfg, "trainer.profiler", default=None, throw_on_resolution_failure=False)
    if eval_config and profiler == "pytorch":  # by name: its traces go to the Trainer's log dir
        _check_eval_profiler_folder(cfg, "trainer.default_root_dir")
    if not isinstance(profiler, DictConfig):
        return  # null, or a name ("simple" prints its report; train.py's log dir is the run's)
    filename = OmegaConf.select(profiler, "filename", default=None, throw_on_resolution_failure=False)
    if filename is not None and (os.sep in str(filename) or str(filename) in (".", "..")):
        raise SettingError(f"trainer.profiler.filename={filename} is a path, not a file name: the report would"
                           " land outside the profiler's folder; valid: a name without '/', e.g."
                           " trainer.profiler.filename=profile")
    if eval_config:  # without a dirpath a profiler writes into the Trainer's log dir (eval.py has no logger)
        _check_eval_profiler_folder(cfg, "trainer.profiler.dirpath" if profiler.get("dirpath") is not None
                                    else "trainer.default_root_dir")
    elif profiler.get("dirpath") is not None:
        _check_inside_run_dir(cfg, "profiler", "trainer.profiler", "a profiler")


def _check_eval_profiler_folder(cfg: DictConfig, key: str) -> None:
    """The folder ``key`` names, where eval.py's profiler writes, lies outside every run dir (the evaluated run's
    too), data root (``data_root=``, the test set's ``data.root``, any folder laid out as data), sweep dir and
    archive, judged on its real path by `storage.destinations.check_destination`."""
    from storage.destinations import DestinationError, check_destination, real, sweep_dir_of

    node, _, leaf = key.rpartition(".")
    given = OmegaConf.select(cfg, node, throw_on_resolution_failure=False)
    text = OmegaConf.to_container(given, resolve=False).get(leaf) if isinstance(given, DictConfig) else None
    try:
        folder = OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
    except OmegaConfBaseException:
        return  # it reads a value set only when the job runs (${hydra:...}): the other checks name such a value
    if folder is None or not str(folder).strip():
        return  # no folder: Lightning's default, the working dir
    roots = [OmegaConf.select(cfg, k, default=None, throw_on_resolution_failure=False)
             for k in ("data_root", "testset.data.root", "data.root")]
    path = job_path(cfg, folder)
    why = " (trainer.profiler.dirpath is null: the profiler writes into the Trainer's log dir)" \
        if key == "trainer.default_root_dir" else ""
    try:
        check_destination(path, key, data_roots=[r for r in roots if isinstance(r, str)],
                          given=None if str(text) == path else str(text))
        target = real(path)
        sweep = sweep_dir_of(target)
        if sweep is not None:
            raise DestinationError(f"{key}={str(text)!r} is inside the sweep dir {sweep}, whose folders are its"
                                   " jobs'")
    except DestinationError as err:
        refused = str(err).split("; valid:", 1)[0]
        raise SettingError(f"{refused}{why}: an evaluation writes no file into a run but its test-set result, and"
                           f" none into data; valid: {EVAL_PROFILER_FOLDERS}") from None


def _check_checkpoint_callbacks(cfg: DictConfig) -> None:
    callbacks = cfg.get("callbacks")
    if not isinstance(callbacks, DictConfig):
        return
    plain = OmegaConf.to_container(callbacks, resolve=False)
    for name, filename in _CHECKPOINT_FILES.items():
        node = plain.get(name)
        if not isinstance(node, dict):
            continue
        dirpath = node.get("dirpath", _CHECKPOINT_DIR)
        if dirpath != _CHECKPOINT_DIR and not _is_run_checkpoint_dir(cfg, name):
            raise SettingError(f"callbacks.{name}.dirpath={dirpath} is not a setting: a run's checkpoints live in its"
                               f" own run dir ({_CHECKPOINT_DIR}); valid: leave it out (use run_name= or"
                               " paths.log_dir= to move the run)")
        if node.get("filename", filename) != filename:
            raise SettingError(f"callbacks.{name}.filename={node.get('filename')} is not a setting: the run, eval.py"
                               f" and the tables read checkpoints/{filename}.ckpt; valid: {filename}")
    for name, node in plain.items():  # any further callback that writes files (a ModelCheckpoint of one's own)
        if name in _CHECKPOINT_FILES or not isinstance(node, dict) or node.get("dirpath") is None:
            continue
        _check_inside_run_dir(cfg, name)
    best = plain.get("model_checkpoint")
    if isinstance(best, dict) and isinstance(best.get("monitor"), str):
        monitor, mode = best["monitor"], best.get("mode", "min")
        wanted = better(monitor)
        if wanted is not None and mode != wanted:
            raise SettingError(f"callbacks.model_checkpoint.mode={mode} would keep the worst {monitor} as best.ckpt;"
                               f" valid for monitor={monitor}: mode={wanted}")


# Which way is better for a metric, by a part of its name (the first that matches): the one home of that rule for
# every setting that ranks by a metric (the best checkpoint's mode, the optuna sweeper's direction).
BETTER: tuple[tuple[str, str], ...] = (("loss", "min"), ("top", "max"), ("AP", "max"))
# The sweeper's words for a mode
_DIRECTIONS = {"min": "minimize", "max": "maximize"}


def better(metric: str) -> str | None:
    """``"min"`` or ``"max"``: which way is better for ``metric`` (None: not known)."""
    return next((mode for part, mode in BETTER if part in metric), None)


def _check_sweeper_direction(cfg: DictConfig) -> None:
    """A sweeper that optimises (optuna: ``hydra.sweeper.direction``) must rank trials the way the objective is
    better: the objective is what train.py returns, the run's result (`HEADLINE_METRICS`, higher is better), so
    ``direction=minimize`` named the worst trial best. One objective: a list of directions is refused too."""
    from lifecycle.records import HEADLINE_METRICS

    sweeper = OmegaConf.select(cfg, "hydra.sweeper")
    if not isinstance(sweeper, DictConfig) or "direction" not in sweeper:
        return
    direction = sweeper.get("direction")
    given = [str(d).rsplit(".", 1)[-1] for d in (direction if isinstance(direction, ListConfig) else [direction])]
    modes = {better(m) for m in HEADLINE_METRICS}
    if len(modes) != 1 or None in modes:
        return  # no one way is better for every objective train.py may return
    wanted = _DIRECTIONS[modes.pop()]
    if given != [wanted]:
        shown, why = (given[0], "would rank the worst trial best") if len(given) == 1 else (
            f"[{','.join(given)}]", f"asks for {len(given)} objectives, train.py returns one")
        raise SettingError(f"hydra.sweeper.direction={shown} {why}: the objective is the run's result,"
                           f" {' or '.join(HEADLINE_METRICS)}, where {'higher' if wanted == 'maximize' else 'lower'}"
                           f" is better; valid: hydra.sweeper.direction={wanted}")


# Where a run's folder stands in for ``paths.output_dir`` while that is not known yet (the command line's check,
# before Hydra has made the run dir): a logger's folder must then lie under it, as under the real one.
RUN_DIR_STANDIN = "/<run dir>"
# The keys of a logger's node that name the folders it writes into, outermost first: ``save_dir`` (``dir``:
# W&B's other name for it), then, for folder loggers (csv, tensorboard), ``name``, ``version``, ``sub_dir``.
_LOGGER_FOLDER_KEYS = ("save_dir", "dir", "name", "version", "sub_dir")
_FOLDER_LOGGER_TARGETS = ("CSVLogger", "TensorBoardLogger")
_WANDB_TARGETS = ("WandbLogger", "wandb_logger")


def logger_folders(cfg: DictConfig, run_dir: str | None = None) -> Iterator[tuple[str, Any, str]]:
    """``(key, value, folder)`` for each folder each logger of ``cfg`` writes into, outermost first: ``key``
    (``logger.csv.name``) is the setting that puts its files in ``folder`` (absolute; normalised unless it
    is under `RUN_DIR_STANDIN`). ``run_dir``
    stands in for ``paths.output_dir`` where given or where that does not resolve (`RUN_DIR_STANDIN`). A
    value that does not resolve is skipped: the key checks report it."""
    import copy

    loggers = cfg.get("logger")
    if not isinstance(loggers, DictConfig):
        return
    try:
        output_dir = OmegaConf.select(cfg, "paths.output_dir", throw_on_resolution_failure=True)
    except OmegaConfBaseException:
        output_dir = None
    base = run_dir or (str(output_dir) if output_dir else RUN_DIR_STANDIN)
    probe = copy.deepcopy(cfg)
    OmegaConf.set_readonly(probe, False)
    OmegaConf.set_struct(probe, False)
    probe.paths = probe.get("paths") or {}
    probe.paths.output_dir = base
    for logger in loggers:
        node = probe.logger.get(logger)
        if not isinstance(node, DictConfig):
            continue
        target = str(node.get("_target_", ""))
        folder_logger = target.endswith(_FOLDER_LOGGER_TARGETS)
        folder = shown = None
        for part in _LOGGER_FOLDER_KEYS:
            if part not in node or (part in ("name", "version", "sub_dir") and not folder_logger):
                continue
            try:
                value = OmegaConf.select(probe, f"logger.{logger}.{part}", throw_on_resolution_failure=True)
            except OmegaConfBaseException:
                break
            if part == "version" and not isinstance(value, str):
                continue  # an int or null: Lightning's version_<N>, one plain folder down
            if value is None or value == "":
                continue
            shown = os.path.join(base if shown is None else shown, os.path.expanduser(str(value)))
            folder = os.path.normpath(shown)
            # the stand-in is shown unnormalised: "<run dir>/csv/../../escape" says more than "/escape"
            yield f"logger.{logger}.{part}", value, shown if base == RUN_DIR_STANDIN else folder
        if folder is None and target.endswith(_WANDB_TARGETS):
            yield f"logger.{logger}.save_dir", None, os.path.abspath(".")  # W&B's default: the working directory


def _check_logger_folders(cfg: DictConfig) -> None:
    """Every logger writes inside the run's own dir: a ``save_dir`` or ``name`` elsewhere wrote its log into
    another run's dir, or outside ``paths.log_dir``, where no rerun, cleanup or table looks. And never into one
    of the run's own records or folders (`OWN_ENTRIES`): a ``name``/``version`` of ``checkpoints``/``best.ckpt``
    made a folder where best.ckpt belongs, and the run failed only when it saved it."""
    from lifecycle.records import OWN_ENTRIES

    try:
        output_dir = OmegaConf.select(cfg, "paths.output_dir", throw_on_resolution_failure=True)
    except OmegaConfBaseException:
        output_dir = None
    run_dir = os.path.normpath(str(output_dir) if output_dir else RUN_DIR_STANDIN)
    for key, value, folder in logger_folders(cfg):
        inside = os.path.normpath(folder)
        shown = show(value) if value is not None else "<unset>"
        if inside != run_dir and not inside.startswith(run_dir.rstrip(os.sep) + os.sep):
            where = "the working directory" if value is None else folder
            raise SettingError(f"{key}={shown} puts the logger's files in {where}, outside the run's own dir; valid:"
                               " leave it at the run dir default (save_dir: ${paths.output_dir}, name: a plain"
                               " folder name)")
        top = os.path.relpath(inside, run_dir).split(os.sep)[0]
        if top in OWN_ENTRIES:
            where = "is" if inside == os.path.join(run_dir, top) else "lies in"
            raise SettingError(f"{key}={shown} puts the logger's files in {folder}, which {where} the run's own {top};"
                               " valid: a folder of its own, none of the run's records and folders"
                               f" ({', '.join(OWN_ENTRIES)})")


# Config nodes built by calling their ``_target_`` with their keys: a key the constructor does not take
# would otherwise fail deep inside Hydra's instantiate, naming the class rather than the key. (The model's
# nested settings, model.optimizer and model.scheduler, are checked by the module that reads them.)
CONSTRUCTED_NODES = ("data", "trainer", "model")
_PROJECT_TARGETS = ("data.", "models.", "lightning.pytorch.Trainer")


@cache
def declared_root_keys(config_name: str | None = None) -> frozenset[str]:
    """Root keys ``configs/<config_name>.yaml`` declares: its own keys, its config groups and the top-level keys
    of every ``@package _global_`` file in those groups (experiments, sweeps, debug). Each entry point reads
    only its own: eval.py's ``ckpt_path`` is nothing to train.py. ``None``: those of every entry point (a config
    composed for no script)."""
    from lifecycle.project import CONFIG_DIR, SCRIPTS, root_groups

    if config_name is None:
        return frozenset().union(*(declared_root_keys(name) for name in SCRIPTS))
    groups = root_groups(config_name)
    keys = set(groups)
    paths = [CONFIG_DIR / f"{config_name}.yaml", *(p for g in groups for p in sorted((CONFIG_DIR / g).rglob("*.yaml")))]
    for path in paths:
        text = path.read_text()
        if path.parent == CONFIG_DIR or "# @package _global_" in text.split("\n", 1)[0]:
            node = OmegaConf.create(text)
            if isinstance(node, DictConfig):
                keys.update(str(k) for k in node if k != "defaults")
    return frozenset(keys)


# What this entry point has in place of a root key of the other one (given to the wrong script, the key would
# be read by nothing): the refusal names whose key it is and this.
OTHER_SCRIPTS_KEYS = {
    "train": {
        "ckpt_path": "to resume a run, run its command again (the same run_name resumes from its"
                     " checkpoints/last.ckpt); to start from weights: model.weights=<reference-layout checkpoint>"
                     " (DETR models; train.py starts DeiT and Swin models from scratch)",
        "batch_size": "the training batch size is data.batch_size",
        "data_root": "the data folder is data.root",
        "throughput_batch": "train.py measures no throughput",
        "ape": "a model's absolute position embedding is model.net.ape",
    },
    "eval": {
        "seed": "eval.py draws nothing at random (the run's seed is in its config.yaml)",
        "run_name": "eval.py reads the run from ckpt_path=runs/<run>/checkpoints/<file>.ckpt",
        "resume": "eval.py trains nothing: it evaluates the checkpoint ckpt_path= names",
        "test_after_fit": "eval.py trains nothing: it evaluates the checkpoint ckpt_path= names",
    },
}


def _other_scripts_key(key: str, config_name: str) -> str | None:
    """The one-line refusal of ``key``, a root key of another entry point than ``config_name``'s, or None."""
    from lifecycle.project import SCRIPTS

    owner = next((name for name in SCRIPTS if name != config_name and key in declared_root_keys(name)), None)
    if owner is None or config_name not in SCRIPTS:
        return None
    hint = OTHER_SCRIPTS_KEYS.get(config_name, {}).get(key)
    return (f"{key} is a setting of {SCRIPTS[owner]}, not of {SCRIPTS[config_name]}, where nothing reads it"
            + (f"; {hint}" if hint else ""))


_REFERENCE = re.compile(r"\$\{\s*(?:oc\.select:\s*|oc\.env:\s*)?([A-Za-z_][A-Za-z0-9_]*)")


def _referenced_root_keys(cfg: DictConfig) -> set[str]:
    """The root keys an interpolation of ``cfg`` reads (``${key...}``, ``${oc.select:key...}``)."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str):
            found.update(_REFERENCE.findall(node))

    walk(OmegaConf.to_container(cfg, resolve=False))
    return found


def _check_root_keys(cfg: DictConfig, config_name: str | None = None) -> None:
    """A root key that neither ``config_name``'s root config (train, eval) declares nor an interpolation reads
    (``+lr=0.1`` meant as ``model.optimizer.lr``, eval.py's ``+ckpt_path=`` given to train.py) would be read by
    nothing: one line naming it, and whose key it is."""
    declared = declared_root_keys(config_name)
    unknown = [str(k) for k in cfg.keys() if str(k) not in declared and str(k) not in SKIPPED]
    if not unknown:
        return
    referenced = _referenced_root_keys(cfg)
    for key in unknown:
        if key in referenced:
            continue
        other = _other_scripts_key(key, config_name) if config_name is not None else None
        if other is not None:
            raise SettingError(other)
        valid = sorted(k for k in cfg.keys() if str(k) not in SKIPPED and str(k) != key)
        raise SettingError(f"{key} is not a setting: nothing reads a root key of that name (a value for a"
                           f" nested setting needs its full key, e.g. model.optimizer.lr); root keys:"
                           f" {', '.join(map(str, valid))}")


def _check_constructor_keys(cfg: DictConfig, node: str) -> None:
    import inspect

    section = cfg.get(node)
    target = section.get("_target_") if isinstance(section, DictConfig) else None
    if not isinstance(target, str) or not target.startswith(_PROJECT_TARGETS):
        return
    from hydra.utils import get_class

    try:
        parameters = inspect.signature(get_class(target).__init__).parameters
    except Exception:  # a target that does not import is reported by its own build, with its name
        return
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return
    valid = sorted(n for n, p in parameters.items() if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                                                 p.KEYWORD_ONLY))
    for key in section:
        if not str(key).startswith("_") and key not in valid:
            raise SettingError(f"{node}.{key} is not a setting of {target.rsplit('.', 1)[-1]}; valid keys of"
                               f" {node}: {', '.join(valid)}")
    for key, keys in getattr(get_class(target), "NESTED_SETTINGS", {}).items():
        nested = section.get(key)
        for name in nested if isinstance(nested, DictConfig) else ():
            if name not in keys:
                raise SettingError(f"{node}.{key}.{name} is not a setting; valid keys of"
                                   f" {node}.{key}: {', '.join(keys)}")


def check_schedule(cfg: DictConfig) -> None:
    """Refuse a training run that cannot train as configured, across keys: a schedule that trains nothing
    (the run could have no trained weights, so no result) or that the lr schedule cannot measure, an lr
    schedule below its own floor, a model built for another image size than the data's, training and validating
    on one split (`check_splits`), and (on the machine that runs the job) an accelerator it does not have or a
    strategy it cannot run (`check_devices`)."""
    trainer = cfg.get("trainer") or {}
    for key in ("max_epochs", "max_steps", "limit_train_batches"):
        if key in trainer and trainer.get(key) == 0:
            raise SettingError(f"trainer.{key}=0 trains nothing, so the run could have no result; "
                               "valid: a positive value (trainer.fast_dev_run=true for a smoke run)")
    keeps_last = keeps_last_epoch(cfg)
    if _get(trainer, "limit_val_batches") == 0 and not keeps_last:
        raise SettingError("trainer.limit_val_batches=0 never validates, so the run saves no best.ckpt and has no"
                           " result; valid: a positive value (a fraction of the val split, or a batch count), or"
                           f" {LAST_EPOCH_AS_BEST} (best.ckpt is then the last epoch)")
    for unit in ("epochs", "steps"):
        low, high = _get(trainer, f"min_{unit}"), _get(trainer, f"max_{unit}")
        if isinstance(low, int) and isinstance(high, int) and high > 0 and low > high:
            raise SettingError(f"trainer.min_{unit}={low} is more than trainer.max_{unit}={high}, which ends the run"
                               f" first; valid: trainer.min_{unit} <= {high}, or null")
    every, max_epochs = _get(trainer, "check_val_every_n_epoch"), _get(trainer, "max_epochs")
    if isinstance(every, int) and isinstance(max_epochs, int) and max_epochs > 0 and every > max_epochs \
            and not keeps_last:
        raise SettingError(f"trainer.check_val_every_n_epoch={every} with trainer.max_epochs={max_epochs} never"
                           " validates, so the run saves no best.ckpt and has no result; valid: an interval of at"
                           f" most {max_epochs} epochs, or {LAST_EPOCH_AS_BEST} (best.ckpt is then the last epoch)")
    if cfg.get("test_after_fit") and trainer.get("limit_test_batches") == 0:
        raise SettingError("trainer.limit_test_batches=0 tests nothing, so the run could have no result; "
                           "valid: a positive value, or test_after_fit=false (then eval.py tests best.ckpt)")
    if not _get(trainer, "fast_dev_run"):  # a smoke run saves no checkpoint and reads a few batches only
        _check_batch_fractions(cfg)
        _check_best_checkpoint(cfg)
        _check_validation_interval(cfg)
    model = cfg.get("model") or {}
    if "scheduler" in model and "optimizer" in model:  # models.classification.ClassificationModule
        _check_lr_schedule(cfg, trainer, model)
        _check_input_size(cfg, model)
    check_splits(cfg)
    if _runs_here(cfg):
        check_devices(cfg)


# ----------------------------------------------------------------------------- a run's batches and steps
# The config key of the split each stage's loader reads (the test reads the val split: no data module has a
# labelled test split), and its default
_STAGE_SPLIT = {"train": ("train_split", "train"), "val": ("val_split", "val"), "test": ("val_split", "val")}


def split_images(cfg: DictConfig, stage: str) -> tuple[int, str] | None:
    """``(images, setting)``: the images of the split the run's ``stage`` (train, val, test) reads and the setting
    that says so, where the config says: a generator's ``num_train``/``num_val`` for its ``train``/``val`` folder;
    None for data already on disk (counted only when the data module reads them)."""
    data = cfg.get("data") or {}
    key, default = _STAGE_SPLIT[stage]
    split = _get(data, key, default)
    generator = _get(data, "generator")
    if split not in ("train", "val") or not isinstance(generator, dict):
        return None
    count = generator.get(f"num_{split}")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return None
    return count, f"data.generator.num_{split}={count}"


def split_batches(cfg: DictConfig, stage: str) -> tuple[int, str] | None:
    """``(batches, how)``: the batches one device reads in one pass over ``stage``'s split before any trainer
    limit (training drops a last partial batch; each device reads its share), and how they come about; None
    where the split's size or the number of devices is not known here."""
    images = split_images(cfg, stage)
    batch, world = _get(cfg.get("data") or {}, "batch_size"), _world_size(cfg.get("trainer") or {})
    if images is None or world is None or not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        return None
    count, setting = images
    share = count // world if stage == "train" else math.ceil(count / world)
    batches = share // batch if stage == "train" else math.ceil(share / batch)
    devices = f" on each of {world} devices" if world > 1 else ""
    return batches, f"{setting} / data.batch_size={batch}{devices}"


def _limited(batches: int, limit: Any) -> int:
    """Lightning's ``limit_*_batches`` applied to ``batches``: a float is a fraction (rounded down), an int a
    count; null: all."""
    if isinstance(limit, float):
        return int(batches * limit)
    if isinstance(limit, int) and not isinstance(limit, bool):
        return min(batches, limit)
    return batches


def epoch_batches(cfg: DictConfig) -> tuple[int, str] | None:
    """``(batches, how)``: the training batches of one epoch on one device, ``trainer.limit_train_batches``
    applied; None where not known here (also with ``trainer.overfit_batches``, which replaces the split)."""
    trainer = cfg.get("trainer") or {}
    whole = split_batches(cfg, "train")
    if whole is None or _get(trainer, "overfit_batches"):
        return None
    batches, how = whole
    limit = _get(trainer, "limit_train_batches")
    if _limited(batches, limit) != batches:
        how = f"{how}, trainer.limit_train_batches={show(limit)}"
    return _limited(batches, limit), how


def run_steps(cfg: DictConfig, unit: str = "steps") -> tuple[int, str] | None:
    """``(count, how)``: at most how many optimizer ``steps`` (or training ``batches``) the run trains, by its
    length (`run_length`: ``trainer.max_steps``, or ``trainer.max_epochs`` epochs of `epoch_batches`); None where
    nothing bounds it here."""
    from lifecycle.identity import run_length

    length, trainer = run_length(cfg), cfg.get("trainer") or {}
    accumulate = _get(trainer, "accumulate_grad_batches", 1)
    if not isinstance(accumulate, int) or isinstance(accumulate, bool) or accumulate < 1:
        return None
    bounds = []
    max_steps, max_epochs = _plain(length["max_steps"]), _plain(length["max_epochs"])
    if isinstance(max_steps, int) and not isinstance(max_steps, bool) and max_steps > 0:
        bounds.append((max_steps * (accumulate if unit == "batches" else 1), f"trainer.max_steps={max_steps}"))
    epoch = epoch_batches(cfg)
    if epoch is not None and isinstance(max_epochs, int) and not isinstance(max_epochs, bool) and max_epochs > 0:
        batches, how = epoch
        per_epoch = batches if unit == "batches" else math.ceil(batches / accumulate)
        bounds.append((max_epochs * per_epoch, f"trainer.max_epochs={max_epochs} x {per_epoch} {unit}, from {how}"))
    return min(bounds) if bounds else None


def _check_batch_fractions(cfg: DictConfig) -> None:
    """A fraction ``trainer.limit_*_batches`` of a split that gives no whole batch: Lightning refuses it only when
    the loop reaches that split (``0.001 * 1 < 1``), after the run dir is made and, for validation, after training."""
    trainer = cfg.get("trainer") or {}
    for stage in ("train", "val", "test"):
        limit = _get(trainer, f"limit_{stage}_batches")
        if not isinstance(limit, float) or limit <= 0 or (stage == "test" and not cfg.get("test_after_fit")):
            continue
        whole = split_batches(cfg, stage)
        if whole is None or _limited(whole[0], limit) >= 1:
            continue
        batches, how = whole
        raise SettingError(f"trainer.limit_{stage}_batches={show(limit)} of the {batches} {stage} batches ({how}) is"
                           f" {batches} x {show(limit)} < 1 batch, no batch at all; valid: a fraction >="
                           f" {1 / batches:.4g}, a number of batches (an integer >= 1), or null (all)")


# What makes best.ckpt, the run's result: its default settings are one file, the best validation so far
_BEST = "callbacks.model_checkpoint"
# Entries of the callbacks a run cannot leave out (``~callbacks.model_checkpoint``: no best.ckpt, no result)
REQUIRED_ENTRIES = (_BEST,)


def _check_best_checkpoint(cfg: DictConfig) -> None:
    """``best.ckpt`` is the run's result (tested after fit, read by eval.py and the tables): settings of
    ``callbacks.model_checkpoint`` under which it is never saved, or is not the best one, are refused here, not
    found after the whole run trained."""
    callbacks = cfg.get("callbacks")
    node = callbacks.get("model_checkpoint") if isinstance(callbacks, DictConfig) else None
    if not isinstance(node, DictConfig):
        raise SettingError(f"{_BEST} is not set (removed by ~{_BEST} or set to null), so the run saves no"
                           " best.ckpt and has no result; valid: keep it (configs/callbacks/default.yaml's)")
    top_k, monitor = _get(node, "save_top_k", 1), _get(node, "monitor")
    if top_k == 0:
        raise SettingError(f"{_BEST}.save_top_k=0 keeps no checkpoint, so the run saves no best.ckpt and has no"
                           f" result; valid: {_BEST}.save_top_k=1 (the default)")
    if top_k != 1:
        kept = "every checkpoint" if top_k == -1 else f"{show(top_k)} checkpoints"
        raise SettingError(f"{_BEST}.save_top_k={show(top_k)} keeps {kept} under one name, best.ckpt, so each save"
                           f" overwrites it{', also with a worse one' if monitor is not None else ''}: best.ckpt"
                           f" would be the last one saved, not the best; valid: {_BEST}.save_top_k=1 (the default)")
    if _get(node, "train_time_interval") is not None:
        return  # saves by wall-clock time: how many, the run's speed decides
    epochs, steps = _get(node, "every_n_epochs"), _get(node, "every_n_train_steps")
    given = " ".join(f"{_BEST}.{k}={show(v)}" for k, v in (("every_n_epochs", epochs), ("every_n_train_steps", steps))
                     if v is not None)
    if epochs is None and steps is None:
        epochs = 1  # Lightning's default: a save after each validation
    epochs, steps = epochs or 0, steps or 0  # Lightning's reading: a trigger left unset beside another is off
    if not (_is_number(epochs) and _is_number(steps)):
        return  # a value check_settings refuses
    max_epochs = _plain(_get(cfg.get("trainer") or {}, "max_epochs"))
    run = run_steps(cfg)
    if steps >= 1 and (run is None or steps <= run[0]):
        return
    if epochs >= 1 and not (isinstance(max_epochs, int) and 0 < max_epochs < epochs):
        return
    if steps >= 1 and run is not None:
        raise SettingError(f"{_BEST}.every_n_train_steps={steps} is more than the run's {run[0]} training steps"
                           f" ({run[1]}), so best.ckpt is never saved and the run has no result; valid: at most"
                           f" {run[0]}, or leave it unset (a save after each validation)")
    if epochs >= 1:
        raise SettingError(f"{_BEST}.every_n_epochs={epochs} with trainer.max_epochs={max_epochs} never saves"
                           f" best.ckpt, so the run has no result; valid: at most {max_epochs} (1, the default)")
    raise SettingError(f"{given} never saves best.ckpt (Lightning saves every n epochs or steps only for an n >= 1),"
                       f" so the run has no result; valid: {_BEST}.every_n_epochs=1 (the default)")


def _check_validation_interval(cfg: DictConfig) -> None:
    """An integer ``trainer.val_check_interval`` (training batches between validations) the run never reaches:
    over the whole run (``check_val_every_n_epoch=null``) it never validates, so it saves no best.ckpt; within an
    epoch Lightning refuses one above the epoch's batches, but only when the run starts."""
    trainer = cfg.get("trainer") or {}
    interval = _get(trainer, "val_check_interval")
    if not isinstance(interval, int) or isinstance(interval, bool):
        return
    if _get(trainer, "check_val_every_n_epoch") is None:
        run = run_steps(cfg, "batches")
        if run is not None and interval > run[0] and not keeps_last_epoch(cfg):
            raise SettingError(f"trainer.val_check_interval={interval} with trainer.check_val_every_n_epoch=null"
                               f" validates after every {interval} training batches, more than the run's {run[0]}"
                               f" ({run[1]}), so it never validates, saves no best.ckpt and has no result; valid:"
                               f" at most {run[0]}, a fraction of an epoch, or {LAST_EPOCH_AS_BEST}")
        return
    epoch = epoch_batches(cfg)
    if epoch is not None and interval > epoch[0]:
        raise SettingError(f"trainer.val_check_interval={interval} is more than an epoch's {epoch[0]} training"
                           f" batches ({epoch[1]}), which Lightning refuses when the run starts; valid: at most"
                           f" {epoch[0]}, a fraction of an epoch, or trainer.check_val_every_n_epoch=null (an"
                           " interval over the whole run)")


# The model_checkpoint settings that make best.ckpt the last epoch's weights, saved at each epoch's end
# whether or not the run validates: a recipe whose result is its last epoch needs no validation pass.
LAST_EPOCH_AS_BEST = "callbacks.model_checkpoint.monitor=null +callbacks.model_checkpoint.save_on_train_epoch_end=true"


def keeps_last_epoch(cfg: DictConfig) -> bool:
    """Whether best.ckpt is saved at every training epoch's end without a monitored metric (so it is the last
    epoch's weights, and the run needs no validation to have a result)."""
    node = (cfg.get("callbacks") or {}).get("model_checkpoint")
    return node is not None and _get(node, "monitor") is None and _get(node, "save_on_train_epoch_end") is True


def schedule_notes(cfg: DictConfig) -> list[str]:
    """Settings that are valid but rarely meant, said once when a run starts: no epoch limit (Lightning's 1000),
    a warm-up longer than the run (the lr rises to the end and never reaches its peak)."""
    trainer, model = cfg.get("trainer") or {}, cfg.get("model") or {}
    warmup = _get(model.get("scheduler"), "warmup_epochs", 0)
    max_epochs = _get(trainer, "max_epochs")
    notes = []
    if max_epochs is None and _get(trainer, "max_steps", -1) in (None, -1) and _get(trainer, "max_time") is None:
        notes.append("trainer.max_epochs is not set: the run trains for Lightning's default of 1000 epochs")
    if _is_number(warmup) and isinstance(max_epochs, int) and 0 < max_epochs < warmup:
        notes.append(f"model.scheduler.warmup_epochs={show(warmup, True)} is longer than trainer.max_epochs="
                     f"{max_epochs}: the lr rises for the whole run and never reaches its peak")
    return notes


def _get(node: Any, key: str, default: Any = None) -> Any:
    try:
        value = node.get(key, default) if node is not None else default
    except OmegaConfBaseException:  # an interpolation that cannot be resolved here: left to instantiation
        return default
    return _plain(value)


def _unlimited_epochs(trainer: Any) -> str | None:
    """How the run gets no epoch limit (Lightning's rule: max_epochs=-1, or null with a step or time limit)."""
    max_epochs = _get(trainer, "max_epochs")
    if max_epochs == -1:
        return "trainer.max_epochs=-1 (unlimited)"
    if max_epochs is None and _get(trainer, "max_steps", -1) != -1:
        return f"trainer.max_epochs=null (unlimited with trainer.max_steps={show(_get(trainer, 'max_steps'))})"
    if max_epochs is None and _get(trainer, "max_time") is not None:
        return "trainer.max_epochs=null (unlimited with trainer.max_time set)"
    return None


def _world_size(trainer: Any) -> int | None:
    """Processes in the run when the config says (devices -1 and 'auto' depend on the machine: None)."""
    devices, nodes = _get(trainer, "devices", 1), _get(trainer, "num_nodes", 1)
    if isinstance(devices, str) and re.fullmatch(r"\d+", devices.strip()):
        devices = int(devices)
    elif isinstance(devices, str) and "," in devices:
        devices = len([d for d in devices.split(",") if d.strip()])
    elif isinstance(devices, list):
        devices = len(devices)
    if not (_is_number(devices) and devices >= 1 and _is_number(nodes) and nodes >= 1):
        return None
    return int(devices) * int(nodes)


def _check_lr_schedule(cfg: DictConfig, trainer: Any, model: Any) -> None:
    """models.classification: a per-step cosine schedule over Lightning's estimated_stepping_batches, with
    ``warmup_epochs`` of ``total steps / max_epochs`` steps each, from ``warmup_lr`` to the batch-scaled lr
    and down to ``min_lr`` (the module's defaults where a key is absent)."""
    sched, opt = model.get("scheduler") or {}, model.get("optimizer") or {}
    if not _get(trainer, "fast_dev_run", False):  # a smoke run has a fixed number of steps
        unlimited = _unlimited_epochs(trainer)
        if unlimited and _get(trainer, "max_steps", -1) == -1:
            raise SettingError(f"{unlimited} with trainer.max_steps=-1 gives the cosine lr schedule (model.scheduler) "
                               "no length; valid: trainer.max_epochs an integer >= 1, or trainer.max_steps an integer "
                               ">= 1")
        warmup = _get(sched, "warmup_epochs", 0)
        if unlimited and _is_number(warmup) and warmup > 0:
            raise SettingError(f"model.scheduler.warmup_epochs={show(warmup, True)} needs an epoch count (an epoch "
                               f"of the warm-up is total steps / max_epochs), but {unlimited}; valid: "
                               "trainer.max_epochs an integer >= 1, or model.scheduler.warmup_epochs=0")
    lr, base = _get(opt, "lr", 5e-4), _get(opt, "lr_base_batch", 512)
    batch, accumulate = _get(cfg.get("data"), "batch_size"), _get(trainer, "accumulate_grad_batches", 1)
    world = _world_size(trainer)
    if world is None or not all(_is_number(v) and v > 0 for v in (lr, base, batch, accumulate)):
        return  # the peak lr depends on the machine (devices=auto/-1) or a value check_settings refuses
    total = batch * accumulate * world
    peak = lr * total / base
    for key, default in (("min_lr", 1e-5), ("warmup_lr", 1e-6)):
        value = _get(sched, key, default)
        if _is_number(value) and value > peak:
            raise SettingError(
                f"model.scheduler.{key}={show(value, True)} must be <= the peak lr, model.optimizer.lr={show(lr, True)}"
                f" x total batch {total} / model.optimizer.lr_base_batch={base} = {peak:g}")


def _check_input_size(cfg: DictConfig, model: Any) -> None:
    net = model.get("net") or {}
    size, data_size = _get(net, "img_size"), _get(cfg.get("data"), "img_size")
    if _get(net, "dynamic_img_size", False) or not (_is_number(size) and _is_number(data_size)):
        return
    if size != data_size:
        raise SettingError(f"model.net.img_size={show(size)} must equal data.img_size={show(data_size)}: the model is "
                           f"built for the data's image size (valid: model.net.img_size={show(data_size)}, its default "
                           "${data.img_size})")


def _runs_here(cfg: DictConfig) -> bool:
    """Whether the job runs on this machine: not when a composed config's Hydra launcher submits it elsewhere
    (SLURM); the job checks its devices again when it starts there."""
    target = OmegaConf.select(cfg, "hydra.launcher._target_", default=None, throw_on_resolution_failure=False)
    return target is None or str(target).endswith("BasicLauncher")


_GPU_KINDS = {"gpu": ("cuda", "mps"), "cuda": ("cuda",), "mps": ("mps",), "tpu": ("tpu",)}
_NOUNS = {"gpu": "GPU", "cuda": "CUDA GPU", "mps": "Apple MPS GPU", "tpu": "TPU"}


def _available(kind: str) -> int:
    """Devices of Lightning's accelerator ``kind`` that this machine has (0: none)."""
    from lightning.pytorch.accelerators import AcceleratorRegistry

    accelerator = AcceleratorRegistry[kind]["accelerator"]
    try:
        return accelerator.auto_device_count() if accelerator.is_available() else 0
    except Exception:  # noqa: BLE001  (a backend that cannot even be asked is not available)
        return 0


def check_devices(cfg: DictConfig) -> None:
    """Refuse ``trainer.accelerator`` (and an integer ``trainer.devices``) that this machine does not have, and
    a ``trainer.strategy`` its accelerator cannot run (`check_strategy`)."""
    _check_accelerator(cfg)
    check_strategy(cfg)


def _check_accelerator(cfg: DictConfig) -> None:
    trainer = cfg.get("trainer") or {}
    accelerator = _get(trainer, "accelerator", "auto")
    if accelerator in ("cpu", "auto") and _accelerator_here(accelerator) == "cpu":
        _check_cpu_devices(accelerator, _get(trainer, "devices", "auto"))
    if accelerator not in _GPU_KINDS:  # cpu, auto (Lightning picks what there is), or a value check_settings refuses
        return
    counts = {kind: _available(kind) for kind in _GPU_KINDS[accelerator]}
    count = max(counts.values())
    noun = _NOUNS[accelerator]
    if count == 0:
        here = [k for k in ("cuda", "mps", "tpu") if k not in counts and _available(k)]
        valid = " or ".join(["cpu", *here])
        raise SettingError(f"trainer.accelerator={accelerator} needs a {noun}, but none is visible on this machine; "
                           f"valid here: trainer.accelerator={valid} (trainer=cpu)")
    devices = _get(trainer, "devices", "auto")
    if isinstance(devices, list):
        devices = len(devices)
    if _is_number(devices) and devices > count:
        raise SettingError(f"trainer.devices={devices} with trainer.accelerator={accelerator}: this machine has "
                           f"{count} {noun}{'s' if count > 1 else ''}; valid here: an integer >= 1 and <= {count}, "
                           "-1 or 'auto' (all)")


def _check_cpu_devices(accelerator: str, devices: Any) -> None:
    """On the CPU Lightning takes a process count only (an integer >= 1, the same as a digit string, or 'auto');
    device ids ('0', [0], '0,1') and -1 are GPU forms it refuses when the Trainer is built, after the run dir."""
    count = int(devices) if isinstance(devices, str) and devices.strip().isdigit() else devices
    if devices == "auto" or (isinstance(count, int) and not isinstance(count, bool) and count >= 1):
        return
    on = "" if accelerator == "cpu" else " (on this machine: cpu)"
    raise SettingError(f"trainer.devices={show(devices)} with trainer.accelerator={accelerator}{on} is a GPU form "
                       "(device ids, or -1: all); on the CPU it counts processes: valid: an integer >= 1 or 'auto'")


# Lightning's strategies that run on one kind of accelerator only (its _AcceleratorConnector refuses them, but
# only when the Trainer is built, after the run dir is made)
_STRATEGY_NEEDS = {"fsdp": "cuda", "fsdp_cpu_offload": "cuda", "xla": "tpu", "xla_debug": "tpu",
                   "single_xla": "tpu", "single_tpu": "tpu"}


def _accelerator_here(accelerator: Any) -> str:
    """The accelerator Lightning would pick for ``trainer.accelerator`` on this machine (its 'auto' order)."""
    if accelerator == "auto":
        return next((k for k in ("tpu", "cuda", "mps") if _available(k)), "cpu")
    if accelerator == "gpu":
        return next((k for k in ("cuda", "mps") if _available(k)), "gpu")
    return str(accelerator)


def check_strategy(cfg: DictConfig) -> None:
    """Refuse a ``trainer.strategy`` name Lightning does not have, or one this machine's accelerator cannot run
    (``fsdp`` on the CPU), without building anything: Lightning says so only when the Trainer is built."""
    trainer = cfg.get("trainer") or {}
    strategy = _get(trainer, "strategy", "auto")
    if not isinstance(strategy, str) or strategy == "auto":
        return  # a mapping (a strategy object's settings) is checked by its constructor
    from lightning.pytorch.strategies import StrategyRegistry

    names = StrategyRegistry.available_strategies()
    if strategy not in names:
        raise SettingError(f"trainer.strategy={strategy} is not a Lightning strategy; valid: auto, {', '.join(names)}")
    needs = _STRATEGY_NEEDS.get(strategy)
    accelerator = _get(trainer, "accelerator", "auto")
    here = _accelerator_here(accelerator)
    if needs is not None and here != needs:
        runs_on = "" if here == accelerator else f" (on this machine: {here})"
        raise SettingError(f"trainer.strategy={strategy} needs a {_NOUNS[needs]}, but the run has"
                           f" trainer.accelerator={accelerator}{runs_on}; valid here:"
                           " trainer.strategy=auto or ddp (trainer=ddp_cpu: DDP processes on the CPU)")
    if strategy.startswith("deepspeed"):
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:
            raise SettingError(f"trainer.strategy={strategy} needs the deepspeed package, which is not installed;"
                               " valid here: trainer.strategy=auto or ddp (or pip install deepspeed)")


# Lightning's accelerators that name one kind of device (auto and gpu depend on the machine)
_DEVICE_KINDS = ("cpu", "cuda", "mps", "tpu")


def run_device(cfg: DictConfig) -> str | None:
    """The kind of device (`_DEVICE_KINDS`) the run's Trainer puts the model on; None where this machine cannot
    tell (``auto`` or ``gpu`` in a job that a launcher runs elsewhere, or a GPU this machine lacks)."""
    accelerator = _get(cfg.get("trainer") or {}, "accelerator", "auto")
    if accelerator in _DEVICE_KINDS:
        return str(accelerator)
    if not isinstance(accelerator, str) or not _runs_here(cfg):
        return None
    here = _accelerator_here(accelerator)
    return here if here in _DEVICE_KINDS else None


def check_backend_devices(cfg: DictConfig, model: Any, training: bool, device: str | None = None,
                          where: str | None = None) -> None:
    """Refuse an attention backend of ``model`` (``rpe.backend``) that the device it runs on cannot run, to train
    (``training``) or to evaluate, by `rpe.config.BACKEND_DEVICES` (``flex`` or ``triton`` on the CPU), in one line
    naming the backend, the accelerator and the backends that run there. Without a build nothing says so
    before the first forward, after the run dir is made. ``device`` and ``where`` (how it is chosen): a device
    other than the run's Trainer's (eval.py measures on the CPU)."""
    from rpe.attention import attention_backends
    from rpe.config import check_backend_device

    if device is None:
        device = run_device(cfg)
        accelerator = _get(cfg.get("trainer") or {}, "accelerator", "auto")
        here = "" if accelerator == device else f" (on this machine: {device})"
        where = f"trainer.accelerator={accelerator}{here}"
    if device is None:
        return
    for backend in sorted(attention_backends(model)):
        check_backend_device(backend, device, training, where)


def configured_world_size(cfg: DictConfig) -> int | None:
    """Processes the run trains in, when its trainer config says (None where the machine decides)."""
    return _world_size(cfg.get("trainer") or {})


def check_splits(cfg: DictConfig) -> None:
    """Refuse training and validating on the same images: best.ckpt would be picked, and its result tested, on
    the images it trained on, so the number would measure training accuracy under a result's name."""
    data = cfg.get("data") or {}
    train, val = _get(data, "train_split"), _get(data, "val_split")
    if not isinstance(train, str) or not isinstance(val, str):
        return  # a data module without these splits (COCO)
    same = os.path.normpath(train) == os.path.normpath(val)
    root = _get(data, "root")
    if not same and isinstance(root, str):
        try:  # two names of one folder (a link)
            same = os.path.samefile(os.path.join(root, train), os.path.join(root, val))
        except OSError:
            pass
        if same:
            linked = next((split for split in (val, train) if os.path.islink(os.path.join(root, split))), val)
            raise DataSettingError(
                f"data.root={root}: {linked}/ is a link to {os.path.realpath(os.path.join(root, linked))}, the same"
                f" folder as {train if linked == val else val}/: best.ckpt would be picked and tested on the images"
                " it trained on; valid: a val split of images of its own")
    if same:
        raise DataSettingError(f"data.train_split={train} and data.val_split={val} are the same images: best.ckpt"
                               " would be picked and tested on the images it trained on, so its val/top1 would"
                               " measure training accuracy, not a result; valid: two different splits (e.g."
                               " data.train_split=train data.val_split=val)")
