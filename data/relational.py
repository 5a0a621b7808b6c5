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

Before sampling, `placement_rates` counts the valid placements of every class and pair of object sizes
exactly; settings that leave any of them without one (a margin of 22.5 degrees, a canvas too small for two
objects in separate patches) are a `DataConfigError` naming the settings and the valid range, never an
endless loop. The sampling itself gives up after `MAX_PLACEMENT_TRIES` tries per image.

Labels: ``label="direction"`` (the default) is the compass class above. ``label="distance"`` is a relation
in patch units instead: the Chebyshev distance between the two centres, in patches (``max(|d_row|,
|d_col|) / patch_size``), binned by ``distance_edges`` (class k: ``edges[k] <= d < edges[k + 1]``; placements
outside ``[edges[0], edges[-1])`` are rejected), with placements within ``distance_margin_px`` pixels of an
edge rejected as the angular margin does for directions. The direction of two objects does not change when
an image is scaled; their distance in patches does, so a model that reads positions from a resized
(interpolated) absolute table misjudges it on a larger canvas, while offsets counted in patches do not.

Canvas and region: ``img_size`` is the canvas; object sizes are in pixels, independent of it, so a 64 px
canvas holds the same 5-7 px squares as a 32 px one. ``region=[top, left, bottom, right]`` (pixels,
half-open) confines both objects wholly to that rectangle of the canvas (the noise still fills the whole
canvas), e.g. ``[0, 0, 32, 16]`` is the left half of a 32 px canvas; ``None`` is the whole canvas and
gives exactly the images of a generator without the option.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from data.errors import DataConfigError
from data.generation import settings_check

# Class k is the sector centred on angle 45*k degrees (counter-clockwise from east).
CLASS_NAMES: tuple[str, ...] = ("0_E", "1_NE", "2_N", "3_NW", "4_W", "5_SW", "6_S", "7_SE")
NUM_CLASSES = len(CLASS_NAMES)

# Object colours: one dominant channel in [OBJECT_MIN, 255], the others in [0, OFF_CHANNEL_MAX]; the
# background is below noise_max in every channel, so objects are separable from noise by a simple threshold.
OBJECT_MIN, OFF_CHANNEL_MAX = 180, 40
DEFAULT_NOISE_MAX = 32
_SPLIT_STREAM = {"train": 0, "val": 1}
# Tries per image before the rejection sampling gives up. The default settings need a few dozen at most;
# valid placements rare enough to exhaust this are better fixed in the settings than waited for.
MAX_PLACEMENT_TRIES = 10_000


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


LABELS = ("direction", "distance")
DEFAULT_DISTANCE_EDGES = (1.5, 2.5, 3.5, 4.5, 5.5)  # patches: 4 classes on the 32 px canvas


def distance_class_names(edges: Sequence[float]) -> tuple[str, ...]:
    """Folder names of the distance classes: ``<k>_d<lo>-<hi>`` (patches), sorted as the class index."""
    return tuple(f"{k}_d{lo:g}-{hi:g}" for k, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)))


def class_names(label: str = "direction", distance_edges: Sequence[float] | None = None) -> tuple[str, ...]:
    """The class folder names of a ``label`` mode (`LABELS`)."""
    if label == "direction":
        return CLASS_NAMES
    return distance_class_names(DEFAULT_DISTANCE_EDGES if distance_edges is None else distance_edges)


def distance_class(d_row: np.ndarray, d_col: np.ndarray, patch_size: int,
                   edges: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Distance class and distance (pixels) to the nearest bin edge of centre offsets A->B.

    Returns:
        (class index in [0, len(edges) - 1), -1 outside ``[edges[0], edges[-1])``; pixel distance of the
        Chebyshev centre distance to the closest edge).
    """
    distance = np.maximum(np.abs(d_row), np.abs(d_col)) / patch_size
    bounds = np.asarray(edges, dtype=np.float64)
    cls = np.searchsorted(bounds, distance, side="right") - 1
    cls = np.where((cls >= 0) & (cls < len(bounds) - 1), cls, -1).astype(np.int64)
    margin = np.min(np.abs(distance[..., None] - bounds), axis=-1) * patch_size
    return cls, margin


def _labeller(label: str, patch_size: int, distance_edges: Sequence[float] | None):  # noqa: ANN202
    """``(d_row, d_col) -> (class, margin)`` of a label mode (margin in degrees or pixels)."""
    if label == "direction":
        return direction_class
    edges = tuple(DEFAULT_DISTANCE_EDGES if distance_edges is None else distance_edges)
    return functools.partial(distance_class, patch_size=patch_size, edges=edges)


def check_label(label: object, distance_edges: object, distance_margin_px: object, patch_size: int) -> None:
    """One line unless ``label`` is a mode of `LABELS` and, for distances, the edges are increasing
    numbers >= 0 and the margin is a number in [0, half the narrowest bin)."""
    if label not in LABELS:
        raise DataConfigError(f"data.generator.label={label!r} is not one of: {', '.join(LABELS)}")
    if label != "distance":
        return
    edges = DEFAULT_DISTANCE_EDGES if distance_edges is None else distance_edges
    values = list(edges) if hasattr(edges, "__len__") and not isinstance(edges, (str, bytes)) else None
    numbers = values is not None and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if not numbers or len(values) < 3 or any(not math.isfinite(v) or v < 0 for v in values) or any(
            b <= a for a, b in zip(values[:-1], values[1:], strict=False)):
        raise DataConfigError(f"data.generator.distance_edges={distance_edges!r} must be at least 3 increasing"
                              " finite numbers >= 0 (bin edges in patches; 2 or more classes)")
    half = min(b - a for a, b in zip(values[:-1], values[1:], strict=False)) * patch_size / 2
    if not (isinstance(distance_margin_px, (int, float)) and not isinstance(distance_margin_px, bool)
            and 0 <= distance_margin_px < half):
        raise DataConfigError(f"data.generator.distance_margin_px={distance_margin_px!r} must be a number in"
                              f" [0, {half:g}): under half the narrowest bin ({half:g} px), or a bin has no"
                              " distance far enough from both of its edges")


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _axis_pairs(lo: int, hi: int, patch_size: int, size_a: int, size_b: int) -> tuple[np.ndarray, np.ndarray]:
    """Along one axis, objects wholly in pixels ``lo .. hi - 1``: for each corner offset ``top_B - top_A``
    (index ``offset + hi - lo - size_a``), how many (top_A, top_B) pairs have it, and how many of those put
    A and B in overlapping patch ranges (the patch lattice starts at pixel 0 of the canvas, not at ``lo``)."""
    top_a = np.arange(lo, hi - size_a + 1)[:, None]
    top_b = np.arange(lo, hi - size_b + 1)[None, :]
    extent = hi - lo
    index = (top_b - top_a + extent - size_a).ravel()
    meet = (top_a // patch_size <= (top_b + size_b - 1) // patch_size) & (
        top_b // patch_size <= (top_a + size_a - 1) // patch_size
    )
    length = 2 * extent - size_a - size_b + 1
    return np.bincount(index, minlength=length), np.bincount(index, weights=meet.ravel(), minlength=length)


def placement_region(img_size: int, region: Sequence[int] | None) -> tuple[int, int, int, int]:
    """``(top, left, bottom, right)`` of ``region`` on an ``img_size`` canvas (None: the whole canvas);
    anything else than four integers with ``0 <= top < bottom <= img_size`` (and so for left/right) is a
    one-line `DataConfigError`."""
    if region is None:
        return 0, 0, img_size, img_size
    values = list(region) if not isinstance(region, (str, bytes)) and hasattr(region, "__len__") else None
    if values is None or len(values) != 4 or not all(_is_int(v) for v in values):
        raise DataConfigError(
            f"data.generator.region={region!r} must be null or [top, left, bottom, right]: four integer pixel"
            f" bounds (half-open) on the {img_size} px canvas"
        )
    top, left, bottom, right = (int(v) for v in values)
    if not (0 <= top < bottom <= img_size and 0 <= left < right <= img_size):
        raise DataConfigError(
            f"data.generator.region={values} must satisfy 0 <= top < bottom <= {img_size} and"
            f" 0 <= left < right <= {img_size} (img_size={img_size})"
        )
    return top, left, bottom, right


@functools.lru_cache(maxsize=2)
def _label_grid(img_size: int, size_difference: int, label: str, patch_size: int,
                distance_edges: tuple[float, ...] | None) -> tuple[np.ndarray, np.ndarray]:
    """The class and margin (`_labeller`) of every pair of row/column corner offsets -(img_size - 1) ..
    img_size - 1; the centre offset adds (size_B - size_A) / 2 on both axes, so size pairs of equal
    difference share it."""
    offset = np.arange(-(img_size - 1), img_size) + size_difference / 2.0
    return _labeller(label, patch_size, distance_edges)(offset[:, None], offset[None, :])


def placement_rates(
    img_size: int,
    patch_size: int,
    size_a: int,
    size_b: int,
    boundary_margin_deg: float,
    region: Sequence[int] | None = None,
    label: str = "direction",
    distance_edges: Sequence[float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact acceptance rate of the rejection sampler for objects of ``size_a`` and ``size_b`` px.

    ``boundary_margin_deg`` is the margin of the ``label`` mode: degrees for directions, pixels for
    distances (``distance_margin_px``).

    Rows and columns are drawn independently, so a placement is a pair of per-axis corner offsets; it shares
    a patch cell iff the patch ranges meet on both axes. Counting per axis gives, for every 2-D offset, the
    number of placements and of those that share a cell, and the class and boundary distance of an offset
    are computed by `direction_class` exactly as the sampler does. With a ``region`` (see
    `placement_region`), rows and columns range over its bounds instead of the whole canvas.

    Returns:
        (fraction of all placements that are valid, per class; the largest ``boundary_margin_deg`` that
        would leave the class a valid placement, per class, -inf where no placement keeps the objects in
        separate patches). Both of shape (classes,).
    """
    top, left, bottom, right = placement_region(img_size, region)
    count_row, meet_row = _axis_pairs(top, bottom, patch_size, size_a, size_b)
    count_col, meet_col = _axis_pairs(left, right, patch_size, size_a, size_b)

    def window(extent: int) -> slice:  # corner offsets -(extent - size_a) .. extent - size_b in the grid
        return slice(img_size - 1 - extent + size_a, img_size + extent - size_b)

    rows, cols = window(bottom - top), window(right - left)
    edges = None if distance_edges is None else tuple(float(e) for e in distance_edges)
    grids = _label_grid(img_size, size_b - size_a, label, patch_size, edges if label == "distance" else None)
    cls, margin = (grid[rows, cols] for grid in grids)
    num_classes = len(class_names(label, distance_edges))
    separate = np.outer(count_row, count_col) - np.outer(meet_row, meet_col)  # placements sharing no cell
    usable = (separate > 0) & (cls >= 0)
    total = float(count_row.sum()) * float(count_col.sum())
    ok = usable & (margin >= boundary_margin_deg)
    rates = np.bincount(cls[ok], weights=separate[ok], minlength=num_classes) / total
    best = np.array([margin[usable & (cls == k)].max(initial=-np.inf) for k in range(num_classes)])
    return rates, best


def check_relational_settings(
    img_size: int,
    patch_size: int,
    min_object_size: int,
    max_object_size: int,
    boundary_margin_deg: float,
    noise_max: int,
    region: Sequence[int] | None = None,
    label: str = "direction",
    distance_edges: Sequence[float] | None = None,
    distance_margin_px: float = 1.0,
) -> None:
    """Raise a one-line `DataConfigError` unless every class has a valid placement for every pair of object
    sizes the generator can draw (so the rejection sampling always terminates), inside ``region`` if given."""
    for name, value in (("img_size", img_size), ("patch_size", patch_size), ("noise_max", noise_max),
                        ("min_object_size", min_object_size), ("max_object_size", max_object_size)):
        if not _is_int(value) or value < 1:
            raise DataConfigError(f"data.generator.{name}={value!r} must be a positive integer")
    if img_size % patch_size:
        raise DataConfigError(
            f"data.generator.img_size={img_size} must be a multiple of data.generator.patch_size={patch_size}"
        )
    if not min_object_size <= max_object_size <= img_size // 3:
        raise DataConfigError(
            f"data.generator object sizes min_object_size={min_object_size}, max_object_size={max_object_size}:"
            f" need 1 <= min_object_size <= max_object_size <= img_size // 3 = {img_size // 3}"
        )
    if not noise_max <= OBJECT_MIN - 50:
        raise DataConfigError(
            f"data.generator.noise_max={noise_max} must be in [1, {OBJECT_MIN - 50}] to keep objects visible"
        )
    top, left, bottom, right = placement_region(img_size, region)
    if region is not None and max_object_size > min(bottom - top, right - left):
        raise DataConfigError(
            f"data.generator.region={[top, left, bottom, right]} is {bottom - top}x{right - left} px:"
            f" max_object_size={max_object_size} does not fit it; valid: max_object_size <="
            f" {min(bottom - top, right - left)} or a larger region"
        )
    margin_ok = isinstance(boundary_margin_deg, (int, float, np.number)) and not isinstance(boundary_margin_deg, bool)
    if not (margin_ok and 0.0 <= boundary_margin_deg < 22.5):  # also refuses NaN
        raise DataConfigError(
            f"data.generator.boundary_margin_deg={boundary_margin_deg!r} must be a number in [0, 22.5): "
            "the sectors are 45 degrees wide, so no angle is 22.5 degrees or more from both of its boundaries"
        )
    check_label(label, distance_edges, distance_margin_px, patch_size)
    names = class_names(label, distance_edges)
    margin, margin_key = ((boundary_margin_deg, "boundary_margin_deg") if label == "direction"
                          else (distance_margin_px, "distance_margin_px"))
    sizes = range(min_object_size, max_object_size + 1)
    # Computed in order of size difference (the cached label grid is shared), reported in (a, b) order.
    by_difference = sorted(((a, b) for a in sizes for b in sizes), key=lambda pair: pair[1] - pair[0])
    pairs = sorted(
        ((a, b, *placement_rates(img_size, patch_size, a, b, margin, region, label, distance_edges))
         for a, b in by_difference),
        key=lambda pair: pair[:2],
    )
    best = min(best.min() for *_, best in pairs)  # the largest margin leaving every class and size pair a placement
    if best == -np.inf:  # no margin helps: name a class and size pair that cannot keep the objects apart
        size_a, size_b, _, class_best = next(pair for pair in pairs if pair[3].min() == -np.inf)
        missing = names[int(np.argmin(class_best))]
    else:
        failed = next((pair for pair in pairs if pair[2].min() == 0), None)
        if failed is None:
            return
        size_a, size_b, rates, _ = failed
        missing = names[int(np.argmin(rates))]
    where = f"data.generator img_size={img_size}, patch_size={patch_size}, objects of {size_a} and {size_b} px"
    larger = "img_size" if region is None else "region"
    if region is not None:
        where += f", region={[top, left, bottom, right]}"
    if best == -np.inf and label == "distance":
        raise DataConfigError(
            f"{where}: no placement of class {missing} (centres that many patches apart, in separate patches)"
            f" exists; use a larger {larger} or other data.generator.distance_edges"
        )
    if best == -np.inf:
        raise DataConfigError(
            f"{where}: no placement of class {missing} keeps the two objects in separate {patch_size}x{patch_size}"
            f" patches; use a larger {larger}, or a smaller patch_size or max_object_size"
        )
    raise DataConfigError(
        f"{where}: data.generator.{margin_key}={margin} leaves class {missing} no valid "
        f"placement; valid range with these settings: 0 <= {margin_key} <= {math.floor(best * 1000) / 1000}"
    )


def render_relational_shapes(
    num_images: int,
    img_size: int = 32,
    patch_size: int = 4,
    seed: int | np.random.SeedSequence = 0,
    min_object_size: int = 5,
    max_object_size: int = 7,
    boundary_margin_deg: float = 5.0,
    noise_max: int = DEFAULT_NOISE_MAX,
    region: Sequence[int] | None = None,
    label: str = "direction",
    distance_edges: Sequence[float] | None = None,
    distance_margin_px: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Render images in memory; ``region`` (`placement_region`) confines both objects to a rectangle;
    ``label`` picks the relation the class names (module docstring).

    Returns:
        images: uint8 (num_images, img_size, img_size, 3), RGB.
        labels: int64 (num_images,), index into `class_names`; exactly balanced up to num_images % classes.
    Raises:
        DataConfigError: settings without a valid placement for some class (checked before sampling), or
            placements so rare that `MAX_PLACEMENT_TRIES` tries per image were not enough.
    """
    if not _is_int(num_images) or num_images < 0:
        raise DataConfigError(f"num_images={num_images!r} must be an integer >= 0")
    check_relational_settings(
        img_size, patch_size, min_object_size, max_object_size, boundary_margin_deg, noise_max, region,
        label, distance_edges, distance_margin_px,
    )
    classify = _labeller(label, patch_size, distance_edges)
    margin_min = boundary_margin_deg if label == "direction" else distance_margin_px
    num_classes = len(class_names(label, distance_edges))
    top, left, bottom, right = placement_region(img_size, region)
    # per axis (row, col): the first pixel and the pixel count objects may occupy; the whole canvas by default
    start, extent = np.array([top, left]), np.array([bottom - top, right - left])
    rng = np.random.default_rng(seed)
    n = num_images
    labels = rng.permutation(np.arange(n) % num_classes)
    sizes = rng.integers(min_object_size, max_object_size + 1, size=(n, 2))  # (image, object)

    # Rejection sampling of the top-left corners (image, object, row/col) until every image's placement
    # has its class, keeps off sector boundaries and shares no patch cell between A and B.
    corners = np.zeros((n, 2, 2), dtype=np.int64)
    pending = np.arange(n)
    for _ in range(MAX_PLACEMENT_TRIES):
        if not len(pending):
            break
        size = sizes[pending][:, :, None]
        trial = (rng.random((len(pending), 2, 2)) * (extent - size + 1)).astype(np.int64) + start
        centre = trial + (size - 1) / 2.0
        offset = centre[:, 1] - centre[:, 0]
        cls, margin = classify(offset[:, 0], offset[:, 1])
        first_cell, last_cell = trial // patch_size, (trial + size - 1) // patch_size
        ranges_meet = (first_cell[:, 0] <= last_cell[:, 1]) & (first_cell[:, 1] <= last_cell[:, 0])
        share_cell = ranges_meet.all(axis=-1)
        ok = (cls == labels[pending]) & (margin >= margin_min) & ~share_cell
        corners[pending[ok]] = trial[ok]
        pending = pending[~ok]
    if len(pending):
        raise DataConfigError(
            f"data.generator: {len(pending)} of {n} images found no valid placement in {MAX_PLACEMENT_TRIES} "
            f"tries (img_size={img_size}, patch_size={patch_size}, object sizes {min_object_size}.."
            f"{max_object_size}, {'boundary_margin_deg' if label == 'direction' else 'distance_margin_px'}={margin_min}"
            f"{'' if region is None else f', region={[top, left, bottom, right]}'}): valid placements are too rare;"
            f" lower the margin or max_object_size, or raise {'img_size' if region is None else 'the region'}"
        )

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
    region: Sequence[int] | None = None,
    label: str = "direction",
    distance_edges: Sequence[float] | None = None,
    distance_margin_px: float = 1.0,
) -> None:
    """Write the dataset as an ImageFolder: ``root/{train,val}/<class>/<index>.png`` (lossless RGB PNG).

    Deterministic: the same arguments give byte-identical files. Train and val use independent random streams
    derived from ``seed``, so changing ``num_val`` does not change the training images. ``patch_size`` should
    equal the ViT patch size: no patch of that size holds both objects. ``region`` confines the objects to
    a rectangle of the canvas (`placement_region`; None = anywhere, the default images). ``label``,
    ``distance_edges`` and ``distance_margin_px``: the relation the classes name (module docstring).
    """
    check_generation_settings(num_train, num_val, img_size, patch_size, seed, min_object_size, max_object_size,
                              boundary_margin_deg, noise_max, region, label, distance_edges, distance_margin_px)
    names = class_names(label, distance_edges)
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
            region=region,
            label=label,
            distance_edges=distance_edges,
            distance_margin_px=distance_margin_px,
        )
        for name in names:
            (root / split / name).mkdir(parents=True, exist_ok=True)
        for index, (image, cls) in enumerate(zip(images, labels, strict=True)):
            # compress_level=1: ~3x faster than the default and the files are tiny anyway.
            Image.fromarray(image).save(root / split / names[cls] / f"{index:05d}.png", compress_level=1)


@settings_check(generate_relational_shapes)
def check_generation_settings(
    num_train: int, num_val: int, img_size: int, patch_size: int, seed: int, min_object_size: int,
    max_object_size: int, boundary_margin_deg: float, noise_max: int, region: Sequence[int] | None, label: str,
    distance_edges: Sequence[float] | None, distance_margin_px: float,
) -> None:
    """Every check `generate_relational_shapes` makes before it draws an image (one-line `DataConfigError`);
    cheap (milliseconds), so train.py runs it before it makes a run dir."""
    check_label(label, distance_edges, distance_margin_px, patch_size if _is_int(patch_size) else 1)
    names = class_names(label, distance_edges)
    for name, count in (("num_train", num_train), ("num_val", num_val)):
        if not _is_int(count) or count < len(names):
            raise DataConfigError(
                f"data.generator.{name}={count!r} must be an integer >= {len(names)}: every class needs an "
                "image in each split"
            )
    check_relational_settings(
        img_size, patch_size, min_object_size, max_object_size, boundary_margin_deg, noise_max, region,
        label, distance_edges, distance_margin_px,
    )
