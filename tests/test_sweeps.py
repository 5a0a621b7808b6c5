"""Ablation sweeps (configs/sweep) and their tables (scripts/make_tables.py).

The sweep grids expand and every job composes to a valid RPE config; a failed job does not stop a
sweep and shows up in the table; tables lay out, average and mark runs as the paper's tables do.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from rpe import resolve_rpe
from scripts import make_tables
from tests.conftest import CONFIG_DIR, SMALL_RELATIONAL, compose_config, run_cli

SWEEPS = sorted(p.stem for p in (CONFIG_DIR / "sweep").glob("*.yaml") if not p.stem.startswith("_"))
FAST = ["debug=fast", "logger=csv", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1"]


def _compose(overrides: list[str], hydra: bool = False):
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("train", overrides=overrides, return_hydra_config=hydra)


def _without_pe(model) -> dict:
    """A model config minus the position-embedding switches that sweeps vary."""
    container = OmegaConf.to_container(model)
    container.pop("position_embedding", None)
    container.get("net", {}).pop("ape", None)
    return container


def _grid(sweep: str) -> list[list[str]]:
    """The jobs of ``sweep`` as Hydra's basic sweeper would launch them."""
    params = _compose([f"sweep={sweep}", "data.root=/x"], hydra=True).hydra.sweeper.params
    return make_tables.sweep_grid([f"{k}={v}" for k, v in params.items()])


def test_sweep_grid_expands_like_hydra_multirun() -> None:
    """Hand-worked: a product in argument order, the first key slowest; a later value of a key replaces
    the earlier one in its place (the command line overriding a sweep's params)."""
    assert make_tables.sweep_grid(["a=1,2", "+b=x", "c=3,4", "a=5,6"]) == [
        ["a=5", "+b=x", "c=3"], ["a=5", "+b=x", "c=4"], ["a=6", "+b=x", "c=3"], ["a=6", "+b=x", "c=4"]]


# ----------------------------------------------------------------------------- sweep configs
EXPECTED_GRID = {  # jobs per ablation of rpe-spec section 8
    "method_mode": 8, "shared_head": 4, "index": 6, "buckets": 5, "where": 14, "detr_ape": 4, "cost": 6,
}

BASE_EXPERIMENTS = {"detr_ape": ("detr_r50_rpe19_150ep", "detr_shapes")}  # (paper, mini); else DeiT-S


def test_one_paper_and_one_mini_sweep_per_ablation() -> None:
    assert sorted(SWEEPS) == sorted([*EXPECTED_GRID, *(f"{a}_mini" for a in EXPECTED_GRID)])


@pytest.mark.parametrize("sweep", SWEEPS)
def test_every_job_of_every_sweep_composes(sweep: str) -> None:
    ablation = sweep.removesuffix("_mini")
    jobs = _grid(sweep)
    assert len(jobs) == EXPECTED_GRID[ablation]
    # paper scale = the DeiT-S / DETR-R50 recipe; mini = the embedded-data experiment
    base = BASE_EXPERIMENTS.get(ablation, ("deit_small_irpe_k", "ablation_mini"))
    experiment = _compose([f"experiment={base[sweep.endswith('_mini')]}", "data.root=/x"])
    facts = []
    for job in jobs:
        cfg = _compose([f"sweep={sweep}", "data.root=/x", *job])
        assert cfg.ablation == ablation and cfg.sweep_name == sweep
        rpe = OmegaConf.to_container(cfg.rpe)
        resolve_rpe(rpe)  # every grid point is a valid RPE config
        facts.append(make_tables.run_facts(OmegaConf.to_container(cfg)))
        assert _without_pe(cfg.model) == _without_pe(experiment.model)
        assert cfg.data == experiment.data
    # the grid points differ in exactly what the table lays out: no two jobs land in one cell
    layout = make_tables.LAYOUTS[ablation]
    assert len({(layout.row(f), layout.col(f)) for f in facts}) == len(jobs)


def test_buckets_sweep_covers_the_paper_counts() -> None:
    def facts(sweep: str) -> list[dict]:
        return [make_tables.run_facts(OmegaConf.to_container(_compose([f"sweep={sweep}", "data.root=/x", *job])))
                for job in _grid(sweep)]

    paper = facts("buckets")
    assert [f["buckets"] for f in paper] == [9, 25, 49, 81, 121]
    # DeiT-S's 14x14 grid reaches every bucket but the largest table's corners; the mini 8x8 grid
    # (offsets up to 7) splits offsets alike at ratios 1.9 and 2.0 (both 7 classes per axis)
    assert [f["used_buckets"] for f in paper] == [9, 25, 49, 81, 121]
    assert [f["used_buckets"] for f in facts("buckets_mini")] == [9, 25, 49, 49, 81]


# ----------------------------------------------------------------------------- a real mini sweep
def test_failed_job_does_not_stop_the_sweep_and_the_table_shows_it(tmp_path: Path, data_dir: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    result = run_cli("train.py", [
        "sweep=buckets_mini", "rpe.ratio=1.0,-1,1.9", *FAST, *SMALL_RELATIONAL,
        f"hydra.sweep.dir={sweep_dir}", f"paths.data_dir={data_dir}",
    ], env_extra={"OMP_NUM_THREADS": "1"})
    # the sweep ran all three jobs, then exits 1 naming the failure
    assert result.returncode == 1, result.stderr[-3000:]
    assert "1 sweep job(s) failed" in result.stderr and "rpe.ratio=-1.0 must be > 0" in result.stderr
    assert "Traceback" not in result.stderr
    job_dirs = {  # the job's swept value, from the overrides Hydra saved with it
        next(o for o in OmegaConf.load(d / ".hydra" / "overrides.yaml") if o.startswith("rpe.ratio=")): d
        for d in sweep_dir.iterdir() if d.is_dir()
    }
    assert sorted(job_dirs) == ["rpe.ratio=-1", "rpe.ratio=1.0", "rpe.ratio=1.9"]
    failed_dir = job_dirs["rpe.ratio=-1"]
    failure = json.loads((failed_dir / "failed.json").read_text())
    assert failure["error"] == "rpe.ratio=-1.0 must be > 0" and "Traceback" in failure["traceback"]
    for ok in ("rpe.ratio=1.0", "rpe.ratio=1.9"):
        assert (job_dirs[ok] / "metrics.json").is_file() and not (job_dirs[ok] / "failed.json").exists()

    out = tmp_path / "tables"
    assert make_tables.main([str(sweep_dir), "--out", str(out)]) == 0
    records = [r for r in make_tables.read_csv(out.with_suffix(".csv")) if r["metric"] == "val/top1"]
    assert len(records) == 3
    by_row = {r["row"]: r for r in records}
    assert set(by_row) == {"25 (ratio 1)", "49 (ratio 1.9)", "? (ratio -1)"}
    assert by_row["? (ratio -1)"]["failed"] == 1 and by_row["? (ratio -1)"]["mean"] is None
    assert "must be > 0" in by_row["? (ratio -1)"]["errors"]
    for row, job in (("25 (ratio 1)", "rpe.ratio=1.0"), ("49 (ratio 1.9)", "rpe.ratio=1.9")):
        metrics = json.loads((job_dirs[job] / "metrics.json").read_text())
        assert by_row[row]["ok"] == 1 and by_row[row]["failed"] == 0
        assert by_row[row]["mean"] == pytest.approx(metrics["val/top1"], abs=1e-4)
    assert by_row["49 (ratio 1.9)"]["paper"] == 80.9  # DeiT-S iRPE-K, rpe-spec section 7
    markdown = out.with_suffix(".md").read_text()
    assert "| ? (ratio -1) | ? | failed |" in markdown  # row, used buckets, top-1
    assert "rpe.ratio=-1.0 must be > 0" in markdown
    assert "\\begin{tabular}" in out.with_suffix(".tex").read_text()

    # a grid point whose run dir is gone is listed as missing, not dropped
    import shutil

    shutil.rmtree(job_dirs["rpe.ratio=1.0"])
    tables = make_tables.build_tables(make_tables.collect([sweep_dir]))
    cell = tables[0].cells[("25 (ratio 1)", "ours")]
    assert [r.status for r in cell.runs] == ["missing"]


def test_rerunning_a_sweep_resumes_each_job_from_its_own_checkpoint(tmp_path: Path, data_dir: Path) -> None:
    # What a SLURM requeue (or a re-run after a crash) does: the same command, the same run dirs.
    sweep_dir = tmp_path / "sweep"
    args = ["sweep=shared_head_mini", "rpe.mode=ctx", *FAST, *SMALL_RELATIONAL, f"hydra.sweep.dir={sweep_dir}",
            f"paths.data_dir={data_dir}"]
    first = run_cli("train.py", args, env_extra={"OMP_NUM_THREADS": "1"})
    assert first.returncode == 0, first.stderr[-3000:]
    assert "resuming from" not in first.stdout
    runs = sorted(p.parent for p in sweep_dir.rglob("metrics.json"))
    assert len(runs) == 2
    (runs[0] / "metrics.json").unlink()  # as if killed before the end
    second = run_cli("train.py", args, env_extra={"OMP_NUM_THREADS": "1"})
    assert second.returncode == 0, second.stderr[-3000:]
    # finished jobs are not trained again: the one without metrics.json is re-tested from best.ckpt
    assert f"{runs[0]} is finished; re-testing {runs[0]}/checkpoints/best.ckpt" in second.stdout
    assert f"{runs[1]} is finished (same config and length)" in second.stdout
    for run_dir in runs:
        assert json.loads((run_dir / "metrics.json").read_text())["global_step"] == 2  # not trained again


@pytest.mark.slow  # ~40-60 s: four gloo processes; `make slow` runs it
def test_ddp_inside_each_job_of_a_multirun(tmp_path: Path, data_dir: Path) -> None:
    # Each job launches its own 2-process group; the second job must not inherit the first one's.
    sweep_dir = tmp_path / "sweep"
    result = run_cli("train.py", [
        "-m", "rpe=none,irpe_k", "trainer=ddp_cpu", *FAST, *SMALL_RELATIONAL, f"hydra.sweep.dir={sweep_dir}",
        f"paths.data_dir={data_dir}",
    ], env_extra={"OMP_NUM_THREADS": "1"}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for job in (0, 1):
        metrics = json.loads((sweep_dir / str(job) / "metrics.json").read_text())
        assert metrics["global_step"] == 2 and metrics["run_dir"] == str(sweep_dir / str(job))


def test_optuna_sweeper_over_rpe_fields(tmp_path: Path, data_dir: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install -e '.[optuna]'")
    sweep_dir = tmp_path / "optuna"
    result = run_cli("train.py", [
        "-m", "hydra/sweeper=optuna_rpe", "hydra.sweeper.n_trials=2", *FAST, *SMALL_RELATIONAL,
        f"hydra.sweep.dir={sweep_dir}", f"paths.data_dir={data_dir}",
    ], env_extra={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    best = OmegaConf.load(sweep_dir / "optimization_results.yaml")
    assert set(best.best_params) == {"rpe.method", "rpe.mode", "rpe.ratio", "rpe.shared_head"}
    trials = [OmegaConf.load(sweep_dir / str(n) / "config.yaml").rpe for n in (0, 1)]
    for rpe in trials:
        assert rpe.method in ("euclidean", "quant", "cross", "product") and 0.5 <= rpe.ratio <= 3.0
    assert trials[0].ratio != trials[1].ratio


def test_plain_multirun_uses_the_default_sweep_dir(tmp_path: Path, data_dir: Path) -> None:
    # Hydra resolves the multirun dir before any job exists, so it must not need the job's runtime info.
    result = run_cli("train.py", [
        "-m", "rpe=none", *FAST, *SMALL_RELATIONAL, f"paths.log_dir={tmp_path}", f"paths.data_dir={data_dir}",
    ], env_extra={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(list((tmp_path / "multirun").rglob("metrics.json"))) == 1


# ----------------------------------------------------------------------------- tables from run dirs
def _fake_run(root: Path, name: str, rpe: dict, ape: str = "learned", seed: int = 0, metrics: dict | None = None,
              failed: str | None = None, ablation: str = "where", sweep: str = "where_mini") -> Path:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    cfg = {"ablation": ablation, "sweep_name": sweep, "seed": seed, "name": name, "rpe": rpe,
           "model": {"net": {"name": "deit_micro_patch4_32", "ape": ape}}}
    OmegaConf.save(cfg, run_dir / "config.yaml")
    if metrics is not None:
        (run_dir / "metrics.json").write_text(json.dumps(metrics))
    if failed is not None:
        (run_dir / "failed.json").write_text(json.dumps({"status": "failed", "error": failed}))
    return run_dir


def test_table_layout_seeds_and_statuses(tmp_path: Path) -> None:
    k = {"preset": "rpe-1.9-product-ctx-1-k"}
    _fake_run(tmp_path, "k0", k, seed=0, metrics={"val/top1": 80.0})
    _fake_run(tmp_path, "k1", k, seed=1, metrics={"val/top1": 82.0})
    _fake_run(tmp_path, "k2", k, seed=2, failed="out of memory")
    _fake_run(tmp_path, "none", {"preset": "none"}, metrics={"val/top1": 70.0})
    _fake_run(tmp_path, "qkv_noape", {"preset": "irpe_qkv"}, ape="none")  # no metrics, no failure: unfinished
    _fake_run(tmp_path, "other", {"preset": "irpe_k"}, metrics={"val/top1": 1.0}, ablation=None, sweep=None)

    tables = make_tables.build_tables(make_tables.collect([tmp_path]))
    assert [t.name for t in tables] == ["where_mini", "runs"]
    where = tables[0]
    assert where.rows == ["none", "k", "qkv"]  # the paper's row order, present rows only
    assert where.cols == ["APE learned", "APE none"]
    cell = where.cells[("k", "APE learned")]
    mean, std, n = cell.stats("val/top1")
    assert (mean, n) == (81.0, 2) and std == pytest.approx(math.sqrt(2))
    assert cell.text("val/top1") == "81.00 ± 1.41 (n=2), 1 failed"
    assert where.cells[("qkv", "APE none")].text("val/top1") == "unfinished"

    markdown = make_tables.to_markdown(tables)
    assert "| k | 81.00 ± 1.41 (n=2), 1 failed | – | 80.9 |" in markdown
    assert "| none | 70.00 | – | 79.9 |" in markdown
    assert "- failed: `" in markdown and "out of memory" in markdown

    out = tmp_path / "t"
    make_tables.write_outputs(tables, out)
    with open(out.with_suffix(".csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["row"] for r in rows if r["table"] == "where_mini"} == {"none", "k", "qkv"}
    parsed = {(r["table"], r["row"], r["col"]): r for r in make_tables.read_csv(out.with_suffix(".csv"))
              if r["metric"] == "val/top1"}
    assert parsed[("where_mini", "k", "APE learned")] | {"runs": "", "errors": ""} == {
        "table": "where_mini", "row": "k", "col": "APE learned", "metric": "val/top1", "mean": 81.0,
        "std": pytest.approx(math.sqrt(2), abs=1e-4), "n": 2, "ok": 2, "failed": 1, "unfinished": 0,
        "missing": 0, "paper": 80.9, "runs": "", "errors": ""}
    assert parsed[("where_mini", "qkv", "APE none")]["unfinished"] == 1
    latex = out.with_suffix(".tex").read_text()
    assert r"81.00 $\pm$ 1.41 (n=2), 1 failed" in latex and r"RPE on & APE learned" in latex


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    result = run_cli("scripts/make_tables.py", [str(tmp_path / "nope")])
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"error: '{tmp_path / 'nope'}' does not exist; give run dirs or sweep dirs (runs/sweeps/<name>)"]
    result = run_cli("scripts/make_tables.py", [str(tmp_path)])
    assert result.returncode == 2 and result.stderr.strip().startswith("error: no runs")


# ----------------------------------------------------------------------------- W&B
def test_wandb_groups_by_sweep_and_logs_rpe_columns(tmp_path: Path, data_dir: Path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    import train

    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose_config([*SMALL_RELATIONAL, *FAST, "logger=wandb", "sweep_name=where_mini",
                          "rpe.preset=rpe-1.9-product-ctx-1-qk"], tmp_path / "run", data_dir)
    trainer = train.build_trainer(cfg.trainer, cfg.callbacks, cfg.logger, train.run_hparams(cfg))
    wandb_logger = next(lg for lg in trainer.loggers if type(lg).__name__ == "WandbLogger")
    logs = next(cb for cb in trainer.callbacks if type(cb).__name__ == "LogHyperparams")
    logs.on_fit_start(trainer, None)  # called by Lightning in the training process
    run = wandb_logger.experiment
    try:
        assert run.group == "where_mini"
        assert run.config["rpe"]["method"] == "product" and run.config["rpe"]["on"] == "qk"
        assert run.config["rpe"]["shorthand"] == "rpe-1.9-product-ctx-1-qk" and run.config["ape"] == "learned"
        assert run.settings.mode == "offline"
    finally:
        run.finish()
