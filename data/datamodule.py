"""LightningDataModule for any ImageFolder dataset (ImageNet, relational shapes, digits, fakes)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from timm.data import create_transform
from timm.data.distributed_sampler import RepeatAugSampler
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension

from data.errors import DataConfigError, absent_folder, data_root_path, load_rgb_image, not_regular
from data.generation import (
    Generator,
    _plain,
    check_generated,
    class_folders,
    ensure_generated,
    listed_files,
    read_marker,
    resolve_generator,
    training_twin,
)
from data.memory import decoded

LAYOUT_HINT = (
    "expected ImageFolder layout root/{train}/<class>/*.png and root/{val}/<class>/*.png (any image type; "
    "e.g. ImageNet: root/train/n01440764/*.JPEG)"
)
# create_transform arguments the DataModule sets from its own settings.
_SET_BY_THE_MODULE = ("input_size", "is_training", "mean", "std")
# Keys whose YAML lists timm expects as tuples.
_TUPLE_KEYS = ("scale", "ratio", "color_jitter", "mean", "std")
# timm's resize modes (timm.data.transforms); training also takes "random" (bilinear or bicubic per image).
EVAL_INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "box", "hamming", "lanczos")
TRAIN_INTERPOLATIONS = (*EVAL_INTERPOLATIONS, "random")
# String choices of data.train_transform that timm would only reject deep inside create_transform (a bare
# KeyError or AssertionError), checked up front instead; a null value means timm's default.
TRAIN_TRANSFORM_CHOICES: dict[str, tuple[str, ...]] = {
    "interpolation": TRAIN_INTERPOLATIONS,
    "re_mode": ("const", "rand", "pixel"),
    "train_crop_mode": ("rrc", "rkrc", "rkrr"),
}


def _transform_kwargs(train_transform: Any) -> dict[str, Any]:
    """``data.train_transform`` as the keyword arguments of ``timm.data.create_transform`` it must be."""
    import inspect

    plain = _plain(train_transform)
    valid = [n for n in inspect.signature(create_transform).parameters if n not in _SET_BY_THE_MODULE]
    if not isinstance(plain, Mapping):
        raise DataConfigError(f"data.train_transform={plain!r} must be a mapping of timm create_transform"
                              f" arguments (or null for the default recipe); valid keys: {', '.join(valid)}")
    for key in plain:
        if key in _SET_BY_THE_MODULE:
            raise DataConfigError(f"data.train_transform.{key} is set by the DataModule; remove it")
        if key not in valid:
            raise DataConfigError(f"data.train_transform.{key} is not an argument of timm's create_transform;"
                                  f" valid keys: {', '.join(valid)}")
    return dict(plain)


def check_choice(setting: str, value: Any, choices: Sequence[str]) -> None:
    """A one-line `DataConfigError` unless ``value`` is one of ``choices`` (naming the setting and them)."""
    if not isinstance(value, str) or value not in choices:
        raise DataConfigError(f"{setting}={value!r} is not one of: {', '.join(choices)}")


def shown_names(names: Sequence[str]) -> str:
    """``a, b, c`` (at most 10 names, then how many more)."""
    more = f" and {len(names) - 10} more" if len(names) > 10 else ""
    return ", ".join(names[:10]) + more


def class_folder_difference(train: Sequence[str], val: Sequence[str], train_split: str, val_split: str) -> str:
    """``only in train/: a, b; only in val/: d`` (at most 10 names per side)."""
    only_train = sorted(set(train) - set(val))
    only_val = sorted(set(val) - set(train))
    parts = [f"only in {train_split}/: {shown_names(only_train)}"] if only_train else []
    parts += [f"only in {val_split}/: {shown_names(only_val)}"] if only_val else []
    return "; ".join(parts)


def _count_class_dirs(split_dir: Path) -> int:
    """Number of class folders (`class_folders`: the dataset's classes)."""
    return len(class_folders(split_dir))


def empty_classes_reason(empty: Sequence[str]) -> str:
    """Why a split with the class folders ``empty`` (no image in them) is not usable, in one phrase."""
    return "class folders without images: " + ", ".join(empty[:5]) + (
        f" and {len(empty) - 5} more" if len(empty) > 5 else "")


def _holds_image(folder: str, seen: set[str] | None = None, depth: int | None = None) -> bool:
    """Whether ``folder`` or a folder under it (links followed, each real folder once) holds a file named as an
    image: by name, as `CheckedImageFolder` finds a class's samples, reading no more of the folder than it needs.
    ``depth``: how many folder levels below ``folder`` to look into (None: all)."""
    seen = set() if seen is None else seen
    real = os.path.realpath(folder)
    if real in seen:
        return False
    seen.add(real)
    below = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_dir():
                below.append(entry.path)
            elif has_file_allowed_extension(entry.name, IMG_EXTENSIONS):
                return True
    if depth is not None and depth <= 0:
        return False
    return any(_holds_image(path, seen, None if depth is None else depth - 1) for path in below)


# The split folders a dataset found by its layout alone is known by (the data module's defaults).
SPLITS = ("train", "val")


LAYOUT_DEPTH = 3  # folder levels below a class folder that `has_image_folder_layout` looks into


def has_image_folder_layout(root: str | os.PathLike) -> bool:
    """Whether ``root`` is an ImageFolder dataset by its layout: a split folder (``train/`` or ``val/``) with a
    class folder (`class_folders`) holding an image file (`_holds_image`), as the data module reads a dataset.

    A class folder is looked into `LAYOUT_DEPTH` levels deep (the loader reads it at any depth; images kept in
    sub-folders of a class, such as batches, lie within a level or two), so that asking about any folder costs a
    few directory listings, never a walk of a big tree. A split folder this user may not list is no dataset to
    this test: the loader could not read it either.
    """
    for split in SPLITS:
        split_dir = Path(root, split)
        try:
            if split_dir.is_dir() and any(_holds_image(str(split_dir / name), depth=LAYOUT_DEPTH)
                                          for name in class_folders(split_dir)):
                return True
        except OSError:
            continue
    return False


CLASSES_STATE = "classes"  # the datamodule state in a checkpoint (`ImageFolderDataModule.state_dict`)


def recorded_classes(checkpoint: Mapping[str, Any]) -> list[str] | None:
    """The class names, in label order, that a checkpoint's model was trained on
    (`ImageFolderDataModule.state_dict`, which Lightning saves under the data module's class name); None where
    it records none (a checkpoint saved before they were recorded, or of COCO data)."""
    state = checkpoint.get(ImageFolderDataModule.__qualname__)
    names = state.get(CLASSES_STATE) if isinstance(state, Mapping) else None
    if isinstance(names, list) and names and all(isinstance(name, str) for name in names):
        return names
    return None


def class_names_difference(model: Sequence[str], data: Sequence[str]) -> str:
    """How the class names ``data`` (in label order) differ from those a run's ``model`` was trained on, or ''
    where they are the same list: the first label they name differently, then the names only one side has."""
    if list(model) == list(data):
        return ""
    common = min(len(model), len(data))
    label = next((i for i in range(common) if model[i] != data[i]), common)
    parts = [f"label {label} is {model[label]} for the model and {data[label]} here" if label < common
             else f"{len(model)} classes for the model, {len(data)} here"]
    only_model, only_data = sorted(set(model) - set(data)), sorted(set(data) - set(model))
    parts += [f"only the model has {shown_names(only_model)}"] if only_model else []
    parts += [f"only here: {shown_names(only_data)}"] if only_data else []
    return "; ".join(parts)


def count_images(split_dir: Path, enough: int) -> int:
    """Image files (by name: nothing is opened) in the class folders of ``split_dir``, counted until ``enough``
    are found: a cheap lower bound of the split's length, for checks made before a run starts. Each real
    folder is counted once (a folder reached twice through links is refused when the split is read)."""
    count, seen = 0, set()
    for name in class_folders(split_dir):
        for folder, dirs, names in os.walk(os.path.join(split_dir, name), followlinks=True):
            real = os.path.realpath(folder)
            if real in seen:
                dirs[:] = []
                continue
            seen.add(real)
            dirs[:] = [d for d in dirs if not d.startswith(".")]  # hidden entries are no images (_walk_class_folder)
            count += sum(1 for name in names
                         if not name.startswith(".") and has_file_allowed_extension(name, IMG_EXTENSIONS))
            if count >= enough:
                return count
    return count


def _inside(path: str, folder: str) -> bool:
    """Whether the real path ``path`` is ``folder`` or lies under it."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _walk_class_folder(class_dir: str, split_real: str, seen: dict[str, str], dangling: list[str] | None = None,
                       links: list[tuple[str, str]] | None = None,
                       inodes: dict[str, int] | None = None) -> list[tuple[str, list[str]]]:
    """``(folder, sorted file names)`` for every folder under ``class_dir``, sorted by folder: what
    torchvision's ImageFolder walks (``sorted(os.walk(class_dir, followlinks=True))``) less hidden entries,
    and refusing what would make that walk go wrong.

    Hidden files and folders (``.ipynb_checkpoints/``, macOS's ``._x.png`` resource forks) are never images
    of the class: a notebook's checkpoint copy would count an image twice, a resource fork fails to decode
    only when a batch draws it.

    A symlinked folder that leads back to a folder containing it (a loop) would have os.walk repeat its
    images until the path gets too long; one that leads to a folder already walked in this split
    (``seen``: real path -> path) would count images twice, maybe under two classes. Both are a one-line
    `DataConfigError` naming the link; symlinked files, and symlinked folders elsewhere, are followed.
    An entry that is no regular file (a FIFO, socket or device, or a link to one) is refused the same way:
    opening it as an image could block the run forever (a FIFO), where no stop signal ends it. ``links`` collects
    ``(path, real path)`` of each symlinked file, for `_refuse_image_in_two_classes`; ``inodes`` the inode of each
    regular file (from the directory listing: no stat), for `_refuse_hard_link_in_two_classes`.
    """
    folders = []
    stack = [(class_dir, os.path.realpath(class_dir), (split_real,))]
    while stack:
        path, real, chain = stack.pop()
        loop = next((folder for folder in chain if _inside(folder, real)), None)
        if loop is not None:
            raise DataConfigError(
                f"{path} is a symlink to {real}, a folder that holds the link itself (a loop through {loop}):"
                " following it would multiply the images of this class; remove the link"
            )
        if real in seen:
            raise DataConfigError(
                f"{path} is the same folder as {seen[real]} (through a symlink, both {real}): its images "
                "would count twice; remove the link"
            )
        seen[real] = path
        try:
            entries = list(os.scandir(path))
        except OSError as err:  # os.walk would skip the folder silently
            raise DataConfigError(f"folder {path} cannot be listed ({err.strerror or err})") from None
        files = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                is_dir = entry.is_dir()  # follows symlinks, as os.walk(followlinks=True) does
            except OSError:
                is_dir = False
            if not is_dir:
                files.append(entry.name)
                try:
                    regular = entry.is_file()  # the entry's own type, a link's target's through a stat
                except OSError:
                    regular = False
                kind = None if regular else not_regular(entry.path)
                if kind is not None:
                    through = f" (a symlink to {os.path.realpath(entry.path)})" if entry.is_symlink() else ""
                    raise DataConfigError(f"{entry.path}{through} is {kind}, not a regular file: reading it as an image"
                                          " could block the run; remove it from the class folder")
                if entry.is_symlink() and not os.path.exists(entry.path):
                    if dangling is not None:
                        dangling.append(entry.path)  # listed as a file, as os.walk does; unreadable when loaded
                elif entry.is_symlink() and links is not None:
                    links.append((entry.path, os.path.realpath(entry.path)))
                elif not entry.is_symlink() and inodes is not None:
                    inodes[entry.path] = entry.inode()
            else:
                sub_real = os.path.realpath(entry.path) if entry.is_symlink() else os.path.join(real, entry.name)
                stack.append((entry.path, sub_real, (*chain, real)))
        folders.append((path, sorted(files)))
    return sorted(folders)


def _refuse_image_in_two_classes(links: list[tuple[str, str, str]], seen: dict[str, str], split_dir: str,
                                 is_valid_file: Callable[[str], bool]) -> None:
    """Refuse an image that a symlinked file puts in two classes (``links``: ``(link, real path, class)`` of
    the split's symlinked images): it would be a sample of each, with two labels. The link's target is
    another link's, or a file the walk lists itself (its folder is in ``seen``: real path -> path).
    Links to one image within one class are left alone (a weighting the data's author may mean)."""
    owners: dict[str, tuple[str, str]] = {}  # real path -> (the first path that lists it, its class)
    for link, target, target_class in links:
        folder = seen.get(os.path.dirname(target))
        listed = os.path.join(folder, os.path.basename(target)) if folder is not None else None
        if listed is not None and is_valid_file(listed):
            owners.setdefault(target, (listed, os.path.relpath(listed, split_dir).split(os.sep)[0]))
        first, first_class = owners.setdefault(target, (link, target_class))
        if first_class != target_class:
            raise DataConfigError(f"image {link} (class {target_class}) is a symlink to {target}, which is also"
                                  f" {first} (class {first_class}): one image would be a sample of two classes;"
                                  " remove the link")


def _refuse_hard_link_in_two_classes(found: list[tuple[str, int]], inodes: dict[str, int], target_class: str,
                                     owners: dict[int, str], split_dir: str) -> None:
    """Refuse an image of ``target_class`` that is a hard link to an image of another class (one file, two
    labels). ``found``: the class's ``(image, class index)``; ``inodes`` their inodes (`_walk_class_folder`);
    ``owners``: inode -> the class that first listed it, over the split so far."""
    for path, _ in found:
        inode = inodes.get(path)
        if inode is None:
            continue
        first = owners.setdefault(inode, target_class)
        if first == target_class:
            continue
        other = next((str(q) for q in Path(split_dir, first).rglob("*")
                      if q.is_file() and not q.is_symlink() and os.path.samefile(q, path)), None)
        if other is not None:  # an inode of another file system is no link: the same number, another file
            raise DataConfigError(f"image {path} (class {target_class}) is a hard link to {other} (class {first}),"
                                  " one file: one image would be a sample of two classes; remove one of them")


class CheckedImageFolder(ImageFolder):
    """torchvision's ImageFolder with the same samples in the same order, but for hidden files and folders, which
    are no classes (`class_folders`) and no images (`_walk_class_folder`), and whose folder walk refuses symlink
    loops, folders reached twice, entries that are no regular files and images in two classes (see
    `_walk_class_folder`, `_refuse_image_in_two_classes`)."""

    def find_classes(self, directory: str | Path) -> tuple[list[str], dict[str, int]]:
        classes = class_folders(directory)  # torchvision's own would make .ipynb_checkpoints a class
        if not classes:
            raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
        return classes, {name: index for index, name in enumerate(classes)}

    @staticmethod
    def make_dataset(
        directory: str | Path,
        class_to_idx: dict[str, int],
        extensions: tuple[str, ...] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
    ) -> list[tuple[str, int]]:
        directory = os.path.expanduser(str(directory))
        if is_valid_file is None:
            def is_valid_file(path: str) -> bool:
                return has_file_allowed_extension(path, extensions)

        split_real, seen = os.path.realpath(directory), {}
        samples: list[tuple[str, int]] = []
        linked: list[tuple[str, str, str]] = []  # (symlinked image, its real path, its class)
        owners: dict[int, str] = {}  # inode -> the class that first listed it (hard links)
        empty = []
        for target_class in sorted(class_to_idx):
            class_dir = os.path.join(directory, target_class)
            if not os.path.isdir(class_dir):
                continue
            dangling: list[str] = []
            links: list[tuple[str, str]] = []
            inodes: dict[str, int] = {}
            found = [
                (os.path.join(folder, name), class_to_idx[target_class])
                for folder, names in _walk_class_folder(class_dir, split_real, seen, dangling, links, inodes)
                for name in names
                if is_valid_file(os.path.join(folder, name))
            ]
            _refuse_hard_link_in_two_classes(found, inodes, target_class, owners, directory)
            linked.extend((link, real, target_class) for link, real in links if is_valid_file(link))
            broken = next((path for path in dangling if is_valid_file(path)), None)
            if broken is not None:  # it would fail only when a batch first draws it, maybe epochs later
                raise DataConfigError(f"image {broken} is a symlink to {os.readlink(broken)}, which does not exist;"
                                      " remove the link or restore its target")
            if not found:
                empty.append(target_class)
            samples.extend(found)
        _refuse_image_in_two_classes(linked, seen, directory, is_valid_file)
        if empty and not allow_empty:
            raise FileNotFoundError(empty_classes_reason(empty))
        return samples


# SIGHUP too: closing the terminal or SSH session of a run signals its whole process group.
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP") if hasattr(signal, name)
)


def ignore_stop_signals(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: workers leave stop signals to the main process.

    SLURM (scancel, preemption) signals every process of a job step. A worker killed by it would make the
    main process fail with "DataLoader worker ... killed" before it saves its checkpoint; ignoring the
    signal lets the main process stop the run cleanly and shut its workers down (they also exit on their
    own when the main process dies).
    """
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def trainer_world(datamodule: L.LightningDataModule) -> tuple[int, int]:
    """``(world_size, global_rank)`` of the attached trainer; ``(1, 0)`` before one is attached."""
    trainer = getattr(datamodule, "trainer", None)
    if trainer is None:
        return 1, 0
    return int(getattr(trainer, "world_size", 1)), int(getattr(trainer, "global_rank", 0))


EVALUATION_SEED = 0  # the same order for every run, so two runs' limited evaluations see the same images


def check_evaluation_world(images: int, world_size: int, split: str) -> None:
    """A one-line `DataConfigError` when ``split`` (``images`` long) has fewer images than the ``world_size``
    processes that evaluate it: a rank without an image would skip the evaluation loop while the others wait
    for it in the epoch-end sync of the metrics, forever."""
    if images < world_size:
        raise DataConfigError(f"{split} has {images} image{'s' if images != 1 else ''}, fewer than the {world_size}"
                              " devices that would evaluate it (each device reads a share of at least one image);"
                              f" valid: trainer.devices={max(1, images)} or fewer, or a split of {world_size} images"
                              " or more")


class EvaluationSampler(DistributedSampler):
    """The order an evaluation reads a split in: every image exactly once over all ranks.

    Rank ``r`` of ``w`` reads positions ``r, r + w, ...`` of one order (a shuffle fixed by ``seed`` and the
    epoch, or file order), with no padding: the shards differ by at most one image, where torch's
    ``DistributedSampler`` repeats images to make them even, and those repeats were counted in every metric
    and in the images a test read. Uneven shards are safe in evaluation: the metrics sync once, at the end of
    the epoch (torchmetrics' ``compute``, ``self.log`` epoch values), never per step; `check_evaluation_world`
    makes sure that every rank has an image. A ``DistributedSampler``, so Lightning never wraps it in its own
    padding one. Training keeps its padding samplers (an even step count per rank is what DDP's gradient
    all-reduce needs).
    """

    def __init__(self, dataset: Any, num_replicas: int, rank: int, shuffle: bool = True,
                 seed: int = EVALUATION_SEED, split: str = "the evaluated split") -> None:
        check_evaluation_world(len(dataset), num_replicas, split)
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.total_size = len(dataset)
        self.num_samples = len(range(rank, self.total_size, num_replicas))

    def __iter__(self):
        if self.shuffle:  # the permutation torch's DistributedSampler draws: one process reads what it read
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.total_size, generator=generator).tolist()
        else:
            order = list(range(self.total_size))
        return iter(order[self.rank::self.num_replicas])


def evaluation_order(datamodule: L.LightningDataModule, dataset: Any, shuffle: bool = True,
                     split: str = "the evaluated split") -> EvaluationSampler:
    """The `EvaluationSampler` of ``dataset`` for the attached trainer's ranks: a shuffle fixed by
    `EVALUATION_SEED` (not the run's seed), or file order (``shuffle=False``)."""
    world_size, rank = trainer_world(datamodule)
    return EvaluationSampler(dataset, world_size, rank, shuffle=shuffle, split=split)


class ResumableSampler(DistributedSampler):
    """The training order: a shuffle fixed by ``(seed, epoch)``, sharded over ranks, resumable mid-epoch.

    The order depends on the run's seed and the epoch (``set_epoch``, which Lightning calls), never on
    the global RNG, so a resumed run sees the same order. ``start_at(epoch, skip)`` (a run resumed from
    a checkpoint taken mid-epoch) drops the first ``skip`` samples of this rank in that epoch only;
    ``len`` stays the full epoch. A ``DistributedSampler`` also with one process, so Lightning never
    wraps it.
    """

    def __init__(self, dataset: Any, num_replicas: int, rank: int, seed: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self._skip_epoch, self._skip = -1, 0

    def start_at(self, epoch: int, skip: int) -> None:
        self.set_epoch(epoch)
        self._skip_epoch, self._skip = epoch, skip

    def __iter__(self):
        indices = list(super().__iter__())
        if self.epoch == self._skip_epoch:
            indices = indices[self._skip:]
            self._skip_epoch, self._skip = -1, 0
        return iter(indices)


def make_loader(
    datamodule: L.LightningDataModule,
    dataset: Dataset,
    train: bool,
    sampler: Sampler | None = None,
    collate_fn: Callable | None = None,
) -> DataLoader:
    """The loader every datamodule uses: its ``batch_size``/``num_workers``/``pin_memory``; drop the last
    partial batch for training only. Training without a given ``sampler`` shuffles with a
    ``ResumableSampler`` seeded by the run's seed (``torch.initial_seed()``, set by ``seed_everything``)
    and starts at ``datamodule.resume_position = (epoch, batches done)`` when a resumed run set it
    (``lifecycle.checkpoints.ResumeCheckpoint``).

    Every loader draws its worker seeds from its own generator, so iterating a loader never moves the
    global RNG: a run resumed from a checkpoint continues with the RNG state it saved.
    """
    seed = torch.initial_seed()
    if train and sampler is None:
        world_size, rank = trainer_world(datamodule)
        sampler = ResumableSampler(dataset, world_size, rank, seed=seed)
        position = getattr(datamodule, "resume_position", None)
        if position is not None:
            epoch, batches = position
            sampler.start_at(epoch, batches * datamodule.batch_size)
            datamodule.resume_position = None
    return DataLoader(
        dataset,
        batch_size=datamodule.batch_size,
        shuffle=False,  # training always has a sampler that shuffles
        sampler=sampler,
        num_workers=datamodule.num_workers,
        collate_fn=collate_fn,
        pin_memory=datamodule.pin_memory and torch.cuda.is_available(),
        drop_last=train,
        persistent_workers=datamodule.num_workers > 0,
        worker_init_fn=ignore_stop_signals,
        generator=torch.Generator().manual_seed(seed),
    )


class RepeatAugDistributedSampler(DistributedSampler):
    """timm's RepeatAugSampler (DeiT repeated augmentation) dressed as a DistributedSampler.

    Lightning wraps any train sampler that is not a ``DistributedSampler`` in its own distributed wrapper,
    which would shard the already-sharded RepeatAugSampler a second time. Subclassing makes Lightning leave
    it alone (it still calls ``set_epoch``).
    """

    def __init__(self, dataset: Any, num_replicas: int, rank: int, num_repeats: int = 3) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True)
        self.repeat_sampler = RepeatAugSampler(
            dataset, num_replicas=num_replicas, rank=rank, shuffle=True, num_repeats=num_repeats
        )

    def __iter__(self):
        return iter(self.repeat_sampler)

    def __len__(self) -> int:
        return len(self.repeat_sampler)

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.repeat_sampler.set_epoch(epoch)


class ImageFolderDataModule(L.LightningDataModule):
    """Train/val(/test = val) loaders over ``root/{train_split,val_split}/<class>/<image>``.

    Batches are ``(images, labels)`` with images float32 ``(batch_size, 3, img_size, img_size)`` normalised
    with ``mean``/``std`` and labels int64 ``(batch_size,)``. Mixup/cutmix is left to the LightningModule.

    Args:
        root: dataset folder containing the split folders.
        train_split, val_split: split folder names under ``root``.
        img_size: side of the square network input.
        batch_size: per-device batch size (train and eval).
        num_workers: DataLoader workers per device; workers persist across epochs when > 0.
        pin_memory: pin host memory (only takes effect when CUDA is available).
        mean, std: per-channel normalisation, 3 floats each.
        train_transform: kwargs for ``timm.data.create_transform(is_training=True, ...)`` (auto_augment,
            re_prob, re_mode, re_count, hflip, scale, ratio, interpolation, color_jitter, ...). ``None`` means
            train with the deterministic eval transform, needed when flips/crops would change the label.
        eval_crop_pct: centre-crop fraction of the eval transform (resize to img_size / eval_crop_pct first).
            Use 1.0 for data already stored at img_size: the eval transform is then the identity on pixels.
        eval_interpolation: resize interpolation of the eval transform.
        repeated_aug: use DeiT repeated augmentation (timm RepeatAugSampler) when training is distributed
            (world_size > 1); single-process training always uses a plain shuffle.
        num_repeats: repeats per sample for repeated_aug.
        generator: ``None``, a callable ``fn(root)`` (Hydra ``_partial_: true``), or
            ``{_target_: ..., **kwargs}``; ``prepare_data`` runs it once to create ``root`` when it lacks a
            completion marker.
        num_classes: number of classes; if None it is counted from ``root/train_split`` when that exists
            (otherwise known after ``prepare_data``/``setup``; reading it before is a one-line
            DataConfigError). Checked against the data in ``setup``.
    """

    def __init__(
        self,
        root: str,
        train_split: str = "train",
        val_split: str = "val",
        img_size: int = 224,
        batch_size: int = 128,
        num_workers: int = 8,
        pin_memory: bool = True,
        mean: Sequence[float] = (0.485, 0.456, 0.406),
        std: Sequence[float] = (0.229, 0.224, 0.225),
        train_transform: Mapping[str, Any] | None = None,
        eval_crop_pct: float = 0.875,
        eval_interpolation: str = "bicubic",
        repeated_aug: bool = False,
        num_repeats: int = 3,
        generator: Generator | Mapping[str, Any] | None = None,
        num_classes: int | None = None,
    ) -> None:
        super().__init__()
        self.root = data_root_path(root)
        self.train_split = train_split
        self.val_split = val_split
        self.img_size = int(img_size)
        self.batch_size = int(batch_size)
        self.num_workers = int(num_workers)
        self.pin_memory = bool(pin_memory)
        self.mean = tuple(float(m) for m in _plain(mean))
        self.std = tuple(float(s) for s in _plain(std))
        if len(self.mean) != 3 or len(self.std) != 3:
            raise DataConfigError(f"data.mean={self.mean} and data.std={self.std} must have 3 values each")
        self.train_transform_kwargs = None if train_transform is None else _transform_kwargs(train_transform)
        for key, choices in TRAIN_TRANSFORM_CHOICES.items():
            value = (self.train_transform_kwargs or {}).get(key)
            if value is not None:
                check_choice(f"data.train_transform.{key}", value, choices)
        check_choice("data.eval_interpolation", eval_interpolation, EVAL_INTERPOLATIONS)
        if num_classes is not None and (
            isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1
        ):
            raise DataConfigError(
                f"data.num_classes={num_classes!r} must be a positive integer, or null to count the class folders"
            )
        self.eval_crop_pct = float(eval_crop_pct)
        self.eval_interpolation = eval_interpolation
        self.repeated_aug = bool(repeated_aug)
        self.num_repeats = num_repeats
        self.generator = resolve_generator(generator)
        self._configured_num_classes = num_classes
        self._num_classes: int | None = num_classes
        train_dir = self.root / train_split
        if num_classes is None and train_dir.is_dir():
            self._num_classes = _count_class_dirs(train_dir) or None
        self.train_set: ImageFolder | None = None
        self.val_set: ImageFolder | None = None

    @property
    def num_classes(self) -> int:
        """The class count (configured, or counted from the class folders); a one-line `DataConfigError`
        while it cannot be known (e.g. an empty root), since a model built with None fails obscurely."""
        if self._num_classes is None:
            if self.generator is not None:
                raise DataConfigError(
                    f"data.num_classes is null and data.root={self.root} is not generated yet (prepare_data "
                    "generates it); set data.num_classes"
                )
            train_dir = self._check_split_dir(self.train_split)
            raise DataConfigError(
                f"data.num_classes is null and {train_dir} has no class folders to count (data.root={self.root}"
                f" holds no images); {self._layout_hint()}"
            )
        return self._num_classes

    @num_classes.setter
    def num_classes(self, value: int | None) -> None:
        self._num_classes = value

    def _layout_hint(self) -> str:
        return LAYOUT_HINT.format(train=self.train_split, val=self.val_split)

    # ------------------------------------------------------------------ transforms
    def build_eval_transform(self) -> Callable:
        """PIL image -> normalised float tensor (3, img_size, img_size); deterministic."""
        return create_transform(
            input_size=self.img_size,
            is_training=False,
            interpolation=self.eval_interpolation,
            crop_pct=self.eval_crop_pct,
            mean=self.mean,
            std=self.std,
        )

    def build_train_transform(self) -> Callable:
        """PIL image -> augmented normalised float tensor (3, img_size, img_size)."""
        if self.train_transform_kwargs is None:
            return self.build_eval_transform()
        kwargs = {
            k: tuple(v) if k in _TUPLE_KEYS and isinstance(v, list) else v
            for k, v in self.train_transform_kwargs.items()
        }
        return create_transform(
            input_size=self.img_size, is_training=True, mean=self.mean, std=self.std, **kwargs
        )

    # ------------------------------------------------------------------ lightning hooks
    def prepare_data(self) -> None:
        """Generate the dataset once (if a generator is configured; atomic and safe under races), then
        check the folder layout, so that a wrong ``data.root`` fails before any training starts."""
        if self.generator is not None:
            ensure_generated(self.root, self.generator)
            if self._num_classes is None and (self.root / self.train_split).is_dir():
                self._num_classes = _count_class_dirs(self.root / self.train_split) or None
        for split in (self.train_split, self.val_split):
            self._check_split_dir(split)

    def _check_split_dir(self, split: str) -> Path:
        if not self.root.is_dir():
            hint = " (did prepare_data run? data.generator is set)" if self.generator is not None else ""
            raise DataConfigError(f"data.root={self.root} {absent_folder(self.root)}{hint}; {self._layout_hint()}")
        split_dir = self.root / split
        if not split_dir.is_dir():
            what = (f"has no {split}/ folder" if not os.path.lexists(split_dir)
                    else f"has no {split}/ folder: its {split} {absent_folder(split_dir)}")
            raise DataConfigError(f"data.root={self.root} {what}; {self._layout_hint()}")
        return split_dir

    def check_on_disk(self, world_size: int | None) -> None:
        """Before a run dir is made: the checks of `prepare_data`, `setup` and `train_dataloader` that need no
        image opened, on data already on disk (data still to be generated is checked when it is made). The split
        folders must exist, each class folder must hold an image (by name), the class folders must pass
        `_check_classes`, the training split must hold a batch per device (``world_size``, None where the
        machine decides: then one, which refuses only what no device count would allow), and the val split an
        image per device. Hand data is then set up as a run sets it up (see below)."""
        try:
            if not self.root.is_dir() or (self.generator is not None and read_marker(self.root) is None):
                return
        except DataConfigError:  # a damaged marker: named by prepare_data, after the destination checks
            return
        if self.generator is not None:  # generated data edited since: refused here, not by the job's prepare_data
            check_generated(self.root, self.generator)
        classes = {}
        for split in (self.train_split, self.val_split):
            split_dir = self._check_split_dir(split)
            classes[split] = class_folders(split_dir)
            if not classes[split]:
                raise self._unusable(split_dir, "it has no class folders, so data.root holds no images")
            empty = [name for name in classes[split] if not _holds_image(str(split_dir / name))]
            if empty:
                raise self._unusable(split_dir, empty_classes_reason(empty))
        self._check_classes(classes[self.train_split], classes[self.val_split])
        world = world_size or 1
        if self.repeated_aug and world > 1:
            world = 1  # RepeatAugSampler's length is not the split's: left to the loader
        train_dir = self.root / self.train_split
        count = count_images(train_dir, self.batch_size * world)
        self._check_batch_fits(count // world)
        if world_size is not None:  # every device evaluates a share of the val split (`EvaluationSampler`)
            val_dir = self.root / self.val_split
            check_evaluation_world(count_images(val_dir, world_size), world_size, str(val_dir))
        if self.generator is None:
            # Hand data: the splits `setup` decodes whole (a deterministic transform, small enough to keep) are
            # decoded now, into this process's cache that setup then reads, so an image that cannot be read is
            # named before the run dir. A split too large to keep, or augmented, is read by its batches.
            try:
                self.setup("fit")
            finally:
                self.train_set = self.val_set = None

    def _check_batch_fits(self, per_rank: int) -> None:
        if per_rank < self.batch_size:
            raise DataConfigError(
                f"data.batch_size={self.batch_size} exceeds the {per_rank} training images per device in "
                f"{self.root / self.train_split}; with drop_last=True there would be no training batch"
            )

    def _unusable(self, split_dir: Path, reason: str) -> DataConfigError:
        return DataConfigError(f"{split_dir} is not a usable ImageFolder split ({reason}); {self._layout_hint()}")

    def _image_folder(self, split: str, transform: Callable) -> ImageFolder:
        split_dir = self._check_split_dir(split)
        try:
            return CheckedImageFolder(str(split_dir), transform=transform, loader=load_rgb_image)
        except FileNotFoundError as err:  # no class folders, or class folders without images
            reason = str(err).splitlines()[0].rstrip(".")
            if reason.startswith("Couldn't find any class folder"):
                reason = "it has no class folders, so data.root holds no images"
            raise self._unusable(split_dir, reason) from None

    def setup(self, stage: str | None = None) -> None:
        """Build the ImageFolders: train+val for stage 'fit' (or None), val only for validate/test/predict."""
        # Splits read with a deterministic transform are decoded once per process (`data.memory`): the same
        # batches, without decoding every image again in every epoch and every job of a sweep.
        if stage in (None, "fit") and self.train_set is None:
            train_set = self._image_folder(self.train_split, self.build_train_transform())
            self.train_set = decoded(train_set) if self.train_transform_kwargs is None else train_set
        if self.val_set is None:
            self.val_set = decoded(self._image_folder(self.val_split, self.build_eval_transform()))
        self.num_classes = self._check_classes(
            None if self.train_set is None else self.train_set.classes, self.val_set.classes)
        if self.train_set is not None:
            self._check_separate_images()

    def _check_separate_images(self) -> None:
        """No val image is a training image: the same file (a hard link, or a symlinked file or class folder) or
        the same bytes under any name (`training_twin`). Validated on, it would pick best.ckpt and measure its
        result on what it trained on."""
        train_dir, val_dir = self.root / self.train_split, self.root / self.val_split
        twin = training_twin(train_dir, val_dir, listed_files(val_dir, IMG_EXTENSIONS), IMG_EXTENSIONS)
        if twin is not None:
            raise DataConfigError(
                f"data.root={self.root}: val image {self.val_split}/{twin[0]} is {self.train_split}/{twin[1]} (a link"
                " or a copy of it): best.ckpt would be picked and tested on images it trained on; valid: a val"
                " split of images of its own")

    def _check_classes(self, train: Sequence[str] | None, val: Sequence[str]) -> int:
        """The class folders of the splits (``train`` None: only val is read) against each other and the
        settings: the same names in both (ImageFolder indexes classes by sorted folder name, so differing sets
        silently shift labels), at least 2, and as many as ``data.num_classes`` (or the run's head) says.
        Returns their count. Made by `setup` on the datasets and, before a run dir, by `check_on_disk`."""
        if train is not None and list(val) != list(train):
            difference = class_folder_difference(train, val, self.train_split, self.val_split)
            raise DataConfigError(
                f"data.root={self.root}: the class folders of {self.train_split}/ "
                f"({len(train)}) and {self.val_split}/ ({len(val)}) differ "
                f"({difference}); they must match, as labels are indexed by sorted folder name"
            )
        found = len(train if train is not None else val)
        if found < 2:  # one class: nothing to classify (and accuracy would read 100 %)
            raise DataConfigError(f"data.root={self.root} has {found} class folder: a classification task needs at"
                                  " least 2 (one folder per class under each split)")
        configured = self._configured_num_classes
        if configured is not None and configured != found:
            # Fewer: labels out of range. More: a head with classes no image has (its logits still take
            # probability mass): both are a wrong setting, not something to train through.
            fixed_by = getattr(self, "classes_fixed_by", None)  # eval.py data_root=: the run's head decides
            if fixed_by is not None:
                raise DataConfigError(f"data.root={self.root} has {found} class folders, but {fixed_by} has"
                                      f" {configured} classes; valid: data with its {configured} classes")
            raise DataConfigError(
                f"data.num_classes={configured} but data.root={self.root} has {found} class folders; set "
                f"data.num_classes={found} (or null to count them)"
            )
        return found

    def state_dict(self) -> dict[str, Any]:
        """What every checkpoint of a run records of its data (Lightning saves it beside the weights): the class
        names its labels index (`recorded_classes`), so that an evaluation on other data can tell whether
        label ``i`` means the same class there. Empty before the splits are read."""
        reference = self.train_set if self.train_set is not None else self.val_set
        return {CLASSES_STATE: list(reference.classes)} if reference is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Nothing to restore: the classes are read from the data again (a resumed run checks its files)."""

    # ------------------------------------------------------------------ loaders
    def train_dataloader(self) -> DataLoader:
        if self.train_set is None:
            self.setup("fit")
        world_size, rank = trainer_world(self)
        sampler = None
        if self.repeated_aug and world_size > 1:
            sampler = RepeatAugDistributedSampler(
                self.train_set, world_size, rank, num_repeats=self.num_repeats
            )
        self._check_batch_fits(len(sampler) if sampler is not None else len(self.train_set) // world_size)
        return make_loader(self, self.train_set, train=True, sampler=sampler)

    def val_dataloader(self) -> DataLoader:
        """The val split in a fixed shuffled order (`evaluation_order`): its folders are sorted by class, so
        a limited evaluation (``trainer.limit_val_batches``/``limit_test_batches``) in file order would see
        the first classes only. A full pass gives the same accuracy in any order."""
        if self.val_set is None:
            self.setup("validate")
        sampler = evaluation_order(self, self.val_set, split=f"{self.root / self.val_split}")
        return make_loader(self, self.val_set, train=False, sampler=sampler)

    def test_dataloader(self) -> DataLoader:
        """The val split (ImageNet-style setups have no labelled test split)."""
        return self.val_dataloader()
