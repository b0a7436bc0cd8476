"""A console session's recording, the pure parts: what is recorded, how a chunk of records is encoded
and compressed, the size/age policy, the marks a replay's timeline shows, and reading a time to seek to.

What a session records are its *inputs*, each with the time it arrived (docs/recording.md):

=========  ================================================================================
kind       payload
=========  ================================================================================
journal    a batch of `journalctl -o json` entries, as the session's reader decoded them
flush      nothing: the journal went quiet and the parser let go of a held traceback
gpu        a `HostGpuSample`
server     a `ServerSample` with the `/metrics` scrape it was read from, and the server's
           `max_running_requests`
seed       what the session had folded when a recording started mid-session (the `W` key): its
           `HostState`, its recent events and their count; a replay starts its fold from it
link       the SSH link's `ConnectionStatus`
follower   the journal follower's `FollowerStatus`
view       the host's `PairingView` (presence, the lock)
audit      new `AuditEntry`s of the host's audit trail
=========  ================================================================================

A replay folds them through `console.core.hostfold.HostFold` and the console's own controllers, exactly
as live. The I/O (SQLite, the writer thread) is `console.sources.recording`.

A recording may come from anywhere: what is read back is bounded here. A chunk unpacks to at most
`CHUNK_RAW_MAX` bytes (read with zlib's `max_length`: a 1.6 MB bomb unpacked to 3.2 GB), times are held to
`sane_ts` (a record's outside it is left out; a chunk's or a mark's outside it, by the reader), and
every payload is validated by the models that hold their own ranges (GPU samples, scrapes, events).
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel

from console.core.audit import AuditEntry
from console.core.events import event_adapter
from console.core.gpus import HostGpuSample
from console.core.metrics import MetricsText
from console.core.pairing import PairingView
from console.core.snapshot import ConnectionStatus, FollowerStatus, ServerSample
from console.core.state import HostState

if TYPE_CHECKING:
    from console.core.hostfold import HostFold

_dumps: Callable[[Any], bytes]
_loads: Callable[[bytes], Any]
try:  # orjson writes a busy journal's batch ~10x faster than json, in the writer thread (the GIL)
    from orjson import dumps as _dumps
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson is a dependency; kept importable without it
    import json

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    _loads = json.loads

FORMAT = "k26-console recording"
VERSION = 1
SUFFIX = ".k26rec"

Kind = Literal["journal", "flush", "gpu", "server", "link", "follower", "view", "audit"]
KINDS: frozenset[str] = frozenset({"journal", "flush", "gpu", "server", "link", "follower", "view", "audit"})
MarkKind = Literal["phase", "error", "audit", "gap"]

DEFAULT_MAX_BYTES = 2 * 1024**3
"""The default size bound of a recording: 2 GiB of compressed chunks, about 5 hours of one host at 2,000
journal lines a second (about 400 MB an hour, docs/performance.md), weeks of a quiet host."""
DEFAULT_MAX_AGE_S = 7 * 86_400.0
"""The default age bound: chunks older than a week are dropped."""
COMPRESS_LEVEL = 6
CHUNK_RAW_MAX = 32 << 20
"""The most a chunk may unpack to (32 MiB; a writer's chunk is about a second of one host, well under a
MiB at 2,000 journal lines a second). The writer keeps its chunks under half of it (`encode_chunks`)."""
TS_MAX = 7_258_118_400.0
"""2200-01-01 in Unix seconds: a recorded time past it (or before 1970, or not a number) is no moment of a
recording (1e20 and 1e300 made replay's clock text raise)."""


def sane_ts(value: object) -> float | None:
    """`value` as a recording's time (Unix seconds) when it is one, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if 0.0 <= number < TS_MAX else None  # NaN compares false


class RecordError(ValueError):
    """A chunk or record that this version cannot read; `str()` is one sentence."""


class RecordSink(Protocol):
    """Where a session puts its inputs as they arrive (`console.sources.recording.Recorder`). Called on
    the event loop: it must only queue, never write."""

    def record(self, host: str, kind: str, payload: Any) -> None: ...

    def mark(self, host: str, kind: str, label: str) -> None: ...

    def follow(self, host: str, fold: HostFold) -> None:
        """The fold `host`'s inputs go into, once they are recorded: the recorder writes keyframes of it
        (`console.core.keyframes`). Each input is recorded before it is folded, on the loop, so the fold
        holds every earlier input whenever the next one is recorded."""
        ...


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Oldest chunks are dropped once the recording holds more than `max_bytes` of them or they are older
    than `max_age_s` (None: no bound of that kind)."""

    max_bytes: int | None = DEFAULT_MAX_BYTES
    max_age_s: float | None = DEFAULT_MAX_AGE_S

    def describe(self) -> str:
        size = f"{self.max_bytes / 1024**2:,.0f} MiB" if self.max_bytes is not None else "no size bound"
        age = f"{self.max_age_s / 3600:g} h" if self.max_age_s is not None else "no age bound"
        return f"{size}, {age}"


@dataclass(frozen=True, slots=True)
class Record:
    """One input as recorded: when it arrived, on which host, what kind, and its payload decoded."""

    ts: float
    host: str
    kind: str
    payload: Any


@dataclass(frozen=True, slots=True)
class Mark:
    ts: float
    host: str
    kind: str
    label: str


# ---- encoding --------------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """A model's python dump as JSON values, keeping what JSON has no number for: pydantic's JSON mode
    writes an infinite float (a histogram's `+Inf` bucket) as null, which does not validate back;
    "inf" does. Dispatched on the exact type first: a scrape's dump is thousands of values, a keyframe's
    hundreds of thousands."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        return value if value - value == 0.0 else str(value)  # inf - inf and nan - nan are nan
    if kind is dict:
        return {k if type(k) is str else str(k): _jsonable(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_jsonable(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    return value


def _dump(model: BaseModel) -> Any:
    return _jsonable(model.model_dump(mode="python"))


def _plain(kind: str, payload: Any) -> Any:
    """The payload as JSON-able values."""
    if kind == "journal":
        return payload
    if kind == "flush":
        return None
    if kind == "server":
        sample, max_running = payload
        assert isinstance(sample, ServerSample)
        scrape = _dump(sample.scrape) if sample.scrape is not None else None
        return {"sample": _dump(sample), "scrape": scrape, "max_running": max_running}
    if kind == "audit":
        return [_dump(entry) for entry in payload]
    if kind == "seed":
        state, recent, total = payload
        return {"state": _dump(state), "recent": [_dump(e) for e in recent], "events_total": total}
    if isinstance(payload, BaseModel):
        return _dump(payload)
    raise RecordError(f"a {kind} record cannot hold {type(payload).__name__}")


_MODELS: dict[str, type[BaseModel]] = {
    "gpu": HostGpuSample,
    "link": ConnectionStatus,
    "follower": FollowerStatus,
    "view": PairingView,
}


def _typed(kind: str, plain: Any) -> Any:
    """The payload from its JSON values (pydantic validates what comes back from the file)."""
    if kind == "journal":
        if not isinstance(plain, list):
            raise RecordError("a journal record is not a list of entries")
        return plain
    if kind == "flush":
        return None
    if kind == "server":
        sample = ServerSample.model_validate(plain["sample"])
        if plain.get("scrape") is not None:
            sample = sample.model_copy(update={"scrape": MetricsText.model_validate(plain["scrape"])})
        limit = plain.get("max_running")
        return sample, float(limit) if isinstance(limit, int | float) else None
    if kind == "audit":
        return [AuditEntry.model_validate(entry) for entry in plain]
    if kind == "seed":
        recent = tuple(event_adapter().validate_python(e) for e in plain["recent"])
        return HostState.model_validate(plain["state"]), recent, int(plain["events_total"])
    model = _MODELS.get(kind)
    if model is None:
        raise RecordError(f"unknown record kind {kind!r}")
    return model.model_validate(plain)


def encode(records: Iterable[tuple[float, str, str, Any]]) -> tuple[bytes, int]:
    """A chunk: the records as JSON lines, compressed; and their size before compression."""
    lines = [_dumps([ts, host, kind, _plain(kind, payload)]) for ts, host, kind, payload in records]
    raw = b"\n".join(lines)
    return zlib.compress(raw, COMPRESS_LEVEL), len(raw)


@dataclass(frozen=True, slots=True)
class Chunk:
    blob: bytes
    raw_bytes: int
    t0: float
    t1: float
    records: int


def encode_chunks(
    records: Sequence[tuple[float, str, str, Any]], *, max_raw: int = CHUNK_RAW_MAX // 2
) -> list[Chunk]:
    """`records` as chunks of at most `max_raw` bytes unpacked each (a record larger than that is a chunk
    of its own): what a replay reads back within `CHUNK_RAW_MAX`."""
    chunks: list[Chunk] = []
    lines: list[bytes] = []
    first = 0
    size = 0

    def close(end: int) -> None:
        raw = b"\n".join(lines)
        chunks.append(
            Chunk(
                zlib.compress(raw, COMPRESS_LEVEL),
                len(raw),
                records[first][0],
                records[end - 1][0],
                end - first,
            )
        )

    for n, (ts, host, kind, payload) in enumerate(records):
        line = _dumps([ts, host, kind, _plain(kind, payload)])
        if lines and size + len(line) + 1 > max_raw:
            close(n)
            lines, first, size = [], n, 0
        lines.append(line)
        size += len(line) + 1
    if lines:
        close(len(records))
    return chunks


def decode(blob: bytes, *, kinds: frozenset[str] | None = None, max_raw: int = CHUNK_RAW_MAX) -> list[Record]:
    """A chunk's records, oldest first (`kinds`: only those). RecordError when it is not one, or when
    it unpacks to more than `max_raw` bytes (unpacked only that far). A record whose time is no moment
    (`sane_ts`) is left out."""
    inflate = zlib.decompressobj()
    try:
        data = inflate.decompress(blob, max_raw + 1)
    except zlib.error:
        raise RecordError("a chunk is not compressed as this version writes it") from None
    if len(data) > max_raw or inflate.unconsumed_tail:
        raise RecordError(
            f"a chunk unpacks to more than {max_raw:,} bytes (this version writes at most half)"
        )
    if not inflate.eof:
        raise RecordError("a chunk is not compressed as this version writes it (it ends early)")
    out: list[Record] = []
    for line in data.split(b"\n"):
        try:
            ts, host, kind, plain = _loads(line)
        except (ValueError, TypeError, RecursionError):
            raise RecordError("a chunk holds a line that is not a record") from None
        if kinds is not None and kind not in kinds:
            continue
        when = sane_ts(ts)
        if when is None:
            continue
        try:
            out.append(Record(when, str(host)[:256], str(kind), _typed(str(kind), plain)))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            if isinstance(exc, RecordError):
                raise
            raise RecordError(f"a {kind} record does not read back ({type(exc).__name__})") from None
    return out


def others_only(view: PairingView, consoles: frozenset[str]) -> PairingView:
    """A recorded pairing view without the consoles that recorded it: live, a console never lists itself
    among the consoles on a host (`PairingView.others`), and a replay shows what it showed."""
    kept = [p for p in view.presence if p.console_id not in consoles]
    return view if len(kept) == len(view.presence) else view.model_copy(update={"presence": kept})


# ---- marks on the timeline -------------------------------------------------------------------------


def marks_between(before: HostState, after: HostState) -> list[tuple[str, str]]:
    """What a replay's timeline marks between two states of the fold: a boot reaching a new phase (a
    restart's steps), and new errors."""
    out: list[tuple[str, str]] = []
    old = {b.index: b for b in before.boots}
    for boot in after.boots[-3:]:
        prev = old.get(boot.index)
        if prev is None or prev.phase != boot.phase:
            out.append(("phase", f"boot {boot.index} {boot.phase}"))
        seen = len(prev.errors) if prev is not None else 0
        for error in boot.errors[seen:]:
            out.append(("error", f"boot {boot.index} {error.category}: {error.message[:80]}"))
    return out


def restart_marks(marks: Sequence[Mark]) -> set[int]:
    """The positions of the marks that begin a restart (▲): each boot's first mark, whatever phase the fold
    first saw it in (a batch of journal lines read at once can take a new boot past "starting"); the
    recording's first boot only when it began in the recording."""
    boots = [_boot_index(m.label) if m.kind == "phase" else None for m in marks]
    first = min((b for b in boots if b is not None), default=None)
    seen: set[int] = set()
    out: set[int] = set()
    for n, (mark, boot) in enumerate(zip(marks, boots, strict=True)):
        if boot is None or boot in seen:
            continue
        seen.add(boot)
        if boot != first or mark.label.endswith("starting"):
            out.add(n)
    return out


OPENING_S = 10.0
"""How far into a recording its first state may lie (`opening_of`)."""


@dataclass(frozen=True, slots=True)
class Opening:
    """How a recording opens. A session that starts with its recording (`record`, `--record`) first reads
    the host's journal backlog: lines logged before the recording began, folded in its first moments."""

    first_state: float
    """Where the recording's first state stands, a replay's `start`: once each host's backlog, its first
    GPU sample and its first server reading are in (those that came within `OPENING_S`). Before it, the
    hosts' screens were still filling: `replay --at start` printed every field null."""
    history_until: dict[str, float]
    """Per host: its phase and error marks before this time came from the backlog (a boot that was
    ready long before the recording reached "loading" and "ready" in its first 0.3 s): history, not
    something that happened while it recorded."""

    def is_history(self, mark: Mark) -> bool:
        return mark.kind in ("phase", "error") and mark.ts < self.history_until.get(mark.host, -math.inf)


def _oldest_entry_s(entries: object) -> float | None:
    """The journal time (the host's clock, seconds) of the oldest entry of a batch that says one."""
    oldest: int | None = None
    if isinstance(entries, list):
        for entry in entries:
            value = entry.get("__REALTIME_TIMESTAMP") if isinstance(entry, dict) else None
            if isinstance(value, str) and value.isdigit() and len(value) <= 19:
                micros = int(value)
                oldest = micros if oldest is None else min(oldest, micros)
    return oldest / 1e6 if oldest is not None else None


def opening_of(records: Iterable[Record], start: float, hosts: Sequence[str] = ()) -> Opening:
    """The opening (`Opening`) of a recording that begins at `start`, from its records in order, read only
    as far as needed: `OPENING_S`, or until each of `hosts` has read past its backlog and has its first
    GPU sample and server reading.

    A journal batch is backlog when its oldest entry was logged before the host's first record, on the
    host's clock (this machine's, corrected by the first pairing view's reading of the host's clock when
    there is one); the backlog is the host's leading run of such batches. A seed (what a session had
    read before the recording began) is no backlog: it is the state."""
    end = start + OPENING_S
    summary: list[tuple[float, str, str, float | None]] = []
    skew: dict[str, float] = {}
    first_seen: dict[str, float] = {}
    live: set[str] = set()
    kinds: dict[str, set[str]] = {}
    exhausted = True
    it = iter(records)
    for record in it:
        oldest = _oldest_entry_s(record.payload) if record.kind == "journal" else None
        summary.append((record.ts, record.host, record.kind, oldest))
        if record.ts > end:
            exhausted = False
            break
        host = record.host
        begin = first_seen.setdefault(host, record.ts)
        kinds.setdefault(host, set()).add(record.kind)
        if record.kind == "view" and host not in skew and isinstance(record.payload, PairingView):
            skew[host] = record.payload.now.timestamp() - record.ts
        elif record.kind == "seed" or (
            record.kind == "journal" and (oldest is None or oldest - skew.get(host, 0.0) >= begin)
        ):
            live.add(host)
        if hosts and all(h in live and {"gpu", "server"} <= kinds.get(h, set()) for h in hosts):
            # Settled; one record more, where the last batch's marks end.
            after = next(it, None)
            if after is not None:
                summary.append((after.ts, after.host, after.kind, None))
                exhausted = False
            break
    first_seen.clear()
    in_backlog: dict[str, bool] = {}
    last_backlog: dict[str, int] = {}
    state_at: dict[str, float] = {}
    firsts: dict[tuple[str, str], float] = {}
    for n, (ts, host, kind, oldest) in enumerate(summary):
        if ts > end:
            break
        begin = first_seen.setdefault(host, ts)
        if kind in ("gpu", "server"):
            firsts.setdefault((host, kind), ts)
        elif kind == "seed":
            in_backlog[host] = False
            state_at.setdefault(host, ts)
        elif kind == "journal":
            backlog = oldest is not None and oldest - skew.get(host, 0.0) < begin
            if backlog and in_backlog.get(host, True):
                last_backlog[host] = n
                state_at[host] = ts
            else:
                in_backlog[host] = False
                state_at.setdefault(host, ts)
    history_until: dict[str, float] = {}
    for host, n in last_backlog.items():
        # The marks of the backlog's last batch come after it, before any other record.
        if n + 1 < len(summary):
            history_until[host] = summary[n + 1][0]
        else:
            history_until[host] = math.inf if exhausted else summary[n][0]
    moments = [*state_at.values(), *firsts.values()]
    return Opening(first_state=max(moments, default=start), history_until=history_until)


def _boot_index(label: str) -> int | None:
    """N of a phase mark's label, `boot N PHASE`."""
    words = label.split()
    return int(words[1]) if len(words) >= 3 and words[0] == "boot" and words[1].isdigit() else None


# ---- times -----------------------------------------------------------------------------------------

_OFFSET = re.compile(r"^([+-])?\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_CLOCK = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2})(?:\.(\d+))?)?$")


def parse_at(text: str, start: float, end: float) -> float:
    """A moment of a recording from the operator's words: `start`, `end`, an offset from the start
    (`90s`, `+5m`, `1h`), an offset back from the end (`-30s`), a UTC time of day on the recording's days
    (`03:12`, `03:12:07`), or an ISO date and time (UTC unless it says otherwise). Clamped to the
    recording; ValueError with one sentence when it is none of these."""
    raw = text.strip()
    word = raw.lower()
    if word in ("start", "begin", "beginning"):
        return start
    if word == "end":
        return end
    match = _OFFSET.match(word)
    if match is not None:
        sign, value, unit = match.groups()
        offset = float(value) * _UNITS[unit or "s"]
        at = end - offset if sign == "-" else start + offset
        return min(max(at, start), end)
    match = _CLOCK.match(word)
    if match is not None:
        hh, mm, ss, frac = match.groups()
        seconds = int(hh) * 3600 + int(mm) * 60 + int(ss or 0) + float(f"0.{frac}" if frac else 0)
        if int(hh) > 23 or int(mm) > 59 or int(ss or 0) > 59:
            raise ValueError(f"{raw!r} is not a time of day")
        day = datetime.fromtimestamp(start, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        at = day.timestamp() + seconds
        if at < start:  # a recording across midnight: the time on its second day
            at += 86_400.0
        return min(max(at, start), end)
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(
            f"{raw!r} is not a moment of the recording (try 90s, +5m, -30s, 03:12:07, an ISO time, "
            "start or end)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return min(max(moment.timestamp(), start), end)


def clock_text(ts: float) -> str:
    """A recording's moment as the timeline writes it (UTC); `--:--:--` for no moment a clock shows."""
    if sane_ts(ts) is None:
        return "--:--:--"
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S")
