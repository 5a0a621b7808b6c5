"""One training job, from claiming its run dir to its result: the lifecycle behind ``train.py``.

The rules a run's results rest on:

* A run dir holds one run: a rerun of the same identity (`lifecycle.identity`) continues it, another
  config is refused before anything is written, and ``run.lock`` keeps a second process out.
* A result comes only from the run's own trained weights: ``checkpoints/best.ckpt`` inside its run dir
  (never a path restored from a checkpoint, which still names the dir the run was moved from), saved by
  this run after at least one optimizer step, with finite weights, and never from a smoke run
  (``trainer.fast_dev_run``). Anything else is one line and a non-zero exit.
* A job that saw a stop signal is interrupted, whatever happened after it; a job that raised is failed.
  Both are recorded where the run dir can still be written, and a record always carries its identity.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from data.errors import DataConfigError
from lifecycle.checkpoints import IDENTITY_KEY, LENGTH_KEY, RunInterrupted, epoch_counter_problem, load_checkpoint
from lifecycle.checkpoints import TRAINING_KEY as CHECKPOINT_TRAINING_KEY
from lifecycle.command import current
from lifecycle.console import CommandLineError, one_line, report_user_error, root_cause, say, user_error_types
from lifecycle.identity import (
    config_differences,
    data_difference,
    data_record,
    identity_config,
    identity_hash,
    past_run_length,
    run_length,
)
from lifecycle.project import DDP_WORKER_CONFIG, DDP_WORKER_FOLDER_PREFIX
from lifecycle.records import (
    BEST,
    CHECKPOINTS,
    CONFIG,
    FAILURE,
    FINDINGS_DIR,
    FINDINGS_SNAPSHOT,
    HEADLINE_METRICS,
    HYDRA_DIR,
    LAST,
    METRICS,
    RUN_RECORD,
    TESTSETS,
    RunDirConflict,
    RunRecord,
    check_layout,
    config_file_identity,
    lock_run_dir,
    partial_run,
    read_metrics,
    read_run_record,
    release_lock,
)
from lifecycle.signals import (
    STOP_SIGNALS,
    chain_previous_handler,
    install_stop_signals,
    restore_stop_signals,
    stop_signals,
)
from lifecycle.testset_definition import TRAINING_KEY
from storage.destinations import check_generated_root
from storage.files import (
    RunFileError,
    atomic_write_bytes,
    atomic_write_json,
    entry_exists,
    guarded,
    input_error_line,
    remove_stale_temp_files,
    with_checksum,
    writable_folder,
)


class ResumeError(ValueError):
    """The run dir has checkpoints, but none can be resumed."""


class NoResultError(ValueError):
    """The job ended without weights that may be reported as its result."""


# ----------------------------------------------------------------------------- building
def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v) for k, v in metrics.items()
        if (torch.is_tensor(v) and v.numel() == 1) or isinstance(v, (int, float))
    }


def build_data_and_model(cfg: DictConfig) -> tuple[L.LightningDataModule, L.LightningModule]:
    """Instantiate the data module and the LightningModule (with ``cfg.rpe``) of a composed config."""
    from hydra.utils import instantiate

    datamodule = instantiate(cfg.data, _convert_="all")
    rpe = OmegaConf.to_container(cfg.rpe, resolve=True) if "rpe" in cfg else None
    model = instantiate(cfg.model, rpe=rpe, num_classes=datamodule.num_classes, _convert_="all")
    check_generator_patch(datamodule, model)
    return datamodule, model


def check_buildable(cfg: DictConfig) -> None:
    """Build the data module and the model of ``cfg`` on the meta device (no weights allocated, no image read)
    and run the checks that need them: a bad model, RPE or monitor setting, an attention backend the run's
    device cannot train with, and for data already on disk a missing split folder, empty or mismatched class
    folders or a batch larger than the training split, are then refused before a run dir exists.
    Another error (a layer that cannot be built on the meta device, or a constructor's own ``TypeError`` or
    ``IndexError`` at settings that do not fit each other) is tried again on the CPU: one that stays is the
    settings', one line naming the model's settings (`unbuildable`); one that goes is left to the job."""
    try:
        with torch.device("meta"):
            datamodule, model = build_data_and_model(cfg)
    except Exception as err:  # noqa: BLE001  (see the docstring: only a setting's error is raised here)
        cause = root_cause(err)
        if isinstance(cause, ValueError):
            raise named_as_settings(cfg, cause) from None
        try:
            build_data_and_model(cfg)  # weights allocated, on this rare path only
        except Exception as again:  # noqa: BLE001  (the same build, off the meta device: the settings')
            raise unbuildable(cfg, root_cause(again)) from None
        return
    check_model_fits_memory(model)
    if hasattr(model, "check_datamodule"):
        model.check_datamodule(datamodule)
    check_monitored_metrics(cfg.get("callbacks"), model)
    from lifecycle.settings import check_backend_devices, configured_world_size

    check_backend_devices(cfg, model, training=True)  # flex or triton on the CPU: at the first step otherwise
    if hasattr(datamodule, "check_on_disk"):  # data already there: split and class folders, a batch per device
        try:
            datamodule.check_on_disk(configured_world_size(cfg))
        except OSError as err:  # an unreadable file or folder of the data: named before the run dir is made
            if err.filename is None:
                return  # no path to name: the data module names what it cannot read when it reads it
            line = input_error_line(err, "make it readable (chmod u+r), or another data.root")
            raise DataConfigError(f"data.root={datamodule.root}: {line}") from None


def check_model_fits_memory(model: torch.nn.Module) -> None:
    """The model's weights and buffers (counted on the meta device, nothing allocated) must fit this machine's
    memory, where the job builds it: ``rpe.num_buckets=100000000`` asked for 1.6e17 bytes, a torch allocator
    line naming no setting, after the run dir was made."""
    from models.errors import ModelConfigError

    tensors = [*model.named_parameters(), *model.named_buffers()]
    if not tensors:
        return
    size = sum(t.numel() * t.element_size() for _, t in tensors)
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: nothing to compare with
        return
    if size <= memory:
        return
    name, largest = max(tensors, key=lambda item: item[1].numel() * item[1].element_size())
    raise ModelConfigError(
        f"the model's weights and buffers would take {size / 2**30:.3g} GiB, more than this machine's"
        f" {memory / 2**30:.3g} GiB of memory; the largest, {name.removeprefix('net.')} of shape"
        f" {tuple(largest.shape)}, is sized by the encoding's or the model's settings (rpe.num_buckets,"
        " rpe.max_distance, model.net.*); valid: settings whose tables fit")


def named_as_settings(cfg: DictConfig, err: ValueError) -> ValueError:
    """A backbone's own refusal (`models.deit.ModelConfigError`) names its constructor's arguments (``ape='sincos'``,
    ``valid: ape=none``), which a command line spells ``model.net.ape``: the same line with the settings' keys."""
    from models.errors import ModelConfigError

    net = OmegaConf.select(cfg, "model.net", default=None, throw_on_resolution_failure=False)
    if not isinstance(err, ModelConfigError) or not OmegaConf.is_dict(net):
        return err
    text = str(err)
    for key in sorted(map(str, net.keys()), key=len, reverse=True):
        text = re.sub(rf"(?<![\w.]){re.escape(key)}=", f"model.net.{key}=", text)
    return ModelConfigError(text) if text != str(err) else err


def unbuildable(cfg: DictConfig, cause: BaseException) -> ValueError:
    """The one-line error of settings whose model (or data module) its constructor could not build, naming the
    constructor's complaint and the ``model.net`` settings (an error that is a setting's own passes as it is)."""
    if isinstance(cause, ValueError):
        return cause
    net = OmegaConf.select(cfg, "model.net", default=None, throw_on_resolution_failure=False)
    given = OmegaConf.to_container(net, resolve=True) if OmegaConf.is_dict(net) else {}
    shown = ", ".join(f"model.net.{k}={v}" for k, v in given.items())
    return ValueError(f"the model cannot be built with these settings ({shown}): {type(cause).__name__}:"
                      f" {one_line(cause)}; check the values that must fit each other (head counts, widths, stages)")


def check_monitored_metrics(callbacks_cfg: DictConfig | None, model: L.LightningModule) -> None:
    """A callback's ``monitor`` must be a metric the model logs, or the run fails only after its first epoch."""
    logged = getattr(model, "validation_metrics", None)
    if not isinstance(callbacks_cfg, DictConfig) or logged is None:
        return
    for name, node in callbacks_cfg.items():
        monitor = node.get("monitor") if isinstance(node, DictConfig) else None
        if isinstance(monitor, str) and monitor not in logged:
            raise ValueError(f"callbacks.{name}.monitor={monitor} is not a metric this model logs; valid:"
                             f" {', '.join(logged)}")


def check_generator_patch(datamodule: Any, model: L.LightningModule) -> None:
    """A generator that draws its objects for a patch size (relational shapes: no patch holds both objects)
    must draw them for the model's: with another, the task is not the one the data was made for."""
    keywords = getattr(getattr(datamodule, "generator", None), "keywords", None) or {}
    patch = getattr(getattr(getattr(model, "net", None), "patch_embed", None), "patch_size", None)
    drawn = keywords.get("patch_size")
    if drawn is None or patch is None:
        return
    if tuple(patch) != (int(drawn), int(drawn)):
        raise ValueError(f"data.generator.patch_size={drawn} but the model's patch is {patch[0]}x{patch[1]} px:"
                         f" the data keeps the objects in separate patches of the model's size; valid:"
                         f" data.generator.patch_size={patch[0]}")


def build_trainer(
    trainer_cfg: DictConfig,
    callbacks_cfg: DictConfig | None = None,
    logger_cfg: DictConfig | None = None,
    hparams: dict[str, Any] | None = None,
) -> L.Trainer:
    """The Trainer with atomic, ``weights_only`` checkpoint I/O and the finite-loss guard; ``hparams`` go
    to the loggers."""
    from hydra.utils import instantiate

    from models.training import AtomicCheckpointIO, FiniteLossGuard, LogHyperparams

    callbacks = [instantiate(c) for c in (callbacks_cfg or {}).values() if c is not None]
    callbacks.append(FiniteLossGuard())  # always: no NaN run ends as a result
    if hparams is not None:
        callbacks.append(LogHyperparams(hparams))
    loggers = [instantiate(c) for c in (logger_cfg or {}).values() if c is not None]
    # _convert_: Lightning reads a mapping max_time ({minutes: 5}) as a plain dict, not a DictConfig
    return instantiate(
        trainer_cfg, _convert_="partial", callbacks=callbacks, logger=loggers or False, plugins=[AtomicCheckpointIO()],
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


# Set by a parent run for its DDP workers: "1" when the run is finished and only its test runs again.
DDP_WORKER_RETEST = "RPE_DDP_WORKER_RETEST"
# Set by a parent run for its DDP workers: the run dir, read by the workers' hydra.run.dir. A sweep job's dir name
# holds `=` and `,` (row=a,seed=0), which an override's value would take for syntax (a sweep list); an environment
# value is never parsed.
DDP_WORKER_RUN_DIR = "RPE_DDP_WORKER_RUN_DIR"


def _remove_orphaned_worker_configs() -> None:
    """The private config folders of earlier runs whose parent process is gone: a parent killed by SIGKILL
    (or the machine's end) never removed its own. A folder is this user's, named ``<prefix><pid>-<random>``,
    and is removed only when no process ``<pid>`` exists."""
    root = Path(tempfile.gettempdir())
    try:
        entries = list(root.glob(f"{DDP_WORKER_FOLDER_PREFIX}*-*"))
    except OSError:
        return
    for folder in entries:
        pid_text = folder.name[len(DDP_WORKER_FOLDER_PREFIX):].split("-", 1)[0]
        if not pid_text.isdigit():
            continue
        try:
            if folder.is_symlink() or not folder.is_dir() or folder.stat().st_uid != os.getuid():
                continue
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # PermissionError: another user's live process; any other error: leave it
            continue


def _install_ddp_child_command(job: Job, cfg: DictConfig, script: Path, retest: bool) -> None:
    """Start DDP worker processes from the config this process composed and checked, never from a file
    in the run folder (which anyone could have edited since) and not from ``sys.argv``.

    Lightning re-runs the script with the parent's arguments; under a multirun those hold a whole sweep,
    and interpolations such as ``${now:}`` would resolve anew. The workers compose ``cfg`` (resolved) from
    a private temporary folder instead, named in the environment (`lifecycle.project.DDP_WORKER_CONFIG`) so that the
    command-line checks accept their ``--config-path``; they write into the same run dir. ``retest``: the
    run is finished and this process only tests it again; the workers, which read no run records, are told.
    """
    from lightning.pytorch.strategies.launchers import subprocess_script


    _remove_orphaned_worker_configs()
    # mode 0700: only this user reads or replaces it; the name carries this process's pid (see below)
    folder = tempfile.mkdtemp(prefix=f"{DDP_WORKER_FOLDER_PREFIX}{os.getpid()}-")
    job.worker_config = Path(folder)
    from lifecycle.settings import OUTPUT_DIR

    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    if isinstance(resolved.get("paths"), DictConfig) and "output_dir" in resolved.paths:
        # the run dir stays Hydra's (the workers' hydra.run.dir is this run's dir), as the settings require
        resolved.paths.output_dir = OUTPUT_DIR
    atomic_write_bytes(job.worker_config / f"{CONFIG}", OmegaConf.to_yaml(resolved).encode())
    os.environ[DDP_WORKER_CONFIG] = folder  # copied into each worker's environment by Lightning's launcher
    os.environ[DDP_WORKER_RETEST] = "1" if retest else "0"  # the workers must not fit while this process tests
    os.environ[DDP_WORKER_RUN_DIR] = str(job.run_dir)

    def command(local_rank: int) -> tuple[list[str], str]:
        cmd = [
            sys.executable, str(script), "--config-path", folder, "--config-name", Path(CONFIG).stem,
            f"hydra.run.dir=${{oc.env:{DDP_WORKER_RUN_DIR}}}", "hydra.output_subdir=null",
            f"hydra.job.name=ddp_rank{local_rank}",
        ]
        return cmd, os.getcwd()

    subprocess_script._hydra_subprocess_cmd = command
    subprocess_script._launch_process_observer = functools.partial(_watch_workers, job)


class WorkerFailed(RuntimeError):
    """A DDP worker process of this run exited with an error, or was killed by a signal (``code`` ``-signum``)."""

    def __init__(self, rank: int, code: int | None, run_dir: Path | None = None) -> None:
        how = f"exited with code {code}"
        if code is not None and code < 0:
            try:
                how = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        # Hydra logs each worker to <run dir>/<job name>.log, the job name being ddp_rank<local rank>
        log = run_dir / f"ddp_rank{rank}.log" if run_dir is not None else None
        why = f"its log: {log}" if log is not None and log.is_file() else "its own output says why"
        super().__init__(f"DDP worker rank {rank} {how} ({why}); the run stopped")


def _watch_workers(job: Job, workers: list) -> None:
    """Lightning's watch over the DDP worker processes, except that a failed worker ends the run as a failed
    job: the other workers are killed, ``failed.json`` and the record say which worker failed, and this
    process exits 1 with one line. (Lightning's own observer SIGKILLs this process, which then leaves its
    record at "running" and writes no failure.)"""
    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    class Observer(_ChildProcessObserver):
        def _terminate_all(self) -> None:
            for worker in self._child_processes:
                worker.send_signal(self._termination_signal)
            rank, code = next(((i + 1, w.returncode) for i, w in enumerate(self._child_processes) if w.returncode),
                              (0, None))
            # A stop signal to the process group (SLURM, timeout, Ctrl-C) can end a worker that has not yet
            # installed its handlers (still importing) before this process sees it: a stop, not a failure.
            signum = stop_signals().received or _stop_signal_of(code)
            if signum is not None:
                with contextlib.suppress(Exception):  # best effort, as below
                    job.save_state("interrupted", signal=signal.Signals(signum).name)
                _say_interruption_once(job.run_dir, signum)
                job.release()  # os._exit skips the job's own end, which removes the workers' config folder
                os._exit(128 + signum)
            err = WorkerFailed(rank, code, job.run_dir)
            with contextlib.suppress(Exception):  # best effort: the process ends whatever the storage says
                job.record_failure(err)
            say(f"error: {err} (recorded in {job.run_dir})", stream=sys.stderr)
            job.release()
            os._exit(1)  # this thread cannot raise into the main one, which may be waiting on the dead worker

    Observer(main_pid=os.getpid(), child_processes=workers).start()


def _repair_config(run_dir: Path, cfg: DictConfig) -> None:
    """A finished run's ``config.yaml`` that cannot be read (truncated, garbage, gone) is written again from this
    command's config, whose identity its ``run.json`` just matched: eval.py, plot_rpe and the tables read it."""
    from lifecycle.run_config import RunConfigError, load_run_config

    try:
        load_run_config(run_dir / CONFIG)
        return
    except RunConfigError as err:
        problem = one_line(err)
    with guarded(run_dir / CONFIG, "write"):
        atomic_write_bytes(run_dir / CONFIG, OmegaConf.to_yaml(cfg, resolve=True).encode())
    say(f"note: {problem}; rewritten from this command's config, which {run_dir / RUN_RECORD} names as this run's")


def _save_config_files(run_dir: Path, cfg: DictConfig) -> None:
    """``config.yaml`` (resolved) and what Hydra writes to ``.hydra/``, once the dir is known to be ours."""
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    files = {
        CONFIG: OmegaConf.to_yaml(cfg, resolve=True),
        f"{HYDRA_DIR}/config.yaml": OmegaConf.to_yaml(cfg),
        f"{HYDRA_DIR}/hydra.yaml": OmegaConf.to_yaml(OmegaConf.create({"hydra": hydra_cfg})),
        f"{HYDRA_DIR}/overrides.yaml": OmegaConf.to_yaml(OmegaConf.create(list(hydra_cfg.overrides.task))),
    }
    for name, text in files.items():
        atomic_write_bytes(run_dir / name, text.encode(), make_parents=name.startswith(HYDRA_DIR))


# ----------------------------------------------------------------------------- the run dir
def _checkpoint_facts(path: Path) -> dict[str, Any] | None:
    """A checkpoint's identity, step and loop-counter problem (`epoch_counter_problem`; ``None`` when the whole
    checkpoint is unreadable), read without loading its tensors."""
    try:
        saved = load_checkpoint(path, mmap=True)
    except Exception:
        return None
    return {"identity": saved.get(IDENTITY_KEY), "global_step": saved.get("global_step", 0),
            "epoch": saved.get("epoch", 0), "training": saved.get(CHECKPOINT_TRAINING_KEY),
            "counters": epoch_counter_problem(saved)}


def training_token(resume_from: str | None) -> str:
    """The token of the training that continues from checkpoint ``resume_from`` (its own; None: a new
    training, which gets a new one, as does one resumed from a checkpoint saved before tokens were recorded)."""
    import uuid

    facts = _checkpoint_facts(Path(resume_from)) if resume_from else None
    token = (facts or {}).get("training")
    return token if isinstance(token, str) and token else uuid.uuid4().hex[:16]


def set_aside_testset_results(run_dir: Path) -> Path | None:
    """Move the test-set results of ``run_dir`` (``testsets/*.json``) into ``testsets/stale-<UTC time>/``
    when a training starts from scratch there: they measured weights that are gone (make_tables would not
    count them either: they record another training, `lifecycle.testset_definition.training_problem`). Kept,
    not deleted; returns the folder, or None when there was nothing to move. A folder that cannot be used
    is a warning: the training goes on, and those results stay uncounted."""
    folder = run_dir / TESTSETS
    try:
        if folder.is_symlink() or not folder.is_dir():
            return None
        results = sorted(p for p in folder.iterdir()
                         if p.name.endswith(".json") and not p.name.startswith(".") and not p.is_symlink())
        if not results:
            return None
        aside = folder / f"stale-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        aside.mkdir(exist_ok=True)
        for path in results:
            os.replace(path, aside / path.name)
    except OSError as err:
        say(f"warning: cannot set aside the test-set results in {folder} ({err.strerror or type(err).__name__}):"
            " they are of weights trained before, and are not counted for this training", stream=sys.stderr)
        return None
    say(f"note: {len(results)} test-set result(s) of weights trained before moved to {aside}: this training"
        " starts from scratch; evaluate its best.ckpt again (scripts/evaluate_testsets.py)")
    return aside


def holds_results(run_dir: Path) -> bool:
    """Whether anything of value is in the run dir: a result file or a checkpoint that holds training."""
    if (run_dir / METRICS).exists():
        return True
    for path in sorted((run_dir / CHECKPOINTS).glob("*.ckpt")) if (run_dir / CHECKPOINTS).is_dir() else []:
        facts = _checkpoint_facts(path)
        if facts is None or facts["global_step"] > 0:  # unreadable ones are kept, to be safe
            return True
    return False


def _standing_result(run_dir: Path, identity: str, length: dict[str, Any]) -> dict[str, Any] | None:
    """``metrics.json`` where it is a finished result of this identity and ``length`` that nothing came after:
    readable and checked (`read_metrics`), no ``failed.json`` beside it, and no ``last.ckpt`` trained past its
    step (an extension that went on after it). ``None`` otherwise."""
    try:
        metrics = read_metrics(run_dir, identity, length)
    except RunFileError:
        return None
    if metrics is None or entry_exists(run_dir / FAILURE):
        return None
    last = _checkpoint_facts(run_dir / CHECKPOINTS / LAST) if (run_dir / CHECKPOINTS / LAST).is_file() else None
    step = metrics.get("global_step")
    if last is not None and isinstance(step, int) and int(last["global_step"] or 0) > step:
        return None
    return metrics


def _recorded_identity(run_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """The run dir's earlier record, or one rebuilt from its ``config.yaml`` when ``run.json`` is missing
    or damaged (a repair). A rebuilt record is finished, of the config's length, where ``metrics.json`` is a
    finished result of that config and length (`_standing_result`): the result then stands, as with an intact
    record. Otherwise its state is unknown, and the run's checkpoints decide what is left to do. A rebuilt
    record carries ``rebuilt: True`` (never written: `RunRecord` writes its own fields)."""
    from lifecycle.run_config import RunConfigError, load_run_config

    damage = ""
    try:
        record = read_run_record(run_dir)
        if record is not None:
            return record, ""
    except RunFileError as err:
        damage = str(err)
    config = run_dir / CONFIG
    if not config.is_file():
        return None, damage
    try:
        loaded = load_run_config(config)
        old = identity_config(loaded)
        length = run_length(loaded)
    except (RunConfigError, ValueError):
        return None, damage or f"{config} is unreadable"
    record = {"identity": identity_hash(old), "config": old, "state": "unknown", "rebuilt": True}
    metrics = _standing_result(run_dir, record["identity"], length)
    if metrics is not None:
        resumes = metrics.get("env/resumed_at")
        record.update(state="finished", length=length,
                      resumes=resumes if isinstance(resumes, list) and all(
                          isinstance(step, int) for step in resumes) else [])
    return record, damage


def claim_run_dir(run_dir: Path, identity: dict[str, Any]) -> dict[str, Any] | None:
    """Check that ``run_dir`` may hold this run; returns its earlier record when it is the same run.

    The same identity continues the run. Another identity is refused with one line naming the differing
    keys, unless the dir holds nothing of value (its run failed or stopped before training): then it is
    reused. A damaged ``run.json`` is repaired from ``config.yaml`` where that names this run, else
    refused when the dir holds results. Raises before anything is written.
    """
    record, damage = _recorded_identity(run_dir)
    if record is None and not damage and not (run_dir / CONFIG).is_file():
        return None
    if record is not None:
        old = identity_config(record["config"])  # today's definition applied to the stored config
        if identity_hash(old) == identity_hash(identity):
            if damage:
                say(f"note: {damage}; rebuilt from {run_dir / CONFIG}, which names this run")
            return record
        differences = f"another config ({config_differences(old, identity)})"
        if config_file_identity(run_dir) == identity_hash(identity):
            raise RunDirConflict(
                f"{run_dir / RUN_RECORD} is another run's record ({config_differences(old, identity)}), while"
                f" {run_dir / CONFIG} names this run: copied from another run dir? nothing was written; restore"
                " this run's run.json, or move it away to have it rebuilt")
    else:
        differences = f"a run whose record is damaged ({damage})"
    if holds_results(run_dir):
        raise RunDirConflict(
            f"{run_dir} holds {differences}; nothing was written. Give this one a new run_name=... "
            "(or hydra.sweep.dir=... for a sweep)"
        )
    say(f"note: reusing {run_dir}: it held {differences} that never trained")
    for name in (FAILURE, RUN_RECORD):
        with guarded(run_dir / name, "remove"):
            (run_dir / name).unlink(missing_ok=True)
    return None


def _trained_lengths(earlier: dict[str, Any] | None, length: dict[str, Any], fresh: bool
                     ) -> list[dict[str, Any]] | None:
    """The lengths a run dir has trained at (its first and each extension), ``length`` included: a result
    checkpoint must have been saved at one of them. None where that history is not known (a dir of an older
    version, or one whose run.json was lost), so no checkpoint is refused for it."""
    if fresh:
        return [length]
    known = earlier.get("lengths") if earlier is not None else None
    if not isinstance(known, list):
        return None
    return known if length in known else [*known, length]


def resume_checkpoint(run_dir: Path, identity: str, recorded_length: dict[str, Any] | None = None,
                      warn: bool = True) -> str | None:
    """The checkpoint a rerun continues from: ``last.ckpt``, else ``best.ckpt`` when last is unusable.

    Only readable checkpoints of this run's identity that hold training, and lie within the length its
    record names (``recorded_length``: a checkpoint of the same config trained longer is another run's), are
    resume points. A damaged ``last.ckpt`` falls back to ``best.ckpt`` (an earlier but intact state, with a
    warning, unless ``warn`` is False); if checkpoints exist and none is usable, raises `ResumeError`: never
    train from scratch over them. A checkpoint whose epoch counters disagree (`epoch_counter_problem`) is no
    resume point: the epochs it trained are not known, and a resume would record epochs it never trained.
    """
    problems: list[str] = []
    miscounted = False
    for name in (LAST, BEST):
        path = run_dir / CHECKPOINTS / name
        if not path.is_file():
            continue
        facts = _checkpoint_facts(path)
        if facts is None:
            problems.append(f"{path} is unreadable")
            continue
        if (facts["identity"] or identity) != identity:
            problems.append(f"{path} was saved by a run of another config")
            continue
        if facts["global_step"] == 0:
            continue  # saved before any training step: nothing to resume
        past = past_run_length(facts, recorded_length or {})
        if past is not None:
            problems.append(f"{path} is not this run's: {past} (the length its run.json records)")
            continue
        if facts["counters"] is not None:  # resumed, it would train fewer epochs than the run then records
            problems.append(f"{path} has {facts['counters']}")
            miscounted = True
            continue
        if problems and warn:
            say(f"warning: {'; '.join(problems)}; resuming from {path} instead", stream=sys.stderr)
        return str(path)
    if miscounted:
        problems.append("such a checkpoint was saved after a resume by an earlier version that counted an epoch"
                        " twice: the epochs it trained are not known")
    if problems:
        raise ResumeError(f"cannot resume: {'; '.join(problems)}; move it away to start over, or use a new run_name")
    return None


def split_batches(loaders: Any) -> float:
    """Batches of the whole split(s) a test read from (inf where a loader has no length: never complete)."""
    loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
    try:
        return float(sum(len(loader) for loader in loaders))
    except TypeError:
        return math.inf


def result_checkpoint(run_dir: Path, identity: str, length: dict[str, Any] | None = None,
                      lengths: list[dict[str, Any]] | None = None) -> tuple[Path, dict[str, Any]]:
    """``<run_dir>/checkpoints/best.ckpt`` and its ``(epoch, global_step)``, once it is known to be this run's
    trained, finite result (within the run's ``length`` and not past its last.ckpt: a checkpoint of the same
    config trained longer is another run's); anything else is a `NoResultError` line."""
    path = run_dir / CHECKPOINTS / BEST
    if not path.is_file():
        last = run_dir / CHECKPOINTS / LAST
        why = ("it was deleted, or the run never validated (trainer.limit_val_batches=0, or a trainer.max_steps"
               " that ends training before the first validation?)" if last.is_file()
               else "the run saved no checkpoint (it made no training step: trainer.max_epochs, max_steps and "
                    "limit_train_batches must be > 0)")
        raise NoResultError(f"no result: {path} does not exist; {why}")
    try:
        saved = load_checkpoint(path, mmap=True)
    except Exception as err:
        raise NoResultError(f"no result: {path} is unreadable ({type(err).__name__}); the run must be trained "
                            "again (move the run dir away or use a new run_name)") from None
    if saved.get(IDENTITY_KEY) not in (None, identity):
        raise NoResultError(f"no result: {path} was saved by a run of another config")
    if int(saved.get("global_step", 0)) < 1:
        raise NoResultError(f"no result: {path} holds untrained weights (global step 0)")
    made = saved.get(LENGTH_KEY)
    if made is not None and lengths is not None and made not in lengths:  # lengths: what this dir trained at
        raise NoResultError(f"no result: {path} is not this run's: it was saved by a run of length {made}, which"
                            f" this run dir never trained at ({', '.join(map(str, lengths))}); the run must be"
                            " trained again (move the run dir away or use a new run_name)")
    past = past_run_length(saved, length or {})
    last = run_dir / CHECKPOINTS / LAST
    last_facts = _checkpoint_facts(last) if past is None and last.is_file() else None  # unreadable: says nothing
    last_step = int(last_facts["global_step"]) if last_facts is not None else None
    if last_step is not None and int(saved["global_step"]) > last_step:
        past = f"it was saved at step {saved['global_step']}, after this run's last.ckpt (step {last_step})"
    if past is not None:
        raise NoResultError(f"no result: {path} is not this run's: {past}; the run must be trained again"
                            " (move the run dir away or use a new run_name)")
    bad = next((k for k, v in saved.get("state_dict", {}).items()
                if torch.is_tensor(v) and v.is_floating_point() and not bool(torch.isfinite(v).all())), None)
    if bad is not None:
        raise NoResultError(f"no result: {path} has non-finite weights ({bad})")
    token = saved.get(CHECKPOINT_TRAINING_KEY)
    return path, {"epoch": int(saved.get("epoch", 0)) + 1, "global_step": int(saved["global_step"]),
                  "training": token if isinstance(token, str) else None}


def _shorter(new: Any, old: Any) -> bool:
    """Whether a schedule limit ``new`` ends before ``old`` (None and -1 mean no limit)."""
    unlimited = (None, -1)
    return new not in unlimited and (old in unlimited or new < old)


def _refuse_destructive_rerun(cfg: DictConfig, earlier: dict[str, Any], length: dict[str, Any], run_dir: Path) -> None:
    """A rerun continues a run or extends it; it never trains it anew over its results, nor shortens it."""
    if not cfg.get("resume") and holds_results(run_dir):
        raise RunDirConflict(f"resume=false would train {run_dir} from scratch over its results; nothing was "
                             "written. Give this run a new run_name=... (or move the old run dir away)")
    old = earlier.get("length") or {}
    shorter = [k for k in ("max_epochs", "max_steps") if k in old and _shorter(length.get(k), old.get(k))]
    if shorter and holds_results(run_dir):
        key = shorter[0]
        was = "no limit" if old.get(key) in (None, -1) else old.get(key)
        raise RunDirConflict(f"trainer.{key}={length.get(key)} is shorter than {run_dir}'s schedule (trainer.{key}: "
                             f"{was}); a run can be extended, not shortened. Give this one a new run_name=...")


def _claims_limits_it_has_not(metrics: dict[str, Any], cfg: DictConfig) -> bool:
    """Whether ``metrics`` records a partial training or test (a smoke run's marks) that ``cfg`` cannot have
    given: no batch limit, no overfitting."""
    def whole(limit: Any) -> bool:
        return limit is None or (isinstance(limit, float) and limit == 1.0)

    trainer = cfg.trainer
    partial_train = metrics.get("train_complete") is False and whole(trainer.get("limit_train_batches")) and not (
        trainer.get("overfit_batches"))
    partial_test = metrics.get("test_complete") is False and whole(trainer.get("limit_test_batches"))
    return partial_train or partial_test


def _trained_position(trainer: L.Trainer, run_dir: Path) -> tuple[int, int]:
    """``(epochs done, optimizer steps)`` of the training; from last.ckpt where this process's trainer did
    not train (spawn launchers, a finished run's re-test)."""
    epoch, global_step = trainer.current_epoch, trainer.global_step
    last = run_dir / CHECKPOINTS / LAST
    if global_step == 0 and last.is_file():
        saved = load_checkpoint(last, mmap=True)
        epoch, global_step = saved["epoch"] + 1, saved["global_step"]
    return epoch, global_step


def _require_full_length(cfg: DictConfig, trainer: L.Trainer, run_dir: Path) -> None:
    """A fit that ended before the run's length (``trainer.max_time``, a callback that stopped it) is no result:
    `NoResultError`. Lightning's EarlyStopping, a deliberate end, is the exception."""
    from lightning.pytorch.callbacks import EarlyStopping

    max_epochs, max_steps = cfg.trainer.get("max_epochs"), cfg.trainer.get("max_steps", -1)
    epoch, global_step = _trained_position(trainer, run_dir)
    if max_steps not in (None, -1) and global_step >= max_steps:
        return
    if max_epochs in (None, -1) or epoch >= max_epochs:
        return
    if any(isinstance(c, EarlyStopping) and c.stopped_epoch > 0 for c in trainer.callbacks):
        return
    if cfg.trainer.get("max_time") is not None:
        why = f"trainer.max_time={cfg.trainer.get('max_time')} was reached"
        remedy = "give a larger trainer.max_time (or none) and a new run_name"
    else:
        why = "a callback stopped the training"
        remedy = "train again without what stopped it, under a new run_name"
    raise NoResultError(f"no result: {why} in epoch {epoch} of {max_epochs}, after {global_step} steps, so its"
                        f" weights are not the run's; {remedy}")


def _require_trained_epochs(cfg: DictConfig, trainer: L.Trainer) -> None:
    """A fit that counts more epochs than its optimizer steps can have trained is no result (`NoResultError`),
    never a record of epochs it did not train: each epoch of ``n`` training batches makes
    ``ceil(n / accumulate_grad_batches)`` steps (a resumed epoch's skipped batches were stepped before the stop).
    Checked where this process trained, on a loader of known length, and the fit ended by its epoch count (one
    ended by ``trainer.max_steps`` may end within an epoch)."""
    global_step, epochs, batches = trainer.global_step, trainer.current_epoch, trainer.num_training_batches
    if global_step == 0 or not math.isfinite(batches) or batches < 1:
        return
    max_steps = cfg.trainer.get("max_steps", -1)
    if max_steps not in (None, -1) and global_step >= max_steps:
        return
    per_epoch = math.ceil(batches / max(int(trainer.accumulate_grad_batches), 1))
    if global_step < epochs * per_epoch:
        raise NoResultError(
            f"no result: the fit counts {epochs} epochs but made {global_step} optimizer steps, fewer than the"
            f" {epochs * per_epoch} that {epochs} epochs of {per_epoch} take: its loop state was off, so its record"
            " would claim epochs it did not train; train it again under a new run_name")


def _check_checkpoints_writable(run_dir: Path) -> None:
    """A run that trains saves into ``checkpoints/``: a folder it cannot write is refused now, before the run's
    record changes, not after a whole epoch (which would leave a finished run, being extended, listed as failed)."""
    folder = run_dir / CHECKPOINTS
    if folder.is_dir() and not writable_folder(folder):
        raise RunFileError(f"cannot write {folder}: permission denied (read-only storage, or a folder this user may"
                           " not write); nothing was trained or written; valid: make it writable, or give a new"
                           " run_name")


def _finite_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Non-finite values are not results: they become ``null`` (metrics.json stays strict JSON)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}


# ----------------------------------------------------------------------------- the job
class Job:
    """The run dir a job works in: its lock and, once claimed, its record (the only writer of run.json)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.lock = -1
        self.writable = False
        self.record: RunRecord | None = None  # set once the job has written its first record
        self.claimed: RunRecord | None = None  # the record this job may write, once the dir is known to be its
        self.cfg: DictConfig | None = None
        self.fresh = False
        self.worker_config: Path | None = None  # the private folder of the DDP workers' config, while it exists

    def release(self) -> None:
        """At the job's end: the DDP workers' private config folder goes, then the run dir's lock."""
        if self.worker_config is not None:
            shutil.rmtree(self.worker_config, ignore_errors=True)
            self.worker_config = None
        release_lock(self.lock)

    def claim(self, cfg: DictConfig, record: RunRecord, fresh: bool) -> None:
        self.cfg, self.claimed, self.fresh = cfg, record, fresh

    def save_state(self, state: str, **extra: Any) -> None:
        """Best effort: a run dir that cannot be written any more (full disk) gets one line, not a traceback."""
        if self.record is None:
            return
        try:
            self.record.save(state, **extra)
        except (RunFileError, ValueError) as err:
            say(f"warning: could not record state {state!r}: {one_line(err)}", stream=sys.stderr)

    def record_failure(self, err: BaseException) -> str:
        """``failed.json`` (one-line message and traceback) and state failed; returns the message."""
        import traceback

        message = one_line(err)
        if self.record is None and self.claimed is not None and self.fresh and self.writable:
            # failed before its first record (a bad value in a sweep job): record it with its config
            try:
                _save_config_files(self.run_dir, self.cfg)
                self.record = self.claimed
            except (RunFileError, ValueError) as write_err:
                say(f"warning: could not record the failure: {one_line(write_err)}", stream=sys.stderr)
        if self.record is None:
            return message
        self.save_state("failed")
        try:
            atomic_write_json(self.run_dir / FAILURE, {
                "status": "failed", "error": message, "type": type(err).__name__, "identity": self.record.identity,
                "traceback": "".join(traceback.format_exception(err)), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            }, make_parents=False)
        except (RunFileError, ValueError) as write_err:
            say(f"warning: could not write {FAILURE}: {one_line(write_err)}", stream=sys.stderr)
        return message


def _is_smoke_run(cfg: DictConfig) -> bool:
    return bool(cfg.trainer.get("fast_dev_run"))


def _smoke_run(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """``trainer.fast_dev_run``: a few batches end to end; nothing is written and nothing is a result."""
    datamodule, model = build_data_and_model(cfg)
    check_generated_root(cfg.get("data") or {})  # before its folders or lock are made
    datamodule.prepare_data()
    callbacks = {k: c for k, c in (cfg.get("callbacks") or {}).items()
                 if c is not None and "Checkpoint" not in str(c.get("_target_", ""))}
    trainer = build_trainer(cfg.trainer, OmegaConf.create(callbacks))
    trainer.fit(model, datamodule=datamodule)
    if stop_signals().received is not None:
        raise RunInterrupted(stop_signals().received)
    with contextlib.suppress(OSError):
        run_dir.rmdir()  # the folder Hydra made for the job, if the run left it empty
    say("smoke run (trainer.fast_dev_run) passed; no result was recorded and the run dir was not written")
    return {}


def _logger_dirs(cfg: DictConfig, run_dir: Path) -> tuple[str, ...]:
    """The run dir's top folders its loggers write into (``csv``), for `check_layout`: their kind is checked
    before the run is claimed, as the checkpoints folder's is. (`settings.check_settings` has refused any
    logger folder outside the run dir.)"""
    from lifecycle.settings import logger_folders

    found = []
    for _, _, folder in logger_folders(cfg, str(run_dir)):
        relative = os.path.relpath(folder, os.path.abspath(run_dir))
        top = relative.split(os.sep)[0]
        if top not in (".", "..") and top not in found:
            found.append(top)
    return tuple(found)


def _claim_data(run_dir: Path, earlier: dict[str, Any] | None, data: dict[str, Any] | None
                ) -> dict[str, Any] | None:
    """The data record (`data_record`) the run keeps: refuses, before anything is written, a rerun of a run
    that trained on other data (same config, ``data.root`` at other files), since resuming or extending it
    would mix two data sets in one result. The fingerprint governs: the same files at another path resume,
    with a note. A dir that never trained takes the data now named; a run that recorded none (an older
    version) records them now."""
    recorded = (earlier or {}).get("data")
    difference = data_difference(recorded, data)
    if difference is not None:
        if holds_results(run_dir):
            raise RunDirConflict(
                f"data.root={data['root']} holds other data than {run_dir} trained on ({difference}); nothing was"
                " written. Point data.root at the data it trained on, or give this one a new run_name=...")
        say(f"note: {run_dir} never trained; it now records data {data['root']}")
    elif isinstance(recorded, dict) and data is not None and recorded.get("root") != data["root"]:
        say(f"note: the data {run_dir} trained on moved: {recorded.get('root')} -> {data['root']} (the same files)")
    if data is None and isinstance(recorded, dict):
        return recorded
    return data


def _run(cfg: DictConfig, job: Job, script: Path) -> dict[str, Any]:
    """Claim, fit (or resume), test ``best.ckpt``, write ``metrics.json``; returns the metrics."""
    from lifecycle.checkpoints import ResumeCheckpoint
    from lifecycle.settings import check_schedule, check_settings, decode_environment_values, schedule_notes

    started = time.time()
    run_dir = job.run_dir
    decode_environment_values(cfg)  # threads=${oc.env:...} is the number it spells, in the identity too
    if _is_smoke_run(cfg):
        check_settings(cfg, "train")
        return _smoke_run(cfg, run_dir)
    identity = identity_config(cfg)
    identity_id = identity_hash(identity)
    length = run_length(cfg)
    rank0 = rank_zero_only.rank == 0
    earlier = None
    if rank0:
        with guarded(run_dir, "use the run dir"):
            check_layout(run_dir, _logger_dirs(cfg, run_dir))
            job.lock, job.writable = lock_run_dir(run_dir)
            earlier = claim_run_dir(run_dir, identity)
            data = _claim_data(run_dir, earlier, data_record(cfg.get("data")))
        lengths = _trained_lengths(earlier, length, fresh=earlier is None and not (run_dir / CONFIG).exists())
        fields = {"lengths": lengths} if lengths is not None else {}
        job.claim(cfg, RunRecord(run_dir, identity_id, identity, length,
                                 fields | ({"data": data} if data is not None else {})), fresh=earlier is None)
    # A sweep's later jobs reach here with values the command line's check did not see: a bad one is then
    # a failed job, recorded in its own (claimed) run dir so that the tables list it.
    check_settings(cfg, "train")
    check_schedule(cfg)
    if earlier is not None and rank0:
        _refuse_destructive_rerun(cfg, earlier, length, run_dir)
    finished = earlier is not None and earlier.get("state") == "finished" and earlier.get("length") == length
    if not rank0:  # a DDP worker reads no records: it fits, or only tests, as its parent decided
        finished = os.environ.get(DDP_WORKER_RETEST) == "1"
    if rank0 and earlier is not None and not finished and cfg.get("resume"):
        # a rerun with no resume point is refused now, before its record changes: a finished run's extension
        # refused later would have left its result listed as failed
        resume_checkpoint(run_dir, identity_id, earlier.get("length"), warn=False)
    if finished and rank0:
        try:
            stored = read_metrics(run_dir, identity_id, length)
            problem = "" if stored is not None else f"{run_dir / METRICS} is missing"
        except RunFileError as err:
            stored, problem = None, str(err)
        if stored is not None and cfg.get("test_after_fit") and not any(k in stored for k in HEADLINE_METRICS):
            stored, problem = None, f"{run_dir / METRICS} holds no test result (the run had test_after_fit=false)"
        elif stored is not None and _claims_limits_it_has_not(stored, cfg):
            stored, problem = None, (f"{run_dir / METRICS} says the run trained or tested on part of its splits,"
                                     " which its config does not limit")
        elif stored is not None and entry_exists(run_dir / FAILURE):
            # the job removes failed.json before it runs again, so one beside a finished record was put there
            # later: the records disagree, and re-testing settles which is true
            stored, problem = None, (f"{run_dir / FAILURE} says the run failed, while {run_dir / RUN_RECORD} says"
                                     " finished")
        if stored is not None:  # the result was recorded from best.ckpt: it stands, whatever became of the weights
            _repair_config(run_dir, cfg)
            if earlier.get("rebuilt"):  # run.json was damaged or gone: written again, as the finished record
                job.record = job.claimed
                job.record.fields["resumes"] = list(earlier.get("resumes") or [])
                job.save_state("finished")
            anew = "a new hydra.sweep.dir" if _is_multirun() else "a new run_name"  # a sweep job's dir is the sweep's
            say(f"{run_dir} is finished (same config and length): not training again, its {METRICS} stands; "
                f"use {anew} to train anew, or a larger trainer.max_epochs to extend it")
            return stored
        result_checkpoint(run_dir, identity_id, length, earlier.get("lengths"))  # no weights for it: one line
        say(f"note: {problem}; re-testing {run_dir / CHECKPOINTS / BEST}")
    if rank0 and not job.writable:
        raise RunFileError(f"cannot write {run_dir}: the storage is read-only or not writable")
    if rank0 and not finished:
        _check_checkpoints_writable(run_dir)
    if cfg.get("print_config") and not finished:
        print_config_tree(cfg)
    if rank0 and not finished:
        for note in schedule_notes(cfg):
            say(f"note: {note}")
    set_threads(cfg.get("threads"))
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    if rank0:
        job.record = job.claimed
        job.record.fields["resumes"] = list((earlier or {}).get("resumes") or [])
        if earlier is None:  # the findings as they stand when the run starts, never a later copy
            snapshot = save_findings_snapshot(run_dir, cfg.get("ablation"))
            if snapshot is not None:
                job.record.fields["findings_sha256"] = snapshot
        elif earlier.get("findings_sha256"):
            job.record.fields["findings_sha256"] = earlier["findings_sha256"]
        job.record.save("running")
        for stale in remove_stale_temp_files(run_dir):
            say(f"removed {stale} (left by a write that was killed)")
        with guarded(run_dir / FAILURE, "remove"):
            (run_dir / FAILURE).unlink(missing_ok=True)  # a resumed run is no longer failed
        if not finished:  # a re-test leaves the run's files as they are, the result aside
            _save_config_files(run_dir, cfg)
        with guarded(run_dir / CHECKPOINTS, "create"):
            (run_dir / CHECKPOINTS).mkdir(exist_ok=True)
    if rank0:  # the process that starts the workers; a worker (killed, say) would leave a folder of its own
        _install_ddp_child_command(job, cfg, script, retest=finished)

    datamodule, model = build_data_and_model(cfg)
    if hasattr(model, "check_datamodule"):  # the model's own data check first: it says more than the monitor's
        model.check_datamodule(datamodule)
    check_monitored_metrics(cfg.get("callbacks"), model)
    if rank0:
        # a sweep's later jobs have values the command line did not check: nothing is made for a data root
        # (its folders, its generation lock) before it is known to lie outside every run dir and data root
        check_generated_root(cfg.get("data") or {})
        datamodule.prepare_data()  # generate data or reject a bad data.root before the Trainer starts
    trainer = build_trainer(cfg.trainer, cfg.get("callbacks"), cfg.get("logger"), run_hparams(cfg))
    resume = next((c for c in trainer.callbacks if isinstance(c, ResumeCheckpoint)), None)
    if resume is not None:
        resume.identity = identity_id
        resume.length = length
    for logger in trainer.loggers:
        _ = logger.version  # fix the log version now, so fit and test (even in spawned workers) share it
    recorded = earlier.get("length") if earlier is not None else None
    resume_from = resume_checkpoint(run_dir, identity_id, recorded) if cfg.get("resume") else None
    if resume is not None:
        resume.training = training_token(resume_from)
    if rank0 and not finished and resume_from is None:
        set_aside_testset_results(run_dir)
    if not finished:
        resumed_at = None
        if resume_from:
            say(f"resuming from {resume_from}")
            if rank0 and job.record is not None:
                resumed_at = (_checkpoint_facts(Path(resume_from)) or {}).get("global_step")
                job.record.fields["resumes"].append(resumed_at)
        stop_signals().checkpoint = resume
        try:
            trainer.fit(model, datamodule=datamodule, ckpt_path=resume_from, weights_only=True)
        finally:
            stop_signals().checkpoint = None
        if resumed_at is not None and trainer.global_step == resumed_at and job.record is not None:
            # the checkpoint was already at the run's end: nothing was trained after it, so no sitting was added
            job.record.fields["resumes"].pop()
    if stop_signals().received is not None:  # arrived after the last batch: last.ckpt is the epoch's end
        raise RunInterrupted(stop_signals().received)
    if not finished:
        _require_full_length(cfg, trainer, run_dir)
        _require_trained_epochs(cfg, trainer)
    best, steps = result_checkpoint(run_dir, identity_id, length, job.record.fields.get("lengths") if job.record
                                    else None)
    # The result is the test of best.ckpt, and only that: the last epoch's validation numbers (still in
    # trainer.callback_metrics) are another model's. Without the test, metrics.json holds no result.
    metrics: dict[str, Any] = {k: v for k, v in scalar_metrics(trainer.callback_metrics).items()
                               if k.startswith(("train/", "cost/"))} if not finished else {}
    if cfg.get("test_after_fit"):
        tested = trainer.test(model, datamodule=datamodule, ckpt_path=str(best), verbose=False, weights_only=True)
        if stop_signals().received is not None:  # during the test: its numbers are not a result
            raise RunInterrupted(stop_signals().received)
        metrics.update(scalar_metrics(tested[0] if tested else {}))
        headline = next((k for k in HEADLINE_METRICS if k in metrics), None)
        if headline is None:
            raise NoResultError(f"no result: the test of {best} logged none of {', '.join(HEADLINE_METRICS)} "
                                f"(trainer.limit_test_batches={cfg.trainer.get('limit_test_batches')})")
        if not math.isfinite(metrics[headline]):
            raise NoResultError(f"no result: {headline} of {best} is {metrics[headline]}")
        metrics["tested_batches"] = int(sum(trainer.num_test_batches))
        # False: a part of the split (a limit below its length), which make_tables lists as no result
        metrics["test_complete"] = metrics["tested_batches"] >= split_batches(trainer.test_dataloaders)
    else:
        metrics["tested"] = False  # test_after_fit=false: `python eval.py ckpt_path=<best.ckpt>` gives the result
    epoch, global_step = _trained_position(trainer, run_dir)
    metrics.update(
        epoch=epoch, global_step=global_step, best_epoch=steps["epoch"], best_step=steps["global_step"],
        best_checkpoint=f"{CHECKPOINTS}/{BEST}", run_dir=str(run_dir), identity=identity_id,
        wall_time_s=round(time.time() - started, 1),
        params=sum(p.numel() for p in model.parameters() if p.requires_grad),
    )
    if steps["training"] is not None:  # which training's weights (best.ckpt) the result is of
        metrics[TRAINING_KEY] = steps["training"]
    metrics.update(provenance(cfg, job.record.fields.get("resumes") if job.record else None))
    recorded_data = job.record.fields.get("data") if job.record else None
    if isinstance(recorded_data, dict):  # what data it trained on, where no generator names them (make_tables)
        metrics.update({"data/root": recorded_data.get("root"), "data/files": recorded_data.get("files")})
    # False: each epoch trained on a part of the split (debug limits): a smoke run, which make_tables lists
    # as no result
    metrics["train_complete"] = (trained_whole_epochs(cfg.trainer.get("limit_train_batches"), trainer, datamodule)
                                 and not cfg.trainer.get("overfit_batches"))  # overfitting a few batches: a smoke run
    metrics = _finite_metrics(metrics)
    if trainer.is_global_zero:
        atomic_write_json(run_dir / METRICS, with_checksum(metrics), make_parents=False)
        job.record.save("finished")
        summary = ", ".join(f"{k} {metrics[k]:.2f}" for k in ("val/top1", "val/top5", "val/AP")
                            if metrics.get(k) is not None)
        say(f"\n{summary}\nrun dir: {run_dir}")
        partial = partial_run(metrics)
        if partial:
            say(f"note: not a result: {partial}; scripts/make_tables.py lists this run as no result")
    return metrics


DEFAULT_THREADS = torch.get_num_threads()  # torch's own count, restored for a sweep's job that sets none


def set_threads(threads: int | None) -> None:
    """torch's intra-op threads for this job: ``threads``, or torch's default where it is null."""
    torch.set_num_threads(int(threads) if threads else DEFAULT_THREADS)


def save_findings_snapshot(run_dir: Path, ablation: str | None) -> str | None:
    """Copy ``findings/<ablation>.yaml`` into the run dir (`FINDINGS_SNAPSHOT`) and return the sha256 of its
    bytes; None where the task has no findings file. The copy shows which findings existed before the run's
    results did: make_tables counts a finding as pre-registered only where every run it reads holds it."""
    import hashlib

    if not ablation:
        return None
    source = FINDINGS_DIR / f"{ablation}.yaml"
    if not source.is_file():
        return None
    data = source.read_bytes()
    atomic_write_bytes(run_dir / FINDINGS_SNAPSHOT, data, make_parents=False)
    return hashlib.sha256(data).hexdigest()


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The git commit of the code that trains, with ``+dirty`` where the tracked code (``rpe``, ``models``,
    ``data``, ``configs``, the entry points) differs from it; ``unknown`` outside a git checkout. A run
    identity covers the config, not the code: the same config trained by other code can give other numbers."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    # git reads only the checkout's own config: no fsmonitor or other command from a global or system config
    # (one named by a HOME the job was given) runs inside a training
    git = ["git", "-c", "core.fsmonitor=false", "-C", str(root)]
    quiet = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    try:
        commit = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, env=quiet,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--", "rpe", "models", "data",
                                "configs", "train.py", "eval.py"], capture_output=True, env=quiet,
                               text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit}+dirty" if dirty else commit or "unknown"


@functools.cache
def cpu_kernels() -> str:
    """Which CPU kernels torch runs here, as ``<vendor> <capability> bf16:<path>`` (``GenuineIntel AVX512
    bf16:onednn``, ``AuthenticAMD AVX2 bf16:native``): the vendor (MKL picks its code paths by it), ATen's
    vector width, and whether a bf16 matrix product goes to oneDNN (CPUs with AVX-512) or to ATen's own
    kernel. Two machines that differ in any of these round differently, so the same config trained on both
    gives slightly different numbers; on one kind of machine it gives the same numbers bit for bit."""
    vendor = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("vendor_id"):
                vendor = line.split(":", 1)[1].strip() or vendor
                break
    if vendor == "unknown":
        import platform

        vendor = platform.machine() or vendor
    bf16 = "onednn" if torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported() \
        else "native"
    return f"{vendor} {torch.backends.cpu.get_cpu_capability()} bf16:{bf16}"


def provenance(cfg: DictConfig, resumes: list[Any] | None) -> dict[str, Any]:
    """What can still change a result of the same identity, recorded beside it (make_tables flags a cell
    whose runs differ in any): the code's commit, the torch version, the CPU thread count, the CPU's kernels
    (`cpu_kernels`), the device, the precision, and the steps this run was resumed at (empty: trained in one
    sitting)."""
    trainer_cfg = cfg.get("trainer") or {}
    device = str(trainer_cfg.get("accelerator", "cpu"))
    if device in ("gpu", "cuda", "auto") and torch.cuda.is_available():
        device = torch.cuda.get_device_name(0)
    return {"env/code": code_version(), "env/torch": torch.__version__, "env/threads": torch.get_num_threads(),
            "env/cpu": cpu_kernels(), "env/device": device,
            "env/precision": str(trainer_cfg.get("precision", "32-true")), "env/resumed_at": list(resumes or [])}


def trained_whole_epochs(limit: Any, trainer: L.Trainer, datamodule: Any) -> bool:
    """Whether every epoch went through the whole training split: no ``trainer.limit_train_batches``, a
    fraction of 1.0, or a batch count that reaches the split's length."""
    if limit is None or (not isinstance(limit, int) and float(limit) >= 1.0):
        return True
    if not isinstance(limit, int):
        return False
    loader = trainer.train_dataloader if trainer.train_dataloader is not None else datamodule.train_dataloader()
    return limit >= split_batches(loader)


def run(cfg: DictConfig, script: Path | None = None) -> dict[str, Any]:
    """One job in this process, for tests and notebooks: as `run_job`, but errors are raised, not recorded."""
    from hydra.core.hydra_config import HydraConfig

    job = Job(Path(HydraConfig.get().runtime.output_dir).resolve())
    stop_signals().reset()
    try:
        return _run(cfg, job, script or Path(__file__).resolve().parents[1] / "train.py")
    finally:
        job.release()


def _is_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def finish_wandb(exit_code: int) -> None:
    """Close this job's W&B run (marked failed when ``exit_code`` != 0): the next job opens its own."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish(exit_code=exit_code)


def _stop_signal_of(returncode: int | None) -> int | None:
    """The stop signal (or SIGINT) that ended a child process with ``returncode`` (``-signum``), else None."""
    if returncode is None or returncode >= 0:
        return None
    return -returncode if -returncode in (*STOP_SIGNALS, int(signal.SIGINT)) else None


def _interruption_line(run_dir: Path | None, signum: int) -> str:
    name = signal.Signals(signum).name
    if run_dir is None:  # outside any job: between two of a sweep's jobs, or before a run's job began
        if _is_multirun():
            what = "sweep interrupted between two jobs"
        elif current().sweeping:  # the launching process of jobs that run in processes of their own (submitit)
            what = "sweep interrupted (a job in progress saves its state in its own run dir)"
        else:
            what = "run interrupted before its job began"
        return f"error: {what} by {name}; rerun the same command to go on (finished jobs are not trained again)"
    where = f"sweep interrupted during job {run_dir}" if _is_multirun() else f"run interrupted ({run_dir})"
    saved = (f"{CHECKPOINTS}/{LAST} holds its state" if (run_dir / CHECKPOINTS / LAST).is_file()
             else "no checkpoint yet")
    return f"error: {where} by {name}; {saved}, rerun the same command to resume"


def _say_interruption_once(run_dir: Path | None, signum: int) -> None:
    """The interruption's one line, from rank 0 only, and only once in this command (the child-process observer
    and the job's own handler may both see the same signal)."""
    command = current()
    if rank_zero_only.rank != 0 or command.interruption_said:
        return
    command.interruption_said = True
    say(_interruption_line(run_dir, signum), stream=sys.stderr)


def _report_interruption(run_dir: Path | None, signum: int, chain: bool = True) -> None:
    """Print one line (and the sweep's summary), exit ``128 + signum`` like a shell. ``chain``: this process got the
    signal, so a launcher's own handler of it runs too (not so for a signal that ended a worker only). A DDP worker
    says nothing (its rank 0 reports the run), and the line is said once per command."""
    _say_interruption_once(run_dir, signum)
    failed_jobs = current().failed_jobs
    if failed_jobs and rank_zero_only.rank == 0:
        say(f"error: {len(failed_jobs)} sweep job(s) failed:", *(f"  {j}" for j in failed_jobs), stream=sys.stderr)
    if chain:
        chain_previous_handler(signum)
    sys.exit(128 + signum)


def end_ddp_workers(timeout_s: float = 60.0) -> list[tuple[int, int]]:
    """After a failed job: wait for its DDP worker processes (they fail with it) and stop the child-process
    observer from watching them (`_watch_workers`), which would otherwise end this process in the middle of
    the sweep's next job, with no summary. Returns ``(rank, exit code)`` of the workers that exited with an
    error before this process stopped them."""
    import subprocess
    import threading

    failed = []
    for thread in threading.enumerate():
        workers = getattr(thread, "_child_processes", None)
        if thread.name != "child-process-observer" or not isinstance(workers, list):
            continue
        thread._child_processes = []  # its next check finds nothing to watch and ends (Lightning's private API)
        for rank, worker in enumerate(workers, start=1):
            try:
                worker.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
                continue
            if worker.returncode:
                failed.append((rank, worker.returncode))
    return failed


# How a lost DDP peer shows in the survivors (gloo, NCCL): their error is then the other process's failure
PEER_LOST = re.compile(r"closed by peer|reset by peer|broken pipe|communicator was aborted|socket timeout", re.I)


def check_job_dir(output_dir: str | Path, sweep_dir: str | Path) -> None:
    """A sweep job's run dir, resolved, lies strictly inside its resolved sweep dir (links followed)."""
    job_dir, sweep = Path(os.path.realpath(output_dir)), Path(os.path.realpath(sweep_dir))
    if job_dir == sweep or sweep not in job_dir.parents:
        raise CommandLineError(f"this sweep job's run dir {output_dir} is not inside its sweep dir {sweep_dir}"
                               f" (it resolves to {job_dir}); valid: a hydra.sweep.subdir without '..' or links"
                               " that lead out")


def run_job(cfg: DictConfig, script: Path) -> float | None:
    """The body of train.py's ``main``: run one job and record how it ended; returns the sweep objective.

    Exit codes: 0 finished; 2 a user error (one line); ``128 + signum`` interrupted; in a sweep a failed job
    is listed and the sweep goes on (train.py then exits 1).
    """
    from hydra.core.hydra_config import HydraConfig


    output_dir = HydraConfig.get().runtime.output_dir
    if _is_multirun():
        try:  # before anything is written: a subdir that resolved out of the sweep dir names no dir of this sweep
            check_job_dir(output_dir, HydraConfig.get().sweep.dir)
        except CommandLineError as err:
            with contextlib.suppress(OSError):
                os.rmdir(output_dir)  # the empty dir Hydra made for the job; never a dir with anything in it
            say(f"error: job refused: {err}", stream=sys.stderr)
            current().failed_jobs.append(f"{output_dir}: {err}")
            return float("nan")
    job = Job(Path(output_dir).resolve())
    # Lightning's DDP launcher leaves LOCAL_RANK, WORLD_SIZE, MASTER_PORT, ... in this process's
    # environment; the next job of a multirun would take them as "workers already exist" and wait forever.
    environment = dict(os.environ)
    stop_signals().reset()
    install_stop_signals()
    exit_code = 1
    try:
        metrics = _run(cfg, job, script)
        exit_code = 0
        if partial_run(metrics):  # a smoke run's number is no result: a sweeper (optuna) must not rank it
            return float("nan") if _is_multirun() else None
        return next((metrics[k] for k in HEADLINE_METRICS if metrics.get(k) is not None), None)
    except BaseException as err:
        signum = err.signum if isinstance(err, RunInterrupted) else stop_signals().received
        if signum is None and (isinstance(err, KeyboardInterrupt) or isinstance(err.__context__, KeyboardInterrupt)):
            signum = int(signal.SIGINT)  # Ctrl-C: Lightning shuts down and exits 1; say so and exit as a shell does
        if signum is not None or isinstance(err, KeyboardInterrupt | SystemExit):
            job.save_state("interrupted", **({"signal": signal.Signals(signum).name} if signum else {}))
            if signum is not None:
                _report_interruption(job.run_dir, signum)
            raise
        if not isinstance(err, Exception):
            raise
        failed_workers = end_ddp_workers()  # first: the observer ends this process once a worker has failed
        stopped = next(filter(None, (_stop_signal_of(code) for _, code in failed_workers)), None)
        if stopped is not None:  # a worker ended by a stop signal to the process group: this process lost its peer
            job.save_state("interrupted", signal=signal.Signals(stopped).name)
            _report_interruption(job.run_dir, stopped, chain=False)
        if failed_workers and PEER_LOST.search(str(err)):  # this process lost a worker that failed: name it
            # the lost connection stays in failed.json's traceback as the context; the line names the worker
            # (a cause would be what `one_line` reports: the collective's socket text)
            lost, err = err, WorkerFailed(*failed_workers[0], job.run_dir)
            err.__context__ = lost
        message = job.record_failure(err)
        if _is_multirun():
            # One failed job must not stop the sweep: report it, keep going, summarise at the end.
            say(f"error: job failed ({job.run_dir}): {message}", stream=sys.stderr)
            current().failed_jobs.append(f"{job.run_dir}: {message}")
            return float("nan")  # the optuna sweeper tells a trial without a number as failed (lifecycle/sweeper.py)
        if isinstance(err, user_error_types()):
            if os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) != "0":
                sys.exit(2)  # a DDP worker: rank 0 reports the same error, once
            report_user_error(err)
        if isinstance(err, WorkerFailed):
            say(f"error: {message} (recorded in {job.run_dir})", stream=sys.stderr)
            sys.exit(1)
        raise
    finally:
        job.release()  # after the run record's last write
        restore_stop_signals()
        finish_wandb(exit_code)
        os.environ.clear()
        os.environ.update(environment)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()  # each multirun job opens its own process group


def interrupted_outside_a_job(signum: int) -> None:
    """A stop signal while Hydra was between jobs (composing the next, a sweeper's bookkeeping): one line, the
    sweep's failed jobs, exit ``128 + signum``."""
    _report_interruption(None, signum)


def after_sweep() -> int:
    """After Hydra returns: list the sweep's failed jobs; the exit code (1 if any failed)."""
    failed_jobs = current().failed_jobs
    if failed_jobs:
        say(f"error: {len(failed_jobs)} sweep job(s) failed:", *(f"  {j}" for j in failed_jobs), stream=sys.stderr)
        return 1
    return 0
