"""Tables and coloured words for the command line: drawn by rich with colour on a terminal, plain
aligned text when piped (no escape codes, no box characters, no trailing spaces, never wrapped).

Every cell goes through `terminal_safe` first and into rich as plain `Text` (never markup): a host name
or a journal line can neither send an escape sequence nor be read as `[bold]` by rich.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
from collections.abc import Sequence
from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from console.core.text import terminal_safe

_PIPED_WIDTH = 100_000
"""Piped output is never wrapped: a script reads one row per line."""


def colour_for(stream: TextIO | None = None) -> bool:
    """Colour only for a terminal, and never when NO_COLOR is set or TERM is dumb."""
    stream = stream if stream is not None else sys.stdout
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def _console(colour: bool) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    width = shutil.get_terminal_size().columns if colour else _PIPED_WIDTH
    console = Console(
        file=buffer,
        width=width,
        force_terminal=colour,
        color_system="standard" if colour else None,
        no_color=not colour,
        highlight=False,
        emoji=False,
        markup=False,
        soft_wrap=not colour,
    )
    return console, buffer


def cell(value: object, style: str = "") -> Text:
    return Text(terminal_safe(str(value)), style=style)


def table(*headers: str, right: Sequence[str] = (), wrap: Sequence[str] = ()) -> Table:
    """A borderless table: columns two spaces apart, the headers in bold; `right` names the columns
    aligned right (numbers), `wrap` those that may wrap on a narrow terminal (piped text never does)."""
    t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold", padding=(0, 1))
    for header in headers:
        t.add_column(header, justify="right" if header in right else "left", no_wrap=header not in wrap)
    return t


def render(t: Table, stream: TextIO | None = None) -> str:
    """The table as text for `stream` (default stdout): coloured there if it is a terminal."""
    colour = colour_for(stream)
    console, buffer = _console(colour)
    console.print(t)
    return "".join(line.rstrip(" ") + "\n" for line in buffer.getvalue().splitlines())


def styled(text: str, style: str, stream: TextIO | None = None) -> str:
    """`text` (drawn safe) in `style` when `stream` is a terminal, else as it is."""
    safe = terminal_safe(text)
    if not style or not colour_for(stream):
        return safe
    console, buffer = _console(True)
    console.print(Text(safe, style=style), end="", soft_wrap=True)
    return buffer.getvalue()
