"""CUDA checks of the backends (skipped without a GPU): compiled FlexAttention forward and backward,
SDPA's float-mask gradients and the naive per-pair formula, against the eager path. Prints the
backends' speed (no assertions on it).
"""

from __future__ import annotations

import pytest
import torch

from rpe import RPEConfig, build_rpe, rpe_attention
from tests.helpers import cuda_ms_per_step

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CASES = [
    RPEConfig(on="qk"),
    RPEConfig(method="cross", on="k", shared_head=False, ratio=20.0),
    RPEConfig(method="swin", mode="bias", on="qk", shared_head=False, window=14),
    RPEConfig(method="xl"),
    RPEConfig(on="qkv"),
]


def _sites(config: RPEConfig, d: int, heads: int):
    torch.manual_seed(0)
    sites = build_rpe(config, d, heads, device="cuda")
    for module in sites:
        if module is not None:
            for parameter in module.parameters():
                with torch.no_grad():
                    parameter.normal_(0.0, 0.5)
    return sites


def _run(q, k, v, sites, backend, mask):
    tensors = [q, k, v] + [p for m in sites if m is not None for p in m.parameters()]
    for t in tensors:
        t.grad = None
    out = rpe_attention(
        q,
        k,
        v,
        rpe_q=sites[0],
        rpe_k=sites[1],
        rpe_v=sites[2],
        grid_size=(14, 14),
        attn_mask=mask,
        backend=backend,
    )
    out.square().mean().backward()
    return [out.detach()] + [t.grad.clone() for t in tensors]


@pytest.mark.parametrize("config", CASES, ids=lambda c: c.shorthand() if c.method != "xl" else "xl")
def test_cuda_backends_agree(config):
    torch.backends.cuda.matmul.allow_tf32 = False
    B, H, n, d = 4, 6, 197, 64
    sites = _sites(config, d, H)
    q, k, v = (torch.randn(B, H, n, d, device="cuda", requires_grad=True) for _ in range(3))
    mask = torch.ones(B, 1, 1, n, dtype=torch.bool, device="cuda")
    mask[0, ..., -20:] = False
    expected = _run(q, k, v, sites, "eager", mask)
    backends = ["sdpa", "flex"] if sites[2] is None else ["auto"]
    if config.method != "xl":  # naive builds every pair's encoding: independent of the bucket-row path
        backends.append("naive")
    for backend in backends:
        actual = _run(q, k, v, sites, backend, mask)
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            torch.testing.assert_close(
                a, e, atol=2e-4, rtol=2e-3, msg=lambda m, i=index, b=backend: f"{b} {i}: {m}"
            )


def test_cuda_speed_report():
    """DeiT-S shapes under bf16 autocast: forward + backward time of each backend (printed)."""
    B, H, n, d = 64, 6, 197, 64
    for name, config in (
        ("none", None),
        ("irpe_k", RPEConfig()),
        ("irpe_qk", RPEConfig(on="qk")),
        ("irpe_qkv", RPEConfig(on="qkv")),
    ):
        sites = _sites(config, d, H) if config else (None, None, None)
        q, k, v = (torch.randn(B, H, n, d, device="cuda", requires_grad=True) for _ in range(3))
        for backend in ("sdpa", "eager", "flex"):
            if sites[2] is not None and backend != "eager":
                continue

            def step(b=backend, q=q, k=k, v=v, sites=sites):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    out = rpe_attention(
                        q, k, v, rpe_q=sites[0], rpe_k=sites[1], rpe_v=sites[2], grid_size=(14, 14), backend=b
                    )
                out.float().sum().backward()

            print(f"SPEED {name:9s} {backend:6s} {cuda_ms_per_step(step):.3f} ms fwd+bwd")
