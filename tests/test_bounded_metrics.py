"""Issue 30 item 4: the server's answers are read bounded, and its numbers held to their range.

- A `/metrics` body past `METRICS_MAX_BYTES` (with a length, chunked, or a gzip bomb sent though the
  client asked for identity) is refused at the limit with one sentence: before, a 300 MB body took
  `snapshot` to 3.8 GB.
- An answer not whole within the client's `timeout_s` is cut there: before, a server sending a byte
  every few seconds never tripped httpx's per-read timeout (`snapshot`: a traceback after 64 s).
- `+Inf`, NaN and negative values refuse their metric family: absent, with the value as the reason,
  never "pool inf% in use"; `snapshot` names them among its problems (exit 1).

The servers are real sockets on 127.0.0.1 (tests/support/hostile_http.py); the scrapes are the twin
engine's own `/metrics` with one value changed.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import time
import tracemalloc
from pathlib import Path

import pytest

from console.core.alerts import alert_inputs
from console.core.serving import Scrape, serving_figures
from console.core.snapshot import HealthState
from console.sources.server import METRICS_MAX_BYTES, ServerClient, ServerError
from console.sources.session_options import SessionOptions
from console.twin.host import TwinHost
from console.twin.scenarios import get_scenario
from console.twin.server_engine import Engine
from console.twin.server_logs import LogWriter
from tests.support.cli import CLI, operator_env, started_twin
from tests.support.hostile_http import Hostile
from tests.support.measured import run_measured
from tests.test_serving_core import engine_config


def _twin_scrape(**values: str) -> str:
    """The twin engine's `/metrics` text with the named gauges' values replaced (`token_usage="+Inf"`)."""
    eng = Engine(get_scenario(), engine_config(), LogWriter(io.StringIO()))  # a server at rest
    lines = []
    for line in eng.metrics_text().split("\n"):
        name = line.split("{", 1)[0].split(" ", 1)[0].removeprefix("sglang:")
        if not line.startswith("#") and name in values:
            line = line.rsplit(" ", 1)[0] + " " + values[name]
        lines.append(line)
    return "\n".join(lines)


@pytest.mark.parametrize("mode", ["huge", "huge-chunked", "gzip"])
async def test_a_huge_metrics_body_is_refused_at_its_limit_in_bounded_memory(mode: str) -> None:
    with Hostile(mode, size=64 << 20) as server:  # type: ignore[arg-type]
        client = ServerClient(server.url, timeout_s=10)
        tracemalloc.start()
        started = time.monotonic()
        try:
            async with asyncio.timeout(20):
                with pytest.raises(ServerError) as caught:
                    await client.metrics_text()
                light = await client.light_sample()
        finally:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            await client.aclose()
        took = time.monotonic() - started
    sentence = str(caught.value)
    assert "/metrics" in sentence and ("not read" in sentence), sentence
    if mode != "gzip":
        assert f"{METRICS_MAX_BYTES:,}" in sentence, sentence
    assert light.health is HealthState.ERROR and light.detail == sentence
    assert peak < 3 * METRICS_MAX_BYTES, f"{peak:,} bytes held"
    assert took < 10, took


async def test_a_server_that_drips_is_cut_at_the_deadline_with_a_sentence() -> None:
    with Hostile("slow", drip_s=0.5) as server:
        client = ServerClient(server.url, timeout_s=1.5)
        try:
            async with asyncio.timeout(15):  # before: a byte every 0.5 s never tripped the 1.5 s read timeout
                started = time.monotonic()
                with pytest.raises(ServerError) as caught:
                    await client.metrics_text()
                health = await client.health()
                light = await client.light_sample()
                took = time.monotonic() - started
        finally:
            await client.aclose()
    assert str(caught.value) == "the server did not answer /metrics within 1.5 s"
    assert (
        health.health is HealthState.ERROR
        and health.detail == "the server did not answer /health within 1.5 s"
    )
    assert light.health is HealthState.ERROR and "within 1.5 s" in (light.detail or "")
    assert took < 3 * 1.5 + 2, took


async def test_values_out_of_range_are_refused_named_and_never_drawn() -> None:
    text = _twin_scrape(token_usage="+Inf", num_running_reqs="-3", num_queue_reqs="NaN")
    with Hostile("text", text=text) as server:
        client = ServerClient(server.url, timeout_s=5)
        try:
            first = await client.light_sample()
            second = await client.light_sample()
        finally:
            await client.aclose()
    assert first.metrics is not None and first.scrape is not None
    assert first.metrics.token_usage is None and first.metrics.num_running_reqs is None
    assert first.metrics.num_queue_reqs is None
    assert first.scrape.refused == {
        "sglang:token_usage": "+Inf",
        "sglang:num_running_reqs": "-3",
        "sglang:num_queue_reqs": "NaN",
    }
    assert first.metrics.max_total_num_tokens == 400_000  # the rest of the scrape is read as before
    scrapes = [Scrape(ts=0.0, metrics=first.scrape), Scrape(ts=2.0, metrics=second.scrape)]  # type: ignore[arg-type]
    figures = serving_figures(scrapes, max_running=float("inf"))
    assert figures.token_usage is None and figures.running is None and figures.queued is None
    assert figures.absent["token_usage"] == (
        "the server sent +Inf for sglang:token_usage: refused (not a finite number from 0 to 1e+15)"
    )
    assert "-3" in figures.absent["running"] and "NaN" in figures.absent["queued"]
    assert figures.max_running is None and "refused" in figures.absent["max_running"]
    assert figures.refused == first.scrape.refused
    inputs = alert_inputs(None, figures)
    assert "token_usage_pct" not in inputs.figures and "running" not in inputs.figures


def test_a_scrape_read_back_is_held_to_the_same_range() -> None:
    """A recording holds scrapes as JSON (an infinite float as the string "inf"): the range is checked
    when they are read back as when they were parsed."""
    from console.core.metrics import MetricsText, SglangMetrics

    back = MetricsText.model_validate(
        {
            "samples": [
                {"name": "sglang:token_usage", "value": "inf"},
                {"name": "sglang:num_queue_reqs", "value": 2},
            ]
        }
    )
    assert back.refused == {"sglang:token_usage": "+Inf"} and back.total("sglang:num_queue_reqs") == 2
    metrics = SglangMetrics.model_validate(
        {"token_usage": "inf", "num_queue_reqs": -1, "gen_throughput": 5.0}
    )
    assert metrics.token_usage is None and metrics.num_queue_reqs is None and metrics.gen_throughput == 5.0


@pytest.mark.serial
def test_snapshot_against_a_hostile_server_returns_in_time_in_bounded_memory(tmp_path: Path) -> None:
    """The issue's figures, end to end: the twin host, its server replaced by the hostile one."""
    with started_twin(tmp_path / "twin", time_scale=0.002) as twin:
        for mode, kw, expect in (
            ("huge", {"size": 300_000_000}, "over the 8,388,608-byte limit"),
            ("slow", {"drip_s": 5.0}, "did not answer /metrics within 5 s"),
            ("text", {"text": _twin_scrape(token_usage="+Inf", num_running_reqs="-3")}, "+Inf"),
        ):
            with Hostile(mode, **kw) as server:  # type: ignore[arg-type]
                res = run_measured(snapshot_argv(twin, server.url, tmp_path), env=operator_env(tmp_path))
            assert "Traceback" not in res.stderr, res.stderr
            report = json.loads(res.stdout)
            said = " ".join(report["incomplete"] + report["problems"])
            assert expect in said, (mode, said)
            assert res.seconds < 10, (mode, res.seconds)
            assert res.peak_rss < 300 << 20, (mode, res.peak_rss)
            if mode == "text":
                assert res.returncode == 1 and report["serving"]["token_usage"] is None
                assert "values out of range" in said


def snapshot_argv(twin: TwinHost, server_url: str, home: Path) -> list[str]:
    """`snapshot` of the twin, its hosts.toml copied with `server_url` pointed elsewhere."""
    name = twin.name
    lines = [
        line for line in twin.hosts_toml.read_text().split("\n") if not line.strip().startswith("server_url")
    ]
    head = next(i for i, line in enumerate(lines) if line.startswith("[hosts."))
    lines.insert(head + 1, f'server_url = "{server_url}"')
    hosts = home / f"hosts-{os.getpid()}.toml"
    hosts.write_text("\n".join(lines))
    return [*CLI, "snapshot", name, "--hosts", str(hosts), "--json", "--timeout", "20"]


async def test_the_console_says_why_a_hostile_servers_figures_are_missing(tmp_path: Path) -> None:
    """The console (headless) against the twin whose server is the hostile one: the header names the
    refused answer in its sentence (it said "http ok" and nothing more), and a refused value is never
    drawn."""
    from console.sources.hosts import load_hosts
    from console.tui.app import ConsoleApp, HostEntry
    from tests.tui_support import plain

    async def seen(server_url: str, where: str, words: str) -> str:
        argv = snapshot_argv(twin, server_url, tmp_path)
        config = load_hosts(Path(argv[argv.index("--hosts") + 1])).get(twin.name)
        assert config is not None
        entry = HostEntry(
            twin.name, config=config, simulated=True, session=SessionOptions(server_interval_s=0.5)
        )
        app = ConsoleApp([entry], target=200_000, target_source="test")
        async with app.run_test(size=(160, 48)) as pilot:
            dash = app.dashboards[twin.name]
            widget = dash.header if where == "header" else dash.serving
            deadline = time.monotonic() + 30
            text = ""
            while words not in text:
                assert time.monotonic() < deadline, (words, text)
                await pilot.pause(0.2)
                text = plain(widget.render())
            return text

    with started_twin(tmp_path / "twin", time_scale=0.002) as twin:
        with Hostile("huge", size=64 << 20) as server:
            header = await seen(server.url, "header", "bytes for /metrics")
        # (the sentence's tail may be cut by the header's width: its head names the refusal)
        assert "http ok: " in header and "sent 67,108,864 bytes for /metrics" in header
        # Values out of range: named on the panel, never drawn as figures (the journal's decode lines stand
        # in for the refused ones).
        text = _twin_scrape(token_usage="+Inf", num_running_reqs="-3")
        with Hostile("text", text=text) as server:
            panel = await seen(server.url, "serving", "refused from /metrics")
        assert "token_usage +Inf" in panel and "num_running_reqs -3" in panel
        assert "inf%" not in panel.lower()


async def test_a_fleets_server_clients_share_one_tls_context() -> None:
    """Each httpx client made its own TLS context with the CA bundle loaded (0.67 MB of RSS a host, never
    used: the console speaks plain HTTP to its loopback forwards); a fleet's clients share one."""

    def rss_mib() -> float:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    first = ServerClient("http://127.0.0.1:9")  # the shared context made, whatever the order of tests
    before = rss_mib()
    clients = [ServerClient(f"http://127.0.0.1:{9 + i}") for i in range(16)]
    grown = rss_mib() - before
    try:
        assert grown < 3.0, f"16 server clients took {grown:.1f} MiB of RSS"
    finally:
        for client in [first, *clients]:
            await client.aclose()
