"""A run's checkpoints as the run package uses them: `ResumeCheckpoint` (``last.ckpt``, the resume point, and
the identity, length, RNG states and loader position every checkpoint of a run carries), `load_checkpoint`
(a Lightning checkpoint, loaded without unpickling code) and `RunInterrupted` (a stop signal ended the run)."""

from __future__ import annotations

import os
import warnings
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

# checkpoint entry: the token of the training that saved it (defined where the checkpoint loader reads it);
# ``metrics.json`` and each test-set result record the one of the ``best.ckpt`` they measured
from models.training import TRAINING_KEY

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


LENGTH_KEY = "run_length"


def _fit_loop_state(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The fit loop's saved state in a Lightning checkpoint (``None`` where it holds none: weights only)."""
    state = (checkpoint.get("loops") or {}).get("fit_loop") if isinstance(checkpoint.get("loops"), dict) else None
    return state if isinstance(state, dict) and isinstance(state.get("epoch_progress"), dict) else None


def epoch_counter_problem(checkpoint: dict[str, Any]) -> str | None:
    """Why the fit loop's epoch counters saved in ``checkpoint`` cannot be resumed from, or ``None``.

    Lightning counts each epoch ready, started, processed (its training done, before ``on_train_epoch_end``)
    and completed, in that order, so a saved state has ``ready >= started >= processed >= completed`` within
    one epoch. A resume by an earlier version from a save at an epoch's last batch counted that epoch processed
    twice (processed past ready): from such a state Lightning runs an epoch without a batch, or stops early, and
    the epochs it trained are not known from it.
    """
    state = _fit_loop_state(checkpoint)
    total = (state or {}).get("epoch_progress", {}).get("total")
    if not isinstance(total, dict):
        return None
    counts = [total.get(k) for k in ("ready", "started", "processed", "completed")]
    if not all(isinstance(c, int) for c in counts):
        return None
    ready, started, processed, completed = counts
    if ready >= started >= processed >= completed and ready - completed <= 1:
        return None
    return (f"epoch counters that disagree (ready {ready}, started {started}, processed {processed},"
            f" completed {completed})")


def saved_at_last_batch(checkpoint: dict[str, Any]) -> bool:
    """Whether ``checkpoint`` was saved at the end of an epoch's last training batch, before the epoch's
    validation and end (what an earlier version's stop signal or ``every_n_train_steps`` save did). Lightning
    resumes such a save as a finished epoch but leaves the next epoch unstarted in its counters: that epoch is
    then counted processed without being counted ready, and an extension of the run trains nothing."""
    state = _fit_loop_state(checkpoint)
    if state is None:
        return False
    epochs = state["epoch_progress"].get("total") or {}
    batches = state.get("epoch_loop.batch_progress") or {}
    batch_total = batches.get("total") or {}
    try:
        mid_epoch = epochs["ready"] == epochs["started"] == epochs["processed"] + 1 == epochs["completed"] + 1
        at_batch_end = batch_total["ready"] == batch_total["started"] == batch_total["processed"] == (
            batch_total["completed"] + 1)
    except (KeyError, TypeError):
        return False
    return bool(mid_epoch and at_batch_end and batches.get("is_last_batch"))


def close_last_batch_epoch(checkpoint: dict[str, Any]) -> int:
    """Rewrite, in place, a checkpoint that `saved_at_last_batch` into the state of the next epoch's start (the
    epoch's training is done; its validation and end are not run again); returns the epoch it closed."""
    state = _fit_loop_state(checkpoint)
    assert state is not None
    epochs = state["epoch_progress"]
    closed = int(epochs["total"]["processed"])
    for tracker in (epochs["total"], epochs["current"]):
        tracker["processed"] = tracker["completed"] = tracker["ready"]
    batches = state["epoch_loop.batch_progress"]
    for tracker in (batches["total"], batches["current"]):
        tracker["completed"] = tracker["processed"]
    stepped = state.get("epoch_loop.state_dict")
    if isinstance(stepped, dict) and isinstance(stepped.get("_batches_that_stepped"), int):
        # counted after on_train_batch_end, the hook that saved: the step of that batch is not in it yet
        stepped["_batches_that_stepped"] += 1
    checkpoint["loader_position"] = [int(epochs["total"]["ready"]), 0]
    return closed


def _signal_noted_elsewhere(signum: int, frame: Any) -> None:
    """Lightning's SIGTERM notifier for a run of several processes: nothing (see `ResumeCheckpoint.setup`)."""


class ResumeCheckpoint(Checkpoint):
    """Writes ``<dirpath>/last.ckpt``, the point a rerun resumes from, with everything an exact resume needs.

    Saved at the end of every training epoch (whether or not the monitored metric improved), every
    ``every_n_train_steps`` steps when set, and when a signal stops the run (``stop_signal`` set by a
    signal handler; the run stops at the next batch boundary, or, after an epoch's last training batch, once
    that epoch's validation and end are done: Lightning resumes a save at an epoch's last batch as a finished
    epoch whose validation never ran, and leaves its epoch counters one apart). Every checkpoint of the run (also
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
        self.training: str | None = None  # the training's token (`TRAINING_KEY`), set by train.py
        self.stop_signal: int | None = None
        self._rng_to_restore: dict[str, Any] | None = None
        self._closed_epoch: int | None = None  # an epoch `close_last_batch_epoch` closed on load

    @property
    def path(self) -> str:
        return os.path.join(self.dirpath, f"{self.filename}.ckpt")

    def _save(self, trainer: L.Trainer) -> None:
        # the full training state (optimizer, loops, callbacks) for resuming; naming it also keeps Lightning from
        # logging "weights_only was not set, defaulting to False", which reads like an unsafe load
        trainer.save_checkpoint(self.path, weights_only=False)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.world_size > 1:
            # Lightning's own SIGTERM handler broadcasts from inside the handler, on each rank as the signal lands:
            # a rank signalled twice (its process group's TERM, then rank 0's forwarded one) entered a broadcast
            # the others never did, and every rank hung, deaf to further signals. Its handlers are registered
            # after this hook, from this attribute. The stop is this callback's: each rank's handler notes the
            # signal (`lifecycle.signals`), and the ranks agree on it at a step's end (`_stop_together`).
            trainer._signal_connector._sigterm_notifier_fn = _signal_noted_elsewhere

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._rng_to_restore is not None:
            set_rng_states(self._rng_to_restore)
            self._rng_to_restore = None
        if self._closed_epoch is not None:
            # the closed epoch's end, where Lightning steps the schedulers that step once an epoch, never ran
            for config in trainer.lr_scheduler_configs:
                if config.interval == "epoch" and not config.reduce_on_plateau and config.frequency and (
                        self._closed_epoch + 1) % config.frequency == 0:
                    pl_module.lr_scheduler_step(config.scheduler, None)
            self._closed_epoch = None
        position = getattr(trainer.datamodule, "resume_position", None)
        if position is not None and position[1] > 0:  # the training loader's sampler did not take it
            sampler = type(getattr(trainer.train_dataloader, "sampler", None)).__name__
            rank_zero_warn(f"resumed in the middle of epoch {position[0]} ({position[1]} batches done), but the"
                           f" training loader's sampler ({sampler}) cannot skip them: this epoch sees them again")

    def _stop_together(self, trainer: L.Trainer) -> bool:
        """Whether the ranks of a run of several processes stop here, all of them: each rank's stop signal (its
        number, 0 for none) is all-reduced to the largest, so a signal that reached one rank only (a scheduler's
        per-task signal, a stray ``kill``) stops every rank at this same point, and each records it. A rank that
        stopped on its own flag had left the others waiting for it in their next collective, forever. A
        collective of one number at each step's end, on every rank alike."""
        mine = self.stop_signal or 0
        flag = torch.tensor([mine], dtype=torch.int64, device=trainer.strategy.root_device)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        signum = int(flag.item())
        if signum and self.stop_signal is None:  # another rank's signal: this rank's job is interrupted by it too
            from lifecycle.command import current

            self.stop_signal = signum
            current().signals.received = signum
        return bool(signum)

    @staticmethod
    def _at_epochs_last_batch(trainer: L.Trainer) -> bool:
        """Whether the batch that just ended is its epoch's last training batch."""
        batches = trainer.fit_loop.epoch_loop.batch_progress
        return bool(batches.is_last_batch) or batches.current.ready >= trainer.num_training_batches

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        # Nothing is saved at an epoch's last batch: the epoch's end saves (and stops) after its validation.
        # Lightning resumes such a save as a finished epoch without its validation and counts the next epoch
        # processed but never ready, so an extension of the run believed its added epoch trained.
        last_batch = self._at_epochs_last_batch(trainer)
        if trainer.world_size > 1:
            # every rank raises SIGTERMException at this batch's end (saved in on_exception), or at the epoch's
            # end after its last batch: Lightning raises it mid-epoch only while the epoch has batches left
            if self._stop_together(trainer):
                trainer._signal_connector.received_sigterm = True
        elif self.stop_signal is not None and not last_batch:
            self._save(trainer)
            raise RunInterrupted(self.stop_signal)
        if self.every_n_train_steps and trainer.global_step % self.every_n_train_steps == 0 and not last_batch:
            self._save(trainer)

    def on_validation_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        # A stop during fit's validation waits for the validation to end: stopped halfway, the epoch would
        # resume past its validation, and best.ckpt would miss it. Lightning stops mid-validation on SIGTERM.
        if self.stop_signal is not None and not trainer.sanity_checking:
            trainer._signal_connector.received_sigterm = False

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save(trainer)
        stopping = self._stop_together(trainer) if trainer.world_size > 1 else self.stop_signal is not None
        if stopping:
            # Stop at the epoch's boundary, once every on_train_epoch_end hook (best.ckpt's too) has run:
            # Lightning raises SIGTERMException there, on every rank, and on_exception saves that state.
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
        if self.training is not None:
            checkpoint[TRAINING_KEY] = self.training
        checkpoint["rng_states"] = rng_states()
        checkpoint["loader_position"] = list(self.loader_position(trainer))
        epochs = trainer.fit_loop.epoch_progress.total
        if epochs.ready == epochs.started == epochs.processed == epochs.completed > 0:
            # saved between epochs (a stop at an epoch's end): Lightning's ``epoch`` is then the next epoch, while
            # a checkpoint's epoch is the one it was saved in (0-based), which the run's length is checked against
            checkpoint["epoch"] = epochs.completed - 1

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # Restored before the Trainer first builds the training loader (the datamodule hands the
        # position to its sampler, ``data.datamodule.make_loader``); the RNG states once training starts.
        self._rng_to_restore = checkpoint.get("rng_states")
        if saved_at_last_batch(checkpoint):  # by an earlier version: resumed at the next epoch's start instead
            from lightning.pytorch.utilities.rank_zero import rank_zero_only

            from lifecycle.console import say

            self._closed_epoch = close_last_batch_epoch(checkpoint)
            if rank_zero_only.rank == 0:
                say(f"note: the checkpoint was saved after epoch {self._closed_epoch}'s last training batch, before"
                    " its validation (by an earlier version): resuming at the next epoch; that epoch is not validated")
        if trainer.datamodule is not None and "loader_position" in checkpoint:
            trainer.datamodule.resume_position = tuple(checkpoint["loader_position"])
            # Lightning warns of "unreliable results" on any mid-epoch resume whose loader has no state_dict;
            # ours resumes through its sampler, and on_train_start warns when the sampler could not
            warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the"
                                                      " epoch ended")
