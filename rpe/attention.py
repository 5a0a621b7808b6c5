"""Attention with position encodings: the functional `rpe_attention`, the `RPESites` mixin that
gives an attention layer its encoding modules (DeiT, Swin and DETR all use it), and the timm
drop-in `RPEAttention`.

Logits (per head, ``s = scale``, offsets query minus key, see `rpe.index`)::

    q, k <- rotate(q, k)                                         [encodings with rotates_qk]
    e_ij = s q_i.k_j + sum of the logit pieces of every module   [adds_logits] + attn_mask
    a = dropout(softmax_j(e)),   z_i = sum_j a_ij v_j + value terms  [adds_value]

For the bucket tables the pieces are (``b(i,j)`` the bucket of the pair)::

    [bias K] T_k[h, b(i,j)]   [bias Q] T_q[h, b(j,i)]   [ctx K] (s q_i).r^k_b(i,j)   [ctx Q] (s k_j).r^q_b(j,i)

The query-site terms use the reversed pair, and so does bias on Q (the reference computes it as
``rpe_q(k * scale).transpose(2, 3)``). Attention never names a method: it asks each module for the
hooks of `rpe.base.PositionEncoding`.

Backends (``backend=``):

* ``sdpa``: `F.scaled_dot_product_attention` with the summed terms (plus ``attn_mask``) as an
  additive float mask; gradients reach the tables, q and k through the mask. With rotations only
  (RoPE) there is no mask and the fused kernel is used as for plain attention.
* ``eager``: explicit softmax; the only path that can add a V term (it needs the probabilities).
* ``flex``: FlexAttention with a ``score_mod`` gathering from the factorised terms (no ``(B, H, n, n)``
  bias is built); compiled on CUDA, eager (forward only, no dropout) elsewhere. Not for V.
* ``naive``: the textbook computation that materialises every pair's encoding ``r_ij``
  (``(H, n, n, d)`` per layer in contextual mode) and contracts it with q, k or the probabilities;
  the cost baseline for the paper's naive-vs-efficient ablation (``sweep=cost``), not for training.
* ``triton``: the fused Triton kernel of `rpe.triton_attention` (flash attention with the bucket
  terms, the V term, masks and dropout inside the tile); opt-in, CUDA only (on CPU only under
  Triton's interpreter, ``TRITON_INTERPRET=1``, for tests); its speed is not measured yet, so
  ``auto`` never chooses it. Takes table and rows pieces (Swin's own table comes as a table piece),
  per-key dense terms (XL's content bias) and bucket-table V terms; not a learned ``attn_mask`` or a
  learned dense term that varies per query.
* ``auto``: ``eager`` when a V term is present (it needs the probabilities) or, on CPU with
  gradients, when there is a logit term (SDPA's CPU kernel falls back to its unfused math path for
  a float mask that needs a gradient); otherwise ``sdpa`` (on CUDA the memory-efficient kernel, the
  only fused one that returns the mask's gradient). Flex is never chosen automatically: its
  gradient for the captured bucket rows goes through atomics. Measured step times of each choice
  are in docs/benchmarks.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import register_notrace_module
from torch import Tensor, nn

from .base import Description, LogitPiece, PositionEncoding, materialize_pieces
from .config import BACKENDS, RPEConfig, build_rpe, check_backend_device, resolve_rpe

__all__ = ["attention_backends", "rpe_attention", "RPEAttention", "RPESites", "split_grid"]


def split_grid(n: int, grid_size: tuple[int, int] | None) -> tuple[int, int, int]:
    """``(h, w, skip)`` for ``n`` tokens on ``grid_size = (h, w)``; ``skip = n - h w`` leading tokens."""
    if grid_size is None:
        raise ValueError(
            "grid_size=(h, w) is required when relative position encoding is used (the backbone sets"
            " attn.grid_size: the patch grid of a fixed-size model, or the input's grid during each forward"
            " of a dynamic_img_size model; call the model, not its blocks, for those)"
        )
    try:
        h, w = (int(v) for v in grid_size)
    except (TypeError, ValueError):
        raise ValueError(f"grid_size={grid_size!r} must be a pair of ints (h, w)") from None
    if h < 1 or w < 1:
        raise ValueError(f"grid_size={grid_size!r} must be positive")
    skip = n - h * w
    if skip < 0:
        raise ValueError(
            f"grid_size={tuple(grid_size)!r} holds {h * w} tokens but the sequence has only n={n}"
        )
    return h, w, skip


def _additive_mask(attn_mask: Tensor, dtype: torch.dtype) -> Tensor:
    if attn_mask.dtype == torch.bool:
        return torch.zeros(attn_mask.shape, dtype=dtype, device=attn_mask.device).masked_fill(
            ~attn_mask, float("-inf")
        )
    return attn_mask.to(dtype)


_compiled_flex: list[Any] = []


def _flex_attention_fn(device: torch.device):
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda":
        return flex_attention
    if not _compiled_flex:
        _compiled_flex.append(torch.compile(flex_attention, dynamic=False))
    return _compiled_flex[0]


def _flex(
    q: Tensor, k: Tensor, v: Tensor, pieces: list[LogitPiece], attn_mask: Tensor | None, scale: float
) -> Tensor:
    B, H, n, _ = q.shape
    # Expand per-head/broadcast tensors once so score_mod can index them with (b, h, q, kv).
    prepared = []
    for piece in pieces:
        if piece.kind == "table":
            prepared.append(("table", piece.values.expand(H, -1), piece.ids, piece.transposed))
        elif piece.kind == "rows":
            prepared.append(("rows", piece.values, piece.ids, piece.transposed))
        else:
            prepared.append(("dense", piece.values.expand(B, H, n, n), None, False))
    mask = None if attn_mask is None else attn_mask.expand(B, H, n, n)
    # torch's own refusal (no backward on CPU) is a NotImplementedError that names neither setting nor fix
    training = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    check_backend_device("flex", q.device.type, training, f"{q.device.type} tensors")

    def score_mod(score, b, h, q_idx, kv_idx):
        for kind, values, ids, transposed in prepared:
            row, col = (kv_idx, q_idx) if transposed else (q_idx, kv_idx)
            if kind == "table":
                score = score + values[h, ids[row, col]]
            elif kind == "rows":
                score = score + values[b, h, row, ids[row, col]]
            else:
                score = score + values[b, h, q_idx, kv_idx]
        if mask is not None:
            if mask.dtype == torch.bool:
                score = torch.where(mask[b, h, q_idx, kv_idx], score, float("-inf"))
            else:
                score = score + mask[b, h, q_idx, kv_idx]
        return score

    return _flex_attention_fn(q.device)(q, k, v, score_mod=score_mod, scale=scale)


def _auto_backend(q: Tensor, has_logit_terms: bool, has_value_term: bool, attn_mask: Tensor | None) -> str:
    """The fastest exact path for this call (measurements in the module docstring)."""
    if has_value_term:
        return "eager"  # the V term needs the attention probabilities
    learned_mask = attn_mask is not None and attn_mask.requires_grad  # e.g. Swin's own table, folded in
    if (has_logit_terms or learned_mask) and q.device.type == "cpu" and torch.is_grad_enabled():
        # On CPU a float mask that needs a gradient sends SDPA to its unfused math kernel, which is
        # slower than the explicit softmax; without gradients SDPA's fused CPU kernel takes the mask.
        return "eager"
    return "sdpa"


def rpe_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    rpe_q: nn.Module | None = None,
    rpe_k: nn.Module | None = None,
    rpe_v: nn.Module | None = None,
    grid_size: tuple[int, int] | None = None,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    backend: str = "auto",
    extra_pieces: Sequence[LogitPiece] = (),
) -> Tensor:
    """Self-attention with position encodings.

    Args:
        q, k, v: ``(B, H, n, d)``; the first ``n - h w`` tokens are skip tokens.
        rpe_q, rpe_k, rpe_v: encoding modules from `build_rpe` (None where unused).
        grid_size: ``(h, w)`` of the token grid; required when any module is given.
        attn_mask: bool (True = attend) or additive float, broadcastable to ``(B, H, n, n)``.
        dropout_p: dropout on the attention probabilities (pass 0 in eval).
        scale: logit scale ``s``, default ``d ** -0.5``.
        backend: one of auto, sdpa, eager, flex, naive, triton (module docstring).
        extra_pieces: logit terms a backbone owns (Swin's own bias table), in factorised form. The
            triton backend fuses them like the encodings' tables; the others add them to ``attn_mask``
            (before it: ``term + mask``, the order of timm's Swin).

    Returns:
        ``(B, H, n, d)``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of: {', '.join(BACKENDS)}")
    if extra_pieces and backend != "triton":
        extra = materialize_pieces(list(extra_pieces)).to(q.dtype)
        attn_mask = extra if attn_mask is None else extra + _additive_mask(attn_mask, q.dtype)
        extra_pieces = ()
    n, d = q.shape[-2], q.shape[-1]
    if k.shape[-2] != n:
        raise ValueError(f"rpe_attention is self-attention: q has {n} tokens but k has {k.shape[-2]}")
    sdpa_scale = scale  # None lets SDPA derive it exactly as timm's fused path does
    if scale is None:
        scale = d**-0.5
    sites = [m for m in (rpe_q, rpe_k, rpe_v) if m is not None]
    h_w_skip = split_grid(n, grid_size) if sites else None
    q, k = _rotate(q, k, sites, h_w_skip)
    logit_sites = [m for m in sites if m.adds_logits]
    value_sites = [m for m in sites if m.adds_value]
    if backend == "naive":
        return _naive(q, k, v, logit_sites, value_sites, h_w_skip, attn_mask, dropout_p, scale)
    if value_sites and backend in ("sdpa", "flex"):
        raise ValueError(
            f"backend={backend!r} cannot add the V relative term (it needs the attention probabilities);"
            " use backend='eager' or 'auto'"
        )
    if backend == "flex" and dropout_p > 0:
        raise ValueError(
            "backend='flex' does not support attention dropout; use dropout_p=0 or another backend"
        )
    chosen = backend if backend != "auto" else _auto_backend(q, bool(logit_sites), bool(value_sites), attn_mask)

    q_scaled = q * scale if logit_sites or chosen == "eager" else q  # plain SDPA scales internally
    pieces = _relative_pieces(q_scaled, k, scale, logit_sites, h_w_skip)

    if chosen == "flex":
        return _flex(q, k, v, pieces, attn_mask, scale)

    if chosen == "triton":
        return _triton(q, k, v, pieces + list(extra_pieces), value_sites, h_w_skip, attn_mask, dropout_p, scale)

    if chosen == "eager":
        return _eager(q_scaled, k, v, pieces, attn_mask, dropout_p, value_sites, h_w_skip)

    bias = materialize_pieces(pieces)
    if attn_mask is not None:
        # a lone mask goes to SDPA untouched, so plain SDPA matches timm's fused path bit for bit
        bias = attn_mask if bias is None else bias + _additive_mask(attn_mask, q.dtype)

    if bias is not None and bias.dtype != torch.bool:
        bias = bias.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=sdpa_scale)


def _triton(
    q: Tensor, k: Tensor, v: Tensor, pieces: list[LogitPiece], value_sites: list[PositionEncoding],
    h_w_skip: tuple[int, int, int] | None, attn_mask: Tensor | None, dropout_p: float, scale: float,
) -> Tensor:
    """The fused kernel; imported here so that ``rpe`` never needs Triton for the other backends."""
    from .triton_attention import triton_rpe_attention

    value_tables: list[tuple[Tensor, Tensor]] = []
    for site in value_sites:
        tables = site.value_tables(*h_w_skip, q.device)
        if tables is None:
            raise ValueError(
                f"backend='triton' cannot add the V term of {type(site).__name__} (not a bucket table);"
                " use backend='eager' or 'auto'"
            )
        value_tables += tables
    return triton_rpe_attention(q, k, v, pieces, value_tables, attn_mask, dropout_p, scale)


def _rotate(
    q: Tensor, k: Tensor, sites: list[PositionEncoding], h_w_skip: tuple[int, int, int] | None
) -> tuple[Tensor, Tensor]:
    """``q, k`` after every rotating module (RoPE), in slot order."""
    for site in sites:
        if site.rotates_qk:
            q, k = site.rotate(q, k, *h_w_skip)
    return q, k


def _relative_pieces(
    q_scaled: Tensor, k: Tensor, scale: float, logit_sites: list[nn.Module], h_w_skip: tuple[int, int, int] | None
) -> list[LogitPiece]:
    """The relative logit terms of every module that adds logits, in factorised form."""
    pieces: list[LogitPiece] = []
    if logit_sites:
        # only query-site and XL-like terms read s k; a K-only model skips this (B, H, n, d) pass
        k_scaled = k * scale if any(site.uses_scaled_keys for site in logit_sites) else None
        for site in logit_sites:
            pieces += site.logit_pieces(q_scaled, k_scaled, *h_w_skip, scale)
    return pieces


def _logits(q_scaled: Tensor, k: Tensor, pieces: list[LogitPiece], attn_mask: Tensor | None) -> Tensor:
    """Pre-softmax scores ``(B, H, n, n)``; each term is added in place (no summed ``(B, H, n, n)`` copy)."""
    logits = q_scaled @ k.transpose(-2, -1)  # matmul keeps its inputs for backward, not this output
    for piece in pieces:
        logits += piece.materialize()
    if attn_mask is not None:
        logits += _additive_mask(attn_mask, logits.dtype)
    return logits


def _eager(
    q_scaled: Tensor,
    k: Tensor,
    v: Tensor,
    pieces: list[LogitPiece],
    attn_mask: Tensor | None,
    dropout_p: float,
    value_sites: list[PositionEncoding],
    h_w_skip: tuple[int, int, int] | None,
) -> Tensor:
    """Explicit softmax over `_logits`, then the V terms."""
    attn = _logits(q_scaled, k, pieces, attn_mask).softmax(dim=-1)
    if dropout_p > 0:
        attn = F.dropout(attn, p=dropout_p, training=True)
    out = attn @ v
    for site in value_sites:
        out = out + site.value_term(attn, *h_w_skip)
    return out


def _naive(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    logit_sites: list[PositionEncoding],
    value_sites: list[PositionEncoding],
    h_w_skip: tuple[int, int, int] | None,
    attn_mask: Tensor | None,
    dropout_p: float,
    scale: float,
) -> Tensor:
    """Per-pair encodings materialised (module docstring); same result as the other backends."""
    logits = (q * scale) @ k.transpose(-2, -1)  # (B, H, n, n)
    for site in logit_sites:
        term = site.naive_logits(q, k, *h_w_skip, scale)
        if term is not None:
            logits = logits + term
    if attn_mask is not None:
        logits = logits + _additive_mask(attn_mask, logits.dtype)
    attn = logits.softmax(dim=-1)
    if dropout_p > 0:
        attn = F.dropout(attn, p=dropout_p, training=True)
    out = attn @ v
    for site in value_sites:
        out = out + site.naive_value_term(attn, *h_w_skip)
    return out


class RPESites:
    """Mixin of an attention ``nn.Module``: its encoding slots ``rpe_q``, ``rpe_k``, ``rpe_v`` (the
    reference's parameter names) and the one way to attend with them. DeiT's `RPEAttention`, Swin's
    window attention and DETR's attention all use it; none of them names an encoding.
    """

    rpe_q: nn.Module | None
    rpe_k: nn.Module | None
    rpe_v: nn.Module | None

    def init_rpe(
        self, config: RPEConfig, head_dim: int, num_heads: int, *, skip_bucket: bool = True,
        device: Any = None, dtype: Any = None,
    ) -> None:
        """Build ``config``'s modules into the slots (all None for ``none``)."""
        self.rpe_q, self.rpe_k, self.rpe_v = build_rpe(
            config, head_dim, num_heads, skip_bucket=skip_bucket, device=device, dtype=dtype
        )

    @property
    def rpe_modules(self) -> list[PositionEncoding]:
        """The non-empty slots, in q, k, v order."""
        return [m for m in (getattr(self, f"rpe_{s}", None) for s in "qkv") if m is not None]

    def rpe_attend(
        self, q: Tensor, k: Tensor, v: Tensor, grid_size: tuple[int, int] | None, *,
        attn_mask: Tensor | None = None, dropout_p: float = 0.0, scale: float | None = None, backend: str = "auto",
        extra_pieces: Sequence[LogitPiece] = (),
    ) -> Tensor:
        """`rpe_attention` with this layer's modules: ``(B, H, n, d)`` each -> ``(B, H, n, d)``."""
        return rpe_attention(
            q, k, v, rpe_q=self.rpe_q, rpe_k=self.rpe_k, rpe_v=self.rpe_v, grid_size=grid_size,
            attn_mask=attn_mask, dropout_p=dropout_p, scale=scale, backend=backend, extra_pieces=extra_pieces,
        )

    def rpe_probs(
        self, q: Tensor, k: Tensor, grid_size: tuple[int, int] | None, scale: float, attn_mask: Tensor | None = None
    ) -> Tensor:
        """Attention probabilities ``(B, H, n, n)`` (no dropout) with every rotation and logit term."""
        sites = self.rpe_modules
        h_w_skip = split_grid(q.shape[-2], grid_size) if sites else None
        q, k = _rotate(q, k, sites, h_w_skip)
        q_scaled = q * scale
        pieces = _relative_pieces(q_scaled, k, scale, [m for m in sites if m.adds_logits], h_w_skip)
        return _logits(q_scaled, k, pieces, attn_mask).softmax(dim=-1)

    def __prepare_scriptable__(self) -> Any:
        # torch.jit.script calls this on every submodule first: one clear line instead of a deep
        # TorchScript error (the encodings dispatch on Python objects that TorchScript cannot type)
        raise TypeError(
            f"{type(self).__name__} does not support TorchScript (torch.jit.script); use torch.compile,"
            " torch.fx or eager mode"
        )

    def reset_rpe_parameters(self) -> None:
        for module in self.rpe_modules:
            module.reset_parameters()

    def describe_rpe(self, h: int, w: int) -> list[Description]:
        """`PositionEncoding.describe` of every slot on an ``h x w`` grid."""
        return [module.describe(h, w) for module in self.rpe_modules]


def attention_backends(model: nn.Module) -> set[str]:
    """The backends (``rpe.backend``) the attention layers of ``model`` (`RPESites` with an encoding config:
    DeiT's, Swin's, DETR's) ask `rpe_attention` for."""
    found = set()
    for layer in model.modules():
        if isinstance(layer, RPESites):
            config = getattr(layer, "rpe_config", None) or getattr(layer, "rpe_cfg", None)  # DETR: rpe_cfg
            if isinstance(config, RPEConfig):
                found.add(config.backend)
    return found


@register_notrace_module  # torch.fx keeps it as one call: its Python dispatch needs concrete shapes
class RPEAttention(RPESites, nn.Module):
    """Drop-in for timm 1.0's ``timm.layers.Attention`` with relative position encoding.

    Same parameters and child names as timm (``qkv``, ``q_norm``, ``k_norm``, ``attn_drop``, ``norm``,
    ``proj``, ``proj_drop``) plus the site modules ``rpe_q``, ``rpe_k``, ``rpe_v`` (None when unused),
    so reference checkpoints (``blocks.{i}.attn.rpe_k.lookup_table_weight``) load strictly.
    ``rpe`` is anything `resolve_rpe` accepts. ``attn.grid_size = (h, w)`` is the token grid, set by the
    backbone (`models.deit.RPEVisionTransformer`: the patch grid, or the input's grid during each forward
    with ``dynamic_img_size``); leading tokens beyond ``h w`` are skip tokens.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] | None = None,
        rpe: RPEConfig | str | dict | None = None,
        *,
        attn_head_dim: int | None = None,
        dim_out: int | None = None,
        scale_norm: bool = False,
        gated: bool = False,
        depth: int | None = None,
        device: Any = None,
        dtype: Any = None,
        **unsupported: Any,
    ) -> None:
        super().__init__()
        if unsupported:
            raise TypeError(f"RPEAttention got unsupported argument(s): {', '.join(sorted(unsupported))}")
        if gated:
            raise ValueError("RPEAttention does not support gated=True (timm's sigmoid output gate)")
        dd = {"device": device, "dtype": dtype}
        dim_out = dim_out or dim
        head_dim = attn_head_dim
        if head_dim is None:
            if dim % num_heads:
                raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads}")
            head_dim = dim // num_heads
        if (qk_norm or scale_norm) and norm_layer is None:
            raise ValueError("norm_layer must be provided if qk_norm or scale_norm is True")

        self.num_heads = num_heads
        self.head_dim = head_dim
        self.attn_dim = num_heads * head_dim
        self.scale = head_dim**-0.5
        self.rpe_config = resolve_rpe(rpe)
        self.grid_size: tuple[int, int] | None = None

        self.qkv = nn.Linear(dim, self.attn_dim * 3, bias=qkv_bias, **dd)
        self.q_norm = norm_layer(head_dim, **dd) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(head_dim, **dd) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(self.attn_dim, **dd) if scale_norm else nn.Identity()
        self.proj = nn.Linear(self.attn_dim, dim_out, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.init_rpe(self.rpe_config, head_dim, num_heads, **dd)

    def _qkv_and_mask(
        self, x: Tensor, attn_mask: Tensor | None, is_causal: bool
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """q, k, v ``(B, H, n, d)`` from ``x`` ``(B, n, dim)``, and the mask with the causal one folded in."""
        B, N, _ = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        if is_causal:
            causal = torch.ones(N, N, dtype=torch.bool, device=x.device).tril()
            attn_mask = (
                causal
                if attn_mask is None
                else _additive_mask(attn_mask, q.dtype) + _additive_mask(causal, q.dtype)
            )
        return q, k, v, attn_mask

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """``x`` ``(B, n, dim)`` -> ``(B, n, dim_out)``; ``attn_mask`` as in `rpe_attention`."""
        B, N, _ = x.shape
        q, k, v, attn_mask = self._qkv_and_mask(x, attn_mask, is_causal)
        x = self.rpe_attend(
            q,
            k,
            v,
            self.grid_size,
            attn_mask=attn_mask,
            dropout_p=self.attn_drop.p if self.training else 0.0,
            scale=None if self.scale == self.head_dim**-0.5 else self.scale,
            backend=self.rpe_config.backend,
        )
        x = x.transpose(1, 2).reshape(B, N, self.attn_dim)
        x = self.norm(x)
        x = self.proj(x)
        x = self.proj_drop(x)
        return x

    def attention_probs(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """The attention probabilities of ``forward(x, attn_mask, is_causal)``: ``(B, H, n, n)``, rows sum to 1.

        Recomputes q, k and the logits exactly as `forward` does (same projections, norms, scale,
        relative terms and mask) and returns their softmax without dropout, for inspection; the
        grid is ``self.grid_size`` as set by the backbone.
        """
        q, k, _, attn_mask = self._qkv_and_mask(x, attn_mask, is_causal)
        return self.rpe_probs(q, k, self.grid_size, self.scale, attn_mask)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, rpe={self.rpe_config.shorthand()!r}"
