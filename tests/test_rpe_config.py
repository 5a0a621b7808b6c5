"""RPEConfig validation, presets, the shorthand grammar, resolve_rpe and the configs/rpe group files."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from rpe import PRESETS, RPEConfig, RPEConfigError, parse_shorthand, resolve_rpe

FIELDS = [f.name for f in dataclasses.fields(RPEConfig)]
RPE_CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "rpe"


def test_defaults_are_irpe_k():
    config = RPEConfig()
    assert (config.method, config.mode, config.on, config.shared_head, config.ratio) == (
        "product",
        "ctx",
        "k",
        True,
        1.9,
    )
    assert (config.index, config.window, config.num_buckets, config.max_distance, config.backend) == (
        "piecewise",
        14,
        32,
        128,
        "auto",
    )


def test_on_is_order_free_and_canonical():
    assert RPEConfig(on="vkq").on == "qkv"
    assert RPEConfig(on="kq") == RPEConfig(on="qk")


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"method": "foo"}, "rpe.method='foo' is not one of: none, euclidean"),
        ({"mode": "contextual"}, "rpe.mode='contextual' is not one of: bias, ctx"),
        ({"index": "log"}, "rpe.index='log' is not one of: piecewise, clip"),
        ({"backend": "cuda"}, "rpe.backend='cuda' is not one of: auto, sdpa, eager, flex"),
        ({"ratio": 0.0}, "rpe.ratio=0.0 must be > 0"),
        ({"ratio": -1.9}, "rpe.ratio=-1.9 must be > 0"),
        ({"on": ""}, "rpe.on=''"),
        ({"on": "kx"}, "rpe.on='kx'"),
        ({"on": "kk"}, "rpe.on='kk'"),
        ({"mode": "bias", "on": "v"}, "bias mode is defined for q/k only"),
        ({"mode": "bias", "on": "qkv"}, "bias mode is defined for q/k only"),
        ({"method": "xl", "on": "qk"}, "rpe.method='xl' needs rpe.on='k'"),
        ({"window": 0}, "rpe.window=0"),
        ({"num_buckets": 7}, "rpe.num_buckets=7 must be even"),
    ],
)
def test_invalid_values_raise_one_line_errors(kwargs, fragment):
    with pytest.raises(RPEConfigError) as info:
        RPEConfig(**kwargs)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message
    assert isinstance(info.value, ValueError)


def test_presets():
    # each encoding module registers its own presets; the iRPE-era ones are all there
    assert set(PRESETS) >= {
        "none",
        "irpe_k",
        "irpe_qk",
        "irpe_qkv",
        "irpe_euc_k",
        "irpe_quant_k",
        "irpe_cross_k",
        "irpe_bias_k",
        "swin",
        "shaw",
        "t5",
        "xl",
    }
    assert not PRESETS["none"].enabled
    assert PRESETS["irpe_k"] == RPEConfig(method="product", mode="ctx", on="k", shared_head=True, ratio=1.9)
    assert PRESETS["irpe_qkv"].on == "qkv"
    assert (PRESETS["irpe_euc_k"].method, PRESETS["irpe_euc_k"].ratio) == ("euclidean", 20.0)
    assert (PRESETS["irpe_quant_k"].method, PRESETS["irpe_quant_k"].ratio) == ("quant", 33.0)
    assert (PRESETS["irpe_cross_k"].method, PRESETS["irpe_cross_k"].ratio) == ("cross", 20.0)
    assert (PRESETS["irpe_bias_k"].mode, PRESETS["irpe_bias_k"].shared_head) == ("bias", False)
    assert (PRESETS["swin"].method, PRESETS["swin"].mode, PRESETS["swin"].shared_head) == (
        "swin",
        "bias",
        False,
    )
    shaw = PRESETS["shaw"]
    assert (shaw.method, shaw.mode, shaw.on, shaw.index) == ("product", "ctx", "kv", "clip")
    assert (PRESETS["t5"].method, PRESETS["t5"].mode) == ("t5", "bias")
    assert PRESETS["xl"].method == "xl"


def test_parse_shorthand():
    assert parse_shorthand("rpe-1.9-product-ctx-1-k") == PRESETS["irpe_k"]
    config = parse_shorthand("rpe-2.0-euclidean-bias-0-qk")
    assert (config.ratio, config.method, config.mode, config.shared_head, config.on) == (
        2.0,
        "euclidean",
        "bias",
        False,
        "qk",
    )
    assert parse_shorthand("rpe-1.9-product-ctx-1-kqv").on == "qkv"
    assert parse_shorthand("rpe-1.9-product-ctx-1-k").shorthand() == "rpe-1.9-product-ctx-1-k"


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("rpe-1.9-product-ctx-1", "malformed"),
        ("irpe-1.9-product-ctx-1-k", "malformed"),
        ("rpe-x-product-ctx-1-k", "ratio 'x' is not a number"),
        ("rpe-1.9-product-ctx-2-k", "shared_head '2' must be 0 or 1"),
        ("rpe-1.9-product-contextual-1-k", "rpe.mode='contextual'"),
        ("rpe-1.9-foo-ctx-1-k", "rpe.method='foo'"),
        ("rpe-1.9-product-bias-1-v", "bias mode is defined for q/k only"),
    ],
)
def test_parse_shorthand_errors(text, fragment):
    with pytest.raises(RPEConfigError) as info:
        parse_shorthand(text)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_resolve_rpe_simple_specs():
    assert resolve_rpe(None) == PRESETS["none"]
    assert resolve_rpe(PRESETS["shaw"]) is PRESETS["shaw"]
    assert resolve_rpe("irpe_qk") == PRESETS["irpe_qk"]
    assert resolve_rpe("rpe-2.0-product-ctx-1-k").ratio == 2.0
    with pytest.raises(RPEConfigError, match="neither a preset"):
        resolve_rpe("irpe_z")
    with pytest.raises(RPEConfigError, match="not supported"):
        resolve_rpe(3)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_resolve_rpe_accepts_hydra_dicts_of_every_preset(preset):
    spec = {"preset": preset, **{name: None for name in FIELDS}}
    assert resolve_rpe(spec) == PRESETS[preset]


def test_resolve_rpe_overrides():
    nulls = {name: None for name in FIELDS}
    config = resolve_rpe({**nulls, "preset": "irpe_k", "ratio": 2, "on": "vqk"})
    assert config == RPEConfig(ratio=2.0, on="qkv")
    assert resolve_rpe({"preset": "rpe-2.0-product-ctx-1-k", "shared_head": False}).shared_head is False
    assert resolve_rpe({}) == PRESETS["none"]
    assert resolve_rpe({"preset": None, "method": "euclidean"}).method == "euclidean"
    with pytest.raises(RPEConfigError, match="bias mode is defined for q/k only"):
        resolve_rpe({"preset": "irpe_qkv", "mode": "bias"})
    with pytest.raises(RPEConfigError) as info:
        resolve_rpe({"preset": "irpe_k", "ratoi": 2.0})
    assert "'ratoi'" in str(info.value) and "valid keys: preset, method" in str(info.value)
    with pytest.raises(RPEConfigError, match='"on"'):
        resolve_rpe({"preset": "irpe_k", True: "qk"})  # what YAML makes of an unquoted `on:` key


def test_reference_alias_euc():
    """The reference's shorthand spells euclidean ``euc`` (``rpe-2.0-euc-ctx-1-k`` for DETR)."""
    config = parse_shorthand("rpe-2.0-euc-ctx-1-k")
    assert config == RPEConfig(method="euclidean", mode="ctx", on="k", shared_head=True, ratio=2.0)
    assert resolve_rpe({"preset": "irpe_k", "method": "euc"}).method == "euclidean"
    with pytest.raises(RPEConfigError, match="rpe.method='eucl' is not one of: none, euclidean"):
        RPEConfig(method="eucl")


def test_config_group_files():
    base = yaml.safe_load((RPE_CONFIG_DIR / "_base.yaml").read_text())
    assert base == {"preset": "none", **{name: None for name in FIELDS}}
    options = {path.stem for path in RPE_CONFIG_DIR.glob("*.yaml") if path.stem != "_base"}
    assert options == set(PRESETS)
    for name in options:
        option = yaml.safe_load((RPE_CONFIG_DIR / f"{name}.yaml").read_text())
        assert option == {"defaults": ["_base", "_self_"], "preset": name}
        assert resolve_rpe({**base, "preset": option["preset"]}) == PRESETS[name]
