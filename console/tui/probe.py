"""The probe screen and charts.

- `ProbePanel`: the depths to fire, progress and live tok/s while a probe decodes, the results table and
  the sweep's tok/s-against-depth curve beside earlier runs. It only draws: whoever hosts it starts the
  probe when it posts `ProbePanel.Fire`, stops it on `ProbePanel.Cancel`, and feeds it progress.
- `ProbeScreen(session_or_host, transport=..., profile=...)`: hosts the panel and runs the probe through
  the host's SSH transport (a worker; Esc or the Cancel button cancels it, which aborts the request).

Charts are drawn with plotext (its `build()` output, without colour) and coloured here by marker, so they
look the same in every theme and in snapshots.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Button, Input, Label
from textual.worker import Worker

from console.core.pairing import Identity
from console.core.probe import (
    ProbePhase,
    ProbeProgress,
    ProbeReport,
    ProbeResult,
    ProbeStatus,
    fmt_depth,
    fmt_pct,
    parse_depths,
)
from console.core.probe_history import Curve, report_curve
from console.sources.profile_store import ProfileStore
from console.tui.footer import KeyFooter
from console.tui.plot import axis_style, current_style, earlier_styles, plot_text
from console.tui.themed import Painted
from console.tui.themes import palette
from console.tui.view import textual_text


def depth_chart(current: Curve | None, earlier: Sequence[Curve], width: int, height: int) -> Text:
    """tok/s against depth: this run in green blocks, up to three earlier runs with their own markers.
    A log scale when the curve spans more than a decade (decode at 185k can be 50x slower than at 8k)."""
    markers = earlier_styles()
    curves = [c for c in earlier[-len(markers) :] if c.points]
    plotted = ([current] if current and current.points else []) + curves
    if not plotted:
        return Text("No depth measured yet: fire a probe to draw tok/s against depth.", palette().muted)
    values = [v for c in plotted for _, v in c.points if v > 0]
    log = bool(values) and max(values) / min(values) > 10
    styles: dict[str, Style] = {"hd": current_style()}
    for (marker, style), _curve in zip(markers, curves, strict=False):
        styles[marker] = style

    def build(fig: Any) -> None:
        for (marker, _style), curve in zip(markers, curves, strict=False):
            xs = [d / 1000 for d, _ in curve.points]
            fig.draw(fig.signal(xs, [v for _, v in curve.points], marker=marker).lines())
        if current and current.points:
            xs = [d / 1000 for d, _ in current.points]
            fig.draw(fig.signal(xs, [v for _, v in current.points]).lines())
        fig.label("depth (k tokens)", "x")
        if log:
            fig.ruler("y").scale("log")

    chart = plot_text(build, width, height - 1, styles)
    legend = Text("\n")
    legend.append("tok/s  ", axis_style())
    if current and current.points:
        legend.append("▚ " + current.label, current_style())
    for (marker, style), curve in zip(markers, curves, strict=False):
        legend.append("   ")
        legend.append(f"{marker} {curve.label}", style)
    return chart + legend


class DepthChart(Widget):
    """The plotext curve, redrawn at the widget's size."""

    DEFAULT_CLASSES = "probe-chart"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.current: Curve | None = None
        self.earlier: list[Curve] = []

    def plot(self, current: Curve | None, earlier: Sequence[Curve]) -> None:
        self.current, self.earlier = current, list(earlier)
        self.refresh()

    def render(self) -> Text:
        return textual_text(depth_chart(self.current, self.earlier, self.size.width, self.size.height))


# ------------------------------------------------------------------------------------------------
# the panel
# ------------------------------------------------------------------------------------------------


def _num(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def target_line(report: ProbeReport | None) -> str:
    if report is None:
        return ""
    t = report.target
    card = t.gpu_name.removeprefix("NVIDIA ") if t.gpu_name else "unknown GPU"
    peak = "peak unknown"
    if t.peak_bandwidth_gbs:
        whence = {"nvml": " peak from NVML", "table": " peak from the bandwidth table"}.get(
            t.peak_from or "", ""
        )
        peak = f"{t.peak_bandwidth_gbs:,.0f} GB/s{whence}"
    cell = f"{t.kv_bytes_per_token_per_gpu:,} B" if t.kv_bytes_per_token_per_gpu else "unknown"
    return f"{t.model or 'unknown model'} on {t.gpu_count or '?'}x {card} ({peak}); KV/token/GPU {cell}"


def results_table(
    rows: Sequence[tuple[int, ProbeResult | None]], live: ProbeProgress | None, title: str = ""
) -> Table:
    table = Table(
        box=None,
        pad_edge=False,
        expand=False,
        header_style="bold",
        title=title or None,
        title_justify="left",
        title_style=palette().muted,
    )
    for name, justify in (
        ("depth", "right"),
        ("tokens", "right"),
        ("TTFT s", "right"),
        ("tok/s", "right"),
        ("ITL p50", "right"),
        ("ITL p99", "right"),
        ("KV GB/s", "right"),
        ("of peak", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for depth, result in rows:
        if result is None:
            if live is not None and live.depth == depth and live.phase is ProbePhase.DECODING:
                table.add_row(
                    fmt_depth(depth),
                    f"{live.tokens}/{live.requested_tokens}",
                    _num(live.ttft_s, ".2f"),
                    Text(_num(live.live_tok_s, ".2f"), palette().style("warn", bold=True)),
                    "",
                    "",
                    "",
                    "",
                )
            elif live is not None and live.depth == depth and live.phase is ProbePhase.PREFILL:
                table.add_row(fmt_depth(depth), Text("prefill…", palette().warn), "", "", "", "", "", "")
            else:
                table.add_row(fmt_depth(depth), Text("waiting", palette().faint), "", "", "", "", "", "")
            continue
        if result.status is not ProbeStatus.OK:
            style = palette().warn if result.status is ProbeStatus.REFUSED else palette().bad
            table.add_row(fmt_depth(depth), Text(result.status.value, style), "", "", "", "", "", "")
            continue
        pct = result.bandwidth_pct
        pct_text = Text(fmt_pct(pct) if pct is not None else "—")
        if result.verdict.value == "attention_bound":
            pct_text.stylize(palette().style("bad", bold=True))
        table.add_row(
            fmt_depth(depth),
            str(result.output_tokens),
            _num(result.ttft_s, ".2f"),
            _num(result.decode_tok_s, ".2f"),
            _num(result.itl_p50_s, ".3f"),
            _num(result.itl_p99_s, ".3f"),
            _num(result.effective_kv_bandwidth_gbs, ".1f"),
            pct_text,
        )
    return table


class ProbePanel(Vertical, can_focus=False):
    """Depths to fire, progress, the results table and the curve. Draws only; see the module docstring."""

    HELP = (
        "[b]Long-context probe[/b]\nOne streamed /generate of N random token ids per depth, exactly M new "
        "tokens. TTFT, decode tok/s, inter-token latency, and the KV read bandwidth decode achieved against "
        "the card's peak. A depth beyond the context length or the KV pool is refused before anything is "
        "sent. Enter fires, the Cancel button or Esc stops a running probe (the server aborts the request)."
    )

    class Fire(Message):
        def __init__(self, depths: list[int], tokens: int) -> None:
            super().__init__()
            self.depths = depths
            self.tokens = tokens

    class Cancel(Message):
        pass

    def __init__(self, *, depths: str = "8k,64k,185k", tokens: int = 32, id: str | None = None) -> None:
        super().__init__(id=id)
        self.default_depths = depths
        self.default_tokens = tokens
        self.rows: list[tuple[int, ProbeResult | None]] = []
        self.live: ProbeProgress | None = None
        self.report: ProbeReport | None = None
        self.earlier: list[Curve] = []
        self.running = False
        self._say: Callable[[], Text] = lambda: Text("Ready: Enter or Fire sends the probe.", palette().muted)

    def compose(self) -> ComposeResult:
        with Horizontal(id="probe-controls"):
            yield Label("depths", classes="probe-label")
            yield Input(self.default_depths, id="probe-depths", placeholder="8k,64k,185k")
            yield Label("new tokens", classes="probe-label")
            yield Input(str(self.default_tokens), id="probe-tokens", type="integer")
            yield Button("Fire", id="probe-fire", variant="primary")
            yield Button("Cancel", id="probe-cancel", variant="error", disabled=True)
        # Painted: made again in the new theme when it changes (console/tui/themes.py).
        yield Painted(self._say, id="probe-status")
        with Horizontal(id="probe-body"):
            yield Painted(id="probe-table")
            yield DepthChart(id="probe-chart")
        yield Painted(id="probe-notes")

    @property
    def status(self) -> Text:
        """What the panel says, in the theme in force."""
        return self._say()

    # ---- input ----------------------------------------------------------------------------------

    def _request(self) -> None:
        if self.running:
            return
        try:
            depths = parse_depths(self.query_one("#probe-depths", Input).value)
        except ValueError as exc:
            self.show_error(str(exc))
            return
        raw = self.query_one("#probe-tokens", Input).value.strip()
        if not raw.isdigit() or not 0 < int(raw) <= 4096:
            self.show_error("new tokens must be a whole number from 1 to 4096")
            return
        self.post_message(self.Fire(depths, int(raw)))

    @on(Button.Pressed, "#probe-fire")
    def _fire_pressed(self) -> None:
        self._request()

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self._request()

    @on(Button.Pressed, "#probe-cancel")
    def _cancel_pressed(self) -> None:
        if self.running:
            self.post_message(self.Cancel())

    # ---- what the host says -----------------------------------------------------------------------

    def set_running(self, running: bool) -> None:
        self.running = running
        if not self.is_mounted:
            return
        self.query_one("#probe-fire", Button).disabled = running
        self.query_one("#probe-cancel", Button).disabled = not running

    def start_run(self, depths: Sequence[int], tokens: int) -> None:
        self.rows = [(d, None) for d in depths]
        self.live = None
        self.report = None
        self.set_running(True)
        self._status(
            lambda: Text(f"Probing {len(depths)} depth(s), {tokens} new tokens each…", palette().warn)
        )
        self._draw()

    def show_progress(self, p: ProbeProgress) -> None:
        self.live = p
        if p.result is not None and p.index < len(self.rows):
            self.rows[p.index] = (p.depth, p.result)
        self._status(lambda: progress_text(p))
        self._draw()

    def show_report(self, report: ProbeReport, earlier: Sequence[Curve] | None = None) -> None:
        self.report = report
        self.rows = [(r.depth, r) for r in report.results]
        self.live = None
        if earlier is not None:
            self.earlier = list(earlier)
        self.set_running(False)
        self._status(lambda: Text(report.summary(), palette().ok if report.ok else palette().warn))
        self._draw()

    def set_earlier(self, curves: Sequence[Curve]) -> None:
        self.earlier = list(curves)
        self._draw()

    def show_error(self, sentence: str) -> None:
        self.set_running(False)
        self._status(lambda: Text(sentence.rstrip(".") + ".", palette().style("bad", bold=True)))

    def _status(self, say: Callable[[], Text]) -> None:
        self._say = say
        if self.is_mounted:
            self.query_one("#probe-status", Painted).paint(say)

    def _draw(self) -> None:
        if not self.is_mounted:
            # A probe cancelled as its screen closes still reports; there is nothing left to draw on.
            return
        rows, live, report, title = list(self.rows), self.live, self.report, target_line(self.report)
        self.query_one("#probe-table", Painted).paint(lambda: results_table(rows, live, title))
        current = None
        if self.report is not None:
            current = report_curve(self.report)
        else:
            done = [(d, r.decode_tok_s) for d, r in self.rows if r is not None and r.decode_tok_s]
            current = Curve(label="this run", points=sorted(done)) if done else None
        self.query_one("#probe-chart", DepthChart).plot(current, self.earlier)
        self.query_one("#probe-notes", Painted).paint(lambda: notes_text(rows, report))


def progress_text(p: ProbeProgress) -> Text:
    where = f"[{p.index + 1}/{p.total}] {fmt_depth(p.depth)}"
    if p.phase is ProbePhase.PREFILL:
        return Text(f"{where}: prefill of {p.depth:,} tokens…", palette().warn)
    if p.phase is ProbePhase.DECODING:
        line = Text(f"{where}: decoding {p.tokens}/{p.requested_tokens}", palette().warn)
        if p.live_tok_s is not None:
            line.append(f"   {p.live_tok_s:.2f} tok/s live", palette().style("warn", bold=True))
        if p.ttft_s is not None:
            line.append(f"   TTFT {p.ttft_s:.2f} s", palette().muted)
        return line
    if p.phase is ProbePhase.DONE and p.result is not None:
        return Text(f"{where}: {p.result.diagnosis}", palette().ok)
    return Text(f"{where}: {p.phase.value}: {p.detail or ''}", palette().bad)


def notes_text(rows: Sequence[tuple[int, ProbeResult | None]], report: ProbeReport | None) -> Text:
    """Each depth's diagnosis, then the sweep's: attention-bound ones stand out."""

    def style(verdict: str) -> Style:
        return palette().style("bad", bold=True) if verdict == "attention_bound" else palette().muted

    notes = Text()
    for depth, result in rows:
        if result is not None:
            notes.append(f"{fmt_depth(depth)}: {result.diagnosis}\n", style(result.verdict.value))
    if report is not None and report.fit is not None:
        notes.append(f"sweep: {report.fit.diagnosis}", style(report.fit.verdict.value))
    return notes


# ------------------------------------------------------------------------------------------------
# the screen
# ------------------------------------------------------------------------------------------------


class ProbeScreen(Screen[None]):
    """The probe for one host. `source` is a `HostSession` (its host and transport are used) or a
    `HostConfig` with `transport=`; `profile` names the profile whose `[verified]` keeps the results.

    With `profile_check` (`await profile_check(name)`: None when the host runs that profile, else why
    not), the results go into the profile only when it is what runs; otherwise to the history alone."""

    BINDINGS = [Binding("escape", "close", "Cancel / close")]  # noqa: RUF012

    def __init__(
        self,
        source: Any,
        *,
        transport: Any = None,
        profile: str | None = None,
        store: ProfileStore | None = None,
        profile_check: Callable[[str], Awaitable[str | None]] | None = None,
        history: Path | None = None,
        depths: str = "8k,64k,185k",
        tokens: int = 32,
        prober_options: dict[str, Any] | None = None,
        me: Identity | None = None,
    ) -> None:
        super().__init__()
        host = getattr(source, "host", source)
        self.host = host
        self.transport = transport if transport is not None else getattr(source, "transport", None)
        self.profile = profile
        self.store = store
        self.profile_check = profile_check
        self.not_in_force: str | None = None
        """Why the results will not go into the profile (it is not what runs), once checked."""
        self.profile_checked = False
        self.history = history
        self.prober_options = dict(prober_options or {})
        self.me = me
        """Who the audit trail says probed (default: the local login)."""
        self.panel = ProbePanel(depths=depths, tokens=tokens, id="probe-panel")
        self._worker: Worker[None] | None = None

    def compose(self) -> ComposeResult:
        yield Painted(self._title, id="probe-title")
        yield self.panel
        yield KeyFooter()

    def _title(self) -> Text:
        title = Text(f"Probe {self.host.name}", "bold")
        if self.profile and self.not_in_force:
            title.append(f"   results to the history only, not to {self.profile}", palette().warn)
            title.append(f"\n{self.not_in_force[:1].upper()}{self.not_in_force[1:]}.", palette().warn)
        elif self.profile:
            title.append(f"   profile {self.profile}", palette().muted)
        return title

    def on_mount(self) -> None:
        self.run_worker(self._load_earlier(), group="probe-history")
        if self.profile and self.profile_check is not None:
            self.run_worker(self._check_profile(), group="probe-profile")
        self.panel.query_one("#probe-depths", Input).focus()

    async def _check_profile(self) -> str | None:
        """The profile the results go into: `self.profile` when it is what the host runs, else None."""
        if not self.profile or self.profile_check is None:
            return self.profile
        self.not_in_force = await self.profile_check(self.profile)
        self.profile_checked = True
        if self.is_mounted:
            self.query_one("#probe-title", Painted).paint(self._title)
        return None if self.not_in_force else self.profile

    async def _earlier(self, exclude: str | None = None) -> list[Curve]:
        from console.core.probe_history import curves_from_history
        from console.sources.probe_history import load_history

        records = await asyncio.to_thread(load_history, self.history, host=self.host.name)
        curves = curves_from_history(records, self.host.name, exclude_run=exclude)
        if self.profile:
            with contextlib.suppress(Exception):
                prof = await asyncio.to_thread((self.store or ProfileStore()).load, self.profile)
                if prof.verified and prof.verified.tok_s_at_depth:
                    points = sorted(prof.verified.tok_s_at_depth.items())
                    curves.append(Curve(label=f"{self.profile} verified", points=points))
        return curves

    async def _load_earlier(self) -> None:
        self.panel.set_earlier(await self._earlier())

    @on(ProbePanel.Fire)
    def _fire(self, message: ProbePanel.Fire) -> None:
        if self._worker is not None and self._worker.is_running:
            return
        self.panel.start_run(message.depths, message.tokens)
        self._cancel_seen = None
        self._worker = self.run_worker(
            self._probe(message.depths, message.tokens), group="probe", exclusive=True
        )

    CANCEL_CHECK_S = 2.0
    _cancel_seen: int | None = None
    """Tokens decoded on screen when Cancel was asked (-1: not decoding); None: no cancel pending."""

    @on(ProbePanel.Cancel)
    def _cancel(self) -> None:
        worker = self._worker
        if worker is not None and worker.is_running:
            worker.cancel()
            self._cancel_seen = self._decoded()
            self.set_timer(self.CANCEL_CHECK_S, self._check_cancelled)

    def _decoded(self) -> int:
        live = self.panel.live
        return live.tokens if live is not None and live.phase is ProbePhase.DECODING else -1

    def _check_cancelled(self) -> None:
        """A probe still decoding after Cancel never got it: ask again. Seen once in a full-suite run
        (the probe decoded on for a minute). The cause found later: the decode loop waited for each
        token with 3.11's `asyncio.wait_for`, which drops a cancel landing in the turn a token arrived;
        it now uses `asyncio.timeout`. This stays as the guard against any other swallowed cancel (a
        cancel scope inside httpx, anyio#1214). A probe that stopped decoding is closing its stream, and
        is left alone: a second cancel there cuts the close short and the server generates on for
        nobody."""
        worker = self._worker
        if worker is None or not worker.is_running or self._cancel_seen is None:
            self._cancel_seen = None
            return
        decoded = self._decoded()
        if decoded > self._cancel_seen:
            worker.cancel()
        self._cancel_seen = decoded
        self.set_timer(self.CANCEL_CHECK_S, self._check_cancelled)

    async def _probe(self, depths: list[int], tokens: int) -> None:
        from console.sources.probe import ProbeError, audit_probe, keep_report, open_prober
        from console.sources.server import ServerError
        from console.sources.transport import TransportError

        try:
            # Checked again at each run: the host may have been restarted with other flags meanwhile.
            keep_in = await self._check_profile()
            async with open_prober(self.host, transport=self.transport, **self.prober_options) as prober:
                started = time.monotonic()
                report = await prober.sweep(
                    depths, tokens, profile=keep_in, on_progress=self.panel.show_progress
                )
                if prober.transport is not None:
                    trouble = await audit_probe(
                        prober.transport,
                        self.host,
                        report,
                        time.monotonic() - started,
                        me=self.me,
                        store=self.store,
                    )
                    if trouble:
                        self.notify(trouble, severity="warning")
            try:
                await asyncio.to_thread(keep_report, report, history=self.history, store=self.store)
            except Exception as exc:  # a full disk must not lose the run on screen
                self.notify(f"The results could not be kept: {exc}", severity="warning")
            self.panel.show_report(report, await self._earlier(exclude=report.run_id))
        except (ProbeError, ServerError, TransportError) as exc:
            self.panel.show_error(str(exc))
        except asyncio.CancelledError:
            self.panel.set_running(False)
            raise

    def action_close(self) -> None:
        if self._worker is not None and self._worker.is_running:
            self._worker.cancel()
            return
        self.dismiss(None)


__all__ = [
    "DepthChart",
    "ProbePanel",
    "ProbeScreen",
    "depth_chart",
    "results_table",
]
