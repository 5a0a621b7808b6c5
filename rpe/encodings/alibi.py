"""2-D ALiBi (the 2D-ALiBi of CROMA: Fuller et al. 2023, "CROMA: Remote Sensing Representations with
Contrastive Radar-Optical Masked Autoencoders"): a fixed distance penalty per head, no parameters::

    e_ij += -m_h ||p_i - p_j||_2

the Euclidean-distance form of ALiBi's causal 1-D bias ``-m_h (i - j)``, ``j <= i`` (Press et al. 2022, "Train
Short, Test Long: Attention with Linear Biases Enables Input Length Extrapolation"), with its geometric
slopes over the ``H`` heads: ``m_h = 2^(-8h/H)``, ``h = 1..H`` for ``H`` a power of two; otherwise the slopes
of the nearest lower power of two ``P`` followed by every other slope of ``2P``. Pairs with a skip token get
no bias. The bias of each exact offset is gathered with the exact-offset bucket ids of `rpe.index` (``xl``'s
index) from a table ``(H, (2h-1)(2w-1) + 1)`` cached per grid shape, so a forward does no index or distance
work. timm has no counterpart; `tests/test_rpe_alibi.py` checks the formula against a naive float64 sum.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .. import registry
from ..base import Description, LogitPiece, PositionEncoding, offset_grid
from ..config import RPEConfig
from ..index import IndexSpec, bucket_ids

__all__ = ["ALiBi2D", "alibi_slopes"]


def alibi_slopes(num_heads: int) -> list[float]:
    """ALiBi's per-head slopes (module docstring), largest penalty first for a power of two."""
    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    lower = 2 ** int(math.log2(num_heads))
    return power_of_two(lower) + power_of_two(2 * lower)[0::2][: num_heads - lower]


class ALiBi2D(PositionEncoding):
    """Fixed bias ``-m_h ||p_i - p_j||`` per head (module docstring); no parameters."""

    adds_logits = True

    def __init__(
        self, config: RPEConfig, head_dim: int, num_heads: int, device: Any = None, dtype: Any = None
    ) -> None:
        super().__init__()
        self.name = "alibi"
        self.num_heads = num_heads
        self.slopes = alibi_slopes(num_heads)
        self.index_spec = IndexSpec("xl")

    def offset_bias(self, h: int, w: int) -> Tensor:
        """``(H, 2h-1, 2w-1)`` float64 bias of each offset ``(dr, dc)``."""
        dr, dc = offset_grid(h, w)
        distance = (dr.double() ** 2 + dc.double() ** 2).sqrt()
        return -torch.tensor(self.slopes, dtype=torch.float64)[:, None, None] * distance

    def table(self, h: int, w: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """``(H, (2h-1)(2w-1) + 1)`` in bucket-id order, zero in the skip bucket (cached per shape)."""
        def build() -> Tensor:
            flat = self.offset_bias(h, w).flatten(1)
            return torch.cat([flat, flat.new_zeros(self.num_heads, 1)], dim=1).to(device, dtype)

        return self.cached((h, w, device, dtype), build)

    def logit_pieces(
        self, q_scaled: Tensor, k_scaled: Tensor | None, h: int, w: int, skip: int, scale: float
    ) -> list[LogitPiece]:
        ids = bucket_ids(self.index_spec, h, w, skip, q_scaled.device)
        return [LogitPiece("table", self.table(h, w, q_scaled.device, q_scaled.dtype), ids)]

    def describe(self, h: int, w: int) -> Description:
        return Description(
            "alibi", "k", "2-D ALiBi: fixed bias -m_h * distance, geometric slopes",
            [("", self.offset_bias(h, w).float())], signed=True,
        )

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, slopes={[round(m, 4) for m in self.slopes]}"


registry.register(registry.Encoding(
    "alibi", ALiBi2D.build, "2-D ALiBi: -m_h ||p_i - p_j||, no parameters", directed=False
))
registry.register_preset("alibi", RPEConfig(method="alibi"))
