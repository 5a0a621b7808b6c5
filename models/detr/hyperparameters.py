"""DETR's hyperparameters: one home for their defaults.

The defaults are DETR-R50's, as ``configs/model/detr_r50.yaml`` writes them (what the command line trains);
`DETR`, `Transformer`, `HungarianMatcher`, `SetCriterion`, `DetectionModule` and the backbones take their
keyword defaults from `DETR_DEFAULTS` and `BACKBONE_DEFAULTS`, read from that file, so a default is changed
in the yaml alone. ``configs/model/detr_small.yaml`` holds only what differs from it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from models.config_defaults import config_section

CONFIG = "detr_r50"


@dataclass(frozen=True)
class DETRHyperparameters:
    """The architecture, loss and optimiser settings of `DetectionModule` (docs/design.md, section 5)."""

    position_embedding: str
    hidden_dim: int
    nheads: int
    enc_layers: int
    dec_layers: int
    dim_feedforward: int
    dropout: float
    num_queries: int
    pre_norm: bool
    aux_loss: bool
    set_cost_class: float
    set_cost_bbox: float
    set_cost_giou: float
    ce_loss_coef: float
    bbox_loss_coef: float
    giou_loss_coef: float
    eos_coef: float
    lr: float
    lr_backbone: float
    weight_decay: float
    lr_drop: int


@dataclass(frozen=True)
class BackboneDefaults:
    """`models.detr.backbone.build_backbone`'s options (``model.backbone``): a ResNet's, and tiny's widths."""

    name: str
    norm: str
    train_layers: tuple[str, ...]
    return_layer: str
    checkpoint: str | None
    channels: tuple[int, ...]
    stem_stride: int


def _load(cls: type, section: str | None = None) -> Any:
    names = tuple(field.name for field in dataclasses.fields(cls))
    values = config_section(CONFIG, names, section)
    return cls(**{key: tuple(value) if isinstance(value, list) else value for key, value in values.items()})


DETR_DEFAULTS: DETRHyperparameters = _load(DETRHyperparameters)
BACKBONE_DEFAULTS: BackboneDefaults = _load(BackboneDefaults, "backbone")
