"""Pre-registered findings (findings/<task>.yaml) and the statistics that judge them.

The exact sign-flip test is checked against scipy's permutation test and hand-counted patterns; the
registry rule (a finding joins the Holm family only where every run it reads held it, unchanged, in the
snapshot it took before training) on shift-task run dirs built by hand from the archive's configs, with
numbers worked out by hand; the floor against the position-free `none` row and its sampling noise too.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from omegaconf import OmegaConf

from lifecycle.identity import identity_config, identity_hash, run_length
from lifecycle.records import FINDINGS_DIR, FINDINGS_SNAPSHOT, RunRecord
from lifecycle.testsets import result_path, write_result
from reports import findings
from scripts import make_tables
from storage.files import with_checksum
from tests.helpers import written_testset_fields

ARCHIVE = Path(__file__).resolve().parents[1] / "docs" / "benchmark_runs" / "fp32" / "shift_mini"  # config templates
RIGHT = "relational_right"
REGISTRY = {
    "task": "shift",
    "findings": [
        {"id": "k_beats_ape", "claim": "iRPE-K beats the learned APE on the right half", "source": "shift task",
         "reference": "benchmark hypothesis", "testset": RIGHT, "plus": ["product_ctx"], "minus": ["ape_learned"]},
        {"id": "k_beats_none", "claim": "iRPE-K beats no encoding on the right half", "source": "shift task",
         "reference": "benchmark hypothesis", "testset": RIGHT, "plus": ["product_ctx"], "minus": ["none"]},
    ],
}


# ----------------------------------------------------------------------------- the exact test
@pytest.mark.parametrize("diffs", [[3.1, -0.5, 2.2, 1.7, -1.1, 4.0, 0.3], [1.0, 1.0, -1.0, 2.0],
                                   [5.0, 4.0, 3.0, 2.0, 1.0, 0.5, 0.25, 0.125, 7.0, 9.0], [0.0, 0.0, 1.0]])
def test_the_sign_flip_p_is_scipys_exact_permutation_p(diffs: list[float]) -> None:
    from scipy.stats import permutation_test

    exact = permutation_test((np.array(diffs),), np.sum, permutation_type="samples", n_resamples=10**6,
                             alternative="two-sided")  # more resamples than patterns: scipy enumerates them all
    assert findings.sign_flip_p(diffs) == pytest.approx(exact.pvalue)


def test_the_sign_flip_p_by_hand() -> None:
    # [1, -2, 3]: the 8 sums are ±6, ±4, ±2, 0, 0; |observed| = 2, reached by 6 of them
    assert findings.sign_flip_p([1.0, -2.0, 3.0]) == 6 / 8
    # every seed agreeing in sign: only that pattern and its mirror are as extreme, whatever the sizes
    assert findings.sign_flip_p([0.1] * 9 + [50.0]) == 2 / 2**10
    assert findings.sign_flip_p([1.0] * 20) == 2 / 2**20  # past the one-matrix size: the looped patterns
    with pytest.raises(ValueError, match="1 to 24 differences, not 25"):
        findings.sign_flip_p([1.0] * 25)
    test = findings.paired_test([1.0, 1.5, 1.5])  # the t test stays beside it
    assert test.p_exact == 2 / 8 and test.p == pytest.approx(0.015268, abs=1e-6)


# ----------------------------------------------------------------------------- the registry files
def test_the_committed_registries_parse_and_name_cells_of_their_sweeps() -> None:
    """Every committed findings file parses; each finding reads fresh test sets only, names rows its task's
    sweep trains, and a paper reference gives the paper's own contrast."""
    registered = findings.registered_findings()
    assert {f.ablation for f in registered} >= {"shift"}
    sweeps = Path(__file__).resolve().parents[1] / "configs" / "sweep"
    for finding in registered:
        sweep = sweeps / f"{finding.ablation}_mini.yaml"  # a CPU task's sweep; a GPU task's has no _mini
        sweep = sweep if sweep.exists() else sweeps / f"{finding.ablation}.yaml"
        rows = yaml.safe_load(sweep.read_text())["hydra"]["sweeper"]["params"]
        assert finding.key and all(t for t in finding.testsets), finding.claim  # never the training split
        assert {row for row, _, _ in finding.contrast} <= set(rows["row"].split(",")), finding.claim
        assert finding.paper_text, finding.claim
    by_key = {f.key: f for f in registered}
    assert by_key["t1_contextual_beats_bias"].paper_text == "+0.30 (ImageNet, Table 1)"  # (81.1+..)/4 - (..)/4
    assert by_key["fig3_more_buckets_help"].paper_text == "rises (Figure 3: 79.9 without RPE to 80.9 at 50)"
    assert by_key["piecewise_beats_clip_long_range"].paper_text == "+0.40 (COCO, Table 6, rows 6, 5)"  # 40.8 - 40.4
    assert by_key["rpe_helps_detr"].paper_text == "+1.30 (COCO, Table 6, rows 6, 1)"  # 40.8 - 39.5
    assert len(by_key) == len(registered)


@pytest.mark.parametrize(("edit", "message"), [
    ({"claim": None}, "needs id, claim and source"),
    ({"colour": "red"}, "unknown key 'colour'; valid: claim, id"),
    ({"testset": None}, "entry 'product_ctx' reads no test set"),
    ({"paper": "compare/no such claim"}, "paper 'compare/no such claim' names no finding of the paper's tables"),
    ({"sign": 2}, "sign 2 is not 1 or -1"),
    ({"terms": [["product_ctx", 1]]}, "give either `terms`"),
])
def test_a_malformed_finding_is_one_line_naming_it(edit: dict[str, object], message: str) -> None:
    item = {**REGISTRY["findings"][0], **edit}
    item = {k: v for k, v in item.items() if v is not None}
    with pytest.raises(make_tables.TableError, match=message.replace("(", r"\(").replace("[", r"\[")) as err:
        findings.parse_findings({"task": "shift", "findings": [item]}, "f.yaml")
    assert "\n" not in str(err.value) and str(err.value).startswith("f.yaml, finding ")


def test_the_same_id_twice_is_refused() -> None:
    with pytest.raises(make_tables.TableError, match="id 'k_beats_ape' is given twice"):
        findings.parse_findings({"task": "shift", "findings": [REGISTRY["findings"][0]] * 2}, "f.yaml")


# ----------------------------------------------------------------------------- registration of runs
def _run(root: Path, row: str, seed: int, own: float, right: float, snapshot: bytes | None) -> Path:
    """A finished shift run dir: the archive's config of ``row`` at ``seed``, its own and right-half top-1, and
    the findings snapshot it took at its start (``snapshot``; None: it took none)."""
    run_dir = root / f"row={row},seed={seed}"
    (run_dir / ".hydra").mkdir(parents=True)
    cfg = OmegaConf.load(ARCHIVE / f"row={row},seed=0" / "config.yaml")
    cfg.seed, cfg.run_name = seed, f"shift_mini/row={row},seed={seed}"
    OmegaConf.save(cfg, run_dir / "config.yaml")
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"row={row}", f"seed={seed}"]))
    identity = identity_config(OmegaConf.to_container(cfg))
    metrics = {"val/top1": own, "val/top5": 100.0, "identity": identity_hash(identity)}
    (run_dir / "metrics.json").write_text(json.dumps(with_checksum(metrics)) + "\n")
    record = RunRecord(run_dir, identity_hash(identity), identity, run_length(cfg))
    if snapshot is not None:
        (run_dir / FINDINGS_SNAPSHOT).write_bytes(snapshot)
        record.fields["findings_sha256"] = hashlib.sha256(snapshot).hexdigest()
    record.save("finished")
    write_result(result_path(run_dir / "checkpoints" / "best.ckpt", RIGHT, None), {
        "testset": RIGHT, "checkpoint": "x", "identity": identity_hash(identity), "model": "m", "ape": "none",
        "ape_rule": None, "train_img_size": [32, 32], "img_size": [32, 32], "patch_grid": [8, 8],
        "data_root": "/data", **written_testset_fields(RIGHT),
        "metrics": {"val/top1": right, "val/top5": 100.0, "val/loss": 0.5},
    })
    return run_dir


# seeds 0-5: iRPE-K 98 own, 60 + seed on the right half; the learned APE 96 own, 13; none 12.5 everywhere
SEEDS = range(6)


def _runs(root: Path, snapshot: bytes | None) -> dict[tuple[str, int], Path]:
    runs = {}
    for seed in SEEDS:
        runs[("product_ctx", seed)] = _run(root, "product_ctx", seed, 98.0, 60.0 + seed, snapshot)
        runs[("ape_learned", seed)] = _run(root, "ape_learned", seed, 96.0, 13.0, snapshot)
        runs[("none", seed)] = _run(root, "none", seed, 12.5, 12.5, snapshot)
    return runs


def _verdicts(root: Path, registry: dict[str, object] = REGISTRY) -> dict[str, findings.Verdict]:
    tables = make_tables.build_tables(make_tables.collect([root]))
    judged = findings.verdicts(tables, findings.parse_findings(registry, "registry"))
    return {v.finding.key: v for v in judged}


def test_registered_findings_form_the_family_and_get_exact_p_values(tmp_path: Path) -> None:
    _runs(tmp_path, yaml.safe_dump(REGISTRY).encode())
    results = _verdicts(tmp_path)
    ape = results["k_beats_ape"]
    # every seed positive (47..52): p = 2 / 2^6 = 0.03125 exact; Holm over the two findings: 0.0625
    assert (ape.n, ape.mean, ape.p) == (6, pytest.approx(49.5), 2 / 64)
    assert ape.p_holm == pytest.approx(2 * 2 / 64) and ape.verdict == "not resolved"
    assert ape.p_t is not None and ape.p_t < 1e-6  # the t test would have called it: the exact test cannot
    # the none row has no position encoding: it is the floor; a side at it learned nothing
    assert results["k_beats_none"].verdict != "floor"


def test_a_run_without_the_finding_in_its_snapshot_makes_it_exploratory(tmp_path: Path) -> None:
    runs = _runs(tmp_path, yaml.safe_dump(REGISTRY).encode())
    # one run took its snapshot before the second finding was added
    early = yaml.safe_dump({"task": "shift", "findings": REGISTRY["findings"][:1]}).encode()
    path = runs[("none", 3)]
    (path / FINDINGS_SNAPSHOT).write_bytes(early)
    record = json.loads((path / "run.json").read_text())
    record["findings_sha256"] = hashlib.sha256(early).hexdigest()
    (path / "run.json").write_text(json.dumps(record))
    results = _verdicts(tmp_path)
    assert results["k_beats_ape"].p_holm == pytest.approx(2 / 64)  # now a family of one
    late = results["k_beats_none"]
    assert late.verdict == "exploratory" and late.p_holm is None and late.p == 2 / 64
    assert late.note.startswith("1 of its 12 runs did not hold it when they started, e.g. ")
    assert "row=none,seed=3" in late.note


@pytest.mark.parametrize("damage", ["edited", "missing", "changed finding"])
def test_a_snapshot_that_is_not_the_one_taken_at_the_start_registers_nothing(tmp_path: Path, damage: str) -> None:
    runs = _runs(tmp_path, yaml.safe_dump(REGISTRY).encode())
    registry = REGISTRY
    if damage == "edited":  # the copy was edited after run.json recorded its hash
        (runs[("ape_learned", 0)] / FINDINGS_SNAPSHOT).write_text(yaml.safe_dump(REGISTRY) + "# later\n")
    elif damage == "missing":
        (runs[("ape_learned", 0)] / FINDINGS_SNAPSHOT).unlink()
    else:  # the finding's contrast was changed in the registry after the runs
        registry = json.loads(json.dumps(REGISTRY))
        registry["findings"][0]["minus"] = ["ape_learned", "none"]
    verdict = _verdicts(tmp_path, registry)["k_beats_ape"]
    assert verdict.verdict == "exploratory" and verdict.p_holm is None
    assert ("18 of its 18 runs" if damage == "changed finding" else "1 of its 12 runs") in verdict.note


def test_the_paper_tables_findings_are_exploratory_unless_asked_otherwise(tmp_path: Path) -> None:
    """The paper tables' findings carry no registry id: the default verdicts never count them in the family."""
    _runs(tmp_path, None)
    tables = make_tables.build_tables(make_tables.collect([tmp_path]))
    finding = findings.Finding("k beats the APE", "shift", (("product_ctx", "own val", 1.0),
                                                            ("ape_learned", "own val", -1.0)), source="s",
                               testsets=(f"{RIGHT}@interpolate",) * 2)
    [verdict] = findings.verdicts(tables, (finding,))
    assert verdict.verdict == "exploratory" and "no registry" in verdict.note
    [verdict] = findings.verdicts(tables, (finding,), registered_only=False)
    assert verdict.p_holm == 2 / 64 and verdict.verdict == "holds"


# ----------------------------------------------------------------------------- floor and sampling noise
@pytest.mark.slow
def test_the_floor_is_the_position_free_none_row_within_its_sampling_noise(tmp_path: Path) -> None:
    """none scores 12.5 on 1024 own images: two binomial SEs are 2 * sqrt(.125 * .875 / 1024) = 2.07 points.
    A side at 14.0 is within it (floor); at 15.0 it is not."""
    assert findings.sampling_margin(12.5, 1024) == pytest.approx(2.0669, abs=1e-4)
    assert findings.sampling_margin(100.0, 2000) == pytest.approx(200 * np.sqrt(1 / 2000 * (1 - 1 / 2000) / 2000))
    runs = _runs(tmp_path, yaml.safe_dump(REGISTRY).encode())
    for seed in SEEDS:
        _rewrite_own(runs[("ape_learned", seed)], 14.0)
    assert _verdicts(tmp_path)["k_beats_ape"].verdict == "floor"
    note = _verdicts(tmp_path)["k_beats_ape"].note
    assert note == "`ape_learned / own val` within sampling noise of the `none` row, 12.5"
    _rewrite_own(runs[("ape_learned", 0)], 15.0)
    assert _verdicts(tmp_path)["k_beats_ape"].verdict != "floor"
    # the resolving power leaves out the none row itself and the rows whose mean is at the floor (14.17)
    [table] = make_tables.build_tables(make_tables.collect([tmp_path]))
    assert findings.learned_cells(table, "val/top1") == {("product_ctx", "own val")}
    for seed in SEEDS:
        _rewrite_own(runs[("ape_learned", seed)], 20.0)
    [table] = make_tables.build_tables(make_tables.collect([tmp_path]))
    assert findings.learned_cells(table, "val/top1") == {("product_ctx", "own val"), ("ape_learned", "own val")}


def _rewrite_own(run_dir: Path, top1: float) -> None:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    metrics = {k: v for k, v in metrics.items() if k != "checksum"} | {"val/top1": top1}
    (run_dir / "metrics.json").write_text(json.dumps(with_checksum(metrics)) + "\n")


def test_a_run_snapshots_its_tasks_findings_file_when_it_starts(tmp_path: Path) -> None:
    from lifecycle.job import save_findings_snapshot

    assert save_findings_snapshot(tmp_path, "no_such_task") is None and not (tmp_path / FINDINGS_SNAPSHOT).exists()
    digest = save_findings_snapshot(tmp_path, "shift")
    data = (FINDINGS_DIR / "shift.yaml").read_bytes()
    assert (tmp_path / FINDINGS_SNAPSHOT).read_bytes() == data and digest == hashlib.sha256(data).hexdigest()


def test_a_cell_whose_runs_differ_outside_the_config_is_listed(tmp_path: Path) -> None:
    """metrics.json's env/* entries: a cell mixing thread counts, or resumed and unresumed runs, is named."""
    from reports.render import mixed_environments

    runs = _runs(tmp_path, None)
    for (row, seed), run_dir in runs.items():
        metrics = json.loads((run_dir / "metrics.json").read_text())
        metrics = {k: v for k, v in metrics.items() if k != "checksum"}
        metrics |= {"env/threads": 2 if (row, seed) == ("product_ctx", 3) else 1,
                    "env/resumed_at": [242] if (row, seed) == ("none", 0) else []}
        (run_dir / "metrics.json").write_text(json.dumps(with_checksum(metrics)) + "\n")
    [table] = make_tables.build_tables(make_tables.collect([tmp_path]))
    assert sorted(mixed_environments(table)) == ["`none / own val`: env/resumed_at one sitting, resumed",
                                                 "`product_ctx / own val`: env/threads 1, 2"]
    assert "Cells whose runs differ in what can change a result" in make_tables.to_markdown([table])


def test_a_registered_finding_cites_the_paper_table_it_names() -> None:
    """A registered finding that takes the paper's contrast from a table (`paper: <table>/<claim>` or
    `{table, cells}`) cites that table as its entry (scripts/paper_tables/<table>.yaml) names it, and a
    `<table>/<claim>` reference names a finding of that entry."""
    from reports.layouts import ENTRIES

    checked = 0
    for path in sorted(FINDINGS_DIR.glob("*.yaml")):
        for item in yaml.safe_load(path.read_text())["findings"]:
            spec = item.get("paper")
            if spec is None:
                continue
            table = spec.partition("/")[0] if isinstance(spec, str) else spec["table"]
            entry = ENTRIES[table]
            assert entry.paper and str(item["source"]).startswith(entry.cited), (path.name, item["id"])
            if isinstance(spec, str):
                [finding] = [f for f in entry.findings if f.claim == spec.partition("/")[2]]
                assert item["source"] == finding.source, (path.name, item["id"])
            checked += 1
    assert checked >= 10  # shift's paper findings, the long-range and Swin ones
