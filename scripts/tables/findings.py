"""The paper's findings as contrasts of cells, and their verdicts on the runs."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from scripts.tables.cells import Table
from scripts.tables.layouts import DIRECTED, LAYOUTS, PAPER


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


