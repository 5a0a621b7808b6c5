"""Exceptions raised by the data package, and a PIL image loader that names the file it cannot read."""

from __future__ import annotations

from pathlib import Path

from PIL import Image


class DataConfigError(ValueError):
    """A data config points at a dataset that is missing, incomplete or inconsistent.

    Messages are one line and name the offending path/setting plus what was expected, so they read well at the
    bottom of a Hydra/Lightning traceback. Raised in a DataLoader worker, PyTorch re-creates the error in the
    main process from ``"Caught ... Original Traceback ... <Class>: <message>"``; the original one-line
    message is kept instead.
    """

    def __init__(self, message: str = "", *args: object) -> None:
        if message.startswith("Caught ") and "\nOriginal Traceback" in message:
            last = [line for line in message.splitlines() if line.strip()][-1]
            message = last.split(": ", 1)[1] if ": " in last else last
        super().__init__(message, *args)


def load_rgb_image(path: str | Path) -> Image.Image:
    """Open ``path`` as RGB; a missing, truncated or non-image file is a `DataConfigError` naming the file."""
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (OSError, SyntaxError, ValueError) as err:  # PIL reports damaged files through all three
        reason = " ".join(str(err).split()) or type(err).__name__
        raise DataConfigError(f"image {path} cannot be read ({type(err).__name__}: {reason})") from None
