"""RoPE-ViT DeiT checkpoints (naver-ai/rope-vit's layout): the key names written out here by hand from RoPE-ViT's
module tree, a forward written here from RoPE-ViT's formulas (complex channel pairs, column pairs before row pairs in
axial, ``freqs[0]`` per column step in mixed, unrotated class token), export/load round trips, the axis layout worked
by hand on a 2x2 grid, bad files in one line and ``weights_only`` loading. Independent of `models.rope_vit`'s tables
and of RoPE-ViT's code (the comparison with that code is recorded in docs/design.md)."""

from __future__ import annotations

import argparse
import math
import os
import stat
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import models
from lifecycle.run_config import RunConfigError
from models.deit import RPEVisionTransformer
from models.rope_vit import (
    RoPEViTCheckpointError,
    from_rope_vit_checkpoint,
    load_rope_vit_state,
    rope_vit_architecture,
    swap_axis_halves,
    to_rope_vit_checkpoint,
)
from rpe import RPEConfig, build_rpe

DIM, HEADS, DEPTH, PATCH, IMG, CLASSES = 32, 2, 2, 8, 16, 5  # head dim 16, a 2x2 patch grid
GRID = (IMG // PATCH) ** 2

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def hand_rope_vit_keys(mixed: bool, ape: bool, layer_scale: bool = True, depth: int = DEPTH, dim: int = DIM,
                       grid: int = GRID, patch: int = PATCH) -> dict[str, tuple[int, ...]]:
    """RoPE-ViT's state-dict keys and shapes (rope_vit_models: vit_models with RoPE_Layer_scale_init_Block)."""
    keys: dict[str, tuple[int, ...]] = {"cls_token": (1, 1, dim)}
    if ape:
        keys["pos_embed"] = (1, grid, dim)  # no class row
    if mixed:
        keys.update({"freqs": (2, depth, dim // 2), "freqs_t_x": (grid,), "freqs_t_y": (grid,)})
    keys.update({"patch_embed.proj.weight": (dim, 3, patch, patch), "patch_embed.proj.bias": (dim,)})
    for i in range(depth):
        block = {
            "norm1.weight": (dim,), "norm1.bias": (dim,),
            "attn.qkv.weight": (3 * dim, dim), "attn.qkv.bias": (3 * dim,),
            "attn.proj.weight": (dim, dim), "attn.proj.bias": (dim,),
            "norm2.weight": (dim,), "norm2.bias": (dim,),
            "mlp.fc1.weight": (4 * dim, dim), "mlp.fc1.bias": (4 * dim,),
            "mlp.fc2.weight": (dim, 4 * dim), "mlp.fc2.bias": (dim,),
        }
        if layer_scale:
            block.update({"gamma_1": (dim,), "gamma_2": (dim,)})
        keys.update({f"blocks.{i}.{k}": v for k, v in block.items()})
    keys.update({"norm.weight": (dim,), "norm.bias": (dim,), "head.weight": (CLASSES, dim), "head.bias": (CLASSES,)})
    return keys


def hand_state(mixed: bool, ape: bool, layer_scale: bool = True, seed: int = 0) -> dict[str, torch.Tensor]:
    """A RoPE-ViT file's tensors made by hand: random weights, mixed frequencies of RoPE-ViT's magnitudes, the
    grid buffers of a 2x2 grid (column index, row index)."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in hand_rope_vit_keys(mixed, ape, layer_scale).items():
        if key in ("freqs_t_x", "freqs_t_y"):
            continue
        scale = 1.0 / math.sqrt(shape[-1]) if len(shape) == 2 else 0.5
        value = torch.randn(shape, generator=gen) * scale
        if key.endswith(("gamma_1", "gamma_2")) or (key.endswith("weight") and "norm" in key):
            value = 1 + 0.3 * torch.randn(shape, generator=gen)
        state[key] = value
    if mixed:
        state["freqs"] = torch.randn(2, DEPTH, DIM // 2, generator=gen)
        state["freqs_t_x"] = torch.tensor([0.0, 1.0, 0.0, 1.0])
        state["freqs_t_y"] = torch.tensor([0.0, 0.0, 1.0, 1.0])
    return state


def their_forward(state: dict[str, torch.Tensor], images: torch.Tensor, heads: int = HEADS,
                  theta: float = 100.0) -> torch.Tensor:
    """RoPE-ViT's DeiT forward from its formulas, float64. Channel pair ``p`` of a head is the complex number
    ``x_2p + i x_2p+1``, multiplied by ``exp(i angle_p)`` for every patch token (the class token is not rotated);
    axial: ``angle_p = col * theta^(-4p/d)`` for ``p < d/4``, ``row * theta^(-4(p-d/4)/d)`` after; mixed (layer
    ``l``, head ``h``): ``angle_p = col * freqs[0, l, h d/2 + p] + row * freqs[1, l, h d/2 + p]``."""
    s = {k: v.double() for k, v in state.items()}
    x = F.conv2d(images.double(), s["patch_embed.proj.weight"], s["patch_embed.proj.bias"], stride=PATCH)
    b, dim, h, w = x.shape
    x = x.flatten(2).transpose(1, 2)
    if "pos_embed" in s:
        x = x + s["pos_embed"]
    x = torch.cat([s["cls_token"].expand(b, -1, -1), x], dim=1)
    cell = torch.arange(h * w, dtype=torch.float64)
    col, row = cell % w, torch.div(cell, w, rounding_mode="floor")
    hd = dim // heads
    depth = 1 + max(int(k.split(".")[1]) for k in s if k.startswith("blocks."))
    for i in range(depth):
        if "freqs" in s:
            f = s["freqs"][:, i].reshape(2, heads, 1, hd // 2)
            angle = col[:, None] * f[0] + row[:, None] * f[1]  # (heads, N, d/2)
        else:
            mag = theta ** (-torch.arange(0, hd, 4, dtype=torch.float64) / hd)
            angle = torch.cat([col[:, None] * mag, row[:, None] * mag], dim=-1).expand(heads, -1, -1)
        turn = torch.polar(torch.ones_like(angle), angle)

        def rotate(t: torch.Tensor, turn: torch.Tensor = turn) -> torch.Tensor:
            pairs = torch.view_as_complex(t[:, :, 1:].reshape(*t.shape[:2], h * w, hd // 2, 2).contiguous())
            return torch.cat([t[:, :, :1], torch.view_as_real(pairs * turn).flatten(-2)], dim=2)

        p = f"blocks.{i}."
        y = F.layer_norm(x, (dim,), s[p + "norm1.weight"], s[p + "norm1.bias"], eps=1e-6)
        qkv = F.linear(y, s[p + "attn.qkv.weight"], s[p + "attn.qkv.bias"]).reshape(b, -1, 3, heads, hd)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        q, k = rotate(q), rotate(k)
        attn = (q * hd**-0.5 @ k.transpose(-2, -1)).softmax(-1)
        out = F.linear((attn @ v).transpose(1, 2).reshape(b, -1, dim), s[p + "attn.proj.weight"],
                       s[p + "attn.proj.bias"])
        x = x + s.get(p + "gamma_1", 1.0) * out
        y = F.layer_norm(x, (dim,), s[p + "norm2.weight"], s[p + "norm2.bias"], eps=1e-6)
        y = F.linear(F.gelu(F.linear(y, s[p + "mlp.fc1.weight"], s[p + "mlp.fc1.bias"])), s[p + "mlp.fc2.weight"],
                     s[p + "mlp.fc2.bias"])
        x = x + s.get(p + "gamma_2", 1.0) * y
    x = F.layer_norm(x, (dim,), s["norm.weight"], s["norm.bias"], eps=1e-6)[:, 0]
    return F.linear(x, s["head.weight"], s["head.bias"])


def images(h: int = IMG, w: int = IMG) -> torch.Tensor:
    return torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(5))


def our_model(method: str, ape: bool, layer_scale: bool = True, theta: float | None = None) -> RPEVisionTransformer:
    torch.manual_seed(1)
    model = RPEVisionTransformer(
        rpe=RPEConfig(method=method, theta=theta), ape="learned" if ape else "none", img_size=IMG, patch_size=PATCH,
        embed_dim=DIM, depth=DEPTH, num_heads=HEADS, init_values=1.0 if layer_scale else None, no_embed_class=True,
        num_classes=CLASSES,
    )
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("rope.freqs"):
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return model.eval()


def save(tmp_path: Path, state: dict, name: str = "rope_vit.pth", **extra) -> Path:
    path = tmp_path / name
    torch.save({"model": state, **extra}, path)
    return path


VARIANTS = [("rope_axial", False, True), ("rope_axial", True, True), ("rope_mixed", False, True),
            ("rope_mixed", True, True), ("rope_axial", False, False), ("rope_mixed", True, False)]


@pytest.mark.parametrize(("method", "ape", "layer_scale"), VARIANTS)
def test_export_has_rope_vit_keys_and_round_trips_exactly(method, ape, layer_scale, tmp_path: Path) -> None:
    """Export: RoPE-ViT's keys and shapes, its forward's logits; loading the export gives identical tensors and
    logits, with the heads, image size and theta read back from the file."""
    model = our_model(method, ape, layer_scale, theta=50.0 if method == "rope_axial" else None)
    path = to_rope_vit_checkpoint(model, tmp_path / "export.pth")
    state, _ = load_rope_vit_state(path)
    mixed = method == "rope_mixed"
    assert {k: tuple(v.shape) for k, v in state.items()} == hand_rope_vit_keys(mixed, ape, layer_scale)
    if mixed:
        assert state["freqs_t_x"].tolist() == [0, 1, 0, 1] and state["freqs_t_y"].tolist() == [0, 0, 1, 1]
    x = images()
    with torch.no_grad():
        ours = model(x)
    torch.testing.assert_close(their_forward(state, x, theta=50.0), ours.double(), atol=1e-5, rtol=0)
    loaded = models.from_rope_vit_checkpoint(path)  # the package's name for it
    assert not loaded.training and loaded.rpe_config.method == method
    assert loaded.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    with torch.no_grad():
        assert torch.equal(loaded(x), ours)


@pytest.mark.parametrize(("method", "ape", "layer_scale"), VARIANTS)
def test_hand_built_rope_vit_file_gives_its_forward(method, ape, layer_scale, tmp_path: Path) -> None:
    """A file in RoPE-ViT's layout made by hand loads (variant inferred from its tensors) and gives the logits of
    RoPE-ViT's forward; exported again it is the same file, tensor for tensor."""
    mixed = method == "rope_mixed"
    state = hand_state(mixed, ape, layer_scale)
    path = save(tmp_path, state, epoch=3)
    model = from_rope_vit_checkpoint(path, num_heads=HEADS, img_size=IMG)
    assert model.rpe_config.method == method and (model.pos_embed is not None) == ape
    assert model.blocks[0].ls1.__class__.__name__ == ("LayerScale" if layer_scale else "Identity")
    x = images()
    with torch.no_grad():
        ours = model(x)
    torch.testing.assert_close(their_forward(state, x), ours.double(), atol=1e-5, rtol=0)
    again, _ = load_rope_vit_state(to_rope_vit_checkpoint(model, tmp_path / "again.pth"))
    assert again.keys() == state.keys() and all(torch.equal(again[k], state[k]) for k in state)
    if not ape:  # RoPE-ViT recomputes the angles for another grid; so does dynamic_img_size: a 2x3 grid
        dynamic = from_rope_vit_checkpoint(path, num_heads=HEADS, img_size=IMG, dynamic_img_size=True)
        wide = images(16, 24)
        with torch.no_grad():
            torch.testing.assert_close(their_forward(state, wide), dynamic(wide).double(), atol=1e-5, rtol=0)


def test_axial_layout_worked_by_hand_on_a_2x2_grid() -> None:
    """Head dim 8, theta 100: frequencies 1 and 100^(-1/2) = 0.1. RoPE-ViT turns pairs (x0,x1), (x2,x3) by
    ``col``, ``0.1 col`` and (x4,x5), (x6,x7) by ``row``, ``0.1 row``; ours turns the first half by the row. The
    loader's swap of the channel halves in q and k makes ours rotate exactly RoPE-ViT's vectors, halves swapped."""
    _, rope, _ = build_rpe("rope_axial", 8, 1, dtype=torch.float64)
    v = torch.arange(1.0, 9.0, dtype=torch.float64)

    def turn(a, b, angle):
        return [a * math.cos(angle) - b * math.sin(angle), a * math.sin(angle) + b * math.cos(angle)]

    theirs = {  # cell (row, col) -> RoPE-ViT's rotated vector
        (0, 0): [1, 2, 3, 4, 5, 6, 7, 8],
        (0, 1): [*turn(1, 2, 1.0), *turn(3, 4, 0.1), 5, 6, 7, 8],
        (1, 0): [1, 2, 3, 4, *turn(5, 6, 1.0), *turn(7, 8, 0.1)],
        (1, 1): [*turn(1, 2, 1.0), *turn(3, 4, 0.1), *turn(5, 6, 1.0), *turn(7, 8, 0.1)],
    }
    swap = [4, 5, 6, 7, 0, 1, 2, 3]
    tokens = torch.cat([v[None], v[swap].expand(4, 8)])[None, None]  # class token + the 4 cells, our layout
    q, _ = rope.rotate(tokens, tokens, 2, 2, 1)
    assert torch.equal(q[0, 0, 0], v)  # the class token is not rotated
    for index, cell in enumerate(sorted(theirs)):
        expected = torch.tensor(theirs[cell], dtype=torch.float64)[swap]
        torch.testing.assert_close(q[0, 0, 1 + index], expected, atol=1e-6, rtol=0)

    # The swap of the loader on qkv rows (2 heads of 8 channels): q and k rows of each head halved and swapped.
    weight = torch.arange(48.0)[:, None].expand(48, 3)
    order = [4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11]
    expected = torch.tensor([*order, *(16 + o for o in order), *range(32, 48)], dtype=torch.float32)
    assert torch.equal(swap_axis_halves(weight, 2)[:, 0], expected)
    assert torch.equal(swap_axis_halves(swap_axis_halves(weight, 2), 2), weight)


def test_mixed_layout_worked_by_hand_on_a_2x2_grid(tmp_path: Path) -> None:
    """One head of 8 channels, RoPE-ViT's freqs[0] (per column step) = (0.5, -0.25, 0.125, 1), freqs[1] (per row
    step) = (0.75, 0.5, -1, 0.25): pair p of the token at (row, col) turns by ``col fx_p + row fy_p``. Loaded, our
    rotation gives those vectors, with no permutation of q or k."""
    fx, fy = [0.5, -0.25, 0.125, 1.0], [0.75, 0.5, -1.0, 0.25]
    state = {k: torch.zeros(s) for k, s in hand_rope_vit_keys(True, False, depth=1, dim=8).items()}
    state.update({"freqs": torch.tensor([[fx], [fy]]), "freqs_t_x": torch.tensor([0.0, 1, 0, 1]),
                  "freqs_t_y": torch.tensor([0.0, 0, 1, 1])})
    model = from_rope_vit_checkpoint(save(tmp_path, state), num_heads=1)
    rope = model.blocks[0].attn.rpe_k
    v = torch.arange(1.0, 9.0)
    q, _ = rope.rotate(v.expand(1, 1, 5, 8), v.expand(1, 1, 5, 8), 2, 2, 1)
    for index, (row, col) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        angles = [col * a + row * b for a, b in zip(fx, fy, strict=True)]
        expected = []
        for p, angle in enumerate(angles):
            a, b = v[2 * p].item(), v[2 * p + 1].item()
            expected += [a * math.cos(angle) - b * math.sin(angle), a * math.sin(angle) + b * math.cos(angle)]
        torch.testing.assert_close(q[0, 0, 1 + index], torch.tensor(expected), atol=1e-6, rtol=0)
    assert torch.equal(model.blocks[0].attn.qkv.weight, state["blocks.0.attn.qkv.weight"])


def test_released_shapes_and_deit_args_tell_heads_and_size(tmp_path: Path) -> None:
    """Without num_heads: RoPE-ViT's released widths (384/12 blocks: 6 heads) or DeiT's args.model; the image size
    from pos_embed, the mixed grid buffers or args.input_size (shapes only: meta tensors)."""
    def meta(keys):
        return {k: torch.empty(s, device="meta") for k, s in keys.items()}

    small = meta(hand_rope_vit_keys(False, True, depth=12, dim=384, grid=196, patch=16))
    arch = rope_vit_architecture(small, {}, "f.pth")
    assert (arch["num_heads"], arch["img_size"], arch["depth"], arch["rpe"].theta) == (6, (224, 224), 12, 100.0)
    base_named = meta(hand_rope_vit_keys(False, False, dim=768))
    arch = rope_vit_architecture(base_named, {"model": "rope_axial_deit_base_patch16_LS", "img_size": [32, 32]}, "f")
    assert (arch["num_heads"], arch["img_size"], arch["ape"]) == (12, (32, 32), "none")
    arch = rope_vit_architecture(meta(hand_rope_vit_keys(False, False, dim=64)), {}, "f", num_heads=4)
    assert arch["img_size"] == (224, 224)  # RoPE-ViT's default where nothing tells
    mixed = hand_state(True, False)
    mixed["freqs_t_x"], mixed["freqs_t_y"] = torch.tensor([0.0, 1, 2] * 2), torch.tensor([0.0] * 3 + [1.0] * 3)
    assert rope_vit_architecture(mixed, {}, "f", num_heads=HEADS)["img_size"] == (16, 24)

    state = hand_state(False, False)
    path = save(tmp_path, state, args=argparse.Namespace(model="rope_axial_deit_small_patch16_LS", input_size=16))
    with pytest.raises(RoPEViTCheckpointError, match="head dim 5.33"):
        from_rope_vit_checkpoint(path)  # the name says 6 heads: 32 channels do not split into 6 heads
    model = from_rope_vit_checkpoint(path, num_heads=HEADS)
    assert model.patch_embed.img_size == (IMG, IMG)


def _one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and isinstance(err.value, RunConfigError) and isinstance(err.value, ValueError)
    return text


def _bad_files(tmp_path: Path) -> list[tuple[str, Path, dict, str]]:
    good = hand_state(True, True)
    cases = []

    def case(name, payload, match, **overrides):
        path = tmp_path / f"{name}.pth"
        torch.save(payload, path)
        cases.append((name, path, {"num_heads": HEADS, **overrides}, match))

    case("lightning", {"state_dict": {"net.cls_token": torch.zeros(1)}}, "holds no 'model' state dict")
    case("model a list", {"model": [1, 2, 3]}, "its 'model' entry is a list, not a state dict")  # probe 15, n31c
    case("detr", {"model": {"transformer.encoder.layers.0.linear1.weight": torch.zeros(2), "query_embed.weight":
                            torch.zeros(2)}}, r"has no 'cls_token' \(a DETR checkpoint\); expected a RoPE-ViT DeiT")
    ours = our_model("rope_mixed", True).state_dict()
    case("ours", {"model": ours}, r"in timm's / this project's layout \(blocks.0.attn.rpe_k.rope.freqs\)")
    case("distilled", {"model": {**good, "dist_token": torch.zeros(1, 1, DIM)}}, "distillation token")
    broken = {k: v for k, v in good.items() if k != "blocks.1.gamma_2"}
    case("missing", {"model": {**broken, "blocks.0.extra": torch.zeros(1)}},
         "missing keys blocks.1.gamma_2; unexpected keys blocks.0.extra")
    case("freqs", {"model": {**good, "freqs": torch.zeros(2, DEPTH, 4)}}, r"freqs has shape \(2, 2, 4\)")
    case("grid", {"model": {**good, "freqs_t_x": torch.tensor([0.0, 1, 1, 0])}}, "not the column / row indices")
    case("no_grid", {"model": {k: v for k, v in good.items() if k != "freqs_t_y"}}, "no freqs_t_x / freqs_t_y")
    case("deit3", {"model": good, "args": argparse.Namespace(model="deit_small_patch16_LS")},
         "args.model='deit_small_patch16_LS', not a RoPE-ViT DeiT")
    case("name", {"model": good, "args": argparse.Namespace(model="rope_axial_deit_small_patch16_LS")},
         "its tensors are those of RoPE-mixed \\+ APE")
    case("heads", {"model": good}, "no released RoPE-ViT shape .* pass num_heads=", num_heads=None)
    case("head_dim", {"model": good}, "head dim 10.6667; 2-D RoPE needs", num_heads=3)
    return cases


def test_bad_files_fail_in_one_line(tmp_path: Path) -> None:
    for name, path, overrides, match in _bad_files(tmp_path):
        with pytest.raises(RoPEViTCheckpointError, match=match) as err:
            from_rope_vit_checkpoint(path, **overrides)
        assert name and _one_line(err)
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(RoPEViTCheckpointError, match="not a readable PyTorch checkpoint") as err:
        from_rope_vit_checkpoint(garbage)
    _one_line(err)
    with pytest.raises(RoPEViTCheckpointError, match="does not exist"):
        from_rope_vit_checkpoint(tmp_path / "absent.pth")
    with pytest.raises(RoPEViTCheckpointError, match="RoPE-ViT's DeiT cannot express this model: rpe.method='product'"):
        to_rope_vit_checkpoint(RPEVisionTransformer(rpe="irpe_k", img_size=IMG, patch_size=PATCH, embed_dim=DIM,
                                                    depth=1, num_heads=HEADS), tmp_path / "x.pth")
    with pytest.raises(RoPEViTCheckpointError, match="a class row in pos_embed"):
        to_rope_vit_checkpoint(RPEVisionTransformer(rpe="rope_axial", img_size=IMG, patch_size=PATCH, embed_dim=DIM,
                                                    depth=1, num_heads=HEADS), tmp_path / "x.pth")


def test_files_are_read_with_weights_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeiT's ``args`` (argparse.Namespace) is allowed; a pickle that would run code is refused without running."""
    state = hand_state(False, True)
    calls = []
    real_load = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    from_rope_vit_checkpoint(save(tmp_path, state, args=argparse.Namespace(input_size=IMG, lr=1e-3)), num_heads=HEADS)
    assert calls == [True]

    marker = tmp_path / "marker"

    class RunsCode:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    hostile = save(tmp_path, state, "hostile.pth", args=RunsCode())
    with pytest.raises(RoPEViTCheckpointError) as err:
        from_rope_vit_checkpoint(hostile, num_heads=HEADS)
    assert "weights_only=True refuses" in _one_line(err)
    assert not marker.exists()


def _axial_ape_file(tmp_path: Path, name: str = "f.pth", state: dict | None = None, **arch) -> Path:
    """Probe 4's file ``f``: an axial + APE file whose ``arch`` says 2 heads, 16 px, theta 100 unless ``arch``
    changes it."""
    said = {"num_heads": HEADS, "img_size": [IMG, IMG], "theta": 100.0, **arch}
    return save(tmp_path, hand_state(False, True) if state is None else state, name, arch=said)


@pytest.mark.parametrize(("arch", "match"), [
    ({"num_heads": "2"}, r"arch\.num_heads='2' must be a positive integer"),
    ({"num_heads": 0}, r"arch\.num_heads=0 must be a positive integer"),
    ({"num_heads": 2.0}, r"arch\.num_heads=2\.0 must be a positive integer"),
    ({"num_heads": True}, r"arch\.num_heads=True must be a positive integer"),
    ({"theta": "abc"}, r"arch\.theta='abc' must be a positive float32 number"),
    ({"theta": 0}, r"arch\.theta=0 must be a positive float32 number"),
    ({"theta": float("nan")}, r"arch\.theta=nan must be a positive float32 number"),
    ({"theta": 1e-45}, r"arch\.theta=1e-45 must be a positive float32 number"),  # probe 12, H48: named rpe.theta
    ({"img_size": "16"}, r"arch\.img_size='16' must be a positive integer \(a square image\) or a pair of them"),
    ({"img_size": [16]}, r"arch\.img_size=\[16\] must be a positive integer"),
    ({"img_size": [16, 0]}, r"arch\.img_size=\[16, 0\] must be a positive integer"),
    ({"img_size": 20}, r"arch\.img_size=20 must be a positive multiple of the patch size 8x8 per side"),
])
def test_bad_file_hints_are_one_line_naming_file_key_and_value(arch, match, tmp_path: Path) -> None:
    """Probe 4 cases 28-30, 34, 35: a hint of the wrong type or range in the file's ``arch`` is one line naming the
    file, the key, the value and what is valid (not a TypeError / ZeroDivisionError, nor silently the default)."""
    path = _axial_ape_file(tmp_path, **arch)
    with pytest.raises(RoPEViTCheckpointError, match=match) as err:
        from_rope_vit_checkpoint(path)
    assert _one_line(err).startswith(f"checkpoint {path}: arch.")


def test_file_hints_in_their_valid_forms(tmp_path: Path) -> None:
    """An int ``img_size`` is a square (as ``args.input_size`` and the override); None is "not said"; an integer
    theta is a number."""
    model = from_rope_vit_checkpoint(_axial_ape_file(tmp_path, img_size=IMG, theta=50))
    assert model.patch_embed.img_size == (IMG, IMG) and model.blocks[0].attn.rpe_k.theta == 50.0
    model = from_rope_vit_checkpoint(_axial_ape_file(tmp_path, "none.pth", theta=None))
    assert model.blocks[0].attn.rpe_k.theta == 100.0  # RoPE-ViT's axial default


@pytest.mark.parametrize(("extra", "match"), [
    ({"args": argparse.Namespace(input_size="16")}, r"args\.input_size='16' must be a positive integer"),
    ({"args": argparse.Namespace(input_size=12)}, r"args\.input_size=12 must be a positive multiple of the patch"),
    ({"args": argparse.Namespace(model=5)}, r"args\.model=5 must be a model name"),
    ({"arch": [2, 16]}, r"'arch' is a list; it must be a dict of num_heads, img_size, theta"),
])
def test_bad_deit_args_and_arch_are_one_line(extra, match, tmp_path: Path) -> None:
    path = save(tmp_path, hand_state(False, True), **extra)
    with pytest.raises(RoPEViTCheckpointError, match=match) as err:
        from_rope_vit_checkpoint(path, num_heads=HEADS)
    assert str(path) in _one_line(err)


@pytest.mark.parametrize(("overrides", "match"), [
    ({"num_heads": 0}, r"the override num_heads=0 must be a positive integer"),
    ({"num_heads": "2"}, r"the override num_heads='2' must be a positive integer"),
    ({"theta": 0}, r"the override theta=0 must be a positive float32 number"),
    ({"theta": -1.0}, r"the override theta=-1\.0 must be a positive float32 number"),
    ({"theta": float("inf")}, r"the override theta=inf must be a positive float32 number"),
    ({"img_size": "16"}, r"the override img_size='16' must be a positive integer \(a square image\) or a pair"),
    ({"img_size": (16,)}, r"the override img_size=\(16,\) must be a positive integer"),
    ({"img_size": 0}, r"the override img_size=0 must be a positive integer"),
    ({"img_size": 16.0}, r"the override img_size=16\.0 must be a positive integer"),
    ({"img_size": (16, 20)}, r"the override img_size=\(16, 20\) must be a positive multiple of the patch size 8x8"),
    ({"img_size": 4}, r"the override img_size=4 must be a positive multiple of the patch size 8x8"),
])
def test_bad_overrides_are_one_line_not_replaced(overrides, match, tmp_path: Path) -> None:
    """Probe 4 cases 31, 32, 38, 39, 52: an override is given when it is not None; 0 is refused (not replaced by the
    file's value), and ``img_size`` has one form (an int or a pair, multiples of the patch)."""
    path = _axial_ape_file(tmp_path)
    with pytest.raises(RoPEViTCheckpointError, match=match) as err:
        from_rope_vit_checkpoint(path, **overrides)
    assert _one_line(err).startswith(f"checkpoint {path}: the override ")


def test_overrides_win_over_the_file(tmp_path: Path) -> None:
    model = from_rope_vit_checkpoint(_axial_ape_file(tmp_path), theta=7, img_size=(IMG, IMG), ape="learned")
    assert model.blocks[0].attn.rpe_k.theta == 7.0 and model.patch_embed.img_size == (IMG, IMG)


@pytest.mark.parametrize(("ape_file", "ape", "held"), [
    (True, "sincos", r"a learned position table \(pos_embed\); valid: ape='learned'"),
    (True, "none", r"a learned position table \(pos_embed\); valid: ape='learned'"),
    (False, "sincos", r"no position table \(no pos_embed\); valid: ape='none'"),
    (False, "learned", r"no position table \(no pos_embed\); valid: ape='none'"),
])
def test_ape_override_that_contradicts_the_file_is_refused(ape_file, ape, held, tmp_path: Path) -> None:
    """Probe 4 case 55: ape='sincos' on a learned-APE file loaded the learned table into a model labelled sincos."""
    path = save(tmp_path, hand_state(False, ape_file))
    with pytest.raises(RoPEViTCheckpointError, match=f"the override ape='{ape}' contradicts the file, which holds"
                                                     f" {held}") as err:
        from_rope_vit_checkpoint(path, num_heads=HEADS, ape=ape)
    _one_line(err)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_naming_the_first(bad, tmp_path: Path) -> None:
    """Probe 4 case 41: a NaN/inf weight loaded without a word (eval.py and plot_rpe.py refuse them)."""
    state = hand_state(True, True)
    state["head.weight"][1, 2] = bad
    state["blocks.1.gamma_2"][0] = bad
    path = save(tmp_path, state)
    with pytest.raises(RoPEViTCheckpointError, match=r"holds non-finite weights: blocks\.1\.gamma_2 has 1 NaN/inf of"
                                                     f" {DIM} values") as err:
        from_rope_vit_checkpoint(path, num_heads=HEADS)
    _one_line(err)


def _finished_run(folder: Path) -> Path:
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "run.json").write_text('{"state": "finished"}')
    (folder / "checkpoints" / "best.ckpt").write_bytes(b"the run's weights")
    return folder


def test_export_never_lands_in_a_run_dir_or_a_data_root(tmp_path: Path) -> None:
    """Probe 4 cases 45, 46: the export replaced a run's best.ckpt and wrote into a data root; now one line, nothing
    written (the project's destination rule)."""
    run = _finished_run(tmp_path / "runs" / "d2")
    data = tmp_path / "data" / "rel_small"
    (data / "train" / "a").mkdir(parents=True)
    (data / ".complete.json").write_text("{}")
    model = our_model("rope_axial", True)
    for path, where in ((run / "checkpoints" / "best.ckpt", f"is inside the run dir {run}"),
                        (data / "export.pth", f"is inside the data root {data}")):
        with pytest.raises(RoPEViTCheckpointError, match=f"to_rope_vit_checkpoint path='{path}' {where}") as err:
            to_rope_vit_checkpoint(model, path)
        _one_line(err)
    assert (run / "checkpoints" / "best.ckpt").read_bytes() == b"the run's weights"
    assert not (data / "export.pth").exists()
    assert to_rope_vit_checkpoint(model, tmp_path / "exports" / "m.pth").is_file()  # elsewhere: written
    fifo = tmp_path / "exports" / "fifo.pth"  # probe 15, n121b: a FIFO there was replaced by the file
    os.mkfifo(fifo)
    with pytest.raises(RoPEViTCheckpointError, match=f"^to_rope_vit_checkpoint path: {fifo} cannot be used: it is a"
                                                     " FIFO") as err:
        to_rope_vit_checkpoint(model, fifo)
    _one_line(err)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
