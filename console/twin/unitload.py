"""A service's unit file and drop-ins, loaded the way systemd 252 does at daemon-reload: each file's line
syntax (sections, continuations, comments, empty assignments that reset a list), the drop-ins in name order,
and the result as one `ServiceConfig`. The word and ExecStart= rules it applies are in
`console.twin.unitfile`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from console.twin.unitfile import (
    ENV_NAME,
    LINE_BREAK,
    WHITESPACE,
    ExecCommand,
    SpecifierTable,
    UnitSyntaxError,
    expand_specifiers,
    parse_exec,
    split_words,
)


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
    for lineno, raw in enumerate(LINE_BREAK.split(text.removesuffix("\n")) if text else [], start=1):
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
                        if not eq or not ENV_NAME.match(name_part):
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
