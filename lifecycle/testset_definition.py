"""What a test set measures, as one hash (``testset_sha256``), and whether a result read all of it.

eval.py records the hash and the images it read in each test-set result (`lifecycle.testsets`); make_tables
recomputes the hash from ``configs/testset/<name>.yaml`` and counts a result under ``<name>`` only when the
two agree and the whole set was read (`tables.collect`). Plain Python on purpose: the tables read
results without building a model.

The hash covers the test set's name and data settings, resolved, and the generator its data's completion
marker records (`data.generation`), not ``data.root``: where the data lives differs between machines
(``paths.data_dir``) while the marker says what was made there. ``description`` and ``fits`` are prose and
the runs it suits, never what is measured. Which images were read, byte for byte, a result records beside
the hash (``data_sha256``, for generated data: the test set's own or the run's).

What else changes a number a result reports is judged here too, by eval.py before it evaluates, by
evaluate_testsets.py before it keeps a result and by make_tables before it counts one: a test set that reads
the run's own data (no generator of its own, e.g. ``val_at_64``) measures that data only
(`run_data_problem`), and every test-set column is measured at one precision, `TESTSET_PRECISION`
(`precision_problem`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HASH_KEY = "testset_sha256"
READ_KEY, TOTAL_KEY = "images_read", "images_total"
PROVENANCE_KEYS = (HASH_KEY, READ_KEY, TOTAL_KEY)
# The digest of the generated images a result measured (`data.generation.scan_content`, checked against the
# data's marker before the test), beside the hash, not in it: make_tables recomputes the hash from the yaml,
# without the data, and results written before the digest was recorded keep their hash.
DATA_DIGEST_KEY = "data_sha256"
# What the completion marker of the data read records of its generator ({"target", "kwargs"}; None: hand data,
# no marker): for the run's own data at another folder, it shows the folder is a copy of the run's data.
DATA_GENERATOR_KEY = "data_generator"
# The precision a test-set result was evaluated at (Lightning's name). Every column is measured at one
# precision, whatever each run trained at, so that results of two runs, or two evaluations of one, compare
# (bf16-mixed moves val/loss, while top-1 may stay the same).
PRECISION_KEY = "precision"
TESTSET_PRECISION = "32-true"
# The token of the training whose best.ckpt was measured (`lifecycle.checkpoints.TRAINING_KEY`), in a run's
# metrics.json and in each test-set result: a result of weights that were deleted and trained again in the
# same run dir (same config, same length) is told apart from one of the weights metrics.json is of.
TRAINING_KEY = "training"
# The fingerprint (`lifecycle.identity.data_record`) of the hand data a result read where its test set reads
# the run's own data: the run's, as metrics.json records it under `RUN_DATA_FILES_KEY`, or another data set.
DATA_FILES_KEY = "data_files"
# The step of the checkpoint a result measured (its ``global_step``), to be metrics.json's ``best_step``: a
# best.ckpt replaced by another checkpoint of the same training (last.ckpt copied over it) keeps the token.
CHECKPOINT_STEP_KEY = "checkpoint_step"
RUN_DATA_FILES_KEY = "data/files"
# The sha256 of the best.ckpt file a result measured: a result is kept only beside that very file (a best.ckpt
# replaced or damaged since, whatever its step and token say, is not the file the result measured).
CHECKPOINT_SHA256_KEY = "checkpoint_sha256"


def checkpoint_sha256(path: str | os.PathLike) -> str | None:
    """The sha256 of the file at ``path`` (a checkpoint), or None when it is no regular file or cannot be read
    (a FIFO in its place is never opened: it would block)."""
    import stat

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


def best_step_problem(step: Any, metrics: Mapping[str, Any]) -> str:
    """Why a checkpoint of ``step`` (its ``global_step``) is not the run's best.ckpt that ``metrics`` (metrics.json)
    records at ``best_step``, or ''. Either unknown (an older record): ''."""
    best = metrics.get("best_step")
    if not isinstance(step, int) or not isinstance(best, int) or isinstance(step, bool) or step == best:
        return ""
    return (f"a checkpoint of step {step}, while the run's best.ckpt is of step {best} (metrics.json best_step):"
            " another checkpoint of the same training was put in its place (last.ckpt copied over it?)")


def training_problem(record: Mapping[str, Any], metrics: Mapping[str, Any], run_dir: Path | None = None) -> str:
    """Why the test-set result ``record`` is not of the weights the run's ``metrics`` (metrics.json) are of, or
    ''. Each records the token of the training whose best.ckpt it measured (`TRAINING_KEY`); results and
    metrics written before tokens were recorded (the committed archives) have none, and pair only with each
    other: a result without one beside metrics.json with one was evaluated before this run's weights were
    trained. A result of the run's own hand data must have read the data its metrics.json records. With ``run_dir``
    (the run the result lies in), a result whose ``checkpoint`` is another run dir's is named as such."""
    made, now = record.get(TRAINING_KEY), metrics.get(TRAINING_KEY)
    if made != now:
        if now is None:
            return (f"it records training {made!r}, while the run's metrics.json records none: it is not of the"
                    " weights that result is of")
        if made is None:
            return ("it was evaluated before the run's weights were trained (it records no training, the run's"
                    f" metrics.json {now!r}): it measured weights since deleted")
        tested = record.get("checkpoint")
        source = None  # a relative path (an older eval.py's) is of a working dir the result does not record
        if isinstance(tested, str) and os.path.isabs(tested):
            source = Path(os.path.normpath(tested)).parent.parent
        if run_dir is not None and source is not None and os.path.realpath(source) != os.path.realpath(run_dir):
            return (f"it measured the weights of a training in another run dir ({source}, training {made!r}; the"
                    f" run's best.ckpt is of training {now!r}): copied here?")
        return (f"it measured the weights of an earlier training in this run dir (training {made!r}; the run's"
                f" best.ckpt is of training {now!r})")
    if made is not None and CHECKPOINT_STEP_KEY not in record and isinstance(metrics.get("best_step"), int):
        # written by a version that recorded the training but not the step: its best.ckpt may have been replaced
        return ("it does not record the step of the checkpoint it measured (written before results recorded it), so"
                " it cannot be told from a result of another checkpoint put in best.ckpt's place")
    problem = best_step_problem(record.get(CHECKPOINT_STEP_KEY), metrics)
    if problem:
        return f"it measured {problem}"
    read, trained = record.get(DATA_FILES_KEY), metrics.get(RUN_DATA_FILES_KEY)
    if read is not None and trained is not None and read != trained:
        return (f"it read other data than the run trained on (fingerprint {str(read)[:12]}, the run's"
                f" {str(trained)[:12]}): its data.root was changed since")
    return ""
# Lightning's names of that precision (an int 32 reads as "32"); null is Lightning's default, 32-true
SAME_PRECISION = ("32", "32-true", "None")


def measured(testset: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a resolved test set (plain values) that decides its numbers: its name and its data
    settings without ``data.root``."""
    data = testset.get("data")
    data = {k: v for k, v in data.items() if k != "root"} if isinstance(data, Mapping) else data
    return json.loads(json.dumps({"name": testset.get("name"), "data": data}, default=str))


def over_read(read: int, total: int, what: str) -> str:
    """Why a test that counted ``read`` images of ``what`` (``total`` images, fewer) is no result: images were
    evaluated more than once (a sampler that repeats images to even out ranks), so every number weighs them
    twice. An error in the counting: never a whole test, nor a partial one."""
    extra = read - total
    return (f"the test counted {read} images of {what}, which has {total}: {extra} image{'s' if extra != 1 else ''}"
            " counted more than once, so its numbers are not of its images")


def configured_generator(testset: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the completion marker of the test set's own generated data records of its generator
    (``{"target", "kwargs"}``, as `data.generation.describe_generator` writes it), or None: the test set
    reads the run's data, or its generator names no target (COCO shapes: its settings are the definition's
    own keys, hashed with it; its marker is checked, not hashed)."""
    data = testset.get("data")
    generator = data.get("generator") if isinstance(data, Mapping) else None
    if not isinstance(generator, Mapping) or "_target_" not in generator:
        return None
    kwargs = {k: v for k, v in generator.items() if k not in ("_target_", "_partial_")}
    return json.loads(json.dumps({"target": generator["_target_"], "kwargs": kwargs}, default=str))


def testset_sha256(testset: Mapping[str, Any], generated: Mapping[str, Any] | None) -> str:
    """sha256 of the canonical JSON of `measured` ``testset`` and ``generated`` (its data's marker generator)."""
    payload = {"testset": measured(testset), "generated": generated}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def result_sha256(record: Mapping[str, Any]) -> str | None:
    """The definition hash of a result: its ``testset_sha256``, or for a result written before eval.py
    recorded it, the hash of the ``testset_config`` it stored (eval.py had checked its data's marker
    against that config); None when it records neither."""
    recorded = record.get(HASH_KEY)
    if recorded is not None:
        return recorded if isinstance(recorded, str) else None
    config = record.get("testset_config")
    return testset_sha256(config, configured_generator(config)) if isinstance(config, Mapping) else None


def reads_run_data(testset: Mapping[str, Any]) -> bool:
    """Whether a (resolved) test set reads the evaluated run's own data: it has no data generator of its own."""
    data = testset.get("data")
    return isinstance(data, Mapping) and data.get("generator") is None


def precision_problem(setting: Any) -> str:
    """Why a test-set evaluation at trainer.precision ``setting`` is not a result of its column, or ''."""
    if str(setting) in SAME_PRECISION:
        return ""
    return (f"it was evaluated at trainer.precision={setting}, and every test-set column is measured at"
            f" {TESTSET_PRECISION}")


def _folder(path: Any) -> str:
    return os.path.normpath(os.path.expanduser(str(path)))


def run_data_problem(record: Mapping[str, Any], run_data: Mapping[str, Any]) -> str:
    """Why the data a result of a run-own-data test set read (`reads_run_data`) are not the run's own data
    (``run_data``: its resolved data config), or ''. The run's own are its ``data.root``, or a copy of its
    generated data elsewhere: a folder whose marker records the run's generator settings and whose images
    eval.py checked against that marker (it records ``data_generator`` and ``data_sha256``). A result
    that records no ``data_root`` is taken as the run's (nothing says otherwise); one written before
    ``data_generator`` was recorded is judged by its ``data_root`` alone."""
    root = record.get("data_root")
    if root is None:
        return ""
    own = run_data.get("root")
    if own is not None and _folder(root) == _folder(own):
        return ""
    generator = configured_generator({"data": run_data})
    if generator is not None and record.get(DATA_DIGEST_KEY) is not None and record.get(DATA_GENERATOR_KEY) is not None:
        if json.loads(json.dumps(record[DATA_GENERATOR_KEY], default=str)) == generator:
            return ""  # a copy of the run's generated data, checked by eval.py against its marker
    return (f"it read data_root={root}, not this run's data (data.root={own}), and test set"
            f" {record.get('testset')!r} measures the run's own data")


def measured_problem(record: Mapping[str, Any], definition: Mapping[str, Any],
                     run_data: Mapping[str, Any] | None) -> tuple[str, str]:
    """``(why, remedy)`` when the result ``record`` of test set ``definition`` (resolved) did not measure what
    its column holds, else ``("", "")``: its precision (`precision_problem`), and for a test set that reads
    the run's own data, data other than the run's (``run_data``; None: not compared; `run_data_problem`).
    A result that records no precision counts as measured at 32-true, what eval.py used before it recorded
    one. evaluate_testsets.py evaluates such a result again; make_tables does not count it."""
    precision = record.get(PRECISION_KEY)
    if precision is not None and precision_problem(precision):
        return (precision_problem(precision), f"evaluate it again at {TESTSET_PRECISION} (no trainer.precision"
                " override; scripts/evaluate_testsets.py)")
    if run_data is not None and reads_run_data(definition):
        problem = run_data_problem(record, run_data)
        if problem:
            return problem, "evaluate it again without data_root= (scripts/evaluate_testsets.py), or remove it"
    return "", ""


def load_definition(path: Path) -> dict[str, Any]:
    """The test set of ``configs/testset/<name>.yaml`` at ``path``, resolved without ``data.root`` (which
    names ``paths.data_dir``, known only inside a Hydra job, and is not hashed)."""
    from omegaconf import OmegaConf

    node = OmegaConf.load(path)
    if "data" in node and OmegaConf.is_dict(node.data) and "root" in node.data:
        del node.data["root"]
    definition = OmegaConf.to_container(node, resolve=True)
    if not isinstance(definition, dict):
        raise ValueError(f"{path} is not a test set (a mapping of name, description, fits, data)")
    return definition
