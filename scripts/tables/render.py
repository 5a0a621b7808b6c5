"""The tables as Markdown, LaTeX and CSV, and the findings in a README."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from scripts.tables.cells import NOT_COUNTED, Cell, Table, _natural
from scripts.tables.collect import STATUSES, TableError
from scripts.tables.findings import findings_markdown, verdicts
from scripts.tables.layouts import ABLATION_SCALE

STATUS_COLUMNS = tuple(s.replace(" ", "_") for s in STATUSES)  # a count per status ("no result": no_result)
CSV_COLUMNS = ("table", "row", "col", "metric", "mean", "std", "n", *STATUS_COLUMNS, "paper", "delta", "runs",
               "errors")


# ----------------------------------------------------------------------------- writers
def _delta_text(cell: Cell | None, paper: float | None, metric: str) -> str:
    mean = cell.stats(metric)[0] if cell is not None else None
    return "" if mean is None or paper is None else f"{mean - paper:+.2f}"


def _grid(table: Table, metric: str) -> list[list[str]]:
    """Header plus one line per row: the row label, then per column ours, the paper's and ours - paper."""
    layout, paper = table.layout, table.paper
    with_paper = {c for c in table.cols for r in table.rows if paper and paper.value(r, c, metric) is not None}
    header = [layout.row_name] + ([layout.extra[0]] if layout.extra else [])
    for col in table.cols:
        label = table.col_label(col)
        header.append(label)
        if col in with_paper:
            header += ["paper", "Δ"] if len(table.cols) == 1 else [f"paper {label}", f"Δ {label}"]
    lines = [header]
    for row in table.rows:
        line = [table.row_label(row)] + ([_row_extra(table, row)] if layout.extra else [])
        for col in table.cols:
            cell = table.cells.get((row, col))
            line.append(cell.text(metric) if cell is not None else "–")
            if col in with_paper:
                assert paper is not None
                line += [paper.text_of(row, col, metric), _delta_text(cell, paper.value(row, col, metric), metric)]
        lines.append(line)
    return lines


def _row_extra(table: Table, row: Any) -> str:
    assert table.layout.extra is not None
    values = {table.layout.extra[1](r.facts) for (r_key, _), cell in table.cells.items() if r_key == row
              for r in cell.runs}
    return ", ".join(sorted("?" if v is None else str(v) for v in values))


def _metrics_present(table: Table) -> list[str]:
    present = [m for m in table.layout.metrics
               if any(cell.values(m) for cell in table.cells.values())
               or (table.paper and any(m in v for v in table.paper.values.values()))]
    return present or [table.layout.metrics[0]]


def to_markdown(tables: list[Table]) -> str:
    out = io.StringIO()
    results = verdicts(tables)
    if results:
        out.write("## The paper's findings, judged on these runs\n\n")
        out.write("Each finding is a contrast of cells (e.g. contextual minus bias), taken per seed over the seeds"
                  " where every cell has a result; `t` = mean / standard error, and the verdict is `holds` or"
                  " `reversed` when |t| exceeds the two-sided 95 % t quantile, else `not resolved`. `paper`: the"
                  " same contrast of the paper's numbers.\n\n")
        out.write(findings_markdown(results) + "\n")
    for table in tables:
        if table.ablation == NOT_COUNTED:
            out.write(_not_counted_markdown(table))
            continue
        out.write(f"## {table.layout.title}: `{table.name}`\n\n")
        out.write(f"Models: {table.scale}. Cells: mean ± std (n) over seeds; failed, unfinished and missing"
                  " runs are counted in the cell. Δ = ours - paper.\n")
        seeds = sorted({r.facts.get("seed") for cell in table.cells.values() for r in cell.runs}, key=_natural)
        single = " (one seed: cells have no std, and a finding drawn from this table stays not resolved)"
        out.write(f"Seeds: {', '.join(map(str, seeds))}{single if len(seeds) == 1 else ''}.\n")
        if table.paper is not None:
            scale = ABLATION_SCALE.get(table.ablation, "top-1 on ImageNet-1k (DeiT-S)")
            out.write(f"Paper: {table.paper.text}; {scale}.\n")
        if table.layout.note:
            out.write(f"{table.layout.note}.\n")
        for metric in _metrics_present(table):
            grid = _grid(table, metric)
            out.write(f"\n**{metric}**\n\n")
            out.write("| " + " | ".join(grid[0]) + " |\n|" + "---|" * len(grid[0]) + "\n")
            for line in grid[1:]:
                out.write("| " + " | ".join(line) + " |\n")
        failures = [r for cell in table.cells.values() for r in cell.runs if r.status != "ok"]
        if failures:
            out.write("\nNot ok:\n\n")
            for run in failures:
                out.write(f"- {run.status}: `{run.path}`" + (f": {run.error}" if run.error else "") + "\n")
        out.write("\n")
    return out.getvalue()


def _not_counted_markdown(table: Table) -> str:
    lines = ["## Runs not counted", "", "No cell can hold these runs (their config cannot be read), so none of them"
             " is counted in a table:", ""]
    for row in table.rows:
        for run in table.cells[(row, "status")].runs:
            lines.append(f"- {run.status}: `{run.path}`" + (f": {run.error}" if run.error else ""))
    return "\n".join(lines) + "\n\n"


def _latex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"),
                 ("±", r"$\pm$"), ("–", "--"), ("Δ", r"$\Delta$")):
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
        for (row, col), cell in sorted(table.cells.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
            for metric in table.layout.metrics:
                mean, std, n = cell.stats(metric)
                paper = table.paper.value(row, col, metric) if table.paper else None
                writer.writerow({
                    "table": table.name, "row": row, "col": col, "metric": metric,
                    "mean": "" if mean is None else f"{mean:.4f}", "std": "" if std is None else f"{std:.4f}",
                    "n": n, **{c: cell.count(s) for s, c in zip(STATUSES, STATUS_COLUMNS, strict=True)},
                    "paper": "" if paper is None else paper,
                    "delta": "" if mean is None or paper is None else f"{mean - paper:.4f}",
                    "runs": ";".join(r.path for r in cell.runs),
                    "errors": ";".join(r.error for r in cell.runs if r.error),
                })
    return out.getvalue()


def read_csv(path: str | Path) -> list[dict[str, Any]]:
    """Parse a table CSV written by this script back into typed records."""
    records = []
    with open(path, newline="") as f:
        for line in csv.DictReader(f):
            record: dict[str, Any] = dict(line)
            for key in ("mean", "std", "paper", "delta"):
                record[key] = float(line[key]) if line[key] else None
            for key in ("n",) + STATUS_COLUMNS:
                record[key] = int(line[key])
            records.append(record)
    return records


README_MARKERS = ("<!-- findings:start -->", "<!-- findings:end -->")


def with_findings(readme: str, findings: str) -> str:
    """``readme`` with the text between its findings markers replaced by ``findings``."""
    start, end = README_MARKERS
    if readme.count(start) != 1 or readme.count(end) != 1 or readme.index(start) > readme.index(end):
        raise TableError(f"the README needs one {start} line followed by one {end} line")
    head, rest = readme.split(start)
    return f"{head}{start}\n{findings}{end}{rest.split(end, 1)[1]}"


def write_outputs(tables: list[Table], out: Path) -> list[Path]:
    """Write ``out.md``, ``out.csv`` and ``out.tex`` atomically; returns the paths."""
    from models.lifecycle.files import atomic_write_bytes

    written = []
    for suffix, text in ((".md", to_markdown(tables)), (".csv", to_csv(tables)), (".tex", to_latex(tables))):
        path = out.with_name(out.name + suffix)
        atomic_write_bytes(path, text.encode())
        written.append(path)
    return written


