"""The tables as Markdown, LaTeX and CSV, and the findings in a README."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

from reports.cells import NOT_COUNTED, Table, _natural
from reports.collect import ENV_KEYS, STATUSES, TableError
from reports.findings import findings_markdown, markdown_cell, resolving_power, resolving_text, verdicts
from reports.layouts import ABLATION_SCALE, DEFAULT_SCALE

STATUS_COLUMNS = tuple(s.replace(" ", "_") for s in STATUSES)  # a count per status ("no result": no_result)
CSV_COLUMNS = ("table", "row", "col", "metric", "mean", "std", "n", *STATUS_COLUMNS, "paper", "used", "same_as",
               "runs", "errors")


USED_TEXT = ("`used`: the distinct buckets the pairs of the token grid reach (a row and a column table, as cross's and"
             " decomposed's: the entries of both that the grid's row and column offsets read; 0: no table of"
             " positions, e.g. RoPE; ?: the grid is"
             " not known from the config, e.g. DETR's padded batches); `≡ R`: the row's runs cannot differ from"
             " row R's, by construction (the same config but for an index that puts the grid's pairs into the same"
             " buckets).")
TESTSETS_TEXT = (
    "Test-set columns: the same runs' best checkpoints evaluated on another test set (`eval.py"
    " testset=<name> [ape=<rule>]`, read from each run's `testsets/<name>.json`), mean ± std (n) over the seeds"
    " evaluated there. `<name>@<rule>`: runs with an absolute position table, resized to the test set's grid by"
    " APE rule `<rule>` (`interpolate`, `extend`: each rule its own column, never pooled); runs without one have"
    " nothing to resize, so their one result stands in every rule's column. `<name>`: no run here has an"
    " absolute table. `k of N seeds evaluated`: only k of the cell's N counted seeds have that result, and the"
    " mean is over those k; `m not counted`: results that cannot be trusted, listed under the table.")
FINDINGS_TEXT = (
    "Each finding (`source`: its table or figure in Wu et al., ICCV 2021, or `benchmark hypothesis`: what"
    " reasoning predicts on a benchmark task) is a contrast of cells (e.g. contextual minus bias, or one"
    " cell's result on the right half minus another's) with a predicted sign, taken per seed over"
    " the seeds where every cell has a result (paired differences `d`). `ours`: their mean `m` over the `n` seeds"
    " and the 95 % confidence interval `m ± t(0.975, n-1) · s/√n` (`s`: the standard deviation of `d`); `exact p`:"
    " the two-sided p of the exact sign-flip test of `m = 0` (the share of the 2^n sign patterns of `d` whose mean"
    " is at least as far from 0), which the verdict reads; `t-test p`: the paired t test's, for comparison;"
    " `Holm p`: the exact p adjusted by Holm's step-down correction over every finding tested here (one family),"
    " significant at ≤ 0.05. Verdicts, checked in this order: `cannot"
    " differ` (the contrast is zero by construction: its sides are runs of one config up to relabelled buckets"
    " on the grid the runs use), `floor` (every run of one side within 1 point of chance, 100/classes),"
    " judged on the runs' own split even where the contrast reads a test set (a run that learned its task and"
    " is at chance on unseen positions is a result), `ceiling` (every run of both sides within 1 point of 100),"
    " then `holds` / `reversed` (Holm-significant,"
    " with the predicted sign / against it), else `not resolved` (so also with one seed). Floor, ceiling and"
    " cannot-differ findings get no test and are not in the family. `paper`: the same contrast of the paper's"
    " own numbers (ImageNet-1k, COCO), for its direction and size; ours is on other data and is never"
    " subtracted from it.")


# ----------------------------------------------------------------------------- writers
def _used_text(table: Table, row: Any, flagged: dict[Any, Any]) -> str:
    """The buckets the row's runs reach, and ``≡ R`` when the row cannot differ from an earlier row R. Where the
    row's columns reach different counts (runs of other encodings in one row), each count names its columns:
    ``2 (rpe-0.7-quant-bias-0-k); 4 (rpe-1.6-quant-ctx-0-k)``."""
    by_count: dict[str, list[str]] = {}
    for col in table.cols:
        if (row, col) in table.cells:
            by_count.setdefault(table.cells[(row, col)].used_buckets(), []).append(table.col_label(col))
    if len(by_count) > 1:
        used = "; ".join(f"{count} ({', '.join(cols)})" for count, cols in sorted(by_count.items(),
                                                                                key=lambda kv: _natural(kv[0])))
    else:
        used = next(iter(by_count), "")
    return f"{used} ≡ {flagged[row]}" if row in flagged else used


def _grid(table: Table, metric: str) -> list[list[str]]:
    """Header plus one line per row: the row label, the buckets used, then per column ours and the paper's.

    The paper's number stands beside ours, never subtracted from it: its dataset and scale are not ours.
    """
    paper = table.paper
    with_paper = {c for c in table.cols for r in table.rows if paper and paper.value(r, c, metric) is not None}
    flagged = table.cannot_differ()
    header = [table.layout.row_name, "used"]
    for col in table.cols:
        label = table.col_label(col)
        header.append(label)
        if col in with_paper:
            header.append("paper" if len(table.cols) == 1 else f"paper {label}")
        # each column's results on other test sets stand right after its own, so a row reads across
        header += [column if len(table.cols) == 1 else f"{column} ({label})" for column in table.testsets]
    lines = [header]
    for row in table.rows:
        line = [table.row_label(row), _used_text(table, row, flagged)]
        for col in table.cols:
            cell = table.cells.get((row, col))
            line.append(cell.text(metric) if cell is not None else "–")
            if col in with_paper:
                assert paper is not None
                line.append(paper.text_of(row, col, metric))
            line += [cell.testset_text(column, metric) if cell is not None else "–" for column in table.testsets]
        lines.append(line)
    return lines


def _metrics_present(table: Table) -> list[str]:
    present = [m for m in table.layout.metrics
               if any(cell.values(m) for cell in table.cells.values())
               or (table.paper and any(m in v for v in table.paper.values.values()))]
    return present or [table.layout.metrics[0]]


def to_markdown(tables: list[Table], family: list[Table] | None = None) -> str:
    """The tables, after the verdicts of the findings judged on ``family`` (default: these tables; the runs of
    every task, where the findings of all tasks form one Holm family) that read these tables."""
    out = io.StringIO()
    shown = {t.name for t in tables}
    results = [v for v in verdicts(tables if family is None else family) if v.table == "–" or v.table in shown]
    if any(v.table != "–" for v in results):
        out.write("## The findings, judged on these runs\n\n")
        out.write(FINDINGS_TEXT + "\n\n")
        out.write(findings_markdown(results) + "\n")
    for table in tables:
        if table.ablation == NOT_COUNTED:
            out.write(_not_counted_markdown(table))
            continue
        out.write(f"## {table.layout.title}: `{table.name}`\n\n")
        out.write(f"Models: {table.scale}. Cells: mean ± std (n) over seeds; failed, unfinished and missing"
                  " runs are counted in the cell. " + USED_TEXT + "\n")
        seeds = sorted({r.facts.get("seed") for cell in table.cells.values() for r in cell.runs}, key=_natural)
        single = " (one seed: cells have no std, and a finding drawn from this table stays not resolved)"
        out.write(f"Seeds: {', '.join(map(str, seeds))}{single if len(seeds) == 1 else ''}.\n")
        if table.paper is not None:
            scale = ABLATION_SCALE.get(table.ablation, DEFAULT_SCALE)
            out.write(f"Paper: {table.paper.text}; {scale}. Beside ours, never subtracted from them: the paper's"
                      " data, model and scale are not these runs' (the findings compare directions).\n")
        if table.layout.note:
            out.write(f"{table.layout.note}.\n")
        if table.testsets:
            out.write(TESTSETS_TEXT + "\n")
        for metric in _metrics_present(table):
            grid = _grid(table, metric)
            out.write(f"\n**{metric}**\n\n")
            out.write("| " + " | ".join(markdown_cell(c) for c in grid[0]) + " |\n|" + "---|" * len(grid[0]) + "\n")
            for line in grid[1:]:
                out.write("| " + " | ".join(markdown_cell(c) for c in line) + " |\n")
        metric = table.layout.metrics[0]
        powers = [(f"{metric}, the runs' own results", resolving_power(table, metric))]
        powers += [(f"{metric}, {column}", resolving_power(table, metric, column)) for column in table.testsets]
        lines = [resolving_text(power, where) for where, power in powers if power is not None and power.pairs]
        if lines:
            out.write("\n" + "\n".join(lines) + "\n")
        failures = [r for cell in table.cells.values() for r in cell.runs if r.status != "ok"]
        if failures:
            out.write("\nNot ok:\n\n")
            for run in failures:
                out.write(f"- {run.status}: `{run.path}`" + (f": {run.error}" if run.error else "") + "\n")
        misplaced = sorted((r.path, r.overrides_problem) for cell in table.cells.values() for r in cell.runs
                           if r.overrides_problem)
        if misplaced:  # counted or not as its status says; placed by its config, never by those overrides
            out.write("\nRuns whose `.hydra/overrides.yaml` cannot place them at their grid point (each is in the"
                      " cell of its own config):\n\n")
            out.write("".join(f"- `{path}`: {why}\n" for path, why in misplaced))
        mixed = mixed_environments(table)
        if mixed:
            named = ", ".join(key.removeprefix("env/") for key in ENV_KEYS)
            out.write(f"\nCells whose runs differ in what can change a result outside the config ({named}):\n\n"
                      + "".join(f"- {text}\n" for text in mixed))
        rejected = _testset_problems(table)
        if rejected:
            out.write("\nTest-set results not counted (the runs' own results are):\n\n")
            out.write("".join(f"- {text}\n" for text in rejected))
        out.write("\n")
    return out.getvalue()


def mixed_environments(table: Table) -> list[str]:
    """``<row / col>: env/threads 1, 2`` for each cell whose ok runs recorded different values of an env key
    (`collect.ENV_KEYS`; ``env/resumed_at``: resumed or not), or where some recorded it and others did not."""
    lines = []
    for (row, col), cell in table.cells.items():
        ok = [run for run in cell.runs if run.status == "ok"]
        for key in ENV_KEYS:
            if key == "env/resumed_at":
                seen = {"resumed" if run.env.get(key) else "one sitting" if key in run.env else "unknown"
                        for run in ok}
            else:
                seen = {str(run.env.get(key, "unknown")) for run in ok}
            if len(seen) > 1:
                lines.append(f"`{row} / {col}`: {key} {', '.join(sorted(seen))}")
    return lines


def _testset_problems(table: Table) -> list[str]:
    """``testsets/<name>.json of <run>: <why>`` for each test-set result of the table's runs not counted."""
    problems = sorted((run.path, file, why) for cell in table.cells.values() for run in cell.runs
                      for file, why in run.testset_problems)
    return [f"`{file}` of `{path}`: {why}" for path, file, why in problems]


def _not_counted_markdown(table: Table) -> str:
    lines = ["## Runs not counted", "", "No cell can hold these runs (their config cannot be read), so none of them"
             " is counted in a table; a sweep's grid file listed here is damaged, so its runs that never started"
             " cannot be listed:", ""]
    for row in table.rows:
        for run in table.cells[(row, "status")].runs:
            lines.append(f"- {run.status}: `{run.path}`" + (f": {run.error}" if run.error else ""))
    return "\n".join(lines) + "\n\n"


def _latex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"),
                 ("±", r"$\pm$"), ("–", "--"), ("≡", r"$\equiv$")):
        text = text.replace(a, b)
    return text


def to_latex(tables: list[Table]) -> str:
    out = io.StringIO()
    for table in (t for t in tables if t.ablation != NOT_COUNTED):  # no paper table: listed in .md and .csv
        for metric in _metrics_present(table):
            grid = _grid(table, metric)
            out.write(f"% {table.layout.title}: {table.name}, {metric} ({table.scale})\n")
            out.write("\\begin{tabular}{l" + "c" * (len(grid[0]) - 1) + "}\n\\toprule\n")
            out.write(" & ".join(_latex_escape(h) for h in grid[0]) + " \\\\\n\\midrule\n")
            for line in grid[1:]:
                out.write(" & ".join(_latex_escape(c) for c in line) + " \\\\\n")
            out.write("\\bottomrule\n\\end{tabular}\n\n")
    return out.getvalue()


def to_csv(tables: list[Table]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for table in tables:
        counted = table.ablation != NOT_COUNTED
        # a test set's lines follow the cell's own (metric ``<column>/<metric>``; `n`: the seeds evaluated there)
        entries: list[tuple[str, str | None]] = [(metric, None) for metric in table.layout.metrics]
        entries += [(metric, column) for column in table.testsets for metric in table.layout.metrics]
        for (row, col), cell in sorted(table.cells.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
            for metric, column in entries:
                mean, std, n = cell.stats(metric) if column is None else cell.testset_stats(column, metric)
                paper = table.paper.value(row, col, metric) if table.paper and column is None else None
                errors = ([e for r in cell.runs for e in (r.error, r.overrides_problem) if e] if column is None else
                          [f"{file} of {run.path}: {why}" for run, file, why in cell.testset_problems(column)])
                writer.writerow({
                    "table": table.name, "row": row, "col": col,
                    "metric": metric if column is None else f"{column}/{metric}",
                    "mean": "" if mean is None else f"{mean:.4f}", "std": "" if std is None else f"{std:.4f}",
                    "n": n, **{c: cell.count(s) for s, c in zip(STATUSES, STATUS_COLUMNS, strict=True)},
                    "paper": "" if paper is None else paper,
                    "used": cell.used_buckets() if counted else "",
                    "same_as": ";".join(map(str, table.same_design(row, col))),
                    "runs": ";".join(r.path for r in cell.runs),
                    "errors": ";".join(errors),
                })
    return out.getvalue()


def read_csv(path: str | Path) -> list[dict[str, Any]]:
    """Parse a table CSV written by this script back into typed records; a line that is not one of its records
    (fields missing, a number that is none, a field past the csv module's size limit) is a ValueError naming
    the line."""
    records = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        try:
            for line in reader:
                record: dict[str, Any] = dict(line)
                missing = [key for key, value in line.items() if value is None]
                if missing:
                    raise ValueError(f"line {reader.line_num} has no {missing[0]} field")
                try:
                    for key in ("mean", "std", "paper"):
                        record[key] = float(line[key]) if line[key] else None
                    for key in ("n",) + STATUS_COLUMNS:
                        record[key] = int(line[key])
                except ValueError as err:
                    raise ValueError(f"line {reader.line_num}: {err}") from None
                records.append(record)
        except csv.Error as err:  # the DictReader's count lags a row: the line being read is its reader's
            raise ValueError(f"line {reader.reader.line_num}: {err}") from None
    return records


README_BLOCK = "findings"  # the default block: <!-- findings:start --> ... <!-- findings:end -->


README_BLOCK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # what a marker's name may be: one plain word


def check_readme_block(block: str) -> None:
    """Refuse a block name (make_tables' ``--readme-block``) that makes no markers of its own: an empty one, or
    one with spaces or ``-->``, would match or break other comments of the README."""
    if not README_BLOCK_NAME.fullmatch(block):
        raise TableError(f"--readme-block={block!r} is not a marker name; valid: letters, digits, '_', '.' or '-',"
                         f" starting with a letter or digit (the README's markers are <!-- NAME:start --> and"
                         f" <!-- NAME:end -->; default: {README_BLOCK})")


def readme_markers(block: str = README_BLOCK) -> tuple[str, str]:
    check_readme_block(block)
    return f"<!-- {block}:start -->", f"<!-- {block}:end -->"


def with_findings(readme: str, findings: str, block: str = README_BLOCK) -> str:
    """``readme`` with the text between the markers of ``block`` replaced by ``findings``.

    The block is one Holm family, judged on the runs given: a finding it lists of a table that ``findings`` does
    not hold (its runs were not given) would be dropped from the README, so that is refused (a `TableError`
    naming how many and of which tables); a block emptied by hand is written anew."""
    start, end = readme_markers(block)
    if readme.count(start) != 1 or readme.count(end) != 1 or readme.index(start) > readme.index(end):
        raise TableError(f"the README needs one {start} line followed by one {end} line")
    head, rest = readme.split(start)
    built = set(listed_tables(findings))
    dropped = [table for table in listed_tables(rest.split(end, 1)[0]) if table not in built]
    if dropped:
        tables = sorted(set(dropped), key=_natural)
        raise TableError(
            f"its {start} block lists {_count(len(dropped), 'finding')} of {_count(len(tables), 'table')} not built"
            " from these runs"
            f" ({', '.join(tables)}), which this would drop; valid: give those tables' sweep dirs too (as DIRS or"
            " --family DIR ..., e.g. docs/ablations_mini_runs/*_mini docs/benchmark_runs/*_mini), or empty the"
            " block between its markers to write it anew")
    return f"{head}{start}\n{findings}{end}{rest.split(end, 1)[1]}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def listed_tables(findings: str) -> list[str]:
    """The table of each finding a findings block (`findings_markdown`) lists, one per line, e.g. ``where_mini``."""
    tables = []
    for line in findings.splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) > 2 and cells[2].startswith("`") and cells[2].endswith("`") and len(cells[2]) > 2:
            tables.append(cells[2].strip("`"))
    return tables


def write_outputs(tables: list[Table], out: Path, family: list[Table] | None = None) -> list[Path]:
    """Write ``out.md``, ``out.csv`` and ``out.tex`` atomically; returns the paths. ``family``: `to_markdown`."""
    from storage.files import atomic_write_bytes, check_plain_file

    outputs = [(out.with_name(out.name + suffix), text) for suffix, text in (
        (".md", to_markdown(tables, family)), (".csv", to_csv(tables)), (".tex", to_latex(tables)))]
    for path, _ in outputs:  # all three checked before the first is written: never a partial set of tables
        check_plain_file(path)
    for path, text in outputs:
        atomic_write_bytes(path, text.encode())
    return [path for path, _ in outputs]


