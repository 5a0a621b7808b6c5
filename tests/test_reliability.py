"""Run lifecycle under faults: reruns, other configs, kill -9, SIGTERM/SIGUSR1, NaN, damaged files, W&B.

Each case runs the real ``train.py`` (a subprocess) on a few batches of the embedded data; faults are
real signals sent at a chosen step (``tests/faults.py``) or damaged files.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path

import pytest
import torch

from lifecycle import identity, job, records
from lifecycle.checkpoints import load_checkpoint
from models.training import AtomicCheckpointIO
from storage.files import atomic_write_json
from tests.helpers import SMALL_RELATIONAL, run_cli

TINY = ["debug=fast", "logger=csv", *SMALL_RELATIONAL, "trainer.limit_train_batches=3", "trainer.limit_val_batches=1"]
ENV = {"OMP_NUM_THREADS": "1"}


def _args(log_dir: Path, data_dir: Path, *extra: str) -> list[str]:
    """The tiny run's command line, ``extra`` in place of the base settings of the same keys."""
    return _replacing([*TINY, f"paths.log_dir={log_dir}", f"paths.data_dir={data_dir}"], *extra)


def _fingerprint(run_dir: Path) -> dict[str, str]:
    """Every file below ``run_dir`` (hidden ones too) and the SHA-1 of its bytes."""
    return {p.relative_to(run_dir).as_posix(): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def _replacing(args: list[str], *overrides: str) -> list[str]:
    """``args`` with ``overrides`` in place of the settings of the same keys (a key is given once)."""
    keys = {o.split("=", 1)[0] for o in overrides}
    return [a for a in args if a.split("=", 1)[0] not in keys] + list(overrides)


def _fault(step: int, marker: Path, signum: int) -> list[str]:
    return ["+callbacks.fault._target_=tests.faults.SignalAt", f"+callbacks.fault.step={step}",
            f"+callbacks.fault.marker={marker}", f"+callbacks.fault.signum={signum}"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> tuple[Path, list[str]]:
    """A finished 2-epoch run (the "victim"), and the command that made it."""
    log_dir = tmp_path_factory.mktemp("victim")
    args = _args(log_dir, data_dir, "run_name=victim", "trainer.max_epochs=2")
    result = run_cli("train.py", args, env_extra=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    return log_dir / "victim", args


# ----------------------------------------------------------------------------- run identity
@pytest.mark.slow
def test_another_config_never_writes_into_a_finished_run(finished_run) -> None:
    run_dir, args = finished_run
    state = json.loads((run_dir / "run.json").read_text())
    assert state["state"] == "finished"
    before = _fingerprint(run_dir)
    for _ in range(2):  # the second attempt used to "resume" from the first attempt's blank model
        result = run_cli("train.py", [*args, "rpe=irpe_qkv"], env_extra=ENV)
        assert result.returncode == 2
        [line] = _error_lines(result.stderr)
        assert "rpe.preset: irpe_k -> irpe_qkv" in line and "run_name" in line, line
        assert "Traceback" not in result.stderr
        assert _fingerprint(run_dir) == before  # not config.yaml, not .hydra/, not a checkpoint


@pytest.mark.slow
def test_a_run_dir_in_use_by_another_process_is_left_alone(finished_run) -> None:
    run_dir, args = finished_run
    before = _fingerprint(run_dir)
    held, _ = records.lock_run_dir(run_dir)  # this test process plays the first process
    try:
        with pytest.raises(records.RunDirBusy):  # the lock belongs to the open file, not to the process
            records.lock_run_dir(run_dir)
        result = run_cli("train.py", _replacing(args, "trainer.max_epochs=3"), env_extra=ENV)
    finally:
        os.close(held)
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = _error_lines(result.stderr)
    assert f"{run_dir} is in use by another process" in line and "run_name" in line, line
    assert "Traceback" not in result.stderr
    assert _fingerprint(run_dir) == before  # no failed.json, no run.json update, no checkpoint
    os.close(records.lock_run_dir(run_dir)[0])  # released with the fd


@pytest.mark.parametrize("held", [True, False])
def test_a_run_lock_hard_linked_to_another_runs_lock_is_named_as_such(held: bool, tmp_path: Path) -> None:
    """Probe 7, A64: a run.lock that is a hard link to a training run's lock was "in use by another process";
    the lock is one file under two names, shared with the other run whether or not it holds it now: named."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    fd, _ = records.lock_run_dir(first)
    os.link(first / "run.lock", second / "run.lock")
    if not held:
        os.close(fd)
    try:
        with pytest.raises(records.RunDirConflict) as err:
            records.lock_run_dir(second)
    finally:
        if held:
            os.close(fd)
    assert not isinstance(err.value, records.RunDirBusy)
    assert str(err.value) == (f"{second / 'run.lock'} is a hard link shared with another file (2 names of one file):"
                              " the lock would be shared with that file's run, which would then seem to hold this"
                              " one (or be held by it); nothing was written. Remove it (it holds no data: the run"
                              " makes its own)")
    assert sorted(p.name for p in second.iterdir()) == ["run.lock"]


@pytest.mark.slow
def test_a_finished_run_is_not_trained_again(finished_run) -> None:
    run_dir, args = finished_run
    before = _fingerprint(run_dir)
    result = run_cli("train.py", args, env_extra=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "is finished" in result.stdout
    assert _fingerprint(run_dir) == before  # checkpoints and metrics bit for bit


def test_an_unreadable_testsets_or_plots_folder_does_not_stop_a_rerun(finished_run, tmp_path: Path,
                                                                     data_dir: Path, capsys) -> None:
    """Probe 5, case 136: a finished run whose ``testsets/`` was at mode 000 could not be rerun or extended
    ("cannot read .../testsets: permission denied"), though training never reads it. The command line's check
    no longer looks into a run dir's test-set results and plots; every other folder it still does."""
    import shutil

    from lifecycle import cli
    from tests.helpers import ROOT, compose_config, file_modes_hold

    run_dir, args = finished_run
    copy = tmp_path / "victim"
    shutil.copytree(run_dir, copy)
    locked = [copy / "testsets", copy / "plots", copy / "notes"]
    for folder in locked:
        folder.mkdir(exist_ok=True)
        (folder / "x.json").write_text("{}\n")
    args = _replacing(args, f"paths.log_dir={tmp_path}")
    before = _fingerprint(copy)
    for folder in locked:
        folder.chmod(0)
    try:
        with file_modes_hold():
            for extra in ((), ("trainer.max_epochs=3",)):  # the rerun and the extension pass the command line
                with pytest.raises(records.RunFileError, match=f"^cannot read {copy / 'notes'}: permission denied"):
                    cli.check_overrides(_replacing(args, *extra), "train")  # a folder that may hold runs: named
                locked[2].chmod(0o755)
                cli.check_overrides(_replacing(args, *extra), "train")
                locked[2].chmod(0)
            capsys.readouterr()
            job.run_job(compose_config(args, copy, data_dir), ROOT / "train.py")
    finally:
        for folder in locked:
            folder.chmod(0o755)
    assert (f"{copy} is finished (same config and length): not training again, its metrics.json stands; use a new"
            " run_name to train anew") in capsys.readouterr().out
    assert _fingerprint(copy) == before


@pytest.mark.slow  # a third epoch: what the resume tests below check, in `make slow`
def test_a_longer_max_epochs_extends_a_finished_run(finished_run, tmp_path: Path) -> None:
    import shutil

    run_dir, args = finished_run
    copy = tmp_path / "victim"
    shutil.copytree(run_dir, copy)
    args = [a for a in args if not a.startswith("paths.log_dir=")] + [f"paths.log_dir={tmp_path}"]
    result = run_cli("train.py", _replacing(args, "trainer.max_epochs=3"), env_extra=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming from {copy}/checkpoints/last.ckpt" in result.stdout
    assert json.loads((copy / "metrics.json").read_text())["global_step"] == 9


@pytest.mark.slow  # two train.py runs
def test_a_run_that_failed_before_training_can_be_rerun_fixed(tmp_path: Path, data_dir: Path) -> None:
    # a data folder that is not there: found when the job prepares its data, after it claimed the run dir
    failed = run_cli("train.py", _args(tmp_path, data_dir, "run_name=typo", "data.generator=null",
                                       f"data.root={tmp_path / 'no_such_data'}"), env_extra=ENV)
    assert failed.returncode == 2 and "no_such_data" in failed.stderr, failed.stderr[-2000:]
    run_dir = tmp_path / "typo"
    assert (run_dir / "failed.json").is_file()
    assert json.loads((run_dir / "run.json").read_text())["state"] == "failed"
    fixed = run_cli("train.py", _args(tmp_path, data_dir, "run_name=typo"), env_extra=ENV)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert "never trained" in fixed.stdout  # nothing of value was in the dir: reused, and said so
    assert not (run_dir / "failed.json").exists() and (run_dir / "metrics.json").is_file()
    assert json.loads((run_dir / "run.json").read_text())["state"] == "finished"


def _save_checkpoint(path: Path, step: int, identity: str = "abc") -> None:
    AtomicCheckpointIO().save_checkpoint(
        {"global_step": step, "epoch": 0, "state_dict": {"w": torch.ones(3)}, "run_identity": identity,
         "pytorch-lightning_version": "2.5.0"}, path)  # what Lightning's checkpoints hold, and its restore needs


def test_resume_point_is_an_intact_trained_checkpoint_of_this_run(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    assert job.resume_checkpoint(tmp_path, "abc") is None  # nothing there: start
    _save_checkpoint(ckpts / "last.ckpt", step=0)  # saved before any step (e.g. a crash in setup)
    assert job.resume_checkpoint(tmp_path, "abc") is None
    _save_checkpoint(ckpts / "best.ckpt", step=4)
    _save_checkpoint(ckpts / "last.ckpt", step=6)
    assert job.resume_checkpoint(tmp_path, "abc") == str(ckpts / "last.ckpt")
    # a truncated last.ckpt: resume from the intact best.ckpt (earlier, never from scratch)
    data = (ckpts / "last.ckpt").read_bytes()
    (ckpts / "last.ckpt").write_bytes(data[: len(data) // 2])
    assert job.resume_checkpoint(tmp_path, "abc") == str(ckpts / "best.ckpt")
    # a checkpoint of another config is never resumed; nothing usable left: an error, not a fresh start
    _save_checkpoint(ckpts / "best.ckpt", step=4, identity="other")
    with pytest.raises(job.ResumeError, match="last.ckpt is unreadable.*best.ckpt was saved by a run of another"):
        job.resume_checkpoint(tmp_path, "abc")


def test_a_resume_point_past_the_recorded_length_is_another_runs(tmp_path: Path) -> None:
    """last.ckpt swapped for the same config's checkpoint trained longer (3 epochs where run.json records 1):
    an extension to 3 epochs would train nothing and report the other run's weights."""
    ckpts = tmp_path / "checkpoints"
    _save_checkpoint(ckpts / "best.ckpt", step=4)  # epoch 0: this run's
    AtomicCheckpointIO().save_checkpoint({"global_step": 12, "epoch": 2, "state_dict": {"w": torch.ones(3)},
                                          "run_identity": "abc", "pytorch-lightning_version": "2.5.0"},
                                         ckpts / "last.ckpt")
    recorded = {"max_epochs": 1, "max_steps": -1}
    assert job.resume_checkpoint(tmp_path, "abc") == str(ckpts / "last.ckpt")  # no record to judge it by
    assert job.resume_checkpoint(tmp_path, "abc", recorded) == str(ckpts / "best.ckpt")
    (ckpts / "best.ckpt").unlink()
    with pytest.raises(job.ResumeError) as err:
        job.resume_checkpoint(tmp_path, "abc", recorded)
    assert str(err.value) == (f"cannot resume: {ckpts / 'last.ckpt'} is not this run's: it was saved in epoch 3,"
                              " past this run's trainer.max_epochs=1 (the length its run.json records); move it"
                              " away to start over, or use a new run_name")


def test_identity_ignores_what_may_change_on_resume() -> None:
    base = {"trainer": {"max_epochs": 3, "lr": 1}, "logger": {"csv": {}}, "paths": {"log_dir": "a"}, "rpe": {"k": 1}}
    other = {"trainer": {"max_epochs": 9, "lr": 1}, "logger": {}, "paths": {"log_dir": "b"}, "rpe": {"k": 1}}
    same = identity.identity_config
    assert identity.identity_hash(same(base)) == identity.identity_hash(same(other))
    changed = {**other, "rpe": {"k": 2}}
    assert identity.identity_hash(same(base)) != identity.identity_hash(same(changed))
    assert identity.config_differences(same(base), same(changed)) == "rpe.k: 1 -> 2"
    # probe 11, F2: 32.0 for 32 hashes differently, and is named (it was "no difference", then a wrong reason)
    spelled = {**other, "rpe": {"k": 1.0}}
    assert identity.identity_hash(same(base)) != identity.identity_hash(same(spelled))
    assert identity.config_differences(same(base), same(spelled)) == "rpe.k: 1 -> 1.0"


def test_the_moved_resume_checkpoint_keeps_the_identity_archived_runs_record() -> None:
    """``ResumeCheckpoint`` moved from models.training to lifecycle.checkpoints: today's config names the new
    module, run dirs and the committed archives the old one, hashed into their identities. Both names give the
    recorded identity, so a rerun resumes such a run dir and pools with the archived runs."""
    from hydra.utils import get_class
    from omegaconf import OmegaConf

    from lifecycle.checkpoints import ResumeCheckpoint

    root = Path(__file__).resolve().parents[1]
    today = OmegaConf.load(root / "configs" / "callbacks" / "default.yaml").last_checkpoint._target_
    assert get_class(today) is ResumeCheckpoint
    archives = root / "docs"
    for run in (archives / "benchmark_runs/shift_mini/row=none,seed=0",
                archives / "ablations_mini_runs/compare_decomposed_mini/row=decomposed,seed=0"):
        recorded = json.loads((run / "metrics.json").read_text())["identity"]
        archived = OmegaConf.load(run / "config.yaml")
        assert archived.callbacks.last_checkpoint._target_ == "models.training.ResumeCheckpoint" != today
        assert identity.identity_hash(identity.identity_config(archived)) == recorded
        archived.callbacks.last_checkpoint._target_ = today
        assert identity.identity_hash(identity.identity_config(archived)) == recorded, run


# ----------------------------------------------------------------------------- exact resume
@pytest.mark.slow  # three train.py runs
def test_kill_9_mid_epoch_then_resume_ends_with_the_uninterrupted_weights(tmp_path: Path, data_dir: Path) -> None:
    """last.ckpt every 3 steps; SIGKILL after step 7 (mid second epoch) loses step 7; the rerun redoes it."""
    common = _args(tmp_path, data_dir, "trainer.max_epochs=2", "trainer.limit_train_batches=4",
                   "trainer.deterministic=true", "callbacks.last_checkpoint.every_n_train_steps=3")
    done = tmp_path / "reference-marker"
    done.write_text("")  # the reference run is never killed
    reference = run_cli("train.py", [*common, "run_name=reference", *_fault(7, done, signal.SIGKILL)], env_extra=ENV)
    assert reference.returncode == 0, reference.stderr[-3000:]

    marker = tmp_path / "kill-marker"
    args = [*common, "run_name=killed", *_fault(7, marker, signal.SIGKILL)]
    killed = run_cli("train.py", args, env_extra=ENV)
    assert killed.returncode == -signal.SIGKILL and marker.exists()
    assert load_checkpoint(tmp_path / "killed/checkpoints/last.ckpt")["global_step"] == 6
    resumed = run_cli("train.py", args, env_extra=ENV)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout
    # the sampler skips what the epoch saw: neither Lightning's "unreliable results" nor our own warning
    assert "unreliable results" not in resumed.stderr and "cannot skip them" not in resumed.stderr

    want, got = (load_checkpoint(tmp_path / name / "checkpoints/last.ckpt") for name in ("reference", "killed"))
    assert got["global_step"] == want["global_step"] == 8
    for key, value in want["state_dict"].items():
        assert torch.equal(got["state_dict"][key], value), key
    for moments_want, moments_got in zip(want["optimizer_states"][0]["state"].values(),
                                         got["optimizer_states"][0]["state"].values(), strict=True):
        assert torch.equal(moments_want["exp_avg_sq"], moments_got["exp_avg_sq"])


def _epoch_counters(run_dir: Path) -> dict:
    """The fit loop's epoch counters in ``run_dir``'s last.ckpt."""
    saved = torch.load(run_dir / "checkpoints/last.ckpt", map_location="cpu", weights_only=True)
    return saved["loops"]["fit_loop"]["epoch_progress"]


@pytest.mark.slow  # three train.py runs
def test_a_stop_after_an_epochs_last_batch_resumes_and_extends_like_an_uninterrupted_run(
        finished_run, tmp_path: Path, data_dir: Path) -> None:
    """Probe 18, s78: SIGTERM after epoch 0's last batch saved last.ckpt before the epoch's validation; the resume
    counted the next epoch processed but never ready, and an extension by one epoch then trained nothing while
    metrics.json claimed it. The stop now waits for the epoch's end: the resumed run ends with the uninterrupted
    run's counters, and an extension trains exactly its added epoch."""
    reference, args = finished_run
    args = _replacing(args, f"paths.log_dir={tmp_path}", "run_name=stopped")
    stop = _fault(3, tmp_path / "marker", signal.SIGTERM)  # 3 batches an epoch: epoch 0's last
    first = run_cli("train.py", [*args, *stop], env_extra=ENV)
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-3000:]
    run_dir = tmp_path / "stopped"
    saved = load_checkpoint(run_dir / "checkpoints/last.ckpt")
    assert (saved["epoch"], saved["global_step"], saved["loader_position"]) == (0, 3, [1, 0])
    resumed = run_cli("train.py", [*args, *stop], env_extra=ENV)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _epoch_counters(run_dir) == _epoch_counters(reference)
    extended = run_cli("train.py", _replacing([*args, *stop], "trainer.max_epochs=3"), env_extra=ENV)
    assert extended.returncode == 0, extended.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert (metrics["epoch"], metrics["global_step"]) == (3, 9)
    assert load_checkpoint(run_dir / "checkpoints/last.ckpt")["global_step"] == 9


@pytest.mark.slow  # three train.py runs
def test_an_earlier_versions_save_at_an_epochs_last_batch_is_resumed_at_the_next_epoch(
        finished_run, tmp_path: Path, data_dir: Path) -> None:
    """Probe 18, s78: a last.ckpt an earlier version saved after epoch 0's last batch (its stop, or an
    every_n_train_steps save, then a kill) is resumed at epoch 1's start: the run ends with the uninterrupted
    run's counters, and an extension trains exactly its added epoch."""
    from lifecycle.checkpoints import saved_at_last_batch

    reference, args = finished_run
    args = _replacing(args, f"paths.log_dir={tmp_path}", "run_name=old")
    fault = ["+callbacks.fault._target_=tests.faults.SaveAtLastBatchThenKill", "+callbacks.fault.step=3",
             f"+callbacks.fault.marker={tmp_path / 'marker'}"]
    killed = run_cli("train.py", [*args, *fault], env_extra=ENV)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    run_dir = tmp_path / "old"
    assert saved_at_last_batch(load_checkpoint(run_dir / "checkpoints/last.ckpt"))
    resumed = run_cli("train.py", [*args, *fault], env_extra=ENV)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _epoch_counters(run_dir) == _epoch_counters(reference)
    assert "saved after epoch 0's last training batch" in resumed.stdout
    assert json.loads((run_dir / "metrics.json").read_text())["global_step"] == 6
    extended = run_cli("train.py", _replacing([*args, *fault], "trainer.max_epochs=3"), env_extra=ENV)
    assert extended.returncode == 0, extended.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert (metrics["epoch"], metrics["global_step"]) == (3, 9)


@pytest.mark.slow  # a train.py run on a copy of the finished run
def test_a_checkpoint_whose_epoch_counters_disagree_is_refused_before_anything_is_written(
        finished_run, tmp_path: Path) -> None:
    """Probe 18, s79: checkpoints saved after an earlier version's miscounted resume (an epoch counted processed
    twice): an extension from them trained nothing and recorded the added epoch. One line, exit 2, and the run
    dir as it was (its finished result stands)."""
    import shutil

    run_dir, args = finished_run
    copy = tmp_path / "victim"
    shutil.copytree(run_dir, copy)
    for name in ("last.ckpt", "best.ckpt"):
        saved = torch.load(copy / "checkpoints" / name, map_location="cpu", weights_only=True)
        for tracker in saved["loops"]["fit_loop"]["epoch_progress"].values():
            tracker["processed"] += 1
        torch.save(saved, copy / "checkpoints" / name)
    before = _fingerprint(copy)
    args = _replacing(args, f"paths.log_dir={tmp_path}", "trainer.max_epochs=3")
    result = run_cli("train.py", args, env_extra=ENV)
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = _error_lines(result.stderr)
    assert f"{copy}/checkpoints/last.ckpt has epoch counters that disagree" in line, line
    assert "Traceback" not in result.stderr
    assert _fingerprint(copy) == before


def test_a_fit_that_counts_epochs_it_did_not_train_is_no_result() -> None:
    """Probe 18, s79: the guard after fit: 41 epochs counted over 40 optimizer steps of one-batch epochs is no
    result (one line), never a record; a fit ended by trainer.max_steps may end within an epoch."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"trainer": {"max_epochs": 41, "max_steps": -1}})
    trainer = SimpleNamespace(global_step=40, current_epoch=41, num_training_batches=1, accumulate_grad_batches=1)
    with pytest.raises(job.NoResultError, match="counts 41 epochs but made 40 optimizer steps"):
        job._require_trained_epochs(cfg, trainer)
    job._require_trained_epochs(cfg, SimpleNamespace(**{**vars(trainer), "global_step": 41}))
    # 3 batches, 2 accumulated: 2 steps an epoch (the last batch steps alone)
    job._require_trained_epochs(cfg, SimpleNamespace(**{**vars(trainer), "global_step": 82, "num_training_batches": 3,
                                                        "accumulate_grad_batches": 2}))
    with pytest.raises(job.NoResultError):
        job._require_trained_epochs(cfg, SimpleNamespace(**{**vars(trainer), "global_step": 81,
                                                            "num_training_batches": 3, "accumulate_grad_batches": 2}))
    by_steps = OmegaConf.create({"trainer": {"max_epochs": 41, "max_steps": 40}})
    job._require_trained_epochs(by_steps, trainer)


# ----------------------------------------------------------------------------- signals
# SIGTERM (what SLURM and Kubernetes send) and SIGUSR1, which takes the same path: trained runs, in `make slow`
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_stop_signal_saves_records_and_exits_non_zero(tmp_path: Path, data_dir: Path, signum: int) -> None:
    marker = tmp_path / "marker"
    args = _args(tmp_path, data_dir, "run_name=preempted", "trainer.max_epochs=2", *_fault(4, marker, signum))
    first = run_cli("train.py", args, env_extra=ENV)
    run_dir = tmp_path / "preempted"
    assert first.returncode == 128 + signum, first.stderr[-3000:]
    [line] = _error_lines(first.stderr)
    assert signal.Signals(signum).name in line and "resume" in line
    assert json.loads((run_dir / "run.json").read_text())["state"] == "interrupted"
    assert load_checkpoint(run_dir / "checkpoints/last.ckpt")["global_step"] == 4
    assert not (run_dir / "metrics.json").exists() and not (run_dir / "failed.json").exists()

    stale = run_dir / "checkpoints" / ".last.ckpt.k3j4.tmp"  # what a kill during a save leaves
    stale.write_bytes(b"half a checkpoint")
    second = run_cli("train.py", args, env_extra=ENV)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming from {run_dir}/checkpoints/last.ckpt" in second.stdout
    assert not stale.exists()
    assert json.loads((run_dir / "metrics.json").read_text())["global_step"] == 6
    assert json.loads((run_dir / "run.json").read_text())["state"] == "finished"


def test_ctrl_c_while_hydra_composes_a_job_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Probe 8, A37c: Ctrl-C after the checks, while Hydra composed the sweep's first job (inside omegaconf), was a
    34-frame KeyboardInterrupt traceback. train.py's is the sweep's interruption line; eval.py's says nothing was
    written. Both exit 130."""
    from lifecycle import cli, job

    def composing() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "check_command", lambda argv, config_name, make=True: (argv, {}))
    monkeypatch.setattr(cli.sys, "argv", ["train.py", "-m", "seed=0,1"])
    with pytest.raises(SystemExit) as exit_:
        cli.cli(composing, "train", after=job.after_sweep, interrupted=job.interrupted_outside_a_job)
    assert exit_.value.code == 128 + signal.SIGINT
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "by SIGINT" in err and "Traceback" not in err, err
    monkeypatch.setattr(cli.sys, "argv", ["eval.py", "ckpt_path=x"])
    with pytest.raises(SystemExit) as exit_:
        cli.cli(composing, "eval")
    assert exit_.value.code == 128 + signal.SIGINT
    assert capsys.readouterr().err.startswith("error: interrupted by SIGINT; nothing was written")


def test_ctrl_c_while_the_command_line_is_checked_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Before any job or evaluation has begun (train.py's and eval.py's command-line check), Ctrl-C was
    Python's KeyboardInterrupt traceback: now exit 130 and one line."""
    from lifecycle import cli

    def interrupted(argv: list[str], config_name: str, make: bool = True) -> dict[str, str]:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "check_overrides", interrupted)
    monkeypatch.setattr(cli.sys, "argv", ["eval.py", "ckpt_path=x"])
    for config_name in ("train", "eval"):
        with pytest.raises(SystemExit) as exit_:
            cli.cli(lambda: pytest.fail("the command ran"), config_name)
        assert exit_.value.code == 128 + signal.SIGINT
        assert capsys.readouterr().err == ("error: interrupted by SIGINT while the command line was checked, before"
                                           " any run or evaluation began: run the same command again\n")


@pytest.mark.parametrize(("script", "signum"), [("train.py", signal.SIGINT), ("eval.py", signal.SIGINT),
                                                ("scripts/make_tables.py", signal.SIGTERM)])
def test_ctrl_c_while_the_entry_point_imports_is_one_line(script: str, signum: int) -> None:
    """Ctrl-C during the seconds train.py and eval.py import torch and Lightning was a 25-line KeyboardInterrupt
    traceback through the import machinery: exit 130 and one line. SIGTERM there ended a script without a line
    (probe 20, x61). The signal goes once torch's library is being loaded (seen in the process's memory maps),
    in the middle of the imports."""
    import subprocess
    import sys
    import time

    from tests.helpers import ROOT, _sigint_as_at_a_terminal

    process = subprocess.Popen([sys.executable, str(ROOT / script), "--check", "debug=fast"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_sigint_as_at_a_terminal)
    maps = Path(f"/proc/{process.pid}/maps")
    deadline = time.monotonic() + 120
    while process.poll() is None and "libtorch" not in maps.read_text() and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, stderr[-3000:]
    assert stderr == (f"error: interrupted by {signal.Signals(signum).name} while starting, before anything was"
                      " checked or written: run the same command again\n")


@pytest.mark.slow  # one more train.py run; the SIGTERM path above is in `make test`
def test_ctrl_c_is_one_line_naming_the_run_and_exits_as_a_shell_does(tmp_path: Path, data_dir: Path) -> None:
    """SIGINT: Lightning shuts the fit down and exits 1 on its own; the job says what happened, like a stop signal."""
    fault = _fault(4, tmp_path / "m", signal.SIGINT)
    args = _args(tmp_path, data_dir, "run_name=ctrl_c", "trainer.max_epochs=2", *fault)
    result = run_cli("train.py", args, env_extra=ENV)
    assert result.returncode == 128 + signal.SIGINT, result.stderr[-3000:]
    [line] = _error_lines(result.stderr)
    assert f"run interrupted ({tmp_path / 'ctrl_c'}) by SIGINT" in line and "rerun the same command to resume" in line
    assert json.loads((tmp_path / "ctrl_c" / "run.json").read_text())["state"] == "interrupted"
    assert not (tmp_path / "ctrl_c" / "metrics.json").exists()


@pytest.mark.slow  # a sweep; SIGTERM of one run stays in `make test`
def test_sigterm_stops_a_sweep_and_reports_the_interrupted_job(tmp_path: Path, data_dir: Path) -> None:
    """Like scancel under SLURM: the step that gets SIGTERM also fails (a DataLoader worker killed by it)."""
    sweep = tmp_path / "sweep"
    marker = tmp_path / "marker"
    result = run_cli("train.py", [
        "-m", "rpe=none,irpe_k", *_args(tmp_path, data_dir, f"hydra.sweep.dir={sweep}"),
        *_fault(2, marker, signal.SIGTERM), "+callbacks.fault.then_raise='DataLoader worker (pid 1) is killed'",
    ], env_extra=ENV)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-3000:]
    [line] = _error_lines(result.stderr)
    assert f"sweep interrupted during job {sweep / '0'}" in line and "SIGTERM" in line
    assert "no checkpoint yet" in line  # the step broke off before its save; the rerun starts the job again
    assert json.loads((sweep / "0" / "run.json").read_text())["state"] == "interrupted"
    assert not (sweep / "0" / "failed.json").exists()
    assert not (sweep / "1").exists()  # the sweep stopped: the scheduler requeues it


# ----------------------------------------------------------------------------- finite or stop
@pytest.mark.slow
def test_a_nan_loss_stops_the_run_without_a_checkpoint(tmp_path: Path, data_dir: Path) -> None:
    result = run_cli("train.py", _args(tmp_path, data_dir, "run_name=nan", "model.optimizer.lr=1e6",
                                       "trainer.max_epochs=2"), env_extra=ENV)
    run_dir = tmp_path / "nan"
    assert result.returncode != 0
    [line] = _error_lines(result.stderr)
    assert "at step" in line and ("nan" in line or "non-finite" in line), line
    assert json.loads((run_dir / "failed.json").read_text())["type"] == "NonFiniteLossError"
    assert json.loads((run_dir / "run.json").read_text())["state"] == "failed"
    assert not (run_dir / "metrics.json").exists()
    for ckpt in (run_dir / "checkpoints").glob("*.ckpt"):  # whatever was saved before the blow-up is finite
        assert all(torch.isfinite(v).all() for v in load_checkpoint(ckpt)["state_dict"].values()), ckpt


def test_metrics_json_is_strict(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        atomic_write_json(tmp_path / "m.json", {"val/top1": float("nan")})
    assert not (tmp_path / "m.json").exists()
    assert job._finite_metrics({"a": float("inf"), "b": 1.0, "c": "x"}) == {"a": None, "b": 1.0, "c": "x"}


def test_writes_are_flushed_to_disk(tmp_path: Path, monkeypatch) -> None:
    import os
    import stat

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    atomic_write_json(tmp_path / "m.json", {"a": 1})
    assert synced == ["file", "dir"]
    synced.clear()
    AtomicCheckpointIO().save_checkpoint({"w": torch.ones(2)}, tmp_path / "c.ckpt")
    assert synced == ["file", "dir"] and not list(tmp_path.glob(".*.tmp"))


# ----------------------------------------------------------------------------- W&B
@pytest.mark.slow  # a two-job sweep with W&B offline
def test_wandb_one_finished_run_per_sweep_job(tmp_path: Path, data_dir: Path) -> None:
    pytest.importorskip("wandb")
    sweep = tmp_path / "sweep"
    result = run_cli("train.py", [
        "-m", "rpe=none,irpe_k",
        *_args(tmp_path, data_dir, f"hydra.sweep.dir={sweep}", "logger=wandb", "trainer.limit_train_batches=1"),
    ], env_extra={**ENV, "WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "reuse this run" not in result.stderr + result.stdout
    names = {0: b'"deit_micro_none"', 1: b'"deit_micro_irpe_k"'}  # each job's config columns (name)
    for n in (0, 1):
        [run] = (sweep / str(n) / "wandb").glob("offline-run-*")  # one W&B run per job, in its own dir
        record = next(run.glob("run-*.wandb")).read_bytes()
        assert names[n] in record and names[1 - n] not in record
        log = (run / "logs" / "debug.log").read_text()
        assert "finishing run" in log and "got exitcode: 0" in log  # closed by the job, not left abandoned


def test_a_stop_signal_between_two_sweep_jobs_is_one_line_and_the_sweeps_exit(capsys: pytest.CaptureFixture) -> None:
    """A job gives the stop signals back when it ends; inside a sweep they stay the project's (train.py's `cli`
    holds them around Hydra's run), so a SIGHUP between two jobs interrupts with one line and 128 + signum, where
    the default handler ended the process without a word."""
    from lifecycle.checkpoints import RunInterrupted
    from lifecycle.command import command_scope
    from lifecycle.signals import install_stop_signals, restore_stop_signals, stop_signals

    before = {s: signal.getsignal(s) for s in job.STOP_SIGNALS}
    with command_scope() as command:
        install_stop_signals()  # the sweep's hold (cli)
        try:
            install_stop_signals()  # a job's own
            restore_stop_signals()  # ... given back when it ends
            assert signal.getsignal(signal.SIGHUP) is not signal.SIG_DFL
            with pytest.raises(RunInterrupted) as err:
                os.kill(os.getpid(), signal.SIGHUP)  # between the jobs
            command.failed_jobs.append("/sweep/0: an earlier job's failure")
            with pytest.raises(SystemExit) as exited:
                job.interrupted_outside_a_job(err.value.signum)
        finally:
            restore_stop_signals()
        held = stop_signals().held
    assert exited.value.code == 128 + signal.SIGHUP
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("error: run interrupted before its job began by SIGHUP; rerun the same command")
    assert lines[1:] == ["error: 1 sweep job(s) failed:", "  /sweep/0: an earlier job's failure"]
    assert {s: signal.getsignal(s) for s in job.STOP_SIGNALS} == before and held == 0


def test_the_code_version_runs_no_command_from_a_git_config_outside_the_checkout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 13, i1: with HOME at a run folder holding a ``.gitconfig``, the job's ``git status`` ran the fsmonitor
    command that file named. git reads only the checkout's own config."""
    from lifecycle.job import code_version

    marker = tmp_path / "ran"
    (tmp_path / ".gitconfig").write_text(f'[core]\n\tfsmonitor = "touch {marker}; echo"\n')
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    version = code_version.__wrapped__()
    assert not marker.exists()
    assert version == "unknown" or len(version.removesuffix("+dirty")) == 12, version
