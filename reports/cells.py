"""Runs into cells and tables: pooling over seeds, and the statistics of a cell.

A test-set column (`testset_columns`) is ``<name>@<rule>`` for the results of runs whose absolute position
table was resized by APE rule ``<rule>``; a run without an absolute table (its result file's ``ape_rule`` is
null: eval.py refuses a rule there) has one result whatever the rule, and it stands in each rule's column of
its test set. A test set that no run of the table has a rule for gets the plain column ``<name>``. A cell's
entry there is the mean ± std over the seeds that have that result, and says how many of the cell's counted
seeds that is when it is not all of them: a mean over fewer seeds than the cell's own is never shown as if
it were over the same seeds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from reports.collect import APE_RULE, STATUSES, TESTSET_NAME, TESTSETS, Run, lenient_rpe
from reports.layouts import LAYOUTS, PAPER, Layout, PaperTable

NOT_COUNTED = "runs not counted"  # the table of runs that no cell can hold (their config is unreadable)
# its cells are keyed by the runs' paths (`_not_counted`): such runs have no facts to lay out
NOT_COUNTED_LAYOUT = Layout("Runs not counted", "run", lambda f: None, lambda f: "status", metrics=("",))


# ----------------------------------------------------------------------------- cells
@dataclass
class Cell:
    """All runs at one (row, col) of one table."""

    runs: list[Run] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.runs)

    def values(self, metric: str) -> list[float]:
        return [r.metrics[metric] for r in self.runs if r.status == "ok" and metric in r.metrics
                and math.isfinite(r.metrics[metric])]

    def by_seed(self, metric: str) -> dict[Any, float]:
        """Mean of the ok runs per seed (what a paired comparison pairs)."""
        seeds: dict[Any, list[float]] = {}
        for run in self.runs:
            if run.status == "ok" and math.isfinite(run.metrics.get(metric, math.nan)):
                seeds.setdefault(run.facts["seed"], []).append(run.metrics[metric])
        return {seed: statistics.fmean(v) for seed, v in seeds.items()}

    @property
    def design(self) -> str | None:
        """The one design (`collect._design`) of this cell's runs; None when they have none or several."""
        designs = {run.facts.get("design") for run in self.runs}
        return designs.pop() if len(designs) == 1 else None

    def used_buckets(self) -> str:
        """The buckets the runs' grid reaches (``49``; ``?`` where unknown), distinct values joined."""
        values = {run.facts.get("used_buckets") for run in self.runs}
        return ", ".join(sorted(("?" if v is None else str(v) for v in values), key=_natural))

    def stats(self, metric: str) -> tuple[float | None, float | None, int]:
        return _stats(self.values(metric))

    def testset_values(self, column: str, metric: str) -> list[float]:
        """``metric`` of the counted runs' results in the test-set ``column`` (``<name>`` or ``<name>@<rule>``):
        those of that rule, and those of runs without an absolute table (``ape_rule`` null), which no rule
        changes."""
        return [value for _, value in self._testset_results(column, metric)]

    def testset_by_seed(self, column: str, metric: str) -> dict[Any, float]:
        """`testset_values` as the mean per seed (what a paired comparison pairs)."""
        seeds: dict[Any, list[float]] = {}
        for run, value in self._testset_results(column, metric):
            if math.isfinite(value):
                seeds.setdefault(run.facts["seed"], []).append(value)
        return {seed: statistics.fmean(v) for seed, v in seeds.items()}

    def _testset_results(self, column: str, metric: str) -> list[tuple[Run, float]]:
        name, _, rule = column.partition("@")  # a test set's name has no '@' (`collect.TESTSET_NAME`)
        results = []
        for run in self.runs:
            if run.status != "ok":
                continue
            for own_column, own in run.testsets.items():  # at most one matches: one file per rule
                key = f"{own_column}/{metric}"
                if own_column.partition("@")[0] == name and (own is None or own == rule) and key in run.metrics:
                    results.append((run, run.metrics[key]))
                    break
        return results

    def testset_stats(self, column: str, metric: str) -> tuple[float | None, float | None, int]:
        return _stats(self.testset_values(column, metric))

    def text(self, metric: str, digits: int = 2) -> str:
        mean, std, n = self.stats(metric)
        parts = []
        if mean is not None:
            parts.append(_mean_text(mean, std, n, digits))
        for status in STATUSES[1:]:
            k = self.count(status)
            if k:
                parts.append(status if not parts and k == len(self.runs) else f"{k} {status}")
        return ", ".join(parts) if parts else "–"

    def testset_problems(self, column: str) -> list[tuple[Run, str, str]]:
        """``(run, file, why)`` of the cell's counted runs whose result for ``column``'s test set is not counted."""
        return [(run, file, why) for run in self.runs if run.status == "ok" for file, why in run.testset_problems
                if file == TESTSETS or _concerns(_file_column(file), column)]

    def testset_text(self, column: str, metric: str, digits: int = 2) -> str:
        """The cell in a test-set column: ``mean ± std (n)`` over the seeds evaluated there, then ``k of N seeds
        evaluated`` when not all N counted seeds are, and ``m not counted`` for results that cannot be trusted
        (listed under the table); "–" when the cell counts no run (its own column says why), or its runs do not
        report ``metric`` (a detection run in a top-1 grid beside classification runs)."""
        counted = self.count("ok")
        if not counted or not any(metric in run.metrics for run in self.runs if run.status == "ok"):
            return "–"  # nothing counted, or runs that never report the metric (DETR's in a top-1 grid)
        mean, std, n = self.testset_stats(column, metric)
        parts = [] if mean is None else [_mean_text(mean, std, n, digits)]
        if n < counted:
            parts.append(f"{n} of {counted} seeds evaluated")
        rejected = len(self.testset_problems(column))
        if rejected:
            parts.append(f"{rejected} not counted")
        return ", ".join(parts)


def _stats(values: list[float]) -> tuple[float | None, float | None, int]:
    """Mean, standard deviation (None for one value) and count; ``(None, None, 0)`` for none."""
    if not values:
        return None, None, 0
    std = statistics.stdev(values) if len(values) > 1 else None
    return statistics.fmean(values), std, len(values)


def _mean_text(mean: float, std: float | None, n: int, digits: int) -> str:
    """``mean ± std (n=n)``, or the mean alone for one value (no std)."""
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f} (n={n})" if std is not None else "")


@dataclass
class Table:
    name: str
    ablation: str
    layout: Layout
    sweeps: list[str]
    rows: list[Any]
    cols: list[Any]
    cells: dict[tuple[Any, Any], Cell]
    scale: str
    testsets: list[str] = field(default_factory=list)  # the test-set columns (`testset_columns`)

    @property
    def paper(self) -> PaperTable | None:
        return PAPER.get(self.ablation)

    def row_label(self, row: Any) -> str:
        paper = self.paper
        return f"{row} (extra)" if paper is not None and str(row) in paper.extra_rows else str(row)

    def col_label(self, col: Any) -> str:
        paper = self.paper
        return f"{col} (extra)" if paper is not None and str(col) in paper.extra_cols else str(col)

    def same_design(self, row: Any, col: Any) -> list[Any]:
        """The other rows whose cell in column ``col`` has the design of cell (row, col): they cannot differ."""
        cell = self.cells.get((row, col))
        design = cell.design if cell is not None else None
        return [] if design is None else [
            r for r in self.rows if r != row and (r, col) in self.cells and self.cells[(r, col)].design == design]

    def cannot_differ(self) -> dict[Any, Any]:
        """Row -> the first earlier row that it cannot differ from: the same design in every column both have."""
        flagged: dict[Any, Any] = {}
        for i, row in enumerate(self.rows):
            for earlier in self.rows[:i]:
                shared = [c for c in self.cols if (row, c) in self.cells and (earlier, c) in self.cells]
                if shared and all(earlier in self.same_design(row, c) for c in shared):
                    flagged[row] = flagged.get(earlier, earlier)
                    break
        return flagged


def _natural(value: Any) -> list[Any]:
    """Sort key that puts "9 (...)" before "25 (...)"."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", str(value)) if t]


def _ordered(values: set[Any], order: tuple[Any, ...]) -> list[Any]:
    known = [v for v in order if v in values]
    return known + sorted((v for v in values if v not in order), key=_natural)


# The label of the data fingerprint in a row split by it (`split_by_config`)
DATA_KEY = "data.files"


def split_by_config(row: Any, runs: list[Run]) -> dict[Any, list[Run]]:
    """The runs of one cell, split into groups whose configs differ in the seed only.

    One group keeps the row label; several get ``row [key=value, ...]`` with the keys in which their
    configs differ, ``data.files=<fingerprint>`` where their results
    were trained on other data. A grid point that never ran (no config) joins the first group.
    """
    groups: dict[frozenset[tuple[str, str]], list[Run]] = {}
    # results on other data (`Run.data`: no generator names them, their files differ) are not one cell's
    by_data = len({run.data for run in runs if run.status == "ok"}) > 1

    def data_key(run: Run) -> str:
        return repr(run.data[:12] if run.data else "unrecorded")

    # a run not counted (unreadable, a duplicate, failed) stays beside the counted runs of its config: in their
    # group where its config's counted runs are on one data set, else in the group of its own data
    counted_data: dict[frozenset[tuple[str, str]], set[str]] = {}
    for run in runs:
        if run.identity is not None and run.status == "ok":
            counted_data.setdefault(frozenset(resolved_identity(run.identity).items()), set()).add(data_key(run))
    for run in runs:
        if run.identity is not None:
            key = resolved_identity(run.identity)
            if by_data:
                of_config = counted_data.get(frozenset(key.items()), set())
                own = data_key(run)
                key[DATA_KEY] = (own if run.status == "ok" or own in of_config or len(of_config) != 1
                                 else next(iter(of_config)))
            groups.setdefault(frozenset(key.items()), []).append(run)
    never_ran = [run for run in runs if run.identity is None]
    if len(groups) <= 1:
        return {row: runs}
    identities = [dict(key) for key in groups]
    differing = sorted({k for ident in identities for k in ident
                        if len({ident_.get(k, "<unset>") for ident_ in identities}) > 1})
    split: dict[Any, list[Run]] = {}
    for ident, members in zip(identities, groups.values(), strict=True):
        label = _keys_label(ident, [other for other in identities if other is not ident], differing)
        name = f"{row} [{label}]"
        if name in split or len(differing) > 3:  # a shortened label may not tell groups apart: never merge them
            digest = hashlib.sha1(repr(sorted(ident.items())).encode()).hexdigest()[:6]
            name = f"{row} [{label}, config {digest}]"
        split[name] = members
    first = next(iter(split))
    split[first] = split[first] + never_ran
    return split


def resolved_identity(ident: dict[str, str]) -> dict[str, str]:
    """A cell identity with each RPE field left null replaced by the value its preset gives: ``rpe.ratio=None``
    under preset ``rpe-1.9-...`` and ``rpe.ratio=1.9`` given on the command line train one design, and are one
    group of a row. A preset that cannot be read leaves the identity as it is."""
    import ast

    nulls = [key for key, text in ident.items() if key.startswith("rpe.") and key != "rpe.preset" and text == "None"]
    try:
        preset = ast.literal_eval(ident.get("rpe.preset", "None"))
    except (ValueError, SyntaxError):
        preset = None
    if not nulls or not isinstance(preset, str):
        return dict(ident)
    fields = lenient_rpe({"preset": preset})
    return {key: repr(fields[key[4:]]) if key in nulls and fields.get(key[4:]) is not None else text
            for key, text in ident.items()}


def _keys_label(ident: dict[str, str], others: list[dict[str, str]], differing: list[str]) -> str:
    """``key=value, ...`` of the (at most 3) keys of ``differing`` that best tell ``ident`` from ``others``."""
    shown = telling_keys(ident, others, differing)
    label = ", ".join(f"{k}={ident.get(k, '<unset>').strip(chr(39))}" for k in shown[:3])
    return label + (f", +{len(differing) - 3} keys" if len(differing) > 3 else "")


def sweep_row_keys(runs: list[Run]) -> dict[int, str]:
    """For the runs of one row of the generic `runs` layout, whose rows are the run's name and columns its
    encoding: the label of the keys other than the encoding's (``model.optimizer.lr=...``) that differ between
    their configs, by ``id(run)``. An optuna study varies them together with the encoding, so each config has a
    column of its own and no cell would otherwise name them."""
    identities = {id(run): run.identity for run in runs if run.identity is not None}
    keys = sorted({k for ident in identities.values() for k in ident if not k.startswith("rpe.")
                   and len({other.get(k, "<unset>") for other in identities.values()}) > 1})
    if not keys:
        return {}
    distinct = list({frozenset(ident.items()): ident for ident in identities.values()}.values())
    return {key: _keys_label(ident, [other for other in distinct if other != ident], keys)
            for key, ident in identities.items()}


def telling_keys(ident: dict[str, str], others: list[dict[str, str]], keys: list[str]) -> list[str]:
    """``keys`` ordered so that the first tell ``ident`` apart from ``others``: each next key the one that parts it
    from most of the others not yet parted from it (ties: by name), until none is left; then the rest, the key
    whose value fewest others share first. So a group differing from the rest in one key (``model.net.ape=sincos``)
    is labelled by that key, whatever keys other groups differ in."""
    def value(of: dict[str, str], key: str) -> str:
        return of.get(key, "<unset>")

    left, chosen = list(others), []
    rest = list(keys)
    while left and rest:
        key = max(rest, key=lambda k: (sum(value(o, k) != value(ident, k) for o in left), -rest.index(k)))
        if not any(value(o, key) != value(ident, key) for o in left):
            break
        chosen.append(key)
        rest.remove(key)
        left = [o for o in left if value(o, key) == value(ident, key)]
    rest.sort(key=lambda k: (-sum(value(o, k) != value(ident, k) for o in others), k))
    return chosen + rest


def _concerns(result: str, column: str) -> bool:
    """Whether a result file's ``<name>[@<rule>]`` belongs in ``column``: its test set, and its rule where both
    have one (a result without a rule stands in every rule's column; a plain column takes every rule's)."""
    name, _, rule = result.partition("@")  # a test set's name has no '@' (`collect.TESTSET_NAME`)
    column_name, _, column_rule = column.partition("@")
    return name == column_name and (not rule or not column_rule or rule == column_rule)


def _file_column(file: str) -> str:
    """``testsets/<name>[@<rule>].json`` -> ``<name>[@<rule>]``."""
    return file.removeprefix(f"{TESTSETS}/").removesuffix(".json")


def testset_columns(layout: Layout, runs: list[Run]) -> list[str]:
    """The test-set columns of a table: those ``layout.testsets`` names, in its order (a bare name gives one
    column per APE rule its results used, or the name alone where none has one), then every other column
    the counted runs have a result for (or a result not counted), so that none is hidden. A test set gets
    its plain column only where no result of it has a rule (module docstring)."""
    counted = [run for run in runs if run.status == "ok"]
    found = {column for run in counted for column, rule in run.testsets.items() if rule}
    # a result not counted shows in its own rule's column (named by its file), so that two rules never share one
    rejected = {_file_column(file) for run in counted for file, _ in run.testset_problems if file != TESTSETS}
    found |= {column for column in rejected if "@" in column and TESTSET_NAME.fullmatch(column.partition("@")[0])
              and APE_RULE.fullmatch(column.partition("@")[2])}
    # a test set without a rule anywhere gets its plain column
    plain = {column for run in counted for column, rule in run.testsets.items() if rule is None}
    plain |= {column.partition("@")[0] for column in rejected}
    found |= {name for name in plain if TESTSET_NAME.fullmatch(name)
              and not any(column.split("@", 1)[0] == name for column in found)}
    columns: list[str] = []
    for name in layout.testsets:
        variants = [name] if "@" in name else sorted(
            (column for column in found if column.split("@", 1)[0] == name), key=_natural) or [name]
        columns += [column for column in variants if column not in columns]
    return columns + [column for column in sorted(found, key=_natural) if column not in columns]


def _add_relative_metric(layout: Layout, cells: dict[tuple[Any, Any], Cell]) -> None:
    """Per run: ``metric`` over the mean ``metric`` of the reference row in the same column."""
    assert layout.relative is not None
    new, metric, reference_row = layout.relative
    for (_, col), cell in cells.items():
        reference = cells.get((reference_row, col))
        base = statistics.fmean(reference.values(metric)) if reference and reference.values(metric) else None
        for run in cell.runs:
            if base and metric in run.metrics:
                run.metrics[new] = run.metrics[metric] / base


def _checked_results(layout: Layout, runs: list[Run]) -> list[Run]:
    """The runs with ``ok`` kept only for a result in the table's metrics: a null (non-finite) or absent one
    is ``no result``, named, instead of a run that quietly drops out of its cell."""
    shown = [m for m in layout.metrics if layout.relative is None or m != layout.relative[0]]
    checked = []
    for run in runs:
        null = [m for m in shown if m in run.null_metrics]
        if run.status == "ok" and null:
            verb = "is" if len(null) == 1 else "are"
            error = f"{', '.join(null)} {verb} null or NaN in metrics.json (not a finite number)"
            run = dataclasses.replace(run, status="no result", metrics={}, error=error)
        elif run.status == "ok" and not any(m in run.metrics for m in shown):
            run = dataclasses.replace(run, status="no result", metrics={},
                                      error=f"metrics.json has no {' or '.join(shown)}")
        checked.append(run)
    return checked


def _without_duplicates(runs: list[Run]) -> list[Run]:
    """The runs with each (cell, seed) counted once: the same config run twice (``-m seed=0,0``, or two run
    dirs of one identity) is one seed, not two. The first ok run by path is counted; every other ok run of
    that cell and seed is ``duplicate``, naming it. Runs that are not ok keep their own status (none counts)."""
    groups: dict[tuple[frozenset[tuple[str, str]], str], list[int]] = {}
    for i, run in enumerate(runs):
        if run.identity is not None and run.status == "ok":
            groups.setdefault((frozenset(resolved_identity(run.identity).items()), repr(run.facts.get("seed"))),
                              []).append(i)
    result = list(runs)
    for members in groups.values():
        kept, *others = sorted(members, key=lambda i: runs[i].path)
        for i in others:
            result[i] = dataclasses.replace(runs[i], status="duplicate", metrics={},
                                            error=f"same config and seed as {runs[kept].path}, which is counted")
    return result


def _not_counted(runs: list[Run]) -> Table:
    """A table of the runs that no cell can hold, each listed by path with its status and reason."""
    cells = {(run.path, "status"): Cell([run]) for run in runs}
    rows = sorted({run.path for run in runs})
    return Table(NOT_COUNTED, NOT_COUNTED, NOT_COUNTED_LAYOUT, [], rows, ["status"], cells, "")


def build_tables(runs: list[Run]) -> list[Table]:
    """Group runs by (ablation, sweep) and lay each group out as its ablation's table; runs that no cell can
    hold (an unreadable config) go to a last table, `NOT_COUNTED`."""
    groups: dict[tuple[str, str], list[Run]] = {}
    unplaced = [run for run in runs if not run.facts]
    for run in runs:
        if not run.facts:
            continue
        ablation = run.ablation if run.ablation in LAYOUTS else "runs"
        groups.setdefault((ablation, run.sweep or ""), []).append(run)
    tables = []
    for (ablation, sweep), members in sorted(groups.items(), key=lambda kv: (list(LAYOUTS).index(kv[0][0]), kv[0][1])):
        layout = LAYOUTS[ablation]
        members = _without_duplicates(_checked_results(layout, members))
        by_position: dict[tuple[Any, Any], list[Run]] = {}
        swept: dict[int, str] = {}
        if ablation == "runs":  # among the runs of one row label: a row label names no key that tells them apart
            by_row: dict[Any, list[Run]] = {}
            for run in members:
                by_row.setdefault(layout.row(run.facts), []).append(run)
            for row_runs in by_row.values():
                swept.update(sweep_row_keys(row_runs))
        for run in members:
            row = layout.row(run.facts)
            row = f"{row} [{swept[id(run)]}]" if id(run) in swept else row
            by_position.setdefault((row, layout.col(run.facts)), []).append(run)
        cells: dict[tuple[Any, Any], Cell] = {}
        for (row, col), cell_runs in by_position.items():
            for label, group in split_by_config(row, cell_runs).items():
                cells[(label, col)] = Cell(group)
        if layout.relative is not None:
            _add_relative_metric(layout, cells)
        rows = _ordered({r for r, _ in cells}, layout.row_order)
        cols = _ordered({c for _, c in cells}, layout.col_order)
        scale = ", ".join(sorted({str(r.facts["model"]) for r in members}))
        tables.append(Table(sweep or ablation, ablation, layout, [sweep] if sweep else [], rows, cols, cells, scale,
                            testset_columns(layout, members)))
    if unplaced:
        tables.append(_not_counted(unplaced))
    return tables


