"""What every command says: one ``error: ...`` line for a user's error, printed so that a closed terminal never
turns it into a traceback. The lowest layer of the run package: it imports none of its modules."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class CommandLineError(ValueError):
    """A bad command-line choice, reported in one line."""


def setting_that_reads(inside: str, overrides: list[str], cfg: DictConfig | None = None) -> str:
    """``key=value`` of the first override holding an interpolation ``${<inside>}`` (a regex), else the key of
    the first value of the composed ``cfg`` (unresolved) holding it, else "a config value": OmegaConf names what
    could not be resolved, not the setting that asked for it."""
    reads = re.compile(r"\$\{\s*" + inside + r"\s*\}")
    given = next((o for o in overrides if reads.search(o)), None)
    if given:
        return f"{given.lstrip('+~').split('=', 1)[0]}={given.split('=', 1)[1]}"
    return (key_that_reads(OmegaConf.to_container(cfg, resolve=False), reads) if cfg is not None else None) or (
        "a config value")


def key_that_reads(node: Any, reads: re.Pattern[str], prefix: str = "") -> str | None:
    """The dotted key of the first string in ``node`` (a plain container) that ``reads`` matches."""
    if isinstance(node, str):
        return prefix if reads.search(node) else None
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    return next((found for key, value in items
                 if (found := key_that_reads(value, reads, f"{prefix}.{key}" if prefix else str(key)))), None)


def missing_env_line(message: str, overrides: list[str], cfg: DictConfig | None = None) -> str | None:
    """An ``${oc.env:NAME}`` without a default whose variable is not set: OmegaConf names neither the key that
    reads it nor the fix (its text is a KeyError's), so name both (the override, else the key of ``cfg``)."""
    missing = re.search(r"Environment variable '([^']+)' not found", message)
    if not missing:
        return None
    name = missing.group(1)
    where = setting_that_reads(r"oc\.env:\s*" + re.escape(name), overrides, cfg)
    return (f"{where} reads environment variable {name}, which is not set; valid: set it (export {name}=...),"
            f" give a default (${{oc.env:{name},<default>}}) or give the value itself")


def interpolation_loop_line(message: str, overrides: list[str]) -> str | None:
    """OmegaConf's "RecursionError raised while resolving interpolation ... full_key: <key>": interpolations that
    read each other in a loop (``run_name=${hydra:job.override_dirname}``, which lists run_name's own override).
    The setting that reads ``<key>``, and the fix."""
    if "RecursionError raised while resolving interpolation" not in message:
        return None
    found = re.search(r"full_key: (\S+)", message)
    key = found.group(1) if found else "a value"
    inside = (r"hydra:\s*" + re.escape(key.removeprefix("hydra.")) if key.startswith("hydra.")
              else re.escape(key))
    where = setting_that_reads(inside, overrides)
    return (f"{where} reads {key}, whose value reads it back (an interpolation loop: {key} is made from the"
            " command line's overrides); valid: give the value itself")


def user_error_types() -> tuple[type[BaseException], ...]:
    """Errors that are the user's input (reported in one line), not the program's faults."""
    from hydra.errors import HydraException
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    # OSError: the storage's answer (no space, read-only, a file in the way), which names its path
    return (ValueError, OSError, OmegaConfBaseException, HydraException, MisconfigurationException)


def root_cause(err: BaseException) -> BaseException:
    while err.__cause__ is not None:
        err = err.__cause__
    return err


def one_line(err: BaseException) -> str:
    cause = root_cause(err)
    # a ${oc.env:NAME} resolved late (a script's --set paths.data_dir=...): the fix, not OmegaConf's KeyError text
    env_line = missing_env_line(str(cause), []) or interpolation_loop_line(str(cause), [])
    if env_line is not None:
        return env_line
    from storage.files import error_line

    return error_line(cause)


def say(*lines: str, stream: Any = None) -> None:
    """Print, never failing: a closed terminal or pipe must not turn a report into a traceback."""
    try:
        print(*lines, sep="\n", file=stream or sys.stdout, flush=True)
    except (OSError, ValueError):
        pass


def report_user_error(err: BaseException) -> None:
    """Print a one-line ``error: ...`` (the traceback only with HYDRA_FULL_ERROR=1) and exit 2."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise err
    say(f"error: {one_line(err)}", stream=sys.stderr)
    sys.exit(2)
