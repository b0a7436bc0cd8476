"""Charts drawn with plotext (its `build()` output, without colour) and coloured here by marker, so they
look the same in every theme and in snapshots."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import plotext
from rich.text import Text

CURRENT_STYLE = "bold green3"
EARLIER_MARKERS: tuple[tuple[str, str], ...] = (
    ("•", "steel_blue1"),
    ("+", "orange3"),
    ("*", "medium_purple2"),
)
# plotext's default `hd` marker draws with these quadrant blocks.
_HD_BLOCKS = frozenset("▘▝▀▖▌▞▛▗▚▐▜▄▙▟█")
AXIS_STYLE = "grey50"


def plot_text(build: Callable[[Any], None], width: int, height: int, styles: dict[str, str]) -> Text:
    """Run `build(figure)` on a cleared plotext figure of this size; the text, coloured by marker."""
    fig = plotext.figure
    # The widget, not the process's terminal, decides the size (Textual owns the screen).
    plotext.terminal.limit(False, False)
    fig.clear()
    fig.plot_size(max(width, 20), max(height, 6))
    fig.legend(active=False)
    build(fig)
    raw = fig.build().string(colorless=True)
    fig.clear()
    text = Text(style=AXIS_STYLE, no_wrap=True, overflow="crop")
    for line_no, line in enumerate(raw.splitlines()):
        if line_no:
            text.append("\n")
        for ch in line:
            style = CURRENT_STYLE if ch in _HD_BLOCKS and "hd" in styles else styles.get(ch)
            text.append(ch, style) if style else text.append(ch)
    return text
