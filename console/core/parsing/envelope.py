"""The line envelope: everything around SGLang's message, read outside in.

    [collector]  [stamp]  [journald]  [SGLang's prefix]  message

- collector: `docker compose logs`' `worker-1  | ` (v1 `worker_1 | `) or `kubectl logs --prefix`'s
  `[pod/NAME/CONTAINER] `;
- stamp, written by whoever collected the line: `docker logs -t` / `kubectl logs --timestamps`
  (`2026-05-30T22:00:23.123456789Z `, RFC 3339 with `Z` or an offset), Docker Desktop's
  `2025-02-04 21:21:33 ` (local time, no zone), or a Python logger wrapping SGLang
  (`2025-03-07 23:50:27,531 - __main__ - INFO - `);
- journald text: `short` / `short-precise` (`May 30 22:00:23[.123456] host ident[pid]: `) or
  `short-iso[-precise]` (`2026-05-30T22:00:23+0000 host ident[pid]: `, told from a collector stamp by
  its offset: docker and kubectl print UTC as `Z`). `journalctl -o json` arrives without any of these;
- SGLang's own prefix, in every version: `[date time TAGS] `, `[date time.ms TAGS] `, the old
  `[HH:MM:SS TPn] `, v0.1's `Rank N: `, torch's `[rankN]:`, v0.2/0.3's `[gpu_id=N] ` / `[gpu=N] `, with
  the rank tags `DPn PPn ATTN_CPn MOE_DPn TPn EPn` in any order; a tqdm bar may sit glued before it.

`ts` is the outermost stamp: the collector's or journald's time, else SGLang's. journald `short` has
no year: it borrows SGLang's (see `year_for`) or stays in ISO 8601's yearless `--MM-DDThh:mm:ss` form.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

MONTHS = {
    "Jan": "01",
    "Feb": "02",
    "Mar": "03",
    "Apr": "04",
    "May": "05",
    "Jun": "06",
    "Jul": "07",
    "Aug": "08",
    "Sep": "09",
    "Oct": "10",
    "Nov": "11",
    "Dec": "12",
}
MONTH_INITIALS = frozenset(m[0] for m in MONTHS)

# `May 30 22:00:23 host ident[pid]: msg` (short) and `May 30 22:00:23.123456 ...` (short-precise).
# The identifier ends at its `[pid]: ` when it has one (an identifier may hold a `:`), else at a `:`.
_JOURNAL_SHORT = re.compile(
    r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) ([ \d]\d) (\d\d:\d\d:\d\d(?:\.\d{1,9})?) "
    r"(\S+) (?:(\S+?)\[(\d+)\]|(\S+?)): ?",
    re.ASCII,
)
_JOURNAL_CLOCK = re.compile(
    r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) ([ \d]\d) (\d\d:\d\d:\d\d)", re.ASCII
)
# `2026-05-30T22:00:23+0000 host ident[pid]: msg` (short-iso) and `2026-05-30T22:00:23.123456789Z msg`.
_ISO_STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d{1,9})?(Z|[+-]\d\d:?\d\d)? ", re.ASCII)
_JOURNAL_ISO_REST = re.compile(r"(\S+) (\S+?)(?:\[(\d+)\])?: ", re.ASCII)
# Docker Desktop's log view: `2025-02-04 21:21:33 msg` (its local time).
_DESKTOP_STAMP = re.compile(r"(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d)(\.\d{1,9})? ", re.ASCII)
_PYLOG = re.compile(
    r"(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d),(\d{3}) - (?:\S+ - )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) - ",
    re.ASCII,
)
_COMPOSE = re.compile(r"([A-Za-z0-9][\w.-]*)\s+\|(?: |$)", re.ASCII)
_KUBECTL = re.compile(r"\[pod/([^/\]\s]+)/([^/\]\s]+)\] ", re.ASCII)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]", re.ASCII)

# SGLang's bracket anywhere in a line, for a tqdm bar written just before it (case-18).
_GLUED = re.compile(r"\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:\.\d+)?(?: [A-Z_]+\d+)*\] ", re.ASCII)
_DATE = re.compile(r"\d{4}-\d\d-\d\d", re.ASCII)
_TIME = re.compile(r"\d\d:\d\d:\d\d(?:\.\d{1,6})?", re.ASCII)
_TAG = re.compile(r"(ATTN_CP|MOE_DP|DP|PP|TP|EP)(\d+)", re.ASCII)
_TAG_FIELD = {
    "DP": "dp_rank",
    "PP": "pp_rank",
    "ATTN_CP": "attn_cp_rank",
    "MOE_DP": "moe_dp_rank",
    "TP": "tp_rank",
    "EP": "ep_rank",
}
_RANK_COLON = re.compile(r"Rank (\d+): ", re.ASCII)
_TORCH_RANK = re.compile(r"\[rank(\d+)\]:", re.ASCII)
_GPU_TAG = re.compile(r"\[gpu(?:_id)?=(\d+)\] ", re.ASCII)
_WHO = re.compile(r"(\S+) (\S+?)(?:\[(\d+)\])?", re.ASCII)

CACHE_SIZE = 4096
"""Entries per cache below: a journal has a handful of processes and rank tags, one stamp a second."""


class Short(NamedTuple):
    """journald `short`'s yearless stamp: month `05`, day `30`, clock `22:00:23[.123456]`."""

    month: str
    day: str
    clock: str


class Bracket(NamedTuple):
    """SGLang's `[…] ` prefix read: its time, its date when it has one, the rank fields."""

    ts: str
    date: str | None
    ranks: dict[str, int]


def year_for(month: str, date: str) -> str:
    """Year for a yearless journald stamp in `month`, from SGLang's `date` on the same line."""
    year = int(date[:4])
    sgl_month = date[5:7]
    if month == "12" and sgl_month == "01":
        year -= 1
    elif month == "01" and sgl_month == "12":
        year += 1
    return str(year)


def short_ts(short: Short, date: str | None) -> str:
    if date is None:
        return f"--{short.month}-{short.day}T{short.clock}"
    return f"{year_for(short.month, date)}-{short.month}-{short.day}T{short.clock}"


def parse_tags(tags: str) -> dict[str, int] | None:
    """`DP0 TP0 EP0` → {'dp_rank': 0, 'tp_rank': 0, 'ep_rank': 0}; None if a word is not a rank tag."""
    ranks: dict[str, int] = {}
    for tag in tags.split(" ") if tags else ():
        m = _TAG.fullmatch(tag)
        if m is None:
            return None
        ranks[_TAG_FIELD[m.group(1)]] = int(m.group(2))
    return ranks


def parse_bracket(inner: str) -> Bracket | None:
    """`2026-05-30 22:00:23 TP7` → its time, date and ranks; None when it is not SGLang's prefix."""
    parts = inner.split(" ")
    head = parts[0]
    if len(parts) >= 2 and len(head) == 10 and _DATE.fullmatch(head) and _TIME.fullmatch(parts[1]):
        date: str | None = head
        ts = f"{head}T{parts[1]}"
        tags = parts[2:]
    elif _TIME.fullmatch(head):
        date = None
        ts = head
        tags = parts[1:]
    else:
        return None
    ranks: dict[str, int] = {}
    for tag in tags:
        # A tag this parser does not know (a future SGLang rank kind) is skipped; the prefix is kept.
        m = _TAG.fullmatch(tag)
        if m is not None:
            ranks[_TAG_FIELD[m.group(1)]] = int(m.group(2))
    return Bracket(ts, date, ranks)


def parse_who(text: str) -> tuple[dict[str, Any], Any] | None:
    """`host python3[7411]` → ({'host': 'host', 'pid': 7411}, 7411); None for systemd or a non-match."""
    m = _WHO.fullmatch(text)
    if m is None:
        return None
    host, ident, pid = m.groups()
    if ident == "systemd":
        return None
    if pid is None:
        return {"host": host}, ident
    return {"host": host, "pid": int(pid)}, int(pid)


def ends_where_journald_short_does(who_text: str) -> bool:
    """Whether `_JOURNAL_SHORT` reads `host ident[pid]` whole before `: [` (not cut at a `:` in it)."""
    line = f"May 30 00:00:00 {who_text}: ["
    m = _JOURNAL_SHORT.match(line)
    return m is not None and m.end() == len(line) - 1


def stamp_ts(journal_clock: str, sglang_stamp: str) -> str | None:
    """`May 30 22:00:23` + `2026-05-30 22:00:23` → `2026-05-30T22:00:23` (journal time, SGLang's year)."""
    m = _JOURNAL_CLOCK.fullmatch(journal_clock)
    date = sglang_stamp[:10]
    if m is None or not _DATE.fullmatch(date) or not _TIME.fullmatch(sglang_stamp[11:]):
        return None
    month = MONTHS[m.group(1)]
    return f"{year_for(month, date)}-{month}-{m.group(2).replace(' ', '0')}T{m.group(3)}"


class Outer(NamedTuple):
    """What the outer layers (collector, stamp, journald) said about a text line."""

    msg: str
    source: Any
    short: Short | None
    systemd: bool


def read_outer(line: str, meta: dict[str, Any]) -> Outer:
    """The collector, stamp and journald layers of a text line: into `meta`, and the rest of the line."""
    first = line[:1]
    if first in MONTH_INITIALS:
        m = _JOURNAL_SHORT.match(line)
        if m is not None:
            mon, day, clock, host, pid_ident, pid, ident = m.groups()
            ident = ident if pid is None else pid_ident
            meta["host"] = host
            source: Any = ident
            if pid is not None:
                meta["pid"] = source = int(pid)
            short = Short(MONTHS[mon], day.replace(" ", "0"), clock)
            return Outer(line[m.end() :], source, short, ident == "systemd")
    elif first.isdigit():
        msg, source = _read_stamp(line, meta, journald=True)
        return Outer(msg, source, None, False)
    elif first == "[":
        m = _KUBECTL.match(line)
        if m is not None:
            msg, _ = _read_stamp(line[m.end() :], meta, journald=False)
            return Outer(msg, m.group(1), None, False)
    if first != " " and first != "[" and "|" in line[:64]:
        m = _COMPOSE.match(line)
        if m is not None:
            msg, _ = _read_stamp(line[m.end() :], meta, journald=True)
            return Outer(msg, m.group(1), None, False)
    return Outer(line, None, None, False)


def _read_stamp(line: str, meta: dict[str, Any], journald: bool) -> tuple[str, Any]:
    """A collector's stamp, journald's `short-iso` (when `journald`) or a wrapping Python logger."""
    if not line[:1].isdigit():
        return line, None
    m = _ISO_STAMP.match(line)
    if m is not None:
        stamp, frac, zone = m.groups()
        ts = stamp + (frac[:7] if frac else "")
        rest = line[m.end() :]
        if zone is None or zone == "Z" or not journald:
            # A collector's stamp: docker and kubectl print UTC as `Z`; journald's short-iso an offset.
            meta["ts"] = ts + ("+00:00" if zone == "Z" else _offset(zone) if zone else "")
            return _without_pylog(rest), None
        meta["ts"] = ts + _offset(zone)
        j = _JOURNAL_ISO_REST.match(rest)
        if j is None:  # a collector's stamp with an offset (kubectl on a host not on UTC)
            return _without_pylog(rest), None
        host, ident, pid = j.groups()
        meta["host"] = host
        source: Any = ident
        if pid is not None:
            meta["pid"] = source = int(pid)
        return rest[j.end() :], source
    m = _DESKTOP_STAMP.match(line)
    if m is not None:
        date, clock, frac = m.groups()
        meta["ts"] = f"{date}T{clock}{frac[:7] if frac else ''}"
        return _without_pylog(line[m.end() :]), None
    m = _PYLOG.match(line)
    if m is not None:
        meta["ts"] = f"{m.group(1)}T{m.group(2)}.{m.group(3)}"
        return line[m.end() :], None
    return line, None


def _without_pylog(rest: str) -> str:
    """A collector's line may hold a Python logger's (case-34 under `docker logs -t`); its stamp is
    the later one, so the collector's is kept."""
    if rest[:1].isdigit():
        m = _PYLOG.match(rest)
        if m is not None:
            return rest[m.end() :]
    return rest


def _offset(zone: str) -> str:
    return zone if ":" in zone else f"{zone[:3]}:{zone[3:]}"


class SglangPrefix:
    """SGLang's own prefix on a message; brackets are read once each (a journal has one a second)."""

    def __init__(self) -> None:
        self._brackets: dict[str, Bracket | None] = {}

    def bracket(self, inner: str) -> Bracket | None:
        cache = self._brackets
        try:
            return cache[inner]
        except KeyError:
            if len(cache) >= CACHE_SIZE:
                cache.clear()
            parsed = cache[inner] = parse_bracket(inner)
            return parsed

    def read(self, msg: str, meta: dict[str, Any]) -> tuple[str, str | None, bool]:
        """The message without SGLang's prefix (its time and ranks into `meta`), the prefix's date, and
        whether there was one (a prefixed line starts a new record: it cannot continue a traceback)."""
        if "\r" in msg:
            msg = last_frame(msg)
        for _ in range(2):  # the line, then once more from a bracket a tqdm bar was glued before
            first = msg[:1]
            if first == "[":
                end = msg.find("] ")
                # torch's and v0.2's tags count only on a line that has a `] ` somewhere (as before
                # issue 19: `[rank0]: Traceback …` alone stays whole, its tag in the message).
                if end > 0:
                    parsed = self.bracket(msg[1:end])
                    if parsed is not None:
                        meta.setdefault("ts", parsed.ts)
                        if parsed.ranks:
                            meta.update(parsed.ranks)
                        return msg[end + 2 :], parsed.date, True
                    if msg.startswith("[rank"):
                        m = _TORCH_RANK.match(msg)
                        if m is not None:
                            meta["tp_rank"] = int(m.group(1))
                            return msg[m.end() :], None, True
                    elif msg.startswith("[gpu"):
                        m = _GPU_TAG.match(msg)
                        if m is not None:
                            meta["tp_rank"] = int(m.group(1))
                            return msg[m.end() :], None, True
            elif first == "R" and msg.startswith("Rank "):
                m = _RANK_COLON.match(msg)
                if m is not None:
                    meta["tp_rank"] = int(m.group(1))
                    return msg[m.end() :], None, True
            if "][" not in msg:
                break
            g = _GLUED.search(msg)
            if g is None:
                break
            msg = msg[g.start() :]
        return msg, None, False


def last_frame(msg: str) -> str:
    """A tqdm bar rewrites itself with `\\r`; keep SGLang's line if one hides in it, else the last frame."""
    frames = [f for f in msg.split("\r") if f.strip()]
    if not frames:
        return ""
    for frame in reversed(frames):
        if frame.startswith("[") or "][" in frame:
            g = _GLUED.search(frame)
            if g is not None:
                return frame[g.start() :]
    return frames[-1]
