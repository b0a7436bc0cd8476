"""The fleet overview on pinned snapshots (real corpus boots, fixed clock): a row per host with its pool,
state and verdict, drill-in and back, and the snapshot of the overview."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from console.core.alerts import Alert, Severity, TransitionKind, parse_rules
from console.core.audit import AuditEntry
from console.core.snapshot import ConnectionStatus, ConnState, HostSnapshot
from console.sources.alerts import AlertConfig
from console.sources.profile_store import ProfileStore, shipped_profile_dir
from console.sources.session_options import SessionOptions
from console.tui.app import ConsoleApp, HostEntry
from console.tui.fleet import FLEET_TAB, FleetPacer
from console.tui.fleet_rows import Cell, seen_cell
from console.tui.host_entry import PairingOptions
from tests.tui_support import NOW, corpus_events, gpu_sample, plain, snapshot

SIZE = (160, 48)
GIB = 1024.0
HOSTS = ("gpu-a", "gpu-b", "gpu-c", "gpu-d")


def fleet_app(hosts: tuple[str, ...] = HOSTS, target: int | None = 8192) -> ConsoleApp:
    shipped = shipped_profile_dir()
    return ConsoleApp(
        [HostEntry(h) for h in hosts],
        target=target,
        target_source="--target-context" if target else None,
        clock=lambda: NOW,
        connect=False,
        store=ProfileStore([shipped] if shipped else []),
    )


def host_snapshot(host: str, case: str, *, conn: ConnState = ConnState.UP) -> HostSnapshot:
    snap = snapshot(corpus_events(case), gpu_sample([20500.0], 22.4 * GIB, util=12.0))
    reason = "connection refused" if conn is not ConnState.UP else None
    status = ConnectionStatus(host=host, state=conn, since=NOW - 60, reason=reason, retry_in_s=4.0)
    return snap.model_copy(update={"host": host, "connection": status})


async def feed(pilot: Any) -> None:
    app: ConsoleApp = pilot.app
    # case-31: a boot that reached ready with a 15k pool; case-01: Kimi K2.5 cut while capturing graphs.
    app.post_snapshot(host_snapshot("gpu-a", "case-31"))
    app.post_snapshot(host_snapshot("gpu-b", "case-01"))
    app.post_snapshot(host_snapshot("gpu-c", "case-31", conn=ConnState.RETRYING))
    await pilot.pause()
    app.hosts["gpu-b"].alerts = {
        "queue > 16": Alert(
            host="gpu-b",
            rule="queue > 16",
            severity=Severity.WARNING,
            state=TransitionKind.FIRED,
            value=20.0,
            message="queue 20 > 16",
            ts=NOW,
        )
    }
    assert app.fleet is not None
    app.fleet.refresh_rows()
    await pilot.pause()


async def test_four_hosts_open_on_the_overview_with_a_row_each_and_drill_in() -> None:
    app = fleet_app()
    async with app.run_test(size=SIZE) as pilot:
        await feed(pilot)
        fleet = app.fleet
        assert fleet is not None
        assert app.active_dashboard is None  # the overview is on screen, no host's dashboard
        rows = {h: fleet.row_text(h) for h in HOSTS}
        boot_a = app.latest_snapshot("gpu-a")
        assert boot_a is not None
        pool_a = boot_a.state.boots[-1].pool.tokens
        assert pool_a is not None and pool_a >= 8192
        assert rows["gpu-a"]["state"] == "ready"
        assert rows["gpu-a"]["pool"] == "15k / 8.2k"
        assert rows["gpu-b"]["state"] == "capturing CUDA graphs" and rows["gpu-b"]["verdict"] == "not ok"
        assert rows["gpu-a"]["verdict"] == "ok"
        assert rows["gpu-b"]["alert"] == "queue > 16"
        assert rows["gpu-c"]["state"].startswith("unreachable: retrying")
        assert rows["gpu-d"]["state"] == "not connected" and rows["gpu-d"]["pool"] == "—"
        # No host's dashboard is composed before it is shown: the rows come from the controllers.
        assert app.dashboards == {}
        # Enter on the second row opens gpu-b's dashboard, composed now, with its snapshot shown at once.
        fleet.table.focus()
        await pilot.press("down", "enter")
        await pilot.pause()
        assert list(app.dashboards) == ["gpu-b"]
        dash = app.dashboards["gpu-b"]
        assert app.active_dashboard is dash and dash.composed
        assert dash.snap is app.latest_snapshot("gpu-b") and dash.snap is not None
        assert "capturing CUDA graphs" in plain(dash.header.render())
        assert app.fleet_pacer is not None and app.fleet_pacer.on_screen == "gpu-b"
        assert app.looking_at("gpu-b") == "dashboard"
        # `o` comes back to the overview.
        await pilot.press("o")
        await pilot.pause()
        assert app.query_one("#hosts").active == FLEET_TAB  # type: ignore[attr-defined]
        assert app.active_dashboard is None
        assert app.fleet_pacer.on_screen is None
        assert app.looking_at("gpu-a") == "fleet overview"
        # One click on the third row opens gpu-c (the header is the table's first line).
        await pilot.click("#fleet-table", offset=(2, 3))
        await pilot.pause()
        assert app.active_dashboard is app.dashboards["gpu-c"]


async def test_the_on_screen_host_polls_at_its_dashboards_pace_the_others_share_the_budget() -> None:
    hosts = tuple(f"h{i:02d}" for i in range(32))
    app = fleet_app(hosts)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.fleet is not None
        title = str(app.fleet.border_title)
        assert "32 hosts" in title and "GPUs every 4 s, /metrics every 8 s" in title
        entry = app.entries[5]
        assert (entry.session.gpu_interval_s, entry.session.server_interval_s) == (4.0, 8.0)
        app.switch_host("h05")
        await pilot.pause()
        assert (entry.session.gpu_interval_s, entry.session.server_interval_s) == (1.0, 2.0)
        assert entry.pairing == PairingOptions(poll_s=4.0, heartbeat_s=5.0)
        assert app.entries[6].pairing == PairingOptions(poll_s=16.0, heartbeat_s=16.0)


async def test_three_hosts_open_on_the_first_host_with_the_overview_a_tab_away() -> None:
    app = fleet_app(HOSTS[:3])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.active_dashboard is app.dashboards["gpu-a"]
        await pilot.press("o")
        await pilot.pause()
        assert app.active_dashboard is None


async def test_one_host_has_no_overview() -> None:
    app = fleet_app(HOSTS[:1])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.fleet is None and app.fleet_pacer is None
        assert app.active_dashboard is app.dashboards["gpu-a"]


def test_fleet_overview_snapshot(snap_compare) -> None:
    assert snap_compare(fleet_app(), terminal_size=SIZE, run_before=feed)


def test_last_heard_is_fresh_within_the_pace_then_counts_in_five_second_steps() -> None:
    snap = host_snapshot("gpu-a", "case-31")  # its GPU sample is 2 s old at NOW
    assert seen_cell(snap, NOW, 8.0) == Cell("< 8s ago", "ok")
    assert seen_cell(snap, NOW + 10, 8.0) == Cell("10s ago", "warn")  # 12 s: the 10 s step
    assert seen_cell(snap, NOW + 13, 8.0) == Cell("15s ago", "warn")
    assert seen_cell(snap, NOW + 100, 8.0) == Cell("1m42s ago", "critical")
    assert seen_cell(None, NOW) == Cell("—", "muted")


def test_intervals_an_entry_sets_itself_are_left_alone() -> None:
    entries = [HostEntry(f"h{i:02d}") for i in range(32)]
    entries[0].session = SessionOptions(gpu_interval_s=0.5)
    entries[0].pairing = PairingOptions(poll_s=1.0)
    pacer = FleetPacer(entries)
    pacer.show(None)
    assert (entries[0].session.gpu_interval_s, entries[0].session.server_interval_s) == (0.5, 8.0)
    assert entries[0].pairing == PairingOptions(poll_s=1.0, heartbeat_s=16.0)
    pacer.show("h00")
    assert (entries[0].session.gpu_interval_s, entries[0].session.server_interval_s) == (0.5, 2.0)
    assert (entries[1].session.gpu_interval_s, entries[1].session.server_interval_s) == (4.0, 8.0)


async def test_f1_names_the_overview_key_only_where_there_is_an_overview() -> None:
    from console.tui.screens import HelpScreen

    for hosts, listed in ((HOSTS[:2], True), (HOSTS[:1], False)):
        app = fleet_app(hosts)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await pilot.press("f1")
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            assert ("o            the fleet overview" in app.screen.keys) is listed, hosts


async def test_a_host_composed_when_first_shown_has_its_trail_and_alerts_in_the_order_read() -> None:
    # gpu-b is followed on the overview, its dashboard not composed: half its boot is read, then an
    # audit entry from another console, then the rest of the boot and an alert firing (the bell rings
    # for a host off screen). Shown at last, its feed has the entry where it was read, the alert after
    # the rest, the header's badge and the note under the timeline.
    shipped = shipped_profile_dir()
    app = ConsoleApp(
        [HostEntry(h) for h in HOSTS],
        clock=lambda: NOW,
        connect=False,
        store=ProfileStore([shipped] if shipped else []),
        alerts=AlertConfig(rules=parse_rules(["gpu_mem_free_gib < 1"]), bell=True),
    )
    events = corpus_events("case-31")
    half = len(events) // 2
    full = gpu_sample([287.5 * GIB] * 8, 288 * GIB)  # 0.5 GiB free: the rule fires
    entry = AuditEntry(
        ts=datetime.fromtimestamp(NOW, UTC),
        user="bob",
        console_id="another console",
        host="gpu-b",
        action="restart",
        outcome="ok",
        summary="verified",
    )
    async with app.run_test(size=SIZE) as pilot:
        rings: list[str] = []
        app.bell = lambda: rings.append("ring")  # type: ignore[method-assign]
        app.post_snapshot(snapshot(events[:half], None).model_copy(update={"host": "gpu-b"}))
        await pilot.pause()
        app.hosts["gpu-b"]._on_audit([entry])  # as the host's trail follower hands it over
        app.post_snapshot(snapshot(events, full, seq=2).model_copy(update={"host": "gpu-b"}))
        await pilot.pause()
        assert app.dashboards == {} and rings == ["ring"]
        assert app.fleet is not None
        app.fleet.refresh_rows()
        assert app.fleet.row_text("gpu-b")["alert"] == "gpu_mem_free_gib < 1"
        app.switch_host("gpu-b")
        await pilot.pause()
        dash = app.dashboards["gpu-b"]
        lines = dash.feed.visible_lines()
        said = [i for i, line in enumerate(lines) if entry.line() in line]
        alerted = [i for i, line in enumerate(lines) if "ALERT (warning) gpu_mem_free_gib < 1" in line]
        assert len(said) == 1 and alerted == [len(lines) - 1]
        # The positive control of the order: the entry is no first or last line, and as many lines came
        # before it as half the boot shows alone.
        alone = ConsoleApp([HostEntry("gpu-b")], clock=lambda: NOW, connect=False)
        async with alone.run_test(size=SIZE) as solo:
            alone.post_snapshot(snapshot(events[:half], None).model_copy(update={"host": "gpu-b"}))
            await solo.pause()
            before = len(alone.dashboards["gpu-b"].feed.visible_lines())
        assert 0 < said[0] == before < alerted[0] - 1
        assert "ALERT gpu_mem_free_gib < 1" in plain(dash.header.render())
        assert dash.timeline.note is not None and entry.line() in plain(dash.timeline.note)


async def test_the_overviews_render_caches_hold_a_few_generations_not_ten_thousand_cells() -> None:
    """Each cell update starts a new generation of DataTable's render caches; with Textual's sizes (10,000
    cells, 1,000 rows and lines) a 32-host overview kept ~10,000 stale renderings after a minute of its
    "last heard" cells ticking (~15 MB of the fleet bench's 158 MB). Bounded to four of its own generations,
    and the table still shows the latest figures."""
    hosts = tuple(f"gpu-{i:02d}" for i in range(32))
    now = [NOW]
    shipped = shipped_profile_dir()
    app = ConsoleApp(
        [HostEntry(h) for h in hosts],
        target=8192,
        target_source="--target-context",
        clock=lambda: now[0],
        connect=False,
        store=ProfileStore([shipped] if shipped else []),
    )
    async with app.run_test(size=SIZE) as pilot:
        for host in hosts:
            app.post_snapshot(host_snapshot(host, "case-31"))
        await pilot.pause()
        assert app.fleet is not None
        table = app.fleet.table
        for _ in range(45):
            now[0] += 5.0  # "last heard" moves in five-second steps
            app.fleet.refresh_rows()
            await pilot.pause()
        cells = (len(hosts) + 1) * len(table.columns)
        assert len(table._cell_render_cache) <= 4 * cells + 64, len(table._cell_render_cache)
        assert len(table._line_cache) <= 4 * (len(hosts) + 1) + 16, len(table._line_cache)
        # What the table draws (through those caches) is the latest generation.
        drawn = [table.render_line(y).text for y in range(table.size.height)]
        row = next(line for line in drawn if "gpu-00" in line)
        heard = app.fleet.row_text("gpu-00")["seen"]
        assert heard and heard in row, (heard, row)
