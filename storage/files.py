"""The one layer through which a run's records and checkpoints are written and read.

Every operating-system error (a full disk, read-only storage, a directory where a file belongs, a run dir
deleted under a running job) becomes a `RunFileError`: one line naming the path and the reason, never a
traceback. Writes are atomic (a temporary file next to the target, flushed and renamed), and a write never
creates a missing run dir: a run dir that vanished while its job ran is reported, not silently remade
half-empty.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from data.bounded_json import MAX_JSON_BYTES, MAX_YAML_BYTES, JsonBoundsError, loads_bounded, read_json_bytes

TMP_SUFFIX = ".tmp"  # temporary files of atomic writes: ``.<name>.<random>.tmp`` next to the target


class RunFileError(ValueError):
    """A run file that cannot be read or written; the message is one line naming the path."""


def _reason(err: OSError, reading: bool = False) -> str:
    """Why ``err`` happened, in words; ``reading``: the path was only read (no storage to blame)."""
    if err.errno == errno.ENOSPC:
        return "no space left on the device"
    if err.errno == errno.EROFS:
        return "the storage is read-only or not writable"
    if err.errno in (errno.EACCES, errno.EPERM) and reading:
        return "permission denied (a file or folder of the path this user may not read)"
    if err.errno in (errno.EACCES, errno.EPERM):
        return "permission denied (read-only storage, or a file or folder of the path this user may not use)"
    if err.errno == errno.ELOOP:
        return "its path leads through a symlink loop"
    if err.errno == errno.EISDIR:
        return "it is a directory, where a file belongs"
    if err.errno == errno.ENOTDIR:
        return "a file is in the place of one of its folders"
    if err.errno == errno.ENAMETOOLONG:
        return "the name is too long for the file system"
    return err.strerror or type(err).__name__


def writable_folder(path: str | os.PathLike) -> bool:
    """Whether this process may make files in the folder ``path``, judged by its effective ids and capabilities
    as an open would be (and false on read-only storage); nothing is written."""
    effective = os.access in os.supports_effective_ids
    return os.access(path, os.W_OK | os.X_OK, effective_ids=effective)


def closed_folder(path: str | os.PathLike) -> Path | None:
    """The first folder on ``path`` (from the top, ``path`` itself left out) that this process may not look
    into (no search permission), else None: what a permission error on ``path`` is about when the user gave
    only the folder (a run dir under a locked folder, looked at for its records)."""
    effective = os.access in os.supports_effective_ids
    for folder in reversed(Path(os.path.abspath(path)).parents):
        if os.path.isdir(folder) and not os.access(folder, os.X_OK, effective_ids=effective):
            return folder
    return None


def os_error_line(err: OSError, reading: bool = False) -> str:
    """One line naming the path of an operating-system error (``cannot use <path>: <reason>``); a permission
    error names the folder of the path that may not be looked into, where one is. ``reading``: the path was only
    to be read (data, a file given to read), so reading is all the remedy asks for."""
    closed = closed_folder(err.filename) if err.filename is not None and err.errno in (errno.EACCES,
                                                                                       errno.EPERM) else None
    access = "read (chmod u+rx)" if reading else "read and write (chmod u+rwx)"
    if closed is not None:
        return (f"cannot use {closed}: permission denied (a folder this user may not look into); valid: a folder"
                f" this user may {access}, or another")
    where = f" {err.filename}" if err.filename is not None else ""
    return f"cannot use{where}: {_reason(err, reading)}"


def input_error_line(err: OSError, valid: str) -> str:
    """One line for an input file a command cannot read: `os_error_line` (for reading), and ``valid`` (what to give
    instead) where that line does not already name a folder to open up."""
    line = os_error_line(err, reading=True)
    return line if "; valid: " in line else f"{line}; valid: {valid}"


def error_line(err: BaseException) -> str:
    """One line for an error a command reports: an operating-system error as `os_error_line` (the path it could not
    use and why, never Python's ``[Errno 13] ...`` text), any other error's own text on one line."""
    if isinstance(err, OSError) and not isinstance(err, RunFileError) and err.errno is not None:
        return os_error_line(err)
    return " ".join(str(err).split()) or type(err).__name__


@contextlib.contextmanager
def guarded(path: str | os.PathLike, action: str) -> Iterator[None]:
    """Turn an ``OSError`` inside the block into a one-line `RunFileError` (``cannot <action> <path>: ...``)."""
    try:
        yield
    except RunFileError:
        raise
    except OSError as err:
        raise RunFileError(f"cannot {action} {path}: {_reason(err)}") from None


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a folder's entries (a rename into it) to disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_durably(tmp: str | os.PathLike, path: Path) -> None:
    """Flush ``tmp``, give it the mode ``path`` is to have (`_mode_for`), rename it over ``path`` and flush the
    folder: after a crash, old or new, never half."""
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
        os.fchmod(f.fileno(), _mode_for(path))
    os.replace(tmp, path)
    fsync_dir(path.parent)


def temp_path_for(path: Path) -> str:
    """A new temporary file next to ``path`` (closed, empty, this user's alone until `replace_durably` gives it
    its mode) for an atomic write of it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    os.close(fd)
    return tmp


def _mode_for(path: Path) -> int:
    """The permission bits a file written at ``path`` gets: those of the plain file it replaces where its owner
    may read it (a read-only README stays read-only; a record damaged to mode 000 is written readable again),
    else what ``open`` gives a new file under the process's umask. mkstemp's 0600 made every record private."""
    try:
        st = os.stat(path, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode) and st.st_mode & stat.S_IRUSR:
            return stat.S_IMODE(st.st_mode)
    except OSError:
        pass
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_bytes(path: str | os.PathLike, payload: bytes, make_parents: bool = True) -> None:
    """Write ``payload`` to ``path`` so that readers see the old file or the new one, never half.

    ``make_parents=False`` writes only into a folder that exists (a run dir's records: a vanished run dir is
    an error, not a folder to recreate).
    """
    path = Path(path)
    with guarded(path, "write"):
        if make_parents:
            blocker = next((p for p in (path.parent, *path.parent.parents) if p.exists() and not p.is_dir()), None)
            if blocker is not None:
                raise RunFileError(f"cannot write {path}: {blocker} is a file, where a folder belongs")
            path.parent.mkdir(parents=True, exist_ok=True)
        elif not path.parent.is_dir():
            raise RunFileError(f"cannot write {path}: its folder {path.parent} no longer exists "
                               "(was the run dir moved or deleted while the job ran?)")
        if path.is_symlink() or path.is_dir():
            raise RunFileError(f"cannot write {path}: {describe_non_file(path)}, where a plain file belongs")
        tmp = temp_path_for(path)
        try:
            with open(tmp, "wb") as f:
                f.write(payload)
            replace_durably(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def atomic_write_json(path: str | os.PathLike, data: Any, make_parents: bool = True) -> None:
    """Strict JSON (a NaN or inf raises ``ValueError`` instead of writing invalid JSON), atomically."""
    text = json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"
    atomic_write_bytes(path, text.encode(), make_parents=make_parents)


CHECKSUM = "checksum"  # the key of a result file's own checksum (`with_checksum`)


def content_checksum(record: dict[str, Any]) -> str:
    """A hash of ``record`` without its checksum key: JSON numbers read back as they were written, so the hash
    of the record as read equals the one written unless a value was changed."""
    content = {k: v for k, v in record.items() if k != CHECKSUM}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def with_checksum(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its checksum, for a result file: a number edited afterwards no longer matches."""
    return {**record, CHECKSUM: content_checksum(record)}


def checksum_problem(record: dict[str, Any]) -> str:
    """Why ``record`` (a result file as read) is not as its writer left it, or ''."""
    if CHECKSUM not in record:
        return "it has no checksum, which every result file the run writes has (copied from elsewhere, or written" \
               " by an older version?)"
    if record[CHECKSUM] != content_checksum(record):
        return "its content does not match its checksum: it was changed after the run wrote it"
    return ""


def describe_non_file(path: Path) -> str:
    """What stands at ``path`` instead of a plain file: a symlink, a directory, a device..."""
    if path.is_symlink():
        target = os.readlink(path)
        try:
            os.stat(path)
        except OSError as err:
            if err.errno == errno.ELOOP:
                return f"it is a symlink loop (to {target}: its links lead back to themselves)"
            if err.errno in (errno.ENOENT, errno.ENOTDIR):
                return f"it is a symlink (to {target}, which does not exist)"
            raise  # its target cannot be looked at (a folder this user may not read): the caller's to name
        return f"it is a symlink (to {target})"
    if path.is_dir():
        return "it is a directory"
    if path.is_file():
        return "it is a file"
    if path.is_char_device() or path.is_block_device():
        return "it is a device"
    if path.is_fifo():
        return "it is a FIFO (named pipe)"
    if path.is_socket():
        return "it is a socket"
    return "it is not a plain file"


def missing_file(path: str | os.PathLike) -> str | None:
    """Why no file (links followed) is at ``path``, in words after its name: ``does not exist``, or ``is not a
    file: it is a FIFO (named pipe)`` where something else stands there (a folder, a device, a symlink loop);
    None where a regular file is. Nothing is opened: a FIFO would block the reader."""
    path = Path(path)
    if path.is_file():
        return None
    if not entry_exists(path):
        return "does not exist"
    if path.is_symlink() and os.path.exists(path):  # a link to a folder or a FIFO: name what it leads to
        target = Path(os.path.realpath(path))
        return f"is not a file (it leads to {target}): {describe_non_file(target)}"
    return f"is not a file: {describe_non_file(path)}"


def entry_exists(path: str | os.PathLike) -> bool:
    """Whether anything (a file, folder, link, dangling link, FIFO) stands at ``path``. ``False`` only when
    nothing is there; a path that cannot be looked at (a folder of it this user may not read) raises the
    ``OSError``, where ``os.path.lexists`` would call it absent and a run dir behind it would pass for none."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def unreadable_folder(folder: str | os.PathLike, err: OSError) -> RunFileError:
    """The one line for ``folder``, which run discovery may not look into (``err``, from listing it or from
    looking at an entry in it): never taken for a folder without runs."""
    why = "permission denied" if err.errno in (errno.EACCES, errno.EPERM) else _reason(err)
    return RunFileError(f"{folder}: a folder that cannot be looked into ({why}), so the runs in it, if any, cannot"
                        " be listed; make it readable (chmod u+rx) or move it away")


def entries_named(root: str | os.PathLike, *names: str,
                  leaf: Callable[[Path], bool] | None = None) -> list[Path]:
    """Every entry below ``root`` (``root``'s own included) whose name is one of ``names``, or, for a name like
    ``.hydra/config.yaml``, whose last parts are those, sorted: what ``Path.rglob`` finds (links to folders not
    followed). Where ``rglob`` skips a folder it may not look into without a word, so that the runs in it pass for
    none, this raises a `RunFileError` naming the folder: the run discovery of make_tables, archive_runs and
    evaluate_testsets goes through here. A folder for which ``leaf`` is true has its own entries looked up but is
    not descended into: a run dir, since runs never nest, so that a run's unreadable ``checkpoints/`` is that
    run's business (its reader reports it), not a reason to stop the discovery of every run."""
    found: list[Path] = []

    def refuse(err: OSError) -> None:
        if isinstance(err, (FileNotFoundError, NotADirectoryError)):  # gone while walked, or not a folder: none
            return
        raise unreadable_folder(err.filename, err) from err

    for folder, dirs, files in os.walk(root, onerror=refuse):
        here = Path(folder)
        is_leaf = leaf is not None and leaf(here)
        for name in names:
            first = Path(name).parts[0]
            if first != name:  # e.g. .hydra/config.yaml: looked up where its first folder is (a link to one too)
                try:
                    if first in dirs and entry_exists(here / name):
                        found.append(here / name)
                except OSError as err:
                    if not is_leaf:
                        raise unreadable_folder(here / first, err) from err
                    found.append(here / name)  # a run's own folder: its reader names what it cannot read
            elif name in files or name in dirs:
                found.append(here / name)
        if is_leaf:
            dirs.clear()  # os.walk goes top-down: an emptied list is not descended into
    return sorted(set(found))


def own_folder_problem(folder: Path, what: str) -> str:
    """Why ``folder`` cannot be a run's own folder of ``what`` (``test-set results``), without its path; ''
    when it is absent or a real folder. A symlink is to be replaced by a real folder, never followed or
    cleared: what it leads to may be another run's folder."""
    if not entry_exists(folder):
        return ""
    if folder.is_symlink():
        return (f"it is a symlink (to {os.readlink(folder)}), where the run's own folder of {what} belongs; replace"
                " the link with a real folder (remove the link itself: what it leads to is not this run's, it may"
                " be another run's folder)")
    if not folder.is_dir():
        return f"{describe_non_file(folder)}, where the run's own folder of {what} belongs; move it away"
    return ""


def check_plain_file(path: Path) -> None:
    """Raise `RunFileError` unless ``path`` is absent or a plain file (not a symlink, folder, FIFO or device).

    A run's records are its own: a symlink could point into another run dir, and a folder or a device
    would fail only when the record is written, possibly after hours of training.
    """
    plain_file_exists(path)


def plain_file_exists(path: str | os.PathLike, follow_links: bool = False) -> bool:
    """Whether a plain file is at ``path``: ``False`` only when nothing is there. Anything else there (a
    folder, a FIFO, a socket, a device, or a symlink unless ``follow_links``, then what it leads to) is a
    `RunFileError` in one line: there, but not a plain file. Every reader of a run file asks here, not
    ``Path.is_file()``, which calls such a file missing. Nothing is opened: a FIFO would block the reader.
    """
    path = Path(path)
    with guarded(path, "read"):
        if not entry_exists(path):
            return False
        linked = follow_links and path.is_symlink() and os.path.exists(path)  # a dangling link is named as one
        info = os.stat(path) if linked else os.lstat(path)
    if stat.S_ISREG(info.st_mode):
        return True
    what = describe_non_file(Path(os.path.realpath(path)) if linked else path)
    where = f" (it leads to {os.path.realpath(path)})" if linked else ""
    raise RunFileError(f"{path} cannot be used{where}: {what}, where a plain file belongs; move it away")


def read_json(path: Path, kind: type = dict) -> Any | None:
    """The JSON value of ``path``, which must be a ``kind``; ``None`` when absent. Every JSON record of a run
    (and a data root's completion marker) is read through here or `read_json_bytes` + `loads_bounded`.

    A damaged file (empty, truncated, not JSON, the wrong JSON type, past the bounds of `data.bounded_json`,
    unreadable) is a one-line `RunFileError` naming it: the caller decides whether to repair it or refuse,
    never to trust it.
    """
    check_plain_file(path)
    if not path.exists():
        return None
    try:
        with guarded(path, "read"):
            text = read_json_bytes(path)
        value = loads_bounded(text)
    except JsonBoundsError as err:
        raise RunFileError(f"{path} is damaged: {err}") from None
    except json.JSONDecodeError as err:
        what = "empty" if not text.strip() else f"not valid JSON ({err.msg} at byte {err.pos})"
        raise RunFileError(f"{path} is damaged: {what}") from None
    except UnicodeDecodeError as err:
        raise RunFileError(f"{path} is damaged: not valid JSON (not text: {err.reason} at byte {err.start})") from None
    if not isinstance(value, kind):
        raise RunFileError(f"{path} is damaged: it holds a JSON {type(value).__name__}, not a {kind.__name__}")
    return value


def read_bounded_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of a run's or a sweep's text record (``config.yaml``, ``multirun.yaml``), a plain file no larger
    than any record the project writes (`data.bounded_json.MAX_YAML_BYTES` for YAML, else ``MAX_JSON_BYTES``): a
    larger one (a damaged or sparse file) is a one-line `RunFileError`, never read whole. ``OSError`` is the
    caller's to report."""
    path = Path(path)
    check_plain_file(path)
    try:
        return read_json_bytes(path, MAX_YAML_BYTES if path.suffix == ".yaml" else MAX_JSON_BYTES)
    except JsonBoundsError as err:
        raise RunFileError(f"{path} is damaged: {err}") from None


def remove_stale_temp_files(folder: str | os.PathLike) -> list[Path]:
    """Delete the temporary files a killed atomic write left in ``folder`` and ``folder/checkpoints``."""
    stale = [p for sub in (Path(folder), Path(folder) / "checkpoints") if sub.is_dir() and not sub.is_symlink()
             for p in sub.glob(f".*{TMP_SUFFIX}") if p.is_file() and not p.is_symlink()]
    for p in stale:
        with guarded(p, "remove"):
            p.unlink(missing_ok=True)
    return stale


MAX_YAML_DEPTH = 100


def yaml_problem(text: str, depth: int = MAX_YAML_DEPTH) -> str:
    """Why ``text`` is not a YAML file this project could have written, or '': nested deeper than ``depth``
    levels, or using aliases (``&a`` ... ``*a``, which a few bytes can expand into gigabytes when loaded).
    Read as a stream of parser events, which builds nothing and needs no recursion, so the check itself is
    cheap on any input; a YAML syntax error is left to the loader that follows, which names it."""
    import yaml

    level = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                return "it uses a YAML alias, which no file this project writes has"
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                level += 1
                if level > depth:
                    return f"nested deeper than {depth} levels, which no file this project writes is"
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                level -= 1
    except yaml.YAMLError:
        return ""
    return ""


def symlink_loop(path: Path) -> Path | None:
    """The first folder of ``path`` (or ``path`` itself) that is a symlink loop, or None: such a path is never
    made, and pathlib's ``resolve`` fails on it with a traceback."""
    for part in (*reversed(path.parents), path):
        try:
            os.stat(part)
        except OSError as err:
            if err.errno == errno.ELOOP:
                return part
            if err.errno in (errno.ENOENT, errno.ENOTDIR):
                return None  # the rest does not exist yet
    return None
