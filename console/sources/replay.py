"""A recording played back: its recorded inputs folded through the same `HostFold` as a live session.

`Replay` moves a cursor through the recording's records in time order. Each host's inputs go into its
own `HostFold` (journal entries into the parser and the state, GPU samples, server readings), exactly as
`HostSession` folds them live, so `snapshot(host)` is what the live session published at that moment,
up to the publishing tick. The pairing views and audit entries are handed to the caller (`on_record`),
which gives them to the console's own controllers as live.

Seeking forward folds the records in between; seeking back restarts from the nearest checkpoint (a copy
of every host's fold, taken each `checkpoint_every_s` of recording time as the cursor passes), so a
replay reads the file once and then seeks back and forth at the cost of at most one interval
(`CHECKPOINT_S`).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from console.core.audit import AuditEntry
from console.core.hostfold import HostFold
from console.core.pairing import PairingView
from console.core.recording import Mark, Record
from console.core.snapshot import ConnectionStatus, FollowerStatus, HostSnapshot
from console.sources.recording import RecordingError, RecordingReader

CHECKPOINT_S = 15.0
"""Recording time between two checkpoints of the fold: a seek back costs at most this much input (at
2,000 journal lines/s about a second of CPU, docs/performance.md)."""

AUDIT_KEPT = 500
"""Audit entries kept per host for the feed after a seek (the live feed holds 5,000 lines in all)."""


@dataclass
class HostReplay:
    """One host's fold and what the live session and controller held beside it."""

    fold: HostFold
    link: ConnectionStatus | None = None
    follower: FollowerStatus = field(default_factory=FollowerStatus)
    view: PairingView | None = None
    audits: deque[tuple[int, list[AuditEntry]]] = field(default_factory=lambda: deque(maxlen=AUDIT_KEPT))
    """Audit entries with the number of journal events the host had produced when they arrived: where
    they go in the feed."""
    seq: int = 0

    def copy(self) -> HostReplay:
        return HostReplay(
            fold=self.fold.checkpoint(),
            link=self.link,
            follower=self.follower,
            view=self.view,
            audits=deque(self.audits, maxlen=AUDIT_KEPT),
            seq=self.seq,
        )

    def apply(self, record: Record) -> None:
        kind, payload = record.kind, record.payload
        if kind == "journal":
            self.fold.journal(payload)
            cursor = next(
                (e.get("__CURSOR") for e in reversed(payload) if isinstance(e, dict)), self.follower.cursor
            )
            self.follower = self.follower.model_copy(
                update={"cursor": cursor, "entries": self.follower.entries + len(payload)}
            )
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
            self.audits.append((self.fold.events_total, list(payload)))
        self.seq += 1


@dataclass
class _Checkpoint:
    ts: float
    chunk: int
    """Index into the chunk list of the chunk the cursor is in."""
    offset: int
    """Records of that chunk already applied."""
    hosts: dict[str, HostReplay]


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
        self._checkpoints: list[_Checkpoint] = []
        self._reset()
        self._checkpoints.append(self._checkpoint())

    # ---- where the cursor is ---------------------------------------------------------------------------

    @property
    def start(self) -> float:
        return self.reader.start

    @property
    def end(self) -> float:
        return self.reader.end

    @property
    def marks(self) -> list[Mark]:
        return self.reader.marks

    def _reset(self) -> None:
        self.hosts: dict[str, HostReplay] = {
            name: HostReplay(HostFold(name, keep_events=self.keep_events)) for name in self.host_names
        }
        self.position = self.start
        """The recording's time the cursor stands at: every record up to it has been applied."""
        self._chunk = 0
        self._offset = 0
        self._records: list[Record] | None = None

    def _checkpoint(self) -> _Checkpoint:
        return _Checkpoint(
            self.position, self._chunk, self._offset, {n: h.copy() for n, h in self.hosts.items()}
        )

    def _restore(self, cp: _Checkpoint) -> None:
        self.hosts = {n: h.copy() for n, h in cp.hosts.items()}
        self.position = cp.ts
        self._chunk, self._offset = cp.chunk, cp.offset
        self._records = None

    def _host(self, name: str) -> HostReplay:
        host = self.hosts.get(name)
        if host is None:  # a host that joined the recording after its meta was read
            host = self.hosts[name] = HostReplay(HostFold(name, keep_events=self.keep_events))
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
        self._offset += 1
        self._host(record.host).apply(record)
        self.position = max(self.position, record.ts)
        if on_record is not None:
            on_record(record)
        if self.position - self._checkpoints[-1].ts >= self.checkpoint_every_s:
            self._checkpoints.append(self._checkpoint())
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
        """Stand at `ts` (clamped to the recording): from the nearest checkpoint before it."""
        ts = min(max(ts, self.start), self.end)
        stamps = [cp.ts for cp in self._checkpoints]
        cp = self._checkpoints[max(0, bisect.bisect_right(stamps, ts) - 1)]
        # Back: from the checkpoint before `ts`. Forward: from the cursor, or from a checkpoint past it.
        if ts < self.position or cp.ts > self.position:
            self._restore(cp)
        self.play_to(ts)

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
