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


# OmegaConf's text for an error a resolver raised: "<Type> raised while resolving interpolation: <why>"
_RESOLVER_ERROR = re.compile(r"\w+ raised while resolving interpolation: (?P<why>.*?)\s*(?:full_key:|$)", re.S)
_UNKNOWN_RESOLVER = re.compile(r"Unsupported interpolation type (?P<name>[\w.]+)")
# what each resolver takes, by its name: the forms the line suggests ({args}: the arguments as given)
_RESOLVER_FORMS = {
    "oc.decode": "${{oc.decode:'{args}'}} (oc.decode takes a string: quote it)",
    "oc.create": "${{oc.create:{{<key>: <value>}}}} or ${{oc.create:[<item>, <item>]}} (oc.create makes a mapping or a"
                 " list)",
    "oc.select": "${{oc.select:<key>,<default>}} (a key of the config, then the value when it is absent)",
    "oc.deprecated": "${{oc.deprecated:<new key>}} (the key, as a string, that the value moved to)",
    "oc.env": "${{oc.env:NAME,<default>}}",
    "oc.dict.keys": "${{oc.dict.keys:<key of a mapping>}}",
    "oc.dict.values": "${{oc.dict.values:<key of a mapping>}}",
    "hydra": "${{hydra:<key of Hydra's node>}} (e.g. ${{hydra:runtime.output_dir}})",
    "job_dirname": "${{job_dirname:${{hydra:job.override_dirname}}}} (a string)",
}


def plain_value(tree: Any, key: str, missing: Any = None) -> Any:
    """The value at dotted ``key`` of ``tree`` (a plain container, interpolations unresolved), else ``missing``."""
    node = tree
    for part in key.split(".") if key else []:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return missing
    return node


def _resolver_calls(text: str) -> list[tuple[str, str]]:
    """``(name, arguments)`` of each ``${name:arguments}`` in ``text``, outermost first (braces balanced)."""
    calls = []
    for start in re.finditer(r"\$\{\s*([\w.]+)\s*:", text):
        depth, end = 1, start.end()
        while end < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        calls.append((start.group(1), text[start.end():end - 1] if not depth else text[start.end():]))
    return calls


def interpolation_start(cfg: DictConfig, key: str) -> tuple[str, str]:
    """The key whose value holds the resolver call that ``key`` reads, through node interpolations
    (``data.generator.img_size`` is ``${..img_size}``, which reads ``data.img_size=${oc.decode:48}``), and that
    value: where a failure while resolving ``key`` starts. ``(key, its value)`` where the chain ends elsewhere."""
    tree = OmegaConf.to_container(cfg, resolve=False)
    seen: set[str] = set()
    value = plain_value(tree, key)
    while isinstance(value, str) and key not in seen:
        seen.add(key)
        link = re.fullmatch(r"\s*\$\{\s*(\.*)([\w.]+)\s*\}\s*", value)  # ${a.b}, ${.b}, ${..b}: another node
        if link is None:
            break
        dots, rest = link.groups()
        parts = key.split(".")[:-1]  # the node holding key: where a relative interpolation starts
        key = ".".join(parts[:len(parts) - (len(dots) - 1)] + [rest]) if dots else rest
        value = plain_value(tree, key)
    return key, value if isinstance(value, str) else str(value)


def resolver_error_line(err: BaseException, overrides: list[str], cfg: DictConfig | None = None) -> str | None:
    """An error a resolver raised (``data.img_size=${oc.decode:48}``: oc.decode takes a string), or an unknown
    resolver: OmegaConf names the key that interpolates the value (``data.generator.img_size``), or none, and gives
    no fix. Name the setting the user gave (traced through ``cfg``), the resolver, what it got and the valid forms."""
    message = str(err)
    failed = _RESOLVER_ERROR.match(message)
    unknown = _UNKNOWN_RESOLVER.match(message)
    if not failed and not unknown:
        return None
    read_as = str(getattr(err, "full_key", None) or "")
    key, value = interpolation_start(cfg, read_as) if cfg is not None and read_as else (read_as, "")
    given = next((o.lstrip("+~") for o in overrides if "=" in o and o.lstrip("+~").split("=", 1)[0] == key), None)
    if not key:  # raised where no key was read (a check resolving a value of its own): the override calling it
        given = next((o.lstrip("+~") for o in overrides for n, _ in _resolver_calls(o)
                      if (unknown and n == unknown.group("name")) or (not unknown and n in message)), None)
        key, value = given.split("=", 1) if given else ("", "")
    calls = _resolver_calls(value)
    name, args = next(((n, a) for n, a in calls if (unknown and n == unknown.group("name"))
                       or (not unknown and n in message)), calls[0] if calls else ("", ""))
    where = given or (f"{key}={value}" if key and value else key or "a config value")
    reader = f" ({read_as} reads it)" if read_as and read_as != key else ""
    itself = f"{key}=<value>" if key else "the value itself"
    if unknown:
        from omegaconf.basecontainer import BaseContainer

        known = sorted(BaseContainer._resolvers)  # the resolvers registered in this process
        return (f"{where}{reader} calls resolver {unknown.group('name')}, which does not exist; valid: one of"
                f" {', '.join(known)}, or {itself}")
    why = " ".join(failed.group("why").split()).rstrip(";")
    plain = args.strip().strip("'\"")
    whole = re.fullmatch(r"\s*\$\{\s*" + re.escape(name) + r"\s*:" + re.escape(args) + r"\}\s*", value)
    if key and plain and whole and name in ("oc.decode", "oc.create"):  # the value is the call: what it decodes
        itself = f"{key}={plain}"
    form = _RESOLVER_FORMS.get(name, f"${{{name}:...}} with the arguments {name} takes" if name else "")
    form = form.format(args=plain or "<value>")
    resolver = f"resolver {name} got {args.strip()!r}: " if name else ""
    if message.startswith("GrammarParseError") and name:  # the resolver parses its text as a value: not one
        itself = f"{key}=<value>" if key else "the value itself"
        resolver = f"resolver {name} got {args.strip()!r}, which it parses as a value, and that text is none: "
        form = (f"${{{name}:'<value>'}} whose text is a whole value, its brackets, braces and quotes closed (e.g."
                f" ${{{name}:'[1, 2]'}})")
    return f"{where}{reader} cannot be resolved: {resolver}{why}; valid: {itself}" + (f", or {form}" if form else "")


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
    env_line = (missing_env_line(str(cause), []) or interpolation_loop_line(str(cause), [])
                or resolver_error_line(cause, []))
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
