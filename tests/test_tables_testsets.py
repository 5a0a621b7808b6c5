"""make_tables.py and archive_runs.py on runs evaluated on other test sets (``eval.py testset=<name>``).

Each test builds finished where_mini run dirs by hand in tmp_path (configs copied from
docs/ablations_mini_runs, run.json written by the lifecycle's `RunRecord`) and their result files
``testsets/<name>.json`` by eval.py's own writer (`lifecycle.testsets.write_result`), then checks the test-set
columns against numbers worked out by hand: every result that cannot be trusted is listed by name and not
counted, the runs' own results still are, and a cell with fewer evaluated seeds than counted ones says so.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from lifecycle.identity import identity_config, identity_hash, run_length
from lifecycle.records import RunRecord
from lifecycle.testsets import _NAME, result_path, write_result
from reports import collect, layouts
from scripts import archive_runs, make_tables
from storage.files import with_checksum
from tests.helpers import written_testset_fields

ARCHIVE = Path(__file__).resolve().parents[1] / "docs" / "ablations_mini_runs" / "where_mini"
K = "model.net.ape=sincos,rpe.preset=rpe-1.9-product-ctx-1-k"  # row k, column with APE
NONE = "model.net.ape=sincos,rpe.preset=none"  # row none, column with APE
K_NO_APE = "model.net.ape=none,rpe.preset=rpe-1.9-product-ctx-1-k"  # row k, column no APE
OWN = {(K, 0): 80.0, (K, 1): 82.0, (NONE, 0): 70.0, (NONE, 1): 74.0}
RIGHT = "relational_right"
INTERPOLATE = f"{RIGHT}@interpolate"


def _run(root: Path, job: str, seed: int, top1: float) -> Path:
    """A finished run dir as a job leaves it: config.yaml, .hydra/overrides.yaml, metrics.json, run.json."""
    run_dir = root / f"{job},seed={seed}"
    (run_dir / ".hydra").mkdir(parents=True)
    cfg = OmegaConf.load(ARCHIVE / f"{job},seed=0" / "config.yaml")
    cfg.seed, cfg.run_name = seed, f"where_mini/{job},seed={seed}"
    OmegaConf.save(cfg, run_dir / "config.yaml")
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"seed={seed}", *job.split(",")]))
    identity = identity_config(OmegaConf.to_container(cfg))
    metrics = {"val/top1": top1, "val/top5": 100.0, "identity": identity_hash(identity)}
    (run_dir / "metrics.json").write_text(json.dumps(with_checksum(metrics)) + "\n")
    RunRecord(run_dir, identity_hash(identity), identity, run_length(cfg)).save("finished")
    return run_dir


def _own_runs(root: Path) -> dict[tuple[str, int], Path]:
    return {(job, seed): _run(root, job, seed, top1) for (job, seed), top1 in OWN.items()}


def _result(run_dir: Path, top1: float, name: str = RIGHT, ape_rule: str | None = "interpolate",
            **edits: object) -> Path:
    """``run_dir/testsets/<name>.json`` as eval.py writes it (its writer, its identity), with ``edits``."""
    run_cfg = OmegaConf.load(run_dir / "config.yaml")
    record = {
        "testset": name, "checkpoint": str(run_dir / "checkpoints" / "best.ckpt"),
        "identity": identity_hash(identity_config(run_cfg)),  # as eval.py computes it
        "model": "RPEVisionTransformer", "ape": run_cfg.model.net.ape, "ape_rule": ape_rule,
        "train_img_size": [32, 32], "img_size": [48, 48], "patch_grid": [12, 12], "data_root": "/data",
        **written_testset_fields(name),  # the definition configs/testset/<name>.yaml gives, read whole
        "metrics": {"val/top1": top1, "val/top5": 100.0, "val/loss": 0.5, "params_M": 0.54},
    }
    record.update(edits)
    path = result_path(run_dir / "checkpoints" / "best.ckpt", name, ape_rule)
    write_result(path, record)
    return path


def _table(root: Path) -> make_tables.Table:
    [table] = [t for t in make_tables.build_tables(make_tables.collect([root])) if t.ablation == "where"]
    return table


def _markdown_rows(markdown: str, metric: str) -> dict[str, dict[str, str]]:
    """The Markdown grid of ``metric`` as ``row -> header -> text``."""
    block = markdown.split(f"\n**{metric}**\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    header = [c.strip() for c in block[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in block[2:]]
    return {row[0]: dict(zip(header, row, strict=True)) for row in rows}


def _assert_own_cells(table: make_tables.Table) -> None:
    """The runs' own results, whatever their test-set results: 80, 82 and 70, 74."""
    assert table.cells[("k", "with APE")].stats("val/top1") == (81.0, pytest.approx(math.sqrt(2)), 2)
    assert table.cells[("none", "with APE")].stats("val/top1") == (72.0, pytest.approx(math.sqrt(8)), 2)


# ----------------------------------------------------------------------------- columns
def test_the_reader_agrees_with_eval_pys_writer(tmp_path: Path) -> None:
    """The result folder and the test set names are spelled out in collect (lifecycle.testsets loads timm)."""
    folder = tmp_path / "run" / collect.TESTSETS
    assert result_path(tmp_path / "run" / "checkpoints" / "best.ckpt", RIGHT) == folder / f"{RIGHT}.json"
    best = tmp_path / "run" / "checkpoints" / "best.ckpt"
    assert result_path(best, RIGHT, "extend") == folder / f"{RIGHT}@extend.json"
    assert collect.TESTSET_NAME.pattern == _NAME.pattern
    from lifecycle.project import CONFIG_DIR

    assert collect.TESTSET_CONFIGS == CONFIG_DIR / "testset"  # the definitions eval.py composes


def test_testset_columns_hold_mean_and_std_beside_the_own_result(tmp_path: Path) -> None:
    runs = _own_runs(tmp_path)
    for (job, seed), top1 in {(K, 0): 60.0, (K, 1): 64.0, (NONE, 0): 50.0, (NONE, 1): 51.0}.items():
        _result(runs[(job, seed)], top1)
    table = _table(tmp_path)
    run = next(r for r in table.cells[("k", "with APE")].runs if r.facts["seed"] == 0)
    assert run.testsets == {INTERPOLATE: "interpolate"} and run.testset_problems == ()
    assert (run.metrics["val/top1"], run.metrics[f"{INTERPOLATE}/val/top1"]) == (80.0, 60.0)
    assert table.testsets == [INTERPOLATE]
    assert table.cells[("k", "with APE")].testset_stats(INTERPOLATE, "val/top1") == (
        62.0, pytest.approx(math.sqrt(8)), 2)
    assert table.cells[("none", "with APE")].testset_stats(INTERPOLATE, "val/top1") == (
        50.5, pytest.approx(math.sqrt(0.5)), 2)
    _assert_own_cells(table)

    markdown = make_tables.to_markdown([table])
    rows = _markdown_rows(markdown, "val/top1")
    assert rows["k"]["with APE"] == "81.00 ± 1.41 (n=2)" and rows["k"][INTERPOLATE] == "62.00 ± 2.83 (n=2)"
    assert rows["none"][INTERPOLATE] == "50.50 ± 0.71 (n=2)"
    assert list(rows["k"]).index(INTERPOLATE) > list(rows["k"]).index("with APE")
    assert "`<name>@<rule>`: runs with an absolute position table" in markdown
    assert "Test-set results not counted" not in markdown
    csv_path = tmp_path / "out" / "t"
    make_tables.write_outputs([table], csv_path)
    lines = {(r["row"], r["metric"]): r for r in make_tables.read_csv(csv_path.with_suffix(".csv"))}
    line = lines[("k", f"{INTERPOLATE}/val/top1")]
    assert (line["mean"], line["std"], line["n"], line["ok"], line["paper"]) == (
        62.0, pytest.approx(math.sqrt(8), abs=1e-4), 2, 2, None)
    assert lines[("k", "val/top1")]["mean"] == 81.0
    assert r" & relational\_right@interpolate \\" in make_tables.to_latex([table])  # the header's last column


def test_each_ape_rule_is_its_own_column_and_a_run_without_a_table_stands_in_each(tmp_path: Path) -> None:
    runs = _own_runs(tmp_path)
    no_ape = [_run(tmp_path, K_NO_APE, seed, top1) for seed, top1 in ((0, 90.0), (1, 92.0))]
    _result(runs[(K, 0)], 60.0)
    _result(runs[(K, 1)], 66.0, ape_rule="extend")
    for run_dir, top1 in zip(no_ape, (85.0, 89.0), strict=True):
        _result(run_dir, top1, ape_rule=None)  # eval.py: no absolute table, no rule
    table = _table(tmp_path)
    extend = f"{RIGHT}@extend"
    assert table.testsets == [extend, INTERPOLATE]
    k = table.cells[("k", "with APE")]
    assert k.testset_stats(INTERPOLATE, "val/top1") == (60.0, None, 1)
    assert k.testset_stats(extend, "val/top1") == (66.0, None, 1)
    assert k.testset_text(INTERPOLATE, "val/top1") == "60.00, 1 of 2 seeds evaluated"
    for column in (extend, INTERPOLATE):  # the no-APE runs' one result, which no rule changes
        assert table.cells[("k", "no APE")].testset_stats(column, "val/top1") == (
            87.0, pytest.approx(math.sqrt(8)), 2)
    rows = _markdown_rows(make_tables.to_markdown([table]), "val/top1")
    assert rows["k"][f"{extend} (with APE)"] == "66.00, 1 of 2 seeds evaluated"
    assert rows["k"][f"{INTERPOLATE} (no APE)"] == "87.00 ± 2.83 (n=2)"


def test_results_not_counted_stay_in_their_own_rules_column(tmp_path: Path) -> None:
    """Probe 14, l38b: a run's two results not counted (one per APE rule) were shown under the bare test-set name,
    "2 not counted" in one column, which the legend says means that no run has an absolute table. Each is
    counted against its own rule's column; a run without a table stands in each."""
    runs = _own_runs(tmp_path)
    no_ape = _run(tmp_path, K_NO_APE, 0, 90.0)
    for rule in ("extend", "interpolate"):
        _result(runs[(K, 0)], 60.0, ape_rule=rule, images_read=8)  # partial tests: never counted
    _result(no_ape, 85.0, ape_rule=None, images_read=8)
    table = _table(tmp_path)
    extend = f"{RIGHT}@extend"
    assert table.testsets == [extend, INTERPOLATE]
    k = table.cells[("k", "with APE")]
    for column in (extend, INTERPOLATE):
        assert [file for _, file, _ in k.testset_problems(column)] == [f"testsets/{column}.json"]
        assert k.testset_text(column, "val/top1") == "0 of 2 seeds evaluated, 1 not counted"
        assert [file for _, file, _ in table.cells[("k", "no APE")].testset_problems(column)] == [
            f"testsets/{RIGHT}.json"]


def test_a_cell_whose_runs_never_report_the_metric_has_no_test_set_entry() -> None:
    """Probe 14, l171: a DeiT and a DETR run in one table: the DETR row's top-1 cell of a classification test set
    read "0 of 1 seeds evaluated" (it can never have that result), as did the DeiT's AP cell."""
    from reports.cells import Cell
    from reports.collect import Run

    column = f"{RIGHT}@interpolate"
    deit = Run("deit", "ok", {"seed": 0}, metrics={"val/top1": 80.0, f"{column}/val/top1": 60.0},
               testsets={column: "interpolate"})
    detr = Run("detr", "ok", {"seed": 0}, metrics={"val/AP": 30.0})
    assert Cell([deit]).testset_text(column, "val/top1") == "60.00"
    assert Cell([deit]).testset_text(column, "val/AP") == "–"
    assert Cell([detr]).testset_text(column, "val/top1") == "–"
    assert Cell([detr]).testset_text(column, "val/AP") == "0 of 1 seeds evaluated"  # it reports AP: not evaluated


def test_a_test_set_without_any_rule_gets_its_plain_column(tmp_path: Path) -> None:
    no_ape = [_run(tmp_path, K_NO_APE, seed, top1) for seed, top1 in ((0, 90.0), (1, 92.0))]
    _result(no_ape[0], 85.0, ape_rule=None)
    table = _table(tmp_path)
    assert table.testsets == [RIGHT]
    assert table.cells[("k", "no APE")].testset_text(RIGHT, "val/top1") == "85.00, 1 of 2 seeds evaluated"


def test_a_layouts_test_sets_come_first_and_unevaluated_ones_say_so(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _own_runs(tmp_path)
    _result(runs[(K, 0)], 60.0)
    _result(runs[(K, 0)], 40.0, name="relational_canvas48")
    where = dataclasses.replace(layouts.LAYOUTS["where"], testsets=("relational_far_corner", RIGHT))
    monkeypatch.setitem(layouts.LAYOUTS, "where", where)
    table = _table(tmp_path)
    assert table.testsets == ["relational_far_corner", INTERPOLATE, "relational_canvas48@interpolate"]
    rows = _markdown_rows(make_tables.to_markdown([table]), "val/top1")
    assert rows["k"]["relational_far_corner"] == "0 of 2 seeds evaluated"
    assert rows["none"]["relational_far_corner"] == "0 of 2 seeds evaluated"
    assert rows["k"][INTERPOLATE] == "60.00, 1 of 2 seeds evaluated"
    assert rows["none"][INTERPOLATE] == "0 of 2 seeds evaluated"
    _assert_own_cells(table)


def test_a_cell_without_a_counted_run_has_no_testset_entry(tmp_path: Path) -> None:
    runs = _own_runs(tmp_path)
    _result(runs[(K, 0)], 60.0)
    failed = tmp_path / f"{K_NO_APE},seed=0"
    _run(tmp_path, K_NO_APE, 0, 90.0)
    (failed / "failed.json").write_text(json.dumps({"error": "boom"}) + "\n")
    rows = _markdown_rows(make_tables.to_markdown([_table(tmp_path)]), "val/top1")
    assert rows["k"][f"{INTERPOLATE} (no APE)"] == "–" and rows["k"]["no APE"] == "failed"


# ----------------------------------------------------------------------------- results not counted
def _damage(path: Path, damage: str, run_dir: Path) -> None:
    record = json.loads(path.read_text())
    if damage == "another run":
        record["identity"] = "0123456789abcdef"
    elif damage == "renamed":
        os.replace(path, path.with_name("relational_canvas48@interpolate.json"))
        return
    elif damage == "rule dropped from the name":
        os.replace(path, path.with_name(f"{RIGHT}.json"))
        return
    elif damage == "nan":
        path.write_text(path.read_text().replace('"val/top1": 61.0', '"val/top1": NaN'))
        return
    elif damage == "percentage":
        record["metrics"]["val/top1"] = 101.0
    elif damage == "string":
        record["metrics"]["val/top1"] = "61"
    elif damage == "no metrics":
        record["metrics"] = []
    elif damage == "bad rule":
        record["ape_rule"] = "inter/polate"
    elif damage == "other rule":
        record["ape_rule"] = "extend"
    elif damage == "shorter run":
        record["length"] = {"max_epochs": 1, "max_steps": -1}
    elif damage == "edited":  # a plausible number put in by hand
        record["metrics"]["val/top1"] = 71.0
    elif damage == "no checksum":  # an identity, so written by an eval.py that seals what it writes
        del record["checksum"]
    elif damage == "truncated":
        path.write_text(path.read_text()[:40])
        return
    elif damage == "list":
        path.write_text("[1, 2]\n")
        return
    elif damage == "symlink":  # another run's file, linked in: never followed
        path.unlink()
        path.symlink_to(run_dir.parent / f"{K},seed=0" / "testsets" / f"{INTERPOLATE}.json")
        return
    path.write_text(json.dumps(record))


@pytest.mark.parametrize(("damage", "file", "why"), [
    ("another run", f"{INTERPOLATE}.json", "it is another run's result (identity '0123456789abcdef', this run's"),
    ("renamed", "relational_canvas48@interpolate.json",
     f"it is the result of test set '{RIGHT}', not of 'relational_canvas48'"),
    ("nan", f"{INTERPOLATE}.json", "the file is damaged: val/top1=nan is not a finite number"),
    ("percentage", f"{INTERPOLATE}.json", "the file is damaged: val/top1=101.0 is not a percentage in [0, 100]"),
    ("string", f"{INTERPOLATE}.json", "the file is damaged: val/top1='61' is not a finite number"),
    ("no metrics", f"{INTERPOLATE}.json", "the file is damaged: it has no metrics"),
    ("bad rule", f"{INTERPOLATE}.json", "the file is damaged: ape_rule 'inter/polate' is not an APE rule name"),
    ("other rule", f"{INTERPOLATE}.json", "it holds the result of ape_rule 'extend', its file name says"
                                          " @interpolate: renamed?"),
    # probe 15, n152: "its file name says None"
    ("rule dropped from the name", f"{RIGHT}.json", "it holds the result of ape_rule 'interpolate', its file name"
                                                    " says no rule (no @<rule> in its name): renamed? (eval.py names"
                                                    " a result <test set>@<rule>.json)"),
    ("shorter run", f"{INTERPOLATE}.json", "it was evaluated when the run's length was {'max_epochs': 1,"),
    ("edited", f"{INTERPOLATE}.json", "the file is damaged: its content does not match its checksum: it was changed"
                                      " after the run wrote it"),
    ("no checksum", f"{INTERPOLATE}.json", "the file is damaged: it has no checksum"),
    ("truncated", f"{INTERPOLATE}.json", "the file is damaged: not valid JSON"),
    ("list", f"{INTERPOLATE}.json", "the file is damaged: it holds a JSON list, not a dict"),
    ("symlink", f"{INTERPOLATE}.json", "the file cannot be used: it is a symlink (to"),
])
def test_a_result_that_cannot_be_trusted_is_listed_by_name_and_not_counted(
        tmp_path: Path, damage: str, file: str, why: str) -> None:
    runs = _own_runs(tmp_path)
    _result(runs[(K, 0)], 60.0)
    bad = runs[(K, 1)]
    _damage(_result(bad, 61.0), damage, bad)
    table = _table(tmp_path)
    run = next(r for r in table.cells[("k", "with APE")].runs if r.facts["seed"] == 1)
    assert (run.status, run.testsets) == ("ok", {})
    [(named, reason)] = run.testset_problems
    assert named == f"testsets/{file}" and reason.startswith(why)
    assert not any("/" in key and key.split("/")[0].startswith("relational") for key in run.metrics)
    _assert_own_cells(table)  # the run's own result is still counted
    k = table.cells[("k", "with APE")]
    assert k.testset_stats(INTERPOLATE, "val/top1") == (60.0, None, 1)  # seed 0's alone
    markdown = make_tables.to_markdown([table])
    assert f"- `testsets/{file}` of `{run.path}`: {why}" in markdown
    if damage not in ("renamed", "rule dropped from the name"):  # another column: its own is simply not evaluated
        assert _markdown_rows(markdown, "val/top1")["k"][INTERPOLATE] == (
            "60.00, 1 of 2 seeds evaluated, 1 not counted")


def test_a_result_without_identity_is_taken_as_the_runs(tmp_path: Path) -> None:
    """Result files written before eval.py recorded the identity (or a checksum): nothing to check them against."""
    runs = _own_runs(tmp_path)
    path = _result(runs[(K, 0)], 60.0)
    record = json.loads(path.read_text())
    del record["identity"], record["checksum"]
    path.write_text(json.dumps(record))
    assert _table(tmp_path).cells[("k", "with APE")].testset_stats(INTERPOLATE, "val/top1") == (60.0, None, 1)


def test_a_symlinked_testsets_folder_is_listed_and_none_of_it_counted(tmp_path: Path) -> None:
    runs = _own_runs(tmp_path)
    _result(runs[(K, 0)], 60.0)
    (runs[(K, 1)] / "testsets").symlink_to(runs[(K, 0)] / "testsets")
    table = _table(tmp_path)
    run = next(r for r in table.cells[("k", "with APE")].runs if r.facts["seed"] == 1)
    assert run.testsets == {} and run.testset_problems[0][0] == "testsets"
    assert run.testset_problems[0][1].startswith("it is a symlink (to ")
    assert "replace the link with a real folder (remove the link itself" in run.testset_problems[0][1]
    assert table.cells[("k", "with APE")].testset_text(INTERPOLATE, "val/top1") == (
        "60.00, 1 of 2 seeds evaluated, 1 not counted")
    _assert_own_cells(table)


def test_hidden_and_other_files_in_testsets_are_not_results(tmp_path: Path) -> None:
    runs = _own_runs(tmp_path)
    path = _result(runs[(K, 0)], 60.0)
    (path.parent / f".{RIGHT}.json.abc123.tmp").write_text("{")  # a killed atomic write's leftover
    (path.parent / ".hidden.json").write_text("{")
    (path.parent / "notes.txt").write_text("evaluated by hand\n")
    run = next(r for r in _table(tmp_path).cells[("k", "with APE")].runs if r.facts["seed"] == 0)
    assert (run.testsets, run.testset_problems) == ({INTERPOLATE: "interpolate"}, ())


# ----------------------------------------------------------------------------- the archive
def _sweep(root: Path) -> tuple[Path, dict[tuple[str, int], Path]]:
    sweep = root / "where_mini"
    runs = _own_runs(sweep)
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"sweeper": {"_target_": "optuna"}}}))
    return sweep, runs


def _outputs(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """Markdown and CSV of ``root/where_mini``, the runs named relative to ``root`` (as in the archive)."""
    monkeypatch.chdir(root)
    tables = make_tables.build_tables(make_tables.collect(["where_mini"]))
    return make_tables.to_markdown(tables), make_tables.to_csv(tables)


def test_the_archive_keeps_the_results_and_builds_the_same_table(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    sweep, runs = _sweep(tmp_path / "runs")
    for (job, seed), top1 in {(K, 0): 60.0, (K, 1): 64.0, (NONE, 0): 50.0}.items():
        _result(runs[(job, seed)], top1)
    _result(runs[(K, 0)], 30.0, name="relational_canvas64")
    archive = tmp_path / "archive"
    assert archive_runs.main([str(sweep), "--to", str(archive)]) == 0
    kept = archive / "where_mini" / f"{K},seed=0"
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()) == [
        ".hydra/overrides.yaml", "config.yaml", "metrics.json", "run.json",
        "testsets/relational_canvas64@interpolate.json", f"testsets/{INTERPOLATE}.json"]
    source_file = runs[(K, 0)] / "testsets" / f"{INTERPOLATE}.json"
    assert (kept / "testsets" / f"{INTERPOLATE}.json").read_bytes() == source_file.read_bytes()
    source = _outputs(tmp_path / "runs", monkeypatch)
    assert f"{INTERPOLATE}/val/top1" in source[1] and "1 of 2 seeds evaluated" in source[0]
    assert _outputs(archive, monkeypatch) == source

    # a later sitting: seed 0 no longer has relational_canvas64 (removed as stale), seed 1 got it
    (runs[(K, 0)] / "testsets" / "relational_canvas64@interpolate.json").unlink()
    _result(runs[(K, 1)], 32.0, name="relational_canvas64")
    assert archive_runs.main([str(sweep), "--to", str(archive)]) == 0
    assert not (kept / "testsets" / "relational_canvas64@interpolate.json").exists()
    assert (archive / "where_mini" / f"{K},seed=1" / "testsets" / "relational_canvas64@interpolate.json").is_file()
    assert _outputs(archive, monkeypatch) == _outputs(tmp_path / "runs", monkeypatch)


@pytest.mark.parametrize(("damage", "why"), [
    ("another run", "it is another run's result"),
    ("symlink", "the file cannot be used: it is a symlink"),
    ("truncated", "the file is damaged: not valid JSON"),
])
def test_the_archive_refuses_a_result_make_tables_would_not_count(tmp_path: Path, capsys, damage: str,
                                                                 why: str) -> None:
    sweep, runs = _sweep(tmp_path / "runs")
    _result(runs[(K, 0)], 60.0)
    bad = runs[(NONE, 1)]
    path = _result(bad, 61.0)
    _damage(path, damage, bad)
    capsys.readouterr()
    assert archive_runs.main([str(sweep), "--to", str(tmp_path / "archive")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {path} is not a result make_tables counts: {why}")
    assert line.endswith("repair it or move it away, then archive again")
    assert not (tmp_path / "archive").exists()


# ----------------------------------------------------------------------------- findings on test-set columns
def test_a_finding_reads_each_terms_test_set_column(tmp_path: Path) -> None:
    """Per-seed contrasts of test-set results, worked by hand: k 80/82 own, 60/64 on the right half; none
    70/74 own, 50/51 there. The floor is judged on the runs' own metric, and two terms of one cell on two
    test sets are not "the same design"."""
    from reports import findings

    runs = _own_runs(tmp_path)
    for (job, seed), top1 in {(K, 0): 60.0, (K, 1): 64.0, (NONE, 0): 50.0, (NONE, 1): 51.0}.items():
        _result(runs[(job, seed)], top1)
    table = _table(tmp_path)
    assert table.cells[("k", "with APE")].testset_by_seed(INTERPOLATE, "val/top1") == {0: 60.0, 1: 64.0}

    on_right = findings.Finding("k beats none on the right half", "where",
                                (("k", "with APE", 1.0), ("none", "with APE", -1.0)), source="s",
                                testsets=(INTERPOLATE, INTERPOLATE))
    verdict = findings.judge(on_right, table)
    assert (verdict.n, verdict.mean) == (2, pytest.approx(11.5))  # seed 0: 60 - 50 = 10; seed 1: 64 - 51 = 13
    assert verdict.se == pytest.approx(1.5) and verdict.verdict == "not resolved"  # t = 7.67 on 1 df: p 0.083

    # own minus right half, per row (the drop when the objects move): k 20, 18; none 20, 23
    drop = findings.Finding("k drops less than none", "where",
                            (("none", "with APE", 1.0), ("none", "with APE", -1.0),
                             ("k", "with APE", -1.0), ("k", "with APE", 1.0)), source="s",
                            testsets=("", INTERPOLATE, "", INTERPOLATE))
    verdict = findings.judge(drop, table)
    assert verdict.verdict != "cannot differ" and verdict.mean == pytest.approx(2.5)  # (20 - 20 + 23 - 18) / 2

    with pytest.raises(ValueError, match="1 test sets for 2 terms"):
        findings.Finding("x", "where", (("k", "with APE", 1.0), ("none", "with APE", -1.0)), source="s",
                         testsets=(INTERPOLATE,))


def test_a_run_at_chance_on_a_test_set_is_a_result_not_a_floor(tmp_path: Path) -> None:
    """A side that learned its task (80 %) and is at chance on the test set (12.5 % of 8 classes) is what a
    shift finding measures; a side at chance on its own split learned nothing (floor)."""
    from reports import findings

    runs = _own_runs(tmp_path)
    for (job, seed), top1 in {(K, 0): 60.0, (K, 1): 64.0, (NONE, 0): 12.5, (NONE, 1): 12.5}.items():
        _result(runs[(job, seed)], top1)
    table = _table(tmp_path)
    finding = findings.Finding("k beats none on the right half", "where",
                               (("k", "with APE", 1.0), ("none", "with APE", -1.0)), source="s",
                               testsets=(INTERPOLATE, INTERPOLATE))
    classes = {run.facts.get("num_classes") for c in table.cells.values() for run in c.runs}
    assert classes == {8}
    assert findings.judge(finding, table).verdict != "floor"
    for run in table.cells[("none", "with APE")].runs:
        run.metrics["val/top1"] = 12.5  # now the side learned nothing on its own split
    verdict = findings.judge(finding, table)
    assert (verdict.verdict, verdict.note) == ("floor", "`none / with APE` within sampling noise of chance, 12.5")


# ----------------------------------------------------------------------------- the definition and the whole set
def _left_filed_as_right() -> dict[str, object]:
    """What ``eval.py testset=relational_left testset.name=relational_right`` recorded before that override was
    refused: the left half's definition, named and hashed as the right half."""
    from lifecycle.testset_definition import configured_generator, testset_sha256

    definition = written_testset_fields("relational_left")["testset_config"]
    definition["name"] = RIGHT  # type: ignore[index]
    return {"testset_config": definition,
            "testset_sha256": testset_sha256(definition, configured_generator(definition))}


def _older_definition() -> dict[str, object]:
    """A result written before eval.py recorded the hash and the counts, of the 5000-image relational_right."""
    definition = written_testset_fields(RIGHT)["testset_config"]
    definition["data"]["generator"]["num_val"] = 5000  # type: ignore[index]
    return {"testset_config": definition, "testset_sha256": None, "images_read": None, "images_total": None}


@pytest.mark.parametrize(("case", "edits", "why"), [
    ("name override", _left_filed_as_right(),
     f"it is of another definition of '{RIGHT}' than configs/testset/{RIGHT}.yaml (result -> yaml:"
     " data.generator.region: [0, 0, 32, 16] -> [0, 16, 32, 32]): evaluate it again (scripts/evaluate_testsets.py),"
     " or remove it"),
    ("partial test", {"images_read": 8},
     "it is a partial test: it read 8 of the test set's 2000 images (a trainer batch limit): evaluate it again on"
     " the whole set (scripts/evaluate_testsets.py)"),
    ("images counted twice", {"images_read": 2001},  # never whole, nor partial: an error in the counting
     "the test counted 2001 images of the test set, which has 2000: 1 image counted more than once, so its numbers"
     " are not of its images: evaluate it again (scripts/evaluate_testsets.py)"),
    ("older definition", _older_definition(),
     f"it is of another definition of '{RIGHT}' than configs/testset/{RIGHT}.yaml (result -> yaml:"
     " data.generator.num_val: 5000 -> 2000)"),
    ("no definition", {"testset_config": None, "testset_sha256": None, "images_read": None, "images_total": None},
     "it records no definition of its test set (testset_config)"),
    ("counts missing", {"images_read": None, "images_total": None},
     "the file is damaged: it has testset_sha256 but no images_read"),
    ("not a count", {"images_read": 8.5}, "the file is damaged: images_read=8.5 is not a count of images"),
])
def test_a_result_of_another_definition_or_of_part_of_the_set_is_not_counted(
        tmp_path: Path, case: str, edits: dict[str, object], why: str) -> None:
    """Each result as eval.py's writer seals it (a valid checksum): only its provenance keeps it out."""
    runs = _own_runs(tmp_path)
    _result(runs[(K, 0)], 60.0)
    _result(runs[(K, 1)], 61.0, **edits)
    table = _table(tmp_path)
    run = next(r for r in table.cells[("k", "with APE")].runs if r.facts["seed"] == 1)
    [(named, reason)] = run.testset_problems
    assert (run.status, run.testsets, named) == ("ok", {}, f"testsets/{INTERPOLATE}.json")
    assert reason.startswith(why) and "\n" not in reason, reason
    assert table.cells[("k", "with APE")].testset_stats(INTERPOLATE, "val/top1") == (60.0, None, 1)
    _assert_own_cells(table)
    assert f"- `testsets/{INTERPOLATE}.json` of `{run.path}`: {why}" in make_tables.to_markdown([table])


def test_a_result_from_before_the_hash_counts_when_it_holds_the_definition_of_now(tmp_path: Path) -> None:
    """The committed archives' results have no testset_sha256 and no image counts: judged by their stored
    testset_config (its data.root, wherever that was, not compared), and taken as whole."""
    runs = _own_runs(tmp_path)
    for seed, top1 in ((0, 60.0), (1, 64.0)):
        fields = written_testset_fields(RIGHT)
        fields["testset_config"]["data"]["root"] = "/elsewhere/.data/testsets/relational_right_v2"  # type: ignore[index]
        _result(runs[(K, seed)], top1, testset_config=fields["testset_config"], testset_sha256=None,
                images_read=None, images_total=None)
    k = _table(tmp_path).cells[("k", "with APE")]
    assert k.testset_stats(INTERPOLATE, "val/top1") == (62.0, pytest.approx(math.sqrt(8)), 2)
    assert all(run.testset_problems == () for run in k.runs)


def test_a_test_set_without_a_definition_now_is_not_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _own_runs(tmp_path)
    _result(runs[(K, 0)], 60.0)
    monkeypatch.setattr(collect, "TESTSET_CONFIGS", tmp_path / "no_configs")
    run = next(r for r in _table(tmp_path).cells[("k", "with APE")].runs if r.facts["seed"] == 0)
    assert run.testset_problems == ((f"testsets/{INTERPOLATE}.json", f"there is no configs/testset/{RIGHT}.yaml to"
                                     " compare it with; valid: results of the test sets defined there"),)


# ----------------------------------------------------------------------------- what the result measured
VAL48 = "val_at_48@interpolate"  # the run's own validation images at 48 px: its data, never another's


def _run_data(run_dir: Path) -> dict[str, object]:
    return OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml").data, resolve=True)  # type: ignore[return-value]


def _own_data_result(run_dir: Path, top1: float, **edits: object) -> Path:
    """``val_at_48@interpolate.json`` as eval.py now writes it: the run's data.root, its digest and generator."""
    from lifecycle.testset_definition import configured_generator

    data = _run_data(run_dir)
    fields = {"data_root": data["root"], "data_sha256": "d" * 64,
              "data_generator": configured_generator({"data": data}), "precision": "32-true", **edits}
    return _result(run_dir, top1, name="val_at_48", **fields)


def _counted(table: make_tables.Table, column: str, seed: int) -> tuple[tuple, tuple]:
    run = next(r for r in table.cells[("k", "with APE")].runs if r.facts["seed"] == seed)
    return table.cells[("k", "with APE")].testset_stats(column, "val/top1"), run.testset_problems


def test_a_run_own_data_result_counts_only_on_the_runs_data(tmp_path: Path) -> None:
    """Probe 2026-12-05 cases 125, 127: ``testset=val_at_64 data_root=<another data set>`` was counted in
    val_at_64's column. The run's data.root counts, and so does a copy of its generated data (its marker's
    generator recorded, its images' digest checked); other data is listed and not counted."""
    runs = _own_runs(tmp_path)
    _own_data_result(runs[(K, 0)], 60.0)
    _own_data_result(runs[(K, 1)], 64.0, data_root="/copy/elsewhere/relational_mini")  # the run's data, copied
    assert _counted(_table(tmp_path), VAL48, 1) == ((62.0, pytest.approx(math.sqrt(8)), 2), ())

    other = "/tmp/p40/data/testsets/relational_left_v2"
    left = configured_generator_of("relational_left")
    for edits in ({"data_root": other, "data_sha256": None, "data_generator": None},  # the probe's record
                  {"data_root": other, "data_generator": left},  # other generated data, digest checked
                  {"data_root": other, "data_sha256": None, "data_generator": None, "precision": None}):  # before
        _own_data_result(runs[(K, 1)], 12.5, **edits)
        assert _counted(_table(tmp_path), VAL48, 1) == ((60.0, None, 1), (
            (f"testsets/{VAL48}.json", f"it read data_root={other}, not this run's data (data.root="
             "/work/main/.data/relational_mini), and test set 'val_at_48' measures the run's own data: evaluate it"
             " again without data_root= (scripts/evaluate_testsets.py), or remove it"),))


def configured_generator_of(name: str) -> dict[str, object] | None:
    from lifecycle.testset_definition import configured_generator

    return configured_generator(written_testset_fields(name)["testset_config"])


def test_a_result_from_before_the_data_was_recorded_is_judged_by_its_data_root(tmp_path: Path) -> None:
    """Results written before eval.py recorded data_generator (or data_root, or the precision) keep counting
    when nothing they record says other data: the run's own data.root, or no data_root at all."""
    runs = _own_runs(tmp_path)
    _own_data_result(runs[(K, 0)], 60.0, data_sha256=None, data_generator=None, precision=None)
    path = _own_data_result(runs[(K, 1)], 64.0)
    record = json.loads(path.read_text())
    for key in ("data_root", "data_sha256", "data_generator", "precision", "checksum"):
        record.pop(key)
    write_result(path, record)
    assert _counted(_table(tmp_path), VAL48, 1) == ((62.0, pytest.approx(math.sqrt(8)), 2), ())
    # a copy elsewhere, recorded before the generator was: nothing shows it is the run's data
    _own_data_result(runs[(K, 1)], 64.0, data_root="/copy/relational_mini", data_generator=None)
    assert _counted(_table(tmp_path), VAL48, 1)[0] == (60.0, None, 1)


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed", "64-true"])
def test_a_result_at_another_precision_is_not_counted(tmp_path: Path, precision: str) -> None:
    """Probe 2026-12-05 case 128: a bf16-mixed evaluation (val/loss 2.11351 against fp32's 2.11357) was counted
    in the fp32 results' column. Every test-set column is measured at 32-true; '32' is Lightning's same name."""
    runs = _own_runs(tmp_path)
    _own_data_result(runs[(K, 0)], 60.0, precision="32")
    _own_data_result(runs[(K, 1)], 64.0, precision=precision)
    _result(runs[(K, 0)], 50.0)  # a generated test set's column: the same rule
    _result(runs[(K, 1)], 52.0, precision=precision)
    table = _table(tmp_path)
    why = (f"it was evaluated at trainer.precision={precision}, and every test-set column is measured at 32-true:"
           " evaluate it again at 32-true (no trainer.precision override; scripts/evaluate_testsets.py)")
    assert _counted(table, VAL48, 1) == ((60.0, None, 1), ((f"testsets/{INTERPOLATE}.json", why),
                                                           (f"testsets/{VAL48}.json", why)))
    assert _counted(table, INTERPOLATE, 1)[0] == (50.0, None, 1)


def _train_again(run_dir: Path, training: str | None, data_files: str | None = None) -> None:
    """``metrics.json`` as a job writes it after training ``run_dir`` (again): its best.ckpt's training token
    and, for hand data, the fingerprint of the data it trained on."""
    metrics = json.loads((run_dir / "metrics.json").read_text())
    metrics.pop("checksum")
    for key, value in (("training", training), ("data/files", data_files)):
        if value is not None:
            metrics[key] = value
    (run_dir / "metrics.json").write_text(json.dumps(with_checksum(metrics)) + "\n")


def test_a_result_copied_from_another_run_dir_is_named_as_such(tmp_path: Path) -> None:
    """Probe 9, B73: a result of another run dir (same config, another training) copied into this one was not
    counted, but the reason spoke of "an earlier training in this run dir"; its own ``checkpoint`` names the dir."""
    runs = _own_runs(tmp_path)
    elsewhere = tmp_path / "other_run" / "checkpoints" / "best.ckpt"
    _result(runs[(K, 1)], 12.5, training="a" * 16, checkpoint=str(elsewhere))
    _train_again(runs[(K, 1)], "b" * 16)
    _, problems = _counted(_table(tmp_path), INTERPOLATE, 1)
    [(_, reason)] = problems
    assert reason.startswith(f"it measured the weights of a training in another run dir ({tmp_path / 'other_run'},"
                             f" training {'a' * 16!r}; the run's best.ckpt is of training {'b' * 16!r}): copied"
                             " here?"), reason


def test_an_older_result_recording_relative_paths_still_reads(tmp_path: Path) -> None:
    """Probe 16, o52, o71b: eval.py run from another folder recorded ``checkpoint`` relative to a working dir the
    result does not record, and ``data_root`` with ``..`` in it; it now records both absolute and normalised.
    Results written before still count (a relative checkpoint of the same training, a data_root of the run's
    data spelled with ``..``), and one of another training is not said to come from another run dir, which its
    relative path cannot tell."""
    runs = _own_runs(tmp_path)
    root = _run_data(runs[(K, 0)])["root"]
    dotted = f"{os.path.dirname(root)}/x/../{os.path.basename(root)}"
    _own_data_result(runs[(K, 0)], 60.0, checkpoint="../runs/o52/checkpoints/best.ckpt", data_root=dotted)
    _result(runs[(K, 1)], 64.0, name="val_at_48", checkpoint="relruns/o71/checkpoints/best.ckpt", data_root=root,
            data_sha256="d" * 64, precision="32-true", training="a" * 16)
    _train_again(runs[(K, 1)], "a" * 16)
    assert _counted(_table(tmp_path), VAL48, 1) == ((62.0, pytest.approx(math.sqrt(8)), 2), ())
    _train_again(runs[(K, 1)], "b" * 16)
    _, problems = _counted(_table(tmp_path), VAL48, 1)
    [(_, reason)] = problems
    assert reason.startswith(f"it measured the weights of an earlier training in this run dir (training {'a' * 16!r};"
                             f" the run's best.ckpt is of training {'b' * 16!r})"), reason


def test_a_result_of_another_checkpoint_put_in_best_ckpts_place_is_not_counted(tmp_path: Path) -> None:
    """Probe 11, F114: last.ckpt copied over best.ckpt (same training token) was evaluated and counted as the run's
    result. A result records its checkpoint's step; it pairs with metrics.json's best_step only when equal."""
    runs = _own_runs(tmp_path)
    for seed, step in ((0, 1), (1, 3)):
        _result(runs[(K, seed)], 60.0 + seed, training="c" * 16, checkpoint_step=step)
        metrics = json.loads((runs[(K, seed)] / "metrics.json").read_text())
        metrics.pop("checksum")
        metrics.update(training="c" * 16, best_step=1)
        (runs[(K, seed)] / "metrics.json").write_text(json.dumps(with_checksum(metrics)) + "\n")
    stats, problems = _counted(_table(tmp_path), INTERPOLATE, 1)
    assert stats == (60.0, None, 1)
    [(_, reason)] = problems
    assert reason.startswith("it measured a checkpoint of step 3, while the run's best.ckpt is of step 1"
                             " (metrics.json best_step): another checkpoint of the same training"), reason
    # probe 12, H02: a result written before results recorded the step (probe 11's F114 file itself) cannot be told
    # from one of a replaced best.ckpt: not counted (evaluate_testsets evaluates it again)
    _result(runs[(K, 1)], 61.0, training="c" * 16)
    [(_, reason)] = _counted(_table(tmp_path), INTERPOLATE, 1)[1]
    assert reason.startswith("it does not record the step of the checkpoint it measured"), reason


@pytest.mark.parametrize(("result_training", "run_training", "why"), [
    ("a" * 16, "b" * 16, f"it measured the weights of an earlier training in this run dir (training {'a' * 16!r};"
                         f" the run's best.ckpt is of training {'b' * 16!r})"),
    (None, "b" * 16, "it was evaluated before the run's weights were trained (it records no training, the run's"
                     f" metrics.json {'b' * 16!r}): it measured weights since deleted"),
    ("a" * 16, None, f"it records training {'a' * 16!r}, while the run's metrics.json records none"),
])
def test_a_result_of_weights_trained_before_in_the_run_dir_is_not_counted(
        tmp_path: Path, result_training: str | None, run_training: str | None, why: str) -> None:
    """Probe 8 case B6: a run dir's checkpoints and records deleted and the run trained again (same config,
    same length): the old testsets/ result, of the deleted weights, was counted for the new ones. Each result
    and metrics.json record the training token of the best.ckpt they measured; only equal ones pair (both
    absent: results and runs from before the token, as the committed archives)."""
    runs = _own_runs(tmp_path)
    _result(runs[(K, 0)], 60.0, training="c" * 16)
    _train_again(runs[(K, 0)], "c" * 16)  # the same training: counted
    _result(runs[(K, 1)], 12.5, training=result_training)
    _train_again(runs[(K, 1)], run_training)
    stats, problems = _counted(_table(tmp_path), INTERPOLATE, 1)
    assert stats == (60.0, None, 1)
    [(file, reason)] = problems
    assert file == f"testsets/{INTERPOLATE}.json" and reason.startswith(why)
    assert reason.endswith(": evaluate it again (scripts/evaluate_testsets.py)")
    with pytest.raises(collect.TableError, match="is not a result make_tables counts: " + why[:40]):
        archive_runs._testset_files(runs[(K, 1)], "finished", tmp_path / "archive")  # nor archived as one


def test_a_result_of_the_runs_hand_data_changed_since_is_not_counted(tmp_path: Path) -> None:
    """Probe 8 case B4: a result that read the run's own hand data after its files changed (another
    fingerprint than metrics.json's data/files) is not counted; the same fingerprint is."""
    runs = _own_runs(tmp_path)
    for seed, files in ((0, "f" * 64), (1, "e" * 64)):
        _own_data_result(runs[(K, seed)], 60.0 + seed, data_sha256=None, data_generator=None, data_files=files)
        _train_again(runs[(K, seed)], None, data_files="f" * 64)
    stats, problems = _counted(_table(tmp_path), VAL48, 1)
    assert stats == (60.0, None, 1)
    assert problems == ((f"testsets/{VAL48}.json", "it read other data than the run trained on (fingerprint"
                         " eeeeeeeeeeee, the run's ffffffffffff): its data.root was changed since: evaluate it"
                         " again (scripts/evaluate_testsets.py)"),)
