"""`journalctl -o json` objects: decoding one line of it, and reading its fields into event metadata."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

_orjson_loads: Callable[[str | bytes], Any] | None
try:  # orjson reads a journal line ~3× faster than json; the stdlib gives the same objects.
    from orjson import loads as _orjson_loads
except ImportError:  # pragma: no cover - orjson is a dependency; kept importable without it
    _orjson_loads = None


def load_json(line: str | bytes) -> Any:
    """One JSON value (a `journalctl -o json` line); None when the line is not JSON."""
    if _orjson_loads is not None:
        try:
            return _orjson_loads(line)
        except (ValueError, TypeError, RecursionError):  # orjson's JSONDecodeError is a ValueError
            pass  # orjson refuses lone surrogates, NaN and integers past 64 bits, which json reads
    try:
        return json.loads(line)
    except (ValueError, TypeError, RecursionError):
        return None


def decode_object(line: str | bytes) -> dict[str, Any] | None:
    """The journal entry in one line of `journalctl -o json`, None when the line is not one."""
    obj = load_json(line)
    if isinstance(obj, dict) and ("MESSAGE" in obj or "__CURSOR" in obj):
        return obj
    return None


def field_text(value: Any) -> str | None:
    """A journal field: a string, an array of byte values (not valid UTF-8), or several values."""
    if type(value) is str:  # nearly always
        return value
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        if not value:
            return ""
        if all(isinstance(b, int) and 0 <= b <= 255 for b in value):
            return bytes(value).decode("utf-8", "replace")
        # A field given several times: journalctl prints an array of its values; take the first.
        return field_text(value[0])
    return str(value)


def field_int(value: Any) -> int | None:
    text = field_text(value)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


ENTRY_MAX_BYTES = 1 << 20
"""The longest `journalctl -o json` line read from a host (1 MiB). journald cuts a stream line at LineMax
(48 KiB by default), but a native entry (`sd_journal_send`, `systemd-cat`) may be far larger; past this
the entry keeps the fields before the cut and the start of its MESSAGE (`cut_entry`)."""

REALTIME_MAX_US = 7_258_118_400 * 1_000_000
"""2200-01-01T00:00:00Z in µs: a `__REALTIME_TIMESTAMP` at or past it (or negative) is no time a host's
clock shows. It is refused: the entry keeps no time rather than one no date type can hold (year 10000
made the console's clock text raise)."""

# The fields a cut entry keeps, each a JSON string right after `{` or `,` (never inside a value, where a
# quote is escaped; older journalctl puts spaces around the colon).
_CUT_FIELDS = re.compile(
    rb'(?<=[{,])\s*"(__CURSOR|__REALTIME_TIMESTAMP|__MONOTONIC_TIMESTAMP|_BOOT_ID|_HOSTNAME|_PID|_COMM'
    rb'|SYSLOG_IDENTIFIER|PRIORITY|UNIT|_SYSTEMD_UNIT|_SYSTEMD_INVOCATION_ID|INVOCATION_ID)"\s*:\s*"([^"\\]*)"'
)
_CUT_MESSAGE = re.compile(rb'(?<=[{,])\s*"MESSAGE"\s*:\s*"')
_CUT_MESSAGE_HEAD = 400
"""Characters of a cut entry's MESSAGE kept before the note."""


def cut_entry(head: bytes, tail: bytes, size: int, limit: int = ENTRY_MAX_BYTES) -> dict[str, Any] | None:
    """What a `journalctl -o json` line cut after its first `limit` bytes still says, from its first
    bytes (`head`) and its last ones (`tail`; `size` in all): the entry's metadata fields (journalctl
    prints an entry's fields in no fixed order, the cursor after a huge MESSAGE as often as before it),
    and a MESSAGE of its message's start and one sentence saying what was cut. None without a cursor:
    then it is no entry a follower can resume after."""
    fields: dict[str, Any] = {}
    for part in (head, tail):
        for match in _CUT_FIELDS.finditer(part):
            name = match.group(1).decode()
            if name not in fields:
                fields[name] = match.group(2).decode("utf-8", "replace")
    if not fields.get("__CURSOR"):
        return None
    text = ""
    for part in (head, tail):
        found = _CUT_MESSAGE.search(part)
        if found is not None:
            text = _string_start(part[found.end() : found.end() + 6 * _CUT_MESSAGE_HEAD])
            break
    note = f"[k26-console: journal entry cut at {limit:,} of its {size:,} bytes]"
    fields["MESSAGE"] = f"{text[:_CUT_MESSAGE_HEAD]} {note}" if text else note
    return fields


def _string_start(raw: bytes) -> str:
    """The text of a JSON string's first bytes (its closing quote may be missing: the entry was cut)."""
    end = 0
    escaped = False
    for end, byte in enumerate(raw):  # noqa: B007 - `end` is read after the loop
        if escaped:
            escaped = False
        elif byte == 0x5C:  # backslash
            escaped = True
        elif byte == 0x22:  # the closing quote
            break
    else:
        end = len(raw)
    body = raw[:end].decode("utf-8", "ignore")
    # A cut inside an escape (`\u20`) is dropped, one character at a time, until the rest reads.
    for trim in range(7):
        try:
            text = json.loads(f'"{body[: len(body) - trim]}"')
        except ValueError:
            continue
        return text if isinstance(text, str) else ""
    return ""


class UtcClock:
    """`__REALTIME_TIMESTAMP` (µs) → ISO 8601 UTC, the formatted second kept for the next line."""

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def iso(self, realtime_us: int) -> str | None:
        seconds, micros = divmod(realtime_us, 1_000_000)
        if seconds != self._second:
            try:
                text = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
            except (OverflowError, OSError, ValueError):
                return None
            self._second, self._text = seconds, text
        return f"{self._text}.{micros:06d}+00:00"


_SOURCE_FIELDS = (
    "_HOSTNAME",
    "_PID",
    "SYSLOG_IDENTIFIER",
    "UNIT",
    "_SYSTEMD_UNIT",
    "_SYSTEMD_INVOCATION_ID",
    "INVOCATION_ID",
    "_BOOT_ID",
)
_SOURCES_KEPT = 1024


class EntryReader:
    """Journal entries → event metadata. The fields that say who wrote an entry (host, PID, unit,
    invocation, boot) repeat from entry to entry; what they give is kept per distinct set of them."""

    def __init__(self, host: str | None) -> None:
        self._host = host
        self._clock = UtcClock()
        self._sources: dict[tuple[Any, ...], tuple[dict[str, Any], Any, bool]] = {}

    def read(self, obj: dict[str, Any]) -> tuple[dict[str, Any], Any, bool]:
        """An entry's metadata for its events, the source its tracebacks are grouped by (the PID, else
        the identifier), and whether systemd wrote it (a line about the unit)."""
        get = obj.get
        key = tuple(map(get, _SOURCE_FIELDS))
        try:
            known = self._sources.get(key)
        except TypeError:  # a field given as an array (bytes, or several values): not kept
            known = None
            key = ()
        if known is None:
            known = _source_meta(obj, self._host)
            if key:
                if len(self._sources) >= _SOURCES_KEPT:
                    self._sources.clear()
                self._sources[key] = known
        source_meta, source, is_systemd = known
        meta = dict(source_meta)
        cursor = get("__CURSOR")
        if cursor is not None:
            meta["cursor"] = cursor if type(cursor) is str else field_text(cursor)
        realtime = field_int(get("__REALTIME_TIMESTAMP"))
        if realtime is not None and 0 <= realtime < REALTIME_MAX_US:
            meta["realtime_us"] = realtime
            ts = self._clock.iso(realtime)
            if ts is not None:
                meta["ts"] = ts
        return meta, source, is_systemd


def _source_meta(obj: dict[str, Any], host: str | None) -> tuple[dict[str, Any], Any, bool]:
    meta: dict[str, Any] = {}
    host = field_text(obj.get("_HOSTNAME")) or host
    if host is not None:
        meta["host"] = host
    pid = field_int(obj.get("_PID"))
    if pid is not None:
        meta["pid"] = pid
    ident = field_text(obj.get("SYSLOG_IDENTIFIER"))
    is_systemd = ident == "systemd" or (pid == 1 and ident in (None, "systemd", "init"))
    unit = field_text(obj.get("UNIT")) if is_systemd else None
    unit = unit or field_text(obj.get("_SYSTEMD_UNIT"))
    if unit is not None:
        meta["systemd_unit"] = unit
    invocation = field_text(obj.get("_SYSTEMD_INVOCATION_ID")) or field_text(obj.get("INVOCATION_ID"))
    if invocation is not None:
        meta["invocation_id"] = invocation
    boot = field_text(obj.get("_BOOT_ID"))
    if boot is not None:
        meta["boot_id"] = boot
    return meta, (pid if pid is not None else ident), is_systemd
