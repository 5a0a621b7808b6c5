"""Relational-shapes generator: determinism, balance, geometry, and the 'no PE => chance' structure.

Everything here is checked from the saved PNG pixels with an object detector and a compass rule written
independently of data.relational (only the class-name order is shared, as the spec of the label set).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from data.relational import CLASS_NAMES, generate_relational_shapes

PATCH = 4
IMG = 32
GRID = IMG // PATCH
SMALL = {"num_train": 400, "num_val": 80, "img_size": IMG, "patch_size": PATCH, "seed": 0}


@pytest.fixture(scope="module")
def relational_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("relational")
    generate_relational_shapes(root, **SMALL)
    return root


def _files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.png"))


def find_object(image: np.ndarray, channel: int) -> tuple[int, int]:
    """Locate the single solid square dominated by `channel` in an (H, W, 3) uint8 image; return its cell.

    Asserts that it is a filled square lying inside exactly one PATCH x PATCH cell.
    """
    others = [c for c in range(3) if c != channel]
    mask = (image[..., channel] >= 150) & (image[..., others[0]] < 100) & (image[..., others[1]] < 100)
    rows, cols = np.nonzero(mask)
    assert len(rows) > 0, "object not found"
    r0, r1, c0, c1 = rows.min(), rows.max(), cols.min(), cols.max()
    height, width = r1 - r0 + 1, c1 - c0 + 1
    assert height == width and mask.sum() == height * width, "object is not one solid square"
    assert r0 // PATCH == r1 // PATCH and c0 // PATCH == c1 // PATCH, "object crosses a cell boundary"
    return int(r0 // PATCH), int(c0 // PATCH)


def compass(cell_a: tuple[int, int], cell_b: tuple[int, int]) -> int:
    """Index of the 45-degree sector (E, NE, N, ... counter-clockwise) of the offset A->B; rows point down."""
    angle = math.degrees(math.atan2(-(cell_b[0] - cell_a[0]), cell_b[1] - cell_a[1])) % 360
    return int(((angle + 22.5) // 45) % 8)


def permute_cells(image: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """Rearrange the GRID x GRID patch cells of an (H, W, 3) image: output cell i = input cell perm[i]."""
    cells = (
        image.reshape(GRID, PATCH, GRID, PATCH, 3)
        .transpose(0, 2, 1, 3, 4)
        .reshape(GRID * GRID, PATCH, PATCH, 3)
    )
    return cells[perm].reshape(GRID, GRID, PATCH, PATCH, 3).transpose(0, 2, 1, 3, 4).reshape(IMG, IMG, 3)


def test_deterministic_bytes(tmp_path: Path, relational_root: Path) -> None:
    generate_relational_shapes(tmp_path / "again", **SMALL)
    first, second = _files(relational_root), _files(tmp_path / "again")
    assert [p.relative_to(relational_root) for p in first] == [
        p.relative_to(tmp_path / "again") for p in second
    ]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(first, second, strict=True))


def test_different_seed_differs(tmp_path: Path, relational_root: Path) -> None:
    generate_relational_shapes(tmp_path / "other", **{**SMALL, "seed": 1, "num_train": 8, "num_val": 8})
    ours = {p.relative_to(tmp_path / "other"): p.read_bytes() for p in _files(tmp_path / "other")}
    theirs = {p.relative_to(relational_root): p.read_bytes() for p in _files(relational_root)}
    assert any(data != theirs.get(rel) for rel, data in ours.items())


def test_layout_and_balanced_classes(relational_root: Path) -> None:
    for split, count in (("train", SMALL["num_train"]), ("val", SMALL["num_val"])):
        class_dirs = sorted(p.name for p in (relational_root / split).iterdir())
        assert class_dirs == sorted(CLASS_NAMES)
        per_class = Counter(p.parent.name for p in (relational_root / split).rglob("*.png"))
        assert set(per_class.values()) == {count // 8}, per_class


def test_objects_in_single_distinct_cells_and_label_matches_pixels(relational_root: Path) -> None:
    files = _files(relational_root)
    assert len(files) == SMALL["num_train"] + SMALL["num_val"]
    sizes = set()
    for path in files:
        image = np.asarray(Image.open(path).convert("RGB"))
        assert image.shape == (IMG, IMG, 3)
        cell_a, cell_b = find_object(image, channel=0), find_object(image, channel=2)
        assert cell_a != cell_b
        assert CLASS_NAMES[compass(cell_a, cell_b)] == path.parent.name, path
        sizes.add(int(((image[..., 0] >= 150) & (image[..., 1] < 100)).sum()))
    assert len(sizes) > 1, "object size should jitter"


def test_background_is_label_independent_noise(relational_root: Path) -> None:
    """Background pixels (everything that is not an object) follow the same distribution in every class."""
    means = {}
    for name in CLASS_NAMES:
        images = np.stack(
            [np.asarray(Image.open(p)) for p in sorted((relational_root / "train" / name).glob("*"))]
        )
        background = images[(images.max(axis=-1) < 100)]
        assert background.max() < 64
        means[name] = background.mean()
    assert max(means.values()) - min(means.values()) < 1.0, means


def test_cell_permutation_yields_valid_images_with_other_labels(relational_root: Path) -> None:
    """A permutation-invariant model sees the same bag of patches for an image and all its cell permutations.

    Every permutation is again a valid sample (whole squares inside distinct cells), and its label is usually
    different, so such a model cannot beat chance.
    """
    rng = np.random.default_rng(0)
    files = _files(relational_root / "val")[:40]
    changed, total, permuted_labels = 0, 0, Counter()
    for path in files:
        image = np.asarray(Image.open(path).convert("RGB"))
        label = compass(find_object(image, 0), find_object(image, 2))
        for _ in range(25):
            shuffled = permute_cells(image, rng.permutation(GRID * GRID))
            # find_object asserts the objects are still whole squares inside single cells.
            cell_a, cell_b = find_object(shuffled, 0), find_object(shuffled, 2)
            assert cell_a != cell_b
            new_label = compass(cell_a, cell_b)
            permuted_labels[new_label] += 1
            changed += new_label != label
            total += 1
    assert changed / total > 0.75, changed / total
    # The labels over the permutation orbit are spread over all classes, none dominant: the best constant
    # prediction per bag (what a permutation-invariant model can do) is right only ~1/8 of the time.
    assert len(permuted_labels) == 8 and max(permuted_labels.values()) / total < 0.2, permuted_labels


def test_generation_speed(tmp_path: Path) -> None:
    """10k images must take well under a minute on 2 cores (about 2-3 s in practice); check 2k here."""
    import time

    start = time.perf_counter()
    generate_relational_shapes(tmp_path / "speed", num_train=1600, num_val=400)
    assert time.perf_counter() - start < 10
