"""Which SGLang metric each serving figure reads, which SGLang releases export it under which name, and
the sentence that says why a figure is absent: the one names-per-version table (`METRICS`, `ALIASES`),
read from SGLang's own metrics collector in every release listed in `RELEASES_READ`
(`srt/metrics/collector.py` up to 0.5.9, `srt/observability/metrics_collector.py` from 0.5.10) and from
the 2024-11 main branch (git history of sgl-project/sglang). `generation_table()` renders it for
docs/serving.md, which a test holds equal to it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from console.core.versions import version_tuple

RELEASES_READ: tuple[str, ...] = (
    "0.3.5.post1",
    "0.3.6",
    "0.4.0",
    "0.4.1",
    "0.4.3",
    "0.4.6",
    "0.4.9",
    "0.5.1",
    "0.5.2",
    "0.5.5",
    "0.5.7",
    "0.5.8",
    "0.5.9",
    "0.5.10",
    "0.5.11",
    "0.5.12.post1",
    "0.5.13",
    "0.5.16",
    "0.5.19",
    "0.5.23",
)
"""The PyPI wheels whose collector was read, oldest first. 0.3.5 itself exports no metric."""

DEV_2024_11 = "2024-11 main"
"""SGLang's first metrics: the main branch from a146d99 (2024-11-06, #1853) to 1929c06 (2024-11-10, #1981),
between the 0.3.5 and 0.3.5.post1 releases, in no wheel (built from source or a dev image). It reports
version 0.3.5. Its names (`num_requests_running`, `num_requests_waiting`), its `cache_hit_rate` in percent
and, in the PR's revisions as published, its `name=` label are read as today's (`ALIASES`)."""

DEV_2024_11_VERSION = "0.3.5"


class MetricName(BaseModel, defer_build=True):
    """One metric the console reads, under the name today's SGLang exports it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    figure: str
    """The `ServingFigures` field (or group of fields) it feeds."""
    kind: str
    """`gauge`, `counter` or `histogram` (`gauge → histogram` where a release changed it)."""
    since: str
    """The first release read that exports it (`RELEASES_READ`): an unread release before it may too."""
    until: str | None = None
    """The last release read that exports it; None while the newest read still does."""
    dev_2024_11: bool = False
    """Exported by the 2024-11 main build too."""
    dev_2024_11_name: str | None = None
    """The name the 2024-11 build gave it, where not this one."""
    note: str = ""


def _m(name: str, figure: str, kind: str, since: str, **kw: object) -> MetricName:
    return MetricName.model_validate(
        {"name": f"sglang:{name}", "figure": figure, "kind": kind, "since": since, **kw}
    )


_TABLE = (
    _m(
        "num_running_reqs",
        "running",
        "gauge",
        "0.3.5.post1",
        dev_2024_11=True,
        dev_2024_11_name="num_requests_running",
    ),
    _m(
        "num_queue_reqs",
        "queued",
        "gauge",
        "0.3.5.post1",
        dev_2024_11=True,
        dev_2024_11_name="num_requests_waiting",
    ),
    _m("num_used_tokens", "kv_used", "gauge", "0.3.5.post1", note="before kv_used_tokens"),
    _m("token_usage", "token_usage", "gauge", "0.3.5.post1", dev_2024_11=True, note="the max over the pools"),
    _m("gen_throughput", "(SglangMetrics)", "gauge", "0.3.5.post1", dev_2024_11=True),
    _m(
        "cache_hit_rate",
        "cache_hit_rate",
        "gauge",
        "0.3.5.post1",
        dev_2024_11=True,
        note="a fraction; the 2024-11 build's is a percent",
    ),
    _m("prompt_tokens_total", "prefill_tok_s", "counter", "0.3.5.post1", dev_2024_11=True),
    _m("generation_tokens_total", "gen_tok_s", "counter", "0.3.5.post1", dev_2024_11=True),
    _m("num_requests_total", "requests_s", "counter", "0.4.3"),
    _m("cached_tokens_total", "cache_hit_rate", "counter", "0.4.6"),
    _m("time_to_first_token_seconds", "ttft", "histogram", "0.3.5.post1", dev_2024_11=True),
    _m("time_per_output_token_seconds", "itl", "histogram", "0.3.5.post1", until="0.4.3", dev_2024_11=True),
    _m("inter_token_latency_seconds", "itl", "histogram", "0.4.6"),
    _m("e2e_request_latency_seconds", "e2e", "histogram", "0.3.5.post1", dev_2024_11=True),
    _m("queue_time_seconds", "queue_time", "histogram", "0.5.5", note="0.5.2: sglang:queue_time_s"),
    _m("max_total_num_tokens", "kv_pool", "gauge", "0.5.7", dev_2024_11=True),
    _m("kv_used_tokens", "kv_used", "gauge", "0.5.11"),
    _m("full_token_usage", "pools", "gauge", "0.5.10", note="hybrid models: the full-attention pool"),
    _m("swa_token_usage", "pools", "gauge", "0.5.2", note="sliding-window models"),
    _m("swa_used_tokens", "pools", "gauge", "0.5.12.post1"),
    _m("max_total_num_tokens_swa", "pools", "gauge", "0.5.19"),
    _m("mamba_usage", "pools", "gauge", "0.5.5", note="hybrid linear-attention models: the state pool"),
    _m("mamba_used_tokens", "pools", "gauge", "0.5.12.post1"),
    _m("spec_accept_length", "spec_accept_length", "gauge", "0.4.3"),
    _m("spec_accept_rate", "spec_accept_rate", "gauge", "0.5.5"),
    _m(
        "cache_config_info",
        "page_size, num_pages",
        "gauge",
        "0.5.9",
        until="0.5.10",
        note="labels page_size, num_pages",
    ),
    _m("page_size", "page_size", "gauge", "0.5.11"),
    _m("num_pages", "num_pages", "gauge", "0.5.11"),
    _m("kv_transfer_latency_ms", "kv_transfer", "gauge → histogram", "0.5.2", note="a histogram from 0.5.10"),
    _m("kv_transfer_speed_gb_s", "kv_transfer", "gauge → histogram", "0.5.2", note="a histogram from 0.5.10"),
    _m(
        "kv_transfer_bootstrap_ms",
        "kv_transfer",
        "gauge → histogram",
        "0.5.5",
        note="a histogram from 0.5.10",
    ),
    _m("kv_transfer_alloc_ms", "kv_transfer", "gauge → histogram", "0.5.5", note="a histogram from 0.5.10"),
    _m("kv_transfer_total_mb", "kv_transfer", "gauge → histogram", "0.5.7", note="a histogram from 0.5.10"),
    _m("hicache_host_used_tokens", "hicache", "gauge", "0.5.10"),
    _m("hicache_host_total_tokens", "hicache", "gauge", "0.5.10"),
    _m("prefetched_tokens_total", "hicache", "counter", "0.5.2"),
    _m("backuped_tokens_total", "hicache", "counter", "0.5.2"),
    _m("load_back_tokens_total", "hicache", "counter", "0.5.7", note="one count per rank: read one rank"),
)

METRICS: dict[str, MetricName] = {m.name: m for m in _TABLE}


class Alias(BaseModel, defer_build=True):
    """A name (or a unit) some servers write that is read as a name of `METRICS`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    written: str
    read_as: str
    by: str
    """Which servers write it."""


ALIASES: tuple[Alias, ...] = (
    Alias(written="sglang:num_requests_running", read_as="sglang:num_running_reqs", by=DEV_2024_11),
    Alias(written="sglang:num_requests_waiting", read_as="sglang:num_queue_reqs", by=DEV_2024_11),
    Alias(written="sglang:cache_hit_rate (percent)", read_as="sglang:cache_hit_rate ÷ 100", by=DEV_2024_11),
    Alias(
        written='label name="…"',
        read_as='label model_name="…"',
        by=f"{DEV_2024_11} as published in PRs #1461 and #1853 (on the metrics of this table only)",
    ),
    Alias(written="sglang:queue_time_s", read_as="sglang:queue_time_seconds", by="0.5.2"),
    Alias(
        written="sglang:cache_config_info{page_size,num_pages}",
        read_as="sglang:page_size, sglang:num_pages",
        by="0.5.9–0.5.10",
    ),
    Alias(
        written="sglang_<name> (underscore)",
        read_as="sglang:<name>",
        by="a re-export that rewrites the colon (a gRPC sidecar, an OpenTelemetry or Prometheus exporter)",
    ),
)

RENAMED: dict[str, str] = {
    "sglang:num_requests_running": "sglang:num_running_reqs",
    "sglang:num_requests_waiting": "sglang:num_queue_reqs",
    "sglang:queue_time_s": "sglang:queue_time_seconds",
}
"""Older names read as today's (`ALIASES`), by family (a histogram's `_bucket`/`_sum`/`_count` follow)."""

DEV_2024_11_MARKERS = frozenset({"sglang:num_requests_running", "sglang:num_requests_waiting"})
"""Families only the 2024-11 build exports: a scrape that holds one prints `cache_hit_rate` in percent."""


def exported_by(metric: MetricName, release: str) -> bool:
    """Whether `release` (one of `RELEASES_READ`, or `DEV_2024_11`) exports `metric`."""
    if release == DEV_2024_11:
        return metric.dev_2024_11
    have, since = version_tuple(release), version_tuple(metric.since)
    until = version_tuple(metric.until) if metric.until else None
    if have is None or since is None:
        return False
    return since <= have and (until is None or have <= until)


def absent_reason(metric: str, version: str | None) -> str:
    """Why a scrape holds no `metric`: too old or too new a server, or not exported by this one (metrics
    off, a figure of a feature not in use)."""
    known = METRICS.get(metric)
    have = version_tuple(version)
    if known is not None and have is not None:
        since = version_tuple(known.since)
        if known.dev_2024_11 and have == version_tuple(DEV_2024_11_VERSION):
            return f"this server does not export {metric}"
        if since is not None and have < since:
            return f"{metric} is exported from SGLang {known.since} on; this server runs {version}"
        gone = _first_release_after(known.until)
        if gone is not None and have >= (version_tuple(gone) or ()):
            return f"{metric} is not exported by SGLang {gone} or later; this server runs {version}"
    return f"this server does not export {metric}"


def _first_release_after(release: str | None) -> str | None:
    if release is None or release not in RELEASES_READ:
        return None
    i = RELEASES_READ.index(release)
    return RELEASES_READ[i + 1] if i + 1 < len(RELEASES_READ) else None


def _generations() -> list[tuple[str, list[str]]]:
    """The columns of the table: the 2024-11 build, then runs of releases that export the same names."""
    columns: list[tuple[str, list[str]]] = [(DEV_2024_11, [DEV_2024_11])]
    previous: tuple[bool, ...] | None = None
    for release in RELEASES_READ:
        row = tuple(exported_by(m, release) for m in _TABLE)
        if row == previous:
            columns[-1][1].append(release)
        else:
            columns.append((release, [release]))
        previous = row
    return columns


def _mark(metric: MetricName, release: str) -> str:
    if not exported_by(metric, release):
        return "·"
    if release == DEV_2024_11 and metric.dev_2024_11_name:
        return f"as `{metric.dev_2024_11_name}`"
    return "✓"


def generation_table() -> str:
    """The names-per-version table, in Markdown (docs/serving.md holds it)."""
    columns = _generations()
    heads = [cells[0] if len(cells) == 1 else f"{cells[0]}–{cells[-1]}" for _, cells in columns]
    lines = [
        "| metric (as read) | figure | type | " + " | ".join(heads) + " |",
        "|---|---|---|" + "---|" * len(heads),
    ]
    for m in _TABLE:
        marks = [_mark(m, first) for first, _ in columns]
        note = f" ({m.note})" if m.note else ""
        lines.append(f"| `{m.name}`{note} | {m.figure} | {m.kind} | " + " | ".join(marks) + " |")
    lines.append("")
    lines.append("| written by the server | read as | written by |")
    lines.append("|---|---|---|")
    for a in ALIASES:
        lines.append(f"| `{a.written}` | `{a.read_as}` | {a.by} |")
    return "\n".join(lines) + "\n"
