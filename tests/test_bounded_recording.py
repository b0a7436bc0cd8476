"""Issue 30 item 8: a recording from anywhere is read back bounded.

Before: a 1.6 MB zlib bomb took `replay` to 3.2 GB; a year-10000 journal entry, a chunk with t0=1e20, a
mark at 1e300 or inf crashed it; `record --out /dev/full` left /dev/full-journal (0666) behind.

Each recording here is written by the console's own `Recorder` with real corpus lines, then made hostile
with sqlite3 as a hand-edited file would be.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import stat
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest

from console.core.recording import CHUNK_RAW_MAX, RecordError, clock_text, decode, encode_chunks
from console.sources.recording import Recorder, RecordingError, RecordingReader
from console.sources.replay import Replay
from tests.support.cli import CLI, REPO, one_sentence, operator_env, run_main
from tests.support.measured import run_measured
from tests.test_recording_format import CASE, journal_entries

T0 = 1_780_000_000.0


def _recording(path: Path, *, entries: list[dict[str, str]] | None = None) -> Path:
    lines = CASE.read_text(encoding="utf-8").removesuffix("\n").split("\n")
    t = [T0]
    with Recorder(path, hosts=["h"], clock=lambda: t[0]) as rec:
        rec.record("h", "journal", entries if entries is not None else journal_entries(len(lines)))
        t[0] += 60
        rec.record("h", "flush", None)
    return path


def bomb(raw_bytes: int) -> bytes:
    """One journal record whose MESSAGE is `raw_bytes` of "x": a valid chunk, a thousandth its size.

    Made in well under a second whatever its size: after a full flush deflate starts afresh, so a MiB of
    "x" compresses to the same bytes each time; they are repeated, and the stream's checksum (adler32,
    its last four bytes) is made for the whole of what it unpacks to."""
    head = json.dumps([T0 + 1, "h", "journal", [{"__CURSOR": "c", "MESSAGE": ""}]]).encode()
    cut = head.index(b'"MESSAGE": ""') + len(b'"MESSAGE": "')
    block = b"x" * (1 << 20)
    blocks = raw_bytes >> 20
    c = zlib.compressobj(9)
    start = c.compress(head[:cut]) + c.flush(zlib.Z_FULL_FLUSH)
    again = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    end = c.compress(head[cut:]) + c.flush()
    check = zlib.adler32(head[:cut])
    for _ in range(blocks):
        check = zlib.adler32(block, check)
    check = zlib.adler32(head[cut:], check)
    return start + again * blocks + end[:-4] + check.to_bytes(4, "big")


def _add_chunk(path: Path, blob: bytes, t0: float, t1: float) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO chunks (t0, t1, records, raw_bytes, blob) VALUES (?, ?, 1, 0, ?)", (t0, t1, blob)
        )


def test_a_zlib_bomb_is_refused_unpacking_no_more_than_the_bound() -> None:
    blob = bomb(4 * CHUNK_RAW_MAX)  # ~130 KB that unpacks to 128 MiB of valid records
    assert len(blob) < 200_000
    tracemalloc.start()
    try:
        with pytest.raises(RecordError) as caught:
            decode(blob)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(caught.value) == (
        f"a chunk unpacks to more than {CHUNK_RAW_MAX:,} bytes (this version writes at most half)"
    )
    # zlib grows its output by doubling: the bound and as much again, at most
    assert peak < 3 * CHUNK_RAW_MAX, f"{peak:,} bytes held"


def test_the_writer_keeps_its_chunks_under_the_bound() -> None:
    records = [(T0 + n, "h", "journal", journal_entries(2000, start=n * 2000)) for n in range(8)]
    chunks = encode_chunks(records, max_raw=1 << 20)
    assert len(chunks) > 1 and all(c.raw_bytes <= 1 << 20 for c in chunks)
    assert sum(c.records for c in chunks) == 8 and chunks[0].t0 == T0 and chunks[-1].t1 == T0 + 7
    back = [r for c in chunks for r in decode(c.blob)]
    assert [r.payload for r in back] == [p for _, _, _, p in records]


def test_replay_passes_a_bomb_chunk_with_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _recording(tmp_path / "b.k26rec")
    _add_chunk(path, bomb(3 * CHUNK_RAW_MAX), T0 + 1, T0 + 1)
    code, out, err = run_main(["replay", str(path), "--at", "end", "--json"], capsys)
    assert code == 2 and out == ""
    assert "cannot be read: a chunk unpacks to more than 33,554,432 bytes" in one_sentence(err)
    with RecordingReader(path) as reader:
        replay = Replay(reader)
        with pytest.raises(RecordingError):
            replay.seek(reader.end)
        replay.seek(reader.end)  # said once, then passed: the rest of the recording plays
        assert replay.snapshot("h").events_total > 0


@pytest.mark.parametrize(
    "hostile",
    [
        "chunk t0=1e20",
        "chunk t1=inf",
        "mark ts=1e300",
        "mark ts=inf",
        "mark ts=-inf",
        "record ts=1e20",
        "journal year 10000",
    ],
)
async def test_a_time_no_clock_shows_is_left_out_and_replay_plays(tmp_path: Path, hostile: str) -> None:
    from console.tui.replay import ReplayApp

    entries = journal_entries(30)
    if hostile == "journal year 10000":
        entries[5]["__REALTIME_TIMESTAMP"] = "253402300800000000"
    path = _recording(tmp_path / "t.k26rec", entries=entries)
    good = encode_chunks([(T0 + 2, "h", "journal", journal_entries(3, start=100))])[0].blob
    with sqlite3.connect(path) as conn:
        if hostile.startswith("chunk"):
            t0, t1 = (1e20, 1e20) if "t0" in hostile else (T0 + 2, math.inf)
            conn.execute(
                "INSERT INTO chunks (t0, t1, records, raw_bytes, blob) VALUES (?, ?, 1, 0, ?)", (t0, t1, good)
            )
        elif hostile.startswith("mark"):
            ts = float(hostile.split("=")[1])
            conn.execute(
                "INSERT INTO marks (ts, host, kind, label) VALUES (?, 'h', 'error', 'boot 0 x: y')", (ts,)
            )
        elif hostile.startswith("record"):
            raw = json.dumps([1e20, "h", "journal", journal_entries(2, start=200)]).encode()
            conn.execute(
                "INSERT INTO chunks (t0, t1, records, raw_bytes, blob) VALUES (?, ?, 1, 0, ?)",
                (T0 + 3, T0 + 3, zlib.compress(raw)),
            )
    with RecordingReader(path) as reader:
        assert math.isfinite(reader.start) and math.isfinite(reader.end) and reader.end - reader.start <= 120
        assert all(math.isfinite(m.ts) for m in reader.marks)
        if hostile.startswith(("chunk", "mark")):
            assert (
                reader.marks[0].kind == "gap"
                and "with times no clock shows left out" in reader.marks[0].label
            )
        app = ReplayApp(Replay(reader), path, at=reader.end)
        async with app.run_test(size=(160, 48)) as pilot:
            deadline = time.monotonic() + 30
            while app.dashboards["h"].snap is None or app.dashboards["h"].snap.events_total == 0:
                assert time.monotonic() < deadline, "the dashboard was not drawn"
                await pilot.pause(0.05)
            await pilot.press("space")
            while not (app.playing or app.problem):  # it plays on past the hostile times
                assert time.monotonic() < deadline, "space did not start the play"
                await pilot.pause(0.05)
            await pilot.press("q")
    res = run_measured(
        [*CLI, "replay", str(path), "--at", "end", "--json"], env=operator_env(tmp_path), cwd=REPO
    )
    assert res.returncode in (0, 1) and json.loads(res.stdout)["host"] == "h", res.stderr
    assert clock_text(1e20) == clock_text(math.inf) == clock_text(math.nan) == "--:--:--"


@pytest.mark.skipif(os.getuid() != 0, reason="making a device node needs root")
def test_record_refuses_a_device_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    full = tmp_path / "full"
    os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))  # /dev/full's own numbers, in the test's dir
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[hosts.gpu1]\nssh = "127.0.0.1"\nport = 9\n')
    res = run_measured(
        [*CLI, "record", "gpu1", "--hosts", str(hosts), "--out", str(full)],
        env=operator_env(tmp_path),
        cwd=REPO,
        timeout=60,
    )
    assert res.returncode == 2
    assert (
        one_sentence(res.stderr)
        == f"k26-console: {full} is not a regular file (a device or a pipe), not a recording."
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "hosts.toml"]
    with pytest.raises(RecordingError, match="is not a regular file"):
        RecordingReader(full)


@pytest.mark.serial
def test_replay_of_the_issues_bomb_returns_in_time_in_bounded_memory(tmp_path: Path) -> None:
    """The issue's figure: a 1.6 MB bomb (1.6 GB unpacked) in a recording of real lines."""
    path = _recording(tmp_path / "bomb.k26rec")
    blob = bomb(1600 << 20)
    assert 1_000_000 < len(blob) < 2_500_000
    _add_chunk(path, blob, T0 + 1, T0 + 1)
    res = run_measured(
        [*CLI, "replay", str(path), "--at", "end", "--json"], env=operator_env(tmp_path), cwd=REPO
    )
    assert res.returncode == 2 and "unpacks to more than" in one_sentence(res.stderr)
    assert res.seconds < 10 and res.peak_rss < 300 << 20, (res.seconds, res.peak_rss)
    print(f"\nreplay of a {len(blob):,}-byte bomb: {res.seconds:.2f} s, {res.peak_rss >> 20} MiB")


async def test_stepping_onto_a_bomb_chunk_says_so_and_the_console_lives(tmp_path: Path) -> None:
    """`.` (one record forward) onto a chunk that cannot be read: one sentence on the replay's bar, as
    play and seek say it, and the console goes on (it crashed with the chunk's RecordingError)."""
    from console.tui.replay import ReplayApp

    path = _recording(tmp_path / "step.k26rec")
    _add_chunk(path, bomb(3 * CHUNK_RAW_MAX), T0 + 30, T0 + 30)
    with RecordingReader(path) as reader:
        app = ReplayApp(Replay(reader), path)
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            for _ in range(4):
                await pilot.press(".")
                await pilot.pause()
                if app.problem:
                    break
            assert app.problem is not None and "unpacks to more than" in app.problem
            await pilot.press(".")  # said once: the records after it step on
            await pilot.pause()
            assert app.is_running
