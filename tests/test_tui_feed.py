"""The event feed's rows: drawn on demand, bounded, never a layout per line, control characters shown
as pictures. Real decode lines from the corpus, a real Textual app."""

from __future__ import annotations

import re

import pytest
from textual.app import App, ComposeResult
from textual.screen import Screen

from console.core.events import Event
from console.core.parser import parse_lines
from console.tui.feed import EventFeed
from console.tui.view import feed_line, progress_key
from tests.tui_support import CORPUS, snapshot

DECODE = next(line for line in (CORPUS / "case-15.log").read_text().splitlines() if "Decode batch" in line)


def decode_events(n: int, start: int = 0) -> list[Event]:
    """`n` real decode lines, each with its own number in #running-req so that rows can be told apart."""
    lines = [DECODE.replace("#running-req: ", f"#running-req: {start + i}0", 1) for i in range(n)]
    return list(parse_lines(lines, host="gpu1"))


class FeedApp(App[None]):
    def __init__(self, history: int) -> None:
        super().__init__()
        self.history = history

    def compose(self) -> ComposeResult:
        yield EventFeed(history=self.history, id="feed")


def screen_rows(feed: EventFeed) -> list[str]:
    log = feed.log_widget
    return [log.render_line(y).text.rstrip() for y in range(log.scrollable_content_region.height)]


async def test_feed_keeps_the_newest_rows_and_shows_the_tail() -> None:
    app = FeedApp(history=100)
    async with app.run_test(size=(140, 30)) as pilot:
        feed = app.query_one(EventFeed)
        events: list[Event] = []
        for batch in range(5):
            events += decode_events(50, start=batch * 50)
            feed.show(snapshot(events, None, seq=batch + 1))
            await pilot.pause()
        log = feed.log_widget
        assert log.row_count == 100
        assert len(feed.visible_lines()) == 100
        rows = [r for r in screen_rows(feed) if r]
        # following: the last rows on screen are the newest events, in order
        newest = [feed_line(e) for e in events[-len(rows) :]]
        assert [r[:60] for r in rows] == [n[:60] for n in newest]
        assert "#running-req: 2490" in rows[-1]


async def test_a_new_row_repaints_the_feed_without_a_layout(monkeypatch) -> None:
    """A layout of the whole screen per journal line was what made keys wait seconds at 2,000 lines/s."""
    app = FeedApp(history=1000)
    async with app.run_test(size=(140, 30)) as pilot:
        feed = app.query_one(EventFeed)
        events = decode_events(200)
        feed.show(snapshot(events, None, seq=1))  # enough rows for the scrollbar: its layout happens here
        await pilot.pause()
        layouts: list[int] = []
        original = Screen._refresh_layout

        def counted(self: Screen, *args: object, **kwargs: object) -> None:
            layouts.append(1)
            original(self, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(Screen, "_refresh_layout", counted)
        for seq in range(2, 12):
            events = events + decode_events(20, start=seq * 100)
            feed.show(snapshot(events, None, seq=seq))
            await pilot.pause()
        assert layouts == []
        assert "#running-req: 11190" in screen_rows(feed)[-1]


async def test_only_rows_in_view_are_rendered() -> None:
    app = FeedApp(history=5000)
    async with app.run_test(size=(140, 30)) as pilot:
        feed = app.query_one(EventFeed)
        log = feed.log_widget
        rendered: list[Event] = []
        original = log._pieces

        def counting(event: Event):  # type: ignore[no-untyped-def]
            rendered.append(event)
            return original(event)

        log._pieces = counting
        feed.show(snapshot(decode_events(2000), None, seq=1))  # a snapshot carries 2,000
        await pilot.pause()
        await pilot.pause()
        height = log.scrollable_content_region.height
        assert log.row_count == 2000
        assert 0 < len(rendered) <= 3 * height


async def test_control_characters_never_reach_the_terminal() -> None:
    raw = "Nov 30 10:00:00 gpu1 python3[7]: progress \x1b[31mred\x1b[0m 50%\rtail\x07 end"
    app = FeedApp(history=100)
    async with app.run_test(size=(140, 30)) as pilot:
        feed = app.query_one(EventFeed)
        feed.show(snapshot(list(parse_lines([raw], host="gpu1")), None))
        await pilot.pause()
        row = next(r for r in screen_rows(feed) if "progress" in r)
        assert not any(ord(c) < 32 or ord(c) == 0x7F for c in row)
        assert "progress ␛[31mred␛[0m 50%" in row


async def test_filter_and_fold_rebuild_the_rows_from_history() -> None:
    app = FeedApp(history=500)
    async with app.run_test(size=(140, 30)) as pilot:
        feed = app.query_one(EventFeed)
        feed.show(snapshot(decode_events(300), None))
        await pilot.pause()
        assert feed.set_filter("running-req: 1[0-9]01,")
        await pilot.pause()
        assert feed.log_widget.row_count == len(feed.visible_lines()) == 10
        assert all("running-req: 1" in r for r in screen_rows(feed) if r)
        assert feed.set_filter("")
        await pilot.pause()
        assert feed.log_widget.row_count == 300


async def test_progress_redraws_are_one_row_and_blank_lines_are_hidden() -> None:
    """tqdm redraws one line in a terminal; the journal keeps each redraw, with a blank line between
    (case-01: 24 redraws of a 64-shard load). The feed shows the newest of a run of them in one row,
    and no blank rows; a progress run that other lines interrupt starts a new row (case-14)."""
    loading = (CORPUS / "case-01.log").read_text().splitlines()[324:380]
    app = FeedApp(history=500)
    async with app.run_test(size=(140, 40)) as pilot:
        feed = app.query_one(EventFeed)
        events = list(parse_lines(loading, host="gpu1"))
        assert sum("checkpoint shards" in feed_line(e) for e in events) == 24
        feed.show(snapshot(events, None))
        await pilot.pause()
        lines = feed.visible_lines()
        shards = [line for line in lines if "checkpoint shards" in line]
        assert len(shards) == 1 and "67% Completed | 43/64" in shards[0], shards
        assert all(line.split(maxsplit=2)[-1].strip() for line in lines), lines
        assert lines[-1] == shards[0]
        assert feed.log_widget.row_count == len(lines) == 8
        assert "67% Completed | 43/64" in [r for r in screen_rows(feed) if r][-1]

        # A redraw arriving later replaces the row on screen too (its cached strip is dropped).
        more = "Loading safetensors checkpoint shards:  69% Completed | 44/64 [04:57<05:33, 16.68s/it]"
        events += list(parse_lines(["", more], host="gpu1"))
        feed.show(snapshot(events, None, seq=2))
        await pilot.pause()
        assert feed.log_widget.row_count == 8
        assert "69% Completed | 44/64" in [r for r in screen_rows(feed) if r][-1]

    interrupted = (CORPUS / "case-14.log").read_text().splitlines()
    app = FeedApp(history=500)
    async with app.run_test(size=(140, 40)) as pilot:
        feed = app.query_one(EventFeed)
        feed.show(snapshot(list(parse_lines(interrupted, host="gpu1")), None))
        await pilot.pause()
        shards = [line for line in feed.visible_lines() if "checkpoint shards" in line]
        assert len(shards) == 2, shards
        assert "97% Completed | 36/37" in shards[0] and "100% Completed | 37/37" in shards[1]


@pytest.mark.timeout(10)
def test_telling_progress_lines_apart_never_hangs_on_a_long_line() -> None:
    """Every journal line meets the progress matcher. An unbounded one backtracked quadratically on a
    long run of digits after a percentage (108 s for a line of 200,000 characters: a tensor printed
    on one line would have frozen the console); this one answers at once. A hang guard, not a speed
    target: the timeout is two orders of magnitude above the time it takes."""
    n = 200_000
    lines = [
        "Loading: 50%|" + "1" * n,
        "x" * n + ": 50%|" + "1/" * n,
        "Capturing batches (bs=1 avail_mem=0.86 GB): 100%|" + "█" * n + "| 4/4 [00:18<00:00,  4.51s/it]",
    ]
    keys = [progress_key(e) for e in parse_lines(lines, host="gpu1")]
    assert keys == [None, None, None]
    redraw = "Capturing batches (bs=1 avail_mem=0.86 GB): 100%|██████████| 4/4 [00:18<00:00,  4.51s/it]"
    assert [progress_key(e) for e in parse_lines([redraw], host="gpu1")] == [("", "Capturing batches")]


def at_tail(feed: EventFeed) -> bool:
    log = feed.log_widget
    return log.scroll_offset.y + log.scrollable_content_region.height >= log.row_count


async def test_the_feed_opens_and_stays_at_its_newest_line_as_the_panes_above_it_grow() -> None:
    """The feed's box shrinks when the pairing bar, the folded boots, pinned errors or a verdict appear
    above it; following, the newest line stays in view (it ended 4-5 lines short, scrollbar at the
    bottom, and `f` then turned following off)."""
    from tests.tui_support import corpus_events, make_app

    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        dash = app.dashboards["gpu1"]
        feed = dash.feed
        events = corpus_events("case-01")
        app.post_snapshot(snapshot(events[:-40], None))
        await pilot.pause()
        assert feed.log_widget.row_count > 40 and at_tail(feed)
        # The host's state directory is read: the pairing bar shows; an operation ends failed.
        dash.pairing.display = True
        dash.verdict.show_verdict(False, "apply ctx-200k: failed", can_roll_back=True)
        app.post_snapshot(snapshot(events, None, seq=2))
        await pilot.pause()
        assert at_tail(feed), (feed.log_widget.scroll_offset.y, feed.log_widget.row_count)
        assert screen_rows(feed)[-1][:40] == feed.visible_lines()[-1][:40]
        # Following all along: `f` now turns it off, as it says.
        await pilot.press("f")
        assert not feed.follow
        # The operator scrolls up: the feed stays where it was put while new lines arrive.
        await pilot.press("f")
        feed.log_widget.focus()
        await pilot.press("pageup")
        await pilot.pause()
        assert not feed.follow
        where = feed.log_widget.scroll_offset.y
        app.post_snapshot(snapshot([*events, *decode_events(5)], None, seq=3))
        await pilot.pause()
        assert feed.log_widget.scroll_offset.y == where and not at_tail(feed)
        # End goes back to the tail, and follows it again.
        await pilot.press("end")
        await pilot.pause()
        assert feed.follow and at_tail(feed)


async def test_a_filter_in_force_is_named_and_esc_on_the_dashboard_clears_it() -> None:
    """Once its box closed the filter was invisible, the feed silently short of lines, and Esc on the
    dashboard did nothing although the help says it clears the filter (issue 34)."""
    from textual.widgets import Input

    from tests.tui_support import corpus_events, make_app, plain

    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        app.post_snapshot(snapshot(corpus_events("case-31"), None))
        await pilot.pause()
        dash = app.dashboards["gpu1"]
        feed = dash.feed
        everything = feed.log_widget.row_count
        await pilot.press("slash", *"cuda_graph", "enter")
        await pilot.pause()
        assert not feed.query_one("#filter", Input).display  # the box is gone...
        assert 0 < feed.log_widget.row_count < everything
        assert "filtered: /cuda_graph/" in plain(feed.border_subtitle)  # ...the filter is still said
        dash.gpus.focus()  # elsewhere on the dashboard
        await pilot.press("escape")
        await pilot.pause()
        assert feed.filter.pattern is None and feed.log_widget.row_count == everything
        said = plain(feed.border_subtitle)
        assert "filtered" not in said and "polls hidden (m)" in said


async def test_ctrl_c_names_the_quit_key_the_footer_shows() -> None:
    """Ctrl-C said "press ctrl+q" while the footer says q."""
    from tests.tui_support import make_app

    app = make_app()
    said: list[str] = []
    shown = app.notify
    app.notify = lambda message, *a, **kw: (said.append(str(message)), shown(message, *a, **kw))[1]  # type: ignore[method-assign]
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert said[-1] == "Press q to quit."
        await pilot.press("slash")  # typing in the filter box: q is a letter there
        await pilot.pause()
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert said[-1] == "Press Esc, then q to quit."


def test_a_row_is_cut_between_words_never_inside_a_number() -> None:
    """Cut to the feed's width, `context_len=200000` read `context_len=20000…`: another number."""
    from rich.text import Text

    from console.core.events import PoolSummary
    from console.tui.feed import cut_between_words
    from tests.tui_support import corpus_events

    summary = next(e for e in corpus_events("case-31") if isinstance(e, PoolSummary))
    row = feed_line(summary)
    at = row.index("context_len=40960") + len("context_len=4096")  # a cut after four of its five digits
    for width in range(at - 30, min(at + 3, len(row))):
        line = Text(row)
        cut_between_words(line, width)
        shown = line.plain
        assert len(shown) == width and shown.rstrip().endswith("…"), (width, shown)
        cut = shown.rstrip()[:-1]
        # what is left of every number is the whole number
        for number in re.findall(r"\d[\d.]*", cut):
            assert re.search(rf"(?<![\d.]){re.escape(number)}(?![\d.])", row), (width, number, shown)


async def test_an_operator_scrolled_up_keeps_the_rows_they_read_as_old_lines_fall_off() -> None:
    """The log holds the newest rows; each new one pushes the oldest off the top. An operator scrolled up to
    read saw the rows move up under them, one for each new line (at 2,000 lines a second, a blur): the view
    now moves with them, so the rows read stay where they are until they reach the top."""
    app = FeedApp(history=100)
    async with app.run_test(size=(140, 30)) as pilot:
        feed = app.query_one(EventFeed)
        events = decode_events(100)
        feed.show(snapshot(events, None, seq=1))
        await pilot.pause()
        log = feed.log_widget
        log.scroll_to(y=40, animate=False, immediate=True)
        await pilot.pause()
        assert not feed.follow
        reading = screen_rows(feed)
        events += decode_events(10, start=100)  # ten more: the ten oldest fall off
        feed.show(snapshot(events, None, seq=2))
        await pilot.pause()
        assert log.row_count == 100 and screen_rows(feed) == reading


async def test_m_keeps_a_filters_rows_whose_lines_fell_off_the_history() -> None:
    """Under a filter the log keeps its rows after their lines fell off the history (a rare line found
    stays); `m` is about polls, yet it dropped them (at 2,000 lines a second the history is 2.5 s long, so
    every press under load took a few rows away and repainted the log). Now they stay through `m`, both
    ways. A filter's change rebuilds from the history (the control)."""
    app = FeedApp(history=50)
    async with app.run_test(size=(140, 30)) as pilot:
        feed = app.query_one(EventFeed)
        events = decode_events(40)
        feed.show(snapshot(events, None, seq=1))
        await pilot.pause()
        assert feed.set_filter("running-req: [0-9]*501,")  # every tenth line
        events += decode_events(40, start=40)  # the history: the last 50 lines, #30-#79
        feed.show(snapshot(events, None, seq=2))
        await pilot.pause()
        shown = feed.visible_lines()
        assert len(shown) == 8  # #5 ... #75: three of them fell off the history
        for _ in range(2):
            feed.action_polls()
            await pilot.pause()
            assert feed.visible_lines() == shown
        assert feed.set_filter("running-req: [0-9]*501,|nothing")
        assert len(feed.visible_lines()) == 5


async def test_m_hiding_polls_takes_the_polls_that_fell_off_the_history_too() -> None:
    poll = '[2025-05-02 16:15:00] INFO:     127.0.0.1:48030 - "GET /health HTTP/1.1" 200 OK'
    app = FeedApp(history=20)
    async with app.run_test(size=(140, 30)) as pilot:
        feed = app.query_one(EventFeed)
        events = list(parse_lines([poll] * 5, host="gpu1")) + decode_events(5)
        feed.action_polls()  # polls shown
        feed.show(snapshot(events, None, seq=1))
        await pilot.pause()
        assert feed.set_filter("health|running-req: [0-4]01,")
        assert len(feed.visible_lines()) == 10
        events += decode_events(20, start=50)  # all ten fall off the history
        feed.show(snapshot(events, None, seq=2))
        await pilot.pause()
        assert len(feed.visible_lines()) == 10
        feed.action_polls()  # hidden: the fallen polls go, the fallen decode rows stay
        await pilot.pause()
        assert [line for line in feed.visible_lines() if "GET /health" in line] == []
        assert len(feed.visible_lines()) == 5
