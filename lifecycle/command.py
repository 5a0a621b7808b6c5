"""What one command (a ``train.py``, ``eval.py`` or script invocation) keeps across its jobs.

A sweep runs several jobs in one process, and some facts outlive a job: the jobs that failed (listed when the
sweep ends), what the command's checks changed in a sweep dir (taken back when nothing could be submitted),
how many submissions a scheduler accepted, the stop-signal state, and the data roots its checks already
walked. They belong to the command, not to the process or the module: `command_scope` opens a fresh `Command`
for the duration of one command (`lifecycle.cli.cli` holds one around the checks and Hydra's whole run), and
`current` finds it. A job run outside a command (a test, a notebook) gets one for its own context on first use.

The command is found through a `contextvars.ContextVar`, so two commands run one after the other in one
process (tests, a notebook) never see each other's failures or signals.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class StopSignalState:
    """The stop signal received during the current job and the fit it goes to (`lifecycle.signals`)."""

    received: int | None = None
    checkpoint: Any = None  # the ResumeCheckpoint of the fit in progress, else None
    previous: dict[int, Any] = field(default_factory=dict)  # the handlers the stop signals had before ours
    held: int = 0  # installs not yet restored: a sweep holds them around its jobs, each job holds them too

    def reset(self) -> None:
        """A new job: no signal seen yet, no fit to stop."""
        self.received = None
        self.checkpoint = None


@dataclass
class SweepDirBefore:
    """What a command's checks changed in a sweep dir before Hydra started (`lifecycle.cli.take_back_sweep_dir`).

    ``made``: the topmost folder they made (None: the sweep dir was there); ``grid``: its ``multirun.yaml`` before
    (None: none); ``grid_copy``: the copy of that grid kept beside it (None: none)."""

    made: Path | None = None
    grid: bytes | None = None
    grid_copy: Path | None = None


@dataclass
class Command:
    """One command's state across its jobs."""

    failed_jobs: list[str] = field(default_factory=list)  # "<run dir>: <message>" of its sweep jobs that failed
    sweep_dirs: dict[Path, SweepDirBefore] = field(default_factory=dict)  # by absolute sweep dir
    submissions_accepted: int = 0  # submission commands (sbatch) of this command that succeeded
    signals: StopSignalState = field(default_factory=StopSignalState)
    # data roots (real path, splits) whose files its checks found readable: a sweep's jobs share them, so each is
    # walked once per command, not once per swept value
    readable_data: set[tuple[str, tuple[str, ...]]] = field(default_factory=set)
    interruption_said: bool = False  # its one line about a stop signal was printed
    sweeping: bool = False  # a multirun, also where its jobs run in other processes (a submitit launcher)
    # overrides as typed, by the form Hydra is given (``+a.b=v`` is passed as ``++a.b=v``): lines quote the typed
    typed: dict[str, str] = field(default_factory=dict)


_CURRENT: ContextVar[Command] = ContextVar("rpe_vision_command")


@contextlib.contextmanager
def command_scope() -> Iterator[Command]:
    """A fresh `Command` for the block; the one before it (if any) is current again afterwards."""
    command = Command()
    token = _CURRENT.set(command)
    try:
        yield command
    finally:
        _CURRENT.reset(token)


def current() -> Command:
    """The command in progress: the innermost `command_scope`, else one made for this context on first use."""
    try:
        return _CURRENT.get()
    except LookupError:
        command = Command()
        _CURRENT.set(command)
        return command
