"""Relational shapes: a synthetic task that is unsolvable without position information.

Each image shows a red square (object A) and a blue square (object B) on dark i.i.d. noise. The label is the
compass direction from A to B (8 classes). The data is built so that a ViT *without* position encodings (a
permutation-invariant function of its patch tokens) is stuck at chance:

* the image is a ``grid x grid`` lattice of ``patch_size``-pixel cells, matching the ViT patch grid;
* each object lies entirely inside one cell (its size and offset inside the cell jitter, independent of the
  label), and A and B occupy different cells;
* the background is i.i.d. uniform noise, identically distributed in every pixel.

So the multiset of patches (one patch with A, one with B, the rest noise) has the same distribution for every
class; shuffling the cells gives another valid image whose label is generally different. Only *where* the two
patches sit, i.e. position information, determines the label.

Direction rule: the angle of the cell offset (row axis points down, so north = smaller row)
``theta = atan2(-(row_B - row_A), col_B - col_A)`` is binned into 45 degree sectors centred on E, NE, N, ...
The label is defined on cells (= ViT tokens), not on pixel centroids: for nearby cells the jitter inside the
cells can make the pixel-level angle drift into a neighbouring sector, which a model must learn to ignore.
Cell pairs whose angle is within ``boundary_margin_deg`` of a sector boundary (22.5 + 45k degrees) are never
used, so every class is separated from its neighbours by an angular gap of at least 2 * margin.
The class is drawn first (exactly balanced), then a cell pair uniformly among the valid pairs of that class.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

# Class k is the sector centred on angle 45*k degrees (counter-clockwise from east).
CLASS_NAMES: tuple[str, ...] = ("0_E", "1_NE", "2_N", "3_NW", "4_W", "5_SW", "6_S", "7_SE")
NUM_CLASSES = len(CLASS_NAMES)

# Object colours: one dominant channel in [OBJECT_MIN, 255], the others in [0, OFF_CHANNEL_MAX]; the
# background is below noise_max in every channel, so objects are separable from noise by a simple threshold.
OBJECT_MIN, OFF_CHANNEL_MAX = 180, 40
DEFAULT_NOISE_MAX = 64
_SPLIT_STREAM = {"train": 0, "val": 1}


def direction_class(d_row: np.ndarray, d_col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Compass class and distance (degrees) to the nearest sector boundary of offsets A->B.

    Args:
        d_row, d_col: integer arrays of the same shape, row/col offset from A to B (row axis points down).
    Returns:
        (class index in [0, 8), angular distance to the closest sector boundary in [0, 22.5]).
    """
    angle = np.degrees(np.arctan2(-d_row, d_col)) % 360.0
    sector = np.floor((angle + 22.5) / 45.0).astype(np.int64) % NUM_CLASSES
    offset_in_sector = (angle + 22.5) % 45.0  # 0 and 45 are the boundaries
    return sector, np.minimum(offset_in_sector, 45.0 - offset_in_sector)


def valid_cell_pairs(grid: int, boundary_margin_deg: float) -> list[np.ndarray]:
    """For each class, all usable (row_A, col_A, row_B, col_B) cell pairs, shape (num_pairs_k, 4)."""
    rows, cols = np.divmod(np.arange(grid * grid), grid)
    a, b = np.meshgrid(np.arange(grid * grid), np.arange(grid * grid), indexing="ij")
    a, b = a[a != b], b[a != b]  # A and B in different cells
    cls, margin = direction_class(rows[b] - rows[a], cols[b] - cols[a])
    keep = margin >= boundary_margin_deg
    pairs = np.stack([rows[a], cols[a], rows[b], cols[b]], axis=1)
    per_class = [pairs[keep & (cls == k)] for k in range(NUM_CLASSES)]
    empty = [CLASS_NAMES[k] for k, p in enumerate(per_class) if len(p) == 0]
    if empty:
        raise ValueError(
            f"grid={grid}, boundary_margin_deg={boundary_margin_deg} leaves no cell pair for {empty}"
        )
    return per_class


def render_relational_shapes(
    num_images: int,
    img_size: int = 32,
    patch_size: int = 4,
    seed: int | np.random.SeedSequence = 0,
    min_object_size: int = 2,
    max_object_size: int | None = None,
    boundary_margin_deg: float = 5.0,
    noise_max: int = DEFAULT_NOISE_MAX,
) -> tuple[np.ndarray, np.ndarray]:
    """Render images in memory.

    Returns:
        images: uint8 (num_images, img_size, img_size, 3), RGB.
        labels: int64 (num_images,), index into CLASS_NAMES; exactly balanced up to num_images % 8.
    """
    if img_size % patch_size:
        raise ValueError(f"img_size={img_size} must be a multiple of patch_size={patch_size}")
    max_object_size = patch_size - 1 if max_object_size is None else max_object_size
    if not 1 <= min_object_size <= max_object_size <= patch_size:
        raise ValueError(f"need 1 <= min_object_size <= max_object_size <= patch_size={patch_size}")
    if not 0 < noise_max <= OBJECT_MIN - 50:
        raise ValueError(f"noise_max={noise_max} must be in (0, {OBJECT_MIN - 50}] to keep objects visible")
    grid = img_size // patch_size
    pairs_per_class = valid_cell_pairs(grid, boundary_margin_deg)
    rng = np.random.default_rng(seed)
    n = num_images

    labels = rng.permutation(np.arange(n) % NUM_CLASSES)
    cells = np.empty((n, 4), dtype=np.int64)  # (row_A, col_A, row_B, col_B)
    for k, pairs in enumerate(pairs_per_class):
        members = np.flatnonzero(labels == k)
        cells[members] = pairs[rng.integers(len(pairs), size=len(members))]

    images = rng.integers(0, noise_max, size=(n, img_size, img_size, 3), dtype=np.uint8)
    # Per object (A, B): side length, top-left offset inside its cell, and colour; all label-independent.
    sizes = rng.integers(min_object_size, max_object_size + 1, size=(n, 2))
    offsets = rng.integers(0, patch_size - sizes[..., None] + 1, size=(n, 2, 2))  # (.., obj, row/col)
    colours = rng.integers(0, OFF_CHANNEL_MAX + 1, size=(n, 2, 3))
    colours[:, 0, 0] = rng.integers(OBJECT_MIN, 256, size=n)  # A: red dominant
    colours[:, 1, 2] = rng.integers(OBJECT_MIN, 256, size=n)  # B: blue dominant
    colours = colours.astype(np.uint8)

    for i in range(n):
        for obj in range(2):
            top = cells[i, 2 * obj] * patch_size + offsets[i, obj, 0]
            left = cells[i, 2 * obj + 1] * patch_size + offsets[i, obj, 1]
            s = sizes[i, obj]
            images[i, top : top + s, left : left + s] = colours[i, obj]
    return images, labels


def generate_relational_shapes(
    root: str | Path,
    num_train: int = 8000,
    num_val: int = 2000,
    img_size: int = 32,
    patch_size: int = 4,
    seed: int = 0,
    min_object_size: int = 2,
    max_object_size: int | None = None,
    boundary_margin_deg: float = 5.0,
    noise_max: int = DEFAULT_NOISE_MAX,
) -> None:
    """Write the dataset as an ImageFolder: ``root/{train,val}/<class>/<index>.png`` (lossless RGB PNG).

    Deterministic: the same arguments give byte-identical files. Train and val use independent random streams
    derived from ``seed``, so changing ``num_val`` does not change the training images. ``patch_size`` must
    equal the ViT patch size for the "no position encoding => chance" property to hold.
    """
    root = Path(root)
    for split, count in (("train", num_train), ("val", num_val)):
        images, labels = render_relational_shapes(
            count,
            img_size=img_size,
            patch_size=patch_size,
            seed=np.random.SeedSequence([seed, _SPLIT_STREAM[split]]),
            min_object_size=min_object_size,
            max_object_size=max_object_size,
            boundary_margin_deg=boundary_margin_deg,
            noise_max=noise_max,
        )
        for name in CLASS_NAMES:
            (root / split / name).mkdir(parents=True, exist_ok=True)
        for index, (image, label) in enumerate(zip(images, labels, strict=True)):
            # compress_level=1: ~3x faster than the default and the files are tiny anyway.
            Image.fromarray(image).save(
                root / split / CLASS_NAMES[label] / f"{index:05d}.png", compress_level=1
            )
