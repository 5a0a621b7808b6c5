"""Where the project may write: one rule for run dirs, sweep dirs, data and test-set roots, tables and archives.

A destination is judged by its real path (links followed), never by its text:
- it never lies inside another run's dir, so a run's files stay what the run wrote (a run dir may only be
  itself: a rerun writes into its own dir);
- it never lies inside a data root (a folder with a generator's completion marker, or the data root of the
  config at hand), where a new folder would become a class of the dataset;
- it is never a sweep's grid record (``multirun.yaml``, ``multirun.<n>.yaml``), which its tables and reruns read;
- a data root never lies inside a run dir or inside another data root;
- below a destination's own folder, nothing is written through a symlink: a link there could lead into
  another run or folder, and the copy would land there.

Every refusal is a `DestinationError`: one line naming the destination, what it lies inside, and what is valid.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from models.lifecycle.files import entry_exists
from models.lifecycle.records import CHECKPOINTS, CONFIG, METRICS, RUN_RECORD

# The completion marker data/generation.py writes at the top of a generated data root (and of a test set's).
DATA_MARKER = ".complete.json"


class DestinationError(ValueError):
    """A place the project must not write to; the message is one line."""


def is_run_dir(folder: Path) -> bool:
    """A run's dir: it has a run record, or a config beside a checkpoints folder or a metrics record (runs older
    than records, and their archived copies). A record counts whatever stands there (a FIFO, a folder, a link): a
    damaged run is still a run, never a place to write into."""
    return entry_exists(folder / RUN_RECORD) or (entry_exists(folder / CONFIG) and (
        (folder / CHECKPOINTS).is_dir() or entry_exists(folder / METRICS)))


# A sweep's grid records (Hydra's multirun.yaml; keep_earlier_grid's numbered copies)
SWEEP_GRID = re.compile(r"multirun(\.\d+)?\.yaml")


def is_data_root(folder: Path) -> bool:
    """A data root: it has a completion marker (of whatever kind, as a run's record above)."""
    return entry_exists(folder / DATA_MARKER)


def real(path: str | os.PathLike) -> Path:
    """``path`` with every existing link resolved (its missing tail kept as written), absolute."""
    return Path(os.path.realpath(os.path.abspath(os.fspath(path))))


def _first(folders: Iterable[Path], test) -> Path | None:
    return next((p for p in folders if test(p)), None)


def check_destination(path: str | os.PathLike, what: str, *, run_dir: bool = False, data_root: bool = False,
                      data_roots: Iterable[str | os.PathLike | None] = (),
                      given: str | os.PathLike | None = None) -> Path:
    """Refuse ``path`` (named ``what`` in the message, e.g. ``paths.log_dir/run_name``) as a place to write.

    ``run_dir``: ``path`` is a run's own dir, which may itself be a run dir (a rerun); any other destination
    may not be one. ``data_root``: ``path`` is a data root, which may itself hold a marker. ``data_roots``:
    the data roots of the config at hand, which nothing else may be written into. ``given``: the value the user
    typed, quoted in the message, where ``path`` is derived from it (the folder an output prefix writes into).
    Returns the real path.
    """
    target = real(path)
    typed = os.fspath(path if given is None else given)
    if SWEEP_GRID.fullmatch(target.name) and entry_exists(target):
        raise DestinationError(f"{what}={typed!r} is the grid record of the sweep {target.parent}, which its tables and"
                               " reruns read; valid: a file or folder of its own")
    inside_run = _first(target.parents if run_dir else (target, *target.parents), is_run_dir)
    if inside_run is not None:
        where = "is the run dir" if inside_run == target and given is None else "is inside the run dir"
        raise DestinationError(f"{what}={typed!r} {where} {inside_run}, whose files are that run's;"
                               " valid: a folder outside every run dir")
    inside_data = _first(target.parents if data_root else (target, *target.parents), is_data_root)
    if inside_data is None and not data_root:
        roots = [real(r) for r in data_roots if r is not None and str(r).strip()]
        inside_data = _first((target, *target.parents), lambda p: p in roots)
    if inside_data is not None:
        where = "is the data root" if inside_data == target and given is None else "is inside the data root"
        raise DestinationError(f"{what}={typed!r} {where} {inside_data}, where a new folder would become"
                               " part of the dataset; valid: a folder outside every data root")
    return target


def check_generated_root(data: Any, path: str | os.PathLike | None = None) -> str | None:
    """The root the data config ``data`` (a run's ``cfg.data``) would generate data into, when it names a
    generator, checked as a data root (`check_destination`), and returned; None when it generates nothing.
    Every command that may generate calls this before anything is made for the root: its folders, or the
    generation lock beside it. ``path``: where the job will find ``data.root`` (a relative root resolved
    from another working dir), where that is not this process's reading of it."""
    root = data.get("root") if hasattr(data, "get") else None
    if root is None or data.get("generator") is None:
        return None
    shown = None if path is None or os.fspath(path) == str(root) else str(root)
    check_destination(str(root) if path is None else path, "data.root", data_root=True, given=shown)
    return str(root)


def check_no_links_below(root: str | os.PathLike, target: str | os.PathLike, what: str) -> None:
    """Refuse writing ``target`` when a folder or file between ``root`` (itself may be a link) and ``target``
    is a symlink: the write would land wherever the link leads."""
    base = Path(os.path.abspath(os.fspath(root)))
    current = base
    for part in Path(os.path.abspath(os.fspath(target))).relative_to(base).parts:
        current = current / part
        if current.is_symlink():
            raise DestinationError(f"{what}: {current} is a symlink (to {os.readlink(current)}); writing through it"
                                   f" would land outside {base}; valid: move the link away")


def save_export(checkpoint: dict[str, Any], path: str | os.PathLike, what: str, error: type[Exception]) -> Path:
    """``torch.save`` ``checkpoint`` to ``path`` atomically, for an exporter named ``what``
    (``to_rope_vit_checkpoint``). An export is a destination like any other: a ``path`` inside a run's dir or a
    data root is one ``error`` line, and nothing is written."""
    import io

    import torch

    from models.lifecycle.files import atomic_write_bytes

    path = Path(path)
    try:
        check_destination(path, f"{what} path")
    except DestinationError as err:
        raise error(str(err)) from None
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    atomic_write_bytes(path, buffer.getvalue())
    return path
