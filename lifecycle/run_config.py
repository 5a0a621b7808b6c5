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

Reading a run never writes: `build_data_and_model` detaches the data generator (``prepare_data`` then
only checks the layout), `require_existing_data` stops in one line when the data the run names is not
on disk, `load_run_weights` refuses a checkpoint that does not fit the run's model or holds a
non-finite tensor.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from data.errors import DataConfigError, absent_folder
from models.checkpoint_files import RunConfigError, first_non_finite, read_checkpoint_file
from storage.files import RunFileError

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


class RunDataError(DataConfigError):
    """The data a run (or an eval config) names is not on disk, or not the data it names; one line."""


class NonFiniteResultError(ValueError):
    """An evaluation gave a NaN or inf metric, which is never printed as a result; one line."""


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


def read_bounded_yaml(path: str | Path) -> Any:
    """The YAML of a plain file of bounded size, nesting and aliases, as OmegaConf builds it (nothing resolved);
    raises `RunConfigError` (one line) where it is not one."""
    from data.bounded_json import MAX_YAML_BYTES, JsonBoundsError, read_json_bytes
    from storage.files import check_plain_file, yaml_problem

    path = Path(path)
    try:
        check_plain_file(path)
        # a regular file within the bound of a YAML record, the same as the tables' (`read_bounded_bytes`)
        text = read_json_bytes(path, MAX_YAML_BYTES).decode()
        problem = yaml_problem(text)
        if problem:  # before OmegaConf builds it: an alias bomb or deep nesting never gets built
            raise RunConfigError(f"{path} is not a readable run config: {problem}")
        return OmegaConf.load(io.StringIO(text))
    except RunConfigError:
        raise
    except JsonBoundsError as err:
        raise RunConfigError(f"{path} is not a readable run config: {err}") from None
    except Exception as err:  # YAML syntax, undecodable bytes, duplicate keys
        reason = " ".join(str(err).split())[:200]
        raise RunConfigError(f"{path} is not a readable run config ({type(err).__name__}: {reason})") from None


def load_run_config(path: str | Path) -> DictConfig:
    """Load and check a run's ``config.yaml``; raises `RunConfigError` (one line) on anything unsafe."""
    path = Path(path)
    cfg = read_bounded_yaml(path)
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


def run_data_root(run_dir: Path) -> str | None:
    """The ``data.root`` the run's ``config.yaml`` names, where no output about the run may go (even when it was
    read with other data). Read with the run-config bounds but without checking the rest of the config, so that
    a config `load_run_config` refuses still keeps its data safe; None where the file cannot be read, or the
    root is missing or an interpolation (the callers name an unreadable config in their own words)."""
    try:
        cfg = read_bounded_yaml(run_dir / "config.yaml")
    except (RunConfigError, RunFileError, OSError):
        return None
    data = cfg._get_node("data") if isinstance(cfg, DictConfig) else None  # never resolves an interpolation
    if not isinstance(data, DictConfig) or data._is_none() or "root" not in set(data.keys()):
        return None
    root = data._get_node("root")._value()
    return root if isinstance(root, str) and "${" not in root else None


def build_data_and_model(cfg: DictConfig, data_root: str | Path | None = None) -> tuple[Any, Any]:
    """``(datamodule, LightningModule)`` of a checked run config (see `load_run_config`), by plain calls.

    The datamodule never generates data (see `detach_generator`); ``data_root`` replaces the run's
    ``data.root`` with a folder of existing data, used as it is (no generator marker required there).
    """
    data = OmegaConf.to_container(cfg.data, resolve=False)
    if data_root is not None:
        data["root"] = str(data_root)
    elif not str(data.get("root", "")).strip():  # Path("") would read the working dir as the data
        raise RunDataError(f"data.root={data.get('root')!r} in the run's config names no data folder; pass"
                           " data_root=<folder> (plot_rpe.py: --data-root) pointing at existing data")
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
    detach_generator(datamodule)
    if data_root is not None:
        datamodule.data_root_note = _other_data_note(datamodule.run_generator, Path(str(data_root)))
        datamodule.run_generator = None  # the user's folder is used as it is
        datamodule.classes_fixed_by = "the run's model"  # data.num_classes is not the user's to change here
    rpe = OmegaConf.to_container(cfg.rpe, resolve=False) if "rpe" in set(cfg.keys()) else None
    return datamodule, model_cls(**model, rpe=rpe, num_classes=datamodule.num_classes)


def _other_data_note(generator: Any, root: Path) -> str:
    """What a ``data_root=`` folder generated with other settings than the run's differs in, as a note
    ("" when it has no readable marker, or the same settings): its numbers are on other data."""
    from data.generation import describe_generator, read_marker

    if generator is None or isinstance(generator, Mapping):
        return ""
    try:
        marker = read_marker(root.expanduser().absolute())
    except (ValueError, OSError):
        return ""
    diff = _generator_differences(marker.get("generator"), describe_generator(generator)) if marker else ""
    return (f"data_root={root} was generated with other settings than the run's data ({diff}): these numbers are"
            " on that data" if diff else "")


def run_class_names(checkpoint: Mapping[str, Any], run_cfg: DictConfig, run_dir: Path) -> list[str] | None:
    """The class names, in label order, the run's model was trained on: those its checkpoint records
    (`data.datamodule.recorded_classes`), else (a checkpoint saved before they were recorded) the class folders
    of the run's own ``data.root`` while it still holds the run's data (generated: a marker of the run's
    generator settings; hand data: the files fingerprint its ``run.json`` recorded); None where neither tells."""
    from data.datamodule import class_folders, recorded_classes
    from data.generation import read_marker
    from lifecycle.identity import data_record
    from lifecycle.records import read_run_record
    from lifecycle.testset_definition import configured_generator
    from storage.files import RunFileError

    recorded = recorded_classes(checkpoint)
    if recorded is not None:
        return recorded
    data = OmegaConf.to_container(run_cfg.data, resolve=False) if "data" in set(run_cfg.keys()) else {}
    if DATA_MODULES.get(str(data.get("_target_")), ("", ""))[1] != "ImageFolderDataModule" or not data.get("root"):
        return None  # COCO: categories from annotation files, not class folders
    root = Path(str(data["root"])).expanduser()
    try:
        if data.get("generator") is not None:
            expected, marker = configured_generator({"data": data}), read_marker(root)
            if expected is None or marker is None or _generator_differences(marker.get("generator"), expected):
                return None
        else:
            then, now = (read_run_record(run_dir) or {}).get("data"), data_record(data)
            if not isinstance(then, dict) or now is None or then.get("files") != now["files"]:
                return None
        return class_folders(root / str(data.get("train_split", "train")))
    except (OSError, ValueError, RunFileError):  # unreadable: the run's classes are not known
        return None


def check_run_classes(datamodule: Any, run_classes: list[str] | None, what: str, other: bool,
                      error: type[Exception] = RunDataError) -> str:
    """Refuse, in one ``error`` line before anything is evaluated, data ``datamodule`` reads (``what`` names
    where it came from) whose class names in label order (its val split's folders, sorted as ImageFolder
    assigns labels) are not ``run_classes``, those of the run's model: each image would be scored against
    another class, and no number would be meaningful. Other files under the same class names are fine. Where
    the run's classes are unknown (`run_class_names` None), returns a note for ``other`` data (not the run's
    own), else ''. COCO data (no class folders) is left to its category check."""
    from data.datamodule import class_folders, class_names_difference, shown_names

    split = getattr(datamodule, "val_split", None)
    if not isinstance(split, str):
        return ""
    split_dir = Path(datamodule.root).expanduser() / split
    try:
        data_classes = class_folders(split_dir)
    except OSError:  # the data module names an unreadable split when it reads it
        return ""
    if run_classes is None:
        return (f"the run's class names are not in its checkpoint (saved before they were recorded), nor shown by its"
                f" data.root (gone, or changed since): the class folders of {split_dir} ({shown_names(data_classes)})"
                " are taken to be the run's classes in that order" if other else "")
    if len(data_classes) != len(run_classes):
        return ""  # another class count: refused by the data module's count check, which names both counts
    difference = class_names_difference(run_classes, data_classes)
    if difference:
        raise error(f"{what}: the class folders of {split_dir} are not the classes the run's model was trained on"
                    f" ({difference}); labels index the sorted folder names, so each image would be scored against"
                    f" another class (nothing was evaluated); valid: data whose class folders are the run's:"
                    f" {shown_names(run_classes)}")
    return ""


def check_run_categories(datamodule: Any, checkpoint: Mapping[str, Any], what: str,
                         error: type[Exception] = RunDataError) -> None:
    """Refuse, in one ``error`` line before anything is evaluated, COCO data whose categories (ids and names, in
    label order: the val annotation file's) are not those the run's model was trained on, as its checkpoint records
    them (`data.coco.recorded_categories`): a file whose names were swapped with their boxes' ids scored each box
    against another object, and gave a number. A checkpoint that records none (saved before they were recorded)
    is not checked; other data modules have `check_run_classes`."""
    from data.coco import CocoDataModule, categories_difference, category_names, recorded_categories

    recorded = recorded_categories(checkpoint)
    if recorded is None or not isinstance(datamodule, CocoDataModule):
        return
    datamodule.setup("test")  # reads the val split's annotation file, which the test reads anyway
    difference = categories_difference(recorded, category_names(datamodule.val_set))
    if difference:
        shown = ", ".join(f"{i} {n!r}" for i, n in recorded)
        raise error(f"{what}: the categories of {datamodule.val_set.ann_file} are not those the run's model was"
                    f" trained on ({difference}); each box would be scored against another object (nothing was"
                    f" evaluated); valid: data whose categories are the run's: {shown}")


def detach_generator(datamodule: Any) -> Any:
    """Take the generator off a built datamodule so that its ``prepare_data`` can never write data (it then
    only checks the layout); the generator is kept as ``datamodule.run_generator`` for
    `require_existing_data`. Both datamodules read ``generator`` only in ``prepare_data`` (and COCO's
    class count at construction, which is done by then). Returns ``datamodule``."""
    if not hasattr(datamodule, "run_generator"):  # a second call must not forget the generator
        datamodule.run_generator = getattr(datamodule, "generator", None)
    datamodule.generator = None
    return datamodule


def _generator_differences(recorded: Any, expected: dict[str, Any]) -> str:
    """What differs between a marker's generator record and ``expected`` (`describe_generator`), or ``""``."""
    recorded = recorded if isinstance(recorded, dict) else {}
    if recorded.get("target") != expected["target"]:
        return f"generator {recorded.get('target')} on disk vs {expected['target']} named"
    old, new = recorded.get("kwargs") or {}, expected["kwargs"]
    changed = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return ", ".join(f"{k}: {old.get(k)!r} on disk vs {new.get(k)!r} named" for k in changed)


def require_existing_data(datamodule: Any, source: str, override: str, remedy: str | None = None,
                          edited: str | None = None) -> str | None:
    """Stop with one `RunDataError` line unless the data ``datamodule`` reads is on disk: a generated set
    (the run named a generator) must be complete (ImageFolder: its ``.complete.json`` marker, recording the
    same generator settings, and the class folders, image counts and image digest it records; COCO shapes
    the same marker, and its split folders).
    Then runs the datamodule's ``prepare_data`` with its generator detached: the layout checks only.

    ``source`` names where ``data.root`` came from (the run's config.yaml); ``override`` how the user
    points at other data (``data_root=<folder>``, ``--data-root DIR``); ``remedy`` replaces the default
    "how to make it" advice (a test set's data has its own command), ``edited`` the advice for data made with
    other settings than the config names (by default ``remedy``'s). Returns the checked content digest of
    generated data (`data.generation.scan_content`), else None.
    """
    from data.generation import MARKER_NAME, check_content, describe_generator, read_marker

    detach_generator(datamodule)
    generator = datamodule.run_generator
    root = Path(datamodule.root).expanduser().absolute()
    digest = None
    edited = edited or remedy or f"was the config edited after training? pass {override} pointing at the run's data"
    remedy = remedy or (
        "eval.py and plot_rpe.py read existing data only: train.py with the same data config generates it,"
        f" or pass {override} pointing at existing data"
    )
    if isinstance(generator, Mapping):  # COCO shapes: its settings; the marker records the generator they make
        from data.coco import shapes_generator

        try:
            generator = shapes_generator(**generator)
        except (DataConfigError, TypeError) as err:
            raise RunDataError(f"data.generator of {source}: {' '.join(str(err).split())}") from None
    if generator is None:
        if not root.is_dir():
            raise RunDataError(f"data.root={root} named by {source} {absent_folder(root)}; pass {override} pointing"
                               " at existing data")
    else:
        try:
            marker = read_marker(root)
        except (ValueError, OSError) as err:  # a damaged marker: not known to be complete
            reason = " ".join(str(err).split()) or type(err).__name__
            raise RunDataError(f"data.root={root} named by {source}: {reason}; {remedy}") from None
        if marker is None:
            where = absent_folder(root) if not root.is_dir() else f"has no {MARKER_NAME} completion marker"
            raise RunDataError(f"data.root={root} named by {source} {where}: no complete generated dataset;"
                               f" {remedy}")
        diff = _generator_differences(marker.get("generator"), describe_generator(generator))
        if diff:
            raise RunDataError(
                f"data.root={root} was generated with other settings than {source} names ({diff}); {edited}"
            )
        try:  # the same check train.py makes: class folders, image counts and images as generated
            digest = check_content(root, marker, generator, record=False)  # reading never writes data
        except DataConfigError as err:
            raise RunDataError(f"{' '.join(str(err).split())}; {remedy}") from None
    datamodule.prepare_data()
    return digest


def _first(keys: list[str], limit: int = 3) -> str:
    return ", ".join(keys[:limit]) + (", ..." if len(keys) > limit else "")


def state_dict_mismatch(expected: Mapping[str, Any], given: Mapping[str, Any]) -> str:
    """How ``given`` (a checkpoint's state_dict) fails to fit ``expected`` (the model's), in short: the
    first few missing and unexpected keys and the first shape mismatch; ``""`` when it fits."""
    missing = [k for k in expected if k not in given]
    unexpected = [k for k in given if k not in expected]
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing key(s) ({_first(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected key(s) ({_first(unexpected)})")
    shapes = []
    for key, value in given.items():
        want = expected.get(key)
        if not torch.is_tensor(want):
            continue
        if not torch.is_tensor(value):
            shapes.append(f"{key} is a {type(value).__name__} in the checkpoint, a tensor in the model")
        elif value.shape != want.shape:
            shapes.append(f"{key} has shape {tuple(value.shape)} in the checkpoint, {tuple(want.shape)} in the model")
    if shapes:
        parts.append(f"{len(shapes)} shape mismatch(es), first: {shapes[0]}")
    return "; ".join(parts)


def require_finite_weights(module: torch.nn.Module, source: str) -> None:
    """One `RunConfigError` line naming ``source`` and the first non-finite tensor: a diverged model has
    no result to evaluate or draw."""
    found = first_non_finite(module)
    if found is not None:
        name, bad, total = found
        raise RunConfigError(
            f"{source} holds non-finite weights: {name} has {bad} NaN/inf of {total} values; a diverged run"
            " has no result to evaluate or plot (use an earlier checkpoint)"
        )


def load_run_weights(module: Any, checkpoint: dict[str, Any], ckpt_path: str | Path, config: str | Path) -> None:
    """Load ``checkpoint["state_dict"]`` into the run's ``module`` (strict) and check it is finite.

    A checkpoint that does not fit (copied from another run dir, or a config edited after training) or
    holds a NaN/inf tensor is one `RunConfigError` line naming the checkpoint and the config.
    """
    state = checkpoint["state_dict"]
    problem = state_dict_mismatch(module.state_dict(), state)
    if not problem:
        try:
            module.load_state_dict(state)
        except (RuntimeError, ValueError, TypeError, KeyError) as err:  # what the key/shape check cannot see
            problem = " ".join(str(err).split())[:300] or type(err).__name__
    if problem:
        raise RunConfigError(
            f"checkpoint {ckpt_path} does not fit the model of {config}: {problem}; was it saved by another"
            " run, or was the config edited after training?"
        )
    require_finite_weights(module, f"checkpoint {ckpt_path}")


def check_run_identity(run_cfg: DictConfig, config: Path, checkpoint: dict[str, Any], ckpt_path: str | Path) -> None:
    """The config and the checkpoint must be the same run's: the checkpoint's recorded identity, and the
    run dir's ``run.json`` where it is readable, must be the identity of ``config``.

    A config edited after training, truncated, or swapped (a symlink into another run dir), and a
    checkpoint copied from another run may still fit the model; their numbers would be another run's.
    """
    from lifecycle.checkpoints import IDENTITY_KEY
    from lifecycle.identity import identity_config, identity_hash
    from lifecycle.records import read_run_record
    from storage.files import RunFileError

    identity = identity_hash(identity_config(run_cfg))
    saved = checkpoint.get(IDENTITY_KEY)
    if saved is not None and saved != identity:
        raise RunConfigError(f"checkpoint {ckpt_path} was saved by a run of another config than {config} "
                             "(copied from another run dir, or the config was edited after training)")
    try:
        record = read_run_record(config.parent)
    except RunFileError:
        return  # a damaged record says nothing either way; the checkpoint's identity was checked
    if record is not None and identity_hash(identity_config(record["config"])) != identity:
        raise RunConfigError(f"{config} is not the config of the run recorded in {config.parent / 'run.json'} "
                             "(edited, truncated or replaced after training)")


def require_finite_metrics(metrics: Mapping[str, float], source: str) -> None:
    """One `NonFiniteResultError` line when a metric is NaN or inf: that is no result to print."""
    bad = [f"{k}={v}" for k, v in metrics.items() if not math.isfinite(v)]
    if bad:
        raise NonFiniteResultError(
            f"evaluating {source} gave non-finite metrics ({', '.join(bad)}); that is no result (check the"
            " checkpoint and the data)"
        )


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
