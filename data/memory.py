"""Small image splits decoded once per process and served from memory.

A benchmark sweep trains dozens of runs in one process (Hydra's launcher runs a lane's jobs in turn), and
scripts/evaluate_testsets.py tests hundreds of runs on the same few test sets. Decoding the same PNGs for
every epoch of every job costs more than a micro model's forward pass. A split whose transform is
deterministic gives the same tensor for an image every time it is read, so it is decoded once, stacked,
and indexed from memory: the batches are bit for bit the ones the folder would give.

The cache is keyed by the split's real path, the transform, and every file's path, size and modification
time, so an edited, added or removed image is decoded afresh. Splits larger than `MAX_SPLIT_BYTES` are read
from disk as before.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

import torch
from torch.utils.data import Dataset

# A split is kept when its decoded tensors take at most this much (the relational and digits splits take
# 10-100 MiB; ImageNet never qualifies); the cache holds at most MAX_CACHE_BYTES, least recently used first out.
MAX_SPLIT_BYTES = 512 * 2**20
MAX_CACHE_BYTES = 1024 * 2**20

_cache: OrderedDict[tuple, tuple[torch.Tensor, list[int]]] = OrderedDict()


class DecodedSplit(Dataset):
    """An ImageFolder's samples after its transform, held as one tensor.

    ``split[i]`` is ``(images[i], target)``: the same ``(tensor (3, H, W), int)`` as ``folder[i]``.
    Attributes the folder has (``classes``, ``class_to_idx``, ``samples``, ``root``) are read from it.
    """

    def __init__(self, folder: Any, images: torch.Tensor, targets: list[int]) -> None:
        self.folder = folder
        self.images = images
        self.targets = targets

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], self.targets[index]

    def __getattr__(self, name: str) -> Any:
        if name == "folder":  # not set yet (unpickling): never recurse
            raise AttributeError(name)
        return getattr(self.folder, name)


def _key(folder: Any) -> tuple:
    files = []
    for path, target in folder.samples:
        stat = os.stat(path)
        files.append((path, target, stat.st_size, stat.st_mtime_ns))
    return os.path.realpath(folder.root), repr(folder.transform), tuple(files)


def decoded(folder: Any) -> Any:
    """``folder`` (a torchvision ImageFolder with a deterministic transform) as a `DecodedSplit`, decoded now
    or taken from this process's cache; the folder itself when the split is too large to keep."""
    key = _key(folder)
    if key in _cache:
        _cache.move_to_end(key)
        images, targets = _cache[key]
        return DecodedSplit(folder, images, targets)
    if not len(folder):
        return folder
    first, _ = folder[0]
    if not isinstance(first, torch.Tensor) or first.element_size() * first.numel() * len(folder) > MAX_SPLIT_BYTES:
        return folder
    images = torch.empty((len(folder), *first.shape), dtype=first.dtype)
    targets = []
    for index in range(len(folder)):
        image, target = folder[index]
        if image.shape != first.shape:  # no fixed size: batches are the folder's business
            return folder
        images[index] = image
        targets.append(target)
    _cache[key] = (images, targets)
    while sum(t.element_size() * t.numel() for t, _ in _cache.values()) > MAX_CACHE_BYTES and len(_cache) > 1:
        _cache.popitem(last=False)
    return DecodedSplit(folder, images, targets)
