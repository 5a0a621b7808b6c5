"""The paper's findings as contrasts of cells, and their verdicts on the runs.

A finding is a contrast ``c = sum(weight * cell)`` of the cells of one ablation table that the paper
predicts to have the sign ``sign``. Per seed that every cell of the contrast has, ``d_s`` is the
contrast of that seed's runs (paired differences: seed effects shared by the cells cancel). Over the
``n`` seeds: mean ``m``, standard deviation ``s``, standard error ``se = s / sqrt(n)``; the 95 %
confidence interval is ``m ± t(0.975, n - 1) * se`` (Student's t quantile, ``n - 1`` degrees of
freedom), and the t test's two-sided p value of ``m = 0`` is ``2 * P(T(n - 1) >= |m| / se)``. The verdict reads
the exact sign-flip p instead (`sign_flip_p`: no normality assumed, exact at the few seeds a benchmark has).

The findings judged together are one family: Holm's step-down correction (`holm`) adjusts their exact p values,
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

import hashlib
import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lifecycle.records import FINDINGS_DIR
from reports.cells import Table
from reports.collect import IMAGES, TableError
from reports.layouts import ENTRIES, LAYOUTS, OWN_VAL, PAPER

ALPHA = 0.05  # family-wise error rate of the verdicts
LEVEL = 0.95  # of the confidence intervals
NEAR = 1.0  # points: a run this close to chance is at the floor, this close to 100 at the ceiling
IRPE = "Wu et al., ICCV 2021"  # "Rethinking and Improving Relative Position Encoding for Vision Transformer"
BENCHMARK = "benchmark hypothesis"  # a finding this project's benchmark tasks test, not the paper's claim
NOT_IN_PAPER = "not in the paper"
ROPE_VIT = "Heo et al., ECCV 2024"  # "Rotary Position Embedding for Vision Transformer"
DEFAULT_RULE = "interpolate"  # the APE rule of a test-set column a registered finding names without one
VERDICTS = ("holds", "reversed", "not resolved", "exploratory", "cannot differ", "floor", "ceiling", "not run")


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
    key: str = ""  # the id of a pre-registered finding (findings/<task>.yaml); "" for the paper tables' own

    @property
    def fingerprint(self) -> str:
        """A hash of what the finding tests (claim, table, terms, sign): a run that held a finding of the same
        fingerprint before it trained read it pre-registered."""
        text = json.dumps([self.claim, self.ablation, self.sign, self.terms()], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

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


def _paper_sum(ablation: str, contrast: tuple[tuple[str, str, float], ...]) -> float | None:
    """``sum(weight * cell)`` of the paper's own numbers in ``ablation``'s table; None where one is missing."""
    paper, metric = PAPER.get(ablation), LAYOUTS[ablation].metrics[0]
    values = [paper.value(row, col, metric) if paper else None for row, col, _ in contrast]
    if any(v is None for v in values):
        return None
    return sum(w * v for (_, _, w), v in zip(contrast, values, strict=True))  # type: ignore[operator]


def _paper_text(ablation: str, contrast: tuple[tuple[str, str, float], ...], source: str) -> str:
    """The paper's contrast (of ``ablation``'s table, on the paper's dataset) as the text of a finding judged
    elsewhere."""
    return f"{_paper_sum(ablation, contrast):+.2f} ({ENTRIES[ablation].dataset}, {source})"


# The paper's findings on the paper-scale and mini tables of its ablations (configs/sweep/<ablation>*.yaml):
# those of each entry of scripts/paper_tables/, in the entries' order of findings.
FINDINGS: tuple[Finding, ...] = tuple(
    Finding(f.claim, entry.ablation, f.contrast, source=f.source, sign=f.sign, paper_text=f.paper_text)
    for entry in sorted(ENTRIES.values(), key=lambda e: e.order[1]) for f in entry.findings)


# ----------------------------------------------------------------------------- pre-registered findings
def _paper_of(spec: Any, source: str, where: str) -> str:
    """The paper's contrast of a registered finding's ``paper`` entry (see findings/shift.yaml's header)."""
    if isinstance(spec, str):
        table, _, claim = spec.partition("/")
        same = [f for f in FINDINGS if f.ablation == table and f.claim == claim]
        if not same:
            raise TableError(f"{where}: paper {spec!r} names no finding of the paper's tables"
                             f" (<table>/<claim>; tables: {', '.join(sorted({f.ablation for f in FINDINGS}))})")
        if _paper_sum(table, same[0].contrast) is None:  # a published curve, not a table: its own words
            return same[0].paper_text
        return _paper_text(table, same[0].contrast, same[0].source)
    if isinstance(spec, dict) and set(spec) == {"table", "cells"} and spec["table"] in PAPER:
        try:
            cells = tuple((str(row), str(col), float(weight)) for row, col, weight in spec["cells"])
        except (TypeError, ValueError):
            cells = ()
        total = _paper_sum(spec["table"], cells) if cells else None
        if total is not None:
            return f"{total:+.2f} ({ENTRIES[spec['table']].dataset}, {source})"
    raise TableError(f"{where}: paper {spec!r} is not <table>/<claim> or {{table, cells: [[row, col, weight]]}}"
                     f" of the paper's numbers (tables: {', '.join(sorted(PAPER))})")


def _term(entry: Any, weight: float, testset: Any, where: str) -> tuple[str, str, float, str]:
    """``(row, OWN_VAL, weight, test-set column)`` of an entry ``row`` or ``row:testset``."""
    row, _, named = str(entry).partition(":")
    named = named or testset
    if not row or not isinstance(named, str) or not named:
        raise TableError(f"{where}: entry {entry!r} reads no test set (give `testset` or write row:testset);"
                         " a registered finding never reads the split that trained its runs")
    column = named if "@" in named else f"{named}@{DEFAULT_RULE}"
    return row, OWN_VAL, weight, column


def parse_findings(data: Any, origin: str) -> tuple[Finding, ...]:
    """The findings of a registry file's content (``yaml.safe_load`` of findings/<task>.yaml or of a run's
    snapshot of it). A malformed file or finding is a `TableError` naming ``origin`` and what is wrong."""
    if not (isinstance(data, dict) and isinstance(data.get("task"), str) and isinstance(data.get("findings"), list)):
        raise TableError(f"{origin}: needs `task: <ablation>` and a `findings:` list")
    findings: list[Finding] = []
    known = {"id", "claim", "source", "reference", "paper", "paper_text", "sign", "testset", "plus", "minus", "terms"}
    for i, item in enumerate(data["findings"]):
        where = f"{origin}, finding {i + 1}"
        if not isinstance(item, dict):
            raise TableError(f"{where}: is not a mapping")
        where = f"{origin}, finding {item.get('id', i + 1)!r}"
        unknown = sorted(set(item) - known)
        if unknown:
            raise TableError(f"{where}: unknown key {unknown[0]!r}; valid: {', '.join(sorted(known))}")
        if not item.get("id") or not item.get("claim") or not item.get("source"):
            raise TableError(f"{where}: needs id, claim and source")
        if item.get("sign", 1) not in (1, -1):
            raise TableError(f"{where}: sign {item.get('sign')!r} is not 1 or -1")
        testset = item.get("testset")
        if "terms" in item:
            if "plus" in item or "minus" in item or not isinstance(item["terms"], list):
                raise TableError(f"{where}: give either `terms` ([entry, weight] pairs) or `plus`/`minus` lists")
            try:
                terms = [_term(entry, float(weight), testset, where) for entry, weight in item["terms"]]
            except (TypeError, ValueError):
                raise TableError(f"{where}: terms must be [entry, weight] pairs") from None
        else:
            sides = [(item.get("plus"), 1.0), (item.get("minus"), -1.0)]
            if not all(isinstance(entries, list) and entries for entries, _ in sides):
                raise TableError(f"{where}: needs non-empty `plus` and `minus` lists (or `terms`)")
            terms = [_term(entry, sign / len(entries), testset, where)
                     for entries, sign in sides for entry in entries]
        paper_text = (_paper_of(item["paper"], str(item["source"]), where) if "paper" in item
                      else str(item.get("paper_text") or NOT_IN_PAPER))
        findings.append(Finding(
            str(item["claim"]), data["task"], tuple((row, col, w) for row, col, w, _ in terms), str(item["source"]),
            sign=int(item.get("sign", 1)), paper_text=paper_text, reference=str(item.get("reference") or IRPE),
            testsets=tuple(t for *_, t in terms), key=str(item["id"])))
    keys = [f.key for f in findings]
    if len(set(keys)) != len(keys):
        raise TableError(f"{origin}: id {next(k for k in keys if keys.count(k) > 1)!r} is given twice")
    return tuple(findings)


def read_findings_file(path: Path) -> tuple[Finding, ...]:
    """`parse_findings` of a YAML file (read with ``yaml.safe_load``: nothing in it is executed)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise TableError(f"{path}: cannot be read as YAML ({str(err).splitlines()[0]})") from None
    return parse_findings(data, str(path))


def registered_findings(directory: Path = FINDINGS_DIR) -> tuple[Finding, ...]:
    """Every benchmark task's pre-registered findings: findings/<task>.yaml, in file-name order."""
    found: list[Finding] = []
    for path in sorted(directory.glob("*.yaml")) if directory.is_dir() else []:
        found += read_findings_file(path)
    return tuple(found)


def all_findings(directory: Path = FINDINGS_DIR) -> tuple[Finding, ...]:
    """The paper tables' findings and the benchmark tasks' registered ones: what the verdicts judge."""
    return FINDINGS + registered_findings(directory)

# ----------------------------------------------------------------------------- statistics
@dataclass(frozen=True)
class PairedTest:
    """Mean, standard error, t interval, t and its two-sided p, and the exact sign-flip p of paired differences
    (module docstring)."""

    n: int
    mean: float
    se: float | None
    ci: tuple[float, float] | None
    t: float | None
    p: float | None
    p_exact: float | None = None


MAX_EXACT_N = 24  # 2^24 sign patterns: the largest exact enumeration `sign_flip_p` does


def sign_flip_p(diffs: list[float]) -> float:
    """The exact two-sided p of the paired permutation (sign-flip) test of ``mean(diffs) = 0``: the share of
    the ``2^n`` ways to flip the differences' signs whose sum is at least as far from 0 as the observed one.
    Under the null each seed's difference is as likely negative as positive, whatever its distribution, so
    the test needs no normality; its smallest p is ``2 / 2^n`` (every seed agreeing in sign)."""
    import numpy as np

    values = np.asarray(diffs, dtype=np.float64)
    n = len(values)
    if not 1 <= n <= MAX_EXACT_N:
        raise ValueError(f"the exact sign-flip test takes 1 to {MAX_EXACT_N} differences, not {n}")
    observed = abs(values.sum())
    tolerance = 1e-9 * max(1.0, float(np.abs(values).sum()))  # a pattern tied with the observed sum counts
    low = min(n, 16)  # the sums over the first `low` values for every sign pattern at once, the rest looped
    patterns = ((np.arange(2 ** low)[:, None] >> np.arange(low)) & 1) * 2.0 - 1.0
    low_sums = patterns @ values[:low]
    at_least = 0
    for high in range(2 ** (n - low)):
        signs = ((high >> np.arange(n - low)) & 1) * 2.0 - 1.0
        at_least += int(np.count_nonzero(np.abs(low_sums + signs @ values[low:]) >= observed - tolerance))
    return at_least / 2 ** n


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


def learned_cells(table: Table, metric: str) -> set[tuple[str, str]]:
    """The cells whose runs learned their task: the mean of their own split clears the floor (`floor_level`:
    the ``none`` row, else chance) by more than the split's sampling noise. The ``none`` row is the floor
    itself. Every cell where no floor is known."""
    learned = set()
    for (row, col), cell in table.cells.items():
        values = cell.values(metric)
        classes = {run.facts.get("num_classes") for run in cell.runs if run.status == "ok"}
        level = floor_level(table, col, metric, classes.pop() if len(classes) == 1 else None)
        if level is None:
            learned.add((row, col))
            continue
        images = [run.facts.get("val_images") for run in cell.runs if run.status == "ok"]
        if not (level[2] and row == "none") and values and statistics.fmean(values) > level[0] + sampling_margin(
                level[0], images[0] if images else None):
            learned.add((row, col))
    return learned


def resolving_power(table: Table, metric: str, testset: str = "") -> ResolvingPower | None:
    """`ResolvingPower` of ``metric`` over the table's cells that learned their task (`learned_cells`: a row at
    the floor on its own split would widen the spread with a failure, not a difference of encodings), or
    their results in test-set column ``testset``; None with fewer than two such cells holding a result."""
    one_column = len({col for _, col in table.cells}) == 1  # cells named by their row alone
    learned = learned_cells(table, metric)
    by_seed = {}
    for (row, col), cell in table.cells.items():
        if (row, col) not in learned:
            continue
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
            " pairs with >= 2 shared seeds), over the cells that learned their own split; the benchmark asks"
            " for >= 10 x.")


def paired_test(diffs: list[float], level: float = LEVEL) -> PairedTest:
    """The t interval and test of ``mean(diffs) = 0``; one difference has neither (``se``, ``ci``, ``p``: None)."""
    from scipy.stats import t as student_t

    n, mean = len(diffs), statistics.fmean(diffs)
    if n < 2:
        return PairedTest(n, mean, None, None, None, None)
    exact = sign_flip_p(diffs) if n <= MAX_EXACT_N else None
    se = statistics.stdev(diffs) / math.sqrt(n)
    half = float(student_t.ppf(0.5 + level / 2, n - 1)) * se
    if se == 0:  # every seed gives the same difference: exact, p is 0 unless that difference is 0
        t, p = (math.copysign(math.inf, mean), 0.0) if mean != 0 else (0.0, 1.0)
    else:
        t = mean / se
        p = float(2 * student_t.sf(abs(t), n - 1))
    return PairedTest(n, mean, se, (mean - half, mean + half), t, p, exact)


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
    p: float | None = None  # the exact sign-flip p, which the verdict reads
    p_t: float | None = None  # the t test's p, shown beside it
    p_holm: float | None = None
    family: int = 0  # the findings tested in the Holm family this one was judged in
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


def sampling_margin(percent: float, images: int | None) -> float:
    """Two binomial standard errors, in points, of an accuracy of ``percent`` measured on ``images`` images:
    how far a run's number can sit from its model's true accuracy by the draw of the test images alone. At 0
    or 100 the SE of one image in ``images`` stands in (the binomial SE is 0 there). `NEAR` where the number
    of images is unknown."""
    if not images:
        return NEAR
    q = min(max(percent / 100.0, 1.0 / images), 1.0 - 1.0 / images)
    return 200.0 * math.sqrt(q * (1.0 - q) / images)


def floor_level(table: Table, col: str, metric: str, classes: int | None) -> tuple[float, str, bool] | None:
    """What a run that learned nothing of its task scores on its own split: the mean of the table's ``none``
    row in ``col`` where that row has no position encoding at all (no RPE, no APE: on a task that needs
    positions it is the floor every encoding must clear), else chance. Returns ``(level, label, from_none)``;
    None where neither is known."""
    reference = table.cells.get(("none", col))
    ok = [run for run in reference.runs if run.status == "ok"] if reference is not None else []
    if ok and all(run.facts.get("rpe") == "none" and run.facts.get("ape") in ("none", None) for run in ok):
        values = reference.values(metric)
        if values:
            return statistics.fmean(values), "the `none` row", True
    chance = _chance(metric, classes)
    return (chance, "chance", False) if chance is not None else None


def _bound(finding: Finding, table: Table, metric: str, seeds: list[object]) -> tuple[str, str] | None:
    """``("floor", why)`` when a side's runs all sit at the floor, ``("ceiling", why)`` when all runs of both
    sides sit at 100, each within the sampling noise of its split (`sampling_margin`), else None (module
    docstring). The floor is judged on the runs' own split: a run that learned its task and is at chance on
    a test set (unseen positions) is a result, not a failure to learn."""
    sides: dict[bool, list[tuple[float, int | None]]] = {True: [], False: []}
    classes: set[int | None] = set()
    for row, col, weight, testset in finding.terms():
        cell = table.cells[(row, col)]
        ok = [run for run in cell.runs if run.status == "ok" and run.facts.get("seed") in seeds]
        classes |= {run.facts.get("num_classes") for run in ok}
        for run in ok:
            if testset:
                value, images = run.metrics.get(f"{_column_of(run, testset)}/{metric}"), \
                    run.metrics.get(f"{_column_of(run, testset)}/{IMAGES}")
            else:
                value, images = run.metrics.get(metric), run.facts.get("val_images")
            if value is not None:
                sides[weight > 0].append((value, int(images) if images else None))
    level = floor_level(table, finding.contrast[0][1], metric, classes.pop() if len(classes) == 1 else None)
    if level is not None:
        floor, label, from_none = level
        for positive in (True, False):
            own = [(run.metrics[metric], run.facts.get("val_images")) for row, col, weight, _ in finding.terms()
                   if (weight > 0) == positive and not (from_none and row == "none")
                   for run in table.cells[(row, col)].runs
                   if run.status == "ok" and run.facts.get("seed") in seeds and metric in run.metrics]
            if own and all(v <= floor + sampling_margin(floor, n) for v, n in own):
                cells = [f"`{r} / {c}`" for r, c, w, _ in finding.terms() if (w > 0) == positive]
                return "floor", (f"{', '.join(dict.fromkeys(cells))} within sampling noise of {label},"
                                 f" {floor:.4g}")
    values = sides[True] + sides[False]
    if metric.startswith(("val/top", "val/AP")) and values and all(
            v >= 100.0 - sampling_margin(100.0, n) for v, n in values):
        return "ceiling", "every run within sampling noise of 100"
    return None


def _column_of(run: object, testset: str) -> str:
    """The run's own column name for the test-set column ``testset``: ``<name>@<rule>``, or the file stem of a
    run without an absolute table, whose result no rule changes (`cells.Cell.testset_values`)."""
    name, _, rule = testset.partition("@")
    for own_column, own in run.testsets.items():  # type: ignore[attr-defined]
        if own_column.partition("@")[0] == name and (own is None or own == rule):
            return own_column
    return testset


def registered(run: Any) -> frozenset[str]:
    """The fingerprints (`Finding.fingerprint`) of the findings in the snapshot ``run`` (a `collect.Run`) took of
    its task's findings file when it started; empty where it has none or it does not parse."""
    if run.findings_snapshot is None:
        return frozenset()
    origin, data = run.findings_snapshot
    try:
        return frozenset(f.fingerprint for f in parse_findings(data, origin))
    except (TableError, RecursionError):
        return frozenset()


def registration_problem(finding: Finding, table: Table, seeds: list[object]) -> str | None:
    """Why ``finding`` is not pre-registered for the runs it reads, or None where it is: every such run held
    the finding, with this exact contrast, in the findings snapshot it took when it started. Findings of the
    paper's tables (no id) are never registered in a snapshot: they are judged exploratory."""
    if not finding.key:
        return "not registered before its runs (the paper tables' findings have no registry)"
    read = {run.path: run for row, col, *_ in finding.terms() for run in table.cells[(row, col)].runs
            if run.status == "ok" and run.facts.get("seed") in seeds}
    late = [run for _, run in sorted(read.items()) if finding.fingerprint not in registered(run)]
    if late:
        return f"{len(late)} of its {len(read)} runs did not hold it when they started, e.g. {late[0].path}"
    return None


def _term_by_seed(table: Table, row: str, col: str, testset: str, metric: str) -> dict[object, float]:
    """A term's values per seed: the cell's own ``metric``, or its runs' results in the test-set column."""
    cell = table.cells[(row, col)]
    return cell.testset_by_seed(testset, metric) if testset else cell.by_seed(metric)


def _measure(finding: Finding, table: Table, registered_only: bool = True) -> Verdict:
    """The finding on one table, every verdict but the significance ones (``verdict=""``: to be tested). With
    ``registered_only``, a finding its runs did not hold before they trained is ``exploratory``
    (`registration_problem`): its p is shown, and it joins no family."""
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
    base.n, base.mean, base.se, base.ci, base.t = test.n, test.mean, test.se, test.ci, test.t
    base.p, base.p_t = test.p_exact, test.p
    if base.verdict == "cannot differ":
        base.t = base.p = base.p_t = None
        return base
    bound = _bound(finding, table, metric, seeds)
    late = registration_problem(finding, table, seeds) if registered_only else None
    if bound is not None:
        base.verdict, base.note = bound
        base.t = base.p = base.p_t = None
    elif test.p is None:
        base.verdict, base.note = "not resolved", "1 seed"
    elif late is not None:
        base.verdict, base.note = "exploratory", late
    else:
        base.verdict = ""
    return base


def seeds_needed(family: int, alpha: float = ALPHA) -> int:
    """The fewest seeds at which the exact sign-flip test can decide anything in a Holm family of ``family``
    findings: its smallest p, ``2 / 2^n`` (every seed agreeing in sign), must be at most ``alpha / family``,
    the threshold of the family's first step."""
    n = 1
    while 2 / 2**n > alpha / max(family, 1):
        n += 1
    return n


def _power_text(tested: list[Verdict], family: int) -> str:
    """Whether a Holm family of ``family`` could decide anything at the seed counts of ``tested``
    (`seeds_needed`)."""
    needed, fewest = seeds_needed(family), min(v.n for v in tested)
    text = (f"A family of {family} needs {needed} or more seeds per finding before any verdict is possible"
            f" (the smallest exact p, 2/2^n, must be <= α/{family}); the fewest here: {fewest}")
    short = sum(v.n < needed for v in tested)
    return text + (f", so {short} of them could never be decided: add seeds." if short else ".")


def decide(results: list[Verdict], alpha: float = ALPHA) -> list[Verdict]:
    """Holm over the findings of ``results`` that have a test, then ``holds`` / ``reversed`` / ``not resolved``."""
    tested = [v for v in results if v.verdict == ""]
    for verdict, adjusted in zip(tested, holm([v.p for v in tested]), strict=True):  # type: ignore[misc]
        verdict.p_holm, verdict.family = adjusted, len(tested)
        if adjusted > alpha:
            verdict.verdict = "not resolved"
        else:
            verdict.verdict = "holds" if math.copysign(1, verdict.mean) == verdict.finding.sign else "reversed"  # type: ignore[arg-type]
    return results


def judge(finding: Finding, table: Table, registered_only: bool = False) -> Verdict:
    """The finding judged on one table alone (a family of one)."""
    return decide([_measure(finding, table, registered_only)])[0]


def verdicts(tables: list[Table], findings: tuple[Finding, ...] | None = None,
             registered_only: bool = True) -> list[Verdict]:
    """A verdict per finding (default `all_findings`) and table of its ablation, Holm-corrected over all of
    them as one family, whatever task they belong to; ``not run`` for a finding without such a table."""
    results = []
    for finding in all_findings() if findings is None else findings:
        measured = [_measure(finding, t, registered_only) for t in tables if t.ablation == finding.ablation]
        results += measured or [Verdict(finding, "–", paper_contrast(finding))]
    return decide(results)


def _p_text(p: float | None) -> str:
    return "–" if p is None else "<0.001" if p < 0.001 else f"{p:.3f}"


def markdown_cell(text: object) -> str:
    """``text`` as one cell of a Markdown table: a ``|`` escaped (a run named ``fake|99.99`` had its row read as
    other columns, a number under the wrong heading) and a line break made a blank."""
    return " ".join(str(text).replace("|", "\\|").splitlines())


def findings_markdown(results: list[Verdict]) -> str:
    """The verdict table, one line per finding and table, and a line counting the verdicts. A finding whose
    ablation has no table here is not listed (it is judged where its table is built; it joins no test)."""
    lines = ["| finding (paper) | source | table | paper | ours: mean [95 % CI] (seeds) | exact p | t-test p | Holm p"
             " | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    unlisted = sum(v.table == "–" for v in results)
    results = [v for v in results if v.table != "–"]
    for v in results:
        if v.mean is None:
            ours = "–"
        elif v.ci is None:
            ours = f"{v.mean:+.2f} ({v.n})"
        else:
            ours = f"{v.mean:+.2f} [{v.ci[0]:+.2f}, {v.ci[1]:+.2f}] ({v.n})"
        table = f"`{v.table}`" if v.table != "–" else "–"
        verdict = f"{v.verdict} ({v.note})" if v.note else v.verdict
        cells = (v.finding.claim, v.finding.cited, table, v.paper, ours, _p_text(v.p), _p_text(v.p_t),
                 _p_text(v.p_holm), verdict)
        lines.append("| " + " | ".join(markdown_cell(c) for c in cells) + " |")
    counts = Counter(v.verdict for v in results)
    tested = [v for v in results if v.p_holm is not None]
    family = max((v.family for v in tested), default=0)
    here = f"{len(tested)} listed here" if len(tested) < family else "all listed here"
    lines += ["", f"Holm over the {family} pre-registered findings tested in every task ({here}; exact sign-flip"
              f" p), family-wise α = {ALPHA:g}; the verdicts listed: "
              + ", ".join(f"{counts[k]} {k}" for k in VERDICTS) + "."
              + (f" {_power_text(tested, family)}" if tested else "")
              + (f" Not listed: {unlisted} findings of tables not built from these runs." if unlisted else "")]
    return "\n".join(lines) + "\n"
