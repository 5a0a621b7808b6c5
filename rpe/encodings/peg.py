"""CPVT's conditional position encoding (Chu et al. 2023): the position encoding generator (PEG).

A depth-wise 3x3 convolution over the token grid, added to the tokens (zero padding at the
border is what tells a token where it is)::

    x_grid <- x_grid + DWConv3x3(x_grid)     (tokens reshaped to (B, C, h, w))

Skip tokens (class, distillation) pass unchanged. It replaces the absolute position embedding
(``model.net.ape=peg``) and follows the blocks listed in ``model.net.peg_blocks`` (default ``[0]``,
CPVT's choice; the iRPE paper's Table 5 row CPVT(0-5) is ``[0, 1, 2, 3, 4, 5]``); each position
has its own convolution. It is an absolute-encoding choice, not an attention method, so it is not
in the method registry; backbones call its token-grid hook (`rpe.base.PositionEncoding.tokens`).

timm counterpart: `timm.models.twins.PosConv` with ``stride=1`` (the PEG of Twins-PCPVT, same parameter name
``proj``, there a one-layer ``nn.Sequential``); for the same conv weights it gives the same grid tokens
(`tests/test_peg.py`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..base import Description, PositionEncoding

__all__ = ["PEG"]


class PEG(PositionEncoding):
    """Depth-wise 3x3 conv over the ``h x w`` grid tokens, residual; parameter ``proj`` (timm/CPVT name)."""

    edits_tokens = True

    def __init__(self, dim: int, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.name = "peg"
        self.site = "tokens"
        self.proj = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, device=device, dtype=dtype)

    def tokens(self, x: Tensor, h: int, w: int, skip: int) -> Tensor:
        """``x`` ``(B, skip + h w, C)`` -> same shape."""
        grid = x[:, skip:].transpose(1, 2).unflatten(2, (h, w))  # (B, C, h, w)
        grid = (self.proj(grid) + grid).flatten(2).transpose(1, 2)
        return grid if skip == 0 else torch.cat([x[:, :skip], grid], dim=1)

    def reset_parameters(self) -> None:
        self.proj.reset_parameters()

    def describe(self, h: int, w: int) -> Description:
        return Description("peg", "tokens", "CPVT PEG: depth-wise 3x3 conv over the token grid",
                           note="PEG is a convolution over tokens, not a function of the offset")

