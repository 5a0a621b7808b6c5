"""scripts/evaluate_testsets.py: every finished run of a sweep on named test sets, resumably, never
overwriting a result it did not make for the same run and test set."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from lifecycle import job
from lifecycle.identity import identity_config, identity_hash
from scripts import evaluate_testsets
from storage.files import with_checksum
from tests.helpers import compose_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = [
    "debug=fast", "logger=csv", "data.root=${paths.data_dir}/relational_tiny", "data.generator.num_train=256",
    "data.generator.num_val=64", "data.num_workers=0", "data.batch_size=32", "model.net.ape=sincos",
    "print_config=false", "trainer.limit_train_batches=1.0", "trainer.limit_test_batches=1.0",
]  # whole splits: a smoke run has no result, on its own test set or another


RUN = "row=a,seed=0"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """A sweep dir with one finished run (``0``, named as a sweep names its jobs: ``row=a,seed=0``, which
    Hydra's override syntax must see quoted) and one run dir that never finished (``1``)."""
    root = tmp_path_factory.mktemp("sweep") / "shift"
    job.run(compose_config(TINY, root / RUN, data_dir))
    (root / "1").mkdir()
    shutil.copy(root / RUN / "config.yaml", root / "1" / "config.yaml")
    return root


def _main(sweep: Path, data_dir: Path, *args: str) -> int:
    return evaluate_testsets.main([str(sweep), *args, "--set", f"paths.data_dir={data_dir}",
                                   "testset.data.generator.num_val=16", "throughput_batch=2"])


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_every_finished_run_is_evaluated_once_and_kept_on_the_next_call(sweep: Path, data_dir: Path,
                                                                       capsys) -> None:
    import eval as eval_script

    code = _main(sweep, data_dir, "--testsets", "relational_right", "relational_canvas48", "--ape", "extend")
    out = capsys.readouterr().out
    assert code == 1 and f"left out {sweep / '1'}: unfinished" in out  # the unfinished run is named
    results = sweep / RUN / "testsets"
    assert sorted(p.name for p in results.iterdir()) == ["relational_canvas48@extend.json",
                                                          "relational_right@extend.json"]
    record = json.loads((results / "relational_canvas48@extend.json").read_text())
    run_cfg = compose_config(TINY, sweep / RUN, data_dir)
    assert record["identity"] == identity_hash(identity_config(run_cfg)) and record["img_size"] == [48, 48]
    # the same numbers as eval.py's own evaluation of that run and test set
    best = "'" + str(sweep / RUN / "checkpoints" / "best.ckpt") + "'"  # quoted: `=` and `,` are Hydra syntax
    cfg = compose_config([f"ckpt_path={best}", "testset=relational_canvas48",
                          "ape=extend", "testset.data.generator.num_val=16", "throughput_batch=2"],
                         sweep.parent / "eval", data_dir, config_name="eval")
    direct = eval_script.evaluate(cfg)
    assert record["metrics"]["val/top1"] == pytest.approx(direct["val/top1"])

    shutil.rmtree(sweep / "1")
    before = {p.name: p.read_bytes() for p in results.iterdir()}
    assert _main(sweep, data_dir, "--testsets", "relational_right", "relational_canvas48", "--ape", "extend") == 0
    assert capsys.readouterr().out.count("kept ") == 2
    assert {p.name: p.read_bytes() for p in results.iterdir()} == before  # nothing evaluated again

    stale = json.loads((results / "relational_right@extend.json").read_text())
    stale["length"] = {"max_epochs": 0, "max_steps": -1}  # as if evaluated before the run was extended
    (results / "relational_right@extend.json").write_text(json.dumps(stale))
    assert _main(sweep, data_dir, "--testsets", "relational_right", "--ape", "extend") == 0
    assert "(replacing the result of its earlier length {'max_epochs': 0" in capsys.readouterr().out
    again, first = (json.loads(b) for b in ((results / "relational_right@extend.json").read_bytes(),
                                             before["relational_right@extend.json"]))
    assert again["length"] == first["length"] and again["metrics"]["val/top1"] == first["metrics"]["val/top1"]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.slow  # several train.py or eval.py processes: make test's 5 minutes
def test_a_result_of_another_definition_is_never_overwritten(sweep: Path, data_dir: Path, capsys) -> None:
    path = sweep / RUN / "testsets" / "relational_right.json"
    path.parent.mkdir(exist_ok=True)
    stale = {"testset": "relational_right", "identity": "0" * 16, "ape_rule": None, "testset_config": {},
             "metrics": {"val/top1": 50.0}}
    path.write_text(json.dumps(stale))
    if (sweep / "1").exists():
        shutil.rmtree(sweep / "1")
    code = _main(sweep, data_dir, "--testsets", "relational_right", "--ape", "interpolate")
    assert code == 0  # another rule: a file of its own
    assert _main(sweep, data_dir, "--testsets", "relational_right") == 1  # the default rule: that file
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {RUN} / relational_right: {path} holds another run's result; remove it to evaluate {RUN} on"
                   " relational_right again"]
    assert json.loads(path.read_text()) == stale


@pytest.mark.filterwarnings("ignore")
@pytest.mark.slow  # several train.py or eval.py processes: make test's 5 minutes
def test_a_symlinked_testsets_folder_is_named_and_what_it_leads_to_left_alone(sweep: Path, data_dir: Path,
                                                                              tmp_path: Path, capsys) -> None:
    """A run whose ``testsets`` is a link into another run's results: evaluate_testsets and eval.py name the
    link and say to replace it with a real folder; neither reads, writes nor offers to remove what it leads to
    (it once said "holds another run's result; remove it", of the other run's file)."""
    import eval as eval_script
    from storage.files import RunFileError

    others = tmp_path / "other_run" / "testsets"
    others.mkdir(parents=True)
    theirs = others / "relational_right@interpolate.json"
    theirs.write_text(json.dumps({"testset": "relational_right", "identity": "0" * 16, "metrics": {"val/top1": 1.0}}))
    run = tmp_path / "run"
    shutil.copytree(sweep / RUN, run, ignore=shutil.ignore_patterns("testsets"))
    (run / "testsets").symlink_to(others, target_is_directory=True)
    expected = (f"{run / 'testsets'}: it is a symlink (to {others}), where the run's own folder of test-set results"
                " belongs; replace the link with a real folder (remove the link itself: what it leads to is not this"
                " run's, it may be another run's folder) (nothing was evaluated)")
    assert _main(run, data_dir, "--testsets", "relational_right") == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"error: run / relational_right: {expected}"]
    cfg = compose_config([f"ckpt_path={run / 'checkpoints' / 'best.ckpt'}", "testset=relational_right",
                          "testset.data.generator.num_val=16", "throughput_batch=2"], tmp_path / "eval", data_dir,
                         config_name="eval")
    with pytest.raises(RunFileError) as err:
        eval_script.evaluate(cfg)
    assert str(err.value) == expected
    assert [p.name for p in others.iterdir()] == [theirs.name]
    assert json.loads(theirs.read_text())["identity"] == "0" * 16  # read by neither, written by neither


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(("mode", "cannot"), [(0o000, "list and read"), (0o555, "write")])
def test_a_testsets_folder_that_cannot_be_used_is_named_before_any_test(
        mode: int, cannot: str, sweep: Path, data_dir: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """Probe 8 cases B10, B11: ``<run>/testsets`` of mode 000 or 555: eval.py refused only after the whole test
    (writing the result), and evaluate_testsets named a file that is not the result's (``relational_right.json``,
    where the result is ``relational_right@interpolate.json``). Both name the folder, before any test."""
    import eval as eval_script
    from storage.files import RunFileError
    from tests.helpers import file_modes_hold

    def tested(*args: object, **kwargs: object) -> None:
        raise AssertionError("the test ran")

    run = tmp_path / "run"
    shutil.copytree(sweep / RUN, run, ignore=shutil.ignore_patterns("testsets"))
    folder = run / "testsets"
    folder.mkdir()
    assert _main(run, data_dir, "--testsets", "relational_right") == 0  # the test set's data made
    capsys.readouterr()
    for result in folder.iterdir():
        result.unlink()
    monkeypatch.setattr(eval_script, "build_trainer", tested)
    expected = (f"cannot {cannot} {folder}: permission denied (read-only storage, or a folder this user may not use);"
                " nothing was evaluated; valid: make it readable and writable")
    # evaluate_testsets first reads what is there (a sound result is kept without a write), then evaluates
    listed = expected.replace("readable and writable", "readable") if cannot == "list and read" else expected
    cfg = compose_config([f"ckpt_path={run / 'checkpoints' / 'best.ckpt'}", "testset=relational_right",
                          "testset.data.generator.num_val=16", "throughput_batch=2"], tmp_path / "eval", data_dir,
                         config_name="eval")
    folder.chmod(mode)
    try:
        with file_modes_hold():
            assert _main(run, data_dir, "--testsets", "relational_right") == 1
            assert capsys.readouterr().err.strip().splitlines() == [f"error: run / relational_right: {listed}"]
            with pytest.raises(RunFileError) as err:
                eval_script.evaluate(cfg)
    finally:
        folder.chmod(0o755)
    assert str(err.value) == expected
    assert list(folder.iterdir()) == []


@pytest.mark.filterwarnings("ignore")
def test_a_result_of_an_earlier_training_is_evaluated_again(sweep: Path, data_dir: Path, tmp_path: Path,
                                                             capsys) -> None:
    """Probe 8 case B6: a result whose training token is not the one metrics.json records (weights trained
    before in this run dir) is no result make_tables counts: evaluate_testsets evaluates it again, saying why;
    the new one records the token of the run's best.ckpt."""
    run = tmp_path / "run"
    shutil.copytree(sweep / RUN, run, ignore=shutil.ignore_patterns("testsets"))
    trained = json.loads((run / "metrics.json").read_text())["training"]
    assert _main(run, data_dir, "--testsets", "relational_right") == 0
    result = run / "testsets" / "relational_right@interpolate.json"
    record = json.loads(result.read_text())
    assert record["training"] == trained
    record.pop("checksum")
    record["training"] = "0" * 16
    result.write_text(json.dumps(with_checksum(record)))
    capsys.readouterr()
    assert _main(run, data_dir, "--testsets", "relational_right") == 0
    assert ("(replacing a result that is not counted: it measured the weights of an earlier training in this run dir"
            f" (training '{'0' * 16}'; the run's best.ckpt is of training '{trained}'))") in capsys.readouterr().out
    assert json.loads(result.read_text())["training"] == trained


@pytest.mark.filterwarnings("ignore")
def test_a_result_is_kept_only_beside_the_checkpoint_file_it_measured(sweep: Path, data_dir: Path, tmp_path: Path,
                                                                      capsys) -> None:
    """Probe 23, p44: a result was "kept" beside a best.ckpt replaced after it was measured; nothing tied it to the
    file. It records the file's sha256; another file in its place (here the same step and token, other weights)
    is evaluated again, saying why."""
    import hashlib

    import torch

    from lifecycle.testset_definition import CHECKPOINT_SHA256_KEY

    run = tmp_path / "run"
    shutil.copytree(sweep / RUN, run, ignore=shutil.ignore_patterns("testsets"))
    best = run / "checkpoints" / "best.ckpt"
    assert _main(run, data_dir, "--testsets", "relational_right") == 0
    result = run / "testsets" / "relational_right@interpolate.json"
    assert json.loads(result.read_text())[CHECKPOINT_SHA256_KEY] == hashlib.sha256(best.read_bytes()).hexdigest()
    capsys.readouterr()
    assert _main(run, data_dir, "--testsets", "relational_right") == 0
    assert f"kept {result}" in capsys.readouterr().out

    checkpoint = torch.load(best, map_location="cpu", weights_only=True)
    name = next(k for k, v in checkpoint["state_dict"].items() if v.is_floating_point())
    checkpoint["state_dict"][name] = checkpoint["state_dict"][name] + 1.0
    torch.save(checkpoint, best)
    assert _main(run, data_dir, "--testsets", "relational_right") == 0
    out = capsys.readouterr().out
    assert "(replacing the result of another file: best.ckpt changed since it was measured)" in out, out
    assert json.loads(result.read_text())[CHECKPOINT_SHA256_KEY] == hashlib.sha256(best.read_bytes()).hexdigest()


def test_bad_arguments_are_one_line(tmp_path: Path, capsys) -> None:
    assert evaluate_testsets.main([str(tmp_path), "--testsets", "relational_leftish"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --testsets relational_leftish is not a test set; valid: ") and "\n" not in err
    assert evaluate_testsets.main([str(tmp_path / "nowhere"), "--testsets", "relational_right"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'nowhere'} is not a run or sweep dir"
    assert evaluate_testsets.main([str(tmp_path), "--testsets", "relational_right", "--ape", "stretch"]) == 2
    assert "ape='stretch' is not an APE rule; valid: interpolate, extend" in capsys.readouterr().err
    for extra, expected in (("ckpt_path=/elsewhere/best.ckpt", "--set ckpt_path=/elsewhere/best.ckpt would replace"),
                            ("batchsize", "--set 'batchsize' is not key=value"),
                            # probe 11, e110: silently ignored
                            ("hydra.run.dir=/tmp/r110", "--set hydra.run.dir=/tmp/r110 is not a setting of the"
                                                        " evaluations")):
        assert evaluate_testsets.main([str(tmp_path), "--testsets", "relational_right", "--set", extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {expected}") and err.count("\n") == 1, err


def test_a_path_without_runs_and_an_unknown_set_key_are_refused_before_anything(tmp_path: Path, capsys) -> None:
    """Probes 140/147: an empty (typo'd) sweep dir evaluated nothing and exited 0, even after printing that a
    test set's data could not be made; probe 146: an unknown --set key was OmegaConf's raw text, rc 1."""
    data = tmp_path / "data"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert evaluate_testsets.main([str(empty), "--testsets", "relational_right", "--set",
                                   f"paths.data_dir={data}"]) == 2
    assert capsys.readouterr() == ("", f"error: {empty} holds no run (no config.yaml or checkpoints/ in it or in its"
                                       " sub-folders); valid: a train.py run dir or a sweep dir of them\n")
    assert evaluate_testsets.main([str(empty), "--testsets", "relational_right", "--set",
                                   f"paths.data_dir={data}", "bogus_key=1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: bogus_key is not a config key; valid keys of the root config: ape,"
                                        " batch_size,") and err.count("\n") == 1, err
    assert not data.exists()  # no test set's data was made for either


@pytest.mark.filterwarnings("ignore")
def test_a_run_or_test_set_named_twice_is_evaluated_once(sweep: Path, data_dir: Path, tmp_path: Path,
                                                         capsys) -> None:
    """Probe 145: the one (run, test set) pair was counted 4 times; runs are the same by resolved path. (The
    interpolate rule: a result of its own, beside the default rule's stale file another test leaves.)"""
    link = tmp_path / "link"
    link.symlink_to(sweep / RUN)
    assert evaluate_testsets.main([str(sweep / RUN), str(link), "--testsets", "relational_right",
                                   "relational_right", "--ape", "interpolate", "--set", f"paths.data_dir={data_dir}",
                                   "testset.data.generator.num_val=16", "throughput_batch=2"]) == 0
    out = capsys.readouterr().out
    assert out.count(f"{RUN} / relational_right: ") == 1, out
    assert "1 runs x 1 test sets; 1 evaluated or kept, 0 not" in out


def test_a_smoke_run_is_left_out(sweep: Path, data_dir: Path, tmp_path: Path, capsys) -> None:
    smoke = tmp_path / "smoke"
    shutil.copytree(sweep / RUN, smoke)
    metrics = json.loads((smoke / "metrics.json").read_text())
    (smoke / "metrics.json").write_text(json.dumps(with_checksum({**metrics, "train_complete": False})))
    shutil.rmtree(smoke / "testsets", ignore_errors=True)
    assert _main(smoke, data_dir, "--testsets", "relational_right") == 1
    assert f"left out {smoke}: a smoke run (each epoch trained on a part" in capsys.readouterr().out
    assert not (smoke / "testsets").exists()


def test_a_run_whose_config_was_edited_after_training_is_left_out(sweep: Path, data_dir: Path, tmp_path: Path,
                                                                   capsys) -> None:
    """Probe 22, k34: a run copy whose config.yaml names ``trainer._target_: os.system`` (edited after training) had
    its earlier result "kept" and counted, where make_tables calls the run unreadable. Left out in one line, as
    make_tables does; nothing is run or written."""
    edited = tmp_path / "edited"
    shutil.copytree(sweep / RUN, edited)
    (edited / "testsets").mkdir(exist_ok=True)
    (edited / "testsets" / "relational_right@interpolate.json").write_text("{}")
    config = (edited / "config.yaml").read_text()
    assert "_target_: lightning.pytorch.Trainer" in config
    (edited / "config.yaml").write_text(config.replace("_target_: lightning.pytorch.Trainer", "_target_: os.system"))
    before = sorted(p.name for p in (edited / "testsets").iterdir())
    assert _main(edited, data_dir, "--testsets", "relational_right") == 1
    out = capsys.readouterr().out
    assert (f"left out {edited}: unreadable: {edited / 'config.yaml'} is not the config of {edited / 'run.json'}"
            " (damaged or edited?): trainer._target_: lightning.pytorch.Trainer -> os.system") in out, out
    assert "0 evaluated or kept, 1 not" in out and sorted(p.name for p in (edited / "testsets").iterdir()) == before


@pytest.mark.filterwarnings("ignore")
def test_a_run_path_is_never_interpolated(sweep: Path, data_dir: Path, tmp_path: Path, capsys) -> None:
    """A run dir literally named ``${task_name}x`` is the run evaluated: its path is set on the composed config,
    never handed to Hydra as override text (which would read it as another run's, ``evalx``)."""
    literal = tmp_path / "${task_name}x"
    shutil.copytree(sweep / RUN, literal, ignore=shutil.ignore_patterns("testsets"))
    (tmp_path / "evalx").mkdir()
    assert _main(literal, data_dir, "--testsets", "relational_right") == 0
    assert "1 evaluated or kept, 0 not" in capsys.readouterr().out
    assert [p.name for p in (literal / "testsets").iterdir()] == ["relational_right@interpolate.json"]
    assert not any((tmp_path / "evalx").iterdir())


@pytest.mark.filterwarnings("ignore")
def test_testset_name_and_a_partial_test_are_refused_before_anything_runs(sweep: Path, data_dir: Path,
                                                                         capsys) -> None:
    """The probe: ``--set trainer.limit_test_batches=1`` replaced a sweep's results with tests of one batch."""
    results = sweep / RUN / "testsets"
    before = {p.name: p.read_bytes() for p in results.iterdir()} if results.is_dir() else {}
    for extra, expected in (
        ("testset.name=relational_right", "--set testset.name=relational_right would file one test set's result"
                                          " under another's name; valid: name the test set in --testsets"
                                          " (configs/testset/<name>.yaml)"),
        ("trainer.limit_test_batches=1", "--set trainer.limit_test_batches=1 is not a setting of a test-set"
                                         " evaluation: its result is of the whole set (each test set), never of a"
                                         " limited test (nothing was evaluated); valid: trainer.limit_test_batches=null"
                                         " or 1.0, no trainer.fast_dev_run"),
    ):
        assert evaluate_testsets.main([str(sweep), "--testsets", "relational_left", "--set",
                                       f"paths.data_dir={data_dir}", extra]) == 2
        out, err = capsys.readouterr()
        assert (out, err) == ("", f"error: {expected}\n")
    after = {p.name: p.read_bytes() for p in results.iterdir()} if results.is_dir() else {}
    assert after == before


def test_a_device_this_machine_lacks_or_one_data_folder_for_two_test_sets_is_refused_before_anything(
        sweep: Path, data_dir: Path, tmp_path: Path, capsys) -> None:
    """Probe 5, case 86: ``--set trainer=gpu`` on a CPU machine was Lightning's error once per run, exit 1
    (eval.py refuses it at its command line); case 88's one folder for two test sets' data, as
    generate_testsets.py refuses it. Both are one line, exit 2, before any data is made or run touched."""
    import torch

    results = sweep / RUN / "testsets"
    before = {p.name: p.read_bytes() for p in results.iterdir()} if results.is_dir() else {}
    one = tmp_path / "one"
    cases = [(["--testsets", "relational_left", "relational_right", "--set", f"testset.data.root={one}"],
              f"error: testset.data.root of relational_left and relational_right is one folder, {one}: each test"
              " set's data needs a folder of its own (nothing was generated); valid: ")]
    if not torch.cuda.is_available():
        cases.append((["--testsets", "relational_left", "--set", "trainer=gpu", "trainer.precision=32-true"],
                      "error: trainer.accelerator=gpu needs a GPU, but none is visible on this machine; valid here:"
                      " trainer.accelerator=cpu"))
    for args, expected in cases:
        assert evaluate_testsets.main([str(sweep), *args, f"paths.data_dir={tmp_path / 'data'}"]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(expected) and err.count("\n") == 1, err
    assert not one.exists() and not (tmp_path / "data").exists()
    after = {p.name: p.read_bytes() for p in results.iterdir()} if results.is_dir() else {}
    assert after == before


def test_runs_are_found_as_make_tables_finds_them(tmp_path: Path) -> None:
    """Probe 5, case 87: a run dir named ``.hid`` was skipped without a word while make_tables counted it.
    evaluate_testsets.py now finds runs with make_tables' discovery (hidden ones, runs of nested sweeps, a run
    whose config is only in ``.hydra/``), plus a run that lost its config but kept its checkpoints (reported,
    never skipped); a ``checkpoints`` folder in the path given hides nothing."""
    from reports.collect import run_dirs

    root = tmp_path / "checkpoints" / "runs"
    for run, config in (("vis", "config.yaml"), (".hid", "config.yaml"), ("sweeps/a/0", "config.yaml"),
                        ("old", ".hydra/config.yaml"), ("vis/checkpoints/copy", "config.yaml")):
        (root / run / config).parent.mkdir(parents=True, exist_ok=True)
        (root / run / config).write_text("{}\n")
    (root / "lost" / "checkpoints").mkdir(parents=True)
    (root / "empty").mkdir()
    expected = [root / ".hid", root / "lost", root / "old", root / "sweeps/a/0", root / "vis"]
    assert evaluate_testsets.find_runs([root]) == expected
    assert run_dirs(root) == [p for p in expected if p.name != "lost"]  # make_tables' runs: the same ones
    assert evaluate_testsets.find_runs([root / ".hid"]) == [root / ".hid"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_a_test_exits_128_plus_its_number_with_one_line(sweep: Path, data_dir: Path, signum: int,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys) -> None:
    """Probe 5, case 124: Ctrl-C during the test loop was Lightning's "Detected KeyboardInterrupt", exit 1, no
    line. The signal now comes in the middle of a real ``trainer.test``: exit 128 + signum, one line, and the
    process's own handlers are back after."""
    import lightning as L
    from lightning.pytorch.demos.boring_classes import BoringModel

    class SignalledInTest(BoringModel):
        def test_step(self, batch, batch_idx):
            if batch_idx == 1:
                os.kill(os.getpid(), signum)
            return super().test_step(batch, batch_idx)

    def evaluate_run(*args, **kwargs) -> str:
        trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False)
        trainer.test(SignalledInTest(), verbose=False)
        raise AssertionError("the test went on after the signal")

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(evaluate_testsets, "evaluate_run", evaluate_run)
    with pytest.raises(SystemExit) as exit_:
        _main(sweep, data_dir, "--testsets", "relational_right")
    assert exit_.value.code == 128 + signum
    err = capsys.readouterr().err
    assert err.endswith(f"error: evaluate_testsets.py interrupted by {signal.Signals(signum).name}; the results"
                        " written so far are whole, the one in progress was not written: run the same command again"
                        " to finish\n"), err
    assert "KeyboardInterrupt" not in err and "Traceback" not in err
    assert {s: signal.getsignal(s) for s in handlers} == handlers


@pytest.mark.filterwarnings("ignore")
@pytest.mark.slow  # several train.py or eval.py processes: make test's 5 minutes
def test_make_tables_counts_a_whole_result_of_the_yamls_definition_and_a_partial_one_is_evaluated_again(
        sweep: Path, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The hash eval.py records is the one make_tables recomputes from configs/testset/<name>.yaml (here a copy
    with the 16 images these tests generate); a result that read part of the set is not counted, and the next
    call evaluates it again."""
    from lifecycle.testsets import write_result
    from reports import collect

    if (sweep / "1").exists():
        shutil.rmtree(sweep / "1")
    assert _main(sweep, data_dir, "--testsets", "relational_right", "--ape", "extend") == 0
    path = sweep / RUN / "testsets" / "relational_right@extend.json"
    committed = collect.TESTSET_CONFIGS
    configs = tmp_path / "testset"
    configs.mkdir()
    text = (committed / "relational_right.yaml").read_text()
    assert "num_val: 2000" in text
    (configs / "relational_right.yaml").write_text(text.replace("num_val: 2000", "num_val: 16"))
    monkeypatch.setattr(collect, "TESTSET_CONFIGS", configs)

    def column() -> tuple[float | None, str | None]:
        run = collect.load_run(sweep / RUN)
        assert run.status == "ok"
        return (run.metrics.get("relational_right@extend/val/top1"),
                dict(run.testset_problems).get("testsets/relational_right@extend.json"))

    top1, problem = column()
    assert problem is None and top1 == json.loads(path.read_text())["metrics"]["val/top1"]
    whole = json.loads(path.read_text())
    write_result(path, {**{k: v for k, v in whole.items() if k != "checksum"}, "images_read": 8})  # as before the fix
    assert column() == (None, "it is a partial test: it read 8 of the test set's 16 images (a trainer batch limit):"
                              " evaluate it again on the whole set (scripts/evaluate_testsets.py)")
    capsys.readouterr()
    assert _main(sweep, data_dir, "--testsets", "relational_right", "--ape", "extend") == 0
    assert "(replacing a partial result: 8 of 16 images)" in capsys.readouterr().out
    assert json.loads(path.read_text())["images_read"] == 16 and column() == (top1, None)
    monkeypatch.setattr(collect, "TESTSET_CONFIGS", committed)  # the yaml as committed: 2000 images
    assert column() == (None, "it is of another definition of 'relational_right' than"
                              " configs/testset/relational_right.yaml (result -> yaml: data.generator.num_val: 16"
                              " -> 2000): evaluate it again (scripts/evaluate_testsets.py), or remove it")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_another_precision_or_other_data_for_a_run_own_data_test_set_is_refused_or_evaluated_again(
        sweep: Path, data_dir: Path, tmp_path: Path, capsys) -> None:
    """Probe 2026-12-05 cases 127, 128: ``--testsets val_at_48 --set data_root=<another data set>`` wrote and
    counted a result of other images under the run's val_at_48, and a precision override left no trace.
    Another precision is refused before anything runs, other data in one line per run, nothing written; a
    result make_tables does not count for either reason is evaluated again."""
    from data.fake import make_fake_imagefolder
    from lifecycle.testsets import write_result
    from reports import collect

    if (sweep / "1").exists():
        shutil.rmtree(sweep / "1")
    base = [str(sweep), "--testsets", "val_at_48", "--set", f"paths.data_dir={data_dir}", "throughput_batch=2"]
    path = sweep / RUN / "testsets" / "val_at_48@interpolate.json"
    for extra, named in (("trainer.precision=bf16-mixed", "trainer.precision=bf16-mixed"),
                         ("trainer=gpu", "trainer=gpu (trainer.precision=bf16-mixed)")):
        assert evaluate_testsets.main([*base, extra]) == 2
        assert capsys.readouterr() == ("", f"error: --set {named}: every test-set column is measured at 32-true,"
                                           " whatever precision each run trained at (nothing was evaluated); valid:"
                                           " no trainer.precision (or 32-true; with trainer=gpu too)\n")
    other = make_fake_imagefolder(tmp_path / "other", num_classes=8, per_class=2)
    assert evaluate_testsets.main([*base, f"data_root={other}"]) == 1
    out, err = capsys.readouterr()
    assert err == (f"error: {RUN} / val_at_48: data_root={other} is not this run's data: testset=val_at_48 measures"
                   f" the run's own data (data.root={data_dir / 'relational_tiny'}), and it has no .complete.json of"
                   " the run's generator (nothing was evaluated); valid: drop data_root, or data_root=<a copy of the"
                   " run's generated data (the same generator settings)>\n")
    assert "0 evaluated or kept, 1 not" in out and not path.exists()

    assert evaluate_testsets.main(base) == 0  # the run's own data
    record = json.loads(path.read_text())
    assert (record["data_root"], record["precision"]) == (str(data_dir / "relational_tiny"), "32-true")
    assert collect.load_run(sweep / RUN).metrics["val_at_48@interpolate/val/top1"] == record["metrics"]["val/top1"]
    capsys.readouterr()
    for edits, why in (
        ({"data_root": str(other), "data_sha256": None, "data_generator": None},  # as the probe's run left it
         f"it read data_root={other}, not this run's data (data.root={data_dir / 'relational_tiny'}), and test set"
         " 'val_at_48' measures the run's own data"),
        ({"precision": "bf16-mixed"},
         "it was evaluated at trainer.precision=bf16-mixed, and every test-set column is measured at 32-true"),
    ):
        write_result(path, {**{k: v for k, v in record.items() if k != "checksum"}, **edits})
        run = collect.load_run(sweep / RUN)
        assert "val_at_48@interpolate/val/top1" not in run.metrics
        assert dict(run.testset_problems)["testsets/val_at_48@interpolate.json"].startswith(why)
        assert evaluate_testsets.main(base) == 0
        assert f"(replacing a result that is not counted: {why})" in capsys.readouterr().out
        again = json.loads(path.read_text())
        assert {k: again[k] for k in ("data_root", "data_sha256", "precision")} == \
            {k: record[k] for k in ("data_root", "data_sha256", "precision")}
        assert collect.load_run(sweep / RUN).metrics["val_at_48@interpolate/val/top1"] == record["metrics"]["val/top1"]


def test_a_profiler_that_would_write_into_a_run_or_the_test_sets_data_is_refused_before_anything(
        tmp_path: Path, capsys) -> None:
    """Probe 18, s90/s91: ``--set trainer.profiler={..., dirpath: <another run>}`` (or a folder inside the test
    set's data root) wrote the profiler's report there while the runs were evaluated."""
    other = tmp_path / "s81"
    (other / "checkpoints").mkdir(parents=True)
    (other / "run.json").write_text('{"state": "finished"}')
    data = tmp_path / "data"
    root = data / "testsets" / "relational_right_v2"
    for folder, where in ((other, f"is the run dir {other}"), (root / "p", f"is inside the data root {root}")):
        profiler = f"trainer.profiler={{_target_:lightning.pytorch.profilers.SimpleProfiler,dirpath:{folder}," \
                   "filename:et}"
        assert evaluate_testsets.main([str(tmp_path), "--testsets", "relational_right", "--set",
                                       f"paths.data_dir={data}", profiler]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(f"error: trainer.profiler.dirpath={str(folder)!r} {where}"), err
        assert "valid: a folder outside every run dir, data root, sweep dir and archive" in err and \
            err.count("\n") == 1
    assert sorted(p.name for p in other.iterdir()) == ["checkpoints", "run.json"] and not data.exists()
