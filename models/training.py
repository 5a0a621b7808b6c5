"""Lightning plumbing shared by the classification and detection modules and the entry points."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO


def atomic_write_bytes(path: str | os.PathLike, payload: bytes) -> None:
    """Write ``payload`` to ``path`` so that readers see the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | os.PathLike, data: Any) -> None:
    atomic_write_bytes(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints are written to a temporary file and renamed, and loaded with ``weights_only``."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if get_filesystem(path).protocol not in ("file", ("file", "local")):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        try:
            torch.save(checkpoint, tmp)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict:
        return torch.load(path, map_location=map_location or "cpu", weights_only=True)


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a Lightning checkpoint on the CPU without unpickling arbitrary objects."""
    return torch.load(path, map_location="cpu", weights_only=True)


def wandb_logger(
    project: str | None = None, mode: str | None = None, sweep: str | None = None, **kwargs: Any
) -> WandbLogger:
    """A W&B logger that stays offline unless the user names a ``project`` or a ``mode``.

    The runs of one sweep share a group named after it (``sweep``), else ``group`` applies.
    """
    if sweep:
        kwargs["group"] = sweep
    if mode is None:
        mode = "online" if project else "offline"
    os.environ.setdefault("WANDB_SILENT", "true")
    return WandbLogger(project=project or "rpe-vision", mode=mode, **kwargs)


class SavedTensorMeter:
    """Bytes of the tensors autograd keeps for backward (distinct storages counted once)."""

    def __init__(self) -> None:
        self.storages: dict[int, int] = {}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())


class StepCostMeter(L.Callback):
    """Training cost of a run, logged once per epoch for tables and the ``cost`` ablation.

    ``cost/step_ms``: median wall time of a training step (forward, backward, optimizer) after the
    first ``warmup_steps`` of the run; ``cost/peak_mem_mb``: peak CUDA allocation (GPU runs);
    ``cost/activation_mb``: bytes autograd saves for backward in one step (CPU runs: the activation
    memory, which is what relative position terms add to).
    """

    def __init__(self, warmup_steps: int = 5) -> None:
        self.warmup_steps = warmup_steps
        self.step_ms: list[float] = []
        self.activation_bytes: int | None = None
        self._started = 0.0
        self._seen = 0
        self._hooks: Any = None
        self._meter: SavedTensorMeter | None = None

    @staticmethod
    def _sync(pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._seen += 1
        if self._seen == self.warmup_steps and pl_module.device.type == "cpu":
            self._meter = SavedTensorMeter()
            self._hooks = torch.autograd.graph.saved_tensors_hooks(self._meter.pack, lambda t: t)
            self._hooks.__enter__()
        self._sync(pl_module)
        self._started = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._sync(pl_module)
        if self._seen > self.warmup_steps:
            self.step_ms.append((time.perf_counter() - self._started) * 1e3)
        if self._hooks is not None:
            self._hooks.__exit__(None, None, None)
            self.activation_bytes = self._meter.bytes
            self._hooks = self._meter = None

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        values: dict[str, float] = {}
        if self.step_ms:
            values["cost/step_ms"] = statistics.median(self.step_ms)
        if pl_module.device.type == "cuda":
            values["cost/peak_mem_mb"] = torch.cuda.max_memory_allocated(pl_module.device) / 2**20
        elif self.activation_bytes is not None:
            values["cost/activation_mb"] = self.activation_bytes / 2**20
        for key, value in values.items():
            pl_module.log(key, value, on_epoch=True, rank_zero_only=True)


class LogHyperparams(L.Callback):
    """Logs ``hparams`` (the resolved RPE fields, APE, seed, sweep) to every logger when fitting starts.

    Logged from the training process itself: a logger touched in the launching process would carry
    a stale writer into spawned DDP workers.
    """

    def __init__(self, hparams: dict[str, Any]) -> None:
        self.hparams = hparams

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_hyperparams(self.hparams)
