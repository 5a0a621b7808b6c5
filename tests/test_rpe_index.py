"""Hand-worked values of the index functions (docs/design.md, section 1), bucket counts and the cache."""

from __future__ import annotations

import pytest
import torch

import rpe.index as rpe_index
from rpe import RPEConfig, RPEConfigError, build_rpe, rpe_attention
from rpe.index import IndexSpec, bucket_ids, clip_index, num_buckets, piecewise_index, t5_bucket


def _piecewise(x: torch.Tensor, ratio: float) -> list[int]:
    return piecewise_index(x, ratio, 2 * ratio, 8 * ratio).tolist()


def test_piecewise_worked_values():
    x = torch.arange(0, 21)
    assert _piecewise(x, 1.9) == [0, 1, 2, 2] + [3] * 17
    assert _piecewise(x, 2.0) == [0, 1, 2, 2] + [3] * 6 + [4] * 11
    # the magnitude is rounded and clipped, then the sign applied: g(-x) = -g(x)
    assert _piecewise(-x, 1.9) == [-v for v in _piecewise(x, 1.9)]
    assert _piecewise(-x, 2.0) == [-v for v in _piecewise(x, 2.0)]
    # round half to even inside |x| <= alpha
    assert _piecewise(torch.tensor([0.5, 1.5, 2.5, -2.5]), 3.0) == [0, 2, 2, -2]


def test_clip_index():
    assert clip_index(torch.arange(-6, 7), 3.8).tolist() == [-3, -3, -3, -3, -2, -1, 0, 1, 2, 3, 3, 3, 3]


def test_t5_bucket_matches_t5_definition():
    # 32 buckets, max distance 128: 16 per sign; 0..7 exact; log-spaced 8..15; positive offsets +16
    x = torch.tensor([0, 1, 7, 8, 12, 16, 32, 64, 127, 128, 1000, -1, -7, -8, -1000])
    assert t5_bucket(x, 32, 128).tolist() == [0, 17, 23, 24, 25, 26, 28, 30, 31, 31, 31, 1, 7, 8, 15]


@pytest.mark.parametrize("ratio, count", [(1.9, 49), (2.0, 81), (2.5, 121), (3.0, 169)])
def test_product_bucket_counts(ratio, count):
    model_dim = 8
    spec = IndexSpec("product", ratio=ratio)
    assert num_buckets(spec) == count
    for skip in (0, 1, 2):
        _, rpe_k, _ = build_rpe(RPEConfig(ratio=ratio), model_dim, 2)
        assert rpe_k.lookup_table_weight.shape == (1, model_dim, count + 1)  # + the skip bucket
        ids = bucket_ids(spec, 14, 14, skip, "cpu")
        assert ids[skip:, skip:].max().item() < count
        assert (ids[:skip] == count).all() and (ids[:, :skip] == count).all()


@pytest.mark.parametrize(
    "method, ratio, used",
    [("product", 1.9, 50), ("euclidean", 20.0, 20), ("quant", 33.0, 51)],
)
def test_model_zoo_used_bucket_counts(method, ratio, used):
    ids = bucket_ids(IndexSpec(method, ratio=ratio), 14, 14, 1, "cpu")
    assert ids.unique().numel() == used


def test_model_zoo_cross_56_counts_both_tables():
    # cross_56: 27 row offsets + the skip bucket in rp_rows, the same in rp_cols: 28 + 28
    used = [
        bucket_ids(IndexSpec("cross", ratio=20.0, axis=axis), 14, 14, 1, "cpu").unique().numel()
        for axis in (0, 1)
    ]
    assert used == [28, 28]
    assert sum(used) == 56


def test_offsets_are_query_minus_key_and_product_layout():
    # 2x3 grid, no skip; token 5 = cell (1, 2), token 0 = cell (0, 0): offset (1, 2) from 5 to 0
    ids = bucket_ids(IndexSpec("product", ratio=1.9), 2, 3, 0, "cpu")
    B = 3
    assert ids[5, 0].item() == (1 + B) * (2 * B + 1) + (2 + B)
    assert ids[0, 5].item() == (-1 + B) * (2 * B + 1) + (-2 + B)
    assert ids[4, 4].item() == B * (2 * B + 1) + B  # zero offset = centre of the 7x7 table


def test_swin_worked_example():
    M = 3
    ids = bucket_ids(IndexSpec("swin", window=M), M, M, 0, "cpu")
    query, key = 0, 2 * M + 2  # cells (0, 0) and (2, 2): offset (-2, -2)
    assert ids[query, key].item() == 0
    row, col = divmod(ids[query, key].item(), 2 * M - 1)
    assert (row, col) == (0, 0)
    assert ids[key, query].item() == (2 * M - 1) ** 2 - 1  # offset (2, 2): last cell
    assert num_buckets(IndexSpec("swin", window=M)) == 25


def test_skip_tokens_share_one_extra_bucket_and_non_square_grids():
    spec = IndexSpec("product", ratio=1.9)
    ids = bucket_ids(spec, 3, 5, 2, "cpu")
    assert ids.shape == (17, 17)
    assert (ids[:2] == 49).all() and (ids[:, :2] == 49).all()
    assert torch.equal(ids[2:, 2:], bucket_ids(spec, 3, 5, 0, "cpu"))
    assert (ids[2:, 2:] < 49).all()


def test_grid_errors():
    with pytest.raises(ValueError, match="does not fit the swin table of rpe.window=3"):
        bucket_ids(IndexSpec("swin", window=3), 3, 4, 0, "cpu")
    rpe_q, rpe_k, rpe_v = build_rpe(RPEConfig(method="swin", mode="bias", window=4), 8, 2)
    q = torch.randn(1, 2, 26, 8)
    with pytest.raises(ValueError, match="rpe.window=4") as info:
        rpe_attention(q, q, q, rpe_k=rpe_k, grid_size=(5, 5))
    assert "\n" not in str(info.value)


def test_cache_hit_does_not_recompute(monkeypatch):
    rpe_index.clear_bucket_cache()
    calls = []
    original = rpe_index.compute_bucket_ids

    def counting(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(rpe_index, "compute_bucket_ids", counting)
    rpe_q, rpe_k, rpe_v = build_rpe("irpe_qkv", 8, 2)
    q = torch.randn(2, 2, 1 + 12, 8)
    for _ in range(3):
        rpe_attention(q, q, q, rpe_q=rpe_q, rpe_k=rpe_k, rpe_v=rpe_v, grid_size=(3, 4))
    assert len(calls) == 1  # one shape, one index, shared by the three sites and all forwards
    rpe_attention(q[:, :, :12], q[:, :, :12], q[:, :, :12], rpe_k=rpe_k, grid_size=(4, 3))
    assert len(calls) == 2


def test_shape_cache_keeps_the_most_recent_and_modules_drop_theirs_when_moved():
    from rpe.base import ShapeCache

    built = []

    def build(key):
        built.append(key)
        return torch.full((1,), float(key))

    cache = ShapeCache(2)
    for key in (1, 2, 1, 3, 1, 2):  # 3 evicts 2 (1 was used after it); 2 then evicts 3
        assert cache.get(key, lambda k=key: build(k)).item() == key
    assert built == [1, 2, 3, 2] and len(cache) == 2
    cache.resize(1)
    assert len(cache) == 1 and cache.get(2, lambda: build(-1)).item() == 2  # the most recent one stays

    # a module's per-shape table (ALiBi's, via PositionEncoding.cached) is built once per shape and dtype,
    # and again after the module moved
    _, alibi, _ = build_rpe("alibi", 8, 2)
    table = alibi.table(3, 4, torch.device("cpu"), torch.float32)
    assert alibi.table(3, 4, torch.device("cpu"), torch.float32) is table
    assert alibi.table(3, 4, torch.device("cpu"), torch.float64).dtype == torch.float64
    assert len(alibi._shape_cache) == 2
    alibi.to(torch.float64)
    assert len(alibi._shape_cache) == 0
    assert alibi.table(3, 4, torch.device("cpu"), torch.float32) is not table


def test_index_spec_ignores_irrelevant_fields():
    # the table's own fields (mode, sites, heads) are not the index's: one cache entry serves both tables
    bias = IndexSpec.from_config(RPEConfig(mode="bias", on="qk", shared_head=False))
    assert bias == IndexSpec.from_config(RPEConfig()) == IndexSpec("product", "piecewise", ratio=1.9)
    assert IndexSpec.from_config(RPEConfig(method="swin", window=9)) == IndexSpec("swin", window=9)
    with pytest.raises(RPEConfigError, match="rpe.window=3 is not read by rpe.method='product'"):
        RPEConfig(window=3)  # a field the method does not read is refused, not ignored
    with pytest.raises(RPEConfigError):
        RPEConfig(ratio=float("nan"))
