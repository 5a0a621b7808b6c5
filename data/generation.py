"""Generate a dataset on disk once, atomically and race-free.

A generator is any callable ``generator(root)`` that writes an ImageFolder tree into ``root`` (typically a
``functools.partial`` of :func:`data.relational.generate_relational_shapes` built by Hydra with
``_partial_: true``). :func:`ensure_generated` runs it into a private temp dir next to ``root``, writes a
completion marker and renames the temp dir onto ``root``. A killed job therefore never leaves a half dataset
at ``root``, and two processes (DDP ranks, parallel sweeps) racing on the same ``root`` end up with exactly
one complete copy: a file lock serialises them on one machine, and on filesystems without working locks the
rename of a directory onto a non-empty ``root`` fails for the loser, who then finds the winner's marker.

The marker records the generator (target and settings) and what it wrote (class folders and image counts
per split, and a digest of every image's path and bytes, `scan_content`), so a later run refuses data made
with other settings or changed by hand: a class folder deleted, an image moved to another class folder,
replaced or edited (`check_content`, on every use of the data: training and evaluation). A run killed while
generating leaves its temp dir behind; the next run removes it (only dirs named like ours, and only while
holding the lock that every generating process holds for as long as its temp dir exists).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import inspect
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from data.bounded_json import JsonBoundsError, loads_bounded, read_json_bytes
from data.errors import DataConfigError, absent_folder

try:  # POSIX only; without it we still rely on marker + atomic rename.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

MARKER_NAME = ".complete.json"
# The marker's digest of the generated images (`scan_content`): a marker without one was written by an older
# version and is checked against a fresh generation once (`_check_by_regenerating`).
DIGEST_KEY = "content_sha256"
# The seal of a marker (`seal`): a sha256 over its generator record, its content and its digest together. A
# marker whose settings were edited after generation (another test set's name and settings put on these images)
# no longer matches its seal; such a marker, or one without a seal (an older version's), is checked against a
# fresh generation with the settings it states once (`_check_by_regenerating`), and sealed then.
SEAL_KEY = "generated_sha256"
# (root, generator record, digest) of the trees this process found equal to a fresh generation: a command that
# only reads (an evaluation of many runs on one data root) regenerates an old-marker root once, not per run.
_MATCHED_FRESH: set[tuple[str, str, str]] = set()
# The digest of no file at all: what an older version recorded for a COCO tree (`check_content`)
_NOTHING_DIGESTED = hashlib.sha256().hexdigest()

Generator = Callable[..., Any]
log = logging.getLogger(__name__)
# What ImageFolder loads (torchvision's IMG_EXTENSIONS): the marker counts only these, so that a stray
# .DS_Store does not make a dataset "changed".
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def _plain(value: Any) -> Any:
    """Convert OmegaConf containers / tuples to JSON-comparable plain Python values."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, (DictConfig, ListConfig)):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a hard dependency
        pass
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def resolve_generator(generator: Generator | Mapping[str, Any] | None) -> Generator | None:
    """Turn a generator spec into a callable ``fn(root)``.

    Accepts a callable (e.g. the ``functools.partial`` Hydra builds from ``_partial_: true``) or a mapping
    ``{"_target_": "pkg.mod.fn", **kwargs}`` (what you get when the DataModule is built without recursive
    instantiation, or by hand in Python).
    """
    if generator is None or callable(generator):
        return generator
    spec = _plain(generator)
    if not isinstance(spec, dict) or "_target_" not in spec:
        raise DataConfigError(f"data.generator={spec!r} must be null, a callable, or a mapping with _target_")
    from hydra.utils import get_method

    target = spec.pop("_target_")
    spec.pop("_partial_", None)
    return functools.partial(get_method(target), **spec)


# generator function -> the function that checks its settings without generating (`settings_check`)
_SETTINGS_CHECKS: dict[Callable[..., Any], Callable[..., None]] = {}


def settings_check(generator_fn: Callable[..., Any]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Decorator: the decorated function checks ``generator_fn``'s settings (one-line `DataConfigError`)
    without generating anything. It is called with every argument of ``generator_fn`` except ``root``, the
    generator's own defaults filled in, so the defaults have one home."""

    def register(check: Callable[..., None]) -> Callable[..., None]:
        _SETTINGS_CHECKS[generator_fn] = check
        return check

    return register


def _function_and_kwargs(generator: Generator) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The function under ``generator``'s (nested) partials, and the keywords they bind (outer ones win)."""
    func, kwargs = generator, {}
    while isinstance(func, functools.partial):
        kwargs = {**func.keywords, **kwargs}
        func = func.func
    return func, kwargs


def check_generator_settings(generator: Generator) -> None:
    """Run the settings check registered for ``generator``'s function (`settings_check`), if any: a command
    refuses settings the generator would refuse before it claims a run dir, not when the data are made."""
    func, kwargs = _function_and_kwargs(generator)
    check = _SETTINGS_CHECKS.get(func)
    if check is None:
        return
    try:
        bound = inspect.signature(func).bind_partial(**kwargs)
    except TypeError:  # a key the generator does not take: named by the config's constructor-key check
        return
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    arguments.pop("root", None)
    check(**arguments)


def describe_generator(generator: Generator) -> dict[str, Any]:
    """JSON-able description (target + kwargs) stored in the marker to detect config drift."""
    func, kwargs = _function_and_kwargs(generator)
    target = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"
    return {"target": target, "kwargs": json.loads(json.dumps(_plain(kwargs), default=str))}


def seal(marker: dict[str, Any]) -> str:
    """The seal of a marker: the sha256 of its generator record, content and digest (`SEAL_KEY`)."""
    sealed = {key: marker.get(key) for key in ("generator", "content", DIGEST_KEY)}
    return hashlib.sha256(json.dumps(sealed, sort_keys=True, default=str).encode()).hexdigest()


def _marker_problem(marker: Any) -> str | None:
    """What is wrong with a parsed marker, or None. ``content`` and the digest are optional: markers written
    before they were recorded stay readable (and are checked by regenerating, `check_content`)."""
    if not isinstance(marker, dict):
        return f"it holds a JSON {type(marker).__name__}, not an object"
    generator = marker.get("generator")
    if not isinstance(generator, dict):
        return "it has no 'generator' object"
    if not isinstance(generator.get("target"), str) or not isinstance(generator.get("kwargs", {}), dict):
        return "its 'generator' lacks a 'target' string or a 'kwargs' object"
    content = marker.get("content")
    if content is not None and not (
        isinstance(content, dict)
        and all(
            isinstance(classes, dict)
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in classes.values())
            for classes in content.values()
        )
    ):
        return "its 'content' is not {split: {class: image count}}"
    digest = marker.get(DIGEST_KEY)
    if digest is not None and not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
        return f"its '{DIGEST_KEY}' is not a sha256"
    return None


def read_marker(root: str | Path) -> dict[str, Any] | None:
    """The completion marker of ``root`` as a dict, or None if ``root`` is not a completed generation.

    A marker that cannot be read or parsed (a truncated write, an edit) is a `DataConfigError` naming it.
    """
    marker = Path(root) / MARKER_NAME
    if Path(root).exists() and not Path(root).is_dir():
        raise DataConfigError(f"data.root={root} {absent_folder(root)}, where the generated data's folder belongs;"
                              " move it away (then the data is generated there), or point data.root elsewhere")
    if marker.exists() and not marker.is_file():
        raise DataConfigError(f"the completion marker {marker} is not a file (a folder?); delete {Path(root)} to"
                              " regenerate it")
    if not marker.is_file():
        return None
    try:  # bounded, as every JSON record: a marker nested 100000 deep would be a RecursionError
        data = loads_bounded(read_json_bytes(marker).decode())
    except JsonBoundsError as err:
        problem = str(err)
    except json.JSONDecodeError as err:
        problem = f"not valid JSON: {err.msg} at line {err.lineno} column {err.colno}"
    except (OSError, UnicodeDecodeError) as err:
        problem = f"unreadable: {type(err).__name__}: {' '.join(str(err).split())}"
    else:
        problem = _marker_problem(data)
    if problem is not None:
        raise DataConfigError(
            f"the completion marker {marker} is damaged ({problem}); delete {Path(root)} to regenerate it"
        )
    return data


def class_folders(split_dir: str | Path) -> list[str]:
    """The classes of an ImageFolder split: its folders (symlinks followed, as torchvision's ``find_classes``),
    sorted by name, but never a hidden one (``.ipynb_checkpoints``, ``.git``): those are a tool's, not a class.
    The one listing of class folders: the data module's dataset, counts and checks made before a run, and the
    generated data's content scan all read it. ``OSError`` is the caller's."""
    with os.scandir(split_dir) as entries:
        return sorted(entry.name for entry in entries if not entry.name.startswith(".") and entry.is_dir())


def scan_content(root: str | Path, splits: Iterable[str] | None = None) -> tuple[dict[str, dict[str, int]], str]:
    """``({split folder: {class folder: number of images}}, digest)`` of a generated tree, what the marker
    records: the digest is the sha256 over every image's path (relative to ``root``) and the sha256 of its
    bytes, in sorted order, so that an image moved to another class folder, replaced or edited changes it.
    Images and JSON files directly in a split folder (a COCO tree's) enter it first, in the same way.
    ``splits``: only these split folders (the marker's), else every folder at the top.

    Images are the files ImageFolder loads (`_IMAGE_SUFFIXES`), so a stray ``.DS_Store`` changes nothing. A
    symlinked folder inside a class folder (ImageFolder follows it; no generator writes one) enters by its
    path and target. One read per image: about 15 ms per thousand small PNGs (cached; 70 ms from disk).
    ``OSError`` is the caller's.
    """
    root = Path(root)
    summary: dict[str, dict[str, int]] = {}
    digest = hashlib.sha256()
    wanted = None if splits is None else set(splits)
    for split in sorted(os.scandir(root), key=lambda e: e.name):
        if not split.is_dir() or (wanted is not None and split.name not in wanted):
            continue
        # the files directly in a split folder: a COCO tree's images and annotations (no class folders); an
        # ImageFolder tree has none, so its digest is what it was before they were counted
        with os.scandir(split.path) as entries:
            loose = sorted(e.name for e in entries if not e.name.startswith(".") and not e.is_dir()
                           and e.name.lower().endswith((*_IMAGE_SUFFIXES, ".json")))
        for name in loose:
            _digest_file(digest, os.path.join(split.path, name), Path(split.name) / name)
        classes = summary[split.name] = {}
        for cls in class_folders(split.path):
            count = 0
            # a folder it cannot list is named
            for folder, dirs, names in os.walk(os.path.join(split.path, cls), onerror=_raise):
                dirs.sort()
                where = Path(folder).relative_to(root)
                for name in dirs:
                    if os.path.islink(os.path.join(folder, name)):
                        target = os.readlink(os.path.join(folder, name))
                        digest.update(os.fsencode(f"{where / name} -> {target}\n"))
                for name in sorted(names):
                    if not name.lower().endswith(_IMAGE_SUFFIXES):
                        continue
                    _digest_file(digest, os.path.join(folder, name), where / name)
                    count += 1
            classes[cls] = count
    return summary, digest.hexdigest()


def _digest_file(digest: Any, path: str, relative: Path) -> None:
    """Add a file's path (relative to the root) and the sha256 of its bytes to ``digest``. Opened without
    blocking: a FIFO named like an image would block a plain open() forever."""
    with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file: a FIFO, socket or device", path)
        # read in chunks: a damaged (sparse) image of a GiB never sits in memory whole
        digest.update(os.fsencode(f"{relative}\0") + hashlib.file_digest(file, "sha256").digest())


def scan_files(root: str | Path, folders: Iterable[str] | None = None) -> tuple[str, int]:
    """``(digest, number of files)`` of the files under ``root`` (only its top folders ``folders`` where given,
    those that exist): the sha256 over each file's path relative to ``root``, size and mtime_ns, in sorted
    order. What a run records of data it did not generate (`scan_content` covers generated data).

    Names and ``stat`` only, never the bytes: ImageNet's 1.3M files take seconds this way and an hour read
    whole. So an image edited in place with its size and mtime kept goes unseen; a file added, removed,
    renamed, moved to another class folder, or rewritten (a copy without ``-p``/``-a`` too) changes it.
    Hidden names (``.DS_Store``, markers) are left out; a symlink enters by its path and target, and a symlinked
    folder by its files too, as the data modules read them (a file added behind the link changes the digest); a
    folder reached twice (a link loop, which the data modules refuse) is walked once. ``OSError`` is the caller's.
    """
    root = Path(root)
    digest = hashlib.sha256()
    count = 0
    wanted = None if folders is None else set(folders)
    for top in sorted(os.scandir(root), key=lambda e: e.name):
        if top.name.startswith(".") or (wanted is not None and top.name not in wanted):
            continue
        if not top.is_dir():
            if wanted is None and top.is_file():
                info = top.stat()
                digest.update(os.fsencode(f"{top.name}\0{info.st_size}\0{info.st_mtime_ns}\n"))
                count += 1
            continue
        walked: set[str] = set()
        for folder, dirs, names in os.walk(top.path, onerror=_raise, followlinks=True):
            real = os.path.realpath(folder)
            if real in walked:
                dirs[:] = []
                continue
            walked.add(real)
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            where = Path(folder).relative_to(root)
            for name in dirs:
                if os.path.islink(os.path.join(folder, name)):
                    digest.update(os.fsencode(f"{where / name} -> {os.readlink(os.path.join(folder, name))}\n"))
            for name in sorted(n for n in names if not n.startswith(".")):
                info = os.stat(os.path.join(folder, name))
                digest.update(os.fsencode(f"{where / name}\0{info.st_size}\0{info.st_mtime_ns}\n"))
                count += 1
    return digest.hexdigest(), count


COPY_CHECK_BYTES = 512 * 2**20
"""How many bytes `training_twin` may read to find val files that are copies of training files under other
names: the files of sizes the two splits share. Hand data of a few thousand images is read whole; ImageNet is
compared by names, links and same-path bytes only."""


def listed_files(folder: Path, suffixes: tuple[str, ...] | None = None) -> dict[str, os.stat_result]:
    """``{path relative to folder: stat}`` of every file below ``folder`` (only names ending in one of ``suffixes``,
    case aside, where given), links to files and folders followed, each folder walked once; hidden names left out,
    as the data modules leave them. Unreadable folders and links that lead nowhere are left to the data modules."""
    found: dict[str, os.stat_result] = {}
    walked: set[str] = set()
    pending = [Path(folder)]
    while pending:
        current = pending.pop()
        real = os.path.realpath(current)
        if real in walked:
            continue
        walked.add(real)
        try:
            entries = list(os.scandir(current))
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                if entry.is_dir():
                    pending.append(Path(entry.path))
                elif (suffixes is None or entry.name.lower().endswith(suffixes)) and entry.is_file():
                    found[os.path.relpath(entry.path, folder)] = entry.stat()
            except OSError:
                continue
    return found


def training_twin(train_dir: Path, val_dir: Path, val_files: dict[str, os.stat_result],
                  suffixes: tuple[str, ...] | None = None, budget: int | None = None) -> tuple[str, str] | None:
    """``(val name, training name)`` of the first val file (by name) that is a file of the training split: the same
    file (a hard link, or a symlinked file or folder: one device and inode), or the same bytes: a copy under any
    name where the files of the sizes both splits hold take at most ``budget`` bytes to read (`COPY_CHECK_BYTES`
    unless given), else under the same relative path only. None when the val split holds images of its own.
    ``val_files``: the val files, relative to ``val_dir``, with their stat (links followed), as `listed_files`
    gives them."""
    train = listed_files(train_dir, suffixes)
    by_identity = {(info.st_dev, info.st_ino): name for name, info in train.items()}
    by_size: dict[int, list[str]] = {}
    for name, info in train.items():
        by_size.setdefault(info.st_size, []).append(name)
    for name, info in sorted(val_files.items()):
        same = by_identity.get((info.st_dev, info.st_ino))
        if same is not None:
            return name, same
    shared = {size for size in (info.st_size for info in val_files.values()) if size in by_size}
    cost = sum(info.st_size for info in val_files.values() if info.st_size in shared) + sum(
        size * len(by_size[size]) for size in shared)
    if cost <= (COPY_CHECK_BYTES if budget is None else budget):
        digests: dict[tuple[int, str], str] = {}
        for size in shared:
            for train_name in by_size[size]:
                digests.setdefault((size, _file_sha256(train_dir / train_name)), train_name)
        for name, info in sorted(val_files.items()):
            if info.st_size in shared:
                same = digests.get((info.st_size, _file_sha256(val_dir / name)))
                if same is not None:
                    return name, same
        return None
    for name, info in sorted(val_files.items()):  # too much to read: copies under the same path only
        twin = train.get(name)
        if twin is not None and twin.st_size == info.st_size and _file_sha256(train_dir / name) == _file_sha256(
                val_dir / name):
            return name, name
    return None


def _file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes (`_sha256_of`, by the file's identity: the check before a run dir and the
    job's setup read a split once); an unreadable file gets a digest of its own (the data modules name it)."""
    try:
        info = os.stat(path)
    except OSError:
        return f"unreadable:{path}"
    return _sha256_of(str(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


@functools.lru_cache(maxsize=2**16)
def _sha256_of(path: str, device: int, inode: int, size: int, mtime_ns: int) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return f"unreadable:{path}"


def _raise(err: OSError) -> None:
    raise err


def check_content(root: Path, marker: dict[str, Any], generator: Generator, record: bool = True) -> str:
    """Refuse a generated tree that differs from what its marker recorded: a class folder or image count
    (named), or the digest of its images (an image moved to another class folder, replaced or edited: labels
    silently wrong). Returns the digest. ``generator`` makes the data; it checks a marker written before
    markers recorded a digest (`_check_by_regenerating`), which then gains the digest if ``record`` (False
    for commands that only read data)."""
    recorded = marker.get("content")
    try:
        summary, digest = scan_content(root, recorded)
    except OSError as err:
        where = err.filename or root
        raise DataConfigError(f"data.root={root} cannot be checked against its {MARKER_NAME}: cannot read {where}"
                              f" ({err.strerror or type(err).__name__}); make it readable, or delete {root} to"
                              " regenerate it") from None
    differences = []
    for split, classes in sorted((recorded or {}).items()):
        if split not in summary:
            differences.append(f"{split}/ is missing")
            continue
        on_disk = summary[split]
        for name in sorted(set(classes) | set(on_disk)):
            if name not in on_disk:
                differences.append(f"{split}/{name}/ is missing")
            elif name not in classes:
                differences.append(f"{split}/{name}/ was not generated")
            elif on_disk[name] != classes[name]:
                differences.append(f"{split}/{name}/ has {on_disk[name]} images, {classes[name]} when generated")
    if differences:
        more = f" and {len(differences) - 3} more" if len(differences) > 3 else ""
        raise DataConfigError(
            f"data.root={root} no longer holds what was generated ({'; '.join(differences[:3])}{more}); "
            f"delete {root} to regenerate it"
        )
    if marker.get(DIGEST_KEY) == _NOTHING_DIGESTED and digest != _NOTHING_DIGESTED:
        # an older version's digest of a tree without class folders (COCO), which covered no file: checked as
        # an unsealed marker is, against a fresh generation, and then recorded anew
        marker = {**marker, DIGEST_KEY: None}
    if marker.get(DIGEST_KEY) is not None and digest != marker[DIGEST_KEY]:
        raise DataConfigError(
            f"data.root={root} no longer holds what was generated (its images differ from the content digest its"
            f" {MARKER_NAME} recorded: an image was moved to another class folder, replaced or edited, or an"
            f" annotation file edited); delete {root} to regenerate it"
        )
    if marker.get(DIGEST_KEY) is None or marker.get(SEAL_KEY) != seal(marker):
        _check_by_regenerating(root, marker, generator, summary, digest, record)
    return digest


def _check_by_regenerating(root: Path, marker: dict[str, Any], generator: Generator,
                           summary: dict[str, dict[str, int]], digest: str, record: bool) -> None:
    """Check a tree whose marker records no digest (an older version's), or whose seal does not match it (its
    settings edited, or an older version's), against a fresh generation with the settings it states.

    Taking the tree as it is now and recording its digest would accept for good an image moved or replaced
    before; refusing it would make every user regenerate by hand. Generators are deterministic (the same
    settings give byte-identical files), so the same generator makes a private copy and the two digests
    must agree; then, if ``record``, the digest is added to the marker, so this is done once (else, or where
    the marker cannot be written, once per process).
    """
    key = (str(root), json.dumps(marker.get("generator"), sort_keys=True), digest)
    if key not in _MATCHED_FRESH:
        with tempfile.TemporaryDirectory(prefix=f"rpe-check-{root.name}-") as fresh:
            try:
                generator(root=fresh)
                _, expected = scan_content(fresh, marker.get("content"))  # the same splits as ``digest``
            except OSError as err:
                raise DataConfigError(
                    f"data.root={root} has a {MARKER_NAME} without a content digest (an older version wrote it),"
                    f" and the fresh generation to check it against failed ({err.strerror or err}); delete {root}"
                    " to regenerate it") from None
        if expected != digest:
            raise DataConfigError(
                f"data.root={root} does not hold what its {MARKER_NAME} says was generated (the marker is not"
                " sealed as this version seals it, and its images differ from a fresh generation with the settings"
                " it states: its settings were edited, or an image was moved to another class folder, replaced or"
                f" edited); delete {root} to regenerate it"
            )
        _MATCHED_FRESH.add(key)
        log.warning("%s matches a fresh generation of its settings (its %s was not sealed)", root, MARKER_NAME)
    if not record:  # a command that only reads data leaves the marker to train.py or generate_testsets.py
        return
    try:
        checked = {**marker, "content": summary, DIGEST_KEY: digest}
        _replace_marker(root, {**checked, SEAL_KEY: seal(checked)})
    except OSError as err:
        log.warning("%s: its %s could not record the content digest (%s); it is checked again in the next"
                    " process that uses it", root, MARKER_NAME, err.strerror or err)


def _marker_text(marker: dict[str, Any]) -> str:
    return json.dumps(marker, indent=2, sort_keys=True) + "\n"


def _replace_marker(root: Path, marker: dict[str, Any]) -> None:
    """Atomically replace the marker of a complete ``root`` (a temp file beside it, flushed and renamed), with
    the mode the old one had: readers see the old marker or the new one, never half."""
    path = root / MARKER_NAME
    fd, tmp = tempfile.mkstemp(dir=root, prefix=f"{MARKER_NAME}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(_marker_text(marker))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _file_lock(lock_path: Path, blocking: bool = True) -> Iterator[bool]:
    """Exclusive inter-process lock; yields whether it is held (False where fcntl is unavailable, or when
    ``blocking=False`` and another process holds it)."""
    if fcntl is None:  # pragma: no cover
        yield False
        return
    with open(lock_path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _sidecar_stem(root: Path) -> str:
    """The stem of the names of the files a generation of ``root`` makes beside it (its lock, its temp dirs):
    ``.gen-`` and a short hash of the root's name, so that they are short whatever the root's own name (a name
    near the file system's 255 bytes, with ``.lock`` or ``.tmp-<pid>-<hex>`` added, would be too long)."""
    return f".gen-{hashlib.sha256(os.fsencode(root.name)).hexdigest()[:12]}"


def lock_path(root: Path) -> Path:
    """The file the generation lock of ``root`` is held on (beside it)."""
    return root.parent / f"{_sidecar_stem(root)}.lock"


def generation_lock(root: Path, blocking: bool = True) -> contextlib.AbstractContextManager[bool]:
    """The lock every process holds while it generates ``root`` (a file next to it); yields whether held."""
    return _file_lock(lock_path(root), blocking=blocking)


def new_temp_dir(root: Path) -> Path:
    """Create the private temp dir a generation of ``root`` writes into (renamed onto ``root`` at the end)."""
    tmp = root.parent / f"{_sidecar_stem(root)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def _temp_dirs(root: Path) -> list[Path]:
    """Temp dirs of generations of ``root``: exactly `new_temp_dir`'s names (and those of earlier versions,
    ``.<root name>.tmp-[<pid>-]<hex8>``), real directories only, never symlinks."""
    stems = "|".join(re.escape(stem) for stem in (_sidecar_stem(root), f".{root.name}"))
    pattern = re.compile(rf"(?:{stems})\.tmp-(?:\d+-)?[0-9a-f]{{8}}")
    try:
        entries = list(os.scandir(root.parent))
    except FileNotFoundError:
        return []
    return sorted(
        Path(e.path) for e in entries if pattern.fullmatch(e.name) and e.is_dir(follow_symlinks=False)
    )


def remove_stale_temp_dirs(root: Path, lock_held: bool) -> list[Path]:
    """Remove the temp dirs that killed generations of ``root`` left behind; returns them.

    Removes nothing unless ``lock_held``: a generating process holds the lock from creating its temp dir
    until it is renamed or removed, so a temp dir seen under the lock belongs to no live generation. Without
    a working lock (no fcntl) nothing is removed, since a live process might still be writing.
    """
    if not lock_held:
        return []
    stale = _temp_dirs(root)
    for tmp in stale:
        shutil.rmtree(tmp, ignore_errors=True)
        log.warning("removed %s (left by a generation of %s that was killed)", tmp, root)
    return stale


def sweep_stale_temp_dirs(root: Path) -> list[Path]:
    """`remove_stale_temp_dirs` for a caller that does not hold the lock: removes nothing (and does not
    wait) while another process holds it, i.e. may be generating."""
    if not _temp_dirs(root):
        return []
    try:
        with generation_lock(root, blocking=False) as held:
            return remove_stale_temp_dirs(root, held)
    except OSError:  # a read-only data dir: the complete dataset is still usable, the leftovers stay
        return []


def check_marker(root: Path, marker: dict[str, Any], expected: dict[str, Any]) -> None:
    """Compare the recorded generator with the configured one; any difference is an error.

    Reusing data made with other settings would silently train on something else than configured.
    """
    recorded = marker.get("generator", {})
    if recorded.get("target") != expected["target"]:
        raise DataConfigError(
            f"data.root={root} was generated by {recorded.get('target')} but data.generator is "
            f"{expected['target']}; delete that folder or point data.root elsewhere"
        )
    old_kwargs, new_kwargs = recorded.get("kwargs", {}), expected["kwargs"]
    changed = {
        k: (old_kwargs.get(k), new_kwargs.get(k))
        for k in sorted(set(old_kwargs) | set(new_kwargs))
        if old_kwargs.get(k) != new_kwargs.get(k)
    }
    if changed:
        diff = ", ".join(f"{k}: {old!r} on disk vs {new!r} configured" for k, (old, new) in changed.items())
        raise DataConfigError(
            f"data.root={root} was generated with different settings ({diff}); "
            "delete the folder or point data.root elsewhere to regenerate"
        )


class UnmarkedRootError(DataConfigError):
    """A generator's root holds files but no completion marker: data put there by hand, or a half-made copy."""

    def __init__(self, root: Path) -> None:
        self.root = root
        super().__init__(f"data.root={root} exists but has no {MARKER_NAME} completion marker; it was not made by"
                         " data.generator (delete it to regenerate, or set data.generator=null to use it as is)")


def check_generated(root: str | Path, generator: Generator) -> None:
    """The check `ensure_generated` makes of data already generated at ``root`` by ``generator``: its content
    against the marker's digest, writing nothing. Run before a run dir, so that data edited since its generation is
    refused there (a marker of other settings is the command line's data-root check's to name). Data not generated
    yet, and a marker without a sealed digest (which `ensure_generated` checks by generating anew), are left to
    `ensure_generated`."""
    root = Path(root).expanduser().absolute()
    marker = read_marker(root)
    if marker is None:
        return
    try:
        check_marker(root, marker, describe_generator(generator))
    except DataConfigError:  # other settings, or a damaged marker: the command line's data-root check names it
        return
    if marker.get(DIGEST_KEY) not in (None, _NOTHING_DIGESTED) and marker.get(SEAL_KEY) == seal(marker):
        check_content(root, marker, generator, record=False)


def ensure_generated(root: str | Path, generator: Generator) -> bool:
    """Run ``generator`` into ``root`` unless ``root`` already holds a completed generation.

    Returns True if this call generated the data, False if it was already there. Raises DataConfigError if
    ``root`` exists but was not made by a generator (no marker) or by the same generator and settings, if
    its marker is damaged, or if its content no longer matches the marker. Temp dirs of killed earlier
    generations of ``root`` are removed.
    """
    root = Path(root).expanduser().absolute()
    expected = describe_generator(generator)
    marker = read_marker(root)
    if marker is not None:  # fast path, no lock needed
        sweep_stale_temp_dirs(root)
        check_marker(root, marker, expected)
        check_content(root, marker, generator)
        return False

    created = [p for p in (root.parent, *root.parent.parents) if not p.exists()]  # innermost first
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        with generation_lock(root) as locked:
            return _generate_locked(root, generator, expected, locked)
    except OSError as err:  # the folder above data.root cannot hold it (read-only, /proc, a file in the way)
        _remove_created(root, created)
        blocker = next((p for p in (root.parent, *root.parent.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            reason = f"{blocker} is a file, where a folder belongs"
        else:
            reason = (f"{err.strerror or err}" + (f" ({err.filename})" if err.filename else ""))
        raise DataConfigError(f"data.root={root} cannot be generated there: {reason}; valid: a writable folder"
                              " (paths.data_dir=... or data.root=...)") from None
    except BaseException:
        _remove_created(root, created)
        raise


def _remove_created(root: Path, created: list[Path]) -> None:
    """After a generation that failed (settings refused, killed): the folders this call made for ``root``,
    and its lock file in them, are removed again, so that nothing is left where no data was made."""
    if not created:
        return  # the folder existed: its lock file is shared with other generations
    with contextlib.suppress(OSError):
        lock_path(root).unlink(missing_ok=True)
    for folder in created:
        try:
            folder.rmdir()  # only if empty
        except OSError:
            break


def _generate_locked(root: Path, generator: Generator, expected: dict[str, Any], locked: bool) -> bool:
    """`ensure_generated`'s work under the generation lock."""
    remove_stale_temp_dirs(root, locked)
    marker = read_marker(root)  # another process may have finished while we waited for the lock
    if marker is not None:
        check_marker(root, marker, expected)
        check_content(root, marker, generator)
        return False
    if root.exists():
        if root.is_dir() and not any(root.iterdir()):
            root.rmdir()  # an empty placeholder dir is harmless; the rename below needs it gone
        else:
            raise UnmarkedRootError(root)

    tmp = new_temp_dir(root)
    try:
        try:
            generator(root=str(tmp))
            summary, digest = scan_content(tmp)
            marker = {"generator": expected, "content": summary, DIGEST_KEY: digest}
            marker[SEAL_KEY] = seal(marker)
            (tmp / MARKER_NAME).write_text(_marker_text(marker))  # the rename of tmp below publishes it
        except OSError as err:  # an image writer's error may not name its file (PIL on a full disk)
            where = f" ({err.filename})" if err.filename else ""
            raise DataConfigError(
                f"generating data.root={root} failed while writing into {tmp}{where}: "
                f"{err.strerror or err}; nothing was kept (free space, or point data.root elsewhere)"
            ) from None
        try:
            os.replace(tmp, root)
        except OSError:
            # Lost a race on a filesystem where the lock did not hold: keep the winner's copy.
            if read_marker(root) is None:
                raise
            return False
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return True
