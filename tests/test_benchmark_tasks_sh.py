"""scripts/benchmark_tasks.sh checks its settings and task names before anything runs (probe 3, cases 124, 125).

The script runs from a copy in tmp_path (it works in the folder above its own), with ``PY`` a stub that records
its calls and trains nothing: no real job can start, whatever the script does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "benchmark_tasks.sh"
VALID_TASKS = "valid: shift shift_swin canvas longrange (or all)"
VENV_HINT = ("valid: create the venv with 'make test' or 'make train' (either sets up .venv), or set PY=<a Python with"
             " the project installed>")
STUB = """#!/bin/sh
# a stand-in for the project's Python: records each call; the seeds of a sweep config are 0,1
echo "$*" >> "$(dirname "$0")/calls.log"
case "$*" in *sweeper*) echo 0,1 ;; esac
exit 0
"""


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A tree holding nothing but the script (no train.py, no .venv), and the stub Python beside it."""
    (tmp_path / "repo" / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, tmp_path / "repo" / "scripts" / SCRIPT.name)
    stub = tmp_path / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    return tmp_path


def _run(copy: Path, *tasks: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("PY", "LANES", "TRAINER")} | env
    return subprocess.run(["bash", str(copy / "repo" / "scripts" / SCRIPT.name), *tasks], capture_output=True,
                          text=True, env=environ, timeout=60)


def _calls(copy: Path) -> list[str]:
    log = copy / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize(("tasks", "env", "line"), [
    (("shift",), {}, "PY='.venv/bin/python' is not an executable Python (no such file, or not executable);"
                     f" {VENV_HINT}"),
    ((), {"PY": "/nonexistent/python"}, "PY='/nonexistent/python' is not an executable Python"),
    ((), {"PY": "/"}, "PY='/' is not an executable Python"),
    ((), {"PY": "/bin/false"}, f"PY='/bin/false' cannot import torch, hydra and timm (not the project's Python);"
                               f" {VENV_HINT}"),
    (("shift", "nope"), {"PY": "{stub}"}, f"task 'nope' is not a benchmark task; {VALID_TASKS}"),
    (("*",), {"PY": "{stub}"}, f"task '*' is not a benchmark task; {VALID_TASKS}"),
    (("shift",), {"PY": "{stub}", "LANES": "0"}, "LANES='0' is not a positive integer; valid: 1, 2, ..."),
    (("shift",), {"PY": "{stub}", "LANES": "two"}, "LANES='two' is not a positive integer"),
    (("shift",), {"PY": "{stub}", "LANES": "-1"}, "LANES='-1' is not a positive integer"),
])
def test_bad_settings_and_task_names_are_one_line_before_anything_runs(copy: Path, tasks: tuple[str, ...],
                                                                      env: dict[str, str], line: str) -> None:
    env = {k: v.format(stub=copy / "python") for k, v in env.items()}
    done = _run(copy, *tasks, **env)
    assert done.returncode == 2
    assert done.stdout == ""  # no task started ("=== shift_mini ...")
    [error] = done.stderr.splitlines()
    assert error.startswith(f"error: {line}")
    assert not (copy / "repo" / "runs").exists()  # no dir made
    assert not any("train.py" in call for call in _calls(copy))  # no job launched


def test_valid_settings_run_each_task_in_its_lanes(copy: Path) -> None:
    """Valid input passes the checks: the stub is asked for the packages and the GPU, then the task's two lanes."""
    done = _run(copy, "shift", PY=str(copy / "python"), LANES="2")
    calls = _calls(copy)
    assert calls[0] == "-c import torch, hydra, timm"
    assert [c for c in calls if "train.py" in c] == [f"train.py sweep=shift_mini seed={seed}" for seed in (0, 1)]
    assert "lane 1: seeds 1" in done.stdout and (copy / "repo" / "runs").is_dir()
