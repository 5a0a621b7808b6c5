"""Text that fits a figure: lines broken to a width in pixels, measured as matplotlib draws them."""

from __future__ import annotations

import functools
import re
from typing import Any

# Where a line may break: after a space, a comma, an underscore, a dash or a slash, and before an "@"
# (a test set's transform: relational_right@interpolate)
LABEL_BREAKS = r"(?<=[ ,_\-/])|(?=@)"


@functools.lru_cache(maxsize=4)
def _renderer(dpi: float) -> Any:
    from matplotlib.backends.backend_agg import RendererAgg

    return RendererAgg(1, 1, dpi)


def text_width(text: str, fontsize: float | str, dpi: float) -> float:
    """Width in pixels of one line ``text`` at ``fontsize`` (points, or a name such as ``"small"``) and ``dpi``,
    in matplotlib's default font."""
    from matplotlib.font_manager import FontProperties

    width, _, _ = _renderer(dpi).get_text_width_height_descent(text, FontProperties(size=fontsize), ismath=False)
    return width


def wrap_to_width(text: str, width_px: float, fontsize: float | str, dpi: float, breaks: str = r"(?<= )") -> str:
    """``text`` with each of its lines broken where ``breaks`` (a regular expression of zero width) matches, so that
    no line is wider than ``width_px`` at ``fontsize`` and ``dpi``; a piece wider than that alone is cut between
    characters. Spaces at the ends of the lines are dropped."""
    lines: list[str] = []
    for line in text.split("\n"):
        current = ""
        for piece in (p for p in re.split(breaks, line) if p):
            if text_width((current + piece).rstrip(), fontsize, dpi) <= width_px:
                current += piece
                continue
            if current.strip():
                lines.append(current.rstrip())
            current = ""
            for char in piece.lstrip():  # a piece too wide for a line of its own is cut
                if current and text_width((current + char).rstrip(), fontsize, dpi) > width_px:
                    lines.append(current)
                    current = ""
                current += char
        lines.append(current.rstrip())
    return "\n".join(lines)
