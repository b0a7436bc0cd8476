"""What the console repaints and when (issue 33 items 2 and 3): an idle dashboard repaints nothing that
did not change, and a journal line reaches the feed before the session's next snapshot.

The idle host is folded the way a session folds it (`HostFold`): a boot from the public corpus, a GPU
sample every second and a `/metrics` scrape of the twin's idle server every two seconds, each new
objects with new times and the same figures. Repaints are counted with a hook on each widget's
`refresh`; the positive controls change one figure and see that widget, and only it, repaint."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator

import pytest
from textual.geometry import Region
from textual.widget import Widget

from console.core.events import DecodeBatch
from console.core.hostfold import HostFold
from console.core.metrics import SglangMetrics, parse_prometheus
from console.core.parser import parse_lines
from console.core.snapshot import ConnectionStatus, ConnState, HealthState, HostSnapshot, ServerSample
from console.sources.hosts import load_hosts
from console.sources.session_options import SessionOptions
from console.tui import panels
from console.tui.app import ConsoleApp, HostEntry
from console.tui.dashboard import HostDashboard
from console.twin.host import TwinHost
from console.twin.journal import JournalClient
from console.twin.scenarios import get_scenario
from console.twin.server_engine import Engine
from console.twin.server_logs import LogWriter
from tests.support.twins import module_twin
from tests.support.waiting import eventually
from tests.test_serving_core import engine_config
from tests.tui_support import CORPUS, NOW, gpu_sample, make_app

GIB = 1024.0
WINDOW_S = 30.0
"""The serving window of the idle host: short, so that a test fills it (while it fills, the figures
cover more seconds at each scrape, and the panel says so)."""


class IdleHost:
    """A quiet host as its session folds it, one simulated second at a time."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.fold = HostFold("gpu1", serving_window_s=WINDOW_S, server_interval_s=2.0)
        self.fold.journal((CORPUS / "case-01.log").read_text().splitlines())
        engine = Engine(get_scenario(), engine_config(), LogWriter(io.StringIO()))
        self.metrics_text = engine.metrics_text()
        self.util = 37.0
        self.seq = 0

    def second(self) -> HostSnapshot:
        """One more second: a GPU sample, every other second a scrape; the snapshot after them."""
        now = self.clock[0]
        sample = gpu_sample([250.0 * GIB] * 8, 288 * GIB, util=self.util).model_copy(update={"ts": now})
        self.fold.gpu(sample)
        if int(now) % 2 == 0:
            scrape = parse_prometheus(self.metrics_text)
            reading = ServerSample(
                health=HealthState.OK,
                status_code=200,
                metrics=SglangMetrics.from_metrics(scrape),
                scrape=scrape,
                ts=now,
                version="0.5.12.post1",
            )
            self.fold.server_reading(reading, 64.0)
        self.seq += 1
        return self.fold.snapshot(
            seq=self.seq,
            ts=now,
            connection=ConnectionStatus(host="gpu1", state=ConnState.UP, since=NOW - 60),
            follower=HostSnapshot(host="gpu1").follower,
        )


@pytest.fixture
def repaints(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Every repaint or layout a widget asks for, by the widget's id (or class)."""
    counted: dict[str, int] = {}
    original = Widget.refresh

    def refresh(self: Widget, *regions: object, **kw: bool) -> Widget:
        if kw.get("repaint", True) or kw.get("layout", False):
            key = self.id or type(self).__name__
            counted[key] = counted.get(key, 0) + 1
        return original(self, *regions, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Widget, "refresh", refresh)
    yield counted


PANELS = ("gpus", "kv", "timeline", "serving", "throughput", "log", "HeaderBar")


async def test_an_idle_dashboard_repaints_nothing_over_a_minute_of_unchanged_snapshots(
    repaints: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [NOW]
    host = IdleHost(clock)
    app = make_app(clock=lambda: clock[0])
    async with app.run_test(size=(160, 48)) as pilot:
        dash = app.dashboards["gpu1"]

        async def run(seconds: int) -> None:
            # What a second of a quiet host brings: its snapshots and the widgets' one-second ticks.
            for _ in range(seconds):
                clock[0] += 1.0
                app.post_snapshot(host.second())
                await pilot.pause()
                dash.header._tick()
                dash.serving._tick()
                dash.throughput._tick()
            await pilot.pause()

        await run(int(WINDOW_S) + 10)  # the serving window fills: its span stops growing
        assert dash.serving.display and "no requests in the window" in _text(dash, "serving")
        repaints.clear()
        made: list[int] = []
        real_rows = panels.gpu_rows
        monkeypatch.setattr(panels, "gpu_rows", lambda snap: made.append(1) or real_rows(snap))
        await run(60)
        drawn = {k: n for k, n in repaints.items() if k in PANELS}
        assert drawn == {}, f"repainted with nothing changed: {drawn}"
        # Each second's sample is a new object reading the same: the GPU rows are not made again.
        assert made == [], f"GPU rows made {len(made)} times from samples that read the same"

        # Positive controls, in the same loop: a figure that changes repaints its widget, and only it.
        host.util = 91.0
        await run(1)
        assert made, "a sample that reads differently makes the rows again"
        assert repaints.get("gpus", 0) >= 1, repaints
        assert {k for k in repaints if k in PANELS} == {"gpus"}, repaints
        repaints.clear()
        clock[0] += 30.0  # the sampler stops: the header's age turns from "< 5s ago" to "30s ago"
        dash.header._tick()
        await pilot.pause()
        assert repaints.get("HeaderBar", 0) >= 1 and "30s ago" in _text(dash, "HeaderBar"), repaints


async def test_the_tok_s_chart_repaints_on_new_data_and_as_its_points_age_never_on_idle_readings(
    repaints: dict[str, int],
) -> None:
    """An idle server's scrapes every two seconds redrew the chart each time (2 s, at idle, for good);
    now new points redraw it at its next tick, and with none coming the clock moves them every ten
    seconds until they leave the window, and then nothing does."""
    clock = [NOW]
    host = IdleHost(clock)
    app = make_app(clock=lambda: clock[0])
    async with app.run_test(size=(160, 48)) as pilot:
        dash = app.dashboards["gpu1"]
        chart = dash.throughput
        charted: list[int] = []

        async def second() -> None:
            clock[0] += 1.0
            app.post_snapshot(host.second())
            await pilot.pause()
            chart._tick()
            await pilot.pause()
            charted.append(repaints.pop("throughput", 0))

        decode = next(
            e
            for e in parse_lines((CORPUS / "case-26.log").read_text().splitlines(), host="gpu1")
            if isinstance(e, DecodeBatch)
        )
        now_us = int(clock[0] * 1e6)
        host.fold.apply([decode.model_copy(update={"ts": _iso(clock[0]), "realtime_us": now_us})])
        for _ in range(5):
            await second()
        assert sum(charted) >= 1, "the new point was never drawn"
        charted.clear()
        for _ in range(60):  # idle scrapes every 2 s; the point ages
            await second()
        assert 1 <= sum(charted) <= 7, f"repaints in 60 idle seconds with a point in the window: {charted}"
        clock[0] += 300.0  # the point leaves the window
        await second()
        charted.clear()
        for _ in range(30):
            await second()
        assert sum(charted) == 0, f"an empty chart repainted: {charted}"
        assert "No generation in the last 5 minutes" in _text(dash, "throughput")


def _iso(ts: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).isoformat()


def _text(dash: HostDashboard, widget: str) -> str:
    from tests.tui_support import plain

    target = dash.header if widget == "HeaderBar" else dash.query_one(f"#{widget}")
    return plain(target.render(), 200)


# ---- a journal line reaches the feed without waiting for a snapshot ------------------------------------

twin = module_twin("repaint-twin", time_scale=0.02, systemd="simulated")


def _journal_writer(twin: TwinHost) -> Callable[[str], None]:
    """Writes one line into the twin's journal as the server's unit (the fields journald would add)."""
    client = JournalClient(twin.layout)
    show = twin.systemctl("show", "-p", "InvocationID", "-p", "MainPID", twin.unit)
    props = dict(line.split("=", 1) for line in show.stdout.splitlines() if "=" in line)

    def write(message: str) -> None:
        client.send(
            {
                "MESSAGE": message,
                "PRIORITY": "6",
                "SYSLOG_IDENTIFIER": "python3",
                "_PID": props.get("MainPID", "4242"),
                "_COMM": "python3",
                "_SYSTEMD_UNIT": twin.unit,
                "_SYSTEMD_INVOCATION_ID": props.get("InvocationID", ""),
                "_TRANSPORT": "stdout",
            },
            wait=True,
        )

    return write


@pytest.mark.timeout(120)
async def test_a_journal_line_is_drawn_before_the_sessions_next_snapshot(twin: TwinHost) -> None:
    """The session publishes a snapshot at most every `publish_interval_s` (0.1 s in a console, up to
    100 ms added to every line). Here it publishes once a minute: the line is on the feed in seconds
    all the same, while no snapshot has been published since it was written."""
    config = load_hosts(twin.hosts_toml).get(twin.name)
    assert config is not None
    options = SessionOptions(publish_interval_s=60.0, gpu_interval_s=30.0, poll_server=False)
    app = ConsoleApp([HostEntry(twin.name, config=config, session=options)])
    write = _journal_writer(twin)
    async with app.run_test(size=(160, 48)) as pilot:
        ctl = app.hosts[twin.name]
        feed = app.dashboards[twin.name].feed
        await eventually(lambda: ctl.session is not None and ctl.dashboard.snap is not None, pilot=pilot)
        # Wait out the first minute's publishes of the start (the link, the follower, the backlog).
        await eventually(
            lambda: ctl.session.snapshot.seq == ctl.dashboard.snap.seq,
            "the start's snapshot shown",
            pilot=pilot,
        )
        published = ctl.session.snapshot.seq
        write("k26 repaint test: a line the operator must see at once")
        said = "a line the operator must see at once"
        await eventually(
            lambda: any(said in line for line in feed.visible_lines()),
            "the line on the feed",
            timeout=20.0,
            pilot=pilot,
        )
        # No snapshot brought it: the one on the dashboard does not hold it, and none was published since.
        assert not any(said in str(e) for e in ctl.dashboard.snap.recent)
        assert ctl.session.snapshot.seq == published


async def test_m_and_z_under_a_filter_judge_no_line_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """`m` (monitoring polls) and `z` (earlier boots) under a filter ran the filter's regex over all
    5,000 lines again (20 ms of the key's time, measured): each line keeps its verdict for the filter in
    force. A new filter judges every line afresh (the control)."""
    from console.tui.feed import FeedFilter
    from tests.tui_support import corpus_events, snapshot

    judged: list[str] = []
    original = FeedFilter.matches

    def matches(self: FeedFilter, line: str) -> bool:
        judged.append(line)
        return original(self, line)

    monkeypatch.setattr(FeedFilter, "matches", matches)
    events = corpus_events("case-26")
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        feed = app.dashboards["gpu1"].feed
        app.post_snapshot(snapshot(events, gpu_sample([250.0 * GIB] * 8, 288 * GIB)))
        await pilot.pause()
        assert feed.set_filter("decode")
        first = len(judged)
        assert first >= min(len(events), feed.history) // 2
        shown = feed.visible_lines()
        for key in ("m", "m", "z", "z"):
            judged.clear()
            feed.action_polls() if key == "m" else feed.action_fold()
            await pilot.pause()
            assert judged == [], f"{key} judged {len(judged)} lines again"
        assert feed.visible_lines() == shown
        assert feed.set_filter("prefill")
        assert len(judged) >= first // 2  # the control: another filter reads every line


async def test_m_draws_no_row_again_that_stays_on_screen(monkeypatch: pytest.MonkeyPatch) -> None:
    """`m` rebuilds the feed's rows; the rows that stay were drawn again all the same (their strips were
    cached by place, and a rebuild cleared them): ~3 ms of each press's frame under load. Strips are kept
    by event: only the polls `m` brings in are drawn, and the rows a filter leaves are drawn once."""
    from console.tui.feed import FeedLog
    from tests.tui_support import corpus_events, snapshot

    drawn: list[str] = []
    original = FeedLog._strip

    def strip(self: FeedLog, event: object, width: int) -> object:
        drawn.append(getattr(event, "kind", ""))
        return original(self, event, width)  # type: ignore[arg-type]

    monkeypatch.setattr(FeedLog, "_strip", strip)
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        feed = app.dashboards["gpu1"].feed
        app.post_snapshot(snapshot(corpus_events("case-31"), None))
        await pilot.pause()
        feed.log_widget.focus()
        assert drawn, "the control: the first frame draws the rows on screen"
        drawn.clear()
        await pilot.press("m")  # the polls come in: they are drawn, the other rows are not
        await pilot.pause()
        assert drawn and set(drawn) == {"http_access"}, drawn
        drawn.clear()
        await pilot.press("m")  # and go: nothing new to draw
        await pilot.pause()
        assert drawn == [], drawn


async def test_m_under_a_filter_no_poll_matches_repaints_one_row_the_feed_border(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`m` under a filter that no poll matches changes no row, only the words on the feed's bottom edge;
    it repainted the feed's whole box (its ~40 rows: 3-7 ms of the key's frame under load) and the log's
    rows. Now the key's repaint is that one row, and the words are on screen. The control: without the
    filter, `m` brings the polls in and the log's rows are repainted."""
    from console.tui.feed import EventFeed, FeedLog
    from tests.tui_support import corpus_events, snapshot

    repainted: list[tuple[str, Region]] = []
    original = Widget._exchange_repaint_regions

    def exchange(self: Widget) -> object:
        regions = original(self)
        if isinstance(self, EventFeed | FeedLog):
            repainted.extend((type(self).__name__, r) for r in regions)
        return regions

    monkeypatch.setattr(Widget, "_exchange_repaint_regions", exchange)

    def screen() -> str:
        return "\n".join(strip.text for strip in app.screen._compositor.render_strips())

    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        feed = app.dashboards["gpu1"].feed
        app.post_snapshot(snapshot(corpus_events("case-31"), None))
        await pilot.pause()
        feed.log_widget.focus()
        assert feed.set_filter("decode")
        await pilot.pause()
        rows = feed.visible_lines()
        assert rows and "polls hidden (m)" in screen()
        box = feed.region
        for words in ("polls shown (m)", "polls hidden (m)"):
            repainted.clear()
            await pilot.press("m")
            await pilot.pause()
            assert repainted == [("EventFeed", Region(0, box.height - 1, box.width, 1))], repainted
            assert words in screen().splitlines()[box.bottom - 1]
            assert feed.visible_lines() == rows
        feed.clear_filter()  # the control: polls come in, the rows change and are repainted
        await pilot.pause()
        repainted.clear()
        await pilot.press("m")
        await pilot.pause()
        assert any(name == "FeedLog" for name, _ in repainted), repainted
        assert any("GET /get_model_info" in line for line in feed.visible_lines())


async def test_a_feed_that_fails_on_folded_lines_ends_the_console_not_the_journal_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lines go to the feed from inside the session's journal task: a feed that raised there ended
    the journal's reading and nothing else (the console went on, its feed frozen). The error is raised
    in the app instead, which ends with its traceback as for any handler's; the session's task goes on."""
    from console.tui.feed import EventFeed

    def broken(self: EventFeed, *args: object) -> None:
        raise RuntimeError("the feed broke")

    fold = HostFold("gpu1")
    fold.journal((CORPUS / "case-01.log").read_text().splitlines()[:20])
    app = make_app()
    with pytest.raises(RuntimeError, match="the feed broke"):
        async with app.run_test(size=(160, 48)) as pilot:
            monkeypatch.setattr(EventFeed, "take", broken)
            try:
                app.post_lines("gpu1", fold)
            except RuntimeError:
                pytest.fail("raised in the session's task, whose journal reading it ends")
            await pilot.pause()
            await pilot.pause()
