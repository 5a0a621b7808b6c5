"""The same benchmark run identity gives the same numbers: two shift-task runs, trained again from the command
line (what `scripts/benchmark_tasks.sh` runs for their grid points), give the metrics archived for this kind
of CPU bit for bit (docs/design.md, "Reproducible runs": `threads` is part of the config; the CPU's kernels,
`lifecycle.job.cpu_kernels`, are recorded as ``env/cpu``).

Archives per kind of CPU lie in ``docs/benchmark_runs/repro/<kernels>/shift_mini/`` (made with
`scripts/archive_runs.py` from these two runs). On a kind with no archive yet, each run is trained twice in
separate folders and the two must agree bit for bit; either way the identity and step count must equal the
benchmark archive's, which was made on another machine."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lifecycle.job import cpu_kernels
from tests.helpers import run_cli

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmark_runs"
BENCHMARK = DOCS / "shift_mini"
# one row without an encoding and one contextual row
RUNS = ("row=product_ctx,seed=1", "row=t5,seed=0")
EXACT = ("val/top1", "val/top5", "val/loss", "global_step", "identity")


def kernels_folder(kernels: str) -> Path:
    """``docs/benchmark_runs/repro/<kernels as a folder name>/shift_mini``"""
    return DOCS / "repro" / re.sub(r"[^A-Za-z0-9]+", "-", kernels).strip("-") / "shift_mini"


def train(name: str, root: Path) -> dict:
    overrides = dict(part.split("=", 1) for part in name.split(","))
    result = run_cli("train.py", [
        "sweep=shift_mini", f"row={overrides['row']}", f"seed={overrides['seed']}",
        f"paths.log_dir={root / 'runs'}", f"paths.data_dir={root / 'data'}",
    ], timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((root / "runs" / "sweeps" / "shift_mini" / name / "metrics.json").read_text())


def test_kernels_folder_names_the_cpu_kind() -> None:
    assert kernels_folder("AuthenticAMD AVX2 bf16:native").parts[-2:] == ("AuthenticAMD-AVX2-bf16-native",
                                                                          "shift_mini")


@pytest.mark.slow
def test_two_runs_trained_again_give_the_metrics_archived_for_this_cpu_exactly(tmp_path: Path) -> None:
    kernels = cpu_kernels()
    archive = kernels_folder(kernels)
    for name in RUNS:
        again = train(name, tmp_path / "first")
        assert again["env/threads"] == 1 and again["env/resumed_at"] == [] and again["env/cpu"] == kernels
        benchmark = json.loads((BENCHMARK / name / "metrics.json").read_text())
        assert (again["identity"], again["global_step"]) == (benchmark["identity"], benchmark["global_step"])
        if (archive / name / "metrics.json").is_file():
            expected = json.loads((archive / name / "metrics.json").read_text())
            assert expected["env/cpu"] == kernels
        else:
            expected = train(name, tmp_path / "second")
        assert {k: again.get(k) for k in EXACT} == {k: expected.get(k) for k in EXACT}, (name, kernels)
