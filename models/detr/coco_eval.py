"""COCO box evaluation with pycocotools, quiet, returning the 12 standard numbers in percent."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterable, Sequence

import numpy as np
import torch.distributed as dist
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch import Tensor

# The order of COCOeval.stats for iouType "bbox".
METRIC_NAMES: tuple[str, ...] = (
    "AP",
    "AP50",
    "AP75",
    "APs",
    "APm",
    "APl",
    "AR1",
    "AR10",
    "AR100",
    "ARs",
    "ARm",
    "ARl",
)

# COCOeval's object size classes by annotation area in pixels (both ends inclusive), keyed by the suffix of the
# statistics that measure one class (APs, APm, APl, ARs, ARm, ARl).
AREA_RANGES: dict[str, tuple[float, float]] = {"s": (0.0, 32.0**2), "m": (32.0**2, 96.0**2), "l": (96.0**2, 1e10)}
SIZE_CLASS_METRICS: tuple[str, ...] = tuple(f"{kind}{size}" for kind in ("AP", "AR") for size in AREA_RANGES)


def undefined_metrics(coco_gt: COCO, image_ids: Sequence[int]) -> set[str]:
    """The statistics with no non-crowd ground-truth box to measure among ``image_ids``: every one when there
    is no such box at all, else those of each size class without a box (COCOeval gives them -1)."""
    areas = [float(a.get("area", 0.0)) for i in image_ids for a in coco_gt.imgToAnns.get(i, [])
             if a.get("iscrowd", 0) == 0]
    if not areas:
        return set(METRIC_NAMES)
    empty = {size for size, (low, high) in AREA_RANGES.items() if not any(low <= a <= high for a in areas)}
    return {name for name in SIZE_CLASS_METRICS if name[-1] in empty}


def load_coco(annotation_file: str) -> COCO:
    """Load an annotation JSON without pycocotools' prints."""
    with contextlib.redirect_stdout(io.StringIO()):
        return COCO(annotation_file)


def to_coco_results(
    detections: Sequence[dict[str, Tensor]], image_ids: Iterable[int], label_to_cat: Sequence[int]
) -> list[dict]:
    """Per-image ``{scores, labels, boxes (xyxy, absolute)}`` -> COCO result dicts.

    Each result is ``{image_id, category_id, bbox: [x, y, w, h], score}``; contiguous labels are
    mapped back to the dataset's category ids through ``label_to_cat``.
    """
    results = []
    for det, image_id in zip(detections, image_ids, strict=True):
        boxes = det["boxes"].detach().float().cpu()
        xywh = boxes.clone()
        xywh[:, 2:] -= xywh[:, :2]
        cats = [int(label_to_cat[int(lab)]) for lab in det["labels"].tolist()]
        for bbox, score, cat in zip(xywh.tolist(), det["scores"].tolist(), cats, strict=True):
            results.append(
                {"image_id": int(image_id), "category_id": cat, "bbox": bbox, "score": float(score)}
            )
    return results


def evaluate_coco(
    coco_gt: COCO, results: list[dict], image_ids: Iterable[int] | None = None
) -> dict[str, float]:
    """Run COCOeval (bbox) over ``image_ids`` (default: all) and return the 12 stats in percent.

    A statistic with nothing to measure is NaN, not 0 (COCOeval says -1): every one without any non-crowd
    ground-truth box among the images, else those of a size class without a box (APl on small objects).
    No detections at all give zeros for the rest (pycocotools cannot load an empty result list).
    """
    ids = sorted(set(image_ids)) if image_ids is not None else sorted(coco_gt.getImgIds())
    undefined = undefined_metrics(coco_gt, ids)
    if len(undefined) == len(METRIC_NAMES):
        return dict.fromkeys(METRIC_NAMES, float("nan"))
    if not results:
        return {name: float("nan") if name in undefined else 0.0 for name in METRIC_NAMES}
    with contextlib.redirect_stdout(io.StringIO()):
        coco_dt = coco_gt.loadRes([dict(r) for r in results])  # loadRes edits its input
        evaluator = COCOeval(coco_gt, coco_dt, iouType="bbox")
        evaluator.params.imgIds = ids
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    # COCOeval gives -1 where a statistic has no ground truth to measure (e.g. no large objects): undefined.
    stats = np.asarray(evaluator.stats, dtype=np.float64)
    return {name: float(v) * 100.0 if v >= 0 else float("nan") for name, v in zip(METRIC_NAMES, stats, strict=True)}


def gather_detections(local: dict[int, list[dict]]) -> dict[int, list[dict]]:
    """Merge every DDP rank's ``{image_id: COCO results}`` (identity without DDP).

    Keyed by image, so an image read twice (a padding DistributedSampler; evaluation reads each once,
    `data.datamodule.EvaluationSampler`) would still count once.
    Every rank receives the same merged dict, so every rank can evaluate identically.
    """
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return dict(local)
    parts: list[dict[int, list[dict]] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, local)
    merged: dict[int, list[dict]] = {}
    for part in parts:
        merged.update(part or {})
    return merged
