"""Command-line input: Trainer keys without Hydra's ``+``, one-line errors for unknown keys and bad syntax,
group choices without internal ``_`` bases, and model/data mismatches (DETR on classification data, an image
size the patch or window grid does not divide) as one line naming the values."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from omegaconf import DictConfig

import lifecycle.cli as cli
import lifecycle.project as project
from models import ModelConfigError, create_model
from models.swin import swin_grid_problem
from rpe import PRESETS
from tests.helpers import SMALL_RELATIONAL, compose_config, file_modes_hold, run_cli

ENV = {"OMP_NUM_THREADS": "1"}


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr[-3000:]
    return lines[0]


@pytest.mark.slow  # a train.py run; the declared keys are checked in-process below
def test_trainer_limits_work_without_plus(tmp_path: Path, data_dir: Path) -> None:
    """No debug=fast (which sets them): the limits are declared by configs/trainer/_base.yaml."""
    result = run_cli("train.py", [
        *SMALL_RELATIONAL, "trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1", "callbacks=none", "print_config=false", f"paths.data_dir={data_dir}",
        f"paths.log_dir={tmp_path}", "run_name=limits",
    ], env_extra=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "limits" / "metrics.json").read_text())["global_step"] == 2


def test_declared_trainer_keys_equal_lightning_defaults_and_plus_still_works(tmp_path: Path, data_dir: Path) -> None:
    import inspect

    import lightning as L

    defaults = inspect.signature(L.Trainer.__init__).parameters
    cfg = compose_config(["trainer=cpu"], tmp_path, data_dir)
    for key in ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches",
                "val_check_interval", "num_sanity_val_steps", "max_steps", "overfit_batches", "fast_dev_run",
                "strategy", "gradient_clip_algorithm", "benchmark", "detect_anomaly", "profiler", "max_time"):
        assert cfg.trainer[key] == defaults[key].default, key
    # the old spelling with + keeps working (on the command line and in compose)
    assert cli.normalize_overrides(["+trainer.limit_train_batches=3", "+experiment=x", "a=1"]) == [
        "++trainer.limit_train_batches=3", "+experiment=x", "a=1"]
    cfg = compose_config(["+trainer.limit_train_batches=3", "trainer=ddp_cpu"], tmp_path, data_dir)
    assert cfg.trainer.limit_train_batches == 3 and cfg.trainer.strategy.process_group_backend == "gloo"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["trainer.limit_train_batchez=3"],
         "error: trainer.limit_train_batchez is not a config key; valid keys of trainer: _target_, accelerator,"),
        pytest.param(["model.net.dropout=0.1"], "valid keys of model.net: ape, drop_path_rate, img_size, name",
                     marks=pytest.mark.slow),
        pytest.param(["-m", "rpe=none,irpe_k", "model.optimizer.lrr=1e-3,1e-4"],
                     "model.optimizer.lrr is not a config key; valid keys of model.optimizer: betas, eps, lr, "
                     "lr_base_batch", marks=pytest.mark.slow),
        (["model.net=["], "error: override 'model.net=[' is not valid override syntax"),
        pytest.param(["rpe=_base"], f"error: rpe='_base' is not a config option; valid: {', '.join(sorted(PRESETS))}",
                     marks=pytest.mark.slow),
        (["seed=1", "seed=2"], "error: seed is given twice (seed=1, seed=2); Hydra would keep only the last"),
    ],
    ids=["trainer", "nested", "multirun", "syntax", "internal_base", "twice"],
)  # a train.py process each: three in `make test`, the rest in `make slow`
def test_bad_overrides_are_one_line(args: list[str], expected: str, tmp_path: Path) -> None:
    result = run_cli("train.py", [*args, f"paths.log_dir={tmp_path}"], env_extra=ENV)
    assert result.returncode == 2
    line = _one_error_line(result.stderr)
    assert expected in line and not re.search(r"(?<![\w'])_base\b", line), line  # never offered as a choice
    assert not any(tmp_path.iterdir())  # nothing was started


def test_a_key_of_a_group_no_option_is_chosen_for_names_the_group() -> None:
    """Probe 25, T71: ``eval.py ... testset.data.generator.num_val=16`` without ``testset=`` said "testset is not a
    config key", and its list of valid keys left out the testset group."""
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_overrides(["ckpt_path=x.ckpt", "testset.data.generator.num_val=16"], "eval", make=False)
    assert str(err.value).startswith("testset.data.generator.num_val=16 sets a key of the testset config group, but no"
                                     " testset option is chosen; valid: testset=<one of: relational_canvas48,")


@pytest.mark.slow  # an eval.py process; the same key check runs through train.py above
def test_eval_unknown_key_is_one_line() -> None:
    result = run_cli("eval.py", ["ckpt_path=x.ckpt", "batch=3"], env_extra=ENV)
    assert result.returncode == 2
    line = _one_error_line(result.stderr)
    assert "batch is not a config key; valid keys of the root config: ape, batch_size," in line


def test_group_choices_hide_internal_bases() -> None:
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_group_choices(["rpe=nope"])
    assert "_base" not in str(err.value) and "irpe_k" in str(err.value)
    with pytest.raises(cli.CommandLineError):
        cli.check_group_choices(["experiment=_deit_imagenet"])
    cli.check_group_choices(["rpe=irpe_k,none", "experiment=deit_tiny_baseline"])  # real options pass


def test_hydra_groups_take_the_options_hydra_and_its_plugins_bring() -> None:
    """``hydra/launcher=basic`` is Hydra's own option (no file under configs/): it passes, as does a plugin's
    (``submitit_local``, ``optuna``); an unknown one is refused naming them all, ours (``slurm``) too."""
    cli.check_group_choices(["hydra/launcher=basic", "hydra/sweeper=optuna", "hydra/job_logging=disabled"], "train")
    cli.check_group_choices(["hydra/launcher=submitit_local,slurm"], "train")
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_group_choices(["hydra/launcher=bogus"], "train")
    assert str(err.value) == ("hydra/launcher='bogus' is not a config option; valid: basic, slurm, submitit_local,"
                              " submitit_slurm")
    with pytest.raises(cli.CommandLineError, match="valid: default, disabled, none, stdout"):
        cli.check_group_choices(["hydra/job_logging=bogus"], "train")


@pytest.mark.slow  # a train.py process that builds DETR and the data first
def test_detr_on_classification_data_is_one_line(tmp_path: Path, data_dir: Path) -> None:
    result = run_cli("train.py", [
        "model=detr_small", *SMALL_RELATIONAL, "debug=fast", f"paths.data_dir={data_dir}",
        f"paths.log_dir={tmp_path}", "run_name=mismatch",
    ], env_extra=ENV)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "DETR model (DetectionModule) needs COCO-format detection data" in errors[0]
    assert "ImageFolderDataModule" in errors[0] and "data=shapes_coco" in errors[0]


@pytest.mark.parametrize(
    ("name", "img_size", "expected"),
    [
        ("deit_micro_patch4_32", 30, "img_size=30 is not divisible by patch_size=4: the patch embedding would drop"
                                     " the last 2 pixel rows/columns; valid: a multiple of 4, e.g. 28 or 32"),
        ("deit_tiny_patch16_224", 200, "img_size=200 is not divisible by patch_size=16"),
        ("swin_micro_patch4_window4_32", 30, "img_size=30 is not divisible by patch_size=4"),
        # a Swin size its windows do not tile is padded as timm does: tests/test_testsets.py
    ],
)
def test_image_size_must_fit_the_patch_and_window_grid(name: str, img_size: int, expected: str) -> None:
    with pytest.raises(ModelConfigError) as err:
        create_model(name, img_size=img_size, num_classes=3)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_swin_grid_rule_against_hand_worked_sizes() -> None:
    """Swin-T (patch 4, window 7, 4 stages): grids 56-28-14-7 fit; micro (patch 4, window 4, 2 stages)."""
    assert swin_grid_problem(224, 4, 7, 4) is None
    assert swin_grid_problem(448, 4, 7, 4) is None  # 112-56-28-14, all tiled by 7
    assert swin_grid_problem(32, 4, 4, 2) is None and swin_grid_problem(64, 4, 4, 2) is None
    assert swin_grid_problem(16, 4, 4, 2) is None  # 4 tokens: one window; 2 tokens: smaller than the window
    assert "odd 3-token side" in swin_grid_problem(12, 4, 4, 2)  # 3 tokens fit one window but cannot merge
    assert "stage 1 has a 6-token side" in swin_grid_problem(48, 4, 4, 2)  # 12 tokens tile, then 6 do not


@pytest.mark.parametrize(("args", "expected"), [
    (["~rpe.ratio"], "~rpe.ratio cannot delete rpe.ratio: it is null (or absent) already, which is its default;"
                     " leave it out, or set rpe.ratio=<value>"),
    (["model.mixup.alpha=-0.2"], "model.mixup.alpha is not a config key; model.mixup is null (no mixup); valid keys"
                                 " of model.mixup (timm.data.Mixup's arguments): correct_lam, cutmix_alpha,"),
    (["run_name=ünï"], "must be quoted, e.g. 'run_name=\"my run\"'"),
    # probe 74: OmegaConf's KeyError text named neither the key nor the fix
    (["data.root=${oc.env:NOPE_P39_UNSET}"], "data.root=${oc.env:NOPE_P39_UNSET} reads environment variable"
                                            " NOPE_P39_UNSET, which is not set; valid: set it (export"
                                            " NOPE_P39_UNSET=...), give a default"),
    # OmegaConf's "Interpolation key 'nokey' not found" named neither the setting nor the fix
    (["run_name=${nokey}"], "run_name=${nokey} reads ${nokey}, which is not a key of the config; valid: a key"),
    # probe 18, q57: a resolver's error named data.generator.img_size (which reads the value), not the override;
    # the check resolves each override's own key first (s58), so the override is named at its own key
    (["data.img_size=${oc.decode:48}"], "data.img_size=${oc.decode:48} cannot be"
                                        " resolved: resolver oc.decode got '48': `oc.decode` can only take strings"
                                        " or None as input, but `48` is of type int; valid: data.img_size=48, or"
                                        " ${oc.decode:'48'}"),
    (["data.img_size=${oc.select:}"], "data.img_size=${oc.select:} cannot be"
                                      " resolved: resolver oc.select got '': select() missing 1 required positional"
                                      " argument: 'key'; valid: data.img_size=<value>, or ${oc.select:<key>,"),
    (["run_name=${job_dirname:1,2}"], "run_name=${job_dirname:1,2} cannot be resolved: resolver job_dirname got"
                                      " '1,2': job_dirname() takes 1 positional argument but 2 were given; valid:"
                                      " run_name=<value>, or ${job_dirname:${hydra:job.override_dirname}}"),
    (["data.img_size=${oc.nope:48}"], "data.img_size=${oc.nope:48} calls"
                                      " resolver oc.nope, which does not exist; valid: one of hydra, job_dirname,"),
    # probe 18, s58: a resolver's argument that is no value of the grammar named no key ("a config value") and
    # asked to quote a value already quoted; seed= was not resolved by the check at all (the job failed later)
    (['run_name=${oc.decode:"[1,"}'], "run_name=${oc.decode:\"[1,\"} cannot be resolved: resolver oc.decode got"
                                      " '\"[1,\"', which it parses as a value, and that text is none: missing"
                                      " BRACKET_CLOSE at '<EOF>'; valid: run_name=<value>, or ${oc.decode:'<value>'}"
                                      " whose text is a whole value, its brackets, braces and quotes closed"),
    (['seed=${oc.decode:"[1,"}'], "seed=${oc.decode:\"[1,\"} cannot be resolved: resolver oc.decode got '\"[1,\"',"
                                  " which it parses as a value, and that text is none: missing BRACKET_CLOSE at"),
    # probe 18, s61: Hydra's resolver gives null for a key its node lacks: a typo trained with the preset's default
    (["rpe.ratio=${hydra:nope.deeper}"], "rpe.ratio=${hydra:nope.deeper} reads ${hydra:nope.deeper}, and nope.deeper"
                                         " is not a key of Hydra's config (its hydra: resolver would give null for"
                                         " it, silently); valid: a key of Hydra's config, e.g."
                                         " hydra:runtime.output_dir, hydra:job.name,"),
], ids=["delete_null", "mixup_null", "unquoted", "missing_env", "missing_key", "resolver_type", "resolver_args",
        "project_resolver", "unknown_resolver", "resolver_grammar", "resolver_grammar_unread", "hydra_missing_key"])
def test_override_mistakes_say_what_to_do(args: list[str], expected: str, tmp_path: Path) -> None:
    """In-process, the check train.py's command line makes before Hydra (one line naming the fix)."""
    from lifecycle.cli import check_overrides
    from lifecycle.console import CommandLineError

    with pytest.raises(CommandLineError) as err:
        check_overrides([*args, f"paths.log_dir={tmp_path}"], "train")
    assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_resolver_error_or_missing_hydra_key_is_named_in_each_composing_command(tmp_path: Path) -> None:
    """Probe 18, s58/s61: eval.py read its overrides list, which resolved each override's text, so a resolver's
    error was "a config value cannot be resolved" (no key), and ``${hydra:<no key>}`` was null silently. eval.py's
    check and the scripts' ``--set`` (`compose_checked`) name the override as train.py's does; Hydra's keys whose
    value is null or unset until a job runs (``job.num``) are keys, never refused."""
    from lifecycle.cli import check_overrides, compose_checked
    from lifecycle.console import CommandLineError

    ckpt = f"ckpt_path={tmp_path / 'run' / 'checkpoints' / 'best.ckpt'}"
    with pytest.raises(CommandLineError) as err:
        check_overrides([ckpt, 'batch_size=${oc.decode:"[1,"}'], "eval", make=False)
    assert str(err.value).startswith("batch_size=${oc.decode:\"[1,\"} cannot be resolved: resolver oc.decode got")
    with pytest.raises(CommandLineError) as err:
        check_overrides([ckpt, "batch_size=${hydra:nope.deeper}"], "eval", make=False)
    assert str(err.value).startswith("batch_size=${hydra:nope.deeper} reads ${hydra:nope.deeper}, and nope.deeper is"
                                     " not a key of Hydra's config")
    with pytest.raises(CommandLineError) as err:  # generate_testsets / evaluate_testsets --set
        compose_checked("eval", ["testset=relational_right", f"paths.data_dir={tmp_path}/${{hydra:job.nope}}"],
                        devices=False)
    assert str(err.value).startswith(f"paths.data_dir={tmp_path}/${{hydra:job.nope}} reads ${{hydra:job.nope}}")
    for read in ("job.num", "job.name", "runtime.choices.model"):  # keys of Hydra's config: accepted
        check_overrides([f"run_name=x${{hydra:{read}}}", f"paths.log_dir={tmp_path}"], "train", make=False)


def test_an_encoding_choice_the_sweeps_row_replaces_is_refused(tmp_path: Path) -> None:
    """Probe 21, y42: ``-m sweep=shift_mini row=none rpe=shaw`` trained row none's encoding (the sweep sets
    rpe.preset from its row) in a job dir named after rpe=shaw, without a word."""
    from lifecycle.cli import check_overrides
    from lifecycle.console import CommandLineError

    base = [f"paths.log_dir={tmp_path}", f"paths.data_dir={tmp_path / 'data'}", "-m", "sweep=shift_mini", "seed=0"]
    with pytest.raises(CommandLineError) as err:
        check_overrides([*base, "row=none", "rpe=shaw"], "train", make=False)
    assert str(err.value) == ("rpe=shaw is replaced by the config, whose rpe.preset=${rows.${row}.rpe} from row=none"
                              " trains none; the run would train none under a name that says shaw; valid: pick the"
                              " encoding as the config does (row=<a row of the sweep>), or rpe.preset=shaw")
    with pytest.raises(CommandLineError) as err:  # probe 22, k11: a later row of the sweep replaces it
        check_overrides([*base, "row=shaw,none", "rpe=shaw"], "train", make=False)
    assert str(err.value).startswith("the sweep's job with row=none: rpe=shaw is replaced by the config, whose"
                                     " rpe.preset=${rows.${row}.rpe} from row=none trains none;"), str(err.value)
    with pytest.raises(CommandLineError) as err:  # probe 22, k10: a sweep config whose params sweep rpe.preset
        check_overrides([f"paths.log_dir={tmp_path}", f"paths.data_dir={tmp_path / 'data'}", "-m", "sweep=where_mini",
                         "seed=0", "rpe=shaw"], "train", make=False)
    assert str(err.value).startswith("the sweep's job with rpe.preset=none: rpe=shaw is replaced by the config, whose"
                                     " rpe.preset=none trains none;"), str(err.value)
    check_overrides([*base, "row=none", "rpe=shaw", "rpe.preset=shaw"], "train", make=False)  # the user's own
    check_overrides([*base, "row=shaw", "rpe=shaw"], "train", make=False)  # the row trains it
    check_overrides(["rpe=shaw", f"paths.log_dir={tmp_path}"], "train", make=False)


def test_a_search_path_is_named_before_the_options_it_would_bring(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 21, y5: ``hydra.searchpath=[file://cfg] experiment=yexp`` (yexp in that folder) was refused as
    ``experiment='yexp' is not a config option``, never naming the search path the user gave."""
    (tmp_path / "cfg" / "experiment").mkdir(parents=True)
    (tmp_path / "cfg" / "experiment" / "yexp.yaml").write_text("# @package _global_\nseed: 3\n")
    given = f"hydra.searchpath=[file://{tmp_path / 'cfg'}]"
    line = _refused_by_the_command_line([given, "experiment=yexp", f"paths.log_dir={tmp_path / 'runs'}"], capsys,
                                        monkeypatch)
    assert line == (f"error: {given} is not supported: a run is composed from the project's configs/ and the command"
                    " line only; valid: a recipe of your own in configs/experiment/")
    assert not (tmp_path / "runs").exists()


def test_a_refusal_of_merged_recipes_names_them(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 21, y11: ``experiment=[quickstart,swin_micro_relational]`` was refused naming only
    ``model.net.class_token``, a key the user never typed (quickstart sets it for a DeiT, the second recipe picks a
    Swin): the line now names the merged recipes too. One recipe alone is named as before."""
    given = "experiment=[quickstart,swin_micro_relational]"
    line = _refused_by_the_command_line([given, f"paths.log_dir={tmp_path}"], capsys, monkeypatch)
    assert line.startswith("error: model.net.class_token is not an option of backbone swin_micro"), line
    assert line.endswith(f" (the config merges the recipes of {given}, in that order, each later one's keys winning:"
                         " check that they fit together, or give one, e.g. experiment=swin_micro_relational)"), line
    line = _refused_by_the_command_line(["experiment=quickstart", "seed=-1", f"paths.log_dir={tmp_path}"], capsys,
                                        monkeypatch)
    assert "merges the recipes" not in line and line.startswith("error: seed=-1 "), line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("given", ["hydra/sweeper=optuna_rpe", "hydra/launcher=submitit_local",
                                   "hydra.sweeper.max_batch_size=2", "hydra.sweep.dir=elsewhere"])
def test_a_multiruns_setting_without_a_multirun_is_refused(given: str, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 21, y43: ``hydra/sweeper=optuna_rpe`` without -m trained one run and never swept, without a word
    (a swept value without -m was already refused); a launcher, or a sweep dir, is ignored the same way."""
    part = re.split(r"[/.=]", given)[1]
    line = _refused_by_the_command_line([given, "debug=fast", f"paths.log_dir={tmp_path}"], capsys, monkeypatch)
    assert line == (f"error: {given} sets the {part} of a multirun, and without one a single run starts, which never"
                    " reads it; valid: add -m (train.py -m ...), or leave it out")
    assert list(tmp_path.iterdir()) == []
    if given.startswith("hydra/sweeper"):  # with -m it is a sweep
        cli.check_overrides(["-m", given, "debug=fast", f"hydra.sweep.dir={tmp_path / 'sw'}"], "train", make=False)


def test_a_run_never_trains_on_a_test_sets_data(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 21, y21: ``data.root=<data_dir>/testsets/relational_left_v2`` was refused as data "generated with
    different settings" with the advice to delete the folder: a shared test set's data. The folder is named as
    the test sets' own, by the config's ``<paths.data_dir>/testsets`` and by generate_testsets' marker (another
    data dir's)."""
    from storage.destinations import TESTSETS_MARKER

    data_dir = tmp_path / "data"
    given = "${paths.data_dir}/testsets/relational_left_v2"
    line = _refused_by_the_command_line([f"paths.data_dir={data_dir}", f"data.root={given}",
                                         f"paths.log_dir={tmp_path / 'runs'}"], capsys, monkeypatch)
    assert line == (f"error: data.root={str(data_dir / 'testsets' / 'relational_left_v2')!r} lies in the folder"
                    f" {data_dir / 'testsets'} of the test sets' own data: a run trained on a test set's images could"
                    " not be judged on them, and the folder is shared by every run evaluated there (only"
                    " scripts/generate_testsets.py writes it); valid: a data.root outside it (leave data.root out for"
                    " the data config's own root)")
    marked = tmp_path / "other" / "testsets"
    marked.mkdir(parents=True)
    (marked / TESTSETS_MARKER).write_text("{}")
    line = _refused_by_the_command_line([f"paths.data_dir={data_dir}", f"data.root={marked / 'relational_left_v2'}",
                                         f"paths.log_dir={tmp_path / 'runs'}"], capsys, monkeypatch)
    assert line.startswith(f"error: data.root={str(marked / 'relational_left_v2')!r} lies in the folder {marked} of"
                           " the test sets' own data"), line
    assert not (tmp_path / "runs").exists() and not data_dir.exists()


def test_a_run_dir_that_is_a_link_is_refused(tmp_path: Path) -> None:
    """Probe 21, z14: ``<log_dir>/z14 -> <a copy of run d2>`` was followed without a word: the run resumed d2's
    checkpoint and rewrote d2's config with run_name z14. A linked log dir (runs/ on another disk) still works."""
    other = tmp_path / "zd2"
    other.mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "z14").symlink_to(other)
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_run_location("z14", tmp_path / "runs")
    assert str(err.value) == (f"run_name='z14': {tmp_path / 'runs' / 'z14'} is a symlink (to {other}), not a run dir"
                              " of its own, and the run would write its files through it into the folder it leads"
                              " to; valid: another run_name=, or replace the link with the folder it stands for")
    (tmp_path / "linked_runs").symlink_to(tmp_path / "runs")
    cli.check_run_location("new", tmp_path / "linked_runs")
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["z14"] and list(other.iterdir()) == []


def test_a_data_choice_whose_root_the_recipe_replaces_is_refused(tmp_path: Path) -> None:
    """Probe 22, k13: ``-m sweep=canvas_mini data=relational_left`` generated the left-half images into the canvas
    task's folder (the sweep sets data.root), without a word. The user's own data.root, or data= beside a recipe
    that leaves the root to the data option, is accepted."""
    from lifecycle.cli import check_overrides
    from lifecycle.console import CommandLineError

    base = [f"paths.log_dir={tmp_path}", f"paths.data_dir={tmp_path / 'data'}", "-m", "sweep=canvas_mini", "row=none",
            "seed=0"]
    with pytest.raises(CommandLineError) as err:
        check_overrides([*base, "data=relational_left"], "train", make=False)
    assert str(err.value) == ("data=relational_left is replaced in part by the config, whose"
                              " data.root=${paths.data_dir}/relational_distance_mini is not relational_left's own root"
                              " (${paths.data_dir}/relational_left_v1): relational_left's images would be generated"
                              " into, or read from, the folder of the recipe's own dataset; valid: leave data= out (the"
                              " recipe picks its data), or give data.root= too")
    with pytest.raises(CommandLineError, match="^the sweep's job with data=relational_left: data=relational_left is"):
        check_overrides([*base, "data=relational_distance,relational_left"], "train", make=False)
    with pytest.raises(CommandLineError, match="^data=relational_left replaces the data option sweep=canvas_mini is"
                                               r" made for \(data=relational_distance\)"):  # its own root: still the
        check_overrides([*base, "data=relational_left", f"data.root={tmp_path / 'left'}"], "train", make=False)
    with pytest.raises(CommandLineError, match="^the sweep's job with experiment=quickstart: experiment=quickstart"
                                               " replaces"):  # a swept recipe
        check_overrides([*base, "experiment=benchmark_mini,quickstart"], "train", make=False)
    check_overrides([f"paths.log_dir={tmp_path}", "data=relational_left", f"data.root={tmp_path / 'left'}"], "train",
                    make=False)  # no recipe: the user's own root
    check_overrides([*base, "data=relational_distance"], "train", make=False)  # the sweep's own, given again
    with pytest.raises(CommandLineError) as err:  # the recipe a sweep is made for, replaced
        check_overrides([*base, "experiment=quickstart"], "train", make=False)
    assert str(err.value) == ("experiment=quickstart replaces the experiment option sweep=canvas_mini is made for"
                              " (experiment=benchmark_mini): its rows are trained and tabled as that recipe's, and the"
                              " jobs would be counted as them; valid: leave experiment= out, or a sweep config of your"
                              " own in configs/sweep/")
    check_overrides([*base, "experiment=benchmark_mini", "trainer=cpu"], "train", make=False)
    for given in ("experiment=[quickstart]", "model=deit_tiny"):  # probe 23, p12, p18
        with pytest.raises(CommandLineError, match=f"^{re.escape(given)} replaces the "):
            check_overrides([*base, given], "train", make=False)
    with pytest.raises(CommandLineError, match=r"^experiment=\[benchmark_mini,quickstart\] adds quickstart to the"
                                               " experiment option sweep=canvas_mini is made for"):  # probe 23, p12
        check_overrides([*base, "experiment=[benchmark_mini,quickstart]"], "train", make=False)
    check_overrides([*base, "experiment=[benchmark_mini]"], "train", make=False)  # probe 24, S74: a list of one
    with pytest.raises(CommandLineError) as err:  # probe 25, T16
        check_overrides([*base, "experiment=[benchmark_mini,benchmark_mini]"], "train", make=False)
    assert str(err.value) == ("experiment=[benchmark_mini,benchmark_mini] names benchmark_mini twice; valid:"
                              " experiment=benchmark_mini (the option sweep=canvas_mini is made for), or leave"
                              " experiment= out")
    check_overrides([f"paths.log_dir={tmp_path}", "experiment=benchmark_mini", "data=relational_left"], "train",
                    make=False)
    assert not (tmp_path / "data").exists()


def test_a_refusal_of_a_key_a_recipe_sets_names_the_recipe(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 22, k86: ``-m sweep=shift_mini model=swin_micro`` was refused as ``model.net.class_token is not an option
    of backbone swin_micro...``, a key the user never typed: the line names the recipe that sets it (and a sweep made
    for another model is now refused as such first)."""
    line = _refused_by_the_command_line(["experiment=quickstart", "model=swin_micro", f"paths.log_dir={tmp_path}",
                                         f"paths.data_dir={tmp_path / 'data'}"], capsys, monkeypatch)
    assert line.startswith("error: model.net.class_token is not an option of backbone swin_micro"), line
    assert line.endswith(" (model.net.class_token is set by experiment=quickstart, in"
                         " configs/experiment/quickstart.yaml: the recipe's settings are made for its own choices,"
                         " which one given beside it may not fit)"), line
    line = _refused_by_the_command_line(["-m", "sweep=shift_mini", "model=swin_micro", "row=none", "seed=0",
                                         f"paths.log_dir={tmp_path}", f"paths.data_dir={tmp_path / 'data'}"], capsys,
                                        monkeypatch)  # a sweep made for another model: refused as such first
    assert line.startswith("error: model=swin_micro replaces the model option sweep=shift_mini is made for"
                           " (model=deit_micro)"), line
    assert list(tmp_path.iterdir()) == []


def test_detrs_reference_flag_is_given_as_the_preset(tmp_path: Path) -> None:
    """Probe 22, k50: ``model.enc_rpe2d=rpe-2.0-product-ctx-1-k rpe=shaw`` trained product K (the flag wins in
    DetectionModule) in a run recorded and tabled as shaw. train.py takes the flag as rpe.preset."""
    from lifecycle.cli import check_overrides
    from lifecycle.console import CommandLineError

    base = ["experiment=detr_shapes", f"paths.log_dir={tmp_path}", f"paths.data_dir={tmp_path / 'data'}"]
    with pytest.raises(CommandLineError) as err:
        check_overrides([*base, "model.enc_rpe2d=rpe-2.0-product-ctx-1-k", "rpe=shaw"], "train", make=False)
    assert str(err.value) == ("model.enc_rpe2d=rpe-2.0-product-ctx-1-k would replace the encoder's encoding of the rpe"
                              " group (rpe.preset=shaw), while the run is recorded, named and tabled by rpe.preset;"
                              " valid: rpe.preset=rpe-2.0-product-ctx-1-k (the same flag, one setting), and leave"
                              " model.enc_rpe2d out")
    check_overrides([*base, "rpe.preset=rpe-2.0-product-ctx-1-k"], "train", make=False)


def test_a_missing_hydra_key_written_in_a_config_file_is_named() -> None:
    """Probe 18's leftover: ``${hydra:<no key>}`` in a config file (a user's experiment), not an override, gave
    null silently; Hydra's keys (``job.num``: null until a sweep job runs) and Hydra's own node are not refused."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lifecycle.cli import _refuse_missing_hydra_reads
    from lifecycle.console import CommandLineError
    from lifecycle.project import CONFIG_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", return_hydra_config=True)
    _refuse_missing_hydra_reads(cfg)  # the shipped configs read keys Hydra has
    cfg.name = "x${hydra:job.num}"
    cfg.hydra.job.name = "${hydra:nope}"  # Hydra's own node: Hydra's to resolve
    _refuse_missing_hydra_reads(cfg)
    cfg.trainer.devices = ["${hydra:job.nmae}"]
    with pytest.raises(CommandLineError) as err:
        _refuse_missing_hydra_reads(cfg)
    assert str(err.value).startswith("trainer.devices='[\"${hydra:job.nmae}\"]' (as the configs compose it) reads"
                                     " ${hydra:job.nmae}, and job.nmae is not a key of Hydra's config (its hydra:"
                                     " resolver would give null for it, silently); valid: a key of Hydra's config,"
                                     " e.g. hydra:runtime.output_dir,"), str(err.value)


@pytest.mark.parametrize("value", ["null", "''", "' '"], ids=["null", "empty", "blank"])
def test_a_data_root_that_names_no_folder_is_one_line(value: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 18, s64/s67: ``data.root=null`` generated the data into a folder ``None`` of the current dir, and
    ``data.root=''`` into the current dir itself; the data modules and the test sets refuse it too."""
    from data.datamodule import ImageFolderDataModule
    from data.errors import DataConfigError
    from lifecycle.cli import check_overrides
    from lifecycle.console import CommandLineError
    from lifecycle.testsets import TestsetError, testset_data_config

    monkeypatch.chdir(tmp_path)
    with pytest.raises(CommandLineError) as err:
        check_overrides([f"data.root={value}", f"paths.log_dir={tmp_path}/runs", f"paths.data_dir={tmp_path}/d"],
                        "train")
    assert " names no folder; valid: the dataset's folder" in str(err.value), str(err.value)
    assert not any(tmp_path.iterdir())
    root = None if value == "null" else value.strip("'")
    with pytest.raises(DataConfigError, match="data.root=.* names no folder"):
        ImageFolderDataModule(root=root)  # type: ignore[arg-type]
    testset = {"name": "t", "fits": ["relational"], "data": {"root": root, "generator": {"num_val": 8}}}
    with pytest.raises(TestsetError, match=r"^testset.data.root=.* names no folder"):
        testset_data_config({"_target_": "data.ImageFolderDataModule", "generator": {"_target_":
                             "data.relational.generate_relational_shapes"}}, testset, None)


def test_an_unknown_key_never_suggests_a_plus_that_is_refused_too(tmp_path: Path) -> None:
    """Probe 57: ``foo=1`` suggested ``+foo=...``, which the root-key check then refused: the valid keys only."""
    from lifecycle.cli import check_overrides
    from lifecycle.console import CommandLineError
    from lifecycle.settings import SettingError

    with pytest.raises(CommandLineError) as err:
        check_overrides(["foo=1", f"paths.log_dir={tmp_path}"], "train")
    assert str(err.value).startswith("foo is not a config key; valid keys of the root config: ablation, callbacks,")
    assert "+" not in str(err.value)
    with pytest.raises(SettingError, match="foo is not a setting: nothing reads a root key"):
        check_overrides(["+foo=1", f"paths.log_dir={tmp_path}"], "train")  # why the hint was wrong
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("key", ["data.root", "paths.data_dir"])
def test_a_folder_key_holding_a_literal_interpolation_is_refused_before_the_run_dir(key: str, tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """Probe 8, A29/A29b: ``data.root=<x>/h29_\\${oc.env:H29}`` passed the checks on the literal folder, while the
    job resolved the interpolation and read ``h29_<H29>`` (another folder), and config.yaml recorded the template,
    which eval.py refuses. The resolved value of every folder key is refused when it holds ``${``."""
    from lifecycle.cli import check_overrides
    from lifecycle.settings import SettingError

    literal = tmp_path / "h29_${oc.env:H29}"
    (literal / "relational_tiny").mkdir(parents=True)  # the folder the checks would have looked at exists
    monkeypatch.setenv("H29", "c")
    escaped = str(tmp_path / "h29_\\${oc.env:H29}")
    logs = tmp_path / "logs"
    with pytest.raises(SettingError) as err:
        check_overrides([f"{key}={escaped}", f"paths.log_dir={logs}", "run_name=r"], "train")
    shown = str(literal)
    assert str(err.value) == (f"{key}={shown!r} holds '${{', which every reading of the run's config (the job's, its"
                              " saved config.yaml) resolves as an interpolation: the run would read another folder"
                              " than the one checked; valid: a folder path without '${'")
    assert not logs.exists()


def test_a_data_root_generated_with_other_settings_is_refused_before_the_run_dir(tmp_path: Path) -> None:
    """Probes 26/34: ``data.img_size=64`` on a root generated at 32 px was refused only after a failed run dir
    was made; the command line's check reads the root's marker, so no run dir is made for the mismatch."""
    from data.generation import MARKER_NAME, describe_generator, resolve_generator
    from data.relational import class_names
    from lifecycle.cli import check_overrides
    from lifecycle.console import CommandLineError

    root = tmp_path / "data"
    root.mkdir()
    spec = {"_target_": "data.relational.generate_relational_shapes", "num_train": 8000, "num_val": 2000,
            "img_size": 32, "patch_size": 4, "seed": 0, "min_object_size": 5, "max_object_size": 7,
            "boundary_margin_deg": 5.0, "noise_max": 32}  # configs/data/relational.yaml's generator at 32 px
    (root / MARKER_NAME).write_text(json.dumps({"generator": describe_generator(resolve_generator(spec))}))
    # split and class folders holding a batch: checked before the run dir
    for (split, images), name in itertools.product((("train", 8), ("val", 1)), class_names()):
        (root / split / name).mkdir(parents=True)
        for i in range(images):
            (root / split / name / f"{i}.png").touch()
    logs = tmp_path / "logs"
    args = [f"data.root={root}", f"paths.log_dir={logs}", "run_name=mismatch"]
    check_overrides(args, "train")  # the same settings pass (the run dir is made: the check prepares it)
    (logs / "mismatch").rmdir()
    with pytest.raises(CommandLineError) as err:
        check_overrides([*args, "data.img_size=64", "model.net.img_size=64"], "train")
    assert str(err.value) == (f"data.root={root} was generated with different settings (img_size: 32 on disk vs 64"
                              " configured); delete the folder or point data.root elsewhere to regenerate")
    assert not (logs / "mismatch").exists()


@pytest.mark.parametrize(("args", "expected"), [
    (["data=relational_left", "data.generator.region=[0,0,32,40]"],
     "data.generator.region=[0, 0, 32, 40] must satisfy 0 <= top < bottom <= 32 and 0 <= left < right <= 32"),
    (["data=relational_left", "data.generator.region=[10,10,5,5]"],
     "data.generator.region=[10, 10, 5, 5] must satisfy 0 <= top"),
    (["data=relational_distance", "data.generator.distance_edges=[3.5,1.5]"],
     "data.generator.distance_edges=[3.5, 1.5] must be at least 3 increasing finite numbers"),
    (["data.generator.max_object_size=12"], "need 1 <= min_object_size <= max_object_size <= img_size // 3 = 10"),
], ids=["region_off_canvas", "region_inverted", "edges_decreasing", "objects_too_large"])
def test_generator_settings_are_refused_before_the_run_dir(args: list[str], expected: str, tmp_path: Path) -> None:
    """Probes 227/228/230: settings the generator refuses were refused only when the data were made, after
    the run dir was claimed; the command line runs the generator's settings check first (the data root is
    new, so no marker could have caught them)."""
    from lifecycle.cli import check_overrides
    from lifecycle.console import CommandLineError

    logs = tmp_path / "logs"
    with pytest.raises(CommandLineError) as err:
        check_overrides([*args, f"paths.data_dir={tmp_path / 'data'}", f"paths.log_dir={logs}", "run_name=r"],
                        "train")
    assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert not logs.exists() and not (tmp_path / "data").exists()


def test_a_registered_settings_check_gets_the_generators_defaults() -> None:
    """The check is called with every argument of the generator but root, its defaults filled in (one home)."""
    import functools

    from data.errors import DataConfigError
    from data.generation import check_generator_settings
    from data.relational import generate_relational_shapes

    check_generator_settings(functools.partial(generate_relational_shapes))  # the defaults pass
    with pytest.raises(DataConfigError, match="data.generator.num_val=3 must be an integer >= 8"):
        check_generator_settings(functools.partial(generate_relational_shapes, num_val=3))


def test_the_multirun_flag_may_come_anywhere() -> None:
    from lifecycle.cli import multirun_flag_first

    assert multirun_flag_first(["a=1", "-m", "seed=0,1"]) == ["-m", "a=1", "seed=0,1"]
    assert multirun_flag_first(["a=1", "--multirun"]) == ["--multirun", "a=1"]
    assert multirun_flag_first(["a=1", "b=2"]) == ["a=1", "b=2"]


@pytest.mark.parametrize("sweep", ["rpe=irpe_k,irpe_qk", "seed=range(0,2)"])
def test_a_sweep_without_multirun_is_one_line(sweep: str, tmp_path: Path) -> None:
    from lifecycle.cli import check_overrides
    from lifecycle.console import CommandLineError

    with pytest.raises(CommandLineError) as err:
        check_overrides([sweep, f"paths.log_dir={tmp_path}"], "train")
    assert str(err.value) == f"{sweep} sweeps over values, which needs a multirun: add -m (train.py -m ...), or" \
                             " give one value"
    check_overrides(["-m", sweep, f"paths.log_dir={tmp_path}"], "train")  # with -m: a sweep
    check_overrides(["sweep=where_mini", "seed=0,1", f"paths.log_dir={tmp_path}"], "train")  # a sweep config


def test_an_option_hydra_does_not_have_is_one_line() -> None:
    from lifecycle.cli import check_flags
    from lifecycle.console import CommandLineError

    check_flags(["-m", "--hydra-help"])
    with pytest.raises(CommandLineError) as err:
        check_flags(["a=1", "--foo"])
    assert str(err.value).startswith("--foo is not an option; valid: -m/--multirun, --cfg job|hydra|all,")


@pytest.mark.parametrize("flags", [["-cd", "runs/x/.hydra"], ["--config-dir=runs/x"], ["-cp", "/r"],
                                   ["--config-path", "/r", "--config-name", "config"], ["-cn", "config"],
                                   ["--experimental-rerun", "runs/x/.hydra/config.pickle"]])
def test_a_config_from_another_folder_or_a_pickle_is_refused(flags: list[str], monkeypatch) -> None:
    """A run is composed from configs/ and the command line only: a run folder's config (or a pickle of one)
    would get around every check and could name code to run."""
    from lifecycle.cli import check_flags
    from lifecycle.console import CommandLineError
    from lifecycle.project import DDP_WORKER_CONFIG

    monkeypatch.setenv(DDP_WORKER_CONFIG, "/elsewhere")  # a parent's worker folder, which these flags do not name
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(CommandLineError) as err:
        check_flags([*flags, "seed=1"])
    assert str(err.value).startswith(f"{flags[0].split('=')[0]} is not supported: a run is composed from the")


def test_a_ddp_worker_takes_the_config_folder_its_parent_named(monkeypatch) -> None:
    import tempfile

    from lifecycle.cli import check_flags, check_overrides, is_ddp_worker
    from lifecycle.project import DDP_WORKER_CONFIG

    private = tempfile.mkdtemp(prefix=f"rpe-ddp-config-{os.getpid()}-")  # as the parent makes it
    worker = ["--config-path", private, "--config-name", "config", "hydra.run.dir=/r"]
    assert not is_ddp_worker(worker)  # nobody named that folder
    monkeypatch.setenv(DDP_WORKER_CONFIG, private)
    assert not is_ddp_worker(worker)  # the parent itself (rank 0) is no worker
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert is_ddp_worker(worker)
    # probe 12, g99: the variable set by hand to a run folder (a worker's command line copied from ps) is no worker
    run_folder = tempfile.mkdtemp(prefix="run-")
    monkeypatch.setenv(DDP_WORKER_CONFIG, run_folder)
    assert not is_ddp_worker(["--config-path", run_folder, "--config-name", "config"])
    monkeypatch.setenv(DDP_WORKER_CONFIG, private)
    check_flags(worker)
    check_overrides(worker, "train")  # the parent checked this config: no second composition from configs/
    # the whole command line's checks, with the job name the parent gives each worker (probe 10, C14b: a check of
    # keys Hydra fills in itself refused it, and every run of several processes failed)
    from lifecycle.cli import check_command

    check_command([*worker, "hydra.job.name=ddp_rank1"], "train", make=False)
    shutil.rmtree(private)
    shutil.rmtree(run_folder)


def test_run_mode_flag_does_not_skip_the_checks(tmp_path: Path) -> None:
    """``-r`` runs the task like a plain command: its settings are checked all the same."""
    from lifecycle.cli import check_overrides
    from lifecycle.console import CommandLineError

    with pytest.raises(CommandLineError, match="run_name"):
        check_overrides(["-r", "run_name=../x", f"paths.log_dir={tmp_path}"], "train")


@pytest.mark.parametrize(("args", "expected"), [
    (["seed=1", "debug=fast", "seed=2"], "seed is given twice (seed=1, seed=2)"),
    (["+trainer.max_time=00:01:00:00", "++trainer.max_time=00:02:00:00"],
     "trainer.max_time is given twice (+trainer.max_time=00:01:00:00, ++trainer.max_time=00:02:00:00)"),
    (["-m", "rpe=none,irpe_k", "rpe=shaw"], "rpe is given twice (rpe=none,irpe_k, rpe=shaw)"),
])
def test_a_key_given_twice_is_refused(args: list[str], expected: str) -> None:
    """Hydra keeps the last of two values silently; a run named by one would train with the other."""
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_repeated_keys(args)
    assert str(err.value) == f"{expected}; Hydra would keep only the last: give each key once"
    cli.check_repeated_keys(["seed=1", "data=relational", "data.root=/x", "-m", "rpe=none,irpe_k"])  # all once
    cli.check_repeated_keys(["--cfg", "job", "seed=1", "seed=2"])  # Hydra's own modes are left to Hydra


def test_every_swept_value_is_checked_before_the_first_job(tmp_path: Path) -> None:
    """``-m seed=0,-1``: job 1's bad value is refused up front, not after job 0 has trained."""
    args = ["-m", "rpe=none,irpe_k", "seed=0,-1", "debug=fast", f"paths.log_dir={tmp_path}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_overrides(args, "train")
    assert str(err.value) == "the sweep's job with seed=-1: seed=-1 must be an integer >= 0 and <= 4294967295"
    assert not (tmp_path / "sweep").exists()
    assert [line[:2] for line in cli._each_swept_value(args[1:])] == [["rpe=irpe_k", "seed=0"],
                                                                     ["rpe=none", "seed=-1"]]


def _damage_grid(saved: Path, damage: str) -> None:
    """``saved`` (a sweep dir's multirun.yaml) as a user or a crash may leave it."""
    if damage == "directory":
        saved.mkdir()
    elif damage == "symlink":  # to another sweep's grid, which Hydra would write through the link
        other = saved.parent.parent / "other_sweep" / "multirun.yaml"
        other.parent.mkdir()
        other.write_text("hydra:\n  overrides:\n    task: [seed=0]\n")
        saved.symlink_to(other)
    else:
        saved.write_bytes({"binary": b"\x89\xff\x00garbage", "not yaml": b"hydra: [overrides\n", "empty": b"",
                           "not a grid": b"- 1\n- 2\n", "aliases": b"a: &a [1]\nb: *a\n", "mode 000": b"x"}[damage])


GRID_DAMAGES = {"binary": "not text", "not yaml": "not valid YAML: ", "empty": "empty",
                "not a grid": "not the grid Hydra writes: it has no hydra.overrides.task list",
                "aliases": "it uses a YAML alias", "directory": "it is a directory",
                "symlink": "it is a symlink (to ", "mode 000": "unreadable: Permission denied"}


@pytest.mark.parametrize("damage", GRID_DAMAGES)
def test_a_sweep_dirs_grid_that_cannot_be_read_is_refused_and_kept(tmp_path: Path, damage: str) -> None:
    """``train.py -m`` into a sweep dir whose multirun.yaml is unreadable, garbage or a link: once copied aside
    as multirun.1.yaml without a word and replaced by Hydra (through a link: another sweep's grid); now one line
    naming it, and the file stays as it was."""
    from tests.test_fault_matrix import mode_000

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    saved = sweep / "multirun.yaml"
    _damage_grid(saved, damage)
    before = sorted((p.name, p.is_symlink(), p.read_bytes() if p.is_file() else None) for p in sweep.iterdir())
    with mode_000(saved) if damage == "mode 000" else contextlib.nullcontext():
        with pytest.raises(cli.CommandLineError) as err:
            cli.check_sweep_dir_is_this_sweeps(sweep, ["debug=fast", "seed=0,1"])
    message = str(err.value)
    assert message.startswith(f"hydra.sweep.dir={str(sweep)!r} holds {saved}, which is no sweep grid this launch"
                              f" can read ({GRID_DAMAGES[damage]}") and "\n" not in message, message
    assert message.endswith("a launch would replace it, so nothing was started; valid: repair or move it away (it is"
                            " the grid of the sweep there), or a new hydra.sweep.dir")
    assert sorted((p.name, p.is_symlink(), p.read_bytes() if p.is_file() else None) for p in sweep.iterdir()) == before
    if damage == "binary":  # the whole command line: refused before Hydra starts, nothing copied aside
        with pytest.raises(cli.CommandLineError, match="which is no sweep grid this launch can read"):
            cli.check_overrides(["-m", "debug=fast", "seed=0,1", f"hydra.sweep.dir={sweep}",
                                 f"paths.log_dir={tmp_path}"], "train")
        assert sorted(p.name for p in sweep.iterdir()) == ["multirun.yaml"] and saved.read_bytes() == before[0][2]


def test_a_job_dir_that_resolves_out_of_its_sweep_dir_is_refused(tmp_path: Path) -> None:
    """The job's own check, on the resolved dir: a link inside the sweep dir that leads out counts as out."""
    sweep = tmp_path / "sweep"
    (sweep / "0").mkdir(parents=True)
    from lifecycle.job import check_job_dir

    check_job_dir(sweep / "0", sweep)
    (sweep / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    for job_dir in (sweep / "link" / "0", sweep / ".." / "x", sweep):
        with pytest.raises(cli.CommandLineError, match=r"is not inside its sweep dir"):
            check_job_dir(job_dir, sweep)


def test_a_sweep_subdir_naming_the_sweep_dir_itself_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    """hydra.sweep.subdir=. (or ./.) makes every job's run dir the sweep dir: refused by the command-line check, before
    Hydra makes the sweep dir and its multirun.yaml (probe 4, case 64: the job refused it only after both)."""
    for subdir in (".", "./.", "./"):
        with pytest.raises(cli.CommandLineError) as err:
            cli._check_sweep_subdir(subdir)
        assert str(err.value).startswith(f"hydra.sweep.subdir={subdir!r} names no folder inside the sweep dir: every"
                                         " job's run dir would be the sweep dir itself; valid: a relative path")
    with pytest.raises(cli.CommandLineError, match=r"^hydra\.sweep\.subdir='\.' names no folder inside the sweep dir"):
        cli.check_overrides(["-m", "seed=0", "debug=fast", "hydra.sweep.subdir=.", f"hydra.sweep.dir={tmp_path / 'sw'}",
                             f"paths.log_dir={tmp_path}"], "train")
    assert not (tmp_path / "sw").exists()
    cli._check_sweep_subdir("a/.")  # a folder inside it
    # job_dirname names one folder of a job's own: never the folder itself or its parent (probe 5, read from the
    # code: '${job_dirname:..}/x' passed as one safe component and put the job dir outside its sweep dir)
    names = [project.job_dirname(text) for text in (".", "..", "...", "a..b", "")]
    assert names == ["_", "__", "___", "a..b", "default"]


@pytest.mark.slow  # several train.py or eval.py processes: make test's 5 minutes
def test_sweep_and_run_dir_edges_are_one_line(tmp_path: Path) -> None:
    """An empty sweep, a job dir outside its sweep dir, and a run dir path longer than the file system takes."""
    with pytest.raises(cli.CommandLineError, match=r"^seed=range\(0,0\) sweeps over no values; valid: "):
        cli.check_overrides(["-m", "seed=range(0,0)", "debug=fast", f"paths.log_dir={tmp_path}"], "train")
    for subdir, why in (("../../esc", "it holds '..'"), ("/abs", "it is absolute"),
                        ("${name}", "${name} may resolve to any path"),
                        ("x/${oc.env:HOME}", "${oc.env:HOME} may resolve to any path")):
        with pytest.raises(cli.CommandLineError) as err:
            cli.check_overrides(["-m", "seed=0", "debug=fast", f"hydra.sweep.subdir='{subdir}'", "name=../../esc",
                                 f"hydra.sweep.dir={tmp_path / 'sweep'}"], "train")
        assert str(err.value) == (f"hydra.sweep.subdir={subdir!r} would put a job's run dir outside the sweep dir"
                                  f" ({why}); valid: a relative path without '..', interpolating only"
                                  " ${hydra.job.num}, ${hydra.job.id} or ${job_dirname:...} (the default: the"
                                  " job's number)")
    for subdir in ("${hydra.job.num}", "a/${hydra:job.num}_${hydra.job.id}", "${job_dirname:${name}}"):
        cli._check_sweep_subdir(subdir)  # each interpolation is one safe component, whatever the job's settings
    with pytest.raises(cli.CommandLineError, match=r"^hydra\.output_subdir=\.\./victim/\.hydra is not a setting"):
        cli.check_overrides(["debug=fast", "hydra.output_subdir=../victim/.hydra", f"paths.log_dir={tmp_path}"],
                            "train")  # Hydra would write its files into another run's .hydra/
    with pytest.raises(cli.CommandLineError, match=r"^rpe\.ratio=interval\(1,2\) is an interval to draw values"
                                                   r" from, which only the optuna sweeper does"):
        cli.check_overrides(["-m", "rpe.ratio=interval(1,2)", "debug=fast", f"paths.log_dir={tmp_path}",
                             f"hydra.sweep.dir={tmp_path / 'sweep2'}"], "train")
    with pytest.raises(cli.CommandLineError, match=r"^rpe=glob\(nosuch\*\) sweeps over no values; valid: a sweep of at"
                                                   r" least one value \(options: alibi, cpb, "):
        cli.check_overrides(["-m", "rpe=glob(nosuch*)", "debug=fast", f"paths.log_dir={tmp_path}"], "train")
    with pytest.raises(cli.CommandLineError, match=r"^rpe=glob\(\*\) matches _base, a shared base and not a choice"):
        cli.check_overrides(["-m", "rpe=glob(*)", "debug=fast", f"paths.log_dir={tmp_path}"], "train")
    assert cli._first_of_sweeps(["rpe=glob(irpe_q*)", "seed=3,4"]) == ["rpe=irpe_qk", "seed=3"]  # Hydra's order
    for sweep in (["seed=0,1"], ["sweep=shift_mini"]):
        with pytest.raises(cli.CommandLineError, match=r"^run_name=x names a single run's dir, which a sweep does"):
            cli.check_overrides(["-m", *sweep, "run_name=x", "debug=fast", f"paths.log_dir={tmp_path}"], "train")
    with pytest.raises(cli.CommandLineError, match=r"^hydra\.run\.dir=/tmp/x is not a setting: a run's dir is"
                                                   r" paths\.log_dir/run_name"):
        cli.check_overrides(["hydra.run.dir=/tmp/x", "run_name=y", "debug=fast"], "train")  # run_name was ignored
    for trials in ("0", "-1"):  # optuna would run nothing and fail with "No trials are completed yet"
        with pytest.raises(cli.CommandLineError, match=rf"^hydra\.sweeper\.n_trials={trials} must be an integer >= 1"):
            cli.check_overrides(["-m", "hydra/sweeper=optuna_rpe", f"hydra.sweeper.n_trials={trials}", "debug=fast",
                                 f"paths.log_dir={tmp_path}", f"hydra.sweep.dir={tmp_path / 'opt'}"], "train")
    with pytest.raises(cli.CommandLineError) as err:  # a key under a null node: no keys to list
        cli.check_overrides(["debug=fast", "data.train_transform.scale=[1.2,0.8]", f"paths.log_dir={tmp_path}"],
                            "train")
    assert str(err.value) == ("data.train_transform.scale is not a config key: data.train_transform is null or empty"
                              " in this config, so it has no keys; valid: +data.train_transform.scale=[1.2,0.8] (+"
                              " adds the key)")
    deep = "/".join(["a" * 200] * 23)
    with pytest.raises(cli.CommandLineError, match="^run_name makes a run dir path of 46.. bytes under paths.log_dir"):
        cli.check_run_location(deep, tmp_path)


@pytest.mark.parametrize(
    ("overrides", "logged", "not_logged"),
    [
        ([], ["val/loss", "val/top1", "val/top5"], ["val/AP", "val_ema/top1", "val/acc"]),
        (["model.ema_decay=0.99"], ["val_ema/top1", "val_ema/top5"], ["val_ema/loss"]),
        # 4 classes: top-5 would be 100 % by construction, so it is no metric (probe 16, o67)
        (["data=relational_distance"], ["val/loss", "val/top1"], ["val/top5"]),
        (["data=relational_longrange", "model.ema_decay=0.99"], ["val_ema/top1"], ["val/top5", "val_ema/top5"]),
        (["model=detr_small", "data=shapes_coco"], ["val/AP", "val/AP50", "val/AR100"],
         ["val/top1", "val/loss", "val/APl"]),  # a size class's AP is logged only where the split has its boxes
    ],
)
def test_a_monitor_the_model_does_not_log_is_refused_before_training(
        overrides: list[str], logged: list[str], not_logged: list[str], tmp_path: Path) -> None:
    """Lightning finds an unknown ``monitor`` only when the first validation ends; the job checks it against
    what the model's validation logs (each name below is one the module's code logs)."""
    from omegaconf import OmegaConf

    from lifecycle.job import build_data_and_model, check_monitored_metrics

    cfg = compose_config(overrides, tmp_path, tmp_path / "data")
    _, model = build_data_and_model(cfg)
    for monitor in logged:
        check_monitored_metrics(OmegaConf.create({"model_checkpoint": {"monitor": monitor}}), model)
    for monitor in not_logged:
        with pytest.raises(ValueError, match=rf"^callbacks\.early\.monitor={monitor} is not a metric this model"
                                             rf" logs; valid: {re.escape(', '.join(model.validation_metrics))}$"):
            check_monitored_metrics(OmegaConf.create({"early": {"monitor": monitor}}), model)


@pytest.mark.parametrize(("args", "expected"), [
    (["rpe.mode=ctxx"], "rpe.mode='ctxx' is not one of: bias, ctx"),
    (["rpe.index=log"], "rpe.index='log' is not one of: piecewise, clip"),
    (["rpe=none", "rpe.ratio=2.0"], "rpe.ratio=2.0 is not read by rpe.method='none'"),
    (["model.net.ape=foo"], "ape='foo' is not one of: learned, sincos, none, peg"),
    (["model=detr_small"], "the DETR model (DetectionModule) needs COCO-format detection data"),
    (["-m", "rpe.mode=bias,ctxx"], "the sweep's job with rpe.mode=ctxx: rpe.mode='ctxx' is not one of: bias, ctx"),
], ids=["mode", "index", "unread", "ape", "detr_on_digits", "swept"])
def test_settings_only_the_built_model_checks_are_refused_before_a_run_dir(
        args: list[str], expected: str, tmp_path: Path) -> None:
    """Values only the model or encoding constructors can judge: refused by building them on the meta device
    before Hydra makes anything, so no run dir with a failed.json is left for the tables to list."""
    from lifecycle.cli import check_overrides

    with pytest.raises(ValueError) as err:
        check_overrides(["data=digits", *args, f"paths.log_dir={tmp_path}"], "train")
    assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("override", "expected"), [
    ("hydra/job_logging=default", "hydra/job_logging=default writes a log file into the run dir before the job"),
    ("hydra.searchpath=[file:///tmp/cfgs]", "hydra.searchpath=[file:///tmp/cfgs] is not supported: a run is"),
])
def test_hydra_settings_that_get_around_the_checks_are_refused(override: str, expected: str, tmp_path: Path) -> None:
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_command([override, "debug=fast", f"paths.log_dir={tmp_path}"], "train")
    assert str(err.value).startswith(expected)


@pytest.mark.parametrize("name", ["a\nb", "tab\there", "evil\u202egnp.txt"])
def test_a_run_name_with_hidden_characters_is_refused(name: str, tmp_path: Path) -> None:
    """A newline, a tab or a right-to-left override in a folder name makes listings and log lines lie."""
    with pytest.raises(cli.CommandLineError, match="is not a run name; valid: a relative path of names"):
        cli.check_run_location(name, tmp_path)



def test_a_run_name_refused_by_its_default_names_the_key_the_user_gave(tmp_path: Path) -> None:
    """Probe 8, A1: ``name=/abs/path`` (run_name's default is ``${name}/${now:...}``) was refused as
    ``run_name='/abs/path/<time>'``, a key the user never gave: the line names ``name=`` and run_name's value."""
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_overrides([f"name={tmp_path / 'a1v'}", "debug=fast", f"paths.log_dir={tmp_path / 'runs'}"], "train")
    message = str(err.value)
    assert re.match(rf"run_name='{re.escape(str(tmp_path / 'a1v'))}/[0-9_-]+' \(from name='{re.escape(str(tmp_path))}"
                    r"/a1v'; run_name: \$\{name\}/\$\{now:%Y-%m-%d_%H-%M-%S\}\) is not a run name; valid: a relative",
                    message), message
    with pytest.raises(cli.CommandLineError) as err:  # a run_name given itself is named as given
        cli.check_overrides(["run_name=/abs", "debug=fast", f"paths.log_dir={tmp_path / 'runs'}"], "train")
    assert str(err.value).startswith("run_name='/abs' is not a run name;")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "a1v").exists()


def _refused_by_the_command_line(args: list[str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
                                 config_name: str = "train") -> str:
    """train.py's entry point (`cli.cli`) on ``args``, in this process (a train.py process takes seconds to import
    what it trains with): exit code 2 before Hydra runs, and the one ``error:`` line it printed."""
    monkeypatch.setattr(sys, "argv", [cli.SCRIPTS[config_name], *args])
    with pytest.raises(SystemExit) as stop:
        cli.cli(lambda: pytest.fail("the command line reached Hydra"), config_name)
    assert stop.value.code == 2
    return _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize(("args", "expected"), [
    (["seed=0,1", "hydra.sweeper.max_batch_size=0"],
     "hydra.sweeper.max_batch_size=0 must be an integer >= 1 or null (the jobs the basic sweeper starts at once"),
    (["hydra/sweeper=optuna_rpe", "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=0"],
     "hydra.sweeper.n_jobs=0 must be an integer >= 1 (the trials optuna starts at once)"),
    (["hydra/sweeper=optuna_rpe", "hydra.sweeper.n_trials=2", "hydra.sweep.subdir=same"],
     "hydra.sweep.subdir=same gives the trials of hydra_plugins."),
    (["seed=0", "hydra/launcher=submitit_local", "hydra.launcher.submitit_folder={tmp}/other_run/sub"],
     "hydra.launcher.submitit_folder={tmp}/other_run/sub is not inside the sweep dir {tmp}/sw"),
    # probe 12, g43b: SLURM would write every job's log into another run's dir
    (["seed=0", "hydra/launcher=slurm", "+hydra.launcher.additional_parameters.output={tmp}/other_run/slurm-%j.out"],
     "hydra.launcher.additional_parameters.output={tmp}/other_run/slurm-%j.out is not inside the sweep dir {tmp}/sw"),
    (["seed=0", "hydra/launcher=slurm", "+hydra.launcher.additional_parameters.chdir={tmp}"],
     "hydra.launcher.additional_parameters.chdir={tmp} moves the jobs' working dir"),
    # probe 13, i50: the launcher asked for one node where the run expects two
    (["seed=0", "hydra/launcher=slurm", "trainer=ddp_cpu", "trainer.devices=1", "trainer.num_nodes=2",
      "hydra.launcher.nodes=1"], "hydra.launcher.nodes=1 but trainer.num_nodes=2: every job would start 1 node(s)"),
    # probe 13, i4b: sbatch takes an option's unique prefix (getopt_long)
    (["seed=0", "hydra/launcher=slurm", "+hydra.launcher.additional_parameters.chd={tmp}"],
     "hydra.launcher.additional_parameters.chd={tmp} moves the jobs' working dir"),
    (["seed=0", "hydra/launcher=slurm", "+hydra.launcher.additional_parameters.outp={tmp}/other_run/o"],
     "hydra.launcher.additional_parameters.outp={tmp}/other_run/o is not inside the sweep dir {tmp}/sw"),
])
def test_a_sweeper_or_launcher_setting_that_cannot_work_is_one_line_before_the_sweep_dir(
        args: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 11: ``max_batch_size=0`` was an AssertionError traceback (e8), optuna's ``n_jobs=0`` an endless loop
    launching no job (e32), a constant subdir put every optuna trial in one dir (e17), and a submitit folder in
    another run's dir got the launcher's pickles and logs (e10, e11)."""
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "hydra/launcher=slurm" in args:  # SLURM's commands, as on a login node (never called: refused before)
        commands = tmp_path.parent / f"{tmp_path.name}_bin"
        commands.mkdir()
        for name in ("sbatch", "srun"):
            (commands / name).write_text("#!/bin/sh\nexit 1\n")
            (commands / name).chmod(0o755)
        monkeypatch.setenv("PATH", f"{commands}{os.pathsep}{os.environ['PATH']}")
    line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={tmp_path}", "-m", *args,
                                         f"hydra.sweep.dir={tmp_path}/sw"], capsys, monkeypatch)
    assert line.startswith(f"error: {expected.replace('{tmp}', str(tmp_path))}"), line
    assert "valid:" in line or "must be" in line
    assert list(tmp_path.iterdir()) == []


def test_a_submitit_folder_through_a_link_out_of_the_sweep_dir_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 13, i27b: a link inside the sweep dir that leads into a finished run passed the check of the folder's
    text, and submitit wrote its pickles and logs into that run."""
    other = tmp_path / "other_run"
    other.mkdir()
    (tmp_path / "sw" / "logs").mkdir(parents=True)
    (tmp_path / "sw" / "logs" / "lnk").symlink_to(other)
    line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={tmp_path}", "-m", "seed=0",
                                         "hydra/launcher=submitit_local",
                                         f"hydra.launcher.submitit_folder={tmp_path}/sw/logs/lnk/sub",
                                         f"hydra.sweep.dir={tmp_path}/sw"], capsys, monkeypatch)
    assert line.startswith(f"error: hydra.launcher.submitit_folder={tmp_path}/sw/logs/lnk/sub is not inside the sweep"
                           f" dir {tmp_path}/sw (through a link it is {other}/sub)"), line
    assert list(other.iterdir()) == []


def test_a_dollar_in_a_run_or_sweep_dir_is_refused_before_any_dir(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    r"""Hydra stores the dir it made and reads it back as a config value: a run named ``p5${x}`` (Hydra's escaped
    ``\${``) made its dir, then every use of the dir was a traceback. A ``$`` in the name, the log dir, the sweep
    dir or a job's subdir is one line before any dir is made."""
    runs = tmp_path / "runs"
    line = _refused_by_the_command_line(["debug=fast", r"run_name=p5\${x}", f"paths.log_dir={runs}"], capsys,
                                        monkeypatch)
    assert line == ("error: run_name='p5${x}' holds '$', which Hydra reads as the start of"
                                              " an interpolation (${...}) when it uses the dir it made, and a shell"
                                              " as a variable; valid: a run_name without '$'")
    for args, key in (([f"paths.log_dir={runs}/a$b", "run_name=r"], "paths.log_dir"),
                      ([f"paths.log_dir={runs}/a\\${{b}}", "run_name=r"], "paths.log_dir"),
                      (["-m", "seed=0", f"hydra.sweep.dir={runs}/sw\\${{x}}"], "hydra.sweep.dir"),
                      (["-m", "seed=0", f"hydra.sweep.dir={runs}/sw", "hydra.sweep.subdir=j$n"],
                       "hydra.sweep.subdir")):
        with pytest.raises(cli.CommandLineError, match=rf"^{re.escape(key)}='[^']*\$[^']*' holds '\$', which Hydra"):
            cli.check_overrides(["debug=fast", *args], "train")
    assert not runs.exists()


def test_names_alike_after_unicode_normalisation_are_refused(tmp_path: Path) -> None:
    """'ük' typed as one letter (NFC) and as 'u' with a combining mark (NFD) are two folders that print alike: two
    runs no listing or table can tell apart. A name still to be made is composed, and never the twin of one
    beside it; an existing folder is used as it is spelled (a rerun)."""
    composed, decomposed = "\u00fck", "u\u0308k"
    with pytest.raises(cli.CommandLineError, match=r"the name .* \(spelled 'u\\u0308k'\) is not in Unicode's composed"
                                                   r" form \(NFC\).*valid: the composed spelling '\\xfck'$"):
        cli.check_run_location(f"sweep/{decomposed}", tmp_path)
    with pytest.raises(cli.CommandLineError, match=r"^hydra\.sweep\.dir=.*is not in Unicode's composed form"):
        cli.prepare_output_dir(tmp_path / decomposed, "hydra.sweep.dir")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / decomposed).mkdir()  # made before names were checked
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_run_location(composed, tmp_path)
    assert str(err.value) == (f"run_name='{composed}': {tmp_path / decomposed} exists, whose name ('u\\u0308k')"
                              " differs from '\\xfck' only in Unicode normalisation (the two print alike); valid: that"
                              " folder's name as it is spelled, to use it, or another name")
    cli.check_run_location(decomposed, tmp_path)  # the existing run, as it is spelled
    cli.check_run_location(f"{decomposed}/{composed}x", tmp_path)  # a composed name inside it
    assert [p.name for p in tmp_path.iterdir()] == [decomposed]


@pytest.mark.parametrize(("override", "expected"), [
    ("~trainer", "~trainer would leave out the trainer config group, which every run of train.py is built from;"
                 " valid: trainer=<one of: cpu, ddp, ddp_cpu, gpu>, or leave it out for the default (trainer=cpu)"),
    ("~model", "~model would leave out the model config group, "),
    ("~data=relational", "~data=relational would leave out the data config group, "),
    ("~rpe", "~rpe would leave out the rpe config group, which every run of train.py is built from; valid: rpe=<one"
             " of: alibi, "),
    ("~callbacks", "~callbacks would leave out the callbacks config group, which every run of train.py is built"
                   " from; valid: callbacks=<one of: default, none>"),
    ("~paths", "~paths would leave out the paths config group, "),
    ("~seed", "~seed would delete seed, which every run of train.py reads; valid: seed=<value>, or leave it out for"
              " the default (seed=0)"),
    ("~model.optimizer", "~model.optimizer would delete the node model.optimizer, which the model is built from;"
                         " valid: set its keys (model.optimizer.<key>=...), or model.optimizer=null where the model"
                         " takes none"),
    ("~data.generator", "~data.generator would delete the node data.generator, which the data is built from; "),
    # a single value: one another setting reads, a constructor's required argument, one wired to the run dir
    ("~paths.log_dir", "~paths.log_dir would delete paths.log_dir, which hydra.run.dir reads; valid: paths.log_dir="
                       "<value>, or leave it out for the default (paths.log_dir=runs)"),
    ("~data.img_size", "~data.img_size would delete data.img_size, which model.net.img_size reads; "),
    ("~data.root", "~data.root would delete data.root, which data.ImageFolderDataModule needs (it has no default of"
                   " its own); valid: data.root=<value>, or leave it out for the default (data.root="
                   "${paths.data_dir}/relational_v2)"),
    ("~callbacks.model_checkpoint.dirpath", "~callbacks.model_checkpoint.dirpath would delete callbacks."
                                            "model_checkpoint.dirpath, whose default is wired to other settings"
                                            " (${paths.output_dir}/checkpoints), so the run relies on it; valid:"
                                            " callbacks.model_checkpoint.dirpath=<value>, or leave it out for the"
                                            " default"),  # probe 25, T6: never `~callbacks.model_checkpoint`
    ("~callbacks.last_checkpoint.dirpath", "~callbacks.last_checkpoint.dirpath would delete"
                                           " callbacks.last_checkpoint.dirpath, which lifecycle.checkpoints."
                                           "ResumeCheckpoint needs (it has no default of its own); valid:"
                                           " callbacks.last_checkpoint.dirpath=<value>, or ~callbacks.last_checkpoint"
                                           " to leave out the whole callbacks entry, or leave it out for the"
                                           " default"),
    ("~rpe.preset", "~rpe.preset would delete rpe.preset, which name reads; "),  # the run's name: model, encoding
    # probe 23, p28: DeiT's code default (a learned APE) trained while the record held no ape at all
    ("~model.net.ape", "~model.net.ape would delete model.net.ape, a setting the run's record must hold (deleted, the"
                       " code's own default applies, which the record does not hold); valid: model.net.ape=<value>,"
                       " or leave it out for the default (model.net.ape=learned)"),
    ("~model.optimizer.lr", "~model.optimizer.lr would delete model.optimizer.lr, a setting the run's record must "),
    # probe 24, S47, S48: the data module's own batch size, Lightning's 1000 epochs
    ("~data.batch_size", "~data.batch_size would delete data.batch_size, a setting the run's record must hold"),
    ("~trainer.max_epochs", "~trainer.max_epochs would delete trainer.max_epochs, a setting the run's record must"),
    ("~data.generator.num_train", "~data.generator.num_train would delete data.generator.num_train, a setting "),
    ("~model.optimizer.betas", "~model.optimizer.betas would delete model.optimizer.betas, a setting "),  # a list
])
def test_deleting_a_node_a_run_needs_is_refused(override: str, expected: str) -> None:
    """``~trainer`` left the trainer node a plain dict and every job failed on it after its run dir was made."""
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_deletions(["debug=fast", override], "train")
    assert str(err.value).startswith(expected), str(err.value)


def test_deleting_a_setting_of_hydras_own_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 9, A20: ``~hydra.sweep.subdir`` was Hydra's "Error merging override ... MissingMandatoryValue"."""
    line = _refused_by_the_command_line(["-m", "seed=0,1", "~hydra.sweep.subdir", f"hydra.sweep.dir={tmp_path}/sw"],
                                        capsys, monkeypatch)
    assert line == ("error: ~hydra.sweep.subdir would delete hydra.sweep.subdir, a setting of Hydra's own that it"
                    " reads for every run or sweep; valid: hydra.sweep.subdir=<value> where a command may set it, or"
                    " leave it out for the project's value")
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_deleting_a_node_is_refused_before_its_first_job(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A script's TRAINER words (``~trainer``) reach train.py's sweep: one line, no sweep dir, no failed job."""
    line = _refused_by_the_command_line(["sweep=index_mini", "~trainer", f"paths.log_dir={tmp_path}"], capsys,
                                        monkeypatch)
    assert line.startswith("error: ~trainer would leave out the trainer config group")
    assert list(tmp_path.iterdir()) == []
    for fine in ("~logger", "~experiment", "~callbacks.early", "~hydra.sweeper.params.seed"):
        cli.check_deletions([fine], "train")  # an optional group, an empty one, an entry, a swept key
    cli.check_deletions(["~testset"], "eval")


def test_deleting_a_value_a_run_reads_is_refused_before_any_dir(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``~data.root`` was a constructor's TypeError after the run dir was made; ``~paths.log_dir`` blamed paths=default;
    ``~callbacks.model_checkpoint.dirpath`` was Hydra's "HydraConfig was not set"."""
    for deletion, named in (("~data.root", "which data.ImageFolderDataModule needs"),
                            ("~paths.log_dir", "which hydra.run.dir reads"),
                            ("~callbacks.model_checkpoint.dirpath", "whose default is wired to other settings")):
        line = _refused_by_the_command_line(["debug=fast", f"paths.data_dir={tmp_path}", "run_name=deleted_x",
                                             deletion], capsys, monkeypatch)
        assert line.startswith(f"error: {deletion} would delete {deletion[1:]}, {named}"), line
    assert list(tmp_path.iterdir()) == [] and not (cli.CONFIG_DIR.parent / "runs" / "deleted_x").exists()


def test_a_list_for_a_group_that_takes_one_option_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``rpe=[irpe_k,shaw]`` trained shaw alone (Hydra merges the list, the last option's values winning); a list
    of recipes or of loggers adds up, as Hydra documents."""
    line = _refused_by_the_command_line(["rpe=[irpe_k,shaw]", f"paths.log_dir={tmp_path}"], capsys, monkeypatch)
    assert line.startswith("error: rpe=[irpe_k,shaw] gives a list of rpe options, but a run takes one rpe option"
                           " (Hydra would merge them, the last one's values winning); valid: rpe=<one of: alibi, ")
    assert line.endswith(", xl>, or -m rpe=irpe_k,shaw for a run of each; lists only for experiment=[...] (recipes),"
                         " logger=[...] (loggers)")
    assert list(tmp_path.iterdir()) == []
    for given in (["-m", "model=deit_micro,[deit_micro,swin_micro]"], ["+trainer=[cpu]"], ["hydra/launcher=[basic]"]):
        with pytest.raises(cli.CommandLineError, match="gives a list of .* options, but a run takes one"):
            cli.check_group_choices(given, "train")
    cli.check_group_choices(["experiment=[quickstart,ablation_mini]", "logger=[csv,tensorboard]"], "train")

# ----------------------------------------------------------------------------- refused before the run dir
# Probe 2026-12-05_2: each was refused in one line, but only after a failed run dir was made.
ON_DISK = ["data.root=${paths.data_dir}/rs16", "data.generator.num_train=16", "data.generator.num_val=8",
           "data.num_workers=0"]


@pytest.fixture(scope="module")
def small_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated root of 16 training and 8 validation images (a paths.data_dir)."""
    from hydra.utils import instantiate

    data_dir = tmp_path_factory.mktemp("small_data")
    cfg = compose_config(ON_DISK, tmp_path_factory.mktemp("compose"), data_dir)
    instantiate(cfg.data, _convert_="all").prepare_data()
    return data_dir


def _refused_before_the_run_dir(args: list[str], tmp_path: Path) -> str:
    """``check_overrides`` of train.py on ``args``: the one-line message; no run dir (nor log dir) was made."""
    logs = tmp_path / "logs"
    with pytest.raises(ValueError) as err:
        cli.check_overrides([*args, f"paths.log_dir={logs}", "run_name=r"], "train")
    assert "\n" not in str(err.value), str(err.value)
    assert not logs.exists()
    return str(err.value)


@pytest.mark.parametrize(("args", "expected"), [
    (["data.train_split=nope"], "/rs16 has no nope/ folder; expected ImageFolder layout root/nope/<class>/*.png"),
    (["data.batch_size=32"], "data.batch_size=32 exceeds the 16 training images per device in "),
], ids=["missing_split", "batch_above_split"])
def test_data_on_disk_is_checked_before_the_run_dir(args: list[str], expected: str, small_root: Path,
                                                     tmp_path: Path) -> None:
    """Probe cases 26, 31: a split folder the root lacks, a batch larger than the training split (drop_last)."""
    message = _refused_before_the_run_dir([*ON_DISK, *args, f"paths.data_dir={small_root}"], tmp_path)
    assert expected in message, message


def test_a_batch_the_split_holds_passes(small_root: Path, tmp_path: Path) -> None:
    cli.check_overrides([*ON_DISK, "data.batch_size=16", f"paths.data_dir={small_root}",
                         f"paths.log_dir={tmp_path / 'logs'}", "run_name=r"], "train")
    assert (tmp_path / "logs" / "r").is_dir()


@pytest.mark.parametrize("args", [["data.train_split=val"], ["data.val_split=train"], ["data.val_split=./train"]],
                         ids=["train_on_val", "validate_on_train", "same_folder"])
def test_training_and_validating_on_one_split_is_refused(args: list[str], tmp_path: Path) -> None:
    """Probe cases 32, 33: the result would measure training accuracy; no shipped config needs it."""
    train = "val" if "train_split" in args[0] else "train"
    message = _refused_before_the_run_dir([*args, f"paths.data_dir={tmp_path / 'data'}"], tmp_path)
    assert message.startswith(f"data.train_split={train} and data.val_split=") and (
        "would measure training accuracy" in message), message
    assert not (tmp_path / "data").exists()


def test_a_val_split_that_is_a_link_to_the_training_split_is_named_as_one(small_root: Path, tmp_path: Path) -> None:
    """Probe 14, l209: ``val -> train`` was refused as "the same images", with the settings given as the remedy."""
    import shutil

    root = tmp_path / "h"
    shutil.copytree(small_root / "rs16", root, symlinks=True)
    shutil.rmtree(root / "val")
    (root / "val").symlink_to("train")
    message = _refused_before_the_run_dir([*ON_DISK, "data.generator=null", f"data.root={root}"], tmp_path)
    assert message == (f"data.root={root}: val/ is a link to {root / 'train'}, the same folder as train/: best.ckpt"
                       " would be picked and tested on the images it trained on; valid: a val split of images of its"
                       " own")


@pytest.mark.parametrize(("strategy", "expected"), [
    ("fsdp", "trainer.strategy=fsdp needs a CUDA GPU, but the run has trainer.accelerator=cpu; valid here:"
             " trainer.strategy=auto or ddp"),
    ("xla", "trainer.strategy=xla needs a TPU"),
    ("nope", "trainer.strategy=nope is not a Lightning strategy; valid: auto, ddp, "),
])
def test_a_strategy_the_accelerator_cannot_run_is_refused_before_the_run_dir(strategy: str, expected: str,
                                                                              tmp_path: Path) -> None:
    """Probe case 48: Lightning's own text came only when the Trainer was built, after the run dir."""
    message = _refused_before_the_run_dir(["trainer=cpu", f"trainer.strategy={strategy}",
                                           f"paths.data_dir={tmp_path / 'data'}"], tmp_path)
    assert expected in message, message


@pytest.mark.parametrize("backend", ["flex", "triton"])
def test_a_backend_the_accelerator_cannot_run_is_refused_before_the_run_dir(backend: str, tmp_path: Path,
                                                                            monkeypatch) -> None:
    """Probe cases 107, 106: flex on the CPU was a NotImplementedError traceback at the first training step and
    triton's line came at its first forward, each after a failed run dir; `rpe.config.BACKEND_DEVICES` says where
    each backend runs, and the build before the run dir checks the model's backends against the accelerator."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    message = _refused_before_the_run_dir(["trainer=cpu", f"rpe.backend={backend}",
                                           f"paths.data_dir={tmp_path / 'data'}"], tmp_path)
    why = {"flex": "torch's FlexAttention trains on cuda only (it has no backward pass on CPU or MPS)",
           "triton": "the fused Triton kernel trains on cuda only (on CPU only under TRITON_INTERPRET=1)"}[backend]
    if backend == "triton" and importlib.util.find_spec("triton") is None:
        why = "the triton package is not installed (pip install triton)"
    assert message == (f"rpe.backend={backend} cannot train on trainer.accelerator=cpu: {why}; valid backends to"
                       " train on cpu: auto, sdpa, eager, naive"), message
    assert not (tmp_path / "data").exists()


def test_eval_refuses_a_backend_a_device_it_runs_the_model_on_cannot_run(monkeypatch) -> None:
    """Probe cases 106, 107 for eval.py: the test runs on the Trainer's device, then the MACs and throughput on the
    CPU. Flex runs forward on the CPU (no backward is needed); triton on neither the CPU nor a TPU."""
    from omegaconf import OmegaConf

    import eval as eval_script

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    data = SimpleNamespace(img_size=32)  # a fixed input size: eval.py counts MACs and throughput on the CPU

    def model(backend: str) -> Any:
        return create_model("deit_micro_patch4_32", rpe={"preset": "irpe_k", "backend": backend}, num_classes=8)

    def trainer(accelerator: str) -> Any:
        return OmegaConf.create({"trainer": {"accelerator": accelerator}})

    eval_script.check_backends(trainer("cpu"), data, model("flex"))
    with pytest.raises(ValueError) as err:
        eval_script.check_backends(trainer("tpu"), data, model("flex"))
    assert str(err.value).startswith("rpe.backend=flex cannot evaluate on trainer.accelerator=tpu: torch's"
                                     " FlexAttention runs on cuda, cpu, mps only; valid backends to evaluate on"
                                     " tpu: auto, sdpa, eager, naive"), str(err.value)
    with pytest.raises(ValueError) as err:
        eval_script.check_backends(trainer("cpu"), data, model("triton"))
    assert str(err.value).startswith("rpe.backend=triton cannot evaluate on trainer.accelerator=cpu: "), str(err.value)
    with pytest.raises(ValueError) as err:  # the test on a GPU would pass, the MACs after it would not
        eval_script.check_backends(trainer("cuda"), data, model("triton"))
    assert str(err.value).startswith("rpe.backend=triton cannot evaluate on the CPU, where eval.py counts MACs"
                                     " and measures throughput after the test: "), str(err.value)


@pytest.mark.parametrize(("config_name", "override", "expected"), [
    ("train", "+ckpt_path=runs/base/checkpoints/last.ckpt",
     "ckpt_path is a setting of eval.py, not of train.py, where nothing reads it; to resume a run, run its command"
     " again (the same run_name resumes from its checkpoints/last.ckpt); to start from weights:"
     " model.weights=<reference-layout checkpoint> (DETR models; train.py starts DeiT and Swin models from scratch)"),
    ("train", "+data_root=/data", "data_root is a setting of eval.py, not of train.py, where nothing reads it; the"
                                  " data folder is data.root"),
    ("eval", "+seed=1", "seed is a setting of train.py, not of eval.py, where nothing reads it; eval.py draws nothing"
                        " at random"),
    ("eval", "+run_name=x", "run_name is a setting of train.py, not of eval.py, where nothing reads it; eval.py reads"
                            " the run from ckpt_path="),
], ids=["train_ckpt_path", "train_data_root", "eval_seed", "eval_run_name"])
def test_a_root_key_of_the_other_script_is_refused_naming_whose_it_is(config_name: str, override: str,
                                                                      expected: str, tmp_path: Path) -> None:
    """Probe case 49: train.py took eval.py's ``+ckpt_path=``, trained from scratch and make_tables labelled the row
    ``[ckpt_path=...]``: the root keys of every root config were declared for both scripts."""
    from lifecycle.settings import SettingError

    logs = tmp_path / "logs"
    given = ["run_name=r"] if config_name == "train" else ["ckpt_path=runs/base/checkpoints/best.ckpt"]
    with pytest.raises(SettingError) as err:
        cli.check_overrides([override, *given, f"paths.log_dir={logs}", f"paths.data_dir={tmp_path / 'data'}"],
                            config_name)
    assert str(err.value).startswith(expected) and "\n" not in str(err.value), str(err.value)
    assert not logs.exists()


def test_an_environment_variable_is_the_value_it_spells(tmp_path: Path, monkeypatch) -> None:
    """Probe case 21: ``threads=${oc.env:OMP_NUM_THREADS}`` with OMP_NUM_THREADS=1 was refused as "OMP_NUM_THREADS='1'
    must be an integer >= 1" (oc.env gives the string '1'). Every setting of a typed rule takes the value its
    variable spells, in the config the run records; a variable that spells none is named with what it must spell."""
    from lifecycle.identity import identity_config
    from lifecycle.settings import check_settings

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("RPE_TEST_LR", "2e-4")
    from_env = ["threads=${oc.env:OMP_NUM_THREADS}", "model.optimizer.lr=${oc.env:RPE_TEST_LR}"]
    cfg = compose_config(from_env, tmp_path / "out", tmp_path / "data")
    check_settings(cfg, "train")
    assert type(cfg.threads) is int and cfg.threads == 1
    assert type(cfg.model.optimizer.lr) is float and cfg.model.optimizer.lr == 2e-4
    typed = compose_config(["threads=1", "model.optimizer.lr=2e-4"], tmp_path / "out", tmp_path / "data")
    assert identity_config(cfg) == identity_config(typed)  # the same run as the values typed out
    cli.check_overrides([*from_env, f"paths.log_dir={tmp_path / 'logs'}", f"paths.data_dir={tmp_path / 'data'}",
                         "run_name=r"], "train")
    monkeypatch.setenv("RPE_TEST_LR", "fast")
    message = _refused_before_the_run_dir([*from_env, f"paths.data_dir={tmp_path / 'data'}"], tmp_path / "refused")
    assert message == ("environment variable RPE_TEST_LR='fast' must spell a number > 0; model.optimizer.lr reads it:"
                       " set RPE_TEST_LR to a valid value, or unset it for the config's default"), message
    # probe 18, s95: an unset variable's default is a string too ('3'), and was refused as "seed='3' must be an
    # integer" without naming the variable; it is the value it spells, as a set variable's text is
    monkeypatch.delenv("RPE_TEST_SEED", raising=False)
    defaulted = compose_config(["seed=${oc.env:RPE_TEST_SEED,3}"], tmp_path / "out", tmp_path / "data")
    check_settings(defaulted, "train")
    assert type(defaulted.seed) is int and defaulted.seed == 3
    message = _refused_before_the_run_dir(["seed=${oc.env:RPE_TEST_SEED,abc}", f"paths.data_dir={tmp_path / 'data'}"],
                                          tmp_path / "refused2")
    assert message == ("seed=${oc.env:RPE_TEST_SEED,abc}: RPE_TEST_SEED is not set, and its default 'abc' must spell"
                       " an integer >= 0 and <= 4294967295; valid: set RPE_TEST_SEED, or a default that spells a valid"
                       " value"), message


def _hand_root(folder: Path, change: str) -> Path:
    """Hand data of 8 classes (2 images each per split), changed as a probe's root was."""
    import shutil

    from data import make_fake_imagefolder

    root = make_fake_imagefolder(folder, num_classes=8, per_class=2, img_size=32)
    for split in ("train", "val"):
        if change == "hidden":  # Jupyter's folder, holding a copy of an image
            (root / split / ".ipynb_checkpoints").mkdir()
            shutil.copy(root / split / "class_000" / "0000.png", root / split / ".ipynb_checkpoints" / "a.png")
        elif change == "empty":
            (root / split / "8_EMPTY").mkdir()
    if change == "val_only":
        shutil.copytree(root / "val" / "class_000", root / "val" / "class_999")
    return root


@pytest.mark.parametrize(("change", "args", "expected"), [
    ("hidden", [], None),
    ("empty", [], "/train is not a usable ImageFolder split (class folders without images: 8_EMPTY); expected"),
    ("val_only", [], "the class folders of train/ (8) and val/ (9) differ (only in val/: class_999); they must match"),
    ("none", ["data.num_classes=9"], "data.num_classes=9 but data.root="),
])
def test_hand_class_folders_are_checked_before_the_run_dir(change: str, args: list[str], expected: str | None,
                                                           tmp_path: Path) -> None:
    """Probe cases 60, 61: a hidden .ipynb_checkpoints/ counted as a 9th class (and the hint invited
    data.num_classes=9); an empty class folder was refused only in setup, after a failed run dir."""
    root = _hand_root(tmp_path / "hand", change)
    given = ["data.generator=null", f"data.root={root}", "data.batch_size=4", f"paths.data_dir={tmp_path / 'd'}",
             *args]
    if expected is None:
        cli.check_overrides([*given, f"paths.log_dir={tmp_path / 'logs'}", "run_name=r"], "train")
        assert (tmp_path / "logs" / "r").is_dir()  # data.num_classes=8: the hidden folder is no class
        return
    message = _refused_before_the_run_dir(given, tmp_path)
    assert expected in message, message


def test_a_data_dir_that_is_a_file_is_refused_before_the_run_dir(tmp_path: Path, monkeypatch) -> None:
    """Probe case 107: ``RPE_DATA_DIR=<a file>``, named as the variable it came from."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setenv("RPE_DATA_DIR", str(afile))
    message = _refused_before_the_run_dir([], tmp_path)
    assert message == (f"data.root={afile}/relational_v2 cannot be generated there: {afile} is a file, where a folder"
                       f" belongs (paths.data_dir is environment variable RPE_DATA_DIR='{afile}'); valid: a writable"
                       " folder (paths.data_dir=... or data.root=...)"), message
    assert afile.read_text() == "x"


def test_an_empty_data_dir_variable_is_named(tmp_path: Path, monkeypatch) -> None:
    """Probe case 106: the message named paths.data_dir, which the user never set, not RPE_DATA_DIR."""
    monkeypatch.setenv("RPE_DATA_DIR", "")
    message = _refused_before_the_run_dir([], tmp_path)
    assert message.startswith("environment variable RPE_DATA_DIR='' must be a folder path") and (
        "paths.data_dir reads it: set RPE_DATA_DIR to a valid value, or unset it") in message, message


def test_a_data_root_in_a_read_only_folder_is_refused_before_the_run_dir(tmp_path: Path) -> None:
    """Probe case 109: the generation lock beside data.root could not be made, after the run dir was."""
    from data.generation import lock_path
    from tests.helpers import file_modes_hold

    folder = tmp_path / "rodata"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with file_modes_hold():
            message = _refused_before_the_run_dir([f"data.root={folder / 'rs'}"], tmp_path)
    finally:
        folder.chmod(0o755)
    assert message == (f"data.root={folder / 'rs'} cannot be generated there: permission denied ({folder} is not"
                       f" writable; the data and its lock file {lock_path(folder / 'rs').name} are made there); valid:"
                       " a writable folder (paths.data_dir=... or data.root=...)"), message
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize(("args", "config_name", "expected"), [
    (["testset=relational_right"], "train",
     "testset is a config group of eval.py, not of train.py (python eval.py ckpt_path=runs/<run>/checkpoints/best.ckpt"
     " testset=relational_right); valid groups of train.py: callbacks, data, debug, experiment, logger, model,"
     " paths, rpe, sweep, trainer"),
    (["+testset=relational_right"], "train", "testset is a config group of eval.py, not of train.py"),
    (["sweep=shift_mini"], "eval", "sweep is a config group of train.py, not of eval.py (python train.py"
                                   " sweep=shift_mini); valid groups of eval.py: callbacks, data,"),
], ids=["testset_to_train", "added", "sweep_to_eval"])
def test_the_other_scripts_group_is_named_as_its(args: list[str], config_name: str, expected: str) -> None:
    """Probe case 63: Hydra's "use +testset=" hint instead of saying testset is eval.py's group."""
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_group_choices(args, config_name)
    assert expected in str(err.value), str(err.value)
    cli.check_group_choices(["testset=relational_right"], "eval")  # its own group passes
    cli.check_group_choices(["testset=relational_right"])  # without a script: only the option is checked


def test_a_symlinked_ckpt_path_names_the_link(tmp_path: Path) -> None:
    """Probe case 117: the message named <link folder>/../config.yaml, a path the user never gave; the link is
    still not followed (its target's config is not taken for it)."""
    from omegaconf import OmegaConf

    import eval as eval_script

    best = tmp_path / "runs" / "base" / "checkpoints" / "best.ckpt"
    best.parent.mkdir(parents=True)
    best.write_bytes(b"not read")
    link = tmp_path / "links" / "link.ckpt"
    link.parent.mkdir()
    link.symlink_to(best)
    with pytest.raises(FileNotFoundError) as err:
        eval_script._load_run(OmegaConf.create({"ckpt_path": str(link)}))
    message = str(err.value)
    assert message.startswith(f"ckpt_path='{link}' is a symlink (to {best}), and a checkpoint is read at its run"
                              " dir's path") and message.endswith(f"valid: ckpt_path={best}"), message


def test_a_run_path_with_dot_dot_after_a_link_is_one_line_naming_the_systems_reading(tmp_path: Path) -> None:
    """Probe 8, A42: ``lnk/..`` (lnk -> a run's checkpoints/) is the run to the system, but eval.py and
    evaluate_testsets.py read the path's text: their lines named ``<lnk's folder>/config.yaml`` and a run called
    ``..``, folders the system never reads. One line offers the system's reading instead."""
    from omegaconf import OmegaConf

    import eval as eval_script
    from scripts import evaluate_testsets
    from storage.destinations import DestinationError

    run = tmp_path / "runs" / "a42"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "best.ckpt").write_bytes(b"not read")
    (run / "config.yaml").write_text("seed: 0\n")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "l42").symlink_to(run / "checkpoints", target_is_directory=True)
    via = tmp_path / "x" / "l42" / ".."
    with pytest.raises(DestinationError) as err:
        eval_script._load_run(OmegaConf.create({"ckpt_path": str(via / "checkpoints" / "best.ckpt")}))
    assert str(err.value) == (f"ckpt_path={str(via / 'checkpoints' / 'best.ckpt')!r} has '..' after a link: the"
                              f" system reads it as {run / 'checkpoints' / 'best.ckpt'}, a path made absolute first"
                              f" as {tmp_path / 'x' / 'checkpoints' / 'best.ckpt'}, and the two name different"
                              f" folders; valid: ckpt_path={run / 'checkpoints' / 'best.ckpt'}")
    with pytest.raises(DestinationError) as err:
        evaluate_testsets.find_runs([via])
    assert str(err.value).startswith(f"the run or sweep dir {str(via)!r} has '..' after a link: the system reads it as"
                                     f" {run}, a path made absolute first as {tmp_path / 'x'},")
    assert str(err.value).endswith(f"valid: the run or sweep dir {run}")
    assert evaluate_testsets.find_runs([run]) == [run]  # the system's reading is the run


def test_a_key_the_groups_choice_lacks_names_the_setting_and_the_choices_that_fit(tmp_path: Path) -> None:
    """Probe 3 case 8: a classification model on detection data said "a config value reads ${data.img_size}"; the
    reader is found in the composed config, and the data and model choices that fit are named."""
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_overrides(["data=shapes_coco", "debug=fast", f"paths.log_dir={tmp_path}"], "train")
    assert str(err.value) == (
        "model.net.img_size reads ${data.img_size}, which data=shapes_coco does not set: model=deit_micro does not fit"
        " data=shapes_coco; valid: data=digits, imagenet, relational, relational_corner, relational_distance,"
        " relational_left, relational_longrange with model=deit_micro or model=detr_r50, detr_small with"
        " data=shapes_coco"), str(err.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("override", "expected"), [
    ("logger=null", "logger=null is not a choice of config group logger (it takes one of its options); valid:"
                    " logger=csv, tensorboard, wandb, or ~logger to leave the group out (no logger; the run's numbers"
                    " still go to metrics.json)"),
    ("rpe=null", "rpe=null is not a choice of config group rpe (it takes one of its options); valid: rpe=alibi,"),
    ("debug=null", "debug=null is not a choice of config group debug (it takes one of its options); valid:"
                   " debug=fast, or leave it out (no debug is the default)"),
    ("hydra/launcher=null", "hydra/launcher=null is not a choice of config group hydra/launcher (it takes one of its"
                            " options); valid: hydra/launcher=basic, slurm, submitit_local, submitit_slurm, or leave"
                            " it out for Hydra's default"),
], ids=["removable", "with_default", "null_default", "hydra_group"])
def test_a_null_group_choice_names_the_group_and_its_choices(override: str, expected: str, tmp_path: Path) -> None:
    """Probe 3 case 34: ``logger=null`` was Hydra's "Config group override must be a string or a list. Got
    NoneType"."""
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_overrides([override, "debug=fast" if override != "debug=null" else "seed=0",
                             f"paths.log_dir={tmp_path}"], "train")
    assert str(err.value).startswith(expected) and "\n" not in str(err.value), str(err.value)
    if override == "rpe=null":
        assert str(err.value).endswith(", xl, or leave it out for the default (rpe=irpe_k)")


def test_a_launcher_key_is_refused_with_the_valid_keys_before_the_sweep_dir(tmp_path: Path) -> None:
    """Probe 3 cases 113, 114: Hydra's "use +hydra.launcher.n_jobs=2", then, following it, a TypeError inside the
    multirun (exit 1) and an empty sweep dir. Both spellings, and a key added to another of Hydra's nodes."""
    sweep = tmp_path / "sweep"
    expected = ("hydra.launcher.n_jobs is not a config key; valid keys of hydra.launcher: _target_; Hydra's basic"
                " launcher runs the jobs one after another, hydra/launcher=slurm on SLURM"
                " (hydra.launcher.array_parallelism=<n>) runs them in parallel")
    for key in ("hydra.launcher.n_jobs=2", "+hydra.launcher.n_jobs=2"):
        with pytest.raises(cli.CommandLineError) as err:
            cli.check_overrides(cli.normalize_overrides(["-m", "seed=0", key, "debug=fast", f"hydra.sweep.dir={sweep}",
                                                         f"paths.log_dir={tmp_path}"]), "train")
        assert str(err.value) == expected, str(err.value)
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_overrides(cli.normalize_overrides(["+hydra.job.foo=1", "debug=fast", f"paths.log_dir={tmp_path}"]),
                            "train")
    assert str(err.value) == ("hydra.job.foo is not a config key; valid keys of hydra.job: chdir, config, config_name,"
                              " env_copy, env_set, id, name, num, override_dirname")
    assert list(tmp_path.iterdir()) == []


def test_a_whole_mapping_for_an_empty_node_gets_the_spelling_that_works(tmp_path: Path) -> None:
    """Probe 3 case 136: ``hydra.job.env_set={OMP_NUM_THREADS:2}`` was told to set the whole node, which it did;
    Hydra sets a mapping into an empty node key by key, so the line gives the ``+`` spelling, which works."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    with pytest.raises(cli.CommandLineError) as err:
        cli.check_overrides(["hydra.job.env_set={OMP_NUM_THREADS:2}", "debug=fast", f"paths.log_dir={tmp_path}"],
                            "train")
    assert str(err.value) == (
        "hydra.job.env_set={OMP_NUM_THREADS:2} cannot set hydra.job.env_set.OMP_NUM_THREADS: hydra.job.env_set is an"
        " empty mapping in this config, and Hydra sets a mapping given for it key by key, only the keys it has; valid:"
        " +hydra.job.env_set={OMP_NUM_THREADS:2} (+ adds the keys)"), str(err.value)
    hint = str(err.value).rsplit("valid: ", 1)[1].split(" ")[0]
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(cli.CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=cli.normalize_overrides([hint]), return_hydra_config=True)
    GlobalHydra.instance().clear()
    assert cfg.hydra.job.env_set == {"OMP_NUM_THREADS": "2"}


def test_the_sweepers_direction_must_rank_the_result_the_way_it_is_better(tmp_path: Path) -> None:
    """Probe 3 case 101: optuna minimised val/top1 and reported the worst trial as best. The rule is the one the
    best checkpoint's mode follows (`settings.better`)."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install -e '.[optuna]'")
    from lifecycle.settings import SettingError, better

    assert (better("val/top1"), better("val/AP"), better("val/loss")) == ("max", "max", "min")
    sweep = tmp_path / "opt"
    for direction, shown in (
            ("minimize", "minimize would rank the worst trial best"),
            ("[maximize,minimize]", "[maximize,minimize] asks for 2 objectives, train.py returns one")):
        with pytest.raises(SettingError) as err:
            cli.check_overrides(["-m", "hydra/sweeper=optuna_rpe", f"hydra.sweeper.direction={direction}", "debug=fast",
                                 f"paths.log_dir={tmp_path}", f"hydra.sweep.dir={sweep}"], "train")
        assert str(err.value) == (f"hydra.sweeper.direction={shown}: the objective is the run's result, val/top1 or"
                                  " val/AP, where higher is better; valid: hydra.sweeper.direction=maximize")
    assert not sweep.exists()


@pytest.mark.slow
def test_the_optuna_storage_is_a_destination_and_is_opened_before_the_sweep(tmp_path: Path) -> None:
    """Probe 4 case 70: ``hydra.sweeper.storage=sqlite:///<a finished run>/optuna.db`` wrote the study's database
    into that run, then failed inside the multirun with a traceback. The storage is a destination like any
    other, and one that cannot be opened is one line before anything is made."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install -e '.[optuna]'")
    import optuna

    run = tmp_path / "runs" / "base1"
    run.mkdir(parents=True)
    (run / "run.json").write_text('{"state": "finished"}')
    sweep = tmp_path / "sw"

    def refused(storage: str) -> str:
        with pytest.raises(cli.CommandLineError) as err:
            cli.check_overrides(["-m", "hydra/sweeper=optuna_rpe", "hydra.sweeper.n_trials=1", "debug=fast",
                                 f"hydra.sweeper.storage={storage}", f"paths.log_dir={tmp_path / 'runs'}",
                                 f"hydra.sweep.dir={sweep}"], "train")
        assert "\n" not in str(err.value) and not sweep.exists()
        return str(err.value)

    inside = f"sqlite:///{run / 'optuna.db'}"
    assert refused(inside).startswith(f"hydra.sweeper.storage={inside!r} is inside the run dir {run},")
    assert sorted(p.name for p in run.iterdir()) == ["run.json"]
    assert "is not a database URL" in refused("not-a-url")
    elsewhere = tmp_path / "studies" / "s.db"
    elsewhere.parent.mkdir()
    try:  # whether this optuna can keep a study in an SQLite file (2.10 cannot with SQLAlchemy 2)
        optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'probe.db'}")
    except Exception:
        message = refused(f"sqlite:///{elsewhere}")
        assert "cannot be opened: " in message and f"(optuna {optuna.__version__} with SQLAlchemy" in message
        assert message.endswith("valid: leave it out (the study then lives in memory for the sweep; each trial's"
                                " result is in its run dir)")
        assert not elsewhere.exists()  # tried on a temporary file, never made where it was asked for
    else:
        cli.check_overrides(["-m", "hydra/sweeper=optuna_rpe", "hydra.sweeper.n_trials=1", "debug=fast",
                             f"hydra.sweeper.storage=sqlite:///{elsewhere}", f"paths.log_dir={tmp_path / 'runs'}",
                             f"hydra.sweep.dir={sweep}"], "train")


def test_a_dotted_optuna_param_names_the_spelling_that_sets_it(tmp_path: Path) -> None:
    """Probe 4 case 74: ``hydra.sweeper.params.rpe.method=choice(bogus)`` was refused by a line listing
    ``rpe.method`` as a valid key of hydra.sweeper.params, the very key typed. The keys hold dots, so the line
    now gives the spelling that works, and that spelling's value is checked in turn."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install -e '.[optuna]'")
    sweep = tmp_path / "sw"
    base = ["-m", "hydra/sweeper=optuna_rpe", "hydra.sweeper.n_trials=1", "debug=fast", f"paths.log_dir={tmp_path}",
            f"hydra.sweep.dir={sweep}"]
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_overrides([*base, "hydra.sweeper.params.rpe.method=choice(bogus)"], "train")
    assert str(err.value) == (
        "hydra.sweeper.params.rpe.method cannot be set by a dotted path: the key 'rpe.method' of"
        " hydra.sweeper.params holds dots, which Hydra reads as further levels; valid: 'rpe.method=choice(bogus)'"
        " (the optuna sweeper takes a swept key given on the command line over its params entry)")
    with pytest.raises(ValueError) as err:  # the spelling given: its value is checked
        cli.check_overrides([*base, "rpe.method=choice(bogus)"], "train")
    assert "bogus" in str(err.value) and "product" in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert not sweep.exists()


def test_a_dotted_key_in_an_optuna_params_mapping_names_the_spelling_that_sets_it(tmp_path: Path) -> None:
    """Probe 8, A44b: ``hydra.sweeper.params={data.root:"choice(...)"}`` was refused as "hydra.sweeper.params.data.root
    is not a config key; valid keys of hydra.sweeper.params.data: rpe.method, ..." (the keys of params, not of a
    node params.data). The line names params' keys and the spelling that sweeps data.root, which is checked in
    turn (here: a data root inside a run dir)."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install -e '.[optuna]'")
    run = tmp_path / "runs" / "a44v"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("seed: 0\n")
    (run / "run.json").write_text("{}")
    sweep = tmp_path / "sw44b"
    base = ["-m", "hydra/sweeper=optuna_rpe", "hydra.sweeper.n_trials=1", "debug=fast", f"paths.log_dir={tmp_path}",
            f"hydra.sweep.dir={sweep}"]
    given = f'hydra.sweeper.params={{data.root:"choice({run / "gen"})"}}'
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_overrides([*base, given], "train")
    assert str(err.value) == (
        f"{given} cannot set 'data.root': it is not a key of hydra.sweeper.params (its keys: rpe.method, rpe.mode,"
        " rpe.ratio, rpe.shared_head), and a mapping given for hydra.sweeper.params sets only those; valid:"
        f" 'data.root=choice({run / 'gen'})' given on its own (the optuna sweeper takes a swept key given on the"
        " command line over its params entry)")
    with pytest.raises(ValueError) as err:  # the spelling given: its value is checked
        cli.check_overrides([*base, f"data.root=choice({run / 'gen'})"], "train")
    assert f"is inside the run dir {run}" in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert not sweep.exists() and sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.yaml", "run.json"]


def _sweep_config(overrides: list[str]) -> DictConfig:
    """The config a sweep launch composes (each swept key at its first value), Hydra's node included."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    GlobalHydra.instance().clear()
    with initialize_config_dir(str(cli.CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=cli._first_of_sweeps(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


def test_two_jobs_of_a_sweep_never_share_a_run_dir(tmp_path: Path) -> None:
    """Probe 3 case 145: ``data.root=/x/a_b,/x/a/b`` gave both jobs one dir (`job_dirname` writes ``_`` for ``/``),
    and the second found the first finished. The names are kept; the grid is refused before the sweep dir. So are
    keys left out of the names (trainer), and a subdir of the job's own settings (each job composed)."""
    sweep = tmp_path / "sweep"
    common = ["sweep=swin_mini", "rpe.preset=none", "seed=0", "debug=fast", f"paths.log_dir={tmp_path}"]
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_overrides([*common, f"data.root={tmp_path}/d/a_b,{tmp_path}/d/a/b", f"hydra.sweep.dir={sweep}"],
                            "train")
    assert str(err.value).startswith(
        f"the sweep's jobs with data.root={tmp_path}/d/a_b and with data.root={tmp_path}/d/a/b (their other overrides"
        f" alike) would share one run dir, {sweep}/data.root=") and str(err.value).endswith(
        "(a job's dir name keeps A-Za-z0-9._=,+- and writes _ for any other character): the second would find the"
        " first's run and never train; valid: values whose dir names differ, or hydra.sweep.subdir='${hydra.job.num}'"
        " (a dir per job number)"), str(err.value)
    assert not sweep.exists()
    trainers = [*common, "trainer=cpu,ddp_cpu"]
    with pytest.raises(cli.CommandLineError, match=r"jobs with trainer=cpu and with trainer=ddp_cpu .*\(trainer is left"
                                                   r" out of job dir names \(hydra\.job\.config\.override_dirname"):
        cli._refuse_shared_job_dirs(_sweep_config(trainers), trainers, "train")
    own = [*common, "data.root=/d/a_b,/d/a/b", "hydra.sweep.subdir='${job_dirname:${data.root}}'"]
    with pytest.raises(cli.CommandLineError, match=r"would share one run dir, .*/_d_a_b \("):
        cli._refuse_shared_job_dirs(_sweep_config(own), own, "train")
    for fine in ([*common, "data.root=/d/a_b,/d/a/b", "hydra.sweep.subdir=${hydra.job.num}"], [*common, "seed=0,1"]):
        cli._refuse_shared_job_dirs(_sweep_config(fine), fine, "train")


def test_a_job_never_shares_the_run_dir_of_an_earlier_launchs_job(tmp_path: Path) -> None:
    """Probe 16, o120: a second launch into a sweep dir whose job (``data.root=/d/a/b``) got the dir name of the
    first launch's ``data.root=/d/a_b`` failed as a job ("holds other data than ... trained on"), after writing its
    grid, and the shared name was not said. The earlier grids (``multirun.yaml`` and its kept copies) count."""
    import yaml

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    common = ["sweep=swin_mini", "rpe.preset=none", "seed=0", "debug=fast", f"paths.log_dir={tmp_path}"]
    (sweep / "multirun.1.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {"task": [
        *common, "data.root=/d/a_b"]}}}))
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {"task": [*common, "seed=1"]}}}))
    clash = [*common, "data.root=/d/a/b", f"hydra.sweep.dir={sweep}"]
    with pytest.raises(cli.CommandLineError) as err:
        cli._refuse_shared_job_dirs(_sweep_config(clash), clash, "train")
    assert str(err.value).startswith(
        "the sweep's jobs with data.root=/d/a_b (an earlier launch's job in this sweep dir) and with data.root=/d/a/b"
        f" (their other overrides alike) would share one run dir, {sweep}/data.root=_d_a_b"), str(err.value)
    for fine in ([*common, "data.root=/d/a_b"], [*common, "data.root=/d/c"]):  # the same job again; another dir
        fine = [*fine, f"hydra.sweep.dir={sweep}"]
        cli._refuse_shared_job_dirs(_sweep_config(fine), fine, "train")


def test_eval_makes_no_folder_of_its_own(tmp_path: Path) -> None:
    """Probe 5 (read from the code): ``eval.py hydra.run.dir=<data root>/train/9_X`` had Hydra make an empty class
    folder in a data root, and ``eval.py -m`` a ``multirun/<date>`` folder (or a sweep dir inside a finished
    run); eval.py makes no folder, so both are one line before Hydra runs."""
    ckpt = f"ckpt_path={tmp_path / 'run' / 'checkpoints' / 'best.ckpt'}"
    for args, start in ((["-m", f"{ckpt},{ckpt}"], "eval.py -m is not supported: "),
                        ([ckpt, f"hydra.run.dir={tmp_path / 'x'}"], f"hydra.run.dir={tmp_path / 'x'} is not a setting"),
                        ([ckpt, f"hydra.sweep.dir={tmp_path / 'x'}"], "hydra.sweep.dir=")):
        with pytest.raises(cli.CommandLineError) as err:
            cli.check_overrides(args, "eval")
        assert str(err.value).startswith(start) and "\n" not in str(err.value), str(err.value)
    assert not (tmp_path / "x").exists()


def test_check_only_runs_every_check_of_each_command_and_writes_nothing(tmp_path: Path, monkeypatch,
                                                                         capsys: pytest.CaptureFixture) -> None:
    """``train.py --check A -- B`` (how the scripts check their jobs before any dir or job): each command's checks,
    no run or sweep dir made, the task never started; the first refusal is its one line, exit 2."""
    import sys

    started: list[int] = []
    sweep = [f"paths.log_dir={tmp_path}", "-m", "debug=fast", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    run = [f"paths.log_dir={tmp_path}", "debug=fast", "run_name=one"]

    def check(*argv: str) -> str:
        monkeypatch.setattr(sys, "argv", ["train.py", "--check", *argv])
        try:
            cli.cli(lambda: started.append(1), "train")
        except SystemExit as err:
            assert err.code == 2
            return _one_error_line(capsys.readouterr().err)
        return ""

    assert check(*sweep, "seed=0,1", "--", *run) == ""
    assert check(*sweep, "seed=0,1", "--", *run, "trainer.precision=bogus") == (
        "error: trainer.precision='bogus' must be 16, 32 or 64 or a precision name such as '32-true' or 'bf16-mixed'")
    assert check(*sweep, "seed=0,-1") == ("error: the sweep's job with seed=-1: seed=-1 must be an integer >= 0"
                                               " and <= 4294967295")
    assert check(*run, "--", "--cfg", "job").startswith("error: --check checks commands that run, and Hydra's --cfg")
    assert started == [] and list(tmp_path.iterdir()) == []


STAMP = "${now:%H-%M-%S-%f}"  # changes between two compositions of the same command line


@pytest.mark.parametrize(("args", "key"), [
    (["-m", "seed=0,1", "hydra.sweep.dir={tmp}/sw_" + STAMP], "hydra.sweep.dir"),
    (["-m", "seed=0,1", "hydra.sweep.dir={tmp}/sw_${name}", "name=n_" + STAMP], "hydra.sweep.dir"),
    (["-m", "seed=0,1", "hydra.sweep.dir={tmp}/sw"], "hydra.sweep.dir"),
    (["paths.log_dir={tmp}/logs_" + STAMP, "run_name=r"], "hydra.run.dir"),
    (["paths.log_dir={tmp}/logs", "name=n_" + STAMP], "hydra.run.dir"),
    (["paths.log_dir={tmp}/logs"], "hydra.run.dir"),
], ids=["sweep_dir_stamped", "sweep_dir_stamped_through_name", "sweep_dir_named", "log_dir_stamped",
        "run_name_stamped_through_name", "default_run_name"])
def test_hydra_uses_the_dir_the_check_made(args: list[str], key: str, tmp_path: Path) -> None:
    """The check makes the run (sweep) dir, then Hydra composes the command line again: a ``${now:}`` the dir
    reaches, directly or through another key (``hydra.sweep.dir=.../sw_${name}``, ``run_name``'s default), would
    resolve to another dir, the checked one left empty. With the pins the check returns, Hydra's dir is the one
    made (and only it), whatever the dir reads."""
    argv = ["debug=fast", *(a.replace("{tmp}", str(tmp_path)) for a in args)]
    pins = cli.check_overrides(argv, "train")
    [made] = [p for p in tmp_path.rglob("*") if p.is_dir() and not any(p.iterdir())]
    again = _sweep_config(cli.with_pins([a for a in argv if a != "-m"], pins))
    assert Path(str(again.hydra.sweep.dir if key == "hydra.sweep.dir" else again.hydra.run.dir)) == made


def test_a_refused_optuna_trial_names_the_values_drawn_with_it(tmp_path: Path) -> None:
    """Probe 22, k65b: ``sweep=shift_mini hydra/sweeper=optuna_rpe 'row=choice(none,shaw)'`` was refused as "the
    sweep's job with row=shaw: rpe.mode='bias' with rpe.on='kv' ...", keys the user never set: the sweeper's own
    params (rpe.mode among them), which optuna draws with the row, are named."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install -e '.[optuna]'")
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_overrides(["-m", "sweep=shift_mini", "hydra/sweeper=optuna_rpe", "hydra.sweeper.n_trials=2",
                             "row=choice(none,shaw)", "seed=0", f"paths.log_dir={tmp_path}",
                             f"paths.data_dir={tmp_path / 'data'}"], "train", make=False)
    assert str(err.value).startswith("the sweep's job with row=shaw (with rpe.method=euclidean, rpe.mode=bias,"
                                     " rpe.shared_head=True, which optuna may draw together): rpe.mode='bias' with"
                                     " rpe.on='kv'"), str(err.value)


@pytest.mark.slow
def test_values_optuna_draws_and_a_sweepers_params_are_checked_before_the_sweep_dir(tmp_path: Path) -> None:
    """Each end of a range optuna draws from (both are values a trial may get), and each value of a key swept
    through ``hydra.sweeper.params`` (a sweep config's, or one given on the command line), is checked like a
    command-line sweep value: one line naming it before the sweep dir exists, never a failed trial."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install -e '.[optuna]'")
    sweep_dir = tmp_path / "sweep"
    common = ["debug=fast", f"paths.log_dir={tmp_path}", f"hydra.sweep.dir={sweep_dir}"]
    optuna = ["-m", "hydra/sweeper=optuna_rpe", "hydra.sweeper.n_trials=2"]
    for swept, line in (
            ("rpe.ratio=interval(-1.0,0.0)", "rpe.ratio=-1.0 (an end of interval(-1.0,0.0), which optuna may draw):"
                                             " rpe.ratio=-1.0 must be > 0"),
            ("rpe.ratio=interval(0.5,200.0)", "rpe.ratio=200.0 (an end of interval(0.5,200.0), which optuna may"
                                              " draw): rpe.ratio=200.0 must be > 0 and <= 100"),
            ("seed=range(3,-1,step=-2)", "seed=-1 (an end of range(3,-1,step=-2), which optuna may draw): seed=-1"
                                         " must be an integer >= 0"),  # optuna's range takes its stop: 3, 1, -1
            ("+hydra.sweeper.params.seed='0,-1'", "seed=-1: seed=-1 must be an integer >= 0")):
        with pytest.raises(cli.CommandLineError) as err:
            cli.check_overrides([*optuna, swept, *common], "train")
        assert str(err.value).startswith(f"the sweep's job with {line}"), err.value
    with pytest.raises(cli.CommandLineError) as err:  # optuna's own refusal was a traceback after the sweep dir
        cli.check_overrides([*optuna, "rpe.ratio=interval(3.0,0.5)", *common], "train")
    assert str(err.value).startswith("rpe.ratio=interval(3.0,0.5): interval(3.0,0.5) starts above its end; valid:"
                                     " interval(low,high) with low <= high"), err.value
    assert not sweep_dir.exists()
    cli.check_overrides([*optuna, "rpe.ratio=interval(0.5,100.0)", *common], "train")  # both ends are ratios
    shutil.rmtree(sweep_dir)
    with pytest.raises(cli.CommandLineError) as err:  # a row no row of the sweep, given through its params
        cli.check_overrides(["-m", "sweep=shift_mini", "seed=0", 'hydra.sweeper.params.row="none,nope"', *common],
                            "train")
    assert str(err.value).startswith("the sweep's job with row=nope: row=nope is not a row of sweep shift_mini;"
                                     " valid: none, ape_learned, "), err.value
    assert not sweep_dir.exists()


def test_optuna_params_given_as_a_mapping_name_one_key_an_override(tmp_path: Path) -> None:
    """Hydra cannot merge a sweep inside a mapping (its text: "Unexpected type annotation: Set[str]"): the line
    names the spelling that works for each key."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install -e '.[optuna]'")
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_overrides(["-m", "hydra/sweeper=optuna_rpe", "hydra.sweeper.params={seed: choice(0,-1), rpe.mode:"
                             " choice(bias,ctx)}", "debug=fast", f"paths.log_dir={tmp_path}"], "train")
    assert str(err.value) == (
        "hydra.sweeper.params={seed: choice(0,-1), rpe.mode: choice(bias,ctx)} cannot be merged: Hydra cannot store"
        " a sweep (choice, range, interval) inside a mapping; valid: one key an override, each given on its own:"
        " 'seed=choice(0,-1)' 'rpe.mode=choice(bias,ctx)' (the sweeper takes a swept key given on the command line"
        " over its params entry)")


def test_the_optuna_plugins_own_sweeper_is_refused_naming_ours(tmp_path: Path) -> None:
    """``hydra/sweeper=optuna`` is the plugin's sweeper, whose first failed trial ends the study with a traceback:
    one line naming ``optuna_rpe`` before the sweep dir; ``optuna_rpe`` itself passes the same check."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install -e '.[optuna]'")
    base = ["-m", "debug=fast", "hydra.sweeper.n_trials=1", f"hydra.sweep.dir={tmp_path / 'sw'}"]
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_overrides([*base, "hydra/sweeper=optuna", "hydra.sweeper.direction=maximize"], "train")
    assert str(err.value).startswith("hydra/sweeper=optuna (the plugin's own sweeper) ends the whole study") \
        and "valid: hydra/sweeper=optuna_rpe" in str(err.value)
    assert not (tmp_path / "sw").exists()
    cli.check_overrides([*base, "hydra/sweeper=optuna_rpe"], "train", make=False)


def test_a_log_folder_this_user_may_not_look_into_is_named(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_name=locked/x`` under a mode-000 ``locked/``: the line named ``locked/x/multirun.yaml``, a file the
    user never gave (looked for to tell whether the run dir lies in a sweep), not the folder that cannot be used."""
    locked = tmp_path / "runs" / "locked"
    locked.mkdir(parents=True)
    locked.chmod(0)
    try:
        with file_modes_hold():
            line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={tmp_path / 'runs'}",
                                                 f"paths.data_dir={tmp_path}", "run_name=locked/x"], capsys,
                                                monkeypatch)
    finally:
        locked.chmod(0o755)
    assert line == (f"error: cannot use {locked}: permission denied (a folder this user may not look into); valid: a"
                    " folder this user may read and write (chmod u+rwx), or another")
    assert list(locked.iterdir()) == []


@pytest.mark.parametrize("locked", ["train/class_000", "val", "train/class_001/0000.png"])
def test_data_this_user_may_not_read_is_one_line_before_the_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    locked: str) -> None:
    """A mode-000 class folder, split folder or image of a data root: each was found by the data module only
    after the run dir was made (the image once a batch drew it; the split in a raw ``[Errno 13]`` text)."""
    from data.fake import make_fake_imagefolder

    root = tmp_path / "hand"
    make_fake_imagefolder(root, num_classes=2, per_class=2, img_size=32)
    (root / locked).chmod(0)
    runs = tmp_path / "runs"
    try:
        with file_modes_hold():
            line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={runs}", f"paths.data_dir={tmp_path}",
                                                 "data.generator=null", "data.num_classes=null", "data.batch_size=2",
                                                 f"data.root={root}",
                                                 "run_name=r"], capsys,
                                                monkeypatch)
    finally:
        (root / locked).chmod(0o755)
    what = "image" if locked.endswith(".png") else "folder"
    verb = "read" if what == "image" else "listed"
    assert line == (f"error: data.root='{root}' cannot be read: {what} {root / locked} cannot be {verb} (permission"
                    f" denied); valid: make it readable (chmod -R u+rX {root}), or data.root=<another folder>")
    assert not runs.exists()


@pytest.mark.parametrize("kind", ["fifo", "socket", "link_to_fifo"])
def test_a_fifo_deep_in_hand_data_is_one_line_before_the_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Probe 7, A142: a FIFO deep in a class folder (``train/<class>/sub/deeper/f.png``) was refused by the data
    module, after the run dir was made; the command line's one walk of the data root names it before."""
    import os
    import socket

    from data.fake import make_fake_imagefolder

    root = tmp_path / "hand"
    make_fake_imagefolder(root, num_classes=2, per_class=2, img_size=32)
    deeper = root / "train" / "class_000" / "sub" / "deeper"
    deeper.mkdir(parents=True)
    odd = deeper / "f.png"
    if kind == "socket":
        with monkeypatch.context() as here, socket.socket(socket.AF_UNIX) as sock:
            here.chdir(deeper)  # a socket's path is at most 107 bytes, which a test's tmp_path can exceed
            sock.bind(odd.name)
    else:
        os.mkfifo(tmp_path / "fifo" if kind == "link_to_fifo" else odd)
        if kind == "link_to_fifo":
            odd.symlink_to(tmp_path / "fifo")
    runs = tmp_path / "runs"
    line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={runs}", f"paths.data_dir={tmp_path}",
                                         "data.generator=null", "data.num_classes=null", "data.batch_size=2",
                                         f"data.root={root}", "run_name=r"], capsys, monkeypatch)
    what = "a socket" if kind == "socket" else "a FIFO (named pipe)"
    through = f" (a symlink to {tmp_path / 'fifo'})" if kind == "link_to_fifo" else ""
    assert line == (f"error: {odd}{through} is {what}, not a regular file: reading it as an image could block the"
                    " run; remove it from the class folder")
    assert not runs.exists()


def test_a_data_root_is_walked_once_per_command_not_once_per_swept_value(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep's jobs over one hand data root: its files are checked for readability once per command; a new
    command walks it again, and finds what changed since."""
    import os

    from data.fake import make_fake_imagefolder
    from lifecycle.command import command_scope

    root = tmp_path / "hand"
    make_fake_imagefolder(root, num_classes=2, per_class=2, img_size=32)
    listed: list[str] = []
    scandir = os.scandir
    monkeypatch.setattr(cli.os, "scandir", lambda path: listed.append(str(path)) or scandir(path))
    data = {"train_split": "train", "val_split": "val"}
    with command_scope():
        for _ in range(3):  # three swept values over the same root
            cli._refuse_unreadable_data(str(root), root, data)
        walked_once = list(listed)
    assert str(root / "train" / "class_000") in walked_once and len(walked_once) == len(set(walked_once))
    os.mkfifo(root / "train" / "class_000" / "new.png")
    with command_scope(), pytest.raises(cli.CommandLineError, match="is a FIFO"):
        cli._refuse_unreadable_data(str(root), root, data)  # the next command sees the FIFO made since


@pytest.mark.parametrize("flags", [["-r", "-m"], ["--multirun", "--cfg", "job"], ["--info", "--run"]])
def test_two_of_hydras_commands_at_once_are_one_line_before_any_dir(tmp_path: Path, flags: list[str]) -> None:
    """Hydra runs one of --run, --multirun, --cfg, --info per command; two were its traceback, after an empty sweep
    dir was made."""
    from lifecycle.cli import check_command
    from lifecycle.console import CommandLineError

    with pytest.raises(CommandLineError) as err:
        check_command([*flags, "debug=fast", "seed=0,1", f"hydra.sweep.dir={tmp_path / 'sw'}"], "train", make=True)
    assert "cannot be given together" in str(err.value) and "valid:" in str(err.value), str(err.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("flags", "expected"), [
    (["debug=fast", "--hydra-help"], "--hydra-help prints Hydra's own help, which takes no settings (debug=fast)"),
    (["--hydra-help", "debug=fast"], "--hydra-help prints Hydra's own help, which takes no settings (debug=fast)"),
    (["debug=fast", "--shell-completion", "install=bash"],
     "--shell-completion installs or removes shell completion and takes no settings (debug=fast)"),
])
def test_hydras_help_and_completion_with_settings_are_one_line(flags: list[str], expected: str) -> None:
    """Probe 12, g62, g63: ``--hydra-help`` with settings was Hydra's 30-line traceback (it composes its own help
    config, which has none of ours); ``--shell-completion install=bash`` after a setting was argparse's usage."""
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_flags(flags)
    assert str(err.value).startswith(expected) and "valid: python " in str(err.value), str(err.value)
    cli.check_flags(["--hydra-help"])
    cli.check_flags(["--shell-completion", "install=bash"])


def test_a_printed_config_that_cannot_be_resolved_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--cfg job --resolve`` with an unset environment variable was Hydra's 128-line traceback."""
    from lifecycle.cli import check_command
    from lifecycle.console import CommandLineError

    monkeypatch.delenv("RPE_TEST_UNSET", raising=False)
    with pytest.raises(CommandLineError) as err:
        check_command(["--cfg", "job", "--resolve", "debug=fast", "seed=${oc.env:RPE_TEST_UNSET}"], "train")
    assert "RPE_TEST_UNSET" in str(err.value) and "\n" not in str(err.value), str(err.value)
    check_command(["--cfg", "job", "--resolve", "debug=fast", "seed=3"], "train")  # resolvable: Hydra prints it


def test_printing_a_swept_config_asks_for_one_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 8, A50: ``--cfg job hydra.mode=MULTIRUN seed=0,1`` was Hydra's five-line advice to add --multirun,
    which is itself refused with --cfg. One line asking for one value; one value prints as before."""
    from lifecycle.cli import check_command
    from lifecycle.console import CommandLineError

    monkeypatch.chdir(tmp_path)
    for args in (["hydra.mode=MULTIRUN", "seed=0,1"], ["seed=range(0,3)"]):
        with pytest.raises(CommandLineError) as err:
            check_command(["--cfg", "job", "debug=fast", *args], "train")
        assert "sweeps over values, and --cfg prints the config of one job" in str(err.value), str(err.value)
    check_command(["--cfg", "job", "debug=fast", "seed=3"], "train")
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_over_many_seeds_is_checked_value_by_value_without_composing_each(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``-m seed=range(0,100000)`` sat silent for many minutes while each value was composed and its model built:
    once a seed is seen to change nothing else, its other values are checked by their rule alone (a bad one is
    still named), and a sweep of many values says that the checks run."""
    from lifecycle.cli import check_command
    from lifecycle.console import CommandLineError

    seeds = ",".join(map(str, range(400)))
    with pytest.raises(CommandLineError) as err:
        check_command(["-m", "debug=fast", f"seed={seeds},-1", f"hydra.sweep.dir={tmp_path / 'sw'}"], "train",
                      make=False)
    assert str(err.value).startswith("the sweep's job with seed=-1: seed=-1 must be an integer"), str(err.value)
    assert "checking the sweep's 400 further values" in capsys.readouterr().err
    check_command(["-m", "debug=fast", f"seed={seeds}", f"hydra.sweep.dir={tmp_path / 'sw'}"], "train", make=False)
    assert not (tmp_path / "sw").exists()


def test_a_sweep_into_a_folder_of_single_runs_is_refused_but_a_sweep_that_lost_its_grid_goes_on(tmp_path: Path) -> None:
    """``-m hydra.sweep.dir=<a folder of single runs>`` wrote a sweep beside them, and its table counted the single
    runs as its seeds. The mode Hydra recorded in each run's ``.hydra/hydra.yaml`` tells a single run from a job."""
    def run(folder: Path, mode: str) -> None:
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "hydra.yaml").write_text(f"hydra:\n  mode: {mode}\n")
        (folder / "config.yaml").write_text("seed: 0\n")
        (folder / "run.json").write_text("{}\n")

    logs = tmp_path / "logs"
    run(logs / "base1", "RUN")
    run(logs / "d1", "RUN")
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_sweep_dir_is_this_sweeps(logs, ["debug=fast", "seed=7"])
    assert str(err.value).startswith(f"hydra.sweep.dir={str(logs)!r} holds runs that are no sweep's jobs (base1, d1)")
    lost_grid = tmp_path / "sweep"
    run(lost_grid / "0", "MULTIRUN")
    cli.check_sweep_dir_is_this_sweeps(lost_grid, ["debug=fast", "seed=0,1"])  # its jobs: the sweep goes on


def test_a_damaged_generation_marker_is_one_line_before_the_run_dir(tmp_path: Path) -> None:
    """A data root whose ``.complete.json`` is nested 50000 deep was refused in one line, but only after a failed
    run dir had been left behind."""
    root = tmp_path / "data" / "rel"
    (root / "train").mkdir(parents=True)
    (root / ".complete.json").write_text('{"a":' * 50000 + "1" + "}" * 50000)
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_command(["debug=fast", *SMALL_RELATIONAL[1:], f"data.root={root}",
                           f"paths.log_dir={tmp_path / 'runs'}", "run_name=r"], "train")
    assert f"the completion marker {root / '.complete.json'} is damaged" in str(err.value), str(err.value)
    assert not (tmp_path / "runs").exists()


def test_a_shuffled_sweep_with_numbered_job_dirs_is_one_line(tmp_path: Path) -> None:
    """``-m 'seed=shuffle(0,1)'`` drew another order at the relaunch, and both numbered jobs then refused their dirs
    as another config's: one line up front; with dirs named by their overrides the order does not matter."""
    sweep = f"hydra.sweep.dir={tmp_path / 'sw'}"
    with pytest.raises(cli.CommandLineError, match=r"seed=shuffle\(0,1\) orders the jobs anew at every launch"):
        cli.check_command(["-m", "debug=fast", "seed=shuffle(0,1)", sweep], "train", make=False)
    cli.check_command(["-m", "debug=fast", "seed=shuffle(0,1)", sweep,
                       "hydra.sweep.subdir='${job_dirname:${hydra.job.override_dirname}}'"], "train", make=False)


@pytest.mark.parametrize(("args", "expected"), [
    (["run_name=a7", "hydra.run={dir:<tmp>/elsewhere}"],
     "hydra.run.dir='<tmp>/elsewhere' (from hydra.run={dir:<tmp>/elsewhere}) is not a setting of train.py: a run's"
     " dir is paths.log_dir/run_name"),
    (["hydra.mode=MULTIRUN", "seed=interval(0,1)", "hydra.sweep.dir=<tmp>/sw"],
     "seed=interval(0,1) is an interval to draw values from, which only the optuna sweeper does"),
    (["hydra.mode=MULTIRUN", "seed=shuffle(0,1)", "hydra.sweep.dir=<tmp>/sw"],
     "seed=shuffle(0,1) orders the jobs anew at every launch"),
    (["+hydra.job_logging.handlers.f={class:logging.handlers.RotatingFileHandler,filename:<tmp>/x.log}",
      "hydra.job_logging.root.handlers=[console,f]"],
     "hydra.job_logging.handlers.f.class='logging.handlers.RotatingFileHandler' changes the logging option"
     " hydra/job_logging=stdout"),
    (["+hydra.job_logging.handlers.f={class:os.makedirs,name:<tmp>/evil}"],
     "hydra.job_logging.handlers.f.class='os.makedirs' changes the logging option hydra/job_logging=stdout"),
    (["+hydra.callbacks.x._target_=os.getcwd"],
     "hydra.callbacks.x._target_='os.getcwd' (from +hydra.callbacks.x._target_=os.getcwd) is not a setting of"
     " train.py: Hydra would make and call the objects it names"),
    (["hydra.output_subdir=.hydra"], "hydra.output_subdir=.hydra is not a setting"),
    (["-m", 'hydra.sweeper.params={seed:"0,1"}', "hydra.sweep.dir=<tmp>/sw"],
     'hydra.sweeper.params={seed:"0,1"} cannot be set: this sweeper\'s params are null'),
    (["-m", "+hydra.sweeper.params.seed=0,1", "hydra.sweep.dir=<tmp>/sw"],
     "+hydra.sweeper.params.seed=0,1 cannot be set: this sweeper's params are null"),
    (["rpe=${oc.env:RPE_TEST_CHOICE}"],
     "rpe=${oc.env:RPE_TEST_CHOICE}: a group's option is given by its name, not through an interpolation"),
], ids=["run_dir_node", "mode_interval", "mode_shuffle", "file_handler", "not_a_handler", "hydra_callback",
        "output_subdir", "params_node", "params_key", "choice_by_env"])
def test_hydra_settings_are_judged_on_the_composed_config(args: list[str], expected: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 8, A2-A15: a Hydra setting given as a node (``hydra.run={dir: ...}``), through ``hydra.mode`` instead of
    ``-m``, or added below a mapping got around the checks that read the command line's text: a run dir outside
    paths.log_dir, a shuffled numbered sweep, a traceback inside Hydra. Each is judged on the composition: one
    line, before anything is made."""
    monkeypatch.setenv("RPE_TEST_CHOICE", "../rpe/irpe_qkv")
    given = [a.replace("<tmp>", str(tmp_path)) for a in args]
    line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={tmp_path}/runs", *given], capsys, monkeypatch)
    assert line.startswith("error: " + expected.replace("<tmp>", str(tmp_path))), line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["hydra.mode=MULTIRUN"], ["hydra.run={dir:<tmp>/evalx}"]], ids=["mode", "node"])
@pytest.mark.parametrize("local_rank", [None, "0"], ids=["plain", "local_rank_0"])
def test_eval_takes_no_hydra_dir_in_any_spelling(args: list[str], local_rank: str | None, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 8, A5, A6, A8: eval.py makes no folder, but ``hydra.mode=MULTIRUN``, a ``hydra.run`` node, or a
    LOCAL_RANK of 0 in the environment (as torchrun sets it) let Hydra make one in the working dir or in another
    run. Refused in one line, whatever the spelling; a DDP worker (LOCAL_RANK 1 and up) is its parent's."""
    if local_rank is not None:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    monkeypatch.chdir(tmp_path)
    given = [a.replace("<tmp>", str(tmp_path)) for a in args]
    line = _refused_by_the_command_line([f"ckpt_path={tmp_path}/runs/r/checkpoints/best.ckpt", *given], capsys,
                                        monkeypatch, config_name="eval")
    assert "is not a setting of eval.py: eval.py" in line and "makes no" in line, line
    assert list(tmp_path.iterdir()) == []


def test_a_recipe_may_not_move_the_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 8, A18: an experiment of the user's own that sets ``hydra.run.dir`` put the run outside paths.log_dir,
    where its reruns and tables never look. Every sweep config and recipe of the project passes the same check."""
    import shutil

    configs = tmp_path / "configs"
    shutil.copytree(cli.CONFIG_DIR, configs)
    (configs / "experiment" / "elsewhere.yaml").write_text(
        f"# @package _global_\nhydra:\n  run:\n    dir: {tmp_path}/elsewhere\n")
    monkeypatch.setattr(cli, "CONFIG_DIR", configs)
    monkeypatch.setattr("lifecycle.project.CONFIG_DIR", configs)
    line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={tmp_path}/runs", "experiment=elsewhere"],
                                        capsys, monkeypatch)
    assert line.startswith(f"error: hydra.run.dir='{tmp_path}/elsewhere' (set by a recipe or a node override) is not"
                           " a setting of train.py"), line
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "runs").exists()
    (configs / "experiment" / "shuffled.yaml").write_text(  # A22: a recipe's own sweep, numbered dirs, shuffled
        "# @package _global_\nhydra:\n  mode: MULTIRUN\n  sweeper:\n    params:\n      seed: shuffle(0,1)\n")
    line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={tmp_path}/runs", "experiment=shuffled",
                                         f"hydra.sweep.dir={tmp_path}/sw"], capsys, monkeypatch)
    assert line.startswith("error: seed=shuffle(0,1) orders the jobs anew at every launch"), line
    assert not (tmp_path / "sw").exists()


def test_every_recipe_and_sweep_of_the_project_keeps_the_locked_hydra_settings() -> None:
    """The project's own recipes and sweep configs set only the Hydra settings a command may change."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    for group in ("experiment", "sweep"):
        for option in cli.group_options(group):
            GlobalHydra.instance().clear()
            with initialize_config_dir(str(cli.CONFIG_DIR), version_base="1.3"):
                cfg = compose("train", overrides=[f"{group}={option}"], return_hydra_config=True)
            cli.refuse_locked_hydra_settings(cfg, "train", [f"{group}={option}"])
    GlobalHydra.instance().clear()


@pytest.mark.parametrize(("variables", "args", "named"), [
    ({"RANK": "1"}, [], "environment variable RANK=1 makes this process rank 1 of a multi-process launch"),
    ({"NODE_RANK": "1"}, ["trainer=ddp_cpu", "trainer.devices=2"],  # probe 10, C13: Lightning's rank 2 of 2
     "environment variable NODE_RANK=1 makes this process part of node 1 of a multi-process launch"),
    ({"SLURM_PROCID": "1"}, [], "environment variable SLURM_PROCID=1 makes this process rank 1"),
    ({"LOCAL_RANK": "0"}, ["trainer=ddp_cpu", "trainer.devices=2"],
     "environment variable LOCAL_RANK=0 makes Lightning take this process for one of 2 processes"),
    ({}, ["+hydra.job.env_set.LOCAL_RANK=0", "trainer=ddp_cpu", "trainer.devices=2"],
     "hydra.job.env_set.LOCAL_RANK='0' is a variable of a multi-process launch"),
    ({}, ["+hydra.job.env_set.MASTER_PORT=1234"], "hydra.job.env_set.MASTER_PORT='1234' is a variable of"),
    # probe 11, e22 and e23: a cluster's rendezvous variables left exported; the first hung rank 0 for ten minutes
    ({"MASTER_ADDR": "nohost.invalid"}, ["trainer=ddp_cpu", "trainer.devices=2"],
     "environment variable MASTER_ADDR=nohost.invalid does not resolve"),
    ({"MASTER_PORT": "notaport"}, ["trainer=ddp_cpu", "trainer.devices=2"],
     "environment variable MASTER_PORT=notaport is not a port number; valid: 1-65535"),
    # probe 12, g2 and g23: a DDP strategy of one process meets itself too; a non-ASCII digit
    ({"MASTER_PORT": "abc"}, ["trainer=ddp_cpu", "trainer.devices=1"],
     "environment variable MASTER_PORT=abc is not a port number"),
    ({"MASTER_PORT": "29500\u00b2"}, ["trainer=ddp_cpu", "trainer.devices=2"],
     "environment variable MASTER_PORT=29500\u00b2 is not a port number"),
    # probe 12, g17: the DDP workers inherit the job's environment, and imported sitecustomize.py from a run dir
    ({}, ["+hydra.job.env_set.PYTHONPATH=/runs/other", "trainer=ddp_cpu", "trainer.devices=2"],
     "hydra.job.env_set.PYTHONPATH='/runs/other' changes what the job's Python"),
    ({}, ["+hydra.job.env_set.LD_PRELOAD=/runs/other/x.so"], "hydra.job.env_set.LD_PRELOAD='/runs/other/x.so' changes"),
    # probe 12, g29b: two nodes and no launcher: rank 0 waited for node 1 forever, deaf to SIGTERM
    ({}, ["trainer=ddp_cpu", "trainer.devices=1", "trainer.num_nodes=2"],
     "trainer.num_nodes=2 needs a launcher that starts the run's processes on every node"),
    # probe 12, g105: a port another process listens on (this test's, below) was a traceback after the run dir
    ({"MASTER_PORT": "{busy}"}, ["trainer=ddp_cpu", "trainer.devices=2"],
     "environment variable MASTER_PORT={busy} cannot be opened"),
    # probe 12, g4: exported but empty
    ({"MASTER_ADDR": ""}, ["trainer=ddp_cpu", "trainer.devices=2"],
     "environment variable MASTER_ADDR is set but empty; valid: unset MASTER_ADDR"),
    # probe 13, i1: HOME (git's config, whose fsmonitor command the job's git ran) or a cache dir of compiled code
    ({}, ["+hydra.job.env_set.HOME=/runs/other"], "hydra.job.env_set.HOME='/runs/other' is not a variable a job may"
     " set"),
    ({}, ["+hydra.job.env_set.TORCHINDUCTOR_CACHE_DIR=/runs/other"], "hydra.job.env_set.TORCHINDUCTOR_CACHE_DIR="),
    ({}, ["+hydra.job.env_set.WANDB_DIR=/runs/other"], "hydra.job.env_set.WANDB_DIR='/runs/other' is not a variable"),
    # probe 14, k2: a library setting whose name says no path, but which takes one: torch opened a log file there
    ({}, ["+hydra.job.env_set.TORCH_LOGS_OUT=/runs/other/torch.log"],
     "hydra.job.env_set.TORCH_LOGS_OUT='/runs/other/torch.log' names a path"),
    ({}, ["+hydra.job.env_set.NCCL_DEBUG='~/x'"], "hydra.job.env_set.NCCL_DEBUG='~/x' names a path"),
    # probe 14, k57: a value torch refuses at import, in each DDP worker, with a traceback after the run dir
    ({}, ["trainer=ddp_cpu", "trainer.devices=2", "+hydra.job.env_set.TORCH_DISTRIBUTED_DEBUG=bogus"],
     "hydra.job.env_set.TORCH_DISTRIBUTED_DEBUG='bogus' is not a value torch reads; valid: OFF, INFO, DETAIL"),
    # probe 14, k43: an interface that does not exist: gloo's assertion, a traceback after the run dir
    ({}, ["trainer=ddp_cpu", "trainer.devices=2", "+hydra.job.env_set.GLOO_SOCKET_IFNAME=bogus0"],
     "GLOO_SOCKET_IFNAME=bogus0 names no network interface of this machine ('bogus0'): the run's processes could"
     " not open their process group; valid: one of lo"),
    ({"NCCL_SOCKET_IFNAME": "=l"}, ["trainer=ddp_cpu", "trainer.devices=2"],
     "NCCL_SOCKET_IFNAME==l names no network interface of this machine ('=l')"),
    # probe 13, i30: an address of another host (left from a cluster shell): every rank waited to connect there
    ({"MASTER_ADDR": "192.0.2.1"}, ["trainer=ddp_cpu", "trainer.devices=2"],
     "environment variable MASTER_ADDR=192.0.2.1 is not an address of this machine"),
    # probe 13, i5: a blank after the host: torch's rendezvous looked up "localhost " forever, deaf to SIGTERM
    ({"MASTER_ADDR": "localhost "}, ["trainer=ddp_cpu", "trainer.devices=2"],
     "environment variable MASTER_ADDR='localhost ' has a blank around it"),
    # probe 13, i3: the SLURM launcher starts a sweep's jobs, never a single run's second node (a hang); a
    # launcher without -m is never used at all
    ({}, ["hydra/launcher=slurm", "trainer=ddp_cpu", "trainer.devices=1", "trainer.num_nodes=2"],
     "hydra/launcher=slurm sets the launcher of a multirun, and without one a single run starts"),
    # probe 13, i26: a one-task sbatch job with trainer.devices=2: Lightning refused it after the run dir
    ({"SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_ID": "7", "SLURM_PROCID": "0",
      "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_NAME": "job.sh"}, ["trainer=ddp_cpu", "trainer.devices=2"],
     "this SLURM job's tasks do not match the run: You set devices=2 in Lightning, but the number of tasks per node"
     " configured in SLURM --ntasks-per-node=1 does not match"),
    # probe 10, C143: sbatch --ntasks=2, train.py started without srun: Lightning refused it inside the job
    ({"SLURM_JOB_ID": "123", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NAME": "train"}, [],
     "environment variable SLURM_NTASKS=2 without SLURM_NTASKS_PER_NODE: Lightning refuses this SLURM job (You set"
     " --ntasks=2 in your SLURM bash script"),
])
def test_a_launch_variable_nobody_launched_is_one_line_before_the_run_dir(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, variables: dict[str, str],
        args: list[str], named: str) -> None:
    """Probe 9, A5-A7: a rank variable left in the environment (RANK=1, SLURM_PROCID=1) made the job a DDP worker
    whose parent does not exist: no line (A5), or a trained run without records and a traceback (A6); LOCAL_RANK
    given to a two-process run made Lightning wait for processes nobody starts, a hang (A7)."""
    import socket

    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        for name, value in variables.items():
            monkeypatch.setenv(name, value.replace("{busy}", port))
        runs = tmp_path / "runs"
        line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={runs}", "run_name=r", *args], capsys,
                                            monkeypatch)
    assert line.startswith(f"error: {named.replace('{busy}', port)}"), line
    assert "valid:" in line and not runs.exists()


@pytest.mark.parametrize(("args", "named"), [
    (["trainer=cpu,ddp_cpu"], "trainer=ddp_cpu"),  # probe 12, g109: a grid over trainers
    # g16b: a sweep config's params, whose further values each carry the swept trainer (the first: a row's preset)
    (["sweep=where_mini", "seed=0", "+hydra.sweeper.params.trainer=ddp_cpu"], r"rpe\.preset=\w+"),
])
def test_a_launch_variable_is_judged_for_every_job_of_a_sweep(
        args: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 12, g16b and g109: a sweep whose jobs become DDP runs only through a swept value was checked on its
    first job's composition (one process, no rendezvous), so every job failed on MASTER_PORT=abc after its dir."""
    monkeypatch.setenv("MASTER_PORT", "abc")
    line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={tmp_path}", "-m", *args,
                                         f"hydra.sweep.dir={tmp_path}/sw"], capsys, monkeypatch)
    assert re.match(f"error: the sweep's job with {named}: environment variable MASTER_PORT=abc is not a port number;"
                    " valid: 1-65535", line), line
    assert list(tmp_path.iterdir()) == []


def test_a_swept_option_whose_composition_fails_names_its_job(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 15, m107: ``experiment=glob(swin*)`` expands to the micro and the ImageNet recipes; the key the latter
    lack was refused without saying which job it was about."""
    line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={tmp_path}", "-m", "experiment=glob(swin*)",
                                         "data.generator.num_train=64", f"hydra.sweep.dir={tmp_path}/sw"],
                                        capsys, monkeypatch)
    assert line.startswith("error: the sweep's job with experiment=swin_tiny_irpe_k: data.generator.num_train is not a"
                           " config key: data.generator is null or empty in this config"), line
    assert list(tmp_path.iterdir()) == []


def test_env_set_takes_the_settings_of_the_libraries_a_run_uses() -> None:
    """What a researcher sets for a job (threads, devices, NCCL's network, the tracker) is taken; what names a file or
    folder, or anything outside those families, is not (probe 13, i1)."""
    allowed = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME", "NCCL_DEBUG",
               "PYTORCH_CUDA_ALLOC_CONF", "TORCH_DISTRIBUTED_DEBUG", "WANDB_PROJECT", "TMPDIR", "RPE_DATA_DIR")
    refused = ("HOME", "XDG_CONFIG_HOME", "TORCH_HOME", "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH",
               "NCCL_DEBUG_FILE", "WANDB_DIR", "GIT_DIR", "MPLCONFIGDIR", "RPE_DDP_WORKER_CONFIG")
    assert all(cli.env_set_allowed(name) for name in allowed)
    assert not any(cli.env_set_allowed(name) for name in refused)


def test_interfaces_of_this_machine_pass_for_gloo_and_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Names as the libraries read them: gloo each listed name, NCCL a name's beginning, ``=`` a whole name, ``^``
    an exclusion (not judged)."""
    for variable, value in [("GLOO_SOCKET_IFNAME", "lo"), ("NCCL_SOCKET_IFNAME", "l"), ("NCCL_SOCKET_IFNAME", "=lo"),
                            ("NCCL_SOCKET_IFNAME", "bogus,lo"), ("NCCL_SOCKET_IFNAME", "^bogus")]:
        monkeypatch.setenv(variable, value)
        cli._check_interface_variables()
        monkeypatch.delenv(variable)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo,bogus0")
    with pytest.raises(cli.CommandLineError, match=r"^GLOO_SOCKET_IFNAME=lo,bogus0 names no network interface of this"
                                                   r" machine \('bogus0'\)"):
        cli._check_interface_variables()


def test_rank_0_of_a_one_process_run_is_what_it_would_be_anyway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """LOCAL_RANK=0 (an interactive SLURM shell's SLURM_PROCID=0) with one process: nothing to refuse."""
    from hydra import compose, initialize_config_dir

    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("SLURM_PROCID", "0")
    with initialize_config_dir(str(cli.CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["debug=fast"], return_hydra_config=True)
    cli.refuse_launch_variables(cfg)


@pytest.mark.parametrize(("args", "expected"), [
    (["--cfg", "job", "--resolve", "hydra.runtime.choices.rpe=shaw"],
     "error: hydra.runtime.choices.rpe=shaw sets hydra.runtime.choices.rpe, which Hydra fills in itself from the"
     " command line (what it records of the run), not a setting; valid: rpe=shaw"),
    (["+hydra.runtime.choices.rpe=shaw"], "error: +hydra.runtime.choices.rpe=shaw sets hydra.runtime.choices.rpe,"),
    (["hydra.job.num=3"], "error: hydra.job.num=3 sets hydra.job.num, which Hydra fills in itself"),
])
def test_a_key_hydra_fills_in_itself_is_one_line_also_when_printing(args: list[str], expected: str, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 9, A71: ``--cfg job hydra.runtime.choices.rpe=shaw`` was Hydra's 6-line message and exit 1, whose advice
    (``+hydra.runtime...``) printed and trained with the real choice, the setting silently ignored."""
    line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={tmp_path}", *args], capsys, monkeypatch)
    assert line.startswith(expected), line
    assert list(tmp_path.iterdir()) == []


def test_a_relative_data_root_in_a_sweep_whose_jobs_chdir_is_one_line_before_the_sweep_dir(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 9, A17: with ``hydra.job.chdir=true`` a sweep's relative data root was checked from the launch dir,
    and each job then refused it as inside its own run dir, after the sweep dir and a failed job dir were made."""
    monkeypatch.chdir(tmp_path)
    line = _refused_by_the_command_line(["debug=fast", "-m", "seed=0", "data.root=d17", "hydra.job.chdir=true",
                                         f"hydra.sweep.dir={tmp_path}/sw17"], capsys, monkeypatch)
    assert line.startswith("error: data.root='d17' is relative, and hydra.job.chdir=true makes each sweep job's"
                           " working dir its own run dir"), line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["--check", "+experiment=quickstart"], ["--cfg", "job", "+experiment=quickstart"],
                                  ["+rpe=irpe_qkv"]])
def test_adding_a_group_the_defaults_already_hold_is_one_line_with_the_spelling_that_works(
        args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 9, A87: ``+experiment=quickstart`` (experiment's default is null) was Hydra's "Multiple values for
    experiment. To override a value use 'override experiment: quickstart'", defaults-list syntax."""
    line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={tmp_path}", *args], capsys, monkeypatch)
    choice = args[-1]
    assert line.startswith(f"error: {choice} adds a second {choice[1:].split('=')[0]} choice"), line
    assert line.endswith(f"valid: {choice[1:]} (without '+')"), line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("swept", ["hydra.sweep.dir={sw}a,{sw}b", "hydra.sweep.subdir=ja,jb",
                                   "+hydra.job.env_set.RPE_DATA_DIR={sw}x,{sw}y"])
def test_several_values_for_a_setting_of_hydras_own_are_one_line_before_any_dir(
        swept: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 9, A62, A93, A101: Hydra refused a sweep over its own settings after the sweep dir was made (exit 1,
    an empty sweep dir left), or took the sweep dir's first value without a word."""
    arg = swept.format(sw=f"{tmp_path}/sw")
    line = _refused_by_the_command_line(["-m", "seed=0", "debug=fast", arg, f"hydra.sweep.dir={tmp_path}/sw0"]
                                        if "sweep.dir" not in arg else ["-m", "seed=0", "debug=fast", arg],
                                        capsys, monkeypatch)
    key = arg.split("=", 1)[0].lstrip("+")
    assert line.startswith(f"error: {arg} gives {key} several values, but Hydra's own settings hold one value"), line
    assert list(tmp_path.iterdir()) == []


def test_the_interruption_line_is_rank_zeros_and_said_once(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture) -> None:
    """Probe 9, A124: Ctrl-C to a DDP run printed three lines: rank 0's twice (the child-process observer and the
    job) and the worker's "interrupted before its job began", which was untrue."""
    import signal

    from lightning.pytorch.utilities import rank_zero_only

    from lifecycle import job
    from lifecycle.command import command_scope

    with command_scope():
        monkeypatch.setattr(rank_zero_only, "rank", 1)
        job._say_interruption_once(None, signal.SIGINT)
        assert capsys.readouterr().err == ""
        monkeypatch.setattr(rank_zero_only, "rank", 0)
        job._say_interruption_once(Path("/runs/r"), signal.SIGINT)
        job._say_interruption_once(Path("/runs/r"), signal.SIGINT)
    assert capsys.readouterr().err.splitlines() == [
        "error: run interrupted (/runs/r) by SIGINT; no checkpoint yet, rerun the same command to resume"]


def test_a_runs_name_says_the_encoding_it_trains() -> None:
    """Probe 9, B34: ``rpe=irpe_qkv rpe.preset=rpe-1.9-product-ctx-1-k`` trained iRPE-K under the name (and run dir,
    and table label) ``deit_micro_irpe_qkv``. The name is the model option and the preset; every rpe option's
    preset is its own name, so a plain choice keeps the name it had."""
    import yaml
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    for option in cli.group_options("rpe"):
        assert yaml.safe_load((cli.CONFIG_DIR / "rpe" / f"{option}.yaml").read_text())["preset"] == option
    with initialize_config_dir(str(cli.CONFIG_DIR), version_base="1.3"):
        for overrides, name in ((["rpe=irpe_qkv", "rpe.preset=rpe-1.9-product-ctx-1-k"],
                                 "deit_micro_rpe-1.9-product-ctx-1-k"),
                                (["rpe=shaw"], "deit_micro_shaw"),
                                (["model=swin_micro", "rpe=swin"], "swin_micro_swin")):
            cfg = compose("train", overrides=overrides, return_hydra_config=True)
            HydraConfig.instance().set_config(cfg)
            assert cfg.name == name


@pytest.mark.parametrize("sweep", [True, False])
def test_an_unset_variable_in_a_value_is_one_line_before_any_dir(sweep: bool, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 9, A132: ``-m 'seed=${oc.env:S132}'`` with S132 unset passed the command line's check (so did
    ``--check``); the sweep dir and a job dir were made, and the job failed on it."""
    monkeypatch.delenv("S132", raising=False)
    args = ["-m", f"hydra.sweep.dir={tmp_path}/sw"] if sweep else [f"paths.log_dir={tmp_path}/runs"]
    line = _refused_by_the_command_line(["debug=fast", "seed=${oc.env:S132}", *args], capsys, monkeypatch)
    assert line == ("error: seed=${oc.env:S132} reads environment variable S132, which is not set; valid: set it"
                    " (export S132=...), give a default (${oc.env:S132,<default>}) or give the value itself")
    assert list(tmp_path.iterdir()) == []


def test_a_log_level_may_be_set_and_a_bad_one_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 9, A152: ``hydra.job_logging.root.level=DEBUG`` was refused for changing the logging option's handlers
    and files, which a level does not touch."""
    from hydra import compose, initialize_config_dir

    args = ["debug=fast", f"paths.log_dir={tmp_path}", "run_name=r"]
    monkeypatch.setenv("C11LVL", "DEBUG")  # probe 10, C11: a level through the environment
    for level in ("hydra.job_logging.root.level=DEBUG", "hydra.job_logging.root.level=10",
                  "hydra.job_logging.root.level=${oc.env:C11LVL}"):
        with initialize_config_dir(str(cli.CONFIG_DIR), version_base="1.3"):
            cfg = compose("train", overrides=[*args, level], return_hydra_config=True)
        cli.refuse_locked_hydra_settings(cfg, "train", [*args, level])
    for bad in ("LOUD", "debug"):  # probe 10, C94: logging knows its level names in capitals only
        line = _refused_by_the_command_line([*args, f"hydra.job_logging.root.level={bad}"], capsys, monkeypatch)
        assert line.startswith(f"error: hydra.job_logging.root.level={bad!r} is not a logging level; valid: one of")
        assert "DEBUG" in line and not (tmp_path / "r").exists()
    # probe 10, C93: a level for a handler the option does not have made Hydra's logging setup fail (a traceback,
    # an empty run dir): it adds a handler, which the logging option's own rule refuses
    line = _refused_by_the_command_line([*args, "+hydra.job_logging.handlers.file.level=DEBUG"], capsys, monkeypatch)
    assert line.startswith("error: hydra.job_logging.handlers.file.level='DEBUG' changes the logging option"), line
    assert not (tmp_path / "r").exists()


def test_a_single_runs_row_never_names_another_encoding_than_it_trains(tmp_path: Path) -> None:
    """Probe 10, C64r: ``name=deit_micro_shaw`` on an iRPE-K run put its number in a row labelled with Shaw's
    encoding. A single run's row is its name where that ends in the encoding it trains, else says what it trains."""
    from reports.layouts import LAYOUTS, run_label

    assert run_label({"name": "deit_micro_irpe_k", "preset": "irpe_k"}) == "deit_micro_irpe_k"
    assert run_label({"name": "deit_micro_shaw", "preset": "irpe_k"}) == "deit_micro_shaw (trains irpe_k)"
    assert run_label({"name": "deit_base_baseline", "preset": "none"}) == "deit_base_baseline (trains none)"
    assert LAYOUTS["runs"].row({"name": "deit_micro_shaw", "preset": "irpe_k"}) == "deit_micro_shaw (trains irpe_k)"


def test_a_jobs_name_may_be_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 10, D71: ``hydra.job.name`` is Hydra's documented way to name a job (its log file); the check of keys
    Hydra fills in itself refused it, and with it every DDP worker, whose parent names it (C14b, D47c)."""
    cli.check_command(["debug=fast", f"paths.log_dir={tmp_path}", "run_name=r", "hydra.job.name=myexp"], "train",
                      make=False)
    # probe 10, D106: eval.py's DDP worker, as Lightning's launcher starts it (its parent's command line, then these)
    monkeypatch.setenv("LOCAL_RANK", "1")
    cli.check_command(["ckpt_path=/r/checkpoints/best.ckpt", "trainer=ddp_cpu", "trainer.devices=2",
                       f"hydra.run.dir={tmp_path}", "hydra.job.name=train_ddp_process_1", "hydra.output_subdir=null"],
                      "eval", make=False)


def test_an_interpolation_loop_is_one_line_naming_the_setting(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 10, C107: ``run_name=${hydra:job.override_dirname}`` (which lists run_name's own override) was
    OmegaConf's "RecursionError raised while resolving interpolation", naming neither run_name nor a fix."""
    line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={tmp_path}",
                                         "run_name=${hydra:job.override_dirname}"], capsys, monkeypatch)
    assert line == ("error: run_name=${hydra:job.override_dirname} reads hydra.job.override_dirname, whose value reads"
                    " it back (an interpolation loop: hydra.job.override_dirname is made from the command line's"
                    " overrides); valid: give the value itself")
    assert list(tmp_path.iterdir()) == []


def test_an_encoding_whose_tables_cannot_fit_in_memory_is_one_line_before_the_run_dir(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 11, F26b: ``rpe=t5 rpe.num_buckets=100000000 rpe.max_distance=1000000000`` passed ``--check``; the run
    made its dir and failed with torch's "can't allocate 160000000000000016 bytes", naming no setting. The model's
    tensors are counted on the meta device against the machine's memory."""
    runs = tmp_path / "runs"
    line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={runs}", "run_name=r", "rpe=t5",
                                         "rpe.num_buckets=100000000", "rpe.max_distance=1000000000"], capsys,
                                        monkeypatch)
    assert line.startswith("error: the model's weights and buffers would take "), line
    assert "the largest, blocks.0.attn.rpe_k.lookup_table_bias of shape (4, 10000000000000001)" in line
    assert "valid: settings whose tables fit" in line and not runs.exists()


def test_a_temp_dir_inside_a_sweep_dir_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 13, i2: ``TMPDIR=<another sweep's dir>`` left the DDP workers' config folders there, which that sweep's
    tables then listed as unfinished runs of it."""
    import tempfile

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    monkeypatch.setattr(tempfile, "tempdir", str(sweep))
    line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={tmp_path / 'runs'}", "run_name=r"], capsys,
                                        monkeypatch)
    assert line.startswith(f"error: TMPDIR='{sweep}' is inside the sweep dir {sweep}, whose folders are its"
                           " jobs'"), line
    assert not (tmp_path / "runs").exists()


def test_the_early_temp_dir_check_knows_the_markers_the_destination_rule_knows() -> None:
    """`starting` runs before any import of the project, so it names the markers itself: they are the ones the one
    rule for destinations reads (a run's record, a sweep's grid, a data root's, an archive's and the test sets' data
    folder's markers)."""
    import starting
    from storage.destinations import ARCHIVE_MARKER, DATA_MARKER, SWEEP_GRID, TESTSETS_MARKER
    from storage.run_dir import RUN_RECORD

    grids = [name for name in starting._MARKED if SWEEP_GRID.fullmatch(name)]
    assert set(starting._MARKED) == {RUN_RECORD, DATA_MARKER, ARCHIVE_MARKER, TESTSETS_MARKER, *grids}
    assert grids == ["multirun.yaml"]


@pytest.mark.parametrize("marker", ["run.json", "multirun.yaml", ".complete.json", ".archive.json", "train/0_E/0.png"])
def test_a_temp_dir_among_results_ends_a_script_before_its_imports(marker: str, tmp_path: Path) -> None:
    """Probe 13, i10: Lightning's import makes torch's cache folder in the temp dir, before any check ran: a refused
    command left one in a test set's root. Every entry point checks the temp dir first, with the standard library."""
    import subprocess

    held = tmp_path / "held"
    (held / "sub").mkdir(parents=True)
    (held / marker).parent.mkdir(parents=True, exist_ok=True)
    (held / marker).write_text("{}")
    if marker.startswith("train/"):  # hand data, no marker: its layout tells (probe 13, j118)
        (held / "val").mkdir()
        held = held / "val"
        (held / "sub").mkdir()
    for script in ("train.py", "eval.py", "scripts/make_tables.py"):
        result = subprocess.run([sys.executable, str(cli.CONFIG_DIR.parent / script)], capture_output=True,
                                text=True, env={**os.environ, "TMPDIR": str(held / "sub")}, timeout=60)
        assert result.returncode == 2 and result.stderr.startswith(f"error: TMPDIR='{held / 'sub'}' lies in the "), \
            result.stderr[-2000:]
        assert len(result.stderr.strip().splitlines()) == 1
        assert not any(p.name.startswith("torch") for p in (tmp_path / "held").rglob("*"))  # nothing made there


@pytest.mark.parametrize(("how", "script"), [("environment", "train"), ("env_set", "train"),
                                            ("environment", "eval")])  # eval.py takes no env_set at all
def test_a_temp_dir_inside_another_run_is_one_line_before_the_run_dir(how: str, script: str, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 12, g12 and g102: ``TMPDIR=<another run's dir>`` (or ``+hydra.job.env_set.TMPDIR=``) had the DDP
    workers' config folders and torch's caches written into that run, and one left behind. eval.py too."""
    import tempfile

    other = tmp_path / "other"
    (other / "checkpoints").mkdir(parents=True)
    (other / "run.json").write_text('{"state": "finished"}')
    (other / "config.yaml").write_text("seed: 0\n")
    args = (["debug=fast", f"paths.log_dir={tmp_path / 'runs'}", "run_name=r"] if script == "train" else
            [f"ckpt_path={tmp_path}/runs/r/checkpoints/best.ckpt"])
    if how == "environment":
        monkeypatch.setattr(tempfile, "tempdir", str(other))
    else:
        args.append(f"+hydra.job.env_set.TMPDIR={other}")
    line = _refused_by_the_command_line(args, capsys, monkeypatch, config_name=script)
    what = "TMPDIR" if how == "environment" else "hydra.job.env_set.TMPDIR"
    assert line.startswith(f"error: {what}='{other}' is the run dir {other}, whose files are that run's"), line
    assert line.endswith(f"(the temp dir, {other}: set TMPDIR to a folder of its own)")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("sweep", "temp", "kind", "made"), [
    (False, "${hydra:runtime.output_dir}", "run dir", "runs/r"),
    (False, "${hydra:runtime.output_dir}/tmp", "run dir", "runs/r"),
    (True, "${hydra:sweep.dir}", "sweep dir", "sw"),
    (True, "${hydra:runtime.output_dir}", "sweep dir", "sw"),
])
def test_a_temp_dir_in_the_commands_own_output_dir_is_one_line_before_it_is_made(
        sweep: bool, temp: str, kind: str, made: str, tmp_path: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 16, o58-o60: ``hydra.job.env_set.TMPDIR`` naming the run dir or sweep dir this command makes (by
    Hydra's interpolations) passed every check; a DDP worker then refused it after the parent had made the run
    dir. It is judged as the job resolves it, before the dir exists."""
    args = ["debug=fast", f"paths.log_dir={tmp_path / 'runs'}", f"+hydra.job.env_set.TMPDIR={temp}"]
    args += ["-m", "seed=0,1", f"hydra.sweep.dir={tmp_path / 'sw'}"] if sweep else ["run_name=r"]
    line = _refused_by_the_command_line(args, capsys, monkeypatch)
    own = tmp_path / made
    assert re.match(rf"^error: hydra\.job\.env_set\.TMPDIR='{re.escape(str(own))}(/\w+)?' lies in this command's"
                    rf" {kind} {re.escape(str(own))}, which holds .* only, and torch and Lightning write their"
                    r" caches into the temp dir as they start; valid: a folder of its own outside it \(e\.g\. /tmp\)$",
                    line), line
    assert not own.exists()


def test_a_temp_dir_beside_the_sweep_dir_is_not_in_it(tmp_path: Path) -> None:
    """The check compares folders, not text: ``<sweep dir>-tmp`` (a sibling sharing its name's start) is fine."""
    from lifecycle.cli import _within

    sweep = str(tmp_path / "sw")
    assert _within(str(tmp_path / "sw" / "0"), sweep) and _within(sweep, sweep)
    assert not _within(str(tmp_path / "sw-tmp"), str(tmp_path / "sw"))
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert _within(str(tmp_path / "link" / "t"), str(tmp_path / "real"))


@pytest.mark.parametrize(("data_dir", "below"), [("${hydra:sweep.dir}/data", "data"),
                                               ("${hydra:runtime.output_dir}/../data", "0/../data")])
def test_generated_data_in_the_sweep_dir_this_command_makes_is_one_line_before_it(
        data_dir: str, below: str, tmp_path: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 16, o75: ``hydra.job.env_set.RPE_DATA_DIR=${hydra:sweep.dir}/data`` generated the data set inside the
    new sweep dir (one inside a run dir was refused)."""
    monkeypatch.delenv("RPE_DATA_DIR", raising=False)
    sweep = tmp_path / "sw"
    line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={tmp_path / 'runs'}", "-m", "seed=0",
                                         f"hydra.sweep.dir={sweep}", f"+hydra.job.env_set.RPE_DATA_DIR={data_dir}"],
                                        capsys, monkeypatch)
    assert line == (f"error: data.root='{sweep}/{below}/relational_v2' is inside the sweep dir {sweep}, whose files are"
                    " its jobs'; valid: a folder outside every run dir and sweep dir"), line
    assert not sweep.exists()


@pytest.mark.parametrize("data_root", ["${hydra:runtime.output_dir}/../../a${seed}/sw/gen",
                                       "ROOT/a${hydra:job.num}/sw/gen"], ids=["job_dir", "job_num"])
def test_each_swept_job_is_judged_in_its_own_dir(data_root: str, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 18, r30b: every further value of a sweep was judged in job 0's dir (``sweep/0``, hydra.job.num
    unset), so a data root read from the job's dir or number was judged at another job's, and the line showed job
    0's path under job 1's name. Job n (the basic sweeper's order) is judged in ``sweep/n``, with its number; a
    seed whose only change is the job's dir is still judged (never by its type alone)."""
    archive = tmp_path / "a2" / "sw"  # only job 2 (seed=2) would generate its data inside an archive
    archive.mkdir(parents=True)
    (archive / ".archive.json").write_text("{}")
    sweep = tmp_path / "sw"
    line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={tmp_path / 'runs'}", "-m", "seed=0,1,2",
                                         f"hydra.sweep.dir={sweep}",
                                         f"data.root={data_root.replace('ROOT', str(tmp_path))}"], capsys, monkeypatch)
    shown = f"{sweep}/2/../../a2/sw/gen" if "output_dir" in data_root else f"{archive}/gen"
    assert line == (f"error: the sweep's job with seed=2: data.root='{shown}' is inside the archive {archive}, which"
                    " keeps finished runs' records: no place for data; valid: a folder outside every archive"), line
    assert not sweep.exists()


def test_a_swept_jobs_number_is_its_place_in_the_basic_sweepers_grid() -> None:
    """The job a line checks (`_job_strides`): Hydra's grid (`sweep_grid`), params first, a key of both in the
    params' place with the command line's values."""
    from lifecycle.cli import _job_strides, _swept_lines, sweep_grid, sweep_overrides

    params = {"lr": "0.1,0.2", "seed": "0,1"}
    overrides = ["seed=5,6,7", "+x=a,b"]
    swept, whole = sweep_overrides(params, overrides)
    grid = sweep_grid([*(f"{k}={v}" for k, v in params.items()), *overrides])
    strides = _job_strides(params, overrides)
    for _, value, _, index in _swept_lines(swept, whole):
        key = value.split("=", 1)[0]
        job = grid[index * strides[key]]
        assert value in job and all(o == entry for o, entry in zip(job, grid[0], strict=True) if not o.startswith(
            f"{key}=")), (value, job)


@pytest.mark.parametrize(("profiler", "line"), [
    ("{_target_:lightning.pytorch.profilers.SimpleProfiler,dirpath:OTHER,filename:p}",
     "trainer.profiler.dirpath=OTHER lies outside the run's dir (RUN): a profiler writes only into its own run's dir;"
     " valid: a folder inside it, e.g. trainer.profiler.dirpath=${paths.output_dir}/profiler"),
    ("{_target_:lightning.pytorch.profilers.AdvancedProfiler,filename:../../p}",
     "trainer.profiler.filename=../../p is a path, not a file name: the report would land outside the profiler's"
     " folder; valid: a name without '/', e.g. trainer.profiler.filename=profile"),
])
def test_a_profilers_files_stay_in_the_run_dir(profiler: str, line: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 17, q36: ``trainer.profiler={_target_: SimpleProfiler, dirpath: <a finished run>}`` wrote its reports
    (``fit-<filename>.txt``, ``test-<filename>.txt``) into that other run's dir."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "run.json").write_text('{"state": "finished"}')
    run = tmp_path / "runs" / "r"
    error = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={tmp_path / 'runs'}", "run_name=r",
                                          f"trainer.profiler={profiler.replace('OTHER', str(other))}"],
                                         capsys, monkeypatch)
    assert error == "error: " + line.replace("OTHER", str(other)).replace("RUN", str(run)), error
    assert sorted(p.name for p in other.iterdir()) == ["run.json"] and not run.exists()


@pytest.mark.parametrize("override", [
    "+trainer.callbacks=[{_target_:lightning.pytorch.callbacks.ModelCheckpoint,dirpath:/tmp/x,filename:qx}]",
    "+trainer.logger=false", "+trainer.plugins=[]"])
def test_trainer_arguments_the_job_builds_are_refused(override: str, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 17, q42: ``+trainer.callbacks=[...]`` was accepted and dropped without a word (the job passes its own
    callbacks, loggers and plugins to the Trainer)."""
    key = override.split("=", 1)[0].removeprefix("+trainer.")
    line = _refused_by_the_command_line(["debug=fast", f"paths.log_dir={tmp_path / 'runs'}", "run_name=r", override],
                                        capsys, monkeypatch)
    assert line.startswith(f"error: trainer.{key} is not a setting: the job builds the Trainer's {key} itself and"
                           " would drop this value without a word; valid: "), line
    assert not (tmp_path / "runs").exists()
