"""Collect sweep runs and write the paper's ablation tables, ours beside the paper's numbers.

    python scripts/make_tables.py runs/sweeps/where_mini                  # one sweep
    python scripts/make_tables.py runs/sweeps/*_mini --out docs/ablations_mini --readme README.md
    python scripts/make_tables.py runs/deit_small_irpe_k runs/some_run  # plain run dirs work too

Every directory holding a run's resolved ``config.yaml`` (or Hydra's ``.hydra/config.yaml``) below the given
paths is a run. Its status comes from the run lifecycle (``run_status``: ``run.json``, or for older runs the
result files): ``ok`` (finished, with its result), ``failed`` (``failed.json``), ``unfinished`` (no record and
no result), ``interrupted``, ``running`` or ``died`` (``run.json``'s state: an extension to more epochs that
stopped is not ok, whatever an earlier ``metrics.json`` says), ``no result`` (a metric of its table is null or
absent), ``unreadable`` (a damaged record or config, with the reason) or ``duplicate`` (the same cell and seed
as a run that is counted: one seed counts once). A sweep dir's ``multirun.yaml`` gives the whole grid, so grid
points without a run dir are listed as ``missing``; a run is matched to its grid point by its
``.hydra/overrides.yaml``, checked against its config and (where the sweep names job dirs after overrides) its
dir name, and one whose overrides cannot be used (absent, or damaged or edited: listed with the reason) fills
the grid point of its config instead: a run that is there is never reported missing. No run is dropped: a cell
shows ``mean ± std (n)`` over the seeds of its ok runs and names every other run; a run that no cell can hold
(its config is unreadable) is listed under "Runs not counted". A cell pools only runs of one `cell_key`
(lifecycle/identity.py): the same identity but for the seed, and the same length; runs at one table
position that differ in anything else get a row of their own, labelled with the keys that differ.

The layout of each table (rows, columns, metric) follows the ablation named by the runs' ``ablation`` key (set by
``configs/sweep/*.yaml``); runs without it go to a plain ``runs`` table. The paper's numbers come from its tables'
entries (``scripts/paper_tables/<ablation>.yaml``) and stand beside ours in their own column, never subtracted from
ours (the paper's are ImageNet-1k and COCO, the mini tables' synthetic data). Every table shows the buckets each row's
runs actually use on their token grid, and marks a row that cannot differ from another by construction (the same
config up to an index that splits the grid's pairs into the same buckets). Each finding of the paper (its table's
entry: its contrast, predicted sign and source) gets a verdict computed from the runs: the finding's contrast of cells
(e.g. contextual minus bias) is taken per seed; its mean gets a 95 % t confidence interval and a paired t test, and
Holm's step-down correction over all findings judged together decides ``holds`` / ``reversed`` / ``not resolved``,
after the design checks ``cannot differ``, ``floor`` (a side at chance) and ``ceiling`` (both sides at 100). Beside
ours stands the paper's own contrast. Writes ``OUT.md``, ``OUT.csv`` (one line per cell and metric; ``read_csv``
parses it back) and ``OUT.tex`` (one ``tabular`` per table), or prints the Markdown; ``--readme`` puts the findings
table between the ``findings`` markers of a README. That table is one Holm family over every task, so it is built
from all the sweeps it lists (DIRS, plus ``--family``): runs that leave out a table whose findings it lists are
refused in one line, as the rewrite would drop those findings.

The work is done in ``reports/``: ``collect`` (run dirs, their status and facts), ``layouts`` (the
paper's tables' entries, one layout per ablation), ``cells`` (cells, duplicates, statistics), ``findings`` and
``render``; this script is their command line, and its module names what they export.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import starting  # noqa: E402

starting.guard_imports(__name__)  # a temp dir among results, Ctrl-C during the imports: one line


# The public names of the parts, so that `scripts.make_tables` stays the one import of the tables.
from reports.cells import NOT_COUNTED, Cell, Table, build_tables, split_by_config  # noqa: E402
from reports.collect import (  # noqa: E402
    STATUSES,
    Run,
    TableError,
    cell_identity,
    check_record,
    collect,
    expected_jobs,
    load_run,
    read_config,
    read_overrides,
    run_dirs,
    run_facts,
    sweep_grid,
)
from reports.findings import (  # noqa: E402
    FINDINGS,
    Finding,
    PairedTest,
    Verdict,
    all_findings,
    findings_markdown,
    holm,
    judge,
    paired_test,
    sign_flip_p,
    verdicts,
)
from reports.layouts import ENTRIES, LAYOUTS, PAPER, Entry, Layout, PaperTable, load_entries  # noqa: E402
from reports.render import (  # noqa: E402
    CSV_COLUMNS,
    README_BLOCK,
    STATUS_COLUMNS,
    check_readme_block,
    read_csv,
    to_csv,
    to_latex,
    to_markdown,
    with_findings,
    write_outputs,
)
from storage.files import error_line  # noqa: E402

__all__ = [
    "CSV_COLUMNS", "ENTRIES", "Entry", "FINDINGS", "LAYOUTS", "NOT_COUNTED", "PAPER", "STATUSES", "STATUS_COLUMNS",
    "Cell", "Finding",
    "Layout", "PairedTest", "PaperTable", "Run", "Table", "TableError", "Verdict", "all_findings", "build_tables",
    "cell_identity",
    "check_record", "collect", "expected_jobs", "findings_markdown", "holm", "judge", "load_entries",
    "load_run", "main", "paired_test", "read_config", "read_csv", "read_overrides", "run_dirs", "run_facts",
    "sign_flip_p", "split_by_config", "sweep_grid", "to_csv", "to_latex", "to_markdown", "verdicts", "with_findings",
    "write_outputs",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", help="sweep dirs (runs/sweeps/<name>) or run dirs")
    parser.add_argument("--out", help="write OUT.md, OUT.csv and OUT.tex, OUT a file prefix, not a folder"
                                      " (default: print Markdown)")
    parser.add_argument("--readme", help="put the findings table between the findings markers of this file")
    parser.add_argument("--readme-block", default=README_BLOCK,
                        help="the markers' name: <!-- NAME:start --> and <!-- NAME:end --> (default: %(default)s)")
    parser.add_argument("--family", nargs="+", default=[], metavar="DIR",
                        help="more sweep dirs whose runs the findings are judged on as one Holm family, with the"
                             " DIRS' own, but whose tables are not written (e.g. the other benchmark tasks)")
    args = parser.parse_args(argv)
    from lifecycle.signals import exit_when_interrupted

    with exit_when_interrupted("make_tables.py", "each file it wrote is whole (written at once, or not at all):"
                               " run the same command again to write them all"):
        return _tables_written(args)


def _tables_written(args: argparse.Namespace) -> int:
    """`main`'s work: every check in one line (exit 2), then the tables and the README's findings."""
    from storage.destinations import check_destination

    try:
        check_readme_block(args.readme_block)  # before any run is read, as every other option
        readme_text = read_readme(Path(args.readme)) if args.readme else None
        if args.out is not None:
            check_out_prefix(args.out)
        if args.out:
            # before any run is read: never into a run dir or a data root (OUT.md and the others are written
            # into OUT's folder), and never a name whose listing would lie
            check_destination(Path(args.out).parent, "--out", given=args.out)
        runs = collect(args.dirs)
        if args.out:  # nor into the data a run of the tables trained on, whatever its layout or split names
            check_destination(Path(args.out).parent, "--out", given=args.out, data_roots=run_data_roots(runs))
        tables = build_tables(runs)
        family = build_tables(collect([*args.dirs, *args.family])) if args.family else None
        if args.readme:
            from storage.files import atomic_write_bytes

            readme = Path(args.readme)
            crlf = "\r\n" in readme_text  # a Windows README keeps its line ends: the block is written in them too
            try:
                text = with_findings(readme_text.replace("\r\n", "\n"),
                                     findings_markdown(verdicts(family or tables)), args.readme_block)
            except TableError as err:  # before any file is written
                raise TableError(f"--readme {str(readme)!r}: {err}") from None
            text = text.replace("\n", "\r\n") if crlf else text
            atomic_write_bytes(readme, text.encode())
            print(f"wrote the findings into {readme}")
        if args.out:
            for path in write_outputs(tables, Path(args.out), family):
                print(f"wrote {path}")
        else:
            print(to_markdown(tables, family))
    except (ValueError, OSError) as err:  # TableError, and RunFileError from writing the outputs
        print(f"error: {error_line(err)}", file=sys.stderr)
        return 2
    counts = {s: sum(c.count(s) for t in tables for c in t.cells.values()) for s in STATUSES}
    print(", ".join(f"{v} {k}" for k, v in counts.items() if v or k == "ok"), file=sys.stderr)
    return 0


def check_out_prefix(out: str) -> None:
    """Refuse an ``--out`` that names a folder (a trailing ``/``, an existing folder, ``.``), nothing, or one of the
    three files (``t.md`` wrote ``t.md.md``): it is the prefix of the three files, which would be written beside
    the folder (``tabs/t61/`` wrote ``tabs/t61.md``)."""
    if not out:
        raise TableError("--out='' names no file; valid: a file prefix such as tabs/ablations (writes"
                         " tabs/ablations.md, .csv and .tex)")
    path = Path(out)
    if out.endswith(("/", os.sep)) or path.name in ("", ".", "..") or path.is_dir():
        example = path / "tables" if path.name not in ("", ".", "..") else Path("tables")
        raise TableError(f"--out {out!r} is a folder; valid: a file prefix such as {example} (writes {example}.md,"
                         " .csv and .tex)")
    if path.suffix in (".md", ".csv", ".tex"):  # one of the three files: the prefix is the name without it
        prefix = path.with_suffix("")
        raise TableError(f"--out {out!r} names one of the files it writes; valid: the prefix {prefix} (writes"
                         f" {prefix}.md, .csv and .tex)")


# A README is a text file of some KiB: one past this bound (a damaged or sparse file) is refused, never read whole
MAX_README_BYTES = 16 * 2**20


def read_readme(readme: Path) -> str:
    """The text of the ``--readme`` file: a plain UTF-8 text file within `MAX_README_BYTES`, outside any run dir
    or data root (it is written back); else a `TableError` naming it."""
    from data.bounded_json import JsonBoundsError, read_json_bytes
    from storage.destinations import check_destination

    if not readme.is_file():
        raise TableError(f"--readme {str(readme)!r} is not a file")
    check_destination(readme, "--readme")  # never a file of a run dir or a dataset
    try:
        text = read_json_bytes(readme, MAX_README_BYTES).decode()
    except JsonBoundsError as err:
        why = str(err).split(", which")[0].removeprefix("it is ")  # "larger than 16 MiB (<n> bytes)"
        raise TableError(f"--readme {str(readme)!r} is {why}; valid: a README of text") from None
    except UnicodeDecodeError:
        raise TableError(f"--readme {str(readme)!r} is not UTF-8 text; valid: a README of text") from None
    if "\x00" in text:
        raise TableError(f"--readme {str(readme)!r} holds NUL bytes (a damaged or binary file); valid: a README of"
                         " text")
    return text


def run_data_roots(runs: list[Any]) -> list[str]:
    """The ``data.root`` of each run read (`lifecycle.run_config.run_data_root`; a run whose config cannot be read is
    left out, as the tables name it already)."""
    from lifecycle.run_config import run_data_root

    roots = (run_data_root(Path(run.path)) for run in runs if run.status != "missing")
    return [root for root in roots if root is not None]


if __name__ == "__main__":
    starting.imported()
    sys.exit(main())
