"""Find the runs under the given paths and read each one: its status, metrics, facts and cell.

What a run dir's state is comes from the lifecycle (`lifecycle.records.run_status`), and which runs
share a cell from its identity (`lifecycle.identity`): this module only reads, and names each run
it cannot count instead of dropping it or failing the whole table.

A finished run's results on other test sets (``eval.py testset=<name>``: ``<run dir>/testsets/<name>.json``)
join its metrics under the test set's column (`testset_column`): ``<name>/<metric>``, or
``<name>@<rule>/<metric>`` when the result file's ``ape_rule`` is set (the APE rule that resized the run's
absolute position table: ``relational_canvas48@interpolate/val/top1`` and
``relational_canvas48@extend/val/top1`` are two columns, never pooled; a run without an absolute table has
no rule, and `cells` shows its one result in each rule's column). A result file that cannot be trusted is
listed on the run (`Run.testset_problems`), not counted, and never costs the run its own result; so is one
of another definition of the test set than ``configs/testset/<name>.yaml`` now gives (its
``testset_sha256``, `lifecycle.testset_definition`), one that read a part of the set, one evaluated at another
precision than 32-true (every test-set column's, `TESTSET_PRECISION`), and one of a test set that reads the
run's own data (``val_at_64``) that read other data (`run_data_problem`). A result written before eval.py
recorded its precision is judged as before (eval.py's default was 32-true); one written before it recorded
``data_generator`` is judged by its ``data_root`` alone (a copy of the run's data elsewhere: evaluate it again).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from data.bounded_json import MAX_JSON_BYTES, MAX_YAML_BYTES, JsonBoundsError, read_json_bytes
from data.errors import absent_folder
from lifecycle.cli import sweep_grid
from lifecycle.console import plain_value
from lifecycle.identity import (
    SEED_KEY,
    config_differences,
    flatten,
    identity_config,
    identity_hash,
    run_length,
)
from lifecycle.records import (
    CHECKPOINTS,
    CONFIG,
    FINDINGS_SNAPSHOT,
    HYDRA_DIR,
    METRICS,
    PERCENT_METRICS,
    RUN_RECORD,
    TESTSETS,
    TRIALS_FILE,
    RunStatus,
    partial_run,
    read_run_record,
    run_status,
)
from lifecycle.testset_definition import (
    HASH_KEY,
    PROVENANCE_KEYS,
    READ_KEY,
    TOTAL_KEY,
    configured_generator,
    load_definition,
    measured,
    measured_problem,
    over_read,
    result_sha256,
    testset_sha256,
    training_problem,
)
from rpe.config import FIELDS, PRESETS, RPEConfig, RPEConfigError, build_rpe, parse_shorthand, resolve_rpe
from rpe.index import INDEX_METHODS, IndexSpec, bucket_ids, num_buckets
from rpe.registry import encoding
from storage.destinations import is_archive, is_run_dir, sweep_dir_of
from storage.files import (
    CHECKSUM,
    RunFileError,
    check_plain_file,
    checksum_problem,
    entries_named,
    entry_exists,
    own_folder_problem,
    plain_file_exists,
    read_json,
    symlink_loop,
    yaml_problem,
)

# A run's status in a table. ``ok``: a finished run with its result; ``failed`` (failed.json); ``unfinished``
# (no record, no result: a run of an older version that stopped); ``interrupted``, ``running`` and ``died``
# (run.json's state); ``missing`` (a grid point without a run dir); ``no result`` (finished, but a metric of
# its table is null or absent); ``unreadable`` (a damaged record or config); ``duplicate`` (the same cell and
# seed as a run that is counted). Only ``ok`` runs are counted; every other one is listed by name.
STATUSES = ("ok", "failed", "unfinished", "missing", "interrupted", "running", "died", "no result", "unreadable",
            "duplicate")
OVERRIDES = f"{HYDRA_DIR}/overrides.yaml"
# The test set names `lifecycle.testsets` accepts, spelled out here: importing that module would load every model
# (timm) only to read JSON files (tests/test_tables_testsets.py checks they agree).
TESTSET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
APE_RULE = re.compile(r"[A-Za-z0-9_-]{1,50}")  # an APE rule's name goes into a column name: no '/' nor '@'
# The test sets' definitions (`lifecycle.cli.CONFIG_DIR` / testset): a result is counted under <name> only
# when it is of the definition configs/testset/<name>.yaml gives now.
TESTSET_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "testset"


class TableError(ValueError):
    """Bad input to this script, reported in one line."""


# ----------------------------------------------------------------------------- runs
@dataclass
class Run:
    """One training run (or one grid point that never got a run dir)."""

    path: str
    status: str
    facts: dict[str, Any]  # empty: the run's config is unreadable and no grid point places it
    metrics: dict[str, float] = field(default_factory=dict)
    error: str = ""
    ablation: str | None = None
    sweep: str | None = None
    identity: dict[str, str] | None = None  # `cell_identity` (None: a grid point never run, or placed by it)
    null_metrics: tuple[str, ...] = ()  # metrics.json's keys whose value is null or not finite
    # the counted results' columns (<name>[@<rule>], the file stems) -> their APE rules
    testsets: dict[str, str | None] = field(default_factory=dict)
    # (file, why) of each test-set result not counted, e.g. ("testsets/relational_right.json", "it is another
    # run's result ..."); the file is "testsets" when the folder itself cannot be read
    testset_problems: tuple[tuple[str, str], ...] = ()
    # (file, YAML data) of the findings snapshot the run took when it started (`registered_snapshot`; None: none,
    # or not the file run.json recorded); `reports.findings.registered` reads the findings it held
    findings_snapshot: tuple[str, Any] | None = None
    env: dict[str, Any] = field(default_factory=dict)  # metrics.json's env/* entries (`ENV_KEYS`)
    # the fingerprint of data without a generator it trained on (metrics.json's data/files; None: generated
    # data, or a run of an older version): runs on other data are never pooled (`cells.split_by_config`)
    data: str | None = None
    # its .hydra/overrides.yaml as `read_overrides` checked it, which matches it to its grid point (None: absent,
    # or not usable), and why it is not usable (damaged, or not the overrides of its config or dir name): such a
    # run is placed by its config (`_sweep_runs`), never by those overrides, and listed with the reason
    overrides: tuple[str, ...] | None = None
    overrides_problem: str = ""


def lenient_rpe(raw: dict[str, Any] | None) -> dict[str, Any]:
    """RPE fields of a run config; a value the library rejects (a failed run) is kept as written."""
    raw = dict(raw or {})
    try:
        return dataclasses.asdict(resolve_rpe(raw))
    except RPEConfigError:
        preset = str(raw.get("preset") or "none")
        try:
            base = PRESETS[preset] if preset in PRESETS else parse_shorthand(preset)
            fields = dataclasses.asdict(base)
        except RPEConfigError:
            fields = {name: None for name in FIELDS} | {"method": preset}
        fields.update({k: v for k, v in raw.items() if k in FIELDS and v is not None})
        return fields


def run_facts(cfg: dict[str, Any]) -> dict[str, Any]:
    """What the tables sort runs by: the RPE fields, bucket count, APE, seed and a short label."""
    rpe = lenient_rpe(cfg.get("rpe"))
    enabled = rpe.get("method") not in (None, "none")
    model = cfg.get("model") or {}
    net = model.get("net") or {}
    facts: dict[str, Any] = {
        "rpe": _rpe_label(rpe) if enabled else "none",
        "method": rpe.get("method") or "none",
        "mode": rpe.get("mode"),
        "on": rpe.get("on") if enabled else "none",
        "shared_head": rpe.get("shared_head"),
        "ratio": rpe.get("ratio"),
        "index": rpe.get("index"),
        "backend": rpe.get("backend"),
        "buckets": _bucket_count(rpe) if enabled else 0,
        "used_buckets": _used_buckets(rpe, _grid_side(cfg)) if enabled else 0,
        "num_classes": _num_classes(cfg),
        "design": _design(cfg, _grid_side(cfg)),
        "ape": net.get("ape", model.get("position_embedding")),
        "seed": cfg.get("seed"),
        "name": cfg.get("name") or "?",
        "preset": str((cfg.get("rpe") or {}).get("preset") or "none"),  # the encoding it trains, by name
        "preset_rpe": _preset_label(str((cfg.get("rpe") or {}).get("preset") or "none")),  # what that name trains
        "model": net.get("name") or model.get("_target_", "?").rsplit(".", 1)[-1],
        "schedule": cfg.get("schedule"),
        "row": _row_label(cfg),  # the job's entry of a sweep's `rows` table, where it has one
        "val_images": _generated_images(cfg),  # the own split's size, for its sampling noise
    }
    return facts


DETR_APE = "position_embedding"  # the key of DETR's model config that a row's `ape` sets (Table 6's rows)
# What an entry of a benchmark sweep's ``rows`` table sets (configs/sweep/_benchmark_rows.yaml): its field, the
# config key the sweep sets from it, and that key's value where the entry leaves the field out
ROW_FIELDS = (("rpe", "rpe.preset", None), ("mode", "rpe.mode", None), ("shared_head", "rpe.shared_head", None),
              ("on", "rpe.on", None), ("ape", "model.net.ape", "none"), ("peg_blocks", "model.net.peg_blocks", None))


def _row_label(cfg: dict[str, Any]) -> Any:
    """The run's ``row``, with ``[key=value, ...]`` for each setting its (resolved) config holds other than the row's
    entry sets: a value given on the command line over the row's (``row=none model.net.ape=sincos``) trained another
    design than the row names, so the run is no member of that row's cell."""
    row, rows = cfg.get("row"), cfg.get("rows")
    entry = rows.get(str(row)) if isinstance(rows, dict) and row is not None else None
    if not isinstance(entry, dict):
        return row
    # the entry's RPE fields are the shared rows' (mode, shared_head, on) and any a task's own rows set (ratio, index)
    own = {name: value for name, value in entry.items() if name in FIELDS and value is not None}
    trained = lenient_rpe(cfg.get("rpe") if isinstance(cfg.get("rpe"), dict) else {})
    made = lenient_rpe({"preset": entry.get("rpe") or "none", **own})
    changed = []
    for name, key, default in ROW_FIELDS:
        if name == "ape" and DETR_APE in (cfg.get("model") or {}):
            key = f"model.{DETR_APE}"  # DETR's absolute encoding (sine, none), which a Table 6 row names
        node = plain_value(cfg, key)
        field = key.split(".", 1)[1]
        if key.startswith("rpe.") and key != "rpe.preset" and node == made.get(field) == trained.get(field):
            continue  # the row's own value given again (rpe.mode=ctx on a contextual row): the same design
        if node != entry.get(name, default):
            changed.append(f"{key}={node}")
    # a field of the row's preset given over it (rpe.ratio=3.0, or drawn by optuna): the encoding resolves otherwise
    named = {text.split("=", 1)[0] for text in changed}
    if "rpe.preset" not in named:  # another preset is named by its name, not by each field it changes
        changed += [f"rpe.{name}={trained.get(name)}" for name in sorted(trained)
                    if trained.get(name) != made.get(name) and f"rpe.{name}" not in named]
    return f"{row} [{', '.join(changed)}]" if changed else row


# The fields iRPE's shorthand ``rpe-{ratio}-{method}-{mode}-{shared}-{on}`` names
SHORTHAND_FIELDS = ("ratio", "mode", "shared_head", "on")


def _rpe_label(rpe: dict[str, Any]) -> str:
    """The settings of the run's encoding, only those its method reads (`rpe.registry.Encoding.fields`).

    A method that reads a ratio, a mode and sites (iRPE's bucket tables) is named by iRPE's shorthand, followed by
    each other field that differs from what the shorthand stands for (`parse_shorthand`: index=piecewise), e.g.
    ``rpe-1.9-product-ctx-1-kv index=clip``; any other method by its name and every field it reads, spelled as
    the override that sets it: ``rope_mixed theta=10``, ``decomposed shared_head=true window=14``. The method
    name alone where its config is unknown (a method no longer registered)."""
    method = rpe.get("method")
    try:
        reads = encoding(str(method)).fields
    except (KeyError, ValueError):
        return str(method)
    values = dict(rpe)
    if "theta" in reads and values.get("theta") is None:  # RoPE's own default frequency base
        from rpe.encodings.rope import DEFAULT_THETA

        values["theta"] = DEFAULT_THETA.get(str(method))
    implied: dict[str, Any] = {}
    label = str(method)
    if {"ratio", "mode", "on"} <= set(reads):
        try:
            label = (f"rpe-{float(values['ratio']):g}-{method}-{values['mode']}-"
                     f"{int(bool(values['shared_head']))}-{values['on']}")
            implied = dataclasses.asdict(parse_shorthand(label))
        except (TypeError, ValueError, KeyError):  # RPEConfigError too: a failed run's value, kept as written
            label, implied = str(method), {}
    shown = [name for name in reads
             if not (implied and (name in SHORTHAND_FIELDS or values.get(name) == implied[name]))]
    return " ".join([label, *(f"{name}={_override_text(values.get(name))}" for name in shown)])


def _preset_label(preset: str) -> str | None:
    """`_rpe_label` of preset ``preset`` as it stands (a run whose ``rpe`` label differs trains it changed, e.g. by
    ``rpe.method=quant`` from a sweeper); None for a name that is no preset or shorthand (any more)."""
    try:
        config = PRESETS[preset] if preset in PRESETS else parse_shorthand(preset)
    except RPEConfigError:
        return None
    return "none" if config.method == "none" else _rpe_label(dataclasses.asdict(config))


def _override_text(value: Any) -> str:
    """``value`` as a Hydra override writes it: ``true``, ``10``, ``1.9``, ``null``."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _config_of(rpe: dict[str, Any]) -> RPEConfig:
    """The `RPEConfig` of a run's RPE fields as `lenient_rpe` gives them (every field, a value for each)."""
    return RPEConfig(**{k: v for k, v in rpe.items() if k in FIELDS})


def _bucket_count(rpe: dict[str, Any]) -> int | None:
    """Buckets of one table without the skip bucket (product 1.9: 49); None when undefined."""
    try:
        return num_buckets(IndexSpec.tables_of(_config_of(rpe))[0])
    except (RPEConfigError, ValueError, TypeError, IndexError):
        return None


def _grid_side(cfg: dict[str, Any]) -> int | None:
    """Side of the largest square grid an attention call of the model sees; None when the config does not say.

    Image size (``data.img_size``, else ``model.net.img_size``) / patch size, and for a window backbone (Swin,
    Swin-v2) its window where that is smaller. The patch size and window read from the config where it sets them
    (``model.net.patch_size``, ``model.net.window_size``), else from the model's architecture
    (`models.factory.grid_options`: Swin-v2's names, ``swinv2_micro_window4_32``, name no patch size), else from
    the name (``..._patch16_224``, ``..._window7_...``) of a model no builder knows. DETR: None (its feature map
    is that of each padded batch).
    """
    from models.factory import grid_options

    net = (cfg.get("model") or {}).get("net") or {}
    name = str(net.get("name", ""))
    built = grid_options(name)

    def setting(key: str) -> int | None:
        """The first that is set of ``model.net.<key>``, the architecture's and the name's ``<key><N>``."""
        named = re.search(NAMED_SETTING[key], name)
        for value in (net.get(key), built.get(key), int(named.group(1)) if named else None):
            if _square(value) is not None:
                return _square(value)
        return None

    # the images' size, which the grid is of; never guessed from the architecture (a config without it: ?)
    img_size = _square((cfg.get("data") or {}).get("img_size")) or _square(net.get("img_size"))
    patch = setting("patch_size")
    if img_size is None or patch is None:
        return None
    window = setting("window_size")  # None: not a window backbone
    return min(img_size // patch, window) if window is not None else img_size // patch


# How a model name that no builder knows names its patch size and window (``swin_tiny_patch4_window7_224``)
NAMED_SETTING = {"patch_size": r"patch(\d+)", "window_size": r"window(\d+)"}


def _square(value: Any) -> int | None:
    """The side of a positive int setting or of a square ``[h, w]`` one; None for anything else."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and value[0] == value[1]:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _fitted(config: RPEConfig, side: int) -> RPEConfig:
    """``config`` as it indexes a grid of ``side`` (a table sized by the window is fitted to the window)."""
    fit_window = encoding(config.method).fit_window if config.method != "none" else None
    return config if fit_window is None else fit_window(config, side)


@functools.lru_cache(maxsize=256)
def _built_indexes(config: RPEConfig) -> tuple[tuple[IndexSpec, ...], bool]:
    """The bucket indexes held by the modules that ``config`` builds (any encoding: iRPE's tables, Huang's,
    SASA's, CPB's and ALiBi's offsets), and whether every parameter of those modules starts at zero."""
    modules = [m for site in build_rpe(config, head_dim=8, num_heads=2) if site is not None for m in site.modules()]
    specs: list[IndexSpec] = []
    for module in modules:
        for value in vars(module).values():
            for item in value if isinstance(value, tuple) else (value,):
                if isinstance(item, IndexSpec) and item not in specs:
                    specs.append(item)
    return tuple(specs), all(not p.detach().any() for m in modules for p in m.parameters(recurse=False))


def _used_buckets(rpe: dict[str, Any], side: int | None) -> int | None:
    """Distinct buckets that the pairs of a ``side x side`` grid reach, summed over the tables of a site (cross:
    rows and cols; class-token bucket not counted). An encoding whose tables are indexed by the offset along
    each axis without a bucket index (decomposed) counts the entries of its row and column tables that the
    grid reads (`_offset_entries`); 0 for an encoding without any table of positions (RoPE, a PEG), None when
    the grid or the config is unknown."""
    if side is None:
        return None
    try:
        config = _fitted(_config_of(rpe), side)
        specs, _ = _built_indexes(config)
        if not specs:
            return _offset_entries(config, side)
        return sum(int(bucket_ids(spec, side, side, 0, "cpu").unique().numel()) for spec in specs)
    except (RPEConfigError, ValueError, TypeError, KeyError):
        return None


@functools.lru_cache(maxsize=256)
def _offset_entries(config: RPEConfig, side: int) -> int:
    """The table entries that the logit terms of ``config``'s modules read on a ``side x side`` grid (the distinct
    ids of each gathered piece, summed: decomposed reads ``2 side - 1`` row and as many column offsets); 0 for
    modules that add no gathered term (RoPE rotates q and k)."""
    import torch

    total = 0
    for site in build_rpe(config, head_dim=8, num_heads=2):
        if site is None or not getattr(site, "adds_logits", False):
            continue
        q = torch.zeros(1, 2, side * side, 8)
        for piece in site.logit_pieces(q, q, side, side, 0, 1.0):
            if piece.kind != "dense":
                total += int(piece.ids.unique().numel())
    return total


def _generated_images(cfg: dict[str, Any]) -> int | None:
    """Images of the validation split a data generator writes (``data.generator.num_val``); None otherwise."""
    value = ((cfg.get("data") or {}).get("generator") or {}).get("num_val")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _num_classes(cfg: dict[str, Any]) -> int | None:
    """Classes of the run's data (chance top-1 is 100 / classes); None when the config does not say."""
    model = cfg.get("model") or {}
    for value in ((cfg.get("data") or {}).get("num_classes"), (model.get("net") or {}).get("num_classes")):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


# Keys of a run's identity that label it and never change what it trains: which sweep and table it belongs
# to, and the `rows` entry a row sweep resolves into the config (what it selects stays in the identity).
DESIGN_LABELS = ("sweep_name", "ablation", "row")


def partition(ids: Any) -> str:
    """A name of the partition of the pairs that bucket ids ``ids`` induce: the same for two index functions
    exactly when they put the same pairs together, whatever ids they give (each pair named by the first pair
    of its bucket)."""
    import hashlib

    import numpy as np

    flat = np.asarray(ids).reshape(-1)
    _, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
    return hashlib.sha1(first[inverse].astype(np.int64).tobytes()).hexdigest()[:16]


def _bucket_partitions(config: RPEConfig, side: int) -> tuple[str, ...] | None:
    """Per bucket table of ``config``, the partition of the ``side x side`` grid's pairs, where a relabelling of
    the buckets cannot change training: every parameter starts at zero, so buckets that hold the same pairs
    train alike whatever their ids. None where the ids themselves matter: tables drawn at random (Swin's own
    bias: truncated normal), offsets embedded by a network (xl, CPB)."""
    specs, zero = _built_indexes(config)
    return tuple(partition(bucket_ids(spec, side, side, 0, "cpu")) for spec in specs) if specs and zero else None


def _design(cfg: dict[str, Any], side: int | None) -> str | None:
    """What a run trains, up to relabelled buckets: two runs with the same design cannot differ but by chance.

    The run's cell identity (`cell_identity`: its identity without the seed, plus its length) minus the labels
    of `DESIGN_LABELS`, with the RPE config resolved (``preset=irpe_k`` and the fields it stands for are one
    config) and, where `_bucket_partitions` proves it safe, the index fields (``index``, ``ratio``, ...)
    replaced by the partition of the grid's pairs into buckets. So ratio 1.9 and 2.0 on an 8x8 grid (both
    put offsets 0, 1, 2, 3, 4-7 of an axis in classes 0, 1, 2, 2, 3) share a design, while clip and piecewise at
    ratio 1.9 do not (offset 3: clip 3, piecewise 2). DETR re-initialises its tables Xavier-uniform from
    outside the encoding (models/detr/transformer.py), so there the index fields stay as written.
    None when the config cannot be read that far.
    """
    import hashlib
    import json

    try:
        identity = cell_identity(cfg)
        raw = dict(cfg.get("rpe") or {})
        config = resolve_rpe({k: v for k, v in raw.items() if k == "preset" or (k in FIELDS and v is not None)})
    except (RPEConfigError, AttributeError, TypeError, ValueError):
        return None
    design = {k: v for k, v in identity.items() if not k.startswith("rpe.") and k.split(".")[0] not in DESIGN_LABELS}
    fields = dataclasses.asdict(config)
    reinitialised = "detr" in str((cfg.get("model") or {}).get("_target_", "")).lower()
    if side is not None and not reinitialised and config.method in INDEX_METHODS:
        try:
            partitions = _bucket_partitions(_fitted(config, side), side)
        except (RPEConfigError, ValueError, TypeError, KeyError):
            partitions = None
        if partitions is not None:
            for name in INDEX_METHODS[config.method].fields:
                fields.pop(name, None)
            fields["partition of the grid's pairs"] = f"{side}x{side}: {', '.join(partitions)}"
    design["rpe"] = repr(sorted(fields.items()))
    return hashlib.sha1(json.dumps(sorted(design.items()), default=str).encode()).hexdigest()[:16]


def cell_identity(cfg: dict[str, Any]) -> dict[str, str]:
    """The cell of a run as ``dotted.key -> repr(value)``: its identity without the seed, plus its length.

    The lifecycle's `cell_key` (same dict, same cell), spelled out so that a table can name the keys in
    which the configs of one table position differ.
    """
    identity = identity_config(cfg)
    identity.pop(SEED_KEY, None)
    flat = {key: repr(value) for key, value in flatten(identity).items()}
    flat.update({f"trainer.{key}": repr(value) for key, value in run_length(cfg).items()})
    return flat


def _shown(path: Path) -> str:
    """``path`` relative to the working dir when inside it (tables stay valid in another checkout)."""
    try:
        return str(Path(os.path.realpath(path)).relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _text(path: Path) -> str:
    """A machine-written text record: a plain file, not empty, ending with its line break (else truncated)."""
    try:
        check_plain_file(path)
        # a regular file of bounded size (configs and grids, YAML, by a tighter bound: they parse slowly)
        text = read_json_bytes(path, MAX_YAML_BYTES if path.suffix == ".yaml" else MAX_JSON_BYTES).decode()
    except JsonBoundsError as err:
        raise TableError(f"{path} is damaged: {err}") from None
    except RunFileError as err:
        raise TableError(str(err)) from None
    except UnicodeDecodeError:  # an editor's other encoding (UTF-16), or binary damage
        raise TableError(f"{path} is damaged: not UTF-8 text, as train.py writes it") from None
    except OSError as err:
        raise TableError(f"cannot read {path}: {err.strerror or type(err).__name__}") from None
    if not text.strip():
        raise TableError(f"{path} is damaged: empty")
    if not text.endswith("\n"):
        raise TableError(f"{path} is damaged: truncated (it does not end with a line break)")
    if path.suffix == ".yaml" and (problem := yaml_problem(text)):
        raise TableError(f"{path} is damaged: {problem}")
    return text


def _yaml(path: Path) -> Any:
    """YAML as written (OmegaConf would resolve the ``${...}`` inside override strings)."""
    import yaml

    text = _text(path)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise TableError(f"{path} is damaged: not valid YAML ({str(err).splitlines()[0]})") from None
    except RecursionError:
        raise TableError(f"{path} is damaged: nested too deeply to be a record") from None


def read_config(path: Path) -> dict[str, Any]:
    """A run's config file as written (``config.yaml``), unresolved; a missing or damaged one is a one-line
    `TableError`. Read with OmegaConf's own YAML loader, the inverse of the ``OmegaConf.to_yaml`` that wrote it."""
    import yaml
    from omegaconf.errors import OmegaConfBaseException

    if not entry_exists(path):
        raise TableError(f"{path} is missing")
    text = _text(path)
    try:
        config = yaml.load(text, Loader=_config_loader())  # noqa: S506  (a safe loader: see _config_loader)
    except (yaml.YAMLError, OmegaConfBaseException, OSError, ValueError, TypeError) as err:  # OSError: a scalar
        raise TableError(f"{path} is damaged: not valid YAML ({str(err).splitlines()[0]})") from None
    except RecursionError:
        raise TableError(f"{path} is damaged: nested too deeply to be a config") from None
    if not isinstance(config, dict):
        raise TableError(f"{path} is damaged: it holds a YAML {type(config).__name__}, not a config")
    return config


@functools.lru_cache(maxsize=1)
def _config_loader() -> type:
    """OmegaConf's YAML loader (its float rule, no timestamps, duplicate keys refused, safe tags only) on
    libyaml's parser where PyYAML has it: a table reads every run's config, and the pure-Python parser spent
    most of make_tables' time there. What it returns equals ``OmegaConf.to_container(OmegaConf.load(...))``
    (tests/test_tables_faults.py checks both on archived configs)."""
    import yaml
    from omegaconf._utils import get_yaml_loader

    base = get_yaml_loader()
    if not getattr(yaml, "__with_libyaml__", False):
        return base

    class ConfigLoader(yaml.CSafeLoader):  # type: ignore[misc, name-defined]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            keys = set()
            for key_node, _ in node.value:
                if key_node.tag == yaml.resolver.BaseResolver.DEFAULT_SCALAR_TAG:
                    if key_node.value in keys:
                        raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                                f"found duplicate key {key_node.value}",
                                                                key_node.start_mark)
                    keys.add(key_node.value)
            return super().construct_mapping(node, deep=deep)

    ConfigLoader.yaml_implicit_resolvers = {key: list(rules) for key, rules in base.yaml_implicit_resolvers.items()}
    ConfigLoader.yaml_constructors = dict(base.yaml_constructors)
    return ConfigLoader


def check_record(run_dir: Path, cfg: dict[str, Any], state: str) -> None:
    """Refuse a ``config.yaml`` that is not the config its ``run.json`` was written for (damaged or edited).

    Both are written by the job that holds the run dir; a config that no longer has the record's identity
    (or, for a finished run, its length) would put the result in another cell.
    """
    try:
        record = read_run_record(run_dir)
    except RunFileError as err:
        raise TableError(str(err)) from None
    if record is None:  # runs of versions before run.json: nothing to check against
        return
    identity = identity_config(cfg)
    if identity_hash(identity) != record["identity"]:
        differences = config_differences(record["config"], identity) or "its identity hash"
        raise TableError(f"{run_dir / CONFIG} is not the config of {run_dir / RUN_RECORD} (damaged or edited?): "
                         f"{differences}")
    if state == "finished" and record.get("length") != run_length(cfg):
        raise TableError(f"{run_dir / CONFIG} has length {run_length(cfg)}, but {run_dir / RUN_RECORD} finished "
                         f"at length {record.get('length')} (damaged or edited?)")


# what metrics.json records of the things outside a run's identity that can still change its numbers
ENV_KEYS = ("env/code", "env/torch", "env/threads", "env/cpu", "env/device", "env/precision", "env/resumed_at")


def registered_snapshot(run_dir: Path) -> tuple[str, Any] | None:
    """``(file, YAML data)`` of the run's snapshot of its task's findings file, which it took before it trained;
    None where it has none, or where the snapshot is not the file whose sha256 run.json recorded then (edited
    since), or is not YAML. Read as YAML data only; what it registered is `reports.findings.registered`'s."""
    import hashlib

    path = run_dir / FINDINGS_SNAPSHOT
    try:
        record = read_run_record(run_dir)
        # a FIFO there is never opened, and a file larger than any record is never read whole
        data = read_json_bytes(path) if plain_file_exists(path) else None
    except (RunFileError, JsonBoundsError, OSError):
        return None
    if data is None or not record or record.get("findings_sha256") != hashlib.sha256(data).hexdigest():
        return None
    import yaml

    try:
        return str(path), yaml.safe_load(data)
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError):
        return None


def read_overrides(run_dir: Path, cfg: dict[str, Any] | None = None,
                   naming: JobNaming | None = None) -> list[str] | None:
    """The run's ``.hydra/overrides.yaml`` (``None`` when absent), which make_tables and archive_runs match to
    a grid point; a damaged one is a one-line `TableError`.

    So is one that is not the run's: a value it sets that the run's config ``cfg`` does not hold
    (`override_disagreement`), or, where the run's sweep names its job dirs after their overrides (``naming``,
    `job_naming`), overrides that give another dir name. Edited by hand or copied from another job, it would
    match the run to another grid point and report the run's own as missing.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    path = run_dir / OVERRIDES
    try:
        if not entry_exists(path):
            return None
    except OSError as err:  # its .hydra/ may not be looked into: as an unreadable file, the run's own problem
        raise TableError(f"cannot read {path}: {err.strerror or type(err).__name__}") from None
    overrides = _yaml(path)
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise TableError(f"{path} is damaged: it is not a list of overrides")
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as err:  # Hydra's parse errors have no common base class
        raise TableError(f"{path} is damaged: {str(err).splitlines()[0]}") from None
    why = override_disagreement(parsed, cfg) if cfg is not None else ""
    if why:
        raise TableError(f"{path} is not the overrides of the run's config: {why} (edited by hand, or copied from"
                         " another run?)")
    if naming is not None and (name := naming.dirname(parsed)) != run_dir.name:
        raise TableError(f"{path} is not the overrides of its run dir: they name the job's dir {name!r}, the run dir"
                         f" is {run_dir.name!r} (edited by hand, or the dir renamed?)")
    return overrides


# A sweep whose jobs' dirs are named after their overrides (configs/sweep/_base.yaml), as its grid saves it
NAMED_SUBDIR = re.compile(r"\$\{job_dirname:\$\{hydra[.:]job\.override_dirname\}\}")


@dataclass(frozen=True)
class JobNaming:
    """How a sweep names its job dirs after their overrides: Hydra's ``hydra.job.config.override_dirname``."""

    exclude_keys: tuple[str, ...] = ()
    item_sep: str = ","
    kv_sep: str = "="

    def dirname(self, parsed: list[Any]) -> str:
        """The dir name of the job with the parsed overrides ``parsed``, as Hydra and `job_dirname` make it."""
        from hydra._internal.config_loader_impl import get_overrides_dirname  # the hydra-core 1.3 pin's own

        from lifecycle.project import job_dirname

        return job_dirname(get_overrides_dirname(parsed, list(self.exclude_keys), self.item_sep, self.kv_sep))


def job_naming(sweep_dir: Path) -> JobNaming | None:
    """How ``sweep_dir``'s grid (``multirun.yaml``) names its job dirs after their overrides; None where it
    names them otherwise (by number, the default) or cannot be read (the grid is then listed as unreadable)."""
    try:
        saved = _yaml(sweep_dir / "multirun.yaml")
    except TableError:
        return None
    hydra = saved.get("hydra") if isinstance(saved, dict) else None
    sweep = hydra.get("sweep") if isinstance(hydra, dict) else None
    if not isinstance(sweep, dict) or not NAMED_SUBDIR.fullmatch(str(sweep.get("subdir")).strip()):
        return None
    settings: Any = hydra
    for key in ("job", "config", "override_dirname"):
        settings = settings.get(key) if isinstance(settings, dict) else None
    settings = settings if isinstance(settings, dict) else {}
    exclude = settings.get("exclude_keys") or []
    item_sep, kv_sep = settings.get("item_sep", ","), settings.get("kv_sep", "=")
    if not isinstance(exclude, list) or not isinstance(item_sep, str) or not isinstance(kv_sep, str):
        return None  # not what Hydra writes: no dir name can be checked against it
    return JobNaming(tuple(map(str, exclude)), item_sep, kv_sep)


_ABSENT = object()


def override_disagreement(parsed: list[Any], cfg: dict[str, Any]) -> str:
    """The first of the parsed overrides ``parsed`` that the config ``cfg`` does not hold, as ``seed=0, but the
    config has seed=1``; '' when it holds them all.

    Compared are the values overrides set (``a.b=v``, ``+a.b=v``) and remove (``~a.b``). A group choice
    (``rpe=irpe_k``: a folder of configs/) sets no one value and is not, nor is a value that interpolates
    (``${...}``), which the config holds resolved; Hydra's own keys are not in a run's config.
    """
    from lifecycle.project import CONFIG_DIR

    for override in parsed:
        key = override.key_or_group
        if override.package is not None or key.split(".")[0].split("/")[0] == "hydra" or (CONFIG_DIR / key).is_dir():
            continue
        held = plain_value(cfg, key, _ABSENT)
        if override.is_delete():
            if held is not _ABSENT:
                return f"{override.input_line}, but the config has {key}={held!r}"
            continue
        if override.is_sweep_override():
            return f"{override.input_line} sweeps {key}, which the overrides of one job never do"
        value = override.value()
        if "${" in str(value) or "${" in str(held):
            continue
        if held is _ABSENT:
            return f"{override.input_line}, but the config has no {key}"
        if not _same_value(value, held):
            return f"{override.input_line}, but the config has {key}={held!r}"
    return ""


def _same_value(value: Any, held: Any) -> bool:
    """Whether an override's parsed ``value`` is what the config holds: a dict is merged into the node it sets
    (its keys must hold their values), a number compares as a number, a string node holds a number given as
    text."""
    if isinstance(value, dict):
        return isinstance(held, dict) and all(k in held and _same_value(v, held[k]) for k, v in value.items())
    if isinstance(value, list):
        return isinstance(held, list) and len(value) == len(held) and all(map(_same_value, value, held))
    if value is None or held is None or isinstance(value, bool) or isinstance(held, bool):
        return value is held or (isinstance(held, str) and str(value).lower() == held.lower())
    if isinstance(value, (int, float)) and isinstance(held, (int, float)):
        return value == held or (math.isnan(value) and math.isnan(held))
    return str(value) == str(held)


# ----------------------------------------------------------------------------- results on other test sets
IMAGES = "images"  # a test-set result's number of images, kept beside its metrics (`read_testset_result`)


def testset_column(name: str, ape_rule: str | None) -> str:
    """The column of a test set's results: ``<name>``, or ``<name>@<rule>`` when an APE rule resized the run."""
    return name if ape_rule is None else f"{name}@{ape_rule}"


def read_testset_result(path: Path, identity: str, length: dict[str, Any] | None = None,
                        run_data: dict[str, Any] | None = None, run_metrics: dict[str, Any] | None = None
                        ) -> tuple[str | None, dict[str, float]]:
    """``(ape_rule, metrics)`` of the result file ``path`` of the run whose identity hash is ``identity``,
    whose data config is ``run_data`` and whose ``metrics.json`` is ``run_metrics`` (None: not compared).

    Anything that makes the numbers not this run's on this test set is a `TableError` saying why, without
    the path (the caller names the file): a symlink or a file that is not plain (never followed), damaged
    or non-JSON, not an object, a ``testset`` other than its file name (renamed or copied), another run's
    ``identity`` (a file without one, written before eval.py recorded it, is taken as the run's), an
    ``ape_rule`` that is no rule name, another definition of the test set or a part of it read
    (`_check_provenance`), another precision or other data than the column's (`_check_measured`), weights of
    another training than metrics.json's or other hand data than the run's (`training_problem`), and a
    metric that is not a finite number or a percentage outside [0, 100]. Only JSON is parsed: nothing in the
    file is executed or resolved.
    """
    # the file is <test set>[@<ape rule>].json (eval.py's lifecycle.testsets.result_name)
    name, _, named_rule = path.name.removesuffix(".json").partition("@")
    if not TESTSET_NAME.fullmatch(name) or (named_rule and not APE_RULE.fullmatch(named_rule)):
        raise TableError("its name is not <test set>[@<ape rule>].json (letters, digits, '_', '.', '-')")
    try:
        value = read_json(path)
    except RunFileError as err:
        raise TableError(str(err).replace(str(path), "the file")) from None
    if value is None:
        raise TableError("it vanished while it was read")
    if value.get("testset") != name:
        raise TableError(f"it is the result of test set {value.get('testset')!r}, not of {name!r} (its file name):"
                         " renamed or copied from another test set?")
    owner = value.get("identity")
    if owner is not None and owner != identity:
        raise TableError(f"it is another run's result (identity {owner!r}, this run's {identity!r}):"
                         " copied from another run dir?")
    rule = value.get("ape_rule")
    if rule is not None and not (isinstance(rule, str) and APE_RULE.fullmatch(rule)):
        raise TableError(f"the file is damaged: ape_rule {rule!r} is not an APE rule name")
    if (rule or "") != named_rule:
        held = f"ape_rule {rule!r}" if rule else "no APE rule (its run has no absolute table to resize)"
        said = f"@{named_rule}" if named_rule else "no rule (no @<rule> in its name)"
        raise TableError(f"it holds the result of {held}, its file name says {said}: renamed? (eval.py names a"
                         f" result <test set>{'@<rule>' if rule else ''}.json)")
    made, now = value.get("length"), length
    if made is not None and now is not None and made != now:
        raise TableError(f"it was evaluated when the run's length was {made}, the run's length is now {now}:"
                         " evaluate it again (scripts/evaluate_testsets.py)")
    _check_provenance(value, name)
    _check_measured(value, name, run_data)
    stale = training_problem(value, run_metrics, path.parent.parent) if run_metrics is not None else ""
    if stale:
        raise TableError(f"{stale}: evaluate it again (scripts/evaluate_testsets.py)")
    metrics = value.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        raise TableError("the file is damaged: it has no metrics")
    numbers: dict[str, float] = {}
    for key, number in metrics.items():
        # Python's JSON reader takes NaN and Infinity, which eval.py never writes: such a file was edited
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
            raise TableError(f"the file is damaged: {key}={number!r} is not a finite number")
        if key in PERCENT_METRICS and not 0 <= number <= 100:
            raise TableError(f"the file is damaged: {key}={number!r} is not a percentage in [0, 100]")
        numbers[key] = float(number)
    config = value.get("testset_config")
    images = _generated_images(config) if isinstance(config, dict) else None
    if images is not None:  # the test set's size, for its sampling noise (not a metric eval.py writes)
        numbers[IMAGES] = float(images)
    # last, so that a value eval.py cannot write is named: a result it wrote carries a checksum of its content
    if value.get("identity") is not None or CHECKSUM in value:
        problem = checksum_problem(value)
        if problem:
            raise TableError(f"the file is damaged: {problem}")
    return rule, numbers


@functools.lru_cache(maxsize=64)
def expected_testset(folder: Path, name: str) -> tuple[str, dict[str, Any]]:
    """``(testset_sha256, definition)`` of ``folder/<name>.yaml``, computed as eval.py does from the composed
    test set (its data's marker generator being the one the definition names, which eval.py checks)."""
    path = folder / f"{name}.yaml"
    if not path.is_file():
        raise TableError(f"there is no configs/testset/{name}.yaml to compare it with; valid: results of the test"
                         " sets defined there")
    try:
        definition = load_definition(path)
    except Exception as err:  # OmegaConf's and YAML's errors have no common base class
        raise TableError(f"configs/testset/{name}.yaml cannot be read ({str(err).splitlines()[0]})") from None
    return testset_sha256(definition, configured_generator(definition)), definition


def _check_provenance(value: dict[str, Any], name: str) -> None:
    """A `TableError` unless the result is of the definition ``configs/testset/<name>.yaml`` gives now and read
    the whole set. A result written before eval.py recorded the hash and the image counts is judged by the
    ``testset_config`` it stored, and taken as whole (nothing records otherwise)."""
    recorded = [key for key in PROVENANCE_KEYS if value.get(key) is not None]
    if recorded and len(recorded) < len(PROVENANCE_KEYS):  # eval.py writes all three, or (earlier) none
        missing = next(key for key in PROVENANCE_KEYS if key not in recorded)
        raise TableError(f"the file is damaged: it has {recorded[0]} but no {missing}")
    sha = value.get(HASH_KEY)
    if sha is not None and not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha)):
        raise TableError(f"the file is damaged: {HASH_KEY} {sha!r} is not a sha256")
    for key in (READ_KEY, TOTAL_KEY):
        count = value.get(key)
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise TableError(f"the file is damaged: {key}={count!r} is not a count of images")
    expected, definition = expected_testset(TESTSET_CONFIGS, name)
    if result_sha256(value) != expected:
        config = value.get("testset_config")
        if not isinstance(config, dict):
            raise TableError("it records no definition of its test set (testset_config), so it cannot be compared"
                             f" with configs/testset/{name}.yaml: evaluate it again (scripts/evaluate_testsets.py)")
        differences = (config_differences(measured(config), measured(definition))
                       or "its data was generated with other settings")
        raise TableError(f"it is of another definition of {name!r} than configs/testset/{name}.yaml (result -> yaml:"
                         f" {differences}): evaluate it again (scripts/evaluate_testsets.py), or remove it")
    read, total = value.get(READ_KEY), value.get(TOTAL_KEY)
    if isinstance(read, int) and isinstance(total, int) and read > total:  # never a whole test, nor a partial one
        raise TableError(f"{over_read(read, total, 'the test set')}: evaluate it again (scripts/evaluate_testsets.py)")
    if read != total:
        raise TableError(f"it is a partial test: it read {read} of the test set's {total} images (a trainer batch"
                         " limit): evaluate it again on the whole set (scripts/evaluate_testsets.py)")


def _check_measured(value: dict[str, Any], name: str, run_data: dict[str, Any] | None) -> None:
    """A `TableError` unless the result measured what its column holds (`measured_problem`)."""
    why, remedy = measured_problem(value, expected_testset(TESTSET_CONFIGS, name)[1], run_data)
    if why:
        raise TableError(f"{why}: {remedy}")


def run_data_config(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """A run's data config (of `read_config`), resolved where it can be, for `_check_measured`; None when the
    config has none."""
    data = cfg.get("data")
    if not isinstance(data, dict):
        return None
    try:
        resolved = OmegaConf.to_container(OmegaConf.create(cfg).data, resolve=True)
    except Exception:  # an interpolation only Hydra resolves (train.py writes config.yaml resolved)
        return data
    return resolved if isinstance(resolved, dict) else data


def read_testsets(run_dir: Path, identity: str, length: dict[str, Any] | None = None,
                  run_data: dict[str, Any] | None = None, run_metrics: dict[str, Any] | None = None
                  ) -> tuple[dict[str, float], dict[str, str | None], tuple[tuple[str, str], ...]]:
    """A finished run's results on other test sets: ``(metrics, testsets, problems)``.

    ``metrics``: ``<column>/<metric>`` of every result counted (`testset_column`: the file's stem);
    ``testsets``: column -> its APE rule; ``problems``: ``(file, why)`` of each result not counted
    (`read_testset_result`, given the run's ``run_data`` and ``run_metrics``). Read are the plain ``*.json`` files of
    ``run_dir/testsets`` (hidden ones, e.g. an atomic write's leftover, are not results); that folder must be
    the run's own, not a symlink into another run dir.
    """
    folder = run_dir / TESTSETS
    if not entry_exists(folder):
        return {}, {}, ()
    problem = own_folder_problem(folder, "test-set results")
    if problem:
        return {}, {}, ((TESTSETS, f"{problem}; none of its results is counted"),)
    try:
        names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".json") and not p.name.startswith("."))
    except OSError as err:
        return {}, {}, ((TESTSETS, f"cannot list it: {err.strerror or type(err).__name__}"),)
    metrics: dict[str, float] = {}
    testsets: dict[str, str | None] = {}
    problems: list[tuple[str, str]] = []
    for file in names:
        try:
            rule, numbers = read_testset_result(folder / file, identity, length, run_data, run_metrics)
        except TableError as err:
            problems.append((f"{TESTSETS}/{file}", str(err)))
            continue
        column = file.removesuffix(".json")  # <name>[@<rule>], checked by read_testset_result
        testsets[column] = rule
        metrics.update({f"{column}/{key}": number for key, number in numbers.items()})
    return metrics, testsets, tuple(problems)


def _not_ended(run_dir: Path, status: RunStatus) -> str:
    """Why a run with a record that is not finished has no result, and what to do."""
    length = ", ".join(f"trainer.{k}={v}" for k, v in (status.length or {}).items() if v is not None)
    why = {
        "interrupted": "stopped before its end; rerun the same command to resume it",
        "running": "its job is still running (it holds run.lock)",
        "died": "run.json says running, but no process holds run.lock: the job died; rerun the same command "
                "to resume it",
    }[status.state]
    earlier = f"; its {METRICS} is an earlier result, not one of this length" if (run_dir / METRICS).is_file() else ""
    return f"{why} ({length}){earlier}" if length else f"{why}{earlier}"


def _config_path(run_dir: Path, state: str) -> Path:
    """The resolved ``config.yaml``; Hydra's ``.hydra/config.yaml`` only for a run without a result (a job
    that failed or stopped before it wrote its config), as a result must be placed by the config it ran."""
    if entry_exists(run_dir / CONFIG) or state == "finished":
        return run_dir / CONFIG
    return run_dir / HYDRA_DIR / CONFIG


def _placement(path: Path, cfg: dict[str, Any]) -> tuple[dict[str, Any], str | None, str | None, dict[str, str]]:
    """Facts, ablation, sweep and cell identity of a run's config; a config of the wrong shape is a `TableError`."""
    try:
        ablation, sweep = cfg.get("ablation"), cfg.get("sweep_name")
        return (run_facts(cfg), None if ablation is None else str(ablation), None if sweep is None else str(sweep),
                cell_identity(cfg))
    except (AttributeError, TypeError, ValueError) as err:
        raise TableError(f"{path} is not a run config ({type(err).__name__}: {err})") from None


def load_run(run_dir: Path, naming: JobNaming | None = None) -> Run:
    """Read one run dir: its status (from the lifecycle), metrics, error and the facts of its config.

    A run whose config cannot be trusted (unreadable, or not the config its run.json was written for) has
    no facts: no cell can hold it, and the table lists it apart. A sound config with a damaged record puts
    the run, ``unreadable``, in its cell. Its ``.hydra/overrides.yaml`` is checked against its config and,
    where its sweep names job dirs after their overrides (``naming``), its dir name (`read_overrides`); one
    that disagrees costs the run nothing but its place by those overrides (`Run.overrides_problem`).
    """
    run, cfg = _read_run(run_dir)
    try:  # an unreadable config: the overrides, unchecked, are all that can place the run at its grid point
        overrides = read_overrides(run_dir, cfg, naming) if cfg is not None else read_overrides(run_dir)
    except TableError as err:
        return dataclasses.replace(run, overrides_problem=str(err))
    return dataclasses.replace(run, overrides=None if overrides is None else tuple(overrides))


def _read_run(run_dir: Path) -> tuple[Run, dict[str, Any] | None]:
    """`load_run` but for the overrides: the run and its config (None when that cannot be read)."""
    shown = _shown(run_dir)
    status = run_status(run_dir)
    problems = [status.problem] if status.state == "unreadable" else []
    try:
        path = _config_path(run_dir, status.state)
        cfg = read_config(path)
        facts, ablation, sweep, identity = _placement(path, cfg)
        if not problems:
            check_record(run_dir, cfg, status.state)
    except TableError as err:
        return Run(shown, "unreadable", {}, {}, "; ".join([*problems, str(err)])), None
    if problems:
        return Run(shown, "unreadable", facts, {}, problems[0], ablation, sweep, identity), cfg
    if status.state == "finished":
        values = status.metrics
        null = tuple(sorted(k for k, v in values.items()
                            if v is None or (isinstance(v, float) and not math.isfinite(v))))
        numbers = {k: float(v) for k, v in values.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        partial = partial_run(values)  # a limited training or test (debug): a smoke run, not a result
        if partial:
            return Run(shown, "no result", facts, {}, f"{partial}; rerun without the limit", ablation, sweep,
                       identity), cfg
        # the test-set files must be this config's results: its identity hash, as eval.py writes it (and as
        # run.json records it, checked above)
        tested, testsets, testset_problems = read_testsets(run_dir, identity_hash(identity_config(cfg)),
                                                           run_length(cfg), run_data_config(cfg), values)
        env = {key: values.get(key) for key in ENV_KEYS if key in values}
        data = values.get("data/files")
        return Run(shown, "ok", facts, numbers | tested, "", ablation, sweep, identity, null, testsets,
                   testset_problems, registered_snapshot(run_dir), env,
                   data if isinstance(data, str) else None), cfg
    if status.state == "failed":
        return Run(shown, "failed", facts, {}, status.error, ablation, sweep, identity), cfg
    if status.state == "unfinished":
        return Run(shown, "unfinished", facts, {}, _unfinished_why(run_dir), ablation, sweep, identity), cfg
    return Run(shown, status.state, facts, {}, _not_ended(run_dir, status), ablation, sweep, identity), cfg


def _unfinished_why(run_dir: Path) -> str:
    """Why a run dir with a config but neither run.json nor metrics.json holds no result."""
    swept = sweep_dir_of(run_dir)
    if swept is not None and is_archive(swept):  # archive_runs copies each job's records whole: one cut short
        return (f"no {RUN_RECORD} or {METRICS} in the archive's copy of it (an archive copy cut short?): run"
                " archive_runs on its sweep again")
    return f"no {RUN_RECORD} or {METRICS}: it stopped before it wrote either"


def _normalised(overrides: Iterable[str]) -> frozenset[str]:
    # a job's overrides.yaml escapes interpolations (``$\{...\}``), multirun.yaml does not
    return frozenset(str(o).replace("\\{", "{").replace("\\}", "}") for o in overrides)


def grid_files(sweep_dir: Path) -> list[Path]:
    """``multirun.yaml`` (the latest launch) and the earlier launches' grids that train.py kept before Hydra
    replaced it (``multirun.<n>.yaml``, `lifecycle.cli.keep_earlier_grid`), oldest first; then an optuna sweep's
    record of its trials (`lifecycle.sweeper.TRIALS_FILE`), where it has one."""
    earlier = sorted((p for p in sweep_dir.glob("multirun.*.yaml") if p.name.split(".")[1].isdigit()),
                     key=lambda p: int(p.name.split(".")[1]))
    trials = sweep_dir / TRIALS_FILE
    return [*earlier, sweep_dir / "multirun.yaml", *([trials] if entry_exists(trials) else [])]


def expected_jobs(sweep_dir: Path) -> list[list[str]]:
    """The override lists of every job that a launch of the sweep in ``sweep_dir`` asked for: the union of
    its grids (`grid_files`), each job once, in launch order.

    Expands ``hydra.sweeper.params`` plus the command-line overrides the way Hydra's basic sweeper
    does; other sweepers (optuna) have no fixed grid, so nothing is expected of them.
    """
    jobs: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    for path in grid_files(sweep_dir):
        try:
            launched = _launch_jobs(path)
        except TableError as err:
            err.path = path  # the grid file that is damaged: `_sweep_runs` lists it
            raise
        for job in launched:
            if _normalised(job) not in seen:
                seen.add(_normalised(job))
                jobs.append(job)
    return jobs


def _launch_jobs(path: Path) -> list[list[str]]:
    """The jobs of one launch's saved grid (a ``multirun.yaml``), or the trials an optuna sweep launched."""
    saved = _yaml(path)
    if path.name == TRIALS_FILE:
        return [overrides for _, overrides in _trials(path, saved)]
    hydra = saved.get("hydra") if isinstance(saved, dict) else None
    sweeper = hydra.get("sweeper") if isinstance(hydra, dict) else None
    if not isinstance(sweeper, dict):
        raise TableError(f"{path} is damaged: it has no hydra.sweeper block")
    if not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return []
    params = sweeper.get("params") or {}
    overrides = hydra.get("overrides") or {}
    task = (overrides.get("task") or []) if isinstance(overrides, dict) else None
    if not isinstance(params, dict) or not isinstance(task, list):
        raise TableError(f"{path} is damaged: hydra.sweeper.params or hydra.overrides.task is not what Hydra writes")
    try:
        return sweep_grid([f"{k}={v}" for k, v in params.items()] + [str(o) for o in task])
    except Exception as err:  # Hydra's parse errors have no common base class
        raise TableError(f"{path} is damaged: {str(err).splitlines()[0]}") from None


def _trials(path: Path, saved: Any) -> list[tuple[int, list[str]]]:
    """``(job number, overrides)`` of each trial in an optuna sweep's `TRIALS_FILE` (read as ``saved``)."""
    trials = saved.get("trials") if isinstance(saved, dict) else None
    if not isinstance(trials, dict) or not all(
            isinstance(num, int) and isinstance(job, list) and all(isinstance(o, str) for o in job)
            for num, job in trials.items()):
        raise TableError(f"{path} is damaged: not the record of an optuna sweep's trials (trials: {{<number>:"
                         " [<override>, ...]}})")
    return sorted(trials.items())


def _resolved_where_possible(cfg: DictConfig) -> dict[str, Any]:
    """``cfg`` as a dict, each top-level key resolved unless it needs a running Hydra job (run dir, paths).

    Sweep rows are interpolations (``${rows.${row}.ape}``), so labels need resolving; the run-dir keys
    cannot be resolved outside a job and stay as written.
    """
    raw = OmegaConf.to_container(cfg, resolve=False)
    resolved: dict[str, Any] = {}
    for key in cfg:
        try:
            value = cfg[key]
            resolved[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        except Exception:  # any resolver failure leaves the key as written
            resolved[key] = raw[key]
    return resolved



def _grid_point(overrides: list[str]) -> dict[str, Any]:
    """The config of a grid point, composed from its overrides (``{}`` when it does not compose)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    config_dir = Path(__file__).resolve().parents[1] / "configs"
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(config_dir), version_base="1.3"):
            cfg = compose("train", overrides=[o for o in overrides if not o.startswith("hydra")],
                          return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)  # `${hydra:runtime.choices...}` labels (the default run name)
        with open_dict(cfg):
            del cfg["hydra"]
        return _resolved_where_possible(cfg)
    except Exception:  # a grid point that does not even compose: still listed, with what is known
        return {}
    finally:
        GlobalHydra.instance().clear()


def _missing_run(sweep_dir: Path, overrides: list[str], why: str) -> Run:
    """A grid point with no run dir; its facts come from composing the job's config, once for all the seeds of
    one design (a grid of 29 rows x 12 seeds composes 29 configs, not 348): the seed is the only fact it sets."""
    seeds = [o for o in overrides if re.fullmatch(r"seed=\d+", o)]
    seed = seeds[0] if len(seeds) == 1 else None
    cached, ablation, sweep = _grid_point_facts(tuple(o for o in overrides if o != seed))
    facts = dict(cached)  # each run its own copy of the cached facts
    if seed is not None and "seed" in facts:
        facts["seed"] = int(seed.split("=", 1)[1])
    return Run(f"{_shown(sweep_dir)}/[{','.join(overrides)}]", "missing", facts, {}, why, ablation, sweep)


@functools.lru_cache(maxsize=4096)
def _grid_point_facts(overrides: tuple[str, ...]) -> tuple[dict[str, Any], Any, Any]:
    """``(run_facts, ablation, sweep_name)`` of the grid point ``overrides`` (`_grid_point`), cached: a caller copies
    the facts before changing them."""
    container = _grid_point(list(overrides))
    return run_facts(container), container.get("ablation"), container.get("sweep_name")


def _placed(run: Run, overrides: list[str]) -> Run:
    """An unreadable run, put in the cell of its grid point (composed from its overrides) when it composes."""
    container = _grid_point(overrides)
    if not container:
        return run
    return dataclasses.replace(run, facts=run_facts(container), ablation=container.get("ablation"),
                               sweep=container.get("sweep_name"), identity=None)


def run_dirs(root: Path) -> list[Path]:
    """The run dirs under ``root``: dirs with a ``config.yaml`` or ``.hydra/config.yaml``, outside checkpoints
    folders below ``root`` (a ``checkpoints`` folder above it, in the path given, hides nothing), hidden ones
    included. The one run discovery of make_tables, archive_runs and evaluate_testsets."""
    found = entries_named(root, CONFIG, f"{HYDRA_DIR}/{CONFIG}", leaf=is_run_dir)  # unreadable: one line, never skipped
    candidates = {p.parent for p in found if p.parent.name != HYDRA_DIR}
    candidates |= {p.parent.parent for p in found if p.parent.name == HYDRA_DIR}
    return sorted(d for d in candidates if CHECKPOINTS not in d.relative_to(root).parts)


def _sweep_runs(sweep_dir: Path, found: list[Path], loaded: dict[Path, Run], naming: JobNaming | None) -> list[Run]:
    """The grid points of ``sweep_dir`` without a run dir (``missing``), plus the unreadable runs of the sweep
    placed by their grid point; a damaged grid file (``multirun.yaml``, an optuna sweep's trials) is itself listed,
    as its grid is unknown.

    A run is matched to its grid point by its overrides (`read_overrides`, checked by `load_run`); one whose
    overrides cannot be used (damaged, absent, or not the run's) or name no grid point of the sweep (a job of
    another sweep, with settings of its own, put here) fills the grid point its own config is
    (`_grid_point_of`): a run that is there and counted is never reported missing."""
    try:
        jobs = expected_jobs(sweep_dir)
    except TableError as err:
        damaged = getattr(err, "path", sweep_dir / "multirun.yaml")
        return [Run(_shown(damaged), "unreadable", {}, {},
                    f"{err}; the grid of {sweep_dir} is unknown, so its runs that never started are not listed (its"
                    " runs that are there are counted)")]
    grid = {_normalised(job) for job in jobs}
    done: Counter[frozenset[str]] = Counter()
    damaged: list[str] = []
    by_config: list[Path] = []
    for run_dir in found:
        if not run_dir.is_relative_to(sweep_dir):
            continue
        run = loaded[run_dir]
        if run.overrides is not None and _normalised(run.overrides) in grid:
            done[_normalised(run.overrides)] += 1
            if not run.facts:
                loaded[run_dir] = _placed(run, list(run.overrides))
        elif run.facts:  # no overrides, or ones of no grid point (a job of another sweep put here): by its config
            by_config.append(run_dir)
        elif run.overrides_problem:
            damaged.append(run.overrides_problem)
    left: list[list[str]] = []
    for job in jobs:
        key = _normalised(job)
        if done[key] > 0:
            done[key] -= 1
        else:
            left.append(job)
    for run_dir in by_config:
        job = _grid_point_of(run_dir, left, naming)
        if job is not None:
            left.remove(job)
    why = "no run dir" + (f" (or its run dir's {OVERRIDES} is damaged: {'; '.join(damaged)})" if damaged else "")
    numbers: dict[frozenset[str], int] = {}
    try:  # numbered job dirs (Hydra's default subdir): a job's dir is its place in the latest launch
        saved = _yaml(sweep_dir / "multirun.yaml")
        subdir = ((saved.get("hydra") or {}).get("sweep") or {}).get("subdir") if isinstance(saved, dict) else None
        if str(subdir).replace(" ", "") == "${hydra.job.num}":
            numbers = {_normalised(job): i for i, job in enumerate(_launch_jobs(sweep_dir / "multirun.yaml"))}
            if entry_exists(sweep_dir / TRIALS_FILE):  # an optuna sweep's trials, numbered as launched
                numbers |= {_normalised(job): num for num, job in _trials(sweep_dir / TRIALS_FILE,
                                                                        _yaml(sweep_dir / TRIALS_FILE))}
    except (TableError, AttributeError):
        numbers = {}
    return [_missing_run(sweep_dir, job, why + (_job_dir_note(sweep_dir / str(numbers[key]))
                                               if (key := _normalised(job)) in numbers else "")) for job in left]


def _job_dir_note(job_dir: Path) -> str:
    """Where a job that has no run would have its dir, and why that dir holds no run where it is a link (a loop, or
    a link to a run elsewhere)."""
    loop = symlink_loop(job_dir)
    if loop is not None:
        return f" (its dir {job_dir} is a symlink loop: {loop} leads back to itself)"
    if job_dir.is_symlink():  # never followed: the run it leads to is not the job's
        return f" (its dir {job_dir} is a symlink to {os.readlink(job_dir)}, which is never read as the job's run)"
    return f" (its dir would be {_shown(job_dir)})"


def _grid_point_of(run_dir: Path, jobs: list[list[str]], naming: JobNaming | None) -> list[str] | None:
    """The job of ``jobs`` whose overrides the run's own config holds (`override_disagreement`), the one that
    names the run's dir first where the sweep names dirs after overrides; None when there is none."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        cfg = read_config(_config_path(run_dir, ""))
    except TableError:
        return None
    parser = OverridesParser.create()
    held = []
    for job in jobs:
        parsed = parser.parse_overrides(list(_normalised(job)))
        if not override_disagreement(parsed, cfg):
            if naming is not None and naming.dirname(parsed) == run_dir.name:
                return job
            held.append(job)
    return held[0] if held else None


def collect(paths: Iterable[str | Path]) -> list[Run]:
    """Every run under ``paths`` plus a ``missing`` entry per grid point of a sweep with no run dir.

    A run dir or sweep dir reached twice (a path given twice, a run of a sweep given beside it, a link to either)
    is listed once, under the path it was first reached by: the same dir is compared by its real path. A sweep's
    grid is matched against all of its run dirs, also those listed already through another path. A path that
    holds no run dir or sweep is refused (`TableError`), as a mistake."""
    paths = list(paths)
    runs: list[Run] = []
    listed: set[str] = set()  # the real paths of the run dirs and sweep dirs listed
    for root in map(Path, paths):
        if not root.exists():  # missing, a dangling link or a link loop: named as what it is
            raise TableError(f"{str(root)!r} {absent_folder(root)}; give run dirs or sweep dirs (runs/sweeps/<name>)")
        if not root.is_dir():
            raise TableError(f"{str(root)!r} is a file, not a folder; give run dirs or sweep dirs"
                             " (runs/sweeps/<name>)")
        found = run_dirs(root)
        multiruns = entries_named(root, "multirun.yaml", leaf=is_run_dir)
        if not found and not multiruns:  # a typo or the wrong folder: never dropped beside the paths that hold runs
            raise TableError(f"{str(root)!r} holds no run dir or sweep (no config.yaml or multirun.yaml under it);"
                             " give run dirs or sweep dirs (runs/sweeps/<name>)")
        namings = {multirun.parent: job_naming(multirun.parent) for multirun in multiruns
                   if os.path.realpath(multirun.parent) not in listed}
        new: list[Path] = []
        for run_dir in found:
            if (real := os.path.realpath(run_dir)) not in listed:
                listed.add(real)
                new.append(run_dir)
        listed.update(os.path.realpath(sweep_dir) for sweep_dir in namings)
        # the runs of a sweep first listed here are matched to its grid with the sweep's runs listed before
        grid_runs = [d for d in found if d in new or any(d.is_relative_to(sweep_dir) for sweep_dir in namings)]
        loaded = {d: load_run(d, namings.get(d.parent)) for d in grid_runs}
        missing = [run for sweep_dir, naming in namings.items()
                   for run in _sweep_runs(sweep_dir, grid_runs, loaded, naming)]
        runs += [loaded[d] for d in new] + missing
    if not runs:
        raise TableError(f"no runs (no config.yaml) under: {', '.join(map(str, paths))}")
    return runs
