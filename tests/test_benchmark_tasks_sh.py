"""scripts/benchmark_tasks.sh and scripts/mini_sweeps.sh check their settings and names before anything runs
(probe 3, cases 124, 125; probe 4, cases 56-60, through scripts/script_checks.sh, which both source).

The script runs from a copy in tmp_path (it works in the folder above its own), with ``PY`` a stub that records
its calls and trains nothing: no real job can start, whatever the script does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "benchmark_tasks.sh"
MINI = ROOT / "scripts" / "mini_sweeps.sh"
VALID_TASKS = "valid: shift shift_swin canvas longrange (or all)"
VENV_HINT = ("valid: create the venv with 'make test' or 'make train' (either sets up .venv), or set PY=<a Python with"
             " the project installed>")
TRAINER_HINT = ("valid: TRAINER= (the CPU) or words of key=value overrides of train.py, e.g. TRAINER='trainer=gpu"
                " trainer.precision=32-true'; trainer= one of: cpu ddp ddp_cpu gpu")
STUB = """#!/bin/sh
# a stand-in for the project's Python: records each call; the seeds of a sweep config are 0,1
echo "$*" >> "$(dirname "$0")/calls.log"
case "$*" in *sweeper*) echo 0,1 ;; esac
case "$*" in train.py*) [ -z "${STUB_TRAIN_FAILS:-}" ] || exit 2 ;; esac
exit 0
"""


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A tree holding nothing but the scripts, their checks and the trainer configs (no train.py, no .venv), and
    the stub Python beside it."""
    (tmp_path / "repo" / "scripts").mkdir(parents=True)
    for script in (SCRIPT, MINI, ROOT / "scripts" / "script_checks.sh"):
        shutil.copy(script, tmp_path / "repo" / "scripts" / script.name)
    shutil.copytree(ROOT / "configs" / "trainer", tmp_path / "repo" / "configs" / "trainer")
    stub = tmp_path / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    return tmp_path


def _run(copy: Path, *tasks: str, script: Path = SCRIPT, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("PY", "LANES", "TRAINER", "STUB_TRAIN_FAILS")} | env
    return subprocess.run(["bash", str(copy / "repo" / "scripts" / script.name), *tasks], capture_output=True,
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
    # probe 4, case 56: two names in one argument matched the list as a substring
    (("canvas longrange",), {"PY": "{stub}"}, f"task 'canvas longrange' is not a benchmark task; {VALID_TASKS},"
                                              " one name an argument"),
    (("shift", ""), {"PY": "{stub}"}, "task '' is not a benchmark task"),
    # case 57: TRAINER was never checked
    (("shift",), {"PY": "{stub}", "TRAINER": "trainer=gpu"}, "TRAINER='trainer=gpu' asks for a GPU, and PY='{stub}'"
                                                             " sees none (torch.cuda.is_available() is not True);"
                                                             " valid here: TRAINER= (the CPU), or trainer=cpu"),
    (("shift",), {"PY": "{stub}", "TRAINER": "trainer=nope"}, f"TRAINER='trainer=nope': trainer=nope is not a"
                                                              f" trainer; {TRAINER_HINT}"),
    (("shift",), {"PY": "{stub}", "TRAINER": "gpu"}, f"TRAINER='gpu': 'gpu' is not a key=value override;"
                                                     f" {TRAINER_HINT}"),
    (("shift",), {"PY": "{stub}", "TRAINER": "trainer.devices=1 *"}, "TRAINER='trainer.devices=1 *': '*' is not a"
                                                                     " key=value override"),
    (("shift",), {"PY": "{stub}", "TRAINER": "trainer.accelerator=cuda"}, "TRAINER='trainer.accelerator=cuda' asks"
                                                                          " for a GPU"),
])
def test_bad_settings_and_task_names_are_one_line_before_anything_runs(copy: Path, tasks: tuple[str, ...],
                                                                      env: dict[str, str], line: str) -> None:
    env = {k: v.format(stub=copy / "python") for k, v in env.items()}
    done = _run(copy, *tasks, **env)
    assert done.returncode == 2
    assert done.stdout == ""  # no task started ("=== shift_mini ...")
    [error] = done.stderr.splitlines()
    assert error.startswith(f"error: {line.format(stub=copy / 'python')}")
    assert not (copy / "repo" / "runs").exists()  # no dir made
    assert not any("train.py" in call for call in _calls(copy))  # no job launched


def test_valid_settings_run_each_task_in_its_lanes(copy: Path) -> None:
    """Valid input passes the checks: the stub is asked for the packages and the GPU, then the task's two lanes."""
    done = _run(copy, "shift", PY=str(copy / "python"), LANES="2")
    calls = _calls(copy)
    assert calls[0] == "-c import torch, hydra, timm"
    assert [c for c in calls if "train.py" in c] == [f"train.py sweep=shift_mini seed={seed}" for seed in (0, 1)]
    assert "lane 1: seeds 1" in done.stdout and (copy / "repo" / "runs").is_dir()


def test_valid_trainer_overrides_pass(copy: Path) -> None:
    done = _run(copy, "shift", PY=str(copy / "python"), LANES="1", TRAINER="trainer=cpu +trainer.x=1 ~trainer.y")
    assert done.returncode == 0, done.stderr
    assert [c for c in _calls(copy) if "train.py" in c] == [
        "train.py sweep=shift_mini seed=0,1 trainer=cpu +trainer.x=1 ~trainer.y"]


def test_a_task_named_twice_runs_once_in_the_order_given(copy: Path) -> None:
    """Probe 4, case 58: `shift shift` ran the sweep, its evaluation and the rebuild twice."""
    done = _run(copy, "canvas", "shift", "canvas", PY=str(copy / "python"), LANES="1", TRAINER="")
    assert done.returncode == 0, done.stderr
    assert [c for c in _calls(copy) if "train.py" in c] == [
        "train.py sweep=canvas_mini seed=0,1", "train.py sweep=shift_mini seed=0,1"]


def test_a_task_whose_sweep_failed_is_neither_evaluated_nor_archived(copy: Path) -> None:
    """Probe 4, case 57: after the sweep's jobs failed, its runs were still evaluated and every table rebuilt."""
    (copy / "repo" / "runs" / "sweeps" / "shift_mini" / "seed=0").mkdir(parents=True)
    done = _run(copy, "shift", PY=str(copy / "python"), LANES="1", TRAINER="", STUB_TRAIN_FAILS="1")
    assert done.returncode == 1
    assert "sweep shift_mini had failed jobs (see its lane logs): not evaluated or archived" in done.stdout
    assert "no task was archived" in done.stdout
    later = [c for c in _calls(copy) if any(s in c for s in ("evaluate_testsets", "archive_runs", "make_tables",
                                                             "plot_benchmark"))]
    assert later == []


VALID_SWEEPS = "valid: where method_mode shared_head index buckets compare swin cost detr, one name an argument"


@pytest.mark.parametrize(("sweeps", "env", "line"), [
    (("where",), {}, f"PY='.venv/bin/python' is not an executable Python (no such file, or not executable);"
                     f" {VENV_HINT}"),  # probe 4, case 60: three 'No such file or directory'
    (("nope",), {"PY": "{stub}"}, f"sweep 'nope' is not a mini sweep; {VALID_SWEEPS}"),  # case 59
    (("where", "all"), {"PY": "{stub}"}, "sweep 'all' is not a mini sweep"),
    (("where index",), {"PY": "{stub}"}, "sweep 'where index' is not a mini sweep"),
    (("where",), {"PY": "{stub}", "TRAINER": "trainer=gpu"}, "TRAINER='trainer=gpu' asks for a GPU"),
    (("where",), {"PY": "{stub}", "TRAINER": "cpu"}, f"TRAINER='cpu': 'cpu' is not a key=value override;"
                                                     f" {TRAINER_HINT}"),
])
def test_mini_sweeps_checks_everything_before_anything_runs(copy: Path, sweeps: tuple[str, ...],
                                                            env: dict[str, str], line: str) -> None:
    env = {k: v.format(stub=copy / "python") for k, v in env.items()}
    done = _run(copy, *sweeps, script=MINI, **env)
    assert done.returncode == 2
    assert done.stdout == ""
    [error] = done.stderr.splitlines()
    assert error.startswith(f"error: {line}")
    assert not any("train.py" in call or "make_tables" in call for call in _calls(copy))


def test_mini_sweeps_runs_a_sweep_named_twice_once(copy: Path) -> None:
    done = _run(copy, "index", "where", "index", script=MINI, PY=str(copy / "python"), TRAINER="")
    assert done.returncode == 0, done.stderr
    assert [c for c in _calls(copy) if "train.py" in c] == ["train.py sweep=index_mini", "train.py sweep=where_mini"]
