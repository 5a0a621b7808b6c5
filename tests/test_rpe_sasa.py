"""SASA's row/column offset embeddings against a naive float64 formula; backbones; training."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rpe import build_rpe, rpe_attention
from tests.helpers import check_encoding_everywhere, check_trains_from_the_command_line

H, D = 2, 8


def naive_attention(q, k, v, rows, cols, h, w, skip, B):
    """e_ij = q_i.(k_j + r_ij) / sqrt(d), r_ij = [rows[clip(dr)], cols[clip(dc)]]; skip pairs: the last bucket."""
    n = skip + h * w
    logits = (q @ k.transpose(-1, -2)).clone()
    for i in range(n):
        for j in range(n):
            if i < skip or j < skip:
                br = bc = 2 * B + 1
            else:
                (ri, ci), (rj, cj) = divmod(i - skip, w), divmod(j - skip, w)
                br, bc = max(-B, min(B, ri - rj)) + B, max(-B, min(B, ci - cj)) + B
            r = torch.cat([rows[:, :, br], cols[:, :, bc]], dim=-1)  # (Hs, d)
            logits[:, :, i, j] = logits[:, :, i, j] + (q[:, :, i] * r).sum(-1)
    return (logits / math.sqrt(D)).softmax(-1) @ v


def test_matches_naive_formula_forward_and_gradients() -> None:
    h, w, skip = 3, 5, 1
    _, module, _ = build_rpe({"preset": "sasa", "ratio": 1.5, "shared_head": False}, D, H, dtype=torch.float64)
    torch.manual_seed(0)
    with torch.no_grad():
        module.rel_rows.normal_()
        module.rel_cols.normal_()
    assert module.rel_rows.shape == (H, D // 2, 2 * 3 + 1 + 1)  # B = int(2 * 1.5) = 3, plus the skip bucket
    q, k, v = (torch.randn(2, H, skip + h * w, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    params = [q, k, v, module.rel_rows, module.rel_cols]
    weight = torch.randn(2, H, skip + h * w, D, dtype=torch.float64)

    def run(fn):
        out = fn()
        return out.detach(), torch.autograd.grad((out * weight).sum(), params)

    expected, expected_grads = run(lambda: naive_attention(q, k, v, module.rel_rows, module.rel_cols, h, w, skip, 3))
    for backend in ("auto", "sdpa", "eager", "naive"):
        out, grads = run(lambda b=backend: rpe_attention(q, k, v, rpe_k=module, grid_size=(h, w), backend=b))
        assert torch.allclose(out, expected, atol=1e-10), backend
        for got, want in zip(grads, expected_grads, strict=True):
            assert torch.allclose(got, want, atol=1e-9), backend


def test_preset_is_exact_on_a_14x14_grid_and_backbones() -> None:
    _, module, _ = build_rpe("sasa", 64, 6)
    assert module.rel_rows.shape == (1, 32, 27 + 1)  # offsets -13..13 each exact, plus the skip bucket
    panel = module.describe(14, 14).panels[0][1]
    assert panel.shape == (1, 27, 27)
    check_encoding_everywhere("sasa")


@pytest.mark.slow  # a train.py process: most of this file's time; the backbones above stay in `make test`
def test_trains_from_the_command_line(tmp_path: Path, data_dir: Path) -> None:
    check_trains_from_the_command_line("sasa", tmp_path, data_dir)
