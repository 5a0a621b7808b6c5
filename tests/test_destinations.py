"""One rule for where anything may be written (storage/destinations.py), on the commands that write:
a run or sweep dir, a data or test-set root, a table and an archive never land inside another run, inside a
data root, or through a link that leads out of their folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import lifecycle.cli as cli
from storage.destinations import DestinationError, check_destination, check_no_links_below
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
    assert code == 2 and f"is inside the run dir {run}" in err and "Traceback" not in err, err
    assert err.startswith("error: relational_right: testset.data.root=") and err.count("\n") == 1, err
    assert sorted(p.name for p in run.iterdir()) == ["run.json"]  # no data, no generation lock beside it


def test_a_data_root_no_command_line_check_saw_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    """A sweep's later value of data.root, and a data root inside the job's own run dir (not a run dir yet
    when the command line is checked): refused before its folders or its generation lock
    (``.<root>.lock`` beside it) are made."""
    from data.generation import generation_lock, lock_path
    from lifecycle import job
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


def test_a_linked_job_folder_of_the_archive_is_refused_before_any_write(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    """Probe 18, r12b: a job folder of the archive linked to a live job was refused only when its turn came,
    after ``.archive.json``, ``multirun.yaml`` and the earlier jobs were rewritten (a partly updated archive).
    Every destination is checked first: the archive is left byte for byte, and mtime for mtime, as it was."""
    from scripts import archive_runs

    sweep = _fake_sweep(tmp_path / "runs")
    archive = tmp_path / "arch"
    assert archive_runs.main([str(sweep), "--to", str(archive)]) == 0
    live = tmp_path / "live" / "seed=1"  # a job of another sweep, still running
    live.mkdir(parents=True)
    (live / "run.json").write_text(json.dumps({"state": "running"}))
    (live / "config.yaml").write_text("seed: 99\n")  # another config: the link is named first (probe 18, t31)
    linked = archive / sweep.name / "seed=1"
    for file in linked.rglob("*"):
        file.unlink() if file.is_file() else None
    for folder in sorted(linked.rglob("*"), reverse=True):
        folder.rmdir()
    linked.rmdir()
    linked.symlink_to(live, target_is_directory=True)
    # what a second sitting would rewrite: an earlier job's result and the grid
    (sweep / "seed=0" / "metrics.json").write_text(json.dumps({"val/top1": 92.0}))
    (sweep / "multirun.yaml").write_text((sweep / "multirun.yaml").read_text() + "# relaunched\n")
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (archive / sweep.name).rglob("*")
              if p.is_file() and live not in p.resolve().parents}
    assert archive / sweep.name / "seed=0" / "metrics.json" in before
    assert archive_runs.main([str(sweep), "--to", str(archive)]) == 2
    assert f"error: --to: {linked} is a symlink (to {live})" in capsys.readouterr().err
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (archive / sweep.name).rglob("*")
             if p.is_file() and live not in p.resolve().parents}
    assert after == before
    assert sorted(p.name for p in live.iterdir()) == ["config.yaml", "run.json"]


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
    from storage.destinations import is_run_dir
    from storage.files import RunFileError, entry_exists, plain_file_exists
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
    from lifecycle.run_config import RunConfigError, load_run_config

    (tmp_path / "config.yaml").write_text(ALIAS_BOMB)
    with pytest.raises(RunConfigError, match="is not a readable run config: it uses a YAML alias"):
        load_run_config(tmp_path / "config.yaml")


def test_a_single_run_is_never_made_inside_a_sweep_dir(tmp_path: Path) -> None:
    """A run given a sweep dir as its log dir (or a run name below one) was pooled into the sweep's cell by the tables
    and archived as one of its jobs, though the sweep's grid never named it: one line, nothing made."""
    sweep = _fake_sweep(tmp_path / "runs")
    before = sorted(p.relative_to(sweep) for p in sweep.rglob("*"))
    for log_dir, name in ((sweep, "extra"), (sweep / "more", "extra"), (tmp_path / "runs", "where_mini/x/extra")):
        with pytest.raises(cli.CommandLineError) as err:
            cli.check_overrides(["debug=fast", f"paths.log_dir={log_dir}", f"run_name={name}", "seed=5"], "train")
        assert str(err.value) == (f"run_name={name!r} with paths.log_dir={str(log_dir)!r} puts a single run into the"
                                  f" sweep dir {sweep}, whose tables and archives would count it as one of the"
                                  " sweep's jobs (its multirun.yaml never named it); valid: a paths.log_dir outside"
                                  " every sweep dir (a further job of the sweep: its -m command with the new value)")
    (tmp_path / "via").symlink_to(sweep, target_is_directory=True)  # the real path counts
    with pytest.raises(cli.CommandLineError, match="puts a single run into the sweep dir"):
        cli.check_run_location("extra", tmp_path / "via")
    assert sorted(p.relative_to(sweep) for p in sweep.rglob("*")) == before
    cli.check_run_location("extra", tmp_path / "runs")  # beside the sweep: a run of its own


def test_a_folder_link_inside_a_run_dir_is_refused_as_a_link(tmp_path: Path) -> None:
    """A run's ``csv/version_0`` replaced by a link to another run was refused as "holds other runs", with a nested
    run name as the remedy; the link is named as a link, and a link to a folder of the run's own (W&B's latest-run)
    is no reason to refuse."""
    other = _finished_run(tmp_path / "runs" / "d1")
    (tmp_path / "runs" / "c51" / "csv").mkdir(parents=True)
    link = tmp_path / "runs" / "c51" / "csv" / "version_0"
    link.symlink_to(other, target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    for target in (other, tmp_path / "elsewhere"):  # a run, or any folder outside
        link.unlink()
        link.symlink_to(target, target_is_directory=True)
        with pytest.raises(cli.CommandLineError) as err:
            cli.check_overrides(["debug=fast", f"paths.log_dir={tmp_path / 'runs'}", "run_name=c51"], "train")
        assert str(err.value) == (f"run_name='c51': {link} inside the run dir is a symlink (to {target}) that leads"
                                  " out of it, and the run would write through it elsewhere; valid: replace the link"
                                  " with what it stands for (a real folder or file), or move it away")
    link.unlink()
    (link.parent / "metrics.csv").symlink_to(other / "run.json")  # a file the logger would append to
    with pytest.raises(cli.CommandLineError, match="metrics.csv inside the run dir is a symlink"):
        cli.check_run_location("c51", tmp_path / "runs")
    (link.parent / "metrics.csv").unlink()
    assert sorted(p.name for p in other.iterdir()) == ["run.json"]
    (tmp_path / "runs" / "c51" / "wandb" / "run-1").mkdir(parents=True)
    (tmp_path / "runs" / "c51" / "wandb" / "latest-run").symlink_to("run-1", target_is_directory=True)
    cli.check_run_location("c51", tmp_path / "runs")

def _hand_root(folder: Path, classes: tuple[str, ...] = ("0_E", "1_W")) -> Path:
    """A dataset made by hand: ImageFolder's layout, no generator marker."""
    for split in ("train", "val"):
        for name in classes:
            (folder / split / name).mkdir(parents=True)
            (folder / split / name / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    return folder


def _tree(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def test_a_dataset_is_known_by_its_layout_without_a_marker(tmp_path: Path) -> None:
    """A hand-made (or downloaded) dataset has no generator marker: its train/ or val/ of class folders of
    images, or COCO's image folders beside their annotations, make it a data root all the same."""
    from storage.destinations import is_data_root

    hand = _hand_root(tmp_path / "hand")
    for path in (hand / "train" / "9_plots", hand / "val" / "9_gen", hand / "train" / "0_E" / "tab", hand / "train",
                 hand / "notes"):
        with pytest.raises(DestinationError, match=f"^--out={str(path)!r} is inside the data root {hand}, where"):
            check_destination(path, "--out")
    with pytest.raises(DestinationError, match=f"^--out={str(hand)!r} is the data root {hand},"):
        check_destination(hand, "--out")
    check_destination(hand, "data.root", data_root=True)  # a data root may be itself
    coco = tmp_path / "coco"
    (coco / "val2017").mkdir(parents=True)
    (coco / "annotations").mkdir()
    (coco / "annotations" / "instances_val2017.json").write_text("{}")
    with pytest.raises(DestinationError, match=f"is inside the data root {coco},"):
        check_destination(coco / "val2017" / "tab", "--out")
    # a folder named train/ holding runs (no image in its folders) is no dataset: writing beside it is fine
    _finished_run(tmp_path / "exp" / "train" / "run1")
    (tmp_path / "exp" / "val" / "empty_class").mkdir(parents=True)
    assert not is_data_root(tmp_path / "exp")
    check_destination(tmp_path / "exp" / "train" / "run2", "hydra.run.dir", run_dir=True)
    check_destination(tmp_path / "elsewhere" / "tab", "--out")


@pytest.mark.parametrize("case", ["log_dir", "data_root"])
def test_train_writes_nothing_into_a_hand_made_dataset(tmp_path: Path, case: str) -> None:
    """A run dir (paths.log_dir in a dataset's train/) and generated data (data.root in its val/) would each be a
    new class folder of the hand-made dataset: one line before anything is made."""
    hand = _hand_root(tmp_path / "hand")
    before = _tree(hand)
    args = {"log_dir": ["debug=fast", f"paths.log_dir={hand / 'train'}", "run_name=e68",
                        f"paths.data_dir={tmp_path / 'data'}"],
            "data_root": ["debug=fast", f"data.root={hand / 'val' / '9_gen'}", f"paths.log_dir={tmp_path / 'runs'}"]}
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_overrides(args[case], "train")
    message = str(err.value)
    assert "\n" not in message and f"is inside the data root {hand}, where a new folder would become part of the" \
        " dataset; valid: a folder outside every data root" in message, message
    assert _tree(hand) == before


@pytest.mark.parametrize("log_dir,run_name", [("data/testsets", "relational_left_v2"), ("data/testsets", "v5"),
                                               ("data", "testsets")])
def test_no_run_dir_in_the_test_sets_data_folder(tmp_path: Path, log_dir: str, run_name: str) -> None:
    """Probe 19, v5: a run dir in <paths.data_dir>/testsets took a test set's data folder (or its name, which
    generate_testsets then refused): one line before anything is made."""
    data = tmp_path / "data"
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_overrides(["debug=fast", f"paths.data_dir={data}", f"paths.log_dir={tmp_path / log_dir}",
                             f"run_name={run_name}"], "train")
    where = "is the data root" if run_name == "testsets" else "is inside the data root"
    assert str(err.value) == (f"paths.log_dir/run_name='{tmp_path / log_dir / run_name}' {where}"
                              f" {data / 'testsets'}, where a new folder would become part of the dataset; valid: a"
                              " folder outside every data root")
    assert not (data / "testsets").exists()
    cli.check_overrides(["debug=fast", f"paths.data_dir={data}", f"paths.log_dir={data}", "run_name=v5"], "train")


def test_the_test_sets_data_folder_is_marked_and_kept_free(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture) -> None:
    """Probe 20, w30, x6, x8: the test sets' folder of another data dir took a run dir, an archive and a temp dir
    (torch's cache made there). generate_testsets marks <paths.data_dir>/testsets, and every destination check
    (and the temp dir's, before torch is imported) keeps out of a marked folder; a test set's root given elsewhere
    marks nothing."""
    import starting
    from scripts import archive_runs
    from scripts.generate_testsets import generate
    from storage.destinations import TESTSETS_MARKER

    data = tmp_path / "data"
    generate("relational_right", [f"paths.data_dir={data}", "testset.data.generator.num_val=16"])
    folder = data / "testsets"
    assert (folder / TESTSETS_MARKER).is_file()
    elsewhere = tmp_path / "own" / "ts"
    generate("relational_right", [f"paths.data_dir={data}", "testset.data.generator.num_val=16",
                                  f"testset.data.root={elsewhere}"])
    assert not (elsewhere.parent / TESTSETS_MARKER).exists()
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(cli.CommandLineError) as err:  # w30: the config's own paths.data_dir is another one
        cli.check_overrides(["debug=fast", f"paths.data_dir={tmp_path / 'other'}", f"paths.log_dir={folder}",
                             "run_name=w30"], "train")
    assert str(err.value) == (f"paths.log_dir/run_name='{folder / 'w30'}' is inside the folder {folder} of the"
                              " test sets' own data, whose folders are test sets' data named by their definitions;"
                              " valid: a folder outside it")
    sweep = _fake_sweep(tmp_path / "runs")
    assert archive_runs.main([str(sweep), "--to", str(folder / "x6")]) == 2  # x6
    assert f"is inside the folder {folder} of the test sets' own data" in capsys.readouterr().err
    monkeypatch.setenv("TMPDIR", str(folder / "tmp8"))  # x8
    assert starting.temp_dir_problem() == (
        f"TMPDIR='{folder / 'tmp8'}' lies in the folder of the test sets' own data {folder}, and torch and Lightning"
        " write their caches into the temp dir as they start; valid: set TMPDIR to a folder of its own (e.g. /tmp)")
    assert sorted(p.name for p in folder.iterdir()) == before


def test_scripts_write_nothing_into_a_hand_made_dataset(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A test set, an archive and tables into a hand-made dataset: one line each, nothing written."""
    from scripts import archive_runs, generate_testsets, make_tables

    hand = _hand_root(tmp_path / "hand")
    before = _tree(hand)
    sweep = _fake_sweep(tmp_path / "runs")
    # each an up-front refusal: exit 2, as for every bad setting of the scripts
    for main, argv, code in ((generate_testsets.main, ["relational_right", "--set",
                                                       f"paths.data_dir={tmp_path / 'data'}",
                                                       f"testset.data.root={hand / 'train' / 'ts'}"], 2),
                             (archive_runs.main, [str(sweep), "--to", str(hand / "train")], 2),
                             (make_tables.main, [str(sweep), "--out", str(hand / "train" / "0_E" / "tab")], 2)):
        assert main(argv) == code
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and f"is inside the data root {hand}," in err, err
    assert _tree(hand) == before
    assert not list(tmp_path.rglob("*.lock"))  # not even a generation lock beside the test set's root


@pytest.mark.parametrize("typed", [".", "./", "../train"])
def test_an_archive_refusal_quotes_the_to_as_typed_and_the_folder_it_names(typed: str, tmp_path: Path, monkeypatch,
                                                                          capsys: pytest.CaptureFixture) -> None:
    """Probe 8, A25: ``--to .`` from inside a data root was refused as ``--to='swshift'`` (the sweep's name, never
    typed): the line quotes what was typed, and the archive folder it would have made."""
    from scripts import archive_runs

    hand = _hand_root(tmp_path / "hand")
    before = _tree(hand)
    sweep = _fake_sweep(tmp_path / "runs")
    monkeypatch.chdir(hand / "train")
    assert archive_runs.main([str(sweep), "--to", typed]) == 2
    archive = Path(os.path.abspath(Path(typed) / sweep.name))
    assert capsys.readouterr().err == (f"error: --to={typed!r} (the archive {archive}) is inside the data root {hand},"
                                       " where a new folder would become part of the dataset; valid: a folder outside"
                                       " every data root\n")
    assert _tree(hand) == before


def test_every_destination_follows_the_run_names_unicode_rule(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Probe 8, A75: ``--to`` spelled in NFD beside its NFC twin made a second archive folder that prints like the
    first. Every destination (`check_destination`) now follows the rule of run names: a folder to be made is
    composed (NFC) and no twin of one beside it; an existing folder is used as it is spelled."""
    from scripts import archive_runs, make_tables

    composed, decomposed = "arch_\u00fc", "arch_u\u0308"
    (tmp_path / composed).mkdir()
    sweep = _fake_sweep(tmp_path / "runs")
    assert archive_runs.main([str(sweep), "--to", str(tmp_path / decomposed)]) == 2
    assert capsys.readouterr().err == (
        f"error: --to={str(tmp_path / decomposed)!r} (the archive {tmp_path / decomposed / sweep.name}): the name"
        f" {decomposed!r} (spelled 'arch_u\\u0308') is not in Unicode's composed form (NFC), and prints like"
        " 'arch_\\xfc', another name to the file system; valid: the composed spelling 'arch_\\xfc'\n")
    assert make_tables.main([str(sweep), "--out", str(tmp_path / decomposed / "tab")]) == 2
    assert "is not in Unicode's composed form (NFC)" in capsys.readouterr().err
    (tmp_path / "nfd" / decomposed).mkdir(parents=True)  # made before destinations were checked: its NFC twin
    with pytest.raises(DestinationError, match=r"^--out=.*\('arch_u\\u0308'\) differs from"):
        check_destination(tmp_path / "nfd" / composed, "--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == [composed, "nfd", "runs"]
    assert archive_runs.main([str(sweep), "--to", str(tmp_path / composed)]) == 0  # the existing folder, as spelled
    assert check_destination(tmp_path / "nfd" / decomposed / "t", "--out") == tmp_path / "nfd" / decomposed / "t"


def test_no_run_or_sweep_is_made_beside_archived_sweeps(tmp_path: Path) -> None:
    """Probe 21, z57: archive_runs' ``--to`` folder keeps archived sweeps side by side, and a run dir made there
    (``paths.log_dir=<that folder>``) sat beside them, where ``make_tables <archive>/*`` would read it as archived.
    A run dir or a sweep dir there is refused in one line; beside the live sweep it is not."""
    from scripts import archive_runs

    sweep = _fake_sweep(tmp_path / "runs")
    archive = tmp_path / "arch"
    assert archive_runs.main([str(sweep), "--to", str(archive)]) == 0
    before = _tree(archive)
    data = f"paths.data_dir={tmp_path / 'data'}"
    assert (archive / ".archives.json").is_file()  # archive_runs marks its --to folder
    beside = (f"lies in the folder {archive} of archived sweeps: archive_runs keeps them there, and its folders are"
              " read as finished runs' records; valid: a folder outside every archive (e.g. runs/)")
    for args, start in ((["debug=fast", f"paths.log_dir={archive}", "run_name=z57", data],
                         f"paths.log_dir/run_name={str(archive / 'z57')!r} "),
                        # probe 22, k9e: in a new subfolder of it
                        (["debug=fast", f"paths.log_dir={archive / 'sub'}", "run_name=k9e", data],
                         f"paths.log_dir/run_name={str(archive / 'sub' / 'k9e')!r} "),
                        (["-m", "debug=fast", "seed=0,1", f"hydra.sweep.dir={archive / 'sw2'}", data],
                         f"hydra.sweep.dir={str(archive / 'sw2')!r} ")):
        with pytest.raises(cli.CommandLineError) as err:
            cli.check_overrides(args, "train")
        assert str(err.value) == start + beside, str(err.value)
    assert _tree(archive) == before
    cli.check_overrides(["debug=fast", f"paths.log_dir={tmp_path / 'runs'}", "run_name=new", data], "train",
                        make=False)


def test_no_folder_that_holds_live_runs_becomes_a_folder_of_archives(tmp_path: Path, capsys) -> None:
    """Probe 24, r33, r34: ``archive_runs <sweep> --to runs`` marked a folder that held live runs (beside it, or two
    folders down) as one of archived sweeps: make_tables read them as archived, and an interrupted run there could
    no longer be resumed. Refused in one line, nothing written; archiving again into an archive folder still works."""
    from scripts import archive_runs

    sweep = _fake_sweep(tmp_path / "sweeps")
    for live in (tmp_path / "runs" / "r16", tmp_path / "up" / "inner" / "r16"):
        _fake_sweep(live.parent)  # a live sweep dir with its runs
        to = live.parent if live.parent.parent == tmp_path else live.parent.parent
        before = _tree(to)
        assert archive_runs.main([str(sweep), "--to", str(to)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --to {str(to)!r} holds {live.parent / sweep.name}, a run, sweep or data folder"
                              " that is no archived sweep:"), err
        assert _tree(to) == before
    link = tmp_path / "link"  # probe 25, U4: a --to that is a link to a folder holding live runs
    link.symlink_to(tmp_path / "runs")
    assert archive_runs.main([str(sweep), "--to", str(link)]) == 2
    assert "a run, sweep or data folder that is no archived sweep" in capsys.readouterr().err
    assert not (tmp_path / "runs" / ".archives.json").exists()
    assert archive_runs.main([str(sweep), "--to", str(tmp_path / "arch")]) == 0
    assert archive_runs.main([str(sweep), "--to", str(tmp_path / "arch")]) == 0  # its own archives: not live
    from storage.destinations import live_folder_below

    for name in "abc":
        (tmp_path / "big" / name).mkdir(parents=True)
    assert live_folder_below(tmp_path / "big", most=2) == "more than 2 folders outside archived sweeps"
    assert live_folder_below(tmp_path / "big") is None


def test_every_committed_archive_is_marked(tmp_path: Path) -> None:
    """Probe 22, m11: the committed archives (docs/*_runs) predate the marker, so a run dir beside or inside a copy
    of one was accepted. Each archived sweep there carries archive_runs' marker, and a run beside one is refused."""
    import shutil

    from storage.destinations import ARCHIVE_MARKER, ARCHIVES_MARKER

    docs = cli.CONFIG_DIR.parent / "docs"
    sweeps = sorted(grid.parent for grid in docs.glob("*_runs/**/multirun.yaml"))
    assert len(sweeps) >= 10
    assert [s for s in sweeps if not (s / ARCHIVE_MARKER).is_file()] == []
    # every folder between docs/<name>_runs and an archived sweep is marked as a folder of archived sweeps
    above = {p for s in sweeps for p in s.parents if docs in p.parents}
    assert [p for p in sorted(above) if not (p / ARCHIVES_MARKER).is_file()] == []
    shutil.copytree(docs / "ablations_mini_runs" / "where_mini", tmp_path / "arch" / "where_mini")
    # probe 23, q4: a copy of repro/ alone, whose archived sweep lies two folders down
    shutil.copytree(docs / "benchmark_runs" / "repro", tmp_path / "rcopy" / "repro")
    for log_dir in (tmp_path / "arch", tmp_path / "rcopy" / "repro"):
        with pytest.raises(cli.CommandLineError, match="of archived sweeps: archive_runs keeps them there"):
            cli.check_overrides(["debug=fast", f"paths.log_dir={log_dir}", "run_name=m11",
                                 f"paths.data_dir={tmp_path / 'data'}"], "train", make=False)
    # probe 24, S1F: a workspace that links to an archived sweep (to read it) holds no archive of its own
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "where_mini").symlink_to(tmp_path / "arch" / "where_mini")
    cli.check_overrides(["debug=fast", f"paths.log_dir={tmp_path / 'work' / 'runs'}", "run_name=s1f",
                         f"paths.data_dir={tmp_path / 'data'}"], "train", make=False)


def test_no_run_or_sweep_trains_into_an_archive(tmp_path: Path) -> None:
    """An archived sweep holds its jobs' records without checkpoints: a sweep launched into it (or a run dir in it)
    would take the archived jobs for finished and write the new jobs' checkpoints into the archive. archive_runs
    marks each sweep it archives, and train.py refuses a run or sweep dir there in one line."""
    from scripts import archive_runs, make_tables
    from storage.destinations import ARCHIVE_MARKER

    sweep = _fake_sweep(tmp_path / "runs")
    archive = tmp_path / "arch"
    assert archive_runs.main([str(sweep), "--to", str(archive)]) == 0
    archived = archive / sweep.name
    assert (archived / ARCHIVE_MARKER).is_file()
    before = _tree(archive)
    sweep_into = ["-m", "debug=fast", "seed=0,1", f"paths.data_dir={tmp_path / 'data'}"]
    archive_line = f"{archived}, which keeps finished runs' records without checkpoints: an archive; valid: train" \
        " into the live sweep dir, then archive again"
    for args, start, fragment in (
            ([*sweep_into, f"hydra.sweep.dir={archived}"], "hydra.sweep.dir=", f"is the archive {archive_line}"),
            ([*sweep_into, f"hydra.sweep.dir={archived / 'sub'}"], "hydra.sweep.dir=",
             f"is inside the archive {archive_line}"),
            # an archived sweep keeps its grid (multirun.yaml): a single run there is refused as one in a sweep dir
            (["debug=fast", f"paths.log_dir={archived}", "run_name=new", f"paths.data_dir={tmp_path / 'data'}"],
             "run_name='new'", f"puts a single run into the sweep dir {archived},")):
        with pytest.raises(cli.CommandLineError) as err:
            cli.check_overrides(args, "train")
        assert str(err.value).startswith(start) and fragment in str(err.value), str(err.value)
    assert _tree(archive) == before
    # the archive is still the tables' input, and archiving again into it is still allowed
    assert sorted(r.status for r in make_tables.collect([archived])) == ["failed", "missing", "missing", "ok"]
    assert archive_runs.main([str(sweep), "--to", str(archive)]) == 0
    assert (archived / ARCHIVE_MARKER).read_bytes() == archive_runs.ARCHIVE_NOTE


@pytest.mark.parametrize("char", ["\n", "\t", "\u202e", "\u200b"])
def test_an_output_path_with_control_or_format_characters_is_refused(tmp_path: Path, char: str,
                                                                     capsys: pytest.CaptureFixture) -> None:
    """A newline in --out made make_tables report each file as two lines, a right-to-left override made the
    listing of plot_rpe's folder read backwards: an output path given by the user follows the run names' rule."""
    from scripts import archive_runs, make_tables

    sweep = _fake_sweep(tmp_path / "runs")
    out = tmp_path / "tabs"
    out.mkdir()
    for main, argv, what in ((make_tables.main, [str(sweep), "--out", f"{out}/a{char}b"], "--out"),
                             (archive_runs.main, [str(sweep), "--to", f"{out}/a{char}b"], "--to")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err == (f"error: {what}={f'{out}/a{char}b'!r} holds the control or format character {char!r}, which"
                       " makes every listing and report line of it lie; valid: a path without control or format"
                       " characters (no newline, tab or right-to-left mark)\n"), err
    assert not any(out.iterdir())
    with pytest.raises(cli.CommandLineError, match="is not a run name"):  # the run names' rule, the same test
        cli.check_run_location(f"a{char}b", tmp_path / "runs")


def test_dot_dot_after_a_link_is_refused_by_every_writer(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``x/lnk/..`` where ``lnk`` is a link: the system goes up from the link's target (here a dataset's class
    folder, so its ``..`` is the dataset's train/), a path made absolute first drops ``lnk/..``. Checked on the
    latter, tables, archives and run dirs landed in the dataset: every writer refuses it in one line."""
    from scripts import archive_runs, make_tables

    hand = _hand_root(tmp_path / "hand")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "lnk").symlink_to(hand / "train" / "0_E", target_is_directory=True)
    via = tmp_path / "x" / "lnk" / ".."
    before = _tree(hand)
    with pytest.raises(DestinationError) as err:
        check_destination(via / "t", "--out")
    assert f"has '..' after a link: the system reads it as {hand / 'train' / 't'}" in str(err.value)
    sweep = _fake_sweep(tmp_path / "runs")
    for main, argv in ((make_tables.main, [str(sweep), "--out", str(via / "tab")]),
                       (archive_runs.main, [str(sweep), "--to", str(via / "arch")])):
        assert main(argv) == 2
        err_text = capsys.readouterr().err
        assert err_text.startswith("error: ") and err_text.count("\n") == 1 and "after a link" in err_text, err_text
    with pytest.raises(ValueError) as refused:
        cli.check_overrides(["debug=fast", f"paths.log_dir={via}", "run_name=r",
                             f"paths.data_dir={tmp_path / 'data'}"], "train")
    assert "after a link" in str(refused.value)
    with pytest.raises(ValueError) as refused:  # data to generate there: refused before the run dir is made
        cli.check_overrides(["debug=fast", f"paths.log_dir={tmp_path / 'logs'}", "run_name=r",
                             f"paths.data_dir={tmp_path / 'data'}", f"data.root={via / 'gen'}"], "train")
    assert str(refused.value).startswith("data.root=") and "after a link" in str(refused.value)
    assert _tree(hand) == before and not (tmp_path / "logs").exists()


def test_dot_dot_after_a_link_suggests_only_a_path_the_rule_accepts(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 7, A202/A206: the refusal offered the system's reading of the path as the valid one, while that was
    a run dir (make_tables --out) or a new class folder of a dataset (paths.log_dir); and a relative
    paths.log_dir=lnk/.. was named hydra.run.dir. The reading is offered only where the rule accepts it, and the
    log dir is named as typed."""
    from scripts import make_tables

    sweep = _fake_sweep(tmp_path / "runs")
    run_dir = sweep / "seed=0"  # finished: a run dir to the rule
    x = tmp_path / "x"
    x.mkdir()
    (x / "into_run").symlink_to(run_dir / "checkpoints", target_is_directory=True)
    assert make_tables.main([str(sweep), "--out", str(x / "into_run" / ".." / "tab")]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --out={str(x / 'into_run' / '..' / 'tab')!r} has '..' after a link: the system reads it as"
                   f" {run_dir}, a path made absolute first reads it as {x}, so a write would land in either; valid: a"
                   f" path without '..' after a link ({run_dir} itself may not be written either)\n")
    hand = _hand_root(tmp_path / "hand")
    (x / "lnk").symlink_to(hand / "train" / "0_E", target_is_directory=True)
    monkeypatch.chdir(x)
    with pytest.raises(cli.CommandLineError) as refused:
        cli.check_overrides(["debug=fast", "paths.log_dir=lnk/..", "run_name=a206run",
                             f"paths.data_dir={tmp_path / 'data'}"], "train")
    assert str(refused.value) == (f"paths.log_dir='lnk/..' has '..' after a link: the system reads it as"
                                  f" {hand / 'train'}, a path made absolute first reads it as {x}, so a write would"
                                  f" land in either; valid: a path without '..' after a link ({hand / 'train'} itself"
                                  " may not be written either)")
    assert not (hand / "train" / "a206run").exists() and not (x / "a206run").exists()
    (tmp_path / "elsewhere" / "deep").mkdir(parents=True)  # a plain folder: its reading is a valid destination
    (x / "plain").symlink_to(tmp_path / "elsewhere" / "deep", target_is_directory=True)
    with pytest.raises(DestinationError) as err_plain:
        check_destination("plain/../tab", "--out")
    assert str(err_plain.value).endswith(
        f"valid: the path without '..' after a link, e.g. {tmp_path / 'elsewhere' / 'tab'}")


def test_images_in_sub_folders_of_a_class_make_a_dataset(tmp_path: Path) -> None:
    """The loader reads a class folder at any depth (batch1/x.png): such a dataset is one to the destination rule."""
    from data.datamodule import LAYOUT_DEPTH, has_image_folder_layout

    hand = tmp_path / "hand"
    (hand / "train" / "0_E" / "batch1").mkdir(parents=True)
    (hand / "train" / "0_E" / "batch1" / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    assert has_image_folder_layout(hand)
    with pytest.raises(DestinationError, match=f"is inside the data root {hand},"):
        check_destination(hand / "train" / "0_E" / "tab", "--out")
    deep = tmp_path / "deep"
    folder = deep / "train" / "0_E" / "/".join(f"d{i}" for i in range(LAYOUT_DEPTH + 1))
    folder.mkdir(parents=True)
    (folder / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    assert not has_image_folder_layout(deep)  # the look is bounded: a few listings, never a walk of a big tree


def test_tables_stay_out_of_the_data_their_runs_trained_on(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A dataset with split names of its own (training/, validation/) is no dataset by layout, but it is the data
    root of a run the tables are made of (its config's data.root): make_tables writes nothing into it."""
    from omegaconf import OmegaConf

    from scripts import make_tables

    data = tmp_path / "mine"
    for split in ("training", "validation"):
        (data / split / "0_E").mkdir(parents=True)
        (data / split / "0_E" / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    sweep = _fake_sweep(tmp_path / "runs")
    config = sweep / "seed=0" / "config.yaml"
    cfg = OmegaConf.load(config)
    OmegaConf.update(cfg, "data.root", str(data), force_add=True)
    OmegaConf.save(cfg, config)
    before = _tree(data)
    assert make_tables.main([str(sweep), "--out", str(data / "training" / "0_E" / "tab")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"is inside the data root {data}," in err, err
    assert _tree(data) == before
    assert make_tables.main([str(sweep), "--out", str(tmp_path / "tabs" / "t")]) == 0  # elsewhere: written


def test_paths_output_dir_is_not_a_setting(tmp_path: Path) -> None:
    """``++paths.output_dir=<another run>`` sent the checkpoints and logs of a new run into another run's folder
    (overwriting its best.ckpt) while its own dir stayed empty: one line before any dir."""
    for given in (f"++paths.output_dir={tmp_path / 'other'}", "paths.output_dir=${paths.log_dir}/x"):
        with pytest.raises(ValueError) as err:  # a SettingError: train.py prints it as its one line, exit 2
            cli.check_overrides(["debug=fast", f"paths.log_dir={tmp_path}", "run_name=r", given], "train")
        assert str(err.value).startswith("paths.output_dir=") and "is not a setting" in str(err.value), str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_a_data_root_that_is_a_symlink_loop_is_one_line_before_the_run_dir(tmp_path: Path) -> None:
    """A hand data root (no generator) that is a link to itself gave a traceback from the run's identity and left
    a run dir holding only its lock."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_overrides(["debug=fast", f"paths.log_dir={tmp_path / 'logs'}", "run_name=r", "data.generator=null",
                             f"data.root={tmp_path / 'loop'}"], "train")
    assert str(err.value).startswith(f"data.root='{tmp_path / 'loop'}' cannot be read: {tmp_path / 'loop'} is a"
                                     " symlink loop"), str(err.value)
    assert not (tmp_path / "logs").exists()


def test_a_log_dir_that_is_a_symlink_loop_is_named_as_the_setting(tmp_path: Path) -> None:
    """Probe 15, n50: the refusal named a record inside the would-be run dir (``<loop>/r/multirun.yaml``)."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_overrides(["debug=fast", f"paths.log_dir={tmp_path / 'loop'}", "run_name=r"], "train")
    assert str(err.value) == (f"paths.log_dir='{tmp_path / 'loop'}' cannot be used: {tmp_path / 'loop'} is a symlink"
                              " loop (its links lead back to themselves); valid: a folder whose path has no link loop")


def test_tables_and_archives_under_a_folder_this_user_may_not_use_name_it(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    """``--out`` / ``--to`` below a mode-000 folder printed Python's ``[Errno 13] Permission denied: '.../run.json'``,
    naming a file the user never gave: now the folder, in the words every command uses."""
    from scripts import archive_runs, make_tables
    from tests.helpers import file_modes_hold

    sweep = _fake_sweep(tmp_path / "runs")
    closed = tmp_path / "closed"
    closed.mkdir()
    closed.chmod(0)
    try:
        with file_modes_hold():
            codes = (make_tables.main([str(sweep), "--out", str(closed / "t")]),
                     archive_runs.main([str(sweep), "--to", str(closed / "a")]))
    finally:
        closed.chmod(0o755)
    lines = capsys.readouterr().err.splitlines()
    assert codes == (2, 2) and lines == [f"error: cannot use {closed}: permission denied (a folder this user may not"
                                         " look into); valid: a folder this user may read and write (chmod u+rwx),"
                                         " or another"] * 2, lines
    assert list(closed.iterdir()) == []


def test_a_data_root_never_lies_in_a_sweep_dir_or_an_archive(tmp_path: Path) -> None:
    """Probe 16, p30, p50, p51: ``paths.data_dir=<a sweep dir>`` generated a data root (and left its lock) among the
    sweep's job folders, and ``paths.data_dir=<an archive>`` a data set and a test set inside the archive, which
    archive_runs then kept. A data root (a run's or a test set's) may be neither."""
    sweep = tmp_path / "sw"
    _finished_run(sweep / "0")
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    archive = tmp_path / "arch" / "sw"
    archive.mkdir(parents=True)
    (archive / ".archive.json").write_text("{}")
    for what in ("data.root", "testset.data.root"):
        with pytest.raises(DestinationError, match=rf"^{what}='{sweep}/relational_v2' is inside the sweep dir {sweep},"
                                                   r" whose folders are its jobs'; valid: a folder outside every"
                                                   r" sweep dir$"):
            check_destination(sweep / "relational_v2", what, data_root=True)
        with pytest.raises(DestinationError, match=rf"^{what}='{archive}/testsets/x' is inside the archive {archive},"
                                                   r" which keeps finished runs' records: no place for data; valid: a"
                                                   r" folder outside every archive$"):
            check_destination(archive / "testsets" / "x", what, data_root=True)
    # probe 22, m29: beside the archived sweep too (archive_runs' --to folder, whose folders are read as archived)
    with pytest.raises(DestinationError, match=rf"^data.root='{tmp_path}/arch/data' lies in the folder {tmp_path}/arch"
                                               r" of archived sweeps: archive_runs keeps"):
        check_destination(tmp_path / "arch" / "data", "data.root", data_root=True)
    # beside the sweep is fine, and a table may still be written into a sweep dir (its own tables)
    assert check_destination(tmp_path / "data", "data.root", data_root=True) == tmp_path / "data"
    check_destination(sweep / "tables", "--out")


def test_nothing_but_archive_runs_writes_inside_an_archive(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Probe 18, t50, t52, t56: an export, plot_rpe's plots and make_tables' tables were written into an archived
    sweep's folder (reached directly or through a link) beside its runs' records. Only archive_runs writes there;
    beside the archive is fine."""
    import torch

    from scripts import make_tables
    from storage.destinations import save_export

    sweep = _fake_sweep(tmp_path / "runs")
    archive = tmp_path / "arch"
    from scripts import archive_runs

    assert archive_runs.main([str(sweep), "--to", str(archive)]) == 0
    kept = archive / sweep.name
    before = sorted(p.relative_to(archive) for p in archive.rglob("*"))
    (tmp_path / "lnk").symlink_to(archive, target_is_directory=True)
    for given in (kept / "tab", tmp_path / "lnk" / sweep.name / "plots" / "tab"):
        assert make_tables.main([str(sweep), "--out", str(given)]) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"error: --out={str(given)!r} is inside the archive {kept}, which keeps finished runs'"
                               " records as archive_runs copied them; valid: a folder outside every archive"), line
        with pytest.raises(ValueError, match=rf"^export path='{given}.pth' is inside the archive {kept},"):
            save_export({"w": torch.zeros(1)}, f"{given}.pth", "export", ValueError)
    assert sorted(p.relative_to(archive) for p in archive.rglob("*")) == before
    assert archive_runs.main([str(sweep), "--to", str(archive)]) == 0  # archiving again still writes there
    assert make_tables.main([str(sweep), "--out", str(tmp_path / "arch" / "tab")]) == 0  # beside it: fine


def test_train_refuses_generating_its_data_in_a_sweep_dir_before_any_write(tmp_path: Path, capsys, monkeypatch) -> None:
    """Probe 16, p30: the command line's check, before the data, its lock or the run dir are made."""
    from tests.test_cli_input import _refused_by_the_command_line

    sweep = tmp_path / "sw"
    _finished_run(sweep / "0")
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    before = sorted(p.name for p in sweep.iterdir())
    line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={tmp_path / 'runs'}", "run_name=r",
                                         f"paths.data_dir={sweep}"], capsys, monkeypatch)
    assert line.startswith(f"error: data.root='{sweep}/relational_v2' is inside the sweep dir {sweep},"), line
    assert sorted(p.name for p in sweep.iterdir()) == before and not (tmp_path / "runs").exists()
