"""RPEConfig validation, presets, the shorthand grammar, resolve_rpe and the configs/rpe group files."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from rpe import (
    DEFAULT_PRESET,
    PRESETS,
    RPEConfig,
    RPEConfigError,
    encoding,
    method_names,
    parse_shorthand,
    preset_names,
    registry,
    resolve_rpe,
)
from rpe.index import INDEX_METHODS, register_index
from rpe.tables import TABLE_FIELDS

FIELDS = [f.name for f in dataclasses.fields(RPEConfig)]
RPE_CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "rpe"


def test_the_default_rpe_is_one_preset_on_the_config_routes(tmp_path: Path) -> None:
    """`RPEConfig()`, `resolve_rpe()`, the command line's ``rpe`` group and timm's default tag give
    `DEFAULT_PRESET`; None (as "none") is no RPE. The model routes: tests/test_models.py."""
    from omegaconf import OmegaConf

    from models.timm_tags import preset_tags
    from tests.helpers import compose_config

    default = PRESETS[DEFAULT_PRESET]
    assert RPEConfig() == default == resolve_rpe()
    assert resolve_rpe(None) == resolve_rpe("none") == PRESETS["none"] and not resolve_rpe(None).enabled
    cfg = compose_config([], tmp_path / "run", tmp_path / "data")
    assert cfg.rpe.preset == DEFAULT_PRESET
    assert resolve_rpe(OmegaConf.to_container(cfg.rpe)) == default
    assert preset_tags()[0] == DEFAULT_PRESET


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
        ({"method": "xl", "on": "qk"}, "rpe.on='qk' is not read by rpe.method='xl', which reads only: backend"),
        ({"method": "swin", "window": 0}, "rpe.window=0 must be an integer >= 1"),
        ({"method": "t5", "num_buckets": 7}, "rpe.num_buckets=7 must be even"),
        ({"window": 7}, "rpe.window=7 is not read by rpe.method='product'"),
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
        ("rpe-1.9-product-ctx-1-w", "rpe shorthand 'rpe-1.9-product-ctx-1-w': rpe.on='w' must be"),
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


# ----------------------------------------------------------------------------- the registry's own invariants
def test_registry_invariants():
    """Presets set only fields their method reads; each method, alias, index and preset is registered once;
    every option file of configs/rpe is a registry preset and every preset has one."""
    defaults = {f.name: f.default for f in dataclasses.fields(RPEConfig)}
    for name, config in PRESETS.items():
        reads = set(encoding(config.method).fields)
        assert reads <= set(FIELDS) - {"method", "backend"}, config.method
        changed = {key for key, value in dataclasses.asdict(config).items() if value != defaults[key]}
        assert changed - {"method", "backend"} <= reads, (name, changed - reads)

    names = method_names()
    assert len(names) == len(set(names)) and "none" in names and "euc" not in names  # aliases are not methods
    with pytest.raises(ValueError, match="'product' is registered twice"):
        registry.register(registry.Encoding("product", lambda *a, **k: (None, None, None), "a second product"))
    with pytest.raises(ValueError, match="'euc' is registered twice"):
        registry.register(registry.Encoding("euc_again", lambda *a, **k: (None, None, None), "?", aliases=("euc",)))
    with pytest.raises(ValueError, match="bucket index 'product' is registered twice"):
        register_index(INDEX_METHODS["product"])
    with pytest.raises(ValueError, match="rpe preset 'irpe_k' is registered twice"):
        registry.register_preset("irpe_k", RPEConfig())
    with pytest.raises(ValueError, match="repeat a name or list method/backend"):
        registry.register(registry.Encoding("twice_ratio", lambda *a, **k: (None, None, None), "?",
                                            fields=("ratio", "ratio")))
    assert "euc_again" not in method_names() and "twice_ratio" not in method_names()  # refused before adding

    # a bucket table's encoding and its index are one row of rpe.tables: the encoding reads the index's fields
    tables = [name for name in names if name in INDEX_METHODS and name != "xl"]
    assert tables == ["euclidean", "quant", "quant_rank", "cross", "product", "swin", "t5"]
    for name in tables:
        assert encoding(name).fields == TABLE_FIELDS + INDEX_METHODS[name].fields, name
    assert encoding("product").fields == ("mode", "on", "shared_head", "index", "ratio")
    assert encoding("t5").fields == ("mode", "on", "shared_head", "num_buckets", "max_distance")
    assert (encoding("xl").fields, encoding("alibi").fields, encoding("cpb").fields) == ((), (), ("hidden_dim",))
    assert encoding("rope_axial").fields == encoding("rope_mixed").fields == ("theta",)

    options = {path.stem for path in RPE_CONFIG_DIR.glob("*.yaml") if path.stem != "_base"}
    assert options == set(PRESETS)


def test_presets_carry_only_what_their_method_reads():
    """The presets whose method reads none of mode/on/shared_head no longer carry values for them; the read
    fields, hence the built modules, are those of before (Huang's and SASA's product/cross tables with clip)."""
    for name in ("alibi", "cpb", "rope_axial", "rope_mixed", "xl"):
        assert PRESETS[name] == RPEConfig(method=name), name
    assert PRESETS["huang"] == RPEConfig(method="huang", shared_head=True, ratio=1.9, index="clip")
    assert PRESETS["sasa"] == RPEConfig(method="sasa", shared_head=True, ratio=6.5, index="clip")
    assert PRESETS["swin"] == RPEConfig(method="swin", mode="bias", on="k", shared_head=False, window=14)
    assert PRESETS["decomposed"] == RPEConfig(method="decomposed", shared_head=True, window=14)
    assert PRESETS["xl"].shorthand() == "xl" and PRESETS["huang"].shorthand() == "rpe-1.9-huang-ctx-1-k"
    assert preset_names(per_site=False) == (
        "alibi", "cpb", "decomposed", "huang", "rope_axial", "rope_mixed", "sasa", "xl")
    assert preset_names(per_site=True) == (
        "irpe_k", "irpe_qk", "irpe_qkv", "irpe_euc_k", "irpe_quant_k", "irpe_cross_k", "irpe_bias_k", "swin", "shaw",
        "t5",
    )
    assert set(preset_names()) == set(PRESETS) - {"none"}


def test_a_field_the_method_does_not_read_is_a_one_line_error():
    """``rpe=rope_axial rpe.ratio=5`` trained a plain RoPE model; now it names the field, the method and the
    fields that method reads."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    with initialize_config_dir(str(RPE_CONFIG_DIR.parent), version_base="1.3"):
        cfg = compose("train", overrides=["rpe=rope_axial", "rpe.ratio=5"])
    spec = OmegaConf.to_container(cfg.rpe, resolve=True)
    assert spec["ratio"] == 5 and spec["mode"] is None and spec["preset"] == "rope_axial"
    with pytest.raises(RPEConfigError) as info:
        resolve_rpe(spec)
    assert str(info.value) == (
        "rpe.ratio=5 is not read by rpe.method='rope_axial', which reads only: theta, backend; leave rpe.ratio unset"
    )
    # set explicitly, even the default value is refused; a field RoPE reads, and the backend, pass
    with pytest.raises(RPEConfigError, match=r"^rpe.mode='ctx' is not read by rpe.method='rope_axial'"):
        resolve_rpe({**spec, "ratio": None, "mode": "ctx"})
    assert resolve_rpe({**spec, "ratio": None, "theta": 50, "backend": "eager"}) == RPEConfig(
        method="rope_axial", theta=50.0, backend="eager")
    # the same for a config built directly, a shorthand, the "none" preset and a model
    with pytest.raises(RPEConfigError, match=r"^rpe.window=7 is not read by rpe.method='alibi', which reads only: "
                                             r"backend; leave rpe.window unset$"):
        RPEConfig(method="alibi", window=7)
    with pytest.raises(RPEConfigError, match="rpe.mode='bias' is not read by rpe.method='sasa', which reads only: "
                                             "shared_head, ratio, index, backend"):
        parse_shorthand("rpe-6.5-sasa-bias-1-k")
    with pytest.raises(RPEConfigError, match="rpe.ratio=2.0 is not read by rpe.method='none'"):
        resolve_rpe({"preset": "none", "ratio": 2.0})
    from models import create_model

    with pytest.raises(RPEConfigError, match="rpe.hidden_dim=64 is not read by rpe.method='rope_mixed'"):
        create_model("deit_micro_patch4_32", rpe={"preset": "rope_mixed", "hidden_dim": 64}, num_classes=4)
    # switching the method of a preset keeps the preset's table fields, which the new method must read
    assert resolve_rpe({"preset": "irpe_bias_k", "method": "t5"}) == RPEConfig(
        method="t5", mode="bias", shared_head=False)
    with pytest.raises(RPEConfigError, match="rpe.mode='bias' is not read by rpe.method='cpb'"):
        resolve_rpe({"preset": "irpe_bias_k", "method": "cpb"})


@pytest.mark.slow  # a train.py process; the check itself is tested in-process just above
def test_a_field_the_method_does_not_read_is_one_line_on_the_command_line(tmp_path: Path) -> None:
    from tests.helpers import run_cli

    result = run_cli("train.py", ["rpe=rope_axial", "rpe.ratio=5", f"paths.log_dir={tmp_path}", "print_config=false"],
                     env_extra={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip() == (
        "error: rpe.ratio=5 is not read by rpe.method='rope_axial', which reads only: theta, backend;"
        " leave rpe.ratio unset"
    )


@pytest.mark.parametrize("theta", [1e-300, 1e-39, 1e39])
def test_a_rope_theta_that_float32_cannot_hold_is_refused(theta: float) -> None:
    """Probe 11, F25: ``rpe.theta=1e-300`` (0 in float32) passed every check and the run's loss was NaN at step 1,
    with a hint about the learning rate. The frequencies are float32: theta must be a normal float32 number."""
    with pytest.raises(RPEConfigError) as info:
        dataclasses.replace(PRESETS["rope_axial"], theta=theta)
    assert str(info.value).startswith(f"rpe.theta={theta!r} is not a float32 number"), str(info.value)
    assert dataclasses.replace(PRESETS["rope_axial"], theta=2e-38).theta == 2e-38
