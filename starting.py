"""Ctrl-C (or SIGTERM, SIGHUP) while train.py, eval.py or a script starts: the imports (torch, Lightning) take
seconds, and Python's own SIGINT handling would end them with a ``KeyboardInterrupt`` traceback through the import
machinery (SIGTERM and SIGHUP without a line at all).

The first import of those entry points, so it uses the standard library only: `guard_imports` makes each of them
one line and exit 128 + the signal's number (as a shell reports it) until `imported` hands them back, to Python's
``KeyboardInterrupt`` and the handlers the command-line checks, Lightning and the run lifecycle install.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

# The stop signals taken while the imports run, each with the handler it had before (`imported` gives it back)
_TAKEN: dict[int, Any] = {}


def _interrupted(signum: int, frame: Any) -> None:
    try:
        print(f"error: interrupted by {signal.Signals(signum).name} while starting, before anything was checked or"
              " written: run the same command again", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # a closed terminal: the exit code still tells
        pass
    raise SystemExit(128 + signum)


# What marks a folder as results or data (`storage.destinations`): a run's record, a sweep's grid, a generated data
# root's completion marker, an archive's marker
_MARKED = {"run.json": "run dir", "multirun.yaml": "sweep dir", ".complete.json": "data root",
           ".archive.json": "archive", ".testsets.json": "folder of the test sets' own data"}


def temp_dir_problem() -> str | None:
    """Why the temp dir (the first of ``TMPDIR``, ``TEMP``, ``TMP`` that is set, as Python's `tempfile` takes it)
    cannot be used, or None: it lies inside a run dir, a sweep dir, a data root or an archive, where Lightning's
    import would make torch's cache folder before any check ran (a refused command left one in a test set's
    root). Only the standard library: it runs before those imports."""
    import os

    name = next((n for n in ("TMPDIR", "TEMP", "TMP") if os.environ.get(n)), None)
    if name is None:
        return None
    given = os.environ[name]
    folder = os.path.realpath(given)
    while True:
        kind = next((kind for marker, kind in _MARKED.items() if os.path.lexists(os.path.join(folder, marker))),
                    None) or ("data root" if _laid_out_as_data(folder) else None)
        if kind is not None:
            return (f"{name}={given!r} lies in the {kind} {folder}, and torch and Lightning write their caches"
                    f" into the temp dir as they start; valid: set {name} to a folder of its own (e.g. /tmp)")
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


# What a class folder's images are named (torchvision's image extensions)
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def _laid_out_as_data(folder: str) -> bool:
    """Whether ``folder`` is laid out as a dataset without a marker (hand data): ImageFolder's ``train/`` and
    ``val/`` with a class folder of images, or COCO's ``annotations/`` beside an image folder. A few listings."""
    import os

    if os.path.isdir(os.path.join(folder, "annotations")) and any(
            os.path.isdir(os.path.join(folder, split)) for split in ("train2017", "val2017")):
        return True
    if not all(os.path.isdir(os.path.join(folder, split)) for split in ("train", "val")):
        return False
    try:
        with os.scandir(os.path.join(folder, "train")) as classes:
            for entry in classes:
                if entry.is_dir() and not entry.name.startswith("."):
                    with os.scandir(entry.path) as images:
                        return any(e.name.lower().endswith(_IMAGE_SUFFIXES) for e in images)
    except OSError:
        return False
    return False


def guard_imports(name: str) -> None:
    """From now on SIGINT is one line and exit 130, where ``name`` (the caller's ``__name__``) says it runs as a
    script; a module that merely imports it (a test) keeps Python's handling. An ignored SIGINT stays ignored.
    A script whose temp dir lies among results or data (`temp_dir_problem`) ends here, with one line and exit 2."""
    if name != "__main__":
        return
    problem = temp_dir_problem()
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr, flush=True)
        raise SystemExit(2)
    # SIGTERM and SIGHUP (a scheduler's or a closed terminal's stop) would end the imports without a line; an
    # ignored signal stays ignored
    for signum, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL),
                            (signal.SIGHUP, signal.SIG_DFL)):
        if signal.getsignal(signum) is default:
            _TAKEN[signum] = default
            signal.signal(signum, _interrupted)


def imported() -> None:
    """The imports are done: each stop signal `guard_imports` took gets its handler back (SIGINT raises
    ``KeyboardInterrupt`` again), for the command-line checks, Lightning and the run lifecycle."""
    for signum, handler in _TAKEN.items():
        if signal.getsignal(signum) is _interrupted:
            signal.signal(signum, handler)
    _TAKEN.clear()
