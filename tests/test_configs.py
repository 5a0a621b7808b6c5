"""Every config option composes; bad choices and values fail with one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers import CONFIG_DIR, compose_config, run_cli

GROUPS = ["data", "model", "rpe", "trainer", "logger", "callbacks", "experiment", "debug"]


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize(
    "group,option", [(g, o) for g in GROUPS for o in _options(g)], ids=lambda x: str(x)
)
def test_every_option_composes(group: str, option: str, tmp_path: Path) -> None:
    overrides = [f"{group}={option}"]
    # detection data goes with a detection model and vice versa
    if group == "data" and "coco" in option:
        overrides.append("model=detr_small")
    if group == "model" and option.startswith("detr"):
        overrides.append("data=shapes_coco")
    if group == "experiment" or option in ("imagenet", "coco"):
        overrides.append("data.root=/does/not/matter")
    cfg = compose_config(overrides, tmp_path / "run", tmp_path / "data")
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert resolved["data"]["_target_"] and resolved["model"]["_target_"] and resolved["trainer"]["_target_"]


def test_slurm_launcher_composes(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["hydra/launcher=slurm", "trainer=ddp", "trainer.devices=4",
                                          "trainer.num_nodes=2"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    # one SLURM task per GPU, as Lightning's SLURM environment expects
    assert (launcher.gpus_per_node, launcher.tasks_per_node, launcher.nodes) == (4, 4, 2)


def _one_line_error(result) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [ln for ln in result.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.slow  # a train.py process; the check is tested in-process (tests/test_cli_input.py)
def test_unknown_group_option_is_one_line(tmp_path: Path) -> None:
    line = _one_line_error(run_cli("train.py", ["model=deit_huge", f"paths.log_dir={tmp_path}"]))
    assert "deit_huge" in line and "deit_small" in line and "deit_micro" in line


def test_bad_rpe_value_is_one_line(tmp_path: Path) -> None:
    line = _one_line_error(run_cli("train.py", ["rpe.method=spiral", f"paths.log_dir={tmp_path}",
                                                "print_config=false"]))
    assert "spiral" in line and "product" in line


@pytest.mark.slow  # a train.py process; the check itself is tested in-process (tests/test_rpe_config.py)
def test_bias_on_values_is_rejected(tmp_path: Path) -> None:
    line = _one_line_error(run_cli("train.py", ["rpe=irpe_bias_k", "rpe.on=v", f"paths.log_dir={tmp_path}",
                                                "print_config=false"]))
    assert "bias" in line


@pytest.mark.slow  # a train.py process; the check itself is tested in-process (tests/test_data_datamodule.py)
def test_missing_imagenet_root_is_one_line(tmp_path: Path) -> None:
    line = _one_line_error(run_cli("train.py", ["data=imagenet", f"data.root={tmp_path}/nowhere",
                                                f"paths.log_dir={tmp_path}", "print_config=false"]))
    assert "nowhere" in line


@pytest.mark.slow  # a train.py process; the check itself is tested in-process (tests/test_models.py)
def test_bad_ape_is_one_line(tmp_path: Path) -> None:
    line = _one_line_error(run_cli("train.py", ["model.net.ape=rotary", f"paths.log_dir={tmp_path}",
                                                "print_config=false"]))
    assert "rotary" in line and "sincos" in line
