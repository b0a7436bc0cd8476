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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

WHITESPACE = " \t\n\r"
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
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


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


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
        if not _ENV_NAME.match(name):
            raise ValueError(f"not an environment variable name: {name!r}")
    return " ".join(quote_word(f"{k}={v}", for_exec=False) for k, v in env.items())


# --- unit files and drop-ins ---------------------------------------------------------------------------


@dataclass
class Assignment:
    section: str
    key: str
    value: str
    path: Path
    line: int


def parse_unit_text(text: str, path: Path) -> tuple[list[Assignment], list[str]]:
    """config_parse(): sections, `#`/`;` comments, a trailing backslash continues the line (replaced by a
    space; comment lines inside a continuation are skipped)."""
    assignments: list[Assignment] = []
    warnings: list[str] = []
    section = ""
    continuation: str | None = None
    cont_line = 0
    # systemd's read_line() ends a line at \n, \r or \r\n only; str.splitlines() would also split at
    # \x85, \u2028, \x1c... which may sit inside a quoted ExecStart= value.
    for lineno, raw in enumerate(_LINE_BREAK.split(text.removesuffix("\n")) if text else [], start=1):
        stripped = raw.strip(WHITESPACE)
        if continuation is not None and stripped[:1] in ("#", ";"):
            continue
        if continuation is not None:
            stripped = continuation + stripped
            continuation_start = cont_line
        else:
            continuation_start = lineno
            if not stripped or stripped[0] in "#;":
                continue
        trailing = len(stripped) - len(stripped.rstrip("\\"))
        if trailing % 2 == 1:
            continuation = stripped[:-1] + " "
            cont_line = continuation_start
            continue
        continuation = None
        if stripped.startswith("["):
            if not stripped.endswith("]"):
                warnings.append(f"{path}:{continuation_start}: Invalid section header '{stripped}'")
                continue
            section = stripped[1:-1]
            continue
        if "=" not in stripped:
            warnings.append(f"{path}:{continuation_start}: Missing '=', ignoring line.")
            continue
        key, value = stripped.split("=", 1)
        assignments.append(
            Assignment(section, key.strip(WHITESPACE), value.strip(WHITESPACE), path, continuation_start)
        )
    if continuation is not None:
        stripped = continuation.rstrip()
        if "=" in stripped:
            key, value = stripped.split("=", 1)
            assignments.append(Assignment(section, key.strip(), value.strip(), path, cont_line))
    return assignments, warnings


@dataclass
class ServiceConfig:
    """What systemd loaded for one service: the parts the twin's service manager acts on."""

    name: str
    fragment_path: str
    dropin_paths: list[str] = field(default_factory=list)
    load_state: str = "loaded"
    load_error: str = ""
    description: str = ""
    service_type: str = "simple"
    exec_start: list[ExecCommand] = field(default_factory=list)
    exec_start_pre: list[ExecCommand] = field(default_factory=list)
    exec_start_post: list[ExecCommand] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    working_directory: str = ""
    timeout_start_sec: float = 90.0
    timeout_stop_sec: float = 90.0
    kill_signal: str = "SIGTERM"
    syslog_identifier: str = ""
    warnings: list[str] = field(default_factory=list)
    fingerprint: list[tuple[str, int, int]] = field(default_factory=list)


def parse_timespan(value: str) -> float:
    """systemd time spans: `90`, `5min 20s`, `1h`, `infinity`."""
    value = value.strip()
    if value == "infinity":
        return float("inf")
    units = {
        "us": 1e-6,
        "usec": 1e-6,
        "ms": 1e-3,
        "msec": 1e-3,
        "s": 1.0,
        "sec": 1.0,
        "second": 1.0,
        "seconds": 1.0,
        "m": 60.0,
        "min": 60.0,
        "minute": 60.0,
        "minutes": 60.0,
        "h": 3600.0,
        "hr": 3600.0,
        "hour": 3600.0,
        "hours": 3600.0,
        "d": 86400.0,
        "day": 86400.0,
        "days": 86400.0,
    }
    total = 0.0
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    if not parts or re.sub(r"[\d.\sa-z]", "", value):
        raise UnitSyntaxError(f"Failed to parse time span '{value}'")
    for number, unit in parts:
        if unit and unit not in units:
            raise UnitSyntaxError(f"Failed to parse time span '{value}'")
        total += float(number) * units.get(unit, 1.0)
    return total


def unit_files(unit_dir: Path, name: str) -> tuple[Path, list[Path]]:
    """The fragment and its drop-ins in the order systemd applies them (sorted by file name)."""
    fragment = unit_dir / name
    dropin_dir = unit_dir / f"{name}.d"
    dropins = sorted(
        (p for p in dropin_dir.glob("*.conf") if p.is_file()) if dropin_dir.is_dir() else [],
        key=lambda p: p.name,
    )
    return fragment, dropins


def fingerprint(paths: list[Path]) -> list[tuple[str, int, int]]:
    out = []
    for p in paths:
        try:
            st = p.stat()
            out.append((str(p), st.st_mtime_ns, st.st_size))
        except FileNotFoundError:
            out.append((str(p), 0, -1))
    return out


def load_service(unit_dir: Path, name: str, table_for: Callable[[str, str], SpecifierTable]) -> ServiceConfig:
    """Load a service the way systemd does at daemon-reload: fragment, then drop-ins; `ExecStart=` (empty)
    resets the list; more than one ExecStart for Type=simple refuses the unit."""
    fragment, dropins = unit_files(unit_dir, name)
    cfg = ServiceConfig(name=name, fragment_path=str(fragment), dropin_paths=[str(p) for p in dropins])
    cfg.fingerprint = fingerprint([fragment, *dropins, fragment.parent / f"{name}.d"])
    if not fragment.is_file():
        cfg.load_state = "not-found"
        cfg.load_error = f"Unit {name} not found."
        return cfg
    table = table_for(name, str(fragment))
    lists = {
        "ExecStart": cfg.exec_start,
        "ExecStartPre": cfg.exec_start_pre,
        "ExecStartPost": cfg.exec_start_post,
    }
    for path in [fragment, *dropins]:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            cfg.warnings.append(f"{path}: failed to read: {exc}")
            continue
        assignments, warns = parse_unit_text(text, path)
        cfg.warnings.extend(warns)
        for a in assignments:
            where = f"{a.path}:{a.line}"
            try:
                if a.section == "Unit" and a.key == "Description":
                    cfg.description = expand_specifiers(a.value, table)
                elif a.section != "Service":
                    continue
                elif a.key in lists:
                    target = lists[a.key]
                    if not a.value:
                        target.clear()
                        continue
                    local: list[str] = []
                    target.extend(parse_exec(a.value, table, local))
                    cfg.warnings.extend(f"{where}: {w}" for w in local)
                elif a.key == "Environment":
                    if not a.value:
                        cfg.environment.clear()
                        continue
                    for word in split_words(a.value):
                        word = expand_specifiers(word, table)
                        name_part, eq, val = word.partition("=")
                        if not eq or not _ENV_NAME.match(name_part):
                            cfg.warnings.append(f"{where}: Invalid environment assignment, ignoring: {word}")
                            continue
                        cfg.environment[name_part] = val
                elif a.key == "Type":
                    cfg.service_type = a.value or "simple"
                elif a.key == "WorkingDirectory":
                    cfg.working_directory = expand_specifiers(a.value, table)
                elif a.key == "TimeoutStartSec":
                    cfg.timeout_start_sec = parse_timespan(a.value)
                elif a.key == "TimeoutStopSec":
                    cfg.timeout_stop_sec = parse_timespan(a.value)
                elif a.key == "TimeoutSec":
                    cfg.timeout_start_sec = cfg.timeout_stop_sec = parse_timespan(a.value)
                elif a.key == "KillSignal":
                    cfg.kill_signal = a.value if a.value.startswith("SIG") else f"SIG{a.value}"
                elif a.key == "SyslogIdentifier":
                    cfg.syslog_identifier = expand_specifiers(a.value, table)
            except UnitSyntaxError as exc:
                cfg.load_state = "bad-setting"
                cfg.load_error = f"{where}: {exc}"
    if cfg.load_state == "loaded":
        if not cfg.exec_start:
            cfg.load_state = "bad-setting"
            cfg.load_error = "Service has no ExecStart=, ExecStop=, or SuccessAction=. Refusing."
        elif len(cfg.exec_start) > 1 and cfg.service_type != "oneshot":
            cfg.load_state = "bad-setting"
            cfg.load_error = (
                "Service has more than one ExecStart= setting, which is only allowed for Type=oneshot "
                "services. Refusing."
            )
    return cfg
