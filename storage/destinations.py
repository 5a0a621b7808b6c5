"""Where the project may write: one rule for run dirs, sweep dirs, data and test-set roots, tables and archives.

A destination is judged by its real path (links followed), its text only for the characters it holds:
- it never lies inside another run's dir, so a run's files stay what the run wrote (a run dir may only be
  itself: a rerun writes into its own dir);
- it never lies inside a data root (a folder with a generator's completion marker, a folder laid out as a
  dataset: ImageFolder's ``train/`` or ``val/`` of class folders of images, or COCO's image folders beside their
  annotations, or the data root of the config at hand), where a new folder would become a class of the dataset
  and any file would change its fingerprint;
- a run's or a sweep's dir never lies inside an archive of runs (`ARCHIVE_MARKER`), whose records without
  checkpoints would pass for finished jobs while new jobs wrote checkpoints beside them; neither, nor a data
  root, lies anywhere in a folder archive_runs keeps archived sweeps in (its folders are read as archived);
- the path as typed holds no control or format character (a newline, a tab, a right-to-left override), which
  would make every listing and report line of it lie, and each folder it would make is named in Unicode's
  composed form (NFC) and is no twin of a folder beside it in that form (two folders that print alike);
- it is never a sweep's grid record (``multirun.yaml``, ``multirun.<n>.yaml``), which its tables and reruns read;
- an archive of a sweep never lies inside another sweep's dir, whose tables would count its runs;
- a data root never lies inside a run dir, inside another data root, inside a sweep dir (whose folders are its
  jobs') or inside an archive;
- below a destination's own folder, nothing is written through a symlink: a link there could lead into
  another run or folder, and the copy would land there.

Every refusal is a `DestinationError`: one line naming the destination, what it lies inside, and what is valid.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from data.coco import has_coco_layout
from data.datamodule import has_image_folder_layout
from data.errors import absent_folder
from storage.files import entry_exists, symlink_loop
from storage.run_dir import CHECKPOINTS, CONFIG, METRICS, RUN_RECORD

# The completion marker data/generation.py writes at the top of a generated data root (and of a test set's).
DATA_MARKER = ".complete.json"
# The marker scripts/archive_runs.py writes into each sweep it archives: the folder keeps records, not a live sweep.
ARCHIVE_MARKER = ".archive.json"
# The marker scripts/archive_runs.py writes into its ``--to`` folder (and the committed archives carry in every folder
# above their archived sweeps): a folder of archived sweeps, where no run, sweep or data folder is made.
ARCHIVES_MARKER = ".archives.json"
# The marker generate_testsets writes into the folder of the test sets' own data (<paths.data_dir>/testsets): its
# folders are test sets' data, named by their definitions, where nothing else is written.
TESTSETS_MARKER = ".testsets.json"


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


def sweep_dir_of(folder: Path) -> Path | None:
    """The sweep dir ``folder`` is or lies in (a folder holding a sweep's grid, ``multirun.yaml``: an earlier
    grid's numbered copy is only ever kept beside it), or None."""
    return _first((folder, *folder.parents), lambda p: entry_exists(p / "multirun.yaml"))


def is_data_root(folder: Path) -> bool:
    """A data root: it has a completion marker (of whatever kind, as a run's record above), or it is laid out
    as a dataset the data modules read (a hand-made or downloaded one has no marker): a few listings, no walk."""
    return entry_exists(folder / DATA_MARKER) or has_image_folder_layout(folder) or has_coco_layout(folder)


def is_testsets_folder(folder: Path) -> bool:
    """The folder of the test sets' own data: it has the marker generate_testsets writes (of whatever kind)."""
    return entry_exists(folder / TESTSETS_MARKER)


def is_archive(folder: Path) -> bool:
    """An archived sweep (scripts/archive_runs.py): it has the archive marker (of whatever kind)."""
    return entry_exists(folder / ARCHIVE_MARKER)


def is_archives_folder(folder: Path) -> bool:
    """A folder of archived sweeps: it has archive_runs' folder marker, or an archived sweep right inside it (an
    archive made before that marker)."""
    return entry_exists(folder / ARCHIVES_MARKER) or archived_sweep_in(folder) is not None


def archived_sweep_in(folder: Path, most: int = 10_000) -> Path | None:
    """An archived sweep right inside ``folder`` (archive_runs' ``--to`` folder keeps them side by side), or None;
    at most ``most`` entries are looked at, so a huge folder is not listed in full. A link to an archived sweep
    elsewhere is no archive of this folder's (a workspace may link the archive it reads)."""
    try:
        with os.scandir(folder) as entries:
            for count, entry in enumerate(entries):
                if count >= most:
                    return None
                if not entry.is_symlink() and is_archive(Path(entry.path)):
                    return Path(entry.path)
    except OSError:
        return None  # an unlisted folder: the checks that make the dir name it
    return None


def live_folder_below(folder: Path, most: int = 50_000) -> str | None:
    """What makes ``folder`` no folder to mark as one of archived sweeps, or None: a run dir, sweep dir or data root
    at or below it that lies in no archived sweep there (a run there could no longer be resumed, and would be read
    as archived), or more than ``most`` folders outside archived sweeps (too large to be an archive's folder, and
    to check). Links are not followed and archived sweeps not entered."""
    seen = 0
    for root, dirs, _ in os.walk(folder):
        here = Path(root)
        if is_archive(here):
            dirs[:] = []
            continue
        if is_run_dir(here) or entry_exists(here / "multirun.yaml") or is_data_root(here):
            return f"{here}, a run, sweep or data folder that is no archived sweep"
        seen += 1
        if seen > most:
            return f"more than {most} folders outside archived sweeps"
    return None


def hidden_character(text: str) -> str | None:
    """The first control or format character of ``text`` (a newline, a tab, a right-to-left override), or None:
    in a file or folder name such a character makes every listing and log line of it lie."""
    return next((c for c in text if unicodedata.category(c) in ("Cc", "Cf")), None)


def check_path_text(text: str, what: str) -> None:
    """Refuse ``text``, a path the user gave for ``what`` (``--out``), when it holds a control or format
    character (`hidden_character`): one `DestinationError` line, the text shown escaped."""
    char = hidden_character(text)
    if char is not None:
        raise DestinationError(f"{what}={text!r} holds the control or format character {char!r}, which makes"
                               " every listing and report line of it lie; valid: a path without control or format"
                               " characters (no newline, tab or right-to-left mark)")


def real(path: str | os.PathLike) -> Path:
    """``path`` with every existing link resolved (its missing tail kept as written), absolute."""
    return Path(os.path.realpath(os.path.abspath(os.fspath(path))))


def _first(folders: Iterable[Path], test) -> Path | None:
    return next((p for p in folders if test(p)), None)


def system_reading(path: str | os.PathLike) -> Path | None:
    """Where the system reads ``path`` when a ``..`` in it follows a link (it goes up from the link's target), if
    that differs from the path made absolute first (which drops the link and its ``..``); else None."""
    physical = Path(os.path.realpath(os.fspath(path)))
    return None if physical == real(path) else physical


def refuse_dot_dot_after_link_read(path: str | os.PathLike, what: str, typed: str | None = None) -> None:
    """Refuse ``path``, a run or checkpoint to read (``what``: a key, ``ckpt_path``, or words), where a ``..``
    follows a link: its readers take it apart lexically (a run dir is the checkpoint's folder's parent, a run's
    name its last part), so a line would name a folder the system never reads. One `DestinationError` line
    offering the system's reading."""
    physical = system_reading(path)
    if physical is not None:
        typed = os.fspath(path) if typed is None else typed
        joint = " " if " " in what else "="  # a key (ckpt_path=...) or words (the run dir ...)
        raise DestinationError(f"{what}{joint}{typed!r} has '..' after a link: the system reads it as {physical}, a"
                               f" path made absolute first as {real(path)}, and the two name different folders;"
                               f" valid: {what}{joint}{physical}")


def refuse_dot_dot_after_link(path: str | os.PathLike, what: str, typed: str,
                              check: Callable[[Path], Any]) -> None:
    """Refuse ``path`` (typed as ``typed`` for the key ``what``) where a ``..`` follows a link: the system goes up
    from the link's target, a path made absolute first drops the link and its ``..``, so a write would land in
    either. The system's reading is offered as the valid path only where ``check`` (the rule the destination
    is held to, raising `DestinationError`) accepts it: never a run dir or a dataset's folder."""
    target, physical = real(path), system_reading(path)
    if physical is None:
        return
    try:
        check(physical)
        valid = f"the path without '..' after a link, e.g. {physical}"
    except DestinationError:
        valid = f"a path without '..' after a link ({physical} itself may not be written either)"
    raise DestinationError(f"{what}={typed!r} has '..' after a link: the system reads it as {physical}, a path made"
                           f" absolute first reads it as {target}, so a write would land in either; valid: {valid}")


def refuse_unnormalised_names(root: Path, parts: Iterable[str], given: str) -> None:
    """Each folder of ``root/parts`` still to be made is named in Unicode's composed form (NFC), and no folder
    beside it has a name equal to it in that form: 'ü' as one character and as 'u' plus a combining mark are
    two folders that print alike, so two runs (or sweeps) could not be told apart in a listing or a table."""
    folder, made = root, True
    for part in parts:
        here = folder / part
        if made and os.path.lexists(here):
            folder = here
            continue  # an existing folder is used as it is named (a rerun)
        composed = unicodedata.normalize("NFC", part)
        if part != composed:
            raise DestinationError(f"{given}: the name {part!r} (spelled {ascii(part)}) is not in Unicode's composed"
                                   f" form (NFC), and prints like {ascii(composed)}, another name to the file system;"
                                   f" valid: the composed spelling {ascii(composed)}")
        if made:
            try:
                names = os.listdir(folder)
            except OSError:
                names = []  # an unlisted folder: the checks that make the dir name it
            twin = next((n for n in names if n != part and unicodedata.normalize("NFC", n) == composed), None)
            if twin is not None:
                raise DestinationError(f"{given}: {folder / twin} exists, whose name ({ascii(twin)}) differs from"
                                       f" {ascii(part)} only in Unicode normalisation (the two print alike); valid:"
                                       " that folder's name as it is spelled, to use it, or another name")
        folder, made = here, False


def check_destination(path: str | os.PathLike, what: str, *, run_dir: bool = False, data_root: bool = False,
                      data_roots: Iterable[str | os.PathLike | None] = (),
                      given: str | os.PathLike | None = None, trains: bool = False, archive: bool = False) -> Path:
    """Refuse ``path`` (named ``what`` in the message, e.g. ``paths.log_dir/run_name``) as a place to write.

    ``run_dir``: ``path`` is a run's own dir, which may itself be a run dir (a rerun); any other destination
    may not be one. ``data_root``: ``path`` is a data root, which may itself be one (a marker, or its layout).
    ``data_roots``: the data roots of the config at hand, which nothing else may be written into. ``given``:
    the value the user typed, quoted in the message, where ``path`` is derived from it (the folder an output
    prefix writes into). ``trains``: runs train at ``path`` (a run's or a sweep's dir), never inside an archive.
    ``archive``: ``path`` is an archived sweep's folder, which never lies inside another sweep's dir (that
    sweep's tables would count the archived runs as its own); nothing else is written inside an archive. Returns
    the real path.
    """
    typed = os.fspath(path if given is None else given)
    data_roots = tuple(data_roots)  # read by the check of the system's reading of a `..` too
    check_path_text(typed, what)
    loop = symlink_loop(Path(os.path.abspath(os.fspath(path))))  # every open below it: ELOOP
    if loop is not None:
        raise DestinationError(f"{what}={typed!r} cannot be used: {loop} {absent_folder(loop)}; valid: a path"
                               " whose folders hold no link loop")
    absolute = Path(os.path.abspath(os.fspath(path)))
    refuse_unnormalised_names(Path(absolute.anchor), absolute.parts[1:], f"{what}={typed!r}")
    target = real(path)
    refuse_dot_dot_after_link(path, what, typed, lambda physical: check_destination(
        physical, what, run_dir=run_dir, data_root=data_root, data_roots=data_roots, trains=trains, archive=archive))
    if SWEEP_GRID.fullmatch(target.name) and entry_exists(target):
        raise DestinationError(f"{what}={typed!r} is the grid record of the sweep {target.parent}, which its tables and"
                               " reruns read; valid: a file or folder of its own")
    inside_run = _first(target.parents if run_dir else (target, *target.parents), is_run_dir)
    if inside_run is not None:
        where = "is the run dir" if inside_run == target and given is None else "is inside the run dir"
        raise DestinationError(f"{what}={typed!r} {where} {inside_run}, whose files are that run's;"
                               " valid: a folder outside every run dir")
    testsets = None if data_root else _first((target, *target.parents), is_testsets_folder)
    if testsets is not None:  # a test set's data is made there under its definition's name
        where = "is the folder" if testsets == target and given is None else "is inside the folder"
        raise DestinationError(f"{what}={typed!r} {where} {testsets} of the test sets' own data, whose folders are"
                               " test sets' data named by their definitions; valid: a folder outside it")
    inside_data = _first(target.parents if data_root else (target, *target.parents), is_data_root)
    if inside_data is None and not data_root:
        roots = [real(r) for r in data_roots if r is not None and str(r).strip()]
        inside_data = _first((target, *target.parents), lambda p: p in roots)
    if inside_data is not None:
        where = "is the data root" if inside_data == target and given is None else "is inside the data root"
        raise DestinationError(f"{what}={typed!r} {where} {inside_data}, where a new folder would become"
                               " part of the dataset; valid: a folder outside every data root")
    kept = _first((target, *target.parents), is_archive) if data_root else None
    if kept is not None:  # archive_runs would keep the folder among the archived runs' records
        where = "is the archive" if kept == target else "is inside the archive"
        raise DestinationError(f"{what}={typed!r} {where} {kept}, which keeps finished runs' records: no place for"
                               " data; valid: a folder outside every archive")
    sweep = sweep_dir_of(target) if data_root else None
    if sweep is not None:  # its folders are its jobs' (the tables and archive_runs read them as such)
        raise DestinationError(f"{what}={typed!r} is inside the sweep dir {sweep}, whose folders are its jobs';"
                               " valid: a folder outside every sweep dir")
    kept = _first((target, *target.parents), is_archive) if trains else None
    if kept is not None:
        where = "is the archive" if kept == target else "is inside the archive"
        raise DestinationError(f"{what}={typed!r} {where} {kept}, which keeps finished runs' records without"
                               " checkpoints: an archive; valid: train into the live sweep dir, then archive again")
    kept = _first((target, *target.parents), is_archive) if not archive else None
    if kept is not None:  # only archive_runs writes there: its folders are finished runs' records, kept as archived
        where = "is the archive" if kept == target and given is None else "is inside the archive"
        raise DestinationError(f"{what}={typed!r} {where} {kept}, which keeps finished runs' records as archive_runs"
                               " copied them; valid: a folder outside every archive")
    folders = target.parents if trains or data_root else ()  # a table or plot file beside them is no folder of runs
    holder = _first(folders, is_archives_folder)
    if holder is not None:  # archive_runs' --to folder: its folders are read as archived sweeps
        raise DestinationError(f"{what}={typed!r} lies in the folder {holder} of archived sweeps: archive_runs keeps"
                               " them there, and its folders are read as finished runs' records; valid: a folder"
                               " outside every archive (e.g. runs/)")
    sweep = _first(target.parents, lambda p: entry_exists(p / "multirun.yaml")) if archive else None
    if sweep is not None:
        raise DestinationError(f"{what}={typed!r} is inside the sweep dir {sweep}, whose tables would count the"
                               " archived runs as its own; valid: a folder outside every sweep dir (e.g."
                               " docs/ablations_mini_runs)")
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

    from storage.files import atomic_write_bytes

    path = Path(path)
    try:
        check_destination(path, f"{what} path")
    except DestinationError as err:
        raise error(str(err)) from None
    from storage.files import RunFileError, check_plain_file

    try:  # a FIFO, folder or device there is not a file to replace; a link would be replaced by a file
        check_plain_file(path)
    except RunFileError as err:
        raise error(f"{what} path: {err}") from None
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    atomic_write_bytes(path, buffer.getvalue())
    return path
