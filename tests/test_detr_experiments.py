"""One training step (plus one validation step with COCO eval) for every detection experiment config,
composed as train.py composes it, on a tiny synthetic COCO with small image sizes."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
import torchvision
from omegaconf import OmegaConf

from data.coco import generate_shapes_coco
from models.detr import DetectionModule
from tests.helpers import CONFIG_DIR, compose_config

EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("detr_*.yaml"))
# Small images keep an R50 step at a second or two on CPU; the crop branch stays on where configured.
SMALL_IMAGES = [
    "data.train_scales=[64]",
    "data.max_size=96",
    "data.val_size=64",
    "data.batch_size=2",
    "data.num_workers=0",
    "trainer=cpu",
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny_coco(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny_coco") / "coco"
    return generate_shapes_coco(root, num_train=4, num_val=2, image_size=[72, 88], object_size=[10, 30])


@pytest.fixture(scope="module")
def r50_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local torchvision ResNet-50 state dict (random weights) for backbone.checkpoint."""
    path = tmp_path_factory.mktemp("ckpt") / "resnet50.pth"
    torch.save(torchvision.models.resnet50(weights=None).state_dict(), path)
    return path


def test_the_expected_experiments_exist() -> None:
    for name in (
        "detr_shapes",
        "detr_r50_baseline_150ep",
        "detr_r50_rpe19_150ep",
        "detr_r50_rpe20_150ep",
        "detr_r50_rpe20_300ep",
        "detr_r50_baseline_300ep",
    ):
        assert name in EXPERIMENTS


# `make test` steps one R50 config (with an RPE and the 300-epoch schedule); the R50 configs differ only in
# their preset and schedule, and `make slow` steps the others.
FAST_EXPERIMENTS = ("detr_shapes", "detr_r50_rpe20_300ep")


@pytest.mark.parametrize("experiment", [e if e in FAST_EXPERIMENTS else pytest.param(e, marks=pytest.mark.slow)
                                        for e in EXPERIMENTS])
def test_one_train_step(experiment: str, tiny_coco: Path, r50_checkpoint: Path, tmp_path: Path) -> None:
    import lifecycle.job as job

    overrides = [f"experiment={experiment}", f"data.root={tiny_coco}", *SMALL_IMAGES]
    if experiment.startswith("detr_r50"):
        overrides += [
            f"model.backbone.checkpoint={r50_checkpoint}",
            "data.crop_scales=[64,72]",
            "data.crop_size=[48,64]",
        ]
    else:
        overrides += ["data.generator=null"]
    cfg = compose_config(overrides, tmp_path / "run", tmp_path / "data")
    assert cfg.callbacks.model_checkpoint.monitor == "val/AP" and cfg.callbacks.model_checkpoint.mode == "max"
    assert cfg.trainer.gradient_clip_val == 0.1
    if experiment.startswith("detr_r50"):
        epochs, drop = (300, 200) if "300ep" in experiment else (150, 100)
        assert (cfg.trainer.max_epochs, cfg.model.lr_drop) == (epochs, drop)
        assert (cfg.model.lr, cfg.model.lr_backbone, cfg.model.weight_decay) == (1e-4, 1e-5, 1e-4)
        rpe = OmegaConf.to_container(cfg.rpe)["preset"]
        assert (
            rpe
            == {"baseline": "none", "rpe19": "rpe-1.9-product-ctx-1-k", "rpe20": "rpe-2.0-product-ctx-1-k"}[
                experiment.split("_")[2]
            ]
        )

    datamodule, model = job.build_data_and_model(cfg)
    assert isinstance(model, DetectionModule) and datamodule.num_classes == 3
    has_rpe = any(".rpe_k." in n for n, _ in model.named_parameters())
    assert has_rpe == (OmegaConf.to_container(cfg.rpe)["preset"] != "none")

    groups = {g["name"]: g for g in model.configure_optimizers()["optimizer"].param_groups}
    assert groups["backbone"]["lr"] == cfg.model.lr_backbone and groups["transformer"]["lr"] == cfg.model.lr

    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        fast_dev_run=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=cfg.trainer.gradient_clip_val,
    )
    trainer.fit(model, datamodule=datamodule)
    metrics = trainer.callback_metrics
    assert torch.isfinite(metrics["train/loss"])
    for key in ("val/AP", "val/AP50", "val/AP75", "val/AR100"):
        assert key in metrics and 0.0 <= float(metrics[key]) <= 100.0
    for key in model.size_class_metrics:  # logged only where the split has a box of the size, then a number
        assert key not in metrics or 0.0 <= float(metrics[key]) <= 100.0
    changed = [n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert any(n.startswith("model.transformer.") for n in changed)
    assert any(n.startswith("model.backbone.") for n in changed)
    if experiment.startswith("detr_r50"):  # the stem and layer1 stay frozen (DETR)
        assert not model.model.backbone.body[0].weight.requires_grad
        assert not any(p.requires_grad for p in model.model.backbone.body[4].parameters())
