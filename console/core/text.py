"""Text from outside (a host, a file, the journal, the server) made safe to print on a terminal.

One table for every surface: the event feed, the command line's messages and tables, the console's
titles. Control characters become their Unicode pictures (one cell each, so offsets and column widths
stay as they were): a raw ESC, BEL or CR from a host name, a profile note or an audit line must never
reach the operator's terminal, where it could retitle the window, move the cursor or hide text.

Characters that draw nothing but change what is drawn are replaced too: the bidirectional controls
(U+202A-U+202E, U+2066-U+2069, U+200E/U+200F, U+061C) reorder the text around them, so a host's line can
read `--port 30000` on screen while it says something else; the zero-width and invisible ones (U+200B-U+200D,
U+2060, U+FEFF, U+00AD, tag characters...) hide inside a word, so two names that look alike differ. Every
such format character (Unicode's Cf), an unassigned code point and a lone surrogate (which no terminal
encoding can write) is drawn as U+FFFD. Spaces (Zs) and private-use characters stay: they draw as what
they are.
"""

from __future__ import annotations

import unicodedata

# C0 -> U+2400..U+241F, DEL -> U+2421, the Unicode line/paragraph separators -> U+2424 (NEWLINE picture),
# C1 (0x80-0x9F, which include the 8-bit CSI) -> U+FFFD.
CONTROL_PICTURES: dict[int, int] = {c: 0x2400 + c for c in range(32)} | {
    0x7F: 0x2421,
    0x2028: 0x2424,
    0x2029: 0x2424,
}
CONTROL_PICTURES |= {c: 0xFFFD for c in range(0x80, 0xA0)}

INVISIBLE: frozenset[int] = frozenset(
    (0x00AD, 0x061C, 0x180E, 0xFEFF, *range(0x200B, 0x2010), *range(0x202A, 0x202F), *range(0x2060, 0x2065))
) | frozenset((*range(0x2066, 0x2070), *range(0xFFF9, 0xFFFC)))
"""The format characters a host's text is most likely to use against a reader: soft hyphen, the bidi
marks, embeddings, overrides and isolates, the zero-width space, joiners and no-break space (BOM), the
invisible operators and the interlinear annotation marks. In the table for speed; any other non-printing
character is found by `_rare`."""
CONTROL_PICTURES |= {c: 0xFFFD for c in INVISIBLE}

# Line breaks kept by `terminal_safe(..., keep_newlines=True)` for text printed over several lines.
_WITH_NEWLINES = {k: v for k, v in CONTROL_PICTURES.items() if k != 0x0A}

# Not printable for `str.isprintable`, yet harmless on a terminal: spaces other than U+0020 (a no-break
# space in a log line) and private-use characters (a Nerd Font's icons).
_HARMLESS = frozenset({"Zs", "Co"})


def _rare(s: str, keep_newlines: bool, *, as_json: bool = False) -> str:
    """`s` (already translated) with every remaining non-printing character other than a harmless one
    replaced: by U+FFFD, or, `as_json`, by its `\\uXXXX` escape."""
    out: list[str] = []
    for c in s:
        if c.isprintable() or (keep_newlines and c == "\n") or unicodedata.category(c) in _HARMLESS:
            out.append(c)
        else:
            out.append(_json_escape(ord(c)) if as_json else "\ufffd")
    return "".join(out)


def _json_escape(cp: int) -> str:
    if cp < 0x10000:
        return f"\\u{cp:04x}"
    cp -= 0x10000  # a character past the BMP is written as its UTF-16 surrogate pair, as JSON spells it
    return f"\\u{0xD800 + (cp >> 10):04x}\\u{0xDC00 + (cp & 0x3FF):04x}"


def terminal_safe(text: object, *, keep_newlines: bool = False) -> str:
    """`text` with every control character drawn as its picture and every invisible or reordering one as
    U+FFFD, one character for one; `keep_newlines` keeps `\\n` only."""
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():
        return s
    s = s.translate(_WITH_NEWLINES if keep_newlines else CONTROL_PICTURES)
    if (s.replace("\n", "") if keep_newlines else s).isprintable():
        return s
    return _rare(s, keep_newlines)


# The same characters, written as JSON escapes: `json.dumps` escapes C0 but leaves DEL, C1 (the 8-bit
# CSI 0x9B among them), U+2028/U+2029 and the bidi and zero-width characters raw, and pydantic's
# serializer does the same. `\n` stays: in serializer output it can only be indentation, never inside a
# string.
_JSON_ESCAPES: dict[int, str] = {c: _json_escape(c) for c in CONTROL_PICTURES if c != 0x0A}


def json_safe(document: str) -> str:
    """A JSON document with every character `terminal_safe` would replace written as `\\uXXXX`: the
    same value for a JSON reader, nothing a terminal acts on or reorders when it is printed."""
    if document.isprintable():
        return document
    document = document.translate(_JSON_ESCAPES)
    if document.replace("\n", "").isprintable():
        return document
    return _rare(document, True, as_json=True)


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
