"""Swin Transformer backbones with a pluggable relative position encoding.

The backbone is timm's own ``SwinTransformer`` (patch embedding, stages, shifted windows, masks,
patch merging, head); only each block's ``WindowAttention`` is replaced by
:class:`RPEWindowAttention`, a subclass that keeps timm's parameter names (``qkv``, ``proj``,
``relative_position_bias_table``, the ``relative_position_index`` buffer) and routes attention
through :func:`rpe.rpe_attention` with the window as the token grid. What the window attention and the
backbone gain is written once (`WindowRPESites`, `WindowRPEBackbone`) and shared with Swin-v2
(`models.swin_v2`).

How an RPE enters the windows
-----------------------------
* The grid of every attention call is the ``M x M`` window (``(win_h, win_w)`` when a stage's
  feature map is smaller than ``M`` or after ``set_input_size``); there is no skip token.
* Shifted windows: timm's per-window shift mask ``(nW, N, N)`` (0 / -100) is repeated over the
  batch (windows are batch-major, ``b * nW + w``) and broadcast over heads as an additive
  ``(B nW, 1, N, N)`` mask, summed with the RPE terms before the softmax.
* ``rpe=swin`` (timm's Swin; the default RPE is `rpe.DEFAULT_PRESET`, as for every model) keeps timm's own table
  ``relative_position_bias_table`` ``((2M-1)^2, heads)``, trunc-normal(.02) initialised, excluded
  from weight decay by timm's ``no_weight_decay``. The table read through timm's index is handed to
  attention as a factorised term: the dense backends add it to the mask (timm's terms, in timm's
  order), ``backend=triton`` gathers it inside its tiles. The state dict of timm's model loads
  strictly and gives the same logits.
  The preset's ``window`` field is ignored: the table is sized by the block's window.
* Any other preset drops Swin's table (the RPE replaces it) and adds the site modules
  ``attn.rpe_q`` / ``attn.rpe_k`` / ``attn.rpe_v`` to every block (``rpe=none``: no relative
  term at all; Swin has no absolute position embedding, so the model then sees positions only
  through window borders and patch merging). The iRPE tables are decayed, as in the reference.

What ``ratio`` means inside a window
------------------------------------
Inside an ``M x M`` window the offsets per axis span ``-(M-1)..M-1``, i.e. ``-6..6`` at ``M = 7``
and ``-3..3`` at ``M = 4``; there are no long distances for the logarithmic part to compress.
Per-axis bucket of ``|x| = 0..6`` with the piecewise index (``B = int(2 ratio)``):

=====  ====  =====================  =========================  ========================
ratio  B     g(0..6)                product table (allocated)  product buckets used
=====  ====  =====================  =========================  ========================
1.9    3     0 1 2 2 3 3 3          7x7 = 49                   7x7  (exact only |x|<=1.9)
2.5    5     0 1 2 3 3 3 4          11x11 = 121                9x9
3.0    6     0 1 2 3 3 4 4          13x13 = 169                9x9  (exact up to |x| <= 3)
6.0    12    0 1 2 3 4 5 6          25x25 = 625                13x13 (all exact)
=====  ====  =====================  =========================  ========================

``index=clip ratio=3.0`` (``B = 6``) is exact over the whole window: its 13x13 product table is
one bucket per offset, the same buckets as Swin's own table (``rpe=irpe_k rpe.index=clip
rpe.ratio=3.0`` is "Swin's index, contextual"). Sensible choices at window 7:

* ``irpe_k`` as is (ratio 1.9, 49 buckets, collapses 2/3 and 4..6): the DeiT setting, fewest buckets;
* ``irpe_k rpe.ratio=3.0`` (81 of 169 used) or ``rpe.index=clip rpe.ratio=3.0`` (169, exact);
* ``irpe_bias_k rpe.index=clip rpe.ratio=3.0`` is Swin's bias with iRPE's parametrisation;
* ``irpe_euc_k`` / ``irpe_cross_k`` (ratio 20) and ``irpe_quant_k`` (ratio 33) work but allocate
  81 / 81 / 133 buckets per table of which only 9 / 13 / 25 occur; ``t5`` (32 per axis, exact up
  to 7) uses 169 of its 1024 entries. ``xl`` embeds the exact window offsets.

In timm: ``swin_tiny_patch4_window7_224_rpe.<preset>`` (any RPE preset as the tag, `models.timm_tags`).

Variable input size: ``strict_img_size=False`` (timm's dynamic masks, padding to whole windows) and
``model.set_input_size(img_size=..., window_size=...)`` both work; with the Swin table a window
change interpolates the table as timm does, the iRPE tables do not depend on the window.
``model.adapt_input_size(img_size)`` (eval.py's test sets) changes the size and keeps the windows; a stage
they do not tile is padded with zero tokens as timm does (the constructor accepts such sizes too).
:func:`checkpoint_filter_fn` (timm's filter, plus dropping Swin tables the model does not have)
resizes the bias table of a checkpoint made for another window size.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import torch
from timm.layers import register_notrace_module, to_2tuple, trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs
from timm.models import swin_transformer as timm_swin
from timm.models._manipulate import named_apply
from timm.models.swin_transformer import SwinTransformer, WindowAttention
from timm.models.vision_transformer import get_init_weights_vit
from torch import Tensor, nn

from models.deit import ModelConfigError, check_patch_grid, load_pretrained_files_safely, refuse_pretrained
from models.timm_tags import RPE_SUFFIX, register_rpe_variant, tagged_cfgs
from rpe import DEFAULT_PRESET, RPEConfig, RPESites, encoding, is_swin_bias, resolve_rpe
from rpe.base import LogitPiece, no_weight_decay_names

__all__ = [
    "SWIN_ARCHS",
    "RPESwinTransformer",
    "RPEWindowAttention",
    "WindowRPEBackbone",
    "WindowRPESites",
    "build_window_backbone",
    "checkpoint_filter_fn",
    "create_swin",
    "load_swin_checkpoint",
    "rpe_variant_builder",
    "uses_swin_table",
]


def uses_swin_table(config: RPEConfig) -> bool:
    """Whether ``config`` is Swin's own bias (one scalar per offset and head, on the logits).

    Then timm's ``relative_position_bias_table`` is kept. Other swin-method variants (contextual,
    shared heads, on q) go through the generic `rpe` tables with the window as ``M``.
    """
    return is_swin_bias(config)


class WindowRPESites(RPESites):
    """What a timm Swin window attention gains (Swin's ``WindowAttention`` and Swin-v2's, `models.swin_v2`).

    The RPE slots ``rpe_q``, ``rpe_k``, ``rpe_v`` with the window as the token grid; timm's own position term
    (named by ``OWN_POSITION``) kept when `keeps_own_bias` says the preset is timm's own, else set to None
    (out of the state dict, the parameters and the optimizer) and replaced by the preset's modules; the
    shift mask handed to `rpe.rpe_attention` together with timm's own term. A subclass calls
    `_resolve_window_rpe` before timm's ``__init__`` and `_init_window_rpe` after it, and its ``forward``
    ends in `window_attend`.
    """

    OWN_POSITION: tuple[str, ...] = ()  # timm's attributes that hold its own relative position term
    OWN_NAME = ""  # how extra_repr names timm's own term

    @staticmethod
    def keeps_own_bias(config: RPEConfig) -> bool:
        """Whether ``config`` is timm's own relative position term of this attention (kept as timm has it)."""
        raise NotImplementedError

    def _resolve_window_rpe(self, rpe: Any) -> None:
        self.rpe_config: RPEConfig = resolve_rpe(rpe)
        self.own_bias = self.keeps_own_bias(self.rpe_config)

    def _init_window_rpe(self, head_dim: int, num_heads: int, device: Any, dtype: Any) -> None:
        self.head_dim = head_dim
        self.rpe_q: nn.Module | None = None
        self.rpe_k: nn.Module | None = None
        self.rpe_v: nn.Module | None = None
        self.table_window = max(self.window_size)
        if not self.own_bias:
            # the RPE replaces timm's term; None keeps the attribute (timm code tests for it) but removes
            # the parameters from state_dict, named_parameters and the optimizer
            for name in self.OWN_POSITION:
                setattr(self, name, None)
            self.init_rpe(self._site_config(), head_dim, num_heads, skip_bucket=False, device=device, dtype=dtype)

    def _site_config(self) -> RPEConfig:
        # an encoding whose table is sized by the window (swin-method, e.g. contextual) gets this window
        fit_window = encoding(self.rpe_config.method).fit_window
        return self.rpe_config if fit_window is None else fit_window(self.rpe_config, self.table_window)

    @property
    def has_rpe_sites(self) -> bool:
        return bool(self.rpe_modules)

    def set_window_size(self, window_size: int | tuple[int, int]) -> None:
        """New window ``(h, w)``: timm's own term follows it as timm does; the RPE tables need nothing (a
        window-sized table refuses a larger window)."""
        if self.own_bias:
            super().set_window_size(window_size)
            return
        window_size = to_2tuple(window_size)
        if encoding(self.rpe_config.method).fit_window is not None and max(window_size) > self.table_window:
            raise ValueError(
                f"window {window_size} exceeds the window-sized table (M={self.table_window}) of this layer;"
                " rebuild the model at the new window size"
            )
        self.window_size = window_size
        self.window_area = window_size[0] * window_size[1]

    def window_attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, own_pieces: list[LogitPiece],
        scale: float | None = None,
    ) -> Tensor:
        """Attention of ``q, k, v`` ``(B nW, heads, N, head_dim)`` in their windows, then ``proj``.

        ``mask`` ``(nW, N, N)`` additive (0 / -100) or None; ``own_pieces``: timm's own term (when kept) in
        factorised form. Returns ``(B nW, N, C)``.
        """
        B_, _, N, _ = q.shape
        attn_mask = None
        if mask is not None:
            num_win = mask.shape[0]
            # windows are laid out batch-major (b * nW + w), so the per-window mask repeats per image
            attn_mask = mask.to(q.dtype).unsqueeze(0).expand(B_ // num_win, -1, -1, -1).reshape(B_, 1, N, N)
        backend = self.rpe_config.backend
        if backend == "auto" and not self.has_rpe_sites and not self.fused_attn:
            backend = "eager"  # timm's unfused setting; otherwise auto matches timm's SDPA when no grad is needed
        x = self.rpe_attend(
            q, k, v, self.window_size,
            attn_mask=attn_mask,
            dropout_p=self.attn_drop.p if self.training else 0.0,
            scale=scale,
            backend=backend,
            extra_pieces=own_pieces,
        )
        x = x.transpose(1, 2).reshape(B_, N, -1)
        x = self.proj(x)
        x = self.proj_drop(x)
        return x

    def extra_repr(self) -> str:
        rpe = self.OWN_NAME if self.own_bias else self.rpe_config.shorthand()
        return f"dim={self.dim}, window_size={self.window_size}, num_heads={self.num_heads}, rpe={rpe!r}"


@register_notrace_module  # torch.fx keeps it as one call: its Python dispatch needs concrete shapes
class RPEWindowAttention(WindowRPESites, WindowAttention):
    """timm's ``WindowAttention`` with any relative position encoding of `rpe`.

    Args are timm's (``dim``, ``num_heads``, ``head_dim``, ``window_size``, ``qkv_bias``,
    ``attn_drop``, ``proj_drop``) plus ``rpe`` (anything `resolve_rpe` accepts; not given: ``swin``, the module
    it replaces; None: no relative term).
    With the swin preset the module is timm's (same parameters, same numbers); otherwise
    ``relative_position_bias_table`` and ``relative_position_index`` are None and the site modules
    ``rpe_q``, ``rpe_k``, ``rpe_v`` hold the tables.
    """

    OWN_POSITION = ("relative_position_bias_table", "relative_position_index")
    OWN_NAME = "swin (timm table)"

    def __init__(
        self,
        dim: int,
        num_heads: int,
        head_dim: int | None = None,
        window_size: int | tuple[int, int] = 7,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        rpe: Any = "swin",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        self._resolve_window_rpe(rpe)
        super().__init__(
            dim, num_heads, head_dim=head_dim, window_size=window_size, qkv_bias=qkv_bias,
            attn_drop=attn_drop, proj_drop=proj_drop, device=device, dtype=dtype,
        )
        self._init_window_rpe(head_dim or dim // num_heads, num_heads, device, dtype)

    @classmethod
    def from_timm(cls, old: WindowAttention, rpe: Any) -> RPEWindowAttention:
        """The replacement of timm's module ``old``: its sizes and options, with ``rpe``."""
        return cls(
            old.dim, num_heads=old.num_heads, head_dim=old.qkv.out_features // 3 // old.num_heads,
            window_size=old.window_size, qkv_bias=old.qkv.bias is not None, attn_drop=old.attn_drop.p,
            proj_drop=old.proj_drop.p, rpe=rpe, device=old.qkv.weight.device, dtype=old.qkv.weight.dtype,
        )

    @staticmethod
    def keeps_own_bias(config: RPEConfig) -> bool:
        return uses_swin_table(config)

    @property
    def swin_table(self) -> bool:
        """Whether timm's ``relative_position_bias_table`` is kept (``rpe=swin``)."""
        return self.own_bias

    def reset_parameters(self) -> None:
        """Swin table trunc-normal(.02) (when kept), index buffer, and the RPE tables' own init."""
        if getattr(self, "relative_position_bias_table", None) is not None:
            trunc_normal_(self.relative_position_bias_table, std=0.02)
        self._init_buffers()
        if hasattr(self, "rpe_q"):  # timm's constructor calls this before the slots exist
            self.reset_rpe_parameters()

    def _init_buffers(self) -> None:
        if getattr(self, "relative_position_index", None) is not None:
            super()._init_buffers()

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """``x`` ``(B nW, N, C)``, ``N = win_h win_w``; ``mask`` ``(nW, N, N)`` additive (0 / -100) or None.

        Returns ``(B nW, N, C)``.
        """
        B_, N, _ = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (B nW, heads, N, head_dim)
        own_table = []
        if self.own_bias:
            # timm's table ((2M-1)^2, heads) read through its index (N, N): the same terms as
            # _get_rel_pos_bias, left factorised so that backend=triton gathers them in its tiles
            own_table = [LogitPiece("table", self.relative_position_bias_table.t(),
                                    self.relative_position_index.view(N, N))]
        return self.window_attend(q, k, v, mask, own_table)


def swin_grid_problem(side: int, patch: int, window: int, stages: int) -> str | None:
    """Why an image side does not give exact Swin windows, or None.

    The patch size must divide the side; each stage's token grid must be tiled by its windows (a grid
    no larger than the window is one window) and be even where patch merging halves it. timm pads what
    does not fit with zero tokens, which then take part in the windows' attention.
    """
    if side % patch:
        return (
            f"img_size={side} is not divisible by patch_size={patch} (its last {side % patch} pixels"
            " would be dropped)"
        )
    grid = side // patch
    for stage in range(stages):
        if stage and grid % 2:
            return f"stage {stage - 1} has an odd {grid}-token side that patch merging would pad"
        grid = grid // 2 if stage else grid
        if grid > window and grid % window:
            return f"stage {stage} has a {grid}-token side that {window}-token windows do not tile (timm would pad it)"
    return None


def check_swin_grid(img_size: Any, patch_size: Any, window_size: Any, stages: int) -> None:
    """`ModelConfigError` naming the values and nearby valid sizes when `swin_grid_problem` finds one (for a caller
    that wants exact windows: the model itself pads as timm does)."""
    for side, patch, window in zip(to_2tuple(img_size), to_2tuple(patch_size), to_2tuple(window_size), strict=True):
        problem = swin_grid_problem(int(side), int(patch), int(window), stages)
        if problem:
            fits = [s for s in range(patch, 4 * side + 1, patch) if swin_grid_problem(s, patch, window, stages) is None]
            nearest = sorted(sorted(fits, key=lambda s: abs(s - side))[:2])
            raise ModelConfigError(
                f"img_size={side} does not fit Swin with patch {patch}, window {window} and {stages} stages: {problem};"
                f" valid: e.g. {' or '.join(str(s) for s in nearest)}"
            )


class WindowRPEBackbone:
    """What timm's Swin backbones gain (`RPESwinTransformer` here, ``RPESwinTransformerV2`` in `models.swin_v2`):
    the option checks, every block's window attention replaced by ``ATTENTION.from_timm``, input-size
    adaptation with the model's windows, the encodings' no-weight-decay names and the checkpoint filter.

    A subclass lists this class before timm's backbone, sets ``ATTENTION`` (a `WindowRPESites` module),
    ``TIMM_FILTER`` (timm's checkpoint filter) and ``FAMILY`` (the name in messages), calls
    `_check_window_options` before timm's ``__init__`` and `_replace_window_attention` after it.
    """

    ATTENTION: type[WindowRPESites]
    TIMM_FILTER: Any
    FAMILY = "Swin"

    def _check_window_options(self, rpe: Any, ape: str | None, peg_blocks: Any, kwargs: Mapping[str, Any]) -> None:
        if ape not in (None, "none") or peg_blocks is not None:
            shown = f"ape={ape!r}" if peg_blocks is None else f"peg_blocks={peg_blocks!r}"
            raise ModelConfigError(
                f"{shown} is not supported by {self.FAMILY}, which has no absolute position embedding; valid: ape=none"
            )
        window = rpe.get("window") if isinstance(rpe, dict) else None
        if window is not None:  # each layer's table is sized by its own window: a set window would be ignored
            raise ModelConfigError(
                f"rpe.window={window} is not read on {self.FAMILY}: each layer sizes its relative table by its own"
                f" window (window_size={kwargs.get('window_size', 7)}); valid: leave rpe.window unset (null)")
        self.rpe_config: RPEConfig = resolve_rpe(rpe)

    def _replace_window_attention(self, init: Callable[[nn.Module], None] | None) -> None:
        """Every block's ``attn`` becomes ``ATTENTION.from_timm(attn, rpe)``, then ``init(attn)`` (timm's init of
        the module it replaces) unless ``init`` is None."""
        # timm pads a stage its windows do not tile (and an odd side before patch merging), so any such
        # size is timm's model; only a side the patch size does not divide would silently lose pixels.
        check_patch_grid(self.patch_embed.img_size, self.patch_embed.patch_size)
        for stage in self.layers:
            for block in stage.blocks:
                block.attn = self.ATTENTION.from_timm(block.attn, self.rpe_config)
                if init is not None:
                    init(block.attn)

    def adapt_input_size(self, img_size: Any, ape_rule: str | None = None) -> None:
        """Run at ``img_size`` with the same windows (timm's ``set_input_size`` with the windows the model was
        built with: by default timm would scale the windows with the grid, resizing Swin's table). Stages the
        windows do not tile are padded as timm does. Swin has no absolute table, so ``ape_rule`` must be None."""
        if ape_rule is not None:
            raise ModelConfigError(
                f"ape={ape_rule} adapts an absolute position table, which {self.FAMILY} does not have: its positions"
                " are relative within each window and extend by construction; valid: leave ape unset"
            )
        check_patch_grid(img_size, self.patch_embed.patch_size)
        self.set_input_size(img_size=to_2tuple(img_size), window_size=self._ref_window_sizes)

    def no_weight_decay(self) -> set[str]:
        """timm's set plus what the encodings keep out of weight decay (RoPE frequencies)."""
        return set(super().no_weight_decay()) | no_weight_decay_names(self)

    @classmethod
    def filter_checkpoint(cls, state_dict: Mapping[str, Any], model: nn.Module) -> dict[str, Tensor]:
        """timm's filter (``TIMM_FILTER``), after dropping timm's own position terms (``ATTENTION.OWN_POSITION``)
        that the model's RPE replaces. Accepts a plain state dict or one nested under ``model`` / ``state_dict``."""
        state_dict = state_dict.get("model", state_dict)
        state_dict = state_dict.get("state_dict", state_dict)
        return cls.TIMM_FILTER(_drop_replaced_terms(state_dict, model, cls.ATTENTION.OWN_POSITION), model)


class RPESwinTransformer(WindowRPEBackbone, SwinTransformer):
    """timm ``SwinTransformer`` whose window attention carries a relative position encoding.

    Args:
        rpe: anything :func:`rpe.resolve_rpe` accepts; ``swin`` is timm's own model, None or "none" no relative
            term; not given: `rpe.DEFAULT_PRESET`.
        ape: only ``none`` (Swin has no absolute position embedding; the option exists because the
            classification configs pass it).
        **kwargs: timm ``SwinTransformer`` options (``img_size``, ``window_size``, ``strict_img_size``...).
    """

    ATTENTION = RPEWindowAttention
    TIMM_FILTER = staticmethod(timm_swin.checkpoint_filter_fn)

    def __init__(
        self, *, rpe: Any = DEFAULT_PRESET, ape: str | None = "none", peg_blocks: Any = None, **kwargs: Any
    ) -> None:
        self._check_window_options(rpe, ape, peg_blocks, kwargs)
        weight_init = kwargs.get("weight_init", "")
        super().__init__(**kwargs)
        # the same init timm gave the module it replaces (trunc-normal Linear, zero bias)
        self._replace_window_attention(
            None if weight_init == "skip"
            else partial(named_apply, get_init_weights_vit(self.weight_init_mode, needs_reset=True))
        )


# Architecture hyper-parameters; names follow timm's so that benchmarks can pair them.
SWIN_ARCHS: dict[str, dict[str, Any]] = {
    "swin_tiny_patch4_window7_224": dict(
        patch_size=4, window_size=7, embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)
    ),
    "swin_small_patch4_window7_224": dict(
        patch_size=4, window_size=7, embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)
    ),
    "swin_base_patch4_window7_224": dict(
        patch_size=4, window_size=7, embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)
    ),
    # 32x32 images: 8x8 tokens in 4x4 windows (shift 2), then 4x4 tokens in one window (global);
    # patch 4 = the relational data's object cell (step time: docs/benchmarks.md).
    "swin_micro_patch4_window4_32": dict(
        img_size=32, patch_size=4, window_size=4, embed_dim=64, depths=(2, 2), num_heads=(2, 4), mlp_ratio=2.0
    ),
}


def _drop_replaced_terms(state_dict: Mapping[str, Tensor], model: nn.Module, names: tuple[str, ...]
                         ) -> dict[str, Tensor]:
    """``state_dict`` without the entries under an attribute of ``names`` that is None in ``model`` (timm's own
    position term where the model's RPE replaces it: ``...attn.relative_position_bias_table``,
    ``...attn.cpb_mlp.0.weight``)."""
    out = {}
    for key, value in state_dict.items():
        parts = key.split(".")
        hit = next((i for i, part in enumerate(parts) if part in names), 0)
        if hit > 0:
            try:
                module = model.get_submodule(".".join(parts[:hit]))
            except AttributeError:
                module = None
            if module is not None and getattr(module, parts[hit], 0) is None:
                continue  # this model's RPE replaces timm's term
        out[key] = value
    return out


def checkpoint_filter_fn(state_dict: Mapping[str, Any], model: nn.Module) -> dict[str, Tensor]:
    """timm's Swin filter (bias tables resized to the model's windows, original-repo key names,
    patch embedding resampling), after dropping Swin tables that the model's RPE replaces.

    Accepts a plain state dict or one nested under ``model`` / ``state_dict``.
    """
    return RPESwinTransformer.filter_checkpoint(state_dict, model)


def load_swin_checkpoint(
    model: WindowRPEBackbone, checkpoint: str | Path | Mapping[str, Any], strict: bool = True
) -> Any:
    """Load a (timm or ours) Swin or Swin-v2 checkpoint file or state dict through the model's
    ``filter_checkpoint`` (:func:`checkpoint_filter_fn` for Swin)."""
    if isinstance(checkpoint, (str, Path)):
        checkpoint = torch.load(checkpoint, map_location="cpu", weights_only=True)
    return model.load_state_dict(type(model).filter_checkpoint(checkpoint, model), strict=strict)


def check_stages(name: str, settings: Mapping[str, Any]) -> None:
    """Refuse, in one line naming the options, stage settings timm's window backbones cannot build: a
    ``num_heads`` list of another length than ``depths`` (timm indexed past its end: "tuple index out of
    range"), and a stage whose width (``embed_dim`` doubled per stage) its head count does not divide."""
    from models.errors import BackboneOptionError

    depths, heads, width = settings.get("depths"), settings.get("num_heads"), settings.get("embed_dim")
    if not isinstance(depths, (list, tuple)) or not isinstance(width, int):
        return
    if not isinstance(heads, (list, tuple)):
        heads = [heads] * len(depths) if isinstance(heads, int) else None
    if heads is None:
        return
    first = heads[0] if heads and isinstance(heads[0], int) else 1
    doubling = [first * 2**i for i in range(len(depths))]
    if len(heads) != len(depths):
        raise BackboneOptionError(
            f"num_heads={list(heads)} has {len(heads)} stages, depths={list(depths)} has {len(depths)} ({name}):"
            f" give one head count per stage; valid: num_heads={doubling} (doubling with the width), or depths of"
            f" {len(heads)} stages", ("num_heads", "depths"))
    for stage, count in enumerate(heads):
        dim = width * 2**stage
        if isinstance(count, int) and count > 0 and dim % count:
            fits = [str(n) for n in range(1, dim + 1) if dim % n == 0]
            raise BackboneOptionError(
                f"num_heads={list(heads)}: stage {stage + 1}'s {count} heads must divide its width {dim} (embed_dim="
                f"{width} doubled per stage; {dim} % {count} = {dim % count}); valid head counts of stage"
                f" {stage + 1}: {', '.join(fits)}", ("num_heads", "embed_dim"))


def build_window_backbone(cls: type[WindowRPEBackbone], archs: Mapping[str, dict[str, Any]], name: str, rpe: Any,
                          pretrained: bool, **kwargs: Any) -> nn.Module:
    """Backbone ``name`` of ``archs`` as ``cls`` with ``rpe``. Names timm knows go through ``build_model_with_cfg``
    with the class's checkpoint filter (``pretrained_cfg_overlay=dict(file=...)`` loads and resizes timm's
    checkpoints); a micro model is built directly."""
    if name not in archs:
        raise ModelConfigError(f"{cls.FAMILY} model {name!r} is not one of: {', '.join(archs)}")
    kwargs = dict(archs[name], rpe=rpe, **kwargs)
    check_stages(name, kwargs)
    if "_micro_" in name:
        if pretrained:
            refuse_pretrained(name, archs, "load_swin_checkpoint")
        return cls(**kwargs)
    return build_model_with_cfg(
        cls, name, pretrained, pretrained_filter_fn=cls.filter_checkpoint, **load_pretrained_files_safely(kwargs),
    )


def create_swin(name: str, rpe: Any = DEFAULT_PRESET, pretrained: bool = False, **kwargs: Any) -> RPESwinTransformer:
    """Build Swin ``name`` of `SWIN_ARCHS` with any RPE (``swin``: timm's model; None: no relative term).

    Names timm knows go through ``build_model_with_cfg`` with :func:`checkpoint_filter_fn`, so
    ``pretrained=True, pretrained_cfg_overlay=dict(file=...)`` loads (and resizes) timm/Microsoft
    checkpoints; the micro model is built directly. timm's own registry is not touched.
    """
    return build_window_backbone(RPESwinTransformer, SWIN_ARCHS, name, rpe, pretrained, **kwargs)


def rpe_variant_builder(cls: type[WindowRPEBackbone], variant: str, arch: dict[str, Any], module: str) -> Any:
    """``build(rpe, pretrained, **kwargs)`` of the timm name ``variant`` (`models.timm_tags.register_rpe_variant`):
    ``cls`` with ``arch``, timm's feature cfg; its ``__module__`` is ``module``, whose ``default_cfgs`` timm reads."""

    def build(rpe: Any, pretrained: bool, **kwargs: Any) -> nn.Module:
        out_indices = kwargs.pop("out_indices", tuple(range(len(kwargs.get("depths", arch["depths"])))))
        return build_model_with_cfg(
            cls, variant, pretrained, pretrained_filter_fn=cls.filter_checkpoint,
            feature_cfg=dict(flatten_sequential=True, out_indices=out_indices),
            **load_pretrained_files_safely(dict(arch, rpe=rpe, **kwargs)),
        )

    build.__module__ = module
    return build


def _register() -> None:
    from models.builders import register_builder

    for arch in SWIN_ARCHS:
        register_builder(arch, create_swin)


_register()


# --- In timm: Swin-T with any RPE preset as the tag (swin_tiny_patch4_window7_224_rpe.irpe_k, ...). --------
RPE_VARIANTS: dict[str, str] = {f"swin_tiny_patch4_window7_224{RPE_SUFFIX}": "swin_tiny_patch4_window7_224"}

_SWIN_CFG: dict[str, Any] = {  # timm's Swin-T cfg
    "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": (7, 7), "crop_pct": 0.9,
    "interpolation": "bicubic", "fixed_input_size": True, "mean": (0.485, 0.456, 0.406),
    "std": (0.229, 0.224, 0.225), "first_conv": "patch_embed.proj", "classifier": "head.fc", "license": "mit",
}

default_cfgs = generate_default_cfgs(
    {key: cfg for variant in RPE_VARIANTS for key, cfg in tagged_cfgs(variant, _SWIN_CFG).items()}
)

for _variant, _arch in RPE_VARIANTS.items():
    globals()[_variant] = register_rpe_variant(
        _variant, rpe_variant_builder(RPESwinTransformer, _variant, SWIN_ARCHS[_arch], __name__),
        "Swin-T (timm's Swin)",
    )
