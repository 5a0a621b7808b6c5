"""RoPE-ViT Swin checkpoints (naver-ai/rope-vit ``models/swin_transformer_rope.py``, Microsoft's Swin layout): the key
names and shapes written out here by hand from that module tree, a Swin forward written here from its formulas
(Microsoft's windows, shift, mask and patch merging; complex channel pairs turned by ``t_x fx + t_y fy`` with
``rope_freqs[0]`` per column step), export/load round trips, the axis layout worked by hand, the image size read from
the shift mask, bad files in one line and ``weights_only`` loading. Independent of `models.rope_swin`'s tables and of
RoPE-ViT's code (the comparison with that code is recorded in docs/design.md 1.5)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import models
from lifecycle.run_config import RunConfigError
from models.rope_swin import (
    RoPESwinCheckpointError,
    from_rope_swin_checkpoint,
    load_rope_swin_state,
    rope_swin_architecture,
    to_rope_swin_checkpoint,
)
from models.rope_vit import RoPEViTCheckpointError
from models.swin import RPESwinTransformer
from rpe import RPEConfig

# 2 stages, 32 px, patch 4, window 4: stage 0 is 8x8 tokens (4 windows, block 1 shifted by 2), stage 1 4x4 (one
# window, no shift). Widths 16 / 32, 2 heads each: head dims 8 / 16.
IMG, PATCH, WINDOW, DIM, DEPTHS, HEADS, CLASSES = 32, 4, 4, 16, (2, 2), (2, 2), 5

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def hand_keys(img: tuple[int, int] = (IMG, IMG), window: int = WINDOW, dim: int = DIM, depths=DEPTHS, heads=HEADS,
              mlp: int = 4, classes: int = CLASSES) -> dict[str, tuple[int, ...]]:
    """RoPE-ViT's Swin state-dict keys and shapes (RoPESwinTransformer: Microsoft's SwinTransformer whose blocks hold
    RoPEWindowAttention, use_rpb=False; rope_freqs a parameter (mixed) or a buffer (axial), both saved)."""
    keys: dict[str, tuple[int, ...]] = {
        "patch_embed.proj.weight": (dim, 3, PATCH, PATCH), "patch_embed.proj.bias": (dim,),
        "patch_embed.norm.weight": (dim,), "patch_embed.norm.bias": (dim,),
    }
    h, w = img[0] // PATCH, img[1] // PATCH
    for i, depth in enumerate(depths):
        width = dim * 2**i
        one_window = min(h, w) <= window
        side = min(h, w) if one_window else window
        for j in range(depth):
            p = f"layers.{i}.blocks.{j}."
            if j % 2 and not one_window:
                keys[p + "attn_mask"] = ((h // side) * (w // side), side * side, side * side)
            keys.update({
                p + "norm1.weight": (width,), p + "norm1.bias": (width,),
                p + "attn.rope_t_x": (side * side,), p + "attn.rope_t_y": (side * side,),
                p + "attn.rope_freqs": (2, heads[i], width // heads[i] // 2),
                p + "attn.qkv.weight": (3 * width, width), p + "attn.qkv.bias": (3 * width,),
                p + "attn.proj.weight": (width, width), p + "attn.proj.bias": (width,),
                p + "norm2.weight": (width,), p + "norm2.bias": (width,),
                p + "mlp.fc1.weight": (mlp * width, width), p + "mlp.fc1.bias": (mlp * width,),
                p + "mlp.fc2.weight": (width, mlp * width), p + "mlp.fc2.bias": (width,),
            })
        if i < len(depths) - 1:  # Microsoft: patch merging at the end of the stage
            keys.update({f"layers.{i}.downsample.norm.weight": (4 * width,),
                         f"layers.{i}.downsample.norm.bias": (4 * width,),
                         f"layers.{i}.downsample.reduction.weight": (2 * width, 4 * width)})
            h, w = h // 2, w // 2
    last = dim * 2 ** (len(depths) - 1)
    keys.update({"norm.weight": (last,), "norm.bias": (last,), "head.weight": (classes, last),
                 "head.bias": (classes,)})
    return keys


def region_mask(h: int, w: int, window: int, shift: int) -> torch.Tensor:
    """Microsoft's shift mask from its definition, token by token: on the rolled ``h x w`` map a token's region is
    (band of its row, band of its column), bands ``[0, h-window)``, ``[h-window, h-shift)``, ``[h-shift, h)``; two
    tokens of one window see each other (0) iff their regions agree, else -100. ``(nW, window^2, window^2)``."""
    def band(x: int, n: int) -> int:
        return 0 if x < n - window else 1 if x < n - shift else 2

    out = torch.zeros((h // window) * (w // window), window**2, window**2)
    for wr in range(h // window):
        for wc in range(w // window):
            cells = [(wr * window + r, wc * window + c) for r in range(window) for c in range(window)]
            regions = [(band(r, h), band(c, w)) for r, c in cells]
            for a, ra in enumerate(regions):
                for b, rb in enumerate(regions):
                    out[wr * (w // window) + wc, a, b] = 0.0 if ra == rb else -100.0
    return out


def axial_freqs_by_hand(theta: float, head_dim: int, heads: int) -> torch.Tensor:
    """RoPE-ViT's axial Swin frequencies: its mixed formula at angle 0, ``x: (m, m cos(pi/2))``, ``y: (0, m)``."""
    mag = [theta ** (-4 * p / head_dim) for p in range(head_dim // 4)]
    cos_half_pi = math.cos(torch.tensor(math.pi / 2).item())  # float32's pi/2: -4.4e-8
    fx = mag + [m * cos_half_pi for m in mag]
    fy = [0.0] * len(mag) + mag
    return torch.tensor([fx, fy]).unsqueeze(1).expand(2, heads, head_dim // 2)


def hand_state(mixed: bool, img: tuple[int, int] = (IMG, IMG), window: int = WINDOW, theta: float = 50.0,
               seed: int = 0) -> dict[str, torch.Tensor]:
    """A RoPE-ViT Swin file's tensors made by hand: random weights, mixed frequencies of their magnitudes or the
    axial ones, the window grids and shift masks."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in hand_keys(img, window).items():
        if key.endswith("rope_t_x") or key.endswith("rope_t_y"):
            side = math.isqrt(shape[0])
            state[key] = torch.tensor([float(t % side if key.endswith("x") else t // side) for t in range(shape[0])])
        elif key.endswith("attn_mask"):
            stage = int(key.split(".")[1])
            h, w = img[0] // PATCH // 2**stage, img[1] // PATCH // 2**stage
            state[key] = region_mask(h, w, window, window // 2)
        elif key.endswith("rope_freqs"):
            state[key] = (torch.randn(shape, generator=gen) if mixed
                          else axial_freqs_by_hand(theta, shape[2] * 2, shape[1]).float().clone())
        elif key.endswith("weight") and "norm" in key:
            state[key] = 1 + 0.3 * torch.randn(shape, generator=gen)
        else:
            state[key] = torch.randn(shape, generator=gen) * (1.0 / math.sqrt(shape[-1]) if len(shape) >= 2 else 0.3)
    return state


def their_forward(state: dict[str, torch.Tensor], images: torch.Tensor, window: int = WINDOW) -> torch.Tensor:
    """RoPE-ViT's Swin forward from its formulas, float64. Microsoft's Swin: a stage whose token map is no larger
    than the window is one window and never shifted, else odd blocks roll by ``-window // 2`` and add the shift
    mask; patch merging concatenates (even row, even col), (odd, even), (even, odd), (odd, odd). In each window,
    channel pair ``p`` of a head (``x_2p + i x_2p+1``) turns by ``col fx[h, p] + row fy[h, p]``, ``(fx, fy) =
    rope_freqs``; q is scaled by ``d^-0.5``."""
    s = {k: v.double() for k, v in state.items()}
    x = F.conv2d(images.double(), s["patch_embed.proj.weight"], s["patch_embed.proj.bias"], stride=PATCH)
    x = F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), s["patch_embed.norm.weight"], s["patch_embed.norm.bias"])
    stages = 1 + max(int(k.split(".")[1]) for k in s if k.startswith("layers."))
    for i in range(stages):
        b, h, w, c = x.shape
        one_window = min(h, w) <= window
        ws = min(h, w) if one_window else window
        depth = 1 + max(int(k.split(".")[3]) for k in s if k.startswith(f"layers.{i}.blocks."))
        for j in range(depth):
            p = f"layers.{i}.blocks.{j}."
            shift = 0 if one_window or j % 2 == 0 else window // 2
            freqs = s[p + "attn.rope_freqs"]
            heads, hd = freqs.shape[1], 2 * freqs.shape[2]
            y = F.layer_norm(x, (c,), s[p + "norm1.weight"], s[p + "norm1.bias"])
            y = torch.roll(y, (-shift, -shift), (1, 2)) if shift else y
            win = y.view(b, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, c)
            qkv = F.linear(win, s[p + "attn.qkv.weight"], s[p + "attn.qkv.bias"]).reshape(-1, ws * ws, 3, heads, hd)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            cell = torch.arange(ws * ws, dtype=torch.float64)
            col, row = cell % ws, torch.div(cell, ws, rounding_mode="floor")
            angle = col[None, :, None] * freqs[0][:, None] + row[None, :, None] * freqs[1][:, None]  # (H, N, d/2)
            turn = torch.polar(torch.ones_like(angle), angle)

            def rotate(t: torch.Tensor, turn: torch.Tensor = turn, hd: int = hd) -> torch.Tensor:
                pairs = torch.view_as_complex(t.reshape(*t.shape[:-1], hd // 2, 2).contiguous())
                return torch.view_as_real(pairs * turn).flatten(-2)

            attn = rotate(q * hd**-0.5) @ rotate(k).transpose(-2, -1)
            if shift:
                mask = region_mask(h, w, ws, shift).double()
                attn = (attn.view(b, -1, heads, ws * ws, ws * ws) + mask[None, :, None]).view_as(attn)
            out = (attn.softmax(-1) @ v).transpose(1, 2).reshape(-1, ws * ws, c)
            out = F.linear(out, s[p + "attn.proj.weight"], s[p + "attn.proj.bias"])
            out = out.view(b, h // ws, w // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
            x = x + (torch.roll(out, (shift, shift), (1, 2)) if shift else out)
            y = F.layer_norm(x, (c,), s[p + "norm2.weight"], s[p + "norm2.bias"])
            y = F.linear(F.gelu(F.linear(y, s[p + "mlp.fc1.weight"], s[p + "mlp.fc1.bias"])), s[p + "mlp.fc2.weight"],
                         s[p + "mlp.fc2.bias"])
            x = x + y
        if i < stages - 1:
            p = f"layers.{i}.downsample."
            x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], dim=-1)
            x = F.linear(F.layer_norm(x, (4 * c,), s[p + "norm.weight"], s[p + "norm.bias"]), s[p + "reduction.weight"])
    x = F.layer_norm(x, (x.shape[-1],), s["norm.weight"], s["norm.bias"]).mean(dim=(1, 2))
    return F.linear(x, s["head.weight"], s["head.bias"])


def images(h: int = IMG, w: int = IMG) -> torch.Tensor:
    return torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(5))


def our_model(method: str, theta: float | None = None, img: tuple[int, int] = (IMG, IMG),
              window: int = WINDOW) -> RPESwinTransformer:
    torch.manual_seed(1)
    model = RPESwinTransformer(
        rpe=RPEConfig(method=method, theta=theta), img_size=img, patch_size=PATCH, window_size=window,
        embed_dim=DIM, depths=DEPTHS, num_heads=HEADS, num_classes=CLASSES, drop_path_rate=0.0,
    )
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_((0.1 if name.endswith("rope.freqs") else 0.3) * torch.randn(p.shape, generator=gen))
    return model.eval()


def save(tmp_path: Path, state: dict, name: str = "rope_swin.pth", **extra) -> Path:
    path = tmp_path / name
    torch.save({"model": state, **extra}, path)
    return path


@pytest.mark.parametrize(("method", "theta"), [("rope_mixed", None), ("rope_axial", None), ("rope_axial", 50.0)])
def test_export_has_rope_swin_keys_and_round_trips_exactly(method, theta, tmp_path: Path) -> None:
    """Export: RoPE-ViT's keys and shapes, its buffers as its code makes them, its forward's logits; loading the
    export gives identical tensors and logits."""
    model = our_model(method, theta)
    theta = model.layers[0].blocks[0].attn.rpe_k.theta  # ours defaults to RoPE-ViT's DeiT thetas: 100 axial, 10 mixed
    path = to_rope_swin_checkpoint(model, tmp_path / "export.pth")
    state, _ = load_rope_swin_state(path)
    assert {k: tuple(v.shape) for k, v in state.items()} == hand_keys()
    assert state["layers.0.blocks.0.attn.rope_t_x"].tolist() == [0, 1, 2, 3] * 4
    assert state["layers.0.blocks.0.attn.rope_t_y"].tolist() == [r for r in range(4) for _ in range(4)]
    assert torch.equal(state["layers.0.blocks.1.attn_mask"], region_mask(8, 8, 4, 2))
    if method == "rope_axial":
        for i, hd in enumerate((8, 16)):
            want = axial_freqs_by_hand(theta, hd, 2).float()
            torch.testing.assert_close(state[f"layers.{i}.blocks.1.attn.rope_freqs"], want, atol=1e-7, rtol=1e-6)
    else:  # no axis change of a learned tensor other than the swap: column coefficients first
        ours = model.layers[1].blocks[0].attn.rpe_k.rope.freqs
        assert torch.equal(state["layers.1.blocks.0.attn.rope_freqs"][0], ours[1, 0])
    x = images()
    with torch.no_grad():
        logits = model(x)
    torch.testing.assert_close(their_forward(state, x), logits.double(), atol=1e-5, rtol=0)
    loaded = models.from_rope_swin_checkpoint(path)  # the package's name for it
    assert not loaded.training and loaded.rpe_config.method == method
    assert loaded.rpe_config.theta == theta
    assert loaded.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    with torch.no_grad():
        assert torch.equal(loaded(x), logits)


@pytest.mark.parametrize("mixed", [True, False])
def test_hand_built_rope_swin_file_gives_its_forward(mixed: bool, tmp_path: Path) -> None:
    """A file in RoPE-ViT's layout made by hand loads (variant, heads, window, image size and axial theta read from
    its tensors) and gives the logits of RoPE-ViT's forward; exported again it is the same file, tensor for tensor."""
    state = hand_state(mixed, theta=50.0)
    path = save(tmp_path, state, epoch=3)
    model = from_rope_swin_checkpoint(path)
    assert model.rpe_config.method == ("rope_mixed" if mixed else "rope_axial")
    assert [stage.blocks[0].attn.num_heads for stage in model.layers] == list(HEADS)
    assert model.patch_embed.img_size == (IMG, IMG) and max(model.layers[0].blocks[0].window_size) == WINDOW
    if not mixed:
        assert model.rpe_config.theta == 50.0
    x = images()
    with torch.no_grad():
        logits = model(x)
    torch.testing.assert_close(their_forward(state, x), logits.double(), atol=1e-5, rtol=0)
    again, _ = load_rope_swin_state(to_rope_swin_checkpoint(model, tmp_path / "again.pth"))
    assert again.keys() == state.keys()
    for key, value in state.items():
        if key.endswith("rope_freqs") and not mixed:  # recomputed from theta: float32 rounding of the hand values
            torch.testing.assert_close(again[key], value, atol=1e-7, rtol=1e-6)
        else:
            assert torch.equal(again[key], value), key


def test_image_size_is_read_from_the_shift_mask(tmp_path: Path) -> None:
    """A 32x48 image at window 2: stage 0 has 4x6 windows, stage 1 2x3; the size comes from the first mask (its
    window count and where its first row of windows ends). Without any mask a two-block stage is one window; an
    override that contradicts the mask is one line naming it."""
    state = hand_state(True, img=(32, 48), window=2)
    assert state["layers.0.blocks.1.attn_mask"].shape == (24, 4, 4)
    path = save(tmp_path, state)
    model = from_rope_swin_checkpoint(path)
    assert model.patch_embed.img_size == (32, 48) and model.layers[0].blocks[0].window_size == (2, 2)
    x = images(32, 48)
    with torch.no_grad():
        torch.testing.assert_close(their_forward(state, x, window=2), model(x).double(), atol=1e-5, rtol=0)
    with pytest.raises(RoPESwinCheckpointError, match=r"layers.0.blocks.1.attn_mask \(24, 4, 4\) is not the shift"
                                                      r" mask of RoPE-ViT Swin .* image \(48, 32\)"):
        from_rope_swin_checkpoint(path, img_size=(48, 32))

    single = hand_state(True, img=(16, 16), window=4)  # 4x4 tokens: one window, never shifted
    assert not any(k.endswith("attn_mask") for k in single)
    arch = rope_swin_architecture(single, {}, "f")
    assert (arch["img_size"], arch["window_size"], arch["num_heads"]) == ((16, 16), 4, HEADS)


def test_axis_layout_worked_by_hand(tmp_path: Path) -> None:
    """One head of 8 channels in a 2x2 window (8 px, patch 4, one stage). Mixed: rope_freqs[0] (per column step)
    = (0.5, -0.25, 0.125, 1), [1] (per row step) = (0.75, 0.5, -1, 0.25); pair p of the token at (row, col) turns by
    ``col fx_p + row fy_p``; ours does it with no permutation of qkv. Axial, theta 50 (m = 1, 50^-1/2): RoPE-ViT
    turns pairs 0, 1 by ``col``, ``0.141 col`` and 2, 3 by ``row``, ``0.141 row``; ours turns the first half with the
    row, and the loader swaps the halves of q and k so that ours rotates the same vectors, halves swapped."""
    def turned(v: list[float], angles: list[float]) -> list[float]:
        out = []
        for p, angle in enumerate(angles):
            a, b = v[2 * p], v[2 * p + 1]
            out += [a * math.cos(angle) - b * math.sin(angle), a * math.sin(angle) + b * math.cos(angle)]
        return out

    def tiny(freqs: torch.Tensor) -> dict[str, torch.Tensor]:
        keys = {k: s for k, s in hand_keys((8, 8), window=2, dim=8, depths=(1,), heads=(1,)).items()}
        state = {k: torch.zeros(s) for k, s in keys.items()}
        state.update({"layers.0.blocks.0.attn.rope_freqs": freqs, "layers.0.blocks.0.attn.rope_t_x":
                      torch.tensor([0.0, 1, 0, 1]), "layers.0.blocks.0.attn.rope_t_y": torch.tensor([0.0, 0, 1, 1])})
        state["layers.0.blocks.0.attn.qkv.weight"] = torch.randn(24, 8)
        return state

    v = [float(i) for i in range(1, 9)]
    cells = [(0, 0), (0, 1), (1, 0), (1, 1)]  # (row, col), row-major
    fx, fy = [0.5, -0.25, 0.125, 1.0], [0.75, 0.5, -1.0, 0.25]
    state = tiny(torch.tensor([[fx], [fy]]))
    model = from_rope_swin_checkpoint(save(tmp_path, state, "mixed.pth"))
    rope = model.layers[0].blocks[0].attn.rpe_k
    q, _ = rope.rotate(torch.tensor(v).expand(1, 1, 4, 8), torch.tensor(v).expand(1, 1, 4, 8), 2, 2, 0)
    for index, (row, col) in enumerate(cells):
        want = turned(v, [col * a + row * b for a, b in zip(fx, fy, strict=True)])
        torch.testing.assert_close(q[0, 0, index], torch.tensor(want), atol=1e-6, rtol=0)
    assert torch.equal(model.layers[0].blocks[0].attn.qkv.weight, state["layers.0.blocks.0.attn.qkv.weight"])

    m = 50**-0.5
    state = tiny(axial_freqs_by_hand(50.0, 8, 1).float())
    model = from_rope_swin_checkpoint(save(tmp_path, state, "axial.pth"))
    assert model.rpe_config.method == "rope_axial" and model.rpe_config.theta == 50.0
    swap = [4, 5, 6, 7, 0, 1, 2, 3]
    rope = model.layers[0].blocks[0].attn.rpe_k
    ours_v = torch.tensor(v)[swap].expand(1, 1, 4, 8)
    q, _ = rope.rotate(ours_v, ours_v, 2, 2, 0)
    for index, (row, col) in enumerate(cells):
        theirs = turned(v, [col, m * col, row, m * row])
        torch.testing.assert_close(q[0, 0, index], torch.tensor(theirs)[swap], atol=1e-6, rtol=0)
    loaded_qkv = model.layers[0].blocks[0].attn.qkv.weight
    file_qkv = state["layers.0.blocks.0.attn.qkv.weight"]
    assert torch.equal(loaded_qkv[:8], file_qkv[swap]) and torch.equal(loaded_qkv[8:16], file_qkv[8:16][swap])
    assert torch.equal(loaded_qkv[16:], file_qkv[16:])  # v untouched


def _one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and isinstance(err.value, RoPEViTCheckpointError)
    assert isinstance(err.value, RunConfigError) and isinstance(err.value, ValueError)
    return text


def test_bad_files_fail_in_one_line(tmp_path: Path) -> None:
    good = hand_state(True)
    deit = {"cls_token": torch.zeros(1, 1, 8), "blocks.0.attn.qkv.weight": torch.zeros(24, 8),
            "patch_embed.proj.weight": torch.zeros(8, 3, 4, 4)}
    bias = {k.replace("rope_freqs", "relative_position_bias_table"): v for k, v in good.items()
            if not k.endswith(("rope_t_x", "rope_t_y"))}
    cases = [
        ({"state_dict": {"net.patch_embed.proj.weight": torch.zeros(1)}}, {}, "holds no 'model' state dict"),
        ({"model": deit}, {}, r"is a ViT / DeiT checkpoint .* models.from_rope_vit_checkpoint"),
        ({"model": {"transformer.encoder.layers.0.linear1.weight": torch.zeros(2)}}, {}, "a DETR checkpoint"),
        ({"model": our_model("rope_mixed").state_dict()}, {}, r"in timm's / this project's layout \(head.fc.bias\)"),
        ({"model": bias}, {}, r"has no attn.rope_freqs \(a Swin with Swin's bias table: models.swin.load_swin"),
        ({"model": {**good, "layers.0.blocks.0.attn.relative_position_bias_table": torch.zeros(49, 2)}}, {},
         r"RoPE-ViT's use_rpb=True"),
        ({"model": {k: v for k, v in good.items() if k != "layers.1.blocks.1.mlp.fc2.bias"} | {"extra": torch.ones(1)}},
         {}, "missing keys layers.1.blocks.1.mlp.fc2.bias; unexpected keys extra"),
        ({"model": {k: v for k, v in good.items() if k != "layers.0.blocks.1.attn_mask"}}, {},
         "missing keys layers.0.blocks.1.attn_mask"),
        ({"model": {**good, "layers.1.blocks.0.attn.rope_freqs": torch.zeros(2, 4, 8)}}, {},
         r"layers.1.blocks.0.attn.rope_freqs has shape \(2, 4, 8\); stage 1 \(width 32\) expects \(2, heads,"),
        ({"model": {**good, "layers.1.blocks.1.attn.rope_freqs": torch.zeros(2, 4, 4)}}, {},
         r"layers.1.blocks.1.attn.rope_freqs has shape \(2, 4, 4\), RoPE-ViT Swin .* expects \(2, 2, 8\)"),
        ({"model": {**good, "layers.0.blocks.0.attn.rope_t_x": torch.arange(9.0)}}, {},
         r"rope_t_x \(9,\) / rope_t_y \(16,\) are not one index per token of a square window"),
        ({"model": {**good, "layers.0.blocks.0.attn.rope_t_x": torch.arange(16.0)}}, {},
         r"layers.0.blocks.0.attn.rope_t_x / rope_t_y are not the column / row indices of the \(4, 4\) window"),
        ({"model": {**good, "layers.0.blocks.1.attn_mask": torch.zeros(4, 16, 16)}}, {},
         r"attn_mask \(4, 16, 16\) is no shifted-window mask of 4x4 windows"),
        ({"model": {**good, "layers.0.blocks.1.attn_mask": region_mask(8, 8, 4, 1)}}, {},
         r"layers.0.blocks.1.attn_mask \(4, 16, 16\) is not the shift mask of RoPE-ViT Swin .* image \(32, 32\)"),
        ({"model": good}, {"img_size": 64}, r"image \(64, 64\)\): missing keys layers.1.blocks.1.attn_mask"),
        ({"model": hand_state(False)}, {"theta": 100.0}, r"are not the fixed axial frequencies .* \(theta 100\)"),
        # Microsoft does not shift a 4x8 map in 4-token windows (its short side fits one window); timm shifts the width
        ({"model": hand_state(True, img=(32, 64))}, {}, r"layers.1.blocks.1 has window \(4, 4\), shift \(0, 2\)"),
    ]
    for number, (payload, overrides, match) in enumerate(cases):
        path = tmp_path / f"bad{number}.pth"
        torch.save(payload, path)
        with pytest.raises(RoPESwinCheckpointError, match=match) as err:
            from_rope_swin_checkpoint(path, **overrides)
        _one_line(err)
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(RoPESwinCheckpointError, match="not a readable PyTorch checkpoint") as err:
        from_rope_swin_checkpoint(garbage)
    _one_line(err)
    with pytest.raises(RoPESwinCheckpointError, match="does not exist"):
        from_rope_swin_checkpoint(tmp_path / "absent.pth")
    for rpe, match in (("irpe_k", "rpe.method='product'"), ("swin", "rpe.method='swin'")):
        swin = RPESwinTransformer(rpe=rpe, img_size=IMG, patch_size=PATCH, window_size=WINDOW, embed_dim=DIM,
                                  depths=DEPTHS, num_heads=HEADS)
        with pytest.raises(RoPESwinCheckpointError, match=f"RoPE-ViT's Swin cannot express this model: {match}"):
            to_rope_swin_checkpoint(swin, tmp_path / "x.pth")
    with pytest.raises(RoPESwinCheckpointError, match="a RPEVisionTransformer is not a Swin"):
        to_rope_swin_checkpoint(models.RPEVisionTransformer(rpe="rope_axial", img_size=16, patch_size=8, embed_dim=32,
                                                            depth=1, num_heads=2), tmp_path / "x.pth")


def test_hints_overrides_and_weights_are_checked_as_the_deit_loader_checks_them(tmp_path: Path) -> None:
    """Probe 5 (read from the code): the Swin loader took ``theta=0`` for "not given" (the file's value replaced
    it), indexed a text ``img_size`` ('32' as (3, 2)), divided by a window of 0, and loaded NaN weights. Every
    override and hint now has the one valid form of `models.rope_vit` (0 refused, never replaced), and a
    non-finite tensor is refused naming it."""
    axial, mixed = save(tmp_path, hand_state(False), "axial.pth"), save(tmp_path, hand_state(True), "mixed.pth")
    cases = [
        (axial, {"theta": 0}, "the override theta=0 must be a positive float32 number"),
        (mixed, {"theta": 0.0}, "the override theta=0.0 must be a positive float32 number"),
        (mixed, {"theta": "abc"}, "the override theta='abc' must be a positive float32 number"),
        (axial, {"theta": float("nan")}, "the override theta=nan must be a positive float32 number"),
        (mixed, {"theta": True}, "the override theta=True must be a positive float32 number"),
        (mixed, {"img_size": "32"}, "the override img_size='32' must be a positive integer"),
        (mixed, {"img_size": (32,)}, r"the override img_size=\(32,\) must be a positive integer"),
        (mixed, {"img_size": 0}, "the override img_size=0 must be a positive integer"),
        (mixed, {"img_size": 30}, "the override img_size=30 must be a positive multiple of the patch size 4x4"),
        (mixed, {"window_size": 0}, "the override window_size=0 must be a positive integer"),
        (mixed, {"window_size": "4"}, "the override window_size='4' must be a positive integer"),
    ]
    for path, overrides, match in cases:
        with pytest.raises(RoPESwinCheckpointError, match=match) as err:
            from_rope_swin_checkpoint(path, **overrides)
        assert str(path) in _one_line(err)
    for number, (arch, match) in enumerate(((5, "'arch' is a int; it must be a dict"),
                                            ({"theta": 0}, r"arch.theta=0 must be a positive float32 number"),
                                            ({"img_size": "32"}, r"arch.img_size='32' must be a positive integer"))):
        path = save(tmp_path, hand_state(True), f"hint{number}.pth", arch=arch)
        with pytest.raises(RoPESwinCheckpointError, match=match) as err:
            from_rope_swin_checkpoint(path)
        _one_line(err)
    for key, value in (("head.weight", float("nan")), ("layers.1.blocks.0.attn.qkv.weight", float("inf"))):
        state = hand_state(True)
        state[key].view(-1)[0] = value
        with pytest.raises(RoPESwinCheckpointError, match=f"holds non-finite weights: {key} has 1 NaN/inf of") as err:
            from_rope_swin_checkpoint(save(tmp_path, state, "nonfinite.pth"))
        _one_line(err)
    # the valid forms still load: an explicit theta equal to the file's, a pair for the image size
    assert from_rope_swin_checkpoint(axial, theta=50, img_size=(IMG, IMG)).layers[0].blocks[0].attn.rpe_k.theta == 50


def test_files_are_read_with_weights_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only tensors and plain containers load; a pickle that would run code (or Microsoft's yacs ``config``, any
    class) is refused in one line without running."""
    state = hand_state(False)
    calls = []
    real_load = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    from_rope_swin_checkpoint(save(tmp_path, state, epoch=3, max_accuracy=81.2))
    assert calls == [True]

    marker = tmp_path / "marker"

    class RunsCode:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    with pytest.raises(RoPESwinCheckpointError) as err:
        from_rope_swin_checkpoint(save(tmp_path, state, "hostile.pth", config=RunsCode()))
    assert "weights_only=True refuses" in _one_line(err)
    assert not marker.exists()


def test_export_never_lands_in_a_run_dir_or_a_data_root(tmp_path: Path) -> None:
    """As every output of the project: an export over a run's checkpoint or into a data root is one line and writes
    nothing; elsewhere it is written."""
    run = tmp_path / "runs" / "d2"
    (run / "checkpoints").mkdir(parents=True)
    (run / "run.json").write_text('{"state": "finished"}')
    (run / "checkpoints" / "best.ckpt").write_bytes(b"the run's weights")
    data = tmp_path / "data" / "rel_small"
    (data / "train" / "a").mkdir(parents=True)
    (data / ".complete.json").write_text("{}")
    hand = tmp_path / "hand"  # a dataset made by hand: no marker, known by its class folders of images
    (hand / "train" / "0_E").mkdir(parents=True)
    (hand / "train" / "0_E" / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    model = our_model("rope_mixed")
    for path, where in ((run / "checkpoints" / "best.ckpt", f"is inside the run dir {run}"),
                        (data / "export.pth", f"is inside the data root {data}"),
                        (hand / "train" / "0_E" / "rs.pth", f"is inside the data root {hand}")):
        with pytest.raises(RoPESwinCheckpointError, match=f"to_rope_swin_checkpoint path='{path}' {where}") as err:
            to_rope_swin_checkpoint(model, path)
        _one_line(err)
    assert (run / "checkpoints" / "best.ckpt").read_bytes() == b"the run's weights"
    assert not (data / "export.pth").exists()
    assert sorted(p.name for p in (hand / "train" / "0_E").iterdir()) == ["x.png"]
    assert to_rope_swin_checkpoint(model, tmp_path / "exports" / "m.pth").is_file()
