"""Charts drawn with plotext (its `build()` output, without colour) and coloured here by marker with the
theme's colours (console/tui/themes.py), so that plotext's own palette never reaches the screen."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.style import Style
from rich.text import Text

from console.tui.themes import palette

EARLIER_MARKERS = ("•", "+", "*")
"""The markers of up to three earlier curves, coloured `series-1..3`."""
# plotext's default `hd` marker draws with these quadrant blocks.
_HD_BLOCKS = frozenset("▘▝▀▖▌▞▛▗▚▐▜▄▙▟█")


def current_style() -> Style:
    """The newest curve and the newest figure."""
    return palette().style("ok", bold=True)


def axis_style() -> Style:
    return palette().faint


def earlier_styles() -> list[tuple[str, Style]]:
    """(marker, style) of the earlier curves, oldest last."""
    p = palette()
    return [(marker, p.style(f"series-{i}")) for i, marker in enumerate(EARLIER_MARKERS, 1)]


def plot_text(build: Callable[[Any], None], width: int, height: int, styles: dict[str, Style]) -> Text:
    """Run `build(figure)` on a cleared plotext figure of this size; the text, coloured by marker."""
    import plotext  # here, not at the top: importing it costs ~80 ms (its help text), paid by every console start

    fig = plotext.figure
    # The widget, not the process's terminal, decides the size (Textual owns the screen).
    plotext.terminal.limit(False, False)
    fig.clear()
    fig.plot_size(max(width, 20), max(height, 6))
    fig.legend(active=False)
    build(fig)
    raw = fig.build().string(colorless=True)
    fig.clear()
    text = Text(style=axis_style(), no_wrap=True, overflow="crop")
    hd = styles.get("hd")
    for line_no, line in enumerate(raw.splitlines()):
        if line_no:
            text.append("\n")
        for ch in line:
            style = hd if hd is not None and ch in _HD_BLOCKS else styles.get(ch)
            text.append(ch, style) if style else text.append(ch)
    return text
