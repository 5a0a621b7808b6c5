"""2-D ALiBi against a naive float64 formula with hand-worked slopes; backbones; command-line training."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rpe import build_rpe, rpe_attention
from tests.helpers import check_encoding_everywhere, check_trains_from_the_command_line

D = 8
# ALiBi's slopes: 4 heads 2^-2, 2^-4, 2^-6, 2^-8; 6 heads: those of 4, then every other slope of 8 (2^-1, 2^-3)
SLOPES = {4: [0.25, 0.0625, 0.015625, 0.00390625], 6: [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]}


def naive_attention(q, k, v, slopes, h, w, skip):
    n = skip + h * w
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    bias = torch.zeros(len(slopes), n, n, dtype=torch.float64)
    for i in range(h * w):
        for j in range(h * w):
            (ri, ci), (rj, cj) = divmod(i, w), divmod(j, w)
            for head, m in enumerate(slopes):
                bias[head, skip + i, skip + j] = -m * math.hypot(ri - rj, ci - cj)
    return (logits + bias).softmax(-1) @ v


@pytest.mark.parametrize("heads", [4, 6])
def test_matches_naive_formula_forward_and_gradients(heads: int) -> None:
    h, w, skip = 3, 5, 1
    _, module, _ = build_rpe("alibi", D, heads)
    assert list(module.parameters()) == []
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, heads, skip + h * w, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    weight = torch.randn(2, heads, skip + h * w, D, dtype=torch.float64)

    def run(fn):
        out = fn()
        return out.detach(), torch.autograd.grad((out * weight).sum(), [q, k, v])

    expected, expected_grads = run(lambda: naive_attention(q, k, v, SLOPES[heads], h, w, skip))
    for backend in ("auto", "sdpa", "eager", "naive"):
        out, grads = run(lambda b=backend: rpe_attention(q, k, v, rpe_k=module, grid_size=(h, w), backend=b))
        assert torch.allclose(out, expected, atol=1e-12), backend
        for got, want in zip(grads, expected_grads, strict=True):
            assert torch.allclose(got, want, atol=1e-12), backend
    panel = module.describe(h, w).panels[0][1]  # (heads, 5, 9): offset (2, -1) at [2 + 2, -1 + 4]
    assert torch.allclose(panel[:, 4, 3], -torch.tensor(SLOPES[heads]) * math.sqrt(5))


def test_backbones() -> None:
    check_encoding_everywhere("alibi")


@pytest.mark.slow  # a train.py process: most of this file's time; the backbones above stay in `make test`
def test_trains_from_the_command_line(tmp_path: Path, data_dir: Path) -> None:
    check_trains_from_the_command_line("alibi", tmp_path, data_dir)
