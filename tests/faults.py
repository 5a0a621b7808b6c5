"""Faults injected into real training runs by the reliability tests (loaded through Hydra ``_target_``)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import lightning as L


class SignalAt(L.Callback):
    """Sends ``signum`` to this process once, after training step ``step``; ``marker`` records that it did.

    A second run with the same command (the resume) finds the marker and lets training go on. With
    ``then_raise`` set, the step then raises ``RuntimeError(then_raise)``: what a DataLoader whose worker
    died of the same scancel raises while the main process is still finishing its step.
    """

    def __init__(self, step: int, marker: str, signum: int = int(signal.SIGKILL), then_raise: str | None = None
                 ) -> None:
        self.step, self.marker, self.signum, self.then_raise = step, Path(marker), signum, then_raise

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step and not self.marker.exists():
            self.marker.write_text(str(self.signum))
            os.kill(os.getpid(), self.signum)
            if self.then_raise:
                raise RuntimeError(self.then_raise)



class SignalIn(L.Callback):
    """Sends ``signum`` to this process once, in the first batch of a phase: ``validation`` (of fit's epoch
    ``epoch``, never the sanity check) or ``test``; ``marker`` records that it did."""

    def __init__(self, phase: str, marker: str, signum: int = int(signal.SIGTERM), epoch: int = 0) -> None:
        self.phase, self.marker, self.signum, self.epoch = phase, Path(marker), signum, epoch

    def _send(self) -> None:
        if not self.marker.exists():
            self.marker.write_text(str(self.signum))
            os.kill(os.getpid(), self.signum)

    def on_validation_batch_end(self, trainer: L.Trainer, *args) -> None:
        if self.phase == "validation" and not trainer.sanity_checking and trainer.current_epoch == self.epoch:
            self._send()

    def on_test_batch_start(self, trainer: L.Trainer, *args) -> None:
        if self.phase == "test":
            self._send()


class StopAfter(L.Callback):
    """Stops the fit after training step ``step``, as Lightning's own time limit (``trainer.max_time``) does."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


class SignalOnRank(L.Callback):
    """Ends the process of global rank ``rank`` by SIGTERM with the default action after training step ``step``:
    a worker that a stop signal to the process group ends before its handlers are installed."""

    def __init__(self, rank: int = 1, step: int = 1) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)


class SignalRank(L.Callback):
    """Sends ``signum`` to the process of global rank ``rank`` (its handlers installed) after training step
    ``step``: a scheduler's per-task signal, or a stray ``kill``, that reaches one DDP worker only."""

    def __init__(self, rank: int = 1, step: int = 1, signum: int = int(signal.SIGUSR1)) -> None:
        self.rank, self.step, self.signum = rank, step, signum

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


class RaiseOnRank(L.Callback):
    """Raises ``RuntimeError`` in the process of global rank ``rank`` after training step ``step``: a DDP
    worker that fails while its parent goes on."""

    def __init__(self, rank: int = 1, step: int = 1) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            raise RuntimeError(f"injected failure of rank {self.rank}")


class SaveAtLastBatchThenKill(L.Callback):
    """What an earlier version left when stopped after an epoch's last training batch: ``last.ckpt`` saved at
    that batch's end (before the epoch's validation and end), then the process gone (SIGKILL), after training
    step ``step``; ``marker`` records that it did."""

    def __init__(self, step: int, marker: str) -> None:
        self.step, self.marker = step, Path(marker)

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step and not self.marker.exists():
            resume = next(c for c in trainer.callbacks if type(c).__name__ == "ResumeCheckpoint")
            trainer.save_checkpoint(resume.path, weights_only=False)
            self.marker.write_text("saved")
            os.kill(os.getpid(), signal.SIGKILL)
