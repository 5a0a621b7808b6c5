"""The same benchmark run identity gives the same numbers: two archived shift-task runs, trained again from
the command line (what `scripts/benchmark_tasks.sh` runs for their grid points), give their archived
metrics bit for bit (docs/design.md, section 8.1: `threads` is part of the config)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_cli

ARCHIVE = Path(__file__).resolve().parents[1] / "docs" / "benchmark_runs" / "shift_mini"
# one row without an encoding and one contextual row; both at their seed's archived metrics
RUNS = ("row=product_ctx,seed=1", "row=t5,seed=0")
EXACT = ("val/top1", "val/top5", "val/loss", "global_step", "identity")


@pytest.mark.slow
def test_two_archived_runs_trained_again_give_their_archived_metrics_exactly(tmp_path: Path) -> None:
    for name in RUNS:
        archived = json.loads((ARCHIVE / name / "metrics.json").read_text())
        overrides = dict(part.split("=", 1) for part in name.split(","))
        result = run_cli("train.py", [
            "sweep=shift_mini", f"row={overrides['row']}", f"seed={overrides['seed']}",
            f"paths.log_dir={tmp_path / 'runs'}", f"paths.data_dir={tmp_path / 'data'}",
        ], timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        again = json.loads((tmp_path / "runs" / "sweeps" / "shift_mini" / name / "metrics.json").read_text())
        assert {k: again.get(k) for k in EXACT} == {k: archived.get(k) for k in EXACT}, name
        assert again["env/threads"] == archived["env/threads"] == 1 and again["env/resumed_at"] == []
