"""Journal lines in, typed events out: the streaming `JournalParser`.

It reads what an SGLang host prints however it reached us — `journalctl -o json` objects (as dicts or
as their JSON text), journald text, a log collector's prefixes, bare SGLang lines — in three steps,
each in its own module of `console.core.parsing`:

1. the line envelope (`parsing.envelope`, `parsing.journal_json`): who wrote the line, when, on which
   rank, and the message inside;
2. the message (`parsing.messages`: one table of handlers keyed by the message's first characters;
   `parsing.units` for systemd's lines about the unit; `parsing.errors` for error signatures and the
   Python tracebacks, which are held here until they end and become one `error` event);
3. the event (`parsing.build`): made of its fields, typed by the handlers, without validation.

The parser never raises on input: anything it does not know, or cannot make sense of, becomes a `log`
event that keeps the line. Speed figures: docs/performance.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Any, TypeVar

from console.core.events import Event
from console.core.parsing.build import build_events
from console.core.parsing.envelope import (
    ANSI,
    CACHE_SIZE,
    MONTH_INITIALS,
    SglangPrefix,
    Short,
    ends_where_journald_short_does,
    parse_tags,
    parse_who,
    read_outer,
    short_ts,
    stamp_ts,
)
from console.core.parsing.errors import HeldTraceback, line_error_category, opens_traceback
from console.core.parsing.journal_json import EntryReader, decode_object, field_text
from console.core.parsing.messages import HANDLER_KINDS, HANDLERS, PREFIX_CHARS, Handler
from console.core.parsing.server_args import parse_server_args
from console.core.parsing.units import unit_fields

__all__ = [
    "MAX_PARSE_CHARS",
    "MAX_TRACEBACK_LINES",
    "STALE_TRACEBACK_LINES",
    "JournalParser",
    "parse_lines",
    "parse_server_args",
    "parse_text",
]

MAX_TRACEBACK_LINES = 400
"""A held traceback is emitted once it reaches this many lines (SGLang's run to ~60; torch.compile's
to a few hundred); what follows becomes `log` events."""

STALE_TRACEBACK_LINES = 200
"""A traceback held for one process is emitted after this many lines from other processes: a crashed
rank prints its traceback and dies, so nothing from it would ever close it."""

MAX_PARSE_CHARS = 1 << 18
"""Longer lines are kept whole as `log` events without being parsed (a ServerArgs dump is ~25 kB)."""

_CHUNK = 1024
Fields = dict[str, Any]


class JournalParser:
    """Streaming parser: `feed` one journal item at a time (or `feed_many`), `flush` at the end.

    A Python traceback printed over many lines is held and returned as one `error` event once it ends:
    on the next line of the same process that is not part of it, after `MAX_TRACEBACK_LINES` lines,
    after `STALE_TRACEBACK_LINES` lines from other processes, or on `flush`.
    """

    def __init__(self, host: str | None = None, kinds: Iterable[str] | None = None) -> None:
        """`kinds`: build only events of these kinds (`k26-console parse --kinds`); the others are never
        built, and tracebacks are grouped whether or not errors are wanted."""
        self._host = host
        self._kinds = frozenset(kinds) if kinds is not None else None
        # With neither `log` nor `error` wanted, a message whose handler makes only unwanted kinds (or
        # that no handler claims) cannot become a wanted event: it is not read past its envelope.
        self._unread: frozenset[Handler] | None = None
        if self._kinds is not None and not self._kinds & {"log", "error"}:
            self._unread = frozenset(h for h, made in HANDLER_KINDS.items() if not made & self._kinds)
        self._held: dict[Any, HeldTraceback] = {}
        self._seen = 0
        self._prefix = SglangPrefix()
        self._entries = EntryReader(host)
        self._journald = _JournaldSglang()

    # -- public -----------------------------------------------------------------------------------

    def feed(self, item: str | bytes | dict[str, Any]) -> list[Event]:
        drafts: list[Fields] = []
        self._item(item, drafts)
        return self._build(drafts)

    def feed_many(self, items: Iterable[str | bytes | dict[str, Any]]) -> list[Event]:
        """`feed` for many items at once: the same events, in order, as feeding them one by one."""
        drafts: list[Fields] = []
        journald = self._journald.read
        body = self._body
        for item in items:
            # The bulk of a journal, a journald line carrying SGLang's bracket, straight to `_body`;
            # anything else the careful way, `_item`.
            if type(item) is str and len(item) <= MAX_PARSE_CHARS:
                try:
                    known = journald(item)
                    if known is not None:
                        self._seen += 1
                        body(known[2], known[0], known[1], True, drafts)
                        continue
                except Exception:  # the parser never raises on input; keep the line instead
                    drafts.append(self._fallback(item))
                    continue
            self._item(item, drafts, tried=item)
        return self._build(drafts)

    def flush(self) -> list[Event]:
        drafts: list[Fields] = []
        for key in list(self._held):
            self._close(key, drafts)
        return self._build(drafts)

    def _build(self, drafts: list[Fields]) -> list[Event]:
        kinds = self._kinds
        if kinds is not None:
            drafts = [draft for draft in drafts if draft["kind"] in kinds]
        return build_events(drafts)

    # -- one item ---------------------------------------------------------------------------------

    def _item(self, item: str | bytes | dict[str, Any], drafts: list[Fields], tried: object = None) -> None:
        """`tried`: a line the journald shortcut has already turned down (it is not read twice)."""
        try:
            if type(item) is str:
                line = item
            elif isinstance(item, dict):
                self._json(item, drafts)
                return
            elif isinstance(item, bytes | bytearray):
                line = bytes(item).decode("utf-8", "replace")
            else:
                line = str(item)
            if line[:1] == "{":
                obj = decode_object(line)
                if obj is not None:
                    self._json(obj, drafts)
                    return
            if line[-1:] == "\n":
                line = line[:-1]
            if line[-1:] == "\r":
                line = line[:-1]
            if "\n" in line:
                for part in line.split("\n"):
                    self._text(part.removesuffix("\r"), drafts)
            else:
                self._text(line, drafts, shortcut=line is not tried)
        except Exception:  # the parser never raises on input; keep the line instead
            drafts.append(self._fallback(item))

    def _fallback(self, item: Any) -> Fields:
        if isinstance(item, dict):
            raw = field_text(item.get("MESSAGE")) or ""
        elif isinstance(item, bytes | bytearray):
            raw = bytes(item).decode("utf-8", "replace")
        else:
            raw = str(item)
        fields: Fields = {"kind": "log", "raw": raw, "message": raw}
        if self._host is not None:
            fields["host"] = self._host
        return fields

    def _text(self, line: str, drafts: list[Fields], *, shortcut: bool = True) -> None:
        if len(line) > MAX_PARSE_CHARS:
            self._seen += 1
            drafts.append(self._fallback(line))
            return
        known = self._journald.read(line) if shortcut else None
        if known is not None:
            meta, source, msg = known
            self._seen += 1
            self._body(msg, meta, source, True, drafts)
            return
        meta = {"raw": line}
        if self._host is not None:
            meta["host"] = self._host
        if "\x1b" in line:
            line = ANSI.sub("", line)
        outer = read_outer(line, meta)
        if outer.systemd:
            self._systemd(outer.msg, meta, outer.short, drafts)
        else:
            self._message(outer.msg, meta, outer.source, outer.short, drafts)

    def _json(self, obj: dict[str, Any], drafts: list[Fields]) -> None:
        meta, source, is_systemd = self._entries.read(obj)
        message = field_text(obj.get("MESSAGE")) or ""
        if message[-1:] == "\n":
            message = message[:-1]
        if "\n" not in message:  # nearly always: the entry's metadata is the line's, without a copy
            meta["raw"] = message
            self._json_line(message, meta, source, is_systemd, drafts)
            return
        for line in message.split("\n"):
            self._json_line(line, {**meta, "raw": line}, source, is_systemd, drafts)

    def _json_line(
        self, line: str, line_meta: Fields, source: Any, is_systemd: bool, drafts: list[Fields]
    ) -> None:
        if len(line) > MAX_PARSE_CHARS:
            self._seen += 1
            drafts.append({**line_meta, "kind": "log", "message": line})
            return
        if "\x1b" in line:
            line = ANSI.sub("", line)
        if is_systemd:
            self._systemd(line, line_meta, None, drafts)
        else:
            self._message(line, line_meta, source, None, drafts)

    def _systemd(self, msg: str, meta: Fields, short: Short | None, drafts: list[Fields]) -> None:
        if short is not None and "ts" not in meta:
            meta["ts"] = short_ts(short, None)
        self._seen += 1
        fields = unit_fields(msg, meta)
        drafts.append({**meta, **fields} if fields is not None else {**meta, "kind": "log", "message": msg})

    def _message(
        self, msg: str, meta: Fields, source: Any, short: Short | None, drafts: list[Fields]
    ) -> None:
        """The message after the outer layers: SGLang's own prefix, then `_body`."""
        self._seen += 1
        msg, date, prefixed = self._prefix.read(msg, meta)
        if short is not None:
            meta["ts"] = short_ts(short, date)
        self._body(msg, meta, source, prefixed, drafts)

    def _body(self, msg: str, meta: Fields, source: Any, prefixed: bool, drafts: list[Fields]) -> None:
        """Traceback grouping, then the message handlers, then error signatures, else a `log`."""
        held = self._held
        if held:
            current = held.get(source)
            if current is not None:
                if not prefixed and current.continues(msg):
                    current.add(msg, meta, self._seen)
                    if len(current.lines) >= MAX_TRACEBACK_LINES:
                        self._close(source, drafts)
                    return
                self._close(source, drafts)
            if held:
                self._close_others(source, drafts)
        if msg[-1:] == ":" and opens_traceback(msg):
            held[source] = HeldTraceback(meta, msg, self._seen)
            return
        handler = HANDLERS.get(msg[:PREFIX_CHARS])
        unread = self._unread
        if unread is not None and (handler is None or handler in unread):
            return
        if handler is not None:
            fields = handler(msg, meta)
            if fields is not None:
                # The line's metadata joins the handler's fields (which never name it): this way round
                # costs a resize less than the other.
                fields.update(meta)
                drafts.append(fields)
                return
        category = line_error_category(msg)
        if category is not None:
            meta.update(kind="error", category=category, message=msg, lines=[meta["raw"]])
        else:
            meta["kind"] = "log"
            meta["message"] = msg
        drafts.append(meta)

    # -- tracebacks ---------------------------------------------------------------------------------

    def _close(self, source: Any, drafts: list[Fields]) -> None:
        drafts.extend(self._held.pop(source).close())

    def _close_others(self, source: Any, drafts: list[Fields]) -> None:
        seen = self._seen
        for key, held in list(self._held.items()):
            # A rank's traceback interleaves with other ranks' lines; once its summary line is in, or
            # once it has gone quiet, it is over.
            if key != source and (held.summary is not None or seen - held.last_seen >= STALE_TRACEBACK_LINES):
                self._close(key, drafts)


class _JournaldSglang:
    """The bulk of any journal in one shape: a journald `short` line carrying SGLang's bracket,
    `May 30 22:00:23 host python3[7411]: [2026-05-30 22:00:23 TP0] msg`, read with `str.find` and two
    small caches instead of the envelope's regexes: the fields of `host ident[pid]` with the rank tags
    (a handful per journal), and the line's time, once a minute (journald's stamp, with SGLang's year).
    It gives exactly what `read_outer` and `SglangPrefix` would, and None for any other line (the
    general path then reads it)."""

    def __init__(self) -> None:
        self._templates: dict[str, tuple[Fields, Any] | None] = {}
        self._minutes: dict[str, str | None] = {}

    def read(self, line: str) -> tuple[Fields, Any, str] | None:
        if (
            line[:1] not in MONTH_INITIALS
            or line[15:16] != " "
            or "\x1b" in line
            or "\r" in line
            or "\n" in line
        ):
            return None
        j = line.find(": [", 16)
        if j < 0:
            return None
        e = line.find("] ", j + 3)
        # SGLang's bracket from j + 3: its stamp `2026-05-30 22:00:23` (19 characters), then rank tags
        # after a space, or none.
        if e < j + 22 or line[j + 13] != " " or (e > j + 22 and line[j + 22] != " "):
            return None
        # `host ident[pid]`, then the tags: the key holds `: [` between them, which the first cannot
        # (j is its first), so it is unambiguous.
        key = line[16 : j + 3] + line[j + 23 : e]
        template = self._templates.get(key, _UNREAD)
        if template is _UNREAD:
            template = _cached(self._templates, key, _template(line[16:j], line[j + 23 : e]))
        if template is None:
            return None
        # The time is journald's; SGLang's stamp lends its year (and month, to tell a New Year apart).
        # Read once a minute: a line adds its own seconds, journald's two digits (SGLang's checked too).
        secs = line[12:15]
        if secs not in _SECONDS or line[j + 19 : j + 22] not in _SECONDS:
            return None
        minute = line[:12] + line[j + 3 : j + 19]
        prefix = self._minutes.get(minute, _UNREAD)
        if prefix is _UNREAD:
            whole = stamp_ts(line[:15], line[j + 3 : j + 22])
            prefix = _cached(self._minutes, minute, whole[:-3] if whole is not None else None)
        if prefix is None:
            return None
        ts = prefix + secs
        fields, source = template
        meta = fields.copy()  # a copy and two stores cost half of `{**fields, ...}`
        meta["ts"] = ts
        meta["raw"] = line
        return meta, source, line[e + 2 :]


_SECONDS = frozenset(f":{n:02d}" for n in range(61))
"""A stamp's `:SS` (60: a leap second)."""


_UNREAD: Any = object()
"""A cache's answer for a key not read yet (None is a reading: the line is the general path's)."""

_V = TypeVar("_V")


def _template(who_text: str, tags: str) -> tuple[Fields, Any] | None:
    """The fields of `host ident[pid]` and SGLang's rank tags, and the line's source (its PID)."""
    who = parse_who(who_text)
    ranks = parse_tags(tags)
    if who is None or ranks is None:
        return None
    if ":" in who_text and not ends_where_journald_short_does(who_text):
        return None  # the envelope's grammar ends the identifier at that `:`: its reading, not ours
    return {**who[0], **ranks}, who[1]


def _cached(cache: dict[str, _V], key: str, value: _V) -> _V:
    if len(cache) >= CACHE_SIZE:
        cache.clear()
    cache[key] = value
    return value


def parse_lines(lines: Iterable[str | bytes | dict[str, Any]], host: str | None = None) -> Iterator[Event]:
    """Events from journal items (text lines, JSON text or dicts; detected per item), flushed at the end.

    A list or tuple is parsed in chunks through `JournalParser.feed_many`; any other iterable one item at
    a time, so a live stream yields each line's events as soon as the line arrives.
    """
    parser = JournalParser(host)
    chunks = _chunked(lines) if isinstance(lines, list | tuple) else map(_single, lines)
    return chain(chain.from_iterable(map(parser.feed_many, chunks)), _flushed(parser))


def _chunked(lines: list[Any] | tuple[Any, ...]) -> Iterator[list[Any] | tuple[Any, ...]]:
    for start in range(0, len(lines), _CHUNK):
        yield lines[start : start + _CHUNK]


def _single(item: Any) -> tuple[Any]:
    return (item,)


def _flushed(parser: JournalParser) -> Iterator[Event]:
    """The parser's held events, once everything before has been read."""
    yield from parser.flush()


def parse_text(text: str) -> list[Event]:
    """Events from a whole journal dump. Splits on `\\n` only: a `\\r` inside a line is tqdm's, not a break."""
    if "\r\n" in text:
        text = text.replace("\r\n", "\n")
    if text.endswith("\n"):
        text = text[:-1]
    if not text:
        return []
    return list(parse_lines(text.split("\n")))
