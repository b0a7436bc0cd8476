"""systemd unit files as systemd 252 reads them: line syntax, drop-ins, ExecStart= splitting, specifiers,
Environment= and the `$VAR` expansion done when the command is spawned.

The twin's `systemctl` stand-in applies these rules so that a drop-in rendered by the console means on the
twin exactly what it means on a real host. Each function follows the systemd source it names
(src/basic/extract-word.c, src/basic/escape.c, src/shared/specifier.c, src/core/load-fragment.c,
src/basic/env-util.c), including its corner cases: quotes inside a word, backslash escapes inside single
quotes too, unknown escapes kept verbatim with a warning, specifiers resolved per word after unquoting.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

WHITESPACE = " \t\n\r"
LINE_BREAK = re.compile(r"\r\n|\r|\n")
_HEX = "0123456789abcdefABCDEF"


class UnitSyntaxError(ValueError):
    """A value systemd refuses (unbalanced quotes, unknown specifier, bad executable path)."""


class _EscapeError(Exception):
    pass


def _cunescape_one(s: str, i: int) -> tuple[bytes, int]:
    """Decode the escape whose letter is at s[i]; returns (bytes, chars consumed). Mirrors cunescape_one()."""
    if i >= len(s):
        raise _EscapeError
    c = s[i]
    simple = {
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
    if c in simple:
        return simple[c].encode(), 1
    if c == "x":
        digits = s[i + 1 : i + 3]
        if len(digits) != 2 or any(d not in _HEX for d in digits):
            raise _EscapeError
        value = int(digits, 16)
        if value == 0:  # systemd refuses NUL bytes
            raise _EscapeError
        return bytes([value]), 3
    if c in ("u", "U"):
        n = 4 if c == "u" else 8
        digits = s[i + 1 : i + 1 + n]
        if len(digits) != n or any(d not in _HEX for d in digits):
            raise _EscapeError
        value = int(digits, 16)
        if value == 0 or value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
            raise _EscapeError
        return chr(value).encode(), n + 1
    if c in "01234567":
        digits = s[i : i + 3]
        if len(digits) != 3 or any(d not in "01234567" for d in digits):
            raise _EscapeError
        value = int(digits, 8)
        if value == 0 or value > 255:
            raise _EscapeError
        return bytes([value]), 3
    raise _EscapeError


def extract_first_word(s: str, pos: int, *, relax_escapes: bool = False) -> tuple[str | None, int]:
    """One word of `s` from `pos` with EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE; returns (word or None, new pos).

    Raises UnitSyntaxError on unbalanced quotes or a trailing backslash inside quotes, and _EscapeError on
    an unknown escape unless `relax_escapes` (then the backslash and the character are kept, as systemd's
    retry in extract_first_word_and_warn() does).
    """
    n = len(s)
    while pos < n and s[pos] in WHITESPACE:
        pos += 1
    if pos >= n:
        return None, pos
    out = bytearray()
    quote = ""
    while True:
        if pos >= n:
            if quote:
                raise UnitSyntaxError("unbalanced quoting")
            return out.decode("utf-8", "surrogateescape"), pos
        c = s[pos]
        if quote:
            if c == quote:
                quote = ""
                pos += 1
                continue
            if c != "\\":
                out += c.encode("utf-8", "surrogateescape")
                pos += 1
                continue
        else:
            if c in ("'", '"'):
                quote = c
                pos += 1
                continue
            if c in WHITESPACE:
                while pos < n and s[pos] in WHITESPACE:
                    pos += 1
                return out.decode("utf-8", "surrogateescape"), pos
            if c != "\\":
                out += c.encode("utf-8", "surrogateescape")
                pos += 1
                continue
        # A backslash, inside or outside quotes (systemd unescapes inside single quotes too).
        pos += 1
        if pos >= n:
            if relax_escapes and not quote:
                out += b"\\"
                return out.decode("utf-8", "surrogateescape"), pos
            raise UnitSyntaxError("trailing backslash")
        try:
            decoded, used = _cunescape_one(s, pos)
        except _EscapeError:
            if not relax_escapes:
                raise
            out += b"\\" + s[pos].encode("utf-8", "surrogateescape")
            pos += 1
            continue
        out += decoded
        pos += used


def _extract_and_warn(s: str, pos: int, warnings: list[str]) -> tuple[str | None, int]:
    try:
        return extract_first_word(s, pos)
    except _EscapeError:
        word, new_pos = extract_first_word(s, pos, relax_escapes=True)
        warnings.append(f'Ignoring unknown escape sequences: "{word}"')
        return word, new_pos


def split_words(value: str) -> list[str]:
    """Split like systemd's strv_split_full(EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE) (warnings dropped)."""
    words: list[str] = []
    pos = 0
    while True:
        word, pos = _extract_and_warn(value, pos, [])
        if word is None:
            return words
        words.append(word)


# --- specifiers ---------------------------------------------------------------------------------------

SpecifierTable = Mapping[str, str]


def expand_specifiers(text: str, table: SpecifierTable) -> str:
    """specifier_printf(): `%%` is `%`, `%X` comes from the table, an unknown one is an error, and a stray
    `%` at the very end stays."""
    out: list[str] = []
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        if i + 1 >= n:
            out.append("%")
            break
        spec = text[i + 1]
        if spec == "%":
            out.append("%")
        elif spec in table:
            out.append(table[spec])
        else:
            raise UnitSyntaxError(f"unknown specifier %{spec}")
        i += 2
    return "".join(out)


def specifier_table(
    unit_name: str,
    fragment_path: str,
    *,
    hostname: str,
    machine_id: str,
    boot_id: str,
    user: str,
    uid: int,
    home: str,
) -> dict[str, str]:
    """The specifiers of a system service (systemd.unit(5) "Specifiers"), for a unit without an instance."""
    prefix = unit_name.rsplit(".", 1)[0]
    base_prefix = prefix.split("@", 1)[0]
    instance = prefix.split("@", 1)[1] if "@" in prefix else ""
    return {
        "a": "x86-64",
        "b": boot_id,
        "C": "/var/cache",
        "E": "/etc",
        "f": "/" + (instance or base_prefix),
        "g": "root" if uid == 0 else user,
        "G": "0" if uid == 0 else str(uid),
        "h": home,
        "H": hostname,
        "i": instance,
        "I": instance,
        "j": base_prefix.rsplit("-", 1)[-1],
        "J": base_prefix.rsplit("-", 1)[-1],
        "l": hostname.split(".", 1)[0],
        "L": "/var/log",
        "m": machine_id,
        "n": unit_name,
        "N": prefix,
        "p": base_prefix,
        "P": base_prefix,
        "s": "/bin/sh",
        "S": "/var/lib",
        "t": "/run",
        "T": "/tmp",
        "u": user,
        "U": str(uid),
        "V": "/var/tmp",
        "y": fragment_path,
        "Y": str(Path(fragment_path).parent),
    }


# --- ExecStart= ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecCommand:
    """One command of an Exec*= setting: `path` is what gets executed, `argv` what it receives."""

    path: str
    argv: tuple[str, ...]
    ignore_failure: bool = False
    no_env_expand: bool = False
    prefixes: str = ""

    def expanded_argv(self, env: Mapping[str, str]) -> list[str]:
        """The argv systemd spawns: `$VAR`/`${VAR}` replaced unless the `:` prefix turned that off."""
        if self.no_env_expand:
            return list(self.argv)
        return replace_env_argv(list(self.argv), env)


def parse_exec(rvalue: str, table: SpecifierTable, warnings: list[str] | None = None) -> list[ExecCommand]:
    """config_parse_exec(): one or more commands separated by a lone `;`.

    Raises UnitSyntaxError for what makes systemd refuse the unit (bad-setting); an assignment systemd
    merely ignores (unbalanced quotes in the first word) returns [] with a warning.
    """
    warns = warnings if warnings is not None else []
    commands: list[ExecCommand] = []
    pos = 0
    n = len(rvalue)
    while True:
        try:
            first, pos = _extract_and_warn(rvalue, pos, warns)
        except UnitSyntaxError:
            warns.append(f'Unbalanced quoting, ignoring: "{rvalue}"')
            return commands
        if first is None:
            return commands
        if first == ";":
            continue
        ignore = no_env = separate_argv0 = privileged = False
        prefixes = ""
        f = first
        while f:
            ch = f[0]
            if ch == "-" and not ignore:
                ignore = True
            elif ch == "@" and not separate_argv0:
                separate_argv0 = True
            elif ch == ":" and not no_env:
                no_env = True
            elif ch in "+!" and not privileged:
                privileged = True
                if f.startswith("!!"):  # `!!` is one prefix
                    prefixes += "!"
                    f = f[1:]
            else:
                break
            prefixes += ch
            f = f[1:]
        path = expand_specifiers(f, table)
        if not path:
            raise UnitSyntaxError(f"Empty path in command line: '{rvalue}'")
        if any(ord(ch) < 32 or ch == "\x7f" for ch in path):
            raise UnitSyntaxError(f"Executable name contains special characters: {path}")
        if path.endswith("/"):
            raise UnitSyntaxError(f"Executable path specifies a directory: {path}")
        if not path.startswith("/") and "/" in path:
            raise UnitSyntaxError(f"Neither a valid executable name nor an absolute path: {path}")
        argv: list[str] = [] if separate_argv0 else [path]
        semicolon = False
        while pos < n:
            rest = rvalue[pos:]
            if rest[0] == ";" and (len(rest) == 1 or rest[1] in WHITESPACE):
                pos += 1
                while pos < n and rvalue[pos] in WHITESPACE:
                    pos += 1
                semicolon = True
                break
            if rest.startswith("\\;") and (len(rest) == 2 or rest[2] in WHITESPACE):
                pos += 2
                while pos < n and rvalue[pos] in WHITESPACE:
                    pos += 1
                argv.append(";")
                continue
            word, pos = _extract_and_warn(rvalue, pos, warns)
            if word is None:
                break
            argv.append(expand_specifiers(word, table))
        if not argv:
            raise UnitSyntaxError(f"Empty executable name or zeroeth argument: {rvalue}")
        commands.append(
            ExecCommand(
                path=_simplify_path(path),
                argv=tuple(argv),
                ignore_failure=ignore,
                no_env_expand=no_env,
                prefixes=prefixes,
            )
        )
        if not semicolon:
            return commands


def _simplify_path(path: str) -> str:
    if not path.startswith("/"):
        return path
    parts = [p for p in path.split("/") if p not in ("", ".")]
    return "/" + "/".join(parts)


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def replace_env(word: str, env: Mapping[str, str]) -> str:
    """replace_env() without extensions: `${NAME}` becomes the value (empty when unset), `$$` becomes `$`,
    anything else, `${NAME:-x}` included, stays as written."""
    out: list[str] = []
    i = 0
    n = len(word)
    while i < n:
        c = word[i]
        if c != "$" or i + 1 >= n:
            out.append(c)
            i += 1
            continue
        nxt = word[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
            continue
        if nxt == "{":
            j = i + 2
            while j < n and word[j] not in "}:":
                j += 1
            if j < n and word[j] == "}":
                out.append(env.get(word[i + 2 : j], ""))
                i = j + 1
                continue
            # `${NAME:` is syntax systemd does not support here: copy the rest verbatim up to where
            # its state machine starts over (the `:`), as replace_env() does.
            out.append(word[i:j])
            i = j
            continue
        out.append(c)
        i += 1
    return "".join(out)


def replace_env_argv(argv: list[str], env: Mapping[str, str]) -> list[str]:
    """replace_env_argv(): a word that is exactly `$NAME` becomes the value split into words (no words when
    unset); `${NAME}` inside a word is replaced in place."""
    out: list[str] = []
    for word in argv:
        if word.startswith("$") and len(word) > 1 and word[1] not in "{$":
            value = env.get(word[1:])
            if value is not None:
                out.extend(split_words_relaxed(value))
            continue
        out.append(replace_env(word, env))
    return out


def split_words_relaxed(value: str) -> list[str]:
    """strv_split_full(EXTRACT_RELAX|EXTRACT_UNQUOTE): quotes removed, no escapes decoded, an unbalanced
    quote ends the word instead of failing."""
    words: list[str] = []
    pos = 0
    n = len(value)
    while True:
        while pos < n and value[pos] in WHITESPACE:
            pos += 1
        if pos >= n:
            return words
        buf: list[str] = []
        quote = ""
        while pos < n:
            c = value[pos]
            if quote:
                if c == quote:
                    quote = ""
                elif c == "\\" and pos + 1 < n:
                    pos += 1
                    buf.append(value[pos])
                else:
                    buf.append(c)
            elif c in ("'", '"'):
                quote = c
            elif c == "\\" and pos + 1 < n:
                pos += 1
                buf.append(value[pos])
            elif c in WHITESPACE:
                break
            else:
                buf.append(c)
            pos += 1
        words.append("".join(buf))


# --- rendering (the inverse, for writing units the twin and the tests can trust) -------------------------


def quote_word(value: str, *, for_exec: bool = True) -> str:
    """A word that systemd reads back as exactly `value`: `%` doubled (specifiers), `$` doubled in Exec
    lines (environment expansion), quoted with C escapes when it holds anything but plain characters."""
    value = value.replace("%", "%%")
    if for_exec:
        value = value.replace("$", "$$")
    plain = value and all(ch.isprintable() and ch not in " \t\"'\\;" for ch in value)
    if plain:
        return value
    out = ['"']
    for ch in value:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif not ch.isprintable() and ch != " ":
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x80 else f"\\U{code:08x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def render_exec(argv: list[str]) -> str:
    """An Exec*= value whose argv, after systemd's parsing and `$` expansion, is `argv`."""
    if not argv or not argv[0].startswith("/"):
        raise ValueError("an Exec command needs an absolute executable path")
    return " ".join(quote_word(a) for a in argv)


def render_environment(env: Mapping[str, str]) -> str:
    """An Environment= value assigning each NAME=value."""
    for name in env:
        if not ENV_NAME.match(name):
            raise ValueError(f"not an environment variable name: {name!r}")
    return " ".join(quote_word(f"{k}={v}", for_exec=False) for k, v in env.items())
