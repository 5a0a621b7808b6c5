"""DeiT / ViT backbones with a pluggable relative position encoding.

The backbone is timm's own ``VisionTransformer``; only the attention layer is swapped for
:class:`rpe.RPEAttention`, which is told the token grid (`RPEVisionTransformer.set_grid`). Parameter
names stay timm's, so timm DeiT checkpoints load unchanged, and the RPE tables sit at
``blocks.{i}.attn.rpe_{q,k,v}`` as in the iRPE reference checkpoints.

In timm: the iRPE reference zoo names (`REFERENCE_ZOO`) and ``deit_{tiny,small,base}_patch16_224_rpe``
with any RPE preset as the tag (`models.timm_tags`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from timm.layers import build_sincos2d_pos_embed
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn
from torch import nn

from models.errors import ModelConfigError
from models.timm_tags import RPE_SUFFIX, register_rpe_variant, tagged_cfgs
from rpe import DEFAULT_PRESET, RPEAttention, RPEConfig, resolve_rpe
from rpe.base import no_weight_decay_names
from rpe.encodings.peg import PEG

APE_CHOICES = ("learned", "sincos", "none", "peg")
# How an absolute position table meets another patch grid: timm's resampling of the table, or (a sin-cos
# table only) the same formula evaluated at the new integer positions.
APE_RULES = ("interpolate", "extend")


def check_patch_grid(img_size: Any, patch_size: Any) -> None:
    """An image side that the patch size does not divide would lose its last pixels in the patch
    embedding (a strided convolution) without a word: that is a `ModelConfigError` naming both values."""
    for side, patch in zip(_pair(img_size), _pair(patch_size), strict=True):
        if side % patch:
            below, above = side - side % patch, side - side % patch + patch
            valid = f"{below} or {above}" if below else f"{above}"
            raise ModelConfigError(
                f"img_size={side} is not divisible by patch_size={patch}: the patch embedding would drop the last"
                f" {side % patch} pixel rows/columns; valid: a multiple of {patch}, e.g. {valid}"
            )


def _grid(model: VisionTransformer) -> str:
    h, w = model.patch_embed.grid_size
    return f"{h}x{w}"


def _pair(value: Any) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, (int, float)) else tuple(int(v) for v in value)


class _PendingRPEAttention(RPEAttention):
    """``RPEAttention`` taking its RPE from the model under construction.

    timm's blocks want an attention *class* and construct it without our ``rpe`` argument; a class
    made per model would not pickle (``ddp_spawn``), so this one module-level class reads the config
    that :class:`RPEVisionTransformer` sets around its construction.
    """

    pending: RPEConfig | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, rpe=_PendingRPEAttention.pending, **kwargs)


class RPEVisionTransformer(VisionTransformer):
    """timm ``VisionTransformer`` whose attention layers carry a relative position encoding.

    Args:
        rpe: anything :func:`rpe.resolve_rpe` accepts (preset name, shorthand, dict, config); None or "none" is
            timm's DeiT (no RPE); not given: `rpe.DEFAULT_PRESET`.
        ape: absolute position embedding: ``learned`` (timm/DeiT default), ``sincos`` (fixed 2-D
            sin-cos, not trained), ``peg`` (CPVT's conditional encoding, `rpe.encodings.peg`) or ``none``.
        peg_blocks: with ``ape=peg``, the blocks a PEG follows (default ``[0]``; CPVT(0-5) is 0..5);
            PEGs sit at ``pegs.<block>``.
        **kwargs: passed to timm's ``VisionTransformer``.
    """

    def __init__(
        self, *, rpe: Any = DEFAULT_PRESET, ape: str = "learned", peg_blocks: Sequence[int] | None = None, **kwargs: Any
    ) -> None:
        if ape not in APE_CHOICES:
            raise ModelConfigError(f"ape={ape!r} is not one of: {', '.join(APE_CHOICES)}")
        if peg_blocks is not None and ape != "peg":
            raise ModelConfigError(f"peg_blocks={list(peg_blocks)!r} needs ape=peg (got ape={ape!r})")
        self.rpe_config: RPEConfig = resolve_rpe(rpe)
        self.ape = ape
        kwargs.setdefault("pos_embed", "learn" if ape in ("learned", "sincos") else "none")
        _PendingRPEAttention.pending = self.rpe_config
        try:
            super().__init__(attn_layer=_PendingRPEAttention, **kwargs)
        finally:
            _PendingRPEAttention.pending = None
        if not getattr(self, "dynamic_img_size", False):
            check_patch_grid(self.patch_embed.img_size, self.patch_embed.patch_size)
        if ape == "sincos":
            self._fill_sincos_pos_embed()
        self.pegs: nn.ModuleDict | None = None
        if ape == "peg":
            blocks = [0] if peg_blocks is None else list(peg_blocks)
            depth = len(self.blocks)
            if not blocks or any(isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < depth for b in blocks):
                raise ModelConfigError(
                    f"peg_blocks={blocks!r} must be a non-empty list of block indices in 0..{depth - 1}"
                )
            self.pegs = nn.ModuleDict({str(b): PEG(self.embed_dim) for b in sorted(set(blocks))})
            for index, peg in self.pegs.items():
                hook = functools.partial(_apply_peg, peg, self.num_prefix_tokens)
                self.blocks[int(index)].register_forward_hook(hook)
        self.set_grid(self._fixed_grid())

    def _fill_sincos_pos_embed(self) -> None:
        grid_h, grid_w = self.patch_embed.grid_size
        table = build_sincos2d_pos_embed((grid_h, grid_w), dim=self.embed_dim)  # (h*w, dim)
        prefix = 0 if self.no_embed_class else self.num_prefix_tokens
        pos = torch.cat([torch.zeros(prefix, self.embed_dim), table], dim=0)
        with torch.no_grad():
            self.pos_embed.copy_(pos.unsqueeze(0))
        self.pos_embed.requires_grad_(False)

    def init_weights(self, mode: str = "", needs_reset: bool = True) -> None:
        super().init_weights(mode, needs_reset)
        if getattr(self, "ape", None) == "sincos":
            self._fill_sincos_pos_embed()

    def no_weight_decay(self) -> set[str]:
        """timm's set plus what the encodings keep out of weight decay (RoPE frequencies)."""
        return set(super().no_weight_decay()) | no_weight_decay_names(self)

    # --- The token grid of the attention layers ------------------------------------------------
    # A fixed-size model has one patch grid: every attention layer holds it from construction (and
    # `set_input_size`), so every path (forward, forward_intermediates, features_only, torch.fx,
    # torch.compile, a block called on its own) sees the same grid and no forward changes any state.
    # With dynamic_img_size the grid is the input's: `forward_features` and `forward_intermediates`
    # hand it to the layers for the length of the call and take it back after (None between calls),
    # so a grid of an earlier input can never be reused.

    def set_grid(self, grid_size: tuple[int, int] | None) -> None:
        """Tell every attention layer the patch grid ``(h, w)`` (None: unknown until the next forward)."""
        for block in self.blocks:
            block.attn.grid_size = None if grid_size is None else (int(grid_size[0]), int(grid_size[1]))

    def _fixed_grid(self) -> tuple[int, int] | None:
        return None if self.dynamic_img_size else tuple(self.patch_embed.grid_size)

    def _input_grid(self, x: torch.Tensor) -> tuple[int, int]:
        if isinstance(x, torch.fx.Proxy):
            raise TypeError("torch.fx cannot trace a dynamic_img_size iRPE model (its grid is the input's);"
                            " build it with a fixed img_size")
        return self.patch_embed.dynamic_feat_size(tuple(x.shape[-2:]))

    def set_input_size(self, img_size: Any = None, patch_size: Any = None) -> None:
        """timm's resize (patch grid, position embedding), then the new grid to the attention layers."""
        super().set_input_size(img_size=img_size, patch_size=patch_size)
        self.set_grid(self._fixed_grid())

    def adapt_input_size(self, img_size: Any, ape_rule: str | None) -> None:
        """Run at ``img_size`` from now on: the patch grid, the attention layers' grid and the absolute table.

        ``ape_rule`` (`APE_RULES`) says how the table meets the new grid: ``interpolate`` resamples it
        (`timm.layers.resample_abs_pos_embed`, through timm's ``set_input_size``); ``extend`` rebuilds the
        sin-cos table at the new integer positions, so every old position keeps its exact row. A model
        without a table (``ape=none``/``peg``) takes no rule. The relative terms need nothing: their
        tables and rotations are per offset. Any mismatch is one `ModelConfigError` line with the choices.
        """
        has_table = self.pos_embed is not None
        if ape_rule is not None and ape_rule not in APE_RULES:
            raise ModelConfigError(f"ape={ape_rule!r} is not an APE rule; valid: {', '.join(APE_RULES)}")
        if has_table and ape_rule is None:
            raise ModelConfigError(
                f"this DeiT has an absolute position table (ape={self.ape}) for a {_grid(self)} patch grid: name"
                f" how it meets img_size={img_size}; valid: ape={' or ape='.join(self._ape_rules())}"
            )
        if not has_table and ape_rule is not None:
            raise ModelConfigError(
                f"ape={ape_rule} adapts an absolute position table, which this DeiT (ape={self.ape}) does not"
                " have: its positions are relative and extend by construction; valid: leave ape unset"
            )
        if ape_rule == "extend" and self.ape != "sincos":
            raise ModelConfigError(
                f"ape=extend rebuilds a sin-cos table at the new positions, but this DeiT's table is ape={self.ape}"
                f" (trained values exist only on its {_grid(self)} patch grid); valid:"
                f" ape={' or ape='.join(self._ape_rules())}"
            )
        check_patch_grid(img_size, self.patch_embed.patch_size)
        frozen = has_table and not self.pos_embed.requires_grad
        self.set_input_size(img_size=_pair(img_size))
        if ape_rule == "extend":
            self._fill_sincos_pos_embed()
        elif frozen:  # an interpolated sin-cos table stays a fixed table
            self.pos_embed.requires_grad_(False)

    def _ape_rules(self) -> tuple[str, ...]:
        return APE_RULES if self.ape == "sincos" else tuple(r for r in APE_RULES if r != "extend")

    def forward_features(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> torch.Tensor:
        """``x``: images ``(B, C, H, W)`` -> tokens ``(B, skip + h*w, dim)``."""
        if not self.dynamic_img_size:
            return super().forward_features(x, attn_mask=attn_mask, is_causal=is_causal)
        self.set_grid(self._input_grid(x))
        try:
            return super().forward_features(x, attn_mask=attn_mask, is_causal=is_causal)
        finally:
            self.set_grid(None)

    def forward_intermediates(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """timm's ``forward_intermediates`` (same arguments and outputs) on this model's token grid."""
        if not self.dynamic_img_size:
            return super().forward_intermediates(x, *args, **kwargs)
        self.set_grid(self._input_grid(x))
        try:
            return super().forward_intermediates(x, *args, **kwargs)
        finally:
            self.set_grid(None)


def _apply_peg(peg: PEG, skip: int, block: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    """Forward hook of a block that a PEG follows: the PEG's token-grid hook on the block's output.

    A hook (not a loop of our own) so that every timm path that runs the blocks (forward_features,
    checkpointing, forward_intermediates, features_only) applies it.
    """
    h, w = block.attn.grid_size
    return peg.tokens(output, h, w, skip)


# Architecture hyper-parameters of the DeiT family (timm names) and our micro model.
DEIT_ARCHS: dict[str, dict[str, Any]] = {
    "deit_tiny_patch16_224": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3),
    "deit_small_patch16_224": dict(patch_size=16, embed_dim=384, depth=12, num_heads=6),
    "deit_base_patch16_224": dict(patch_size=16, embed_dim=768, depth=12, num_heads=12),
    # A 4-block model for 32x32 images (8x8 grid): trains in minutes on two CPU cores.
    "deit_micro_patch4_32": dict(img_size=32, patch_size=4, embed_dim=128, depth=4, num_heads=4, mlp_ratio=2.0),
}


def load_pretrained_files_safely(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` of ``build_model_with_cfg`` with any ``pretrained_cfg(_overlay)=dict(file=...)`` loaded here,
    with ``weights_only=True``, and handed to timm as its ``state_dict`` source.

    timm 1.0.23-1.0.25 load such files with ``weights_only=False`` (any pickle runs); reading the file
    here keeps a pretrained file from running code whatever timm version is installed.
    """
    from timm.models import load_state_dict

    out = dict(kwargs)
    for key in ("pretrained_cfg", "pretrained_cfg_overlay"):
        cfg = out.get(key)
        if isinstance(cfg, dict) and cfg.get("file") and cfg.get("state_dict") is None:
            cfg = dict(cfg)
            cfg["state_dict"] = load_state_dict(cfg.pop("file"), weights_only=True)
            out[key] = cfg
    return out


def _build(variant: str, arch: str, pretrained: bool = False, **kwargs: Any) -> RPEVisionTransformer:
    """timm's way of building its DeiT (``features_only`` through ``forward_intermediates``), our class."""
    out_indices = kwargs.pop("out_indices", 3)
    return build_model_with_cfg(
        RPEVisionTransformer,
        variant,
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=out_indices, feature_cls="getter"),
        **load_pretrained_files_safely(dict(DEIT_ARCHS[arch], **kwargs)),
    )


def refuse_pretrained(name: str, archs: Iterable[str], loader: str) -> None:
    """One line for ``pretrained=True`` on ``name``, a model of ``archs`` that no weights exist for (a micro
    model of this project): it names the models that take ``pretrained=True`` and ``loader`` for other files."""
    with_weights = [arch for arch in archs if "_micro_" not in arch]
    raise ModelConfigError(
        f"pretrained=True: {name} has no pretrained weights; valid with pretrained=True (and"
        f" pretrained_cfg_overlay=dict(file=...)): {', '.join(with_weights)}; or pretrained=False and {loader}"
    )


def create_deit(name: str, rpe: Any = DEFAULT_PRESET, pretrained: bool = False, **kwargs: Any) -> RPEVisionTransformer:
    """Build a DeiT of ``DEIT_ARCHS`` with any RPE, without touching timm's registry.

    ``pretrained=True`` goes through timm's builder (as the timm names do), so
    ``pretrained_cfg_overlay=dict(file=...)`` loads a local checkpoint of the model; the micro model has no
    weights and is refused in one line.
    """
    if pretrained:
        if "_micro_" in name:
            refuse_pretrained(name, DEIT_ARCHS, "models.from_rope_vit_checkpoint or load_state_dict")
        return _build(name, name, pretrained=True, rpe=rpe, **kwargs)
    return RPEVisionTransformer(rpe=rpe, **dict(DEIT_ARCHS[name], **kwargs))


# --- The iRPE reference model zoo, registered in timm under the reference's own names. ------------
# Every entry is contextual product/euc/quant/cross with shared heads; the suffix number is the
# used-bucket count on a 14x14 grid plus the class token.
REFERENCE_ZOO: dict[str, tuple[str, str]] = {
    "deit_tiny_patch16_224_ctx_product_50_shared_k": ("deit_tiny_patch16_224", "irpe_k"),
    "deit_small_patch16_224_ctx_euc_20_shared_k": ("deit_small_patch16_224", "irpe_euc_k"),
    "deit_small_patch16_224_ctx_quant_51_shared_k": ("deit_small_patch16_224", "irpe_quant_k"),
    "deit_small_patch16_224_ctx_cross_56_shared_k": ("deit_small_patch16_224", "irpe_cross_k"),
    "deit_small_patch16_224_ctx_product_50_shared_k": ("deit_small_patch16_224", "irpe_k"),
    "deit_small_patch16_224_ctx_product_50_shared_qk": ("deit_small_patch16_224", "irpe_qk"),
    "deit_small_patch16_224_ctx_product_50_shared_qkv": ("deit_small_patch16_224", "irpe_qkv"),
    "deit_base_patch16_224_ctx_product_50_shared_k": ("deit_base_patch16_224", "irpe_k"),
    "deit_base_patch16_224_ctx_product_50_shared_qkv": ("deit_base_patch16_224", "irpe_qkv"),
}

# The DeiT architectures in timm with any RPE preset as the tag: deit_small_patch16_224_rpe.irpe_qkv, ...
RPE_VARIANTS: dict[str, str] = {
    f"{arch}{RPE_SUFFIX}": arch for arch in ("deit_tiny_patch16_224", "deit_small_patch16_224", "deit_base_patch16_224")
}

# As timm's DeiT: the position embedding fixes the input size (dynamic_img_size=True lifts it).
_DEIT_CFG: dict[str, Any] = {
    "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None, "crop_pct": 0.875,
    "interpolation": "bicubic", "fixed_input_size": True, "mean": (0.485, 0.456, 0.406),
    "std": (0.229, 0.224, 0.225), "first_conv": "patch_embed.proj", "classifier": "head", "license": "mit",
    "paper_ids": "arXiv:2107.14222",
}

default_cfgs = generate_default_cfgs({
    **{name: dict(_DEIT_CFG) for name in REFERENCE_ZOO},
    **{key: cfg for variant in RPE_VARIANTS for key, cfg in tagged_cfgs(variant, _DEIT_CFG).items()},
})


def _zoo_entry(name: str):
    arch, preset = REFERENCE_ZOO[name]

    def entry(pretrained: bool = False, **kwargs: Any) -> RPEVisionTransformer:
        kwargs.setdefault("rpe", preset)
        return _build(name, arch, pretrained=pretrained, **kwargs)

    entry.__name__ = name
    entry.__qualname__ = name
    entry.__doc__ = f"iRPE reference model {name}: {arch} with the '{preset}' RPE preset."
    entry.__module__ = __name__
    return entry


for _name in REFERENCE_ZOO:
    globals()[_name] = register_model(_zoo_entry(_name))


def _rpe_variant_builder(variant: str):
    def build(rpe: Any, pretrained: bool, **kwargs: Any) -> RPEVisionTransformer:
        return _build(variant, RPE_VARIANTS[variant], pretrained=pretrained, rpe=rpe, **kwargs)

    return build


for _variant, _arch in RPE_VARIANTS.items():
    globals()[_variant] = register_rpe_variant(_variant, _rpe_variant_builder(_variant), f"{_arch} (timm's DeiT)")
