"""Backbones, heads and Lightning modules. Importing registers the iRPE zoo names in timm."""

from models.deit import REFERENCE_ZOO, ModelConfigError, RPEVisionTransformer
from models.factory import create_model, model_names, register_builder

__all__ = [
    "REFERENCE_ZOO",
    "ModelConfigError",
    "RPEVisionTransformer",
    "create_model",
    "model_names",
    "register_builder",
]
