"""Two consoles on one twin, each a `ConsoleApp` driven by its own pilot in one test, over real SSH on
loopback (issue 9): presence, the lock and the audit trail as the operators see them.

- alice applies ctx-200k; bob's console shows alice here and holding the lock, plays the same restart
  phase by phase from the journal, refuses his own apply and restart at once naming alice and her
  intent, and ends with alice's audit line on his feed and under his timeline;
- a lock whose holder went quiet is shown stale; bob breaks it only after a confirmation that names the
  holder and the intent (a "no" leaves it), the break is on the trail, and his restart then runs through
  the service controller inside the lock and is audited; a read-only console is seen as such and never
  takes the lock.

One twin serves the module at a small time scale; the tests run in file order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from textual._context import active_app

from console.core.events import Audit
from console.core.pairing import Identity, LockInfo, PairingView, Presence
from console.core.restart import BOOT
from console.sources.hosts import load_hosts
from console.sources.hoststate import HostStateDir
from console.sources.profile_store import ProfileStore, shipped_profile_dir
from console.sources.session_options import SessionOptions
from console.sources.transport import Transport
from console.tui.app import ConsoleApp, HostEntry
from console.tui.commands import ConsoleCommands
from console.tui.dashboard import HostDashboard
from console.tui.host_entry import PairingOptions
from console.tui.messages import ApplyRequested, BreakRequested
from console.tui.pairing import held_by_other, intent_phrase, lock_note, pairing_text, refusal
from console.tui.probe import ProbeScreen
from console.tui.screens import ApplyConfirmScreen, ConfirmScreen
from console.tui.view import display_boot, restart_timeline
from console.twin.host import TwinHost
from tests.support.cli import slow_boots
from tests.support.twins import module_twin
from tests.support.waiting import eventually
from tests.tui_support import plain

TIME_SCALE = 0.004
SIZE = (160, 48)
BEAT = 0.5  # heartbeat and poll interval: a console is stale 1.5 s after its last beat

ALICE = Identity(user="alice", jump_host="jump1", pid=4242, console_id="alice1")
BOB = Identity(user="bob", jump_host="jump2", pid=5151, console_id="bob2")
CAROL = Identity(user="carol", jump_host="jump3", pid=6161, console_id="carol3")
READER = Identity(user="dave", jump_host="jump4", pid=7171, console_id="dave4")


twin = module_twin("tui-pairing-twin", time_scale=TIME_SCALE)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ProfileStore:
    shipped = shipped_profile_dir()
    assert shipped is not None
    return ProfileStore([tmp_path_factory.mktemp("tui-pairing-profiles"), shipped])


class Told:
    """The notifications a console showed (Textual's toasts fade; the test keeps them)."""

    def __init__(self, app: ConsoleApp) -> None:
        self.messages: list[str] = []
        shown = app.notify

        def notify(message: str, *args: Any, **kw: Any) -> None:
            self.messages.append(str(message))
            shown(message, *args, **kw)

        app.notify = notify  # type: ignore[method-assign]

    def since(self, n: int) -> list[str]:
        return self.messages[n:]


def console(
    twin: TwinHost, store: ProfileStore, state: Path, me: Identity, *, read_only: bool = False
) -> ConsoleApp:
    config = load_hosts(twin.hosts_toml).get(twin.name)
    assert config is not None
    entry = HostEntry(
        twin.name,
        config=config,
        simulated=True,
        session=SessionOptions(gpu_interval_s=0.5, server_interval_s=0.5),
        restart_history_dir=state,
        pairing=PairingOptions(heartbeat_s=BEAT, poll_s=BEAT),
    )
    return ConsoleApp([entry], read_only=read_only, store=store, identity=me, target=200_000)


def ready_pool(dash: HostDashboard) -> int | None:
    boot = display_boot(dash.snap.state) if dash.snap is not None else None
    return boot.pool.tokens if boot is not None and boot.ready and not boot.ended else None


def others(app: ConsoleApp, host: str) -> dict[str, str]:
    link = app.hosts[host].link
    view = link.view if link is not None else None
    return {p.who: p.looking_at for p in view.others(app.me)} if view is not None else {}


def lock_holder(app: ConsoleApp, host: str) -> str | None:
    link = app.hosts[host].link
    view = link.view if link is not None else None
    return view.lock.holder.who if view is not None and view.lock is not None else None


def audits(dash: HostDashboard) -> list[Audit]:
    return [e for e in dash.feed.events() if isinstance(e, Audit)]


def trail(twin: TwinHost) -> list[dict[str, Any]]:
    path = twin.layout.home_dir / ".k26-console" / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def palette(app: ConsoleApp) -> dict[str, str]:
    """The palette's commands (name → help) as `app` lists them. A provider finds its app through
    Textual's active-app context, which with two consoles in one test is the last one started."""
    token = active_app.set(app)
    try:
        return {name: text for name, _, text in ConsoleCommands(app.screen)._commands()}
    finally:
        active_app.reset(token)


async def watch_phases(dash: HostDashboard, boots_before: int, seen: set[str]) -> None:
    """The restart phases `dash` shows running in a boot after the first `boots_before`, into `seen`."""
    while True:
        snap = dash.snap
        tl = restart_timeline(snap.state, snap.ts) if snap is not None else None
        if tl is not None and snap is not None and len(snap.state.boots) > boots_before:
            seen.update(s.phase.value for s in tl.steps if s.state == "active")
        await asyncio.sleep(0.02)


@pytest.mark.serial  # samples the phases every 20-50 ms: under a parallel pass it misses them
async def test_b_watches_a_apply_live_and_is_refused_by_name(twin, store, tmp_path) -> None:
    a, b = console(twin, store, tmp_path / "a", ALICE), console(twin, store, tmp_path / "b", BOB)
    told_b = Told(b)
    host = twin.name
    async with a.run_test(size=SIZE) as pa, b.run_test(size=SIZE) as pb:
        da, db = a.dashboards[host], b.dashboards[host]
        await eventually(lambda: ready_pool(da) == 101_134, "alice's first boot", pilot=pa, timeout=60)
        await eventually(lambda: ready_pool(db) == 101_134, "bob's first boot", pilot=pb, timeout=60)
        # Each sees the other, with what they look at, in the bar under the header.
        await eventually(
            lambda: others(b, host).get("alice@jump1") == "dashboard",
            "alice in bob's console",
            pilot=pb,
            timeout=60,
        )
        await eventually(
            lambda: "bob@jump2" in others(a, host), "bob in alice's console", pilot=pa, timeout=60
        )
        # Only alice with bob: a console of an earlier test on the module's twin that did not leave
        # (its app ended without quitting) is there until its heartbeat is stale (3 beats of 5 s).
        await eventually(
            lambda: plain(db.pairing.render()).startswith(
                "lock free  │  with alice@jump1 (dashboard, since "
            ),
            "only alice in bob's bar",
            pilot=pb,
            timeout=60,
            detail=lambda: plain(db.pairing.render()),
        )
        # What alice looks at follows her screens: P opens the probe.
        await pa.press("P")
        await eventually(lambda: isinstance(a.screen, ProbeScreen), "the probe screen", pilot=pa, timeout=60)
        await eventually(
            lambda: others(b, host).get("alice@jump1") == "probe", "alice on the probe", pilot=pb, timeout=60
        )
        await pa.press("escape")
        await eventually(
            lambda: others(b, host).get("alice@jump1") == "dashboard", "alice back", pilot=pb, timeout=60
        )
        boots_before = len(db.snap.state.boots)

        # Alice's restart runs five times slower than the module's others, so that her lock stands
        # through bob's three refusals however loaded the machine is (her apply reloads the unit, which
        # reads this drop-in; a CI run saw the fast restart end between two of bob's keys).
        slow = slow_boots(twin, TIME_SCALE * 5)
        a.post_message(ApplyRequested(host, "ctx-200k"))
        await eventually(
            lambda: isinstance(a.screen, ApplyConfirmScreen), "alice's confirmation", pilot=pa, timeout=60
        )
        seen: set[str] = set()
        watching = asyncio.create_task(watch_phases(db, boots_before, seen))
        await pa.press("y")
        await eventually(
            lambda: lock_holder(b, host) == "alice@jump1",
            "alice's lock in bob's console",
            pilot=pb,
            timeout=60,
        )
        bar = plain(db.pairing.render())
        assert "locked by alice@jump1: apply ctx-200k" in bar, bar
        note = plain(db.timeline.note) if db.timeline.note is not None else ""
        assert note.startswith("alice@jump1 is applying ctx-200k (lock held "), note

        # Bob's own changes are refused at once, naming alice and her intent; nothing opens or runs.
        n = len(told_b.messages)
        b.post_message(ApplyRequested(host, "ctx-128k"))
        await pb.press("r")
        await pb.press("R")
        await eventually(lambda: len(told_b.since(n)) >= 3, "bob's three refusals", pilot=pb, timeout=60)
        refusals = told_b.since(n)
        assert len(refusals) == 3, refusals
        for sentence in refusals:
            assert "alice@jump1 holds the lock on twin: apply ctx-200k" in sentence, sentence
        assert "applying ctx-128k is refused" in refusals[0] and "a restart is refused" in refusals[1]
        assert len(b.screen_stack) == 1 and b.hosts[host].busy is None and db.track is None
        # Shown disabled in the footer, and marked refused in the palette.
        # (Read against the same view: alice's apply may have ended since the refusals on a fast host.)
        held = held_by_other(db.pairing.view, db.pairing.me)
        assert (db.check_action("restart", ()) is None) == held
        assert (db.check_action("rollback", ()) is None) == held
        helps = palette(b)
        if held_by_other(db.pairing.view, db.pairing.me):
            assert helps[f"Restart the service on {host}"].startswith("refused now: alice@jump1 is applying")

        # The same restart, live in bob's console from the journal: the new boot's phases as they ran
        # (watched from alice's confirmation on: on a loaded machine the refusals above take seconds).
        track = da.track
        assert track is not None and track.action == "apply ctx-200k"
        await eventually(lambda: track.done, "alice's apply", pilot=pb, timeout=120)
        watching.cancel()
        slow.unlink()
        twin.systemctl("daemon-reload")
        assert track.ok, track.summary
        boot_phases = {p.value for p in BOOT}
        assert seen & boot_phases, seen  # at least one boot phase was seen running, not just its end
        assert seen & boot_phases <= set(track.durations), (seen, track.durations)

        # The end: alice's audit line on bob's feed and under his timeline; the lock is free again.
        # (Her intent, outcome "started", comes first on the feed: the outcome is the entry that follows.)
        await eventually(
            lambda: any(e.user == "alice" and e.outcome != "started" for e in audits(db)),
            "alice's audit entry",
            pilot=pb,
            timeout=60,
        )
        assert next(e for e in audits(db) if e.user == "alice").outcome == "started"
        entry = next(e for e in audits(db) if e.user == "alice" and e.outcome != "started")
        assert entry.action == "apply" and entry.profile == "ctx-200k" and entry.outcome == "ok"
        assert entry.message.startswith("alice applied ctx-200k; restart ")
        assert f"verified {entry.pool_tokens:,} tokens" in entry.message and entry.pool_tokens >= 200_000
        await eventually(lambda: lock_holder(b, host) is None, "the lock free", pilot=pb, timeout=60)
        await eventually(
            lambda: db.timeline.note is not None and "applied" in db.timeline.note.plain,
            "the note",
            pilot=pb,
            timeout=60,
        )
        assert db.timeline.note.plain == entry.message
        await eventually(lambda: (ready_pool(db) or 0) >= 200_000, "the new boot", pilot=pb, timeout=60)
        assert db.check_action("restart", ()) is True
        # The trail on the host holds the one apply, by alice, with its phases.
        # (Written twice: the intent before the restart, then the outcome, paired by op_id.)
        intent, applied = [e for e in trail(twin) if e["action"] == "apply"]
        assert intent["outcome"] == "started" and intent["op_id"] == applied["op_id"]
        assert applied["user"] == "alice" and applied["jump_host"] == "jump1"
        assert {"loading_weights", "kv_pool", "cuda_graphs"} <= set(applied["durations"])


async def test_stale_lock_broken_only_after_confirming_then_restart_is_audited(twin, store, tmp_path) -> None:
    host = twin.name
    config = load_hosts(twin.hosts_toml).get(host)
    assert config is not None
    b = console(twin, store, tmp_path / "b", BOB)
    reader = console(twin, store, tmp_path / "r", READER, read_only=True)
    told_b = Told(b)
    async with Transport(config, ssh_config=[]) as transport:
        # carol took the lock and then her console went quiet: no heartbeat after the acquire.
        carol = HostStateDir(transport, config, CAROL, heartbeat_s=BEAT)
        # Something on the trail from before the consoles open: it is on their feeds when they do.
        await carol.audit.append(
            carol.audit.entry("probe", profile="ctx-256k", outcome="ok", summary="0.7 tok/s")
        )
        await carol.locks.acquire("apply ctx-256k")
        async with b.run_test(size=SIZE) as pb, reader.run_test(size=SIZE) as pr:
            db = b.dashboards[host]
            await eventually(lambda: ready_pool(db) is not None, "bob's boot", pilot=pb, timeout=60)
            await eventually(
                lambda: (link := b.hosts[host].link) and link.view and link.view.lock_stale,
                "the stale lock",
                pilot=pb,
                timeout=60,
            )
            bar = plain(db.pairing.render())
            assert "STALE lock carol@jump3: apply ctx-256k" in bar, bar
            await eventually(
                lambda: any(e.action == "probe" for e in audits(db)),
                "the trail's backlog",
                pilot=pb,
                timeout=60,
            )
            assert audits(db)[-1].message == "carol probed ctx-256k; 0.7 tok/s"
            assert "is stale" in db.timeline.note.plain
            # The read-only console is seen as such, and its keys take no lock.
            await eventually(
                lambda: others(b, host).get("dave@jump4") == "read-only", "the reader", pilot=pb, timeout=60
            )
            await pr.press("r")
            assert len(reader.screen_stack) == 1 and reader.hosts[host].busy is None

            # A restart is refused while the stale lock stands, with the way out.
            n = len(told_b.messages)
            await pb.press("r")
            await eventually(lambda: told_b.since(n), "the refusal", pilot=pb, timeout=60)
            (sentence,) = told_b.since(n)
            assert "carol@jump3 holds the lock on twin: apply ctx-256k" in sentence
            assert "Break the stale lock" in sentence
            assert f"Break the stale lock on {host}" in palette(b)

            # No: the lock stays. Yes: broken, and the trail says by whom.
            b.post_message(BreakRequested(host))
            await eventually(
                lambda: isinstance(b.screen, ConfirmScreen), "the confirmation", pilot=pb, timeout=60
            )
            detail = b.screen.detail
            assert "carol@jump3" in detail and "apply ctx-256k" in detail and "pid 6161" in detail
            await pb.press("n")
            await pb.pause(0.3)
            assert (twin.layout.home_dir / ".k26-console" / "lock").exists()
            b.post_message(BreakRequested(host))
            await eventually(
                lambda: isinstance(b.screen, ConfirmScreen), "the confirmation again", pilot=pb, timeout=60
            )
            await pb.press("y")
            await eventually(
                lambda: any(e.action == "lock_break" for e in audits(db)),
                "the break on bob's feed",
                pilot=pb,
                timeout=60,
            )
            broke = next(e for e in audits(db) if e.action == "lock_break")
            assert broke.user == "bob" and broke.message.startswith(
                "bob broke carol@jump3's lock (apply ctx-256k"
            )
            await eventually(lambda: lock_holder(b, host) is None, "the lock free", pilot=pb, timeout=60)
            assert f"Break the stale lock on {host}" not in palette(b)

            # Bob's restart: the controller's steps and the boot on the timeline, in the lock, audited.
            before = ready_pool(db)
            await pb.press("r")
            await eventually(
                lambda: isinstance(b.screen, ConfirmScreen), "the restart confirmation", pilot=pb, timeout=60
            )
            await pb.press("y")
            await eventually(lambda: db.track is not None, "the restart", pilot=pb, timeout=60)
            track = db.track
            assert track.action == "restart"
            await eventually(
                lambda: lock_holder(reader, host) == "bob@jump2",
                "bob's lock in the reader",
                pilot=pr,
                timeout=60,
            )
            assert "bob@jump2 is restarting the service" in reader.dashboards[host].timeline.note.plain
            await eventually(lambda: track.done, "the verdict", pilot=pb, timeout=60)
            assert track.ok, track.summary
            timeline = plain(db.timeline.render())
            assert "restart verified" in timeline
            # a plain restart lists the steps it takes: no drop-in written, nothing reloaded (issue 34)
            for step in ("restart", "KV pool", "verify, record"):
                assert f"✔ {step}" in timeline, (step, timeline)
            assert "write drop-in" not in timeline and "daemon-reload" not in timeline
            await eventually(
                lambda: any(e.action == "restart" and e.outcome != "started" for e in audits(db)),
                "bob's restart on the feed",
                pilot=pb,
                timeout=60,
            )
            done = next(e for e in audits(db) if e.action == "restart" and e.outcome != "started")
            assert done.user == "bob" and done.outcome == "ok" and done.pool_tokens == before
            assert done.message.startswith(f"bob restarted {twin.unit}; restart ")
            rd = reader.dashboards[host]
            await eventually(
                lambda: rd.timeline.note and "restarted" in rd.timeline.note.plain,
                "the reader's note",
                pilot=pr,
                timeout=60,
            )
            actions = [(e["user"], e["action"]) for e in trail(twin)]
            assert actions[-3:] == [("bob", "lock_break"), ("bob", "restart"), ("bob", "restart")]
            assert [e["outcome"] for e in trail(twin)[-2:]] == ["started", "ok"]
            assert not any(user == "dave" for user, _ in actions)


# ---- the words, on fixed views ---------------------------------------------------------------------

T0 = datetime(2026, 11, 30, 10, 0, 0, tzinfo=UTC)


def _view(lock_by: Identity | None, *, stale: bool = False, here: tuple[Identity, ...] = ()) -> PairingView:
    presence = [
        Presence(**who.model_dump(), since=T0, heartbeat=T0 + timedelta(seconds=70), looking_at="dashboard")
        for who in here
    ]
    lock = LockInfo(holder=lock_by, intent="apply ctx-200k", taken_at=T0, lock_id="L1") if lock_by else None
    return PairingView(
        host="gpu1", now=T0 + timedelta(seconds=72), presence=presence, lock=lock, lock_stale=stale
    )


def test_words_for_a_lock_held_by_another_console() -> None:
    view = _view(BOB, here=(ALICE, BOB))
    assert lock_note(view, ALICE) == "bob@jump2 is applying ctx-200k (lock held 1m12s)"
    sentence = refusal(view, ALICE, "a restart")
    assert sentence is not None and sentence.startswith("bob@jump2 holds the lock on gpu1: apply ctx-200k")
    assert sentence.endswith("; a restart is refused until it is released.")
    bar = pairing_text(view, ALICE).plain
    assert bar.startswith("locked by bob@jump2: apply ctx-200k, 1m12s  │  with bob@jump2 (dashboard, since ")
    # The holder itself is told nothing is in its way.
    assert lock_note(view, BOB) is None and refusal(view, BOB, "a restart") is None
    assert pairing_text(view, BOB).plain.startswith("lock held by this console: apply ctx-200k")


def test_words_for_a_stale_lock_and_no_lock() -> None:
    stale = _view(CAROL, stale=True, here=(ALICE,))
    note = lock_note(stale, ALICE)
    assert note is not None and note.startswith("carol@jump3's lock (apply ctx-200k, held 1m12s) is stale")
    assert "Break the stale lock on gpu1" in note
    assert "until the stale lock is broken" in (refusal(stale, ALICE, "a rollback") or "")
    assert pairing_text(stale, ALICE).plain.startswith("STALE lock carol@jump3: apply ctx-200k, 1m12s")
    free = _view(None, here=(ALICE,))
    assert lock_note(free, ALICE) is None and refusal(free, ALICE, "a restart") is None
    assert pairing_text(free, ALICE).plain == "lock free  │  no other console on gpu1"
    assert [intent_phrase(i) for i in ("apply ctx-200k", "rollback", "restart", "fix it")] == [
        "applying ctx-200k",
        "rolling back",
        "restarting the service",
        "fix it",
    ]


async def test_leaving_a_host_the_console_cannot_reach_does_not_wait_for_it(tmp_path: Path) -> None:
    """Quitting with the host unreachable took 3.4 s: leaving waited for a link that was not there."""
    import socket

    from console.tui.pairing import PairingLink

    with socket.socket() as s:  # a loopback port nobody listens on: every connection is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "hosts.toml").write_text(f'[hosts.gone]\nssh = "127.0.0.1"\nport = {port}\n')
    config = load_hosts(str(tmp_path / "hosts.toml")).hosts["gone"]
    transport = Transport(config, ssh_config=[])
    transport.start()
    try:
        link = PairingLink(
            HostStateDir(transport, config), on_view=lambda view: None, on_audit=lambda e: None
        )
        started = time.monotonic()
        await link.leave(3.0)
        assert time.monotonic() - started < 0.5 and link.left
    finally:
        await transport.close()


async def test_the_link_beats_at_the_pace_set_while_it_runs() -> None:
    """The fleet plan changes a link's poll and heartbeat while it runs (a host brought on screen, then
    poked): the next wait is the new pace, not the one the link started with."""
    from console.tui.pairing import PairingLink

    beats: list[float] = []

    class Board:
        heartbeat_s = 16.0

        async def beat_and_view(self) -> PairingView:
            beats.append(time.monotonic())
            return _view(None)

    class State:
        board = Board()
        me = ALICE

    link = PairingLink(State(), on_view=lambda v: None, on_audit=lambda e: None, poll_s=16.0)  # type: ignore[arg-type]
    task = asyncio.create_task(link._beat_and_watch())
    try:
        await eventually(lambda: len(beats) == 1, "the first beat", timeout=5)
        link.poll_s, State.board.heartbeat_s = 0.1, 0.1
        link.poke()
        await eventually(lambda: len(beats) >= 6, "beats at 0.1 s", timeout=3, detail=lambda: beats)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
