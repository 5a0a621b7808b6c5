"""SASA's row/column offset embeddings against a naive float64 formula; backbones; training."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from rpe import build_rpe, rpe_attention
from tests.conftest import SMALL_RELATIONAL, run_cli

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


def test_preset_is_exact_on_a_14x14_grid_and_backbones(tmp_path: Path, data_dir: Path) -> None:
    from models import create_model
    from models.detr import Transformer

    _, module, _ = build_rpe("sasa", 64, 6)
    assert module.rel_rows.shape == (1, 32, 27 + 1)  # offsets -13..13 each exact, plus the skip bucket
    panel = module.describe(14, 14).panels[0][1]
    assert panel.shape == (1, 27, 27)
    for name in ("deit_micro_patch4_32", "swin_micro_patch4_window4_32"):
        create_model(name, rpe="sasa", num_classes=4)(torch.randn(2, 3, 32, 32)).sum().backward()
    detr = Transformer(dim=32, heads=2, enc_layers=1, dec_layers=1, ffn=32, enc_rpe="sasa")
    detr.encode(torch.randn(2, 32, 3, 5), torch.zeros(2, 3, 5, dtype=torch.bool), torch.randn(2, 32, 3, 5))
    result = run_cli("train.py", [
        "rpe=sasa", "debug=fast", "logger=csv", *SMALL_RELATIONAL, "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=1", f"paths.log_dir={tmp_path}", "run_name=sasa", f"paths.data_dir={data_dir}",
    ])
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "sasa" / "metrics.json").is_file()
