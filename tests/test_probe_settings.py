"""The fault probe's settings cases: cross-key schedule checks, the model's input size, choice settings that
reach Lightning or timm, the keys of model.mixup, the devices of the machine, and for every rule that the
range its message states is the range it accepts."""

from __future__ import annotations

import copy
import inspect
import re
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest
from annotated_types import Ge, Gt, Le, Len, Lt
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf
from pydantic import InstanceOf

from lifecycle import settings
from lifecycle.settings import (
    SETTINGS,
    Setting,
    SettingError,
    check_devices,
    check_schedule,
    check_settings,
    describe,
    forms,
    mixup_keys,
    unpacked,
)
from tests.helpers import CONFIG_DIR, compose_config, swept_job_configs


def _compose(tmp_path: Path, overrides: list[str], config_name: str = "train") -> DictConfig:
    return compose_config(overrides, tmp_path / "run", tmp_path / "data", config_name=config_name)


@pytest.fixture(scope="module")
def default(tmp_path_factory: pytest.TempPathFactory) -> DictConfig:
    tmp = tmp_path_factory.mktemp("probe")
    return _compose(tmp, ["debug=fast"])


def _with(cfg: DictConfig, *overrides: str) -> DictConfig:
    job = copy.deepcopy(cfg)
    for override in overrides:
        parsed = OverridesParser.create().parse_overrides([override])[0]
        OmegaConf.update(job, parsed.key_or_group, parsed.value(), merge=False, force_add=override.startswith("+"))
    return job


def _refused(check, cfg: DictConfig) -> str:
    with pytest.raises(SettingError) as info:
        check(cfg)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch):
    """Pretend the machine has ``n`` CUDA GPUs (and nothing else but the CPU)."""
    def pretend(n: int) -> None:
        monkeypatch.setattr(settings, "_available", lambda kind: n if kind == "cuda" else 0)
    pretend(0)
    return pretend


# ------------------------------------------------------------------ 1, 2, 3: cross-key checks of a run
SCHEDULE_BAD = [
    (["trainer.max_epochs=-1"],
     "trainer.max_epochs=-1 (unlimited) with trainer.max_steps=-1 gives the cosine lr schedule (model.scheduler) no "
     "length; valid: trainer.max_epochs an integer >= 1, or trainer.max_steps an integer >= 1"),
    (["trainer.max_epochs=null", "trainer.max_time={hours:1}"],
     "trainer.max_epochs=null (unlimited with trainer.max_time set) with trainer.max_steps=-1 gives the cosine lr "
     "schedule (model.scheduler) no length; valid: trainer.max_epochs an integer >= 1, or trainer.max_steps an "
     "integer >= 1"),
    (["trainer.max_epochs=-1", "trainer.max_steps=10"],
     "model.scheduler.warmup_epochs=1.0 needs an epoch count (an epoch of the warm-up is total steps / max_epochs), "
     "but trainer.max_epochs=-1 (unlimited); valid: trainer.max_epochs an integer >= 1, or "
     "model.scheduler.warmup_epochs=0"),
    (["trainer.max_epochs=null", "trainer.max_steps=10"],
     "model.scheduler.warmup_epochs=1.0 needs an epoch count (an epoch of the warm-up is total steps / max_epochs), "
     "but trainer.max_epochs=null (unlimited with trainer.max_steps=10); valid: trainer.max_epochs an integer >= 1, "
     "or model.scheduler.warmup_epochs=0"),
    (["trainer.limit_val_batches=0"],
     "trainer.limit_val_batches=0 never validates, so the run saves no best.ckpt and has no result; valid: a"
     " positive value (a fraction of the val split, or a batch count), or callbacks.model_checkpoint.monitor=null"
     " +callbacks.model_checkpoint.save_on_train_epoch_end=true (best.ckpt is then the last epoch)"),
    # a last-epoch checkpoint saved only after validation is still never saved
    (["trainer.limit_val_batches=0", "callbacks.model_checkpoint.monitor=null"],
     "trainer.limit_val_batches=0 never validates, so the run saves no best.ckpt and has no result; valid: a"
     " positive value (a fraction of the val split, or a batch count), or callbacks.model_checkpoint.monitor=null"
     " +callbacks.model_checkpoint.save_on_train_epoch_end=true (best.ckpt is then the last epoch)"),
    (["trainer.max_epochs=1", "trainer.min_epochs=5"],
     "trainer.min_epochs=5 is more than trainer.max_epochs=1, which ends the run first; valid: trainer.min_epochs"
     " <= 1, or null"),
    (["trainer.max_epochs=2", "trainer.check_val_every_n_epoch=3"],
     "trainer.check_val_every_n_epoch=3 with trainer.max_epochs=2 never validates, so the run saves no best.ckpt"
     " and has no result; valid: an interval of at most 2 epochs, or callbacks.model_checkpoint.monitor=null"
     " +callbacks.model_checkpoint.save_on_train_epoch_end=true (best.ckpt is then the last epoch)"),
    (["model.scheduler.min_lr=1.0"],
     "model.scheduler.min_lr=1.0 must be <= the peak lr, model.optimizer.lr=0.001 x total batch 64 / "
     "model.optimizer.lr_base_batch=64 = 0.001"),
    (["model.scheduler.warmup_lr=0.01"],
     "model.scheduler.warmup_lr=0.01 must be <= the peak lr, model.optimizer.lr=0.001 x total batch 64 / "
     "model.optimizer.lr_base_batch=64 = 0.001"),
    # the peak lr is the batch-scaled one: 1e-3 x 16 / 64
    (["data.batch_size=16", "model.scheduler.min_lr=5e-4"],
     "model.scheduler.min_lr=0.0005 must be <= the peak lr, model.optimizer.lr=0.001 x total batch 16 / "
     "model.optimizer.lr_base_batch=64 = 0.00025"),
    (["data.batch_size=16", "trainer.accumulate_grad_batches=2", "trainer.devices=2", "model.scheduler.min_lr=1"],
     "model.scheduler.min_lr=1.0 must be <= the peak lr, model.optimizer.lr=0.001 x total batch 64 / "
     "model.optimizer.lr_base_batch=64 = 0.001"),
    (["model.net.img_size=64"],
     "model.net.img_size=64 must equal data.img_size=32: the model is built for the data's image size (valid: "
     "model.net.img_size=32, its default ${data.img_size})"),
]


@pytest.mark.parametrize("overrides,message", SCHEDULE_BAD, ids=[" ".join(o) for o, _ in SCHEDULE_BAD])
def test_bad_schedule_is_one_line_naming_the_keys(overrides: list[str], message: str, default: DictConfig) -> None:
    cfg = _with(default, *overrides)
    check_settings(cfg)  # each value alone is in range: only the combination is wrong
    assert _refused(check_schedule, cfg) == message


SCHEDULE_GOOD = [
    ["trainer.max_epochs=-1", "trainer.max_steps=10", "model.scheduler.warmup_epochs=0"],
    ["trainer.max_epochs=-1", "trainer.fast_dev_run=true"],  # Lightning runs a fixed number of steps
    ["trainer.max_epochs=null"],  # Lightning's default: 1000 epochs
    # best.ckpt is the last epoch, saved at its end: the run needs no validation
    ["trainer.limit_val_batches=0", "callbacks.model_checkpoint.monitor=null",
     "+callbacks.model_checkpoint.save_on_train_epoch_end=true"],
    ["model.scheduler.min_lr=0.001", "model.scheduler.warmup_lr=0.001"],  # a constant lr is a schedule
    ["trainer.devices=auto", "model.scheduler.min_lr=0.002"],  # the peak lr depends on the machine: unchecked
    ["+model.net.dynamic_img_size=true", "model.net.img_size=64"],
    # the warm-up may outlast a short run (timing runs, smoke runs of the paper recipe): timm handles it
    ["model.scheduler.warmup_epochs=5"],
]


@pytest.mark.parametrize("overrides", SCHEDULE_GOOD, ids=[" ".join(o) for o in SCHEDULE_GOOD])
def test_valid_schedules_pass(overrides: list[str], default: DictConfig) -> None:
    cfg = _with(default, *overrides)
    check_settings(cfg)
    check_schedule(cfg)


def test_detr_has_no_cosine_schedule_nor_fixed_input_size(tmp_path: Path) -> None:
    cfg = _compose(tmp_path, ["experiment=detr_shapes", "trainer.max_epochs=-1"])
    check_settings(cfg)
    check_schedule(cfg)  # StepLR in epochs: no length needed


def test_a_head_count_that_does_not_divide_the_width_names_both_keys_and_the_counts_that_fit(tmp_path: Path) -> None:
    """DETR ``model.nheads=3`` at width 128 was the transformer's "width 128 is not divisible by 3 heads"."""
    cfg = _compose(tmp_path, ["experiment=detr_shapes", "model.nheads=3"])
    with pytest.raises(SettingError) as err:
        check_settings(cfg)
    assert str(err.value) == ("model.nheads=3 must divide model.hidden_dim=128 (each attention head gets an equal"
                              " share of the width); valid: model.nheads=<one of: 1, 2, 4, 8, 16, 32, 64, 128>, or a"
                              " model.hidden_dim that 3 divides")
    check_settings(_compose(tmp_path, ["experiment=detr_shapes", "model.nheads=4"]))
    with pytest.raises(SettingError, match=r"^model.net.num_heads=5 must divide model.net.embed_dim=64 "):
        check_settings(_compose(tmp_path, ["debug=fast", "+model.net.num_heads=5", "+model.net.embed_dim=64"]))


@pytest.mark.parametrize(("overrides", "message"), [
    # probe 8 B30: timm's "tuple index out of range", after the run dir was made
    (["+model.net.depths=[2,2,2,2]"],
     "model.net.num_heads=[2, 4] has 2 stages, model.net.depths=[2, 2, 2, 2] has 4 (swin_micro_patch4_window4_32):"
     " give one head count per stage; valid: model.net.num_heads=[2, 4, 8, 16] (doubling with the width), or"
     " depths of 2 stages"),
    # probe 8 B29: "must be an integer >= 1" of Swin's own per-stage form
    (["+model.net.num_heads=[3,3]"],
     "model.net.num_heads=[3, 3]: stage 1's 3 heads must divide its width 64 (model.net.embed_dim=64 doubled per"
     " stage; 64 % 3 = 1); valid head counts of stage 1: 1, 2, 4, 8, 16, 32, 64"),
    # probe 8 B96: timm truncated the head width (63 // 2) and trained another attention width than asked
    (["+model.net.embed_dim=63"],
     "model.net.num_heads=[2, 4]: stage 1's 2 heads must divide its width 63 (model.net.embed_dim=63 doubled per"
     " stage; 63 % 2 = 1); valid head counts of stage 1: 1, 3, 7, 9, 21, 63"),
])
def test_swin_stage_settings_that_do_not_fit_are_one_line_before_the_run_dir(
        overrides: list[str], message: str, tmp_path: Path) -> None:
    """Swin's num_heads is a list, one count per stage (the settings rule took only an integer), and must have
    as many stages as depths: the command line's build check names both, before any run dir exists."""
    from lifecycle.job import check_buildable

    cfg = _compose(tmp_path, ["debug=fast", "model=swin_micro", *overrides])
    check_settings(cfg)  # a list is Swin's valid form
    with pytest.raises(ValueError) as err:
        check_buildable(cfg)
    assert str(err.value) == message
    good = _compose(tmp_path, ["debug=fast", "model=swin_micro", "+model.net.num_heads=[2,4]"])
    check_settings(good)
    check_buildable(good)


def test_a_constructor_error_of_settings_that_do_not_fit_is_one_line_naming_the_model_settings(
        tmp_path: Path) -> None:
    """A model constructor's TypeError or IndexError on the meta device was left to the job, which failed after
    the run dir was made ("unsupported operand type(s) for %"): the build is tried on the CPU, and an error that
    stays there is the settings', in one line. A list of heads is Swin's form only (the settings rule says so)."""
    from lifecycle import job

    cfg = _compose(tmp_path, ["debug=fast", "+model.net.num_heads=[2,2]"])
    assert _refused(check_settings, cfg) == (
        "model.net.num_heads=[2, 2] is a list (one head count per stage), which only Swin's stages take;"
        " deit_micro_patch4_32 has one head count for every block: valid: an integer >= 1")
    with pytest.raises(ValueError) as err:
        job.check_buildable(cfg)
    assert str(err.value).startswith("the model cannot be built with these settings (model.net.name="
                                     "deit_micro_patch4_32, ") and "model.net.num_heads=[2, 2]): TypeError: " in str(
        err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("override", "message"), [
    # probe 8 B94: "create_model() got multiple values for keyword argument 'num_classes'", after the run dir
    ("+model.net.num_classes=10", "model.net.num_classes=10 is not a setting: the number of classes comes from the"
                                  " data (its class folders); valid: drop it"),
    # probe 8 B92: a 90-line traceback of the first convolution at the first batch, after the run dir
    ("+model.net.in_chans=1", "model.net.in_chans=1 does not fit the data: every image is read as RGB, 3 channels;"
                              " valid: drop it (or model.net.in_chans=3)"),
])
def test_a_backbone_option_the_data_decide_is_one_line_before_the_run_dir(override: str, message: str,
                                                                           tmp_path: Path) -> None:
    from lifecycle.job import check_buildable

    with pytest.raises(ValueError) as err:
        check_buildable(_compose(tmp_path, ["debug=fast", override]))
    assert str(err.value) == message


@pytest.mark.parametrize(("overrides", "message"), [
    (["model=swin_micro", "model.net.ape=sincos"], "model.net.ape='sincos' is not supported by Swin, which has no"
                                                   " absolute position embedding; valid: model.net.ape=none"),
    (["model.net.ape=nope"], "model.net.ape='nope' is not one of: learned, sincos, none, peg"),
    # probe 9, B55: accepted with no effect, where an rpe field the encoding does not read is refused
    (["model=swinv2_micro", "rpe=irpe_k", "+model.net.pretrained_window_sizes=[2,2]"],
     "model.net.pretrained_window_sizes=[2, 2] scales the offsets of Swin-v2's own CPB (rpe=cpb), which the encoding"
     " product replaces: it would have no effect; valid: leave it out, or rpe=cpb"),
])
def test_a_backbones_refusal_names_the_settings_keys_a_command_line_gives(overrides: list[str], message: str,
                                                                         tmp_path: Path) -> None:
    """Probe 9, B4: Swin's refusal said ``valid: ape=none``, and ``ape=none`` on the command line is an unknown
    key: the line names the setting as it is given, ``model.net.ape``."""
    from lifecycle.job import check_buildable

    with pytest.raises(ValueError) as err:
        check_buildable(_compose(tmp_path, ["debug=fast", *overrides]))
    assert str(err.value).startswith(message), str(err.value)


def test_a_constructor_assertion_is_one_line_naming_the_model_settings(tmp_path: Path) -> None:
    """Probe 8 B93: ``+model.net.class_token=false`` was timm's bare "Token pooling needs the class token."
    after the run dir was made."""
    from lifecycle.job import check_buildable

    with pytest.raises(ValueError) as err:
        check_buildable(_compose(tmp_path, ["debug=fast", "+model.net.class_token=false"]))
    assert "model.net.class_token=False): AssertionError: Token pooling needs the class token." in str(err.value)


# ------------------------------------------------------------------ 4, 5, 6: single settings
SETTINGS_BAD = [
    ("trainer.val_check_interval=0", "trainer.val_check_interval=0 must be an integer >= 1 (batches), a fraction "
     "> 0 and <= 1, a duration 'DD:HH:MM:SS' longer than 0, a mapping of datetime.timedelta arguments, each >= 0"
     " and not all 0 or null (once per epoch)"),
    # Lightning would round 0 batches up to 1: validate after every batch
    ("trainer.val_check_interval=0.0", "trainer.val_check_interval=0.0 must be an integer >= 1 (batches), a "
     "fraction > 0 and <= 1, a duration 'DD:HH:MM:SS' longer than 0, a mapping of datetime.timedelta arguments,"
     " each >= 0 and not all 0 or null (once per epoch)"),
    ("callbacks.model_checkpoint.mode=maximum", "callbacks.model_checkpoint.mode='maximum' must be 'min' or 'max'"),
    ("trainer.accelerator=gpus",
     "trainer.accelerator='gpus' must be 'auto', 'cpu', 'gpu', 'cuda', 'mps' or 'tpu'"),
    ("trainer.precision=bogus",
     "trainer.precision='bogus' must be 16, 32 or 64 or a precision name such as '32-true' or 'bf16-mixed'"),
    ("trainer.precision=bf16_mixed",
     "trainer.precision='bf16_mixed' must be 16, 32 or 64 or a precision name such as '32-true' or 'bf16-mixed'"),
    ("trainer.gradient_clip_algorithm=l2",
     "trainer.gradient_clip_algorithm='l2' must be 'norm' or 'value' or null (Lightning's default (norm))"),
    ("+model.mixup.mixup_alpha=0.8 +model.mixup.bogus=3",
     "model.mixup.bogus=3 is not an argument of timm.data.Mixup; valid keys of model.mixup: correct_lam, "
     "cutmix_alpha, cutmix_minmax, label_smoothing, mixup_alpha, mode, multi_label, prob, switch_prob "
     "(num_classes comes from the data)"),
    ("+model.mixup.num_classes=8",
     "model.mixup.num_classes=8 is not an argument of timm.data.Mixup; valid keys of model.mixup: correct_lam, "
     "cutmix_alpha, cutmix_minmax, label_smoothing, mixup_alpha, mode, multi_label, prob, switch_prob "
     "(num_classes comes from the data)"),
    ("+model.mixup.mode=element", "model.mixup.mode='element' must be 'batch', 'pair' or 'elem'"),
]


@pytest.mark.parametrize("overrides,message", SETTINGS_BAD, ids=[o for o, _ in SETTINGS_BAD])
def test_bad_setting_is_one_line_naming_the_key(overrides: str, message: str, default: DictConfig) -> None:
    assert _refused(check_settings, _with(default, *overrides.split())) == message


@pytest.mark.parametrize("overrides", [
    "trainer.val_check_interval=1.0", "trainer.val_check_interval=0.25", "trainer.val_check_interval=1",
    "trainer.precision=16-mixed", "trainer.precision='16'", "trainer.precision=64", "trainer.precision=bf16",
    "trainer.accelerator=auto", "trainer.accelerator=gpu", "callbacks.model_checkpoint.mode=max",
    "trainer.gradient_clip_algorithm=value",
    "+model.mixup.mixup_alpha=0.8 +model.mixup.cutmix_alpha=1.0 +model.mixup.mode=pair +model.mixup.correct_lam=false",
])
def test_valid_choices_pass(overrides: str, default: DictConfig) -> None:
    check_settings(_with(default, *overrides.split()))


def test_mixup_keys_are_timms_arguments_but_num_classes() -> None:
    from timm.data import Mixup

    arguments = set(inspect.signature(Mixup.__init__).parameters) - {"self"}
    assert set(mixup_keys()) == arguments - {"num_classes"}


def test_precision_names_are_lightnings() -> None:
    import typing

    from lightning.fabric.connector import _PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS

    names = set(typing.get_args(_PRECISION_INPUT_STR)) | set(typing.get_args(_PRECISION_INPUT_STR_ALIAS))
    assert set(settings.PRECISIONS) == names


def test_accelerator_names_are_lightnings() -> None:
    from lightning.pytorch.accelerators import AcceleratorRegistry

    assert set(settings.ACCELERATORS) == {"auto", "gpu", *AcceleratorRegistry.available_accelerators()}


# ------------------------------------------------------------------ 5: the machine's devices
def test_gpu_on_a_machine_without_one(default: DictConfig, gpus, tmp_path: Path) -> None:
    cfg = _compose(tmp_path, ["debug=fast", "trainer=gpu"])
    check_settings(cfg)  # the config is valid: only this machine lacks the GPU
    message = ("trainer.accelerator=gpu needs a GPU, but none is visible on this machine; valid here: "
               "trainer.accelerator=cpu (trainer=cpu)")
    assert _refused(check_schedule, cfg) == message
    assert _refused(check_devices, _with(default, "trainer.accelerator=cuda")) == (
        "trainer.accelerator=cuda needs a CUDA GPU, but none is visible on this machine; valid here: "
        "trainer.accelerator=cpu (trainer=cpu)")


def test_more_devices_than_the_machine_has(default: DictConfig, gpus) -> None:
    gpus(1)
    cfg = _with(default, "trainer.accelerator=gpu", "trainer.devices=8")
    assert _refused(check_devices, cfg) == ("trainer.devices=8 with trainer.accelerator=gpu: this machine has 1 GPU; "
                                            "valid here: an integer >= 1 and <= 1, -1 or 'auto' (all)")
    for devices in ("1", "-1", "auto", "[0]"):
        check_devices(_with(default, "trainer.accelerator=gpu", f"trainer.devices={devices}"))
    for accelerator in ("cpu", "auto"):
        check_devices(_with(default, f"trainer.accelerator={accelerator}", "trainer.devices=8"))


@pytest.mark.parametrize("devices", ["'0'", "-1", "[0]", "'0,1'", "'-1'"])
def test_gpu_device_forms_on_the_cpu(default: DictConfig, gpus, devices: str) -> None:
    """Device ids and -1 are GPU forms: on the CPU (accelerator=cpu, or auto on a machine without a GPU)
    Lightning refuses them only when the Trainer is built, after the run dir is made (probe 19 u7)."""
    for accelerator, on in (("cpu", ""), ("auto", " (on this machine: cpu)")):
        cfg = _with(default, f"trainer.accelerator={accelerator}", f"trainer.devices={devices}")
        shown = OmegaConf.to_container(cfg.trainer)["devices"]
        shown = f"'{shown}'" if isinstance(shown, str) else shown
        assert _refused(check_devices, cfg) == (
            f"trainer.devices={shown} with trainer.accelerator={accelerator}{on} is a GPU form (device ids, or -1: "
            "all); on the CPU it counts processes: valid: an integer >= 1 or 'auto'")
    gpus(2)  # the same forms are GPU ids where Lightning picks the GPU
    check_devices(_with(default, "trainer.accelerator=auto", f"trainer.devices={devices}"))


def test_process_counts_on_the_cpu(default: DictConfig) -> None:
    for devices in ("1", "2", "'3'", "auto"):
        check_devices(_with(default, "trainer.accelerator=cpu", f"trainer.devices={devices}"))


def test_a_job_submitted_elsewhere_checks_its_devices_where_it_runs(gpus) -> None:
    """On a login node without GPUs, `-m hydra/launcher=slurm trainer=ddp` is not refused: the job checks
    again when it starts on its node (its config has no hydra key there)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["hydra/launcher=slurm", "trainer=ddp"], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    check_schedule(cfg)
    with pytest.raises(SettingError, match=r"^trainer\.accelerator=gpu needs a GPU"):
        check_schedule(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]))


# ------------------------------------------------------------------ 4: every rule's stated range is its range
_BOUND = re.compile(r"(>=|<=|>|<) (-?[0-9.e+]+)")


def _numbers(form: Any) -> list[tuple[Any, int]]:
    """The number forms of a setting's form (a list's item, wrapped as a list of its smallest length)."""
    base, metadata = unpacked(form)
    if base in (int, float):
        return [(form, 0)]
    if get_origin(base) is list and unpacked(get_args(base)[0])[0] in (int, float):
        return [(get_args(base)[0], next((m.min_length for m in metadata if isinstance(m, Len)), 1))]
    return []


def _floats_only(num: Any) -> bool:
    return any(isinstance(m, InstanceOf) for m in unpacked(num)[1])


def _probes(num: Any, bound: float) -> list[float | int]:
    """The values a reader takes the stated bound to allow: an int for "an integer", a float for "a fraction",
    both for a plain number."""
    if unpacked(num)[0] is int:
        return [int(bound)]
    values: list[float | int] = [float(bound)]
    if not _floats_only(num) and float(bound).is_integer():
        values.append(int(bound))
    return values


def _fixed_values(form: Any) -> tuple[Any, ...]:
    """The values a form names one by one: fixed values, true and false, null."""
    base = unpacked(form)[0]
    return get_args(base) if get_origin(base) is Literal else (True, False) if base is bool else \
        (None,) if base is type(None) else ()


def _wrap(value, length: int):
    return [value] * length if length else value


@pytest.mark.parametrize("rule", SETTINGS, ids=[s.pattern for s in SETTINGS])
def test_every_rule_accepts_what_its_message_states(rule: Setting) -> None:
    """Each bound a message states ('>= 0', '< 1') is probed at the bound and just beyond it: a closed bound
    is accepted by the setting, an open one and anything beyond are refused by the form that states it; each
    fixed value a message names (-1, 'auto', null) is accepted."""
    for form in forms(rule.annotation):
        for value in _fixed_values(form):
            assert rule.accepts(value), (rule.pattern, value)
        for item, length in _numbers(form):
            num = Setting(rule.pattern, item)
            bounds = [m for m in unpacked(item)[1] if isinstance(m, (Ge, Gt, Le, Lt))]
            stated = _BOUND.findall(describe(item).split(" (")[0])
            assert len(stated) == len(bounds), (rule.pattern, stated)
            for op, text in stated:
                bound = float(text)
                inside = op in (">=", "<=")
                for value in _probes(item, bound):
                    assert num.accepts(value) == inside, (rule.pattern, op, value)
                    if inside:
                        assert rule.accepts(_wrap(value, length)), (rule.pattern, value)
                if inside and bound.is_integer() and unpacked(item)[0] is float:
                    # a reader writes the bound of "a fraction >= 0" as 0: the setting (another of its forms,
                    # such as a count of batches) must take that too, or the message states a range it refuses
                    assert rule.accepts(_wrap(int(bound), length)), (rule.pattern, "stated", op, int(bound))
                    step = 1 if isinstance(value, int) else max(abs(bound), 1.0) * 1e-9
                    beyond = value - step if op.startswith(">") else value + step
                    assert not num.accepts(beyond), (rule.pattern, op, beyond)
                    within = value + step if op.startswith(">") else value - step
                    other = [(o, float(t)) for o, t in stated if (o, t) != (op, text)]
                    if all((within > b if o == ">" else within >= b if o == ">=" else within < b if o == "<"
                            else within <= b) for o, b in other):
                        assert num.accepts(within), (rule.pattern, op, within)
            if _floats_only(item):
                assert "fraction" in describe(item), rule.pattern
            if unpacked(item)[0] is int:
                assert "integer" in describe(item), rule.pattern


# ------------------------------------------------------------------ the shipped configs stay valid
def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def _group_overrides(group: str, option: str) -> list[str]:
    overrides = [f"{group}={option}"]
    if group == "data" and "coco" in option:
        overrides.append("model=detr_small")
    if group == "model" and option.startswith("detr"):
        overrides.append("data=shapes_coco")
    return overrides


REAL = ([[]] + [[f"experiment={name}"] for name in _options("experiment")]
        + [_group_overrides(g, o) for g in ("model", "data", "rpe", "trainer", "callbacks", "debug")
           for o in _options(g)])


@pytest.mark.parametrize("overrides", REAL, ids=lambda o: " ".join(o) or "default")
def test_shipped_configs_pass_the_run_checks(overrides: list[str], tmp_path: Path, gpus) -> None:
    gpus(8)  # the paper recipes' machine
    cfg = _compose(tmp_path, overrides)
    check_settings(cfg)
    check_schedule(cfg)


@pytest.mark.parametrize("sweep", _options("sweep"))
def test_every_sweep_job_passes_the_run_checks(sweep: str, tmp_path: Path, gpus) -> None:
    gpus(8)
    cfg = _compose(tmp_path, [f"sweep={sweep}"])
    check_schedule(cfg)
    for job in swept_job_configs(cfg):
        check_schedule(job)


def test_a_row_that_the_sweep_does_not_have_is_one_line(tmp_path) -> None:
    from lifecycle.cli import check_overrides
    from lifecycle.console import CommandLineError

    with pytest.raises((CommandLineError, ValueError)) as err:
        check_overrides(["sweep=shift_mini", "row=bogus_row", f"paths.log_dir={tmp_path}"], "train")
    assert str(err.value).startswith("row=bogus_row is not a row of sweep shift_mini; valid: none, ape_learned,")
    with pytest.raises((CommandLineError, ValueError), match="row=nope is not a row of sweep compare;"):
        check_overrides(["-m", "sweep=compare", "row=nope,irpe_k", f"paths.log_dir={tmp_path}"], "train")
    # the compare sweep takes an RPE preset by name (no entry in its rows table); the shift task does not
    check_overrides(["sweep=compare_mini", "row=decomposed", "data.root=/x", f"paths.log_dir={tmp_path}"], "train")
    with pytest.raises((CommandLineError, ValueError), match="row=irpe_k is not a row of sweep shift_mini;"):
        check_overrides(["sweep=shift_mini", "row=irpe_k", f"paths.log_dir={tmp_path}"], "train")


@pytest.mark.parametrize(("override", "expected"), [
    ("+data.foo=1", "data.foo is not a setting of ImageFolderDataModule; valid keys of data: batch_size,"),
    ("+trainer.foo=1", "trainer.foo is not a setting of Trainer; valid keys of trainer: accelerator,"),
    ("+model.foo=1", "model.foo is not a setting of ClassificationModule; valid keys of model: compile, ema_decay,"),
    ("+model.optimizer.momentum=0.9", "model.optimizer.momentum is not a setting; valid keys of model.optimizer: lr,"
                                      " lr_base_batch, weight_decay, betas, eps"),
    ("+model.scheduler.name=cosine", "model.scheduler.name is not a setting; valid keys of model.scheduler:"
                                     " warmup_epochs, warmup_lr, min_lr"),
    # the checkpoints a run's result and resume come from live in its own dir under their own names
    ("callbacks.model_checkpoint.dirpath=runs/other/checkpoints", "callbacks.model_checkpoint.dirpath=runs/other/"
                                                                  "checkpoints is not a setting: a run's checkpoints"),
    ("callbacks.last_checkpoint.dirpath=/elsewhere", "callbacks.last_checkpoint.dirpath=/elsewhere is not a setting"),
    ("callbacks.model_checkpoint.filename=other", "callbacks.model_checkpoint.filename=other is not a setting: the"
                                                  " run, eval.py and the tables read checkpoints/best.ckpt"),
    ("callbacks.model_checkpoint.monitor=val/loss", "callbacks.model_checkpoint.mode=max would keep the worst val/loss"
                                                    " as best.ckpt; valid for monitor=val/loss: mode=min"),
    # a root key nothing reads: a nested setting given without its node
    ("+lr=0.1", "lr is not a setting: nothing reads a root key of that name (a value for a nested setting needs"
                " its full key, e.g. model.optimizer.lr); root keys: ablation, callbacks, data,"),
])
def test_a_key_the_constructor_does_not_take_names_the_key(override: str, expected: str, tmp_path) -> None:
    from lifecycle.cli import check_overrides
    from lifecycle.console import CommandLineError

    with pytest.raises((CommandLineError, ValueError)) as err:
        check_overrides([override, f"paths.log_dir={tmp_path}"], "train")
    assert str(err.value).startswith(expected) and "\n" not in str(err.value), str(err.value)


def test_a_root_key_that_an_interpolation_reads_is_a_setting(tmp_path) -> None:
    """A user's own root key is read when a setting interpolates it; the model's nested settings keep their
    defaults for the keys a config leaves out."""
    from lifecycle.cli import check_overrides
    from models.classification import OPTIMIZER_DEFAULTS, SCHEDULER_DEFAULTS, ClassificationModule

    check_overrides(["+base_lr=0.001", "model.optimizer.lr=${base_lr}", f"paths.log_dir={tmp_path}"], "train")
    assert tuple(OPTIMIZER_DEFAULTS) == ClassificationModule.NESTED_SETTINGS["optimizer"]
    assert tuple(SCHEDULER_DEFAULTS) == ClassificationModule.NESTED_SETTINGS["scheduler"]
    module = ClassificationModule({"name": "deit_micro_patch4_32"}, num_classes=4, optimizer={"lr": 1e-3})
    assert module.optimizer_cfg == {**OPTIMIZER_DEFAULTS, "lr": 1e-3}


@pytest.mark.parametrize(("net", "expected"), [
    ({"name": "deit_micro_patch4_32", "depht": 2}, "model.net.depht is not an option of backbone"
                                                   " deit_micro_patch4_32; valid options: act_layer, ape,"),
    ({"name": "swin_micro_patch4_window4_32", "windw_size": 2}, "model.net.windw_size is not an option of backbone"
                                                                " swin_micro_patch4_window4_32; valid options:"),
])
def test_a_backbone_option_that_does_not_exist_names_its_key(net: dict, expected: str) -> None:
    from models import ModelConfigError
    from models.classification import ClassificationModule

    with pytest.raises(ModelConfigError) as err:
        ClassificationModule(net, num_classes=4)
    assert str(err.value).startswith(expected) and "\n" not in str(err.value), str(err.value)
    assert (" depth," in str(err.value)) or (" window_size" in str(err.value))


@pytest.mark.parametrize(("value", "expected"), [
    ("foo", "data.train_transform='foo' must be a mapping of timm create_transform arguments (or null for the"
            " default recipe); valid keys: no_aug,"),
    ({"hflp": 0.5}, "data.train_transform.hflp is not an argument of timm's create_transform; valid keys: no_aug,"),
    ({"mean": [0, 0, 0]}, "data.train_transform.mean is set by the DataModule; remove it"),
])
def test_a_train_transform_that_timm_does_not_take_names_the_key(value, expected: str, tmp_path) -> None:
    from data.datamodule import ImageFolderDataModule
    from data.errors import DataConfigError

    with pytest.raises(DataConfigError) as err:
        ImageFolderDataModule(root=tmp_path, img_size=32, train_transform=value)
    assert str(err.value).startswith(expected) and "\n" not in str(err.value), str(err.value)



def test_a_resolved_run_config_keeps_its_checkpoint_dir() -> None:
    """A run dir's config.yaml (what DDP workers load) holds the checkpoint dir as a plain path: the run's
    own is accepted, any other is not."""
    from lifecycle.settings import SettingError, _check_checkpoint_callbacks

    def config(dirpath: str) -> DictConfig:
        return OmegaConf.create({"paths": {"output_dir": "/r/run"},
                                 "callbacks": {"model_checkpoint": {"dirpath": dirpath, "filename": "best"}}})

    _check_checkpoint_callbacks(config("/r/run/checkpoints"))
    _check_checkpoint_callbacks(config("/r/run/checkpoints/"))
    with pytest.raises(SettingError, match="callbacks.model_checkpoint.dirpath=/r/other/checkpoints is not a setting"):
        _check_checkpoint_callbacks(config("/r/other/checkpoints"))


def test_a_further_checkpoint_callback_writes_only_into_its_own_run() -> None:
    """Probe 5 (read from the code): ``+callbacks.dump._target_=...ModelCheckpoint +callbacks.dump.dirpath=<another
    run>/checkpoints`` passed, as only the run's own two checkpoint callbacks were checked, and could replace that
    run's best.ckpt. Every callback's ``dirpath`` lies inside the run's dir."""
    from lifecycle.settings import SettingError, _check_checkpoint_callbacks

    def config(dirpath: str) -> DictConfig:
        return OmegaConf.create({"paths": {"output_dir": "/r/run"}, "callbacks": {"dump": {
            "_target_": "lightning.pytorch.callbacks.ModelCheckpoint", "dirpath": dirpath, "filename": "best"}}})

    _check_checkpoint_callbacks(config("${paths.output_dir}/dump"))
    _check_checkpoint_callbacks(config("/r/run/extra/checkpoints"))
    for outside in ("/r/other/checkpoints", "/r/run/../other", "/r"):
        with pytest.raises(SettingError) as err:
            _check_checkpoint_callbacks(config(outside))
        assert str(err.value) == (f"callbacks.dump.dirpath={outside} lies outside the run's dir (/r/run): a callback"
                                  " writes only into its own run's dir; valid: a folder inside it, e.g."
                                  " callbacks.dump.dirpath=${paths.output_dir}/dump")


@pytest.mark.parametrize("key", ["paths.log_dir", "paths.data_dir"])
@pytest.mark.parametrize("value", ["", "  ", "~/runs", "~"])
def test_an_empty_folder_setting_is_refused(default: DictConfig, key: str, value: str) -> None:
    """An empty log dir would make the launch dir's parent (or the filesystem root) hold the run; a quoted
    '~/runs' reaches Python unexpanded and made a folder named '~' in the working dir."""
    message = _refused(check_settings, _with(default, f"{key}='{value}'"))
    assert message == (f"{key}={value!r} must be a folder path (not empty; a leading '~' is not expanded: write the"
                       " home folder out)")


def test_a_warmup_longer_than_the_run_is_noted(default: DictConfig) -> None:
    assert settings.schedule_notes(_with(default, "trainer.max_epochs=2", "model.scheduler.warmup_epochs=3")) == [
        "model.scheduler.warmup_epochs=3.0 is longer than trainer.max_epochs=2: the lr rises for the whole run and"
        " never reaches its peak"]
    assert settings.schedule_notes(_with(default, "trainer.max_epochs=2", "model.scheduler.warmup_epochs=2")) == []
    assert settings.schedule_notes(_with(default, "trainer.max_epochs=null", "model.scheduler.warmup_epochs=2")) == [
        "trainer.max_epochs is not set: the run trains for Lightning's default of 1000 epochs"]


# ------------------------------------------------------------------ refused at the command line, before the run dir
# A 2-batch run: one epoch of 64 training images (1 batch of 64) and 32 validation images (1 batch)
TWO_SPLITS = ["debug=fast", "threads=1", "data.generator.num_train=64", "data.generator.num_val=32"]
BEST = "callbacks.model_checkpoint"
NO_BEST = [
    # no best.ckpt: found only after the whole run trained, by a message that guessed at the cause
    (["~callbacks.model_checkpoint"], f"{BEST} is not set (removed by ~{BEST} or set to null), so the run saves no"
     " best.ckpt and has no result; valid: keep it (configs/callbacks/default.yaml's)"),
    ([f"{BEST}=null"], f"{BEST} is not set (removed by ~{BEST} or set to null), so the run saves no best.ckpt and"
     " has no result; valid: keep it (configs/callbacks/default.yaml's)"),
    ([f"+{BEST}.save_top_k=0"], f"{BEST}.save_top_k=0 keeps no checkpoint, so the run saves no best.ckpt and has no"
     f" result; valid: {BEST}.save_top_k=1 (the default)"),
    # more than one kept under the one name best.ckpt: each save overwrote it, with a worse one too
    ([f"+{BEST}.save_top_k=2"], f"{BEST}.save_top_k=2 keeps 2 checkpoints under one name, best.ckpt, so each save"
     f" overwrites it, also with a worse one: best.ckpt would be the last one saved, not the best; valid:"
     f" {BEST}.save_top_k=1 (the default)"),
    ([f"+{BEST}.every_n_epochs=0"], f"{BEST}.every_n_epochs=0 never saves best.ckpt (Lightning saves every n epochs or"
     f" steps only for an n >= 1), so the run has no result; valid: {BEST}.every_n_epochs=1 (the default)"),
    ([f"+{BEST}.every_n_epochs=2"], f"{BEST}.every_n_epochs=2 with trainer.max_epochs=1 never saves best.ckpt, so the"
     " run has no result; valid: at most 1 (1, the default)"),
    ([f"+{BEST}.every_n_train_steps=1000"], f"{BEST}.every_n_train_steps=1000 is more than the run's 1 training steps"
     " (trainer.max_epochs=1 x 1 steps, from data.generator.num_train=64 / data.batch_size=64), so best.ckpt is never"
     " saved and the run has no result; valid: at most 1, or leave it unset (a save after each validation)"),
    (["trainer.max_steps=3", "trainer.max_epochs=-1", "model.scheduler.warmup_epochs=0",
      f"+{BEST}.every_n_train_steps=5"], f"{BEST}.every_n_train_steps=5 is more than the run's 3 training steps"
     " (trainer.max_steps=3), so best.ckpt is never saved and the run has no result; valid: at most 3, or leave it"
     " unset (a save after each validation)"),
    (["trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=1000"],
     "trainer.val_check_interval=1000 with trainer.check_val_every_n_epoch=null validates after every 1000 training"
     " batches, more than the run's 1 (trainer.max_epochs=1 x 1 batches, from data.generator.num_train=64 /"
     " data.batch_size=64), so it never validates, saves no best.ckpt and has no result; valid: at most 1, a"
     f" fraction of an epoch, or {settings.LAST_EPOCH_AS_BEST}"),
    (["trainer.val_check_interval=5"], "trainer.val_check_interval=5 is more than an epoch's 1 training batches"
     " (data.generator.num_train=64 / data.batch_size=64), which Lightning refuses when the run starts; valid: at most"
     " 1, a fraction of an epoch, or trainer.check_val_every_n_epoch=null (an interval over the whole run)"),
    # a fraction of no batch: Lightning's "0.001 * 1 < 1" at the first validation, after training
    (["trainer.limit_val_batches=0.001"], "trainer.limit_val_batches=0.001 of the 1 val batches"
     " (data.generator.num_val=32 / data.batch_size=64) is 1 x 0.001 < 1 batch, no batch at all; valid: a fraction"
     " >= 1, a number of batches (an integer >= 1), or null (all)"),
    (["trainer.limit_train_batches=0.1", "data.batch_size=8"], "trainer.limit_train_batches=0.1 of the 8 train"
     " batches (data.generator.num_train=64 / data.batch_size=8) is 8 x 0.1 < 1 batch, no batch at all; valid: a"
     " fraction >= 0.125, a number of batches (an integer >= 1), or null (all)"),
    # a logger folder that is, or lies in, one of the run's own records or folders
    (["logger.csv.name=checkpoints", "+logger.csv.version=best.ckpt"], "logger.csv.name='checkpoints' puts the"
     " logger's files in {run}/checkpoints, which is the run's own checkpoints; valid: a folder of its own, none of"
     " the run's records and folders (run.json, metrics.json, failed.json, config.yaml, run.lock, .hydra,"
     " checkpoints, findings.yaml, testsets, plots)"),
    (["logger.csv.name=plots/csv"], "logger.csv.name='plots/csv' puts the logger's files in {run}/plots/csv, which"
     " lies in the run's own plots; valid: a folder of its own, none of the run's records and folders (run.json,"
     " metrics.json, failed.json, config.yaml, run.lock, .hydra, checkpoints, findings.yaml, testsets, plots)"),
]


@pytest.mark.parametrize(("args", "expected"), NO_BEST, ids=[" ".join(a) for a, _ in NO_BEST])
def test_settings_that_leave_no_best_checkpoint_are_refused_before_the_run_dir(args: list[str], expected: str,
                                                                              tmp_path: Path) -> None:
    """Probe 5 cases 42, 44, 45, 46, 52, 53, 50: each trained the whole run (or up to its first validation), then
    failed; each is now one line naming its setting, and no run dir is made."""
    from tests.test_cli_input import _refused_before_the_run_dir

    message = _refused_before_the_run_dir([*TWO_SPLITS, f"paths.data_dir={tmp_path / 'data'}", *args], tmp_path)
    assert message == expected.format(run=tmp_path / "logs" / "r"), message


@pytest.mark.parametrize("args", [
    [f"+{BEST}.every_n_train_steps=1"], [f"+{BEST}.every_n_epochs=1"], [f"+{BEST}.save_top_k=1"],
    ["trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=1"], ["trainer.limit_val_batches=1.0"],
    ["trainer.limit_train_batches=0.125", "data.batch_size=8"], ["logger.csv.name=csv_log"],
    # a run whose result is its last epoch needs no validation to have a best.ckpt
    ["trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=1000", f"{BEST}.monitor=null",
     f"+{BEST}.save_on_train_epoch_end=true"],
], ids=lambda args: " ".join(args))
def test_the_settings_that_save_a_best_checkpoint_pass(args: list[str], tmp_path: Path) -> None:
    from lifecycle.cli import check_overrides

    check_overrides([*TWO_SPLITS, f"paths.data_dir={tmp_path / 'data'}", f"paths.log_dir={tmp_path / 'logs'}",
                     "run_name=r", *args], "train")
    assert (tmp_path / "logs" / "r").is_dir()


def test_a_callback_dirpath_outside_the_run_dir_is_refused_before_the_run_dir(tmp_path: Path) -> None:
    """Probe 5 cases 40, 41: the command line did not know the run dir, so only the job refused such a dirpath,
    after it had claimed the run dir (a failed run left behind). The check is given the dir it makes."""
    from lifecycle.cli import check_overrides
    from tests.test_cli_input import _refused_before_the_run_dir

    dump = ["+callbacks.dump._target_=lightning.pytorch.callbacks.ModelCheckpoint", "+callbacks.dump.monitor=val/top1"]
    for outside in (tmp_path / "other_run" / "checkpoints", tmp_path / "data" / "rel" / "train" / "0_E"):
        message = _refused_before_the_run_dir([*TWO_SPLITS, *dump, f"+callbacks.dump.dirpath={outside}"], tmp_path)
        assert message == (f"callbacks.dump.dirpath={outside} lies outside the run's dir ({tmp_path / 'logs' / 'r'}):"
                           " a callback writes only into its own run's dir; valid: a folder inside it, e.g."
                           " callbacks.dump.dirpath=${paths.output_dir}/dump")
    assert not (tmp_path / "other_run").exists()
    check_overrides([*TWO_SPLITS, *dump, "+callbacks.dump.dirpath=${paths.output_dir}/dump",
                     f"paths.log_dir={tmp_path / 'logs'}", "run_name=r"], "train")
    assert (tmp_path / "logs" / "r").is_dir()


def test_a_data_root_in_the_run_dir_the_job_would_see_is_refused_before_the_run_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 5 cases 7, 9: the check resolved data.root without ``hydra.job.env_set`` (which Hydra applies around
    the job only) and from the launch dir where ``hydra.job.chdir=true`` makes the job resolve it from the run
    dir; the job's own check refused it after claiming the run dir. The check now reads it as the job will."""
    import os

    from tests.test_cli_input import _refused_before_the_run_dir

    monkeypatch.delenv("RPE_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "logs" / "r"
    refusal = ("is inside the run dir {run}, whose files are that run's; valid: a folder outside every run dir and"
               " sweep dir")
    assert _refused_before_the_run_dir([*TWO_SPLITS, "data.root=rel", "hydra.job.chdir=true"], tmp_path) == (
        f"data.root='rel' {refusal.format(run=run)}")
    assert _refused_before_the_run_dir([*TWO_SPLITS, f"+hydra.job.env_set.RPE_DATA_DIR={run}"], tmp_path) == (
        f"data.root={str(run / 'relational_v2')!r} {refusal.format(run=run)}")
    assert "RPE_DATA_DIR" not in os.environ  # the job's environment was the check's only
    assert _refused_before_the_run_dir([*TWO_SPLITS, f"data.root={run / 'data'}"], tmp_path) == (
        f"data.root={str(run / 'data')!r} {refusal.format(run=run)}")
    assert not (tmp_path / "rel").exists()


def test_a_data_root_name_too_long_for_the_file_system_is_refused_before_the_run_dir(tmp_path: Path) -> None:
    """Probe 5 cases 151, 153 (the other side): a name the file system cannot hold is one line up front; one it can
    hold (240 bytes) is generated, its lock and temp dirs named short (tests/test_data_faults.py)."""
    from tests.test_cli_input import _refused_before_the_run_dir

    root = tmp_path / ("d" * 256)
    message = _refused_before_the_run_dir([*TWO_SPLITS, f"data.root={root}"], tmp_path)
    assert message == (f"data.root={str(root)[:80]}... has a folder name of 256 bytes ({'d' * 40}...), more than the"
                       " 255 a file system allows; valid: folder names of at most 255 bytes in a path of at most 3900")
    deep = tmp_path.joinpath(*["0" * 250] * 16)
    message = _refused_before_the_run_dir([*TWO_SPLITS, f"data.root={deep}"], tmp_path)
    assert message.startswith(f"data.root={str(deep)[:80]}... has a path of {len(str(deep))} bytes, more than 3900")
