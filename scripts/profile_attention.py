"""Where the time of one contextual-K attention layer goes, piece by piece (fwd + bwd, median ms).

    python scripts/profile_attention.py                       # CUDA, bf16, DeiT-S shapes at batch 128
    python scripts/profile_attention.py --device cpu --batch 8 --dtype float32

Times the attention kernel alone (flash, memory-efficient with a bias leaf, explicit softmax) and the
pieces of the contextual-K bias ``e_ij += (s q_i).r_b(i,j)`` (bucket rows, then the per-query gather
as torch.gather or as a one-hot batched matmul), and whole `rpe_attention` calls on each path. Every
whole call's output and gradients are first checked against the eager gather path.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rpe.tables  # noqa: E402
from rpe import RPEConfig, build_rpe, rpe_attention  # noqa: E402
from rpe.index import bucket_onehot  # noqa: E402
from rpe.tables import bucket_rows, onehot_gather  # noqa: E402


def gather_bias(rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    B, H, n, _ = rows.shape
    return torch.gather(rows, -1, ids.expand(B, H, n, n))


def eager_attention(q, k, v, bias, scale):
    logits = (q * scale) @ k.transpose(-2, -1) + bias
    return logits.softmax(-1) @ v


def with_onehot_devices(devices: set[str], fn: Callable[[], list[torch.Tensor]]) -> Callable[[], list[torch.Tensor]]:
    """``fn`` run with `rpe.tables.ONEHOT_DEVICES` set to ``devices`` (gather path vs one-hot path)."""
    def run():
        saved = rpe.tables.ONEHOT_DEVICES
        rpe.tables.ONEHOT_DEVICES = devices
        try:
            return fn()
        finally:
            rpe.tables.ONEHOT_DEVICES = saved
    return run


def flex_variants(q, k, v, table, ids, onehot, scale) -> dict[str, Callable[[], list[torch.Tensor]]]:
    """Compiled FlexAttention formulations of the contextual-K term, for the next kernel decision.

    The current flex backend captures the bucket rows ``(B, H, n, nb')`` and gathers inside the
    kernel; its gradient for them goes through atomics. These try smaller tiles, and a dense
    ``(B, H, n, n)`` bias built outside (one gradient write per element, no contention).
    """
    from torch.nn.attention.flex_attention import flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    small_tiles = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32}

    def rows_kernel(options=None):
        def run():
            rows = bucket_rows(q * scale, table, onehot.shape[-1])

            def score_mod(score, b, h, q_idx, kv_idx):
                return score + rows[b, h, q_idx, ids[q_idx, kv_idx]]
            return [flex(q, k, v, score_mod=score_mod, scale=scale, kernel_options=options)]
        return run

    def dense_bias():
        bias = onehot_gather(bucket_rows(q * scale, table, onehot.shape[-1]), onehot)

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + bias[b, h, q_idx, kv_idx]
        return [flex(q, k, v, score_mod=score_mod, scale=scale)]

    return {
        "kernel: flex, no relative term": lambda: [flex(q, k, v, scale=scale)],
        "kernel: flex, no relative term, small tiles": lambda: [flex(q, k, v, scale=scale, kernel_options=small_tiles)],
        "rpe_attention-like flex, rows captured": rows_kernel(),
        "rpe_attention-like flex, rows, small tiles": rows_kernel(small_tiles),
        "rpe_attention-like flex, dense bias captured": dense_bias,
    }


def timed(fn: Callable[[], list[torch.Tensor]], device: torch.device, reps: int, warmup: int) -> float:
    def once():
        outs = fn()
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

    for _ in range(warmup):
        once()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        once()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float64"])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    for name, least in (("batch", 1), ("reps", 1), ("warmup", 0)):
        if getattr(args, name) < least:
            parser.exit(2, f"error: --{name} {getattr(args, name)} is out of range; valid: an integer >= {least}\n")
    from scripts.benchmark import available_devices

    if args.device not in available_devices():
        parser.exit(2, f"error: --device {args.device!r} is not available on this machine; valid:"
                       f" {', '.join(available_devices())}\n")
    from lifecycle.signals import exit_when_interrupted

    with exit_when_interrupted("profile_attention.py", "nothing was written (it only prints its timings)"):
        _profile(args)


def _profile(args: argparse.Namespace) -> None:
    """Time each piece of one attention layer (the table printed as it goes)."""
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    B, H, n, d = args.batch, 6, 197, 64
    scale = d**-0.5
    torch.manual_seed(0)
    _, site, _ = build_rpe(RPEConfig(), d, H, device=device)
    with torch.no_grad():
        site.lookup_table_weight.normal_(0, 0.5)
    table = site.lookup_table_weight  # (1, d, nb) fp32 parameter
    nb = table.shape[-1]
    width = nb + (-nb % 8)
    ids = site.bucket_ids(14, 14, 1, device)
    onehot = bucket_onehot(site.index_spec, 14, 14, 1, device, width, dtype)  # what rpe caches on CUDA
    q, k, v = (torch.randn(B, H, n, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    leaf_bias = torch.randn(B, H, n, n, device=device, dtype=dtype, requires_grad=True)
    rows_leaf = torch.randn(B, H, n, width, device=device, dtype=dtype, requires_grad=True)

    def sdpa(bias):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    def current(backend="auto"):
        return lambda: [rpe_attention(q, k, v, rpe_k=site, grid_size=(14, 14), backend=backend)]

    variants: dict[str, Callable[[], list[torch.Tensor]]] = {
        "kernel: sdpa, no bias (flash)": lambda: [sdpa(None)],
        "kernel: sdpa + bias leaf with grad": lambda: [sdpa(leaf_bias)],
        "kernel: sdpa + bias leaf, no grad": lambda: [sdpa(leaf_bias.detach())],
        "kernel: explicit softmax + bias leaf": lambda: [eager_attention(q, k, v, leaf_bias, scale)],
        f"rows: (s q) @ table, {width} columns": lambda: [bucket_rows(q * scale, table, width)],
        f"bias from rows leaf: gather ({width})": lambda: [gather_bias(rows_leaf, ids)],
        f"bias from rows leaf: one-hot bmm ({width})": lambda: [onehot_gather(rows_leaf, onehot)],
        "rpe_attention auto": current(),
        "rpe_attention auto, gather path": with_onehot_devices(set(), current()),
        "rpe_attention auto, one-hot path": with_onehot_devices({device.type}, current()),
        "rpe_attention eager": current("eager"),
    }
    if device.type == "cuda":
        variants["rpe_attention flex"] = current("flex")
        variants.update(flex_variants(q, k, v, table, ids, onehot, scale))

    # correctness: every whole rpe_attention variant against the eager gather path (same inputs)
    def grads(outs):
        for t in (q, k, v, table):
            t.grad = None
        torch.autograd.backward(outs, [torch.full_like(o, 0.01) for o in outs])
        return [outs[0].detach().float()] + [t.grad.float().clone() for t in (q, k, v, table)]

    reference = grads(with_onehot_devices(set(), current("eager"))())
    tol = {torch.bfloat16: 3e-2, torch.float32: 1e-4, torch.float64: 1e-9}[dtype]
    failed = {}
    for name, fn in variants.items():
        if not name.startswith("rpe_attention"):
            continue
        try:
            actual = grads(fn())
        except Exception as error:  # a kernel this torch/GPU lacks: report it, time the rest
            failed[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:150]}"
            continue
        for label, a, e in zip(("out", "dq", "dk", "dv", "dtable"), actual, reference, strict=True):
            err = ((a - e).norm() / e.norm().clamp_min(1e-30)).item()
            if not err < tol:
                failed[name] = f"{label} relative error {err:.2e} > {tol:.0e}"
    print(f"variants checked against the eager path (relative error < {tol:.0e}); B={B} H={H} n={n} d={d} "
          f"{args.dtype} {device} torch {torch.__version__}")

    print(f"{'variant':<48} {'ms fwd+bwd':>10}")
    for name, fn in variants.items():
        if name in failed:
            print(f"{name:<48} {'FAILED':>10}  {failed[name]}")
            continue
        try:
            print(f"{name:<48} {timed(fn, device, args.reps, args.warmup):10.3f}", flush=True)
        except Exception as error:
            print(f"{name:<48} {'FAILED':>10}  {type(error).__name__}: {str(error).splitlines()[0][:150]}")


if __name__ == "__main__":
    main()
