"""DETR / DETR-iRPE checkpoints in the reference layout: export, load, key names, errors, safe loading,
and eval.py on such a file. The reference-layout names are written out here by hand (the reference's
module tree), independently of `models.detr.reference`."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest
import torch
import torchvision

from data.coco import generate_shapes_coco
from models.detr import (
    DETR,
    DetectionModule,
    ReferenceCheckpointError,
    from_reference_checkpoint,
    to_reference_checkpoint,
)
from models.detr.reference import load_reference_state
from tests.helpers import run_cli

DIM, HEADS, FFN, QUERIES, ENC, DEC = 32, 4, 64, 5, 2, 2
TINY = {"name": "tiny", "channels": [8, 16]}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def small_detr(enc_rpe: str | None = None, backbone: dict | None = None, **kwargs) -> DETR:
    torch.manual_seed(0)
    model = DETR(
        3, backbone or TINY, hidden_dim=DIM, nheads=HEADS, enc_layers=ENC, dec_layers=DEC, dim_feedforward=FFN,
        num_queries=QUERIES, enc_rpe=enc_rpe, **kwargs,
    )
    with torch.no_grad():  # non-trivial BatchNorm statistics, so that a dropped buffer would show
        for name, buf in model.named_buffers():
            if name.endswith("running_mean"):
                buf.normal_(0, 0.1)
            elif name.endswith("running_var"):
                buf.uniform_(0.5, 1.5)
    return model.eval()


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    images = torch.randn(2, 3, 64, 48, generator=gen)
    mask = torch.zeros(2, 64, 48, dtype=torch.bool)
    mask[1, 40:, :] = True
    mask[1, :, 36:] = True
    return images, mask


def assert_same_outputs(a: DETR, b: DETR) -> None:
    images, mask = inputs()
    with torch.no_grad():
        out_a, out_b = a(images, mask), b(images, mask)
    for key in ("pred_logits", "pred_boxes"):
        assert torch.equal(out_a[key], out_b[key]), key
        for aux_a, aux_b in zip(out_a["aux_outputs"], out_b["aux_outputs"], strict=True):
            assert torch.equal(aux_a[key], aux_b[key]), key


def hand_reference_keys(model: DETR, packed: bool = True) -> dict[str, str]:
    """Our key -> the reference's key, written out from the reference's module tree."""
    names: dict[str, str] = {}
    ours = model.state_dict()
    for key in ours:
        if key.startswith("backbone.body."):  # tiny backbone: the reference nests it under backbone.0
            if not key.endswith("num_batches_tracked"):
                names[key] = "backbone.0." + key.removeprefix("backbone.")
    for i in range(ENC):
        for p in ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"):
            names[f"transformer.encoder.{i}.self_attn.{p}"] = f"transformer.encoder.layers.{i}.self_attn.{p}"
        for site in "qkv":
            for table in ("lookup_table_weight", "lookup_table_bias"):
                key = f"transformer.encoder.{i}.self_attn.rpe_{site}.{table}"
                if key in ours:
                    names[key] = f"transformer.encoder.layers.{i}.self_attn.rpe_{site}.{table}"
        for p in ("linear1", "linear2"):
            for t in ("weight", "bias"):
                names[f"transformer.encoder.{i}.ffn.{p}.{t}"] = f"transformer.encoder.layers.{i}.{p}.{t}"
        for p in ("norm1", "norm2"):
            for t in ("weight", "bias"):
                names[f"transformer.encoder.{i}.{p}.{t}"] = f"transformer.encoder.layers.{i}.{p}.{t}"
    for i in range(DEC):
        for ours_attn, ref_attn in (("self_attn", "self_attn"), ("cross_attn", "multihead_attn")):
            for p in ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"):
                names[f"transformer.decoder.{i}.{ours_attn}.{p}"] = f"transformer.decoder.layers.{i}.{ref_attn}.{p}"
        for p in ("linear1", "linear2"):
            for t in ("weight", "bias"):
                names[f"transformer.decoder.{i}.ffn.{p}.{t}"] = f"transformer.decoder.layers.{i}.{p}.{t}"
        for p in ("norm1", "norm2", "norm3"):
            for t in ("weight", "bias"):
                names[f"transformer.decoder.{i}.{p}.{t}"] = f"transformer.decoder.layers.{i}.{p}.{t}"
    for t in ("weight", "bias"):
        names[f"transformer.decoder_norm.{t}"] = f"transformer.decoder.norm.{t}"
        names[f"input_proj.{t}"] = f"input_proj.{t}"
        names[f"class_embed.{t}"] = f"class_embed.{t}"
        for j in range(3):
            names[f"bbox_embed.layers.{j}.{t}"] = f"bbox_embed.layers.{j}.{t}"
    names["query_embed.weight"] = "query_embed.weight"
    return names


def hand_reference_state(model: DETR, packed: bool = True) -> dict[str, torch.Tensor]:
    """The reference-layout state dict of ``model``; ``packed=False`` splits in_proj_weight into
    q_proj_weight / k_proj_weight / v_proj_weight (nn.MultiheadAttention's unpacked form)."""
    ours = model.state_dict()
    state = {ref: ours[key].clone() for key, ref in hand_reference_keys(model).items()}
    if not packed:
        for key in [k for k in state if k.endswith("in_proj_weight")]:
            q, k, v = state.pop(key).chunk(3)
            base = key.removesuffix("in_proj_weight")
            state.update({base + "q_proj_weight": q, base + "k_proj_weight": k, base + "v_proj_weight": v})
    return state


# Every encoder RPE option of the reference (bias only on q and k there), shared or per head.
RPE_FLAGS = [
    f"rpe-{ratio}-product-{mode}-{shared}-{on}"
    for mode, sites in (("ctx", ("q", "k", "v", "qkv")), ("bias", ("q", "k", "qk")))
    for on in sites
    for shared, ratio in ((1, "2.0"), (0, "1.9"))
]


@pytest.mark.parametrize("flag", RPE_FLAGS)
def test_rpe_tables_keep_the_reference_names_and_shapes(flag: str, tmp_path: Path) -> None:
    model = small_detr(flag)
    path = to_reference_checkpoint(model, tmp_path / "ref.pth")
    state, args = load_reference_state(path)
    assert set(state) == set(hand_reference_keys(model).values())
    _, ratio, _, mode, shared, on = flag.split("-")
    buckets = {"2.0": 81, "1.9": 49}[ratio]  # (2 int(2 ratio) + 1)^2 product buckets, no skip bucket
    heads, d = (1 if shared == "1" else HEADS), DIM // HEADS
    for i in range(ENC):
        tables = {k: v for k, v in state.items() if k.startswith(f"transformer.encoder.layers.{i}.self_attn.rpe_")}
        expected = {}
        for site in on:
            key = f"transformer.encoder.layers.{i}.self_attn.rpe_{site}."
            if mode == "bias":
                expected[key + "lookup_table_bias"] = (heads, buckets)
            elif site == "v":
                expected[key + "lookup_table_weight"] = (heads, buckets, d)
            else:
                expected[key + "lookup_table_weight"] = (heads, d, buckets)
        assert {k: tuple(v.shape) for k, v in tables.items()} == expected
    assert not any("rpe" in k for k in state if ".decoder." in k)
    assert args["enc_rpe2d"] == flag  # the reference's spelling (ratio 2.0, not 2)

    # The flag from args, given explicitly, or (without args) read from the tables' names and shapes.
    bare = tmp_path / "bare.pth"
    torch.save({"model": state}, bare)
    for loaded in (
        from_reference_checkpoint(path),
        from_reference_checkpoint(bare, enc_rpe2d=flag, nheads=HEADS),
        from_reference_checkpoint(bare, nheads=HEADS),
    ):
        rpe = loaded.transformer.encoder[0].self_attn.rpe_cfg
        assert rpe.shorthand() == model.transformer.encoder[0].self_attn.rpe_cfg.shorthand()
        assert_same_outputs(model, loaded)


@pytest.mark.parametrize(
    ("flag", "packed", "kwargs"),
    [
        (None, True, {}),
        ("rpe-2.0-product-ctx-1-k", True, {}),
        ("rpe-1.9-product-ctx-0-qkv", False, {}),
        ("rpe-2.0-product-bias-1-qk", False, {"position_embedding": "learned"}),
    ],
)
def test_hand_built_reference_state_loads_with_identical_outputs(flag, packed, kwargs, tmp_path: Path) -> None:
    """A reference-layout file built by hand (packed or separate q/k/v projections) gives our model's
    outputs exactly; exporting it again gives the same keys and tensors (packed)."""
    model = small_detr(flag, **kwargs)
    state = hand_reference_state(model, packed=packed)
    if "learned" in kwargs.values():  # DETR's learned encoding sits at backbone.1 (row_embed, col_embed)
        state["backbone.1.row_embed.weight"] = model.position_embedding.row.weight.clone()
        state["backbone.1.col_embed.weight"] = model.position_embedding.col.weight.clone()
    args = argparse.Namespace(
        nheads=HEADS, enc_rpe2d=flag or "", position_embedding=kwargs.get("position_embedding", "sine"),
        backbone="tiny", lr=1e-4,
    )
    path = tmp_path / "ref.pth"
    torch.save({"model": state, "args": args, "epoch": 3}, path)
    loaded = from_reference_checkpoint(path)
    assert not loaded.training
    assert_same_outputs(model, loaded)
    again = to_reference_checkpoint(loaded, tmp_path / "again.pth")
    exported, _ = load_reference_state(again)
    expected = hand_reference_state(model, packed=True)
    if "learned" in kwargs.values():
        expected.update({k: state[k] for k in ("backbone.1.row_embed.weight", "backbone.1.col_embed.weight")})
    assert exported.keys() == expected.keys()
    assert all(torch.equal(exported[k], expected[k]) for k in expected)


@pytest.mark.filterwarnings("ignore:resnet18 with frozen BatchNorm")
def test_resnet_backbone_uses_torchvision_names(tmp_path: Path) -> None:
    """The reference keeps torchvision's ResNet child names under backbone.0.body (fc dropped, no
    num_batches_tracked with frozen BN); a ResNet-18 DETR round-trips with identical outputs."""
    model = small_detr("rpe-2.0-product-ctx-1-k", {"name": "resnet18", "norm": "frozen_bn"})
    path = to_reference_checkpoint(model, tmp_path / "r18.pth")
    state, args = load_reference_state(path)
    expected = {
        "backbone.0.body." + k
        for k in torchvision.models.resnet18(weights=None).state_dict()
        if not k.startswith("fc.") and not k.endswith("num_batches_tracked")
    }
    assert {k for k in state if k.startswith("backbone.")} == expected
    assert args["backbone"] == "resnet18"
    torch.save({"model": state}, tmp_path / "bare.pth")  # without args the block counts name the ResNet
    loaded = from_reference_checkpoint(tmp_path / "bare.pth", nheads=HEADS)
    assert loaded.backbone.name == "resnet18"
    assert_same_outputs(model, loaded)


def _one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_missing_and_unexpected_keys_are_one_line(tmp_path: Path) -> None:
    model = small_detr("rpe-2.0-product-ctx-1-k")
    state = hand_reference_state(model)
    del state["transformer.decoder.layers.1.norm2.bias"]
    state["transformer.decoder.layers.0.extra.weight"] = torch.zeros(2)
    path = tmp_path / "bad.pth"
    torch.save({"model": state, "args": argparse.Namespace(nheads=HEADS)}, path)
    with pytest.raises(ReferenceCheckpointError) as err:
        from_reference_checkpoint(path)
    text = _one_line(err)
    assert "missing keys transformer.decoder.layers.1.norm2.bias" in text
    assert "unexpected keys transformer.decoder.layers.0.extra.weight" in text

    # RPE tables in the file but a flag without RPE: the tables are unexpected, named.
    good = tmp_path / "good.pth"
    torch.save({"model": hand_reference_state(model), "args": argparse.Namespace(nheads=HEADS)}, good)
    with pytest.raises(ReferenceCheckpointError) as err:
        from_reference_checkpoint(good, enc_rpe2d="")
    assert "unexpected keys transformer.encoder.layers.0.self_attn.rpe_k.lookup_table_weight" in _one_line(err)
    # A flag whose tables have another size: one line naming the key and both shapes.
    with pytest.raises(ReferenceCheckpointError) as err:
        from_reference_checkpoint(good, enc_rpe2d="rpe-1.9-product-ctx-1-k")
    assert "rpe_k.lookup_table_weight has shape (1, 8, 81), the model expects (1, 8, 49)" in _one_line(err)


def test_checkpoint_args_are_allowed_and_nothing_else(tmp_path: Path) -> None:
    """``args`` (argparse.Namespace) loads with weights_only=True; any other class, or a pickle that
    would run code, is refused in one line without running it."""
    model = small_detr()
    state = hand_reference_state(model)
    fine = tmp_path / "with_args.pth"
    torch.save({"model": state, "args": argparse.Namespace(nheads=HEADS, enc_rpe2d="", lr_drop=100)}, fine)
    assert_same_outputs(model, from_reference_checkpoint(fine))

    marker = tmp_path / "marker"

    class RunsCode:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    hostile = tmp_path / "hostile.pth"
    torch.save({"model": state, "args": RunsCode()}, hostile)
    with pytest.raises(ReferenceCheckpointError) as err:
        from_reference_checkpoint(hostile)
    assert "weights_only=True refuses" in _one_line(err) and "system" in str(err.value)
    assert not marker.exists()

    other = tmp_path / "other.pth"
    torch.save({"model": state, "args": torch.nn.Identity()}, other)
    with pytest.raises(ReferenceCheckpointError, match="Identity"):
        from_reference_checkpoint(other)

    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ReferenceCheckpointError, match="not a readable PyTorch checkpoint"):
        from_reference_checkpoint(garbage)
    with pytest.raises(ReferenceCheckpointError, match="does not exist"):
        from_reference_checkpoint(tmp_path / "absent.pth")


def test_args_that_contradict_the_model_are_refused(tmp_path: Path) -> None:
    """Head count and RPE flag cannot always be read from shapes: the file's args must agree with the
    experiment's model (DetectionModule(weights=...))."""
    model = small_detr("rpe-2.0-product-ctx-1-k")
    path = tmp_path / "ref.pth"
    torch.save({"model": hand_reference_state(model), "args": argparse.Namespace(nheads=8)}, path)
    small = dict(
        backbone=TINY, hidden_dim=DIM, enc_layers=ENC, dec_layers=DEC, dim_feedforward=FFN, num_queries=QUERIES,
        enc_rpe2d="rpe-2.0-product-ctx-1-k", num_classes=80,
    )
    with pytest.raises(ReferenceCheckpointError) as err:
        DetectionModule(nheads=HEADS, weights=str(path), **small)
    assert "trained with nheads=8, the model has nheads=4" in _one_line(err)
    torch.save({"model": hand_reference_state(model), "args": argparse.Namespace(enc_rpe2d="rpe-2.0-product-ctx-1-k")},
               path)
    with pytest.raises(ReferenceCheckpointError) as err:
        DetectionModule(nheads=HEADS, weights=str(path), rpe="irpe_k", **{**small, "enc_rpe2d": None})
    assert "trained with enc_rpe2d='rpe-2.0-product-ctx-1-k', the model's encoder RPE is 'rpe-1.9-" in _one_line(err)

    torch.save({"model": hand_reference_state(model), "args": argparse.Namespace(dilation=True)}, path)
    with pytest.raises(ReferenceCheckpointError, match="is a DC5 model"):
        DetectionModule(nheads=HEADS, weights=str(path), **small)
    with pytest.raises(ReferenceCheckpointError, match="is a DC5 model"):
        from_reference_checkpoint(path)

    torch.save({"model": hand_reference_state(model), "args": argparse.Namespace(nheads=HEADS)}, path)
    module = DetectionModule(nheads=HEADS, weights=str(path), **small)
    assert module.model.num_classes == 3  # the checkpoint's class rows, not the data's 80
    assert_same_outputs(model, module.model.eval())


def test_labels_are_category_ids_for_a_reference_sized_head() -> None:
    """Our runs: label i -> the i-th sorted category id. Reference COCO models (max id + 1 classes):
    the label is the category id."""

    class Dataset:
        label_to_cat = [1, 2, 3]

    module = DetectionModule.__new__(DetectionModule)
    torch.nn.Module.__init__(module)
    module._eval_dataset = lambda: Dataset()
    for classes, expected in ((3, [1, 2, 3]), (4, [0, 1, 2, 3]), (91, list(range(91)))):
        module.model = argparse.Namespace(num_classes=classes)
        assert module._label_to_cat() == expected
    module.model = argparse.Namespace(num_classes=2)
    with pytest.raises(ValueError, match="the model has 2 classes, the data 3"):
        module._label_to_cat()


@pytest.fixture(scope="module")
def centred_coco(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shapes-COCO whose val images each hold one object of category 1 filling the central half of the
    image, [W/4, H/4, W/2, H/2]: a model that always predicts that box and class scores AP 100."""
    root = tmp_path_factory.mktemp("centred") / "coco"
    generate_shapes_coco(root, num_train=2, num_val=4, image_size=[72, 88], object_size=[10, 30])
    ann_file = root / "annotations" / "instances_val2017.json"
    coco = json.loads(ann_file.read_text())
    coco["annotations"] = [
        {"id": i + 1, "image_id": im["id"], "category_id": 1, "iscrowd": 0, "area": im["width"] * im["height"] / 4,
         "bbox": [im["width"] / 4, im["height"] / 4, im["width"] / 2, im["height"] / 2]}
        for i, im in enumerate(coco["images"])
    ]
    ann_file.write_text(json.dumps(coco))
    return root


def truth_predicting_detr(num_classes: int, label: int) -> DETR:
    """configs/model/detr_small.yaml's architecture (irpe_k encoder RPE) with one query whose box is the
    central half of the image (zero last box layer: sigmoid(0) = 0.5) and whose best class is ``label``."""
    torch.manual_seed(0)
    model = DETR(
        num_classes, {"name": "tiny", "norm": "bn", "channels": [32, 64, 128]}, hidden_dim=128, nheads=4,
        enc_layers=2, dec_layers=2, dim_feedforward=512, dropout=0.0, num_queries=1, enc_rpe="irpe_k",
    )
    with torch.no_grad():
        model.bbox_embed.layers[2].weight.zero_()
        model.bbox_embed.layers[2].bias.zero_()
        model.class_embed.weight.zero_()
        model.class_embed.bias.zero_()
        model.class_embed.bias[label] = 5.0
    return model


EVAL_DATA = ["data.generator=null", "data.val_size=64", "data.max_size=96", "data.num_workers=0",
             "model.num_queries=1"]


@pytest.mark.slow  # an eval.py process on DETR; the loading is tested in-process
@pytest.mark.filterwarnings("ignore")
def test_eval_cli_prints_coco_ap_for_a_reference_file(centred_coco: Path, tmp_path: Path) -> None:
    """``eval.py experiment=detr_shapes model.weights=<reference-layout file>`` on shapes-COCO: our
    contiguous labels (label 0 = category 1)."""
    weights = to_reference_checkpoint(truth_predicting_detr(3, label=0), tmp_path / "detr_small_ref.pth")
    result = run_cli("eval.py", ["experiment=detr_shapes", f"model.weights={weights}", f"data.root={centred_coco}",
                                 *EVAL_DATA], env_extra={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    header = next(line for line in result.stdout.splitlines() if "val/AP" in line)
    values = next(line for line in result.stdout.splitlines() if line.startswith("│") and "." in line)
    columns = [c.strip() for c in header.strip("┃").split("┃")]
    numbers = dict(zip(columns, (float(c) for c in values.strip("│").split("│")), strict=True))
    assert numbers["val/AP"] == 100.0 and numbers["val/AP50"] == 100.0


@pytest.mark.filterwarnings("ignore")
def test_eval_reads_reference_labels_as_category_ids(centred_coco: Path, tmp_path: Path) -> None:
    """A reference-convention head (max category id + 1 = 4 classes; label 1 is category 1) scores 100;
    the same file with label 2 (category 2) scores 0."""
    import eval as eval_script
    from tests.helpers import compose_config

    cases = [
        (truth_predicting_detr(4, 1), None, 100.0),
        (truth_predicting_detr(4, 2), None, 0.0),
        (truth_predicting_detr(3, 0), [1, 2, 3], 100.0),  # our labels written in the reference's layout
    ]
    for i, (model, label_to_cat, expected) in enumerate(cases):
        weights = to_reference_checkpoint(model, tmp_path / f"ref_{i}.pth", label_to_cat=label_to_cat)
        overrides = ["experiment=detr_shapes", f"model.weights={weights}", f"data.root={centred_coco}", *EVAL_DATA]
        cfg = compose_config(overrides, tmp_path / "eval", tmp_path / "data", config_name="eval")
        metrics = eval_script.evaluate(cfg)
        assert metrics["val/AP"] == pytest.approx(expected, abs=1e-6), i


def test_category_id_layout_keeps_every_probability(tmp_path: Path) -> None:
    """label_to_cat=[2, 5, 7]: row 2, 5, 7 hold our classes 0, 1, 2, row 8 "no object"; the other rows
    never win and the probabilities of the real classes are unchanged."""
    model = small_detr("rpe-2.0-product-ctx-1-k")
    path = to_reference_checkpoint(model, tmp_path / "cats.pth", label_to_cat=[2, 5, 7])
    state, _ = load_reference_state(path)
    assert state["class_embed.weight"].shape == (9, DIM)
    assert torch.equal(state["class_embed.weight"][[2, 5, 7, 8]], model.class_embed.weight)
    loaded = from_reference_checkpoint(path)
    images, mask = inputs()
    with torch.no_grad():
        ours = model(images, mask)["pred_logits"].softmax(-1)
        theirs = loaded(images, mask)["pred_logits"].softmax(-1)
    torch.testing.assert_close(theirs[..., [2, 5, 7, 8]], ours, rtol=1e-6, atol=1e-7)
    assert theirs[..., [0, 1, 3, 4, 6]].max() == 0
    with pytest.raises(ReferenceCheckpointError, match="label_to_cat has 2 category ids"):
        to_reference_checkpoint(model, tmp_path / "bad.pth", label_to_cat=[1, 2])


def test_reference_weights_with_category_id_classes_are_not_trained_on(tmp_path: Path) -> None:
    """Fine-tuning needs the data's labels: a 4-class (category-id) head on 3-class data is refused at fit
    in one line; a run config that names model.weights is rebuilt without reading that file again."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from data.coco import CocoDataModule
    from lifecycle.run_config import build_data_and_model

    path = to_reference_checkpoint(truth_predicting_detr(4, 1), tmp_path / "ref.pth")
    small = dict(backbone={"name": "tiny", "norm": "bn", "channels": [32, 64, 128]}, hidden_dim=128, nheads=4,
                 enc_layers=2, dec_layers=2, dim_feedforward=512, num_queries=1, enc_rpe2d="irpe_k")
    module = DetectionModule(num_classes=3, weights=str(path), **small)
    datamodule = CocoDataModule.__new__(CocoDataModule)
    datamodule.num_classes = 3
    module._trainer = SimpleNamespace(datamodule=datamodule)
    with pytest.raises(ValueError) as err:
        module.setup("fit")
    assert "has 4 classes (reference layout: labels are category ids), the data has 3" in _one_line(err)
    module.setup("validate")  # evaluating is fine

    cfg = OmegaConf.create({
        "data": {"_target_": "data.coco.CocoDataModule", "root": str(tmp_path / "absent"), "num_classes": 3},
        "model": {"_target_": "models.detr.DetectionModule", "weights": str(tmp_path / "gone.pth"), **small},
    })
    _, rebuilt = build_data_and_model(cfg)
    assert rebuilt.model.num_classes == 3 and rebuilt.hparams.get("weights") is None


def test_export_never_lands_in_a_run_dir_or_a_data_root(tmp_path: Path) -> None:
    """Probe 4 (cases 45, 46, read for this exporter): a reference export is a destination like any other: never
    over a run's files, never inside a data root; one line, nothing written."""
    run = tmp_path / "runs" / "d2"
    (run / "checkpoints").mkdir(parents=True)
    (run / "run.json").write_text('{"state": "finished"}')
    (run / "checkpoints" / "best.ckpt").write_bytes(b"the run's weights")
    data = tmp_path / "coco"
    data.mkdir()
    (data / ".complete.json").write_text("{}")
    model = small_detr()
    for path, where in ((run / "checkpoints" / "best.ckpt", f"is inside the run dir {run}"),
                        (data / "ref.pth", f"is inside the data root {data}")):
        with pytest.raises(ReferenceCheckpointError, match=f"to_reference_checkpoint path='{path}' {where}") as err:
            to_reference_checkpoint(model, path)
        _one_line(err)
    assert (run / "checkpoints" / "best.ckpt").read_bytes() == b"the run's weights"
    assert not (data / "ref.pth").exists()
