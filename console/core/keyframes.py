"""Keyframes of a recording: a host's whole fold written now and then, so that a seek folds from the
nearest one instead of from the recording's first line (issue 33).

A keyframe (`FoldImage`) is what a replay holds of one host at a place in the record stream: the fold
(`HostFold`: the state, the event tail, the latest GPU and server readings, the serving window) and what
the replay keeps beside it (`Aside`: the link, the follower, the pairing view, the audit entries). The
recorder takes one on the event loop, where the fold lives, and encodes it in its writer thread; a replay
restores it into a fresh fold and folds on from there. Taken only while the parser holds no traceback, so
a fresh parser continues exactly where the live one was (its other state is caches).

When (`KeyframeClock`): at each new boot, every `KEYFRAME_EVERY_S` of recording time, and every
`KEYFRAME_ENTRIES` journal entries, whichever comes first, so that a seek folds at most that much input
whatever the journal's rate (at 2,000 lines/s, 10 s: well under a second of CPU).

A keyframe comes from a file, from anywhere: it unpacks to at most `KEYFRAME_RAW_MAX` bytes, every part is
validated by its model (which holds its own ranges), and its lists are held to the bounds below. One that
does not read back is passed over (the seek folds from an earlier place: slower, never wrong).
"""

from __future__ import annotations

import math
import zlib
from collections import deque
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import orjson

from console.core.audit import AuditEntry
from console.core.events import Event, event_adapter
from console.core.gpus import HostGpuSample
from console.core.hostfold import MAX_SCRAPES, HostFold
from console.core.pairing import PairingView
from console.core.recording import (
    CHUNK_RAW_MAX,
    COMPRESS_LEVEL,
    RecordError,
    _jsonable,
    _loads,
    _plain,
    _typed,
)
from console.core.serving import PairDelta, Scrape, ServingFigures, TrendPoint
from console.core.snapshot import ConnectionStatus, FollowerStatus, ServerSample
from console.core.state import HostState

KEYFRAME_VERSION = 1
KEYFRAME_EVERY_S = 60.0
"""N: recording time between two keyframes of a host that has any input (a quiet host's are small)."""
KEYFRAME_ENTRIES = 20_000
"""Journal entries between two keyframes of a busy host (10 s at 2,000 lines/s)."""
KEYFRAME_RAW_MAX = CHUNK_RAW_MAX
"""The most a keyframe may unpack to (32 MiB); the writer leaves out one over half of it."""
EVENTS_MAX = 10_000
"""Events of the tail a keyframe may hold (a console keeps 2,000)."""
AUDITS_MAX = 500
"""Batches of audit entries a keyframe may hold (a replay keeps 500)..."""
AUDIT_ENTRIES_MAX = 5_000
"""...and entries in them all."""
BOOTS_MAX = 10_000
SEQ_MAX = 10**15
GPUS_MAX = 64
"""A sample holds at most 64 GPUs (`console.core.gpus`)."""
XID_MAX = 1 << 16
XID_KEYS_MAX = 4_096
XID_TIMES_MAX = 64
"""Times kept per GPU and XID (`console.core.gpuhealth`'s memory)."""


@dataclass
class Aside:
    """What a replay keeps of a host beside its fold: the link, the journal follower (its entry count and
    cursor are the replay's own: what it read), the pairing view, and the audit entries with the number
    of journal events the host had made when they came (where they go in the feed)."""

    link: ConnectionStatus | None = None
    follower: FollowerStatus = field(default_factory=FollowerStatus)
    view: PairingView | None = None
    audits: deque[tuple[int, list[AuditEntry]]] = field(default_factory=lambda: deque(maxlen=AUDITS_MAX))
    seq: int = 0
    """Records of the host applied: a snapshot's sequence number (what changed since the last one)."""

    def note(self, kind: str, payload: Any, events_total: int) -> None:
        """One record of the host, for everything but its fold."""
        if kind == "journal":
            cursor = next(
                (e.get("__CURSOR") for e in reversed(payload) if isinstance(e, dict)), self.follower.cursor
            )
            self.follower = self.follower.model_copy(
                update={"cursor": cursor, "entries": self.follower.entries + len(payload)}
            )
        elif kind == "link":
            self.link = payload
        elif kind == "follower":
            # The live status counted entries from its own start; the replay counts what it read.
            self.follower = payload.model_copy(
                update={"entries": self.follower.entries, "cursor": self.follower.cursor or payload.cursor}
            )
        elif kind == "view":
            self.view = payload
        elif kind == "audit":
            self.audits.append((events_total, list(payload)))
        self.seq += 1

    def copy(self) -> Aside:
        return Aside(
            link=self.link,
            follower=self.follower,
            view=self.view,
            audits=deque(self.audits, maxlen=AUDITS_MAX),
            seq=self.seq,
        )


@dataclass(frozen=True, slots=True)
class FoldImage:
    """One host's fold and aside at a place of the record stream: immutable parts only (the models are
    frozen, the containers tuples), so the writer thread may encode it while the loop folds on."""

    host: str
    state: HostState
    recent: tuple[Event, ...]
    events_total: int
    gpus: HostGpuSample | None
    xids_seen: tuple[tuple[int, int, tuple[float, ...]], ...]
    """The fold's `XidWatch`: the XIDs already on the feed (GPU, XID, their times)..."""
    xids_untimed: tuple[tuple[int, int, int], ...]
    """...and those no time identifies, with how many a sample carried at most."""
    server: ServerSample | None
    max_running: float | None
    serving: ServingFigures | None
    scrapes: tuple[Scrape, ...]
    deltas: tuple[PairDelta, ...]
    trend: tuple[TrendPoint, ...]
    link: ConnectionStatus | None
    follower: FollowerStatus
    view: PairingView | None
    audits: tuple[tuple[int, tuple[AuditEntry, ...]], ...]
    seq: int


def holds_traceback(fold: HostFold) -> bool:
    """The parser is holding a traceback for more lines: a keyframe now would lose it."""
    return bool(fold.parser._held)


def image_of(fold: HostFold, aside: Aside) -> FoldImage | None:
    """The fold and aside as they stand (cheap: references to immutable parts and a few tuples), or None
    while the parser holds a traceback."""
    if holds_traceback(fold):
        return None
    history = fold.history
    return FoldImage(
        host=fold.host,
        state=fold.state,
        recent=tuple(fold.recent),
        events_total=fold.events_total,
        gpus=fold.gpus,
        xids_seen=tuple((gpu, xid, tuple(times)) for (gpu, xid), times in fold.xids.seen.items()),
        xids_untimed=tuple((gpu, xid, n) for (gpu, xid), n in fold.xids.untimed.items()),
        server=fold.server,
        max_running=fold.max_running,
        serving=fold.serving,
        scrapes=tuple(history.scrapes),
        deltas=tuple(history.deltas),
        trend=tuple(history.trend),
        link=aside.link,
        follower=aside.follower,
        view=aside.view,
        audits=tuple((count, tuple(entries)) for count, entries in aside.audits),
        seq=aside.seq,
    )


def restore(image: FoldImage, fold: HostFold) -> Aside:
    """`image` into `fold` (a fresh one: its parser holds nothing, as the live one did); the aside."""
    fold.state = image.state
    fold.recent.clear()
    fold.recent.extend(image.recent)
    fold.events_total = image.events_total
    fold.gpus = image.gpus
    fold.xids.seen = {(gpu, xid): list(times) for gpu, xid, times in image.xids_seen}
    fold.xids.untimed = {(gpu, xid): n for gpu, xid, n in image.xids_untimed}
    fold.server = image.server
    fold.max_running = image.max_running
    fold.serving = image.serving
    history = fold.history
    history.scrapes.clear()
    history.scrapes.extend(image.scrapes)
    for delta in image.deltas:
        # The window's running sums are rebuilt from its pairs, as they were made.
        history._push(delta)
    history.trend.clear()
    history.trend.extend(image.trend)
    fold.trend = tuple(history.trend)
    return Aside(
        link=image.link,
        follower=image.follower,
        view=image.view,
        audits=deque(((count, list(entries)) for count, entries in image.audits), maxlen=AUDITS_MAX),
        seq=image.seq,
    )


# ---- when ------------------------------------------------------------------------------------------


@dataclass
class KeyframeClock:
    """When a host's next keyframe is due: a new boot, `every_s` of recording time, or `entries` journal
    entries since the last one (and the fold holds something)."""

    every_s: float = KEYFRAME_EVERY_S
    entries: int = KEYFRAME_ENTRIES
    last_ts: float = -math.inf
    last_boot: int | None = None
    entries_since: int = 0

    def due(self, now: float, fold: HostFold) -> bool:
        boots = fold.state.boots
        boot = boots[-1].index if boots else None
        if boot is not None and boot != self.last_boot:
            return True
        if not (fold.events_total or fold.gpus is not None or fold.server is not None):
            return False
        return now - self.last_ts >= self.every_s or self.entries_since >= self.entries

    def taken(self, now: float, fold: HostFold) -> None:
        boots = fold.state.boots
        self.last_boot = boots[-1].index if boots else None
        self.last_ts = now
        self.entries_since = 0


# ---- the bytes -------------------------------------------------------------------------------------


def encode_image(image: FoldImage) -> tuple[bytes, int]:
    """The keyframe as compressed JSON, and its size before compression."""
    server = _plain("server", (image.server, image.max_running)) if image.server is not None else None
    plain = {
        "v": KEYFRAME_VERSION,
        "host": image.host,
        "state": _jsonable(image.state.model_dump(mode="python")),
        # The events as orjson writes dataclasses (fields left at their defaults are not written; the
        # events' numbers are held to finite ranges by the parser): 30x faster than through their dumps.
        "recent": list(image.recent),
        "events_total": image.events_total,
        "gpus": _dump(image.gpus),
        "xids_seen": [[gpu, xid, list(times)] for gpu, xid, times in image.xids_seen],
        "xids_untimed": [list(item) for item in image.xids_untimed],
        "server": server,
        "serving": _dump(image.serving),
        "scrapes": [_dump(s) for s in image.scrapes],
        "deltas": [_dump(d) for d in image.deltas],
        "trend": [_dump(t) for t in image.trend],
        "link": _dump(image.link),
        "follower": _dump(image.follower),
        "view": _dump(image.view),
        "audits": [[count, [_dump(e) for e in entries]] for count, entries in image.audits],
        "seq": image.seq,
    }
    raw = orjson.dumps(plain)
    return zlib.compress(raw, COMPRESS_LEVEL), len(raw)


def _dump(model: Any) -> Any:
    return _jsonable(model.model_dump(mode="python")) if model is not None else None


def _count(value: object, what: str, top: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise RecordError(f"a keyframe's {what} is not a count")
    return value


def _xid_times(item: object) -> tuple[int, int, tuple[float, ...]]:
    gpu, xid, times = _listed(item, "XID", 3)
    stamps = _listed(times, "XID times", XID_TIMES_MAX)
    if not all(isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t) for t in stamps):
        raise RecordError("a keyframe's XID time is not a number")
    return _count(gpu, "GPU index", GPUS_MAX), _count(xid, "XID", XID_MAX), tuple(float(t) for t in stamps)


def _listed(value: object, what: str, most: int) -> list[Any]:
    if not isinstance(value, list):
        raise RecordError(f"a keyframe's {what} is not a list")
    if len(value) > most:
        raise RecordError(f"a keyframe holds more than {most:,} {what}")
    return value


def decode_image(blob: bytes, *, max_raw: int = KEYFRAME_RAW_MAX) -> FoldImage:
    """A keyframe read back, every part validated; RecordError (one sentence) when it is not one, or when
    it unpacks to more than `max_raw` bytes (unpacked only that far)."""
    inflate = zlib.decompressobj()
    try:
        data = inflate.decompress(blob, max_raw + 1)
    except zlib.error:
        raise RecordError("a keyframe is not compressed as this version writes it") from None
    if len(data) > max_raw or inflate.unconsumed_tail:
        raise RecordError(
            f"a keyframe unpacks to more than {max_raw:,} bytes (this version writes at most half)"
        )
    if not inflate.eof:
        raise RecordError("a keyframe is not compressed as this version writes it (it ends early)")
    try:
        plain = _loads(data)
    except (ValueError, TypeError, RecursionError):
        raise RecordError("a keyframe is not JSON") from None
    if not isinstance(plain, dict) or plain.get("v") != KEYFRAME_VERSION:
        raise RecordError("a keyframe is not one this version reads")
    try:
        return _image(plain)
    except RecordError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise RecordError(f"a keyframe does not read back ({type(exc).__name__})") from None


def _image(plain: dict[str, Any]) -> FoldImage:
    host = plain["host"]
    if not isinstance(host, str) or not 0 < len(host) <= 256:
        raise RecordError("a keyframe names no host")
    state = HostState.model_validate(plain["state"])
    if len(state.boots) > BOOTS_MAX:
        raise RecordError(f"a keyframe holds more than {BOOTS_MAX:,} boots")
    adapter = event_adapter()
    recent = tuple(adapter.validate_python(e) for e in _listed(plain["recent"], "events", EVENTS_MAX))
    events_total = _count(plain["events_total"], "event count", SEQ_MAX)
    if events_total < len(recent):
        raise RecordError("a keyframe counts fewer events than it holds")
    server: ServerSample | None = None
    max_running: float | None = None
    if plain["server"] is not None:
        server, max_running = _typed("server", plain["server"])
    xids_seen = tuple(_xid_times(item) for item in _listed(plain["xids_seen"], "XID keys", XID_KEYS_MAX))
    xids_untimed = tuple(
        (_count(gpu, "GPU index", GPUS_MAX), _count(xid, "XID", XID_MAX), _count(n, "XID count", XID_MAX))
        for gpu, xid, n in (
            _listed(item, "XID", 3) for item in _listed(plain["xids_untimed"], "XID keys", XID_KEYS_MAX)
        )
    )
    scrapes = tuple(Scrape.model_validate(s) for s in _listed(plain["scrapes"], "scrapes", MAX_SCRAPES))
    if any(b.ts <= a.ts for a, b in pairwise(scrapes)):
        raise RecordError("a keyframe's scrapes are not in time order")
    deltas = tuple(PairDelta.model_validate(d) for d in _listed(plain["deltas"], "scrape pairs", MAX_SCRAPES))
    trend = tuple(TrendPoint.model_validate(t) for t in _listed(plain["trend"], "trend points", MAX_SCRAPES))
    audits: list[tuple[int, tuple[AuditEntry, ...]]] = []
    entries = 0
    for item in _listed(plain["audits"], "audit batches", AUDITS_MAX):
        count, batch = _listed(item, "audit batch", 2)
        batch = _listed(batch, "audit entries", AUDIT_ENTRIES_MAX)
        entries += len(batch)
        if entries > AUDIT_ENTRIES_MAX:
            raise RecordError(f"a keyframe holds more than {AUDIT_ENTRIES_MAX:,} audit entries")
        audits.append(
            (_count(count, "audit place", SEQ_MAX), tuple(AuditEntry.model_validate(e) for e in batch))
        )

    def model(cls: Any, value: Any) -> Any:
        return cls.model_validate(value) if value is not None else None

    return FoldImage(
        host=host,
        state=state,
        recent=recent,
        events_total=events_total,
        gpus=model(HostGpuSample, plain["gpus"]),
        xids_seen=xids_seen,
        xids_untimed=xids_untimed,
        server=server,
        max_running=max_running,
        serving=model(ServingFigures, plain["serving"]),
        scrapes=scrapes,
        deltas=deltas,
        trend=trend,
        link=model(ConnectionStatus, plain["link"]),
        follower=FollowerStatus.model_validate(plain["follower"]),
        view=model(PairingView, plain["view"]),
        audits=tuple(audits),
        seq=_count(plain["seq"], "sequence number", SEQ_MAX),
    )
