"""The fleet overview on three twins over real SSH on loopback: a row per host with its pool and state
from the live sessions, drill-in to a host's dashboard and back, and a host whose SSH goes away shown
as unreachable in its row."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from console.sources.hosts import load_hosts
from console.sources.profile_store import ProfileStore, shipped_profile_dir
from console.tui.app import ConsoleApp, HostEntry
from console.tui.fleet import FLEET_TAB
from console.twin.host import TwinHost
from tests.support.waiting import eventually

TIME_SCALE = 0.004
SIZE = (160, 48)
NAMES = ("fleet-a", "fleet-b", "fleet-c")


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[TwinHost]]:
    root = tmp_path_factory.mktemp("tui-fleet-twins")
    started: list[TwinHost] = []
    try:
        for i, name in enumerate(NAMES):
            twin = TwinHost(
                root / name,
                name=name,
                time_scale=TIME_SCALE,
                ssh_host=f"127.0.0.{21 + i}",
            )
            twin.start_sync()
            started.append(twin)
        yield started
    finally:
        for twin in started:
            twin.stop_sync()


def console(twins: list[TwinHost]) -> ConsoleApp:
    entries = []
    for twin in twins:
        config = load_hosts(twin.hosts_toml).get(twin.name)
        assert config is not None
        entries.append(HostEntry(twin.name, config=config, simulated=True))
    shipped = shipped_profile_dir()
    return ConsoleApp(
        entries,
        read_only=True,
        target=200_000,
        target_source="--target-context",
        store=ProfileStore([shipped] if shipped else []),
    )


def rows(app: ConsoleApp) -> dict[str, dict[str, str]]:
    assert app.fleet is not None
    app.fleet.refresh_rows()
    return {name: app.fleet.row_text(name) for name in NAMES}


async def test_three_twins_in_the_overview_drill_in_and_one_cut_off(twins: list[TwinHost]) -> None:
    app = console(twins)
    async with app.run_test(size=SIZE) as pilot:
        # Three hosts: the console opens on the first one, the overview one key away.
        assert app.active_dashboard is app.dashboards["fleet-a"]
        await pilot.press("o")
        await eventually(lambda: app.active_dashboard is None, "the overview", pilot=pilot, timeout=10)

        # The twins run the incident's first flags: a 101,134-token pool, short of the 200k target.
        def all_ready() -> bool:
            now = rows(app)
            return all(r["state"] == "ready" and r["pool"] == "101k / 200k" for r in now.values())

        await eventually(all_ready, "every host ready with its pool", pilot=pilot, timeout=60)
        now = rows(app)
        for name in NAMES:
            assert now[name]["verdict"] == "not ok"  # ready, but the pool is short of the target
        await eventually(
            lambda: all(r["lock"] == "free · 1" for r in rows(app).values()),
            "presence read",
            pilot=pilot,
            timeout=60,
        )

        # Enter on the second row: fleet-b's dashboard, showing its own pool; `o` returns.
        assert app.fleet is not None
        app.fleet.table.focus()
        app.fleet.table.move_cursor(row=1)
        await pilot.press("enter")
        await eventually(
            lambda: app.active_dashboard is app.dashboards["fleet-b"],
            "fleet-b's dashboard",
            pilot=pilot,
            timeout=60,
        )
        dash = app.dashboards["fleet-b"]
        await eventually(lambda: dash.snap is not None, "fleet-b's snapshot", pilot=pilot, timeout=60)
        assert dash.snap is not None and dash.snap.host == "fleet-b"
        await pilot.press("o")
        await eventually(
            lambda: app.query_one("#hosts").active == FLEET_TAB,
            "back on the overview",
            pilot=pilot,
            timeout=60,
        )

        # fleet-c's SSH goes away (its host runs on): its row says unreachable, the others stay ready.
        twins[2].cut_ssh()
        try:
            await eventually(
                lambda: rows(app)["fleet-c"]["state"].startswith("unreachable"),
                "fleet-c unreachable",
                pilot=pilot,
            )
            now = rows(app)
            assert now["fleet-a"]["state"] == "ready" and now["fleet-b"]["state"] == "ready"
        finally:
            twins[2].restore_ssh()
        await eventually(
            lambda: rows(app)["fleet-c"]["state"] == "ready", "fleet-c back", pilot=pilot, timeout=60
        )
        await app.action_quit()
