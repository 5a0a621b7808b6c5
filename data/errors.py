"""Exceptions raised by the data package, and a PIL image loader that names the file it cannot read."""

from __future__ import annotations

import errno
import os
import stat
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


def data_root_path(root: object, setting: str = "data.root") -> Path:
    """``root`` as the folder it names (``~`` expanded). Null or blank is a `DataConfigError`: ``str(None)`` would
    make a folder called ``None``, and ``""`` the current directory, which generation would fill."""
    if root is None or not str(root).strip():
        raise DataConfigError(f"{setting}={root!r} names no folder; valid: the dataset's folder (a path), or leave"
                              f" {setting} out for the config's default")
    return Path(str(root)).expanduser()


def load_rgb_image(path: str | Path) -> Image.Image:
    """Open ``path`` as 8-bit RGB (16-bit images scaled down). A missing, truncated, corrupt or non-image file,
    and an image above PIL's decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS`` pixels), are a
    `DataConfigError` naming the file.

    PIL reports damaged files through many exception types (OSError, SyntaxError, ValueError, struct.error,
    EOFError, IndexError, ...): every failure to decode this one file is reported as this file's.
    """
    try:
        with Image.open(path) as image:
            limit = Image.MAX_IMAGE_PIXELS
            # PIL only warns between the limit and twice it; such an image is refused all the same.
            if limit and image.width * image.height > limit:
                raise _too_large(path, f"{image.width}x{image.height} = {image.width * image.height} pixels")
            return _to_rgb(path, image)
    except DataConfigError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:  # the warning: under -W error
        raise _too_large(path, " ".join(str(err).split())) from None
    except Exception as err:  # any decoding failure (see the docstring) is reported as this file's
        raise _unreadable(path, err) from None


def image_size(path: str | Path) -> tuple[int, int]:
    """``(width, height)`` of the image at ``path`` from its header alone (no pixels decoded); a file PIL cannot
    identify is a `DataConfigError` naming it, as in `load_rgb_image`."""
    try:
        with Image.open(path) as image:
            return image.size
    except Exception as err:  # any failure to identify this one file is reported as this file's
        raise _unreadable(path, err) from None


def _unreadable(path: str | Path, err: Exception) -> DataConfigError:
    reason = " ".join(str(err).split()) or type(err).__name__
    return DataConfigError(f"image {path} cannot be read ({type(err).__name__}: {reason})")


def _to_rgb(path: str | Path, image: Image.Image) -> Image.Image:
    """``image`` as 8-bit RGB. PIL's own conversion clips 16-bit grey values above 255 (most of the range) to
    white, so 16-bit images are scaled to 8 bits; 32-bit integer or float pixels have no known range."""
    if image.mode.startswith("I;16"):
        import numpy as np

        values = np.asarray(image, dtype=np.uint32)
        return Image.fromarray(((values * 255 + 32767) // 65535).astype(np.uint8), mode="L").convert("RGB")
    if image.mode in ("I", "F"):
        kind = "32-bit integer" if image.mode == "I" else "floating-point"
        raise DataConfigError(f"image {path} has {kind} pixels (PIL mode {image.mode}), whose range of values is"
                              " not known; valid: 8-bit or 16-bit images (convert it to 8-bit)")
    return image.convert("RGB")


def _too_large(path: str | Path, size: str) -> DataConfigError:
    return DataConfigError(
        f"image {path} is too large to decode safely ({size}; PIL's decompression-bomb limit is "
        f"{Image.MAX_IMAGE_PIXELS} pixels, PIL.Image.MAX_IMAGE_PIXELS); downscale or remove it"
    )


def not_regular(path: str) -> str | None:
    """What stands at ``path`` (links followed) when it is neither a regular file nor a folder, else None (a
    missing target is the dangling-link check's)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"


def absent_folder(path: str | os.PathLike) -> str:
    """Why no folder is at ``path``, in words after its name: ``does not exist``, or ``is not a folder (it is a
    FIFO (named pipe))`` where something else stands there (a file, a FIFO): never "does not exist" of a path
    that exists."""
    if not os.path.lexists(path):
        return "does not exist"
    if not os.path.exists(path):
        try:
            os.stat(path)
        except OSError as err:
            if err.errno == errno.ELOOP:
                return "is a symlink loop (its links lead back to themselves)"
        return f"is a dangling symlink (to {os.readlink(path)})"
    return f"is not a folder (it is {not_regular(os.fspath(path)) or 'a file'})"
