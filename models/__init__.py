"""Backbones, heads and Lightning modules. Importing registers the iRPE zoo names in timm."""

from models.deit import REFERENCE_ZOO, ModelConfigError, RPEVisionTransformer
from models.factory import create_model, model_names, register_builder
from models.swin import RPESwinTransformer, create_swin  # noqa: F401  (registers the Swin builders)

__all__ = [
    "REFERENCE_ZOO",
    "ModelConfigError",
    "RPEVisionTransformer",
    "create_model",
    "model_names",
    "register_builder",
]
