"""The run lifecycle (lifecycle): where a result may come from, records, run names, storage faults
and stop signals. The fault matrix (tests/test_fault_matrix.py) covers damaged run dirs file by file."""

from __future__ import annotations

import errno
import json
import shutil
import signal
from pathlib import Path

import pytest
import torch
import yaml

from lifecycle import cli, job, records
from lifecycle.checkpoints import load_checkpoint
from storage.files import RunFileError, atomic_write_json, read_json, with_checksum
from tests.faults import SignalIn  # noqa: F401  (loaded by Hydra through +callbacks.fault._target_)
from tests.helpers import ROOT, compose_config, run_cli

TINY = [
    "debug=fast", "logger=csv", "data.root=${paths.data_dir}/relational_tiny", "data.generator.num_train=256",
    "data.generator.num_val=64", "data.num_workers=0", "data.batch_size=32", "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=2", "trainer.limit_test_batches=2", "print_config=false",
]
ENV = {"OMP_NUM_THREADS": "1"}


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    run_dir = tmp_path_factory.mktemp("lifecycle") / "run"
    job.run(compose_config(TINY, run_dir, data_dir))
    return run_dir


# ----------------------------------------------------------------------------- where a result comes from
@pytest.mark.slow  # several train.py or eval.py processes: make test's 5 minutes
def test_a_moved_run_re_tests_its_own_best_not_the_one_at_its_old_path(finished: Path, tmp_path: Path,
                                                                       data_dir: Path) -> None:
    """The checkpoints remember the absolute path of the dir they were saved in; after a move, another
    run's best.ckpt may lie there. The re-test must read the moved dir's own."""
    old = tmp_path / "old"
    moved = tmp_path / "moved"
    shutil.copytree(finished, old)
    shutil.move(old, moved)
    truth = json.loads((moved / "metrics.json").read_text())["val/top1"]
    (moved / "metrics.json").unlink()
    impostor = old / "checkpoints" / "best.ckpt"  # what now lies at the old path: weights of another run
    impostor.parent.mkdir(parents=True)
    saved = load_checkpoint(moved / "checkpoints" / "best.ckpt")
    saved["state_dict"] = {k: torch.zeros_like(v) for k, v in saved["state_dict"].items()}
    torch.save(saved, impostor)
    metrics = job.run(compose_config(TINY, moved, data_dir))
    assert metrics["val/top1"] == pytest.approx(truth) and metrics["best_checkpoint"] == "checkpoints/best.ckpt"


@pytest.mark.slow  # an extension (one more epoch) of a finished run
def test_a_checkpoints_modelcheckpoint_state_naming_another_runs_file_never_removes_it(
        finished: Path, tmp_path: Path, data_dir: Path, capsys) -> None:
    """A ModelCheckpoint state (best_k_models, the kth/best/last paths) naming ``<run>/checkpoints/../../other/
    checkpoints/best.ckpt`` made Lightning delete the other run's best.ckpt when it replaced its top-k entry on
    resume: every path not directly in the run's own checkpoints folder is dropped when a checkpoint loads."""
    run_dir, other = tmp_path / "run", tmp_path / "other"
    shutil.copytree(finished, run_dir)
    shutil.copytree(finished, other)
    victim = other / "checkpoints" / "best.ckpt"
    victim_bytes = victim.read_bytes()
    crafted = f"{run_dir}/checkpoints/../../other/checkpoints/best.ckpt"
    for name in ("last.ckpt", "best.ckpt"):
        path = run_dir / "checkpoints" / name
        saved = torch.load(path, weights_only=True)
        states = [v for k, v in saved["callbacks"].items() if k.startswith("ModelCheckpoint")]
        assert states
        for state in states:
            state.update(dirpath=f"{run_dir}/checkpoints", best_k_models={crafted: torch.tensor(-1.0)},
                         kth_best_model_path=crafted, kth_value=torch.tensor(-1.0), best_model_path=crafted,
                         best_model_score=torch.tensor(-1.0), last_model_path=crafted)
        torch.save(saved, path)
    job.run(compose_config([*TINY, "trainer.max_epochs=2"], run_dir, data_dir))
    assert victim.read_bytes() == victim_bytes
    assert load_checkpoint(run_dir / "checkpoints" / "best.ckpt")["epoch"] == 1  # the extension's own best
    notes = [line for line in capsys.readouterr().out.splitlines() if "dropped" in line]
    assert len(notes) == 1 and "outside the run's checkpoints folder" in notes[0] and crafted in notes[0]


def test_modelcheckpoint_paths_are_kept_only_directly_in_the_runs_checkpoints_folder(tmp_path: Path) -> None:
    """The rule behind the resume above: a path is the run's when the system resolves it (``..``, also after a
    symlink, and symlinks) to a file directly in the run's checkpoints folder; a run's own state loads as saved."""
    from models.training import confine_callback_paths

    own = tmp_path / "run" / "checkpoints"
    own.mkdir(parents=True)
    (tmp_path / "other" / "checkpoints").mkdir(parents=True)
    (own / "link").symlink_to(tmp_path / "other" / "checkpoints")
    best, last = str(own / "best.ckpt"), str(own / "last.ckpt")
    state = {"dirpath": str(own), "best_k_models": {best: torch.tensor(0.5)}, "kth_best_model_path": best,
             "best_model_path": best, "best_model_score": torch.tensor(0.5), "last_model_path": last}
    saved = {"callbacks": {"ModelCheckpoint{}": dict(state)}}
    assert confine_callback_paths(saved, str(own)) == [] and saved["callbacks"]["ModelCheckpoint{}"] == state
    foreign = [str(own / "link" / "best.ckpt"), str(own / "link" / ".." / "best.ckpt"), "best.ckpt"]
    for path in foreign:
        saved = {"callbacks": {"ModelCheckpoint{}": {**state, "best_k_models": {path: torch.tensor(0.5)},
                                                     "kth_best_model_path": path, "last_model_path": path}}}
        assert confine_callback_paths(saved, str(own)) == [path]
        assert saved["callbacks"]["ModelCheckpoint{}"] | {"best_model_score": None} == {
            **state, "best_k_models": {}, "kth_best_model_path": "", "last_model_path": "", "best_model_score": None}
    # a state saved in another folder (a moved or copied run's): nothing it names is this run's, dropped quietly
    saved = {"callbacks": {"ModelCheckpoint{}": {**state, "dirpath": str(tmp_path / "other" / "checkpoints")}}}
    assert confine_callback_paths(saved, str(own)) == []
    assert {k: saved["callbacks"]["ModelCheckpoint{}"][k] for k in ("best_k_models", "best_model_path",
                                                                     "last_model_path")} == {
        "best_k_models": {}, "best_model_path": "", "last_model_path": ""}


def test_a_moved_or_copied_runs_modelcheckpoint_state_is_re_based_with_its_scores(tmp_path: Path, capsys) -> None:
    """A run moved or copied to a new name resumes from a last.ckpt whose ModelCheckpoint state names the old
    folder: its paths move onto the run's checkpoints folder and its scores stay (the best so far stays best.ckpt)
    where the files it names lie there, saved by the same training; else they are dropped with a note."""
    from lifecycle.checkpoints import TRAINING_KEY
    from models.training import AtomicCheckpointIO

    old, here = tmp_path / "a" / "checkpoints", tmp_path / "b" / "checkpoints"  # `mv runs/a runs/b`: a is gone
    here.mkdir(parents=True)
    torch.save({"state_dict": {}, TRAINING_KEY: "t1"}, here / "best.ckpt")
    score = torch.tensor(18.75)

    def last_saved(dirpath: Path) -> Path:
        best = str(dirpath / "best.ckpt")
        state = {"dirpath": str(dirpath), "best_k_models": {best: score}, "kth_best_model_path": best,
                 "kth_value": score, "best_model_path": best, "best_model_score": score, "last_model_path": ""}
        torch.save({"state_dict": {}, TRAINING_KEY: "t1", "callbacks": {"ModelCheckpoint{'monitor': 'val/top1'}":
                                                                       state}}, here / "last.ckpt")
        return here / "last.ckpt"

    state = AtomicCheckpointIO().load_checkpoint(last_saved(old))["callbacks"]["ModelCheckpoint{'monitor': 'val/top1'}"]
    best = str((here / "best.ckpt").resolve())
    assert state == {"dirpath": str(here.resolve()), "best_k_models": {best: score}, "kth_best_model_path": best,
                     "kth_value": score, "best_model_path": best, "best_model_score": score, "last_model_path": ""}
    assert "note" not in capsys.readouterr().out
    # not this run's files: best.ckpt saved by another training, or absent; the state is dropped, with a note
    torch.save({"state_dict": {}, TRAINING_KEY: "t2"}, here / "best.ckpt")
    for _ in range(2):
        state = AtomicCheckpointIO().load_checkpoint(last_saved(old))["callbacks"][
            "ModelCheckpoint{'monitor': 'val/top1'}"]
        assert (state["best_model_path"], state["best_model_score"], state["best_k_models"]) == ("", None, {})
        notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
        assert len(notes) == 1 and str(old) in notes[0] and "18.75 forgotten" in notes[0], notes
        (here / "best.ckpt").unlink(missing_ok=True)


@pytest.mark.slow  # an extension (one more epoch) of a finished run copied to a new name
def test_an_extended_copy_of_a_run_keeps_its_best_checkpoint(finished: Path, tmp_path: Path, data_dir: Path) -> None:
    """`cp -a runs/a runs/b` then extending b resumed with the best score forgotten (Lightning reloads it only from
    the same dirpath): the extension's first validation, however worse, became best.ckpt and best_epoch."""
    run_dir = tmp_path / "copy"
    shutil.copytree(finished, run_dir)
    before = json.loads((run_dir / "metrics.json").read_text())
    best_bytes = (run_dir / "checkpoints" / "best.ckpt").read_bytes()
    last = run_dir / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)
    states = [v for k, v in saved["callbacks"].items() if k.startswith("ModelCheckpoint")]
    assert states and all(s["dirpath"] == str((finished / "checkpoints").resolve()) for s in states)
    for state in states:  # a best no later epoch reaches: the extension's validation is worse
        state["best_model_score"] = torch.tensor(1000.0)
        state["best_k_models"] = {p: torch.tensor(1000.0) for p in state["best_k_models"]}
        state["kth_value"] = torch.tensor(1000.0)
    torch.save(saved, last)
    metrics = job.run(compose_config([*TINY, "trainer.max_epochs=2"], run_dir, data_dir))
    assert metrics["epoch"] == 2 and metrics["best_epoch"] == before["best_epoch"]
    assert (run_dir / "checkpoints" / "best.ckpt").read_bytes() == best_bytes


def test_result_checkpoint_must_be_this_runs_trained_finite_weights(finished: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    identity = json.loads((run_dir / "run.json").read_text())["identity"]
    best = run_dir / "checkpoints" / "best.ckpt"
    path, steps = job.result_checkpoint(run_dir, identity)
    assert path == best and steps["global_step"] >= 1
    with pytest.raises(job.NoResultError, match="another config"):
        job.result_checkpoint(run_dir, "0123456789abcdef")
    saved = load_checkpoint(best)
    length = json.loads((run_dir / "run.json").read_text())["length"]
    assert length["max_epochs"] == 1 and saved["epoch"] == 0
    # the same config's weights trained longer (another run's): past the length, or past this run's last.ckpt
    torch.save({**saved, "epoch": 19, "global_step": 68}, best)
    with pytest.raises(job.NoResultError) as err:
        job.result_checkpoint(run_dir, identity, length)
    assert str(err.value) == (f"no result: {best} is not this run's: it was saved in epoch 20, past this run's"
                              " trainer.max_epochs=1; the run must be trained again (move the run dir away or use a"
                              " new run_name)")
    last_step = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"]
    torch.save({**saved, "global_step": last_step + 1}, best)
    with pytest.raises(job.NoResultError, match=f"saved at step {last_step + 1}, after this run's last.ckpt "
                                                rf"\(step {last_step}\)"):
        job.result_checkpoint(run_dir, identity, length)
    untrained = {**saved, "global_step": 0}
    torch.save(untrained, best)
    with pytest.raises(job.NoResultError, match="untrained weights"):
        job.result_checkpoint(run_dir, identity)
    key = next(iter(saved["state_dict"]))
    saved["state_dict"][key] = torch.full_like(saved["state_dict"][key], float("nan"))
    torch.save(saved, best)
    with pytest.raises(job.NoResultError, match=f"non-finite weights \\({key}\\)"):
        job.result_checkpoint(run_dir, identity)
    best.unlink()
    with pytest.raises(job.NoResultError, match="never validated"):  # last.ckpt is there, best is not
        job.result_checkpoint(run_dir, identity)
    shutil.rmtree(run_dir / "checkpoints")
    with pytest.raises(job.NoResultError, match="saved no checkpoint"):
        job.result_checkpoint(run_dir, identity)


def test_a_finished_run_without_result_file_or_weights_is_refused(finished: Path, tmp_path: Path,
                                                                  data_dir: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    (run_dir / "metrics.json").unlink()
    (run_dir / "checkpoints" / "best.ckpt").unlink()
    before = sorted(p.name for p in run_dir.rglob("*"))
    with pytest.raises(job.NoResultError, match="best.ckpt does not exist"):
        job.run(compose_config(TINY, run_dir, data_dir))
    assert sorted(p.name for p in run_dir.rglob("*")) == before
    assert json.loads((run_dir / "run.json").read_text())["state"] == "finished"  # never promoted to another


@pytest.mark.parametrize("override", ["trainer.limit_train_batches=0", "trainer.max_steps=0"])
def test_a_schedule_that_trains_nothing_is_refused_before_writing(override: str, tmp_path: Path,
                                                                  data_dir: Path) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(ValueError, match=override.replace(".", r"\.")):
        job.run(compose_config([*TINY, override], run_dir, data_dir))
    assert [p.name for p in run_dir.iterdir()] == ["run.lock"]  # no record, no config, no checkpoint


@pytest.mark.parametrize(("stop", "expected"), [
    (["trainer.max_time=00:00:00:01", "trainer.max_epochs=400"],  # Lightning's timer, after a second
     r"no result: trainer\.max_time=00:00:00:01 was reached in epoch \d+ of 400, after \d+ steps, so its weights"
     r" are not the run's; give a larger trainer\.max_time \(or none\) and a new run_name"),
    (["trainer.max_epochs=4", "+callbacks.stop._target_=tests.faults.StopAfter", "+callbacks.stop.step=3"],
     r"no result: a callback stopped the training in epoch 2 of 4, after 3 steps, so its weights are not the"
     r" run's; train again without what stopped it, under a new run_name"),
])
@pytest.mark.slow  # several train.py or eval.py processes: make test's 5 minutes
def test_a_fit_stopped_before_its_length_is_no_result(stop: list[str], expected: str, tmp_path: Path,
                                                      data_dir: Path) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(job.NoResultError, match=f"^{expected}$"):
        job.run(compose_config([*TINY, *stop], run_dir, data_dir))
    assert not (run_dir / "metrics.json").exists()


def test_a_smoke_run_records_nothing(tmp_path: Path, data_dir: Path, capsys) -> None:
    run_dir = tmp_path / "smoke"
    assert job.run(compose_config([*TINY, "+trainer.fast_dev_run=true"], run_dir, data_dir)) == {}
    assert "no result was recorded" in capsys.readouterr().out
    assert not run_dir.exists()  # the folder Hydra made is removed again


def test_a_run_without_validation_has_its_last_epoch_as_result(tmp_path: Path, data_dir: Path) -> None:
    """With no monitored metric and the save at each epoch's end, a run that never validates still saves
    best.ckpt: the last epoch's weights (those of last.ckpt), and its test is the run's result."""
    overrides = [*TINY, "trainer.max_epochs=2", "trainer.limit_val_batches=0",
                 "callbacks.model_checkpoint.monitor=null", "+callbacks.model_checkpoint.save_on_train_epoch_end=true"]
    run_dir = tmp_path / "run"
    metrics = job.run(compose_config(overrides, run_dir, data_dir))
    best = load_checkpoint(run_dir / "checkpoints" / "best.ckpt")
    last = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    assert (best["epoch"], best["global_step"]) == (last["epoch"], last["global_step"]) == (1, 4)
    assert all(torch.equal(best["state_dict"][k], v) for k, v in last["state_dict"].items())
    assert (metrics["best_epoch"], metrics["best_step"], metrics["tested_batches"]) == (2, 4, 2)
    assert 0.0 <= metrics["val/top1"] <= 100.0


# ----------------------------------------------------------------------------- records
def test_a_record_is_never_written_without_its_identity_nor_into_a_vanished_dir(tmp_path: Path) -> None:
    from lifecycle.identity import identity_hash

    identity = identity_hash({"seed": 0})
    record = records.RunRecord(tmp_path / "run", identity, {"seed": 0}, {"max_epochs": 1, "max_steps": -1})
    (tmp_path / "run").mkdir()
    record.save("running")
    saved = records.read_run_record(tmp_path / "run")
    assert saved["identity"] == identity and saved["state"] == "running" and saved["config"] == {"seed": 0}
    shutil.rmtree(tmp_path / "run")  # deleted while the job runs
    with pytest.raises(RunFileError, match="no longer exists"):
        record.save("finished")
    assert not (tmp_path / "run").exists()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text('{"state": "failed"}')  # what a bad writer once left
    with pytest.raises(RunFileError, match="run.json is damaged: it has no run identity"):
        records.read_run_record(tmp_path / "run")


@pytest.mark.parametrize(("text", "reason"), [
    ("", "empty"), ('{"val/top1": 9', "not valid JSON"), ("[1, 2]", "it holds a JSON list, not a dict"),
])
def test_a_damaged_record_is_one_line_naming_it(tmp_path: Path, text: str, reason: str) -> None:
    (tmp_path / "metrics.json").write_text(text)
    with pytest.raises(RunFileError, match=f"metrics.json is damaged: {reason}"):
        read_json(tmp_path / "metrics.json")


def test_run_status_reads_a_died_job_and_an_interrupted_extension(finished: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    assert records.run_status(run_dir).state == "finished"
    record = json.loads((run_dir / "run.json").read_text())
    extended = {"max_epochs": 5}  # an extension claims its dir with the new length among the trained ones
    atomic_write_json(run_dir / "run.json", {**record, "state": "running", "length": extended,
                                             "lengths": [*record.get("lengths", []), extended]})
    status = records.run_status(run_dir)  # a job killed by a full disk or kill -9: nobody holds the lock
    assert status.state == "died" and not status.metrics  # the shorter run's metrics.json is not its result
    fd, _ = records.lock_run_dir(run_dir)
    try:
        assert records.run_status(run_dir).state == "running"
    finally:
        records.release_lock(fd)


# ----------------------------------------------------------------------------- run names and storage
@pytest.mark.parametrize(("run_name", "expected"), [
    ("../x", "is not a run name"), ("", "is not a run name"), ("a//b", "is not a run name"),
    ("/abs", "is not a run name"), ("x" * 300, "a part of 300 bytes"),
    # probe 61: run_name=' ' made a run dir named by a space
    (" ", "run_name=' ' is not a run name; valid: .*spaces at a part's start or end"),
    ("a/ b", "is not a run name"), ("run ", "is not a run name"),
])
def test_run_names_stay_inside_the_log_dir(run_name: str, expected: str, tmp_path: Path) -> None:
    with pytest.raises(cli.CommandLineError, match=expected):
        cli.check_run_location(run_name, tmp_path)
    cli.check_run_location("sweep/job_1", tmp_path)  # nested names are fine
    cli.check_run_location("a b/c d", tmp_path)  # and so are spaces inside a name
    assert not any(tmp_path.iterdir())


def test_a_log_dir_that_is_a_file_and_a_run_dir_holding_runs_are_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(cli.CommandLineError, match="is a file, where the run dir's folder belongs"):
        cli.check_run_location("x", tmp_path / "file")
    (tmp_path / "group" / "run1").mkdir(parents=True)
    (tmp_path / "group" / "run1" / "run.json").write_text("{}")
    with pytest.raises(cli.CommandLineError, match="holds other runs"):
        cli.check_run_location("group", tmp_path)
    # at any depth, and a run without run.json (config.yaml and checkpoints/, as an older version left it)
    (tmp_path / "sub" / "deeper" / "x" / "checkpoints").mkdir(parents=True)
    (tmp_path / "sub" / "deeper" / "x" / "config.yaml").write_text("seed: 0\n")
    for name in ("sub", "sub/deeper"):
        with pytest.raises(cli.CommandLineError) as err:
            cli.check_run_location(name, tmp_path)
        held = "deeper/x" if name == "sub" else "x"
        assert str(err.value) == (f"run_name='{name}': {tmp_path / name} holds other runs ({held}/); valid: a name"
                                  f" of its own, e.g. run_name={name}/<new name>")
    cli.check_run_location("sub/deeper/x", tmp_path)  # the run itself: a rerun


def test_a_full_disk_while_training_is_one_line_and_the_run_resumes(tmp_path: Path, data_dir: Path,
                                                                     monkeypatch, capsys) -> None:
    """The checkpoint write fails with ENOSPC: one line; the failure is recorded where it still fits."""
    from models import training

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    run_dir = tmp_path / "run"
    monkeypatch.setattr(training.torch, "save", no_space)
    cfg = compose_config(TINY, run_dir, data_dir)
    with pytest.raises(SystemExit) as exit_:
        job.run_job(cfg, ROOT / "train.py")
    assert exit_.value.code == 2
    # once the job has ended, a stop signal is no longer the job's (one while Python exits gave a traceback)
    from lifecycle import signals

    assert signal.getsignal(signal.SIGTERM) is not signals._on_stop_signal
    [line] = _errors(capsys.readouterr().err)
    assert "cannot write checkpoint" in line and "no space left on the device" in line, line
    assert records.run_status(run_dir).state == "failed"
    monkeypatch.undo()
    metrics = job.run(compose_config(TINY, run_dir, data_dir))  # space again: the same command finishes it
    assert metrics["global_step"] == 2 and records.run_status(run_dir).state == "finished"


# ----------------------------------------------------------------------------- stop signals
def _args(tmp_path: Path, data_dir: Path, *extra: str) -> list[str]:
    return [*TINY, f"paths.log_dir={tmp_path}", f"paths.data_dir={data_dir}", "trainer.max_epochs=2", *extra]


def _signal_in(phase: str, marker: Path, signum: int, epoch: int = 0) -> list[str]:
    return ["+callbacks.fault._target_=tests.faults.SignalIn", f"+callbacks.fault.phase={phase}",
            f"+callbacks.fault.marker={marker}", f"+callbacks.fault.signum={signum}",
            f"+callbacks.fault.epoch={epoch}"]


@pytest.mark.slow  # two train.py runs; a SIGTERM in training stays in `make test` (test_reliability.py)
def test_a_stop_during_validation_keeps_that_validation(tmp_path: Path, data_dir: Path) -> None:
    """SIGTERM in epoch 0's validation: the validation ends first, so best.ckpt holds epoch 0 and the
    resumed run does not skip it."""
    args = _args(tmp_path, data_dir, "run_name=val", *_signal_in("validation", tmp_path / "m", signal.SIGTERM))
    first = run_cli("train.py", args, env_extra=ENV)
    run_dir = tmp_path / "val"
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-3000:]
    assert load_checkpoint(run_dir / "checkpoints" / "best.ckpt")["epoch"] == 0
    last = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    assert last["global_step"] == 2 and last["loops"]["fit_loop"]["epoch_progress"]["current"]["completed"] == 1
    assert records.run_status(run_dir).state == "interrupted"
    second = run_cli("train.py", args, env_extra=ENV)
    assert second.returncode == 0, second.stderr[-3000:]
    assert json.loads((run_dir / "metrics.json").read_text())["global_step"] == 4


@pytest.mark.slow
@pytest.mark.parametrize(("phase", "signum"), [("test", signal.SIGTERM), ("validation", signal.SIGHUP)])
def test_a_stop_signal_anywhere_is_an_interruption(phase: str, signum: int, tmp_path: Path, data_dir: Path) -> None:
    """SIGTERM in the test phase (where Python's logging used to swallow it) and SIGHUP (a closed terminal):
    exit 128 + signal, state interrupted, no metrics.json; the rerun finishes."""
    args = _args(tmp_path, data_dir, "run_name=r", *_signal_in(phase, tmp_path / "m", signum))
    first = run_cli("train.py", args, env_extra=ENV)
    run_dir = tmp_path / "r"
    assert first.returncode == 128 + signum, first.stderr[-3000:]
    assert records.run_status(run_dir).state == "interrupted" and not (run_dir / "metrics.json").exists()
    second = run_cli("train.py", args, env_extra=ENV)
    assert second.returncode == 0, second.stderr[-3000:]
    assert records.run_status(run_dir).state == "finished"


# ----------------------------------------------------------------------------- cases of the second probe
@pytest.mark.parametrize("path", ["", ".", "  "])
def test_an_empty_or_working_dir_output_dir_is_refused(path: str) -> None:
    with pytest.raises(cli.CommandLineError, match="is not a folder of its own"):
        cli.prepare_output_dir(path, cli.RUN_DIR_KEY)


def test_an_output_dir_inside_a_run_or_on_unusable_storage_is_refused(finished: Path, tmp_path: Path) -> None:
    with pytest.raises(cli.CommandLineError, match=f"is inside the run dir {finished}"):
        cli.prepare_output_dir(finished / "checkpoints" / "new", cli.RUN_DIR_KEY)
    (tmp_path / "file").write_text("")
    with pytest.raises(cli.CommandLineError,
                       match=r"cannot be made: \S+/file is in its way \(a file, where a folder belongs\)"):
        cli.prepare_output_dir(tmp_path / "file" / "run", "hydra.sweep.dir")
    with pytest.raises(cli.CommandLineError, match="cannot be used"):
        cli.prepare_output_dir("/proc/self/run", cli.RUN_DIR_KEY)
    cli.prepare_output_dir(tmp_path / "runs" / "a", cli.RUN_DIR_KEY)
    assert (tmp_path / "runs" / "a").is_dir() and not any((tmp_path / "runs" / "a").iterdir())


def test_a_run_that_trained_part_of_each_epoch_is_no_result() -> None:
    from types import SimpleNamespace

    from torch.utils.data import DataLoader

    from lifecycle.records import partial_run

    trainer = SimpleNamespace(train_dataloader=DataLoader(list(range(256)), batch_size=32))  # 8 batches
    assert job.trained_whole_epochs(None, trainer, None) and job.trained_whole_epochs(1.0, trainer, None)
    assert job.trained_whole_epochs(8, trainer, None) and job.trained_whole_epochs(100, trainer, None)
    assert not job.trained_whole_epochs(2, trainer, None) and not job.trained_whole_epochs(0.5, trainer, None)
    assert not job.trained_whole_epochs(1, trainer, None)  # the integer 1 is one batch, not the whole split
    assert partial_run({"train_complete": True, "test_complete": True}) == ""
    assert partial_run({"train_complete": False, "test_complete": False, "tested_batches": 2}) == (
        "each epoch trained on a part of the training split (trainer.limit_train_batches or"
        " trainer.overfit_batches); its test read 2 batches, a part of its split (trainer.limit_test_batches)")


def test_an_overfit_batches_run_is_a_smoke_run(tmp_path: Path, data_dir: Path) -> None:
    """It trains (and validates) on a few batches over and over: no result, whatever the limits say."""
    metrics = job.run(compose_config([*TINY, "trainer.limit_train_batches=1.0", "trainer.overfit_batches=1"],
                                     tmp_path / "overfit", data_dir))
    assert metrics["train_complete"] is False


def test_a_test_is_complete_only_when_it_read_the_whole_split() -> None:
    from torch.utils.data import DataLoader

    loader = DataLoader(list(range(64)), batch_size=32)  # 2 batches
    assert job.split_batches(loader) == 2 and job.split_batches([loader, loader]) == 4
    assert job.split_batches(iter(range(3))) == float("inf")  # no length: never called complete


def test_the_result_is_the_test_of_best_ckpt_only(finished: Path, tmp_path: Path, data_dir: Path) -> None:
    """Not the last epoch's validation numbers, which Lightning still holds after fit."""
    metrics = json.loads((finished / "metrics.json").read_text())
    assert metrics["tested_batches"] == 2 and metrics["test_complete"] is True  # the limit 2 is all 64 images
    assert metrics["train_complete"] is False  # 2 of the 8 training batches: a smoke run, not a result
    run_dir = tmp_path / "untested"
    untested = job.run(compose_config([*TINY, "test_after_fit=false"], run_dir, data_dir))
    assert untested["tested"] is False and "val/top1" not in untested and "train/loss" in untested
    retested = job.run(compose_config(TINY, run_dir, data_dir))  # asked for the test now: made from best.ckpt
    assert retested["val/top1"] == pytest.approx(metrics["val/top1"])
    from lifecycle.settings import SettingError, check_schedule

    with pytest.raises(SettingError, match="limit_test_batches=0 tests nothing"):
        check_schedule(compose_config([*TINY, "trainer.limit_test_batches=0"], tmp_path / "x", data_dir))


def test_a_full_disk_in_torch_save_is_one_line(tmp_path: Path, monkeypatch) -> None:
    """torch's writer reports a full disk as a RuntimeError ("unexpected pos"), not an OSError."""
    import shutil as shutil_module
    from collections import namedtuple

    from models.training import AtomicCheckpointIO

    def unexpected_pos(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", unexpected_pos)
    monkeypatch.setattr(shutil_module, "disk_usage", lambda _: namedtuple("u", "total used free")(1, 1, 0))
    with pytest.raises(RunFileError, match="cannot write checkpoint .*last.ckpt: no space left on the device"):
        AtomicCheckpointIO().save_checkpoint({"w": 1}, tmp_path / "last.ckpt")
    assert not list(tmp_path.iterdir())  # no temp file left


def test_a_file_size_limit_in_torch_save_is_named(tmp_path: Path) -> None:
    """``ulimit -f`` smaller than a checkpoint: torch's writer fails ("unexpected pos"); the line names the limit."""
    import resource

    from models.training import AtomicCheckpointIO

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, hard))
    try:
        with pytest.raises(RunFileError) as err:
            AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(100_000)}, tmp_path / "best.ckpt")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert str(err.value) == (f"cannot write checkpoint {tmp_path / 'best.ckpt'}: the file-size limit of this"
                              " process (ulimit -f, 200000 bytes) is smaller than the checkpoint")
    assert not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------- cases of the third probe
@pytest.mark.parametrize(("override", "expected"), [
    ("resume=false", "resume=false would train .* from scratch over its results"),
    ("trainer.max_steps=1", r"trainer.max_steps=1 is shorter than .*schedule \(trainer.max_steps: no limit\)"),
])
def test_a_rerun_never_retrains_or_shortens_a_finished_run(override: str, expected: str, finished: Path,
                                                           tmp_path: Path, data_dir: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    with pytest.raises(records.RunDirConflict, match=expected):
        job.run(compose_config([*TINY, override], run_dir, data_dir))
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_a_copied_or_implausible_metrics_json_is_no_result(finished: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    identity = json.loads((run_dir / "run.json").read_text())["identity"]
    assert metrics["identity"] == identity and records.read_metrics(run_dir, identity) == metrics
    # another run's
    atomic_write_json(run_dir / "metrics.json", with_checksum({**metrics, "identity": "0123456789abcdef"}))
    with pytest.raises(RunFileError, match="is another run's"):
        records.read_metrics(run_dir, identity)
    assert records.run_status(run_dir).state == "unreadable"
    # another run's numbers with the identity key removed: nothing shows they are this run's
    atomic_write_json(run_dir / "metrics.json", with_checksum({k: v for k, v in metrics.items() if k != "identity"}))
    with pytest.raises(RunFileError, match="has no run identity, so it cannot be shown to be this run's result"):
        records.read_metrics(run_dir, identity)
    assert records.run_status(run_dir).state == "unreadable"
    (run_dir / "run.json").unlink()  # an archived run (no run.json): its metrics.json alone is the result
    assert records.run_status(run_dir).state == "finished"
    for edit, problem in (({"global_step": 0}, "global_step=0: a finished run has made at least one optimizer step"),
                          ({"best_step": metrics["global_step"] + 1},
                           f"best_step={metrics['global_step'] + 1} is not within the run's steps"
                           f" 1-{metrics['global_step']}"),
                          ({"best_epoch": 99}, f"best_epoch=99 is not within the run's epochs 1-{metrics['epoch']}"),
                          ({"params": -1}, "params=-1 is not a parameter count")):
        atomic_write_json(run_dir / "metrics.json", with_checksum({**metrics, **edit}))  # an impossible training record
        with pytest.raises(RunFileError) as err:
            records.read_metrics(run_dir, identity)
        assert str(err.value) == f"{run_dir / 'metrics.json'} is damaged: {problem}"
    # edited by hand, with its checksum made again
    atomic_write_json(run_dir / "metrics.json", with_checksum({**metrics, "val/top1": 99.0, "val/top5": 62.5}))
    with pytest.raises(RunFileError, match="val/top1=99.0 is more than val/top5=62.5, which a test cannot give"):
        records.read_metrics(run_dir, identity)
    # JSON true is no percentage
    atomic_write_json(run_dir / "metrics.json", with_checksum({**metrics, "val/top1": True}))
    with pytest.raises(RunFileError, match=r"val/top1=True is not a percentage in \[0, 100\]"):
        records.read_metrics(run_dir, identity)
    atomic_write_json(run_dir / "metrics.json", with_checksum({**metrics, "val/top1": 1e9}))
    with pytest.raises(RunFileError, match=r"val/top1=1000000000.0 is not a percentage in \[0, 100\]"):
        records.read_metrics(run_dir, identity)
    # a number changed by hand, with the checksum left as the run wrote it, or the checksum removed
    atomic_write_json(run_dir / "metrics.json", {**metrics, "val/top1": metrics["val/top1"] - 0.5})
    with pytest.raises(RunFileError) as err:
        records.read_metrics(run_dir, None)  # checked also without run.json, as the file carries a checksum
    assert str(err.value) == (f"{run_dir / 'metrics.json'} is damaged: its content does not match its checksum: it"
                              " was changed after the run wrote it")
    atomic_write_json(run_dir / "metrics.json", {k: v for k, v in metrics.items() if k != "checksum"})
    with pytest.raises(RunFileError, match="is damaged: it has no checksum, which every result file the run writes"):
        records.read_metrics(run_dir, identity)
    assert records.read_metrics(run_dir, None)["val/top1"] == metrics["val/top1"]  # an archived run of old


def test_a_sweep_dir_holds_one_sweep(tmp_path: Path) -> None:
    import yaml

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {"task": ["seed=0,1", "debug=fast"]}}}))
    cli.check_sweep_dir_is_this_sweeps(sweep, ["debug=fast", "seed=0,1", f"hydra.sweep.dir={sweep}"])  # the same
    cli.check_sweep_dir_is_this_sweeps(sweep, ["debug=fast", "seed=0,1,2"])  # extended by a seed
    with pytest.raises(cli.CommandLineError, match="holds another sweep"):
        cli.check_sweep_dir_is_this_sweeps(sweep, ["debug=fast", "model.optimizer.lr=1e-3,2e-3"])
    # numbered job dirs (Hydra's default subdir) restart at 0: a further seed would land in the first launch's job 0
    # (probe 5, read from the code); named ones (configs/sweep/) take it
    named = "${job_dirname:${hydra.job.override_dirname}}"
    cli.check_sweep_dir_is_this_sweeps(sweep, ["debug=fast", "seed=2"], named)
    cli.check_sweep_dir_is_this_sweeps(sweep, ["debug=fast", "seed=0,1"], "${hydra.job.num}")  # a requeue
    with pytest.raises(cli.CommandLineError) as err:
        cli.check_sweep_dir_is_this_sweeps(sweep, ["debug=fast", "seed=2"], "${hydra.job.num}")
    assert str(err.value) == (
        f"hydra.sweep.dir={str(sweep)!r} holds a sweep made by 'seed=0,1 debug=fast' whose job dirs are numbered"
        " (hydra.sweep.subdir=${hydra.job.num}): this launch's job 0 would be that sweep's job 0, another config;"
        " valid: the same values again, a new hydra.sweep.dir, or job dirs named by their overrides,"
        " hydra.sweep.subdir='${job_dirname:${hydra.job.override_dirname}}' (as configs/sweep/ names them)")


def test_a_sweep_given_a_longer_schedule_is_named_an_extension_and_how_to_get_one(tmp_path: Path) -> None:
    """Probe 8 case B23: ``-m seed=0,1 trainer.max_epochs=2`` into the sweep dir of ``-m seed=0,1`` said "holds
    another sweep". It is the same sweep at another length: the line says so, and what is valid."""
    import yaml

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {"task": ["seed=0,1", "debug=fast"]}}}))
    expected = (f"hydra.sweep.dir={str(sweep)!r} holds this sweep at another length (trainer.max_epochs: <default> ->"
                f" 2; {sweep / 'multirun.yaml'}): a longer schedule extends each of its runs, which a sweep does not do"
                " in place (its multirun.yaml names the grid the tables read); valid: the sweep's own command again"
                " (it stands, or resumes), or the longer sweep in a new hydra.sweep.dir (its runs trained from"
                " scratch)")
    for subdir in (None, "${hydra.job.num}"):
        with pytest.raises(cli.CommandLineError) as err:
            cli.check_sweep_dir_is_this_sweeps(sweep, ["debug=fast", "seed=0,1", "trainer.max_epochs=2"], subdir)
        assert str(err.value) == expected
    with pytest.raises(cli.CommandLineError, match="holds another sweep"):  # more than the length: another sweep
        cli.check_sweep_dir_is_this_sweeps(sweep, ["debug=fast", "seed=0,1", "trainer.max_epochs=2", "rpe=none"])


def test_a_generator_drawn_for_another_patch_size_is_refused(tmp_path: Path, data_dir: Path) -> None:
    job.build_data_and_model(compose_config(TINY, tmp_path / "ok", data_dir))  # patch 4 for a patch-4 model
    with pytest.raises(ValueError) as err:
        job.build_data_and_model(compose_config([*TINY, "data.generator.patch_size=2"], tmp_path / "x", data_dir))
    assert str(err.value) == ("data.generator.patch_size=2 but the model's patch is 4x4 px: the data keeps the"
                              " objects in separate patches of the model's size; valid: data.generator.patch_size=4")


def test_a_file_in_the_place_of_a_folder_is_named(tmp_path: Path) -> None:
    """``make_tables.py --out <file>/x``: the file that stands where a folder belongs, not "File exists"."""
    (tmp_path / "afile").write_text("x")
    with pytest.raises(RunFileError) as err:
        atomic_write_json(tmp_path / "afile" / "deeper" / "x.json", {"a": 1})
    assert str(err.value) == (f"cannot write {tmp_path / 'afile' / 'deeper' / 'x.json'}: {tmp_path / 'afile'} is a"
                              " file, where a folder belongs")


def test_a_run_record_whose_identity_is_not_its_configs_is_damaged(finished: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    record = json.loads((run_dir / "run.json").read_text())
    assert records.read_run_record(run_dir)["identity"] == record["identity"]
    atomic_write_json(run_dir / "run.json", {**record, "identity": "0000000000000000"})
    with pytest.raises(RunFileError) as err:
        records.read_run_record(run_dir)
    assert str(err.value) == (f"{run_dir / 'run.json'} is damaged: its identity 0000000000000000 is not that of the"
                              " config it records")


@pytest.mark.parametrize(("metrics", "limits", "claims"), [
    ({"train_complete": False}, {"limit_train_batches": 1.0}, True),  # whole epochs, yet "partial": edited
    ({"train_complete": False}, {"limit_train_batches": 2}, False),  # two batches an epoch: a smoke run
    ({"train_complete": False}, {"limit_train_batches": 1.0, "overfit_batches": 2}, False),
    ({"test_complete": False}, {"limit_test_batches": None}, True),
    ({"test_complete": False}, {"limit_test_batches": 0.5}, False),
    ({"train_complete": True, "test_complete": True}, {}, False),
])
def test_a_smoke_mark_the_config_cannot_give_is_not_believed(metrics: dict, limits: dict, claims: bool) -> None:
    from omegaconf import OmegaConf

    assert job._claims_limits_it_has_not(metrics, OmegaConf.create({"trainer": limits})) is claims


def test_a_mapping_max_time_reaches_lightning_as_a_duration() -> None:
    """``trainer.max_time={minutes: 5}``, a form the settings accept: Lightning's timer gets 300 s."""
    from lightning.pytorch.callbacks import Timer
    from omegaconf import OmegaConf

    trainer = job.build_trainer(OmegaConf.create({"_target_": "lightning.pytorch.Trainer", "max_time": {"minutes": 5},
                                                  "accelerator": "cpu", "logger": False}))
    [timer] = [c for c in trainer.callbacks if isinstance(c, Timer)]
    assert timer._duration == 300.0


@pytest.mark.parametrize(("metrics", "length", "problem"), [
    ({"epoch": 3, "global_step": 24}, {"max_epochs": 3, "max_steps": -1}, ""),
    ({"epoch": 2, "global_step": 50}, {"max_epochs": 3, "max_steps": 50}, ""),  # max_steps came first
    ({"epoch": 3, "global_step": 24}, {"max_epochs": 4, "max_steps": -1},
     "it records 3 epochs (24 steps), while the run trains to trainer.max_epochs=4"),  # before an extension
    ({"epoch": 4, "global_step": 32}, {"max_epochs": 3, "max_steps": 40},
     "it records 4 epochs (32 steps), while the run trains to trainer.max_epochs=3 and trainer.max_steps=40"),
    ({"epoch": 5, "global_step": 40}, {"max_epochs": -1, "max_steps": -1}, ""),  # a time limit only: no length
    ({"val/top1": 50.0}, {"max_epochs": 3, "max_steps": -1}, ""),  # no training record to check
])
def test_a_result_is_of_the_runs_length(metrics: dict, length: dict, problem: str) -> None:
    """A result is made only by a run that trained to its end: its epochs or steps are the run's length."""
    assert records.result_length_problem(metrics, length) == problem


def test_a_run_json_from_another_run_is_named_as_the_foreign_record(finished: Path, tmp_path: Path,
                                                                    data_dir: Path) -> None:
    """config.yaml and metrics.json agree on the run's identity; run.json, swapped in from another run of
    the same sweep (another seed), does not: the tables name run.json, not metrics.json."""
    from lifecycle.identity import identity_config, identity_hash

    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    record = json.loads((run_dir / "run.json").read_text())
    other = {**record["config"], "seed": record["config"]["seed"] + 1}
    records.RunRecord(run_dir, identity_hash(other), other, record["length"]).save("finished")
    own = identity_hash(identity_config(yaml.safe_load((run_dir / "config.yaml").read_text())))
    assert own == record["identity"] != identity_hash(other)
    status = records.run_status(run_dir)
    assert status.state == "unreadable"
    assert status.problem == (f"{run_dir / 'run.json'} is another run's record (identity {identity_hash(other)};"
                              f" config.yaml and metrics.json are {own}'s): copied from another run dir?")
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    with pytest.raises(job.RunDirConflict) as err:  # the rerun of this run's command
        job.run(compose_config(TINY, run_dir, data_dir))
    assert str(err.value).startswith(f"{run_dir / 'run.json'} is another run's record (seed: 1 -> 0), while"
                                     f" {run_dir / 'config.yaml'} names this run: copied from another run dir?")
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("damage", ["[1, 2]\n", "missing"])
def test_a_finished_run_with_a_damaged_run_json_keeps_its_result(damage: str, finished: Path, tmp_path: Path,
                                                                  data_dir: Path, capsys) -> None:
    """Probe 7, B12/B51: run.json rebuilt from config.yaml is finished where metrics.json is the finished
    result of that config and length: the result stands as it was (no re-test, no resume recorded)."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    record = json.loads((run_dir / "run.json").read_text())
    result = (run_dir / "metrics.json").read_bytes()
    if damage == "missing":
        (run_dir / "run.json").unlink()
    else:
        (run_dir / "run.json").write_text(damage)
    metrics = job.run(compose_config(TINY, run_dir, data_dir))
    out = capsys.readouterr().out
    assert "is finished (same config and length): not training again" in out and "re-testing" not in out, out
    assert (run_dir / "metrics.json").read_bytes() == result and metrics == json.loads(result)
    rebuilt = records.read_run_record(run_dir)
    assert rebuilt["state"] == "finished" and "rebuilt" not in rebuilt
    assert (rebuilt["identity"], rebuilt["length"], rebuilt["resumes"]) == (record["identity"], record["length"], [])


def test_a_rebuilt_record_is_finished_only_where_nothing_trained_after_its_result(finished: Path,
                                                                                  tmp_path: Path) -> None:
    """A last.ckpt past metrics.json's step (an extension that went on after the result) or a failed.json
    beside it: the rebuilt record's state is unknown, and the checkpoints decide what is left to do."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    (run_dir / "run.json").unlink()
    assert job._recorded_identity(run_dir)[0]["state"] == "finished"
    (run_dir / "failed.json").write_text('{"status": "failed", "error": "x"}\n')
    assert job._recorded_identity(run_dir)[0]["state"] == "unknown"
    (run_dir / "failed.json").unlink()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    earlier = {**metrics, "global_step": metrics["global_step"] - 1, "best_step": 1}
    atomic_write_json(run_dir / "metrics.json", with_checksum({k: v for k, v in earlier.items() if k != "checksum"}))
    assert job._recorded_identity(run_dir)[0]["state"] == "unknown"


@pytest.mark.slow  # a second fit (a no-op one) and a test
def test_a_resume_from_a_checkpoint_at_the_runs_end_is_not_recorded(finished: Path, tmp_path: Path,
                                                                    data_dir: Path) -> None:
    """run.json and metrics.json both gone: the run resumes from last.ckpt, already at its end; that fit trains
    nothing, so the result re-tested from best.ckpt records no resume (it was trained in one sitting)."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    truth = json.loads((run_dir / "metrics.json").read_text())
    (run_dir / "run.json").unlink()
    (run_dir / "metrics.json").unlink()
    metrics = job.run(compose_config(TINY, run_dir, data_dir))
    assert metrics["val/top1"] == pytest.approx(truth["val/top1"]) and metrics["global_step"] == truth["global_step"]
    assert metrics["env/resumed_at"] == [] and records.read_run_record(run_dir)["resumes"] == []
    assert metrics["training"] == truth["training"]  # a resume continues the training: its results still count


@pytest.mark.slow  # a second training
def test_a_training_anew_in_a_run_dir_has_a_new_token_and_sets_the_old_test_set_results_aside(
        finished: Path, tmp_path: Path, data_dir: Path, capsys) -> None:
    """Probe 8 case B6: checkpoints/, run.json and metrics.json deleted and the run trained again: the old
    testsets/ results (of the deleted weights) were counted for the new ones. Every checkpoint of a training
    carries its token, metrics.json the one of the best.ckpt it tested (a result records the one it read,
    `training_problem`); a training from scratch gets a new token and moves the old results aside."""
    from lifecycle.checkpoints import TRAINING_KEY

    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    before = json.loads((run_dir / "metrics.json").read_text())
    best = load_checkpoint(run_dir / "checkpoints" / "best.ckpt")
    assert before["training"] == best[TRAINING_KEY] == load_checkpoint(run_dir / "checkpoints" / "last.ckpt")[
        TRAINING_KEY] and len(before["training"]) == 16
    (run_dir / "testsets").mkdir()
    result = {"testset": "val_at_48", "training": before["training"]}
    (run_dir / "testsets" / "val_at_48@interpolate.json").write_text(json.dumps(result))
    for name in ("checkpoints", "run.json", "metrics.json"):
        shutil.rmtree(run_dir / name) if name == "checkpoints" else (run_dir / name).unlink()
    after = job.run(compose_config(TINY, run_dir, data_dir))
    assert after["training"] != before["training"]
    assert after["training"] == load_checkpoint(run_dir / "checkpoints" / "best.ckpt")[TRAINING_KEY]
    [aside] = (run_dir / "testsets").iterdir()
    assert aside.name.startswith("stale-") and [p.name for p in aside.iterdir()] == ["val_at_48@interpolate.json"]
    assert json.loads((aside / "val_at_48@interpolate.json").read_text()) == result
    assert f"note: 1 test-set result(s) of weights trained before moved to {aside}" in capsys.readouterr().out


@pytest.mark.parametrize(("code", "how"), [(-signal.SIGKILL, "was killed by signal SIGKILL"),
                                            (1, "exited with code 1")])
def test_a_lost_ddp_worker_is_named_not_the_collectives_socket_text(code: int, how: str, tmp_path: Path,
                                                                     data_dir: Path, monkeypatch, capsys) -> None:
    """Probe 7, A-C14: kill -9 of worker rank 1 during training: rank 0's collective failed with gloo's "Connection
    reset by peer ... GLHF!" text, and that was the line, though the worker was known to have died. The line names
    the worker, how it ended and its log; the socket error stays in failed.json's traceback."""
    run_dir = tmp_path / "run"
    cfg = compose_config(TINY, run_dir, data_dir)
    (run_dir / "ddp_rank1.log").write_text("")
    gloo = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:16770:"
                        " Connection reset by peer. This is typically caused by a remote worker hanging. GLHF!")

    def fit_failing_on_the_lost_peer(cfg, job_, script):
        job_.record = records.RunRecord(run_dir, "0" * 16, {}, {})
        raise gloo

    monkeypatch.setattr(job, "_run", fit_failing_on_the_lost_peer)
    monkeypatch.setattr(job, "end_ddp_workers", lambda: [(1, code)])
    with pytest.raises(SystemExit) as exit_:
        job.run_job(cfg, ROOT / "train.py")
    assert exit_.value.code == 1
    line = (f"error: DDP worker rank 1 {how} (its log: {run_dir / 'ddp_rank1.log'}); the run stopped (recorded in"
            f" {run_dir})")
    assert _errors(capsys.readouterr().err) == [line]
    failure = json.loads((run_dir / "failed.json").read_text())
    assert failure["error"] == line.removeprefix("error: ").removesuffix(f" (recorded in {run_dir})")
    assert "Connection reset by peer" in failure["traceback"]


def test_a_best_ckpt_of_a_shorter_run_of_the_same_config_is_no_result(tmp_path: Path, data_dir: Path) -> None:
    """The same config at 1 and at 2 epochs: the identity leaves the length out, and a 1-epoch best.ckpt is
    not past the 2-epoch run's length. Each checkpoint records the length that saved it and run.json the
    lengths its dir trained at, so the shorter run's weights are not the longer run's result; an extension's
    own earlier best.ckpt still is."""
    short, long = tmp_path / "short", tmp_path / "long"
    job.run(compose_config([*TINY, "trainer.max_epochs=1"], short, data_dir))
    job.run(compose_config([*TINY, "trainer.max_epochs=2"], long, data_dir))
    assert json.loads((long / "run.json").read_text())["lengths"] == [{"max_epochs": 2, "max_steps": -1}]
    shutil.copy(short / "checkpoints" / "best.ckpt", long / "checkpoints" / "best.ckpt")
    (long / "metrics.json").unlink()
    with pytest.raises(job.NoResultError) as err:
        job.run(compose_config([*TINY, "trainer.max_epochs=2"], long, data_dir))
    assert str(err.value).startswith(f"no result: {long / 'checkpoints' / 'best.ckpt'} is not this run's: it was"
                                     " saved by a run of length {'max_epochs': 1, 'max_steps': -1}, which this run"
                                     " dir never trained at ({'max_epochs': 2, 'max_steps': -1})")
    eval_module = __import__("eval")  # eval.py refuses it too
    eval_cfg = compose_config([f"ckpt_path={long / 'checkpoints' / 'best.ckpt'}", "throughput_batch=2"],
                              tmp_path / "eval", data_dir, config_name="eval")
    with pytest.raises(ValueError, match="it was saved by a run of length {'max_epochs': 1, 'max_steps': -1},"
                                         " which this run dir never trained at"):
        eval_module.evaluate(eval_cfg)
    # the short run extended to 2 epochs: both lengths are its own
    job.run(compose_config([*TINY, "trainer.max_epochs=2"], short, data_dir))
    assert json.loads((short / "run.json").read_text())["lengths"] == [{"max_epochs": 1, "max_steps": -1},
                                                                      {"max_epochs": 2, "max_steps": -1}]


def test_a_logger_folder_of_the_wrong_kind_is_refused_before_the_run_is_touched(finished: Path, tmp_path: Path,
                                                                               data_dir: Path) -> None:
    """Probe 93: a finished run whose csv/ was a file, extended, printed "[Errno 17] File exists" only after
    resuming, and its record turned to failed; now refused as the checkpoints folder's wrong kind is."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    shutil.rmtree(run_dir / "csv")
    (run_dir / "csv").write_text("not a folder\n")
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    with pytest.raises(records.RunFileError) as err:
        job.run(compose_config([*TINY, "trainer.max_epochs=2"], run_dir, data_dir))
    assert str(err.value) == f"{run_dir / 'csv'} cannot be used: it is a file, where a folder belongs; move it away"
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before  # state still finished



def test_an_extension_into_an_unwritable_checkpoints_folder_is_refused_before_training(
        finished: Path, tmp_path: Path, data_dir: Path) -> None:
    """Probe case 102: a finished run extended while checkpoints/ was not writable trained a whole epoch before
    failing, and the run was then listed as failed; now refused before its record or files change."""
    from tests.helpers import file_modes_hold

    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    before = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    (run_dir / "checkpoints").chmod(0o555)
    try:
        with file_modes_hold(), pytest.raises(records.RunFileError) as err:
            job.run(compose_config([*TINY, "trainer.max_epochs=2"], run_dir, data_dir))
    finally:
        (run_dir / "checkpoints").chmod(0o755)
    assert str(err.value) == (f"cannot write {run_dir / 'checkpoints'}: permission denied (read-only storage, or a"
                              " folder this user may not write); nothing was trained or written; valid: make it"
                              " writable, or give a new run_name")
    after = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert {k: v for k, v in after.items() if k.name != "run.lock"} == {
        k: v for k, v in before.items() if k.name != "run.lock"}  # state still finished, nothing trained
    assert records.run_status(run_dir).state == "finished"

def test_a_smoke_run_gives_a_sweeper_no_value(tmp_path: Path, data_dir: Path, monkeypatch) -> None:
    """debug=fast trains a part of each epoch: optuna must not rank its number (it reported a 'best value'
    from smoke trials); a sweep job returns NaN, which optuna records as a failed trial."""
    import math

    monkeypatch.setattr(job, "_is_multirun", lambda: True)
    monkeypatch.setattr(job, "check_job_dir", lambda *_: None)  # no sweep dir here to be inside of
    value = job.run_job(compose_config(TINY, tmp_path / "run", data_dir), ROOT / "train.py")
    assert math.isnan(value) and records.run_status(tmp_path / "run").metrics["train_complete"] is False


@pytest.mark.parametrize("content", [
    [1, 2, 3], {"epoch": 1, "global_step": 4},
    {"state_dict": {}, "epoch": 1, "global_step": "4", "pytorch-lightning_version": "2.5.0"},
    {"state_dict": {}, "epoch": 0, "global_step": 1}],
    ids=["a list", "no state_dict", "a step that is text", "no Lightning version"])
def test_a_file_that_loads_but_holds_no_lightning_checkpoint_is_unreadable(tmp_path: Path, content: object) -> None:
    """A ``last.ckpt`` holding a list made the resume of an extended run (``trainer.max_epochs`` raised) a
    traceback that marked the finished run failed: every reader now takes such a file as unreadable, which the
    resume treats as a damaged checkpoint (falls back to best.ckpt with a warning, or one line)."""
    path = tmp_path / "last.ckpt"
    torch.save(content, path)
    with pytest.raises(ValueError, match="holds no Lightning checkpoint"):
        load_checkpoint(path)
    assert job._checkpoint_facts(path) is None
    (tmp_path / "checkpoints").mkdir()
    shutil.move(path, tmp_path / "checkpoints" / "last.ckpt")
    assert job.holds_results(tmp_path)  # unreadable checkpoints are kept, to be safe


def test_an_atomic_write_gives_the_file_the_mode_of_the_one_it_replaces_or_of_the_umask(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 13, j58: every record was written 0600 whatever the umask (mkstemp's mode), so a colleague could not read
    a shared run dir or archive, and a read-only README came back writable."""
    import os
    import stat

    from storage.files import atomic_write_bytes

    old = os.umask(0o022)
    try:
        atomic_write_bytes(tmp_path / "new.json", b"{}")
        assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o644
        (tmp_path / "readme.md").write_text("x")
        (tmp_path / "readme.md").chmod(0o444)
        atomic_write_bytes(tmp_path / "readme.md", b"y")
        assert stat.S_IMODE((tmp_path / "readme.md").stat().st_mode) == 0o444
        assert (tmp_path / "readme.md").read_bytes() == b"y"
        (tmp_path / "damaged.json").write_text("{}")
        (tmp_path / "damaged.json").chmod(0)  # a record damaged to mode 000 is written readable again
        atomic_write_bytes(tmp_path / "damaged.json", b"{}")
        assert stat.S_IMODE((tmp_path / "damaged.json").stat().st_mode) == 0o644
        os.umask(0o077)
        atomic_write_bytes(tmp_path / "private.json", b"{}")
        assert stat.S_IMODE((tmp_path / "private.json").stat().st_mode) == 0o600
    finally:
        os.umask(old)
