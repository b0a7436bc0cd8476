"""The serving panel on the dashboard: pinned snapshots at 160x48 and 100x30 (scrapes written by the twin's
SGLang stand-in from a fixed sequence of observations, so every figure is computed by the session's own
`ServingHistory`), an absent figure said to be absent (never 0), and the live panel on the twin under load."""

from __future__ import annotations

import asyncio
import functools
import io
import time

import pytest

from console.core.metrics import parse_prometheus
from console.core.serving import Scrape, TrendPoint
from console.core.serving_history import ServingHistory
from console.core.snapshot import ConnectionStatus, ConnState, HealthState, HostSnapshot, ServerSample
from console.sources.hosts import load_hosts
from console.sources.session_options import SessionOptions
from console.tui.app import ConsoleApp, HostEntry
from console.tui.serving_panel import ServingPanel, scrape_interval, staleness
from console.tui.themes import palette
from console.twin.host import TwinHost
from console.twin.load import LoadGenerator
from console.twin.scenarios import get_scenario
from console.twin.server_engine import Engine
from console.twin.server_logs import LogWriter
from tests.support.twins import module_twin
from tests.test_serving_core import engine_config
from tests.tui_support import NOW, corpus_events, gpu_sample, make_app, snapshot

GIB = 1024.0
WINDOW_S = 300.0
INTERVAL_S = 2.0


def _engine() -> Engine:
    """The twin engine of the serving tests, not started: its /metrics text is read at pinned moments."""
    return Engine(get_scenario(), engine_config(), LogWriter(io.StringIO()))


@functools.cache
def pinned_scrapes(*, drop: tuple[str, ...] = ()) -> tuple[Scrape, ...]:
    """A window of scrapes every 2 s: the engine's histograms and counters fed a fixed, slowly
    swelling load (a busier minute in the middle), its /metrics text read after each interval. Lines of
    the metrics named in `drop` are left out (an older server that does not export them).

    Made once per process: the scrapes are frozen, and parsing 151 texts with prometheus_client's parser
    for each test that draws the panel was 28 of this module's 47 s under a profiler."""
    eng = _engine()
    # 15 requests queued, 12 of them admitted: the gauges of a loaded scheduler.
    for i in range(15):
        eng.submit([(i * 7919 + j) % 150_000 + 1 for j in range(200)], 64)
    for _ in range(12):
        eng.running.append(eng.waiting.popleft())
    scrapes = []
    steps = int(WINDOW_S / INTERVAL_S)
    for step in range(steps + 1):
        busy = 1.0 + (1.5 if steps // 3 <= step < steps // 2 else 0.0) + 0.3 * (step % 5) / 4
        for k in range(40):
            eng.itl.observe(0.018 * busy + 0.0004 * (k % 9))
        for k in range(2):
            eng.ttft.observe(0.25 * busy + 0.05 * k)
            eng.queue.observe(0.004 * busy * (k + 1))
            eng.e2e.observe(3.0 * busy + 0.5 * k)
        eng.generation_tokens_total += int(40 * 12 / busy)
        eng.prompt_tokens_total += 2 * 1800
        eng.cached_tokens_total += 2 * 1100
        eng.num_requests_total += 2
        text = "\n".join(
            line for line in eng.metrics_text().splitlines() if not any(name in line for name in drop)
        )
        scrapes.append(Scrape(ts=NOW - WINDOW_S + step * INTERVAL_S, metrics=parse_prometheus(text)))
    return tuple(scrapes)


def serving_snapshot(*, version: str = "0.5.12.post1", drop: tuple[str, ...] = ()) -> HostSnapshot:
    history = ServingHistory(window_s=WINDOW_S, max_scrapes=151)
    for s in pinned_scrapes(drop=drop):
        history.add(s)
    snap = snapshot(corpus_events("case-31"), gpu_sample([60.0 * GIB] * 8, 80 * GIB, util=87.0))
    return snap.model_copy(
        update={
            "serving": history.figures(version=version, max_running=64),
            "serving_trend": tuple(history.trend),
        }
    )


def _show(snap: HostSnapshot):
    async def run_before(pilot) -> None:
        pilot.app.post_snapshot(snap)
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("theme", ["dark", "light", "high-contrast"])
def test_dashboard_with_the_serving_panel(snap_compare, theme: str) -> None:
    assert snap_compare(make_app(theme=theme), terminal_size=(160, 48), run_before=_show(serving_snapshot()))


@pytest.mark.parametrize("theme", ["dark", "light", "high-contrast"])
def test_dashboard_with_the_serving_panel_at_100x30(snap_compare, theme: str) -> None:
    assert snap_compare(make_app(theme=theme), terminal_size=(100, 30), run_before=_show(serving_snapshot()))


@pytest.mark.parametrize("theme", ["dark", "light", "high-contrast"])
def test_dashboard_with_the_serving_panel_at_80x24(snap_compare, theme: str) -> None:
    """The side column's panels keep their top rule only, so the restart panel is in view (issue 34);
    tests/test_tui_key_figures.py asserts each panel's key figure in the text at each size and theme."""
    assert snap_compare(make_app(theme=theme), terminal_size=(80, 24), run_before=_show(serving_snapshot()))


def _panel_text(app: ConsoleApp, host: str = "gpu1") -> str:
    panel = app.dashboards[host].serving
    lines = (line.text.strip().strip("│").strip() for line in panel.render_lines(panel.region.reset_offset))
    return "\n".join(lines)


async def test_a_figure_the_server_does_not_export_is_absent_never_zero() -> None:
    # SGLang 0.4.6 exports no queue-time histogram (0.5.5 on) and no max_total_num_tokens (0.5.7 on).
    snap = serving_snapshot(
        version="0.4.6.post5",
        drop=("sglang:queue_time_seconds", "sglang:kv_used_tokens", "sglang:max_total_num_tokens"),
    )
    assert snap.serving is not None and snap.serving.queue_time is None and snap.serving.kv_pool is None
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        app.post_snapshot(snap)
        await pilot.pause()
        panel: ServingPanel = app.dashboards["gpu1"].serving
        assert panel.display
        rows = {line.split()[0]: line for line in _panel_text(app).splitlines() if line.split()}
        assert "absent: SGLang < 0.5.5" in rows["queue"]
        assert "0ms" not in rows["queue"] and "0.00" not in rows["queue"]
        assert "ms" in rows["ITL"]  # the figures it does export are drawn
        kv = next(line for line in _panel_text(app).splitlines() if "KV used" in line)
        # num_used_tokens (0.4.6) stands in for kv_used_tokens; the pool is said to be absent, not 0
        assert "absent: SGLang < 0.5.7" in kv and "/ 0" not in kv


twin = module_twin("serving-twin", time_scale=0.002)


@pytest.mark.timeout(180)
async def test_the_panel_shows_live_itl_under_load(twin: TwinHost) -> None:
    config = load_hosts(twin.hosts_toml).get(twin.name)
    assert config is not None
    entry = HostEntry(
        twin.name, config=config, session=SessionOptions(gpu_interval_s=1.0, server_interval_s=0.5)
    )
    app = ConsoleApp([entry])
    # what `k26-console twin --load 4` runs beside the twin
    load = asyncio.ensure_future(LoadGenerator(twin.sglang_url, 4.0).run())
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            panel: ServingPanel = app.dashboards[twin.name].serving
            deadline = time.monotonic() + 90
            while True:
                snap = panel.snap
                itl = snap.serving.itl if snap is not None and snap.serving is not None else None
                if itl is not None and itl.p50 is not None and panel.display:
                    break
                assert time.monotonic() < deadline, "no ITL p50 on the serving panel within 90 s"
                await pilot.pause(0.2)

            def itl_rows() -> list[str]:
                return [line for line in _panel_text(app, twin.name).splitlines() if line.startswith("ITL")]

            # The figures are in the panel's snapshot: wait for its repaint to draw them.
            while not any("ms" in row for row in itl_rows()):
                assert time.monotonic() < deadline, f"the ITL row never drew its figures: {itl_rows()}"
                await pilot.pause(0.1)
            itl_row = itl_rows()[0]
            assert "absent" not in itl_row and "ms" in itl_row
            assert "running" in _panel_text(app, twin.name)
    finally:
        load.cancel()
        with pytest.raises(asyncio.CancelledError):
            await load


@pytest.mark.parametrize("size", [(80, 24), (100, 30), (160, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_with_the_serving_panel_every_gpu_the_gauge_and_five_event_rows_stay(
    size: tuple[int, int],
) -> None:
    from tests.test_tui_small_terminals import on_screen, screen_text

    served = serving_snapshot()
    busy = snapshot(corpus_events("case-01"), gpu_sample([240.0 * GIB] * 8, 288 * GIB))
    app = make_app()
    async with app.run_test(size=size) as pilot:
        app.post_snapshot(
            busy.model_copy(update={"serving": served.serving, "serving_trend": served.serving_trend})
        )
        await pilot.pause()
        await pilot.pause()
        dash = app.dashboards["gpu1"]
        for i in range(8):
            assert on_screen(app, f"GPU{i} "), (i, "\n".join(screen_text(app)))
        assert on_screen(app, "pool 2,454,421")
        assert dash.feed.log_widget.scrollable_content_region.height >= 5
        if size != (80, 24):  # in view at once; at 80x24 the side column scrolls to it
            assert on_screen(app, "22.9ms"), "\n".join(screen_text(app))
        dash.serving.focus()
        await pilot.pause()
        assert on_screen(app, "22.9ms") and on_screen(app, "queued 3"), "\n".join(screen_text(app))


def test_figures_are_stale_after_three_scrape_intervals_or_a_link_down() -> None:
    snap = serving_snapshot()
    assert snap.serving is not None and snap.serving.as_of == NOW  # the newest scrape of the window
    assert scrape_interval(snap.serving_trend) == INTERVAL_S
    # 2 s scrapes: three intervals are 6 s, under the 10 s floor (a scrape that times out takes 4 s)
    assert staleness(snap, NOW + 10.0) is None
    assert staleness(snap, NOW + 11.0) == "⚠ stale 11s: the last /metrics reading"
    # a 5 s interval: stale after 15 s
    slow = snap.model_copy(
        update={"serving_trend": tuple(TrendPoint(ts=NOW - 5.0 * i) for i in range(10, -1, -1))}
    )
    assert staleness(slow, NOW + 14.0) is None and staleness(slow, NOW + 16.0) is not None
    # the link or the server down: the figures are the last good ones at once
    down = snap.model_copy(
        update={"connection": ConnectionStatus(host="gpu1", state=ConnState.RETRYING, since=NOW)}
    )
    assert staleness(down, NOW + 1.0) == "⚠ stale 1s: the last /metrics reading, link retrying"
    dead = snap.model_copy(update={"server": ServerSample(health=HealthState.DOWN, ts=NOW + 2.0)})
    assert staleness(dead, NOW + 3.0) == "⚠ stale 3s: the last /metrics reading, server down"


async def test_the_panel_marks_old_figures_stale_and_faint() -> None:
    clock = [NOW]
    app = make_app(clock=lambda: clock[0])
    async with app.run_test(size=(160, 48)) as pilot:
        app.post_snapshot(serving_snapshot())
        await pilot.pause()
        panel: ServingPanel = app.dashboards["gpu1"].serving
        pal = palette()

        def colours() -> set[str]:
            strips = panel.render_lines(panel.region.reset_offset)
            return {
                seg.style.color.triplet.hex.upper()
                for strip in strips
                for seg in strip
                if seg.style is not None
                and seg.style.color is not None
                and seg.style.color.triplet is not None
            }

        assert "stale" not in _panel_text(app)
        assert pal.colour("info") in colours()  # the sparklines, live
        # No snapshot comes (the session is stuck): the panel's own clock ages the figures.
        clock[0] = NOW + 42.0
        deadline = time.monotonic() + 10.0
        while "stale" not in _panel_text(app) and time.monotonic() < deadline:
            await pilot.pause(0.1)
        text = _panel_text(app)
        assert text.splitlines()[1] == "⚠ stale 42s: the last /metrics reading"  # under the border
        assert "TTFT" in text and "320ms" in text  # the last figures stay, marked
        drawn = colours()
        assert (
            pal.colour("info") not in drawn and pal.colour("faint") in drawn and pal.colour("warn") in drawn
        )
        # A fresh scrape: live again.
        fresh = serving_snapshot()
        assert fresh.serving is not None
        app.post_snapshot(
            fresh.model_copy(update={"serving": fresh.serving.model_copy(update={"as_of": NOW + 41.0})})
        )
        await pilot.pause()
        assert "stale" not in _panel_text(app)


def test_the_header_says_how_much_of_the_window_the_figures_cover() -> None:
    """`window p50 p90 p99 6 s: p50 per scrape` read the covered time as a fourth figure (issue 34)."""
    from console.core.serving import ServingFigures
    from console.tui.serving_panel import serving_body
    from tests.tui_support import plain

    fresh = plain(serving_body(ServingFigures(window_s=300.0, covered_s=6.0), (), 60, compact=False), 70)
    assert fresh.splitlines()[0].split() == [
        "6",
        "s",
        "p50",
        "p90",
        "p99",
        "(of",
        "5",
        "min)",
        "·",
        "p50",
        "trend",
    ]
    full = plain(serving_body(ServingFigures(window_s=300.0, covered_s=299.0), (), 60, compact=False), 70)
    assert full.splitlines()[0].split() == ["5", "min", "p50", "p90", "p99", "·", "p50", "trend"]
