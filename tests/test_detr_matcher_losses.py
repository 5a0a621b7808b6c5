"""DETR's Hungarian matcher against brute force, and the set losses against hand-computed values."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from models.detr import HungarianMatcher, SetCriterion, build_weight_dict


def _giou_by_hand(a: list[float], b: list[float]) -> float:
    """GIoU of two xyxy boxes from plain arithmetic."""
    area = lambda r: (r[2] - r[0]) * (r[3] - r[1])  # noqa: E731
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = area(a) + area(b) - inter
    hull = (max(a[2], b[2]) - min(a[0], b[0])) * (max(a[3], b[3]) - min(a[1], b[1]))
    return inter / union - (hull - union) / hull


def _xyxy(cxcywh: list[float]) -> list[float]:
    cx, cy, w, h = cxcywh
    return [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]


def _random_boxes(n: int, gen: torch.Generator) -> torch.Tensor:
    centre = torch.rand(n, 2, generator=gen) * 0.6 + 0.2
    size = torch.rand(n, 2, generator=gen) * 0.3 + 0.05
    return torch.cat([centre, size], dim=1)


def test_cost_matrix_matches_the_formula() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 4, 4, generator=gen)
    boxes = _random_boxes(4, gen)[None]
    target = {"labels": torch.tensor([2, 0]), "boxes": _random_boxes(2, gen)}
    matcher = HungarianMatcher(cost_class=1.0, cost_bbox=5.0, cost_giou=2.0)
    cost = matcher.cost_matrices({"pred_logits": logits, "pred_boxes": boxes}, [target])[0]
    prob = logits[0].softmax(-1)
    for i in range(4):
        for j in range(2):
            p, t = boxes[0, i].tolist(), target["boxes"][j].tolist()
            expected = (
                -prob[i, target["labels"][j]].item()
                + 5.0 * sum(abs(x - y) for x, y in zip(p, t, strict=True))
                + 2.0 * -_giou_by_hand(_xyxy(p), _xyxy(t))
            )
            assert cost[i, j].item() == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("seed", range(12))
def test_matcher_is_optimal_against_brute_force(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    num_queries, num_classes, batch = 5, 3, 2
    logits = torch.randn(batch, num_queries, num_classes + 1, generator=gen)
    boxes = _random_boxes(batch * num_queries, gen).view(batch, num_queries, 4)
    targets = []
    for _ in range(batch):
        t = int(torch.randint(0, num_queries + 1, (), generator=gen))  # includes images without objects
        targets.append(
            {"labels": torch.randint(0, num_classes, (t,), generator=gen), "boxes": _random_boxes(t, gen)}
        )
    outputs = {"pred_logits": logits, "pred_boxes": boxes}
    matcher = HungarianMatcher(cost_class=1.0, cost_bbox=5.0, cost_giou=2.0)
    matches = matcher(outputs, targets)
    for cost, (rows, cols), target in zip(
        matcher.cost_matrices(outputs, targets), matches, targets, strict=True
    ):
        t = len(target["labels"])
        assert len(rows) == len(cols) == t
        assert len(set(rows.tolist())) == t and sorted(cols.tolist()) == list(range(t))
        got = float(cost[rows, cols].sum())
        # Brute force: every injective map of targets to queries.
        best = min(
            (
                sum(float(cost[q, j]) for j, q in enumerate(perm))
                for perm in itertools.permutations(range(num_queries), t)
            ),
            default=0.0,
        )
        assert got == pytest.approx(best, abs=1e-5)


def test_losses_match_hand_computation() -> None:
    # Two queries, two real classes (+ no-object), one target of class 1.
    logits = torch.tensor([[[0.2, 1.5, -0.3], [0.1, -0.4, 0.9]]])
    pred = torch.tensor([[[0.50, 0.50, 0.40, 0.30], [0.20, 0.80, 0.10, 0.10]]])
    target_box = [0.45, 0.55, 0.30, 0.40]
    targets = [{"labels": torch.tensor([1]), "boxes": torch.tensor([target_box])}]
    eos = 0.1
    weights = build_weight_dict(1.0, 5.0, 2.0, num_aux=1)
    criterion = SetCriterion(2, HungarianMatcher(), weights, eos_coef=eos)
    aux = {"pred_logits": logits.flip(1), "pred_boxes": pred.flip(1)}  # same content, queries swapped
    losses = criterion({"pred_logits": logits, "pred_boxes": pred, "aux_outputs": [aux]}, targets)

    # Query 0 is the obvious match; query 1 must predict "no object" (class index 2, weight eos).
    logp = logits[0].log_softmax(-1)
    nll0, nll1 = -logp[0, 1].item(), -logp[1, 2].item()
    ce = (1.0 * nll0 + eos * nll1) / (1.0 + eos)
    l1 = sum(abs(a - b) for a, b in zip(pred[0, 0].tolist(), target_box, strict=True))  # num_boxes = 1
    giou = 1 - _giou_by_hand(_xyxy(pred[0, 0].tolist()), _xyxy(target_box))
    # Argmax of query 0 is class 1 (real), of query 1 is class 2 (no object): 1 predicted vs 1 target.
    assert losses["loss_ce"].item() == pytest.approx(ce, rel=1e-5)
    assert losses["loss_bbox"].item() == pytest.approx(l1, rel=1e-5)
    assert losses["loss_giou"].item() == pytest.approx(giou, rel=1e-5)
    assert losses["cardinality_error"].item() == 0.0
    # The auxiliary layer is matched on its own (swapped queries), so its losses are the same numbers.
    for key in ("loss_ce", "loss_bbox", "loss_giou"):
        assert losses[f"{key}_0"].item() == pytest.approx(losses[key].item(), rel=1e-5)
    total = criterion.total(losses).item()
    assert total == pytest.approx(2 * (ce + 5 * l1 + 2 * giou), rel=1e-5)
    assert math.isfinite(total)


def test_num_boxes_is_clamped_and_empty_targets_work() -> None:
    criterion = SetCriterion(2, HungarianMatcher(), build_weight_dict(1, 5, 2, 0))
    logits = torch.zeros(2, 3, 3, requires_grad=True)
    boxes = torch.full((2, 3, 4), 0.5, requires_grad=True)
    targets = [{"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)}] * 2
    assert criterion.num_boxes(targets, torch.device("cpu")) == 1.0
    losses = criterion({"pred_logits": logits, "pred_boxes": boxes}, targets)
    assert losses["loss_bbox"].item() == 0.0 and losses["loss_giou"].item() == 0.0
    # Uniform logits: every query's argmax is class 0 (a real class), so 3 predicted vs 0 true.
    assert losses["cardinality_error"].item() == 3.0
    criterion.total(losses).backward()
    assert logits.grad is not None
