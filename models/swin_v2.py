"""Swin Transformer V2 backbones with a pluggable relative position encoding.

The backbone is timm's own ``SwinTransformerV2`` (patch embedding, stages with patch merging first,
residual post-norm, shifted windows, masks, head); only each block's ``WindowAttention`` is replaced by
:class:`RPEWindowAttentionV2`, a subclass that keeps timm's parameter names (``qkv``, ``q_bias``,
``v_bias``, ``logit_scale``, ``proj``, ``cpb_mlp``) and timm's **scaled cosine attention**, and routes
attention through :func:`rpe.rpe_attention` with the window as the token grid. The machinery is Swin's
(`models.swin`: `WindowRPESites` for the attention, `WindowRPEBackbone` for the model): shift masks,
window sizes, option checks, input-size adaptation, checkpoint filtering and the timm names work as there.

Cosine attention with a relative position encoding
--------------------------------------------------
timm's logits per head ``h``, with ``^`` the L2-normalised vector and ``tau_h = exp(min(logit_scale_h,
ln 100))`` (the learnable, clamped logit scale, ``(heads, 1, 1)``, initialised to ``ln 10``)::

    e_ij = tau_h q^_i.k^_j + 16 sigmoid(cpb_mlp(coords(p_i - p_j)))[h] + mask_ij

Here attention runs `rpe.rpe_attention` on ``q <- tau_h q^`` (the normalised query times the head's logit
scale), ``k <- k^`` (the normalised key) and ``scale = 1``, so the first term is timm's and every term
an encoding adds reads these same q and k (iRPE's definition, with ``s q`` the query of the content term)::

    e_ij = tau_h q^_i.k^_j                     content (timm's cosine logits)
         + tau_h q^_i.r^k[b(i,j)]              contextual on K (irpe_k, irpe_qk, irpe_qkv, ...)
         + k^_j.r^q[b(j,i)]                    contextual on Q
         + T[h, b(i,j)]                        bias terms (irpe_bias_k, swin, t5, alibi, ...; timm's CPB)
         + mask_ij
    z_i = sum_j a_ij (v_j + r^v[b(i,j)])       contextual on V

**Why the normalised query times the logit scale, not the raw q.** Cosine attention exists to keep the
logits independent of the activations' magnitude (Swin-v2's post-norm lets them grow with depth); iRPE's
``(d^-1/2 q_i).r`` with the raw query would bring that magnitude back through the relative term. With
``tau_h q^_i`` the contextual K term is the content term's query dotted with ``r``: bounded by
``tau_h |r|``, in the content term's units, and the logit scale that sharpens content sharpens position
alike. The logit scale sits on the query only (timm multiplies the product once), so the query-site term
``k^_j.r^q`` reads the normalised key without it; bias terms are added to the logits as timm adds its CPB,
not scaled. RoPE rotates ``tau_h q^`` and ``k^`` (a rotation keeps norms: cosine of the rotated vectors).
`tests/test_swin_v2.py` checks a shifted block against these formulas written out per window and pair.
The shift mask is timm's additive -100: with logit scales up to 100 it is not a hard mask (neither in timm),
and the relative terms add to what leaks across a shift boundary as the content term does.

Presets
-------
* ``rpe=cpb`` (timm's Swin-v2; the default RPE is `rpe.DEFAULT_PRESET`, as for every model) keeps timm's own
  continuous position bias:
  ``cpb_mlp`` (2 -> ``rpe.hidden_dim`` -> heads, 512 as in timm), the ``relative_coords_table`` (offsets
  normalised by the window, or by ``pretrained_window_sizes``, log-spaced) and ``relative_position_index``
  buffers, ``16 sigmoid``. The state dict of timm's ``swinv2_*`` model loads strictly and gives its logits.
  (The `rpe` encoding ``cpb`` of DeiT and Swin, with offsets never normalised by the grid, is not used here:
  on Swin-v2 ``cpb`` means timm's own.)
* Any other preset drops timm's CPB (``cpb_mlp`` and both buffers are None) and adds the site modules
  ``attn.rpe_q`` / ``attn.rpe_k`` / ``attn.rpe_v`` to every block, inside the windows exactly as on Swin
  (`models.swin`: what ``ratio`` means inside a window); ``rpe=none`` leaves plain cosine attention.

In timm: ``swinv2_tiny_window8_256_rpe.<preset>`` (any RPE preset as the tag, `models.timm_tags`).
``backend=auto`` with timm's CPB alone is the explicit softmax (timm's Swin-v2 has no fused path), so its
numbers are timm's; ``rpe.backend=sdpa`` or ``attn.fused_attn = True`` uses SDPA.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import register_notrace_module
from timm.models import generate_default_cfgs
from timm.models import swin_transformer_v2 as timm_swin_v2
from timm.models.swin_transformer_v2 import SwinTransformerV2, WindowAttention
from torch import Tensor, nn

from models.errors import ModelConfigError
from models.swin import (
    WindowRPEBackbone,
    WindowRPESites,
    build_window_backbone,
    rpe_variant_builder,
)
from models.timm_tags import RPE_SUFFIX, register_rpe_variant, tagged_cfgs
from rpe import DEFAULT_PRESET, RPEConfig, resolve_rpe
from rpe.base import LogitPiece

__all__ = [
    "SWIN_V2_ARCHS",
    "RPESwinTransformerV2",
    "RPEWindowAttentionV2",
    "create_swin_v2",
    "uses_timm_cpb",
]

_TIMM_CPB_HIDDEN = 512  # the width of timm's cpb_mlp
_CPB_GAIN = 16.0
_MAX_LOGIT_SCALE = math.log(1.0 / 0.01)  # timm's clamp: tau <= 100


def uses_timm_cpb(config: RPEConfig) -> bool:
    """Whether ``config`` is Swin-v2's own continuous position bias (``cpb``): timm's ``cpb_mlp`` is kept."""
    return config.method == "cpb"


@register_notrace_module  # torch.fx keeps it as one call: its Python dispatch needs concrete shapes
class RPEWindowAttentionV2(WindowRPESites, WindowAttention):
    """timm's Swin-v2 ``WindowAttention`` (scaled cosine attention) with any relative position encoding.

    Args are timm's (``dim``, ``window_size``, ``num_heads``, ``qkv_bias``, ``qkv_bias_separate``,
    ``attn_drop``, ``proj_drop``, ``pretrained_window_size``) plus ``rpe`` (anything `resolve_rpe` accepts;
    not given: ``cpb``, the module it replaces; None: no relative term). With cpb the module is timm's (same
    parameters, same numbers; ``rpe.hidden_dim`` sets the MLP's width, timm's is 512); otherwise ``cpb_mlp``,
    ``relative_coords_table`` and ``relative_position_index`` are None and the site modules ``rpe_q``, ``rpe_k``,
    ``rpe_v`` hold the encoding, which reads ``tau q^`` and ``k^`` (module docstring).
    """

    OWN_POSITION = ("cpb_mlp", "relative_coords_table", "relative_position_index")
    OWN_NAME = "cpb (timm cpb_mlp)"
    fused_attn = False  # timm's Swin-v2 attention is always the explicit softmax

    def __init__(
        self,
        dim: int,
        window_size: tuple[int, int],
        num_heads: int,
        qkv_bias: bool = True,
        qkv_bias_separate: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        pretrained_window_size: tuple[int, int] = (0, 0),
        rpe: Any = "cpb",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        self._resolve_window_rpe(rpe)
        super().__init__(
            dim, window_size, num_heads, qkv_bias=qkv_bias, qkv_bias_separate=qkv_bias_separate,
            attn_drop=attn_drop, proj_drop=proj_drop, pretrained_window_size=pretrained_window_size,
            device=device, dtype=dtype,
        )
        hidden = self.rpe_config.hidden_dim
        if self.own_bias and hidden != _TIMM_CPB_HIDDEN:  # timm's MLP at another width
            self.cpb_mlp = nn.Sequential(
                nn.Linear(2, hidden, bias=True, device=device, dtype=dtype),
                nn.ReLU(inplace=True),
                nn.Linear(hidden, num_heads, bias=False, device=device, dtype=dtype),
            )
        self._init_window_rpe(dim // num_heads, num_heads, device, dtype)

    @classmethod
    def from_timm(cls, old: WindowAttention, rpe: Any) -> RPEWindowAttentionV2:
        """The replacement of timm's module ``old``: its sizes and options, with ``rpe``."""
        return cls(
            old.dim, old.window_size, old.num_heads, qkv_bias=old.q_bias is not None,
            qkv_bias_separate=old.qkv_bias_separate, attn_drop=old.attn_drop.p, proj_drop=old.proj_drop.p,
            pretrained_window_size=old.pretrained_window_size, rpe=rpe, device=old.qkv.weight.device,
            dtype=old.qkv.weight.dtype,
        )

    @staticmethod
    def keeps_own_bias(config: RPEConfig) -> bool:
        return uses_timm_cpb(config)

    def reset_parameters(self) -> None:
        """timm's (logit scale ln 10, zero q/v biases, buffers), then the encodings' own init."""
        super().reset_parameters()
        if hasattr(self, "rpe_q"):  # timm's constructor calls this before the slots exist
            self.reset_rpe_parameters()

    def _init_buffers(self) -> None:
        if getattr(self, "relative_position_index", None) is not None:
            super()._init_buffers()
        elif self.k_bias is not None:
            self.k_bias.zero_()

    def _qkv(self, x: Tensor) -> Tensor:
        """timm's projection: ``qkv`` without bias, then ``(q_bias, 0, v_bias)``."""
        if self.q_bias is None:
            return self.qkv(x)
        qkv_bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))
        if self.qkv_bias_separate:
            return self.qkv(x) + qkv_bias
        return F.linear(x, weight=self.qkv.weight, bias=qkv_bias)

    def own_cpb(self) -> Tensor:
        """timm's bias per head and offset, ``(heads, (2 win_h - 1)(2 win_w - 1))``: ``16 sigmoid(cpb_mlp(coords))``
        (the sigmoid before timm's gather through ``relative_position_index``: the same numbers)."""
        table = self.cpb_mlp(self.relative_coords_table).view(-1, self.num_heads)
        return (_CPB_GAIN * torch.sigmoid(table)).t()

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """``x`` ``(B nW, N, C)``, ``N = win_h win_w``; ``mask`` ``(nW, N, N)`` additive (0 / -100) or None.

        Returns ``(B nW, N, C)``.
        """
        B_, N, _ = x.shape
        qkv = self._qkv(x).reshape(B_, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (B nW, heads, N, head_dim)
        logit_scale = torch.clamp(self.logit_scale, max=_MAX_LOGIT_SCALE).exp()  # (heads, 1, 1)
        q = F.normalize(q, dim=-1) * logit_scale
        k = F.normalize(k, dim=-1)
        own_cpb = []
        if self.own_bias:  # factorised, so that backend=triton gathers it in its tiles
            own_cpb = [LogitPiece("table", self.own_cpb(), self.relative_position_index.view(N, N))]
        return self.window_attend(q, k, v, mask, own_cpb, scale=1.0)


class RPESwinTransformerV2(WindowRPEBackbone, SwinTransformerV2):
    """timm ``SwinTransformerV2`` whose window attention carries a relative position encoding.

    Args:
        rpe: anything :func:`rpe.resolve_rpe` accepts; ``cpb`` is timm's own model, None or "none" no relative
            term; not given: `rpe.DEFAULT_PRESET`.
        ape: only ``none`` (Swin-v2 has no absolute position embedding; the classification configs pass it).
        **kwargs: timm ``SwinTransformerV2`` options (``img_size``, ``window_size``, ``pretrained_window_sizes``,
            ``strict_img_size``...).
    """

    ATTENTION = RPEWindowAttentionV2
    TIMM_FILTER = staticmethod(timm_swin_v2.checkpoint_filter_fn)
    FAMILY = "Swin-v2"

    def __init__(
        self, *, rpe: Any = DEFAULT_PRESET, ape: str | None = "none", peg_blocks: Any = None, **kwargs: Any
    ) -> None:
        self._check_window_options(rpe, ape, peg_blocks, kwargs)
        sizes = kwargs.get("pretrained_window_sizes")
        config = resolve_rpe(rpe)
        if sizes is not None and any(sizes) and (config is None or not uses_timm_cpb(config)):
            # timm reads them only to scale the CPB's offsets, which every other encoding replaces
            what = "no relative term" if config is None or config.method == "none" else f"the encoding {config.method}"
            raise ModelConfigError(
                f"pretrained_window_sizes={list(sizes)} scales the offsets of Swin-v2's own CPB (rpe=cpb), which"
                f" {what} replaces: it would have no effect; valid: leave it out, or rpe=cpb")
        super().__init__(**kwargs)
        # timm's init of the module it replaces: trunc-normal(.02) Linear layers (cpb_mlp included), zero
        # biases, logit scale ln 10; the encodings' own init
        self._replace_window_attention(lambda attn: attn.apply(partial(self._init_weights, needs_reset=True)))


# Architecture hyper-parameters; names follow timm's so that benchmarks can pair them.
SWIN_V2_ARCHS: dict[str, dict[str, Any]] = {
    "swinv2_tiny_window8_256": dict(
        img_size=256, window_size=8, embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)
    ),
    # The micro Swin's shape (models.swin) for the embedded 32x32 data: 8x8 tokens in 4x4 windows (shift 2),
    # then 4x4 tokens in one window.
    "swinv2_micro_window4_32": dict(
        img_size=32, patch_size=4, window_size=4, embed_dim=64, depths=(2, 2), num_heads=(2, 4), mlp_ratio=2.0
    ),
}


def create_swin_v2(
    name: str, rpe: Any = DEFAULT_PRESET, pretrained: bool = False, **kwargs: Any
) -> RPESwinTransformerV2:
    """Build Swin-v2 ``name`` of `SWIN_V2_ARCHS` with any RPE (``cpb``: timm's model; None: no relative term).

    Names timm knows go through ``build_model_with_cfg`` with timm's Swin-v2 checkpoint filter (after dropping
    a CPB the RPE replaces), so ``pretrained=True, pretrained_cfg_overlay=dict(file=...)`` loads timm/Microsoft
    checkpoints; the micro model is built directly. timm's own registry is not touched.
    """
    return build_window_backbone(RPESwinTransformerV2, SWIN_V2_ARCHS, name, rpe, pretrained, **kwargs)


def _register() -> None:
    from models.builders import register_builder

    for arch in SWIN_V2_ARCHS:
        register_builder(arch, create_swin_v2)


_register()


# --- In timm: Swin-v2-T with any RPE preset as the tag (swinv2_tiny_window8_256_rpe.irpe_k, ...). ---------
RPE_VARIANTS: dict[str, str] = {f"swinv2_tiny_window8_256{RPE_SUFFIX}": "swinv2_tiny_window8_256"}

_SWIN_V2_CFG: dict[str, Any] = {  # timm's Swin-v2-T cfg
    "num_classes": 1000, "input_size": (3, 256, 256), "pool_size": (8, 8), "crop_pct": 0.9,
    "interpolation": "bicubic", "fixed_input_size": True, "mean": (0.485, 0.456, 0.406),
    "std": (0.229, 0.224, 0.225), "first_conv": "patch_embed.proj", "classifier": "head.fc", "license": "mit",
}

default_cfgs = generate_default_cfgs(
    {key: cfg for variant in RPE_VARIANTS for key, cfg in tagged_cfgs(variant, _SWIN_V2_CFG).items()}
)

for _variant, _arch in RPE_VARIANTS.items():
    globals()[_variant] = register_rpe_variant(
        _variant, rpe_variant_builder(RPESwinTransformerV2, _variant, SWIN_V2_ARCHS[_arch], __name__),
        "Swin-v2-T (timm's Swin-v2)",
    )
