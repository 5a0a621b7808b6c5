"""The fault matrix: every file of a finished run dir x every damage x every command that reads it.

One tiny run is trained once and evaluated once on a small test set; each case copies it, damages one file,
runs one command in this process and checks the outcome `expected_outcome` allows for that cell (the same
table as docs/reliability.md's "The fault matrix", which a test here keeps in step):

* ``continue``: the command succeeds and reports the run's true result (the recorded ``val/top1``);
* ``repair``: train.py reports the run's true result, which stands, and writes the damaged file again: a
  ``config.yaml`` from the command's config (whose identity run.json names), a ``run.json`` from config.yaml
  (finished: metrics.json is the finished result of that config and length);
* ``retest``: train.py re-tests ``best.ckpt`` (evaluate_testsets.py evaluates it on the test set again) and
  writes the same result again;
* ``refuse``: one line naming the damaged path, a non-zero exit, and no file of the run dir changed;
* ``listed``: make_tables.py lists the run by name as not counted, and the table is still built (a damaged
  test-set result: make_tables lists that file and counts the run without it);
* ``counted``: make_tables.py counts the run with its true result (and its true test-set result);
* ``-``: not run: the command never opens that file in a finished run dir (`OPENS`; for the cells that came
  with the test-set result only, the earlier ones all run).

Whatever the outcome, nothing is lost (no undamaged file changes unless it is rewritten with the same
content) and nothing wrong is reported.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import hashlib
import io
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

from lifecycle import job
from storage.files import with_checksum
from tests.helpers import ROOT, compose_config, file_modes_hold

TESTSET, OTHER_TESTSET = "relational_right", "relational_left"  # the test set of the result, and another one
RESULT = f"testsets/{TESTSET}@interpolate.json"  # eval.py's name for it: the tiny run's learned APE, default rule
# evaluate_testsets.py's settings: 16 images (``configs/testset/*.yaml``, copied with 16 in `testset_yamls`)
TESTSET_SETTINGS = ["testset.data.generator.num_val=16", "throughput_batch=2"]

FILES: dict[str, str] = {  # path in the run dir -> kind
    "run.json": "json", "metrics.json": "json", "failed.json": "json", "config.yaml": "yaml",
    ".hydra/config.yaml": "yaml", ".hydra/overrides.yaml": "yaml", "run.lock": "lock",
    "checkpoints/last.ckpt": "ckpt", "checkpoints/best.ckpt": "ckpt", "checkpoints": "folder", ".": "run dir",
    RESULT: "result",
}
DAMAGES = ("missing", "empty", "truncated", "wrong type", "deeply nested", "no number", "edited", "other length",
           "partial", "relabelled", "wrong kind", "symlink elsewhere", "symlink loop", "mode 000", "read-only",
           "full disk")
COMMANDS = ("train", "eval", "plot_rpe", "make_tables", "archive_runs", "evaluate_testsets")
CONTENT_DAMAGES = ("empty", "truncated", "wrong type")
STORAGE_DAMAGES = ("read-only", "full disk")
STRAY_FAILURE = '{"status": "failed", "error": "x"}\n'  # a failed.json beside a finished run's records
DEEP = "[" * 200000 + "]" * 200000  # past `data.bounded_json.MAX_JSON_DEPTH`: once a RecursionError
RECORDS = ("run.json", "metrics.json", "failed.json")
ADDED_DAMAGES = ("deeply nested", "symlink loop", "mode 000")  # with the test-set result, evaluate_testsets...
# ... and the result file, their cells are run only where the command opens the file in a finished run dir
# (the earlier cells all run): train checks every record and checkpoint before it starts, make_tables and
# archive_runs walk the whole run dir, evaluate_testsets keeps the run's result without loading a checkpoint.
OPENS: dict[str, tuple[str, ...]] = {
    "train": tuple(f for f in FILES if f != RESULT),
    "eval": (*RECORDS, "config.yaml", "checkpoints/best.ckpt", "checkpoints"),  # run_status, config, weights
    "plot_rpe": ("config.yaml", "checkpoints/best.ckpt", "checkpoints"),
    "make_tables": tuple(FILES), "archive_runs": tuple(FILES),
    "evaluate_testsets": (*RECORDS, "config.yaml", RESULT),
}


def opened(command: str, file: str, damage: str) -> bool:
    """Whether the cell is run: `OPENS`, for the cells that came with the test-set result."""
    added = command == "evaluate_testsets" or file == RESULT or damage in ADDED_DAMAGES
    return not added or file == "." or file in OPENS[command]


def applies(file: str, damage: str) -> bool:
    """Which damages a path can have: a lock file has no content to damage, a folder none at all."""
    kind = FILES[file]
    if damage in ("no number", "other length"):  # the result file, well-formed but not the run's
        return file == "metrics.json"
    if damage == "edited":  # a number changed by hand in a file that carries a checksum
        return file in ("metrics.json", RESULT)
    if damage in ("partial", "relabelled"):  # what only a test-set result records: its images and its test set
        return file == RESULT
    if damage == "deeply nested":
        return kind in ("json", "result")
    if damage in ("mode 000", "symlink loop") and file in (".hydra/config.yaml", "checkpoints/last.ckpt"):
        return False  # a finished run's: only train's check of their kind opens them ("wrong kind" rows)
    if damage == "symlink loop" and file == "run.lock":
        return False  # train's check refuses any link there, as in the "symlink elsewhere" row
    if kind == "run dir":
        return damage in STORAGE_DAMAGES
    if kind in ("lock", "folder"):
        return damage not in CONTENT_DAMAGES
    if file == "failed.json":  # a finished run has none: its damages are a stray file
        return damage != "missing"
    return True


def expected_outcome(command: str, file: str, damage: str) -> str:
    """The one allowed outcome of ``command`` on a finished run dir whose ``file`` has ``damage``."""
    if not opened(command, file, damage):
        return "-"
    storage = damage in STORAGE_DAMAGES
    if file == RESULT:  # read by make_tables, archive_runs and evaluate_testsets only
        if storage:  # read, never written (evaluate_testsets keeps a sound result)
            return "continue" if command != "make_tables" else "counted"
        if damage == "missing":  # the run has no result on that test set: nothing to count or archive
            return {"make_tables": "counted", "archive_runs": "continue", "evaluate_testsets": "retest"}[command]
        if command == "evaluate_testsets":  # a partial or edited result is replaced; no other is overwritten
            return "retest" if damage in ("partial", "edited") else "refuse"
        return "listed" if command == "make_tables" else "refuse"
    if command == "train":  # a finished run needs no write; a record it cannot trust is rebuilt by re-testing
        if damage in ("wrong kind", "symlink elsewhere", "symlink loop"):
            return "refuse"
        if file == "config.yaml" and not storage:  # what eval, plot_rpe and the tables read: written again
            return "repair"
        if file == "run.json" and not storage:  # rebuilt from config.yaml; metrics.json, the finished result, stands
            return "repair"
        if file in RECORDS and not storage:  # failed.json: a stray one
            return "retest"
        if damage == "mode 000" and file == "run.lock":
            return "refuse"  # the lock it must take before it reads or writes anything, and may not open
        if damage == "mode 000" and file == "checkpoints":
            return "refuse"  # it cannot see which checkpoints are there: unreadable is never taken for absent
        return "continue"
    if command in ("eval", "plot_rpe"):  # they read config.yaml and best.ckpt, and write nothing but plots
        if file in ("config.yaml", "checkpoints/best.ckpt", "checkpoints") and not storage:
            return "refuse"
        if command == "plot_rpe" and file == "." and storage:  # its plots go to <run dir>/plots
            return "refuse"
        return "continue"
    read_by_tables = (*RECORDS, "config.yaml")
    if command == "make_tables":
        if file in read_by_tables and not storage and not (file == "run.json" and damage == "missing"):
            return "listed"
        return "counted"
    if command == "evaluate_testsets":  # it reads the run's records and config, then keeps the run's result
        if file in read_by_tables and not storage and not (file == "run.json" and damage == "missing"):
            return "refuse"
        return "continue"
    # archive_runs copies config.yaml, .hydra/overrides.yaml, run.json and the result files
    if file in (*read_by_tables, ".hydra/overrides.yaml") and not storage and not (file == "run.json"
                                                                                    and damage == "missing"):
        return "refuse"
    return "continue"


CELLS = [(c, f, d) for c in COMMANDS for f in FILES for d in DAMAGES
         if applies(f, d) and expected_outcome(c, f, d) != "-"]

TINY = [
    "debug=fast", "logger=csv", "data.root=${paths.data_dir}/relational_tiny", "data.generator.num_train=256",
    "data.generator.num_val=64", "data.num_workers=0", "data.batch_size=32", "trainer.limit_train_batches=1.0",
    "trainer.limit_val_batches=2", "trainer.limit_test_batches=2", "print_config=false",
]  # whole splits (8 training and 2 test batches): the run has a result make_tables counts


def _fingerprint(run_dir: Path) -> dict[str, str]:
    return {p.relative_to(run_dir).as_posix(): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file() and not p.is_symlink() and "plots" not in p.parts}


@pytest.fixture(scope="module")
def testset_yamls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """make_tables.py compares a result with ``configs/testset/<name>.yaml``: here copies with the 16 images
    the matrix evaluates (the committed 2000 would make every result another definition's, never counted)."""
    from reports import collect

    folder = tmp_path_factory.mktemp("testset_yamls")
    for name in (TESTSET, OTHER_TESTSET):
        text = (collect.TESTSET_CONFIGS / f"{name}.yaml").read_text()
        assert "num_val: 2000" in text
        (folder / f"{name}.yaml").write_text(text.replace("num_val: 2000", "num_val: 16"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(collect, "TESTSET_CONFIGS", folder)
        yield folder


def _evaluate_testsets(sweep: Path, data_dir: Path, *testsets: str) -> int:
    from scripts import evaluate_testsets

    return evaluate_testsets.main([str(sweep), "--testsets", *testsets, "--set", f"paths.data_dir={data_dir}",
                                   *TESTSET_SETTINGS])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, data_dir: Path, testset_yamls: Path) -> dict[str, Path]:
    """Two finished tiny runs of different models: ``victim`` (damaged by the cases) and ``other`` (what a
    symlink points to), each in a sweep dir of its own so that archive_runs can take it, each with its result
    on `TESTSET`; and ``relabelled``, the victim's result on `OTHER_TESTSET` (kept outside its run dir)."""
    root = tmp_path_factory.mktemp("matrix")
    made = {}
    for name, extra in (("victim", []), ("other", ["rpe=irpe_qkv"])):
        run_dir = root / name / "0"
        job.run(compose_config([*TINY, *extra], run_dir, data_dir))
        (root / name / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"sweeper": {"_target_": "optuna"}}}))
        made[name] = run_dir
    assert _evaluate_testsets(root / "victim", data_dir, TESTSET, OTHER_TESTSET) == 0
    assert _evaluate_testsets(root / "other", data_dir, TESTSET) == 0
    made["relabelled"] = root / f"{OTHER_TESTSET}.json"
    (made["victim"] / RESULT.replace(TESTSET, OTHER_TESTSET)).rename(made["relabelled"])
    return made


@contextlib.contextmanager
def mode_000(path: Path) -> Iterator[None]:
    """``chmod 000 path`` for the block, with file modes holding (`file_modes_hold`); the mode is put back
    after, so that the fingerprints and the clean-up can read the run dir."""
    mode = path.stat().st_mode & 0o7777
    path.chmod(0)
    try:
        with file_modes_hold():
            yield
    finally:
        if path.exists():  # a command may have replaced it (with the mode it makes)
            path.chmod(mode)


def _damage(run_dir: Path, file: str, damage: str, runs: dict[str, Path]) -> None:
    path = run_dir / file
    kind = FILES[file]
    if damage == "missing":
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        data = path.read_bytes() if path.exists() else STRAY_FAILURE.encode()
        path.write_bytes(data[: max(1, len(data) // 2)])
    elif damage == "mode 000":  # set while the command runs (`mode_000`); failed.json: a stray one to set it on
        if not path.exists():
            path.write_text(STRAY_FAILURE)
    elif damage == "deeply nested":  # what a damaged or hostile record may hold
        path.write_text(DEEP)
    elif damage == "no number":
        path.write_text(json.dumps({**json.loads(path.read_text()), "val/top1": None}) + "\n")
    elif damage == "other length":  # the same config's result after one more epoch, as its job wrote it
        record = json.loads(path.read_text())
        steps = record["global_step"] // record["epoch"]
        record.update(epoch=record["epoch"] + 1, global_step=record["global_step"] + steps,
                      best_epoch=record["epoch"] + 1)
        path.write_text(json.dumps(with_checksum(record), indent=2, sort_keys=True) + "\n")
    elif damage == "edited":  # a plausible number put in by hand: the file is otherwise as the run wrote it
        record = json.loads(path.read_text())
        metrics = record["metrics"] if kind == "result" else record
        metrics["val/top1"] += -0.5 if metrics["val/top1"] >= 0.5 else 0.5
        path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    elif damage == "partial":  # as eval.py wrote a test of part of the set before it refused one: checksum and all
        record = {k: v for k, v in json.loads(path.read_text()).items() if k != "checksum"}
        record["images_read"] = record["images_total"] // 2
        path.write_text(json.dumps(with_checksum(record), indent=2, sort_keys=True) + "\n")
    elif damage == "relabelled":  # the run's result on another test set, renamed to this one's
        path.write_bytes(runs["relabelled"].read_bytes())
    elif damage == "wrong type":
        if kind == "ckpt":
            torch.save([1, 2, 3], path)
        else:
            path.write_text("[1, 2, 3]\n")
    elif damage == "wrong kind":  # a folder where a file belongs, a file where a folder belongs
        if kind == "folder":
            shutil.rmtree(path)
            path.write_text("not a folder\n")
        else:
            path.unlink(missing_ok=True)
            path.mkdir()
    elif damage in ("symlink elsewhere", "symlink loop"):
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
        target = runs["other"] / file
        if damage == "symlink loop":  # a link to itself: every open fails with ELOOP
            target = Path(path.name)
        elif not target.exists():
            target.write_text('{"status": "failed", "error": "another run failed"}\n')
        path.symlink_to(target)


@contextlib.contextmanager
def storage_fault(scope: Path, code: int) -> Iterator[None]:
    """Every write under ``scope`` fails with ``code`` (EROFS: read-only storage; ENOSPC: a full disk)."""
    scope_text = str(scope.resolve())

    def inside(path: object) -> bool:
        try:
            return os.path.abspath(os.fspath(path)).startswith(scope_text)
        except TypeError:
            return False

    def fail(path: object) -> None:
        raise OSError(code, os.strerror(code), str(path))

    real_open, real_os_open, real_replace = builtins.open, os.open, os.replace
    real_mkdir, real_unlink, real_rmdir = os.mkdir, os.unlink, os.rmdir

    def fake_open(file, mode="r", *args, **kwargs):
        if inside(file) and any(ch in mode for ch in "wax+"):
            fail(file)
        return real_open(file, mode, *args, **kwargs)

    def fake_os_open(path, flags, *args, **kwargs):
        if inside(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC):
            fail(path)
        return real_os_open(path, flags, *args, **kwargs)

    def guard(real):
        def wrapped(path, *args, **kwargs):
            if inside(path):
                fail(path)
            return real(path, *args, **kwargs)
        return wrapped

    def fake_replace(src, dst, *args, **kwargs):
        if inside(dst):
            fail(dst)
        return real_replace(src, dst, *args, **kwargs)

    patches = [(builtins, "open", fake_open), (io, "open", fake_open), (os, "open", fake_os_open),
               (os, "replace", fake_replace), (os, "rename", fake_replace), (os, "mkdir", guard(real_mkdir)),
               (os, "unlink", guard(real_unlink)), (os, "remove", guard(real_unlink)), (os, "rmdir", guard(real_rmdir))]
    with pytest.MonkeyPatch.context() as mp:
        for module, name, value in patches:
            mp.setattr(module, name, value)
        yield


class Refused(Exception):
    """A command ended with a one-line error and a non-zero exit."""


def _run_command(command: str, run_dir: Path, data_dir: Path, tmp_path: Path, capsys) -> dict:
    """Run ``command`` on ``run_dir`` in this process; returns what it reported, raises `Refused`."""
    from lifecycle.console import one_line, user_error_types

    if command == "train":
        cfg = compose_config(TINY, run_dir, data_dir)
        try:
            job.run_job(cfg, ROOT / "train.py")
        except SystemExit as exit_:
            err = capsys.readouterr().err
            raise Refused(f"exit {exit_.code}: {err.strip()}") from None
        return json.loads((run_dir / "metrics.json").read_text())
    if command == "eval":
        eval_module = __import__("eval")
        cfg = compose_config([f"ckpt_path={run_dir / 'checkpoints' / 'best.ckpt'}", "throughput_batch=2"],
                             tmp_path / "eval_out", data_dir, config_name="eval")
        try:
            return eval_module.evaluate(cfg)
        except user_error_types() as err:
            raise Refused(one_line(err)) from None
    if command == "plot_rpe":
        from scripts import plot_rpe

        code = plot_rpe.main([str(run_dir), "--plots", "tables"])
        if code != 0:
            raise Refused(capsys.readouterr().err.strip())
        return {}
    if command == "make_tables":
        from scripts import make_tables

        return {"runs": make_tables.collect([run_dir.parent])}
    if command == "evaluate_testsets":
        capsys.readouterr()
        code = _evaluate_testsets(run_dir.parent, data_dir, TESTSET)
        out, err = capsys.readouterr()
        if code != 0:  # its problems: a line each on stderr, or on stdout the runs it left out
            assert "Traceback" not in err, err
            raise Refused("\n".join(line for line in (*out.splitlines(), *err.splitlines())
                                    if line.startswith(("error: ", "left out "))))
        return {"out": out}
    from scripts import archive_runs

    code = archive_runs.main([str(run_dir.parent), "--to", str(tmp_path / "archive")])
    if code != 0:
        raise Refused(capsys.readouterr().err.strip())
    return {"archive": tmp_path / "archive" / run_dir.parent.name / run_dir.name}


def _fault(damage: str, run_dir: Path, file: str) -> contextlib.AbstractContextManager:
    """What is in force while the command runs: failing writes, a mode of 000, or nothing."""
    if damage == "mode 000":
        return mode_000(run_dir / file)
    if damage in STORAGE_DAMAGES:
        return storage_fault(run_dir if file == "." else run_dir / file,
                             errno.EROFS if damage == "read-only" else errno.ENOSPC)
    return contextlib.nullcontext()


# Every cell runs in `make test` (about 3 minutes on one core; docs/reliability.md states the count, checked below).
# `make test` runs each command with each damage once (on the first file it applies to); `make slow` the rest
QUICK_CELLS = {next(cell for cell in CELLS if cell[0] == c and cell[2] == d)
               for c in COMMANDS for d in DAMAGES if any(cell[0] == c and cell[2] == d for cell in CELLS)}


@pytest.mark.parametrize(("command", "file", "damage"), [
    pytest.param(*cell, id="|".join(cell), marks=() if cell in QUICK_CELLS else pytest.mark.slow) for cell in CELLS])
def test_fault_matrix(command: str, file: str, damage: str, runs: dict[str, Path], data_dir: Path,
                      tmp_path: Path, capsys) -> None:
    truth = json.loads((runs["victim"] / "metrics.json").read_text())
    result_truth = json.loads((runs["victim"] / RESULT).read_text())["metrics"]
    sweep = tmp_path / "victim"
    shutil.copytree(runs["victim"].parent, sweep, symlinks=True)
    run_dir = sweep / "0"
    allowed = expected_outcome(command, file, damage)
    if damage not in STORAGE_DAMAGES:
        _damage(run_dir, file, damage, runs)
    before = _fingerprint(run_dir)
    try:
        with _fault(damage, run_dir, file):
            reported = _run_command(command, run_dir, data_dir, tmp_path, capsys)
        outcome = None
    except Refused as refusal:
        outcome, message = "refuse", str(refusal)
    after = _fingerprint(run_dir)
    if allowed == "refuse":
        assert outcome == "refuse", f"{command} accepted a run dir whose {file} is {damage}"
        lines = [line for line in message.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in message, message
        shown = str(run_dir) if file == "." else file.split("/")[-1]
        assert shown in message, message  # the damaged path, not only its run dir
        assert after == before  # a refusal changes nothing
        return
    assert outcome is None, f"{command} refused ({message}) where the outcome must be {allowed}"
    if command in ("train", "eval"):
        assert reported["val/top1"] == pytest.approx(truth["val/top1"], abs=1e-6)  # the true result, no other
    if allowed == "continue" and command != "train":
        assert after == before
    if command == "train":
        rewritten = {"metrics.json", "run.json", "run.lock"}
        if file == "run.json":  # the record is rebuilt: the configs then name the run dir where it is now
            rewritten |= {"config.yaml", ".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml"}
        if file == "failed.json":  # a stray failure record is what the re-test settles: it goes
            assert not os.path.lexists(run_dir / "failed.json")
            rewritten |= {"failed.json"}
        if allowed == "repair" and file == "config.yaml":  # the config the run's record names, written again
            from lifecycle.run_config import load_run_config

            assert load_run_config(run_dir / "config.yaml").seed == load_run_config(runs["victim"] / "config.yaml").seed
            rewritten |= {"config.yaml"}
        if allowed == "repair" and file == "run.json":  # the record, rebuilt from config.yaml: finished, as it was
            record, truth_record = (json.loads(p.read_text()) for p in (run_dir / file, runs["victim"] / file))
            assert {k: v for k, v in record.items() if k != "updated"} == {
                k: v for k, v in truth_record.items() if k not in ("updated", "lengths", "findings_sha256")}
        changed = {k for k in before if after.get(k) != before[k]} - rewritten
        assert not changed, changed  # checkpoints are never rewritten by a re-test
        if allowed in ("continue", "repair"):  # (a missing run.lock is made, empty)
            expected = before | ({"run.lock": hashlib.sha1(b"").hexdigest()} if file == "run.lock" else {})
            repaired = {file} if allowed == "repair" else set()
            assert ({k: v for k, v in after.items() if k not in repaired}
                    == {k: v for k, v in expected.items() if k not in repaired})
        else:
            assert json.loads((run_dir / "run.json").read_text())["state"] == "finished"
    column, result_there = f"{Path(RESULT).stem}/val/top1", os.path.lexists(run_dir / RESULT)
    if command == "make_tables":
        [run] = [r for r in reported["runs"] if r.path.endswith("victim/0")]
        if allowed == "counted":
            assert run.status == "ok" and run.metrics["val/top1"] == pytest.approx(truth["val/top1"])
            assert run.metrics.get(column) == (pytest.approx(result_truth["val/top1"]) if result_there else None)
            assert not run.testset_problems, run.testset_problems
        elif file == RESULT:  # the result is named as not counted; the run still is, with its own result
            assert run.status == "ok" and run.metrics["val/top1"] == pytest.approx(truth["val/top1"])
            assert column not in run.metrics and RESULT in dict(run.testset_problems), run.testset_problems
        else:
            assert run.status != "ok" and not run.metrics and (run.error or getattr(run, "problem", ""))
    if command == "archive_runs":
        archived = reported["archive"]
        assert json.loads((archived / "metrics.json").read_text())["val/top1"] == truth["val/top1"]
        if result_there:  # the test-set result goes with it, as it is
            assert (archived / RESULT).read_bytes() == (run_dir / RESULT).read_bytes()
    if command == "evaluate_testsets":  # the run's true result on the test set, whole, kept or written again
        written = json.loads((run_dir / RESULT).read_text())
        assert written["metrics"]["val/top1"] == pytest.approx(result_truth["val/top1"], abs=1e-6)
        assert written["images_read"] == written["images_total"] == 16
        if allowed == "retest":  # only the result is written
            assert {k for k in before.keys() | after.keys() if after.get(k) != before.get(k)} == {RESULT}


RELIABILITY_DOC = ROOT / "docs" / "reliability.md"


def test_the_docs_state_this_matrix() -> None:
    """docs/reliability.md's table is `expected_outcome`, cell for cell (rows: file and damage; columns:
    commands)."""
    text = RELIABILITY_DOC.read_text()
    section = text[text.index("<!-- fault-matrix -->"): text.index("<!-- /fault-matrix -->")]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 + len(COMMANDS) and cells[0] in FILES:
            rows[(cells[0], cells[1])] = tuple(cells[2:])
    want = {(f, d): tuple(expected_outcome(c, f, d) for c in COMMANDS) for f in FILES for d in DAMAGES if applies(f, d)}
    assert rows == want


def test_the_docs_state_the_matrix_size() -> None:
    """The counts docs/reliability.md states in words (cells, rows, cells shown as -) are the matrix's own."""
    rows = [(f, d) for f in FILES for d in DAMAGES if applies(f, d)]
    shown_dash = sum(expected_outcome(c, f, d) == "-" for f, d in rows for c in COMMANDS)
    assert len(CELLS) == len(rows) * len(COMMANDS) - shown_dash  # every other cell runs
    text = " ".join(RELIABILITY_DOC.read_text().split())
    stated = (f"all {len(CELLS)} cells ({len(rows)} rows of file and damage x {len(COMMANDS)} commands,"
              f" less {shown_dash} shown as -")
    assert stated in text
    assert f"files x damages x commands ({len(rows)} rows)" in text


def docs_matrix() -> str:
    """The docs' table (printed by ``python -m tests.test_fault_matrix``)."""
    lines = ["| file | damage | " + " | ".join(COMMANDS) + " |", "|---|---|" + "---|" * len(COMMANDS)]
    for f in FILES:
        for d in DAMAGES:
            if applies(f, d):
                lines.append(f"| `{f}` | {d} | " + " | ".join(expected_outcome(c, f, d) for c in COMMANDS) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(docs_matrix())
    print(f"\n{len(CELLS)} cells")
