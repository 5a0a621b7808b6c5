"""Image classification as a LightningModule, assembled from timm's recipe pieces.

The DeiT recipe (docs/design.md, section 5): AdamW with lr scaled by total batch / 512, a per-step cosine
schedule with linear warm-up, mixup/cutmix with label smoothing (SoftTargetCrossEntropy), drop-path,
an optional EMA of the weights that is evaluated too, and weight-decay groups as in the reference
(no decay for biases, norms, ``pos_embed`` and ``cls_token``; RPE tables are decayed).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from timm.utils import ModelEmaV3
from torchmetrics import Metric
from torchmetrics.classification import MulticlassAccuracy

from models.config_defaults import model_config
from models.errors import BackboneOptionError, ModelConfigError
from models.factory import create_model
from rpe import DEFAULT_PRESET
from rpe.base import position_parameters

# What model.optimizer and model.scheduler may set, with the values a key left out takes: the DeiT recipe's, as
# configs/model/_classification.yaml writes them (their one home; the command line runs that file).
# pos_lr_scale / pos_weight_decay: the learning budget of the position parameters (`position_groups`); 1.0 and
# null keep the reference recipe's groups.
_RECIPE = model_config("_classification")
OPTIMIZER_DEFAULTS: dict[str, Any] = {**_RECIPE["optimizer"], "pos_lr_scale": 1.0, "pos_weight_decay": None}
SCHEDULER_DEFAULTS: dict[str, Any] = dict(_RECIPE["scheduler"])


def _settings(node: str, given: dict[str, Any] | None, defaults: dict[str, Any], what: str) -> dict[str, Any]:
    """``defaults`` updated by ``given``; a key the module never reads is one line naming it."""
    for key in given or {}:
        if key not in defaults:
            raise ModelConfigError(f"model.{node}.{key} is not a setting of {what}; valid keys of model.{node}:"
                                   f" {', '.join(defaults)}")
    return {**defaults, **(given or {})}


def position_groups(net: nn.Module, weight_decay: float, pos_lr_scale: float = 1.0,
                    pos_weight_decay: float | None = None) -> nn.Module | list[dict[str, Any]]:
    """The optimizer's parameter groups: the reference's weight-decay groups (no decay for biases, norms and
    the names ``net.no_weight_decay()`` lists), each split into its position parameters
    (`rpe.base.position_parameters`) and the rest. The position part of a group learns at ``pos_lr_scale``
    times the scheduled lr (timm's schedulers honour a group's ``lr_scale``) and decays by ``pos_weight_decay``
    where that is set.

    Why a budget of their own: AdamW moves every entry by about the lr per step whatever its gradient, so an
    entry can travel at most the sum of the scheduled lrs (a few tenths over a few hundred steps at 1e-3). A bias table
    that starts at zero must travel several units to change attention odds by much, a learned APE to move its
    codes apart; a weight matrix needs no such distance. One multiplier for every position parameter of every
    encoding gives them all the same budget. ``net`` itself is returned when the budget is the reference's
    (1.0, null): timm then builds the groups as it always has."""
    if pos_lr_scale == 1.0 and pos_weight_decay is None:
        return net
    from timm.optim import param_groups_weight_decay

    no_decay = net.no_weight_decay() if hasattr(net, "no_weight_decay") else ()
    position = {id(p) for p in position_parameters(net)}
    groups: list[dict[str, Any]] = []
    for group in param_groups_weight_decay(net, weight_decay, no_weight_decay_list=no_decay):
        params = list(group["params"])
        rest = [p for p in params if id(p) not in position]
        own = [p for p in params if id(p) in position]
        if rest:
            groups.append({**group, "params": rest})
        if own:
            decay = group["weight_decay"] if pos_weight_decay is None else pos_weight_decay
            groups.append({**group, "params": own, "weight_decay": decay, "lr_scale": pos_lr_scale})
    return groups


class MeanOverImages(Metric):
    """The mean of a per-image loss over every image of an evaluation, on any number of ranks: each batch's mean
    times its size, and the image count, both summed over the ranks. (Lightning's ``sync_dist`` averaged the
    ranks' means, which weights a rank with fewer images as much as one with more.) On one process it is what
    Lightning's epoch mean computed, to the bit. Not torchmetrics' ``MeanMetric``: with NaNs kept
    (``nan_strategy="disable"``) its 1.9 release drops the weights, and its other strategies drop a NaN loss or
    raise on it, where a NaN evaluation must stay NaN for the lifecycle to refuse it."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("images", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, batch_mean: torch.Tensor, images: int) -> None:
        """``batch_mean`` (): the loss averaged over the batch's ``images``."""
        self.total += batch_mean.detach().float() * images
        self.images += images

    def compute(self) -> torch.Tensor:
        return self.total / self.images


def check_data_given_options(net: Mapping[str, Any]) -> None:
    """Refuse backbone options the data decide, in one line naming the key: ``num_classes`` (the data's class
    folders; timm said "got multiple values for keyword argument") and ``in_chans`` other than 3 (every image is
    read as RGB; the first convolution failed at the first batch, after the run dir was made)."""
    if "num_classes" in net:
        raise ModelConfigError(f"model.net.num_classes={net['num_classes']} is not a setting: the number of classes"
                               " comes from the data (its class folders); valid: drop it")
    if net.get("in_chans", 3) != 3:
        raise ModelConfigError(f"model.net.in_chans={net['in_chans']} does not fit the data: every image is read as"
                               " RGB, 3 channels; valid: drop it (or model.net.in_chans=3)")


class ClassificationModule(L.LightningModule):
    """Train and evaluate ``net`` on ``(images (B, 3, H, W), labels (B,))`` batches.

    Args:
        net: ``{name: <backbone name>, **backbone kwargs}`` for :func:`models.create_model`.
        rpe: relative position encoding (preset name, shorthand, dict, ``RPEConfig``; None: none); not given:
            `rpe.DEFAULT_PRESET`.
        num_classes: classes of the dataset (the head is built for it).
        optimizer: ``lr`` (at ``lr_base_batch``), ``lr_base_batch``, ``weight_decay``, ``betas``, ``eps``,
            ``pos_lr_scale`` and ``pos_weight_decay`` (the position parameters' budget, `position_groups`); a key
            left out takes its `OPTIMIZER_DEFAULTS` value.
        scheduler: ``warmup_epochs``, ``warmup_lr``, ``min_lr`` (not batch-scaled, as in DeiT); a key left out
            takes its `SCHEDULER_DEFAULTS` value.
        mixup: kwargs of ``timm.data.Mixup`` or None; its ``label_smoothing`` then applies.
        label_smoothing: used when mixup is off.
        ema_decay: decay of the weight EMA; None turns EMA off.
        compile: ``torch.compile`` the backbone (keeps parameter names).
    """

    # The keys of each mapping argument, for the up-front config check (`lifecycle.settings`).
    NESTED_SETTINGS = {"optimizer": tuple(OPTIMIZER_DEFAULTS), "scheduler": tuple(SCHEDULER_DEFAULTS)}

    def __init__(
        self,
        net: dict[str, Any],
        rpe: Any = DEFAULT_PRESET,
        num_classes: int = 1000,
        optimizer: dict[str, Any] | None = None,
        scheduler: dict[str, Any] | None = None,
        mixup: dict[str, Any] | None = None,
        label_smoothing: float = 0.0,
        ema_decay: float | None = None,
        compile: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        net = dict(net)
        name = net.pop("name")
        check_data_given_options(net)
        try:
            self.net = create_model(name, rpe=rpe, num_classes=num_classes, **net)
        except ModelConfigError as err:  # an option the backbone does not take: name it by its config key
            if " is not an option of backbone " in str(err):
                raise ModelConfigError(f"model.net.{err}") from None
            if isinstance(err, BackboneOptionError):  # options that do not fit each other: by their config keys
                raise ModelConfigError(err.named("model.net.")) from None
            raise
        self.optimizer_cfg = _settings("optimizer", optimizer, OPTIMIZER_DEFAULTS, "AdamW")
        self.scheduler_cfg = _settings("scheduler", scheduler, SCHEDULER_DEFAULTS, "the warm-up + cosine schedule")
        self.mixup = Mixup(**{**mixup, "num_classes": num_classes}) if mixup else None
        self.train_loss = SoftTargetCrossEntropy() if self.mixup else nn.CrossEntropyLoss(
            label_smoothing=label_smoothing)
        self.ema = ModelEmaV3(self.net, decay=ema_decay) if ema_decay else None
        self.eval_loss = MeanOverImages()
        # Top-5 of 5 classes or fewer is 100 % by construction, so such a task has no top-5 metric.
        accuracies = {"top1": 1, **({"top5": 5} if num_classes > 5 else {})}
        self.metrics = nn.ModuleDict({
            prefix: nn.ModuleDict({name: MulticlassAccuracy(num_classes, top_k=k, average="micro")
                                   for name, k in accuracies.items()})
            for prefix in (["val", "val_ema"] if self.ema else ["val"])
        })
        if compile:
            self.net.compile()
        self._step_started: float | None = None

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``images (B, 3, H, W)`` -> logits ``(B, num_classes)``."""
        return self.net(images)

    # ---------------------------------------------------------------- training
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._step_started = time.perf_counter()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        targets = labels
        if self.mixup is not None:
            images, targets = self.mixup(images, labels)
        loss = self.train_loss(self(images), targets)
        self.log("train/loss", loss, prog_bar=True)
        self.log("lr", self.optimizers().param_groups[0]["lr"], prog_bar=False)
        return loss

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        # Here, not in on_train_batch_end: callbacks (checkpoints) run before the module's batch-end
        # hook, so a checkpoint taken there would miss this step's EMA update.
        if self.ema is not None:
            self.ema.update(self.net, step=self.global_step + 1)  # global_step counts this step after the hook

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._step_started is not None:
            images_per_s = len(batch[0]) * self.trainer.world_size / (time.perf_counter() - self._step_started)
            self.log("train/img_per_s", images_per_s)

    # -------------------------------------------------------------- evaluation
    @property
    def validation_metrics(self) -> tuple[str, ...]:
        """The names every validation epoch logs (what a checkpoint callback may monitor)."""
        return ("val/loss", *(f"{prefix}/{name}" for prefix, metrics in self.metrics.items() for name in metrics))

    def _eval_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        images, labels = batch
        logits = self(images)
        self.eval_loss.update(F.cross_entropy(logits, labels), len(labels))
        outputs = {"val": logits}
        if self.ema is not None:
            outputs["val_ema"] = self.ema.module(images)
        for prefix, prefix_logits in outputs.items():
            for metric in self.metrics[prefix].values():
                metric.update(prefix_logits, labels)

    def _log_eval_epoch(self) -> None:
        # torchmetrics syncs across ranks in compute(); papers report percent.
        self.log("val/loss", self.eval_loss.compute())
        self.eval_loss.reset()
        for prefix, metrics in self.metrics.items():
            for name, metric in metrics.items():
                self.log(f"{prefix}/{name}", metric.compute() * 100.0, prog_bar=name == "top1")
                metric.reset()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._eval_step(batch)

    def on_validation_epoch_end(self) -> None:
        self._log_eval_epoch()

    # ``trainer.test`` evaluates the validation split (ImageNet has no public test labels) and logs
    # under the same ``val/`` names, so metrics.json holds the best checkpoint's numbers.
    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._eval_step(batch)

    def on_test_epoch_end(self) -> None:
        self._log_eval_epoch()

    # ----------------------------------------------------------- optimisation
    def effective_lr(self) -> float:
        """``lr * total_batch / lr_base_batch`` with total batch over devices and accumulation."""
        total_batch = (
            self.trainer.datamodule.batch_size * self.trainer.world_size * self.trainer.accumulate_grad_batches
        )
        return self.optimizer_cfg["lr"] * total_batch / self.optimizer_cfg["lr_base_batch"]

    def configure_optimizers(self) -> dict[str, Any]:
        cfg = self.optimizer_cfg
        lr = self.effective_lr()
        optimizer = create_optimizer_v2(
            position_groups(self.net, cfg["weight_decay"], cfg["pos_lr_scale"], cfg["pos_weight_decay"]),
            opt="adamw", lr=lr, weight_decay=cfg["weight_decay"], betas=tuple(cfg["betas"]), eps=cfg["eps"],
            # one multi-tensor update instead of a loop over the parameters: the same values bit for bit
            # (tests/test_models.py), faster for the many small tensors of a ViT on CPU
            foreach=True,
        )
        total_steps = max(1, int(self.trainer.estimated_stepping_batches))
        steps_per_epoch = max(1, total_steps // max(1, self.trainer.max_epochs or 1))
        sched = self.scheduler_cfg
        scheduler = CosineLRScheduler(
            optimizer,
            t_initial=total_steps,
            lr_min=sched["min_lr"],
            warmup_t=int(sched["warmup_epochs"] * steps_per_epoch),
            warmup_lr_init=sched["warmup_lr"],
            t_in_epochs=False,
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def lr_scheduler_step(self, scheduler: CosineLRScheduler, metric: Any = None) -> None:
        # timm schedulers are stateless in the step count, so resuming lands on the exact lr.
        scheduler.step_update(num_updates=self.global_step)
