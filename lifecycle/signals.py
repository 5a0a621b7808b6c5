"""Stop signals: SIGTERM, SIGUSR1, SIGUSR2 (SLURM, submitit) and SIGHUP (a closed terminal or SSH session).

During ``fit`` a signal only asks `ResumeCheckpoint` to save ``last.ckpt`` and stop at the next safe point
(a batch end, or the end of a validation in progress); elsewhere it raises `RunInterrupted` at once.
`RunInterrupted` is a ``BaseException``, so no ``except Exception`` (Python's logging, a library's retry
loop) can swallow it, and a signal seen at any moment of a job keeps that job from being recorded as
finished (`stop_signals().received`, kept by the current `lifecycle.command.Command`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from data.datamodule import STOP_SIGNALS
from lifecycle.checkpoints import RunInterrupted
from lifecycle.command import StopSignalState, current


def stop_signals() -> StopSignalState:
    """The current command's stop-signal state: the signal received during its job, the fit it goes to."""
    return current().signals


def _detach_closed_terminal(signum: int) -> None:
    """After SIGHUP the terminal is gone: writing to it would fail (EIO), so output goes to /dev/null."""
    if signum != getattr(signal, "SIGHUP", None):
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and stream.isatty():
                stream.flush()
                os.dup2(devnull, stream.fileno())
        except (OSError, ValueError):
            pass
    os.close(devnull)


def _on_stop_signal(signum: int, frame: Any) -> None:
    _detach_closed_terminal(signum)
    state = stop_signals()
    state.received = signum
    if state.checkpoint is not None:
        state.checkpoint.stop_signal = signum
    else:
        raise RunInterrupted(signum)


def install_stop_signals(interrupt: bool = False) -> None:
    """Route the stop signals to `_on_stop_signal` (main thread only: Python delivers signals there);
    ``interrupt``: Ctrl-C (SIGINT) too, for a command without a fit to stop at a safe point (an evaluation):
    Lightning would turn its ``KeyboardInterrupt`` into exit 1 without a word."""
    if threading.current_thread() is not threading.main_thread():
        return
    state = stop_signals()
    state.held += 1
    for signum in (*STOP_SIGNALS, *((signal.SIGINT,) if interrupt else ())):
        previous = signal.signal(signum, _on_stop_signal)
        if previous is not _on_stop_signal:
            state.previous[signum] = previous


def restore_stop_signals() -> None:
    """After a job, the stop signals (and SIGINT, where `install_stop_signals` took it) get back the handlers
    they had (default: end the process): a signal while the process exits (Python's atexit callbacks) then
    ends it without a traceback, and no job is left to record anything. Only the last holder restores them: a
    job inside a sweep leaves them to the sweep."""
    if threading.current_thread() is not threading.main_thread():
        return
    state = stop_signals()
    state.held = max(state.held - 1, 0)
    if state.held:
        return
    state.reset()  # no job is running: a signal now interrupts at once
    for signum in STOP_SIGNALS:
        previous = state.previous.get(signum)
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
    if signal.getsignal(signal.SIGINT) is _on_stop_signal:
        previous = state.previous.get(signal.SIGINT)
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


@contextlib.contextmanager
def exit_when_interrupted(command: str, outcome: str | Callable[[], str]) -> Iterator[None]:
    """Around an evaluation (a ``trainer.test``, with no fit to stop at a safe point) or a script's writing: a stop
    signal or Ctrl-C raises `RunInterrupted` at once, which ends the process with exit code ``128 + signum`` and
    one line, ``error: <command> interrupted by <SIGNAL>; <outcome>`` (what was written: results are written whole,
    after their test, or not at all; a callable ``outcome`` says it when the signal came). The handlers the
    process had are back after the block."""
    stop_signals().reset()
    install_stop_signals(interrupt=True)  # before any Trainer: Lightning then leaves SIGTERM to us
    try:
        yield
    except RunInterrupted as err:
        from lifecycle.console import say

        said = outcome() if callable(outcome) else outcome
        say(f"error: {command} interrupted by {signal.Signals(err.signum).name}; {said}", stream=sys.stderr)
        raise SystemExit(128 + err.signum) from None
    finally:
        restore_stop_signals()


def chain_previous_handler(signum: int) -> None:
    """Let a launcher's own handler (submitit requeues on SIGUSR2) act once our checkpoint is saved."""
    previous = stop_signals().previous.get(signum)
    if callable(previous):
        previous(signum, None)
