"""Train a model: ``python train.py [group=option ...] [key=value ...]`` (Hydra).

Composes ``configs/train.yaml``, fits, tests the best checkpoint on the validation split and
writes ``metrics.json`` into the run dir. See the README for the groups and the recipes.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

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


def newest_checkpoint(run_dir: Path) -> str | None:
    """The checkpoint to resume from: the newest of last, interrupted and SLURM-requeue ones."""
    candidates = [
        *glob.glob(str(run_dir / "checkpoints" / "last.ckpt")),
        *glob.glob(str(run_dir / "checkpoints" / "interrupted.ckpt")),
        *glob.glob(str(run_dir / "hpc_ckpt_*.ckpt")),
    ]
    return max(candidates, key=os.path.getmtime) if candidates else None


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
    """Instantiate the Trainer with atomic, ``weights_only`` checkpoint I/O; ``hparams`` go to the loggers."""
    from hydra.utils import instantiate

    from models.training import AtomicCheckpointIO, LogHyperparams

    callbacks = [instantiate(c) for c in (callbacks_cfg or {}).values() if c is not None]
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


def run(cfg: DictConfig) -> dict[str, Any]:
    """Fit, test the best checkpoint, write ``metrics.json``; returns the metrics."""
    from hydra.core.hydra_config import HydraConfig

    from models.training import atomic_write_json

    started = time.time()
    run_dir = Path(HydraConfig.get().runtime.output_dir).resolve()
    if cfg.get("print_config"):
        print_config_tree(cfg)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    if rank_zero_only.rank == 0:
        (run_dir / FAILURE_FILE).unlink(missing_ok=True)  # a resumed run is no longer failed
        OmegaConf.save(cfg, run_dir / "config.yaml.tmp", resolve=True)
        os.replace(run_dir / "config.yaml.tmp", run_dir / "config.yaml")
    _install_ddp_child_command(run_dir)

    datamodule, model = build_data_and_model(cfg)
    if rank_zero_only.rank == 0:
        datamodule.prepare_data()  # generate data or reject a bad data.root before the Trainer starts
    trainer = build_trainer(cfg.trainer, cfg.get("callbacks"), cfg.get("logger"), run_hparams(cfg))
    for logger in trainer.loggers:
        _ = logger.version  # fix the log version now, so fit and test (even in spawned workers) share it
    resume_from = newest_checkpoint(run_dir) if cfg.get("resume") else None
    if resume_from:
        print(f"resuming from {resume_from}")
    trainer.fit(model, datamodule=datamodule, ckpt_path=resume_from, weights_only=True)
    metrics = _scalar_metrics(trainer.callback_metrics)
    best = getattr(trainer.checkpoint_callback, "best_model_path", "") or None
    if cfg.get("test_after_fit"):
        trainer.test(model, datamodule=datamodule, ckpt_path=best or "last", verbose=False, weights_only=True)
        metrics.update(_scalar_metrics(trainer.callback_metrics))
    epoch, global_step = trainer.current_epoch, trainer.global_step
    dirpath = getattr(trainer.checkpoint_callback, "dirpath", None)
    last = os.path.join(dirpath, "last.ckpt") if dirpath else ""
    if global_step == 0 and last and os.path.isfile(last):
        # spawn launchers train in child processes; the main process only gets metrics and weights back
        from models.training import load_checkpoint

        saved = load_checkpoint(last)
        epoch, global_step = saved["epoch"] + 1, saved["global_step"]
    metrics.update(
        epoch=epoch, global_step=global_step, best_checkpoint=best or "",
        run_dir=str(run_dir), wall_time_s=round(time.time() - started, 1),
        params=sum(p.numel() for p in model.parameters() if p.requires_grad),
    )
    if trainer.is_global_zero:
        atomic_write_json(run_dir / "metrics.json", metrics)
        summary = ", ".join(f"{k} {metrics[k]:.2f}" for k in ("val/top1", "val/top5", "val/AP") if k in metrics)
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


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    run_dir = Path(HydraConfig.get().runtime.output_dir).resolve()
    # Lightning's DDP launcher leaves LOCAL_RANK, WORLD_SIZE, MASTER_PORT, ... in this process's
    # environment; the next job of a multirun would take them as "workers already exist" and wait forever.
    environment = dict(os.environ)
    try:
        metrics = run(cfg)
    except Exception as err:
        message = record_failure(run_dir, err) if rank_zero_only.rank == 0 else ""
        if _is_multirun():
            # One failed job must not stop the sweep: report it, keep going, summarise at the end.
            print(f"error: job failed ({run_dir}): {message}", file=sys.stderr)
            _failed_jobs.append(f"{run_dir}: {message}")
            return float("nan")  # optuna records a NaN objective as a failed trial
        if isinstance(err, _user_error_types()):
            report_user_error(err)
        raise
    finally:
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
