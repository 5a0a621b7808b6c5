"""Lightning plumbing shared by the classification and detection modules and the entry points: atomic
checkpoint writes, the non-finite loss guard, the W&B logger, step costs. A run's resume point and its
checkpoints' run entries are the run package's (`lifecycle.checkpoints`)."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_only

from storage.files import RunFileError, guarded, replace_durably, temp_path_for


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints are written to a temporary file, flushed and renamed, and loaded with ``weights_only``."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if get_filesystem(path).protocol not in ("file", ("file", "local")):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        with guarded(path, "write checkpoint"):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = temp_path_for(path)
            try:
                torch.save(checkpoint, tmp)
                replace_durably(tmp, path)
            except RuntimeError as err:  # torch's writer reports a failed write as "unexpected pos" / "write failed"
                reason = _checkpoint_write_failure(Path(tmp), err)
                Path(tmp).unlink(missing_ok=True)
                raise RunFileError(f"cannot write checkpoint {path}: {reason}") from None
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict:
        checkpoint = torch.load(path, map_location=map_location or "cpu", weights_only=True)
        if isinstance(checkpoint, dict) and get_filesystem(path).protocol in ("file", ("file", "local")):
            for line in rebase_moved_callback_paths(checkpoint, os.path.dirname(os.path.abspath(path))):
                if rank_zero_only.rank == 0:
                    _note(f"note: {path}: {line}")
            dropped = confine_callback_paths(checkpoint, os.path.dirname(os.path.abspath(path)))
            if dropped and rank_zero_only.rank == 0:
                _note(f"note: {path}: dropped {len(dropped)} checkpoint path(s) its ModelCheckpoint state names"
                      f" outside the run's checkpoints folder {os.path.dirname(os.path.abspath(path))}"
                      f" ({', '.join(map(repr, dropped[:3]))}{', ...' if len(dropped) > 3 else ''}): the run never"
                      " reads or removes a file there")
        return checkpoint


# what a ModelCheckpoint state names files by: Lightning removes the previous best/kth/last file when it saves
_STATE_PATHS = ("best_model_path", "kth_best_model_path", "last_model_path")


# checkpoint entry: the token of the training that saved it, new for each training from scratch and kept by a
# resume (a moved run's files are its own when their tokens agree; the run package records and compares it)
TRAINING_KEY = "run_training"


def _lies_in(path: Any, folder: str) -> bool:
    """Whether ``path`` is a file directly in ``folder`` (a real path) as the system resolves it: symlinks and
    ``..`` (also ``..`` after a symlink) resolved, relative paths from the current folder."""
    return isinstance(path, str) and bool(path) and os.path.dirname(os.path.realpath(path)) == folder


def rebase_moved_callback_paths(checkpoint: dict[str, Any], checkpoints_dir: str) -> list[str]:
    """Move onto ``checkpoints_dir`` (the folder the checkpoint is loaded from, the run's) every ModelCheckpoint
    state in ``checkpoint`` saved in another folder whose files are this run's own, moved or copied with it: each
    path it names lies directly in its saved ``dirpath``, and a file of the same name lies directly in
    ``checkpoints_dir`` and was saved by the same training (the same ``TRAINING_KEY`` token as ``checkpoint``).
    Its ``dirpath`` and paths then name the run's folder and Lightning keeps its scores (the best so far stays the
    best). Returns one line for each state saved elsewhere that is not re-based: `confine_callback_paths` drops its
    paths, and with the best path its score, so the next validation saves its epoch as the best.
    """
    run_checkpoints = os.path.realpath(checkpoints_dir)
    token = checkpoint.get(TRAINING_KEY)
    unreadable = object()  # the token of a file that is no checkpoint: equal to none
    tokens: dict[str, Any] = {}

    def training_of(file: str) -> Any:
        if file not in tokens:
            try:
                saved = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
                tokens[file] = saved.get(TRAINING_KEY) if isinstance(saved, dict) else unreadable
            except Exception:  # unreadable or not a checkpoint: not the run's file
                tokens[file] = unreadable
        return tokens[file]

    lines: list[str] = []
    for name, state in (checkpoint.get("callbacks") or {}).items():
        if not isinstance(state, dict) or not any(k in state for k in _STATE_PATHS):
            continue
        saved_in = state.get("dirpath")
        if not isinstance(saved_in, str) or not saved_in:
            continue
        real = os.path.realpath(saved_in)
        if real == run_checkpoints or real.startswith(run_checkpoints + os.sep):
            continue  # saved in this run's folder: `confine_callback_paths` checks it
        top_k = state.get("best_k_models")
        named = [*(top_k if isinstance(top_k, dict) else ()), *(state.get(k) for k in _STATE_PATHS)]
        rebased: dict[str, str] = {}
        why = None
        for path in (p for p in named if p):
            if not isinstance(path, str) or os.path.dirname(path) != saved_in:
                why = f"it names {path!r} outside that folder"
            else:
                here = os.path.join(run_checkpoints, os.path.basename(path))
                if not (_lies_in(here, run_checkpoints) and os.path.isfile(here)):
                    why = f"{os.path.basename(path)} is not in this run's checkpoints folder"
                elif training_of(here) != token:
                    why = f"this run's {os.path.basename(path)} was saved by another training"
                else:
                    rebased[path] = here
                    continue
            break
        if why is None:
            state["dirpath"] = run_checkpoints
            if isinstance(top_k, dict):
                state["best_k_models"] = {rebased[p]: v for p, v in top_k.items()}
            for key in _STATE_PATHS:
                if state.get(key):
                    state[key] = rebased[state[key]]
            continue
        score = state.get("best_model_score")
        score = f" {float(score):g}" if torch.is_tensor(score) and score.numel() == 1 else ""
        lines.append(f"the {name.split('{')[0]} state was saved in {saved_in} and is not this run's moved or"
                     f" copied state ({why}): its checkpoint paths are dropped and its best score{score} forgotten,"
                     " so the next validation saves its epoch as best.ckpt")
    return lines


def confine_callback_paths(checkpoint: dict[str, Any], checkpoints_dir: str) -> list[str]:
    """Drop from every ModelCheckpoint state in ``checkpoint`` the file paths that do not lie directly in the
    state's ``dirpath``, and every path if that ``dirpath`` is not ``checkpoints_dir`` (the folder the
    checkpoint is loaded from, the run's) or a folder inside it. Returns the paths dropped from the states
    whose ``dirpath`` is the run's (a state claiming the run's folder yet naming files elsewhere: damaged or
    crafted); those of a state saved in another folder are dropped here without a word: a moved or copied run's own
    state is re-based before (`rebase_moved_callback_paths`), which says why it does not re-base any other.

    Lightning restores ``best_k_models`` and the best/kth/last paths from the file and later removes the
    one it replaces (its own check compares paths without resolving ``..``): a path naming another run's
    file would delete that file. A dropped top-k entry empties the top-k bookkeeping (the next validation
    saves anew), a dropped best path also drops its score.
    """
    run_checkpoints = os.path.realpath(checkpoints_dir)
    said: list[str] = []
    for state in (checkpoint.get("callbacks") or {}).values():
        if not isinstance(state, dict) or "dirpath" not in state or not any(k in state for k in _STATE_PATHS):
            continue
        own = state.get("dirpath")
        own = os.path.realpath(own) if isinstance(own, str) and own else None
        if own is not None and own != run_checkpoints and not own.startswith(run_checkpoints + os.sep):
            own = None  # a dirpath outside this run's checkpoints: nothing it names is the run's

        def foreign(path: Any) -> bool:
            return bool(path) and (own is None or not _lies_in(path, own))  # noqa: B023 (used at once)

        dropped: list[str] = []
        top_k = state.get("best_k_models")
        kth = state.get("kth_best_model_path")
        if isinstance(top_k, dict):
            bad = [p for p in top_k if foreign(p)]
            if bad or foreign(kth) or (kth and kth not in top_k):  # a kth outside the top k: Lightning's pop fails
                dropped += [str(p) for p in bad] + ([str(kth)] if foreign(kth) else [])
                state["best_k_models"], state["kth_best_model_path"] = {}, ""
        elif foreign(kth):
            dropped.append(str(kth))
            state["kth_best_model_path"] = ""
        for key in ("best_model_path", "last_model_path"):
            if foreign(state.get(key)):
                dropped.append(str(state[key]))
                state[key] = ""
                if key == "best_model_path":
                    state["best_model_score"] = None
        if own is not None:
            said += dropped
    return list(dict.fromkeys(said))


def _note(line: str) -> None:
    """Print one line, never failing (a closed terminal must not stop a resume)."""
    try:
        print(line, flush=True)
    except (OSError, ValueError):
        pass


def _checkpoint_write_failure(tmp: Path, err: RuntimeError) -> str:
    """Why torch's writer stopped: a full disk or the process's file-size limit, else torch's own words."""
    import resource
    import shutil

    if shutil.disk_usage(tmp.parent).free < 2**20:
        return "no space left on the device"
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    written = tmp.stat().st_size if tmp.exists() else 0
    if limit != resource.RLIM_INFINITY and written >= limit - 2**16:
        return f"the file-size limit of this process (ulimit -f, {limit} bytes) is smaller than the checkpoint"
    return " ".join(str(err).split())[:200]


class NonFiniteLossError(ValueError):
    """The training loss became NaN or infinite."""


class FiniteLossGuard(L.Callback):
    """Stops the run on a NaN/inf training loss and keeps non-finite weights out of every checkpoint.

    Each step only folds ``isfinite(loss)`` into a flag on the loss's device (no host sync); the flag
    is read every ``trainer.log_every_n_steps`` steps and before any checkpoint is written, which
    raises ``NonFiniteLossError`` naming the first bad step and its loss instead of saving.
    """

    def __init__(self) -> None:
        self._first_bad_step: torch.Tensor | None = None  # -1 while every loss was finite
        self._first_bad_loss: torch.Tensor | None = None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if not torch.is_tensor(loss):
            return
        loss = loss.detach().float()
        if self._first_bad_step is None or self._first_bad_step.device != loss.device:
            self._first_bad_step = torch.full((), -1, dtype=torch.long, device=loss.device)
            self._first_bad_loss = torch.zeros((), device=loss.device)
        first = (self._first_bad_step < 0) & ~torch.isfinite(loss)
        self._first_bad_step = torch.where(first, trainer.global_step, self._first_bad_step)
        self._first_bad_loss = torch.where(first, loss, self._first_bad_loss)
        if trainer.global_step % max(1, trainer.log_every_n_steps) == 0:
            self.check_loss()

    def check_loss(self) -> None:
        """Raise if a training loss so far was not finite (one host sync)."""
        if self._first_bad_step is not None and int(self._first_bad_step) >= 0:
            raise NonFiniteLossError(
                f"training loss is {float(self._first_bad_loss)} at step {int(self._first_bad_step)}; the run "
                "stopped without saving a checkpoint (lower model.optimizer.lr or check the data)"
            )

    @staticmethod
    def check_weights(pl_module: L.LightningModule) -> None:
        """Raise if a weight is not finite (one host sync; the name is looked up only on failure)."""
        params = list(pl_module.parameters())
        if params and not bool(torch.stack([torch.isfinite(p).all() for p in params]).all()):
            name = next(n for n, p in pl_module.named_parameters() if not torch.isfinite(p).all())
            raise NonFiniteLossError(
                f"non-finite weights ({name}) after step {pl_module.global_step}; the run stopped without "
                "saving a checkpoint (lower model.optimizer.lr or check the data)"
            )

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self.check_loss()
        self.check_weights(pl_module)


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
