"""Transformer-XL's relative terms on a 2-D grid (Dai et al. 2019), at the key site."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .. import registry
from ..base import Description, LogitPiece, PositionEncoding
from ..config import RPEConfig
from ..index import IndexSpec, bucket_ids

__all__ = ["TransformerXLTerm"]


class TransformerXLTerm(PositionEncoding):
    """Transformer-XL relative terms on a 2-D grid, at the key site.

    ``e_ij = s * (q_i.k_j + q_i.(W_R R_ij) + u.k_j + v'.(W_R R_ij))`` with ``R_ij`` the sinusoidal
    embedding of the exact offset ``(dr, dc) = p_i - p_j``: ``F = ceil(H d / 4)`` frequencies per
    axis, ``[sin, cos](dr f), [sin, cos](dc f)`` (so half the dims encode ``dr``, half ``dc``).
    ``W_R`` (``r_proj``, per layer, ``(H d) <- 4F``) projects to a key-like vector per head;
    ``u`` (``pos_bias_u``) and ``v'`` (``pos_bias_v``) are learned ``(H, d)``.
    ``W_R R`` is evaluated once per distinct offset, ``(2h-1)(2w-1)`` of them, and gathered like a
    contextual key table. Pairs with a skip token get no relative term (a zero column);
    ``u.k_j`` is a content term and applies to every key. Heads are never shared.
    Init: ``W_R`` truncated normal std .02, ``u = v' = 0``.
    """

    def __init__(
        self, config: RPEConfig, head_dim: int, num_heads: int, device: Any = None, dtype: Any = None
    ) -> None:
        super().__init__()
        self.name = "xl"
        self.site = "k"
        self.adds_logits = True
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.index_spec = IndexSpec.from_config(config)
        self.frequencies = math.ceil(num_heads * head_dim / 4)
        dd = {"device": device, "dtype": dtype}
        self.r_proj = nn.Linear(4 * self.frequencies, num_heads * head_dim, bias=False, **dd)
        self.pos_bias_u = nn.Parameter(torch.empty(num_heads, head_dim, **dd))
        self.pos_bias_v = nn.Parameter(torch.empty(num_heads, head_dim, **dd))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.trunc_normal_(self.r_proj.weight, std=0.02)
        nn.init.zeros_(self.pos_bias_u)
        nn.init.zeros_(self.pos_bias_v)

    def offset_embedding(self, h: int, w: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """Sinusoids of all offsets in bucket-id order: ``((2h-1)(2w-1), 4F)``."""
        dr = torch.arange(-(h - 1), h, device=device, dtype=torch.float64).repeat_interleave(2 * w - 1)
        dc = torch.arange(-(w - 1), w, device=device, dtype=torch.float64).repeat(2 * h - 1)
        inv_freq = 10000.0 ** (
            -torch.arange(self.frequencies, device=device, dtype=torch.float64) / self.frequencies
        )
        parts = []
        for offset in (dr, dc):
            angle = offset[:, None] * inv_freq[None, :]
            parts += [angle.sin(), angle.cos()]
        return torch.cat(parts, dim=-1).to(dtype)

    uses_scaled_keys = True  # the content term u.k_j

    def logit_pieces(
        self, q_scaled: Tensor, k_scaled: Tensor | None, h: int, w: int, skip: int, scale: float
    ) -> list[LogitPiece]:
        ids = bucket_ids(self.index_spec, h, w, skip, q_scaled.device)
        dtype = q_scaled.dtype
        weight = self.r_proj.weight.to(dtype)
        projected = self.offset_embedding(h, w, q_scaled.device, dtype) @ weight.t()  # (n_off, H d)
        n_off = projected.shape[0]
        table = projected.view(n_off, self.num_heads, self.head_dim).permute(1, 2, 0)  # (H, d, n_off)
        table = torch.cat([table, table.new_zeros(self.num_heads, self.head_dim, 1)], dim=-1)
        # q_scaled = s q and the whole XL score is scaled by s, so u and v' are scaled here too
        query = q_scaled + scale * self.pos_bias_v.to(dtype)[None, :, None, :]
        rows = query @ table.unsqueeze(0)  # (B, H, n, n_off + 1)
        key_bias = (
            (k_scaled * self.pos_bias_u.to(dtype)[None, :, None, :]).sum(-1).unsqueeze(-2)
        )  # (B, H, 1, n)
        return [LogitPiece("rows", rows, ids), LogitPiece("dense", key_bias)]


    def describe(self, h: int, w: int) -> Description:
        return Description(
            "xl", self.site, "Transformer-XL: sinusoids of the exact offset, projected per layer",
            note="Transformer-XL term on k has no lookup table",
        )

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, head_dim={self.head_dim}, frequencies={self.frequencies}"


# reads no field: the terms are fixed (one contextual logit term at the key site, heads never shared)
registry.register(registry.Encoding(
    "xl", TransformerXLTerm.build, "Transformer-XL: q.W_R R + u.k + v'.W_R R with sinusoidal R of the exact offset",
    directed=True,
))
registry.register_preset("xl", RPEConfig(method="xl"))
