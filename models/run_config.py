"""Rebuild a run's data module and model from its ``config.yaml`` without running code from the file.

A run dir is shared and downloaded like any data file, so reading it must never call what it names:
Hydra's ``instantiate`` would import and call any ``_target_`` (``os.system``, ``torch.load`` with
``weights_only: false``, ``builtins.open``...). Here the loaded YAML (OmegaConf's safe loader, no
Python tags) is checked first, then built by plain calls of the project's own classes:

* ``data._target_`` must be one of `DATA_MODULES`, ``data.generator._target_`` one of `GENERATORS`
  (with ``_partial_: true``) and ``model._target_`` one of `LIGHTNING_MODULES`;
* no other key under ``data``, ``model`` or ``rpe`` (the only parts read) may start with ``_``
  (``_target_``, ``_args_``, ``_partial_``, ``_recursive_``...);
* no value may be an interpolation (``${...}``): a saved run config is fully resolved, and a resolver
  registered in the process could do anything.

Anything else is a `RunConfigError` with a one-line message naming the key and the value.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from models.deit import ModelConfigError

# Each allowed target is imported from its own module when used; no name from the file is ever imported.
DATA_MODULES: dict[str, tuple[str, str]] = {
    "data.ImageFolderDataModule": ("data.datamodule", "ImageFolderDataModule"),
    "data.datamodule.ImageFolderDataModule": ("data.datamodule", "ImageFolderDataModule"),
    "data.coco.CocoDataModule": ("data.coco", "CocoDataModule"),
}
GENERATORS: dict[str, tuple[str, str]] = {
    "data.relational.generate_relational_shapes": ("data.relational", "generate_relational_shapes"),
    "data.digits.generate_digits": ("data.digits", "generate_digits"),
}
LIGHTNING_MODULES: dict[str, tuple[str, str]] = {
    "models.classification.ClassificationModule": ("models.classification", "ClassificationModule"),
    "models.detr.DetectionModule": ("models.detr.module", "DetectionModule"),
    "models.detr.module.DetectionModule": ("models.detr.module", "DetectionModule"),
}
# Where a target may appear: config path -> the targets allowed there.
ALLOWED_TARGETS: dict[str, dict[str, tuple[str, str]]] = {
    "data": DATA_MODULES,
    "data.generator": GENERATORS,
    "model": LIGHTNING_MODULES,
}


# The parts of a run config that rebuilding reads; trainer, callbacks and loggers are never built from it.
USED_KEYS = ("data", "model", "rpe")


class RunConfigError(ModelConfigError):
    """A run dir's config or checkpoint that cannot be loaded safely; the message is one line."""


def _load_allowed(allowed: dict[str, tuple[str, str]], name: str) -> Any:
    import importlib

    module, attr = allowed[name]
    return getattr(importlib.import_module(module), attr)


def _walk(node: Any, path: str, source: str, only: str | None = None) -> None:
    """Reject interpolations and ``_``-prefixed keys except the allowed targets (see the module docstring)."""
    keys = [only] if only is not None else list(node.keys()) if isinstance(node, DictConfig) else range(len(node))
    for key in keys:
        full = str(key) if only is not None else f"{path}.{key}"
        if OmegaConf.is_interpolation(node, key):
            raw = node._get_node(key)._value()
            raise RunConfigError(f"{source}: {full}={raw!r} is an interpolation; a saved run config is resolved")
        value = node._get_node(key)
        if isinstance(key, str) and key.startswith("_"):
            raw = value._value() if not isinstance(value, (DictConfig, ListConfig)) else "<mapping>"
            if key == "_target_" and path in ALLOWED_TARGETS:
                if raw not in ALLOWED_TARGETS[path]:
                    valid = ", ".join(ALLOWED_TARGETS[path])
                    raise RunConfigError(f"{source}: {full}={raw!r} is not an allowed target; valid: {valid}")
            elif not (key == "_partial_" and path == "data.generator" and raw is True):
                raise RunConfigError(
                    f"{source}: {full}={raw!r} is not allowed in a run config (only data._target_, "
                    "data.generator._target_ with _partial_: true and model._target_ are)"
                )
        if isinstance(value, (DictConfig, ListConfig)) and not value._is_none():
            _walk(value, full, source)


def load_run_config(path: str | Path) -> DictConfig:
    """Load and check a run's ``config.yaml``; raises `RunConfigError` (one line) on anything unsafe."""
    path = Path(path)
    try:
        cfg = OmegaConf.load(path)
    except Exception as err:  # YAML syntax, undecodable bytes, duplicate keys
        reason = " ".join(str(err).split())[:200]
        raise RunConfigError(f"{path} is not a readable run config ({type(err).__name__}: {reason})") from None
    if not isinstance(cfg, DictConfig):
        raise RunConfigError(f"{path} is not a run config: expected a mapping with data and model keys")
    present = set(cfg.keys())  # never `key in cfg` or `cfg.get`: they resolve interpolations
    for key in USED_KEYS:
        if key in present:
            _walk(cfg, key, str(path), only=key)
    for key in ("data", "model"):
        node = cfg._get_node(key) if key in present else None
        if not isinstance(node, DictConfig) or node._is_none():
            raise RunConfigError(f"{path} has no {key} mapping; expected the config.yaml that train.py writes")
        if "_target_" not in set(node.keys()):
            raise RunConfigError(f"{path}: {key}._target_ is missing; valid: {', '.join(ALLOWED_TARGETS[key])}")
    return cfg


def build_data_and_model(cfg: DictConfig) -> tuple[Any, Any]:
    """``(datamodule, LightningModule)`` of a checked run config (see `load_run_config`), by plain calls."""
    data = OmegaConf.to_container(cfg.data, resolve=False)
    data_cls = _load_allowed(DATA_MODULES, data.pop("_target_"))
    generator = data.get("generator")
    if isinstance(generator, dict) and "_target_" in generator:  # COCO's generator is plain kwargs
        function = _load_allowed(GENERATORS, generator.pop("_target_"))
        generator.pop("_partial_", None)
        data["generator"] = functools.partial(function, **generator)
    datamodule = data_cls(**data)
    model = OmegaConf.to_container(cfg.model, resolve=False)
    model_cls = _load_allowed(LIGHTNING_MODULES, model.pop("_target_"))
    # A run started from reference weights (model.weights) holds its own in its checkpoint: the file
    # it started from is neither needed nor read again.
    model.pop("weights", None)
    rpe = OmegaConf.to_container(cfg.rpe, resolve=False) if "rpe" in set(cfg.keys()) else None
    return datamodule, model_cls(**model, rpe=rpe, num_classes=datamodule.num_classes)


def read_checkpoint_file(
    path: str | Path, safe_globals: list[Any] | tuple[Any, ...] = (), error: type[Exception] = RunConfigError
) -> Any:
    """``torch.load(path, weights_only=True)`` allowing exactly the classes in ``safe_globals``; anything
    unreadable (missing, truncated, random bytes, a pickle needing other code) is one ``error`` line."""
    if not Path(path).is_file():
        raise error(f"checkpoint {path} does not exist")
    try:
        with torch.serialization.safe_globals(list(safe_globals)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # never unpickle arbitrarily
        text = str(err)
        blocked = re.search(r"GLOBAL ([\w.]+)", text)
        reason = (
            f"it needs code to load (global {blocked.group(1)}), which weights_only=True refuses" if blocked
            else f"corrupt, truncated or not written by torch.save: {type(err).__name__}"
        )
        raise error(f"checkpoint {path} is not a readable PyTorch checkpoint ({reason})") from None


def load_run_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint's dict, loaded with ``weights_only=True``; anything unreadable is one `RunConfigError` line."""
    checkpoint = read_checkpoint_file(path)
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise RunConfigError(f"checkpoint {path} holds no state_dict; expected a checkpoint written by train.py")
    return checkpoint


def backbone(module: Any) -> torch.nn.Module:
    """The network inside a LightningModule: ``net`` (classification) or ``model`` (DETR)."""
    for name in ("net", "model"):
        net = getattr(module, name, None)
        if isinstance(net, torch.nn.Module):
            return net
    raise RunConfigError(f"{type(module).__name__} has neither a net nor a model attribute")
