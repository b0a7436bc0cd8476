"""The dashboard fed recorded corpus events and pinned GPU samples (no host, no clock)."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.style import Style
from rich.text import Text

from console.core.events import Unit
from console.core.state import HostState
from console.tui.bars import stacked_bar
from console.tui.messages import RestartRequested
from console.tui.themes import palette
from console.tui.view import gpu_rows, kv_gauge, restart_timeline
from tests.tui_support import NOW, corpus_events, gpu_sample, make_app, snapshot
from tests.tui_support import plain as plain_text

GIB = 1024.0


def plain(renderable: object) -> str:
    console = Console(width=150, file=io.StringIO(), record=True)
    console.print(renderable)
    return console.export_text()


@pytest.fixture(scope="module")
def kimi_events():
    # Kimi K2.5 on 8x MI355X: weights 73.58 GiB and a 160.63 GiB KV pool per rank, then a traceback.
    return corpus_events("case-01")


def test_stacked_bar_eighths() -> None:
    bar = stacked_bar([(1.0, "red"), (1.0, "blue")], 4.0, 2)
    # 16 eighths: red 0-3, blue 4-7 → cell 0 is ▌ red on blue; cell 1 is free.
    assert bar.plain == "▌ "
    assert bar.spans[0].style.color.name == "red" and bar.spans[0].style.bgcolor.name == "blue"
    assert stacked_bar([(3.0, "red")], 8.0, 1).plain == "▍"
    assert stacked_bar([], 8.0, 3).plain == "   "


def test_gpu_split_from_journal(kimi_events) -> None:
    used = [250.0 * GIB] * 8
    snap = snapshot(kimi_events, gpu_sample(used, 288 * GIB))
    rows = gpu_rows(snap)
    assert len(rows) == 8
    parts = dict(rows[0].parts)
    assert parts["weights"] == pytest.approx(73.58)
    assert parts["kv"] == pytest.approx(160.63)
    assert parts["graphs"] == 0.0
    assert parts["other"] == pytest.approx(250 - 73.58 - 160.63)
    assert rows[0].free_gib == pytest.approx(38.0)


def test_gpu_degrades_to_used_total() -> None:
    snap = snapshot(corpus_events("case-26"), gpu_sample([1000.0, 2000.0], 8192.0))
    rows = gpu_rows(snap)
    assert [r.detailed for r in rows] == [False, False]
    assert rows[1].used_gib == pytest.approx(2000 / GIB)


def test_kv_gauge_against_target_and_context() -> None:
    events = corpus_events("case-31")  # Qwen3-0.6B: pool 15387, context 40960, 0.00 GB left at ready
    g = kv_gauge(snapshot(events, None), target=32_768, target_source="profile ctx-32k")
    assert g.pool_tokens == 15387
    assert g.context_length == 40960
    assert g.level == "critical"
    assert any("target" in r for r in g.reasons) and any("--context-length" in r for r in g.reasons)


def test_timeline_phases_and_eta() -> None:
    events = corpus_events("case-31")
    tl = restart_timeline(snapshot(events, None).state, NOW)
    assert tl is not None and tl.outcome == "ready"
    by = {s.label: s for s in tl.steps}
    assert by["loading weights"].seconds == pytest.approx(51.0)  # 16:13:42 → 16:14:33
    # The machine has no phase between the capture and "fired up" (warm-up): 16:14:33 → 16:15:37.
    assert by["CUDA graphs"].seconds == pytest.approx(64.0)
    assert tl.elapsed == pytest.approx(122.0)


async def test_dashboard_shows_numbers(kimi_events) -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        app.post_snapshot(snapshot(kimi_events, gpu_sample([250.0 * GIB] * 8, 288 * GIB)))
        await pilot.pause()
        dash = app.dashboards["gpu1"]
        gpus = plain(dash.gpus.render())
        assert "GPU7" in gpus and "250.0/288.0 GiB" in gpus and "KV pool" in gpus
        kv = plain(dash.kv.render())
        assert "2,454,421" in kv and "200,000 (--target-context)" in kv
        # Two errors of this boot are pinned until acknowledged.
        assert [e.category for e in dash.feed.open_errors] == ["scheduler_exception", "sigquit"]
        assert dash.feed.query_one("#pins").display
        await pilot.press("a")
        assert dash.feed.open_errors == []
        assert not dash.feed.query_one("#pins").display


async def test_filter_regex_and_invert(kimi_events) -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        app.post_snapshot(snapshot(kimi_events, None))
        await pilot.pause()
        feed = app.dashboards["gpu1"].feed
        total = len(feed.visible_lines())
        await pilot.press("slash")
        await pilot.press(*"kv_pool")
        await pilot.press("enter")
        lines = feed.visible_lines()
        assert len(lines) == 8 and all("kv_pool_allocated" in line for line in lines)
        assert feed.set_filter("!kv_pool")
        assert len(feed.visible_lines()) == total - 8
        assert not feed.set_filter("([")  # a broken regex keeps the previous filter
        assert len(feed.visible_lines()) == total - 8


async def test_new_boot_folds_the_previous_one(kimi_events) -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        app.post_snapshot(snapshot(kimi_events, None))
        await pilot.pause()
        restart = [
            Unit(state="stopping", message="Stopping sglang.service", ts="2026-02-20T10:00:00", pid=1),
            Unit(state="stopped", message="Stopped sglang.service", ts="2026-02-20T10:00:05", pid=1),
            Unit(state="starting", message="Starting sglang.service", ts="2026-02-20T10:00:06", pid=1),
        ]
        events = [*kimi_events, *restart]
        app.post_snapshot(snapshot(events, None, seq=2))
        await pilot.pause()
        feed = app.dashboards["gpu1"].feed
        assert feed.open_errors == []  # errors of the earlier boot are not this boot's
        assert all("unit" in line for line in feed.visible_lines())
        assert "1 earlier boot folded" in plain(feed.query_one("#folded").render())


async def test_read_only_refuses_restart() -> None:
    app = make_app(read_only=True)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("r")
        await pilot.pause()
        assert len(app.screen_stack) == 1  # no confirmation opened
        app.post_message(RestartRequested("gpu1"))  # as the palette would ask
        await pilot.pause()
        assert len(app.screen_stack) == 1
        assert "r" not in {k for k, b in app.active_bindings.items() if b.enabled}


async def test_restart_asks_first() -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("r")
        await pilot.pause()
        assert type(app.screen).__name__ == "ConfirmScreen"
        await pilot.press("n")
        await pilot.pause()
        assert len(app.screen_stack) == 1


async def test_help_follows_focus() -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        app.dashboards["gpu1"].gpus.focus()
        await pilot.press("f1")
        await pilot.pause()
        assert type(app.screen).__name__ == "HelpScreen"
        assert "GPU memory" in app.screen.panel_help
        await pilot.press("escape")
        await pilot.press("q")
    assert app.return_code == 0


def _reference_bar(
    parts: list[tuple[float, str]], total: float, width: int, empty: str = "grey19"
) -> list[tuple[str, str | None, str | None]]:
    """The bar cell by cell, eighth by eighth: the definition `stacked_bar` must draw."""
    cells = width * 8
    edges, acc = [], 0.0
    for value, colour in parts:
        acc += max(0.0, value)
        edges.append((min(cells, round(acc / total * cells)), colour))
    out = []
    for cell in range(width):
        covering = [
            next((c for e, c in edges if eighth < e), empty) for eighth in range(cell * 8, cell * 8 + 8)
        ]
        n = next((i for i in range(8) if covering[i] != covering[0]), 8)
        if n == 8:
            out.append((" ", None, empty) if covering[0] == empty else ("█", covering[0], empty))
        else:
            out.append((" ▏▎▍▌▋▊▉█"[n], covering[0], covering[n]))
    return out


def _cells(bar: Text) -> list[tuple[str, str | None, str | None]]:
    out = []
    for span_text, style in ((bar.plain[s.start : s.end], s.style) for s in bar.spans):
        assert isinstance(style, Style)
        colour = style.color.name if style.color else None
        bg = style.bgcolor.name if style.bgcolor else None
        out.extend((ch, colour, bg) for ch in span_text)
    return out


@given(
    st.lists(st.tuples(st.floats(0, 100), st.sampled_from(["red", "blue", "green", "yellow"])), max_size=6),
    st.floats(0.5, 400),
    st.integers(1, 60),
)
@settings(max_examples=300, deadline=None)
def test_stacked_bar_matches_its_definition(parts: list[tuple[float, str]], total: float, width: int) -> None:
    bar = stacked_bar(parts, total, width, empty="grey19")
    assert len(bar.plain) == width
    assert _cells(bar) == _reference_bar(parts, total, width)


def test_kv_gauge_of_a_failed_boot_is_not_ok() -> None:
    """A pool that fits but belonged to a server that has since failed is not "ok"."""
    from console.core.parser import parse_lines

    events = corpus_events("case-31")  # pool 15,387 tokens, ready
    ok = kv_gauge(snapshot(events, None), target=None, min_headroom_gib=0.0)
    assert ok.level == "warn" and ok.pool_tokens and not any("failed" in r for r in ok.reasons), ok
    failed = parse_lines(
        ["Nov 30 10:00:00 gpu1 systemd[1]: sglang.service: Failed with result 'exit-code'."], host="gpu1"
    )
    g = kv_gauge(snapshot([*events, *failed], None), target=None, min_headroom_gib=0.0)
    assert g.pool_tokens == ok.pool_tokens
    assert g.level == "critical" and any("failed" in r for r in g.reasons), g


async def test_feed_hides_monitoring_polls_until_m() -> None:
    """GET /get_model_info (a poll) is hidden; POST /generate (traffic) is not; m shows the polls."""
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        app.post_snapshot(snapshot(corpus_events("case-31"), None))
        await pilot.pause()
        feed = app.dashboards["gpu1"].feed
        lines = "\n".join(feed.visible_lines())
        assert "POST /generate" in lines and "/get_model_info" not in lines
        assert "polls hidden (m)" in plain_text(feed.border_subtitle)  # the feed says what it leaves out
        feed.log_widget.focus()
        await pilot.press("m")
        await pilot.pause()
        assert "/get_model_info" in "\n".join(feed.visible_lines())
        assert "polls shown (m)" in plain_text(feed.border_subtitle)  # m's answer, where it stays
        await pilot.press("m")
        await pilot.pause()
        assert "/get_model_info" not in "\n".join(feed.visible_lines())
        assert "polls hidden (m)" in plain_text(feed.border_subtitle)


async def test_help_screens_are_kept_and_follow_focus_each_time() -> None:
    """F1 reuses the help screen built for the same text; another panel's help is its own screen."""
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        dash = app.dashboards["gpu1"]
        seen = []
        for widget, words in ((dash.gpus, "GPU memory"), (dash.feed.log_widget, "Event feed")) * 2:
            widget.focus()
            await pilot.press("f1")
            await pilot.pause()
            assert words in app.screen.panel_help
            seen.append(app.screen)
            await pilot.press("escape")
            await pilot.pause()
        assert seen[0] is seen[2] and seen[1] is seen[3] and seen[0] is not seen[1]


def _footer_keys(app) -> list[str]:  # type: ignore[no-untyped-def]
    from textual.widgets._footer import FooterKey

    return [k.description for k in app.screen.query(FooterKey)]


async def test_footer_follows_the_focused_panels_keys_without_recomposing_for_nothing(monkeypatch) -> None:
    from console.tui.footer import KeyFooter

    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        dash = app.dashboards["gpu1"]
        dash.feed.log_widget.focus()
        await pilot.pause()
        assert "Filter" in _footer_keys(app)
        dash.gpus.focus()
        await pilot.pause()
        assert "Filter" not in _footer_keys(app)
        recomposed: list[int] = []
        original = KeyFooter.recompose

        async def counted(self: KeyFooter) -> None:
            recomposed.append(1)
            await original(self)

        monkeypatch.setattr(KeyFooter, "recompose", counted)
        for _ in range(3):  # a modal opened and closed: the dashboard's keys are the same after
            await pilot.press("f1")
            await pilot.pause()
            await pilot.press("escape")
            await pilot.pause()
        assert recomposed == []
        dash.feed.log_widget.focus()
        await pilot.pause()
        assert recomposed and "Filter" in _footer_keys(app)


async def test_header_age_repaints_only_when_what_it_says_changes() -> None:
    """A fresh host reads `< 5s ago` and its one-second tick draws nothing; a stale one counts up each
    second in yellow, then red; a new sample makes it fresh again at once."""
    app = make_app()
    now = [NOW]
    async with app.run_test(size=(160, 48)) as pilot:
        header = app.dashboards["gpu1"].header
        header.clock = lambda: now[0]
        app.post_snapshot(snapshot([], gpu_sample([250.0 * GIB] * 8, 288 * GIB)))  # sampled at NOW - 2
        await pilot.pause()
        assert "freshest sample < 5s ago" in plain(header.render())
        refreshes: list[int] = []
        header.refresh = lambda *a, **k: refreshes.append(1)  # type: ignore[method-assign]
        for dt in (0.5, 1.0, 1.5, 2.0):  # still under 5 s old: nothing to draw
            now[0] = NOW + dt
            header._tick()
        assert refreshes == []
        now[0] = NOW + 10
        header._tick()
        assert refreshes == [1]
        assert header.age_label() == ("12s ago", palette().warn)
        assert "freshest sample 12s ago" in plain(header.render())  # the repaint the tick asked for
        header._tick()
        assert refreshes == [1]  # drawn as it stands
        now[0] = NOW + 60
        assert header.age_label() == ("1m02s ago", palette().bad)
        fresh = gpu_sample([250.0 * GIB] * 8, 288 * GIB).model_copy(update={"ts": NOW + 59})
        header.refresh = lambda *a, **k: refreshes.append(2)  # type: ignore[method-assign]
        header.show(snapshot([], fresh, seq=2))
        assert refreshes == [1, 2]
        assert header.age_label() == ("< 5s ago", palette().ok)


async def test_a_host_that_answers_nothing_has_no_fresh_sample() -> None:
    """Failed ticks are stamped too (a GPU tick the SSH link lost, a server poll nobody answered), but
    nothing was heard: an unreachable host read `freshest sample < 5s ago`. A 503 is an answer."""
    from console.core.gpus import HostGpuSample, SamplerState
    from console.core.snapshot import HealthState, ServerSample

    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        header = app.dashboards["gpu1"].header
        lost = HostGpuSample(
            state=SamplerState.ERROR, detail="the connection is closed.", ts=NOW, host="gpu1"
        )
        silent = ServerSample(health=HealthState.DOWN, detail="nothing answers", ts=NOW)
        app.post_snapshot(snapshot([], lost).model_copy(update={"server": silent}))
        await pilot.pause()
        assert header.age_label() == ("none yet", palette().faint)
        assert "freshest sample none yet" in plain(header.render())
        loading = ServerSample(health=HealthState.STARTING, status_code=503, ts=NOW - 1)
        app.post_snapshot(snapshot([], lost, seq=2).model_copy(update={"server": loading}))
        await pilot.pause()
        assert header.age_label() == ("< 5s ago", palette().ok)


def test_kv_gauge_of_a_fresh_boot_carries_no_load_from_the_last() -> None:
    """A replay carried "in use 185k tokens (90%)" from the last server's decode line into a fresh boot
    whose pool was not allocated yet (issue 34): a boot's load is its own server's."""
    from console.core.parser import parse_lines

    events = corpus_events("case-24")  # serving: 20,800 tokens, usage 0.29 in its last decode line
    serving = kv_gauge(snapshot(events, None))
    assert serving.used_tokens == 20_800 and serving.usage == pytest.approx(0.29)
    restart = list(
        parse_lines(
            [
                "Apr 08 14:06:00 gpu1 systemd[1]: Stopping sglang.service - SGLang...",
                "Apr 08 14:06:05 gpu1 systemd[1]: sglang.service: Deactivated successfully.",
                "Apr 08 14:06:05 gpu1 systemd[1]: Stopped sglang.service - SGLang.",
                "Apr 08 14:06:05 gpu1 systemd[1]: Starting sglang.service - SGLang...",
            ],
            host="gpu1",
        )
    )
    assert len(snapshot([*events, *restart], None).state.boots) == 2
    fresh = kv_gauge(snapshot([*events, *restart], None))
    assert fresh.used_tokens is None and fresh.usage is None and fresh.pool_tokens is None, fresh
    assert not any("in use" in r for r in fresh.reasons)


def test_a_boot_is_named_by_when_it_began_whoever_read_it() -> None:
    """The console said boot #5, `snapshot` boot #0 and `verify --json` boot_index 5 for one boot: an
    index counts the boots a reader read (the console and `snapshot` from the invocation they opened on,
    `verify` over the backlog). Every reader names it by its first line's time."""
    from console.core.apply import judge
    from console.core.parser import parse_lines
    from console.core.state import fold_boots

    first = corpus_events("case-24")
    restart = list(
        parse_lines(
            [
                "Apr 08 14:06:00 gpu1 systemd[1]: Stopping sglang.service - SGLang...",
                "Apr 08 14:06:05 gpu1 systemd[1]: Stopped sglang.service - SGLang.",
                "Apr 08 14:06:05 gpu1 systemd[1]: Starting sglang.service - SGLang...",
            ],
            host="gpu1",
        )
    )
    second = corpus_events("case-31")
    backlog = fold_boots([*first, *restart, *second])  # what `verify HOST` reads
    invocation = fold_boots([restart[-1], *second])  # what a console or `snapshot` reads
    assert backlog[-1].index == 1 and invocation[-1].index == 0
    assert backlog[-1].name == invocation[-1].name == "boot 14:06:05"
    assert judge(backlog, 10_000).boot == judge(invocation, 10_000).boot == "boot 14:06:05"
    tl = restart_timeline(HostState().apply_all([restart[-1], *second]), NOW)
    assert tl is not None and tl.name == "boot 14:06:05"
