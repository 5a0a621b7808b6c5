"""`lifecycle.settings.check_settings`: the real configs pass, every bad value is one line naming its key."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import pytest
from annotated_types import Ge, Gt, Interval, Le, Lt
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, ListConfig, OmegaConf
from pydantic import Field, StrictInt, StrictStr

from data.errors import DataConfigError
from lifecycle.settings import (
    SCHEMA,
    SETTINGS,
    DataSettingError,
    PositiveInt,
    Real,
    Setting,
    SettingError,
    check_settings,
    describe,
    setting_for,
)
from rpe.config import RPEConfig, RPEConfigError, parse_shorthand, resolve_rpe
from tests.helpers import CONFIG_DIR, compose_config, swept_job_configs


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def _compose(tmp_path: Path, overrides: list[str], config_name: str = "train") -> DictConfig:
    return compose_config(overrides, tmp_path / "run", tmp_path / "data", config_name=config_name)


@pytest.fixture(scope="module")
def composed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, DictConfig]:
    """The default config and the DETR one, composed once; each case below applies its override to a copy."""
    tmp = tmp_path_factory.mktemp("settings")
    return {name: _compose(tmp / name, overrides) for name, overrides in
            (("default", []), ("detr", ["experiment=detr_shapes"]))}


def _with(cfg: DictConfig, override: str) -> DictConfig:
    """``cfg`` with one command-line override (``key=value`` or ``+key=value``), typed as Hydra types it."""
    parsed = OverridesParser.create().parse_overrides([override])[0]
    job = copy.deepcopy(cfg)
    OmegaConf.update(job, parsed.key_or_group, parsed.value(), merge=False, force_add=override.startswith("+"))
    return job


def _group_overrides(group: str, option: str) -> list[str]:
    overrides = [f"{group}={option}"]
    if group == "data" and "coco" in option:  # detection data goes with a detection model and vice versa
        overrides.append("model=detr_small")
    if group == "model" and option.startswith("detr"):
        overrides.append("data=shapes_coco")
    return overrides


REAL_CONFIGS = (
    [("train", [])]
    + [("train", [f"experiment={name}"]) for name in _options("experiment")]
    + [("train", _group_overrides(group, option))
       for group in ("model", "data", "rpe", "trainer", "callbacks", "logger", "debug") for option in _options(group)]
    + [("eval", [])]
)


def _numeric_leaves(node: DictConfig | ListConfig, prefix: str = "") -> Iterator[str]:
    keys = list(node.keys()) if isinstance(node, DictConfig) else range(len(node))
    for key in keys:
        path = f"{prefix}.{key}" if prefix else str(key)
        if OmegaConf.is_missing(node, key):
            continue
        value = node[key]
        if isinstance(value, (DictConfig, ListConfig)):
            yield from _numeric_leaves(value, path)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield path


@pytest.mark.parametrize("config_name,overrides", REAL_CONFIGS, ids=lambda x: " ".join(x) if isinstance(x, list) else x)
def test_real_configs_pass_and_every_number_has_a_rule(config_name: str, overrides: list[str], tmp_path: Path) -> None:
    """The rules are not too strict for any shipped config, and each number in it (a list item counts for its
    list) is range-checked, not only nan-checked."""
    cfg = _compose(tmp_path, overrides, config_name)
    check_settings(cfg)
    uncovered = []
    for key in _numeric_leaves(cfg):
        parts = key.split(".")
        if not any(setting_for(".".join(parts[:n])) for n in range(len(parts), 0, -1)):
            uncovered.append(key)
    assert not uncovered


@pytest.mark.parametrize("sweep", _options("sweep"))
def test_every_sweep_value_passes(sweep: str, tmp_path: Path) -> None:
    """Each value of each swept key (rpe.ratio, seeds, table rows that set lr_drop and max_epochs) passes."""
    cfg = _compose(tmp_path, [f"sweep={sweep}"])
    check_settings(cfg)
    params = HydraConfig.get().sweeper.params or {}
    checked = 0
    for job in swept_job_configs(cfg):
        check_settings(job)
        checked += 1
    assert checked >= len(params)


# (override, the whole one-line message)
BAD = [
    ("data.batch_size=-4", "data.batch_size=-4 must be an integer >= 1"),
    ("data.batch_size=0", "data.batch_size=0 must be an integer >= 1"),
    ("data.batch_size=2.5", "data.batch_size=2.5 must be an integer >= 1"),
    ("data.batch_size='8'", "data.batch_size='8' must be an integer >= 1"),
    ("data.batch_size=null", "data.batch_size=null must be an integer >= 1"),
    ("data.num_workers=-1", "data.num_workers=-1 must be an integer >= 0"),
    ("data.mean=[0.5,0.5]", "data.mean=[0.5, 0.5] must be a list of 3 values, each >= 0 and <= 1"),
    ("data.std=[0.5,0,0.5]", "data.std=[0.5, 0.0, 0.5] must be a list of 3 values, each > 0"),
    ("data.std=[0.5,nan,0.5]", "data.std=[0.5, nan, 0.5] must be a finite number; valid: a list of 3 values, each > 0"),
    ("data.eval_crop_pct=0", "data.eval_crop_pct=0.0 must be > 0 and <= 1"),
    ("data.generator.boundary_margin_deg=22.5",
     "data.generator.boundary_margin_deg=22.5 must be >= 0 and < 22.5"),
    ("data.generator.noise_max=200", "data.generator.noise_max=200 must be an integer >= 1 and <= 130"),
    ("data.generator.seed=-1", "data.generator.seed=-1 must be an integer >= 0 and <= 4294967295"),
    ("model.label_smoothing=1.5", "model.label_smoothing=1.5 must be >= 0 and <= 1"),
    ("model.ema_decay=1.5", "model.ema_decay=1.5 must be > 0 and < 1 or null (no EMA)"),
    ("model.ema_decay=0", "model.ema_decay=0.0 must be > 0 and < 1 or null (no EMA)"),
    ("model.optimizer.lr=inf", "model.optimizer.lr=inf must be a finite number; valid: > 0"),
    ("model.optimizer.lr=-1", "model.optimizer.lr=-1.0 must be > 0"),
    ("model.optimizer.lr=nan", "model.optimizer.lr=nan must be a finite number; valid: > 0"),
    ("model.optimizer.lr_base_batch=0", "model.optimizer.lr_base_batch=0 must be an integer >= 1"),
    ("model.optimizer.weight_decay=-0.1", "model.optimizer.weight_decay=-0.1 must be >= 0"),
    ("model.optimizer.betas=[0.9,1.0]",
     "model.optimizer.betas=[0.9, 1.0] must be a list of 2 values, each >= 0 and < 1"),
    ("model.scheduler.warmup_epochs=-1", "model.scheduler.warmup_epochs=-1.0 must be >= 0"),
    ("model.net.drop_path_rate=1.0", "model.net.drop_path_rate=1.0 must be >= 0 and < 1"),
    ("rpe.ratio=0", "rpe.ratio=0.0 must be > 0 and <= 100 or null (the preset's value)"),
    ("rpe.ratio=-1", "rpe.ratio=-1.0 must be > 0 and <= 100 or null (the preset's value)"),
    ("rpe.ratio=1e9", "rpe.ratio=1000000000.0 must be > 0 and <= 100 or null (the preset's value)"),
    ("rpe.ratio=nan",
     "rpe.ratio=nan must be a finite number; valid: > 0 and <= 100 or null (the preset's value)"),
    ("rpe.window=0", "rpe.window=0 must be an integer >= 1 or null (the preset's value)"),
    ("rpe.theta=inf", "rpe.theta=inf must be a finite number; valid: > 0 or null (the preset's value)"),
    ("trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches=0 must be an integer >= 1"),
    ("trainer.max_epochs=-2",
     "trainer.max_epochs=-2 must be -1 (unlimited), an integer >= 1 or null (Lightning's default)"),
    ("trainer.max_epochs=0",
     "trainer.max_epochs=0 must be -1 (unlimited), an integer >= 1 or null (Lightning's default)"),
    ("trainer.max_steps=0", "trainer.max_steps=0 must be -1 (unlimited) or an integer >= 1"),
    *((f"trainer.max_time={value}", f"trainer.max_time={shown} must be a duration 'DD:HH:MM:SS' longer than 0, a"
       " mapping of datetime.timedelta arguments, each >= 0 and not all 0 or null (no limit)")
      for value, shown in (("{minutes:-5}", "{minutes: -5}"), ("{hours:0,minutes:0}", "{hours: 0, minutes: 0}"),
                           ("00:00:00:00", "'00:00:00:00'"), ("{minutes:nan}", "{minutes: nan}"))),
    ("trainer.max_time={mins:5}", "trainer.max_time.mins=5 is not an argument of datetime.timedelta; valid keys of"
     " trainer.max_time: weeks, days, hours, minutes, seconds, milliseconds, microseconds"),
    ("trainer.limit_train_batches=1.5",
     "trainer.limit_train_batches=1.5 must be an integer >= 0 (batches), a fraction >= 0 and <= 1 or null "
     "(all batches)"),
    ("trainer.limit_val_batches=-1",
     "trainer.limit_val_batches=-1 must be an integer >= 0 (batches), a fraction >= 0 and <= 1 or null (all batches)"),
    ("trainer.val_check_interval=0", "trainer.val_check_interval=0 must be an integer >= 1 (batches), a fraction "
     "> 0 and <= 1, a duration 'DD:HH:MM:SS' longer than 0, a mapping of datetime.timedelta arguments, each >= 0"
     " and not all 0 or null (once per epoch)"),
    ("trainer.val_check_interval=1.5", "trainer.val_check_interval=1.5 must be an integer >= 1 (batches), a "
     "fraction > 0 and <= 1, a duration 'DD:HH:MM:SS' longer than 0, a mapping of datetime.timedelta arguments,"
     " each >= 0 and not all 0 or null (once per epoch)"),
    ("trainer.gradient_clip_val=-1", "trainer.gradient_clip_val=-1.0 must be >= 0 or null (no clipping)"),
    ("trainer.log_every_n_steps=-1",
     "trainer.log_every_n_steps=-1 must be an integer >= 0 (0: no step logging) or null (Lightning's default)"),
    ("trainer.devices=0", "trainer.devices=0 must be an integer >= 1, -1 (all), 'auto', a list of 1 or more values, "
     "each an integer >= 0 or a string of device ids such as '0,1'"),
    ("trainer.num_nodes=0", "trainer.num_nodes=0 must be an integer >= 1"),
    ("trainer.precision=16.0", "trainer.precision=16.0 must be 16, 32 or 64 or a precision name such as "
     "'32-true' or 'bf16-mixed'"),
    ("trainer.deterministic=2", "trainer.deterministic=2 must be true or false, 'warn' or null (Lightning's default)"),
    ("seed=-1", "seed=-1 must be an integer >= 0 and <= 4294967295"),
    ("seed=1.5", "seed=1.5 must be an integer >= 0 and <= 4294967295"),
    ("callbacks.progress_bar.refresh_rate=-1",
     "callbacks.progress_bar.refresh_rate=-1 must be an integer >= 0 (0: off)"),
    ("callbacks.last_checkpoint.every_n_train_steps=0",
     "callbacks.last_checkpoint.every_n_train_steps=0 must be an integer >= 1 or null (at epoch ends only)"),
    ("+callbacks.model_checkpoint.save_top_k=-2",
     "callbacks.model_checkpoint.save_top_k=-2 must be -1 (all) or an integer >= 0"),
    # a key without a rule is still refused when not finite, anywhere in the config
    ("+model.net.layer_scale=inf", "model.net.layer_scale=inf must be a finite number"),
    ("+data.extra=[1.0,-inf]", "data.extra.1=-inf must be a finite number"),
]


def _assert_refused(cfg: DictConfig, message: str) -> None:
    with pytest.raises(SettingError) as info:
        check_settings(cfg)
    assert str(info.value) == message
    assert "\n" not in str(info.value)
    key = message.split("=", 1)[0]
    assert isinstance(info.value, DataConfigError) == key.startswith("data.")


@pytest.mark.parametrize("override,message", BAD, ids=[b[0] for b in BAD])
def test_bad_value_is_one_line_naming_the_key(override: str, message: str, composed: dict[str, DictConfig]) -> None:
    _assert_refused(_with(composed["default"], override), message)


DETR_BAD = [
    ("model.num_queries=0", "model.num_queries=0 must be an integer >= 1"),
    ("model.dec_layers=0", "model.dec_layers=0 must be an integer >= 1"),
    ("model.eos_coef=1.5", "model.eos_coef=1.5 must be >= 0 and <= 1"),
    ("model.set_cost_bbox=-5", "model.set_cost_bbox=-5.0 must be >= 0"),
    ("model.giou_loss_coef=nan", "model.giou_loss_coef=nan must be a finite number; valid: >= 0"),
    ("model.lr_drop=0", "model.lr_drop=0 must be an integer >= 1"),
    ("model.dropout=1", "model.dropout=1.0 must be >= 0 and < 1"),
    ("data.crop_size=[384]", "data.crop_size=[384] must be a list of 2 values, each an integer >= 1"),
    ("data.train_scales=[]", "data.train_scales=[] must be a list of 1 or more values, each an integer >= 1"),
    ("data.generator.max_overlap=2", "data.generator.max_overlap=2.0 must be >= 0 and <= 1"),
]


@pytest.mark.parametrize("override,message", DETR_BAD, ids=[b[0] for b in DETR_BAD])
def test_bad_detr_value_is_one_line_naming_the_key(
    override: str, message: str, composed: dict[str, DictConfig]
) -> None:
    _assert_refused(_with(composed["detr"], override), message)


GOOD = [
    # the several forms Lightning accepts stay valid
    "trainer.devices=auto", "trainer.devices=2", "trainer.devices='2'",
    "trainer.limit_train_batches=3", "trainer.limit_train_batches=0.25", "trainer.limit_train_batches=1.0",
    "trainer.limit_val_batches=0", "trainer.limit_train_batches=null",
    "trainer.max_steps=-1", "trainer.max_steps=100", "trainer.max_epochs=-1", "trainer.max_epochs=null",
    "trainer.val_check_interval=0.5", "trainer.val_check_interval=50", "trainer.val_check_interval=00:01:00:00",
    "trainer.val_check_interval={minutes:5}", "trainer.precision=16", "trainer.precision=bf16-mixed",
    "trainer.fast_dev_run=true", "trainer.fast_dev_run=3", "trainer.gradient_clip_val=0", "trainer.deterministic=warn",
    "trainer.num_sanity_val_steps=-1", "trainer.overfit_batches=10", "trainer.max_time={hours:2}",
    # the ends of the ranges, and ints for reals
    "rpe.ratio=100", "rpe.ratio=0.5", "model.label_smoothing=1.0", "model.label_smoothing=0",
    "model.ema_decay=0.99996", "model.ema_decay=null", "model.optimizer.lr=1", "model.optimizer.lr=1e6",
    "seed=4294967295", "data.batch_size=1", "model.net.drop_path_rate=0",
    "+callbacks.model_checkpoint.save_top_k=-1",
]


@pytest.mark.parametrize("override", GOOD)
def test_valid_forms_pass(override: str, composed: dict[str, DictConfig]) -> None:
    check_settings(_with(composed["default"], override))


@pytest.mark.parametrize("devices", ["-1", "[0,1]", "'0,1'", "'1,'"])
def test_gpu_device_forms_pass_on_a_gpu(devices: str, composed: dict[str, DictConfig],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning's GPU forms of trainer.devices (ids, -1: all) pass where the run has GPUs (two pretended)."""
    from lifecycle import settings

    monkeypatch.setattr(settings, "_available", lambda kind: 2 if kind == "cuda" else 0)
    cfg = _with(_with(composed["default"], "trainer.accelerator=gpu"), f"trainer.devices={devices}")
    check_settings(cfg)


def test_overrides_compose_as_on_the_command_line(tmp_path: Path) -> None:
    """The cases above edit a composed config; Hydra's own composition gives the same typed values."""
    base = _compose(tmp_path, [])
    for override in ("rpe.ratio=1e9", "data.batch_size=2.5", "trainer.devices='0,1'", "+data.extra=[1.0,-inf]",
                     "trainer.val_check_interval={minutes:5}"):
        key = override.lstrip("+").split("=", 1)[0]
        composed_value = OmegaConf.select(_compose(tmp_path, [override]), key)
        edited_value = OmegaConf.select(_with(base, override), key)
        assert composed_value == edited_value and type(composed_value) is type(edited_value), override


def test_absent_missing_and_unresolvable_keys_are_skipped() -> None:
    check_settings(OmegaConf.create({}))
    check_settings(OmegaConf.create({"data": {"batch_size": "???", "root": "???"}, "trainer": None}))
    check_settings(OmegaConf.create({"model": {"lr": "${oc.env:RPE_NO_SUCH_VARIABLE_SET}"}}))
    # interpolations are checked at their resolved value
    cfg = OmegaConf.create({"data": {"img_size": -32}, "model": {"net": {"img_size": "${data.img_size}"}}})
    with pytest.raises(DataSettingError, match=r"^data\.img_size=-32 must be an integer >= 1$"):
        check_settings(cfg)


def test_first_matching_rule_wins_and_exact_keys_are_not_shadowed() -> None:
    patterns = [s.pattern for s in SETTINGS]
    assert patterns == list(SCHEMA) and len(patterns) == len(set(patterns))
    for setting in SETTINGS:
        if "*" not in setting.pattern:
            assert setting_for(setting.pattern) is setting, setting.pattern
    # `*` stays within one segment
    assert setting_for("trainer.limit_val_batches").pattern == "trainer.limit_*_batches"
    assert setting_for("trainer.limit_val_batches.x") is None
    assert setting_for("model.net.attn_drop_rate").pattern == "model.net.*drop*_rate"


def _accepts(annotation: object, value: object) -> bool:
    return Setting("key", annotation).accepts(value)


def test_words_come_from_the_constraints() -> None:
    assert describe(PositiveInt) == "an integer >= 1"
    assert describe(Annotated[Real, Gt(0), Le(1)]) == "> 0 and <= 1"
    assert describe(Real) == "a finite number"
    # pydantic's own spellings of the same constraints read the same
    assert describe(Annotated[StrictInt, Field(ge=0, le=3, description="slots")]) == "an integer >= 0 and <= 3 (slots)"
    assert describe(Annotated[Real, Interval(gt=0, le=1)] | None) == "> 0 and <= 1 or null"
    unit = Annotated[Real, Gt(0), Lt(1)]
    assert [_accepts(unit, v) for v in (0, 0.5, 1, True, float("nan"))] == [False, True, False, False, False]
    small = Annotated[StrictInt, Ge(0), Le(3)]
    assert [_accepts(small, v) for v in (0, 3, 4, 2.0, False)] == [True, True, False, False, False]
    with pytest.raises(TypeError, match="has no words of its own"):  # a string form must say what it takes
        describe(StrictStr)


def test_the_schema_documents_every_key() -> None:
    """Every declared setting says in words what each of its forms takes (`describe` refuses a form it cannot
    put in words), and each form's note is its own: no form is described by a bare type name."""
    for setting in SETTINGS:
        words = setting.describe()
        assert words and "\n" not in words, setting.pattern
        assert not any(name in words for name in ("<class", "typing.", "Annotated")), (setting.pattern, words)


# values of every kind a config or a command line gives, for the naive expectations below
PROBES = [None, True, False, -3, -1, 0, 1, 2, 7, 10**12, -1.0, 0.0, 0.5, 1.0, 2.0, 2.5, 1e9, float("nan"),
          float("inf"), float("-inf"), "8", "auto", "", [1], [0.5], [0, 0.5, 1], [0.5, True, 0.5], [0.5, 2, 0.5],
          [0.5, float("nan"), 0.5], [0.5, 0.5, 0.5, 0.5], {"a": 1}]


def _is_int(value: object) -> bool:
    return type(value) is int


def _is_finite_number(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


@pytest.mark.parametrize("key,expected", [
    ("data.batch_size", lambda v: _is_int(v) and v >= 1),
    ("seed", lambda v: _is_int(v) and 0 <= v <= 2**32 - 1),
    ("model.ema_decay", lambda v: v is None or (_is_finite_number(v) and 0 < v < 1)),
    ("rpe.ratio", lambda v: v is None or (_is_finite_number(v) and 0 < v <= 100)),
    ("trainer.limit_val_batches",
     lambda v: v is None or (_is_int(v) and v >= 0) or (type(v) is float and 0 <= v <= 1)),
    ("trainer.max_epochs", lambda v: v is None or (_is_int(v) and (v == -1 or v >= 1))),
    ("data.mean", lambda v: type(v) is list and len(v) == 3 and all(_is_finite_number(x) and 0 <= x <= 1 for x in v)),
    ("trainer.deterministic", lambda v: type(v) is bool or v == "warn" or v is None),
])
def test_the_schema_takes_exactly_the_naively_expected_values(key: str, expected) -> None:
    """The schema's strict validation against a plain reading of the range: no bool for an integer, no 2.0 for
    an integer, no nan or inf for a number, no string that spells a number."""
    setting = setting_for(key)
    assert setting is not None
    assert [v for v in PROBES if setting.accepts(v) != bool(expected(v))] == []


@pytest.mark.parametrize("spec,message", [
    (1e9, "rpe.ratio=1000000000.0 must be > 0 and <= 100"), (100.5, "rpe.ratio=100.5 must be > 0 and <= 100"),
    (float("inf"), "rpe.ratio=inf must be > 0 and <= 100"), (float("nan"), "rpe.ratio=nan must be > 0"),
    (0.0, "rpe.ratio=0.0 must be > 0"),
])
def test_rpe_config_bounds_the_ratio_also_for_shorthands(spec: float, message: str) -> None:
    """A shorthand (rpe.preset=rpe-1e9-..., model.enc_rpe2d) never reaches check_settings as rpe.ratio."""
    with pytest.raises(RPEConfigError) as info:
        RPEConfig(ratio=spec)
    assert str(info.value) == message
    with pytest.raises(RPEConfigError) as info:
        resolve_rpe({"preset": f"rpe-{spec}-product-ctx-1-k"})
    assert str(info.value) == f"rpe shorthand 'rpe-{spec}-product-ctx-1-k': {message}"  # names what was written
    assert parse_shorthand("rpe-100-product-ctx-1-k").ratio == 100.0
