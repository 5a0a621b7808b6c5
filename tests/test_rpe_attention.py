"""rpe_attention and RPEAttention against a naive float64 formula written straight from the definitions
(docs/design.md, section 1).

The naive side computes every bucket id with Python scalars, materialises ``r_ij`` for every pair
(an ``(Hs, n, n, d)`` tensor: exactly what the library avoids) and applies the modes of docs/design.md,
section 1.3.
"""

from __future__ import annotations

import itertools
import math
import warnings
from functools import partial

import pytest
import torch
from timm.layers import Attention
from timm.models.vision_transformer import Block

import rpe.tables
from rpe import RPEAttention, RPEConfig, build_rpe, rpe_attention

# ----------------------------------------------------------------------------- naive reference


def naive_g(x: float, ratio: float, index: str) -> int:
    alpha, beta, gamma = ratio, 2 * ratio, 8 * ratio
    limit = int(beta)
    if index == "clip":
        return max(-limit, min(limit, round(x)))
    if abs(x) <= alpha:
        return round(x)
    magnitude = min(beta, round(alpha + math.log(abs(x) / alpha) / math.log(gamma / alpha) * (beta - alpha)))
    return int(math.copysign(1, x)) * int(magnitude)


def naive_t5(x: int, num_buckets: int, max_distance: int) -> int:
    half = num_buckets // 2
    exact = half // 2
    offset = half if x > 0 else 0
    x = abs(x)
    if x < exact:
        return offset + x
    return offset + min(
        half - 1, exact + int(math.log(x / exact) / math.log(max_distance / exact) * (half - exact))
    )


SUMS_OF_TWO_SQUARES = sorted({a * a + b * b for a in range(40) for b in range(40)})


def naive_tables(config: RPEConfig, dr: int, dc: int) -> list[int]:
    """Bucket id per table (cross: rows, cols) of offset (dr, dc), no skip."""
    B = int(2 * config.ratio)
    g = partial(naive_g, ratio=config.ratio, index=config.index)
    method = config.method
    if method == "euclidean":
        return [g(round(math.sqrt(dr * dr + dc * dc))) + B]
    if method == "quant":
        return [g(dr * dr + dc * dc) + B]
    if method == "quant_rank":
        return [g(SUMS_OF_TWO_SQUARES.index(dr * dr + dc * dc)) + B]
    if method == "cross":
        return [g(dr) + B, g(dc) + B]
    if method == "product":
        return [(g(dr) + B) * (2 * B + 1) + g(dc) + B]
    if method == "swin":
        M = config.window
        return [(dr + M - 1) * (2 * M - 1) + dc + M - 1]
    if method == "t5":
        nb, md = config.num_buckets, config.max_distance
        return [naive_t5(dr, nb, md) * nb + naive_t5(dc, nb, md)]
    raise AssertionError(method)


def naive_count(config: RPEConfig) -> int:
    B = int(2 * config.ratio)
    return {
        "product": (2 * B + 1) ** 2,
        "swin": (2 * config.window - 1) ** 2,
        "t5": config.num_buckets**2,
    }.get(config.method, 2 * B + 1)


def naive_bucket_matrix(config: RPEConfig, h: int, w: int, skip: int) -> list[torch.Tensor]:
    cells = [None] * skip + [(r, c) for r in range(h) for c in range(w)]
    n = len(cells)
    tables = 2 if config.method == "cross" else 1
    ids = torch.empty(tables, n, n, dtype=torch.long)
    for i, j in itertools.product(range(n), range(n)):
        if cells[i] is None or cells[j] is None:
            ids[:, i, j] = naive_count(config)
        else:
            ids[:, i, j] = torch.tensor(
                naive_tables(config, cells[i][0] - cells[j][0], cells[i][1] - cells[j][1])
            )
    return list(ids)


def table_tensors(module) -> list[torch.Tensor]:
    if module is None:
        return []
    if hasattr(module, "rp_rows"):
        return [module.rp_rows.table, module.rp_cols.table]
    return [module.table]


def naive_attention(q, k, v, config, sites, h, w, skip, attn_mask=None):
    """The modes (docs/design.md, section 1.3) with every r_ij materialised."""
    rpe_q, rpe_k, rpe_v = sites
    H, n, d = q.shape[1], q.shape[2], q.shape[3]
    s = d**-0.5
    ids = naive_bucket_matrix(config, h, w, skip)
    logits = s * torch.einsum("bhid,bhjd->bhij", q, k)
    for site, module in (("q", rpe_q), ("k", rpe_k)):
        for table, table_ids in zip(table_tensors(module), ids if module is not None else [], strict=True):
            pair_ids = table_ids.t() if site == "q" else table_ids  # query site: b(j, i)
            if config.mode == "bias":
                assert table.shape == (1 if config.shared_head else H, naive_count(config) + 1)
                logits = logits + table[:, pair_ids].unsqueeze(0).expand(1, H, n, n)
            else:
                assert table.shape == (1 if config.shared_head else H, d, naive_count(config) + 1)
                r = table.permute(0, 2, 1)[:, pair_ids]  # (Hs, n, n, d): r for every pair
                r = r.expand(H, n, n, d)
                if site == "k":
                    logits = logits + torch.einsum("bhid,hijd->bhij", s * q, r)
                else:
                    logits = logits + torch.einsum("bhjd,hijd->bhij", s * k, r)
    if attn_mask is not None:
        logits = logits.masked_fill(~attn_mask, float("-inf"))
    attn = logits.softmax(-1)
    out = attn @ v
    for table, table_ids in zip(table_tensors(rpe_v), ids if rpe_v is not None else [], strict=True):
        assert table.shape == (1 if config.shared_head else H, naive_count(config) + 1, d)
        r = table[:, table_ids].expand(H, n, n, d)
        out = out + torch.einsum("bhij,hijd->bhid", attn, r)
    return out


# ----------------------------------------------------------------------------- helpers

METHOD_PARAMS = {
    "euclidean": {"ratio": 1.2},
    "quant": {"ratio": 1.9},
    "quant_rank": {"ratio": 1.5},
    "cross": {"ratio": 1.2},
    "product": {"ratio": 1.2},
    "swin": {"window": 5},
    "t5": {"num_buckets": 8, "max_distance": 4},
}
SHAPES = [((3, 5), 0), ((3, 5), 1), ((4, 3), 2), ((2, 2), 1), ((5, 4), 0), ((3, 3), 2)]
BIAS_SITES = ["q", "k", "qk"]
CTX_SITES = ["q", "k", "v", "qk", "kv", "qv", "qkv"]
CASES = [
    (method, mode, on, shared)
    for method in METHOD_PARAMS
    for mode, ons in (("bias", BIAS_SITES), ("ctx", CTX_SITES))
    for on in ons
    for shared in (True, False)
]


def random_sites(config: RPEConfig, head_dim: int, heads: int, seed: int):
    sites = build_rpe(config, head_dim, heads, dtype=torch.float64)
    generator = torch.Generator().manual_seed(seed)
    for module in sites:
        if module is not None:
            for parameter in module.parameters():
                with torch.no_grad():
                    parameter.copy_(
                        torch.randn(parameter.shape, generator=generator, dtype=torch.float64) * 0.5
                    )
    return sites


def qkv_inputs(batch: int, heads: int, n: int, d: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randn(batch, heads, n, d, generator=generator, dtype=torch.float64).requires_grad_()
        for _ in range(3)
    ]


def outputs_and_grads(fn, tensors, weight):
    for t in tensors:
        t.grad = None
    out = fn()
    (out * weight).sum().backward()
    return [out.detach()] + [t.grad.clone() if t.grad is not None else torch.zeros_like(t) for t in tensors]


def assert_all_close(actual, expected, atol=1e-9):
    for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
        torch.testing.assert_close(a, e, atol=atol, rtol=1e-7, msg=lambda m, i=index: f"tensor {i}: {m}")


# ----------------------------------------------------------------------------- parity tests


@pytest.mark.parametrize("method, mode, on, shared", CASES)
def test_matches_naive_formula(method, mode, on, shared, monkeypatch):
    case = CASES.index((method, mode, on, shared))
    (h, w), skip = SHAPES[case % len(SHAPES)]
    index = "clip" if method in ("euclidean", "cross", "product") and case % 3 == 0 else "piecewise"
    config = RPEConfig(
        method=method, mode=mode, on=on, shared_head=shared, index=index, **METHOD_PARAMS[method]
    )
    heads, d, n = 2, 4, skip + h * w
    sites = random_sites(config, d, heads, seed=case)
    q, k, v = qkv_inputs(2, heads, n, d, seed=100 + case)
    tables = [t for module in sites for t in table_tensors(module)]
    tensors = [q, k, v] + tables
    weight = torch.randn(2, heads, n, d, dtype=torch.float64)
    expected = outputs_and_grads(lambda: naive_attention(q, k, v, config, sites, h, w, skip), tensors, weight)
    backends = ["auto", "eager", "naive"] + ([] if "v" in on else ["sdpa"])
    # second pass: the one-hot matrix-product gather/scatter that CUDA uses, forced onto the CPU
    for onehot_devices in ({"cuda"}, {"cuda", "cpu"}):
        monkeypatch.setattr(rpe.tables, "ONEHOT_DEVICES", onehot_devices)
        for backend in backends:
            actual = outputs_and_grads(
                lambda b=backend: rpe_attention(
                    q, k, v, rpe_q=sites[0], rpe_k=sites[1], rpe_v=sites[2], grid_size=(h, w), backend=b
                ),
                tensors,
                weight,
            )
            assert_all_close(actual, expected)
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in tables)


def test_onehot_products_equal_gather_and_scatter_add(monkeypatch):
    """The CUDA path's one-hot products against torch.gather / scatter_add on hand-made ids."""
    generator = torch.Generator().manual_seed(0)
    B, H, n, width = 2, 3, 5, 8
    ids = torch.randint(0, 6, (n, n), generator=generator)
    onehot = torch.nn.functional.one_hot(ids, width).double()
    values = torch.randn(B, H, n, width, generator=generator, dtype=torch.float64)
    expected = torch.gather(values, -1, ids.expand(B, H, n, n))
    torch.testing.assert_close(rpe.tables.onehot_gather(values, onehot), expected, rtol=0, atol=0)
    attn = torch.rand(B, H, n, n, generator=generator, dtype=torch.float64)
    expected = torch.zeros(B, H, n, width, dtype=torch.float64).scatter_add(-1, ids.expand(B, H, n, n), attn)
    torch.testing.assert_close(rpe.tables.onehot_scatter(attn, onehot), expected)

    # the tables take that path on ONEHOT_DEVICES, with the bucket axis padded to a multiple of 8
    _, rpe_k, _ = build_rpe(RPEConfig(), 4, 2)  # product 1.9 at 3x5 + cls: 50 -> 56 columns
    x = torch.randn(1, 2, 16, 4)
    (plain,) = rpe_k.logit_pieces(x, x, 3, 5, 1, 0.5)
    monkeypatch.setattr(rpe.tables, "ONEHOT_DEVICES", {"cpu"})
    (piece,) = rpe_k.logit_pieces(x, x, 3, 5, 1, 0.5)
    assert plain.onehot is None and plain.values.shape[-1] == 50
    assert piece.onehot.shape == (16, 16, 56) and piece.values.shape[-1] == 56
    torch.testing.assert_close(piece.materialize(), plain.materialize())


FLEX_CASES = [
    ("product", "ctx", "qk", True, (3, 5), 1),
    ("cross", "ctx", "k", False, (4, 3), 2),
    ("swin", "bias", "qk", False, (3, 5), 0),
    ("t5", "bias", "q", True, (2, 3), 1),
]


@pytest.mark.parametrize("method, mode, on, shared, grid, skip", FLEX_CASES)
def test_flex_forward_matches_naive(method, mode, on, shared, grid, skip):
    pytest.importorskip("torch.nn.attention.flex_attention", reason="this torch build has no FlexAttention")
    config = RPEConfig(method=method, mode=mode, on=on, shared_head=shared, **METHOD_PARAMS[method])
    (h, w), heads, d = grid, 2, 4
    n = skip + h * w
    sites = random_sites(config, d, heads, seed=7)
    q, k, v = (t.detach() for t in qkv_inputs(2, heads, n, d, seed=8))
    mask = torch.rand(2, 1, n, n, generator=torch.Generator().manual_seed(9)) > 0.3
    mask[..., 0] = True  # no fully masked row
    expected = naive_attention(q, k, v, config, sites, h, w, skip, attn_mask=mask)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()" on CPU
        actual = rpe_attention(
            q,
            k,
            v,
            rpe_q=sites[0],
            rpe_k=sites[1],
            rpe_v=sites[2],
            grid_size=grid,
            attn_mask=mask,
            backend="flex",
        )
    torch.testing.assert_close(actual, expected, atol=1e-9, rtol=1e-7)


def naive_xl(q, k, v, module, h, w, skip):
    H, n, d = q.shape[1], q.shape[2], q.shape[3]
    s = d**-0.5
    F = math.ceil(H * d / 4)
    freqs = [10000.0 ** (-i / F) for i in range(F)]
    cells = [None] * skip + [(r, c) for r in range(h) for c in range(w)]
    W = module.r_proj.weight  # (H d, 4F)
    u, v_bias = module.pos_bias_u, module.pos_bias_v
    rel = torch.zeros(H, n, n, d, dtype=torch.float64)
    for i, j in itertools.product(range(n), range(n)):
        if cells[i] is None or cells[j] is None:
            continue
        dr, dc = cells[i][0] - cells[j][0], cells[i][1] - cells[j][1]
        R = [math.sin(dr * fr) for fr in freqs] + [math.cos(dr * fr) for fr in freqs]
        R += [math.sin(dc * fr) for fr in freqs] + [math.cos(dc * fr) for fr in freqs]
        rel[:, i, j] = (W @ torch.tensor(R, dtype=torch.float64)).view(H, d)
    logits = (
        torch.einsum("bhid,bhjd->bhij", q, k)
        + torch.einsum("bhid,hijd->bhij", q, rel)
        + torch.einsum("hd,bhjd->bhj", u, k).unsqueeze(2)
        + torch.einsum("hd,hijd->hij", v_bias, rel).unsqueeze(0)
    )
    return (s * logits).softmax(-1) @ v


@pytest.mark.parametrize("grid, skip", [((3, 5), 0), ((3, 2), 1), ((2, 2), 2)])
def test_transformer_xl_matches_naive(grid, skip):
    heads, d = 2, 4
    n = skip + grid[0] * grid[1]
    sites = random_sites(RPEConfig(method="xl"), d, heads, seed=3)
    assert sites[0] is None and sites[2] is None
    q, k, v = qkv_inputs(2, heads, n, d, seed=4)
    tensors = [q, k, v] + list(sites[1].parameters())
    weight = torch.randn(2, heads, n, d, dtype=torch.float64)
    expected = outputs_and_grads(lambda: naive_xl(q, k, v, sites[1], *grid, skip), tensors, weight)
    for backend in ("sdpa", "eager"):
        actual = outputs_and_grads(
            lambda b=backend: rpe_attention(q, k, v, rpe_k=sites[1], grid_size=grid, backend=b),
            tensors,
            weight,
        )
        assert_all_close(actual, expected)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()" on CPU
        flex = rpe_attention(
            q.detach(), k.detach(), v.detach(), rpe_k=sites[1], grid_size=grid, backend="flex"
        )
    torch.testing.assert_close(flex, expected[0])


def test_attn_mask_and_dropout_paths():
    config = RPEConfig(on="qkv")
    heads, d, (h, w), skip = 2, 4, (3, 3), 1
    n = skip + h * w
    sites = random_sites(config, d, heads, seed=11)
    q, k, v = (t.detach() for t in qkv_inputs(2, heads, n, d, seed=12))
    keep = torch.ones(2, 1, 1, n, dtype=torch.bool)
    keep[1, ..., -3:] = False  # DETR-style key padding
    expected = naive_attention(q, k, v, config, sites, h, w, skip, attn_mask=keep)
    additive = torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    for mask in (keep, additive):
        actual = rpe_attention(
            q, k, v, rpe_q=sites[0], rpe_k=sites[1], rpe_v=sites[2], grid_size=(h, w), attn_mask=mask
        )
        torch.testing.assert_close(actual, expected)
    # dropout on the probabilities: with p -> 1 nearly everything is dropped, the V term included
    torch.manual_seed(0)
    dropped = rpe_attention(
        q, k, v, rpe_q=sites[0], rpe_k=sites[1], rpe_v=sites[2], grid_size=(h, w), dropout_p=0.999999
    )
    assert dropped.abs().max() < expected.abs().max()


# ----------------------------------------------------------------------------- RPEAttention


def test_rpe_none_equals_timm_attention():
    torch.manual_seed(0)
    timm_attn = Attention(48, num_heads=4, qkv_bias=True).eval()
    ours = RPEAttention(48, num_heads=4, qkv_bias=True, rpe=None).eval()
    ours.load_state_dict(timm_attn.state_dict(), strict=True)
    assert ours.rpe_q is None and ours.rpe_k is None and ours.rpe_v is None
    x = torch.randn(2, 10, 48)
    mask = torch.ones(2, 1, 10, 10, dtype=torch.bool)
    mask[0, ..., 7:] = False
    for attn_mask in (None, mask):
        timm_attn.fused_attn = True
        assert torch.equal(ours(x, attn_mask=attn_mask), timm_attn(x, attn_mask=attn_mask))
        timm_attn.fused_attn = False
        torch.testing.assert_close(ours(x, attn_mask=attn_mask), timm_attn(x, attn_mask=attn_mask))


def test_rpe_attention_in_timm_block_honours_kwargs():
    class BoundRPEAttention(RPEAttention):  # timm 1.0.31's Block wants a class, not a partial
        def __init__(self, *args, **kwargs):
            super().__init__(*args, rpe="irpe_qk", **kwargs)

    block = Block(
        32,
        4,
        qkv_bias=True,
        qk_norm=True,
        scale_attn_norm=True,
        attn_layer=BoundRPEAttention,
        dtype=torch.float64,
    )
    attn = block.attn
    assert isinstance(attn.norm, torch.nn.LayerNorm) and isinstance(attn.q_norm, torch.nn.LayerNorm)
    assert attn.rpe_k.lookup_table_weight.dtype == torch.float64
    attn.grid_size = (2, 3)
    assert block(torch.randn(2, 7, 32, dtype=torch.float64)).shape == (2, 7, 32)
    with pytest.raises(ValueError, match="gated=True"):
        RPEAttention(32, 4, gated=True)
    with pytest.raises(TypeError, match="unsupported argument"):
        RPEAttention(32, 4, rope=True)


def test_with_rpe_matches_functional_and_eager_timm_when_tables_are_zero():
    torch.manual_seed(0)
    ours = RPEAttention(32, num_heads=4, qkv_bias=True, rpe="irpe_qkv").eval()
    timm_attn = Attention(32, num_heads=4, qkv_bias=True).eval()
    missing, unexpected = timm_attn.load_state_dict(ours.state_dict(), strict=False)
    assert not missing and set(unexpected) == {
        "rpe_q.lookup_table_weight",
        "rpe_k.lookup_table_weight",
        "rpe_v.lookup_table_weight",
    }
    ours.grid_size = (3, 3)
    x = torch.randn(2, 10, 32)
    torch.testing.assert_close(ours(x), timm_attn(x))  # zero-initialised tables add nothing


def test_missing_grid_size_is_a_clear_error():
    attn = RPEAttention(32, num_heads=4, rpe="irpe_k")
    with pytest.raises(ValueError, match="grid_size=\\(h, w\\) is required"):
        attn(torch.randn(1, 10, 32))


@pytest.mark.parametrize(
    "rpe, keys",
    [
        ("irpe_k", {"rpe_k.lookup_table_weight": (1, 64, 50)}),
        (
            "irpe_qkv",
            {
                "rpe_q.lookup_table_weight": (1, 64, 50),
                "rpe_k.lookup_table_weight": (1, 64, 50),
                "rpe_v.lookup_table_weight": (1, 50, 64),
            },
        ),
        (
            "irpe_cross_k",
            {
                "rpe_k.rp_rows.lookup_table_weight": (1, 64, 82),
                "rpe_k.rp_cols.lookup_table_weight": (1, 64, 82),
            },
        ),
        ("irpe_bias_k", {"rpe_k.lookup_table_bias": (6, 50)}),
    ],
)
def test_reference_layout_state_dict_loads_strictly(rpe, keys):
    # DeiT-S layout: blocks.{i}.attn.*
    model = torch.nn.Module()
    model.blocks = torch.nn.ModuleList([torch.nn.Module() for _ in range(2)])
    for block in model.blocks:
        block.attn = RPEAttention(384, num_heads=6, qkv_bias=True, rpe=rpe)
    reference = {}
    for i in range(2):
        reference.update(
            {
                f"blocks.{i}.attn.qkv.weight": torch.randn(1152, 384),
                f"blocks.{i}.attn.qkv.bias": torch.randn(1152),
                f"blocks.{i}.attn.proj.weight": torch.randn(384, 384),
                f"blocks.{i}.attn.proj.bias": torch.randn(384),
                **{f"blocks.{i}.attn.{key}": torch.randn(shape) for key, shape in keys.items()},
            }
        )
    model.load_state_dict(reference, strict=True)
    state = model.state_dict()
    for key, value in reference.items():
        assert torch.equal(state[key], value)


def test_table_without_skip_bucket_matches_detr_reference_and_rejects_skip_tokens():
    # DETR reference (no class token): (1, 32, 49) for rpe-1.9-product-ctx-1-k with d = 32
    _, rpe_k, _ = build_rpe("rpe-1.9-product-ctx-1-k", 32, 8, skip_bucket=False)
    assert rpe_k.lookup_table_weight.shape == (1, 32, 49)
    assert build_rpe("rpe-1.9-product-ctx-1-k", 32, 8)[1].lookup_table_weight.shape == (1, 32, 50)
    q = torch.randn(1, 8, 1 + 16, 32)
    with pytest.raises(ValueError, match="skip_bucket=False"):
        rpe_attention(q, q, q, rpe_k=rpe_k, grid_size=(4, 4))
    assert rpe_attention(q[:, :, 1:], q[:, :, 1:], q[:, :, 1:], rpe_k=rpe_k, grid_size=(4, 4)).shape == (1, 8, 16, 32)


def test_initialisation():
    assert (build_rpe("irpe_qkv", 8, 2)[1].lookup_table_weight == 0).all()
    swin_table = build_rpe("swin", 8, 2)[1].lookup_table_bias
    assert swin_table.shape == (2, 27 * 27 + 1)
    assert 0.01 < swin_table.std() < 0.03  # trunc_normal_(std=.02) as in Swin (bounds at +-2, absolute)


# ----------------------------------------------------------------------------- errors


def test_every_encoding_runs_on_the_naive_backend():
    """The naive backend asks each module for its textbook term (it used to reject the XL term)."""
    q = torch.randn(1, 2, 10, 8)
    _, xl_k, _ = build_rpe("xl", 8, 2)
    torch.nn.init.normal_(xl_k.pos_bias_u)
    naive = rpe_attention(q, q, q, rpe_k=xl_k, grid_size=(3, 3), backend="naive")
    assert torch.allclose(naive, rpe_attention(q, q, q, rpe_k=xl_k, grid_size=(3, 3), backend="eager"), atol=1e-6)


def test_clear_errors():
    q = torch.randn(1, 2, 10, 8)
    rpe_q, rpe_k, rpe_v = build_rpe("irpe_qkv", 8, 2)
    errors = [
        (
            lambda: rpe_attention(q, q, q, rpe_k=rpe_k, grid_size=(4, 4)),
            "holds 16 tokens but the sequence has",
        ),
        (lambda: rpe_attention(q, q, q, rpe_k=rpe_k, grid_size=None), "grid_size=(h, w) is required"),
        (lambda: rpe_attention(q, q, q, rpe_v=rpe_v, grid_size=(3, 3), backend="flex"), "cannot add the V"),
        (lambda: rpe_attention(q, q, q, rpe_v=rpe_v, grid_size=(3, 3), backend="sdpa"), "cannot add the V"),
        (lambda: rpe_attention(q, q, q, rpe_k=rpe_k, grid_size=(3, 3), backend="cuda"), "backend='cuda'"),
        (
            lambda: rpe_attention(q, q, q, rpe_k=rpe_k, grid_size=(3, 3), backend="flex", dropout_p=0.1),
            "dropout",
        ),
    ]
    for call, fragment in errors:
        with pytest.raises(ValueError) as info:
            call()
        assert fragment in str(info.value) and "\n" not in str(info.value)


def test_flex_on_cpu_evaluates_but_refuses_to_train_in_one_line():
    """Probe case 107: torch's own refusal of a CPU backward was a NotImplementedError traceback; the rule is
    `rpe.config.BACKEND_DEVICES`', which the run's pre-run check reads too."""
    q = torch.randn(1, 2, 10, 8)
    _, rpe_k, _ = build_rpe("irpe_k", 8, 2)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()" on CPU
        forward = rpe_attention(q, q, q, rpe_k=rpe_k, grid_size=(3, 3), backend="flex")
    torch.testing.assert_close(forward, rpe_attention(q, q, q, rpe_k=rpe_k, grid_size=(3, 3), backend="eager"))
    trained = q.clone().requires_grad_()
    with pytest.raises(ValueError) as info:
        rpe_attention(trained, trained, trained, rpe_k=rpe_k, grid_size=(3, 3), backend="flex")
    assert str(info.value) == (
        "rpe.backend=flex cannot train on cpu tensors: torch's FlexAttention trains on cuda only (it has no backward"
        " pass on CPU or MPS); valid backends to train on cpu: auto, sdpa, eager, naive")
