"""Backbones, heads and Lightning modules. Importing registers in timm the iRPE zoo names and
``deit_{tiny,small,base}_patch16_224_rpe`` / ``swin_tiny_patch4_window7_224_rpe`` / ``swinv2_tiny_window8_256_rpe``
with any RPE preset as tag."""

from models.deit import REFERENCE_ZOO, ModelConfigError, RPEVisionTransformer
from models.factory import create_model, model_names, register_builder
from models.swin import RPESwinTransformer, create_swin  # noqa: F401  (registers the Swin builders)
from models.swin_v2 import RPESwinTransformerV2, create_swin_v2  # noqa: F401  (registers the Swin-v2 builders)

__all__ = [
    "REFERENCE_ZOO",
    "ModelConfigError",
    "RPEVisionTransformer",
    "create_model",
    "model_names",
    "register_builder",
]
