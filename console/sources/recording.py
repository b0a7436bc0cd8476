"""A recording on disk: one SQLite file per console session, written by a thread, read by a replay.

SQLite in WAL mode (as Dolphie records): a reader opens the file while the console still writes it,
a second `record --out` on the same file appends, and a writer killed outright (SIGKILL, a power cut of
the console's machine aside) leaves every chunk committed before it died readable — WAL with
`synchronous=NORMAL` loses at most the last second. Each chunk is about a second of one session's
inputs (`console.core.recording`: JSON lines, zlib-compressed) with its time range; `marks` hold what
the replay's timeline shows (restart phases, errors) so that a replay knows them before reading the
chunks. The oldest chunks are dropped past the size/age policy (`RetentionPolicy`; the pages are freed
and reused with `auto_vacuum=INCREMENTAL`).

The console's event loop only appends to a deque (`record`, `mark`); the writer thread drains it every
`commit_every_s`, encodes and compresses there, and commits once: nothing of the writing runs on the
loop. zlib from the standard library: zstd would need a dependency this project does not carry.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from console.core.hostfold import HostFold
from console.core.keyframes import (
    KEYFRAME_ENTRIES,
    KEYFRAME_EVERY_S,
    KEYFRAME_RAW_MAX,
    Aside,
    FoldImage,
    KeyframeClock,
    decode_image,
    encode_image,
    image_of,
)
from console.core.recording import (
    CHUNK_RAW_MAX,
    FORMAT,
    VERSION,
    Chunk,
    Mark,
    Record,
    RecordError,
    RetentionPolicy,
    decode,
    encode_chunks,
    sane_ts,
)

LABEL_MAX = 200
"""Characters kept of a mark's label (the timeline shows a line of it)."""

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS chunks (id INTEGER PRIMARY KEY, t0 REAL NOT NULL, t1 REAL NOT NULL, "
    "records INTEGER NOT NULL, raw_bytes INTEGER NOT NULL, blob BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS chunks_t0 ON chunks (t0)",
    "CREATE TABLE IF NOT EXISTS marks (ts REAL NOT NULL, host TEXT NOT NULL, kind TEXT NOT NULL, "
    "label TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS marks_ts ON marks (ts)",
    # Keyframes (issue 33): a host's whole fold at a place of the record stream, after `offset` records of
    # chunk `chunk` (chunk 0: before the first). A table of their own: a version that does not know them
    # reads the file as before (recording format 1 either way).
    "CREATE TABLE IF NOT EXISTS keyframes (id INTEGER PRIMARY KEY, ts REAL NOT NULL, host TEXT NOT NULL, "
    "chunk INTEGER NOT NULL, offset INTEGER NOT NULL, raw_bytes INTEGER NOT NULL, blob BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS keyframes_ts ON keyframes (ts)",
)

KEYFRAME = "keyframe"
"""The writer queue's kind of a keyframe (never a record of a chunk)."""
CONSOLES_MAX = 1_000
"""Console ids kept in a recording's meta (the consoles that recorded into it)."""


@dataclass(frozen=True, slots=True)
class KeyframeRef:
    """Where a keyframe of `host` stands: after `offset` records of chunk `chunk` (0: before the first),
    recorded at `ts`."""

    id: int
    ts: float
    host: str
    chunk: int
    offset: int


class RecordingError(Exception):
    """The recording cannot be written or read; `str()` is one sentence for the operator."""


def _regular_or_absent(path: Path) -> None:
    """Refuse a path that is there and is not a regular file (a device, a FIFO, a directory): SQLite would
    open it, and make its `-journal` and `-wal` beside it (`record --out /dev/full` left /dev/full-journal)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise RecordingError(f"{path} cannot be read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise RecordingError(f"{path} is a directory, not a recording")
    if not stat.S_ISREG(mode):
        raise RecordingError(f"{path} is not a regular file (a device or a pipe), not a recording")


def _connect(path: Path, *, create: bool) -> sqlite3.Connection:
    mode = "rwc" if create else "rw"
    if not create and not os.access(path, os.W_OK):
        mode = "ro"  # someone else's recording: read it (a WAL file left by a dead writer needs -shm)
    uri = f"file:{path.resolve().as_posix()}?mode={mode}"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=10.0)
    conn.execute("PRAGMA busy_timeout = 10000")
    return conn


def _check_meta(conn: sqlite3.Connection, path: Path) -> dict[str, str]:
    """The file's meta table, or RecordingError when it is not a recording this version reads."""
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError:
        raise RecordingError(f"{path} is not a k26-console recording (not an SQLite file)") from None
    if not tables:
        raise RecordingError(f"{path} is an empty SQLite file, not a k26-console recording (yet)")
    if not {"meta", "chunks", "marks"} <= tables:
        raise RecordingError(f"{path} is an SQLite file but not a k26-console recording")
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    if meta.get("format") != FORMAT:
        raise RecordingError(f"{path} is an SQLite file but not a k26-console recording")
    try:
        version = int(meta.get("version", "0"))
    except ValueError:
        version = 0
    if version > VERSION:
        raise RecordingError(
            f"{path} was written by a newer k26-console (recording format {version}; this one reads {VERSION})"
        )
    return meta


class Recorder:
    """Appends a session's inputs to `path` (created, or appended to when it is already a recording)."""

    def __init__(
        self,
        path: Path,
        *,
        hosts: Sequence[str] = (),
        policy: RetentionPolicy | None = None,
        commit_every_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        console: str | None = None,
        keyframe_every_s: float = KEYFRAME_EVERY_S,
        keyframe_entries: int = KEYFRAME_ENTRIES,
    ) -> None:
        """`console`: the id of the console that records (its presence on the hosts is its own, not
        another console's: a replay leaves it out)."""
        self.path = Path(path)
        self.policy = policy or RetentionPolicy()
        self.commit_every_s = commit_every_s
        self.clock = clock
        self.keyframe_every_s = keyframe_every_s
        self.keyframe_entries = keyframe_entries
        self._asides: dict[str, Aside] = {}
        self._folds: dict[str, tuple[HostFold, KeyframeClock]] = {}
        self._records: deque[tuple[float, str, str, Any]] = deque()
        self._marks: deque[tuple[float, str, str, str]] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        """Why the writer stopped (a full disk, a removed file); None while it writes."""
        self.records = 0
        self.chunks = 0
        self.bytes_written = 0
        self.raw_bytes = 0
        self.dropped_chunks = 0
        self.keyframes = 0
        self.keyframes_left_out = 0
        """Keyframes not written: over half of `KEYFRAME_RAW_MAX` (a seek folds from an earlier one)."""
        self._stored = 0
        _regular_or_absent(self.path)
        try:
            self._conn = _connect(self.path, create=True)
            # Someone else's file is refused before anything is written to it (the WAL switch included).
            existing = {
                row[0] for row in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            if existing:
                _check_meta(self._conn, self.path)
            self._conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # only takes effect on a new file
            mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()
            if mode is None or str(mode[0]).lower() != "wal":
                raise RecordingError(f"{self.path} cannot be written in WAL mode (a network file system?)")
            self._conn.execute("PRAGMA synchronous = NORMAL")
            now = self.clock()
            # One transaction: a reader opening the file meanwhile sees all of the schema or none of it.
            with self._conn:
                self._conn.execute("BEGIN IMMEDIATE")
                for statement in _SCHEMA:
                    self._conn.execute(statement)
                meta = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())
                if meta:
                    _check_meta(self._conn, self.path)
                known = json.loads(meta.get("hosts", "[]")) if meta else []
                merged = list(dict.fromkeys([*known, *hosts]))
                consoles = _id_list(meta.get("consoles"))
                if console is not None and console not in consoles:
                    consoles = [*consoles, console][-CONSOLES_MAX:]
                self._conn.executemany(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)",
                    [("format", FORMAT), ("version", str(VERSION)), ("created", repr(now))],
                )
                self._conn.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('hosts', ?)", (json.dumps(merged),)
                )
                self._conn.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('policy', ?)", (self.policy.describe(),)
                )
                self._conn.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('consoles', ?)", (json.dumps(consoles),)
                )
            self._stored = int(
                self._conn.execute(
                    "SELECT (SELECT COALESCE(SUM(length(blob)), 0) FROM chunks) "
                    "+ (SELECT COALESCE(SUM(length(blob)), 0) FROM keyframes)"
                ).fetchone()[0]
            )
        except (sqlite3.DatabaseError, RecordingError, OSError) as exc:
            with contextlib.suppress(sqlite3.Error, AttributeError):
                self._conn.close()
            if isinstance(exc, RecordingError):
                raise
            if isinstance(exc, OSError):
                raise RecordingError(f"{self.path} cannot be written: {exc.strerror or exc}") from None
            raise RecordingError(_sentence(self.path, exc)) from None

    # ---- called on the event loop: queue only ----------------------------------------------------------

    def record(self, host: str, kind: str, payload: Any) -> None:
        now = self.clock()
        aside = self._asides.get(host)
        if aside is None:
            aside = self._asides[host] = Aside()
        followed = self._folds.get(host)
        events_total = 0
        if followed is not None:
            fold, keyframes = followed
            # The fold holds every earlier input of the host now: a keyframe stands before this record.
            if keyframes.due(now, fold):
                self._keyframe(host, now)
            events_total = fold.events_total
            if kind == "journal":
                keyframes.entries_since += len(payload)
        aside.note(kind, payload, events_total)
        self._records.append((now, host, kind, payload))

    def mark(self, host: str, kind: str, label: str) -> None:
        self._marks.append((self.clock(), host, kind, label))

    def follow(self, host: str, fold: HostFold) -> None:
        """Write keyframes of `fold`, the fold `host`'s recorded inputs go into (`RecordSink.follow`)."""
        self._asides.setdefault(host, Aside())
        self._folds[host] = (fold, KeyframeClock(self.keyframe_every_s, self.keyframe_entries))
        now = self.clock()
        if self._folds[host][1].due(now, fold):
            self._keyframe(host, now)

    def _keyframe(self, host: str, now: float) -> None:
        """Queue a keyframe of the host's fold as it stands (its encoding is the writer's); none while the
        parser holds a traceback: it is taken at the next input."""
        fold, keyframes = self._folds[host]
        image = image_of(fold, self._asides[host])
        if image is None:
            return
        keyframes.taken(now, fold)
        self._records.append((now, host, KEYFRAME, image))

    # ---- the writer thread -------------------------------------------------------------------------

    def start(self) -> Recorder:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="k26-recorder", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Write what is queued, fold the WAL into the file and close it (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        else:
            self._write()
        self._folds.clear()
        with contextlib.suppress(sqlite3.Error):
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._conn.close()

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        while not self._stop.wait(self.commit_every_s):
            self._write()
        self._write()

    def _drain(self) -> tuple[list[tuple[float, str, str, Any]], list[tuple[float, str, str, str]]]:
        # deque.popleft is atomic: the loop thread appends while this thread takes.
        records = [self._records.popleft() for _ in range(len(self._records))]
        marks = [self._marks.popleft() for _ in range(len(self._marks))]
        return records, marks

    def _write(self) -> None:
        drained, marks = self._drain()
        if self.error is not None or (not drained and not marks):
            return
        records: list[tuple[float, str, str, Any]] = []
        frames: list[tuple[int, float, str, bytes, int]] = []
        """Keyframes: how many records of this write stand before each, its time, host and bytes."""
        try:
            for item in drained:
                if item[2] != KEYFRAME:
                    records.append(item)
                    continue
                assert isinstance(item[3], FoldImage)
                blob, raw = encode_image(item[3])
                if raw > KEYFRAME_RAW_MAX // 2:
                    self.keyframes_left_out += 1  # a replay reads back no more than KEYFRAME_RAW_MAX
                    continue
                frames.append((len(records), item[0], item[1], blob, raw))
            # Chunks a replay reads back within its bound (a busy second is one chunk, well under it).
            chunks = encode_chunks(records) if records else []
            with self._conn:
                self._conn.execute("BEGIN")
                ids = [
                    int(
                        self._conn.execute(
                            "INSERT INTO chunks (t0, t1, records, raw_bytes, blob) VALUES (?, ?, ?, ?, ?)",
                            (c.t0, c.t1, c.records, c.raw_bytes, c.blob),
                        ).lastrowid
                        or 0
                    )
                    for c in chunks
                ]
                if frames:
                    self._conn.executemany(
                        "INSERT INTO keyframes (ts, host, chunk, offset, raw_bytes, blob) VALUES (?, ?, ?, ?, ?, ?)",
                        [
                            (ts, host, *self._place(before, chunks, ids), raw, blob)
                            for before, ts, host, blob, raw in frames
                        ],
                    )
                if marks:
                    self._conn.executemany(
                        "INSERT INTO marks (ts, host, kind, label) VALUES (?, ?, ?, ?)", marks
                    )
                stored = self._stored
                self._stored += sum(len(c.blob) for c in chunks) + sum(len(f[3]) for f in frames)
                try:
                    self._apply_policy()
                except BaseException:
                    self._stored = stored
                    raise
        except (sqlite3.Error, RecordError, OSError) as exc:
            # The console goes on without recording; its badge says why.
            self.error = _sentence(self.path, exc)
            return
        self.records += len(records)
        self.keyframes += len(frames)
        self.chunks += len(chunks)
        self.bytes_written += sum(len(c.blob) for c in chunks) + sum(len(f[3]) for f in frames)
        self.raw_bytes += sum(c.raw_bytes for c in chunks)

    def _place(self, before: int, chunks: list[Chunk], ids: list[int]) -> tuple[int, int]:
        """The (chunk id, offset) after `before` records of this write's `chunks`."""
        for chunk, chunk_id in zip(chunks, ids, strict=True):
            if before < chunk.records:
                return chunk_id, before
            before -= chunk.records
        if chunks:
            return ids[-1], chunks[-1].records
        row = self._conn.execute("SELECT id, records FROM chunks ORDER BY id DESC LIMIT 1").fetchone()
        return (int(row[0]), int(row[1])) if row is not None else (0, 0)

    def _drop_keyframes_before(self, chunk_id: int | None) -> None:
        """Keyframes that stand in chunks no longer kept (all of them when none is kept)."""
        where, args = ("chunk < ?", (chunk_id,)) if chunk_id is not None else ("1", ())
        freed = self._conn.execute(
            f"SELECT COALESCE(SUM(length(blob)), 0) FROM keyframes WHERE {where}", args
        ).fetchone()
        self._conn.execute(f"DELETE FROM keyframes WHERE {where}", args)
        self._stored -= int(freed[0])

    def _apply_policy(self) -> None:
        """Drop the oldest chunks (and their marks) past the size or age bound, inside the commit."""
        policy, conn = self.policy, self._conn
        dropped = 0
        if policy.max_age_s is not None:
            cutoff = self.clock() - policy.max_age_s
            # By t0 first, on its index: `t1 < ?` alone read the whole table at every commit (a day of a
            # quiet host, 86,400 chunks: the writer's commit grew with the file, to tens of ms).
            old = "FROM chunks WHERE t0 < ? AND t1 < ?"
            freed = conn.execute(
                f"SELECT COALESCE(SUM(length(blob)), 0), COUNT(*) {old}", (cutoff, cutoff)
            ).fetchone()
            if freed[1]:
                conn.execute(f"DELETE {old}", (cutoff, cutoff))
                self._stored -= int(freed[0])
                dropped += int(freed[1])
                self._drop_keyframes_before(conn.execute("SELECT MIN(id) FROM chunks").fetchone()[0])
        if policy.max_bytes is not None:
            while self._stored > policy.max_bytes:
                row = conn.execute("SELECT id, length(blob) FROM chunks ORDER BY id LIMIT 1").fetchone()
                if row is None:
                    self._drop_keyframes_before(None)
                    break
                conn.execute("DELETE FROM chunks WHERE id = ?", (row[0],))
                self._stored -= int(row[1])
                dropped += 1
                # Keyframes in the chunk just dropped, and the one before the first chunk.
                self._drop_keyframes_before(int(row[0]) + 1)
        if dropped:
            first = conn.execute("SELECT MIN(t0) FROM chunks").fetchone()[0]
            if first is not None:
                conn.execute("DELETE FROM marks WHERE ts < ?", (first,))
            self.dropped_chunks += dropped
            conn.execute("PRAGMA incremental_vacuum")


def _id_list(text: str | None) -> list[str]:
    """A meta list of console ids, what of it is one (a hand-edited file may hold anything)."""
    try:
        value = json.loads(text) if text else []
    except ValueError:
        return []
    if not isinstance(value, list):
        return []
    return [v for v in value[-CONSOLES_MAX:] if isinstance(v, str) and 0 < len(v) <= 64]


def _sentence(path: Path, exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return f"{path} cannot be written: {exc.strerror or exc}"
    text = str(exc).rstrip(".") or type(exc).__name__
    if isinstance(exc, sqlite3.DatabaseError) and "not a database" in text:
        return f"{path} is not a k26-console recording (not an SQLite file)"
    return f"{path}: {text}"


class RecordingReader:
    """A recording opened for reading (also while a console still writes it: `refresh()` sees the
    chunks committed since)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise RecordingError(f"{self.path} does not exist")
        _regular_or_absent(self.path)
        try:
            self._conn = _connect(self.path, create=False)
            self.meta = _check_meta(self._conn, self.path)
        except sqlite3.DatabaseError as exc:
            raise RecordingError(_sentence(self.path, exc)) from None
        except OSError as exc:
            raise RecordingError(f"{self.path} cannot be read: {exc.strerror or exc}") from None
        try:
            hosts = json.loads(self.meta.get("hosts", "[]"))
        except ValueError:
            hosts = []
        self.hosts: list[str] = [str(h) for h in hosts] if isinstance(hosts, list) else []
        self.consoles: frozenset[str] = frozenset(_id_list(self.meta.get("consoles")))
        """The consoles that recorded into the file: their own presence is no other console's."""
        self.chunks: list[tuple[int, float, float]] = []
        self.marks: list[Mark] = []
        self.keyframes: list[KeyframeRef] = []
        self.left_out = (0, 0)
        """Chunks and marks of the file left out for their times (see `refresh`)."""
        self.refresh()

    def refresh(self) -> None:
        """Read the chunk index and the marks again (a recording still being written grows).

        A chunk or a mark whose time is no moment a clock shows (`sane_ts`: 1e20, 1e300, inf, NaN, a
        chunk ending before it begins) is left out, and a `gap` mark at the recording's start says how
        many in one sentence."""
        try:
            chunks: list[tuple[int, float, float]] = []
            bad_chunks = 0
            for i, t0, t1 in self._conn.execute("SELECT id, t0, t1 FROM chunks ORDER BY id"):
                start, end = sane_ts(t0), sane_ts(t1)
                if isinstance(i, int) and start is not None and end is not None and start <= end:
                    chunks.append((i, start, end))
                else:
                    bad_chunks += 1
            marks: list[Mark] = []
            bad_marks = 0
            for ts, host, kind, label in self._conn.execute(
                "SELECT ts, host, kind, label FROM marks ORDER BY ts, rowid"
            ):
                when = sane_ts(ts)
                if when is None:
                    bad_marks += 1
                    continue
                marks.append(Mark(when, str(host)[:LABEL_MAX], str(kind)[:LABEL_MAX], str(label)[:LABEL_MAX]))
            keyframes = self._keyframe_index()
        except (sqlite3.DatabaseError, ValueError, TypeError) as exc:
            raise RecordingError(_sentence(self.path, exc)) from None
        self.chunks = chunks
        self.keyframes = keyframes
        self.left_out = (bad_chunks, bad_marks)
        if bad_chunks or bad_marks:
            at = chunks[0][1] if chunks else (marks[0].ts if marks else 0.0)
            marks.insert(
                0,
                Mark(
                    at,
                    "",
                    "gap",
                    f"{bad_chunks} chunk(s) and {bad_marks} mark(s) with times no clock shows left out",
                ),
            )
        self.marks = marks

    def _keyframe_index(self) -> list[KeyframeRef]:
        """The keyframes a replay may start from; none in a file written before them. One whose place or
        time is not one (a hand-made row) is left out: a seek then folds from an earlier place."""
        try:
            rows = self._conn.execute(
                "SELECT id, ts, host, chunk, offset FROM keyframes ORDER BY id"
            ).fetchall()
        except sqlite3.OperationalError:
            return []  # no such table: recorded before keyframes
        out: list[KeyframeRef] = []
        for i, ts, host, chunk, offset in rows:
            when = sane_ts(ts)
            if (
                when is not None
                and isinstance(i, int)
                and isinstance(host, str)
                and 0 < len(host) <= LABEL_MAX
                and isinstance(chunk, int)
                and isinstance(offset, int)
                and chunk >= 0
                and 0 <= offset <= CHUNK_RAW_MAX
            ):
                out.append(KeyframeRef(i, when, host, chunk, offset))
        return out

    def keyframe(self, keyframe_id: int) -> FoldImage:
        """A keyframe read back and validated; RecordingError (one sentence) when it cannot be."""
        row = self._conn.execute(
            "SELECT length(blob), CASE WHEN length(blob) <= ? THEN blob END FROM keyframes WHERE id = ?",
            (KEYFRAME_RAW_MAX, keyframe_id),
        ).fetchone()
        if row is None:
            raise RecordingError(f"{self.path}: keyframe {keyframe_id} is gone (dropped by the size bound)")
        if row[1] is None:
            raise RecordingError(f"{self.path}: keyframe {keyframe_id} is larger than this version writes")
        try:
            return decode_image(bytes(row[1]))
        except RecordError as exc:
            raise RecordingError(f"{self.path}: keyframe {keyframe_id} cannot be read: {exc}") from None

    @property
    def start(self) -> float:
        return self.chunks[0][1] if self.chunks else 0.0

    @property
    def end(self) -> float:
        return max((t1 for _, _, t1 in self.chunks), default=0.0)

    @property
    def stored_bytes(self) -> int:
        row = self._conn.execute("SELECT COALESCE(SUM(length(blob)), 0) FROM chunks").fetchone()
        return int(row[0])

    def chunk(self, chunk_id: int) -> list[Record]:
        row = self._conn.execute(
            "SELECT length(blob), CASE WHEN length(blob) <= ? THEN blob END FROM chunks WHERE id = ?",
            (CHUNK_RAW_MAX, chunk_id),
        ).fetchone()
        if row is None:
            return []  # dropped by the policy since the index was read
        if row[1] is None:
            # Compressed, it would be no smaller than it may unpack to: not read into memory at all.
            raise RecordingError(
                f"{self.path}: chunk {chunk_id} cannot be read: it holds {int(row[0]):,} bytes, more than "
                f"this version writes"
            )
        try:
            return decode(bytes(row[1]))
        except RecordError as exc:
            raise RecordingError(f"{self.path}: chunk {chunk_id} cannot be read: {exc}") from None

    def records(self, after_id: int = 0) -> Iterator[tuple[int, Record]]:
        """Every record of the chunks after `after_id`, oldest first, with its chunk's id."""
        for chunk_id, _, _ in list(self.chunks):
            if chunk_id <= after_id:
                continue
            for record in self.chunk(chunk_id):
                yield chunk_id, record

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()

    def __enter__(self) -> RecordingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
