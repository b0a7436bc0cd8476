"""Snapshot tests: the dashboard mid-restart and ready, the help screens, and the profiles screen with a
what-if that does not fit; inputs, profiles and clock pinned."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.core.events import KvPoolAllocated
from console.sources.profile_store import ProfileStore, shipped_profile_dir
from tests.test_tui_profiles import K25, RUNNING
from tests.tui_support import corpus_events, gpu_sample, make_app, snapshot

SIZE = (160, 48)
GIB = 1024.0


def _feed(events, gpus):
    async def run_before(pilot) -> None:
        pilot.app.post_snapshot(snapshot(events, gpus))
        await pilot.pause()

    return run_before


def test_dashboard_mid_restart(snap_compare) -> None:
    events = corpus_events("case-01")
    # Cut the Kimi K2.5 boot right after its first KV pool line: weights loaded, pool being allocated.
    cut = next(i for i, e in enumerate(events) if isinstance(e, KvPoolAllocated)) + 1
    gpus = gpu_sample([240.0 * GIB] * 8, 288 * GIB)
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=_feed(events[:cut], gpus))


def test_dashboard_ready(snap_compare) -> None:
    events = corpus_events("case-31")
    gpus = gpu_sample([20500.0], 22.4 * GIB, util=12.0)
    assert snap_compare(make_app(target=32_768), terminal_size=SIZE, run_before=_feed(events, gpus))


def test_help_screen(snap_compare) -> None:
    async def run_before(pilot) -> None:
        pilot.app.dashboards["gpu1"].kv.focus()
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(make_app(read_only=True), terminal_size=SIZE, run_before=run_before)


def _profiles_app(tmp_path: Path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "k25-3m.toml").write_text(K25)
    store = ProfileStore([user, shipped_profile_dir()])
    app = make_app(store=store, profile="k25-3m")
    app.hosts["gpu1"].running_argv = list(RUNNING)
    return app


async def _open_profiles(pilot) -> None:
    # Kimi K2.5 on 8x MI355X at f=0.826 (case-01): 3M tokens at f=0.83 does not fit.
    pilot.app.post_snapshot(snapshot(corpus_events("case-01"), None))
    await pilot.pause()
    await pilot.press("p")
    await pilot.pause()


def test_profiles_screen_what_if_does_not_fit(snap_compare, tmp_path) -> None:
    assert snap_compare(_profiles_app(tmp_path), terminal_size=SIZE, run_before=_open_profiles)


def test_profiles_help_screen(snap_compare, tmp_path) -> None:
    async def run_before(pilot) -> None:
        await _open_profiles(pilot)
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(_profiles_app(tmp_path), terminal_size=SIZE, run_before=run_before)


def _busy(events, gpus):
    """The snapshot, the pairing bar and a failed apply's banner: what takes rows at once."""

    async def run_before(pilot) -> None:
        pilot.app.post_snapshot(snapshot(events, gpus))
        await pilot.pause()
        dash = pilot.app.dashboards["gpu1"]
        dash.show_pairing()
        dash.begin_track("apply ctx-200k")
        dash.finish_track(False, "the server failed to start", (), can_roll_back=True)
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("size", [(80, 24), (100, 30)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_dashboard_on_a_small_terminal(snap_compare, size) -> None:
    gpus = gpu_sample([240.0 * GIB] * 8, 288 * GIB)
    assert snap_compare(make_app(), terminal_size=size, run_before=_busy(corpus_events("case-01"), gpus))


def test_profiles_screen_at_80x24(snap_compare, tmp_path) -> None:
    assert snap_compare(_profiles_app(tmp_path), terminal_size=(80, 24), run_before=_open_profiles)
