"""The parser on the real journal lines of the shared corpus: the values that matter, not just "no exception"."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from console.core.events import EVENT_KINDS, event_from_json
from console.core.parser import parse_text


def _events(corpus: Path, name: str) -> list:
    return parse_text((corpus / name).read_text(encoding="utf-8", errors="replace"))


def _kind(events: list, kind: str) -> list:
    return [e for e in events if e.kind == kind]


def test_every_corpus_file_parses_and_round_trips(corpus_dir: Path) -> None:
    files = sorted(corpus_dir.rglob("*.log")) + sorted(corpus_dir.rglob("*.journal"))
    assert len(files) >= 20
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        events = parse_text(text)
        assert events, path.name
        assert all(e.kind in EVENT_KINDS for e in events)
        # Built without re-validation: every event must survive pydantic's own validation unchanged.
        for e in events:
            assert event_from_json(e.model_dump_json()) == e, (path.name, e.raw)
        # Every non-empty line is accounted for: in its own event or inside a grouped traceback.
        accounted = sum(len(e.lines) if e.kind == "error" else 1 for e in events)
        assert accounted == len(text.removesuffix("\n").split("\n")), path.name


def test_seed_restart_mfs094(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "seed-restart-mfs094.journal")
    ends = _kind(events, "memory_pool_end")
    assert [(e.tp_rank, e.avail_mem_gb, e.pid) for e in ends] == [(1, 4.38, 10991), (2, 4.38, 10992)]
    (summary,) = _kind(events, "pool_summary")
    assert summary.max_total_num_tokens == 218484
    assert summary.tp_rank == 0
    assert summary.chunked_prefill_size == 8192
    assert summary.max_prefill_tokens == 16384
    assert summary.max_running_requests == 8
    assert summary.context_len == 200000
    assert summary.available_gpu_mem_gb == 4.24
    assert summary.host == "dflash-train"
    # journald `short` has no year: it comes from SGLang's own stamp on the same line.
    assert summary.ts == "2026-05-30T22:14:46"


def test_seed_restart_ctx_only_draft_pool(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "seed-restart-ctx-only.journal")
    pools = _kind(events, "kv_pool_allocated")
    assert {(e.tp_rank, e.tokens, e.k_size_gb, e.v_size_gb, e.kv_size_gb) for e in pools} == {
        (7, 101134, 0.14, 0.14, None),
        (4, 101134, 0.14, 0.14, None),
    }
    (end,) = _kind(events, "memory_pool_end")
    assert (end.tp_rank, end.avail_mem_gb) == (7, 10.37)


def test_case01_kimi_k25_startup_and_crash(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "public/case-01.log")
    (args,) = _kind(events, "server_args")
    assert args.args["model_path"] == "moonshotai/Kimi-K2.5"
    assert args.args["trust_remote_code"] is True
    assert args.args["context_length"] is None
    assert args.args["chunked_prefill_size"] == 16384
    assert args.args["model_loader_extra_config"] == "{}"
    assert args.args["mm_process_config"] == {}
    assert args.args["forward_hooks"] is None
    assert len(args.args) > 300

    dist = _kind(events, "dist_init")
    assert sum(e.phase == "begin" for e in dist) == 8
    tp0_end = next(e for e in dist if e.phase == "end" and e.tp_rank == 0)
    assert (tp0_end.elapsed_s, tp0_end.mem_usage_gb) == (17.24, 3.81)

    loaded = {e.tp_rank: e for e in _kind(events, "weights_loaded")}
    assert sorted(loaded) == list(range(8))
    assert loaded[0].avail_mem_gb == 209.98
    assert loaded[0].mem_usage_gb == 73.58
    assert loaded[0].elapsed_s == 618.04
    assert loaded[0].model_type == "KimiK25ForConditionalGeneration"
    assert loaded[0].dtype == "torch.bfloat16"

    pools = _kind(events, "kv_pool_allocated")
    assert len(pools) == 8
    assert all(p.tokens == 2454421 and p.kv_size_gb == 160.63 and p.k_size_gb is None for p in pools)
    ends = {e.tp_rank: e.avail_mem_gb for e in _kind(events, "memory_pool_end")}
    assert ends[0] == 45.25 and ends[1] == 45.65

    graphs = _kind(events, "cuda_graph")
    assert len(graphs) == 8 and all(g.phase == "begin" for g in graphs)
    assert next(g for g in graphs if g.tp_rank == 0).avail_mem_gb == 45.03

    errors = _kind(events, "error")
    assert [e.category for e in errors] == ["scheduler_exception", "sigquit"]
    tb = errors[0]
    assert tb.tp_rank == 6
    assert tb.message == "TypeError: cannot unpack non-iterable ForwardMetadata object"
    assert len(tb.lines) == 64  # the prefixed head line, 62 frame lines, the TypeError line
    assert tb.lines[0].startswith("[2026-02-26 16:41:24 TP6] Scheduler hit an exception: Traceback")
    assert tb.lines[-1].startswith("TypeError: ")
    assert tb.ts == "2026-02-26T16:41:24"
    assert errors[1].tp_rank is None


def test_case03_bare_prefix_full_startup(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "public/case-03.log")
    (loaded,) = _kind(events, "weights_loaded")
    assert (loaded.avail_mem_gb, loaded.mem_usage_gb, loaded.model_type) == (7.37, 15.02, "LlamaForCausalLM")
    assert loaded.tp_rank is None
    (pool,) = _kind(events, "kv_pool_allocated")
    assert (pool.tokens, pool.k_size_gb, pool.v_size_gb) == (38141, 2.33, 2.33)
    begin, end = _kind(events, "cuda_graph")
    assert (begin.phase, begin.avail_mem_gb) == ("begin", 0.93)
    assert (end.phase, end.elapsed_s, end.mem_usage_gb, end.avail_mem_gb) == ("end", 18.07, 0.11, 0.83)
    (summary,) = _kind(events, "pool_summary")
    assert (summary.max_total_num_tokens, summary.context_len, summary.available_gpu_mem_gb) == (
        38141,
        131072,
        0.83,
    )
    # The tqdm bar and uvicorn's startup lines stay as logs.
    assert any(e.message.startswith("Capturing batches (bs=1") for e in _kind(events, "log"))


def test_case04_multi_node_ranks(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "public/case-04.log")
    begins = {e.tp_rank: e.avail_mem_gb for e in _kind(events, "weights_begin")}
    assert begins == {26: 78.38, 29: 78.38, 27: 78.38, 25: 78.38, 31: 78.41, 30: 78.38, 24: 78.41, 28: 78.38}
    assert {e.tp_rank for e in _kind(events, "weights_loaded")} == {24, 26, 29, 31}
    assert sum(e.message == "Cache shape torch.Size([163840, 64])" for e in _kind(events, "log")) == 8


def test_case07_old_time_only_prefix_and_traceback(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "public/case-07.log")
    ends = _kind(events, "memory_pool_end")
    assert len(ends) == 8
    assert {e.tp_rank: e.avail_mem_gb for e in ends}[0] == 18.66
    assert all(e.ts == "23:17:01" for e in ends)  # `[HH:MM:SS TPn]`: a time, no date to invent
    graphs = _kind(events, "cuda_graph")
    assert len(graphs) == 8 and all(g.avail_mem_gb is None for g in graphs)
    (err,) = _kind(events, "error")
    assert (err.category, err.tp_rank, err.ts) == ("traceback", 4, "23:17:08")
    assert err.message == "Exception in run_tp_server:"
    assert len(err.lines) == 4 and err.lines[1] == "Traceback (most recent call last):"


def test_case08_prefixed_traceback_head(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "public/case-08.log")
    assert [e.kind for e in events] == ["memory_pool_end", "cuda_graph", "error"]
    err = events[2]
    assert err.tp_rank == 0 and err.category == "traceback"
    assert len(err.lines) == 13


def test_case13_unprefixed_traceback_is_one_event(corpus_dir: Path) -> None:
    (err,) = _events(corpus_dir, "public/case-13.log")
    assert err.kind == "error" and err.category == "traceback"
    assert len(err.lines) == 17


def test_case14_interleaved_tqdm(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "public/case-14.log")
    assert {e.tp_rank: e.avail_mem_gb for e in _kind(events, "weights_loaded")}[7] == 60.11
    assert {e.tp_rank: e.avail_mem_gb for e in _kind(events, "memory_pool_end")} == {
        6: 12.45,
        5: 12.45,
        0: 12.54,
    }
    assert sum(e.message.startswith("Loading safetensors") for e in _kind(events, "log")) == 5


def test_case15_pd_decode_lines(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "public/case-15.log")
    assert [e.kind for e in events] == ["decode_batch"] * 5
    second = events[1]
    assert (second.running_req, second.num_tokens, second.token_usage) == (1, 73, 0.0)
    assert (second.gen_throughput, second.queue_req, second.cuda_graph) == (78.2, 0, True)


def test_case17_dist_init_and_pool(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "public/case-17.log")
    dist = {e.tp_rank: e.mem_usage_gb for e in _kind(events, "dist_init")}
    assert dist[7] == 1.77 and dist[0] == 1.96
    assert {e.tp_rank: e.avail_mem_gb for e in _kind(events, "weights_begin")}[7] == 137.52
    pools = _kind(events, "kv_pool_allocated")
    assert {(p.tokens, p.k_size_gb, p.v_size_gb) for p in pools} == {(2795207, 53.31, 53.31)}
    assert {e.avail_mem_gb for e in _kind(events, "memory_pool_end")} == {11.87}
    assert {e.tp_rank: e.avail_mem_gb for e in _kind(events, "cuda_graph")} == {7: 12.01, 2: 11.78, 0: 11.82}


def test_case18_tqdm_glued_before_prefix_and_dp_tp_ep_tags(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "public/case-18.log")
    first = events[0]
    assert first.kind == "weights_loaded"
    assert first.raw.startswith("Multi-thread loading shards:  94% Completed")
    assert (first.dp_rank, first.tp_rank, first.ep_rank) == (1, 1, 1)
    assert (first.elapsed_s, first.avail_mem_gb, first.mem_usage_gb) == (5.05, 121.9, 16.39)
    assert first.model_type == "Qwen3MoeForCausalLM" and first.dtype is None
    assert first.ts == "2026-05-07T13:39:14"
    ends = {(e.dp_rank, e.tp_rank, e.ep_rank): e.avail_mem_gb for e in _kind(events, "memory_pool_end")}
    assert ends == {(0, 0, 0): 27.62, (2, 2, 2): 27.57}
    assert {p.tokens for p in _kind(events, "kv_pool_allocated")} == {1029388}


def test_case19_new_load_format(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "public/case-19.log")
    (loaded,) = _kind(events, "weights_loaded")
    assert (loaded.elapsed_s, loaded.avail_mem_gb, loaded.mem_usage_gb) == (112.68, 160.78, 15.5)
    assert {e.tp_rank: e.avail_mem_gb for e in _kind(events, "memory_pool_end")} == {
        1: 25.37,
        2: 25.37,
        0: 25.4,
        3: 25.52,
    }


def test_case20_sigquit_then_scheduler_traceback(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "public/case-20.log")
    assert [(e.kind, e.category) for e in events] == [("error", "sigquit"), ("error", "scheduler_exception")]
    assert events[1].tp_rank == 5
    assert len(events[1].lines) == 12


def test_case22_and_case25(corpus_dir: Path) -> None:
    e22 = _events(corpus_dir, "public/case-22.log")
    assert len(_kind(e22, "memory_pool_end")) == 8
    e25 = _events(corpus_dir, "public/case-25.log")
    pools = _kind(e25, "kv_pool_allocated")
    assert [(p.tp_rank, p.tokens, p.kv_size_gb) for p in pools] == [(0, 10000, 0.65), (1, 10000, 0.65)]
    assert [e.avail_mem_gb for e in _kind(e25, "memory_pool_end")] == [33.08, 30.11]
    (loaded,) = _kind(e25, "weights_loaded")
    assert (loaded.avail_mem_gb, loaded.mem_usage_gb) == (33.8, 13.06)


def test_case23_runtime_comma_format(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "public/case-23.log")
    assert Counter(e.kind for e in events) == {"decode_batch": 1, "prefill_batch": 3, "http_access": 6}
    decode = events[0]
    assert (decode.running_req, decode.num_tokens, decode.token_usage) == (32, 11179, 0.08)
    assert (decode.gen_throughput, decode.queue_req, decode.cuda_graph) == (1635.11, 0, True)
    prefill = _kind(events, "prefill_batch")[0]
    assert (prefill.new_seq, prefill.new_token, prefill.cached_token, prefill.running_req) == (1, 158, 0, 31)
    assert prefill.input_throughput == 559.53
    access = _kind(events, "http_access")[0]
    assert (access.method, access.path, access.status, access.client) == (
        "POST",
        "/v1/chat/completions",
        200,
        "127.0.0.1:40052",
    )


def test_case24_and_case26_runtime_lines(corpus_dir: Path) -> None:
    e24 = _events(corpus_dir, "public/case-24.log")
    assert [e.gen_throughput for e in e24][:2] == [144.95, 140.27]
    assert all(e.num_tokens == 20800 and e.token_usage == 0.29 and e.tp_rank == 0 for e in e24)
    e26 = _events(corpus_dir, "public/case-26.log")
    assert [e.kind for e in e26] == [
        "http_access",
        "prefill_batch",
        "decode_batch",
        "decode_batch",
        "decode_batch",
    ]
    prefill = e26[1]  # the v0.4 `Prefill batch.` form with `cache hit rate`
    assert (prefill.new_token, prefill.cached_token, prefill.token_usage, prefill.queue_req) == (
        5395,
        6,
        0.03,
        0,
    )
    assert e26[2].num_tokens == 23066 and e26[2].gen_throughput == 53.58
    assert e26[0].client == "100.64.0.128:41863"


def test_case27_nccl_watchdog(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "public/case-27.log")
    (err,) = _kind(events, "error")
    assert err.category == "nccl_timeout"
    assert err.tp_rank == 6  # torch's `[rank6]:` prefix
    assert "Watchdog caught collective operation timeout" in err.message
    assert len(_kind(events, "weights_loaded")) == 5


def test_case29_swa_pools(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "public/case-29.log")
    pools = _kind(events, "kv_pool_allocated")
    assert [(p.tp_rank, p.k_size_gb, p.v_size_gb) for p in pools[:3]] == [
        (2, 41.76, 27.84),
        (1, 41.76, 27.84),
        (2, 4.82, 3.21),
    ]
    assert all(p.tokens == 1496958 for p in pools)
    assert {e.tp_rank: e.avail_mem_gb for e in _kind(events, "memory_pool_end")}[3] == 22.71


def test_case30_prefix_stripped_line(corpus_dir: Path) -> None:
    (pool,) = _events(corpus_dir, "public/case-30.log")
    assert (pool.kind, pool.tokens, pool.k_size_gb, pool.ts, pool.tp_rank) == (
        "kv_pool_allocated",
        367404,
        8.23,
        None,
        None,
    )


def test_case31_tutorial_full_run(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "public/case-31.log")
    (args,) = _kind(events, "server_args")
    assert args.args["model_path"] == "/mnt/d/gx/Desktop/Model/Qwen3-0___6B"
    assert args.args["mem_fraction_static"] == 0.88
    assert args.args["disaggregation_mode"] == "null"
    (summary,) = _kind(events, "pool_summary")
    assert (summary.max_total_num_tokens, summary.max_running_requests, summary.context_len) == (
        15387,
        2049,
        40960,
    )
    assert summary.available_gpu_mem_gb is None  # v0.4.6 did not print it
    assert _kind(events, "weights_begin")[0].avail_mem_gb == 3.23
    assert _kind(events, "memory_pool_end")[0].avail_mem_gb == 0.0
    assert len(_kind(events, "server_ready")) == 1
    assert [e.path for e in _kind(events, "http_access")] == ["/get_model_info", "/generate"]
    # flashinfer's Python-logging lines keep their own time.
    jit = [e for e in _kind(events, "log") if "flashinfer.jit" in e.message]
    assert jit and jit[0].ts == "2025-05-02T16:14:33.560"


def test_case34_pylogger_wrapped(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "public/case-34.log")
    (begin,) = _kind(events, "weights_begin")
    assert (begin.avail_mem_gb, begin.tp_rank) == (22.46, 0)
    assert begin.ts == "2025-03-07T23:50:27.727"
    (dist,) = _kind(events, "dist_init")
    assert dist.phase == "begin" and dist.tp_rank == 0
    waits = [e for e in _kind(events, "log") if e.message.startswith("Attempt ")]
    assert len(waits) == 3 and waits[0].tp_rank is None


def test_case37_eagle_decode(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "public/case-37.log")
    prefill, *decodes = events
    assert prefill.kind == "prefill_batch" and prefill.new_token == 28 and prefill.queue_req == 0
    assert [d.accept_len for d in decodes] == [2.17, 1.95, 1.80, 2.05, 1.80]
    assert decodes[0].accept_rate == 0.54 and decodes[0].queue_req == 0 and decodes[0].num_tokens == 108


def test_case38_single_gpu(corpus_dir: Path) -> None:
    events = _events(corpus_dir, "public/case-38.log")
    (pool,) = _kind(events, "kv_pool_allocated")
    assert (pool.tokens, pool.k_size_gb) == (132681, 9.11)
    (graph,) = _kind(events, "cuda_graph")
    assert graph.avail_mem_gb == 2.85


@pytest.mark.parametrize("name", ["public/case-05.log", "public/case-14.log", "public/case-27.log"])
def test_tqdm_and_blank_lines_stay_logs(corpus_dir: Path, name: str) -> None:
    events = _events(corpus_dir, name)
    assert not [e for e in _kind(events, "error") if "Loading" in e.message]
    assert any(e.kind == "log" and e.message.strip() == "" for e in events)
