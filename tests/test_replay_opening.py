"""How a replay opens (issue 34 item 6), on tests/data's twin recording (`k26-console record twin`, started
2 s after boot 0 was ready; the unit restarted at +7 s) and on a recording made by the console itself:

- `replay FILE --at start --json` prints the recording's first state (the backlog the recorder read in its
  first 0.3 s, the first GPU sample and server reading), not a state with every field null;
- the backlog's phases ("boot 0 loading", "pool", "ready", logged 3 s before the recording began) are
  not marks of the recording; the restart while it recorded is;
- the console that recorded is not listed among the consoles present on the host, in the replay's
  pairing bar or in its `--json`.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from console.core.pairing import PairingView
from console.core.recording import restart_marks
from console.sources.recording import RecordingReader
from console.sources.replay import Replay
from console.tui.app import ConsoleApp, HostEntry
from console.tui.pairing import pairing_text
from console.tui.replay import ReplayApp
from console.tui.view import display_boot
from tests.support.cli import run_main

DATA = Path(__file__).parent / "data" / "recordings" / "twin-restart-v1.k26rec"
POOL = 101_134


def test_replay_at_start_prints_the_recordings_first_state(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(["replay", str(DATA), "--at", "start", "--json"], capsys)
    assert code in (0, 1), err
    report = json.loads(out)
    assert report["boot"] is not None and report["boot"]["phase"] == "ready", report["boot"]
    assert report["pool"]["pool_tokens"] == POOL
    assert len(report["gpus"]) == 8 and report["server_health"] == "ok"
    with RecordingReader(DATA) as reader:
        # The first state is a third of a second in: before it, only the link and the pairing view.
        assert 0 < report["taken_at"] - reader.start < 1.0


def test_the_backlog_makes_no_marks_and_the_restart_while_recording_does() -> None:
    with RecordingReader(DATA) as reader:
        raw = [m.label for m in reader.marks]
        replay = Replay(reader)
        labels = [m.label for m in replay.marks]
    # What the file holds (the recorder derived them as it read its backlog) ...
    assert raw[:3] == ["boot 0 loading", "boot 0 pool", "boot 0 ready"]
    # ... and what the replay shows: only what happened while it recorded.
    assert labels == ["boot 0 stopped", "boot 1 starting", "boot 1 loading", "boot 1 ready"]
    restarts = restart_marks(replay.marks)
    assert [replay.marks[n].label for n in restarts] == ["boot 1 starting"]


async def test_the_replay_opens_on_the_first_state() -> None:
    with RecordingReader(DATA) as reader:
        replay = Replay(reader)
        app = ReplayApp(replay, DATA)
        async with app.run_test(size=(160, 48)):
            await app.wait_settled()
            snap = app.dashboards["twin"].snap
            boot = display_boot(snap.state) if snap is not None else None
            assert replay.position == replay.start and boot is not None and boot.pool.tokens == POOL
            assert "next: boot 0 stopped" in app.bar.render_text(200).plain


def _view(host: str, ids: list[str]) -> PairingView:
    now = datetime.now(UTC)
    return PairingView.model_validate(
        {
            "host": host,
            "now": now,
            "presence": [
                {
                    "user": "op",
                    "jump_host": "jump",
                    "pid": 10 + n,
                    "console_id": cid,
                    "since": now,
                    "heartbeat": now,
                }
                for n, cid in enumerate(ids)
            ],
        }
    )


async def test_the_console_that_recorded_is_not_a_console_present_in_the_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "console.k26rec"
    app = ConsoleApp([HostEntry("h")], connect=False, record=path)
    async with app.run_test(size=(120, 40)):
        assert app.recording.start() is None
        ctl = app.hosts["h"]
        # What its pairing link hands it: its own heartbeat and another console's.
        ctl._on_view(_view("h", [app.me.console_id, "other-console"]))
        assert app.recording.stop() == path
    with RecordingReader(path) as reader:
        replay = Replay(reader)
        replay.seek(replay.end)
        view = replay.hosts["h"].view
        assert view is not None and [p.console_id for p in view.presence] == ["other-console"]
        rapp = ReplayApp(replay, path)
        bar = pairing_text(view, rapp.me).plain
        assert "with op@jump" in bar and bar.count("op@jump") == 1, bar
    code, out, err = run_main(["replay", str(path), "--json"], capsys)
    assert code in (0, 1), err
    assert [p["console_id"] for p in json.loads(out)["presence"]] == ["other-console"]
