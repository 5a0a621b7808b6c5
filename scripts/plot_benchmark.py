"""Plot a benchmark table: top-1 against test set, one line per encoding (matplotlib, Agg).

    python scripts/plot_benchmark.py docs/benchmark.csv --table shift_mini --out docs/plots/benchmark_shift.png

Reads the CSV that ``scripts/make_tables.py --out`` writes (never run dirs). The x axis is the table's own
validation split followed by its test-set columns, in the CSV's order; a line is a row (an encoding), its
points the mean over the seeds, its bars one standard deviation. A cell without a mean leaves a gap; a row
without any (a DETR run in a table of every run) is left out, and a note names it. Long x labels and row
labels are broken into lines that fit; the legend is below the axes. The dashed line is chance (100 /
classes, ``--chance``). The PNG's ``Description`` text holds ``series <sha256>`` of the drawn numbers
(`series_digest`), so a test can tell that a committed plot is the one its table's runs give.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
from pathlib import Path
from typing import NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import starting  # noqa: E402

starting.guard_imports(__name__)  # a temp dir among results, Ctrl-C during the imports: one line

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only: never open a window, work without a display

from matplotlib.figure import Figure  # noqa: E402

from reports.render import CSV_COLUMNS, read_csv  # noqa: E402
from storage.files import RunFileError, atomic_write_bytes, error_line, input_error_line  # noqa: E402

METRIC = "val/top1"
# A make_tables.py CSV is kilobytes (a line per table, row, column and metric); a larger file is not one
CSV_BYTES = 64 * 1024 * 1024
HEADER_BYTES = 64 * 1024


class PlotError(ValueError):
    """Bad input; the message is one line naming the bad value and the valid choices."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise PlotError(f"{message} (see --help)")


def check_header(path: Path, name: str) -> None:
    """Refuse a file whose first line is not the header of a make_tables.py CSV (e.g. its Markdown tables)."""
    try:
        with open(path, newline="") as f:
            first = f.readline(HEADER_BYTES)  # bounded: a file of one endless line is not read whole
    except UnicodeDecodeError:
        first = None
    fields = next(csv.reader([first]), []) if first is not None else []
    needed = CSV_COLUMNS[:CSV_COLUMNS.index("paper") + 1]  # what read_csv and series read
    if any(column not in fields for column in needed):
        seen = "is not text" if first is None else f"begins {first.strip()[:60]!r}"
        raise PlotError(f"{name!r} is not a make_tables.py CSV: it {seen}; expected the header line"
                        f" {','.join(CSV_COLUMNS)!r} (give the CSV that make_tables.py --out wrote)")


def series(records: list[dict], table: str) -> tuple[list[str], dict[str, list[tuple[float, float] | None]]]:
    """The test-set columns of ``table`` (its own split first, as ``own val``) and, per row, its
    ``(mean, std)`` on each (None where the cell has no mean)."""
    rows = [r for r in records if r["table"] == table and (r["metric"] == METRIC or r["metric"].endswith("/" + METRIC))]
    if not rows:
        tables = sorted({r["table"] for r in records})
        raise PlotError(f"--table {table!r} has no {METRIC} lines in the CSV; valid: {', '.join(tables) or 'none'}")
    columns: list[str] = []
    for r in rows:
        column = r["col"] if r["metric"] == METRIC else r["metric"].removesuffix("/" + METRIC)
        if column not in columns:
            columns.append(column)
    values: dict[str, list[tuple[float, float] | None]] = {}
    for r in rows:
        column = r["col"] if r["metric"] == METRIC else r["metric"].removesuffix("/" + METRIC)
        line = values.setdefault(r["row"], [None] * len(columns))
        if r["mean"] is not None:
            line[columns.index(column)] = (r["mean"], r["std"] or 0.0)
    return columns, values


def series_digest(columns: list[str], values: dict[str, list[tuple[float, float] | None]]) -> str:
    """sha256 of the drawn numbers (columns, rows, means and SDs rounded to 1e-6), order included."""
    import hashlib
    import json

    data = [columns, [[row, [None if p is None else [round(p[0], 6), round(p[1], 6)] for p in points]]
                      for row, points in values.items()]]
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()


def png_digest(path: Path) -> str | None:
    """The ``series`` digest a PNG written by this script carries; None where it has none."""
    from PIL import Image

    with Image.open(path) as image:
        text = str(image.info.get("Description", ""))
    return text.removeprefix("series ") if text.startswith("series ") else None


def drawable(values: dict[str, list[tuple[float, float] | None]]) -> tuple[dict[str, list[tuple[float, float] | None]],
                                                                         list[str]]:
    """``(rows with a mean in some column, the names of those without)``: a row without one (a DETR run on a
    top-1 axis) would be a legend entry with no point."""
    kept = {row: points for row, points in values.items() if any(p is not None for p in points)}
    return kept, [row for row in values if row not in kept]


LABEL_SIZE = "small"
LEGEND_PAD_EM = 5.0  # a legend column's marker, padding and spacing beside its label, in font heights


def plot(columns: list[str], values: dict[str, list[tuple[float, float] | None]], title: str,
         chance: float | None) -> Figure:
    """One line per row over ``columns``; x labels broken into lines that fit their column, the legend below
    the axes in as many columns as the figure's width holds (one label broken into lines where none fit)."""
    from matplotlib.font_manager import FontProperties

    from reports.figures import LABEL_BREAKS, text_width, wrap_to_width

    fig = Figure(figsize=(max(6.0, 2.2 + 1.6 * len(columns)), 6.0), layout="constrained")  # height: the legend's
    dpi, width_px = fig.dpi, fig.get_figwidth() * fig.dpi
    ax = fig.add_subplot()
    xs = list(range(len(columns)))
    column_px = 0.9 * (width_px - 1.0 * dpi) / max(len(columns), 1)  # the axes: the figure less the y axis's labels
    pad_px = LEGEND_PAD_EM * FontProperties(size=LABEL_SIZE).get_size_in_points() * dpi / 72
    widest = max((text_width(row, LABEL_SIZE, dpi) for row in values), default=0.0)
    ncols = max(1, min(len(values), int(0.95 * width_px // (widest + pad_px))))
    label_px = 0.95 * width_px / ncols - pad_px
    colors = matplotlib.colormaps["tab20"].colors
    ordered = sorted(values.items(), key=lambda kv: -(kv[1][-1] or (0.0, 0.0))[0])  # legend: best last column first
    labels = [wrap_to_width(row, label_px, LABEL_SIZE, dpi) for row, _ in ordered]
    legend_lines = sum(label.count("\n") + 1 for label in labels) / ncols
    fig.set_figheight(4.5 + 0.22 * legend_lines)  # the axes keep their height above a legend of many lines
    for i, ((_, points), label) in enumerate(zip(ordered, labels, strict=True)):
        ys = [p[0] if p else float("nan") for p in points]
        errs = [p[1] if p else 0.0 for p in points]
        ax.errorbar(xs, ys, yerr=errs, marker="osD^v<>"[i % 7], capsize=3, color=colors[i % 20], label=label,
                    linestyle=("-", "--", ":")[(i // 20) % 3])
    if chance is not None:
        ax.axhline(chance, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(xs, [wrap_to_width(c, column_px, LABEL_SIZE, dpi, LABEL_BREAKS) for c in columns],
                  fontsize=LABEL_SIZE)
    ax.set_ylabel("top-1 (%)")
    ax.set_ylim(0, 100)
    ax.set_title(wrap_to_width(title, 0.9 * width_px, "large", dpi))
    fig.legend(loc="outside lower center", ncols=ncols, fontsize=LABEL_SIZE)
    return fig


def _percent(text: str) -> float:
    """A top-1 in percent, the y axis's range: 0-100 (``nan`` or ``inf`` would draw no line)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 100.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a top-1 in percent; valid: a number from 0 to 100")
    return value


UNREADABLE_CSV = "a make_tables.py CSV this user may read (chmod u+r)"  # the remedy for a CSV it cannot read


def _records(path: Path, name: str) -> list[dict]:
    """The lines of the make_tables.py CSV at ``path`` (``name``: as the user gave it); a file this user may not
    read is a `PlotError` naming it, why, and what to give instead."""
    try:
        size = path.stat().st_size
        if size > CSV_BYTES:
            raise PlotError(f"{name!r} is {size} bytes, more than the {CSV_BYTES} of any make_tables.py CSV;"
                            " give the CSV that make_tables.py --out wrote")
        check_header(path, name)
        try:
            return read_csv(path)
        except (KeyError, ValueError, UnicodeDecodeError) as err:
            raise PlotError(f"{name!r} is not a make_tables.py CSV ({err})") from None
    except OSError as err:
        raise PlotError(input_error_line(err, UNREADABLE_CSV)) from None


def main(argv: list[str] | None = None) -> int:
    from lifecycle.signals import exit_when_interrupted

    with exit_when_interrupted("plot_benchmark.py", "the PNG is written whole or not at all: run it again"):
        return _plotted(argv)


def _plotted(argv: list[str] | None) -> int:
    parser = _Parser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="a table CSV of scripts/make_tables.py --out")
    parser.add_argument("--table", required=True, help="the table's name (the CSV's `table` column)")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--chance", type=_percent, default=None, help="draw chance at this top-1 (0-100)")
    parser.add_argument("--rows", nargs="+", default=None, help="only these rows (default: every row)")
    try:
        args = parser.parse_args(argv)
        path, out = Path(args.csv), Path(args.out)
        try:
            is_file = path.is_file()
        except OSError as err:  # a folder of its path this user may not look into
            raise PlotError(input_error_line(err, UNREADABLE_CSV)) from None
        if not is_file:
            raise PlotError(f"{args.csv!r} is not a file; give the CSV that make_tables.py --out wrote")
        if not out.parent.is_dir():
            raise PlotError(f"--out {args.out!r}: its folder does not exist")
        from storage.destinations import DestinationError, check_destination

        try:
            check_destination(out, "--out")  # never into a run dir or a data root
        except DestinationError as err:
            raise PlotError(str(err)) from None
        records = _records(path, args.csv)
        columns, values = series(records, args.table)
        if args.rows is not None:
            unknown = [row for row in args.rows if row not in values]
            if unknown:
                raise PlotError(f"--rows {unknown[0]!r} is not a row of {args.table}; valid: {', '.join(values)}")
            values = {row: values[row] for row in args.rows}
        values, left_out = drawable(values)
        if not values:
            raise PlotError(f"--table {args.table!r}: no row{' of --rows' if args.rows else ''} has a {METRIC}"
                            f" mean; nothing to plot (valid: a table with {METRIC} numbers)")
        buffer = io.BytesIO()
        plot(columns, values, args.table, args.chance).savefig(
            buffer, format="png", dpi=100, metadata={"Description": f"series {series_digest(columns, values)}"})
        atomic_write_bytes(out, buffer.getvalue())
    except (PlotError, RunFileError, OSError) as err:  # RunFileError, OSError: the PNG cannot be written
        print(f"error: {error_line(err)}", file=sys.stderr)
        return 2
    if left_out:
        print(f"note: left out of the plot, without a {METRIC} mean: {'; '.join(left_out)}", file=sys.stderr)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    starting.imported()
    sys.exit(main())
