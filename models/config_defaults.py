"""The model config files as the one home of the models' defaults.

A default that both a config file (what the command line runs) and a Python class (what ``import models``
builds) need is written once, in the config file; the class reads it from there, so the two cannot drift.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


@cache
def model_config(name: str) -> dict[str, Any]:
    """``configs/model/<name>.yaml`` as plain dicts and lists, interpolations left as written (no
    ``defaults`` list is followed: the file must hold what is read from it)."""
    return OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "model" / f"{name}.yaml"), resolve=False)


def config_section(name: str, keys: tuple[str, ...], section: str | None = None) -> dict[str, Any]:
    """``keys`` of ``configs/model/<name>.yaml`` (of its mapping ``section`` if given), in that order.

    A key the file lacks is a RuntimeError naming it: the Python default it holds would be missing.
    """
    node = model_config(name)
    where = f"configs/model/{name}.yaml"
    if section is not None:
        node, where = node.get(section) or {}, f"{where} ({section})"
    missing = [key for key in keys if key not in node]
    if missing:
        raise RuntimeError(f"{where} lacks {', '.join(missing)}, the default(s) the Python classes read from it")
    return {key: node[key] for key in keys}
