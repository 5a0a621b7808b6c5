"""COCO evaluation: perfect predictions give AP 100, shifted boxes less; PostProcess round trip."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest
import torch
from pycocotools.cocoeval import COCOeval

from models.detr import METRIC_NAMES, PostProcess, evaluate_coco, gather_detections, to_coco_results
from models.detr.coco_eval import load_coco, undefined_metrics

# Non-contiguous category ids exercise the label <-> category mapping.
CATEGORIES = [{"id": 3, "name": "a"}, {"id": 7, "name": "b"}, {"id": 11, "name": "c"}]
IMAGES = [{"id": 1, "height": 100, "width": 120}, {"id": 2, "height": 80, "width": 60}]
# (image_id, category_id, [x, y, w, h]): small, medium and large objects for the size buckets.
BOXES = [
    (1, 3, [10.0, 12.0, 20.0, 15.0]),
    (1, 7, [40.0, 30.0, 60.0, 50.0]),
    (1, 11, [5.0, 60.0, 14.0, 30.0]),
    (2, 7, [0.0, 0.0, 59.0, 79.0]),
    (2, 3, [20.0, 20.0, 10.0, 12.0]),
]


@pytest.fixture()
def coco_gt(tmp_path: Path):
    anns = [
        {"id": i + 1, "image_id": img, "category_id": cat, "bbox": box, "area": box[2] * box[3], "iscrowd": 0}
        for i, (img, cat, box) in enumerate(BOXES)
    ]
    path = tmp_path / "instances_val2017.json"
    path.write_text(json.dumps({"images": IMAGES, "annotations": anns, "categories": CATEGORIES}))
    return load_coco(str(path))


def _results(shift: float = 0.0) -> list[dict]:
    return [
        {
            "image_id": img,
            "category_id": cat,
            "bbox": [box[0] + shift, box[1] + shift, box[2], box[3]],
            "score": 0.9,
        }
        for img, cat, box in BOXES
    ]


def test_perfect_predictions_give_100(coco_gt, capsys) -> None:
    stats = evaluate_coco(coco_gt, _results())
    assert list(stats) == list(METRIC_NAMES)
    for name in ("AP", "AP50", "AP75", "AR1", "AR10", "AR100"):
        assert stats[name] == pytest.approx(100.0), name
    assert capsys.readouterr().out == ""  # pycocotools' prints are swallowed


def test_shifted_boxes_score_lower(coco_gt) -> None:
    perfect = evaluate_coco(coco_gt, _results())
    shifted = evaluate_coco(coco_gt, _results(shift=4.0))
    assert shifted["AP"] < perfect["AP"]
    assert shifted["AP75"] < 100.0


def test_empty_results_give_zeros_where_there_is_ground_truth(coco_gt) -> None:
    stats = evaluate_coco(coco_gt, [])
    assert {k: v for k, v in stats.items() if k not in ("APl", "ARl")} == dict.fromkeys(METRIC_NAMES[:5], 0.0) | {
        "AR1": 0.0, "AR10": 0.0, "AR100": 0.0, "ARs": 0.0, "ARm": 0.0}
    assert math.isnan(stats["APl"]) and math.isnan(stats["ARl"])  # no large box: nothing to miss


def _raw_cocoeval_stats(coco_gt, results: list[dict], image_ids: list[int]) -> list[float]:
    """pycocotools' own 12 numbers (-1 where a statistic has nothing to measure), as a reference."""
    with contextlib.redirect_stdout(io.StringIO()):
        evaluator = COCOeval(coco_gt, coco_gt.loadRes([dict(r) for r in results]), iouType="bbox")
        evaluator.params.imgIds = image_ids
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return [float(v) for v in evaluator.stats]


@pytest.mark.parametrize(("image_ids", "undefined"), [([1, 2], {"APl", "ARl"}), ([2], {"APl", "ARl"})])
def test_a_size_class_without_ground_truth_is_undefined_not_zero(coco_gt, image_ids, undefined) -> None:
    """The fixture's boxes are small (< 32^2 px) and medium, none large: APl and ARl measure nothing. COCOeval
    says -1 for them; they must come out NaN (never a 0 that reads as "every large object missed")."""
    results = [r for r in _results(shift=2.0) if r["image_id"] in image_ids]
    raw = _raw_cocoeval_stats(coco_gt, results, image_ids)
    stats = evaluate_coco(coco_gt, results, image_ids=image_ids)
    assert {name for name, v in zip(METRIC_NAMES, raw, strict=True) if v == -1} == undefined
    for name, reference in zip(METRIC_NAMES, raw, strict=True):
        if name in undefined:
            assert math.isnan(stats[name]), name
        else:
            assert stats[name] == pytest.approx(100.0 * reference), name


def test_only_small_boxes_leave_medium_and_large_undefined(tmp_path: Path) -> None:
    anns = [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [10.0, 12.0, 20.0, 15.0], "area": 300.0, "iscrowd": 0},
            {"id": 2, "image_id": 1, "category_id": 7, "bbox": [0.0, 0.0, 100.0, 100.0], "area": 1e4, "iscrowd": 1}]
    path = tmp_path / "gt.json"
    path.write_text(json.dumps({"images": IMAGES[:1], "annotations": anns, "categories": CATEGORIES}))
    gt = load_coco(str(path))
    assert undefined_metrics(gt, [1]) == {"APm", "APl", "ARm", "ARl"}  # the crowd box counts for nothing
    empty = evaluate_coco(gt, [])
    assert [name for name in METRIC_NAMES if math.isnan(empty[name])] == ["APm", "APl", "ARm", "ARl"]
    assert empty["AP"] == 0.0 and empty["APs"] == 0.0


def test_postprocess_and_results_round_trip(coco_gt) -> None:
    """Normalised cxcywh predictions at the ground truth -> PostProcess -> COCO results -> AP 100."""
    label_to_cat = [c["id"] for c in CATEGORIES]
    detections, image_ids = [], []
    for image in IMAGES:
        h, w = image["height"], image["width"]
        gts = [(cat, box) for img, cat, box in BOXES if img == image["id"]]
        num_queries = 4
        logits = torch.full((1, num_queries, len(label_to_cat) + 1), -10.0)
        logits[0, :, -1] = 10.0  # spare queries say "no object" ...
        boxes = torch.full((1, num_queries, 4), 0.5)
        for q, (cat, (x, y, bw, bh)) in enumerate(gts):
            logits[0, q, label_to_cat.index(cat)] = 10.0
            logits[0, q, -1] = -10.0
            boxes[0, q] = torch.tensor([(x + bw / 2) / w, (y + bh / 2) / h, bw / w, bh / h])
        out = PostProcess()({"pred_logits": logits, "pred_boxes": boxes}, torch.tensor([[h, w]]))
        detections += out
        image_ids.append(image["id"])
        assert out[0]["boxes"].shape == (num_queries, 4)
    results = to_coco_results(detections, image_ids, label_to_cat)
    assert {r["category_id"] for r in results} <= {3, 7, 11}
    stats = evaluate_coco(coco_gt, results, image_ids=image_ids)
    # ... and score ~0, so they rank below every true detection: AP stays 100.
    assert stats["AP"] == pytest.approx(100.0, abs=1e-3)
    # Evaluating a subset of images only counts those images' ground truth.
    only_first = [r for r in results if r["image_id"] == 1]
    assert evaluate_coco(coco_gt, only_first, image_ids=[1])["AP"] == pytest.approx(100.0, abs=1e-3)


def test_gather_merges_ranks_and_counts_padded_repeats_once(coco_gt, monkeypatch) -> None:
    """Two fake DDP ranks: rank 1 repeats image 1 (DistributedSampler padding); the merged results
    evaluate exactly like the single-process results."""
    import models.detr.coco_eval as ce

    by_image = {img: [r for r in _results() if r["image_id"] == img] for img in (1, 2)}
    rank0, rank1 = {1: by_image[1]}, {2: by_image[2], 1: by_image[1]}
    monkeypatch.setattr(ce.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(ce.dist, "get_world_size", lambda: 2)

    def fake_all_gather_object(out: list, obj: dict) -> None:
        out[0], out[1] = obj, rank1

    monkeypatch.setattr(ce.dist, "all_gather_object", fake_all_gather_object)
    merged = gather_detections(rank0)
    assert sorted(merged) == [1, 2]
    flat = [r for rs in merged.values() for r in rs]
    assert len(flat) == len(BOXES)
    # repr compares NaN (the undefined APl, ARl) equal to NaN
    assert repr(evaluate_coco(coco_gt, flat, image_ids=merged.keys())) == repr(evaluate_coco(coco_gt, _results()))
