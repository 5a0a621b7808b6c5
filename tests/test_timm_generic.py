"""timm's generic per-model checks (those of timm's own tests/test_models.py, written here) over every model
name this project registers in timm, on small overrides of each architecture.

What each check asserts follows timm's test of the same name: forward (and grad checkpointing giving the
same output), backward (every parameter gets a gradient), default cfgs (classifier and first-conv names,
feature sizes, reset_classifier), forward_intermediates and features_only (also ``feature_cls='getter'``),
torch.fx forward (same output as eager) and backward. TorchScript is declared unsupported, as timm
declares its non-scriptable models: the models refuse ``torch.jit.script`` with one clear line.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import timm
import torch
from timm.layers import get_channel_dim, get_spatial_dim
from timm.models import FeatureInfo, get_model_input_config, get_notrace_functions, get_notrace_modules
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

import models
import rpe
from models import REFERENCE_ZOO
from models.timm_tags import RPE_SUFFIX, preset_tags

DEIT_SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2)
SWIN_SMALL = dict(img_size=32, window_size=4, embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4))

RPE_NAMES = sorted(timm.list_models(f"*{RPE_SUFFIX}"))
REGISTERED = sorted(REFERENCE_ZOO) + RPE_NAMES
# A few presets of other kinds per family on top of every name's default (the tags all pass
# forward/backward in test_every_preset_tag_builds_and_trains).
EXTRA_TAGS = [
    "deit_small_patch16_224_rpe.irpe_qkv", "deit_small_patch16_224_rpe.rope_mixed",
    "deit_small_patch16_224_rpe.alibi", "deit_small_patch16_224_rpe.xl",
    "swin_tiny_patch4_window7_224_rpe.swin", "swin_tiny_patch4_window7_224_rpe.irpe_qkv",
    "swin_tiny_patch4_window7_224_rpe.rope_axial", "swin_tiny_patch4_window7_224_rpe.cpb",
    "swinv2_tiny_window8_256_rpe.cpb", "swinv2_tiny_window8_256_rpe.irpe_qkv",
]
# timm's own DeiT, Swin and Swin-v2 go through the same checks: what "behaves like timm's model" is measured against.
TIMM_OWN = ["deit_small_patch16_224", "swin_tiny_patch4_window7_224", "swinv2_tiny_window8_256"]
CHECKED = REGISTERED + EXTRA_TAGS + TIMM_OWN
# One name per family for the checks that need no more (fx feature extraction, TorchScript's refusal).
SWIN_NAMES = ["swin_tiny_patch4_window7_224_rpe", "swinv2_tiny_window8_256_rpe"]
ONE_PER_FAMILY = [REGISTERED[0], "deit_tiny_patch16_224_rpe", *SWIN_NAMES]


def small(name: str) -> dict:
    return SWIN_SMALL if name.startswith("swin") else DEIT_SMALL


def build(name: str, **kwargs) -> torch.nn.Module:
    return timm.create_model(name, pretrained=False, **{**small(name), **kwargs})


def input_size(model: torch.nn.Module) -> tuple[int, int, int]:
    return tuple(get_model_input_config(model)["input_size"])


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_every_registered_name_is_listed_by_timm() -> None:
    assert set(REFERENCE_ZOO) <= set(timm.list_models())
    assert RPE_NAMES == ["deit_base_patch16_224_rpe", "deit_small_patch16_224_rpe", "deit_tiny_patch16_224_rpe",
                         "swin_tiny_patch4_window7_224_rpe", "swinv2_tiny_window8_256_rpe"]
    tagged = set(timm.list_models(f"*{RPE_SUFFIX}", include_tags=True))
    assert {f"{name}.{tag}" for name in RPE_NAMES for tag in preset_tags()} == tagged
    for name in REGISTERED:  # built for one input size, as timm's DeiT and Swin
        assert timm.get_pretrained_cfg_value(name, "fixed_input_size") is True, name


@pytest.mark.parametrize("name", CHECKED)
def test_forward(name: str) -> None:
    model = build(name).eval()
    x = torch.randn(1, *input_size(model))
    with torch.no_grad():
        out = model(x)
        assert out.shape == (1, 1000) and not out.isnan().any()
        model.set_grad_checkpointing()
        torch.testing.assert_close(model(x), out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", CHECKED)
def test_backward(name: str) -> None:
    model = build(name, num_classes=42).train()
    out = model(torch.randn(2, *input_size(model)))
    out.mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"no gradient for {missing}"
    assert out.shape == (2, 42) and not out.isnan().any()


@pytest.mark.parametrize("name", CHECKED)
def test_default_cfg(name: str) -> None:
    """timm's default-cfg check: its 'non-standard' variant (no pool-size check) for DeiT, as timm's DeiT."""
    model = build(name).eval()
    cfg = model.pretrained_cfg
    assert model.num_classes >= 0 and model.num_features > 0 and model.head_hidden_size > 0
    x = torch.randn(1, *input_size(model))
    with torch.no_grad():
        features = model.forward_features(x)
        pre_logits = model.forward_head(features, pre_logits=True)
        assert features.shape[-1] == model.num_features
        assert pre_logits.shape == (1, model.head_hidden_size)
        model.reset_classifier(0)
        assert model.num_classes == 0
        pooled = model(x)
        assert pooled.shape == pre_logits.shape
        headless = timm.create_model(name, num_classes=0, **small(name)).eval()
        assert headless(x).shape == (1, model.num_features)
    state = build(name).state_dict()
    assert cfg["classifier"] + ".weight" in state
    assert cfg["first_conv"] + ".weight" in state


@pytest.mark.parametrize("name", SWIN_NAMES)
def test_swin_default_cfg_pool_size(name: str) -> None:
    """timm's standard default-cfg check (Swin is 'standard' in timm): at the cfg's input size the unpooled
    features are ``pool_size``, also without head and pool (kept cheap by a thin model)."""
    thin = dict(embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1))
    model = timm.create_model(name, **thin).eval()
    cfg = model.pretrained_cfg
    x = torch.randn(1, *cfg["input_size"])
    with torch.no_grad():
        features = model.forward_features(x)  # NHWC
        assert tuple(features.shape[1:3]) == cfg["pool_size"] and features.shape[3] == model.num_features
        model.reset_classifier(0, "")
        assert tuple(model(x).shape[1:3]) == cfg["pool_size"]
        unpooled = timm.create_model(name, num_classes=0, global_pool="", **thin).eval()
        assert tuple(unpooled(x).shape[1:3]) == cfg["pool_size"]


def check_feature_maps(outputs: list[torch.Tensor], info: FeatureInfo, size: tuple, output_fmt: str) -> None:
    channels, reductions = info.channels(), info.reduction()
    assert len(channels) >= 3 and len(outputs) == len(channels)
    feat_axis, spatial_axes = get_channel_dim(output_fmt), get_spatial_dim(output_fmt)
    for channel, reduction, out in zip(channels, reductions, outputs, strict=True):
        assert out.shape[feat_axis] == channel and out.shape[0] == 1
        for axis, side in zip(spatial_axes, size[-2:], strict=True):
            assert out.shape[axis] <= math.ceil(side / reduction) + 1
        assert not out.isnan().any()


@pytest.mark.parametrize("name", CHECKED)
def test_forward_intermediates(name: str) -> None:
    model = build(name).eval()
    size = input_size(model)
    x = torch.randn(1, *size)
    with torch.no_grad():
        final, intermediates = model.forward_intermediates(x, output_fmt="NCHW")
        check_feature_maps(intermediates, FeatureInfo(model.feature_info, len(model.feature_info)), size, "NCHW")
        torch.testing.assert_close(final, model.forward_features(x))
        model.set_grad_checkpointing()
        torch.testing.assert_close(model.forward_intermediates(x, output_fmt="NCHW")[0], final, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("feature_cls", [None, "getter"])
@pytest.mark.parametrize("name", CHECKED)
def test_features_only(name: str, feature_cls: str | None) -> None:
    extra = {} if feature_cls is None else {"feature_cls": feature_cls}
    model = build(name, features_only=True, **extra).eval()
    size = input_size(model)
    with torch.no_grad():
        outputs = model(torch.randn(1, *size))
    check_feature_maps(outputs, model.feature_info, size, getattr(model, "output_fmt", "NCHW"))


def fx_model(model: torch.nn.Module, train: bool) -> torch.nn.Module:
    """timm's fx path: torchvision's feature extractor with timm's leaf modules, returning the last node."""
    tracer_kwargs = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions(),
                         param_shapes_constant=True)
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=tracer_kwargs)
    return create_feature_extractor(model, train_return_nodes=[train_nodes[-1]], eval_return_nodes=[eval_nodes[-1]],
                                    tracer_kwargs=tracer_kwargs).train(train)


@pytest.mark.parametrize("name", CHECKED)
def test_fx_forward_and_backward(name: str) -> None:
    model = build(name).eval()
    x = torch.randn(1, *input_size(model))
    with torch.inference_mode():
        eager = model(x)
        traced = torch.cat(tuple(fx_model(model, train=False)(x).values()))
    assert torch.equal(traced, eager)

    model = build(name, num_classes=42).train()
    traced = fx_model(model, train=True)
    out = torch.cat(tuple(traced(torch.randn(2, *input_size(model))).values()))
    out.mean().backward()
    assert out.shape == (2, 42) and not out.isnan().any()
    assert all(p.grad is not None for p in traced.parameters())
    assert sum(p.numel() for p in traced.parameters()) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ONE_PER_FAMILY)
def test_fx_feature_extraction(name: str) -> None:
    """``features_only=True, feature_cls='fx'`` (timm's FeatureGraphNet) gives the blocks' outputs."""
    torch.manual_seed(0)
    getter = build(name, features_only=True, feature_cls="getter").eval()
    torch.manual_seed(0)  # the same weights
    graph = build(name, features_only=True, feature_cls="fx").eval()
    x = torch.randn(1, *input_size(getter))
    with torch.no_grad():
        got = graph(x)
        want = getter(x)
    # FeatureGraphNet returns tokens / NHWC as the blocks emit them; the getter reshapes to NCHW
    for g, w in zip(got, want, strict=True):
        g = g[:, -w.shape[2] * w.shape[3]:].transpose(1, 2).reshape(w.shape) if g.dim() == 3 else g.permute(0, 3, 1, 2)
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("name", ONE_PER_FAMILY)
def test_torchscript_is_declared_unsupported(name: str) -> None:
    model = build(name).eval()
    with pytest.raises(TypeError, match=r"does not support TorchScript \(torch\.jit\.script\); use torch\.compile"):
        torch.jit.script(model)


@pytest.mark.parametrize("variant", ["deit_tiny_patch16_224_rpe", *SWIN_NAMES])
def test_every_preset_tag_builds_and_trains(variant: str) -> None:
    """Each tag builds the model with its preset; forward and backward run for all of them."""
    for tag in preset_tags():
        model = build(f"{variant}.{tag}", num_classes=3).train()
        assert model.rpe_config == models.deit.resolve_rpe(tag) and model.pretrained_cfg["tag"] == tag
        out = model(torch.randn(2, *input_size(model)))
        out.square().mean().backward()
        assert out.shape == (2, 3) and all(p.grad is not None for p in model.parameters()), tag


def compiled_matches_eager(model: torch.nn.Module, images: torch.Tensor, inference_first: bool = False,
                           **compile_kwargs) -> None:
    """``torch.compile(model)`` forward and backward give eager's output and gradients (``model`` without
    random parts: no dropout, no drop path). ``inference_first``: the compiled model first runs once in
    ``torch.inference_mode`` (as a validation would), on a fresh grid cache."""
    compiled = torch.compile(model, **compile_kwargs)
    if inference_first:
        rpe.clear_bucket_cache()
        with torch.inference_mode():
            compiled.eval()(images)
        model.train()
    out = compiled(images)
    out.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    eager = model(images)
    eager.square().mean().backward()
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-5, msg=n)


@pytest.mark.parametrize(("name", "backend", "inference_first"),
                         [("deit_small_patch16_224_rpe.irpe_qk", "sdpa", True),
                          ("swin_tiny_patch4_window7_224_rpe.irpe_qkv", "auto", False),
                          ("swinv2_tiny_window8_256_rpe.cpb", "auto", False)])
@pytest.mark.slow  # compiling a model takes 15-40 s of a CPU: make test's 5 minutes
def test_torch_compile_fullgraph_forward_backward(name: str, backend: str, inference_first: bool) -> None:
    """One graph (fullgraph=True) for the whole model, the SDPA path included (DeiT: after a first compiled
    call in inference mode); dynamo and AOT autograd without inductor's C++ build (the slow test below)."""
    torch._dynamo.reset()
    model = build(name, num_classes=5, drop_path_rate=0.0, rpe={"backend": backend}).train()
    compiled_matches_eager(model, torch.randn(2, *input_size(model)), inference_first=inference_first,
                           backend="aot_eager", fullgraph=True)


@pytest.mark.slow  # two compiles of DeiT-S
def test_torch_compile_dynamic_img_size_follows_each_input() -> None:
    """Compiled with dynamic_img_size, a 6x10 then a 10x6 input each get their own grid (the same 60 tokens)."""
    torch._dynamo.reset()
    model = build("deit_small_patch16_224_rpe.irpe_qk", num_classes=5, dynamic_img_size=True).train()
    for size in [(48, 80), (80, 48)]:
        compiled_matches_eager(model, torch.randn(2, 3, *size), backend="aot_eager", fullgraph=True, dynamic=False)
        model.zero_grad()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["deit_small_patch16_224_ctx_product_50_shared_qkv",
                                  "swin_tiny_patch4_window7_224_rpe"])
def test_torch_compile_inductor_forward_backward(name: str) -> None:
    """Plain ``torch.compile(model)`` (inductor, which builds C++ kernels): 30-100 s per model on a CPU."""
    torch._dynamo.reset()
    model = build(name, num_classes=5, drop_path_rate=0.0).train()  # no random paths: eager and compiled agree
    compiled_matches_eager(model, torch.randn(2, *input_size(model)))


def test_readme_timm_example_runs() -> None:
    """The README's timm section: its code runs and gives the shapes its comments state."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("## In timm"):]
    code = section[section.index("```python\n") + len("```python\n"):section.index("```\n", 10)]
    scope: dict = {}
    exec(compile(code, "README.md (In timm)", "exec"), scope)
    assert [tuple(m.shape) for m in scope["maps"]] == [(1, 384, 14, 14)] * 3
    assert [tuple(m.shape) for m in scope["pyramid"]] == [(1, 28, 28, 192), (1, 14, 14, 384), (1, 7, 7, 768)]


def test_fx_of_a_dynamic_img_size_model_is_a_clear_error() -> None:
    """Its grid is the input's, which a symbolic trace does not have: one line, not a deep trace error."""
    model = build("deit_tiny_patch16_224_rpe", dynamic_img_size=True).eval()
    with pytest.raises(TypeError, match="torch.fx cannot trace a dynamic_img_size iRPE model"):
        fx_model(model, train=False)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["deit_tiny_patch16_224_rpe", *SWIN_NAMES])
def test_every_preset_tag_traces_and_compiles(variant: str) -> None:
    """Every preset through torch.fx (same output as eager) and torch.compile(fullgraph=True) forward and
    backward (about 2 minutes in all on a CPU)."""
    for tag in preset_tags():
        torch._dynamo.reset()
        model = build(f"{variant}.{tag}", num_classes=3, drop_path_rate=0.0).eval()
        images = torch.randn(2, *input_size(model))
        with torch.inference_mode():
            assert torch.equal(torch.cat(tuple(fx_model(model, train=False)(images).values())), model(images)), tag
        compiled_matches_eager(model.train(), images, backend="aot_eager", fullgraph=True)


@pytest.mark.parametrize("name", ["deit_tiny_patch16_224_rpe.irpe_qkv", "deit_tiny_patch16_224_rpe.cpb",
                                  "deit_tiny_patch16_224_rpe.rope_axial", "swin_tiny_patch4_window7_224_rpe.alibi"])
def test_inference_mode_forward_then_training(name: str) -> None:
    """What an encoding caches per grid (bucket ids, coordinates, tables, sin/cos) during a
    ``torch.inference_mode`` forward (timm's fx check, Lightning's validation) serves later training steps."""
    rpe.clear_bucket_cache()
    model = build(name, num_classes=3)
    images = torch.randn(2, *input_size(model))
    with torch.inference_mode():
        model.eval()(images)
    model.train()(images).square().mean().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_tag_and_rpe_argument() -> None:
    """The tag is the preset; rpe= alone picks one (and the cfg names it); a dict refines the tag's preset;
    an unknown tag or a contradicting rpe= is a one-line error naming the valid tags."""
    model = build("deit_tiny_patch16_224_rpe", rpe="irpe_qk")
    assert model.rpe_config == rpe.resolve_rpe("irpe_qk") and model.pretrained_cfg["tag"] == "irpe_qk"
    model = build("deit_tiny_patch16_224_rpe.irpe_qk", rpe={"backend": "sdpa"})
    assert model.rpe_config == rpe.resolve_rpe({"preset": "irpe_qk", "backend": "sdpa"})
    with pytest.raises(models.ModelConfigError, match=r"tag 'irpe_kk' .* valid: irpe_k, none, irpe_qk"):
        build("deit_tiny_patch16_224_rpe.irpe_kk")
    with pytest.raises(models.ModelConfigError, match=r"rpe='irpe_qkv' contradicts the preset tag of .*\.irpe_qk"):
        build("swin_tiny_patch4_window7_224_rpe.irpe_qk", rpe="irpe_qkv")
