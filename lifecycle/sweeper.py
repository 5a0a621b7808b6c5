"""The optuna sweep's side of a failed trial (``hydra/sweeper=optuna_rpe``).

A failed job of a sweep is listed and the sweep goes on (`lifecycle.job.run_job` returns NaN for it).
hydra-optuna-sweeper 1.2 tells optuna every trial as finished with its return value; a NaN makes optuna 2.10
refuse the value, and the plugin's own fallback then tells the failure *with* that value, which optuna refuses
too: the sweep ended in two tracebacks and its further trials never ran. Here a trial whose job failed (or gave
no number: a smoke run's) is told to optuna as failed, with no value, before the plugin sees it; the plugin
goes on with the trials that have a value. Like the basic sweeper, the sweep also leaves its config in the sweep
dir (``multirun.yaml``), so that a later launch into that dir can be checked to be the same study. An optuna study
has no fixed grid, so each trial's overrides are recorded as it is launched (`TRIALS_FILE`): the tables then name a
trial that failed before it had a run dir, as they name a grid point of a basic sweep that never ran.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import optuna
from hydra.core.utils import JobReturn
from hydra_plugins.hydra_optuna_sweeper._impl import OptunaSweeperImpl
from omegaconf import OmegaConf

from lifecycle.command import current
from lifecycle.console import one_line, say
from lifecycle.records import TRIALS_FILE


def record_trials(sweep_dir: Path, job_overrides: Any, initial_job_idx: int) -> None:
    """Add a batch of trials (their overrides, numbered from ``initial_job_idx``) to ``sweep_dir``'s `TRIALS_FILE`,
    atomically; an earlier launch's trials into the same dir (the same study, checked) are kept."""
    import yaml

    from storage.files import atomic_write_bytes, read_bounded_bytes

    path = sweep_dir / TRIALS_FILE
    trials: dict[int, list[str]] = {}
    if path.is_file():
        try:
            earlier = yaml.safe_load(read_bounded_bytes(path).decode("utf-8"))
            trials = {int(k): [str(o) for o in v] for k, v in (earlier or {}).get("trials", {}).items()}
        except (OSError, ValueError, TypeError, AttributeError, yaml.YAMLError, RecursionError):
            trials = {}  # a damaged record is replaced by what this launch knows; the runs' own dirs stand
    for n, overrides in enumerate(job_overrides):
        trials[initial_job_idx + n] = [str(o) for o in overrides]
    text = yaml.safe_dump({"trials": dict(sorted(trials.items()))}, sort_keys=False, allow_unicode=True)
    atomic_write_bytes(path, text.encode("utf-8"))


def trial_value(ret: JobReturn) -> float | None:
    """The number a finished job returned, None for a job that failed or returned no number (NaN, None).

    A failed job has already printed its line and joined the sweep's list of failures; an exception that Hydra
    caught around the job (none of this project's jobs lets one out) is printed and listed here.
    """
    import sys

    try:
        value = ret.return_value
    except Exception as err:  # Hydra's JobReturn re-raises what the job raised
        say(f"error: job failed ({ret.working_dir}): {one_line(err)}", stream=sys.stderr)
        current().failed_jobs.append(f"{ret.working_dir}: {one_line(err)}")
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


class _FailuresToldFirst:
    """The sweeper's launcher, wrapped: after a batch of trials ran, each one whose job has no value is told to
    optuna as failed, and the batch the plugin goes on with (its trials and their returns) holds the others."""

    def __init__(self, launcher: Any, sweeper: TrialFailureTelling) -> None:
        self.launcher = launcher
        self.sweeper = sweeper

    def launch(self, job_overrides: Any, initial_job_idx: int) -> list[JobReturn]:
        record_trials(Path(str(self.sweeper.config.hydra.sweep.dir)), job_overrides, initial_job_idx)
        returns = list(self.launcher.launch(job_overrides, initial_job_idx))
        trials = self.sweeper.batch
        kept = []
        for trial, ret in zip(trials, returns, strict=True):
            if trial_value(ret) is None:
                trial.study.tell(trial, state=optuna.trial.TrialState.FAIL)  # a failure carries no value
            else:
                kept.append((trial, ret))
        trials[:] = [trial for trial, _ in kept]  # the list the plugin pairs with the returns
        # the plugin numbers the next batch's jobs by the returns it got: count the failed ones too
        self.sweeper.job_idx += len(returns) - len(kept)
        return [ret for _, ret in kept]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.launcher, name)


class TrialFailureTelling(OptunaSweeperImpl):
    """hydra-optuna-sweeper's implementation with a failed trial told as failed (`_FailuresToldFirst`)."""

    batch: list[Any]  # the trials of the batch being launched: the plugin's own list, which it pairs with returns
    study: Any = None  # the plugin's study (its trials know it)

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.launcher = _FailuresToldFirst(self.launcher, self)
        self.batch = []

    def _configure_trials(self, trials: list[Any], search_space_distributions: dict[str, Any],
                          fixed_params: dict[str, Any]) -> Any:
        self.batch = trials
        self.study = trials[0].study if trials else self.study
        return super()._configure_trials(trials, search_space_distributions, fixed_params)

    def sweep(self, arguments: list[str]) -> None:
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")  # as Hydra's basic sweeper leaves it
        try:
            super().sweep(arguments)
        except ValueError:
            study = self.study
            if study is None or any(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials):
                raise
            # optuna has no best trial to report when none finished with a value; the failures are listed after
            say(f"note: no trial of the optuna study in {sweep_dir} finished with a value, so it has no best"
                " trial (no optimization_results.yaml)")
