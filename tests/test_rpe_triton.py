"""The fused Triton kernel (``backend="triton"``) against the naive float64 path, on CPU through
Triton's interpreter: forward and the gradients of q, k, v and every table, for each term and
combination (bias shared/per head, contextual Q/K, V), class tokens, key padding masks and dropout.

Triton decides whether a kernel (its own ``tl.zeros`` included) is interpreted when the function is
decorated, i.e. when ``triton`` is first imported; in a normal pytest run other modules (torch's
FlexAttention, Lightning) import it earlier. So unless this process was started with
``TRITON_INTERPRET=1``, one test reruns this file in a child pytest with it set (about 30 s on
one core) and the direct tests are skipped here; nothing leaks into the other tests of the process.
The cases marked slow (single terms that the combinations also hold, more indexes and shapes, the
other dropout and Swin variants) run in a second child under `make slow`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rpe import RPEAttention, RPEConfig, build_rpe, rpe_attention
from rpe.base import LogitPiece
from tests.helpers import cuda_ms_per_step

triton = pytest.importorskip("triton")

B, H, D = 2, 2, 8
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
direct = pytest.mark.skipif(not INTERPRETED, reason="runs in the TRITON_INTERPRET=1 child pytest")


def _child_pytest(markexpr: str, basetemp: Path) -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore::RuntimeWarning",
         f"--basetemp={basetemp}", "-m", markexpr, __file__],
        env=env, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=1200,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, result.stdout[-3000:]


@pytest.mark.skipif(INTERPRETED, reason="already under the interpreter")
@pytest.mark.slow  # several train.py or eval.py processes: make test's 5 minutes
def test_kernels_under_the_interpreter(tmp_path):
    _child_pytest("not slow", tmp_path / "child")


@pytest.mark.slow
@pytest.mark.skipif(INTERPRETED, reason="already under the interpreter")
def test_more_kernels_under_the_interpreter(tmp_path):
    _child_pytest("slow", tmp_path / "child")


@pytest.mark.skipif(INTERPRETED, reason="checked once, in the parent")
def test_rpe_imports_and_fails_in_one_line_without_triton():
    """An install without Triton imports rpe; only backend='triton' then fails, naming the package."""
    script = (
        "import sys; sys.modules['triton'] = None\n"  # makes `import triton` raise ImportError
        "import torch, rpe\n"
        "q = torch.randn(1, 2, 10, 8)\n"
        "rpe_k = rpe.build_rpe(rpe.RPEConfig(on='k'), 8, 2)[1]\n"
        "assert rpe.rpe_attention(q, q, q, rpe_k=rpe_k, grid_size=(3, 3), backend='eager').shape == q.shape\n"
        "try:\n"
        "    rpe.rpe_attention(q, q, q, rpe_k=rpe_k, grid_size=(3, 3), backend='triton')\n"
        "except ValueError as err:\n"
        "    print(err)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[1],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == (
        "rpe.backend='triton' needs the triton package (pip install triton); use backend=auto"
    ), result.stdout


@pytest.mark.skipif(INTERPRETED, reason="compiles the real kernels")
def test_kernels_compile_for_sm90_without_a_gpu():
    """Triton's compiler and its bundled ptxas need no GPU: build every kernel for an H100/H200
    (sm_90) in the configurations DeiT-S uses (iRPE-K with mask and dropout; QKV with narrow one-hot
    and wide atomic reductions), so a kernel that only the interpreter accepts fails here."""
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import rpe.triton_attention as module

    if module.INTERPRETED:
        pytest.skip("rpe.triton_attention was imported under TRITON_INTERPRET")
    pointers = dict(Q="*bf16", K="*bf16", V="*bf16", O="*bf16", DO="*bf16", DQ="*bf16", DK="*bf16", DV="*bf16",
                    RQ="*bf16", RK="*bf16", MASK="*bf16", IDQ="*i32", IDK="*i32", IDV="*i32")
    flags = dict(HAS_MASK=True, DROPOUT=True, ACC=tl.float32, BM=module.BLOCK_M, BN=module.BLOCK_N, BD=64)
    for pq, wq, pk, wk, pv, wv in ((1, 50, 0, 1, 0, 1), (1, 10, 1, 10, 1, 10), (1, 50, 1, 50, 1, 50)):
        sizes = dict(PQ=pq, WQ=wq, PK=pk, WK=wk, PV=pv, WV=wv)
        for kernel, extra in (
            (module._fwd_kernel, dict(WVP=module._next_pow2(wv), ATOMIC_V=pv > 0 and module._atomic(wv))),
            (module._bwd_dkv_kernel, dict(WKP=module._next_pow2(wk), ATOMIC_K=module._atomic(wk))),
            (module._bwd_dq_kernel, dict(WQP=module._next_pow2(wq), ATOMIC_Q=module._atomic(wq))),
        ):
            constants = {name: value for name, value in {**sizes, **flags, **extra}.items() if name in kernel.arg_names}

            def arg_type(name: str, constants: dict = constants) -> str:
                if name in constants:
                    return "constexpr"
                if name in pointers:
                    return pointers[name]
                if name.isupper() and len(name) > 1:  # LSE, PB, DELTA, GQ, ...; H, N, D are sizes
                    return "*fp32"
                return "fp32" if name in ("scale", "dropout_p") else "i32"

            signature = {name: arg_type(name) for name in kernel.arg_names}
            compiled = triton.compile(ASTSource(kernel, signature, constexprs=constants),
                                      target=GPUTarget("cuda", 90, 32), options={"num_warps": module.NUM_WARPS})
            assert "cubin" in compiled.asm, (kernel.__name__, sizes)


@pytest.fixture
def fused():
    """`rpe.triton_attention`, with interpreted kernels."""
    import rpe.triton_attention as module

    assert module.INTERPRETED
    return module


def _sites(config: RPEConfig, skip_bucket: bool = True):
    torch.manual_seed(0)
    sites = build_rpe(config, D, H, skip_bucket=skip_bucket, dtype=torch.float64)
    for module in sites:
        if module is not None:
            for parameter in module.parameters():
                with torch.no_grad():
                    parameter.normal_(0.0, 0.5)  # zero-initialised tables would test nothing
    return sites


def _inputs(n: int, dtype=torch.float64):
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(B, H, n, D, generator=generator, dtype=dtype).requires_grad_() for _ in range(3)]


def _forward_and_grads(sites, q, k, v, grid, backend, **kwargs):
    out = rpe_attention(q, k, v, rpe_q=sites[0], rpe_k=sites[1], rpe_v=sites[2], grid_size=grid,
                        backend=backend, **kwargs)
    tensors = [q, k, v] + [p for m in sites if m is not None for p in m.parameters()]
    weights = torch.linspace(-1.0, 1.0, out.numel(), dtype=out.dtype).view_as(out)  # not a symmetric loss
    grads = torch.autograd.grad((out * weights).sum(), tensors)
    return [out.detach()] + list(grads)


def _assert_matches_naive(config, grid=(5, 7), skip=1, atol=1e-10, skip_bucket=True, **kwargs):
    sites = _sites(config, skip_bucket)
    n = skip + grid[0] * grid[1]
    q, k, v = _inputs(n)
    fused = _forward_and_grads(sites, q, k, v, grid, "triton", **kwargs)
    naive = _forward_and_grads(sites, q, k, v, grid, "naive", **kwargs)
    names = ["out", "dq", "dk", "dv"] + [f"d{name}" for m in sites if m is not None for name, _ in m.named_parameters()]
    assert len(fused) == len(names)
    for name, got, want in zip(names, fused, naive, strict=True):
        assert got.shape == want.shape, name
        assert want.abs().max() > 0, f"{name} is zero: the test would not see a missing term"
        torch.testing.assert_close(got, want, atol=atol, rtol=1e-9, msg=lambda m, name=name: f"{name}: {m}")


# Each term alone and the combinations, on a 5x7 grid plus a class token (n = 36: two partial tiles).
CASES = {
    "plain": RPEConfig(method="none"),
    "bias_k_per_head": RPEConfig(mode="bias", on="k", shared_head=False),
    "bias_k_shared": RPEConfig(mode="bias", on="k", shared_head=True),
    "bias_q": RPEConfig(mode="bias", on="q", shared_head=False),
    "bias_qk": RPEConfig(mode="bias", on="qk", shared_head=False),
    "ctx_k": RPEConfig(on="k"),
    "ctx_q": RPEConfig(on="q", shared_head=False),
    "ctx_qk": RPEConfig(on="qk"),
    "ctx_v": RPEConfig(on="v"),
    "ctx_kv": RPEConfig(on="kv", shared_head=False),
    "ctx_qkv": RPEConfig(on="qkv"),
    # at most 16 buckets per side (clip to +-1: 3x3 + skip): the deterministic one-hot reductions
    "narrow_ctx_qkv": RPEConfig(on="qkv", index="clip", ratio=0.75),
    "narrow_bias_qk": RPEConfig(mode="bias", on="qk", index="clip", ratio=0.75, shared_head=False),
}


# In `make test`: every term within a combination, shared and per-head tables, the one-hot reductions.
FAST_CASES = ("plain", "bias_k_shared", "bias_qk", "ctx_kv", "ctx_qkv", "narrow_ctx_qkv", "narrow_bias_qk")


@direct
@pytest.mark.parametrize("config", [c if name in FAST_CASES else pytest.param(c, marks=pytest.mark.slow)
                                    for name, c in CASES.items()], ids=CASES.keys())
def test_terms_match_naive(config):
    _assert_matches_naive(config)


@direct
def test_key_padding_mask_matches_naive():
    """DETR's mask: bool (B, 1, 1, n), True = attend; here with every term at once."""
    n = 1 + 5 * 7
    attend = torch.ones(B, 1, 1, n, dtype=torch.bool)
    attend[0, ..., -9:] = False
    attend[1, ..., 3:5] = False
    _assert_matches_naive(RPEConfig(on="qkv", shared_head=False), attn_mask=attend)


@direct
def test_fully_masked_query_gives_zeros_and_no_gradient():
    """A query that may attend to nothing: zeros, finite gradients; every other row as the naive path."""
    sites = _sites(RPEConfig(on="qkv"))
    n = 36
    attend = torch.ones(1, 1, n, n, dtype=torch.bool)
    attend[..., 4, :] = False
    q, k, v = _inputs(n)
    out = rpe_attention(q, k, v, rpe_q=sites[0], rpe_k=sites[1], rpe_v=sites[2], grid_size=(5, 7),
                        attn_mask=attend, backend="triton")
    assert (out[:, :, 4] == 0).all()
    grads = torch.autograd.grad(out.sum(), [q, k, v])
    assert all(g.isfinite().all() for g in grads) and (grads[0][:, :, 4] == 0).all()
    rows = torch.ones(n, dtype=torch.bool)
    rows[4] = False
    want = rpe_attention(q, k, v, rpe_q=sites[0], rpe_k=sites[1], rpe_v=sites[2], grid_size=(5, 7),
                         attn_mask=attend | ~rows[:, None], backend="naive")  # row 4 unmasked: finite
    torch.testing.assert_close(out[:, :, rows], want[:, :, rows], atol=1e-10, rtol=1e-9)


@direct
def test_no_skip_tokens_and_float_mask_match_naive():
    """A model without class tokens (tables without the skip bucket) and an additive float mask (B, H, n, n)."""
    n = 6 * 6
    mask = torch.randn(B, H, n, n, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    _assert_matches_naive(RPEConfig(on="qkv"), grid=(6, 6), skip=0, skip_bucket=False, attn_mask=mask)


@direct
def test_two_tables_per_site_and_larger_grid_match_naive():
    """cross keeps a row and a column table per site (two gathered pieces each); n = 71 spans three tiles."""
    _assert_matches_naive(RPEConfig(method="cross", on="qkv", shared_head=False, ratio=20.0), grid=(7, 10))


@direct
def test_float32_matches_naive_float64():
    sites = _sites(RPEConfig(on="qkv", shared_head=False))
    q, k, v = _inputs(36)
    want = _forward_and_grads(sites, q, k, v, (5, 7), "naive")
    sites32 = [None if m is None else m.float() for m in sites]
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    got = _forward_and_grads(sites32, q32, k32, v32, (5, 7), "triton")
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), b, atol=2e-5, rtol=1e-4)


@direct
def test_float16_autocast_error_within_the_eager_path():
    """Half precision under autocast (q, k, v, rows and mask in fp16, fp32 accumulation): the kernel's
    error against float64 is at most twice the eager fp16 path's. (bf16, the GPU's dtype, cannot be
    checked here: Triton 3.8's interpreter multiplies the raw bits in a bf16 `tl.dot`; the CUDA test
    below checks bf16.)"""
    sites = _sites(RPEConfig(on="qkv", shared_head=False))
    q, k, v = _inputs(36)
    exact = _forward_and_grads(sites, q, k, v, (5, 7), "naive")
    sites32 = [None if m is None else m.float() for m in sites]
    errors = {}
    for backend in ("eager", "triton"):
        q16, k16, v16 = (t.detach().half().requires_grad_() for t in (q, k, v))
        with torch.autocast("cpu", dtype=torch.float16):
            result = _forward_and_grads(sites32, q16, k16, v16, (5, 7), backend)
        errors[backend] = [(a.double() - b).abs().max().item() for a, b in zip(result, exact, strict=True)]
    for index, (fused_error, eager_error) in enumerate(zip(errors["triton"], errors["eager"], strict=True)):
        assert fused_error <= 2 * eager_error, (index, fused_error, eager_error)


@direct
@pytest.mark.parametrize("config, grid, skip", [
    (RPEConfig(on="qkv", shared_head=False), (5, 7), 1),
    pytest.param(RPEConfig(on="qkv", index="clip", ratio=0.75), (5, 7), 1,  # narrow tables: one-hot reductions
                 marks=pytest.mark.slow),
    pytest.param(RPEConfig(method="swin", mode="ctx", on="qkv", window=8), (7, 8), 1, marks=pytest.mark.slow),
], ids=["product_qkv", "narrow_qkv", "swin_ctx_qkv"])
def test_dropout_matches_the_same_keep_mask(fused, config, grid, skip):
    """Dropout on the probabilities (before the V term, as the eager path does), rebuilt from the
    kernel's own keep mask with the textbook formula; backward regenerates the same mask."""
    p, (h, w) = 0.3, grid
    n = skip + h * w
    sites = _sites(config)
    q, k, v = _inputs(n)
    torch.manual_seed(7)
    got = _forward_and_grads(sites, q, k, v, grid, "triton", dropout_p=p)
    torch.manual_seed(7)  # the kernel's seed is drawn from torch's RNG
    seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
    keep = fused.dropout_keep_mask(B, H, n, p, seed, "cpu")
    assert abs(keep.double().mean().item() - (1 - p)) < 0.03
    assert not keep.all(dim=(0, 1)).all(), "the mask must differ between heads/batches somewhere"

    def reference(q, k, v, *parameters):
        scale = D**-0.5
        logits = (q * scale) @ k.transpose(-2, -1)
        for site in sites[:2]:
            logits = logits + site.naive_logits(q, k, h, w, skip, scale)
        attn = logits.softmax(-1) * keep / (1 - p)
        return attn @ v + sites[2].naive_value_term(attn, h, w, skip)

    tensors = [q, k, v] + [x for m in sites for x in m.parameters()]
    out = reference(*tensors)
    weights = torch.linspace(-1.0, 1.0, out.numel(), dtype=out.dtype).view_as(out)
    want = [out.detach()] + list(torch.autograd.grad((out * weights).sum(), tensors))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)


@direct
def test_rpe_attention_layer_with_triton_backend():
    """The timm drop-in picks the kernel from ``rpe.backend`` and matches the eager path."""
    torch.manual_seed(0)
    layer = RPEAttention(16, num_heads=2, rpe={"preset": "irpe_qkv", "backend": "triton"}).double()
    for parameter in layer.parameters():
        with torch.no_grad():
            parameter.normal_(0.0, 0.3)
    layer.grid_size = (3, 4)
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    fused_out = layer(x)
    layer.rpe_config = RPEConfig(method="product", mode="ctx", on="qkv", backend="eager")
    torch.testing.assert_close(fused_out, layer(x), atol=1e-10, rtol=1e-9)


@direct
@pytest.mark.parametrize("preset", ["irpe_qkv", pytest.param("swin", marks=pytest.mark.slow)])
def test_swin_shifted_windows_with_triton_backend(preset):
    """A micro Swin (4x4 windows, shifted blocks with their float mask, no class token), with iRPE-QKV
    or Swin's own bias table: logits and every parameter's gradient match the eager path."""
    import dataclasses

    from models import create_model
    from models.swin import RPEWindowAttention

    torch.manual_seed(0)
    model = create_model("swin_micro_patch4_window4_32", rpe={"preset": preset, "backend": "triton"},
                         img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(2,), num_heads=(2,),
                         num_classes=5).double().eval()  # eval: no stochastic depth between the runs
    layers = [m for m in model.modules() if isinstance(m, RPEWindowAttention)]
    assert layers and model.layers[0].blocks[1].attn_mask is not None
    for name, parameter in model.named_parameters():
        if ".rpe_" in name or "relative_position_bias_table" in name:
            with torch.no_grad():
                parameter.normal_(0.0, 0.5)
    images = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    results = []
    for backend in ("triton", "eager"):
        for layer in layers:
            layer.rpe_config = dataclasses.replace(layer.rpe_config, backend=backend)
        model.zero_grad()
        logits = model(images)
        logits.logsumexp(-1).sum().backward()
        results.append([logits.detach()] + [p.grad.clone() for p in model.parameters()])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-7)


@direct
def test_unsupported_inputs_fail_in_one_line(fused, monkeypatch):
    q = torch.randn(1, 2, 10, D, dtype=torch.float64)
    rpe_k = _sites(RPEConfig(on="k"))[1]
    learned = torch.zeros(10, 10, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match="learned attn_mask"):
        rpe_attention(q, q, q, rpe_k=rpe_k, grid_size=(3, 3), attn_mask=learned, backend="triton")
    per_query = torch.zeros(1, 2, 10, 10, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match="dense logit term that varies per query"):
        fused.triton_rpe_attention(q, q, q, [LogitPiece("dense", per_query)], [], None, 0.0, 0.5)
    monkeypatch.setattr(fused, "INTERPRETED", False)
    with pytest.raises(ValueError, match=r"runs on CUDA tensors, got device 'cpu'.*TRITON_INTERPRET=1") as error:
        rpe_attention(q, q, q, rpe_k=rpe_k, grid_size=(3, 3), backend="triton")
    assert "\n" not in str(error.value)
    assert RPEConfig(backend="triton").backend == "triton"


# More indexes, more skip tokens, wider tables (T5's 1025 buckets, a Swin-indexed V table of 225).
MORE_CASES = {
    "bias_qk_shared_cls2": (RPEConfig(mode="bias", on="qk", shared_head=True), (4, 6), 2),
    "euclidean_ctx_qkv": (RPEConfig(method="euclidean", on="qkv", ratio=2.0), (5, 7), 1),
    "t5_bias_qk": (RPEConfig(method="t5", mode="bias", on="qk", shared_head=False), (6, 11), 1),
    "swin_table_qkv": (RPEConfig(method="swin", mode="ctx", on="qkv", shared_head=False, window=8), (7, 8), 0),
    "shaw_clip_kv": (RPEConfig(on="kv", index="clip"), (8, 8), 1),
    "xl_k": (RPEConfig(method="xl"), (5, 6), 1),  # its content bias u.k_j is a dense per-key term
    "cross_ctx_qk_per_head": (RPEConfig(method="cross", on="qk", shared_head=False, ratio=2.0), (5, 13), 1),
}


@direct
@pytest.mark.slow
@pytest.mark.parametrize("config, grid, skip", MORE_CASES.values(), ids=MORE_CASES.keys())
def test_more_indexes_and_shapes_match_naive(config, grid, skip):
    n = skip + grid[0] * grid[1]
    attend = torch.ones(B, 1, 1, n, dtype=torch.bool)
    attend[1, ..., -5:] = False
    _assert_matches_naive(config, grid=grid, skip=skip, skip_bucket=skip > 0, attn_mask=attend)


# ---- CUDA (compiled kernels; skipped without a GPU and inside the interpreter child) ----------------

cuda = pytest.mark.skipif(INTERPRETED or not torch.cuda.is_available(), reason="needs CUDA, compiled Triton")

CUDA_CASES = {
    "irpe_k": RPEConfig(on="k"),
    "irpe_qk": RPEConfig(on="qk"),
    "irpe_qkv": RPEConfig(on="qkv"),
    "bias_k_per_head": RPEConfig(mode="bias", on="k", shared_head=False),
    "cross_qkv": RPEConfig(method="cross", on="qkv", shared_head=False, ratio=20.0),
    "t5_bias_qk": RPEConfig(method="t5", mode="bias", on="qk", shared_head=False),  # atomic reductions
}


def _cuda_run(sites, q, k, v, mask, backend, dtype):
    tensors = [q, k, v] + [p for m in sites if m is not None for p in m.parameters()]
    inputs = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float64):
        out = rpe_attention(*inputs, rpe_q=sites[0], rpe_k=sites[1], rpe_v=sites[2], grid_size=(14, 14),
                            attn_mask=mask, backend=backend)
    weights = torch.linspace(-1.0, 1.0, out.numel(), device="cuda", dtype=torch.float64).view_as(out)
    grads = torch.autograd.grad((out.double() * weights).sum(), inputs + tensors[3:])
    return [out.double()] + [g.double() for g in grads]


@cuda
@pytest.mark.parametrize("config", CUDA_CASES.values(), ids=CUDA_CASES.keys())
def test_cuda_bf16_error_within_the_eager_paths(config):
    """DeiT-S shapes, bf16 autocast, DETR-style key padding: the kernel's error against float64 is
    at most twice (plus a hair) that of the eager bf16 path (the unfused reference kernels)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    B_, H_, n, d = 4, 6, 197, 64
    torch.manual_seed(0)
    sites = build_rpe(config, d, H_, device="cuda", dtype=torch.float64)
    for module in sites:
        if module is not None:
            for parameter in module.parameters():
                with torch.no_grad():
                    parameter.normal_(0.0, 0.5)
    q, k, v = (torch.randn(B_, H_, n, d, device="cuda", dtype=torch.float64) for _ in range(3))
    mask = torch.ones(B_, 1, 1, n, dtype=torch.bool, device="cuda")
    mask[0, ..., -20:] = False
    exact = _cuda_run(sites, q, k, v, mask, "naive", torch.float64)
    sites32 = [None if m is None else m.float() for m in sites]
    eager = _cuda_run(sites32, q, k, v, mask, "eager", torch.bfloat16)
    fused = _cuda_run(sites32, q, k, v, mask, "triton", torch.bfloat16)
    for index, (f, e, x) in enumerate(zip(fused, eager, exact, strict=True)):
        fused_error, eager_error = (f - x).abs().max().item(), (e - x).abs().max().item()
        print(f"ERROR {index} triton {fused_error:.3e} eager {eager_error:.3e}")
        assert fused_error <= 2 * eager_error + 1e-3 * x.abs().max().item(), (index, fused_error, eager_error)


@cuda
def test_cuda_speed_report():
    """DeiT-S shapes under bf16 autocast: forward + backward time of triton vs auto (printed, not asserted)."""
    B_, H_, n, d = 64, 6, 197, 64
    for name, config in (("irpe_k", RPEConfig()), ("irpe_bias_k", RPEConfig(mode="bias", shared_head=False)),
                         ("irpe_qkv", RPEConfig(on="qkv"))):
        sites = build_rpe(config, d, H_, device="cuda")
        q, k, v = (torch.randn(B_, H_, n, d, device="cuda", requires_grad=True) for _ in range(3))
        for backend in ("auto", "triton"):
            def step(b=backend, q=q, k=k, v=v, sites=sites):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    out = rpe_attention(q, k, v, rpe_q=sites[0], rpe_k=sites[1], rpe_v=sites[2],
                                        grid_size=(14, 14), backend=b)
                out.float().sum().backward()

            print(f"SPEED {name:11s} {backend:6s} {cuda_ms_per_step(step):.3f} ms fwd+bwd")
