"""Ablation sweeps (configs/sweep) and their tables (scripts/make_tables.py).

The sweep grids expand and every job composes to a valid RPE config; a failed job does not stop a
sweep and shows up in the table; tables lay out, average and mark runs as the paper's tables do.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate
from omegaconf import OmegaConf

from rpe import resolve_rpe
from scripts import make_tables
from tests.helpers import CONFIG_DIR, SMALL_RELATIONAL, compose_config, run_cli

# The benchmark tasks' sweeps (scripts/benchmark_tasks.sh): rows x seeds, no paper-scale twin.
BENCHMARK_SWEEPS = {"shift_mini": 29, "canvas_mini": 12, "shift_swin_mini": 4, "shift_buckets_mini": 4,
                    "canvas_direction_mini": 6, "longrange_mini": 5}
# every benchmark task trains seeds 0-11: the 35 registered findings need 11 or more (findings.seeds_needed)
BENCHMARK_SEEDS = 12
# A paper table at a size only a GPU runs in its budget (scripts/gpu_checks.sh table6), a benchmark task of its own
# (its findings registered in findings/detr_gpu.yaml): rows x seeds.
GPU_SWEEPS = {"detr_gpu": 36}
SWEEPS = sorted(p.stem for p in (CONFIG_DIR / "sweep").glob("*.yaml")
                if not p.stem.startswith("_") and p.stem not in {*BENCHMARK_SWEEPS, *GPU_SWEEPS})
# 64 training images (2 batches of 32, the whole split at FAST's limit) and 64 test images: the runs train
# and test on whole splits, so the tables count their results (a limited run is no result)
TABLE_DATA = ["data.root=${paths.data_dir}/relational_64", "data.generator.num_train=64",
              "data.generator.num_val=64", "data.num_workers=0"]
# the result's test reads the whole split: a limited test is no result in the tables
FAST = ["debug=fast", "logger=csv", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1.0"]
ONE_SEED = ["seed=0"]  # the mini sweeps run seeds 0, 1, 2; one is enough to test the machinery


def _compose(overrides: list[str], hydra: bool = False):
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("train", overrides=overrides, return_hydra_config=hydra)


def _without_pe(model) -> dict:
    """A model config minus the position-embedding switches and the DETR lr drop that sweeps vary."""
    container = OmegaConf.to_container(model)
    container.pop("position_embedding", None)
    container.pop("lr_drop", None)
    container.get("net", {}).pop("ape", None)
    container.get("net", {}).pop("peg_blocks", None)
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
    # a glob over a config group, as a multirun.yaml records it: Hydra expands it only with its ConfigLoader
    # running; the grid takes the group's options it matches, in Hydra's (sorted) order
    assert make_tables.sweep_grid(["rpe=glob(irpe_q*)", "seed=0,1"]) == [
        ["rpe=irpe_qk", "seed=0"], ["rpe=irpe_qk", "seed=1"], ["rpe=irpe_qkv", "seed=0"], ["rpe=irpe_qkv", "seed=1"],
        ["rpe=irpe_quant_k", "seed=0"], ["rpe=irpe_quant_k", "seed=1"]]


# ----------------------------------------------------------------------------- sweep configs
# Jobs per paper-scale sweep: the paper's grid (Table 2 has three runs per cell); the mini sweeps run
# seeds 0, 1, 2 of every classification cell, one seed of the DETR rows and of the cost grid.
EXPECTED_GRID = {
    "method_mode": 8, "shared_head": 12, "index": 4, "buckets": 5, "where": 14, "detr": 9, "swin": 3, "cost": 6,
    "compare": 14,
}
MINI_SEEDS = {"cost": 1, "shared_head": 1}  # shared_head's paper grid already has three seeds
BASE_EXPERIMENTS = {  # (paper, mini); else DeiT-S
    "detr": ("detr_r50_baseline_150ep", "detr_shapes"), "swin": ("swin_tiny_swin", "swin_micro_relational"),
}
# The cells of each paper-scale table: its entry's rows x columns (scripts/paper_tables/<ablation>.yaml), which
# every job of its sweeps must land in (test_every_job_of_every_sweep_composes)
EXPECTED_CELLS = {ablation: set(entry.cells) for ablation, entry in make_tables.ENTRIES.items()}
PRODUCT_K = "rpe-1.9-product-ctx-1-k"
# the sweeps that name their jobs by a row of the entry (`row=<name>`), and the entry whose rows they are
ROW_SWEEPS = {"detr": "detr", "detr_mini": "detr", "detr_gpu": "detr", "compare": "compare",
              "compare_mini": "compare"}


def _label(ablation: str, sweep_row: str) -> str:
    """The table's label of a sweep's row name, as the entry maps it."""
    return next(line.label for line in make_tables.ENTRIES[ablation].rows if line.sweep == sweep_row)


def test_one_paper_and_one_mini_sweep_per_ablation() -> None:
    assert sorted(SWEEPS) == sorted([*EXPECTED_GRID, *(f"{a}_mini" for a in EXPECTED_GRID)])
    assert set(make_tables.PAPER) == set(EXPECTED_GRID)
    assert set(make_tables.LAYOUTS) == {*EXPECTED_GRID, "runs", *(s.removesuffix("_mini") for s in BENCHMARK_SWEEPS),
                                        *GPU_SWEEPS}


def _job_configs(sweep: str) -> list:
    return [_compose([f"sweep={sweep}", "data.root=/x", *job]) for job in _grid(sweep)]


def _resolved(cfg) -> dict:
    """What the tables read of a job's config, resolved (the rest needs Hydra's runtime)."""
    keys = ("rpe", "model", "data", "seed", "schedule", "row", "ablation", "sweep_name")
    container: dict = {}
    for key in keys:
        if key in cfg:
            node = cfg[key]
            container[key] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    container["trainer"] = {"max_epochs": cfg.trainer.max_epochs}
    return container


# `make test` composes every paper-scale grid and three mini ones (the DeiT and Swin mini experiments, seeds
# 0-2; detr_mini is composed by test_detr_sweep_is_table_6_with_its_schedules); the other mini grids, the
# paper grids at mini scale (159 jobs at ~0.3 s each), are composed in `make slow`.
FAST_MINI_SWEEPS = ("index_mini", "swin_mini", "cost_mini")


@pytest.mark.parametrize("sweep", [s if not s.endswith("_mini") or s in FAST_MINI_SWEEPS
                                   else pytest.param(s, marks=pytest.mark.slow) for s in SWEEPS])
def test_every_job_of_every_sweep_composes(sweep: str) -> None:
    ablation = sweep.removesuffix("_mini")
    mini = sweep.endswith("_mini")
    configs = _job_configs(sweep)
    assert len(configs) == EXPECTED_GRID[ablation] * (MINI_SEEDS.get(ablation, 3) if mini else 1)
    # paper scale = the paper's recipe (DeiT-S, DETR-R50, Swin-T); mini = the embedded-data experiment
    base = BASE_EXPERIMENTS.get(ablation, ("deit_small_irpe_k", "ablation_mini"))
    experiment = _compose([f"experiment={base[mini]}", "data.root=/x"])
    facts = []
    for cfg in configs:
        assert cfg.ablation == ablation and cfg.sweep_name == sweep
        resolve_rpe(OmegaConf.to_container(cfg.rpe, resolve=True))  # every grid point is a valid RPE config
        facts.append(make_tables.run_facts(_resolved(cfg)))
        assert _without_pe(cfg.model) == _without_pe(experiment.model)
        ape = (cfg.model.get("net") or {}).get("ape")
        if ape is not None:  # a DeiT cell has the recipe's APE (learned; sin-cos at mini scale), none or PEGs
            assert ape in (experiment.model.net.ape, "none", "peg"), (sweep, ape)
        assert cfg.data == experiment.data
        if ablation not in ("detr", "cost"):  # Table 6 has two schedules; the cost sweep times 300 steps
            assert cfg.trainer.max_epochs == experiment.trainer.max_epochs
    # the grid points differ in exactly what the table lays out (and the seed): no two jobs share a cell
    layout = make_tables.LAYOUTS[ablation]
    assert len({(layout.row(f), layout.col(f), f["seed"]) for f in facts}) == len(configs)
    assert {(layout.row(f), layout.col(f)) for f in facts} == EXPECTED_CELLS[ablation]
    assert sorted({f["seed"] for f in facts}) == list(range(len(configs) // len(EXPECTED_CELLS[ablation])))


@pytest.mark.slow
def test_the_shift_task_trains_every_row_in_the_left_half_without_an_ape_but_the_references() -> None:
    """sweep=shift_mini: 29 rows x seeds 0-11; every row a valid encoding; the recipe is the benchmark one
    with the objects in the left half; only the reference rows have an absolute encoding."""
    grid = _grid("shift_mini")
    rows = [dict(j.split("=", 1) for j in job)["row"] for job in grid]
    assert len(grid) == BENCHMARK_SWEEPS["shift_mini"] * BENCHMARK_SEEDS and rows[:29] * BENCHMARK_SEEDS == rows
    experiment = _compose(["experiment=benchmark_mini", "data.root=/x"])
    seen = {}
    for job in grid[:29]:  # seed 0: one job per row
        cfg = _compose(["sweep=shift_mini", "data.root=/x", *job])
        rpe = resolve_rpe(OmegaConf.to_container(cfg.rpe, resolve=True))
        seen[cfg.row] = (cfg.model.net.ape, cfg.model.net.peg_blocks, rpe)
        assert list(cfg.data.generator.region) == [0, 0, 32, 16] and cfg.trainer == experiment.trainer
        assert cfg.model.net.class_token is False and cfg.model.net.global_pool == "avg"  # pooled, every row
        net = instantiate(cfg.model, rpe=OmegaConf.to_container(cfg.rpe, resolve=True), num_classes=8,
                          _convert_="all").net
        assert net.num_prefix_tokens == 0 and net(torch.zeros(1, 3, 32, 32)).shape == (1, 8)
        assert cfg.data.generator.num_train == experiment.data.generator.num_train
    assert set(seen) == set(_compose(["sweep=shift_mini", "data.root=/x"]).rows)  # no row left out of the grid
    references = {row for row, (ape, _, _) in seen.items() if ape != "none"}
    assert references == {"ape_learned", "ape_sincos", "cpvt", "sincos_product_ctx"} and seen["cpvt"][1] == [0, 1, 2, 3]
    assert (seen["irpe_v"][2].on, seen["irpe_kv"][2].on) == ("v", "kv") and seen["decomposed"][2].method == "decomposed"
    assert seen["product_bias_unshared"][2].shared_head is False and seen["product_bias_unshared"][2].mode == "bias"
    assert seen["euc_bias"][2] != seen["euc_ctx"][2] and seen["euc_bias"][2].mode == "bias"
    assert seen["product_ctx_unshared"][2].shared_head is False and seen["product_ctx"][2].shared_head is True


@pytest.mark.slow
def test_the_canvas_task_trains_the_distance_label_at_32_px_without_an_ape_but_the_references() -> None:
    """sweep=canvas_mini: 12 rows of the benchmark rows x seeds 0-11, on data=relational_distance (4 classes,
    everywhere on the 32 px canvas); its test sets fit the runs, and only the reference rows have an APE."""
    from lifecycle.testsets import fitting_testsets

    grid = _grid("canvas_mini")
    rows = [dict(j.split("=", 1) for j in job)["row"] for job in grid]
    assert len(grid) == BENCHMARK_SWEEPS["canvas_mini"] * BENCHMARK_SEEDS and rows[:12] * BENCHMARK_SEEDS == rows
    experiment = _compose(["experiment=benchmark_mini", "data.root=/x"])
    shift_rows = OmegaConf.to_container(_compose(["sweep=shift_mini", "data.root=/x"]).rows)
    assert shift_rows.pop("decomposed") == {"rpe": "decomposed"}  # the one row only the shift task defines
    for job in grid[:12]:
        cfg = _compose(["sweep=canvas_mini", *job])
        assert cfg.rows == shift_rows and cfg.model.net.class_token is False  # the shared rows of the shift task
        assert cfg.data.generator.label == "distance" and cfg.data.num_classes == 4
        assert cfg.data.generator.get("region") is None and cfg.data.img_size == 32
        assert cfg.trainer == experiment.trainer
        assert (cfg.model.net.ape != "none") == (cfg.row in ("ape_learned", "ape_sincos", "cpvt")), cfg.row
    data = OmegaConf.to_container(cfg.data, resolve=False)
    assert set(make_tables.LAYOUTS["canvas"].testsets) <= set(fitting_testsets(data))


def test_the_direction_canvas_task_trains_the_direction_label_on_the_whole_canvas_in_float32() -> None:
    """sweep=canvas_direction_mini: 6 rows x seeds 0-11 on the direction label anywhere on the 32 px canvas
    (the mini ablations' data, generated with the same settings), the benchmark recipe in float32; its test sets
    fit the runs, every row its findings read is swept, and only the APE rows have an APE."""
    from lifecycle.testsets import fitting_testsets
    from reports.findings import FINDINGS_DIR, read_findings_file

    grid = _grid("canvas_direction_mini")
    rows = [dict(j.split("=", 1) for j in job)["row"] for job in grid]
    assert len(grid) == BENCHMARK_SWEEPS["canvas_direction_mini"] * BENCHMARK_SEEDS
    assert rows[:6] * BENCHMARK_SEEDS == rows
    experiment = _compose(["experiment=benchmark_mini", "data.root=/x"])
    ablation = _compose(["experiment=ablation_mini"])
    for job in grid[:6]:
        cfg = _compose(["sweep=canvas_direction_mini", *job])
        raw_data = OmegaConf.to_container(cfg.data, resolve=False)
        assert raw_data["root"] == OmegaConf.to_container(ablation.data, resolve=False)["root"]
        assert cfg.data.generator == ablation.data.generator
        assert cfg.data.generator.get("label", "direction") == "direction" and cfg.data.num_classes == 8
        assert cfg.data.generator.get("region") is None and cfg.data.img_size == 32
        assert cfg.trainer.precision == "32-true" and cfg.model.net.class_token is False
        others = {key for key in cfg.trainer if key != "precision"}
        assert all(cfg.trainer._get_node(key) == experiment.trainer._get_node(key) for key in others)
        assert (cfg.model.net.ape != "none") == (cfg.row in ("ape_learned", "ape_sincos")), cfg.row
    data = OmegaConf.to_container(cfg.data, resolve=False)
    assert set(make_tables.LAYOUTS["canvas_direction"].testsets) <= set(fitting_testsets(data))
    findings = read_findings_file(FINDINGS_DIR / "canvas_direction.yaml")
    assert {row for finding in findings for row, *_ in finding.terms()} <= set(rows)


def test_the_long_range_task_gives_each_index_row_its_own_buckets_on_a_16x16_grid() -> None:
    """sweep=longrange_mini: 5 rows x seeds 0-11 on data=relational_longrange (64 px, 16x16 tokens, 5 distance
    bins), at the benchmark recipe but 4 epochs; every row is iRPE-K without an APE, with the index the findings
    need, and on this grid the rows reach 9 / 49 / 81 / 121 buckets and clip and piecewise at ratio 2.0 group the
    pairs apart. Every row a finding reads is swept."""
    from lifecycle.testsets import fitting_testsets
    from reports.collect import _used_buckets, partition
    from reports.findings import FINDINGS_DIR, read_findings_file
    from rpe.index import bucket_ids

    grid = _grid("longrange_mini")
    rows = [dict(j.split("=", 1) for j in job)["row"] for job in grid]
    assert len(grid) == BENCHMARK_SWEEPS["longrange_mini"] * BENCHMARK_SEEDS and rows[:5] * BENCHMARK_SEEDS == rows
    experiment = _compose(["experiment=benchmark_mini", "data.root=/x"])
    seen = {}
    for job in grid[:5]:
        cfg = _compose(["sweep=longrange_mini", "data.root=/x", *job])
        assert cfg.data.img_size == 64 and cfg.model.net.img_size == 64 and cfg.data.num_classes == 5
        assert list(cfg.data.generator.distance_edges) == [2, 4, 6, 8, 10, 12]
        assert cfg.trainer.max_epochs == 4 == 2 * experiment.trainer.max_epochs
        others = {key for key in cfg.trainer if key != "max_epochs"}
        assert all(cfg.trainer._get_node(key) == experiment.trainer._get_node(key) for key in others)
        assert cfg.model.net.ape == "none" and cfg.model.net.class_token is False
        config = resolve_rpe(OmegaConf.to_container(cfg.rpe, resolve=True))
        seen[cfg.row] = (config, _used_buckets(dataclasses.asdict(config), 16))
    assert {row: used for row, (_, used) in seen.items()} == {
        "clip_r2": 81, "buckets_9": 9, "buckets_49": 49, "buckets_81": 81, "buckets_121": 121}
    needed = {row for finding in read_findings_file(FINDINGS_DIR / "longrange.yaml") for row, *_ in finding.terms()}
    assert needed == set(seen)
    clip, piecewise = seen["clip_r2"][0], seen["buckets_81"][0]
    assert (clip.index, clip.ratio, piecewise.index, piecewise.ratio) == ("clip", 2.0, "piecewise", 2.0)
    assert {r.method for r, _ in seen.values()} == {"product"} and seen["buckets_49"][0].ratio == 1.9
    from reports.collect import _built_indexes, _fitted

    def pairs(config) -> str:
        specs, _ = _built_indexes(_fitted(config, 16))
        return partition(bucket_ids(specs[0], 16, 16, 0, "cpu"))
    assert pairs(clip) != pairs(piecewise)  # the two rows can differ on this grid
    data = OmegaConf.to_container(cfg.data, resolve=False)
    assert "relational_longrange" in fitting_testsets(data)


def test_the_swin_shift_task_is_the_shift_task_on_a_micro_swin() -> None:
    """sweep=shift_swin_mini: no RPE, Swin's bias, iRPE-K and iRPE-QKV x seeds 0-11 on the shift task's data
    and recipe, with the micro Swin in place of the DeiT."""
    grid = _grid("shift_swin_mini")
    rows = [dict(j.split("=", 1) for j in job)["row"] for job in grid]
    assert len(grid) == BENCHMARK_SWEEPS["shift_swin_mini"] * BENCHMARK_SEEDS and rows[:4] * BENCHMARK_SEEDS == rows
    shift = _compose(["sweep=shift_mini", "data.root=/x"])
    for job in grid[:4]:
        cfg = _compose(["sweep=shift_swin_mini", "data.root=/x", *job])
        assert cfg.model.net.name == "swin_micro_patch4_window4_32" and cfg.rpe.preset == cfg.row
        assert cfg.data == shift.data and cfg.trainer == shift.trainer and cfg.model.optimizer == shift.model.optimizer
        net = instantiate(cfg.model, rpe=OmegaConf.to_container(cfg.rpe, resolve=True), num_classes=8,
                          _convert_="all").net
        assert net(torch.zeros(1, 3, 32, 32)).shape == (1, 8)
    assert set(rows[:4]) == {"none", "swin", "irpe_k", "irpe_qkv"}


def test_the_bucket_shift_task_is_the_shift_task_with_irpe_k_at_four_bucket_counts() -> None:
    """sweep=shift_buckets_mini: iRPE-K at 9 / 25 / 49 / 121 buckets x seeds 0-11 on the shift task's data and
    learning budget, in float32. Its finding rests on the index of 8 tokens per axis: offsets 4-7 (the right
    half's far offsets) share a bucket with an offset of at most 3 at ratios 0.5 and 1.0, get buckets no nearer
    offset has at 1.9 (4-7) and 2.9 (5-7); ratio 2.0 groups the offsets as 1.9 does, so 81 buckets is no row."""
    from reports.collect import _used_buckets
    from reports.findings import FINDINGS_DIR, read_findings_file
    from rpe.index import piecewise_index

    grid = _grid("shift_buckets_mini")
    rows = [dict(j.split("=", 1) for j in job)["row"] for job in grid]
    assert len(grid) == BENCHMARK_SWEEPS["shift_buckets_mini"] * BENCHMARK_SEEDS and rows[:4] * BENCHMARK_SEEDS == rows
    shift = _compose(["sweep=shift_mini", "data.root=/x", "row=product_ctx"])
    used, ratios = {}, {}
    for job in grid[:4]:
        cfg = _compose(["sweep=shift_buckets_mini", "data.root=/x", *job])
        assert cfg.data == shift.data and cfg.model == shift.model and cfg.ablation == "shift_buckets"
        assert cfg.trainer.precision == "32-true" and shift.trainer.precision == "bf16-mixed"
        others = {key for key in cfg.trainer if key != "precision"}
        assert all(cfg.trainer._get_node(key) == shift.trainer._get_node(key) for key in others)
        config = resolve_rpe(OmegaConf.to_container(cfg.rpe, resolve=True))
        assert (config.method, config.mode, config.on, config.shared_head, config.index) == (
            "product", "ctx", "k", True, "piecewise")
        used[cfg.row], ratios[cfg.row] = _used_buckets(dataclasses.asdict(config), 8), config.ratio
    # the rows are named by their tables' sizes, as the long-range task's are; 8 tokens per axis reach 81 of 121
    assert used == {"buckets_9": 9, "buckets_25": 25, "buckets_49": 49, "buckets_121": 81}
    assert resolve_rpe(OmegaConf.to_container(shift.rpe, resolve=True)).ratio == ratios["buckets_49"]
    needed = {row for finding in read_findings_file(FINDINGS_DIR / "shift_buckets.yaml") for row, *_ in finding.terms()}
    assert needed == set(used)

    def far_buckets_alone(ratio: float) -> list[int]:
        """The offsets of 4-7 whose bucket no offset of 0-3 has."""
        ids = piecewise_index(torch.arange(8), ratio, 2 * ratio, 8 * ratio).tolist()
        return [x for x in range(4, 8) if ids[x] not in ids[:4]]
    assert [far_buckets_alone(ratios[row]) for row in ("buckets_9", "buckets_25", "buckets_49", "buckets_121")] == [
        [], [], [4, 5, 6, 7], [5, 6, 7]]
    offsets = torch.arange(-7, 8)
    assert torch.equal(piecewise_index(offsets, 2.0, 4.0, 16.0), piecewise_index(offsets, 1.9, 3.8, 15.2))


def test_paper_numbers_sit_in_cells_of_the_paper_scale_grids() -> None:
    for ablation, paper in make_tables.PAPER.items():
        assert set(paper.values) <= EXPECTED_CELLS[ablation], ablation
        extra = {row for row, _ in EXPECTED_CELLS[ablation]} - {row for row, _ in paper.values}
        if ablation in ("method_mode", "shared_head", "index", "where", "detr", "swin", "compare"):  # full tables
            assert extra == set(paper.extra_rows), ablation


def test_each_row_sweep_names_the_rows_of_its_entry() -> None:
    """A sweep that names its jobs by row (`row=<name>`) sweeps rows of its table's entry, each under the entry's
    sweep name of it, and every job's config is laid out in the row that the entry maps that name to; its `rows`
    table defines the entry's rows, and the paper-scale sweep runs every one of them."""
    for sweep, ablation in ROW_SWEEPS.items():
        entry = make_tables.ENTRIES[ablation]
        names = {line.sweep for line in entry.rows}
        swept = set(_compose([f"sweep={sweep}", "data.root=/x"], hydra=True).hydra.sweeper.params.row.split(","))
        assert swept <= names, (sweep, swept - names)
        if sweep == ablation:
            assert swept == names, (sweep, names - swept)
        table = _compose([f"sweep={sweep}", "data.root=/x"]).get("rows") or {}
        assert set(table) <= names, (sweep, set(table) - names)
        layout = make_tables.LAYOUTS[ablation]
        for cfg in _job_configs(sweep) if sweep == ablation else []:  # the mini sweeps: the same rows table
            assert layout.row(make_tables.run_facts(_resolved(cfg))) == _label(ablation, cfg.row), (sweep, cfg.row)


def test_each_paper_sweep_names_the_table_of_its_entry() -> None:
    """The header of a paper-scale sweep names where the paper has its table as the entry does, and no other
    table of the paper: one number per table everywhere (titles, sources and findings derive from the entry)."""
    import re

    for ablation, entry in make_tables.ENTRIES.items():
        text = (Path(CONFIG_DIR) / "sweep" / f"{ablation}.yaml").read_text()
        header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
        if entry.paper:
            assert f"paper {entry.paper}".lower() in header.lower(), (ablation, entry.paper)
        assert set(re.findall(r"(?:Table|Figure) \d+", header)) <= {entry.paper}, (ablation, header)
        assert make_tables.LAYOUTS[ablation].title.endswith(f"(paper {entry.paper})" if entry.paper else "")


def test_a_new_paper_table_is_one_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry alone gives the table's layout (title, header, rows and columns in the paper's order, the labels
    a run's facts get), the paper's numbers with their sources, and its findings, with their sources and the
    paper's contrast; make_tables lays runs of its ablation out by it."""
    from reports import layouts

    (tmp_path / "heads.yaml").write_text("""\
paper: Table 9
title: Heads
about: heads x mode (product, on K)
order: {table: 1, findings: 1}
numbered_rows: true
row: {name: heads, format: "{shared_head} shared"}
col: {fact: mode, labels: {ctx: contextual}}
metrics: [val/top1, val/top5]
rows: [{label: True shared, sweep: shared}, {label: False shared, sweep: unshared}, {label: None shared, extra: true}]
cols: [bias, contextual]
cells:
  - {row: True shared, col: bias, val/top1: 80.0}
  - {row: False shared, col: contextual, val/top1: 81.5, val/top1_std: 0.25, n: 3}
findings:
  - claim: unshared contextual beats shared bias
    plus: [[False shared, contextual]]
    minus: [[True shared, bias]]
""")
    (entry,) = layouts.load_entries(tmp_path).values()
    layout = entry.layout
    assert (layout.title, layout.row_name) == ("Heads (paper Table 9)", "heads")
    assert layout.metrics == ("val/top1", "val/top5")
    assert layout.row_order == ("True shared", "False shared", "None shared")
    assert layout.col_order == ("bias", "contextual")
    facts = {"shared_head": False, "mode": "ctx"}
    assert (layout.row(facts), layout.col(facts)) == ("False shared", "contextual")
    assert layout.col({"mode": "bias"}) == "bias"  # a value without a label is its own label
    assert [(line.label, line.sweep) for line in entry.rows][:2] == [
        ("True shared", "shared"), ("False shared", "unshared")]
    paper = entry.numbers
    assert paper.text == "Table 9: heads x mode (product, on K)" and paper.extra_rows == ("None shared",)
    assert paper.sources == {("True shared", "bias"): "Table 9, row 1",
                             ("False shared", "contextual"): "Table 9, row 2"}
    assert paper.text_of("False shared", "contextual", "val/top1") == "81.5 ± 0.25 (n=3)"
    (finding,) = entry.findings
    assert finding.source == "Table 9, rows 2, 1"
    assert finding.contrast == (("False shared", "contextual", 1.0), ("True shared", "bias", -1.0))

    # make_tables lays runs of the new ablation out by the entry, the paper's numbers beside ours
    monkeypatch.setitem(layouts.LAYOUTS, "heads", layout)
    monkeypatch.setitem(layouts.PAPER, "heads", paper)
    for name, shared, mode, top1 in (("a", True, "bias", 70.0), ("b", False, "ctx", 75.0)):
        _fake_run(tmp_path / "runs", name, {"preset": "irpe_k", "shared_head": shared, "mode": mode},
                  metrics={"val/top1": top1}, ablation="heads", sweep="heads_mini")
    (table,) = make_tables.build_tables(make_tables.collect([tmp_path / "runs"]))
    assert (table.rows, table.cols) == (["True shared", "False shared"], ["bias", "contextual"])
    markdown = make_tables.to_markdown([table])
    assert "## Heads (paper Table 9): `heads_mini`" in markdown
    assert "| True shared | ? | 70.00 | 80 | – |  |" in markdown, markdown


@pytest.mark.parametrize(("text", "problem"), [
    ("rows: [a, a]", "'a' is given twice"),
    ("cells: [{row: z, col: x, val/top1: 1}]", "row 'z', col 'x' is in no cell"),
    ("findings: [{claim: c, plus: [[a, x]], minus: [[z, x]]}]", "finding 'c' reads ('z', 'x')"),
    ("row: {rule: nope}", "rule 'nope' is not one of"),
    ("colour: red", "unknown key 'colour'"),
])
def test_a_malformed_entry_is_one_line_naming_it(tmp_path: Path, text: str, problem: str) -> None:
    from reports import layouts

    base = {"title": "T", "about": "a", "order": "{table: 1}", "row": "{fact: mode}", "col": "{label: x}",
            "rows": "[a, b]", "cols": "[x]"}
    key = text.split(":")[0]
    lines = [f"{k}: {v}" for k, v in base.items() if k != key] + [text]
    (tmp_path / "t.yaml").write_text("\n".join(lines) + "\n")
    with pytest.raises(make_tables.TableError, match=problem.replace("(", r"\(").replace(")", r"\)")) as err:
        layouts.load_entries(tmp_path)
    assert str(err.value).startswith(str(tmp_path / "t.yaml")) and "\n" not in str(err.value)


def test_every_finding_contrasts_cells_of_its_paper_grid() -> None:
    import yaml

    def swept_rows(sweep: str) -> set[tuple[str, str]]:
        params = yaml.safe_load((Path(CONFIG_DIR) / "sweep" / f"{sweep}.yaml").read_text())["hydra"]["sweeper"]
        return {(row, "own val") for row in params["params"]["row"].split(",")}

    expected = {**EXPECTED_CELLS, **{s.removesuffix("_mini"): swept_rows(s) for s in [*BENCHMARK_SWEEPS, *GPU_SWEEPS]}}
    for finding in make_tables.all_findings():
        cells = {(row, col) for row, col, _ in finding.contrast}
        assert cells <= expected[finding.ablation], finding.claim
        assert sum(w for _, _, w in finding.contrast) == pytest.approx(0.0), finding.claim  # a difference
        testsets = {t.partition("@")[0] for t in finding.testsets} - {""}
        assert testsets <= set(make_tables.LAYOUTS[finding.ablation].testsets), finding.claim


@pytest.mark.slow
def test_detr_sweep_is_table_6_with_its_schedules() -> None:
    rows = {}
    for cfg in _job_configs("detr"):
        container = _resolved(cfg)
        rows[cfg.row] = (container["trainer"]["max_epochs"], container["model"]["lr_drop"], container["rpe"]["index"])
        assert cfg.data.batch_size == 2 and cfg.trainer.devices == 8 and cfg.model.backbone.name == "resnet50"
    assert rows["sine_none_short"] == (150, 100, None)
    assert rows["sine_ctxclip9_short"] == (150, 100, "clip")
    assert rows["sine_ctx9_long"] == (300, 200, None) and rows["sine_none_long"] == (300, 200, None)
    mini_jobs = _job_configs("detr_mini")
    mini = {c.row: (c.trainer.max_epochs, c.model.lr_drop) for c in mini_jobs}
    assert len(mini) == 9 and [c.seed for c in mini_jobs] == [0] * 9 + [1] * 9 + [2] * 9
    assert mini["sine_ctx15_short"] == (12, 10) and mini["sine_ctx9_long"] == (24, 20)


def test_gpu_detr_sweep_is_table_6_on_a_16x16_grid_with_1000_val_images_and_twelve_seeds() -> None:
    """sweep=detr_gpu: detr_mini's recipe but for what makes Table 6 decisive (a grid where piecewise and
    clip part ways, 1000 val images read once, seeds 0-11, a task of its own whose findings are registered),
    three rows seed-major, 6 epochs."""
    from PIL import Image
    from torchvision.tv_tensors import BoundingBoxes

    from data.coco import CocoDataModule
    from models.detr.backbone import TinyBackbone

    jobs = _job_configs("detr_gpu")
    assert len(jobs) == GPU_SWEEPS["detr_gpu"]
    rows = [c.row for c in jobs]
    per_seed = ["sine_none_short", "sine_ctx9_short", "sine_ctxclip9_short"]
    assert rows == per_seed * BENCHMARK_SEEDS
    assert [c.seed for c in jobs] == [s for s in range(BENCHMARK_SEEDS) for _ in per_seed]
    # detr_mini's data and model but for these
    mini = _compose(["sweep=detr_mini", "row=sine_none_short", "data.root=/x"])
    data = {**OmegaConf.to_container(mini.data), "num_workers": 2, "train_scales": [112, 128, 144], "max_size": 192,
            "val_size": 128, "generator": {**mini.data.generator, "num_val": 1000}}
    model = {**_without_pe(mini.model), "backbone": {**mini.model.backbone, "stem_stride": 2}}
    for cfg in jobs:
        assert cfg.ablation == "detr_gpu" and cfg.sweep_name == "detr_gpu"
        assert (cfg.trainer.max_epochs, cfg.model.lr_drop, cfg.trainer.precision) == (6, 5, "32-true")
        assert cfg.trainer.limit_val_batches == 0 and cfg.test_after_fit  # the last epoch, tested once
        assert cfg.data.generator.num_val >= 1000
        assert OmegaConf.to_container(cfg.data) == data and _without_pe(cfg.model) == model
    cfg = jobs[0]
    # the grid side from the backbone's stride and the eval size, then as the encoder really gets it: the
    # most elongated image the generator draws, through the eval transform and the backbone
    stride = TinyBackbone(list(cfg.model.backbone.channels), cfg.model.backbone.stem_stride).stride
    assert stride == 8 and cfg.data.val_size // stride >= 16
    short, long = cfg.data.generator.image_size
    eval_tf = CocoDataModule(root="/x", val_size=cfg.data.val_size, max_size=cfg.data.max_size, num_classes=3).eval_tf
    canvas = (short, long)
    image, _ = eval_tf(Image.new("RGB", canvas[::-1]),
                       {"boxes": BoundingBoxes([[0, 0, 8, 8]], format="XYXY", canvas_size=canvas),
                        "labels": torch.zeros(1, dtype=torch.int64)})
    assert min(image.shape[-2:]) == cfg.data.val_size  # max_size does not cap it
    backbone = instantiate(cfg.model, rpe=OmegaConf.to_container(cfg.rpe, resolve=True), num_classes=3,
                           _convert_="all").model.backbone
    feats, _ = backbone.eval()(image[None], torch.zeros(1, *image.shape[-2:], dtype=torch.bool))
    assert min(feats.shape[-2:]) >= 16, feats.shape


def test_a_detr_row_is_labelled_by_its_name_unless_its_position_embedding_is_given_over_it() -> None:
    """A Table 6 row's `ape` is DETR's model.position_embedding, not a DeiT's model.net.ape: every detr_gpu row is
    labelled by its name alone (it was `[model.net.ape=None]`), and a job whose embedding is given over the row's
    trained another design, so its label says which."""
    from reports.collect import _row_label

    def label(overrides: list[str]) -> str:
        cfg = _compose(["sweep=detr_gpu", "data.root=/x", *overrides])
        return _row_label({key: OmegaConf.to_container(cfg[key], resolve=True) if OmegaConf.is_config(cfg[key])
                           else cfg[key] for key in ("row", "rows", "rpe", "model")})

    for row in ("sine_none_short", "sine_ctx9_short", "sine_ctxclip9_short"):
        assert label([f"row={row}"]) == row
    assert label(["row=sine_ctx9_short", "model.position_embedding=none"]) == \
        "sine_ctx9_short [model.position_embedding=none]"


def test_buckets_sweep_covers_the_paper_counts() -> None:
    def facts(sweep: str) -> list[dict]:
        return [make_tables.run_facts(_resolved(cfg)) for cfg in _job_configs(sweep)]

    paper = facts("buckets")
    assert [f["buckets"] for f in paper] == [9, 25, 49, 81, 121]
    # DeiT-S's 14x14 grid reaches every bucket but the largest table's corners; the mini 8x8 grid
    # (offsets up to 7) splits offsets alike at ratios 1.9 and 2.0 (both 7 classes per axis)
    assert [f["used_buckets"] for f in paper] == [9, 25, 49, 81, 121]
    assert sorted({(f["used_buckets"], f["ratio"]) for f in facts("buckets_mini")}) == [
        (9, 0.5), (25, 1.0), (49, 1.9), (49, 2.0), (81, 2.9)]


# ----------------------------------------------------------------------------- a real mini sweep
@pytest.mark.slow  # train.py and eval.py processes end to end: make test's 5 minutes
def test_failed_job_does_not_stop_the_sweep_and_the_table_shows_it(tmp_path: Path, data_dir: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    common = [*ONE_SEED, *FAST, *TABLE_DATA, f"hydra.sweep.dir={sweep_dir}", f"paths.data_dir={data_dir}"]
    # a value the settings refuse is refused before the first job, as with -m: no run dir is made
    refused = run_cli("train.py", ["sweep=buckets_mini", "rpe.ratio=1.0,-1,1.9", *common])
    assert refused.returncode == 2 and "rpe.ratio=-1.0 must be > 0" in refused.stderr, refused.stderr[-2000:]
    assert not sweep_dir.exists() or not any(p.is_dir() for p in sweep_dir.iterdir())
    # a job that fails while it trains (lr 1e30 from the first step: the loss diverges) does not stop the others
    result = run_cli("train.py", ["sweep=buckets_mini", "rpe.ratio=1.0,1.9", "model.optimizer.lr=1e30,1e-3",
                                  "model.scheduler.warmup_epochs=0",
                                  *common], env_extra={"OMP_NUM_THREADS": "1"})
    # the sweep ran all four jobs, then exits 1 naming the failures
    assert result.returncode == 1, result.stderr[-3000:]
    assert "2 sweep job(s) failed" in result.stderr and "training loss is" in result.stderr
    assert "Traceback" not in result.stderr
    job_dirs = {  # the job's swept values, from the overrides Hydra saved with it
        ",".join(o for o in OmegaConf.load(d / ".hydra" / "overrides.yaml") if o.startswith(("rpe.", "model."))): d
        for d in sweep_dir.iterdir() if d.is_dir()
    }
    assert len(job_dirs) == 4
    for job, run_dir in job_dirs.items():
        if "30" in job.split("lr=")[1]:  # 1e30 as Hydra saved it
            failure = json.loads((run_dir / "failed.json").read_text())
            assert failure["error"].startswith("training loss is") and "Traceback" in failure["traceback"]
        else:
            assert (run_dir / "metrics.json").is_file() and not (run_dir / "failed.json").exists()

    out = tmp_path / "tables"
    assert make_tables.main([str(sweep_dir), "--out", str(out)]) == 0
    records = [r for r in make_tables.read_csv(out.with_suffix(".csv")) if r["metric"] == "val/top1"]
    assert len(records) == 4
    by_row = {r["row"]: r for r in records}
    for ratio, buckets in (("1", 25), ("1.9", 49)):
        bad, good = (by_row[f"{buckets} (ratio {ratio}) [model.optimizer.lr={lr}]"] for lr in ("1e+30", "0.001"))
        assert bad["failed"] == 1 and bad["mean"] is None and "training loss is" in bad["errors"]
        job = next(j for j in job_dirs
                   if f"rpe.ratio={ratio}" in j.replace("1.0", "1") and "30" not in j.split("lr=")[1])
        metrics = json.loads((job_dirs[job] / "metrics.json").read_text())
        assert good["ok"] == 1 and good["failed"] == 0
        assert good["mean"] == pytest.approx(metrics["val/top1"], abs=1e-4)
    markdown = out.with_suffix(".md").read_text()
    assert "training loss is" in markdown
    assert "\nSeeds: 0 (one seed: cells have no std" in markdown
    assert "\\begin{tabular}" in out.with_suffix(".tex").read_text()

    # a grid point whose run dir is gone is listed as missing, not dropped
    import shutil

    gone = next(j for j in job_dirs if "rpe.ratio=1.0" in j and "30" not in j.split("lr=")[1])
    shutil.rmtree(job_dirs[gone])
    tables = make_tables.build_tables(make_tables.collect([sweep_dir]))
    statuses = sorted(r.status for (row, _), cell in tables[0].cells.items() if row.startswith("25 (ratio 1)")
                      for r in cell.runs)
    assert statuses == ["failed", "missing"]


@pytest.mark.slow  # two sweeps of two jobs
def test_rerunning_a_sweep_resumes_each_job_from_its_own_checkpoint(tmp_path: Path, data_dir: Path) -> None:
    # What a SLURM requeue (or a re-run after a crash) does: the same command, the same run dirs.
    sweep_dir = tmp_path / "sweep"
    args = ["sweep=shared_head_mini", "rpe.mode=ctx", *ONE_SEED, *FAST, *TABLE_DATA,
            f"hydra.sweep.dir={sweep_dir}", f"paths.data_dir={data_dir}"]
    first = run_cli("train.py", args, env_extra={"OMP_NUM_THREADS": "1"})
    assert first.returncode == 0, first.stderr[-3000:]
    assert "resuming from" not in first.stdout
    runs = sorted(p.parent for p in sweep_dir.rglob("metrics.json"))
    assert len(runs) == 2
    (runs[0] / "metrics.json").unlink()  # as if killed before the end
    second = run_cli("train.py", args, env_extra={"OMP_NUM_THREADS": "1"})
    assert second.returncode == 0, second.stderr[-3000:]
    # finished jobs are not trained again: the one without metrics.json is re-tested from best.ckpt
    assert f"note: {runs[0]}/metrics.json is missing; re-testing {runs[0]}/checkpoints/best.ckpt" in second.stdout
    # a sweep job's dir comes from the sweep dir, so that is what to change to train anew (probe 18, s55)
    assert (f"{runs[1]} is finished (same config and length): not training again, its metrics.json stands; use a"
            " new hydra.sweep.dir to train anew, or a larger trainer.max_epochs to extend it") in second.stdout
    for run_dir in runs:
        assert json.loads((run_dir / "metrics.json").read_text())["global_step"] == 2  # not trained again


@pytest.mark.slow  # ~40-60 s: four gloo processes; `make slow` runs it
def test_ddp_inside_each_job_of_a_multirun(tmp_path: Path, data_dir: Path) -> None:
    # Each job launches its own 2-process group; the second job must not inherit the first one's. The jobs are
    # named by their overrides, as the sweep configs name them (..., rpe=none, seed=0, ...): a `=` and a `,` in the
    # run dir, which the workers' command line once took for override syntax.
    sweep_dir = tmp_path / "sweep"
    result = run_cli("train.py", [
        "-m", "rpe=none,irpe_k", "seed=0", "trainer=ddp_cpu", *FAST, *SMALL_RELATIONAL, f"hydra.sweep.dir={sweep_dir}",
        "hydra.sweep.subdir='${job_dirname:${hydra.job.override_dirname}}'", f"paths.data_dir={data_dir}",
    ], env_extra={"OMP_NUM_THREADS": "1"}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(p for p in sweep_dir.iterdir() if p.is_dir())
    assert len(jobs) == 2 and all("=" in p.name and "," in p.name for p in jobs), jobs
    for job_dir in jobs:
        metrics = json.loads((job_dir / "metrics.json").read_text())
        assert metrics["global_step"] == 2 and metrics["run_dir"] == str(job_dir)


@pytest.mark.slow  # a sweep of two DDP jobs
def test_a_failed_ddp_job_does_not_kill_the_sweep(tmp_path: Path, data_dir: Path) -> None:
    """Its worker process fails with it; Lightning's observer of that worker must not SIGKILL the sweep
    during the next job (exit 137, no summary)."""
    sweep_dir = tmp_path / "sweep"
    # job 0's rank-1 worker raises after its first step; job 1 names a rank that two workers do not have.
    # (A failure the checks before the sweep could see, like a batch larger than the split, never starts.)
    result = run_cli("train.py", [
        "-m", "+callbacks.fail.rank=1,5", "+callbacks.fail._target_=tests.faults.RaiseOnRank", "trainer=ddp_cpu",
        "data.batch_size=16",
        *FAST, *TABLE_DATA, f"hydra.sweep.dir={sweep_dir}", f"paths.data_dir={data_dir}",
    ], env_extra={"OMP_NUM_THREADS": "1"}, timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "1 sweep job(s) failed" in result.stderr and "injected failure of rank 1" in result.stderr
    assert (sweep_dir / "0" / "failed.json").is_file()
    assert json.loads((sweep_dir / "1" / "metrics.json").read_text())["global_step"] == 2


@pytest.mark.slow  # a two-trial Optuna sweep
def test_optuna_sweeper_over_rpe_fields(tmp_path: Path, data_dir: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install -e '.[optuna]'")
    sweep_dir = tmp_path / "optuna"
    result = run_cli("train.py", [
        "-m", "hydra/sweeper=optuna_rpe", "hydra.sweeper.n_trials=2", *FAST, *TABLE_DATA,
        f"hydra.sweep.dir={sweep_dir}", f"paths.data_dir={data_dir}",
    ], env_extra={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    best = OmegaConf.load(sweep_dir / "optimization_results.yaml")
    assert set(best.best_params) == {"rpe.method", "rpe.mode", "rpe.ratio", "rpe.shared_head"}
    trials = [OmegaConf.load(sweep_dir / str(n) / "config.yaml").rpe for n in (0, 1)]
    for rpe in trials:
        assert rpe.method in ("euclidean", "quant", "cross", "product") and 0.5 <= rpe.ratio <= 3.0
    assert trials[0].ratio != trials[1].ratio


@pytest.mark.slow  # a train.py sweep; test_failed_job_does_not_stop_the_sweep_and_the_table_shows_it stays
def test_plain_multirun_uses_the_default_sweep_dir(tmp_path: Path, data_dir: Path) -> None:
    # Hydra resolves the multirun dir before any job exists, so it must not need the job's runtime info.
    result = run_cli("train.py", [
        "-m", "rpe=none", *FAST, *TABLE_DATA, f"paths.log_dir={tmp_path}", f"paths.data_dir={data_dir}",
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
    assert where.cols == ["with APE", "no APE"]
    cell = where.cells[("k", "with APE")]
    mean, std, n = cell.stats("val/top1")
    assert (mean, n) == (81.0, 2) and std == pytest.approx(math.sqrt(2))
    assert cell.text("val/top1") == "81.00 ± 1.41 (n=2), 1 failed"
    assert where.cells[("qkv", "no APE")].text("val/top1") == "unfinished"

    markdown = make_tables.to_markdown(tables)
    # the buckets used (? without an image size in the config; 0 without RPE), then per column ours and the
    # paper's (Table 4: learned APE, then no APE), never subtracted: ImageNet numbers beside synthetic ones
    assert "| RPE on | used | with APE | paper with APE | no APE | paper no APE |" in markdown
    assert "| k | ? | 81.00 ± 1.41 (n=2), 1 failed | 80.9 | – | 80.9 |" in markdown
    assert "| none | 0 | 70.00 | 79.9 | – | 77.6 |" in markdown
    assert "Δ" not in markdown
    assert "- failed: `" in markdown and "out of memory" in markdown

    out = tmp_path / "t"
    make_tables.write_outputs(tables, out)
    with open(out.with_suffix(".csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["row"] for r in rows if r["table"] == "where_mini"} == {"none", "k", "qkv"}
    parsed = {(r["table"], r["row"], r["col"]): r for r in make_tables.read_csv(out.with_suffix(".csv"))
              if r["metric"] == "val/top1"}
    assert parsed[("where_mini", "k", "with APE")] | {"runs": "", "errors": ""} == {
        "table": "where_mini", "row": "k", "col": "with APE", "metric": "val/top1", "mean": 81.0,
        "std": pytest.approx(math.sqrt(2), abs=1e-4), "n": 2, "ok": 2, "failed": 1, "unfinished": 0,
        "missing": 0, "interrupted": 0, "running": 0, "died": 0, "no_result": 0, "unreadable": 0, "duplicate": 0,
        "paper": 80.9, "used": "?", "same_as": "", "runs": "", "errors": ""}
    assert parsed[("where_mini", "qkv", "no APE")]["unfinished"] == 1
    latex = out.with_suffix(".tex").read_text()
    assert r"81.00 $\pm$ 1.41 (n=2), 1 failed" in latex and r"RPE on & used & with APE" in latex


def test_a_cell_pools_only_runs_that_differ_in_the_seed(tmp_path: Path) -> None:
    k = {"preset": "rpe-1.9-product-ctx-1-k"}
    _fake_run(tmp_path, "k0", k, seed=0, metrics={"val/top1": 80.0})
    _fake_run(tmp_path, "k1", k, seed=1, metrics={"val/top1": 82.0})
    _fake_run(tmp_path, "naive", {**k, "backend": "naive"}, seed=0, metrics={"val/top1": 50.0})
    # a different log or data path cannot change a number: still the same cell
    moved = _fake_run(tmp_path, "k2", k, seed=2, metrics={"val/top1": 84.0})
    cfg = OmegaConf.load(moved / "config.yaml")
    cfg.paths = {"log_dir": "/elsewhere"}
    cfg.logger = {"csv": {"save_dir": "/elsewhere"}}
    OmegaConf.save(cfg, moved / "config.yaml")
    for run in ("k0", "k1", "k2", "naive"):  # the checkpoint callbacks' dirs are resolved into each run's own dir
        cfg = OmegaConf.load(tmp_path / run / "config.yaml")
        checkpoints = {"dirpath": f"/runs/{run}/checkpoints", "monitor": "val/top1"}
        cfg.callbacks = {"model_checkpoint": checkpoints, "last_checkpoint": checkpoints}
        OmegaConf.save(cfg, tmp_path / run / "config.yaml")

    where = make_tables.build_tables(make_tables.collect([tmp_path]))[0]
    assert sorted(where.rows) == ["k [rpe.backend=<unset>]", "k [rpe.backend=naive]"]
    assert where.cells[("k [rpe.backend=<unset>]", "with APE")].stats("val/top1") == (82.0, 2.0, 3)
    assert where.cells[("k [rpe.backend=naive]", "with APE")].stats("val/top1") == (50.0, None, 1)


def _shared_head_runs(root: Path, bias_per_head: list[float], bias_shared: list[float]) -> None:
    for seed, (per_head, shared) in enumerate(zip(bias_per_head, bias_shared, strict=True)):
        for name, share, value in (("ph", False, per_head), ("sh", True, shared)):
            _fake_run(root, f"{name}{seed}", {"preset": "irpe_bias_k", "shared_head": share}, seed=seed,
                      metrics={"val/top1": value}, ablation="shared_head", sweep="shared_head_mini")


@pytest.mark.parametrize(("per_head", "shared", "verdict", "mean", "p"), [
    # paired differences 1.0, 1.5, 1.5, 1.0, 1.5, 1.5: every seed positive, exact p = 2 / 2^6
    ([81.0, 82.0, 83.0] * 2, [80.0, 80.5, 81.5] * 2, "holds", 4 / 3, 2 / 64),
    ([80.0, 80.5, 81.5] * 2, [81.0, 82.0, 83.0] * 2, "reversed", -4 / 3, 2 / 64),
    # differences 3, -2, 0.5 twice: sum 3; of the 64 sign patterns, 40 reach |sum| >= 3 (counted by
    # tests/test_findings_registry.py's scipy check of the same function)
    ([83.0, 80.0, 81.0] * 2, [80.0, 82.0, 80.5] * 2, "not resolved", 0.5, None),
])
def test_findings_get_a_verdict_from_paired_seeds(tmp_path: Path, per_head, shared, verdict, mean, p) -> None:
    _shared_head_runs(tmp_path, per_head, shared)
    tables = make_tables.build_tables(make_tables.collect([tmp_path]))
    results = {v.finding.claim: v for v in make_tables.verdicts(tables, make_tables.FINDINGS, registered_only=False)}
    hurts = results["sharing heads hurts bias mode (per head minus shared)"]
    assert (hurts.verdict, hurts.n) == (verdict, 6)
    assert hurts.mean == pytest.approx(mean)
    # the only finding tested: Holm over a family of one leaves p as it is
    assert (p is None or hurts.p == p) and hurts.p_holm == hurts.p and hurts.p == make_tables.sign_flip_p(
        [a - b for a, b in zip(per_head, shared, strict=True)])
    assert hurts.paper == "+0.49"  # Table 2: 80.54 - 80.05
    # the contextual cells were not run: that finding is not judged
    assert results["sharing heads costs more in bias than in contextual mode"].verdict == "not run"
    # by default the paper tables' findings are exploratory: no snapshot of theirs was taken before the runs
    default = {v.finding.claim: v for v in make_tables.verdicts(tables) if v.finding.ablation == "shared_head"}
    assert default["sharing heads hurts bias mode (per head minus shared)"].verdict == "exploratory"


def test_findings_go_into_the_readme_between_markers(tmp_path: Path) -> None:
    _shared_head_runs(tmp_path, [81.0, 82.0, 83.0], [80.0, 80.5, 81.5])
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- findings:start -->\nold table\n<!-- findings:end -->\noutro\n")
    assert make_tables.main([str(tmp_path), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n<!-- findings:start -->\n| finding (paper) |") and text.endswith(
        "<!-- findings:end -->\noutro\n")
    assert "old table" not in text and "| sharing heads hurts bias mode (per head minus shared) |" in text
    # only this table's findings are listed; the others are counted as not listed
    assert "| contextual beats bias (mean over the four methods) |" not in text
    others = sum(f.ablation != "shared_head" for f in make_tables.all_findings())
    assert f"Not listed: {others} findings of tables not built from these runs." in text
    # a named block: the other markers are left alone
    readme.write_text(text + "<!-- benchmark-findings:start -->\nold\n<!-- benchmark-findings:end -->\n")
    assert make_tables.main([str(tmp_path), "--readme", str(readme), "--readme-block", "benchmark-findings"]) == 0
    assert readme.read_text() == text + "<!-- benchmark-findings:start -->\n" + text.split(
        "<!-- findings:start -->\n")[1].split("<!-- findings:end -->")[0] + "<!-- benchmark-findings:end -->\n"
    # probe 12, H19: a README with Windows line ends keeps them (the block was written in LF, one CR dropped)
    readme.write_bytes(b"intro\r\n<!-- findings:start -->\r\nold\r\n<!-- findings:end -->\r\noutro\r\n")
    assert make_tables.main([str(tmp_path), "--readme", str(readme)]) == 0
    written = readme.read_bytes()
    assert written.count(b"\n") == written.count(b"\r\n") and written.endswith(b"<!-- findings:end -->\r\noutro\r\n")
    readme.write_text("no markers\n")
    with pytest.raises(make_tables.TableError, match="findings:start"):
        make_tables.with_findings(readme.read_text(), "x")


@pytest.mark.parametrize(("damage", "expected"), [
    ("sparse", "is larger than 16 MiB (33554432 bytes); valid: a README of text"),
    ("nul", "holds NUL bytes (a damaged or binary file); valid: a README of text"),
    ("binary", "is not UTF-8 text; valid: a README of text"),
])
def test_a_readme_that_is_no_text_file_is_one_line_before_any_run_is_read(damage: str, expected: str, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    """Probe 11, F18: a sparse 256 MiB README of NULs with the markers at its end was read whole (1.9 GB of memory)
    and written back as 256 MiB of allocated NULs. A README is bounded text, and is left as it was."""
    readme = tmp_path / "README.md"
    markers = b"<!-- findings:start -->\nold\n<!-- findings:end -->\n"
    if damage == "sparse":
        with readme.open("wb") as f:
            f.truncate(32 * 2**20 - len(markers))
            f.seek(0, 2)
            f.write(markers)
    else:
        readme.write_bytes((b"intro\x00\n" if damage == "nul" else b"\xff\xfe intro\n") + markers)
    before = readme.stat()
    assert make_tables.main([str(tmp_path / "no_sweep"), "--readme", str(readme)]) == 2
    assert capsys.readouterr().err == f"error: --readme {str(readme)!r} {expected}\n"
    assert readme.stat().st_mtime_ns == before.st_mtime_ns and readme.stat().st_blocks == before.st_blocks


@pytest.mark.parametrize("block", ["", " ", "a b", "x-->", ":start"])
def test_a_readme_block_that_is_no_marker_name_is_one_line_naming_it(block: str, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    """Probe 7, B71: ``--readme-block ''`` blamed the README, which had the default markers; now the option is
    named, with the valid names, before any run is read, and the README is left as it was."""
    readme = tmp_path / "README.md"
    text = "intro\n<!-- findings:start -->\nold table\n<!-- findings:end -->\n"
    readme.write_text(text)
    assert make_tables.main([str(tmp_path / "no_sweep"), "--readme", str(readme), "--readme-block", block]) == 2
    assert capsys.readouterr().err == (
        f"error: --readme-block={block!r} is not a marker name; valid: letters, digits, '_', '.' or '-', starting"
        " with a letter or digit (the README's markers are <!-- NAME:start --> and <!-- NAME:end -->; default:"
        " findings)\n")
    assert readme.read_text() == text


def test_cost_table_shows_step_time_relative_to_no_rpe(tmp_path: Path) -> None:
    for name, preset, backend, step_ms in (("n", "none", "naive", 100.0), ("kn", "irpe_k", "naive", 150.0),
                                           ("a", "none", "auto", 90.0), ("ka", "irpe_k", "auto", 99.0)):
        _fake_run(tmp_path, name, {"preset": preset, "backend": backend}, metrics={"cost/step_ms": step_ms},
                  ablation="cost", sweep="cost_mini")
    table = make_tables.build_tables(make_tables.collect([tmp_path]))[0]
    ratio = {key: cell.stats("cost/step_vs_none")[0] for key, cell in table.cells.items()}
    assert ratio[(PRODUCT_K, "backend naive")] == pytest.approx(1.5)
    assert ratio[(PRODUCT_K, "backend auto")] == pytest.approx(1.1)
    assert ratio[("none", "backend auto")] == pytest.approx(1.0)
    # the released code's ratio stands beside our naive backend's
    assert "| rpe-1.9-product-ctx-1-k | ? | 1.50 | 1.13 | 1.10 |" in make_tables.to_markdown([table])


@pytest.mark.slow
def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    result = run_cli("scripts/make_tables.py", [str(tmp_path / "nope")])  # the script's exit code and stderr
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"error: '{tmp_path / 'nope'}' does not exist; give run dirs or sweep dirs (runs/sweeps/<name>)"]
    assert make_tables.main([str(tmp_path)]) == 2  # in-process: a second script run would cost ~8 s of imports
    err = capsys.readouterr().err
    assert err.startswith(f"error: {str(tmp_path)!r} holds no run dir or sweep (no config.yaml or multirun.yaml under"
                          " it)") and err.count("\n") == 1, err
    (tmp_path / "metrics.json").write_text("{}")
    assert make_tables.main([str(tmp_path / "metrics.json")]) == 2
    assert capsys.readouterr().err == (f"error: '{tmp_path / 'metrics.json'}' is a file, not a folder; give run"
                                       " dirs or sweep dirs (runs/sweeps/<name>)\n")


def _fake_sweep(root: Path) -> Path:
    """A where_mini-like sweep over seeds 0-3: seed 0 finished, 1 failed, 2 unfinished, 3 never started."""
    sweep = root / "where_mini"
    k = {"preset": "irpe_k"}
    _fake_run(sweep, "seed=0", k, seed=0, metrics={"val/top1": 91.0})
    _fake_run(sweep, "seed=1", k, seed=1, failed="out of memory")
    _fake_run(sweep, "seed=2", k, seed=2)
    for seed in range(3):
        (sweep / f"seed={seed}" / ".hydra").mkdir()
        (sweep / f"seed={seed}" / ".hydra" / "overrides.yaml").write_text(f"- seed={seed}\n")
        (sweep / f"seed={seed}" / "checkpoints").mkdir()
        (sweep / f"seed={seed}" / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    OmegaConf.save({"hydra": {"sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                                          "params": {"seed": "0,1,2,3"}}, "overrides": {"task": []}}},
                   sweep / "multirun.yaml")
    return sweep


def test_missing_grid_points_have_each_its_own_facts_and_an_unfinished_run_says_why(tmp_path: Path) -> None:
    """Probe 24, S56T: the tables of an archive with 344 of 348 jobs missing took longer than the whole archive's
    (one composition per missing job), and its half-copied job was listed unfinished with no reason. The missing
    grid points' facts are composed once per design, and equal their own composition seed by seed."""
    from reports.collect import _grid_point, run_facts

    sweep = _fake_sweep(tmp_path / "runs")
    OmegaConf.save({"hydra": {"sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                                          "params": {"seed": "0,1,2,3,4", "rpe": "irpe_k,shaw"}},
                              "overrides": {"task": []}}}, sweep / "multirun.yaml")
    runs = make_tables.collect([sweep])
    missing = {run.path: run for run in runs if run.status == "missing"}
    assert len(missing) == 7  # 10 grid points; the three runs there fill theirs by their configs
    for run in missing.values():
        overrides = run.path.rsplit("/[", 1)[1].rstrip("]").split(",")
        assert run.facts == run_facts(_grid_point(overrides)), overrides
    assert {run.facts["seed"] for run in missing.values()} == {0, 1, 2, 3, 4}
    [unfinished] = [run for run in runs if run.status == "unfinished"]
    assert unfinished.error == "no run.json or metrics.json: it stopped before it wrote either"
    from storage.destinations import ARCHIVE_MARKER

    (sweep / ARCHIVE_MARKER).write_text("{}")  # the same job in an archive: a copy cut short
    [unfinished] = [run for run in make_tables.collect([sweep]) if run.status == "unfinished"]
    assert unfinished.error == ("no run.json or metrics.json in the archive's copy of it (an archive copy cut short?):"
                                " run archive_runs on its sweep again")


def test_a_job_dir_that_is_a_link_loop_is_named_by_each_reader(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Probe 20, x91, x93, x95, x96: a sweep whose job dir 3 is a link loop (``3 -> 3``) crashed make_tables with a
    traceback; archive_runs left it out without a word; make_tables and plot_rpe given it said "does not exist"."""
    from scripts import archive_runs, plot_rpe

    sweep = _fake_sweep(tmp_path / "runs")
    grid = OmegaConf.load(sweep / "multirun.yaml")
    grid.hydra.sweep = {"subdir": "${hydra.job.num}"}  # job n in folder n
    OmegaConf.save(grid, sweep / "multirun.yaml")
    (sweep / "3").symlink_to("3")
    [missing] = [run for run in make_tables.collect([sweep]) if run.status == "missing"]
    assert missing.error.endswith(f"(its dir {sweep / '3'} is a symlink loop: {sweep / '3'} leads back to itself)")
    assert archive_runs.main([str(sweep), "--to", str(tmp_path / "archive")]) == 0
    assert capsys.readouterr().out.endswith(f", 2 left out: {sweep / 'seed=2'} (unfinished), {sweep / '3'} (a symlink"
                                            " loop)\n")
    from scripts.evaluate_testsets import find_runs

    assert find_runs([sweep]) == [sweep / "seed=0", sweep / "seed=1", sweep / "seed=2"]  # probe 21, y28: named
    assert capsys.readouterr().out == (f"note: {sweep / '3'} is a symlink loop (its links lead back to themselves): no"
                                       " run there is evaluated\n")
    assert make_tables.main([str(sweep / "3"), "--out", str(tmp_path / "t")]) == 2
    assert plot_rpe.main([str(sweep / "3"), "--out", str(tmp_path / "p")]) == 2
    loop = "is a symlink loop (its links lead back to themselves)"
    assert capsys.readouterr().err == (f"error: {str(sweep / '3')!r} {loop}; give run dirs or sweep dirs"
                                       " (runs/sweeps/<name>)\n"
                                       f"error: run dir {sweep / '3'} {loop}; expected a train.py run dir such as"
                                       " runs/<name>/\n")


def test_a_job_dir_that_links_to_a_run_elsewhere_is_named_and_never_evaluated(tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture) -> None:
    """Probe 22, m51, m54: a sweep copy whose job dir 3 is a link to a run outside the sweep: evaluate_testsets
    evaluated that run through the link, writing a result into its testsets/, without a word; make_tables (which
    never follows it) said "no run dir". Both name the link; nothing is written to the run it leads to."""
    from scripts.evaluate_testsets import find_runs

    sweep = _fake_sweep(tmp_path / "runs")
    grid = OmegaConf.load(sweep / "multirun.yaml")
    grid.hydra.sweep = {"subdir": "${hydra.job.num}"}  # job n in folder n
    OmegaConf.save(grid, sweep / "multirun.yaml")
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(sweep / "seed=0", elsewhere)
    (sweep / "3").symlink_to(elsewhere, target_is_directory=True)
    [missing] = [run for run in make_tables.collect([sweep]) if run.status == "missing"]
    assert missing.error.endswith(f"(its dir {sweep / '3'} is a symlink to {elsewhere}, which is never read as the"
                                  " job's run)"), missing.error
    assert find_runs([sweep]) == [sweep / "seed=0", sweep / "seed=1", sweep / "seed=2"]
    assert capsys.readouterr().out == (f"note: {sweep / '3'} is a symlink (to {elsewhere}): the run it leads to is not"
                                       f" one of {sweep}'s and is not evaluated; give its own dir to evaluate it\n")
    (sweep / "3").unlink()
    (sweep / "3").symlink_to("seed=0")  # probe 23, q22: a link to a job of the sweep itself, evaluated as that job
    assert find_runs([sweep]) == [sweep / "seed=0", sweep / "seed=1", sweep / "seed=2"]
    assert capsys.readouterr().out == ""


def test_archive_keeps_what_the_tables_read_and_adds_up(tmp_path: Path) -> None:
    from scripts import archive_runs

    sweep = _fake_sweep(tmp_path / "runs")
    archive = tmp_path / "archive"
    assert archive_runs.main([str(sweep), "--to", str(archive)]) == 0
    kept = sorted(p.relative_to(archive).as_posix() for p in archive.rglob("*") if p.is_file())
    assert kept == [".archives.json", "where_mini/.archive.json", "where_mini/multirun.yaml",
                    "where_mini/seed=0/.hydra/overrides.yaml", "where_mini/seed=0/config.yaml",
                    "where_mini/seed=0/metrics.json",
                    "where_mini/seed=1/.hydra/overrides.yaml", "where_mini/seed=1/config.yaml",
                    "where_mini/seed=1/failed.json"]
    runs = make_tables.collect([archive / "where_mini"])
    assert sorted((r.status, r.metrics.get("val/top1")) for r in runs) == [
        ("failed", None), ("missing", None), ("missing", None), ("ok", 91.0)]

    # a later sitting: the failed job was rerun and finished, seed 2 finished; the archive adds them up
    (sweep / "seed=1" / "failed.json").unlink()
    for seed, top1 in ((1, 93.0), (2, 95.0)):
        (sweep / f"seed={seed}" / "metrics.json").write_text(json.dumps({"val/top1": top1}))
    assert archive_runs.main([str(sweep), "--to", str(archive)]) == 0
    assert not (archive / "where_mini/seed=1/failed.json").exists()
    runs = make_tables.collect([archive / "where_mini"])
    assert sorted((r.status, r.metrics.get("val/top1")) for r in runs) == [
        ("missing", None), ("ok", 91.0), ("ok", 93.0), ("ok", 95.0)]
    assert "\nSeeds: 0, 1, 2.\n" in make_tables.to_markdown(make_tables.build_tables(runs))


def test_missing_jobs_of_a_row_sweep_get_their_own_row_labels(tmp_path: Path) -> None:
    """detr_mini's rows are interpolations (``${rows.${row}.ape}``); each missing job is labelled by its row."""
    sweep = tmp_path / "detr_mini"
    sweep.mkdir()
    OmegaConf.save({"hydra": {"sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                                          "params": {"seed": "0", "row": "sine_none_long,none_ctx9_short"}},
                              "overrides": {"task": ["sweep=detr_mini"]}}}, sweep / "multirun.yaml")
    runs = make_tables.collect([sweep])
    assert [r.status for r in runs] == ["missing", "missing"]
    (table,) = make_tables.build_tables(runs)
    assert sorted(table.rows) == sorted([_label("detr", "sine_none_long"), _label("detr", "none_ctx9_short")])
    assert table.paper.value(_label("detr", "sine_none_long"), "ours", "val/AP") == 40.6  # Table 6, row 8


def test_archive_refuses_a_run_of_another_config(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from scripts import archive_runs

    sweep = _fake_sweep(tmp_path / "runs")
    archive = tmp_path / "archive"
    assert archive_runs.main([str(sweep), "--to", str(archive)]) == 0
    before = (archive / "where_mini/seed=0/metrics.json").read_text()
    config = OmegaConf.load(sweep / "seed=0" / "config.yaml")
    config.model.net.ape = "none"  # the recipe changed; same job name
    OmegaConf.save(config, sweep / "seed=0" / "config.yaml")
    (sweep / "seed=0" / "metrics.json").write_text(json.dumps({"val/top1": 12.5}))
    capsys.readouterr()
    assert archive_runs.main([str(sweep), "--to", str(archive)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: '{archive / 'where_mini/seed=0'}' holds a run of another config than '{sweep / 'seed=0'}'; "
        "remove that sweep's archive to archive the new recipe"]
    assert (archive / "where_mini/seed=0/metrics.json").read_text() == before


# ----------------------------------------------------------------------------- W&B
def test_wandb_groups_by_sweep_and_logs_rpe_columns(tmp_path: Path, data_dir: Path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    import lifecycle.job as job

    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose_config([*TABLE_DATA, *FAST, "logger=wandb", "sweep_name=where_mini",
                          "rpe.preset=rpe-1.9-product-ctx-1-qk"], tmp_path / "run", data_dir)
    trainer = job.build_trainer(cfg.trainer, cfg.callbacks, cfg.logger, job.run_hparams(cfg))
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


def _archives(root: Path) -> tuple[list[str], list[str]]:
    """The committed archives, as scripts/benchmark_tasks.sh names them: the mini ablations, the benchmark tasks
    (`benchmark_archives` of scripts/script_checks.sh, which both scripts read: the CPU tasks' sweeps, and Table 6's
    on a GPU once archived)."""
    ablations = sorted(str(p.relative_to(root)) for p in (root / "docs" / "ablations_mini_runs").glob("*_mini"))
    listed = subprocess.run(["bash", "-c", ". scripts/script_checks.sh && benchmark_archives"], cwd=root,
                            capture_output=True, text=True, check=True)
    benchmarks = listed.stdout.splitlines()
    assert ablations and benchmarks, "the committed archives are missing"
    return ablations, benchmarks


@pytest.mark.slow  # reads every committed archive (about 30 s)
def test_committed_mini_tables_and_readme_findings_are_what_the_archive_builds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/ablations_mini.{md,csv} and the README's findings table (every task's findings, one Holm family)
    are rebuilt from the committed archives by scripts/benchmark_tasks.sh's commands."""
    root = Path(make_tables.__file__).resolve().parents[1]
    monkeypatch.chdir(root)  # the tables name runs relative to the working dir
    ablations, benchmarks = _archives(root)
    readme = tmp_path / "README.md"
    readme.write_text((root / "README.md").read_text())
    out = tmp_path / "ablations_mini"
    assert make_tables.main([*ablations, "--out", str(out), "--family", *benchmarks]) == 0
    for suffix in (".md", ".csv"):
        assert out.with_suffix(suffix).read_text() == (root / "docs" / f"ablations_mini{suffix}").read_text()
    assert make_tables.main([*ablations, *benchmarks, "--readme", str(readme)]) == 0
    assert readme.read_text() == (root / "README.md").read_text()
    block = readme.read_text().split("<!-- findings:start -->")[1].split("<!-- findings:end -->")[0]
    assert "| not run |" not in block  # a finding with a result is never shown as not run


@pytest.mark.slow  # reads every committed archive (about 20 s)
def test_committed_benchmark_tables_and_plots_are_what_the_archive_builds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/benchmark_<task>.{md,csv} are rebuilt from docs/benchmark_runs/<task>_mini (judged with every other
    archive as one family), and docs/plots/benchmark_<task>.png was drawn from those numbers (its rows are
    the task's PLOT_ROWS in scripts/benchmark_tasks.sh)."""
    import re

    from scripts import plot_benchmark

    root = Path(make_tables.__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    ablations, benchmarks = _archives(root)
    script = (root / "scripts" / "benchmark_tasks.sh").read_text()
    for archive in benchmarks:
        task = Path(archive).name.removesuffix("_mini")
        out = tmp_path / f"benchmark_{task}"
        others = [*ablations, *(b for b in benchmarks if b != archive)]
        assert make_tables.main([archive, "--out", str(out), "--family", *others]) == 0
        for suffix in (".md", ".csv"):
            assert out.with_suffix(suffix).read_text() == (root / "docs" / f"benchmark_{task}{suffix}").read_text()
        columns, values = plot_benchmark.series(plot_benchmark.read_csv(out.with_suffix(".csv")), f"{task}_mini")
        plot_rows = re.search(r"declare -A PLOT_ROWS=\((.*?)\n\)", script, re.S).group(1)  # type: ignore[union-attr]
        rows = re.search(rf"\[{task}\]=\"([^\"]+)\"", plot_rows).group(1).split()  # type: ignore[union-attr]
        drawn = plot_benchmark.png_digest(root / "docs" / "plots" / f"benchmark_{task}.png")
        assert drawn == plot_benchmark.series_digest(columns, {row: values[row] for row in rows}), task


def test_the_benchmark_seeds_can_decide_the_registered_findings() -> None:
    """Holm over every registered finding of every task: at the tasks' seed count a finding whose seeds all
    agree in sign clears the family's first step (a family too large for its seeds decides nothing)."""
    from reports.findings import registered_findings, seeds_needed

    registered = registered_findings()
    assert len(registered) == 35 and seeds_needed(len(registered)) == 11 <= BENCHMARK_SEEDS
    gpu_seeds = _compose(["sweep=detr_gpu", "data.root=/x"], hydra=True).hydra.sweeper.params.seed.split(",")
    assert len(gpu_seeds) >= seeds_needed(len(registered))


def test_an_optuna_trial_without_a_value_is_told_failed_and_the_study_goes_on(tmp_path: Path) -> None:
    """The plugin told a failed job's NaN as the trial's value; optuna 2.10 refused it, and the plugin's fallback
    (a failure told with that value) was refused too: two tracebacks, the further trials never ran. Each trial
    is told to optuna (a failed one with no value), jobs keep their numbers, the best trial is of those with one."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install -e '.[optuna]'")
    import optuna
    from hydra.core.utils import JobReturn, JobStatus

    from lifecycle.sweeper import TrialFailureTelling, _FailuresToldFirst

    class Jobs:  # the launcher: job n returns values[n] (NaN: a failed job)
        def __init__(self, values: list[float]) -> None:
            self.values, self.numbers = values, []

        def launch(self, overrides: list, initial_job_idx: int) -> list[JobReturn]:
            self.numbers += range(initial_job_idx, initial_job_idx + len(overrides))
            return [JobReturn(status=JobStatus.COMPLETED, _return_value=self.values[initial_job_idx + i])
                    for i in range(len(overrides))]

    def sweep(values: list[float], n_jobs: int) -> tuple[TrialFailureTelling, Jobs]:
        sweeper = TrialFailureTelling(optuna.samplers.RandomSampler(seed=0), "maximize", None, "t", len(values),
                                      n_jobs, None, None, OmegaConf.create({"x": "interval(0.0, 1.0)"}))
        sweeper.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / f"s{n_jobs}")}}})
        sweeper.hydra_context, sweeper.job_idx, jobs = object(), 0, Jobs(values)
        sweeper.launcher = _FailuresToldFirst(jobs, sweeper)
        sweeper.sweep([])
        return sweeper, jobs

    for n_jobs in (1, 2):  # one trial a batch, and a batch holding a failed trial and a finished one
        sweeper, jobs = sweep([math.nan, 3.0, math.nan, 1.0], n_jobs)
        assert jobs.numbers == [0, 1, 2, 3]  # a failed job's number is not given to the next
        states = [t.state.name for t in sweeper.study.trials]
        assert states == ["FAIL", "COMPLETE", "FAIL", "COMPLETE"] and sweeper.study.best_value == 3.0
        assert OmegaConf.load(tmp_path / f"s{n_jobs}" / "optimization_results.yaml").best_value == 3.0
        assert (tmp_path / f"s{n_jobs}" / "multirun.yaml").is_file()  # the study, for a later launch's check
        trials = OmegaConf.to_container(OmegaConf.load(tmp_path / f"s{n_jobs}" / "trials.yaml"))["trials"]
        assert sorted(trials) == [0, 1, 2, 3] and all(len(job) == 1 and job[0].startswith("x=") for job in
                                                      trials.values())  # each trial's drawn value, by its number
    (tmp_path / "s1" / "optimization_results.yaml").unlink()
    sweeper, _ = sweep([math.nan, math.nan], 1)  # no trial with a value: no best trial, no traceback
    assert [t.state.name for t in sweeper.study.trials] == ["FAIL", "FAIL"]
    assert not (tmp_path / "s1" / "optimization_results.yaml").exists()


def test_a_sweep_dir_is_one_study_with_one_job_naming(tmp_path: Path) -> None:
    """A second sweep into a sweep dir is refused in one line when its sweeper's settings (an optuna study's
    sampler seed), its params or its job dir naming differ; more optuna trials extend the same study."""
    from lifecycle import cli

    def hydra(*overrides: str):
        GlobalHydra.instance().clear()
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            return compose("train", overrides=list(overrides), return_hydra_config=True).hydra

    sweep_dir = tmp_path / "sweep"
    for first, same, other, key in (
            (["hydra/sweeper=optuna_rpe", "hydra.sweeper.n_trials=1"], ["hydra.sweeper.n_trials=5"],
             ["hydra.sweeper.sampler.seed=7"], "hydra.sweeper.sampler"),
            (["hydra/sweeper=optuna_rpe"], [], ["+hydra.sweeper.params.seed='0,1'"], "seed"),
            (["sweep=swin_mini"], [], ["hydra.job.config.override_dirname.kv_sep=@"],
             "hydra.job.config.override_dirname")):
        sweep_dir.mkdir(exist_ok=True)
        saved = OmegaConf.create({"hydra": OmegaConf.to_container(hydra(*first), resolve=False)})
        saved.hydra.overrides.task = [o for o in first if not o.startswith("hydra")]
        OmegaConf.save(saved, sweep_dir / "multirun.yaml")
        task = saved.hydra.overrides.task
        subdir = OmegaConf.to_container(saved.hydra.sweep, resolve=False)["subdir"]
        cli.check_sweep_dir_is_this_sweeps(sweep_dir, [*task, *same], subdir, hydra(*first, *same))
        with pytest.raises(cli.CommandLineError) as err:
            cli.check_sweep_dir_is_this_sweeps(sweep_dir, [*task, *other], subdir, hydra(*first, *other))
        assert str(err.value).startswith(f"hydra.sweep.dir={str(sweep_dir)!r} holds "), err.value
        assert key in str(err.value) and "valid: the same" in str(err.value), err.value


@pytest.mark.slow  # two optuna trials and a refused second study (~25 s on a busy 2-core machine)
def test_a_failed_optuna_trial_is_listed_and_the_next_trial_runs(tmp_path: Path, data_dir: Path) -> None:
    """Trial 0's job fails: one line, trial 1 trains, the study's best is trial 1, exit 1 with the sweep's list of
    failures and no traceback. A second study (another sampler seed) into the same dir is refused before a trial."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install -e '.[optuna]'")
    sweep_dir = tmp_path / "optuna"
    args = ["-m", "hydra/sweeper=optuna_rpe", "hydra.sweeper.n_trials=2", "hydra.sweeper.sampler.seed=1",
            "+callbacks.fail.rank=choice(0,5)", "+callbacks.fail._target_=tests.faults.RaiseOnRank",  # seed 1: 0, 5
            *FAST, *TABLE_DATA, f"hydra.sweep.dir={sweep_dir}", f"paths.data_dir={data_dir}"]
    result = run_cli("train.py", args, env_extra={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert f"error: job failed ({sweep_dir / '0'}): injected failure of rank 0" in result.stderr
    assert f"error: 1 sweep job(s) failed:\n  {sweep_dir / '0'}: injected failure of rank 0" in result.stderr
    assert (sweep_dir / "1" / "metrics.json").is_file()
    assert OmegaConf.load(sweep_dir / "optimization_results.yaml").best_params["++callbacks.fail.rank"] == 5
    again = run_cli("train.py", [a.replace("sampler.seed=1", "sampler.seed=7") for a in args])
    assert again.returncode == 2 and again.stderr.startswith(f"error: hydra.sweep.dir={str(sweep_dir)!r} holds another"
                                                             " sweep"), again.stderr[-2000:]
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == ["0", "1"]
