"""scripts/plot_rpe.py: offset heatmaps against a hand-written index, `RPEAttention.attention_probs`
against the module's own forward, the PNGs of a tiny trained run, and the one-line error paths."""

from __future__ import annotations

import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

import lifecycle.job as job
from rpe import RPEAttention, RPEConfig, preset_names
from rpe.tables import CrossRelativePositionTable, RelativePositionTable
from scripts import plot_rpe  # scripts/ is a namespace package under the repository root
from tests.helpers import compose_config, run_cli

# A tiny relational set of its own (the root differs from other tests', so their markers never clash).
TINY_RUN = [
    "data.root=${paths.data_dir}/relational_plot", "data.generator.num_train=64", "data.generator.num_val=16",
    "data.batch_size=16", "debug=fast", "logger=csv", "test_after_fit=false",
    "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def naive_g(x: int, ratio: float) -> int:
    """iRPE piecewise index, straight from the rpe.index docstring (Python round = half to even)."""
    alpha, beta, gamma = ratio, 2 * ratio, 8 * ratio
    if abs(x) <= alpha:
        return round(x)
    far = round(alpha + math.log(abs(x) / alpha) / math.log(gamma / alpha) * (beta - alpha))
    return int(math.copysign(min(int(beta), far), x))


def assert_png(path: Path) -> None:
    assert path.is_file(), path
    assert path.stat().st_size > 1000, path
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.width > 100 and image.height > 100


# ----------------------------------------------------------------------------- offset -> bucket heatmaps
def _bucket_index_table(config: RPEConfig, site: str = "k", axis: int | None = None) -> RelativePositionTable:
    """A bias table whose value at bucket b is b (same for every head)."""
    table = RelativePositionTable(config, site, head_dim=8, num_heads=2, axis=axis)
    with torch.no_grad():
        table.lookup_table_bias.copy_(torch.arange(table.num_buckets, dtype=torch.float32).expand_as(table.table))
    return table


def test_product_heatmap_matches_a_naive_index() -> None:
    h, w, ratio = 8, 6, 1.9
    config = RPEConfig(method="product", mode="bias", on="k", shared_head=False, ratio=ratio)
    heatmap = plot_rpe.offset_heatmap(_bucket_index_table(config), h, w)
    assert heatmap.shape == (2, 2 * h - 1, 2 * w - 1)
    B = int(2 * ratio)
    S = 2 * B + 1
    for dr in range(-(h - 1), h):
        for dc in range(-(w - 1), w):
            expected = (naive_g(dr, ratio) + B) * S + (naive_g(dc, ratio) + B)
            assert heatmap[:, dr + h - 1, dc + w - 1].tolist() == [expected, expected], (dr, dc)
    # The same offsets, a query-site table: the pair (i, j) reads bucket b(j, i), i.e. the offset negated.
    q_heatmap = plot_rpe.offset_heatmap(_bucket_index_table(replace(config, on="q"), site="q"), h, w)
    for dr, dc in [(3, -2), (-7, 5), (0, 1), (0, 0)]:
        expected = (naive_g(-dr, ratio) + B) * S + (naive_g(-dc, ratio) + B)
        assert q_heatmap[0, dr + h - 1, dc + w - 1] == expected


def test_heatmap_values_at_zero_offset_and_contextual_norms() -> None:
    h = w = 5
    config = RPEConfig(method="product", mode="bias", on="k", shared_head=False, ratio=1.9)
    table = RelativePositionTable(config, "k", head_dim=8, num_heads=3)
    torch.manual_seed(0)
    with torch.no_grad():
        table.lookup_table_bias.normal_()
    heatmap = plot_rpe.offset_heatmap(table, h, w)
    zero_bucket = 3 * 7 + 3  # (g(0) + B) * S + (g(0) + B) with B = 3, S = 7
    assert torch.equal(heatmap[:, h - 1, w - 1], table.lookup_table_bias[:, zero_bucket])
    # dr = 1, dc = -2 -> (1 + 3) * 7 + (-2 + 3)
    assert torch.equal(heatmap[:, h, w - 3], table.lookup_table_bias[:, 4 * 7 + 1])

    ctx = RelativePositionTable(replace(config, mode="ctx"), "k", head_dim=8, num_heads=3)
    ctx_v = RelativePositionTable(replace(config, mode="ctx", on="v"), "v", head_dim=8, num_heads=3)
    with torch.no_grad():
        ctx.lookup_table_weight.normal_()
        ctx_v.lookup_table_weight.normal_()
    expected_k = ctx.lookup_table_weight[:, :, zero_bucket].norm(dim=-1)  # (Hs, d, nb): norm over d
    expected_v = ctx_v.lookup_table_weight[:, zero_bucket, :].norm(dim=-1)  # (Hs, nb, d)
    assert torch.allclose(plot_rpe.offset_heatmap(ctx, h, w)[:, h - 1, w - 1], expected_k)
    assert torch.allclose(plot_rpe.offset_heatmap(ctx_v, h, w)[:, h - 1, w - 1], expected_v)


def test_cross_swin_and_timm_swin_heatmaps() -> None:
    h, w = 8, 8
    cross = CrossRelativePositionTable(
        RPEConfig(method="cross", mode="bias", on="k", shared_head=True, ratio=1.9), "k", head_dim=8, num_heads=2
    )
    with torch.no_grad():
        for table in (cross.rp_rows, cross.rp_cols):
            table.lookup_table_bias.copy_(torch.arange(table.num_buckets, dtype=torch.float32)[None])
    rows = plot_rpe.offset_heatmap(cross.rp_rows, h, w)[0]
    cols = plot_rpe.offset_heatmap(cross.rp_cols, h, w)[0]
    for d in range(-(h - 1), h):
        assert (rows[d + h - 1] == naive_g(d, 1.9) + 3).all()  # depends on drow only
        assert (cols[:, d + w - 1] == naive_g(d, 1.9) + 3).all()  # depends on dcol only

    # swin method, window 8 on an 8x8 grid: a (2h-1)^2 helper grid would not fit the table.
    M = 8
    swin = _bucket_index_table(RPEConfig(method="swin", mode="bias", on="k", shared_head=False, window=M))
    heatmap = plot_rpe.offset_heatmap(swin, h, w)
    for dr, dc in [(0, 0), (7, -7), (-3, 2), (-7, -7)]:
        assert heatmap[0, dr + h - 1, dc + w - 1] == (dr + M - 1) * (2 * M - 1) + (dc + M - 1)

    from models.swin import RPEWindowAttention

    attn = RPEWindowAttention(16, num_heads=2, window_size=4, rpe="swin")
    torch.manual_seed(0)
    with torch.no_grad():
        attn.relative_position_bias_table.normal_()
    timm_heatmap = plot_rpe.swin_table_heatmap(attn)
    assert timm_heatmap.shape == (2, 7, 7)
    for dr, dc in [(0, 0), (3, -3), (-2, 1)]:
        expected = attn.relative_position_bias_table[(dr + 3) * 7 + (dc + 3)]  # (heads,)
        assert torch.equal(timm_heatmap[:, dr + 3, dc + 3], expected)


# ----------------------------------------------------------------------------- attention_probs
@pytest.mark.parametrize(
    "rpe", ["none", "irpe_k", "irpe_qk", "irpe_qkv", "irpe_cross_k", "shaw", "swin", "t5", "xl",
            {"preset": "irpe_bias_k", "on": "qk"}],
    ids=str,
)
def test_attention_probs_reproduce_the_forward(rpe) -> None:
    """probs @ v (+ the V term) equals the module's output before its projection (SDPA path when no V)."""
    torch.manual_seed(0)
    attn = RPEAttention(32, num_heads=4, qkv_bias=True, rpe=rpe).eval()
    with torch.no_grad():
        for name, param in attn.named_parameters():
            if "rpe" in name:
                param.normal_(std=0.5)  # zero-initialised tables would hide a missing term
    attn.grid_size = (3, 4)
    x = torch.randn(2, 1 + 12, 32)  # one class token + 3x4 grid
    captured = {}
    attn.norm.register_forward_hook(lambda module, args, out: captured.update(pre_proj=args[0]))
    with torch.no_grad():
        attn(x)
        probs = attn.attention_probs(x)
        v = attn.qkv(x).reshape(2, 13, 3, 4, 8).permute(2, 0, 3, 1, 4)[2]
        out = probs @ v
        if attn.rpe_v is not None:
            out = out + attn.rpe_v.value_term(probs, 3, 4, 1)
    assert probs.shape == (2, 4, 13, 13)
    assert torch.allclose(probs.sum(-1), torch.ones(2, 4, 13), atol=1e-6)
    assert torch.allclose(out.transpose(1, 2).reshape(2, 13, 32), captured["pre_proj"], atol=1e-5)


def test_attention_probs_apply_the_mask() -> None:
    torch.manual_seed(0)
    attn = RPEAttention(16, num_heads=2, rpe="irpe_k").eval()
    attn.grid_size = (2, 2)
    x = torch.randn(1, 4, 16)
    with torch.no_grad():
        probs = attn.attention_probs(x, is_causal=True)
    assert torch.equal(probs.triu(1), torch.zeros_like(probs))
    assert torch.allclose(probs.sum(-1), torch.ones(1, 2, 4))


# ----------------------------------------------------------------------------- runs
@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """Micro DeiT with contextual iRPE on K (the default), two training steps on 64 images."""
    run_dir = tmp_path_factory.mktemp("plot_trained")
    job.run(compose_config(TINY_RUN, run_dir, data_dir))
    return run_dir


def make_run(run_dir: Path, data_dir: Path, overrides: list[str]) -> Path:
    """A run dir without training: config.yaml and checkpoints/best.ckpt with random RPE tables, and the
    run's data generated as train.py would (plot_rpe only reads data)."""
    cfg = compose_config([*TINY_RUN, *overrides], run_dir, data_dir)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    datamodule, module = job.build_data_and_model(cfg)
    datamodule.prepare_data()
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if "lookup_table" in name or "relative_position_bias_table" in name:
                param.normal_()
    (run_dir / "checkpoints").mkdir()
    torch.save({"state_dict": module.state_dict()}, run_dir / "checkpoints" / "best.ckpt")
    return run_dir


def test_plots_of_a_trained_run(trained_run: Path, tmp_path: Path, capsys) -> None:
    assert plot_rpe.main([str(trained_run), "--image-index", "3"]) == 0
    out = trained_run / "plots"
    written = [Path(line) for line in capsys.readouterr().out.split()]
    assert written == [*(out / f"tables_k_layer{i}.png" for i in range(4)), out / "attention_image3_query_cls.png"]
    for path in written:
        assert_png(path)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in written)  # no temp files left

    assert plot_rpe.main([str(trained_run), "--ckpt", "last", "--query", "2,5", "--layers", "1,3",
                          "--plots", "attention", "--out", str(tmp_path)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["attention_image0_query_2_5.png"]
    assert_png(tmp_path / "attention_image0_query_2_5.png")


def test_a_run_that_has_not_finished_is_drawn_with_a_note(trained_run: Path, tmp_path: Path, monkeypatch,
                                                          capsys) -> None:
    """Probe 9, B94: an interrupted run's checkpoint was drawn without a word, where eval.py says it is not a
    result; a finished run's plots carry no note."""
    from types import SimpleNamespace

    assert plot_rpe.main([str(trained_run), "--plots", "tables", "--out", str(tmp_path / "smoke")]) == 0
    assert capsys.readouterr().err.startswith(f"note: not a result: {trained_run} is a smoke run: ")  # it is one
    monkeypatch.setattr(plot_rpe, "run_status", lambda run_dir: SimpleNamespace(state="finished", metrics={}))
    assert plot_rpe.main([str(trained_run), "--plots", "tables", "--out", str(tmp_path / "done")]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(plot_rpe, "run_status", lambda run_dir: SimpleNamespace(state="interrupted", metrics={}))
    assert plot_rpe.main([str(trained_run), "--plots", "tables", "--out", str(tmp_path / "now")]) == 0
    assert capsys.readouterr().err == (f"note: not a result: {trained_run} has not finished (interrupted): these are"
                                       " the plots of its checkpoint so far\n")


def test_a_run_whose_records_cannot_be_read_is_drawn_with_a_note_on_its_plots(trained_run: Path, tmp_path: Path,
                                                                            capsys) -> None:
    """Probe 16, p27: a run whose run.json is a FIFO was drawn with eval.py's note "these are the numbers of its
    checkpoint", where plot_rpe shows no numbers; the note is about its plots."""
    import os

    run = tmp_path / "run"
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns("plots"))
    (run / "run.json").unlink()
    os.mkfifo(run / "run.json")
    assert plot_rpe.main([str(run), "--plots", "tables", "--layers", "0", "--out", str(tmp_path / "plots")]) == 0
    captured = capsys.readouterr()
    assert captured.out.split() == [str(tmp_path / "plots" / "tables_k_layer0.png")]
    assert captured.err.startswith(f"note: not a result: {run}'s records are unreadable ({run / 'run.json'} cannot be"
                                   " used: it is a FIFO (named pipe)"), captured.err
    assert captured.err.endswith("): these are the plots of its checkpoint\n") and "numbers" not in captured.err


@pytest.mark.parametrize("signame", ["SIGHUP", "SIGTERM", "SIGINT"])
def test_a_stop_signal_mid_drawing_is_one_line_naming_the_whole_plots(signame: str, tmp_path: Path, monkeypatch,
                                                                      capsys) -> None:
    """Probe 8, A35: SIGHUP while plot_rpe drew ended it by the signal's default action, without a word; now one
    line names the plots written whole, and the exit code is 128 + the signal's number, no temp file left."""
    import os
    import signal

    from matplotlib.figure import Figure

    signum = getattr(signal, signame)

    def plot_run(args, written: list[Path]) -> list[Path]:
        for name in ("tables_k_layer0.png", "tables_k_layer1.png"):
            path = args.out / name
            figure = Figure(figsize=(2, 2))
            figure.add_subplot().plot([0, 1])
            plot_rpe.save_figure(figure, path)
            written.append(path)
            os.kill(os.getpid(), signum)  # the first plot is whole: the signal comes before the second
        raise AssertionError("the drawing went on after the signal")

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    monkeypatch.setattr(plot_rpe, "plot_run", plot_run)
    with pytest.raises(SystemExit) as exit_:
        plot_rpe.main([str(tmp_path / "run"), "--out", str(tmp_path / "plots")])
    assert exit_.value.code == 128 + signum
    first = tmp_path / "plots" / "tables_k_layer0.png"
    assert capsys.readouterr().err == (f"error: plot_rpe.py interrupted by {signame}; the plot written is whole"
                                       f" ({first}), no other was written: run the same command again for all\n")
    assert [p.name for p in (tmp_path / "plots").iterdir()] == [first.name]
    assert_png(first)
    assert {s: signal.getsignal(s) for s in handlers} == handlers


def test_attention_of_a_trained_run_sums_to_one(trained_run: Path) -> None:
    datamodule, module = plot_rpe.load_run(trained_run, "best")
    net = module.net.eval()
    image, shown, label = plot_rpe.validation_image(datamodule, 0)
    assert shown.shape == (32, 32, 3) and 0 <= shown.min() and shown.max() <= 1
    assert label in datamodule.val_set.classes
    probs = plot_rpe.attention_probabilities(net, image[None])
    assert len(probs) == 4
    for layer in probs:
        assert layer.shape == (1, 4, 65, 65)
        assert torch.allclose(layer.sum(-1), torch.ones(1, 4, 65), atol=1e-5)


@pytest.mark.slow  # five runs built and drawn (Swin's included); test_plots_of_a_trained_run stays
def test_table_variants(tmp_path: Path, data_dir: Path, capsys) -> None:
    """Cross, QKV, per-head bias and Swin (own table and iRPE, window grids) each give their figures."""
    cases = {
        "cross": (["rpe=irpe_cross_k"], ["tables_k_layer0.png", "tables_k_layer3.png"]),
        "qkv": (["rpe=irpe_qkv", "model.net.ape=none"],
                [f"tables_{site}_layer{i}.png" for site in "qkv" for i in range(4)]),
        "bias": (["rpe=irpe_bias_k"], ["tables_k_layer2.png"]),
        "swin_own": (["experiment=swin_micro_relational", "rpe=swin"], ["tables_k_layer0.png", "tables_k_layer3.png"]),
        "swin_irpe": (["experiment=swin_micro_relational"], ["tables_v_layer3.png"]),
    }
    for name, (overrides, expected) in cases.items():
        run_dir = make_run(tmp_path / name, data_dir, overrides)
        assert plot_rpe.main([str(run_dir), "--plots", "tables"]) == 0, name
        for file in expected:
            assert_png(run_dir / "plots" / file)
    out = capsys.readouterr().out
    assert out.count("tables_q_layer") == 4 + 4  # irpe_qkv on DeiT (4 blocks) and on Swin (4 blocks)

    # all = tables + attention; a Swin run has no attention maps, which is said, not an error
    assert plot_rpe.main([str(tmp_path / "swin_own"), "--layers", "0"]) == 0
    out = capsys.readouterr().out
    assert "note: attention maps are drawn for DeiT models only" in out
    assert out.splitlines()[-1].endswith("tables_k_layer0.png")


def test_runs_without_tables_still_get_attention(tmp_path: Path, data_dir: Path, capsys) -> None:
    for name in ("none", "xl"):
        run_dir = make_run(tmp_path / name, data_dir, [f"rpe={name}"])
        assert plot_rpe.main([str(run_dir)]) == 0
        out = capsys.readouterr().out
        assert "note: the run's model has no relative position tables" in out
        if name == "xl":
            assert "Transformer-XL term on k has no lookup table; skipped" in out
        assert [p.name for p in (run_dir / "plots").iterdir()] == ["attention_image0_query_cls.png"]
        assert plot_rpe.main([str(run_dir), "--plots", "tables"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: the run's model has no plottable relative position tables")
        assert err.count("\n") == 1


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["{missing}"], "does not exist"),
        (["{empty}"], "has no config.yaml"),
        (["{run}", "--ckpt", "nope"], "--ckpt nope: checkpoint nope does not exist; valid: best, last"),
        (["{run}", "--query", "8,0"], "--query 8,0 is outside the 8x8 token grid; valid: cls or R,C"),
        (["{run}", "--query", "middle"], "--query 'middle' is neither cls nor R,C"),
        (["{run}", "--image-index", "16"], "--image-index 16 is out of range; the validation set has 16 images"),
        (["{run}", "--layers", "0,4"], "layer 4 does not exist, the model has 4 attention layers"),
        (["{run}", "--plots", "maps"], "--plots 'maps' is not one of: all, tables, attention"),
        (["{run}", "--image-index", "two"], "argument --image-index: invalid int value: 'two'"),
    ],
)
def test_bad_input_is_one_line(args: list[str], expected: str, trained_run: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    paths = {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "run": trained_run}
    argv = [arg.format(**paths) for arg in args] + ["--out", str(tmp_path / "plots")]
    assert plot_rpe.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert expected in captured.err
    assert not (tmp_path / "plots").exists()  # nothing drawn on bad input


def test_a_sweep_dir_given_as_the_run_dir_names_a_job(tmp_path: Path, capsys) -> None:
    """Probe 24, r30: a sweep dir was "run dir ... has no config.yaml"."""
    from tests.test_sweeps import _fake_sweep

    sweep = _fake_sweep(tmp_path / "runs")
    assert plot_rpe.main([str(sweep), "--out", str(tmp_path / "plots")]) == 2
    assert capsys.readouterr().err == (f"error: {sweep} is a sweep dir (it holds multirun.yaml), not a run dir;"
                                       f" expected one of its job dirs, e.g. {sweep / 'seed=0'}\n")
    assert not (tmp_path / "plots").exists()
    from scripts import archive_runs

    assert archive_runs.main([str(sweep), "--to", str(tmp_path / "arch")]) == 0  # probe 25, T31
    capsys.readouterr()
    for given, what in ((tmp_path / "arch", "a folder of archived sweeps"), (tmp_path / "arch" / sweep.name,
                                                                             "an archived sweep")):
        assert plot_rpe.main([str(given), "--out", str(tmp_path / "plots")]) == 2
        assert capsys.readouterr().err == (f"error: {given} is {what} (archive_runs' marker): archived runs keep no"
                                           " checkpoints, so nothing there can be plotted; expected a train.py run"
                                           " dir with its checkpoints, such as runs/<name>/\n")


def test_a_file_given_as_the_run_dir_is_named_a_file(tmp_path: Path, capsys) -> None:
    """Probe 100: ``plot_rpe.py <run>/metrics.json`` said the (existing) file does not exist."""
    metrics = tmp_path / "run" / "metrics.json"
    metrics.parent.mkdir()
    metrics.write_text("{}")
    assert plot_rpe.main([str(metrics), "--out", str(tmp_path / "plots")]) == 2
    assert capsys.readouterr().err == (f"error: {metrics} is a file, not a run dir; expected a train.py run dir such"
                                       f" as runs/<name>/ (perhaps {metrics.parent})\n")
    assert not (tmp_path / "plots").exists()


def test_out_that_is_a_file_is_refused_before_the_run_is_loaded(trained_run: Path, tmp_path: Path, capsys,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "afile"
    target.write_text("not a folder")
    monkeypatch.setattr(plot_rpe, "load_run", lambda *a: pytest.fail("the run was loaded"))
    assert plot_rpe.main([str(trained_run), "--out", str(target)]) == 2
    expected = f"error: --out {target} is a file, not a folder; valid: a folder (made if missing)\n"
    assert capsys.readouterr().err == expected
    assert target.read_text() == "not a folder"


@pytest.mark.slow  # a plot_rpe.py process; its checks run in-process in test_bad_input_is_one_line
def test_missing_checkpoint_and_cli_exit_code(trained_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy(trained_run / "config.yaml", run_dir / "config.yaml")
    result = run_cli("scripts/plot_rpe.py", [str(run_dir)], env_extra={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"error: --ckpt best: checkpoint {run_dir / 'checkpoints' / 'best.ckpt'}")


@pytest.mark.parametrize("preset", preset_names(per_site=False))  # every encoding that is not a per-site table
def test_every_encoding_with_something_to_draw_is_drawn(preset: str, tmp_path: Path) -> None:
    """plot_rpe asks each layer's modules for describe(); these encodings draw a panel per layer, or say
    (their `Description.note`) why there is nothing to draw."""
    from models import create_model

    net = create_model("deit_micro_patch4_32", rpe=preset, num_classes=4)
    plots, notes = plot_rpe.collect_tables(net, [0, 3], None)
    description = net.blocks[0].attn.rpe_k.describe(8, 8)
    if not description.panels:  # Transformer-XL: a projection of sinusoids, no lookup table
        assert description.note and plots == [] and len(notes) == 2
        assert all(description.note in line for line in notes)
        return
    assert notes == [] and [p.layer for p in plots] == [0, 3]
    heads = plots[0].panels[0][1].shape[0]
    assert plots[0].panels[0][1].shape == (heads, 15, 15) and heads in (1, 4)  # 8x8 patch grid
    save_figure_path = tmp_path / f"{preset}.png"
    plot_rpe.save_figure(plot_rpe.draw_table(plots[0]), save_figure_path)
    assert_png(save_figure_path)


def test_out_inside_another_run_or_a_data_root_is_refused(trained_run: Path, tmp_path: Path, capsys,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """--out follows the one rule for destinations: never into another run's dir, never into a data root."""
    other = tmp_path / "other"
    (other / "checkpoints").mkdir(parents=True)
    (other / "config.yaml").write_text("a: 1\n")
    data = tmp_path / "data"
    (data / "val").mkdir(parents=True)
    (data / ".complete.json").write_text("{}")
    monkeypatch.setattr(plot_rpe, "load_run", lambda *a: pytest.fail("the run was loaded"))
    for target, what in ((other / "plots", f"is inside the run dir {other}"),
                         (data / "val" / "plots", f"is inside the data root {data}")):
        assert plot_rpe.main([str(trained_run), "--out", str(target)]) == 2
        assert what in capsys.readouterr().err and not target.exists()


def test_out_in_the_runs_own_data_root_or_with_a_format_character_is_refused(
        tmp_path: Path, data_dir: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plots in the run's own data.root (read from its config.yaml, though not there yet or not laid out as a
    dataset) would become a class of the data it trains on; a right-to-left override in --out makes the listing
    of the PNGs read backwards. Both are one line before the run is loaded."""
    run = tmp_path / "run"
    own = tmp_path / "own_data"
    config = compose_config([*(o for o in TINY_RUN if not o.startswith("data.root=")), f"data.root={own}"], run,
                            data_dir)
    OmegaConf.save(config, run / "config.yaml", resolve=True)
    (run / "checkpoints").mkdir()
    other = tmp_path / "other_data"
    other.mkdir()
    monkeypatch.setattr(plot_rpe, "load_run", lambda *a: pytest.fail("the run was loaded"))
    for target in (own / "train" / "9_plots", own):
        assert plot_rpe.main([str(run), "--out", str(target), "--data-root", str(other)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --out={str(target)!r} is ") and f"the data root {own}," in err, err
        assert err.count("\n") == 1
    target = tmp_path / "plots" / "\u202egnp.k156"
    assert plot_rpe.main([str(run), "--out", str(target)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --out={str(target)!r} holds the control or format character"
                                              " '\\u202e', which makes every listing")
    assert not own.exists() and not (tmp_path / "plots").exists() and not any(other.iterdir())


def test_a_run_whose_plots_folder_is_a_link_is_refused(tmp_path: Path, capsys,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe 5 (read from the code): the default output, <run dir>/plots, had no check, so a link there took the
    PNGs into whatever it leads to (another run, a class folder of a data root). It is the run's own folder:
    a link is named and refused, as for testsets/."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("a: 1\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run / "plots").symlink_to(elsewhere, target_is_directory=True)
    monkeypatch.setattr(plot_rpe, "load_run", lambda *a: pytest.fail("the run was loaded"))
    assert plot_rpe.main([str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run / 'plots'}: it is a symlink (to {elsewhere})") and err.count("\n") == 1, err
    assert not any(elsewhere.iterdir())


def test_an_operating_system_error_of_the_data_is_worded_as_every_command_does(tmp_path: Path, monkeypatch) -> None:
    """Probe 16, p38: plot_rpe's one line for an error while building the model or loading the validation data
    was the root cause's own text, Python's ``[Errno 2] No such file or directory: '...'`` for a file the data
    module could not open; now the path and why, as every command words it."""
    import errno

    import lifecycle.run_config as run_config

    image = tmp_path / "val" / "0.png"

    class DataModule:
        def setup(self, stage: str) -> None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(image))

    monkeypatch.setattr(run_config, "require_existing_data", lambda *args: None)
    with pytest.raises(plot_rpe.PlotError) as err:
        plot_rpe.validation_image(DataModule(), 0)
    assert str(err.value) == f"cannot load the run's validation data: cannot use {image}: No such file or directory"


def _texts_outside(fig) -> list[str]:  # noqa: ANN001
    """The titles of ``fig`` (its own and its axes') whose drawn extent leaves the figure's."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    titles = [fig._suptitle, *(ax.title for ax in fig.axes)]
    bounds = fig.bbox
    outside = []
    for text in titles:
        if text is None or not text.get_text():
            continue
        box = text.get_window_extent(renderer)
        if box.x0 < bounds.x0 or box.x1 > bounds.x1 or box.y0 < bounds.y0 or box.y1 > bounds.y1:
            outside.append(text.get_text())
    return outside


@pytest.mark.parametrize("preset", preset_names())
def test_every_table_title_fits_its_figure(preset: str) -> None:
    """Probe 16, o27: a Swin run's decomposed tables had a title wider than the figure, cut at both edges
    ("osed (MViTv2/SAM): row and column offset embeddings, L2 norm of R_"). Each encoding's title, on the
    narrowest figure plot_rpe draws (one head, a 4x4 window, a Swin layer's module path), lies within it."""
    from models import create_model

    net = create_model("deit_micro_patch4_32", rpe=preset, num_classes=4)
    plots, _ = plot_rpe.collect_tables(net, [0], None)
    for plot in plots:
        panels = [(name, values[:1, 4:11, 4:11]) for name, values in plot.panels]  # one head, a 4x4 grid's offsets
        narrow = replace(plot, path="layers.3.blocks.1.attn", grid=(4, 4), panels=panels)
        fig = plot_rpe.draw_table(narrow)
        assert fig.get_figwidth() == 5.0  # the narrowest figure
        assert _texts_outside(fig) == []
        assert fig._suptitle.get_text().replace("\n", " ") == (
            f"layer {plot.layer} (layers.3.blocks.1.attn), rpe on {plot.site}, grid 4x4 {plot.description}")


def test_the_attention_titles_fit_their_figure() -> None:
    """Probe 16, o27: the attention figure's titles lie within it too, a long label name and one layer (the
    narrowest figure) included."""
    maps = [(0, torch.rand(8, 8), 0.25)]
    fig = plot_rpe.draw_attention(torch.rand(32, 32, 3), "val image 0, label " + "a_long_class_name " * 4, maps,
                                  (2, 5))
    assert _texts_outside(fig) == []
