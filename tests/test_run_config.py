"""Reading a run dir never runs code from it: hostile ``config.yaml`` files and checkpoints against eval.py
and scripts/plot_rpe.py (each attack would write a marker file or empty a victim file if it ran), the
allow-list against the project's own configs, and eval on a DETR run."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

import lifecycle.job as job
from lifecycle.run_config import ALLOWED_TARGETS, RunConfigError, build_data_and_model, load_run_config
from scripts import plot_rpe
from tests.helpers import CONFIG_DIR, compose_config, run_cli

TINY = [
    "data.root=${paths.data_dir}/relational_runcfg", "data.generator.num_train=64", "data.generator.num_val=16",
    "data.batch_size=16", "debug=fast", "logger=csv", "test_after_fit=false",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """A genuine run dir (config.yaml + checkpoints/best.ckpt) of an untrained micro DeiT."""
    run = tmp_path_factory.mktemp("runcfg")
    cfg = compose_config(TINY, run, data_dir)
    OmegaConf.save(cfg, run / "config.yaml", resolve=True)
    _, module = job.build_data_and_model(cfg)
    (run / "checkpoints").mkdir()
    torch.save({"state_dict": module.state_dict()}, run / "checkpoints" / "best.ckpt")
    return run


class _RunsCode:
    """Unpickling this calls os.system: the payload of a malicious pickle."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _hostile(run_dir: Path, tmp_path: Path, attack: str) -> tuple[Path, Path, Path]:
    """A copy of ``run_dir`` whose config.yaml carries ``attack``; returns ``(run, marker, victim)``."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    marker, victim = tmp_path / "marker", tmp_path / "victim.txt"
    victim.write_text("precious")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    touch = f"touch {marker}"
    pickle_file = tmp_path / "payload.pkl"
    pickle_file.write_bytes(pickle.dumps(_RunsCode(touch)))
    if attack == "os.system":
        cfg["data"] = {"_target_": "os.system", "command": touch}
    elif attack == "open_w":
        cfg["model"] = {"_target_": "builtins.open", "file": str(victim), "mode": "w"}
    elif attack == "torch.load":
        cfg["data"] = {"_target_": "torch.load", "f": str(pickle_file), "weights_only": False}
    elif attack == "nested":
        cfg["model"]["net"]["drop_path_rate"] = {"_target_": "os.system", "command": touch}
    elif attack == "args":
        cfg["model"]["_args_"] = [{"_target_": "os.system", "command": touch}]
    elif attack == "generator":
        cfg["data"]["generator"] = {"_target_": "os.system", "_partial_": True, "command": touch}
    elif attack == "rpe":
        cfg["rpe"] = {"_target_": "os.system", "command": touch}
    elif attack == "recursive":
        cfg["data"]["_recursive_"] = False
    elif attack == "interpolation":
        cfg["data"]["root"] = "${oc.env:HOME}"
    else:
        raise AssertionError(attack)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    return run, marker, victim


ATTACKS = {
    "os.system": "data._target_='os.system' is not an allowed target; valid: data.ImageFolderDataModule",
    "open_w": "model._target_='builtins.open' is not an allowed target",
    "torch.load": "data._target_='torch.load' is not an allowed target",
    "nested": "model.net.drop_path_rate._target_='os.system' is not allowed in a run config",
    "args": "model._args_='<mapping>' is not allowed in a run config",
    "generator": "data.generator._target_='os.system' is not an allowed target",
    "rpe": "rpe._target_='os.system' is not allowed",
    "recursive": "data._recursive_=False is not allowed",
    "interpolation": "data.root='${oc.env:HOME}' is an interpolation",
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_hostile_config_is_refused_by_plot_rpe(attack: str, run_dir: Path, tmp_path: Path, capsys) -> None:
    run, marker, victim = _hostile(run_dir, tmp_path, attack)
    assert plot_rpe.main([str(run), "--plots", "tables"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert ATTACKS[attack] in err
    assert not marker.exists() and victim.read_text() == "precious"
    assert not (run / "plots").exists()


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_hostile_config_is_refused_by_eval(attack: str, run_dir: Path, tmp_path: Path, data_dir: Path) -> None:
    import eval as eval_script

    run, marker, victim = _hostile(run_dir, tmp_path, attack)
    cfg = compose_config([f"ckpt_path={run / 'checkpoints' / 'best.ckpt'}"], tmp_path / "eval", data_dir,
                         config_name="eval")
    with pytest.raises(RunConfigError) as err:
        eval_script.evaluate(cfg)
    assert ATTACKS[attack] in str(err.value) and "\n" not in str(err.value)
    assert not marker.exists() and victim.read_text() == "precious"


@pytest.mark.slow  # eval.py and plot_rpe.py processes; the refusals are tested in-process above
def test_hostile_config_cli_exits_with_one_line(run_dir: Path, tmp_path: Path) -> None:
    """The command-line tools, end to end: exit 2, one line, no marker."""
    run, marker, _ = _hostile(run_dir, tmp_path, "os.system")
    env = {"OMP_NUM_THREADS": "1"}
    for script, args in (("eval.py", [f"ckpt_path={run / 'checkpoints' / 'best.ckpt'}"]),
                         ("scripts/plot_rpe.py", [str(run)])):
        result = run_cli(script, args, env_extra=env)
        assert result.returncode == 2, (script, result.stderr[-2000:])
        assert result.stderr.count("\n") == 1 and "data._target_='os.system'" in result.stderr, result.stderr
        assert not marker.exists(), script


def test_malicious_and_corrupt_checkpoints_are_one_line(run_dir: Path, tmp_path: Path, data_dir: Path,
                                                         capsys) -> None:
    import eval as eval_script

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    marker = tmp_path / "marker"
    ckpt = run / "checkpoints" / "best.ckpt"
    cases = {
        "pickle": (lambda: torch.save({"state_dict": _RunsCode(f"touch {marker}")}, ckpt),
                   "needs code to load (global posix.system), which weights_only=True refuses"),
        "random": (lambda: ckpt.write_bytes(os.urandom(3000)), "corrupt, truncated, not written by torch.save"),
        "truncated": (lambda: ckpt.write_bytes((run_dir / "checkpoints" / "best.ckpt").read_bytes()[:5000]),
                      "corrupt, truncated, not written by torch.save"),
        "no_state_dict": (lambda: torch.save({"weights": 1}, ckpt), "holds no state_dict"),
    }
    for name, (write, expected) in cases.items():
        write()
        cfg = compose_config([f"ckpt_path={ckpt}"], tmp_path / "eval", data_dir, config_name="eval")
        with pytest.raises(RunConfigError) as err:
            eval_script.evaluate(cfg)
        assert expected in str(err.value) and str(ckpt) in str(err.value), (name, str(err.value))
        assert plot_rpe.main([str(run), "--plots", "tables"]) == 2
        out = capsys.readouterr().err
        assert expected in out and out.count("\n") == 1, (name, out)
        assert not marker.exists()


@pytest.mark.parametrize("content", ["", "- a list\n", "data: [unclosed\n", "just a string\n", "data: 1\nmodel: 2\n"])
def test_unreadable_run_configs_are_one_line(content: str, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(content)
    with pytest.raises(RunConfigError) as err:
        load_run_config(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_every_target_of_the_project_configs_is_allowed_and_builds(run_dir: Path) -> None:
    """The allow-list covers what configs/data and configs/model name (a new target must be added to it)."""
    for group, allowed in (("data", ALLOWED_TARGETS["data"]), ("model", ALLOWED_TARGETS["model"])):
        for path in sorted((CONFIG_DIR / group).glob("*.yaml")):
            spec = yaml.safe_load(path.read_text()) or {}
            if "_target_" in spec:
                assert spec["_target_"] in allowed, path
            generator = spec.get("generator") or {}
            if "_target_" in generator:
                assert generator["_target_"] in ALLOWED_TARGETS["data.generator"], path
    datamodule, module = build_data_and_model(load_run_config(run_dir / "config.yaml"))
    cfg = OmegaConf.load(run_dir / "config.yaml")
    reference_data, reference = job.build_data_and_model(cfg)  # Hydra's instantiate on the trusted config
    assert type(datamodule) is type(reference_data) and type(module) is type(reference)
    # the run's generator is checked and kept (to compare with the data's marker), never run: detached
    assert datamodule.generator is None and reference_data.generator is not None
    assert datamodule.run_generator.func is reference_data.generator.func
    assert datamodule.run_generator.keywords == reference_data.generator.keywords
    assert module.state_dict().keys() == reference.state_dict().keys()
    assert module.hparams == reference.hparams


@pytest.mark.filterwarnings("ignore")
def test_eval_on_a_detr_run(tmp_path: Path, data_dir: Path) -> None:
    """eval.py rebuilds a DETR run (its module holds .model, not .net) and reproduces the stored AP."""
    import json

    import eval as eval_script

    run = tmp_path / "detr"
    overrides = [
        "experiment=detr_shapes", "debug=fast", "logger=csv", "trainer.max_epochs=1",
        "trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "trainer.limit_test_batches=1",
        "data.root=${paths.data_dir}/shapes_coco_eval", "data.generator.num_train=8", "data.generator.num_val=4",
        "data.batch_size=4", "data.train_scales=[64]", "data.val_size=64", "data.max_size=96",
    ]
    job.run(compose_config(overrides, run, data_dir))
    stored = json.loads((run / "metrics.json").read_text())
    cfg = compose_config([f"ckpt_path={run / 'checkpoints' / 'best.ckpt'}", "trainer.limit_test_batches=1"],
                         run / "eval", data_dir, config_name="eval")
    metrics = eval_script.evaluate(cfg)
    assert metrics["val/AP"] == pytest.approx(stored["val/AP"], abs=1e-6)
    assert metrics["params_M"] > 0.1 and "MACs_M" not in metrics

    # probe 13, j9: the checkpoint records the categories its labels index; data that names them otherwise (a copy
    # whose square and circle swapped names and ids) is one line, not an AP of boxes scored against other objects
    import shutil

    import torch

    from lifecycle.run_config import RunDataError

    recorded = torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)["CocoDataModule"]["categories"]
    assert [cat_id for cat_id, _ in recorded] == [1, 2, 3] and all(name for _, name in recorded)
    copy = tmp_path / "copy"
    shutil.copytree(data_dir / "shapes_coco_eval", copy)
    (copy / ".complete.json").unlink()  # hand data
    ann_file = copy / "annotations" / "instances_val2017.json"
    coco = json.loads(ann_file.read_text())
    names = {c["id"]: c["name"] for c in coco["categories"]}
    for category in coco["categories"]:
        category["name"] = names[{1: 2, 2: 1}.get(category["id"], category["id"])]
    ann_file.write_text(json.dumps(coco))
    cfg = compose_config([f"ckpt_path={run / 'checkpoints' / 'best.ckpt'}", "trainer.limit_test_batches=1",
                          f"data_root={copy}"], run / "eval2", data_dir, config_name="eval")
    with pytest.raises(RunDataError) as err:
        eval_script.evaluate(cfg)
    assert str(err.value).startswith(f"data_root={copy}: the categories of {ann_file} are not those the run's model"
                                     f" was trained on (label 0 is category 1 {names[1]!r} for the model, category 1"
                                     f" {names[2]!r} in the data)"), err.value


def test_resolvers_are_never_called(tmp_path: Path) -> None:
    """Interpolations anywhere in the parts that are read, even at the top, are refused unresolved."""
    calls: list = []
    OmegaConf.register_new_resolver("spy_11", lambda *args: calls.append(args) or {}, replace=True)
    model = "model: {_target_: models.classification.ClassificationModule}\n"
    for text in ("data: ${spy_11:a}\n" + model, "data: {_target_: '${spy_11:b}'}\n" + model,
                 "rpe: ${spy_11:c}\ndata: {_target_: data.ImageFolderDataModule}\n" + model):
        path = tmp_path / "config.yaml"
        path.write_text(text)
        with pytest.raises(RunConfigError, match="is an interpolation"):
            load_run_config(path)
    assert calls == []
