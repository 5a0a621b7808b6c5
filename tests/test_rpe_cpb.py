"""Swin-v2 log-spaced continuous position bias against a naive float64 formula and against timm's own Swin-v2
window attention (`timm.models.swin_transformer_v2.WindowAttention`) for the same MLP weights; backbones; training.

timm's ``pretrained_window_size`` has no counterpart setting here: the module's coordinates are timm's with
``pretrained_window_size=(9, 9)`` on every grid (offsets never normalised by the grid), which is also what
timm's default (``(0, 0)``: normalise by ``window - 1``) gives on a 9x9 window, and only there.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from timm.models.swin_transformer_v2 import WindowAttention as SwinV2WindowAttention

from rpe import build_rpe, rpe_attention
from rpe.base import materialize_pieces
from tests.helpers import check_encoding_everywhere, check_trains_from_the_command_line

H, D = 2, 8


def naive_bias(module, dr: int, dc: int) -> torch.Tensor:
    """``(H,)``: 16 sigmoid(W2 relu(W1 x + b1)), x = sign(d) log2(1 + |d|) / 3 per axis."""
    x = torch.tensor([math.copysign(math.log2(1 + abs(d)), d) / 3 for d in (dr, dc)], dtype=torch.float64)
    hidden = torch.relu(module.mlp.fc1.weight @ x + module.mlp.fc1.bias)
    return 16 * torch.sigmoid(module.mlp.fc2.weight @ hidden)


def naive_attention(q, k, v, module, h, w, skip):
    n = skip + h * w
    bias = [[torch.zeros(H, dtype=torch.float64) for _ in range(n)] for _ in range(n)]
    for i in range(h * w):
        for j in range(h * w):
            (ri, ci), (rj, cj) = divmod(i, w), divmod(j, w)
            bias[skip + i][skip + j] = naive_bias(module, ri - rj, ci - cj)
    bias = torch.stack([torch.stack(row, dim=-1) for row in bias], dim=-2)  # (H, n, n)
    return ((q @ k.transpose(-1, -2)) / math.sqrt(D) + bias).softmax(-1) @ v


def test_matches_naive_formula_forward_and_gradients() -> None:
    h, w, skip = 3, 4, 1
    _, module, _ = build_rpe({"preset": "cpb", "hidden_dim": 16}, D, H, dtype=torch.float64)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, H, skip + h * w, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    params = [q, k, v, *module.parameters()]
    weight = torch.randn(2, H, skip + h * w, D, dtype=torch.float64)

    def run(fn):
        out = fn()
        return out.detach(), torch.autograd.grad((out * weight).sum(), params)

    expected, expected_grads = run(lambda: naive_attention(q, k, v, module, h, w, skip))
    for backend in ("auto", "sdpa", "eager", "naive"):
        out, grads = run(lambda b=backend: rpe_attention(q, k, v, rpe_k=module, grid_size=(h, w), backend=b))
        assert torch.allclose(out, expected, atol=1e-6), backend  # timm's log coordinates are float32
        for got, want in zip(grads, expected_grads, strict=True):
            assert torch.allclose(got, want, atol=1e-5), backend


def test_same_function_of_the_offset_on_every_grid() -> None:
    """The bias of an offset does not depend on the grid size (it transfers across grids)."""
    _, module, _ = build_rpe("cpb", D, H)
    small = module.describe(3, 4).panels[0][1]  # (H, 5, 7)
    large = module.describe(6, 5).panels[0][1]  # (H, 11, 9)
    assert torch.allclose(small, large[:, 3:8, 1:8])
    assert torch.allclose(small[:, 2 + 1, 3 - 2], naive_bias(module.double(), 1, -2).float(), atol=1e-5)


def with_timm_swin_v2(window: tuple[int, int], pretrained_window: tuple[int, int]):
    """timm's Swin-v2 window attention (float64, its own init of ``cpb_mlp``: 2 -> 512 -> H) and our module
    with that MLP's weights copied in (``cpb_mlp.0`` -> ``mlp.fc1``, ``cpb_mlp.2`` -> ``mlp.fc2``)."""
    torch.manual_seed(0)
    timm_attn = SwinV2WindowAttention(H * D, window, H, pretrained_window_size=pretrained_window, dtype=torch.float64)
    _, module, _ = build_rpe({"preset": "cpb", "hidden_dim": 512}, D, H, dtype=torch.float64)
    with torch.no_grad():
        module.mlp.fc1.weight.copy_(timm_attn.cpb_mlp[0].weight)
        module.mlp.fc1.bias.copy_(timm_attn.cpb_mlp[0].bias)
        module.mlp.fc2.weight.copy_(timm_attn.cpb_mlp[2].weight)
    return module, timm_attn


def timm_bias(timm_attn) -> torch.Tensor:
    """``(H, N, N)``: the bias timm's ``WindowAttention.forward`` adds to the logits (its lines, on its buffers):
    ``cpb_mlp`` over ``relative_coords_table``, gathered by ``relative_position_index``, then ``16 sigmoid``."""
    n = timm_attn.window_size[0] * timm_attn.window_size[1]
    table = timm_attn.cpb_mlp(timm_attn.relative_coords_table).view(-1, H)
    return 16 * torch.sigmoid(table[timm_attn.relative_position_index.view(-1)].view(n, n, H).permute(2, 0, 1))


def our_bias(module, window: tuple[int, int]) -> torch.Tensor:
    """``(H, N, N)``: the term our attention adds (the module's logit pieces as the backends sum them)."""
    q = torch.zeros(1, H, window[0] * window[1], D, dtype=torch.float64)
    return materialize_pieces(module.logit_pieces(q, None, *window, 0, D**-0.5))[0]


@pytest.mark.parametrize(("window", "pretrained_window"), [
    ((4, 4), (9, 9)), ((8, 8), (9, 9)), ((4, 6), (9, 9)), ((9, 9), (0, 0)),
])
def test_bias_equals_timm_swin_v2(window: tuple[int, int], pretrained_window: tuple[int, int]) -> None:
    """Per-head bias ``[H, N, N]`` equals timm's, square and non-square windows. Both sides build the same
    float32 log coordinates (offsets divided by 8, times 8: exact), then run the MLP in float64; measured
    max |diff| 0 (4x4, 8x8, 9x9) and 1.8e-15 (4x6)."""
    module, timm_attn = with_timm_swin_v2(window, pretrained_window)
    expected = timm_bias(timm_attn)
    assert expected.std() > 0.1  # the sigmoid is not saturated: the comparison sees the weights
    assert (our_bias(module, window) - expected).abs().max() <= 1e-12


def test_timm_default_pretrained_window_normalises_by_the_window_unlike_ours() -> None:
    """No ``pretrained_window_size`` setting here: at a 4x4 window timm's default divides offsets by 3, ours
    does not (offset 1 -> log2(1 + 8/3) / 3 in timm, log2(2) / 3 here), so the biases differ (max |diff| 0.61)."""
    module, timm_attn = with_timm_swin_v2((4, 4), (0, 0))
    timm_offset_1 = torch.tensor([math.log2(1 + 8 / 3) / 3, 0.0], dtype=torch.float64)  # (dr, dc) = (1, 0)
    assert torch.allclose(timm_attn.relative_coords_table[0, 3 + 1, 3], timm_offset_1, atol=1e-7)
    ours_offset_1 = module.log_coords(4, 4, torch.device("cpu"), torch.float64)[(3 + 1) * 7 + 3]
    assert torch.allclose(ours_offset_1, torch.tensor([1 / 3, 0.0], dtype=torch.float64))
    assert (our_bias(module, (4, 4)) - timm_bias(timm_attn)).abs().max() > 0.1


@pytest.mark.parametrize("backend", ["auto", "sdpa", "eager", "naive"])
def test_window_attention_equals_timm_swin_v2_forward_and_gradients(backend: str) -> None:
    """One Swin-v2 window attention layer (cosine attention, per-head logit scale, qkv and output projections
    timm's) on a 4x6 window: timm's ``forward`` against ``rpe_attention`` with our module as the bias, and the
    gradients of the input and of the MLP weights (float64). Measured max |diff| 9.4e-16 (output), 1.6e-14
    (gradients)."""
    window, n = (4, 6), 24
    module, timm_attn = with_timm_swin_v2(window, (9, 9))
    with torch.no_grad():
        timm_attn.q_bias.normal_()
        timm_attn.v_bias.normal_()
        timm_attn.logit_scale.copy_(torch.tensor([1.0, 2.5]).view(H, 1, 1))
    x = torch.randn(3, n, H * D, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, n, H * D, dtype=torch.float64)

    def ours():
        bias = torch.cat((timm_attn.q_bias, timm_attn.k_bias, timm_attn.v_bias))
        q, k, v = F.linear(x, timm_attn.qkv.weight, bias).reshape(3, n, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
        logit_scale = timm_attn.logit_scale.clamp(max=math.log(100)).exp()
        out = rpe_attention(F.normalize(q, dim=-1) * logit_scale, F.normalize(k, dim=-1), v, rpe_k=module,
                            grid_size=window, scale=1.0, backend=backend)
        return timm_attn.proj(out.transpose(1, 2).reshape(3, n, H * D))

    def run(fn, mlp):
        out = fn()
        return out.detach(), torch.autograd.grad((out * weight).sum(), [x, *mlp])

    expected, expected_grads = run(lambda: timm_attn(x), list(timm_attn.cpb_mlp.parameters()))
    out, grads = run(ours, [module.mlp.fc1.weight, module.mlp.fc1.bias, module.mlp.fc2.weight])
    assert (out - expected).abs().max() <= 1e-12
    for got, want in zip(grads, expected_grads, strict=True):
        assert (got - want).abs().max() <= 1e-12


def test_backbones() -> None:
    check_encoding_everywhere("cpb")


@pytest.mark.slow  # a train.py process: most of this file's time; the backbones above stay in `make test`
def test_trains_from_the_command_line(tmp_path: Path, data_dir: Path) -> None:
    check_trains_from_the_command_line("cpb", tmp_path, data_dir)
