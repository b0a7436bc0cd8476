"""A recording played back: its recorded inputs folded through the same `HostFold` as a live session.

`Replay` moves a cursor through the recording's records in time order. Each host's inputs go into its
own `HostFold` (journal entries into the parser and the state, GPU samples, server readings), exactly as
`HostSession` folds them live, so `snapshot(host)` is what the live session published at that moment,
up to the publishing tick. The pairing views and audit entries are handed to the caller (`on_record`),
which gives them to the console's own controllers as live.

A seek stands at its target from the nearest place before it of three: the cursor (a seek forward), a
checkpoint (a copy of every host's fold, taken each `checkpoint_every_s` of recording time as the cursor
passes), or the recording's keyframes (`console.core.keyframes`: each host's whole fold, written by the
recorder at each boot and every minute or 20,000 journal entries), and folds the records in between. So a
first seek to the end of a day costs what the last keyframe's interval costs, not the day; a file
recorded before keyframes is folded from its first record, as it always was.

The replay's `start` is the recording's first state (`console.core.recording.Opening`): a session that
starts with its recording reads the host's journal backlog in its first moments, and the phases that
backlog replays (a boot that was ready long before) are history, not marks of the recording.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from console.core.hostfold import HostFold
from console.core.keyframes import Aside, FoldImage, restore
from console.core.pairing import PairingView
from console.core.recording import OPENING_S, Mark, Opening, Record, opening_of, others_only
from console.core.snapshot import HostSnapshot
from console.sources.recording import KeyframeRef, RecordingError, RecordingReader

CHECKPOINT_S = 10.0
"""Recording time between two checkpoints of the fold: a seek back to a place the cursor has passed
costs at most this much input (at 2,000 journal lines/s well under a second of CPU, docs/performance.md)."""

AUDIT_KEPT = 500
"""Audit entries kept per host for the feed after a seek (the live feed holds 5,000 lines in all)."""

Place = tuple[int, int]
"""Where the cursor stands: (index into the chunk list, records of that chunk applied)."""


@dataclass(kw_only=True)
class HostReplay(Aside):
    """One host's fold and what the live session and controller held beside it (`Aside`)."""

    fold: HostFold

    def copy(self) -> HostReplay:
        return HostReplay(fold=self.fold.checkpoint(), **vars(super().copy()))

    def apply(self, record: Record) -> None:
        kind, payload = record.kind, record.payload
        if kind == "journal":
            self.fold.journal(payload)
        elif kind == "flush":
            self.fold.flush()
        elif kind == "seed":
            # A recording begun mid-session starts from what the session had made, unless this replay
            # already folded journal input of its own (a second recording appended to the file).
            if self.fold.events_total == 0:
                self.fold.seed(*payload)
        elif kind == "gpu":
            self.fold.gpu(payload)
        elif kind == "server":
            sample, max_running = payload
            self.fold.server_reading(sample, max_running)
        self.note(kind, payload, self.fold.events_total)


@dataclass
class _Checkpoint:
    ts: float
    chunk: int
    """Index into the chunk list of the chunk the cursor is in."""
    offset: int
    """Records of that chunk already applied."""
    hosts: dict[str, HostReplay]


@dataclass
class _Plan:
    """Where a seek starts from keyframes: the earliest keyframe's place; each host's keyframe (a host with
    none before the target starts there with nothing)."""

    place: Place
    ts: float
    frames: dict[str, tuple[Place, KeyframeRef]] = field(default_factory=dict)


class Replay:
    def __init__(
        self,
        reader: RecordingReader,
        *,
        keep_events: int = 2000,
        checkpoint_every_s: float = CHECKPOINT_S,
    ) -> None:
        self.reader = reader
        self.keep_events = keep_events
        self.checkpoint_every_s = checkpoint_every_s
        self.host_names: list[str] = list(reader.hosts)
        self.keyframes_read = 0
        self.folded = 0
        """Records applied since the replay opened (what its seeks have cost, in input)."""
        self.keyframes_refused: set[int] = set()
        """Keyframes that did not read back: passed over (a seek folds from an earlier place)."""
        self.opening = self._read_opening()
        self._marks_of: list[Mark] | None = None
        self._marks: list[Mark] = []
        self._checkpoints: list[_Checkpoint] = []
        self._pending: dict[str, tuple[Place, HostReplay]] = {}
        self._reset()
        self._checkpoints.append(self._checkpoint())
        self._last_checkpoint = self.position

    # ---- where the cursor is ---------------------------------------------------------------------------

    @property
    def start(self) -> float:
        """The recording's first state (`Opening.first_state`), within the chunks kept."""
        return min(max(self.opening.first_state, self.reader.start), self.end)

    @property
    def end(self) -> float:
        return self.reader.end

    @property
    def marks(self) -> list[Mark]:
        """The file's marks, less those its hosts' backlogs made (`Opening.history_until`)."""
        raw = self.reader.marks
        if raw is not self._marks_of:
            self._marks_of = raw
            self._marks = [m for m in raw if not self.opening.is_history(m)]
        return self._marks

    def _read_opening(self) -> Opening:
        reader = self.reader

        def records() -> Iterator[Record]:
            for chunk_id, t0, _ in list(reader.chunks):
                if t0 > reader.start + OPENING_S:
                    return
                try:
                    yield from reader.chunk(chunk_id)
                except RecordingError:
                    return  # said when the cursor reaches it

        return opening_of(records(), reader.start, self.host_names)

    def _new_host(self, name: str) -> HostReplay:
        return HostReplay(fold=HostFold(name, keep_events=self.keep_events))

    def _reset(self) -> None:
        self.hosts: dict[str, HostReplay] = {name: self._new_host(name) for name in self.host_names}
        self.position = self.reader.start
        """The recording's time the cursor stands at: every record up to it has been applied."""
        self._chunk = 0
        self._offset = 0
        self._records: list[Record] | None = None
        self._pending.clear()

    def _checkpoint(self) -> _Checkpoint:
        return _Checkpoint(
            self.position, self._chunk, self._offset, {n: h.copy() for n, h in self.hosts.items()}
        )

    def _restore(self, cp: _Checkpoint) -> None:
        self.hosts = {n: h.copy() for n, h in cp.hosts.items()}
        self.position = cp.ts
        self._chunk, self._offset = cp.chunk, cp.offset
        self._records = None
        self._pending.clear()
        self._last_checkpoint = cp.ts

    def _host(self, name: str) -> HostReplay:
        host = self.hosts.get(name)
        if host is None:  # a host that joined the recording after its meta was read
            host = self.hosts[name] = self._new_host(name)
            self.host_names.append(name)
        return host

    # ---- moving ----------------------------------------------------------------------------------------

    def _peek(self) -> Record | None:
        chunks = self.reader.chunks
        while self._chunk < len(chunks):
            if self._records is None:
                try:
                    self._records = self.reader.chunk(chunks[self._chunk][0])
                except RecordingError:
                    # Said once (the caller shows the sentence), then passed: the next call reads on.
                    self._chunk += 1
                    self._offset = 0
                    raise
            if self._offset < len(self._records):
                return self._records[self._offset]
            self._chunk += 1
            self._offset = 0
            self._records = None
        return None

    def refresh(self) -> bool:
        """Read the recording's index again (a console may still be writing it); True when it grew.
        Chunks the size/age bound dropped meanwhile shift the cursor's and the checkpoints' places."""
        before = [c[0] for c in self.reader.chunks]
        self.reader.refresh()
        ids = {c[0] for c in self.reader.chunks}
        dropped = sum(1 for i in before if i not in ids)
        if dropped:
            self._chunk = max(0, self._chunk - dropped)
            if self._chunk == 0:
                self._offset, self._records = 0, None
            for cp in self._checkpoints:
                cp.chunk = max(0, cp.chunk - dropped)
            self._pending = {
                h: ((max(0, place[0] - dropped), place[1]), host)
                for h, (place, host) in self._pending.items()
            }
        return len(self.reader.chunks) > len(before) - dropped

    def next_ts(self) -> float | None:
        """When the next record arrived (None at the end)."""
        record = self._peek()
        return record.ts if record is not None else None

    def step(self, on_record: Callable[[Record], None] | None = None) -> Record | None:
        """Apply the next record; None at the end."""
        record = self._peek()
        if record is None:
            return None
        if self._pending:
            self._install_reached()
        self._offset += 1
        self.position = max(self.position, record.ts)
        if record.host in self._pending:
            return record  # before this host's keyframe: the keyframe holds it already
        if record.kind == "view" and self.reader.consoles and isinstance(record.payload, PairingView):
            # The console that recorded is this screen's own: no other console on the host.
            record = dataclasses.replace(record, payload=others_only(record.payload, self.reader.consoles))
        self._host(record.host).apply(record)
        self.folded += 1
        if on_record is not None:
            on_record(record)
        if not self._pending and self.position - self._last_checkpoint >= self.checkpoint_every_s:
            cp = self._checkpoint()
            bisect.insort(self._checkpoints, cp, key=lambda c: c.ts)
            self._last_checkpoint = cp.ts
        return record

    def play_to(
        self, ts: float, on_record: Callable[[Record], None] | None = None, *, limit: int | None = None
    ) -> int:
        """Apply every record up to `ts` (at most `limit`); how many were applied. The position moves to
        `ts` when they all were."""
        done = 0
        while limit is None or done < limit:
            nxt = self.next_ts()
            if nxt is None or nxt > ts:
                self.position = max(self.position, min(ts, self.end))
                return done
            self.step(on_record)
            done += 1
        return done

    def seek(self, ts: float) -> None:
        """Stand at `ts` (clamped to the recording): from the nearest place before it, the cursor's, a
        checkpoint's or the keyframes'."""
        ts = min(max(ts, self.start), self.end)
        stamps = [cp.ts for cp in self._checkpoints]
        cp = self._checkpoints[max(0, bisect.bisect_right(stamps, ts) - 1)]
        here: Place = (self._chunk, self._offset)
        # Forward from the cursor, or from a checkpoint past it; back, from the checkpoint before `ts`.
        start, use_cursor = (cp.chunk, cp.offset), False
        if ts >= self.position and here >= start:
            start, use_cursor = here, True
        while True:
            plan = self._plan(ts)
            if plan is None or plan.place <= start:
                break
            if self._start_from(plan):
                self.play_to(ts)
                self._finish_seek()
                return
        if not use_cursor:
            self._restore(cp)
        self.play_to(ts)
        self._finish_seek()

    # ---- keyframes -------------------------------------------------------------------------------------

    @staticmethod
    def _place_of(ref: KeyframeRef, ids: list[int]) -> Place | None:
        """Where in the chunk list (`ids`, ascending) a keyframe stands; None when its chunk is not (or no
        longer) there."""
        if not ids:
            return None
        if ref.chunk == 0:
            return (0, 0) if ids[0] == 1 else None  # before the first chunk of a file never trimmed
        i = bisect.bisect_left(ids, ref.chunk)
        return (i, ref.offset) if i < len(ids) and ids[i] == ref.chunk else None

    def _plan(self, ts: float) -> _Plan | None:
        """The keyframes a seek to `ts` starts from: each host's newest one at or before it."""
        frames: dict[str, tuple[Place, KeyframeRef]] = {}
        ids = [c[0] for c in self.reader.chunks]
        for ref in self.reader.keyframes:
            if ref.ts > ts or ref.id in self.keyframes_refused:
                continue
            place = self._place_of(ref, ids)
            known = frames.get(ref.host)
            if place is not None and (known is None or place >= known[0]):
                frames[ref.host] = (place, ref)
        if not frames:
            return None
        first = min(frames.values(), key=lambda f: f[0])
        return _Plan(place=first[0], ts=first[1].ts, frames=frames)

    def _start_from(self, plan: _Plan) -> bool:
        """Every host as its keyframe has it (the hosts whose keyframe stands later wait for it:
        `_pending`); False when one did not read back (it is passed over from then on)."""
        made: dict[str, tuple[Place, HostReplay]] = {}
        for host, (place, ref) in plan.frames.items():
            try:
                image = self.reader.keyframe(ref.id)
                if image.host != host:
                    raise RecordingError(f"keyframe {ref.id} is of {image.host!r}, not of {host!r}")
            except RecordingError:
                self.keyframes_refused.add(ref.id)
                return False
            self.keyframes_read += 1
            made[host] = (place, self._from_image(image))
        self._reset()
        self._chunk, self._offset = plan.place
        self.position = plan.ts
        for host, (place, replay) in made.items():
            if host not in self.hosts:
                self.host_names.append(host)
            if place <= plan.place:
                self.hosts[host] = replay
            else:
                self._pending[host] = (place, replay)
        self._last_checkpoint = -math.inf  # one as soon as every host has its keyframe
        return True

    def _from_image(self, image: FoldImage) -> HostReplay:
        fold = HostFold(image.host, keep_events=self.keep_events)
        aside = restore(image, fold)
        replay = HostReplay(fold=fold, **vars(aside))
        if replay.view is not None and self.reader.consoles:
            replay.view = others_only(replay.view, self.reader.consoles)
        replay.audits = deque(replay.audits, maxlen=AUDIT_KEPT)
        return replay

    def _install_reached(self) -> None:
        """The hosts whose keyframe the cursor has reached take it."""
        here: Place = (self._chunk, self._offset)
        for host, (place, replay) in list(self._pending.items()):
            if place <= here:
                self.hosts[host] = replay
                del self._pending[host]

    def _finish_seek(self) -> None:
        if self._pending and self._peek() is None:
            # Keyframes after the last record (the recording ends on them).
            for host, (_, replay) in self._pending.items():
                self.hosts[host] = replay
            self._pending.clear()
        if not self._pending and self._last_checkpoint == -math.inf:
            cp = self._checkpoint()
            bisect.insort(self._checkpoints, cp, key=lambda c: c.ts)
            self._last_checkpoint = cp.ts

    # ---- what the console shows ------------------------------------------------------------------------

    def snapshot(self, host: str) -> HostSnapshot:
        h = self._host(host)
        return h.fold.snapshot(seq=h.seq, ts=self.position, connection=h.link, follower=h.follower)

    def next_mark(self, after: float, kinds: frozenset[str] = frozenset({"phase", "error"})) -> Mark | None:
        return next((m for m in self.marks if m.ts > after + 1e-6 and m.kind in kinds), None)

    def previous_mark(
        self, before: float, kinds: frozenset[str] = frozenset({"phase", "error"})
    ) -> Mark | None:
        return next((m for m in reversed(self.marks) if m.ts < before - 1e-6 and m.kind in kinds), None)

    def mark_named(self, text: str, after: float | None = None) -> Mark | None:
        """The first mark (after `after`) whose label ends with or contains `text` (`ready`, `boot 2
        ready`)."""
        for mark in self.marks:
            if (after is None or mark.ts > after) and (mark.label.endswith(text) or text in mark.label):
                return mark
        return None
