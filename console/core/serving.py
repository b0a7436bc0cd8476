"""Serving figures over a rolling window, from successive `/metrics` scrapes (and the scheduler's lines).

Latencies (TTFT, inter-token latency, end-to-end, queue time) are quantiles of the *window's* requests:
the histogram bucket counts of the last scrape minus those of the first one in the window, summed pair
by pair so that a server restart (every counter back to zero) is read as Prometheus' `increase()` does:
after a drop, the new value is the increase. Rates (generation and prefill tok/s, requests/s) are
counter deltas over the time the window's scrapes really span. Gauges (running, queued, KV tokens used,
token usage) are the newest scrape's.

Which metric each figure reads, and since which SGLang version it is exported, is the table
`serving_metrics.METRICS`; a figure the server does not export is `None` and named in `ServingFigures.absent` with the
reason, never shown as zero. Nothing here does I/O or knows the time: scrapes carry their own times.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from console.core.events import DecodeBatch, PrefillBatch
from console.core.metrics import MetricsText, family_of, refusal, sane_value
from console.core.serving_metrics import absent_reason as _not_exported

DEFAULT_WINDOW_S = 300.0
QUANTILES = (0.5, 0.9, 0.99)
MAX_RUNNING_MAX = 1e6
"""The largest `max_running_requests` taken from `/server_info` (SGLang's default is a few thousand)."""


class Scrape(BaseModel, defer_build=True):
    """One `/metrics` reading at a time (seconds, any clock the caller keeps consistent)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ts: float
    metrics: MetricsText


class Latency(BaseModel, defer_build=True):
    """Quantiles of one latency histogram over the window (seconds), linear within a bucket as
    Prometheus' `histogram_quantile` does; None where the window holds no observation."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: str
    count: float
    """Observations in the window."""
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None


class RankKv(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True, extra="forbid")

    dp_rank: int | None
    used: float | None = None
    pool: float | None = None
    engine_type: str | None = None
    """`prefill` / `decode` when the scrape holds more than one engine (PD disaggregation behind one URL)."""


class PoolUsage(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """`kv` (full attention), `swa` (sliding-window layers), `mamba` (the state pool)."""
    usage: float
    used: float | None = None
    """Tokens (mamba: slots) in use, where the server exports it (0.5.11 on)."""
    capacity: float | None = None
    """The pool's size in tokens, where the server exports it (kv 0.5.7 on, swa 0.5.19 on)."""


class KvTransfer(BaseModel, defer_build=True):
    """PD disaggregation's KV transfers (`sglang:kv_transfer_*`): each figure the window's mean where the
    server exports histograms (0.5.10 on), else the newest scrape's gauge (the last transfer, 0.5.2-0.5.9)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    latency_ms: float | None = None
    latency_p99_ms: float | None = None
    speed_gb_s: float | None = None
    bootstrap_ms: float | None = None
    alloc_ms: float | None = None
    total_mb: float | None = None
    transfers: float | None = None
    """Transfers in the window (histograms only)."""
    read: str
    """`window` (histograms) or `last` (gauges)."""


class HiCache(BaseModel, defer_build=True):
    """The hierarchical cache (`--enable-hierarchical-cache`): its host pool and the window's token rates."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host_used_tokens: float | None = None
    host_total_tokens: float | None = None
    backup_tok_s: float | None = None
    """GPU → host (`backuped_tokens_total`)."""
    prefetch_tok_s: float | None = None
    """Storage → host (`prefetched_tokens_total`)."""
    load_back_tok_s: float | None = None
    """Host → GPU (`load_back_tokens_total`, one rank's count)."""


class ServingFigures(BaseModel, defer_build=True):
    """One reading of how the server serves, over a window; every figure None when not exported."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    window_s: float
    """The window asked for."""
    covered_s: float | None = None
    """What the window really was: from the first to the last scrape used (None with one scrape)."""
    scrapes: int = 0
    as_of: float | None = None
    """When the newest scrape of the window was read (epoch seconds; None without one): how old the
    figures are, which the dashboard says once it is more than a few scrape intervals."""
    resets: int = 0
    """Counter resets seen between scrapes in the window (a server restart)."""
    version: str | None = None

    ttft: Latency | None = None
    itl: Latency | None = None
    """Inter-token latency (TPOT): `inter_token_latency_seconds`, else `time_per_output_token_seconds`."""
    e2e: Latency | None = None
    queue_time: Latency | None = None

    running: float | None = None
    queued: float | None = None
    max_running: float | None = None
    """`max_running_requests` (from `/server_info`; SGLang exports no metric of it)."""
    kv_used: float | None = None
    kv_pool: float | None = None
    kv_ranks: tuple[RankKv, ...] = ()
    """KV tokens per DP rank, when the server runs DP attention (more than one `dp_rank`)."""
    token_usage: float | None = None
    pools: tuple[PoolUsage, ...] = ()
    full_pool: str | None = None
    """Which pool `token_usage` (the max over pools) is: `kv`, `swa` or `mamba`."""

    gen_tok_s: float | None = None
    prefill_tok_s: float | None = None
    requests_s: float | None = None
    cache_hit_rate: float | None = None
    """Cached over prompt tokens of the window's requests (else SGLang's own gauge)."""
    spec_accept_length: float | None = None
    spec_accept_rate: float | None = None
    page_size: float | None = None
    num_pages: float | None = None
    kv_transfer: KvTransfer | None = None
    hicache: HiCache | None = None
    engine_types: tuple[str, ...] = ()
    """The `engine_type` labels the newest scrape holds (`unified`, `prefill`, `decode`)."""
    read_as: dict[str, str] = Field(default_factory=dict)
    """What the newest scrape wrote that was read as today's names and units (`metrics.normalise`): an
    older generation's names, an `sglang_` re-export, a percent `cache_hit_rate`."""
    sources: dict[str, str] = Field(default_factory=dict)
    """Figure → where it came from (a metric name, or `decode line` / `prefill line`)."""
    absent: dict[str, str] = Field(default_factory=dict)
    """Figure → why it is absent (the server does not export it, or the window is too short)."""
    refused: dict[str, str] = Field(default_factory=dict)
    """Metric family → the value out of range the window's newest scrape held for it (`+Inf`, `-3`): the
    family is left out (`metrics.MetricsText`), its figures absent with the refusal as the reason."""


# ---------------------------------------------------------------------------------------------- deltas

_LabelKey = tuple[tuple[str, str], ...]


def _key(labels: dict[str, str], drop: str = "") -> _LabelKey:
    return tuple(sorted((k, v) for k, v in labels.items() if k != drop))


def _counter(metrics: MetricsText, name: str) -> dict[_LabelKey, float]:
    made: dict[_LabelKey, float] | None = metrics.derived.get(("counter", name))
    if made is None:
        made = metrics.derived[("counter", name)] = _read_counter(metrics, name)
    return made


def _read_counter(metrics: MetricsText, name: str) -> dict[_LabelKey, float]:
    out: dict[_LabelKey, float] = {}
    found = metrics.replicas(name)
    if any("pool" in s.labels for s in found):
        # 0.5.23's load-back count is per host pool (kv, swa, mamba): the same tokens in each; the kv one.
        found = [s for s in found if s.labels.get("pool", "kv") == "kv"]
    for s in found:
        if not math.isnan(s.value):
            out[_key(s.labels)] = out.get(_key(s.labels), 0.0) + s.value
    return out


def _counter_increase(scrapes: Sequence[Scrape], name: str) -> tuple[float | None, int]:
    """The increase of a counter over the scrapes (summed over series), and the resets seen.
    None when no scrape exports it or fewer than two do."""
    total = 0.0
    resets = 0
    pairs = 0
    prev: dict[_LabelKey, float] | None = None
    for scrape in scrapes:
        now = _counter(scrape.metrics, name)
        if not now:
            prev = None
            continue
        if prev is not None:
            pairs += 1
            for key, value in now.items():
                before = prev.get(key)
                if before is None or value < before:
                    resets += before is not None
                    total += value
                else:
                    total += value - before
        prev = now
    return (total if pairs else None), resets


_Buckets = dict[_LabelKey, dict[float, float]]


def _buckets(
    metrics: MetricsText, name: str
) -> tuple[_Buckets, dict[_LabelKey, float], dict[_LabelKey, float]]:
    made: tuple[_Buckets, dict[_LabelKey, float], dict[_LabelKey, float]] | None = metrics.derived.get(
        ("buckets", name)
    )
    if made is None:
        made = metrics.derived[("buckets", name)] = _read_buckets(metrics, name)
    return made


def _read_buckets(
    metrics: MetricsText, name: str
) -> tuple[_Buckets, dict[_LabelKey, float], dict[_LabelKey, float]]:
    buckets: _Buckets = {}
    for s in metrics.replicas(f"{name}_bucket"):
        try:
            le = float(s.labels.get("le", ""))
        except ValueError:
            continue
        series = buckets.setdefault(_key(s.labels, drop="le"), {})
        series[le] = series.get(le, 0.0) + s.value
    return buckets, _counter(metrics, f"{name}_count"), _counter(metrics, f"{name}_sum")


class HistogramDelta(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True, extra="forbid")

    buckets: tuple[tuple[float, float], ...]
    """(upper bound, cumulative count in the window), ascending, ending at +inf."""
    count: float
    sum: float
    resets: int = 0

    def quantile(self, q: float) -> float | None:
        """`histogram_quantile`: linear within the bucket holding rank q·count (from 0 for the first
        bucket); in the +inf bucket, the highest finite bound."""
        if self.count <= 0 or not self.buckets:
            return None
        if self.count == 1 and self._in_its_bucket(self.sum):
            # One observation is its own sum, exactly: interpolating put one 31 s TTFT at p50 30 s, p90
            # 38 s, p99 39.8 s (the bucket 20-40 s spread out), figures no request had.
            return self.sum
        rank = q * self.count
        lower, below = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank and cumulative > below:
                if math.isinf(bound):
                    return lower
                return lower + (bound - lower) * (rank - below) / (cumulative - below)
            lower, below = bound, cumulative
        return lower

    def _in_its_bucket(self, value: float) -> bool:
        """Whether `value` lies in the bucket that holds the window's first observation."""
        lower = 0.0
        for bound, cumulative in self.buckets:
            if cumulative > 0:
                return lower <= value <= bound
            lower = bound
        return False


def histogram_increase(scrapes: Sequence[Scrape], name: str) -> HistogramDelta | None:
    """The window's observations of histogram `name`: bucket increases pair by pair (a series whose
    count went down restarted: its new counts are the increase). None when fewer than two scrapes
    export it."""
    acc: dict[float, float] = {}
    count = 0.0
    total = 0.0
    resets = 0
    pairs = 0
    prev: tuple[_Buckets, dict[_LabelKey, float], dict[_LabelKey, float]] | None = None
    for scrape in scrapes:
        now = _buckets(scrape.metrics, name)
        if not now[1]:
            prev = None
            continue
        if prev is not None:
            pairs += 1
            for key, series in now[0].items():
                before = prev[0].get(key)
                n_now = now[1].get(key, 0.0)
                n_before = prev[1].get(key)
                reset = before is None or n_before is None or n_now < n_before
                reset = reset or any(v < (before or {}).get(le, 0.0) for le, v in series.items())
                if reset and before is not None:
                    resets += 1
                for le, v in series.items():
                    acc[le] = acc.get(le, 0.0) + (v if reset else v - (before or {}).get(le, 0.0))
                count += n_now if reset else n_now - (n_before or 0.0)
                s_now = now[2].get(key, 0.0)
                total += s_now if reset else s_now - prev[2].get(key, 0.0)
        prev = now
    if not pairs:
        return None
    return HistogramDelta(buckets=tuple(sorted(acc.items())), count=count, sum=total, resets=resets)


def _latency(delta: HistogramDelta, metric: str) -> Latency:
    p50, p90, p99 = (delta.quantile(q) for q in QUANTILES)
    mean = delta.sum / delta.count if delta.count > 0 else None
    return Latency(metric=metric, count=delta.count, mean=mean, p50=p50, p90=p90, p99=p99)


# ------------------------------------------------------------------------------- a session's history

LATENCY_METRICS: dict[str, tuple[str, ...]] = {
    "ttft": ("sglang:time_to_first_token_seconds",),
    "itl": ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    "e2e": ("sglang:e2e_request_latency_seconds",),
    "queue_time": ("sglang:queue_time_seconds",),
}
KV_TRANSFER_METRICS: dict[str, str] = {
    "latency_ms": "sglang:kv_transfer_latency_ms",
    "speed_gb_s": "sglang:kv_transfer_speed_gb_s",
    "bootstrap_ms": "sglang:kv_transfer_bootstrap_ms",
    "alloc_ms": "sglang:kv_transfer_alloc_ms",
    "total_mb": "sglang:kv_transfer_total_mb",
}
WINDOW_HISTOGRAMS = (*(n for names in LATENCY_METRICS.values() for n in names), *KV_TRANSFER_METRICS.values())
HICACHE_COUNTERS: dict[str, str] = {
    "backup_tok_s": "sglang:backuped_tokens_total",
    "prefetch_tok_s": "sglang:prefetched_tokens_total",
    "load_back_tok_s": "sglang:load_back_tokens_total",
}
COUNTER_METRICS = (
    "sglang:generation_tokens_total",
    "sglang:prompt_tokens_total",
    "sglang:num_requests_total",
    "sglang:cached_tokens_total",
    *HICACHE_COUNTERS.values(),
)


class PairDelta(BaseModel, defer_build=True):
    """What happened between two successive scrapes: each histogram's and counter's increase (only
    those both scrapes export), read once, so that a window's figures are sums of these."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    start_ts: float
    end_ts: float
    histograms: dict[str, HistogramDelta] = Field(default_factory=dict)
    counters: dict[str, tuple[float, int]] = Field(default_factory=dict)
    """Name → (increase, resets)."""


def pair_delta(before: Scrape, after: Scrape) -> PairDelta:
    pair = (before, after)
    histograms = {}
    for name in WINDOW_HISTOGRAMS:
        delta = histogram_increase(pair, name)
        if delta is not None:
            histograms[name] = delta
    counters = {}
    for name in COUNTER_METRICS:
        increase, resets = _counter_increase(pair, name)
        if increase is not None:
            counters[name] = (increase, resets)
    return PairDelta(start_ts=before.ts, end_ts=after.ts, histograms=histograms, counters=counters)


def merge_deltas(deltas: Sequence[HistogramDelta]) -> HistogramDelta | None:
    """The sum of histogram increases (successive pairs of one window); None when there are none."""
    if not deltas:
        return None
    acc: dict[float, float] = {}
    for d in deltas:
        for le, v in d.buckets:
            acc[le] = acc.get(le, 0.0) + v
    # model_construct: sums of validated deltas (this runs per figure per scrape over the whole window)
    return HistogramDelta.model_construct(
        buckets=tuple(sorted(acc.items())),
        count=sum(d.count for d in deltas),
        sum=sum(d.sum for d in deltas),
        resets=sum(d.resets for d in deltas),
    )


class TrendPoint(BaseModel, defer_build=True):
    """One scrape interval, for the sparklines: each latency's p50 over the interval's observations
    (None where it saw none or the metric is absent) and the generation rate of the interval."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ts: float
    p50: dict[str, float | None] = Field(default_factory=dict)
    """Figure (`ttft`, `itl`, `e2e`, `queue_time`) → p50 of the interval, seconds."""
    gen_tok_s: float | None = None


def trend_point(delta: PairDelta) -> TrendPoint:
    p50: dict[str, float | None] = {}
    for figure, names in LATENCY_METRICS.items():
        hd = next((delta.histograms[n] for n in names if n in delta.histograms), None)
        p50[figure] = hd.quantile(0.5) if hd is not None else None
    gen = delta.counters.get("sglang:generation_tokens_total")
    span = delta.end_ts - delta.start_ts
    return TrendPoint(
        ts=delta.end_ts, p50=p50, gen_tok_s=gen[0] / span if gen is not None and span > 0 else None
    )


# ---------------------------------------------------------------------------------------------- figures


def in_window(scrapes: Sequence[Scrape], window_s: float) -> list[Scrape]:
    """The scrapes of the last `window_s` seconds before the newest one, oldest first."""
    ordered = sorted(scrapes, key=lambda s: s.ts)
    if not ordered:
        return []
    start = ordered[-1].ts - window_s
    return [s for s in ordered if s.ts >= start]


def _gauge_sum(m: MetricsText, name: str) -> float | None:
    return m.total(name)


def serving_figures(
    scrapes: Sequence[Scrape],
    *,
    window_s: float = DEFAULT_WINDOW_S,
    version: str | None = None,
    max_running: float | None = None,
    lines: Sequence[DecodeBatch | PrefillBatch] = (),
    deltas: Sequence[PairDelta] | None = None,
    sums: Mapping[str, HistogramDelta | None] | None = None,
) -> ServingFigures:
    """The serving figures of the window ending at the newest scrape.

    `lines` are the scheduler's decode and prefill lines of the same window (oldest first): they stand
    in for a figure the scrapes lack (no `--enable-metrics`, or an old server), and say so in
    `sources`. `deltas`, when given, are the window's successive pairs already read (`pair_delta`, one
    per pair of successive scrapes of the window): the figures are the same, without reading every
    scrape of the window again (`ServingHistory` keeps them). `sums`, with `deltas`: each histogram's
    sum over them, already added up (`ServingHistory.histogram_sums`)."""
    window = in_window(scrapes, window_s)
    if deltas is not None:
        start = window[0].ts if window else math.inf
        given = len(deltas)
        deltas = [d for d in deltas if d.start_ts >= start]
        if len(deltas) != given:
            sums = None  # they were summed over pairs the window has left

    def hist(name: str) -> HistogramDelta | None:
        if deltas is None:
            return histogram_increase(window, name)
        if sums is not None and name in sums:
            return sums[name]
        return merge_deltas([d.histograms[name] for d in deltas if name in d.histograms])

    def counter(name: str) -> tuple[float | None, int]:
        if deltas is None:
            return _counter_increase(window, name)
        got = [d.counters[name] for d in deltas if name in d.counters]
        if not got:
            return None, 0
        return sum(v for v, _ in got), sum(n for _, n in got)

    fields: dict[str, object] = {"window_s": window_s, "scrapes": len(window), "version": version}
    sources: dict[str, str] = {}
    absent: dict[str, str] = {}
    resets = 0
    if len(window) >= 2:
        fields["covered_s"] = window[-1].ts - window[0].ts
    if window:
        fields["as_of"] = window[-1].ts
    last = window[-1].metrics if window else None
    refused = dict(last.refused) if last is not None else {}

    def absent_reason(name: str, version: str | None) -> str:
        """Why `name` is absent: refused for a value out of range, else not exported (by this version)."""
        family = family_of(name)
        if family in refused:
            return refusal(family, refused[family])
        return _not_exported(name, version)

    def need_two(figure: str) -> None:
        absent[figure] = "one scrape in the window: a window's figure needs two"

    # latencies
    for figure, names in (
        ("ttft", ("sglang:time_to_first_token_seconds",)),
        ("itl", ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds")),
        ("e2e", ("sglang:e2e_request_latency_seconds",)),
        ("queue_time", ("sglang:queue_time_seconds",)),
    ):
        for name in names:
            delta = hist(name)
            if delta is not None:
                fields[figure] = _latency(delta, name)
                sources[figure] = name
                resets = max(resets, delta.resets)
                break
        else:
            exported = last is not None and any(last.total(f"{n}_count") is not None for n in names)
            if exported:
                need_two(figure)
            else:
                absent[figure] = absent_reason(names[0], version)

    # rates
    covered = fields.get("covered_s")
    for figure, name in (
        ("gen_tok_s", "sglang:generation_tokens_total"),
        ("prefill_tok_s", "sglang:prompt_tokens_total"),
        ("requests_s", "sglang:num_requests_total"),
    ):
        increase, n = counter(name)
        resets = max(resets, n)
        if increase is not None and isinstance(covered, float) and covered > 0:
            fields[figure] = increase / covered
            sources[figure] = f"rate of {name}"
        elif last is not None and last.total(name) is not None:
            need_two(figure)
        else:
            absent[figure] = absent_reason(name, version)
    cached, _ = counter("sglang:cached_tokens_total")
    prompt, _ = counter("sglang:prompt_tokens_total")
    if cached is not None and prompt:
        fields["cache_hit_rate"] = cached / prompt
        sources["cache_hit_rate"] = "sglang:cached_tokens_total / sglang:prompt_tokens_total"
    elif last is not None and last.mean("sglang:cache_hit_rate") is not None:
        fields["cache_hit_rate"] = last.mean("sglang:cache_hit_rate")
        unit = last.read_as.get("sglang:cache_hit_rate")
        sources["cache_hit_rate"] = "sglang:cache_hit_rate" + (f" ({unit})" if unit else "")
    else:
        absent["cache_hit_rate"] = (
            "no prompt tokens in the window"
            if prompt == 0
            else absent_reason("sglang:cached_tokens_total", version)
        )

    # gauges (the newest scrape)
    if last is not None:
        for figure, name in (("running", "sglang:num_running_reqs"), ("queued", "sglang:num_queue_reqs")):
            value = _gauge_sum(last, name)
            if value is None:
                absent[figure] = absent_reason(name, version)
            else:
                fields[figure] = value
                sources[figure] = name
        used_name = (
            "sglang:kv_used_tokens"
            if last.total("sglang:kv_used_tokens") is not None
            else "sglang:num_used_tokens"
        )
        used = last.total(used_name)
        pool = last.total("sglang:max_total_num_tokens")
        if used is not None:
            fields["kv_used"] = used
            sources["kv_used"] = used_name
        else:
            absent["kv_used"] = absent_reason(used_name, version)
        if pool is not None:
            fields["kv_pool"] = pool
            sources["kv_pool"] = "sglang:max_total_num_tokens"
        else:
            absent["kv_pool"] = absent_reason("sglang:max_total_num_tokens", version)
        fields["kv_ranks"] = _kv_ranks(last, used_name)
        pools = []
        for pool_name, name, used_metric, size_metric in (
            ("kv", "sglang:full_token_usage", used_name, "sglang:max_total_num_tokens"),
            ("swa", "sglang:swa_token_usage", "sglang:swa_used_tokens", "sglang:max_total_num_tokens_swa"),
            ("mamba", "sglang:mamba_usage", "sglang:mamba_used_tokens", ""),
        ):
            value = last.maximum(name)
            if value is not None:
                pools.append(
                    PoolUsage(
                        name=pool_name,
                        usage=value,
                        used=last.total(used_metric),
                        capacity=last.total(size_metric) if size_metric else None,
                    )
                )
        usage = last.maximum("sglang:token_usage")
        if usage is not None:
            fields["token_usage"] = usage
            sources["token_usage"] = "sglang:token_usage"
            if not pools:
                pools.append(PoolUsage(name="kv", usage=usage, used=used, capacity=pool))
        elif pools:
            fields["token_usage"] = max(p.usage for p in pools)
            sources["token_usage"] = "max of the pools' usage"
        else:
            absent["token_usage"] = absent_reason("sglang:token_usage", version)
        if pools:
            fields["pools"] = tuple(pools)
            fields["full_pool"] = max(pools, key=lambda p: p.usage).name
        for figure, name in (("page_size", "sglang:page_size"), ("num_pages", "sglang:num_pages")):
            value = last.maximum(name) if figure == "page_size" else last.total(name)
            if value is not None:
                fields[figure] = value
                sources[figure] = name
        fields["engine_types"] = tuple(
            sorted({s.labels["engine_type"] for s in last.samples if "engine_type" in s.labels})
        )
        fields["read_as"] = dict(last.read_as)
        transfer = _kv_transfer(last, hist)
        if transfer is not None:
            fields["kv_transfer"] = transfer
            sources["kv_transfer"] = f"sglang:kv_transfer_* ({transfer.read})"
        hicache = _hicache(last, counter, covered if isinstance(covered, float) else None)
        if hicache is not None:
            fields["hicache"] = hicache
            sources["hicache"] = "sglang:hicache_host_*, *_tokens_total"
        length = last.mean("sglang:spec_accept_length")
        rate = last.mean("sglang:spec_accept_rate")
        # SGLang leaves the gauges at 0 without speculative decoding (an accepted length is at least 1).
        if length is not None and length > 0:
            fields["spec_accept_length"] = length
            sources["spec_accept_length"] = "sglang:spec_accept_length"
            if rate is not None:
                fields["spec_accept_rate"] = rate
                sources["spec_accept_rate"] = "sglang:spec_accept_rate"
            else:
                absent["spec_accept_rate"] = absent_reason("sglang:spec_accept_rate", version)
        elif length is not None:
            absent["spec_accept_length"] = absent["spec_accept_rate"] = "no speculative decoding"
        else:
            absent["spec_accept_length"] = absent_reason("sglang:spec_accept_length", version)
            absent["spec_accept_rate"] = absent_reason("sglang:spec_accept_rate", version)
    else:
        for figure in ("running", "queued", "kv_used", "kv_pool", "token_usage"):
            absent[figure] = "no /metrics scrape"
    if max_running is not None and (sane_value(max_running) is None or max_running > MAX_RUNNING_MAX):
        absent["max_running"] = (
            f"/server_info max_running_requests {max_running:g}: refused (not a number from 0 to "
            f"{MAX_RUNNING_MAX:g})"
        )
    elif max_running is not None:
        fields["max_running"] = max_running
        sources["max_running"] = "/server_info max_running_requests"
    else:
        absent["max_running"] = "max_running_requests unknown (SGLang exports no metric of it)"

    _from_lines(lines, fields, sources, absent)
    fields["resets"] = resets
    fields["sources"] = sources
    fields["absent"] = absent
    fields["refused"] = refused
    return ServingFigures.model_validate(fields)


def _kv_ranks(last: MetricsText, used_name: str) -> tuple[RankKv, ...]:
    """KV tokens per DP rank (and per engine where a scrape holds a prefill and a decode engine), when
    there is more than one; each rank's TP/PP copies read once."""
    engines = last.label_values(used_name, "engine_type")
    ranks = last.label_values(used_name, "dp_rank")
    groups = [(e, r) for e in (engines or (None,)) for r in (ranks or (None,))]
    if len(groups) < 2:
        return ()
    out = []
    for engine, rank in groups:
        labels = {k: v for k, v in (("engine_type", engine), ("dp_rank", rank)) if v is not None}
        used = last.total(used_name, **labels)
        if used is None:
            continue
        out.append(
            RankKv(
                dp_rank=int(rank) if rank is not None and rank.isdigit() else None,
                used=used,
                pool=last.total("sglang:max_total_num_tokens", **labels),
                engine_type=engine if len(engines) > 1 else None,
            )
        )
    return tuple(out)


def _kv_transfer(last: MetricsText, hist: Callable[[str], HistogramDelta | None]) -> KvTransfer | None:
    """The window's transfers where the server exports histograms, else the newest gauges."""
    if any(last.total(f"{name}_count") is not None for name in KV_TRANSFER_METRICS.values()):
        figures: dict[str, float | None] = {}
        transfers = None
        for figure, name in KV_TRANSFER_METRICS.items():
            delta = hist(name)
            figures[figure] = delta.sum / delta.count if delta is not None and delta.count > 0 else None
            if figure == "latency_ms" and delta is not None:
                transfers = delta.count
                figures["latency_p99_ms"] = delta.quantile(0.99) if delta.count > 0 else None
        return KvTransfer.model_validate({**figures, "transfers": transfers, "read": "window"})
    gauges = {figure: last.mean(name) for figure, name in KV_TRANSFER_METRICS.items()}
    if all(v is None for v in gauges.values()):
        return None
    return KvTransfer.model_validate({**gauges, "read": "last"})


def _hicache(
    last: MetricsText,
    counter: Callable[[str], tuple[float | None, int]],
    covered: float | None,
) -> HiCache | None:
    used = last.total("sglang:hicache_host_used_tokens")
    total = last.total("sglang:hicache_host_total_tokens")
    rates: dict[str, float | None] = {}
    for figure, name in HICACHE_COUNTERS.items():
        increase, _ = counter(name)
        rates[figure] = increase / covered if increase is not None and covered else None
    if used is None and total is None and all(v is None for v in rates.values()):
        return None
    return HiCache.model_validate({"host_used_tokens": used, "host_total_tokens": total, **rates})


def _from_lines(
    lines: Sequence[DecodeBatch | PrefillBatch],
    fields: dict[str, object],
    sources: dict[str, str],
    absent: dict[str, str],
) -> None:
    """Fill what the scrapes lack from the newest decode / prefill line (its own figures, as logged)."""
    decode = next((e for e in reversed(lines) if isinstance(e, DecodeBatch)), None)
    prefill = next((e for e in reversed(lines) if isinstance(e, PrefillBatch)), None)
    candidates: list[tuple[str, float | int | None, str]] = []
    if decode is not None:
        candidates += [
            ("gen_tok_s", decode.gen_throughput, "decode line"),
            ("running", decode.running_req, "decode line"),
            ("queued", decode.queue_req, "decode line"),
            ("kv_used", decode.num_tokens, "decode line"),
            ("token_usage", decode.token_usage, "decode line"),
            ("spec_accept_length", decode.accept_len, "decode line"),
            ("spec_accept_rate", decode.accept_rate, "decode line"),
        ]
    if prefill is not None:
        candidates += [
            ("prefill_tok_s", prefill.input_throughput, "prefill line"),
            ("running", prefill.running_req, "prefill line"),
            ("queued", prefill.queue_req, "prefill line"),
        ]
    for figure, value, source in candidates:
        if value is not None and fields.get(figure) is None:
            fields[figure] = float(value)
            sources[figure] = source
            absent.pop(figure, None)
