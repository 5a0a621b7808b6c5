"""The project's configs as the commands see them: the config dir, the entry point of each root config, the
groups and options a command line may pick, and the name of a sweep job's folder (``${job_dirname:...}``)."""

from __future__ import annotations

import hashlib
import os
import re
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def job_dirname(overrides: str) -> str:
    """One path component naming a sweep job by its overrides (``hydra.job.override_dirname``).

    Hydra's name keeps ``/`` (nested dirs) and ``${...}`` (which would be interpolated again when the
    output dir is used), so anything outside ``[A-Za-z0-9._=,+-]`` becomes ``_``; long names keep a
    prefix plus a hash of the whole.
    """
    name = re.sub(r"[^A-Za-z0-9._=,+-]+", "_", overrides.replace("\\", "")) or "default"
    if not name.strip("."):  # "." or ".." would name the folder itself or its parent, never a job's own
        name = name.replace(".", "_")
    if len(name) > 160:
        name = f"{name[:140]}-{hashlib.sha1(overrides.encode()).hexdigest()[:12]}"
    return name


OmegaConf.register_new_resolver("job_dirname", job_dirname, replace=True)


def group_options(group: str, bases: bool = False) -> list[str]:
    """The options a user may pick: ``_``-prefixed files (``rpe/_base``) are shared bases, not choices (with
    ``bases``: every file of the group, as Hydra itself lists them). Hydra's own groups (``hydra/launcher``)
    also hold the options Hydra and its plugins bring (``basic``, ``submitit_slurm``, ``optuna``)."""
    names = {p.stem for p in (CONFIG_DIR / group).glob("*.yaml")}
    if group.startswith("hydra/"):
        names |= set(_hydra_group_options(group))
    return sorted(n for n in names if bases or not n.startswith("_"))


def testset_data_folders(data_dir: Any) -> list[str]:
    """The folders the shipped test sets' own data roots lie in for ``paths.data_dir=data_dir``
    (``<data_dir>/testsets``): folders of test sets' data, where a run dir would take a test set's name."""
    if data_dir is None or not str(data_dir).strip():
        return []
    folders = set()
    for name in group_options("testset"):
        node = OmegaConf.merge({"paths": {"data_dir": str(data_dir)}},
                               {"testset": OmegaConf.load(CONFIG_DIR / "testset" / f"{name}.yaml")})
        root = OmegaConf.select(node, "testset.data.root", default=None, throw_on_resolution_failure=False)
        if isinstance(root, str) and root.strip():
            folders.add(os.path.dirname(os.path.normpath(root)))
    return sorted(folders)


def is_config_group(group: str) -> bool:
    """Whether ``group`` (``rpe``, ``hydra/launcher``) is a config group a ``group=option`` override picks from."""
    return (CONFIG_DIR / group).is_dir() or (group.startswith("hydra/") and bool(_hydra_group_options(group)))


@cache
def _hydra_group_options(group: str) -> tuple[str, ...]:
    """The options of one of Hydra's own groups as Hydra lists them: its built-in configs, the plugins' (from
    their ConfigStore entries) and ours under ``configs/hydra``."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.object_type import ObjectType
    from hydra.core.plugins import Plugins

    Plugins.instance()  # registers the plugins' configs
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONFIG_DIR)))
    return tuple(loader.get_group_options(group, ObjectType.CONFIG))


# The entry point of each root config, and how a group choice is given to it
SCRIPTS = {"train": "train.py", "eval": "eval.py"}


USAGE = {"train": "python train.py {choice}",
         "eval": "python eval.py ckpt_path=runs/<run>/checkpoints/best.ckpt {choice}"}


def root_defaults(config_name: str) -> dict[str, Any]:
    """``{group: default option}`` of ``configs/<config_name>.yaml``'s defaults list (None: no option unless
    given; ``override`` dropped from Hydra's own groups)."""
    import yaml

    defaults = (yaml.safe_load((CONFIG_DIR / f"{config_name}.yaml").read_text()) or {}).get("defaults") or []
    return {str(key).removeprefix("override ").strip(): value for item in defaults if isinstance(item, dict)
            for key, value in item.items()}


def root_groups(config_name: str) -> list[str]:
    """The config groups in ``configs/<config_name>.yaml``'s defaults list (Hydra's own groups aside)."""
    return sorted(k for k in root_defaults(config_name) if not k.startswith("hydra"))


# Set by a parent run for its DDP workers: the private folder holding the config it composed and checked.
DDP_WORKER_CONFIG = "RPE_DDP_WORKER_CONFIG"
# The name of that folder, ``<prefix><parent's pid>-<random>`` in the temp dir
DDP_WORKER_FOLDER_PREFIX = "rpe-ddp-config-"
