"""Relational shapes: a synthetic task that is unsolvable without position information.

Each image shows a red square (object A) and a blue square (object B), 5-7 px wide at free pixel positions,
on dark i.i.d. noise. The label is the compass direction from the centre of A to the centre of B (8 classes).

Why a ViT *without* position encodings stays at chance: such a model is a permutation-invariant function of
its patch tokens, so it sees the bag of patches (fragments of A, fragments of B, noise) but not where they
sit. No ``patch_size`` cell ever holds pixels of both objects, so no single patch shows the relation; the
fragments only tell each object's alignment inside the patch lattice, which carries (almost) no information
about the direction. Measured: a no-PE micro DeiT stays at 12.5% (``tests/test_train.py``).

Why objects span several patches: with one-patch objects the relational signal at initialisation is a
single token out of 65 and a micro ViT sat on the loss plateau (ln 8) for 600+ steps in every setting
tried (APE, iRPE-K/QKV, lr 3e-4..3e-3, 16 or 32 px); with 5-7 px squares (4-9 tokens each) it learns in
a few hundred steps, as the prototype did.

Direction rule: ``theta = atan2(-(row_B - row_A), col_B - col_A)`` of the centre offset (row axis points
down, so north = smaller row), binned into 45 degree sectors centred on E, NE, N, ... Placements whose angle
is within ``boundary_margin_deg`` of a sector boundary are rejected, so classes are separated by an angular
gap. The class is drawn first (exactly balanced), then a placement uniformly among the valid ones.
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
DEFAULT_NOISE_MAX = 32
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


def render_relational_shapes(
    num_images: int,
    img_size: int = 32,
    patch_size: int = 4,
    seed: int | np.random.SeedSequence = 0,
    min_object_size: int = 5,
    max_object_size: int = 7,
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
    if not 1 <= min_object_size <= max_object_size <= img_size // 3:
        raise ValueError(f"need 1 <= min_object_size <= max_object_size <= img_size // 3 = {img_size // 3}")
    if not 0 < noise_max <= OBJECT_MIN - 50:
        raise ValueError(f"noise_max={noise_max} must be in (0, {OBJECT_MIN - 50}] to keep objects visible")
    rng = np.random.default_rng(seed)
    n = num_images
    labels = rng.permutation(np.arange(n) % NUM_CLASSES)
    sizes = rng.integers(min_object_size, max_object_size + 1, size=(n, 2))  # (image, object)

    # Rejection sampling of the top-left corners (image, object, row/col) until every image's placement
    # has its class, keeps off sector boundaries and shares no patch cell between A and B.
    corners = np.zeros((n, 2, 2), dtype=np.int64)
    pending = np.arange(n)
    while len(pending):
        size = sizes[pending][:, :, None]
        trial = (rng.random((len(pending), 2, 2)) * (img_size - size + 1)).astype(np.int64)
        centre = trial + (size - 1) / 2.0
        offset = centre[:, 1] - centre[:, 0]
        cls, margin = direction_class(offset[:, 0], offset[:, 1])
        first_cell, last_cell = trial // patch_size, (trial + size - 1) // patch_size
        ranges_meet = (first_cell[:, 0] <= last_cell[:, 1]) & (first_cell[:, 1] <= last_cell[:, 0])
        share_cell = ranges_meet.all(axis=-1)
        ok = (cls == labels[pending]) & (margin >= boundary_margin_deg) & ~share_cell
        corners[pending[ok]] = trial[ok]
        pending = pending[~ok]

    images = rng.integers(0, noise_max, size=(n, img_size, img_size, 3), dtype=np.uint8)
    colours = rng.integers(0, OFF_CHANNEL_MAX + 1, size=(n, 2, 3))
    colours[:, 0, 0] = rng.integers(OBJECT_MIN, 256, size=n)  # A: red dominant
    colours[:, 1, 2] = rng.integers(OBJECT_MIN, 256, size=n)  # B: blue dominant
    colours = colours.astype(np.uint8)
    for i in range(n):
        for obj in range(2):
            (top, left), s = corners[i, obj], sizes[i, obj]
            images[i, top : top + s, left : left + s] = colours[i, obj]
    return images, labels


def generate_relational_shapes(
    root: str | Path,
    num_train: int = 8000,
    num_val: int = 2000,
    img_size: int = 32,
    patch_size: int = 4,
    seed: int = 0,
    min_object_size: int = 5,
    max_object_size: int = 7,
    boundary_margin_deg: float = 5.0,
    noise_max: int = DEFAULT_NOISE_MAX,
) -> None:
    """Write the dataset as an ImageFolder: ``root/{train,val}/<class>/<index>.png`` (lossless RGB PNG).

    Deterministic: the same arguments give byte-identical files. Train and val use independent random streams
    derived from ``seed``, so changing ``num_val`` does not change the training images. ``patch_size`` should
    equal the ViT patch size: no patch of that size holds both objects.
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
