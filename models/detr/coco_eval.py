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

    No detections at all give zeros (pycocotools cannot load an empty result list). Without any non-crowd
    ground-truth box among the images AP is undefined, not 0: every stat is NaN (COCOeval would say -1).
    """
    ids = sorted(set(image_ids)) if image_ids is not None else sorted(coco_gt.getImgIds())
    if not any(a.get("iscrowd", 0) == 0 for i in ids for a in coco_gt.imgToAnns.get(i, [])):
        return dict.fromkeys(METRIC_NAMES, float("nan"))
    if not results:
        return dict.fromkeys(METRIC_NAMES, 0.0)
    with contextlib.redirect_stdout(io.StringIO()):
        coco_dt = coco_gt.loadRes([dict(r) for r in results])  # loadRes edits its input
        evaluator = COCOeval(coco_gt, coco_dt, iouType="bbox")
        evaluator.params.imgIds = ids
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    # COCOeval reports -1 where a statistic has no ground truth (e.g. no large objects): report 0.
    stats = np.maximum(np.asarray(evaluator.stats, dtype=np.float64), 0.0) * 100.0
    return {name: float(v) for name, v in zip(METRIC_NAMES, stats, strict=True)}


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
