"""Keep the results of sweep runs in a small tree that can be committed, without their checkpoints.

    python scripts/archive_runs.py runs/sweeps/where_mini --to docs/ablations_mini_runs

A sweep's run dirs hold checkpoints (megabytes each) and live in ``runs/``, outside version control. This
copies what ``make_tables.py`` reads, and nothing else: the sweep's ``multirun.yaml`` (its grid; an optuna
sweep's ``trials.yaml`` too, the trials it launched) and, for
every run that ended (finished or failed, by the lifecycle's ``run_status``), its resolved ``config.yaml``,
its ``.hydra/overrides.yaml``, its ``run.json`` where it has one (the state and length), its result file
and, for a finished run, its results on other test sets (``testsets/<name>.json``, from ``eval.py
testset=<name>``; a later sitting mirrors the run's, removing those it no longer has). The archive mirrors
the sweep's layout (``DEST/<sweep>/<job>/``), so ``make_tables.py DEST/*`` builds the same tables as
``runs/sweeps/*`` did, and results gathered over several sittings or machines add up in one place. Runs
that have not ended (unfinished, interrupted, running, died) are left out, each named (the grid lists them
as missing until they end).

Every run is checked before anything is written: a damaged record or config (what ``make_tables.py`` lists as
unreadable) stops the script with one line naming the file, as an archive must not keep a result it cannot
place; so does a ``.hydra/overrides.yaml`` that is not the run's (a value its config does not hold, or another
dir name than the run's: `tables.collect.read_overrides`), a file to copy that is not a plain file (a
FIFO, a folder, a symlink), and a test-set result that make_tables would not count (a symlink or a file that
is not plain, damaged, another run's or another test set's: `tables.collect.read_testset_result`). A
run already archived under the same job name is replaced only by a run of the same identity (the same job run
again, or extended to more epochs); a different config there stops the script with one line, as the archive
belongs to the recipe its runs were made with (remove that sweep's archive to start it afresh).

Each archived sweep holds a marker, ``.archive.json`` (the tables ignore it): train.py refuses a run or sweep dir
inside a marked folder, where the archived jobs would pass for finished and new jobs would write checkpoints. The
``--to`` folder gets one too, ``.archives.json``: no run, sweep or data folder is made anywhere in it, whose folders
``make_tables <to>/*`` would read as archived sweeps.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import starting  # noqa: E402

starting.guard_imports(__name__)  # a temp dir among results, Ctrl-C during the imports: one line

from data.bounded_json import MAX_JSON_BYTES, JsonBoundsError, read_json_bytes  # noqa: E402
from lifecycle.identity import identity_config, identity_hash, run_length  # noqa: E402
from lifecycle.records import CONFIG, FAILURE, FINDINGS_SNAPSHOT, METRICS, RUN_RECORD, run_status  # noqa: E402
from reports.collect import (  # noqa: E402
    OVERRIDES,
    TESTSETS,
    JobNaming,
    TableError,
    check_record,
    expected_jobs,
    grid_files,
    job_naming,
    read_config,
    read_overrides,
    read_testsets,
    run_data_config,
    run_dirs,
)
from storage.destinations import check_path_text, is_run_dir  # noqa: E402
from storage.files import (  # noqa: E402
    RunFileError,
    describe_non_file,
    entries_named,
    entry_exists,
    error_line,
    plain_file_exists,
)

RECORDS = (RUN_RECORD, METRICS, FAILURE)  # what a later sitting replaces, or removes where the run no longer has it
COPIED = (CONFIG, OVERRIDES, *RECORDS, FINDINGS_SNAPSHOT)  # a run's files the archive keeps, where it has them
ENDED = ("finished", "failed")
# The archive marker's content (the same bytes at every sitting, so a committed archive does not change by it)
ARCHIVES_NOTE = json.dumps({"archives": "scripts/archive_runs.py", "holds": "archived sweeps, each with its own marker",
                            "to train": "train into a folder outside it (e.g. runs/), then archive again"},
                           indent=1).encode() + b"\n"
ARCHIVE_NOTE = json.dumps({"archive": "scripts/archive_runs.py", "holds": "finished and failed runs' records, without"
                           " checkpoints", "to train": "train into the live sweep dir, then archive again"},
                          indent=1).encode() + b"\n"


def _sweep_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        raise TableError(f"{str(root)!r} is not a directory; give sweep dirs (runs/sweeps/<name>)")
    sweeps = sorted(p.parent for p in entries_named(root, "multirun.yaml", leaf=is_run_dir))
    if not sweeps:
        raise TableError(f"{str(root)!r} holds no sweep (no multirun.yaml below it)")
    return sweeps


def _check_run(run_dir: Path, naming: JobNaming | None = None) -> str:
    """The run's state, once its records, config and overrides are known to be sound (the overrides those of
    its config and, under ``naming``, of its dir name: `read_overrides`, as make_tables reads them) and every
    file to be copied is a plain file or absent (`plain_file_exists`); anything else is a `TableError`."""
    status = run_status(run_dir)
    if status.state == "unreadable":
        raise TableError(f"{status.problem}; repair it or move {run_dir} away, then archive again")
    if status.state not in ENDED:
        return status.state
    if status.state == "failed" and not entry_exists(run_dir / CONFIG):
        return "failed before it saved its config.yaml"  # make_tables shows it from .hydra/config.yaml
    cfg = read_config(run_dir / CONFIG)
    check_record(run_dir, cfg, status.state)
    if read_overrides(run_dir, cfg, naming) is None:
        raise TableError(f"{run_dir / OVERRIDES} is missing; the archive needs it to match the run to its grid point")
    try:  # a FIFO or a folder in a copied file's place is named before anything is written, never skipped
        for name in COPIED:
            if plain_file_exists(run_dir / name) and (run_dir / name).stat().st_size > MAX_JSON_BYTES:
                _bounded_bytes(run_dir / name)  # names it
    except RunFileError as err:
        raise TableError(str(err)) from None
    return status.state


def _bounded_bytes(path: Path) -> bytes:
    """A run file's bytes for the archive, which holds small records only: a file larger than any record a run
    writes (a damaged or planted one) is a `TableError` naming it, never read whole or copied."""
    try:
        return read_json_bytes(path)
    except JsonBoundsError as err:
        raise TableError(f"{path} is damaged: {err}; repair it or move it away, then archive again") from None


def _testset_files(run_dir: Path, state: str, out: Path) -> list[str]:
    """The test-set result files of a finished run to archive (``testsets/<name>.json``), each one that
    make_tables counts; one it would not count is a `TableError` naming it, as is an archived ``testsets``
    that is not a plain folder (a write there could land outside the archive)."""
    if state != "finished":  # make_tables reads test-set results of finished runs only
        return []
    cfg = read_config(run_dir / CONFIG)
    _, testsets, problems = read_testsets(run_dir, identity_hash(identity_config(cfg)), run_length(cfg),
                                          run_data_config(cfg), run_status(run_dir).metrics)
    if problems:
        file, why = problems[0]
        if file == TESTSETS:  # the folder itself: its problem says what to do (a link: replace it, never clear it)
            raise TableError(f"{run_dir / file}: {why}; then archive again")
        raise TableError(f"{run_dir / file} is not a result make_tables counts: {why}; repair it or move it away, "
                         "then archive again")
    archived = out / TESTSETS
    if entry_exists(archived) and (archived.is_symlink() or not archived.is_dir()):
        raise TableError(f"{archived} cannot hold the archived test-set results: {describe_non_file(archived)}; "
                         "move it away")
    return [f"{TESTSETS}/{name}.json" for name in sorted(testsets)]


def _archived_testsets(out: Path) -> list[str]:
    """The test-set result files already archived in ``out`` (plain files only: a symlink there is not ours)."""
    folder = out / TESTSETS
    if not folder.is_dir() or folder.is_symlink():
        return []
    return sorted(f"{TESTSETS}/{p.name}" for p in folder.iterdir()
                  if p.name.endswith(".json") and p.is_file() and not p.is_symlink())


def archive_sweep(sweep_dir: Path, dest: Path, typed: str | None = None) -> tuple[int, int, list[str]]:
    """Copy ``sweep_dir``'s grid and ended runs into ``dest/<sweep name>``; returns (new, replaced, left out).
    ``typed``: ``--to`` as the user wrote it (``.``, ``x/``), quoted in a refusal with the folder it names."""
    from storage.destinations import (
        ARCHIVE_MARKER,
        ARCHIVES_MARKER,
        DestinationError,
        check_destination,
        check_no_links_below,
        live_folder_below,
    )
    from storage.files import atomic_write_bytes, symlink_loop

    typed = str(dest) if typed is None else typed
    target = dest / sweep_dir.name
    source, where = sweep_dir.resolve(), Path(os.path.abspath(target))
    shown = f"--to {typed!r} (the archive {where})"
    if where.resolve() == source or source in where.resolve().parents or where.resolve() in source.parents:
        raise TableError(f"{shown} would put the archive of {str(sweep_dir)!r} in or around the sweep "
                         "itself; valid: a folder outside the sweep (e.g. docs/ablations_mini_runs)")
    inside = next((p for p in (where, *where.parents) if (p / "run.json").is_file() or (p / "metrics.json").is_file()),
                  None)
    if inside is not None:
        raise TableError(f"{shown} is inside the run dir {inside}; valid: a folder outside every run dir")
    try:  # the same rule on the real path: a link on the way may lead into a run dir or a data root
        check_destination(target, "--to", given=typed, archive=True)
    except DestinationError as err:  # named as typed, with the folder the archive would be
        raise TableError(str(err).replace(f"--to={typed!r}", f"--to={typed!r} (the archive {where})", 1)) from None

    real_dest = Path(os.path.realpath(dest))  # a --to that is a link marks the folder it leads to
    live = live_folder_below(real_dest) if real_dest.is_dir() else None
    if live is not None:  # the --to folder's marker would turn it into an archive's folder
        raise TableError(f"--to {typed!r} holds {live}: marked as a folder of archived sweeps, what it holds would be"
                         " read as archived, and no run could be resumed or made there again; valid: a folder of"
                         " archives only (e.g. docs/<name>_runs)")

    def write_check(path: Path) -> None:
        """Refuse ``path`` when a symlink below ``dest`` lies on its way."""
        try:
            check_no_links_below(dest, path, "--to")
        except DestinationError as err:
            raise TableError(str(err)) from None

    def write(path: Path, payload: bytes) -> None:
        write_check(path)
        atomic_write_bytes(path, payload)

    expected_jobs(sweep_dir)  # a damaged grid stops here, as make_tables could not list its missing runs
    naming = job_naming(sweep_dir)
    runs, left_out = [], []
    for run_dir in run_dirs(sweep_dir):  # check every run before writing anything
        state = _check_run(run_dir, naming if run_dir.parent == sweep_dir else None)
        if state not in ENDED:
            left_out.append(f"{run_dir} ({state})")
            continue
        archived = target / run_dir.relative_to(sweep_dir) / CONFIG
        write_check(archived.parent)  # a linked job folder is named as a link, before its config is compared
        if entry_exists(archived) and identity_config(read_config(archived)) != identity_config(
                read_config(run_dir / CONFIG)):
            raise TableError(f"{str(archived.parent)!r} holds a run of another config than {str(run_dir)!r}; "
                             "remove that sweep's archive to archive the new recipe")
        runs.append((run_dir, _testset_files(run_dir, state, archived.parent)))
    # a job folder that is a link loop holds no run to archive: named, never left out without a word
    left_out += [f"{entry} (a symlink loop)" for entry in sorted(sweep_dir.iterdir()) if symlink_loop(entry) == entry]
    grids = grid_files(sweep_dir)  # the latest launch's grid and the earlier ones kept beside it
    # every file the archive gets, before any is written: a link at a later job's folder (to a live run) is
    # refused with the archive as it was, never after its grid and earlier jobs were replaced
    for path in [dest / ARCHIVES_MARKER, target / ARCHIVE_MARKER, *(target / grid.name for grid in grids)]:
        write_check(path)
    for run_dir, testsets in runs:
        out = target / run_dir.relative_to(sweep_dir)
        for path in [out, *(out / name for name in COPIED if plain_file_exists(run_dir / name)),
                     *(out / name for name in testsets)]:
            write_check(path)
    # first, so that an archive cut short is one too: train.py refuses a run or sweep dir in a marked folder
    write(dest / ARCHIVES_MARKER, ARCHIVES_NOTE)  # the --to folder: no run, sweep or data folder is made in it
    write(target / ARCHIVE_MARKER, ARCHIVE_NOTE)
    for grid in grids:
        write(target / grid.name, _bounded_bytes(grid))
    new = replaced = 0
    for run_dir, testsets in runs:
        out = target / run_dir.relative_to(sweep_dir)
        write_check(out)  # checked above; again, as each write is, in case the archive changed since
        existed = (out / CONFIG).is_file()
        for stale in RECORDS:  # a failed run that later finished keeps only its newer result
            if (out / stale).is_file() and not (run_dir / stale).is_file():
                (out / stale).unlink()
        for stale in set(_archived_testsets(out)) - set(testsets):  # the results of an earlier run of this job
            (out / stale).unlink()
        for name in COPIED:  # each checked by _check_run: a plain file or absent
            if plain_file_exists(run_dir / name):
                write(out / name, _bounded_bytes(run_dir / name))
        for name in testsets:  # checked plain files (`_testset_files`): a symlink was refused, never followed
            write(out / name, _bounded_bytes(run_dir / name))
        new, replaced = new + (not existed), replaced + existed
    return new, replaced, left_out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", help="sweep dirs (runs/sweeps/<name>) or dirs holding them")
    parser.add_argument("--to", required=True, help="the archive (e.g. docs/ablations_mini_runs)")
    args = parser.parse_args(argv)
    from lifecycle.signals import exit_when_interrupted

    with exit_when_interrupted("archive_runs.py", "each file it archived is whole (written at once, or not at all),"
                               " the archive may lack runs: run the same command again to finish it"):
        return _archived(args)


def _archived(args: argparse.Namespace) -> int:
    """`main`'s work: each sweep's archive, one line each; 2 with one line on bad input."""
    if not args.to.strip():
        print("error: --to '' names no folder; valid: the archive folder, e.g. --to docs/ablations_mini_runs",
              file=sys.stderr)
        return 2
    try:
        check_path_text(args.to, "--to")
        for sweep_dir in [s for root in map(Path, args.dirs) for s in _sweep_dirs(root)]:
            new, replaced, left_out = archive_sweep(sweep_dir, Path(args.to), args.to)
            print(f"{sweep_dir} -> {Path(args.to) / sweep_dir.name}: {new} new, {replaced} replaced"
                  + (f", {len(left_out)} left out: {', '.join(left_out)}" if left_out else ""))
    except (ValueError, OSError) as err:  # TableError, and RunFileError from writing the archive
        print(f"error: {error_line(err)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    starting.imported()
    sys.exit(main())
