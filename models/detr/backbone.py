"""Convolutional backbones and absolute position encodings for DETR.

Images arrive as a padded batch ``images`` (B, 3, H, W) with ``mask`` (B, H, W), True on padding
(DETR's NestedTensor convention). A backbone returns the feature map (B, C, h, w) and the mask
downsampled to (B, h, w); a position encoding turns that mask into (B, D, h, w).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torchvision
from torch import Tensor, nn
from torchvision.ops import FrozenBatchNorm2d

from models.errors import ModelConfigError
from storage.files import missing_file

from .hyperparameters import BACKBONE_DEFAULTS, DETR_DEFAULTS

RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101")
BACKBONES = (*RESNETS, "tiny")
RESNET_NORMS = ("frozen_bn", "bn")
RESNET_STAGES = ("layer1", "layer2", "layer3", "layer4")
# The model configs share one backbone block (configs/model/detr_r50.yaml), so a ResNet config carries the
# tiny-only options at these values and a tiny one the ResNet-only options: only these values (or null) are
# accepted for the options the chosen backbone does not use (tiny: norm bn, return_layer layer4, checkpoint
# null); anything else is refused, never ignored.
TINY_DEFAULTS = {"channels": list(BACKBONE_DEFAULTS.channels), "stem_stride": BACKBONE_DEFAULTS.stem_stride}
# tiny is trained from scratch: all of it learns unless train_layers says otherwise
TINY_TRAIN_LAYERS = ("all",)


class BackboneConfigError(ModelConfigError):
    """A bad ``model.backbone.*`` option; one line naming the option, its value and what the backbone accepts."""


def _stage_list(train_layers: object) -> list[str]:
    """``train_layers`` as a list of names (one name may be given bare); anything else is refused."""
    if train_layers is None:
        return []
    if isinstance(train_layers, str):
        return [train_layers]
    try:
        layers = list(train_layers)  # type: ignore[call-overload]
    except TypeError:
        layers = None
    if layers is None or not all(isinstance(x, str) for x in layers):
        raise BackboneConfigError(
            f"model.backbone.train_layers={train_layers!r} is not a list of stage names (e.g. [layer2, layer3])"
        )
    return layers


def check_train_layers(train_layers: list[str], stages: list[str], backbone: str) -> None:
    """Every entry of ``train_layers`` names one of ``stages`` (or is ``all``): a typo would freeze silently."""
    valid = [*stages, "all"]
    unknown = [x for x in train_layers if x not in valid]
    if unknown:
        raise BackboneConfigError(
            f"model.backbone.train_layers={list(train_layers)}: {', '.join(unknown)} "
            f"{'is not a stage' if len(unknown) == 1 else 'are not stages'} of the {backbone} backbone; "
            f"valid entries: {', '.join(valid)} (an empty list freezes the whole backbone)"
        )


class ResNetBackbone(nn.Module):
    """A torchvision ResNet cut after ``return_layer``, built with ``weights=None`` (no download).

    ``norm="frozen_bn"`` is DETR's setting (statistics and affine frozen, meant for a pretrained
    checkpoint given by ``checkpoint``); ``norm="bn"`` suits training from scratch. Parameters outside
    ``train_layers`` are frozen; DETR trains layer2-4 and freezes the stem and layer1.
    """

    def __init__(
        self,
        name: str = BACKBONE_DEFAULTS.name,
        norm: str = BACKBONE_DEFAULTS.norm,
        train_layers: tuple[str, ...] | list[str] = BACKBONE_DEFAULTS.train_layers,
        return_layer: str = BACKBONE_DEFAULTS.return_layer,
        checkpoint: str | None = BACKBONE_DEFAULTS.checkpoint,
    ) -> None:
        super().__init__()
        if name not in RESNETS:
            raise BackboneConfigError(f"model.backbone.name={name!r} is not a ResNet; valid: {', '.join(RESNETS)}")
        if norm not in RESNET_NORMS:
            raise BackboneConfigError(
                f"model.backbone.norm={norm!r} is not valid for {name}; valid: {', '.join(RESNET_NORMS)}"
            )
        stages = list(RESNET_STAGES)
        if return_layer not in stages:
            raise BackboneConfigError(
                f"model.backbone.return_layer={return_layer!r} is not a stage of {name}; valid: {', '.join(stages)}"
            )
        kept = stages[: stages.index(return_layer) + 1]
        train_layers = _stage_list(train_layers)
        check_train_layers(train_layers, ["stem", *kept], f"{name} (return_layer={return_layer})")
        if checkpoint is not None:
            checkpoint_file(checkpoint)
        self.name = name
        norm_layer = FrozenBatchNorm2d if norm == "frozen_bn" else nn.BatchNorm2d
        net = getattr(torchvision.models, name)(weights=None, norm_layer=norm_layer)
        if checkpoint is not None:
            _load_checkpoint(net, checkpoint)
        elif norm == "frozen_bn":
            warnings.warn(
                f"{name} with frozen BatchNorm but no backbone checkpoint: random weights with frozen"
                " statistics; DETR expects an ImageNet checkpoint (model.backbone.checkpoint=/path/to.pth)",
                stacklevel=2,
            )
        self.body = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool, *[getattr(net, s) for s in kept])
        # Sequential indices 4.. are the stages; map them back to names for freezing.
        stage_of = {str(4 + i): s for i, s in enumerate(kept)}
        for pname, p in self.body.named_parameters():
            stage = stage_of.get(pname.split(".")[0], "stem")
            p.requires_grad_(stage in train_layers or "all" in train_layers)
        last_block = getattr(net, return_layer)[-1]
        last_conv = last_block.conv3 if hasattr(last_block, "conv3") else last_block.conv2  # Bottleneck/Basic
        self.num_channels: int = last_conv.out_channels
        self.stride: int = {"layer1": 4, "layer2": 8, "layer3": 16, "layer4": 32}[return_layer]

    def forward(self, images: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """images (B, 3, H, W), mask (B, H, W) bool -> features (B, C, h, w), mask (B, h, w)."""
        feats = self.body(images)
        return feats, downsample_mask(mask, feats.shape[-2:])


class TinyBackbone(nn.Module):
    """A small conv net for training from scratch on CPU.

    A patchify stem (``stem_stride`` x ``stem_stride`` conv, stride ``stem_stride``) to ``channels[0]``,
    then per further width a stride-2 3x3 conv and a 3x3 conv, each with BatchNorm and ReLU. The
    patchify stem keeps full-resolution convolutions (the bulk of a ResNet's CPU time) out.
    Output stride: ``stem_stride * 2 ** (len(channels) - 1)``. Its stages, for ``train_layers``, are ``stem``
    and ``layer1`` .. ``layer{len(channels) - 1}`` (one per further width); parameters outside them are frozen.
    """

    def __init__(
        self,
        channels: tuple[int, ...] | list[int] = BACKBONE_DEFAULTS.channels,
        stem_stride: int = BACKBONE_DEFAULTS.stem_stride,
        train_layers: tuple[str, ...] | list[str] = TINY_TRAIN_LAYERS,
    ) -> None:
        super().__init__()
        channels = list(channels)
        if not channels or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in channels):
            raise BackboneConfigError(
                f"model.backbone.channels={channels!r} must be a non-empty list of positive widths (e.g. [32, 64, 128])"
            )
        if not isinstance(stem_stride, int) or isinstance(stem_stride, bool) or stem_stride < 1:
            raise BackboneConfigError(f"model.backbone.stem_stride={stem_stride!r} must be a positive integer")
        stages = self.stage_names(len(channels))
        train_layers = _stage_list(train_layers)
        check_train_layers(train_layers, stages, f"tiny (channels={channels})")

        def conv_bn(c_in: int, c_out: int, k: int, stride: int) -> list[nn.Module]:
            pad = 0 if k == stride else k // 2
            conv = nn.Conv2d(c_in, c_out, k, stride, pad, bias=False)
            return [conv, nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]

        layers = conv_bn(3, channels[0], stem_stride, stem_stride)
        for c_in, c_out in zip(channels[:-1], channels[1:], strict=True):
            layers += conv_bn(c_in, c_out, 3, 2) + conv_bn(c_out, c_out, 3, 1)
        self.body = nn.Sequential(*layers)
        # body: [conv, bn, relu] for the stem (indices 0-2), then 6 modules per further width.
        for pname, p in self.body.named_parameters():
            index = int(pname.split(".")[0])
            stage = stages[0 if index < 3 else 1 + (index - 3) // 6]
            p.requires_grad_(stage in train_layers or "all" in train_layers)
        self.num_channels: int = channels[-1]
        self.stride: int = stem_stride * 2 ** (len(channels) - 1)

    @staticmethod
    def stage_names(num_widths: int) -> list[str]:
        return ["stem", *(f"layer{i}" for i in range(1, num_widths))]

    def forward(self, images: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """images (B, 3, H, W), mask (B, H, W) bool -> features (B, C, h, w), mask (B, h, w)."""
        feats = self.body(images)
        return feats, downsample_mask(mask, feats.shape[-2:])


def build_backbone(
    name: str = BACKBONE_DEFAULTS.name,
    norm: str | None = None,
    train_layers: tuple[str, ...] | list[str] | None = None,
    return_layer: str | None = None,
    checkpoint: str | None = None,
    channels: tuple[int, ...] | list[int] | None = None,
    stem_stride: int | None = None,
    **unknown: Any,
) -> nn.Module:
    """``name`` is a torchvision ResNet (``resnet18`` .. ``resnet101``) or ``tiny`` (`TinyBackbone`).

    ResNet: ``norm`` (frozen_bn, the default, or bn), ``train_layers`` (default layer2-4), ``return_layer``
    (default layer4), ``checkpoint``. Tiny: ``channels``, ``stem_stride``, ``train_layers`` (default all) and
    ``norm`` bn (its only normalisation). An option the chosen backbone does not use is accepted only as null or
    at the value the shared model config gives it (configs/model/detr_r50.yaml); any other value, and
    any unknown option, is a `BackboneConfigError` naming it and what the backbone accepts.
    """
    if unknown:
        keys = ", ".join(f"model.backbone.{k}" for k in sorted(unknown))
        raise BackboneConfigError(
            f"unknown backbone option(s) {keys}; valid: name, norm, train_layers, return_layer, checkpoint,"
            " channels, stem_stride"
        )
    if name not in BACKBONES:
        raise BackboneConfigError(f"model.backbone.name={name!r} is not a backbone; valid: {', '.join(BACKBONES)}")
    if name == "tiny":
        _refuse_unused(name, "norm", norm, "bn", "valid for tiny: bn (its only normalisation) or null")
        _refuse_unused(
            name, "return_layer", return_layer, BACKBONE_DEFAULTS.return_layer,
            "tiny always returns its last stage (its depth is len(channels)); valid for tiny: null",
        )
        _refuse_unused(
            name, "checkpoint", checkpoint, None,
            f"tiny trains from scratch, checkpoints load into {', '.join(RESNETS)} only; valid for tiny: null",
        )
        return TinyBackbone(
            TINY_DEFAULTS["channels"] if channels is None else channels,
            TINY_DEFAULTS["stem_stride"] if stem_stride is None else stem_stride,
            TINY_TRAIN_LAYERS if train_layers is None else train_layers,
        )
    for key, value in (("channels", channels), ("stem_stride", stem_stride)):
        _refuse_unused(
            name, key, value, TINY_DEFAULTS[key],
            f"it applies to name=tiny only; {name} accepts norm, train_layers, return_layer and checkpoint",
        )
    return ResNetBackbone(
        name,
        BACKBONE_DEFAULTS.norm if norm is None else norm,
        BACKBONE_DEFAULTS.train_layers if train_layers is None else train_layers,
        BACKBONE_DEFAULTS.return_layer if return_layer is None else return_layer,
        checkpoint,
    )


def _refuse_unused(name: str, key: str, value: Any, shared: Any, why: str) -> None:
    """An option backbone ``name`` does not use must be null or at the shared config's value ``shared``."""
    plain = list(value) if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig" else value
    if plain is not None and plain != shared:
        shown = plain if isinstance(plain, (list, int)) else str(plain)
        raise BackboneConfigError(f"model.backbone.{key}={shown} is not used by the {name} backbone ({why})")


def checkpoint_file(path: str | Path) -> Path:
    """``model.backbone.checkpoint`` as an existing file, else a `BackboneConfigError` naming it."""
    file = Path(path).expanduser()
    what = missing_file(file)
    if what:
        raise BackboneConfigError(
            f"model.backbone.checkpoint={path} {what}; expected a local torchvision ResNet state dict (.pth) or null"
        )
    return file


def downsample_mask(mask: Tensor, size: tuple[int, int] | torch.Size) -> Tensor:
    """mask (B, H, W) bool -> (B, h, w) bool by nearest interpolation, as DETR does."""
    return F.interpolate(mask[:, None].float(), size=tuple(size)).to(torch.bool)[:, 0]


def _load_checkpoint(net: nn.Module, path: str) -> None:
    """Load a local torchvision-style ResNet state dict (optionally under ``model``/``state_dict``)."""
    file = checkpoint_file(path)
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # not a torch file, truncated, or pickled objects weights_only refuses
        reason = " ".join(str(err).split())[:200] or type(err).__name__
        raise BackboneConfigError(
            f"model.backbone.checkpoint={path} cannot be read as a state dict ({type(err).__name__}: {reason})"
        ) from None
    for key in ("model", "state_dict"):
        if isinstance(state, dict) and key in state and isinstance(state[key], dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise BackboneConfigError(
            f"model.backbone.checkpoint={path} holds a {type(state).__name__}, not a state dict (name -> tensor)"
        )
    state = {k.removeprefix("module.").removeprefix("backbone."): v for k, v in state.items()}
    missing, unexpected = net.load_state_dict(state, strict=False)
    # The classifier head is dropped anyway, so its absence is harmless.
    missing = [k for k in missing if not k.startswith("fc.")]
    unexpected = [k for k in unexpected if not k.startswith("fc.") and not k.endswith("num_batches_tracked")]
    if missing or unexpected:
        raise BackboneConfigError(
            f"model.backbone.checkpoint={path} does not fit {type(net).__name__}: missing keys {missing[:5]},"
            f" unexpected {unexpected[:5]}"
        )


class PositionEmbeddingSine(nn.Module):
    """DETR's fixed 2-D sine encoding: half the channels encode y, half x (sin/cos interleaved).

    With ``normalize`` the cumulative coordinates are divided by the image's own valid extent, so a
    cell's code depends only on its own image, not on how much padding the batch added.
    """

    def __init__(
        self, dim: int = DETR_DEFAULTS.hidden_dim, temperature: float = 10000.0, normalize: bool = True
    ) -> None:
        super().__init__()
        if dim % 4:
            raise ValueError(f"sine position encoding needs a width divisible by 4, got {dim}")
        self.num_feats = dim // 2
        self.temperature = temperature
        self.normalize = normalize
        self.scale = 2 * math.pi

    def forward(self, mask: Tensor) -> Tensor:
        """mask (B, h, w) bool, True on padding -> (B, dim, h, w)."""
        valid = (~mask).float()
        y = valid.cumsum(1)  # 1-based row index within the valid region
        x = valid.cumsum(2)
        if self.normalize:
            eps = 1e-6
            y = y / (y[:, -1:, :] + eps) * self.scale
            x = x / (x[:, :, -1:] + eps) * self.scale
        i = torch.arange(self.num_feats, dtype=torch.float32, device=mask.device)
        freqs = self.temperature ** (2 * torch.div(i, 2, rounding_mode="floor") / self.num_feats)

        def encode(coord: Tensor) -> Tensor:
            angles = coord[..., None] / freqs  # (B, h, w, F)
            return torch.stack((angles[..., 0::2].sin(), angles[..., 1::2].cos()), dim=4).flatten(3)

        return torch.cat((encode(y), encode(x)), dim=3).permute(0, 3, 1, 2)


class PositionEmbeddingLearned(nn.Module):
    """Learned absolute encoding: a row table and a column table (up to ``max_size`` cells each)."""

    def __init__(self, dim: int = DETR_DEFAULTS.hidden_dim, max_size: int = 50) -> None:
        super().__init__()
        self.max_size = max_size
        self.row = nn.Embedding(max_size, dim // 2)
        self.col = nn.Embedding(max_size, dim - dim // 2)
        nn.init.uniform_(self.row.weight)
        nn.init.uniform_(self.col.weight)

    def forward(self, mask: Tensor) -> Tensor:
        """mask (B, h, w) -> (B, dim, h, w)."""
        b, h, w = mask.shape
        if h > self.max_size or w > self.max_size:
            raise ValueError(f"feature map {h}x{w} exceeds the learned encoding's {self.max_size} cells")
        rows = self.row(torch.arange(h, device=mask.device))  # (h, D/2)
        cols = self.col(torch.arange(w, device=mask.device))  # (w, D/2)
        pos = torch.cat((cols[None].expand(h, w, -1), rows[:, None].expand(h, w, -1)), dim=-1)
        return pos.permute(2, 0, 1)[None].expand(b, -1, -1, -1)


class PositionEmbeddingNone(nn.Module):
    """No absolute encoding (zeros), for RPE-only ablations."""

    def __init__(self, dim: int = DETR_DEFAULTS.hidden_dim) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, mask: Tensor) -> Tensor:
        """mask (B, h, w) -> zeros (B, dim, h, w)."""
        b, h, w = mask.shape
        return mask.new_zeros((b, self.dim, h, w), dtype=torch.float32)


def build_position_encoding(kind: str, dim: int) -> nn.Module:
    """``kind``: ``sine`` (DETR default), ``learned`` or ``none``."""
    if kind == "sine":
        return PositionEmbeddingSine(dim, normalize=True)
    if kind == "learned":
        return PositionEmbeddingLearned(dim)
    if kind == "none":
        return PositionEmbeddingNone(dim)
    raise ValueError(f"position_embedding must be 'sine', 'learned' or 'none', got {kind!r}")
