"""The recording's file (issue 17): records round-trip, a second writer appends, a reader sees what a
writer still open has committed, the size and age bounds drop the oldest chunks, and a file that is not
a recording (text, someone else's SQLite, a damaged chunk) is refused in one sentence with exit 2."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import string
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from console.core.gpus import HostGpuSample
from console.core.metrics import SglangMetrics, parse_prometheus
from console.core.pairing import PairingView
from console.core.recording import (
    Mark,
    RetentionPolicy,
    decode,
    encode,
    marks_between,
    parse_at,
    restart_marks,
)
from console.core.snapshot import FollowerStatus, FollowState, HealthState, ServerSample
from console.core.state import HostState
from console.sources.recording import Recorder, RecordingError, RecordingReader
from console.sources.replay import Replay
from console.sources.session_options import SessionOptions
from tests.conftest import CORPUS
from tests.support.cli import one_sentence, run_main, wait_until

CASE = CORPUS / "public" / "case-31.log"


def journal_entries(n: int, start: int = 0) -> list[dict[str, str]]:
    """`journalctl -o json` entries whose messages are real SGLang lines of the corpus."""
    lines = CASE.read_text(encoding="utf-8").removesuffix("\n").split("\n")
    return [
        {
            "__CURSOR": f"s=1;i={i:x}",
            "__REALTIME_TIMESTAMP": str(1_780_000_000_000_000 + i),
            "_PID": "4100",
            "_SYSTEMD_UNIT": "sglang.service",
            "SYSLOG_IDENTIFIER": "python3",
            "MESSAGE": lines[i % len(lines)],
        }
        for i in range(start, start + n)
    ]


def test_every_kind_round_trips_through_a_chunk() -> None:
    metrics = (
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{model_name="m"} 3\n'
        "# TYPE sglang:time_to_first_token_seconds histogram\n"
        'sglang:time_to_first_token_seconds_bucket{le="0.5",model_name="m"} 2\n'
        'sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 3\n'
        'sglang:time_to_first_token_seconds_sum{model_name="m"} 2.5\n'
        'sglang:time_to_first_token_seconds_count{model_name="m"} 3\n'
    )
    scrape = parse_prometheus(metrics)
    # The +Inf bucket: JSON has no number for it (pydantic's JSON mode writes null, which does not read back).
    sample = ServerSample(
        health=HealthState.OK,
        status_code=200,
        ts=5.0,
        scrape=scrape,
        metrics=SglangMetrics.from_metrics(scrape),
    )
    assert sample.metrics is not None and sample.metrics.time_to_first_token is not None
    records = [
        (1.0, "h", "journal", journal_entries(3)),
        (1.5, "h", "flush", None),
        (2.0, "h", "gpu", HostGpuSample(state="no_gpus")),
        (3.0, "h", "server", (sample, 48.0)),
        (4.0, "h", "follower", FollowerStatus(state=FollowState.FOLLOWING, cursor="c", entries=3)),
        (5.0, "h", "view", PairingView(host="h", now=datetime(2026, 5, 30, tzinfo=UTC))),
    ]
    blob, raw = encode(records)
    assert len(blob) < raw
    back = decode(blob)
    assert [(r.ts, r.host, r.kind) for r in back] == [(t, h, k) for t, h, k, _ in records]
    assert back[0].payload == records[0][3]
    server, limit = back[3].payload
    assert limit == 48.0 and server.scrape == sample.scrape and server.health is HealthState.OK
    assert server.metrics == sample.metrics
    assert back[4].payload.cursor == "c"


def test_a_second_writer_appends_and_both_hosts_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "s.k26rec"
    with Recorder(path, hosts=["a"], commit_every_s=0.05) as rec:
        rec.record("a", "journal", journal_entries(10))
    with Recorder(path, hosts=["b"], commit_every_s=0.05) as rec:
        rec.record("b", "journal", journal_entries(5, start=10))
    with RecordingReader(path) as reader:
        assert reader.hosts == ["a", "b"]
        records = [r for _, r in reader.records()]
    assert [(r.host, len(r.payload)) for r in records] == [("a", 10), ("b", 5)]
    # closed cleanly: the WAL is folded into the file
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0


def test_a_reader_sees_what_an_open_writer_has_committed(tmp_path: Path) -> None:
    path = tmp_path / "live.k26rec"
    rec = Recorder(path, hosts=["h"], commit_every_s=0.05).start()
    try:
        rec.record("h", "journal", journal_entries(100))
        reader = RecordingReader(path)
        assert wait_until(lambda: (reader.refresh(), reader.chunks)[1], 10), "no first chunk"
        rec.record("h", "journal", journal_entries(100, start=100))
        assert wait_until(lambda: (reader.refresh(), len(reader.chunks) >= 2)[1], 10), "no second chunk"
        replay = Replay(reader)
        replay.seek(replay.end)
        assert replay.hosts["h"].follower.entries == 200
        assert replay.snapshot("h").events_total > 0
        # A replay at the end of a file still being written follows it.
        assert not replay.refresh()
        rec.record("h", "journal", journal_entries(50, start=200))
        assert wait_until(replay.refresh, 10), "the replay never saw the third chunk"
        replay.play_to(replay.end)
        assert replay.hosts["h"].follower.entries == 250
        assert replay.hosts["h"].follower.cursor == f"s=1;i={249:x}"
        reader.close()
    finally:
        rec.close()


def _noise(n: int) -> list[dict[str, str]]:
    rng = random.Random(n)
    return [
        {"__CURSOR": str(i), "MESSAGE": "".join(rng.choices(string.ascii_letters, k=400))} for i in range(n)
    ]


def test_the_size_bound_drops_the_oldest_chunks(tmp_path: Path) -> None:
    path = tmp_path / "bounded.k26rec"
    bound = 200_000
    rec = Recorder(path, hosts=["h"], policy=RetentionPolicy(max_bytes=bound, max_age_s=None))
    for _ in range(20):  # ~30 kB of incompressible text per chunk
        rec.record("h", "journal", _noise(100))
        rec._write()
    rec.close()
    with RecordingReader(path) as reader:
        assert reader.stored_bytes <= bound
        ids = [c[0] for c in reader.chunks]
        assert ids[0] > 1 and ids[-1] == 20  # the oldest went, the newest stayed
    assert rec.dropped_chunks == 20 - len(ids)
    assert path.stat().st_size < 3 * bound  # freed pages are given back, the file does not grow


def test_the_age_bound_drops_chunks_older_than_it(tmp_path: Path) -> None:
    now = [1_000_000.0]
    path = tmp_path / "aged.k26rec"
    rec = Recorder(
        path, hosts=["h"], policy=RetentionPolicy(max_bytes=None, max_age_s=3600), clock=lambda: now[0]
    )
    rec.record("h", "journal", journal_entries(5))
    rec._write()
    now[0] += 1800
    rec.record("h", "journal", journal_entries(5, start=5))
    rec._write()
    now[0] += 2000  # the first chunk is now 3,800 s old, the second 2,000 s
    rec.record("h", "journal", journal_entries(5, start=10))
    rec._write()
    rec.close()
    with RecordingReader(path) as reader:
        assert [round(t0 - 1_000_000.0) for _, t0, _ in reader.chunks] == [1800, 3800]


def test_marks_name_the_phases_and_the_errors() -> None:
    from console.core.parser import JournalParser

    events = JournalParser().feed_many(CASE.read_text(encoding="utf-8").removesuffix("\n").split("\n"))
    after = HostState().apply_all(events)
    marks = marks_between(HostState(), after)
    assert ("phase", f"boot 0 {after.boots[0].phase}") in marks


def test_times_are_read_as_the_operator_writes_them() -> None:
    start, end = 1_780_000_000.0, 1_780_003_600.0  # 2026-05-28 20:26:40 UTC, an hour
    assert parse_at("90s", start, end) == start + 90
    assert parse_at("+5m", start, end) == start + 300
    assert parse_at("-30s", start, end) == end - 30
    assert parse_at("end", start, end) == end
    assert parse_at("20:30:00", start, end) == start + 200
    assert parse_at("2026-05-28T21:00:00", start, end) == start + 2000
    assert parse_at("2h", start, end) == end  # clamped
    with pytest.raises(ValueError, match="is not a moment"):
        parse_at("yesterday", start, end)


@pytest.mark.parametrize("kind", ["text", "foreign-sqlite", "damaged-chunk", "missing", "empty-recording"])
def test_what_is_not_a_recording_is_refused_in_one_sentence(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "x.k26rec"
    expected = {
        "text": "is not a k26-console recording (not an SQLite file)",
        "foreign-sqlite": "is an SQLite file but not a k26-console recording",
        "damaged-chunk": "chunk 1 cannot be read",
        "missing": "does not exist",
        "empty-recording": "holds no recorded input yet",
    }[kind]
    if kind == "text":
        path.write_text("journalctl -o json lines, not a recording\n" * 100)
    elif kind == "foreign-sqlite":
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE notes (t TEXT)")
        conn.commit()
        conn.close()
    elif kind == "damaged-chunk":
        with Recorder(path, hosts=["h"]) as rec:
            rec.record("h", "journal", journal_entries(10))
        conn = sqlite3.connect(path)
        conn.execute("UPDATE chunks SET blob = ? WHERE id = 1", (os.urandom(300),))
        conn.commit()
        conn.close()
    elif kind == "empty-recording":
        Recorder(path, hosts=["h"]).close()
    code, out, err = run_main(["replay", str(path), "--json"], capsys)
    assert code == 2 and out == ""
    line = one_sentence(err)
    assert expected in line, err
    if kind in ("text", "foreign-sqlite"):
        with pytest.raises(RecordingError, match="not a k26-console recording"):
            Recorder(path)
        assert path.read_bytes()[:16] != b"" and (kind != "text" or path.read_text().startswith("journalctl"))


def test_replay_json_prints_the_snapshot_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.k26rec"
    t = [1_780_000_000.0]
    with Recorder(path, hosts=["h"], clock=lambda: t[0]) as rec:
        lines = CASE.read_text(encoding="utf-8").removesuffix("\n").split("\n")
        rec.record("h", "journal", journal_entries(len(lines)))
        t[0] += 60
        rec.record("h", "flush", None)
    code, out, err = run_main(["replay", str(path), "--at", "end", "--json"], capsys)
    report = json.loads(out)
    assert code in (0, 1), err
    assert report["host"] == "h" and report["taken_at"] == t[0]
    assert report["boot"]["index"] == 0 and report["pool"]["pool_tokens"] is not None


async def test_a_recording_started_mid_session_replays_what_the_session_had_read(tmp_path: Path) -> None:
    """The W key starts a recording long after the boot: the replay still knows the boot and its pool."""
    from console.sources.hosts import HostConfig
    from console.sources.session import HostSession
    from console.tui.view import display_boot

    session = HostSession(
        HostConfig(name="h", ssh="127.0.0.1"),
        SessionOptions(follow_journal=False, sample_gpus=False, poll_server=False),
    )
    lines = CASE.read_text(encoding="utf-8").removesuffix("\n").split("\n")
    session.fold.journal(journal_entries(len(lines)))
    live = display_boot(session.fold.state)
    assert live is not None and live.pool.tokens is not None
    path = tmp_path / "late.k26rec"
    with Recorder(path, hosts=["h"]) as rec:
        session.start_recording(rec)
        session.recorder = None
    with RecordingReader(path) as reader:
        replay = Replay(reader)
        replay.seek(replay.end)
        snap = replay.snapshot("h")
    boot = display_boot(snap.state)
    assert boot is not None and boot.pool.tokens == live.pool.tokens and boot.phase == live.phase
    assert snap.events_total == session.fold.events_total and snap.recent == tuple(session.fold.recent)
    await session.close()


def test_a_replay_following_a_bounded_file_keeps_its_place_when_the_head_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "follow.k26rec"
    rec = Recorder(path, hosts=["h"], policy=RetentionPolicy(max_bytes=150_000, max_age_s=None))
    for i in range(4):
        rec.record("h", "journal", [{**e, "__CURSOR": f"c{i}-{j}"} for j, e in enumerate(_noise(100))])
        rec._write()
    reader = RecordingReader(path)
    replay = Replay(reader)
    replay.seek(replay.end)
    seen = replay.hosts["h"].follower.entries
    for i in range(4, 8):
        rec.record("h", "journal", [{**e, "__CURSOR": f"c{i}-{j}"} for j, e in enumerate(_noise(100))])
        rec._write()
    assert rec.dropped_chunks >= 2  # the head went, and with it chunks the replay had read
    assert replay.refresh()
    replay.play_to(replay.end)
    host = replay.hosts["h"]
    assert host.follower.entries == seen + 400 and host.follower.cursor == "c7-99"
    reader.close()
    rec.close()


def test_a_checkpoint_of_the_fold_is_independent_of_it() -> None:
    from console.core.hostfold import HostFold

    metrics = 'sglang:num_running_reqs{model_name="m"} 3\n'
    fold = HostFold("h")
    lines = CASE.read_text(encoding="utf-8").removesuffix("\n").split("\n")
    fold.journal(journal_entries(len(lines) // 2))
    for i in range(5):
        scrape = parse_prometheus(metrics)
        fold.server_reading(ServerSample(health=HealthState.OK, ts=float(i), scrape=scrape), None)
    copy = fold.checkpoint()
    before = (fold.state, tuple(fold.recent), fold.events_total, len(fold.history.scrapes), fold.serving)
    copy.journal(journal_entries(len(lines) - len(lines) // 2, start=len(lines) // 2))
    copy.flush()
    copy.server_reading(ServerSample(health=HealthState.OK, ts=9.0, scrape=parse_prometheus(metrics)), 8.0)
    assert (
        fold.state,
        tuple(fold.recent),
        fold.events_total,
        len(fold.history.scrapes),
        fold.serving,
    ) == before
    assert copy.events_total > fold.events_total and len(copy.history.scrapes) == 6
    # and the copy goes on exactly as the original would have
    fold.journal(journal_entries(len(lines) - len(lines) // 2, start=len(lines) // 2))
    fold.flush()
    fold.server_reading(ServerSample(health=HealthState.OK, ts=9.0, scrape=parse_prometheus(metrics)), 8.0)
    assert fold.state == copy.state and fold.serving == copy.serving


@pytest.mark.parametrize("command", [["demo"], ["open", "gpu-a"]])
def test_record_on_the_console_refuses_a_file_that_is_not_a_recording(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    foreign = tmp_path / "notes.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE notes (t TEXT)")
    conn.commit()
    conn.close()
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[hosts.gpu-a]\nssh = "127.0.0.1"\n')
    extra = ["--hosts", str(hosts)] if command[0] == "open" else []
    before = foreign.read_bytes()
    code, _out, err = run_main([*command, *extra, "--record", str(foreign)], capsys)
    assert code == 2 and "is an SQLite file but not a k26-console recording" in one_sentence(err)
    assert foreign.read_bytes() == before  # not even switched to WAL
    conn = sqlite3.connect(foreign)
    assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["notes"]  # untouched
    conn.close()


def test_a_replay_evaluates_the_alert_rules_but_never_rings_nor_runs_the_hook(tmp_path: Path) -> None:
    from console.sources.alerts import default_alert_config
    from console.tui.replay import ReplayApp

    path = tmp_path / "a.k26rec"
    with Recorder(path, hosts=["h"]) as rec:
        rec.record("h", "journal", journal_entries(10))
    config = default_alert_config().model_copy(update={"command": ("sh", "-c", "touch paged"), "bell": True})
    with RecordingReader(path) as reader:
        app = ReplayApp(Replay(reader), path, alerts=config)
        assert app.alerts is not None and app.alerts.rules == config.rules
        assert app.alerts.command is None and not app.alerts.bell
        assert app.alert_router is not None and app.alert_router.hook is None


async def test_a_replay_of_several_hosts_shows_each_on_its_own_dashboard(tmp_path: Path) -> None:
    from console.tui.replay import ReplayApp
    from console.tui.view import display_boot

    path = tmp_path / "two.k26rec"
    lines = CASE.read_text(encoding="utf-8").removesuffix("\n").split("\n")
    with Recorder(path, hosts=["a", "b"]) as rec:
        rec.record("a", "journal", journal_entries(len(lines)))
        rec.record("b", "journal", journal_entries(len(lines) // 2))
    with RecordingReader(path) as reader:
        app = ReplayApp(Replay(reader), path, at=reader.end)
        async with app.run_test(size=(160, 48)) as pilot:
            deadline = time.monotonic() + 30
            while any(d.snap is None or d.snap.events_total == 0 for d in app.dashboards.values()):
                assert time.monotonic() < deadline, "the dashboards were not drawn"
                await pilot.pause(0.05)
            a, b = (app.dashboards[h].snap for h in ("a", "b"))
            assert a is not None and b is not None
            assert a.events_total > b.events_total > 0
            assert display_boot(a.state) is not None


def test_a_restart_is_marked_where_its_boot_begins_whatever_phase_was_seen_first() -> None:
    """A batch of journal lines read at once can take a new boot straight to "loading": its first mark is
    still the restart (a loaded CI run drew no ▲ when only "starting" counted). The recording's first
    boot is a restart only when it began in the recording."""

    def marks(*labels: str) -> list[Mark]:
        return [Mark(float(n), "twin", "phase", label) for n, label in enumerate(labels)]

    seen = marks("boot 0 pool", "boot 0 ready", "boot 0 stopped", "boot 1 loading", "boot 1 ready")
    assert restart_marks(seen) == {3}
    assert restart_marks(marks("boot 0 starting", "boot 0 ready", "boot 1 starting")) == {0, 2}
    with_error = [*seen[:3], Mark(2.5, "twin", "error", "boot 0 oom: CUDA out of memory"), *seen[3:]]
    assert restart_marks(with_error) == {4}
