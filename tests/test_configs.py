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


@pytest.mark.parametrize(("overrides", "name"), [
    (["experiment=swin_micro_relational"], "swin_micro_relational"),
    (["experiment=deit_small_irpe_k", "data.root=/d"], "deit_small_irpe_k"),
    # probe 14, k52: the overlay's fixed name labelled a DeiT trained through it as Swin, in its dir and its row
    (["experiment=swin_micro_relational", "model=deit_micro"], "deit_micro_relational"),
    (["experiment=deit_small_irpe_k", "model=deit_tiny", "data.root=/d"], "deit_tiny_irpe_k"),
])
def test_an_experiments_runs_are_named_after_the_model_they_train(tmp_path: Path, overrides: list[str],
                                                                   name: str) -> None:
    cfg = compose_config(overrides, tmp_path / "run", tmp_path / "data")
    assert cfg.name == name


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


@pytest.mark.slow
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


# Parameter names under which the DETR code takes a DETR hyperparameter or backbone option (the Transformer and
# the matcher spell some of them their own way).
DETR_PARAMETER_ALIASES = {"dim": "hidden_dim", "heads": "nheads", "ffn": "dim_feedforward",
                          "cost_class": "set_cost_class", "cost_bbox": "set_cost_bbox", "cost_giou": "set_cost_giou"}


def _literal_defaults(path: Path, names: set[str]) -> list[str]:
    """``file:line parameter`` for every parameter of ``names`` whose default in ``path`` is written as a literal."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        args = node.args
        positional = [*args.posonlyargs, *args.args]
        pairs = [*zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True),
                 *((a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None)]
        for arg, default in pairs:
            literal = isinstance(default, ast.Constant) and default.value is not None
            literal = literal or (isinstance(default, (ast.Tuple, ast.List)) and bool(default.elts))
            if arg.arg in names and literal:
                found.append(f"{path.name}:{default.lineno} {arg.arg}")
    return found


def test_detr_defaults_live_in_detr_r50_yaml_only() -> None:
    """Every default of DETR's hyperparameters and backbone options is read from configs/model/detr_r50.yaml:
    no DETR class writes one as a literal, and each class's default is the yaml's value."""
    import dataclasses
    import inspect

    from models.detr import DETR, DetectionModule, HungarianMatcher, SetCriterion, Transformer
    from models.detr.hyperparameters import BACKBONE_DEFAULTS, DETR_DEFAULTS

    fields = {f.name for f in dataclasses.fields(DETR_DEFAULTS)}
    backbone = {f.name for f in dataclasses.fields(BACKBONE_DEFAULTS)}
    detr_dir = Path(models_dir := CONFIG_DIR.parent / "models" / "detr")
    literals = [hit for path in sorted(detr_dir.glob("*.py"))
                for hit in _literal_defaults(path, fields | backbone | set(DETR_PARAMETER_ALIASES))]
    assert not literals, f"DETR defaults written outside configs/model/detr_r50.yaml: {literals} ({models_dir})"

    r50 = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "model" / "detr_r50.yaml"))
    assert dataclasses.asdict(DETR_DEFAULTS) == {name: r50[name] for name in fields}
    assert {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(BACKBONE_DEFAULTS).items()} == {
        name: r50["backbone"][name] for name in backbone}
    for cls in (DETR, DetectionModule, Transformer, HungarianMatcher, SetCriterion):
        for name, parameter in inspect.signature(cls).parameters.items():
            field = DETR_PARAMETER_ALIASES.get(name, name)
            if field in fields:
                assert parameter.default == r50[field], (cls.__name__, name)


def test_detr_small_yaml_holds_only_what_differs_from_detr_r50() -> None:
    r50 = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "model" / "detr_r50.yaml"))
    small = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "model" / "detr_small.yaml"))
    small.pop("defaults")
    same = [key for key, value in small.items() if not isinstance(value, dict) and r50.get(key) == value]
    same += [f"backbone.{key}" for key, value in small["backbone"].items() if r50["backbone"].get(key) == value]
    assert not same, f"detr_small.yaml repeats detr_r50.yaml's {same}"


def test_classification_module_defaults_are_the_config_recipe(tmp_path: Path) -> None:
    """A ClassificationModule built in Python trains with the recipe the command line runs (the DeiT recipe of
    configs/model/_classification.yaml): warm-up and all."""
    from models.classification import OPTIMIZER_DEFAULTS, SCHEDULER_DEFAULTS, ClassificationModule

    cfg = compose_config(["model=deit_small", "data.root=/does/not/matter"], tmp_path / "run", tmp_path / "data")
    assert OmegaConf.to_container(cfg.model.scheduler) == SCHEDULER_DEFAULTS
    assert SCHEDULER_DEFAULTS["warmup_epochs"] == 5  # DeiT's 5 warm-up epochs
    assert {**OmegaConf.to_container(cfg.model.optimizer), "pos_lr_scale": 1.0, "pos_weight_decay": None} == (
        OPTIMIZER_DEFAULTS)
    module = ClassificationModule({"name": "deit_micro_patch4_32"}, num_classes=2)
    assert module.scheduler_cfg == SCHEDULER_DEFAULTS and module.optimizer_cfg == OPTIMIZER_DEFAULTS
    recipe = CONFIG_DIR.parent / "models" / "classification.py"
    assert not _literal_defaults(recipe, {"warmup_epochs", "warmup_lr", "min_lr", "lr", "weight_decay"})
    assert '"warmup_epochs":' not in recipe.read_text()
