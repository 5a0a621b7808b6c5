"""Recompute a run's metrics from a checkpoint: ``python eval.py ckpt_path=runs/<run>/checkpoints/best.ckpt``.

Reads the run's resolved ``config.yaml`` beside ``checkpoints/``, evaluates the validation split,
and prints params, MACs, the accuracy (or COCO AP) numbers and inference throughput.

eval.py only reads: it never generates or writes a dataset (a run's generated dataset must already be
at its ``data.root``, complete and unchanged; ``data_root=<folder>`` points at existing data elsewhere) and
writes no file, the run dir's ``metrics.json`` included, except a test set's result (below). A checkpoint that does
not fit the run's model, non-finite weights or a non-finite metric end in one ``error:`` line (exit 2),
never in a printed result. A profiler given as an object (``trainer.profiler={_target_: ..., dirpath: ...,
filename: ...}``) writes its report into a folder outside every run dir, data root, sweep dir and archive
(`lifecycle.settings.check_profiler_files`); ``trainer.profiler=simple`` prints it.

``python eval.py experiment=detr_r50_rpe20_150ep model.weights=<file> data.root=<coco>`` instead evaluates
a DETR / DETR-iRPE checkpoint in the reference layout (`models.detr.reference`) with that experiment's
model and data.

``python eval.py ckpt_path=<run>/checkpoints/best.ckpt testset=<name> [ape=interpolate|extend]`` evaluates
the run on a named test set (``configs/testset/<name>.yaml``: another canvas, placement region or image
size; `lifecycle.testsets`) and writes the one file this script writes, ``<run dir>/testsets/<name>[@<ape rule>].json``
(atomically; ``metrics.json`` untouched). A test set with a generator of its own reads its own
``data.root``, made once by ``python scripts/generate_testsets.py <name>`` and checked against its marker
(the images' digest) before each test. The result records the hash of the test set's definition, the
digest of those images, the images it read of the whole set, the precision it ran at and the token of the
training whose best.ckpt it read (make_tables counts it only for the weights metrics.json is of)
(`lifecycle.testset_definition`): a test of a part of the set (``trainer.limit_test_batches``) is refused and
never written, a ``testset.name=`` override too (a result is filed under its test set's name), so is a
``trainer.precision`` other than 32-true (every test-set column is measured at 32-true), and a result of
another definition of the test set is never replaced (remove it first). A test set that reads the run's own
data (``val_at_64``) reads it at the run's ``data.root``; ``data_root=`` may point at a copy of the run's
generated data (checked against its marker), never at other data; the run's hand data must still be the files
it trained on (their fingerprint, `lifecycle.identity.data_record`, recorded in the result).

Without a test set, numbers of a test that read a part of the split (``trainer.limit_test_batches``) are
printed with a "not a result" note, as those of a run that has not finished or of a smoke run.

Labels index sorted class folder names, so the data a run is evaluated on (``data_root=``, a test set's,
or its own data changed since) must have the class names the run's model was trained on, in the same order
(every checkpoint records them): other names are refused in one line (`lifecycle.run_config.check_run_classes`);
other images under the run's class names are what ``data_root=`` is for.
"""

from __future__ import annotations

import starting

starting.guard_imports(__name__)  # Ctrl-C during the imports below: one line, exit 130

import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import hydra  # noqa: E402
import torch  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from lifecycle.cli import cli  # noqa: E402
from lifecycle.console import report_user_error, say, user_error_types  # noqa: E402
from lifecycle.job import build_trainer, scalar_metrics  # noqa: E402
from lifecycle.records import BEST as BEST_CHECKPOINT  # noqa: E402
from lifecycle.records import not_a_result, run_status  # noqa: E402
from storage.destinations import refuse_dot_dot_after_link_read  # noqa: E402
from storage.files import (  # noqa: E402
    RunFileError,
    describe_non_file,
    entry_exists,
    missing_file,
    own_folder_problem,
    plain_file_exists,
)


def count_macs(model: torch.nn.Module, image_shape: tuple[int, ...]) -> int:
    """Multiply-accumulates of one forward on one image (FLOP counter / 2)."""
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(torch.zeros(1, *image_shape))
    return counter.get_total_flops() // 2


def measure_throughput(model: torch.nn.Module, image_shape: tuple[int, ...], batch: int, iters: int = 5) -> float:
    """Inference images per second on random input of ``(batch, *image_shape)``."""
    images = torch.randn(batch, *image_shape)
    with torch.inference_mode():
        model(images)
        started = time.perf_counter()
        for _ in range(iters):
            model(images)
    return batch * iters / (time.perf_counter() - started)


def evaluate(cfg: DictConfig, written: list[Path] | None = None, notes: list[str] | None = None) -> dict[str, Any]:
    """Evaluate ``cfg.ckpt_path`` with its run's config, or ``cfg.model.weights`` with the composed
    experiment; returns the metrics (and appends the test set's result file to ``written``, and each reason
    its numbers are not a result, also printed as a note, to ``notes``).

    The run's ``config.yaml`` is checked and built by `lifecycle.run_config` (never Hydra's ``instantiate``),
    so a run dir from elsewhere cannot run code; a weights file is only read with ``weights_only=True``.
    """
    from lifecycle.run_config import (
        backbone,
        detach_generator,
        require_existing_data,
        require_finite_metrics,
        require_finite_weights,
    )
    from lifecycle.testsets import (
        ImageCounter,
        check_ape_rule,
        check_test_precision,
        check_whole_test,
        partial_test_note,
        split_images,
        testset_names,
    )

    weights = cfg.model.get("weights") if "model" in cfg else None
    testset = cfg.get("testset")
    ape_rule = check_ape_rule(cfg.get("ape"))
    if testset is None and ape_rule is not None:
        raise ValueError(f"ape={ape_rule} adapts a run to a test set's input size: give testset=<name> too; valid:"
                         f" {', '.join(testset_names())}")
    if testset is not None and cfg.ckpt_path is None:
        raise ValueError("testset= evaluates a run: give ckpt_path=runs/<run>/checkpoints/<file>.ckpt (the result "
                         "is written into its run dir)")
    if (cfg.ckpt_path is None) == (weights is None):
        raise ValueError(
            "give either ckpt_path=runs/<run>/checkpoints/<file>.ckpt or experiment=<detr experiment>"
            " model.weights=<reference-layout DETR checkpoint>"
            + (" (not both)" if weights is not None else "")
        )
    check_eval_trainer(cfg.trainer)
    result = None
    if testset is not None:
        name = testset.get("name") if hasattr(testset, "get") else testset
        check_whole_test(cfg.trainer, name)  # before any work
        check_test_precision(cfg.trainer, name)
        datamodule, model, result = _testset_data_and_model(cfg, ape_rule)
    elif cfg.ckpt_path is not None:
        datamodule, model = _run_data_and_model(cfg)
    else:
        from lifecycle.job import build_data_and_model

        problem = missing_file(weights)
        if problem:
            raise FileNotFoundError(f"model.weights={weights!r} {problem}; valid: model.weights=<a reference-layout"
                                    " DETR checkpoint file>")
        if cfg.batch_size is not None:
            cfg.data.batch_size = cfg.batch_size
        if cfg.get("data_root") is not None:
            cfg.data.root = cfg.data_root
        datamodule, model = build_data_and_model(cfg)
        detach_generator(datamodule)  # never generate data, whatever the experiment's data config says
        require_finite_weights(model, f"model.weights={weights}")
        require_existing_data(datamodule, "the eval config", "data.root=<folder>")
    check_backends(cfg, datamodule, model)
    trainer = build_trainer(cfg.trainer)
    counter = ImageCounter()  # a test-set result records the images it read; other numbers say if partial
    trainer.callbacks.append(counter)
    trainer.test(model, datamodule=datamodule, verbose=False)
    total = split_images(trainer.test_dataloaders)
    metrics = scalar_metrics(trainer.callback_metrics)
    # On several ranks each process holds the test's numbers (synced over the ranks); rank 0 alone measures,
    # writes and reports, so that one table and one result come out, with one throughput said to be its own.
    rank0 = trainer.is_global_zero

    net = backbone(model).eval()
    metrics["params_M"] = sum(p.numel() for p in net.parameters()) / 1e6
    if hasattr(datamodule, "img_size"):  # fixed-size classification input; DETR's input size varies
        image_shape = (3, datamodule.img_size, datamodule.img_size)
        metrics["MACs_M"] = count_macs(net, image_shape) / 1e6
        if cfg.throughput_batch is not None and rank0:  # timed batches beyond the test (the benchmark's skip them)
            metrics["throughput_img_s"] = measure_throughput(net, image_shape, cfg.throughput_batch)
            if trainer.world_size > 1:
                say(f"note: throughput_img_s is rank 0's alone: one process timing batches of {cfg.throughput_batch}"
                    f" after the test, not a sum over the {trainer.world_size} ranks")
    require_finite_metrics(metrics, str(cfg.ckpt_path or weights))
    run_dir = Path(os.path.abspath(cfg.ckpt_path)).parent.parent if cfg.ckpt_path is not None else None
    status = run_status(run_dir) if run_dir is not None else None
    not_the_runs = not_a_result(run_dir, status) if run_dir is not None else ""
    if result is not None and status is not None and (status.state != "finished" or not_the_runs):
        # A result records the run's identity and length, which a resumed run keeps while its best.ckpt changes:
        # one written now would later pass for the finished run's. A smoke run's is no result either (the tables
        # and evaluate_testsets leave such runs out). Its numbers are shown, never recorded.
        why = "a test-set result is of a finished run" if status.state != "finished" else "a smoke run has no result"
        not_the_runs += f"; nothing written to {result['path'].parent} ({why})"
    elif result is not None:
        from lifecycle.testset_definition import PRECISION_KEY, READ_KEY, TOTAL_KEY
        from lifecycle.testsets import check_read_whole, write_result

        check_read_whole(counter.images, total, result["testset"])  # a limit no setting showed: still no result
        # what the Trainer ran at (Lightning's name), checked before the test from the setting
        check_test_precision({"precision": str(trainer.precision)}, result["testset"])
        path = result.pop("path")
        if rank0:
            write_result(path, {**result, PRECISION_KEY: str(trainer.precision), READ_KEY: counter.images,
                                TOTAL_KEY: total, "metrics": metrics})
        if written is not None and rank0:
            written.append(path)
    unmeasured = [name for name in getattr(model, "size_class_metrics", ()) if name not in metrics]
    if unmeasured and rank0:
        say(f"note: {', '.join(unmeasured)} not reported: the test split has no ground-truth box of their size"
            " (COCO's areas: small < 32^2, medium 32^2-96^2, large > 96^2 px)", stream=sys.stderr)
    reasons = [partial_test_note(counter.images, total, cfg.trainer), not_the_runs]
    for why in filter(None, reasons):  # a legitimate look at a checkpoint, but not a result of the run: say so
        if rank0:
            say(f"note: not a result: {why}", stream=sys.stderr)
        if notes is not None:
            notes.append(why)
    return metrics


# Trainer settings that take away what eval.py reads its numbers from: the metrics the model logs
NOT_EVAL_TRAINER_SETTINGS = {"barebones": "it turns off the logging eval.py reads the test's metrics from"}


def check_eval_trainer(trainer: Any) -> None:
    """Refuse, before anything is built, a ``trainer.*`` setting that is no eval setting (`NOT_EVAL_TRAINER_SETTINGS`),
    in one line naming it (Lightning's own refusal names neither the key nor why)."""
    for key, why in NOT_EVAL_TRAINER_SETTINGS.items():
        value = trainer.get(key) if hasattr(trainer, "get") else None
        if value not in (None, False):
            raise ValueError(f"trainer.{key}={value} is not an eval setting: {why}; valid: drop it (trainer.{key}"
                             "=false)")


def check_backends(cfg: DictConfig, datamodule: Any, model: Any) -> None:
    """Refuse, before the test, a model whose attention backend (the run's ``rpe.backend``) cannot run forward on
    a device eval.py runs it on: the Trainer's for the test, and the CPU (where Lightning returns the model
    after the test) for the MACs and throughput of fixed-size input (`check_backend_devices`)."""
    from lifecycle.settings import check_backend_devices

    check_backend_devices(cfg, model, training=False)
    if hasattr(datamodule, "img_size"):
        check_backend_devices(cfg, model, training=False, device="cpu",
                              where="the CPU, where eval.py counts MACs and measures throughput after the test")


def _load_run(cfg: DictConfig) -> tuple[Path, Path, DictConfig, dict[str, Any]]:
    """``(ckpt_path, config path, run config, checkpoint)`` of ``cfg.ckpt_path``, checked to be one run's."""
    from lifecycle.identity import past_run_length, run_length
    from lifecycle.run_config import RunConfigError, check_run_identity, load_run_checkpoint, load_run_config

    if not str(cfg.ckpt_path).strip():
        raise FileNotFoundError("ckpt_path is empty; give a run's checkpoint, e.g."
                                " ckpt_path=runs/<run>/checkpoints/best.ckpt")
    ckpt_path = Path(cfg.ckpt_path)
    refuse_dot_dot_after_link_read(ckpt_path, "ckpt_path")  # its run dir is read from the path's text below
    if ckpt_path.is_file() and ckpt_path.suffix != ".ckpt":
        raise FileNotFoundError(f"ckpt_path={str(ckpt_path)!r} is not a checkpoint (a run's are"
                                " runs/<run>/checkpoints/best.ckpt and last.ckpt)")
    if ckpt_path.is_dir():
        if ckpt_path.suffix == ".ckpt":  # a folder where the checkpoint belongs: no file inside it to point at
            raise FileNotFoundError(f"ckpt_path={str(ckpt_path)!r} is a folder, where the run's checkpoint file"
                                    " belongs; valid: a checkpoint file (retrain the run to write it again)")
        example = ckpt_path / ("best.ckpt" if ckpt_path.name == "checkpoints" else "checkpoints/best.ckpt")
        raise FileNotFoundError(f"ckpt_path={str(ckpt_path)!r} is a folder; give a checkpoint file, e.g. {example}")
    if not ckpt_path.is_file():
        valid = "valid: a run's checkpoint file, runs/<run>/checkpoints/best.ckpt or last.ckpt"
        if entry_exists(ckpt_path):
            raise FileNotFoundError(f"ckpt_path={str(ckpt_path)!r} is not a checkpoint file:"
                                    f" {describe_non_file(ckpt_path)}; {valid}")
        raise FileNotFoundError(f"ckpt_path={str(ckpt_path)!r} does not exist; {valid}")
    # the run dir that holds the checkpoint's path, not the target of a symlink: never another run's config
    run_config = Path(os.path.abspath(ckpt_path)).parent.parent / "config.yaml"
    if not plain_file_exists(run_config):  # a FIFO or a folder there is named as such (RunFileError), not missing
        if ckpt_path.is_symlink():  # the link's own folder is no run dir: name the link, not a config path
            raise FileNotFoundError(
                f"ckpt_path={str(ckpt_path)!r} is a symlink (to {os.readlink(ckpt_path)}), and a checkpoint is read"
                " at its run dir's path, runs/<run>/checkpoints/<file>.ckpt, whose run's config.yaml lies beside"
                f" it (links are not followed: no other config is taken for it; none is at {run_config});"
                f" valid: ckpt_path={os.path.realpath(ckpt_path)}")
        raise FileNotFoundError(f"no run config at {run_config}; expected runs/<run>/checkpoints/<file>.ckpt")
    run_cfg = load_run_config(run_config)
    checkpoint = load_run_checkpoint(ckpt_path)
    check_run_identity(run_cfg, run_config, checkpoint, ckpt_path)
    past = past_run_length(checkpoint, run_length(run_cfg)) or _length_not_trained(checkpoint, run_config.parent)
    if past is not None:  # the same config trained longer, or at a length this dir never ran: another run's
        raise RunConfigError(f"ckpt_path={str(ckpt_path)!r} is not the checkpoint of the run in {run_config.parent}:"
                             f" {past}")
    return ckpt_path, run_config, run_cfg, checkpoint


def _length_not_trained(checkpoint: dict[str, Any], run_dir: Path) -> str | None:
    """Why ``checkpoint`` was saved at a length ``run_dir`` never trained at (its run.json lists them), or
    None (also when either record does not say)."""
    from lifecycle.checkpoints import LENGTH_KEY
    from lifecycle.records import read_run_record

    try:
        record = read_run_record(run_dir)
    except RunFileError:
        return None  # a damaged run.json: the run's status note says so
    made, lengths = checkpoint.get(LENGTH_KEY), (record or {}).get("lengths")
    if made is None or not isinstance(lengths, list) or made in lengths:
        return None
    return f"it was saved by a run of length {made}, which this run dir never trained at"


def _run_data_and_model(cfg: DictConfig) -> tuple[Any, Any]:
    """The data module and the LightningModule of ``cfg.ckpt_path``'s run, with the checkpoint's weights
    (checked to fit the model and to be finite) and the run's data (checked to be on disk; never generated)."""
    from lifecycle.run_config import (
        build_data_and_model,
        check_run_categories,
        check_run_classes,
        load_run_weights,
        require_existing_data,
        run_class_names,
    )

    ckpt_path, run_config, run_cfg, checkpoint = _load_run(cfg)  # checked before eval's batch size changes it
    if cfg.batch_size is not None:
        run_cfg.data.batch_size = cfg.batch_size
    data_root = cfg.get("data_root")
    datamodule, model = build_data_and_model(run_cfg, data_root=data_root)
    load_run_weights(model, checkpoint, ckpt_path, run_config)
    source = "the data_root= override" if data_root is not None else str(run_config)
    require_existing_data(datamodule, source, "data_root=<folder>")
    # other data (or the run's own, changed since) must name the run's classes in its labels' order
    what = f"data_root={data_root}" if data_root is not None else f"data.root of {run_config}"
    classes_note = check_run_classes(datamodule, run_class_names(checkpoint, run_cfg, run_config.parent), what,
                                     other=data_root is not None)
    check_run_categories(datamodule, checkpoint, what)
    for note in (getattr(datamodule, "data_root_note", ""), classes_note):
        if note:
            say(f"note: {note}", stream=sys.stderr)
    return datamodule, model


def _testset_data_and_model(cfg: DictConfig, ape_rule: str | None) -> tuple[Any, Any, dict[str, Any]]:
    """The run of ``cfg.ckpt_path`` (checked and loaded as in `_run_data_and_model`; its own data is read
    only by a test set made of it, and never generated), moved to the test set ``cfg.testset``, with the
    test set's data module, and the record of the result file without its metrics."""
    from omegaconf import OmegaConf

    from data.generation import read_marker
    from lifecycle.checkpoints import TRAINING_KEY as CHECKPOINT_TRAINING_KEY
    from lifecycle.run_config import (
        RunConfigError,
        build_data_and_model,
        check_run_categories,
        load_run_weights,
        run_class_names,
    )
    from lifecycle.testset_definition import (
        CHECKPOINT_SHA256_KEY,
        CHECKPOINT_STEP_KEY,
        DATA_DIGEST_KEY,
        DATA_FILES_KEY,
        DATA_GENERATOR_KEY,
        HASH_KEY,
        TRAINING_KEY,
        best_step_problem,
        checkpoint_sha256,
        configured_generator,
        testset_sha256,
    )
    from lifecycle.testsets import (
        adapt_model,
        build_datamodule,
        check_classes,
        check_replaceable,
        check_result_folder,
        input_size,
        load_testset,
        prepare_testset_data,
        result_path,
        testset_data_config,
    )

    testset = load_testset(cfg.testset)
    if Path(str(cfg.ckpt_path)).name != BEST_CHECKPOINT:  # the tables' test-set columns are the runs' results
        raise ValueError(f"ckpt_path={cfg.ckpt_path} with testset=: a test-set result is of the run's result, its"
                         f" {BEST_CHECKPOINT}; valid: ckpt_path=<run>/checkpoints/{BEST_CHECKPOINT} (another"
                         " checkpoint: eval.py without testset=)")
    ckpt_path, run_config, run_cfg, checkpoint = _load_run(cfg)
    status = run_status(run_config.parent)
    run_metrics = status.metrics or {}
    # another training's weights are named by the tables (`training_problem`)
    same_training = status.state == "finished" and run_metrics.get(TRAINING_KEY) == checkpoint.get(
        CHECKPOINT_TRAINING_KEY)
    replaced = best_step_problem(checkpoint.get("global_step"), run_metrics) if same_training else ""
    if replaced:  # a result is of the run's result, its best.ckpt: one measured of other weights would pass for it
        raise RunConfigError(f"ckpt_path={cfg.ckpt_path} is not the run's best.ckpt: it is {replaced}; valid: the"
                             " run's own best.ckpt (train the run again to make it), or eval.py without testset=")
    _, model = build_data_and_model(run_cfg)  # the run's datamodule, detached, is not used
    load_run_weights(model, checkpoint, ckpt_path, run_config)

    run_data = OmegaConf.to_container(run_cfg.data, resolve=False)
    data, own = testset_data_config(run_data, testset, cfg.get("data_root"))
    if cfg.batch_size:
        data["batch_size"] = cfg.batch_size
    datamodule = build_datamodule(data)
    data_digest = prepare_testset_data(datamodule, own, run_config, cfg.get("data_root"), testset["name"],
                                       run_root=run_data.get("root"))
    data_files = None if own else check_run_hand_data(data, run_config.parent, testset["name"])
    # what was read: the definition and, for generated data, the generator its marker records (checked above
    # to be the definition's, or the run's); not where it lies (data.root differs between machines)
    marker = read_marker(Path(datamodule.root).expanduser()) if own or data_digest is not None else None
    # COCO shapes name no generator target: their settings are the definition's own keys, hashed with it, as
    # make_tables and evaluate_testsets hash the definition (`configured_generator`)
    generated = marker.get("generator") if own and marker and configured_generator(testset) is not None else None
    sha256 = testset_sha256(testset, generated)
    check_classes(datamodule, model, testset["name"], run_class_names(checkpoint, run_cfg, run_config.parent), own)
    check_run_categories(datamodule, checkpoint, f"testset={testset['name']}")
    adapted = adapt_model(model, input_size(datamodule), ape_rule, testset["name"], datamodule.batch_size)
    from lifecycle.identity import identity_config, identity_hash, run_length

    path = result_path(ckpt_path, testset["name"], adapted["ape_rule"])
    problem = own_folder_problem(path.parent, "test-set results")
    if problem:  # a link there may lead into another run's results: written through, or cleared, never
        raise RunFileError(f"{path.parent}: {problem} (nothing was evaluated)")
    check_result_folder(path.parent)  # the result is written after the whole test: a folder it cannot go to, now
    check_replaceable(path, sha256, testset)
    record = {
        "testset": testset["name"],
        "checkpoint": recorded_path(ckpt_path),
        # whose result this is, and of which length of it (make_tables checks both: a run extended to more
        # epochs after this evaluation has another best.ckpt)
        "identity": identity_hash(identity_config(run_cfg)),
        "length": run_length(run_cfg),
        **adapted,
        "data_root": recorded_path(datamodule.root),
        "testset_config": _with_recorded_root(testset),
        HASH_KEY: sha256,  # make_tables counts the result only under the test set of this definition
        DATA_DIGEST_KEY: data_digest,  # the images it read, as checked against their marker (None: hand data)
        # for the run's own data at data_root=: the generator that shows it a copy of the run's (make_tables)
        DATA_GENERATOR_KEY: marker.get("generator") if marker else None,
        DATA_FILES_KEY: data_files,  # the run's own hand data read: their fingerprint, the run's (checked above)
        # which training's best.ckpt this measured: make_tables counts it only for the weights metrics.json is of
        TRAINING_KEY: checkpoint.get(CHECKPOINT_TRAINING_KEY),
        CHECKPOINT_STEP_KEY: checkpoint.get("global_step"),  # metrics.json's best_step (`best_step_problem`)
        CHECKPOINT_SHA256_KEY: checkpoint_sha256(ckpt_path),  # the very file: evaluate_testsets keeps it beside it
        "path": path,
    }
    return datamodule, model, record


def recorded_path(path: str | os.PathLike) -> str:
    """``path`` as a result records it: absolute and normalised (no ``.`` or ``..``), whatever the working dir
    of the command was; links kept as given, as a run's ``data.root`` names them, except where a ``..`` follows a
    link: there the folder the system reads (up from the link's target)."""
    from storage.destinations import system_reading

    path = os.path.expanduser(os.fspath(path))
    physical = system_reading(path)
    return str(physical) if physical is not None else os.path.abspath(path)


def _with_recorded_root(testset: dict[str, Any]) -> dict[str, Any]:
    """The resolved test set with its ``data.root`` (where it has one) as `recorded_path` writes it."""
    data = testset.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("root"), str):
        return testset
    return {**testset, "data": {**data, "root": recorded_path(data["root"])}}


def check_run_hand_data(data: dict[str, Any], run_dir: Path, name: str) -> str | None:
    """The fingerprint (`lifecycle.identity.data_record`) of the run's own hand data (no generator) that test
    set ``name`` reads with data config ``data``, once it is known to be the data the run trained on (its
    run.json records them, else its metrics.json): a folder whose files changed since is refused in one line,
    before anything is evaluated. None for generated data (their marker's digest is checked instead)."""
    from lifecycle.identity import data_difference, data_record
    from lifecycle.records import METRICS, read_run_record
    from lifecycle.testset_definition import RUN_DATA_FILES_KEY
    from lifecycle.testsets import TestsetError
    from storage.files import read_json

    now = data_record(data)
    if now is None:
        return None
    try:
        recorded = (read_run_record(run_dir) or {}).get("data")
    except RunFileError:
        recorded = None  # a damaged run.json: its metrics.json still says what the run trained on
    if not isinstance(recorded, dict):
        try:
            metrics = read_json(run_dir / METRICS) or {}
        except RunFileError:
            metrics = {}
        files = metrics.get(RUN_DATA_FILES_KEY) if isinstance(metrics, dict) else None
        recorded = {"root": metrics.get("data/root"), "files": files, "count": "?"} if files else None
    difference = data_difference(recorded, now)
    if difference is not None:
        raise TestsetError(f"testset={name} measures the run's own data, and data.root={now['root']} holds other"
                           f" files than the run trained on ({difference}); nothing was evaluated; valid: restore"
                           " the run's data there (or evaluate a run trained on these data)")
    return now["files"]


def trainer_rank_zero() -> bool:
    """Whether this process is rank 0 of the test's processes (the only one, without DDP)."""
    from lightning.pytorch.utilities import rank_zero_only

    return rank_zero_only.rank == 0


def print_table(metrics: dict[str, Any], title: str) -> None:
    """The metrics as one table under ``title``, a line of its own: the title names paths, which a table title
    would break mid-word at the terminal's width (a path must stay one piece to be copied)."""
    from rich.console import Console
    from rich.table import Table

    order = ["params_M", "MACs_M", "val/top1", "val/top5", "val/AP", "val/AP50", "val/AP75", "val/APs",
             "val/APm", "val/APl", "val_ema/top1", "throughput_img_s"]
    print(title, flush=True)
    table = Table()
    keys = [k for k in order if k in metrics]
    for key in keys:
        table.add_column(key, justify="right")
    table.add_row(*(f"{metrics[k]:.2f}" for k in keys))
    Console().print(table)


# What a command line may set when it evaluates a run (ckpt_path=): the run's own config.yaml decides the
# model, its encodings and its data, so an override of those would be silently ignored.
RUN_EVAL_KEYS = ("ckpt_path", "batch_size", "data_root", "throughput_batch", "testset", "ape", "trainer", "paths",
                 "hydra")


def check_run_eval_overrides(overrides: list[str]) -> None:
    """With ``ckpt_path=``, refuse (one line) an override that the run's own config would overrule, and one
    of the test set's definition (`check_testset_definition_override`)."""
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        check_testset_definition_override(key, override)
        if key.split(".", 1)[0].split("/", 1)[0] not in RUN_EVAL_KEYS:
            raise ValueError(f"{override} cannot change a run evaluated with ckpt_path=: its model, encodings and"
                             f" data come from the run's config.yaml; valid here: {', '.join(RUN_EVAL_KEYS)}"
                             " (evaluate another model with a run of its own)")


def check_testset_definition_override(key: str, override: str) -> None:
    """Refuse ``testset.name=``: a result is filed (and counted by make_tables) under its test set's name, so
    another name would put one test set's numbers in another's column; and ``testset.fits=``, the runs it
    fits (`lifecycle.testsets.fits_override_problem`)."""
    from lifecycle.testsets import fits_override_problem

    if key == "testset.name":
        raise ValueError(f"{override} would file the result of one test set under another's name; valid: pick the"
                         " test set by its name, testset=<name> (configs/testset/<name>.yaml)")
    problem = fits_override_problem(key)
    if problem:
        raise ValueError(f"{override} {problem}; valid: leave testset.fits out, and pick a test set that fits the"
                         " run, testset=<name>")


@hydra.main(version_base="1.3", config_path="configs", config_name="eval")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from lifecycle.settings import decode_environment_values
    from lifecycle.signals import exit_when_interrupted

    written: list[Path] = []
    notes: list[str] = []
    with exit_when_interrupted("eval.py", "nothing was evaluated or written (results are written whole or not at"
                               " all)"):
        try:
            decode_environment_values(cfg)  # batch_size=${oc.env:...} is the number it spells, as the check took it
            if cfg.ckpt_path is not None:
                # as typed: reading the list resolves each override's text as an interpolation
                check_run_eval_overrides(list(OmegaConf.to_container(HydraConfig.get().overrides.task)))
            metrics = evaluate(cfg, written, notes)
        except user_error_types() as err:
            report_user_error(err)
    if not trainer_rank_zero():
        return  # a DDP worker: rank 0 prints the one table
    title = str(cfg.ckpt_path or cfg.model.weights)
    if written:
        title += f" on testset={cfg.testset.name} (written to {written[0]})"
    if notes:
        title += " - not a result of the run (see the note above)"
    print_table(metrics, title=title)


if __name__ == "__main__":
    starting.imported()
    cli(main, "eval")
