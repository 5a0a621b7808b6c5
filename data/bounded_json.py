"""Bounded reading of the JSON records the project writes: run records, result files, completion markers.

Here, below both ``data`` and ``models``, so that a data root's completion marker (`data.generation`) and a
run's records (`storage.files`) are read by the same rules without the data layer depending on the
run lifecycle. Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from itertools import accumulate, repeat
from typing import Any

# Bounds of a JSON record as read (run.json, metrics.json, failed.json, test-set results, completion markers):
# the records this project writes are a few KiB, nested a few levels. Past the depth, Python's parser fails
# with a RecursionError (or a reader's later walk over the value does); past the size, reading it costs memory.
MAX_JSON_BYTES = 16 * 2**20
# A run's or a sweep's YAML record (config.yaml, multirun.yaml: a few KiB); YAML parses far slower than JSON
MAX_YAML_BYTES = 2**20
MAX_JSON_DEPTH = 100


class JsonBoundsError(ValueError):
    """A JSON text past the reader's bounds; the message says which (``nested deeper than 100 levels``)."""


# A JSON string once its escapes are gone (an unterminated one runs to the end): removed before brackets are
# counted, as brackets inside strings do not nest. Without escapes it cannot backtrack: a search is linear.
_JSON_STRING = re.compile(r'"[^"]*(?:"|\Z)')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = str.maketrans({"[": "\x02", "{": "\x02", "]": "\x00", "}": "\x00"})


def json_depth_exceeds(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the arrays and objects of the JSON ``text`` nest deeper than ``limit``, found without parsing.

    Linear in the text and recursion-free (regular expressions and iterators in C), so it is safe on any
    input; for text that is not JSON the answer is only an estimate, and the parser names that text's fault.
    """
    # escaped backslashes first, then escaped quotes: no quote left inside a string is an escaped one
    unescaped = text.replace("\\\\", "").replace('\\"', "")
    outside = _JSON_STRING.sub("", unescaped)
    if outside.count("[") + outside.count("{") <= limit:
        return False  # not enough openings to nest deeper: the common case, at the cost of two counts
    steps = _NOT_BRACKET.sub("", outside).translate(_DEPTH_STEP).encode()  # an opening 2, a closing 0
    depths = accumulate(map(int.__sub__, steps, repeat(1)))  # the depth after each bracket
    return next(filter(limit.__lt__, depths), None) is not None


def read_json_bytes(path: str | os.PathLike, limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of the record ``path`` (a regular file), at most ``limit`` of them, else `JsonBoundsError`.

    Opened without blocking and checked to be a regular file once open: a FIFO or a device put in its place
    after a check would otherwise hang the read or never end it. ``OSError`` is the caller's to report.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise JsonBoundsError("it is not a plain file")
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise JsonBoundsError(f"larger than {limit // 2**20} MiB ({max(info.st_size, len(raw))} bytes), which no"
                              " record this project writes is")
    return raw


def loads_bounded(raw: bytes | str, depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(raw)``, refusing text nested deeper than ``depth`` (`JsonBoundsError`) before it is parsed.

    Also raises ``json.JSONDecodeError`` and ``UnicodeDecodeError`` (both ``ValueError``) for text that is no JSON.
    """
    text = raw if isinstance(raw, str) else raw.decode(json.detect_encoding(raw), "surrogatepass")
    if json_depth_exceeds(text, depth):
        raise JsonBoundsError(f"nested deeper than {depth} levels, which no record this project writes is")
    try:
        return json.loads(text)
    except RecursionError:  # the interpreter's stack was nearly used up already: the same fault, named the same
        raise JsonBoundsError(f"nested too deep to be read here (the limit is {depth} levels)") from None
    except ValueError as err:
        problem = too_many_digits(err)
        if not problem:
            raise
        raise JsonBoundsError(f"{problem}, which no record this project writes does") from None


def too_many_digits(err: ValueError) -> str:
    """``"it holds an integer of more than 4300 digits"`` where ``err`` is the parser's refusal of valid JSON
    whose number has more digits than Python converts (``sys.get_int_max_str_digits()``), else ''."""
    if isinstance(err, json.JSONDecodeError) or "integer string conversion" not in str(err):
        return ""
    return f"it holds an integer of more than {sys.get_int_max_str_digits()} digits"
