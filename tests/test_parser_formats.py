"""The parser on every prefix and format it must read: journald, JSON, docker, old SGLang forms, errors."""

from __future__ import annotations

import json

import pytest

from console.core.events import event_from_json
from console.core.parser import (
    MAX_TRACEBACK_LINES,
    STALE_TRACEBACK_LINES,
    JournalParser,
    parse_lines,
    parse_text,
)

POOL_END = "Memory pool end. avail mem=4.38 GB"


def one(line: str | bytes | dict, host: str | None = None):
    events = list(parse_lines([line], host=host))
    assert len(events) == 1, events
    event = events[0]
    assert event_from_json(event.model_dump_json()) == event
    return event


# -- outer prefixes ------------------------------------------------------------------------------------


def test_journald_short_takes_year_from_sglang_stamp() -> None:
    e = one(f"May 30 22:14:44 dflash-train python[10991]: [2026-05-30 22:14:44 TP1] {POOL_END}")
    assert (e.kind, e.avail_mem_gb, e.tp_rank, e.pid, e.host) == (
        "memory_pool_end",
        4.38,
        1,
        10991,
        "dflash-train",
    )
    assert e.ts == "2026-05-30T22:14:44"
    assert e.raw.startswith("May 30 22:14:44 dflash-train")


def test_journald_short_without_sglang_stamp_keeps_yearless_time() -> None:
    e = one("Jun  3 04:05:06 gpu1 python3[77]: Loading safetensors checkpoint shards: 100% Completed | 64/64")
    assert e.kind == "log"
    assert e.ts == "--06-03T04:05:06"  # no year is invented
    assert e.message.startswith("Loading safetensors")
    assert e.pid == 77


def test_journald_year_boundary() -> None:
    e = one(f"Dec 31 23:59:59 h python[1]: [2027-01-01 00:00:00 TP0] {POOL_END}")
    assert e.ts == "2026-12-31T23:59:59"
    e = one(f"Jan  1 00:00:01 h python[1]: [2026-12-31 23:59:59 TP0] {POOL_END}")
    assert e.ts == "2027-01-01T00:00:01"


def test_journald_short_precise_and_iso() -> None:
    e = one(f"May 30 22:14:44.123456 h python[5]: [2026-05-30 22:14:44 TP3] {POOL_END}")
    assert (e.ts, e.tp_rank, e.pid) == ("2026-05-30T22:14:44.123456", 3, 5)
    e = one(f"2026-05-30T22:14:44+0000 h python[5]: [2026-05-30 22:14:44 TP3] {POOL_END}")
    assert (e.ts, e.host, e.tp_rank, e.avail_mem_gb) == ("2026-05-30T22:14:44+00:00", "h", 3, 4.38)
    e = one(f"2026-05-30T22:14:44.250000+02:00 h python[5]: [2026-05-30 22:14:44 TP3] {POOL_END}")
    assert e.ts == "2026-05-30T22:14:44.250000+02:00"


def test_docker_timestamps_and_compose_prefixes() -> None:
    e = one(f"2026-05-30T22:14:44.123456789Z [2026-05-30 22:14:44 TP2] {POOL_END}")
    assert (e.kind, e.ts, e.tp_rank, e.host) == (
        "memory_pool_end",
        "2026-05-30T22:14:44.123456+00:00",
        2,
        None,
    )
    e = one(f"sglang-1  | [2026-05-30 22:14:44 TP2] {POOL_END}")
    assert (e.kind, e.ts, e.tp_rank) == ("memory_pool_end", "2026-05-30T22:14:44", 2)
    e = one(f"sglang_1 | 2026-05-30T22:14:44.5Z [2026-05-30 22:14:44 TP2] {POOL_END}")
    assert (e.kind, e.ts) == ("memory_pool_end", "2026-05-30T22:14:44.5+00:00")
    e = one(f"\x1b[36msglang-1  |\x1b[0m [2026-05-30 22:14:44 TP2] {POOL_END}")
    assert (e.kind, e.avail_mem_gb) == ("memory_pool_end", 4.38)


def test_python_logger_wrapper() -> None:
    e = one(
        "2025-03-07 23:50:27,727 - __main__ - INFO - [2025-03-07 23:50:27 TP0] Load weight begin. avail mem=22.46 GB"
    )
    assert (e.kind, e.avail_mem_gb, e.tp_rank, e.ts) == ("weights_begin", 22.46, 0, "2025-03-07T23:50:27.727")


def test_host_argument_is_the_default_host() -> None:
    assert one(f"[2026-05-30 22:14:44 TP0] {POOL_END}", host="gpu7").host == "gpu7"
    assert (
        one(f"May 30 22:14:44 real python[1]: [2026-05-30 22:14:44 TP0] {POOL_END}", host="gpu7").host
        == "real"
    )


# -- SGLang's own prefix forms ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tags", "ranks"),
    [
        ("TP7", {"tp_rank": 7}),
        ("DP1 TP1 EP1", {"dp_rank": 1, "tp_rank": 1, "ep_rank": 1}),
        ("PP1 TP3", {"pp_rank": 1, "tp_rank": 3}),
        ("TP3 PP1", {"pp_rank": 1, "tp_rank": 3}),
        (
            "DP0 PP1 ATTN_CP2 MOE_DP3 TP4 EP5",
            {"dp_rank": 0, "pp_rank": 1, "attn_cp_rank": 2, "moe_dp_rank": 3, "tp_rank": 4, "ep_rank": 5},
        ),
        (
            "EP5 TP4 MOE_DP3 ATTN_CP2 PP1 DP0",
            {"dp_rank": 0, "pp_rank": 1, "attn_cp_rank": 2, "moe_dp_rank": 3, "tp_rank": 4, "ep_rank": 5},
        ),
    ],
)
def test_rank_tags_in_any_order(tags: str, ranks: dict[str, int]) -> None:
    for line in (
        f"[2026-05-30 22:00:23 {tags}] {POOL_END}",
        f"May 30 22:00:23 h python[9]: [2026-05-30 22:00:23 {tags}] {POOL_END}",
    ):
        e = one(line)
        assert e.kind == "memory_pool_end"
        for field in ("dp_rank", "pp_rank", "attn_cp_rank", "moe_dp_rank", "tp_rank", "ep_rank"):
            assert getattr(e, field) == ranks.get(field), (line, field)


def test_millisecond_stamp_and_time_only_prefix() -> None:
    e = one(f"[2026-05-30 22:00:23.417 TP0] {POOL_END}")
    assert (e.ts, e.tp_rank) == ("2026-05-30T22:00:23.417", 0)
    e = one(f"[23:17:01 TP6] {POOL_END}")
    assert (e.ts, e.tp_rank, e.avail_mem_gb) == ("23:17:01", 6, 4.38)


def test_v01_rank_colon_forms() -> None:
    e = one("Rank 1: max_total_num_token=115621, max_prefill_num_token=19269, context_len=4096, ")
    assert (e.kind, e.tp_rank, e.max_total_num_tokens, e.max_prefill_tokens, e.context_len) == (
        "pool_summary",
        1,
        115621,
        19269,
        4096,
    )
    e = one("Rank 1: Max_total_num_token=115621, max_prefill_num_token=19269, context_len=4096")
    assert (e.kind, e.max_total_num_tokens) == ("pool_summary", 115621)
    assert (one("Rank 0: Load weight ends.").kind, one("Rank 3: load weight begin.").tp_rank) == (
        "weights_loaded",
        3,
    )
    assert one("[gpu_id=2] Load weight begin. avail mem=70.01 GB").tp_rank == 2


def test_tqdm_carriage_returns() -> None:
    bar = "Capturing batches (bs=1 avail_mem=3.71 GB):  50%|█████     | 2/4\rCapturing batches (bs=1 avail_mem=3.70 GB): 100%|██████████| 4/4"
    e = one(f"May 30 22:00:23 h python[9]: {bar}")
    assert e.kind == "log" and e.message.endswith("100%|██████████| 4/4")
    assert e.raw.endswith("4/4") and "\r" in e.raw
    hidden = f"Loading:  10%|█| 1/9\r[2026-05-30 22:00:23 TP0] {POOL_END}\r"
    e = one(hidden)
    assert (e.kind, e.avail_mem_gb, e.tp_rank) == ("memory_pool_end", 4.38, 0)


def test_crlf_and_trailing_newline() -> None:
    assert one(f"[2026-05-30 22:00:23 TP0] {POOL_END}\r\n").avail_mem_gb == 4.38
    assert one(f"[2026-05-30 22:00:23 TP0] {POOL_END}\n".encode()).avail_mem_gb == 4.38


# -- message kinds: the versions' variants -----------------------------------------------------------


def test_startup_lines_across_versions() -> None:
    p = "[2026-06-20 10:00:00 TP0] "
    e = one(p + "Init parallel begin.")
    assert (e.kind, e.phase) == ("dist_init", "begin")
    e = one(p + "Init parallel ends. elapsed=0.21 s")
    assert (e.kind, e.phase, e.elapsed_s, e.mem_usage_gb) == ("dist_init", "end", 0.21, None)
    e = one(p + "Memory baseline taken. mem usage=0.10 GB")
    assert (e.kind, e.phase, e.mem_usage_gb) == ("dist_init", "end", 0.1)
    e = one(p + "Init torch distributed ends. mem usage=1.77 GB")
    assert (e.phase, e.mem_usage_gb) == ("end", 1.77)
    e = one(
        p
        + "Load weight end. elapsed=2.62 s, type=KimiK25ForConditionalGeneration, quant=compressed-tensors, bits=4, avail mem=27.10 GB, mem usage=66.05 GB."
    )
    assert (e.quant, e.avail_mem_gb, e.mem_usage_gb, e.elapsed_s) == (
        "compressed-tensors, bits=4",
        27.1,
        66.05,
        2.62,
    )
    e = one(p + "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 218484, KV size: 14.30 GB")
    assert (e.tokens, e.kv_size_gb, e.dtype, e.label) == (218484, 14.3, "torch.bfloat16", None)
    e = one(
        p
        + "SWA KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1496958, K size: 4.82 GB, V size: 3.21 GB"
    )
    assert (e.label, e.k_size_gb, e.v_size_gb) == ("SWA", 4.82, 3.21)
    e = one(p + "KV Cache is allocated. #tokens: 101134, K size: 0.14 GB, V size: 0.14 GB")
    assert (e.tokens, e.k_size_gb, e.dtype) == (101134, 0.14, None)
    e = one(p + "Capture cuda graph end. Time elapsed: 3.74 s. mem usage=0.60 GB. avail mem=23.54 GB.")
    assert (e.phase, e.elapsed_s, e.mem_usage_gb, e.avail_mem_gb, e.graph) == ("end", 3.74, 0.6, 23.54, None)
    e = one(p + "Capture piecewise CUDA graph begin. avail mem=24.14 GB")
    assert (e.phase, e.graph, e.avail_mem_gb) == ("begin", "piecewise", 24.14)
    e = one(
        p + "Capture draft extend cuda graph end. Time elapsed: 1.10 s. mem usage=0.05 GB. avail mem=3.50 GB."
    )
    assert (e.graph, e.elapsed_s) == ("draft extend", 1.1)
    e = one(
        p
        + "Capture target decode CUDA graph end. bs=[1, 2, 4], elapsed=3.12 s, mem usage=0.52 GB, avail mem=3.69 GB."
    )
    assert (e.phase, e.graph, e.elapsed_s, e.mem_usage_gb, e.avail_mem_gb) == (
        "end",
        "decode",
        3.12,
        0.52,
        3.69,
    )
    assert one(p + "Capture cuda graph bs [1, 2, 4, 8]").kind == "log"
    e = one(
        p
        + "max_total_tokens=300000 is larger than the profiled value 218484. Use the profiled value instead."
    )
    assert (e.kind, e.requested, e.profiled) == ("pool_clamped", 300000, 218484)
    assert one("[2026-05-24 00:53:21] The server is fired up and ready to roll!").kind == "server_ready"
    e = one(
        p
        + "max_total_num_tokens=992896, chunked_prefill_size=16384, max_prefill_tokens=16384, max_running_requests=4096, context_len=40960, available_cpu_mem=21.24 GB"
    )
    assert (e.max_total_num_tokens, e.available_gpu_mem_gb) == (992896, None)


def test_server_args_dict_repr() -> None:
    e = one(
        "[2026-06-20 10:00:00] server_args={'model_path': 'moonshotai/Kimi-K2.6', 'tp_size': 8, 'mem_fraction_static': 0.94, 'context_length': 200000, 'json_model_override_args': '{}', 'cuda_graph_bs': [1, 2, 4]}"
    )
    assert e.args == {
        "model_path": "moonshotai/Kimi-K2.6",
        "tp_size": 8,
        "mem_fraction_static": 0.94,
        "context_length": 200000,
        "json_model_override_args": "{}",
        "cuda_graph_bs": [1, 2, 4],
    }
    e = one(
        "[2026-06-20 10:00:00] server_args=ServerArgs(model_path='a, b', tp_size=8, lora_paths=None, x=<Enum.A: 1>, tru"
    )
    assert e.args["model_path"] == "a, b" and e.args["tp_size"] == 8 and e.args["x"] == "<Enum.A: 1>"


def test_runtime_line_variants() -> None:
    e = one(
        "[2025-12-02 18:40:16 TP0] Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 2212, token usage: 0.02, #running-req: 0, #queue-req: 0, "
    )
    assert (e.new_seq, e.new_token, e.cached_token, e.token_usage, e.running_req, e.queue_req) == (
        1,
        1,
        2212,
        0.02,
        0,
        0,
    )
    e = one(
        "[2026-06-20 10:00:00 TP0] Decode batch [12], #running-req: 3, #full token: 900, full token usage: 0.40, #swa token: 100, swa token usage: 0.10, cuda graph: True, gen throughput (token/s): 40.00, #queue-req: 1"
    )
    assert (e.running_req, e.num_tokens, e.token_usage, e.queue_req) == (3, 900, 0.4, 1)
    e = one(
        "[2024-09-01 10:00:00 TP0] Decode batch. #running-req: 1, #token: 5, token usage: 0.00, accept len: 3.10, gen throughput (token/s): 9.00, #queue-req: 0"
    )
    assert (e.accept_len, e.gen_throughput) == (3.1, 9.0)
    e = one('INFO:     10.0.0.5:1234 - "GET /health HTTP/1.1" 503 Service Unavailable')
    assert (e.kind, e.method, e.path, e.status, e.client) == (
        "http_access",
        "GET",
        "/health",
        503,
        "10.0.0.5:1234",
    )
    assert one("[2026-05-24 00:53:20] INFO:     Started server process [1964249]").kind == "log"


# -- errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "category"),
    [
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 7 has a total capacity of 95.00 GiB",
            "cuda_oom",
        ),
        (
            "Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.5",
            "not_enough_memory",
        ),
        (
            "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.7.",
            "not_enough_memory",
        ),
        ("Capture cuda graph failed: CUDA error: out of memory", "cuda_graph_failed"),
        (
            "[Rank 6] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE) ran for 600050 milliseconds",
            "nccl_timeout",
        ),
        ("Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)", "watchdog_timeout"),
        ("Watchdog timeout (self.watchdog_timeout=300)", "watchdog_timeout"),
        ("Received sigquit from a child process. It usually means the child failed.", "sigquit"),
        ("SIGQUIT received. signum=3, frame=None. It usually means one child failed.", "sigquit"),
        ("TokenizerManager hit an exception: boom", "other"),
    ],
)
def test_one_line_errors(message: str, category: str) -> None:
    e = one(f"[2026-05-30 22:00:23 TP2] {message}")
    assert (e.kind, e.category, e.message, e.tp_rank) == ("error", category, message, 2)
    assert e.lines == [e.raw]


TRACEBACK = [
    "Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/sgl/managers/scheduler.py", line 2344, in run_scheduler_process',
    "    scheduler = Scheduler(server_args)",
    "    ^^^^^^^^^^^^^^^^^^^^^^^",
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
]


def test_traceback_grouped_in_journald_text_and_ends_on_next_prefixed_line() -> None:
    head = "May 30 22:00:23 h python3[42]: "
    lines = [f"{head}[2026-05-30 22:00:23 TP3] {TRACEBACK[0]}"] + [head + t for t in TRACEBACK[1:]]
    lines.append(f"{head}[2026-05-30 22:00:24 TP3] {POOL_END}")
    parser = JournalParser()
    fed = [parser.feed(line) for line in lines]
    assert fed[:-1] == [[]] * (len(lines) - 1)  # held until it ends
    err, end = fed[-1]
    assert (err.kind, err.category, err.tp_rank, err.pid) == ("error", "not_enough_memory", 3, 42)
    assert err.message == TRACEBACK[-1]
    assert err.lines == lines[:-1]
    assert err.raw == "\n".join(lines[:-1])
    assert end.kind == "memory_pool_end"
    assert parser.flush() == []


def test_interleaved_tracebacks_of_two_ranks_stay_apart() -> None:
    a, b = "May 30 22:00:23 h python3[41]: ", "May 30 22:00:23 h python3[42]: "
    lines = [
        a + "[2026-05-30 22:00:23 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        b + "[2026-05-30 22:00:23 TP1] Scheduler hit an exception: Traceback (most recent call last):",
        a + '  File "x.py", line 1, in f',
        b + '  File "y.py", line 2, in g',
        a + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.",
        b + "TypeError: bad",
    ]
    errors = [e for e in parse_lines(lines) if e.kind == "error"]
    by_rank = {e.tp_rank: e for e in errors}
    assert len(errors) == 2
    assert by_rank[0].category == "cuda_oom" and by_rank[0].pid == 41 and len(by_rank[0].lines) == 3
    assert by_rank[1].category == "scheduler_exception" and by_rank[1].message == "TypeError: bad"


def test_chained_traceback_and_trailing_blank_lines() -> None:
    text = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "a.py", line 1, in <module>',
            "KeyError: 'x'",
            "",
            "During handling of the above exception, another exception occurred:",
            "",
            "Traceback (most recent call last):",
            '  File "a.py", line 3, in <module>',
            "ValueError: y",
            "",
            "",
            f"[2026-05-30 22:00:23 TP0] {POOL_END}",
        ]
    )
    events = parse_text(text)
    assert [e.kind for e in events] == ["error", "log", "log", "memory_pool_end"]
    assert events[0].message == "ValueError: y" and len(events[0].lines) == 9
    assert events[0].category == "traceback"


def test_traceback_is_bounded_and_flushed() -> None:
    lines = ["Traceback (most recent call last):"] + ['  File "f.py", line 1, in f'] * (
        MAX_TRACEBACK_LINES + 10
    )
    events = list(parse_lines(lines))
    assert events[0].kind == "error" and len(events[0].lines) == MAX_TRACEBACK_LINES
    assert [e.kind for e in events[1:]] == ["log"] * 11
    parser = JournalParser()
    assert parser.feed("Traceback (most recent call last):") == []
    assert parser.feed('  File "f.py", line 1, in f') == []
    (err,) = parser.flush()
    assert err.kind == "error" and len(err.lines) == 2


def test_traceback_of_a_silent_process_ends_after_other_lines() -> None:
    head = "May 30 22:00:23 h python3[{}]: "
    parser = JournalParser()
    assert parser.feed(head.format(7) + "Traceback (most recent call last):") == []
    assert parser.feed(head.format(7) + '  File "f.py", line 1, in f') == []
    out = []
    for _ in range(STALE_TRACEBACK_LINES + 1):
        out += parser.feed(head.format(8) + f"[2026-05-30 22:00:23 TP1] {POOL_END}")
    errors = [e for e in out if e.kind == "error"]
    assert len(errors) == 1 and errors[0].pid == 7 and len(errors[0].lines) == 2


def test_unrelated_unprefixed_line_ends_traceback() -> None:
    events = parse_text(
        'Traceback (most recent call last):\n  File "f.py", line 1, in f\nValueError: z\nLoading safetensors checkpoint shards: 100%'
    )
    assert [e.kind for e in events] == ["error", "log"]
    assert len(events[0].lines) == 3


# -- journal JSON and systemd ----------------------------------------------------------------------


def _entry(message: object, **extra: object) -> dict:
    base = {
        "__CURSOR": "s=abc;i=1f",
        "__REALTIME_TIMESTAMP": "1780179284123456",
        "_BOOT_ID": "b00t",
        "_HOSTNAME": "gpu7",
        "_PID": "10990",
        "_SYSTEMD_UNIT": "sglang.service",
        "_SYSTEMD_INVOCATION_ID": "inv1",
        "SYSLOG_IDENTIFIER": "python3",
        "MESSAGE": message,
    }
    base.update(extra)
    return base


def test_json_entry_metadata() -> None:
    entry = _entry(f"[2026-05-30 22:14:44 TP1] {POOL_END}")
    for item in (entry, json.dumps(entry), json.dumps(entry).encode()):
        e = one(item)
        assert (e.kind, e.avail_mem_gb, e.tp_rank) == ("memory_pool_end", 4.38, 1)
        assert (e.cursor, e.realtime_us, e.pid, e.host) == ("s=abc;i=1f", 1780179284123456, 10990, "gpu7")
        assert (e.systemd_unit, e.invocation_id, e.boot_id) == ("sglang.service", "inv1", "b00t")
        assert e.ts == "2026-05-30T22:14:44.123456+00:00"  # journal time, UTC


def test_json_message_as_byte_array() -> None:
    raw = list(b"[2026-05-30 22:14:44 TP1] Memory pool end. avail mem=4.38 GB \xff")
    e = one(_entry(raw))
    assert e.kind == "memory_pool_end" and e.avail_mem_gb == 4.38
    assert e.raw.endswith("\ufffd")


def test_json_multiline_message_and_traceback_cursor() -> None:
    msg = "\n".join([TRACEBACK[0], *TRACEBACK[1:]])
    parser = JournalParser()
    assert parser.feed(_entry(msg, __CURSOR="c1")) == []
    (err, _end) = parser.feed(_entry(f"[2026-05-30 22:14:45 TP1] {POOL_END}", __CURSOR="c2"))
    assert err.kind == "error" and len(err.lines) == 5 and err.cursor == "c1"
    lines = [
        _entry(TRACEBACK[0], __CURSOR="c3"),
        _entry(TRACEBACK[1], __CURSOR="c4"),
        _entry(TRACEBACK[4], __CURSOR="c5"),
    ]
    (err,) = list(parse_lines(lines))
    # A follower resumes after the last cursor it saw: the grouped error carries its last line's.
    assert err.cursor == "c5" and len(err.lines) == 3


@pytest.mark.parametrize(
    ("message", "state", "result", "counter"),
    [
        ("Starting sglang.service - SGLang server...", "starting", None, None),
        ("Started sglang.service - SGLang server.", "started", None, None),
        ("Stopping sglang.service - SGLang server...", "stopping", None, None),
        ("Stopped sglang.service - SGLang server.", "stopped", None, None),
        ("sglang.service: Main process exited, code=exited, status=1/FAILURE", "failed", "exit-code", None),
        ("sglang.service: Main process exited, code=killed, status=9/KILL", "failed", "signal", None),
        ("sglang.service: Failed with result 'exit-code'.", "failed", "exit-code", None),
        ("sglang.service: Deactivated successfully.", "stopped", "success", None),
        ("sglang.service: Scheduled restart job, restart counter is at 3.", "starting", None, 3),
        ("Failed to start sglang.service - SGLang server.", "failed", None, None),
    ],
)
def test_systemd_unit_lines(message: str, state: str, result: str | None, counter: int | None) -> None:
    e = one(f"May 30 22:00:23 gpu7 systemd[1]: {message}")
    assert (e.kind, e.state, e.result, e.restart_counter) == ("unit", state, result, counter)
    assert (e.systemd_unit, e.pid, e.host, e.message) == ("sglang.service", 1, "gpu7", message)
    j = one(
        _entry(
            message,
            SYSLOG_IDENTIFIER="systemd",
            _PID="1",
            _SYSTEMD_UNIT="init.scope",
            UNIT="sglang.service",
            INVOCATION_ID="inv9",
            _SYSTEMD_INVOCATION_ID=None,
        )
    )
    assert (j.kind, j.state, j.result, j.systemd_unit, j.invocation_id) == (
        "unit",
        state,
        result,
        "sglang.service",
        "inv9",
    )


def test_systemd_lines_without_state_stay_logs() -> None:
    e = one("May 30 22:00:23 gpu7 systemd[1]: sglang.service: Consumed 1h 2min 3.456s CPU time.")
    assert (e.kind, e.systemd_unit) == ("log", None)


# -- never raises ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "item",
    [
        "",
        "\x00\x01\x02",
        "[",
        "[] ",
        "[2026-13-99 99:99:99 TP] Memory pool end. avail mem=abc GB",
        "[2026-05-30 22:00:23 TP0] Memory pool end. avail mem=nan GB",
        "[2026-05-30 22:00:23 TP0] Decode batch, #running-req: x, #token: , token usage: ?",
        "[2026-05-30 22:00:23 TP0] max_total_num_tokens=, context_len=",
        "[2026-05-30 22:00:23 TP0] server_args=ServerArgs(((((",
        "x" * 300_000,
        "{not json",
        '{"MESSAGE": null}',
        '{"MESSAGE": [300, -1, "a"], "__REALTIME_TIMESTAMP": "99999999999999999999"}',
        '{"__CURSOR": 5, "_PID": "abc"}',
        b"\xff\xfe\xfd",
        {"MESSAGE": {"nested": 1}},
        {},
    ],
)
def test_garbage_becomes_events(item: object) -> None:
    parser = JournalParser()
    events = parser.feed(item) + parser.flush()  # type: ignore[arg-type]
    assert events
    for e in events:
        assert event_from_json(e.model_dump_json()) == e
