"""``create_model``: one entry point from a model name and an RPE to a backbone."""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from models.deit import DEIT_ARCHS, REFERENCE_ZOO, ModelConfigError, create_deit

_BUILDERS: dict[str, Any] = {name: create_deit for name in DEIT_ARCHS}


def register_builder(name: str, builder: Any) -> None:
    """Make ``create_model(name, rpe=..., **kwargs)`` call ``builder(name, rpe=..., **kwargs)``."""
    _BUILDERS[name] = builder


def model_names() -> list[str]:
    return sorted([*_BUILDERS, *REFERENCE_ZOO])


def create_model(name: str, rpe: Any = None, **kwargs: Any) -> nn.Module:
    """Build backbone ``name`` with relative position encoding ``rpe``.

    Args:
        name: a DeiT/Swin name (``deit_small_patch16_224``, ``deit_micro_patch4_32``, ...) or an
            iRPE reference model-zoo name (its RPE preset is the default for ``rpe``).
        rpe: preset name, reference shorthand (``rpe-1.9-product-ctx-1-k``), dict or ``RPEConfig``.
        **kwargs: backbone options (``num_classes``, ``img_size``, ``drop_path_rate``, ``ape``...).
    """
    if name in REFERENCE_ZOO:
        arch, preset = REFERENCE_ZOO[name]
        return create_deit(arch, rpe=preset if rpe is None else rpe, **kwargs)
    if name not in _BUILDERS:
        raise ModelConfigError(f"model name {name!r} is not one of: {', '.join(model_names())}")
    return _BUILDERS[name](name, rpe=rpe, **kwargs)
