"""Every /metrics generation of SGLang since 2024-11, read as today's names (issue 32 item 4), on the
scrapes of tests/data/metrics-generations (real public exposition, and scrapes reconstructed from a
version's collector source where none was found: INDEX.md says which).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from console.core.metrics import PrometheusReader, SglangMetrics, parse_prometheus
from console.core.serving import Scrape, serving_figures
from console.core.serving_history import ServingHistory
from console.core.serving_metrics import (
    DEV_2024_11,
    METRICS,
    RELEASES_READ,
    absent_reason,
    exported_by,
    generation_table,
)

DATA = Path(__file__).parent / "data" / "metrics-generations"
DOCS = Path(__file__).parent.parent / "docs" / "serving.md"


def text(name: str) -> str:
    return (DATA / name).read_text()


def scrape(name: str, ts: float = 0.0) -> Scrape:
    return Scrape(ts=ts, metrics=parse_prometheus(text(name)))


def test_every_fixture_is_named_in_the_index_and_parses_whole() -> None:
    index = (DATA / "INDEX.md").read_text()
    files = sorted(p.name for p in DATA.glob("*.prom"))
    assert len(files) >= 10
    for name in files:
        stem = name.removesuffix(".prom")
        assert stem.split("-t")[0] in index or name in index, name
        metrics = parse_prometheus(text(name))
        assert metrics.skipped_lines == 0 and metrics.samples, name


# ------------------------------------------------------------------ the 2024-11 generation


def test_the_first_generation_is_read_as_today_s_names_and_its_percent_as_a_fraction() -> None:
    # PR #1461's published scrape: `name=` label, num_requests_running/waiting, cache_hit_rate 87.58 (%)
    metrics = parse_prometheus(text("2024-09-pr1461-name-label.prom"))
    assert metrics.series("sglang:num_requests_running") == []
    assert metrics.total("sglang:num_running_reqs") == 0.0 and metrics.total("sglang:num_queue_reqs") == 0.0
    assert metrics.read_as["sglang:num_requests_waiting"] == "sglang:num_queue_reqs"
    figures = serving_figures([Scrape(ts=0.0, metrics=metrics)], version="0.3.5")
    assert figures.cache_hit_rate == pytest.approx(0.8758777633289988)
    assert figures.sources["cache_hit_rate"] == "sglang:cache_hit_rate (a percent, read ÷ 100)"
    assert figures.running == 0.0 and figures.queued == 0.0 and figures.token_usage == 0.0
    # the label is the model's name, as model_name is today; SGLang's own gauges of other names keep theirs
    assert SglangMetrics.from_metrics(metrics).model_names == ("google/gemma-2-9b-it",)
    assert metrics.series("sglang:new_seq")[0].labels == {"name": "google/gemma-2-9b-it"}


def test_the_merged_2024_11_build_s_pool_gauge_is_the_kv_pool() -> None:
    figures = serving_figures([scrape("2024-11-pr1853-name-label.prom")], version="0.3.5")
    assert figures.kv_pool == 570979.0 and figures.sources["kv_pool"] == "sglang:max_total_num_tokens"
    assert figures.read_as == {'label name="…"': 'label model_name="…"'}
    # a fraction generation's gauge is left as it is (positive control for the ÷ 100 above)
    fraction = parse_prometheus('sglang:cache_hit_rate{model_name="m",tp_rank="0"} 0.42\n')
    assert fraction.total("sglang:cache_hit_rate") == 0.42 and fraction.read_as == {}


def test_a_percent_is_known_by_its_value_when_the_names_do_not_tell() -> None:
    # a value above 1 is no fraction: only the 2024-11 build printed one (round(100 * rate, 2))
    metrics = parse_prometheus('sglang:cache_hit_rate{model_name="m"} 62.5\n')
    assert metrics.total("sglang:cache_hit_rate") == 0.625


# ------------------------------------------------------------------ labels: ranks, engines, re-export


def test_older_label_sets_read_one_series_each() -> None:
    for name, running in (
        ("2025-03-pr4412-engine-type.prom", 0.0),
        ("2025-07-pr7944-counters.prom", 0.0),
        ("2025-11-issue13485-v0.5.1.prom", 1.0),
    ):
        m = SglangMetrics.from_text(text(name))
        assert m.num_running_reqs == running, name
    counters = SglangMetrics.from_text(text("2025-07-pr7944-counters.prom"))
    assert counters.num_requests_total == 217.0 and counters.cached_tokens_total == 2688.0
    v051 = SglangMetrics.from_text(text("2025-11-issue13485-v0.5.1.prom"))
    assert v051.gen_throughput == pytest.approx(0.8371284457403783)


def test_dp_ranks_are_replicas_that_add_up_whatever_their_pid() -> None:
    metrics = parse_prometheus(text("aibrix1614-dp8-pid.prom"))
    assert metrics.label_values("sglang:num_paused_reqs", "dp_rank") == ("0", "1", "2", "3", "5")
    assert len(metrics.replicas("sglang:num_paused_reqs")) == 5
    assert len(metrics.replicas("sglang:num_retracted_reqs")) == 4


def test_an_underscore_re_export_is_read_as_sglang_s_own_names() -> None:
    metrics = parse_prometheus(text("2026-smg813-underscore-reexport.prom"))
    assert metrics.read_as["sglang_cache_hit_rate"] == "sglang:cache_hit_rate"
    assert metrics.types["sglang:cache_hit_rate"] == "gauge"
    m = SglangMetrics.from_metrics(metrics)
    assert m.series == 4 and m.cache_hit_rate == 0.0
    assert m.model_names == ("meta-llama/Llama-3.1-8B-Instruct",)
    # the sidecar's worker_addr tells workers apart: two workers are two replicas, added up
    two = text("2026-smg813-underscore-reexport.prom") + text("2026-smg813-underscore-reexport.prom").replace(
        "grpc://127.0.0.1:8001", "grpc://127.0.0.1:8002"
    )
    assert parse_prometheus(two).total("sglang:realtime_tokens_total") == 110.0
    # a scrape that has SGLang's own colon names keeps an `sglang_` family as it is (0.5.23's sidecar)
    mixed = parse_prometheus('sglang:num_running_reqs{tp_rank="0"} 2\nsglang_sidecar_up 1\n')
    assert mixed.series("sglang_sidecar_up") and mixed.read_as == {}


def test_the_newest_generation_s_copies_and_breakdowns_are_never_counted_twice() -> None:
    # DP attention 2 x attention-TP 2 with --enable-metrics-for-all-schedulers: each figure four times,
    # twice per DP rank, plus a priority="1" breakdown beside the priority="" totals
    s0, s1 = scrape("recon-0.5.23-dp2-swa-t0.prom", 0.0), scrape("recon-0.5.23-dp2-swa-t1.prom", 10.0)
    assert len(s1.metrics.series("sglang:num_running_reqs")) == 8
    figures = serving_figures([s0, s1], version="0.5.23")
    assert figures.running == 5.0 and figures.queued == 2.0  # 1 + 4, 2 + 0: one copy per DP rank
    assert figures.kv_used == 95_000.0 and figures.kv_pool == 2 * 213_760.0
    assert [(r.dp_rank, r.used, r.pool) for r in figures.kv_ranks] == [
        (0, 60_000.0, 213_760.0),
        (1, 35_000.0, 213_760.0),
    ]
    pools = {p.name: p for p in figures.pools}
    assert (pools["kv"].usage, pools["kv"].used, pools["kv"].capacity) == (0.28, 95_000.0, 427_520.0)
    assert (pools["swa"].usage, pools["swa"].used, pools["swa"].capacity) == (0.07, 20_000.0, 342_016.0)
    assert figures.full_pool == "kv" and figures.token_usage == 0.28
    assert figures.page_size == 64.0 and figures.num_pages == 2 * 3340.0
    assert figures.spec_accept_length == pytest.approx(2.3) and figures.spec_accept_rate == pytest.approx(
        0.65
    )
    # tokenizer counters split by is_streaming and cache_source are partitions: they add up
    assert figures.gen_tok_s == 100_000 / 10 and figures.cache_hit_rate == pytest.approx(0.5)
    assert figures.hicache is not None
    assert figures.hicache.host_used_tokens == 240_000.0 and figures.hicache.host_total_tokens == 2_000_000.0
    # load-back: per DP rank, one TP copy, the kv host pool's count (its swa pool counts the same tokens)
    assert figures.hicache.load_back_tok_s == 2 * 6000 / 10
    assert figures.engine_types == ("unified",)
    dumped = figures.model_dump(mode="json")  # what snapshot --json prints as its serving part
    assert dumped["pools"][1] == {"name": "swa", "usage": 0.07, "used": 20000.0, "capacity": 342016.0}
    assert dumped["hicache"]["load_back_tok_s"] == 1200.0 and dumped["page_size"] == 64.0


def test_pd_kv_transfers_are_the_window_s_from_histograms_and_the_last_from_gauges() -> None:
    s0, s1 = scrape("recon-0.5.23-pd-prefill-t0.prom", 0.0), scrape("recon-0.5.23-pd-prefill-t1.prom", 10.0)
    figures = serving_figures([s0, s1], version="0.5.23")
    transfer = figures.kv_transfer
    assert transfer is not None and transfer.read == "window" and transfer.transfers == 3.0
    assert transfer.latency_ms == pytest.approx((12 + 40 + 8) / 3)
    assert transfer.speed_gb_s == pytest.approx((12 + 6 + 22) / 3)
    assert transfer.latency_p99_ms is not None and 25 < transfer.latency_p99_ms <= 50
    assert figures.engine_types == ("prefill",)
    # the session's history (one pair read at a time) gives the same figures
    history = ServingHistory(window_s=300.0)
    history.add(s0)
    history.add(s1)
    assert history.figures(version="0.5.23") == figures
    old = serving_figures([scrape("recon-0.5.9-cache-config-info.prom")], version="0.5.9")
    assert old.kv_transfer is not None and old.kv_transfer.read == "last"
    assert (old.kv_transfer.latency_ms, old.kv_transfer.speed_gb_s) == (11.5, 18.25)
    assert old.page_size == 64.0 and old.num_pages == 9375.0
    assert old.read_as["sglang:cache_config_info{page_size}"] == "sglang:page_size"
    assert [(p.name, p.usage) for p in old.pools] == [("mamba", 0.42)]


def test_the_reader_that_skips_unchanged_families_normalises_alike() -> None:
    reader = PrometheusReader()
    for name in ("2024-09-pr1461-name-label.prom", "2026-smg813-underscore-reexport.prom"):
        assert reader.read(text(name)) == parse_prometheus(text(name))


# ------------------------------------------------------------------ the one table


def test_the_table_says_why_a_figure_is_absent_by_version() -> None:
    assert "from SGLang 0.5.7 on" in absent_reason("sglang:max_total_num_tokens", "0.5.5")
    # the 2024-11 build reports 0.3.5 and exports it
    assert absent_reason("sglang:max_total_num_tokens", "0.3.5") == (
        "this server does not export sglang:max_total_num_tokens"
    )
    gone = absent_reason("sglang:time_per_output_token_seconds", "0.5.12.post1")
    assert (
        gone
        == "sglang:time_per_output_token_seconds is not exported by SGLang 0.4.6 or later; this server runs 0.5.12.post1"
    )
    assert exported_by(METRICS["sglang:cache_config_info"], "0.5.10")
    assert not exported_by(METRICS["sglang:cache_config_info"], "0.5.11")
    assert exported_by(METRICS["sglang:num_running_reqs"], DEV_2024_11)
    assert RELEASES_READ[0] == "0.3.5.post1" and RELEASES_READ[-1] == "0.5.23"


def test_docs_hold_the_table_the_code_reads() -> None:
    docs = DOCS.read_text()
    table = generation_table()
    assert table in docs, "docs/serving.md: paste console.core.serving_metrics.generation_table()"
    assert re.search(r"\| `sglang:kv_transfer_latency_ms`", table)
