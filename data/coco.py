"""COCO-2017-layout detection data: dataset, DETR's transforms, padding collate, DataModule, and a
seeded synthetic "shapes COCO" generator that writes a real COCO JSON plus PNG images.

Layout (real COCO and the synthetic set alike)::

    root/train2017/*.jpg|png   root/val2017/*   root/annotations/instances_{train,val}2017.json

A batch is ``{"images": (B, 3, H, W) float, "mask": (B, H, W) bool (True on padding),
"targets": [ {boxes (T, 4) normalised cxcywh, labels (T,) int64, image_id, orig_size (2,) = (h, w),
size (2,)} ]}``. Labels are contiguous 0..C-1 over the sorted category ids; ``label_to_cat`` maps back.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import filecmp
import functools
import io
import json
import logging
import math
import os
import re
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from PIL import Image, ImageDraw
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import tv_tensors
from torchvision.datasets import CocoDetection
from torchvision.ops import box_convert
from torchvision.transforms import v2

from data.bounded_json import too_many_digits
from data.datamodule import evaluation_order, make_loader, trainer_world
from data.errors import DataConfigError, absent_folder, data_root_path, image_size, load_rgb_image, not_regular
from data.generation import check_generated, ensure_generated, training_twin

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# DETR's multi-scale training: shorter side 480..800 in steps of 32.
DETR_SCALES = tuple(range(480, 801, 32))
log = logging.getLogger(__name__)
LAYOUT = "expected train2017/, val2017/ and annotations/instances_{train,val}2017.json"


def coco_paths(root: str | os.PathLike, split: str) -> tuple[Path, Path]:
    """(image folder, annotation file) of ``split`` (``train`` or ``val``) of the COCO-2017 layout at ``root``."""
    return Path(root, f"{split}2017"), Path(root, "annotations", f"instances_{split}2017.json")


def has_coco_layout(root: str | os.PathLike) -> bool:
    """Whether ``root`` is a COCO-2017 dataset by its layout: a split's image folder beside its annotation file."""
    return any(folder.is_dir() and ann.is_file() for folder, ann in (coco_paths(root, s) for s in ("train", "val")))


_CHECKED_DATA: set[tuple] = set()
"""Hand COCO data this process has checked before a run dir (`CocoDataModule.check_on_disk`), by its files'
identities and the settings that judge them."""


def _file_identity(path: Path) -> tuple:
    """What changes when ``path`` (a file or folder, links followed) is replaced or rewritten."""
    info = path.stat()
    return os.path.realpath(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


class CocoLayoutError(DataConfigError):
    """The COCO root is missing or incomplete; the one-line message names the path and the layout."""


# ---------------------------------------------------------------------------------------- transforms
class RandomSizeCrop(v2.Transform):
    """Crop a random region whose sides are uniform integers in [min_size, min(side, max_size)] (DETR)."""

    def __init__(self, min_size: int, max_size: int) -> None:
        super().__init__()
        self.min_size, self.max_size = min_size, max_size

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        h, w = v2.query_size(flat_inputs)

        def side(full: int) -> int:
            hi = min(full, self.max_size)
            lo = min(self.min_size, hi)  # an image smaller than min_size is kept whole on that axis
            return int(torch.randint(lo, hi + 1, ()).item())

        ch, cw = side(h), side(w)
        top = int(torch.randint(0, h - ch + 1, ()).item())
        left = int(torch.randint(0, w - cw + 1, ()).item())
        return {"top": top, "left": left, "height": ch, "width": cw}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return v2.functional.crop(inpt, **params)


def _finish(mean: Sequence[float], std: Sequence[float]) -> list[v2.Transform]:
    # Clamp + sanitize drop boxes that crops or flips made empty (DETR removes them too).
    return [
        v2.ClampBoundingBoxes(),
        v2.SanitizeBoundingBoxes(min_size=1.0),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(list(mean), list(std)),
    ]


def detr_train_transforms(
    scales: Sequence[int] = DETR_SCALES,
    max_size: int | None = 1333,
    crop_scales: Sequence[int] | None = (400, 500, 600),
    crop_size: Sequence[int] = (384, 600),
    hflip: bool = True,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> v2.Compose:
    """DETR's training augmentation: hflip, then either multi-scale resize (shorter side in ``scales``,
    longer side <= ``max_size``) or, with probability 1/2, resize to ``crop_scales`` -> random-size crop
    in ``crop_size`` -> multi-scale resize. ``crop_scales=None`` drops the crop branch."""
    multi_scale = v2.RandomShortestSize(list(scales), max_size=max_size)
    resize: v2.Transform = multi_scale
    if crop_scales:
        crop = v2.Compose(
            [
                v2.RandomShortestSize(list(crop_scales)),
                RandomSizeCrop(int(crop_size[0]), int(crop_size[1])),
                v2.RandomShortestSize(list(scales), max_size=max_size),
            ]
        )
        resize = v2.RandomChoice([multi_scale, crop])
    flip = [v2.RandomHorizontalFlip()] if hflip else []
    return v2.Compose([v2.ToImage(), *flip, resize, *_finish(mean, std)])


def detr_eval_transforms(
    size: int = 800,
    max_size: int | None = 1333,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> v2.Compose:
    """Resize the shorter side to ``size`` (longer side <= ``max_size``), normalise."""
    return v2.Compose([v2.ToImage(), v2.Resize(size, max_size=max_size), *_finish(mean, std)])


# ---------------------------------------------------------------------------------------- dataset
INVALID_BOX_CHOICES = ("error", "drop")


# How far a box may reach outside its image and still be used (clipped to the image): annotation tools
# and rounding put edges a little outside; more than this is a wrong box (or a wrong image size).
BOX_TOLERANCE_FRACTION, BOX_TOLERANCE_MIN_PX = 0.01, 1.0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_box(bbox: Any, width: float, height: float) -> tuple[str | None, list[float] | None]:
    """The one rule for COCO ``[x, y, w, h]`` boxes of a ``width`` x ``height`` image, for every split.

    Returns ``(problem, None)`` for an unusable box (not 4 finite numbers, width or height <= 0, wholly
    outside the image, or reaching outside it by more than max(1 px, 1% of the image side)), otherwise
    ``(None, box clipped to the image)``: the box used for training and as evaluation ground truth alike.
    """
    # Written out (no generators): this runs for each of COCO's 860k training annotations.
    if not (isinstance(bbox, (list, tuple)) and len(bbox) == 4):
        return "a box must be 4 numbers [x, y, width, height]", None
    x, y, w, h = bbox
    if not (_is_number(x) and _is_number(y) and _is_number(w) and _is_number(h)):
        return "a box must be 4 numbers [x, y, width, height]", None
    x, y, w, h = float(x), float(y), float(w), float(h)
    if not (math.isfinite(x) and math.isfinite(y) and math.isfinite(w) and math.isfinite(h)):
        return "not finite", None
    if w <= 0 or h <= 0:
        return "width or height <= 0", None
    x0, y0, x1, y1 = max(x, 0.0), max(y, 0.0), min(x + w, float(width)), min(y + h, float(height))
    if x1 <= x0 or y1 <= y0:
        return f"wholly outside its {width}x{height} image", None
    tol_x = max(BOX_TOLERANCE_MIN_PX, BOX_TOLERANCE_FRACTION * width)
    tol_y = max(BOX_TOLERANCE_MIN_PX, BOX_TOLERANCE_FRACTION * height)
    out_x, out_y = max(-x, x + w - width, 0.0), max(-y, y + h - height, 0.0)
    if out_x > tol_x or out_y > tol_y:
        return (
            f"reaches {max(out_x, out_y):g} px outside its {width}x{height} image (more than the tolerance of "
            f"{tol_x:g} px across, {tol_y:g} px down)"
        ), None
    return None, [x0, y0, x1 - x0, y1 - y0]


def _too_deep(ann_file: str | Path) -> str:
    """The line for an annotation file whose nesting Python's JSON parser cannot follow (a RecursionError)."""
    return (f"{ann_file} is not a COCO annotation file: its arrays or objects nest deeper than Python's JSON parser"
            " reads (a damaged file); expected a JSON object with images, annotations and categories")


def _not_json(ann_file: str | Path, err: ValueError) -> Exception:
    """The one-line error of an annotation file that the JSON parser refused: text that is no JSON (truncated), or
    an integer of more digits than Python converts, named with its place; any other ``err`` as it is."""
    if isinstance(err, json.JSONDecodeError):
        return DataConfigError(f"{ann_file} is not valid JSON ({err.msg} at line {err.lineno} column {err.colno});"
                               " is the file truncated?")
    problem = too_many_digits(err)
    if not problem:
        return err
    return DataConfigError(f"{ann_file} is not a COCO annotation file: {problem}{_long_integer_at(ann_file)},"
                           " which no COCO id, count or coordinate has; expected a JSON object with images,"
                           " annotations and categories")


def _long_integer_at(ann_file: str | Path) -> str:
    """`` (line 1 column 30, "id")``: where the first number of more digits than Python converts stands in
    ``ann_file``, and the key it is the value of; '' where it is not found (or the file cannot be read again)."""
    digits = sys.get_int_max_str_digits()
    try:
        raw = Path(ann_file).read_bytes()
    except OSError:
        return ""
    found = re.search(rb'(?:"((?:[^"\\]|\\.){0,100})"\s*:|[\[,])\s*-?\d{%d}' % (digits + 1), raw)
    if found is None:
        return ""
    start = found.end() - digits - 1  # the first digit, past the key or the separator
    line = raw.count(b"\n", 0, start) + 1
    column = start - (raw.rfind(b"\n", 0, start) + 1) + 1
    key = f", {found.group(1).decode(errors='replace')!r}" if found.group(1) is not None else ""
    return f" (line {line} column {column}{key})"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true/false are not ids


def _json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words (``"a string"``, ``"null"``)."""
    if isinstance(value, bool):
        return "true or false"
    return {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}.get(
        type(value), "null")


def _section_problem(dataset: dict[str, Any]) -> str:
    """The first section of a COCO file (``images``, ``annotations``, ``categories``) that is not a list of objects,
    named with what it is, or ''. pycocotools iterates an object (``"categories": {}``) as an empty list."""
    for section in ("images", "annotations", "categories"):
        records = dataset.get(section)
        if section in dataset and not isinstance(records, list):
            return f"{section} is {_json_kind(records)}, expected a list of objects"
        bad = next((i for i, record in enumerate(records or []) if not isinstance(record, dict)), None)
        if bad is not None:
            return f"{section}[{bad}] is {_json_kind(records[bad])}, expected an object"
    return ""


def _structure_problem(ann_file: Path) -> str:
    """The first place where ``ann_file`` is not shaped as COCO's format says, e.g. ``"images is a string, expected
    a list of objects"`` or ``"image id None is not an integer"`` (pycocotools, which indexes every section by id,
    fails on these with a bare TypeError or KeyError); '' when none is found."""
    try:
        dataset = json.loads(ann_file.read_text())
    except (OSError, ValueError, RecursionError):
        return ""
    if not isinstance(dataset, dict):
        return f"the file holds {_json_kind(dataset)}, expected an object"
    problem = _section_problem(dataset)
    if problem:
        return problem
    for section, kind, key in (("images", "image", "id"), ("categories", "category", "id"),
                               ("annotations", "annotation", "id"), ("annotations", "annotation image", "image_id"),
                               ("annotations", "annotation category", "category_id")):
        for record in dataset.get(section) or []:
            value = record.get(key)
            if not _is_int(value):
                return f"{kind} id {value!r} is not an integer"
    return ""


class CocoDetectionDataset(CocoDetection):
    """torchvision's CocoDetection returning DETR targets (see the module docstring).

    Crowd annotations are dropped (DETR trains on ``iscrowd == 0`` only; COCOeval still treats the
    crowd regions of the JSON as ignore regions). The file is checked when loaded (`_check_annotations`):
    duplicate or dangling ids are errors, boxes follow `check_box` and are clipped in ``self.coco``, the
    ground truth COCOeval reads, so training and evaluation see the same boxes.
    """

    def __init__(
        self,
        img_folder: str | Path,
        ann_file: str | Path,
        transforms: v2.Transform | None,
        invalid_boxes: str = "error",
    ) -> None:
        if invalid_boxes not in INVALID_BOX_CHOICES:
            raise DataConfigError(
                f"data.invalid_boxes={invalid_boxes!r} is not one of: {', '.join(INVALID_BOX_CHOICES)}"
            )
        self.ann_file = Path(ann_file)
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints while loading
                super().__init__(str(img_folder), str(ann_file))
        except json.JSONDecodeError as err:
            raise _not_json(ann_file, err) from None
        except RecursionError:
            raise DataConfigError(_too_deep(ann_file)) from None
        except MemoryError:
            raise DataConfigError(f"{ann_file} ({Path(ann_file).stat().st_size} bytes) does not fit into this"
                                  " process's memory as parsed JSON; expected a COCO annotation file (COCO's"
                                  " train2017 takes a few GB)") from None
        except (UnicodeDecodeError, KeyError, TypeError, AttributeError, AssertionError) as err:
            problem = _structure_problem(Path(ann_file)) or f"{type(err).__name__}: {err}"
            raise DataConfigError(  # pycocotools asserts that the JSON is an object
                f"{ann_file} is not a COCO annotation file ({problem}); expected a JSON object with lists of objects"
                " named images, annotations and categories"
            ) from None
        except ValueError as err:  # valid JSON holding an integer of more digits than Python converts
            raise _not_json(ann_file, err) from None
        problem = _section_problem(self.coco.dataset)  # what pycocotools let through (an object for a list)
        if problem:
            raise DataConfigError(f"{ann_file} is not a COCO annotation file ({problem}); expected a JSON object with"
                                  " lists of objects named images, annotations and categories")
        self.detr_transforms = transforms
        self.label_to_cat: list[int] = sorted(self.coco.cats.keys())
        self.cat_to_label = {cat: i for i, cat in enumerate(self.label_to_cat)}
        self.dropped_boxes = self._check_annotations(invalid_boxes)

    def _check_annotations(self, invalid_boxes: str) -> int:
        """Check the file against itself and its images, once, for every split alike.

        Errors (one line naming the file and the record): duplicate image, annotation or category ids; an
        image without a positive width and height; an annotation of an image or category the file does not
        list, or without the ``iscrowd`` (0 or 1) and ``area`` COCOeval reads; an unusable box (`check_box`),
        unless ``invalid_boxes="drop"``, which removes such boxes from training and evaluation alike,
        counted and logged. Usable boxes are clipped to their image in place. Returns the number dropped.
        """
        dataset = self.coco.dataset
        images = self._unique(dataset.get("images", []), "image")
        self._unique(dataset.get("categories", []), "category")
        self._unique(dataset.get("annotations", []), "annotation")
        owners: dict[Any, Any] = {}
        for image in images.values():
            self._check_file_name(image)
            first = owners.setdefault(image.get("file_name"), image.get("id"))
            if first != image.get("id"):  # one picture paired with two images' boxes
                raise DataConfigError(f"{self.ann_file}: image ids {first} and {image.get('id')} have the same"
                                      f" file_name {image.get('file_name')!r}; each image needs its own file")
            if not (_is_number(image.get("width")) and _is_number(image.get("height"))
                    and image["width"] > 0 and image["height"] > 0):
                raise DataConfigError(
                    f"{self.ann_file}: image id {image.get('id')} ({image.get('file_name')}) has width "
                    f"{image.get('width')!r} and height {image.get('height')!r}; expected its size in pixels "
                    "(positive numbers), against which its boxes are checked"
                )
        self._check_image_sizes(list(images.values()))
        invalid: list[tuple[dict, str]] = []
        def where(ann: dict) -> str:  # built only for an error: this loop sees every annotation of COCO
            return f"{self.ann_file}: annotation id {ann.get('id')} (image {ann.get('image_id')})"

        for ann in dataset.get("annotations", []):
            image = images.get(ann.get("image_id"))
            if image is None:
                raise DataConfigError(
                    f"{where(ann)} refers to image id {ann.get('image_id')!r}, which is not in the file's images; "
                    "fix or remove the annotation"
                )
            category = ann.get("category_id")
            if not _is_int(category):
                raise DataConfigError(f"{where(ann)} has category_id {category!r}, which is not an integer; COCO"
                                      " ids are integers")
            if ann.get("category_id") not in self.cat_to_label:
                valid = ", ".join(str(c) for c in self.label_to_cat) or "none (the file lists no categories)"
                raise DataConfigError(
                    f"{where(ann)} has category_id {ann.get('category_id')!r}, which is not in the file's categories;"
                    f" valid ids: {valid}"
                )
            if ann.get("iscrowd") not in (0, 1):
                raise DataConfigError(f"{where(ann)} has iscrowd {ann.get('iscrowd')!r}; expected 0 or 1")
            area = ann.get("area")
            if not (_is_number(area) and math.isfinite(area) and area >= 0):
                raise DataConfigError(
                    f"{where(ann)} has area {area!r}; expected a number >= 0 (COCOeval's small/medium/large use it)"
                )
            problem, clipped = check_box(ann.get("bbox"), image["width"], image["height"])
            if problem:
                if invalid_boxes == "error":
                    raise DataConfigError(
                        f"{where(ann)} has bbox {ann.get('bbox')!r}: {problem}; fix the file, or set "
                        "data.invalid_boxes=drop to leave such boxes out (they are counted and logged)"
                    )
                invalid.append((ann, problem))
            elif clipped != ann["bbox"]:  # [1, 2, 3, 4] == [1.0, 2.0, 3.0, 4.0]: a box inside stays as it is
                ann["bbox"] = clipped  # the same dict is indexed by self.coco: evaluation reads it too
        if invalid:
            dropped = {id(ann) for ann, _ in invalid}
            self.coco.dataset["annotations"] = [a for a in self.coco.dataset["annotations"] if id(a) not in dropped]
            with contextlib.redirect_stdout(io.StringIO()):
                self.coco.createIndex()
            shown = ", ".join(str(ann.get("id")) for ann, _ in invalid[:10])
            more = f" and {len(invalid) - 10} more" if len(invalid) > 10 else ""
            log.warning(
                "data.invalid_boxes=drop: dropped %d of %d annotations of %s (%s; annotation ids %s%s)",
                len(invalid), len(invalid) + len(self.coco.dataset["annotations"]), self.ann_file,
                invalid[0][1], shown, more,
            )
        return len(invalid)

    def _check_file_name(self, image: dict) -> None:
        """An image's ``file_name`` is a relative path inside the split's image folder (``self.root``).

        Judged on the path as written (normalised, not resolved), so an absolute path or one that climbs out
        with ``..`` is refused before anything is opened, while an image that is a symlink inside the folder
        (a subset built from links) still loads.
        """
        name = image.get("file_name")
        if not isinstance(name, str) or not name.strip():
            raise DataConfigError(
                f"{self.ann_file}: image id {image.get('id')!r} has file_name {name!r}; expected the image's "
                f"path relative to the image folder {self.root}"
            )
        normal = os.path.normpath(name)
        if os.path.isabs(name) or normal == ".." or normal.startswith(".." + os.sep) or normal == ".":
            raise DataConfigError(
                f"{self.ann_file}: image id {image.get('id')!r} has file_name {name!r}, which points outside the "
                f"image folder {self.root}; file names must be relative paths inside it (no absolute path, no '..')"
            )
        path = os.path.join(self.root, name)
        if not os.path.isfile(path):  # found now, not when a batch first needs it
            try:
                os.stat(path)
                why = f"which is not a regular file in {self.root} (it is {not_regular(path) or 'a folder'})"
            except PermissionError:  # the file may be there: a folder on its way may not be searched
                why = (f"which cannot be reached in {self.root} (permission denied); valid: make the images"
                       f" readable (chmod -R u+rX {self.root})")
            except OSError:
                why = f"which is not a file in {self.root}"
            raise DataConfigError(f"{self.ann_file}: image id {image.get('id')!r} names {name!r}, {why}")

    def _check_image_sizes(self, images: list[dict]) -> None:
        """Each image file's size (read from its header) is the width and height the file records for it.

        Boxes are checked and clipped against the recorded size, so a mismatch is found here, before any run
        dir, rather than when a batch first reaches the image. Headers are read by a few threads: on COCO's
        118k images the reads wait on storage, not on the CPU.
        """
        def mismatch(image: dict) -> str | None:
            path = os.path.join(self.root, image["file_name"])
            size = image_size(path)
            if size != (image["width"], image["height"]):
                return (f"image {path} is {size[0]}x{size[1]} pixels but {self.ann_file} records "
                        f"{image['width']}x{image['height']} for image id {image['id']}; fix its width and height")
            return None

        pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(8, max(1, len(images))))
        try:
            for problem in pool.map(mismatch, images):  # in file order: the first bad image is named
                if problem:
                    raise DataConfigError(problem)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # after a bad image, the rest are not read

    def _unique(self, records: list[dict], kind: str) -> dict[Any, dict]:
        """``{id: record}``; a repeated id is an error (pycocotools would silently keep the last record)."""
        by_id: dict[Any, dict] = {}
        for record in records:
            key = record.get("id")
            if not _is_int(key):  # JSON true would pass as the id 1
                raise DataConfigError(f"{self.ann_file}: {kind} id {key!r} is not an integer; COCO ids are integers")
            if key in by_id:
                count = Counter(r.get("id") for r in records)[key]
                raise DataConfigError(
                    f"{self.ann_file}: {kind} id {key!r} appears {count} times; {kind} ids must be unique "
                    f"(otherwise one {kind} replaces another and boxes are paired with the wrong image or label)"
                )
            by_id[key] = record
        return by_id

    @property
    def num_ground_truth(self) -> int:
        """Annotations that are ground truth for AP: those with ``iscrowd == 0`` (after any dropping)."""
        return sum(1 for a in self.coco.dataset.get("annotations", []) if a.get("iscrowd", 0) == 0)

    def _load_image(self, id: int) -> Image.Image:
        return load_rgb_image(os.path.join(self.root, self.coco.loadImgs(id)[0]["file_name"]))

    def __getitem__(self, index: int) -> tuple[Tensor, dict[str, Tensor]]:
        image, anns = super().__getitem__(index)
        image_id = self.ids[index]
        w, h = image.size
        info = self.coco.imgs[image_id]
        if (w, h) != (info["width"], info["height"]):  # the file was replaced after setup checked its size
            raise DataConfigError(
                f"image {os.path.join(self.root, info['file_name'])} is {w}x{h} pixels but {self.ann_file} "
                f"records {info['width']}x{info['height']} for image id {image_id}; fix its width and height"
            )
        anns = [a for a in anns if a.get("iscrowd", 0) == 0]
        xywh = torch.as_tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        xyxy = box_convert(xywh, "xywh", "xyxy")
        xyxy[:, 0::2] = xyxy[:, 0::2].clamp(0, w)
        xyxy[:, 1::2] = xyxy[:, 1::2].clamp(0, h)
        labels = torch.as_tensor([self.cat_to_label[a["category_id"]] for a in anns], dtype=torch.int64)
        keep = (xyxy[:, 2] > xyxy[:, 0]) & (xyxy[:, 3] > xyxy[:, 1])
        target: dict[str, Any] = {
            "boxes": tv_tensors.BoundingBoxes(xyxy[keep], format="XYXY", canvas_size=(h, w)),
            "labels": labels[keep],
        }
        if self.detr_transforms is not None:
            image, target = self.detr_transforms(image, target)
        else:
            image = v2.functional.to_dtype(v2.functional.to_image(image), torch.float32, scale=True)
        th, tw = image.shape[-2:]
        boxes = box_convert(target["boxes"].as_subclass(Tensor), "xyxy", "cxcywh")
        boxes = boxes / torch.tensor([tw, th, tw, th], dtype=torch.float32)
        return image.as_subclass(Tensor), {
            "boxes": boxes,
            "labels": target["labels"],
            "image_id": torch.tensor(image_id),
            "orig_size": torch.tensor([h, w]),
            "size": torch.tensor([th, tw]),
        }


def collate_detection(batch: Sequence[tuple[Tensor, dict[str, Tensor]]]) -> dict[str, Any]:
    """Pad images to the batch's max (H, W) at the bottom/right; ``mask`` is True on padding."""
    images, targets = zip(*batch, strict=True)
    h = max(img.shape[-2] for img in images)
    w = max(img.shape[-1] for img in images)
    out = images[0].new_zeros((len(images), images[0].shape[0], h, w))
    mask = torch.ones((len(images), h, w), dtype=torch.bool)
    for i, img in enumerate(images):
        out[i, :, : img.shape[-2], : img.shape[-1]] = img
        mask[i, : img.shape[-2], : img.shape[-1]] = False
    return {"images": out, "mask": mask, "targets": list(targets)}


# ---------------------------------------------------------------------------------------- synthetic data
SHAPE_CLASSES: tuple[str, ...] = ("square", "circle", "triangle")
COLOURS: tuple[tuple[int, int, int], ...] = ((220, 40, 40), (40, 170, 60), (40, 80, 220), (230, 190, 30))


def _draw_shape(
    draw: ImageDraw.ImageDraw, kind: str, x: int, y: int, s: int, colour: tuple[int, int, int]
) -> None:
    """Draw ``kind`` filling the box [x, x+s) x [y, y+s)."""
    x1, y1 = x + s - 1, y + s - 1
    if kind == "square":
        draw.rectangle([x, y, x1, y1], fill=colour)
    elif kind == "circle":
        draw.ellipse([x, y, x1, y1], fill=colour)
    else:  # upward triangle touching all four sides of its box
        draw.polygon([(x, y1), (x1, y1), ((x + x1) / 2, y)], fill=colour)


def _overlap_too_large(box: tuple[int, int, int], placed: list[tuple[int, int, int]], limit: float) -> bool:
    """Whether square ``box`` (x, y, s) covers more than ``limit`` of itself or of a placed box."""
    x, y, s = box
    for px, py, ps in placed:
        iw = min(x + s, px + ps) - max(x, px)
        ih = min(y + s, py + ps) - max(y, py)
        if iw > 0 and ih > 0 and iw * ih > limit * min(s * s, ps * ps):
            return True
    return False


def _write_split(
    root: Path,
    split: str,
    num_images: int,
    rng: np.random.Generator,
    image_size: Sequence[int],
    object_size: Sequence[int],
    max_objects: int,
    max_overlap: float,
) -> None:
    (root / f"{split}2017").mkdir(parents=True)
    images, annotations = [], []
    for image_id in range(1, num_images + 1):
        h, w = (int(rng.integers(image_size[0], image_size[1] + 1)) for _ in range(2))
        background = rng.integers(90, 170, size=3)
        # Mild per-pixel noise so the background is not trivially flat.
        pixels = np.clip(background + rng.normal(0, 12, size=(h, w, 3)), 0, 255).astype(np.uint8)
        img = Image.fromarray(pixels)
        draw = ImageDraw.Draw(img)
        placed: list[tuple[int, int, int]] = []
        for _ in range(int(rng.integers(1, max_objects + 1))):
            for _attempt in range(20):
                s = int(rng.integers(object_size[0], object_size[1] + 1))  # fits: check_shapes_settings
                box = (int(rng.integers(0, w - s + 1)), int(rng.integers(0, h - s + 1)), s)
                if not _overlap_too_large(box, placed, max_overlap):
                    break
            else:
                continue  # no room left for another object
            cls = int(rng.integers(len(SHAPE_CLASSES)))
            colour = COLOURS[int(rng.integers(len(COLOURS)))]
            _draw_shape(draw, SHAPE_CLASSES[cls], *box, colour)
            placed.append(box)
            x, y, s = box
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": cls + 1,
                    "bbox": [float(x), float(y), float(s), float(s)],
                    "area": float(s * s),
                    "iscrowd": 0,
                }
            )
        file_name = f"{image_id:06d}.png"
        img.save(root / f"{split}2017" / file_name)
        images.append({"id": image_id, "file_name": file_name, "height": h, "width": w})
    coco = {
        "info": {"description": "synthetic shapes in COCO format"},
        "images": images,
        "annotations": annotations,
        "categories": [
            {"id": i + 1, "name": n, "supercategory": "shape"} for i, n in enumerate(SHAPE_CLASSES)
        ],
    }
    (root / "annotations").mkdir(exist_ok=True)
    (root / "annotations" / f"instances_{split}2017.json").write_text(json.dumps(coco))


def check_shapes_settings(
    num_train: Any, num_val: Any, image_size: Any, object_size: Any, max_objects: Any, max_overlap: Any
) -> None:
    """Raise a one-line `DataConfigError` unless `generate_shapes_coco` can place at least one object in
    every image it may draw (so every image has ground truth); later objects get a bounded number of tries."""

    def is_int(value: Any) -> bool:
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)

    for name, value in (("num_train", num_train), ("num_val", num_val), ("max_objects", max_objects)):
        if not is_int(value) or value < 1:
            raise DataConfigError(f"data.generator.{name}={value!r} must be an integer >= 1")
    for name, value in (("image_size", image_size), ("object_size", object_size)):
        if not (isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2
                and all(is_int(v) for v in value) and 1 <= value[0] <= value[1]):
            raise DataConfigError(
                f"data.generator.{name}={value!r} must be [min, max], two integers with 1 <= min <= max"
            )
    if object_size[0] > image_size[0]:
        raise DataConfigError(
            f"data.generator.object_size={list(object_size)} does not fit image_size={list(image_size)}: the "
            f"smallest object ({object_size[0]} px) must fit the smallest image ({image_size[0]} px); valid: "
            f"object_size[0] <= {image_size[0]}"
        )
    if object_size[1] > image_size[0]:  # every drawn size must fit every image: never capped silently
        raise DataConfigError(
            f"data.generator.object_size={list(object_size)} does not fit image_size={list(image_size)}: the "
            f"largest object ({object_size[1]} px) must fit the smallest image ({image_size[0]} px); valid: "
            f"object_size[1] <= {image_size[0]}"
        )
    if not (_is_number(max_overlap) and 0.0 <= max_overlap <= 1.0):
        raise DataConfigError(f"data.generator.max_overlap={max_overlap!r} must be a number in [0, 1]")


def _draw_shapes_coco(
    root: str | Path, num_train: int, num_val: int, image_size: Sequence[int], object_size: Sequence[int],
    max_objects: int, max_overlap: float, seed: int,
) -> None:
    """Draw both splits into ``root``, the private temp folder `data.generation.ensure_generated` made."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", num_train), ("val", num_val)):
        _write_split(Path(root), split, n, rng, image_size, object_size, max_objects, max_overlap)


def shapes_generator(
    num_train: int = 2000,
    num_val: int = 200,
    image_size: Sequence[int] = (96, 128),
    object_size: Sequence[int] = (12, 48),
    max_objects: int = 4,
    max_overlap: float = 0.35,
    seed: int = 0,
) -> functools.partial:
    """The generator ``fn(root)`` of the synthetic set with these settings (checked first,
    `check_shapes_settings`), every setting bound: its completion marker then records all of them, defaults
    included, so that data made with other settings are refused (`data.generation.check_marker`)."""
    check_shapes_settings(num_train, num_val, image_size, object_size, max_objects, max_overlap)
    return functools.partial(_draw_shapes_coco, num_train=num_train, num_val=num_val, image_size=list(image_size),
                             object_size=list(object_size), max_objects=max_objects, max_overlap=max_overlap,
                             seed=seed)


def generate_shapes_coco(root: str | Path, **settings: Any) -> Path:
    """Write the synthetic set (`shapes_generator`'s ``settings``) to ``root`` once, atomically; returns ``root``.

    Each image (sides uniform in ``image_size``) holds 1..``max_objects`` squares, circles and
    triangles (categories 1, 2, 3) in four colours, sides uniform in ``object_size``; a new object
    may cover at most ``max_overlap`` of an earlier one's box (partial occlusion, never hidden).
    `data.generation.ensure_generated` does the writing, as for every generated set: a temporary sibling
    folder renamed onto ``root`` at the end, under a lock, with a completion marker that records the
    settings. So a killed run never leaves half a dataset, concurrent ranks end with one complete copy, and
    an existing ``root`` is used only when its marker records these settings: a folder without the marker
    (another set, data put there by hand) or made with other settings is refused in one line.
    """
    generator = shapes_generator(**settings)
    ensure_generated(root, generator)
    return Path(root)


# ---------------------------------------------------------------------------------------- data module
def _check_starts_as_json_object(ann_file: Path) -> None:
    """A COCO annotation file is a JSON object: one that starts or ends otherwise (a sparse file or tail of NULs, an
    image, a file cut short) is named from its first or last bytes, before the parser reads all of it (a real one
    may take hundreds of MB)."""
    try:
        with ann_file.open("rb") as f:
            head = f.read(4096).lstrip()
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            tail = f.read().rstrip()
    except OSError:
        return  # named by the reader that follows, in its own words
    if head[:1] != b"{":
        what = "is empty" if not head else f"starts with {head[:12]!r}, not a JSON object"
        raise CocoLayoutError(f"{ann_file} is not a COCO annotation file: it {what}; expected a JSON object with"
                              " images, annotations and categories")
    if tail[-1:] != b"}":  # a file cut short, or grown by a sparse tail of NULs (which the parser would read whole)
        raise CocoLayoutError(f"{ann_file} is not a COCO annotation file: it ends with {tail[-12:]!r}, not with the"
                              " '}' that closes a JSON object (a file cut short, or damaged); expected a JSON object"
                              " with images, annotations and categories")


def _categories(ann_file: Path) -> list[int]:
    try:
        with ann_file.open() as f:
            return sorted(c["id"] for c in json.load(f)["categories"])
    except json.JSONDecodeError as err:
        raise _not_json(ann_file, err) from None
    except RecursionError:
        raise DataConfigError(_too_deep(ann_file)) from None
    except (UnicodeDecodeError, KeyError, TypeError) as err:
        raise DataConfigError(
            f"{ann_file} has no list of categories with ids ({type(err).__name__}: {err}); expected a COCO "
            "annotation file"
        ) from None
    except ValueError as err:  # valid JSON holding an integer of more digits than Python converts
        raise _not_json(ann_file, err) from None


# The data module's state in a checkpoint (`CocoDataModule.state_dict`): the categories its labels index
CATEGORIES_STATE = "categories"


def recorded_categories(checkpoint: Mapping[str, Any]) -> list[tuple[int, str]] | None:
    """``[(category id, name), ...]`` in label order that a checkpoint's model was trained on; None where it
    records none (a checkpoint saved before they were recorded, or of other data)."""
    state = checkpoint.get(CocoDataModule.__qualname__)
    pairs = state.get(CATEGORIES_STATE) if isinstance(state, dict) else None
    if not (isinstance(pairs, list) and pairs and all(
            isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], int) and isinstance(p[1], str)
            for p in pairs)):
        return None
    return [(int(i), str(n)) for i, n in pairs]


def category_names(dataset: Any) -> list[tuple[int, str]]:
    """``[(category id, name), ...]`` of a loaded `CocoDetectionDataset`, in label order."""
    return [(cat, str(dataset.coco.cats[cat].get("name", ""))) for cat in dataset.label_to_cat]


def categories_difference(model: list[tuple[int, str]], data: list[tuple[int, str]]) -> str:
    """How ``data``'s categories (id, name, in label order) differ from the ``model``'s, or '' where they agree."""
    if model == data:
        return ""
    for label, (ours, theirs) in enumerate(zip(model, data, strict=False)):
        if ours != theirs:
            return (f"label {label} is category {ours[0]} {ours[1]!r} for the model, category {theirs[0]}"
                    f" {theirs[1]!r} in the data")
    return f"the model has {len(model)} categories, the data {len(data)}"


class CocoDataModule(L.LightningDataModule):
    """COCO-2017-layout detection data with DETR's transforms; test = the val split.

    Args:
        root: dataset folder (see the module docstring for the layout).
        batch_size, num_workers, pin_memory: per-device loader settings.
        train_scales, max_size, crop_scales, crop_size, hflip: `detr_train_transforms` arguments.
        val_size: shorter side at evaluation (longer side <= ``max_size``).
        generator: kwargs of `generate_shapes_coco`; when set, ``prepare_data`` writes the synthetic
            set to ``root`` if it is missing, and refuses a ``root`` it did not write with these settings
            (and ``num_classes`` is that set's class count).
        num_classes: class count; by default read from the val annotation file's categories.
        invalid_boxes: ``error`` (default): a box with width or height <= 0, wholly outside its image or
            reaching outside it by more than a small tolerance (`check_box`) stops with its file and
            annotation id; ``drop``: such boxes are left out of training and evaluation, counted and logged.
            Either way, both splits follow the same rule, and boxes within the tolerance are clipped for
            training and evaluation alike.
    """

    def __init__(
        self,
        root: str,
        batch_size: int = 2,
        num_workers: int = 2,
        pin_memory: bool = True,
        train_scales: Sequence[int] = DETR_SCALES,
        max_size: int | None = 1333,
        crop_scales: Sequence[int] | None = (400, 500, 600),
        crop_size: Sequence[int] = (384, 600),
        hflip: bool = True,
        val_size: int = 800,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        generator: dict[str, Any] | None = None,
        num_classes: int | None = None,
        invalid_boxes: str = "error",
    ) -> None:
        super().__init__()
        if invalid_boxes not in INVALID_BOX_CHOICES:
            raise DataConfigError(
                f"data.invalid_boxes={invalid_boxes!r} is not one of: {', '.join(INVALID_BOX_CHOICES)}"
            )
        self.invalid_boxes = invalid_boxes
        self.root = data_root_path(root)
        self.batch_size, self.num_workers, self.pin_memory = (
            int(batch_size),
            int(num_workers),
            bool(pin_memory),
        )
        self.train_tf = detr_train_transforms(
            [int(s) for s in train_scales],
            max_size,
            None if not crop_scales else [int(s) for s in crop_scales],
            [int(s) for s in crop_size],
            hflip,
            mean,
            std,
        )
        self.eval_tf = detr_eval_transforms(int(val_size), max_size, mean, std)
        self.generator = None if generator is None else dict(generator)
        if num_classes is None:
            num_classes = (
                len(SHAPE_CLASSES) if self.generator is not None else len(self.label_to_cat_from_disk())
            )
        self.num_classes = int(num_classes)
        self.train_set: CocoDetectionDataset | None = None
        self.val_set: CocoDetectionDataset | None = None

    def paths(self, split: str) -> tuple[Path, Path]:
        """(image folder, annotation file) of ``split`` (``train`` or ``val``)."""
        return coco_paths(self.root, split)

    def check_on_disk(self, world_size: int | None) -> None:
        """Before a run dir is made: data that is not generated is read and checked as `setup` reads it (both
        splits' folders and annotation files, every record and image size, the categories, ground truth in each
        split), and its val split must not be its training split (`_check_separate_splits`,
        `_check_separate_images`). The datasets built here are dropped; the same files are passed in this process
        once (a sweep's jobs check one dataset once). ``world_size`` is the data modules' common argument, unused
        here."""
        if self.generator is not None:  # generated data edited since: refused here, not by the job's prepare_data
            check_generated(self.root, shapes_generator(**self.generator))
            return
        for split in ("train", "val"):
            self._check(split)
        self._check_separate_splits()
        key = (self.invalid_boxes, self.num_classes, *(_file_identity(path) for split in ("train", "val")
                                                       for path in self.paths(split)))
        if key in _CHECKED_DATA:
            return
        try:
            self.val_set = self._build("val")  # the smaller split first: its faults are named in seconds
            self._check_separate_images(self.val_set)
            self.train_set = self._build("train")
            self._check_built()
        finally:
            self.train_set = self.val_set = None
        _CHECKED_DATA.add(key)

    def _check_separate_images(self, val_set: CocoDetectionDataset) -> None:
        """No val image is a training image: the same file (a hard or symbolic link) or the same bytes under any
        name (`training_twin`). One such image would be validated on after training on it."""
        (train_folder, _), (val_folder, _) = self.paths("train"), self.paths("val")
        val_files, ids = {}, {}
        for image in val_set.coco.dataset.get("images", []):
            name = os.path.normpath(image["file_name"])
            try:
                val_files[name] = (val_folder / name).stat()
            except OSError:
                continue
            ids[name] = image["id"]
        twin = training_twin(train_folder, val_folder, val_files)
        if twin is not None:
            raise CocoLayoutError(
                f"data.root={self.root}: val image {val_folder.name}/{twin[0]} (image id {ids[twin[0]]}) is"
                f" {train_folder.name}/{twin[1]} (a link or a copy of it): the run would be validated on its"
                " training images; valid: a val split of images of its own")

    def _check_separate_splits(self) -> None:
        """The val split is not the training split under another name: one image folder (a symlink), or one
        annotation file (a link, or a copy of the same bytes). A run would validate on what it trained on."""
        (train_folder, train_ann), (val_folder, val_ann) = self.paths("train"), self.paths("val")
        if os.path.realpath(train_folder) == os.path.realpath(val_folder):
            raise CocoLayoutError(f"data.root={self.root}: {val_folder.name}/ and {train_folder.name}/ are one folder"
                                  f" ({os.path.realpath(val_folder)}): the run would be validated on its training"
                                  " images; valid: a val split of images of its own")
        if os.path.realpath(train_ann) == os.path.realpath(val_ann) or (
                train_ann.stat().st_size == val_ann.stat().st_size and filecmp.cmp(train_ann, val_ann, shallow=False)):
            raise CocoLayoutError(f"data.root={self.root}: annotations/{val_ann.name} holds the same bytes as"
                                  f" annotations/{train_ann.name}: the run would be validated on its training"
                                  " images; valid: a val split of images and annotations of its own")

    def _check(self, split: str) -> tuple[Path, Path]:
        if not self.root.is_dir():
            raise CocoLayoutError(f"data.root={self.root} {absent_folder(self.root)}; {LAYOUT}")
        folder, ann = self.paths(split)
        for path in (folder, ann.parent, ann):  # annotations/ itself may be the loop
            if os.path.islink(path) and not path.exists():  # a loop, or a target that is gone: not "missing"
                raise CocoLayoutError(f"{path} is a symlink that leads nowhere ({os.readlink(path)}: a link loop or a"
                                      f" target that does not exist); valid: a link to the real {path.name}, or the"
                                      " file itself")
        if ann.exists() and not ann.is_file():
            raise CocoLayoutError(f"{ann} is not a plain file (a folder, FIFO, socket or device); valid: the COCO"
                                  " annotation file (JSON)")
        if not folder.is_dir() or not ann.is_file():
            raise CocoLayoutError(
                f"data.root={self.root} lacks {folder.name}/ or annotations/{ann.name}; {LAYOUT}"
            )
        _check_starts_as_json_object(ann)
        return folder, ann

    def label_to_cat_from_disk(self) -> list[int]:
        return _categories(self._check("val")[1])

    def prepare_data(self) -> None:
        if self.generator is not None:
            generate_shapes_coco(self.root, **self.generator)

    def setup(self, stage: str | None = None) -> None:
        if stage in (None, "fit") and self.train_set is None:
            self.train_set = self._build("train")
        if self.val_set is None:
            self.val_set = self._build("val")
        self._check_built()

    def _build(self, split: str) -> CocoDetectionDataset:
        """The dataset of ``split``, its annotation file checked against itself and its images."""
        transforms = self.train_tf if split == "train" else self.eval_tf
        return CocoDetectionDataset(*self._check(split), transforms, self.invalid_boxes)

    def _check_built(self) -> None:
        """The splits built so far each hold ground truth, list the same categories, as many as the config's."""
        for split, dataset in (("train", self.train_set), ("val", self.val_set)):
            if dataset is not None and dataset.num_ground_truth == 0:
                why = "AP would be undefined" if split == "val" else "there would be nothing to learn"
                total = len(dataset.coco.dataset.get("annotations", []))
                dropped = dataset.dropped_boxes
                dropped = f", {dropped} dropped by data.invalid_boxes=drop" if dropped else ""
                raise CocoLayoutError(
                    f"{dataset.ann_file} has no ground truth: none of its {total} annotations is a non-crowd box"
                    f" (iscrowd 0){dropped}; the {split} split needs some, else {why}"
                )
        if self.train_set is not None and self.train_set.label_to_cat != self.val_set.label_to_cat:
            raise CocoLayoutError(
                f"data.root={self.root}: train and val annotation files list different categories"
            )
        if len(self.val_set.label_to_cat) != self.num_classes:
            raise CocoLayoutError(
                f"data.num_classes={self.num_classes} but {self.root} has "
                f"{len(self.val_set.label_to_cat)} categories"
            )

    def state_dict(self) -> dict[str, Any]:
        """What every checkpoint of a run records of its data (Lightning saves it beside the weights): the
        categories its labels index, ids and names (`recorded_categories`), so that an evaluation on other data
        can tell whether label ``i`` means the same object there. Empty before the splits are read."""
        reference = self.train_set if self.train_set is not None else self.val_set
        return {CATEGORIES_STATE: [list(pair) for pair in category_names(reference)]} if reference is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Nothing to restore: the categories are read from the data again."""

    @property
    def label_to_cat(self) -> list[int]:
        """Contiguous label -> COCO category id."""
        if self.val_set is None:
            self.setup("validate")
        return self.val_set.label_to_cat

    def _loader(self, dataset: CocoDetectionDataset, train: bool) -> DataLoader:
        # Shard explicitly (a DistributedSampler, which Lightning leaves as it is), so evaluation order is known;
        # evaluation in file order, every image once (`evaluation_order`: no padding repeats).
        world, rank = trainer_world(self)
        if not train:
            sampler = evaluation_order(self, dataset, shuffle=False, split=str(dataset.ann_file))
        else:
            sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True) if world > 1 else None
        return make_loader(self, dataset, train, sampler=sampler, collate_fn=collate_detection)

    def train_dataloader(self) -> DataLoader:
        if self.train_set is None:
            self.setup("fit")
        return self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader:
        if self.val_set is None:
            self.setup("validate")
        return self._loader(self.val_set, train=False)

    def test_dataloader(self) -> DataLoader:
        """The val split: COCO's test-dev has no public annotations."""
        return self.val_dataloader()
