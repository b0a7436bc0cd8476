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


# The same characters, written as JSON escapes: `json.dumps` escapes C0 but leaves DEL, C1 (the 8-bit
# CSI 0x9B among them) and U+2028/U+2029 raw, and pydantic's serializer does the same. `\n` stays: in
# serializer output it can only be indentation, never inside a string.
_JSON_ESCAPES: dict[int, str] = {c: f"\\u{c:04x}" for c in CONTROL_PICTURES if c != 0x0A}


def json_safe(document: str) -> str:
    """A JSON document with every control character left raw by the serializer written as `\\uXXXX`:
    the same value for a JSON reader, nothing a terminal acts on when it is printed."""
    if document.isprintable():
        return document
    return document.translate(_JSON_ESCAPES)


LINE_MAX_BYTES = 1 << 20
"""The longest line read from a file or a host (1 MiB); the rest of a longer line is dropped with a note.
journald cuts a stream line at LineMax (48 KiB by default); its `-o json --all` form of such a line is at
most a few times that (escapes, byte arrays for non-UTF-8 text), so no real journal line comes near this."""


def cut_note(total_bytes: int, limit: int = LINE_MAX_BYTES) -> str:
    """The note that ends a cut line, in the line itself so that it reaches whatever shows it."""
    return f" [k26-console: line cut at {limit:,} of its {total_bytes:,} bytes]"


def _utf8_boundary(data: bytes) -> int:
    """Where `data` can be cut without splitting a UTF-8 sequence: its length, or the start of an
    incomplete last character."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII): does its sequence fit?
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return len(data) if back >= need else len(data) - back
    return len(data)


class LineSplitter:
    """Bytes in, lines out: split on `\\n` only, each line decoded on its own (UTF-8, bad bytes as
    U+FFFD), one trailing `\\r` removed, every line at most `limit` bytes.

    Only `\\n` ends a line: `str.splitlines` also splits at `\\r` (a tqdm frame), U+2028, U+0085 and
    `\\x1c`-`\\x1e`, which a host's text may hold. Time is linear in the input and memory is bounded by
    `limit` plus one chunk whatever the input: a line over the limit keeps its first `limit` bytes and
    ends with `cut_note`; the rest is counted, not kept. `cut` counts the lines that were cut.
    """

    def __init__(self, limit: int = LINE_MAX_BYTES) -> None:
        if limit < 1:
            raise ValueError("a line limit must be at least one byte")
        self.limit = limit
        self.cut = 0
        self._parts: list[bytes] = []  # the current line's bytes so far, at most `limit` of them
        self._kept = 0
        self._total = 0  # the current line's length, dropped bytes included

    def _take(self, piece: bytes) -> None:
        self._total += len(piece)
        room = self.limit - self._kept
        if room > 0 and piece:
            kept = piece[:room]
            self._parts.append(kept)
            self._kept += len(kept)

    def _end(self) -> str:
        data = b"".join(self._parts)
        total = self._total
        self._parts, self._kept, self._total = [], 0, 0
        if total > self.limit:
            self.cut += 1
            data = data[: _utf8_boundary(data)]
            return data.decode("utf-8", "replace") + cut_note(total, self.limit)
        return data.decode("utf-8", "replace").removesuffix("\r")

    def feed(self, data: bytes) -> list[str]:
        """The lines `data` completes (a line still open waits for the next chunk or `flush`)."""
        lines: list[str] = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            if not self._parts and not self._total and end - start <= self.limit:
                # The common case: a whole line inside this chunk, no copy of the pieces.
                lines.append(data[start:end].decode("utf-8", "replace").removesuffix("\r"))
            else:
                self._take(data[start:end])
                lines.append(self._end())
            start = end + 1
        if start < len(data):
            self._take(data[start:])
        return lines

    def flush(self) -> list[str]:
        """The last line when the input did not end with `\\n`."""
        return [self._end()] if self._total else []


def split_lines(text: str) -> list[str]:
    """`text` split on `\\n` only (what a host or a file means by a line), one trailing `\\r` removed
    from each; an empty last piece (text ending in `\\n`) is not a line."""
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    return lines
