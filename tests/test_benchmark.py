"""scripts/benchmark.py: every bad argument is one ``error:`` line and exit code 2, found before any model is
built or timed, and --json never lands inside a run dir or a data root."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from scripts import benchmark
from tests.test_destinations import _data_root, _finished_run


def _refused(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    assert benchmark.main(["--model", "micro", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err.strip()


@pytest.mark.parametrize("argv, message", [
    (["--presets", "nope"], "error: --presets 'nope': 'nope' is not a preset; valid: none, irpe_k,"),
    (["--presets", "irpe_k@fast"], "error: --presets 'irpe_k@fast': backend 'fast' is not one; valid: auto,"),
    (["--steps", "0"], "error: --steps 0 is out of range; valid: an integer >= 1"),
    (["--batch", "-1"], "error: --batch -1 is out of range; valid: an integer >= 1"),
    (["--warmup", "-1"], "error: --warmup -1 is out of range; valid: an integer >= 0"),
    (["--classes", "0"], "error: --classes 0 is out of range; valid: an integer >= 1"),
    (["--threads", "0"], "error: --threads 0 is out of range; valid: an integer >= 1"),
    (["--steps", "x"], "error: argument --steps: invalid int value: 'x' (see --help)"),
    (["--device", "tpu9"], "error: --device 'tpu9' is not available on this machine; valid: cpu"),
])
def test_bad_arguments_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchmark, "measure", lambda args: pytest.fail("measured despite bad input"))
    assert _refused(argv, capsys).startswith(message)


def test_cuda_without_a_gpu_is_one_line(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(benchmark, "measure", lambda args: pytest.fail("measured despite bad input"))
    assert _refused(["--device", "cuda"], capsys).startswith(
        "error: --device 'cuda' is not available on this machine; valid: cpu")


def test_json_inside_a_run_or_a_data_root_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchmark, "measure", lambda args: pytest.fail("measured despite bad input"))
    run, data = _finished_run(tmp_path / "runs" / "r0"), _data_root(tmp_path / "data")
    for path, where in ((run / "bench.json", f"is inside the run dir {run}"),
                        (data / "bench.json", f"is inside the data root {data}")):
        assert _refused(["--presets", "none", "--json", str(path)], capsys).startswith(
            f"error: --json={str(path)!r} {where}")
        assert not path.exists()
    assert _refused(["--presets", "none", "--json", str(tmp_path)], capsys).startswith(
        f"error: --json {str(tmp_path)!r} is a folder")


def test_good_arguments_reach_the_measurement_and_the_json(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    row = {"case": "none", "step_ms": 1.0, "time_ratio": 1.0, "memory_MB": 1.0, "memory_ratio": 1.0,
           "params_M": 1.0}
    monkeypatch.setattr(benchmark, "measure", lambda args: [row])
    threads: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    out = tmp_path / "bench" / "b.json"
    assert benchmark.main(["--model", "micro", "--presets", "none", "irpe_k@naive", "--warmup", "0",
                           "--threads", "1", "--device", "cpu", "--json", str(out)]) == 0
    assert out.is_file() and '"case": "none"' in out.read_text() and threads == [1]


@pytest.mark.parametrize(("args", "expected"), [
    (["--batch", "0"], "error: --batch 0 is out of range; valid: an integer >= 1"),
    (["--reps", "0"], "error: --reps 0 is out of range; valid: an integer >= 1"),
    (["--device", "cuda:7"], "error: --device 'cuda:7' is not available on this machine; valid: cpu"),
])
def test_profile_attentions_bad_arguments_are_one_line(args: list[str], expected: str) -> None:
    """Probe 12, g74: ``--batch 0`` timed empty tensors and printed a table."""
    from tests.helpers import run_cli

    if torch.cuda.is_available() and args[0] == "--device":
        pytest.skip("this machine has a GPU: the device list differs")
    done = run_cli("scripts/profile_attention.py", ["--dtype", "float32", *args], timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == expected, done.stderr[-2000:]


@pytest.mark.slow  # the profiler starts and is stopped
def test_ctrl_c_to_profile_attention_is_one_line() -> None:
    """Probe 12, g75: Ctrl-C was a 15-line KeyboardInterrupt traceback from autograd's backward."""
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers import ROOT

    started = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "profile_attention.py"), "--device", "cpu",
                                "--dtype", "float32", "--batch", "8", "--reps", "500", "--warmup", "1"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for _ in range(600):  # until the table's header is out: the timings have begun
        time.sleep(0.1)
        if started.poll() is not None:
            break
        if started.stdout.readline().startswith("variant"):
            break
    started.send_signal(signal.SIGINT)
    _, err = started.communicate(timeout=120)
    assert started.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == ("error: profile_attention.py interrupted by SIGINT; nothing was written"
                                            " (it only prints its timings)") and "Traceback" not in err, err[-2000:]


def test_a_head_the_machine_cannot_hold_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Probe 13, i16: ``--classes 100000000000`` was the allocator's traceback from inside ``nn.Linear``."""
    from scripts import benchmark

    out = tmp_path / "b.json"
    code = benchmark.main(["--model", "deit_small", "--presets", "none", "--batch", "2", "--steps", "1", "--warmup",
                           "0", "--device", "cpu", "--threads", "1", "--classes", "100000000000", "--json", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: a model or batch of these arguments does not fit in the device's"
                                        " memory (") and len(err.strip().splitlines()) == 1, err
    assert "valid: a smaller --batch or --classes" in err and not out.exists()
