"""RoPE-ViT DeiT checkpoints (Heo et al., ECCV 2024, code ``naver-ai/rope-vit``): load and export.

RoPE-ViT's DeiTs (``rope_{axial,mixed}[_ape]_deit_{small,base,large}_patch16_LS``, DeiT-III blocks with layer
scale) are saved as ``{"model": state_dict, ...}`` with keys ``cls_token`` ``(1, 1, D)``, ``pos_embed``
``(1, h*w, D)`` (APE variants only; no class row, added to the patches before the class token is prepended),
``patch_embed.proj.*``, ``blocks.{i}.{norm1,norm2}.*``, ``blocks.{i}.attn.{qkv,proj}.*``,
``blocks.{i}.mlp.{fc1,fc2}.*``, ``blocks.{i}.gamma_1`` / ``gamma_2`` (layer scale), ``norm.*``, ``head.*`` and, for
RoPE-Mixed only, ``freqs`` ``(2, depth, D/2)`` (the learned frequencies of every layer: ``freqs[0]`` per unit
column step ``x``, ``freqs[1]`` per unit row step ``y``; head ``h``'s pair ``j`` at ``h*d/2 + j``) with the
persistent buffers ``freqs_t_x`` / ``freqs_t_y`` (column / row index of each patch, row-major). RoPE-Axial has no
position tensor (its angles are recomputed). The class token is never rotated; theta is 100 (axial) or 10 (mixed,
only the initialisation reads it). Our `RPEVisionTransformer` with ``rpe=rope_axial|rope_mixed``,
``no_embed_class=True``, ``ape=learned|none``, ``init_values`` (timm's ``ls1``/``ls2``) and ``global_pool=token``
computes the same function; the mapping is one table (`rope_vit_name`) plus two layout changes:

* **Axial: the two axes are in the other order.** In RoPE-ViT, channel pairs ``0 .. d/4-1`` of a head (channels
  ``0 .. d/2-1``) turn with the column and pairs ``d/4 .. d/2-1`` with the row; in ours (timm's
  ``RotaryEmbeddingCat``, ``ij`` grid, docs/design.md) the first half turns with the row. Both use the same
  frequencies ``theta^(-4p/d)`` per half. The loader therefore swaps the two channel halves of every head in the
  q and k rows of ``attn.qkv`` (weight and bias; v untouched); the exporter applies the same swap (it is its own
  inverse). The logits ``q_i.k_j`` are a sum over pairs, so the model is unchanged up to float summation order.
* **Mixed: the frequency axes are swapped.** Our per-layer ``blocks.{i}.attn.rpe_k.rope.freqs`` ``(2, 1, H, d/2)``
  holds the row coefficient first: ``ours[a, 0, h, j] = theirs[1 - a, i, h*d/2 + j]``. No weight is permuted.

What the tensors cannot tell is read from the file's ``arch`` dict (written by `to_rope_vit_checkpoint`), else from
DeiT's ``args`` (``args.model``, a RoPE-ViT zoo name; ``args.input_size``), else from RoPE-ViT's released shapes:
``num_heads`` (width/depth 384/12, 768/12, 1024/24 have 6, 12, 16 heads; other shapes need ``num_heads=``), the
image size (``freqs_t_x``/``freqs_t_y``, else the file's word, else a square ``pos_embed``, else RoPE-ViT's default
224) and the axial theta (100). Every hint is checked where it is read: ``num_heads`` a positive int, ``theta`` a
positive finite number, the image size an int (a square) or a pair, each side a multiple of the patch; ``None`` is
"not said". A plain DeiT-III file without ``args`` has exactly the tensors of RoPE-Axial + APE
and would be read as one; with ``args.model`` naming another model it is refused.

Files are read with ``weights_only=True`` (``argparse.Namespace`` allowed for DeiT's ``args``); every problem is one
`RoPEViTCheckpointError` line (a `RunConfigError`, hence a ``ValueError``): a bad hint or override, a NaN/inf tensor
(named), an ``ape=`` that contradicts the file, an export path inside a run dir or a data root
(`storage.destinations`).
"""

from __future__ import annotations

import argparse
import math
import numbers
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from models.checkpoint_files import RunConfigError, first_non_finite, read_checkpoint_file
from models.deit import RPEVisionTransformer
from rpe import RPEConfig
from rpe.config import FLOAT32_MAX, FLOAT32_TINY
from storage.destinations import save_export

__all__ = [
    "RoPEViTCheckpointError",
    "check_key_sets",
    "from_rope_vit_checkpoint",
    "grid_indices",
    "load_rope_vit_state",
    "load_rope_vit_weights",
    "read_state_file",
    "rope_vit_architecture",
    "rope_vit_name",
    "rope_vit_state_dict",
    "swap_axis_halves",
    "to_rope_vit_checkpoint",
]


class RoPEViTCheckpointError(RunConfigError):
    """A RoPE-ViT DeiT checkpoint that cannot be read or does not fit the model; one line."""


# RoPE-ViT's released DeiTs: (width, depth) -> heads (head dim 64), and the size in its zoo names -> heads.
RELEASED_HEADS = {(384, 12): 6, (768, 12): 12, (1024, 24): 16}
ZOO_SIZE_HEADS = {"small": 6, "base": 12, "large": 16}
ZOO_NAME = re.compile(r"rope_(axial|mixed)(_ape)?_deit_(small|base|large)_patch16_LS")
DEFAULT_THETA = {"rope_axial": 100.0, "rope_mixed": 10.0}
DEFAULT_IMG_SIZE = 224
MIXED_KEYS = ("freqs", "freqs_t_x", "freqs_t_y")
# (our name pattern, RoPE-ViT template); names not listed are the same in both.
NAME_RULES: tuple[tuple[str, str], ...] = (
    (r"blocks\.(\d+)\.ls1\.gamma", r"blocks.\1.gamma_1"),
    (r"blocks\.(\d+)\.ls2\.gamma", r"blocks.\1.gamma_2"),
)
OUR_FREQS = re.compile(r"blocks\.(\d+)\.attn\.rpe_k\.rope\.freqs")
# What a size hint or override may be: the form every one is checked against (`checked_hint`).
HINT_FORMS = {
    "num_heads": "a positive integer",
    "window_size": "a positive integer (the window side in patches)",
    "theta": f"a positive float32 number ({FLOAT32_TINY:.3g} to {FLOAT32_MAX:.3g}: its frequencies are float32)",
    "img_size": "a positive integer (a square image) or a pair of them (H, W)",
}


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def checked_hint(key: str, value: Any, where: str, patch: tuple[int, int] | None = None,
                 error: type[RunConfigError] = RoPEViTCheckpointError) -> Any:
    """``value`` of the hint or override ``key`` (``num_heads``, ``window_size``, ``theta``, ``img_size``) in its one
    valid form: an int, a float, an ``(H, W)`` tuple (an int is a square; with ``patch``, each side a multiple of
    it). Anything else is one ``error`` line ``{where}={value!r} must be ...`` (the DeiT and the Swin loader)."""
    if key in ("num_heads", "window_size") and _is_int(value) and value > 0:
        return int(value)
    if key == "theta" and isinstance(value, numbers.Real) and not isinstance(value, bool) and (
            FLOAT32_TINY <= value <= FLOAT32_MAX):
        return float(value)
    form = HINT_FORMS[key]
    if key == "img_size":
        pair = (value, value) if _is_int(value) else tuple(value) if isinstance(value, (list, tuple)) else ()
        if len(pair) == 2 and all(_is_int(side) and side > 0 for side in pair):
            size = (int(pair[0]), int(pair[1]))
            if patch is None or (size[0] % patch[0] == 0 and size[1] % patch[1] == 0):
                return size
            form = f"a positive multiple of the patch size {patch[0]}x{patch[1]} per side (one int or a pair (H, W))"
    raise error(f"{where}={value!r} must be {form}")


def rope_vit_name(name: str) -> str | None:
    """RoPE-ViT's key for our state-dict key ``name``; None for a layer's mixed frequencies (all layers share
    RoPE-ViT's one ``freqs`` tensor)."""
    if OUR_FREQS.fullmatch(name):
        return None
    for pattern, template in NAME_RULES:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, template, name)
    return name


def swap_axis_halves(qkv: Tensor, num_heads: int) -> Tensor:
    """``attn.qkv`` weight ``(3D, D)`` or bias ``(3D,)`` with the two channel halves of every head swapped in q and
    k (v unchanged): RoPE-ViT's axial layout (column pairs first) <-> ours (row pairs first). Its own inverse."""
    dim = qkv.shape[0] // 3
    head_dim = dim // num_heads
    parts = qkv.reshape(3, num_heads, 2, head_dim // 2, *qkv.shape[1:])
    qk = parts[:2].flip(2)
    return torch.cat([qk, parts[2:]]).reshape(qkv.shape).contiguous()


def _method(model: RPEVisionTransformer) -> str:
    return model.rpe_config.method


def _check_exportable(model: Any) -> None:
    """Refuse (one line) a model RoPE-ViT's DeiT cannot express."""
    problems = []
    if not isinstance(model, RPEVisionTransformer):
        raise RoPEViTCheckpointError(f"a {type(model).__name__} is not a DeiT (RPEVisionTransformer)")
    if model.rpe_config.method not in DEFAULT_THETA:
        problems.append(f"rpe.method={model.rpe_config.method!r} (RoPE-ViT has rope_axial, rope_mixed)")
    if model.cls_token is None or model.num_prefix_tokens != 1:
        problems.append(f"{model.num_prefix_tokens} prefix tokens (RoPE-ViT has one class token)")
    if model.pos_embed is not None and not model.no_embed_class:
        problems.append("a class row in pos_embed (RoPE-ViT: no_embed_class=True)")
    if model.ape not in ("learned", "none", "sincos"):
        problems.append(f"ape={model.ape} (RoPE-ViT has a learned table or none)")
    if model.global_pool != "token" or not isinstance(model.fc_norm, torch.nn.Identity):
        problems.append(f"global_pool={model.global_pool!r} (RoPE-ViT: the class token after norm)")
    attn = model.blocks[0].attn
    if not isinstance(attn.q_norm, torch.nn.Identity) or not isinstance(attn.norm, torch.nn.Identity):
        problems.append("qk or attention norms (RoPE-ViT has none)")
    if problems:
        raise RoPEViTCheckpointError(f"RoPE-ViT's DeiT cannot express this model: {'; '.join(problems)}")


def grid_indices(h: int, w: int) -> tuple[Tensor, Tensor]:
    """RoPE-ViT's ``freqs_t_x`` (column) and ``freqs_t_y`` (row) of an ``h x w`` patch grid, row-major."""
    t = torch.arange(h * w, dtype=torch.float32)
    return t % w, torch.div(t, w, rounding_mode="floor")


def rope_vit_state_dict(model: RPEVisionTransformer) -> dict[str, Tensor]:
    """Our DeiT's state dict in RoPE-ViT's layout (module docstring: names, axial channel halves, mixed freqs)."""
    _check_exportable(model)
    heads = model.blocks[0].attn.num_heads
    axial = _method(model) == "rope_axial"
    out: dict[str, Tensor] = {}
    freqs = []
    for name, value in model.state_dict().items():
        value = value.detach().clone()
        if OUR_FREQS.fullmatch(name):
            freqs.append(value)
            continue
        if axial and re.fullmatch(r"blocks\.\d+\.attn\.qkv\.(weight|bias)", name):
            value = swap_axis_halves(value, heads)
        out[rope_vit_name(name)] = value
    if not axial:
        stacked = torch.stack([f[[1, 0], 0] for f in freqs], dim=1)  # (2, depth, H, d/2): x (column) first
        out["freqs"] = stacked.reshape(2, len(freqs), -1).contiguous()
        out["freqs_t_x"], out["freqs_t_y"] = grid_indices(*model.patch_embed.grid_size)
    return out


def rope_vit_arch(model: RPEVisionTransformer) -> dict[str, Any]:
    """What the tensors cannot tell, saved beside ``model`` (RoPE-ViT's own loaders read only ``model``)."""
    theta = model.blocks[0].attn.rpe_k.theta
    return {"num_heads": model.blocks[0].attn.num_heads, "img_size": list(model.patch_embed.img_size),
            "theta": float(theta)}


def to_rope_vit_checkpoint(model: RPEVisionTransformer, path: str | Path) -> Path:
    """Write ``{"model": RoPE-ViT state dict, "arch": {num_heads, img_size, theta}}`` to ``path`` atomically.
    A ``path`` inside a run's dir or a data root is refused in one line (`storage.destinations`).

    RoPE-ViT's ``rope_vit_models`` of the same shape loads ``["model"]`` with ``strict=True`` (its mixed models
    keep ``freqs_t_x`` / ``freqs_t_y``, which are written too); `from_rope_vit_checkpoint` reads ``arch`` back.
    """
    return save_export({"model": rope_vit_state_dict(model), "arch": rope_vit_arch(model)}, path,
                       "to_rope_vit_checkpoint", RoPEViTCheckpointError)


def read_state_file(
    path: str | Path, expected: str = "a RoPE-ViT DeiT checkpoint",
    error: type[RunConfigError] = RoPEViTCheckpointError, safe_globals: tuple[Any, ...] = (argparse.Namespace,),
) -> tuple[Any, dict[str, Tensor]]:
    """``(checkpoint, state dict)`` of a ``{"model": state_dict, ...}`` file (or a bare state dict), read with
    ``weights_only=True``; a DDP ``module.`` prefix is dropped. Anything else is one ``error`` line naming what the
    file holds and ``expected``."""
    checkpoint = read_checkpoint_file(path, safe_globals=list(safe_globals), error=error)
    if isinstance(checkpoint, dict) and isinstance(checkpoint.get("model"), dict):
        state = checkpoint["model"]
    elif isinstance(checkpoint, dict) and checkpoint and all(isinstance(v, Tensor) for v in checkpoint.values()):
        state = checkpoint
    elif isinstance(checkpoint, dict) and "model" in checkpoint:  # there, but no mapping of names to tensors
        raise error(f"checkpoint {path}: its 'model' entry is a {type(checkpoint['model']).__name__}, not a state"
                    f" dict; expected {expected}")
    else:
        held = f"keys {', '.join(map(str, list(checkpoint)[:6]))}" if isinstance(checkpoint, dict) else (
            f"a {type(checkpoint).__name__}")
        raise error(f"checkpoint {path} holds no 'model' state dict ({held}); expected {expected}")
    if not all(isinstance(v, Tensor) for v in state.values()):
        raise error(f"checkpoint {path}: its 'model' entry holds values other than tensors")
    return checkpoint, {str(k).removeprefix("module."): v for k, v in state.items()}  # saved from a DDP wrapper


def load_rope_vit_state(path: str | Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """``(state dict, hints)`` of a RoPE-ViT checkpoint, read with ``weights_only=True``. ``hints``: the file's
    ``arch`` dict merged over what DeiT's ``args`` say (``model``, ``input_size``)."""
    checkpoint, state = read_state_file(path)
    proj = state.get("patch_embed.proj.weight")
    patch = (int(proj.shape[-2]), int(proj.shape[-1])) if proj is not None and proj.dim() == 4 else None
    hints: dict[str, Any] = {}
    args = checkpoint.get("args") if "model" in checkpoint else None
    if isinstance(args, argparse.Namespace):
        args = vars(args)
    if isinstance(args, dict):  # every hint is checked where it is read (None: not said)
        if args.get("model") is not None:
            if not isinstance(args["model"], str):
                raise RoPEViTCheckpointError(
                    f"checkpoint {path}: args.model={args['model']!r} must be a model name (a str, e.g."
                    " 'rope_axial_deit_small_patch16_LS')"
                )
            hints["model"] = args["model"]
        if args.get("input_size") is not None:
            hints["img_size"] = checked_hint("img_size", args["input_size"], f"checkpoint {path}: args.input_size",
                                             patch)
    arch = checkpoint.get("arch") if "model" in checkpoint else None
    if arch is not None and not isinstance(arch, dict):
        raise RoPEViTCheckpointError(
            f"checkpoint {path}: 'arch' is a {type(arch).__name__}; it must be a dict of num_heads, img_size, theta"
        )
    for key in ("num_heads", "img_size", "theta"):
        if arch is not None and arch.get(key) is not None:
            hints[key] = checked_hint(key, arch[key], f"checkpoint {path}: arch.{key}", patch)
    return state, hints


def _layer_count(state: dict[str, Tensor]) -> int:
    found = {int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k))}
    return max(found) + 1 if found else 0


def _refuse_foreign(state: dict[str, Tensor], path: str | Path) -> None:
    """One line for the files that are recognisably something else."""
    for key in ("cls_token", "patch_embed.proj.weight", "blocks.0.attn.qkv.weight"):
        if key not in state:
            other = " (a DETR checkpoint)" if any(k.startswith("transformer.") for k in state) else ""
            raise RoPEViTCheckpointError(
                f"checkpoint {path} has no {key!r}{other}; expected a RoPE-ViT DeiT checkpoint"
            )
    ours = sorted(k for k in state if re.search(r"\.ls[12]\.gamma$|\.rpe_[qkv]\.", k))
    if ours:
        raise RoPEViTCheckpointError(
            f"checkpoint {path} is in timm's / this project's layout ({ours[0]}), not RoPE-ViT's; build the model"
            " with models.create_model and load it there"
        )
    if "dist_token" in state:
        raise RoPEViTCheckpointError(f"checkpoint {path} has a distillation token; RoPE-ViT DeiTs have none")


def _grid(state: dict[str, Tensor], hints: dict[str, Any], patch: tuple[int, int], path: str | Path,
          img_size: Any) -> tuple[int, int]:
    """The image size: ``img_size`` given, else from ``freqs_t_x/y``, the file's hints, ``pos_embed`` (square), 224."""
    if img_size is not None:
        return checked_hint("img_size", img_size, f"checkpoint {path}: the override img_size", patch)
    if "freqs_t_x" in state and "freqs_t_y" in state:
        t_x, t_y = state["freqs_t_x"], state["freqs_t_y"]
        if t_x.dim() != 1 or t_x.shape != t_y.shape or t_x.numel() == 0:
            raise RoPEViTCheckpointError(
                f"checkpoint {path}: freqs_t_x {tuple(t_x.shape)} / freqs_t_y {tuple(t_y.shape)} are not one patch"
                " index per grid cell"
            )
        w, h = int(t_x.max()) + 1, int(t_y.max()) + 1
        want_x, want_y = grid_indices(h, w)
        if t_x.numel() != h * w or not (torch.equal(t_x.float(), want_x) and torch.equal(t_y.float(), want_y)):
            raise RoPEViTCheckpointError(
                f"checkpoint {path}: freqs_t_x / freqs_t_y are not the column / row indices of a row-major grid"
            )
        return h * patch[0], w * patch[1]
    if hints.get("img_size") is not None:
        return checked_hint("img_size", hints["img_size"], f"checkpoint {path}: img_size (from the file)", patch)
    if "pos_embed" in state:
        n = state["pos_embed"].shape[-2]
        side = math.isqrt(n)
        if side * side != n:
            raise RoPEViTCheckpointError(
                f"checkpoint {path}: pos_embed has {n} rows, not a square patch grid (and no class row in"
                " RoPE-ViT's layout); pass img_size=(H, W)"
            )
        return side * patch[0], side * patch[1]
    return DEFAULT_IMG_SIZE, DEFAULT_IMG_SIZE


def rope_vit_architecture(
    state: dict[str, Tensor], hints: dict[str, Any], path: str | Path, **overrides: Any
) -> dict[str, Any]:
    """`RPEVisionTransformer` keyword arguments for a RoPE-ViT state dict (module docstring: what comes from
    where). ``overrides``: ``num_heads``, ``img_size``, ``theta`` and any backbone option, which win; one that is not
    None is given (``0`` is refused, never replaced by the file's value), in the hints' forms; ``ape`` may only say
    what the file holds (``learned`` with ``pos_embed``, else ``none``)."""
    _refuse_foreign(state, path)
    mixed = "freqs" in state
    method = "rope_mixed" if mixed else "rope_axial"
    ape = "pos_embed" in state
    name = hints.get("model")
    zoo = ZOO_NAME.fullmatch(name) if isinstance(name, str) else None
    if isinstance(name, str):
        if zoo is None:
            raise RoPEViTCheckpointError(
                f"checkpoint {path} was trained as args.model={name!r}, not a RoPE-ViT DeiT"
                " (rope_{axial,mixed}[_ape]_deit_{small,base,large}_patch16_LS)"
            )
        if (zoo.group(1) == "mixed") != mixed or bool(zoo.group(2)) != ape:
            found = f"{'mixed' if mixed else 'axial'}{' + APE' if ape else ''}"
            raise RoPEViTCheckpointError(
                f"checkpoint {path}: args.model={name!r}, but its tensors are those of RoPE-{found}"
            )
    if mixed and not all(k in state for k in MIXED_KEYS[1:]):
        raise RoPEViTCheckpointError(f"checkpoint {path} has 'freqs' but no freqs_t_x / freqs_t_y buffers")
    dim = state["cls_token"].shape[-1]
    depth = _layer_count(state)
    proj = state["patch_embed.proj.weight"]
    patch = (proj.shape[-2], proj.shape[-1])
    given = {key: overrides.pop(key, None) for key in ("num_heads", "theta")}
    for key, value in given.items():  # an override is given when it is not None (0 is given, and refused)
        given[key] = None if value is None else checked_hint(key, value, f"checkpoint {path}: the override {key}")
    said = {key: checked_hint(key, hints[key], f"checkpoint {path}: {key} (from the file)")
            for key in ("num_heads", "theta") if hints.get(key) is not None}
    heads = given["num_heads"] if given["num_heads"] is not None else said.get("num_heads")
    if heads is None and zoo is not None:
        heads = ZOO_SIZE_HEADS[zoo.group(3)]
    if heads is None:
        heads = RELEASED_HEADS.get((dim, depth))
    if heads is None:
        known = ", ".join(f"{d}/{n}: {h}" for (d, n), h in RELEASED_HEADS.items())
        raise RoPEViTCheckpointError(
            f"checkpoint {path}: width {dim} with {depth} blocks is no released RoPE-ViT shape (width/depth:"
            f" heads {known}) and the file does not say its heads; pass num_heads="
        )
    if dim % heads or (dim // heads) % 4:
        raise RoPEViTCheckpointError(
            f"checkpoint {path}: width {dim} with num_heads={heads} gives head dim {dim / heads:g}; 2-D RoPE needs"
            " a head dim divisible by 4"
        )
    theta = next((t for t in (given["theta"], said.get("theta")) if t is not None), DEFAULT_THETA[method])
    file_ape = "learned" if ape else "none"
    asked_ape = overrides.pop("ape", None)
    if asked_ape is not None and asked_ape != file_ape:
        held = "a learned position table (pos_embed)" if ape else "no position table (no pos_embed)"
        raise RoPEViTCheckpointError(
            f"checkpoint {path}: the override ape={asked_ape!r} contradicts the file, which holds {held}; valid:"
            f" ape={file_ape!r} or leave ape out"
        )
    img_size = _grid(state, hints, patch, path, overrides.pop("img_size", None))
    if "blocks.0.mlp.fc1.weight" not in state:
        raise RoPEViTCheckpointError(f"checkpoint {path} has no 'blocks.0.mlp.fc1.weight'; expected a RoPE-ViT DeiT")
    kwargs: dict[str, Any] = {
        "rpe": RPEConfig(method=method, theta=float(theta)),
        "ape": file_ape,
        "img_size": img_size,
        "patch_size": patch,
        "in_chans": proj.shape[1],
        "embed_dim": dim,
        "depth": depth,
        "num_heads": int(heads),
        "mlp_ratio": state["blocks.0.mlp.fc1.weight"].shape[0] / dim,
        "qkv_bias": "blocks.0.attn.qkv.bias" in state,
        "init_values": 1.0 if "blocks.0.gamma_1" in state else None,
        "num_classes": state["head.weight"].shape[0] if "head.weight" in state else 0,
        "class_token": True,
        "no_embed_class": True,
        "global_pool": "token",
    }
    return {**kwargs, **overrides}


def _describe(kwargs: dict[str, Any]) -> str:
    rpe = kwargs["rpe"]
    kind = rpe.method.removeprefix("rope_") if isinstance(rpe, RPEConfig) else str(rpe)
    size = kwargs.get("img_size")
    return (
        f"RoPE-ViT DeiT ({kind}{' + APE' if kwargs.get('ape') == 'learned' else ''}, {kwargs.get('depth')} blocks,"
        f" width {kwargs.get('embed_dim')}, {kwargs.get('num_heads')} heads, image {size})"
    )


def _listed(keys: list[str]) -> str:
    shown = ", ".join(keys[:6])
    return f"{shown}, ... ({len(keys)} in all)" if len(keys) > 6 else shown


def refuse_non_finite(state: dict[str, Tensor], path: str | Path,
                      error: type[RunConfigError] = RoPEViTCheckpointError) -> None:
    """One ``error`` line naming the first tensor of ``state`` that holds a NaN or inf, before anything loads."""
    found = first_non_finite(state)
    if found is not None:
        key, bad, total = found
        raise error(f"checkpoint {path} holds non-finite weights: {key} has {bad} NaN/inf of {total} values; a model"
                    " with them gives NaN/inf outputs (use a checkpoint saved before the run diverged)")


def check_key_sets(state: dict[str, Tensor], expected: set[str], path: str | Path, what: str,
                   error: type[RunConfigError] = RoPEViTCheckpointError) -> None:
    """One ``error`` line listing the keys of ``expected`` that ``state`` lacks and those it has beyond them."""
    missing = sorted(expected - set(state))
    unexpected = sorted(set(state) - expected)
    if missing or unexpected:
        parts = [f"missing keys {_listed(missing)}"] if missing else []
        parts += [f"unexpected keys {_listed(unexpected)}"] if unexpected else []
        raise error(f"checkpoint {path} does not fit {what}: {'; '.join(parts)}")


def load_rope_vit_weights(
    model: RPEVisionTransformer, state: dict[str, Tensor], path: str | Path, describe: str = ""
) -> None:
    """Copy a RoPE-ViT ``state`` into ``model`` (strict: every key used, every shape equal); one line otherwise."""
    _check_exportable(model)
    what = describe or "the model"
    ours = model.state_dict()
    heads = model.blocks[0].attn.num_heads
    axial = _method(model) == "rope_axial"
    names = {name: rope_vit_name(name) for name in ours}
    expected = {ref for ref in names.values() if ref is not None}
    if not axial:
        expected |= set(MIXED_KEYS)
    check_key_sets(state, expected, path, what)
    refuse_non_finite(state, path)
    mapped: dict[str, Tensor] = {}
    freqs = None
    if not axial:
        depth, half = len(model.blocks), ours["blocks.0.attn.rpe_k.rope.freqs"].shape[-1]
        if state["freqs"].shape != (2, depth, heads * half):
            raise RoPEViTCheckpointError(
                f"checkpoint {path}: freqs has shape {tuple(state['freqs'].shape)}, {what} expects"
                f" {(2, depth, heads * half)}"
            )
        freqs = state["freqs"].reshape(2, depth, heads, half)[[1, 0]]  # ours: row coefficient first
    for name, ref in names.items():
        if ref is None:
            index = int(OUR_FREQS.fullmatch(name).group(1))
            mapped[name] = freqs[:, index].unsqueeze(1)
            continue
        value = state[ref]
        if value.shape != ours[name].shape:
            raise RoPEViTCheckpointError(
                f"checkpoint {path}: {ref} has shape {tuple(value.shape)}, {what} expects {tuple(ours[name].shape)}"
            )
        if axial and re.fullmatch(r"blocks\.\d+\.attn\.qkv\.(weight|bias)", name):
            value = swap_axis_halves(value, heads)
        mapped[name] = value
    model.load_state_dict(mapped, strict=True)


def from_rope_vit_checkpoint(path: str | Path, **overrides: Any) -> RPEVisionTransformer:
    """Our DeiT, in eval mode, holding a RoPE-ViT DeiT checkpoint's weights (``{"model": state_dict, ...}``).

    The variant (axial/mixed, APE or not, layer scale, depth, width, MLP ratio, patch and image size, classes) is
    read from the tensors; ``num_heads``, ``img_size`` and ``theta`` from the file where it says them, else as the
    module docstring says. ``overrides``: those three and any `RPEVisionTransformer` option
    (``dynamic_img_size=True`` runs other image sizes: the rotations are recomputed for the input's grid, as
    RoPE-ViT does, and an APE is resized by timm's bicubic resampling).
    Its logits equal RoPE-ViT's ``rope_vit_models`` on the same weights (docs/design.md: measured differences).
    """
    state, hints = load_rope_vit_state(path)
    kwargs = rope_vit_architecture(state, hints, path, **overrides)
    model = RPEVisionTransformer(**kwargs)
    load_rope_vit_weights(model, state, path, _describe(kwargs))
    return model.eval()
