"""The twin's simulated SGLang server process: argv, startup lines, pool sizing, failures, HTTP API, gpus.json."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from console.twin.scenarios import SCENARIOS, get_scenario
from console.twin.server_argspec import build_parser, parse_argv, server_args_repr
from console.twin.sglang_tree import WHEEL_VERSION, find_wheel

REPO = Path(__file__).resolve().parent.parent
KIMI = ["--model-path", "moonshotai/Kimi-K2.6", "--tp-size", "8"]
INCIDENT = [
    ("0.85", "64", 101_134),
    ("0.92", "8", 192_406),
    ("0.94", "8", 218_484),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TwinProc:
    """The server as a child process, its stdout collected line by line."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, port: int | None = None) -> None:
        self.port = port or free_port()
        full_env = {
            **os.environ,
            "K26_TWIN_TIME_SCALE": "0.0005",
            "K26_TWIN_DECODE_SCALE": "0.0005",
            "PYTHONUNBUFFERED": "1",
        }
        full_env.pop("K26_TWIN_STATE_DIR", None)
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "console.twin.sglang_server",
                *argv,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            cwd=REPO,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float = 30.0) -> str:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    if rx.search(line):
                        return line
                seen = len(self.lines)
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(f"server exited ({self.proc.returncode}) before {pattern!r}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"timed out waiting for {pattern!r}; last lines: {self.lines[-5:]}")
                self._cond.wait(min(remaining, 0.2))

    def wait_exit(self, timeout: float = 30.0) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code

    def terminate(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read()


@pytest.fixture(scope="module")
def server() -> Iterator[TwinProc]:
    """The incident's last launch (f 0.94, 8 requests, ctx 200k) with metrics, shared by the HTTP tests."""
    twin = TwinProc(
        [
            *KIMI,
            "--mem-fraction-static",
            "0.94",
            "--max-running-requests",
            "8",
            "--context-length",
            "200000",
            "--enable-metrics",
        ]
    )
    twin.wait_for("The server is fired up and ready to roll!")
    yield twin
    assert twin.terminate() == 0


# ------------------------------------------------------------------------------------------ scenarios
def test_scenarios_expose_the_hardware() -> None:
    sc = get_scenario(None)
    assert sc.name == "kimi-k26-rtx6000"
    assert (sc.gpu_name, sc.gpu_count, sc.gpu_total_mib) == (
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        8,
        97_887,
    )
    assert sc.model_path == "moonshotai/Kimi-K2.6"
    assert sc.kv_cell_bytes(8) == 70_272
    assert {"kimi-k26-rtx6000", "kimi-k26-rtx6000-healthy", "llama31-8b-h100"} <= set(SCENARIOS)
    assert get_scenario("healthy").name == "kimi-k26-rtx6000-healthy"
    llama = get_scenario("llama31-8b-h100")
    assert llama.attention == "mha" and llama.kv_cell_bytes(1) == 131_072
    with pytest.raises(KeyError):
        get_scenario("no-such-host")


def test_decode_speed_is_bandwidth_bound() -> None:
    incident = get_scenario("kimi-k26-rtx6000")
    healthy = get_scenario("healthy")
    assert incident.decode_tokens_per_s(185_000) == pytest.approx(0.7, abs=0.03)
    assert 10 <= healthy.decode_tokens_per_s(185_000) <= 60
    speeds = [incident.decode_tokens_per_s(d) for d in (0, 10_000, 50_000, 100_000, 185_000)]
    assert speeds == sorted(speeds, reverse=True)
    assert speeds[0] > 20


# ------------------------------------------------------------------------------------------ argv
def test_argv_parses_like_sglang_with_prefixes() -> None:
    args = parse_argv(
        ["--model", "m", "--tp", "8", "--mem-frac", "0.9", "--context-length", "200k"], get_scenario()
    )
    assert args["tp_size"] == 8
    assert args["mem_fraction_static"] == 0.9
    assert args["context_length"] == 200_000
    assert args["tokenizer_path"] == "m"
    assert len([a for a in build_parser()._actions if a.option_strings]) == 388  # 387 flags + -h


def test_unknown_flag_fails_like_argparse() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "console.twin.sglang_server", "--model-path", "m", "--no-such-flag", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.startswith("usage: sglang serve [-h] --model-path MODEL_PATH")
    assert out.stderr.rstrip().endswith("sglang serve: error: unrecognized arguments: --no-such-flag 1")
    assert out.stdout == ""


def test_ambiguous_prefix_fails_like_argparse() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "console.twin.sglang_server", "--model-path", "m", "--speculative-draft", "x"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "error: ambiguous option: --speculative-draft could match" in out.stderr


def test_server_args_repr_is_the_dataclass_repr() -> None:
    args = parse_argv([*KIMI, "--mem-fraction-static", "0.85"], get_scenario())
    text = server_args_repr(args)
    assert text.startswith(
        "ServerArgs(model_path='moonshotai/Kimi-K2.6', tokenizer_path='moonshotai/Kimi-K2.6', "
    )
    assert ", tp_size=8, " in text and ", mem_fraction_static=0.85, " in text
    assert text.endswith(")")


# ------------------------------------------------------------------------------------------ pool sizing
@pytest.mark.parametrize(("fraction", "max_running", "tokens"), INCIDENT)
def test_incident_pool_sizes_from_argv(fraction: str, max_running: str, tokens: int) -> None:
    twin = TwinProc(
        [
            *KIMI,
            "--mem-fraction-static",
            fraction,
            "--max-running-requests",
            max_running,
            "--context-length",
            "200000",
        ]
    )
    try:
        summary = twin.wait_for(r"max_total_num_tokens=")
        twin.wait_for("fired up and ready")
    finally:
        assert twin.terminate() == 0
    assert re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] max_total_num_tokens=", summary)
    assert f"max_total_num_tokens={tokens}, chunked_prefill_size=8192, max_prefill_tokens=16384, " in summary
    assert f"max_running_requests={max_running}, context_len=200000, available_gpu_mem=" in summary
    kv = [line for line in twin.lines if "KV Cache is allocated" in line]
    assert len(kv) == 8
    expected_gb = (tokens + 1) * 70_272 / 2**30
    assert all(line.endswith(f"#tokens: {tokens}, KV size: {expected_gb:.2f} GB") for line in kv)
    begin = {
        int(m.group(1)): float(m.group(2))
        for line in twin.lines
        if (m := re.search(r"TP(\d)\] Load weight begin\. avail mem=([\d.]+) GB", line))
    }
    assert len(begin) == 8 and min(begin.values()) == pytest.approx(85.33, abs=0.005)
    assert min(begin, key=lambda r: begin[r]) == 3
    assert "Gracefully exiting... Remaining number of requests 0." in "\n".join(twin.lines)


def test_max_total_tokens_larger_than_profiled_warns() -> None:
    twin = TwinProc(
        [
            *KIMI,
            "--mem-fraction-static",
            "0.85",
            "--max-running-requests",
            "8",
            "--context-length",
            "200000",
            "--max-total-tokens",
            "300000",
        ]
    )
    try:
        warning = twin.wait_for("is larger than the profiled value")
        summary = twin.wait_for("max_total_num_tokens=")
    finally:
        twin.terminate()
    assert warning.endswith(
        "max_total_tokens=300000 is larger than the profiled value 101134. Use the profiled value instead."
    )
    assert "max_total_num_tokens=101134," in summary


def test_too_low_fraction_is_not_enough_memory() -> None:
    twin = TwinProc([*KIMI, "--mem-fraction-static", "0.75", "--context-length", "200000"])
    code = twin.wait_exit()
    text = "\n".join(twin.lines)
    assert code != 0
    assert re.search(
        r"\[[\d: -]+ TP\d\] Scheduler hit an exception: Traceback \(most recent call last\):", text
    )
    assert "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static." in text
    assert "Received sigquit from a child process. It usually means the child failed." in text
    assert "] max_total_num_tokens=" not in text and "fired up" not in text


def test_too_high_fraction_is_cuda_oom_during_graph_capture() -> None:
    twin = TwinProc(
        [*KIMI, "--mem-fraction-static", "0.97", "--max-running-requests", "8", "--context-length", "200000"]
    )
    code = twin.wait_exit()
    text = "\n".join(twin.lines)
    assert code != 0
    assert "Capture cuda graph begin. This can take up to several minutes." in text
    oom = re.search(
        r"torch\.OutOfMemoryError: CUDA out of memory\. Tried to allocate ([\d.]+) GiB\. GPU 3 has a total "
        r"capacity of 95\.59 GiB of which ([\d.]+) MiB is free\.",
        text,
    )
    assert oom is not None
    assert float(oom.group(2)) < float(oom.group(1)) * 1024
    assert "Exception: Capture cuda graph failed: CUDA out of memory." in text
    assert "During handling of the above exception, another exception occurred:" in text
    assert "Received sigquit from a child process." in text
    assert "Capture cuda graph end" not in text and "] max_total_num_tokens=" not in text
    # GPU 3 holds the least free memory, so it is the first to fail.
    first = next(line for line in twin.lines if "Scheduler hit an exception" in line)
    assert " TP3] " in first


# ------------------------------------------------------------------------------------------ startup lines
def test_startup_lines_in_order_and_they_parse(server: TwinProc) -> None:
    lines = list(server.lines)
    ready = next(i for i, line in enumerate(lines) if "fired up and ready" in line)
    lines = lines[: ready + 1]

    def first(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    def last(text: str) -> int:
        return max(i for i, line in enumerate(lines) if text in line)

    order = [
        "server_args=ServerArgs(",
        "Init torch distributed begin.",
        "Init torch distributed ends. elapsed=",
        "Load weight begin. avail mem=",
        "Loading safetensors checkpoint shards:",
        "Load weight end. elapsed=",
        "KV Cache is allocated.",
        "Memory pool end. avail mem=",
        "Capture cuda graph begin. This can take up to several minutes.",
        "Capture cuda graph bs [1, 2, 4, 8]",
        "Capturing batches (bs=8 avail_mem=",
        "Capture cuda graph end. Time elapsed:",
        "max_total_num_tokens=",
        "INFO:     Started server process [",
        "INFO:     Uvicorn running on http://127.0.0.1:",
        "INFO:     127.0.0.1:",
        "Prefill batch, #new-seq: 1,",
        "The server is fired up and ready to roll!",
    ]
    positions = [first(text) for text in order]
    assert positions == sorted(positions)
    for text in (
        "Init torch distributed begin.",
        "Load weight begin.",
        "Load weight end.",
        "KV Cache is allocated.",
        "Capture cuda graph begin.",
        "Capture cuda graph end.",
    ):
        assert sum(text in line for line in lines) == 8
        assert {m.group(1) for line in lines if text in line and (m := re.search(r" (TP\d)\] ", line))} == {
            f"TP{i}" for i in range(8)
        }
    assert last("Init torch distributed ends.") < first("Load weight begin.")
    assert last("Load weight end.") < first("KV Cache is allocated.")
    assert re.match(
        r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] server_args=ServerArgs\(model_path='moonshotai/Kimi-K2\.6'",
        lines[0],
    )
    assert re.search(
        r"Load weight end\. elapsed=[\d.]+ s, type=KimiK25ForConditionalGeneration, quant=compressed-tensors, "
        r"avail mem=[\d.]+ GB, mem usage=65\.92 GB\.$",
        lines[first("Load weight end.")],
    )
    assert re.search(
        r'\] INFO:     127\.0\.0\.1:\d+ - "POST /v1/chat/completions HTTP/1\.1" 200 OK$',
        "\n".join(lines),
        re.M,
    )

    parser_mod = pytest.importorskip("console.core.parser")
    parser = parser_mod.JournalParser(host="twin")
    events = []
    for line in lines:
        events += parser.feed(line)
    events += parser.flush()
    kinds = [e.kind for e in events]
    for kind in (
        "server_args",
        "dist_init",
        "weights_begin",
        "weights_loaded",
        "kv_pool_allocated",
        "memory_pool_end",
        "cuda_graph",
        "pool_summary",
        "http_access",
        "prefill_batch",
        "server_ready",
    ):
        assert kind in kinds, kind
    summary = next(e for e in events if e.kind == "pool_summary")
    assert (summary.max_total_num_tokens, summary.tp_rank, summary.max_running_requests) == (218_484, 0, 8)
    args = next(e for e in events if e.kind == "server_args")
    assert args.args["mem_fraction_static"] == 0.94 and args.args["tp_size"] == 8
    kv = [e for e in events if e.kind == "kv_pool_allocated"]
    assert len(kv) == 8 and {e.tokens for e in kv} == {218_484} and {e.kv_size_gb for e in kv} == {14.30}
    begins = [e for e in events if e.kind == "weights_begin"]
    assert min(e.avail_mem_gb for e in begins) == 85.33


def test_failure_lines_parse_into_errors() -> None:
    parser_mod = pytest.importorskip("console.core.parser")
    twin = TwinProc(
        [*KIMI, "--mem-fraction-static", "0.97", "--max-running-requests", "8", "--context-length", "200000"]
    )
    twin.wait_exit()
    parser = parser_mod.JournalParser(host="twin")
    events = []
    for line in twin.lines:
        events += parser.feed(line)
    events += parser.flush()
    categories = {e.category for e in events if e.kind == "error"}
    assert "sigquit" in categories
    assert categories & {"cuda_oom", "cuda_graph_failed"}


# ------------------------------------------------------------------------------------------ HTTP
def _stream(client: httpx.Client, url: str, body: dict[str, Any]) -> list[Any]:
    events: list[Any] = []
    with client.stream("POST", url, json=body, timeout=60) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_generate_streams_exactly_max_new_tokens(server: TwinProc) -> None:
    rng = random.Random(7)
    ids = [rng.randrange(163_840) for _ in range(300)]
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 37, "min_new_tokens": 37, "ignore_eos": True, "temperature": 0},
        "stream": True,
    }
    with httpx.Client(base_url=server.url) as client:
        events = _stream(client, "/generate", body)
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        assert len(chunks) >= 2
        last = chunks[-1]
        meta = last["meta_info"]
        assert len(last["output_ids"]) == 37
        assert meta["completion_tokens"] == 37 and meta["prompt_tokens"] == 300
        assert meta["finish_reason"] == {"type": "length", "length": 37}
        assert meta["cached_tokens"] == 0 and meta["e2e_latency"] > 0 and meta["id"]
        assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
        counts = [len(c["output_ids"]) for c in chunks]
        assert counts == sorted(counts) and last["text"].startswith(chunks[0]["text"])

        again = _stream(client, "/generate", body)[-2]
        assert again["meta_info"]["cached_tokens"] == 299
        fresh = dict(body, input_ids=[rng.randrange(163_840) for _ in range(300)])
        assert _stream(client, "/generate", fresh)[-2]["meta_info"]["cached_tokens"] == 0

        plain = client.post("/generate", json={**body, "stream": False}, timeout=60).json()
        assert len(plain["output_ids"]) == 37 and plain["meta_info"]["completion_tokens"] == 37
        text = client.post(
            "/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 4}}
        ).json()
        assert text["meta_info"]["completion_tokens"] <= 4
    assert server.wait_for(r"Prefill batch, #new-seq: 1, #new-token: 300, #cached-token: 0, token usage: ")
    assert server.wait_for(r'"POST /generate HTTP/1\.1" 200 OK')


def test_generate_beyond_context_is_400(server: TwinProc) -> None:
    body = {"input_ids": [5] * 199_990, "sampling_params": {"max_new_tokens": 100}}
    with httpx.Client(base_url=server.url) as client:
        resp = client.post("/generate", json=body, timeout=60)
        assert resp.status_code == 400
        message = resp.json()["error"]["message"]
        assert message.startswith(
            "Requested token count exceeds the model's maximum context length of 200000 tokens."
        )
        assert (
            "You requested a total of 200090 tokens: 199990 tokens from the input messages and 100 tokens"
            in message
        )
        events = _stream(client, "/generate", {**body, "stream": True})
        assert events[0]["error"]["message"] == message and events[-1] == "[DONE]"
        too_long = client.post("/generate", json={"input_ids": [5] * 200_000}, timeout=60)
        assert too_long.status_code == 400
        assert (
            "is longer than the model's context length (200000 tokens)" in too_long.json()["error"]["message"]
        )


def test_input_too_long_for_the_pool_is_400() -> None:
    twin = TwinProc(
        [*KIMI, "--mem-fraction-static", "0.8", "--max-running-requests", "8", "--context-length", "200000"]
    )
    try:
        summary = twin.wait_for("max_total_num_tokens=")
        twin.wait_for("fired up")
        pool = int(re.search(r"max_total_num_tokens=(\d+)", summary).group(1))  # type: ignore[union-attr]
        resp = httpx.post(
            f"{twin.url}/generate",
            json={"input_ids": [3] * (pool + 10), "sampling_params": {"max_new_tokens": 1}},
            timeout=60,
        )
    finally:
        twin.terminate()
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == (
        f"Input length ({pool + 10} tokens) exceeds the maximum allowed length ({pool - 6} tokens). "
        "Use a shorter input or enable --allow-auto-truncate."
    )


def test_decode_at_185k_reports_incident_throughput(server: TwinProc) -> None:
    rng = random.Random(185)
    body = {
        "input_ids": [rng.randrange(163_840) for _ in range(185_000)],
        "sampling_params": {"max_new_tokens": 81, "min_new_tokens": 81, "ignore_eos": True},
    }
    start = len(server.lines)
    resp = httpx.post(f"{server.url}/generate", json=body, timeout=120)
    assert resp.status_code == 200
    meta = resp.json()["meta_info"]
    assert meta["completion_tokens"] == 81 and meta["prompt_tokens"] == 185_000
    # Simulated time: ~20.6 s of prefill at 9k tok/s, then 80 decode steps at ~1.43 s each.
    assert 125 < meta["e2e_latency"] < 145
    server.wait_for(r"Decode batch, #running-req: 1, #token: 1850\d\d, ")
    rx = r"Decode batch, #running-req: 1, #token: 1850\d\d, token usage: 0\.85, cuda graph: True"
    decode = [line for line in server.lines[start:] if re.search(rx, line)][-1]
    gen = float(re.search(r"gen throughput \(token/s\): ([\d.]+)", decode).group(1))  # type: ignore[union-attr]
    assert gen == pytest.approx(0.7, abs=0.03)
    prefills = [
        line for line in server.lines[start:] if "Prefill batch" in line and "#new-token: 8192," in line
    ]
    assert len(prefills) == 22  # 185,000 tokens in chunks of 8,192


def test_chat_completions_stream(server: TwinProc) -> None:
    body = {
        "messages": [{"role": "user", "content": "Say hi"}],
        "max_tokens": 6,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.Client(base_url=server.url) as client:
        events = _stream(client, "/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finals[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 6


def test_info_health_flush_and_metrics(server: TwinProc) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get("/health").status_code == 200
        assert client.get("/health_generate").status_code == 200
        for path in ("/get_model_info", "/model_info"):
            info = client.get(path).json()
            assert info["model_path"] == "moonshotai/Kimi-K2.6" and info["is_generation"] is True
            assert info["architectures"] == ["KimiK25ForConditionalGeneration"]
        for path in ("/get_server_info", "/server_info"):
            info = client.get(path).json()
            assert info["version"] == "0.5.12.post1"
            assert info["max_total_num_tokens"] == 218_484 and info["tp_size"] == 8
            assert info["mem_fraction_static"] == 0.94 and info["max_req_input_len"] == 199_994
            state = info["internal_states"][0]
            assert set(state["memory_usage"]) == {"weight", "kvcache", "token_capacity", "graph"}
            assert state["memory_usage"]["token_capacity"] == 218_484
            assert state["memory_usage"]["kvcache"] == 14.3 and state["memory_usage"]["weight"] == 65.92
            assert "last_gen_throughput" in state and state["effective_max_running_requests_per_dp"] == 8
        flushed = client.post("/flush_cache")
        assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed.")
        metrics = client.get("/metrics")
        assert metrics.status_code == 200
        names = set(re.findall(r"^(sglang:[a-z_]+)", metrics.text, re.M))
        for name in (
            "num_running_reqs",
            "num_used_tokens",
            "token_usage",
            "gen_throughput",
            "num_queue_reqs",
            "max_total_num_tokens",
            "context_len",
            "prompt_tokens_total",
            "generation_tokens_total",
            "time_to_first_token_seconds_bucket",
            "time_to_first_token_seconds_count",
        ):
            assert f"sglang:{name}" in names, name
        assert re.search(r'^sglang:max_total_num_tokens\{.*tp_rank="0".*\} 218484\.0$', metrics.text, re.M)
        assert client.get("/no_such_endpoint").status_code == 404
    assert server.wait_for("Endpoint '/get_server_info' is deprecated")
    assert server.wait_for("Cache flushed successfully!")


def test_metrics_only_with_enable_metrics() -> None:
    twin = TwinProc(
        ["--model-path", "meta-llama/Llama-3.1-8B-Instruct"], env={"K26_TWIN_SCENARIO": "llama31-8b-h100"}
    )
    try:
        twin.wait_for("fired up")
        assert httpx.get(f"{twin.url}/metrics").status_code == 404
        assert httpx.get(f"{twin.url}/health").status_code == 200
    finally:
        assert twin.terminate() == 0
    text = "\n".join(twin.lines)
    assert re.search(
        r"\] KV Cache is allocated\. #tokens: \d+, K size: [\d.]+ GB, V size: [\d.]+ GB$", text, re.M
    )
    assert "Capture piecewise CUDA graph end." in text
    assert '"POST /generate HTTP/1.1" 200 OK' in text
    assert " TP0]" not in text  # TP 1: no rank tag


# ------------------------------------------------------------------------------------------ gpus.json
def test_gpus_json_follows_the_phases(tmp_path: Path) -> None:
    state = tmp_path / "gpu"
    twin = TwinProc(
        [
            *KIMI,
            "--mem-fraction-static",
            "0.85",
            "--max-running-requests",
            "64",
            "--context-length",
            "200000",
        ],
        env={"K26_TWIN_STATE_DIR": str(state), "K26_TWIN_TIME_SCALE": "0.004"},
    )
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any("fired up" in line for line in twin.lines):
        try:
            snap = json.loads((state / "gpus.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            snap = None
        if snap and (not seen or snap["gpus"][3] != seen[-1]["gpus"][3]):
            seen.append(snap)
        time.sleep(0.005)
    final = json.loads((state / "gpus.json").read_text())
    assert twin.terminate() == 0
    after = json.loads((state / "gpus.json").read_text())

    gpu3 = [s["gpus"][3] for s in seen]
    assert any(
        g["breakdown_mib"]["weights"] == 0 and g["memory_used_mib"] > 10_000 for g in gpu3
    )  # dist init
    assert any(g["breakdown_mib"]["weights"] > 0 and g["breakdown_mib"]["kv_pool"] == 0 for g in gpu3)
    assert any(g["breakdown_mib"]["kv_pool"] > 0 and g["breakdown_mib"]["cuda_graphs"] == 0 for g in gpu3)
    g = final["gpus"][0]
    assert final["pid"] == twin.proc.pid and len(final["gpus"]) == 8
    assert g["name"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition" and g["memory_total_mib"] == 97_887
    assert g["uuid"].startswith("GPU-") and len({x["uuid"] for x in final["gpus"]}) == 8
    assert g["processes"] == [{"pid": twin.proc.pid, "name": "python3", "used_mib": g["memory_used_mib"]}]
    b = g["breakdown_mib"]
    assert b["weights"] == round(70_775_746_560 / 2**20)
    assert b["kv_pool"] == round(101_135 * 70_272 / 2**20)
    assert b["cuda_graphs"] > 0 and b["other"] > 10_000
    assert sum(b.values()) == g["memory_used_mib"]
    free_gib = (g["memory_total_mib"] - g["memory_used_mib"]) / 1024
    summary = next(line for line in twin.lines if "max_total_num_tokens=" in line)
    assert free_gib == pytest.approx(
        float(re.search(r"available_gpu_mem=([\d.]+)", summary).group(1)), abs=0.1
    )  # type: ignore[union-attr]
    for gpu in after["gpus"]:
        assert gpu["processes"] == [] and gpu["memory_used_mib"] == 0 and gpu["utilization_pct"] == 0


def test_gpus_json_idle_after_a_failed_start(tmp_path: Path) -> None:
    twin = TwinProc(
        [*KIMI, "--mem-fraction-static", "0.97", "--max-running-requests", "8", "--context-length", "200000"],
        env={"K26_TWIN_STATE_DIR": str(tmp_path)},
    )
    assert twin.wait_exit() != 0
    snap = json.loads((tmp_path / "gpus.json").read_text())
    assert all(g["processes"] == [] and g["memory_used_mib"] == 0 for g in snap["gpus"])


@pytest.mark.serial  # the exit is timed: measured with no other test running
def test_sigterm_during_startup_exits_zero_quickly(tmp_path: Path) -> None:
    twin = TwinProc(
        [*KIMI, "--mem-fraction-static", "0.85"],
        env={"K26_TWIN_TIME_SCALE": "0.2", "K26_TWIN_STATE_DIR": str(tmp_path)},
    )
    twin.wait_for("Init torch distributed begin.", timeout=30)
    started = time.monotonic()
    assert twin.terminate() == 0
    assert time.monotonic() - started < 5
    snap = json.loads((tmp_path / "gpus.json").read_text())
    assert all(g["processes"] == [] for g in snap["gpus"])


async def test_health_is_503_while_starting() -> None:
    from console.twin.server_http import TwinHttpServer

    logged: list[str] = []
    http = TwinHttpServer(
        lambda: None,
        server_args={"served_model_name": "m", "enable_metrics": False},
        scheduler_info={"status": "ready", "max_total_num_tokens": 1, "max_req_input_len": 1},
        model_info={"model_path": "m", "is_generation": True},
        internal_state=dict,
        log_main=logged.append,
    )
    port = free_port()
    await http.start("127.0.0.1", port)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/health")).status_code == 503
            assert (await client.get("/health_generate")).status_code == 503
            assert (await client.get("/model_info")).json()["model_path"] == "m"
    finally:
        await http.close()
    assert any('"GET /health_generate HTTP/1.1" 503 Service Unavailable' in line for line in logged)


# ------------------------------------------------------------------------- the twin's formats are SGLang's
# Checked against the cached SGLang wheel's own source (its f-strings, its metric names, the lines its
# tracebacks quote), not by the console's parser: a parser and a twin written by the same hands could agree
# on a format SGLang never printed.
needs_wheel = pytest.mark.skipif(
    find_wheel() is None,
    reason=f"the SGLang {WHEEL_VERSION} wheel is not cached in .cache/sglang-wheel (run scripts/fetch-sglang-wheel)",
)
_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: [A-Z]+\d+)*\] ")
# Lines that are not SGLang's own text, by who prints them: uvicorn's server and access log, and tqdm's
# default bar after a description SGLang gives (the description itself is checked).
_UVICORN = re.compile(
    r"INFO: {5}(?:Started server process \[\d+\]|Waiting for application (?:startup|shutdown)\."
    r"|Application (?:startup|shutdown) complete\.|Uvicorn running on http://[\d.]+:\d+ \(Press CTRL\+C to quit\)"
    r'|Shutting down|Finished server process \[\d+\]|[\d.]+:\d+ - "[A-Z]+ /[\w/]* HTTP/1\.1" \d{3} [\w ]+)'
)
_TQDM_DEFAULT_BAR = re.compile(r": +\d+%\|[^|]*\| \d+/\d+ \[[\d:]+<[\d:?]+, +[\d.?]+(?:it/s|s/it)\]$")


def _sglang_site() -> Path:
    from console.twin.sglang_tree import extracted_tree

    wheel = find_wheel()
    assert wheel is not None
    return extracted_tree(wheel)


def _messages(lines: list[str]) -> dict[str, str]:
    """The twin's SGLang messages, one per shape (numbers folded), uvicorn's lines left out."""
    shapes: dict[str, str] = {}
    for line in lines:
        message = _PREFIX.sub("", line)
        if not message.strip() or _UVICORN.fullmatch(message):
            continue
        message = _TQDM_DEFAULT_BAR.sub("", message)
        shapes.setdefault(re.sub(r"\d+", "0", message), message)
    return shapes


@needs_wheel
def test_every_line_the_twin_logs_is_one_sglang_prints(server: TwinProc) -> None:
    from tests.support.sglang_templates import matching_template

    with httpx.Client(base_url=server.url, timeout=30) as client:
        client.post(
            "/generate",
            json={"text": "hello " * 40, "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}},
        )
    server.wait_for(r"Decode batch, ")
    site = _sglang_site()
    messages = _messages(list(server.lines))
    # The kinds of line the console's parser reads off a boot and a request: each must be among them.
    for head in (
        "Load weight end.",
        "KV Cache is allocated.",
        "Memory pool end.",
        "Capture cuda graph end.",
        "max_total_num_tokens=",
        "Prefill batch,",
        "Decode batch,",
        "The server is fired up",
    ):
        assert any(m.startswith(head) for m in messages.values()), head
    unmatched = [m for m in messages.values() if matching_template(site, m) is None]
    assert unmatched == []


@needs_wheel
def test_the_format_check_refuses_a_line_sglang_never_printed() -> None:
    # The positive control of the check above: one word changed, one field renamed, a decimal too many.
    # Its limit: a template that ends in a free placeholder (the Decode line's `{token_usage_msg}`) accepts
    # any tail; the fields after it are held to real SGLang lines by the parser's corpus tests.
    from tests.support.sglang_templates import matching_template

    site = _sglang_site()
    assert matching_template(site, "KV Cache is allocated. #tokens: 218484, KV size: 14.30 GB") is not None
    for wrong in (
        "KV Cache is allocated. #tokens: 218484, KV sizes: 14.30 GB",
        "KV Cache is allocated. #token: 218484, KV size: 14.30 GB",
        "Memory pool end. avail mem=5.071 GB",
        "Decode batch, #running-reqs: 1, #token: 109, token usage: 0.00, gen throughput (token/s): 38.65",
    ):
        assert matching_template(site, wrong) is None, wrong


@needs_wheel
def test_the_twins_metric_names_are_sglangs(server: TwinProc) -> None:
    site = _sglang_site()
    declared: set[str] = set()
    for path in (site / "sglang").rglob("*.py"):
        text = path.read_text(encoding="utf-8", errors="replace")
        if "sglang:" in text:
            declared |= set(re.findall(r"[\"'](sglang:[a-z0-9_]+)[\"']", text))

    def base(name: str) -> str:
        return re.sub(r"_(?:total|bucket|count|sum|created)$", "", name)

    metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    served = {base(n) for n in re.findall(r"^(sglang:[a-z0-9_]+)", metrics, re.M)}
    assert len(served) >= 10
    assert served - {base(n) for n in declared} == set()


def _enclosing_function(source: list[str], number: int) -> str | None:
    """The innermost function whose body holds line `number` (1-based)."""
    import ast

    spans = [
        (node.lineno, node.name)
        for node in ast.walk(ast.parse("\n".join(source)))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.lineno <= number <= (node.end_lineno or node.lineno)
    ]
    return max(spans)[1] if spans else None


@needs_wheel
def test_the_frames_the_twins_tracebacks_quote_are_sglangs_lines() -> None:
    from console.twin import server_logs

    site = _sglang_site()
    tracebacks = [
        server_logs.not_enough_memory_traceback(),
        server_logs.cuda_oom_traceback("oom", mla=True, draft=False),
        server_logs.cuda_oom_traceback("oom", mla=False, draft=True),
    ]
    checked = 0
    for lines in tracebacks:
        for i, line in enumerate(lines):
            m = re.fullmatch(r'  File "(.+?)", line (\d+), in (\w+)', line)
            if not m or "/sglang/" not in m.group(1):
                continue  # torch's frames: torch is not in the wheel
            rel = m.group(1)[m.group(1).index("/sglang/") + 1 :]
            source = (site / rel).read_text(encoding="utf-8").splitlines()
            number, func = int(m.group(2)), m.group(3)
            quoted = lines[i + 1].strip()
            assert source[number - 1].strip() == quoted, f"{rel}:{number} is not {quoted!r}"
            assert _enclosing_function(source, number) == func, f"{rel}:{number} is not in {func}"
            checked += 1
    assert checked >= 15
    # The messages at their ends are SGLang's too.
    from tests.support.sglang_templates import matching_template

    assert matching_template(site, "Not enough memory. Please try to increase --mem-fraction-static.")
    assert matching_template(site, server_logs.CUDA_GRAPH_CAPTURE_FAILED_MSG) is not None
    failed = server_logs.cuda_oom_traceback("CUDA out of memory.", mla=True, draft=False)
    head = failed.index("Exception: Capture cuda graph failed: CUDA out of memory.")
    message = "\n".join(failed[head:]).removeprefix("Exception: ")
    assert matching_template(site, message) is not None
