"""Exceptions raised by the data package."""

from __future__ import annotations


class DataConfigError(ValueError):
    """A data config points at a dataset that is missing, incomplete or inconsistent.

    Messages are one line and name the offending path/setting plus what was expected, so they read well at the
    bottom of a Hydra/Lightning traceback.
    """
