"""Stacked horizontal bars in eighth-block precision (▏▎▍▌▋▊▉█).

A terminal cell holds one glyph with one foreground and one background colour, so a cell where one
segment ends and the next begins draws the left-filling partial block in the first segment's colour on
the second segment's colour: a boundary lands on 1/8 of a cell, not on a whole cell.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.style import Style
from rich.text import Text

from console.tui.themes import palette

EIGHTHS = " ▏▎▍▌▋▊▉█"


def stacked_bar(
    parts: Sequence[tuple[float, str]],
    total: float,
    width: int,
    *,
    empty: str | None = None,
) -> Text:
    """`parts` are (value, colour) from the left; what they leave of `total` is drawn in `empty` (the
    theme's `bar-empty` by default)."""
    if empty is None:
        empty = palette().colour("bar-empty")
    text = Text()
    if width <= 0:
        return text
    if total <= 0:
        text.append(" " * width, Style(bgcolor=empty))
        return text
    cells = width * 8
    # Boundaries in eighths, from cumulative sums, so rounding never accumulates along the bar; parts
    # that round to nothing are dropped (they cover no eighth).
    runs: list[tuple[int, str]] = []  # (end eighth, colour), strictly increasing ends
    acc = 0.0
    for value, colour in parts:
        acc += max(0.0, value)
        end = min(cells, round(acc / total * cells))
        if runs and end <= runs[-1][0]:
            continue
        if runs and runs[-1][1] == colour:
            runs[-1] = (end, colour)  # one colour across two parts is one run
        else:
            runs.append((end, colour))
    if not runs or runs[-1][0] < cells:
        if runs and runs[-1][1] == empty:
            runs[-1] = (cells, empty)
        else:
            runs.append((cells, empty))
    # One glyph per cell, but one append per run of identical cells: a bar is a handful of spans.
    pending_glyph, pending_style, pending_n = "", Style(), 0
    styles: dict[tuple[str, str], Style] = {}
    k = 0
    for cell in range(width):
        lo = cell * 8
        while runs[k][0] <= lo:
            k += 1
        end, first = runs[k]
        n = min(8, end - lo)
        if n == 8:
            glyph, fg, bg = ("█", first, empty) if first != empty else (" ", None, empty)
        else:
            glyph, fg, bg = EIGHTHS[n], first, runs[k + 1][1]
        key = (fg or "", bg)
        style = styles.get(key)
        if style is None:
            style = styles[key] = Style(color=fg, bgcolor=bg) if fg else Style(bgcolor=bg)
        if glyph == pending_glyph and style == pending_style:
            pending_n += 1
            continue
        if pending_n:
            text.append(pending_glyph * pending_n, pending_style)
        pending_glyph, pending_style, pending_n = glyph, style, 1
    if pending_n:
        text.append(pending_glyph * pending_n, pending_style)
    return text
