"""Lightning plumbing shared by the classification and detection modules and the entry points."""

from __future__ import annotations

import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

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
        return torch.load(path, map_location=map_location or "cpu", weights_only=True)


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


# what every checkpoint Lightning writes holds, and its restore requires
LIGHTNING_VERSION_KEY = "pytorch-lightning_version"


def load_checkpoint(path: str | os.PathLike, mmap: bool = False) -> dict[str, Any]:
    """Load a Lightning checkpoint on the CPU without unpickling arbitrary objects.

    ``mmap=True`` maps the tensors instead of reading them: cheap for checking a large checkpoint. A file that
    loads but holds no Lightning checkpoint (a list, a bare state dict, a step count that is no integer) raises
    ``ValueError`` naming it, as an unreadable one raises torch's error: callers treat both as unreadable.
    """
    saved = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    if not isinstance(saved, dict) or not isinstance(saved.get("state_dict"), dict):
        raise ValueError(f"{path} holds no Lightning checkpoint (a {type(saved).__name__} without a state_dict)")
    if not isinstance(saved.get(LIGHTNING_VERSION_KEY), str):  # Lightning's restore reads it first
        raise ValueError(f"{path} holds no Lightning checkpoint (no {LIGHTNING_VERSION_KEY} entry)")
    for key in ("epoch", "global_step"):
        if isinstance(saved.get(key), bool) or not isinstance(saved.get(key), int):
            raise ValueError(f"{path} holds no Lightning checkpoint: its {key} is {saved.get(key)!r}, not a count")
    return saved



# ----------------------------------------------------------------------------- resume and faults
IDENTITY_KEY = "run_identity"  # checkpoint entry: the identity hash of the run that saved it


def rng_states() -> dict[str, Any]:
    """The global RNG states a training step draws from: Python, NumPy, torch CPU and CUDA."""
    import random

    import numpy as np

    np_state = np.random.get_state()
    states: dict[str, Any] = {
        "python": list(random.getstate()[1]), "python_pos": random.getstate()[2],
        "numpy": torch.from_numpy(np_state[1].copy()), "numpy_pos": int(np_state[2]),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what ``rng_states`` returned (the pieces ``weights_only`` loading accepts: lists, tensors)."""
    import random

    import numpy as np

    random.setstate((3, tuple(states["python"]), states["python_pos"]))
    np.random.set_state(("MT19937", states["numpy"].numpy().astype(np.uint32), states["numpy_pos"], 0, 0.0))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class RunInterrupted(BaseException):
    """Raised when a stop signal stopped a run (after its checkpoint was saved, during fit).

    A ``BaseException``, like ``KeyboardInterrupt``: an ``except Exception`` on the way (Python's logging
    prints and swallows what its handlers raise) must not turn an interrupted run into a finished one.
    """

    def __init__(self, signum: int) -> None:
        import signal

        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


class NonFiniteLossError(ValueError):
    """The training loss became NaN or infinite."""


LENGTH_KEY = "run_length"


class ResumeCheckpoint(Checkpoint):
    """Writes ``<dirpath>/last.ckpt``, the point a rerun resumes from, with everything an exact resume needs.

    Saved at the end of every training epoch (whether or not the monitored metric improved), every
    ``every_n_train_steps`` steps when set, and when a signal stops the run (``stop_signal`` set by a
    signal handler; the run stops at the next batch boundary). Every checkpoint of the run (also
    ``best.ckpt``) carries the run's ``identity``, the global RNG states and the training loader's
    position (epoch, batches done); both are restored when training resumes from it.
    """

    def __init__(self, dirpath: str, every_n_train_steps: int | None = None, filename: str = "last") -> None:
        if every_n_train_steps is not None and every_n_train_steps < 1:
            raise ValueError(f"every_n_train_steps={every_n_train_steps} must be >= 1 or null")
        self.dirpath = dirpath
        self.filename = filename
        self.every_n_train_steps = every_n_train_steps
        self.identity: str | None = None  # set by train.py
        self.length: dict[str, Any] | None = None  # the run's length, set by train.py
        self.stop_signal: int | None = None
        self._rng_to_restore: dict[str, Any] | None = None

    @property
    def path(self) -> str:
        return os.path.join(self.dirpath, f"{self.filename}.ckpt")

    def _save(self, trainer: L.Trainer) -> None:
        # the full training state (optimizer, loops, callbacks) for resuming; naming it also keeps Lightning from
        # logging "weights_only was not set, defaulting to False", which reads like an unsafe load
        trainer.save_checkpoint(self.path, weights_only=False)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._rng_to_restore is not None:
            set_rng_states(self._rng_to_restore)
            self._rng_to_restore = None
        position = getattr(trainer.datamodule, "resume_position", None)
        if position is not None and position[1] > 0:  # the training loader's sampler did not take it
            sampler = type(getattr(trainer.train_dataloader, "sampler", None)).__name__
            rank_zero_warn(f"resumed in the middle of epoch {position[0]} ({position[1]} batches done), but the"
                           f" training loader's sampler ({sampler}) cannot skip them: this epoch sees them again")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self.stop_signal is not None:
            if trainer.world_size > 1:
                # Ranks may see the signal at different steps: let Lightning broadcast rank 0's flag and
                # stop every rank together at the next step (SIGTERMException, saved in on_exception).
                trainer._signal_connector.received_sigterm = True
            else:
                self._save(trainer)
                raise RunInterrupted(self.stop_signal)
        if self.every_n_train_steps and trainer.global_step % self.every_n_train_steps == 0:
            self._save(trainer)

    def on_validation_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        # A stop during fit's validation waits for the validation to end: stopped halfway, the epoch would
        # resume past its validation, and best.ckpt would miss it. Lightning stops mid-validation on SIGTERM.
        if self.stop_signal is not None and not trainer.sanity_checking:
            trainer._signal_connector.received_sigterm = False

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save(trainer)
        if self.stop_signal is not None:
            # Stop at the epoch's boundary, once every on_train_epoch_end hook (best.ckpt's too) has run:
            # Lightning raises SIGTERMException there, and on_exception saves that state.
            trainer._signal_connector.received_sigterm = True

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        # Lightning stops on SIGTERM at a loop boundary (validation, epoch end, DDP step start): a
        # consistent state to save. Other exceptions may strike mid-step: resume from the last save.
        if isinstance(exception, SIGTERMException) and trainer.global_step > 0:
            self._save(trainer)

    @staticmethod
    def loader_position(trainer: L.Trainer) -> tuple[int, int]:
        """``(epoch, batches of it trained)``: where the training loader resumes (0 batches once the
        epoch's training part is done)."""
        epochs = trainer.fit_loop.epoch_progress.current
        in_epoch = epochs.started > epochs.processed
        return epochs.processed, trainer.fit_loop.epoch_loop.batch_progress.current.processed if in_epoch else 0

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint[IDENTITY_KEY] = self.identity
        if self.length is not None:
            checkpoint[LENGTH_KEY] = self.length  # which of a run dir's lengths (extensions) saved it
        checkpoint["rng_states"] = rng_states()
        checkpoint["loader_position"] = list(self.loader_position(trainer))

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # Restored before the Trainer first builds the training loader (the datamodule hands the
        # position to its sampler, ``data.datamodule.make_loader``); the RNG states once training starts.
        self._rng_to_restore = checkpoint.get("rng_states")
        if trainer.datamodule is not None and "loader_position" in checkpoint:
            trainer.datamodule.resume_position = tuple(checkpoint["loader_position"])
            # Lightning warns of "unreliable results" on any mid-epoch resume whose loader has no state_dict;
            # ours resumes through its sampler, and on_train_start warns when the sampler could not
            warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the"
                                                      " epoch ended")


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
