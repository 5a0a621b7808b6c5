"""ImageFolderDataModule: generation once/atomically, loaders, errors, repeated-aug sampler."""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DistributedSampler

from data import DataConfigError, ImageFolderDataModule, make_fake_imagefolder
from data.datamodule import RepeatAugDistributedSampler
from data.generation import MARKER_NAME, ensure_generated, lock_path
from data.relational import generate_relational_shapes

CALLS: list[str] = []


def counting_generator(root: str, num_train: int = 64, num_val: int = 16, fail: bool = False) -> None:
    """Relational generator that records its calls (and can fail half-way, after writing files)."""
    CALLS.append(root)
    generate_relational_shapes(root, num_train=num_train, num_val=num_val)
    if fail:
        raise RuntimeError("simulated crash during generation")


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    CALLS.clear()


def relational_dm(root: Path, **overrides) -> ImageFolderDataModule:
    kwargs = dict(
        root=str(root),
        img_size=32,
        batch_size=16,
        num_workers=0,
        mean=(0.5, 0.5, 0.5),
        std=(0.5, 0.5, 0.5),
        train_transform=None,
        eval_crop_pct=1.0,
        num_classes=8,
        generator=functools.partial(counting_generator, num_train=64, num_val=16),
    )
    return ImageFolderDataModule(**{**kwargs, **overrides})


def test_prepare_data_generates_once(tmp_path: Path) -> None:
    root = tmp_path / "rel"
    dm = relational_dm(root)
    assert dm.num_classes == 8 and dm.batch_size == 16 and dm.img_size == 32  # before any setup
    dm.prepare_data()
    assert (root / MARKER_NAME).is_file() and len(CALLS) == 1
    some_file = next((root / "train").rglob("*.png"))
    mtime = some_file.stat().st_mtime_ns
    dm.prepare_data()
    relational_dm(root).prepare_data()  # a fresh module (e.g. a new run) also reuses it
    assert len(CALLS) == 1 and some_file.stat().st_mtime_ns == mtime
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_generator_given_as_target_mapping(tmp_path: Path) -> None:
    spec = {"_target_": f"{__name__}.counting_generator", "num_train": 16, "num_val": 8}
    dm = relational_dm(tmp_path / "rel", generator=spec)
    dm.prepare_data()
    dm.setup("fit")
    assert len(CALLS) == 1 and len(dm.train_set) == 16 and len(dm.val_set) == 8


def test_changed_generator_settings_are_an_error(tmp_path: Path) -> None:
    relational_dm(tmp_path / "rel").prepare_data()
    changed = relational_dm(tmp_path / "rel", generator=functools.partial(counting_generator, num_train=32))
    with pytest.raises(DataConfigError, match="num_train: 64 on disk vs 32 configured"):
        changed.prepare_data()
    assert len(CALLS) == 1


def test_different_generator_function_is_rejected(tmp_path: Path) -> None:
    relational_dm(tmp_path / "rel").prepare_data()
    other = relational_dm(
        tmp_path / "rel", generator=functools.partial(generate_relational_shapes, num_train=8)
    )
    with pytest.raises(DataConfigError, match="generate_relational_shapes"):
        other.prepare_data()


def test_crashed_generation_leaves_nothing_behind(tmp_path: Path) -> None:
    dm = relational_dm(tmp_path / "rel", generator=functools.partial(counting_generator, fail=True))
    with pytest.raises(RuntimeError, match="simulated crash"):
        dm.prepare_data()
    assert sorted(p.name for p in tmp_path.iterdir()) == [lock_path(tmp_path / "rel").name]  # no root, no temp dir
    relational_dm(tmp_path / "rel").prepare_data()  # the next run generates cleanly
    assert (tmp_path / "rel" / MARKER_NAME).is_file()


def test_concurrent_prepare_generates_once(tmp_path: Path) -> None:
    generator = functools.partial(counting_generator, num_train=32, num_val=8)
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_generated(tmp_path / "rel", generator)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False, False, True] and len(CALLS) == 1
    assert len(list((tmp_path / "rel").rglob("*.png"))) == 40


def test_race_without_file_lock_keeps_one_complete_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where flock does not work (some network filesystems), marker + atomic rename still yield one copy."""
    import data.generation

    monkeypatch.setattr(data.generation, "fcntl", None)
    barrier = threading.Barrier(3)

    def slow_start_generator(root: str) -> None:
        barrier.wait(timeout=10)  # make all three generate at the same time
        counting_generator(root, num_train=32, num_val=8)

    results: list[bool] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(ensure_generated(tmp_path / "rel", slow_start_generator))
        )
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(CALLS) == 3 and sorted(results) == [False, False, True]
    assert len(list((tmp_path / "rel").rglob("*.png"))) == 40
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rel"]  # losers cleaned up their temp dirs


def test_foreign_root_without_marker_is_not_overwritten(tmp_path: Path) -> None:
    make_fake_imagefolder(tmp_path / "rel", num_classes=8, per_class=1)
    with pytest.raises(DataConfigError, match="completion marker"):
        relational_dm(tmp_path / "rel").prepare_data()


def test_loaders_shapes_dtypes_and_normalisation(tmp_path: Path) -> None:
    dm = relational_dm(tmp_path / "rel")
    dm.prepare_data()
    dm.setup("fit")
    assert dm.num_classes == 8 and len(dm.train_set) == 64 and len(dm.val_set) == 16
    train_loader = dm.train_dataloader()
    assert train_loader.drop_last and len(train_loader) == 4
    images, labels = next(iter(train_loader))
    assert images.shape == (16, 3, 32, 32) and images.dtype == torch.float32
    assert labels.shape == (16,) and labels.dtype == torch.int64 and 0 <= labels.min() <= labels.max() < 8

    # Eval (and, for relational, train) transform is exactly (pixel / 255 - mean) / std: no resize, no crop.
    val_loader = dm.val_dataloader()
    val_images, val_labels = next(iter(val_loader))
    path, label = dm.val_set.samples[next(iter(val_loader.sampler))]  # the fixed evaluation order's first
    pixels = torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1).float() / 255
    torch.testing.assert_close(val_images[0], (pixels - 0.5) / 0.5)
    assert val_labels[0] == label and dm.val_set.classes[label] == Path(path).parent.name
    test_images, _ = next(iter(dm.test_dataloader()))
    torch.testing.assert_close(test_images, val_images)


def test_num_classes_counted_from_existing_root(tmp_path: Path) -> None:
    root = make_fake_imagefolder(tmp_path / "fake", num_classes=5, per_class=2, img_size=16)
    dm = ImageFolderDataModule(root=str(root), img_size=16, batch_size=2, num_workers=0)
    assert dm.num_classes == 5


def test_hidden_folders_are_never_classes(tmp_path: Path) -> None:
    """Probe case 60: ``.ipynb_checkpoints/`` in train/ and val/ was a class (torchvision's find_classes lists
    every folder). Every reader of class folders lists them through `data.generation.class_folders`; hidden
    entries inside a class folder are no images of it."""
    import shutil

    from data.datamodule import count_images
    from data.generation import scan_content

    root = make_fake_imagefolder(tmp_path / "fake", num_classes=3, per_class=2, img_size=16)
    for split in ("train", "val"):
        for hidden in (".ipynb_checkpoints", ".git"):
            (root / split / hidden).mkdir()
            shutil.copy(root / split / "class_000" / "0000.png", root / split / hidden / "a.png")
        # inside a class folder: a notebook's checkpoint copy and a macOS resource fork are no images either
        notebook = root / split / "class_001" / ".ipynb_checkpoints"
        notebook.mkdir()
        shutil.copy(root / split / "class_000" / "0000.png", notebook / "b.png")
        (root / split / "class_002" / "._0000.png").write_bytes(b"\x00\x05\x16\x07")
    dm = ImageFolderDataModule(root=str(root), img_size=16, batch_size=2, num_workers=0, num_classes=None)
    assert dm.num_classes == 3  # counted before the data is read
    dm.check_on_disk(1)
    dm.setup("fit")
    names = ["class_000", "class_001", "class_002"]
    assert dm.train_set.classes == names and dm.val_set.classes == names and dm.num_classes == 3
    assert len(dm.train_set) == len(dm.val_set) == 6
    assert count_images(root / "train", 100) == 6
    assert sorted(scan_content(root)[0]["train"]) == names


@pytest.mark.parametrize("split", ["train", "val"])
def test_an_unreadable_hand_image_is_named_by_the_check_before_the_run_dir(tmp_path: Path, split: str) -> None:
    """Probe 14, l52: a 0-byte image in hand ImageFolder data was named by setup, after the run dir was made.
    ``check_on_disk`` decodes what setup decodes (splits with a fixed transform, into the process's cache), so
    setup then reads the cache, not the files again."""
    from data import memory

    root = make_fake_imagefolder(tmp_path / "fake", num_classes=2, per_class=2, img_size=16)
    empty = root / split / "class_001" / "zz_empty.png"
    empty.write_bytes(b"")
    dm = ImageFolderDataModule(root=str(root), img_size=16, batch_size=2, num_workers=0, num_classes=None)
    with pytest.raises(DataConfigError) as info:
        dm.check_on_disk(1)
    assert str(info.value).startswith(f"image {empty} cannot be read (UnidentifiedImageError"), info.value
    empty.unlink()
    dm.check_on_disk(1)
    assert dm.train_set is None and dm.val_set is None
    cached = len(memory._cache)
    dm.setup("fit")
    assert len(memory._cache) == cached and isinstance(dm.val_set, memory.DecodedSplit)


@pytest.mark.parametrize("how", ["hard link", "linked class folder", "copy", "renamed copy", "renamed copy, large"])
def test_val_images_that_are_training_images_are_refused_before_the_run_dir(
        tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 14, l184, l213: a training image hard-linked into another class of val/, or val/'s class folders
    symlinked to train/'s, trained and validated on the same images, silently (the checks were per split).
    Probe 15, n25: byte copies under other names. Where the files of shared sizes take more than the budget to
    read, copies are compared by path only: a renamed copy then passes, a same-path copy does not."""
    import os
    import shutil

    from data import generation

    root = make_fake_imagefolder(tmp_path / "fake", num_classes=2, per_class=2, img_size=16)
    dm = ImageFolderDataModule(root=str(root), img_size=16, batch_size=2, num_workers=0, num_classes=None)
    dm.check_on_disk(1)  # the fake splits hold images of their own
    if how == "hard link":
        os.link(root / "train" / "class_000" / "0000.png", root / "val" / "class_001" / "zz_link.png")
        expected = "val image val/class_001/zz_link.png is train/class_000/0000.png"
    elif how == "linked class folder":
        shutil.rmtree(root / "val" / "class_000")
        (root / "val" / "class_000").symlink_to(root / "train" / "class_000")
        expected = "val image val/class_000/0000.png is train/class_000/0000.png"
    elif how == "copy":
        shutil.copy(root / "train" / "class_001" / "0001.png", root / "val" / "class_001" / "0001.png")
        expected = "val image val/class_001/0001.png is train/class_001/0001.png"
    else:
        shutil.copy(root / "train" / "class_001" / "0001.png", root / "val" / "class_000" / "v_0001.png")
        expected = "val image val/class_000/v_0001.png is train/class_001/0001.png"
        if how == "renamed copy, large":
            monkeypatch.setattr(generation, "COPY_CHECK_BYTES", 100)
            ImageFolderDataModule(root=str(root), img_size=16, batch_size=2, num_workers=0,
                                  num_classes=None).check_on_disk(1)  # beyond the budget: by path only
            shutil.copy(root / "train" / "class_001" / "0001.png", root / "val" / "class_001" / "0001.png")
            expected = "val image val/class_001/0001.png is train/class_001/0001.png"
    dm = ImageFolderDataModule(root=str(root), img_size=16, batch_size=2, num_workers=0, num_classes=None)
    for check in (lambda: dm.check_on_disk(1), lambda: dm.setup("fit")):
        with pytest.raises(DataConfigError) as info:
            check()
        assert str(info.value) == (f"data.root={root}: {expected} (a link or a copy of it): best.ckpt would be picked"
                                   " and tested on images it trained on; valid: a val split of images of its own")


def test_class_folders_are_checked_on_disk_before_any_image_is_read(tmp_path: Path) -> None:
    """Probe case 61: an empty class folder, class names that differ between the splits and a class count other
    than data.num_classes are refused by ``check_on_disk`` (before the run dir), as ``setup`` refuses them."""
    root = make_fake_imagefolder(tmp_path / "fake", num_classes=3, per_class=2, img_size=16)

    def refusals(**overrides) -> list[str]:
        found = []
        for check in ("check_on_disk", "setup"):
            dm = ImageFolderDataModule(**{**dict(root=str(root), img_size=16, batch_size=2, num_workers=0,
                                                 num_classes=3), **overrides})
            with pytest.raises(DataConfigError) as info:
                dm.check_on_disk(1) if check == "check_on_disk" else dm.setup("fit")
            found.append(str(info.value))
        return found

    on_disk, in_setup = refusals(num_classes=4)
    assert on_disk == in_setup and "data.num_classes=4 but data.root=" in on_disk
    (root / "val" / "class_003").mkdir()
    (root / "val" / "class_000" / "0000.png").rename(root / "val" / "class_003" / "0000.png")
    on_disk, in_setup = refusals()
    assert on_disk == in_setup and "differ (only in val/: class_003)" in on_disk, on_disk
    (root / "train" / "class_003" / "sub").mkdir(parents=True)  # a folder of folders without an image
    on_disk, in_setup = refusals()
    assert on_disk == in_setup and on_disk.startswith(
        f"{root / 'train'} is not a usable ImageFolder split (class folders without images: class_003)"), on_disk


def test_persistent_workers(tmp_path: Path) -> None:
    root = make_fake_imagefolder(tmp_path / "fake", num_classes=2, per_class=4, img_size=16)
    dm = ImageFolderDataModule(root=str(root), img_size=16, batch_size=2, num_workers=1, eval_crop_pct=1.0)
    dm.setup("fit")
    assert dm.train_dataloader().persistent_workers and dm.val_dataloader().persistent_workers


@pytest.mark.parametrize(
    ("make", "split_or_fragment"),
    [
        (lambda root: None, "does not exist"),
        (lambda root: root.mkdir(), "has no train/ folder"),
        # probe 18, t5: a FIFO standing where train/ belongs was "no train/ folder"
        (lambda root: (root.mkdir(), os.mkfifo(root / "train")), "has no train/ folder: its train is not a folder (it"
                                                                  " is a FIFO (named pipe))"),
        (lambda root: (root.mkdir(), (root / "train").write_text("")), "its train is not a folder (it is a file)"),
        (lambda root: (root / "train").mkdir(parents=True), "is not a usable ImageFolder split"),
        (lambda root: (root / "train" / "cat").mkdir(parents=True), "is not a usable ImageFolder split"),
    ],
)
def test_bad_root_gives_one_line_error(tmp_path: Path, make, split_or_fragment: str) -> None:
    root = tmp_path / "missing"
    make(root)
    dm = ImageFolderDataModule(root=str(root), img_size=32, batch_size=2, num_workers=0)
    with pytest.raises(DataConfigError) as info:
        dm.setup("fit")
    message = str(info.value)
    assert str(root) in message and split_or_fragment in message and "\n" not in message
    assert "root/{split}/<class>/<image>" in message or "expected" in message


def test_missing_val_split_and_class_mismatch(tmp_path: Path) -> None:
    root = make_fake_imagefolder(
        tmp_path / "fake", num_classes=3, per_class=2, img_size=16, splits=("train",)
    )
    dm = ImageFolderDataModule(root=str(root), img_size=16, batch_size=2, num_workers=0)
    with pytest.raises(DataConfigError, match="has no val/ folder"):
        dm.setup("fit")
    make_fake_imagefolder(root, num_classes=2, per_class=2, img_size=16, splits=("val",))
    with pytest.raises(DataConfigError, match="must match"):
        ImageFolderDataModule(root=str(root), img_size=16, batch_size=2, num_workers=0).setup("fit")


def test_num_classes_mismatch_and_too_large_batch(tmp_path: Path) -> None:
    root = make_fake_imagefolder(tmp_path / "fake", num_classes=3, per_class=2, img_size=16)
    with pytest.raises(DataConfigError, match="data.num_classes=2 .* 3 class folders"):
        ImageFolderDataModule(root=str(root), img_size=16, num_classes=2).setup("fit")
    # More configured classes than folders (ImageNet's 1000 on a 3-class folder) trains a head whose extra
    # classes never occur: refused too; null counts the folders.
    with pytest.raises(DataConfigError, match="data.num_classes=1000 but data.root=.* has 3 class folders"):
        ImageFolderDataModule(root=str(root), img_size=16, num_classes=1000).setup("fit")
    dm = ImageFolderDataModule(root=str(root), img_size=16, batch_size=64, num_workers=0, num_classes=None)
    dm.setup("fit")
    assert dm.num_classes == 3
    with pytest.raises(DataConfigError, match="data.batch_size=64"):
        dm.train_dataloader()


def test_repeated_aug_only_when_distributed(tmp_path: Path) -> None:
    root = make_fake_imagefolder(tmp_path / "fake", num_classes=4, per_class=8, img_size=16)
    dm = ImageFolderDataModule(root=str(root), img_size=16, batch_size=4, num_workers=0, repeated_aug=True)
    dm.setup("fit")
    assert not isinstance(dm.train_dataloader().sampler, RepeatAugDistributedSampler)  # single process: plain shuffle

    per_rank = []
    for rank in range(2):
        dm.trainer = SimpleNamespace(world_size=2, global_rank=rank)
        sampler = dm.train_dataloader().sampler
        # Must be a DistributedSampler, otherwise Lightning would wrap (and re-shard) it.
        assert isinstance(sampler, DistributedSampler)
        sampler.set_epoch(1)
        per_rank.append(list(sampler))
    assert len(per_rank[0]) == len(per_rank[1]) == 16  # 32 images / 2 ranks
    # Repeated augmentation: each sampled image appears on both ranks (as different augmentations).
    assert set(per_rank[0]) & set(per_rank[1])


def test_drives_a_lightning_fit(tmp_path: Path) -> None:
    """prepare_data -> setup -> loaders through a real (CPU) Trainer, including generation from scratch."""
    import lightning as L

    class LinearProbe(L.LightningModule):
        def __init__(self, num_classes: int) -> None:
            super().__init__()
            self.head = torch.nn.Linear(3 * 32 * 32, num_classes)

        def training_step(self, batch, batch_idx):
            images, labels = batch
            return torch.nn.functional.cross_entropy(self.head(images.flatten(1)), labels)

        def validation_step(self, batch, batch_idx) -> None:
            images, labels = batch
            self.log("val_loss", torch.nn.functional.cross_entropy(self.head(images.flatten(1)), labels))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    dm = relational_dm(tmp_path / "rel")
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(LinearProbe(dm.num_classes), datamodule=dm)
    assert trainer.global_step == 4 and "val_loss" in trainer.callback_metrics and len(CALLS) == 1
    # every checkpoint records the class names its labels index (what eval.py compares other data with)
    from data.datamodule import recorded_classes

    trainer.save_checkpoint(tmp_path / "saved.ckpt", weights_only=True)
    saved = torch.load(tmp_path / "saved.ckpt", weights_only=True)
    assert recorded_classes(saved) == ["0_E", "1_NE", "2_N", "3_NW", "4_W", "5_SW", "6_S", "7_SE"]


class _SigtermDisposition(torch.utils.data.Dataset):
    """Each item: is SIGTERM ignored in the process that loads it?"""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> bool:
        import signal

        return signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


def test_loader_workers_leave_stop_signals_to_the_main_process() -> None:
    """scancel signals every process of a job: a worker must not die of it before the main process saves."""
    from data.datamodule import make_loader

    owner = SimpleNamespace(batch_size=2, num_workers=1, pin_memory=False)
    [in_worker] = list(make_loader(owner, _SigtermDisposition(), train=False))
    assert in_worker.tolist() == [True, True]
    assert not _SigtermDisposition()[0]  # the main process keeps its own handler


@pytest.mark.parametrize("shuffle", [True, False])
def test_evaluation_reads_every_image_exactly_once_on_any_number_of_ranks(shuffle: bool) -> None:
    """An evaluated split is sharded without padding: over ranks 1-3 and odd sizes every index appears once
    (torch's DistributedSampler repeated images to even the shards out, and those repeats were counted: 4/34
    for 4/33), each rank's ``len`` is what it yields, and one process reads the order it always read."""
    from data.datamodule import EVALUATION_SEED, EvaluationSampler

    for world in (1, 2, 3):
        for size in (*range(world, 12), 33):
            shards = [list(EvaluationSampler(range(size), world, rank, shuffle=shuffle)) for rank in range(world)]
            read = [i for shard in shards for i in shard]
            assert sorted(read) == list(range(size)), (world, size)  # each image once: none repeated, none lost
            assert [len(EvaluationSampler(range(size), world, rank, shuffle=shuffle)) for rank in range(world)] == [
                len(shard) for shard in shards]
            assert max(map(len, shards)) - min(map(len, shards)) <= 1
    one = EvaluationSampler(range(33), 1, 0, shuffle=shuffle)
    one.set_epoch(2)  # Lightning sets the epoch of evaluation samplers too
    torch_order = DistributedSampler(range(33), num_replicas=1, rank=0, shuffle=shuffle, seed=EVALUATION_SEED)
    torch_order.set_epoch(2)
    assert list(one) == list(torch_order)


def test_a_split_with_fewer_images_than_devices_is_one_line_before_the_run(tmp_path: Path) -> None:
    """A rank without an image would skip the evaluation while the others wait for it at the epoch-end sync:
    refused before a run dir (check_on_disk), and by the sampler for data that was made later."""
    from data.datamodule import EvaluationSampler

    root = make_fake_imagefolder(tmp_path / "fake", num_classes=2, per_class=4, img_size=16, splits=("train",))
    make_fake_imagefolder(root, num_classes=2, per_class=1, img_size=16, splits=("val",), seed=1)  # 2 val images
    dm = ImageFolderDataModule(root=str(root), img_size=16, batch_size=2, num_workers=0)
    dm.check_on_disk(2)
    with pytest.raises(DataConfigError) as err:
        dm.check_on_disk(3)
    assert str(err.value) == (f"{root / 'val'} has 2 images, fewer than the 3 devices that would evaluate it (each"
                              " device reads a share of at least one image); valid: trainer.devices=2 or fewer, or"
                              " a split of 3 images or more")
    with pytest.raises(DataConfigError, match="has 2 images, fewer than the 3 devices"):
        EvaluationSampler(range(2), 3, 0)


def test_the_val_loader_shards_an_odd_split_over_ranks_without_repeats(tmp_path: Path) -> None:
    from data.datamodule import EvaluationSampler

    root = make_fake_imagefolder(tmp_path / "fake", num_classes=3, per_class=3, img_size=16)  # 9 val images
    read = []
    for rank in range(2):
        dm = ImageFolderDataModule(root=str(root), img_size=16, batch_size=4, num_workers=0)
        dm.trainer = SimpleNamespace(world_size=2, global_rank=rank)
        dm.setup("validate")
        loader = dm.val_dataloader()
        assert isinstance(loader.sampler, EvaluationSampler) and not loader.drop_last  # Lightning leaves it as is
        read += [int(label) for _, labels in loader for label in labels]
    assert sorted(read) == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # 9 images, not 10
