"""Bad data is a one-line error naming the file and the record: COCO JSON that does not parse, boxes with
width or height <= 0 (or the explicit ``invalid_boxes=drop``, which counts and logs), unknown category ids,
unreadable images (COCO and ImageFolder, also from DataLoader worker processes)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
from PIL import Image
from torch.utils.data import DataLoader

from data import DataConfigError, ImageFolderDataModule
from data.coco import CocoDataModule, CocoDetectionDataset, generate_shapes_coco
from tests.helpers import run_cli


def _write_coco(root: Path, anns: list[dict], split: str = "val") -> Path:
    """Two 50x40 images (ids 9, 10), categories 2 and 5, the given annotations; returns the JSON path."""
    (root / f"{split}2017").mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(exist_ok=True)
    for name in ("a.png", "b.png"):
        Image.new("RGB", (50, 40), (100, 100, 100 if split == "val" else 120)).save(root / f"{split}2017" / name)
    images = [{"id": 9, "file_name": "a.png", "width": 50, "height": 40},
              {"id": 10, "file_name": "b.png", "width": 50, "height": 40}]
    cats = [{"id": 2, "name": "two"}, {"id": 5, "name": "five"}]
    path = root / "annotations" / f"instances_{split}2017.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return path


def _ann(ann_id: int, bbox: list, category: int = 2, image: int = 9) -> dict:
    return {"id": ann_id, "image_id": image, "category_id": category, "bbox": bbox, "area": 1.0, "iscrowd": 0}


GOOD = [_ann(1, [10, 5, 20, 10]), _ann(2, [1, 1, 5, 5], category=5, image=10)]


def _dataset(root: Path, **kwargs) -> CocoDetectionDataset:
    return CocoDetectionDataset(root / "val2017", root / "annotations" / "instances_val2017.json", None, **kwargs)


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert isinstance(err.value, DataConfigError) and "\n" not in message, message
    return message


@pytest.mark.parametrize(
    ("bbox", "problem"),
    [([5, 5, -3, 10], "width or height <= 0"), ([5, 5, 10, 0], "width or height <= 0"),
     ([60, 5, 10, 10], "wholly outside its 50x40 image"), ([1, 2, 3], "4 numbers"),
     ([1, 2, float("nan"), 3], "not finite")],
)
def test_invalid_boxes_are_an_error_naming_file_and_annotation(tmp_path: Path, bbox: list, problem: str) -> None:
    ann_file = _write_coco(tmp_path, [*GOOD, _ann(7, bbox, image=10)])
    with pytest.raises(DataConfigError) as err:
        _dataset(tmp_path)
    message = _one_line(err)
    assert f"{ann_file}: annotation id 7 (image 10) has bbox" in message and problem in message
    assert "data.invalid_boxes=drop" in message


def test_invalid_boxes_drop_counts_logs_and_leaves_them_out_of_eval(tmp_path: Path, caplog) -> None:
    bad = [_ann(3, [5, 5, 0, 10]), _ann(4, [5, 5, -1, -1], image=10)]
    _write_coco(tmp_path, [*GOOD, *bad])
    with caplog.at_level(logging.WARNING, logger="data.coco"):
        ds = _dataset(tmp_path, invalid_boxes="drop")
    assert ds.dropped_boxes == 2
    assert "dropped 2 of 4 annotations" in caplog.text and "annotation ids 3, 4" in caplog.text
    assert sorted(ds.coco.getAnnIds()) == [1, 2]  # the ground truth COCOeval reads: same boxes as training
    assert [len(ds[i][1]["boxes"]) for i in range(2)] == [1, 1]

    with pytest.raises(DataConfigError) as err:
        _dataset(tmp_path, invalid_boxes="keep")
    assert "data.invalid_boxes='keep' is not one of: error, drop" in _one_line(err)
    with pytest.raises(DataConfigError):
        CocoDataModule(root=str(tmp_path), invalid_boxes="keep", num_classes=2)


def test_unknown_category_id_names_file_annotation_and_valid_ids(tmp_path: Path) -> None:
    ann_file = _write_coco(tmp_path, [*GOOD, _ann(8, [1, 1, 4, 4], category=99)])
    with pytest.raises(DataConfigError) as err:
        _dataset(tmp_path, invalid_boxes="drop")  # never dropped: a wrong label is not a bad box
    message = _one_line(err)
    assert f"{ann_file}: annotation id 8 (image 9) has category_id 99" in message and "valid ids: 2, 5" in message


@pytest.mark.parametrize(
    ("content", "expected"),
    [("{\"images\": [{\"id\": 1", "is not valid JSON"), ("\xff\xfe", "is not"), ("[1, 2]", "is not a COCO"),
     # probe 11, F16: pycocotools' json.load raised a RecursionError traceback
     ("[" * 200000 + "]" * 200000, "nest deeper than Python's JSON parser reads")],
    ids=["truncated", "binary", "list", "nested"],
)
def test_bad_annotation_json_names_the_file(tmp_path: Path, content: str, expected: str) -> None:
    ann_file = _write_coco(tmp_path, GOOD)
    ann_file.write_bytes(content.encode("latin-1"))
    with pytest.raises(DataConfigError) as err:
        _dataset(tmp_path)
    assert str(ann_file) in _one_line(err) and expected in str(err.value)
    (tmp_path / "train2017").mkdir()
    with pytest.raises(DataConfigError) as err:  # the data module reads the categories when it is built
        CocoDataModule(root=str(tmp_path))
    assert str(ann_file) in _one_line(err)


@pytest.mark.parametrize("where", ["images", "categories"])
def test_an_integer_past_pythons_digit_limit_names_the_file_and_its_place(tmp_path: Path, where: str) -> None:
    """Probe 16, p58: a 5000-digit id in a hand annotation file was Python's own line ("Exceeds the limit (4300
    digits) for integer string conversion ...; use sys.set_int_max_str_digits()"), with no file named. Both
    readers (the dataset, and the data module's category list) name the file, the limit, the line, column and
    key of the number."""
    import sys

    ann_file = _write_coco(tmp_path, GOOD)
    huge = "7" * 5000
    old = '"id": 9,' if where == "images" else '"id": 5,'
    text = ann_file.read_text().replace(old, f'"id": {huge},', 1)
    text = text.replace(", ", ",\n")  # several lines: the column is counted from the number's own line
    ann_file.write_text(text)
    line = text[:text.index(huge)].count("\n") + 1
    column = text.index(huge) - text.rfind("\n", 0, text.index(huge))
    expected = (f"{ann_file} is not a COCO annotation file: it holds an integer of more than"
                f" {sys.get_int_max_str_digits()} digits (line {line} column {column}, 'id'), which no COCO id, count"
                " or coordinate has; expected a JSON object with images, annotations and categories")
    with pytest.raises(DataConfigError) as err:
        _dataset(tmp_path)
    assert _one_line(err) == expected
    (tmp_path / "train2017").mkdir()
    with pytest.raises(DataConfigError) as err:  # the data module reads the categories when it is built
        CocoDataModule(root=str(tmp_path))
    assert _one_line(err) == expected


@pytest.mark.parametrize("how", ["fifo", "sparse", "sparse tail"])
def test_an_annotation_file_that_is_no_json_file_is_named_without_reading_it_whole(tmp_path: Path, how: str) -> None:
    """Probe 11, F17 and F104: a FIFO in place of the annotation file was said to be missing; a sparse 1 GiB file
    of NULs was read and decoded whole (3 GB of memory) before "not valid JSON". Both are one line from what the
    file is, or from its first bytes. Probe 15, n46: a valid file grown by a sparse tail of NULs to 3 GB was a
    MemoryError traceback; its last bytes name it."""
    import signal

    ann_file = _write_coco(tmp_path, GOOD)
    ann_file.unlink()
    if how == "fifo":
        os.mkfifo(ann_file)
        expected = f"{ann_file} is not a plain file (a folder, FIFO, socket or device)"
    elif how == "sparse":
        with ann_file.open("wb") as f:
            f.truncate(2**30)
        expected = f"{ann_file} is not a COCO annotation file: it starts with"
    else:
        ann_file.write_text(json.dumps({"images": [], "annotations": [], "categories": []}))
        with ann_file.open("r+b") as f:
            f.truncate(3 * 2**30)
        expected = f"{ann_file} is not a COCO annotation file: it ends with b'\\x00\\x00"
    (tmp_path / "train2017").mkdir()
    signal.alarm(20)  # a blocking open of the FIFO fails the test rather than hang it
    try:
        with pytest.raises(DataConfigError) as err:
            CocoDataModule(root=str(tmp_path))
    finally:
        signal.alarm(0)
    assert _one_line(err).startswith(expected), _one_line(err)


def _damage(path: Path, how: str) -> None:
    if how == "truncated":
        path.write_bytes(path.read_bytes()[:60])
    elif how == "not_an_image":
        path.write_bytes(b"definitely not a PNG file")
    else:
        path.unlink()


def test_a_coco_image_folder_that_cannot_be_searched_is_named_so(tmp_path: Path) -> None:
    """Probe 18, t69: a mode-000 ``val2017/`` had its images named as missing ("which is not a file")."""
    from tests.helpers import file_modes_hold

    _write_coco(tmp_path, GOOD)
    folder = tmp_path / "val2017"
    folder.chmod(0)
    try:
        with file_modes_hold(), pytest.raises(DataConfigError) as err:
            _dataset(tmp_path)
    finally:
        folder.chmod(0o755)
    assert _one_line(err).endswith(f"names 'a.png', which cannot be reached in {folder} (permission denied); valid:"
                                   f" make the images readable (chmod -R u+rX {folder})"), _one_line(err)
    (folder / "a.png").unlink()
    os.mkfifo(folder / "a.png")
    with pytest.raises(DataConfigError) as err:
        _dataset(tmp_path)
    assert _one_line(err).endswith(f"names 'a.png', which is not a regular file in {folder} (it is a FIFO (named"
                                   " pipe))"), _one_line(err)


@pytest.mark.parametrize("how", ["truncated", "not_an_image", "missing"])
def test_unreadable_coco_image_names_the_file(tmp_path: Path, how: str) -> None:
    _write_coco(tmp_path, GOOD)
    # a noisy image so that cutting the file short leaves PIL with an incomplete stream
    Image.effect_noise((50, 40), 60).convert("RGB").save(tmp_path / "val2017" / "b.png")
    _damage(tmp_path / "val2017" / "b.png", how)
    if how != "truncated":  # found when the data set is built, before any training; a cut stream only on loading
        with pytest.raises(DataConfigError) as err:
            _dataset(tmp_path)
        assert _one_line(err).endswith(f"names 'b.png', which is not a file in {tmp_path / 'val2017'}") \
            if how == "missing" else _one_line(err).startswith(
                f"image {tmp_path / 'val2017' / 'b.png'} cannot be read (UnidentifiedImageError")
        return
    ds = _dataset(tmp_path)
    ds[0]  # the intact image
    with pytest.raises(DataConfigError) as err:
        ds[1]
    assert f"image {tmp_path / 'val2017' / 'b.png'} cannot be read" in _one_line(err)


def test_unreadable_image_in_a_worker_process_keeps_the_one_line(tmp_path: Path) -> None:
    from data.coco import collate_detection

    _write_coco(tmp_path, GOOD)
    Image.effect_noise((50, 40), 60).convert("RGB").save(tmp_path / "val2017" / "b.png")
    _damage(tmp_path / "val2017" / "b.png", "truncated")  # a header that passes setup, pixels that do not load
    loader = DataLoader(_dataset(tmp_path), batch_size=2, num_workers=1, collate_fn=collate_detection)
    with pytest.raises(DataConfigError) as err:
        next(iter(loader))
    assert _one_line(err).startswith(f"image {tmp_path / 'val2017' / 'b.png'} cannot be read")


def test_unreadable_imagefolder_image_names_the_file(tmp_path: Path) -> None:
    from data import make_fake_imagefolder

    make_fake_imagefolder(tmp_path / "fake", num_classes=2, per_class=2, img_size=16, seed=0)
    broken = sorted((tmp_path / "fake" / "val").rglob("*.*"))[0]
    _damage(broken, "truncated")
    dm = ImageFolderDataModule(root=str(tmp_path / "fake"), img_size=16, batch_size=2, num_workers=0)
    with pytest.raises(DataConfigError) as err:
        dm.setup("validate")  # a small split is decoded here (data.memory), a large one when its images are read
        [dm.val_set[i] for i in range(len(dm.val_set))]
    assert f"image {broken} cannot be read" in _one_line(err)


@pytest.mark.slow  # a train.py process; the check is tested in-process above
def test_train_cli_stops_on_a_negative_width_box(tmp_path: Path) -> None:
    """End to end: the COCO run stops before training with one line naming the file and the annotation."""
    root = generate_shapes_coco(tmp_path / "shapes", num_train=8, num_val=4, image_size=[48, 56], object_size=[8, 20])
    ann_file = root / "annotations" / "instances_train2017.json"
    coco = json.loads(ann_file.read_text())
    coco["annotations"][4]["bbox"][2] = -6.0
    ann_file.write_text(json.dumps(coco))
    (root / ".complete.json").unlink()  # data edited by hand is hand data (generated data, edited, is refused whole)
    result = run_cli("train.py", [
        "experiment=detr_shapes", "debug=fast", f"data.root={root}", f"paths.log_dir={tmp_path / 'runs'}",
        "run_name=bad_box", "data.train_scales=[48]", "data.val_size=48", "data.generator=null",
    ], env_extra={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.rstrip("\n").splitlines()[-1] == errors[0]  # the last line, Lightning's notes before it
    assert f"{ann_file}: annotation id 5 (image" in errors[0] and "width or height <= 0" in errors[0]
    assert not (tmp_path / "runs" / "bad_box" / "metrics.json").exists()


def test_hand_coco_data_without_its_train_split_is_refused_before_the_run_dir(tmp_path: Path) -> None:
    """Probe 12, H63: a DETR experiment on data without train2017/ made its run dir and failed at setup. The data
    module's check of data on disk (run before any dir) names the layout."""
    from data.coco import CocoLayoutError

    _write_coco(tmp_path, GOOD)  # val2017/ and its annotations only
    module = CocoDataModule(root=str(tmp_path))
    with pytest.raises(CocoLayoutError) as err:
        module.check_on_disk(None)
    assert _one_line(err).startswith(f"data.root={tmp_path} lacks train2017/ or annotations/instances_train2017.json")
    _write_coco(tmp_path, GOOD[:1], split="train")
    module.check_on_disk(None)  # both splits there


def test_hand_coco_val_annotations_without_a_box_are_refused_before_the_run_dir(tmp_path: Path) -> None:
    """Probe 13, j41: ``"annotations": []`` in the val file was refused at setup, after the run dir was made."""
    from data.coco import CocoLayoutError

    _write_coco(tmp_path, GOOD, split="train")
    ann = _write_coco(tmp_path, [])
    with pytest.raises(CocoLayoutError) as err:
        CocoDataModule(root=str(tmp_path)).check_on_disk(None)
    assert _one_line(err) == (f"{ann} has no ground truth: none of its 0 annotations is a non-crowd box (iscrowd 0);"
                              " the val split needs some, else AP would be undefined")
    _write_coco(tmp_path, GOOD[1:])
    CocoDataModule(root=str(tmp_path)).check_on_disk(None)


@pytest.mark.parametrize("how", ["hard link", "symlink", "copy", "renamed copy"])
def test_hand_coco_val_images_that_are_training_images_are_refused_before_the_run_dir(tmp_path: Path, how: str) -> None:
    """Probe 14, l54: val2017/ of hard links to the training images, under an annotation file re-serialised (other
    bytes, same records), trained and validated on the same images, silently. One such image is refused, whether
    a hard link, a symlink or a copy under its own name; an image of its own passes."""
    from data.coco import CocoLayoutError

    _write_coco(tmp_path, GOOD[:1], split="train")  # annotation files of other bytes
    _write_coco(tmp_path, GOOD)
    val_b = tmp_path / "val2017" / "b.png"
    val_b.unlink()
    if how == "hard link":
        os.link(tmp_path / "train2017" / "b.png", val_b)
    elif how == "symlink":
        val_b.symlink_to(tmp_path / "train2017" / "b.png")
    elif how == "copy":
        shutil.copy(tmp_path / "train2017" / "b.png", val_b)
    else:  # probe 15, n25's COCO twin: the training image's bytes under another name
        shutil.copy(tmp_path / "train2017" / "a.png", val_b)
    with pytest.raises(CocoLayoutError) as err:
        CocoDataModule(root=str(tmp_path)).check_on_disk(None)
    twin = "b.png" if "link" in how else "a.png"  # the fixture's two training images hold the same bytes
    assert _one_line(err) == (f"data.root={tmp_path}: val image val2017/b.png (image id 10) is train2017/{twin} (a"
                              " link or a copy of it): the run would be validated on its training images; valid: a"
                              " val split of images of its own")
    val_b.unlink()
    Image.new("RGB", (50, 40), (7, 7, 7)).save(val_b)
    CocoDataModule(root=str(tmp_path)).check_on_disk(None)


@pytest.mark.parametrize("damage", ["deep info", "width a string", "size mismatch"])
def test_hand_coco_annotation_contents_are_checked_before_the_run_dir(tmp_path: Path, damage: str) -> None:
    """Probe 14, l56, l58: a val annotation file nested 200000 deep inside ``info``, or an image's width given
    as a string, was named by setup, after the run dir was made. The data module's check of data on disk reads
    both files as setup does."""
    _write_coco(tmp_path, GOOD, split="train")
    ann = _write_coco(tmp_path, GOOD)
    record = json.loads(ann.read_text())
    if damage == "deep info":
        ann.write_text(json.dumps(record)[:-1] + ', "info": ' + "[" * 200000 + "]" * 200000 + "}")
        expected = f"{ann} is not a COCO annotation file: its arrays or objects nest deeper"
    elif damage == "width a string":
        record["images"][0]["width"] = "50"
        ann.write_text(json.dumps(record))
        expected = f"{ann}: image id 9 (a.png) has width '50' and height 40; expected its size in pixels"
    else:
        record["images"][0]["width"] = 51
        ann.write_text(json.dumps(record))
        expected = f"image {tmp_path / 'val2017' / 'a.png'} is 50x40 pixels but {ann} records 51x40 for image id 9"
    with pytest.raises(DataConfigError) as err:
        CocoDataModule(root=str(tmp_path)).check_on_disk(None)
    assert _one_line(err).startswith(expected), _one_line(err)


def test_a_coco_annotation_file_that_is_a_link_loop_is_named_as_one(tmp_path: Path) -> None:
    """Probe 13, j98: a symlink loop in the place of the annotation file was reported as a missing file."""
    from data.coco import CocoLayoutError

    _write_coco(tmp_path, GOOD, split="train")
    _write_coco(tmp_path, GOOD[:1])
    ann = tmp_path / "annotations" / "instances_val2017.json"
    ann.unlink()
    ann.symlink_to(ann)
    with pytest.raises(CocoLayoutError) as err:
        CocoDataModule(root=str(tmp_path)).check_on_disk(None)
    assert _one_line(err).startswith(f"{ann} is a symlink that leads nowhere ({ann}: a link loop or a target")
    folder = tmp_path / "annotations"  # probe 15, n144: the folder itself a loop was "lacks annotations/..."
    shutil.rmtree(folder)
    folder.symlink_to(folder)
    with pytest.raises(CocoLayoutError) as err:
        CocoDataModule(root=str(tmp_path)).check_on_disk(None)
    assert _one_line(err).startswith(f"{folder} is a symlink that leads nowhere ({folder}: a link loop or a target")


def test_hand_coco_data_whose_val_split_is_its_train_split_is_refused(tmp_path: Path) -> None:
    """Probe 13, j15: ``val2017`` a symlink to ``train2017`` with a copy of the training annotations trained and
    validated on the same images, and the result was counted. One line before the run dir, as for one folder."""
    import shutil

    from data.coco import CocoLayoutError

    _write_coco(tmp_path, GOOD, split="train")
    shutil.copy(tmp_path / "annotations" / "instances_train2017.json", tmp_path / "annotations" /
                "instances_val2017.json")
    os.symlink(tmp_path / "train2017", tmp_path / "val2017")
    module = CocoDataModule(root=str(tmp_path))
    with pytest.raises(CocoLayoutError) as err:
        module.check_on_disk(None)
    assert _one_line(err) == (f"data.root={tmp_path}: val2017/ and train2017/ are one folder"
                              f" ({tmp_path / 'train2017'}): the run would be validated on its training images;"
                              " valid: a val split of images of its own")
    os.unlink(tmp_path / "val2017")
    shutil.copytree(tmp_path / "train2017", tmp_path / "val2017")  # a copy of the folder: the annotations tell
    with pytest.raises(CocoLayoutError) as err:
        module.check_on_disk(None)
    assert _one_line(err).startswith(f"data.root={tmp_path}: annotations/instances_val2017.json holds the same bytes"
                                     " as annotations/instances_train2017.json")
