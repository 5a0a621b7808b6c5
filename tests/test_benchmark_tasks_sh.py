"""scripts/benchmark_tasks.sh and scripts/mini_sweeps.sh check their settings and names before anything runs
(probe 3, cases 124, 125; probe 4, cases 56-60; probe 5, cases 113-117, 121, 122, through scripts/script_checks.sh,
which both source), and report a sweep that ended without its jobs finished.

The script runs from a copy in tmp_path (it works in the folder above its own), with ``PY`` a stub that records
its calls and trains nothing: no real job can start, whatever the script does. The stub answers train.py's check
(``train.py --check``) and the finished-sweep check as the real ones would on success, unless a test asks it to
refuse, or to hand the finished-sweep check to the real Python.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "benchmark_tasks.sh"
MINI = ROOT / "scripts" / "mini_sweeps.sh"
VALID_TASKS = "valid: shift shift_swin shift_buckets canvas canvas_direction longrange (or all)"
VENV_HINT = ("valid: create the venv with 'make test' or 'make train' (either sets up .venv), or set PY=<a Python with"
             " the project installed>")
TRAINER_HINT = ("valid: TRAINER= (the CPU) or words of key=value overrides of train.py, e.g. TRAINER='trainer=gpu"
                " trainer.precision=32-true'; trainer= one of: cpu ddp ddp_cpu gpu")
STUB = """#!/bin/sh
# a stand-in for the project's Python: records each call; the seeds of a sweep config are 0,1, its rows 2; a sweep
# makes its sweep dir, and nothing in it (STUB_TRAIN_SLEEPS: it trains for 60 s, a child of its own that the script's
# signal to the stub's children does not end, so that the stub itself must get the signal to stop; STUB_TRAIN_WRITES:
# it finishes the runs of rows a and b of each of its seeds, one a second; STUB_EVAL_WRITES: an evaluation writes
# each result of each run given, one every 0.4 s)
echo "$*" >> "$(dirname "$0")/calls.log"
case "$*" in *"import torch, hydra, timm"*) echo "torch hydra timm" ;; esac
case "$*" in *"get('row')"*) echo 2 ;; *sweeper*) echo 0,1 ;; esac
case "$*" in "train.py --check"*) [ -z "${STUB_CHECK_REFUSES:-}" ] || { echo "a warning" >&2;
  echo "error: $STUB_CHECK_REFUSES" >&2; exit 2; } ;; esac
case "$*" in "train.py sweep="*) [ -z "${STUB_TRAIN_SLEEPS:-}" ] || {
  trap 'echo "got TERM" >> "$(dirname "$0")/calls.log"; kill -KILL $!; exit 143' TERM
  (trap "" TERM; exec sleep 60) & wait; } ;; esac
case "$*" in "train.py sweep="*) [ -z "${STUB_TRAIN_WRITES:-}" ] || { echo Launching; d="runs/sweeps/${2#sweep=}"
  for s in $(echo "${3#seed=}" | tr , ' '); do for r in a b; do sleep 1; mkdir -p "$d/row=$r,seed=$s"
    echo '{"state": "finished"}' > "$d/row=$r,seed=$s/run.json"; done; done; } ;; esac
case "$*" in "scripts/evaluate_testsets.py"*) [ -z "${STUB_EVAL_WRITES:-}" ] || { shift; runs=""
  while [ "$1" != --testsets ]; do runs="$runs $1"; shift; done; shift
  for r in $runs; do for t in "$@"; do case $t in --*) break ;; esac; sleep 0.4; mkdir -p "$r/testsets"
    echo '{}' > "$r/testsets/$t.json"; done; done; } ;; esac
case "$*" in "train.py sweep="*) [ -z "${STUB_TRAIN_FAILS:-}" ] || exit 2
  [ -n "${STUB_TRAINS_NOTHING:-}" ] || mkdir -p "runs/sweeps/${2#sweep=}" ;; esac
case "$*" in *collect*) [ -z "${STUB_REAL_PYTHON:-}" ] || exec "$STUB_REAL_PYTHON" "$@"; echo finished ;; esac
case "$*" in *hydra.sweep.dir*) [ -z "${STUB_REAL_PYTHON:-}" ] || exec "$STUB_REAL_PYTHON" "$@"; echo same ;; esac
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


def _run(copy: Path, *tasks: str, script: Path = SCRIPT, started: Path | None = None, cwd: Path | None = None,
         **env: str) -> subprocess.CompletedProcess:
    """Run the copy's ``script`` (or the file ``started``, a link to it) from ``cwd`` with the environment ``env``."""
    environ = {k: v for k, v in os.environ.items()
               if k not in ("PY", "LANES", "TRAINER", "SEED_COUNT", "PROGRESS_S") and not k.startswith("STUB")}
    return subprocess.run(["bash", str(started or copy / "repo" / "scripts" / script.name), *tasks],
                          capture_output=True, text=True, env=environ | env, timeout=120, cwd=cwd)


def _calls(copy: Path) -> list[str]:
    log = copy / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def _trained(copy: Path) -> list[str]:
    """The training commands the script started (train.py's check of them aside)."""
    return [call for call in _calls(copy) if call.startswith("train.py sweep=")]


@pytest.mark.parametrize(("tasks", "env", "line"), [
    (("shift",), {}, "PY='.venv/bin/python' is not an executable Python (no such file, or not executable);"
                     f" {VENV_HINT}"),
    ((), {"PY": "/nonexistent/python"}, "PY='/nonexistent/python' is not an executable Python"),
    ((), {"PY": "/"}, "PY='/' is not an executable Python"),
    ((), {"PY": "/bin/false"}, f"PY='/bin/false' cannot import torch, hydra and timm (not the project's Python);"
                               f" {VENV_HINT}"),
    # probe 5, case 113: a program that succeeds at anything passed, and the script "ran" every task
    (("shift",), {"PY": "/bin/true"}, "PY='/bin/true' cannot import torch, hydra and timm (not the project's Python)"),
    # case 116: a key the script sets for each sweep
    (("shift",), {"PY": "{stub}", "TRAINER": "trainer=cpu seed=0"}, "TRAINER='trainer=cpu seed=0': seed is set by the"
                                                                    " script for each sweep (its sweep config and"
                                                                    " seeds), and seed=0 would replace it;"
                                                                    f" {TRAINER_HINT}"),
    (("shift",), {"PY": "{stub}", "TRAINER": "+sweep=x"}, "TRAINER='+sweep=x': sweep is set by the script"),
    # a key that moves the jobs away from the sweep dir the script then evaluates and archives
    (("shift",), {"PY": "{stub}", "TRAINER": "trainer=cpu hydra.sweep.dir=/tmp/elsewhere"},
     "TRAINER='trainer=cpu hydra.sweep.dir=/tmp/elsewhere': hydra.sweep.dir decides where the jobs write"),
    (("shift",), {"PY": "{stub}", "TRAINER": "++paths.log_dir=/tmp/x"},
     "TRAINER='++paths.log_dir=/tmp/x': paths.log_dir decides where the jobs write"),
    # probe 9, A155: a Hydra setting that does not move the jobs is refused for what it is
    (("shift",), {"PY": "{stub}", "TRAINER": "+hydra.job.env_set.LOCAL_RANK=0"},
     "TRAINER='+hydra.job.env_set.LOCAL_RANK=0': hydra.job.env_set.LOCAL_RANK is a setting of Hydra's own, which the"
     " script keeps as the project sets it"),
    (("shift", "nope"), {"PY": "{stub}"}, f"task 'nope' is not a benchmark task; {VALID_TASKS}"),
    (("*",), {"PY": "{stub}"}, f"task '*' is not a benchmark task; {VALID_TASKS}"),
    (("shift",), {"PY": "{stub}", "LANES": "0"}, "LANES='0' is not a positive integer; valid: 1, 2, ..."),
    (("shift",), {"PY": "{stub}", "LANES": "two"}, "LANES='two' is not a positive integer"),
    (("shift",), {"PY": "{stub}", "LANES": "-1"}, "LANES='-1' is not a positive integer"),
    (("shift",), {"PY": "{stub}", "SEED_COUNT": "0"}, "SEED_COUNT='0' is not a positive integer; valid: 1, 2, ..."),
    (("shift",), {"PY": "{stub}", "SEED_COUNT": "ten"}, "SEED_COUNT='ten' is not a positive integer"),
    (("shift",), {"PY": "{stub}", "SEED_COUNT": "3"}, "SEED_COUNT=3 is more than task shift's 2 seeds; valid: 1 to 2"),
    (("shift",), {"PY": "{stub}", "PROGRESS_S": "0"}, "PROGRESS_S='0' is not a positive integer; valid: 1, 2, ..."
                                                      " (seconds between two progress lines"),
    (("shift",), {"PY": "{stub}", "PROGRESS_S": "1m"}, "PROGRESS_S='1m' is not a positive integer"),
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
    """Valid input passes the checks: the stub is asked for the temp dir's problem, the packages and the GPU, then
    the task's two lanes."""
    done = _run(copy, "shift", PY=str(copy / "python"), LANES="2")
    calls = _calls(copy)
    assert calls[0].startswith("-c import starting;") and calls[1].startswith("-c import torch, hydra, timm;")
    assert _trained(copy) == [f"train.py sweep=shift_mini seed={seed}" for seed in (0, 1)]
    assert "lane 1: seeds 1" in done.stdout and (copy / "repo" / "runs").is_dir()


def test_a_benchmark_of_fewer_seeds_is_trained_and_evaluated_but_never_archived(copy: Path) -> None:
    """SEED_COUNT=<n> runs each task's first n seeds (to time the benchmark at 10 seeds): the archive, which holds
    whole tasks, and the tables built from it are left as they are."""
    (copy / "repo" / "runs" / "sweeps" / "shift_mini" / "row=none,seed=0").mkdir(parents=True)  # its one run
    done = _run(copy, "shift", PY=str(copy / "python"), LANES="1", TRAINER="", SEED_COUNT="1")
    assert done.returncode == 0, done.stderr
    assert _trained(copy) == ["train.py sweep=shift_mini seed=0"]
    assert any(call.startswith("scripts/evaluate_testsets.py") for call in _calls(copy)), _calls(copy)
    assert not any(s in call for call in _calls(copy) for s in ("archive_runs", "make_tables", "plot_benchmark"))
    assert "shift_mini: not archived (SEED_COUNT=1: the archive holds whole tasks)" in done.stdout


def test_training_and_evaluation_print_their_progress_and_the_time_left_at_this_sittings_pace(copy: Path) -> None:
    """While a task trains, and then while its runs are evaluated, a line every PROGRESS_S seconds counts its
    finished jobs (rows x seeds) or written test-set results (runs x test sets) and estimates the time left from
    the work done in this sitting only: a run finished before it (resumed) is not pace."""
    earlier = copy / "repo" / "runs" / "sweeps" / "shift_mini" / "row=a,seed=0"
    earlier.mkdir(parents=True)
    (earlier / "run.json").write_text('{"state": "finished"}')
    unfinished = earlier.parent / "row=b,seed=1"
    unfinished.mkdir()
    (unfinished / "run.json").write_text('{"state": "interrupted"}')
    done = _run(copy, "shift", PY=str(copy / "python"), LANES="1", TRAINER="", PROGRESS_S="1",
                STUB_TRAIN_WRITES="1", STUB_EVAL_WRITES="1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    evaluating = lines.index("evaluation lane 0 (log runs/shift_mini.eval0.log)")
    for phase, what, total, earlier_count, part in (("training", "jobs finished", 4, 1, lines[:evaluating]),
                                                     ("evaluation", "test-set results written", 12, 0,
                                                      lines[evaluating:])):
        progress = [re.fullmatch(rf"shift_mini: (\d+) of {total} {what}(.*)", line) for line in part]
        progress = [found for found in progress if found]
        counts = [int(found[1]) for found in progress]
        assert len(progress) >= 2 and counts == sorted(counts) and counts[0] >= earlier_count, done.stdout
        for found in progress:
            if int(found[1]) == earlier_count:  # nothing done in this sitting yet: no pace
                assert re.fullmatch(r"; none yet in this sitting's 0 min \d+ s \(\d\d:\d\d:\d\d\)", found[2]), found[2]
            else:
                assert re.fullmatch(rf" \({int(found[1]) - earlier_count} in this sitting's 0 min \d+ s\); about \d+"
                                    rf" min of {phase} left at this pace \(\d\d:\d\d:\d\d\)", found[2]), found[2]


def test_the_progress_lines_read_run_json_as_the_lifecycle_writes_it(tmp_path: Path) -> None:
    """The script counts a finished job by the text ``"state": "finished"`` in its run.json (bash, no Python per
    line): the lifecycle's record writer writes exactly that text for a finished run, and not for another state."""
    from lifecycle.records import RunRecord

    script = SCRIPT.read_text()
    assert 'grep -qs \'"state": "finished"\' "$run/run.json"' in script
    for state, counted in (("finished", True), ("interrupted", False)):
        RunRecord(tmp_path, "abc", {"seed": 0}, {"max_epochs": 1}).save(state)
        assert ('"state": "finished"' in (tmp_path / "run.json").read_text()) is counted


def test_valid_trainer_overrides_pass(copy: Path) -> None:
    done = _run(copy, "shift", PY=str(copy / "python"), LANES="1", TRAINER="trainer=cpu +trainer.x=1 ~trainer.y")
    assert done.returncode == 0, done.stderr
    assert _trained(copy) == ["train.py sweep=shift_mini seed=0,1 trainer=cpu +trainer.x=1 ~trainer.y"]


def test_a_task_named_twice_runs_once_in_the_order_given(copy: Path) -> None:
    """Probe 4, case 58: `shift shift` ran the sweep, its evaluation and the rebuild twice."""
    done = _run(copy, "canvas", "shift", "canvas", PY=str(copy / "python"), LANES="1", TRAINER="")
    assert done.returncode == 0, done.stderr
    assert _trained(copy) == ["train.py sweep=canvas_mini seed=0,1", "train.py sweep=shift_mini seed=0,1"]


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


VALID_SWEEPS = ("valid: where method_mode shared_head index buckets compare swin cost detr (or all), one name"
                " an argument")


@pytest.mark.parametrize(("sweeps", "env", "line"), [
    (("where",), {}, f"PY='.venv/bin/python' is not an executable Python (no such file, or not executable);"
                     f" {VENV_HINT}"),  # probe 4, case 60: three 'No such file or directory'
    (("nope",), {"PY": "{stub}"}, f"sweep 'nope' is not a mini sweep; {VALID_SWEEPS}"),  # case 59
    (("where", "al"), {"PY": "{stub}"}, f"sweep 'al' is not a mini sweep; {VALID_SWEEPS}"),  # probe 5: all is one
    (("where",), {"PY": "/bin/true"}, "PY='/bin/true' cannot import torch, hydra and timm"),  # probe 5, case 114
    (("where",), {"PY": "{stub}", "TRAINER": "seed=0"}, "TRAINER='seed=0': seed is set by the script"),
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
    assert _trained(copy) == ["train.py sweep=index_mini", "train.py sweep=where_mini"]


@pytest.mark.parametrize(("benchmarks", "given"), [
    (("shift_mini", "canvas_mini"), "docs/benchmark_runs/canvas_mini docs/benchmark_runs/shift_mini"),
    (("shift_mini", "detr_gpu"), "docs/benchmark_runs/shift_mini docs/benchmark_runs/detr_gpu"),
    ((), ""),
], ids=["cpu_tasks", "with_table6_gpu", "none"])
def test_mini_sweeps_judges_the_readme_findings_with_the_benchmark_tasks(copy: Path, benchmarks: tuple[str, ...],
                                                                         given: str) -> None:
    """Probe 16, o107: mini_sweeps.sh rewrote the README's findings (one Holm family over the ablations and the
    benchmark tasks, scripts/benchmark_tasks.sh) from the ablations alone, dropping the tasks' findings. It now
    gives the tasks' archives as benchmark_tasks.sh does (`benchmark_archives` of scripts/script_checks.sh): --family
    for the tables, DIRS for the README. Table 6's archive from a GPU (detr_gpu) is one of them: left out, its
    findings would have left the README and the others been judged in a smaller family."""
    for folder in ("docs/ablations_mini_runs/where_mini", *(f"docs/benchmark_runs/{b}" for b in benchmarks)):
        (copy / "repo" / folder).mkdir(parents=True)
    done = _run(copy, "where", script=MINI, PY=str(copy / "python"), TRAINER="")
    assert done.returncode == 0, done.stderr
    tables = [call for call in _calls(copy) if call.startswith("scripts/make_tables.py")]
    family = f" --family {given}" if given else ""
    tasks = f" {given}" if given else ""
    assert tables == [
        f"scripts/make_tables.py docs/ablations_mini_runs/where_mini --out docs/ablations_mini{family}",
        f"scripts/make_tables.py docs/ablations_mini_runs/where_mini{tasks} --readme README.md",
    ]


@pytest.mark.parametrize(("script", "names", "checked"), [
    (SCRIPT, ("shift", "canvas"), "train.py --check sweep=shift_mini seed=0,1 trainer.max_epochs=1 -- sweep=canvas_mini"
                                  " seed=0,1 trainer.max_epochs=1"),
    (MINI, ("index", "where"), "train.py --check sweep=index_mini trainer.max_epochs=1 -- sweep=where_mini"
                               " trainer.max_epochs=1"),
])
def test_train_py_checks_every_job_command_once_before_any_dir_or_job(copy: Path, script: Path,
                                                                      names: tuple[str, ...], checked: str) -> None:
    """Probe 5, cases 115-117: the TRAINER words were checked for their syntax only; train.py refused a bad value
    in every lane or job. One `train.py --check` of every sweep's job command now comes before the first job."""
    done = _run(copy, *names, script=script, PY=str(copy / "python"), LANES="1", TRAINER="trainer.max_epochs=1")
    assert done.returncode == 0, done.stderr
    calls = _calls(copy)
    assert [c for c in calls if c.startswith("train.py --check")] == [checked]
    assert calls.index(checked) < calls.index(_trained(copy)[0])


@pytest.mark.parametrize("script", [SCRIPT, MINI])
def test_a_job_command_train_py_refuses_is_one_line_before_anything(copy: Path, script: Path) -> None:
    """Its check's line (after any warning it printed), naming the TRAINER words: no dir, no lane, no job."""
    refusal = "trainer.precision='bogus' must be 16, 32 or 64 or a precision name such as '32-true' or 'bf16-mixed'"
    done = _run(copy, "where" if script == MINI else "shift", script=script, PY=str(copy / "python"),
                TRAINER="trainer.precision=bogus", STUB_CHECK_REFUSES=refusal)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"error: train.py refuses the jobs (with TRAINER='trainer.precision=bogus'): {refusal}"]
    assert not (copy / "repo" / "runs").exists()
    assert _trained(copy) == []


@pytest.mark.parametrize(("script", "line"), [
    (SCRIPT, "sweep runs/sweeps/shift_mini did not finish: train.py made no sweep dir; not evaluated or archived; run"
             " it again to finish it"),
    (MINI, "sweep runs/sweeps/where_mini did not finish: train.py made no sweep dir"),
])
def test_a_sweep_that_ends_without_its_jobs_is_exit_1_in_one_line(copy: Path, script: Path, line: str) -> None:
    """Probe 5, cases 113, 114: a PY whose train.py ended well but made no job reported success (exit 0)."""
    done = _run(copy, "where" if script == MINI else "shift", script=script, PY=str(copy / "python"), LANES="1",
                TRAINER="", STUB_TRAINS_NOTHING="1")
    assert done.returncode == 1
    assert line in done.stdout.splitlines()
    if script == SCRIPT:
        assert not [c for c in _calls(copy) if "evaluate_testsets" in c or "archive_runs" in c]


@pytest.mark.slow
def test_a_job_without_a_finished_run_is_named_by_the_tables_reading_of_the_sweep(copy: Path) -> None:
    """The real finished-sweep check (tables/collect.py, in the real Python): a job dir whose run never
    finished is named with its state."""
    job = copy / "repo" / "runs" / "sweeps" / "where_mini" / "seed=0"
    job.mkdir(parents=True)
    (job / "config.yaml").write_text("seed: 0\n")
    done = _run(copy, "where", script=MINI, PY=str(copy / "python"), TRAINER="", STUB_REAL_PYTHON=sys.executable,
                PYTHONPATH=str(ROOT))
    assert done.returncode == 1
    assert ("sweep runs/sweeps/where_mini did not finish: 1 of its 1 jobs did not finish, e.g."
            " runs/sweeps/where_mini/seed=0 (unfinished)") in done.stdout.splitlines()


@pytest.mark.slow  # the real Python composes each sweep's config twice
@pytest.mark.parametrize(("script", "name", "own"), [(MINI, "where", "sweep=where_mini"),
                                                     (SCRIPT, "shift", "sweep=shift_mini seed=0,1")])
def test_a_trainer_word_that_moves_the_sweep_dir_is_one_line_before_anything(copy: Path, script: Path, name: str,
                                                                             own: str) -> None:
    """Probe 8, A16: TRAINER='sweep_name=where_new' sent the jobs to runs/sweeps/where_new while the script tested,
    archived and tabled runs/sweeps/where_mini, an older sweep. Any word that moves the sweep dir the composed
    config resolves (hydra.sweep.dir, with the TRAINER words and without) is now one line before any job."""
    shutil.rmtree(copy / "repo" / "configs")
    shutil.copytree(ROOT / "configs", copy / "repo" / "configs")
    older = copy / "repo" / "runs" / "sweeps" / f"{name}_mini"
    older.mkdir(parents=True)  # an older, unrelated sweep where the script would have looked
    sweep = own.split()[0].removeprefix("sweep=")
    done = _run(copy, name, script=script, PY=str(copy / "python"), LANES="1", STUB_REAL_PYTHON=sys.executable,
                PYTHONPATH=str(ROOT), TRAINER="trainer.max_epochs=1 sweep_name=elsewhere")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"error: TRAINER='trainer.max_epochs=1 sweep_name=elsewhere': sweep_name=elsewhere moves the sweep of {own}"
        f" from runs/sweeps/{sweep} to runs/sweeps/elsewhere, and the script tests, evaluates and archives each sweep"
        f" where its own words put it; {TRAINER_HINT}"]
    assert _trained(copy) == [] and not [c for c in _calls(copy) if "archive_runs" in c or "make_tables" in c]
    assert list((copy / "repo" / "runs" / "sweeps").iterdir()) == [older]
    # words that leave the sweep dir where it is pass, through the same real reading
    done = _run(copy, name, script=script, PY=str(copy / "python"), LANES="1", STUB_REAL_PYTHON=sys.executable,
                PYTHONPATH=str(ROOT), TRAINER="trainer.max_epochs=1 +trainer.limit_train_batches=2")
    assert _trained(copy) == [f"train.py {own} trainer.max_epochs=1 +trainer.limit_train_batches=2"], done.stderr


def test_a_script_started_through_a_link_runs_in_its_own_tree(copy: Path) -> None:
    """Probe 5, case 122: through a link in another folder, the script looked for its checks beside the link,
    skipped every check ('command not found') and exited 0."""
    (copy / "x").mkdir()
    link = copy / "x" / "bt.sh"
    link.symlink_to(copy / "repo" / "scripts" / SCRIPT.name)
    done = _run(copy, "shift", started=link, cwd=copy / "x", PY=str(copy / "python"), LANES="1", TRAINER="")
    assert done.returncode == 0, done.stderr
    assert "script_checks.sh" not in done.stderr and "command not found" not in done.stderr
    assert (copy / "repo" / "runs" / "shift_mini.lane0.log").is_file() and not (copy / "x" / "runs").exists()
    assert _trained(copy) == ["train.py sweep=shift_mini seed=0,1"]


@pytest.mark.parametrize("script", [SCRIPT, MINI])
def test_a_script_without_its_checks_stops_in_one_line(copy: Path, script: Path) -> None:
    alone = copy / "alone"
    alone.mkdir()
    shutil.copy(script, alone / script.name)
    done = _run(copy, started=alone / script.name, PY=str(copy / "python"), TRAINER="")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"error: {alone / 'script_checks.sh'} cannot be read, and without it no setting is checked; valid: run the"
        f" script of a whole checkout (bash <repo>/scripts/{script.name})"]
    assert _calls(copy) == []


def test_all_and_a_py_relative_to_the_callers_folder(copy: Path) -> None:
    """Probe 5, case 121: mini_sweeps.sh refused `all`, which benchmark_tasks.sh takes; a relative PY was looked up
    from the repo root the script changes into, not from the folder it was started in."""
    done = _run(copy, "all", script=MINI, cwd=copy, PY="./python", TRAINER="")
    assert done.returncode == 0, done.stderr
    assert _trained(copy) == [f"train.py sweep={name}_mini" for name in
                              "where method_mode shared_head index buckets compare swin cost detr".split()]
    done = _run(copy, "shift", cwd=copy / "repo" / "configs", PY="../../python", LANES="1", TRAINER="")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("script", [SCRIPT, MINI], ids=["benchmark_tasks", "mini_sweeps"])
def test_a_stop_signal_to_the_script_reaches_its_training_and_is_one_line(copy: Path, script: Path,
                                                                          signame: str) -> None:
    """SIGTERM to the script (a scheduler's stop, Ctrl-C's kin) ended the script and left its training lanes or
    sweep running on their own: the signal is passed on to them, the script waits, says so, exits 143. Probe 7,
    A217: SIGINT (Ctrl-C) was passed on as SIGINT, which a child started with & by a non-interactive bash ignores
    from its start: the script waited for the training to end. It is passed on as SIGTERM."""
    import signal
    import time

    signum = getattr(signal, signame)

    environ = {k: v for k, v in os.environ.items()
               if k not in ("PY", "LANES", "TRAINER", "SEED_COUNT", "PROGRESS_S") and not k.startswith("STUB")}
    env = environ | {"PY": str(copy / "python"), "LANES": "1", "TRAINER": "", "STUB_TRAIN_SLEEPS": "1"}
    task = "shift" if script == SCRIPT else "where"
    from tests.helpers import _sigint_as_at_a_terminal

    # the script starts as from a terminal, with SIGINT at its default (a suite run in the background inherits it
    # ignored, and a signal ignored when bash starts can never be trapped)
    started = subprocess.Popen(["bash", str(copy / "repo" / "scripts" / script.name), task], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_sigint_as_at_a_terminal)
    deadline = time.monotonic() + 60
    while not any(call.startswith("train.py sweep=") for call in _calls(copy)) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # the stub has set its trap
    started.send_signal(signum)
    _, err = started.communicate(timeout=30)  # less than the stub's 60 s of training: the signal reached it
    assert started.returncode == 128 + signum, err
    assert err.strip().splitlines()[-1] == (f"error: stopped by {signame}; the runs in progress saved their state: run"
                                            " the same command again to go on")
    assert "got TERM" in _calls(copy)  # the training got the signal (it saves its run and records it interrupted)


def _gpu_checks(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """scripts/gpu_checks.sh from the repo root, with ``python3`` the project's Python (the GPU box's is)."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_checks.sh"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PATH": path, **env})


@pytest.mark.parametrize("script", [SCRIPT, MINI], ids=["benchmark_tasks", "mini_sweeps"])
def test_a_temp_dir_inside_a_run_dir_is_one_line_before_python_imports_torch(copy: Path, script: Path) -> None:
    """Probe 15, m79: the scripts' check of their Python imported torch with the temp dir given, which made torch's
    cache folder in the run dir before train.py refused the temp dir."""
    import sys

    shutil.copy(ROOT / "starting.py", copy / "repo" / "starting.py")
    run = copy / "runs" / "r"
    run.mkdir(parents=True)
    (run / "run.json").write_text("{}")
    done = _run(copy, "shift" if script == SCRIPT else "where", script=script, PY=sys.executable, TMPDIR=str(run))
    assert done.returncode == 2, done.stderr
    [error] = done.stderr.splitlines()
    assert error.startswith(f"error: TMPDIR={str(run)!r} lies in the run dir {run}"), error
    assert sorted(p.name for p in run.iterdir()) == ["run.json"]


def test_gpu_checks_out_inside_a_run_dir_is_one_line_before_anything(tmp_path: Path) -> None:
    """Probe 8, A40: ``OUT=<another run's dir>`` had the GPU checks write five files into that run. OUT is judged by
    the one destination rule first: exit 2, one line, nothing written."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "run.json").write_text('{"state": "finished"}')
    (run / "config.yaml").write_text("seed: 0\n")
    before = sorted(p.name for p in run.iterdir())
    done = _gpu_checks(["table6"], {"OUT": str(run / "out"), "TABLE6_DIR": str(tmp_path / "t6")})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"error: OUT='{run / 'out'}' is inside the run dir {run}, whose files"
                                                " are that run's; valid: a folder outside every run dir"]
    assert sorted(p.name for p in run.iterdir()) == before and not (tmp_path / "t6").exists()


def test_gpu_checks_with_a_python3_without_the_project_is_one_line(tmp_path: Path) -> None:
    """Probe 11, e21: with a python3 that lacks the project's packages the OUT check was a ten-line
    ModuleNotFoundError traceback. The script names the python3 it found, in one line, before anything."""
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").write_text("#!/bin/sh\nexit 1\n")  # imports nothing
    (bare / "python3").chmod(0o755)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_checks.sh")], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PATH": f"{bare}{os.pathsep}/usr/bin:/bin",
                                           "OUT": str(tmp_path / "out")})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: python3 ({bare / 'python3'}) cannot import torch, hydra, timm and lightning; valid: a python3 with"
        " the project installed first on PATH (e.g. PATH=$PWD/.venv/bin:$PATH), or its wheels in .whl/"]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_gpu_checks_table6_data_root_inside_a_run_dir_is_refused_before_generation(tmp_path: Path) -> None:
    """Probe 8, A39: ``table6 data.root=<inside another run>`` generated a COCO set there: the step's data step ran
    none of train.py's checks. train.py --check now runs first: exit 2, the check's line, nothing generated."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "run.json").write_text('{"state": "finished"}')
    (run / "config.yaml").write_text("seed: 0\n")
    done = _gpu_checks(["table6", f"data.root={run}/gen", "data.generator.num_train=32", "data.generator.num_val=16"],
                       {"OUT": str(tmp_path / "out"), "TABLE6_DIR": str(tmp_path / "t6"),
                        "TABLE6_TRAINER": "trainer=cpu", "TABLE6_SEEDS": "0"})
    assert done.returncode == 2, done.stderr
    assert f"data.root='{run}/gen' is inside the run dir {run}" in done.stderr
    assert not (run / "gen").exists() and not (tmp_path / "t6" / "runs").exists()


def test_gpu_checks_table6_evaluates_at_the_test_sets_precision_with_the_gpu_trainer() -> None:
    """trainer=gpu trains in bf16-mixed, which evaluate_testsets refuses for a test-set result (every column is
    measured at 32-true): the step's evaluation gives trainer.precision=32-true after its trainer, and that pair
    passes the check (the step's CPU test runs trainer=cpu, whose precision is 32-true anyway)."""
    from scripts.evaluate_testsets import check_whole_test_settings

    script = (ROOT / "scripts" / "gpu_checks.sh").read_text()
    [line] = [line for line in script.splitlines() if "--set \"$trainer\"" in line]
    assert line.split("--set \"$trainer\"", 1)[1].split()[0] == "trainer.precision=32-true", line
    with pytest.raises(ValueError, match="every test-set column is measured at 32-true"):
        check_whole_test_settings(["trainer=gpu"])
    check_whole_test_settings(["trainer=gpu", "trainer.precision=32-true"])


@pytest.mark.slow  # three tiny DETR runs trained and evaluated on the CPU
def test_gpu_checks_table6_trains_then_evaluates_every_run_on_the_fresh_test_set(tmp_path: Path) -> None:
    """The Table 6 step on the CPU, tiny: its lanes train the three rows of a seed, then each run is evaluated on
    shapes_coco_fresh (here a 16-image version of it, in a folder of its own), the test set its registered findings
    read; the summary gives each row's AP on its own val split and on the fresh images, and the runs come back
    with their results."""
    import json
    import tarfile

    out, work = tmp_path / "out", tmp_path / "t6"
    out.mkdir()
    done = _gpu_checks(["table6", "data.generator.num_train=32", "data.generator.num_val=16",
                        "trainer.limit_train_batches=2", "schedules.short.epochs=1", "schedules.short.lr_drop=1"],
                       {"OUT": str(out), "TABLE6_DIR": str(work), "TABLE6_TRAINER": "trainer=cpu",
                        "TABLE6_SEEDS": "0", "TABLE6_LANES": "1",
                        "TABLE6_EVAL": f"testset.data.generator.num_val=16 testset.data.root={tmp_path / 'fresh'}"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    runs = sorted((work / "runs" / "sweeps" / "detr_gpu").glob("*/"))
    assert len(runs) == 3
    for run in runs:
        result = json.loads((run / "testsets" / "shapes_coco_fresh.json").read_text())
        assert result["images_read"] == result["images_total"] == 16 and "val/AP" in result["metrics"]
    summary = (out / "table6_summary.txt").read_text()
    for row in ("sine_none_short", "sine_ctx9_short", "sine_ctxclip9_short"):
        line = next(line for line in summary.splitlines() if line.strip().startswith(row))
        assert "(n=1), fresh " in line and "fresh none" not in line, line
    with tarfile.open(out / "table6_runs.tar.gz") as archive:
        assert sum(name.endswith("testsets/shapes_coco_fresh.json") for name in archive.getnames()) == 3


@pytest.mark.parametrize("script", ["mini_sweeps.sh", "benchmark_tasks.sh", "gpu_checks.sh"])
def test_a_script_started_with_sh_is_one_line_asking_for_bash(script: str) -> None:
    """Probe 10, C126: ``sh scripts/mini_sweeps.sh where`` (sh is dash) stopped on dash's "set: Illegal option -o
    pipefail"; a script says it is bash's before bash's words."""
    import shutil
    import subprocess

    sh = shutil.which("dash") or shutil.which("sh")
    if sh is None or "bash" in Path(sh).resolve().name:
        pytest.skip("no sh other than bash here")
    done = subprocess.run([sh, str(ROOT / "scripts" / script), "where"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 2 and done.stdout == ""
    path = ROOT / "scripts" / script
    assert done.stderr == f"error: {path} is a bash script; valid: bash {path} ...\n"


@pytest.mark.parametrize("script", [SCRIPT, MINI])
@pytest.mark.parametrize("words", [("-h",), ("--help",), ("shift", "--help")])
def test_help_prints_the_scripts_header_and_runs_nothing(copy: Path, script: Path, words: tuple[str, ...]) -> None:
    """Probe 16, o73/o74: ``-h`` was refused as a task name. It prints the header comment (usage, settings, outputs)
    from a relative start through a link too, exit 0, before any setting is judged (PY is not even set)."""
    link = copy / "elsewhere.sh"
    link.symlink_to(copy / "repo" / "scripts" / script.name)
    done = _run(copy, *words, started=Path("elsewhere.sh"), cwd=copy)
    assert done.returncode == 0 and done.stderr == ""
    header = [line[2:] if line.startswith("# ") else line[1:] for line in script.read_text().splitlines()[1:]]
    header = header[:next(i for i, line in enumerate(header) if line.startswith("bash's own features follow"))]
    assert done.stdout.splitlines() == header and any(line.startswith("Usage: bash scripts/") for line in header)
    assert not _calls(copy) and not (copy / "repo" / "runs").exists()


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_gpu_checks_and_the_sourced_checks_answer_help(flag: str, tmp_path: Path) -> None:
    """Probe 18, t34: ``gpu_checks.sh -h`` was refused as an unknown step, and ``script_checks.sh`` (sourced by the
    other scripts) did nothing, exit 0, whatever it was given."""
    done = _gpu_checks([flag], {"OUT": str(tmp_path / "out")})
    assert done.returncode == 0 and done.stderr == "", done.stderr
    header = (ROOT / "scripts" / "gpu_checks.sh").read_text().splitlines()
    assert done.stdout.splitlines()[0] == header[1].removeprefix("# ")
    assert "table6" in done.stdout and not (tmp_path / "out").exists()
    checks = ROOT / "scripts" / "script_checks.sh"
    helped = subprocess.run(["bash", str(checks), flag], capture_output=True, text=True, timeout=30)
    assert helped.returncode == 0 and helped.stdout.startswith("The up-front checks of scripts/benchmark_tasks.sh")
    alone = subprocess.run(["bash", str(checks)], capture_output=True, text=True, timeout=30)
    assert alone.returncode == 2 and alone.stderr.startswith(f"error: {checks} is sourced by"), alone.stderr
