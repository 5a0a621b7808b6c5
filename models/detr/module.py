"""LightningModule for DETR training and COCO evaluation."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from rpe import DEFAULT_PRESET

from .coco_eval import METRIC_NAMES, SIZE_CLASS_METRICS, evaluate_coco, gather_detections, to_coco_results
from .detr import DETR, HungarianMatcher, PostProcess, SetCriterion, build_weight_dict
from .hyperparameters import DETR_DEFAULTS as D
from .reference import load_reference_weights


def more_boxes_than_queries(dataset: Any, num_queries: int) -> str:
    """A warning when an image of ``dataset`` (a COCO dataset) has more ground-truth boxes than the model has
    queries: the matching pairs each box with one query, so the boxes beyond them are never predicted (and
    cap the AP), or ''."""
    coco = getattr(dataset, "coco", None)
    if coco is None:
        return ""
    counts = {image: sum(1 for a in anns if a.get("iscrowd", 0) == 0) for image, anns in coco.imgToAnns.items()}
    over = {image: n for image, n in counts.items() if n > num_queries}
    if not over:
        return ""
    image, most = max(over.items(), key=lambda item: item[1])
    return (f"{len(over)} image(s) of {dataset.ann_file} have more ground-truth boxes than model.num_queries="
            f"{num_queries} (image id {image}: {most}): the boxes beyond {num_queries} are never matched;"
            " raise model.num_queries")


class DetectionModule(L.LightningModule):
    """DETR with its set criterion, DETR's optimiser recipe, and COCO metrics on val and test.

    Batches are `data.coco.collate_detection` dicts. RPE for the encoder comes from ``rpe`` (what
    train.py passes from the ``rpe`` config group; not given: `rpe.DEFAULT_PRESET`, None: none) unless
    ``enc_rpe2d`` (the reference's flag, e.g. ``rpe-2.0-product-ctx-1-k``, or any spec `rpe.resolve_rpe`
    accepts) is set, which then wins.
    ``dec_self_rpe`` / ``dec_cross_rpe``: see `models.detr.transformer`.

    ``weights``: a DETR / DETR-iRPE checkpoint in the reference layout (`models.detr.reference`) whose
    weights replace the initial ones; the model built from the other arguments must fit it exactly.
    Its class rows decide ``num_classes``: the reference labels COCO classes by category id (91 rows
    plus "no object"), which evaluation then follows; weights whose class count differs from the data's
    are evaluated only, never trained on (`setup` refuses).
    """

    def __init__(
        self,
        rpe: Any = DEFAULT_PRESET,
        num_classes: int = 80,
        enc_rpe2d: Any = None,
        dec_self_rpe: Any = None,
        dec_cross_rpe: Any = None,
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
        set_cost_class: float = D.set_cost_class,
        set_cost_bbox: float = D.set_cost_bbox,
        set_cost_giou: float = D.set_cost_giou,
        ce_loss_coef: float = D.ce_loss_coef,
        bbox_loss_coef: float = D.bbox_loss_coef,
        giou_loss_coef: float = D.giou_loss_coef,
        eos_coef: float = D.eos_coef,
        lr: float = D.lr,
        lr_backbone: float = D.lr_backbone,
        weight_decay: float = D.weight_decay,
        lr_drop: int = D.lr_drop,
        lr_gamma: float = 0.1,
        weights: str | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        backbone = dict(backbone or {})
        if lr_backbone <= 0:  # DETR: a zero backbone lr freezes the whole backbone
            backbone["train_layers"] = ()
        model_kwargs: dict[str, Any] = dict(
            num_classes=num_classes,
            backbone=backbone,
            position_embedding=position_embedding,
            hidden_dim=hidden_dim,
            nheads=nheads,
            enc_layers=enc_layers,
            dec_layers=dec_layers,
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            num_queries=num_queries,
            pre_norm=pre_norm,
            aux_loss=aux_loss,
            enc_rpe=enc_rpe2d if enc_rpe2d is not None else rpe,
            dec_self_rpe=dec_self_rpe,
            dec_cross_rpe=dec_cross_rpe,
        )
        if weights is None:
            self.model = DETR(**model_kwargs)
        else:
            self.model = load_reference_weights(weights, model_kwargs)
            num_classes = self.model.num_classes
        matcher = HungarianMatcher(set_cost_class, set_cost_bbox, set_cost_giou)
        weights = build_weight_dict(
            ce_loss_coef, bbox_loss_coef, giou_loss_coef, dec_layers - 1 if aux_loss else 0
        )
        self.criterion = SetCriterion(num_classes, matcher, weights, eos_coef)
        self.postprocess = PostProcess()
        self._results: dict[int, list[dict]] = {}

    def forward(self, images: Tensor, mask: Tensor) -> dict[str, Any]:
        return self.model(images, mask)

    @staticmethod
    def check_datamodule(datamodule: Any) -> None:
        """Refuse data without COCO boxes before the first batch (it would be a TypeError deep in a step)."""
        if datamodule is not None and not hasattr(type(datamodule), "label_to_cat"):
            from models.deit import ModelConfigError

            raise ModelConfigError(
                f"the DETR model (DetectionModule) needs COCO-format detection data, but the data module is "
                f"{type(datamodule).__name__} (images with class labels); valid: data=shapes_coco or data=coco with"
                " a DETR model, or a classification model (model=deit_micro, swin_micro, ...) with this data"
            )

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        self.check_datamodule(datamodule)
        for name in ("train_set", "val_set"):
            warning = more_boxes_than_queries(getattr(datamodule, name, None), self.hparams.num_queries)
            if warning:
                rank_zero_warn(warning)
        classes = getattr(datamodule, "num_classes", None)
        if stage == "fit" and self.hparams.weights is not None and classes != self.model.num_classes:
            from models.deit import ModelConfigError

            raise ModelConfigError(
                f"model.weights={self.hparams.weights} has {self.model.num_classes} classes (reference layout:"
                f" labels are category ids), the data has {classes}; such weights can be evaluated"
                " (eval.py), not trained on"
            )

    # ------------------------------------------------------------------ training
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        outputs = self.model(batch["images"], batch["mask"])
        losses = self.criterion(outputs, batch["targets"])
        loss = self.criterion.total(losses)
        bs = len(batch["targets"])
        self.log("train/loss", loss, prog_bar=True, batch_size=bs)
        for key in ("loss_ce", "loss_bbox", "loss_giou", "cardinality_error"):
            self.log(f"train/{key}", losses[key], batch_size=bs)
        groups = self.optimizers().param_groups if self._trainer is not None else []
        for group in groups:
            self.log(f"train/lr_{group['name']}", group["lr"], batch_size=bs)
        return loss

    # ------------------------------------------------------------------ evaluation
    def _eval_step(self, batch: dict[str, Any]) -> None:
        outputs = self.model(batch["images"], batch["mask"])
        targets = batch["targets"]
        sizes = torch.stack([t["orig_size"] for t in targets])
        detections = self.postprocess(outputs, sizes)
        ids = [int(t["image_id"]) for t in targets]
        label_to_cat = self._label_to_cat()
        for image_id, det in zip(ids, detections, strict=True):
            # Keyed by image: an image read twice would count once here (see `gather_detections`).
            self._results[image_id] = to_coco_results([det], [image_id], label_to_cat)

    def _label_to_cat(self) -> list[int]:
        """Category id of each label: the dataset's contiguous labels, or (a reference-layout model with
        ``max category id + 1`` classes) the label itself."""
        cats = self._eval_dataset().label_to_cat
        if self.model.num_classes == len(cats):
            return cats
        if self.model.num_classes > max(cats, default=-1):
            return list(range(self.model.num_classes))
        from models.deit import ModelConfigError

        raise ModelConfigError(
            f"the model has {self.model.num_classes} classes, the data {len(cats)} (category ids"
            f" {cats[0]}..{cats[-1]}); expected {len(cats)} or more than {cats[-1]} (labels = category ids)"
        )

    def _eval_dataset(self) -> Any:
        """The dataset being evaluated (carries ``coco`` and ``label_to_cat``)."""
        loaders = self.trainer.test_dataloaders if self.trainer.testing else self.trainer.val_dataloaders
        loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
        return loader.dataset

    def _eval_epoch_end(self) -> None:
        merged = gather_detections(self._results)
        self._results = {}
        # Every rank evaluates the same merged results, so the logged numbers agree without a sync.
        results = [r for per_image in merged.values() for r in per_image]
        stats = evaluate_coco(self._eval_dataset().coco, results, image_ids=merged.keys())
        for name in METRIC_NAMES:
            # A size-class statistic without a ground-truth box of its size is no number, so it is not logged
            # (eval.py names it); AP is always logged: NaN there means no ground truth at all, which is no result.
            if name == "AP" or math.isfinite(stats[name]):
                self.log(f"val/{name}", stats[name], prog_bar=name in ("AP", "AP50"), sync_dist=False)

    @property
    def validation_metrics(self) -> tuple[str, ...]:
        """The names every validation epoch logs (what a checkpoint callback may monitor). The size-class
        statistics (APs .. ARl) are left out: they are logged only where the split has a box of their size."""
        return tuple(f"val/{name}" for name in METRIC_NAMES if name not in SIZE_CLASS_METRICS)

    @property
    def size_class_metrics(self) -> tuple[str, ...]:
        """The statistics of one object size (APs .. ARl), logged only where the split has a box of that size."""
        return tuple(f"val/{name}" for name in SIZE_CLASS_METRICS)

    def on_validation_epoch_start(self) -> None:
        self._results = {}

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch)

    def on_validation_epoch_end(self) -> None:
        self._eval_epoch_end()

    def on_test_epoch_start(self) -> None:
        self._results = {}

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch)

    def on_test_epoch_end(self) -> None:
        self._eval_epoch_end()

    # ------------------------------------------------------------------ optimisation
    def configure_optimizers(self) -> dict[str, Any]:
        """AdamW with a separate backbone lr, and a step decay at epoch ``lr_drop`` (DETR's recipe)."""
        hp = self.hparams
        backbone = [
            p for n, p in self.model.named_parameters() if n.startswith("backbone.") and p.requires_grad
        ]
        rest = [
            p for n, p in self.model.named_parameters() if not n.startswith("backbone.") and p.requires_grad
        ]
        groups = [{"params": rest, "lr": hp.lr, "name": "transformer"}]
        if backbone:
            groups.append({"params": backbone, "lr": hp.lr_backbone, "name": "backbone"})
        optimizer = torch.optim.AdamW(groups, lr=hp.lr, weight_decay=hp.weight_decay)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=hp.lr_drop, gamma=hp.lr_gamma)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}
