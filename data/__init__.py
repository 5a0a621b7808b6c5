"""Datasets and the LightningDataModule.

Public API:
    ImageFolderDataModule  -- Hydra-instantiated LightningDataModule for ImageFolder trees.
    DataConfigError        -- one-line configuration/data-layout errors (a ValueError).
    make_fake_imagefolder  -- tiny random ImageFolder for tests.
    generate_relational_shapes (data.relational), generate_digits (data.digits) -- dataset generators.
"""

from data.datamodule import ImageFolderDataModule, RepeatAugDistributedSampler
from data.digits import generate_digits
from data.errors import DataConfigError
from data.fake import make_fake_imagefolder
from data.relational import generate_relational_shapes

__all__ = [
    "DataConfigError",
    "ImageFolderDataModule",
    "RepeatAugDistributedSampler",
    "generate_digits",
    "generate_relational_shapes",
    "make_fake_imagefolder",
]
