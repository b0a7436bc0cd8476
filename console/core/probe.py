"""The arithmetic of a synthetic long-context probe: one streamed `/generate` at a chosen depth.

A verified pool is not a working server: decode at 185k depth can crawl because the attention kernel
reads the KV cache at a tiny fraction of the card's memory bandwidth. The probe measures time to first
token, decode tokens/s and inter-token latencies from the token arrival times, and sets the bandwidth
decode achieved on the KV cache (depth x KV bytes per token per GPU x tokens/s) against the card's peak.

Everything here is pure: the sources layer records when tokens arrived and hands the numbers in.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from console.core.cards import GpuBandwidth, card_bandwidth
from console.core.gpuhealth import peak_bandwidth_gbs
from console.core.gpus import GpuSample
from console.core.models import ModelConfigError, ModelSpec

GB = 1e9
"""Bandwidths are quoted in decimal GB/s, as the vendors quote them."""

# Token ids of the random prompt: inside every modern vocabulary (Llama 3 128k, Qwen 151k, Kimi 163k,
# DeepSeek 129k) and clear of the low ids where some tokenizers keep BOS/EOS/pad.
PROMPT_ID_RANGE = (100, 30_000)

ATTENTION_BOUND_FRACTION = 0.02
"""Below this share of peak bandwidth at a depth where the KV cache matters, attention is the limit."""
MIN_KV_BYTES_TO_JUDGE = 2e9
"""KV bytes read per decoded token (per GPU) below which the cache is too small a part of a decode step
(weights and launch overhead dominate) for its read speed to say anything about attention."""
MIN_SWEEP_SPAN_TOKENS = 16_000


def gpu_bandwidth(gpu_name: str | None, memory_mib: float | None = None) -> GpuBandwidth | None:
    """The card's peak bandwidth from `console.core.cards` (None for a card the table does not name)."""
    return card_bandwidth(gpu_name, memory_mib)


PeakFrom = Literal["nvml", "table"]


def card_peak(
    gpu: GpuSample | None, name: str | None = None
) -> tuple[float | None, PeakFrom | None, str | None]:
    """(peak GB/s, where from, the source in words) of the card the probe reads: NVML's own figure, 2 ×
    the maximum memory clock × the bus width / 8, when the GPU sample carries them (the NVML back-ends);
    else the bandwidth table's for its name (`name`, else the sample's); (None, None, None) for a card
    neither knows."""
    if gpu is not None:
        own = peak_bandwidth_gbs(gpu)
        if own is not None:
            return (
                round(own, 1),
                "nvml",
                f"NVML: 2 × max memory clock {gpu.clock_mem_max_mhz:,.0f} MHz × "
                f"{gpu.memory_bus_width_bits:,}-bit bus / 8",
            )
    entry = card_bandwidth(
        name or (gpu.name if gpu is not None else None), gpu.memory_total_mib if gpu else None
    )
    if entry is None:
        return None, None, None
    return entry.peak_gbs, "table", f"the bandwidth table ({entry.name}: {entry.source})"


def kv_bytes_per_token(spec: ModelSpec | None, tp_size: int | None, kv_cache_dtype: str | None) -> int | None:
    """KV bytes per token per GPU (SGLang's cell) for the served model, None when it is not known."""
    if spec is None:
        return None
    try:
        return spec.cell_bytes(tp=tp_size or 1, kv_cache_dtype=kv_cache_dtype or "auto")
    except ModelConfigError:
        return None


# ------------------------------------------------------------------------------------------------
# limits: refuse a depth the server cannot take, before anything is sent
# ------------------------------------------------------------------------------------------------


class ServerLimits(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True)

    context_len: int | None = None
    pool_tokens: int | None = None
    """`max_total_num_tokens`: the KV pool."""
    max_req_input_len: int | None = None
    source: str = "unknown"


def refusal(depth: int, new_tokens: int, limits: ServerLimits) -> str | None:
    """Why the server cannot take `depth` prompt tokens plus `new_tokens` new ones; None when it can."""
    total = depth + new_tokens
    if limits.context_len is not None and total > limits.context_len:
        return (
            f"{depth:,} + {new_tokens:,} new tokens exceeds the context length of {limits.context_len:,} "
            "(--context-length)"
        )
    if limits.pool_tokens is not None and total > limits.pool_tokens:
        return (
            f"{depth:,} + {new_tokens:,} new tokens exceeds the KV pool of {limits.pool_tokens:,} tokens "
            "(raise --mem-fraction-static)"
        )
    if limits.max_req_input_len is not None and depth >= limits.max_req_input_len:
        return f"{depth:,} prompt tokens reaches the server's longest input of {limits.max_req_input_len:,}"
    return None


def random_prompt(depth: int, rng: random.Random) -> list[int]:
    """`depth` random token ids: a fresh prefix every run, so the radix cache cannot answer it."""
    lo, hi = PROMPT_ID_RANGE
    return [rng.randrange(lo, hi) for _ in range(depth)]


def generate_payload(input_ids: list[int], new_tokens: int) -> dict[str, object]:
    """The `/generate` body: exactly `new_tokens` tokens, greedy, EOS ignored."""
    return {
        "input_ids": input_ids,
        "sampling_params": {
            "max_new_tokens": new_tokens,
            "min_new_tokens": new_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
        },
        "stream": True,
    }


# ------------------------------------------------------------------------------------------------
# one probe: measurement in, result out
# ------------------------------------------------------------------------------------------------


class ProbeStatus(StrEnum):
    OK = "ok"
    REFUSED = "refused"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ProbeVerdict(StrEnum):
    ATTENTION_BOUND = "attention_bound"
    ATTENTION_OK = "attention_ok"
    TOO_SHALLOW = "too_shallow"
    UNKNOWN = "unknown"


class ProbeTarget(BaseModel, defer_build=True):
    """What the probe knows of the host: the card and the KV cell, to turn tok/s into bandwidth."""

    model_config = ConfigDict(frozen=True)

    host: str
    gpu_name: str | None = None
    gpu_count: int | None = None
    model: str | None = None
    tp_size: int | None = None
    kv_cache_dtype: str | None = None
    kv_bytes_per_token_per_gpu: int | None = None
    peak_bandwidth_gbs: float | None = None
    peak_from: PeakFrom | None = None
    """`nvml`: the card's own clocks (`card_peak`); `table`: `console/core/cards.py`."""
    peak_source: str | None = None
    """Where the peak comes from, in words (`NVML: 2 × max memory clock … / 8`, or the table's row)."""
    attention_backend: str | None = None
    page_size: int | None = None


class ProbeMeasurement(BaseModel, defer_build=True):
    """What the stream showed: cumulative token counts and when they arrived (seconds since the send)."""

    depth: int
    requested_tokens: int
    arrivals: list[tuple[float, int]] = Field(default_factory=list)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    server_decode_tok_s: float | None = None


class ProbeResult(BaseModel, defer_build=True):
    """One depth of a probe; the `--json` contract's `results` items."""

    depth: int
    status: ProbeStatus = ProbeStatus.OK
    requested_tokens: int
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_s: float | None = None
    decode_tok_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    effective_kv_bandwidth_gbs: float | None = None
    peak_bandwidth_gbs: float | None = None
    bandwidth_pct: float | None = None
    """Effective KV read bandwidth as a percentage of the card's peak."""
    server_decode_tok_s: float | None = None
    """Decode tok/s as the server measured it (its inter-token-latency histogram), when it exports one."""
    verdict: ProbeVerdict = ProbeVerdict.UNKNOWN
    diagnosis: str = ""
    error: str | None = None


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100), as numpy's default; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def inter_token_latencies(arrivals: Sequence[tuple[float, int]]) -> list[float]:
    """One latency per decoded token. A chunk that brings k tokens at once (`--stream-interval` > 1)
    spreads its wait over the k of them rather than counting k-1 zero waits."""
    out: list[float] = []
    for (t0, n0), (t1, n1) in itertools.pairwise(arrivals):
        k = n1 - n0
        if k > 0:
            out.extend([(t1 - t0) / k] * k)
    return out


def live_tok_s(arrivals: Sequence[tuple[float, int]], window: int = 8) -> float | None:
    """Decode tok/s over the last `window` arrivals (the first token, which waits for prefill, excluded)."""
    tail = list(arrivals[1:])[-window:] if len(arrivals) > 2 else []
    if len(tail) < 2:
        return None
    (t0, n0), (t1, n1) = tail[0], tail[-1]
    return (n1 - n0) / (t1 - t0) if t1 > t0 else None


def fmt_depth(depth: int) -> str:
    """185000 → `185k`, 131072 → `131,072`."""
    return f"{depth // 1000}k" if depth >= 1000 and depth % 1000 == 0 else f"{depth:,}"


def fmt_pct(pct: float) -> str:
    return f"{pct:.1f}%" if pct >= 0.95 or pct == 0 else f"{pct:.2f}%"


def diagnose(
    depth: int, tok_s: float, target: ProbeTarget
) -> tuple[ProbeVerdict, str, float | None, float | None]:
    """(verdict, one line, effective GB/s, % of peak) for decode at `tok_s` with `depth` tokens of KV."""
    cell = target.kv_bytes_per_token_per_gpu
    if cell is None:
        return (
            ProbeVerdict.UNKNOWN,
            f"decode runs at {tok_s:.2f} tok/s at {fmt_depth(depth)} depth; the KV bytes per token of "
            f"{target.model or 'this model'} are not known, so the bandwidth cannot be judged",
            None,
            None,
        )
    kv_bytes = depth * cell
    effective = kv_bytes * tok_s / GB
    peak = target.peak_bandwidth_gbs
    if peak is None:
        card = target.gpu_name or "the GPU"
        return (
            ProbeVerdict.UNKNOWN,
            f"decode reads KV at {effective:.1f} GB/s per GPU at {fmt_depth(depth)} depth; {card} is not in "
            "the bandwidth catalogue, so there is no peak to compare with",
            effective,
            None,
        )
    pct = 100.0 * effective / peak
    memory = (gpu_bandwidth(target.gpu_name) or GpuBandwidth(name="", peak_gbs=peak)).memory
    head = f"decode reads KV at {fmt_pct(pct)} of {memory} bandwidth at {fmt_depth(depth)} depth"
    if kv_bytes < MIN_KV_BYTES_TO_JUDGE:
        judge_at = math.ceil(MIN_KV_BYTES_TO_JUDGE / cell / 1000) * 1000
        return (
            ProbeVerdict.TOO_SHALLOW,
            f"{head}: too shallow for the KV cache to dominate a decode step (probe {fmt_depth(judge_at)} "
            "or deeper to judge attention)",
            effective,
            pct,
        )
    if pct / 100.0 < ATTENTION_BOUND_FRACTION:
        return (
            ProbeVerdict.ATTENTION_BOUND,
            f"{head}: attention is the bottleneck (check --attention-backend and --page-size)",
            effective,
            pct,
        )
    return ProbeVerdict.ATTENTION_OK, f"{head}: attention keeps up with the card", effective, pct


def summarize(measurement: ProbeMeasurement, target: ProbeTarget) -> ProbeResult:
    """The result of a finished stream: TTFT, tok/s, ITL percentiles, bandwidth and the diagnosis."""
    arrivals = [a for a in measurement.arrivals if a[1] > 0]
    output = arrivals[-1][1] if arrivals else 0
    base = ProbeResult(
        depth=measurement.depth,
        requested_tokens=measurement.requested_tokens,
        output_tokens=output,
        prompt_tokens=measurement.prompt_tokens,
        cached_tokens=measurement.cached_tokens,
        peak_bandwidth_gbs=target.peak_bandwidth_gbs,
        server_decode_tok_s=measurement.server_decode_tok_s,
    )
    if not arrivals:
        return base.model_copy(
            update={
                "status": ProbeStatus.FAILED,
                "error": "the server sent no token",
                "diagnosis": "no token arrived",
            }
        )
    ttft = arrivals[0][0]
    itls = inter_token_latencies(arrivals)
    span = arrivals[-1][0] - arrivals[0][0]
    decoded = output - arrivals[0][1]
    tok_s = decoded / span if decoded > 0 and span > 0 else None
    update: dict[str, object] = {
        "ttft_s": ttft,
        "itl_p50_s": percentile(itls, 50),
        "itl_p99_s": percentile(itls, 99),
        "decode_tok_s": tok_s,
    }
    if tok_s is None:
        update["diagnosis"] = "fewer than two tokens: no decode speed to judge (ask for more tokens)"
        return base.model_copy(update=update)
    verdict, line, effective, pct = diagnose(measurement.depth, tok_s, target)
    if measurement.cached_tokens:
        line += f"; {measurement.cached_tokens:,} prompt tokens came from the cache"
    update.update(verdict=verdict, diagnosis=line, effective_kv_bandwidth_gbs=effective, bandwidth_pct=pct)
    return base.model_copy(update=update)


def refused_result(depth: int, new_tokens: int, reason: str, target: ProbeTarget) -> ProbeResult:
    return ProbeResult(
        depth=depth,
        requested_tokens=new_tokens,
        status=ProbeStatus.REFUSED,
        peak_bandwidth_gbs=target.peak_bandwidth_gbs,
        diagnosis=f"refused: {reason}",
        error=reason,
    )


def failed_result(
    measurement: ProbeMeasurement, target: ProbeTarget, error: str, *, cancelled: bool = False
) -> ProbeResult:
    """A probe that ended early keeps what it measured (TTFT, tokens so far) beside the reason."""
    partial = summarize(measurement, target) if measurement.arrivals else None
    status = ProbeStatus.CANCELLED if cancelled else ProbeStatus.FAILED
    fields: dict[str, object] = {
        "status": status,
        "error": error,
        "diagnosis": ("cancelled: " if cancelled else "failed: ") + error,
    }
    if partial is None:
        return ProbeResult(
            depth=measurement.depth,
            requested_tokens=measurement.requested_tokens,
            peak_bandwidth_gbs=target.peak_bandwidth_gbs,
            **fields,  # type: ignore[arg-type]
        )
    return partial.model_copy(update={**fields, "verdict": ProbeVerdict.UNKNOWN})


# ------------------------------------------------------------------------------------------------
# a sweep
# ------------------------------------------------------------------------------------------------


def parse_depths(text: str) -> list[int]:
    """`1k,8k,32k,185k,200000` → depths, in the order given; ValueError with one sentence if malformed."""
    depths: list[int] = []
    for word in text.replace(" ", "").split(","):
        if not word:
            continue
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([kK]i?|[mM]i?)?", word.replace("_", ""))
        if not m:
            raise ValueError(f"{word!r} is not a depth (use tokens such as 8k, 64k, 185000)")
        number, suffix = float(m.group(1)), (m.group(2) or "")
        scale = {"": 1, "k": 1000, "ki": 1024, "m": 1_000_000, "mi": 1 << 20}[suffix.lower()]
        depth = int(number * scale)
        if depth <= 0:
            raise ValueError(f"{word!r} is not a positive number of tokens")
        depths.append(depth)
    if not depths:
        raise ValueError("the sweep names no depth (use a list such as 8k,64k,185k)")
    return depths


class SweepFit(BaseModel, defer_build=True):
    """How decode time grows with depth between the shallowest and deepest probes."""

    shallow_depth: int
    deep_depth: int
    seconds_per_token_per_1k_depth: float
    """Extra seconds per decoded token for every 1,000 more tokens of context."""
    attention_kv_bandwidth_gbs: float | None = None
    """KV bytes of the extra depth over the extra time: the bandwidth attention itself achieves."""
    attention_pct: float | None = None
    verdict: ProbeVerdict = ProbeVerdict.UNKNOWN
    diagnosis: str


def sweep_fit(results: Sequence[ProbeResult], target: ProbeTarget) -> SweepFit | None:
    """Separate attention from the fixed per-step cost: the time added by depth, per byte of KV."""
    ok = [r for r in results if r.status is ProbeStatus.OK and r.decode_tok_s]
    if len(ok) < 2:
        return None
    shallow = min(ok, key=lambda r: r.depth)
    deep = max(ok, key=lambda r: r.depth)
    span = deep.depth - shallow.depth
    if span < MIN_SWEEP_SPAN_TOKENS:
        return None
    assert shallow.decode_tok_s and deep.decode_tok_s
    extra = 1.0 / deep.decode_tok_s - 1.0 / shallow.decode_tok_s
    per_1k = extra / span * 1000
    where = f"from {fmt_depth(shallow.depth)} to {fmt_depth(deep.depth)}"
    if extra <= 0:
        return SweepFit(
            shallow_depth=shallow.depth,
            deep_depth=deep.depth,
            seconds_per_token_per_1k_depth=per_1k,
            verdict=ProbeVerdict.ATTENTION_OK,
            diagnosis=f"{where} decode does not slow down with depth: attention is not the limit",
        )
    cell = target.kv_bytes_per_token_per_gpu
    bandwidth = span * cell / extra / GB if cell else None
    pct = 100.0 * bandwidth / target.peak_bandwidth_gbs if bandwidth and target.peak_bandwidth_gbs else None
    cost = f"{where} every 1k tokens of context adds {per_1k * 1000:.2f} ms to each decoded token"
    if bandwidth is None:
        line, verdict = cost, ProbeVerdict.UNKNOWN
    elif pct is None:
        line, verdict = f"{cost}: attention reads KV at {bandwidth:.1f} GB/s per GPU", ProbeVerdict.UNKNOWN
    elif pct / 100.0 < ATTENTION_BOUND_FRACTION:
        line = (
            f"{cost}: attention reads KV at {bandwidth:.1f} GB/s per GPU, {fmt_pct(pct)} of the card's "
            f"{target.peak_bandwidth_gbs:,.0f} GB/s — attention is the bottleneck "
            "(check --attention-backend and --page-size)"
        )
        verdict = ProbeVerdict.ATTENTION_BOUND
    else:
        line = (
            f"{cost}: attention reads KV at {bandwidth:.1f} GB/s per GPU, {fmt_pct(pct)} of the card's "
            f"{target.peak_bandwidth_gbs:,.0f} GB/s"
        )
        verdict = ProbeVerdict.ATTENTION_OK
    return SweepFit(
        shallow_depth=shallow.depth,
        deep_depth=deep.depth,
        seconds_per_token_per_1k_depth=per_1k,
        attention_kv_bandwidth_gbs=bandwidth,
        attention_pct=pct,
        verdict=verdict,
        diagnosis=line,
    )


class ProbeReport(BaseModel, defer_build=True):
    """A whole probe run (one depth or a sweep): the `probe --json` object."""

    host: str
    profile: str | None = None
    run_id: str
    started_at: datetime
    target: ProbeTarget
    limits: ServerLimits
    requested_tokens: int
    results: list[ProbeResult]
    fit: SweepFit | None = None

    @property
    def ok(self) -> bool:
        return all(r.status is ProbeStatus.OK for r in self.results)

    def summary(self) -> str:
        """One sentence for the operator."""
        bad = [r for r in self.results if r.status is not ProbeStatus.OK]
        if bad:
            first = bad[0]
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            return f"the probe at {fmt_depth(first.depth)} depth {first.status.value}: {first.error}{more}."
        deepest = max(self.results, key=lambda r: r.depth)
        return f"{deepest.diagnosis}."


# ------------------------------------------------------------------------------------------------
# progress (what a screen shows while a probe runs)
# ------------------------------------------------------------------------------------------------


class ProbePhase(StrEnum):
    CHECKING = "checking"
    PREFILL = "prefill"
    DECODING = "decoding"
    DONE = "done"
    REFUSED = "refused"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ProbeProgress(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True)

    phase: ProbePhase
    depth: int = 0
    index: int = 0
    """Position of this depth in the sweep (0-based)."""
    total: int = 1
    tokens: int = 0
    requested_tokens: int = 0
    elapsed_s: float = 0.0
    ttft_s: float | None = None
    live_tok_s: float | None = None
    detail: str | None = None
    result: ProbeResult | None = None
    """Set when this depth has finished (done, refused, failed or cancelled)."""


__all__ = [
    "GpuBandwidth",
    "ProbeMeasurement",
    "ProbePhase",
    "ProbeProgress",
    "ProbeReport",
    "ProbeResult",
    "ProbeStatus",
    "ProbeTarget",
    "ProbeVerdict",
    "ServerLimits",
    "SweepFit",
    "card_peak",
    "diagnose",
    "failed_result",
    "fmt_depth",
    "generate_payload",
    "gpu_bandwidth",
    "inter_token_latencies",
    "kv_bytes_per_token",
    "live_tok_s",
    "parse_depths",
    "percentile",
    "random_prompt",
    "refusal",
    "refused_result",
    "summarize",
    "sweep_fit",
]
