"""COCO-layout data: the synthetic generator, the dataset's targets, transforms, collate, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from data.coco import (
    CocoDataModule,
    CocoDetectionDataset,
    CocoLayoutError,
    collate_detection,
    detr_eval_transforms,
    detr_train_transforms,
    generate_shapes_coco,
)
from data.generation import lock_path

SMALL = {"num_train": 12, "num_val": 6, "image_size": [40, 56], "object_size": [8, 20], "max_objects": 3}


@pytest.fixture(scope="module")
def shapes_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_shapes_coco(tmp_path_factory.mktemp("coco") / "shapes", **SMALL)


def test_generator_writes_a_real_coco_layout(shapes_root: Path, tmp_path: Path) -> None:
    for split, n in (("train", 12), ("val", 6)):
        ann = json.loads((shapes_root / "annotations" / f"instances_{split}2017.json").read_text())
        assert len(ann["images"]) == n and [c["id"] for c in ann["categories"]] == [1, 2, 3]
        for image in ann["images"]:
            with Image.open(shapes_root / f"{split}2017" / image["file_name"]) as im:
                assert im.size == (image["width"], image["height"])
        per_image = {a["image_id"] for a in ann["annotations"]}
        assert per_image == {im["id"] for im in ann["images"]}  # 1..max_objects objects everywhere
        for a in ann["annotations"]:
            x, y, w, h = a["bbox"]
            assert x >= 0 and y >= 0 and w >= 8 and h >= 8 and a["iscrowd"] == 0
    # Seeded: the same arguments give the same annotations; no temp folder is left behind (only the lock file).
    again = generate_shapes_coco(tmp_path / "again", **SMALL)
    for split in ("train", "val"):
        name = f"instances_{split}2017.json"
        assert (again / "annotations" / name).read_text() == (shapes_root / "annotations" / name).read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([lock_path(again).name, "again"])


def _write_tiny_coco(root: Path) -> None:
    """One 50x40 image: a normal box, a crowd box, a zero-width box, a box running off the image by less
    than the 1 px tolerance (clipped)."""
    (root / "val2017").mkdir(parents=True)
    (root / "annotations").mkdir()
    Image.new("RGB", (50, 40), (100, 100, 100)).save(root / "val2017" / "a.png")
    anns = [
        {"id": 1, "image_id": 9, "category_id": 5, "bbox": [10, 5, 20, 10], "area": 200, "iscrowd": 0},
        {"id": 2, "image_id": 9, "category_id": 2, "bbox": [0, 0, 30, 30], "area": 900, "iscrowd": 1},
        {"id": 3, "image_id": 9, "category_id": 2, "bbox": [5, 5, 0, 10], "area": 0, "iscrowd": 0},
        {"id": 4, "image_id": 9, "category_id": 2, "bbox": [40, 30, 10.75, 10.5], "area": 100, "iscrowd": 0},
    ]
    cats = [{"id": 2, "name": "two"}, {"id": 5, "name": "five"}]
    images = [{"id": 9, "file_name": "a.png", "width": 50, "height": 40}]
    payload = json.dumps({"images": images, "annotations": anns, "categories": cats})
    (root / "annotations" / "instances_val2017.json").write_text(payload)


def test_targets_drop_crowd_and_degenerate_boxes_and_map_categories(tmp_path: Path) -> None:
    _write_tiny_coco(tmp_path)
    # the zero-width box is an error by default (tests/test_data_errors.py); "drop" leaves it out
    ds = CocoDetectionDataset(tmp_path / "val2017", tmp_path / "annotations" / "instances_val2017.json", None, "drop")
    image, target = ds[0]
    assert image.shape == (3, 40, 50)
    assert ds.label_to_cat == [2, 5]
    assert target["labels"].tolist() == [1, 0]  # category 5 -> label 1, category 2 -> label 0
    # Normalised cxcywh; the last box is clipped to the image (x 40..50, y 30..40).
    expected = torch.tensor([[20 / 50, 10 / 40, 20 / 50, 10 / 40], [45 / 50, 35 / 40, 10 / 50, 10 / 40]])
    torch.testing.assert_close(target["boxes"], expected)
    assert target["image_id"].item() == 9 and target["orig_size"].tolist() == [40, 50]


def test_eval_transform_resizes_and_keeps_normalised_boxes(tmp_path: Path) -> None:
    _write_tiny_coco(tmp_path)
    ann = tmp_path / "annotations" / "instances_val2017.json"
    plain = CocoDetectionDataset(tmp_path / "val2017", ann, None, "drop")[0][1]
    image, target = CocoDetectionDataset(tmp_path / "val2017", ann, detr_eval_transforms(80, 1333), "drop")[0]
    assert image.shape == (3, 80, 100)  # shorter side 80, aspect kept
    assert target["size"].tolist() == [80, 100] and target["orig_size"].tolist() == [40, 50]
    torch.testing.assert_close(target["boxes"], plain["boxes"], atol=1e-4, rtol=0)


def test_train_transforms_crop_branch_keeps_valid_boxes(shapes_root: Path) -> None:
    torch.manual_seed(0)
    tf = detr_train_transforms(scales=[48, 56], max_size=80, crop_scales=[40, 48], crop_size=[24, 40])
    ds = CocoDetectionDataset(
        shapes_root / "train2017", shapes_root / "annotations" / "instances_train2017.json", tf
    )
    for i in range(len(ds)):
        image, target = ds[i]
        assert min(image.shape[-2:]) in (48, 56) and max(image.shape[-2:]) <= 80
        boxes = target["boxes"]
        assert len(boxes) == len(target["labels"])
        assert ((boxes >= 0) & (boxes <= 1)).all() and (boxes[:, 2:] > 0).all()


def test_collate_pads_and_masks() -> None:
    a, b = torch.ones(3, 4, 6), torch.full((3, 5, 3), 2.0)
    ta, tb = {"labels": torch.tensor([0])}, {"labels": torch.tensor([1, 2])}
    batch = collate_detection([(a, ta), (b, tb)])
    assert batch["images"].shape == (2, 3, 5, 6) and batch["mask"].shape == (2, 5, 6)
    assert not batch["mask"][0, :4, :6].any() and batch["mask"][0, 4:].all()
    assert not batch["mask"][1, :5, :3].any() and batch["mask"][1, :, 3:].all()
    assert batch["images"][0, :, 4:].abs().sum() == 0
    assert batch["targets"] == [ta, tb]


def test_missing_root_is_a_one_line_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(CocoLayoutError) as err:
        CocoDataModule(root=str(missing))
    message = str(err.value)
    assert isinstance(err.value, ValueError) and "\n" not in message
    assert str(missing) in message and "train2017/" in message and "instances_{train,val}2017.json" in message


def test_datamodule_generates_and_loads(tmp_path: Path) -> None:
    dm = CocoDataModule(
        root=str(tmp_path / "gen"),
        batch_size=4,
        num_workers=0,
        train_scales=[48],
        max_size=64,
        crop_scales=None,
        val_size=48,
        generator=SMALL,
    )
    assert dm.num_classes == 3  # known before prepare_data
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["images"].shape[0] == 4 and batch["mask"].dtype == torch.bool
    assert dm.label_to_cat == [1, 2, 3]
    assert len(list(dm.val_dataloader())) == 2  # 6 images, batch 4, no drop_last


def test_loaders_shard_across_ranks(shapes_root: Path) -> None:
    """Under DDP each rank's val loader reads its own, ordered share of the images; together all of them."""
    from types import SimpleNamespace

    from torch.utils.data import DistributedSampler

    from data.datamodule import EvaluationSampler

    def datamodule(world_size: int, rank: int) -> CocoDataModule:
        dm = CocoDataModule(root=str(shapes_root), batch_size=2, num_workers=0, train_scales=[48], max_size=64,
                            crop_scales=None, val_size=48)
        dm.trainer = SimpleNamespace(world_size=world_size, global_rank=rank)
        dm.setup("fit")
        return dm

    single = datamodule(1, 0)
    assert list(single.val_dataloader().sampler) == list(range(6))  # one process: file order
    assert single.train_dataloader().drop_last
    shards = []
    for rank in (0, 1):
        val = datamodule(2, rank).val_dataloader()
        # every image once (no padding repeats), and a DistributedSampler, which Lightning leaves as it is
        assert isinstance(val.sampler, EvaluationSampler) and not val.sampler.shuffle and not val.drop_last
        assert val.sampler.rank == rank and val.sampler.num_replicas == 2
        shards.append(list(val.sampler))
    assert shards == [[0, 2, 4], [1, 3, 5]]  # 6 val images, interleaved, in order
    train = datamodule(2, 1).train_dataloader()
    assert isinstance(train.sampler, DistributedSampler) and train.sampler.shuffle and train.drop_last
