"""Which SGLang metric each serving figure reads, and since which version the server exports it: the
names-per-version table (ours; read from SGLang's metrics collector in its wheels, docs/serving.md has it per
figure), and the sentence that says why a figure is absent.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class MetricName(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    since: str
    """The first SGLang release read that exports it: v0.4.6.post5 is the oldest read, so `0.4.6` means
    "0.4.6 or earlier"."""
    note: str = ""


# Read from SGLang's metrics collector: v0.4.6.post5 `srt/metrics/collector.py`, v0.5.12.post1 and 0.5.23
# `srt/observability/metrics_collector.py` (docs/serving.md has the table, per figure).
METRICS: dict[str, MetricName] = {
    m.name: m
    for m in (
        MetricName(name="sglang:num_running_reqs", since="0.4.6"),
        MetricName(name="sglang:num_queue_reqs", since="0.4.6"),
        MetricName(name="sglang:num_used_tokens", since="0.4.6"),
        MetricName(name="sglang:token_usage", since="0.4.6", note="the max over the KV and state pools"),
        MetricName(name="sglang:gen_throughput", since="0.4.6"),
        MetricName(name="sglang:cache_hit_rate", since="0.4.6"),
        MetricName(name="sglang:spec_accept_length", since="0.4.6"),
        MetricName(name="sglang:prompt_tokens_total", since="0.4.6"),
        MetricName(name="sglang:generation_tokens_total", since="0.4.6"),
        MetricName(name="sglang:cached_tokens_total", since="0.4.6"),
        MetricName(name="sglang:num_requests_total", since="0.4.6"),
        MetricName(name="sglang:time_to_first_token_seconds", since="0.4.6"),
        MetricName(name="sglang:inter_token_latency_seconds", since="0.4.6"),
        MetricName(
            name="sglang:time_per_output_token_seconds",
            since="0.3.0",
            note="older servers' per-request figure; v0.5.12.post1 no longer exports it",
        ),
        MetricName(name="sglang:e2e_request_latency_seconds", since="0.4.6"),
        MetricName(name="sglang:queue_time_seconds", since="0.5.12"),
        MetricName(name="sglang:max_total_num_tokens", since="0.5.12"),
        MetricName(name="sglang:kv_used_tokens", since="0.5.12"),
        MetricName(name="sglang:kv_available_tokens", since="0.5.12"),
        MetricName(name="sglang:full_token_usage", since="0.5.12", note="hybrid SWA models"),
        MetricName(name="sglang:swa_token_usage", since="0.5.12", note="hybrid SWA models"),
        MetricName(name="sglang:mamba_usage", since="0.5.12", note="hybrid mamba models: the state pool"),
        MetricName(name="sglang:spec_accept_rate", since="0.5.12"),
    )
}


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """`0.5.12.post1` → (0, 5, 12, 1); None when unknown or unreadable."""
    if not version:
        return None
    parts: list[int] = []
    for piece in version.strip().lstrip("v").replace("post", "").replace("rc", ".").split("."):
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


def absent_reason(metric: str, version: str | None) -> str:
    """Why a scrape holds no `metric`: too old a server, or not exported by this one (metrics off, a
    figure of a feature not in use)."""
    known = METRICS.get(metric)
    have = version_tuple(version)
    if known is not None and have is not None:
        since = version_tuple(known.since)
        if since is not None and have < since:
            return f"{metric} is exported from SGLang {known.since} on; this server runs {version}"
    return f"this server does not export {metric}"
