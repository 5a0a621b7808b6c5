"""scripts/plot_benchmark.py: the lines it draws are the CSV's means, in the CSV's column order."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from reports.render import CSV_COLUMNS
from scripts import plot_benchmark


def _write_csv(path: Path, lines: list[tuple[str, str, str, float | None, float | None]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, restval="0")
        writer.writeheader()
        for row, col, metric, mean, std in lines:
            writer.writerow({"table": "shift_mini", "row": row, "col": col, "metric": metric,
                             "mean": "" if mean is None else mean, "std": "" if std is None else std,
                             "paper": "", "used": "", "same_as": "", "runs": "", "errors": ""})


LINES = [("ape_sincos", "own val", "val/top1", 99.5, 0.2), ("ape_sincos", "own val", "val/loss", 0.1, 0.0),
         ("ape_sincos", "own val", "relational_right@interpolate/val/top1", 25.0, 1.0),
         ("ape_sincos", "own val", "relational_right@extend/val/top1", 30.0, 2.0),
         ("huang", "own val", "val/top1", 98.0, 0.5),
         ("huang", "own val", "relational_right@interpolate/val/top1", 92.0, 3.0),
         ("huang", "own val", "relational_right@extend/val/top1", None, None)]


def test_series_are_the_csv_means_per_test_set(tmp_path: Path) -> None:
    _write_csv(tmp_path / "t.csv", LINES)
    columns, values = plot_benchmark.series(plot_benchmark.read_csv(tmp_path / "t.csv"), "shift_mini")
    assert columns == ["own val", "relational_right@interpolate", "relational_right@extend"]  # no val/loss
    assert values == {"ape_sincos": [(99.5, 0.2), (25.0, 1.0), (30.0, 2.0)], "huang": [(98.0, 0.5), (92.0, 3.0), None]}
    fig = plot_benchmark.plot(columns, values, "t", chance=12.5)
    drawn = {bars.get_label(): list(bars.lines[0].get_ydata()) for bars in fig.axes[0].containers}
    assert drawn["ape_sincos"] == [99.5, 25.0, 30.0] and drawn["huang"][:2] == [98.0, 92.0]


def test_the_cli_writes_a_png_and_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _write_csv(tmp_path / "t.csv", LINES)
    out = tmp_path / "p.png"
    assert plot_benchmark.main([str(tmp_path / "t.csv"), "--table", "shift_mini", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for argv, message in (
        (["--table", "canvas_mini"],
         "error: --table 'canvas_mini' has no val/top1 lines in the CSV; valid: shift_mini"),
        (["--table", "shift_mini", "--rows", "t5"],
         "error: --rows 't5' is not a row of shift_mini; valid: ape_sincos, huang"),
    ):
        assert plot_benchmark.main([str(tmp_path / "t.csv"), "--out", str(tmp_path / "q.png"), *argv]) == 2
        err = capsys.readouterr().err
        assert err.strip() == message and not (tmp_path / "q.png").exists()
    assert plot_benchmark.main([str(tmp_path / "none.csv"), "--table", "x", "--out", str(out)]) == 2
    assert "none.csv' is not a file" in capsys.readouterr().err


def test_out_inside_a_run_or_a_data_root_and_a_markdown_table_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from tests.test_destinations import _data_root, _finished_run

    _write_csv(tmp_path / "t.csv", LINES)
    run, data = _finished_run(tmp_path / "runs" / "r0"), _data_root(tmp_path / "data")
    for out, where in ((run / "pb.png", f"is inside the run dir {run}"),
                       (data / "pb.png", f"is inside the data root {data}")):
        assert plot_benchmark.main([str(tmp_path / "t.csv"), "--table", "shift_mini", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --out={str(out)!r} {where}") and err.count("\n") == 1, err
        assert not out.exists()
    markdown = tmp_path / "t.md"
    markdown.write_text("## shift_mini\n\n| row | own val |\n|---|---|\n| huang | 98.0 ± 0.5 |\n")
    out = tmp_path / "p.png"
    assert plot_benchmark.main([str(markdown), "--table", "shift_mini", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {str(markdown)!r} is not a make_tables.py CSV: it begins '## shift_mini'")
    assert "expected the header line 'table,row,col,metric,mean,std,n," in err and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize(("body", "argv", "message"), [
    # a record cut short (an editor's truncation) and a field past the csv module's limit were tracebacks; the line
    # named is the damaged one, not the header
    ("shift_mini,huang\n", [], "is not a make_tables.py CSV (line 2 has no col field)"),
    ('"' + "x" * 200_000 + '"\n', [], "is not a make_tables.py CSV (line 2: field larger than field limit"),
    ("", ["--chance", "inf"], "argument --chance: 'inf' is not a top-1 in percent; valid: a number from 0 to 100"),
    ("", ["--chance", "nan"], "argument --chance: 'nan' is not a top-1 in percent"),
])
def test_a_damaged_csv_or_a_chance_off_the_axis_is_one_line(body: str, argv: list[str], message: str,
                                                             tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _write_csv(tmp_path / "t.csv", LINES)
    with open(tmp_path / "t.csv", "a") as f:
        f.write(body)
    if body:  # the damaged line alone after the header
        header = (tmp_path / "t.csv").read_text().splitlines()[0]
        (tmp_path / "t.csv").write_text(f"{header}\n{body}")
    out = tmp_path / "p.png"
    assert plot_benchmark.main([str(tmp_path / "t.csv"), "--table", "shift_mini", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_a_csv_or_out_this_user_may_not_use_is_one_line_naming_it(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    """Probe 16, p38: a mode-000 CSV printed Python's ``[Errno 13] Permission denied: '...'``; now the file, the
    reason and what to give instead. A CSV in a folder this user may not look into names that folder, and an
    --out folder this user may not write to is one line too (it was a traceback: the write's RunFileError)."""
    from tests.helpers import file_modes_hold

    csv_path, closed, locked = tmp_path / "t.csv", tmp_path / "closed", tmp_path / "locked"
    _write_csv(csv_path, LINES)
    closed.mkdir()
    _write_csv(closed / "t.csv", LINES)
    locked.mkdir()
    cases = [
        (csv_path, tmp_path / "p.png",
         f"error: cannot use {csv_path}: permission denied (a file or folder of the path this user may not read);"
         " valid: a make_tables.py CSV this user may read (chmod u+r)"),
        (closed / "t.csv", tmp_path / "p.png",
         f"error: cannot use {closed}: permission denied (a folder this user may not look into); valid: a folder"
         " this user may read (chmod u+rx), or another"),
        (tmp_path / "plain.csv", locked / "p.png",
         f"error: cannot write {locked / 'p.png'}: permission denied (read-only storage, or a file or folder of the"
         " path this user may not use)"),
    ]
    _write_csv(tmp_path / "plain.csv", LINES)
    csv_path.chmod(0)
    closed.chmod(0)
    locked.chmod(0o555)
    try:
        with file_modes_hold():
            results = [(plot_benchmark.main([str(csv), "--table", "shift_mini", "--out", str(out)]),
                        capsys.readouterr()) for csv, out, _ in cases]
    finally:
        for path in (csv_path, closed, locked):
            path.chmod(0o700)
    for (code, captured), (_, out, expected) in zip(results, cases, strict=True):
        assert (code, captured.err, captured.out) == (2, expected + "\n", ""), captured.err
        assert not out.exists()


MIXED_COLUMNS = ["rpe-1.9-product-ctx-1-k", "rpe-1.9-rope_axial-ctx-1-k", "rpe-1.9-decomposed-ctx-1-k",
                 "rpe-2-product-ctx-1-qkv"]
MIXED_TESTSETS = ["relational_far_corner@interpolate", "relational_canvas48@extend", "shapes_coco_canvas256"]
LONG = ("deit_micro_irpe_k [data.batch_size=64, data.files=unrecorded, data.generator=<unset>, +17 keys,"
        " config {}]")
DETR = "detr_small_irpe_k [data.files=unrecorded, data.generator=None, data.generator.image_size=<unset>, +7 keys]"


def _mixed_lines(encodings: int, testsets: int) -> list[tuple[str, str, str, float | None, float | None]]:
    """A make_tables ``runs`` table: each row in its encoding's column, test-set columns, long config-diff row
    labels, and a DETR row without a top-1 (its cells have no mean)."""
    lines: list[tuple[str, str, str, float | None, float | None]] = []
    rows = [(LONG.format(f"{i:06x}"), MIXED_COLUMNS[i % encodings], 10.0 + i) for i in range(4)]
    rows += [("swin_micro_decomposed", MIXED_COLUMNS[2 % encodings], 40.0), (DETR, MIXED_COLUMNS[0], None)]
    for row, col, mean in rows:
        lines.append((row, col, "val/top1", mean, None if mean is None else 1.0))
        lines.extend((row, col, f"{testset}/val/top1", None if mean is None else mean / 2, None)
                     for testset in MIXED_TESTSETS[:testsets])
    return lines


def _overlapping(boxes: list[tuple[str, object]]) -> list[tuple[str, str]]:
    return [(a, b) for i, (a, box_a) in enumerate(boxes) for b, box_b in boxes[i + 1:] if box_a.overlaps(box_b)]


@pytest.mark.parametrize(("encodings", "testsets"), [(1, 0), (1, 3), (4, 3)])  # (1, 0): the narrowest figure
def test_a_mixed_runs_table_is_drawn_readable_without_rows_that_have_no_top1(
        encodings: int, testsets: int, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Probe 16, o77, p21: a make_tables ``runs`` table (encoding and test-set columns, long config-diff row
    labels, DETR rows) was drawn with x labels printed over each other, a legend wider than the figure and the
    DETR rows, which have no top-1, in the legend without a point. Now no two x labels overlap, every text lies
    within the figure, and the rows without a top-1 are left out with one note naming them."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    _write_csv(tmp_path / "t.csv", _mixed_lines(encodings, testsets))
    out = tmp_path / "p.png"
    assert plot_benchmark.main([str(tmp_path / "t.csv"), "--table", "shift_mini", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err == f"note: left out of the plot, without a val/top1 mean: {DETR}\n"
    assert captured.out == f"wrote {out}\n"

    columns, values = plot_benchmark.series(plot_benchmark.read_csv(tmp_path / "t.csv"), "shift_mini")
    assert len(columns) == encodings + testsets
    drawn, left_out = plot_benchmark.drawable(values)
    assert left_out == [DETR] and list(drawn) == [row for row in values if row != DETR]
    fig = plot_benchmark.plot(columns, drawn, "shift_mini", chance=25.0)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    ax = fig.axes[0]
    legend = fig.legends[0] if fig.legends else ax.get_legend()  # below the axes or beside them
    assert sorted(t.get_text().replace("\n", " ") for t in legend.get_texts()) == sorted(drawn)  # no DETR
    ticks = [(t.get_text(), t.get_window_extent(renderer)) for t in ax.get_xticklabels()]
    assert [text.replace("\n", "") for text, _ in ticks] == columns  # broken into lines, nothing dropped
    assert _overlapping(ticks) == []
    assert _overlapping([("legend", legend.get_window_extent(renderer)), ("axes", ax.get_window_extent(renderer)),
                         *ticks]) == []
    bounds = fig.bbox
    for text, box in [*ticks, ("legend", legend.get_window_extent(renderer)),
                      ("title", ax.title.get_window_extent(renderer))]:
        assert bounds.x0 <= box.x0 and box.x1 <= bounds.x1 and bounds.y0 <= box.y0 and box.y1 <= bounds.y1, text


def test_a_table_without_a_top1_mean_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Probe 16, o77: a table (or the --rows asked for) without any top-1 mean would be an empty plot."""
    _write_csv(tmp_path / "t.csv", [(DETR, "own val", "val/top1", None, None), *LINES])
    out = tmp_path / "p.png"
    assert plot_benchmark.main([str(tmp_path / "t.csv"), "--table", "shift_mini", "--out", str(out),
                                "--rows", DETR]) == 2
    assert capsys.readouterr().err == ("error: --table 'shift_mini': no row of --rows has a val/top1 mean; nothing to"
                                       " plot (valid: a table with val/top1 numbers)\n")
    assert not out.exists()
