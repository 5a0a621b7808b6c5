"""The command line of train.py and eval.py: checked in one line each before Hydra starts.

Bad group choices, unknown keys, values out of range (`lifecycle.settings`) and a run dir that would
leave the log dir are refused here, before Hydra creates any folder. Errors that surface later are
printed by `report_user_error` as one ``error: ...`` line with exit code 2.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lifecycle.command import SweepDirBefore, command_scope, current
from lifecycle.console import (
    CommandLineError,
    interpolation_loop_line,
    key_that_reads,
    missing_env_line,
    one_line,
    plain_value,
    resolver_error_line,
    root_cause,
    say,
    setting_that_reads,
)
from lifecycle.project import (
    CONFIG_DIR,
    DDP_WORKER_CONFIG,
    DDP_WORKER_FOLDER_PREFIX,
    SCRIPTS,
    USAGE,
    group_options,
    is_config_group,
    root_defaults,
    root_groups,
)
from storage.files import symlink_loop

PATH_BYTES = 3900  # PATH_MAX is 4096 on Linux, less room for checkpoints/<file>
NAME_BYTES = 200  # one path component of a run dir (file systems allow 255 bytes)
NAME_MAX = 255  # one path component (a folder or file name), in bytes, on Linux's file systems


def _refuse_other_scripts_group(group: str, arg: str, config_name: str) -> None:
    """A group of the other entry point (``train.py testset=...``): say whose it is, not Hydra's "use +group"
    (an added group would be refused as an unknown key anyway)."""
    own = root_groups(config_name)
    if "/" in group or group.startswith("hydra") or group in own:
        return
    owner = next((name for name in SCRIPTS if name != config_name and group in root_groups(name)), None)
    if owner is not None:
        choice = arg.lstrip("+~")
        raise CommandLineError(f"{group} is a config group of {SCRIPTS[owner]}, not of {SCRIPTS[config_name]}"
                               f" ({USAGE[owner].format(choice=choice)}); valid groups of {SCRIPTS[config_name]}:"
                               f" {', '.join(own)}")


def check_group_choices(argv: list[str], config_name: str | None = None) -> None:
    """Fail fast, in one line, on ``group=option`` overrides that name a missing option, or (with
    ``config_name``, the script's root config) a group of the other script."""
    for arg in argv:
        match = re.fullmatch(r"[+~]?([a-z_][\w/]*)=(.*)", arg)
        if not match or arg.startswith("hydra."):
            continue
        group, value = match.groups()
        if not is_config_group(group):
            continue
        if config_name in SCRIPTS:
            _refuse_other_scripts_group(group, arg, config_name)
        if value in ("", "null"):
            continue
        options = group_options(group)
        _refuse_option_list(arg, group, options)
        if config_name in SCRIPTS and arg.startswith("+") and not arg.startswith("++") and group in root_defaults(
                config_name):
            default = root_defaults(config_name)[group]
            raise CommandLineError(f"{arg} adds a second {group} choice, but {config_name}.yaml's defaults already hold"
                                   f" one ({group}={'null' if default is None else default}); valid: {arg[1:]}"
                                   " (without '+')")
        if "${" in value:  # an interpolation could name any file (rpe=${oc.env:X}, X=../rpe/irpe_qkv)
            raise CommandLineError(f"{arg}: a group's option is given by its name, not through an interpolation"
                                   f" (the run would be composed and named from text no check has seen); valid:"
                                   f" {group}=<{'|'.join(options)}>")
        for choice in value.split(","):
            if any(ch in choice for ch in "${}*()[]") or choice.startswith(("choice", "range", "glob")):
                continue
            if choice not in options:
                raise CommandLineError(f"{group}={choice!r} is not a config option; valid: {', '.join(options)}")


# Config groups whose options add up: a list picks several, merged in order (Hydra's documented list of recipes;
# each logger option adds its own logger). Every other group takes one option, and a list would keep only the
# last one's values without a word.
LIST_GROUPS = {"experiment": "recipes", "logger": "loggers"}


def _refuse_option_list(arg: str, group: str, options: list[str]) -> None:
    """``group=[a,b]`` (or a sweep over such lists) for a group that takes one option."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep
    from hydra.errors import HydraException

    if group in LIST_GROUPS:
        return
    try:
        value = OverridesParser.create().parse_override(arg).value()
    except HydraException:
        return  # malformed: check_overrides names it
    values = value.list if isinstance(value, ChoiceSweep) else [value]
    given = next((v for v in values if isinstance(v, list)), None)
    if given is not None:
        lists = ", ".join(f"{g}=[...] ({what})" for g, what in LIST_GROUPS.items())
        raise CommandLineError(f"{arg} gives a list of {group} options, but a run takes one {group} option (Hydra"
                               f" would merge them, the last one's values winning); valid: {group}=<one of:"
                               f" {', '.join(options)}>, or -m {group}={','.join(map(str, given))} for a run of"
                               f" each; lists only for {lists}")


def check_deletions(argv: list[str], config_name: str) -> None:
    """``~key`` on a node a run needs: Hydra drops the config group (or value) and every job fails on the
    missing node after its run dir is made (``~trainer`` left a plain dict where the trainer's settings were).
    A group a run may leave out (`REMOVABLE_GROUPS`), or one empty by default, may be deleted, and so may an
    entry of a group that is a set of entries (`ENTRY_GROUPS`: a callback); below the other groups, a mapping
    (``~model.optimizer``) is refused, and a single value is judged by the config's own checks."""
    import yaml

    defaults = root_defaults(config_name)
    root = {k: v for k, v in (yaml.safe_load((CONFIG_DIR / f"{config_name}.yaml").read_text()) or {}).items()
            if k not in ("defaults", "hydra")}
    values: dict[str, str] = {}  # ``~a.b`` of single values: judged against the config composed without them
    for arg in argv:
        deleted = re.fullmatch(r"~([A-Za-z_]\w*)((?:\.[\w-]+)*)(=.*)?", arg)
        if deleted is None:
            continue
        key, below = deleted.group(1), deleted.group(2).lstrip(".")
        if key == "hydra" and below and not below.startswith("sweeper.params."):  # a sweep config's swept key may go
            raise CommandLineError(f"{arg} would delete hydra.{below}, a setting of Hydra's own that it reads for every"
                                   f" run or sweep; valid: hydra.{below}=<value> where a command may set it, or leave"
                                   " it out for the project's value")
        if below:
            _refuse_deleting_a_node(arg, key, below, defaults)
            if key != "hydra":
                values[arg] = f"{key}.{below}"
            continue
        if key in defaults and key not in REMOVABLE_GROUPS and defaults[key] is not None and key != "hydra":
            raise CommandLineError(f"{arg} would leave out the {key} config group, which every run of"
                                   f" {SCRIPTS.get(config_name, config_name)} is built from; valid: {key}=<one of:"
                                   f" {', '.join(group_options(key))}>, or leave it out for the default"
                                   f" ({key}={defaults[key]})")
        if root.get(key) is not None:
            raise CommandLineError(f"{arg} would delete {key}, which every run of"
                                   f" {SCRIPTS.get(config_name, config_name)} reads; valid: {key}=<value>, or leave"
                                   f" it out for the default ({key}={root[key]})")
    if values:
        _refuse_deleting_a_value(values, [a for a in argv if a not in values], config_name)


def _refuse_deleting_a_value(values: dict[str, str], others: list[str], config_name: str) -> None:
    """``~a.b`` (``{override: key}`` in ``values``) on a value a run cannot do without, judged on the config
    composed with the ``others`` overrides and not the deletions: a value another one reads (``hydra.run.dir``
    reads ``${paths.log_dir}``), one whose default follows other settings (a checkpoint ``dirpath`` inside the
    run dir: Hydra's delete resolves it, and fails outside a run), an argument the ``_target_`` it is given to
    has no default for (``data.root``), or one of a node without ``_target_``, which the code reads by name; and
    an argument with a default of its own (``~trainer.max_epochs``: Lightning's 1000 epochs), which would train
    with a value the run's config.yaml never holds. A value is changed by giving it (``key=<value>``)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lifecycle.settings import REQUIRED_ENTRIES

    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            composed = compose(config_name, overrides=_first_of_sweeps(others), return_hydra_config=True)
        plain = OmegaConf.to_container(composed, resolve=False)
    except Exception:  # noqa: BLE001 - another override is bad: the full check composes again and names it
        return
    finally:
        GlobalHydra.instance().clear()
    script = SCRIPTS.get(config_name, config_name)
    for arg, key in values.items():
        parts = key.split(".")
        default = plain_value(plain, key)
        if default is None or isinstance(default, dict):
            continue  # null already (Hydra's own message says so), absent, or a node (`_refuse_deleting_a_node`)
        why = _why_a_run_needs(plain, parts, script)
        whole = ".".join(parts[:2])
        entry = (f", or ~{whole} to leave out the whole {parts[0]} entry"
                 if parts[0] in ENTRY_GROUPS and len(parts) > 2 and whole not in REQUIRED_ENTRIES else "")
        raise CommandLineError(f"{arg} would delete {key}, {why}; valid: {key}=<value>{entry}, or leave it out for"
                               f" the default ({key}={default})")


def _why_a_run_needs(plain: dict[str, Any], parts: list[str], script: str) -> str:
    """Why a run cannot do without the value at ``parts`` of the composed config ``plain`` (unresolved): every
    value is either read by the run or, deleted, leaves a code default the record does not hold."""
    # ${a}, ${a.b}, ... ${a.b.c.d}: an interpolation of the value, of a node holding it, or of a value inside it
    inside = "".join(rf"(?:\.{re.escape(p)}" for p in parts[1:]) + r"(?:\.[\w.-]+)?" + ")?" * (len(parts) - 1)
    reads = re.compile(r"\$\{\s*" + re.escape(parts[0]) + inside + r"\s*\}")
    others = copy.deepcopy(plain)
    holders = [plain_value(plain, ".".join(parts[:i])) for i in range(len(parts))]  # the mappings above the value
    plain_value(others, ".".join(parts[:-1])).pop(parts[-1])  # the value's own text does not count as a reader
    reader = key_that_reads(others, reads)
    if reader is not None:
        return f"which {reader} reads"
    holder_at = next((i for i in range(len(parts) - 1, 0, -1)
                      if isinstance(holders[i], dict) and "_target_" in holders[i]), None)
    if holder_at == len(parts) - 1:  # an argument of the target itself (not of a plain mapping given to it)
        needed = _required_argument(str(holders[-1]["_target_"]), parts[-1])
        if needed is not None:
            return needed
    default = plain_value(plain, ".".join(parts))
    if isinstance(default, str) and "${" in default:
        return f"whose default is wired to other settings ({default}), so the run relies on it"
    if holder_at is None:
        return f"which every run of {script} reads"
    # any other value: the code's own default would apply, which the run's config.yaml never holds, so the record
    # would not say what was trained (a model's APE, a batch size, Lightning's 1000 epochs)
    return ("a setting the run's record must hold (deleted, the code's own default applies, which the record does"
            " not hold)")


def _required_argument(target: str, name: str) -> str | None:
    """``which <target> needs ...`` when the class or function ``target`` takes ``name`` with no default."""
    import inspect

    from hydra._internal.utils import _locate

    try:
        parameter = inspect.signature(_locate(target)).parameters.get(name)
    except Exception:  # noqa: BLE001 - a target that cannot be imported here is the build check's to report
        return None
    if parameter is None or parameter.default is not inspect.Parameter.empty:
        return None
    return f"which {target} needs (it has no default of its own)"


# Groups whose node is a set of entries the job goes through one by one: an entry may be left out (~callbacks.early)
ENTRY_GROUPS = ("callbacks", "logger")


def _refuse_deleting_a_node(arg: str, group: str, below: str, defaults: dict[str, Any]) -> None:
    """``~group.a.b`` where ``a.b`` is a mapping in one of the group's options (``~model.optimizer``): the node
    its settings build is gone, and the job fails on it after the run dir is made."""
    if group not in defaults or group in ENTRY_GROUPS or group.startswith("hydra") or not is_config_group(group):
        return

    def node(option: str) -> Any:
        value: Any = _option_tree(group, option)
        for part in below.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    if any(isinstance(node(o), dict) for o in group_options(group)):
        raise CommandLineError(f"{arg} would delete the node {group}.{below}, which the {group} is built from; valid:"
                               f" set its keys ({group}.{below}.<key>=...), or {group}.{below}=null where the"
                               f" {group} takes none")


def normalize_overrides(argv: list[str]) -> list[str]:
    """``+a.b=v`` on a key the config already declares is Hydra's "already at" error; on a dotted key
    ``+`` means add-or-set (``++``), so commands such as ``+trainer.limit_train_batches=3`` keep working."""
    normalized = []
    for arg in argv:
        if re.match(r"\+[A-Za-z_][\w-]*(\.[\w-]+)+=", arg):
            current().typed[f"+{arg}"] = arg
            arg = f"+{arg}"
        normalized.append(arg)
    return normalized


def literal(value: str) -> str:
    """``value`` as an OmegaConf string that reads back as exactly ``value``: every ``${`` escaped (with the
    backslashes before it doubled), so that a path such as ``runs/${task_name}x`` is never interpolated."""
    return re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", value)


def multirun_flag_first(argv: list[str]) -> list[str]:
    """``-m``/``--multirun`` moved before the overrides: Hydra's parser takes its flags only there, and
    ``train.py a=1 -m b=2,3`` would otherwise print its usage and stop."""
    flags = [arg for arg in argv if arg in ("-m", "--multirun")]
    return flags + [arg for arg in argv if arg not in ("-m", "--multirun")]


def run_name_source(cfg: DictConfig) -> str:
    """Where ``run_name`` came from when its value reads other keys (its default ``${name}/${now:...}``): the
    keys it reads with their values, e.g. `` (from name='x', run_name: ${name}/${now:%Y-%m-%d_%H-%M-%S})``, so that a
    refusal of run_name names what the user gave (``name=``); "" where run_name is a value of its own."""
    try:
        raw = cfg._get_node("run_name")._value() if "run_name" in cfg else None
    except (OmegaConfBaseException, AttributeError):
        return ""
    if not isinstance(raw, str) or "${" not in raw:
        return ""
    read = [f"{key}={OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)!r}"
            for key in dict.fromkeys(re.findall(r"\$\{([A-Za-z_][\w.]*)\}", raw))]
    return f" (from {', '.join(read)}; run_name: {raw})" if read else f" (run_name: {raw})"


def check_run_location(run_name: Any, log_dir: Any, source: str = "") -> None:
    """A run dir is ``<log_dir>/<run_name>``: ``run_name`` is a relative path of plain components inside it.
    ``source``: where run_name came from where the user did not give it (`run_name_source`), in every refusal.

    ``..`` would leave the log dir (and rewrite whatever run lies there), an empty name would make the
    log dir itself a run dir, and a component longer than the file system allows fails only later. The run
    dir lies in no sweep dir (the sweep's tables and archives would count it as one of its jobs), is no link
    itself, and no link inside it (to a folder or a file) leads out of it (the run would write through the link).
    """
    from storage.destinations import hidden_character

    name = "" if run_name is None else str(run_name)
    given = f"run_name={name!r}{source}"
    rule = (f"valid: a relative path of names of 1-{NAME_BYTES} bytes, without '.', '..' or empty parts, "
            "spaces at a part's start or end, or control and format characters (e.g. run_name=deit_s_irpe_k or "
            "run_name=sweep/job1)")
    parts = name.split("/")
    # a newline, tab or a right-to-left override in a folder name makes every listing and log line lie; a
    # name of spaces (or one ending in a space) is a folder that looks empty or like another run's
    hidden = hidden_character(name) is not None or any(p != p.strip() for p in parts)
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or hidden:
        raise CommandLineError(f"{given} is not a run name; {rule}")
    refuse_dollar("run_name", name)
    refuse_dollar("paths.log_dir", log_dir)
    too_long = next((p for p in parts if len(p.encode()) > NAME_BYTES), None)
    if too_long is not None:
        raise CommandLineError(f"run_name{source} has a part of {len(too_long.encode())} bytes ({too_long[:40]}...);"
                               f" {rule}")
    root = Path(str(log_dir))
    from storage.files import symlink_loop

    loop = symlink_loop(Path(os.path.abspath(root)))
    if loop is not None:  # named here: every later look inside the run dir would meet the loop first
        raise CommandLineError(f"paths.log_dir={str(log_dir)!r} cannot be used: {loop} is a symlink loop (its links"
                               " lead back to themselves); valid: a folder whose path has no link loop")
    whole = len(os.fsencode(os.path.abspath(root.joinpath(*parts))))
    if whole > PATH_BYTES:  # the file system's limit on a whole path, with room for the run's own files
        raise CommandLineError(f"run_name{source} makes a run dir path of {whole} bytes under paths.log_dir, more than"
                               f" {PATH_BYTES}; {rule}")
    for folder in [root, *(root.joinpath(*parts[:i]) for i in range(1, len(parts)))]:
        if folder.exists() and not folder.is_dir():
            raise CommandLineError(f"paths.log_dir={str(log_dir)!r}: {folder} is a file, where the run dir's folder "
                                   "belongs; valid: a folder (or a path that does not exist yet)")
    absolute = Path(os.path.abspath(root))
    refuse_unnormalised_names(Path(absolute.anchor), absolute.parts[1:], f"paths.log_dir={str(log_dir)!r}")
    refuse_unnormalised_names(absolute, parts, given)
    from storage.destinations import (
        DestinationError,
        check_destination,
        real,
        refuse_dot_dot_after_link,
        sweep_dir_of,
    )

    try:  # run_name has no '..': one after a link is the log dir's, named as the user typed it
        refuse_dot_dot_after_link(root, "paths.log_dir", str(log_dir), lambda physical: check_destination(
            physical.joinpath(*parts), "hydra.run.dir", run_dir=True, trains=True))
    except DestinationError as err:
        raise CommandLineError(str(err)) from None
    run_dir = root.joinpath(*parts)
    if run_dir.is_symlink():  # the run would write through it into a folder recorded under another name
        raise CommandLineError(f"{given}: {run_dir} is a symlink (to {os.readlink(run_dir)}), not a run dir of its"
                               " own, and the run would write its files through it into the folder it leads to;"
                               " valid: another run_name=, or replace the link with the folder it stands for")

    sweep = sweep_dir_of(real(run_dir))
    if sweep is not None:
        raise CommandLineError(f"{given} with paths.log_dir={str(log_dir)!r} puts a single run into the"
                               f" sweep dir {sweep}, whose tables and archives would count it as one of the sweep's"
                               " jobs (its multirun.yaml never named it); valid: a paths.log_dir outside every"
                               " sweep dir (a further job of the sweep: its -m command with the new value)")
    nested = _first_run_inside(run_dir) if run_dir.is_dir() else None
    if nested is not None and nested.is_symlink():
        raise CommandLineError(f"{given}: {nested} inside the run dir is a symlink (to"
                               f" {os.readlink(nested)}) that leads out of it, and the run would write through it"
                               " elsewhere; valid: replace the link with what it stands for (a real folder or file),"
                               " or move it away")
    if nested is not None:
        raise CommandLineError(f"{given}: {run_dir} holds other runs ({nested.relative_to(run_dir)}/); "
                               "valid: a name of its own, e.g. run_name=" + f"{name}/<new name>")


def refuse_dollar(key: str, value: Any) -> None:
    """A folder of a run or a sweep holds no ``$``: Hydra stores the dir it made and reads it back as a config
    value, so ``${`` there is interpolated (a traceback once the dir is made), and a shell expands ``$x`` in
    any command the path is pasted into."""
    text = "" if value is None else str(value)
    if "$" in text:
        raise CommandLineError(f"{key}={text!r} holds '$', which Hydra reads as the start of an interpolation"
                               f" (${{...}}) when it uses the dir it made, and a shell as a variable; valid: a {key}"
                               " without '$'")


def refuse_unnormalised_names(root: Path, parts: Any, given: str) -> None:
    """The run names' Unicode rule (`storage.destinations.refuse_unnormalised_names`) as a command-line error."""
    from storage.destinations import DestinationError
    from storage.destinations import refuse_unnormalised_names as refuse

    try:
        refuse(root, parts, given)
    except DestinationError as err:
        raise CommandLineError(str(err)) from None


def _first_run_inside(folder: Path) -> Path | None:
    """A run dir at any depth below ``folder`` (not ``folder`` itself), or a link below it that leads out of it
    (to a folder or a file: the run would write through it), or None; links are never followed.
    Where ``folder`` is a run dir (a rerun, an extension), its folders that training never reads or writes
    (`NOT_TRAINING_DIRS`: test-set results, plots) are not looked into: one this user may not read (mode 000)
    would otherwise stop a run that needs nothing from it."""
    from lifecycle.records import NOT_TRAINING_DIRS

    skipped = NOT_TRAINING_DIRS if _is_run_dir(folder) else ()
    inside = os.path.realpath(folder)
    for parent, dirs, files in os.walk(folder):
        if parent == str(folder):
            dirs[:] = [name for name in dirs if name not in skipped]
        for name in sorted(dirs + files):
            path = Path(parent) / name
            if path.is_symlink():
                if os.path.commonpath([inside, os.path.realpath(path)]) != inside:
                    return path
                continue  # a link to a folder or file of the run's own (W&B's latest-run): walked as that one
            if name in dirs and _is_run_dir(path):
                return path
    return None


def _is_run_dir(folder: Path) -> bool:
    from storage.destinations import is_run_dir
    from storage.files import guarded

    with guarded(folder, "read"):  # a folder this user may not read: one line naming it, not a traceback
        return is_run_dir(folder)


# How a run's dir is named in a refusal: the settings a user gives for it (Hydra's hydra.run.dir is not one)
RUN_DIR_KEY = "paths.log_dir/run_name"


def prepare_output_dir(path: Any, key: str, data_roots: tuple[Any, ...] = (), make: bool = True) -> None:
    """Check the folder Hydra is about to make for a run (or a sweep), then make it (``make``; else only check
    that the nearest existing folder above it may be written).

    It must be a path of its own: not empty (Hydra would take the working dir, or ``/`` for
    ``${paths.log_dir}/...`` with an empty log dir), not the working dir or one of its parents, and not
    inside another run's dir. Making it here turns a read-only or full disk, or a file in its way, into
    one line instead of Hydra's traceback. Where it may lie is `storage.destinations`' rule (a run dir
    may be itself, a rerun; a sweep dir may not be a run dir; neither lies in a data root of ``data_roots``).
    """
    from storage.destinations import DestinationError, check_destination

    text = "" if path is None else str(path)
    refuse_dollar(key, text)
    folder = Path(os.path.abspath(text)) if text.strip() else None
    loop = symlink_loop(folder) if folder is not None else None
    if loop is not None:
        raise CommandLineError(f"{key}={text!r} cannot be used: {loop} is a symlink loop (its links lead back to"
                               " themselves); valid: a folder whose path has no link loop")
    cwd = Path.cwd().resolve()
    if folder is None or folder == Path(folder.anchor) or Path(os.path.realpath(folder)) in (cwd, *cwd.parents):
        raise CommandLineError(f"{key}={text!r} is not a folder of its own (it would be the working dir, one of "
                               "its parents or /); valid: a path such as runs/<name> (paths.log_dir and run_name "
                               "make one)")
    try:
        # the text as given (relative to the working dir): `check_destination` reads its `..` as the system does
        check_destination(text, key, run_dir=key == RUN_DIR_KEY, data_roots=data_roots, trains=True)
    except DestinationError as err:
        raise CommandLineError(str(err)) from None
    if folder.is_dir():
        return  # an existing run (a rerun may need no write at all) or sweep dir: its job checks what it writes
    refuse_unnormalised_names(Path(folder.anchor), folder.parts[1:], f"{key}={text!r}")
    blocking = next((p for p in (*reversed(folder.parents), folder) if os.path.lexists(p) and not p.is_dir()), None)
    if blocking is not None:
        from storage.files import describe_non_file

        raise CommandLineError(f"{key}={text!r} cannot be made: {blocking} is in its way ("
                               f"{describe_non_file(blocking).removeprefix('it is ')}, where a folder belongs);"
                               " valid: a writable folder")
    if not make:
        from storage.files import writable_folder

        above = next(p for p in folder.parents if p.is_dir())
        if not writable_folder(above):
            raise CommandLineError(f"{key}={text!r} cannot be used: permission denied ({above} is not writable);"
                                   " valid: a writable folder")
        return
    topmost = next(p for p in (*reversed(folder.parents), folder) if not os.path.lexists(p))
    try:
        folder.mkdir(parents=True)
        if key == "hydra.sweep.dir":
            current().sweep_dirs[folder] = SweepDirBefore(made=topmost)
        probe = folder / f".write-check-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise CommandLineError(f"{key}={text!r} cannot be used: {reason} ({err.filename or folder}); valid: a "
                               "writable folder") from None


# What makes a sweep the sweep it is, beside its swept values: the sweeper's own settings (an optuna study's sampler
# and seed, direction, storage, ...) and what names its job dirs. ``n_trials`` (``max_batch_size``: how many jobs
# start at once) is left out: the same study run for more trials draws the same first trials with the same seed,
# whose jobs are found finished, so a relaunch with more trials extends it.
SWEEP_IDENTITY = ("sweeper", "sweep.subdir", "job.config.override_dirname")
SWEEP_EXTENT = ("n_trials", "max_batch_size", "params")  # params: compared as the sweep's values, below


def _identity_settings(hydra: Any) -> dict[str, Any]:
    """``{hydra.<key>: value}`` of the settings in `SWEEP_IDENTITY`, as given (unresolved); ``hydra`` is a sweep's
    ``hydra`` node, composed or as read from its ``multirun.yaml``."""
    plain = OmegaConf.to_container(hydra, resolve=False) if isinstance(hydra, DictConfig) else hydra
    found = {}
    for key in SWEEP_IDENTITY:
        value = plain_value(plain, key)
        if isinstance(value, dict) and key == "sweeper":
            found.update({f"hydra.sweeper.{k}": v for k, v in value.items() if k not in SWEEP_EXTENT})
        else:
            found[f"hydra.{key}"] = value
    return found


def check_sweep_dir_is_this_sweeps(sweep_dir: Path, overrides: list[str], subdir: Any = None,
                                   hydra: Any = None) -> None:
    """A sweep dir holds one sweep: Hydra would replace its ``multirun.yaml`` (the grid the tables read) with
    another sweep's. The same keys again (a requeue, a resumed sweep, one given a further seed) are the same sweep,
    but further values only where the job dirs are named by their overrides (``subdir``, the raw
    ``hydra.sweep.subdir``): numbered ones start at 0 in every launch, where the earlier launch's jobs are.
    A ``multirun.yaml`` that cannot be read as Hydra's grid is refused too (`saved_sweep_grid`). With ``hydra``,
    the launch's ``hydra`` node, the sweep is also its sweeper's settings, its params and its job dir naming
    (`SWEEP_IDENTITY`)."""
    saved = sweep_dir / "multirun.yaml"
    grid = saved_sweep_grid(saved, sweep_dir)
    if grid is None:
        _refuse_runs_of_no_sweep(sweep_dir)
        return
    task = grid["hydra"]["overrides"]["task"]
    made_by = " ".join(map(str, task))
    saved_hydra = grid["hydra"]
    if hydra is not None and isinstance(saved_hydra.get("sweeper"), dict):  # a grid Hydra wrote: it has them all
        then, now = _identity_settings(saved_hydra), _identity_settings(hydra)
        changed = next((k for k in {**then, **now} if then.get(k) != now.get(k)), None)
        if changed is not None:
            raise CommandLineError(
                f"hydra.sweep.dir={str(sweep_dir)!r} holds another sweep: {saved} was made with {changed}="
                f"{then.get(changed)!r}, this launch has {now.get(changed)!r} (another study, or other job dir"
                " names for the same jobs); valid: the same settings again, or a new hydra.sweep.dir")
        task = sweep_overrides(saved_hydra["sweeper"].get("params"), list(map(str, task)))[0]
        overrides = sweep_overrides((hydra.get("sweeper") or {}).get("params"), overrides)[0]
        made_by = " ".join(map(str, task))  # with the sweeper's params: the whole sweep

    def keys(items: list[str]) -> set[str]:  # the keys a sweep sets: new values (e.g. a further seed) extend it
        return {o.split("=", 1)[0].lstrip("+~") for o in items if not o.lstrip("+~").startswith(("hydra.", "hydra/"))}

    if keys(list(map(str, task))) != keys(overrides):
        this = " ".join(o for o in overrides if not o.lstrip("+~").startswith(("hydra.", "hydra/")))
        _refuse_sweep_extension(sweep_dir, saved, list(map(str, task)), overrides)
        raise CommandLineError(f"hydra.sweep.dir={str(sweep_dir)!r} holds another sweep ({saved} was made by "
                               f"{made_by!r}, this launch sweeps {this!r}); valid: the same command again, or a new"
                               " hydra.sweep.dir")

    def values(items: list[str]) -> set[str]:
        return {o.lstrip("+~") for o in items if not o.lstrip("+~").startswith(("hydra.", "hydra/"))}

    if subdir is not None and "job_dirname" not in str(subdir) and values(list(map(str, task))) != values(overrides):
        _refuse_sweep_extension(sweep_dir, saved, list(map(str, task)), overrides)
        raise CommandLineError(
            f"hydra.sweep.dir={str(sweep_dir)!r} holds a sweep made by {made_by!r} whose job dirs are numbered"
            f" (hydra.sweep.subdir={subdir}): this launch's job 0 would be that sweep's job 0, another config;"
            " valid: the same values again, a new hydra.sweep.dir, or job dirs named by their overrides,"
            " hydra.sweep.subdir='${job_dirname:${hydra.job.override_dirname}}' (as configs/sweep/ names them)")


def _refuse_sweep_extension(sweep_dir: Path, saved: Path, task: list[str], overrides: list[str]) -> None:
    """Refuse, naming it as such, a launch that is the sweep of ``saved`` with another schedule length
    (`lifecycle.identity.LENGTH_KEYS` set, changed or dropped, nothing else): it would extend every job, which a
    sweep does not do in place (its multirun.yaml, the grid the tables read, would name the new length before a
    job has trained to it); a run of its own is never put into a sweep dir either."""
    from lifecycle.identity import LENGTH_KEYS

    def split(items: list[str]) -> tuple[set[str], dict[str, str]]:
        rest, length = set(), {}
        for item in items:
            key, _, value = item.lstrip("+~").partition("=")
            if key.startswith(("hydra.", "hydra/")):
                continue
            if key in LENGTH_KEYS:
                length[key] = value
            else:
                rest.add(item.lstrip("+~"))
        return rest, length

    (then, then_length), (now, now_length) = split(task), split(overrides)
    if then != now or then_length == now_length:
        return
    changed = ", ".join(f"{k}: {then_length.get(k, '<default>')} -> {now_length.get(k, '<default>')}"
                        for k in LENGTH_KEYS if then_length.get(k) != now_length.get(k))
    raise CommandLineError(
        f"hydra.sweep.dir={str(sweep_dir)!r} holds this sweep at another length ({changed}; {saved}): a longer"
        " schedule extends each of its runs, which a sweep does not do in place (its multirun.yaml names the grid"
        " the tables read); valid: the sweep's own command again (it stands, or resumes), or the longer sweep in a"
        " new hydra.sweep.dir (its runs trained from scratch)")


def _refuse_runs_of_no_sweep(sweep_dir: Path) -> None:
    """A folder without a sweep's grid that holds single runs (made by ``train.py`` without ``-m``: their
    ``.hydra/hydra.yaml`` says ``mode: RUN``) is no sweep dir: its table would count them as the sweep's jobs, and
    they could no longer be rerun as single runs. A sweep whose grid was lost keeps its jobs' dirs."""
    from storage.destinations import is_run_dir

    def single_run(folder: Path) -> bool:
        try:
            with open(folder / ".hydra" / "hydra.yaml", "rb") as handle:  # Hydra writes it; read as text only
                text = handle.read(2**20).decode(errors="replace")
        except OSError:
            return False
        return re.search(r"(?m)^  mode: RUN\s*$", text) is not None

    try:
        runs = sorted(child.name for child in sweep_dir.iterdir()
                      if child.is_dir() and is_run_dir(child) and single_run(child))
    except (FileNotFoundError, NotADirectoryError):
        return
    if runs:
        shown = ", ".join(runs[:3]) + (f" and {len(runs) - 3} more" if len(runs) > 3 else "")
        raise CommandLineError(f"hydra.sweep.dir={str(sweep_dir)!r} holds runs that are no sweep's jobs ({shown}),"
                               " which the sweep's table would count as its own; valid: a new hydra.sweep.dir (a"
                               " folder of its own for each sweep)")


def saved_sweep_grid(saved: Path, sweep_dir: Path) -> dict[str, Any] | None:
    """The grid ``saved`` (a ``multirun.yaml``, with its ``hydra.overrides.task`` list) that an earlier launch left
    in ``sweep_dir``; None when there is none. One this launch cannot read as Hydra's grid (not a plain file,
    unreadable, not YAML, no task list) is refused in one line naming it: the launch would copy it aside
    (`keep_earlier_grid`) and write its own grid over it, or through a link over another sweep's."""
    import yaml

    from data.bounded_json import JsonBoundsError, read_json_bytes
    from storage.files import describe_non_file, entry_exists, yaml_problem

    if not entry_exists(saved):
        return None
    problem = ""
    if saved.is_symlink() or not saved.is_file():
        problem = describe_non_file(saved)
    else:
        try:
            text = read_json_bytes(saved).decode()  # a regular file of bounded size, as every record
        except JsonBoundsError as err:
            problem = str(err)
        except OSError as err:
            problem = f"unreadable: {err.strerror or type(err).__name__}"
        except UnicodeDecodeError:
            problem = "not text"
        else:
            problem = "empty" if not text.strip() else yaml_problem(text)
            if not problem:
                try:
                    grid = yaml.safe_load(text)
                except yaml.YAMLError as err:
                    problem = f"not valid YAML: {' '.join(str(err).split())[:120]}"
                else:
                    if isinstance(plain_value(grid, "hydra.overrides.task"), list):
                        return grid
                    problem = "not the grid Hydra writes: it has no hydra.overrides.task list"
    raise CommandLineError(f"hydra.sweep.dir={str(sweep_dir)!r} holds {saved}, which is no sweep grid this launch can"
                           f" read ({problem}); a launch would replace it, so nothing was started; valid: repair or"
                           " move it away (it is the grid of the sweep there), or a new hydra.sweep.dir")


def _swept_values(override: Any) -> list[str] | None:
    """The values a sweep override gives, in Hydra's order; ``None`` for an interval (optuna draws them). A
    ``glob`` is matched against the group's options, which Hydra only does when it launches the jobs."""
    from hydra.core.override_parser.types import ValueType
    from hydra.errors import HydraException

    if override.value_type == ValueType.GLOB_CHOICE_SWEEP:
        group = override.get_key_element().lstrip("+~")
        values = override.value().filter(group_options(group, bases=True))
        bases = [v for v in values if v.startswith("_")]
        if bases:
            raise CommandLineError(f"{override.input_line} matches {', '.join(bases)}, a shared base and not a choice;"
                                   " valid: add exclude=_* (glob(*,exclude=_*)), or a glob over"
                                   f" {', '.join(group_options(group))}")
    else:
        try:
            values = list(override.sweep_string_iterator())
        except HydraException:
            return None
    if not values:
        globbed = override.value_type == ValueType.GLOB_CHOICE_SWEEP
        valid = f" (options: {', '.join(group_options(group))})" if globbed else " (range(0,3) is 0, 1, 2)"
        raise CommandLineError(f"{override.input_line} sweeps over no values; valid: a sweep of at least one"
                               f" value{valid}")
    return values


def expand_globs(overrides: list[str]) -> list[str]:
    """``group=glob(...)`` as the choice list it matches (``group=a,b``), the other overrides as given: Hydra
    needs its ConfigLoader to expand a glob, which a sweep's ``multirun.yaml`` read later does not have."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType

    expanded = []
    for text, override in zip(overrides, OverridesParser.create().parse_overrides(overrides), strict=True):
        if override.value_type == ValueType.GLOB_CHOICE_SWEEP:
            text = f"{override.get_key_element()}={','.join(_swept_values(override) or [])}"
        expanded.append(text)
    return expanded


def sweep_grid(arguments: list[str]) -> list[list[str]]:
    """The jobs Hydra's basic sweeper launches for ``arguments`` (``key=a,b`` sweeps), in its order.

    Hydra's own expansion, so the grid can never drift from what ``-m`` runs. It is private Hydra API
    (stable within the hydra-core 1.3 pin of pyproject.toml); this is the one place that calls it (the
    launch check below and the tables' expected jobs).
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(expand_globs(arguments))
    return [list(job) for batch in BasicSweeper.split_arguments(parsed, max_batch_size=None) for job in batch]


def _first_of_sweeps(overrides: list[str]) -> list[str]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    single = []
    for override in OverridesParser.create().parse_overrides(overrides):
        values = _swept_values(override) if override.is_sweep_override() else None
        if values is not None:
            single.append(f"{override.get_key_element()}={values[0]}")
        elif not override.is_sweep_override():
            single.append(override.input_line)
    return single


def _drawn_bounds(override: Any) -> list[str] | None:
    """The two ends of a range the optuna sweeper draws from (``interval(a,b)``, ``range(a,b[,step])``), each a value
    a trial may get: optuna 2.10 draws from an interval with both ends included (``low <= x <= high``), and from
    a range up to and including its stop (``range(1,4)`` is 1, 2, 3, 4), unlike Hydra's basic sweeper. None for
    any other override."""
    from hydra.core.override_parser.types import IntervalSweep, RangeSweep

    sweep = override.value() if override.is_sweep_override() else None
    if isinstance(sweep, IntervalSweep):
        if sweep.start > sweep.end:  # optuna's distribution would refuse it with a traceback, after the sweep dir
            raise CommandLineError(f"{override.input_line}: interval({sweep.start},{sweep.end}) starts above its end;"
                                   f" valid: interval(low,high) with low <= high, e.g. interval({sweep.end},"
                                   f"{sweep.start})")
        return [str(sweep.start), str(sweep.end)]
    if isinstance(sweep, RangeSweep) and not sweep.shuffle and sweep.start is not None and sweep.stop is not None:
        step = sweep.step or 1
        last = sweep.start + step * ((sweep.stop - sweep.start) // step)  # the last step not past the stop
        return [str(sweep.start), str(last)]
    return None


def _swept_lines(overrides: list[str], whole: int = 0,
                 drawn: bool = False) -> list[tuple[str, str, list[str], int | None]]:
    """``(the value as named in an error, its override, command line, the value's index among its key's values)``:
    one line per further value of each swept key, the other keys at their first value. The first ``whole``
    overrides (the sweeper's ``params``, which the first composition does not apply) get a line for their first
    value too; with ``drawn`` (optuna) a range gets its two ends (`_drawn_bounds`), whose index is None."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    firsts = [_first_of_sweeps([o.input_line]) for o in parsed]  # each at its first value ([] for an interval)
    lines = []
    for i, override in enumerate(parsed):
        bounds = _drawn_bounds(override) if drawn else None
        values = bounds or (_swept_values(override) if override.is_sweep_override() else None)
        before, after = [o for first in firsts[:i] for o in first], [o for first in firsts[i + 1:] for o in first]
        first = 0 if i < whole or bounds else 1
        for index, value in enumerate((values or [])[first:], start=first):
            swept = f"{override.get_key_element()}={value}"
            drawn_from = override.input_line.split("=", 1)[1]
            named = f"{swept} (an end of {drawn_from}, which optuna may draw)" if bounds else swept
            lines.append((named, swept, [*before, swept, *after], None if bounds else index))
    return lines


def _job_strides(params: Any, overrides: list[str]) -> dict[str, int]:
    """For each key Hydra's basic sweeper launches (``+seed``, as it keys them), how many job numbers apart two of
    its consecutive values are: the jobs are the product of the values of its ``params`` and then of the command
    line's overrides, a key given in both keeping the params' place with the command line's values
    (`BasicSweeper.split_arguments`). The job of the line for a key's value ``i`` (the others at their first) is
    ``i * stride``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = OmegaConf.to_container(params, resolve=False) if isinstance(params, DictConfig) else params or {}
    counts: dict[str, int] = {}
    for override in OverridesParser.create().parse_overrides([*(f"{k}={v}" for k, v in params.items()), *overrides]):
        values = _swept_values(override) if override.is_sweep_override() else None
        counts[override.get_key_element()] = len(values) if values else 1
    strides, after = {}, 1
    for key in reversed(counts):
        strides[key], after = after, after * counts[key]
    return strides


# Runs the command-line checks of one command, or of several separated by ``--``, and exits (0: each would start),
# making no dir: a script checks the job commands it is to start before it makes a dir or starts a job.
CHECK_FLAG = "--check"


def _each_swept_value(overrides: list[str]) -> list[list[str]]:
    """One command line per further value of each swept key, the other keys at their first value: a value
    that a job would refuse (``-m seed=0,-1``) is found before the first job trains."""
    return [line for _, _, line, _ in _swept_lines(overrides)]


def sweep_overrides(params: Any, overrides: list[str]) -> tuple[list[str], int]:
    """What a sweeper sweeps: its ``params`` (``hydra.sweeper.params``, a sweep config's rows and seeds) as
    overrides, less those the command line gives again (the command line's wins, in Hydra's sweepers), followed by
    the command line's overrides. Returns them and how many came from ``params``."""
    params = OmegaConf.to_container(params, resolve=False) if isinstance(params, DictConfig) else params or {}
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    entries = [f"{k}={v}" for k, v in params.items() if str(k).lstrip("+~") not in given]
    return [*entries, *overrides], len(entries)


# Hydra's own command-line flags (the rest of a command line is overrides)
HYDRA_FLAGS = ("-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "--resolve", "-p", "--package", "-r",
               "--run", "-m", "--multirun", "-sc", "--shell-completion", "-cp", "--config-path", "-cn",
               "--config-name", "-cd", "--config-dir", "-i", "--info", "--experimental-rerun")


# Flags that choose how Hydra runs the task (the rest of a command line, past the flags that print, is overrides)
MODE_FLAGS = ("-m", "--multirun", "-r", "--run")
# Flags that only print (the config, Hydra's help or info) and never run the task: the checks leave them to Hydra.
PRINT_ONLY_FLAGS = ("-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "-i", "--info", "-sc",
                    "--shell-completion")
# Flags that would compose a run from files other than the project's configs/ (a config dir of a run folder, a
# pickled config): a run is only ever composed from configs/ and the command line, whose checks it passes.
FOREIGN_CONFIG_FLAGS = ("-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir",
                        "--experimental-rerun")


# Hydra's flags that take a value (``--config-path x`` or ``--config-path=x``)
VALUE_FLAGS = ("-c", "--cfg", "-p", "--package", "-cp", "--config-path", "-cn", "--config-name", "-cd",
               "--config-dir", "-i", "--info", "--experimental-rerun")


def _flag_values(argv: list[str]) -> dict[str, str]:
    """``{flag: value}`` of the flags in ``argv`` that take one (`VALUE_FLAGS`)."""
    found: dict[str, str] = {}
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if arg.startswith("-") and flag in VALUE_FLAGS:
            found[flag] = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
    return found


def is_ddp_worker(argv: list[str]) -> bool:
    """A DDP worker started by this project's parent run (`lifecycle.job`): its config path is the
    private folder the parent named in the environment, never a run folder."""
    given = _flag_values(argv).get("--config-path")
    expected = os.environ.get(DDP_WORKER_CONFIG)
    return bool(given and expected and os.environ.get("LOCAL_RANK") and given == expected
                and _is_private_worker_folder(expected))


def _is_private_worker_folder(folder: str) -> bool:
    """The parent's private folder: ``rpe-ddp-config-<pid>-<random>`` directly in the temp dir, a real folder of
    this user that only this user may read (mode 0700, as ``tempfile.mkdtemp`` makes it). The environment variable
    alone, copied by hand beside a run dir, would have a "worker" compose a run folder's config."""
    import stat
    import tempfile

    path = Path(folder)
    try:
        info = path.lstat()
    except OSError:
        return False
    return (path.name.startswith(DDP_WORKER_FOLDER_PREFIX) and stat.S_ISDIR(info.st_mode)
            and os.path.realpath(path.parent) == os.path.realpath(tempfile.gettempdir())
            and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700)


def prints_only(argv: list[str]) -> bool:
    """Whether Hydra will only print (``--cfg``, ``--help``, ``--info``) and not run the task."""
    return any(arg.split("=", 1)[0] in PRINT_ONLY_FLAGS for arg in argv)


# Hydra runs one command per invocation: a run, a multirun, printing the config, its info or shell completion
COMMAND_FLAGS = {"-r": "--run", "--run": "--run", "-m": "--multirun", "--multirun": "--multirun", "-c": "--cfg",
                 "--cfg": "--cfg", "-i": "--info", "--info": "--info", "-sc": "--shell-completion",
                 "--shell-completion": "--shell-completion"}


def check_flags(argv: list[str]) -> None:
    """One line for an option Hydra does not have (its parser would print its usage), for two of Hydra's commands
    at once (`COMMAND_FLAGS`: its traceback), and for the options that compose a run from another config folder
    or a pickled config (`FOREIGN_CONFIG_FLAGS`)."""
    worker = is_ddp_worker(argv)
    skip = False
    commands: dict[str, str] = {}
    settings: list[str] = []  # the words that are no flag nor a flag's value
    for arg in argv:
        if skip:
            skip = False
            if not arg.startswith("-"):  # a flag's value (argparse never takes an option for one)
                continue
        if not arg.startswith("-"):
            settings.append(arg)
        if arg in ("-sc", "--shell-completion") and settings:
            raise CommandLineError(f"{arg} installs or removes shell completion and takes no settings ({settings[0]});"
                                   f" valid: python {Path(sys.argv[0]).name} {arg} install=bash (or zsh, fish;"
                                   " uninstall=<shell>)")
        if arg.startswith("-"):
            flag = arg.split("=", 1)[0]
            if flag in COMMAND_FLAGS:
                commands.setdefault(COMMAND_FLAGS[flag], flag)
                if len(commands) > 1:
                    raise CommandLineError(f"{' and '.join(commands.values())} cannot be given together: Hydra runs"
                                           " one of them per command; valid: one of -m/--multirun, -r/--run,"
                                           " --cfg job|hydra|all, --info, --shell-completion")
            if flag not in HYDRA_FLAGS:
                raise CommandLineError(f"{arg} is not an option; valid: -m/--multirun, --cfg job|hydra|all,"
                                       f" --help, --hydra-help, --info, {CHECK_FLAG}; settings are key=value")
            if flag in FOREIGN_CONFIG_FLAGS and not (worker and flag in ("--config-path", "--config-name")):
                raise CommandLineError(f"{flag} is not supported: a run is composed from the project's configs/ and"
                                       " the command line only, so that its checks, records and reruns hold;"
                                       " valid: group=option and key=value settings (experiment=<name> for a"
                                       " recipe of your own in configs/experiment/)")
            skip = flag in VALUE_FLAGS and "=" not in arg
    if "--hydra-help" in argv and settings:
        raise CommandLineError(f"--hydra-help prints Hydra's own help, which takes no settings ({settings[0]}); valid:"
                               f" python {Path(sys.argv[0]).name} --hydra-help, or --help for this script's settings")


def _refuse_sweeps_without_multirun(overrides: list[str]) -> None:
    """A swept value (``a=1,2``, ``range(0,2)``) outside a multirun is Hydra's multi-line error: one line. A
    sweeper, launcher or sweep dir given without a multirun would be ignored without a word: one line too."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for override in OverridesParser.create().parse_overrides(overrides):
        if override.is_sweep_override():
            raise CommandLineError(f"{override.input_line} sweeps over values, which needs a multirun: add -m"
                                   " (train.py -m ...), or give one value")
        key = override.get_key_element().lstrip("+~")
        if re.fullmatch(r"hydra/(sweeper|launcher)|hydra\.(sweeper|launcher|sweep)(\..*)?", key):
            part = re.split(r"[/.]", key)[1]
            raise CommandLineError(f"{override.input_line} sets the {part} of a multirun, and without one a single run"
                                   " starts, which never reads it; valid: add -m (train.py -m ...), or leave it out")


def check_repeated_keys(argv: list[str]) -> None:
    """A key given twice (``seed=1 ... seed=2``) is refused: Hydra would keep the last one without a word,
    and a run named by one value would train with the other."""
    if prints_only(argv) or is_ddp_worker(argv):
        return  # Hydra only prints; or the parent checked the worker's config
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides([a for a in argv if a not in MODE_FLAGS])
    except HydraException:
        return  # a malformed override: check_overrides names it
    seen: dict[str, str] = {}
    for override in parsed:
        key = override.get_key_element().lstrip("+~")
        if key in seen:
            raise CommandLineError(f"{key} is given twice ({seen[key]}, {override.input_line}); Hydra would keep"
                                   " only the last: give each key once")
        seen[key] = override.input_line


def _refuse_intervals(overrides: list[str]) -> None:
    """``interval(a,b)`` is a range to draw from, which only the optuna sweeper does (Hydra's basic sweeper
    fails with a traceback)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType

    for override in OverridesParser.create().parse_overrides(overrides):
        if override.value_type == ValueType.INTERVAL_SWEEP:
            raise CommandLineError(f"{override.input_line} is an interval to draw values from, which only the optuna"
                                   " sweeper does; valid: add hydra/sweeper=optuna_rpe, or list values (a,b,c)")


def _refuse_shuffled_numbered_jobs(overrides: list[str], cfg: DictConfig) -> None:
    """``shuffle(...)`` orders the jobs anew at every launch: where job dirs are numbered, a relaunch (to finish
    the sweep) would pair each dir with another config, and every job would then refuse its dir."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    subdir = str(OmegaConf.to_container(cfg.hydra.sweep, resolve=False)["subdir"])
    if "override_dirname" in subdir or "job_dirname" in subdir:
        return  # dirs named by their values: the order does not matter
    for override in OverridesParser.create().parse_overrides(overrides):
        if override.is_sweep_override() and getattr(override.value(), "shuffle", False):
            raise CommandLineError(f"{override.input_line} orders the jobs anew at every launch, and this sweep's job"
                                   f" dirs are numbered (hydra.sweep.subdir={subdir}), so a relaunch to finish it"
                                   " would pair each dir with another config; valid: the values in order"
                                   " (a,b,c or range(...)), or job dirs named by their overrides,"
                                   " hydra.sweep.subdir='${job_dirname:${hydra.job.override_dirname}}'")


def _check_swept_values(config_name: str, overrides: list[str], cfg: DictConfig) -> None:
    """`check_settings` on each further value of each swept key (`_swept_lines`), those of the sweeper's
    ``params`` (``cfg``'s, a sweep config's or ``hydra.sweeper.params.<key>=...``) too, and for optuna on the two
    ends of each range it draws from."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.config_loader_impl import ConfigLoaderImpl  # private Hydra API (the 1.3 pin)
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from lifecycle.job import check_buildable
    from lifecycle.settings import check_schedule, check_settings, check_value

    sweeper = cfg.hydra.get("sweeper") or {}
    swept, whole = sweep_overrides(sweeper.get("params"), overrides)
    drawn = not str(sweeper.get("_target_", "")).endswith("BasicSweeper")
    base: DictConfig | None = None
    lines = _swept_lines(swept, whole, drawn)
    # each line judged as its job of the basic sweeper, in that job's dir. optuna numbers its trials in the order
    # it draws them: no line is a trial known before it runs, so its lines keep the first job's (0)
    strides = {} if drawn else _job_strides(sweeper.get("params"), overrides)
    of_params = len(_swept_lines(swept[:whole], whole, drawn))  # the lines of the params come first
    if len(lines) > MANY_SWEPT_VALUES:
        say(f"note: checking the sweep's {len(lines)} further values before its first job starts",
            stream=sys.stderr)
    built: Any = None  # what the last check_buildable built from (`_build_inputs`)
    alone: set[str] = set()  # independent keys whose values change nothing else: checked by their type (SCHEMA)
    judged: set[str] = set()  # the independent keys whose first further value was compared with the first's
    parser = OverridesParser.create()
    for n, (named, value, line, index) in enumerate(lines):
        key, _, text = value.partition("=")
        job_num = (index or 0) * strides.get(key, 0)
        if key.lstrip("+~") in alone:  # a plain value of an independent key (Hydra's parser costs ~1 ms a value)
            try:
                check_value(key.lstrip("+~"), _plain_value(text, parser, value))
            except ValueError as err:
                raise CommandLineError(f"the sweep's job with {named}: {one_line(err)}") from None
            continue
        override = parser.parse_overrides([value])[0]
        key = override.key_or_group.lstrip("+~")
        if is_config_group(key):  # another option of a group: composed anew
            GlobalHydra.instance().clear()
            try:
                with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
                    cfg = compose(config_name, overrides=line, return_hydra_config=True)
            except (HydraException, OmegaConfBaseException) as err:  # named with the job it is about
                raise CommandLineError(f"the sweep's job with {named}: {override_error(err, line, None, config_name)}"
                                       ) from None
        else:  # a value: set on the first values' config as Hydra sets an override (composing takes ~0.4 s a value)
            if base is None:
                GlobalHydra.instance().clear()
                with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
                    base = compose(config_name, overrides=_first_of_sweeps(swept), return_hydra_config=True)
            cfg = copy.deepcopy(base)
            ConfigLoaderImpl._apply_overrides_to_config([override], cfg)
        HydraConfig.instance().set_config(cfg)
        if config_name == "train":
            _give_job_dir(cfg, job_num)
        try:
            if config_name == "train":  # a later row (or data root) may replace a choice the first did not
                refuse_replaced_encoding_choice(cfg, line, overrides)
                refuse_replaced_data_choice(cfg, line, overrides)
                if is_config_group(key) and key in RECIPE_GROUPS:
                    refuse_replaced_recipe_choice(line)
            check_settings(cfg, config_name)
            # a job that becomes one of several processes only through a swept value (trainer=ddp_cpu as a
            # value or a sweep config's params) meets its processes through the same rendezvous variables
            refuse_launch_variables(cfg)
            if config_name == "train":
                check_schedule(cfg)
                check_data_root(cfg, sweeping=True)  # a later value's data root: its job would generate there
                inputs = _build_inputs(cfg)
                if n >= of_params and inputs != built:  # each build costs ~0.4 s; the same inputs, the same model
                    check_buildable(cfg)
                    built = inputs
        except ValueError as err:
            text = one_line(err)
            together = _drawn_together(swept, key) if drawn and key.lstrip("+~") not in text else ""
            raise CommandLineError(f"the sweep's job with {named}{together}: {text}") from None
        if key in INDEPENDENT_KEYS and key not in judged and base is not None:  # once a key: its values agree
            judged.add(key)
            if _changed_keys(base, cfg) == {key} and not _data_root_reads_job_dir(cfg, job_num):
                alone.add(key)


def _drawn_together(swept: list[str], key: str) -> str:
    """`` (with a=1, b=x, which optuna may draw together)``: the first values of an optuna sweep's other swept keys,
    which a refusal of ``key``'s value is about as much as that value (optuna draws every key of a trial)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    together = [first for override in OverridesParser.create().parse_overrides(swept)
                if override.is_sweep_override() and override.get_key_element().lstrip("+~") != key.lstrip("+~")
                for first in _first_of_sweeps([override.input_line])]
    return f" (with {', '.join(together)}, which optuna may draw together)" if together else ""


# More further values of a sweep than this: a note says the checks run (each value costs up to a second)
MANY_SWEPT_VALUES = 200
# Settings no other check reads: once one of their values is seen to change nothing else in the resolved config
# (no data root, run dir or model reads it), their other values are checked by their own rule alone, so a sweep
# over thousands of seeds is checked in moments
INDEPENDENT_KEYS = ("seed",)


def _plain_value(text: str, parser: Any, override: str) -> Any:
    """The value of ``override`` (``key=text``): an integer read directly, anything else as Hydra parses it."""
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return parser.parse_overrides([override])[0].value()


def _flat(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of each leaf of a plain mapping (a list is a leaf)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _flat(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], node


def _job_container(cfg: DictConfig, resolve: bool) -> dict[str, Any]:
    """The job's part of a composed config (without Hydra's node) as plain data."""
    return OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"]), resolve=resolve)


def _resolved_job(cfg: DictConfig) -> dict[str, Any]:
    """The job's part of a composed config (without Hydra's node), resolved, as flat ``{dotted key: value}``."""
    return dict(_flat(_job_container(cfg, resolve=True)))


def _data_root_reads_job_dir(cfg: DictConfig, job_num: int) -> bool:
    """Whether the data root of job ``job_num`` (``cfg``, its dir given) lies elsewhere for another job: one read
    from the job's own dir (``${hydra:runtime.output_dir}/..``) is judged job by job, never by its key's type."""
    from hydra.core.hydra_config import HydraConfig

    other = copy.deepcopy(cfg)
    try:
        own = _job_data_root(cfg)[1]  # ${hydra:...} reads the config HydraConfig holds: cfg's, then other's
        _give_job_dir(other, job_num + 1)
        return _job_data_root(other)[1] != own
    except OmegaConfBaseException:
        return True
    finally:
        HydraConfig.instance().set_config(cfg)


def _changed_keys(base: DictConfig, cfg: DictConfig) -> set[str]:
    """The dotted keys whose resolved values differ between two composed configs."""
    try:
        before, after = _resolved_job(base), _resolved_job(cfg)
    except OmegaConfBaseException:
        return {"<unresolvable>"}
    return {k for k in before.keys() | after.keys() if before.get(k, ...) != after.get(k, ...)}


def _build_inputs(cfg: DictConfig) -> Any:
    """What `check_buildable` reads (data, model, rpe, callbacks, trainer), resolved: two configs with equal inputs
    build the same data module and model."""
    try:
        return OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in ("data", "model", "rpe", "callbacks",
                                                                        "trainer") if k in cfg.keys()]),
                                      resolve=True)
    except OmegaConfBaseException:
        return object()  # unresolvable here: never equal, so the build judges it


# What a sweep job's subdir may interpolate: values that are one safe path component whatever the job's settings
# (its number, its id, or `job_dirname` of anything); `${name}` and the like could hold `../..`.
SAFE_SUBDIR_INTERPOLATIONS = re.compile(r"hydra[.:]job\.(num|id)|job_dirname:.*", re.DOTALL)


def _interpolations(text: str) -> tuple[str, list[str]]:
    """``text`` with each top-level ``${...}`` replaced by ``_``, and the insides of those interpolations."""
    skeleton, inside, depth, start = [], [], 0, 0
    i = 0
    while i < len(text):
        if text.startswith("${", i):
            if depth == 0:
                start = i + 2
            depth += 1
            i += 2
            continue
        if text[i] == "}" and depth:
            depth -= 1
            if depth == 0:
                inside.append(text[start:i])
                skeleton.append("_")
            i += 1
            continue
        if depth == 0:
            skeleton.append(text[i])
        i += 1
    return "".join(skeleton), inside


def _check_sweep_subdir(subdir: Any) -> None:
    """A sweep job's dir lies inside the sweep dir: ``hydra.sweep.subdir`` is a relative path without '..',
    whose interpolations are each one safe component (`SAFE_SUBDIR_INTERPOLATIONS`), so that no job's
    settings can move it out once resolved. The job checks its resolved dir again (`lifecycle.job.check_job_dir`)."""
    text = str(subdir)
    skeleton, interpolations = _interpolations(text)
    parts = Path(skeleton).parts
    unsafe = next((i for i in interpolations if not SAFE_SUBDIR_INTERPOLATIONS.fullmatch(i.strip())), None)
    valid = (" valid: a relative path without '..', interpolating only ${hydra.job.num}, ${hydra.job.id} or"
             " ${job_dirname:...} (the default: the job's number)")
    if text.strip() and not parts:  # '.', './.', 'a/..' is refused below: the job's dir would be the sweep dir
        raise CommandLineError(f"hydra.sweep.subdir={text!r} names no folder inside the sweep dir: every job's run dir"
                               f" would be the sweep dir itself;{valid}")
    if "$" in skeleton:
        refuse_dollar("hydra.sweep.subdir", text)
    if not text.strip() or Path(skeleton).is_absolute() or ".." in parts or unsafe is not None:
        why = (f"${{{unsafe}}} may resolve to any path" if unsafe is not None
               else "it is absolute" if Path(skeleton).is_absolute() else "it holds '..'" if ".." in parts
               else "it is empty")
        raise CommandLineError(f"hydra.sweep.subdir={text!r} would put a job's run dir outside the sweep dir ({why});"
                               f"{valid}")


# What a job's subdir may read to be resolved without composing the job: its number, id and override dirname
_JOB_FIELDS = re.compile(r"job_dirname:|hydra\.job\.(num|id|override_dirname)")


def _job_subdirs(cfg: DictConfig, config_name: str, hydra_overrides: list[str], jobs: list[list[str]]) -> list[str]:
    """Each job's ``hydra.sweep.subdir``, resolved as Hydra's basic launcher resolves it (job ``num`` and ``id`` are
    its index). A subdir of the job's number, id and ``hydra.job.override_dirname`` (every config here) is resolved
    on ``cfg`` with Hydra's own dirname function; one that reads other settings composes each job, as Hydra does."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.config_loader_impl import get_overrides_dirname  # private Hydra API (the 1.3 pin)
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import open_dict, read_write

    # ${hydra:job.x} reads the HydraConfig singleton; ${hydra.job.x} reads the node set below: the same field
    template = re.sub(r"\$\{\s*hydra:\s*job\.", "${hydra.job.", str(OmegaConf.to_container(cfg.hydra.sweep,
                                                                                          resolve=False)["subdir"]))
    if all(_JOB_FIELDS.fullmatch(head) for head in re.findall(r"\$\{\s*([\w.]+:?)", template)):
        naming = cfg.hydra.job.config.override_dirname
        parser = OverridesParser.create()
        probe = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))  # a plain copy to write the job into
        probe.hydra.sweep.subdir = template
        subdirs = []
        named = "override_dirname" in template
        parsed: dict[str, Any] = {}  # each override parsed once: a grid repeats them (Hydra's parser: ~1 ms each)
        for num, job in enumerate(jobs):
            probe.hydra.job.num = probe.hydra.job.id = num
            if named:
                for line in job:
                    if line not in parsed:
                        parsed[line] = parser.parse_overrides([line])[0]
                probe.hydra.job.override_dirname = get_overrides_dirname(
                    [parsed[line] for line in job], list(naming.exclude_keys), naming.item_sep, naming.kv_sep)
            subdirs.append(str(probe.hydra.sweep.subdir))
        return subdirs
    subdirs = []
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            for num, job in enumerate(jobs):
                job_cfg = compose(config_name, overrides=[*hydra_overrides, *job], return_hydra_config=True)
                with read_write(job_cfg.hydra), open_dict(job_cfg.hydra):
                    job_cfg.hydra.job.num = job_cfg.hydra.job.id = num
                HydraConfig.instance().set_config(job_cfg)
                subdirs.append(str(job_cfg.hydra.sweep.subdir))
    finally:
        HydraConfig.instance().set_config(cfg)  # the launch's own config, which the checks after this one read
    return subdirs


# The sweepers' counts: (key under hydra.sweeper, may it be null, what it counts)
SWEEPER_COUNTS = (
    ("n_trials", False, "the trials optuna runs"),
    ("n_jobs", False, "the trials optuna starts at once"),
    ("max_batch_size", True, "the jobs the basic sweeper starts at once; null: all"),
)


def _within(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies below it, as written (absolute) or with links resolved."""
    from storage.destinations import real

    def below(a: str, b: str) -> bool:
        return a == b or a.startswith(b.rstrip(os.sep) + os.sep)

    return (below(os.path.normpath(os.path.abspath(path)), os.path.normpath(os.path.abspath(folder)))
            or below(str(real(path)), str(real(folder))))


def _check_temp_dir(cfg: DictConfig, data_roots: list[str], sweeping: bool = False) -> None:
    """The temp dir (``TMPDIR``, also as ``hydra.job.env_set`` gives it), where a run's DDP workers get their private
    config folder and torch and its libraries put their caches, lies outside every run dir and data root: one
    inside another run's dir had those folders written there, and one left behind. Nor may it lie in the run dir
    or sweep dir this command is about to make (``${hydra:runtime.output_dir}``, ``${hydra:sweep.dir}``)."""
    import tempfile

    from storage.destinations import DestinationError, check_destination, real, sweep_dir_of

    own_dir = OmegaConf.select(cfg, "hydra.sweep.dir" if sweeping else "hydra.runtime.output_dir", default=None,
                               throw_on_resolution_failure=False)
    own_dir = str(own_dir) if own_dir is not None and str(own_dir).strip() else None
    env_set = OmegaConf.select(cfg, "hydra.job.env_set", default=None) or {}
    given = [(f"hydra.job.env_set.{name}", str(env_set[name])) for name in ("TMPDIR", "TEMP", "TMP") if name in env_set]
    for what, temp in [*given, ("TMPDIR", tempfile.gettempdir())]:
        try:
            check_destination(temp, what, data_roots=data_roots)
        except DestinationError as err:
            raise CommandLineError(f"{err} (the temp dir, {temp}: set TMPDIR to a folder of its own)") from None
        if own_dir is not None and _within(temp, own_dir):  # this command's own dir, not made yet
            kind, holds = ("sweep dir", "its jobs' files") if sweeping else ("run dir", "the run's own files")
            raise CommandLineError(f"{what}={temp!r} lies in this command's {kind} {own_dir}, which holds"
                                   f" {holds} only, and torch and Lightning write their caches into the temp"
                                   " dir as they start; valid: a folder of its own outside it (e.g. /tmp)")
        sweep = sweep_dir_of(real(temp))
        if sweep is not None:  # its tables would list the folders left there as runs of the sweep
            raise CommandLineError(f"{what}={temp!r} is inside the sweep dir {sweep}, whose folders are its jobs';"
                                   " valid: a folder outside every sweep dir (the temp dir: set TMPDIR to a folder"
                                   " of its own)")


def _check_sweeper_counts(cfg: DictConfig) -> None:
    """The sweeper's counts are integers >= 1: ``max_batch_size=0`` was an AssertionError traceback inside the
    multirun, ``n_jobs=0`` an endless loop of optuna launching no job."""
    sweeper = cfg.hydra.get("sweeper") or {}
    for key, nullable, what in SWEEPER_COUNTS:
        if key not in sweeper:
            continue
        value = sweeper.get(key)
        if value is None and nullable:
            continue
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            null = " or null" if nullable else ""
            raise CommandLineError(f"hydra.sweeper.{key}={value} must be an integer >= 1{null} ({what})")


def _check_launcher_folder(cfg: DictConfig) -> None:
    """A submitit launcher's folder (its pickled jobs and logs) lies inside the sweep dir, as by default
    (``${hydra.sweep.dir}/.submitit/%j``): elsewhere it wrote into another run's dir or a data root, and a
    refused submission left its files there."""
    from storage.destinations import real

    launcher = cfg.hydra.get("launcher") or {}
    if "submitit_folder" not in launcher:
        return
    sweep_dir = os.path.normpath(os.path.abspath(str(cfg.hydra.sweep.dir)))
    real_sweep_dir = str(real(sweep_dir))

    def inside(path: Any) -> bool:  # as written and as the file system resolves it (a link below the sweep dir)
        folder = os.path.normpath(os.path.abspath(str(path)))
        resolved = str(real(folder))
        return (os.path.commonpath([folder, sweep_dir]) == sweep_dir and folder != sweep_dir
                and os.path.commonpath([resolved, real_sweep_dir]) == real_sweep_dir and resolved != real_sweep_dir)

    if not inside(launcher.submitit_folder):
        resolved = real(str(launcher.submitit_folder))
        through = (f" (through a link it is {resolved})" if resolved != Path(os.path.abspath(
            str(launcher.submitit_folder))) else "")
        raise CommandLineError(f"hydra.launcher.submitit_folder={launcher.submitit_folder} is not inside the sweep dir"
                               f" {sweep_dir}{through}: the launcher's files belong to its sweep; valid: leave it out"
                               " (the default is ${hydra.sweep.dir}/.submitit/%j), or a folder inside hydra.sweep.dir")
    # sbatch options that name files or a working dir: the scheduler writes the job's logs wherever they say
    extra = launcher.get("additional_parameters") or {}

    def names(key: Any, option: str, short: str) -> bool:  # sbatch (getopt_long) takes an option's unique prefix
        given = str(key).lstrip("-")
        return given == short or (len(given) >= 2 and option.startswith(given))

    for key in extra:
        if names(key, "chdir", "D"):
            raise CommandLineError(f"hydra.launcher.additional_parameters.{key}={extra[key]} moves the jobs' working"
                                   " dir, from which their paths are resolved; valid: leave it out")
    for key in extra:
        if any(names(key, option, short) for option, short in (("output", "o"), ("error", "e"), ("input", "i"))) \
                and not inside(extra[key]):
            raise CommandLineError(f"hydra.launcher.additional_parameters.{key}={extra[key]} is not inside the sweep"
                                   f" dir {sweep_dir}: the scheduler would write (or read) each job's log there;"
                                   " valid: leave it out (the logs go into the submitit folder), or a path inside"
                                   " hydra.sweep.dir")


def _check_slurm_shape(cfg: DictConfig) -> None:
    """The SLURM launcher asks for the nodes and tasks per node the run's Trainer expects (``trainer.num_nodes``,
    ``trainer.devices``; its defaults are exactly these): another count was submitted, queued and then refused by
    Lightning inside every job, or left processes waiting for tasks that were never asked for."""
    launcher = cfg.hydra.get("launcher") or {}
    if "Slurm" not in str(launcher.get("_target_", "")):
        return
    for key, setting in (("nodes", "trainer.num_nodes"), ("tasks_per_node", "trainer.devices")):
        asked = OmegaConf.select(cfg, f"hydra.launcher.{key}", default=None, throw_on_resolution_failure=False)
        wanted = OmegaConf.select(cfg, setting, default=None, throw_on_resolution_failure=False)
        if isinstance(asked, int) and isinstance(wanted, int) and asked != wanted:
            raise CommandLineError(f"hydra.launcher.{key}={asked} but {setting}={wanted}: every job would start"
                                   f" {asked} {'node' if key == 'nodes' else 'task'}(s) where the run expects"
                                   f" {wanted}, and be refused once scheduled; valid: leave hydra.launcher.{key} out"
                                   f" (it follows {setting}), or set {setting}={asked}")


def _refuse_shared_job_dirs(cfg: DictConfig, overrides: list[str], config_name: str) -> None:
    """Every job of a grid sweep has a run dir of its own, checked before the sweep dir is made.

    A sweep config names each job's dir by its overrides (`job_dirname` of ``hydra.job.override_dirname``), which
    writes ``_`` for every character outside ``[A-Za-z0-9._=,+-]`` and leaves out the keys of
    ``hydra.job.config.override_dirname.exclude_keys`` (trainer, logger, paths, ...): ``data.root=/a_b`` and
    ``data.root=/a/b`` got one dir, and the second job found the first's run finished and never trained. The
    names stay as they are (every archived run dir is named by them); a grid whose names collide is refused.
    Optuna draws its trials as it goes: there is no grid to check, and its subdir must number the trials.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sweeper = cfg.hydra.get("sweeper") or {}
    subdir = str(OmegaConf.to_container(cfg.hydra.sweep, resolve=False)["subdir"])
    if re.search(r"\$\{\s*hydra[.:]\s*job\.(num|id)\s*\}", subdir):
        return  # a dir per job number (the id is the number in a basic sweep): no two jobs share one
    if not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
        raise CommandLineError(f"hydra.sweep.subdir={subdir} gives the trials of {sweeper.get('_target_')} no dir"
                               " of their own: it draws its trials as it goes, and two may share a name; valid:"
                               " a subdir with ${hydra.job.num} (the default)")
    parsed = OverridesParser.create().parse_overrides(overrides)
    params = sweeper.get("params")
    params = OmegaConf.to_container(params, resolve=False) if isinstance(params, DictConfig) else {}
    # Hydra's multirun: the sweeper gets the task overrides, each job is composed with the hydra ones added
    jobs = sweep_grid([f"{k}={v}" for k, v in params.items()] + [o.input_line for o in parsed
                                                                   if not o.is_hydra_override()])
    hydra_overrides = [o.input_line for o in parsed if o.is_hydra_override()]
    earlier = _earlier_launches_jobs(Path(str(cfg.hydra.sweep.dir)))
    first: dict[str, list[str]] = {}
    subdirs = _job_subdirs(cfg, config_name, hydra_overrides, earlier + jobs)
    for n, (job, subdir) in enumerate(zip(earlier + jobs, subdirs, strict=True)):
        other = first.setdefault(subdir, job)
        if set(other) == set(job) or n < len(earlier):
            continue  # the same grid point twice: one run, as asked; earlier launches' jobs are what they are
        one, two = [o for o in other if o not in job], [o for o in job if o not in other]
        keys = {o.split("=", 1)[0].lstrip("+~") for o in one + two}
        excluded = sorted(keys & {str(k) for k in cfg.hydra.job.config.override_dirname.exclude_keys})
        why = (f"{', '.join(excluded)} {'is' if len(excluded) == 1 else 'are'} left out of job dir names"
               " (hydra.job.config.override_dirname.exclude_keys)" if excluded else
               "a job's dir name keeps A-Za-z0-9._=,+- and writes _ for any other character")
        of_earlier = " (an earlier launch's job in this sweep dir)" if any(other is e for e in earlier) else ""
        shared = Path(str(cfg.hydra.sweep.dir)) / subdir
        raise CommandLineError(f"the sweep's jobs with {' '.join(one)}{of_earlier} and with {' '.join(two)} (their"
                               f" other overrides alike) would share one run dir, {shared} ({why}):"
                               " the second would find the first's run and never train; valid: values whose dir"
                               " names differ, or hydra.sweep.subdir='${hydra.job.num}' (a dir per job number)")


def _earlier_launches_jobs(sweep_dir: Path) -> list[list[str]]:
    """The jobs of the grids earlier launches left in ``sweep_dir`` (``multirun.yaml`` and the numbered copies
    `keep_earlier_grid` keeps), each as its overrides, oldest grid first; a grid that cannot be expanded here
    (an optuna study's, a damaged one, which `saved_sweep_grid` names where it matters) adds none."""
    from storage.destinations import SWEEP_GRID

    if not sweep_dir.is_dir():
        return []
    grids = sorted((p for p in sweep_dir.iterdir() if SWEEP_GRID.fullmatch(p.name)),
                   key=lambda p: int(p.name.split(".")[1]) if p.name.count(".") == 2 else 1 << 30)
    jobs: list[list[str]] = []
    for path in grids:
        try:
            grid = saved_sweep_grid(path, sweep_dir)
            params = plain_value(grid, "hydra.sweeper.params")
            swept = [f"{k}={v}" for k, v in params.items()] if isinstance(params, dict) else []
            jobs += sweep_grid(swept + [str(o) for o in plain_value(grid, "hydra.overrides.task")])
        except Exception:  # noqa: BLE001  (see the docstring: a grid not expanded here names no job)
            continue
    return jobs


def _refuse_run_name_in_sweep(overrides: list[str]) -> None:
    """A sweep job's run dir is ``hydra.sweep.dir/<subdir>``, so a ``run_name`` would be ignored without a word."""
    given = next((o for o in overrides if re.match(r"[+~]?run_name=", o)), None)
    if given is not None:
        raise CommandLineError(f"{given} names a single run's dir, which a sweep does not use: its jobs' run dirs are"
                               " hydra.sweep.dir/<hydra.sweep.subdir>; valid: hydra.sweep.dir=... (sweep configs:"
                               " sweep_name=...), or drop -m for one run")


def quoted_override(key: str, value: str) -> str:
    """``key=value`` as an override that Hydra reads back as exactly the string ``value`` (quoted, escaped)."""
    body = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", literal(value))  # backslashes before a quote double
    body = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, body)  # and those before the closing quote
    return f"{key}='{body}'"


def _pin_output_dir(cfg: DictConfig, sweeping: bool) -> dict[str, str]:
    """The run's ``run_name`` and ``paths.log_dir`` (a sweep's ``hydra.sweep.dir``) as this check resolved them, as
    ``{key: override}``.

    The check makes the dir before Hydra starts, and Hydra composes the config again: a ``${now:...}`` reached
    by the dir, directly or through any other key, would then resolve a second later to another dir, leaving
    the checked one empty beside the run. Pinned, the run goes into the dir that was checked. A sweep dir is
    pinned always, and a run's keys whenever they interpolate: a value that reads nothing changing resolves to
    the same text, so pinning it changes nothing.
    """
    if sweeping:
        return {"hydra.sweep.dir": quoted_override("hydra.sweep.dir", str(cfg.hydra.sweep.dir))}
    pins = {}
    if "${" in str(OmegaConf.to_container(cfg.paths, resolve=False).get("log_dir")):
        pins["paths.log_dir"] = quoted_override("paths.log_dir", str(cfg.paths.log_dir))
    if OmegaConf.is_interpolation(cfg, "run_name"):
        pins["run_name"] = quoted_override("run_name", str(cfg.run_name))
    return pins


def with_pins(argv: list[str], pins: dict[str, str]) -> list[str]:
    """``argv`` with the checked output dir's overrides (`_pin_output_dir`) in place of any given for their keys:
    the command line Hydra gets."""
    return [a for a in argv if a.split("=", 1)[0].lstrip("+~") not in pins] + list(pins.values())


def check_overrides(argv: list[str], config_name: str, make: bool = True) -> dict[str, str]:
    """Compose once before Hydra does: a bad key, a value out of range or a bad run location is one line.

    A sweep is checked with the first value of each swept key; intervals (optuna) are left to the sweeper,
    and every job checks its own values again when it starts. Returns the overrides that pin the checked
    output dir for Hydra (`_pin_output_dir`), ``{key: override}``, which replace any given for those keys.
    ``make=False`` (`CHECK_FLAG`) writes nothing: the run or sweep dir is checked, not made, and an earlier grid
    is not kept.
    """
    if prints_only(argv) or is_ddp_worker(argv):
        return {}  # Hydra only prints; or the parent checked the worker's config
    eval_worker = config_name == "eval" and os.environ.get("LOCAL_RANK", "0") != "0"
    if config_name == "eval" and not eval_worker:  # a worker: Lightning adds its parent's run dir
        _refuse_eval_output_dirs(argv)
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException

    multirun = any(arg in ("-m", "--multirun") for arg in argv)
    overrides = [arg for arg in argv if arg not in MODE_FLAGS]
    check_deletions(overrides, config_name)
    pins: dict[str, str] = {}
    cfg: DictConfig | None = None
    environment = contextlib.ExitStack()
    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = compose(config_name, overrides=_first_of_sweeps(overrides), return_hydra_config=True)
        from lifecycle.job import check_buildable
        from lifecycle.settings import check_devices, check_schedule, check_settings

        HydraConfig.instance().set_config(cfg)
        sweeping = multirun or str(cfg.hydra.get("mode")) == "RunMode.MULTIRUN"  # -m, or a sweep config
        current().sweeping = current().sweeping or sweeping
        refuse_unresolvable_overrides(cfg, _first_of_sweeps(overrides), config_name)
        if config_name == "train":
            refuse_replaced_encoding_choice(cfg, _first_of_sweeps(overrides))
            refuse_replaced_data_choice(cfg, _first_of_sweeps(overrides))
            refuse_replaced_recipe_choice(_first_of_sweeps(overrides))
            _refuse_reference_encoder_flag(cfg)
        if not sweeping:
            _refuse_sweeps_without_multirun(overrides)
            if config_name == "train":
                _give_run_dir(cfg)
        elif config_name == "train":
            _give_job_dir(cfg)
        environment.enter_context(job_environment(cfg))
        refuse_unset_variables(cfg, overrides)
        check_settings(cfg, config_name)
        if not eval_worker:
            refuse_launch_variables(cfg)
        _refuse_added_hydra_keys(cfg, overrides)
        if cfg.hydra.get("output_subdir") is not None:
            raise CommandLineError(f"hydra.output_subdir={cfg.hydra.output_subdir} is not a setting: a run's .hydra/"
                                   " files are written by the job, inside its own run dir; valid: leave it out")
        run_dir_given = next((o for o in overrides if re.match(r"[+~]*hydra\.run\.dir=", o)), None)
        if config_name == "train" and run_dir_given is not None and not sweeping:
            raise CommandLineError(f"{run_dir_given} is not a setting: a run's dir is paths.log_dir/run_name,"
                                   " which its records, its reruns and the tables go by; valid:"
                                   " paths.log_dir=<folder> run_name=<name>")
        if not eval_worker:
            refuse_locked_hydra_settings(cfg, config_name, overrides)
            HydraConfig.instance().set_config(cfg)
        _refuse_logging_to_files(cfg)
        if sweeping:
            _refuse_unusable_launcher(cfg)
            _refuse_plugins_that_cannot_start(cfg)
        if sweeping and "BasicSweeper" in str(cfg.hydra.get("sweeper", {}).get("_target_", "")):
            swept = sweep_overrides(cfg.hydra.sweeper.get("params"), overrides)[0]  # a recipe's params too
            _refuse_intervals(swept)
            _refuse_shuffled_numbered_jobs(swept, cfg)
        if sweeping:  # -m, or a sweep config that sets Hydra's mode
            _check_sweeper_counts(cfg)
            _check_launcher_folder(cfg)
            _check_slurm_shape(cfg)
            _check_swept_values(config_name, overrides, cfg)
        if config_name == "eval":
            check_devices(cfg)
            if not eval_worker:  # its DDP workers' folders and torch's caches go there too
                _check_temp_dir(cfg, [str(root) for root in _job_data_root(cfg)[1:] if root is not None])
        if config_name == "train":
            check_schedule(cfg)
            data_roots = check_data_root(cfg, sweeping)  # readable, allowed: before the data module reads it
            data_roots += _testset_data_folders(cfg)  # a run dir there would take a test set's data folder name
            check_buildable(cfg)
            _check_temp_dir(cfg, data_roots, sweeping)
            if sweeping:
                _check_sweeper_class(cfg)
                _check_sweeper_storage(cfg, data_roots)
                _check_sweep_subdir(OmegaConf.to_container(cfg.hydra.sweep, resolve=False).get("subdir"))
                _refuse_shared_job_dirs(cfg, overrides, config_name)
            if sweeping:  # a sweep's jobs get their names from the sweep (job_dirname)
                _refuse_run_name_in_sweep(overrides)
                prepare_output_dir(cfg.hydra.sweep.dir, "hydra.sweep.dir", data_roots, make=False)
                refuse_damaged_marker(cfg)
                prepare_output_dir(cfg.hydra.sweep.dir, "hydra.sweep.dir", data_roots, make)
                pins = _pin_output_dir(cfg, sweeping=True)
                check_sweep_dir_is_this_sweeps(Path(str(cfg.hydra.sweep.dir)), overrides,
                                               OmegaConf.to_container(cfg.hydra.sweep, resolve=False).get("subdir"),
                                               cfg.hydra)
                if make:
                    _record_sweep_dir(Path(str(cfg.hydra.sweep.dir)))
            else:
                check_run_location(cfg.get("run_name"), cfg.paths.get("log_dir"), run_name_source(cfg))
                prepare_output_dir(cfg.hydra.run.dir, RUN_DIR_KEY, data_roots, make=False)
                refuse_damaged_marker(cfg)
                prepare_output_dir(cfg.hydra.run.dir, RUN_DIR_KEY, data_roots, make)
                pins = _pin_output_dir(cfg, sweeping=False)
    except (HydraException, OmegaConfBaseException) as err:
        raise CommandLineError(override_error(err, overrides, cfg, config_name)) from None
    except (AttributeError, AssertionError):  # OmegaConf's, setting into the basic sweeper's null params
        given = next((o for o in overrides if o.lstrip("+~").startswith("hydra.sweeper.params")), None)
        given = current().typed.get(given, given) if given else given
        if given is None or any(o.startswith("hydra/sweeper=") for o in overrides):  # the basic sweeper's only
            raise
        raise CommandLineError(f"{given} cannot be set: this sweeper's params are null, and OmegaConf cannot set a key"
                               " or merge a mapping into null; valid: the swept keys on the command line"
                               " (-m 'seed=0,1'), or a sweep config of your own in configs/sweep/") from None
    except ValueError as err:
        if GROUP_NOT_A_STRING not in str(err):
            raise  # the checks' own one-line errors
        raise CommandLineError(override_error(err, overrides, cfg, config_name)) from None
    finally:
        environment.close()
        GlobalHydra.instance().clear()
    return pins


def _give_run_dir(cfg: DictConfig) -> None:
    """Set ``hydra.runtime.output_dir`` (``paths.output_dir``) of the composed ``cfg`` to the run dir Hydra will
    make, ``hydra.run.dir`` as resolved here (the dir `_pin_output_dir` pins), so the checks of what lies inside
    the run's own dir (a callback's ``dirpath``, a logger's folder, a data root under ``hydra.job.chdir``) see it
    here, as the job's own check does after Hydra made the dir. One that does not resolve is left unset: its
    setting is refused by the checks that read it."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict, read_write

    try:
        run_dir = cfg.hydra.run.dir
    except OmegaConfBaseException:
        return
    if run_dir is None or not str(run_dir).strip():
        return  # refused by `prepare_output_dir`
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.runtime.output_dir = os.path.abspath(str(run_dir))  # as Hydra's run_job sets it
    HydraConfig.instance().set_config(cfg)


def _give_job_dir(cfg: DictConfig, job_num: int = 0) -> None:
    """A sweep's `_give_run_dir`: ``hydra.runtime.output_dir`` of the composed ``cfg`` (a job's values) set to the
    dir of job ``job_num`` (0: the first values'), ``hydra.sweep.dir/hydra.sweep.subdir``, so that a setting naming
    it (``${hydra:runtime.output_dir}``) resolves as in that job and is judged there. A later job's ``cfg`` (its
    own copy) gets its ``hydra.job.num`` and ``hydra.job.id`` too, as the basic launcher sets them; the first
    values' config is the launch's own, whose Hydra node later checks read as composed. One that does not resolve
    is left unset: the checks of the sweep dir and subdir refuse it."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict, read_write

    try:
        sweep_dir = str(cfg.hydra.sweep.dir)
    except OmegaConfBaseException:
        return
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        if job_num:
            cfg.hydra.job.num = cfg.hydra.job.id = job_num
        try:
            job_dir = os.path.join(sweep_dir, str(cfg.hydra.sweep.subdir))
        except OmegaConfBaseException:  # a subdir of the job's number, which the launcher gives
            job_dir = os.path.join(sweep_dir, str(job_num))
        cfg.hydra.runtime.output_dir = os.path.abspath(job_dir)
    HydraConfig.instance().set_config(cfg)


def job_environment(cfg: DictConfig) -> contextlib.AbstractContextManager[None]:
    """The environment the job runs in, for as long as the check runs: Hydra sets ``hydra.job.env_set`` only
    around the job, and a ``${oc.env:...}`` of the config (``RPE_DATA_DIR`` in ``paths.data_dir``) read here
    would otherwise resolve to another folder than the job's. Restored afterwards (`hydra.core.utils.env_override`)."""
    from hydra.core.utils import env_override

    env_set = OmegaConf.select(cfg, "hydra.job.env_set", default=None)
    if not isinstance(env_set, DictConfig) or not env_set:
        return contextlib.nullcontext()
    return env_override({str(key): str(value) for key, value in env_set.items()})


# What Lightning reads for a process's rank (`rank_zero_only`; a node's rank, which adds to it) and a launcher sets
# for each of its processes
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK", "NODE_RANK", "GROUP_RANK")
LAUNCH_VARIABLES = (*RANK_VARIABLES, "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_NTASKS",
                    "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")


# What decides the code a process imports or loads, which no config may set for the job (`refuse_launch_variables`)
LOADER_VARIABLES = ("PATH", "BASH_ENV", "ENV")
LOADER_PREFIXES = ("PYTHON", "LD_", "DYLD_")
# What else a job's ``hydra.job.env_set`` may set: the variables that tune its libraries (threads, devices, logging,
# the experiment tracker), none of which names a file or folder. Any other variable could point a program the job
# or its DDP workers run at a run folder's files (HOME: git's config, whose fsmonitor command git runs; a cache dir:
# compiled code that torch loads); those are set in the shell that starts the command, by the user. The temp dir
# and the data dir are taken too: each is checked as a destination (`_check_temp_dir`, `check_data_root`).
ENV_SET_FAMILIES = ("OMP_", "MKL_", "OPENBLAS_", "KMP_", "NCCL_", "GLOO_", "CUDA_", "CUBLAS_", "PYTORCH_", "TORCH_",
                    "WANDB_", "TOKENIZERS_")
ENV_SET_PATH_WORDS = ("DIR", "PATH", "HOME", "CACHE", "FILE", "ROOT", "PREFIX", "LIB", "PLUGIN")
ENV_SET_CHECKED = ("TMPDIR", "TEMP", "TMP", "RPE_DATA_DIR")
# Settings that torch reads at import, in every DDP worker, and refuses there with a traceback: their choices
# (case as torch reads them: any).
ENV_SET_CHOICES = {"TORCH_DISTRIBUTED_DEBUG": ("OFF", "INFO", "DETAIL")}


def env_set_allowed(name: str) -> bool:
    """Whether ``hydra.job.env_set`` may set ``name`` (`ENV_SET_FAMILIES`, `ENV_SET_CHECKED`)."""
    return name in ENV_SET_CHECKED or (name.startswith(ENV_SET_FAMILIES)
                                       and not any(word in name for word in ENV_SET_PATH_WORDS))


def _external_launch() -> bool:
    """Whether a launcher Lightning recognises started this process as one of several: srun, or torchrun."""
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    try:
        return SLURMEnvironment.detect() or TorchElasticEnvironment.detect()
    except Exception:  # Lightning's own check of an srun launch (e.g. a mismatched task count): it names it later
        return True


def _check_rendezvous_variables() -> None:
    """``MASTER_ADDR`` and ``MASTER_PORT``, where the processes of a run of several meet: a port that is no port
    number was a ValueError line after the run dir; a host name that does not resolve left rank 0 waiting in the
    rendezvous, deaf to SIGTERM, for ten minutes. Both are one line before any dir."""
    import socket

    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name in os.environ and not os.environ[name].strip():  # Lightning reads it as given, an empty host or port
            raise CommandLineError(f"environment variable {name} is set but empty; valid: unset {name} (the run's own"
                                   " processes meet on this machine), or a host and port of this cluster")
        if os.environ.get(name, "") != os.environ.get(name, "").strip():  # torch reads it with the blanks
            raise CommandLineError(f"environment variable {name}={os.environ[name]!r} has a blank around it, which"
                                   " torch's rendezvous reads as part of it (no such host or port: the processes"
                                   f" would wait forever); valid: {name}={os.environ[name].strip()!r}")
    port = os.environ.get("MASTER_PORT", "")
    if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise CommandLineError(f"environment variable MASTER_PORT={port} is not a port number; valid: 1-65535, or unset"
                               " it (the run picks a free port for its own processes)")
    if port and not _external_launch():  # the run's own rank 0 opens it: one in use fails its rendezvous
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's store: a closed one's port is free
            try:
                probe.bind(("", int(port)))
            except OSError as err:
                raise CommandLineError(f"environment variable MASTER_PORT={port} cannot be opened ({err.strerror}:"
                                       " another process listens there?); valid: a free port, or unset MASTER_PORT"
                                       " (the run picks a free one for its own processes)") from None
    address = os.environ.get("MASTER_ADDR", "")
    if address:
        try:
            found = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as err:
            reason = getattr(err, "strerror", None) or type(err).__name__
            raise CommandLineError(f"environment variable MASTER_ADDR={address} does not resolve ({reason}): the run's"
                                   " processes would wait for each other there forever; valid: a host name or address"
                                   " of this cluster, or unset it (the run's own processes meet on this machine)"
                                   ) from None
        if not _external_launch() and not any(_binds(family, sockaddr[0]) for family, *_, sockaddr in found):
            # the run's own processes meet at its rank 0, on this machine: an address of another host (one left
            # from a cluster shell) had every rank wait to connect there forever, deaf to SIGTERM
            raise CommandLineError(f"environment variable MASTER_ADDR={address} is not an address of this machine,"
                                   " where the run starts its own processes and they meet; valid: unset MASTER_ADDR,"
                                   " or localhost (start the run under srun or torchrun to meet on another host)")


def _check_interface_variables() -> None:
    """``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` (in the environment or ``hydra.job.env_set``) name network
    interfaces of this machine: one that does not exist failed the process group's start with a C++ assertion's
    traceback, after the run dir was made. Gloo opens each listed interface; NCCL takes the interfaces whose names
    begin with an entry (``=name``: that name only; a list starting with ``^`` excludes, and is not judged)."""
    import socket

    try:
        interfaces = [name for _, name in socket.if_nameindex()]
    except OSError:  # no interface list on this system: nothing to compare with
        return
    for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        value = os.environ.get(variable)
        if value is None or value.startswith("^"):
            continue
        entries = [entry.strip() for entry in value.split(",")]
        if variable.startswith("GLOO"):
            missing = [entry for entry in entries if entry not in interfaces]
        else:
            missing = [] if any(name == entry[1:] if entry.startswith("=") else name.startswith(entry)
                                for entry in entries if entry for name in interfaces) else entries
        if missing:
            raise CommandLineError(f"{variable}={value} names no network interface of this machine ({missing[0]!r}):"
                                   " the run's processes could not open their process group; valid: one of"
                                   f" {', '.join(interfaces)}, or unset it")


def _binds(family: int, host: str) -> bool:
    """Whether a socket of ``family`` can be bound to ``host`` here: whether it is an address of this machine."""
    import socket

    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
        return True
    except OSError:
        return False


def _refuse_slurm_job_mismatch(devices: Any, nodes: Any) -> None:
    """Lightning's own checks of a SLURM job, which it runs when it builds the Trainer (inside the job, after the
    run dir), run before any dir: its task variables (``sbatch --ntasks=2`` with train.py started without srun),
    and its tasks per node and nodes against ``trainer.devices`` and ``trainer.num_nodes`` (a one-task job with
    ``trainer.devices=2``)."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    if not SLURMEnvironment.detect():
        return
    try:
        SLURMEnvironment._validate_srun_variables()
    except RuntimeError as err:
        ntasks = os.environ.get("SLURM_NTASKS", "")
        raise CommandLineError(f"environment variable SLURM_NTASKS={ntasks} without SLURM_NTASKS_PER_NODE: Lightning"
                               f" refuses this SLURM job ({one_line(err).replace('`', '')}); valid: sbatch"
                               " --ntasks-per-node=<n> with trainer.devices=<n>, and start train.py under srun"
                               ) from None
    if not (isinstance(devices, int) and isinstance(nodes, int)):
        return
    try:
        SLURMEnvironment().validate_settings(num_devices=devices, num_nodes=nodes)
    except ValueError as err:
        raise CommandLineError(f"this SLURM job's tasks do not match the run: {one_line(err).replace('`', '')};"
                               " valid: trainer.devices=<the job's --ntasks-per-node> and trainer.num_nodes=<its"
                               " --nodes>, or sbatch options that match them") from None


def refuse_launch_variables(cfg: DictConfig) -> None:
    """A process of one run that a launch variable would make a rank of a multi-process launch nobody started.

    ``hydra.job.env_set`` may not set a launch variable: the processes of a run are the launcher's or the run's
    own (Lightning starts them for ``trainer.devices`` > 1). In the environment, a rank other than 0 with no
    launcher that started the other ranks made the job a silent DDP worker (no records, no result), and
    ``LOCAL_RANK`` with more than one process made Lightning wait for processes that never come."""
    env_set = OmegaConf.select(cfg, "hydra.job.env_set", default=None)
    for name in env_set or {}:
        if str(name) in LOADER_VARIABLES or str(name).startswith(LOADER_PREFIXES):
            raise CommandLineError(f"hydra.job.env_set.{name}={env_set[name]!r} changes what the job's Python (and its"
                                   " DDP workers', which inherit it) imports or loads: a folder on it, a run dir say,"
                                   " would have its code run; valid: leave it out (set it in the shell that starts"
                                   " the command, if you must)")
        if str(name) in LAUNCH_VARIABLES or str(name).startswith(("SLURM_", "TORCHELASTIC_")):
            raise CommandLineError(f"hydra.job.env_set.{name}={env_set[name]!r} is a variable of a multi-process"
                                   " launch, which the launcher sets for each of its processes (Lightning's own for"
                                   " trainer.devices > 1); valid: leave it out, and start the run with"
                                   " trainer.devices=<n> or under srun/torchrun")
        if not env_set_allowed(str(name)):
            raise CommandLineError(f"hydra.job.env_set.{name}={env_set[name]!r} is not a variable a job may set: one"
                                   " that is no library setting could point what the job runs (git, torch's caches)"
                                   " at another folder's files; valid: the variables of "
                                   f"{', '.join(f + '*' for f in ENV_SET_FAMILIES)} without a path in them, and"
                                   f" {', '.join(ENV_SET_CHECKED)}; set others in the shell that starts the command")
        value = str(env_set[name])
        choices = ENV_SET_CHOICES.get(str(name))
        if choices and value.upper() not in choices:
            raise CommandLineError(f"hydra.job.env_set.{name}={value!r} is not a value torch reads; valid:"
                                   f" {', '.join(choices)}")
        if str(name) not in ENV_SET_CHECKED and ("/" in value or os.sep in value or value.startswith("~")):
            # a setting whose name says no path may still take one (TORCH_LOGS_OUT: a log file torch opens on import)
            raise CommandLineError(f"hydra.job.env_set.{name}={value!r} names a path, which a library would write to"
                                   " or read from beside the run's checks (another run's dir, say); valid: a value"
                                   " without a path, or set it in the shell that starts the command")
    from lifecycle.settings import configured_world_size

    world = configured_world_size(cfg)
    nodes = OmegaConf.select(cfg, "trainer.num_nodes", default=1)
    _refuse_slurm_job_mismatch(OmegaConf.select(cfg, "trainer.devices", default=None), nodes)
    # run by srun: the SLURM launcher starts the jobs of a sweep; a single run (no -m) never reaches it
    scheduled = current().sweeping and "Slurm" in str(OmegaConf.select(cfg, "hydra.launcher._target_", default="")
                                                       or "")
    if isinstance(nodes, int) and nodes > 1 and not scheduled and not _external_launch():
        raise CommandLineError(f"trainer.num_nodes={nodes} needs a launcher that starts the run's processes on every"
                               " node (srun, torchrun): without one, this process would wait for the other nodes"
                               " forever; valid: trainer.num_nodes=1 here, or start the run under srun or torchrun")
    strategy = str(OmegaConf.select(cfg, "trainer.strategy", default="") or "").lower()  # a name or a node
    if world != 1 or "ddp" in strategy or "fsdp" in strategy:  # one process of a DDP strategy meets itself too
        _check_rendezvous_variables()
        _check_interface_variables()
    given = {name: os.environ[name] for name in RANK_VARIABLES if os.environ.get(name, "").strip()}
    if not given:
        return
    name, value = next(((n, v) for n, v in given.items() if v.strip() != "0"), next(iter(given.items())))
    launched = _external_launch()
    if (world != 1 or value.strip() == "0") and launched:
        return  # one of the processes srun or torchrun started for a run of several (a rank of a one-process run: no)
    processes = f"{world} process{'es' if world != 1 else ''}" if world else "the machine's devices"
    if value.strip() != "0":
        rank = "part of node" if name in ("NODE_RANK", "GROUP_RANK") else "rank"
        others = ("but the run has 1 process, which is rank 0 (trainer.devices x trainer.num_nodes)" if launched
                  else "but no launcher (srun, torchrun) started the others (the run has"
                       f" {processes}: trainer.devices x trainer.num_nodes)")
        why = f"makes this process {rank} {value} of a multi-process launch, {others}"
    elif name == "LOCAL_RANK" and world != 1:
        why = (f"makes Lightning take this process for one of {processes} started by a launcher, and wait for the"
               " others, which nobody starts")
    else:
        return  # rank 0 of a one-process run: what it would be anyway
    raise CommandLineError(f"environment variable {name}={value} {why}; valid: unset {name} (the run starts its own"
                           " processes for trainer.devices > 1), or start it under srun or torchrun")


# ${oc.env:NAME} without a default (a default follows a comma)
_ENV_WITHOUT_DEFAULT = re.compile(r"\$\{\s*oc\.env:\s*([A-Za-z_]\w*)\s*\}")


def refuse_unset_variables(cfg: DictConfig, overrides: list[str]) -> None:
    """A value of the job's config (Hydra's node aside) reading an environment variable that is not set and has no
    default: one line naming the setting and the variable, before any dir. Each setting is otherwise resolved
    only where a check reads it, which a sweep's did not (the job then failed, after the sweep dir was made)."""
    job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    text = json.dumps(OmegaConf.to_container(job, resolve=False), default=str)
    for name in _ENV_WITHOUT_DEFAULT.findall(text):
        if name not in os.environ:
            raise CommandLineError(missing_env_line(f"Environment variable '{name}' not found", overrides, job))


# ${hydra:<key>} in a value: Hydra's resolver selects <key> of its node, and gives null where it is absent
_HYDRA_READ = re.compile(r"\$\{\s*hydra\s*:\s*([^${}\s]+)\s*\}")
# keys of Hydra's node a value may read, for the line naming a missing one
HYDRA_READ_EXAMPLES = ("runtime.output_dir", "job.name", "job.override_dirname", "job.num", "run.dir", "sweep.dir",
                       "sweep.subdir", "runtime.choices.<group>")


def _hydra_key_exists(hydra: Any, key: str) -> bool:
    """Whether dotted ``key`` is a key of ``hydra`` (the composed ``hydra`` node), whatever its value (null
    included: ``job.num`` outside a sweep), resolving no value on the way."""
    node = hydra
    for part in key.split("."):
        if not isinstance(node, (DictConfig, ListConfig)) or node._is_none():
            return False
        if node._is_interpolation():
            return True  # a node that reads another: what lies below it is judged where it is read
        if isinstance(node, DictConfig) and part in node.keys():  # `in node` is False for a ??? value (job.num)
            node = node._get_node(part)
        elif isinstance(node, ListConfig) and part.isdigit() and int(part) < len(node):
            node = node._get_node(int(part))
        else:
            return False
    return True


def refuse_unresolvable_overrides(cfg: DictConfig, overrides: list[str], config_name: str) -> None:
    """Each override whose value interpolates (``key=${...}``): a ``${hydra:<key>}`` whose key is not one of Hydra's
    node (Hydra's resolver gives null for it, so a typo ran with the key's null silently), and a resolver's error
    (``batch_size=${oc.decode:"[1,"}``), each one line naming the override, before any dir is made. Errors that
    only the running job can resolve (Hydra's runtime values) are left to it."""
    for override in overrides:
        key, sep, value = override.lstrip("+~").partition("=")
        if not sep or "${" not in value or "/" in key or key.startswith("hydra/"):
            continue
        for read in _HYDRA_READ.findall(value):
            if not _hydra_key_exists(cfg.get("hydra"), read):
                examples = ", ".join(f"hydra:{example}" for example in HYDRA_READ_EXAMPLES)
                raise CommandLineError(f"{override} reads ${{hydra:{read}}}, and {read} is not a key of Hydra's config"
                                       " (its hydra: resolver would give null for it, silently); valid: a key of"
                                       f" Hydra's config, e.g. {examples}, or {key}=<value>")
        if key.startswith("hydra."):
            continue  # Hydra resolves its own node as it runs
        try:
            OmegaConf.select(cfg, key, throw_on_missing=False)
        except OmegaConfBaseException as err:
            if resolver_error_line(root_cause(err), overrides, cfg) is not None:
                raise CommandLineError(override_error(err, overrides, cfg, config_name)) from None
    _refuse_missing_hydra_reads(cfg)


def _given_option(overrides: list[str], group: str, key: str, given: list[str] | None) -> tuple[str, Path | None]:
    """``(option, its file)`` of the command line's ``group=<option>`` in ``overrides``; the file is None where no
    option is given, it is unknown (the group check names it), or the command line (``given``, default
    ``overrides``) also sets ``group.key`` itself, the user's own choice of what the option would set."""
    chosen = next((o.split("=", 1)[1] for o in overrides if re.fullmatch(rf"\+{{0,2}}{group}=[^=]*", o)), None)
    own = re.compile(rf"[+~]{{0,2}}{group}\.{key}=")
    if chosen is None or any(own.match(o) for o in (overrides if given is None else given)):
        return "", None
    option = CONFIG_DIR / group / f"{chosen}.yaml"
    return chosen, option if option.is_file() else None


def refuse_replaced_encoding_choice(cfg: DictConfig, overrides: list[str], given: list[str] | None = None) -> None:
    """``rpe=<option>`` on the command line whose preset the composed config does not train: a config that sets
    ``rpe.preset`` itself (a benchmark sweep picks it from its ``row``, a sweep config sweeps it in its params)
    replaces the choice, and the run would train another encoding than the command (and its job dir's name) says.
    ``rpe.preset=`` given too on the command line (``given``, the command's own overrides; default
    ``overrides``) is the user's own choice, never refused."""
    chosen, option = _given_option(overrides, "rpe", "preset", given)
    if option is None:
        return
    preset = OmegaConf.load(option).get("preset")
    trains = OmegaConf.select(cfg, "rpe.preset", default=None, throw_on_resolution_failure=False)
    if preset is None or trains == preset:
        return
    raw = plain_value(OmegaConf.to_container(cfg.rpe, resolve=False), "preset")
    row = OmegaConf.select(cfg, "row", default=None, throw_on_resolution_failure=False)
    by = f" from row={row}" if row is not None and "rows." in str(raw) else ""
    how = "row=<a row of the sweep>" if by else "its own recipe"
    raise CommandLineError(f"rpe={chosen} is replaced by the config, whose rpe.preset={raw}{by} trains {trains}; the"
                           f" run would train {trains} under a name that says {chosen}; valid: pick the encoding as"
                           f" the config does ({how}), or rpe.preset={preset}")


def refuse_replaced_data_choice(cfg: DictConfig, overrides: list[str], given: list[str] | None = None) -> None:
    """``data=<option>`` on the command line beside a recipe that sets ``data.root`` itself (a benchmark sweep, an
    experiment): the option's images would be generated into, or read from, the folder the recipe names for its
    own dataset, under that dataset's name. ``data.root=`` given too on the command line (``given``, as for
    `refuse_replaced_encoding_choice`) is the user's own choice, never refused."""
    chosen, option = _given_option(overrides, "data", "root", given)
    if option is None:
        return
    own = OmegaConf.to_container(OmegaConf.load(option), resolve=False).get("root")
    composed = plain_value(OmegaConf.to_container(cfg.data, resolve=False), "root")
    if own is None or own == "???" or str(composed) == str(own) or _recipe_choice(overrides, "data") == chosen:
        return  # the recipe's own data option, given again: its root is the recipe's
    raise CommandLineError(f"data={chosen} is replaced in part by the config, whose data.root={composed} is not"
                           f" {chosen}'s own root ({own}): {chosen}'s images would be generated into, or read from,"
                           " the folder of the recipe's own dataset; valid: leave data= out (the recipe picks its"
                           f" data), or give data.root= too")


# The groups a sweep config's recipe picks (its `override /experiment`, and the experiment's model and data)
RECIPE_GROUPS = ("experiment", "model", "data")


def recipe_choices(group: str, option: str) -> dict[str, str]:
    """``{group: option}`` of the ``override /<group>: <option>`` entries of ``group``'s ``option``
    (``sweep``, ``shift_mini``) and of its shared bases, and then of the experiment it picks: the choices the recipe
    makes, read from its files (a choice equal to the root config's default is one the recipe makes too)."""
    made: dict[str, str] = {}
    for path in _recipe_files(group, option):
        for item in OmegaConf.to_container(OmegaConf.load(path)).get("defaults") or []:
            if isinstance(item, dict):
                for key, value in item.items():
                    name = str(key).removeprefix("override").strip().lstrip("/")
                    if str(key).startswith("override") and isinstance(value, str):
                        made.setdefault(name, value)
    if group != "experiment" and "experiment" in made:
        made = {**recipe_choices("experiment", made["experiment"]), **made}
    return made


def refuse_replaced_recipe_choice(overrides: list[str]) -> None:
    """``group=<option>`` (experiment, model, data; a list of recipes too) beside ``sweep=<name>`` whose recipe picks
    another option of it: the sweep's rows are trained and tabled as that recipe's (its budget, its model, its data),
    and a job with the given option would be counted as one of them."""
    sweep = next((o for o in overrides if re.fullmatch(r"\+?sweep=\w+", o)), None)
    if sweep is None:
        return
    made = recipe_choices("sweep", sweep.split("=", 1)[1])
    for group in RECIPE_GROUPS:
        chosen = next((o.split("=", 1)[1] for o in overrides if re.fullmatch(rf"\+{{0,2}}{group}=.+", o)), None)
        recipe = made.get(group)
        if chosen is None or recipe is None:
            continue
        text = chosen.replace(" ", "")
        items = text[1:-1].split(",") if text.startswith("[") and text.endswith("]") else [text]
        if items == [recipe]:  # the recipe's own option, also as a list of one
            continue
        twice = next((item for item in items if items.count(item) > 1), None)
        if twice is not None:
            raise CommandLineError(f"{group}={chosen} names {twice} twice; valid: {group}={recipe} (the option"
                                   f" {sweep} is made for), or leave {group}= out")
        added = [item for item in items if item != recipe]
        does = (f"adds {', '.join(added)} to" if recipe in items and recipe.count(",") == 0 else "replaces")
        raise CommandLineError(f"{group}={chosen} {does} the {group} option {sweep} is made for"
                               f" ({group}={recipe}): its rows are trained and tabled as that recipe's, and the"
                               f" jobs would be counted as them; valid: leave {group}= out, or a sweep config of"
                               " your own in configs/sweep/")


def _recipe_choice(overrides: list[str], group: str) -> str | None:
    """The option of ``group`` the train config composed from ``overrides`` without the command line's own
    ``group=`` choice picks (a sweep's or an experiment's ``override /group``): composed anew (~0.4 s), so only
    asked where a choice seems replaced."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException

    own = [o for o in overrides if not re.fullmatch(rf"\+{{0,2}}{group}=[^=]*", o)]
    given = HydraConfig.instance().cfg if HydraConfig.initialized() else None
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("train", overrides=own, return_hydra_config=True)
        return OmegaConf.select(cfg, f"hydra.runtime.choices.{group}", default=None)
    except (HydraException, OmegaConfBaseException, ValueError):
        return None
    finally:
        GlobalHydra.instance().clear()
        if given is not None:
            HydraConfig.instance().set_config(given)


def _refuse_reference_encoder_flag(cfg: DictConfig) -> None:
    """``model.enc_rpe2d`` (DETR-iRPE's flag) would pick the encoder's encoding beside the rpe group, and win, while
    the run is recorded, named and tabled by ``rpe.preset``: train.py takes the same flag as ``rpe.preset``."""
    flag = OmegaConf.select(cfg, "model.enc_rpe2d", default=None, throw_on_resolution_failure=False)
    if flag is None:
        return
    preset = OmegaConf.select(cfg, "rpe.preset", default=None, throw_on_resolution_failure=False)
    raise CommandLineError(f"model.enc_rpe2d={flag} would replace the encoder's encoding of the rpe group"
                           f" (rpe.preset={preset}), while the run is recorded, named and tabled by rpe.preset; valid:"
                           f" rpe.preset={flag or 'none'} (the same flag, one setting), and leave model.enc_rpe2d out")


def _refuse_missing_hydra_reads(cfg: DictConfig) -> None:
    """A ``${hydra:<key>}`` that a config file (an experiment of the user's) writes in a value, whose key is not
    one of Hydra's node: its resolver would give null silently. Hydra's own node is Hydra's to resolve."""
    for path, value in _flat(_job_container(cfg, resolve=False)):
        value = value if isinstance(value, str) else json.dumps(value, default=str)
        for read in _HYDRA_READ.findall(value):
            if not _hydra_key_exists(cfg.get("hydra"), read):
                examples = ", ".join(f"hydra:{example}" for example in HYDRA_READ_EXAMPLES)
                raise CommandLineError(f"{path}={value!r} (as the configs compose it) reads ${{hydra:{read}}}, and"
                                       f" {read} is not a key of Hydra's config (its hydra: resolver would give null"
                                       f" for it, silently); valid: a key of Hydra's config, e.g. {examples}")


def _refuse_eval_output_dirs(argv: list[str]) -> None:
    """eval.py writes no folder of its own (only a test set's result, into the run's testsets/): a multirun, or a
    Hydra run or sweep dir, would have Hydra make one wherever it was given (a data root, another run's dir)."""
    valid = ("valid: one checkpoint per eval.py command, or scripts/evaluate_testsets.py <run or sweep dirs> --testsets"
             " <names> for many")
    if any(arg in ("-m", "--multirun") for arg in argv):
        raise CommandLineError(f"eval.py -m is not supported: eval.py evaluates one checkpoint and makes no folder;"
                               f" {valid}")
    given = next((a for a in argv if re.match(r"[+~]*hydra\.(run|sweep)\.", a)), None)
    if given is not None:
        raise CommandLineError(f"{given} is not a setting of eval.py: it makes no run dir (a test set's result goes"
                               " into the evaluated run's testsets/); valid: leave it out")


def _refuse_foreign_search_path(overrides: list[str]) -> None:
    """A config search path outside configs/ would compose the run from files no check has seen."""
    given = next((o for o in overrides if re.match(r"[+~]*hydra\.searchpath", o)), None)
    if given is not None:
        raise CommandLineError(f"{given} is not supported: a run is composed from the project's configs/ and the"
                               " command line only; valid: a recipe of your own in configs/experiment/")


def _refuse_logging_to_files(cfg: DictConfig) -> None:
    """A logging option (``hydra/job_logging=default``) that writes a log file into the run dir before the job has
    checked the dir is its own."""
    for group in ("job_logging", "hydra_logging"):
        handlers = (cfg.hydra.get(group) or {}).get("handlers") or {}
        if any("FileHandler" in str((h or {}).get("class", "")) for h in handlers.values()):
            choice = cfg.hydra.runtime.choices.get(f"hydra/{group}")
            raise CommandLineError(f"hydra/{group}={choice} writes a log file into the run dir before the job has"
                                   " checked the dir is its own; valid: hydra/job_logging=stdout (the default),"
                                   " none or disabled")


# The Hydra settings a command line or a recipe (an experiment, a sweep config) may change, by script; every other
# ``hydra.*`` key keeps the value the project's configs give it. Hydra's run dir, log files, callbacks, search path
# or working dir changed any other way (a node override ``hydra.run={dir: ...}``, ``+hydra.callbacks...``, a recipe)
# would get around the checks, which judge paths.log_dir/run_name, the project's configs and the command line.
HYDRA_SETTABLE = {
    "train": ("mode", "sweep.dir", "sweep.subdir", "sweeper", "launcher", "job.config.override_dirname", "job.chdir",
              "job.env_set", "verbose", "help", "hydra_help", "job_logging", "hydra_logging"),
    "eval": ("verbose", "help", "hydra_help", "job_logging", "hydra_logging"),
}
# What Hydra fills in from the command itself (the overrides, the choices, the job's name and number)
HYDRA_DERIVED = ("overrides", "runtime", "job.name", "job.override_dirname", "job.id", "job.num", "job.config_name")
# Why a locked Hydra setting stays as it is, by key prefix (the first that matches): eval.py's own reasons first
HYDRA_LOCKED_WHY_EVAL = {
    "run": "eval.py makes no run dir (a test set's result goes into the evaluated run's testsets/)",
    "mode": "eval.py evaluates one checkpoint per command and makes no folder; valid: scripts/evaluate_testsets.py"
            " <run or sweep dirs> --testsets <names> for many",
    "sweep": "eval.py makes no folder (a test set's result goes into the evaluated run's testsets/)",
}
HYDRA_LOCKED_WHY = {
    "run.dir": "a run's dir is paths.log_dir/run_name, which its records, its reruns and the tables go by; valid:"
               " paths.log_dir=<folder> run_name=<name>",
    "callbacks": "Hydra would make and call the objects it names around every job, outside the run's checks",
    "searchpath": "a run is composed from the project's configs/ and the command line only; valid: a recipe of your"
                  " own in configs/experiment/",
    "output_subdir": "a run's .hydra/ files are written by the job, inside its own run dir",
    "job.chdir": "the run's paths are resolved from the directory the command starts in",
    "job.env_set": "the job's environment is the command's own (a worker's is set by its parent run)",
}


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{dotted key: value}`` of a plain container's leaves (a list is one leaf; an empty mapping is one)."""
    if isinstance(node, dict) and node:
        found: dict[str, Any] = {}
        for key, value in node.items():
            found.update(_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
        return found
    return {prefix: node}


def _under(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == p or key.startswith(f"{p}.") for p in prefixes)


_LEVEL_KEY = re.compile(r"(job_logging|hydra_logging)\.(root|loggers\.[^.]+|handlers\.[^.]+)\.level")


def _resolved(cfg: DictConfig, key: str, value: Any) -> Any:
    """``value`` (the text of ``key`` in ``cfg``) resolved as the job will (``${oc.env:LEVEL}``), where it can be."""
    if not (isinstance(value, str) and "${" in value):
        return value
    try:
        return OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
    except OmegaConfBaseException:
        return value


def _log_level_setting(key: str, value: Any) -> bool:
    """``job_logging.root.level=DEBUG`` (a logger's or a handler's level): how much is logged, never where to, so a
    command may set it, to one of Python's level names or numbers."""
    import logging

    if not _LEVEL_KEY.fullmatch(key):
        return False
    if isinstance(value, str) and value in logging.getLevelNamesMapping():  # logging knows them in capitals only
        return True
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return True
    raise CommandLineError(f"hydra.{key}={value!r} is not a logging level; valid: one of"
                           f" {', '.join(sorted(set(logging.getLevelNamesMapping()) - {'WARN', 'FATAL'}))}")


def refuse_locked_hydra_settings(cfg: DictConfig, config_name: str, overrides: list[str]) -> None:
    """Every ``hydra.*`` key of the composed ``cfg`` outside `HYDRA_SETTABLE` must hold the value the project's
    configs give it, however it was changed: judged on the composition, compared with one of the project's configs
    alone (with the same logging choices), so that no spelling of an override and no recipe gets around it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    choices = cfg.hydra.runtime.choices
    logging = [f"hydra/{g}={choices[f'hydra/{g}']}" for g in ("job_logging", "hydra_logging")
               if choices.get(f"hydra/{g}")]
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        reference = compose(config_name, overrides=logging, return_hydra_config=True)
    GlobalHydra.instance().clear()
    given = _leaves(OmegaConf.to_container(cfg.hydra, resolve=False))
    default = _leaves(OmegaConf.to_container(reference.hydra, resolve=False))
    settable = HYDRA_SETTABLE.get(config_name, ())
    logging_keys = ("job_logging", "hydra_logging")
    changed = [k for k in sorted(set(given) | set(default)) if given.get(k, _ABSENT) != default.get(k, _ABSENT)
               and not _under(k, HYDRA_DERIVED) and not (_under(k, settable) and not _under(k, logging_keys))]
    # a key given a value first; an empty mapping that gained keys is named by the keys it gained
    changed = [k for k in changed if k in given or not any(g.startswith(f"{k}.") for g in given)]
    changed = [k for k in changed if not (k in default and _log_level_setting(
        k, _resolved(cfg, f"hydra.{k}", given.get(k, _ABSENT))))]  # a level of the option's own logger or handler
    for key in sorted(changed, key=lambda k: k not in given):
        value = given.get(key, _ABSENT)
        value = getattr(value, "name", value) if isinstance(value, enum.Enum) else value  # hydra.mode: RunMode
        shown = f"~hydra.{key} (deleting it)" if value is _ABSENT else f"hydra.{key}={value!r}"
        if _under(key, logging_keys):
            group = key.split(".", 1)[0]
            raise CommandLineError(
                f"{shown} changes the logging option hydra/{group}={choices.get(f'hydra/{group}')}: its handlers"
                f" and files are the option's own (a handler set otherwise could write a file anywhere, or fail"
                f" inside Hydra before the job starts); valid: hydra/{group}=stdout (train's and eval's default),"
                f" none or disabled, and a level such as hydra.{group}.root.level=DEBUG")
        reasons = {**HYDRA_LOCKED_WHY_EVAL, **HYDRA_LOCKED_WHY} if config_name == "eval" else HYDRA_LOCKED_WHY
        why = next((w for p, w in reasons.items() if _under(key, (p,))),
                   "it is not one of the Hydra settings this project reads")
        parts = key.split(".")
        named = {"hydra." + ".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        given_as = next((o for o in overrides if o.lstrip("+~").split("=", 1)[0] in named), None)
        given_as = current().typed.get(given_as, given_as) if given_as else given_as
        source = ("" if value is _ABSENT else f" (from {given_as})" if given_as
                  else " (set by a recipe or a node override)")
        valid = [f"hydra.{k}" for k in settable
                 if k not in (*logging_keys, "help", "hydra_help", "verbose", "job.config.override_dirname")]
        raise CommandLineError(f"{shown}{source} is not a setting of {SCRIPTS.get(config_name, config_name)}: {why};"
                               f" the Hydra settings it takes: {', '.join([*valid, 'hydra/job_logging=<option>'])}")


# Launchers that hand jobs to a scheduler, and the commands that scheduler needs on this machine: submitit
# stops with a traceback inside Hydra's multirun, after multirun.yaml is written, when they are missing.
_SCHEDULER_COMMANDS = {"SlurmLauncher": ("SLURM", ("sbatch", "srun"))}


def _launcher_missing(target: str) -> tuple[str, list[str]] | None:
    """``(scheduler, commands not on PATH)`` for a launcher ``_target_`` this machine cannot run, else None."""
    for suffix, (scheduler, commands) in _SCHEDULER_COMMANDS.items():
        if target.endswith(suffix):
            missing = [c for c in commands if shutil.which(c) is None]
            return (scheduler, missing) if missing else None
    return None


def _refuse_unusable_launcher(cfg: DictConfig) -> None:
    """A sweep's ``hydra/launcher`` must be able to start jobs here: refused before the sweep dir is made."""
    target = str((cfg.hydra.get("launcher") or {}).get("_target_", ""))
    missing = _launcher_missing(target)
    if missing is None:
        return
    scheduler, commands = missing
    choice = cfg.hydra.runtime.choices.get("hydra/launcher") or target
    usable = ["basic"] + sorted(
        p.stem for p in (CONFIG_DIR / "hydra" / "launcher").glob("*.yaml")
        if p.stem != choice and _launcher_missing(_launcher_target(p)) is None)
    raise CommandLineError(f"hydra/launcher={choice} submits the sweep's jobs to {scheduler}, which this machine"
                           f" lacks ({', '.join(commands)} not on PATH); valid here: hydra/launcher="
                           f"{' or '.join(usable)} (or run the sweep on a {scheduler} login node)")


def _refuse_added_hydra_keys(cfg: DictConfig, overrides: list[str]) -> None:
    """A key ``+`` adds to one of Hydra's own nodes (dataclasses: ``hydra.job``, ``hydra.run``, ...) is one no
    Hydra code reads (``+hydra.job.foo=1``): refused naming the node's fields. A mapping node (``hydra.job.env_set``)
    takes any key; the sweeper and launcher are checked by making them (`_refuse_plugins_that_cannot_start`)."""
    import dataclasses

    for arg in overrides:
        added = re.match(r"\++(hydra(?:\.[\w-]+)*)\.([\w-]+)=", arg)
        if added is None or added.group(1).startswith(("hydra.launcher", "hydra.sweeper")):
            continue
        node = OmegaConf.select(cfg, added.group(1))
        schema = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
        fields = [f.name for f in dataclasses.fields(schema)] if dataclasses.is_dataclass(schema) else None
        if fields is not None and added.group(2) not in fields:
            raise CommandLineError(_unknown_key_line(f"{added.group(1)}.{added.group(2)}", fields))


def _refuse_plugins_that_cannot_start(cfg: DictConfig) -> None:
    """The sweep's sweeper and launcher, made here as Hydra's multirun makes them: an argument the plugin does not
    take (``+hydra.launcher.n_jobs=2`` on the basic launcher) was Hydra's four-line TypeError inside the multirun,
    exit 1, after the sweep dir was made. `Plugins._instantiate` is private Hydra API (the hydra-core 1.3 pin)."""
    from hydra.core.plugins import Plugins

    for kind in ("sweeper", "launcher"):
        node = cfg.hydra.get(kind)
        if node is None:
            continue
        try:
            Plugins.instance()._instantiate(node)
        except Exception as err:  # whatever the plugin's constructor raises: one line naming the setting
            cause = root_cause(err)
            unexpected = re.search(r"unexpected keyword argument '([^']+)'", str(cause))
            if unexpected:
                name = unexpected.group(1)
                raise CommandLineError(_unknown_key_line(f"hydra.{kind}.{name}", [str(k) for k in node if k != name],
                                                         str(node.get("_target_", "")))) from None
            choice = cfg.hydra.runtime.choices.get(f"hydra/{kind}")
            raise CommandLineError(f"hydra/{kind}={choice} cannot be started: {one_line(cause).splitlines()[0]};"
                                   f" valid: its settings as documented (hydra.{kind}.*), or leave them out") from None


# The optuna plugin's own sweeper: a trial whose job fails ends its whole study with a traceback (it tells optuna
# a NaN value); `hydra/sweeper=optuna_rpe` is the same sweeper telling such a trial as failed and going on.
PLUGIN_OPTUNA_SWEEPER = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"


def _check_sweeper_class(cfg: DictConfig) -> None:
    """Refuse the optuna plugin's own sweeper (``hydra/sweeper=optuna``) in one line naming ``optuna_rpe``."""
    sweeper = cfg.hydra.get("sweeper") or {}
    if hasattr(sweeper, "get") and sweeper.get("_target_") == PLUGIN_OPTUNA_SWEEPER:
        raise CommandLineError("hydra/sweeper=optuna (the plugin's own sweeper) ends the whole study at the first"
                               " trial whose job fails; valid: hydra/sweeper=optuna_rpe, the same sweeper and"
                               " settings, which records such a trial as failed and goes on")


def _check_sweeper_storage(cfg: DictConfig, data_roots: tuple[Any, ...]) -> None:
    """The optuna sweeper's ``storage`` (a database URL) is where the study is written: an SQLite file is a
    destination like any other (never inside a run dir or a data root), and a storage optuna cannot open is
    one line before anything is made, not a traceback from inside the multirun after the file was made. A
    file still to be made is tried as a temporary file of the same kind, so a refused command leaves none."""
    sweeper = cfg.hydra.get("sweeper") or {}
    storage = sweeper.get("storage") if hasattr(sweeper, "get") else None
    if storage is None:
        return
    key = "hydra.sweeper.storage"
    in_memory = "leave it out (the study then lives in memory for the sweep; each trial's result is in its run dir)"
    no_url = CommandLineError(f"{key}={storage!r} is not a database URL; valid: sqlite:///<file outside every run"
                              f" dir>, or {in_memory}")
    if not isinstance(storage, str) or not storage.strip():
        raise no_url
    import tempfile

    import optuna
    import sqlalchemy
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(storage)
    except ArgumentError:
        raise no_url from None
    database = url.database if url.get_backend_name() == "sqlite" else None
    with tempfile.TemporaryDirectory(prefix="rpe-storage-check-") as scratch:
        tried = storage
        if database and database != ":memory:":
            from storage.destinations import DestinationError, check_destination

            try:
                target = check_destination(database, key, data_roots=data_roots, given=storage)
            except DestinationError as err:
                raise CommandLineError(str(err)) from None
            if not os.path.lexists(target):
                tried = str(url.set(database=str(Path(scratch) / "study.db")))
        try:
            optuna.storages.RDBStorage(tried)
        except Exception as err:  # the database's or the pinned optuna's answer: one line naming the setting
            raise CommandLineError(
                f"{key}={storage!r} cannot be opened: {type(err).__name__} {one_line(err)}".rstrip()
                + f" (optuna {optuna.__version__} with SQLAlchemy {sqlalchemy.__version__}); valid: {in_memory}"
            ) from None


def _launcher_target(path: Path) -> str:
    """The launcher class a config of configs/hydra/launcher/ extends, read from its defaults (the plugin's
    ``submitit_slurm`` is SlurmLauncher); "" for one that names no scheduler's plugin."""
    defaults = OmegaConf.load(path).get("defaults") or []
    return "SlurmLauncher" if "submitit_slurm" in [str(d) for d in defaults] else ""


def _testset_data_folders(cfg: DictConfig) -> tuple[str, ...]:
    """The folders of the test sets' own data under the config's ``paths.data_dir`` (none where it does not
    resolve here)."""
    from lifecycle.project import testset_data_folders

    data_dir = OmegaConf.select(cfg, "paths.data_dir", default=None, throw_on_resolution_failure=False)
    return tuple(testset_data_folders(data_dir))


def _refuse_testset_data(cfg: DictConfig, given: Any, root: Path) -> None:
    """A run never trains on a test set's data: the folder of the test sets' own data (its marker, or the config's
    ``<paths.data_dir>/testsets``) holds images a test-set result must never have been trained on, and is shared by
    every run evaluated on them, so no advice may be to delete or regenerate it."""
    from storage.destinations import is_testsets_folder, real

    folders = {real(folder) for folder in _testset_data_folders(cfg)}
    target = real(root)
    try:
        testsets = next((p for p in (target, *target.parents) if p in folders or is_testsets_folder(p)), None)
    except OSError:
        return  # a path the system cannot look up (a name too long): the data checks after this one name it
    if testsets is not None:
        raise CommandLineError(f"data.root={str(given)!r} lies in the folder {testsets} of the test sets' own data:"
                               " a run trained on a test set's images could not be judged on them, and the folder is"
                               " shared by every run evaluated there (only scripts/generate_testsets.py writes it);"
                               " valid: a data.root outside it (leave data.root out for the data config's own root)")


def check_data_root(cfg: DictConfig, sweeping: bool = False) -> tuple[Any, ...]:
    """A data root that the run would generate lies outside every run dir and every other data root
    (`storage.destinations`), also outside the run dir this run is about to make, and its path fits the
    file system; returns the config's data roots, which no run dir may lie in. The root is the job's: a relative
    one is resolved as the job will (`lifecycle.settings.job_path`). ``sweeping``: the config is a sweep's job,
    whose root also lies outside the sweep dir this launch makes."""
    from data.errors import DataConfigError, data_root_path
    from lifecycle.settings import run_dir_of
    from storage.destinations import DestinationError, check_generated_root

    data = cfg.get("data") or {}
    given, root = _job_data_root(cfg)
    if hasattr(data, "get") and "root" in data:
        try:  # null or blank: the data module would make a folder 'None', or fill the current directory
            data_root_path(given)
        except DataConfigError as err:
            raise CommandLineError(str(err)) from None
    if root is None:
        return ()
    chdir = OmegaConf.select(cfg, "hydra.job.chdir", default=None, throw_on_resolution_failure=False)
    in_sweep = sweeping or run_dir_of(cfg) is None
    if chdir is True and in_sweep and not os.path.isabs(os.path.expanduser(str(given))):
        # a sweep: each job's working dir is its own run dir, which does not exist yet and holds no data
        raise CommandLineError(f"data.root={str(given)!r} is relative, and hydra.job.chdir=true makes each sweep job's"
                               " working dir its own run dir, so the data would be read (or generated) inside"
                               " it; valid: an absolute data.root, or hydra.job.chdir=false")
    loop = symlink_loop(root)
    if loop is not None:  # every reader of the root (its identity, the loader) would fail on it with a traceback
        raise CommandLineError(f"data.root={str(given)!r} cannot be read: {loop} is a symlink loop (its links lead"
                               " back to themselves); valid: a data root whose path has no link loop")
    if data.get("generator") is not None:
        _check_root_length(given, root)
    _refuse_testset_data(cfg, given, root)
    try:
        check_generated_root(data, root)
    except DestinationError as err:
        raise CommandLineError(str(err)) from None
    run_dir = run_dir_of(cfg)
    sweep_dir = OmegaConf.select(cfg, "hydra.sweep.dir", default=None, throw_on_resolution_failure=False)
    own = [("sweep dir", sweep_dir, "its jobs'")] if in_sweep and sweep_dir is not None else []
    own += [("run dir", run_dir, "that run's")] if run_dir is not None else []
    for kind, folder, whose in own if data.get("generator") is not None else ():
        if _within(str(root), str(folder)):
            # the job's own check refuses it too, once its dir is claimed: refused before the dir is made
            raise CommandLineError(f"data.root={str(given)!r} is inside the {kind} {folder}, whose files are"
                                   f" {whose}; valid: a folder outside every run dir and sweep dir")
    _check_existing_generation(data, root)
    _check_data_location(cfg, data, root)
    _refuse_unreadable_data(given, root, data)
    return (str(root),)


def _refuse_unreadable_data(given: Any, root: Path, data: Any) -> None:
    """An existing data root whose split or class folders this process may not list, an image it may not read
    (a mode-000 folder or file), or an entry that is no regular file (a FIFO, socket or device, which would block
    the run or fail when a batch drew it): one line naming it, before the run dir. The data module met each only
    after the run dir was made (an image only when a batch drew it). One walk: a listing per folder and an
    access check per file, about what the job's fingerprint of the data costs; folders reached through links are
    the data module's to walk (it guards against their loops). A root found readable is not walked again by the
    same command (a sweep's jobs over one data root)."""
    from data.errors import not_regular

    if not root.is_dir():
        return  # still to be generated, or named by the data module's own checks
    splits = dict.fromkeys(str(data.get(key) or default) for key, default in (("train_split", "train"),
                                                                               ("val_split", "val")))
    walked = (os.path.realpath(root), tuple(splits))
    if walked in current().readable_data:
        return
    effective = os.access in os.supports_effective_ids
    valid = f"valid: make it readable (chmod -R u+rX {root}), or data.root=<another folder>"

    def listed(folder: Path) -> list[os.DirEntry[str]]:
        try:
            with os.scandir(folder) as entries:
                return [e for e in entries if not e.name.startswith(".")]
        except OSError as err:
            raise CommandLineError(f"data.root={str(given)!r} cannot be read: folder {folder} cannot be listed"
                                   f" ({(err.strerror or type(err).__name__).lower()}); {valid}") from None

    listed(root)
    folders = [root / split for split in splits if (root / split).is_dir()]
    while folders:
        for entry in listed(folders.pop()):
            if entry.is_dir(follow_symlinks=False):
                folders.append(Path(entry.path))
                continue
            kind = None if entry.is_file() else not_regular(entry.path)  # links followed, as the data module does
            if kind is not None:  # the data module's words for it
                through = f" (a symlink to {os.path.realpath(entry.path)})" if entry.is_symlink() else ""
                raise CommandLineError(f"{entry.path}{through} is {kind}, not a regular file: reading it as an image"
                                       " could block the run; remove it from the class folder")
            if entry.is_file() and not os.access(entry.path, os.R_OK, effective_ids=effective):
                raise CommandLineError(f"data.root={str(given)!r} cannot be read: image {entry.path} cannot be read"
                                       f" (permission denied); {valid}")
    current().readable_data.add(walked)


def _check_root_length(given: Any, root: Path) -> None:
    """A data root the file system can hold with its data: no folder name over ``NAME_MAX`` bytes, and a whole
    path with room below `PATH_BYTES` for the generator's files (``train/<class>/<index>.png``)."""
    limit = NAME_MAX
    long_name = next((p for p in root.parts if len(os.fsencode(p)) > limit), None)
    whole = len(os.fsencode(str(root)))
    if long_name is None and whole <= PATH_BYTES:
        return
    problem = (f"a folder name of {len(os.fsencode(long_name))} bytes ({long_name[:40]}...), more than the"
               f" {limit} a file system allows" if long_name is not None else
               f"a path of {whole} bytes, more than {PATH_BYTES} (PATH_MAX, less room for the data's own files)")
    raise CommandLineError(f"data.root={str(given)[:80]}{'...' if len(str(given)) > 80 else ''} has {problem};"
                           f" valid: folder names of at most {limit} bytes in a path of at most {PATH_BYTES}")


def _check_data_location(cfg: DictConfig, data: Any, root: Path) -> None:
    """Where ``data.root`` (``root``, the job's path of it) lies: no file in the place of one of its folders
    (``RPE_DATA_DIR`` naming a file), and, when the data are still to be generated, a folder above it this process
    may write (the data, and the generation lock beside them, are made there). The data module found both only
    after the run dir was made."""
    from data.generation import lock_path, read_marker
    from lifecycle.settings import env_source
    from storage.files import writable_folder

    generates = data.get("generator") is not None
    blocker = next((p for p in (*reversed(root.parents), root) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        paths = cfg.get("paths")
        data_dir = paths.get("data_dir") if isinstance(paths, DictConfig) else None
        name = env_source(cfg, "paths.data_dir") if data_dir is not None else None
        source = ""
        if name is not None:
            folder = Path(str(data_dir)).expanduser().absolute()
            if blocker == folder or blocker in folder.parents:
                source = f" (paths.data_dir is environment variable {name}={os.environ[name]!r})"
        action = "generated" if generates else "read"
        raise CommandLineError(f"data.root={root} cannot be {action} there: {blocker} is a file, where a folder"
                               f" belongs{source}; valid: a writable folder (paths.data_dir=... or data.root=...)")
    if not generates:
        return
    try:
        if read_marker(root) is not None:
            return  # generated already: nothing is made
    except Exception:  # a damaged marker: named by the data module's own checks
        return
    above = next((p for p in (root.parent, *root.parent.parents) if p.exists()), None)
    if above is not None and not writable_folder(above):
        where = "there" if above == root.parent else f"in it (for {root.parent})"
        raise CommandLineError(f"data.root={root} cannot be generated there: permission denied ({above} is not"
                               f" writable; the data and its lock file {lock_path(root).name} are made {where});"
                               " valid: a writable folder (paths.data_dir=... or data.root=...)")


def _check_existing_generation(data: Any, root: Path) -> None:
    """Refused here, before the run dir is made: generator settings the generator would refuse
    (`data.generation.check_generator_settings`: a region off the canvas, decreasing distance edges), and a
    data root already generated with other settings (``data.img_size=64`` on a 32-px root). The data
    module's own checks came only after the run dir was claimed, leaving a failed run for what is a config
    mismatch. Both are cheap; the content check stays with the data module."""
    from data.errors import DataConfigError
    from data.generation import (
        check_generator_settings,
        check_marker,
        describe_generator,
        read_marker,
        resolve_generator,
    )

    if data.get("generator") is None:
        return
    try:
        generator = resolve_generator(OmegaConf.to_container(data.generator, resolve=True))
    except Exception:  # a target that does not import: named by the data module's own checks
        return
    try:
        check_generator_settings(generator)
    except DataConfigError as err:
        raise CommandLineError(str(err)) from None
    try:
        marker = read_marker(root)
    except Exception:  # a damaged marker (`refuse_damaged_marker`, once the destinations are checked), an
        return  # unreadable root (`_refuse_unreadable_data`)
    if marker is None or generator is None:
        return
    try:
        check_marker(root, marker, describe_generator(generator))
    except DataConfigError as err:
        raise CommandLineError(str(err)) from None


def _job_data_root(cfg: DictConfig) -> tuple[Any, Path | None]:
    """``(data.root as given, the path the job will read it at)``; ``(None, None)`` without one. A relative root is
    resolved as the job will (`lifecycle.settings.job_path`)."""
    from lifecycle.settings import job_path

    data = cfg.get("data") or {}
    given = data.get("root") if hasattr(data, "get") else None
    return (None, None) if given is None else (given, Path(job_path(cfg, os.path.expanduser(str(given)))))


def refuse_damaged_marker(cfg: DictConfig) -> None:
    """A generated data root whose completion marker is damaged: one line before the run or sweep dir is made
    (the data module would refuse it only after), and after the checks of where the run writes, which say more."""
    from data.errors import DataConfigError
    from data.generation import read_marker

    _, root = _job_data_root(cfg)
    if root is None or cfg.data.get("generator") is None:
        return
    try:
        read_marker(root)
    except DataConfigError as err:
        raise CommandLineError(str(err)) from None
    except OSError:
        return  # an unreadable root: `_refuse_unreadable_data` names it


def compose_checked(config_name: str, overrides: list[str], devices: bool = True) -> DictConfig:
    """``configs/<config_name>.yaml`` with ``overrides`` as its command line composes it, checked as the
    command line is (`lifecycle.settings.check_settings`; for eval.py's config, unless not ``devices``,
    also `lifecycle.settings.check_devices`: an accelerator this machine lacks is one line before any
    run is touched), without Hydra's own node: for scripts that run eval.py's work in their own process."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException
    from omegaconf import open_dict

    from lifecycle.settings import check_devices, check_settings

    GlobalHydra.instance().clear()
    cfg: DictConfig | None = None
    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = compose(config_name, overrides=normalize_overrides(overrides), return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        refuse_unresolvable_overrides(cfg, normalize_overrides(overrides), config_name)
        check_settings(cfg, config_name)
        if config_name == "eval" and devices:
            check_devices(cfg)
        for node in ("paths", "testset", "data"):  # where a --set ${oc.env:...} goes: refused now, naming its key,
            if isinstance(cfg.get(node), DictConfig):  # not when the data are made
                OmegaConf.to_container(cfg[node], resolve=True)
        with open_dict(cfg):
            del cfg["hydra"]
        return cfg
    except (HydraException, OmegaConfBaseException) as err:
        # every script's --set goes through here: the same one line as train.py's command line (unknown key
        # with the valid keys, bad syntax, a missing environment variable), never OmegaConf's raw text
        raise CommandLineError(override_error(err, overrides, cfg, config_name)) from None
    except ValueError as err:
        if GROUP_NOT_A_STRING not in str(err):
            raise  # the checks' own one-line errors
        raise CommandLineError(override_error(err, overrides, cfg, config_name)) from None
    finally:
        GlobalHydra.instance().clear()


def _record_sweep_dir(sweep_dir: Path) -> None:
    """Keep the sweep dir's earlier grid (`keep_earlier_grid`) and note what this command changed in the dir
    (the current command's `sweep_dirs`)."""
    from storage.files import guarded

    folder = Path(os.path.abspath(sweep_dir))
    before = current().sweep_dirs.setdefault(folder, SweepDirBefore())
    grid = folder / "multirun.yaml"
    from storage.files import RunFileError, read_bounded_bytes

    try:
        with guarded(grid, "read"):
            before.grid = read_bounded_bytes(grid) if grid.is_file() else None
    except RunFileError as err:
        raise CommandLineError(_grid_problem(err)) from None
    before.grid_copy = keep_earlier_grid(folder)


def take_back_sweep_dir(sweep_dir: Path, submitit_before: set[str] | None) -> bool:
    """Undo what this command wrote into ``sweep_dir`` when none of its jobs was submitted: its grid
    (``multirun.yaml``, the earlier one put back), submitit's files that are not in ``submitit_before`` (the
    names ``.submitit/`` held before; None: no ``.submitit/``), and the folders the checks made, if left empty.
    Anything else in the dir stays. True when the sweep dir is gone."""
    folder = Path(os.path.abspath(sweep_dir))
    before = current().sweep_dirs.get(folder, SweepDirBefore())
    made, earlier, copy_kept = before.made, before.grid, before.grid_copy
    grid = folder / "multirun.yaml"
    with contextlib.suppress(OSError):
        if earlier is None:
            grid.unlink(missing_ok=True)
        else:
            from storage.files import atomic_write_bytes

            atomic_write_bytes(grid, earlier)
            if copy_kept is not None:
                copy_kept.unlink(missing_ok=True)  # the copy is the grid put back
    submitit = folder / ".submitit"
    if submitit.is_dir() and not submitit.is_symlink():
        for name in set(os.listdir(submitit)) - (submitit_before or set()):
            entry = submitit / name
            with contextlib.suppress(OSError):
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        if submitit_before is None:
            with contextlib.suppress(OSError):
                submitit.rmdir()
    if made is None:
        return False
    for level in (folder, *folder.parents):  # the folders the checks made, innermost first, while empty
        try:
            level.rmdir()
        except OSError:
            return False
        if level == made:
            return True
    return False


def _grid_problem(err: Exception) -> str:
    """The line for a sweep's grid record that cannot be read: too large (damaged), or not readable."""
    fix = "a sweep's grid records are small YAML files" if "is damaged" in str(err) else "make it readable"
    return f"{err}; valid: {fix}: move it away, or give another hydra.sweep.dir"


def keep_earlier_grid(sweep_dir: Path) -> Path | None:
    """Before Hydra replaces ``multirun.yaml`` with this launch's grid, keep the earlier one as
    ``multirun.<n>.yaml`` (unless an identical copy is kept already), so that the sweep's tables still
    expect every job an earlier launch asked for (another seed added later, or a launch refused). Returns
    the copy made."""
    from storage.files import RunFileError, atomic_write_bytes, guarded, read_bounded_bytes

    latest = sweep_dir / "multirun.yaml"
    def read(path: Path) -> bytes:
        with guarded(path, "read"):  # an unreadable file is named itself
            return read_bounded_bytes(path)

    try:
        with guarded(latest, "read"):
            if not latest.is_file():
                return None
        content = read(latest)
        with guarded(sweep_dir, "list"):
            kept = sorted((p for p in sweep_dir.glob("multirun.*.yaml") if p.name.split(".")[1].isdigit()),
                          key=lambda p: int(p.name.split(".")[1]))
        # every kept grid is read (each bounded): a damaged one is named now, as the sweep's tables would
        if content in [read(p) for p in kept]:
            return None
    except RunFileError as err:
        raise CommandLineError(_grid_problem(err)) from None
    copy = sweep_dir / f"multirun.{int(kept[-1].name.split('.')[1]) + 1 if kept else 1}.yaml"
    atomic_write_bytes(copy, content)
    return copy


@cache
def _option_tree(group: str, option: str) -> dict[str, Any]:
    """``configs/<group>/<option>.yaml`` with the options of its own group it extends (its defaults list) merged
    in, in Hydra's order: what the option sets, for naming which options fit a setting."""
    import yaml

    raw = yaml.safe_load((CONFIG_DIR / group / f"{option}.yaml").read_text()) or {}
    defaults = [d for d in raw.get("defaults") or [] if isinstance(d, str)]
    tree: dict[str, Any] = {}
    for entry in defaults if "_self_" in defaults else [*defaults, "_self_"]:
        if entry == "_self_":
            tree = _merged(tree, {k: v for k, v in raw.items() if k != "defaults"})
        elif (CONFIG_DIR / group / f"{entry}.yaml").is_file():
            tree = _merged(tree, _option_tree(group, entry))
    return tree


def _merged(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both else value
    return out


def _missing_key_line(name: str, overrides: list[str], cfg: DictConfig | None) -> str:
    """A ``${name}`` that is not a key of the config: the setting that reads it, and where the key belongs to a
    config group (``data.img_size``), the group's choice that lacks it and the choices that fit, e.g. a
    classification model (it reads ``${data.img_size}``) on detection data (``data=shapes_coco``)."""
    reads = re.compile(r"\$\{\s*" + re.escape(name) + r"\s*\}")
    where = setting_that_reads(re.escape(name), overrides, cfg)
    line = f"{where} reads ${{{name}}}, which is not a key of the config"
    valid = "a key that exists (e.g. ${paths.log_dir}, ${seed}) or the value itself"
    choices = OmegaConf.select(cfg, "hydra.runtime.choices") if cfg is not None else None
    groups = root_groups(str(OmegaConf.select(cfg, "hydra.job.config_name") or "train")) if choices else []
    group, _, inside = name.partition(".")
    if not inside or group not in groups or not choices.get(group):
        return f"{line}; valid: {valid}"
    choice = choices[group]

    def sets(option: str) -> bool:
        node: Any = _option_tree(group, option)
        for part in inside.split("."):
            node = node.get(part, _ABSENT) if isinstance(node, dict) else _ABSENT
        return node is not _ABSENT

    fits = [o for o in group_options(group) if sets(o)]
    line = f"{where} reads ${{{name}}}, which {group}={choice} does not set"
    reader = where.split(".", 1)[0]
    if reader != group and reader in groups and choices.get(reader):
        others = [o for o in group_options(reader) if not key_that_reads(_option_tree(reader, o), reads)]
        fit = [f"{group}={', '.join(fits)} with {reader}={choices[reader]}"] if fits else []
        fit += [f"{reader}={', '.join(others)} with {group}={choice}"] if others else []
        return (f"{line}: {reader}={choices[reader]} does not fit {group}={choice}; valid: {' or '.join(fit) or valid}")
    return f"{line}; valid: {group}={', '.join(fits)} (the {group} choices that set it), or the value itself" if (
        fits) else f"{line}; valid: {valid}"


_ABSENT = object()  # a key an option does not set


# Hydra's ValueError (not a HydraException) for ``group=null``
GROUP_NOT_A_STRING = "Config group override must be a string or a list"
# Config groups a run may leave out (``~group``): the job reads them as optional. What leaving one out means.
REMOVABLE_GROUPS = {"logger": "no logger; the run's numbers still go to metrics.json"}


def _null_group_line(overrides: list[str], config_name: str) -> str | None:
    """``group=null``, which Hydra refuses as "must be a string or a list. Got NoneType": the group, its choices
    and how to do without it (``~logger``, or leave it out for its default)."""
    given = next((m for o in overrides if (m := re.fullmatch(r"\+*([a-z_][\w/]*)=\s*(?i:null)\s*", o))
                  and ((CONFIG_DIR / m.group(1)).is_dir() or m.group(1).startswith("hydra/"))), None)
    if given is None:
        return None
    group = given.group(1)
    defaults = root_defaults(config_name)
    if group in REMOVABLE_GROUPS:
        tail = f"~{group} to leave the group out ({REMOVABLE_GROUPS[group]})"
    elif group in defaults and defaults[group] is None:
        tail = f"leave it out (no {group} is the default)"
    elif group in defaults:
        tail = f"leave it out for the default ({group}={defaults[group]})"
    else:
        tail = "leave it out for Hydra's default"
    options = group_options(group) if is_config_group(group) else []
    valid = f"{group}={', '.join(options)}, or {tail}" if options else tail
    return f"{given.group(0)} is not a choice of config group {group} (it takes one of its options); valid: {valid}"


# Launchers that run a sweep's jobs side by side, and the setting that says how many at once
_PARALLEL_KEYS = {"SlurmLauncher": "array_parallelism"}


def _unknown_key_line(full_key: str, valid: list[str], target: str = "") -> str:
    """``full_key`` is not a key of its node: the node's valid keys (never a ``+key`` hint: an added key is refused
    too unless something reads it). On Hydra's basic launcher (``target``), the launchers that run jobs in
    parallel."""
    where = full_key.rsplit(".", 1)[0] if "." in full_key else "the root config"
    line = f"{full_key} is not a config key; valid keys of {where}: {', '.join(sorted(valid))}"
    if where == "hydra.launcher" and target.endswith("BasicLauncher"):
        targets = {p.stem: _launcher_target(p) for p in sorted((CONFIG_DIR / "hydra" / "launcher").glob("*.yaml"))}
        parallel = [f"hydra/launcher={stem}{f' on {_SCHEDULER_COMMANDS[t][0]}' if t in _SCHEDULER_COMMANDS else ''}"
                    f" (hydra.launcher.{_PARALLEL_KEYS[t]}=<n>)" for stem, t in targets.items() if t in _PARALLEL_KEYS]
        line += "; Hydra's basic launcher runs the jobs one after another" + (
            f", {' or '.join(parallel)} runs them in parallel" if parallel else "")
    return line


def override_error(err: BaseException, overrides: list[str] | None = None, cfg: DictConfig | None = None,
                   config_name: str = "train") -> str:
    """One line from Hydra's multi-line override errors; names the valid keys where OmegaConf knows them.
    ``overrides``, the command line, and ``cfg``, the config as composed (when it was), let an unresolvable
    interpolation be traced to the key that holds it; ``config_name`` is the root config (its groups)."""
    cause = root_cause(err)
    env_line = missing_env_line(str(cause), overrides or []) or interpolation_loop_line(str(cause), overrides or [])
    if env_line is not None:
        return env_line
    if getattr(err, "override", None):  # a parse error: OverrideParseException
        return (f"override {err.override!r} is not valid override syntax: {' '.join(str(cause).split())}; a value"
                " with spaces, non-ASCII letters or other special characters must be quoted, e.g."
                " 'run_name=\"my run\"'")
    params_node = _params_node_line(str(err))
    if params_node is not None:
        return params_node
    missing_key = re.search(r"Interpolation key '([^']+)' not found", str(cause))
    if missing_key:  # OmegaConf names the missing key, not the setting that reads it
        return _missing_key_line(missing_key.group(1), overrides or [], cfg)
    resolver_line = resolver_error_line(cause, overrides or [], cfg)
    if resolver_line is not None:  # OmegaConf names the key that reads the value, not the one given, nor the fix
        return resolver_line
    if GROUP_NOT_A_STRING in str(cause):  # group=null
        null_line = _null_group_line(overrides or [], config_name)
        if null_line is not None:
            return null_line
    deleted = re.search(r"Could not delete from config\. '([^']+)' does not exist", str(err))
    if deleted:  # Hydra's ~key on a key whose value is null
        key = deleted.group(1)
        return (f"~{key} cannot delete {key}: it is null (or absent) already, which is its default; leave it out,"
                f" or set {key}=<value>")
    full_key = getattr(cause, "full_key", None)
    parent = getattr(cause, "parent_node", None)
    # "not in struct" on a config of files; "Key 'k' not in 'JobConf'" on one of Hydra's own (dataclass) nodes
    unknown = "not in struct" in str(cause) or re.match(r"Key '[^']*' not in '\w+'", str(cause))
    if full_key and isinstance(parent, DictConfig) and unknown:
        where = full_key.rsplit(".", 1)[0] if "." in full_key else "the root config"
        valid = sorted(str(k) for k in parent.keys())
        named = re.match(r"Key '([^']+)' (?:is )?not in", str(cause))
        if named and "." in named.group(1) and full_key.endswith(f".{named.group(1)}"):
            # a key holding dots, from a mapping given for its node: the node is the full key less that key
            return _mapping_key_line(named.group(1), full_key[:-len(named.group(1)) - 1], valid, overrides or [])
        if where == "model.mixup" and not valid:  # mixup is null: name timm's arguments instead of no keys
            from lifecycle.settings import mixup_keys

            return (f"{full_key} is not a config key; model.mixup is null (no mixup); valid keys of model.mixup"
                    f" (timm.data.Mixup's arguments): {', '.join(mixup_keys())} (a new key needs"
                    " +model.mixup.<key>=..., e.g. +model.mixup.mixup_alpha=0.2)")
        if not valid:  # a null node (data.train_transform on data without one), which Hydra's update makes an empty
            # mapping first, or an empty mapping (hydra.job.env_set): either takes only keys it has, and `+` adds one
            given = next((o for o in overrides or [] if o.lstrip("+~").split("=", 1)[0] in (where, full_key)), "")
            key, _, value = given.lstrip("+~").partition("=")
            if key == where:  # the node given as a mapping, which Hydra merges key by key (a null node takes it whole)
                return (f"{given} cannot set {full_key}: {where} is an empty mapping in this config, and Hydra sets a"
                        f" mapping given for it key by key, only the keys it has; valid: +{where}={value} (+ adds the"
                        " keys)")
            return (f"{full_key} is not a config key: {where} is null or empty in this config, so it has no keys;"
                    f" valid: +{full_key}={value or '...'} (+ adds the key)")
        head = full_key.split(".")[0]
        if where == "the root config" and head not in valid and is_config_group(head):  # eval.py's testset
            given = next((o for o in overrides or [] if o.lstrip("+~").startswith(f"{head}.")), full_key)
            return (f"{given} sets a key of the {head} config group, but no {head} option is chosen; valid:"
                    f" {head}=<one of: {', '.join(group_options(head))}> beside it")
        dotted = _dotted_key_line(where, valid, overrides or [])
        if dotted is not None:
            return dotted
        return _unknown_key_line(full_key, valid, str(parent.get("_target_", "")))
    return " ".join(f"{err} {cause}".split()) if cause is not err else " ".join(str(err).split())


def _params_node_line(message: str) -> str | None:
    """``hydra.sweeper.params={seed: choice(0,-1)}``: Hydra cannot store a sweep (choice, range, interval) inside a
    mapping it merges (its text names a type annotation); name the form that gives each key its sweep."""
    given = re.match(r"Error merging override (\+*hydra\.sweeper\.params=\{(.*)\})", message.strip(), re.DOTALL)
    if given is None:
        return None
    spelled = " ".join(f"'{k}={v}'" for k, v in _mapping_entries(given.group(2)))
    return (f"{given.group(1)} cannot be merged: Hydra cannot store a sweep (choice, range, interval) inside a"
            f" mapping; valid: one key an override, each given on its own: {spelled} (the sweeper takes a swept key"
            " given on the command line over its params entry)")


def _mapping_entries(body: str) -> list[tuple[str, str]]:
    """``(key, value)`` of each entry of a mapping override's text without its braces (``a: 1, b.c: choice(1,2)``),
    split at the commas outside brackets, each value as it is written on its own (`_unquoted`)."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(body + ","):
        depth += (char in "([{") - (char in ")]}")
        if char == "," and depth == 0:
            items.append(body[start:i].strip())
            start = i + 1
    return [(k.strip(), _unquoted(v.strip())) for k, _, v in (item.partition(":") for item in items if item)]


def _unquoted(value: str) -> str:
    """``value`` without one level of matching quotes: a sweep quoted inside a mapping is written bare on its own
    (quoted there, it would be a string)."""
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"" else value


def _mapping_key_line(key: str, where: str, valid: list[str], overrides: list[str]) -> str:
    """``key`` (holding dots: ``data.root``), given in a mapping for ``where`` (``hydra.sweeper.params={data.root:
    "choice(...)"}``), is no key of ``where``, whose fixed keys Hydra's merge keeps: OmegaConf named it as a key of
    ``where.data`` (its text split at the dot), listing ``where``'s own keys. Name ``where``'s keys and the spelling
    that sets ``key``."""
    given = next((o for o in overrides if re.fullmatch(rf"\+*{re.escape(where)}=\s*\{{.*\}}\s*", o, re.DOTALL)), None)
    entries = dict(_mapping_entries(given.split("=", 1)[1].strip()[1:-1])) if given is not None else {}
    value = entries.get(key, "<value>")
    if where == "hydra.sweeper.params":
        spelling = (f"'{key}={value}' given on its own (the optuna sweeper takes a swept key given on the command line"
                    " over its params entry)")
    else:
        spelling = f"one of {where}'s keys, or the key {key} where it is a setting ('{key}={value}')"
    return (f"{given or where} cannot set {key!r}: it is not a key of {where} (its keys: {', '.join(valid)}), and a"
            f" mapping given for {where} sets only those; valid: {spelling}")


def _dotted_key_line(where: str, valid: list[str], overrides: list[str]) -> str | None:
    """A mapping whose keys hold dots (the optuna sweeper's ``params``: ``rpe.method``) cannot be reached by a
    dotted override path, which Hydra splits at every dot: name the spelling that sets the key instead."""
    for given in overrides:
        key, _, value = given.lstrip("+~").partition("=")
        rest = key[len(where) + 1:] if key.startswith(f"{where}.") else ""
        if rest not in valid or "." not in rest:
            continue
        spelling = (f"'{rest}={value}' (the optuna sweeper takes a swept key given on the command line over its"
                    " params entry)" if where == "hydra.sweeper.params"
                    else f"'{where}={{{rest}: {value}}}' (Hydra merges a mapping given for {where} key by key)")
        return (f"{key} cannot be set by a dotted path: the key {rest!r} of {where} holds dots, which Hydra reads"
                f" as further levels; valid: {spelling}")
    return None


def check_command(argv: list[str], config_name: str, make: bool = True) -> tuple[list[str], dict[str, str]]:
    """Every command-line check of ``argv``: the command line as Hydra is to get it (``+`` added to new dotted
    keys, -m first) and the overrides that pin its checked output dir (`check_overrides`)."""
    if not is_ddp_worker(argv):  # a worker's command line is its parent's, checked, plus the settings it passes
        refuse_derived_hydra_keys(argv)  # as typed: the normalised form may add a '+'
        refuse_swept_hydra_keys(argv)
    argv = multirun_flag_first(normalize_overrides(argv))
    check_flags(argv)
    _refuse_foreign_search_path(argv)  # before its options are looked up: they would be named, not the path
    check_group_choices(argv, config_name)
    check_repeated_keys(argv)
    check_printed_config_resolves(argv, config_name)
    refuse_sweeps_when_printing(argv)
    try:
        return argv, check_overrides(argv, config_name, make)
    except ValueError as err:  # the checks' one-line errors (a model's or a setting's own, too)
        line = _naming_recipe_key(_naming_merged_recipes(str(err), argv), argv)
        if line == str(err):
            raise
        raise CommandLineError(line) from None


def _recipe_files(group: str, option: str) -> list[Path]:
    """The files of ``group``'s ``option`` (``sweep``, ``shift_mini``): its own and the shared bases (``_``-prefixed
    files of the group) its defaults list names."""
    own = CONFIG_DIR / group / f"{option}.yaml"
    if not own.is_file():
        return []
    defaults = OmegaConf.to_container(OmegaConf.load(own)).get("defaults") or []
    bases = [CONFIG_DIR / group / f"{item}.yaml" for item in defaults if isinstance(item, str) and item.startswith("_")]
    return [own, *(base for base in bases if base.is_file())]


def _naming_recipe_key(line: str, argv: list[str]) -> str:
    """``line``, a refusal that starts with a key the command line never gave, with the recipe (``sweep=``,
    ``experiment=``) that sets it named: the user sees where the key comes from, and that a choice given beside the
    recipe (``model=swin_micro``) is what it does not fit."""
    key = re.match(r"([A-Za-z_][\w.]*)(?:=| is )", line)
    if key is None or any(a.lstrip("+~").split("=", 1)[0] == key.group(1) for a in argv):
        return line
    for arg in argv:
        recipe = re.fullmatch(r"\+?(sweep|experiment)=(\w+)", arg)
        if recipe is None:
            continue
        for path in _recipe_files(*recipe.groups()):
            try:
                found = OmegaConf.select(OmegaConf.load(path), key.group(1), default=None,
                                         throw_on_resolution_failure=False)
            except OmegaConfBaseException:
                continue
            if found is not None:
                where = path.relative_to(CONFIG_DIR.parent)
                return (f"{line} ({key.group(1)} is set by {arg}, in {where}: the recipe's settings are made for its"
                        " own choices, which one given beside it may not fit)")
    return line


def _naming_merged_recipes(line: str, argv: list[str]) -> str:
    """``line``, a refusal of the config composed from ``experiment=[a,b]``, with the recipes named: Hydra merges
    them in order, each later one's keys winning, so a key the refusal names may come from a recipe, never from
    what the user typed."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    for arg in argv:
        if not re.match(r"\+?experiment=\s*\[", arg) or arg in line:
            continue
        try:
            recipes = OverridesParser.create().parse_override(arg).value()
        except HydraException:
            continue
        if isinstance(recipes, list) and len(recipes) > 1:
            return (f"{line} (the config merges the recipes of {arg}, in that order, each later one's keys winning:"
                    f" check that they fit together, or give one, e.g. experiment={recipes[-1]})")
    return line


def _overrides_among_flags(argv: list[str]) -> list[str]:
    """The overrides of ``argv``: what is neither one of Hydra's flags nor the value of one (`VALUE_FLAGS`)."""
    overrides, skip = [], False
    for arg in argv:
        if arg.startswith("-"):  # argparse never takes an option for a flag's value
            skip = arg.split("=", 1)[0] in VALUE_FLAGS and "=" not in arg
        elif skip:
            skip = False
        else:
            overrides.append(arg)
    return overrides


def refuse_derived_hydra_keys(argv: list[str]) -> None:
    """A key Hydra fills in itself from the command line (`HYDRA_DERIVED`: ``hydra.runtime.choices.rpe``, the
    job's number, its overrides) is what Hydra records of the command, not a setting: one line naming what to give
    instead, also for a command that only prints (Hydra's own text for it was 6 lines and exit 1)."""
    for arg in _overrides_among_flags(argv):
        key = arg.split("=", 1)[0].lstrip("+~")
        if not key.startswith("hydra.") or not _under(key.removeprefix("hydra."), HYDRA_DERIVED) or (
                key == "hydra.job.name"):  # Hydra takes a job's name from the command line (its log file's name)
            continue
        choice = re.fullmatch(r"hydra\.runtime\.choices\.([\w/]+)", key)
        value = arg.split("=", 1)[1] if "=" in arg else "<option>"
        instead = f"{choice.group(1)}={value}" if choice else "leave it out"
        raise CommandLineError(f"{arg} sets {key}, which Hydra fills in itself from the command line (what it records"
                               f" of the run), not a setting; valid: {instead}")


def refuse_swept_hydra_keys(argv: list[str]) -> None:
    """Hydra's own settings hold one value for the whole command: several (``hydra.sweep.dir=a,b``,
    ``+hydra.job.env_set.X=a,b``) were Hydra's "Sweeping over Hydra's configuration is not supported" after the
    sweep dir was made, or the first value taken without a word. One line, before any dir."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    for arg in _overrides_among_flags(argv):
        if not arg.lstrip("+~").startswith("hydra.") or arg.lstrip("+~").startswith("hydra.sweeper.params."):
            continue  # a sweeper's params are the values a sweep draws from
        try:
            [parsed] = OverridesParser.create().parse_overrides([arg])
        except (HydraException, ValueError):
            continue  # Hydra names a malformed override itself
        if parsed.is_sweep_override():
            key = parsed.get_key_element().lstrip("+~")
            raise CommandLineError(f"{arg} gives {key} several values, but Hydra's own settings hold one value for the"
                                   f" whole command; valid: one value ({key}=<value>); a sweep varies the run's"
                                   " settings (-m seed=0,1)")


def check_printed_config_resolves(argv: list[str], config_name: str) -> None:
    """``--cfg ... --resolve`` prints the config with every interpolation resolved: one that cannot be (an unset
    environment variable, a missing key) is one line naming it, not Hydra's traceback. Without ``--resolve``,
    or where the composition itself fails (Hydra's own short error), Hydra prints as it does."""
    if "--resolve" not in argv or not prints_only(argv):
        return
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = compose(config_name, overrides=_overrides_among_flags(argv), return_hydra_config=True)
    except Exception:  # noqa: BLE001 - Hydra names a bad override itself when it composes again
        return
    finally:
        GlobalHydra.instance().clear()
    try:
        HydraConfig.instance().set_config(cfg)
        # the job's part: Hydra's own node holds values it fills only when it runs (hydra.job.num)
        OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"]), resolve=True)
    except OmegaConfBaseException as err:
        raise CommandLineError(f"--resolve cannot print the config: {one_line(err)}") from None


def refuse_sweeps_when_printing(argv: list[str]) -> None:
    """``--cfg`` prints one config, and Hydra's advice for a swept value there (add ``--multirun``) is refused with
    it: one line asking for one value instead."""
    if not any(arg.split("=", 1)[0] in ("-c", "--cfg") for arg in argv):
        return
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(_overrides_among_flags(argv))
    except HydraException:
        return  # Hydra names a malformed override itself
    swept = next((o.input_line for o in parsed if o.is_sweep_override()), None)
    if swept is not None:
        raise CommandLineError(f"{swept} sweeps over values, and --cfg prints the config of one job: give one value"
                               " (e.g. the first) to print that job's config")


def check_only_commands(argv: list[str]) -> list[list[str]]:
    """The commands of a `CHECK_FLAG` command line, separated by ``--`` (one process checks them all, importing
    the project once); a print-only flag is refused, as it would skip the checks."""
    commands: list[list[str]] = [[]]
    for arg in argv:
        if arg == "--":
            commands.append([])
        elif arg != CHECK_FLAG:
            commands[-1].append(arg)
    if any(prints_only(command) for command in commands):
        raise CommandLineError(f"{CHECK_FLAG} checks commands that run, and Hydra's --cfg, --help and --info only"
                               f" print; valid: {CHECK_FLAG} <settings of a run or a sweep> [-- <another's> ...]")
    return commands


def cli(hydra_main: Any, config_name: str = "train", after: Any = None, interrupted: Any = None) -> None:
    """Entry point: reject bad choices, keys and values in one line, then hand over to Hydra.

    ``after()`` runs once Hydra returns and may return an exit code (train.py's: 1 when sweep jobs failed).
    ``interrupted(signum)``, where given, has the stop signals for the whole of Hydra's run (between a sweep's
    jobs too, where they would otherwise end the process without a word) and reports one that came outside a job.
    With `CHECK_FLAG` only the checks run, on each command of `check_only_commands`, writing nothing: exit 0 when
    every command would start, else the first refusal's line and exit 2. The command's state across its jobs
    (failed jobs, sweep dirs, stop signals) is its own (`lifecycle.command.command_scope`).
    """
    with command_scope():
        _check_and_run(hydra_main, config_name, after, interrupted)


def _check_and_run(hydra_main: Any, config_name: str, after: Any, interrupted: Any) -> None:
    """`cli`'s body, inside the command's scope."""
    check_only = CHECK_FLAG in sys.argv[1:]
    try:
        if check_only:
            for command in check_only_commands(sys.argv[1:]):
                check_command(command, config_name, make=False)
            return
        sys.argv[1:], pins = check_command(sys.argv[1:], config_name)
    except (CommandLineError, ValueError) as err:
        say(f"error: {one_line(err)}", stream=sys.stderr)
        sys.exit(2)
    except OSError as err:  # the storage's answer while checking where the run goes (an unreadable folder)
        from storage.files import os_error_line

        say(f"error: {os_error_line(err)}", stream=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C while the command line is checked: no job has started, so no traceback
        import signal

        say("error: interrupted by SIGINT while the command line was checked, before any run or evaluation began:"
            " run the same command again", stream=sys.stderr)
        sys.exit(128 + signal.SIGINT)
    sys.argv[1:] = with_pins(sys.argv[1:], pins)
    if interrupted is None:
        try:
            hydra_main()
        except KeyboardInterrupt:  # a job's own Ctrl-C is its to report; this one came while Hydra composed it
            import signal

            say("error: interrupted by SIGINT; nothing was written (a test-set result is written whole or not at"
                " all): run the same command again", stream=sys.stderr)
            sys.exit(128 + signal.SIGINT)
    else:
        from lifecycle.checkpoints import RunInterrupted
        from lifecycle.signals import install_stop_signals, restore_stop_signals

        install_stop_signals()
        try:
            hydra_main()
        except RunInterrupted as err:  # a job reports its own interruption and exits: this one came between jobs
            interrupted(err.signum)
        except KeyboardInterrupt:  # Ctrl-C while Hydra composed a job or launched the sweep, outside any job
            import signal

            interrupted(int(signal.SIGINT))
        finally:
            restore_stop_signals()
    code = after() if after is not None else 0
    if code:
        sys.exit(code)
