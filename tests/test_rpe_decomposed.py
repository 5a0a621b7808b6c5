"""The decomposed relative position (MViTv2, SAM): against timm's SAM and MViTv2 code with the same tables, against
a naive float64 formula with the interpolation written out; gradients; backbones; training."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch
from timm.models.mvitv2 import cal_rel_pos_type
from timm.models.vision_transformer_sam import Attention as SamAttention
from timm.models.vision_transformer_sam import get_decomposed_rel_pos_bias, get_rel_pos

from rpe import RPEAttention, build_rpe, rpe_attention
from rpe.base import materialize_pieces
from rpe.encodings.decomposed import relative_embeddings
from tests.helpers import check_encoding_everywhere, check_trains_from_the_command_line

H, D = 2, 8
M = 6  # the side the tables of the timm comparisons are made for
TRAINING_GRID, LARGER_GRID = (M, M), (9, 11)


def _module(window: int = M, shared_head: bool = True, dtype: torch.dtype = torch.float32, heads: int = H):
    torch.manual_seed(0)
    _, module, _ = build_rpe({"preset": "decomposed", "window": window, "shared_head": shared_head}, D, heads,
                             dtype=dtype)
    with torch.no_grad():  # zero-init tables would compare nothing
        module.rel_pos_h.normal_()
        module.rel_pos_w.normal_()
    return module


def _term(module, q: torch.Tensor, h: int, w: int, skip: int) -> torch.Tensor:
    """The encoding's logit term ``(B, H, n, n)`` as attention adds it (its factorised pieces, summed)."""
    scale = q.shape[-1] ** -0.5
    return materialize_pieces(module.logit_pieces(q * scale, None, h, w, skip, scale))


@pytest.mark.parametrize("grid", [TRAINING_GRID, LARGER_GRID], ids=["training_grid", "larger_grid"])
def test_matches_timm_get_decomposed_rel_pos_bias(grid: tuple[int, int]) -> None:
    """timm's SAM bias from the same (shared) tables and q: exact offsets on the M x M grid, the tables linearly
    interpolated on the 9 x 11 one (both axes resized, to different lengths)."""
    module = _module()
    h, w = grid
    q = torch.randn(2, H, h * w, D)
    expected = get_decomposed_rel_pos_bias(q.reshape(2 * H, h * w, D), module.rel_pos_h[0], module.rel_pos_w[0],
                                           (h, w), (h, w)).reshape(2, H, h * w, h * w)
    assert (_term(module, q, h, w, 0) - expected).abs().max() <= 1e-5
    assert (module.naive_logits(q, q, h, w, 0, D**-0.5) - expected).abs().max() <= 1e-5  # the naive backend's path


@pytest.mark.parametrize(("q_size", "k_size"), [(5, 5), (3, 7), (7, 3), (9, 4)])
def test_relative_embeddings_match_timm_get_rel_pos(q_size: int, k_size: int) -> None:
    """Resizing and, where query and key sizes differ, the coordinate scaling of timm's ``get_rel_pos``."""
    table = _module().rel_pos_h
    assert torch.equal(relative_embeddings(q_size, k_size, table)[0], get_rel_pos(q_size, k_size, table[0]))


@pytest.mark.parametrize("grid", [TRAINING_GRID, LARGER_GRID], ids=["training_grid", "larger_grid"])
def test_matches_timm_sam_attention(grid: tuple[int, int]) -> None:
    """timm's SAM ``Attention(use_rel_pos=True)`` and `RPEAttention` with the same weights and tables."""
    dim, heads = 16, 2
    torch.manual_seed(0)
    sam = SamAttention(dim, heads, qkv_bias=True, use_rel_pos=True, input_size=(M, M)).eval()
    with torch.no_grad():
        sam.rel_pos_h.normal_()
        sam.rel_pos_w.normal_()
    ours = RPEAttention(dim, heads, qkv_bias=True, rpe={"preset": "decomposed", "window": M}).eval()
    state = {k: v for k, v in sam.state_dict().items() if not k.startswith("rel_pos")}
    state |= {"rpe_k.rel_pos_h": sam.rel_pos_h[None], "rpe_k.rel_pos_w": sam.rel_pos_w[None]}
    ours.load_state_dict(state, strict=True)
    h, w = grid
    ours.grid_size = (h, w)
    x = torch.randn(2, h, w, dim)
    with torch.no_grad():
        diff = (ours(x.reshape(2, h * w, dim)).reshape(2, h, w, dim) - sam(x)).abs().max()
    assert diff <= 1e-5


def test_class_token_matches_timm_mvitv2() -> None:
    """MViTv2's ``cal_rel_pos_type`` with a class token: the token's pairs get no term."""
    module = _module()
    q = torch.randn(2, H, 1 + M * M, D)
    expected = cal_rel_pos_type(torch.zeros(2, H, 1 + M * M, 1 + M * M), q, True, [M, M], [M, M],
                                module.rel_pos_h[0], module.rel_pos_w[0])
    term = _term(module, q, M, M, 1)
    assert (term - expected).abs().max() <= 1e-5
    assert not term[:, :, 0].any() and not term[:, :, :, 0].any()


def _linear(table: torch.Tensor, length: int) -> list[torch.Tensor]:
    """``table`` ``(L, d)`` resampled to ``length`` rows: linear, half-pixel centres, clamped at the ends."""
    size = table.shape[0]
    rows = []
    for k in range(length):
        x = max((k + 0.5) * size / length - 0.5, 0.0)
        lo = int(math.floor(x))
        hi = min(lo + 1, size - 1)
        rows.append((1 - (x - lo)) * table[lo] + (x - lo) * table[hi])
    return rows


def naive_attention(q, k, v, rel_h, rel_w, h, w, skip):
    """e_ij = q_i.k_j / sqrt(d) + q_i.(R_h[dr + h-1] + R_w[dc + w-1]), per head; skip pairs: no term."""
    n = skip + h * w
    logits = (q @ k.transpose(-1, -2) / math.sqrt(D)).clone()
    for head in range(H):
        rows, cols = _linear(rel_h[head], 2 * h - 1), _linear(rel_w[head], 2 * w - 1)
        for i in range(skip, n):
            for j in range(skip, n):
                (ri, ci), (rj, cj) = divmod(i - skip, w), divmod(j - skip, w)
                r = rows[ri - rj + h - 1] + cols[ci - cj + w - 1]
                logits[:, head, i, j] = logits[:, head, i, j] + q[:, head, i] @ r
    return logits.softmax(-1) @ v


def test_matches_naive_formula_forward_and_gradients() -> None:
    """Per-head tables of a 3x3 window on a 3x4 grid with a class token: rows read as stored, columns
    interpolated (5 -> 7 entries)."""
    h, w, skip = 3, 4, 1
    module = _module(window=3, shared_head=False, dtype=torch.float64)
    assert module.rel_pos_h.shape == (H, 5, D)
    q, k, v = (torch.randn(2, H, skip + h * w, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    params = [q, k, v, module.rel_pos_h, module.rel_pos_w]
    weight = torch.randn(2, H, skip + h * w, D, dtype=torch.float64)

    def run(fn):
        out = fn()
        return out.detach(), torch.autograd.grad((out * weight).sum(), params)

    expected, expected_grads = run(lambda: naive_attention(q, k, v, module.rel_pos_h, module.rel_pos_w, h, w, skip))
    for backend in ("auto", "sdpa", "eager", "naive"):
        out, grads = run(lambda b=backend: rpe_attention(q, k, v, rpe_k=module, grid_size=(h, w), backend=b))
        assert torch.allclose(out, expected, atol=1e-10), backend
        for got, want in zip(grads, expected_grads, strict=True):
            assert torch.allclose(got, want, atol=1e-9), backend
    pytest.importorskip("torch.nn.attention.flex_attention", reason="this torch build has no FlexAttention")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()" on CPU
        out = rpe_attention(q.detach(), k.detach(), v.detach(), rpe_k=module, grid_size=(h, w), backend="flex")
    assert torch.allclose(out, expected, atol=1e-10)


@pytest.mark.parametrize("grid", [TRAINING_GRID, LARGER_GRID], ids=["training_grid", "larger_grid"])
def test_gradients_reach_every_table_entry_from_zero_init(grid: tuple[int, int]) -> None:
    """Zero-initialised (SAM's init) and still trained: every entry of both tables gets a gradient, on the
    grid the tables are made for and through the interpolation onto a larger one."""
    torch.manual_seed(0)
    attn = RPEAttention(16, 2, rpe={"preset": "decomposed", "window": M})
    module = attn.rpe_k
    assert not module.rel_pos_h.any() and not module.rel_pos_w.any()
    attn.grid_size = grid
    out = attn(torch.randn(2, 1 + grid[0] * grid[1], 16))  # with a class token
    (out * torch.randn_like(out)).sum().backward()
    for table in (module.rel_pos_h, module.rel_pos_w):
        assert torch.isfinite(table.grad).all() and (table.grad.abs().sum(-1) > 0).all()


def test_preset_shapes_panel_and_backbones() -> None:
    """Shared tables of a 14x14 grid in the preset; Swin's are made for its window; DeiT, Swin and DETR train."""
    from models import create_model

    _, module, _ = build_rpe("decomposed", 64, 6)
    assert module.rel_pos_h.shape == module.rel_pos_w.shape == (1, 27, 64)
    assert module.describe(8, 5).panels[0][1].shape == (1, 15, 9)
    swin = create_model("swin_micro_patch4_window4_32", rpe="decomposed", num_classes=4)
    tables = [m.rpe_k.rel_pos_h for m in swin.modules() if hasattr(m, "rpe_k") and m.rpe_k is not None]
    assert tables and all(t.shape[1] == 2 * 4 - 1 for t in tables)
    check_encoding_everywhere("decomposed")


@pytest.mark.slow  # a train.py process: most of this file's time; the backbones above stay in `make test`
def test_trains_from_the_command_line(tmp_path: Path, data_dir: Path) -> None:
    check_trains_from_the_command_line("decomposed", tmp_path, data_dir)
