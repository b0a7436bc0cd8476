"""Stacked horizontal bars in eighth-block precision (▏▎▍▌▋▊▉█).

A terminal cell holds one glyph with one foreground and one background colour, so a cell where one
segment ends and the next begins draws the left-filling partial block in the first segment's colour on
the second segment's colour: a boundary lands on 1/8 of a cell, not on a whole cell.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.style import Style
from rich.text import Text

EIGHTHS = " ▏▎▍▌▋▊▉█"


def stacked_bar(
    parts: Sequence[tuple[float, str]],
    total: float,
    width: int,
    *,
    empty: str = "grey19",
) -> Text:
    """`parts` are (value, colour) from the left; what they leave of `total` is drawn in `empty`."""
    text = Text()
    if width <= 0:
        return text
    if total <= 0:
        text.append(" " * width, Style(bgcolor=empty))
        return text
    cells = width * 8
    # Boundaries in eighths, from cumulative sums, so rounding never accumulates along the bar.
    edges: list[tuple[int, str]] = []
    acc = 0.0
    for value, colour in parts:
        acc += max(0.0, value)
        edges.append((min(cells, round(acc / total * cells)), colour))
    for cell in range(width):
        lo, hi = cell * 8, cell * 8 + 8
        # Colour covering each eighth of this cell.
        covering: list[str] = []
        for eighth in range(lo, hi):
            colour = empty
            for edge, c in edges:
                if eighth < edge:
                    colour = c
                    break
            covering.append(colour)
        first = covering[0]
        n = 1
        while n < 8 and covering[n] == first:
            n += 1
        if n == 8:
            if first == empty:
                text.append(" ", Style(bgcolor=empty))
            else:
                text.append("█", Style(color=first, bgcolor=empty))
        else:
            rest = covering[n]
            text.append(EIGHTHS[n], Style(color=first, bgcolor=rest))
    return text
