"""Recording and replay on a twin over SSH (issue 17).

- The console records an apply of ctx-200k while the operator watches (`--record`); the replay opens on
  the old pool (101,134 tokens), the seek to "ready" of the new boot shows the new one, and the
  replayed event feed is the live feed line for line.
- `k26-console record`, killed with SIGKILL halfway, leaves a recording that replays up to the cut; ended
  with SIGINT it leaves a closed file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from console.core.events import Audit
from console.core.recording import Record
from console.sources.hosts import load_hosts
from console.sources.profile_store import ProfileStore, shipped_profile_dir
from console.sources.recording import RecordingError, RecordingReader
from console.sources.replay import Replay
from console.sources.session_options import SessionOptions
from console.tui.app import ConsoleApp, HostEntry
from console.tui.feed import feed_line
from console.tui.host_entry import PairingOptions
from console.tui.messages import ApplyRequested
from console.tui.pairing import pairing_text
from console.tui.replay import ReplayApp, ReplayDashboard
from console.tui.screens import ApplyConfirmScreen, HelpScreen
from console.tui.view import display_boot
from console.twin.host import TwinHost
from tests.support.cli import CLI, operator_env, run_cli, wait_until

TIME_SCALE = 0.002
SIZE = (160, 48)
OLD_POOL = 101_134


@pytest.fixture
def fresh_twin(tmp_path: Path) -> Iterator[TwinHost]:
    host = TwinHost(tmp_path / "twin", time_scale=TIME_SCALE)
    host.start_sync()
    try:
        yield host
    finally:
        host.stop_sync()


@pytest.fixture
def store(tmp_path: Path) -> ProfileStore:
    shipped = shipped_profile_dir()
    assert shipped is not None
    user = tmp_path / "profiles"
    user.mkdir()
    return ProfileStore([user, shipped])


async def until(pilot, what: str, predicate: Callable[[], object], timeout: float = 90.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.1)


def pool_of(snap) -> int | None:  # type: ignore[no-untyped-def]
    boot = display_boot(snap.state) if snap is not None else None
    return boot.pool.tokens if boot is not None and boot.ready and not boot.ended else None


async def test_a_recorded_apply_replays_from_the_old_pool_to_the_new(
    fresh_twin: TwinHost, store: ProfileStore, tmp_path: Path
) -> None:
    twin, path = fresh_twin, tmp_path / "apply.k26rec"
    config = load_hosts(twin.hosts_toml).get(twin.name)
    assert config is not None
    entry = HostEntry(
        twin.name,
        config=config,
        simulated=True,
        session=SessionOptions(gpu_interval_s=0.5, server_interval_s=0.5),
        restart_history_dir=tmp_path / "controller",
        pairing=PairingOptions(heartbeat_s=0.5, poll_s=0.5),
    )
    app = ConsoleApp([entry], store=store, target=200_000, target_source="test", record=path)
    async with app.run_test(size=SIZE) as pilot:
        dash = app.dashboards[twin.name]
        await until(pilot, "the first boot", lambda: pool_of(dash.snap) == OLD_POOL)
        assert app.recording.on and app.recording.badge.has_class("on")
        assert "● REC" in str(app.recording.badge.render())
        await until(pilot, "the state directory", lambda: app.hosts[twin.name].link is not None)
        app.post_message(ApplyRequested(twin.name, "ctx-200k"))
        await until(pilot, "the confirmation", lambda: isinstance(app.screen, ApplyConfirmScreen))
        await pilot.press("y")
        await until(pilot, "the verdict", lambda: dash.track is not None and dash.track.done)
        assert dash.track.ok, dash.track.summary
        new_pool = pool_of(dash.snap)
        assert new_pool is not None and new_pool > 200_000
        # The outcome's audit line, and a quiet second after it: everything the feed shows was recorded.
        await until(
            pilot,
            "the audit outcome",
            lambda: any(isinstance(e, Audit) and e.outcome == "ok" for e in dash.feed.events()),
        )
        # The journal's own "ready" of the new boot: the apply's verdict comes over HTTP, and on a loaded
        # machine the journal follower may deliver the line after it (a 4-worker run stopped the
        # recording before it, and the replay had no "ready" mark for the new boot).
        await until(
            pilot,
            "the new boot's ready line",
            lambda: (
                dash.snap is not None
                and len(dash.snap.state.boots) >= 2
                and dash.snap.state.boots[-1].phase == "ready"
            ),
        )
        # Everything read so far on screen, then the recording stopped (W) in the same turn of the loop:
        # the recording holds exactly what the feed shows.
        ctl = app.hosts[twin.name]
        ctl.pending = None
        dash.show(ctl.session.current())
        app.action_record()
        assert not app.recording.on and not app.recording.badge.has_class("on")
        live = [feed_line(e) for e in dash.feed.events()]

    reader = RecordingReader(path)
    replay = Replay(reader)
    phases = [m.label for m in replay.marks if m.kind == "phase"]
    new_index = max(int(label.split()[1]) for label in phases)
    assert f"boot {new_index} ready" in phases and new_index >= 1
    rapp = ReplayApp(replay, path, speed=8.0)
    async with rapp.run_test(size=SIZE) as pilot:
        await rapp.wait_settled()
        rdash = rapp.dashboards[twin.name]
        assert isinstance(rdash, ReplayDashboard)
        # Absent, not refused: no key and no action of the replay reaches a host.
        keys = {b.binding.action.split("(")[0] for b in rapp.active_bindings.values()}
        assert not keys & {"restart", "rollback", "apply", "probe", "profiles", "refused", "record"}
        assert rdash.check_action("restart", ()) is False and rapp.hosts[twin.name].session is None
        await pilot.press("f1")
        await until(pilot, "the help", lambda: isinstance(rapp.screen, HelpScreen))
        assert "Keys (replay)" in rapp.screen.keys and "profiles" not in rapp.screen.keys.split("Nothing")[0]
        await pilot.press("escape")
        await until(pilot, "the dashboard", lambda: not isinstance(rapp.screen, HelpScreen))
        # The start is the recording's first state: the old boot, once its ready line was read (in the
        # journal backlog the session read first, or while it recorded when the twin was still starting).
        old_ready = replay.mark_named(f"boot {new_index - 1} ready")
        rapp.go_to(str(old_ready.ts - replay.start) if old_ready is not None else "start")
        await until(pilot, "the old pool", lambda: not rapp.seeking and pool_of(rdash.snap) == OLD_POOL)
        # The console that recorded is this one: no other console was on the host (issue 34 item 6).
        view = rapp.replay.hosts[twin.name].view
        assert view is not None and "no other console" in pairing_text(view, rapp.me).plain
        # n goes from mark to mark: to "ready" of the new boot.
        for _ in range(40):
            await pilot.press("n")
            await until(pilot, "the seek", lambda: not rapp.seeking)
            await rapp.wait_settled()
            label = next((m.label for m in replay.marks if abs(m.ts - replay.position) < 1e-6), "")
            if label == f"boot {new_index} ready":
                break
        assert pool_of(rdash.snap) == new_pool
        # The timeline: the restart (▲) before the cursor (◆), and where the replay stands.
        bar = rapp.bar.render_text(2000).plain  # wide: the restart and the cursor in cells of their own
        marks = [(round(m.ts - replay.start, 3), m.kind, m.label) for m in replay.marks]
        assert "▲" in bar and bar.index("▲") < bar.index("◆"), (bar.split("\n")[0].strip("─"), marks)
        assert "REPLAY ❚❚ paused 8×" in bar, bar
        # Played from the start at 8x to the end: the feed is the live one, line for line.
        await pilot.press("home")
        await until(pilot, "the start", lambda: not rapp.seeking and replay.position == replay.start)
        await pilot.press("space")
        await until(pilot, "the end", lambda: replay.next_ts() is None and not rapp.playing, timeout=120)
        await rapp.wait_settled()
        replayed = [feed_line(e) for e in rdash.feed.events()]
    assert replayed == live
    # The same moment through `replay --at --json`: what `snapshot --json` prints.
    res = run_cli(tmp_path, "replay", str(path), "--at", "end", "--json")
    assert res.returncode in (0, 1), res.stderr
    report = json.loads(res.stdout)
    assert report["pool"]["pool_tokens"] == new_pool and report["boot"]["index"] == new_index
    assert report["presence"] == []
    reader.close()


def _recorder(twin: TwinHost, tmp_path: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "record", twin.name, "--out", str(out), "--hosts", str(twin.hosts_toml)],
        env=operator_env(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _journal_records(path: Path) -> list[Record]:
    with RecordingReader(path) as reader:
        return [r for _, r in reader.records() if r.kind == "journal"]


def _kinds(path: Path) -> set[str]:
    with RecordingReader(path) as reader:
        return {r.kind for _, r in reader.records()}


def _marks(path: Path, prefix: str) -> list[str]:
    with RecordingReader(path) as reader:
        return [m.label for m in reader.marks if m.label.startswith(prefix)]


def _recorded(path: Path) -> list[Record]:
    """The journal records so far; none while the recorder is still creating the file."""
    try:
        return _journal_records(path)
    except RecordingError as exc:
        assert "empty SQLite file" in str(exc) or "does not exist" in str(exc), exc
        return []


def test_a_recording_killed_halfway_replays_up_to_the_cut(fresh_twin: TwinHost, tmp_path: Path) -> None:
    twin, out = fresh_twin, tmp_path / "cut.k26rec"
    proc = _recorder(twin, tmp_path, out)
    try:
        # Halfway: the first boot has been read and a restart is under way.
        assert wait_until(lambda: _recorded(out) or proc.poll() is not None, 60)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert _recorded(out), "nothing recorded"
        twin.systemctl("restart", "--no-block", twin.unit, check=False)
        # Cut once the restart's new boot is on the recording's timeline, before it is ready.
        assert wait_until(lambda: _marks(out, "boot 1 "), 60, max_interval_s=0.05), (
            "the restart was not recorded"
        )
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        killed_at = time.time()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    records = _journal_records(out)
    entries = [e for r in records for e in r.payload]
    with RecordingReader(out) as reader:
        replay = Replay(reader)
        replay.seek(replay.end)
        assert replay.end <= killed_at
        host = replay.hosts[twin.name]
        # Every entry recorded, in order, once; the last one read is where the replay stands.
        assert host.follower.entries == len(entries)
        assert host.follower.cursor == entries[-1]["__CURSOR"]
        assert len({e["__CURSOR"] for e in entries}) == len(entries)
        boots = host.fold.state.boots
        assert len(boots) == 2 and boots[0].pool.tokens == OLD_POOL
        assert [m for m in reader.marks if m.label.startswith("boot 1 ")]
    res = run_cli(tmp_path, "replay", str(out), "--json")
    assert res.returncode in (0, 1), res.stderr
    assert json.loads(res.stdout)["host"] == twin.name


def test_sigint_ends_a_recording_cleanly(fresh_twin: TwinHost, tmp_path: Path) -> None:
    twin, out = fresh_twin, tmp_path / "int.k26rec"
    proc = _recorder(twin, tmp_path, out)
    try:
        # The lock and presence are recorded, and the recorder is not a console on the host: no heartbeat.
        wanted = {"view", "gpu", "server", "link", "follower"}
        assert wait_until(lambda: proc.poll() is not None or (_recorded(out) and _kinds(out) >= wanted), 60)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert _recorded(out) and _kinds(out) >= wanted, _kinds(out)
        presence = twin.layout.root / "home" / ".k26-console" / "presence"
        assert not list(presence.glob("*.json"))
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 0, err
    assert "recorded" in err and "replay" in err
    wal = Path(f"{out}-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    assert _journal_records(out)
