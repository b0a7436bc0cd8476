"""Text from outside (a host, a file, the journal, the server) made safe to print on a terminal.

One table for every surface: the event feed, the command line's messages and tables, the console's
titles. Control characters become their Unicode pictures (one cell each, so offsets and column widths
stay as they were): a raw ESC, BEL or CR from a host name, a profile note or an audit line must never
reach the operator's terminal, where it could retitle the window, move the cursor or hide text.
"""

from __future__ import annotations

# C0 -> U+2400..U+241F, DEL -> U+2421, the Unicode line/paragraph separators -> U+2424 (NEWLINE picture),
# C1 (0x80-0x9F, which include the 8-bit CSI) -> U+FFFD.
CONTROL_PICTURES: dict[int, int] = {c: 0x2400 + c for c in range(32)} | {
    0x7F: 0x2421,
    0x2028: 0x2424,
    0x2029: 0x2424,
}
CONTROL_PICTURES |= {c: 0xFFFD for c in range(0x80, 0xA0)}

# Line breaks kept by `terminal_safe(..., keep_newlines=True)` for text printed over several lines.
_WITH_NEWLINES = {k: v for k, v in CONTROL_PICTURES.items() if k != 0x0A}


def terminal_safe(text: object, *, keep_newlines: bool = False) -> str:
    """`text` with every control character drawn as its picture; `keep_newlines` keeps `\\n` only."""
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():
        return s
    return s.translate(_WITH_NEWLINES if keep_newlines else CONTROL_PICTURES)
