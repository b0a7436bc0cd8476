"""Keyframes in recordings (issue 33 item 1): the recorder writes each host's whole fold now and then, a
seek starts from the nearest one and shows exactly what folding the recording from its first record
shows, at most one keyframe interval of input is folded whatever the recording's length, a recording
written before keyframes replays as it always did, and a keyframe from a hostile file is read bounded
and passed over when it does not read back.

The recordings are made as a session makes them: each input recorded, then folded into the `HostFold`
the recorder follows, its marks from the fold. Their journal lines are the corpus's (a startup to ready,
serving traffic, a startup that dies in a traceback); the GPU samples and server readings are the twin's,
from tests/data/recordings.
"""

from __future__ import annotations

import shutil
import sqlite3
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from console.core.hostfold import HostFold
from console.core.keyframes import EVENTS_MAX, KEYFRAME_RAW_MAX, decode_image
from console.core.metrics import SglangMetrics, parse_prometheus
from console.core.pairing import PairingView
from console.core.recording import KINDS, RecordError, RetentionPolicy, decode, marks_between
from console.core.snapshot import ServerSample
from console.sources.recording import Recorder, RecordingReader
from console.sources.replay import Replay
from tests.conftest import CORPUS

DATA = Path(__file__).parent / "data" / "recordings" / "twin-restart-v1.k26rec"
HOST = "gpu-a"
T0 = 1_780_000_000.0
PUBLIC = CORPUS / "public"


def _lines(case: str) -> list[str]:
    return (PUBLIC / case).read_text(encoding="utf-8").removesuffix("\n").split("\n")


STARTUP = _lines("case-31.log")  # server_args to "fired up", Qwen3-0.6B
TRAFFIC = [line for line in _lines("case-15.log") if "Decode batch" in line]
CRASH = _lines("case-07.log")  # pools, graphs, then a traceback the file cuts off


def _twin_inputs() -> tuple[Any, ServerSample]:
    """A GPU sample and a server reading of the twin, as recorded."""
    with RecordingReader(DATA) as reader:
        records = [r for _, r in reader.records()]
    gpu = next(r.payload for r in records if r.kind == "gpu")
    server = next(r.payload[0] for r in records if r.kind == "server")
    return gpu, server


def _metrics(n: int) -> str:
    """A scrape whose counters and latency histogram grow with `n` (the serving window has figures)."""
    out = ["# TYPE sglang:num_running_reqs gauge", f'sglang:num_running_reqs{{model_name="m"}} {n % 7}']
    out += [
        "# TYPE sglang:generation_tokens_total counter",
        f'sglang:generation_tokens_total{{model_name="m"}} {n * 311}',
    ]
    out.append("# TYPE sglang:time_to_first_token_seconds histogram")
    for i, le in enumerate(("0.1", "0.5", "1.0", "+Inf")):
        out.append(f'sglang:time_to_first_token_seconds_bucket{{le="{le}",model_name="m"}} {n * (i + 1)}')
    out += [
        f'sglang:time_to_first_token_seconds_sum{{model_name="m"}} {n * 0.75}',
        f'sglang:time_to_first_token_seconds_count{{model_name="m"}} {n * 4}',
    ]
    return "\n".join(out) + "\n"


class Session:
    """What `HostSession` does with a recorder: each input recorded, then folded; marks from the fold."""

    def __init__(self, path: Path, **recorder: Any) -> None:
        self.t = T0
        self.rec = Recorder(path, hosts=[HOST], policy=None, clock=lambda: self.t, **recorder)
        self.fold = HostFold(HOST)
        self.rec.follow(HOST, self.fold)
        self.gpu_sample, self.server_sample = _twin_inputs()
        self.cursor = 0
        self.scrapes = 0
        self.held = (0.0, 0.0)
        """When the parser held a traceback (from the record that opened it to the flush)."""

    def journal(self, lines: list[str], *, pid: int, invocation: str) -> None:
        entries = []
        for line in lines:
            self.cursor += 1
            entries.append(
                {
                    "__CURSOR": f"s=1;i={self.cursor:x}",
                    "__REALTIME_TIMESTAMP": str(int(self.t * 1e6) + self.cursor),
                    "_PID": str(pid),
                    "_SYSTEMD_UNIT": "sglang.service",
                    "_SYSTEMD_INVOCATION_ID": invocation,
                    "SYSLOG_IDENTIFIER": "python3",
                    "MESSAGE": line,
                }
            )
        before = self.fold.state
        self.rec.record(HOST, "journal", entries)
        self.fold.journal(entries)
        for kind, label in marks_between(before, self.fold.state):
            self.rec.mark(HOST, kind, label)

    def flush(self) -> None:
        self.rec.record(HOST, "flush", None)
        self.fold.flush()

    def gpu(self) -> None:
        sample = self.gpu_sample.model_copy(update={"ts": self.t})
        self.rec.record(HOST, "gpu", sample)
        self.fold.gpu(sample)

    def server(self) -> None:
        self.scrapes += 1
        scrape = parse_prometheus(_metrics(self.scrapes))
        reading = self.server_sample.model_copy(
            update={"ts": self.t, "scrape": scrape, "metrics": SglangMetrics.from_metrics(scrape)}
        )
        self.rec.record(HOST, "server", (reading, 64.0))
        self.fold.server_reading(reading, 64.0)

    def other(self, kind: str, payload: Any) -> None:
        self.rec.record(HOST, kind, payload)

    def second(self, lines: list[str], *, pid: int, invocation: str) -> None:
        """A second of input: the lines in two batches, a GPU sample, every other second a reading."""
        half = len(lines) // 2
        self.journal(lines[:half], pid=pid, invocation=invocation)
        self.t += 0.4
        self.journal(lines[half:], pid=pid, invocation=invocation)
        self.t += 0.3
        self.gpu()
        if int(self.t - T0) % 2 == 0:
            self.server()
        self.t += 0.3
        self.rec._write()  # the writer thread's commit, once a second


def _view(console_ids: list[str], ts: float) -> PairingView:
    from datetime import UTC, datetime

    presence = [
        {
            "user": "op",
            "jump_host": "jump",
            "pid": 100 + n,
            "console_id": cid,
            "since": datetime.fromtimestamp(T0, UTC),
            "heartbeat": datetime.fromtimestamp(ts, UTC),
            "interval_s": 5.0,
            "looking_at": "dashboard",
        }
        for n, cid in enumerate(console_ids)
    ]
    return PairingView.model_validate(
        {"host": HOST, "now": datetime.fromtimestamp(ts, UTC), "presence": presence}
    )


def record_three_boots(path: Path, *, seconds: int = 12, **recorder: Any) -> Session:
    """Boot 0 comes up and serves; boot 1 dies in a traceback held across batches; boot 2 comes up and
    serves. A pairing view and audit entries on the way."""
    from console.core.audit import AuditEntry

    s = Session(path, **recorder)
    s.other("view", _view(["aaaa"], s.t))
    s.second(STARTUP, pid=4100, invocation="inv0")
    for _ in range(seconds):
        s.second(TRAFFIC * 8, pid=4100, invocation="inv0")
    audit = AuditEntry.model_validate(
        {
            "ts": "2026-05-28T20:30:00+00:00",
            "host": HOST,
            "user": "op",
            "action": "restart",
            "outcome": "started",
        }
    )
    s.other("audit", [audit])
    s.second(CRASH[:19], pid=5200, invocation="inv1")  # boot 1: pools, graphs, "Exception in ..."
    s.journal(CRASH[19:20], pid=5200, invocation="inv1")  # the traceback's head: the parser holds it
    opened = s.t
    s.t += 0.2
    s.journal(CRASH[20:], pid=5200, invocation="inv1")
    s.t += 5  # a keyframe is due (every 4 s), and waits
    s.flush()  # the journal went quiet: the traceback is let go
    s.held = (opened, s.t)
    s.t += 0.1
    s.second(STARTUP, pid=6300, invocation="inv2")
    s.other("view", _view(["aaaa", "bbbb"], s.t))
    for _ in range(seconds):
        s.second(TRAFFIC * 8, pid=6300, invocation="inv2")
    s.rec.close()
    assert len(s.fold.state.boots) == 3, [b.phase for b in s.fold.state.boots]
    return s


def strip_keyframes(path: Path, to: Path) -> Path:
    """The same recording as written before keyframes."""
    shutil.copy(path, to)
    conn = sqlite3.connect(to)
    conn.execute("DROP TABLE keyframes")
    conn.commit()
    conn.close()
    return to


def seen(replay: Replay) -> dict[str, Any]:
    """Everything a replay shows of the host at its position."""
    snap = replay.snapshot(HOST)
    host = replay.hosts[HOST]
    return {
        "ts": snap.ts,
        "state": snap.state,
        "recent": snap.recent,
        "events_total": snap.events_total,
        "gpus": snap.gpus,
        "server": snap.server,
        "serving": snap.serving,
        "trend": snap.serving_trend,
        "follower": snap.follower,
        "link": snap.connection,
        "view": host.view,
        "audits": list(host.audits),
        "seq": host.seq,
        "xids": (host.fold.xids.seen, host.fold.xids.untimed),
    }


@pytest.fixture(scope="module")
def three_boots(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Session]:
    tmp = tmp_path_factory.mktemp("keyframes")
    path = tmp / "three.k26rec"
    session = record_three_boots(path, keyframe_entries=400, keyframe_every_s=4.0)
    return path, strip_keyframes(path, tmp / "three-v1.k26rec"), session


def test_a_seek_from_a_keyframe_shows_what_folding_from_the_start_shows(
    three_boots: tuple[Path, Path, Session],
) -> None:
    path, old, session = three_boots
    with RecordingReader(path) as reader, RecordingReader(old) as old_reader:
        assert len(reader.keyframes) >= 8 and not old_reader.keyframes
        replay, baseline = Replay(reader), Replay(old_reader)
        assert replay.start == baseline.start and replay.end == baseline.end
        span = replay.end - replay.start
        # Targets everywhere: on keyframes, between them, in the held traceback, at the end.
        targets = [replay.start + span * k / 23 for k in range(24)] + [kf.ts for kf in reader.keyframes]
        for target in targets:
            fresh = Replay(reader)
            fresh.seek(target)
            expected = Replay(old_reader)
            expected.seek(target)
            assert seen(fresh) == seen(expected), target - replay.start
        # One replay sought back and forth agrees too (checkpoints, the cursor and keyframes mixed).
        for target in (
            replay.end,
            replay.start + span / 2,
            replay.start + span / 3,
            replay.end - 1,
            replay.start,
        ):
            replay.seek(target)
            baseline.seek(target)
            assert seen(replay) == seen(baseline)
        assert replay.keyframes_read >= 1 and not replay.keyframes_refused
    # The end is what the live fold holds.
    with RecordingReader(path) as reader:
        replay = Replay(reader)
        replay.seek(replay.end)
        assert replay.snapshot(HOST).state == session.fold.state
        assert replay.snapshot(HOST).recent == tuple(session.fold.recent)


def _steady(path: Path, seconds: int) -> int:
    """A host serving steadily for `seconds`; the records written."""
    s = Session(path, keyframe_entries=400, keyframe_every_s=60.0)
    s.second(STARTUP, pid=4100, invocation="inv0")
    for _ in range(seconds):
        s.second(TRAFFIC * 8, pid=4100, invocation="inv0")
    s.rec.close()
    return s.rec.records


def test_a_seek_folds_at_most_one_keyframe_interval_whatever_the_length(tmp_path: Path) -> None:
    folded: dict[int, int] = {}
    for seconds in (10, 60):
        path = tmp_path / f"steady-{seconds}.k26rec"
        total = _steady(path, seconds)
        with RecordingReader(path) as reader:
            replay = Replay(reader)
            replay.seek(replay.end)
            folded[seconds] = replay.folded
            assert replay.keyframes_read == 1
        # The control: the same file without keyframes folds every record.
        with RecordingReader(strip_keyframes(path, tmp_path / f"old-{seconds}.k26rec")) as reader:
            replay = Replay(reader)
            replay.seek(replay.end)
            assert replay.folded == total
    # 400 entries a keyframe, 32 lines a batch, two batches and two other inputs a second: 14 records.
    assert all(n <= 16 for n in folded.values()), folded


def test_keyframes_stand_at_each_boot_and_never_while_a_traceback_is_held(
    three_boots: tuple[Path, Path, Session],
) -> None:
    path, _, session = three_boots
    with RecordingReader(path) as reader:
        images = [(ref, reader.keyframe(ref.id)) for ref in reader.keyframes]
        opened = {}
        for mark in reader.marks:
            if mark.kind == "phase":
                opened.setdefault(int(mark.label.split()[1]), mark.ts)
    assert sorted(opened) == [0, 1, 2]
    for index, ts in opened.items():
        # The first keyframe that knows the boot comes with the input after the batch that opened it.
        first = next(ref for ref, image in images if len(image.state.boots) > index)
        assert 0 <= first.ts - ts <= 0.5, (index, first.ts - T0, ts - T0)
    start, end = session.held
    assert not [ref.ts - T0 for ref, _ in images if start < ref.ts <= end]
    # It was due all the while (every 4 s; 5 s held): it comes with the first input after the flush, and
    # holds the traceback as boot 1's error.
    after = next(image for ref, image in images if ref.ts > end)
    errors = after.state.boots[1].errors
    assert errors and any(line.startswith("Traceback") for line in errors[-1].lines), errors


def test_a_recording_written_before_keyframes_replays_as_before(capsys: pytest.CaptureFixture[str]) -> None:
    """tests/data's twin recording, format 1 as written before issue 33: no keyframes table."""
    from tests.support.cli import run_main

    with RecordingReader(DATA) as reader:
        assert not reader.keyframes
        assert "keyframes" not in {
            row[0] for row in reader._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        replay = Replay(reader)
        replay.seek(replay.end)
        boots = replay.snapshot(HOST if HOST in replay.hosts else "twin").state.boots
        assert [b.phase for b in boots] == ["stopped", "ready"] and boots[1].pool.tokens == 101_134
        assert replay.keyframes_read == 0 and replay.folded == sum(1 for _ in reader.records())
    code, out, err = run_main(["replay", str(DATA), "--at=-5s", "--json"], capsys)
    assert code in (0, 1), err
    assert orjson.loads(out)["boot"]["phase"] == "ready"


def _tamper(path: Path, sql: str, *args: Any) -> None:
    conn = sqlite3.connect(path)
    conn.execute(sql, args)
    conn.commit()
    conn.close()


def _newest(path: Path) -> int:
    with RecordingReader(path) as reader:
        return max(ref.id for ref in reader.keyframes)


def _bomb(raw_bytes: int) -> bytes:
    out = zlib.compressobj(9)
    chunk = b"\0" * (1 << 20)
    parts = [out.compress(chunk) for _ in range(raw_bytes >> 20)]
    return b"".join(parts) + out.flush()


def _plain_keyframe(path: Path, keyframe_id: int) -> dict[str, Any]:
    conn = sqlite3.connect(path)
    blob = conn.execute("SELECT blob FROM keyframes WHERE id = ?", (keyframe_id,)).fetchone()[0]
    conn.close()
    plain: dict[str, Any] = orjson.loads(zlib.decompress(blob))
    return plain


@pytest.mark.parametrize(
    "hostile", ["bomb", "not-json", "other-host", "too-many-events", "bad-event", "huge-blob", "bad-index"]
)
def test_a_keyframe_that_does_not_read_back_is_passed_over(
    three_boots: tuple[Path, Path, Session], tmp_path: Path, hostile: str
) -> None:
    path, old, _ = three_boots
    path = Path(shutil.copy(path, tmp_path / "hostile.k26rec"))
    newest = _newest(path)
    if hostile == "bomb":
        _tamper(
            path, "UPDATE keyframes SET blob = ? WHERE id = ?", _bomb(KEYFRAME_RAW_MAX + (1 << 20)), newest
        )
    elif hostile == "not-json":
        _tamper(path, "UPDATE keyframes SET blob = ? WHERE id = ?", zlib.compress(b"{not json"), newest)
    elif hostile in ("other-host", "too-many-events", "bad-event"):
        plain = _plain_keyframe(path, newest)
        if hostile == "other-host":
            plain["host"] = "gpu-b"
        elif hostile == "too-many-events":
            plain["recent"] = plain["recent"] * (EVENTS_MAX // len(plain["recent"]) + 1)
            plain["events_total"] = 10**9
        else:
            plain["recent"][0]["kind"] = "nonsense"
        _tamper(
            path, "UPDATE keyframes SET blob = ? WHERE id = ?", zlib.compress(orjson.dumps(plain)), newest
        )
    elif hostile == "huge-blob":
        _tamper(path, "UPDATE keyframes SET blob = zeroblob(?) WHERE id = ?", KEYFRAME_RAW_MAX + 1, newest)
    else:
        _tamper(path, "UPDATE keyframes SET ts = 1e300, offset = -4 WHERE id = ?", newest)
    with RecordingReader(path) as reader, RecordingReader(old) as old_reader:
        replay, baseline = Replay(reader), Replay(old_reader)
        replay.seek(replay.end)
        baseline.seek(baseline.end)
        assert seen(replay) == seen(baseline)
        if hostile == "bad-index":
            assert newest not in {ref.id for ref in reader.keyframes}
        else:
            assert replay.keyframes_refused == {newest} and replay.keyframes_read >= 1


def test_a_keyframe_bomb_is_unpacked_no_further_than_the_bound() -> None:
    with pytest.raises(RecordError, match="unpacks to more than"):
        decode_image(_bomb(64 << 20), max_raw=1 << 20)


def test_the_size_bound_drops_keyframes_with_their_chunks(tmp_path: Path) -> None:
    path = tmp_path / "bounded.k26rec"
    s = Session(path, keyframe_entries=400, keyframe_every_s=60.0)
    s.rec.policy = RetentionPolicy(max_bytes=60_000, max_age_s=None)
    s.second(STARTUP, pid=4100, invocation="inv0")
    for _ in range(40):
        s.second(TRAFFIC * 8, pid=4100, invocation="inv0")
    s.rec.close()
    assert s.rec.dropped_chunks > 0
    conn = sqlite3.connect(path)
    first = conn.execute("SELECT MIN(id) FROM chunks").fetchone()[0]
    stored = conn.execute(
        "SELECT (SELECT SUM(length(blob)) FROM chunks) + (SELECT COALESCE(SUM(length(blob)), 0) FROM keyframes)"
    ).fetchone()[0]
    kept = [row[0] for row in conn.execute("SELECT chunk FROM keyframes")]
    conn.close()
    assert kept and min(kept) >= first and stored <= 60_000 + 40_000  # bound, plus the last write
    with RecordingReader(path) as reader:
        replay = Replay(reader)
        replay.seek(replay.end)
        assert replay.keyframes_read == 1 and replay.snapshot(HOST).state == s.fold.state


def test_a_file_with_keyframes_holds_no_record_an_older_version_refuses(
    three_boots: tuple[Path, Path, Session],
) -> None:
    """A console of the version before keyframes reads `meta`, `chunks` and `marks` and refuses a record
    kind it does not know: the keyframes are in a table of their own, and the format is still 1."""
    path, _, _ = three_boots
    conn = sqlite3.connect(path)
    meta = dict(conn.execute("SELECT key, value FROM meta"))
    kinds = {r.kind for (blob,) in conn.execute("SELECT blob FROM chunks") for r in decode(blob)}
    conn.close()
    assert meta["version"] == "1"
    assert kinds <= KINDS and "journal" in kinds
