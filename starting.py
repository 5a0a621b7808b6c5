"""Ctrl-C while train.py or eval.py starts: the imports (torch, Lightning) take seconds, and Python's own
SIGINT handling would end them with a ``KeyboardInterrupt`` traceback through the import machinery.

The first import of those entry points, so it uses the standard library only: `guard_imports` makes SIGINT one
line and exit 130 (128 + SIGINT, as a shell reports it) until `imported` hands SIGINT back to Python, whose
``KeyboardInterrupt`` the command-line checks and Lightning handle from then on.
"""

from __future__ import annotations

import signal
import sys
from typing import Any


def _interrupted(signum: int, frame: Any) -> None:
    try:
        print("error: interrupted by SIGINT while starting, before anything was checked or written: run the same"
              " command again", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # a closed terminal: the exit code still tells
        pass
    raise SystemExit(128 + signum)


def guard_imports(name: str) -> None:
    """From now on SIGINT is one line and exit 130, where ``name`` (the caller's ``__name__``) says it runs as a
    script; a module that merely imports it (a test) keeps Python's handling. An ignored SIGINT stays ignored."""
    if name == "__main__" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted)


def imported() -> None:
    """The imports are done: SIGINT raises ``KeyboardInterrupt`` again (where `guard_imports` took it)."""
    if signal.getsignal(signal.SIGINT) is _interrupted:
        signal.signal(signal.SIGINT, signal.default_int_handler)
