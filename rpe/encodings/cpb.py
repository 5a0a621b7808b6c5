"""Swin-v2's log-spaced continuous position bias (Liu et al. 2022), on any grid and backbone.

A small MLP maps each exact offset's log-spaced coordinates to one bias per head::

    x = sign(d) log2(1 + |d|) / 3  per axis,  d = (dr, dc) = p_i - p_j
    e_ij += 16 sigmoid(W2 relu(W1 x + b1))[h]

The coordinates come from timm's ``gen_relative_log_coords`` with a reference window of 9 (so no
normalisation by the current grid: the function of the offset is the same on every grid size;
the constant 1/3 = 1/log2(8) is Swin-v2's). The MLP is timm's ``Mlp`` (``hidden_dim`` wide, no
output bias, as in Swin-v2). It is evaluated once per distinct offset of the grid,
``(2h-1)(2w-1)`` of them, and gathered like a bias table with the exact-offset bucket ids of
`rpe.index` (``xl``'s index); pairs with a skip token get no bias. Heads are never shared.

timm counterpart: the bias of Swin-v2's window attention (`timm.models.swin_transformer_v2.WindowAttention`:
``cpb_mlp`` 2 -> 512 -> H over ``relative_coords_table``, gathered by ``relative_position_index``, then
``16 sigmoid``) with ``pretrained_window_size=(9, 9)``; with ``hidden_dim=512`` and the same MLP weights the
two agree on every window size (`tests/test_rpe_cpb.py`). There is no ``pretrained_window_size`` setting here:
timm's default (``(0, 0)``) divides the offsets by ``window - 1``, so that the window's edge sits at +-8 on
every window size; this module never normalises by the grid, which equals timm's default on a 9x9 window only.
"""

from __future__ import annotations

from typing import Any

import torch
from timm.layers import Mlp, gen_relative_log_coords
from torch import Tensor, nn

from .. import registry
from ..base import Description, LogitPiece, PositionEncoding
from ..config import RPEConfig
from ..index import IndexSpec, bucket_ids

__all__ = ["LogCPB"]

_REFERENCE_WINDOW = (9, 9)  # offsets / (9 - 1) * 8 = the offsets themselves
_GAIN = 16.0


class LogCPB(PositionEncoding):
    """Per-head bias = MLP of the log-spaced offset (module docstring); parameters ``mlp.fc1``, ``mlp.fc2``."""

    adds_logits = True

    def __init__(
        self, config: RPEConfig, head_dim: int, num_heads: int, device: Any = None, dtype: Any = None
    ) -> None:
        super().__init__()
        self.name = "cpb"
        self.num_heads = num_heads
        self.index_spec = IndexSpec("xl")
        self.mlp = Mlp(2, config.hidden_dim, num_heads, act_layer=nn.ReLU, bias=(True, False), device=device,
                       dtype=dtype)

    def log_coords(self, h: int, w: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """``((2h-1)(2w-1), 2)`` log-spaced ``(dr, dc)`` in bucket-id order (cached per shape)."""
        return self.cached(
            (h, w, device, dtype),
            lambda: gen_relative_log_coords((h, w), _REFERENCE_WINDOW, mode="swin").to(device, dtype).reshape(-1, 2),
        )

    def offset_bias(self, h: int, w: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """``(H, (2h-1)(2w-1))`` bias of every offset."""
        weight_dtype = self.mlp.fc1.weight.dtype
        out = self.mlp(self.log_coords(h, w, device, weight_dtype))  # (n_off, H)
        return (_GAIN * torch.sigmoid(out)).t().to(dtype)

    def logit_pieces(
        self, q_scaled: Tensor, k_scaled: Tensor | None, h: int, w: int, skip: int, scale: float
    ) -> list[LogitPiece]:
        table = self.offset_bias(h, w, q_scaled.device, q_scaled.dtype)
        table = torch.cat([table, table.new_zeros(self.num_heads, 1)], dim=1)  # skip pairs: no bias
        return [LogitPiece("table", table, bucket_ids(self.index_spec, h, w, skip, q_scaled.device))]

    def reset_parameters(self) -> None:
        self.mlp.fc1.reset_parameters()
        self.mlp.fc2.reset_parameters()

    def describe(self, h: int, w: int) -> Description:
        with torch.no_grad():
            bias = self.offset_bias(h, w, self.mlp.fc1.weight.device, torch.float32).cpu()
        return Description(
            "cpb", "k", "Swin-v2 log-spaced continuous position bias (MLP of the offset)",
            [("", bias.view(self.num_heads, 2 * h - 1, 2 * w - 1))], signed=True,
        )

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, hidden={self.mlp.fc1.out_features}"


registry.register(registry.Encoding(
    "cpb", LogCPB.build, "Swin-v2 continuous position bias: an MLP of sign(d) log2(1 + |d|)",
    fields=("hidden_dim",), directed=True,
))
registry.register_preset("cpb", RPEConfig(method="cpb"))
