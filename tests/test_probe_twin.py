"""The probe against twin hosts over real SSH on loopback (the twin's sshd, an SSH port forward to its
simulated SGLang server). Decode runs in real time (K26_TWIN_DECODE_SCALE unset), so the tok/s measured
here is the twin's bandwidth-bound decode speed, and what the server itself reports (its inter-token
latency histogram, its `Decode batch` lines) is a separate witness of the same number.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from console.core.events import DecodeBatch
from console.core.metrics import SglangMetrics
from console.core.parser import parse_lines
from console.core.probe import ProbePhase, ProbeProgress, ProbeStatus, ProbeVerdict
from console.core.profiles import parse_profile
from console.sources.hosts import HostConfig, load_hosts
from console.sources.probe import open_prober, run_probe
from console.sources.probe_history import load_history
from console.sources.profile_store import ProfileStore, shipped_profile_dir
from console.twin.host import TwinHost
from console.twin.unitfile import render_exec

TIME_SCALE = 0.002
INCIDENT_185K_TOK_S = 1 / (0.025 + 185_000 * 70_272 * 2 / (1.8e12 * 0.0103))  # the twin's decode model


def set_flags(twin: TwinHost, flags: dict[str, str]) -> None:
    """Change or add server flags with a drop-in, as an operator would; the next (re)start uses them."""
    shown = twin.systemctl("show", "-p", "ExecStart", twin.unit).stdout
    argv = shown.split("argv[]=", 1)[1].split(" ; ", 1)[0].split(" ")
    for flag, value in flags.items():
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    dropin = twin.layout.unit_dir / f"{twin.unit}.d" / "50-probe.conf"
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text(f"[Service]\nExecStart=\nExecStart={render_exec(argv)}\n")
    twin.systemctl("daemon-reload")


def start_twin(root: Path, name: str, scenario: str, flags: dict[str, str]) -> TwinHost:
    """A twin whose service starts with `flags` changed or added."""
    twin = TwinHost(root / "state", name=name, scenario=scenario, time_scale=TIME_SCALE, start_service=False)
    twin.start_sync()
    try:
        set_flags(twin, flags)
        twin.systemctl("start", twin.unit)
    except BaseException:
        twin.stop_sync()
        raise
    return twin


def host_of(twin: TwinHost) -> HostConfig:
    host = load_hosts(twin.hosts_toml).get(twin.name)
    assert host is not None
    return host


def scrape(twin: TwinHost) -> SglangMetrics:
    """The twin's /metrics read directly on loopback (a witness beside the probe, not through it)."""
    return SglangMetrics.from_text(httpx.get(twin.sglang_url + "/metrics", trust_env=False).text)


def decode_batches(twin: TwinHost) -> list[DecodeBatch]:
    lines = subprocess.run(
        [str(twin.layout.bin_dir / "journalctl"), "-u", twin.unit, "-o", "json", "--all", "--no-pager"],
        env=twin.session_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return [e for e in parse_lines(lines) if isinstance(e, DecodeBatch)]


@pytest.fixture(scope="module")
def incident(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwinHost]:
    # f = 0.94: the 218,484-token pool of the incident's third restart; a Decode batch line every 2 steps.
    twin = start_twin(
        tmp_path_factory.mktemp("incident"),
        "incident",
        "kimi-k26-rtx6000",
        {"--mem-fraction-static": "0.94", "--decode-log-interval": "2"},
    )
    try:
        yield twin
    finally:
        twin.stop_sync()


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwinHost]:
    twin = start_twin(
        tmp_path_factory.mktemp("healthy"), "healthy", "healthy", {"--mem-fraction-static": "0.94"}
    )
    try:
        yield twin
    finally:
        twin.stop_sync()


@pytest.mark.serial  # decode speed and the verdict come from timing: measured with no other test running
async def test_incident_185k_is_slow_attention_and_the_server_agrees(incident: TwinHost) -> None:
    before_lines = len(decode_batches(incident))
    seen: list[ProbeProgress] = []
    async with open_prober(host_of(incident), rng=random.Random(185)) as prober:
        target, limits = await prober.prepare()
        assert (limits.pool_tokens, limits.context_len) == (218_484, 200_000)
        assert target.gpu_name == "NVIDIA RTX PRO 6000 Blackwell Server Edition" and target.gpu_count == 8
        assert (target.model, target.kv_bytes_per_token_per_gpu, target.peak_bandwidth_gbs) == (
            "kimi-k2.6",
            70_272,
            1792.1,  # the card's own, from NVML (the table says 1,792.0)
        )
        assert target.peak_from == "nvml"
        result = await prober.probe(185_000, 4, on_progress=seen.append)
    assert result.status is ProbeStatus.OK, result.error
    assert (result.prompt_tokens, result.output_tokens, result.cached_tokens) == (185_000, 4, 0)
    assert result.decode_tok_s == pytest.approx(0.70, rel=0.03)
    assert result.decode_tok_s == pytest.approx(INCIDENT_185K_TOK_S, rel=0.03)
    assert result.verdict is ProbeVerdict.ATTENTION_BOUND
    assert "attention is the bottleneck" in result.diagnosis and "185k depth" in result.diagnosis
    assert result.effective_kv_bandwidth_gbs == pytest.approx(185_000 * 70_272 * result.decode_tok_s / 1e9)
    assert result.bandwidth_pct is not None and result.bandwidth_pct < 1.0
    # The server's own clock: its inter-token-latency histogram and its Decode batch line.
    assert result.server_decode_tok_s == pytest.approx(result.decode_tok_s, rel=0.05)
    logged = [b.gen_throughput for b in decode_batches(incident)[before_lines:] if b.gen_throughput]
    assert logged, "the twin logged no Decode batch line during the probe"
    assert logged[-1] == pytest.approx(result.decode_tok_s, rel=0.05)
    phases = [p.phase for p in seen]
    assert phases[0] is ProbePhase.PREFILL and phases[-1] is ProbePhase.DONE
    assert [p.tokens for p in seen if p.phase is ProbePhase.DECODING] == [1, 2, 3, 4]
    assert seen[-2].live_tok_s == pytest.approx(0.70, rel=0.05)


async def test_a_depth_beyond_the_context_is_refused_before_any_request(incident: TwinHost) -> None:
    before = scrape(incident)
    async with open_prober(host_of(incident)) as prober:
        report = await prober.sweep([199_999, 200_500], 4)
    after = scrape(incident)
    assert [r.status for r in report.results] == [ProbeStatus.REFUSED, ProbeStatus.REFUSED]
    assert "context length of 200,000" in (report.results[0].error or "")
    assert after.num_requests_total == before.num_requests_total
    assert after.prompt_tokens_total == before.prompt_tokens_total
    assert not report.ok and report.summary().startswith("the probe at 199,999 depth refused")


async def test_cancel_closes_the_stream_and_the_server_aborts_the_request(incident: TwinHost) -> None:
    seen: list[ProbeProgress] = []
    two_tokens = asyncio.Event()

    def progress(p: ProbeProgress) -> None:
        seen.append(p)
        if p.tokens >= 2:
            two_tokens.set()

    async with open_prober(host_of(incident)) as prober:
        task = asyncio.create_task(prober.probe(64_000, 200, on_progress=progress))
        await asyncio.wait_for(two_tokens.wait(), 30)
        assert scrape(incident).num_running_reqs == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert seen[-1].phase is ProbePhase.CANCELLED and seen[-1].result is not None
    assert seen[-1].result.status is ProbeStatus.CANCELLED and seen[-1].result.output_tokens >= 2
    deadline = time.monotonic() + 10
    while scrape(incident).num_running_reqs and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert scrape(incident).num_running_reqs == 0


@pytest.mark.serial  # decode speed and the verdict come from timing: measured with no other test running
async def test_healthy_185k_is_not_attention_bound(healthy: TwinHost) -> None:
    async with open_prober(host_of(healthy)) as prober:
        result = await prober.probe(185_000, 24)
    assert result.status is ProbeStatus.OK, result.error
    assert result.verdict is ProbeVerdict.ATTENTION_OK
    assert "bottleneck" not in result.diagnosis
    assert result.decode_tok_s is not None and result.decode_tok_s > 10
    assert result.bandwidth_pct is not None and result.bandwidth_pct > 5
    assert result.server_decode_tok_s == pytest.approx(result.decode_tok_s, rel=0.05)


async def test_each_run_gets_a_fresh_prefix_the_radix_cache_cannot_answer(healthy: TwinHost) -> None:
    async with open_prober(host_of(healthy)) as prober:
        first = await prober.probe(8_000, 2)
        second = await prober.probe(8_000, 2)
        assert (first.cached_tokens, second.cached_tokens) == (0, 0)
        # Control: the same ids twice ARE answered from the cache, so the check above can fail.
        ids = list(range(1000, 9000))
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "ignore_eos": True}}
        cached = []
        for _ in range(2):
            async for event in prober.client.generate_stream(body):
                meta = event["meta_info"]
            cached.append(meta["cached_tokens"])
        assert cached[0] == 0 and cached[1] == len(ids) - 1


async def test_results_are_kept_in_history_and_the_profile(healthy: TwinHost, tmp_path: Path) -> None:
    shipped = shipped_profile_dir()
    assert shipped is not None
    user = tmp_path / "profiles"
    user.mkdir()
    store = ProfileStore([user, shipped])
    shipped_text = (shipped / "ctx-200k.toml").read_text()
    history = tmp_path / "state" / "probes.jsonl"
    report = await run_probe(
        host_of(healthy), [4_000, 32_000], 6, profile="ctx-200k", history=history, store=store
    )
    assert report.ok
    kept = parse_profile((user / "ctx-200k.toml").read_text(), name="ctx-200k")
    assert kept.verified is not None
    assert kept.verified.tok_s_at_depth == {
        r.depth: pytest.approx(r.decode_tok_s, abs=0.006) for r in report.results
    }
    assert (shipped / "ctx-200k.toml").read_text() == shipped_text  # the shipped example is left alone
    records = load_history(history, host="healthy")
    assert [(r.run_id, r.result.depth, r.profile) for r in records] == [
        (report.run_id, 4_000, "ctx-200k"),
        (report.run_id, 32_000, "ctx-200k"),
    ]
    assert load_history(history, host="elsewhere") == []


def _stop_server(twin: TwinHost, how: str) -> None:
    if how == "stop":
        twin.systemctl("stop", twin.unit)
    else:  # a crash: the server's process dies at once, nothing is flushed
        pid = twin.main_pid()  # this machine's pid (a real manager's MainPID is a namespace pid)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_a_server_that_stops_mid_stream_ends_the_probe_with_a_clear_error(
    healthy: TwinHost, how: str
) -> None:
    stopped = threading.Event()

    def progress(p: ProbeProgress) -> None:
        if p.tokens == 5 and not stopped.is_set():
            stopped.set()
            threading.Thread(target=_stop_server, args=(healthy, how), daemon=True).start()

    try:
        started = time.monotonic()
        async with open_prober(host_of(healthy)) as prober:
            report = await prober.sweep([64_000, 128_000], 2000, on_progress=progress)
            took = time.monotonic() - started
            # The console side is intact: the same prober answers (the server is down, not the probe).
            health = await prober.client.health()
        first, rest = report.results
        assert first.status is ProbeStatus.FAILED and first.output_tokens >= 5
        assert first.error is not None and first.error.startswith("the probe at 64k depth stopped after ")
        assert "of 2000 tokens" in first.error
        assert rest.status is ProbeStatus.FAILED and "skipped" in rest.diagnosis
        assert took < 30 and health.status_code != 200
    finally:
        healthy.systemctl("stop", healthy.unit, check=False)
        healthy.systemctl("start", healthy.unit)
