"""scikit-learn digits as an ImageFolder: real data, 10 classes, seeded stratified split."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from data.digits import generate_digits


def _split_files(root: Path) -> dict[str, list[str]]:
    return {
        split: sorted(str(p.relative_to(root / split)) for p in (root / split).rglob("*.png"))
        for split in ("train", "val")
    }


@pytest.fixture(scope="module")
def digits_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("digits")
    generate_digits(root, img_size=32, val_fraction=0.2, seed=0)
    return root


def test_classes_counts_and_stratification(digits_root: Path) -> None:
    files = _split_files(digits_root)
    assert sorted(p.name for p in (digits_root / "train").iterdir()) == [str(d) for d in range(10)]
    assert len(files["train"]) + len(files["val"]) == 1797
    assert len(files["val"]) == pytest.approx(0.2 * 1797, abs=1)
    train_ids = {Path(f).stem for f in files["train"]}
    assert not train_ids & {Path(f).stem for f in files["val"]}  # disjoint by sklearn index
    train_counts = Counter(Path(f).parent.name for f in files["train"])
    val_counts = Counter(Path(f).parent.name for f in files["val"])
    for digit in map(str, range(10)):  # stratified: ~20% of every class in val
        assert val_counts[digit] / (train_counts[digit] + val_counts[digit]) == pytest.approx(0.2, abs=0.02)


def test_images_are_upscaled_digits(digits_root: Path) -> None:
    from sklearn.datasets import load_digits

    path = next((digits_root / "val" / "3").glob("*.png"))
    image = np.asarray(Image.open(path))
    assert image.shape == (32, 32) and image.dtype == np.uint8 and image.max() > 200
    original = load_digits().images[int(path.stem)] * (255 / 16)
    downscaled = image.reshape(8, 4, 8, 4).mean(axis=(1, 3))
    assert np.corrcoef(downscaled.ravel(), original.ravel())[0, 1] > 0.9
    assert load_digits().target[int(path.stem)] == 3


def test_split_is_deterministic(tmp_path: Path, digits_root: Path) -> None:
    generate_digits(tmp_path / "same", seed=0)
    assert _split_files(tmp_path / "same") == _split_files(digits_root)
    generate_digits(tmp_path / "other", seed=1)
    assert _split_files(tmp_path / "other")["val"] != _split_files(digits_root)["val"]
