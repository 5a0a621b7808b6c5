"""The SLURM launcher's side of a refused submission (``hydra/launcher=slurm``).

hydra-submitit-launcher hands a sweep's jobs to ``sbatch``. When sbatch refuses them (an invalid partition or
account, a limit of the cluster), submitit raised its ``FailedJobError`` through Hydra's multirun: a traceback
of 35 lines, exit 1, and the sweep dir left behind with its grid and submitit's files but no job. Here the
refusal is one line naming sbatch's answer, exit 2 (a setting the scheduler does not take), and when no job of
the command was submitted what it wrote into the sweep dir is taken back (`lifecycle.cli.take_back_sweep_dir`).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from lifecycle.cli import take_back_sweep_dir
from lifecycle.command import current
from lifecycle.console import say


class SubmissionRefused(Exception):
    """The scheduler's submission command failed: its answer, in one line."""


@contextlib.contextmanager
def _submission_command_watched() -> Iterator[None]:
    """Around a launch: submitit's submission command (sbatch) tells a refusal as `SubmissionRefused` and prints
    nothing itself (submitit prints sbatch's error output before raising, which would be a second line)."""
    from submitit.core.core import PicklingExecutor as Executor
    from submitit.core.utils import FailedJobError, FailedSubmissionError

    original = Executor._submit_command

    def watched(executor: Any, command: str) -> Any:
        quiet = io.StringIO()
        try:
            with contextlib.redirect_stderr(quiet):
                job = original(executor, command)
        except (FailedJobError, OSError) as err:  # sbatch's non-zero exit; or sbatch that cannot be run at all
            # the error's own text is sbatch's answer (its cause is only the exit status)
            raise SubmissionRefused(" ".join(str(err).split()) or quiet.getvalue().strip()) from err
        except FailedSubmissionError as err:  # sbatch answered 0 with no job id: a job may be queued
            current().submissions_accepted += 1
            raise SubmissionRefused(f"{' '.join(str(err).split())} (a job may have been queued: see squeue)") from err
        current().submissions_accepted += 1
        sys.stderr.write(quiet.getvalue())
        return job

    Executor._submit_command = watched  # type: ignore[method-assign]
    try:
        yield
    finally:
        Executor._submit_command = original  # type: ignore[method-assign]


def launch_or_refuse(launch: Callable[[], Sequence[Any]], sweep_dir: Path, scheduler: str = "sbatch") -> Sequence[Any]:
    """``launch()``'s job returns; a submission ``scheduler`` refuses is one ``error:`` line and exit 2, after what
    this command wrote into ``sweep_dir`` is taken back if none of its jobs was submitted."""
    submitit = sweep_dir / ".submitit"
    try:
        before = set(os.listdir(submitit)) if submitit.is_dir() else None
    except OSError:
        before = None
    try:
        with _submission_command_watched():
            return launch()
    except SubmissionRefused as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        accepted = current().submissions_accepted  # a sweep submits in batches: earlier ones may be queued
        if accepted:
            outcome = f"{accepted} submission(s) of this sweep may be queued, so {sweep_dir} is kept"
        elif take_back_sweep_dir(sweep_dir, before):
            outcome = f"nothing was submitted, and the sweep dir {sweep_dir} this command made was removed"
        else:
            outcome = f"nothing was submitted, and {sweep_dir} holds nothing of this command"
        say(f"error: {scheduler} refused the sweep's jobs: {err}; {outcome}; valid: hydra.launcher settings"
            f" (partition, account, qos, ...) that {scheduler} accepts on this cluster", stream=sys.stderr)
        sys.exit(2)
