"""Tiny random ImageFolder, a fast stand-in for ImageNet in tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image


def make_fake_imagefolder(
    root: str | Path,
    num_classes: int = 3,
    per_class: int = 4,
    img_size: int = 32,
    seed: int = 0,
    splits: Sequence[str] = ("train", "val"),
    ext: str = "png",
) -> Path:
    """Write ``root/<split>/class_<k>/<i>.<ext>`` with ``per_class`` RGB images per class and split.

    Each class has its own base colour plus pixel noise, so a model can (weakly) fit it in sanity-check
    training runs. Deterministic for a given seed. Returns ``root`` as a Path.
    """
    root = Path(root)
    rng = np.random.default_rng(seed)
    base_colours = rng.integers(40, 216, size=(num_classes, 3))
    for split in splits:
        for k in range(num_classes):
            class_dir = root / split / f"class_{k:03d}"
            class_dir.mkdir(parents=True, exist_ok=True)
            noise = rng.integers(-40, 41, size=(per_class, img_size, img_size, 3))
            pixels = np.clip(base_colours[k] + noise, 0, 255).astype(np.uint8)
            for i in range(per_class):
                Image.fromarray(pixels[i]).save(class_dir / f"{i:04d}.{ext}")
    return root
