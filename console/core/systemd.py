"""systemd drop-ins for the SGLang unit, and systemd's own command-line quoting both ways.

A unit's `ExecStart=` value goes through three layers before it becomes an argv (systemd.service(5),
"Command lines"; `config_parse_exec` in src/core/load-fragment.c):

1. words are split and unquoted by `extract_first_word(EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE)`: whitespace
   separates words, `"…"` and `'…'` quote, and C escapes (`\\n`, `\\"`, `\\\\`, `\\xNN`, `\\uNNNN`, …)
   are decoded inside and outside quotes; an unquoted lone `;` separates commands;
2. each word has its `%` specifiers expanded (`%%` is a literal `%`);
3. at exec time `$VAR` / `${VAR}` are replaced from the environment (`$$` is a literal `$`).

`quote_word` undoes all three for any string: `%` → `%%`, `$` → `$$`, then backslash, double quote and
every control character are C-escaped, and the result is wrapped in double quotes. Newlines therefore
never reach the file, and a value can never end a word, start a new command, or expand anything.
`split_exec_start` is the reverse (the same three layers), so `split_exec_start(render_exec_start(argv))
== argv` for every argv without NUL characters.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

DROPIN_NAME = "50-k26-console.conf"
_UNIT = re.compile(r"^[A-Za-z0-9:_.@\\-]+$")
_EXEC_PREFIXES = "-@:+!|"
_C_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}
_C_UNESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "s": " ",
}
_WHITESPACE = " \t\n\r"
_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # systemd's read_line; not Python's splitlines (\x85, \u2028, ...)


class ExecStartError(ValueError):
    """An argv that cannot be written, or an ExecStart line systemd would refuse."""


# ---- sizes --------------------------------------------------------------------------------------------
# What Linux and systemd accept, and the console's own, lower, limits. A 1 MB flag value once made a 1 MB
# drop-in whose exec failed with E2BIG, and a 70 KB one a server_args journal line too long to follow:
# both boots hung in "launching". Checked before anything is written.

MAX_ARG_STRLEN = 131_072
"""Linux: the longest single argv or environment string execve(2) takes (32 pages, with its NUL);
a longer one fails with E2BIG."""
ARG_MAX = 2_097_152
"""Linux: argv and the environment together (a quarter of the 8 MiB default stack limit)."""
LONG_LINE_MAX = 1_048_576
"""systemd: the longest line it reads from a unit file (src/basic/fileio.h)."""
JOURNALD_LINE_MAX = 49_152
"""journald's LineMax= default (48K): a longer stdout line is split, and SGLang logs every argument on
its one server_args line, so a command line near this no longer reads back as one line."""
FLAG_VALUE_MAX_BYTES = 16_384
"""The console's limit for one argument (a flag value): an eighth of MAX_ARG_STRLEN, a third of LineMax."""
COMMAND_LINE_MAX_BYTES = 32_768
"""The console's limit for the whole ExecStart= line: under journald's LineMax (48 KiB), far under
systemd's LONG_LINE_MAX (1 MiB) and Linux's ARG_MAX (2 MiB, shared with the environment)."""


def argv_size_problems(argv: Sequence[str]) -> list[tuple[int, str]]:
    """(index, sentence) for every argv word over FLAG_VALUE_MAX_BYTES, and (-1, sentence) when the
    ExecStart= line as written is over COMMAND_LINE_MAX_BYTES. Each sentence names the limit."""
    out: list[tuple[int, str]] = []
    for i, word in enumerate(argv):
        size = len(word.encode("utf-8", "surrogatepass"))
        if size > FLAG_VALUE_MAX_BYTES:
            what = f"the value of {argv[i - 1]}" if i > 0 and argv[i - 1].startswith("-") else f"argument {i}"
            out.append(
                (
                    i,
                    f"{what} is {size:,} bytes, over the console's limit of {FLAG_VALUE_MAX_BYTES:,} bytes "
                    f"per argument (Linux refuses one over MAX_ARG_STRLEN = {MAX_ARG_STRLEN:,} bytes with "
                    f"E2BIG, and journald splits a line over LineMax = {JOURNALD_LINE_MAX:,} bytes)",
                )
            )
    total = len(b"ExecStart=") + sum(len(_quote_bytes(w)) + 1 for w in argv)
    if total > COMMAND_LINE_MAX_BYTES:
        out.append(
            (
                -1,
                f"the ExecStart= line would be {total:,} bytes, over the console's limit of "
                f"{COMMAND_LINE_MAX_BYTES:,} bytes for the whole command line (journald LineMax = "
                f"{JOURNALD_LINE_MAX:,} bytes, systemd LONG_LINE_MAX = {LONG_LINE_MAX:,} bytes per unit-file "
                f"line, Linux ARG_MAX = {ARG_MAX:,} bytes with the environment)",
            )
        )
    return out


def _quote_bytes(word: str) -> bytes:
    try:
        return quote_word(word).encode("utf-8", "surrogatepass")
    except ExecStartError:
        return word.encode("utf-8", "surrogatepass")


def quote_word(word: str) -> str:
    """One argv word as a double-quoted systemd command-line word that unquotes to exactly `word`."""
    if "\0" in word:
        raise ExecStartError("an argument contains a NUL character, which no command line can carry")
    try:
        word.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ExecStartError("an argument is not valid Unicode text") from exc
    text = word.replace("%", "%%").replace("$", "$$")
    out = []
    for ch in text:
        if ch in _C_ESCAPES:
            out.append(_C_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def render_exec_start(argv: Sequence[str]) -> str:
    """The value of an `ExecStart=` line (without the `ExecStart=`), every word quoted."""
    if not argv:
        raise ExecStartError("the command is empty")
    program = argv[0]
    if not program or program[0] in _EXEC_PREFIXES:
        # systemd reads these as prefixes of the first word even inside quotes (`-` = ignore failure, …).
        raise ExecStartError(
            f"the program {program!r} must not be empty or start with one of {_EXEC_PREFIXES}"
        )
    return " ".join(quote_word(w) for w in argv)


def validate_unit_name(unit: str) -> str:
    """`sglang` → `sglang.service`; refuse names that are not a plain service unit."""
    name = unit if unit.endswith(".service") else unit + ".service"
    if "/" in name or not _UNIT.match(name) or name.startswith("."):
        raise ExecStartError(f"{unit!r} is not a systemd service name")
    return name


def dropin_path(unit: str, *, name: str = DROPIN_NAME) -> str:
    """`/etc/systemd/system/UNIT.service.d/50-k26-console.conf`."""
    return f"/etc/systemd/system/{validate_unit_name(unit)}.d/{name}"


def render_dropin(argv: Sequence[str], *, header: Sequence[str] = ()) -> str:
    """The drop-in text: comment lines, `[Service]`, an empty `ExecStart=` that clears the unit's own,
    then the new `ExecStart=`."""
    sizes = argv_size_problems(argv)
    if sizes:
        raise ExecStartError(sizes[0][1])
    lines = []
    for h in header:
        for part in h.splitlines() or [""]:
            lines.append(("# " + part).rstrip())
    lines += ["[Service]", "ExecStart=", "ExecStart=" + render_exec_start(argv), ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# The reverse: systemd's parser
# --------------------------------------------------------------------------------------------------


def _cunescape_one(text: str, i: int) -> tuple[str, int]:
    """Decode the escape after the backslash at text[i-1]; returns (chars, next index)."""
    if i >= len(text):
        raise ExecStartError("a backslash ends the line")
    c = text[i]
    if c in _C_UNESCAPES:
        return _C_UNESCAPES[c], i + 1
    if c == "x":
        digits = text[i + 1 : i + 3]
        if len(digits) != 2 or not all(d in "0123456789abcdefABCDEF" for d in digits):
            raise ExecStartError("\\x needs two hex digits")
        value = int(digits, 16)
        if value == 0:
            raise ExecStartError("\\x00 is not allowed")
        if value >= 0x80:
            raise ExecStartError("\\x above 7f is not a character on its own; write it as UTF-8 text")
        return chr(value), i + 3
    if c in "uU":
        n = 4 if c == "u" else 8
        digits = text[i + 1 : i + 1 + n]
        if len(digits) != n or not all(d in "0123456789abcdefABCDEF" for d in digits):
            raise ExecStartError(f"\\{c} needs {n} hex digits")
        value = int(digits, 16)
        if value == 0 or value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
            raise ExecStartError(f"\\{c}{digits} is not a valid character")
        return chr(value), i + 1 + n
    if c in "01234567":
        digits = text[i : i + 3]
        if len(digits) != 3 or not all(d in "01234567" for d in digits):
            raise ExecStartError("an octal escape needs three digits")
        value = int(digits, 8)
        if value == 0 or value > 0x7F:
            raise ExecStartError(f"\\{digits} is not a character on its own")
        return chr(value), i + 3
    raise ExecStartError(f"\\{c} is not an escape systemd knows")


def _extract_words(value: str) -> list[tuple[str, bool]]:
    """Split and unquote (EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE); each word with whether any part was quoted
    or escaped (an unquoted bare `;` is a command separator)."""
    words: list[tuple[str, bool]] = []
    i, n = 0, len(value)
    while True:
        while i < n and value[i] in _WHITESPACE:
            i += 1
        if i >= n:
            return words
        if value.startswith("\\;", i) and (i + 2 == n or value[i + 2] in _WHITESPACE):
            # config_parse_exec: a word `\;` is a literal semicolon (not the command separator).
            words.append((";", True))
            i += 2
            continue
        buf: list[str] = []
        special = False
        quote: str | None = None
        while i < n:
            c = value[i]
            if quote is None:
                if c in _WHITESPACE:
                    break
                if c in "\"'":
                    quote = c
                    special = True
                    i += 1
                elif c == "\\":
                    special = True
                    chars, i = _cunescape_one(value, i + 1)
                    buf.append(chars)
                else:
                    buf.append(c)
                    i += 1
            else:
                if c == quote:
                    quote = None
                    i += 1
                elif c == "\\":
                    chars, i = _cunescape_one(value, i + 1)
                    buf.append(chars)
                else:
                    buf.append(c)
                    i += 1
        if quote is not None:
            raise ExecStartError("a quote is not closed")
        words.append(("".join(buf), special))


def _expand_specifiers(word: str, specifiers: Mapping[str, str] | None) -> str:
    out: list[str] = []
    i = 0
    while i < len(word):
        c = word[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        if i + 1 >= len(word):
            raise ExecStartError("a lone % ends a word; write %% for a percent sign")
        s = word[i + 1]
        if s == "%":
            out.append("%")
        elif specifiers is not None and s in specifiers:
            out.append(specifiers[s])
        else:
            raise ExecStartError(
                f"%{s} is a systemd specifier this console cannot resolve; write %% for a percent sign"
            )
        i += 2
    return "".join(out)


def _unescape_dollars(word: str) -> str:
    """`$$` → `$`; `$VAR` and `${VAR}` are left as they are (they come from the unit's environment)."""
    out: list[str] = []
    i = 0
    while i < len(word):
        if word.startswith("$$", i):
            out.append("$")
            i += 2
        else:
            out.append(word[i])
            i += 1
    return "".join(out)


def split_exec_start(line: str, *, specifiers: Mapping[str, str] | None = None) -> list[str]:
    """The argv systemd runs for an `ExecStart=` value (with or without the leading `ExecStart=`).

    Prefixes of the first word (`-`, `:`, `+`, `!`, `!!`, `|`) are dropped; with `@` the second word is
    argv[0]. `%%` and `$$` are unescaped; other specifiers resolve from `specifiers` (else an error);
    `$VAR` / `${VAR}` are kept verbatim. Raises ExecStartError for what systemd would refuse (an unclosed
    quote, an unknown escape, more than one command)."""
    value = line[len("ExecStart=") :] if line.startswith("ExecStart=") else line
    if "\n" in value or "\r" in value:
        raise ExecStartError("an ExecStart= value is one line")
    raw = _extract_words(value)
    if not raw:
        raise ExecStartError("ExecStart= is empty")
    # An unquoted `;` word separates commands; `\;` is a literal semicolon.
    for word, special in raw:
        if word == ";" and not special:
            raise ExecStartError("the line holds more than one command (a bare ; separates commands)")
    first, rest = raw[0][0], [w for w, _ in raw[1:]]
    at = False
    while first and first[0] in _EXEC_PREFIXES:
        at = at or first[0] == "@"
        first = first[1:]
    if not first:
        raise ExecStartError("ExecStart= names no program")
    words = [first, *rest]
    if at:
        if len(words) < 2:
            raise ExecStartError("@ needs an argv[0] after the program")
        words = words[1:]
    return [_unescape_dollars(_expand_specifiers(w, specifiers)) for w in words]


def exec_start_lines(unit_text: str) -> list[str]:
    """The effective `ExecStart=` values of unit text (one file or `systemctl cat` output): an empty
    `ExecStart=` clears the list, as systemd does; `\\`-continued lines are joined."""
    values: list[str] = []
    logical: list[str] = []
    buf = ""
    for raw in _LINE_BREAK.split(unit_text):
        if raw.endswith("\\") and not raw.lstrip().startswith(("#", ";")):
            buf += raw[:-1] + " "
            continue
        logical.append(buf + raw)
        buf = ""
    if buf:
        logical.append(buf)
    section = None
    for line in logical:
        s = line.strip(_WHITESPACE)
        if not s or s[0] in "#;":
            continue
        if s.startswith("[") and s.endswith("]"):
            section = s[1:-1]
            continue
        if section != "Service" or "=" not in s:
            continue
        key, value = s.split("=", 1)
        if key.strip(_WHITESPACE) != "ExecStart":
            continue
        value = value.strip(_WHITESPACE)
        if not value:
            values = []
        else:
            values.append(value)
    return values


# What systemctl says when it cannot reach the service manager at all: PID 1 gone (a container whose
# init died, or no systemd), its private socket or the bus closed under it. Not a unit's failure: every
# unit command on the host fails alike, and nothing there is restarted, stopped or timed any more.
_MANAGER_GONE = (
    "Failed to connect to bus",
    "System has not been booted with systemd",
    "Transport endpoint is not connected",
    "Failed to get D-Bus connection",
    "Connection reset by peer",
)


def manager_gone(output: str) -> str | None:
    """The line of systemctl's output saying the service manager cannot be reached, else None."""
    for line in output.split("\n"):
        line = line.strip()
        if line and any(words in line for words in _MANAGER_GONE):
            return line
    return None


__all__ = [
    "ARG_MAX",
    "COMMAND_LINE_MAX_BYTES",
    "DROPIN_NAME",
    "FLAG_VALUE_MAX_BYTES",
    "JOURNALD_LINE_MAX",
    "LONG_LINE_MAX",
    "MAX_ARG_STRLEN",
    "ExecStartError",
    "argv_size_problems",
    "dropin_path",
    "exec_start_lines",
    "manager_gone",
    "quote_word",
    "render_dropin",
    "render_exec_start",
    "split_exec_start",
    "validate_unit_name",
]
