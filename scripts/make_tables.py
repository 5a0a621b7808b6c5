"""Collect sweep runs and write the paper's ablation tables, ours beside the paper's numbers.

    python scripts/make_tables.py runs/sweeps/where_mini                  # one sweep
    python scripts/make_tables.py runs/sweeps/*_mini --out docs/ablations_mini --readme README.md
    python scripts/make_tables.py runs/deit_small_irpe_k runs/some_run  # plain run dirs work too

Every directory holding a run's resolved ``config.yaml`` (or Hydra's ``.hydra/config.yaml``) below
the given paths is a run. Its status is ``ok`` (``metrics.json``), ``failed`` (``failed.json``,
written by train.py when the job raised), or ``unfinished`` (neither: still running, or killed).
A sweep dir's ``multirun.yaml`` gives the whole grid, so grid points without a run dir are listed
as ``missing``. No run is dropped: a cell shows ``mean ± std (n)`` over seeds and names the runs
that failed, are missing or unfinished. A cell pools only runs whose resolved configs differ in the
seed (and in keys that cannot change a result: paths, loggers, progress bars); runs that differ in
anything else get a row of their own, labelled with the keys that differ.

The layout of each table (rows, columns, metric) follows the ablation named by the runs'
``ablation`` key (set by ``configs/sweep/*.yaml``); runs without it go to a plain ``runs`` table.
The paper's numbers come from ``scripts/paper_numbers.yaml`` and stand beside ours with their
difference (ours - paper). Each finding of the paper gets a verdict computed from the runs: the
finding's contrast of cells (e.g. contextual minus bias) is taken per seed, and its mean over seeds
is tested against its standard error (two-sided t test, 95 %): ``holds``, ``reversed`` or
``not resolved``. Writes ``OUT.md``, ``OUT.csv`` (one line per cell and metric; ``read_csv`` parses it
back) and ``OUT.tex`` (one ``tabular`` per table), or prints the Markdown; ``--readme`` puts the
findings table between the ``findings`` markers of a README.
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

from omegaconf import DictConfig, OmegaConf  # noqa: E402

from rpe import encoding  # noqa: E402
from rpe.config import FIELDS, PRESETS, RPEConfigError, parse_shorthand, resolve_rpe  # noqa: E402
from rpe.index import IndexSpec, bucket_ids, num_buckets  # noqa: E402

STATUSES = ("ok", "failed", "unfinished", "missing")
CSV_COLUMNS = ("table", "row", "col", "metric", "mean", "std", "n", "ok", "failed", "unfinished", "missing",
               "paper", "delta", "runs", "errors")
PAPER_FILE = Path(__file__).with_name("paper_numbers.yaml")
# Keys of a run's config that cannot change its numbers: runs differing only in these (and the seed) share a cell.
RESULT_NEUTRAL_KEYS = ("seed", "run_name", "name", "paths", "logger", "print_config", "resume", "task_name",
                       "data.root", "data.num_workers", "callbacks.progress_bar", "callbacks.rich_model_summary",
                       "trainer.enable_progress_bar", "trainer.default_root_dir", "hydra",
                       "callbacks.model_checkpoint.dirpath", "callbacks.last_checkpoint.dirpath")


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
    identity: dict[str, str] | None = None  # the config's result-relevant keys (None: a grid point never run)


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
        "schedule": cfg.get("schedule"),
        "row": cfg.get("row"),  # the job's entry of a sweep's `rows` table, where it has one
    }
    return facts


def run_identity(cfg: dict[str, Any]) -> dict[str, str]:
    """The config flattened to ``dotted.key -> repr(value)``, without the result-neutral keys."""
    flat: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if prefix and any(prefix == k or prefix.startswith(k + ".") for k in RESULT_NEUTRAL_KEYS):
            return
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}.{key}" if prefix else str(key))
        else:
            flat[prefix] = repr(node)

    walk(cfg, "")
    return flat


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
               cfg.get("ablation"), cfg.get("sweep_name"), run_identity(cfg))


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


def _resolved_where_possible(cfg: DictConfig) -> dict[str, Any]:
    """``cfg`` as a dict, each top-level key resolved unless it needs a running Hydra job (run dir, paths).

    Sweep rows are interpolations (``${rows.${row}.ape}``), so labels need resolving; the run-dir keys
    cannot be resolved outside a job and stay as written.
    """
    raw = OmegaConf.to_container(cfg, resolve=False)
    resolved: dict[str, Any] = {}
    for key in cfg:
        try:
            value = cfg[key]
            resolved[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        except Exception:  # any resolver failure leaves the key as written
            resolved[key] = raw[key]
    return resolved


def _missing_run(sweep_dir: Path, overrides: list[str]) -> Run:
    """A grid point with no run dir; its facts come from composing the job's config."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = Path(__file__).resolve().parents[1] / "configs"
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(config_dir), version_base="1.3"):
            cfg = compose("train", overrides=[o for o in overrides if not o.startswith("hydra")])
        container = _resolved_where_possible(cfg)
    except Exception:  # a grid point that does not even compose: still listed, with what is known
        container = {}
    finally:
        GlobalHydra.instance().clear()
    run = Run(f"{_shown(sweep_dir)}/[{','.join(overrides)}]", "missing", run_facts(container), {},
              "no run dir", container.get("ablation"), container.get("sweep_name"))
    return run


def run_dirs(root: Path) -> list[Path]:
    """The run dirs under ``root``: dirs with a ``config.yaml`` or ``.hydra/config.yaml``, outside checkpoints."""
    candidates = {p.parent for p in root.rglob("config.yaml") if p.parent.name != ".hydra"}
    candidates |= {p.parent.parent for p in root.rglob(".hydra/config.yaml")}
    return sorted(d for d in candidates if "checkpoints" not in d.parts)


def collect(paths: Iterable[str | Path]) -> list[Run]:
    """Every run under ``paths`` plus a ``missing`` entry per grid point of a sweep with no run dir."""
    runs: list[Run] = []
    seen: set[Path] = set()
    for root in map(Path, paths):
        if not root.exists():
            raise TableError(f"{str(root)!r} does not exist; give run dirs or sweep dirs (runs/sweeps/<name>)")
        found = [d for d in run_dirs(root) if d not in seen]
        seen.update(found)
        runs += [load_run(d) for d in found]
        for multirun in sorted(root.rglob("multirun.yaml")):
            sweep_dir = multirun.parent
            done = {_job_overrides(d) for d in found if d.is_relative_to(sweep_dir)}
            for job in expected_jobs(sweep_dir):
                if _normalised(job) not in done:
                    runs.append(_missing_run(sweep_dir, job))
    if not runs:
        raise TableError(f"no runs (no config.yaml) under: {', '.join(map(str, paths))}")
    return runs


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
    """How one ablation is tabulated: ``row(facts)``, ``col(facts)`` and the metrics of a cell."""

    title: str
    row_name: str
    row: Callable[[dict[str, Any]], Any]
    col: Callable[[dict[str, Any]], Any]
    metrics: tuple[str, ...] = ("val/top1",)
    row_order: tuple[Any, ...] = ()
    col_order: tuple[Any, ...] = ()
    note: str = ""
    extra: tuple[str, Callable[[dict[str, Any]], Any]] | None = None  # (header, fact of a row) shown per row
    relative: tuple[str, str, Any] | None = None  # (new metric, metric, row): a cell's mean over that row's mean


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
        note="`used` = distinct buckets the token grid's pairs reach (a small grid leaves the outer buckets of a"
        " large table unused, and two ratios can then split the offsets alike)",
        extra=("used", lambda f: f["used_buckets"]),
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
    "runs": Layout(
        "Runs", "run", lambda f: f["name"], lambda f: f["rpe"], metrics=("val/top1", "val/AP"),
    ),
}
ABLATION_SCALE = {"detr": "AP on COCO val2017 (DETR-R50)", "swin": "top-1 on ImageNet-1k (Swin-T)"}


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
    ablation: str
    layout: Layout
    sweeps: list[str]
    rows: list[Any]
    cols: list[Any]
    cells: dict[tuple[Any, Any], Cell]
    scale: str

    @property
    def paper(self) -> PaperTable | None:
        return PAPER.get(self.ablation)

    def row_label(self, row: Any) -> str:
        paper = self.paper
        return f"{row} (extra)" if paper is not None and str(row) in paper.extra_rows else str(row)

    def col_label(self, col: Any) -> str:
        paper = self.paper
        return f"{col} (extra)" if paper is not None and str(col) in paper.extra_cols else str(col)


def _natural(value: Any) -> list[Any]:
    """Sort key that puts "9 (...)" before "25 (...)"."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", str(value)) if t]


def _ordered(values: set[Any], order: tuple[Any, ...]) -> list[Any]:
    known = [v for v in order if v in values]
    return known + sorted((v for v in values if v not in order), key=_natural)


def split_by_config(row: Any, runs: list[Run]) -> dict[Any, list[Run]]:
    """The runs of one cell, split into groups whose configs differ in the seed only.

    One group keeps the row label; several get ``row [key=value, ...]`` with the keys in which their
    configs differ. A grid point that never ran (no config) joins the first group.
    """
    groups: dict[frozenset[tuple[str, str]], list[Run]] = {}
    for run in runs:
        if run.identity is not None:
            groups.setdefault(frozenset(run.identity.items()), []).append(run)
    never_ran = [run for run in runs if run.identity is None]
    if len(groups) <= 1:
        return {row: runs}
    identities = [dict(key) for key in groups]
    differing = sorted({k for ident in identities for k in ident
                        if len({ident_.get(k, "<unset>") for ident_ in identities}) > 1})
    split: dict[Any, list[Run]] = {}
    for ident, members in zip(identities, groups.values(), strict=True):
        label = ", ".join(f"{k}={ident.get(k, '<unset>').strip(chr(39))}" for k in differing[:3])
        label += f", +{len(differing) - 3} keys" if len(differing) > 3 else ""
        split[f"{row} [{label}]"] = members
    first = next(iter(split))
    split[first] = split[first] + never_ran
    return split


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


def build_tables(runs: list[Run]) -> list[Table]:
    """Group runs by (ablation, sweep) and lay each group out as its ablation's table."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        ablation = run.ablation if run.ablation in LAYOUTS else "runs"
        groups.setdefault((ablation, run.sweep or ""), []).append(run)
    tables = []
    for (ablation, sweep), members in sorted(groups.items(), key=lambda kv: (list(LAYOUTS).index(kv[0][0]), kv[0][1])):
        layout = LAYOUTS[ablation]
        by_position: dict[tuple[Any, Any], list[Run]] = {}
        for run in members:
            by_position.setdefault((layout.row(run.facts), layout.col(run.facts)), []).append(run)
        cells: dict[tuple[Any, Any], Cell] = {}
        for (row, col), cell_runs in by_position.items():
            for label, group in split_by_config(row, cell_runs).items():
                cells[(label, col)] = Cell(group)
        if layout.relative is not None:
            _add_relative_metric(layout, cells)
        rows = _ordered({r for r, _ in cells}, layout.row_order)
        cols = _ordered({c for _, c in cells}, layout.col_order)
        scale = ", ".join(sorted({str(r.facts["model"]) for r in members}))
        tables.append(Table(sweep or ablation, ablation, layout, [sweep] if sweep else [], rows, cols, cells, scale))
    return tables


# ----------------------------------------------------------------------------- findings
@dataclass(frozen=True)
class Finding:
    """A claim of the paper as a contrast of cells of one ablation table: ``sum(weight * cell) > 0``."""

    claim: str
    ablation: str
    contrast: tuple[tuple[str, str, float], ...]  # (row, col, weight)
    paper_text: str = ""  # what the paper shows where its numbers do not give the contrast


def _mean_of(cells: list[tuple[str, str]], weight: float) -> tuple[tuple[str, str, float], ...]:
    return tuple((row, col, weight / len(cells)) for row, col in cells)


_METHOD_ROWS = [f"{m} ({d})" for m, d in DIRECTED.items()]
FINDINGS: tuple[Finding, ...] = (
    Finding("contextual beats bias (mean over the four methods)", "method_mode",
            _mean_of([(r, "ctx") for r in _METHOD_ROWS], 1) + _mean_of([(r, "bias") for r in _METHOD_ROWS], -1)),
    Finding("directed beats undirected in contextual mode", "method_mode",
            _mean_of([("cross (directed)", "ctx"), ("product (directed)", "ctx")], 1)
            + _mean_of([("euclidean (undirected)", "ctx"), ("quant (undirected)", "ctx")], -1)),
    Finding("sharing heads hurts bias mode (per head minus shared)", "shared_head",
            (("bias", "per head", 1.0), ("bias", "shared", -1.0))),
    Finding("sharing heads costs more in bias than in contextual mode", "shared_head",
            (("bias", "per head", 1.0), ("bias", "shared", -1.0), ("ctx", "per head", -1.0), ("ctx", "shared", 1.0))),
    Finding("more buckets help up to ~50 (49 minus 9 buckets)", "buckets",
            (("49 (ratio 1.9)", "ours", 1.0), ("9 (ratio 0.5)", "ours", -1.0)),
            paper_text="rises (Figure 3: 79.9 without RPE to 80.9 at 50)"),
    Finding("the gain saturates past ~50 (gain 9->49 exceeds gain 49->121)", "buckets",
            (("49 (ratio 1.9)", "ours", 2.0), ("9 (ratio 0.5)", "ours", -1.0), ("121 (ratio 2.9)", "ours", -1.0)),
            paper_text="flat after 50 (Figure 3)"),
    Finding("keys carry more than values (mean over both APE columns)", "where",
            _mean_of([("k", "with APE"), ("k", "no APE")], 1)
            + _mean_of([("v", "with APE"), ("v", "no APE")], -1)),
    Finding("RPE replaces APE: QKV without APE beats APE alone", "where",
            (("qkv", "no APE", 1.0), ("none", "with APE", -1.0))),
    Finding("RPE helps DETR (contextual 9x9 minus none, sine APE)", "detr",
            (("sine, ctx 9x9, short", "ours", 1.0), ("sine, none, short", "ours", -1.0))),
    Finding("RPE helps DETR at the long schedule too (contextual 9x9 minus none, sine APE)", "detr",
            (("sine, ctx 9x9, long", "ours", 1.0), ("sine, none, long", "ours", -1.0))),
    Finding("detection needs the absolute encoding (sine minus none, no RPE)", "detr",
            (("sine, none, short", "ours", 1.0), ("none, none, short", "ours", -1.0))),
    Finding("piecewise beats clip for detection", "detr",
            (("sine, ctx 9x9, short", "ours", 1.0), ("sine, ctx clip 9x9, short", "ours", -1.0))),
    Finding("contextual beats bias for detection (9x9, sine APE)", "detr",
            (("sine, ctx 9x9, short", "ours", 1.0), ("sine, bias 9x9, short", "ours", -1.0))),
    Finding("iRPE-K beats CPVT's conditional encoding", "compare", (("irpe_k", "ours", 1.0), ("cpvt", "ours", -1.0))),
    Finding("iRPE-QKV beats the best earlier relative encoding (Huang's)", "compare",
            (("irpe_qkv", "ours", 1.0), ("huang", "ours", -1.0))),
    Finding("Swin's bias beats no RPE on Swin", "swin", (("swin", "ours", 1.0), ("none", "ours", -1.0))),
    Finding("contextual iRPE-QKV beats Swin's bias on Swin", "swin",
            (("rpe-1.9-product-ctx-1-qkv", "ours", 1.0), ("swin", "ours", -1.0))),
)


@dataclass
class Verdict:
    finding: Finding
    table: str
    paper: str
    mean: float | None
    se: float | None
    n: int
    t: float | None
    verdict: str


def _t_critical(df: int) -> float:
    from scipy.stats import t as student_t

    return float(student_t.ppf(0.975, df))


def paper_contrast(finding: Finding) -> str:
    """The finding's contrast of the paper's numbers, or what the paper shows instead."""
    paper, metric = PAPER.get(finding.ablation), LAYOUTS[finding.ablation].metrics[0]
    values = [paper.value(row, col, metric) if paper else None for row, col, _ in finding.contrast]
    if all(v is not None for v in values):
        return f"{sum(w * v for (_, _, w), v in zip(finding.contrast, values, strict=True)):+.2f}"  # type: ignore[operator]
    return finding.paper_text or "–"


def judge(finding: Finding, table: Table) -> Verdict:
    """The finding's contrast per seed (seeds with every cell ok), its mean, standard error and verdict."""
    metric = table.layout.metrics[0]
    per_cell = [(table.cells.get((row, col)), weight) for row, col, weight in finding.contrast]
    paper_text = paper_contrast(finding)
    if any(cell is None for cell, _ in per_cell):
        return Verdict(finding, table.name, paper_text, None, None, 0, None, "not run")
    seed_values = [cell.by_seed(metric) for cell, _ in per_cell]  # type: ignore[union-attr]
    seeds = sorted(set.intersection(*(set(v) for v in seed_values)), key=str)
    diffs = [sum(w * values[s] for (_, w), values in zip(per_cell, seed_values, strict=True)) for s in seeds]
    if not diffs:
        return Verdict(finding, table.name, paper_text, None, None, 0, None, "not run")
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return Verdict(finding, table.name, paper_text, mean, None, 1, None, "not resolved (1 seed)")
    se = statistics.stdev(diffs) / math.sqrt(len(diffs))
    t = math.copysign(math.inf, mean) if se == 0 and mean != 0 else (0.0 if se == 0 else mean / se)
    critical = _t_critical(len(diffs) - 1)
    verdict = "holds" if t > critical else "reversed" if t < -critical else "not resolved"
    return Verdict(finding, table.name, paper_text, mean, se, len(diffs), t, verdict)


def verdicts(tables: list[Table]) -> list[Verdict]:
    """A verdict per finding and table of its ablation; ``not run`` for a finding without such a table."""
    results = []
    for finding in FINDINGS:
        judged = [judge(finding, t) for t in tables if t.ablation == finding.ablation]
        results += judged or [Verdict(finding, "–", paper_contrast(finding), None, None, 0, None, "not run")]
    return results


def findings_markdown(results: list[Verdict]) -> str:
    """The verdict table: one line per finding and table."""
    lines = ["| finding (paper) | table | paper | ours: mean ± SE (seeds) | t | verdict |", "|---|---|---|---|---|---|"]
    for v in results:
        ours = "–" if v.mean is None else f"{v.mean:+.2f}" + (f" ± {v.se:.2f}" if v.se is not None else "")
        ours += "" if v.mean is None else f" ({v.n})"
        t = "–" if v.t is None else f"{v.t:+.1f}"
        table = f"`{v.table}`" if v.table != "–" else "–"
        lines.append(f"| {v.finding.claim} | {table} | {v.paper} | {ours} | {t} | {v.verdict} |")
    return "\n".join(lines) + "\n"


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


def _latex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"),
                 ("±", r"$\pm$"), ("–", "--"), ("Δ", r"$\Delta$")):
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
                paper = table.paper.value(row, col, metric) if table.paper else None
                writer.writerow({
                    "table": table.name, "row": row, "col": col, "metric": metric,
                    "mean": "" if mean is None else f"{mean:.4f}", "std": "" if std is None else f"{std:.4f}",
                    "n": n, **{s: cell.count(s) for s in STATUSES}, "paper": "" if paper is None else paper,
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
            for key in ("n",) + STATUSES:
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
    parser.add_argument("--readme", help="put the findings table between the findings markers of this file")
    args = parser.parse_args(argv)
    try:
        tables = build_tables(collect(args.dirs))
        if args.readme:
            from models.training import atomic_write_bytes

            readme = Path(args.readme)
            if not readme.is_file():
                raise TableError(f"--readme {str(readme)!r} is not a file")
            atomic_write_bytes(readme, with_findings(readme.read_text(), findings_markdown(verdicts(tables))).encode())
            print(f"wrote the findings into {readme}")
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
