"""The simulated scheduler: queue, chunked prefill, batched decode, radix cache, stats lines and metrics.

Decode is bandwidth-bound: one step costs `scenario.decode_step_seconds(depths)` real seconds (times
`K26_TWIN_DECODE_SCALE`), so a request at 185k depth decodes ~1400x slower per step than attention alone
would at depth 0 on the incident scenario. Prefill costs `tokens / prefill_tokens_per_s` seconds times the
restart time scale. The throughputs its log lines report are in simulated time, i.e. what the real
server would report; sleeping is scaled. Its latency histograms (TTFT, inter-token, end-to-end, queue)
hold what its clients waited, on the clock, as SGLang's do: a probe's TTFT and `/metrics`' TTFT of the
same request are one figure (simulated seconds there read as 30 s a probe measured as 0.5 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
import zlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from console.twin.scenarios import Scenario
from console.twin.server_logs import LogWriter

_WORDS = (
    " the", " of", " and", " to", " in", " a", " is", " that", " for", " it", " as", " with", " was",
    " on", " be", " at", " by", " this", " had", " not", " are", " but", " from", " or", " have", " an",
    " they", " which", " one", " you", " were", " her", " all", " she", " there", " would", " their",
    " we", " him", " been", " has", " when", " who", " will", " more", " no", " if", " out", " so",
    " said", " what", " up", " its", " about", " into", " than", " them", " can", " only", " other",
    " new", " some", " could", " time", ".", ",",
)  # fmt: skip

TTFT_BUCKETS = (
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
    10.0,
    20.0,
    40.0,
    60.0,
    80.0,
    100.0,
    200.0,
    400.0,
)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1,
               0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)  # fmt: skip
QUEUE_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0,
                 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0,
                 700.0, 800.0, 900.0, 1000.0, 1200.0, 1400.0, 1600.0, 1800.0, 2000.0, 2500.0,
                 3000.0)  # fmt: skip
"""SGLang v0.5.12.post1 `sglang:queue_time_seconds` (observability/metrics_collector.py); the three
above are its TTFT, inter-token and end-to-end buckets."""
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
               200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0)  # fmt: skip


def tokenize(text: str, vocab_size: int) -> list[int]:
    """A deterministic stand-in tokenizer (~4 characters a token): equal prefixes give equal ids."""
    return [zlib.crc32(text[i : i + 4].encode()) % vocab_size for i in range(0, len(text), 4)]


def token_text(token_id: int) -> str:
    return _WORDS[token_id % len(_WORDS)]


class RequestError(ValueError):
    """A request SGLang rejects (HTTP 400 / an `error` event on a stream)."""


RECORDED = 100_000
"""Raw observations each histogram keeps (newest), so a test can compute exact percentiles."""


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0
    recorded: deque[float] = field(default_factory=lambda: deque(maxlen=RECORDED))

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        self.total += value
        self.count += 1
        self.recorded.append(value)
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1


@dataclass
class Request:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    min_new_tokens: int
    ignore_eos: bool
    internal: bool = False
    created: float = field(default_factory=time.monotonic)
    cached_tokens: int = 0
    prefilled: int = 0
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: dict[str, Any] | None = None
    sim_elapsed: float = 0.0
    sim_first_token: float | None = None
    eos_at: int = 0
    updates: asyncio.Queue[bool] = field(default_factory=asyncio.Queue)
    aborted: bool = False

    @property
    def prompt_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def depth(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def meta_info(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": len(self.output_ids),
            "cached_tokens": self.cached_tokens,
        }
        if self.done:
            meta["e2e_latency"] = round(self.sim_elapsed, 6)
        return meta


class RadixCache:
    """Finished sequences kept as evictable prefixes (LRU), bounded by the free part of the pool."""

    def __init__(self) -> None:
        self._seqs: OrderedDict[int, list[int]] = OrderedDict()
        self._ids = itertools.count()
        self.evictable = 0

    def match(self, ids: list[int]) -> int:
        best = 0
        best_key: int | None = None
        for key, seq in self._seqs.items():
            if not seq or not ids or seq[0] != ids[0]:
                continue
            n = _common_prefix(seq, ids)
            if n > best:
                best, best_key = n, key
        if best_key is not None:
            self._seqs.move_to_end(best_key)
        return best

    def insert(self, ids: list[int]) -> None:
        if ids:
            self._seqs[next(self._ids)] = ids
            self.evictable += len(ids)

    def evict_to(self, limit: int) -> None:
        while self.evictable > max(limit, 0) and self._seqs:
            _, seq = self._seqs.popitem(last=False)
            self.evictable -= len(seq)

    def clear(self) -> None:
        self._seqs.clear()
        self.evictable = 0


def _common_prefix(a: list[int], b: list[int]) -> int:
    hi = min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class EngineConfig:
    max_total_num_tokens: int
    max_running_requests: int
    context_len: int
    max_req_input_len: int
    chunked_prefill_size: int
    max_prefill_tokens: int
    decode_log_interval: int
    tp_size: int
    time_scale: float
    decode_scale: float
    disable_radix_cache: bool
    served_model_name: str
    page_size: int


class Engine:
    """One scheduler (TP rank 0's view): admits, prefills, decodes, logs and counts."""

    def __init__(self, scenario: Scenario, cfg: EngineConfig, log: LogWriter) -> None:
        self.scenario = scenario
        self.cfg = cfg
        self.log = log
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.radix = RadixCache()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._rng = itertools.count(1)
        self.decode_steps = 0
        self._since_log_tokens = 0
        self._since_log_time = 0.0
        self.last_gen_throughput = 0.0
        self.last_busy = 0.0
        # metrics
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.cached_tokens_total = 0
        self.num_requests_total = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.queue = Histogram(QUEUE_BUCKETS)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        for req in list(self.running) + list(self.waiting):
            self.abort(req)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # ------------------------------------------------------------------ requests
    def validate(self, n_input: int, max_new_tokens: int | None) -> None:
        """The tokenizer manager's checks (v0.5.12.post1 `_validate_one_request`)."""
        ctx = self.cfg.context_len
        if n_input >= ctx:
            raise RequestError(
                f"The input ({n_input} tokens) is longer than the model's context length ({ctx} tokens)."
            )
        if max_new_tokens is not None and max_new_tokens + n_input > ctx:
            total = max_new_tokens + n_input
            raise RequestError(
                f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
                f"You requested a total of {total} tokens: {n_input} tokens from the input messages and "
                f"{max_new_tokens} tokens for the completion. Please reduce the number of tokens in the "
                "input messages or the completion to fit within the limit."
            )

    def submit(
        self,
        input_ids: list[int],
        max_new_tokens: int,
        min_new_tokens: int = 0,
        ignore_eos: bool = False,
        internal: bool = False,
        rid: str | None = None,
    ) -> Request:
        """Queue a request. Raises RequestError when the scheduler would abort it at once."""
        if len(input_ids) >= self.cfg.max_req_input_len:
            raise RequestError(
                f"Input length ({len(input_ids)} tokens) exceeds the maximum allowed length "
                f"({self.cfg.max_req_input_len} tokens). Use a shorter input or enable --allow-auto-truncate."
            )
        req = Request(
            rid=rid or uuid.uuid4().hex,
            input_ids=list(input_ids),
            max_new_tokens=max(int(max_new_tokens), 0),
            min_new_tokens=max(int(min_new_tokens), 0),
            ignore_eos=ignore_eos,
            internal=internal,
        )
        if not ignore_eos:
            seed = zlib.crc32(req.rid.encode())
            req.eos_at = max(req.min_new_tokens, 12 + seed % 52)
        self.waiting.append(req)
        self._wake.set()
        return req

    def abort(self, req: Request) -> None:
        if req.done:
            return
        req.aborted = True
        req.finish_reason = {"type": "abort", "message": "Abort before prefill"}
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        req.updates.put_nowait(True)

    def flush_cache(self) -> bool:
        if self.running or self.waiting:
            return False
        self.radix.clear()
        self.log.rank(0, "Cache flushed successfully!")
        return True

    # ------------------------------------------------------------------ pool accounting
    def used_tokens(self) -> int:
        return sum(r.depth for r in self.running)

    def token_usage(self) -> float:
        return self.used_tokens() / self.cfg.max_total_num_tokens if self.cfg.max_total_num_tokens else 0.0

    def busy(self) -> bool:
        return bool(self.running or self.waiting) or time.monotonic() - self.last_busy < 1.0

    # ------------------------------------------------------------------ the loop
    async def _run(self) -> None:
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            self.last_busy = time.monotonic()
            if self.waiting and self._can_admit(self.waiting[0]):
                await self._prefill_step()
            elif self.running:
                await self._decode_step()
            else:
                self._wake.clear()
                await self._wake.wait()

    def _can_admit(self, req: Request) -> bool:
        if req.prefilled == 0 and len(self.running) >= self.cfg.max_running_requests:
            return False
        need = req.prompt_tokens + min(req.max_new_tokens, 1)
        free = self.cfg.max_total_num_tokens - self.used_tokens()
        return need <= free or not self.running

    async def _prefill_step(self) -> None:
        req = self.waiting[0]
        if req.prefilled == 0:
            if not req.internal:
                self.queue.observe(time.monotonic() - req.created)
            cached = 0
            if not self.cfg.disable_radix_cache and req.prompt_tokens > 1:
                cached = min(self.radix.match(req.input_ids), req.prompt_tokens - 1)
            req.cached_tokens = cached
            req.prefilled = cached
        budget = (
            self.cfg.chunked_prefill_size
            if self.cfg.chunked_prefill_size > 0
            else self.cfg.max_prefill_tokens
        )
        new = min(req.prompt_tokens - req.prefilled, max(budget, 1))
        cached_now = req.cached_tokens if req.prefilled == req.cached_tokens else 0
        last_chunk = req.prefilled + new >= req.prompt_tokens
        sim = new / self.scenario.prefill_tokens_per_s + 0.004
        usage = (self.used_tokens() + req.prefilled + new) / self.cfg.max_total_num_tokens
        queue_after = len(self.waiting) - 1
        await asyncio.sleep(sim * self.cfg.time_scale)
        if req.aborted:
            return
        self.log.rank(
            0,
            f"Prefill batch, #new-seq: 1, #new-token: {new}, #cached-token: {cached_now}, "
            f"token usage: {usage:.2f}, #running-req: {len(self.running)}, "
            f"#queue-req: {queue_after}, #pending-token: 0, cuda graph: False, "
            f"input throughput (token/s): {new / sim:.2f}",
        )
        req.prefilled += new
        req.sim_elapsed += sim
        if not last_chunk:
            return
        self.waiting.popleft()
        if not req.internal:
            self.prompt_tokens_total += req.prompt_tokens
            self.cached_tokens_total += req.cached_tokens
            self.num_requests_total += 1
        self._emit_token(req, first=True)
        if not req.done:
            self.running.append(req)

    async def _decode_step(self) -> None:
        batch = list(self.running)
        sim = self.scenario.decode_step_seconds([r.depth for r in batch], self.cfg.tp_size)
        await asyncio.sleep(sim * self.cfg.decode_scale)
        produced = 0
        for req in batch:
            if req.aborted or req not in self.running:
                continue
            req.sim_elapsed += sim
            if not req.internal:
                self.itl.observe(sim * self.cfg.decode_scale)  # the step as its clients waited it
            self._emit_token(req, first=False)
            produced += 1
            if req.done:
                self.running.remove(req)
        self.decode_steps += 1
        self._since_log_tokens += produced
        self._since_log_time += sim
        if self.decode_steps % max(self.cfg.decode_log_interval, 1) == 0:
            gen = self._since_log_tokens / self._since_log_time if self._since_log_time else 0.0
            self.last_gen_throughput = gen
            self._since_log_tokens = 0
            self._since_log_time = 0.0
            self.log.rank(
                0,
                f"Decode batch, #running-req: {len(self.running)}, #token: {self.used_tokens()}, "
                f"token usage: {self.token_usage():.2f}, cuda graph: True, "
                f"gen throughput (token/s): {gen:.2f}, #queue-req: {len(self.waiting)}",
            )

    def _emit_token(self, req: Request, first: bool) -> None:
        """Append one sampled token and finish the request when it should stop."""
        if req.max_new_tokens == 0:
            req.finish_reason = {"type": "length", "length": 0}
        else:
            n = len(req.output_ids)
            token = zlib.crc32(f"{req.rid}:{n}".encode()) % self.scenario.vocab_size
            stop = not req.ignore_eos and n + 1 >= req.eos_at and n + 1 >= req.min_new_tokens
            if stop:
                token = self.scenario.eos_token_id
            req.output_ids.append(token)
            if not stop:
                req.text += token_text(token)
            if first:
                req.sim_first_token = req.sim_elapsed
                if not req.internal:
                    self.ttft.observe(time.monotonic() - req.created)
            if not req.internal:
                self.generation_tokens_total += 1
            if stop:
                req.finish_reason = {"type": "stop", "matched": self.scenario.eos_token_id}
            elif len(req.output_ids) >= req.max_new_tokens:
                req.finish_reason = {"type": "length", "length": req.max_new_tokens}
        if req.done:
            if not req.internal:
                self.e2e.observe(time.monotonic() - req.created)
            if not self.cfg.disable_radix_cache and not req.internal:
                self.radix.insert(req.input_ids + req.output_ids)
                self.radix.evict_to(self.cfg.max_total_num_tokens - self.used_tokens())
        req.updates.put_nowait(True)

    # ------------------------------------------------------------------ metrics
    def metrics_text(self) -> str:
        labels = (
            f'engine_type="unified",model_name="{self.cfg.served_model_name}",'
            'moe_ep_rank="0",pp_rank="0",tp_rank="0"'
        )
        used = self.used_tokens()
        total = self.cfg.max_total_num_tokens
        gauges: list[tuple[str, str, float]] = [
            ("num_running_reqs", "The number of running requests.", len(self.running)),
            ("num_used_tokens", "The number of used tokens.", used),
            ("token_usage", "The token usage.", self.token_usage()),
            ("gen_throughput", "The generation throughput (token/s).", self.last_gen_throughput),
            ("num_queue_reqs", "The number of requests in the waiting queue.", len(self.waiting)),
            ("num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.", 0),
            ("cache_hit_rate", "The prefix cache hit rate.", self._cache_hit_rate()),
            ("spec_accept_length", "The average acceptance length of speculative decoding.", 0),
            ("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", total),
            ("context_len", "The context length of the model.", self.cfg.context_len),
            ("page_size", "The page size of the KV cache.", self.cfg.page_size),
            ("kv_used_tokens", "The number of used tokens in the KV cache.", used),
            ("kv_available_tokens", "The number of available tokens in the KV cache.", total - used),
            ("kv_evictable_tokens", "The number of evictable tokens in the KV cache.", self.radix.evictable),
            ("utilization", "The utilization.", 1.0 if self.running else 0.0),
            ("is_cuda_graph", "Whether the batch is using CUDA graph.", 1.0 if self.running else 0.0),
        ]
        out: list[str] = []
        for name, doc, value in gauges:
            out.append(f"# HELP sglang:{name} {doc}")
            out.append(f"# TYPE sglang:{name} gauge")
            out.append(f"sglang:{name}{{{labels}}} {float(value)}")
        counters = [
            ("prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens_total),
            ("generation_tokens", "Number of generation tokens processed.", self.generation_tokens_total),
            ("cached_tokens", "Number of cached prompt tokens.", self.cached_tokens_total),
            ("num_requests", "The number of processed requests.", self.num_requests_total),
        ]
        for name, doc, value in counters:
            out.append(f"# HELP sglang:{name}_total {doc}")
            out.append(f"# TYPE sglang:{name}_total counter")
            out.append(f"sglang:{name}_total{{{labels}}} {float(value)}")
        for name, doc, hist in (
            ("time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft),
            ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self.itl),
            ("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", self.e2e),
            ("queue_time_seconds", "Histogram of queueing time in seconds.", self.queue),
        ):
            out.append(f"# HELP sglang:{name} {doc}")
            out.append(f"# TYPE sglang:{name} histogram")
            for bound, count in zip(hist.buckets, hist.counts, strict=True):
                out.append(f'sglang:{name}_bucket{{{labels},le="{bound}"}} {float(count)}')
            out.append(f'sglang:{name}_bucket{{{labels},le="+Inf"}} {float(hist.count)}')
            out.append(f"sglang:{name}_count{{{labels}}} {float(hist.count)}")
            out.append(f"sglang:{name}_sum{{{labels}}} {hist.total}")
        return "\n".join(out) + "\n"

    def _cache_hit_rate(self) -> float:
        return self.cached_tokens_total / self.prompt_tokens_total if self.prompt_tokens_total else 0.0
