"""The comparison sweeps (sweep=compare, compare_mini) compose into exactly the paper's Table 5 rows
plus the newer encodings, one job each."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rpe import PRESETS, resolve_rpe
from tests.test_sweeps import _compose, _grid

ROWS = [  # (rpe preset, paper-scale ape, peg blocks or None), in order: the paper's rows, then newer ones
    ("none", "learned", None),  # DeiT-S
    ("none", "peg", "cpvt"),  # CPVT-S(0-5)
    ("shaw", "learned", None),
    ("xl", "learned", None),
    ("huang", "learned", None),
    ("sasa", "learned", None),
    ("irpe_k", "learned", None),
    ("irpe_qk", "learned", None),
    ("irpe_qkv", "learned", None),
    ("rope_axial", "learned", None),
    ("rope_mixed", "learned", None),
    ("cpb", "learned", None),
    ("alibi", "learned", None),
    ("decomposed", "learned", None),  # a preset by name, no entry in the rows table (configs/sweep/compare.yaml)
]


@pytest.mark.parametrize(("sweep", "model", "cpvt_blocks", "recipe_ape"), [
    ("compare", "deit_small_patch16_224", [0, 1, 2, 3, 4, 5], "learned"),
    ("compare_mini", "deit_micro_patch4_32", [0, 1, 2, 3], "sincos"),  # the micro DeiT has 4 blocks
])
def test_compare_sweep_is_table_5(sweep: str, model: str, cpvt_blocks: list[int], recipe_ape: str) -> None:
    jobs = [job for job in _grid(sweep) if "seed=0" in job]  # the mini sweep repeats the rows for seeds 1, 2
    assert len(jobs) == len(ROWS)
    for job, (preset, ape, blocks) in zip(jobs, ROWS, strict=True):
        cfg = _compose([f"sweep={sweep}", "data.root=/x", *job])
        net = OmegaConf.to_container(cfg.model.net, resolve=True)
        assert resolve_rpe(OmegaConf.to_container(cfg.rpe, resolve=True)) == PRESETS[preset], job
        ape = recipe_ape if ape == "learned" else ape  # the mini recipe's APE is the fixed sin-cos one
        assert (net["name"], net["ape"], net["peg_blocks"]) == (model, ape, cpvt_blocks if blocks else None), job
        if sweep == "compare_mini":  # every mini job builds (e.g. its PEG blocks exist in the micro DeiT)
            from models import create_model

            create_model(net.pop("name"), rpe=OmegaConf.to_container(cfg.rpe, resolve=True), num_classes=8, **net)
