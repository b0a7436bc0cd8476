"""Snapshot tests: the dashboard mid-restart and ready, and the help screen; inputs and clock pinned."""

from __future__ import annotations

from console.core.events import KvPoolAllocated
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
