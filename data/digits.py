"""scikit-learn's bundled 8x8 handwritten digits (1797 real images, 10 classes, offline) as an ImageFolder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

NUM_CLASSES = 10
NUM_IMAGES = 1797


def generate_digits(root: str | Path, img_size: int = 32, val_fraction: float = 0.2, seed: int = 0) -> None:
    """Write ``root/{train,val}/<digit>/<sklearn index>.png`` (grayscale PNG, ``img_size`` x ``img_size``).

    The split is stratified by class and seeded (same seed -> same split); file names keep the index into
    ``sklearn.datasets.load_digits()`` so the split can be audited. Upscaling is bilinear from 8x8 (pixel
    values 0..16 mapped linearly to 0..255).
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # (1797, 8, 8)
    labels = digits.target.astype(np.int64)
    indices = np.arange(len(labels))
    train_idx, val_idx = train_test_split(indices, test_size=val_fraction, random_state=seed, stratify=labels)

    root = Path(root)
    for split, split_idx in (("train", train_idx), ("val", val_idx)):
        for digit in range(NUM_CLASSES):
            (root / split / str(digit)).mkdir(parents=True, exist_ok=True)
        for i in np.sort(split_idx):
            image = Image.fromarray(images[i]).resize((img_size, img_size), Image.Resampling.BILINEAR)
            image.save(root / split / str(labels[i]) / f"{i:04d}.png")
