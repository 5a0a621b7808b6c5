"""Keep the results of sweep runs in a small tree that can be committed, without their checkpoints.

    python scripts/archive_runs.py runs/sweeps/where_mini --to docs/ablations_mini_runs

A sweep's run dirs hold checkpoints (megabytes each) and live in ``runs/``, outside version control. This
copies what ``make_tables.py`` reads, and nothing else: the sweep's ``multirun.yaml`` (its grid) and, for
every run that ended (``metrics.json`` or ``failed.json``), its resolved ``config.yaml``, its
``.hydra/overrides.yaml`` and that result file. The archive mirrors the sweep's layout
(``DEST/<sweep>/<job>/``), so ``make_tables.py DEST/*`` builds the same tables as ``runs/sweeps/*`` did,
and results gathered over several sittings or machines add up in one place. Unfinished runs are left
out (the grid lists them as missing until they end).

A run already archived under the same job name is replaced only by a run of the same config (the same
job run again); a different config there stops the script with one line, as the archive belongs to the
recipe its runs were made with (remove that sweep's archive to start it afresh).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.make_tables import TableError, _load_yaml, run_dirs, run_identity  # noqa: E402

RESULT_FILES = ("metrics.json", "failed.json")


def _sweep_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        raise TableError(f"{str(root)!r} is not a directory; give sweep dirs (runs/sweeps/<name>)")
    sweeps = sorted(p.parent for p in root.rglob("multirun.yaml"))
    if not sweeps:
        raise TableError(f"{str(root)!r} holds no sweep (no multirun.yaml below it)")
    return sweeps


def _ended_runs(sweep_dir: Path) -> list[Path]:
    return [d for d in run_dirs(sweep_dir)
            if (d / "config.yaml").is_file() and any((d / f).is_file() for f in RESULT_FILES)]


def _identity(config: Path) -> dict[str, str]:
    return run_identity(_load_yaml(config))


def archive_sweep(sweep_dir: Path, dest: Path) -> tuple[int, int]:
    """Copy ``sweep_dir``'s grid and ended runs into ``dest/<sweep name>``; returns (new, replaced)."""
    from models.training import atomic_write_bytes

    target = dest / sweep_dir.name
    new = replaced = 0
    runs = _ended_runs(sweep_dir)
    for run_dir in runs:  # check every run before writing anything
        archived = target / run_dir.relative_to(sweep_dir) / "config.yaml"
        if archived.is_file() and _identity(archived) != _identity(run_dir / "config.yaml"):
            raise TableError(f"{str(archived.parent)!r} holds a run of another config than {str(run_dir)!r}; "
                             "remove that sweep's archive to archive the new recipe")
    atomic_write_bytes(target / "multirun.yaml", (sweep_dir / "multirun.yaml").read_bytes())
    for run_dir in runs:
        out = target / run_dir.relative_to(sweep_dir)
        existed = (out / "config.yaml").is_file()
        for stale in RESULT_FILES:  # a failed run that later finished keeps only its newer result
            if (out / stale).is_file() and not (run_dir / stale).is_file():
                (out / stale).unlink()
        for name in ("config.yaml", ".hydra/overrides.yaml", *RESULT_FILES):
            if (run_dir / name).is_file():
                atomic_write_bytes(out / name, (run_dir / name).read_bytes())
        new, replaced = new + (not existed), replaced + existed
    return new, replaced


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", help="sweep dirs (runs/sweeps/<name>) or dirs holding them")
    parser.add_argument("--to", required=True, help="the archive (e.g. docs/ablations_mini_runs)")
    args = parser.parse_args(argv)
    try:
        for sweep_dir in [s for root in map(Path, args.dirs) for s in _sweep_dirs(root)]:
            new, replaced = archive_sweep(sweep_dir, Path(args.to))
            print(f"{sweep_dir} -> {Path(args.to) / sweep_dir.name}: {new} new, {replaced} replaced")
    except TableError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
