"""Reading a checkpoint file without running code from it, and finding a non-finite tensor: what the
checkpoint converters (`models.rope_vit`, and through it `models.rope_swin`; `models.detr.reference`) and the
run package's readers of run dirs (`lifecycle.run_config`) share. One `RunConfigError` line for anything refused."""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from models.deit import ModelConfigError
from storage.files import describe_non_file, entry_exists


class RunConfigError(ModelConfigError):
    """A run dir's config or checkpoint that cannot be loaded safely; the message is one line."""


def first_non_finite(module: torch.nn.Module | Mapping[str, torch.Tensor]) -> tuple[str, int, int] | None:
    """``(name, non-finite count, size)`` of the first parameter or buffer holding a NaN or inf, or None.
    ``module`` may also be a state dict (its tensors in its order), checked before anything is loaded."""
    if isinstance(module, torch.nn.Module):
        tensors = [*module.named_parameters(), *module.named_buffers()]
    else:
        tensors = list(module.items())
    for name, tensor in tensors:
        if tensor.is_floating_point() or tensor.is_complex():
            bad = int((~torch.isfinite(tensor.detach())).sum())
            if bad:
                return name, bad, tensor.numel()
    return None


def read_checkpoint_file(
    path: str | Path, safe_globals: list[Any] | tuple[Any, ...] = (), error: type[Exception] = RunConfigError
) -> Any:
    """``torch.load(path, weights_only=True)`` allowing exactly the classes in ``safe_globals``; anything
    unreadable (missing, truncated, random bytes, a pickle needing other code) is one ``error`` line."""
    if not Path(path).is_file():
        if entry_exists(path):
            raise error(f"checkpoint {path} is not a checkpoint file: {describe_non_file(Path(path))}")
        raise error(f"checkpoint {path} does not exist")
    try:
        # torch's own warnings about the pickle (its protocol) come before our one line: the error says it
        with warnings.catch_warnings(), torch.serialization.safe_globals(list(safe_globals)):
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except PermissionError:  # the storage's answer: the file may well be sound (a truncated one is an OSError too)
        raise error(f"checkpoint {path} cannot be read: permission denied; valid: a checkpoint this user may read"
                    ) from None
    except Exception as err:  # never unpickle arbitrarily
        text = str(err)
        blocked = re.search(r"GLOBAL ([\w.]+)", text)
        reason = (
            f"it needs code to load (global {blocked.group(1)}), which weights_only=True refuses" if blocked
            else "corrupt, truncated, not written by torch.save, or a pickle of objects other than tensors"
                 f" (refused: loading it could run code): {type(err).__name__}"
        )
        raise error(f"checkpoint {path} is not a readable PyTorch checkpoint ({reason})") from None
