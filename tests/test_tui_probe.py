"""The probe panel and charts: snapshots of a finished sweep (inputs, times and randomness pinned), and the
probe screen driven with Pilot against a twin over SSH: fire, watch, cancel, and a server that dies."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Button, Input

from console.core.parser import parse_lines
from console.core.probe import (
    ProbePhase,
    ProbeProgress,
    ProbeReport,
    ProbeStatus,
    ServerLimits,
    refusal,
    refused_result,
    summarize,
    sweep_fit,
)
from console.core.probe_history import Curve, throughput_points
from console.sources.hosts import HostConfig
from console.sources.probe_history import load_history
from console.tui.app import css_paths
from console.tui.probe import DepthChart, ProbePanel, ProbeScreen, depth_chart
from console.tui.throughput import ThroughputChart, throughput_chart
from tests.test_probe_core import kimi_target, steady
from tests.test_probe_twin import host_of, start_twin
from tests.tui_support import CORPUS

SIZE = (150, 42)
WHEN = datetime(2026, 5, 30, 22, 30, tzinfo=UTC)


def incident_tok_s(depth: int) -> float:
    return 1 / (0.025 + depth * 70_272 * 2 / (1.8e12 * 0.0103))


def finished_sweep() -> ProbeReport:
    """8k, 64k, 185k measured on the incident host at f = 0.94; 200k refused by the context length."""
    target = kimi_target()
    limits = ServerLimits(context_len=200_000, pool_tokens=218_484, max_req_input_len=199_994)
    results = [
        summarize(steady(d, d / 9000 + 0.05, incident_tok_s(d), 8), target) for d in (8_000, 64_000, 185_000)
    ]
    reason = refusal(200_000, 8, limits)
    assert reason is not None
    results.append(refused_result(200_000, 8, reason, target))
    return ProbeReport(
        host="gpu1",
        profile="ctx-200k",
        run_id="pinned-run",
        started_at=WHEN,
        target=target,
        limits=limits,
        requested_tokens=8,
        results=results,
        fit=sweep_fit(results, target),
    )


EARLIER = [
    Curve(label="05-29 18:02 ctx-128k", points=[(8_000, 12.4), (64_000, 2.3), (128_000, 1.05)]),
    Curve(label="05-30 22:14 ctx-200k", points=[(8_000, 11.2), (64_000, 1.9), (185_000, 0.66)]),
]


class PanelApp(App[None]):
    CSS_PATH = css_paths()  # type: ignore[assignment]

    def compose(self) -> ComposeResult:
        yield ProbePanel(id="probe-panel")

    def on_mount(self) -> None:
        self.query_one(ProbePanel).show_report(finished_sweep(), EARLIER)


def test_probe_panel_with_a_finished_sweep(snap_compare) -> None:
    assert snap_compare(PanelApp(), terminal_size=SIZE)


class ThroughputApp(App[None]):
    CSS_PATH = css_paths()  # type: ignore[assignment]

    def compose(self) -> ComposeResult:
        lines = (CORPUS / "case-26.log").read_text().splitlines()
        points = throughput_points(parse_lines(lines))
        now = points[-1][0] + 1.0
        more = [(now - 100 + 4 * i, 40 + (i % 5) * 3.5) for i in range(20)]
        chart = ThroughputChart(window_s=120.0, clock=lambda: now)
        chart.samples = sorted(points + more)
        yield chart


def test_throughput_chart(snap_compare) -> None:
    assert snap_compare(ThroughputApp(), terminal_size=(100, 14))


def test_depth_chart_draws_every_curve_with_its_marker() -> None:
    report = finished_sweep()
    from console.core.probe_history import report_curve

    text = depth_chart(report_curve(report), EARLIER, 80, 20)
    plain = text.plain
    assert "depth (k tokens)" in plain and "▚ this run" in plain
    assert "• 05-29 18:02 ctx-128k" in plain and "+ 05-30 22:14 ctx-200k" in plain
    assert plain.count("•") > 3 and plain.count("+") > 3
    # The y axis is logarithmic: 0.7 and 11 tok/s both have ticks well apart.
    assert depth_chart(None, [], 80, 20).plain.startswith("No depth measured yet")


# ---- the screen against a twin ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def module_twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    twin = start_twin(
        tmp_path_factory.mktemp("tui-probe"), "tuiprobe", "healthy", {"--mem-fraction-static": "0.94"}
    )
    try:
        yield twin
    finally:
        twin.stop_sync()


@pytest.fixture
def twin(module_twin):  # type: ignore[no-untyped-def]
    """The module's twin with its server up: a test that stops it (the dying-server one) leaves it
    stopped, and the next test, in whatever order, starts it again first."""
    import httpx

    def healthy() -> bool:
        try:
            return httpx.get(module_twin.sglang_url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    if not healthy():
        module_twin.systemctl("start", module_twin.unit, check=False)
        deadline = time.monotonic() + 60
        while not healthy():
            assert time.monotonic() < deadline, "the twin's server did not come back"
            time.sleep(0.1)  # polling the condition, with the deadline above
    return module_twin


class ScreenApp(App[None]):
    CSS_PATH = css_paths()  # type: ignore[assignment]

    def __init__(self, host: HostConfig, history: Path) -> None:
        super().__init__()
        self.host_config = host
        self.history = history

    def on_mount(self) -> None:
        from console.sources.transport import Transport

        self.transport = Transport(self.host_config)
        self.push_screen(ProbeScreen(self.host_config, transport=self.transport, history=self.history))


async def _until(pilot, check, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        panel = pilot.app.screen.query_one(ProbePanel)
        assert time.monotonic() < deadline, f"timed out; the panel says {panel.status.plain!r}"
        await pilot.pause(0.05)


async def _fire(pilot, depths: str, tokens: str) -> ProbePanel:
    panel = pilot.app.screen.query_one(ProbePanel)
    panel.query_one("#probe-depths", Input).value = depths
    panel.query_one("#probe-tokens", Input).value = tokens
    await pilot.click("#probe-fire")
    return panel


def _status(panel: ProbePanel) -> str:
    return panel.status.plain


async def test_probe_screen_fires_a_sweep_and_charts_it(twin, tmp_path: Path) -> None:
    history = tmp_path / "probes.jsonl"
    app = ScreenApp(host_of(twin), history)
    async with app.run_test(size=SIZE) as pilot:
        panel = await _fire(pilot, "2k,8k", "4")
        await _until(pilot, lambda: panel.report is not None)
        report = panel.report
        assert report is not None and report.ok
        assert [r.depth for r in report.results] == [2_000, 8_000]
        chart = panel.query_one(DepthChart)
        assert chart.current is not None and [d for d, _ in chart.current.points] == [2_000, 8_000]
        assert "depth (k tokens)" in chart.render().plain
        assert not panel.running and "too shallow" in _status(panel)
        # A second run plots the first as an earlier one, read back from the history file.
        await _fire(pilot, "4k", "3")
        await _until(pilot, lambda: panel.report is not None and panel.report.run_id != report.run_id)
        assert [c.run_id for c in panel.earlier] == [report.run_id]
        # Both runs are on the host's audit trail, with their speeds.
        from console.sources.hoststate import HostStateDir

        trail = await HostStateDir(app.transport, host_of(twin)).audit.read()
        probes = [e for e in trail if e.action == "probe"][-2:]
        assert len(probes) == 2 and all(e.outcome == "ok" and "tok/s" in e.summary for e in probes)
        assert "2k " in probes[0].summary and "4k " in probes[1].summary
        await app.transport.close()
    assert {r.run_id for r in load_history(history)} == {report.run_id, panel.report.run_id}


async def test_cancel_and_a_dying_server_leave_the_screen_usable(twin, tmp_path: Path) -> None:
    app = ScreenApp(host_of(twin), tmp_path / "probes.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        panel = await _fire(pilot, "64k", "3000")
        await _until(pilot, lambda: panel.live is not None and panel.live.tokens >= 3)
        assert panel.running
        cancel = panel.query_one("#probe-cancel", Button)
        await _until(pilot, lambda: not cancel.disabled)
        # Pressed as a click would press it; a synthetic click's hit test was lost once on a loaded CI box
        cancel.press()
        await _until(pilot, lambda: not panel.running)
        assert panel.rows[0][1] is not None and panel.rows[0][1].status is ProbeStatus.CANCELLED
        assert "cancelled" in _status(panel)

        # The server dies mid-stream: the panel says so in one line, and the screen keeps working.
        panel = await _fire(pilot, "64k,128k", "3000")
        await _until(pilot, lambda: panel.live is not None and panel.live.tokens >= 3)
        await asyncio.to_thread(twin.systemctl, "stop", twin.unit)
        await _until(pilot, lambda: panel.report is not None)
        first = panel.report.results[0]
        assert first.status is ProbeStatus.FAILED and "stopped after" in (first.error or "")
        assert "64k depth failed" in _status(panel)
        panel = await _fire(pilot, "8k", "3")
        await _until(pilot, lambda: "not ready to probe" in _status(panel))
        assert not panel.running and isinstance(app.screen, ProbeScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ProbeScreen)
        await app.transport.close()


class SwallowingProbeScreen(ProbeScreen):
    """A probe that absorbs its first cancellation and decodes on, as a cancel swallowed inside httpx
    (anyio#1214) would leave it."""

    CANCEL_CHECK_S = 0.3
    swallowed = 0

    async def _probe(self, depths: list[int], tokens: int) -> None:
        decoded = 0
        try:
            while True:
                try:
                    await asyncio.sleep(0.05)
                except asyncio.CancelledError:
                    if self.swallowed:
                        raise
                    self.swallowed += 1
                    asyncio.current_task().uncancel()  # type: ignore[union-attr]
                decoded += 1
                self.panel.show_progress(
                    ProbeProgress(
                        phase=ProbePhase.DECODING, depth=8000, tokens=decoded, requested_tokens=tokens
                    )
                )
        except asyncio.CancelledError:
            self.panel.set_running(False)
            raise


def test_one_cancel_press_stops_a_probe_that_decodes_on_after_it(tmp_path: Path) -> None:
    host = HostConfig(name="gpu1", ssh="nobody@127.0.0.1", unit="sglang.service")

    class SwallowApp(App[None]):
        CSS_PATH = css_paths()  # type: ignore[assignment]

        def on_mount(self) -> None:
            self.push_screen(SwallowingProbeScreen(host, history=tmp_path / "probes.jsonl"))

    async def go() -> tuple[int, bool]:
        app = SwallowApp()
        async with app.run_test(size=SIZE) as pilot:
            screen = app.screen
            assert isinstance(screen, SwallowingProbeScreen)
            panel = await _fire(pilot, "8k", "4000")
            await _until(pilot, lambda: panel.live is not None and panel.live.tokens >= 3)
            cancel = panel.query_one("#probe-cancel", Button)
            await _until(pilot, lambda: not cancel.disabled)
            cancel.press()
            await _until(pilot, lambda: not panel.running, timeout=10.0)
            return screen.swallowed, screen._worker is not None and screen._worker.is_running

    swallowed, still_running = asyncio.run(go())
    assert swallowed == 1 and not still_running


def test_a_bad_depth_is_said_in_the_panel(tmp_path: Path) -> None:
    async def go() -> str:
        app = PanelApp()
        async with app.run_test(size=SIZE) as pilot:
            panel = app.query_one(ProbePanel)
            panel.query_one("#probe-depths", Input).value = "8k,lots"
            await pilot.click("#probe-fire")
            await pilot.pause()
            return _status(panel)

    assert "'lots' is not a depth" in asyncio.run(go())


def test_the_pinned_sweep_matches_the_incident_numbers() -> None:
    """The snapshot's numbers are the twin's decode model for the incident, not made up."""
    report = finished_sweep()
    deep = report.results[2]
    assert deep.decode_tok_s == pytest.approx(0.70, rel=0.01) and deep.verdict.value == "attention_bound"
    assert report.results[3].status is ProbeStatus.REFUSED
    assert report.fit is not None and report.fit.verdict.value == "attention_bound"


async def test_throughput_chart_folds_a_busy_journal_into_one_bucket_a_second() -> None:
    """A server at thousands of decode lines a second: the chart keeps one mean per second of the
    window and reads only the events that are new in each snapshot."""
    from console.core.snapshot import HostSnapshot
    from console.core.state import HostState

    now = 1_780_000_000.0
    lines = [
        f"[2026-05-28 20:26:{40 + i // 1000:02d} TP0] Decode batch, #running-req: 3, #token: 1000, "
        f"token usage: 0.10, cuda graph: True, gen throughput (token/s): {10 + i % 2}.00, #queue-req: 0, "
        for i in range(3000)
    ]
    events = list(parse_lines(lines))
    chart = ThroughputChart(window_s=600.0, clock=lambda: now)
    total = 0
    for start in range(0, 3000, 500):
        batch = events[start : start + 500]
        total += len(batch)
        chart.show(
            HostSnapshot(
                host="h",
                seq=total,
                ts=now,
                state=HostState(),
                recent=tuple(events[:total][-2000:]),
                events_total=total,
            )
        )
    samples = chart.samples
    assert len(samples) == 3  # three seconds of lines
    assert all(v == 10.5 for _, v in samples)


async def test_the_probe_screen_charts_a_run_of_the_command_line(twin, tmp_path: Path) -> None:
    """`k26-console probe HOST --sweep ...` then the console's probe screen: the same run, charted."""
    import json
    import os
    import subprocess
    import sys

    hosts = tmp_path / "hosts.toml"
    config = host_of(twin)
    hosts.write_text(
        f'[hosts.{config.name}]\nssh = "{config.ssh}"\nport = {config.port}\nunit = "{config.unit}"\n'
        f'server_url = "{config.server_url}"\nidentity_file = "{config.identity_file}"\n'
        f'known_hosts = "{config.known_hosts}"\n'
    )
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    import httpx

    await asyncio.to_thread(twin.systemctl, "start", twin.unit)  # an earlier test stops it mid-stream
    deadline = time.monotonic() + 90
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{twin.sglang_url}/health", timeout=2).status_code == 200:
                break
        assert time.monotonic() < deadline, "the twin's server did not come back"
        await asyncio.sleep(0.2)
    argv = [sys.executable, "-m", "console.cli.main", "probe", config.name, "--sweep", "2k,8k"]
    argv.extend(["--tokens", "3", "--json", "--hosts", str(hosts)])
    res = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    cli = json.loads(res.stdout)
    history = tmp_path / "state" / "k26-console" / "probes.jsonl"
    app = ScreenApp(config, history)
    async with app.run_test(size=SIZE) as pilot:
        panel = pilot.app.screen.query_one(ProbePanel)
        await _until(pilot, lambda: bool(panel.earlier))
        (curve,) = panel.earlier
        assert curve.run_id == cli["run_id"]
        assert curve.points == [(r["depth"], r["decode_tok_s"]) for r in cli["results"]]
        await app.transport.close()


async def test_a_generation_figure_is_now_only_while_it_is() -> None:
    """After a rollback the dashboard said "gen tok/s now 1.31" from a probe minutes before: a figure
    older than its window is shown with its age, one the server has since gone idle on as idle, one
    older than the chart's window not at all."""
    from console.core.metrics import SglangMetrics
    from console.core.snapshot import HostSnapshot, ServerSample
    from console.core.state import HostState
    from console.tui.throughput import NOW_WINDOW_S

    lines = (CORPUS / "case-26.log").read_text().splitlines()
    events = list(parse_lines(lines))
    points = throughput_points(events)
    t, value = points[-1]
    clock = [t + 5.0]
    chart = ThroughputChart(window_s=300.0, clock=lambda: clock[0])
    chart.show(
        HostSnapshot(host="h", seq=1, ts=t, state=HostState(), recent=tuple(events), events_total=len(events))
    )

    def figure() -> str:
        return chart.render().plain.splitlines()[-1]

    assert figure() == f"gen tok/s  now {value:.2f}"
    clock[0] = t + NOW_WINDOW_S + 140
    assert figure() == f"gen tok/s  last {value:.2f}, 3 min ago"
    # The server polled since says no request runs: idle, whatever the figure's age.
    clock[0] = t + 10.0
    idle = ServerSample(metrics=SglangMetrics(num_running_reqs=0.0, gen_throughput=0.0), ts=t + 8.0)
    snap = HostSnapshot(
        host="h", seq=2, ts=t + 8.0, state=HostState(), recent=tuple(events), events_total=len(events)
    )
    chart.show(snap.model_copy(update={"server": idle}))
    assert figure() == f"gen tok/s  idle (last {value:.2f}, 10 s ago)"
    clock[0] = t + 301
    assert "No generation in the last 5 minutes" in chart.render().plain


def test_empty_throughput_chart_names_the_probe_key_only_where_there_is_a_probe() -> None:
    live = throughput_chart([], now=1000.0, window_s=300.0, width=80, height=10).plain
    replayed = throughput_chart([], now=1000.0, window_s=300.0, width=80, height=10, probe_hint=False).plain
    assert live.startswith("No generation in the last 5 minutes") and "P sends a synthetic" in live
    assert replayed.startswith("No generation in the last 5 minutes") and "P sends" not in replayed


def test_the_chart_reads_from_zero_and_labels_its_figure_as_the_line_under_it() -> None:
    """After a restart the chart's y axis read 1.99 / -0.99 over a flat 0.7 tok/s, and its ticks
    (8.8, 6.1, 3.4) matched nothing written under it (issue 34)."""
    from console.tui.throughput import segments

    now = 1000.0
    flat = [(now - 30 + i, 0.7) for i in range(0, 30, 3)]
    lines = throughput_chart(flat, now, 300.0, 90, 9).plain.splitlines()
    ticks = [line.split("┤")[0].strip() for line in lines if "┤" in line]
    values = [float(t) for t in ticks]
    assert values and min(values) == 0 and all(v >= 0 for v in values), ticks
    # Before a restart 11.5 tok/s, after it 0.7: not joined across the gap, and the newest figure is a
    # tick written as the line under the chart writes it.
    points = [(now - 250 + i, 11.5) for i in range(0, 100, 5)] + [
        (now - 100 + i, 0.7) for i in range(0, 100, 5)
    ]
    assert [len(run) for run in segments([(t - now, v) for t, v in points], 15.0)] == [20, 20]
    text = throughput_chart(points, now, 300.0, 90, 17).plain
    assert "0.70┤" in text and text.splitlines()[-1] == "gen tok/s  now 0.70"
    assert "-5m" in text and "now" in text.splitlines()[-2]


def test_an_empty_chart_blames_the_link_not_the_server_when_the_link_is_down() -> None:
    """With the host's SSH link refused, the panel said the server "logged no Decode batch line"."""
    from console.core.snapshot import ConnectionStatus, ConnState, HostSnapshot

    now = 1_780_000_000.0
    chart = ThroughputChart(window_s=300.0, clock=lambda: now)
    down = ConnectionStatus(
        host="gpu1", state=ConnState.RETRYING, since=now - 5, retry_in_s=4.0, reason="connection refused"
    )
    chart.show(HostSnapshot(host="gpu1", seq=1, ts=now, connection=down))
    text = chart.render().plain
    assert "no link to gpu1 (retrying in 4s: connection refused)" in text and "Decode batch" not in text
    chart.show(
        HostSnapshot(host="gpu1", seq=2, ts=now, connection=down.model_copy(update={"state": ConnState.UP}))
    )
    assert "Decode batch" in chart.render().plain
