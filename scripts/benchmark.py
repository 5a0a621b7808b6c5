"""Training-step time and memory of each RPE preset against timm's plain model, side by side.

    python scripts/benchmark.py                                  # DeiT-S, batch 16, CPU
    python scripts/benchmark.py --model micro --steps 20         # a quick run
    python scripts/benchmark.py --model swin_tiny                # against timm's swin_tiny_patch4_window7_224
    python scripts/benchmark.py --device cuda --bf16 --batch 128 # GPU, bf16 autocast
    python scripts/benchmark.py --json results.json
    python scripts/benchmark.py --presets none irpe_k irpe_k@naive irpe_qkv irpe_qkv@naive  # naive vs ours
    python scripts/benchmark.py --presets none rope_axial rope_mixed alibi cpb  # newer encodings

Measured figures and the commands that produced them: docs/benchmarks.md.

All models are timed in one process, round-robin (one step of each, repeated), so that machine
load drifts hit every model alike; the reported time is the median step. Memory on GPU is the
peak CUDA allocation of one step above what was allocated before it (all cases stay resident); on
CPU it is the bytes that autograd saves for the backward pass (the activation memory, which is what
RPE adds to).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, NoReturn

import timm
import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import models  # noqa: E402  (registers our builders)
from models.training import SavedTensorMeter  # noqa: E402
from rpe.config import BACKENDS, RPEConfigError, resolve_rpe  # noqa: E402
from rpe.registry import PRESETS, preset_names  # noqa: E402

MODELS = {
    # name: (timm baseline, our builder name, image size)
    "deit_small": ("deit_small_patch16_224", "deit_small_patch16_224", 224),
    "deit_tiny": ("deit_tiny_patch16_224", "deit_tiny_patch16_224", 224),
    "micro": (None, "deit_micro_patch4_32", 32),
    "swin_tiny": ("swin_tiny_patch4_window7_224", "swin_tiny_patch4_window7_224", 224),
}
# Every encoding that is not a per-site bucket table (XL, Huang's, SASA's, RoPE, CPB, ALiBi, and any added
# later), from the registry; the bucket tables are represented by a few presets except on DeiT-S (all of them).
OTHERS = list(preset_names(per_site=False))
DEFAULT_PRESETS = {
    "deit_small": list(PRESETS),
    "deit_tiny": ["none", "irpe_k", "irpe_qkv", *OTHERS],
    "micro": ["none", "irpe_k", "irpe_qk", "irpe_qkv", "irpe_bias_k", *OTHERS],
    "swin_tiny": ["swin", "irpe_k", "irpe_qkv", *OTHERS],
}


def train_step(model: nn.Module, opt: torch.optim.Optimizer, images: torch.Tensor, labels: torch.Tensor,
               bf16: bool, meter: SavedTensorMeter | None = None) -> None:
    autocast = torch.autocast(images.device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    hooks = torch.autograd.graph.saved_tensors_hooks(meter.pack, lambda t: t) if meter else nullcontext()
    with autocast, hooks:
        loss = nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def build_cases(args: argparse.Namespace) -> dict[str, nn.Module]:
    timm_name, our_name, img_size = MODELS[args.model]
    cases: dict[str, nn.Module] = {}
    if timm_name is not None:
        cases[f"timm:{timm_name}"] = timm.create_model(timm_name, num_classes=args.classes)
    presets = args.presets or DEFAULT_PRESETS[args.model]
    for case in presets:
        cases[case] = models.create_model(our_name, rpe=case_rpe(case, args.backend), num_classes=args.classes)
    return cases


def case_rpe(case: str, default_backend: str) -> Any:
    """``preset`` or ``preset@backend`` (e.g. ``irpe_qkv@naive``) -> what `create_model` takes as rpe."""
    preset, _, backend = case.partition("@")
    backend = backend or default_backend
    return preset if backend == "auto" or preset == "none" else {"preset": preset, "backend": backend}


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    device = torch.device(args.device)
    torch.manual_seed(0)
    img_size = MODELS[args.model][2]
    images = torch.randn(args.batch, 3, img_size, img_size, device=device)
    labels = torch.randint(0, args.classes, (args.batch,), device=device)
    cases = build_cases(args)
    state = {}
    for name, model in cases.items():
        model.to(device).train()
        if args.compile:
            model.compile()
        state[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4))

    times: dict[str, list[float]] = {name: [] for name in cases}
    memory: dict[str, int] = {}
    for name, (model, opt) in state.items():  # warm-up, and the memory measurement
        for _ in range(args.warmup):
            train_step(model, opt, images, labels, args.bf16)
        if device.type == "cuda":
            # Every case stays resident, so count only what this step allocates above that.
            sync(device)
            resident = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            train_step(model, opt, images, labels, args.bf16)
            sync(device)
            memory[name] = torch.cuda.max_memory_allocated() - resident
        else:
            meter = SavedTensorMeter()
            train_step(model, opt, images, labels, args.bf16, meter)
            memory[name] = meter.bytes
    for _ in range(args.steps):
        for name, (model, opt) in state.items():
            sync(device)
            started = time.perf_counter()
            train_step(model, opt, images, labels, args.bf16)
            sync(device)
            times[name].append(time.perf_counter() - started)

    reference = next(iter(cases))
    ref_time = statistics.median(times[reference])
    rows = []
    for name in cases:
        step = statistics.median(times[name])
        rows.append({
            "case": name,
            "step_ms": 1000 * step,
            "time_ratio": step / ref_time,
            "memory_MB": memory[name] / 2**20,
            "memory_ratio": memory[name] / memory[reference],
            "params_M": sum(p.numel() for p in state[name][0].parameters()) / 1e6,
        })
    return rows


class BenchError(ValueError):
    """Bad input; the message is one line naming the bad value and the valid choices."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise BenchError(f"{message} (see --help)")


def available_devices() -> list[str]:
    """The devices this machine can run on, as --device takes them."""
    valid = ["cpu"]
    if torch.cuda.is_available():
        valid += ["cuda", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        valid.append("mps")
    return valid


def check_args(args: argparse.Namespace) -> None:
    """Refuse every bad argument (`BenchError`, one line) before anything is built, timed or written."""
    for name, least in (("batch", 1), ("steps", 1), ("warmup", 0), ("classes", 1), ("threads", 1)):
        value = getattr(args, name)
        if value is not None and value < least:
            raise BenchError(f"--{name} {value} is out of range; valid: an integer >= {least}")
    for case in args.presets or []:
        preset, at, backend = case.partition("@")
        if preset not in PRESETS and not preset.startswith("rpe-"):
            raise BenchError(f"--presets {case!r}: {preset!r} is not a preset; valid: {', '.join(PRESETS)}"
                             " (each optionally @backend, e.g. irpe_qkv@naive)")
        if at and backend not in BACKENDS:
            raise BenchError(f"--presets {case!r}: backend {backend!r} is not one; valid: {', '.join(BACKENDS)}")
        try:
            resolve_rpe(case_rpe(case, args.backend))
        except RPEConfigError as err:
            raise BenchError(f"--presets {case!r}: {err}") from None
    valid = available_devices()
    try:
        device = torch.device(args.device)
    except (RuntimeError, ValueError):
        device = None
    available = device is not None and (
        device.type == "cpu" or
        (device.type == "cuda" and torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()) or
        (device.type == "mps" and "mps" in valid))
    if not available:
        raise BenchError(f"--device {args.device!r} is not available on this machine; valid: {', '.join(valid)}")
    if args.json is not None:
        from storage.destinations import DestinationError, check_destination

        try:
            check_destination(args.json, "--json")  # never into a run dir or a data root
        except DestinationError as err:
            raise BenchError(str(err)) from None
        if args.json.is_dir():
            raise BenchError(f"--json {str(args.json)!r} is a folder; valid: a file path (e.g. results.json)")
        existing = next(p for p in args.json.absolute().parents if p.exists())
        if not existing.is_dir():
            raise BenchError(f"--json {str(args.json)!r}: {existing} is a file, not a folder; valid: a path whose"
                             " folders are folders")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry; returns the exit code (2 with a one-line ``error:`` on bad input)."""
    parser = _Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="deit_small")
    parser.add_argument("--presets", nargs="*",
                        help="RPE presets, or preset@backend such as irpe_qkv@naive (default: a set per model)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per case")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast")
    parser.add_argument("--compile", action="store_true", help="torch.compile every model")
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="for presets without @backend")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (>= 1)")
    parser.add_argument("--json", type=Path, help="also write the rows here (never inside a run dir or data root)")
    try:
        args = parser.parse_args(argv)
        check_args(args)
        for case in args.presets or []:  # fail fast on a preset the model's builder refuses
            try:
                models.create_model(MODELS[args.model][1], rpe=case_rpe(case, args.backend), num_classes=2)
            except (ValueError, TypeError) as err:
                raise BenchError(f"--presets {case!r} does not build {MODELS[args.model][1]}: {err}") from None
    except BenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)

    from lifecycle.signals import exit_when_interrupted

    with exit_when_interrupted("benchmark.py", "nothing was written (its table and --json come after every case)"):
        try:
            rows = measure(args)
        except (RuntimeError, MemoryError) as err:  # a head or batch the machine cannot hold: torch's allocator
            text = " ".join(str(err).split())
            if not isinstance(err, MemoryError) and "allocate" not in text and "out of memory" not in text:
                raise
            print(f"error: a model or batch of these arguments does not fit in the device's memory ({text[:200]});"
                  " nothing was written; valid: a smaller --batch or --classes", file=sys.stderr)
            return 2
    setup = (f"model={args.model} batch={args.batch} device={args.device} bf16={args.bf16} "
             f"compile={args.compile} backend={args.backend} threads={torch.get_num_threads()} "
             f"torch={torch.__version__}")
    print(setup)
    print(f"{'case':<40} {'step ms':>9} {'x time':>7} {'mem MB':>9} {'x mem':>7} {'params M':>9}")
    for row in rows:
        print(f"{row['case']:<40} {row['step_ms']:9.1f} {row['time_ratio']:7.3f} {row['memory_MB']:9.1f} "
              f"{row['memory_ratio']:7.3f} {row['params_M']:9.2f}")
    if args.json:
        from storage.files import atomic_write_json

        try:
            atomic_write_json(args.json, {"setup": setup, "rows": rows})
        except OSError as err:
            print(f"error: --json {str(args.json)!r}: {err}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
