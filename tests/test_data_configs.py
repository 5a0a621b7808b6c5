"""Every configs/data/*.yaml instantiates through Hydra and yields working loaders."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm.data
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from data import DataConfigError, ImageFolderDataModule, make_fake_imagefolder

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "data"


def load_data_config(name: str, data_dir: Path, **overrides) -> DictConfig:
    """The `data` node of a composed config, with paths.data_dir pointing at a temp dir."""
    cfg = OmegaConf.create(
        {"paths": {"data_dir": str(data_dir)}, "data": OmegaConf.load(CONFIG_DIR / f"{name}.yaml")}
    )
    cfg = OmegaConf.merge(cfg, {"data": overrides})
    OmegaConf.resolve(cfg)
    return cfg.data


def first_batch(dm: ImageFolderDataModule) -> tuple[torch.Tensor, torch.Tensor]:
    dm.prepare_data()
    dm.setup("fit")
    return next(iter(dm.train_dataloader()))


def test_config_files_present() -> None:
    assert {p.stem for p in CONFIG_DIR.glob("*.yaml")} >= {"relational", "digits", "imagenet"}


def test_relational_config(tmp_path: Path) -> None:
    cfg = load_data_config(
        "relational", tmp_path, num_workers=0, batch_size=8, generator={"num_train": 64, "num_val": 16}
    )
    assert cfg.root == f"{tmp_path}/relational_v2" and cfg.generator.img_size == 32
    dm = instantiate(cfg)
    assert isinstance(dm, ImageFolderDataModule) and dm.num_classes == 8 and dm.img_size == 32
    assert dm.train_transform_kwargs is None  # no flips/crops: they would change the label
    images, labels = first_batch(dm)
    assert images.shape == (8, 3, 32, 32) and labels.dtype == torch.int64
    assert (tmp_path / "relational_v2" / "train" / "2_N").is_dir()
    assert len(dm.train_set) == 64 and dm.train_set.classes[0] == "0_E"


def test_relational_default_sizes(tmp_path: Path) -> None:
    cfg = load_data_config("relational", tmp_path)
    assert (cfg.generator.num_train, cfg.generator.num_val, cfg.generator.patch_size) == (8000, 2000, 4)
    assert (cfg.batch_size, cfg.num_workers, cfg.train_transform) == (64, 0, None)


def test_digits_config(tmp_path: Path) -> None:
    dm = instantiate(load_data_config("digits", tmp_path, num_workers=0, batch_size=16))
    assert dm.num_classes == 10
    images, labels = first_batch(dm)
    assert images.shape == (16, 3, 32, 32) and labels.max() < 10
    assert len(dm.train_set) + len(dm.val_set) == 1797
    assert dm.build_train_transform().transforms[0].__class__.__name__ == "RandomResizedCropAndInterpolation"
    assert "Flip" not in repr(dm.build_train_transform())


def test_imagenet_config_requires_root(tmp_path: Path) -> None:
    with pytest.raises(MissingMandatoryValue):
        instantiate(load_data_config("imagenet", tmp_path))


def test_imagenet_config_on_fake_imagefolder(tmp_path: Path) -> None:
    root = make_fake_imagefolder(
        tmp_path / "fake_imagenet", num_classes=3, per_class=4, img_size=64, ext="JPEG"
    )
    cfg = load_data_config("imagenet", tmp_path, root=str(root), num_classes=3, batch_size=4, num_workers=0)
    dm = instantiate(cfg)
    assert dm.num_classes == 3 and dm.img_size == 224 and dm.repeated_aug
    assert dm.mean == timm.data.IMAGENET_DEFAULT_MEAN and dm.std == timm.data.IMAGENET_DEFAULT_STD
    train_tf = repr(dm.build_train_transform())
    for piece in (
        "RandomResizedCropAndInterpolation",
        "RandomHorizontalFlip",
        "RandAugment",
        "RandomErasing",
        "bicubic",
    ):
        assert piece in train_tf, piece
    images, labels = first_batch(dm)
    assert images.shape == (4, 3, 224, 224) and images.dtype == torch.float32 and labels.shape == (4,)
    val_images, _ = next(iter(dm.val_dataloader()))
    assert val_images.shape == (4, 3, 224, 224)
    assert "CenterCrop" in repr(dm.build_eval_transform())

    # The config's 1000 classes on a folder with fewer: refused (a head whose extra classes never occur)
    dm_1000 = instantiate(load_data_config("imagenet", tmp_path, root=str(root), batch_size=4, num_workers=0))
    with pytest.raises(DataConfigError, match="data.num_classes=1000 but data.root="):
        dm_1000.setup("fit")
