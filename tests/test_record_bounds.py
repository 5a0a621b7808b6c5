"""Run files a user cannot have meant, each one line naming the path (never a traceback), and one run dir per run:

- JSON records are read within bounds (size, nesting depth): a record nested 200000 deep was a RecursionError
  in every reader, and make_tables then built no table at all;
- the data layer reads its completion markers by the same bounds without importing models (no package
  imports one above it);
- a folder this user may not read, and a log dir through a symlink loop, are one line;
- a run without ``run_name`` leaves only its own run dir (the dir checked before Hydra starts is the run's).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lifecycle.cli as cli
from data import DataConfigError
from data.bounded_json import MAX_JSON_BYTES, MAX_JSON_DEPTH, json_depth_exceeds
from data.generation import MARKER_NAME, read_marker
from lifecycle.records import read_run_record, run_status
from scripts import archive_runs
from storage.files import RunFileError, read_json
from tests.helpers import SMALL_RELATIONAL, compose_config, file_modes_hold, run_cli
from tests.test_tables_faults import K, _assert_sound_cells, _runs_by_path, _sound_runs, _sweep_with_multirun, _tables

DEEP = "[" * 200000 + "]" * 200000  # what a damaged or hostile record may hold
TINY = ["debug=fast", "logger=csv", *SMALL_RELATIONAL, "trainer.limit_train_batches=3", "trainer.limit_val_batches=1"]
ENV = {"OMP_NUM_THREADS": "1"}


def _error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


# ----------------------------------------------------------------------------- bounded JSON records
@pytest.mark.parametrize(("content", "reason"), [
    (DEEP.encode(), f"nested deeper than {MAX_JSON_DEPTH} levels"),
    (b'{"a":' * (MAX_JSON_DEPTH + 1) + b"1" + b"}" * (MAX_JSON_DEPTH + 1), f"nested deeper than {MAX_JSON_DEPTH}"),
    (b"\xff\xfe\x00", "not valid JSON (not text"),  # undecodable bytes: once an AttributeError
    # probe 15, n112-n116: valid JSON, but Python's int conversion refused it in an unnamed line
    (b'{"big": ' + b"7" * 5000 + b"}", "it holds an integer of more than"),
], ids=["arrays", "objects", "not_text", "huge_integer"])
def test_a_record_past_the_bounds_is_one_line_naming_it(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "metrics.json"
    path.write_bytes(content)
    with pytest.raises(RunFileError) as err:
        read_json(path)
    assert str(err.value).startswith(f"{path} is damaged: {reason}") and "\n" not in str(err.value)


def test_records_within_the_bounds_read_as_before(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    nested = "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)
    path.write_text(json.dumps({"deep": json.loads(nested), "text": "[[[{{" * 1000, "quote": 'a\\"[[' * 500}))
    assert read_json(path)["text"] == "[[[{{" * 1000  # brackets inside strings do not nest
    assert json_depth_exceeds(json.dumps(json.loads(nested)), MAX_JSON_DEPTH - 1) is False
    assert json_depth_exceeds("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, MAX_JSON_DEPTH - 1) is True


def test_a_record_larger_than_the_limit_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "failed.json"
    path.write_bytes(b'{"error": "' + b"x" * MAX_JSON_BYTES + b'"}')
    with pytest.raises(RunFileError, match=rf"^{path} is damaged: larger than 16 MiB \({MAX_JSON_BYTES + 13} bytes\)"):
        read_json(path)


def test_a_deep_run_json_is_an_unreadable_run_and_the_tables_keep_the_others(tmp_path: Path) -> None:
    """make_tables names the damaged runs (run.json and metrics.json) and builds the table of the intact ones."""
    runs = tmp_path / "runs"
    _sound_runs(runs)
    for name, file in (("deep_record", "run.json"), ("deep_metrics", "metrics.json")):
        damaged = runs / name
        shutil.copytree(runs / f"{K},seed=0", damaged)
        (damaged / file).write_text(DEEP)
        with pytest.raises(RunFileError, match="nested deeper than"):
            read_run_record(damaged) if file == "run.json" else read_json(damaged / file)
        assert run_status(damaged).state == "unreadable"
    tables = _tables(runs)
    _assert_sound_cells(tables["where_mini"])
    by_name = _runs_by_path(tables)
    for name, file in (("deep_record", "run.json"), ("deep_metrics", "metrics.json")):
        assert by_name[name].status == "unreadable"
        assert by_name[name].error == f"{runs / name / file} is damaged: nested deeper than {MAX_JSON_DEPTH} levels," \
                                      " which no record this project writes is"


def test_archive_refuses_a_deep_record_in_one_line(tmp_path: Path, capsys) -> None:
    sweep = _sweep_with_multirun(tmp_path / "runs")
    (sweep / f"{K},seed=1" / "run.json").write_text(DEEP)
    capsys.readouterr()
    assert archive_runs.main([str(sweep), "--to", str(tmp_path / "archive")]) == 2
    line = _error_line(capsys.readouterr().err)
    assert f"{sweep / f'{K},seed=1' / 'run.json'} is damaged: nested deeper than" in line
    assert not (tmp_path / "archive").exists()


def test_a_deep_completion_marker_is_damaged(tmp_path: Path) -> None:
    (tmp_path / MARKER_NAME).write_text(DEEP)
    with pytest.raises(DataConfigError, match=r"completion marker .* is damaged \(nested deeper than"):
        read_marker(tmp_path)
    (tmp_path / MARKER_NAME).write_text('{"generator": ' + "7" * 5000 + "}")  # probe 15, n116
    with pytest.raises(DataConfigError, match=r"completion marker .* is damaged \(it holds an integer of more than"):
        read_marker(tmp_path)


# Which top-level packages each package may import: rpe <- data <- models <- scripts, never upwards (the bounded
# JSON reader lives in data.bounded_json so that data.generation reads its marker without lifecycle).
FORBIDDEN_IMPORTS = {"rpe": {"data", "models", "scripts"}, "data": {"models", "scripts"}, "models": {"scripts"}}


def test_no_package_imports_one_above_it() -> None:
    import ast

    root = Path(__file__).resolve().parents[1]
    upward = []
    for package, forbidden in FORBIDDEN_IMPORTS.items():
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):  # function-level imports too
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                upward += [f"{path.relative_to(root)}: {n}" for n in names if n.split(".")[0] in forbidden]
    assert upward == []


# ----------------------------------------------------------------------------- a run without run_name
@pytest.fixture(scope="module")
def unnamed_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> tuple[Path, list[str]]:
    """A finished tiny run started without run_name, and the settings (but run_name) that made it."""
    log_dir = tmp_path_factory.mktemp("unnamed")
    args = [*TINY, f"paths.log_dir={log_dir}", f"paths.data_dir={data_dir}"]
    result = run_cli("train.py", args, env_extra=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    return log_dir, args


@pytest.mark.slow
def test_a_run_without_run_name_leaves_only_its_own_run_dir(unnamed_run: tuple[Path, list[str]]) -> None:
    log_dir, _ = unnamed_run
    [name] = list(log_dir.iterdir())  # ${name}: deit_micro_irpe_k
    [run_dir] = list(name.iterdir())  # ${now:...}: one dir, the one the run wrote (none checked and left empty)
    assert (run_dir / "run.json").is_file() and (run_dir / "metrics.json").is_file()
    overrides = (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert f"run_name='{name.name}/{run_dir.name}'" in overrides  # pinned for Hydra by the command-line check


@pytest.mark.parametrize("value", ["a/b_2026-12-04_03-35-40", "it's", "a\\'b", "end\\", "${name}x", "x y,z=[1]"])
def test_a_pinned_name_reads_back_as_given(value: str, tmp_path: Path, data_dir: Path) -> None:
    cfg = compose_config([cli.quoted_override("run_name", value)], tmp_path, data_dir)
    assert cfg.run_name == value


def test_a_sweep_dir_with_a_timestamp_is_pinned_to_the_checked_dir(tmp_path: Path, data_dir: Path) -> None:
    pins = cli.check_overrides(["-m", "seed=0,1", f"paths.log_dir={tmp_path}", f"paths.data_dir={data_dir}",
                                *SMALL_RELATIONAL], "train")
    [made] = list((tmp_path / "multirun").iterdir())
    assert pins == {"hydra.sweep.dir": f"hydra.sweep.dir='{tmp_path}/multirun/{made.name}'"}
    assert cli.check_overrides(["seed=0", f"paths.log_dir={tmp_path}", "run_name=fixed"], "train") == {}


# ----------------------------------------------------------------------------- unreadable folders, link loops
def _without_permission_override() -> list[str]:
    """A command prefix under which file modes hold (root reads a mode-000 folder otherwise): root drops its
    capabilities to override them (setpriv), another user needs none."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: a mode-000 folder would be readable, nothing to test")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]


@pytest.mark.slow  # two more processes; the fault matrix's "mode 000" rows check the same in-process in make test
def test_an_unreadable_checkpoints_folder_is_one_line(unnamed_run: tuple[Path, list[str]], tmp_path: Path) -> None:
    log_dir, args = unnamed_run
    [record] = list(log_dir.rglob("run.json"))
    copy = tmp_path / "runs" / "locked"
    shutil.copytree(record.parent, copy)
    (copy / "checkpoints").chmod(0)
    prefix = _without_permission_override()
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, **ENV}
    env.pop("HYDRA_FULL_ERROR", None)
    try:
        # train.py cannot tell whether the folder holds another run; plot_rpe.py cannot look at its checkpoint
        commands = {
            copy / "checkpoints": [sys.executable, str(root / "train.py"),
                                   *[a for a in args if not a.startswith("paths.log_dir=")],
                                   f"paths.log_dir={tmp_path / 'runs'}", "run_name=locked"],
            copy / "checkpoints" / "best.ckpt": [sys.executable, str(root / "scripts" / "plot_rpe.py"), str(copy),
                                                 "--out", str(tmp_path / "p")],
        }
        for unreadable, command in commands.items():
            result = subprocess.run([*prefix, *command], cwd=root, env=env, capture_output=True, text=True,
                                    timeout=300)
            assert result.returncode == 2, result.stderr[-3000:]
            assert _error_line(result.stderr) == (f"error: cannot read {unreadable}: permission denied"
                                                  " (read-only storage, or a file or folder of the path this user"
                                                  " may not use)")
    finally:
        (copy / "checkpoints").chmod(0o755)


@pytest.mark.parametrize("below", ["", "x"])
def test_a_log_dir_through_a_symlink_loop_is_one_line(tmp_path: Path, below: str) -> None:
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    folder = tmp_path / "a" / below / "run" if below else tmp_path / "a" / "run"
    with pytest.raises(cli.CommandLineError) as err:
        cli.prepare_output_dir(str(folder), cli.RUN_DIR_KEY)
    assert str(err.value) == (f"paths.log_dir/run_name={str(folder)!r} cannot be used: {tmp_path / 'a'} is a"
                              " symlink loop (its links lead back to themselves); valid: a folder whose path has no"
                              " link loop")


@pytest.mark.slow  # a second train.py run: the one-line readers above cover the rest of make test's share
def test_train_rebuilds_a_deep_run_json_from_its_config(unnamed_run: tuple[Path, list[str]], tmp_path: Path) -> None:
    log_dir, args = unnamed_run
    [record] = list(log_dir.rglob("run.json"))
    copy = tmp_path / "runs" / "deep"
    shutil.copytree(record.parent, copy)
    (copy / "run.json").write_text(DEEP)
    result = run_cli("train.py", [*[a for a in args if not a.startswith("paths.log_dir=")],
                                  f"paths.log_dir={tmp_path / 'runs'}", "run_name=deep"], env_extra=ENV)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"note: {copy / 'run.json'} is damaged: nested deeper than {MAX_JSON_DEPTH} levels" in result.stdout
    assert read_run_record(copy)["state"] == "finished"  # rebuilt from config.yaml, which names this run


def test_a_sparse_config_or_kept_grid_is_never_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 9, B105, B106: a 2 GiB sparse ``config.yaml`` (beside another run's run.json) was read whole by
    make_tables and train.py (5 GB of memory), and a sparse kept ``multirun.0.yaml`` by every relaunch of its
    sweep (3 GB, without a word). Both are read within the records' bound: the config counts as unreadable, the
    kept grid is one line before the sweep starts."""
    import os

    from lifecycle import cli
    from lifecycle.console import CommandLineError
    from lifecycle.records import config_file_identity

    def whole(*_: object, **__: object) -> None:
        raise AssertionError("read whole")

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 0\n")
    os.truncate(run / "config.yaml", 2 * 2**30)
    monkeypatch.setattr(Path, "read_text", whole)
    monkeypatch.setattr(Path, "read_bytes", whole)
    assert config_file_identity(run) is None
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_bytes(b"hydra: {}\n")
    (sweep / "multirun.0.yaml").write_bytes(b"")
    os.truncate(sweep / "multirun.0.yaml", 2 * 2**30)
    with pytest.raises(CommandLineError, match=r"multirun\.0\.yaml is damaged: larger than 1 MiB"):
        cli.keep_earlier_grid(sweep)
    monkeypatch.undo()
    (sweep / "multirun.0.yaml").write_bytes(b"hydra: {}\n")
    (sweep / "multirun.0.yaml").chmod(0o000)  # probe 9, B113: the unreadable kept grid is named, not multirun.yaml
    with file_modes_hold(), pytest.raises(CommandLineError, match=r"cannot read \S*/multirun\.0\.yaml: permission"):
        cli.keep_earlier_grid(sweep)
    assert sorted(p.name for p in sweep.iterdir()) == ["multirun.0.yaml", "multirun.yaml"]


def test_a_checkpoint_this_user_may_not_read_is_named_as_such(tmp_path: Path) -> None:
    """Probe 10, D23: a mode-000 best.ckpt was "not a readable PyTorch checkpoint (corrupt, truncated, ...:
    PermissionError)": the file is sound, the permission is the problem."""
    import torch

    from models.checkpoint_files import read_checkpoint_file

    path = tmp_path / "best.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, path)
    path.chmod(0o000)
    with file_modes_hold(), pytest.raises(ValueError) as err:
        read_checkpoint_file(path, error=ValueError)
    assert str(err.value) == (f"checkpoint {path} cannot be read: permission denied; valid: a checkpoint this user"
                              " may read")


def test_a_large_but_valid_grid_is_one_line_in_seconds(tmp_path: Path) -> None:
    """Probe 10, D45: a 12.5 MB ``multirun.yaml`` of valid YAML (under the JSON records' 16 MiB) kept make_tables
    parsing for minutes. A run's or sweep's YAML record is a few KiB: over 1 MiB it is damaged."""
    from reports.collect import TableError, expected_jobs

    sweep = tmp_path / "sw"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra: {}\n" + "".join(f"k{i}: {i}\n" for i in range(150000)))
    with pytest.raises(TableError, match=r"multirun\.yaml is damaged: larger than 1 MiB"):
        expected_jobs(sweep)


def test_a_run_config_past_the_yaml_bound_is_one_line_in_every_reader(tmp_path: Path) -> None:
    """Probe 11, F7b-d: a ``config.yaml`` of 1.5 MB (a valid config with a long comment) was refused by make_tables
    (over the YAML records' 1 MiB) but read by eval.py, plot_rpe and evaluate_testsets, which wrote a result into
    a run the tables call unreadable. The run-config reader keeps the same bound."""
    from data.bounded_json import MAX_YAML_BYTES
    from lifecycle.run_config import RunConfigError, load_run_config

    config = tmp_path / "config.yaml"
    body = "data:\n  _target_: data.RelationalDataModule\nmodel:\n  _target_: models.ClassificationModule\n"
    config.write_text(body + "# " + "x" * MAX_YAML_BYTES + "\n")
    with pytest.raises(RunConfigError, match=r"config\.yaml is not a readable run config: larger than 1 MiB"):
        load_run_config(config)
