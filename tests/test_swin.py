"""Swin with pluggable RPE: timm parity, every preset in shifted windows, a naive reference for one
shifted block, variable input sizes, table resizing on load, and one step of each Swin experiment."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import timm
import torch
from timm.models import swin_transformer as timm_swin
from timm.optim import create_optimizer_v2

from models import create_model
from models.swin import RPESwinTransformer, RPEWindowAttention, load_swin_checkpoint
from rpe import PRESETS
from tests.helpers import compose_config, fit_only

# img 32, patch 4: stage 1 is 8x8 tokens in 4x4 windows (the odd blocks shifted by 2), stage 2 is 4x4.
SMALL = dict(img_size=32, patch_size=4, window_size=4, embed_dim=32, depths=(2, 2), num_heads=(2, 4),
             num_classes=5)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _attention_layers(model: torch.nn.Module) -> list[RPEWindowAttention]:
    return [m for m in model.modules() if isinstance(m, RPEWindowAttention)]


def test_timm_swin_tiny_state_dict_gives_identical_logits() -> None:
    reference = timm.create_model("swin_tiny_patch4_window7_224").eval()
    ours = create_model("swin_tiny_patch4_window7_224", rpe="swin").eval()  # Swin's own table
    assert len(_attention_layers(ours)) == 12
    ours.load_state_dict(reference.state_dict(), strict=True)
    assert sorted(ours.state_dict()) == sorted(reference.state_dict())
    assert ours.no_weight_decay() == reference.no_weight_decay()
    assert len(ours.no_weight_decay()) == 12
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(images), reference(images), rtol=0, atol=1e-6)


@pytest.mark.parametrize("fused", [False, True])
def test_small_swin_matches_timm_with_either_kernel(fused: bool) -> None:
    reference = timm_swin.SwinTransformer(**SMALL).eval()
    ours = RPESwinTransformer(rpe="swin", **SMALL).eval()
    ours.load_state_dict(reference.state_dict(), strict=True)
    for model in (reference, ours):
        for block in (b for stage in model.layers for b in stage.blocks):
            block.attn.fused_attn = fused
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(images), reference(images), rtol=0, atol=1e-6)


def test_weight_decay_groups() -> None:
    """Swin's table is not decayed (timm's no_weight_decay); iRPE tables are, as in the reference."""
    for rpe, table, decayed in (("swin", "relative_position_bias_table", False),
                                ("irpe_bias_k", "rpe_k.lookup_table_bias", True)):
        model = RPESwinTransformer(rpe=rpe, **SMALL)
        optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
        names = {id(p): n for n, p in model.named_parameters()}
        for group in optimizer.param_groups:
            in_group = [names[id(p)] for p in group["params"] if names[id(p)].endswith(table)]
            if in_group:
                assert (group["weight_decay"] > 0) == decayed, (rpe, group["weight_decay"])
        assert sum(n.endswith(table) for n in names.values()) == 4


@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_trains_in_shifted_windows(preset: str) -> None:
    model = create_model("swin_micro_patch4_window4_32", rpe=preset, **{**SMALL, "embed_dim": 16})
    shifted = model.layers[0].blocks[1]
    assert shifted.shift_size == (2, 2) and shifted.attn_mask is not None
    state = model.state_dict()
    has_swin_table = any(k.endswith("relative_position_bias_table") for k in state)
    assert has_swin_table == (preset == "swin")
    rpe_keys = [k for k in state if ".attn.rpe_" in k]
    stateless = ("swin", "none", "alibi", "rope_axial")  # fixed slopes / fixed rotation frequencies: no state
    assert bool(rpe_keys) == (preset not in stateless)
    if preset == "irpe_qkv":
        assert {"layers.0.blocks.1.attn.rpe_q.lookup_table_weight", "layers.0.blocks.1.attn.rpe_k.lookup_table_weight",
                "layers.0.blocks.1.attn.rpe_v.lookup_table_weight"} <= set(state)

    logits = model(torch.randn(2, 3, 32, 32))
    assert logits.shape == (2, 5)
    logits.logsumexp(-1).sum().backward()
    position_params = [(n, p) for n, p in model.named_parameters()
                       if ".attn.rpe_" in n or n.endswith("relative_position_bias_table")]
    for name, param in position_params:
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
    if position_params:
        assert any(p.grad.abs().sum() > 0 for _, p in position_params), preset


def _piecewise(x: int, ratio: float) -> int:
    """The iRPE piecewise index, written out for scalars (Python's round is half-to-even too)."""
    alpha, beta, gamma = ratio, 2 * ratio, 8 * ratio
    if abs(x) <= alpha:
        return round(x)
    value = min(int(beta), round(alpha + math.log(abs(x) / alpha) / math.log(gamma / alpha) * (beta - alpha)))
    return int(math.copysign(value, x))


def _naive_shifted_window_attention(attn: RPEWindowAttention, x: torch.Tensor, window: int, shift: int,
                                    ratio: float) -> torch.Tensor:
    """W-MSA with iRPE-K by explicit loops: roll, per window and query, masked softmax, roll back.

    ``x`` ``(B, H, W, C)``. Two tokens of a window may attend iff both or neither wrapped around
    in each axis; the relative position is taken in the rolled frame (where the window is contiguous).
    """
    B, H, W, C = x.shape
    heads = attn.num_heads
    d = C // heads
    table = attn.rpe_k.lookup_table_weight[0]  # (d, nb), shared heads
    B_int = int(2 * ratio)
    rolled = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
    out = torch.zeros_like(rolled)
    for b in range(B):
        for r0 in range(0, H, window):
            for c0 in range(0, W, window):
                cells = [(r, c) for r in range(r0, r0 + window) for c in range(c0, c0 + window)]
                tokens = torch.stack([rolled[b, r, c] for r, c in cells])  # (N, C)
                q, k, v = attn.qkv(tokens).view(len(cells), 3, heads, d).unbind(1)  # (N, heads, d)
                result = torch.zeros(len(cells), heads, d)
                for i, (ri, ci) in enumerate(cells):
                    for h in range(heads):
                        logits = []
                        for j, (rj, cj) in enumerate(cells):
                            same = (ri >= H - shift) == (rj >= H - shift) and (ci >= W - shift) == (cj >= W - shift)
                            if not same:
                                logits.append(torch.tensor(float("-inf")))
                                continue
                            bucket = ((_piecewise(ri - rj, ratio) + B_int) * (2 * B_int + 1)
                                      + _piecewise(ci - cj, ratio) + B_int)
                            qs = q[i, h] * d**-0.5
                            logits.append(qs @ k[j, h] + qs @ table[:, bucket])
                        weights = torch.stack(logits).softmax(0)
                        result[i, h] = weights @ v[:, h]
                projected = attn.proj(result.reshape(len(cells), C))
                for (r, c), value in zip(cells, projected, strict=True):
                    out[b, r, c] = value
    return torch.roll(out, shifts=(shift, shift), dims=(1, 2))


def test_irpe_k_shifted_block_equals_naive_reference() -> None:
    model = RPESwinTransformer(rpe="irpe_k", **{**SMALL, "embed_dim": 8}).eval()
    block = model.layers[0].blocks[1]
    assert block.shift_size == (2, 2) and block.window_size == (4, 4)
    with torch.no_grad():
        block.attn.rpe_k.lookup_table_weight.normal_()
        x = torch.randn(2, 8, 8, 8)
        ours = block._attn(x)
        naive = _naive_shifted_window_attention(block.attn, x, window=4, shift=2, ratio=1.9)
    torch.testing.assert_close(ours, naive, rtol=1e-4, atol=1e-5)


def test_non_square_input_sizes() -> None:
    # set_input_size: the windows scale with the grid, here to 4x6 at stage 1 (a non-square RPE grid)
    reference = timm_swin.SwinTransformer(**SMALL).eval()
    ours = RPESwinTransformer(rpe="swin", **SMALL).eval()
    ours.load_state_dict(reference.state_dict())
    irpe = RPESwinTransformer(rpe="irpe_k", **SMALL).eval()
    for model in (reference, ours, irpe):
        model.set_input_size(img_size=(32, 48))
    assert irpe.layers[0].blocks[1].attn.window_size == (4, 6)
    images = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        torch.testing.assert_close(ours(images), reference(images), rtol=0, atol=1e-6)
        assert irpe(images).shape == (2, 5)
    # strict_img_size=False: any size divisible by the patch, padded to whole windows per forward
    dynamic = RPESwinTransformer(rpe="irpe_qkv", strict_img_size=False, **SMALL)
    dynamic(torch.randn(2, 3, 40, 24)).sum().backward()
    assert dynamic.layers[0].blocks[1].attn.rpe_v.lookup_table_weight.grad is not None


def test_checkpoint_for_another_window_size_is_resized_on_load(tmp_path: Path) -> None:
    source = RPESwinTransformer(rpe="swin", **SMALL)
    path = tmp_path / "swin_w4.pth"
    torch.save({"model": source.state_dict()}, path)
    target = RPESwinTransformer(rpe="swin", **{**SMALL, "window_size": 8, "img_size": 64})
    load_swin_checkpoint(target, path)
    table = target.layers[0].blocks[0].attn.relative_position_bias_table
    assert table.shape == (15 * 15, 2)
    # the same numbers as timm's own filter gives timm's model
    timm_target = timm_swin.SwinTransformer(**{**SMALL, "window_size": 8, "img_size": 64})
    expected = timm_swin.checkpoint_filter_fn(source.state_dict(), timm_target)
    torch.testing.assert_close(table.detach(), expected["layers.0.blocks.0.attn.relative_position_bias_table"])
    assert target(torch.randn(1, 3, 64, 64)).shape == (1, 5)

    # Swin weights into an iRPE Swin: Swin's tables are dropped, only the new RPE tables are missing
    irpe = RPESwinTransformer(rpe="irpe_k", **SMALL)
    result = load_swin_checkpoint(irpe, path, strict=False)
    assert not result.unexpected_keys
    assert result.missing_keys and all(".attn.rpe_k." in k for k in result.missing_keys)


@pytest.mark.slow
def test_swin_experiment_configs_run_one_step(tmp_path: Path) -> None:
    """Every Swin experiment runs a train and a val step on a fake ImageFolder of its image size."""
    from data import make_fake_imagefolder
    from tests.test_configs import _options

    experiments = [e for e in _options("experiment") if e.startswith("swin_")]
    assert {"swin_tiny_swin", "swin_tiny_irpe_k"} <= set(experiments)
    for name in experiments:
        img_size = 32 if "micro" in name else 224
        root = make_fake_imagefolder(tmp_path / f"fake_{img_size}", num_classes=3, per_class=2, img_size=img_size,
                                     seed=0)
        extra = ["data.generator=null"] if "micro" in name else []
        extra.append("data.num_classes=null")  # the fake folder's 3 classes, not the experiment's
        cfg = compose_config(
            # no checkpoints (a Swin-T one with AdamW state is 0.3 GB) and no sanity-check pass
            [f"experiment={name}", f"data.root={root}", *extra, "trainer=cpu", "trainer.devices=1", "debug=fast",
             "logger=csv", "callbacks=none", "callbacks.model_checkpoint=null", "callbacks.last_checkpoint=null",
             "+trainer.enable_checkpointing=false", "+trainer.num_sanity_val_steps=0", "data.batch_size=2",
             "trainer.limit_train_batches=1", "trainer.limit_val_batches=1", "test_after_fit=false"],
            tmp_path / name, tmp_path,
        )
        metrics = fit_only(cfg)
        assert metrics["global_step"] == 1, name
        assert torch.isfinite(torch.tensor(metrics["train/loss"])), name
