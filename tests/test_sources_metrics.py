"""`core.metrics`: SGLang's Prometheus text → numbers.

The scrape below has the shape SGLang's `prometheus_client` multiprocess registry writes (HELP/TYPE
comments, `model_name`/`engine_type`/`tp_rank` labels, `1.5e+06` floats, histogram `_bucket{le=...}`
series ending in `+Inf`, `_sum`, `_count`), for a DP-attention server with two scheduler ranks.
"""

from __future__ import annotations

import io
import math

from console.core.metrics import PrometheusReader, SglangMetrics, as_numbers, parse_prometheus
from console.twin.scenarios import get_scenario
from console.twin.server_engine import Engine
from console.twin.server_logs import LogWriter
from tests.test_serving_core import engine_config

MODEL = 'model_name="moonshotai/Kimi-K2.6",engine_type="unified"'
SCRAPE = f"""\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{{MODEL},tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"}} 3.0
sglang:num_running_reqs{{{MODEL},tp_rank="4",pp_rank="0",moe_ep_rank="4",dp_rank="1"}} 2.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{{MODEL},tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"}} 0.0
sglang:num_queue_reqs{{{MODEL},tp_rank="4",pp_rank="0",moe_ep_rank="4",dp_rank="1"}} 1.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{{MODEL},tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"}} 0.28
sglang:token_usage{{{MODEL},tp_rank="4",pp_rank="0",moe_ep_rank="4",dp_rank="1"}} 0.12
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{{{MODEL},tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"}} 86.50814177726902
sglang:gen_throughput{{{MODEL},tp_rank="4",pp_rank="0",moe_ep_rank="4",dp_rank="1"}} 13.49185822273098
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{{{MODEL},tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"}} 211456.0
sglang:max_total_num_tokens{{{MODEL},tp_rank="4",pp_rank="0",moe_ep_rank="4",dp_rank="1"}} 211456.0
# HELP sglang:context_len The context length.
# TYPE sglang:context_len gauge
sglang:context_len{{{MODEL},tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"}} 200000.0
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{{MODEL},tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"}} 8.128902e+06
sglang:prompt_tokens_total{{{MODEL},tp_rank="4",pp_rank="0",moe_ep_rank="4",dp_rank="1"}} 1.871098e+06
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{{MODEL},tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"}} 7.557572e+06
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_sum{{{MODEL},tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"}} 24.5
sglang:time_to_first_token_seconds_bucket{{le="0.1",{MODEL},tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"}} 1.0
sglang:time_to_first_token_seconds_bucket{{le="1.0",{MODEL},tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"}} 6.0
sglang:time_to_first_token_seconds_bucket{{le="5.0",{MODEL},tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"}} 9.0
sglang:time_to_first_token_seconds_bucket{{le="+Inf",{MODEL},tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"}} 10.0
sglang:time_to_first_token_seconds_count{{{MODEL},tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"}} 10.0
# HELP sglang:func_latency_seconds Function latency in seconds
# TYPE sglang:func_latency_seconds histogram
sglang:func_latency_seconds_bucket{{le="0.07500000000000001",name="generate_request"}} 14006.0
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{{generation="0"}} 1234.0
"""


def test_every_sample_is_read_with_its_labels() -> None:
    metrics = parse_prometheus(SCRAPE)
    assert metrics.skipped_lines == 0
    assert metrics.types["sglang:time_to_first_token_seconds"] == "histogram"
    running = metrics.series("sglang:num_running_reqs")
    assert [s.value for s in running] == [3.0, 2.0]
    assert running[1].labels == {
        "model_name": "moonshotai/Kimi-K2.6",
        "engine_type": "unified",
        "tp_rank": "4",
        "pp_rank": "0",
        "moe_ep_rank": "4",
        "dp_rank": "1",
    }
    assert metrics.series("sglang:func_latency_seconds_bucket")[0].labels["le"] == "0.07500000000000001"
    assert metrics.total("sglang:prompt_tokens_total", dp_rank="0") == 8128902.0


def test_sglang_figures_combine_replicas_counts_add_ratios_average() -> None:
    m = SglangMetrics.from_text(SCRAPE)
    assert m.num_running_reqs == 5.0
    assert m.num_queue_reqs == 1.0
    assert m.gen_throughput is not None and math.isclose(m.gen_throughput, 100.0)
    assert m.token_usage is not None and math.isclose(m.token_usage, 0.20)
    assert m.max_total_num_tokens == 422912.0
    assert m.context_len == 200000.0
    assert m.prompt_tokens_total == 10_000_000.0
    assert m.generation_tokens_total == 7557572.0
    assert m.model_names == ("moonshotai/Kimi-K2.6",)
    assert m.num_requests_total is None  # not exported by this server: missing, not zero
    ttft = m.time_to_first_token
    assert ttft is not None and ttft.count == 10.0 and ttft.mean == 2.45
    assert ttft.buckets[-1] == (math.inf, 10.0)
    assert ttft.quantile(0.5) == 1.0 and ttft.quantile(0.95) == math.inf


def test_escaped_label_values_odd_lines_and_special_values() -> None:
    text = (
        'sglang:x{path="a\\"b\\\\c\\nd",model_name="m"} 1.5e-3\n'
        'sglang:v{model_name="m"} NaN\n'
        "sglang:y +Inf 1712345678000\n"
        "sglang:z{broken 1.0\n"
        "not a metric line at all\n"
        "sglang:w{} -1.5e-3\n"
    )
    metrics = parse_prometheus(text)
    assert metrics.skipped_lines == 2
    assert metrics.series("sglang:x")[0].labels["path"] == 'a"b\\c\nd'
    assert metrics.total("sglang:x") == 0.0015
    # NaN, +Inf and a negative value are no figure of SGLang's: each refuses its metric, named with it
    assert metrics.refused == {"sglang:v": "NaN", "sglang:y": "+Inf", "sglang:w": "-0.0015"}
    assert metrics.total("sglang:v") is metrics.total("sglang:y") is metrics.total("sglang:w") is None


def test_an_empty_or_foreign_scrape_is_all_none_not_an_error() -> None:
    empty = SglangMetrics.from_text("")
    assert empty.series == 0 and empty.num_running_reqs is None
    foreign = SglangMetrics.from_text("# TYPE up gauge\nup 1\n")
    assert foreign.series == 0
    assert as_numbers(parse_prometheus(SCRAPE))["sglang:num_running_reqs"] == 5.0


def test_the_reader_parses_again_only_the_families_that_changed() -> None:
    reader = PrometheusReader()
    first = reader.read(SCRAPE)
    assert first == parse_prometheus(SCRAPE)
    families = SCRAPE.count("# HELP")
    assert reader.parsed_blocks == families
    again = reader.read(SCRAPE)  # an idle server's scrape, word for word: the same reading, not a copy
    assert again is first and reader.parsed_blocks == families
    busier = SCRAPE.replace("} 3.0\n", "} 4.0\n", 1)  # one gauge moved
    assert reader.read(busier) == parse_prometheus(busier)
    assert reader.parsed_blocks == families + 1
    assert reader.read(busier).total("sglang:num_running_reqs") == 6.0
    assert reader.read(SCRAPE) is not first and reader.read(SCRAPE) == first  # only the last text is kept
    # a line the parser refuses: the whole text read line by line, as parse_prometheus reads it
    odd = busier + "sglang:z{broken 1.0\n"
    assert reader.read(odd) == parse_prometheus(odd) and reader.read(odd).skipped_lines == 1
    # families without HELP, and samples before any comment, are blocks of their own
    bare = "sglang:a 1\n# TYPE sglang:b gauge\nsglang:b 2\n# TYPE sglang:c counter\nsglang:c_total 3\n"
    fresh = PrometheusReader()
    assert fresh.read(bare) == parse_prometheus(bare) and fresh.parsed_blocks == 3


def test_the_reader_reads_the_twin_s_scrapes_as_they_move() -> None:
    eng = Engine(get_scenario(), engine_config(), LogWriter(io.StringIO()))
    reader = PrometheusReader()
    for step in range(6):
        eng.itl.observe(0.02 + step / 1000)
        eng.generation_tokens_total += 100 * step
        text = eng.metrics_text()
        assert reader.read(text) == parse_prometheus(text), step
