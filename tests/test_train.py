"""End-to-end: training learns the embedded task, eval reproduces it, resume, DDP, experiments."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import lightning as L
import pytest
import torch

import lifecycle.job as job
from tests.helpers import LEARNING_BUDGET, SMALL_RELATIONAL, compose_config, fit_only, run_cli

FAST = ["debug=fast", "logger=csv"]


def _metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """Micro DeiT with iRPE-K (the default) and the fixed sin-cos APE, 256 steps on 4096 relational-shapes images."""
    run_dir = tmp_path_factory.mktemp("trained")
    cfg = compose_config(
        [*SMALL_RELATIONAL, *LEARNING_BUDGET, "callbacks=none", "print_config=false"], run_dir, data_dir
    )
    job.run(cfg)
    return run_dir


@pytest.mark.slow  # 256 training steps (the trained_run fixture)
def test_training_learns_the_relational_task(trained_run: Path) -> None:
    metrics = _metrics(trained_run)
    assert metrics["val/top1"] > 60.0, metrics  # chance is 12.5%
    assert metrics["val/top5"] >= metrics["val/top1"]
    for name in ("config.yaml", "metrics.json", "csv/version_0/metrics.csv", "checkpoints/last.ckpt",
                 "checkpoints/best.ckpt"):
        assert (trained_run / name).is_file(), name


@pytest.mark.slow  # 256 training steps
def test_without_any_position_encoding_the_task_stays_at_chance(tmp_path: Path, data_dir: Path) -> None:
    """The same budget without APE or RPE: a permutation-invariant model, so it cannot beat chance."""
    cfg = compose_config(
        [*SMALL_RELATIONAL, *LEARNING_BUDGET, "callbacks=none", "print_config=false",
         "rpe=none", "model.net.ape=none"], tmp_path, data_dir,
    )
    metrics = job.run(cfg)
    assert metrics["val/top1"] < 20.0, metrics


@pytest.mark.slow  # needs the trained_run fixture (256 steps)
def test_eval_reproduces_stored_metrics(trained_run: Path, data_dir: Path) -> None:
    import eval as eval_script

    cfg = compose_config([f"ckpt_path={trained_run / 'checkpoints' / 'best.ckpt'}"], trained_run / "eval",
                         data_dir, config_name="eval")
    recomputed = eval_script.evaluate(cfg)
    stored = _metrics(trained_run)
    assert recomputed["val/top1"] == pytest.approx(stored["val/top1"], abs=1e-4)
    assert recomputed["val/top5"] == pytest.approx(stored["val/top5"], abs=1e-4)
    assert recomputed["params_M"] > 0.5 and recomputed["MACs_M"] > 1 and recomputed["throughput_img_s"] > 0


class _Preempted(RuntimeError):
    pass


class _PreemptAt(L.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            raise _Preempted(f"simulated preemption at step {self.step}")


class _RecordStart(L.Callback):
    def on_train_start(self, trainer, *args) -> None:
        self.start_step = trainer.global_step
        self.start_lr = trainer.optimizers[0].param_groups[0]["lr"]


@pytest.mark.slow
def test_resume_continues_at_the_step_it_stopped(tmp_path: Path, data_dir: Path, monkeypatch) -> None:
    """A crash at step 6 (second epoch) resumes from last.ckpt of the first epoch's end (step 4).

    A crash may strike mid-step, so nothing is saved then: the resume point is the last periodic save.
    """
    overrides = [*SMALL_RELATIONAL, "trainer.max_epochs=2", "+trainer.limit_train_batches=4",
                 "+trainer.limit_val_batches=1", "callbacks=none", "print_config=false"]
    build = job.build_trainer
    extra: list[L.Callback] = [_PreemptAt(step=6)]

    def build_with(*args, **kwargs):
        trainer = build(*args, **kwargs)
        trainer.callbacks.extend(extra)
        return trainer

    monkeypatch.setattr(job, "build_trainer", build_with)
    with pytest.raises(_Preempted):
        job.run(compose_config(overrides, tmp_path, data_dir))
    assert not (tmp_path / "checkpoints" / "interrupted.ckpt").exists()

    recorder = _RecordStart()
    extra[:] = [recorder]
    metrics = job.run(compose_config(overrides, tmp_path, data_dir))
    assert recorder.start_step == 4
    assert metrics["global_step"] == 8


@pytest.mark.slow  # a step of every DeiT ImageNet experiment, DeiT-B's included
def test_experiment_configs_run_one_step(tmp_path: Path) -> None:
    """Every DeiT ImageNet experiment runs a train and a val step on a fake ImageFolder.

    At 64 px (a 4x4 patch grid) rather than 224, which keeps the step cheap on a CPU; the recipe, the
    model and its encoding are the experiment's own. The 14x14 grid of the real models is covered by
    tests/test_models.py.
    """
    from data import make_fake_imagefolder
    from tests.test_configs import _options

    root = tmp_path / "fake_imagenet"
    make_fake_imagefolder(root, num_classes=3, per_class=4, img_size=64, seed=0)
    experiments = [e for e in _options("experiment") if e.startswith("deit_")]
    assert len(experiments) >= 12
    for name in experiments:
        cfg = compose_config(
            [f"experiment={name}", f"data.root={root}", "trainer=cpu", "trainer.devices=1", *FAST, "data.batch_size=2",
             "data.img_size=64", "data.num_classes=null",
             "trainer.limit_train_batches=1", "trainer.limit_val_batches=1", "test_after_fit=false",
             # no checkpoints: DeiT-B's take 1.3 GB and most of its time here (saving is tested elsewhere)
             "callbacks=none", "callbacks.model_checkpoint=null", "callbacks.last_checkpoint=null",
             "+trainer.enable_checkpointing=false"],
            tmp_path / name, tmp_path,
        )
        metrics = fit_only(cfg)
        assert metrics["global_step"] == 1, name
        assert torch.isfinite(torch.tensor(metrics["train/loss"])), name


@pytest.mark.slow  # two spawned gloo processes
def test_ddp_spawn_two_cpu_processes(tmp_path: Path, data_dir: Path) -> None:
    cfg = compose_config(
        [*SMALL_RELATIONAL, *FAST, "trainer.devices=2", "+trainer.strategy=ddp_spawn",
         "trainer.limit_train_batches=3"], tmp_path, data_dir,
    )
    metrics = job.run(cfg)
    assert metrics["global_step"] == 3
    assert len(list(tmp_path.rglob("metrics.csv"))) == 1
    assert (tmp_path / "metrics.json").is_file()


@pytest.mark.slow  # train.py with two gloo processes
def test_ddp_cpu_cli_run(tmp_path: Path, data_dir: Path) -> None:
    result = run_cli("train.py", [
        "trainer=ddp_cpu", *FAST, *SMALL_RELATIONAL, "trainer.limit_train_batches=3",
        f"paths.log_dir={tmp_path}", "run_name=ddp", f"paths.data_dir={data_dir}",
    ])
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "ddp"
    metrics = _metrics(run_dir)
    assert metrics["global_step"] == 3
    # one log per run, written by rank zero only
    assert [p.relative_to(run_dir).as_posix() for p in run_dir.rglob("metrics.*")] in (
        ["metrics.json", "csv/version_0/metrics.csv"], ["csv/version_0/metrics.csv", "metrics.json"])
    assert "val/top1" in metrics

    # The re-test of a run whose metrics.json is gone: its DDP workers take the config this command composed,
    # never the run folder's config.yaml, which here names code to run (a callback and a Hydra callback).
    marker = tmp_path / "pwned"
    (run_dir / "metrics.json").unlink()
    config = run_dir / "config.yaml"
    tampered = config.read_text() + "\n".join([
        "", "hydra:", "  callbacks:", "    pwn2:", "      _target_: pathlib.Path.write_text",
        f"      self: {marker}2", "      data: x",
    ]) + "\n"
    tampered = tampered.replace("callbacks:\n", f"callbacks:\n  pwn:\n    _target_: pathlib.Path.write_text\n"
                                                f"    self: {marker}\n    data: x\n", 1)
    config.write_text(tampered)
    again = run_cli("train.py", [
        "trainer=ddp_cpu", *FAST, *SMALL_RELATIONAL, "trainer.limit_train_batches=3",
        f"paths.log_dir={tmp_path}", "run_name=ddp", f"paths.data_dir={data_dir}",
    ])
    assert not marker.exists() and not Path(f"{marker}2").exists(), again.stderr[-3000:]
    # the workers only test, as this process does (before, they fitted while it tested, and both waited forever);
    # debug=fast tests 2 batches per rank, which a re-test draws in another order, so the number may differ
    assert again.returncode == 0 and "val/top1" in _metrics(run_dir), again.stderr[-3000:]
    assert "re-testing" in again.stdout + again.stderr


@pytest.mark.slow  # train.py and eval.py with two gloo processes each
def test_a_ddp_evaluation_reads_each_image_of_an_odd_split_once(tmp_path: Path, data_dir: Path) -> None:
    """Probe cases 39-41: a padding sampler read 34 images of a 33-image val split over two ranks, so metrics.json
    held 4/34 as a complete result and a test set read "10 of 9". Now every evaluation over ranks gives the
    one-process numbers of the split, and a test set records each image read once."""
    import eval as eval_script

    run_dir = tmp_path / "ddp2"
    best = run_dir / "checkpoints" / "best.ckpt"
    result = run_cli("train.py", [
        "trainer=ddp_cpu", *FAST, f"data.root={tmp_path / 'rel33'}", "data.generator.num_train=64",
        "data.generator.num_val=33", "data.num_workers=0", "data.batch_size=16", "trainer.limit_val_batches=null",
        "trainer.limit_test_batches=null", f"paths.log_dir={tmp_path}", "run_name=ddp2", f"paths.data_dir={data_dir}",
    ])
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = _metrics(run_dir)
    one_process = eval_script.evaluate(compose_config([f"ckpt_path={best}"], tmp_path / "eval", data_dir,
                                                      config_name="eval"))
    assert metrics["test_complete"] is True
    assert metrics["val/top1"] == pytest.approx(one_process["val/top1"], abs=1e-4)
    assert metrics["val/top5"] == pytest.approx(one_process["val/top5"], abs=1e-4)
    assert metrics["val/loss"] == pytest.approx(one_process["val/loss"], rel=1e-5)  # the mean over all 33 images
    correct = metrics["val/top1"] * 33 / 100
    assert correct == pytest.approx(round(correct), abs=1e-3)  # a count of the 33 images (4/34 is not)

    testset = run_cli("eval.py", [f"ckpt_path={best}", "testset=val_at_48", "trainer=ddp_cpu", "throughput_batch=2",
                                  f"paths.data_dir={data_dir}"])
    assert testset.returncode == 0, testset.stderr[-3000:]
    # probe 7, A166: each rank printed its table, with a throughput of its own; rank 0 alone reports, and says whose
    plain = run_cli("eval.py", [f"ckpt_path={best}", "trainer=ddp_cpu", "throughput_batch=2",
                                f"paths.data_dir={data_dir}"])
    assert plain.returncode == 0, plain.stderr[-3000:]
    for output in (plain, testset):
        assert output.stdout.count("┏") == 1, output.stdout  # one table (rich's top-left corner)
        assert output.stdout.count("note: throughput_img_s is rank 0's alone: one process timing batches of 2 after"
                                   " the test, not a sum over the 2 ranks") == 1, output.stdout
    record = json.loads((run_dir / "testsets" / "val_at_48@interpolate.json").read_text())
    assert record["images_read"] == record["images_total"] == 33
    single = eval_script.evaluate(compose_config([f"ckpt_path={best}", "testset=val_at_48", "throughput_batch=2"],
                                                 tmp_path / "eval", data_dir, config_name="eval"))
    assert record["metrics"]["val/top1"] == pytest.approx(single["val/top1"], abs=1e-4)
    assert record["metrics"]["val/loss"] == pytest.approx(single["val/loss"], rel=1e-5)


@pytest.mark.slow  # train.py with two gloo processes
def test_a_failed_ddp_worker_is_a_failed_run(tmp_path: Path, data_dir: Path) -> None:
    """A worker that fails ends the run as a failed job, in one line and a record that says so; never as a
    parent killed by SIGKILL with its record left at "running"."""
    private_tmp = tmp_path / "tmp"  # where the workers' private config folder goes, and must go again
    private_tmp.mkdir()
    result = run_cli("train.py", [
        "trainer=ddp_cpu", *FAST, *SMALL_RELATIONAL, "trainer.limit_train_batches=3",
        f"paths.log_dir={tmp_path}", "run_name=ddp", f"paths.data_dir={data_dir}",
        "+callbacks.fail._target_=tests.faults.RaiseOnRank",
    ], env_extra={"TMPDIR": str(private_tmp)})
    assert result.returncode not in (0, -9, 137), result.stderr[-3000:]
    record = json.loads((tmp_path / "ddp" / "run.json").read_text())
    failure = json.loads((tmp_path / "ddp" / "failed.json").read_text())
    assert record["state"] == "failed" and failure["status"] == "failed", result.stderr[-3000:]
    assert [line for line in result.stderr.splitlines() if line.startswith("error: ")], result.stderr[-3000:]
    assert not list(private_tmp.glob("rpe-ddp-config-*"))  # removed although the parent ended by os._exit


@pytest.mark.slow  # train.py with two gloo processes
def test_a_ddp_worker_ended_by_a_stop_signal_is_an_interrupted_run(tmp_path: Path, data_dir: Path) -> None:
    """Probe 4 case 27: SIGTERM to the process group can end a worker still importing (no handlers yet) before
    the parent sees the signal; the run is then interrupted (exit 143, rerun to resume), never a failed one."""
    private_tmp = tmp_path / "tmp"  # where the workers' private config folder goes, and must go again
    private_tmp.mkdir()
    result = run_cli("train.py", [
        "trainer=ddp_cpu", *FAST, *SMALL_RELATIONAL, "trainer.limit_train_batches=3",
        f"paths.log_dir={tmp_path}", "run_name=ddp", f"paths.data_dir={data_dir}",
        "+callbacks.stop._target_=tests.faults.SignalOnRank",
    ], env_extra={"TMPDIR": str(private_tmp)})
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-3000:]
    record = json.loads((tmp_path / "ddp" / "run.json").read_text())
    assert record["state"] == "interrupted" and record["signal"] == "SIGTERM", record
    assert not (tmp_path / "ddp" / "failed.json").exists()
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors and "interrupted" in errors[-1] and "SIGTERM" in errors[-1], result.stderr[-3000:]
    assert not list(private_tmp.glob("rpe-ddp-config-*"))  # removed although the parent ended by os._exit


@pytest.mark.slow  # train.py with two gloo processes
@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM], ids=["SIGUSR1", "SIGTERM"])
def test_a_stop_signal_to_one_ddp_worker_stops_every_rank_together(tmp_path: Path, data_dir: Path,
                                                                   signum: signal.Signals) -> None:
    """Probe 13, i43: SIGUSR1 to worker rank 1 only made that rank stop alone while rank 0 waited for it in the next
    gradient all-reduce: a hang, deaf to SIGTERM. The ranks agree on a stop at each step's end: an interrupted run
    that resumes. Probe 15, m113r: SIGTERM hung the ranks also where it reached both, as Lightning's own SIGTERM
    handler broadcast from inside the handler, once per signal a rank received (rank 1 had two)."""
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    result = run_cli("train.py", [
        "trainer=ddp_cpu", *FAST, *SMALL_RELATIONAL, "trainer.limit_train_batches=6",
        f"paths.log_dir={tmp_path}", "run_name=ddp", f"paths.data_dir={data_dir}",
        "+callbacks.stop._target_=tests.faults.SignalRank", f"+callbacks.stop.signum={int(signum)}",
    ], env_extra={"TMPDIR": str(private_tmp)}, timeout=300)
    assert result.returncode == 128 + signum, result.stderr[-3000:]
    record = json.loads((tmp_path / "ddp" / "run.json").read_text())
    assert record["state"] == "interrupted" and record["signal"] == signum.name, record
    assert (tmp_path / "ddp" / "checkpoints" / "last.ckpt").is_file()
    assert not list(private_tmp.glob("rpe-ddp-config-*"))


@pytest.mark.slow  # a two-job train.py sweep
def test_multirun_honours_sweep_dir(tmp_path: Path, data_dir: Path) -> None:
    sweep = tmp_path / "sweep"
    result = run_cli("train.py", [
        "-m", "rpe=none,irpe_k", *FAST, *SMALL_RELATIONAL, "trainer.limit_train_batches=2",
        f"hydra.sweep.dir={sweep}", f"paths.data_dir={data_dir}",
    ])
    assert result.returncode == 0, result.stderr[-3000:]
    presets = [(sweep / str(n) / "config.yaml").read_text() for n in (0, 1)]
    assert "preset: none" in presets[0] and "preset: irpe_k" in presets[1]
    for n in (0, 1):
        assert _metrics(sweep / str(n))["global_step"] == 2


def test_orphaned_worker_config_folders_of_dead_parents_are_removed(tmp_path: Path, monkeypatch) -> None:
    """A DDP parent killed by SIGKILL leaves its workers' private config folder; the next DDP run removes the
    folders whose parent process no longer exists, and only those."""
    import subprocess
    import sys
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # its pid belongs to no process now (pids are not reused this soon)
    dead = tmp_path / f"rpe-ddp-config-{ended.pid}-ab12"
    alive = tmp_path / f"rpe-ddp-config-{os.getpid()}-cd34"
    unnamed = tmp_path / "rpe-ddp-config-xyz"  # no pid in its name (made by an older version): left alone
    for folder in (dead, alive, unnamed):
        folder.mkdir()
        (folder / "config.yaml").write_text("seed: 0\n")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep.txt").write_text("x")
    link = tmp_path / f"rpe-ddp-config-{ended.pid}-link"
    link.symlink_to(outside, target_is_directory=True)

    job._remove_orphaned_worker_configs()
    assert not dead.exists()
    assert alive.is_dir() and unnamed.is_dir() and (outside / "keep.txt").is_file() and link.is_symlink()


def test_the_launching_process_of_a_sweep_whose_jobs_run_elsewhere_says_a_sweep_was_interrupted(monkeypatch) -> None:
    """Probe 11, e76: SIGTERM to the process that launched a submitit_local sweep said "run interrupted before its
    job began", though its job (in a process of its own) had trained and saved its state."""
    import signal as signals

    from lifecycle.command import command_scope, current

    monkeypatch.setattr(job, "_is_multirun", lambda: False)  # no Hydra job in this process (one test may leave one)
    with command_scope():
        assert job._interruption_line(None, signals.SIGTERM).startswith(
            "error: run interrupted before its job began by SIGTERM")
        current().sweeping = True
        assert job._interruption_line(None, signals.SIGTERM) == (
            "error: sweep interrupted (a job in progress saves its state in its own run dir) by SIGTERM; rerun the"
            " same command to go on (finished jobs are not trained again)")
