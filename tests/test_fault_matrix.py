"""The fault matrix: every file of a finished run dir x every damage x every command that reads it.

One tiny run is trained once; each case copies it, damages one file, runs one command in this process
and checks the outcome `expected_outcome` allows for that cell (the same table as the README's
"Reliability" section, which a test here keeps in step):

* ``continue``: the command succeeds and reports the run's true result (the recorded ``val/top1``);
* ``retest``: train.py re-tests ``best.ckpt`` and writes the same result again;
* ``refuse``: one line naming the damaged path, a non-zero exit, and no file of the run dir changed;
* ``listed``: make_tables.py lists the run by name as not counted, and the table is still built;
* ``counted``: make_tables.py counts the run with its true result.

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

from models.lifecycle import job
from models.lifecycle.files import with_checksum
from tests.helpers import ROOT, compose_config

FILES: dict[str, str] = {  # path in the run dir -> kind
    "run.json": "json", "metrics.json": "json", "failed.json": "json", "config.yaml": "yaml",
    ".hydra/config.yaml": "yaml", ".hydra/overrides.yaml": "yaml", "run.lock": "lock",
    "checkpoints/last.ckpt": "ckpt", "checkpoints/best.ckpt": "ckpt", "checkpoints": "folder", ".": "run dir",
}
DAMAGES = ("missing", "empty", "truncated", "wrong type", "no number", "edited", "other length", "wrong kind",
           "symlink elsewhere", "read-only", "full disk")
COMMANDS = ("train", "eval", "plot_rpe", "make_tables", "archive_runs")
CONTENT_DAMAGES = ("empty", "truncated", "wrong type")
FILE_DAMAGES = ("missing", *CONTENT_DAMAGES, "wrong kind", "symlink elsewhere")


def applies(file: str, damage: str) -> bool:
    """Which damages a path can have: a lock file has no content to damage, a folder none at all."""
    kind = FILES[file]
    if damage in ("no number", "edited", "other length"):  # the result file, well-formed but not the run's
        return file == "metrics.json"
    if kind == "run dir":
        return damage in ("read-only", "full disk")
    if kind in ("lock", "folder"):
        return damage not in CONTENT_DAMAGES
    if file == "failed.json":  # a finished run has none: its damages are a stray file
        return damage != "missing"
    return True


def expected_outcome(command: str, file: str, damage: str) -> str:
    """The one allowed outcome of ``command`` on a finished run dir whose ``file`` has ``damage``."""
    storage = damage in ("read-only", "full disk")
    kind_or_link = damage in ("wrong kind", "symlink elsewhere")
    if command == "train":  # a finished run needs no write; a record it cannot trust is rebuilt by re-testing
        if kind_or_link:
            return "refuse"
        if file in ("run.json", "metrics.json", "failed.json") and not storage:  # failed.json: a stray one
            return "retest"
        return "continue"
    if command in ("eval", "plot_rpe"):  # they read config.yaml and best.ckpt, and write nothing but plots
        if file in ("config.yaml", "checkpoints/best.ckpt", "checkpoints") and not storage:
            return "refuse"
        if command == "plot_rpe" and file == "." and storage:  # its plots go to <run dir>/plots
            return "refuse"
        return "continue"
    read_by_tables = ("run.json", "metrics.json", "failed.json", "config.yaml")
    if command == "make_tables":
        if file in read_by_tables and not storage and not (file == "run.json" and damage == "missing"):
            return "listed"
        return "counted"
    # archive_runs copies config.yaml, .hydra/overrides.yaml, run.json and the result files
    if file in (*read_by_tables, ".hydra/overrides.yaml") and not storage and not (file == "run.json"
                                                                                    and damage == "missing"):
        return "refuse"
    return "continue"


CELLS = [(c, f, d) for c in COMMANDS for f in FILES for d in DAMAGES if applies(f, d)]

TINY = [
    "debug=fast", "logger=csv", "data.root=${paths.data_dir}/relational_tiny", "data.generator.num_train=256",
    "data.generator.num_val=64", "data.num_workers=0", "data.batch_size=32", "trainer.limit_train_batches=1.0",
    "trainer.limit_val_batches=2", "trainer.limit_test_batches=2", "print_config=false",
]  # whole splits (8 training and 2 test batches): the run has a result make_tables counts


def _fingerprint(run_dir: Path) -> dict[str, str]:
    return {p.relative_to(run_dir).as_posix(): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file() and not p.is_symlink() and "plots" not in p.parts}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> dict[str, Path]:
    """Two finished tiny runs of different models: ``victim`` (damaged by the cases) and ``other`` (what a
    symlink points to), each in a sweep dir of its own so that archive_runs can take it."""
    root = tmp_path_factory.mktemp("matrix")
    made = {}
    for name, extra in (("victim", []), ("other", ["rpe=irpe_qkv"])):
        run_dir = root / name / "0"
        job.run(compose_config([*TINY, *extra], run_dir, data_dir))
        (root / name / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"sweeper": {"_target_": "optuna"}}}))
        made[name] = run_dir
    return made


def _damage(run_dir: Path, file: str, damage: str, other: Path) -> None:
    path = run_dir / file
    kind = FILES[file]
    if damage == "missing":
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        data = path.read_bytes() if path.exists() else b'{"status": "failed", "error": "x"}\n'
        path.write_bytes(data[: max(1, len(data) // 2)])
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
        record["val/top1"] += -0.5 if record["val/top1"] >= 0.5 else 0.5
        path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
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
    elif damage == "symlink elsewhere":
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
        target = other / file
        if not target.exists():
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
    from models.lifecycle.cli import one_line, user_error_types

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
    from scripts import archive_runs

    code = archive_runs.main([str(run_dir.parent), "--to", str(tmp_path / "archive")])
    if code != 0:
        raise Refused(capsys.readouterr().err.strip())
    return {"archive": tmp_path / "archive" / run_dir.parent.name / run_dir.name}


# Every cell runs in `make test` (391 cells, about 2 minutes on one core).
@pytest.mark.parametrize(("command", "file", "damage"), CELLS, ids=[f"{c}|{f}|{d}" for c, f, d in CELLS])
def test_fault_matrix(command: str, file: str, damage: str, runs: dict[str, Path], data_dir: Path,
                      tmp_path: Path, capsys) -> None:
    truth = json.loads((runs["victim"] / "metrics.json").read_text())
    sweep = tmp_path / "victim"
    shutil.copytree(runs["victim"].parent, sweep, symlinks=True)
    run_dir = sweep / "0"
    allowed = expected_outcome(command, file, damage)
    if damage not in ("read-only", "full disk"):
        _damage(run_dir, file, damage, runs["other"])
    before = _fingerprint(run_dir)
    scope = run_dir if file == "." else run_dir / file
    fault = storage_fault(scope, errno.EROFS if damage == "read-only" else errno.ENOSPC) \
        if damage in ("read-only", "full disk") else contextlib.nullcontext()
    try:
        with fault:
            reported = _run_command(command, run_dir, data_dir, tmp_path, capsys)
        outcome = None
    except Refused as refusal:
        outcome, message = "refuse", str(refusal)
    after = _fingerprint(run_dir)
    if allowed == "refuse":
        assert outcome == "refuse", f"{command} accepted a run dir whose {file} is {damage}"
        lines = [line for line in message.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in message, message
        shown = file if file != "." else run_dir.name
        assert shown.split("/")[-1] in message or str(run_dir) in message, message
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
        changed = {k for k in before if after.get(k) != before[k]} - rewritten
        assert not changed, changed  # checkpoints are never rewritten by a re-test
        if allowed == "continue":  # (a missing run.lock is made, empty)
            assert after == before | ({"run.lock": hashlib.sha1(b"").hexdigest()} if file == "run.lock" else {})
        else:
            assert json.loads((run_dir / "run.json").read_text())["state"] == "finished"
    if command == "make_tables":
        [run] = [r for r in reported["runs"] if r.path.endswith("victim/0")]
        if allowed == "counted":
            assert run.status == "ok" and run.metrics["val/top1"] == pytest.approx(truth["val/top1"])
        else:
            assert run.status != "ok" and not run.metrics and (run.error or getattr(run, "problem", ""))
    if command == "archive_runs":
        archived = reported["archive"]
        assert json.loads((archived / "metrics.json").read_text())["val/top1"] == truth["val/top1"]


def test_the_readme_states_this_matrix() -> None:
    """The README's table is `expected_outcome`, cell for cell (rows: file and damage; columns: commands)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("<!-- fault-matrix -->"): text.index("<!-- /fault-matrix -->")]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 + len(COMMANDS) and cells[0] in FILES:
            rows[(cells[0], cells[1])] = tuple(cells[2:])
    want = {(f, d): tuple(expected_outcome(c, f, d) for c in COMMANDS) for f in FILES for d in DAMAGES if applies(f, d)}
    assert rows == want


def readme_matrix() -> str:
    """The README table (printed by ``python -m tests.test_fault_matrix``)."""
    lines = ["| file | damage | " + " | ".join(COMMANDS) + " |", "|---|---|" + "---|" * len(COMMANDS)]
    for f in FILES:
        for d in DAMAGES:
            if applies(f, d):
                lines.append(f"| `{f}` | {d} | " + " | ".join(expected_outcome(c, f, d) for c in COMMANDS) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(readme_matrix())
