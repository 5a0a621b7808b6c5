"""Huang et al. 2020 against a naive float64 formula (one embedding on q and k); backbones; training."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rpe import RPEConfigError, build_rpe, parse_shorthand, rpe_attention
from tests.helpers import check_encoding_everywhere, check_trains_from_the_command_line

H, D = 2, 8


def naive_bucket(dr: int, dc: int, B: int) -> int:
    """Product + clip: ``(clip(dr) + B) * (2B + 1) + clip(dc) + B``."""
    def clip(x: int) -> int:
        return max(-B, min(B, x))

    return (clip(dr) + B) * (2 * B + 1) + clip(dc) + B


def naive_attention(q, k, v, table, h, w, skip, B):
    """e_ij = (q_i.k_j + q_i.a_ij + k_j.a_ij) / sqrt(d); a_ij = table[:, :, b(i, j)] (skip pairs: last bucket)."""
    n = skip + h * w
    skip_bucket = (2 * B + 1) ** 2
    logits = (q @ k.transpose(-1, -2)).clone()
    for i in range(n):
        for j in range(n):
            if i < skip or j < skip:
                b = skip_bucket
            else:
                (ri, ci), (rj, cj) = divmod(i - skip, w), divmod(j - skip, w)
                b = naive_bucket(ri - rj, ci - cj, B)
            a = table[:, :, b]  # (Hs, d), shared over heads here
            logits[:, :, i, j] = logits[:, :, i, j] + (q[:, :, i] * a).sum(-1) + (k[:, :, j] * a).sum(-1)
    return (logits / math.sqrt(D)).softmax(-1) @ v


def test_matches_naive_formula_forward_and_gradients() -> None:
    h, w, skip = 3, 5, 1
    _, module, _ = build_rpe("huang", D, H, dtype=torch.float64)
    torch.manual_seed(0)
    with torch.no_grad():
        module.lookup_table_weight.normal_()
    q, k, v = (torch.randn(2, H, skip + h * w, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    params = [q, k, v, module.lookup_table_weight]
    weight = torch.randn(2, H, skip + h * w, D, dtype=torch.float64)

    def run(fn):
        out = fn()
        return out.detach(), torch.autograd.grad((out * weight).sum(), params)

    expected, expected_grads = run(lambda: naive_attention(q, k, v, module.lookup_table_weight, h, w, skip, 3))
    for backend in ("auto", "sdpa", "eager", "naive", "flex"):
        if backend == "flex":
            with torch.no_grad():  # FlexAttention runs forward only on CPU
                out = rpe_attention(q.detach(), k.detach(), v.detach(), rpe_k=module, grid_size=(h, w),
                                    backend=backend)
            assert torch.allclose(out, expected, atol=1e-10), backend
            continue
        out, grads = run(lambda b=backend: rpe_attention(q, k, v, rpe_k=module, grid_size=(h, w), backend=b))
        assert torch.allclose(out, expected, atol=1e-10), backend
        for got, want in zip(grads, expected_grads, strict=True):
            assert torch.allclose(got, want, atol=1e-9), backend


def test_config_and_backbones() -> None:
    assert build_rpe("huang", D, H)[1].lookup_table_weight.shape == (1, D, 7 * 7 + 1)  # shared heads, 49 + skip
    assert parse_shorthand("rpe-1.9-huang-ctx-1-k").method == "huang"
    with pytest.raises(RPEConfigError, match="rpe.on='qk' is not read by rpe.method='huang'"):
        parse_shorthand("rpe-1.9-huang-ctx-1-qk")  # Huang's term is on q and k by definition: `on` is not a knob
    check_encoding_everywhere("huang")


@pytest.mark.slow  # a train.py process: most of this file's time; the backbones above stay in `make test`
def test_trains_from_the_command_line(tmp_path: Path, data_dir: Path) -> None:
    check_trains_from_the_command_line("huang", tmp_path, data_dir)
