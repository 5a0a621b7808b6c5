"""DETR's encoder-decoder transformer with relative position encodings (iRPE) in attention.

Layout is batch-first throughout: tokens (B, n, C). The encoder's tokens are the cells of the
backbone feature map of the *padded* batch, flattened row-major, so cell ``(r, c)`` of every image
has the same integer position whatever the image's own size; padded keys are masked.

Where RPE goes (options of `Transformer`):

* ``enc_rpe``: every encoder self-attention layer (the reference's ``enc_rpe2d``); grid = (h, w)
  of the padded feature map, integer cells, as in the reference.
* ``dec_self_rpe``: decoder self-attention among object queries. Queries have no image position,
  so this variant treats the query *slot index* as a 1-D position (grid ``(1, num_queries)``):
  each slot is a fixed learned identity, so slot offsets are well defined, if arbitrary. It is an
  ablation that the reference does not have; off by default.
* ``dec_cross_rpe``: not defined. A relative position between an object query and an image cell
  needs a query position (a reference point, as in Conditional/DAB-DETR), which DETR's queries do
  not have; anything but ``none`` is rejected.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rpe import RPESites
from rpe.base import own_init_parameters

from .hyperparameters import DETR_DEFAULTS as D


class DecoderCrossRPEError(ValueError):
    """``dec_cross_rpe`` was set although DETR's object queries have no position to measure from."""


def resolve_site_rpe(spec: Any) -> Any:
    """``spec`` (None, preset name, shorthand, dict, RPEConfig) -> RPEConfig, or None when disabled."""
    if spec is None:
        return None
    from rpe import resolve_rpe

    cfg = resolve_rpe(spec)
    return cfg if cfg.enabled else None


class Attention(RPESites, nn.Module):
    """Multi-head attention with nn.MultiheadAttention's parameters and DETR's semantics.

    Queries and keys/values come in separately (DETR adds position codes to q and k but not v).
    With an RPE config it owns ``rpe_q``/``rpe_k``/``rpe_v`` and calls ``rpe.rpe_attention``;
    RPE needs self-attention (the same n tokens for q and k) and the tokens' ``grid_size``.
    """

    def __init__(self, dim: int, num_heads: int, dropout: float, rpe: Any = None) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"width {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.dropout = dropout
        # One packed (3C, C) projection like nn.MultiheadAttention, so that Xavier init gives the
        # same scale as the reference (Xavier's bound depends on the packed fan-out).
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.out_proj = nn.Linear(dim, dim)
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.out_proj.bias)
        self.rpe_cfg = resolve_site_rpe(rpe)
        self.rpe_q: nn.Module | None = None
        self.rpe_k: nn.Module | None = None
        self.rpe_v: nn.Module | None = None
        if self.rpe_cfg is not None:
            self.init_rpe(self.rpe_cfg, self.head_dim, num_heads, skip_bucket=False)

    def _heads(self, x: Tensor, i: int) -> Tensor:
        """Project x (B, n, C) with the i-th slice of the packed weight -> (B, H, n, d)."""
        c = self.out_proj.in_features
        y = F.linear(x, self.in_proj_weight[i * c : (i + 1) * c], self.in_proj_bias[i * c : (i + 1) * c])
        return y.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        grid_size: tuple[int, int] | None = None,
    ) -> Tensor:
        """query (B, nq, C), key/value (B, nk, C), key_padding_mask (B, nk) True on padding -> (B, nq, C)."""
        q, k, v = self._heads(query, 0), self._heads(key, 1), self._heads(value, 2)
        # Boolean masks say True = attend; (B, 1, 1, nk) broadcasts over heads and queries.
        mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
        p = self.dropout if self.training else 0.0
        if self.rpe_cfg is None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        else:
            if grid_size is None:
                raise ValueError("attention with RPE needs the tokens' grid_size")
            out = self.rpe_attend(q, k, v, grid_size, attn_mask=mask, dropout_p=p, backend=self.rpe_cfg.backend)
        return self.out_proj(out.transpose(1, 2).flatten(2))


def _with_pos(x: Tensor, pos: Tensor | None) -> Tensor:
    return x if pos is None else x + pos


class FeedForward(nn.Module):
    """Linear -> ReLU -> dropout -> Linear, DETR's FFN."""

    def __init__(self, dim: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.linear1 = nn.Linear(dim, hidden)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(F.relu(self.linear1(x))))


class EncoderLayer(nn.Module):
    """Self-attention (q = k = src + pos, v = src) with optional RPE, then FFN; post- or pre-norm."""

    def __init__(
        self, dim: int, heads: int, ffn: int, dropout: float, pre_norm: bool, rpe: Any = None
    ) -> None:
        super().__init__()
        self.self_attn = Attention(dim, heads, dropout, rpe)
        self.ffn = FeedForward(dim, ffn, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(
        self, src: Tensor, pos: Tensor | None, padding_mask: Tensor | None, grid: tuple[int, int]
    ) -> Tensor:
        """src, pos (B, h*w, C); padding_mask (B, h*w) True on padding; grid (h, w) -> (B, h*w, C)."""
        if self.pre_norm:
            x = self.norm1(src)
            qk = _with_pos(x, pos)
            src = src + self.dropout1(self.self_attn(qk, qk, x, padding_mask, grid))
            return src + self.dropout2(self.ffn(self.norm2(src)))
        qk = _with_pos(src, pos)
        src = self.norm1(src + self.dropout1(self.self_attn(qk, qk, src, padding_mask, grid)))
        return self.norm2(src + self.dropout2(self.ffn(src)))


class DecoderLayer(nn.Module):
    """Query self-attention, cross-attention to the encoder memory, FFN; post- or pre-norm."""

    def __init__(
        self, dim: int, heads: int, ffn: int, dropout: float, pre_norm: bool, self_rpe: Any = None
    ) -> None:
        super().__init__()
        self.self_attn = Attention(dim, heads, dropout, self_rpe)
        self.cross_attn = Attention(dim, heads, dropout)
        self.ffn = FeedForward(dim, ffn, dropout)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.dropout1, self.dropout2, self.dropout3 = (
            nn.Dropout(dropout),
            nn.Dropout(dropout),
            nn.Dropout(dropout),
        )
        self.pre_norm = pre_norm

    def forward(
        self, tgt: Tensor, memory: Tensor, memory_mask: Tensor | None, pos: Tensor | None, query_pos: Tensor
    ) -> Tensor:
        """tgt, query_pos (B, Q, C); memory, pos (B, n, C); memory_mask (B, n) -> (B, Q, C)."""
        slots = (1, tgt.shape[1])  # 1-D query-slot grid, used only when dec_self_rpe is on
        if self.pre_norm:
            x = self.norm1(tgt)
            qk = x + query_pos
            tgt = tgt + self.dropout1(self.self_attn(qk, qk, x, None, slots))
            x = self.norm2(tgt)
            tgt = tgt + self.dropout2(
                self.cross_attn(x + query_pos, _with_pos(memory, pos), memory, memory_mask)
            )
            return tgt + self.dropout3(self.ffn(self.norm3(tgt)))
        qk = tgt + query_pos
        tgt = self.norm1(tgt + self.dropout1(self.self_attn(qk, qk, tgt, None, slots)))
        attended = self.cross_attn(tgt + query_pos, _with_pos(memory, pos), memory, memory_mask)
        tgt = self.norm2(tgt + self.dropout2(attended))
        return self.norm3(tgt + self.dropout3(self.ffn(tgt)))


class Transformer(nn.Module):
    """DETR's transformer. See the module docstring for ``enc_rpe``/``dec_self_rpe``/``dec_cross_rpe``."""

    def __init__(
        self,
        dim: int = D.hidden_dim,
        heads: int = D.nheads,
        enc_layers: int = D.enc_layers,
        dec_layers: int = D.dec_layers,
        ffn: int = D.dim_feedforward,
        dropout: float = D.dropout,
        pre_norm: bool = D.pre_norm,
        enc_rpe: Any = None,
        dec_self_rpe: Any = None,
        dec_cross_rpe: Any = None,
    ) -> None:
        super().__init__()
        if resolve_site_rpe(dec_cross_rpe) is not None:
            raise DecoderCrossRPEError(
                f"dec_cross_rpe={dec_cross_rpe!r}: decoder cross-attention RPE is undefined for DETR's object"
                " queries (they have no reference points); use dec_cross_rpe=none"
            )
        enc = EncoderLayer(dim, heads, ffn, dropout, pre_norm, enc_rpe)
        dec = DecoderLayer(dim, heads, ffn, dropout, pre_norm, dec_self_rpe)
        # deepcopy: each layer owns its own weights and RPE tables (no sharing across layers).
        self.encoder = nn.ModuleList(copy.deepcopy(enc) for _ in range(enc_layers))
        self.decoder = nn.ModuleList(copy.deepcopy(dec) for _ in range(dec_layers))
        self.encoder_norm = nn.LayerNorm(dim) if pre_norm else None
        self.decoder_norm = nn.LayerNorm(dim)
        self.dim = dim
        # The DETR reference: Xavier-uniform for every parameter with >1 dims, RPE tables included
        # (not an encoding's frequencies, which are no weights).
        own_init = own_init_parameters(self)
        for p in self.parameters():
            if p.dim() > 1 and id(p) not in own_init:
                nn.init.xavier_uniform_(p)

    def encode(self, src: Tensor, mask: Tensor, pos: Tensor) -> Tensor:
        """src (B, C, h, w), mask (B, h, w) True on padding, pos (B, C, h, w) -> memory (B, h*w, C)."""
        grid = (src.shape[-2], src.shape[-1])
        x = src.flatten(2).transpose(1, 2)
        pos_seq = pos.flatten(2).transpose(1, 2)
        pad = mask.flatten(1)
        for layer in self.encoder:
            x = layer(x, pos_seq, pad, grid)
        return x if self.encoder_norm is None else self.encoder_norm(x)

    def forward(self, src: Tensor, mask: Tensor, query_embed: Tensor, pos: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, C, h, w), mask (B, h, w), query_embed (Q, C), pos (B, C, h, w).

        Returns the decoder states of every layer (L, B, Q, C), each through the final decoder norm
        (for the auxiliary losses), and the memory (B, h*w, C).
        """
        memory = self.encode(src, mask, pos)
        pos_seq = pos.flatten(2).transpose(1, 2)
        pad = mask.flatten(1)
        query_pos = query_embed[None].expand(src.shape[0], -1, -1)
        tgt = torch.zeros_like(query_pos)
        states = []
        for layer in self.decoder:
            tgt = layer(tgt, memory, pad, pos_seq, query_pos)
            states.append(self.decoder_norm(tgt))
        return torch.stack(states), memory
