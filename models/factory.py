"""``create_model``: one entry point from a model name and an RPE to a backbone."""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch.nn as nn

from models.builders import BUILDERS as _BUILDERS
from models.deit import REFERENCE_ZOO, ModelConfigError, create_deit
from rpe import DEFAULT_PRESET


def model_names() -> list[str]:
    return sorted([*_BUILDERS, *REFERENCE_ZOO])


# What an iRPE zoo name builds when rpe is not given: its own preset, not DEFAULT_PRESET.
_UNSET: Any = object()


def create_model(name: str, rpe: Any = _UNSET, **kwargs: Any) -> nn.Module:
    """Build backbone ``name`` with relative position encoding ``rpe``.

    Args:
        name: a DeiT/Swin/Swin-v2 name (``deit_small_patch16_224``, ``swinv2_tiny_window8_256``, ...) or an
            iRPE reference model-zoo name (its RPE preset is the default for ``rpe``).
        rpe: preset name, reference shorthand (``rpe-1.9-product-ctx-1-k``), dict or ``RPEConfig``; None or
            "none": no RPE; not given: `rpe.DEFAULT_PRESET` (a zoo name: its own preset). The published models:
            ``rpe="none"`` (DeiT), ``"swin"`` (Swin), ``"cpb"`` (Swin-v2).
        **kwargs: backbone options (``num_classes``, ``img_size``, ``drop_path_rate``, ``ape``...).
    """
    if name not in REFERENCE_ZOO and name not in _BUILDERS:
        raise ModelConfigError(f"model name {name!r} is not one of: {', '.join(model_names())}")
    try:
        if name in REFERENCE_ZOO:
            arch, preset = REFERENCE_ZOO[name]
            return create_deit(arch, rpe=preset if rpe is _UNSET or rpe is None else rpe, **kwargs)
        return _BUILDERS[name](name, rpe=DEFAULT_PRESET if rpe is _UNSET else rpe, **kwargs)
    except TypeError as err:
        unknown = _UNEXPECTED.search(str(err))
        if unknown is None or unknown.group(2) not in kwargs:
            raise
        valid = _options(unknown.group(1))
        choices = f"; valid options: {', '.join(valid)}" if valid else ""
        raise ModelConfigError(f"{unknown.group(2)} is not an option of backbone {name}{choices}") from None


_UNEXPECTED = re.compile(r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'")


def _options(class_name: str) -> list[str]:
    """The keyword options of our backbone classes whose class chain includes ``class_name`` (the class a
    TypeError names), i.e. what a backbone's constructor chain accepts; [] when none matches."""
    from models.deit import RPEVisionTransformer
    from models.swin import RPESwinTransformer
    from models.swin_v2 import RPESwinTransformerV2

    names: set[str] = set()
    for cls in (RPEVisionTransformer, RPESwinTransformer, RPESwinTransformerV2):
        chain = [c for c in cls.__mro__ if c is not object]
        if class_name not in {c.__name__ for c in chain}:
            continue
        for klass in chain:
            if "__init__" in vars(klass):
                names.update(n for n, p in inspect.signature(klass.__init__).parameters.items()
                             if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return sorted(names)


# The backbone options that shape the token grid (of a given image size) and the attention window of a model
GRID_OPTIONS = ("patch_size", "window_size")


def grid_options(name: str) -> dict[str, Any]:
    """The options of backbone ``name`` that shape its attention grid on an image, as it is built when the config
    sets none: ``patch_size`` and (a window backbone) ``window_size``, from its architecture table, else its
    class's default (Swin-v2-T's table leaves ``patch_size`` at timm's 4). {} for a name no builder knows."""
    from models.deit import DEIT_ARCHS, RPEVisionTransformer
    from models.swin import SWIN_ARCHS, RPESwinTransformer
    from models.swin_v2 import SWIN_V2_ARCHS, RPESwinTransformerV2

    arch = REFERENCE_ZOO[name][0] if name in REFERENCE_ZOO else name
    for archs, cls in ((DEIT_ARCHS, RPEVisionTransformer), (SWIN_ARCHS, RPESwinTransformer),
                       (SWIN_V2_ARCHS, RPESwinTransformerV2)):
        if arch in archs:
            defaults = {key: _constructor_default(cls, key) for key in GRID_OPTIONS}
            return {key: archs[arch].get(key, defaults[key]) for key in GRID_OPTIONS
                    if key in archs[arch] or defaults[key] is not inspect.Parameter.empty}
    return {}


def _constructor_default(cls: type, option: str) -> Any:
    """The default of keyword ``option`` in the first constructor of ``cls``'s class chain that declares it
    (`inspect.Parameter.empty` where none does)."""
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            parameter = inspect.signature(klass.__init__).parameters.get(option)
            if parameter is not None:
                return parameter.default
    return inspect.Parameter.empty
