"""Shared fixtures: compose Hydra configs the way train.py does, on small stand-in data."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "configs"

# `make test` runs two pytest-xdist workers on a 2-core machine. With torch's default of one intra-op
# thread per core, each worker (and each train.py it starts) would spin-wait for the other's core, which
# made the training tests three times slower; one thread per process keeps both cores busy with work.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)

# A small relational-shapes set keeps the end-to-end tests within the suite's time budget.
SMALL_RELATIONAL = [
    "data.root=${paths.data_dir}/relational_small", "data.generator.num_train=4096", "data.generator.num_val=512",
    "data.num_workers=0",
]
# 256 steps: with the mini recipe's fixed sin-cos APE the micro DeiT passes 80 % after its first epoch
# (with a learned APE it would first sit on the ln(8) plateau for a seed-dependent number of epochs).
LEARNING_BUDGET = ["data.batch_size=32", "model.optimizer.lr_base_batch=32", "trainer.max_epochs=2",
                   "model.scheduler.warmup_epochs=0.5", "model.net.ape=sincos"]


# The files whose tests run real training for minutes in all, longest first. `make test` hands whole
# files to its workers in collection order (--no-loadscope-reorder), so these go first: a worker left
# alone with one of them at the end would add its whole time to the suite's.
LONG_FILES = ("test_train.py", "test_reliability.py", "test_sweeps.py", "test_rpe_triton.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))  # stable: a file keeps its order


def compose_config(
    overrides: list[str], output_dir: Path, data_dir: Path, config_name: str = "train"
) -> DictConfig:
    """Compose ``configs/<config_name>.yaml`` with ``overrides`` and make it runnable in-process.

    The Hydra runtime (output dir, cwd) is set as ``hydra.main`` would set it, so
    ``train.run(cfg)`` behaves as on the command line.
    """
    from train import normalize_overrides  # `+trainer.limit_train_batches=...` works as on the command line

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


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Generated datasets shared by the whole session (generation is deterministic)."""
    return tmp_path_factory.mktemp("data")


def run_cli(script: str, args: list[str], env_extra: dict[str, str] | None = None, timeout: int = 600):
    """Run ``python <script> args`` from the repository root; returns the CompletedProcess."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, str(ROOT / script), *args], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=timeout,
    )


def check_encoding_everywhere(preset: str, log_dir: Path, data_dir: Path) -> None:
    """``rpe=<preset>``: forward and backward on the micro DeiT and Swin, DETR's encoder on a 3x5 map,
    and a 3-step training run from the command line that writes its metrics."""
    import torch

    from models import create_model
    from models.detr import Transformer

    for name in ("deit_micro_patch4_32", "swin_micro_patch4_window4_32"):
        create_model(name, rpe=preset, num_classes=4)(torch.randn(2, 3, 32, 32)).sum().backward()
    detr = Transformer(dim=32, heads=2, enc_layers=1, dec_layers=1, ffn=32, enc_rpe=preset)
    detr.encode(torch.randn(2, 32, 3, 5), torch.zeros(2, 3, 5, dtype=torch.bool), torch.randn(2, 32, 3, 5))
    result = run_cli("train.py", [
        f"rpe={preset}", "debug=fast", "logger=csv", *SMALL_RELATIONAL, "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=1", f"paths.log_dir={log_dir}", f"run_name={preset}", f"paths.data_dir={data_dir}",
    ])
    assert result.returncode == 0, result.stderr[-3000:]
    assert (log_dir / preset / "metrics.json").is_file()


@pytest.fixture
def one_torch_thread():
    """For tests of tiny tensors: one intra-op thread avoids OpenMP spin-waits on a busy 2-core box."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
