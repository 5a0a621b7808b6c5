"""eval.py and scripts/plot_rpe.py on faulty run dirs: a checkpoint that does not fit the run's model,
non-finite weights or metrics, and data that is missing, incomplete or other than the run names. Each is
one line naming what is wrong; neither tool ever generates or writes data, nor writes into the run dir."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import DictConfig, OmegaConf

from data.generation import MARKER_NAME
from lifecycle.run_config import (
    NonFiniteResultError,
    RunConfigError,
    RunDataError,
    first_non_finite,
    require_finite_metrics,
    state_dict_mismatch,
)
from scripts import plot_rpe
from tests.helpers import compose_config, run_cli

# A relational set of its own (other tests' roots hold other generator settings).
TINY = [
    "data.root=${paths.data_dir}/relational_evalfaults", "data.generator.num_train=64", "data.generator.num_val=16",
    "data.batch_size=16", "debug=fast", "logger=csv",
]
EMBED, CLASSES = 128, 8  # deit_micro's width; the relational task's class count
REMEDY = "train.py with the same data config generates it"
VALID = "; valid: a run's checkpoint file, runs/<run>/checkpoints/best.ckpt or last.ckpt"  # ckpt_path= of no file


def _hydra_build(cfg: DictConfig) -> tuple:
    """``(datamodule, module)`` the way train.py builds them (Hydra's instantiate on a trusted config)."""
    from hydra.utils import instantiate

    datamodule = instantiate(cfg.data, _convert_="all")
    rpe = OmegaConf.to_container(cfg.rpe, resolve=True)
    return datamodule, instantiate(cfg.model, rpe=rpe, num_classes=datamodule.num_classes, _convert_="all")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """A run dir (config.yaml, checkpoints/best.ckpt) of an untrained micro DeiT with iRPE-K whose generated
    data is on disk and complete (generated the way train.py does, not by the tools under test)."""
    run = tmp_path_factory.mktemp("evalfaults")
    cfg = compose_config(TINY, run, data_dir)
    OmegaConf.save(cfg, run / "config.yaml", resolve=True)
    datamodule, module = _hydra_build(cfg)
    datamodule.prepare_data()
    (run / "checkpoints").mkdir()
    torch.save({"state_dict": module.state_dict()}, run / "checkpoints" / "best.ckpt")
    return run


def _copy(run_dir: Path, tmp_path: Path, edit: Callable[[dict], None] | None = None) -> Path:
    """A copy of ``run_dir`` whose config.yaml ``edit`` changed (a config edited after training)."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    if edit is not None:
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        edit(cfg)
        (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    return run


def _eval_cfg(run: Path, tmp_path: Path, data_dir: Path, *extra: str):
    return compose_config([f"ckpt_path={run / 'checkpoints' / 'best.ckpt'}", *extra], tmp_path / "eval", data_dir,
                          config_name="eval")


def _eval_error(run: Path, tmp_path: Path, data_dir: Path, error: type[Exception]) -> str:
    import eval as eval_script

    with pytest.raises(error) as err:
        eval_script.evaluate(_eval_cfg(run, tmp_path, data_dir))
    text = str(err.value)
    assert "\n" not in text
    return text


def _plot_error(run: Path, capsys, *args: str) -> str:
    assert plot_rpe.main([str(run), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert not (run / "plots").exists()  # nothing drawn
    return err


def _snapshot(*folders: Path) -> dict[str, bytes]:
    """Every file under ``folders`` (path -> bytes), and which folders exist."""
    files: dict[str, bytes] = {}
    for folder in folders:
        files[f"{folder} exists"] = str(folder.exists()).encode()
        for path in sorted(folder.rglob("*")) if folder.exists() else []:
            files[str(path)] = path.read_bytes() if path.is_file() else b"<dir>"
    return files


# ----------------------------------------------------------------------------- 1: checkpoint does not fit
def test_state_dict_mismatch_summary() -> None:
    model = {"a": torch.zeros(2), "b": torch.zeros(3, 4), "c": torch.zeros(1), "d": torch.zeros(1),
             "e": torch.zeros(1), "f": torch.zeros(5)}
    given = {"b": torch.zeros(4, 3), "f": torch.zeros(6), "x": torch.zeros(1)}
    assert state_dict_mismatch(model, given) == (
        "4 missing key(s) (a, c, d, ...); 1 unexpected key(s) (x); "
        "2 shape mismatch(es), first: b has shape (4, 3) in the checkpoint, (3, 4) in the model"
    )
    assert state_dict_mismatch(model, {**model, "a": 1.0}) == (
        "1 shape mismatch(es), first: a is a float in the checkpoint, a tensor in the model"
    )
    assert state_dict_mismatch(model, dict(model)) == ""


def _other_run_checkpoint(run: Path, tmp_path: Path, data_dir: Path) -> None:
    """best.ckpt of a run with rpe=none copied over this run's: the 4 blocks' iRPE-K tables are missing."""
    _, other = _hydra_build(compose_config([*TINY, "rpe=none"], tmp_path / "other", data_dir))
    torch.save({"state_dict": other.state_dict()}, run / "checkpoints" / "best.ckpt")


def _extra_key(run: Path, tmp_path: Path, data_dir: Path) -> None:
    ckpt = run / "checkpoints" / "best.ckpt"
    state = torch.load(ckpt, weights_only=True)["state_dict"]
    torch.save({"state_dict": {**state, "net.extra_scale": torch.ones(1)}}, ckpt)


def _fewer_classes(run: Path, tmp_path: Path, data_dir: Path) -> None:
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["data"]["num_classes"] = 4  # edited after training: the 8-class head no longer fits
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))


MISFITS = {
    "other_run": (_other_run_checkpoint,
                  "4 missing key(s) (net.blocks.0.attn.rpe_k.lookup_table_weight, "
                  "net.blocks.1.attn.rpe_k.lookup_table_weight, net.blocks.2.attn.rpe_k.lookup_table_weight, ...)"),
    "extra_key": (_extra_key, "1 unexpected key(s) (net.extra_scale)"),
    "edited_config": (_fewer_classes,  # head weight and bias
                      f"2 shape mismatch(es), first: net.head.weight has shape ({CLASSES}, {EMBED}) in the "
                      f"checkpoint, (4, {EMBED}) in the model"),
}


@pytest.mark.parametrize("case", list(MISFITS))
def test_checkpoint_that_does_not_fit_is_one_line(case: str, run_dir: Path, tmp_path: Path, data_dir: Path,
                                                  capsys) -> None:
    run = _copy(run_dir, tmp_path)
    make, expected = MISFITS[case]
    make(run, tmp_path, data_dir)
    ckpt, config = run / "checkpoints" / "best.ckpt", run / "config.yaml"
    head = f"checkpoint {ckpt} does not fit the model of {config}: {expected}"
    assert _eval_error(run, tmp_path, data_dir, RunConfigError).startswith(head)
    assert head in _plot_error(run, capsys, "--plots", "tables")


# ----------------------------------------------------------------------------- 2: non-finite weights, metrics
def test_first_non_finite_tensor() -> None:
    module = torch.nn.Linear(2, 3)
    module.register_buffer("steps", torch.tensor([2**40, -1]))  # integer buffers cannot hold NaN
    module.register_buffer("scale", torch.tensor([1.0, math.inf, -math.inf]))
    assert first_non_finite(module) == ("scale", 2, 3)
    with torch.no_grad():
        module.bias[1] = math.nan
    assert first_non_finite(module) == ("bias", 1, 3)  # parameters first, in module order
    assert first_non_finite(torch.nn.Linear(2, 3)) is None


@pytest.mark.parametrize(("poison", "expected"), [
    ("all_nan", f"net.cls_token has {EMBED} NaN/inf of {EMBED} values"),  # cls_token: (1, 1, 128)
    ("one_inf", f"net.head.bias has 1 NaN/inf of {CLASSES} values"),
])
def test_non_finite_weights_are_refused(poison: str, expected: str, run_dir: Path, tmp_path: Path,
                                        data_dir: Path, capsys) -> None:
    run = _copy(run_dir, tmp_path)
    ckpt = run / "checkpoints" / "best.ckpt"
    state = torch.load(ckpt, weights_only=True)["state_dict"]
    if poison == "all_nan":
        state = {k: torch.full_like(v, math.nan) for k, v in state.items()}
    else:
        state["net.head.bias"][5] = math.inf
    torch.save({"state_dict": state}, ckpt)
    head = f"checkpoint {ckpt} holds non-finite weights: {expected}"
    assert _eval_error(run, tmp_path, data_dir, RunConfigError).startswith(head)
    assert head in _plot_error(run, capsys)  # all plots: no blank figure either


def test_non_finite_metric_is_never_a_result(run_dir: Path, tmp_path: Path, data_dir: Path, monkeypatch) -> None:
    """A NaN from the test loop (say an overflow in a low precision) stops eval instead of being printed."""
    import eval as eval_script

    assert require_finite_metrics({"val/top1": 50.0, "val/loss": 0.5}, "x") is None
    with pytest.raises(NonFiniteResultError, match=r"evaluating x gave non-finite metrics \(val/loss=inf\)"):
        require_finite_metrics({"val/top1": 50.0, "val/loss": math.inf}, "x")

    monkeypatch.setattr(eval_script, "scalar_metrics", lambda metrics: {"val/top1": math.nan, "val/top5": 75.0})
    ckpt = run_dir / "checkpoints" / "best.ckpt"
    with pytest.raises(NonFiniteResultError) as err:
        eval_script.evaluate(_eval_cfg(run_dir, tmp_path, data_dir))
    assert str(err.value).startswith(f"evaluating {ckpt} gave non-finite metrics (val/top1=nan)")


# ----------------------------------------------------------------------------- 3: data is read, never made
def _absent_root(tmp_path: Path) -> Callable[[dict], None]:
    def edit(cfg: dict) -> None:
        cfg["data"]["root"] = str(tmp_path / "nowhere" / "relational")
        # other settings too (as an edited config might name any, some that would take hours): a tool that
        # generated would write here quickly, which the snapshots catch
        cfg["data"]["generator"]["num_train"] = 32
    return edit


def test_missing_generated_data_is_never_generated(run_dir: Path, tmp_path: Path, data_dir: Path, capsys) -> None:
    run = _copy(run_dir, tmp_path, _absent_root(tmp_path))
    (tmp_path / "nowhere").mkdir()
    root = tmp_path / "nowhere" / "relational"
    before = _snapshot(tmp_path / "nowhere", run)
    expected = (f"data.root={root} named by {run / 'config.yaml'} does not exist: no complete generated dataset; "
                f"eval.py and plot_rpe.py read existing data only: {REMEDY}")
    message = _eval_error(run, tmp_path, data_dir, RunDataError)
    assert message.startswith(expected) and "data_root=<folder>" in message
    err = _plot_error(run, capsys)  # all plots: the attention maps need a validation image
    assert expected in err and "--data-root DIR" in err
    assert _snapshot(tmp_path / "nowhere", run) == before  # no data, no lock file, no temp dir

    # the tables need no data: drawn as usual
    assert plot_rpe.main([str(run), "--plots", "tables", "--out", str(tmp_path / "tables")]) == 0
    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == [f"tables_k_layer{i}.png" for i in range(4)]
    # and --data-root points the attention maps at existing data
    existing = data_dir / "relational_evalfaults"
    assert plot_rpe.main([str(run), "--plots", "attention", "--data-root", str(existing),
                          "--out", str(tmp_path / "maps")]) == 0
    assert [p.name for p in (tmp_path / "maps").iterdir()] == ["attention_image0_query_cls.png"]
    assert not root.exists()


def test_incomplete_or_other_data_is_refused(run_dir: Path, tmp_path: Path, data_dir: Path, capsys) -> None:
    data_root = data_dir / "relational_evalfaults"
    partial = tmp_path / "partial"
    shutil.copytree(data_root, partial)
    (partial / MARKER_NAME).unlink()  # what a generation killed before its marker would leave (if not atomic)

    def no_marker(cfg: dict) -> None:
        cfg["data"]["root"] = str(partial)

    run = _copy(run_dir, tmp_path, no_marker)
    before = _snapshot(partial)
    expected = f"data.root={partial} named by {run / 'config.yaml'} has no {MARKER_NAME} completion marker"
    assert _eval_error(run, tmp_path, data_dir, RunDataError).startswith(expected)
    assert expected in _plot_error(run, capsys)
    assert _snapshot(partial) == before

    (partial / MARKER_NAME).write_text("{")  # a truncated marker
    assert "is damaged (not valid JSON" in _eval_error(run, tmp_path, data_dir, RunDataError)
    shutil.copy(data_root / MARKER_NAME, partial / MARKER_NAME)
    first_class = sorted(p for p in (partial / "val").iterdir())[0]
    images = sorted(first_class.iterdir())
    images[0].unlink()  # changed by hand after generation
    expected = (f"data.root={partial} no longer holds what was generated (val/{first_class.name}/ has "
                f"{len(images) - 1} images, {len(images)} when generated)")
    message = _eval_error(run, tmp_path, data_dir, RunDataError)
    assert message.startswith(expected) and REMEDY in message

    def more_val(cfg: dict) -> None:
        cfg["data"]["generator"]["num_val"] = 32  # the data on disk was made with 16

    shutil.rmtree(run)
    run = _copy(run_dir, tmp_path, more_val)
    before = _snapshot(data_root)
    expected = (f"data.root={data_root} was generated with other settings than {run / 'config.yaml'} names "
                "(num_val: 16 on disk vs 32 named)")
    assert _eval_error(run, tmp_path, data_dir, RunDataError).startswith(expected)
    assert expected in _plot_error(run, capsys)
    assert _snapshot(data_root) == before


# ----------------------------------------------------------------------------- 4: eval only reads
def _hand_accuracy(run: Path) -> tuple[float, float]:
    """top-1 / top-5 (%) of the run's checkpoint on its val split, by Hydra's own build and a plain loop."""
    datamodule, module = _hydra_build(OmegaConf.load(run / "config.yaml"))
    module.load_state_dict(torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)["state_dict"])
    datamodule.setup("validate")
    images, labels = zip(*(datamodule.val_set[i] for i in range(len(datamodule.val_set))), strict=True)
    with torch.no_grad():
        logits = module.net.eval()(torch.stack(images))
    labels = torch.tensor(labels)
    top5 = logits.topk(5, dim=1).indices
    return (float((top5[:, 0] == labels).float().mean() * 100),
            float((top5 == labels[:, None]).any(1).float().mean() * 100))


def test_eval_reads_existing_data_and_writes_nothing(run_dir: Path, tmp_path: Path, data_dir: Path) -> None:
    """A complete generated set is evaluated (as ``data_root=`` elsewhere is); neither the run dir (its
    metrics.json included) nor the data changes."""
    import eval as eval_script

    run = _copy(run_dir, tmp_path)
    (run / "metrics.json").write_text(json.dumps({"val/top1": 99.0}))
    data_root = data_dir / "relational_evalfaults"
    before = _snapshot(run, data_root)
    top1, top5 = _hand_accuracy(run)
    metrics = eval_script.evaluate(_eval_cfg(run, tmp_path, data_dir))
    assert metrics["val/top1"] == pytest.approx(top1, abs=1e-4)
    assert metrics["val/top5"] == pytest.approx(top5, abs=1e-4)
    assert _snapshot(run, data_root) == before

    moved = _copy(run_dir, tmp_path / "moved", _absent_root(tmp_path))
    metrics = eval_script.evaluate(_eval_cfg(moved, tmp_path, data_dir, f"data_root={data_root}"))
    assert metrics["val/top1"] == pytest.approx(top1, abs=1e-4)
    assert _snapshot(run, data_root) == before and not (tmp_path / "nowhere").exists()


def test_reference_weights_mode_never_generates(tmp_path: Path, data_dir: Path) -> None:
    """``experiment=detr_shapes model.weights=<file>``: the experiment's generator is never run, and NaN
    reference weights are refused before evaluating."""
    import eval as eval_script
    from models.detr.reference import to_reference_checkpoint
    from tests.test_detr_reference import truth_predicting_detr

    root = tmp_path / "coco"
    weights = to_reference_checkpoint(truth_predicting_detr(3, label=0), tmp_path / "ref.pth")
    overrides = ["experiment=detr_shapes", f"model.weights={weights}", f"data.root={root}", "model.num_queries=1"]
    with pytest.raises(RunDataError) as err:
        eval_script.evaluate(compose_config(overrides, tmp_path / "eval", data_dir, config_name="eval"))
    assert str(err.value).startswith(f"data.root={root} named by the eval config does not exist")
    assert "pass data.root=<folder> pointing at existing data" in str(err.value)
    assert not root.exists()

    broken = truth_predicting_detr(3, label=0)
    with torch.no_grad():
        broken.class_embed.bias[1] = math.nan
    to_reference_checkpoint(broken, weights)
    with pytest.raises(RunConfigError) as err:
        eval_script.evaluate(compose_config(overrides, tmp_path / "eval", data_dir, config_name="eval"))
    assert f"model.weights={weights} holds non-finite weights: model.class_embed.bias has 1 NaN/inf of 4" in str(
        err.value)



def test_a_symlink_loop_as_ckpt_path_is_named_a_loop(tmp_path: Path, data_dir: Path) -> None:
    """Probe 16, p4: a checkpoint symlink to itself was "a symlink (to loop4.ckpt, which does not exist)", the
    loop's own name given as a missing target. A link to itself and a two-link circle are named as loops; a link
    to nothing is still named dangling."""
    import eval as eval_script

    (tmp_path / "loop4.ckpt").symlink_to("loop4.ckpt")
    (tmp_path / "a.ckpt").symlink_to("b.ckpt")
    (tmp_path / "b.ckpt").symlink_to("a.ckpt")
    (tmp_path / "gone.ckpt").symlink_to("nothing.ckpt")
    for name, what in (("loop4.ckpt", "it is a symlink loop (to loop4.ckpt: its links lead back to themselves)"),
                       ("a.ckpt", "it is a symlink loop (to b.ckpt: its links lead back to themselves)"),
                       ("gone.ckpt", "it is a symlink (to nothing.ckpt, which does not exist)")):
        path = tmp_path / name
        cfg = compose_config([f"ckpt_path={path}"], tmp_path / "eval", data_dir, config_name="eval")
        with pytest.raises(FileNotFoundError) as err:
            eval_script.evaluate(cfg)
        assert str(err.value) == f"ckpt_path='{path}' is not a checkpoint file: {what}{VALID}"


@pytest.mark.parametrize("kind", ["device", "fifo", "folder", "loop", "link to a fifo", "missing"])
def test_model_weights_that_are_no_file_are_named_for_what_they_are(kind: str, tmp_path: Path,
                                                                   data_dir: Path) -> None:
    """Probe 16, p45, p46: ``model.weights=/dev/zero`` (a device) and a FIFO were said not to exist. Each is
    named for what stands there, with the valid choice, and a FIFO is never opened (no hang)."""
    import eval as eval_script

    weights = tmp_path / "w.pth"
    if kind == "device":
        weights, what = Path("/dev/zero"), "is not a file: it is a device"
    elif kind == "fifo":
        os.mkfifo(weights)
        what = "is not a file: it is a FIFO (named pipe)"
    elif kind == "folder":
        weights.mkdir()
        what = "is not a file: it is a directory"
    elif kind == "loop":
        weights.symlink_to(weights.name)
        what = "is not a file: it is a symlink loop (to w.pth: its links lead back to themselves)"
    elif kind == "link to a fifo":
        os.mkfifo(tmp_path / "fifo")
        weights.symlink_to(tmp_path / "fifo")
        what = f"is not a file (it leads to {tmp_path / 'fifo'}): it is a FIFO (named pipe)"
    else:
        what = "does not exist"
    overrides = ["experiment=detr_shapes", f"model.weights={weights}", f"data.root={tmp_path / 'coco'}"]
    signal.alarm(60)  # a reader that opened the FIFO would wait for a writer forever: fail instead
    try:
        with pytest.raises(FileNotFoundError) as err:
            eval_script.evaluate(compose_config(overrides, tmp_path / "eval", data_dir, config_name="eval"))
    finally:
        signal.alarm(0)
    assert str(err.value) == (f"model.weights='{weights}' {what}; valid: model.weights=<a reference-layout DETR"
                              " checkpoint file>")
    assert not (tmp_path / "coco").exists()


# ----------------------------------------------------------------------------- the command line
@pytest.mark.slow  # several train.py or eval.py processes: make test's 5 minutes
def test_eval_cli_faults_are_one_line(run_dir: Path, tmp_path: Path, data_dir: Path) -> None:
    """End to end: exit 2, one ``error:`` line, no table printed (a run's checkpoint error and a data error;
    the other faults are raised as the same error classes, as tested in-process above)."""
    env = {"OMP_NUM_THREADS": "1"}
    cases = {
        "nan": (lambda run: torch.save({"state_dict": {
            k: torch.full_like(v, math.nan)
            for k, v in torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)["state_dict"].items()}},
            run / "checkpoints" / "best.ckpt"), "holds non-finite weights: net.cls_token"),
        "no_data": (lambda run: None, "does not exist: no complete generated dataset"),
    }
    for name, (make, expected) in cases.items():
        run = _copy(run_dir, tmp_path / name, _absent_root(tmp_path) if name == "no_data" else None)
        make(run)
        result = run_cli("eval.py", [f"ckpt_path={run / 'checkpoints' / 'best.ckpt'}"], env_extra=env)
        assert result.returncode == 2, (name, result.stderr[-2000:])
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, (name, result.stderr)
        assert expected in result.stderr, (name, result.stderr)
        assert "val/top1" not in result.stdout and not (run / "metrics.json").exists()


def test_eval_batch_size_is_only_a_loading_choice(run_dir: Path, tmp_path: Path, data_dir: Path) -> None:
    """``batch_size=`` changes how eval loads the data, not which run it is: the same numbers."""
    import eval as eval_script

    base = eval_script.evaluate(_eval_cfg(run_dir, tmp_path, data_dir))
    other = eval_script.evaluate(_eval_cfg(run_dir, tmp_path, data_dir, "batch_size=7"))
    assert other["val/top1"] == pytest.approx(base["val/top1"]) and other["val/top5"] == pytest.approx(base["val/top5"])


@pytest.mark.parametrize("arg", ["batch_size=0", "batch_size=-3", "throughput_batch=0", "throughput_batch=-1"])
def test_eval_settings_are_range_checked(arg: str) -> None:
    from lifecycle.cli import check_overrides
    from lifecycle.console import CommandLineError
    from lifecycle.settings import SettingError

    with pytest.raises((SettingError, CommandLineError), match=arg.split("=")[0]):
        check_overrides(["ckpt_path=x.ckpt", arg], "eval")


def test_trainer_barebones_is_refused_as_no_eval_setting(run_dir: Path, tmp_path: Path, data_dir: Path,
                                                         monkeypatch) -> None:
    """Probe 8 case B1: ``+trainer.barebones=true`` gave Lightning's "`Trainer(barebones=True,
    log_every_n_steps=10)` was passed...": one line naming the key and why eval.py cannot take it, before anything
    is built."""
    import eval as eval_script

    monkeypatch.setattr(eval_script, "_run_data_and_model", lambda cfg: pytest.fail("the run was built"))
    with pytest.raises(ValueError) as err:
        eval_script.evaluate(_eval_cfg(run_dir, tmp_path, data_dir, "+trainer.barebones=true"))
    assert str(err.value) == ("trainer.barebones=True is not an eval setting: it turns off the logging eval.py reads"
                              " the test's metrics from; valid: drop it (trainer.barebones=false)")


def test_plot_grid_is_bounded(run_dir: Path, capsys) -> None:
    err = _plot_error(run_dir, capsys, "--grid", "2000,2000", "--out", str(run_dir.parent / "plots_grid"))
    assert "--grid 2000,2000 is out of range; valid: H,W with 1 <= H, W <=" in err


@pytest.mark.parametrize("override", ["model.net.ape=sincos", "rpe=irpe_qkv", "data.img_size=64",
                                      "+model.net.drop_path_rate=0.5", "experiment=ablation_mini"])
def test_an_override_the_runs_config_would_overrule_is_refused(override: str) -> None:
    """eval.py ckpt_path=... builds the run from its own config.yaml: such an override would be ignored."""
    import eval as eval_script

    eval_script.check_run_eval_overrides(["ckpt_path=r/checkpoints/best.ckpt", "batch_size=8", "testset=val_at_48",
                                          "testset.data.generator.num_val=16", "ape=extend", "trainer=cpu",
                                          "paths.data_dir=/d", "data_root=/x", "throughput_batch=2"])
    with pytest.raises(ValueError) as err:
        eval_script.check_run_eval_overrides(["ckpt_path=r/checkpoints/best.ckpt", override])
    assert str(err.value).startswith(f"{override} cannot change a run evaluated with ckpt_path=: its model,")
    assert "valid here: ckpt_path, batch_size, data_root" in str(err.value) and "\n" not in str(err.value)


def test_a_run_that_has_not_finished_is_evaluated_with_a_note(run_dir: Path, tmp_path: Path, data_dir: Path,
                                                               capsys) -> None:
    """Looking at an interrupted run's best.ckpt is legitimate, but its numbers are not the run's result."""
    import eval as eval_script

    run = _copy(run_dir, tmp_path)  # a config and a checkpoint, no result: the run never ended
    eval_script.evaluate(_eval_cfg(run, tmp_path, data_dir))
    assert f"note: not a result: {run} has not finished (unfinished): these are the numbers of its checkpoint" \
           " so far" in capsys.readouterr().err
    (run / "metrics.json").write_text(json.dumps({"val/top1": 99.0, "train_complete": False}))
    eval_script.evaluate(_eval_cfg(run, tmp_path, data_dir))
    assert f"note: not a result: {run} is a smoke run: each epoch trained on a part of the training split" \
           in capsys.readouterr().err
    (run / "metrics.json").write_text(json.dumps({"val/top1": 99.0}))
    eval_script.evaluate(_eval_cfg(run, tmp_path, data_dir))
    assert "not a result" not in capsys.readouterr().err


def test_a_run_that_has_not_finished_gets_no_test_set_result(run_dir: Path, tmp_path: Path, data_dir: Path,
                                                              capsys) -> None:
    """Probe 5 (read from the code): a test-set result written for an interrupted run carried the run's identity and
    length, which the resumed run keeps while its best.ckpt changes, so evaluate_testsets kept it and make_tables
    counted it as the finished run's. The numbers are shown with the note; nothing is recorded."""
    import eval as eval_script

    run = _copy(run_dir, tmp_path)  # no run record: the run never ended
    metrics = eval_script.evaluate(_eval_cfg(run, tmp_path, data_dir, "testset=val_at_48", "throughput_batch=2"))
    assert "val/top1" in metrics
    assert not any((run / "testsets").glob("*.json"))
    err = capsys.readouterr().err
    assert f"note: not a result: {run} has not finished (unfinished)" in err, err
    assert f"nothing written to {run / 'testsets'} (a test-set result is of a finished run)" in err, err


def test_a_smoke_run_gets_no_test_set_result(run_dir: Path, tmp_path: Path, data_dir: Path, capsys) -> None:
    """Probe 8, B126: eval.py wrote a test-set result for a smoke run (trained on part of its split) while its note
    said "not a result", and evaluate_testsets left the same run out. Shown with the note; nothing written."""
    import eval as eval_script

    run = _copy(run_dir, tmp_path)
    (run / "metrics.json").write_text(json.dumps({"val/top1": 99.0, "train_complete": False}))
    metrics = eval_script.evaluate(_eval_cfg(run, tmp_path, data_dir, "testset=val_at_48", "throughput_batch=2"))
    assert "val/top1" in metrics and not any((run / "testsets").glob("*.json"))
    err = capsys.readouterr().err
    assert f"{run} is a smoke run" in err and f"nothing written to {run / 'testsets'} (a smoke run has no result)" \
        in err, err


def test_a_test_of_part_of_the_split_is_printed_with_a_not_a_result_note(run_dir: Path, tmp_path: Path,
                                                                        data_dir: Path, capsys) -> None:
    """Probe 2026-12-05 case 118: ``trainer.limit_test_batches=1 batch_size=8`` printed val/top1 of 8 of the
    split's images as the checkpoint's, with no note; eval.py writes nothing, so the note is what says it."""
    import eval as eval_script

    run = _copy(run_dir, tmp_path)
    (run / "metrics.json").write_text(json.dumps({"val/top1": 99.0}))  # a finished run: no other note
    for limit in ("1", "0.5"):
        notes: list[str] = []
        eval_script.evaluate(_eval_cfg(run, tmp_path, data_dir, "batch_size=8", f"trainer.limit_test_batches={limit}"),
                             notes=notes)
        why = f"the test read 8 of 16 images (trainer.limit_test_batches={limit}): numbers of a part of the split"
        assert notes == [why] and f"note: not a result: {why}\n" in capsys.readouterr().err
    notes = []
    eval_script.evaluate(_eval_cfg(run, tmp_path, data_dir, "batch_size=8", "trainer.limit_test_batches=2"),
                         notes=notes)  # two batches of 8: the whole split
    assert notes == [] and "not a result" not in capsys.readouterr().err


@pytest.mark.slow  # one eval.py process; the same note is checked in-process above
def test_eval_cli_marks_a_partial_test_not_a_result(run_dir: Path, tmp_path: Path, data_dir: Path) -> None:
    run = _copy(run_dir, tmp_path)
    (run / "metrics.json").write_text(json.dumps({"val/top1": 99.0}))
    result = run_cli("eval.py", [f"ckpt_path={run / 'checkpoints' / 'best.ckpt'}", "batch_size=8",
                                 "trainer.limit_test_batches=1", "throughput_batch=2", f"paths.data_dir={data_dir}"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert ("note: not a result: the test read 8 of 16 images (trainer.limit_test_batches=1): numbers of a part of"
            " the split") in result.stderr
    assert "notaresultoftherun" in "".join(result.stdout.split())  # the table's title says so too (rich wraps it)


def test_a_folder_for_ckpt_path_and_a_missing_data_root_are_named_as_given(run_dir: Path, tmp_path: Path,
                                                                          data_dir: Path) -> None:
    import eval as eval_script

    run = _copy(run_dir, tmp_path)
    for folder, example in ((run / "checkpoints", run / "checkpoints" / "best.ckpt"),
                            (run, run / "checkpoints" / "best.ckpt")):
        cfg = compose_config([f"ckpt_path={folder}"], tmp_path / "eval", data_dir, config_name="eval")
        with pytest.raises(FileNotFoundError) as err:
            eval_script.evaluate(cfg)
        assert str(err.value) == f"ckpt_path={str(folder)!r} is a folder; give a checkpoint file, e.g. {example}"
    # the run's config.yaml instead of its checkpoint, and an empty ckpt_path=
    cfg = compose_config([f"ckpt_path={run / 'config.yaml'}"], tmp_path / "eval", data_dir, config_name="eval")
    with pytest.raises(FileNotFoundError) as err:
        eval_script.evaluate(cfg)
    assert str(err.value) == (f"ckpt_path={str(run / 'config.yaml')!r} is not a checkpoint (a run's are"
                              " runs/<run>/checkpoints/best.ckpt and last.ckpt)")
    cfg = compose_config(["ckpt_path="], tmp_path / "eval", data_dir, config_name="eval")
    with pytest.raises(FileNotFoundError, match="^ckpt_path is empty; give a run's checkpoint, e.g."):
        eval_script.evaluate(cfg)
    with pytest.raises(ValueError) as err:
        eval_script.evaluate(_eval_cfg(run, tmp_path, data_dir, f"data_root={tmp_path / 'nowhere'}"))
    assert str(err.value).startswith(f"data.root={tmp_path / 'nowhere'} named by the data_root= override does"
                                     " not exist")
    # data of another number of classes: the run's model fixes its classes (no data.num_classes advice)
    from data.fake import make_fake_imagefolder

    three = make_fake_imagefolder(tmp_path / "three", num_classes=3, per_class=2, img_size=32)
    with pytest.raises(ValueError) as err:
        eval_script.evaluate(_eval_cfg(run, tmp_path, data_dir, f"data_root={three}"))
    assert str(err.value) == (f"data.root={three} has 3 class folders, but the run's model has 8 classes; valid:"
                              " data with its 8 classes")
    # a device, and a symlink to nothing, are named for what they are
    dangling = tmp_path / "gone.ckpt"
    dangling.symlink_to(tmp_path / "nothing.ckpt")
    for path, what in (("/dev/null", "it is a device"),
                       (dangling, f"it is a symlink (to {tmp_path / 'nothing.ckpt'}, which does not exist)")):
        cfg = compose_config([f"ckpt_path={path}"], tmp_path / "eval", data_dir, config_name="eval")
        with pytest.raises(FileNotFoundError) as err:
            eval_script.evaluate(cfg)
        assert str(err.value) == f"ckpt_path='{path}' is not a checkpoint file: {what}{VALID}"
    # an empty data.root in the run's config.yaml is no folder (not the working dir)
    config = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(re.sub(r"(?m)^  root: .*$", "  root: ''", config, count=1))
    with pytest.raises(ValueError) as err:
        eval_script.evaluate(_eval_cfg(run, tmp_path, data_dir))
    assert str(err.value) == ("data.root='' in the run's config names no data folder; pass data_root=<folder>"
                              " (plot_rpe.py: --data-root) pointing at existing data")
    (run / "checkpoints" / "best.ckpt").unlink()  # probe 15, n24: a folder in best.ckpt's place names no example
    (run / "checkpoints" / "best.ckpt").mkdir()
    cfg = compose_config([f"ckpt_path={run / 'checkpoints' / 'best.ckpt'}"], tmp_path / "eval", data_dir,
                         config_name="eval")
    with pytest.raises(FileNotFoundError) as err:
        eval_script.evaluate(cfg)
    assert str(err.value).startswith(f"ckpt_path='{run / 'checkpoints' / 'best.ckpt'}' is a folder, where the run's"
                                     " checkpoint file belongs")


def test_a_checkpoint_trained_past_the_runs_length_is_not_evaluated(run_dir: Path, tmp_path: Path,
                                                                     data_dir: Path) -> None:
    """The same config's weights trained for more epochs pass the identity check; the length says otherwise."""
    import eval as eval_script

    run = _copy(run_dir, tmp_path)
    best = run / "checkpoints" / "best.ckpt"
    max_epochs = OmegaConf.load(run / "config.yaml").trainer.max_epochs
    saved = torch.load(best, weights_only=True)
    torch.save({**saved, "epoch": max_epochs + 4}, best)
    with pytest.raises(RunConfigError) as err:
        eval_script.evaluate(_eval_cfg(run, tmp_path, data_dir))
    assert str(err.value) == (f"ckpt_path={str(best)!r} is not the checkpoint of the run in {run}: it was saved in"
                              f" epoch {max_epochs + 5}, past this run's trainer.max_epochs={max_epochs}")


def test_data_root_made_with_other_settings_gets_a_note(run_dir: Path, tmp_path: Path, data_dir: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """``data_root=`` is used as it is, but numbers on data generated otherwise than the run's say so."""
    import eval as eval_script

    run = _copy(run_dir, tmp_path)
    other = tmp_path / "other_data"
    shutil.copytree(data_dir / "relational_evalfaults", other)
    marker = json.loads((other / MARKER_NAME).read_text())
    marker["generator"]["kwargs"]["num_train"] = 8000
    (other / MARKER_NAME).write_text(json.dumps(marker))
    eval_script.evaluate(_eval_cfg(run, tmp_path, data_dir, f"data_root={other}"))
    assert (f"note: data_root={other} was generated with other settings than the run's data (num_train: 8000 on"
            " disk vs 64 named): these numbers are on that data\n") in capsys.readouterr().err
    eval_script.evaluate(_eval_cfg(run, tmp_path, data_dir, f"data_root={data_dir / 'relational_evalfaults'}"))
    assert "note: data_root" not in capsys.readouterr().err  # the same settings: no note


def _not_a_plain_file(path: Path, kind: str) -> str:
    """Put a FIFO or a socket at ``path`` (the file moved away); returns how the file layer names it."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
        return "it is a FIFO (named pipe)"
    server = socket.socket(socket.AF_UNIX)  # a socket's path may be only ~100 bytes long: bound by its name
    cwd = os.getcwd()
    os.chdir(path.parent)
    try:
        server.bind(path.name)
    finally:
        os.chdir(cwd)
        server.close()
    return "it is a socket"


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_a_fifo_or_socket_where_a_run_file_belongs_is_named_never_missing(kind: str, run_dir: Path, tmp_path: Path,
                                                                          data_dir: Path, capsys) -> None:
    """Probe 3, cases 128, 129: a FIFO as config.yaml was "no run config at ..." (eval.py), one as best.ckpt
    "does not exist" beside a listing of it (plot_rpe.py). Each reader asks the file layer, which tells a missing
    file from one that is there but not a plain file, and never opens it (a FIFO would block the reader)."""
    run = _copy(run_dir, tmp_path / kind)
    config, best = run / "config.yaml", run / "checkpoints" / "best.ckpt"
    kept = config.read_bytes()
    what = _not_a_plain_file(config, kind)
    line = f"{config} cannot be used: {what}, where a plain file belongs; move it away"
    signal.alarm(60)  # a reader that opened the FIFO would wait for a writer forever: fail instead
    try:
        assert _eval_error(run, tmp_path, data_dir, ValueError) == line
        assert _plot_error(run, capsys, "--plots", "tables") == f"error: {line}\n"
        config.unlink()
        config.write_bytes(kept)
        what = _not_a_plain_file(best, kind)
        line = f"{best} cannot be used: {what}, where a plain file belongs; move it away"
        assert _plot_error(run, capsys, "--plots", "tables") == f"error: {line}\n"
        assert _eval_error(run, tmp_path, data_dir, FileNotFoundError) == (
            f"ckpt_path='{best}' is not a checkpoint file: {what}{VALID}")
    finally:
        signal.alarm(0)


# ------------------------------------------------------------- other data must name the run's classes in order
RELATIONAL = ["0_E", "1_NE", "2_N", "3_NW", "4_W", "5_SW", "6_S", "7_SE"]
# the relational classes under other names, sorted in reverse: label 0 is south-east (7_SE) here, east elsewhere
FAST_EVAL = "throughput_batch=2"  # the speed measurement is not what these tests are about
REVERSED = {name: f"{chr(ord('A') + 7 - i)}_{name.split('_')[1]}" for i, name in enumerate(RELATIONAL)}


def _hand_copy(data_dir: Path, folder: Path, names: dict[str, str] | None = None, drop: int = 0) -> Path:
    """The generated relational images as hand data (no marker) at ``folder``, each class folder renamed by
    ``names``, the first ``drop`` images of each class left out (other files under the same classes)."""
    shutil.copytree(data_dir / "relational_evalfaults", folder, ignore=shutil.ignore_patterns(MARKER_NAME))
    for split in ("train", "val"):
        for old, new in (names or {}).items():
            (folder / split / old).rename(folder / split / new)
        for class_dir in (folder / split).iterdir():
            for image in sorted(class_dir.iterdir())[:drop]:
                image.unlink()
    return folder


def _hand_run(run_dir: Path, tmp_path: Path, root: Path, record: bool = True) -> Path:
    """A copy of the run trained on the hand data at ``root``; its checkpoint records the class names as
    train.py's now does (``record``), or none, as one saved before they were recorded."""
    def edit(cfg: dict) -> None:
        cfg["data"]["root"], cfg["data"]["generator"] = str(root), None

    run = _copy(run_dir, tmp_path, edit)
    best = run / "checkpoints" / "best.ckpt"
    if record:
        saved = torch.load(best, weights_only=True)
        classes = sorted(p.name for p in (root / "train").iterdir())
        torch.save({**saved, "ImageFolderDataModule": {"classes": classes}}, best)
    return run


def test_other_data_whose_class_folders_are_not_the_runs_is_refused(run_dir: Path, tmp_path: Path,
                                                                    data_dir: Path, capsys) -> None:
    """Probe case 76: a run trained on hand data whose class 0 is A_SE, evaluated at ``data_root=`` on data
    whose class 0 is 0_E, scored each image against another class and printed the numbers without a note."""
    import eval as eval_script

    hand = _hand_copy(data_dir, tmp_path / "hand", REVERSED)
    run = _hand_run(run_dir, tmp_path, hand)
    generated = data_dir / "relational_evalfaults"
    with pytest.raises(RunDataError) as err:
        eval_script.evaluate(_eval_cfg(run, tmp_path, data_dir, f"data_root={generated}", FAST_EVAL))
    assert str(err.value) == (
        f"data_root={generated}: the class folders of {generated / 'val'} are not the classes the run's model was"
        " trained on (label 0 is A_SE for the model and 0_E here; only the model has A_SE, B_S, C_SW, D_W, E_NW,"
        " F_N, G_NE, H_E; only here: 0_E, 1_NE, 2_N, 3_NW, 4_W, 5_SW, 6_S, 7_SE); labels index the sorted folder"
        " names, so each image would be scored against another class (nothing was evaluated); valid: data whose"
        " class folders are the run's: A_SE, B_S, C_SW, D_W, E_NW, F_N, G_NE, H_E")
    # other files under the run's class names: what data_root= is for, evaluated without a note
    fewer = _hand_copy(data_dir, tmp_path / "fewer", REVERSED, drop=1)
    eval_script.evaluate(_eval_cfg(run, tmp_path, data_dir, f"data_root={fewer}", FAST_EVAL))
    assert "class folders" not in capsys.readouterr().err


def test_a_generated_run_on_hand_data_of_other_class_names_is_refused_or_noted(run_dir: Path, tmp_path: Path,
                                                                               data_dir: Path, capsys) -> None:
    """A checkpoint saved before the classes were recorded: the run's own data.root, while it still holds the
    run's data, names them; where nothing does, the numbers come with a note, never silently."""
    import eval as eval_script

    hand = _hand_copy(data_dir, tmp_path / "hand", REVERSED)
    with pytest.raises(RunDataError, match=r"label 0 is 0_E for the model and A_SE here"):
        eval_script.evaluate(_eval_cfg(_copy(run_dir, tmp_path), tmp_path, data_dir, f"data_root={hand}", FAST_EVAL))
    moved = _copy(run_dir, tmp_path / "moved", _absent_root(tmp_path))  # its data.root is gone: classes unknown
    metrics = eval_script.evaluate(_eval_cfg(moved, tmp_path, data_dir, f"data_root={hand}", FAST_EVAL))
    assert "val/top1" in metrics
    assert (f"note: the run's class names are not in its checkpoint (saved before they were recorded), nor shown"
            f" by its data.root (gone, or changed since): the class folders of {hand / 'val'} (A_SE, B_S, C_SW, D_W,"
            " E_NW, F_N, G_NE, H_E) are taken to be the run's classes in that order\n") in capsys.readouterr().err


def test_a_run_json_whose_lengths_lack_its_own_length_is_named_damaged(run_dir: Path, tmp_path: Path,
                                                                        data_dir: Path, capsys) -> None:
    """Probe 5 case 59: ``lengths`` emptied in run.json made eval.py disown the run's own best.ckpt ("saved by a
    run of length ..., which this run dir never trained at"). A run dir always trained at its own length, so such
    a record is damaged: eval.py evaluates the checkpoint and names run.json, as for any other damage."""
    import eval as eval_script
    from lifecycle.checkpoints import LENGTH_KEY
    from lifecycle.identity import identity_config, identity_hash, run_length
    from lifecycle.records import RunRecord, read_run_record
    from storage.files import RunFileError

    run = _copy(run_dir, tmp_path)
    cfg = OmegaConf.load(run / "config.yaml")
    identity, length = identity_config(cfg), run_length(cfg)
    best = run / "checkpoints" / "best.ckpt"
    torch.save({**torch.load(best, weights_only=True), LENGTH_KEY: length}, best)  # saved at the run's own length
    damaged = f"{run / 'run.json'} is damaged: its lengths [] lack the run's own length {length}"
    for lengths in ([length], []):
        RunRecord(run, identity_hash(identity), identity, length, {"lengths": lengths}).save("finished")
        (run / "metrics.json").write_text(json.dumps({"val/top1": 12.5, "identity": identity_hash(identity)}))
        metrics = eval_script.evaluate(_eval_cfg(run, tmp_path, data_dir))
        assert "val/top1" in metrics  # the run's own checkpoint is evaluated either way
        err = capsys.readouterr().err
        assert (damaged in err) == (lengths == []), err
    with pytest.raises(RunFileError) as info:
        read_run_record(run)
    assert str(info.value) == damaged


def test_another_checkpoint_in_best_ckpts_place_gets_no_test_set_result(run_dir: Path, tmp_path: Path,
                                                                         data_dir: Path) -> None:
    """Probe 11, F114: last.ckpt copied over best.ckpt (the same training's token, another step than metrics.json's
    best_step) was evaluated and written as the run's test-set result. It is one line, nothing written; the
    run's own best.ckpt is evaluated and its result records its step."""
    import eval as eval_script
    from lifecycle.checkpoints import LENGTH_KEY
    from lifecycle.checkpoints import TRAINING_KEY as CHECKPOINT_TRAINING_KEY
    from lifecycle.identity import identity_config, identity_hash, run_length
    from lifecycle.records import RunRecord
    from storage.files import with_checksum

    run = _copy(run_dir, tmp_path)
    cfg = OmegaConf.load(run / "config.yaml")
    identity, length = identity_config(cfg), run_length(cfg)
    RunRecord(run, identity_hash(identity), identity, length, {"lengths": [length]}).save("finished")
    metrics = {"val/top1": 12.5, "identity": identity_hash(identity), "training": "t" * 16, "best_step": 1}
    (run / "metrics.json").write_text(json.dumps(with_checksum(metrics)))
    best = run / "checkpoints" / "best.ckpt"
    saved = torch.load(best, weights_only=True)
    for step in (3, 1):
        torch.save({**saved, LENGTH_KEY: length, CHECKPOINT_TRAINING_KEY: "t" * 16, "global_step": step}, best)
        cfg = _eval_cfg(run, tmp_path, data_dir, "testset=val_at_48", "throughput_batch=null")
        if step == 3:
            with pytest.raises(RunConfigError) as err:
                eval_script.evaluate(cfg)
            assert str(err.value) == (
                f"ckpt_path={best} is not the run's best.ckpt: it is a checkpoint of step 3, while the run's best.ckpt"
                " is of step 1 (metrics.json best_step): another checkpoint of the same training was put in its place"
                " (last.ckpt copied over it?); valid: the run's own best.ckpt (train the run again to make it), or"
                " eval.py without testset=")
            assert not any((run / "testsets").glob("*.json"))
        else:
            eval_script.evaluate(cfg)
            [result] = (run / "testsets").glob("*.json")
            assert json.loads(result.read_text())["checkpoint_step"] == 1


def test_the_tables_title_keeps_each_path_whole(capsys: pytest.CaptureFixture) -> None:
    """Probe 17, q11: the title (the checkpoint and the result's path) was a table title, broken mid-word at the
    terminal's width (``.../ch`` / ``eckpoints/best.ckpt``); it is a line of its own above the table."""
    import eval as eval_script

    title = ("/tmp/" + "deep/" * 30 + "runs/r/checkpoints/best.ckpt on testset=relational_canvas48 (written to"
             " /tmp/" + "deep/" * 30 + "runs/r/testsets/relational_canvas48.json)")
    eval_script.print_table({"val/top1": 12.5, "params_M": 0.5}, title)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == title
    assert any("val/top1" in line for line in lines[1:]) and any("12.50" in line for line in lines[1:])


def test_a_profilers_files_go_outside_every_run_and_data_root(tmp_path: Path) -> None:
    """Probe 18, s89/s91: ``eval.py ckpt_path=runs/d2/... trainer.profiler={_target_: SimpleProfiler, dirpath:
    runs/d1, filename: ev}`` wrote ``test-ev.txt`` into another run (d1), or into the test set's data root: the
    command line's check judged the folder against eval.py's working dir, not against the runs and data."""
    from lifecycle.cli import check_overrides
    from lifecycle.settings import SettingError

    other = tmp_path / "runs" / "d1"
    (other / "checkpoints").mkdir(parents=True)
    (other / "run.json").write_text('{"state": "finished"}')
    data = tmp_path / "data"
    ckpt = f"ckpt_path={tmp_path / 'runs' / 'd2' / 'checkpoints' / 'best.ckpt'}"

    def profiler(folder: Path) -> str:
        return f"trainer.profiler={{_target_:lightning.pytorch.profilers.SimpleProfiler,dirpath:{folder},filename:ev}}"

    for folder, where in ((other, f"is the run dir {other}, whose files are that run's"),
                          (data / "x", f"is inside the data root {data}, where a new folder")):
        with pytest.raises(SettingError) as err:
            check_overrides([ckpt, f"data_root={data}", profiler(folder)], "eval")
        assert str(err.value).startswith(f"trainer.profiler.dirpath={str(folder)!r} {where}"), err.value
        assert "; valid: a folder outside every run dir, data root, sweep dir and archive" in str(err.value)
        assert "\n" not in str(err.value)
    # a folder of its own, and a profiler by name (it prints), are evaluation settings
    check_overrides([ckpt, profiler(tmp_path / "profiles")], "eval")
    check_overrides([ckpt, "trainer.profiler=simple"], "eval")
    with pytest.raises(SettingError, match=r"^trainer.logger is not a setting: .* valid: leave it out \(eval.py"):
        check_overrides([ckpt, "+trainer.logger=false"], "eval")  # no +logger group to point at: eval.py has none
    assert sorted(p.name for p in other.iterdir()) == ["checkpoints", "run.json"] and not data.exists()
