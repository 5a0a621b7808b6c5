"""The statistics behind the findings' verdicts (tables/findings.py) and the design check behind
"cannot differ" (tables/collect.py), each against numbers worked out by hand.

The t distribution with 2 degrees of freedom (3 seeds) has a closed form, used for the hand-worked values:
``P(T >= t) = (1 - t / sqrt(t^2 + 2)) / 2`` and its quantile ``t_u = (2u - 1) / sqrt(2u(1 - u))``, so
``t(0.975, 2) = 0.95 / sqrt(0.04875) = 4.302653``.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from reports import collect, findings
from reports.findings import Finding, judge
from rpe.index import clip_index, piecewise_index
from scripts import make_tables
from tests.test_tables_faults import NONE, K, _run

T_975_DF2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)
QKV_NO_APE = "model.net.ape=none,rpe.preset=rpe-1.9-product-ctx-1-qkv"
ARCHIVE = Path(__file__).resolve().parents[1] / "docs" / "ablations_mini_runs"


def _p_df2(t: float) -> float:
    """Two-sided p of t on 2 degrees of freedom, in closed form."""
    return 1 - abs(t) / math.sqrt(t * t + 2)


# ----------------------------------------------------------------------------- the t interval and test
def test_paired_interval_and_p_by_hand() -> None:
    # differences 1.0, 1.5, 1.5: mean 4/3, sd sqrt(1/12) = 0.288675, se 1/6, t = 8
    test = make_tables.paired_test([1.0, 1.5, 1.5])
    assert (test.n, test.mean, test.se, test.t) == (3, pytest.approx(4 / 3), pytest.approx(1 / 6), pytest.approx(8.0))
    assert test.ci == (pytest.approx(4 / 3 - T_975_DF2 / 6), pytest.approx(4 / 3 + T_975_DF2 / 6))  # 0.6162, 2.0504
    assert test.p == pytest.approx(1 - 8 / math.sqrt(66))  # 0.015268
    # differences 3, -2, 0.5: mean 0.5, sd 2.5, se 1.443376, t = 0.346410: the interval holds 0
    wide = make_tables.paired_test([3.0, -2.0, 0.5])
    half = T_975_DF2 * 2.5 / math.sqrt(3)
    assert wide.ci == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))
    assert wide.p == pytest.approx(_p_df2(0.5 / (2.5 / math.sqrt(3))))  # 0.7620
    # four seeds: differences 1, 2, 3, 4, mean 2.5, sd 1.290994, se 0.645497, t(0.975, 3) = 3.182446 (tables)
    four = make_tables.paired_test([1.0, 2.0, 3.0, 4.0])
    half = 3.182446 * 0.645497
    assert four.ci == (pytest.approx(2.5 - half, abs=1e-5), pytest.approx(2.5 + half, abs=1e-5))


def test_one_seed_has_no_interval_and_equal_differences_are_exact() -> None:
    one = make_tables.paired_test([2.0])
    assert (one.n, one.mean, one.se, one.ci, one.t, one.p) == (1, 2.0, None, None, None, None)
    same = make_tables.paired_test([2.0, 2.0, 2.0])
    assert (same.se, same.ci, same.t, same.p) == (0.0, (2.0, 2.0), math.inf, 0.0)
    zero = make_tables.paired_test([0.0, 0.0])
    assert (zero.t, zero.p) == (0.0, 1.0)


# ----------------------------------------------------------------------------- Holm
def test_holm_step_down_by_hand() -> None:
    # sorted 0.005, 0.01, 0.03, 0.04 of m = 4: x4 = 0.02, x3 = 0.03, x2 = 0.06, x1 = 0.04 -> max(0.06, 0.04)
    adjusted = make_tables.holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # at 0.05: 0.005 <= 0.05/4 and 0.01 <= 0.05/3 are rejected; 0.03 > 0.05/2 stops the procedure, so 0.04
    # is not rejected although 0.04 <= 0.05/1
    assert [a <= 0.05 for a in adjusted] == [True, False, False, True]
    assert make_tables.holm([0.2, 0.6]) == pytest.approx([0.4, 0.6])  # 0.6 x 1 stays 0.6 (>= 0.4)
    assert make_tables.holm([0.5, 0.5, 0.5]) == pytest.approx([1.0, 1.0, 1.0])  # capped at 1
    assert make_tables.holm([0.03]) == [0.03] and make_tables.holm([]) == []


def test_seeds_needed_is_where_every_seed_agreeing_clears_holms_first_step() -> None:
    """2/2^n <= 0.05/m, worked by hand: 2/1024 = 0.00195 <= 0.05/25 = 0.002 but > 0.05/26 = 0.00192; 2/2048 =
    0.000977 <= 0.05/51 = 0.000980 but > 0.05/52; 2/4096 <= 0.05/102 = 0.000490 but > 0.05/103."""
    assert [findings.seeds_needed(m) for m in (1, 19, 25, 26, 28, 51, 52, 102, 103)] == [6, 10, 10, 11, 11, 11, 12,
                                                                                         12, 13]
    # the bound is the one Holm sets: at the needed seeds the smallest exact p is rejected, one seed fewer not
    for m in (19, 28, 52):
        n = findings.seeds_needed(m)
        assert make_tables.holm([findings.sign_flip_p([1.0] * n)] + [1.0] * (m - 1))[0] <= 0.05
        assert make_tables.holm([findings.sign_flip_p([1.0] * (n - 1))] + [1.0] * (m - 1))[0] > 0.05


# ----------------------------------------------------------------------------- verdicts on runs
REPLACES = "RPE replaces APE: QKV without APE beats APE alone"  # qkv/no APE minus none/with APE
KEYS = "keys carry more than values (mean over both APE columns)"
V_NO_APE = "model.net.ape=none,rpe.preset=rpe-1.9-product-ctx-1-v"
V = "model.net.ape=sincos,rpe.preset=rpe-1.9-product-ctx-1-v"
K_NO_APE = "model.net.ape=none,rpe.preset=rpe-1.9-product-ctx-1-k"


def _cells(root: Path, values: dict[str, list[float]]) -> dict[str, make_tables.Verdict]:
    """Runs of where_mini jobs with the given top-1 per seed; the verdicts of the paper tables' findings, by
    claim (judged as if registered: these tests check the statistics, tests/test_findings_registry.py the
    registry)."""
    for job, per_seed in values.items():
        for seed, top1 in enumerate(per_seed):
            _run(root, f"{job},seed={seed}", job, seed, {"val/top1": top1, "val/top5": 100.0}, state="finished")
    tables = make_tables.build_tables(make_tables.collect([root]))
    return {v.finding.claim: v for v in make_tables.verdicts(tables, make_tables.FINDINGS, registered_only=False)}


# six seeds: the exact sign-flip test's smallest p is 2 / 2^6 = 0.03125 (every seed agreeing in sign)
@pytest.mark.parametrize(("qkv", "none", "verdict", "p"), [
    ([50.0, 60.0, 70.0, 55.0, 65.0, 52.0], [40.0, 45.0, 50.0, 50.0, 50.0, 50.0], "holds", 2 / 64),
    ([40.0, 45.0, 50.0, 50.0, 50.0, 50.0], [50.0, 60.0, 70.0, 55.0, 65.0, 52.0], "reversed", 2 / 64),
    # differences 10, 15, 20, 5, 15, -1: of the 64 sums of +-those, 4 reach |64|: +-64, +-62 (flip the 1)
    ([50.0, 60.0, 70.0, 55.0, 65.0, 49.0], [40.0, 45.0, 50.0, 50.0, 50.0, 50.0], "not resolved", 4 / 64),
])
def test_a_finding_alone_holds_reverses_or_stays_open(tmp_path: Path, qkv, none, verdict: str, p: float) -> None:
    results = _cells(tmp_path, {QKV_NO_APE: qkv, NONE: none})
    replaces = results[REPLACES]
    assert (replaces.verdict, replaces.n, replaces.note) == (verdict, 6, "")
    assert replaces.p == p and replaces.p_holm == p  # a family of one
    assert replaces.p_t == pytest.approx(make_tables.paired_test(
        [a - b for a, b in zip(qkv, none, strict=True)]).p)  # the t test beside it
    assert replaces.paper == "+1.40"  # Table 4: 81.3 (QKV, no APE) - 79.9 (none, learned APE)
    assert results[KEYS].verdict == "not run" and results[KEYS].p_holm is None  # not in the family


def test_the_t_test_alone_would_call_what_the_exact_test_cannot() -> None:
    """Three seeds of differences 10, 15, 20: t = 3 sqrt 3, p = 0.035 on 2 df, but the exact test's
    smallest p at three seeds is 2 / 8 = 0.25: no verdict can rest on three seeds."""
    test = make_tables.paired_test([10.0, 15.0, 20.0])
    assert test.p == pytest.approx(_p_df2(3 * math.sqrt(3))) and test.p < 0.05 and test.p_exact == 0.25


def test_holm_makes_two_findings_that_each_hold_alone_not_resolved(tmp_path: Path) -> None:
    # each finding alone: exact p = 2/64 = 0.031 < 0.05 (every seed positive); together: Holm's smaller p x 2
    # = 0.0625 > 0.05, and the step-down stops there
    both = _cells(tmp_path, {QKV_NO_APE: [50.0, 60.0, 70.0, 55.0, 65.0, 52.0], NONE: [40.0, 45.0, 50.0] * 2,
                             K: [80.0] * 6, K_NO_APE: [70.0] * 6, V: [78.0, 77.0, 76.0] * 2,
                             V_NO_APE: [68.0, 67.0, 66.0] * 2})
    for claim in (REPLACES, KEYS):
        assert both[claim].p == 2 / 64 and both[claim].p_holm == 4 / 64
        assert both[claim].verdict == "not resolved"
    markdown = make_tables.findings_markdown(list(both.values()))
    assert ("Holm over the 2 pre-registered findings tested in every task (all listed here; exact sign-flip p),"
            " family-wise α = 0.05; the verdicts listed: 0 holds, 0 reversed, 2 not resolved") in markdown
    assert "A family of 2 needs 7 or more seeds per finding" in markdown  # 2/2^7 <= 0.025 < 2/2^6
    assert "the fewest here: 6, so 2 of them could never be decided: add seeds." in markdown
    # one of the two listed: the line still names the family it was judged in
    one = make_tables.findings_markdown([both[REPLACES]])
    assert "Holm over the 2 pre-registered findings tested in every task (1 listed here;" in one
    # keys minus values per seed: 2, 3, 4, 2, 3, 4: mean 3, sd sqrt(0.8), t(0.975, 5) = 2.570582: [2.06, 3.94]
    assert f"| {KEYS} | Table 4 | `where_mini` | +0.70 | +3.00 [+2.06, +3.94] (6) | 0.031 | <0.001 | 0.062 " \
           "| not resolved |" in markdown


def test_floor_is_checked_before_significance_and_leaves_the_family(tmp_path: Path) -> None:
    # qkv without APE at chance (8 classes: 12.5, and 2 binomial SEs on 1024 images are 2.07 points) in every
    # seed; the difference is large and steady, yet the side learned nothing: floor, not reversed. (The
    # table's none row has an APE, so the floor is chance, not that row.)
    results = _cells(tmp_path, {QKV_NO_APE: [12.5, 13.0, 12.0, 14.5, 12.5, 12.5], NONE: [97.0, 98.5, 97.0] * 2,
                                K: [80.0] * 6, K_NO_APE: [70.0] * 6, V: [78.0, 77.0, 76.0] * 2,
                                V_NO_APE: [68.0, 67.0, 66.0] * 2})
    replaces = results[REPLACES]
    assert (replaces.verdict, replaces.p, replaces.p_holm) == ("floor", None, None)
    assert replaces.note == "`qkv / no APE` within sampling noise of chance, 12.5"
    # a family of one remains: the keys finding alone, p = 2/64, holds
    assert results[KEYS].verdict == "holds" and results[KEYS].p_holm == 2 / 64


def test_one_run_off_the_floor_is_not_the_floor(tmp_path: Path) -> None:
    # one seed of qkv without APE got off chance (25.0, beyond 12.5 + 2.07), so the side is not at the floor,
    # and the steady difference is tested
    replaces = _cells(tmp_path, {QKV_NO_APE: [12.5, 13.0, 25.0, 12.5, 12.5, 12.5],
                                 NONE: [97.0, 98.5, 97.0] * 2})[REPLACES]
    assert replaces.verdict == "reversed" and replaces.p == 2 / 64


def test_ceiling_needs_every_run_of_both_sides_at_100_within_sampling_noise(tmp_path: Path) -> None:
    # 1024 images: at 100 % the noise is 2 SEs of one image, 0.195 points; every run at or above 99.81
    results = _cells(tmp_path, {QKV_NO_APE: [99.9, 100.0, 100.0, 99.9, 100.0, 99.9],
                                NONE: [99.85, 99.9, 99.85, 99.85, 99.82, 99.85]})
    assert (results[REPLACES].verdict, results[REPLACES].p) == ("ceiling", None)
    # 99.5 is 5 images below 100: tested
    below = _cells(tmp_path / "below", {QKV_NO_APE: [99.9, 100.0, 100.0, 99.9, 100.0, 99.9],
                                        NONE: [99.5, 99.9, 99.85, 99.85, 99.82, 99.85]})
    assert below[REPLACES].verdict == "holds" and below[REPLACES].p == 2 / 64


def test_one_seed_is_not_resolved(tmp_path: Path) -> None:
    replaces = _cells(tmp_path, {QKV_NO_APE: [60.0], NONE: [40.0]})[REPLACES]
    assert (replaces.verdict, replaces.note, replaces.mean, replaces.ci, replaces.p) == (
        "not resolved", "1 seed", 20.0, None, None)


# ----------------------------------------------------------------------------- cannot differ
def test_the_index_functions_on_one_axis_by_hand() -> None:
    """docs/design.md 1.1: piecewise ``round(x)`` for ``|x| <= alpha``, else ``round(alpha + ln(|x|/alpha) /
    ln(gamma/alpha) (beta - alpha))`` capped at ``B = int(2 ratio)``; clip ``min(round(x), B)``.

    ratio 1.9 (B = 3): piecewise 2 -> round(1.9 + 0.047) = 2, 3 -> round(1.9 + 0.419) = 2, 4 -> round(2.58) = 3;
    clip 3 -> 3. So clip and piecewise differ at |offset| = 3 only: the same below, both 3 above.
    ratio 2.0 (B = 4): 3 -> round(2.39) = 2, 4 -> round(2.67) = 3, 9 -> round(3.45) = 3, 10 -> round(3.55) = 4.
    ratio 2.9 (B = 5): 3 -> round(2.95) = 3, 4 -> round(3.35) = 3, 5 -> round(3.66) = 4, 7 -> round(4.13) = 4.
    """
    x = torch.arange(12)
    assert piecewise_index(x, 1.9, 3.8, 15.2).tolist() == [0, 1, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3]
    assert clip_index(x, 3.8).tolist() == [0, 1, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3]
    assert piecewise_index(x, 2.0, 4.0, 16.0).tolist() == [0, 1, 2, 2, 3, 3, 3, 3, 3, 3, 4, 4]
    assert piecewise_index(x, 2.9, 5.8, 23.2).tolist()[:8] == [0, 1, 2, 3, 3, 4, 4, 4]


def _facts(img_size: int, **rpe: object) -> dict:
    """The facts of the archived where_mini k run (a micro DeiT, patch 4) on ``img_size`` with ``rpe`` edits."""
    cfg = OmegaConf.to_container(OmegaConf.load(ARCHIVE / "where_mini" / f"{K},seed=0" / "config.yaml"))
    cfg = copy.deepcopy(cfg)
    cfg["data"]["img_size"] = img_size
    cfg["rpe"].update(rpe)
    return collect.run_facts(cfg)


@pytest.mark.parametrize(("side", "same"), [
    (3, True),  # offsets up to 2: both are exact
    (4, False),  # offset 3: piecewise 2, clip 3
    (8, False),
])
def test_clip_and_piecewise_at_ratio_19_differ_from_offset_3(side: int, same: bool) -> None:
    piecewise, clip = _facts(4 * side, index="piecewise"), _facts(4 * side, index="clip")
    assert (piecewise["design"] == clip["design"]) is same
    # per axis piecewise reaches 2 + 1 + 2 values at side 3 (offsets -2..2), 7 (-3..3) from side 4 on
    assert piecewise["used_buckets"] == {3: 25, 4: 25, 8: 49}[side]
    assert clip["used_buckets"] == {3: 25, 4: 49, 8: 49}[side]


@pytest.mark.parametrize(("side", "same"), [(8, True), (10, True), (11, False)])
def test_ratios_19_and_20_split_the_offsets_alike_up_to_offset_9(side: int, same: bool) -> None:
    """Both give 0, 1, 2, 2, 3, ..., 3 for |offset| 0-9; at 10 ratio 2.0 reaches 4, ratio 1.9 stays at B = 3."""
    assert (_facts(4 * side, ratio=1.9)["design"] == _facts(4 * side, ratio=2.0)["design"]) is same
    assert _facts(4 * side, ratio=2.0)["used_buckets"] == (49 if same else 81)


def test_the_121_bucket_row_uses_81_on_the_mini_grid() -> None:
    facts = _facts(32, ratio=2.9)  # per axis 0, 1, 2, 3, 3, 4, 4, 4: -4..4, 9 values
    assert (facts["buckets"], facts["used_buckets"]) == (121, 81)


def _distinct_product_buckets(window: int, ratio: float) -> int:
    """iRPE product's buckets that the pairs of a ``window x window`` window reach, counted pair by pair."""
    offsets = torch.arange(-(window - 1), window)
    per_axis = piecewise_index(offsets, ratio, 2 * ratio, 8 * ratio).tolist()
    return len({(row, col) for row in per_axis for col in per_axis})


@pytest.mark.parametrize(("name", "img_size", "window"), [
    ("swinv2_micro_window4_32", 32, 4),  # 8x8 tokens (patch 4) in 4x4 windows
    ("swinv2_tiny_window8_256", 256, 8),  # 64x64 tokens in 8x8 windows
])
def test_a_swin_v2_run_counts_the_buckets_its_window_reaches(name: str, img_size: int, window: int) -> None:
    """Probe 18, q20: Swin-v2's names carry no ``patch<N>``, so its grid, and with it ``used``, was unknown (?)."""
    def facts(preset: str, **net: object) -> dict:
        return collect.run_facts({"model": {"net": {"name": name, "ape": "none", **net}},
                                  "data": {"img_size": img_size}, "rpe": {"preset": preset}})

    for preset in ("irpe_k", "irpe_qkv"):  # the three sites of qkv index one table layout: counted once
        assert facts(preset)["used_buckets"] == _distinct_product_buckets(window, 1.9)
    assert facts("rope_mixed")["used_buckets"] == 0  # no table of positions
    # the config's own window wins over the architecture's
    assert facts("irpe_k", window_size=2)["used_buckets"] == _distinct_product_buckets(2, 1.9)


def test_a_design_is_the_config_and_not_its_labels() -> None:
    base = _facts(32)
    assert _facts(32, preset="irpe_k")["design"] == base["design"]  # the same resolved config
    assert _facts(32, mode="bias")["design"] != base["design"]
    assert _facts(32, shared_head=False)["design"] != base["design"]
    cfg = OmegaConf.to_container(OmegaConf.load(ARCHIVE / "where_mini" / f"{K},seed=0" / "config.yaml"))
    relabelled = {**cfg, "seed": 5, "sweep_name": "elsewhere", "ablation": "compare", "row": "irpe_k"}
    assert collect.run_facts(relabelled)["design"] == base["design"]
    longer = {**cfg, "trainer": {**cfg["trainer"], "max_epochs": 8}}
    assert collect.run_facts(longer)["design"] != base["design"]


def test_relabelled_buckets_count_only_where_every_entry_starts_at_zero() -> None:
    # DETR re-initialises its tables at random: ratio 1.9 and 2.0 stay different designs there
    cfg = OmegaConf.to_container(OmegaConf.load(ARCHIVE / "where_mini" / f"{K},seed=0" / "config.yaml"))
    detr = {**cfg, "model": {**cfg["model"], "_target_": "models.detr.DetectionModule"}}
    designs = [collect._design({**detr, "rpe": {**cfg["rpe"], "ratio": r}}, 8) for r in (1.9, 2.0)]
    assert designs[0] != designs[1]
    # Swin's own bias is drawn truncated-normal, xl embeds offsets: no partition stands for their index
    from rpe import resolve_rpe

    assert collect._bucket_partitions(resolve_rpe({"preset": "swin", "window": 8}), 8) is None
    assert collect._bucket_partitions(resolve_rpe({"preset": "xl"}), 8) is None
    assert collect._bucket_partitions(resolve_rpe({"preset": "irpe_k"}), 8) is not None


def test_partition_ignores_the_ids_themselves() -> None:
    assert collect.partition([[0, 1], [1, 2]]) == collect.partition([[5, 3], [3, 9]])
    assert collect.partition([[0, 1], [1, 2]]) != collect.partition([[0, 1], [2, 2]])


def _bucket_runs(root: Path, ratios: dict[float, list[float]]) -> make_tables.Table:
    for ratio, per_seed in ratios.items():
        for seed, top1 in enumerate(per_seed):
            _run(root, f"ratio={ratio},seed={seed}", K, seed, {"val/top1": top1, "val/top5": 100.0},
                 state="finished", rpe__ratio=ratio, ablation="buckets", sweep_name="buckets_mini")
    [table] = make_tables.build_tables(make_tables.collect([root]))
    return table


def test_a_contrast_of_rows_that_cannot_differ_is_judged_so(tmp_path: Path) -> None:
    # seed noise only (the real runs of these two rows are equal to the last digit): here 1, -1, 0.5 apart
    table = _bucket_runs(tmp_path, {1.9: [98.0, 97.0, 98.5], 2.0: [99.0, 96.0, 99.0], 2.9: [97.0, 97.5, 98.0]})
    assert table.rows == ["49 (ratio 1.9)", "81 (ratio 2)", "121 (ratio 2.9)"]
    same = Finding("ratio 2.0 beats 1.9", "buckets", (("81 (ratio 2)", "ours", 1.0), ("49 (ratio 1.9)", "ours", -1.0)),
                   source="test")
    verdict = judge(same, table)
    assert (verdict.verdict, verdict.p, verdict.mean) == ("cannot differ", None, pytest.approx(0.5 / 3))
    assert verdict.note == "same config and buckets: `81 (ratio 2)` ≡ `49 (ratio 1.9)`"
    # 121 (ratio 2.9) uses 81 buckets: another split, so it can differ
    other = Finding("x", "buckets", (("121 (ratio 2.9)", "ours", 1.0), ("49 (ratio 1.9)", "ours", -1.0)), source="t")
    assert judge(other, table).verdict == "not resolved"
    # weights summed per design: +1 on 49 and +1 on 81 (one design) against -2 on 121 is not zero by design
    pooled = Finding("x", "buckets", (("49 (ratio 1.9)", "ours", 1.0), ("81 (ratio 2)", "ours", 1.0),
                                      ("121 (ratio 2.9)", "ours", -2.0)), source="t")
    assert judge(pooled, table).verdict != "cannot differ"

    assert table.cannot_differ() == {"81 (ratio 2)": "49 (ratio 1.9)"}
    markdown = make_tables.to_markdown([table])
    assert "| 81 (ratio 2) | 49 ≡ 49 (ratio 1.9) | 98.00 ± 1.73 (n=3) |" in markdown
    assert "| 121 (ratio 2.9) | 81 | 97.50 ± 0.50 (n=3) |" in markdown
    out = tmp_path / "out" / "t"
    make_tables.write_outputs([table], out)
    rows = {(r["row"], r["metric"]): r for r in make_tables.read_csv(out.with_suffix(".csv"))}
    assert (rows[("81 (ratio 2)", "val/top1")]["used"], rows[("81 (ratio 2)", "val/top1")]["same_as"]) == (
        "49", "49 (ratio 1.9)")
    assert (rows[("121 (ratio 2.9)", "val/top1")]["used"], rows[("121 (ratio 2.9)", "val/top1")]["same_as"]) == (
        "81", "")
    assert r"49 $\equiv$ 49 (ratio 1.9)" in out.with_suffix(".tex").read_text()


# ----------------------------------------------------------------------------- the findings as data
def _assert_paper_text_is_the_papers_contrast(finding: Finding) -> None:
    """``paper_text`` of a paper finding judged on the shift task starts with the paper's own contrast: that
    of the same claim on its ImageNet table, or (iRPE-QKV minus iRPE-K) of Table 5's numbers."""
    same = [f for f in make_tables.FINDINGS if f.claim == finding.claim and f.ablation != "shift"]
    if same:
        expected = findings.paper_contrast(same[0])
    else:
        compare = make_tables.PAPER["compare"]
        expected = f"{compare.value('irpe_qkv', 'ours', 'val/top1') - compare.value('irpe_k', 'ours', 'val/top1'):+.2f}"
    assert finding.paper_text.startswith(f"{expected} "), (finding.claim, finding.paper_text, expected)
    assert math.copysign(1, float(expected)) == finding.sign


def test_every_finding_names_its_source_and_the_paper_agrees_with_its_sign() -> None:
    for finding in make_tables.FINDINGS:
        assert finding.sign in (1, -1) and finding.source, finding.claim
        if finding.reference == findings.BENCHMARK:  # the benchmark tasks' hypotheses: read test-set results
            assert finding.cited == f"{findings.BENCHMARK}, {finding.source}" and finding.testsets, finding.claim
            assert finding.ablation not in make_tables.PAPER and finding.paper_text == findings.NOT_IN_PAPER
            continue
        if finding.reference == findings.ROPE_VIT:  # RoPE-ViT's claims on a benchmark task: its words, no numbers
            assert finding.cited == f"{findings.ROPE_VIT}, {finding.source}" and finding.testsets, finding.claim
            assert finding.ablation not in make_tables.PAPER and finding.paper_text, finding.claim
            continue
        assert finding.cited == finding.source  # the iRPE paper's findings: the tables hold its numbers
        if finding.ablation == "shift":  # a paper finding re-cast on the shift task: the paper's own contrast
            _assert_paper_text_is_the_papers_contrast(finding)
            continue
        paper = make_tables.PAPER[finding.ablation]
        where = finding.source.split(",")[0]  # "Table 6" of "Table 6, rows 6, 1"
        for row, col, _ in finding.contrast:
            source = paper.sources.get((row, col))
            assert source is None or source.startswith(where), (finding.claim, source)
        contrast = make_tables.verdicts([])  # no tables: every finding not run, with the paper's contrast
        [judged] = [v for v in contrast if v.finding == finding]
        if judged.paper[0] in "+-":  # the paper's numbers give the contrast: its sign is the predicted one
            assert math.copysign(1, float(judged.paper)) == finding.sign, finding.claim
        assert judged.verdict == "not run"
    other = Finding("x", "swin", (("swin", "ours", 1.0),), source="Table 4", reference="Liu 2021")
    assert other.cited == "Liu 2021, Table 4"


def test_resolving_power_against_a_hand_worked_table(tmp_path: Path) -> None:
    """k: 80, 82 and none: 70, 74 over seeds 0, 1 (tests/test_tables_faults.py's sound cells): spread 81 - 72 = 9;
    per-seed differences 10 and 8, SD sqrt(2); one pair, ratio 9 / sqrt(2)."""
    from tests.test_tables_faults import _sound_runs, _tables

    _sound_runs(tmp_path)
    power = findings.resolving_power(_tables(tmp_path)["where_mini"], "val/top1")
    assert (power.best, power.worst, power.pairs) == ("k", "none", 1)  # one column: cells named by row
    assert power.spread == pytest.approx(9.0) and power.median_sd == pytest.approx(math.sqrt(2))
    assert power.ratio == pytest.approx(9 / math.sqrt(2))
    assert findings.resolving_text(power, "val/top1") == (
        "Resolving power (val/top1): best `k` minus worst `none` = 9.00 points, 6.4 x the"
        " median paired seed SD (1.41 points over 1 cell pairs with >= 2 shared seeds), over the cells that learned"
        " their own split; the benchmark asks for >= 10 x.")
