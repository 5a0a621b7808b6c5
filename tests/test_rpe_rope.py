"""2-D RoPE (axial and mixed) against a naive float64 rotation written from the formula, its
offset invariance, skip tokens, the fused kernel, the backbones and a short command-line training.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from rpe import RPEConfig, build_rpe, rpe_attention
from tests.helpers import SMALL_RELATIONAL, run_cli

H, D = 2, 8  # heads, head dim


def naive_angles(module, r: int, c: int) -> torch.Tensor:
    """``(H, d/2)`` rotation angle of each channel pair of a token at cell (r, c), from the formula."""
    pairs = D // 2
    if module.mixed:
        fx, fy = module.rope.freqs.detach()[0, 0].double(), module.rope.freqs.detach()[1, 0].double()
        return fx * r + fy * c  # learned per head: phi = fx r + fy c
    quarter = D // 4
    freq = [module.theta ** (-p / quarter) for p in range(quarter)]
    angles = [r * f for f in freq] + [c * f for f in freq]  # first half of the pairs: row; second: column
    return torch.tensor(angles, dtype=torch.float64).expand(H, pairs)


def naive_rotate(x: torch.Tensor, module, h: int, w: int, skip: int) -> torch.Tensor:
    """Rotate each channel pair (x_2p, x_2p+1) of every grid token by its angle; skip tokens unchanged."""
    out = x.clone()
    for i in range(h * w):
        r, c = divmod(i, w)
        angle = naive_angles(module, r, c)  # (H, d/2)
        if module.mixed:
            angle = module.rope.freqs[0, 0].double() * r + module.rope.freqs[1, 0].double() * c  # keeps grad
        cos, sin = angle.cos(), angle.sin()
        even, odd = x[:, :, skip + i, 0::2], x[:, :, skip + i, 1::2]
        rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)
        out[:, :, skip + i] = rotated
    return out


def naive_attention(q, k, v, module, h, w, skip):
    q, k = naive_rotate(q, module, h, w, skip), naive_rotate(k, module, h, w, skip)
    return ((q @ k.transpose(-1, -2)) / math.sqrt(D)).softmax(-1) @ v


@pytest.mark.parametrize("method", ["rope_axial", "rope_mixed"])
def test_matches_naive_formula_forward_and_gradients(method: str) -> None:
    """Non-square 3x5 grid with a class token, float64, every backend; gradients of q, k, v (and freqs)."""
    h, w, skip = 3, 5, 1
    _, module, _ = build_rpe(method, D, H, dtype=torch.float64)
    module = module.double()
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, H, skip + h * w, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    params = [q, k, v, *module.parameters()]
    weight = torch.randn(2, H, skip + h * w, D, dtype=torch.float64)

    def run(fn):
        out = fn()
        grads = torch.autograd.grad((out * weight).sum(), params)
        return out.detach(), grads

    expected, expected_grads = run(lambda: naive_attention(q, k, v, module, h, w, skip))
    tol = 1e-6  # timm keeps the frequency bands (and the mixed angles) in float32
    for backend in ("auto", "sdpa", "eager", "naive"):
        out, grads = run(lambda b=backend: rpe_attention(q, k, v, rpe_k=module, grid_size=(h, w), backend=b))
        assert torch.allclose(out, expected, atol=tol), backend
        for got, want in zip(grads, expected_grads, strict=True):
            assert torch.allclose(got, want, atol=tol * 10), (backend, (got - want).abs().max())


@pytest.mark.parametrize("method", ["rope_axial", "rope_mixed"])
def test_logits_depend_only_on_offsets(method: str) -> None:
    """Equal content on every token: shifting both tokens of a pair on the grid leaves its logit unchanged,
    and different offsets give different logits (the rotation does encode position)."""
    h, w = 4, 6
    _, module, _ = build_rpe(method, D, H)
    torch.manual_seed(1)
    q = torch.randn(1, H, 1, D).expand(1, H, h * w, D)
    k = torch.randn(1, H, 1, D).expand(1, H, h * w, D)
    rq, rk = module.rotate(q, k, h, w, 0)
    logits = (rq @ rk.transpose(-1, -2))[0]  # (H, n, n)

    def cell(r, c):
        return r * w + c

    for (r1, c1), (r2, c2) in [((0, 0), (1, 2)), ((2, 5), (0, 1)), ((1, 1), (1, 1)), ((3, 0), (0, 4))]:
        for sr, sc in [(0, 0), (0, 1), (1, 0)]:
            if max(r1, r2) + sr < h and max(c1, c2) + sc < w:
                shifted = logits[:, cell(r1 + sr, c1 + sc), cell(r2 + sr, c2 + sc)]
                assert torch.allclose(shifted, logits[:, cell(r1, c1), cell(r2, c2)], atol=1e-5)
    assert not torch.allclose(logits[:, cell(0, 0), cell(0, 1)], logits[:, cell(0, 0), cell(1, 0)])


def test_skip_tokens_are_not_rotated_and_sdpa_stays_fused(monkeypatch: pytest.MonkeyPatch) -> None:
    _, module, _ = build_rpe("rope_axial", D, H)
    q = torch.randn(2, H, 2 + 12, D, requires_grad=True)
    rq, rk = module.rotate(q, q, 3, 4, 2)
    assert torch.equal(rq[:, :, :2], q[:, :, :2]) and not torch.allclose(rq[:, :, 2:], q[:, :, 2:])
    masks = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        masks.append(kwargs.get("attn_mask"))
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    rpe_attention(q, q, q, rpe_k=module, grid_size=(3, 4)).sum().backward()  # CPU, with gradients
    assert masks == [None]  # no score bias: the fused kernel of plain attention


def test_deit_token_order_matches_the_rotation_axes() -> None:
    """In the micro DeiT, the token of image patch (row 2, col 5) turns by 2 f_p on the row pairs and 5 f_p on
    the column pairs (theta 100, d/4 = 8 bands: f_p = 100^(-p/8)), and the class token not at all; so timm's
    row-major patch order and the module's (row, col) grid agree."""
    from models import create_model

    net = create_model("deit_micro_patch4_32", rpe="rope_axial", num_classes=4)
    image = torch.zeros(1, 3, 32, 32)
    image[..., 8:12, 20:24] = 1.0  # pixel rows 8-11, cols 20-23: patch (2, 5)
    tokens = net.patch_embed(image)[0]
    moved = (tokens - tokens[0]).abs().sum(-1).nonzero().flatten().tolist()
    assert moved == [2 * 8 + 5]
    rope = net.blocks[0].attn.rpe_k
    x = torch.zeros(1, 4, 1 + 64, 32)
    x[..., 0::2] = 1.0  # every pair at angle 0
    rotated, _ = rope.rotate(x, x, 8, 8, 1)
    cos, sin = rotated[0, 0, :, 0::2], rotated[0, 0, :, 1::2]  # (65, 16): cos, sin of each pair's angle
    bands = torch.tensor([100.0 ** (-p / 8) for p in range(8)])
    expected = torch.cat([2 * bands, 5 * bands])
    assert torch.allclose(cos[1 + moved[0]], expected.cos(), atol=1e-5)
    assert torch.allclose(sin[1 + moved[0]], expected.sin(), atol=1e-5)
    assert torch.equal(cos[0], torch.ones(16)) and torch.equal(sin[0], torch.zeros(16))


@pytest.mark.parametrize("method", ["rope_axial", "rope_mixed"])
def test_class_token_attends_like_a_token_at_the_corner(method: str) -> None:
    """An unrotated class token is the identity rotation, i.e. the rotation of cell (0, 0): its logit with a
    patch at (r, c) equals that of the same content placed at the corner, a function of the patch's absolute
    cell. (With an absolute table this biases what the class token reads; docs/design.md, RoPE section.)"""
    h, w = 4, 5
    _, module, _ = build_rpe(method, D, H)
    torch.manual_seed(2)
    cls_q, key = torch.randn(1, H, 1, D), torch.randn(1, H, 1, D)
    q = torch.cat([cls_q, cls_q.expand(1, H, h * w, D)], dim=2)  # the class query, and the same query on every cell
    k = torch.cat([key, key.expand(1, H, h * w, D)], dim=2)
    rq, rk = module.rotate(q, k, h, w, 1)
    logits = (rq @ rk.transpose(-1, -2))[0]  # (H, 1 + hw, 1 + hw)
    assert torch.allclose(logits[:, 0, 1:], logits[:, 1, 1:], atol=1e-5)  # class row == row of cell (0, 0)
    assert not torch.allclose(logits[:, 0, 1], logits[:, 0, 1 + 2 * w + 3], atol=1e-3)  # depends on the cell


def test_describe_is_one_at_offset_zero_and_config_names() -> None:
    _, module, _ = build_rpe("rope_mixed", D, H)
    panels = module.describe(3, 4).panels
    assert panels[0][1].shape == (H, 5, 7)
    assert torch.allclose(panels[0][1][:, 2, 3], torch.ones(H))
    assert RPEConfig(method="rope_axial").shorthand() == "rope_axial"
    with pytest.raises(ValueError, match="head dim divisible by 4"):
        build_rpe("rope_axial", 6, 2)


@pytest.mark.parametrize("method", ["rope_axial", "rope_mixed"])
def test_backbones(method: str) -> None:
    """DeiT (class token), Swin windows and DETR's encoder train a step; DETR's Xavier init keeps the
    frequencies; mixed frequencies are out of weight decay."""
    from models import create_model
    from models.detr import Transformer

    for name in ("deit_micro_patch4_32", "swin_micro_patch4_window4_32"):
        net = create_model(name, rpe=method, num_classes=4)
        net(torch.randn(2, 3, 32, 32)).sum().backward()
        assert any("rope.freqs" in n for n in net.no_weight_decay()) == (method == "rope_mixed")
    detr = Transformer(dim=32, heads=2, enc_layers=1, dec_layers=1, ffn=32, enc_rpe=method)
    memory = detr.encode(torch.randn(2, 32, 3, 5), torch.zeros(2, 3, 5, dtype=torch.bool), torch.randn(2, 32, 3, 5))
    memory.sum().backward()
    rope = detr.encoder[0].self_attn.rpe_k
    if method == "rope_mixed":
        magnitude = rope.rope.freqs[:, 0].norm(dim=0)  # (H, d/2): |(fx, fy)| = theta^(-4p/d), untouched by Xavier
        head_dim = 16
        expected = torch.tensor([10.0 ** (-4 * (p % (head_dim // 4)) / head_dim) for p in range(head_dim // 2)])
        assert torch.allclose(magnitude, expected.expand_as(magnitude), atol=1e-5)


@pytest.mark.slow  # a train.py sweep of two jobs; test_backbones (forward and backward) stays in `make test`
def test_trains_from_the_command_line(tmp_path: Path, data_dir: Path) -> None:
    result = run_cli("train.py", [
        "-m", "rpe=rope_axial,rope_mixed", "debug=fast", "logger=csv", *SMALL_RELATIONAL,
        "trainer.limit_train_batches=3", "trainer.limit_val_batches=1", f"hydra.sweep.dir={tmp_path}",
        f"paths.data_dir={data_dir}",
    ])
    assert result.returncode == 0, result.stderr[-3000:]
    for job in (0, 1):
        assert '"global_step": 3' in (tmp_path / str(job) / "metrics.json").read_text().replace(": 3.0", ": 3")
