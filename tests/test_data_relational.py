"""Relational-shapes generator: determinism, balance, geometry and labels.

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


def find_object(image: np.ndarray, channel: int) -> tuple[float, float, set[tuple[int, int]]]:
    """Locate the single solid square dominated by `channel` in an (H, W, 3) uint8 image.

    Returns its centre (row, col) and the set of PATCH x PATCH cells it touches.
    """
    others = [c for c in range(3) if c != channel]
    mask = (image[..., channel] >= 150) & (image[..., others[0]] < 100) & (image[..., others[1]] < 100)
    rows, cols = np.nonzero(mask)
    assert len(rows) > 0, "object not found"
    r0, r1, c0, c1 = rows.min(), rows.max(), cols.min(), cols.max()
    height, width = r1 - r0 + 1, c1 - c0 + 1
    assert height == width and mask.sum() == height * width, "object is not one solid square"
    assert 5 <= height <= 7, height
    cells = {(r // PATCH, c // PATCH) for r, c in zip(rows, cols, strict=True)}
    return (r0 + r1) / 2, (c0 + c1) / 2, cells


def compass(a: tuple[float, float], b: tuple[float, float]) -> tuple[int, float]:
    """Sector index (E, NE, N, ... counter-clockwise) of the offset A->B, rows pointing down, and the
    angular distance to the nearest sector boundary."""
    angle = math.degrees(math.atan2(-(b[0] - a[0]), b[1] - a[1])) % 360
    inside = (angle + 22.5) % 45
    return int(((angle + 22.5) // 45) % 8), min(inside, 45 - inside)


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


def test_objects_in_disjoint_cells_and_label_matches_pixels(relational_root: Path) -> None:
    files = _files(relational_root)
    assert len(files) == SMALL["num_train"] + SMALL["num_val"]
    sizes = set()
    for path in files:
        image = np.asarray(Image.open(path).convert("RGB"))
        assert image.shape == (IMG, IMG, 3)
        *centre_a, cells_a = find_object(image, channel=0)
        *centre_b, cells_b = find_object(image, channel=2)
        assert not cells_a & cells_b, "a patch shows both objects"
        sector, margin = compass(centre_a, centre_b)
        assert CLASS_NAMES[sector] == path.parent.name, path
        assert margin >= 5.0 - 1e-9
        sizes.add(len(cells_a))
    assert len(sizes) > 1, "object placement should vary"


def test_background_is_label_independent_noise(relational_root: Path) -> None:
    """Background pixels (everything that is not an object) follow the same distribution in every class."""
    means = {}
    for name in CLASS_NAMES:
        images = np.stack(
            [np.asarray(Image.open(p)) for p in sorted((relational_root / "train" / name).glob("*"))]
        )
        background = images[(images.max(axis=-1) < 100)]
        assert background.max() < 32
        means[name] = background.mean()
    assert max(means.values()) - min(means.values()) < 1.0, means


# ------------------------------------------------------------------------------ label="distance"
EDGES = (1.5, 2.5, 3.5, 4.5, 5.5)


@pytest.mark.parametrize("img_size", [32, 64])
def test_distance_labels_match_the_pixels(img_size: int) -> None:
    """The distance class, recomputed from the rendered squares: Chebyshev distance of the centres in
    patches, binned by the edges, at least the margin (1 px) from every edge; the same bins on a larger canvas."""
    from data.relational import class_names, render_relational_shapes

    images, labels = render_relational_shapes(64, img_size=img_size, seed=4, label="distance")
    assert class_names("distance") == ("0_d1.5-2.5", "1_d2.5-3.5", "2_d3.5-4.5", "3_d4.5-5.5")
    assert sorted(Counter(labels.tolist()).values()) == [16] * 4  # exactly balanced
    for image, label in zip(images, labels, strict=True):
        *centre_a, cells_a = find_object(image, channel=0)
        *centre_b, cells_b = find_object(image, channel=2)
        assert not cells_a & cells_b
        patches = max(abs(centre_b[0] - centre_a[0]), abs(centre_b[1] - centre_a[1])) / PATCH
        assert EDGES[label] <= patches < EDGES[label + 1]
        assert min(abs(patches - e) for e in EDGES) * PATCH >= 1.0


def _brute_force_distance_rates(img: int, patch: int, size_a: int, size_b: int, margin_px: float,
                                edges: tuple[float, ...]) -> np.ndarray:
    from itertools import product

    counts, total = np.zeros(len(edges) - 1), 0
    for ra, ca, rb, cb in product(range(img - size_a + 1), range(img - size_a + 1),
                                  range(img - size_b + 1), range(img - size_b + 1)):
        total += 1
        d = max(abs(rb + (size_b - 1) / 2 - ra - (size_a - 1) / 2), abs(cb + (size_b - 1) / 2 - ca - (size_a - 1) / 2))
        meet_rows = ra // patch <= (rb + size_b - 1) // patch and rb // patch <= (ra + size_a - 1) // patch
        meet_cols = ca // patch <= (cb + size_b - 1) // patch and cb // patch <= (ca + size_a - 1) // patch
        bins = [k for k in range(len(edges) - 1) if edges[k] <= d / patch < edges[k + 1]]
        if bins and not (meet_rows and meet_cols) and min(abs(d - e * patch) for e in edges) >= margin_px:
            counts[bins[0]] += 1
    return counts / total


@pytest.mark.parametrize(("img", "patch", "size_a", "size_b", "margin", "edges"),
                         [(12, 2, 2, 3, 0.0, (1.0, 2.0, 4.0)), (12, 3, 3, 2, 1.0, (1.0, 2.0, 3.0))])
def test_distance_placement_rates_match_enumeration(img: int, patch: int, size_a: int, size_b: int, margin: float,
                                                    edges: tuple[float, ...]) -> None:
    from data.relational import placement_rates

    rates, _ = placement_rates(img, patch, size_a, size_b, margin, None, "distance", edges)
    np.testing.assert_allclose(rates, _brute_force_distance_rates(img, patch, size_a, size_b, margin, edges),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize(("settings", "message"), [
    ({"label": "range"}, "data.generator.label='range' is not one of: direction, distance"),
    ({"distance_edges": [2, 1, 3]}, "data.generator.distance_edges=[2, 1, 3] must be at least 3 increasing"),
    ({"distance_margin_px": 2}, "data.generator.distance_margin_px=2 must be a number in [0, 2): under half the"),
    ({"distance_edges": [1.5, 2.5, 7.0, 8.0]}, "objects of 5 and 5 px: no placement of class 2_d7-8 (centres that"
                                               " many patches apart, in separate patches) exists; use a larger"),
])
def test_impossible_distance_settings_are_one_line(tmp_path: Path, settings: dict, message: str) -> None:
    from data.errors import DataConfigError

    with pytest.raises(DataConfigError) as err:
        generate_relational_shapes(tmp_path / "rel", num_train=8, num_val=8, **{"label": "distance", **settings})
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert not (tmp_path / "rel").exists()


def test_distance_data_is_an_image_folder_of_its_classes(tmp_path: Path) -> None:
    generate_relational_shapes(tmp_path / "rel", num_train=8, num_val=4, label="distance")
    assert sorted(p.name for p in (tmp_path / "rel" / "train").iterdir()) == [
        "0_d1.5-2.5", "1_d2.5-3.5", "2_d3.5-4.5", "3_d4.5-5.5"]
    assert sum(1 for _ in (tmp_path / "rel" / "val").rglob("*.png")) == 4
