"""What makes two runs the same run, and two runs the same table cell: defined once, here.

A run's *identity* is its resolved config minus `VOLATILE_KEYS` (labels, logging, paths, data location
and loading) and minus `LENGTH_KEYS` (a run may be extended to more epochs and stays the same run). A
rerun resumes a run dir only with the same identity. A table *cell* pools runs whose identity is the
same except for the seed, and whose length is the same: `cell_key`.

``data.root`` is not identity: what the data *are* is. Generated data are named by their generator's
settings (in the identity; the marker's content digest is checked at every start). Data without a generator
(``data.generator=null``: a user's ImageFolder, ImageNet, COCO) are named by `data_record`, a fingerprint of
their files' names, sizes and mtimes recorded in run.json and metrics.json: a rerun whose fingerprint differs
is refused (`data_difference`) and make_tables keeps such runs apart. The fingerprint governs, not the
path: a data set moved or copied with its files' times (``mv``, ``cp -a``, ``rsync -a``) resumes, with a
note naming both paths; the same path holding other files does not.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from omegaconf import DictConfig, OmegaConf

# Keys that never change what is trained or what is measured: labels, logging, paths, where the data
# lives and how it is loaded, how often the resume point is saved.
VOLATILE_KEYS = (
    "name", "run_name", "task_name", "print_config", "resume", "test_after_fit", "logger", "paths", "hydra",
    "trainer.log_every_n_steps", "trainer.enable_model_summary", "trainer.enable_progress_bar",
    "trainer.default_root_dir", "data.root", "data.num_workers", "data.pin_memory",
    "callbacks.progress_bar", "callbacks.rich_model_summary", "callbacks.model_checkpoint.dirpath",
    "callbacks.last_checkpoint.dirpath", "callbacks.last_checkpoint.every_n_train_steps",
)
# The schedule's length: a finished run given a larger one is extended, in its own run dir.
LENGTH_KEYS = ("trainer.max_epochs", "trainer.max_steps")
SEED_KEY = "seed"
# One name per callback class in an identity: the name run dirs and the committed archives (docs/benchmark_runs/,
# docs/ablations_mini_runs/) record, in run.json and config.yaml, and hashed into their identities. A class
# that moved keeps the name it was recorded under: today's config of a run then has that run's identity, so
# it resumes the run's dir and pools with the archived runs in one table cell. New name -> recorded name.
RECORDED_CALLBACK_TARGETS = {"lifecycle.checkpoints.ResumeCheckpoint": "models.training.ResumeCheckpoint"}


def _finite(value: Any) -> Any:
    """Non-finite floats as their names ("inf", "nan"): a record stays strict JSON, whatever the config held."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _container(cfg: DictConfig | dict) -> dict[str, Any]:
    container = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    return _finite(json.loads(json.dumps(container, default=str)))  # a deep copy of plain values


def _pop(container: dict[str, Any], key: str) -> Any:
    *parents, leaf = key.split(".")
    node: Any = container
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    return node.pop(leaf, None) if isinstance(node, dict) else None


def identity_config(cfg: DictConfig | dict) -> dict[str, Any]:
    """The resolved config minus `VOLATILE_KEYS` and `LENGTH_KEYS`, each callback under its recorded name
    (`RECORDED_CALLBACK_TARGETS`): what a run dir's results depend on."""
    container = _container(cfg)
    for key in VOLATILE_KEYS + LENGTH_KEYS:
        _pop(container, key)
    callbacks = container.get("callbacks")
    for node in callbacks.values() if isinstance(callbacks, dict) else ():
        target = node.get("_target_") if isinstance(node, dict) else None
        if isinstance(target, str) and target in RECORDED_CALLBACK_TARGETS:
            node["_target_"] = RECORDED_CALLBACK_TARGETS[target]
    return container


def data_record(data: Any) -> dict[str, Any] | None:
    """``{"root": real path, "files": digest, "count": files}`` of data without a generator
    (`data.generation.scan_files` over its split folders, or the whole root where it names none); None for
    generated data (their generator settings are in the identity) and for a root that cannot be read (the
    data module names that)."""
    from pathlib import Path

    from data.generation import scan_files

    if not hasattr(data, "get") or data.get("generator") is not None or data.get("root") is None:
        return None
    root = Path(str(data.get("root"))).expanduser().resolve()
    splits = [str(data.get(key)) for key in ("train_split", "val_split", "test_split") if data.get(key)]
    try:
        digest, count = scan_files(root, splits or None)
    except OSError:
        return None
    return {"root": str(root), "files": digest, "count": count}


def data_difference(recorded: Any, now: dict[str, Any] | None) -> str | None:
    """Why data ``now`` (`data_record`) are not the data a run recorded, or None (also where either is
    unknown: a run of an older version, generated data)."""
    if not isinstance(recorded, dict) or now is None or recorded.get("files") == now["files"]:
        return None
    return (f"{recorded.get('root')} ({recorded.get('count')} files, fingerprint {str(recorded.get('files'))[:12]})"
            f" -> {now['root']} ({now['count']} files, fingerprint {now['files'][:12]})")


def past_run_length(saved: dict[str, Any], length: dict[str, Any]) -> str | None:
    """Why a checkpoint (its ``epoch``, 0-based, and ``global_step``) lies past a run's ``length``
    (`run_length`), or None: such weights trained longer than the run and are another run's."""
    epochs, steps = int(saved.get("epoch", 0)) + 1, int(saved.get("global_step", 0))
    max_epochs, max_steps = length.get("max_epochs"), length.get("max_steps")
    if isinstance(max_epochs, int) and max_epochs > 0 and epochs > max_epochs:
        return f"it was saved in epoch {epochs}, past this run's trainer.max_epochs={max_epochs}"
    if isinstance(max_steps, int) and max_steps > 0 and steps > max_steps:
        return f"it was saved at step {steps}, past this run's trainer.max_steps={max_steps}"
    return None


def run_length(cfg: DictConfig | dict) -> dict[str, Any]:
    """``{"max_epochs": ..., "max_steps": ...}``: how long the run trains."""
    trainer = (cfg.get("trainer") if hasattr(cfg, "get") else None) or {}
    return {key.split(".")[-1]: trainer.get(key.split(".")[-1]) for key in LENGTH_KEYS}


def identity_hash(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as ``{"a.b.c": leaf}`` (an empty dict is a leaf)."""
    if not isinstance(tree, dict) or not tree:
        return {prefix: tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def cell_key(cfg: DictConfig | dict) -> str:
    """The key of a run's table cell: its identity without the seed, with its length."""
    identity = identity_config(cfg)
    identity.pop(SEED_KEY, None)
    return identity_hash({"identity": identity, "length": run_length(cfg)})


def config_differences(old: dict[str, Any], new: dict[str, Any], limit: int = 4) -> str:
    """``key: old -> new`` for the first ``limit`` differing keys (dotted), ``, ... (N more)`` after."""
    flat_old, flat_new = flatten(old), flatten(new)
    unset = "<unset>"
    # 32 and 32.0 (or 1 and true) are equal in Python but hash as different JSON: a difference of spelling
    keys = sorted(k for k in flat_old.keys() | flat_new.keys() if flat_old.get(k, unset) != flat_new.get(k, unset)
                  or type(flat_old.get(k, unset)) is not type(flat_new.get(k, unset)))
    shown = ", ".join(f"{k}: {flat_old.get(k, unset)} -> {flat_new.get(k, unset)}" for k in keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")
