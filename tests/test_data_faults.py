"""Fault classes of the data layer, each refused with one line naming the setting or path (never a hang, a
traceback or a silently different dataset):

- generators: settings without a valid placement are found before sampling; sampling has a bounded number
  of tries; temp dirs of killed generations are removed; a damaged marker, or generated data changed by hand,
  is refused;
- ImageFolder: symlink loops and folders reached twice; decompression bombs; an empty root;
- COCO: duplicate or dangling ids; splits without ground truth; boxes reaching outside their image (one rule
  for training and evaluation, which also never reports AP 0 for an empty ground truth).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import signal
import struct
import warnings
import zlib
from collections.abc import Iterator
from itertools import product
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.datasets import ImageFolder

import data.relational
from data import DataConfigError, ImageFolderDataModule, make_fake_imagefolder
from data.coco import CocoDataModule, CocoDetectionDataset, CocoLayoutError, generate_shapes_coco
from data.errors import load_rgb_image
from data.generation import (
    DIGEST_KEY,
    MARKER_NAME,
    ensure_generated,
    generation_lock,
    lock_path,
    new_temp_dir,
    sweep_stale_temp_dirs,
)
from data.relational import generate_relational_shapes, placement_rates, render_relational_shapes
from models.detr.coco_eval import METRIC_NAMES, evaluate_coco, load_coco


@pytest.fixture(autouse=True)
def _no_hang() -> Iterator[None]:
    """A regression to an endless loop fails the test instead of hanging the suite."""

    def fail(signum: int, frame: object) -> None:
        raise TimeoutError("the data layer hung (an unbounded loop?)")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert isinstance(err.value, DataConfigError) and "\n" not in message, message
    return message


# ------------------------------------------------------------------------------------ relational generator
@pytest.mark.parametrize("margin", [22.5, 30.0, -1.0, float("nan"), "5"])
def test_margin_outside_its_range_is_refused_before_sampling(tmp_path: Path, margin: object) -> None:
    with pytest.raises(DataConfigError) as err:
        generate_relational_shapes(tmp_path / "rel", num_train=8, num_val=8, boundary_margin_deg=margin)
    message = _one_line(err)
    assert f"data.generator.boundary_margin_deg={margin!r}" in message and "[0, 22.5)" in message
    assert not (tmp_path / "rel").exists()


def test_infeasible_margin_names_class_sizes_and_the_valid_range() -> None:
    """img 6, patches 3, objects of 1 and 2 px: centres differ by half-integers, so class E's flattest offset
    is 0.5 down over 4.5 across (A of 1 px at column 0, B of 2 px at columns 4-5), atan(1/9) = 6.34 degrees
    from east: at most 22.5 - 6.34 = 16.159 degrees from a sector boundary. Every other class and size pair
    allows more (e.g. equal sizes reach the sector centres exactly)."""
    best = 22.5 - math.degrees(math.atan(1 / 9))
    settings = {"img_size": 6, "patch_size": 3, "min_object_size": 1, "max_object_size": 2}
    with pytest.raises(DataConfigError) as err:
        render_relational_shapes(8, boundary_margin_deg=17.0, **settings)
    message = _one_line(err)
    assert "objects of 1 and 2 px" in message and "class 0_E" in message
    assert math.floor(best * 1000) / 1000 == 16.159 and "0 <= boundary_margin_deg <= 16.159" in message
    images, labels = render_relational_shapes(16, boundary_margin_deg=16.159, **settings)  # terminates
    assert images.shape == (16, 6, 6, 3) and sorted(np.bincount(labels)) == [2] * 8


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        ({"img_size": 3, "patch_size": 3, "min_object_size": 1, "max_object_size": 1},
         "no placement of class 0_E keeps the two objects in separate 3x3 patches"),
        ({"img_size": 8, "patch_size": 8, "min_object_size": 1, "max_object_size": 2},
         "in separate 8x8 patches"),
        ({"img_size": 32, "patch_size": 0}, "data.generator.patch_size=0 must be a positive integer"),
        ({"img_size": 30, "patch_size": 4}, "img_size=30 must be a multiple of data.generator.patch_size=4"),
        ({"min_object_size": 7, "max_object_size": 5}, "need 1 <= min_object_size <= max_object_size"),
        ({"num_val": 4}, "data.generator.num_val=4 must be an integer >= 8"),
    ],
)
def test_canvas_too_small_and_bad_sizes_are_refused(tmp_path: Path, settings: dict, fragment: str) -> None:
    with pytest.raises(DataConfigError) as err:
        generate_relational_shapes(tmp_path / "rel", **{"num_train": 8, "num_val": 8, **settings})
    assert fragment in _one_line(err)


def _brute_force_rates(img: int, patch: int, size_a: int, size_b: int, margin: float) -> np.ndarray:
    """Fraction of all corner placements valid for each class, by enumerating every placement, with the
    compass rule written out here (row axis down, sectors centred on E, NE, N, ...)."""
    counts, total = np.zeros(8), 0
    for ra, ca, rb, cb in product(range(img - size_a + 1), range(img - size_a + 1),
                                  range(img - size_b + 1), range(img - size_b + 1)):
        total += 1
        d_row = (rb + (size_b - 1) / 2) - (ra + (size_a - 1) / 2)
        d_col = (cb + (size_b - 1) / 2) - (ca + (size_a - 1) / 2)
        meet_rows = ra // patch <= (rb + size_b - 1) // patch and rb // patch <= (ra + size_a - 1) // patch
        meet_cols = ca // patch <= (cb + size_b - 1) // patch and cb // patch <= (ca + size_a - 1) // patch
        angle = math.degrees(math.atan2(-d_row, d_col)) % 360
        inside = (angle + 22.5) % 45
        if not (meet_rows and meet_cols) and min(inside, 45 - inside) >= margin:
            counts[int((angle + 22.5) // 45) % 8] += 1
    return counts / total


@pytest.mark.parametrize(("img", "patch", "size_a", "size_b", "margin"),
                         [(8, 4, 1, 2, 0.0), (9, 3, 2, 3, 10.0), (12, 4, 4, 3, 15.0)])
def test_placement_rates_match_enumeration(img: int, patch: int, size_a: int, size_b: int, margin: float) -> None:
    rates, _ = placement_rates(img, patch, size_a, size_b, margin)
    np.testing.assert_allclose(rates, _brute_force_rates(img, patch, size_a, size_b, margin), rtol=0, atol=1e-12)


def test_sampling_gives_up_after_a_bounded_number_of_tries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data.relational, "MAX_PLACEMENT_TRIES", 1)  # about 7% of tries succeed by default
    with pytest.raises(DataConfigError) as err:
        render_relational_shapes(64)
    message = _one_line(err)
    assert "of 64 images found no valid placement in 1 tries" in message and "boundary_margin_deg=5.0" in message


def test_generated_data_is_unchanged() -> None:
    """Digests of what the generators produced before feasibility checks existed (pixels and labels, not PNG
    bytes, so that a new zlib does not fail this): existing settings give the same data."""
    images, labels = render_relational_shapes(64, seed=np.random.SeedSequence([0, 0]))
    digest = hashlib.sha256(images.tobytes() + labels.astype(np.int64).tobytes()).hexdigest()
    assert digest == "45eea5c60b439ea3cbbf6c26d17210c4c36e8abf5915c014394d0d3394e112e4"


# ------------------------------------------------------------------------------------ COCO shapes generator
SHAPES = {"num_train": 12, "num_val": 6, "image_size": [40, 56], "object_size": [8, 20], "max_objects": 3}


def test_shapes_annotations_are_unchanged(tmp_path: Path) -> None:
    root = generate_shapes_coco(tmp_path / "shapes", **SHAPES)
    digests = {
        split: hashlib.sha256((root / "annotations" / f"instances_{split}2017.json").read_bytes()).hexdigest()
        for split in ("train", "val")
    }
    assert digests == {
        "train": "d9e11f90f5e088ddfeee7c750e8d02d7603cf83c934c327b5b6a73256542b3c7",
        "val": "95a4bdf3f9c58e64673e80fc9196244b44c05e4bad260dc1234ddf2913c19ecc",
    }


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"object_size": [48, 60]}, "the smallest object (48 px) must fit the smallest image (40 px)"),
        ({"image_size": [56, 40]}, "data.generator.image_size=[56, 40] must be [min, max]"),
        ({"object_size": [0, 8]}, "data.generator.object_size=[0, 8] must be [min, max]"),
        ({"max_objects": 0}, "data.generator.max_objects=0 must be an integer >= 1"),
        ({"num_val": 0}, "data.generator.num_val=0 must be an integer >= 1"),
        ({"max_overlap": 1.5}, "data.generator.max_overlap=1.5 must be a number in [0, 1]"),
    ],
)
def test_shapes_settings_without_room_are_refused(tmp_path: Path, change: dict, fragment: str) -> None:
    with pytest.raises(DataConfigError) as err:
        generate_shapes_coco(tmp_path / "shapes", **{**SHAPES, **change})
    assert fragment in _one_line(err)
    assert not any(tmp_path.iterdir())


def test_shapes_generator_removes_temp_dirs_of_killed_runs(tmp_path: Path) -> None:
    root = tmp_path / "shapes"
    old_style = tmp_path / ".shapes.tmp-0badc0de"  # the name the COCO generator used before
    old_style.mkdir()
    killed = new_temp_dir(root)  # as a killed run leaves it: created, never renamed, lock released
    (killed / "half.png").write_bytes(b"x")
    generate_shapes_coco(root, **SHAPES)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([lock_path(root).name, "shapes"])


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_shapes_generator_uses_only_a_root_it_made_with_the_same_settings(tmp_path: Path) -> None:
    """The COCO shapes generator took any existing folder for its data: another set's (one data.root for every
    test set), a hand-made one, one made with other settings. Now its marker records every setting (the
    defaults too) and a folder without it, or with other settings, is one line, left as it is."""
    root = generate_shapes_coco(tmp_path / "shapes", **SHAPES)
    recorded = json.loads((root / MARKER_NAME).read_text())["generator"]
    assert recorded == {"target": "data.coco._draw_shapes_coco",
                        "kwargs": {**SHAPES, "max_overlap": 0.35, "seed": 0}}
    made = _tree(root)
    assert generate_shapes_coco(root, **SHAPES) == root and _tree(root) == made  # the same settings: kept
    relational = tmp_path / "relational"
    ensure_generated(relational, FAKE)
    hand = tmp_path / "hand"
    (hand / "val2017").mkdir(parents=True)
    for folder, change, fragment in (
        (root, {"num_val": 7}, f"data.root={root} was generated with different settings (num_val: 6 on disk vs 7"
                               " configured)"),
        (root, {"seed": 1}, "(seed: 0 on disk vs 1 configured)"),
        (relational, {}, f"data.root={relational} was generated by data.fake.make_fake_imagefolder but"
                         " data.generator is data.coco._draw_shapes_coco"),
        (hand, {}, f"data.root={hand} exists but has no {MARKER_NAME} completion marker"),
    ):
        before = _tree(folder)
        with pytest.raises(DataConfigError) as err:
            generate_shapes_coco(folder, **{**SHAPES, **change})
        assert fragment in _one_line(err)
        assert _tree(folder) == before


def test_a_shapes_root_without_its_marker_is_refused_where_it_is_read(tmp_path: Path) -> None:
    """eval.py reads generated data only as its marker records it: a COCO shapes root without one (a folder
    of other data) or of other settings is one line naming it, never read as the set."""
    from lifecycle.run_config import RunDataError, require_existing_data

    root = generate_shapes_coco(tmp_path / "shapes", **SHAPES)
    (tmp_path / "other" / "val2017").mkdir(parents=True)
    for folder, settings, fragment in (
        (tmp_path / "other", SHAPES, f"has no {MARKER_NAME} completion marker: no complete generated dataset"),
        (root, {**SHAPES, "num_val": 7}, "was generated with other settings than testset=x names (num_val: 6 on"
                                         " disk vs 7 named)"),
    ):
        datamodule = CocoDataModule(root=str(folder), generator=settings, num_workers=0)
        with pytest.raises(RunDataError) as err:
            require_existing_data(datamodule, "testset=x", "data_root=<folder>")
        assert fragment in _one_line(err)
    datamodule = CocoDataModule(root=str(root), generator=SHAPES, num_workers=0)
    assert require_existing_data(datamodule, "testset=x", "data_root=<folder>") is not None  # its own: read


def test_a_data_root_that_is_no_folder_is_not_called_missing(tmp_path: Path) -> None:
    """``plot_rpe.py --data-root <a FIFO>`` said the FIFO "does not exist"; a file in its place the same."""
    from lifecycle.run_config import RunDataError, require_existing_data

    fifo, file = tmp_path / "fifo", tmp_path / "file"
    os.mkfifo(fifo)
    file.write_text("x")
    for root, kind, generator in ((fifo, "a FIFO (named pipe)", None), (file, "a file", None),
                                  (fifo, "a FIFO (named pipe)", SHAPES)):
        datamodule = (CocoDataModule(root=str(root), generator=generator, num_workers=0) if generator else
                      ImageFolderDataModule(root=str(root), num_workers=0))
        with pytest.raises(RunDataError) as err:
            require_existing_data(datamodule, "--data-root", "--data-root DIR")
        line = _one_line(err)
        assert line.startswith(f"data.root={root} named by --data-root") and "does not exist" not in line, line
        assert f"{root} is not a folder (it is {kind})" in line or f"{root} named by --data-root is not a folder (it" \
            f" is {kind})" in line, line
    with pytest.raises(DataConfigError) as err:  # the data module's own layout check
        ImageFolderDataModule(root=str(fifo), num_workers=0).prepare_data()
    assert _one_line(err).startswith(f"data.root={fifo} is not a folder (it is a FIFO (named pipe));")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)  # eval.py data_root=<a link to itself> said "does not exist"
    with pytest.raises(RunDataError) as err:
        require_existing_data(ImageFolderDataModule(root=str(loop), num_workers=0), "--data-root", "--data-root DIR")
    assert "is a symlink loop (its links lead back to themselves)" in _one_line(err), _one_line(err)


# ------------------------------------------------------------------------------------ ensure_generated
FAKE = functools.partial(make_fake_imagefolder, num_classes=3, per_class=2, img_size=8)


def test_temp_dirs_of_killed_runs_are_removed_and_only_those(tmp_path: Path) -> None:
    root = tmp_path / "rel"
    stale = [new_temp_dir(root), new_temp_dir(root), tmp_path / ".rel.tmp-deadbeef"]
    stale[2].mkdir()
    (stale[0] / "train").mkdir()
    keep = [tmp_path / ".rel.tmp-12-notahex!", tmp_path / ".other.tmp-12-deadbeef", tmp_path / "rel.tmp-1-deadbeef"]
    for path in keep:
        path.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.symlink(target, tmp_path / ".rel.tmp-7-0123abcd")  # a link is never followed nor removed
    assert ensure_generated(root, FAKE)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([lock_path(root).name, "rel", "elsewhere", ".rel.tmp-7-0123abcd", *(p.name for p in keep)])

    leftover = new_temp_dir(root)  # a killed loser of a race: the root is complete, the fast path cleans too
    assert not ensure_generated(root, FAKE) and not leftover.exists()


def test_a_root_name_near_the_file_systems_limit_is_generated(tmp_path: Path) -> None:
    """Probe 5 cases 151, 153: the lock and temp dir beside data.root were named ``.<root name>.lock`` and
    ``.<root name>.tmp-<pid>-<hex>``, 22 bytes longer than a valid root name of up to 255 bytes ("File name too
    long"). They are named by a short hash of it."""
    root = tmp_path / ("d" * 250)
    assert ensure_generated(root, FAKE)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([lock_path(root).name, root.name])
    assert len(lock_path(root).name) < 30 and (root / MARKER_NAME).is_file()
    assert lock_path(root) != lock_path(tmp_path / ("d" * 249))  # one lock per root


def test_temp_dir_of_a_running_generation_is_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "rel"
    ensure_generated(root, FAKE)
    with generation_lock(root) as held:  # another process generating: it holds the lock
        assert held
        in_use = new_temp_dir(root)
        assert sweep_stale_temp_dirs(root) == [] and in_use.is_dir()
        assert not ensure_generated(root, FAKE)  # the fast path neither waits nor removes it
        assert in_use.is_dir()
    assert sweep_stale_temp_dirs(root) == [in_use] and not in_use.exists()


def test_a_full_disk_during_generation_names_the_root_and_keeps_nothing(tmp_path: Path) -> None:
    """PIL's writer reports ENOSPC without a file name; the error names the data root and its temp dir."""
    import errno

    def full_disk(root: str) -> None:
        FAKE(root)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    root = tmp_path / "rel"
    with pytest.raises(DataConfigError) as err:
        ensure_generated(root, full_disk)
    message = _one_line(err)
    stem = lock_path(root).name.removesuffix(".lock")
    assert f"generating data.root={root} failed while writing into {tmp_path}/{stem}.tmp-" in message
    assert "No space left on device; nothing was kept" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == [lock_path(root).name]


def test_a_limited_evaluation_sees_every_class_in_a_fixed_order(tmp_path: Path) -> None:
    """The val folders are sorted by class; a limited evaluation (its first batches) must not read the
    first classes only, and two runs (two seeds) read the same images."""
    make_fake_imagefolder(tmp_path / "fake", num_classes=8, per_class=8, img_size=8)
    orders = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        datamodule = ImageFolderDataModule(root=str(tmp_path / "fake"), img_size=8, batch_size=8, num_workers=0)
        datamodule.setup("validate")
        batches = list(datamodule.val_dataloader())
        orders.append(torch.cat([labels for _, labels in batches]))
    first = orders[0][:8]
    assert len(set(first.tolist())) >= 4, first  # file order would give class 0 eight times
    assert torch.equal(orders[0], orders[1])
    assert sorted(orders[0].tolist()) == sorted(datamodule.val_set.targets)  # a full pass: every image once


@pytest.mark.parametrize(
    ("content", "problem"),
    [(b'{"generator": {"target": "x", "kw', "not valid JSON"), (b"\xff\xfe\x00", "unreadable"),
     (b"[1, 2]", "it holds a JSON list, not an object"), (b'"done"', "JSON str"),
     (b'{"content": {}}', "no 'generator' object"),
     (b'{"generator": {"target": "x", "kwargs": {}}, "content": {"train": {"a": -1}}}', "'content' is not"),
     (b'{"generator": {"target": "x", "kwargs": {}}, "content_sha256": "abc"}', "'content_sha256' is not a sha256")],
    ids=["truncated", "binary", "list", "string", "no_generator", "bad_content", "bad_digest"],
)
def test_damaged_marker_names_the_file_and_what_to_do(tmp_path: Path, content: bytes, problem: str) -> None:
    root = tmp_path / "rel"
    ensure_generated(root, FAKE)
    (root / MARKER_NAME).write_bytes(content)
    dm = ImageFolderDataModule(root=str(root), img_size=8, batch_size=2, num_workers=0, generator=FAKE)
    with pytest.raises(DataConfigError) as err:
        dm.prepare_data()
    message = _one_line(err)
    assert f"the completion marker {root / MARKER_NAME} is damaged" in message and problem in message
    assert message.endswith(f"delete {root} to regenerate it")


def test_marker_records_class_folders_image_counts_and_a_digest_of_the_images(tmp_path: Path) -> None:
    ensure_generated(tmp_path / "rel", FAKE)
    marker = json.loads((tmp_path / "rel" / MARKER_NAME).read_text())
    per_class = {"class_000": 2, "class_001": 2, "class_002": 2}
    assert marker["content"] == {"train": per_class, "val": per_class}
    # the digest, by hand: sha256 over each image's relative path and the sha256 of its bytes, sorted
    by_hand = hashlib.sha256()
    for path in sorted((tmp_path / "rel").rglob("*.png"), key=lambda p: p.relative_to(tmp_path / "rel").parts):
        by_hand.update(f"{path.relative_to(tmp_path / 'rel')}\0".encode() + hashlib.sha256(path.read_bytes()).digest())
    assert marker[DIGEST_KEY] == by_hand.hexdigest()


@pytest.mark.parametrize(
    ("edit", "difference"),
    [
        (lambda root: __import__("shutil").rmtree(root / "train" / "class_001"), "train/class_001/ is missing"),
        (lambda root: (root / "val" / "class_002" / "0000.png").unlink(),
         "val/class_002/ has 1 images, 2 when generated"),
        (lambda root: Image.new("RGB", (8, 8)).save(root / "train" / "class_000" / "extra.png"),
         "train/class_000/ has 3 images, 2 when generated"),
        (lambda root: (root / "train" / "class_009").mkdir(), "train/class_009/ was not generated"),
        (lambda root: __import__("shutil").rmtree(root / "val"), "val/ is missing"),
    ],
    ids=["class_deleted", "image_deleted", "image_added", "class_added", "split_deleted"],
)
def test_generated_data_changed_by_hand_is_refused(tmp_path: Path, edit, difference: str) -> None:
    root = tmp_path / "rel"
    ensure_generated(root, FAKE)
    edit(root)
    dm = ImageFolderDataModule(root=str(root), img_size=8, batch_size=2, num_workers=0, generator=FAKE, num_classes=3)
    for check in (dm.check_on_disk, dm.prepare_data):  # before the run dir (probe 14, l123), and in the job
        with pytest.raises(DataConfigError) as err:
            check(1) if check == dm.check_on_disk else check()
        message = _one_line(err)
        assert message.startswith(f"data.root={root} no longer holds what was generated (")
        assert difference in message and message.endswith(f"delete {root} to regenerate it")


def _swap(root: Path) -> None:
    """Two images trade class folders: the counts stay, two labels are wrong."""
    a, b = root / "train" / "class_000" / "0000.png", root / "train" / "class_001" / "0000.png"
    a.rename(a.with_name("swapped.png"))
    b.rename(a)
    a.with_name("swapped.png").rename(b)


def _replace(root: Path) -> None:
    """An image's bytes replaced by another image of the same name, size and count."""
    path = root / "val" / "class_002" / "0001.png"
    Image.new("RGB", (8, 8), (1, 2, 3)).save(path)


def _edit(root: Path) -> None:
    """One byte of an image changed (a pixel of a valid PNG would do the same)."""
    path = root / "train" / "class_002" / "0000.png"
    data = bytearray(path.read_bytes())
    data[-20] ^= 1
    path.write_bytes(bytes(data))


IMAGE_CHANGES = {"swapped_between_classes": _swap, "bytes_replaced": _replace, "one_byte_edited": _edit}


@pytest.mark.parametrize("change", IMAGE_CHANGES)
def test_images_moved_replaced_or_edited_after_generation_are_refused(tmp_path: Path, change: str) -> None:
    """The counts stay what the marker says; the digest of the images does not: training (``prepare_data``)
    and evaluation (`require_existing_data`) refuse the root in one line naming it and how to regenerate."""
    from lifecycle.run_config import RunDataError, detach_generator, require_existing_data

    root = tmp_path / "rel"
    ensure_generated(root, FAKE)
    marker = (root / MARKER_NAME).read_bytes()
    IMAGE_CHANGES[change](root)
    dm = ImageFolderDataModule(root=str(root), img_size=8, batch_size=2, num_workers=0, generator=FAKE, num_classes=3)
    with pytest.raises(DataConfigError) as err:
        dm.check_on_disk(1)  # before the run dir, as prepare_data below
    assert "its images differ from the content digest" in _one_line(err)
    with pytest.raises(DataConfigError) as err:
        dm.prepare_data()
    assert _one_line(err) == (f"data.root={root} no longer holds what was generated (its images differ from the"
                              f" content digest its {MARKER_NAME} recorded: an image was moved to another class"
                              f" folder, replaced or edited, or an annotation file edited); delete {root} to"
                              " regenerate it")
    dm = detach_generator(ImageFolderDataModule(root=str(root), img_size=8, batch_size=2, num_workers=0,
                                                generator=FAKE, num_classes=3))
    with pytest.raises(RunDataError) as err:
        require_existing_data(dm, "the run's config.yaml", "data_root=<folder>")
    assert _one_line(err).startswith(f"data.root={root} no longer holds what was generated (its images differ")
    assert f"delete {root} to regenerate it; eval.py and plot_rpe.py read existing data only" in str(err.value)
    assert (root / MARKER_NAME).read_bytes() == marker  # refused, never re-recorded


def _relabel(root: Path) -> None:
    """Every annotation of the val split made a square (category 1): the images are untouched."""
    ann_file = root / "annotations" / "instances_val2017.json"
    dataset = json.loads(ann_file.read_text())
    for annotation in dataset["annotations"]:
        annotation["category_id"] = 1
    ann_file.write_text(json.dumps(dataset))


def _swap_coco_images(root: Path) -> None:
    """Two val images of the same size trade bytes: the annotations now describe the wrong pictures."""
    a, b = sorted((root / "val2017").glob("*.png"))[:2]
    data = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data)


@pytest.mark.parametrize("change", [_relabel, _swap_coco_images], ids=["relabelled", "images_swapped"])
def test_generated_coco_data_edited_after_generation_is_refused(tmp_path: Path, change) -> None:
    """Probe 11, F107: the digest of a COCO tree (no class folders) covered no file, so relabelled annotations
    were measured and filed under the test set's name. Its images and annotation files are digested now."""
    from data.coco import shapes_generator
    from data.generation import check_content, read_marker, scan_content

    root = tmp_path / "coco"
    generator = shapes_generator(num_train=2, num_val=3, image_size=(32, 32), object_size=(8, 12), max_objects=2)
    ensure_generated(root, generator)
    marker = read_marker(root)
    assert marker[DIGEST_KEY] != hashlib.sha256().hexdigest()  # not the digest of nothing
    assert check_content(root, marker, generator) == marker[DIGEST_KEY]
    change(root)
    assert scan_content(root, marker["content"])[1] != marker[DIGEST_KEY]
    with pytest.raises(DataConfigError, match="no longer holds what was generated"):
        check_content(root, marker, generator)
    settings = dict(num_train=2, num_val=3, image_size=(32, 32), object_size=(8, 12), max_objects=2)
    with pytest.raises(DataConfigError, match="no longer holds what was generated"):  # before the run dir
        CocoDataModule(root=str(root), generator=settings).check_on_disk(None)


def test_an_older_coco_marker_whose_digest_covered_no_file_is_checked_by_regenerating(tmp_path: Path) -> None:
    """A COCO tree an older version generated holds the digest of no file: it is checked against a fresh
    generation once (untouched: accepted, and the real digest recorded; edited: refused), never called changed."""
    from data.coco import shapes_generator
    from data.generation import check_content, read_marker, seal

    generator = shapes_generator(num_train=2, num_val=3, image_size=(32, 32), object_size=(8, 12), max_objects=2)
    for edited in (False, True):
        root = tmp_path / f"coco_{edited}"
        ensure_generated(root, generator)
        marker = read_marker(root)
        real = marker[DIGEST_KEY]
        old = {**marker, DIGEST_KEY: hashlib.sha256().hexdigest()}
        old["generated_sha256"] = seal(old)
        (root / MARKER_NAME).write_text(json.dumps(old))
        if edited:
            _relabel(root)
            with pytest.raises(DataConfigError, match="differ from a fresh generation"):
                check_content(root, read_marker(root), generator)
        else:
            assert check_content(root, read_marker(root), generator) == real
            assert read_marker(root)[DIGEST_KEY] == real


def test_a_fifo_in_generated_data_is_refused_by_the_digest_check_not_read(tmp_path: Path) -> None:
    """The digest reads every image: a FIFO put in place of a generated image would block a plain open()
    forever; the check names it in one line instead (an alarm fails the test rather than hang it)."""
    import signal

    root = tmp_path / "rel"
    ensure_generated(root, FAKE)
    image = root / "train" / "class_001" / "0000.png"
    image.unlink()
    os.mkfifo(image)
    dm = ImageFolderDataModule(root=str(root), img_size=8, batch_size=2, num_workers=0, generator=FAKE, num_classes=3)
    signal.alarm(20)
    try:
        with pytest.raises(DataConfigError) as err:
            dm.prepare_data()
    finally:
        signal.alarm(0)
    assert _one_line(err) == (f"data.root={root} cannot be checked against its {MARKER_NAME}: cannot read {image}"
                              f" (not a regular file: a FIFO, socket or device); make it readable, or delete {root}"
                              " to regenerate it")


def test_unrelated_files_are_accepted(tmp_path: Path) -> None:
    root = tmp_path / "rel"
    ensure_generated(root, FAKE)
    (root / "train" / "class_000" / ".DS_Store").write_bytes(b"")  # not an image: ImageFolder skips it too
    (root / "README").write_text("notes\n")  # not in a split
    assert not ensure_generated(root, FAKE)


def _old_marker(root: Path, *keys: str) -> dict:
    """The marker of ``root`` as an older version wrote it: without ``keys``."""
    marker = json.loads((root / MARKER_NAME).read_text())
    for key in keys:
        del marker[key]
    (root / MARKER_NAME).write_text(json.dumps(marker))
    return marker


@pytest.mark.parametrize("keys", [(DIGEST_KEY,), (DIGEST_KEY, "content")], ids=["no_digest", "no_content"])
def test_an_old_marker_is_checked_against_a_fresh_generation(tmp_path: Path, keys: tuple[str, ...],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A marker without a digest says nothing of the images' bytes: the data is checked once against a fresh
    generation (deterministic), which then records the digest (training; an evaluation only reads), or
    refused when it differs (here: images swapped before the marker recorded any digest)."""
    from lifecycle.run_config import detach_generator, require_existing_data

    root = tmp_path / "rel"
    ensure_generated(root, FAKE)
    whole = json.loads((root / MARKER_NAME).read_text())
    old = _old_marker(root, *keys)
    dm = detach_generator(ImageFolderDataModule(root=str(root), img_size=8, batch_size=2, num_workers=0,
                                                generator=FAKE, num_classes=3))
    assert require_existing_data(dm, "the run's config.yaml", "data_root=<folder>") == whole[DIGEST_KEY]
    assert json.loads((root / MARKER_NAME).read_text()) == old  # eval.py reads only: the marker is unchanged
    assert "matches a fresh generation" in caplog.text
    caplog.clear()
    assert require_existing_data(dm, "the run's config.yaml", "data_root=<folder>") == whole[DIGEST_KEY]
    assert "matches a fresh generation" not in caplog.text  # the same bytes: not regenerated again here
    (root / MARKER_NAME).chmod(0o640)
    assert not ensure_generated(root, FAKE)
    assert json.loads((root / MARKER_NAME).read_text()) == whole  # training records it, once
    assert ((root / MARKER_NAME).stat().st_mode & 0o777, sorted(p.name for p in root.iterdir())) == (
        0o640, [MARKER_NAME, "train", "val"])  # its mode kept, no temp file left

    other = tmp_path / "other"
    ensure_generated(other, FAKE)
    _swap(other)
    _old_marker(other, *keys)
    with pytest.raises(DataConfigError) as err:
        ensure_generated(other, FAKE)
    assert _one_line(err) == (
        f"data.root={other} does not hold what its {MARKER_NAME} says was generated (the marker is not sealed as"
        " this version seals it, and its images differ from a fresh generation with the settings it states: its"
        " settings were edited, or an image was moved to another class folder, replaced or edited); delete"
        f" {other} to regenerate it")
    assert DIGEST_KEY not in json.loads((other / MARKER_NAME).read_text())


def test_a_marker_whose_settings_were_edited_is_refused(tmp_path: Path) -> None:
    """One test set's images copied under another's name, the marker's settings replaced by the other's and its
    digest kept, were evaluated as the other test set without a word: the seal no longer matches, and a fresh
    generation with the stated settings makes other images."""
    from data.generation import SEAL_KEY, describe_generator

    other_settings = functools.partial(make_fake_imagefolder, num_classes=3, per_class=2, img_size=8, seed=7)
    root = tmp_path / "left_as_right"
    ensure_generated(root, FAKE)
    marker = json.loads((root / MARKER_NAME).read_text())
    assert SEAL_KEY in marker
    marker["generator"] = describe_generator(other_settings)  # the digest and the seal kept as they were
    (root / MARKER_NAME).write_text(json.dumps(marker))
    with pytest.raises(DataConfigError) as err:
        ensure_generated(root, other_settings)
    assert "its settings were edited" in _one_line(err), _one_line(err)
    fresh = tmp_path / "right"
    ensure_generated(fresh, other_settings)  # the stated settings' own images: accepted, and sealed
    assert not ensure_generated(fresh, other_settings)


# ------------------------------------------------------------------------------------ ImageFolder
def _fake(root: Path) -> Path:
    return make_fake_imagefolder(root, num_classes=2, per_class=4, img_size=8)


def _dm(root: Path) -> ImageFolderDataModule:
    return ImageFolderDataModule(root=str(root), img_size=8, batch_size=2, num_workers=0, eval_crop_pct=1.0)


@pytest.mark.parametrize(
    ("link", "target"),
    [
        ("train/class_000/again", "."),  # the class folder itself
        ("train/class_000/up", ".."),  # the split folder
        ("train/class_000/sub/root", "../../.."),  # the dataset root, from a subfolder
        ("train/loop", "."),  # a class folder that is the split folder
    ],
)
def test_symlink_loop_is_refused_naming_the_link(tmp_path: Path, link: str, target: str) -> None:
    root = _fake(tmp_path / "fake")
    (root / link).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, root / link)
    assert len(ImageFolder(str(root / "train")).samples) > 8  # what torchvision alone does: repeats images
    with pytest.raises(DataConfigError) as err:
        _dm(root).setup("fit")
    message = _one_line(err)
    assert message.startswith(f"{root / link} is a symlink to ") and "(a loop through" in message


def test_loop_through_a_folder_outside_the_root_is_refused(tmp_path: Path) -> None:
    root = _fake(tmp_path / "fake")
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, root / "train" / "class_001" / "out")
    os.symlink(root / "train" / "class_001", outside / "back")
    with pytest.raises(DataConfigError) as err:
        _dm(root).setup("fit")
    assert _one_line(err).startswith(f"{root / 'train' / 'class_001' / 'out' / 'back'} is a symlink to ")


def test_folder_reached_twice_is_refused(tmp_path: Path) -> None:
    root = _fake(tmp_path / "fake")
    os.symlink("../class_000", root / "train" / "class_001" / "copy")  # class 0's images labelled 1 as well
    with pytest.raises(DataConfigError) as err:
        _dm(root).setup("fit")
    message = _one_line(err)
    assert message.startswith(f"{root / 'train' / 'class_001' / 'copy'} is the same folder as ")
    assert "would count twice" in message


def test_symlinked_files_folders_and_root_still_work(tmp_path: Path) -> None:
    real = _fake(tmp_path / "real")
    elsewhere = tmp_path / "more"
    elsewhere.mkdir()
    Image.new("RGB", (8, 8)).save(elsewhere / "x.png")
    Image.new("RGB", (8, 8)).save(tmp_path / "lone.png")
    os.symlink(tmp_path / "lone.png", real / "train" / "class_001" / "borrowed.png")  # an image of one class only
    os.symlink(elsewhere, real / "train" / "class_000" / "more")
    os.symlink(real, tmp_path / "root_link")
    dm = _dm(tmp_path / "root_link")
    dm.setup("fit")
    assert len(dm.train_set) == 4 + 1 + 4 + 1 and len(dm.val_set) == 8
    assert dm.train_set.samples == ImageFolder(str(tmp_path / "root_link" / "train")).samples  # same order


@pytest.mark.parametrize("kind", ["fifo", "link_to_fifo", "socket", "device"])
def test_an_entry_that_is_no_regular_file_is_refused_at_setup(tmp_path: Path, kind: str, monkeypatch) -> None:
    """A FIFO named like an image blocks the run in open(), where no stop signal ends it: refused when the
    folders are walked, before any image is read; so are sockets and devices, and links to them."""
    import socket

    root = _fake(tmp_path / "fake")
    entry = root / "train" / "class_000" / "x.png"
    if kind == "fifo":
        os.mkfifo(entry)
    elif kind == "link_to_fifo":
        os.mkfifo(tmp_path / "pipe")
        os.symlink(tmp_path / "pipe", entry)
    elif kind == "socket":
        monkeypatch.chdir(entry.parent)  # a socket's path may be only ~100 bytes long: bound by its name
        server = socket.socket(socket.AF_UNIX)
        server.bind(entry.name)
        server.close()
    else:
        os.symlink("/dev/null", entry)  # a device, through a link
    what = {"fifo": "a FIFO (named pipe)", "link_to_fifo": "a FIFO (named pipe)", "socket": "a socket",
            "device": "a device"}[kind]
    through = {"link_to_fifo": f" (a symlink to {tmp_path / 'pipe'})", "device": " (a symlink to /dev/null)"}
    with pytest.raises(DataConfigError) as err:
        _dm(root).setup("fit")
    assert _one_line(err) == (f"{entry}{through.get(kind, '')} is {what}, not a regular file: reading it as an"
                              " image could block the run; remove it from the class folder")


@pytest.mark.parametrize("target", ["class_000/0000.png", "outside.png"])
def test_an_image_in_two_classes_is_refused(tmp_path: Path, target: str) -> None:
    """A symlinked file would make one image a sample of two classes, with two labels. Links within one class
    (a weighting) and links to images outside the split stay allowed."""
    root = _fake(tmp_path / "fake")
    train = root / "train"
    Image.new("RGB", (8, 8)).save(tmp_path / "outside.png")
    os.symlink(tmp_path / "outside.png", train / "class_000" / "outside.png")
    os.symlink(train / "class_000" / "0001.png", train / "class_000" / "again.png")
    _dm(root).setup("fit")
    real = train / target if target != "outside.png" else tmp_path / "outside.png"
    link = train / "class_001" / "borrowed.png"
    os.symlink(real, link)
    with pytest.raises(DataConfigError) as err:
        _dm(root).setup("fit")
    assert _one_line(err) == (f"image {link} (class class_001) is a symlink to {real}, which is also"
                              f" {train / 'class_000' / Path(target).name} (class class_000): one image would be a"
                              " sample of two classes; remove the link")


def test_an_image_hard_linked_into_two_classes_is_refused(tmp_path: Path) -> None:
    """Probe 13, j17: a hard link is one file under two names, and only symlinks were checked: one image trained as
    a sample of two classes. Hard links within one class (a weighting) stay allowed."""
    root = _fake(tmp_path / "fake")
    train = root / "train"
    os.link(train / "class_000" / "0001.png", train / "class_000" / "again.png")
    _dm(root).setup("fit")
    link = train / "class_001" / "borrowed.png"
    os.link(train / "class_000" / "0000.png", link)
    with pytest.raises(DataConfigError) as err:
        _dm(root).setup("fit")
    assert _one_line(err) == (f"image {link} (class class_001) is a hard link to {train / 'class_000' / '0000.png'}"
                              " (class class_000), one file: one image would be a sample of two classes; remove one"
                              " of them")


def test_a_dangling_symlinked_image_is_refused_at_setup(tmp_path: Path) -> None:
    """torchvision lists it as an image; it fails when a batch first draws it (never, if it falls in the
    dropped last batch). A dangling link that is no image (notes.txt) is not a sample, and stays allowed."""
    root = _fake(tmp_path / "fake")
    os.symlink(tmp_path / "gone.txt", root / "train" / "class_001" / "notes.txt")
    _dm(root).setup("fit")
    link = root / "train" / "class_001" / "lost.png"
    os.symlink(tmp_path / "gone.png", link)
    assert str(link) in [p for p, _ in ImageFolder(str(root / "train")).samples]  # torchvision keeps it
    with pytest.raises(DataConfigError) as err:
        _dm(root).setup("fit")
    assert _one_line(err) == (f"image {link} is a symlink to {tmp_path / 'gone.png'}, which does not exist; remove"
                              " the link or restore its target")


def _png_header_only(path: Path, width: int, height: int) -> None:
    """A PNG that claims ``width`` x ``height`` pixels in a few bytes (what a decompression bomb looks like
    to the loader: PIL checks the size before decoding)."""

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"") + chunk(b"IEND", b""))


@pytest.mark.parametrize("pixels", ["error", "warning", "warning_as_error"])
def test_decompression_bomb_names_the_image(tmp_path: Path, pixels: str) -> None:
    root = _fake(tmp_path / "fake")
    bomb = root / "val" / "class_001" / "bomb.png"
    limit = Image.MAX_IMAGE_PIXELS
    # 3x the limit: PIL raises; 1.5x: PIL only warns (up to 2x), and the loader refuses it all the same
    side = math.isqrt(3 * limit) if pixels == "error" else math.isqrt(3 * limit // 2)
    assert (side * side > 2 * limit) == (pixels == "error") and side * side > limit
    _png_header_only(bomb, side, side)
    dm = _dm(root)
    with warnings.catch_warnings():
        warnings.simplefilter("error" if pixels == "warning_as_error" else "ignore", Image.DecompressionBombWarning)
        with pytest.raises(DataConfigError) as err:
            # a small split is decoded at setup (data.memory), a large one when its images are read
            dm.setup("validate")
            [dm.val_set[i] for i in range(len(dm.val_set))]
    message = _one_line(err)
    assert message.startswith(f"image {bomb} is too large to decode safely (") and "downscale or remove it" in message


def test_image_within_the_limit_loads(tmp_path: Path) -> None:
    path = tmp_path / "ok.png"
    Image.new("RGB", (3, 2), (1, 2, 3)).save(path)
    assert load_rgb_image(path).getpixel((2, 1)) == (1, 2, 3)


def test_a_16_bit_image_is_scaled_not_clipped(tmp_path: Path) -> None:
    """PIL's own convert("RGB") turns every 16-bit grey value above 255 into white; the loader scales
    v -> round(v * 255 / 65535), worked here at the ends and the middle of the range."""
    import numpy as np

    path = tmp_path / "g16.png"
    Image.fromarray(np.array([[0, 257, 32768, 65535]], dtype=np.uint16)).save(path)
    assert Image.open(path).mode == "I;16"
    assert [load_rgb_image(path).getpixel((x, 0)) for x in range(4)] == [(0, 0, 0), (1, 1, 1), (128, 128, 128),
                                                                         (255, 255, 255)]
    for array, mode, kind in ((np.zeros((2, 2), np.int32), "I", "32-bit integer"),
                              (np.zeros((2, 2), np.float32), "F", "floating-point")):
        path = tmp_path / f"{mode}.tif"
        Image.fromarray(array).save(path)
        with pytest.raises(DataConfigError) as err:
            load_rgb_image(path)
        assert _one_line(err) == (f"image {path} has {kind} pixels (PIL mode {mode}), whose range of values is not"
                                  " known; valid: 8-bit or 16-bit images (convert it to 8-bit)")


def test_unexpected_decoder_exception_names_the_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PIL plugins also fail with struct.error, EOFError, IndexError...: reported as the file's, not raw."""
    path = tmp_path / "odd.png"
    Image.new("RGB", (3, 2)).save(path)

    def broken_convert(self: Image.Image, *args: object, **kwargs: object) -> Image.Image:
        raise struct.error("unpack requires a buffer of 4 bytes")

    monkeypatch.setattr(Image.Image, "convert", broken_convert)
    with pytest.raises(DataConfigError) as err:
        load_rgb_image(path)
    assert _one_line(err) == f"image {path} cannot be read (error: unpack requires a buffer of 4 bytes)"


@pytest.mark.parametrize("layout", ["empty_root", "empty_splits"])
def test_empty_root_says_what_layout_is_expected(tmp_path: Path, layout: str) -> None:
    root = tmp_path / "data"
    root.mkdir()
    if layout == "empty_splits":
        (root / "train").mkdir()
        (root / "val").mkdir()
    dm = ImageFolderDataModule(root=str(root), img_size=8, batch_size=2, num_workers=0)  # num_classes: null
    with pytest.raises(DataConfigError) as err:
        dm.num_classes  # noqa: B018 - what train.py reads to build the model
    message = _one_line(err)
    expected = "data.num_classes is null and " if layout == "empty_splits" else f"data.root={root} has no train/"
    assert expected in message and "root/train/<class>/*.png and root/val/<class>/*.png" in message
    with pytest.raises(DataConfigError) as err:
        dm.setup("fit")
    message = _one_line(err)
    assert "root/train/<class>/*.png" in message
    if layout == "empty_splits":
        assert f"{root / 'train'} is not a usable ImageFolder split (it has no class folders" in message


def test_num_classes_of_a_generated_root_is_known_after_prepare_data(tmp_path: Path) -> None:
    dm = ImageFolderDataModule(root=str(tmp_path / "gen"), img_size=8, batch_size=2, num_workers=0, generator=FAKE)
    with pytest.raises(DataConfigError, match="is not generated yet .*set data.num_classes"):
        dm.num_classes  # noqa: B018
    dm.prepare_data()
    assert dm.num_classes == 3


# ------------------------------------------------------------------------------------ COCO data
def _write_coco(root: Path, anns: list[dict], images: list[dict] | None = None, split: str = "val") -> Path:
    """50x40 images a.png (id 9) and b.png (id 10), categories 2 and 5; returns the annotation file."""
    (root / f"{split}2017").mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(exist_ok=True)
    for name in ("a.png", "b.png"):
        Image.new("RGB", (50, 40), (100, 100, 100)).save(root / f"{split}2017" / name)
    if images is None:
        images = [{"id": 9, "file_name": "a.png", "width": 50, "height": 40},
                  {"id": 10, "file_name": "b.png", "width": 50, "height": 40}]
    cats = [{"id": 2, "name": "two"}, {"id": 5, "name": "five"}]
    path = root / "annotations" / f"instances_{split}2017.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return path


def _ann(ann_id: int, bbox: list, image: int = 9, category: int = 2, crowd: int = 0) -> dict:
    return {"id": ann_id, "image_id": image, "category_id": category, "bbox": bbox, "area": 1.0, "iscrowd": crowd}


GOOD = [_ann(1, [10, 5, 20, 10]), _ann(2, [1, 1, 5, 5], image=10, category=5)]


def _dataset(root: Path, invalid_boxes: str = "error", split: str = "val") -> CocoDetectionDataset:
    folder, ann = root / f"{split}2017", root / "annotations" / f"instances_{split}2017.json"
    return CocoDetectionDataset(folder, ann, None, invalid_boxes)


def test_duplicate_image_ids_are_refused(tmp_path: Path) -> None:
    images = [{"id": 9, "file_name": "a.png", "width": 50, "height": 40},
              {"id": 9, "file_name": "b.png", "width": 50, "height": 40}]
    ann_file = _write_coco(tmp_path, [_ann(1, [10, 5, 20, 10])], images=images)
    with pytest.raises(DataConfigError) as err:
        _dataset(tmp_path)
    assert _one_line(err).startswith(f"{ann_file}: image id 9 appears 2 times; image ids must be unique")


def test_duplicate_annotation_ids_are_refused(tmp_path: Path) -> None:
    ann_file = _write_coco(tmp_path, [*GOOD, _ann(2, [3, 3, 4, 4])])
    with pytest.raises(DataConfigError) as err:
        _dataset(tmp_path)
    assert _one_line(err).startswith(f"{ann_file}: annotation id 2 appears 2 times")


@pytest.mark.parametrize(("image_id", "ann_image", "expected"), [
    (True, True, "image id True is not an integer; COCO ids are integers"),  # JSON true passes as 1 otherwise
    (9.0, 9.0, "image id 9.0 is not an integer; COCO ids are integers"),
    ("img1", "img1", "is not a COCO annotation file (image id 'img1' is not an integer); expected"),  # pycocotools
])
def test_an_id_that_is_not_an_integer_is_named(tmp_path: Path, image_id: object, ann_image: object,
                                               expected: str) -> None:
    images = [{"id": image_id, "file_name": "a.png", "width": 50, "height": 40},
              {"id": 10, "file_name": "b.png", "width": 50, "height": 40}]
    ann_file = _write_coco(tmp_path, [_ann(1, [10, 5, 20, 10], image=ann_image)], images=images)
    with pytest.raises(DataConfigError) as err:
        _dataset(tmp_path)
    assert _one_line(err).startswith(f"{ann_file}") and expected in _one_line(err)


@pytest.mark.parametrize(("dataset", "problem"), [
    # probe 12, H64: a hand-edited file's section of the wrong type was a bare TypeError from pycocotools
    ({"images": "x", "annotations": [], "categories": []}, "images is a string, expected a list of objects"),
    ({"images": [], "annotations": {"id": 1}, "categories": []}, "annotations is an object, expected a list"),
    ({"images": [3], "annotations": [], "categories": []}, "images[0] is a number, expected an object"),
    ({"images": [], "annotations": [], "categories": [None]}, "categories[0] is null, expected an object"),
    # probe 13, j117: an object where the list belongs passes pycocotools, which iterates it as an empty list
    ({"images": [], "annotations": [], "categories": {}}, "categories is an object, expected a list of objects"),
])
def test_a_section_of_the_wrong_json_type_is_named(tmp_path: Path, dataset: dict, problem: str) -> None:
    ann_file = tmp_path / "annotations" / "instances_val2017.json"
    ann_file.parent.mkdir()
    ann_file.write_text(json.dumps(dataset))
    (tmp_path / "val2017").mkdir()
    with pytest.raises(DataConfigError) as err:
        _dataset(tmp_path)
    assert _one_line(err).startswith(f"{ann_file} is not a COCO annotation file ({problem}"), _one_line(err)
    assert "Error" not in _one_line(err)  # no exception class: the file's own words


def test_annotation_of_a_missing_image_is_refused(tmp_path: Path) -> None:
    ann_file = _write_coco(tmp_path, [*GOOD, _ann(3, [1, 1, 4, 4], image=77)])
    with pytest.raises(DataConfigError) as err:
        _dataset(tmp_path, invalid_boxes="drop")  # not a box problem: never dropped
    assert _one_line(err).startswith(
        f"{ann_file}: annotation id 3 (image 77) refers to image id 77, which is not in the file's images"
    )


@pytest.mark.parametrize(
    ("record", "fragment"),
    [({"image": {"id": 9, "file_name": "a.png"}}, "image id 9 (a.png) has width None and height None"),
     ({"ann": {"iscrowd": 2}}, "annotation id 1 (image 9) has iscrowd 2; expected 0 or 1"),
     ({"ann": {"area": None}}, "annotation id 1 (image 9) has area None; expected a number >= 0")],
)
def test_records_evaluation_needs_are_checked_at_load(tmp_path: Path, record: dict, fragment: str) -> None:
    images = [record.get("image", {"id": 9, "file_name": "a.png", "width": 50, "height": 40})]
    ann = {**_ann(1, [10, 5, 20, 10]), **record.get("ann", {})}
    ann_file = _write_coco(tmp_path, [ann], images=images)
    with pytest.raises(DataConfigError) as err:
        _dataset(tmp_path)
    assert _one_line(err).startswith(f"{ann_file}: {fragment}")


def _coco_dm(root: Path, **kwargs) -> CocoDataModule:
    return CocoDataModule(root=str(root), batch_size=1, num_workers=0, train_scales=[40], max_size=64,
                          crop_scales=None, val_size=40, **kwargs)


@pytest.mark.parametrize(
    ("val_anns", "policy", "fragment"),
    [([], "error", "none of its 0 annotations is a non-crowd box (iscrowd 0)"),
     ([_ann(1, [10, 5, 20, 10], crowd=1)], "error", "none of its 1 annotations is a non-crowd box"),
     ([_ann(1, [10, 5, 0, 10])], "drop", ", 1 dropped by data.invalid_boxes=drop")],
    ids=["no_annotations", "only_crowd", "all_dropped"],
)
def test_val_split_without_ground_truth_is_refused(tmp_path: Path, val_anns: list, policy: str, fragment: str) -> None:
    _write_coco(tmp_path, GOOD, split="train")
    ann_file = _write_coco(tmp_path, val_anns, split="val")
    with pytest.raises(CocoLayoutError) as err:
        _coco_dm(tmp_path, invalid_boxes=policy).setup("fit")
    message = _one_line(err)
    assert message.startswith(f"{ann_file} has no ground truth: ") and fragment in message
    assert message.endswith("the val split needs some, else AP would be undefined")


def test_evaluator_never_reports_zero_ap_without_ground_truth(tmp_path: Path) -> None:
    detection = [{"image_id": 9, "category_id": 2, "bbox": [10.0, 5.0, 20.0, 10.0], "score": 0.9}]
    for anns in ([], [_ann(1, [10, 5, 20, 10], crowd=1)]):
        gt = load_coco(str(_write_coco(tmp_path / f"gt{len(anns)}", anns)))
        for results in ([], detection):
            stats = evaluate_coco(gt, results)
            assert set(stats) == set(METRIC_NAMES) and all(math.isnan(v) for v in stats.values()), stats
    gt = load_coco(str(_write_coco(tmp_path / "gt", GOOD)))
    assert evaluate_coco(gt, [], image_ids=[9])["AP"] == 0.0  # ground truth, no detections: 0 is right
    assert math.isnan(evaluate_coco(gt, detection, image_ids=[77])["AP"])  # no image with ground truth


@pytest.mark.parametrize(("bbox", "outside"), [([40, 30, 20, 20], "10"), ([-3, 5, 10, 10], "3"),
                                               ([10, 5, 20, 36.5], "1.5")])
def test_box_reaching_far_outside_is_refused_naming_annotation_and_image(
    tmp_path: Path, bbox: list, outside: str
) -> None:
    """Tolerance: 1 px for 50x40 images (1% of a side is less than 1 px)."""
    ann_file = _write_coco(tmp_path, [*GOOD, _ann(7, bbox, image=10)])
    with pytest.raises(DataConfigError) as err:
        _dataset(tmp_path)
    message = _one_line(err)
    assert message.startswith(f"{ann_file}: annotation id 7 (image 10) has bbox {bbox!r}: reaches {outside} px ")
    assert "outside its 50x40 image (more than the tolerance of 1 px across, 1 px down)" in message


def test_dropped_far_outside_boxes_leave_training_and_evaluation_alike(tmp_path: Path) -> None:
    for split in ("train", "val"):
        _write_coco(tmp_path, [*GOOD, _ann(7, [40, 30, 20, 20], image=10)], split=split)
    dm = _coco_dm(tmp_path, invalid_boxes="drop")
    dm.setup("fit")
    for dataset in (dm.train_set, dm.val_set):
        assert dataset.dropped_boxes == 1 and sorted(dataset.coco.getAnnIds()) == [1, 2]
        assert len(dataset[1][1]["boxes"]) == 1  # image 10 keeps annotation 2 only


def test_box_within_the_tolerance_is_clipped_for_training_and_evaluation(tmp_path: Path) -> None:
    """[40.5, 30.25, 10.25, 10.5] reaches 0.75 px right and 0.75 px down of the 50x40 image: clipped to
    [40.5, 30.25, 9.5, 9.75] in the ground truth and in the training target, so a detection of exactly that
    (clipped) box is perfect (AP 100), not an IoU of 92.625 / 107.625 = 0.86 with the raw box."""
    _write_coco(tmp_path, [_ann(1, [40.5, 30.25, 10.25, 10.5])])
    ds = _dataset(tmp_path)
    assert ds.coco.anns[1]["bbox"] == [40.5, 30.25, 9.5, 9.75]
    target = ds[0][1]
    pixels = (target["boxes"][0] * torch.tensor([50.0, 40.0, 50.0, 40.0])).tolist()  # cx, cy, w, h
    np.testing.assert_allclose(pixels, [45.25, 35.125, 9.5, 9.75], rtol=0, atol=1e-5)
    detection = [{"image_id": 9, "category_id": 2, "bbox": [40.5, 30.25, 9.5, 9.75], "score": 0.9}]
    assert evaluate_coco(ds.coco, detection)["AP"] == pytest.approx(100.0)


def test_image_whose_size_differs_from_the_file_is_refused_at_setup(tmp_path: Path) -> None:
    """Found from the image's header when the dataset is built (before any run dir), not when a batch reaches
    the image; a file replaced after that is still caught when loaded."""
    ann_file = _write_coco(tmp_path, GOOD)
    expected = (f"image {tmp_path / 'val2017' / 'b.png'} is 60x40 pixels but {ann_file} records 50x40 for image"
                " id 10; fix its width and height")
    Image.new("RGB", (60, 40)).save(tmp_path / "val2017" / "b.png")
    with pytest.raises(DataConfigError) as err:
        _dataset(tmp_path)
    assert _one_line(err) == expected
    Image.new("RGB", (50, 40)).save(tmp_path / "val2017" / "b.png")
    ds = _dataset(tmp_path)
    Image.new("RGB", (60, 40)).save(tmp_path / "val2017" / "b.png")
    ds[0]
    with pytest.raises(DataConfigError) as err:
        ds[1]
    assert _one_line(err) == expected


def test_a_root_that_cannot_be_made_names_data_root(tmp_path: Path) -> None:
    """/proc cannot hold a folder (root cannot write there either); a file where the parent belongs."""
    (tmp_path / "afile").write_text("x")
    for root in (Path("/proc/rpe_data"), tmp_path / "afile" / "rel"):
        with pytest.raises(DataConfigError) as err:
            ensure_generated(root, FAKE)
        message = _one_line(err)
        assert message.startswith(f"data.root={root} cannot be generated there") and "valid: a writable" in message
    assert message == (f"data.root={tmp_path / 'afile' / 'rel'} cannot be generated there: {tmp_path / 'afile'} is"
                       " a file, where a folder belongs; valid: a writable folder (paths.data_dir=... or"
                       " data.root=...)")


def test_a_single_class_root_is_refused(tmp_path: Path) -> None:
    root = make_fake_imagefolder(tmp_path / "one", num_classes=1, per_class=2, img_size=8)
    with pytest.raises(DataConfigError) as err:
        ImageFolderDataModule(root=str(root), img_size=8, batch_size=2, num_workers=0).setup("fit")
    assert _one_line(err).endswith("has 1 class folder: a classification task needs at least 2 (one folder per"
                                   " class under each split)")


def test_a_refused_generation_leaves_no_folders_behind(tmp_path: Path) -> None:
    """Settings the generator refuses (checked when it runs) on a fresh data dir: the folders made for it
    and the lock file are removed again; an existing folder keeps its shared lock file."""
    from data.errors import DataConfigError
    from data.generation import ensure_generated

    def refuse(root: str) -> None:
        raise DataConfigError("data.generator.min_object_size=20 is too large")

    with pytest.raises(DataConfigError, match="too large"):
        ensure_generated(tmp_path / "fresh" / "data" / "relational", refuse)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()
    with pytest.raises(DataConfigError, match="too large"):
        ensure_generated(tmp_path / "kept" / "relational", refuse)
    assert [p.name for p in (tmp_path / "kept").iterdir()] == [lock_path(tmp_path / "kept" / "relational").name]


def test_a_file_for_the_data_folder_or_a_folder_for_its_marker_is_named(tmp_path: Path) -> None:
    from data.errors import DataConfigError
    from data.generation import MARKER_NAME, ensure_generated

    (tmp_path / "relational").write_text("not a folder")
    with pytest.raises(DataConfigError, match=f"^data.root={tmp_path / 'relational'} is not a folder"
                                              r" \(it is a file\), where the generated"):
        ensure_generated(tmp_path / "relational", FAKE)
    (tmp_path / "other" / MARKER_NAME).mkdir(parents=True)
    with pytest.raises(DataConfigError, match=f"^the completion marker {tmp_path / 'other' / MARKER_NAME} is not a"
                                              " file"):
        ensure_generated(tmp_path / "other", FAKE)


def test_more_boxes_in_an_image_than_queries_is_warned(tmp_path: Path) -> None:
    """DETR matches each box to one query: with 3 boxes on image 9 and 2 queries one box is never predicted."""
    from models.detr.module import more_boxes_than_queries

    ann_file = _write_coco(tmp_path, [_ann(1, [1, 1, 5, 5]), _ann(2, [10, 5, 20, 10]), _ann(3, [2, 2, 4, 4]),
                                      _ann(4, [3, 3, 4, 4], crowd=1), _ann(5, [1, 1, 5, 5], image=10)])
    dataset = _dataset(tmp_path)
    assert more_boxes_than_queries(dataset, 3) == ""  # the crowd box is no ground truth for the matching
    assert more_boxes_than_queries(dataset, 2) == (
        f"1 image(s) of {ann_file} have more ground-truth boxes than model.num_queries=2 (image id 9: 3): the boxes"
        " beyond 2 are never matched; raise model.num_queries")


def test_a_string_category_and_a_shared_file_name_are_named(tmp_path: Path) -> None:
    ann_file = _write_coco(tmp_path, [{**_ann(1, [10, 5, 20, 10]), "category_id": "2"}])
    with pytest.raises(DataConfigError) as err:
        _dataset(tmp_path)
    assert _one_line(err) == (f"{ann_file}: annotation id 1 (image 9) has category_id '2', which is not an integer;"
                              " COCO ids are integers")
    images = [{"id": 9, "file_name": "a.png", "width": 50, "height": 40},
              {"id": 10, "file_name": "a.png", "width": 50, "height": 40}]  # same size: no other check sees it
    ann_file = _write_coco(tmp_path, GOOD, images=images)
    with pytest.raises(DataConfigError) as err:
        _dataset(tmp_path)
    assert _one_line(err) == (f"{ann_file}: image ids 9 and 10 have the same file_name 'a.png'; each image needs its"
                              " own file")


@pytest.mark.parametrize("locked", ["annotations/instances_train2017.json", "annotations"])
def test_unreadable_coco_annotations_are_one_line_before_the_run_dir(
        locked: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 16, p59, p86: a mode-000 annotation file (or annotations/ folder) of hand COCO data was named only
    after the run dir had been made (a failed run left behind), and the folder's remedy asked for write access."""
    from tests.helpers import file_modes_hold
    from tests.test_cli_input import _refused_by_the_command_line

    root = tmp_path / "coco"
    _write_coco(root, GOOD, split="val")
    _write_coco(root, GOOD, split="train")
    for name in ("a.png", "b.png"):  # training images of their own (a val image may not be a training image)
        Image.new("RGB", (50, 40), (10, 200, 30)).save(root / "train2017" / name)
    target = root / locked
    target.chmod(0)
    try:
        with file_modes_hold():
            line = _refused_by_the_command_line(["experiment=detr_shapes", "debug=fast", "data.generator=null",
                                                 f"data.root={root}", f"paths.log_dir={tmp_path / 'runs'}",
                                                 "run_name=r"], capsys, monkeypatch)
    finally:
        target.chmod(0o755)
    if locked == "annotations":
        assert line == (f"error: data.root={root}: cannot use {target}: permission denied (a folder this user may"
                        " not look into); valid: a folder this user may read (chmod u+rx), or another"), line
    else:
        assert line == (f"error: data.root={root}: cannot use {target}: permission denied (a file or folder of the"
                        " path this user may not read); valid: make it readable (chmod u+r), or another"
                        " data.root"), line
    assert not (tmp_path / "runs").exists()
