"""Swin-v2 log-spaced continuous position bias against a naive float64 formula; backbones; training."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rpe import build_rpe, rpe_attention
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


def test_backbones() -> None:
    check_encoding_everywhere("cpb")


@pytest.mark.slow  # a train.py process: most of this file's time; the backbones above stay in `make test`
def test_trains_from_the_command_line(tmp_path: Path, data_dir: Path) -> None:
    check_trains_from_the_command_line("cpb", tmp_path, data_dir)
