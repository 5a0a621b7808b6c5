"""make_tables.py and archive_runs.py on run dirs that are damaged, unfinished, empty-handed or doubled.

Each test builds run dirs by hand in tmp_path (a where_mini config copied from docs/ablations_mini_runs,
metrics.json / run.json / failed.json written here) around two sound cells, and checks that every faulty
run is listed by name with its exact status, that the table is still built, and that the sound cells'
numbers are what their runs alone give.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from lifecycle.identity import cell_key, identity_config, identity_hash, run_length
from lifecycle.records import RunRecord, lock_run_dir, release_lock
from scripts import archive_runs, make_tables
from storage.files import with_checksum

ARCHIVE = Path(__file__).resolve().parents[1] / "docs" / "ablations_mini_runs" / "where_mini"
K = "model.net.ape=sincos,rpe.preset=rpe-1.9-product-ctx-1-k"  # row k, column with APE
NONE = "model.net.ape=sincos,rpe.preset=none"  # row none, column with APE
SOUND = {(K, 0): 80.0, (K, 1): 82.0, (NONE, 0): 70.0, (NONE, 1): 74.0}


def _config(job: str, seed: int, **edits: object) -> dict:
    """The archived config of ``job`` at ``seed``, with dotted ``edits`` (``trainer__max_epochs=8``)."""
    cfg = OmegaConf.load(ARCHIVE / f"{job},seed=0" / "config.yaml")
    cfg.seed = seed
    cfg.run_name = f"where_mini/{job},seed={seed}"
    for key, value in edits.items():
        OmegaConf.update(cfg, key.replace("__", "."), value)
    return OmegaConf.to_container(cfg)


def _run(root: Path, name: str, job: str, seed: int, metrics: object = None, state: str | None = None,
         **edits: object) -> Path:
    """A run dir: config.yaml, .hydra/overrides.yaml, metrics.json (when given) and run.json (when ``state``)."""
    run_dir = root / name
    (run_dir / ".hydra").mkdir(parents=True)
    cfg = _config(job, seed, **edits)
    OmegaConf.save(OmegaConf.create(cfg), run_dir / "config.yaml")
    overrides = [f"seed={seed}", *job.split(","), "sweep=where_mini"]
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    identity = identity_config(cfg)
    if isinstance(metrics, str) and state is not None:
        try:
            metrics = json.loads(metrics) if isinstance(json.loads(metrics), dict) else metrics
        except json.JSONDecodeError:
            pass  # a damaged file stays as given
    if isinstance(metrics, dict) and state is not None:  # a job's metrics.json names its run's identity
        metrics = {**metrics, "identity": identity_hash(identity)}
    if metrics is not None:
        text = metrics if isinstance(metrics, str) else json.dumps(
            with_checksum(metrics) if isinstance(metrics, dict) else metrics)
        (run_dir / "metrics.json").write_text(text)
    if state is not None:  # what the job writes, through the lifecycle's only writer of run.json
        RunRecord(run_dir, identity_hash(identity), identity, run_length(cfg)).save(state)
    return run_dir


def _sound_runs(root: Path) -> None:
    for (job, seed), top1 in SOUND.items():
        _run(root, f"{job},seed={seed}", job, seed, {"val/top1": top1, "val/top5": 100.0}, state="finished")


def _tables(root: Path) -> dict[str, make_tables.Table]:
    return {t.name: t for t in make_tables.build_tables(make_tables.collect([root]))}


def _runs_by_path(tables: dict[str, make_tables.Table]) -> dict[str, make_tables.Run]:
    return {Path(r.path).name: r for t in tables.values() for c in t.cells.values() for r in c.runs}


def _assert_sound_cells(table: make_tables.Table, k_row: str = "k") -> None:
    """The sound cells hold exactly their own two runs' numbers (hand-worked: 80, 82 and 70, 74)."""
    k, none = table.cells[(k_row, "with APE")], table.cells[("none", "with APE")]
    assert k.stats("val/top1") == (81.0, pytest.approx(math.sqrt(2)), 2)
    assert none.stats("val/top1") == (72.0, pytest.approx(math.sqrt(8)), 2)
    assert k.by_seed("val/top1") == {0: 80.0, 1: 82.0}


def _csv(tables: dict[str, make_tables.Table], tmp_path: Path) -> dict[tuple[str, str], dict]:
    out = tmp_path / "out" / "t"
    make_tables.write_outputs(list(tables.values()), out)
    return {(r["table"], r["row"]): r for r in make_tables.read_csv(out.with_suffix(".csv"))
            if r["metric"] in ("val/top1", "")}


# ----------------------------------------------------------------------------- unreadable runs
def test_unreadable_runs_are_listed_by_name_and_never_lose_the_table(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _sound_runs(runs)
    broken = _run(runs, "broken_config", K, 2, {"val/top1": 99.0})
    (broken / "config.yaml").write_text("rpe: [1\n")
    listed = _run(runs, "metrics_list", K, 3, [1, 2, 3])
    damaged = _run(runs, "run_json_damaged", K, 4, {"val/top1": 99.0}, state="finished")
    (damaged / "run.json").write_text('{"identity": "ab')
    edited = _run(runs, "config_edited", K, 5, {"val/top1": 99.0}, state="finished")
    cfg = OmegaConf.load(edited / "config.yaml")
    cfg.rpe.ratio = 2.5  # after the run: the result is not this config's
    OmegaConf.save(cfg, edited / "config.yaml")

    tables = _tables(runs)
    assert list(tables) == ["where_mini", make_tables.NOT_COUNTED]
    _assert_sound_cells(tables["where_mini"])
    by_name = _runs_by_path(tables)
    assert {n: r.status for n, r in by_name.items() if r.status != "ok"} == {
        "broken_config": "unreadable", "metrics_list": "unreadable", "run_json_damaged": "unreadable",
        "config_edited": "unreadable"}
    assert "config.yaml is damaged: not valid YAML" in by_name["broken_config"].error
    assert by_name["metrics_list"].error == f"{listed / 'metrics.json'} is damaged: it holds a JSON list, not a dict"
    assert by_name["run_json_damaged"].error.startswith(f"{damaged / 'run.json'} is damaged: not valid JSON")
    assert by_name["config_edited"].error == (
        f"{edited / 'config.yaml'} is not the config of {edited / 'run.json'} (damaged or edited?): "
        "rpe.ratio: None -> 2.5")
    assert all(not r.metrics for r in by_name.values() if r.status != "ok")
    # a sound config places its run in its cell; one that is broken or not its record's is listed apart
    assert tables["where_mini"].cells[("k", "with APE")].text("val/top1") == "81.00 ± 1.41 (n=2), 2 unreadable"
    assert sorted(r.path for c in tables[make_tables.NOT_COUNTED].cells.values() for r in c.runs) == [
        str(broken), str(edited)]

    markdown = make_tables.to_markdown(list(tables.values()))
    assert "## Runs not counted\n\nNo cell can hold these runs" in markdown
    assert f"- unreadable: `{broken}`: {broken / 'config.yaml'} is damaged: not valid YAML" in markdown
    assert f"- unreadable: `{listed}`: {listed / 'metrics.json'} is damaged" in markdown
    rows = _csv(tables, tmp_path)
    assert rows[("where_mini", "k")]["unreadable"] == 2 and rows[("where_mini", "k")]["n"] == 2
    assert rows[(make_tables.NOT_COUNTED, str(broken))] | {"errors": ""} == {
        "table": make_tables.NOT_COUNTED, "row": str(broken), "col": "status", "metric": "", "mean": None,
        "std": None, "n": 0, "ok": 0, "failed": 0, "unfinished": 0, "missing": 0, "interrupted": 0, "running": 0,
        "died": 0, "no_result": 0, "unreadable": 1, "duplicate": 0, "paper": None, "used": "", "same_as": "",
        "runs": str(broken), "errors": ""}
    assert "not valid YAML" in rows[(make_tables.NOT_COUNTED, str(broken))]["errors"]


@pytest.mark.parametrize(("text", "reason"), [
    ("", "is damaged: empty"),
    ("- 1\n- 2\n", "is damaged: it holds a YAML list, not a config"),
    ("seed: 0\nrpe:\n  preset: no", "is damaged: truncated (it does not end with a line break)"),
    # probe 12, H58: re-encoded by an editor; the line said "UnicodeDecodeError" only
    ("\ufeffseed: 0\n".encode("utf-16").decode("latin-1"), "is damaged: not UTF-8 text, as train.py writes it"),
])
def test_a_config_that_is_no_config_is_unreadable(tmp_path: Path, text: str, reason: str) -> None:
    run_dir = _run(tmp_path, "run", K, 0, {"val/top1": 99.0})
    (run_dir / "config.yaml").write_bytes(text.encode("latin-1") if "\x00" in text else text.encode())
    [run] = make_tables.collect([tmp_path])
    assert (run.status, run.error, run.metrics) == ("unreadable", f"{run_dir / 'config.yaml'} {reason}", {})


def test_a_finished_run_without_its_resolved_config_is_unreadable(tmp_path: Path) -> None:
    """Hydra's .hydra/config.yaml is not resolved: it places runs without a result only."""
    done = _run(tmp_path, "done", K, 0, {"val/top1": 99.0}, state="finished")
    failed = _run(tmp_path, "failed", K, 1)
    for run_dir in (done, failed):
        (run_dir / "config.yaml").rename(run_dir / ".hydra" / "config.yaml")
    (failed / "failed.json").write_text(json.dumps({"error": "out of memory"}))
    runs = {Path(r.path).name: r for r in make_tables.collect([tmp_path])}
    assert (runs["done"].status, runs["done"].error) == ("unreadable", f"{done / 'config.yaml'} is missing")
    assert (runs["failed"].status, runs["failed"].error, runs["failed"].facts["rpe"]) == (
        "failed", "out of memory", "rpe-1.9-product-ctx-1-k")


def test_an_unreadable_run_of_a_sweep_sits_in_the_cell_of_its_grid_point(tmp_path: Path) -> None:
    sweep = tmp_path / "where_mini"
    for seed, top1 in ((0, 80.0), (1, 82.0), (2, 99.0)):
        _run(sweep, f"{K},seed={seed}", K, seed, {"val/top1": top1})
    (sweep / f"{K},seed=2" / "config.yaml").write_text("{\n")
    grid = {"seed": "0,1,2", "rpe.preset": "rpe-1.9-product-ctx-1-k", "model.net.ape": "sincos"}
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {
        "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper", "params": grid},
        "overrides": {"task": ["sweep=where_mini"]}}}))
    [table] = make_tables.build_tables(make_tables.collect([sweep]))
    cell = table.cells[("k", "with APE")]
    assert sorted((Path(r.path).name, r.status) for r in cell.runs) == [
        (f"{K},seed=0", "ok"), (f"{K},seed=1", "ok"), (f"{K},seed=2", "unreadable")]
    assert cell.text("val/top1") == "81.00 ± 1.41 (n=2), 1 unreadable"  # not "missing": the run dir is there


def test_a_damaged_grid_is_listed_and_its_runs_still_counted(tmp_path: Path) -> None:
    sweep = tmp_path / "where_mini"
    _sound_runs(sweep)
    (sweep / "multirun.yaml").write_text("hydra: [1, 2\n")
    tables = _tables(sweep)
    _assert_sound_cells(tables["where_mini"])
    [listed] = [r for c in tables[make_tables.NOT_COUNTED].cells.values() for r in c.runs]
    assert listed.status == "unreadable" and listed.path == str(sweep / "multirun.yaml")
    assert listed.error.startswith(f"{sweep / 'multirun.yaml'} is damaged: not valid YAML")
    assert listed.error.endswith(f"the grid of {sweep} is unknown, so its runs that never started are not listed"
                                 " (its runs that are there are counted)")
    # probe 20, w44: a damaged optuna trials record is the file named, not multirun.yaml
    (sweep / "multirun.yaml").write_text("hydra:\n  sweeper:\n    _target_: x.RpeOptunaSweeper\n")
    (sweep / "trials.yaml").write_text("evil: !!python/object/apply:os.system [echo]\n")
    tables = _tables(sweep)
    _assert_sound_cells(tables["where_mini"])
    [listed] = [r for c in tables[make_tables.NOT_COUNTED].cells.values() for r in c.runs]
    assert listed.path == str(sweep / "trials.yaml") and listed.error.startswith(
        f"{sweep / 'trials.yaml'} is damaged: not valid YAML"), listed


# ----------------------------------------------------------------------------- runs without a result
@pytest.mark.parametrize(("metrics", "error"), [
    ({"val/top1": None, "val/top5": 90.0}, "val/top1 is null or NaN in metrics.json (not a finite number)"),
    ('{"val/top1": NaN, "val/top5": NaN}', "val/top1, val/top5 are null or NaN in metrics.json (not a finite number)"),
    ({"val/loss": 0.5, "epoch": 3}, "metrics.json has no val/top1 or val/top5"),
    ({"val/top1": 99.0, "val/top5": 100.0, "tested_batches": 2, "test_complete": False},
     "its test read 2 batches, a part of its split (trainer.limit_test_batches); rerun without the limit"),
])
def test_a_null_or_absent_metric_is_no_result(tmp_path: Path, metrics: object, error: str) -> None:
    """An archived run (no run.json) whose metrics.json lacks a number is listed as no result; a live run's
    job never writes such a file, so there it is a damaged record."""
    _sound_runs(tmp_path)
    _run(tmp_path, "nan_run", K, 2, metrics)
    live_root = tmp_path.with_name(f"{tmp_path.name}_live")  # beside tmp_path: its own table
    live = _run(live_root, "live_run", K, 3, metrics, state="finished")
    run = _runs_by_path(_tables(live_root))["live_run"]
    if "test_complete" in str(metrics):  # a finite headline: the partial test is listed as no result
        assert (run.status, run.error) == ("no result", error)
    else:
        assert (run.status, run.error) == ("unreadable", f"{live / 'metrics.json'} is damaged: it holds no finite"
                                           " val/top1 or val/AP, which the test of a finished run always records")
    tables = _tables(tmp_path)
    _assert_sound_cells(tables["where_mini"])
    run = _runs_by_path(tables)["nan_run"]
    assert (run.status, run.error, run.metrics) == ("no result", error, {})
    assert tables["where_mini"].cells[("k", "with APE")].text("val/top1") == "81.00 ± 1.41 (n=2), 1 no result"
    assert f"- no result: `{tmp_path / 'nan_run'}`: {error}" in make_tables.to_markdown(list(tables.values()))
    assert _csv(tables, tmp_path)[("where_mini", "k")]["no_result"] == 1


def test_an_extension_that_did_not_finish_is_not_its_earlier_result(tmp_path: Path) -> None:
    """A 3-epoch run extended to 8 keeps its 3-epoch metrics.json until the extension finishes."""
    _sound_runs(tmp_path)
    for seed, (name, state) in enumerate((("interrupted", "interrupted"), ("running", "running"), ("died", "running"))):
        _run(tmp_path, name, K, seed, {"val/top1": 99.0, "epoch": 3}, state=state, trainer__max_epochs=8)
    fd, _ = lock_run_dir(tmp_path / "running")  # its job is alive
    try:
        tables = _tables(tmp_path)
    finally:
        release_lock(fd)
    where = tables["where_mini"]
    _assert_sound_cells(where, k_row="k [trainer.max_epochs=3]")  # the 3-epoch cell keeps its own runs only
    longer = where.cells[("k [trainer.max_epochs=8]", "with APE")]
    assert longer.text("val/top1") == "1 interrupted, 1 running, 1 died" and longer.stats("val/top1")[2] == 0
    runs = _runs_by_path(tables)
    assert {n: runs[n].status for n in ("interrupted", "running", "died")} == {
        "interrupted": "interrupted", "running": "running", "died": "died"}
    earlier = "; its metrics.json is an earlier result, not one of this length"
    assert runs["interrupted"].error == ("stopped before its end; rerun the same command to resume it "
                                         f"(trainer.max_epochs=8, trainer.max_steps=-1){earlier}")
    assert runs["running"].error.startswith("its job is still running (it holds run.lock)")
    assert runs["died"].error.startswith("run.json says running, but no process holds run.lock: the job died")
    assert all(not runs[n].metrics for n in ("interrupted", "running", "died"))


# ----------------------------------------------------------------------------- duplicates
def test_the_same_config_and_seed_counts_once_and_the_rest_are_listed(tmp_path: Path) -> None:
    _sound_runs(tmp_path)
    # `-m seed=0,0`: two job dirs of one identity and seed (run_name differs: it is no part of the identity)
    twice = _run(tmp_path, "z_seed0_again", K, 0, {"val/top1": 90.0, "val/top5": 100.0}, state="finished")
    again = _run(tmp_path, "0_none_seed1_again", NONE, 1, {"val/top1": 10.0}, state="finished")  # sorts first
    failed = _run(tmp_path, "a_none_seed1_failed", NONE, 1)
    (failed / "failed.json").write_text(json.dumps({"error": "out of memory"}))
    tables = _tables(tmp_path)
    runs = _runs_by_path(tables)
    first = tmp_path / f"{K},seed=0"
    assert (runs["z_seed0_again"].status, runs["z_seed0_again"].error) == (
        "duplicate", f"same config and seed as {first}, which is counted")
    # of several ok runs the first by path counts; a failed attempt at the seed is listed as failed, not counted
    assert (runs[f"{NONE},seed=1"].status, runs[f"{NONE},seed=1"].error) == (
        "duplicate", f"same config and seed as {again}, which is counted")
    assert (runs["a_none_seed1_failed"].status, runs["a_none_seed1_failed"].error) == ("failed", "out of memory")
    where = tables["where_mini"]
    assert where.cells[("k", "with APE")].stats("val/top1") == (81.0, pytest.approx(math.sqrt(2)), 2)  # not n=3
    assert where.cells[("k", "with APE")].text("val/top1") == "81.00 ± 1.41 (n=2), 1 duplicate"
    assert where.cells[("none", "with APE")].by_seed("val/top1") == {0: 70.0, 1: 10.0}
    assert where.cells[("none", "with APE")].text("val/top1") == "40.00 ± 42.43 (n=2), 1 failed, 1 duplicate"
    markdown = make_tables.to_markdown(list(tables.values()))
    assert f"- duplicate: `{twice}`: same config and seed as {first}, which is counted" in markdown
    assert _csv(tables, tmp_path)[("where_mini", "k")]["duplicate"] == 1


@pytest.mark.parametrize(("edit", "same_cell"), [
    ({"seed": 7}, True),
    ({"run_name": "elsewhere", "data__root": "/other", "trainer__log_every_n_steps": 3, "logger": None}, True),
    ({"callbacks__model_checkpoint__dirpath": "/x/checkpoints", "test_after_fit": False}, True),
    ({"trainer__max_epochs": 8}, False),
    ({"rpe__ratio": 2.5}, False),
    ({"data__batch_size": 64}, False),
])
def test_a_cell_is_the_lifecycles_cell_key(edit: dict, same_cell: bool) -> None:
    """One definition of "the same cell": the table's identity agrees with `cell_key` on every change."""
    base = _config(K, 0)
    node = OmegaConf.create(base)
    for key, value in edit.items():
        OmegaConf.update(node, key.replace("__", "."), value)
    changed = OmegaConf.to_container(node)
    assert changed != base
    assert (cell_key(base) == cell_key(changed)) is same_cell
    assert (make_tables.cell_identity(base) == make_tables.cell_identity(changed)) is same_cell


# ----------------------------------------------------------------------------- the archive
def _sweep_with_multirun(root: Path) -> Path:
    sweep = root / "where_mini"
    _sound_runs(sweep)
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"sweeper": {"_target_": "optuna"}}}))
    return sweep


def test_archive_keeps_run_json_and_leaves_out_runs_that_have_not_ended(tmp_path: Path, capsys) -> None:
    sweep = _sweep_with_multirun(tmp_path / "runs")
    archive = tmp_path / "archive"
    assert archive_runs.main([str(sweep), "--to", str(archive)]) == 0
    kept = archive / "where_mini" / f"{K},seed=0"
    assert sorted(p.name for p in kept.rglob("*") if p.is_file()) == [
        "config.yaml", "metrics.json", "overrides.yaml", "run.json"]
    assert json.loads((kept / "run.json").read_text())["length"] == {"max_epochs": 3, "max_steps": -1}
    # a later sitting extends seed 0 to 8 epochs and is interrupted: the archive keeps the 3-epoch result
    extended = _run(sweep, "ext", K, 0, state="interrupted", trainer__max_epochs=8)
    os.replace(extended / "config.yaml", sweep / f"{K},seed=0" / "config.yaml")
    os.replace(extended / "run.json", sweep / f"{K},seed=0" / "run.json")
    for path in sorted(extended.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    extended.rmdir()
    before = {p: p.read_bytes() for p in kept.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert archive_runs.main([str(sweep), "--to", str(archive)]) == 0
    assert f"1 left out: {sweep / f'{K},seed=0'} (interrupted)" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in kept.rglob("*") if p.is_file()} == before
    runs = {Path(r.path).name: r for r in make_tables.collect([archive / "where_mini"])}
    assert (runs[f"{K},seed=0"].status, runs[f"{K},seed=0"].metrics["val/top1"]) == ("ok", 80.0)


@pytest.mark.parametrize(("damage", "named"), [
    ("metrics.json", "metrics.json is damaged: it holds a JSON list, not a dict"),
    ("run.json", "run.json is damaged: empty"),
    ("overrides.yaml", ".hydra/overrides.yaml is damaged: Error parsing override 'data.num_wor'"),
    ("config.yaml", "config.yaml is not the config of"),
])
def test_archive_refuses_a_damaged_run_and_writes_nothing(tmp_path: Path, capsys, damage: str, named: str) -> None:
    sweep = _sweep_with_multirun(tmp_path / "runs")
    run_dir = sweep / f"{K},seed=1"
    if damage == "metrics.json":
        (run_dir / "metrics.json").write_text("[1, 2, 3]\n")
    elif damage == "run.json":
        (run_dir / "run.json").write_text("")
    elif damage == "overrides.yaml":
        (run_dir / ".hydra" / "overrides.yaml").write_text("- seed=1\n- data.num_wor\n")
    else:
        (run_dir / "config.yaml").write_text((run_dir / "config.yaml").read_text().replace("ratio: null", "ratio: 2.9"))
    capsys.readouterr()
    assert archive_runs.main([str(sweep), "--to", str(tmp_path / "archive")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and named in line and str(run_dir) in line
    assert not (tmp_path / "archive").exists()


def test_a_huge_sparse_findings_snapshot_is_never_read_whole_nor_archived(tmp_path: Path, capsys) -> None:
    """Probe 9, B21: a 2 GiB sparse ``findings.yaml`` in a run made make_tables hold it in memory (3 GB) and
    archive_runs copy it, fully allocated, into the archive. It now counts as no snapshot (the run registered
    nothing), and the archive refuses it in one line, writing nothing."""
    import hashlib

    from lifecycle.records import FINDINGS_SNAPSHOT, RUN_RECORD
    from reports.collect import registered_snapshot

    sweep = _sweep_with_multirun(tmp_path / "runs")
    run_dir = sweep / f"{K},seed=1"
    snapshot = run_dir / FINDINGS_SNAPSHOT
    snapshot.write_text("task: where_mini\nfindings: []\n")
    record = json.loads((run_dir / RUN_RECORD).read_text())
    record["findings_sha256"] = hashlib.sha256(snapshot.read_bytes()).hexdigest()
    (run_dir / RUN_RECORD).write_text(json.dumps(record) + "\n")
    assert registered_snapshot(run_dir) == (str(snapshot), {"task": "where_mini", "findings": []})
    os.truncate(snapshot, 2 * 2**30)
    assert registered_snapshot(run_dir) is None
    capsys.readouterr()
    assert archive_runs.main([str(sweep), "--to", str(tmp_path / "archive")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {snapshot} is damaged: larger than 16 MiB"), line
    assert not (tmp_path / "archive").exists()


def test_archive_refuses_a_destination_in_a_run_or_the_sweep_itself(tmp_path: Path, capsys) -> None:
    sweep = _sweep_with_multirun(tmp_path / "runs")
    run = _run(tmp_path / "elsewhere", "finished", K, 0, {"val/top1": 80.0}, state="finished")
    before = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()}
    for dest, expected in ((run / "a", "is inside the run dir"), (sweep.parent, "in or around the sweep itself")):
        assert archive_runs.main([str(sweep), "--to", str(dest)]) == 2
        assert expected in capsys.readouterr().err
    assert {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()} == before


def test_archive_refuses_a_destination_inside_another_sweep_even_through_a_link(tmp_path: Path, capsys) -> None:
    """Probe 9, A16: ``--to l16``, a link to another live sweep dir, put the archive inside that sweep, whose table
    then counted the archived runs as its own jobs. The archive's folder never lies inside a sweep dir."""
    sweep = _sweep_with_multirun(tmp_path / "runs")
    other = tmp_path / "other_sweep"
    other.mkdir()
    (other / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"sweeper": {}}}))
    (tmp_path / "l16").symlink_to(other, target_is_directory=True)
    for dest in (other, tmp_path / "l16", other / "deeper"):
        assert archive_runs.main([str(sweep), "--to", str(dest)]) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert f"is inside the sweep dir {other}, whose tables would count the archived runs" in line, line
    assert sorted(p.name for p in other.iterdir()) == ["multirun.yaml"]
    assert archive_runs.main([str(sweep), "--to", str(tmp_path / "archive")]) == 0  # a folder of its own
    assert archive_runs.main([str(sweep), "--to", str(tmp_path / "archive")]) == 0  # and again, onto itself


def test_two_configs_with_the_same_shortened_label_are_never_merged(tmp_path: Path) -> None:
    """Groups that differ in more keys than a label shows get a config digest: each keeps its own row."""
    _run(tmp_path, "a", K, 0, {"val/top1": 80.0, "val/top5": 100.0}, state="finished",
         data__generator__num_train=256, model__optimizer__lr=1e-3, model__net__drop_rate=0.0)
    _run(tmp_path, "b", K, 0, {"val/top1": 60.0, "val/top5": 100.0}, state="finished",
         data__generator__num_train=3000, model__optimizer__lr=2e-3, model__net__drop_rate=0.1,
         trainer__gradient_clip_val=1.0)
    _run(tmp_path, "c", K, 0, {"val/top1": 70.0, "val/top5": 100.0}, state="finished",
         data__generator__num_train=256, model__optimizer__lr=1e-3, model__net__drop_rate=0.0,
         trainer__gradient_clip_val=2.0)
    runs = _runs_by_path(_tables(tmp_path))
    assert {name for name, run in runs.items() if run.status == "ok"} >= {"a", "b", "c"}


def _grid_yaml(params: dict, task: list[str]) -> str:
    """A multirun.yaml as Hydra's basic sweeper saves it (the part make_tables reads)."""
    return yaml.safe_dump({"hydra": {"sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                                                 "params": params}, "overrides": {"task": task}}})


def test_a_later_launch_keeps_the_earlier_grid_and_the_table_expects_both(tmp_path: Path) -> None:
    """Hydra rewrites multirun.yaml at each launch; train.py first keeps the earlier grid beside it, so a
    launch with another seed (or one that was refused) does not make the earlier jobs unexpected."""
    from lifecycle.cli import keep_earlier_grid
    from reports.collect import expected_jobs

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    assert keep_earlier_grid(sweep) is None  # a new sweep: nothing to keep
    (sweep / "multirun.yaml").write_text(_grid_yaml({"seed": "0,1"}, ["rpe=irpe_k"]))
    assert keep_earlier_grid(sweep) == sweep / "multirun.1.yaml"
    assert keep_earlier_grid(sweep) is None  # kept already
    (sweep / "multirun.yaml").write_text(_grid_yaml({"seed": "5"}, ["rpe=irpe_k"]))  # what Hydra then writes
    assert expected_jobs(sweep) == [["seed=0", "rpe=irpe_k"], ["seed=1", "rpe=irpe_k"], ["seed=5", "rpe=irpe_k"]]
    assert keep_earlier_grid(sweep) == sweep / "multirun.2.yaml"
    (sweep / "multirun.yaml").write_text(_grid_yaml({"seed": "1,2"}, ["rpe=irpe_k"]))
    assert [job[0] for job in expected_jobs(sweep)] == ["seed=0", "seed=1", "seed=5", "seed=2"]  # each job once

    archive = tmp_path / "archive"
    assert archive_runs.main([str(sweep), "--to", str(archive)]) == 0
    assert sorted(p.name for p in (archive / "sweep").iterdir()) == [".archive.json", "multirun.1.yaml",
                                                                     "multirun.2.yaml", "multirun.yaml"]
    assert expected_jobs(archive / "sweep") == expected_jobs(sweep)


def test_a_missing_job_of_a_numbered_sweep_names_the_dir_it_would_have(tmp_path: Path) -> None:
    """Probe 10, C55t: a missing job of a sweep with numbered job dirs was named by its overrides only; its dir
    is its place in the latest launch (Hydra's default subdir ``${hydra.job.num}``)."""
    sweep = tmp_path / "sw"
    sweep.mkdir()
    grid = yaml.safe_load(_grid_yaml({"seed": "0,1"}, ["rpe=irpe_k"]))
    grid["hydra"]["sweep"] = {"dir": str(sweep), "subdir": "${hydra.job.num}"}
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(grid))
    runs = [r for r in make_tables.collect([sweep]) if r.status == "missing"]
    assert [r.error for r in runs] == [f"no run dir (its dir would be {sweep / '0'})",
                                       f"no run dir (its dir would be {sweep / '1'})"]


def test_an_optuna_trial_that_never_had_a_run_dir_is_named_and_archived(tmp_path: Path) -> None:
    """Probe 11, e78: an optuna sweep has no grid, so a trial that failed before it had a run dir appeared nowhere
    in the table ("1 ok"). The sweeper records each trial's overrides as it launches it (`record_trials`); the
    tables expect them as a basic sweep's grid points, and the archive keeps the record."""
    from lifecycle.sweeper import record_trials  # the optuna extra: tests run with it installed
    from reports.collect import expected_jobs

    sweep = tmp_path / "sw"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {
        "sweeper": {"_target_": "hydra_plugins.rpe_sweepers.optuna_rpe.RpeOptunaSweeper", "params": {}},
        "sweep": {"dir": str(sweep), "subdir": "${hydra.job.num}"}, "overrides": {"task": ["rpe=irpe_k"]}}}))
    record_trials(sweep, [["rpe=irpe_k", "seed=3"]], 0)
    record_trials(sweep, [("rpe=irpe_k", "seed=8"), ("rpe=irpe_k", "seed=1")], 1)  # a later batch adds its trials
    assert expected_jobs(sweep) == [["rpe=irpe_k", "seed=3"], ["rpe=irpe_k", "seed=8"], ["rpe=irpe_k", "seed=1"]]
    runs = [r for r in make_tables.collect([sweep]) if r.status == "missing"]
    assert [r.error for r in runs] == [f"no run dir (its dir would be {sweep / str(n)})" for n in range(3)]
    archive = tmp_path / "archive"
    assert archive_runs.main([str(sweep), "--to", str(archive)]) == 0
    assert expected_jobs(archive / "sw") == expected_jobs(sweep)
    (sweep / "trials.yaml").write_text("trials: [1, 2]\n")
    (bad,) = [r for r in make_tables.collect([sweep]) if r.status == "unreadable"]
    assert "trials.yaml is damaged: not the record of an optuna sweep's trials" in bad.error


def test_a_sweep_config_launch_keeps_the_earlier_grid_without_dash_m(tmp_path: Path) -> None:
    """``train.py sweep=<name> seed=...`` is a sweep through its config's Hydra mode, not ``-m``: its
    pre-flight keeps the earlier launch's grid too (two lanes of scripts/benchmark_tasks.sh are two launches)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lifecycle.cli import check_overrides
    from lifecycle.project import CONFIG_DIR

    sweep = tmp_path / "sweeps" / "shift_mini"
    sweep.mkdir(parents=True)
    task = ["sweep=shift_mini", "seed=0,2", f"paths.log_dir={tmp_path}"]
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):  # lane 0's grid, as Hydra saves it
        hydra = compose("train", overrides=task[:1] + task[2:], return_hydra_config=True).hydra
    GlobalHydra.instance().clear()
    lane0 = OmegaConf.to_yaml({"hydra": {**OmegaConf.to_container(hydra, resolve=False, enum_to_str=True),
                                         "overrides": {"task": task}}})
    (sweep / "multirun.yaml").write_text(lane0)
    check_overrides(["sweep=shift_mini", "seed=1,3", f"paths.log_dir={tmp_path}"], "train")
    assert (sweep / "multirun.1.yaml").read_text() == lane0


def test_a_missing_job_of_a_plain_multirun_has_its_run_name_resolved(tmp_path: Path) -> None:
    """`train.py -m seed=0,1` without a sweep config: the default name is `${hydra:runtime.choices...}`,
    which the missing job's label resolves (not the raw interpolation)."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text(_grid_yaml({}, ["seed=0,1", "rpe=irpe_qkv"]))
    missing = [r for r in make_tables.collect([sweep]) if r.status == "missing"]
    assert [r.facts["name"] for r in missing] == ["deit_micro_irpe_qkv"] * 2
    assert [r.facts["seed"] for r in missing] == [0, 1]


# ----------------------------------------------------------------------------- reading configs
@pytest.mark.parametrize("text", [
    "lr: 1e-3\nwd: 5.0e-2\nn: 1_000\nwhen: 2026-12-05\nx: .nan\ny: -.inf\nz: ${paths.log_dir}/a\n",
    "a: {b: [1, 2.5, null, true, 'q']}\nc: !!python/object/apply:pathlib.PosixPath [/tmp, x]\n",
    "k: 0o17\nh: 0x1F\ns: '007'\nyes_word: yes\n",
], ids=["floats_dates_interpolations", "nesting_and_path_tag", "yaml11_scalars"])
def test_a_config_reads_as_omegaconf_reads_it(tmp_path: Path, text: str) -> None:
    """collect.read_config parses with libyaml (speed); the values and their types are OmegaConf's."""
    import io

    from reports.collect import read_config

    path = tmp_path / "config.yaml"
    path.write_text(text)
    expected = OmegaConf.to_container(OmegaConf.load(io.StringIO(text)), resolve=False)
    assert repr(read_config(path)) == repr(expected)


@pytest.mark.slow
def test_archived_configs_read_as_omegaconf_reads_them() -> None:
    """Every tenth archived run config (all 976 were compared once, 2026-12-05: identical, 14x faster)."""
    import io

    from reports.collect import read_config

    files = sorted((Path(__file__).resolve().parents[1] / "docs").glob("**/config.yaml"))[::10]
    assert len(files) >= 20
    for path in files:
        expected = OmegaConf.to_container(OmegaConf.load(io.StringIO(path.read_text())), resolve=False)
        assert repr(read_config(path)) == repr(expected), path


def test_duplicate_keys_and_unsafe_tags_are_one_line(tmp_path: Path) -> None:
    from reports.collect import TableError, read_config

    path = tmp_path / "config.yaml"
    path.write_text("a: 1\na: 2\n")
    with pytest.raises(TableError, match="is damaged: not valid YAML"):
        read_config(path)
    path.write_text("a: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(TableError, match="is damaged: not valid YAML"):
        read_config(path)
    path.write_text("- 1\n- 2\n")
    with pytest.raises(TableError, match="it holds a YAML list, not a config"):
        read_config(path)


# ----------------------------------------------------------------------------- overrides that are not the run's
NAMED = "${job_dirname:${hydra.job.override_dirname}}"  # configs/sweep/_base.yaml: job dirs named after overrides


def _two_seed_sweep(root: Path, subdir: str | None = None) -> Path:
    """A finished sweep of K at seeds 0 and 1 with its grid; ``subdir``: its ``hydra.sweep.subdir``."""
    sweep = root / "where_mini"
    for seed, top1 in ((0, 80.0), (1, 82.0)):
        _run(sweep, f"{K},seed={seed}", K, seed, {"val/top1": top1, "val/top5": 100.0}, state="finished")
    saved = yaml.safe_load(_grid_yaml({"seed": "0,1", "rpe.preset": "rpe-1.9-product-ctx-1-k",
                                       "model.net.ape": "sincos"}, ["sweep=where_mini"]))
    if subdir is not None:
        saved["hydra"]["sweep"] = {"subdir": subdir}
        saved["hydra"]["job"] = {"config": {"override_dirname": {"kv_sep": "=", "item_sep": ",",
                                                                 "exclude_keys": ["sweep", "trainer"]}}}
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(saved))
    return sweep


@pytest.mark.parametrize(("subdir", "edit", "why"), [
    (None, ("seed=1", "seed=0"), "seed=0, but the config has seed=1"),  # probe 3, case 100
    (NAMED, ("seed=1", "seed=0"), "seed=0, but the config has seed=1"),
    (None, ("model.net.ape=sincos", "model.net.ape=learned"), "model.net.ape=learned, but the config has"
                                                               " model.net.ape='sincos'"),
    # a group choice sets no one value; the dir name its overrides give is not the run's
    (NAMED, ("sweep=where_mini", "sweep=where_mini\n- rpe=irpe_qkv"), "they name the job's dir"
                                                                       f" '{K},rpe=irpe_qkv,seed=1', the run dir is"),
])
def test_a_run_whose_overrides_are_not_its_own_is_listed_and_never_missing(
        tmp_path: Path, capsys, subdir: str | None, edit: tuple[str, str], why: str) -> None:
    """A job's .hydra/overrides.yaml edited by hand: make_tables said its grid point had no run dir (while counting
    the run), archive_runs kept the edited file. Overrides must be those of the run's config (and, where the sweep
    names job dirs after them, of its dir name): the run is placed by its config and listed with the reason."""
    sweep = _two_seed_sweep(tmp_path / "runs", subdir)
    sound = make_tables.collect([sweep])
    assert [(r.status, r.overrides_problem) for r in sound] == [("ok", "")] * 2  # the sound sweep: no false alarm
    overrides = sweep / f"{K},seed=1" / ".hydra" / "overrides.yaml"
    overrides.write_text(overrides.read_text().replace(*edit))
    runs = make_tables.collect([sweep])
    assert [r.status for r in runs] == ["ok", "ok"]  # both there, both counted: nothing missing
    edited = runs[1]
    assert edited.overrides is None
    assert edited.overrides_problem.startswith(f"{overrides} is not the overrides of")
    assert why in edited.overrides_problem
    [table] = make_tables.build_tables(runs)
    assert table.cells[("k", "with APE")].text("val/top1") == "81.00 ± 1.41 (n=2)"
    markdown = make_tables.to_markdown([table])
    assert f"- `{edited.path}`: {edited.overrides_problem}" in markdown
    assert edited.overrides_problem in make_tables.to_csv([table])
    capsys.readouterr()
    assert archive_runs.main([str(sweep), "--to", str(tmp_path / "archive")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == f"error: {edited.overrides_problem}"
    assert not (tmp_path / "archive").exists()


def test_a_run_without_usable_overrides_fills_the_grid_point_of_its_config(tmp_path: Path) -> None:
    """A damaged or absent overrides.yaml: the run's config places it, so no grid point is reported missing, and
    a grid point with no run dir still is."""
    sweep = _two_seed_sweep(tmp_path / "runs")
    (sweep / f"{K},seed=0" / ".hydra" / "overrides.yaml").write_text("- seed=0\n- data.num_wor\n")
    (sweep / f"{K},seed=1" / ".hydra" / "overrides.yaml").unlink()
    grid = yaml.safe_load((sweep / "multirun.yaml").read_text())
    grid["hydra"]["sweeper"]["params"]["seed"] = "0,1,2"
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(grid))
    runs = {Path(r.path).name: r for r in make_tables.collect([sweep])}
    assert sorted((name, r.status) for name, r in runs.items()) == [
        ("[model.net.ape=sincos,rpe.preset=rpe-1.9-product-ctx-1-k,seed=2,sweep=where_mini]", "missing"),
        (f"{K},seed=0", "ok"), (f"{K},seed=1", "ok")]
    assert "is damaged: Error parsing override 'data.num_wor'" in runs[f"{K},seed=0"].overrides_problem
    assert runs[f"{K},seed=1"].overrides_problem == ""  # an older run's dir without the file: nothing wrong in it


def test_a_job_of_another_sweep_put_in_a_sweep_is_counted_once_never_also_missing(tmp_path: Path) -> None:
    """Probe 7, B41: a job archived elsewhere, put in a sweep in place of its grid point's job: its overrides.yaml
    also lists the settings of its own launch (``paths.log_dir=...``), no grid point of this sweep. It was counted in
    its cell by its config and its grid point listed as missing in the same cell; now its config fills the point."""
    sweep = _two_seed_sweep(tmp_path / "runs")
    job_dir = sweep / f"{K},seed=1"
    overrides = job_dir / ".hydra" / "overrides.yaml"
    overrides.write_text(overrides.read_text() + "- paths.log_dir=/tmp/repro/runs\n- paths.data_dir=/tmp/repro/data\n")
    cfg = yaml.safe_load((job_dir / "config.yaml").read_text())
    cfg["paths"] = {**cfg.get("paths", {}), "log_dir": "/tmp/repro/runs", "data_dir": "/tmp/repro/data"}
    (job_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    runs = make_tables.collect([sweep])
    assert [(Path(r.path).name, r.status) for r in runs] == [(f"{K},seed=0", "ok"), (f"{K},seed=1", "ok")]
    [table] = make_tables.build_tables(runs)
    assert table.cells[("k", "with APE")].text("val/top1") == "81.00 ± 1.41 (n=2)"
    grid = yaml.safe_load((sweep / "multirun.yaml").read_text())  # a point no run fills is still missing
    grid["hydra"]["sweeper"]["params"]["seed"] = "0,1,2"
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(grid))
    assert sorted(r.status for r in make_tables.collect([sweep])) == ["missing", "ok", "ok"]


# ----------------------------------------------------------------------------- folders that cannot be looked into
def test_a_run_whose_hydra_folder_cannot_be_looked_into_is_listed_and_the_table_built(tmp_path: Path,
                                                                                     capsys) -> None:
    """One job's ``.hydra/`` at mode 000 stopped make_tables with no table at all (its other job lost with it):
    a run's own folder is that run's business. The table is built, the job counted by its config and listed
    with its unreadable overrides; archive_runs, which needs them, says so in one line."""
    from tests.helpers import file_modes_hold

    sweep = _two_seed_sweep(tmp_path / "runs")
    locked = sweep / f"{K},seed=0" / ".hydra"
    locked.chmod(0)
    try:
        with file_modes_hold():
            assert make_tables.main([str(sweep), "--out", str(tmp_path / "t")]) == 0
            out, err = capsys.readouterr()
            assert archive_runs.main([str(sweep), "--to", str(tmp_path / "archive")]) == 2
            archived = capsys.readouterr().err
    finally:
        locked.chmod(0o755)
    table = (tmp_path / "t.md").read_text()
    assert "| k | 49 | 81.00 ± 1.41 (n=2) | 80.9 |" in table  # both seeds counted
    assert f"- `{locked.parent}`: cannot read {locked / 'overrides.yaml'}: Permission denied" in table
    assert archived.strip().splitlines() == [f"error: cannot read {locked / 'overrides.yaml'}: Permission denied"]
    assert not (tmp_path / "archive").exists()


def test_a_folder_that_cannot_be_looked_into_is_one_line_never_a_run_left_out(tmp_path: Path, capsys) -> None:
    """Probe 4, cases 71, 72: Path.rglob skips a folder it may not read without a word, so make_tables built the
    table of the readable seed only ("1 ok") and, on a root holding only such a folder, said "no runs". The run
    discovery of make_tables, archive_runs and evaluate_testsets (`entries_named`) names the folder instead."""
    from storage.files import RunFileError, entries_named
    from tests.helpers import file_modes_hold

    sweep = _two_seed_sweep(tmp_path / "runs")
    assert entries_named(sweep, "config.yaml", ".hydra/config.yaml") == sorted(
        {*sweep.rglob("config.yaml")})  # a readable tree: what rglob finds
    locked = sweep / f"{K},seed=1"
    alone = tmp_path / "runs_u" / "locked"
    alone.mkdir(parents=True)
    line = "a folder that cannot be looked into (permission denied), so the runs in it, if any, cannot be listed;" \
           " make it readable (chmod u+rx) or move it away"
    for folder in (locked, alone):
        folder.chmod(0)
    try:
        with file_modes_hold():
            with pytest.raises(RunFileError) as err:
                entries_named(sweep, "config.yaml")
            assert str(err.value) == f"{locked}: {line}"
            for root, folder in ((sweep, locked), (alone.parent, alone)):
                capsys.readouterr()
                assert make_tables.main([str(root), "--out", str(tmp_path / "t")]) == 2
                assert capsys.readouterr().err.strip().splitlines() == [f"error: {folder}: {line}"]
                assert not (tmp_path / "t.md").exists()
            assert archive_runs.main([str(sweep), "--to", str(tmp_path / "archive")]) == 2
            assert capsys.readouterr().err.strip().splitlines() == [f"error: {locked}: {line}"]
            assert not (tmp_path / "archive").exists()
            from scripts import evaluate_testsets
            with pytest.raises(RunFileError, match=f"^{re.escape(str(locked))}: a folder that cannot be looked"):
                evaluate_testsets.find_runs([sweep])
    finally:
        for folder in (locked, alone):
            folder.chmod(0o755)


@pytest.mark.parametrize("script", ["make_tables", "archive_runs"])
def test_a_stop_signal_to_make_tables_or_archive_runs_is_one_line(script: str, tmp_path: Path, monkeypatch,
                                                                    capsys) -> None:
    """Probe 8, A35 (the same for the tables' scripts): a stop signal ended them without a word; now one line
    saying that each file written is whole, exit 128 + the signal's number."""
    import signal

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("went on after the signal")

    sweep = _sweep_with_multirun(tmp_path / "runs")
    if script == "make_tables":
        monkeypatch.setattr(make_tables, "collect", signalled)
        argv, main = [str(sweep), "--out", str(tmp_path / "tab")], make_tables.main
    else:
        monkeypatch.setattr(archive_runs, "archive_sweep", signalled)
        argv, main = [str(sweep), "--to", str(tmp_path / "archive")], archive_runs.main
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert err.startswith(f"error: {script}.py interrupted by SIGTERM; each file it ") and err.count("\n") == 1, err
    assert "run the same command again" in err
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_pipe_in_a_name_stays_inside_its_markdown_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 13, j84: a run named ``fake|99.99`` split its Markdown row into one more column, so that rendered the
    bucket count stood under val/top1. Every cell escapes ``|``: each line of a table has its header's columns."""
    import re

    from reports import render
    from reports.findings import markdown_cell

    assert markdown_cell("fake|99.99 (trains irpe_k)") == "fake\\|99.99 (trains irpe_k)"
    assert markdown_cell("two\nlines") == "two lines"
    _sound_runs(tmp_path)
    grid = render._grid
    monkeypatch.setattr(render, "_grid", lambda table, metric: [grid(table, metric)[0], [
        "fake|99.99 (trains irpe_k)", *grid(table, metric)[1][1:]]])
    markdown = make_tables.to_markdown(list(_tables(tmp_path).values()))
    rows = [line for line in markdown.splitlines() if line.startswith("| RPE on") or line.startswith("| fake")]
    assert rows[1].startswith("| fake\\|99.99 (trains irpe_k) |"), markdown
    assert len({len(re.findall(r"(?<!\\)\|", line)) for line in rows}) == 1  # the header's columns, no more


# ----------------------------------------------------------------------------- labels
@pytest.mark.parametrize(("rpe", "label", "used"), [
    # RoPE reads theta only (rope_mixed's own default: 10); no table of positions
    ({"preset": "rope_mixed"}, "rope_mixed theta=10", 0),
    ({"preset": "rope_axial", "theta": 50.0}, "rope_axial theta=50", 0),
    # a row and a column table of window 14, read on the 8x8 grid (32 px / patch 4) at 2*8-1 = 15 offsets each
    ({"preset": "decomposed"}, "decomposed shared_head=true window=14", 30),
    # Swin's table: mode, sites, heads and window, no ratio; every offset of the 8x8 grid, 15 x 15
    ({"preset": "swin"}, "swin mode=bias on=k shared_head=false window=14", 225),
    # iRPE's shorthand, and the field it leaves out where it differs from it (Shaw's clip); clip at 1.9: 7 x 7
    ({"preset": "shaw"}, "rpe-1.9-product-ctx-1-kv index=clip", 49),
    ({"preset": "irpe_k"}, "rpe-1.9-product-ctx-1-k", 49),
])
def test_an_encodings_label_names_only_the_settings_it_reads(tmp_path: Path, rpe: dict, label: str,
                                                             used: int) -> None:
    """Probe 16, o56/o94/p34: every encoding was labelled in iRPE's shorthand (a RoPE run `rpe-1.9-rope_mixed-ctx-1-k`,
    without its theta), and `used` was 0 for the decomposed run's row and column tables."""
    rpe = {**{key: None for key in make_tables.read_config(ARCHIVE / f"{K},seed=0" / "config.yaml")["rpe"]}, **rpe}
    run = _run(tmp_path, "r", K, 0, {"val/top1": 80.0, "val/top5": 100.0}, state="finished", rpe=rpe, ablation=None)
    (loaded,) = make_tables.collect([run])
    assert (loaded.status, loaded.facts["rpe"], loaded.facts["used_buckets"]) == ("ok", label, used)
    (table,) = make_tables.build_tables([loaded])
    assert table.cols == [label]
    assert f"| {label} |" in make_tables.to_markdown([table])


def test_a_row_of_runs_changed_from_their_preset_says_so_and_which_count_is_whose(tmp_path: Path) -> None:
    """Probe 18, q26: an optuna sweep that set ``rpe.method=quant`` on preset irpe_k put both trials in one row
    labelled ``deit_micro_irpe_k`` (the run name, `${model}_${rpe choice}`), and its `used` pooled the two
    columns' counts (``2, 4``) without saying which is whose. The row says the runs are changed from their preset;
    each count names its column; a run that trains its preset keeps its name."""
    blank = {key: None for key in make_tables.read_config(ARCHIVE / f"{K},seed=0" / "config.yaml")["rpe"]}
    trials = {"t0": {"ratio": 0.717823, "mode": "bias"}, "t1": {"ratio": 1.59397, "mode": "ctx"}}
    for name, fields in trials.items():
        _run(tmp_path, name, K, 0, {"val/top1": 80.0, "val/top5": 100.0}, state="finished", ablation=None,
             rpe={**blank, "preset": "irpe_k", "method": "quant", "shared_head": False, **fields})
    _run(tmp_path, "plain", K, 0, {"val/top1": 70.0, "val/top5": 100.0}, state="finished", ablation=None,
         rpe={**blank, "preset": "irpe_k"})
    [table] = make_tables.build_tables(make_tables.collect([tmp_path]))
    changed, plain = "deit_micro_irpe_k (changed from irpe_k)", "deit_micro_irpe_k"
    assert table.rows == [plain, changed]
    columns = [f"rpe-{ratio:g}-quant-{fields['mode']}-0-k" for fields in trials.values() for ratio in [fields["ratio"]]]
    assert [col for col in table.cols if (changed, col) in table.cells] == columns
    counts = [table.cells[(changed, col)].used_buckets() for col in columns]
    assert len(set(counts)) == 2  # the trials' grids reach different counts: the case at hand
    expected = "; ".join(f"{count} ({col})" for count, col in sorted(zip(counts, columns, strict=True),
                                                                      key=lambda pair: int(pair[0])))
    markdown = make_tables.to_markdown([table])
    assert f"| {changed} | {expected} |" in markdown, markdown
    plain_used = table.cells[(plain, "rpe-1.9-product-ctx-1-k")].used_buckets()
    assert f"| {plain} | {plain_used} |" in markdown


@pytest.mark.parametrize("order", ["sweep, link", "link, sweep", "run, sweep", "sweep, sweep link", "sweep, sweep"])
def test_a_run_dir_reached_twice_is_one_run_whatever_the_path(tmp_path: Path, order: str) -> None:
    """Probe 16, o33: a link to a run of the sweep given beside it was listed as `1 duplicate` of that very run dir
    (and the run given before its sweep left its grid point `missing`): the same dir, by its real path, is one run,
    listed once under the path it was first reached by, and fills its grid point."""
    sweep = _two_seed_sweep(tmp_path / "runs")
    run = sweep / f"{K},seed=1"
    (tmp_path / "link").symlink_to(run)
    (tmp_path / "sweep_link").symlink_to(sweep)
    paths = {"sweep": sweep, "link": tmp_path / "link", "run": run, "sweep link": tmp_path / "sweep_link"}
    runs = make_tables.collect([paths[name] for name in order.split(", ")])
    first = tmp_path / "link" if order == "link, sweep" else run
    assert sorted((r.path, r.status, r.error) for r in runs) == sorted([
        (str(first), "ok", ""), (str(sweep / f"{K},seed=0"), "ok", "")])
    [table] = make_tables.build_tables(runs)
    assert table.cells[("k", "with APE")].text("val/top1") == "81.00 ± 1.41 (n=2)"


def test_a_rows_label_names_first_the_keys_that_tell_it_apart(tmp_path: Path) -> None:
    """Probe 16, p19: rows of one table position were labelled by the first three keys (by name) in which any of
    them differ, so a run that differs from the base in one late key (``model.net.ape``) got the base's label but
    for the config digest. Each row names first the keys that part it from the other rows (hand-worked: ``a`` is parted
    from ``c`` by data.batch_size, then from ``b`` by model.net.drop_path_rate; ``b`` from both by
    model.net.drop_path_rate; ``c`` from both by data.batch_size), then the others."""
    top1 = {"val/top1": 80.0, "val/top5": 100.0}
    _run(tmp_path, "a", K, 0, top1, state="finished")
    _run(tmp_path, "b", K, 0, top1, state="finished", model__net__drop_path_rate=0.1)
    _run(tmp_path, "c", K, 0, top1, state="finished", data__batch_size=64, data__generator__num_train=3000,
         data__generator__num_val=512, model__optimizer__lr=2e-3)
    rows = {Path(r.path).name: row for (row, _), cell in _tables(tmp_path)["where_mini"].cells.items()
            for r in cell.runs}
    shown = {name: re.sub(r", config [0-9a-f]{6}\]$", "]", row) for name, row in rows.items()}
    assert shown == {
        "a": "k [data.batch_size=32, model.net.drop_path_rate=0.0, data.generator.num_train=4096, +2 keys]",
        "b": "k [model.net.drop_path_rate=0.1, data.batch_size=32, data.generator.num_train=4096, +2 keys]",
        "c": "k [data.batch_size=64, data.generator.num_train=3000, data.generator.num_val=512, +2 keys]",
    }


def test_a_readme_rewrite_that_would_drop_findings_of_other_tables_is_one_line(tmp_path: Path, capsys) -> None:
    """Probe 16, o107: ``make_tables.py <one sweep> --readme README.md`` replaced the README's findings of every
    task by that sweep's alone, without a word. The block is one Holm family over the sweeps it lists: runs that
    leave out a table it lists findings of are refused, the README and the tables unwritten; the same runs, or a
    block emptied by hand, are written."""
    _sound_runs(tmp_path / "runs")
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- findings:start -->\n<!-- findings:end -->\n")
    assert make_tables.main([str(tmp_path / "runs"), "--readme", str(readme)]) == 0  # an empty block: written
    block = readme.read_text().split("<!-- findings:start -->\n")[1].split("<!-- findings:end -->")[0]
    assert "| `where_mini` |" in block
    assert make_tables.main([str(tmp_path / "runs"), "--readme", str(readme)]) == 0  # the same runs again
    assert readme.read_text() == f"intro\n<!-- findings:start -->\n{block}<!-- findings:end -->\n"
    others = ("| contextual beats bias \\| bias | Table 1 | `method_mode_mini` | +0.30 | – | – | – | – | not run |\n"
              "| directed beats undirected | Table 1 | `method_mode_mini` | +0.40 | – | – | – | – | not run |\n"
              "| Swin's bias beats no RPE | Supplement | `shift_swin_mini` | +0.80 | – | – | – | – | holds |\n")
    before = f"intro\n<!-- findings:start -->\n{others}{block}<!-- findings:end -->\n"
    readme.write_text(before)
    capsys.readouterr()
    out = tmp_path / "tabs" / "t"
    assert make_tables.main([str(tmp_path / "runs"), "--readme", str(readme), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"error: --readme {str(readme)!r}: its <!-- findings:start --> block lists 3 findings of 2 tables not built"
        " from these runs (method_mode_mini, shift_swin_mini), which this would drop; valid: give those tables'"
        " sweep dirs too (as DIRS or --family DIR ..., e.g. docs/ablations_mini_runs/*_mini"
        " docs/benchmark_runs/*_mini), or empty the block between its markers to write it anew\n")
    assert readme.read_text() == before and not out.parent.exists()


@pytest.mark.parametrize(("out", "line"), [
    ("tabs/", "--out 'tabs/' is a folder; valid: a file prefix such as tabs/tables (writes tabs/tables.md, .csv and"
              " .tex)"),
    ("tabs", "--out 'tabs' is a folder; valid: a file prefix such as tabs/tables (writes tabs/tables.md, .csv and"
             " .tex)"),
    ("new/", "--out 'new/' is a folder; valid: a file prefix such as new/tables (writes new/tables.md, .csv and .tex)"),
    (".", "--out '.' is a folder; valid: a file prefix such as tables (writes tables.md, .csv and .tex)"),
    # probe 17, r16: one of the three files' names wrote tabs/t.md.md
    ("tabs/t.md", "--out 'tabs/t.md' names one of the files it writes; valid: the prefix tabs/t (writes tabs/t.md,"
                  " .csv and .tex)"),
    ("t.tex", "--out 't.tex' names one of the files it writes; valid: the prefix t (writes t.md, .csv and .tex)"),
    ("", "--out='' names no file; valid: a file prefix such as tabs/ablations (writes tabs/ablations.md, .csv and"
         " .tex)"),
])
def test_an_out_that_names_a_folder_is_one_line(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, out: str,
                                                line: str) -> None:
    """Probe 16, p61: ``--out tabs/t61/`` (a folder) wrote tabs/t61.md, .csv and .tex beside it. ``--out`` is the
    files' prefix: a folder (a trailing ``/``, an existing folder, ``.``) or nothing is refused in one line, and
    nothing is written; a prefix inside the folder writes there."""
    _sound_runs(tmp_path / "runs")
    (tmp_path / "tabs").mkdir()
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert make_tables.main(["runs", "--out", out]) == 2
    assert capsys.readouterr().err == f"error: {line}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "tabs"] and not any((tmp_path / "tabs").iterdir())
    assert make_tables.main(["runs", "--out", "tabs/t"]) == 0
    assert sorted(p.name for p in (tmp_path / "tabs").iterdir()) == ["t.csv", "t.md", "t.tex"]
