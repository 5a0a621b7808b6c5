"""Our DeiT against timm's own models; the reference model-zoo names and checkpoint layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch

import models
from models import REFERENCE_ZOO, ModelConfigError, create_model


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_timm_deit_small_weights_give_identical_logits() -> None:
    reference = timm.create_model("deit_small_patch16_224", pretrained=False).eval()
    ours = create_model("deit_small_patch16_224", rpe="none").eval()
    ours.load_state_dict(reference.state_dict(), strict=True)
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(images), reference(images), rtol=0, atol=1e-5)


def test_rpe_tables_follow_reference_layout() -> None:
    model = create_model("deit_small_patch16_224", rpe="irpe_k")
    state = model.state_dict()
    assert state["blocks.0.attn.rpe_k.lookup_table_weight"].shape == (1, 64, 50)
    assert "blocks.11.attn.rpe_k.lookup_table_weight" in state
    assert not any(".rpe_q." in k or ".rpe_v." in k for k in state)


def test_reference_zoo_names_are_registered_without_shadowing_timm() -> None:
    for name in REFERENCE_ZOO:
        assert name in timm.list_models(), name
    plain = timm.create_model("deit_small_patch16_224")
    assert type(plain).__name__ == "VisionTransformer"
    assert not any("rpe_" in k for k in plain.state_dict())


def test_reference_checkpoint_loads_through_timm(tmp_path: Path) -> None:
    """A reference-layout file ({'model': state_dict}) loads via pretrained_cfg_overlay(file=...)."""
    name = "deit_tiny_patch16_224_ctx_product_50_shared_k"
    source = timm.create_model(name)
    with torch.no_grad():
        for key, value in source.state_dict().items():
            if key.endswith("lookup_table_weight"):
                value.normal_()
    path = tmp_path / "irpe_tiny.pth"
    torch.save({"model": source.state_dict()}, path)
    loaded = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=str(path))).eval()
    images = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), source.eval()(images))
    assert loaded.state_dict()["blocks.3.attn.rpe_k.lookup_table_weight"].abs().sum() > 0


def test_zoo_entries_use_their_presets() -> None:
    model = timm.create_model("deit_small_patch16_224_ctx_product_50_shared_qkv")
    keys = model.state_dict().keys()
    assert {"blocks.0.attn.rpe_q.lookup_table_weight", "blocks.0.attn.rpe_v.lookup_table_weight"} <= set(keys)
    cross = create_model("deit_small_patch16_224_ctx_cross_56_shared_k")
    assert "blocks.0.attn.rpe_k.rp_rows.lookup_table_weight" in cross.state_dict()


@pytest.mark.parametrize("ape", ["learned", "sincos", "none"])
def test_ape_switch(ape: str) -> None:
    model = create_model("deit_micro_patch4_32", rpe="irpe_k", ape=ape, num_classes=8)
    if ape == "none":
        assert model.pos_embed is None
    elif ape == "sincos":
        assert not model.pos_embed.requires_grad and model.pos_embed.abs().sum() > 0
    else:
        assert model.pos_embed.requires_grad
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 8)


def _random_rpe_tables(model: torch.nn.Module) -> None:
    """The iRPE tables start at zero (no relative term): fill them so that the grid matters."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".rpe_" in name:
                param.normal_()


def test_dynamic_input_grid_is_each_calls_own_and_never_kept() -> None:
    """Behaviour change: the grid is no longer left on the layers after a forward. A 6x10 input and then a
    10x6 one (the same 60 tokens) give what fixed-size models of those sizes give, through forward and
    forward_intermediates; between calls no layer holds a grid, so a block called on its own refuses."""
    net = dict(rpe="irpe_k", ape="none", num_classes=8)
    dynamic = create_model("deit_micro_patch4_32", dynamic_img_size=True, **net).eval()
    _random_rpe_tables(dynamic)
    seen = []
    dynamic.blocks[0].attn.register_forward_pre_hook(lambda module, args: seen.append(module.grid_size))
    for size in [(24, 40), (40, 24)]:
        fixed = create_model("deit_micro_patch4_32", img_size=size, **net).eval()
        fixed.load_state_dict(dynamic.state_dict())
        images = torch.randn(1, 3, *size)
        with torch.no_grad():
            torch.testing.assert_close(dynamic.forward_features(images), fixed.forward_features(images))
            got = dynamic.forward_intermediates(images, indices=[1, 3])
            want = fixed.forward_intermediates(images, indices=[1, 3])
        for g, w in zip([got[0], *got[1]], [want[0], *want[1]], strict=True):
            torch.testing.assert_close(g, w)
        assert dynamic.blocks[0].attn.grid_size is None
    assert seen == [(6, 10), (6, 10), (10, 6), (10, 6)]
    with pytest.raises(ValueError, match=r"grid_size=\(h, w\) is required"):
        dynamic.blocks[0](torch.randn(1, 60, 128))


def test_fixed_size_grid_is_the_patch_grid_from_construction_and_resize() -> None:
    """A fixed-size model's layers hold its patch grid from the start (timm's forward_intermediates and
    blocks work on a fresh model); ``set_input_size`` gives them the new grid, as a model built at that size."""
    model = create_model("deit_micro_patch4_32", rpe="irpe_k", ape="none", num_classes=8).eval()
    _random_rpe_tables(model)
    assert {block.attn.grid_size for block in model.blocks} == {(8, 8)}
    model.set_input_size(img_size=(48, 32))
    assert {block.attn.grid_size for block in model.blocks} == {(12, 8)}
    built = create_model("deit_micro_patch4_32", rpe="irpe_k", ape="none", num_classes=8, img_size=(48, 32)).eval()
    built.load_state_dict(model.state_dict())
    images = torch.randn(2, 3, 48, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(images), built.forward_features(images))


def test_unknown_model_name_is_a_clear_error() -> None:
    with pytest.raises(ModelConfigError, match="deit_small_patch16_224"):
        create_model("deit_enormous")
    with pytest.raises(ModelConfigError, match="sincos"):
        create_model("deit_micro_patch4_32", ape="rotary")
    assert "deit_micro_patch4_32" in models.model_names()


@pytest.mark.parametrize("name,rpe,tables", [
    ("swin_micro_patch4_window4_32", "swin", 4),  # timm's own bias table, one per block
    ("swin_micro_patch4_window4_32", "irpe_k", 4),  # the iRPE tables that replace it
    ("swin_micro_patch4_window4_32", "none", 0),
    ("deit_micro_patch4_32", "irpe_k", 4 + 1),  # the key tables of 4 blocks and timm's pos_embed
    ("swinv2_micro_window4_32", "cpb", 4 * 3),  # timm's CPB MLP in each of 4 blocks: 2 weights, 1 bias
    ("swinv2_micro_window4_32", "irpe_k", 4),  # the iRPE tables that replace it
])
def test_every_position_table_gets_the_position_budget(name: str, rpe: str, tables: int) -> None:
    """The position group holds every parameter that carries position, whichever module owns it: Swin's own
    bias table (timm's) as well as the tables of our encodings, and nothing else."""
    from rpe.base import position_parameters

    net = create_model(name, rpe=rpe, num_classes=8)
    position = {id(p) for p in position_parameters(net)}
    names = [n for n, p in net.named_parameters() if id(p) in position]
    assert len(names) == tables, names
    carrying = ("relative_position_bias_table", "lookup_table", "pos_embed", "cpb_mlp")
    assert all(any(word in n for word in carrying) for n in names), names
    assert not [n for n, p in net.named_parameters() if id(p) not in position and any(w in n for w in carrying)]


def test_adamw_multi_tensor_update_is_bit_identical_on_our_param_groups() -> None:
    """The classification module asks timm's AdamW for ``foreach=True`` (one multi-tensor update, faster on CPU):
    on the module's own parameter groups (weight decay and the position budget) it moves every parameter to
    exactly the values of the per-parameter loop."""
    import copy

    import torch
    from timm.optim import create_optimizer_v2

    from models.classification import position_groups

    torch.manual_seed(0)
    nets = [create_model("deit_micro_patch4_32", rpe="irpe_k", embed_dim=64, num_classes=8)]
    nets.append(copy.deepcopy(nets[0]))
    optimizers = [create_optimizer_v2(position_groups(net, 0.05, 30.0, 0.0), opt="adamw", lr=1e-3, weight_decay=0.05,
                                      foreach=foreach) for net, foreach in zip(nets, (False, True), strict=True)]
    for _ in range(5):
        grads = [torch.randn_like(p) for p in nets[0].parameters()]
        for net, optimizer in zip(nets, optimizers, strict=True):
            for p, g in zip(net.parameters(), grads, strict=True):
                p.grad = g.clone()
            optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True))


DEIT_MICRO, SWIN_MICRO, SWINV2_MICRO = "deit_micro_patch4_32", "swin_micro_patch4_window4_32", "swinv2_micro_window4_32"


def _small_detr(**kwargs: object) -> dict[str, object]:
    return dict(num_classes=2, backbone={"name": "tiny", "channels": [8, 16]}, hidden_dim=16, nheads=2, enc_layers=1,
                dec_layers=1, dim_feedforward=32, num_queries=2, **kwargs)


def _rpe_of(model: torch.nn.Module):
    """The RPE a built model carries (a DETR: its encoder's; no RPE there is the none preset)."""
    from rpe import PRESETS

    if hasattr(model, "rpe_config"):
        return model.rpe_config
    return model.transformer.encoder[0].self_attn.rpe_cfg or PRESETS["none"]


def _model_routes() -> dict[str, object]:
    """Every way to build a model without the command line; each takes ``**rpe`` (``rpe=...`` or nothing)."""
    from models.classification import ClassificationModule
    from models.deit import DEIT_ARCHS
    from models.detr import DETR, DetectionModule
    from models.swin import SWIN_ARCHS, RPESwinTransformer
    from models.swin_v2 import SWIN_V2_ARCHS, RPESwinTransformerV2

    return {
        "create_model(deit)": lambda **rpe: create_model(DEIT_MICRO, num_classes=2, **rpe),
        "create_model(swin)": lambda **rpe: create_model(SWIN_MICRO, num_classes=2, **rpe),
        "create_model(swinv2)": lambda **rpe: create_model(SWINV2_MICRO, num_classes=2, **rpe),
        "RPEVisionTransformer": lambda **rpe: models.RPEVisionTransformer(**DEIT_ARCHS[DEIT_MICRO], **rpe),
        "RPESwinTransformer": lambda **rpe: RPESwinTransformer(**SWIN_ARCHS[SWIN_MICRO], **rpe),
        "RPESwinTransformerV2": lambda **rpe: RPESwinTransformerV2(**SWIN_V2_ARCHS[SWINV2_MICRO], **rpe),
        "ClassificationModule": lambda **rpe: ClassificationModule({"name": DEIT_MICRO}, num_classes=2, **rpe).net,
        "DETR": lambda **rpe: DETR(**_small_detr(**{f"enc_{k}": v for k, v in rpe.items()})),
        "DetectionModule": lambda **rpe: DetectionModule(**_small_detr(**rpe)).model,
    }


@pytest.mark.parametrize("route", list(_model_routes()))
def test_the_default_rpe_is_the_same_on_every_model_route(route: str) -> None:
    """A model whose RPE is not named gets `rpe.DEFAULT_PRESET` whatever builds it; None is no RPE."""
    from rpe import DEFAULT_PRESET, PRESETS

    build = _model_routes()[route]
    assert _rpe_of(build()) == PRESETS[DEFAULT_PRESET]
    assert _rpe_of(build(rpe=None)) == PRESETS["none"]


def test_timm_names_without_a_tag_and_zoo_names_keep_their_rule() -> None:
    """timm's untagged ``*_rpe`` names use the default preset; a zoo name, its own preset."""
    from rpe import DEFAULT_PRESET, PRESETS

    untagged = timm.create_model("deit_tiny_patch16_224_rpe", img_size=32, num_classes=2)
    assert untagged.rpe_config == PRESETS[DEFAULT_PRESET]
    zoo = create_model("deit_small_patch16_224_ctx_euc_20_shared_k", img_size=32, num_classes=2)
    assert zoo.rpe_config == PRESETS["irpe_euc_k"]


@pytest.mark.parametrize("name", [DEIT_MICRO, SWIN_MICRO, SWINV2_MICRO])
def test_pretrained_on_a_model_without_weights_is_one_line_naming_the_valid_models(name: str) -> None:
    with pytest.raises(ValueError) as err:
        create_model(name, pretrained=True)
    message = str(err.value)
    assert message.startswith(f"pretrained=True: {name} has no pretrained weights; valid with pretrained=True")
    assert "\n" not in message
    valid = message.split("pretrained_cfg_overlay=dict(file=...)): ")[1].split(";")[0].split(", ")
    assert valid and all(v in models.model_names() and "_micro_" not in v for v in valid), valid


def test_deit_pretrained_true_loads_the_weights(tmp_path: Path) -> None:
    """``create_model(<DeiT>, pretrained=True)`` loads the file it is given instead of ignoring the flag."""
    source = create_model("deit_tiny_patch16_224", img_size=32)
    path = tmp_path / "deit_tiny.pth"
    torch.save(source.state_dict(), path)
    loaded = create_model("deit_tiny_patch16_224", img_size=32, pretrained=True,
                          pretrained_cfg_overlay=dict(file=str(path)))
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_the_evaluation_loss_is_the_mean_over_every_image_of_every_rank() -> None:
    """Three ranks with 6, 5 and 5 images: the loss is the mean over the 16 images, not the mean of the three
    ranks' means (which a ``sync_dist`` mean of Lightning's per-rank means gave: 2.2550 where one process had
    2.1141). The ranks' states are merged as torchmetrics merges them across processes."""
    from models.classification import MeanOverImages

    losses = [torch.tensor([3.0] * 6), torch.tensor([1.0] * 5), torch.tensor([0.5, 0.5, 0.5, 0.5, 9.0])]
    ranks = []
    for per_image in losses:
        metric = MeanOverImages()
        for batch in per_image.split(4):  # batches of 4 and the rest
            metric.update(batch.mean(), len(batch))
        ranks.append(metric)
    merged = ranks[0]
    for other in ranks[1:]:
        merged.merge_state(other)
    everything = torch.cat(losses)
    assert merged.compute().item() == pytest.approx(everything.mean().item(), rel=1e-6)  # 29/16
    assert merged.compute().item() != pytest.approx(torch.stack([x.mean() for x in losses]).mean().item())
