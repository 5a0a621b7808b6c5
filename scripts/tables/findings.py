"""The paper's findings as contrasts of cells, and their verdicts on the runs.

A finding is a contrast ``c = sum(weight * cell)`` of the cells of one ablation table that the paper
predicts to have the sign ``sign``. Per seed that every cell of the contrast has, ``d_s`` is the
contrast of that seed's runs (paired differences: seed effects shared by the cells cancel). Over the
``n`` seeds: mean ``m``, standard deviation ``s``, standard error ``se = s / sqrt(n)``; the 95 %
confidence interval is ``m ± t(0.975, n - 1) * se`` (Student's t quantile, ``n - 1`` degrees of
freedom), and the two-sided p value of ``m = 0`` is ``2 * P(T(n - 1) >= |m| / se)``.

The findings judged together are one family: Holm's step-down correction (`holm`) adjusts their p values,
and a finding is significant when its adjusted p is at most `ALPHA`. The verdict, in this order:

* ``not run``: a cell of the contrast has no run, or no seed has all of them.
* ``cannot differ``: by construction, the contrast is zero: its cells fall into groups of the same design
  (`collect._design`: the same config up to relabelled buckets on the grid the runs use) whose weights
  sum to zero, e.g. ratio 1.9 against 2.0 on an 8x8 grid. No test: there is nothing to find.
* ``floor``: every run of one side of the contrast (the cells of positive, or of negative, weight) is within
  `NEAR` points of chance (top-1: 100 / classes): that side learned nothing, so the contrast compares a
  failure, not the encodings.
* ``ceiling``: every run of both sides is within `NEAR` points of 100: no headroom to tell them apart.
* ``holds`` / ``reversed``: Holm-significant, with the predicted sign / the opposite one.
* ``not resolved``: neither (also with a single seed: no interval, no test).

Findings judged ``cannot differ``, ``floor``, ``ceiling``, ``not run`` or on one seed get no test and are
not part of the family.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass

from scripts.tables.cells import Table
from scripts.tables.layouts import DIRECTED, LAYOUTS, OWN_VAL, PAPER

ALPHA = 0.05  # family-wise error rate of the verdicts
LEVEL = 0.95  # of the confidence intervals
NEAR = 1.0  # points: a run this close to chance is at the floor, this close to 100 at the ceiling
IRPE = "Wu et al., ICCV 2021"  # "Rethinking and Improving Relative Position Encoding for Vision Transformer"
BENCHMARK = "benchmark hypothesis"  # a finding this project's benchmark tasks test, not the paper's claim
NOT_IN_PAPER = "not in the paper"
SHIFT_COL = OWN_VAL  # the shift table's one column: the runs' own (left-half) validation split
# the shift task's test-set columns (runs with an absolute table are resized by interpolation, the default)
LEFT, RIGHT = "relational_left@interpolate", "relational_right@interpolate"
EVERYWHERE = "relational_everywhere@interpolate"
ROPE_VIT = "Heo et al., ECCV 2024"  # "Rotary Position Embedding for Vision Transformer"
VERDICTS = ("holds", "reversed", "not resolved", "cannot differ", "floor", "ceiling", "not run")


# ----------------------------------------------------------------------------- findings
@dataclass(frozen=True)
class Finding:
    """A claim of the paper as a contrast of cells of one ablation table, ``sign(sum(weight * cell)) == sign``.

    ``source``: where ``reference`` makes the claim (table or figure); ``paper_text``: what the paper shows
    where its numbers do not give the contrast (a curve).
    """

    claim: str
    ablation: str
    contrast: tuple[tuple[str, str, float], ...]  # (row, col, weight)
    source: str
    sign: int = 1  # the predicted sign of the contrast
    paper_text: str = ""
    reference: str = IRPE
    # per term of ``contrast``: the test-set column (`cells.testset_columns`, e.g. ``relational_right@interpolate``)
    # whose results the term reads, "" for the cell's own metric; empty: every term reads its own metric
    testsets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.testsets and len(self.testsets) != len(self.contrast):
            raise ValueError(f"finding {self.claim!r}: {len(self.testsets)} test sets for {len(self.contrast)} terms")

    def terms(self) -> list[tuple[str, str, float, str]]:
        """``(row, col, weight, testset)`` per term of the contrast."""
        testsets = self.testsets or ("",) * len(self.contrast)
        return [(row, col, weight, testset)
                for (row, col, weight), testset in zip(self.contrast, testsets, strict=True)]

    @property
    def cited(self) -> str:
        """``source``, with the reference named where it is not the iRPE paper (whose numbers the tables show)."""
        return self.source if self.reference == IRPE else f"{self.reference}, {self.source}"


def _mean_of(cells: list[tuple[str, str]], weight: float) -> tuple[tuple[str, str, float], ...]:
    return tuple((row, col, weight / len(cells)) for row, col in cells)


def _paper_sum(ablation: str, contrast: tuple[tuple[str, str, float], ...]) -> float | None:
    """``sum(weight * cell)`` of the paper's own numbers in ``ablation``'s table; None where one is missing."""
    paper, metric = PAPER.get(ablation), LAYOUTS[ablation].metrics[0]
    values = [paper.value(row, col, metric) if paper else None for row, col, _ in contrast]
    if any(v is None for v in values):
        return None
    return sum(w * v for (_, _, w), v in zip(contrast, values, strict=True))  # type: ignore[operator]


def _paper_text(ablation: str, contrast: tuple[tuple[str, str, float], ...], source: str) -> str:
    """The paper's contrast (of ``ablation``'s ImageNet table) as the text of a finding judged elsewhere."""
    return f"{_paper_sum(ablation, contrast):+.2f} (ImageNet, {source})"


_METHOD_ROWS = [f"{m} ({d})" for m, d in DIRECTED.items()]
_CTX_MINUS_BIAS = (_mean_of([(r, "ctx") for r in _METHOD_ROWS], 1) + _mean_of([(r, "bias") for r in _METHOD_ROWS], -1))
_DIRECTED_MINUS_UNDIRECTED = (_mean_of([("cross (directed)", "ctx"), ("product (directed)", "ctx")], 1)
                              + _mean_of([("euclidean (undirected)", "ctx"), ("quant (undirected)", "ctx")], -1))
FINDINGS: tuple[Finding, ...] = (
    Finding("contextual beats bias (mean over the four methods)", "method_mode", _CTX_MINUS_BIAS, source="Table 1"),
    Finding("directed beats undirected in contextual mode", "method_mode", _DIRECTED_MINUS_UNDIRECTED,
            source="Table 1"),
    Finding("sharing heads hurts bias mode (per head minus shared)", "shared_head",
            (("bias", "per head", 1.0), ("bias", "shared", -1.0)), source="Table 2"),
    Finding("sharing heads costs more in bias than in contextual mode", "shared_head",
            (("bias", "per head", 1.0), ("bias", "shared", -1.0), ("ctx", "per head", -1.0), ("ctx", "shared", 1.0)),
            source="Table 2"),
    Finding("more buckets help up to ~50 (49 minus 9 buckets)", "buckets",
            (("49 (ratio 1.9)", "ours", 1.0), ("9 (ratio 0.5)", "ours", -1.0)), source="Figure 3",
            paper_text="rises (Figure 3: 79.9 without RPE to 80.9 at 50)"),
    Finding("the gain saturates past ~50 (gain 9->49 exceeds gain 49->121)", "buckets",
            (("49 (ratio 1.9)", "ours", 2.0), ("9 (ratio 0.5)", "ours", -1.0), ("121 (ratio 2.9)", "ours", -1.0)),
            source="Figure 3", paper_text="flat after 50 (Figure 3)"),
    Finding("keys carry more than values (mean over both APE columns)", "where",
            _mean_of([("k", "with APE"), ("k", "no APE")], 1) + _mean_of([("v", "with APE"), ("v", "no APE")], -1),
            source="Table 4"),
    Finding("RPE replaces APE: QKV without APE beats APE alone", "where",
            (("qkv", "no APE", 1.0), ("none", "with APE", -1.0)), source="Table 4"),
    Finding("RPE helps DETR (contextual 9x9 minus none, sine APE)", "detr",
            (("sine, ctx 9x9, short", "ours", 1.0), ("sine, none, short", "ours", -1.0)), source="Table 6, rows 6, 1"),
    Finding("RPE helps DETR at the long schedule too (contextual 9x9 minus none, sine APE)", "detr",
            (("sine, ctx 9x9, long", "ours", 1.0), ("sine, none, long", "ours", -1.0)), source="Table 6, rows 9, 8"),
    Finding("detection needs the absolute encoding (sine minus none, no RPE)", "detr",
            (("sine, none, short", "ours", 1.0), ("none, none, short", "ours", -1.0)), source="Table 6, rows 1, 2"),
    Finding("piecewise beats clip for detection", "detr",
            (("sine, ctx 9x9, short", "ours", 1.0), ("sine, ctx clip 9x9, short", "ours", -1.0)),
            source="Table 6, rows 6, 5"),
    Finding("contextual beats bias for detection (9x9, sine APE)", "detr",
            (("sine, ctx 9x9, short", "ours", 1.0), ("sine, bias 9x9, short", "ours", -1.0)),
            source="Table 6, rows 6, 3"),
    Finding("iRPE-K beats CPVT's conditional encoding", "compare", (("irpe_k", "ours", 1.0), ("cpvt", "ours", -1.0)),
            source="Table 5"),
    Finding("iRPE-QKV beats the best earlier relative encoding (Huang's)", "compare",
            (("irpe_qkv", "ours", 1.0), ("huang", "ours", -1.0)), source="Table 5"),
    Finding("Swin's bias beats no RPE on Swin", "swin", (("swin", "ours", 1.0), ("none", "ours", -1.0)),
            source="Supplement, Swin-T"),
    Finding("contextual iRPE-QKV beats Swin's bias on Swin", "swin",
            (("rpe-1.9-product-ctx-1-qkv", "ours", 1.0), ("swin", "ours", -1.0)), source="Supplement, Swin-T"),
    # The paper's Tables 1 and 5 on the position-shift task, whose main rows have no APE (so position
    # comes only from the encoding), on the in-distribution result (the own val split); the paper's
    # contrast is that of its own table.
    Finding("contextual beats bias (mean over the four methods)", "shift",
            _mean_of([(r, SHIFT_COL) for r in ("euc_ctx", "quant_ctx", "cross_ctx", "product_ctx")], 1)
            + _mean_of([(r, SHIFT_COL) for r in ("euc_bias", "quant_bias", "cross_bias", "product_bias")], -1),
            source="Table 1", paper_text=_paper_text("method_mode", _CTX_MINUS_BIAS, "Table 1")),
    Finding("directed beats undirected in contextual mode", "shift",
            _mean_of([("cross_ctx", SHIFT_COL), ("product_ctx", SHIFT_COL)], 1)
            + _mean_of([("euc_ctx", SHIFT_COL), ("quant_ctx", SHIFT_COL)], -1),
            source="Table 1", paper_text=_paper_text("method_mode", _DIRECTED_MINUS_UNDIRECTED, "Table 1")),
    Finding("iRPE-QKV beats iRPE-K", "shift", (("irpe_qkv", SHIFT_COL, 1.0), ("product_ctx", SHIFT_COL, -1.0)),
            source="Table 5",
            paper_text=_paper_text("compare", (("irpe_qkv", "ours", 1.0), ("irpe_k", "ours", -1.0)), "Table 5")),
    Finding("iRPE-K beats CPVT's conditional encoding", "shift",
            (("product_ctx", SHIFT_COL, 1.0), ("cpvt", SHIFT_COL, -1.0)), source="Table 5",
            paper_text=_paper_text("compare", (("irpe_k", "ours", 1.0), ("cpvt", "ours", -1.0)), "Table 5")),
    Finding("iRPE-QKV beats the best earlier relative encoding (Huang's)", "shift",
            (("irpe_qkv", SHIFT_COL, 1.0), ("huang", SHIFT_COL, -1.0)), source="Table 5",
            paper_text=_paper_text("compare", (("irpe_qkv", "ours", 1.0), ("huang", "ours", -1.0)), "Table 5")),
    # The position-shift benchmark (trained with both objects in the left half): what relative encodings are
    # for. These are the benchmark's hypotheses, not the paper's claims; they read the runs' test-set results.
    Finding("relative positions carry to unseen positions: iRPE-K (no APE) beats the learned APE on the right"
            " half", "shift", (("product_ctx", SHIFT_COL, 1.0), ("ape_learned", SHIFT_COL, -1.0)),
            source="shift task", reference=BENCHMARK, paper_text=NOT_IN_PAPER, testsets=(RIGHT, RIGHT)),
    Finding("iRPE-K loses less than the learned APE when the objects move (drop from left to right half)",
            "shift", (("ape_learned", SHIFT_COL, 1.0), ("ape_learned", SHIFT_COL, -1.0),
                      ("product_ctx", SHIFT_COL, -1.0), ("product_ctx", SHIFT_COL, 1.0)),
            source="shift task", reference=BENCHMARK, paper_text=NOT_IN_PAPER, testsets=(LEFT, RIGHT, LEFT, RIGHT)),
    Finding("contextual beats bias on unseen positions (product iRPE-K, right half)", "shift",
            (("product_ctx", SHIFT_COL, 1.0), ("product_bias", SHIFT_COL, -1.0)),
            source="shift task", reference=BENCHMARK, paper_text=NOT_IN_PAPER, testsets=(RIGHT, RIGHT)),
    Finding("axial RoPE (no APE) beats the learned APE on the right half", "shift",
            (("rope_axial", SHIFT_COL, 1.0), ("ape_learned", SHIFT_COL, -1.0)),
            source="shift task", reference=BENCHMARK, paper_text=NOT_IN_PAPER, testsets=(RIGHT, RIGHT)),
    # RoPE-ViT's claim that mixed (learned-frequency) RoPE extrapolates better than axial RoPE: it tests on
    # images larger than the training ones, which hold the training positions and new ones; the shift task's
    # analogue is the whole canvas, trained on its left half.
    Finding("mixed RoPE beats axial RoPE beyond the training positions (whole canvas)", "shift",
            (("rope_mixed", SHIFT_COL, 1.0), ("rope_axial", SHIFT_COL, -1.0)),
            source="multi-resolution results", reference=ROPE_VIT,
            paper_text="mixed above axial at larger resolutions", testsets=(EVERYWHERE, EVERYWHERE)),
    Finding("CPVT's conditional encoding beats the learned APE on the right half", "shift",
            (("cpvt", SHIFT_COL, 1.0), ("ape_learned", SHIFT_COL, -1.0)),
            source="shift task", reference=BENCHMARK, paper_text=NOT_IN_PAPER, testsets=(RIGHT, RIGHT)),
)


# ----------------------------------------------------------------------------- statistics
@dataclass(frozen=True)
class PairedTest:
    """Mean, standard error, confidence interval, t and two-sided p of paired differences (module docstring)."""

    n: int
    mean: float
    se: float | None
    ci: tuple[float, float] | None
    t: float | None
    p: float | None


@dataclass(frozen=True)
class ResolvingPower:
    """A table's spread against its noise: best minus worst cell mean, and the median over cell pairs (with at
    least two shared seeds) of the standard deviation of their per-seed differences."""

    best: str
    worst: str
    spread: float
    median_sd: float | None
    pairs: int

    @property
    def ratio(self) -> float | None:
        return self.spread / self.median_sd if self.median_sd else None


def resolving_power(table: Table, metric: str, testset: str = "") -> ResolvingPower | None:
    """`ResolvingPower` of ``metric`` over the table's cells (or their results in test-set column ``testset``);
    None with fewer than two cells holding a result."""
    one_column = len({col for _, col in table.cells}) == 1  # cells named by their row alone
    by_seed = {}
    for (row, col), cell in table.cells.items():
        values = cell.testset_by_seed(testset, metric) if testset else cell.by_seed(metric)
        if values:
            by_seed[row if one_column else f"{row} / {col}"] = values
    if len(by_seed) < 2:
        return None
    means = {name: statistics.fmean(v.values()) for name, v in by_seed.items()}
    best, worst = max(means, key=means.get), min(means, key=means.get)  # type: ignore[arg-type]
    sds = []
    names = sorted(by_seed)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            shared = sorted(set(by_seed[a]) & set(by_seed[b]), key=str)
            if len(shared) >= 2:
                sds.append(statistics.stdev([by_seed[a][s] - by_seed[b][s] for s in shared]))
    median_sd = statistics.median(sds) if sds else None
    return ResolvingPower(best, worst, means[best] - means[worst], median_sd, len(sds))


def resolving_text(power: ResolvingPower, where: str) -> str:
    """One line of a table's resolving power (the benchmark asks for a spread of at least 10 median SDs)."""
    head = f"Resolving power ({where}): best `{power.best}` minus worst `{power.worst}` = {power.spread:.2f} points"
    if power.median_sd is None:
        return head + "; no cell pair shares two seeds, so no paired SD."
    ratio = f"{power.ratio:.1f}" if power.ratio is not None else "∞"
    return (head + f", {ratio} x the median paired seed SD ({power.median_sd:.2f} points over {power.pairs} cell"
            " pairs with >= 2 shared seeds); the benchmark asks for >= 10 x.")


def paired_test(diffs: list[float], level: float = LEVEL) -> PairedTest:
    """The t interval and test of ``mean(diffs) = 0``; one difference has neither (``se``, ``ci``, ``p``: None)."""
    from scipy.stats import t as student_t

    n, mean = len(diffs), statistics.fmean(diffs)
    if n < 2:
        return PairedTest(n, mean, None, None, None, None)
    se = statistics.stdev(diffs) / math.sqrt(n)
    half = float(student_t.ppf(0.5 + level / 2, n - 1)) * se
    if se == 0:  # every seed gives the same difference: exact, p is 0 unless that difference is 0
        t, p = (math.copysign(math.inf, mean), 0.0) if mean != 0 else (0.0, 1.0)
    else:
        t = mean / se
        p = float(2 * student_t.sf(abs(t), n - 1))
    return PairedTest(n, mean, se, (mean - half, mean + half), t, p)


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p values, in the order given: the i-th smallest ``p_(i)`` of ``m`` becomes
    ``max over j <= i of min(1, (m - j + 1) p_(j))``. A hypothesis is rejected at level alpha exactly when its
    adjusted p is <= alpha, which is Holm's procedure: reject while ``p_(i) <= alpha / (m - i + 1)``, stop at
    the first that is not."""
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


# ----------------------------------------------------------------------------- verdicts
@dataclass
class Verdict:
    """A finding judged on one table: the contrast's statistics, its Holm-adjusted p and the verdict."""

    finding: Finding
    table: str
    paper: str
    n: int = 0
    mean: float | None = None
    se: float | None = None
    ci: tuple[float, float] | None = None
    t: float | None = None
    p: float | None = None
    p_holm: float | None = None
    verdict: str = "not run"
    note: str = ""


def paper_contrast(finding: Finding) -> str:
    """The finding's contrast of the paper's own numbers, or what the paper shows instead."""
    total = None if any(finding.testsets) else _paper_sum(finding.ablation, finding.contrast)
    return f"{total:+.2f}" if total is not None else finding.paper_text or "–"


def _chance(metric: str, num_classes: int | None) -> float | None:
    """The metric of a model that learned nothing; None where that is not a fixed number (AP)."""
    if num_classes is None:
        return None
    if metric == "val/top1":
        return 100.0 / num_classes
    if metric == "val/top5":
        return 100.0 * min(5, num_classes) / num_classes
    return None


def _cannot_differ(finding: Finding, table: Table) -> str | None:
    """Why the contrast is zero by construction (its cells grouped by design, each group's weights summing to
    zero), or None. A cell without a single design is a group of its own."""
    groups: dict[object, list[tuple[str, float]]] = {}
    for row, col, weight, testset in finding.terms():
        design = table.cells[(row, col)].design
        groups.setdefault((design if design is not None else (row, col), testset), []).append((row, weight))
    if not all(abs(sum(w for _, w in members)) < 1e-9 for members in groups.values()):
        return None
    same = [" ≡ ".join(dict.fromkeys(f"`{row}`" for row, _ in members)) for members in groups.values()]
    return "same config and buckets: " + "; ".join(same)


def _bound(finding: Finding, table: Table, metric: str, seeds: list[object]) -> tuple[str, str] | None:
    """``("floor", why)`` when a side's runs all sit at chance, ``("ceiling", why)`` when all runs of both sides
    sit at 100, else None (module docstring). The floor is judged on the runs' own metric: a run that learned
    its task and is at chance on a test set (unseen positions) is a result, not a failure to learn."""
    sides: dict[bool, list[float]] = {True: [], False: []}
    own: dict[bool, list[float]] = {True: [], False: []}
    classes: set[int | None] = set()
    for row, col, weight, testset in finding.terms():
        cell = table.cells[(row, col)]
        by_seed, own_by_seed = _term_by_seed(table, row, col, testset, metric), cell.by_seed(metric)
        sides[weight > 0] += [by_seed[s] for s in seeds]
        own[weight > 0] += [own_by_seed[s] for s in seeds if s in own_by_seed]
        classes |= {run.facts.get("num_classes") for run in cell.runs if run.status == "ok"}
    chance = _chance(metric, classes.pop()) if len(classes) == 1 else None
    if chance is not None:
        for positive, values in own.items():
            if values and all(abs(v - chance) <= NEAR for v in values):
                cells = [f"`{r} / {c}`" for r, c, w, _ in finding.terms() if (w > 0) == positive]
                return "floor", f"{', '.join(dict.fromkeys(cells))} at chance, {chance:.4g}"
    if metric.startswith(("val/top", "val/AP")) and all(abs(v - 100.0) <= NEAR for vs in sides.values() for v in vs):
        return "ceiling", "every run within 1 point of 100"
    return None


def _term_by_seed(table: Table, row: str, col: str, testset: str, metric: str) -> dict[object, float]:
    """A term's values per seed: the cell's own ``metric``, or its runs' results in the test-set column."""
    cell = table.cells[(row, col)]
    return cell.testset_by_seed(testset, metric) if testset else cell.by_seed(metric)


def _measure(finding: Finding, table: Table) -> Verdict:
    """The finding on one table, every verdict but the significance ones (``verdict=""``: to be tested)."""
    base = Verdict(finding, table.name, paper_contrast(finding))
    if any((row, col) not in table.cells for row, col, _ in finding.contrast):
        return base
    why = _cannot_differ(finding, table)
    if why is not None:
        base.verdict, base.note = "cannot differ", why
    metric = table.layout.metrics[0]
    seed_values = [(_term_by_seed(table, row, col, testset, metric), weight)
                   for row, col, weight, testset in finding.terms()]
    seeds = sorted(set.intersection(*(set(values) for values, _ in seed_values)), key=str)
    if not seeds:
        return base
    test = paired_test([sum(w * values[s] for values, w in seed_values) for s in seeds])
    base.n, base.mean, base.se, base.ci, base.t, base.p = test.n, test.mean, test.se, test.ci, test.t, test.p
    if base.verdict == "cannot differ":
        base.t = base.p = None
        return base
    bound = _bound(finding, table, metric, seeds)
    if bound is not None:
        base.verdict, base.note = bound
        base.t = base.p = None
    elif test.p is None:
        base.verdict, base.note = "not resolved", "1 seed"
    else:
        base.verdict = ""
    return base


def decide(results: list[Verdict], alpha: float = ALPHA) -> list[Verdict]:
    """Holm over the findings of ``results`` that have a test, then ``holds`` / ``reversed`` / ``not resolved``."""
    tested = [v for v in results if v.verdict == ""]
    for verdict, adjusted in zip(tested, holm([v.p for v in tested]), strict=True):  # type: ignore[misc]
        verdict.p_holm = adjusted
        if adjusted > alpha:
            verdict.verdict = "not resolved"
        else:
            verdict.verdict = "holds" if math.copysign(1, verdict.mean) == verdict.finding.sign else "reversed"  # type: ignore[arg-type]
    return results


def judge(finding: Finding, table: Table) -> Verdict:
    """The finding judged on one table alone (a family of one)."""
    return decide([_measure(finding, table)])[0]


def verdicts(tables: list[Table]) -> list[Verdict]:
    """A verdict per finding and table of its ablation, Holm-corrected over all of them; ``not run`` for a
    finding without such a table."""
    results = []
    for finding in FINDINGS:
        measured = [_measure(finding, t) for t in tables if t.ablation == finding.ablation]
        results += measured or [Verdict(finding, "–", paper_contrast(finding))]
    return decide(results)


def _p_text(p: float | None) -> str:
    return "–" if p is None else "<0.001" if p < 0.001 else f"{p:.3f}"


def findings_markdown(results: list[Verdict]) -> str:
    """The verdict table, one line per finding and table, and a line counting the verdicts."""
    lines = ["| finding (paper) | source | table | paper | ours: mean [95 % CI] (seeds) | p | Holm p | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for v in results:
        if v.mean is None:
            ours = "–"
        elif v.ci is None:
            ours = f"{v.mean:+.2f} ({v.n})"
        else:
            ours = f"{v.mean:+.2f} [{v.ci[0]:+.2f}, {v.ci[1]:+.2f}] ({v.n})"
        table = f"`{v.table}`" if v.table != "–" else "–"
        verdict = f"{v.verdict} ({v.note})" if v.note else v.verdict
        lines.append(f"| {v.finding.claim} | {v.finding.cited} | {table} | {v.paper} | {ours} | {_p_text(v.p)} "
                     f"| {_p_text(v.p_holm)} | {verdict} |")
    counts = Counter(v.verdict for v in results)
    tested = sum(v.p_holm is not None for v in results)
    lines += ["", f"Holm over the {tested} findings tested, family-wise α = {ALPHA:g}: "
              + ", ".join(f"{counts[k]} {k}" for k in VERDICTS) + "."]
    return "\n".join(lines) + "\n"
