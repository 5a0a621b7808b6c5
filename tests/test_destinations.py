"""One rule for where anything may be written (models/lifecycle/destinations.py), on the commands that write:
a run or sweep dir, a data or test-set root, a table and an archive never land inside another run, inside a
data root, or through a link that leads out of their folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import models.lifecycle.cli as cli
from models.lifecycle.destinations import DestinationError, check_destination, check_no_links_below
from tests.test_sweeps import _fake_sweep


def _finished_run(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"state": "finished"}))
    return folder


def _data_root(folder: Path) -> Path:
    (folder / "train" / "a").mkdir(parents=True)
    (folder / ".complete.json").write_text("{}")
    return folder


def test_the_rule_reads_the_real_path(tmp_path: Path) -> None:
    run = _finished_run(tmp_path / "runs" / "base0")
    data = _data_root(tmp_path / "data")
    (tmp_path / "via").symlink_to(run, target_is_directory=True)
    for path, kind in ((run / "data", "is inside the run dir"), (tmp_path / "via" / "x", "is inside the run dir"),
                       (run, "is the run dir"), (data / "train", "is inside the data root"),
                       (data, "is the data root")):
        with pytest.raises(DestinationError, match=f"{kind} "):
            check_destination(path, "dest")
    check_destination(run, "hydra.run.dir", run_dir=True)  # a rerun writes into its own dir
    check_destination(data, "data.root", data_root=True)  # generation completes its own root
    with pytest.raises(DestinationError, match="is inside the data root"):
        check_destination(data / "sub", "data.root", data_root=True)  # a dataset inside another
    with pytest.raises(DestinationError, match="is inside the data root"):  # no marker: the config's own root
        check_destination(tmp_path / "imagenet" / "train" / "run", "hydra.run.dir", run_dir=True,
                          data_roots=[tmp_path / "imagenet"])
    assert check_destination(tmp_path / "runs" / "new", "hydra.run.dir", run_dir=True) == tmp_path / "runs" / "new"


def test_archived_runs_and_sweep_grids_are_never_destinations(tmp_path: Path) -> None:
    """Probe 5 (read from the code): a job of the committed mini archive holds config.yaml and metrics.json but no
    run record or checkpoints, so it passed for no run dir; and a sweep's multirun.yaml could be written over."""
    job = tmp_path / "arch" / "where_mini" / "rpe.preset=none,seed=0"
    job.mkdir(parents=True)
    (job / "config.yaml").write_text("a: 1\n")
    (job / "metrics.json").write_text("{}")
    (job.parent / "multirun.yaml").write_text("hydra: {}\n")
    with pytest.raises(DestinationError, match=f"is inside the run dir {job}, whose files are that run's"):
        check_destination(job / "metrics.json", "--json")
    for grid in ("multirun.yaml", "multirun.2.yaml"):
        (job.parent / grid).write_text("hydra: {}\n")
        with pytest.raises(DestinationError) as err:
            check_destination(job.parent / grid, "--out")
        assert str(err.value) == (f"--out={str(job.parent / grid)!r} is the grid record of the sweep {job.parent},"
                                  " which its tables and reruns read; valid: a file or folder of its own")
    check_destination(job.parent / "multirun.png", "--out")  # beside the grid: a file of its own
    (job / "metrics.json").unlink()
    check_destination(job / "x.json", "--json")  # a config alone is no run


def test_no_write_through_a_link_below_the_destination(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "arch").mkdir()
    (tmp_path / "arch" / "sw1").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(DestinationError, match=r"arch/sw1 is a symlink \(to .*elsewhere\)"):
        check_no_links_below(tmp_path / "arch", tmp_path / "arch" / "sw1" / "0" / "config.yaml", "--to")
    check_no_links_below(tmp_path / "arch", tmp_path / "arch" / "sw2" / "0" / "config.yaml", "--to")


@pytest.mark.parametrize("case", ["data_root_in_run", "sweep_dir_is_run", "run_dir_in_data_root"])
def test_train_refuses_to_write_into_a_run_or_a_data_root(tmp_path: Path, case: str) -> None:
    run = _finished_run(tmp_path / "runs" / "base0")
    data = _data_root(tmp_path / "data" / "relational_v2")
    args = {
        "data_root_in_run": ["debug=fast", f"data.root={run / 'data'}", f"paths.log_dir={tmp_path / 'runs'}"],
        "sweep_dir_is_run": ["-m", "debug=fast", "seed=0,1", f"hydra.sweep.dir={run}",
                             f"paths.data_dir={tmp_path / 'data'}"],
        "run_dir_in_data_root": ["debug=fast", f"paths.log_dir={data / 'train'}",
                                 f"paths.data_dir={tmp_path / 'data'}"],
    }[case]
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_overrides(args, "train")
    message = str(err.value)
    assert "\n" not in message and ("valid: a folder outside every run dir" in message
                                    or "valid: a folder outside every data root" in message), message
    assert not (run / "data").exists() and sorted(p.name for p in run.iterdir()) == ["run.json"]
    assert sorted(p.name for p in (data / "train").iterdir()) == ["a"]


def test_a_test_set_root_inside_a_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from scripts import generate_testsets

    run = _finished_run(tmp_path / "runs" / "base0")
    code = generate_testsets.main(["relational_right", "--set", f"paths.data_dir={tmp_path / 'data'}",
                                   f"testset.data.root={run / 'tsdata'}"])
    err = capsys.readouterr().err
    assert code != 0 and f"is inside the run dir {run}" in err and "Traceback" not in err, err
    assert sorted(p.name for p in run.iterdir()) == ["run.json"]  # no data, no generation lock beside it


def test_a_data_root_no_command_line_check_saw_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    """A sweep's later value of data.root, and a data root inside the job's own run dir (not a run dir yet
    when the command line is checked): refused before its folders or its generation lock
    (``.<root>.lock`` beside it) are made."""
    from data.generation import generation_lock, lock_path
    from models.lifecycle import job
    from tests.helpers import compose_config

    run = _finished_run(tmp_path / "runs" / "base0")
    ok = tmp_path / "data" / "ok"
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_overrides(["-m", "debug=fast", f"data.root={ok},{run / 'data'}",
                             f"paths.log_dir={tmp_path / 'runs'}"], "train")
    assert str(err.value) == (f"the sweep's job with data.root={run / 'data'}: data.root={str(run / 'data')!r} is"
                              f" inside the run dir {run}, whose files are that run's; valid: a folder outside every"
                              " run dir")
    own = tmp_path / "runs" / "own"
    with pytest.raises(DestinationError, match=f"^data.root={str(own / 'data')!r} is inside the run dir {own},"):
        job.run(compose_config(["debug=fast", f"data.root={own / 'data'}"], own, tmp_path / "data"))
    assert sorted(p.name for p in run.iterdir()) == ["run.json"]
    assert not (own / "data").exists() and not ok.exists()
    locks = [p for p in tmp_path.rglob("*.lock") if p.name != "run.lock"]
    assert locks == [], locks
    with generation_lock(own / "data"):  # the name of that lock, so the check above can fail
        assert lock_path(own / "data").is_file()


def test_tables_and_archives_stay_out_of_runs_and_links(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from scripts import archive_runs, make_tables

    sweep = _fake_sweep(tmp_path / "runs")
    run = sweep / "seed=0"  # a run dir: its config beside its checkpoints
    assert make_tables.main([str(sweep), "--out", str(run / "tables" / "t")]) == 2
    assert f"is inside the run dir {run}" in capsys.readouterr().err and not (run / "tables").exists()
    # probe 4 case 68: the line quotes the --out typed, not the folder it writes into
    data = _data_root(tmp_path / "data")
    assert make_tables.main([str(sweep), "--out", str(data / "tab")]) == 2
    assert f"--out='{data / 'tab'}' is inside the data root {data}," in capsys.readouterr().err
    assert sorted(p.name for p in data.iterdir()) == [".complete.json", "train"]

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "arch").mkdir()
    (tmp_path / "arch" / sweep.name).symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert archive_runs.main([str(sweep), "--to", str(tmp_path / "arch")]) == 2
    assert "is a symlink" in capsys.readouterr().err
    assert not any((tmp_path / "elsewhere").iterdir())


def test_a_run_whose_record_is_not_a_plain_file_is_still_a_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Probe 3 (cases 128, 129, same class): a FIFO as run.json made ``is_file()`` false, so its run dir was taken
    for a place to write the tables into; a record is there whatever it is, and is never opened here."""
    from scripts import make_tables

    sweep = _fake_sweep(tmp_path / "runs")
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    os.mkfifo(damaged / "run.json")
    assert make_tables.main([str(sweep), "--out", str(damaged / "t")]) == 2
    message = capsys.readouterr().err
    assert f"--out='{damaged / 't'}' is inside the run dir {damaged}, whose files are that run's" in message
    assert sorted(p.name for p in damaged.iterdir()) == ["run.json"]


def test_a_folder_that_cannot_be_looked_into_is_never_taken_for_empty(tmp_path: Path) -> None:
    """``os.path.lexists`` calls anything behind an unreadable folder absent: a run dir in a mode-000 folder
    passed for none, a checkpoint in one for missing. The lifecycle's presence checks raise instead."""
    from models.lifecycle.destinations import is_run_dir
    from models.lifecycle.files import RunFileError, entry_exists, plain_file_exists
    from tests.helpers import file_modes_hold

    locked = _finished_run(tmp_path / "locked")
    (locked / "best.ckpt").write_bytes(b"x")
    assert entry_exists(locked / "run.json") and not entry_exists(locked / "none")
    assert not entry_exists(locked / "run.json" / "below")  # a file where a folder would be: nothing there
    locked.chmod(0)
    try:
        with file_modes_hold():
            assert not os.path.lexists(locked / "run.json")  # what the checks must not rely on
            with pytest.raises(PermissionError):
                entry_exists(locked / "run.json")
            with pytest.raises(PermissionError):
                is_run_dir(locked)
            with pytest.raises(RunFileError, match="best.ckpt: permission denied"):
                plain_file_exists(locked / "best.ckpt")
    finally:
        locked.chmod(0o755)


def test_readme_inside_a_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from scripts import make_tables

    sweep = _fake_sweep(tmp_path / "runs")
    notes = sweep / "seed=0" / "NOTES.md"
    notes.write_text("mine\n")
    assert make_tables.main([str(sweep), "--readme", str(notes)]) == 2
    assert f"is inside the run dir {sweep / 'seed=0'}" in capsys.readouterr().err
    assert notes.read_text() == "mine\n"


# a few hundred bytes that a YAML loader expands into 10^9 list items
ALIAS_BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10))


@pytest.mark.parametrize("name", ["config.yaml", ".hydra/overrides.yaml", "../multirun.yaml"])
@pytest.mark.parametrize(("damage", "reason"), [("deep", "nested deeper than 100 levels"),
                                                ("aliases", "it uses a YAML alias")])
def test_a_deeply_nested_or_aliased_yaml_file_is_one_line(tmp_path: Path, name: str, damage: str, reason: str,
                                                          capsys: pytest.CaptureFixture) -> None:
    """Read as parser events first: neither a deep nesting nor an alias bomb is ever built."""
    from scripts import archive_runs, make_tables

    sweep = _fake_sweep(tmp_path / "runs")
    text = "a: " + "[" * 100000 + "]" * 100000 + "\n" if damage == "deep" else ALIAS_BOMB
    (sweep / "seed=0" / name).write_text(text)
    assert make_tables.main([str(sweep)]) in (0, 2)
    assert archive_runs.main([str(sweep), "--to", str(tmp_path / "arch")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and reason in err, err


def test_an_aliased_run_config_is_refused_by_eval(tmp_path: Path) -> None:
    from models.run_config import RunConfigError, load_run_config

    (tmp_path / "config.yaml").write_text(ALIAS_BOMB)
    with pytest.raises(RunConfigError, match="is not a readable run config: it uses a YAML alias"):
        load_run_config(tmp_path / "config.yaml")
