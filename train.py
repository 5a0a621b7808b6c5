"""Train a model: ``python train.py [group=option ...] [key=value ...]`` (Hydra).

Composes ``configs/train.yaml``, fits, tests the best checkpoint on the validation split and
writes ``metrics.json`` into the run dir. See the README for the groups and the recipes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data.datamodule import STOP_SIGNALS

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
FAILURE_FILE = "failed.json"  # written into the run dir of a run that raised


def job_dirname(overrides: str) -> str:
    """One path component naming a sweep job by its overrides (``hydra.job.override_dirname``).

    Hydra's name keeps ``/`` (nested dirs) and ``${...}`` (which would be interpolated again when the
    output dir is used), so anything outside ``[A-Za-z0-9._=,+-]`` becomes ``_``; long names (a file
    system allows 255 bytes) keep a prefix plus a hash of the whole.
    """
    name = re.sub(r"[^A-Za-z0-9._=,+-]+", "_", overrides.replace("\\", "")) or "default"
    if len(name) > 160:
        name = f"{name[:140]}-{hashlib.sha1(overrides.encode()).hexdigest()[:12]}"
    return name


OmegaConf.register_new_resolver("job_dirname", job_dirname, replace=True)


# ----------------------------------------------------------------------------- errors
class CommandLineError(ValueError):
    """A bad command-line choice, reported in one line."""


def _group_options(group: str) -> list[str]:
    """The options a user may pick: ``_``-prefixed files (``rpe/_base``) are shared bases, not choices."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml") if not p.stem.startswith("_"))


def check_group_choices(argv: list[str]) -> None:
    """Fail fast, in one line, on ``group=option`` overrides that name a missing option.

    Hydra's own message for this spans several lines; this check runs before Hydra composes.
    """
    for arg in argv:
        match = re.fullmatch(r"[+~]?([a-z_][\w/]*)=(.*)", arg)
        if not match or arg.startswith("hydra."):
            continue
        group, value = match.groups()
        if not (CONFIG_DIR / group).is_dir() or value in ("", "null"):
            continue
        options = _group_options(group)
        for choice in value.split(","):
            if any(ch in choice for ch in "${}*()[]") or choice.startswith(("choice", "range", "glob")):
                continue
            if choice not in options:
                raise CommandLineError(f"{group}={choice!r} is not a config option; valid: {', '.join(options)}")


def normalize_overrides(argv: list[str]) -> list[str]:
    """``+a.b=v`` on a key the config already declares is Hydra's "already at" error; on a dotted key
    ``+`` means add-or-set (``++``), so old commands such as ``+trainer.limit_train_batches=3`` keep working."""
    return [f"+{arg}" if re.match(r"\+[A-Za-z_][\w-]*(\.[\w-]+)+=", arg) else arg for arg in argv]


def check_overrides(argv: list[str], config_name: str) -> None:
    """Compose once before Hydra does, so that a bad key is one line (Hydra's message spans five).

    A sweep is checked with the first value of each swept key; intervals (optuna) are left to the sweeper.
    """
    if any(arg.startswith("-") and arg not in ("-m", "--multirun") for arg in argv):
        return  # --cfg, --config-path (DDP workers), ...: Hydra's own modes
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    overrides = [arg for arg in argv if arg not in ("-m", "--multirun")]
    try:
        single = []
        for override in OverridesParser.create().parse_overrides(overrides):
            if override.is_sweep_override():
                try:
                    first = next(iter(override.sweep_string_iterator()))
                except HydraException:
                    continue
                single.append(f"{override.get_key_element()}={first}")
            else:
                single.append(override.input_line)
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            compose(config_name, overrides=single, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as err:
        raise CommandLineError(_override_error(err)) from None
    finally:
        GlobalHydra.instance().clear()


def _override_error(err: BaseException) -> str:
    """One line from Hydra's multi-line override errors; names the valid keys where OmegaConf knows them."""
    cause = _root_cause(err)
    if getattr(err, "override", None):  # a parse error: OverrideParseException
        return f"override {err.override!r} is not valid override syntax: {' '.join(str(cause).split())}"
    full_key = getattr(cause, "full_key", None)
    parent = getattr(cause, "parent_node", None)
    if full_key and isinstance(parent, DictConfig) and "not in struct" in str(cause):
        where = full_key.rsplit(".", 1)[0] if "." in full_key else "the root config"
        valid = ", ".join(sorted(str(k) for k in parent.keys()))
        return f"{full_key} is not a config key; valid keys of {where}: {valid} (a new key needs +{full_key}=...)"
    text = " ".join(f"{err} {cause}".split()) if cause is not err else " ".join(str(err).split())
    return text


def _user_error_types() -> tuple[type[BaseException], ...]:
    from hydra.errors import HydraException
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    return (ValueError, FileNotFoundError, OmegaConfBaseException, HydraException, MisconfigurationException)


def _root_cause(err: BaseException) -> BaseException:
    while err.__cause__ is not None:
        err = err.__cause__
    return err


def report_user_error(err: BaseException) -> None:
    """Print a one-line ``error: ...`` (the traceback only with HYDRA_FULL_ERROR=1) and exit 2."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise err
    cause = _root_cause(err)
    message = " ".join(str(cause).split()) or type(cause).__name__
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


# ----------------------------------------------------------------------------- helpers
@rank_zero_only
def print_config_tree(cfg: DictConfig) -> None:
    """Print the composed config as a tree, groups first."""
    from rich import print as rprint
    from rich.syntax import Syntax
    from rich.tree import Tree

    tree = Tree("config", guide_style="dim")
    order = ["data", "model", "rpe", "trainer", "callbacks", "logger", "paths"]
    for key in order + [k for k in cfg if k not in order]:
        if key not in cfg:
            continue
        value = cfg[key]
        text = OmegaConf.to_yaml(value, resolve=True) if isinstance(value, DictConfig) else str(value)
        tree.add(key).add(Syntax(text, "yaml", theme="ansi_dark", background_color="default"))
    rprint(tree)


# ----------------------------------------------------------------------------- run identity
RUN_RECORD = "run.json"  # what the run dir holds: identity hash, identity config, state
RUN_LOCK = "run.lock"  # held (flock) by the process running the job
# Keys that may change between a run and its resume (or a requeue on another machine) without changing
# what is trained: length, logging, paths, data location and loading, checkpoint frequency.
VOLATILE_KEYS = (
    "trainer.max_epochs", "trainer.max_steps", "trainer.log_every_n_steps", "trainer.enable_model_summary",
    "trainer.enable_progress_bar", "trainer.default_root_dir", "logger", "paths", "run_name", "task_name",
    "print_config", "resume", "test_after_fit", "data.root", "data.num_workers", "data.pin_memory",
    "callbacks.progress_bar", "callbacks.model_checkpoint.dirpath", "callbacks.last_checkpoint.dirpath",
    "callbacks.last_checkpoint.every_n_train_steps",
)


class RunDirConflict(ValueError):
    """The run dir belongs to a run of another config (nothing is written into it)."""


class RunDirBusy(RunDirConflict):
    """Another process holds the run dir's lock (the same run started twice); nothing is written."""


class ResumeError(ValueError):
    """The run dir has checkpoints, but none can be resumed."""


def identity_config(cfg: DictConfig | dict) -> dict[str, Any]:
    """The resolved config minus ``VOLATILE_KEYS``: what a run dir's results depend on."""
    container = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    container = json.loads(json.dumps(container, default=str))  # a deep copy of plain values
    container.pop("hydra", None)
    for key in VOLATILE_KEYS:
        *parents, leaf = key.split(".")
        node = container
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return container


def identity_hash(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def config_differences(old: dict[str, Any], new: dict[str, Any], limit: int = 4) -> str:
    """``key: old -> new`` for the first ``limit`` differing keys (dotted), ``, ... (N more)`` after."""
    flat_old, flat_new = _flatten(old), _flatten(new)
    unset = "<unset>"
    keys = sorted(k for k in flat_old.keys() | flat_new.keys() if flat_old.get(k, unset) != flat_new.get(k, unset))
    shown = ", ".join(f"{k}: {flat_old.get(k, unset)} -> {flat_new.get(k, unset)}" for k in keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def read_run_record(run_dir: Path) -> dict[str, Any] | None:
    """``run.json`` as a dict; ``None`` when absent. Unreadable records are an error, never overwritten."""
    path = run_dir / RUN_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or "identity" not in record:
            raise ValueError("no identity")
        return record
    except (ValueError, OSError) as err:
        raise RunDirConflict(f"{path} is unreadable ({err}); use a new run_name") from None


def lock_run_dir(run_dir: Path) -> int:
    """Take the run dir's exclusive lock (``run.lock``) for this job; returns its fd, closing it releases it.

    A second process on the same dir (the same command in another terminal, a requeued job whose first
    attempt still runs, two sweeps given overlapping jobs) would interleave checkpoints and metrics; it
    stops with one line instead. ``flock`` is held by the open file, so the kernel drops it when the
    process dies, also under ``kill -9``. The file stays empty, so taking the lock changes no bytes of a
    run dir that already has one.
    """
    import fcntl

    fd = os.open(run_dir / RUN_LOCK, os.O_RDWR | os.O_CREAT, 0o644)  # NFS grants LOCK_EX only to writers
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise RunDirBusy(f"{run_dir} is in use by another process (it holds {RUN_LOCK}); nothing was written. "
                         "Wait for that run to end, or give this one a new run_name=...") from None
    return fd


def write_run_record(run_dir: Path, **fields: Any) -> None:
    """Update ``run.json`` (atomically); ``state`` is one of running, finished, failed, interrupted."""
    from models.training import atomic_write_json

    record = read_run_record(run_dir) or {}
    record.update(fields, updated=time.strftime("%Y-%m-%d %H:%M:%S"))
    atomic_write_json(run_dir / RUN_RECORD, record)


def _trained_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoints in the run dir that hold training (global_step > 0, or unreadable: kept to be safe)."""
    from models.training import load_checkpoint

    found = []
    for path in sorted((run_dir / "checkpoints").glob("*.ckpt")):
        try:
            if load_checkpoint(path, mmap=True).get("global_step", 0) == 0:
                continue
        except Exception:
            pass
        found.append(path)
    return found


def holds_results(run_dir: Path, record: dict[str, Any] | None) -> bool:
    """Whether anything of value is in the run dir: metrics, a trained checkpoint, a finished state."""
    finished = record is not None and record.get("state") == "finished"
    return finished or (run_dir / "metrics.json").is_file() or bool(_trained_checkpoints(run_dir))


def claim_run_dir(run_dir: Path, identity: dict[str, Any]) -> dict[str, Any] | None:
    """Check that ``run_dir`` may hold this run; returns its earlier record when it is the same run.

    The same identity (``run.json``, or the resolved ``config.yaml`` of a dir written before run.json
    existed) continues the run. Another identity is refused with one line naming the differing keys,
    unless the dir holds nothing of value (its run failed or stopped before training): then it is
    reused. Raises ``RunDirConflict`` before anything is written.
    """
    record = read_run_record(run_dir)
    if record is None and (run_dir / "config.yaml").is_file() and holds_results(run_dir, None):
        old = identity_config(OmegaConf.load(run_dir / "config.yaml"))
        record = {"identity": identity_hash(old), "config": old, "state": "unknown"}
    if record is None or record["identity"] == identity_hash(identity):
        return record
    differences = config_differences(record.get("config", {}), identity)
    if holds_results(run_dir, record):
        raise RunDirConflict(
            f"{run_dir} holds a run of another config ({differences}); nothing was written. "
            "Give this one a new run_name=... (or hydra.sweep.dir=... for a sweep)"
        )
    print(f"note: reusing {run_dir}: its earlier run of another config ({differences}) never trained")
    (run_dir / FAILURE_FILE).unlink(missing_ok=True)
    return None


def resume_checkpoint(run_dir: Path, identity: str) -> str | None:
    """The checkpoint a rerun continues from: ``last.ckpt``, else ``best.ckpt`` when last is unusable.

    Only readable checkpoints of this run's identity that hold training are resume points. A damaged
    ``last.ckpt`` falls back to ``best.ckpt`` (an earlier but intact state, with a warning); if
    checkpoints exist and none is usable, raises ``ResumeError``: never train from scratch over them.
    """
    from models.training import IDENTITY_KEY, load_checkpoint

    problems: list[str] = []
    for name in ("last.ckpt", "best.ckpt"):
        path = run_dir / "checkpoints" / name
        if not path.is_file():
            continue
        try:
            checkpoint = load_checkpoint(path, mmap=True)
        except Exception as err:
            problems.append(f"{path} is unreadable ({type(err).__name__})")
            continue
        if checkpoint.get(IDENTITY_KEY, identity) != identity:
            problems.append(f"{path} was saved by a run of another config")
            continue
        if checkpoint.get("global_step", 0) == 0:
            continue  # saved before any training step: nothing to resume
        if problems:
            print(f"warning: {'; '.join(problems)}; resuming from {path} instead", file=sys.stderr)
        return str(path)
    if problems:
        raise ResumeError(f"cannot resume: {'; '.join(problems)}; move it away to start over, or use a new run_name")
    return None


def _save_hydra_files(run_dir: Path, cfg: DictConfig) -> None:
    """What Hydra writes to ``.hydra/`` (config, hydra config, overrides), written only once the dir is ours."""
    from hydra.core.hydra_config import HydraConfig

    from models.training import atomic_write_bytes

    hydra_cfg = HydraConfig.get()
    files = {
        "config.yaml": OmegaConf.to_yaml(cfg),
        "hydra.yaml": OmegaConf.to_yaml(OmegaConf.create({"hydra": hydra_cfg})),
        "overrides.yaml": OmegaConf.to_yaml(OmegaConf.create(list(hydra_cfg.overrides.task))),
    }
    for name, text in files.items():
        atomic_write_bytes(run_dir / ".hydra" / name, text.encode())


# ----------------------------------------------------------------------------- signals


class _SignalState:
    """The stop signal received by this process and where it goes: the running fit's ``ResumeCheckpoint``."""

    signum: int | None = None
    checkpoint: Any = None  # ResumeCheckpoint of the fit in progress, else None
    previous: dict[int, Any] = {}


def _on_stop_signal(signum: int, frame: Any) -> None:
    """During fit: ask ``ResumeCheckpoint`` to save and stop at the next batch end. Otherwise stop now."""
    from models.training import RunInterrupted

    _SignalState.signum = signum
    if _SignalState.checkpoint is not None:
        _SignalState.checkpoint.stop_signal = signum
    else:
        raise RunInterrupted(signum)


def install_stop_signals() -> None:
    """SIGTERM, SIGUSR1, SIGUSR2 (SLURM, submitit) stop the run with a checkpoint (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        previous = signal.signal(signum, _on_stop_signal)
        if previous is not _on_stop_signal:
            _SignalState.previous[signum] = previous


def _chain_previous_handler(signum: int) -> None:
    """Let a launcher's own handler (submitit requeues on SIGUSR2) act once our checkpoint is saved."""
    previous = _SignalState.previous.get(signum)
    if callable(previous):
        previous(signum, None)


def _scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v) for k, v in metrics.items()
        if (torch.is_tensor(v) and v.numel() == 1) or isinstance(v, (int, float))
    }


def _install_ddp_child_command(run_dir: Path) -> None:
    """Start DDP worker processes from this run's resolved config, not from ``sys.argv``.

    Lightning re-runs the script with the parent's arguments; under a multirun those arguments
    hold a whole sweep, and interpolations such as ``${now:}`` would resolve anew. The workers
    instead load ``<run_dir>/config.yaml`` and write into the same run dir.
    """
    from lightning.pytorch.strategies.launchers import subprocess_script

    def command(local_rank: int) -> tuple[list[str], str]:
        cmd = [
            sys.executable, str(Path(__file__).resolve()),
            "--config-path", str(run_dir), "--config-name", "config",
            f"hydra.run.dir={run_dir}", "hydra.output_subdir=null", f"hydra.job.name=ddp_rank{local_rank}",
        ]
        return cmd, os.getcwd()

    subprocess_script._hydra_subprocess_cmd = command


def build_data_and_model(cfg: DictConfig) -> tuple[L.LightningDataModule, L.LightningModule]:
    """Instantiate the data module and the LightningModule (with ``cfg.rpe``) of a composed config."""
    from hydra.utils import instantiate

    datamodule = instantiate(cfg.data, _convert_="all")
    rpe = OmegaConf.to_container(cfg.rpe, resolve=True) if "rpe" in cfg else None
    model = instantiate(cfg.model, rpe=rpe, num_classes=datamodule.num_classes, _convert_="all")
    return datamodule, model


def build_trainer(
    trainer_cfg: DictConfig,
    callbacks_cfg: DictConfig | None = None,
    logger_cfg: DictConfig | None = None,
    hparams: dict[str, Any] | None = None,
) -> L.Trainer:
    """Instantiate the Trainer with atomic, ``weights_only`` checkpoint I/O and the finite-loss guard;
    ``hparams`` go to the loggers."""
    from hydra.utils import instantiate

    from models.training import AtomicCheckpointIO, FiniteLossGuard, LogHyperparams

    callbacks = [instantiate(c) for c in (callbacks_cfg or {}).values() if c is not None]
    callbacks.append(FiniteLossGuard())  # always: no NaN run ends as a result
    if hparams is not None:
        callbacks.append(LogHyperparams(hparams))
    loggers = [instantiate(c) for c in (logger_cfg or {}).values() if c is not None]
    return instantiate(
        trainer_cfg, callbacks=callbacks, logger=loggers or False, plugins=[AtomicCheckpointIO()],
        enable_progress_bar=any(isinstance(c, L.pytorch.callbacks.ProgressBar) for c in callbacks),
    )


def run_hparams(cfg: DictConfig) -> dict[str, Any]:
    """What a sweep varies, for the loggers' config columns: the resolved RPE fields and the choices."""
    from dataclasses import asdict

    from rpe import resolve_rpe

    rpe = resolve_rpe(OmegaConf.to_container(cfg.rpe, resolve=True)) if "rpe" in cfg else None
    hparams: dict[str, Any] = {
        "rpe": {**asdict(rpe), "on": rpe.on, "shorthand": rpe.shorthand()} if rpe is not None else None,
        "sweep": cfg.get("sweep_name"), "name": cfg.get("name"), "seed": cfg.get("seed"),
    }
    net = cfg.get("model", {}).get("net")
    if net is not None:
        hparams["ape"] = net.get("ape")
    elif "position_embedding" in cfg.get("model", {}):
        hparams["ape"] = cfg.model.position_embedding
    return hparams


def _finite_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Non-finite values are not results: they become ``null`` (metrics.json stays strict JSON)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}


_claimed: set[Path] = set()  # run dirs this process may write into (their identity matched)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Claim the run dir, fit (or resume), test the best checkpoint, write ``metrics.json``; returns the metrics.

    A run dir of another config raises ``RunDirConflict`` before anything is written; a finished run
    (same config and length) is not trained again: it returns its ``metrics.json`` (or re-tests when
    that is missing).
    """
    from hydra.core.hydra_config import HydraConfig

    from models.training import ResumeCheckpoint, atomic_write_json, load_checkpoint, remove_stale_temp_files

    started = time.time()
    run_dir = Path(HydraConfig.get().runtime.output_dir).resolve()
    identity = identity_config(cfg)
    identity_id = identity_hash(identity)
    length = {"max_epochs": cfg.trainer.get("max_epochs"), "max_steps": cfg.trainer.get("max_steps")}
    record = claim_run_dir(run_dir, identity) if rank_zero_only.rank == 0 else None
    _claimed.add(run_dir)
    finished = record is not None and record.get("state") == "finished" and record.get("length") == length
    if finished and (run_dir / "metrics.json").is_file() and rank_zero_only.rank == 0:
        print(f"{run_dir} is finished (same config and length): not training again, its metrics.json stands; "
              "use a new run_name to train anew, or a larger trainer.max_epochs to extend it")
        return json.loads((run_dir / "metrics.json").read_text())
    if cfg.get("print_config"):
        print_config_tree(cfg)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    if rank_zero_only.rank == 0:
        for stale in remove_stale_temp_files(run_dir):
            print(f"removed {stale} (left by a write that was killed)")
        write_run_record(run_dir, identity=identity_id, config=identity, length=length, state="running")
        (run_dir / FAILURE_FILE).unlink(missing_ok=True)  # a resumed run is no longer failed
        OmegaConf.save(cfg, run_dir / "config.yaml.tmp", resolve=True)
        os.replace(run_dir / "config.yaml.tmp", run_dir / "config.yaml")
        _save_hydra_files(run_dir, cfg)
    _install_ddp_child_command(run_dir)

    datamodule, model = build_data_and_model(cfg)
    if rank_zero_only.rank == 0:
        datamodule.prepare_data()  # generate data or reject a bad data.root before the Trainer starts
    trainer = build_trainer(cfg.trainer, cfg.get("callbacks"), cfg.get("logger"), run_hparams(cfg))
    resume = next((c for c in trainer.callbacks if isinstance(c, ResumeCheckpoint)), None)
    if resume is not None:
        resume.identity = identity_id
    for logger in trainer.loggers:
        _ = logger.version  # fix the log version now, so fit and test (even in spawned workers) share it
    resume_from = resume_checkpoint(run_dir, identity_id) if cfg.get("resume") else None
    best = str(run_dir / "checkpoints" / "best.ckpt")
    if finished:
        print(f"{run_dir} is finished; re-testing {best if os.path.isfile(best) else resume_from}")
    else:
        if resume_from:
            print(f"resuming from {resume_from}")
        _SignalState.checkpoint = resume
        try:
            trainer.fit(model, datamodule=datamodule, ckpt_path=resume_from, weights_only=True)
        finally:
            _SignalState.checkpoint = None
        if _SignalState.signum is not None:  # arrived after the last batch: last.ckpt is the epoch's end
            from models.training import RunInterrupted

            raise RunInterrupted(_SignalState.signum)
        best = getattr(trainer.checkpoint_callback, "best_model_path", "") or best
    metrics = _scalar_metrics(trainer.callback_metrics)
    best = best if os.path.isfile(best) else None
    if cfg.get("test_after_fit"):
        trainer.test(model, datamodule=datamodule, ckpt_path=best or resume_from or "last", verbose=False,
                     weights_only=True)
        metrics.update(_scalar_metrics(trainer.callback_metrics))
    epoch, global_step = trainer.current_epoch, trainer.global_step
    last = str(run_dir / "checkpoints" / "last.ckpt")
    if global_step == 0 and os.path.isfile(last):
        # spawn launchers train in child processes; the main process only gets metrics and weights back
        saved = load_checkpoint(last, mmap=True)
        epoch, global_step = saved["epoch"] + 1, saved["global_step"]
    metrics.update(
        epoch=epoch, global_step=global_step, best_checkpoint=best or "",
        run_dir=str(run_dir), wall_time_s=round(time.time() - started, 1),
        params=sum(p.numel() for p in model.parameters() if p.requires_grad),
    )
    metrics = _finite_metrics(metrics)
    if trainer.is_global_zero:
        atomic_write_json(run_dir / "metrics.json", metrics)
        write_run_record(run_dir, state="finished")
        summary = ", ".join(f"{k} {metrics[k]:.2f}" for k in ("val/top1", "val/top5", "val/AP")
                            if metrics.get(k) is not None)
        print(f"\n{summary}\nrun dir: {run_dir}")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # Each multirun job opens its own process group.
        torch.distributed.destroy_process_group()
    return metrics


_failed_jobs: list[str] = []  # run dirs of the jobs of this process's multirun that failed


def _is_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def record_failure(run_dir: Path, err: BaseException) -> str:
    """Write ``<run_dir>/failed.json`` (one-line message and traceback); returns the message.

    Tables (scripts/make_tables.py) show such a run as failed instead of dropping it.
    """
    import traceback

    from models.training import atomic_write_json

    cause = _root_cause(err)
    message = " ".join(str(cause).split()) or type(cause).__name__
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / FAILURE_FILE, {
        "status": "failed", "error": message, "type": type(cause).__name__,
        "traceback": "".join(traceback.format_exception(err)), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    })
    return message


def finish_wandb(exit_code: int) -> None:
    """Close this job's W&B run (marked failed when ``exit_code`` != 0): the next job opens its own."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish(exit_code=exit_code)


def _report_interruption(run_dir: Path, signum: int) -> None:
    """Record the state, print one line (and the sweep's summary), exit ``128 + signum`` like a shell."""
    name = signal.Signals(signum).name
    where = f"sweep interrupted during job {run_dir}" if _is_multirun() else f"run interrupted ({run_dir})"
    saved = "checkpoints/last.ckpt holds its state" if (run_dir / "checkpoints" / "last.ckpt").is_file() else \
        "no checkpoint yet"
    print(f"error: {where} by {name}; {saved}, rerun the same command to resume", file=sys.stderr)
    if _failed_jobs:
        print(f"error: {len(_failed_jobs)} sweep job(s) failed:", *_failed_jobs, sep="\n  ", file=sys.stderr)
    _chain_previous_handler(signum)
    sys.exit(128 + signum)


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    from models.training import RunInterrupted

    run_dir = Path(HydraConfig.get().runtime.output_dir).resolve()
    # Lightning's DDP launcher leaves LOCAL_RANK, WORLD_SIZE, MASTER_PORT, ... in this process's
    # environment; the next job of a multirun would take them as "workers already exist" and wait forever.
    environment = dict(os.environ)
    _claimed.discard(run_dir)
    _SignalState.signum = None
    install_stop_signals()
    writes = rank_zero_only.rank == 0
    exit_code = 1
    lock: int | None = None
    try:
        if writes:
            lock = lock_run_dir(run_dir)
        metrics = run(cfg)
        exit_code = 0
    except Exception as err:
        # After a stop signal any error is its consequence (e.g. a DataLoader worker killed by the same
        # scancel): the run was interrupted, not failed, and a sweep stops here.
        signum = err.signum if isinstance(err, RunInterrupted) else _SignalState.signum
        if signum is not None:
            if writes and run_dir in _claimed:
                write_run_record(run_dir, state="interrupted", signal=signal.Signals(signum).name)
            _report_interruption(run_dir, signum)
        fresh = not (run_dir / RUN_RECORD).exists() and not (run_dir / "config.yaml").exists()
        if lock is not None and (run_dir in _claimed or fresh):  # never into another run's dir
            message = record_failure(run_dir, err)
            if run_dir in _claimed:
                write_run_record(run_dir, state="failed")
        else:
            message = " ".join(str(_root_cause(err)).split())
        if _is_multirun():
            # One failed job must not stop the sweep: report it, keep going, summarise at the end.
            print(f"error: job failed ({run_dir}): {message}", file=sys.stderr)
            _failed_jobs.append(f"{run_dir}: {message}")
            return float("nan")  # optuna records a NaN objective as a failed trial
        if isinstance(err, _user_error_types()):
            report_user_error(err)
        raise
    except BaseException:  # Ctrl-C (Lightning exits 1 after it), or SIGTERM seen by Lightning first
        if writes and run_dir in _claimed:
            write_run_record(run_dir, state="interrupted")
        if _SignalState.signum is not None:
            _report_interruption(run_dir, _SignalState.signum)
        raise
    finally:
        if lock is not None:
            os.close(lock)  # after the run record's last write
        finish_wandb(exit_code)
        os.environ.clear()
        os.environ.update(environment)
    return metrics.get("val/top1", metrics.get("val/AP"))


def cli(hydra_main: Any, config_name: str = "train") -> None:
    """Entry point: reject bad group choices and keys in one line, then hand over to Hydra.

    After a multirun, exits 1 if any job failed (each failure is listed and recorded in its run dir).
    """
    sys.argv[1:] = normalize_overrides(sys.argv[1:])
    try:
        check_group_choices(sys.argv[1:])
        check_overrides(sys.argv[1:], config_name)
    except CommandLineError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    hydra_main()
    if _failed_jobs:
        print(f"error: {len(_failed_jobs)} sweep job(s) failed:", *_failed_jobs, sep="\n  ", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    cli(main)
