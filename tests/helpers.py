"""Helpers shared by the tests: compose Hydra configs the way train.py does, run the entry points as a user
would, and the small stand-in data and budgets of the end-to-end tests. (Fixtures and hooks stay in
conftest.py; a test module imports these from here.)"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "configs"

# A small relational-shapes set keeps the end-to-end tests within the suite's time budget.
SMALL_RELATIONAL = [
    "data.root=${paths.data_dir}/relational_small", "data.generator.num_train=4096", "data.generator.num_val=512",
    "data.num_workers=0",
]
# 256 steps: with the mini recipe's fixed sin-cos APE the micro DeiT passes 80 % after its first epoch
# (with a learned APE it would first sit on the ln(8) plateau for a seed-dependent number of epochs).
LEARNING_BUDGET = ["data.batch_size=32", "model.optimizer.lr_base_batch=32", "trainer.max_epochs=2",
                   "model.scheduler.warmup_epochs=0.5", "model.net.ape=sincos"]


def compose_config(
    overrides: list[str], output_dir: Path, data_dir: Path, config_name: str = "train"
) -> DictConfig:
    """Compose ``configs/<config_name>.yaml`` with ``overrides`` and make it runnable in-process.

    The Hydra runtime (output dir, cwd) is set as ``hydra.main`` would set it, so
    ``train.run(cfg)`` behaves as on the command line.
    """
    from lifecycle.cli import normalize_overrides  # `+trainer.limit_train_batches=...` as on the CLI

    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name, overrides=normalize_overrides(overrides), return_hydra_config=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(output_dir)
        cfg.hydra.runtime.cwd = str(ROOT)
        cfg.hydra.job.num = 0
        cfg.paths.data_dir = str(data_dir)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def run_cli(script: str, args: list[str], env_extra: dict[str, str] | None = None, timeout: int = 600):
    """Run ``python <script> args`` from the repository root; returns the CompletedProcess."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, str(ROOT / script), *args], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=timeout, preexec_fn=_sigint_as_at_a_terminal,
    )


def _sigint_as_at_a_terminal() -> None:
    """A non-interactive shell starts background jobs (``make slow &``) with SIGINT ignored, and Python
    keeps an ignored SIGINT: Ctrl-C would then never reach the CLI under test. It gets SIGINT back, as it
    has it when typed at a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def check_encoding_everywhere(preset: str) -> None:
    """``rpe=<preset>``: forward and backward on the micro DeiT and Swin, and DETR's encoder on a 3x5 map."""
    import torch

    from models import create_model
    from models.detr import Transformer

    for name in ("deit_micro_patch4_32", "swin_micro_patch4_window4_32"):
        create_model(name, rpe=preset, num_classes=4)(torch.randn(2, 3, 32, 32)).sum().backward()
    detr = Transformer(dim=32, heads=2, enc_layers=1, dec_layers=1, ffn=32, enc_rpe=preset)
    memory = detr.encode(torch.randn(2, 32, 3, 5), torch.zeros(2, 3, 5, dtype=torch.bool), torch.randn(2, 32, 3, 5))
    memory.sum().backward()


def check_trains_from_the_command_line(preset: str, log_dir: Path, data_dir: Path) -> None:
    """``train.py rpe=<preset>``: a 3-step training run from the command line that writes its metrics."""
    result = run_cli("train.py", [
        f"rpe={preset}", "debug=fast", "logger=csv", *SMALL_RELATIONAL, "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=1", f"paths.log_dir={log_dir}", f"run_name={preset}", f"paths.data_dir={data_dir}",
    ])
    assert result.returncode == 0, result.stderr[-3000:]
    assert (log_dir / preset / "metrics.json").is_file()


def cuda_ms_per_step(step: Callable[[], None], warmup: int = 3, steps: int = 20) -> float:
    """Milliseconds per call of ``step`` on CUDA after ``warmup`` calls (for printed speed reports)."""
    import time

    import torch

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - start) / steps


def fit_only(cfg: DictConfig) -> dict:
    """Fit a composed config without the run lifecycle (no run dir, no checkpoints, no result): for tests
    that only check that an experiment's config trains a step. Returns the scalar metrics and global step."""
    from lifecycle.job import build_data_and_model, build_trainer, scalar_metrics

    datamodule, model = build_data_and_model(cfg)
    datamodule.prepare_data()
    trainer = build_trainer(cfg.trainer, cfg.get("callbacks"))
    trainer.fit(model, datamodule=datamodule)
    return {**scalar_metrics(trainer.callback_metrics), "global_step": trainer.global_step}


def swept_job_configs(cfg: Any) -> Iterator[Any]:
    """Each job of a composed sweep config as Hydra's basic sweeper varies it: ``cfg`` with one swept value
    of one key at a time (``hydra.sweeper.params``; needs the Hydra config set)."""
    import copy

    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for key, spec in (HydraConfig.get().sweeper.params or {}).items():
        override = parser.parse_overrides([f"{key}={spec}"])[0]
        values = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
        for value in values:
            job = copy.deepcopy(cfg)
            OmegaConf.update(job, key, value, merge=False)
            yield job


def written_testset_fields(name: str, images: int = 2000) -> dict[str, Any]:
    """What eval.py records of test set ``name`` (``configs/testset/<name>.yaml`` as it is now, its data at
    ``/data``) in a result that read all of its ``images``: for results written by hand in tests."""
    from lifecycle.testset_definition import configured_generator, load_definition, testset_sha256

    definition = load_definition(Path(__file__).resolve().parents[1] / "configs" / "testset" / f"{name}.yaml")
    if isinstance(definition.get("data"), dict) and definition["data"].get("generator") is not None:
        definition["data"]["root"] = f"/data/testsets/{name}"
    sha256 = testset_sha256(definition, configured_generator(definition))
    return {"testset_config": definition, "testset_sha256": sha256, "images_read": images, "images_total": images}


@contextlib.contextmanager
def file_modes_hold() -> Iterator[None]:
    """File modes hold for this thread in the block: root drops the capabilities that override them
    (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH: what ``setpriv`` drops in tests/test_record_bounds.py) from its
    effective set and takes them back after; another user needs nothing."""
    if os.geteuid() != 0:
        yield
        return

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    libc = ctypes.CDLL(None, use_errno=True)
    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3; pid 0: this thread
    if libc.capget(ctypes.byref(header), data) != 0:
        pytest.skip("root without capget: a mode-000 file would be readable, nothing to test")
    saved = data[0].effective
    data[0].effective &= ~((1 << 1) | (1 << 2))  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    if libc.capset(ctypes.byref(header), data) != 0:
        pytest.skip("root cannot drop CAP_DAC_OVERRIDE here: a mode-000 file would be readable, nothing to test")
    try:
        yield
    finally:
        data[0].effective = saved
        assert libc.capset(ctypes.byref(header), data) == 0, "could not take back the capabilities"
