"""DETR detection with relative position encodings in the encoder (iRPE; docs/design.md).

Public API:
    DETR, HungarianMatcher, SetCriterion, PostProcess, build_weight_dict -- the detector and its loss
    Transformer, Attention, DecoderCrossRPEError                         -- the transformer and its RPE sites
    DetectionModule                                                      -- the LightningModule (Hydra target)
    evaluate_coco, to_coco_results, gather_detections, METRIC_NAMES      -- COCO evaluation in percent
    from_reference_checkpoint, to_reference_checkpoint                   -- DETR / DETR-iRPE reference-layout files
"""

from .coco_eval import METRIC_NAMES, evaluate_coco, gather_detections, to_coco_results
from .detr import DETR, HungarianMatcher, PostProcess, SetCriterion, build_weight_dict
from .module import DetectionModule
from .reference import ReferenceCheckpointError, from_reference_checkpoint, to_reference_checkpoint
from .transformer import Attention, DecoderCrossRPEError, Transformer

__all__ = [
    "DETR",
    "METRIC_NAMES",
    "Attention",
    "DecoderCrossRPEError",
    "DetectionModule",
    "HungarianMatcher",
    "ReferenceCheckpointError",
    "PostProcess",
    "SetCriterion",
    "Transformer",
    "build_weight_dict",
    "evaluate_coco",
    "from_reference_checkpoint",
    "gather_detections",
    "to_coco_results",
    "to_reference_checkpoint",
]
