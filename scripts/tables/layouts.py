"""The paper's numbers and how each ablation is laid out as a table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpe import encoding
from scripts.tables.collect import TableError

PAPER_FILE = Path(__file__).resolve().parents[1] / "paper_numbers.yaml"


# ----------------------------------------------------------------------------- the paper's numbers
@dataclass(frozen=True)
class PaperTable:
    """The published numbers of one ablation (a block of ``paper_numbers.yaml``)."""

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


def load_paper_numbers(path: Path = PAPER_FILE) -> dict[str, PaperTable]:
    """``paper_numbers.yaml`` as ``ablation -> PaperTable``."""
    import yaml

    tables = {}
    for ablation, block in (yaml.safe_load(path.read_text()) or {}).items():
        values: dict[tuple[str, str], dict[str, float]] = {}
        sources: dict[tuple[str, str], str] = {}
        for entry in block.get("cells") or []:
            key = (str(entry["row"]), str(entry["col"]))
            if key in values:
                raise TableError(f"{path}: {ablation} has two entries for row {key[0]!r}, col {key[1]!r}")
            values[key] = {k: float(v) for k, v in entry.items() if k not in ("source", "row", "col")}
            sources[key] = str(entry["source"])
        tables[ablation] = PaperTable(str(block.get("paper", "")), values, sources,
                                      tuple(map(str, block.get("extra_rows") or ())),
                                      tuple(map(str, block.get("extra_cols") or ())))
    return tables


PAPER = load_paper_numbers()


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


def _ratio(facts: dict[str, Any]) -> str:
    ratio = facts["ratio"]
    return f"ratio {ratio:g}" if isinstance(ratio, (int, float)) else f"ratio {ratio}"


def _ape_col(facts: dict[str, Any]) -> str:
    """Table 4's column: whether the model has an absolute encoding (learned, or sin-cos at mini scale)."""
    return "no APE" if facts["ape"] in (None, "none") else "with APE"


def _detr_row(facts: dict[str, Any]) -> str:
    """A row of the paper's Table 6: ``<APE>, <encoder RPE>, <schedule>``, e.g. ``sine, ctx clip 9x9, short``."""
    if facts["method"] == "none":
        rpe = "none"
    else:
        side = f"{facts['buckets'] ** 0.5:.0f}" if isinstance(facts["buckets"], int) else "?"
        clip = " clip" if facts["index"] == "clip" else ""
        rpe = f"{facts['mode']}{clip} {side}x{side}" + ("" if facts["on"] == "k" else f" on {facts['on']}")
    return f"{facts['ape']}, {rpe}, {facts['schedule'] or '?'}"


def _swin_row(facts: dict[str, Any]) -> str:
    return facts["method"] if facts["method"] in ("none", "swin") else facts["rpe"]


DIRECTED = {m: "directed" if encoding(m).directed else "undirected" for m in ("euclidean", "quant", "cross", "product")}
TOP1 = ("val/top1", "val/top5")
COCO = ("val/AP", "val/AP50", "val/AP75", "val/APs", "val/APm", "val/APl")
OWN_VAL = "own val"  # a benchmark table's column of the runs' own validation split
LAYOUTS: dict[str, Layout] = {
    "method_mode": Layout(
        "Method x mode (paper Table 1)", "method",
        lambda f: f"{f['method']} ({DIRECTED.get(f['method'], '?')})", lambda f: f["mode"],
        row_order=tuple(f"{m} ({d})" for m, d in DIRECTED.items()), col_order=("bias", "ctx"),
    ),
    "shared_head": Layout(
        "Shared vs per-head tables (paper Table 2)", "mode", lambda f: f["mode"],
        lambda f: "shared" if f["shared_head"] else "per head", row_order=("bias", "ctx"),
        col_order=("shared", "per head"),
    ),
    "index": Layout(
        "Index function (paper Table 3)", "index", lambda f: f["index"], lambda f: f["mode"], metrics=TOP1,
        row_order=("piecewise", "clip"), col_order=("bias", "ctx"),
    ),
    "buckets": Layout(
        "Number of buckets (paper Figure 3)", "buckets (ratio)",
        lambda f: f"{'?' if f['buckets'] is None else f['buckets']} ({_ratio(f)})",
        lambda f: "ours", metrics=TOP1,
        note="A small grid leaves the outer buckets of a large table unused (`used`), and two ratios can then split"
        " the offsets alike (`≡`): on an 8x8 grid ratios 1.9 and 2.0 both put offsets 0, 1, 2, 3, 4-7 of an axis"
        " into classes 0, 1, 2, 2, 3",
    ),
    "where": Layout(
        "Where: Q, K, V, with and without APE (paper Table 4)", "RPE on", lambda f: f["on"],
        _ape_col, metrics=TOP1, row_order=("none", "q", "k", "v", "qk", "kv", "qkv"),
        col_order=("with APE", "no APE"),
    ),
    "detr": Layout(
        "DETR: encoder RPE, absolute encoding and schedule (paper Table 6)", "APE, encoder RPE, schedule",
        _detr_row, lambda f: "ours", metrics=COCO,
        row_order=("sine, none, short", "none, none, short", "sine, bias 9x9, short", "none, ctx 9x9, short",
                   "sine, ctx clip 9x9, short", "sine, ctx 9x9, short", "sine, ctx 15x15, short",
                   "sine, none, long", "sine, ctx 9x9, long"),
    ),
    "swin": Layout(
        "Swin-T: no RPE, Swin's bias, contextual iRPE (paper supplement)", "RPE", _swin_row,
        lambda f: "ours", row_order=("none", "swin"),
    ),
    "cost": Layout(
        "Training cost, naive vs efficient", "RPE", lambda f: f["rpe"],
        lambda f: f"backend {f['backend']}",
        metrics=("cost/step_vs_none", "cost/step_ms", "cost/activation_mb", "cost/peak_mem_mb"),
        row_order=("none",), col_order=("backend naive", "backend auto"),
        note="step time in ms (median) and relative to the `none` row of the same backend; memory in MiB:"
        " activations saved for backward (CPU) or peak allocation (GPU)",
        relative=("cost/step_vs_none", "cost/step_ms", "none"),
    ),
    "compare": Layout(
        "Comparison with other encodings (paper Table 5)", "encoding", lambda f: f["row"] or f["rpe"],
        lambda f: "ours", row_order=("none", "cpvt", "shaw", "xl", "huang", "sasa", "irpe_k", "irpe_qk", "irpe_qkv"),
    ),
    "shift": Layout(
        "Benchmark: position shift (trained in the left half, no APE but the reference rows)", "encoding",
        lambda f: f["row"] or f["rpe"], lambda f: OWN_VAL,
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
        "encoding", lambda f: f["row"] or f["rpe"], lambda f: OWN_VAL,
        row_order=("none", "ape_learned", "ape_sincos", "cpvt"),
        testsets=("relational_distance", "relational_distance_canvas48", "relational_distance_canvas64"),
        note="Own val: the 32 px validation split after the last epoch. relational_distance: 2000 fresh 32 px"
             " images; _canvas48 / _canvas64: the same objects and distance bins on 48 / 64 px canvases (an"
             " absolute table resized to the grid by interpolation, or rebuilt at the new positions: extend)",
    ),
    "shift_swin": Layout(
        "Benchmark: position shift on a micro Swin (windows of 4x4 tokens; paper supplement's rows)", "RPE",
        lambda f: f["row"] or f["rpe"], lambda f: OWN_VAL, row_order=("none", "swin", "irpe_k", "irpe_qkv"),
        testsets=("relational_left", "relational_right", "relational_everywhere"),
        note="The shift task's data and test sets (see its table) on swin_micro_patch4_window4_32: each encoding"
             " inside the windows; the patch merging makes the last stage one window",
    ),
    "longrange": Layout(
        "Benchmark: long range (16x16 tokens, distance in bins of 2 patches from 2 to 12, iRPE-K without APE)",
        "index (buckets)", lambda f: f["row"] or f["rpe"], lambda f: OWN_VAL,
        row_order=("none", "clip_r2", "buckets_9", "buckets_25", "buckets_49", "buckets_81", "buckets_121"),
        testsets=("relational_longrange",),
        note="clip_r2: clip at ratio 2.0 (9x9 buckets); buckets_N: piecewise with N buckets (ratio 0.5, 1.0, 1.9,"
             " 2.0, 2.9), buckets_81 is clip_r2's piecewise counterpart. relational_longrange: 2000 fresh images"
             " of the training distribution",
    ),
    "runs": Layout(
        "Runs", "run", lambda f: f["name"], lambda f: f["rpe"], metrics=("val/top1", "val/AP"),
    ),
}
ABLATION_SCALE = {"detr": "AP on COCO val2017 (DETR-R50)", "swin": "top-1 on ImageNet-1k (Swin-T)",
                  "cost": "DeiT-S steps on a CPU"}

