"""The backbone builders `models.factory.create_model` calls, by name: the DeiT names, and the names each
backbone module (`models.swin`, `models.swin_v2`) registers when it is imported.

Its own module, below the factory: a backbone module registers here without importing the factory, whose
error messages look into the backbone modules (no import circle)."""

from __future__ import annotations

from typing import Any

from models.deit import DEIT_ARCHS, create_deit

BUILDERS: dict[str, Any] = {name: create_deit for name in DEIT_ARCHS}


def register_builder(name: str, builder: Any) -> None:
    """Make ``create_model(name, rpe=..., **kwargs)`` call ``builder(name, rpe=..., **kwargs)``."""
    BUILDERS[name] = builder
