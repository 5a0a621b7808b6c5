"""Encodings beyond the bucket tables of `rpe.tables`, one module each.

Importing this package imports every module in it, and each module registers itself with
`rpe.registry`; adding an encoding is adding a file here (docs/design.md).
"""

from __future__ import annotations

import importlib
import pkgutil

from .. import tables  # noqa: F401  (the bucket tables register first: preset and method order)

for _module in sorted(info.name for info in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")
