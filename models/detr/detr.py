"""DETR: the detector, the Hungarian matcher, the set criterion and the post-processor.

Conventions (DETR's): ``num_classes`` real classes with contiguous labels 0..C-1, logits have C+1
entries, the last one is "no object". Boxes are normalised (cx, cy, w, h) in [0, 1] relative to the
unpadded, transformed image.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn
from torchvision.ops import box_convert, generalized_box_iou

from rpe import DEFAULT_PRESET

from .backbone import build_backbone, build_position_encoding
from .hyperparameters import DETR_DEFAULTS as D
from .transformer import Transformer


def cxcywh_to_xyxy(boxes: Tensor) -> Tensor:
    """(..., 4) cxcywh -> (..., 4) xyxy."""
    return box_convert(boxes, "cxcywh", "xyxy")


class MLP(nn.Module):
    """``num_layers`` linear layers with ReLU between them (DETR's box head)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int) -> None:
        super().__init__()
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))

    def forward(self, x: Tensor) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.relu(x)
        return x


class DETR(nn.Module):
    """Backbone -> 1x1 projection -> transformer -> class and box heads for every decoder layer.

    ``enc_rpe``: the encoder's RPE (not given: `rpe.DEFAULT_PRESET`; None: none, the DETR reference's model).
    """

    def __init__(
        self,
        num_classes: int,
        backbone: dict[str, Any] | None = None,
        position_embedding: str = D.position_embedding,
        hidden_dim: int = D.hidden_dim,
        nheads: int = D.nheads,
        enc_layers: int = D.enc_layers,
        dec_layers: int = D.dec_layers,
        dim_feedforward: int = D.dim_feedforward,
        dropout: float = D.dropout,
        num_queries: int = D.num_queries,
        pre_norm: bool = D.pre_norm,
        aux_loss: bool = D.aux_loss,
        enc_rpe: Any = DEFAULT_PRESET,
        dec_self_rpe: Any = None,
        dec_cross_rpe: Any = None,
    ) -> None:
        super().__init__()
        self.backbone = build_backbone(**(backbone or {}))
        self.position_embedding = build_position_encoding(position_embedding, hidden_dim)
        self.transformer = Transformer(
            hidden_dim,
            nheads,
            enc_layers,
            dec_layers,
            dim_feedforward,
            dropout,
            pre_norm,
            enc_rpe,
            dec_self_rpe,
            dec_cross_rpe,
        )
        self.input_proj = nn.Conv2d(self.backbone.num_channels, hidden_dim, kernel_size=1)
        self.query_embed = nn.Embedding(num_queries, hidden_dim)
        self.class_embed = nn.Linear(hidden_dim, num_classes + 1)
        self.bbox_embed = MLP(hidden_dim, hidden_dim, 4, 3)
        self.num_classes = num_classes
        self.aux_loss = aux_loss

    def forward(self, images: Tensor, mask: Tensor) -> dict[str, Any]:
        """images (B, 3, H, W), mask (B, H, W) True on padding.

        Returns ``pred_logits`` (B, Q, C+1), ``pred_boxes`` (B, Q, 4) normalised cxcywh, and with
        ``aux_loss`` an ``aux_outputs`` list (one dict per earlier decoder layer).
        """
        feats, fmask = self.backbone(images, mask)
        pos = self.position_embedding(fmask).to(feats.dtype)
        states, _ = self.transformer(self.input_proj(feats), fmask, self.query_embed.weight, pos)
        logits = self.class_embed(states)  # (L, B, Q, C+1)
        boxes = self.bbox_embed(states).sigmoid()  # (L, B, Q, 4)
        out: dict[str, Any] = {"pred_logits": logits[-1], "pred_boxes": boxes[-1]}
        if self.aux_loss:
            out["aux_outputs"] = [
                {"pred_logits": a, "pred_boxes": b} for a, b in zip(logits[:-1], boxes[:-1], strict=True)
            ]
        return out


class HungarianMatcher(nn.Module):
    """One-to-one assignment of predictions to targets minimising DETR's matching cost.

    cost = cost_class * (-p(target class)) + cost_bbox * L1(cxcywh) + cost_giou * (-GIoU(xyxy)).
    """

    def __init__(
        self,
        cost_class: float = D.set_cost_class,
        cost_bbox: float = D.set_cost_bbox,
        cost_giou: float = D.set_cost_giou,
    ) -> None:
        super().__init__()
        if cost_class == 0 and cost_bbox == 0 and cost_giou == 0:
            raise ValueError("all matching costs are zero")
        self.cost_class, self.cost_bbox, self.cost_giou = cost_class, cost_bbox, cost_giou

    @torch.no_grad()
    def cost_matrices(self, outputs: dict[str, Tensor], targets: list[dict[str, Tensor]]) -> list[Tensor]:
        """Per image, the (Q, T_b) cost matrix of predictions versus that image's targets."""
        prob = outputs["pred_logits"].float().softmax(-1)  # (B, Q, C+1)
        boxes = outputs["pred_boxes"].float()  # (B, Q, 4)
        costs = []
        for b, t in enumerate(targets):
            labels, tboxes = t["labels"], t["boxes"].float()
            c_class = -prob[b][:, labels]  # (Q, T): the probability term; constant 1 dropped
            c_bbox = torch.cdist(boxes[b], tboxes, p=1)
            c_giou = -generalized_box_iou(cxcywh_to_xyxy(boxes[b]), cxcywh_to_xyxy(tboxes))
            costs.append(self.cost_class * c_class + self.cost_bbox * c_bbox + self.cost_giou * c_giou)
        return costs

    @torch.no_grad()
    def forward(
        self, outputs: dict[str, Tensor], targets: list[dict[str, Tensor]]
    ) -> list[tuple[Tensor, Tensor]]:
        """outputs: ``pred_logits`` (B, Q, C+1), ``pred_boxes`` (B, Q, 4);
        targets: per image ``labels`` (T_b,), ``boxes`` (T_b, 4).

        Returns per image ``(pred_idx, target_idx)``, int64 tensors of length min(Q, T_b).
        """
        matches = []
        for cost in self.cost_matrices(outputs, targets):
            rows, cols = linear_sum_assignment(cost.cpu().numpy())
            matches.append(
                (torch.as_tensor(rows, dtype=torch.int64), torch.as_tensor(cols, dtype=torch.int64))
            )
        return matches


class SetCriterion(nn.Module):
    """DETR's set loss: match, then classification, box and cardinality terms (for every decoder layer).

    ``weight_dict`` maps loss names (``loss_ce``, ``loss_bbox``, ``loss_giou`` and their ``_{i}``
    auxiliary copies) to weights; `total` sums the weighted entries that are present.
    """

    def __init__(
        self,
        num_classes: int,
        matcher: HungarianMatcher,
        weight_dict: dict[str, float],
        eos_coef: float = D.eos_coef,
        losses: tuple[str, ...] | list[str] = ("labels", "boxes", "cardinality"),
    ) -> None:
        super().__init__()
        unknown = set(losses) - {"labels", "boxes", "cardinality"}
        if unknown:
            raise ValueError(f"unknown losses {sorted(unknown)}; expected labels, boxes, cardinality")
        self.num_classes = num_classes
        self.matcher = matcher
        self.weight_dict = dict(weight_dict)
        self.eos_coef = eos_coef
        self.losses = list(losses)
        # Down-weight "no object" in the cross-entropy: most queries are unmatched.
        weight = torch.ones(num_classes + 1)
        weight[-1] = eos_coef
        self.register_buffer("empty_weight", weight)

    @staticmethod
    def _matched(indices: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
        """(batch index, prediction index) of every matched prediction, concatenated over images."""
        batch = torch.cat([torch.full_like(src, i) for i, (src, _) in enumerate(indices)])
        src = torch.cat([src for src, _ in indices])
        return batch, src

    def loss_labels(self, outputs, targets, indices, num_boxes: float) -> dict[str, Tensor]:
        """Weighted cross-entropy over all queries; unmatched ones target the no-object class."""
        logits = outputs["pred_logits"]  # (B, Q, C+1)
        target_classes = torch.full(
            logits.shape[:2], self.num_classes, dtype=torch.int64, device=logits.device
        )
        bidx, qidx = self._matched(indices)
        target_classes[bidx, qidx] = torch.cat(
            [t["labels"][j] for t, (_, j) in zip(targets, indices, strict=True)]
        )
        # F.cross_entropy with class weights normalises by the sum of the weights, as DETR does.
        loss = F.cross_entropy(logits.float().transpose(1, 2), target_classes, self.empty_weight)
        return {"loss_ce": loss}

    @torch.no_grad()
    def loss_cardinality(self, outputs, targets, indices, num_boxes: float) -> dict[str, Tensor]:
        """|number of non-"no object" predictions - number of targets|, averaged over images (a log only)."""
        logits = outputs["pred_logits"]
        predicted = (logits.argmax(-1) != logits.shape[-1] - 1).sum(1).float()
        counts = torch.as_tensor(
            [len(t["labels"]) for t in targets], dtype=torch.float32, device=logits.device
        )
        return {"cardinality_error": F.l1_loss(predicted, counts)}

    def loss_boxes(self, outputs, targets, indices, num_boxes: float) -> dict[str, Tensor]:
        """L1 on normalised cxcywh and 1 - GIoU on xyxy of matched pairs, each summed / num_boxes."""
        bidx, qidx = self._matched(indices)
        src = outputs["pred_boxes"][bidx, qidx].float()
        tgt = torch.cat([t["boxes"][j] for t, (_, j) in zip(targets, indices, strict=True)]).float()
        l1 = F.l1_loss(src, tgt, reduction="none").sum() / num_boxes
        giou = torch.diag(generalized_box_iou(cxcywh_to_xyxy(src), cxcywh_to_xyxy(tgt)))
        return {"loss_bbox": l1, "loss_giou": (1 - giou).sum() / num_boxes}

    def num_boxes(self, targets: list[dict[str, Tensor]], device: torch.device) -> float:
        """Targets per rank, averaged over DDP ranks (all-reduced) and clamped at >= 1."""
        n = torch.as_tensor([float(sum(len(t["labels"]) for t in targets))], device=device)
        world = 1
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(n)
            world = dist.get_world_size()
        return torch.clamp(n / world, min=1).item()

    def forward(self, outputs: dict[str, Any], targets: list[dict[str, Tensor]]) -> dict[str, Tensor]:
        """outputs: ``pred_logits`` (B, Q, C+1), ``pred_boxes`` (B, Q, 4), optional ``aux_outputs``.

        targets: per image ``labels`` (T_b,) int64 and ``boxes`` (T_b, 4) normalised cxcywh.
        Returns unweighted losses; auxiliary ones carry the suffix ``_{i}`` (layer i).
        """
        num_boxes = self.num_boxes(targets, outputs["pred_logits"].device)
        levels = [("", outputs)] + [(f"_{i}", aux) for i, aux in enumerate(outputs.get("aux_outputs", []))]
        losses: dict[str, Tensor] = {}
        fns = {"labels": self.loss_labels, "boxes": self.loss_boxes, "cardinality": self.loss_cardinality}
        for suffix, out in levels:
            indices = self.matcher(out, targets)  # each decoder layer gets its own matching
            for name in self.losses:
                for key, value in fns[name](out, targets, indices, num_boxes).items():
                    losses[key + suffix] = value
        return losses

    def total(self, losses: dict[str, Tensor]) -> Tensor:
        """The weighted sum of the losses named in ``weight_dict``."""
        return sum(losses[k] * w for k, w in self.weight_dict.items() if k in losses)


def build_weight_dict(ce: float, bbox: float, giou: float, num_aux: int) -> dict[str, float]:
    """DETR's loss weights for the final layer plus ``num_aux`` auxiliary layers."""
    base = {"loss_ce": ce, "loss_bbox": bbox, "loss_giou": giou}
    out = dict(base)
    for i in range(num_aux):
        out.update({f"{k}_{i}": v for k, v in base.items()})
    return out


class PostProcess(nn.Module):
    """Model outputs -> per-image ``scores``, ``labels`` (contiguous) and absolute xyxy ``boxes``."""

    @torch.no_grad()
    def forward(self, outputs: dict[str, Tensor], target_sizes: Tensor) -> list[dict[str, Tensor]]:
        """outputs as from `DETR`; target_sizes (B, 2) as (height, width) of the original images.

        Every query yields one detection: its best real class (no-object excluded) and that score.
        Scaling normalised boxes by the original size is exact because resizing keeps aspect ratio.
        """
        prob = outputs["pred_logits"].float().softmax(-1)[..., :-1]
        scores, labels = prob.max(-1)
        boxes = cxcywh_to_xyxy(outputs["pred_boxes"].float())
        h, w = target_sizes.float().unbind(1)
        boxes = boxes * torch.stack([w, h, w, h], dim=1)[:, None, :]
        return [
            {"scores": s, "labels": lab, "boxes": b} for s, lab, b in zip(scores, labels, boxes, strict=True)
        ]
