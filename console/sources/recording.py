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
from pathlib import Path
from typing import Any

from console.core.recording import (
    FORMAT,
    VERSION,
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
)


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
    ) -> None:
        self.path = Path(path)
        self.policy = policy or RetentionPolicy()
        self.commit_every_s = commit_every_s
        self.clock = clock
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
            self._stored = int(
                self._conn.execute("SELECT COALESCE(SUM(length(blob)), 0) FROM chunks").fetchone()[0]
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
        self._records.append((self.clock(), host, kind, payload))

    def mark(self, host: str, kind: str, label: str) -> None:
        self._marks.append((self.clock(), host, kind, label))

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
        records, marks = self._drain()
        if self.error is not None or (not records and not marks):
            return
        try:
            # Chunks a replay reads back within its bound (a busy second is one chunk, well under it).
            chunks = encode_chunks(records) if records else []
            with self._conn:
                self._conn.execute("BEGIN")
                self._conn.executemany(
                    "INSERT INTO chunks (t0, t1, records, raw_bytes, blob) VALUES (?, ?, ?, ?, ?)",
                    [(c.t0, c.t1, c.records, c.raw_bytes, c.blob) for c in chunks],
                )
                if marks:
                    self._conn.executemany(
                        "INSERT INTO marks (ts, host, kind, label) VALUES (?, ?, ?, ?)", marks
                    )
                stored = self._stored
                self._stored += sum(len(c.blob) for c in chunks)
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
        self.chunks += len(chunks)
        self.bytes_written += sum(len(c.blob) for c in chunks)
        self.raw_bytes += sum(c.raw_bytes for c in chunks)

    def _apply_policy(self) -> None:
        """Drop the oldest chunks (and their marks) past the size or age bound, inside the commit."""
        policy, conn = self.policy, self._conn
        dropped = 0
        if policy.max_age_s is not None:
            cutoff = self.clock() - policy.max_age_s
            freed = conn.execute(
                "SELECT COALESCE(SUM(length(blob)), 0), COUNT(*) FROM chunks WHERE t1 < ?", (cutoff,)
            ).fetchone()
            if freed[1]:
                conn.execute("DELETE FROM chunks WHERE t1 < ?", (cutoff,))
                self._stored -= int(freed[0])
                dropped += int(freed[1])
        if policy.max_bytes is not None:
            while self._stored > policy.max_bytes:
                row = conn.execute("SELECT id, length(blob) FROM chunks ORDER BY id LIMIT 1").fetchone()
                if row is None:
                    break
                conn.execute("DELETE FROM chunks WHERE id = ?", (row[0],))
                self._stored -= int(row[1])
                dropped += 1
        if dropped:
            first = conn.execute("SELECT MIN(t0) FROM chunks").fetchone()[0]
            if first is not None:
                conn.execute("DELETE FROM marks WHERE ts < ?", (first,))
            self.dropped_chunks += dropped
            conn.execute("PRAGMA incremental_vacuum")


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
        self.chunks: list[tuple[int, float, float]] = []
        self.marks: list[Mark] = []
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
        except (sqlite3.DatabaseError, ValueError, TypeError) as exc:
            raise RecordingError(_sentence(self.path, exc)) from None
        self.chunks = chunks
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
        row = self._conn.execute("SELECT blob FROM chunks WHERE id = ?", (chunk_id,)).fetchone()
        if row is None:
            return []  # dropped by the policy since the index was read
        try:
            return decode(bytes(row[0]))
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
