"""timm names of the RPE backbones: ``<timm architecture>_rpe.<preset>``, one pretrained tag per RPE preset.

``timm.create_model("swin_tiny_patch4_window7_224_rpe.irpe_qkv")`` builds Swin-T with the ``irpe_qkv``
preset; without a tag the first one (`rpe.DEFAULT_PRESET`, the default RPE) is used, and ``timm.list_models("*_rpe",
include_tags=True)`` lists every combination. The tags carry no weights (there is nothing to
download); ``pretrained=True`` with ``pretrained_cfg_overlay=dict(file=...)`` loads a local file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from timm.models import register_model
from timm.models._builder import resolve_pretrained_cfg

from models.errors import ModelConfigError
from rpe import DEFAULT_PRESET, PRESETS

RPE_SUFFIX = "_rpe"


def preset_tags() -> list[str]:
    """Every registered RPE preset, the default first (timm's default tag is the first listed)."""
    return [DEFAULT_PRESET, *(name for name in PRESETS if name != DEFAULT_PRESET)]


def tagged_cfgs(variant: str, cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"<variant>.<preset>": cfg}`` for `preset_tags`, for timm's ``generate_default_cfgs``."""
    return {f"{variant}.{tag}": dict(cfg) for tag in preset_tags()}


def rpe_of_call(variant: str, kwargs: dict[str, Any]) -> Any:
    """The RPE an entry point builds, popping ``rpe`` from ``kwargs``: the tag of the name (a preset), or
    ``rpe=...`` when the name has no tag. With both, ``rpe`` may be a dict of field overrides of the tag's
    preset (``dict(backend="sdpa")``); naming another preset is a `ModelConfigError`.
    """
    rpe = kwargs.pop("rpe", None)
    named = kwargs.get("pretrained_cfg")
    if isinstance(named, str) and named not in PRESETS:
        raise ModelConfigError(f"tag {named!r} of {variant} is not an RPE preset; valid: {', '.join(preset_tags())}")
    tag = resolve_pretrained_cfg(variant, pretrained_cfg=named).tag
    if named is None:  # no tag in the name: rpe= (or the default tag)
        if isinstance(rpe, str) and rpe in PRESETS:
            kwargs["pretrained_cfg"] = rpe  # the model's pretrained_cfg then names its preset
        return tag if rpe is None else rpe
    if rpe is None or rpe == tag or rpe == PRESETS[tag]:
        return tag if rpe is None else rpe
    if isinstance(rpe, Mapping) and rpe.get("preset", tag) == tag:  # field overrides of the tag's preset
        return {**rpe, "preset": tag}
    raise ModelConfigError(
        f"rpe={rpe!r} contradicts the preset tag of {variant}.{tag}; give one of them, or rpe=dict(...) of field"
        f" overrides (tags: {', '.join(preset_tags())})"
    )


def register_rpe_variant(variant: str, build: Any, description: str) -> Any:
    """Register ``variant`` in timm; ``build(rpe, pretrained, **kwargs)`` makes the model."""

    def entry(pretrained: bool = False, **kwargs: Any) -> Any:
        return build(rpe_of_call(variant, kwargs), pretrained, **kwargs)

    entry.__name__ = entry.__qualname__ = variant
    entry.__doc__ = f"{description} with any RPE preset as its pretrained tag (default {DEFAULT_PRESET})."
    entry.__module__ = build.__module__
    return register_model(entry)
