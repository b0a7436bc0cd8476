"""Serving figures (console/core/serving.py) from the twin's SGLang stand-in's own /metrics text.

The twin's engine records every latency it observes, so the window's percentiles read from histogram
deltas can be checked against the exact percentiles of the same requests."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import math
import statistics
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from console.core import serving
from console.core.events import DecodeBatch
from console.core.metrics import MetricsText, parse_prometheus
from console.core.serving import HistogramDelta, Scrape, histogram_increase, merge_deltas, serving_figures
from console.core.serving_history import ServingHistory
from console.core.window_sum import WindowSum
from console.twin.scenarios import get_scenario
from console.twin.server_engine import ITL_BUCKETS, TTFT_BUCKETS, Engine, EngineConfig
from console.twin.server_logs import LogWriter


def engine_config(max_running: int = 64) -> EngineConfig:
    """The twin engine of these tests: Kimi K2.6 at TP8, a 400k pool, fast simulated time."""
    return EngineConfig(
        max_total_num_tokens=400_000,
        max_running_requests=max_running,
        context_len=200_000,
        max_req_input_len=199_000,
        chunked_prefill_size=8192,
        max_prefill_tokens=16384,
        decode_log_interval=40,
        tp_size=8,
        time_scale=0.001,
        decode_scale=0.05,
        disable_radix_cache=False,
        served_model_name="moonshotai/Kimi-K2.6",
        page_size=1,
    )


def engine(max_running: int = 64) -> Engine:
    eng = Engine(get_scenario(), engine_config(max_running), LogWriter(io.StringIO()))
    eng.start()
    return eng


async def serve(eng: Engine, n: int, prompt: int, new_tokens: int) -> None:
    """`n` concurrent requests of `prompt` distinct tokens, each decoding `new_tokens`; until all end."""
    reqs = [
        eng.submit([(i * 7919 + j) % 150_000 + 1 for j in range(prompt)], new_tokens, ignore_eos=True)
        for i in range(n)
    ]
    async with asyncio.timeout(120):
        while not all(r.done for r in reqs):
            await asyncio.sleep(0.01)


def scrape(eng: Engine, ts: float) -> Scrape:
    return Scrape(ts=ts, metrics=parse_prometheus(eng.metrics_text()))


def exact_quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def bucket_of(value: float, bounds: tuple[float, ...]) -> tuple[float, float]:
    lower = 0.0
    for bound in bounds:
        if value <= bound:
            return lower, bound
        lower = bound
    return lower, math.inf


@pytest.mark.timeout(180)
async def test_window_percentiles_match_the_exact_ones_of_the_window_s_requests() -> None:
    eng = engine()
    try:
        # Before the window: a few light requests (short ITL), which a cumulative reading would mix in.
        await serve(eng, 2, 64, 40)
        first = scrape(eng, 1000.0)
        itl_before, ttft_before = len(eng.itl.recorded), len(eng.ttft.recorded)
        # The window: a crowded batch at depth (longer ITL, longer TTFT behind the queue).
        await serve(eng, 48, 3000, 30)
        second = scrape(eng, 1060.0)
        itl_window = list(eng.itl.recorded)[itl_before:]
        ttft_window = list(eng.ttft.recorded)[ttft_before:]
    finally:
        await eng.stop()

    figures = serving_figures([first, second], window_s=300)
    assert figures.scrapes == 2 and figures.covered_s == 60.0 and figures.resets == 0
    for latency, samples, bounds in (
        (figures.itl, itl_window, ITL_BUCKETS),
        (figures.ttft, ttft_window, TTFT_BUCKETS),
    ):
        assert latency is not None
        assert latency.count == len(samples)
        assert latency.mean is not None and math.isclose(
            latency.mean, statistics.fmean(samples), rel_tol=1e-9
        )
        for q, got in ((0.5, latency.p50), (0.9, latency.p90), (0.99, latency.p99)):
            exact = exact_quantile(samples, q)
            lower, upper = bucket_of(exact, bounds)
            assert got is not None and lower <= got <= upper, (latency.metric, q, got, exact)
    # the window's figures are not the since-start ones: the light requests before it are left out
    cumulative = serving_figures([Scrape(ts=0.0, metrics=parse_prometheus("")), second]).itl
    assert cumulative is None  # a scrape without the metric is no starting point
    assert figures.gen_tok_s is not None and math.isclose(figures.gen_tok_s, 48 * 30 / 60.0)
    assert figures.prefill_tok_s is not None and figures.prefill_tok_s > 0
    assert figures.requests_s is not None and math.isclose(figures.requests_s, 48 / 60.0)
    assert figures.kv_pool == 400_000 and figures.running == 0 and figures.queued == 0
    assert figures.full_pool == "kv"
    # the twin exports no speculative figures but the gauge at 0: absent, not zero
    assert (
        figures.spec_accept_length is None
        and figures.absent["spec_accept_length"] == "no speculative decoding"
    )


@pytest.mark.timeout(180)
async def test_a_restart_in_the_window_resets_counters_without_negative_rates() -> None:
    before = engine()
    try:
        await serve(before, 8, 2000, 40)
        s1 = scrape(before, 0.0)
    finally:
        await before.stop()
    after = engine()  # the server restarted: every counter starts from zero again
    try:
        await serve(after, 2, 500, 20)
        s2 = scrape(after, 30.0)
        await serve(after, 3, 500, 20)
        s3 = scrape(after, 60.0)
    finally:
        await after.stop()

    figures = serving_figures([s1, s2, s3], window_s=300)
    assert figures.resets >= 1
    assert figures.itl is not None and figures.itl.count == after.itl.count  # only the new server's
    assert figures.ttft is not None and figures.ttft.count == 5
    for value in (figures.gen_tok_s, figures.prefill_tok_s, figures.requests_s, figures.cache_hit_rate):
        assert value is not None and value >= 0
    assert figures.requests_s == pytest.approx(5 / 60.0)
    delta = histogram_increase([s1, s2, s3], "sglang:inter_token_latency_seconds")
    assert delta is not None and all(count >= 0 for _, count in delta.buckets)
    assert [c for _, c in delta.buckets] == sorted(c for _, c in delta.buckets)  # still cumulative


def test_what_a_server_does_not_export_is_absent_with_its_reason_never_zero() -> None:
    old = (
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{tp_rank="0"} 3.0\n'
        "# TYPE sglang:token_usage gauge\n"
        'sglang:token_usage{tp_rank="0"} 0.5\n'
    )
    scrapes = [Scrape(ts=t, metrics=parse_prometheus(old)) for t in (0.0, 2.0)]
    figures = serving_figures(scrapes, version="0.4.6.post5")
    assert figures.running == 3.0 and figures.token_usage == 0.5
    assert figures.queue_time is None
    assert "from SGLang 0.5.5 on" in figures.absent["queue_time"]
    assert figures.kv_pool is None and "from SGLang 0.5.7 on" in figures.absent["kv_pool"]
    assert (
        figures.ttft is None
        and figures.absent["ttft"] == "this server does not export sglang:time_to_first_token_seconds"
    )
    # one scrape: a window's figure cannot be read yet, and says so
    one = serving_figures(scrapes[:1])
    assert one.covered_s is None and one.gen_tok_s is None
    # a decode line stands in for a figure the scrapes lack, and says where it came from
    line = DecodeBatch(running_req=4, num_tokens=1200, token_usage=0.25, gen_throughput=88.5, queue_req=1)
    filled = serving_figures(scrapes, lines=[line])
    assert filled.gen_tok_s == 88.5 and filled.sources["gen_tok_s"] == "decode line"
    assert filled.running == 3.0 and filled.sources["running"] == "sglang:num_running_reqs"


def test_dp_ranks_and_the_fullest_pool_are_named() -> None:
    text = "".join(
        f'sglang:kv_used_tokens{{dp_rank="{r}",tp_rank="{r}"}} {used}\n'
        f'sglang:max_total_num_tokens{{dp_rank="{r}",tp_rank="{r}"}} 1000.0\n'
        f'sglang:token_usage{{dp_rank="{r}",tp_rank="{r}"}} {usage}\n'
        f'sglang:full_token_usage{{dp_rank="{r}",tp_rank="{r}"}} {used / 1000}\n'
        f'sglang:mamba_usage{{dp_rank="{r}",tp_rank="{r}"}} {usage}\n'
        for r, used, usage in ((0, 100.0, 0.9), (1, 300.0, 0.7))
    )
    figures = serving_figures([Scrape(ts=0.0, metrics=parse_prometheus(text))])
    assert [(r.dp_rank, r.used, r.pool) for r in figures.kv_ranks] == [(0, 100.0, 1000.0), (1, 300.0, 1000.0)]
    assert figures.kv_used == 400.0 and figures.kv_pool == 2000.0
    assert figures.token_usage == 0.9 and figures.full_pool == "mamba"


@pytest.mark.timeout(180)
async def test_the_session_s_rolling_history_gives_the_figures_of_a_full_reading() -> None:
    """`ServingHistory` (what `HostSession` keeps) reads each pair of scrapes once; its window's figures
    must be those of reading every scrape of the window afresh, across a restart and with scrapes
    falling out of the window."""
    first = engine()
    scrapes: list[Scrape] = []
    try:
        scrapes.append(scrape(first, 0.0))
        await serve(first, 4, 800, 30)
        scrapes.append(scrape(first, 200.0))  # the window below is 300 s: 0.0 falls out of it later
        await serve(first, 6, 1500, 20)
        scrapes.append(scrape(first, 260.0))
    finally:
        await first.stop()
    second = engine()  # a restart: counters from zero
    try:
        await serve(second, 3, 500, 25)
        scrapes.append(scrape(second, 320.0))
        scrapes.append(Scrape(ts=340.0, metrics=parse_prometheus("")))  # metrics off for one scrape
        await serve(second, 2, 400, 10)
        scrapes.append(scrape(second, 360.0))
        await serve(second, 5, 700, 15)
        scrapes.append(scrape(second, 380.0))
    finally:
        await second.stop()

    history = ServingHistory(window_s=300.0, max_scrapes=200)
    for i, s in enumerate(scrapes):
        history.add(s)
        full = serving_figures(scrapes[: i + 1], window_s=300.0, version="0.5.12", max_running=64)
        assert history.figures(version="0.5.12", max_running=64) == full, i
    assert [s.ts for s in history.scrapes] == [200.0, 260.0, 320.0, 340.0, 360.0, 380.0]
    assert full.resets >= 1 and full.itl is not None and full.itl.count > 0
    # one trend point per pair of the window; the pairs around the scrape without metrics have none
    assert [p.ts for p in history.trend] == [260.0, 320.0, 340.0, 360.0, 380.0]
    assert history.trend[2].p50["itl"] is None and history.trend[3].p50["itl"] is None
    assert history.trend[-1].p50["itl"] is not None and history.trend[-1].gen_tok_s == 5 * 15 / 20.0


def test_the_history_is_bounded_whatever_the_window() -> None:
    text = parse_prometheus("sglang:num_running_reqs 1\nsglang:generation_tokens_total 5\n")
    history = ServingHistory(window_s=1e9, max_scrapes=10)
    for i in range(1000):
        history.add(Scrape(ts=float(i), metrics=text))
    assert len(history.scrapes) == 10 and len(history.deltas) == 9 and len(history.trend) == 9
    figures = history.figures()
    assert figures.scrapes == 10 and figures.covered_s == 9.0 and figures.gen_tok_s == 0.0


async def test_the_history_reads_each_scrape_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scrape is the newer of one pair and the older of the next: its histograms and counters are read
    off it once, not twice (an idle console's largest cost of a scrape)."""
    eng = engine()
    reads: list[str] = []
    real = serving._read_buckets

    def counted(metrics: MetricsText, name: str) -> object:
        reads.append(name)
        return real(metrics, name)

    monkeypatch.setattr(serving, "_read_buckets", counted)
    history = ServingHistory(window_s=300.0)
    try:
        for ts in (0.0, 2.0, 4.0, 6.0):
            await serve(eng, 1, 50, 3)  # each scrape its own text
            history.add(scrape(eng, ts))
    finally:
        await eng.stop()
    per_scrape = len(serving.WINDOW_HISTOGRAMS)
    assert len(reads) == 4 * per_scrape, f"{len(reads)} readings of 4 scrapes' {per_scrape} histograms"
    assert len(history.deltas) == 3


_BOUNDS = (0.01, 0.1, 1.0, math.inf)


@st.composite
def _deltas(draw: st.DrawFn) -> HistogramDelta | None:
    if draw(st.booleans()) and draw(st.booleans()):
        return None  # a pair that lacks the histogram
    counts = draw(st.lists(st.integers(0, 50), min_size=len(_BOUNDS), max_size=len(_BOUNDS)))
    cumulative = [float(sum(counts[: i + 1])) for i in range(len(counts))]
    return HistogramDelta(
        buckets=tuple(zip(_BOUNDS, cumulative, strict=True)),
        count=cumulative[-1],
        sum=draw(st.floats(0, 100)),
        resets=draw(st.integers(0, 1)),
    )


def _add(a: HistogramDelta, b: HistogramDelta) -> HistogramDelta:
    got = merge_deltas((a, b))
    assert got is not None
    return got


@given(st.lists(st.one_of(_deltas(), st.just("pop")), max_size=80))
@settings(max_examples=200, deadline=None)
def test_a_window_sum_is_the_sum_of_its_window(ops: list[HistogramDelta | str | None]) -> None:
    """`WindowSum` (what `ServingHistory` keeps per histogram) against summing the window afresh."""
    window_sum = WindowSum(_add)
    window: list[HistogramDelta | None] = []
    for op in ops:
        if op == "pop":
            if window:
                window.pop(0)
                window_sum.pop()
        else:
            assert not isinstance(op, str)
            window.append(op)
            window_sum.push(op)
        want = merge_deltas([d for d in window if d is not None])
        got = window_sum.total()
        if want is None:
            assert got is None
        else:
            assert got is not None
            assert (got.buckets, got.count, got.resets) == (want.buckets, want.count, want.resets)
            assert math.isclose(got.sum, want.sum, rel_tol=1e-9, abs_tol=1e-9)


# ---- one figure, one source: the probe's TTFT and the panel's (issue 34) ---------------------------


def test_one_observation_is_its_own_value_not_its_bucket_spread() -> None:
    """A window with one 31 s TTFT (bucket 20-40 s) read p50/p90/p99 30.0/38.0/39.8 s: figures no
    request had. One observation is its sum."""
    bounds = (*TTFT_BUCKETS, math.inf)
    one = HistogramDelta(buckets=tuple((b, 1.0 if b >= 40.0 else 0.0) for b in bounds), count=1.0, sum=31.0)
    assert (one.quantile(0.5), one.quantile(0.9), one.quantile(0.99)) == (31.0, 31.0, 31.0)
    # Two or more: Prometheus' interpolation within the bucket, as before.
    two = HistogramDelta(buckets=tuple((b, 2.0 if b >= 40.0 else 0.0) for b in bounds), count=2.0, sum=62.0)
    assert two.quantile(0.5) == pytest.approx(30.0)


@pytest.mark.timeout(60)
async def test_the_server_s_ttft_is_what_its_client_waited() -> None:
    """The twin plays prefill faster than a real host (its time scale): its /metrics said 20 s for a
    request whose client (the probe) waited 0.3 s. Its histograms now hold what clients wait."""
    config = dataclasses.replace(engine_config(), time_scale=0.01)
    eng = Engine(get_scenario(), config, LogWriter(io.StringIO()))
    eng.start()
    try:
        first = scrape(eng, 0.0)
        t0 = time.monotonic()
        req = eng.submit([(j * 7919) % 150_000 + 1 for j in range(60_000)], 3, ignore_eos=True)
        async with asyncio.timeout(30):
            await req.updates.get()  # the first token
            waited = time.monotonic() - t0
            while not req.done:
                await req.updates.get()
        ended = time.monotonic() - t0
        figures = serving_figures([first, scrape(eng, 10.0)], window_s=300.0)
    finally:
        await eng.stop()
    ttft, e2e = figures.ttft, figures.e2e
    assert ttft is not None and ttft.count == 1 and e2e is not None
    # 60k tokens at 9k tok/s: ~6.7 simulated seconds (what /metrics said), ~67 ms on the clock at this
    # scale; the client's wait also holds its own wake-up, which a loaded machine delays.
    prefill = 60_000 / get_scenario().prefill_tokens_per_s * config.time_scale
    assert ttft.p99 == ttft.p50 and prefill * 0.9 <= ttft.p50 <= waited, (ttft, prefill, waited)
    assert e2e.p50 is not None and ttft.p50 < e2e.p50 <= ended
