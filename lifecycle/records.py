"""A run dir's records: what each file is, who may write it, and what state a run dir is in.

``<run dir>/`` holds ``run.json`` (identity, config, length, state), ``config.yaml`` (the resolved config),
``.hydra/`` (Hydra's config, hydra config and overrides), ``metrics.json`` (the result), ``failed.json``
(why the run failed), ``run.lock`` (held by the process running the job) and ``checkpoints/``
(``last.ckpt``: the resume point; ``best.ckpt``: the result's weights).

`RunRecord` is the only writer of ``run.json``: it keeps the record in memory, so a state is never written
without the identity it belongs to. `run_status` is the only reader that tables and archives use: it never
writes, and names each damaged file instead of guessing.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lifecycle.identity import identity_hash
from storage.files import (
    CHECKSUM,
    RunFileError,
    atomic_write_json,
    check_plain_file,
    checksum_problem,
    describe_non_file,
    guarded,
    read_json,
)
from storage.run_dir import CHECKPOINTS, CONFIG, METRICS, RUN_RECORD

# A benchmark task's pre-registered findings (findings/<ablation>.yaml), and the copy a run takes of its
# task's file when it starts, which shows which findings existed before the run's results did
FINDINGS_DIR = Path(__file__).resolve().parents[1] / "findings"
FINDINGS_SNAPSHOT = "findings.yaml"
# The trials an optuna sweep launched, by job number (`lifecycle.sweeper.record_trials`), in its sweep dir:
# ``{"trials": {<num>: [<override>, ...]}}``; the tables read it as a basic sweep's grid
TRIALS_FILE = "trials.yaml"
RUN_LOCK = "run.lock"
FAILURE = "failed.json"
HYDRA_DIR = ".hydra"
HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")
BEST = "best.ckpt"
LAST = "last.ckpt"
STATES = ("running", "finished", "failed", "interrupted")

# Every plain file of a run dir, relative to it.
RECORD_FILES = (RUN_RECORD, METRICS, FAILURE, CONFIG, RUN_LOCK, *(f"{HYDRA_DIR}/{f}" for f in HYDRA_FILES),
                f"{CHECKPOINTS}/{LAST}", f"{CHECKPOINTS}/{BEST}")
RECORD_DIRS = (HYDRA_DIR, CHECKPOINTS)
TESTSETS = "testsets"  # eval.py's test-set results, <run dir>/testsets/<name>[@<ape rule>].json
PLOTS = "plots"  # plot_rpe.py's figures
# Folders of a run dir that its training never reads or writes (other commands' outputs): a rerun or an
# extension of the run does not look into them, so one it may not read does not stop it.
NOT_TRAINING_DIRS = (TESTSETS, PLOTS)
# The names at a run dir's top that are the run's own records and folders: nothing else (a logger) writes there.
OWN_ENTRIES = tuple(dict.fromkeys((*(f.split("/")[0] for f in RECORD_FILES), *RECORD_DIRS, FINDINGS_SNAPSHOT,
                                   *NOT_TRAINING_DIRS)))


class RunDirConflict(ValueError):
    """The run dir belongs to a run of another config, or cannot hold this run (nothing is written into it)."""


class RunDirBusy(RunDirConflict):
    """Another process holds the run dir's lock (the same run started twice); nothing is written."""


def check_layout(run_dir: Path, logger_dirs: tuple[str, ...] = ()) -> None:
    """Refuse, before anything is written or trained, a run dir whose records cannot be what they must be.

    Each record must be absent or a plain file, each record folder absent or a real folder: a folder
    where ``metrics.json`` belongs would fail only after training, a symlink could write into another run.
    ``logger_dirs`` are the run's logger folders (``csv``): a file there failed only once the logger started
    after resuming ("[Errno 17] File exists"), with the finished run's record already turned to failed.
    """
    for name in (*RECORD_DIRS, *logger_dirs):
        path = run_dir / name
        with guarded(path, "read"):
            bad = path.is_symlink() or (path.exists() and not path.is_dir())
        if bad:
            raise RunFileError(
                f"{path} cannot be used: {describe_non_file(path)}, where a folder belongs; move it away"
            )
    for name in RECORD_FILES:
        check_plain_file(run_dir / name)


def lock_run_dir(run_dir: Path) -> tuple[int, bool]:
    """Take the run dir's exclusive lock (``run.lock``); returns ``(fd, writable)``; closing fd releases it.

    A second process on the same dir (the same command in another terminal, a requeued job whose first
    attempt still runs) would interleave checkpoints and records: it stops with one line instead. ``flock``
    belongs to the open file, so the kernel drops it when the process dies, also under ``kill -9``. On
    read-only storage the lock is taken through a read-only descriptor (``writable`` is then False): a
    finished run can still be looked at there.
    """
    import fcntl

    path = run_dir / RUN_LOCK
    writable = True
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # NFS grants LOCK_EX only to writers
    except OSError:
        writable = False
        with guarded(path, "open"):
            if not path.exists():  # no lock file and no way to make one: nobody can be running here
                return -1, False
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    links = os.fstat(fd).st_nlink
    if links > 1:  # one file under two names: its lock is the other name's too (another run's, a copy's)
        os.close(fd)
        raise RunDirConflict(f"{path} is a hard link shared with another file ({links} names of one file): the lock"
                             " would be shared with that file's run, which would then seem to hold this one (or"
                             " be held by it); nothing was written. Remove it (it holds no data: the run makes its"
                             " own)")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise RunDirBusy(f"{run_dir} is in use by another process (it holds {RUN_LOCK}); nothing was written. "
                         "Wait for that run to end, or give this one a new run_name=...") from None
    return fd, writable


def release_lock(fd: int) -> None:
    if fd >= 0:
        os.close(fd)


def lock_is_held(run_dir: Path) -> bool:
    """Whether a live process holds ``run.lock`` (read-only probe; never creates the file)."""
    import fcntl

    path = run_dir / RUN_LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def read_run_record(run_dir: Path) -> dict[str, Any] | None:
    """``run.json`` as a dict (``None`` when absent); a record without identity is damaged (`RunFileError`)."""
    path = run_dir / RUN_RECORD
    record = read_json(path)
    if record is None:
        return None
    if not isinstance(record.get("identity"), str) or not isinstance(record.get("config"), dict):
        raise RunFileError(f"{path} is damaged: it has no run identity")
    if identity_hash(record["config"]) != record["identity"]:  # the identity is the hash of the config it holds
        raise RunFileError(f"{path} is damaged: its identity {record['identity']} is not that of the config it"
                           " records")
    if record.get("state") not in STATES:
        raise RunFileError(f"{path} is damaged: state {record.get('state')!r} is not one of {', '.join(STATES)}")
    lengths = record.get("lengths")
    # the lengths a run dir trained at always include its own: a list without it would disown its own checkpoints
    if "lengths" in record and "length" in record and not (isinstance(lengths, list) and record["length"] in lengths):
        raise RunFileError(f"{path} is damaged: its lengths {lengths!r} lack the run's own length {record['length']}")
    return record


@dataclass
class RunRecord:
    """The in-memory ``run.json`` of the job that holds the run dir's lock; `save` writes it atomically."""

    run_dir: Path
    identity: str
    config: dict[str, Any]
    length: dict[str, Any]
    fields: dict[str, Any] = field(default_factory=dict)

    def save(self, state: str, **extra: Any) -> None:
        """Write ``run.json`` with ``state`` (one of `STATES`); never creates a vanished run dir."""
        assert state in STATES, state
        self.fields.update(extra, state=state, updated=time.strftime("%Y-%m-%d %H:%M:%S"))
        record = {**self.fields, "identity": self.identity, "config": self.config, "length": self.length}
        atomic_write_json(self.run_dir / RUN_RECORD, record, make_parents=False)


HEADLINE_METRICS = ("val/top1", "val/AP")  # a run's result: the first of these its test logged
PERCENT_METRICS = ("val/top1", "val/top5", "val/AP", "val/AP50", "val/AP75", "val/APs", "val/APm", "val/APl",
                   "val_ema/top1", "val_ema/top5")


def read_metrics(run_dir: Path, identity: str | None = None, length: dict[str, Any] | None = None
                 ) -> dict[str, Any] | None:
    """``metrics.json`` (``None`` when absent). A damaged file, one that names another run's identity (copied
    from elsewhere), or a percentage outside [0, 100] raise `RunFileError`: such numbers are no result.
    With ``identity`` (the run has ``run.json``) the file must carry that identity; archived runs without
    ``run.json`` are read without one."""
    path = run_dir / METRICS
    metrics = read_json(path)
    if metrics is None:
        return None
    if identity is not None and "identity" not in metrics:
        # Every metrics.json a run with run.json writes carries the identity; one without it was put there
        # from elsewhere (a copy with the key removed), so it cannot be shown to be this run's result.
        raise RunFileError(f"{path} has no run identity, so it cannot be shown to be this run's result")
    if identity is not None and metrics["identity"] != identity:
        raise RunFileError(f"{path} is another run's (identity {metrics['identity']}, this run's {identity})")
    for key in PERCENT_METRICS:
        value = metrics.get(key)
        if isinstance(value, float) and value != value:
            continue  # NaN: not a number at all; the tables list it as no result
        if value is not None and not (_is_number(value) and 0 <= value <= 100):
            raise RunFileError(f"{path} is damaged: {key}={value!r} is not a percentage in [0, 100]")
    for top1, top5 in (("val/top1", "val/top5"), ("val_ema/top1", "val_ema/top5")):
        if _is_number(metrics.get(top1)) and _is_number(metrics.get(top5)) and metrics[top1] > metrics[top5] + 1e-6:
            raise RunFileError(f"{path} is damaged: {top1}={metrics[top1]!r} is more than {top5}={metrics[top5]!r},"
                               " which a test cannot give")
    if identity is not None and metrics.get("tested") is not False and not any(
            _is_number(metrics.get(k)) and math.isfinite(metrics[k])
            for k in HEADLINE_METRICS):
        # a job writes metrics.json only with a finite headline from its test (or with tested: false)
        raise RunFileError(f"{path} is damaged: it holds no finite {' or '.join(HEADLINE_METRICS)}, which the"
                           " test of a finished run always records")
    if identity is not None:
        _check_training_record(path, metrics)
    if identity is not None and length is not None:
        problem = result_length_problem(metrics, length)
        if problem:
            raise RunFileError(f"{path} is another length's result: {problem}")
    # last, so that a value no run can record is named: what passes the checks above but was changed by hand
    problem = checksum_problem(metrics) if identity is not None or CHECKSUM in metrics else ""
    if problem:
        raise RunFileError(f"{path} is damaged: {problem}")
    return metrics


def result_length_problem(metrics: dict[str, Any], length: dict[str, Any]) -> str:
    """Why ``metrics`` (epochs and steps trained) are not the result of a run of ``length`` (`run_length`), or
    ''. A result is only made by a run that trained to its end, so its epochs are ``max_epochs`` or its steps
    ``max_steps``: other numbers are those of the same config run shorter or longer (an extension's earlier
    or later metrics.json)."""
    epoch, step = metrics.get("epoch"), metrics.get("global_step")
    max_epochs, max_steps = length.get("max_epochs"), length.get("max_steps")
    by_epochs = isinstance(max_epochs, int) and max_epochs > 0
    by_steps = isinstance(max_steps, int) and max_steps > 0
    if not (_is_number(epoch) and _is_number(step)) or not (by_epochs or by_steps):
        return ""  # no record of what it trained (an older file), or a run limited by time only
    if (by_epochs and epoch == max_epochs) or (by_steps and step == max_steps):
        return ""
    limits = " and ".join(f"trainer.{k}={v}" for k, v in (("max_epochs", max_epochs), ("max_steps", max_steps))
                          if isinstance(v, int) and v > 0)
    return f"it records {epoch} epochs ({step} steps), while the run trains to {limits}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)  # JSON true/false are not numbers


def _check_training_record(path: Path, metrics: dict[str, Any]) -> None:
    """What a job writes about its training, in a live run's ``metrics.json``, must be possible: at least one
    optimizer step, the best checkpoint no later than the last step and epoch, a positive parameter count."""
    def number(key: str) -> Any:
        value = metrics.get(key)
        return value if _is_number(value) else None

    step, best_step, epoch, best_epoch = (number(k) for k in ("global_step", "best_step", "epoch", "best_epoch"))
    problem = ""
    if step is not None and step < 1:
        problem = f"global_step={step}: a finished run has made at least one optimizer step"
    elif step is not None and best_step is not None and not 1 <= best_step <= step:
        problem = f"best_step={best_step} is not within the run's steps 1-{step}"
    elif epoch is not None and best_epoch is not None and not 1 <= best_epoch <= epoch:
        problem = f"best_epoch={best_epoch} is not within the run's epochs 1-{epoch}"
    elif number("params") is not None and number("params") < 1:
        problem = f"params={metrics['params']} is not a parameter count"
    if problem:
        raise RunFileError(f"{path} is damaged: {problem}")


@dataclass
class RunStatus:
    """What a run dir holds, read without writing anything.

    ``state``: finished (a result), failed, interrupted, running (its job holds the lock), died (its
    record says running, but no process holds the lock), unfinished (no record and no result: a run of
    an older version stopped before its end), or unreadable (a damaged record: ``problem`` names it).
    """

    state: str
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    problem: str = ""
    length: dict[str, Any] | None = None


def run_status(run_dir: Path) -> RunStatus:
    """The state of ``run_dir`` from its records; a result only from a finished run of its recorded length."""
    record = None
    try:
        record = read_run_record(run_dir)
        failure = read_json(run_dir / FAILURE)
        # the length is a finished run's: during an extension, metrics.json is the shorter sitting's
        length = record.get("length") if record is not None and record["state"] == "finished" else None
        metrics = read_metrics(run_dir, record["identity"] if record is not None else None, length)
    except RunFileError as err:
        return RunStatus("unreadable", problem=_foreign_record(run_dir, record) or str(err))
    if failure is not None:
        return RunStatus("failed", error=str(failure.get("error") or "failed"))
    if record is None:  # archived runs and run dirs of versions before run.json: the result file decides
        return RunStatus("finished", metrics) if metrics is not None else RunStatus("unfinished")
    state = record["state"]
    if state == "running" and not lock_is_held(run_dir):
        state = "died"
    if state != "finished":
        return RunStatus(state, length=record.get("length"))
    if metrics is None:
        return RunStatus("unreadable", problem=f"{run_dir / RUN_RECORD} says finished, but {METRICS} is missing")
    return RunStatus("finished", metrics, length=record.get("length"))


def config_file_identity(run_dir: Path) -> str | None:
    """The identity hash of the run dir's ``config.yaml`` (plain YAML: nothing resolved or run), or None."""
    import yaml

    from lifecycle.identity import identity_config
    from storage.files import read_bounded_bytes, yaml_problem

    try:
        text = read_bounded_bytes(run_dir / CONFIG).decode()  # a file larger than any config is never read whole
        config = None if yaml_problem(text) else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError, RecursionError):
        return None
    return identity_hash(identity_config(config)) if isinstance(config, dict) else None


def _foreign_record(run_dir: Path, record: dict[str, Any] | None) -> str:
    """When ``run.json`` names another identity than both ``config.yaml`` and ``metrics.json`` do, it is
    ``run.json`` that came from elsewhere: say so (else '')."""
    if record is None:
        return ""
    try:
        metrics = read_json(run_dir / METRICS)
    except RunFileError:
        return ""
    own = config_file_identity(run_dir)
    if own is not None and isinstance(metrics, dict) and own == metrics.get("identity") != record["identity"]:
        return (f"{run_dir / RUN_RECORD} is another run's record (identity {record['identity']}; {CONFIG} and"
                f" {METRICS} are {own}'s): copied from another run dir?")
    return ""


def partial_run(metrics: dict[str, Any]) -> str:
    """Why a finished run's numbers are not a result (a limited training or test), or ''."""
    reasons = []
    if metrics.get("train_complete") is False:
        reasons.append("each epoch trained on a part of the training split (trainer.limit_train_batches or"
                       " trainer.overfit_batches)")
    if metrics.get("test_complete") is False:
        reasons.append(f"its test read {metrics.get('tested_batches', '?')} batches, a part of its split"
                       " (trainer.limit_test_batches)")
    return "; ".join(reasons)


def not_a_result(run_dir: Path, status: Any, shown: str = "numbers") -> str:
    """Why what a command shows of ``run_dir``'s checkpoint (``shown``: eval.py's numbers, plot_rpe's plots) is not
    a result of the run (``status``: its `run_status`; it has not finished, or it is a smoke run that trained or
    tested on part of its splits), or ''."""
    if status.state == "unreadable":  # a damaged record: which, and how, so that it can be repaired
        return f"{run_dir}'s records are unreadable ({status.problem}): these are the {shown} of its checkpoint"
    if status.state != "finished":
        return f"{run_dir} has not finished ({status.state}): these are the {shown} of its checkpoint so far"
    partial = partial_run(status.metrics)
    return f"{run_dir} is a smoke run: {partial}" if partial else ""
