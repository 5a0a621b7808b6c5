"""Collect sweep runs and write the paper's ablation tables, ours beside the paper's numbers.

    python scripts/make_tables.py runs/sweeps/where_mini                  # one sweep
    python scripts/make_tables.py runs/sweeps/*_mini --out docs/ablations_mini
    python scripts/make_tables.py runs/deit_small_irpe_k runs/some_run  # plain run dirs work too

Every directory holding a run's resolved ``config.yaml`` (or Hydra's ``.hydra/config.yaml``) below
the given paths is a run. Its status is ``ok`` (``metrics.json``), ``failed`` (``failed.json``,
written by train.py when the job raised), or ``unfinished`` (neither: still running, or killed).
A sweep dir's ``multirun.yaml`` gives the whole grid, so grid points without a run dir are listed
as ``missing``. No run is dropped: a cell shows ``mean ± std (n)`` over seeds and names the runs
that failed, are missing or unfinished.

The layout of each table (rows, columns, metric) follows the ablation named by the runs'
``ablation`` key (set by ``configs/sweep/*.yaml``); runs without it go to a plain ``runs`` table.
Reference numbers (rpe-spec section 7, DeiT-S / DETR-R50 at full scale) fill the ``paper`` column
where the spec has them. Writes ``OUT.md``, ``OUT.csv`` (one line per cell, machine-readable;
`read_csv` parses it back) and ``OUT.tex`` (one ``tabular`` per table), or prints the Markdown.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import math
import re
import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omegaconf import OmegaConf  # noqa: E402

from rpe import encoding  # noqa: E402
from rpe.config import FIELDS, PRESETS, RPEConfigError, parse_shorthand, resolve_rpe  # noqa: E402
from rpe.index import IndexSpec, bucket_ids, num_buckets  # noqa: E402

STATUSES = ("ok", "failed", "unfinished", "missing")
CSV_COLUMNS = ("table", "row", "col", "metric", "mean", "std", "n", "ok", "failed", "unfinished", "missing",
               "paper", "runs", "errors")


class TableError(ValueError):
    """Bad input to this script, reported in one line."""


# ----------------------------------------------------------------------------- runs
@dataclass
class Run:
    """One training run (or one grid point that never got a run dir)."""

    path: str
    status: str
    facts: dict[str, Any]
    metrics: dict[str, float] = field(default_factory=dict)
    error: str = ""
    ablation: str | None = None
    sweep: str | None = None


def _lenient_rpe(raw: dict[str, Any] | None) -> dict[str, Any]:
    """RPE fields of a run config; a value the library rejects (a failed run) is kept as written."""
    raw = dict(raw or {})
    try:
        return dataclasses.asdict(resolve_rpe(raw))
    except RPEConfigError:
        preset = str(raw.get("preset") or "none")
        try:
            base = PRESETS[preset] if preset in PRESETS else parse_shorthand(preset)
            fields = dataclasses.asdict(base)
        except RPEConfigError:
            fields = {name: None for name in FIELDS} | {"method": preset}
        fields.update({k: v for k, v in raw.items() if k in FIELDS and v is not None})
        return fields


def run_facts(cfg: dict[str, Any]) -> dict[str, Any]:
    """What the tables sort runs by: the RPE fields, bucket count, APE, seed and a short label."""
    rpe = _lenient_rpe(cfg.get("rpe"))
    enabled = rpe.get("method") not in (None, "none")
    model = cfg.get("model") or {}
    net = model.get("net") or {}
    facts: dict[str, Any] = {
        "rpe": _rpe_label(rpe) if enabled else "none",
        "method": rpe.get("method") or "none",
        "mode": rpe.get("mode"),
        "on": rpe.get("on") if enabled else "none",
        "shared_head": rpe.get("shared_head"),
        "ratio": rpe.get("ratio"),
        "index": rpe.get("index"),
        "backend": rpe.get("backend"),
        "buckets": _bucket_count(rpe) if enabled else 0,
        "used_buckets": _used_buckets(rpe, _grid_side(cfg)) if enabled else 0,
        "ape": net.get("ape", model.get("position_embedding")),
        "seed": cfg.get("seed"),
        "name": cfg.get("name") or "?",
        "model": net.get("name") or model.get("_target_", "?").rsplit(".", 1)[-1],
    }
    return facts


def _rpe_label(rpe: dict[str, Any]) -> str:
    try:
        return f"rpe-{float(rpe['ratio']):g}-{rpe['method']}-{rpe['mode']}-{int(bool(rpe['shared_head']))}-{rpe['on']}"
    except (TypeError, ValueError, KeyError):
        return str(rpe.get("method"))


def _bucket_count(rpe: dict[str, Any]) -> int | None:
    """Buckets of one table without the skip bucket (product 1.9: 49); None when undefined."""
    try:
        config = resolve_rpe({k: v for k, v in rpe.items() if k in FIELDS})
        return num_buckets(IndexSpec.tables_of(config)[0])
    except (RPEConfigError, ValueError, TypeError, IndexError):
        return None


def _grid_side(cfg: dict[str, Any]) -> int | None:
    """Side of a ViT's square token grid, image size / patch size (``..._patch16_224``); else None."""
    name = str(((cfg.get("model") or {}).get("net") or {}).get("name", ""))
    patch = re.search(r"patch(\d+)", name)
    img_size = (cfg.get("data") or {}).get("img_size")
    return int(img_size) // int(patch.group(1)) if patch and isinstance(img_size, int) else None


def _used_buckets(rpe: dict[str, Any], side: int | None) -> int | None:
    """Distinct buckets that the pairs of a ``side x side`` grid reach (class-token bucket not counted)."""
    if side is None:
        return None
    try:
        config = resolve_rpe({k: v for k, v in rpe.items() if k in FIELDS})
        spec = IndexSpec.tables_of(config)[0]
        return int(bucket_ids(spec, side, side, 0, "cpu").unique().numel())
    except (RPEConfigError, ValueError, TypeError, IndexError):
        return None


def _load_yaml(path: Path) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)  # type: ignore[return-value]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # half-written by a killed job: count the run as unfinished


def _shown(path: Path) -> str:
    """``path`` relative to the working dir when inside it (tables stay valid in another checkout)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def load_run(run_dir: Path) -> Run:
    """Read one run dir: status, metrics, error and the facts of its resolved config."""
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        config_path = run_dir / ".hydra" / "config.yaml"
    cfg = _load_yaml(config_path)
    failure = _read_json(run_dir / "failed.json") if (run_dir / "failed.json").is_file() else None
    metrics = _read_json(run_dir / "metrics.json") if (run_dir / "metrics.json").is_file() else None
    if failure is not None:
        status, error = "failed", str(failure.get("error", "failed"))
    elif metrics is not None:
        status, error = "ok", ""
    else:
        status, error = "unfinished", ""
    numbers = {k: float(v) for k, v in (metrics or {}).items() if isinstance(v, (int, float))}
    return Run(_shown(run_dir), status, run_facts(cfg), numbers if status == "ok" else {}, error,
               cfg.get("ablation"), cfg.get("sweep_name"))


def _raw_yaml(path: Path) -> Any:
    """YAML as written (OmegaConf would resolve the ``${...}`` inside override strings)."""
    import yaml

    return yaml.safe_load(path.read_text())


def _normalised(overrides: Iterable[str]) -> frozenset[str]:
    # a job's overrides.yaml escapes interpolations (``$\{...\}``), multirun.yaml does not
    return frozenset(str(o).replace("\\{", "{").replace("\\}", "}") for o in overrides)


def _job_overrides(run_dir: Path) -> frozenset[str] | None:
    path = run_dir / ".hydra" / "overrides.yaml"
    return _normalised(_raw_yaml(path) or []) if path.is_file() else None


def expected_jobs(sweep_dir: Path) -> list[list[str]]:
    """The override lists of every job of the multirun saved in ``sweep_dir/multirun.yaml``.

    Expands ``hydra.sweeper.params`` plus the command-line overrides the way Hydra's basic sweeper
    does; other sweepers (optuna) have no fixed grid, so nothing is expected of them.
    """
    hydra = (_raw_yaml(sweep_dir / "multirun.yaml") or {}).get("hydra") or {}
    sweeper = hydra.get("sweeper") or {}
    if not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return []
    params = sweeper.get("params") or {}
    return sweep_grid([f"{k}={v}" for k, v in params.items()] + list((hydra.get("overrides") or {}).get("task") or []))


def sweep_grid(arguments: list[str]) -> list[list[str]]:
    """The jobs Hydra's basic sweeper launches for ``arguments`` (``key=a,b`` sweeps), in its order.

    Hydra's own expansion, so the grid can never drift from what ``-m`` runs. It is private Hydra API
    (stable within the hydra-core 1.3 pin of pyproject.toml); this is the one place that calls it.
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(arguments)
    return [list(job) for batch in BasicSweeper.split_arguments(parsed, max_batch_size=None) for job in batch]


def _missing_run(sweep_dir: Path, overrides: list[str]) -> Run:
    """A grid point with no run dir; its facts come from composing the job's config."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = Path(__file__).resolve().parents[1] / "configs"
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(config_dir), version_base="1.3"):
            cfg = compose("train", overrides=[o for o in overrides if not o.startswith("hydra")])
        container = OmegaConf.to_container(cfg, resolve=False)
    except Exception:  # a grid point that does not even compose: still listed, with what is known
        container = {}
    finally:
        GlobalHydra.instance().clear()
    run = Run(f"{_shown(sweep_dir)}/[{','.join(overrides)}]", "missing", run_facts(container), {},
              "no run dir", container.get("ablation"), container.get("sweep_name"))
    return run


def collect(paths: Iterable[str | Path]) -> list[Run]:
    """Every run under ``paths`` plus a ``missing`` entry per grid point of a sweep with no run dir."""
    runs: list[Run] = []
    seen: set[Path] = set()
    for root in map(Path, paths):
        if not root.exists():
            raise TableError(f"{str(root)!r} does not exist; give run dirs or sweep dirs (runs/sweeps/<name>)")
        candidates = {p.parent for p in root.rglob("config.yaml") if p.parent.name != ".hydra"}
        candidates |= {p.parent.parent for p in root.rglob(".hydra/config.yaml")}
        run_dirs = sorted(d for d in candidates if d not in seen and "checkpoints" not in d.parts)
        seen.update(run_dirs)
        runs += [load_run(d) for d in run_dirs]
        for multirun in sorted(root.rglob("multirun.yaml")):
            sweep_dir = multirun.parent
            done = {_job_overrides(d) for d in run_dirs if d.is_relative_to(sweep_dir)}
            for job in expected_jobs(sweep_dir):
                if _normalised(job) not in done:
                    runs.append(_missing_run(sweep_dir, job))
    if not runs:
        raise TableError(f"no runs (no config.yaml) under: {', '.join(map(str, paths))}")
    return runs


# ----------------------------------------------------------------------------- layouts
@dataclass(frozen=True)
class Layout:
    """How one ablation is tabulated: ``row(facts)``, ``col(facts)`` and the metrics of a cell."""

    title: str
    row_name: str
    row: Callable[[dict[str, Any]], Any]
    col: Callable[[dict[str, Any]], Any]
    metrics: tuple[str, ...] = ("val/top1",)
    row_order: tuple[Any, ...] = ()
    col_order: tuple[Any, ...] = ()
    paper: dict[tuple[Any, Any], float] = field(default_factory=dict)  # (row, col) -> paper's main metric
    note: str = ""
    extra: tuple[str, Callable[[dict[str, Any]], Any]] | None = None  # (header, fact of a row) shown per row


def _ratio(facts: dict[str, Any]) -> str:
    ratio = facts["ratio"]
    return f"ratio {ratio:g}" if isinstance(ratio, (int, float)) else f"ratio {ratio}"


DIRECTED = {m: "directed" if encoding(m).directed else "undirected" for m in ("euclidean", "quant", "cross", "product")}
PAPER_DEIT = "paper: DeiT-S on ImageNet-1k top-1 (rpe-spec section 7)"
LAYOUTS: dict[str, Layout] = {
    "method_mode": Layout(
        "Method x mode (rpe-spec 8.1)", "method",
        lambda f: f"{f['method']} ({DIRECTED.get(f['method'], '?')})", lambda f: f["mode"],
        row_order=tuple(f"{m} ({d})" for m, d in DIRECTED.items()), col_order=("bias", "ctx"),
        paper={("product (directed)", "ctx"): 80.9}, note=PAPER_DEIT,
    ),
    "shared_head": Layout(
        "Shared vs per-head tables (rpe-spec 8.2)", "mode", lambda f: f["mode"],
        lambda f: "shared" if f["shared_head"] else "per head",
        row_order=("bias", "ctx"), col_order=("shared", "per head"), paper={("ctx", "shared"): 80.9},
        note=PAPER_DEIT,
    ),
    "index": Layout(
        "Index function (rpe-spec 8.3)", "index", lambda f: f["index"], lambda f: f"{f['buckets']} buckets",
        row_order=("piecewise", "clip"), paper={("piecewise", "49 buckets"): 80.9}, note=PAPER_DEIT,
    ),
    "buckets": Layout(
        "Number of buckets (rpe-spec 8.4)", "buckets (ratio)",
        lambda f: f"{'?' if f['buckets'] is None else f['buckets']} ({_ratio(f)})",
        lambda f: "ours", metrics=("val/top1", "val/top5"), paper={("49 (ratio 1.9)", "ours"): 80.9},
        note=PAPER_DEIT + ". `used` = distinct buckets the token grid's pairs reach (a small grid leaves"
        " the outer buckets of a large table unused, and two ratios can then split the offsets alike)",
        extra=("used", lambda f: f["used_buckets"]),
    ),
    "where": Layout(
        "Where: Q, K, V, with and without APE (rpe-spec 8.5)", "RPE on", lambda f: f["on"],
        lambda f: f"APE {f['ape']}", row_order=("none", "q", "k", "v", "qk", "kv", "qkv"),
        col_order=("APE learned", "APE none"),
        paper={("none", "APE learned"): 79.9, ("k", "APE learned"): 80.9, ("qk", "APE learned"): 81.0,
               ("qkv", "APE learned"): 81.2},
        note=PAPER_DEIT,
    ),
    "detr_ape": Layout(
        "DETR: encoder RPE with and without the absolute encoding (rpe-spec 8.6)", "encoder RPE",
        lambda f: f["rpe"], lambda f: f"APE {f['ape']}", metrics=("val/AP", "val/AP50", "val/AP75"),
        row_order=("none", "rpe-1.9-product-ctx-1-k"), col_order=("APE sine", "APE none"),
        paper={("none", "APE sine"): 39.5, ("rpe-1.9-product-ctx-1-k", "APE sine"): 40.9},
        note="paper: DETR-R50, COCO val2017 AP, 150 epochs (rpe-spec section 7)",
    ),
    "cost": Layout(
        "Training cost, naive vs efficient (rpe-spec 8.7)", "RPE", lambda f: f["rpe"],
        lambda f: f"backend {f['backend']}", metrics=("cost/step_ms", "cost/activation_mb", "cost/peak_mem_mb"),
        col_order=("backend naive", "backend auto"),
        note="step time in ms (median); memory in MiB: activations saved for backward (CPU) or peak"
        " allocation (GPU). The reference code trains DeiT-S 1.13x (K) and 2.51x (QKV) slower than plain"
        " DeiT-S on a CPU (rpe-spec section 5)",
    ),
    "compare": Layout(
        "Comparison with other encodings (paper Table 5)", "encoding",
        lambda f: "CPVT (PEG)" if f["ape"] == "peg" else f["rpe"], lambda f: "top-1",
        paper={("none", "top-1"): 79.9, ("CPVT (PEG)", "top-1"): 80.5, ("rpe-1.9-product-ctx-1-kv", "top-1"): 80.9,
               ("rpe-1.9-xl-ctx-0-k", "top-1"): 80.8, ("rpe-1.9-huang-ctx-1-qk", "top-1"): 81.0,
               ("rpe-6.5-sasa-ctx-1-k", "top-1"): 80.8, ("rpe-1.9-product-ctx-1-k", "top-1"): 80.9,
               ("rpe-1.9-product-ctx-1-qk", "top-1"): 81.1, ("rpe-1.9-product-ctx-1-qkv", "top-1"): 81.4},
        note=PAPER_DEIT,
    ),
    "runs": Layout(
        "Runs", "run", lambda f: f["name"], lambda f: f["rpe"], metrics=("val/top1", "val/AP"),
    ),
}


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

    def stats(self, metric: str) -> tuple[float | None, float | None, int]:
        values = self.values(metric)
        if not values:
            return None, None, 0
        std = statistics.stdev(values) if len(values) > 1 else None
        return statistics.fmean(values), std, len(values)

    def text(self, metric: str, digits: int = 2) -> str:
        mean, std, n = self.stats(metric)
        parts = []
        if mean is not None:
            parts.append(f"{mean:.{digits}f}" + (f" ± {std:.{digits}f} (n={n})" if std is not None else ""))
        for status in ("failed", "unfinished", "missing"):
            k = self.count(status)
            if k:
                parts.append(status if not parts and k == len(self.runs) else f"{k} {status}")
        return ", ".join(parts) if parts else "–"


@dataclass
class Table:
    name: str
    layout: Layout
    sweeps: list[str]
    rows: list[Any]
    cols: list[Any]
    cells: dict[tuple[Any, Any], Cell]
    scale: str


def _natural(value: Any) -> list[Any]:
    """Sort key that puts "9 (...)" before "25 (...)"."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", str(value)) if t]


def _ordered(values: set[Any], order: tuple[Any, ...]) -> list[Any]:
    known = [v for v in order if v in values]
    return known + sorted((v for v in values if v not in order), key=_natural)


def build_tables(runs: list[Run]) -> list[Table]:
    """Group runs by (ablation, sweep) and lay each group out as its ablation's table."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        ablation = run.ablation if run.ablation in LAYOUTS else "runs"
        groups.setdefault((ablation, run.sweep or ""), []).append(run)
    tables = []
    for (ablation, sweep), members in sorted(groups.items(), key=lambda kv: (list(LAYOUTS).index(kv[0][0]), kv[0][1])):
        layout = LAYOUTS[ablation]
        cells: dict[tuple[Any, Any], Cell] = {}
        for run in members:
            cells.setdefault((layout.row(run.facts), layout.col(run.facts)), Cell()).runs.append(run)
        rows = _ordered({r for r, _ in cells}, layout.row_order)
        cols = _ordered({c for _, c in cells}, layout.col_order)
        scale = ", ".join(sorted({str(r.facts["model"]) for r in members}))
        tables.append(Table(sweep or ablation, layout, [sweep] if sweep else [], rows, cols, cells, scale))
    return tables


# ----------------------------------------------------------------------------- writers
def _paper_text(layout: Layout, row: Any, col: Any) -> str:
    value = layout.paper.get((row, col))
    return "" if value is None else f"{value:g}"


def _grid(table: Table, metric: str) -> list[list[str]]:
    """Header plus one line per row: row label, a cell per column, then the paper's numbers."""
    layout = table.layout
    has_paper = bool(layout.paper) and metric == layout.metrics[0]
    header = [layout.row_name] + ([layout.extra[0]] if layout.extra else []) + [str(c) for c in table.cols]
    if has_paper:
        header += ["paper" if len(table.cols) == 1 else f"paper {c}" for c in table.cols
                   if any((r, c) in layout.paper for r in table.rows)]
    lines = [header]
    for row in table.rows:
        line = [str(row)] + ([_row_extra(table, row)] if layout.extra else [])
        line += [table.cells[(row, col)].text(metric) if (row, col) in table.cells else "–" for col in table.cols]
        if has_paper:
            line += [_paper_text(layout, row, c) for c in table.cols
                     if any((r, c) in layout.paper for r in table.rows)]
        lines.append(line)
    return lines


def _row_extra(table: Table, row: Any) -> str:
    assert table.layout.extra is not None
    values = {table.layout.extra[1](r.facts) for (r_key, _), cell in table.cells.items() if r_key == row
              for r in cell.runs}
    return ", ".join(sorted("?" if v is None else str(v) for v in values))


def _metrics_present(table: Table) -> list[str]:
    present = [m for m in table.layout.metrics
               if any(cell.values(m) for cell in table.cells.values())]
    return present or [table.layout.metrics[0]]


def to_markdown(tables: list[Table]) -> str:
    out = io.StringIO()
    for table in tables:
        out.write(f"## {table.layout.title}: `{table.name}`\n\n")
        out.write(f"Models: {table.scale}. Cells: mean ± std (n) over seeds; failed, unfinished and missing"
                  " runs are counted in the cell.\n")
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


def _latex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"),
                 ("±", r"$\pm$"), ("–", "--")):
        text = text.replace(a, b)
    return text


def to_latex(tables: list[Table]) -> str:
    out = io.StringIO()
    for table in tables:
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
                paper = table.layout.paper.get((row, col)) if metric == table.layout.metrics[0] else None
                writer.writerow({
                    "table": table.name, "row": row, "col": col, "metric": metric,
                    "mean": "" if mean is None else f"{mean:.4f}", "std": "" if std is None else f"{std:.4f}",
                    "n": n, **{s: cell.count(s) for s in STATUSES}, "paper": "" if paper is None else paper,
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
            for key in ("mean", "std", "paper"):
                record[key] = float(line[key]) if line[key] else None
            for key in ("n",) + STATUSES:
                record[key] = int(line[key])
            records.append(record)
    return records


def write_outputs(tables: list[Table], out: Path) -> list[Path]:
    """Write ``out.md``, ``out.csv`` and ``out.tex`` atomically; returns the paths."""
    from models.training import atomic_write_bytes

    written = []
    for suffix, text in ((".md", to_markdown(tables)), (".csv", to_csv(tables)), (".tex", to_latex(tables))):
        path = out.with_name(out.name + suffix)
        atomic_write_bytes(path, text.encode())
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", help="sweep dirs (runs/sweeps/<name>) or run dirs")
    parser.add_argument("--out", help="write OUT.md, OUT.csv and OUT.tex (default: print Markdown)")
    args = parser.parse_args(argv)
    try:
        tables = build_tables(collect(args.dirs))
    except TableError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.out:
        for path in write_outputs(tables, Path(args.out)):
            print(f"wrote {path}")
    else:
        print(to_markdown(tables))
    counts = {s: sum(c.count(s) for t in tables for c in t.cells.values()) for s in STATUSES}
    print(", ".join(f"{v} {k}" for k, v in counts.items()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
