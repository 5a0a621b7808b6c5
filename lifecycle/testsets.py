"""Evaluate a finished run on a named test set (``configs/testset/<name>.yaml``) that differs from its data.

A test set names what it replaces in the run's data config (``data``: the image size, the root, its own
generator...) and which runs it fits (``fits``: kinds of training data, `run_data_kinds`). The run's
model is rebuilt and loaded as in eval.py (strict, checked), then moved to the test set's input size by
`adapt_model`: DeiT's absolute table by the rule the user names (`models.deit.APE_RULES`), Swin with its
windows kept, DETR as it is (its position encodings follow each input). The result goes atomically to
``<run dir>/testsets/<name>[@<ape rule>].json``; the run's ``metrics.json`` is never touched.

A result carries its provenance (`lifecycle.testset_definition`): the hash of the test set's definition and of
its data's marker (``testset_sha256``), the digest of the images it read (``data_sha256``, checked against
that marker first), and how many images the test read of how many (``images_read``, ``images_total``).
Only a test of the whole set is written (`check_whole_test`, `ImageCounter`), at the one precision of every
test-set column (`check_test_precision`: ``trainer.precision`` other than 32-true is refused, the precision
used is recorded), and never over a result of another definition of the test set (`check_replaceable`).

Data: a test set with its own ``data.generator`` lives at its own ``data.root``, made once by
``scripts/generate_testsets.py`` (`generate_testset_data`); eval.py only reads it. A test set
without one reads the run's own data, which must already exist: at the run's ``data.root``, or with
``data_root=<folder>`` at a copy of the run's generated data (its marker records the run's generator
settings; its images are checked against it). Any other ``data_root`` is refused (`check_run_data_root`):
such a result would measure other images under the name of the run's own.
Every mismatch is one line naming the key and the valid choices.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from data.errors import DataConfigError
from lifecycle.console import say
from lifecycle.identity import config_differences
from lifecycle.project import group_options
from lifecycle.records import TESTSETS
from lifecycle.testset_definition import measured, over_read, result_sha256
from models.deit import APE_RULES, ModelConfigError, RPEVisionTransformer
from models.swin import WindowRPEBackbone, swin_grid_problem
from storage.files import RunFileError, atomic_write_json, read_json, with_checksum, writable_folder

RESULT_FOLDER = TESTSETS  # <run dir>/testsets/<name>[@<ape rule>].json
TESTSET_KEYS = ("name", "description", "fits", "data")
# What a test set may say it fits: the kind of data the run trained on (`run_data_kinds`).
DATA_KINDS = ("imagefolder", "relational", "relational_distance", "digits", "coco", "shapes_coco")
_GENERATOR_KINDS = {
    "data.relational.generate_relational_shapes": "relational",
    "data.digits.generate_digits": "digits",
}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


class TestsetError(DataConfigError):
    """A test set that is malformed or does not fit the run; the message is one line."""

    __test__ = False  # not a pytest class


def testset_names() -> list[str]:
    return group_options("testset")


def check_ape_rule(ape: Any) -> str | None:
    """``ape`` of the eval config: None or one of `APE_RULES`, else one line with the choices."""
    if ape is not None and ape not in APE_RULES:
        raise ModelConfigError(f"ape={ape!r} is not an APE rule; valid: {', '.join(APE_RULES)} (or leave it unset)")
    return ape


def load_testset(node: DictConfig) -> dict[str, Any]:
    """The resolved, checked test set of the eval config (``cfg.testset``) as plain Python."""
    testset = OmegaConf.to_container(node, resolve=True)
    if not isinstance(testset, dict):
        raise TestsetError(f"testset must be a mapping of {', '.join(TESTSET_KEYS)}; valid test sets:"
                           f" {', '.join(testset_names())}")
    unknown = sorted(set(testset) - set(TESTSET_KEYS))
    if unknown:
        raise TestsetError(f"testset.{unknown[0]} is not a test set key; valid keys: {', '.join(TESTSET_KEYS)}")
    name = testset.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise TestsetError(f"testset.name={name!r} must be a file name of letters, digits, '_', '.', '-'"
                           " (the result is written to <run dir>/testsets/<name>.json)")
    fits = testset.get("fits")
    if not isinstance(fits, list) or not fits or any(kind not in DATA_KINDS for kind in fits):
        raise TestsetError(f"testset.fits={fits!r} must be a non-empty list of: {', '.join(DATA_KINDS)}")
    data = testset.get("data")
    if not isinstance(data, dict) or not data:
        raise TestsetError(f"testset.data={data!r} must be a mapping of the data settings the test set replaces")
    if any(str(key).startswith("_") for key in data):
        raise TestsetError("testset.data may not set _target_ or other '_' keys: the data module is the run's")
    return testset


def run_data_kinds(run_data: dict[str, Any]) -> set[str]:
    """The kinds (`DATA_KINDS`) of a run's (checked, plain) data config."""
    target = str(run_data.get("_target_", ""))
    generator = run_data.get("generator")
    kinds = set()
    if target.endswith("ImageFolderDataModule"):
        kinds.add("imagefolder")
        if isinstance(generator, dict) and generator.get("_target_") in _GENERATOR_KINDS:
            kind = _GENERATOR_KINDS[generator["_target_"]]
            if kind == "relational" and generator.get("label", "direction") == "distance":
                kind = "relational_distance"  # other classes: a direction test set does not fit it
            kinds.add(kind)
    elif target.endswith("CocoDataModule"):
        kinds.add("coco")
        if isinstance(generator, dict):
            kinds.add("shapes_coco")
    return kinds


def fitting_testsets(run_data: dict[str, Any]) -> list[str]:
    """The test set names in ``configs/testset`` whose ``fits`` meets the run's data kinds."""
    from lifecycle.project import CONFIG_DIR

    kinds = run_data_kinds(run_data)
    names = []
    for name in testset_names():
        fits = OmegaConf.load(CONFIG_DIR / "testset" / f"{name}.yaml").get("fits") or []
        if kinds & set(fits):
            names.append(name)
    return names


def testset_data_config(run_data: dict[str, Any], testset: dict[str, Any], data_root: Any) -> tuple[dict, bool]:
    """The data config of the test set: the run's, with the test set's keys replacing the run's (a
    generator replaced whole, never merged, so the test set's data is the same for every run); and
    whether the test set has data of its own (its own generator, hence its own root)."""
    kinds = run_data_kinds(run_data)
    if not kinds & set(testset["fits"]):
        fitting = fitting_testsets(run_data) or ["none"]
        raise TestsetError(
            f"testset={testset['name']} fits runs trained on {', '.join(testset['fits'])} data, this run trained on"
            f" {', '.join(sorted(kinds)) or run_data.get('_target_')} data; valid for this run: {', '.join(fitting)}"
        )
    override = testset["data"]
    own = override.get("generator") is not None
    if own and "root" not in override:
        raise TestsetError(f"testset={testset['name']} has its own data.generator but no data.root: its data needs a"
                           " folder of its own")
    if "root" in override and (override["root"] is None or not str(override["root"]).strip()):
        raise TestsetError(f"testset.data.root={override['root']!r} names no folder; valid: a folder of the test set's"
                           " own, or leave testset.data.root out for its definition's")
    if own and data_root is not None:
        raise TestsetError(
            f"data_root={data_root} points at the run's data, but testset={testset['name']} has data of its own at"
            f" testset.data.root={override['root']}; valid: drop data_root (or set testset.data.root=<folder>)"
        )
    data = dict(run_data)
    data.update(override)
    if own:  # the run's class count is its own data's: the test set's data counts its own, checked against the
        data["num_classes"] = override.get("num_classes")  # run's head by `check_classes`
    if data_root is not None:
        data["root"] = str(data_root)
    return data, own


def fits_override_problem(key: str) -> str:
    """Why a command-line override of ``key`` may not be given, where it sets ``testset.fits`` (or a part of it),
    else ''. The runs a test set fits are part of its definition, which its hash leaves out: a result of
    a test set made to fit another run's data would be counted under the test set's name."""
    if key != "testset.fits" and not key.startswith("testset.fits."):
        return ""
    return ("would change which runs the test set fits, which its definition (configs/testset/<name>.yaml)"
            " decides, not the command line")


def build_datamodule(data: dict[str, Any]) -> Any:
    """A data module from a plain data config, by the same allow-listed plain calls as a run's
    (`lifecycle.run_config`): never Hydra's ``instantiate``."""
    from lifecycle.run_config import DATA_MODULES, GENERATORS, _load_allowed

    data = dict(data)
    target = data.pop("_target_")
    generator = data.get("generator")
    if isinstance(generator, dict) and "_target_" in generator:  # COCO's generator is plain kwargs
        generator = dict(generator)
        name = generator.pop("_target_")
        if name not in GENERATORS:
            raise TestsetError(f"testset.data.generator._target_={name!r} is not allowed; valid:"
                               f" {', '.join(GENERATORS)}")
        generator.pop("_partial_", None)
        data["generator"] = functools.partial(_load_allowed(GENERATORS, name), **generator)
    return _load_allowed(DATA_MODULES, target)(**data)


def generate_command(name: str) -> str:
    return f"python scripts/generate_testsets.py {name}"


def prepare_testset_data(datamodule: Any, own: bool, run_config: Path, data_root: Any = None,
                         name: str = "", run_root: Any = None) -> str | None:
    """Check that the data a test set reads is on disk; nothing is generated at its root. Returns the checked
    content digest of generated images (`data.generation.scan_content`): the test set's own, or the run's;
    None for hand data.

    Own data (the test set's generator, at its own root) must be complete, generated with the test set's
    settings and unchanged since (`generate_testset_data` makes it). The run's data must be on disk as
    eval.py without a test set requires (`require_existing_data`), and a ``data_root`` folder must hold the
    run's own data (`check_run_data_root`; ``run_root`` is the run's ``data.root``)."""
    from lifecycle.run_config import detach_generator, require_existing_data

    if own:
        from data.generation import check_generator_settings

        generator = getattr(datamodule, "generator", None)
        if callable(generator):  # a setting no generation takes (num_val=0) is named, never compared with the disk
            try:
                check_generator_settings(generator)
            except ValueError as err:
                line = " ".join(str(err).split()).replace("data.generator.", "testset.data.generator.", 1)
                raise TestsetError(f"testset={name}: {line}") from None
        _refuse_missing_data_placement(datamodule.root, name)
        return require_existing_data(
            datamodule, f"testset={name}", "",
            remedy=f"a test set's data is made by its own command, once: {generate_command(name)}"
                   " (with the same paths.data_dir= and testset.* overrides as here)",
            # the command above keeps data made with other settings: the choices are the data or another folder
            edited="valid: leave out the testset.* overrides that differ, to read the set on disk, or give"
                   f" another paths.data_dir= (or testset.data.root=), where {generate_command(name)} with them"
                   " makes the set",
        )
    detach_generator(datamodule)
    if data_root is not None:
        check_run_data_root(datamodule.run_generator, run_root, data_root, name)
    source = "the data_root= override" if data_root is not None else str(run_config)
    # the run's generator stays attached: its marker and images are checked, and their digest recorded
    return require_existing_data(datamodule, source, "data_root=<folder>")


def _refuse_missing_data_placement(root: Any, name: str) -> None:
    """A test set's own data that is not at ``root`` is made there by `generate_testset_data`, which refuses a
    root inside a run dir, an archive or another data root: that reason, in one line, rather than advice to
    run a command that is itself refused."""
    from data.generation import read_marker
    from storage.destinations import DestinationError, check_destination

    try:
        if read_marker(Path(str(root)).expanduser()) is not None:
            return  # data on disk: `require_existing_data` checks it
    except (ValueError, OSError):
        return  # a damaged marker: `require_existing_data` names it
    try:
        check_destination(str(root), "testset.data.root", data_root=True)
    except DestinationError as err:
        raise TestsetError(f"testset={name}: {err} (no test set's data is there, and none is made there)") from None


def _folder(path: Any) -> Path:
    return Path(os.path.normpath(Path(str(path)).expanduser().absolute()))


def check_run_data_root(generator: Any, run_root: Any, data_root: Any, name: str) -> None:
    """Refuse, in one line before anything is evaluated, a ``data_root`` that is not the run's own data for
    test set ``name``, which reads the run's data: the run's ``data.root`` (``run_root``) is, and so is a copy
    of the run's generated data (a marker that records the run's ``generator`` settings; its images are then
    checked against it). Hand data (no generator) is known by its folder only."""
    from data.generation import MARKER_NAME, describe_generator, read_marker
    from lifecycle.run_config import _generator_differences

    given = _folder(data_root)
    if run_root is not None and given == _folder(run_root):
        return
    if generator is None or isinstance(generator, dict):  # hand data, or COCO shapes (no marker of settings)
        why = "the run's data are not generated, so only its own folder is its data"
        valid = f"drop data_root (or data_root={run_root})"
        if not Path(str(run_root)).expanduser().is_dir():  # moved: its old place is no remedy
            why += f", and data.root={run_root} no longer exists"
            valid = f"put the run's data back at {run_root} and drop data_root"
    else:
        try:
            marker = read_marker(given)
        except (ValueError, OSError) as err:
            marker, why = None, f"its {MARKER_NAME} cannot be read ({' '.join(str(err).split()) or type(err).__name__})"
        else:
            why = f"it has no {MARKER_NAME} of the run's generator" if marker is None else ""
        if marker is not None:
            diff = _generator_differences(marker.get("generator"), describe_generator(generator))
            if not diff:
                return  # a copy of the run's generated data: require_existing_data checks its images
            why = f"it was generated with other settings than the run's data ({diff})"
        valid = "drop data_root, or data_root=<a copy of the run's generated data (the same generator settings)>"
    raise TestsetError(
        f"data_root={data_root} is not this run's data: testset={name} measures the run's own data (data.root="
        f"{run_root}), and {why} (nothing was evaluated); valid: {valid}")


# The data config (configs/data/<name>.yaml) whose module reads a generated test set, by its `fits` kind.
GENERATED_KIND_DATA = {"relational": "relational", "relational_distance": "relational_distance", "digits": "digits",
                       "shapes_coco": "shapes_coco"}


def generate_testset_data(cfg: DictConfig) -> Path:
    """Generate the data of the test set ``cfg.testset`` (an eval config) at its own root, atomically, and
    return the root. A root already complete with the same settings is kept; one made with other settings
    stops with the differences. A test set that reads a run's data has nothing to
    generate: one line says so."""
    testset = load_testset(cfg.testset)
    kinds = [kind for kind in testset["fits"] if kind in GENERATED_KIND_DATA]
    if testset["data"].get("generator") is None or not kinds:
        raise TestsetError(f"testset={testset['name']} reads the evaluated run's own data (no data.generator of its"
                           " own): there is nothing to generate; eval.py reads the run's data.root")
    from lifecycle.cli import compose_checked

    base = compose_checked("eval", [f"data={GENERATED_KIND_DATA[kinds[0]]}"])
    data, _ = testset_data_config(OmegaConf.to_container(base.data, resolve=True), testset, None)
    datamodule = build_datamodule(data)
    from storage.destinations import check_destination

    check_destination(datamodule.root, "testset.data.root", data_root=True)  # never inside a run or another dataset
    from data.generation import MARKER_NAME, UnmarkedRootError

    try:
        datamodule.prepare_data()
    except UnmarkedRootError as err:  # a test set's data is always generated: data.generator=null is no remedy
        raise TestsetError(f"testset.data.root={err.root} exists but has no {MARKER_NAME} completion marker: it was"
                           " not made by the test set's generator (a half-made or hand-made folder); delete it to"
                           " regenerate it, or give the test set another testset.data.root") from None
    root = Path(datamodule.root).expanduser().absolute()
    _mark_testsets_folder(root.parent, OmegaConf.select(cfg, "paths.data_dir", default=None,
                                                        throw_on_resolution_failure=False))
    return root


def _mark_testsets_folder(folder: Path, data_dir: Any) -> None:
    """Mark ``folder`` as the test sets' own data folder (`storage.destinations.TESTSETS_MARKER`) where it is
    ``<paths.data_dir>/testsets``, the folder the test sets' definitions put their roots in (a root given
    elsewhere marks nothing): every destination check then keeps run dirs, archives and outputs out of it."""
    from lifecycle.project import testset_data_folders
    from storage.destinations import TESTSETS_MARKER, real
    from storage.files import atomic_write_json, entry_exists

    if real(folder) not in {real(f) for f in testset_data_folders(data_dir)} or entry_exists(folder / TESTSETS_MARKER):
        return
    atomic_write_json(folder / TESTSETS_MARKER, {"kind": "the test sets' own data (scripts/generate_testsets.py)"},
                      make_parents=False)


def input_size(datamodule: Any) -> tuple[int, int] | None:
    """The classification input ``(h, w)`` of a data module; None for DETR (its input size varies)."""
    size = getattr(datamodule, "img_size", None)
    return None if size is None else (int(size), int(size))


def _backbones(module: Any) -> list[torch.nn.Module]:
    from lifecycle.run_config import backbone

    nets = [backbone(module)]
    ema = getattr(module, "ema", None)
    if ema is not None:  # the EMA weights are evaluated too (val_ema/*)
        nets.append(ema.module)
    return nets


# Bytes per attention entry at evaluation: the float32 scores, their softmax and a relative term of the
# same shape live together (measured peaks on CPU stay under this bound).
_ATTENTION_BYTES_PER_ENTRY = 16


def free_memory_bytes() -> int | None:
    """Memory an evaluation can still take: the GPU's free memory, else the OS's ``MemAvailable``; None
    where neither can be read (the check is skipped)."""
    if torch.cuda.is_available():
        return int(torch.cuda.mem_get_info()[0])
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def attention_entries(net: torch.nn.Module, size: tuple[int, int]) -> int:
    """Attention entries of one image in the largest layer at ``size``: heads x tokens x tokens for
    DeiT (global attention), heads x tokens x window area for Swin's first stage."""
    grid = [s // p for s, p in zip(size, net.patch_embed.patch_size, strict=True)]
    tokens = grid[0] * grid[1]
    if isinstance(net, WindowRPEBackbone):  # Swin and Swin-v2
        window = net._ref_window_sizes[0]
        return net.layers[0].blocks[0].attn.num_heads * tokens * window[0] * window[1]
    tokens += getattr(net, "num_prefix_tokens", 0)
    return net.blocks[0].attn.num_heads * tokens * tokens


def check_attention_memory(net: torch.nn.Module, size: tuple[int, int], batch_size: int, name: str,
                           free: int | None) -> None:
    """Refuse, in one line, a test set whose attention at ``batch_size`` cannot fit in ``free`` bytes
    (a 32 px run at 384 px has 9217 tokens: hundreds of GiB per batch), naming the batch size that fits."""
    if free is None:
        return
    per_image = attention_entries(net, size) * _ATTENTION_BYTES_PER_ENTRY
    if per_image * batch_size <= free:
        return
    gib = 2.0**30
    fits = free // per_image
    valid = (f"batch_size={fits} or less" if fits >= 1 else
             "a test set nearer the run's training size: even one image does not fit")
    raise ModelConfigError(
        f"testset={name} at {size[0]}x{size[1]} px needs about {per_image * batch_size / gib:.1f} GiB for one"
        f" attention layer at batch_size={batch_size}, and {free / gib:.1f} GiB is free; valid: {valid}")


def adapt_model(module: Any, size: tuple[int, int] | None, ape_rule: str | None, name: str,
                batch_size: int = 1) -> dict[str, Any]:
    """Move the run's network(s) to the test set's input ``size`` by ``ape_rule``; returns what was done
    (for the result file). A test set whose attention at ``batch_size`` cannot fit in memory is refused
    first (`check_attention_memory`); one forward at the new size then surfaces a relative encoding that
    cannot run there (a window-sized table) as one line before any evaluation."""
    net = _backbones(module)[0]
    if size is None:  # DETR: backbone and encodings follow each input; there is no table to adapt
        if ape_rule is not None:
            raise ModelConfigError(f"ape={ape_rule} adapts an absolute position table; DETR computes its position "
                                   "encodings for each input's feature map; valid: leave ape unset")
        return {"model": type(net).__name__, "ape": None, "ape_rule": None}
    if not isinstance(net, (RPEVisionTransformer, WindowRPEBackbone)):
        raise ModelConfigError(f"testset={name} needs a DeiT or Swin backbone to resize, not {type(net).__name__}")
    is_deit = isinstance(net, RPEVisionTransformer)
    train_size = tuple(int(s) for s in net.patch_embed.img_size)
    if is_deit and net.pos_embed is not None and ape_rule is None:
        ape_rule = "interpolate"  # timm's own way of resizing a ViT
    check_attention_memory(net, size, batch_size, name, free_memory_bytes())
    for each in _backbones(module):
        each.adapt_input_size(size, ape_rule)
    record: dict[str, Any] = {
        "model": type(net).__name__,
        "ape": net.ape if is_deit else None,
        "ape_rule": ape_rule,
        "train_img_size": list(train_size),
        "img_size": list(size),
        "patch_grid": list(net.patch_embed.grid_size),
    }
    if not is_deit:  # where timm pads windows at this size (None: every stage tiled exactly)
        patch, window = net.patch_embed.patch_size, net._ref_window_sizes[0]
        record["window_padding"] = [
            swin_grid_problem(side, p, w, len(net.layers)) for side, p, w in zip(size, patch, window, strict=True)
        ]
    try:
        with torch.no_grad():
            was_training = net.training
            net.eval()
            net(torch.zeros(1, 3, *size))
            net.train(was_training)
    except (ValueError, RuntimeError) as err:
        reason = " ".join(str(err).split())
        raise ModelConfigError(f"testset={name}: this run's model cannot run at {size[0]}x{size[1]} px ({reason}; a"
                               " trained table keeps its size); valid: a test set whose patch grid fits") from None
    return record


def check_classes(datamodule: Any, module: Any, name: str, run_classes: list[str] | None = None,
                  own: bool = True) -> None:
    """The test set must have the run's classes: as many as the run's head, and (`check_run_classes`) the
    names the run's model was trained on, in the same label order (labels index the same outputs).
    ``run_classes``: the run's (`run_class_names`), None where unknown; ``own``: the test set has data of its
    own (a note where the run's classes are unknown), not the run's."""
    from lifecycle.run_config import check_run_classes

    datamodule.setup("test")
    head = module.hparams.get("num_classes")
    if head is not None and int(datamodule.num_classes) != int(head):
        raise TestsetError(f"testset={name} has {datamodule.num_classes} classes at {datamodule.root}, this run's"
                           f" model has {head}: the test set does not fit the run's data; valid: a test set of the"
                           f" run's {head} classes, with testset.data as its configs/testset/<name>.yaml sets it")
    note = check_run_classes(datamodule, run_classes, f"testset={name}", other=own, error=TestsetError)
    if note:
        say(f"note: {note}", stream=sys.stderr)


def result_name(name: str, ape_rule: str | None) -> str:
    """The result's file stem: the test set's name, with ``@<rule>`` where an APE rule adapted the model
    (``relational_canvas48@extend``), so results of the two rules on one run sit side by side."""
    return name if ape_rule is None else f"{name}@{ape_rule}"


def result_path(ckpt_path: str | os.PathLike, name: str, ape_rule: str | None = None) -> Path:
    """``<run dir>/testsets/<result_name>.json``, the run dir being the one that holds ``ckpt_path`` (not a
    symlink's target: never another run's folder)."""
    return Path(os.path.abspath(ckpt_path)).parent.parent / RESULT_FOLDER / f"{result_name(name, ape_rule)}.json"


def write_result(path: Path, record: dict[str, Any]) -> None:
    """Atomically write the result with its checksum (strict JSON; the run's other files untouched)."""
    atomic_write_json(path, with_checksum(record))


# ------------------------------------------------------------------------------------------ a whole test only
def partial_test_setting(trainer: Any) -> str | None:
    """The trainer setting (of the eval config) that makes a test read a part of its set, or None: a batch
    limit other than null or 1.0 (an int is a number of batches: ``1`` is one batch), or ``fast_dev_run``."""
    limit = trainer.get("limit_test_batches")
    if limit is not None and not (isinstance(limit, float) and limit == 1.0):
        return f"trainer.limit_test_batches={limit}"
    fast = trainer.get("fast_dev_run")
    return f"trainer.fast_dev_run={fast}" if fast else None


def not_a_test_set_setting(setting: str, sets: str) -> str:
    """The refusal of ``setting`` (`partial_test_setting`) for the test sets ``sets``: a limit is refused as a
    setting, whatever it is (one that covers the whole set, too: the result is of the set, never of a limit)."""
    return (f"{setting} is not a setting of a test-set evaluation: its result is of the whole set ({sets}), never"
            " of a limited test (nothing was evaluated); valid: trainer.limit_test_batches=null or 1.0, no"
            " trainer.fast_dev_run")


def check_whole_test(trainer: Any, name: str) -> None:
    """Refuse, in one line and before anything is evaluated, a test of a part of test set ``name``: its
    result would replace (or stand for) the result of the whole set."""
    setting = partial_test_setting(trainer)
    if setting is not None:
        raise TestsetError(not_a_test_set_setting(setting, f"testset={name}"))


def check_test_precision(trainer: Any, name: str) -> None:
    """Refuse, in one line and before anything is evaluated, a test of test set ``name`` at another precision
    than every test-set column is measured at (`lifecycle.testset_definition.TESTSET_PRECISION`): its numbers
    would stand beside 32-true ones under one name."""
    from lifecycle.testset_definition import TESTSET_PRECISION, precision_problem

    precision = trainer.get("precision")
    if precision_problem(precision):
        raise TestsetError(f"trainer.precision={precision} for testset={name}: every test-set column is measured at"
                           f" {TESTSET_PRECISION}, whatever precision each run trained at (nothing was evaluated);"
                           f" valid: trainer.precision={TESTSET_PRECISION} (or leave it unset; with trainer=gpu"
                           f" too)")


def partial_test_note(read: int, total: int | None, trainer: Any) -> str:
    """Why the numbers of a test that read ``read`` of the split's ``total`` images are not a result, or ''
    (eval.py without a test set prints them with this note; a test set's result is never written)."""
    if total is not None and read > total:
        return over_read(read, total, "the split")
    setting = partial_test_setting(trainer)
    if (total is not None and read == total) or (total is None and setting is None):  # no length: only a setting
        return ""
    return (f"the test read {read} of {total if total is not None else 'an unknown number of'} images"
            f"{f' ({setting})' if setting else ''}: numbers of a part of the split")


def batch_images(batch: Any) -> int:
    """Images in one test batch: ``(images, labels)`` for classification, ``{"images", "targets", ...}`` for
    DETR (`data.coco.collate_detection`)."""
    if isinstance(batch, dict):
        return len(batch["targets"] if "targets" in batch else batch["images"])
    return len(batch[0])


class ImageCounter(L.Callback):
    """Counts the images the test loop evaluated, summed over ranks (`images`): whatever limited the test
    (a batch limit, fast_dev_run, a sampler), a result records what it read."""

    def __init__(self) -> None:
        self.images = 0

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        self.images += batch_images(batch)

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        total = trainer.strategy.reduce(torch.tensor(self.images, device=pl_module.device), reduce_op="sum")
        self.images = int(total)


def split_images(loaders: Any) -> int | None:
    """Images of the whole split(s) the test read from (its datasets' lengths); None where one has no length."""
    loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
    try:
        return sum(len(loader.dataset) for loader in loaders)
    except (TypeError, AttributeError):
        return None


def check_read_whole(read: int, total: int | None, name: str) -> None:
    """After the test: refuse (one line, nothing written) a result that did not read the whole set exactly once."""
    if total is not None and read > total:
        raise TestsetError(f"{over_read(read, total, f'testset={name}')}; nothing was written (an error in the"
                           " evaluation, not in its settings: please report it)")
    if total is None or read != total:
        raise TestsetError(f"the test read {read} of {total if total is not None else 'an unknown number of'} images"
                           f" of testset={name}; a partial test is no result, so nothing was written (valid: test"
                           " the whole set: no trainer batch limit)")


def check_result_folder(folder: Path, write: bool = True) -> None:
    """Refuse, in one line naming it, a run's folder of test-set results (``<run>/testsets``) that this process
    cannot list and read, or (``write``) write: a folder of mode 000 or 555, read-only storage; where it is
    missing, a run dir it cannot make it in. Before the test, not after it."""
    effective = os.access in os.supports_effective_ids
    where = folder if folder.is_dir() else folder.parent
    readable = os.access(where, os.R_OK | os.X_OK, effective_ids=effective)
    if readable and (not write or writable_folder(where)):
        return
    what = "list and read" if not readable else "write"
    made = "" if where == folder else f" (to make {folder.name}/ in it)"
    valid = "make it readable and writable" if write else "make it readable"
    raise RunFileError(f"cannot {what} {where}{made}: permission denied (read-only storage, or a folder this user"
                       f" may not use); nothing was evaluated; valid: {valid}")


def check_replaceable(path: Path, sha256: str, testset: dict[str, Any]) -> None:
    """Refuse, in one line, to replace the result at ``path`` when it is of another definition of the test
    set (the yaml or a ``testset.*`` override changed it) than ``sha256``: remove it first. A damaged file
    holds no result to keep; one of the same definition is evaluated again (a later length, say)."""
    try:
        record = read_json(path)
    except RunFileError:
        return
    if record is None or result_sha256(record) == sha256:
        return
    config = record.get("testset_config")
    if not isinstance(config, dict):
        why = "it records no test-set definition"
    else:
        why = config_differences(measured(config), measured(testset)) or "its data was generated with other settings"
    raise TestsetError(f"{path} holds a result of another definition of testset={testset['name']} ({why}); remove"
                       " it to evaluate this one (nothing was evaluated)")
