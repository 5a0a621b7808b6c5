"""Lightning plumbing shared by the classification and detection modules and the entry points."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

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


def wandb_logger(project: str | None = None, mode: str | None = None, **kwargs: Any) -> WandbLogger:
    """A W&B logger that stays offline unless the user names a ``project`` or a ``mode``."""
    if mode is None:
        mode = "online" if project else "offline"
    os.environ.setdefault("WANDB_SILENT", "true")
    return WandbLogger(project=project or "rpe-vision", mode=mode, **kwargs)
