"""Fault-probe cases of the DETR backbone and the data layer, each refused in one line naming the setting:

- DETR backbone: every ``model.backbone.*`` option is used or refused (tiny ignored norm, train_layers and
  checkpoint; a ResNet froze everything for a mistyped stage); a missing checkpoint is named;
- shapes-COCO generator: an object size larger than the smallest image was silently capped;
- COCO: an image ``file_name`` outside the split's image folder (absolute, ``..``) was opened;
- ImageFolder: a ``data.num_classes`` above the folder count only warned; a bad interpolation was a
  KeyError traceback; differing train/val class folders were not named.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from PIL import Image

from data import DataConfigError, ImageFolderDataModule, make_fake_imagefolder
from data.coco import CocoDetectionDataset, check_shapes_settings, generate_shapes_coco
from lifecycle.console import one_line, root_cause
from models.detr.backbone import BackboneConfigError, TinyBackbone, build_backbone
from models.errors import ModelConfigError
from tests.helpers import compose_config


def _one_line(err: pytest.ExceptionInfo, kind: type[Exception]) -> str:
    message = str(err.value)
    assert isinstance(err.value, kind) and "\n" not in message, message
    return message


# ------------------------------------------------------------------------------------ DETR backbone
TINY_CONFIG = {"name": "tiny", "norm": "bn", "train_layers": ["all"], "return_layer": "layer4", "checkpoint": None,
               "channels": [8, 16], "stem_stride": 4}


@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        ({"norm": "gn"}, ["model.backbone.norm=gn is not used by the tiny backbone", "valid for tiny: bn"]),
        ({"norm": "frozen_bn"}, ["model.backbone.norm=frozen_bn"]),
        ({"train_layers": ["layer7"]},
         ["model.backbone.train_layers=['layer7']: layer7 is not a stage of the tiny",
          "valid entries: stem, layer1, all"]),
        ({"checkpoint": "/nonexistent/resnet.pth"},
         ["model.backbone.checkpoint=/nonexistent/resnet.pth is not used by the tiny backbone",
          "valid for tiny: null"]),
        ({"return_layer": "layer3"}, ["model.backbone.return_layer=layer3 is not used by the tiny backbone"]),
        ({"channels": [8, 0]}, ["model.backbone.channels=[8, 0] must be a non-empty list of positive widths"]),
        ({"stem_stride": 0}, ["model.backbone.stem_stride=0 must be a positive integer"]),
        ({"dilation": True}, ["unknown backbone option(s) model.backbone.dilation", "valid: name, norm"]),
        ({"name": "resnet9"}, ["model.backbone.name='resnet9' is not a backbone",
                               "valid: resnet18, resnet34, resnet50, resnet101, tiny"]),
    ],
)
def test_tiny_backbone_uses_or_refuses_every_option(change: dict, fragments: list[str]) -> None:
    with pytest.raises(BackboneConfigError) as err:
        build_backbone(**{**TINY_CONFIG, **change})
    message = _one_line(err, ModelConfigError)
    for fragment in fragments:
        assert fragment in message, message


def test_tiny_train_layers_freeze_the_other_stages() -> None:
    net = build_backbone(**{**TINY_CONFIG, "channels": [8, 16, 32], "train_layers": ["layer2"]})
    trainable = {int(n.split(".")[1]) for n, p in net.named_parameters() if p.requires_grad}
    assert trainable == {9, 10, 12, 13}  # layer2 = body[9:15]: conv, bn, relu, conv, bn, relu
    assert not any(p.requires_grad for p in net.body[:9].parameters())  # stem (0-2) and layer1 (3-8)
    assert all(p.requires_grad for p in build_backbone(**TINY_CONFIG).parameters())
    assert not any(p.requires_grad for p in build_backbone(**{**TINY_CONFIG, "train_layers": []}).parameters())
    assert TinyBackbone.stage_names(3) == ["stem", "layer1", "layer2"]


@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        ({"train_layers": ["layer7"]},
         ["model.backbone.train_layers=['layer7']: layer7 is not a stage of the resnet18 (return_layer=layer4)",
          "valid entries: stem, layer1, layer2, layer3, layer4, all"]),
        ({"return_layer": "layer3"}, ["layer4 is not a stage of the resnet18 (return_layer=layer3)"]),
        ({"checkpoint": "/nonexistent/resnet.pth"},
         ["model.backbone.checkpoint=/nonexistent/resnet.pth does not exist"]),
        ({"norm": "gn"}, ["model.backbone.norm='gn' is not valid for resnet18; valid: frozen_bn, bn"]),
        ({"return_layer": "layer5"}, ["model.backbone.return_layer='layer5' is not a stage of resnet18"]),
        ({"channels": [8, 16]}, ["model.backbone.channels=[8, 16] is not used by the resnet18 backbone",
                                 "it applies to name=tiny only"]),
        ({"stem_stride": 2}, ["model.backbone.stem_stride=2 is not used by the resnet18 backbone"]),
    ],
)
def test_resnet_backbone_refuses_bad_options(change: dict, fragments: list[str]) -> None:
    config = {"name": "resnet18", "norm": "bn", "train_layers": ["layer2", "layer3", "layer4"],
              "return_layer": "layer4", "checkpoint": None, "channels": [32, 64, 128], "stem_stride": 4}
    with pytest.raises(BackboneConfigError) as err:
        build_backbone(**{**config, **change})
    message = _one_line(err, ModelConfigError)
    for fragment in fragments:
        assert fragment in message, message


def test_unreadable_resnet_checkpoint_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "resnet.pth"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(BackboneConfigError) as err:
        build_backbone(name="resnet18", norm="bn", checkpoint=str(bad))
    assert f"model.backbone.checkpoint={bad} cannot be read as a state dict" in _one_line(err, ModelConfigError)
    with pytest.raises(BackboneConfigError) as err:
        build_backbone(name="resnet18", norm="bn", checkpoint=str(tmp_path))
    assert f"model.backbone.checkpoint={tmp_path} is not a file: it is a directory;" in _one_line(err, ModelConfigError)
    with pytest.raises(BackboneConfigError) as err:  # probe 16, p45/p46: a device is named, never "does not exist"
        build_backbone(name="resnet18", norm="bn", checkpoint="/dev/zero")
    assert "model.backbone.checkpoint=/dev/zero is not a file: it is a device;" in _one_line(err, ModelConfigError)
    torch.save([1, 2], bad)
    with pytest.raises(BackboneConfigError) as err:
        build_backbone(name="resnet18", norm="bn", checkpoint=str(bad))
    assert "holds a list, not a state dict" in _one_line(err, ModelConfigError)


@pytest.mark.parametrize("experiment", ["detr_shapes"])
def test_detr_configs_stay_valid_and_bad_backbone_overrides_are_refused(tmp_path: Path, experiment: str) -> None:
    """The shared backbone block (configs/model/detr_r50.yaml) builds for tiny and ResNet alike; an
    override through the config reaches `build_backbone` and is refused there."""
    base = [f"experiment={experiment}", "data.generator.num_train=4", "data.generator.num_val=2"]
    cfg = compose_config(base, tmp_path / "ok", tmp_path)
    assert cfg.model.backbone.name == "tiny"
    model = instantiate(cfg.model, num_classes=3)
    assert all(p.requires_grad for p in model.model.backbone.parameters())  # train_layers: [all]
    r18 = dict(cfg.model.backbone, name="resnet18", norm="bn", train_layers=["layer2", "layer3", "layer4"])
    assert build_backbone(**r18).num_channels == 512  # the ResNet reads the same block (channels: tiny only)
    for override, fragment in [
        ("model.backbone.norm=gn", "model.backbone.norm=gn is not used by the tiny backbone"),
        ("model.backbone.train_layers=[layer7]", "layer7 is not a stage of the tiny"),
        ("model.backbone.checkpoint=/nonexistent/resnet.pth", "model.backbone.checkpoint=/nonexistent/resnet.pth"),
    ]:
        bad = compose_config([*base, override], tmp_path / "bad", tmp_path)
        with pytest.raises(Exception) as err:  # Hydra wraps it; train.py reports the root cause in one line
            instantiate(bad.model, num_classes=3)
        cause = root_cause(err.value)
        assert isinstance(cause, BackboneConfigError) and fragment in one_line(err.value), one_line(err.value)


# ------------------------------------------------------------------------------------ shapes generator
SHAPES = {"num_train": 4, "num_val": 2, "image_size": [40, 40], "object_size": [12, 48], "max_objects": 2,
          "max_overlap": 0.5}


def test_object_larger_than_the_smallest_image_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataConfigError) as err:
        generate_shapes_coco(tmp_path / "shapes", **SHAPES)
    assert _one_line(err, DataConfigError) == (
        "data.generator.object_size=[12, 48] does not fit image_size=[40, 40]: the largest object (48 px) must "
        "fit the smallest image (40 px); valid: object_size[1] <= 40"
    )
    assert not (tmp_path / "shapes").exists()
    # A range of image sizes: the smallest image bounds the largest object.
    with pytest.raises(DataConfigError, match=r"valid: object_size\[1\] <= 40"):
        check_shapes_settings(4, 2, [40, 96], [12, 41], 2, 0.5)
    check_shapes_settings(4, 2, [40, 96], [12, 40], 2, 0.5)  # fits exactly


# ------------------------------------------------------------------------------------ COCO file names
def _coco_split(root: Path, file_name: str) -> tuple[Path, Path]:
    folder = root / "val2017"
    (folder / "sub").mkdir(parents=True)
    (root / "annotations").mkdir()
    Image.new("RGB", (20, 10)).save(folder / "sub" / "a.png")
    images = [{"id": 7, "file_name": file_name, "width": 20, "height": 10}]
    anns = [{"id": 1, "image_id": 7, "category_id": 1, "bbox": [1, 1, 5, 5], "area": 25.0, "iscrowd": 0}]
    ann_file = root / "annotations" / "instances_val2017.json"
    ann_file.write_text(json.dumps({"images": images, "annotations": anns, "categories": [{"id": 1, "name": "x"}]}))
    return folder, ann_file


@pytest.mark.parametrize("file_name", ["../../../../etc/hostname", "/etc/hostname", "sub/../../outside.png", ".."])
def test_image_path_outside_the_image_folder_is_refused(tmp_path: Path, file_name: str) -> None:
    folder, ann_file = _coco_split(tmp_path, file_name)
    with pytest.raises(DataConfigError) as err:
        CocoDetectionDataset(folder, ann_file, None)
    assert _one_line(err, DataConfigError) == (
        f"{ann_file}: image id 7 has file_name {file_name!r}, which points outside the image folder {folder}; "
        "file names must be relative paths inside it (no absolute path, no '..')"
    )


def test_image_paths_inside_the_folder_still_load(tmp_path: Path) -> None:
    folder, ann_file = _coco_split(tmp_path, "./sub//a.png")
    image, target = CocoDetectionDataset(folder, ann_file, None)[0]
    assert tuple(image.shape[-2:]) == (10, 20) and len(target["labels"]) == 1


def test_missing_file_name_is_refused(tmp_path: Path) -> None:
    folder, ann_file = _coco_split(tmp_path, "")
    with pytest.raises(DataConfigError, match="image id 7 has file_name ''; expected the image's path relative"):
        CocoDetectionDataset(folder, ann_file, None)


# ------------------------------------------------------------------------------------ ImageFolder module
def _dm(root: Path, **kwargs) -> ImageFolderDataModule:
    return ImageFolderDataModule(root=str(root), img_size=8, batch_size=2, num_workers=0, **kwargs)


def test_num_classes_must_match_the_class_folders(tmp_path: Path) -> None:
    root = make_fake_imagefolder(tmp_path / "fake", num_classes=2, per_class=2, img_size=8)
    for configured in (5, 1):
        with pytest.raises(DataConfigError) as err:
            _dm(root, num_classes=configured).setup("fit")
        assert _one_line(err, DataConfigError) == (
            f"data.num_classes={configured} but data.root={root} has 2 class folders; set data.num_classes=2 "
            "(or null to count them)"
        )
    dm = _dm(root)  # null: counted
    dm.setup("fit")
    assert dm.num_classes == 2
    dm = _dm(root, num_classes=2)
    dm.setup("fit")
    assert dm.num_classes == 2
    with pytest.raises(DataConfigError, match="data.num_classes=0 must be a positive integer, or null"):
        _dm(root, num_classes=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"eval_interpolation": "foo"},
         "data.eval_interpolation='foo' is not one of: nearest, bilinear, bicubic, box, hamming, lanczos"),
        ({"eval_interpolation": "random"}, "data.eval_interpolation='random' is not one of: nearest"),
        ({"train_transform": {"interpolation": "foo"}},
         "data.train_transform.interpolation='foo' is not one of: nearest, bilinear, bicubic, box, hamming, "
         "lanczos, random"),
        ({"train_transform": {"re_mode": "noise", "re_prob": 0.25}},
         "data.train_transform.re_mode='noise' is not one of: const, rand, pixel"),
        ({"train_transform": {"train_crop_mode": "zoom"}},
         "data.train_transform.train_crop_mode='zoom' is not one of: rrc, rkrc, rkrr"),
    ],
)
def test_string_choices_are_checked_up_front(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(DataConfigError) as err:
        _dm(tmp_path / "not_needed", **kwargs)  # refused at construction: no data is read
    assert _one_line(err, DataConfigError).startswith(message)


def test_valid_interpolations_build(tmp_path: Path) -> None:
    dm = _dm(tmp_path, eval_interpolation="bilinear", train_transform={"interpolation": "random", "re_mode": "pixel"})
    assert "bilinear" in repr(dm.build_eval_transform()).lower()
    dm.build_train_transform()


def test_differing_class_folders_are_named(tmp_path: Path) -> None:
    root = make_fake_imagefolder(tmp_path / "fake", num_classes=3, per_class=2, img_size=8)
    shutil.move(root / "val" / "class_001", root / "val" / "class_009")
    with pytest.raises(DataConfigError) as err:
        _dm(root).setup("fit")
    assert _one_line(err, DataConfigError) == (
        f"data.root={root}: the class folders of train/ (3) and val/ (3) differ (only in train/: class_001; only in "
        "val/: class_009); they must match, as labels are indexed by sorted folder name"
    )
    shutil.rmtree(root / "val" / "class_009")
    with pytest.raises(DataConfigError, match=r"train/ \(3\) and val/ \(2\) differ \(only in train/: class_001\)"):
        _dm(root).setup("fit")
