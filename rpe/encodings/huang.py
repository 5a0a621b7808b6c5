"""Huang et al. 2020 ("Improve Transformer Models with Better Relative Position Embeddings", Findings of
EMNLP 2020, method 4), as the iRPE paper's Table 5 uses it in 2-D: one embedding ``a_ij`` on both the query
and the key::

    e_ij = s (q_i.k_j + q_i.a_ij + k_j.a_ij),   a_ij = r_b(i,j)
         = s ((q_i + a_ij).(k_j + a_ij) - a_ij.a_ij)

with ``b`` the product bucket of the offset (``index`` clip in the preset, as the paper adapts it)
and one table shared by all heads in the preset. Unlike iRPE's query site, the key term reads the
same pair ``(i, j)``, not the reversed one. Parameter: ``rpe_k.lookup_table_weight`` ``(Hs, d, nb)``.
timm has no counterpart; `tests/test_rpe_huang.py` checks the formula above against a naive float64 sum.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from .. import registry
from ..base import Description, LogitPiece, bucket_rows
from ..config import RPEConfig
from ..tables import RelativePositionTable

__all__ = ["HuangTable"]


class HuangTable(RelativePositionTable):
    """A contextual key-site product table whose embedding also multiplies the key (module docstring)."""

    uses_scaled_keys = True

    def __init__(
        self, config: RPEConfig, head_dim: int, num_heads: int, skip_bucket: bool = True, device: Any = None,
        dtype: Any = None,
    ) -> None:
        product = dataclasses.replace(config, method="product", mode="ctx", on="k")
        super().__init__(product, "k", head_dim, num_heads, skip_bucket=skip_bucket, device=device, dtype=dtype)
        self.name = "huang"

    def logit_pieces(
        self, q_scaled: Tensor, k_scaled: Tensor | None, h: int, w: int, skip: int, scale: float
    ) -> list[LogitPiece]:
        query_term = super().logit_pieces(q_scaled, k_scaled, h, w, skip, scale)  # (s q_i).a_ij
        ids = self.bucket_ids(h, w, skip, k_scaled.device)
        # (s k_j).a_ij: rows indexed by the key j; a transposed piece reads values[j, ids.T[j, i]] = [j, b(i, j)]
        rows = bucket_rows(k_scaled, self.lookup_table_weight, self.num_buckets)
        return query_term + [LogitPiece("rows", rows, ids.t(), transposed=True)]

    def naive_logits(self, q: Tensor, k: Tensor, h: int, w: int, skip: int, scale: float) -> Tensor:
        pairs = self.pair_embeddings(h, w, skip, q.device).to(q.dtype).expand(q.shape[1], -1, -1, -1)
        return torch.einsum("bhid,hijd->bhij", q * scale, pairs) + torch.einsum("bhjd,hijd->bhij", k * scale, pairs)

    def describe(self, h: int, w: int) -> Description:
        description = super().describe(h, w)
        return dataclasses.replace(
            description, name="huang", site="qk",
            summary=f"Huang et al. 2020, one embedding on q and k ({description.summary})",
        )


registry.register(registry.Encoding(
    "huang", HuangTable.build, "Huang et al. 2020: s (q.k + q.a_ij + k.a_ij), one product-index embedding",
    fields=("shared_head", "ratio", "index"), directed=True,
))
registry.register_preset(
    "huang", RPEConfig(method="huang", shared_head=True, ratio=1.9, index="clip")
)
