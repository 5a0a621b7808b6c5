"""The paper's tables (one data entry each, ``scripts/paper_tables/<ablation>.yaml``) and how every ablation is
laid out as a table.

An entry holds all that make_tables knows of one table of the paper: where the paper has it (``paper``), its
title, how a run's facts name its row and column, the rows and columns in the paper's order (with the sweep's
name of each row where the sweep names its jobs by row), the paper's numbers and the paper's findings on it.
The layout (`Layout`), the paper's numbers (`PaperTable`) and the findings (``findings.FINDINGS``) are derived
from the entries; the sweeps (``configs/sweep/<ablation>*.yaml``) are checked against them by the tests.

The keys of an entry (file name: the ablation, as the sweeps' ``ablation`` key names it):

* ``paper``: where the paper has the table, as it reads inside a sentence (``Table 6``, ``Figure 3``,
  ``supplement``); absent for a table the paper does not have. The title, the paper's text, and the sources of
  the numbers and findings all start from it.
* ``title``, ``about`` (what the paper's table shows), ``scale`` (what ours are measured on; default
  `DEFAULT_SCALE`), ``dataset`` (of the paper's numbers, named in a registered finding's paper contrast;
  default ImageNet), ``note``, ``metrics`` (default ``[val/top1]``), ``relative`` (``{metric, of, row}``: a
  cell's ``of`` over that row's, as ``metric``).
* ``order``: ``{table: n, findings: m}``: where the table stands among the tables of make_tables' outputs, and
  where its findings stand among the paper's findings.
* ``row`` / ``col``: how a run's facts (`collect.run_facts`) name its row / column: ``{fact: key}`` (the fact's
  value, through ``labels`` where it has one, else ``other`` where given), ``{format: "text {key}"}``,
  ``{label: text}`` (one column) or ``{rule: name}`` (a rule of `RULES`); ``row`` also has ``name``, the header.
* ``rows`` / ``cols``: the labels in the paper's order; an item is a label or ``{label, sweep, extra}``: ``sweep``
  is the sweep's name of the row (its ``rows`` table; default the label), ``extra: true`` marks ours, not the
  paper's.
* ``numbered_rows``: the paper numbers its rows, so a source names them by number (``Table 6, row 6``).
* ``cells``: the paper's numbers, each ``{row, col, at, <metric>: value, <metric>_std: std, n: runs}``; ``col``
  may be left out in a table of one column, ``at`` (where in the paper's table) where the rows are numbered.
* ``findings``: the paper's claims as contrasts of cells, each ``{claim, plus, minus}`` (each side the mean of
  its cells) or ``{claim, terms: [[cell, weight], ...]}``, with ``sign`` (default 1), ``at`` (appended to the
  source) and ``paper_text`` (what the paper shows where its numbers give no contrast). A cell is ``[row, col]``,
  or a row in a table of one column.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reports.collect import TableError

PAPER_TABLES_DIR = Path(__file__).resolve().parents[1] / "scripts" / "paper_tables"
DEFAULT_SCALE = "top-1 on ImageNet-1k (DeiT-S)"
ENTRY_KEYS = {"paper", "title", "about", "scale", "dataset", "note", "metrics", "relative", "order", "row", "col",
              "rows", "cols", "numbered_rows", "cells", "findings"}
FINDING_KEYS = {"claim", "plus", "minus", "terms", "sign", "at", "paper_text"}


# ----------------------------------------------------------------------------- the paper's numbers
@dataclass(frozen=True)
class PaperTable:
    """The published numbers of one ablation (the ``cells`` of its entry)."""

    text: str
    values: dict[tuple[str, str], dict[str, float]]  # (row, col) -> {metric: value, metric_std: std, n: runs}
    sources: dict[tuple[str, str], str]
    extra_rows: tuple[str, ...] = ()
    extra_cols: tuple[str, ...] = ()

    def value(self, row: Any, col: Any, metric: str) -> float | None:
        return self.values.get((str(row), str(col)), {}).get(metric)

    def text_of(self, row: Any, col: Any, metric: str) -> str:
        cell = self.values.get((str(row), str(col)), {})
        if metric not in cell:
            return ""
        std = cell.get(f"{metric}_std")
        return f"{cell[metric]:g}" + (f" ± {std:g} (n={int(cell.get('n', 1))})" if std is not None else "")


# ----------------------------------------------------------------------------- rows and columns from facts
def _ratio(facts: dict[str, Any]) -> str:
    ratio = facts["ratio"]
    return f"ratio {ratio:g}" if isinstance(ratio, (int, float)) else f"ratio {ratio}"


def _direction(method: str) -> str:
    """Whether the encoding tells an offset from its opposite (``directed``), ``?`` for an unknown method."""
    from rpe import encoding

    try:
        return "directed" if encoding(method).directed else "undirected"
    except (KeyError, ValueError):
        return "?"


def _detr_row(facts: dict[str, Any]) -> str:
    """A row of the paper's DETR table: ``<APE>, <encoder RPE>, <schedule>``, e.g. ``sine, ctx clip 9x9, short``."""
    if facts["method"] == "none":
        rpe = "none"
    else:
        side = f"{facts['buckets'] ** 0.5:.0f}" if isinstance(facts["buckets"], int) else "?"
        clip = " clip" if facts["index"] == "clip" else ""
        rpe = f"{facts['mode']}{clip} {side}x{side}" + ("" if facts["on"] == "k" else f" on {facts['on']}")
    return f"{facts['ape']}, {rpe}, {facts['schedule'] or '?'}"


# The rows and columns that no single fact names: an entry's ``{rule: name}``.
RULES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "method": lambda f: f"{f['method']} ({_direction(f['method'])})",  # euclidean (undirected)
    "buckets": lambda f: f"{'?' if f['buckets'] is None else f['buckets']} ({_ratio(f)})",  # 49 (ratio 1.9)
    "detr": _detr_row,
    "swin": lambda f: f["method"] if f["method"] in ("none", "swin") else f["rpe"],  # Swin's own bias by name
    "row": lambda f: f["row"] or f["rpe"],  # the sweep's row name, or the encoding of a run outside a row sweep
}


def _labeller(spec: Any, where: str) -> Callable[[dict[str, Any]], Any]:
    """A run's row or column from its facts, as an entry's ``row`` or ``col`` says (module docstring)."""
    if not isinstance(spec, dict):
        raise TableError(f"{where}: is not a mapping")
    if "rule" in spec:
        if spec["rule"] not in RULES:
            raise TableError(f"{where}: rule {spec['rule']!r} is not one of {', '.join(RULES)}")
        return RULES[spec["rule"]]
    if "label" in spec:
        label = str(spec["label"])
        return lambda f: label
    if "format" in spec:
        text = str(spec["format"])
        return lambda f: text.format_map(f)
    if "fact" in spec:
        key, labels, other = str(spec["fact"]), dict(spec.get("labels") or {}), spec.get("other")
        if other is None:
            return lambda f: labels.get(f[key], f[key])
        return lambda f: labels.get(f[key], other)
    raise TableError(f"{where}: needs one of rule, label, format, fact")


# ----------------------------------------------------------------------------- layouts
@dataclass(frozen=True)
class Layout:
    """How one ablation is tabulated: ``row(facts)``, ``col(facts)``, the metrics of a cell and the test sets
    beside them."""

    title: str
    row_name: str
    row: Callable[[dict[str, Any]], Any]
    col: Callable[[dict[str, Any]], Any]
    metrics: tuple[str, ...] = ("val/top1",)
    row_order: tuple[Any, ...] = ()
    col_order: tuple[Any, ...] = ()
    note: str = ""
    relative: tuple[str, str, Any] | None = None  # (new metric, metric, row): a cell's mean over that row's mean
    # Test-set columns beside each column's own result (``eval.py testset=<name>``), in this order: a name
    # (``"relational_canvas48"``) shows one column per APE rule its results used, ``"<name>@<rule>"`` (e.g.
    # ``"relational_canvas48@extend"``) that rule's; each is shown even where no run has the result. The
    # runs' other test-set results follow, so that no result is hidden (`cells.testset_columns`).
    testsets: tuple[str, ...] = ()


# ----------------------------------------------------------------------------- the entries
@dataclass(frozen=True)
class Line:
    """A row or column of an entry: its label, the sweep's name of it, and whether the paper has it."""

    label: str
    sweep: str
    extra: bool = False


@dataclass(frozen=True)
class PaperFinding:
    """A finding of an entry, before `findings.Finding` is made of it."""

    claim: str
    contrast: tuple[tuple[str, str, float], ...]  # (row, col, weight)
    source: str
    sign: int = 1
    paper_text: str = ""


@dataclass(frozen=True)
class Entry:
    """One table of the paper (module docstring): its layout, its numbers and its findings."""

    ablation: str
    paper: str  # "" for a table the paper does not have
    layout: Layout
    numbers: PaperTable
    rows: tuple[Line, ...]
    cols: tuple[Line, ...]
    findings: tuple[PaperFinding, ...]
    scale: str
    dataset: str
    order: tuple[int, int]  # (place among the tables, place of its findings among the paper's)
    numbered_rows: bool = False
    cells: frozenset[tuple[str, str]] = field(default_factory=frozenset)

    @property
    def cited(self) -> str:
        """``paper`` as it starts a sentence or a source: ``Table 6``, ``Supplement``."""
        return _cited(self.paper)


def _cited(paper: str) -> str:
    return paper[:1].upper() + paper[1:]


def _lines(items: Any, where: str) -> tuple[Line, ...]:
    if not isinstance(items, list) or not items:
        raise TableError(f"{where}: needs a non-empty list")
    lines = []
    for item in items:
        if isinstance(item, dict):
            unknown = sorted(set(item) - {"label", "sweep", "extra"})
            if unknown or "label" not in item:
                raise TableError(f"{where}: {item!r} is not a label or {{label, sweep, extra}}")
            label = str(item["label"])
            lines.append(Line(label, str(item.get("sweep", label)), bool(item.get("extra", False))))
        else:
            lines.append(Line(str(item), str(item)))
    labels = [line.label for line in lines]
    if len(set(labels)) != len(labels):
        raise TableError(f"{where}: {next(x for x in labels if labels.count(x) > 1)!r} is given twice")
    return tuple(lines)


def _cell(ref: Any, cols: tuple[Line, ...], where: str) -> tuple[str, str]:
    """``(row, col)`` of a cell reference: ``[row, col]``, or a row in a table of one column."""
    if isinstance(ref, list) and len(ref) == 2:
        return str(ref[0]), str(ref[1])
    if isinstance(ref, (str, int, float)) and len(cols) == 1:
        return str(ref), cols[0].label
    raise TableError(f"{where}: cell {ref!r} is not [row, col] (or a row, in a table of one column)")


def _finding(item: Any, cols: tuple[Line, ...], cited: str, numbered: list[str] | None, where: str) -> PaperFinding:
    if not isinstance(item, dict) or not item.get("claim"):
        raise TableError(f"{where}: a finding needs a claim")
    where = f"{where}, finding {item['claim']!r}"
    unknown = sorted(set(item) - FINDING_KEYS)
    if unknown:
        raise TableError(f"{where}: unknown key {unknown[0]!r}; valid: {', '.join(sorted(FINDING_KEYS))}")
    if "terms" in item:
        try:
            contrast = tuple((*_cell(ref, cols, where), float(weight)) for ref, weight in item["terms"])
        except (TypeError, ValueError):
            raise TableError(f"{where}: terms must be [cell, weight] pairs") from None
    else:
        sides = [(item.get("plus"), 1.0), (item.get("minus"), -1.0)]
        if not all(isinstance(refs, list) and refs for refs, _ in sides):
            raise TableError(f"{where}: needs non-empty `plus` and `minus` lists (or `terms`)")
        contrast = tuple((*_cell(ref, cols, where), sign / len(refs)) for refs, sign in sides for ref in refs)
    parts = [cited] if cited else []
    if numbered is not None:  # the rows of the contrast by the paper's numbers, in the order of its terms
        rows = dict.fromkeys(row for row, _, _ in contrast)
        parts.append("rows " + ", ".join(str(numbered.index(row) + 1) for row in rows if row in numbered))
    if item.get("at"):
        parts.append(str(item["at"]))
    sign = item.get("sign", 1)
    if sign not in (1, -1):
        raise TableError(f"{where}: sign {sign!r} is not 1 or -1")
    return PaperFinding(str(item["claim"]), contrast, ", ".join(parts), int(sign), str(item.get("paper_text") or ""))


def load_entry(path: Path) -> Entry:
    """The entry of ``path`` (read as YAML data only); a malformed one is a `TableError` naming the file."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise TableError(f"{path}: cannot be read as YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise TableError(f"{path}: is not a mapping")
    unknown = sorted(set(data) - ENTRY_KEYS)
    if unknown:
        raise TableError(f"{path}: unknown key {unknown[0]!r}; valid: {', '.join(sorted(ENTRY_KEYS))}")
    missing = [key for key in ("title", "about", "order", "row", "col", "rows", "cols") if key not in data]
    if missing:
        raise TableError(f"{path}: needs {', '.join(missing)}")
    ablation, paper = path.stem, str(data.get("paper") or "")
    cited = _cited(paper)
    rows, cols = _lines(data["rows"], f"{path}: rows"), _lines(data["cols"], f"{path}: cols")
    cells = frozenset((r.label, c.label) for r in rows for c in cols)
    numbered = [line.label for line in rows] if data.get("numbered_rows") else None

    values: dict[tuple[str, str], dict[str, float]] = {}
    sources: dict[tuple[str, str], str] = {}
    for item in data.get("cells") or []:
        key = _cell([item.get("row"), item["col"]] if "col" in item else item.get("row"), cols, f"{path}: cells")
        if key in values:
            raise TableError(f"{path}: two entries for row {key[0]!r}, col {key[1]!r}")
        if key not in cells:
            raise TableError(f"{path}: the paper's number at row {key[0]!r}, col {key[1]!r} is in no cell of rows"
                             " x cols")
        values[key] = {k: float(v) for k, v in item.items() if k not in ("at", "row", "col")}
        at = f"row {numbered.index(key[0]) + 1}" if numbered is not None else str(item.get("at") or "")
        sources[key] = ", ".join(part for part in (cited, at) if part)
    numbers = PaperTable(f"{cited}: {data['about']}" if cited else str(data["about"]), values, sources,
                         tuple(r.label for r in rows if r.extra), tuple(c.label for c in cols if c.extra))

    row_spec, relative = data["row"], data.get("relative")
    layout = Layout(
        f"{data['title']} (paper {paper})" if paper else str(data["title"]),
        str(row_spec.get("name", "row")) if isinstance(row_spec, dict) else "row",
        _labeller(row_spec, f"{path}: row"), _labeller(data["col"], f"{path}: col"),
        metrics=tuple(map(str, data.get("metrics") or ("val/top1",))),
        row_order=tuple(r.label for r in rows), col_order=tuple(c.label for c in cols),
        note=str(data.get("note") or ""),
        relative=(str(relative["metric"]), str(relative["of"]), relative["row"]) if relative else None,
    )
    found = tuple(_finding(item, cols, cited, numbered, str(path)) for item in data.get("findings") or [])
    for finding in found:
        outside = [(r, c) for r, c, _ in finding.contrast if (r, c) not in cells]
        if outside:
            raise TableError(f"{path}: finding {finding.claim!r} reads {outside[0]}, no cell of rows x cols")
    order = data["order"]
    if not isinstance(order, dict) or not isinstance(order.get("table"), int):
        raise TableError(f"{path}: order needs {{table: n}} (and findings: m where the entry has findings)")
    return Entry(ablation, paper, layout, numbers, rows, cols, found, str(data.get("scale") or DEFAULT_SCALE),
                 str(data.get("dataset") or "ImageNet"), (order["table"], int(order.get("findings", 0))),
                 numbered is not None, cells)


def load_entries(directory: Path = PAPER_TABLES_DIR) -> dict[str, Entry]:
    """Every entry of ``directory``, ablation -> `Entry`, in the order of their tables."""
    entries = [load_entry(path) for path in sorted(directory.glob("*.yaml"))]
    places = [e.order[0] for e in entries]
    if len(set(places)) != len(places):
        raise TableError(f"{directory}: two tables have order {next(p for p in places if places.count(p) > 1)}")
    return {e.ablation: e for e in sorted(entries, key=lambda e: e.order[0])}


ENTRIES = load_entries()
PAPER: dict[str, PaperTable] = {name: entry.numbers for name, entry in ENTRIES.items()}

OWN_VAL = "own val"  # a benchmark table's column of the runs' own validation split


def run_label(facts: dict[str, Any]) -> str:
    """A single run's row: its ``name``, and where that name (a recipe's, or one given on the command line) does
    not end in the encoding it trains, that encoding too, so that no row is labelled with another encoding. A run
    whose RPE fields differ from its preset's (a sweeper's or the command line's ``rpe.method=quant`` on
    ``preset=irpe_k``) trains no preset: its row says it is changed from it, and its column (`collect._rpe_label`)
    names what it trains."""
    name, preset = str(facts.get("name")), str(facts.get("preset") or "none")
    preset_rpe = facts.get("preset_rpe")
    if preset_rpe is not None and facts.get("rpe") not in (None, preset_rpe):
        return f"{name} (changed from {preset})"
    return name if name == preset or name.endswith(f"_{preset}") else f"{name} (trains {preset})"


# The canvas tasks' test columns at a larger size: what an absolute table does there (the `ape` rule of each column)
RESIZE_RULES = " (an absolute table resized to the grid by interpolation, or rebuilt at the new positions: extend)"
# The paper's tables, then the benchmark tasks' (their findings are pre-registered in findings/<task>.yaml)
LAYOUTS: dict[str, Layout] = {name: entry.layout for name, entry in ENTRIES.items()} | {
    "shift": Layout(
        "Benchmark: position shift (trained in the left half, no APE but the reference rows)", "encoding",
        RULES["row"], lambda f: OWN_VAL,
        row_order=("none", "ape_learned", "ape_sincos", "cpvt"),
        testsets=("relational_left", "relational_right", "relational_everywhere"),
        note="Own val: the left-half validation split after the last epoch (no checkpoint is selected on it)."
             " relational_left: 2000 fresh left-half images; relational_right: the unseen right half;"
             " relational_everywhere: anywhere on the canvas. The undirected rows (euc_*, quant_*, alibi) give"
             " mirrored offsets the same bucket or bias, so only the canvas border can tell them one direction"
             " from its opposite: they sit low by construction, not for want of a learning budget",
    ),
    "canvas": Layout(
        "Benchmark: canvas extrapolation (distance in patches, trained at 32 px, no APE but the reference rows)",
        "encoding", RULES["row"], lambda f: OWN_VAL,
        row_order=("none", "ape_learned", "ape_sincos", "cpvt"),
        testsets=("relational_distance", "relational_distance_canvas48", "relational_distance_canvas64"),
        note="Own val: the 32 px validation split after the last epoch. relational_distance: 2000 fresh 32 px"
             " images; _canvas48 / _canvas64: the same objects and distance bins on 48 / 64 px canvases"
             + RESIZE_RULES,
    ),
    "canvas_direction": Layout(
        "Benchmark: canvas extrapolation, direction label (trained at 32 px, no APE but the reference rows, float32)",
        "encoding", RULES["row"], lambda f: OWN_VAL,
        row_order=("none", "ape_learned", "ape_sincos", "product_ctx", "rope_axial", "rope_mixed"),
        testsets=("relational_everywhere", "relational_canvas48", "relational_canvas64"),
        note="Own val: the 32 px validation split after the last epoch. relational_everywhere: 2000 fresh 32 px"
             " images; relational_canvas48 / _canvas64: the same 5-7 px objects on 48 / 64 px canvases"
             + RESIZE_RULES,
    ),
    "shift_swin": Layout(
        "Benchmark: position shift on a micro Swin (windows of 4x4 tokens; paper supplement's rows)", "RPE",
        RULES["row"], lambda f: OWN_VAL, row_order=("none", "swin", "irpe_k", "irpe_qkv"),
        testsets=("relational_left", "relational_right", "relational_everywhere"),
        note="The shift task's data and test sets (see its table) on swin_micro_patch4_window4_32: each encoding"
             " inside the windows; the patch merging makes the last stage one window",
    ),
    "shift_buckets": Layout(
        "Benchmark: bucket counts under shift (iRPE-K, trained in the left half, no APE, float32)",
        "index (buckets)", RULES["row"], lambda f: OWN_VAL,
        row_order=("buckets_9", "buckets_25", "buckets_49", "buckets_121"),
        testsets=("relational_left", "relational_right", "relational_everywhere"),
        note="The shift task's data and test sets (see its table). buckets_N: contextual product iRPE-K with N"
             " buckets, piecewise at ratio 0.5, 1.0, 1.9, 2.9 (buckets_49 is the shift task's product_ctx; the 8x8"
             " grid uses 81 of buckets_121's 121); per axis, offsets 4-7 share a bucket with nearer offsets at 9"
             " and 25 buckets, while 49 buckets give them one of their own and 121 give one to offsets 5-7",
    ),
    "longrange": Layout(
        "Benchmark: long range (16x16 tokens, distance in bins of 2 patches from 2 to 12, iRPE-K without APE)",
        "index (buckets)", RULES["row"], lambda f: OWN_VAL,
        row_order=("none", "clip_r2", "buckets_9", "buckets_25", "buckets_49", "buckets_81", "buckets_121"),
        testsets=("relational_longrange",),
        note="clip_r2: clip at ratio 2.0 (9x9 buckets); buckets_N: piecewise with N buckets (ratio 0.5, 1.0, 1.9,"
             " 2.0, 2.9), buckets_81 is clip_r2's piecewise counterpart. relational_longrange: 2000 fresh images"
             " of the training distribution",
    ),
    "detr_gpu": Layout(
        "Benchmark: Table 6 on a GPU (DETR on shapes COCO, a 16x16 or larger encoder grid, sine APE)", "encoder RPE",
        RULES["row"], lambda f: OWN_VAL, metrics=("val/AP", "val/AP50", "val/AP75"),
        row_order=("sine_none_short", "sine_ctx9_short", "sine_ctxclip9_short"),
        testsets=("shapes_coco_fresh",),
        note="Own val: the 1000 validation images, read once after the last epoch. shapes_coco_fresh: 1000 fresh"
             " images of the same distribution (another generator seed). ctx9: contextual product iRPE on K,"
             " piecewise at ratio 2.0 (9x9 buckets); ctxclip9: the same with the clip index",
    ),
    "runs": Layout(
        "Runs", "run", run_label, lambda f: f["rpe"], metrics=("val/top1", "val/AP"),
    ),
}
# What our numbers of a paper table are measured on, where not `DEFAULT_SCALE`
ABLATION_SCALE = {name: entry.scale for name, entry in ENTRIES.items() if entry.scale != DEFAULT_SCALE}
