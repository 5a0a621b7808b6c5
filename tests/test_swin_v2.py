"""Swin-v2 with pluggable RPE: timm parity with its own CPB (a small config in make test, Swin-v2-T slow), every
preset in shifted windows, contextual iRPE in cosine attention against the formulas written out per pair,
checkpoints across presets, input sizes, and one step of each Swin-v2 experiment."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import timm
import torch
from timm.models import swin_transformer_v2 as timm_swin_v2
from timm.optim import create_optimizer_v2

from models import create_model
from models.swin import load_swin_checkpoint
from models.swin_v2 import RPESwinTransformerV2, RPEWindowAttentionV2
from rpe import PRESETS
from tests.helpers import SMALL_RELATIONAL, compose_config, fit_only, run_cli
from tests.test_swin import SMALL, _piecewise  # the same small Swin: 8x8 then 4x4 tokens in 4x4 windows


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _attention_layers(model: torch.nn.Module) -> list[RPEWindowAttentionV2]:
    return [m for m in model.modules() if isinstance(m, RPEWindowAttentionV2)]


def _randomise(model: torch.nn.Module) -> None:
    """Weights timm initialises to constants, drawn at random, so that every block's attention reaches the
    logits: timm's post-norms start at zero (each block is then the identity), q and v biases at zero, every
    logit scale at ln 10 (some are set above timm's clamp at ln 100)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm1.weight", "norm2.weight")):
                p.uniform_(0.5, 1.5)
            elif name.endswith(("norm1.bias", "norm2.bias", "q_bias", "v_bias")):
                p.normal_(std=0.1)
            elif name.endswith("logit_scale"):
                p.uniform_(1.0, 5.0).view(-1)[0] = 5.0  # head 0 above the clamp


@pytest.mark.parametrize(("backend", "dtype", "atol"), [
    ("auto", torch.float32, 1e-6), ("sdpa", torch.float32, 1e-6), ("auto", torch.float64, 1e-12),
])
def test_small_swin_v2_with_cpb_matches_timm(backend: str, dtype: torch.dtype, atol: float) -> None:
    """timm's state dict loads strictly and gives timm's logits (measured max |diff| on logits of std 0.2: 3.1e-7
    float32 eager, 2.6e-7 SDPA, 2.6e-16 float64; the rounding differs where timm scales the product q^.k^ by tau
    and we scale the query, and where timm adds its bias before the mask and we after)."""
    reference = timm_swin_v2.SwinTransformerV2(**SMALL).to(dtype).eval()
    _randomise(reference)
    assert (reference.layers[0].blocks[0].attn.logit_scale > math.log(100)).any()  # the clamp is exercised
    ours = RPESwinTransformerV2(rpe={"preset": "cpb", "backend": backend}, **SMALL).to(dtype).eval()
    assert len(_attention_layers(ours)) == 4
    ours.load_state_dict(reference.state_dict(), strict=True)
    assert sorted(ours.state_dict()) == sorted(reference.state_dict())
    assert ours.no_weight_decay() == reference.no_weight_decay()
    images = torch.randn(3, 3, 32, 32, dtype=dtype)
    with torch.no_grad():
        expected = reference(images)
        assert expected.std() > 0.05
        torch.testing.assert_close(ours(images), expected, rtol=0, atol=atol)


@pytest.mark.slow  # Swin-v2-T built twice and run at 256 px
def test_timm_swinv2_tiny_state_dict_gives_identical_logits() -> None:
    """Measured max |diff| 3.1e-5 on logits of std 0.5 in float32 (12 blocks, logit scales up to 100), 6.2e-14 in
    float64."""
    reference = timm.create_model("swinv2_tiny_window8_256").eval()
    _randomise(reference)
    ours = create_model("swinv2_tiny_window8_256", rpe="cpb").eval()  # timm's own CPB
    assert len(_attention_layers(ours)) == 12 and ours.patch_embed.img_size == (256, 256)
    ours.load_state_dict(reference.state_dict(), strict=True)
    assert sorted(ours.state_dict()) == sorted(reference.state_dict())
    assert ours.no_weight_decay() == reference.no_weight_decay()
    images = torch.randn(2, 3, 256, 256)
    with torch.no_grad():
        torch.testing.assert_close(ours(images), reference(images), rtol=0, atol=1e-4)
        images = images.double()
        torch.testing.assert_close(ours.double()(images), reference.double()(images), rtol=0, atol=1e-12)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_trains_in_shifted_windows(preset: str) -> None:
    model = create_model("swinv2_micro_window4_32", rpe=preset, **{**SMALL, "embed_dim": 16})
    shifted = model.layers[0].blocks[1]
    assert shifted.shift_size == (2, 2) and shifted.attn_mask is not None
    state = model.state_dict()
    assert any(".attn.cpb_mlp." in k for k in state) == (preset == "cpb")
    assert sum(k.endswith(".attn.logit_scale") for k in state) == 4  # cosine attention whatever the RPE
    rpe_keys = [k for k in state if ".attn.rpe_" in k]
    stateless = ("cpb", "none", "alibi", "rope_axial")  # timm's CPB / fixed slopes / fixed frequencies
    assert bool(rpe_keys) == (preset not in stateless)

    _randomise(model)  # timm's zero post-norms would stop every gradient to the attention
    logits = model(torch.randn(2, 3, 32, 32))
    assert logits.shape == (2, 5)
    logits.logsumexp(-1).sum().backward()
    position_params = [(n, p) for n, p in model.named_parameters() if ".attn.rpe_" in n or ".cpb_mlp." in n]
    for name, param in position_params:
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
    if position_params:
        assert any(p.grad.abs().sum() > 0 for _, p in position_params), preset


def _naive_cosine_irpe_qkv(attn: RPEWindowAttentionV2, x: torch.Tensor, window: int, shift: int, ratio: float,
                           raw_query: bool = False) -> torch.Tensor:
    """Shifted-window cosine attention with contextual iRPE on Q, K and V, by explicit loops (roll, per window,
    query, head and key; masked softmax; roll back). Per head h, ``tau = exp(min(logit_scale, ln 100))``::

        e_ij = tau q^_i.k^_j + tau q^_i.r^k[b(i,j)] + k^_j.r^q[b(j,i)],   z_i = sum_j a_ij (v_j + r^v[b(i,j)])

    A pair across a shift boundary gets timm's additive -100, not -inf: with tau up to 100 and the relative
    terms it is not a hard mask (written as -inf, this formula differs from timm's and ours by 0.1).
    ``raw_query``: the alternative not chosen, iRPE's terms with the raw q and k scaled by d^-1/2.
    """
    B, H, W, C = x.shape
    heads = attn.num_heads
    d = C // heads
    table_q, table_k = attn.rpe_q.lookup_table_weight[0], attn.rpe_k.lookup_table_weight[0]  # (d, nb)
    table_v = attn.rpe_v.lookup_table_weight[0]  # (nb, d)
    tau = attn.logit_scale.clamp(max=math.log(100)).exp().flatten()
    qkv_bias = torch.cat((attn.q_bias, torch.zeros_like(attn.q_bias), attn.v_bias))
    B_int = int(2 * ratio)

    def bucket(dr: int, dc: int) -> int:
        return (_piecewise(dr, ratio) + B_int) * (2 * B_int + 1) + _piecewise(dc, ratio) + B_int

    rolled = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
    out = torch.zeros_like(rolled)
    for b in range(B):
        for r0 in range(0, H, window):
            for c0 in range(0, W, window):
                cells = [(r, c) for r in range(r0, r0 + window) for c in range(c0, c0 + window)]
                tokens = torch.stack([rolled[b, r, c] for r, c in cells])  # (N, C)
                q, k, v = (tokens @ attn.qkv.weight.t() + qkv_bias).view(len(cells), 3, heads, d).unbind(1)
                result = torch.zeros(len(cells), heads, d)
                for i, (ri, ci) in enumerate(cells):
                    for h in range(heads):
                        logits, values = [], []
                        for j, (rj, cj) in enumerate(cells):
                            same = (ri >= H - shift) == (rj >= H - shift) and (ci >= W - shift) == (cj >= W - shift)
                            q_hat, k_hat = q[i, h] / q[i, h].norm(), k[j, h] / k[j, h].norm()
                            if raw_query:
                                position = d**-0.5 * (q[i, h] @ table_k[:, bucket(ri - rj, ci - cj)]
                                                      + k[j, h] @ table_q[:, bucket(rj - ri, cj - ci)])
                            else:
                                position = (tau[h] * q_hat @ table_k[:, bucket(ri - rj, ci - cj)]
                                            + k_hat @ table_q[:, bucket(rj - ri, cj - ci)])
                            logit = tau[h] * q_hat @ k_hat + position
                            logits.append(logit if same else logit - 100.0)  # timm's shift mask
                            values.append(v[j, h] + table_v[bucket(ri - rj, ci - cj)])
                        result[i, h] = torch.stack(logits).softmax(0) @ torch.stack(values)
                projected = attn.proj(result.reshape(len(cells), C))
                for (r, c), value in zip(cells, projected, strict=True):
                    out[b, r, c] = value
    return torch.roll(out, shifts=(shift, shift), dims=(1, 2))


def test_contextual_irpe_in_cosine_attention_equals_naive_formula() -> None:
    """The chosen combination (module docstring of models.swin_v2): the K term reads tau q^ (the content term's
    query), the Q term the normalised key, the V term is iRPE's; the raw-q alternative gives other numbers."""
    model = RPESwinTransformerV2(rpe="irpe_qkv", **{**SMALL, "embed_dim": 8}).eval()
    block = model.layers[0].blocks[1]
    assert block.shift_size == (2, 2) and block.window_size == (4, 4)
    attn = block.attn
    with torch.no_grad():
        for table in (attn.rpe_q, attn.rpe_k, attn.rpe_v):
            table.lookup_table_weight.normal_()
        attn.q_bias.normal_()
        attn.v_bias.normal_()
        attn.logit_scale.copy_(torch.tensor([1.0, 5.0]).view(2, 1, 1))  # head 1 above the clamp (ln 100)
        x = torch.randn(2, 8, 8, 8)
        ours = block._attn(x)
        naive = _naive_cosine_irpe_qkv(attn, x, window=4, shift=2, ratio=1.9)
        raw = _naive_cosine_irpe_qkv(attn, x, window=4, shift=2, ratio=1.9, raw_query=True)
    torch.testing.assert_close(ours, naive, rtol=1e-4, atol=1e-5)
    assert (ours - raw).abs().max() > 1e-2


def test_weight_decay_groups_and_cpb_width() -> None:
    """timm keeps cpb_mlp and logit_scale out of weight decay; iRPE tables are decayed as in the reference.
    rpe.hidden_dim sets the width of timm's MLP."""
    for rpe, table, decayed in (("cpb", "cpb_mlp.0.weight", False), ("irpe_k", "rpe_k.lookup_table_weight", True)):
        model = RPESwinTransformerV2(rpe=rpe, **SMALL)
        optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
        names = {id(p): n for n, p in model.named_parameters()}
        seen = 0
        for group in optimizer.param_groups:
            for name in (names[id(p)] for p in group["params"]):
                if name.endswith(table) or name.endswith("logit_scale"):
                    seen += 1
                    assert (group["weight_decay"] > 0) == (decayed and name.endswith(table)), (rpe, name)
        assert seen == 8
    narrow = RPESwinTransformerV2(rpe={"preset": "cpb", "hidden_dim": 64}, **SMALL)
    assert narrow.layers[1].blocks[0].attn.cpb_mlp[0].weight.shape == (64, 2)
    assert narrow.layers[1].blocks[0].attn.cpb_mlp[2].weight.shape == (4, 64)


def test_checkpoint_across_presets_and_input_sizes(tmp_path: Path) -> None:
    """A cpb checkpoint in an iRPE model: timm's CPB is dropped, only the new tables are missing. set_input_size
    (a non-square window) and strict_img_size=False work with timm's CPB (timm's numbers) and with iRPE."""
    source = RPESwinTransformerV2(rpe="cpb", **SMALL)
    path = tmp_path / "swinv2.pth"
    torch.save({"model": source.state_dict()}, path)
    irpe = RPESwinTransformerV2(rpe="irpe_k", **SMALL)
    result = load_swin_checkpoint(irpe, path, strict=False)
    assert not result.unexpected_keys
    assert result.missing_keys and all(".attn.rpe_k." in k for k in result.missing_keys)

    reference = timm_swin_v2.SwinTransformerV2(**SMALL).eval()
    _randomise(reference)
    ours = RPESwinTransformerV2(rpe="cpb", **SMALL).eval()
    ours.load_state_dict(reference.state_dict())
    for model in (reference, ours, irpe.eval()):
        model.set_input_size(img_size=(32, 48))
    assert irpe.layers[0].blocks[1].attn.window_size == (4, 6)
    images = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        torch.testing.assert_close(ours(images), reference(images), rtol=0, atol=1e-6)
        assert irpe(images).shape == (2, 5)
    dynamic = RPESwinTransformerV2(rpe="irpe_qkv", strict_img_size=False, **SMALL)
    dynamic(torch.randn(2, 3, 40, 24)).sum().backward()
    assert dynamic.layers[0].blocks[1].attn.rpe_v.lookup_table_weight.grad is not None


def _swin_v2_experiments() -> list:
    from tests.test_configs import _options

    # Swin-v2-T at 256 px: a train and a val step take most of make test's share; the micro one stays in it
    return [name if "micro" in name else pytest.param(name, marks=pytest.mark.slow)
            for name in _options("experiment") if name.startswith("swinv2_")]


@pytest.mark.parametrize("name", _swin_v2_experiments())
def test_swin_v2_experiment_configs_run_one_step(name: str, tmp_path: Path) -> None:
    """Every Swin-v2 experiment runs a train and a val step on a fake ImageFolder of its image size."""
    from data import make_fake_imagefolder

    img_size = 32 if "micro" in name else 256
    root = make_fake_imagefolder(tmp_path / "fake", num_classes=3, per_class=2, img_size=img_size, seed=0)
    extra = ["data.generator=null"] if "micro" in name else []
    cfg = compose_config(
        # no checkpoints and no sanity-check pass
        [f"experiment={name}", f"data.root={root}", *extra, "data.num_classes=null", "trainer=cpu",
         "trainer.devices=1", "debug=fast", "logger=csv", "callbacks=none", "callbacks.model_checkpoint=null",
         "callbacks.last_checkpoint=null", "+trainer.enable_checkpointing=false", "+trainer.num_sanity_val_steps=0",
         "data.batch_size=2", "trainer.limit_train_batches=1", "trainer.limit_val_batches=1", "test_after_fit=false"],
        tmp_path / name, tmp_path,
    )
    assert cfg.model.net.name.startswith("swinv2_") and cfg.data.img_size == img_size
    metrics = fit_only(cfg)
    assert metrics["global_step"] == 1
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))


def test_swin_v2_experiments_are_the_recipe() -> None:
    assert [e.values[0] if hasattr(e, "values") else e for e in _swin_v2_experiments()] == [
        "swinv2_micro_relational", "swinv2_tiny_cpb", "swinv2_tiny_irpe_k"]


@pytest.mark.slow  # a train.py process
def test_micro_trains_from_the_command_line(tmp_path: Path, data_dir: Path) -> None:
    """``train.py model=swinv2_micro``: a 3-step run on the embedded data that writes its metrics."""
    result = run_cli("train.py", [
        "model=swinv2_micro", "rpe=irpe_qkv", "debug=fast", "logger=csv", *SMALL_RELATIONAL,
        "trainer.limit_train_batches=3", "trainer.limit_val_batches=1", f"paths.log_dir={tmp_path}",
        "run_name=swinv2_micro", f"paths.data_dir={data_dir}",
    ], env_extra={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "swinv2_micro" / "metrics.json").is_file()
