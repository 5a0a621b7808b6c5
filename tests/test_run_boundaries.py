"""What a run may reach outside itself: the data it trained on (hand-made data, ``data.generator=null``, is
named by a fingerprint of its files), the folders its loggers write into, and the launcher that starts a
sweep's jobs. Each is refused in one line before a run or sweep dir is made, or (data) before a rerun
writes into the run dir.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig

from data.generation import scan_files
from lifecycle.cli import _refuse_unusable_launcher
from lifecycle.console import CommandLineError
from lifecycle.identity import data_difference, data_record
from lifecycle.project import CONFIG_DIR
from lifecycle.settings import SettingError, check_settings
from reports.cells import split_by_config
from reports.collect import Run
from tests.helpers import run_cli

ENV = {"OMP_NUM_THREADS": "1"}
HAND = ["debug=fast", "logger=csv", "data.generator=null", "data.num_workers=0", "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1", "data.batch_size=8"]


def _compose(*overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def _files(run_dir: Path) -> dict[str, str]:
    return {p.relative_to(run_dir).as_posix(): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != "run.lock"}


@pytest.fixture(scope="module")
def hand_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small ImageFolder without a generator's marker: a user's own data."""
    from data.relational import generate_relational_shapes

    root = tmp_path_factory.mktemp("hand") / "h1"
    generate_relational_shapes(root, num_train=64, num_val=32)
    for hidden in root.glob(".*"):
        hidden.unlink()
    return root


# ----------------------------------------------------------------------------- 1: the data a run trained on
def test_the_file_fingerprint_sees_swapped_classes_and_not_a_move(hand_root: Path, tmp_path: Path) -> None:
    digest, count = scan_files(hand_root, ["train", "val"])
    assert count == 96
    moved = tmp_path / "moved"
    shutil.copytree(hand_root, moved)  # copy2: names, sizes and mtimes kept, as mv, cp -a and rsync -a keep them
    (moved / "train" / ".DS_Store").write_text("x")  # hidden names are not data
    assert scan_files(moved, ["train", "val"]) == (digest, count)
    classes = sorted(p.name for p in (moved / "train").iterdir())
    a, b = moved / "train" / classes[0], moved / "train" / classes[1]
    a.rename(moved / "swap")
    b.rename(a)
    (moved / "swap").rename(b)
    assert scan_files(moved, ["train", "val"])[0] != digest


def test_the_file_fingerprint_sees_files_added_behind_a_symlinked_folder(hand_root: Path, tmp_path: Path) -> None:
    """Probe 13, j65: a class folder that is a symlink entered the fingerprint by its path and target only, so
    images added behind it after training were evaluated (and counted) as the run's own data."""
    data = tmp_path / "data"
    shutil.copytree(hand_root, data)
    first = sorted(p.name for p in (data / "val").iterdir())[0]
    shutil.move(data / "val" / first, tmp_path / "subset")
    (data / "val" / first).symlink_to(tmp_path / "subset")
    digest, count = scan_files(data, ["train", "val"])
    assert count == 96  # the linked folder's images are counted, as the data module reads them
    extra = next((tmp_path / "subset").iterdir())
    shutil.copy2(extra, tmp_path / "subset" / f"added{extra.suffix}")
    assert scan_files(data, ["train", "val"]) != (digest, count)
    (tmp_path / "subset" / "loop").symlink_to(tmp_path / "subset")  # a loop is walked once (the data module refuses it)
    assert scan_files(data, ["train", "val"])[1] == 97


def test_only_data_without_a_generator_get_a_record(hand_root: Path) -> None:
    record = data_record({"root": str(hand_root), "generator": None, "train_split": "train", "val_split": "val"})
    assert record is not None and record["root"] == str(hand_root.resolve()) and record["count"] == 96
    assert data_record({"root": str(hand_root), "generator": {"_target_": "x"}}) is None
    assert data_record({"root": str(hand_root / "absent"), "generator": None}) is None
    assert data_difference(record, dict(record, root="/elsewhere")) is None  # the fingerprint governs
    other = dict(record, root="/other", files="f" * 64)
    assert str(hand_root.resolve()) in data_difference(record, other) and "/other" in data_difference(record, other)
    assert data_difference(None, other) is None  # a run of an older version recorded none


@pytest.mark.slow  # train.py and eval.py processes end to end: make test's 5 minutes
def test_a_rerun_on_other_data_is_refused_and_a_moved_copy_resumes(hand_root: Path, tmp_path: Path) -> None:
    """Probe case 103: extending a finished run with data.root at other images (two classes swapped)."""
    log_dir = tmp_path / "runs"
    base = [*HAND, f"paths.log_dir={log_dir}", f"paths.data_dir={tmp_path}", "run_name=h1"]
    first = run_cli("train.py", [*base, f"data.root={hand_root}"], env_extra=ENV)
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = log_dir / "h1"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["data/root"] == str(hand_root.resolve()) and len(metrics["data/files"]) == 64

    swapped = tmp_path / "h2"
    shutil.copytree(hand_root, swapped)
    classes = sorted(p.name for p in (swapped / "train").iterdir())
    (swapped / "train" / classes[0]).rename(swapped / "tmp")
    (swapped / "train" / classes[1]).rename(swapped / "train" / classes[0])
    (swapped / "tmp").rename(swapped / "train" / classes[1])
    before = _files(run_dir)
    refused = run_cli("train.py", [*base, f"data.root={swapped}", "trainer.max_epochs=2"], env_extra=ENV)
    assert refused.returncode == 2, refused.stderr[-3000:]
    lines = _error_lines(refused.stderr)
    assert len(lines) == 1 and "Traceback" not in refused.stderr
    assert f"data.root={swapped}" in lines[0] and str(hand_root.resolve()) in lines[0] and "new run_name" in lines[0]
    assert _files(run_dir) == before  # nothing was written

    moved = tmp_path / "moved"
    shutil.copytree(hand_root, moved)
    resumed = run_cli("train.py", [*base, f"data.root={moved}", "trainer.max_epochs=2"], env_extra=ENV)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"moved: {hand_root.resolve()} -> {moved.resolve()}" in resumed.stdout
    assert json.loads((run_dir / "metrics.json").read_text())["data/files"] == metrics["data/files"]


def _ok(path: str, data: str | None, seed: int) -> Run:
    return Run(path, "ok", {"seed": seed}, {"val/top1": 50.0}, identity={"model": "'m'"}, data=data)


def test_tables_keep_runs_on_other_data_apart() -> None:
    """Probe case 104: two seeds on two data sets were pooled as n=2."""
    split = split_by_config("row", [_ok("a", "a" * 64, 0), _ok("b", "b" * 64, 1)])
    assert len(split) == 2 and all("data.files=" in name for name in split)
    assert sorted(len(runs) for runs in split.values()) == [1, 1]
    same = split_by_config("row", [_ok("a", "a" * 64, 0), _ok("b", "a" * 64, 1)])
    assert list(same) == ["row"] and len(same["row"]) == 2
    generated = split_by_config("row", [_ok("a", None, 0), _ok("b", None, 1)])
    assert list(generated) == ["row"]


def test_a_split_row_reads_a_preset_field_left_null_as_the_value_it_trains() -> None:
    """Probe 23, p30T2: beside a job with ``rpe.ratio=3.0``, the genuine job's label read ``rpe.ratio=None`` for
    the 1.9 its preset trains. Probe 24, r20: ``rpe.ratio=1.9`` given beside the preset's own 1.9 split the row."""
    def run(path: str, ratio: str) -> Run:
        return Run(path, "ok", {"seed": 0}, {"val/top1": 50.0},
                   identity={"rpe.preset": "'rpe-1.9-product-ctx-0-k'", "rpe.ratio": ratio})

    split = split_by_config("product_ctx", [run("a", "3.0"), run("b", "None")])
    assert sorted(split) == ["product_ctx [rpe.ratio=1.9]", "product_ctx [rpe.ratio=3.0]"]
    # probe 24, r20: the preset's own value given on the command line trains the same design: one group
    assert list(split_by_config("product_ctx", [run("a", "1.9"), run("b", "None")])) == ["product_ctx"]
    from reports.cells import _without_duplicates

    assert [r.status for r in _without_duplicates([run("a", "1.9"), run("b", "None")])] == ["ok", "duplicate"]
    unknown = split_by_config("r", [Run("a", "ok", {}, {}, identity={"rpe.preset": "'nonesuch'", "rpe.ratio": "None"}),
                                    Run("b", "ok", {}, {}, identity={"rpe.preset": "'nonesuch'", "rpe.ratio": "2.0"})])
    assert sorted(unknown) == ["r [rpe.ratio=2.0]", "r [rpe.ratio=None]"]  # no preset to read it from: as written


def test_runs_not_counted_stay_in_the_row_of_their_configs_counted_runs() -> None:
    """Probe 8, B118: in a cell whose counted runs were on two data sets, the duplicate and unreadable runs of one
    config formed a row of their own (``data.files=<unset>``), apart from the counted runs of the same config."""
    other = Run("h", "ok", {"seed": 0}, {"val/top1": 40.0}, identity={"model": "'h'"}, data="c" * 64)
    duplicate = Run("a2", "duplicate", {"seed": 0}, identity={"model": "'m'"})
    unreadable = Run("a3", "unreadable", {"seed": 2}, identity={"model": "'m'"})
    split = split_by_config("row", [_ok("a", None, 0), _ok("b", None, 1), duplicate, unreadable, other])
    assert sorted(sorted(r.path for r in runs) for runs in split.values()) == [["a", "a2", "a3", "b"], ["h"]]


def _trial(path: str, rpe: str, identity: dict[str, str]) -> Run:
    facts = {"seed": 0, "name": "deit_micro_irpe_k", "preset": "irpe_k", "preset_rpe": "rpe-1.9-product-ctx-0-k",
             "rpe": rpe, "model": "deit_micro_patch4_32"}
    return Run(path, "ok", facts, {"val/top1": 12.5}, identity=identity)


def test_a_tuned_key_beside_the_encoding_names_its_row() -> None:
    """Probe 19, u72: an optuna study tuned the lr with the encoding, so each trial had a column of its own and
    no cell named its lr (ten-fold apart); a key that differs only with the encoding is left to its column."""
    from reports.cells import build_tables

    slow = _trial("0", "rpe-1.59-quant-ctx-0-k", {"rpe.method": "'quant'", "model.optimizer.lr": "0.0005"})
    fast = _trial("1", "rpe-0.55-product-ctx-1-k", {"rpe.method": "'product'", "model.optimizer.lr": "0.005"})
    [table] = build_tables([slow, fast])
    rows = {f"deit_micro_irpe_k (changed from irpe_k) [model.optimizer.lr={lr}]": [run]
            for lr, run in (("0.0005", "0"), ("0.005", "1"))}
    assert {row: [run.path for run in cell.runs] for (row, _), cell in table.cells.items()} == rows
    assert sorted(table.rows) == sorted(rows)
    same_lr = _trial("2", "rpe-0.55-product-ctx-1-k", {"rpe.method": "'product'", "model.optimizer.lr": "0.0005"})
    [table] = build_tables([slow, same_lr])
    assert table.rows == ["deit_micro_irpe_k (changed from irpe_k)"]
    other = _trial("3", "rpe-0.55-product-ctx-1-k", {"rpe.method": "'product'", "model.optimizer.lr": "0.005"})
    other.facts = {**other.facts, "name": "swin_micro_irpe_k"}  # its name tells its row apart: no key needed
    [table] = build_tables([slow, other])
    assert sorted(table.rows) == ["deit_micro_irpe_k (changed from irpe_k)", "swin_micro_irpe_k (changed from irpe_k)"]


# ----------------------------------------------------------------------------- 2: loggers stay in the run dir
@pytest.mark.parametrize("logger", ["csv", "tensorboard", "wandb"])
def test_every_shipped_logger_config_passes(logger: str) -> None:
    check_settings(_compose(f"logger={logger}"))


@pytest.mark.parametrize(("override", "key"), [
    ("logger.csv.save_dir=/tmp/elsewhere/base1", "logger.csv.save_dir=/tmp/elsewhere/base1"),
    ("logger.csv.name=../../escape", "logger.csv.name=../../escape"),
    ("+logger.csv.version=../../v", "logger.csv.version=../../v"),
    ("logger.wandb.save_dir=/tmp", "logger.wandb.save_dir=/tmp"),
])
def test_a_logger_folder_outside_the_run_dir_is_refused(override: str, key: str) -> None:
    with pytest.raises(SettingError, match="outside the run's own dir; valid: leave it at the run dir default") as err:
        check_settings(_compose("logger=wandb", override))
    assert key in str(err.value).replace("'", "")


@pytest.mark.slow
def test_a_logger_pointed_into_another_run_is_refused_before_the_run_dir(tmp_path: Path) -> None:
    """Probe case 57: the CSV log of a new run landed in a finished run's dir."""
    other = tmp_path / "runs" / "base1"
    other.mkdir(parents=True)
    result = run_cli("train.py", ["debug=fast", f"paths.log_dir={tmp_path / 'runs'}", f"paths.data_dir={tmp_path}",
                                  "run_name=c41", f"logger.csv.save_dir={other}"], env_extra=ENV)
    assert result.returncode == 2
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and f"logger.csv.save_dir='{other}'" in lines[0] and "Traceback" not in result.stderr
    assert sorted(os.listdir(tmp_path / "runs")) == ["base1"] and not any(other.iterdir())


# ----------------------------------------------------------------------------- 3: a launcher that cannot run here
@pytest.mark.slow
def test_slurm_without_slurm_is_refused_before_the_sweep_dir(tmp_path: Path) -> None:
    """Probe case 82: submitit's traceback, exit 1, after multirun.yaml was written."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(shutil.which("git") or "/bin/true", bin_dir / "git")  # a PATH without sbatch and srun
    sweep = tmp_path / "sw"
    result = run_cli("train.py", ["-m", "seed=0", "hydra/launcher=slurm", "debug=fast", f"hydra.sweep.dir={sweep}",
                                  f"paths.log_dir={tmp_path / 'runs'}", f"paths.data_dir={tmp_path}"],
                     env_extra={**ENV, "PATH": str(bin_dir)})
    assert result.returncode == 2, result.stderr[-3000:]
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith("error: hydra/launcher=slurm") and "valid here: hydra/launcher=basic" in lines[0]
    assert not sweep.exists()


def test_a_submission_sbatch_refuses_is_one_line_and_leaves_no_sweep_dir(tmp_path: Path) -> None:
    """sbatch on PATH but refusing the jobs: submitit's 35-line traceback, exit 1, and a sweep dir left holding
    multirun.yaml and .submitit/ with no job in it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for command in ("sbatch", "srun"):
        (bin_dir / command).write_text('#!/bin/sh\necho "sbatch: error: invalid partition" >&2; exit 1\n')
        (bin_dir / command).chmod(0o755)
    sweep = tmp_path / "made" / "sw"
    result = run_cli("train.py", ["-m", "seed=0,1", "hydra/launcher=slurm", "debug=fast", f"hydra.sweep.dir={sweep}",
                                  f"paths.log_dir={tmp_path / 'runs'}", f"paths.data_dir={tmp_path}"],
                     env_extra={**ENV, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and result.stderr.count("invalid partition") == 1  # not echoed first
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: sbatch refused the sweep's jobs: sbatch: error: invalid"
                                                   " partition; nothing was submitted"), result.stderr
    assert sorted(os.listdir(tmp_path)) == ["bin"]  # the sweep dir and the folder made for it are gone


def test_a_refused_submission_puts_an_existing_sweep_dir_back(tmp_path: Path) -> None:
    """Into a sweep dir that was there: its earlier grid is put back and only this launch's submitit files go."""
    from lifecycle import cli

    sweep = tmp_path / "sw"
    (sweep / ".submitit" / "123").mkdir(parents=True)
    (sweep / "0").mkdir()
    (sweep / "multirun.yaml").write_text("earlier grid\n")
    cli._record_sweep_dir(sweep)
    (sweep / "multirun.yaml").write_text("this launch's grid\n")  # as Hydra's sweeper writes it
    (sweep / ".submitit" / "a.pkl").write_bytes(b"")
    (sweep / ".submitit" / ".submission_file_a.sh").write_text("")
    assert cli.take_back_sweep_dir(sweep, {"123"}) is False
    assert (sweep / "multirun.yaml").read_text() == "earlier grid\n"
    assert sorted(os.listdir(sweep)) == [".submitit", "0", "multirun.yaml"]  # the kept copy is the grid put back
    assert os.listdir(sweep / ".submitit") == ["123"]


def test_slurm_is_left_to_submitit_where_slurm_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _compose("hydra/launcher=slurm")
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    _refuse_unusable_launcher(cfg)
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "srun" else f"/usr/bin/{name}")
    with pytest.raises(CommandLineError, match=r"^hydra/launcher=slurm .*\(srun not on PATH\)"):
        _refuse_unusable_launcher(cfg)
    _refuse_unusable_launcher(_compose())  # Hydra's basic launcher runs anywhere


def test_a_row_setting_given_over_the_rows_is_labelled_by_what_it_trained() -> None:
    """Probe 22, k88t: ``-m sweep=shift_mini row=none model.net.ape=sincos`` trained a sin-cos APE, and the shift
    table counted it in row ``none`` (no position encoding) without a mark. A run whose config holds another value
    than its row's entry sets is labelled ``none [model.net.ape=sincos]``, a row of its own; every row of the
    benchmark sweeps, as the sweep composes it, keeps its own name."""
    from reports.collect import _resolved_where_possible, run_facts

    def row_of(*overrides: str) -> str:
        GlobalHydra.instance().clear()
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("train", overrides=["sweep=shift_mini", *overrides])
        GlobalHydra.instance().clear()
        return run_facts(_resolved_where_possible(cfg))["row"]

    assert row_of("row=none", "model.net.ape=sincos") == "none [model.net.ape=sincos]"
    assert row_of("row=none", "rpe.preset=shaw") == "none [rpe.preset=shaw]"
    assert row_of("row=product_ctx", "rpe.mode=bias") == "product_ctx [rpe.mode=bias]"
    assert row_of("row=product_ctx", "rpe.ratio=3.0") == "product_ctx [rpe.ratio=3.0]"  # probe 23, p30
    # probe 25, T27: the row's own values given again train the row's design
    assert row_of("row=product_ctx", "rpe.mode=ctx", "rpe.shared_head=true", "rpe.ratio=1.90") == "product_ctx"
    assert row_of("row=product_ctx", "rpe.mode=bias", "rpe.method=quant") == (  # p33T: an optuna trial's draw
        "product_ctx [rpe.mode=bias, rpe.method=quant]")
    import yaml

    rows = yaml.safe_load((CONFIG_DIR / "sweep" / "_benchmark_rows.yaml").read_text())["rows"]
    for row in [*rows, "decomposed"]:
        assert row_of(f"row={row}") == row
