"""Convolutional backbones and absolute position encodings for DETR.

Images arrive as a padded batch ``images`` (B, 3, H, W) with ``mask`` (B, H, W), True on padding
(DETR's NestedTensor convention). A backbone returns the feature map (B, C, h, w) and the mask
downsampled to (B, h, w); a position encoding turns that mask into (B, D, h, w).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from torch import Tensor, nn
from torchvision.ops import FrozenBatchNorm2d

RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101")


class ResNetBackbone(nn.Module):
    """A torchvision ResNet cut after ``return_layer``, built with ``weights=None`` (no download).

    ``norm="frozen_bn"`` is DETR's setting (statistics and affine frozen, meant for a pretrained
    checkpoint given by ``checkpoint``); ``norm="bn"`` suits training from scratch. Parameters outside
    ``train_layers`` are frozen; DETR trains layer2-4 and freezes the stem and layer1.
    """

    def __init__(
        self,
        name: str = "resnet50",
        norm: str = "frozen_bn",
        train_layers: tuple[str, ...] | list[str] = ("layer2", "layer3", "layer4"),
        return_layer: str = "layer4",
        checkpoint: str | None = None,
    ) -> None:
        super().__init__()
        if name not in RESNETS:
            raise ValueError(f"unknown ResNet backbone {name!r}; expected one of {RESNETS}")
        if norm not in ("frozen_bn", "bn"):
            raise ValueError(f"backbone norm must be 'frozen_bn' or 'bn', got {norm!r}")
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
        stages = ["layer1", "layer2", "layer3", "layer4"]
        if return_layer not in stages:
            raise ValueError(f"return_layer must be one of {stages}, got {return_layer!r}")
        kept = stages[: stages.index(return_layer) + 1]
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
    Output stride: ``stem_stride * 2 ** (len(channels) - 1)``.
    """

    def __init__(self, channels: tuple[int, ...] | list[int] = (32, 64, 128), stem_stride: int = 4) -> None:
        super().__init__()

        def conv_bn(c_in: int, c_out: int, k: int, stride: int) -> list[nn.Module]:
            pad = 0 if k == stride else k // 2
            conv = nn.Conv2d(c_in, c_out, k, stride, pad, bias=False)
            return [conv, nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]

        layers = conv_bn(3, channels[0], stem_stride, stem_stride)
        for c_in, c_out in zip(channels[:-1], channels[1:], strict=True):
            layers += conv_bn(c_in, c_out, 3, 2) + conv_bn(c_out, c_out, 3, 1)
        self.body = nn.Sequential(*layers)
        self.num_channels: int = channels[-1]
        self.stride: int = stem_stride * 2 ** (len(channels) - 1)

    def forward(self, images: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """images (B, 3, H, W), mask (B, H, W) bool -> features (B, C, h, w), mask (B, h, w)."""
        feats = self.body(images)
        return feats, downsample_mask(mask, feats.shape[-2:])


def build_backbone(
    name: str = "resnet50",
    norm: str = "frozen_bn",
    train_layers: tuple[str, ...] | list[str] = ("layer2", "layer3", "layer4"),
    return_layer: str = "layer4",
    checkpoint: str | None = None,
    channels: tuple[int, ...] | list[int] = (32, 64, 128),
    stem_stride: int = 4,
) -> nn.Module:
    """``name`` is a torchvision ResNet (``resnet18`` .. ``resnet101``) or ``tiny`` (`TinyBackbone`;
    ``channels`` and ``stem_stride`` apply to it only)."""
    if name == "tiny":
        return TinyBackbone(tuple(channels), stem_stride)
    return ResNetBackbone(name, norm, tuple(train_layers), return_layer, checkpoint)


def downsample_mask(mask: Tensor, size: tuple[int, int] | torch.Size) -> Tensor:
    """mask (B, H, W) bool -> (B, h, w) bool by nearest interpolation, as DETR does."""
    return F.interpolate(mask[:, None].float(), size=tuple(size)).to(torch.bool)[:, 0]


def _load_checkpoint(net: nn.Module, path: str) -> None:
    """Load a local torchvision-style ResNet state dict (optionally under ``model``/``state_dict``)."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"backbone checkpoint {file} does not exist")
    state = torch.load(file, map_location="cpu", weights_only=True)
    for key in ("model", "state_dict"):
        if isinstance(state, dict) and key in state and isinstance(state[key], dict):
            state = state[key]
    state = {k.removeprefix("module.").removeprefix("backbone."): v for k, v in state.items()}
    missing, unexpected = net.load_state_dict(state, strict=False)
    # The classifier head is dropped anyway, so its absence is harmless.
    missing = [k for k in missing if not k.startswith("fc.")]
    unexpected = [k for k in unexpected if not k.startswith("fc.") and not k.endswith("num_batches_tracked")]
    if missing or unexpected:
        raise ValueError(
            f"backbone checkpoint {file}: missing keys {missing[:5]}, unexpected {unexpected[:5]}"
        )


class PositionEmbeddingSine(nn.Module):
    """DETR's fixed 2-D sine encoding: half the channels encode y, half x (sin/cos interleaved).

    With ``normalize`` the cumulative coordinates are divided by the image's own valid extent, so a
    cell's code depends only on its own image, not on how much padding the batch added.
    """

    def __init__(self, dim: int = 256, temperature: float = 10000.0, normalize: bool = True) -> None:
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

    def __init__(self, dim: int = 256, max_size: int = 50) -> None:
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

    def __init__(self, dim: int = 256) -> None:
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
