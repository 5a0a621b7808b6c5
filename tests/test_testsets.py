"""Evaluation on another test set: APE rules, larger grids for every RPE, Swin at any size timm takes, the
generator's canvas and region options, and eval.py testset=<name> writing only testsets/<name>.json."""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from timm.models.swin_transformer import SwinTransformer

from data.errors import DataConfigError
from data.relational import placement_rates, render_relational_shapes
from lifecycle.testsets import RESULT_FOLDER, TestsetError, adapt_model, load_testset
from lifecycle.testsets import testset_names as all_testsets
from models import ModelConfigError, create_model
from rpe.registry import PRESETS
from tests.helpers import compose_config, run_cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MICRO = "deit_micro_patch4_32"
SWIN_MICRO = "swin_micro_patch4_window4_32"
SWIN_MICRO_ARCH = dict(patch_size=4, window_size=4, embed_dim=64, depths=(2, 2), num_heads=(2, 4), mlp_ratio=2.0)


def _logits(model: torch.nn.Module, size: int, seed: int = 0) -> torch.Tensor:
    images = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model.eval()(images)


def _deit(ape: str, rpe: str = "irpe_k", img_size: int = 32) -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model(MICRO, rpe=rpe, num_classes=8, ape=ape, img_size=img_size).eval()


# ------------------------------------------------------------------------------------------ the APE rules
def test_extend_at_the_training_size_is_the_original_model() -> None:
    model = _deit("sincos")
    before, table = _logits(model, 32), model.pos_embed.detach().clone()
    model.adapt_input_size(32, "extend")
    assert torch.equal(model.pos_embed, table) and not model.pos_embed.requires_grad
    assert torch.equal(_logits(model, 32), before)


@pytest.mark.parametrize("ape", ["learned", "sincos"])
def test_interpolate_at_the_training_size_is_the_identity(ape: str) -> None:
    model = _deit(ape)
    before, table = _logits(model, 32), model.pos_embed.detach().clone()
    assert table[0, 1:].abs().sum() > 0  # a real table (timm's trunc-normal init, or sin-cos), not zeros
    model.adapt_input_size(32, "interpolate")
    assert torch.equal(model.pos_embed, table) and torch.equal(_logits(model, 32), before)


def test_rules_that_do_not_fit_the_model_are_one_line() -> None:
    cases = [
        (_deit("learned"), "extend", "ape=extend rebuilds a sin-cos table at the new positions, but this DeiT's table"
                                     " is ape=learned (trained values exist only on its 8x8 patch grid); valid:"
                                     " ape=interpolate"),
        (_deit("learned"), None, "absolute position table (ape=learned) for a 8x8 patch grid: name how it meets"
                                 " img_size=64; valid: ape=interpolate"),
        (_deit("sincos"), None, "valid: ape=interpolate or ape=extend"),
        (_deit("none"), "interpolate", "which this DeiT (ape=none) does not have"),
        (_deit("sincos"), "stretch", "ape='stretch' is not an APE rule; valid: interpolate, extend"),
        (create_model(SWIN_MICRO, num_classes=8), "extend", "which Swin does not have"),
    ]
    for model, rule, expected in cases:
        with pytest.raises(ModelConfigError) as err:
            model.adapt_input_size(64, rule)
        assert expected in str(err.value) and "\n" not in str(err.value), (rule, str(err.value))
    assert tuple(cases[0][0].patch_embed.grid_size) == (8, 8)  # a refused rule leaves the model as it was


def test_deit_at_48_and_64_px_with_both_rules_and_the_extended_table_by_hand() -> None:
    base = _deit("sincos")
    old = base.pos_embed.detach().clone()[0, 1:].reshape(8, 8, -1)
    tables = {}
    for size in (48, 64):
        for rule in ("interpolate", "extend"):
            model = copy.deepcopy(base)
            model.adapt_input_size(size, rule)
            grid = size // 4
            assert tuple(model.patch_embed.grid_size) == (grid, grid)
            assert all(block.attn.grid_size == (grid, grid) for block in model.blocks)
            logits = _logits(model, size)
            assert logits.shape == (2, 8) and torch.isfinite(logits).all()
            tables[size, rule] = model.pos_embed.detach()[0]
    extended = tables[64, "extend"]
    fresh = create_model(MICRO, rpe="irpe_k", num_classes=8, ape="sincos", img_size=64).pos_embed.detach()[0]
    assert torch.equal(extended, fresh)
    # by hand: dim 128 -> 32 bands 10000^(-k/32); row layout [sin(y b), sin(x b), cos(y b), cos(x b)]
    assert torch.equal(extended[0], torch.zeros(128))  # the class token has no position
    token = 1 + 12 * 16 + 3  # row y=12, column x=3 of the 16x16 grid
    band1 = 10000 ** (-1 / 32)
    for dim, value in ((0, math.sin(12)), (32, math.sin(3)), (64, math.cos(12)), (96, math.cos(3)),
                       (1, math.sin(12 * band1)), (33, math.sin(3 * band1)), (97, math.cos(3 * band1))):
        assert extended[token, dim].item() == pytest.approx(value, abs=1e-5), dim
    # extend keeps each old position's exact row; interpolate resamples the 8x8 table onto 16x16
    assert torch.equal(extended[1:].reshape(16, 16, -1)[:8, :8], old)
    assert not torch.allclose(tables[64, "interpolate"][1:].reshape(16, 16, -1)[:8, :8], old, atol=1e-3)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_rpe_preset_runs_on_a_larger_grid_or_says_why(preset: str) -> None:
    """Bucket tables, rotations and slopes are per offset, so 32 -> 48 -> 64 px just works; the one table
    sized by a window (``swin`` on DeiT, rpe.window=14 patches) fits a 12x12 grid but not 16x16."""
    for size in (48, 64):
        net = _deit("none", rpe=preset)
        if preset == "swin" and size == 64:
            with pytest.raises(ModelConfigError) as err:
                adapt_model(SimpleNamespace(net=net), (size, size), None, "relational_canvas64")
            message = str(err.value)
            assert "cannot run at 64x64 px" in message and "rpe.window=14" in message and "\n" not in message
            continue
        adapt_model(SimpleNamespace(net=net), (size, size), None, f"canvas{size}")
        logits = _logits(net, size)
        assert logits.shape == (2, 8) and torch.isfinite(logits).all()


# ------------------------------------------------------------------------------------------ Swin at any size
def test_attention_memory_is_counted_by_hand_and_a_test_set_that_cannot_fit_is_one_line() -> None:
    """deit_micro (4 heads, patch 4) at 384 px: 96 x 96 patches + the class token = 9217 tokens, so
    4 x 9217^2 = 339,812,356 entries per image (16 bytes each at evaluation: 5.44 GB)."""
    from lifecycle.testsets import attention_entries, check_attention_memory

    deit = _deit("sincos")
    assert attention_entries(deit, (384, 384)) == 4 * 9217**2
    swin = create_model(SWIN_MICRO, rpe="swin", num_classes=5)
    assert attention_entries(swin, (64, 64)) == 2 * 16 * 16 * 4 * 4  # heads x tokens x window area
    gib = 2**30
    check_attention_memory(deit, (384, 384), 1, "val_at_384", free=6 * gib)
    check_attention_memory(deit, (384, 384), 128, "val_at_384", free=None)  # unknown: not checked
    with pytest.raises(ModelConfigError) as err:
        check_attention_memory(deit, (384, 384), 128, "val_at_384", free=11 * gib)
    assert str(err.value) == ("testset=val_at_384 at 384x384 px needs about 648.1 GiB for one attention layer at"
                              " batch_size=128, and 11.0 GiB is free; valid: batch_size=2 or less")
    with pytest.raises(ModelConfigError, match="valid: a test set nearer the run's training size: even one"):
        check_attention_memory(deit, (384, 384), 1, "val_at_384", free=gib)


def test_swin_at_224x320_gives_timms_logits() -> None:
    torch.manual_seed(0)
    reference = SwinTransformer(img_size=(224, 320), patch_size=4, window_size=7, embed_dim=96, depths=(2, 2, 6, 2),
                                num_heads=(3, 6, 12, 24), num_classes=5).eval()
    ours = create_model("swin_tiny_patch4_window7_224", rpe="swin", img_size=(224, 320), num_classes=5).eval()
    ours.load_state_dict(reference.state_dict(), strict=True)
    images = torch.randn(1, 3, 224, 320)
    with torch.no_grad():
        assert torch.equal(ours(images), reference(images))
    # 80 tokens across are not tiled by 7-token windows: timm pads them (and so do we)
    assert ours.layers[0].blocks[1].shift_size == (3, 3) and ours.layers[3].blocks[1].shift_size == (0, 3)


@pytest.mark.parametrize("rpe", ["swin", "irpe_qkv"])
def test_swin_resized_keeps_its_windows_and_equals_a_model_built_at_that_size(rpe: str) -> None:
    """32 -> 48 px: stage 1 goes from 4 tokens (one window, no shift) to 6 (padded to 8, shift 2)."""
    torch.manual_seed(0)
    model = create_model(SWIN_MICRO, rpe=rpe, num_classes=8).eval()
    state = copy.deepcopy(model.state_dict())
    model.adapt_input_size(48)
    built = create_model(SWIN_MICRO, rpe=rpe, num_classes=8, img_size=48).eval()
    built.load_state_dict(state, strict=True)
    assert [b.window_size for s in model.layers for b in s.blocks] == [(4, 4)] * 4
    assert [b.shift_size for s in model.layers for b in s.blocks] == [(0, 0), (2, 2), (0, 0), (2, 2)]
    assert torch.equal(_logits(model, 48), _logits(built, 48))
    if rpe == "swin":  # timm's model at 48 px: the same numbers
        reference = SwinTransformer(img_size=48, num_classes=8, **SWIN_MICRO_ARCH).eval()
        reference.load_state_dict(state, strict=True)
        assert torch.equal(_logits(model, 48), _logits(reference, 48))


def test_swin_sizes_timm_pads_are_built_and_the_patch_rule_stays() -> None:
    """Sizes that were refused: 24 px (6 tokens, windows of 4 pad to 8), 36 px (9 tokens: an odd side that
    patch merging pads), 256 px for Swin-T (64 tokens, windows of 7)."""
    for size in (24, 36):
        torch.manual_seed(0)
        reference = SwinTransformer(img_size=size, num_classes=3, **SWIN_MICRO_ARCH).eval()
        ours = create_model(SWIN_MICRO, rpe="swin", num_classes=3, img_size=size).eval()
        ours.load_state_dict(reference.state_dict(), strict=True)
        assert torch.equal(_logits(ours, size), _logits(reference, size))
    assert tuple(create_model("swin_tiny_patch4_window7_224", num_classes=3, img_size=256).patch_embed.img_size) == (
        256, 256)
    with pytest.raises(ModelConfigError, match="img_size=30 is not divisible by patch_size=4"):
        create_model(SWIN_MICRO, num_classes=3, img_size=30)


# ------------------------------------------------------------------------------------------ generator options
def _objects(image: np.ndarray) -> list[tuple[int, int, int]]:
    """(top, left, side) of the red (A) and the blue (B) square: channel >= 150, the others < 100."""
    found = []
    for channel in (0, 2):
        others = [c for c in range(3) if c != channel]
        mask = (image[..., channel] >= 150) & (image[..., others[0]] < 100) & (image[..., others[1]] < 100)
        rows, cols = np.nonzero(mask)
        side = rows.max() - rows.min() + 1
        assert side == cols.max() - cols.min() + 1 and mask.sum() == side * side  # one solid square
        found.append((int(rows.min()), int(cols.min()), int(side)))
    return found


def _compass(a: tuple[int, int, int], b: tuple[int, int, int]) -> int:
    (ra, ca, sa), (rb, cb, sb) = a, b
    d_row, d_col = (rb + (sb - 1) / 2) - (ra + (sa - 1) / 2), (cb + (sb - 1) / 2) - (ca + (sa - 1) / 2)
    return int(((math.degrees(math.atan2(-d_row, d_col)) % 360 + 22.5) // 45) % 8)


@pytest.mark.parametrize(
    ("img_size", "region", "rows", "cols"),
    [
        (32, [0, 0, 32, 16], (0, 32), (0, 16)),  # left half
        (32, [0, 16, 32, 32], (0, 32), (16, 32)),  # right half
        (32, [16, 16, 32, 32], (16, 32), (16, 32)),  # bottom-right quadrant
        (64, None, (0, 64), (0, 64)),  # a larger canvas, the same objects
    ],
)
def test_region_and_canvas_place_objects_where_they_must(img_size: int, region, rows, cols) -> None:
    images, labels = render_relational_shapes(48, img_size=img_size, seed=3, region=region)
    assert images.shape == (48, img_size, img_size, 3)
    tops, lefts = [], []
    for image, label in zip(images, labels, strict=True):
        a, b = _objects(image)
        for top, left, side in (a, b):
            assert 5 <= side <= 7  # the object size does not follow the canvas
            assert rows[0] <= top and top + side <= rows[1] and cols[0] <= left and left + side <= cols[1]
            tops.append(top)
            lefts.append(left)
        assert _compass(a, b) == label
    if region is None:  # objects do use the new canvas: some lie wholly outside the old 32x32 one
        assert max(tops) >= 32 and max(lefts) >= 32


@pytest.mark.parametrize(("option", "right", "bottom"), [("relational_left", 16, 32), ("relational_corner", 16, 16)])
def test_region_data_configs_train_in_their_region(option: str, right: int, bottom: int, tmp_path: Path) -> None:
    from hydra.utils import instantiate
    from PIL import Image

    overrides = [f"data={option}", "data.generator.num_train=16", "data.generator.num_val=8"]
    cfg = compose_config(overrides, tmp_path / "run", tmp_path / "data")
    assert cfg.data.root == str(tmp_path / "data" / f"{option}_v1")  # not the default set's folder
    datamodule = instantiate(cfg.data, _convert_="all")
    datamodule.prepare_data()
    files = sorted((tmp_path / "data" / f"{option}_v1").rglob("*.png"))
    assert len(files) == 24
    for file in files:
        for top, left, side in _objects(np.asarray(Image.open(file).convert("RGB"))):
            assert top + side <= bottom and left + side <= right, file


def test_the_whole_canvas_as_region_is_the_default_images() -> None:
    default = render_relational_shapes(40, seed=5)
    whole = render_relational_shapes(40, seed=5, region=[0, 0, 32, 32])
    assert np.array_equal(default[0], whole[0]) and np.array_equal(default[1], whole[1])


def test_placement_rates_in_a_region_match_brute_force() -> None:
    """Every placement of a 2 px and a 3 px object in the region rows 0-11, columns 4-11 of a 12 px canvas
    (patch 4), counted directly: class, margin to the sector boundary, no shared patch cell."""
    img, patch, size_a, size_b, margin, region = 12, 4, 2, 3, 5.0, [0, 4, 12, 12]
    valid, total = np.zeros(8), 0
    for ra in range(0, 12 - size_a + 1):
        for ca in range(4, 12 - size_a + 1):
            for rb in range(0, 12 - size_b + 1):
                for cb in range(4, 12 - size_b + 1):
                    total += 1
                    cells_a = {(r // patch, c // patch) for r in range(ra, ra + size_a) for c in range(ca, ca + size_a)}
                    cells_b = {(r // patch, c // patch) for r in range(rb, rb + size_b) for c in range(cb, cb + size_b)}
                    d_row, d_col = rb + 1 - (ra + 0.5), cb + 1 - (ca + 0.5)
                    angle = math.degrees(math.atan2(-d_row, d_col)) % 360
                    inside = (angle + 22.5) % 45
                    if cells_a & cells_b or min(inside, 45 - inside) < margin:
                        continue
                    valid[int((angle + 22.5) // 45) % 8] += 1
    rates, _ = placement_rates(img, patch, size_a, size_b, margin, region)
    np.testing.assert_allclose(rates, valid / total, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("region", "expected"),
    [
        ([0, 0, 40, 16], "data.generator.region=[0, 0, 40, 16] must satisfy 0 <= top < bottom <= 32"),
        ([0, 0, 32], "data.generator.region=[0, 0, 32] must be null or [top, left, bottom, right]"),
        ([0, 0, 32, 4], "is 32x4 px: max_object_size=7 does not fit it; valid: max_object_size <= 4"),
        ([0, 0, 8, 8], "region=[0, 0, 8, 8]: no placement of class"),
    ],
)
def test_bad_regions_are_one_line(region: list[int], expected: str) -> None:
    with pytest.raises(DataConfigError) as err:
        render_relational_shapes(8, region=region)
    assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)


# ------------------------------------------------------------------------------------------ eval.py testset=
@pytest.mark.parametrize("name", all_testsets())
def test_every_testset_config_composes_and_its_generator_settings_hold(name: str, tmp_path: Path) -> None:
    from data.coco import check_shapes_settings
    from data.relational import check_relational_settings

    cfg = compose_config([f"testset={name}"], tmp_path, tmp_path / "data", config_name="eval")
    testset = load_testset(cfg.testset)
    assert testset["name"] == name  # the result file is named after the config's file
    data = testset["data"]
    generator = data.get("generator")
    if generator is None:  # reads the run's own data: only settings of the run's data module change
        assert "root" not in data and set(data) <= {"img_size", "eval_crop_pct", "val_size", "max_size"}
        return
    assert re.fullmatch(re.escape(str(tmp_path / "data" / "testsets" / name)) + r"_v\d+", data["root"])  # its own
    if testset["fits"] in (["relational"], ["relational_distance"]):
        assert generator["img_size"] == data["img_size"]
        assert (generator.get("label", "direction") == "distance") == (testset["fits"] == ["relational_distance"])
        check_relational_settings(generator["img_size"], generator["patch_size"], generator["min_object_size"],
                                  generator["max_object_size"], generator["boundary_margin_deg"],
                                  generator["noise_max"], generator["region"], generator.get("label", "direction"),
                                  generator.get("distance_edges"), generator.get("distance_margin_px", 1.0))
    else:
        assert testset["fits"] == ["shapes_coco"]
        check_shapes_settings(generator["num_train"], generator["num_val"], generator["image_size"],
                              generator["object_size"], generator["max_objects"], generator["max_overlap"])


def _fake_run(root: Path, data_dir: Path, overrides: list[str]) -> Path:
    """A run dir (config.yaml, checkpoints/best.ckpt, metrics.json) of an untrained model; its own data is
    never generated, so a test set can be shown not to need it (or make it)."""
    from hydra.utils import instantiate

    cfg = compose_config(overrides, root, data_dir)
    OmegaConf.save(cfg, root / "config.yaml", resolve=True)
    torch.manual_seed(0)
    datamodule = instantiate(cfg.data, _convert_="all")
    module = instantiate(cfg.model, rpe=OmegaConf.to_container(cfg.rpe, resolve=True),
                         num_classes=datamodule.num_classes, _convert_="all")
    (root / "checkpoints").mkdir()
    torch.save({"state_dict": module.state_dict()}, root / "checkpoints" / "best.ckpt")
    (root / "metrics.json").write_text('{"val/top1": 99.0}\n')
    return root


RUN = ["data.root=${paths.data_dir}/never_generated", "data.batch_size=16", "debug=fast"]


def _generate(data_dir: Path, testset: str, *extra: str) -> None:
    """What ``scripts/generate_testsets.py <testset>`` does, for test sets with data of their own."""
    from scripts.generate_testsets import generate, generated_testsets

    if testset in generated_testsets():
        generate(testset, [f"paths.data_dir={data_dir}", *(o for o in extra if o.startswith("testset."))])


def _eval(run: Path, data_dir: Path, testset: str, *extra: str) -> dict:
    """Generate the test set's own data (if any) and evaluate ``run`` on it, as eval.py does."""
    import eval as eval_script

    _generate(data_dir, testset, *extra)
    cfg = compose_config([f"ckpt_path={run / 'checkpoints' / 'best.ckpt'}", f"testset={testset}", "throughput_batch=2",
                          *extra], run / "eval", data_dir, config_name="eval")
    return eval_script.evaluate(cfg)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.slow  # train.py and eval.py processes end to end: make test's 5 minutes
def test_eval_cli_writes_the_testset_result_and_leaves_metrics_json(tmp_path: Path) -> None:
    run = _fake_run(tmp_path / "run", tmp_path / "data", [*RUN, "model.net.ape=sincos"])
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    made = run_cli("scripts/generate_testsets.py", ["relational_canvas48", "--set",
                                                    f"paths.data_dir={tmp_path / 'data'}",
                                                    "testset.data.generator.num_val=16"])
    assert made.returncode == 0 and made.stdout.strip() == (
        f"relational_canvas48: {tmp_path / 'data' / 'testsets' / 'relational_canvas48_v2'}"), made.stderr[-2000:]
    result = run_cli("eval.py", [f"ckpt_path={run / 'checkpoints' / 'best.ckpt'}", "testset=relational_canvas48",
                                 "ape=extend", f"paths.data_dir={tmp_path / 'data'}", "throughput_batch=2",
                                 "testset.data.generator.num_val=16"])
    assert result.returncode == 0, result.stderr[-3000:]
    path = run / RESULT_FOLDER / "relational_canvas48@extend.json"
    record = json.loads(path.read_text())
    assert (record["testset"], record["ape"], record["ape_rule"]) == ("relational_canvas48", "sincos", "extend")
    assert (record["train_img_size"], record["img_size"], record["patch_grid"]) == ([32, 32], [48, 48], [12, 12])
    assert record["testset_config"]["data"]["generator"]["img_size"] == 48
    assert record["data_root"] == str(tmp_path / "data" / "testsets" / "relational_canvas48_v2")
    assert 0.0 <= record["metrics"]["val/top1"] <= 100.0 and record["metrics"]["MACs_M"] > 0
    after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert after.pop(path.relative_to(run)) == path.read_bytes() and after == before  # metrics.json byte-identical
    assert not (tmp_path / "data" / "never_generated").exists()  # the run's own data: not needed, not made
    assert (tmp_path / "data" / "testsets" / "relational_canvas48_v2" / "val" / "0_E").is_dir()
    assert f"writtento{path}" in "".join(result.stdout.split())  # rich wraps the title
    from lifecycle.identity import identity_config, identity_hash

    assert record["identity"] == identity_hash(identity_config(OmegaConf.load(run / "config.yaml")))
    _eval(run, tmp_path / "data", "relational_canvas48", "ape=interpolate", "testset.data.generator.num_val=16")
    other = json.loads((run / RESULT_FOLDER / "relational_canvas48@interpolate.json").read_text())
    assert other["ape_rule"] == "interpolate" and json.loads(path.read_text()) == record  # both rules kept


BAD_CLI = [
    (["testset=relational_canvas96"], "testset='relational_canvas96' is not a config option; valid:"
                                      " relational_canvas48, relational_canvas64"),
    (["testset=relational_canvas48", "ape=stretch"], "ape='stretch' is not an APE rule; valid: interpolate, extend"),
    (["ape=extend"], "ape=extend adapts a run to a test set's input size: give testset=<name> too; valid:"
                     " relational_canvas48"),
]


@pytest.mark.parametrize(("args", "expected"), BAD_CLI)
def test_bad_testset_or_ape_is_one_line(tmp_path: Path, args: list[str], expected: str) -> None:
    """In-process, the checks eval.py's command line makes: the group choice before Hydra, then evaluate."""
    import eval as eval_script
    from lifecycle.cli import check_group_choices
    from lifecycle.console import CommandLineError

    with pytest.raises((CommandLineError, ValueError)) as err:
        check_group_choices(args)
        cfg = compose_config(["ckpt_path=runs/x/checkpoints/best.ckpt", *args], tmp_path, tmp_path, config_name="eval")
        eval_script.evaluate(cfg)
    assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.slow  # three eval.py processes; the same checks run in-process above
@pytest.mark.parametrize(("args", "expected"), BAD_CLI)
def test_eval_cli_bad_testset_or_ape_is_one_line(tmp_path: Path, args: list[str], expected: str) -> None:
    result = run_cli("eval.py", ["ckpt_path=runs/x/checkpoints/best.ckpt", *args, f"paths.data_dir={tmp_path}"])
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert result.stderr.startswith("error: ") and expected in result.stderr


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_swin_and_learned_deit_runs_on_a_larger_canvas(tmp_path: Path) -> None:
    data = tmp_path / "data"
    swin = _fake_run(tmp_path / "swin", data, [*RUN, "experiment=swin_micro_relational"])
    _eval(swin, data, "relational_canvas64", "testset.data.generator.num_val=16")
    record = json.loads((swin / RESULT_FOLDER / "relational_canvas64.json").read_text())
    assert (record["model"], record["ape_rule"], record["img_size"]) == ("RPESwinTransformer", None, [64, 64])
    assert record["window_padding"] == [None, None]  # 16 and 8 tokens: tiled by 4-token windows
    with pytest.raises(ModelConfigError, match="which Swin does not have"):
        _eval(swin, data, "relational_canvas64", "ape=interpolate", "testset.data.generator.num_val=16")

    deit = _fake_run(tmp_path / "deit", data, RUN)  # ape=learned
    _eval(deit, data, "relational_canvas64", "testset.data.generator.num_val=16")  # default rule: interpolate
    interpolated = json.loads((deit / RESULT_FOLDER / "relational_canvas64@interpolate.json").read_text())
    assert interpolated["ape_rule"] == "interpolate"
    with pytest.raises(ModelConfigError, match="this DeiT's table is ape=learned .* valid: ape=interpolate"):
        _eval(deit, data, "relational_right", "ape=extend", "testset.data.generator.num_val=16")
    assert not (deit / RESULT_FOLDER).joinpath("relational_right@extend.json").exists()


@pytest.mark.filterwarnings("ignore")
def test_an_evaluation_without_throughput_gives_the_same_numbers(tmp_path: Path) -> None:
    """``throughput_batch=null`` (the benchmark's evaluations) times no batches after the test: every other
    number is the one the timed evaluation gives."""
    import eval as eval_script

    data = tmp_path / "data"
    run = _fake_run(tmp_path / "run", data, RUN)
    _generate(data, "relational_canvas48", "testset.data.generator.num_val=16")

    def evaluate(batch: str) -> dict:
        cfg = compose_config([f"ckpt_path={run / 'checkpoints' / 'best.ckpt'}", "testset=relational_canvas48",
                              f"throughput_batch={batch}", "testset.data.generator.num_val=16"], run / "eval", data,
                             config_name="eval")
        return eval_script.evaluate(cfg)

    timed, untimed = evaluate("2"), evaluate("null")
    assert timed["throughput_img_s"] > 0 and "throughput_img_s" not in untimed
    assert {k: v for k, v in timed.items() if k != "throughput_img_s"} == untimed
    record = json.loads((run / RESULT_FOLDER / "relational_canvas48@interpolate.json").read_text())
    assert record["metrics"] == untimed


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_testsets_that_do_not_fit_the_run_are_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    run = _fake_run(tmp_path / "run", data, RUN)
    cases = [
        (("val_at_64",), "data.root=" + str(data / "never_generated")),  # the run's data: read, never generated
        (("shapes_coco_canvas256",), "fits runs trained on shapes_coco data, this run trained on imagefolder,"
                                     " relational data; valid for this run: relational_canvas48"),
        (("relational_canvas48", f"data_root={tmp_path}"), "has data of its own at testset.data.root="),
    ]
    for args, expected in cases:
        with pytest.raises((TestsetError, DataConfigError)) as err:
            _eval(run, data, *args)
        assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert not (data / "never_generated").exists() and not (run / RESULT_FOLDER).exists()


@pytest.mark.filterwarnings("ignore")
def test_eval_never_generates_a_testsets_data(tmp_path: Path) -> None:
    """eval.py reads a test set's own data: missing, made with other settings, or changed since (two images
    swapped between class folders: the counts stay), it is one line naming the command that makes it, and
    nothing is written."""
    import eval as eval_script

    data = tmp_path / "data"
    run = _fake_run(tmp_path / "run", data, RUN)

    def evaluate(*extra: str) -> str:
        cfg = compose_config([f"ckpt_path={run / 'checkpoints' / 'best.ckpt'}", "testset=relational_canvas48",
                              "throughput_batch=2", *extra], run / "eval", data, config_name="eval")
        with pytest.raises(DataConfigError) as err:
            eval_script.evaluate(cfg)
        assert "\n" not in str(err.value)
        return str(err.value)

    message = evaluate("testset.data.generator.num_val=16")
    root = data / "testsets" / "relational_canvas48_v2"
    assert message.startswith(f"data.root={root} named by testset=relational_canvas48 does not exist"), message
    assert message.endswith("python scripts/generate_testsets.py relational_canvas48 (with the same paths.data_dir="
                            " and testset.* overrides as here)")
    assert not data.exists() and not (run / RESULT_FOLDER).exists()
    # probe 19, u85: a missing root where generate_testsets refuses to make it (inside a run dir) says so
    message = evaluate("testset.data.generator.num_val=16", f"testset.data.root={run / 'ts'}")
    assert message == (f"testset=relational_canvas48: testset.data.root='{run / 'ts'}' is inside the run dir {run},"
                       " whose files are that run's; valid: a folder outside every run dir (no test set's data is"
                       " there, and none is made there)"), message
    assert not (run / "ts").exists()
    _generate(data, "relational_canvas48", "testset.data.generator.num_val=16")
    # probe 11, e96: a setting no generation takes was compared with the disk, and "generate it" advised
    message = evaluate('testset.data.generator.num_val=${oc.decode:"0"}')
    assert message.startswith("testset=relational_canvas48: testset.data.generator.num_val=0 must be an"), message
    message = evaluate("testset.data.generator.num_val=24")  # the yaml edited after its data was made
    # probe 20, w75: the advice is not the command that keeps the data on disk (and refuses these settings)
    assert message == (f"data.root={root} was generated with other settings than testset=relational_canvas48 names"
                       " (num_val: 16 on disk vs 24 named); valid: leave out the testset.* overrides that differ, to"
                       " read the set on disk, or give another paths.data_dir= (or testset.data.root=), where python"
                       " scripts/generate_testsets.py relational_canvas48 with them makes the set"), message
    assert not (run / RESULT_FOLDER).exists()
    first, second = sorted((root / "val" / "0_E").iterdir())[0], sorted((root / "val" / "4_W").iterdir())[0]
    first.rename(second.parent / first.name)
    second.rename(first.parent / second.name)
    message = evaluate("testset.data.generator.num_val=16")
    assert message == (f"data.root={root} no longer holds what was generated (its images differ from the content"
                       " digest its .complete.json recorded: an image was moved to another class folder, replaced or"
                       f" edited, or an annotation file edited); delete {root} to regenerate it; a test set's data is"
                       " made by its own command, once:"
                       " python scripts/generate_testsets.py relational_canvas48 (with the same paths.data_dir= and"
                       " testset.* overrides as here)")
    assert not (run / RESULT_FOLDER).exists()
    with pytest.raises(TestsetError, match="testset=val_at_48 reads the evaluated run's own data"):
        from scripts.generate_testsets import generate

        generate("val_at_48", [f"paths.data_dir={data}"])


def test_testset_name_cannot_be_overridden_on_eval_pys_command_line() -> None:
    """``testset=relational_left testset.name=relational_right`` once wrote the left half's result as the
    right half's (relational_right@interpolate.json), which make_tables counted there."""
    import eval as eval_script

    for override in ("testset.name=relational_right", "+testset.name=relational_right"):
        with pytest.raises(ValueError) as err:
            eval_script.check_run_eval_overrides(["ckpt_path=r/checkpoints/best.ckpt", "testset=relational_left",
                                                  override])
        assert str(err.value) == (f"{override} would file the result of one test set under another's name; valid:"
                                  " pick the test set by its name, testset=<name> (configs/testset/<name>.yaml)")


def test_testset_fits_cannot_be_overridden_on_any_command_line() -> None:
    """Probe 16, o110: ``testset=relational_distance 'testset.fits=[relational]'`` was accepted (the runs a test
    set fits are part of its definition, left out of its hash), and refused only later by a class count whose
    advice eval.py refuses with ckpt_path=. eval.py, evaluate_testsets.py and generate_testsets.py refuse it in
    one line."""
    import eval as eval_script
    from scripts import evaluate_testsets, generate_testsets

    why = ("would change which runs the test set fits, which its definition (configs/testset/<name>.yaml) decides,"
           " not the command line")
    for override in ("testset.fits=[relational]", "+testset.fits=[relational]", "~testset.fits",
                     "testset.fits.0=relational"):
        with pytest.raises(ValueError) as err:
            eval_script.check_run_eval_overrides(["ckpt_path=r/checkpoints/best.ckpt", "testset=relational_distance",
                                                  override])
        assert str(err.value) == (f"{override} {why}; valid: leave testset.fits out, and pick a test set that fits"
                                  " the run, testset=<name>")
        if "=" in override:
            with pytest.raises(ValueError) as err:
                evaluate_testsets.check_extra_overrides([override])
            assert str(err.value) == (f"--set {override} {why}; valid: leave testset.fits out, and name test sets"
                                      " that fit the runs in --testsets")
            with pytest.raises(ValueError) as err:
                generate_testsets.check_extra([override])
            assert str(err.value) == (f"--set {override} {why}; valid: leave testset.fits out (the data is"
                                      " generated by the data config of the kind it fits)")
    eval_script.check_run_eval_overrides(["testset.data.generator.num_val=16", "testset.description=x"])  # no error


@pytest.mark.slow  # one eval.py process; the check runs in-process above
def test_eval_cli_refuses_a_fits_override_before_it_reads_the_run(tmp_path: Path) -> None:
    """Probe 16, o110: the refusal of ``testset.fits=`` comes before the checkpoint is looked at (none is there)."""
    missing = tmp_path / "run" / "checkpoints" / "best.ckpt"
    result = run_cli("eval.py", [f"ckpt_path={missing}", "testset=relational_distance", "testset.fits=[relational]",
                                 f"paths.data_dir={tmp_path / 'data'}"])
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == ("error: testset.fits=[relational] would change which runs the test set fits, which its"
                             " definition (configs/testset/<name>.yaml) decides, not the command line; valid: leave"
                             " testset.fits out, and pick a test set that fits the run, testset=<name>\n")
    assert not (tmp_path / "data").exists()


@pytest.mark.filterwarnings("ignore")
def test_a_result_records_absolute_normalised_paths_whatever_the_working_dir(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 16, o52, o71b: ``cd x && eval.py ckpt_path=../runs/o52/checkpoints/best.ckpt paths.data_dir=../../data``
    recorded ``"checkpoint": "../runs/o52/..."`` (relative to a working dir the result does not record) and
    ``"data_root": "/.../x/../../data/..."``. Both, and the definition's data.root, are recorded absolute and
    normalised; a link in them is kept as given."""
    import eval as eval_script

    data = tmp_path / "data"
    run = _fake_run(tmp_path / "runs" / "o52", data, RUN)
    _generate(data, "relational_right", "testset.data.generator.num_val=16")
    (tmp_path / "linked").symlink_to(tmp_path / "runs")
    (tmp_path / "x" / "y").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "x" / "y")
    path = run / RESULT_FOLDER / "relational_right@interpolate.json"
    for given, recorded in (("../../runs/./o52/checkpoints/best.ckpt", run / "checkpoints" / "best.ckpt"),
                            ("../../linked/o52/checkpoints/best.ckpt",
                             tmp_path / "linked" / "o52" / "checkpoints" / "best.ckpt")):
        path.unlink(missing_ok=True)
        cfg = compose_config([f"ckpt_path={given}", "testset=relational_right", "testset.data.generator.num_val=16"],
                             tmp_path / "eval", Path("../../x/../data"), config_name="eval")
        eval_script.evaluate(cfg)
        record = json.loads(path.read_text())
        own = str(data / "testsets" / "relational_right_v2")
        assert (record["checkpoint"], record["data_root"], record["testset_config"]["data"]["root"]) == (
            str(recorded), own, own)


@pytest.mark.filterwarnings("ignore")
def test_a_test_set_of_other_classes_is_named_as_not_fitting_the_run(tmp_path: Path) -> None:
    """Probe 16, o110: a test set whose own data has another class count than the run was refused with
    ``data.num_classes=8 but data.root=... has 4 class folders; set data.num_classes=4`` (the run's class count
    carried into the test set's data), advice eval.py refuses with ckpt_path=. The test set's own data counts its
    classes, and the count is named against the run's head as a test set that does not fit."""
    import eval as eval_script
    from scripts.generate_testsets import generate

    data = tmp_path / "data"
    run = _fake_run(tmp_path / "run", data, RUN)  # relational: 8 direction classes
    extra = ["testset.data.generator.num_val=16", "+testset.data.generator.label=distance",
             "testset.data.root=${paths.data_dir}/distance_labels"]
    generate("relational_right", [f"paths.data_dir={data}", *extra])
    root = data / "distance_labels"
    count = len([p for p in (root / "val").iterdir() if p.is_dir()])
    assert count != 8
    cfg = compose_config([f"ckpt_path={run / 'checkpoints' / 'best.ckpt'}", "testset=relational_right", *extra],
                         run / "eval", data, config_name="eval")
    with pytest.raises(TestsetError) as err:
        eval_script.evaluate(cfg)
    assert str(err.value) == (f"testset=relational_right has {count} classes at {root}, this run's model has 8: the"
                              " test set does not fit the run's data; valid: a test set of the run's 8 classes,"
                              " with testset.data as its configs/testset/<name>.yaml sets it")
    assert not (run / RESULT_FOLDER).exists()


@pytest.mark.filterwarnings("ignore")
def test_a_result_records_its_definition_and_no_partial_test_or_other_definition_replaces_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole evaluation records the hash make_tables recomputes and 16 of 16 images; a test of part of the
    set (the probe: ``trainer.limit_test_batches=1 batch_size=8`` read 8 of 64 and replaced the result) and
    a result of another definition are refused in one line, and the complete result stays byte-identical."""
    from lifecycle import testsets
    from lifecycle.testset_definition import configured_generator, testset_sha256

    data = tmp_path / "data"
    run = _fake_run(tmp_path / "run", data, RUN)
    sixteen = "testset.data.generator.num_val=16"
    _eval(run, data, "relational_right", sixteen)
    path = run / RESULT_FOLDER / "relational_right@interpolate.json"
    record = json.loads(path.read_text())
    definition = load_testset(compose_config(["testset=relational_right", sixteen], tmp_path / "c", data,
                                             config_name="eval").testset)
    marker = json.loads((data / "testsets" / "relational_right_v2" / ".complete.json").read_text())
    assert record["testset_sha256"] == testset_sha256(definition, marker["generator"])
    assert record["testset_sha256"] == testset_sha256(definition, configured_generator(definition))  # make_tables'
    assert record["data_sha256"] == marker["content_sha256"]  # the images it read, byte for byte
    assert (record["images_read"], record["images_total"]) == (16, 16)
    complete = path.read_bytes()

    def refused(*extra: str) -> str:
        with pytest.raises(TestsetError) as err:
            _eval(run, data, "relational_right", "batch_size=8", *extra)
        assert "\n" not in str(err.value) and path.read_bytes() == complete
        return str(err.value)

    assert refused(sixteen, "trainer.limit_test_batches=1") == (
        "trainer.limit_test_batches=1 is not a setting of a test-set evaluation: its result is of the whole set"
        " (testset=relational_right), never of a limited test (nothing was evaluated); valid:"
        " trainer.limit_test_batches=null or 1.0, no trainer.fast_dev_run")
    # a limit of more batches than the set has is refused as a setting too, never as a test of a part of it
    for limit in ("trainer.limit_test_batches=100", "trainer.limit_test_batches=0.5", "trainer.fast_dev_run=true"):
        message = refused(sixteen, limit)
        assert message.startswith(f"{limit.replace('true', 'True')} is not a setting of a test-set evaluation")
        assert "a part" not in message
    other = tmp_path / "other"  # 24 images elsewhere: another definition under the same name
    _generate(data, "relational_right", "testset.data.generator.num_val=24", f"testset.data.root={other}")
    assert refused("testset.data.generator.num_val=24", f"testset.data.root={other}") == (
        f"{path} holds a result of another definition of testset=relational_right (data.generator.num_val: 16 ->"
        " 24); remove it to evaluate this one (nothing was evaluated)")
    # a limit no setting shows (here: the settings check bypassed): the images counted stop the write
    monkeypatch.setattr(testsets, "partial_test_setting", lambda trainer: None)
    assert refused(sixteen, "trainer.limit_test_batches=1") == (
        "the test read 8 of 16 images of testset=relational_right; a partial test is no result, so nothing was"
        " written (valid: test the whole set: no trainer batch limit)")
    assert testsets.batch_images({"images": torch.zeros(3, 3, 8, 8), "targets": [{}, {}, {}]}) == 3  # DETR's


@pytest.mark.filterwarnings("ignore")
def test_val_at_64_reads_the_runs_own_data_at_another_size(tmp_path: Path) -> None:
    """The real-data case (train at 224, test at 288/384): the run's validation images, resized by its eval
    transform; its data is read where the run (or data_root=) names it, and is never generated."""
    from hydra.utils import instantiate

    data = tmp_path / "data"
    overrides = ["data.root=${paths.data_dir}/rel_small", "data.generator.num_train=16", "data.generator.num_val=16",
                 "data.batch_size=16", "debug=fast"]
    run = _fake_run(tmp_path / "run", data, overrides)
    instantiate(compose_config(overrides, tmp_path / "gen", data).data, _convert_="all").prepare_data()  # as train.py
    folders = sorted(p.name for p in data.iterdir())
    metrics = _eval(run, data, "val_at_64")
    record = json.loads((run / RESULT_FOLDER / "val_at_64@interpolate.json").read_text())
    assert record["data_root"] == str(data / "rel_small") and record["img_size"] == [64, 64]
    assert record["ape_rule"] == "interpolate" and record["metrics"] == metrics
    assert record["images_read"] == record["images_total"] == 16  # the run's whole val split
    marker = json.loads((data / "rel_small" / ".complete.json").read_text())
    assert (record["data_sha256"], record["data_generator"]) == (marker["content_sha256"], marker["generator"])
    assert record["precision"] == "32-true"  # every test-set column's precision
    assert sorted(p.name for p in data.iterdir()) == folders  # nothing generated
    shutil.copytree(data / "rel_small", tmp_path / "elsewhere")  # a copy of the run's data: its data, elsewhere
    _eval(run, data, "val_at_48", f"data_root={tmp_path / 'elsewhere'}")
    elsewhere = json.loads((run / RESULT_FOLDER / "val_at_48@interpolate.json").read_text())
    assert elsewhere["data_root"] == str(tmp_path / "elsewhere")
    assert (elsewhere["data_sha256"], elsewhere["data_generator"]) == (marker["content_sha256"], marker["generator"])
    from reports.collect import read_testset_result, run_data_config

    run_data = run_data_config(OmegaConf.to_container(OmegaConf.load(run / "config.yaml")))
    for name in ("val_at_64@interpolate", "val_at_48@interpolate"):  # make_tables counts both
        assert read_testset_result(run / RESULT_FOLDER / f"{name}.json", record["identity"], None, run_data)[0] \
            == "interpolate"


def _own_data_run(tmp_path: Path) -> tuple[Path, Path]:
    """A run on 16+16 generated relational images of its own at ``data/rel_small`` (made as train.py does)."""
    from hydra.utils import instantiate

    data = tmp_path / "data"
    overrides = ["data.root=${paths.data_dir}/rel_small", "data.generator.num_train=16", "data.generator.num_val=16",
                 "data.batch_size=16", "debug=fast"]
    run = _fake_run(tmp_path / "run", data, overrides)
    instantiate(compose_config(overrides, tmp_path / "gen", data).data, _convert_="all").prepare_data()
    return run, data


@pytest.mark.filterwarnings("ignore")
def test_a_run_own_data_test_set_refuses_a_data_root_of_other_data(tmp_path: Path) -> None:
    """Probe 2026-12-05 cases 125, 127: ``testset=val_at_64 data_root=<another data set's images>`` wrote a
    result (data_sha256 null) that make_tables counted as the run's val_at_64. Other data is one line naming
    the value and what is valid, before anything is evaluated or written."""
    from data.fake import make_fake_imagefolder

    run, data = _own_data_run(tmp_path)
    _generate(data, "relational_left", "testset.data.generator.num_val=16")  # another data set of 8 classes
    left = data / "testsets" / "relational_left_v2"
    settings = tmp_path / "other_settings"  # the run's data with another generator setting in its marker
    shutil.copytree(data / "rel_small", settings)
    marker = json.loads((settings / ".complete.json").read_text())
    marker["generator"]["kwargs"]["seed"] = 7
    (settings / ".complete.json").write_text(json.dumps(marker))
    hand = make_fake_imagefolder(tmp_path / "hand", num_classes=8, per_class=2)  # no marker at all
    copy_valid = ("valid: drop data_root, or data_root=<a copy of the run's generated data (the same generator"
                  " settings)>")
    for root, why in (
        (left, "it was generated with other settings than the run's data (num_train: 8 on disk vs 16 named,"),
        (settings, "it was generated with other settings than the run's data (seed: 7 on disk vs 0 named)"),
        (hand, "it has no .complete.json of the run's generator"),
    ):
        with pytest.raises(TestsetError) as err:
            _eval(run, data, "val_at_64", f"data_root={root}")
        text = str(err.value)
        assert text.startswith(f"data_root={root} is not this run's data: testset=val_at_64 measures the run's own"
                               f" data (data.root={data / 'rel_small'}), and {why}"), text
        assert text.endswith(f"(nothing was evaluated); {copy_valid}") and "\n" not in text
    assert not (run / RESULT_FOLDER).exists()
    _eval(run, data, "val_at_48", f"data_root={data / 'rel_small'}")  # the run's own folder, named: its data
    assert json.loads((run / RESULT_FOLDER / "val_at_48@interpolate.json").read_text())["data_sha256"]


@pytest.mark.filterwarnings("ignore")
def test_a_hand_data_run_reads_only_its_own_folder_on_a_run_own_data_test_set(tmp_path: Path) -> None:
    """Data without a generator is known by its folder only: another folder is refused, the run's is read."""
    from data.fake import make_fake_imagefolder

    data = tmp_path / "data"
    own = make_fake_imagefolder(data / "hand", num_classes=8, per_class=2)
    run = _fake_run(tmp_path / "run", data, ["data.root=${paths.data_dir}/hand", "data.generator=null",
                                              "data.batch_size=16", "debug=fast"])
    other = make_fake_imagefolder(tmp_path / "other", num_classes=8, per_class=2, seed=1)
    with pytest.raises(TestsetError) as err:
        _eval(run, data, "val_at_48", f"data_root={other}")
    assert str(err.value) == (
        f"data_root={other} is not this run's data: testset=val_at_48 measures the run's own data (data.root={own}),"
        " and the run's data are not generated, so only its own folder is its data (nothing was evaluated); valid:"
        f" drop data_root (or data_root={own})")
    assert not (run / RESULT_FOLDER).exists()
    _eval(run, data, "val_at_48")
    record = json.loads((run / RESULT_FOLDER / "val_at_48@interpolate.json").read_text())
    assert (record["data_root"], record["data_sha256"], record["data_generator"]) == (str(own), None, None)
    own.rename(tmp_path / "moved")  # probe 15, n17: the old place is no remedy once the data moved
    with pytest.raises(TestsetError) as err:
        _eval(run, data, "val_at_48", f"data_root={tmp_path / 'moved'}")
    assert str(err.value).endswith(f"so only its own folder is its data, and data.root={own} no longer exists"
                                   f" (nothing was evaluated); valid: put the run's data back at {own} and drop"
                                   " data_root")


@pytest.mark.filterwarnings("ignore")
def test_a_run_own_data_test_set_refuses_the_runs_hand_data_changed_since(tmp_path: Path) -> None:
    """Probe 8 case B4: a hand-data run's val folder replaced by other images under the same class names, and
    ``testset=val_at_48`` (the run's own data) evaluated them and wrote a result that make_tables counted.
    The data read must have the fingerprint the run recorded (metrics.json's data/files): else one line before
    anything is evaluated. A result records that fingerprint and the training token of the best.ckpt read."""
    from data.fake import make_fake_imagefolder
    from lifecycle.identity import data_record

    data = tmp_path / "data"
    own = make_fake_imagefolder(data / "hand", num_classes=8, per_class=2)
    run = _fake_run(tmp_path / "run", data, ["data.root=${paths.data_dir}/hand", "data.generator=null",
                                              "data.batch_size=16", "debug=fast"])
    trained = data_record(OmegaConf.load(run / "config.yaml").data)
    (run / "metrics.json").write_text(json.dumps({"val/top1": 99.0, "data/root": trained["root"],
                                                  "data/files": trained["files"]}))
    best = run / "checkpoints" / "best.ckpt"
    torch.save({**torch.load(best), "run_training": "t" * 16}, best)
    _eval(run, data, "val_at_48")
    result = run / RESULT_FOLDER / "val_at_48@interpolate.json"
    record = json.loads(result.read_text())
    assert (record["data_files"], record["training"]) == (trained["files"], "t" * 16)

    other = make_fake_imagefolder(tmp_path / "other", num_classes=8, per_class=2, seed=1)
    shutil.rmtree(own / "val")
    shutil.copytree(other / "val", own / "val")
    with pytest.raises(TestsetError) as err:
        _eval(run, data, "val_at_48")
    text = str(err.value)
    assert text.startswith(f"testset=val_at_48 measures the run's own data, and data.root={own} holds other files"
                           f" than the run trained on ({own} (? files, fingerprint {trained['files'][:12]}) -> {own}"
                           " (32 files, fingerprint "), text
    assert text.endswith("; nothing was evaluated; valid: restore the run's data there (or evaluate a run trained"
                         " on these data)") and "\n" not in text
    assert json.loads(result.read_text()) == record  # the earlier result, untouched


@pytest.mark.filterwarnings("ignore")
def test_a_test_set_at_another_precision_is_refused_before_anything(tmp_path: Path) -> None:
    """Probe 2026-12-05 case 128: ``testset=val_at_48 trainer.precision=bf16-mixed`` wrote a result with no
    precision, counted beside 32-true ones (val/loss 2.11351 vs 2.11357). Every test-set column is measured
    at 32-true: another precision (also the gpu trainer's bf16-mixed) is one line; Lightning's '32' is 32-true."""
    run, data = _own_data_run(tmp_path)
    for extra, value in (("trainer.precision=bf16-mixed", "bf16-mixed"), ("trainer=gpu", "bf16-mixed"),
                         ("trainer.precision=16-mixed", "16-mixed"), ("trainer.precision=64", "64")):
        with pytest.raises(TestsetError) as err:
            _eval(run, data, "val_at_48", extra)
        assert str(err.value) == (
            f"trainer.precision={value} for testset=val_at_48: every test-set column is measured at 32-true, whatever"
            " precision each run trained at (nothing was evaluated); valid: trainer.precision=32-true (or leave it"
            " unset; with trainer=gpu too)")
    assert not (run / RESULT_FOLDER).exists()
    _eval(run, data, "val_at_48", "trainer.precision=32")
    assert json.loads((run / RESULT_FOLDER / "val_at_48@interpolate.json").read_text())["precision"] == "32-true"


@pytest.mark.slow  # one eval.py process; the same check runs in-process above
def test_eval_cli_refuses_another_precision_for_a_test_set_in_one_line(tmp_path: Path) -> None:
    result = run_cli("eval.py", ["ckpt_path=runs/x/checkpoints/best.ckpt", "testset=val_at_48",
                                 "trainer.precision=bf16-mixed", f"paths.data_dir={tmp_path}"])
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert result.stderr.startswith("error: trainer.precision=bf16-mixed for testset=val_at_48: every test-set")


@pytest.mark.filterwarnings("ignore")
def test_detr_run_on_the_larger_shapes_canvas(tmp_path: Path) -> None:
    data = tmp_path / "data"
    run = _fake_run(tmp_path / "detr", data, [
        "experiment=detr_shapes", "data.root=${paths.data_dir}/never_generated", "debug=fast", "data.batch_size=4",
    ])
    metrics = _eval(run, data, "shapes_coco_canvas256", "testset.data.generator.num_val=4")
    record = json.loads((run / RESULT_FOLDER / "shapes_coco_canvas256.json").read_text())
    assert record["metrics"] == metrics and "val/AP" in metrics and record["ape_rule"] is None
    assert record["images_read"] == record["images_total"] == 4  # counted from DETR's batches of targets
    annotations = data / "testsets" / "shapes_coco_canvas256_v1" / "annotations" / "instances_val2017.json"
    sizes = [(i["height"], i["width"]) for i in json.loads(annotations.read_text())["images"]]
    assert len(sizes) == 4 and all(192 <= s <= 256 for hw in sizes for s in hw)
    with pytest.raises(ModelConfigError, match="DETR computes its position encodings for each input"):
        _eval(run, data, "shapes_coco_canvas256", "ape=extend", "testset.data.generator.num_val=4")


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_a_stop_signal_while_generating_a_testset_is_one_line(signum: int, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Probe 18, t19: SIGHUP (or SIGTERM) while generate_testsets made a test set's images ended it with rc 129 and
    no line. Now one line naming the test set that is not complete, exit 128 + signum, the handlers back after."""
    from scripts import generate_testsets

    def signalled(name: str, extra: list[str]) -> Path:
        os.kill(os.getpid(), signum)
        raise AssertionError("the generation went on after the signal")

    handlers = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}
    monkeypatch.setattr(generate_testsets, "generate", signalled)
    with pytest.raises(SystemExit) as exit_:
        generate_testsets.main(["relational_left", "--set", f"paths.data_dir={tmp_path}"])
    assert exit_.value.code == 128 + signum
    assert capsys.readouterr().err == (f"error: generate_testsets.py interrupted by {signal.Signals(signum).name};"
                                       " nothing of relational_left is complete (its temporary folder was removed,"
                                       " its root left as it was): run the same command again\n")
    assert {s: signal.getsignal(s) for s in handlers} == handlers


@pytest.mark.slow
def test_sighup_mid_generation_leaves_no_temp_folder(tmp_path: Path) -> None:
    """Probe 18, t19, as a process: SIGHUP once images are being written; one line, rc 129, and neither the
    half-made temporary folder nor a root is left."""
    data = tmp_path / "data"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    process = subprocess.Popen([sys.executable, "scripts/generate_testsets.py", "relational_left", "--set",
                                f"paths.data_dir={data}", "testset.data.generator.num_val=30000"],
                               cwd=Path(__file__).resolve().parents[1], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sum(1 for _ in data.rglob("*.png")) < 100:
        time.sleep(0.2)
    process.send_signal(signal.SIGHUP)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGHUP, err
    assert err == ("error: generate_testsets.py interrupted by SIGHUP; nothing of relational_left is complete (its"
                   " temporary folder was removed, its root left as it was): run the same command again\n")
    assert not data.exists() or not list(data.rglob("*")), list(data.rglob("*"))[:5]


def test_generate_testsets_names_a_setting_given_as_a_name(capsys: pytest.CaptureFixture[str]) -> None:
    from scripts.generate_testsets import main

    assert main(["relational_canvas48", "paths.data_dir=/somewhere"]) == 2
    assert capsys.readouterr().err == ("error: paths.data_dir=/somewhere is a setting, not a test set: give settings"
                                       " after --set (--set paths.data_dir=/somewhere)\n")


def test_generate_testsets_names_an_unknown_set_key_and_the_valid_ones(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Probe 131: OmegaConf's own text ("Key 'nope' is not in struct ...") named no valid key, and came per test
    set after the others' data were made; now one line, as train.py's command line, before anything is made."""
    from scripts.generate_testsets import main

    assert main(["relational_right", "--set", f"paths.data_dir={tmp_path}", "testset.data.generator.nope=1"]) == 2
    assert capsys.readouterr().err == (
        "error: testset.data.generator.nope is not a config key; valid keys of testset.data.generator: _partial_,"
        " _target_, boundary_margin_deg, img_size, max_object_size, min_object_size, noise_max, num_train, num_val,"
        " patch_size, region, seed\n")
    # probe 74's missing environment variable, in --set: its key and the fix, not a KeyError's text at generation
    assert main(["relational_right", "--set", "paths.data_dir=${oc.env:NOPE_P39_UNSET}/data"]) == 2
    assert capsys.readouterr().err == (
        "error: paths.data_dir=${oc.env:NOPE_P39_UNSET}/data reads environment variable NOPE_P39_UNSET, which is not"
        " set; valid: set it (export NOPE_P39_UNSET=...), give a default (${oc.env:NOPE_P39_UNSET,<default>}) or"
        " give the value itself\n")
    assert not any(tmp_path.iterdir())  # nothing generated


def test_test_sets_that_would_share_one_data_folder_are_refused_before_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Probe 5, case 88: ``--all --set testset.data.root=<one folder>`` made the first set there, refused the
    other relational ones one by one and reported shapes COCO as made in the relational set's folder. Now one
    line before anything is generated; a root inside another's is refused the same way."""
    from scripts.generate_testsets import generated_testsets, main, refuse_shared_roots

    data = tmp_path / "data"
    one = data / "one"
    first, second = generated_testsets()[:2]
    assert main(["--all", "--set", f"paths.data_dir={data}", f"testset.data.root={one}"]) == 2
    assert capsys.readouterr().err == (
        f"error: testset.data.root of {first} and {second} is one folder, {one}: each test set's data needs a folder"
        " of its own (nothing was generated); valid: testset.data.root=... for one test set per command, or"
        " paths.data_dir=<folder> (every test set's own folder under it)\n")
    assert not data.exists()
    with pytest.raises(ValueError, match=rf"^testset.data.root of b \({one / 'b'}\) lies inside a's \({one}\): "):
        refuse_shared_roots({"a": one, "val_at_64": None, "b": one / "b"})
    refuse_shared_roots({"a": one, "b": data / "one_b", "c": None})  # a name that only begins alike is its own


def test_generate_testsets_names_a_test_sets_own_remedy_for_a_folder_without_its_marker(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Probe 14, l36: a test set's folder without its completion marker (a half-made leftover) was refused with the
    training remedy "set data.generator=null", which is no setting of a test set."""
    from scripts.generate_testsets import main

    root = tmp_path / "testsets" / "relational_right_v2"
    (root / "val").mkdir(parents=True)
    (root / "val" / "x.png").write_bytes(b"")
    assert main(["relational_right", "--set", f"paths.data_dir={tmp_path}"]) == 2
    assert capsys.readouterr().err == (
        f"error: relational_right: testset.data.root={root} exists but has no .complete.json completion marker: it"
        " was not made by the test set's generator (a half-made or hand-made folder); delete it to regenerate it, or"
        " give the test set another testset.data.root\n")
    assert sorted(p.name for p in root.rglob("*")) == ["val", "x.png"]  # left as it was


@pytest.mark.parametrize("where", ["data_dir", "root"])
def test_generate_testsets_names_a_symlink_loop_in_the_data_root(where: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Probe 7, A222: a loop as paths.data_dir, or above testset.data.root, was errno 40's text on a run.json
    probe the user never gave; now one line naming the loop, exit 2, nothing made (as every destination)."""
    from scripts.generate_testsets import main

    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    data = tmp_path / "data"
    settings = [f"paths.data_dir={loop}"] if where == "data_dir" else [f"paths.data_dir={data}",
                                                                       f"testset.data.root={loop / 'ts'}"]
    assert main(["relational_right", "--set", *settings]) == 2
    err = capsys.readouterr().err
    root = loop / "testsets" / "relational_right_v2" if where == "data_dir" else loop / "ts"
    assert err == (f"error: relational_right: testset.data.root='{root}' cannot be used: {loop} is a symlink loop"
                   " (its links lead back to themselves); valid: a path whose folders hold no link loop\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop"]  # nothing generated


def test_a_test_set_result_is_of_the_best_checkpoint_only(tmp_path: Path) -> None:
    """The tables' test-set columns are the runs' results: a result of last.ckpt (another model, when an earlier
    epoch was best) is refused before anything is loaded, never written where make_tables would count it."""
    import eval as eval_script

    cfg = compose_config(["ckpt_path=runs/x/checkpoints/last.ckpt", "testset=relational_right"], tmp_path, tmp_path,
                         config_name="eval")
    with pytest.raises(ValueError, match=r"a test-set result is of the run's result, its best.ckpt; valid: "):
        eval_script.evaluate(cfg)


def test_a_test_that_counted_more_images_than_its_set_is_an_error_never_a_whole_test() -> None:
    """Probe cases 39-41: a padding sampler's repeats made 10 of 9; that was taken as whole (no note) or
    called a partial test. It is an error in the counting: never a result, and said so."""
    from lifecycle.testsets import check_read_whole, partial_test_note

    whole = {"limit_test_batches": None}
    assert partial_test_note(9, 9, whole) == ""
    assert partial_test_note(10, 9, whole) == ("the test counted 10 images of the split, which has 9: 1 image counted"
                                               " more than once, so its numbers are not of its images")
    assert partial_test_note(8, 9, whole) == "the test read 8 of 9 images: numbers of a part of the split"
    check_read_whole(9, 9, "relational_everywhere")
    with pytest.raises(TestsetError) as err:
        check_read_whole(11, 9, "relational_everywhere")
    assert str(err.value) == ("the test counted 11 images of testset=relational_everywhere, which has 9: 2 images"
                              " counted more than once, so its numbers are not of its images; nothing was written"
                              " (an error in the evaluation, not in its settings: please report it)")


def test_a_test_set_must_name_the_runs_classes_in_the_runs_order(tmp_path: Path) -> None:
    """A test set's labels index the run's outputs: generated relational classes (0_E first) for a run trained on
    hand data whose class 0 is A_SE would score each image against another class."""
    from data import ImageFolderDataModule
    from data.relational import generate_relational_shapes
    from lifecycle.testsets import check_classes

    root = tmp_path / "rel"
    generate_relational_shapes(str(root), num_train=8, num_val=64)
    datamodule = ImageFolderDataModule(root=str(root), img_size=32, batch_size=8, num_workers=0)
    module = SimpleNamespace(hparams={"num_classes": 8})
    names = ["0_E", "1_NE", "2_N", "3_NW", "4_W", "5_SW", "6_S", "7_SE"]
    check_classes(datamodule, module, "relational_right", names)
    hand = [f"{chr(ord('A') + 7 - i)}_{name.split('_')[1]}" for i, name in enumerate(names)][::-1]
    with pytest.raises(TestsetError, match=r"^testset=relational_right: the class folders of .* are not the classes"
                                           r" the run's model was trained on \(label 0 is A_SE for the model and 0_E"
                                           r" here;"):
        check_classes(datamodule, module, "relational_right", sorted(hand))
