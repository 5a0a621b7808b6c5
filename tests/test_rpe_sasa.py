"""SASA's row/column offset embeddings against a naive float64 formula and against timm's relative logits
(`PosEmbedRel` of `timm.layers.bottleneck_attn` and `timm.layers.halo_attn`, `BottleneckAttn`) for the same
embeddings; backbones; training.

timm's tables map to ours with an explicit reversal and zero padding (`timm_tables`): timm indexes an axis by
key minus query, ``height_rel[m]`` for ``m = (r_j - r_i) + h - 1``, ours by query minus key (``R[dr + B]``,
``dr = r_i - r_j``), so ``height_rel[m] = R[B + (h-1) - m]``; and timm's per-axis embeddings span the whole
head dim, ours half each (rows the first half, columns the second), so the other half is zero.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from timm.layers import halo_attn
from timm.layers.bottleneck_attn import BottleneckAttn, PosEmbedRel

from rpe import build_rpe, rpe_attention
from rpe.base import materialize_pieces
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


B13 = 13  # the preset's clip bound (ratio 6.5): every offset of a grid up to 14x14 has its own embedding


def preset_with_random_tables(seed: int = 0):
    """The ``sasa`` preset (shared heads, clip, B = 13), float64, with N(0, 1) row and column tables."""
    _, module, _ = build_rpe("sasa", D, H, dtype=torch.float64)
    torch.manual_seed(seed)
    with torch.no_grad():
        module.rel_rows.normal_()
        module.rel_cols.normal_()
    return module


def timm_tables(module, h: int, w: int, reverse: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """timm's ``height_rel`` ``(2h-1, d)`` and ``width_rel`` ``(2w-1, d)`` holding our embeddings (module
    docstring): ``height_rel[m] = [R[B + (h-1) - m], 0]``, ``width_rel[m] = [0, C[B + (w-1) - m]]``.
    ``reverse=False`` drops the reversal (``[R[B - (h-1) + m], 0]``), to show that timm needs it."""
    half = D // 2
    rows = module.rel_rows[0, :, B13 - (h - 1): B13 + h].detach()  # (d/2, 2h-1): offsets dr = -(h-1) .. h-1
    cols = module.rel_cols[0, :, B13 - (w - 1): B13 + w].detach()
    if reverse:
        rows, cols = rows.flip(-1), cols.flip(-1)
    zeros = torch.zeros(half, dtype=rows.dtype)
    height = torch.cat([rows.t(), zeros.expand(2 * h - 1, half)], dim=1)
    width = torch.cat([zeros.expand(2 * w - 1, half), cols.t()], dim=1)
    return height, width


def timm_pos_embed(module, h: int, w: int, reverse: bool = True) -> PosEmbedRel:
    pos_embed = PosEmbedRel((h, w), D, scale=1.0, dtype=torch.float64)
    with torch.no_grad():
        for param, table in zip((pos_embed.height_rel, pos_embed.width_rel), timm_tables(module, h, w, reverse),
                                strict=True):
            param.copy_(table)
    return pos_embed


@pytest.mark.parametrize(("h", "w"), [(3, 5), (4, 4)])
def test_logits_equal_timm_pos_embed_rel(h: int, w: int) -> None:
    """The term our module adds to the logits, ``s q_i.r_ij`` ``(B, H, n, n)``, equals ``s`` times timm's
    ``PosEmbedRel(q)`` (`timm.layers.bottleneck_attn`; one table for all heads, like the preset) with the
    tables of `timm_tables`; on a square grid also `timm.layers.halo_attn`'s ``PosEmbedRel`` with
    ``block_size = win_size = h``. Without the reversal they differ (by 3.5-4.0). Measured max |diff| 8.9e-16
    (float64)."""
    module = preset_with_random_tables()
    q = torch.randn(2, H, h * w, D, dtype=torch.float64)
    scale = D**-0.5
    ours = materialize_pieces(module.logit_pieces(q * scale, None, h, w, 0, scale))

    def timm_logits(pos_embed):
        return scale * pos_embed(q.reshape(2 * H, h * w, D)).reshape(2, H, h * w, h * w)

    expected = timm_logits(timm_pos_embed(module, h, w))
    assert (ours - expected).abs().max() <= 1e-12
    assert (ours - timm_logits(timm_pos_embed(module, h, w, reverse=False))).abs().max() > 0.1
    if h == w:
        halo = halo_attn.PosEmbedRel(h, h, D, scale=1.0, dtype=torch.float64)
        with torch.no_grad():
            halo.height_rel.copy_(timm_tables(module, h, w)[0])
            halo.width_rel.copy_(timm_tables(module, h, w)[1])
        halo_logits = scale * halo(q.reshape(2 * H, 1, h * w, D)).reshape(2, H, h * w, h * w)
        assert (ours - halo_logits).abs().max() <= 1e-12


@pytest.mark.parametrize("backend", ["auto", "sdpa", "eager", "naive"])
def test_attention_equals_timm_bottleneck_attn_forward_and_gradients(backend: str) -> None:
    """timm's ``BottleneckAttn`` with ``scale_pos_embed=True`` (``softmax(s (q.k + PosEmbedRel(q))) v``: our
    ``s q.(k + r)``; timm's default ``False`` would leave the position term unscaled) on a 3x5 map against
    ``rpe_attention`` with our module on timm's q, k, v: the output, and the gradients of the input and of the
    tables (timm's mapped back through `timm_tables`). Float64; measured max |diff| 8.9e-16 (output), 1.4e-15
    (gradients)."""
    h, w, batch = 3, 5, 2
    module = preset_with_random_tables()
    timm_attn = BottleneckAttn(H * D, feat_size=(h, w), num_heads=H, dim_head=D, scale_pos_embed=True,
                               dtype=torch.float64)
    with torch.no_grad():
        for param, table in zip((timm_attn.pos_embed.height_rel, timm_attn.pos_embed.width_rel),
                                timm_tables(module, h, w), strict=True):
            param.copy_(table)
    x = torch.randn(batch, H * D, h, w, dtype=torch.float64, requires_grad=True)
    target = torch.randn(batch, H * D, h, w, dtype=torch.float64)

    def ours():
        q, k, v = (t.reshape(batch, H, D, h * w).transpose(-1, -2) for t in timm_attn.qkv(x).split(H * D, dim=1))
        out = rpe_attention(q, k, v, rpe_k=module, grid_size=(h, w), scale=timm_attn.scale, backend=backend)
        return out.transpose(-1, -2).reshape(batch, H * D, h, w)

    expected = timm_attn(x)
    x_grad, height_grad, width_grad = torch.autograd.grad(
        (expected * target).sum(), [x, timm_attn.pos_embed.height_rel, timm_attn.pos_embed.width_rel])
    out = ours()
    got = torch.autograd.grad((out * target).sum(), [x, module.rel_rows, module.rel_cols])
    assert (out - expected).abs().max() <= 1e-12
    assert (got[0] - x_grad).abs().max() <= 1e-12
    half = D // 2
    rows_grad, cols_grad = torch.zeros_like(module.rel_rows), torch.zeros_like(module.rel_cols)
    rows_grad[0, :, B13 - (h - 1): B13 + h] = height_grad[:, :half].flip(0).t()  # timm's other halves have no
    cols_grad[0, :, B13 - (w - 1): B13 + w] = width_grad[:, half:].flip(0).t()  # counterpart here
    assert (got[1] - rows_grad).abs().max() <= 1e-12
    assert (got[2] - cols_grad).abs().max() <= 1e-12


def test_preset_is_exact_on_a_14x14_grid_and_backbones() -> None:
    _, module, _ = build_rpe("sasa", 64, 6)
    assert module.rel_rows.shape == (1, 32, 27 + 1)  # offsets -13..13 each exact, plus the skip bucket
    panel = module.describe(14, 14).panels[0][1]
    assert panel.shape == (1, 27, 27)
    check_encoding_everywhere("sasa")


@pytest.mark.slow  # a train.py process: most of this file's time; the backbones above stay in `make test`
def test_trains_from_the_command_line(tmp_path: Path, data_dir: Path) -> None:
    check_trains_from_the_command_line("sasa", tmp_path, data_dir)
