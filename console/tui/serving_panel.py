"""The serving panel: latency percentiles over the session's window of `/metrics` scrapes (TTFT, ITL,
end-to-end, queue time at p50/p90/p99, each with a sparkline of its p50 per scrape interval), the
requests running and queued against `max_running_requests`, and the KV tokens used against the pool
(per DP rank when the server runs DP attention). A figure the server does not export is said to be
absent, with why, never drawn as 0. Everything is read from `HostSnapshot.serving`, computed by the
session once per scrape: a repaint only formats it."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence

from rich.console import Group, RenderableType
from rich.text import Text

from console.core.serving import Latency, ServingFigures, TrendPoint
from console.core.snapshot import ConnState, HealthState, HostSnapshot
from console.core.text import terminal_safe
from console.tui.panels import Panel
from console.tui.themes import palette
from console.tui.view import fmt_duration, fmt_tokens, textual_text

LATENCIES = (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "e2e"), ("queue_time", "queue"))
TIGHT_LATENCIES = 2
"""On a tight pane (80x24) the first two latencies only: the requests running and the KV used stay in
view beside eight GPU bars, and the restart panel under them (e2e and queue are in `snapshot`)."""
SPARK = "▁▂▃▄▅▆▇█"


def fmt_seconds(value: float | None) -> str:
    """A latency in the unit that reads best: `27.5ms`, `1.20s`; `—` for none."""
    if value is None:
        return "—"
    if value < 0.01:
        return f"{value * 1000:.2f}ms"
    if value < 1:
        return f"{value * 1000:.1f}ms" if value < 0.1 else f"{value * 1000:.0f}ms"
    if value < 100:
        return f"{value:.2f}s"
    return f"{value:.0f}s"


def short_reason(reason: str) -> str:
    """The panel's few words for why a figure is absent (the help and `snapshot` say it in full)."""
    if "is exported from SGLang" in reason:
        since = reason.split("is exported from SGLang ", 1)[1].split(" on", 1)[0]
        return f"absent: SGLang < {since}"
    if "one scrape" in reason:
        return "absent: one scrape so far"
    if "no /metrics" in reason:
        return "absent: no /metrics"
    if "max_running_requests unknown" in reason:
        return "max unknown"
    if "no speculative" in reason:
        return "absent: no speculative decoding"
    if ": refused (" in reason and reason.startswith("the server sent "):
        # The value itself, so a hostile or broken server's +Inf is named, never drawn (issue 30).
        value = reason.removeprefix("the server sent ").split(" for ", 1)[0]
        return f"absent: refused {value[:12]}"
    return "absent: not exported"


def sparkline(values: Sequence[float | None], width: int) -> Text:
    """`values` (oldest first) in `width` cells: each cell the mean of its share of the points, scaled
    to the largest; a cell without a value is blank (no request in that interval), never a 0 bar."""
    if width <= 0 or not values:
        return Text("")
    cells: list[float | None] = []
    n = len(values)
    for i in range(min(width, n)):
        lo, hi = i * n // min(width, n), (i + 1) * n // min(width, n)
        got = [v for v in values[lo:hi] if v is not None]
        cells.append(sum(got) / len(got) if got else None)
    top = max((v for v in cells if v is not None), default=None)
    out = Text()
    for v in cells:
        if v is None or top is None:
            out.append(" ")
        else:
            out.append(
                SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1) + 0.5))] if top > 0 else SPARK[0]
            )
    out.stylize(palette().info)
    return out


def latency_cells(figures: ServingFigures, figure: str, compact: bool) -> list[Text]:
    """The p50, p90 and p99 cells of one latency (one cell in compact form), or its absence."""
    latency: Latency | None = getattr(figures, figure)
    if latency is None:
        reason = figures.absent.get(figure, "this server does not export it")
        return [Text(terminal_safe(short_reason(reason)), palette().faint)]
    if latency.count <= 0:
        return [Text("no requests in the window", palette().muted)]
    values = (latency.p50, latency.p90, latency.p99)
    if compact:
        return [Text("/".join(fmt_seconds(v) for v in values))]
    return [Text(fmt_seconds(v)) for v in values]


def request_line(figures: ServingFigures, compact: bool = False) -> Text:
    line = Text()
    line.append("running ", palette().muted)
    if figures.running is None:
        line.append(short_reason(figures.absent.get("running", "")), palette().faint)
    else:
        line.append(f"{figures.running:.0f}")
        if figures.max_running is not None:
            limit = f"/{figures.max_running:.0f}" if compact else f" / {figures.max_running:.0f} max"
            line.append(limit, palette().muted)
            if figures.running >= figures.max_running:
                line.stylize(palette().warn, 8)
    line.append("  queued ", palette().muted)
    if figures.queued is None:
        line.append(short_reason(figures.absent.get("queued", "")), palette().faint)
    else:
        line.append(f"{figures.queued:.0f}", palette().warn if figures.queued > 0 else "")
    return line


def kv_line(figures: ServingFigures, compact: bool) -> Text:
    line = Text()
    line.append("KV " if compact else "KV used ", palette().muted)
    if figures.kv_used is None:
        line.append(short_reason(figures.absent.get("kv_used", "")), palette().faint)
        return line
    line.append(fmt_tokens(figures.kv_used))
    if figures.kv_pool is not None:
        line.append(f" / {fmt_tokens(figures.kv_pool)}", palette().muted)
        if figures.kv_pool > 0:
            line.append(f" ({figures.kv_used / figures.kv_pool:.1%})")
    elif not compact:
        line.append(" / pool ", palette().muted)
        line.append(short_reason(figures.absent.get("kv_pool", "")), palette().faint)
    if figures.full_pool is not None and figures.full_pool != "kv" and figures.token_usage is not None:
        line.append(f"  fullest {figures.full_pool} {figures.token_usage:.0%}", palette().warn)
    return line


POOL_NAMES = {"swa": "SWA", "mamba": "mamba"}


def pool_lines(figures: ServingFigures, compact: bool) -> list[Text]:
    """A line per pool beside the full one (`kv_line`): `SWA used 20k / 342k (5.8%)`, `mamba used 42%`
    (0.5.9-0.5.10 export the fraction only; a mamba pool counts slots)."""
    lines = []
    for p in figures.pools:
        if p.name == "kv":
            continue
        label = POOL_NAMES.get(p.name, p.name)
        line = Text(f"{label} " if compact else f"{label} used ", palette().muted)
        if p.used is None:
            line.append(f"{p.usage:.1%}", palette().warn if p.usage >= 0.9 else "")
        else:
            line.append(fmt_tokens(p.used))
            share = p.usage
            if p.capacity:
                line.append(f" / {fmt_tokens(p.capacity)}", palette().muted)
                share = p.used / p.capacity  # as `kv_line`: of all DP ranks' pools, not the fullest one's
            line.append(f" ({share:.1%})", palette().warn if p.usage >= 0.9 else "")
        lines.append(line)
    return lines


def transfer_line(figures: ServingFigures) -> Text | None:
    """PD disaggregation's KV transfers: `KV xfer p99 45.0ms · 13.33 GB/s (3 in the window)`, or the
    newest transfer's gauges from 0.5.2-0.5.9 (`last 11.5ms · 18.25 GB/s`)."""
    t = figures.kv_transfer
    if t is None:
        return None
    line = Text("KV xfer ", palette().muted)
    said = []
    if t.read == "last":
        if t.latency_ms is not None:
            said.append(f"last {fmt_seconds(t.latency_ms / 1000)}")
    elif t.latency_p99_ms is not None:
        said.append(f"p99 {fmt_seconds(t.latency_p99_ms / 1000)}")
    if t.speed_gb_s is not None:
        said.append(f"{t.speed_gb_s:.2f} GB/s")
    if not said:
        why = "no transfer in the window" if t.transfers == 0 else "absent: one scrape so far"
        line.append(why, palette().faint)
        return line
    line.append(" · ".join(said))
    if t.transfers is not None:
        line.append(f" ({t.transfers:.0f} in the window)", palette().muted)
    return line


def hicache_line(figures: ServingFigures) -> Text | None:
    """The hierarchical cache's host pool: `hicache host 240k / 2.00M (12%)`."""
    h = figures.hicache
    if h is None or (h.host_used_tokens is None and h.host_total_tokens is None):
        return None
    line = Text("hicache host ", palette().muted)
    line.append(fmt_tokens(h.host_used_tokens))
    if h.host_total_tokens is not None:
        line.append(f" / {fmt_tokens(h.host_total_tokens)}", palette().muted)
        if h.host_used_tokens is not None and h.host_total_tokens > 0:
            line.append(f" ({h.host_used_tokens / h.host_total_tokens:.0%})")
    if h.load_back_tok_s is not None:
        line.append(f"  load back {fmt_tokens(h.load_back_tok_s)} tok/s", palette().muted)
    return line


def read_as_note(figures: ServingFigures) -> Text | None:
    """Which older names (or units) the newest scrape was read as: `read as today's: name= → model_name=,
    num_requests_running → num_running_reqs, …`; an `sglang_` re-export is one item."""
    if not figures.read_as:
        return None

    def short(name: str) -> str:
        return name.removeprefix("sglang:").removeprefix("label ").replace('"…"', "")

    items = []
    underscore = [k for k, v in figures.read_as.items() if k.startswith("sglang_") and v == f"sglang:{k[7:]}"]
    if underscore:
        items.append(f"sglang_* → sglang:* ({len(underscore)} famil{'y' if len(underscore) == 1 else 'ies'})")
    for old, new in figures.read_as.items():
        if old in underscore:
            continue
        if new.startswith(("sglang:", "label ")):
            items.append(f"{short(old)} → {short(new)}")
        else:
            items.append(f"{short(old)} ({new})")
    return Text("read as: " + ", ".join(items), palette().faint)


def rank_line(figures: ServingFigures) -> Text:
    line = Text()
    for r in figures.kv_ranks:
        name = f"DP{r.dp_rank}" if r.dp_rank is not None else "DP?"
        pct = f" {r.used / r.pool:.0%}" if r.used is not None and r.pool else ""
        line.append(f"{name} ", palette().muted)
        line.append(f"{fmt_tokens(r.used)}{pct}  ")
    return line


LABEL_W = 6
CELL_W = 8
COMPACT_CELLS_W = 21

STALE_INTERVALS = 3
"""The figures are stale once the newest scrape is older than this many scrape intervals..."""
STALE_MIN_S = 10.0
"""...and than this: one scrape that times out (twice the interval) must not flash the panel."""
DEFAULT_INTERVAL_S = 2.0


def scrape_interval(trend: Sequence[TrendPoint]) -> float:
    """The session's scrape interval, read from the window (the median spacing of its newest points)."""
    stamps = [p.ts for p in trend[-11:]]
    gaps = sorted(b - a for a, b in itertools.pairwise(stamps) if b > a)
    return gaps[len(gaps) // 2] if gaps else DEFAULT_INTERVAL_S


def staleness(snap: HostSnapshot, now: float) -> str | None:
    """Why the panel's figures are not live, with their age, or None while they are: the newest
    `/metrics` scrape is more than a few intervals old, or the link or the server is down (the last
    good figures stay on screen, marked, rather than read as the server's current state)."""
    serving = snap.serving
    if serving is None or serving.as_of is None:
        return None
    age = max(0.0, now - serving.as_of)
    why = None
    if snap.connection is not None and snap.connection.state is not ConnState.UP:
        why = f"link {snap.connection.state.value}"
    elif snap.server is not None and snap.server.health in (HealthState.DOWN, HealthState.STARTING):
        why = "server down" if snap.server.health is HealthState.DOWN else "server starting"
    if why is None and age <= max(STALE_INTERVALS * scrape_interval(snap.serving_trend), STALE_MIN_S):
        return None
    shown = f"{int(age)}s" if age < 60 else fmt_duration(age)
    return f"⚠ stale {shown}: the last /metrics reading" + (f", {why}" if why else "")


def serving_body(
    figures: ServingFigures,
    trend: Sequence[TrendPoint],
    width: int,
    *,
    compact: bool,
    stale: str | None = None,
    tight: bool = False,
) -> RenderableType:
    """The panel's lines for a `width`-cell column: fixed columns, so that the figures line up and an
    absent figure's words never squeeze the others. `stale`: the figures are old (`staleness`): said
    on the first line, and every figure drawn faint."""
    cells_w = COMPACT_CELLS_W if compact else 3 * CELL_W
    spark_w = width - LABEL_W - cells_w - 1
    lines: list[RenderableType] = []
    if not compact:
        # The percentiles are over what the window really covers so far (a fresh console has seconds
        # of it), said after the columns, not as one of them: `window p50 p90 p99 6 s: p50 per scrape`
        # read as a fourth figure.
        covered = figures.covered_s if figures.covered_s is not None else figures.window_s
        span = f"{covered / 60:.0f} min" if covered >= 90 else f"{covered:.0f} s"
        window = f"{figures.window_s / 60:g} min" if figures.window_s >= 90 else f"{figures.window_s:g} s"
        so_far = f" (of {window})" if covered < figures.window_s * 0.95 else ""
        # (a line's leading blanks are dropped: it starts with a word, the time the columns cover)
        head = Text(span.ljust(LABEL_W), palette().muted)
        for q in ("p50", "p90", "p99"):
            head.append(q.rjust(CELL_W), palette().muted)
        said = ""
        for unit in (so_far, " · p50 trend"):  # whole, or not at all: "p50 tren" read as a typo
            if unit and len(said + unit) <= spark_w + 1:
                said += unit
        head.append(said, palette().muted)
        lines.append(head)
    for figure, label in LATENCIES[:TIGHT_LATENCIES] if tight else LATENCIES:
        line = Text(label.ljust(LABEL_W), palette().muted)
        cells = latency_cells(figures, figure, compact)
        latency: Latency | None = getattr(figures, figure)
        if latency is None or latency.count <= 0:
            line.append_text(cells[0])  # absent, or no request: said once, across the columns
        else:
            for cell in cells:
                cell.align("right", cells_w if compact else CELL_W)
                line.append_text(cell)
            if spark_w >= 4:
                line.append(" ")
                line.append_text(sparkline([p.p50.get(figure) for p in trend], spark_w))
        lines.append(line)
    lines.append(request_line(figures, compact))
    lines.append(kv_line(figures, compact))
    if figures.kv_ranks:
        lines.append(rank_line(figures))
    lines.extend(pool_lines(figures, compact))
    if not tight:
        # Seldom there (PD disaggregation, the hierarchical cache, an older server): below the 80x24 pane.
        lines.extend(x for x in (transfer_line(figures), hicache_line(figures), read_as_note(figures)) if x)
    if figures.refused:
        # Values out of range the server sent (NaN, +Inf, negative): named, never drawn (issue 30).
        said = ", ".join(
            f"{family.removeprefix('sglang:')} {value}" for family, value in figures.refused.items()
        )
        lines.append(Text(f"refused from /metrics: {said}", palette().bad))
    if stale is not None:
        for part in lines:
            if isinstance(part, Text):
                part.stylize(palette().faint)  # over every figure's own colour
        lines.insert(0, Text(stale, palette().style("warn", bold=True)))
    for part in lines:
        if isinstance(part, Text):
            part.no_wrap = True
            part.overflow = "ellipsis"
    return textual_text(Group(*lines))


class ServingPanel(Panel):
    HELP = """\
[b]Serving[/b] — how the server serves, over the console's window of /metrics scrapes (5 minutes).

[b]TTFT[/b] time to first token, [b]ITL[/b] inter-token latency, [b]e2e[/b] request latency, [b]queue[/b]
time in the queue: p50 / p90 / p99 of the window's requests, read from SGLang's histograms
(docs/serving.md); the sparkline is each scrape interval's p50 over the window, blank where no
request ended. [b]running / queued[/b] against --max-running-requests (from /server_info), [b]KV used[/b]
against the pool, per DP rank with DP attention, then the sliding-window and mamba pools where the server
exports them; [b]KV xfer[/b] a PD server's KV transfers (p99 latency and GB/s over the window, or the last
transfer on 0.5.2-0.5.9), [b]hicache[/b] the hierarchical cache's host pool, and, faint, which older
metric names or units the scrape was [b]read as[/b] today's. A figure this server does not export says
[b]absent[/b] and why (too old an SGLang, metrics off): never 0.
When the newest /metrics reading is older than three scrape intervals (10 s at least), or the link or
the server is down, the figures are the last good ones: drawn faint under [b]stale[/b] and their age."""

    def __init__(
        self, *, clock: Callable[[], float] = time.time, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.clock = clock
        self._stale: str | None = None

    def on_mount(self) -> None:
        # The figures age with the clock when no snapshot comes (the link is down, the session stuck).
        self.set_interval(1.0, self._tick)

    def _tick(self) -> None:
        snap = self.snap
        if snap is not None and staleness(snap, self.clock()) != self._stale:
            self.show(snap)

    _made: tuple[object, object, RenderableType | None, object] | None = None
    """What the panel last made: its key (`_key`), the view and the body made from it (None once drawn),
    and the figures they were made of."""
    tight = False
    """A pane too short for every latency (`TIGHT_LATENCIES`), set by the dashboard."""

    def set_tight(self, tight: bool) -> None:
        if tight != self.tight:
            self.tight = tight
            if self.snap is not None:
                self.show(self.snap)

    def restyle(self) -> None:
        self._made = None  # the body is coloured in the old theme
        super().restyle()

    def on_resize(self) -> None:
        if self.snap is not None:
            self.show(self.snap)

    def _key(self, snap: HostSnapshot, stale: str | None) -> tuple[object, ...]:
        # The session computes the figures once per scrape and hands the same object until the next.
        return (
            id(snap.serving),
            snap.serving_trend[-1].ts if snap.serving_trend else None,
            self.content_region.width,
            self.compact,
            self.tight,
            stale,
        )

    def view_of(self, snap: HostSnapshot) -> object:
        # The panel's text: a snapshot that brings no new scrape costs nothing, and a new scrape that
        # changes no printed figure (an idle server) repaints nothing either.
        serving = snap.serving
        self._stale = stale = staleness(snap, self.clock())
        key = self._key(snap, stale)
        made = self._made
        if made is not None and made[0] == key:
            return made[1]
        width = self.content_region.width
        view: tuple[object, ...]
        if serving is None:
            body, view = None, ("none", self.compact)
        else:
            body = serving_body(
                serving,
                snap.serving_trend,
                max(10, width),
                compact=self.compact,
                stale=stale,
                tight=self.tight,
            )
            lines = body.renderables if isinstance(body, Group) else [body]
            view = (
                self.compact,
                width,
                tuple(line.plain if isinstance(line, Text) else id(line) for line in lines),
            )
        self._made = (key, view, body, serving)  # holds the figures: their id is not reused while compared
        return view

    def extent_of(self, view: object) -> object:
        assert isinstance(view, tuple)
        return (view[0], len(view[2]) if len(view) > 2 else 0)

    def render(self) -> RenderableType:
        # A console in an 80-column tmux pane once failed in layout with this panel's render() returning
        # None (tests/test_tui_pairing_tmux.py, 2 runs of 4; the cause was not found): never hand Textual
        # None, whatever the path.
        body = self._body_now()
        return body if body is not None else textual_text(Text("no server reading yet", palette().muted))

    def _body_now(self) -> RenderableType | None:
        snap = self.snap
        if snap is None or snap.serving is None:
            return textual_text(Text("no server reading yet", palette().muted))
        made = self._made
        if made is not None and made[2] is not None and made[0] == self._key(snap, self._stale):
            # drawn once: a Group's Texts are styled as they are drawn, so a second draw makes them again
            self._made = (made[0], made[1], None, made[3])
            return made[2]
        width = max(10, self.content_region.width)
        return serving_body(
            snap.serving, snap.serving_trend, width, compact=self.compact, stale=self._stale, tight=self.tight
        )
