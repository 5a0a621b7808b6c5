"""Backbones, heads and Lightning modules. Importing registers in timm the iRPE zoo names and
``deit_{tiny,small,base}_patch16_224_rpe`` / ``swin_tiny_patch4_window7_224_rpe`` / ``swinv2_tiny_window8_256_rpe``
with any RPE preset as tag.

``from_rope_vit_checkpoint`` / ``to_rope_vit_checkpoint`` (RoPE-ViT DeiT files, `models.rope_vit`) and
``from_rope_swin_checkpoint`` / ``to_rope_swin_checkpoint`` (RoPE-ViT Swin files, `models.rope_swin`) are imported on
first use: their checkpoint reading pulls in the data package, which ``import models`` does not need."""

from typing import Any

from models.builders import register_builder
from models.deit import REFERENCE_ZOO, ModelConfigError, RPEVisionTransformer
from models.factory import create_model, model_names
from models.swin import RPESwinTransformer, create_swin  # noqa: F401  (registers the Swin builders)
from models.swin_v2 import RPESwinTransformerV2, create_swin_v2  # noqa: F401  (registers the Swin-v2 builders)

_ROPE_VIT = ("RoPEViTCheckpointError", "from_rope_vit_checkpoint", "to_rope_vit_checkpoint")
_ROPE_SWIN = ("RoPESwinCheckpointError", "from_rope_swin_checkpoint", "to_rope_swin_checkpoint")

__all__ = [
    "REFERENCE_ZOO",
    "ModelConfigError",
    "RPEVisionTransformer",
    "RoPESwinCheckpointError",
    "RoPEViTCheckpointError",
    "create_model",
    "from_rope_swin_checkpoint",
    "from_rope_vit_checkpoint",
    "model_names",
    "register_builder",
    "to_rope_swin_checkpoint",
    "to_rope_vit_checkpoint",
]


def __getattr__(name: str) -> Any:
    if name in _ROPE_VIT:
        from models import rope_vit

        return getattr(rope_vit, name)
    if name in _ROPE_SWIN:
        from models import rope_swin

        return getattr(rope_swin, name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")
