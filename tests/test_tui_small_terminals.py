"""Small terminals: at 80x24 (the classic default) and 100x30 every GPU is on screen, the KV gauge and at
least five event rows too, the restart panel scrolls to its end, and the help and the profile editor stay
usable; 160x48 keeps its chart. Real corpus events, a real Textual app."""

from __future__ import annotations

import pytest

from console.tui.app import ConsoleApp
from console.tui.profiles import ProfilesScreen
from console.tui.screens import help_keys
from tests.tui_support import corpus_events, gpu_sample, make_app, snapshot

GIB = 1024.0
SIZES = [(80, 24), (100, 30), (160, 48)]


def screen_text(app: ConsoleApp) -> list[str]:
    """What the terminal shows, row by row."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def on_screen(app: ConsoleApp, needle: str) -> bool:
    return any(needle in row for row in screen_text(app))


async def busy_dashboard(app: ConsoleApp, pilot) -> None:
    """Eight GPUs, a boot that failed with two pinned errors, the pairing bar and a failed apply's banner:
    everything that takes rows at once."""
    app.post_snapshot(snapshot(corpus_events("case-01"), gpu_sample([240.0 * GIB] * 8, 288 * GIB)))
    await pilot.pause()
    dash = app.dashboards["gpu1"]
    dash.show_pairing()
    dash.begin_track("apply ctx-200k")
    dash.finish_track(False, "the server failed to start", (), can_roll_back=True)
    await pilot.pause()
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_every_gpu_the_gauge_and_five_event_rows_are_on_screen(size: tuple[int, int]) -> None:
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await busy_dashboard(app, pilot)
        dash = app.dashboards["gpu1"]
        for i in range(8):
            assert on_screen(app, f"GPU{i} "), (i, "\n".join(screen_text(app)))
        assert on_screen(app, "pool 2,454,421") and on_screen(app, "R: roll back")
        assert on_screen(app, "< 5s ago")  # how fresh the figures are
        log = dash.feed.log_widget
        assert log.scrollable_content_region.height >= 5
        for line in dash.feed.visible_lines()[-5:]:
            assert on_screen(app, line.split("  ")[-1][:30].strip()), line
        # The restart panel shows more than its first line, and scrolls to its last.
        assert app.screen.find_widget(dash.timeline).visible_region.height >= 5
        dash.timeline.focus()
        await pilot.press("end")
        await pilot.pause()
        assert on_screen(app, "R rolls back to the"), "\n".join(screen_text(app))
        # The chart when it fits, else nothing lost: it says so or shows its latest figure.
        assert dash.throughput.display == (size != (80, 24))


async def test_the_help_scrolls_to_its_last_line_on_a_small_terminal() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await busy_dashboard(app, pilot)
        await pilot.press("f1")
        await pilot.pause()
        last = help_keys(False).rstrip().splitlines()[-1].strip()[:40]  # the line wraps at 80
        assert not on_screen(app, last)
        await pilot.press("end")
        await pilot.pause()
        assert on_screen(app, last) and on_screen(app, "Esc closes")


@pytest.mark.parametrize("size", SIZES[:2], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_profile_editor_keeps_room_to_edit(size: tuple[int, int]) -> None:
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await busy_dashboard(app, pilot)
        await pilot.press("p")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ProfilesScreen)
        editor = screen.query_one("#profile-editor")
        assert editor.size.width >= 30, editor.size
        for pane in ("#profile-list", "#profile-side"):
            assert screen.query_one(pane).outer_size.width >= 14, pane
        assert on_screen(app, "checks") and on_screen(app, "profiles")


async def test_without_room_for_the_chart_its_latest_figure_goes_under_the_gpu_bars() -> None:
    from console.core.parser import parse_lines
    from console.core.probe_history import throughput_points
    from tests.tui_support import CORPUS, NOW

    points = throughput_points(parse_lines((CORPUS / "case-26.log").read_text().splitlines()))
    shift = NOW - 3 - points[-1][0]  # the corpus's decode lines, as if logged just now
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await busy_dashboard(app, pilot)
        dash = app.dashboards["gpu1"]
        assert not dash.throughput.display
        dash.throughput.set_samples([(t + shift, v) for t, v in points])
        app.post_snapshot(snapshot(corpus_events("case-01"), gpu_sample([240.0 * GIB] * 8, 288 * GIB), seq=2))
        await pilot.pause()
        assert on_screen(app, f"gen tok/s now {points[-1][1]:.2f}"), "\n".join(screen_text(app))


async def test_the_first_gpu_sample_after_the_journal_refits_the_panels() -> None:
    """The journal comes first, the GPU sample a second later: the chart's room is measured again (it
    stayed, cut in half, under the eight bars at 80x24)."""
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        dash = app.dashboards["gpu1"]
        app.post_snapshot(snapshot(corpus_events("case-01"), None))
        await pilot.pause()
        assert dash.throughput.display  # room for it beside no GPU yet
        app.post_snapshot(snapshot(corpus_events("case-01"), gpu_sample([240.0 * GIB] * 8, 288 * GIB), seq=2))
        await pilot.pause()
        await pilot.pause()
        assert not dash.throughput.display
        for i in range(8):
            assert on_screen(app, f"GPU{i} "), i


async def test_at_160x48_the_chart_fills_the_rows_under_the_gpu_bars() -> None:
    """The chart was 9 rows (2 of them plot) over 9 blank rows at 160x48 (issue 34): it takes what the
    bars leave of the top."""
    from console.core.serving import ServingFigures

    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await busy_dashboard(app, pilot)
        # ...and the serving panel of a live session: the side column is the taller one
        snap = snapshot(corpus_events("case-01"), gpu_sample([240.0 * GIB] * 8, 288 * GIB), seq=2)
        app.post_snapshot(snap.model_copy(update={"serving": ServingFigures(window_s=300.0)}))
        await pilot.pause()
        dash = app.dashboards["gpu1"]
        main = dash.query_one("#main")
        await pilot.pause()
        assert dash.throughput.display
        used = dash.gpus.outer_size.height + dash.throughput.outer_size.height
        assert used == main.outer_size.height, (used, main.outer_size.height)
        assert dash.throughput.outer_size.height > 12


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_a_change_in_flight_shows_every_boot_phase(size: tuple[int, int]) -> None:
    """The restart panel cut off KV pool, CUDA graphs and ready (8 of 12 phases shown at 160x48, 2 at
    100x30): the controller's quick steps share a line, and the side column scrolls to the change."""
    app = make_app()
    async with app.run_test(size=size) as pilot:
        app.post_snapshot(snapshot(corpus_events("case-01"), gpu_sample([240.0 * GIB] * 8, 288 * GIB)))
        await pilot.pause()
        dash = app.dashboards["gpu1"]
        dash.begin_track("apply ctx-200k")
        done = {"validate": 0.1, "diff": 0.0, "write_dropin": 0.0, "daemon_reload": 0.2, "restart": 1.0}
        done |= {"stopping": 3.0, "launching": 20.0, "loading_weights": 200.0}
        dash.progress("kv_pool", "allocating the KV pool", 230.0, done, 60.0)
        for _ in range(3):
            await pilot.pause()
        phases = ("validate … restart", "stopping", "loading weights", "KV pool", "CUDA graphs", "ready")
        for phase in (*phases, "verify, record"):
            assert on_screen(app, phase), (phase, "\n".join(screen_text(app)))


async def test_a_plain_restart_lists_only_the_steps_it_takes() -> None:
    """A plain restart writes no drop-in and reloads nothing: its timeline listed "write drop-in"."""
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        app.post_snapshot(snapshot(corpus_events("case-01"), gpu_sample([240.0 * GIB] * 8, 288 * GIB)))
        await pilot.pause()
        dash = app.dashboards["gpu1"]
        dash.begin_track("restart")
        steps = {"validate": 0.1, "diff": 0.0, "write_dropin": 0.0, "daemon_reload": 0.0, "restart": 1.0}
        dash.progress("stopping", None, 2.0, steps, None)
        await pilot.pause()
        await pilot.pause()
        assert on_screen(app, "restart running") and on_screen(app, "✔ restart")
        assert not on_screen(app, "write drop-in") and not on_screen(app, "daemon-reload")
