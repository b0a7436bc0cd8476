"""The dashboard's generation throughput: the server's own tok/s over time (its `Decode batch` lines,
`/metrics` gen_throughput, and where decode lines are sparse the rate of `generation_tokens_total` per
scrape interval), and the newest figure, said as "now" only while it is."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rich.text import Text
from textual.reactive import reactive
from textual.timer import Timer
from textual.widget import Widget

from console.core.probe_history import throughput_points
from console.core.snapshot import ConnState, HealthState, HostSnapshot
from console.core.text import terminal_safe
from console.tui.plot import axis_style, current_style, plot_text
from console.tui.themes import palette
from console.tui.view import textual_text

NOW_WINDOW_S = 60.0
"""How long a generation figure is "now": SGLang logs a `Decode batch` line every 40 decode steps
(--decode-log-interval), under a minute at 0.7 tok/s, the slowest decode the console is meant for."""


SPARSE_LINES_S = 10.0
"""With no decode line for this long, the chart plots `/metrics`' generation rate per scrape interval."""


def quiet_reason(snap: HostSnapshot) -> str | None:
    """Why no generation figure can come now, when the server cannot be asked: the tok/s panel said the
    server "logged no Decode batch line" while the link to the host was refused."""
    link = snap.connection
    if link is not None and link.state is not ConnState.UP:
        return f"no link to {snap.host} ({terminal_safe(link.describe())})"
    if snap.server is not None and snap.server.health is HealthState.DOWN:
        return "the server does not answer"
    return None


def ago(seconds: float) -> str:
    """How old a figure is, in steps of ten seconds (then of a minute): the chart's words change, and
    it repaints, every ten seconds at most, not every second."""
    s = int(seconds)
    if s < 10:
        return "< 10 s ago"
    return f"{s // 10 * 10} s ago" if s < 120 else f"{s // 60} min ago"


def latest_figure(last: tuple[float, float], now: float, idle_at: float | None) -> Text:
    """The newest tok/s under the chart: "now" only while it is, else when it was (a figure the console
    kept from before a rollback read as the server's current speed)."""
    t, value = last
    if idle_at is not None and idle_at >= t:
        return Text(f"idle (last {value:.2f}, {ago(now - t)})", palette().muted)
    if now - t > NOW_WINDOW_S:
        return Text(f"last {value:.2f}, {ago(now - t)}", palette().muted)
    return Text(f"now {value:.2f}", current_style())


GAP_S = 15.0
"""Points further apart than this (and than a few of the series' own spacings) are not joined: a line
across a restart or a quiet spell drew generation where there was none."""


NICE = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)


def nice_ceiling(value: float) -> float:
    """The smallest round number (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 times a power of ten) at least
    `value`: the top of the y axis, close over the highest point (1 for none)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in NICE if m * power >= value * (1 - 1e-9))


def fmt_rate(value: float) -> str:
    """A tok/s figure as the chart's axis and its `now` line both write it (two decimals: 0.70)."""
    return f"{value:,.2f}" if value < 1000 else f"{value:,.0f}"


def segments(shown: Sequence[tuple[float, float]], gap_s: float) -> list[list[tuple[float, float]]]:
    """The points in runs whose neighbours are at most `gap_s` apart, oldest first."""
    runs: list[list[tuple[float, float]]] = []
    for point in shown:
        if runs and point[0] - runs[-1][-1][0] <= gap_s:
            runs[-1].append(point)
        else:
            runs.append([point])
    return runs


def time_ticks(window_s: float, width: int) -> tuple[list[float], list[str]]:
    """The x axis: `now` at the right, then whole minutes back (seconds for a short window), every 1, 2,
    5... of them, as many as the width keeps apart (a label is up to 5 cells)."""
    unit = 60.0 if window_s >= 120 else 1.0
    fit = max(2, width // 8)
    step = next(
        (m * unit for m in (1, 2, 5, 10, 15, 30, 60, 120) if window_s / (m * unit) + 1 <= fit), window_s
    )
    marks = [-step * i for i in range(int(window_s // step + 1e-9), -1, -1)]
    suffix = "m" if unit == 60.0 else "s"
    return marks, ["now" if m == 0 else f"-{-m / unit:g}{suffix}" for m in marks]


def value_ticks(top: float, newest: float | None, rows: int) -> tuple[list[float], list[str]]:
    """The y axis from 0 (tok/s is never negative) to `top` (halfway too, given the rows), and the
    newest figure itself, written as the chart's last line writes it, where it crowds neither end: the
    label beside the curve's end reads what the line under the chart says."""
    marks = [0.0, top / 2, top] if rows >= 5 else [0.0, top]
    labels = {m: f"{m:g}" for m in marks}
    if newest is not None and rows > 1:

        def row(value: float) -> int:
            return round(value / top * (rows - 1))

        if row(newest) not in (row(0.0), row(top)):
            labels = {m: t for m, t in labels.items() if row(m) != row(newest)}
            labels[newest] = fmt_rate(newest)
    ordered = sorted(labels)
    return ordered, [labels[m] for m in ordered]


def throughput_chart(
    points: Sequence[tuple[float, float]],
    now: float,
    window_s: float,
    width: int,
    height: int,
    *,
    idle_at: float | None = None,
    probe_hint: bool = True,
    quiet_why: str | None = None,
) -> Text:
    """Generation tok/s over the last `window_s` seconds (x: minutes before now), from 0 up. `idle_at`:
    when the server last said it was running no request. `probe_hint`: the empty chart names the
    probe's key (not in a replay, which has no probe). `quiet_why`: why there is nothing to read when
    the server cannot be asked (the link is down): an empty chart then says that, not that the server
    logged nothing."""
    shown = [(t - now, v) for t, v in points if now - window_s <= t <= now]
    if not shown:
        minutes = f"{window_s / 60:g} minutes" if window_s >= 120 else f"{window_s:g} s"
        if quiet_why is not None:
            return Text(f"No generation figures in the last {minutes}: {quiet_why}.", palette().muted)
        hint = "\nP sends a synthetic long-context request and measures it (the probe)." if probe_hint else ""
        return Text(
            f"No generation in the last {minutes}: the server logged no Decode batch line.{hint}",
            palette().muted,
        )
    last = (shown[-1][0] + now, shown[-1][1])
    top = nice_ceiling(max(v for _, v in shown) * 1.05)
    plot_rows = height - 1
    spacing = sorted(b[0] - a[0] for a, b in itertools.pairwise(shown))
    gap = max(GAP_S, 3 * spacing[len(spacing) // 2]) if spacing else GAP_S
    # The plot's own rows: its height less the frame (2) and the time labels (1).
    y_marks, y_labels = value_ticks(top, last[1], plot_rows - 3)
    x_marks, x_labels = time_ticks(window_s, width)

    def build(fig: Any) -> None:
        for run in segments(shown, gap):
            signal = fig.signal([x for x, _ in run], [v for _, v in run])
            fig.draw(signal.lines() if len(run) > 1 else signal)
        fig.ruler("x").lim(-window_s, 0)
        fig.ruler("x").ticks(x_marks, x_labels)
        fig.ruler("y").lim(0, top)
        fig.ruler("y").ticks(y_marks, y_labels)

    chart = plot_text(build, width, plot_rows, {"hd": current_style()})
    return chart + Text.assemble("\n", ("gen tok/s  ", axis_style()), latest_figure(last, now, idle_at))


class ThroughputChart(Widget):
    """The server's generation throughput over time. Feed it snapshots (`show`) or points (`set_samples`);
    it keeps `window_s` seconds of (epoch seconds, tok/s) samples, averaged per second.

    A busy server logs a `Decode batch` line per rank every few steps, thousands a second: the chart reads
    only the events that are new since the last snapshot, folds them into one bucket per second (at most
    `window_s` of them), and redraws at most once a second — plotext's cost grows with the points drawn.
    It redraws only when what it draws changed (`picture`): new points, or the clock moving them along
    the time axis; with no point left in its window nothing moves, and its tick stops until data comes."""

    DEFAULT_CLASSES = "throughput-chart"
    HELP = (
        "[b]Generation throughput[/b]\nTokens per second the server generated, from its `Decode batch` "
        "lines (every --decode-log-interval steps) and /metrics gen_throughput, over the last minutes; "
        "where decode lines are sparse, /metrics generation_tokens_total per scrape interval."
    )
    REDRAW_S = 1.0
    AXIS_TICK_S = 10.0
    """How often a quiet chart is redrawn so its points move along the time axis: counted from its newest
    point, as the newest figure's age is (`ago`), so that both change in one repaint."""

    picture: reactive[object] = reactive(None, init=False)
    """What the chart draws, comparable (`_picture`), set by its tick: Textual repaints it when it changes."""

    def __init__(
        self, *, window_s: float = 600.0, clock: Callable[[], float] = time.time, id: str | None = None
    ) -> None:
        super().__init__(id=id)
        self.window_s = window_s
        self.clock = clock
        self.probe_hint = True
        """The empty chart names the probe's key (a replay, which has no probe, turns it off)."""
        self._buckets: dict[int, tuple[float, int]] = {}
        self._seen_total: int | None = None
        self._version = 0
        """Counts the changes of what is plotted (points, why nothing can be read)."""
        self._timer: Timer | None = None
        self.idle_at: float | None = None
        """When the server last reported no running request (its /metrics)."""
        self._line_at = -1e18
        """The newest decode line's time: the /metrics rate stands in only where lines are sparse."""
        self._trend_at = -1e18
        self.quiet_why: str | None = None
        """Why nothing can be read now (the link is down, the server does not answer), or None."""

    def reset(self) -> None:
        """Forget every point (a replay that seeks draws again from where it lands)."""
        self._buckets = {}
        self._seen_total = None
        self.idle_at = None
        self._line_at = self._trend_at = -1e18
        self._changed()

    def _changed(self) -> None:
        self._version += 1
        if self._timer is not None:
            self._timer.resume()

    @property
    def samples(self) -> list[tuple[float, float]]:
        """One (second, mean tok/s) per second that had any, oldest first."""
        return [(float(t), total / n) for t, (total, n) in sorted(self._buckets.items())]

    @samples.setter
    def samples(self, points: Sequence[tuple[float, float]]) -> None:
        self._buckets = {}
        self._add(points)

    def _add(self, points: Iterable[tuple[float, float]]) -> None:
        buckets = self._buckets
        for t, v in points:
            key = int(t)
            total, n = buckets.get(key, (0.0, 0))
            buckets[key] = (total + v, n + 1)
        horizon = self.clock() - self.window_s - 1
        if buckets and min(buckets) < horizon:
            self._buckets = {k: v for k, v in buckets.items() if k >= horizon}
        self._changed()

    def set_samples(self, points: Sequence[tuple[float, float]]) -> None:
        self._add(points)
        self._tick()

    def show(self, snap: HostSnapshot) -> None:
        why = quiet_reason(snap)
        if why != self.quiet_why:
            self.quiet_why = why
            self._changed()
        new = snap.events_total - (self._seen_total if self._seen_total is not None else 0)
        self._seen_total = snap.events_total
        fresh = snap.recent[-new:] if 0 < new <= len(snap.recent) else snap.recent if new > 0 else ()
        points = throughput_points(fresh)
        if points:
            self._line_at = max(self._line_at, max(t for t, _ in points))
        # Decode lines come every --decode-log-interval steps (rare on a slow or lightly loaded server):
        # between them, the generation rate of each scrape interval (Δ generation_tokens_total).
        for p in reversed(snap.serving_trend):
            if p.ts <= self._trend_at:
                break
            if p.gen_tok_s is not None and p.gen_tok_s > 0 and p.ts - self._line_at > SPARSE_LINES_S:
                points.append((p.ts, p.gen_tok_s))
        if snap.serving_trend:
            self._trend_at = snap.serving_trend[-1].ts
        server = snap.server
        if server is not None and server.metrics is not None and server.ts is not None:
            running = server.metrics.num_running_reqs
            busy = (running or 0) > 0
            if server.metrics.gen_throughput is not None and busy:
                points.append((server.ts, server.metrics.gen_throughput))
            if running is not None and not busy:
                # Each idle reading moves it on; what the chart says changes only when it turns "now"
                # into "idle" (its tick compares the words).
                self.idle_at = server.ts
        if points:
            self._add(points)

    def latest(self) -> Text | None:
        """The newest figure as the chart's last line says it, for a pane too short for the chart."""
        now = self.clock()
        shown = [(t, v) for t, v in self.samples if now - self.window_s <= t <= now]
        if not shown:
            return None
        return textual_text(
            Text.assemble(("gen tok/s ", axis_style()), latest_figure(shown[-1], now, self.idle_at))
        )

    def on_mount(self) -> None:
        self._timer = self.set_interval(self.REDRAW_S, self._tick)

    def _picture(self, now: float) -> tuple[object, bool]:
        """What the chart would draw now, comparable, and whether the clock alone can change it (a
        point is in the window: it moves left, then out)."""
        shown = [(t, v) for t, v in self.samples if now - self.window_s <= t <= now]
        if not shown:
            return ("empty", self.quiet_why, self.probe_hint), False
        last = shown[-1]
        words = latest_figure(last, now, self.idle_at).plain
        return (self._version, int((now - last[0]) // self.AXIS_TICK_S), words), True

    def _tick(self) -> None:
        self.picture, moving = self._picture(self.clock())
        if not moving and self._timer is not None:
            self._timer.pause()  # until new data (`_changed`)

    def render(self) -> Text:
        return textual_text(
            throughput_chart(
                self.samples,
                self.clock(),
                self.window_s,
                self.size.width,
                self.size.height,
                idle_at=self.idle_at,
                probe_hint=self.probe_hint,
                quiet_why=self.quiet_why,
            )
        )
