"""RoPE-ViT Swin checkpoints (Heo et al., ECCV 2024, ``naver-ai/rope-vit`` ``models/swin_transformer_rope.py``): load
and export.

RoPE-ViT's Swins (``swin_rope_{mixed,axial}_{tiny,small,base}_patch4_window7_224``) are Microsoft's Swin with every
window attention's bias table replaced by 2-D RoPE (``use_rpb=False``). Their files are ``{"model": state_dict, ...}``
in Microsoft's layout: ``patch_embed.proj.*``, ``patch_embed.norm.*``, ``layers.{i}.blocks.{j}.{norm1,norm2}.*``,
``layers.{i}.blocks.{j}.attn.{qkv,proj}.*``, ``layers.{i}.blocks.{j}.mlp.{fc1,fc2}.*``, per attention ``rope_freqs``
``(2, H_i, d/2)`` (a parameter in RoPE-Mixed, a buffer in RoPE-Axial: ``[0]`` per unit column step ``x``, ``[1]`` per
unit row step ``y``) and the buffers ``rope_t_x`` / ``rope_t_y`` ``(w^2,)`` (column / row of each token of the
``w x w`` window, row-major), ``layers.{i}.blocks.{j}.attn_mask`` ``(nW, w^2, w^2)`` (0 / -100, shifted blocks only),
``layers.{i}.downsample.{norm,reduction}.*`` at the end of every stage but the last, ``norm.*`` and ``head.*``.

Our `RPESwinTransformer` (timm's Swin) with ``rpe=rope_mixed|rope_axial`` computes the same function. The mapping:

* timm's names: the downsample of stage ``i`` is timm's ``layers.{i+1}.downsample`` (at the start of the next stage),
  ``head`` is ``head.fc``; ``rope_t_*`` and ``attn_mask`` are recomputed by the model (the loader checks them
  against it, which is how the image size and window are confirmed).
* **Mixed**: ``layers.{i}.blocks.{j}.attn.rpe_k.rope.freqs`` ``(2, 1, H, d/2)`` holds the row coefficient first:
  ``ours[a, 0] = theirs[1 - a]``. No weight is permuted.
* **Axial**: their axial model is the mixed formula with fixed frequencies ``x: (m, m cos(pi/2))``, ``y: (0, m)``,
  ``m_p = theta^(-4p/d)`` (theta 50): channel pairs ``0 .. d/4-1`` turn with the column, the rest with the row
  (``cos(pi/2)`` in float32 is -4.4e-8, a column term of at most 3e-7 rad in a 7-wide window that ours leaves out).
  Ours turns the row pairs first, so the q and k rows of ``attn.qkv`` have the two channel halves of every head
  swapped (`models.rope_vit.swap_axis_halves`, its own inverse). Their frequencies are no parameter of ours: the
  loader reads theta from their ratio (``(m_0 / m_1)^(d/4)``), checks every attention against it and drops them.

What the file tells: depths from the keys, width and patch from ``patch_embed.proj.weight``, heads per stage from
``rope_freqs``, the window (the largest ``rope_t_x`` window), the image size from the first ``attn_mask`` (its window
count, and the first window with a masked pair, which is the last of the first row), else a stage of one window,
else the file's ``arch`` (our exports), else 224; axial or mixed from whether the frequencies are the axial formula.
``img_size=``, ``window_size=``, ``theta=`` and any `RPESwinTransformer` option override. Files are read with
``weights_only=True``; every problem is one `RoPESwinCheckpointError` line (a `RoPEViTCheckpointError`, hence a
``ValueError``). Microsoft's training checkpoints also pickle a yacs ``config``, which ``weights_only`` refuses (the
line says so); their ``["model"]`` saved alone loads.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from models.rope_vit import (
    RoPEViTCheckpointError,
    check_key_sets,
    checked_hint,
    grid_indices,
    read_state_file,
    refuse_non_finite,
    swap_axis_halves,
)
from models.swin import RPESwinTransformer, swin_grid_problem
from rpe import RPEConfig
from storage.destinations import save_export

__all__ = [
    "RoPESwinCheckpointError",
    "axial_frequencies",
    "from_rope_swin_checkpoint",
    "load_rope_swin_state",
    "load_rope_swin_weights",
    "rope_swin_architecture",
    "rope_swin_name",
    "rope_swin_state_dict",
    "shift_mask",
    "to_rope_swin_checkpoint",
]


class RoPESwinCheckpointError(RoPEViTCheckpointError):
    """A RoPE-ViT Swin checkpoint that cannot be read or does not fit the model; one line."""


EXPECTED = "a RoPE-ViT Swin checkpoint (Microsoft's Swin layout with attn.rope_freqs)"
DEFAULT_THETA = {"rope_axial": 50.0, "rope_mixed": 10.0}  # RoPE-ViT's Swin configs (mixed: only the init reads it)
DEFAULT_IMG_SIZE = 224
OUR_FREQS = re.compile(r"layers\.(\d+)\.blocks\.(\d+)\.attn\.rpe_k\.rope\.freqs")
QKV = re.compile(r"layers\.\d+\.blocks\.\d+\.attn\.qkv\.(weight|bias)")
BLOCK = re.compile(r"layers\.(\d+)\.blocks\.(\d+)\.")


def rope_swin_name(name: str) -> str | None:
    """RoPE-ViT's (Microsoft's) key for our state-dict key ``name``; None for a mixed model's frequencies (their
    ``attn.rope_freqs``, mapped with the axes swapped)."""
    if OUR_FREQS.fullmatch(name):
        return None
    found = re.fullmatch(r"layers\.(\d+)\.downsample\.(.+)", name)
    if found:
        return f"layers.{int(found.group(1)) - 1}.downsample.{found.group(2)}"
    return re.sub(r"^head\.fc\.", "head.", name)


def axial_frequencies(theta: float, head_dim: int, num_heads: int) -> Tensor:
    """RoPE-ViT's fixed axial Swin frequencies ``(2, H, d/2)`` float32: ``[0] = (m, m cos(pi/2))`` per column step,
    ``[1] = (0, m)`` per row step, ``m_p = theta^(-4p/d)``, ``p < d/4`` (its mixed formula at angle 0)."""
    mag = 1 / (theta ** (torch.arange(0, head_dim, 4)[: head_dim // 4].float() / head_dim))
    zero = torch.zeros(1)
    fx = torch.cat([mag * torch.cos(zero), mag * torch.cos(torch.pi / 2 + zero)])
    fy = torch.cat([mag * torch.sin(zero), mag * torch.sin(torch.pi / 2 + zero)])
    return torch.stack([fx, fy])[:, None].expand(2, num_heads, head_dim // 2).contiguous()


def shift_mask(height: int, width: int, window: int, shift: int) -> Tensor:
    """Swin's shifted-window mask ``(nW, w^2, w^2)`` of an ``height x width`` token map: 0 between tokens of the same
    region of the rolled map, -100 otherwise (regions: the last ``window`` rows/columns split at ``-shift``)."""
    label = torch.zeros(height, width)
    count = 0
    for rows in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
        for cols in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
            label[rows, cols] = count
            count += 1
    windows = label.view(height // window, window, width // window, window).permute(0, 2, 1, 3).reshape(-1, window**2)
    diff = windows.unsqueeze(1) - windows.unsqueeze(2)
    return diff.masked_fill(diff != 0, -100.0).masked_fill(diff == 0, 0.0)


def _blocks(model: RPESwinTransformer) -> list[tuple[str, Any]]:
    return [(f"layers.{i}.blocks.{j}", block) for i, stage in enumerate(model.layers)
            for j, block in enumerate(stage.blocks)]


def _method(model: RPESwinTransformer) -> str:
    return model.rpe_config.method


def _check_exportable(model: Any) -> None:
    """Refuse (one line) a model RoPE-ViT's Swin cannot express."""
    if not isinstance(model, RPESwinTransformer):
        raise RoPESwinCheckpointError(f"a {type(model).__name__} is not a Swin (RPESwinTransformer)")
    problems = []
    if _method(model) not in DEFAULT_THETA:
        problems.append(f"rpe.method={_method(model)!r} (RoPE-ViT's Swin has rope_axial, rope_mixed)")
    if model.head.global_pool.pool_type != "avg":
        problems.append(f"global_pool={model.head.global_pool.pool_type!r} (Microsoft's Swin: avg)")
    for name, block in _blocks(model):
        win, shift, res, attn = block.window_size, block.shift_size, block.input_resolution, block.attn
        if win[0] != win[1] or shift[0] != shift[1] or shift[0] not in (0, win[0] // 2):
            problems.append(f"{name} has window {win}, shift {shift} (Microsoft's: square windows, shift 0 or w/2)")
        elif any(r % w for r, w in zip(res, win, strict=True)):
            problems.append(f"{name}: a {res} token map that its {win} windows do not tile (timm pads, Microsoft not)")
        elif attn.head_dim * attn.num_heads != attn.dim:
            problems.append(f"{name}: head_dim {attn.head_dim} x {attn.num_heads} heads is not the width {attn.dim}")
        if problems:
            break  # one block says it
    if problems:
        raise RoPESwinCheckpointError(f"RoPE-ViT's Swin cannot express this model: {'; '.join(problems)}")


def rope_swin_state_dict(model: RPESwinTransformer) -> dict[str, Tensor]:
    """Our Swin's state dict in RoPE-ViT's layout (module docstring), with the buffers their model keeps
    (``rope_t_x`` / ``rope_t_y``, ``attn_mask``, the axial ``rope_freqs``)."""
    _check_exportable(model)
    axial = _method(model) == "rope_axial"
    heads = {name: block.attn.num_heads for name, block in _blocks(model)}
    out: dict[str, Tensor] = {}
    for name, value in model.state_dict().items():
        value = value.detach().clone()
        found = OUR_FREQS.fullmatch(name)
        if found:
            out[name.replace("rpe_k.rope.freqs", "rope_freqs")] = value[[1, 0], 0].contiguous()  # x (column) first
            continue
        if axial and QKV.fullmatch(name):
            value = swap_axis_halves(value, heads[BLOCK.match(name).group(0)[:-1]])
        out[rope_swin_name(name)] = value
    for name, block in _blocks(model):
        attn = block.attn
        out[f"{name}.attn.rope_t_x"], out[f"{name}.attn.rope_t_y"] = grid_indices(*attn.window_size)
        if axial:
            out[f"{name}.attn.rope_freqs"] = axial_frequencies(attn.rpe_k.theta, attn.head_dim, attn.num_heads)
        if block.shift_size[0]:
            out[f"{name}.attn_mask"] = shift_mask(*block.input_resolution, block.window_size[0], block.shift_size[0])
    return out


def to_rope_swin_checkpoint(model: RPESwinTransformer, path: str | Path) -> Path:
    """Write ``{"model": RoPE-ViT Swin state dict, "arch": {img_size, window_size, theta}}`` to ``path`` atomically.

    RoPE-ViT's ``RoPESwinTransformer`` of the same shape loads ``["model"]`` with ``strict=True``;
    `from_rope_swin_checkpoint` reads it (``arch`` only where the tensors do not tell). A ``path`` inside a run's
    dir or a data root is refused in one line (`storage.destinations`)."""
    state = rope_swin_state_dict(model)
    attn = model.layers[0].blocks[0].attn
    arch = {"img_size": list(model.patch_embed.img_size), "window_size": max(model.layers[0].blocks[0].window_size),
            "theta": float(attn.rpe_k.theta)}
    return save_export({"model": state, "arch": arch}, path, "to_rope_swin_checkpoint", RoPESwinCheckpointError)


def load_rope_swin_state(path: str | Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """``(state dict, hints)`` of a RoPE-ViT Swin file, read with ``weights_only=True``; ``hints``: its ``arch``."""
    checkpoint, state = read_state_file(path, EXPECTED, RoPESwinCheckpointError, safe_globals=())
    arch = checkpoint.get("arch") if "model" in checkpoint else None
    if arch is not None and not isinstance(arch, dict):
        raise RoPESwinCheckpointError(
            f"checkpoint {path}: 'arch' is a {type(arch).__name__}; it must be a dict of img_size, window_size, theta"
        )
    proj = state.get("patch_embed.proj.weight")
    patch = (int(proj.shape[-2]), int(proj.shape[-1])) if proj is not None and proj.dim() == 4 else None
    hints = {key: checked_hint(key, arch[key], f"checkpoint {path}: arch.{key}", patch, RoPESwinCheckpointError)
             for key in ("img_size", "theta") if arch is not None and arch.get(key) is not None}
    return state, hints


def _refuse_foreign(state: dict[str, Tensor], path: str | Path) -> None:
    """One line for the files that are recognisably something else."""
    if "cls_token" in state or any(k.startswith("blocks.") for k in state):
        raise RoPESwinCheckpointError(
            f"checkpoint {path} is a ViT / DeiT checkpoint (cls_token, blocks.*), not {EXPECTED}; a RoPE-ViT DeiT"
            " loads with models.from_rope_vit_checkpoint"
        )
    if any(k.startswith("transformer.") for k in state):
        raise RoPESwinCheckpointError(f"checkpoint {path} is a DETR checkpoint (transformer.*), not {EXPECTED}")
    ours = sorted(k for k in state if re.search(r"\.rpe_[qkv]\.|^head\.fc\.", k))
    if ours:
        raise RoPESwinCheckpointError(
            f"checkpoint {path} is in timm's / this project's layout ({ours[0]}), not RoPE-ViT's; build the model"
            " with models.create_model and load it there"
        )
    for key in ("patch_embed.proj.weight", "layers.0.blocks.0.attn.qkv.weight"):
        if key not in state:
            raise RoPESwinCheckpointError(f"checkpoint {path} has no {key!r}; expected {EXPECTED}")
    bias = any(k.endswith("relative_position_bias_table") for k in state)
    if not any(k.endswith(".attn.rope_freqs") for k in state):
        other = " (a Swin with Swin's bias table: models.swin.load_swin_checkpoint loads it)" if bias else ""
        raise RoPESwinCheckpointError(f"checkpoint {path} has no attn.rope_freqs{other}; expected {EXPECTED}")
    if bias:
        raise RoPESwinCheckpointError(
            f"checkpoint {path} has RoPE and Swin's relative_position_bias_table (RoPE-ViT's use_rpb=True); our Swin"
            " holds one encoding per attention: valid are RoPE-Mixed and RoPE-Axial Swins (use_rpb=False)"
        )


def _depths(state: dict[str, Tensor]) -> tuple[int, ...]:
    blocks: dict[int, set[int]] = {}
    for key in state:
        if found := BLOCK.match(key):
            blocks.setdefault(int(found.group(1)), set()).add(int(found.group(2)))
    return tuple(len(blocks.get(i, ())) for i in range(max(blocks) + 1))


def _window_side(state: dict[str, Tensor], prefix: str, path: str | Path) -> int:
    """The side of the square window whose ``rope_t_x`` / ``rope_t_y`` are under ``prefix``."""
    t_x, t_y = state.get(f"{prefix}.rope_t_x"), state.get(f"{prefix}.rope_t_y")
    if t_x is None or t_y is None:
        raise RoPESwinCheckpointError(f"checkpoint {path} has no {prefix}.rope_t_x / rope_t_y; expected {EXPECTED}")
    side = math.isqrt(t_x.numel())
    if t_x.dim() != 1 or t_x.shape != t_y.shape or side == 0 or side * side != t_x.numel():
        raise RoPESwinCheckpointError(
            f"checkpoint {path}: {prefix}.rope_t_x {tuple(t_x.shape)} / rope_t_y {tuple(t_y.shape)} are not one index"
            " per token of a square window"
        )
    return side


def _read_theta(freqs: dict[str, Tensor]) -> float | None:
    """The axial theta of the first attention's frequencies, or None if it has one band (any theta: ``m_0 = 1``)."""
    first = next(iter(freqs.values()))
    mag = first[0, 0, : first.shape[-1] // 2].double()
    if mag.numel() < 2 or not (mag > 0).all():
        return None
    bands = mag.numel()
    theta = float((mag[0] / mag[1]) ** bands)  # m_p = theta^(-p / bands)
    return float(f"{theta:.6g}")


def _axial_theta(freqs: dict[str, Tensor], hint: Any) -> float | None:
    """Theta if every attention's ``rope_freqs`` is RoPE-ViT's fixed axial formula for it, else None (mixed)."""
    theta = _read_theta(freqs)
    use = theta if theta is not None else float(hint if hint is not None else DEFAULT_THETA["rope_axial"])
    for value in freqs.values():
        want = axial_frequencies(use, value.shape[-1] * 2, value.shape[1])
        if not torch.allclose(value.float(), want, rtol=1e-5, atol=1e-7):
            return None
    return use


def _image_grid(state: dict[str, Tensor], depths: tuple[int, ...], windows: list[int],
                path: str | Path) -> tuple[int, int] | None:
    """The stage-0 token map ``(h, w)`` from the first shifted block's ``attn_mask``; else from the stages of two or
    more blocks (without a mask one window covers each); None if no stage tells."""
    for i, depth in enumerate(depths):
        for j in range(depth):
            key = f"layers.{i}.blocks.{j}.attn_mask"
            if key not in state:
                continue
            mask, side = state[key], windows[i]
            if mask.dim() != 3 or tuple(mask.shape[1:]) != (side * side, side * side) or not mask.ne(0).any():
                raise RoPESwinCheckpointError(
                    f"checkpoint {path}: {key} {tuple(mask.shape)} is no shifted-window mask of {side}x{side} windows"
                    f" (expected (windows, {side * side}, {side * side}) of 0 / -100)"
                )
            masked = mask.flatten(1).ne(0).any(1)
            cols = int(masked.nonzero()[0]) + 1  # the first masked window ends the first row of windows
            if mask.shape[0] % cols:
                raise RoPESwinCheckpointError(f"checkpoint {path}: {key} is no shifted-window mask of a token map")
            return mask.shape[0] // cols * side * 2**i, cols * side * 2**i
    # no shifted block: each stage of two or more blocks is one window (the largest, should a file lack its masks)
    sides = [windows[i] * 2**i for i, depth in enumerate(depths) if depth >= 2]
    return (max(sides), max(sides)) if sides else None


def rope_swin_architecture(
    state: dict[str, Tensor], hints: dict[str, Any], path: str | Path, **overrides: Any
) -> dict[str, Any]:
    """`RPESwinTransformer` keyword arguments for a RoPE-ViT Swin state dict (module docstring: what comes from
    where). ``overrides``: ``img_size``, ``window_size``, ``theta`` and any backbone option, which win."""
    _refuse_foreign(state, path)
    proj = state["patch_embed.proj.weight"]
    patch_hw = (int(proj.shape[-2]), int(proj.shape[-1])) if proj.dim() == 4 else None
    for key in ("theta", "img_size", "window_size"):  # 0 is a value to refuse, never "not given"
        if overrides.get(key) is not None:
            overrides[key] = checked_hint(key, overrides[key], f"checkpoint {path}: the override {key}", patch_hw,
                                          RoPESwinCheckpointError)
    depths = _depths(state)
    if 0 in depths:
        raise RoPESwinCheckpointError(
            f"checkpoint {path}: stage {depths.index(0)} has no blocks (layers.*.blocks.* of {len(depths)} stages)"
        )
    proj = state["patch_embed.proj.weight"]
    if proj.dim() != 4:
        raise RoPESwinCheckpointError(f"checkpoint {path}: patch_embed.proj.weight {tuple(proj.shape)} is no conv")
    dim, patch = proj.shape[0], (proj.shape[-2], proj.shape[-1])
    heads, windows, freqs = [], [], {}
    for i, depth in enumerate(depths):
        for j in range(depth):
            prefix = f"layers.{i}.blocks.{j}.attn"
            value = state.get(f"{prefix}.rope_freqs")
            if value is None:
                raise RoPESwinCheckpointError(f"checkpoint {path} has no {prefix}.rope_freqs; expected {EXPECTED}")
            width = dim * 2**i
            if value.dim() != 3 or value.shape[0] != 2 or value.shape[1] * value.shape[2] * 2 != width or (
                    value.shape[2] % 2):
                raise RoPESwinCheckpointError(
                    f"checkpoint {path}: {prefix}.rope_freqs has shape {tuple(value.shape)}; stage {i} (width {width})"
                    " expects (2, heads, head_dim / 2) with heads x head_dim = width and head_dim divisible by 4"
                )
            if j == 0:
                heads.append(value.shape[1])
                windows.append(_window_side(state, prefix, path))
            freqs[prefix] = value
    given = overrides.pop("theta", None)
    hint = given if given is not None else hints.get("theta")
    theta = _axial_theta(freqs, hint)
    method = "rope_mixed" if theta is None else "rope_axial"
    theta = next(t for t in (given, theta, hints.get("theta"), DEFAULT_THETA[method]) if t is not None)
    img_size = overrides.pop("img_size", None)
    if img_size is None:
        grid = _image_grid(state, depths, windows, path)
        img_size = (grid[0] * patch[0], grid[1] * patch[1]) if grid else tuple(hints.get("img_size") or (
            DEFAULT_IMG_SIZE, DEFAULT_IMG_SIZE))
    if "layers.0.blocks.0.mlp.fc1.weight" not in state:
        raise RoPESwinCheckpointError(f"checkpoint {path} has no layers.0.blocks.0.mlp.fc1.weight; expected {EXPECTED}")
    kwargs: dict[str, Any] = {
        "rpe": RPEConfig(method=method, theta=float(theta)),
        "img_size": img_size,
        "patch_size": patch[0] if patch[0] == patch[1] else patch,
        "in_chans": proj.shape[1],
        "embed_dim": dim,
        "depths": depths,
        "num_heads": tuple(heads),
        "window_size": max(windows),
        "mlp_ratio": state["layers.0.blocks.0.mlp.fc1.weight"].shape[0] / dim,
        "qkv_bias": "layers.0.blocks.0.attn.qkv.bias" in state,
        "num_classes": state["head.weight"].shape[0] if "head.weight" in state else 0,
    }
    return {**kwargs, **overrides}


def _describe(kwargs: dict[str, Any]) -> str:
    rpe = kwargs["rpe"]
    kind = rpe.method.removeprefix("rope_") if isinstance(rpe, RPEConfig) else str(rpe)
    return (
        f"RoPE-ViT Swin ({kind}, depths {tuple(kwargs.get('depths', ()))}, width {kwargs.get('embed_dim')}, heads"
        f" {tuple(kwargs.get('num_heads', ()))}, window {kwargs.get('window_size')}, image {kwargs.get('img_size')})"
    )


def _check_buffers(model: RPESwinTransformer, state: dict[str, Tensor], path: str | Path, what: str) -> None:
    """The file's recomputed buffers (windows, shift masks, axial frequencies) must be the model's."""
    axial = _method(model) == "rope_axial"
    for name, block in _blocks(model):
        attn = block.attn
        t_x, t_y = grid_indices(*attn.window_size)
        if not (torch.equal(state[f"{name}.attn.rope_t_x"].float(), t_x)
                and torch.equal(state[f"{name}.attn.rope_t_y"].float(), t_y)):
            raise RoPESwinCheckpointError(
                f"checkpoint {path}: {name}.attn.rope_t_x / rope_t_y are not the column / row indices of the"
                f" {attn.window_size} window of {what}"
            )
        freqs = state[f"{name}.attn.rope_freqs"]
        if axial:
            want = axial_frequencies(attn.rpe_k.theta, attn.head_dim, attn.num_heads)
            if freqs.shape != want.shape or not torch.allclose(freqs.float(), want, rtol=1e-5, atol=1e-7):
                raise RoPESwinCheckpointError(
                    f"checkpoint {path}: {name}.attn.rope_freqs are not the fixed axial frequencies of {what}"
                    f" (theta {attn.rpe_k.theta:g}); a mixed file loads as mixed"
                )
        if block.shift_size[0]:
            mask = state[f"{name}.attn_mask"]
            want = shift_mask(*block.input_resolution, block.window_size[0], block.shift_size[0])
            if mask.shape != want.shape or not torch.equal(mask.float(), want):
                raise RoPESwinCheckpointError(
                    f"checkpoint {path}: {name}.attn_mask {tuple(mask.shape)} is not the shift mask of {what}"
                    f" ({tuple(want.shape)}); pass img_size=(H, W) if the file's image size was read wrongly"
                )


def load_rope_swin_weights(
    model: RPESwinTransformer, state: dict[str, Tensor], path: str | Path, describe: str = ""
) -> None:
    """Copy a RoPE-ViT Swin ``state`` into ``model`` (strict: every key used, every shape equal, the recomputed
    buffers equal to the model's); one line otherwise."""
    _check_exportable(model)
    what = describe or "the model"
    axial = _method(model) == "rope_axial"
    ours = model.state_dict()
    names = {name: rope_swin_name(name) for name in ours}
    expected = {ref for ref in names.values() if ref is not None}
    for name, block in _blocks(model):
        expected |= {f"{name}.attn.rope_freqs", f"{name}.attn.rope_t_x", f"{name}.attn.rope_t_y"}
        if block.shift_size[0]:
            expected.add(f"{name}.attn_mask")
    check_key_sets(state, expected, path, what, RoPESwinCheckpointError)
    refuse_non_finite(state, path, RoPESwinCheckpointError)
    _check_buffers(model, state, path, what)
    heads = {name: block.attn.num_heads for name, block in _blocks(model)}
    mapped: dict[str, Tensor] = {}
    for name, ref in names.items():
        if ref is None:
            ref = name.replace("rpe_k.rope.freqs", "rope_freqs")
            value = state[ref][[1, 0]].unsqueeze(1)  # ours: row coefficient first, (2, 1, H, d/2)
        else:
            value = state[ref]
        if value.shape != ours[name].shape:
            want = tuple(ours[name].shape) if names[name] is not None else (2, *ours[name].shape[2:])
            raise RoPESwinCheckpointError(
                f"checkpoint {path}: {ref} has shape {tuple(state[ref].shape)}, {what} expects {want}"
            )
        if axial and QKV.fullmatch(name):
            value = swap_axis_halves(value, heads[BLOCK.match(name).group(0)[:-1]])
        mapped[name] = value
    model.load_state_dict(mapped, strict=True)


def from_rope_swin_checkpoint(path: str | Path, **overrides: Any) -> RPESwinTransformer:
    """Our Swin, in eval mode, holding a RoPE-ViT Swin checkpoint's weights (``{"model": state_dict, ...}``).

    The variant (mixed/axial and theta, depths, width, heads per stage, window, MLP ratio, patch and image size,
    classes) is read from the tensors (module docstring). ``overrides``: ``img_size``, ``window_size``, ``theta`` and
    any `RPESwinTransformer` option. Its logits equal RoPE-ViT's ``RoPESwinTransformer`` on the same weights
    (docs/design.md 1.5: measured differences).
    """
    state, hints = load_rope_swin_state(path)
    kwargs = rope_swin_architecture(state, hints, path, **overrides)
    side_problems = [swin_grid_problem(int(s), int(p), int(kwargs["window_size"]), len(kwargs["depths"]))
                     for s, p in zip(_pair(kwargs["img_size"]), _pair(kwargs["patch_size"]), strict=True)]
    problem = next((p for p in side_problems if p), None)
    if problem:
        raise RoPESwinCheckpointError(
            f"checkpoint {path}: image {kwargs['img_size']} does not fit {_describe(kwargs)}: {problem}"
        )
    model = RPESwinTransformer(**kwargs)
    load_rope_swin_weights(model, state, path, _describe(kwargs))
    return model.eval()


def _pair(value: Any) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, (int, float)) else (int(value[0]), int(value[1]))
