"""The sane range of every number the parser reads from an SGLang message, and what a line outside it
becomes: an `error` event (category `out_of_range`) that keeps the line, never the event it claimed to
be. A pool of -5 tokens is not a small pool, it is a journal that cannot be believed: `verify` must say
so instead of "1,005 tokens short".

The same bounds are the events' validators (`console.core.events`, `Annotated` fields), so an event
read back from JSON (a recording, `parse --json` piped on) is held to them too; tests/test_parser_ranges.py
checks the two agree field by field.

The ranges are generous on purpose: they refuse what no host can print (a negative pool, a GPU with
more than 1 TiB, a negative token usage), not what is merely unusual. A value in range that is wrong
stays the planner's and the verdict's to judge.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "MAX_COUNT",
    "MAX_GIB",
    "MAX_SECONDS",
    "MAX_THROUGHPUT",
    "MAX_TOKENS",
    "MAX_USAGE",
    "MIN_MEM_USAGE_GIB",
    "RANGES",
    "checked",
    "out_of_range",
]

MAX_TOKENS = 2**31 - 1
"""A pool, a context, a cap (`console.core.capacity.MAX_TOKENS`, which the parser does not import: it
would pull the capacity model's pydantic models into every `parse`). SGLang indexes tokens with int32."""
MAX_COUNT = MAX_TOKENS
"""Requests running or queued, sequences and tokens of a batch: never more than the pool's tokens."""
MAX_GIB = 1024.0
"""One GPU's memory in GiB (`console.core.capacity.MAX_GPU_MEM_GIB`; the largest cards hold 288 GB)."""
MIN_MEM_USAGE_GIB = -1.0
"""A step's `mem usage` is free memory before minus after: another process freeing memory meanwhile can
make it a hair below zero (`-0.01 GB`); a whole GiB below is no measurement."""
MAX_SECONDS = 1e6
"""A step's `elapsed` (11.6 days: a 548 GB model from a cold network disk takes minutes, not weeks)."""
MAX_THROUGHPUT = 1e9
"""Tokens per second of one server."""
MAX_USAGE = 1000.0
"""`token usage` is used over total tokens, 0 to 1 on a plain pool; what a hybrid model's accounting can
print past 1 is not known here, so the bound is where no reading is a measurement any more."""

Range = tuple[float, float, str]
"""Low and high bounds (both included) and the unit the sentence names."""

_GIB: Range = (0.0, MAX_GIB, "GiB")
_USAGE_GIB: Range = (MIN_MEM_USAGE_GIB, MAX_GIB, "GiB")
_SECS: Range = (0.0, MAX_SECONDS, "s")
_POOL: Range = (1, MAX_TOKENS, "tokens")
_COUNT: Range = (0, MAX_COUNT, "")
_RATE: Range = (0.0, MAX_THROUGHPUT, "tokens/s")
_FRACTION: Range = (0.0, MAX_USAGE, "")

RANGES: dict[str, dict[str, Range]] = {
    "dist_init": {"mem_usage_gb": _USAGE_GIB, "elapsed_s": _SECS},
    "weights_begin": {"avail_mem_gb": _GIB},
    "weights_loaded": {"avail_mem_gb": _GIB, "mem_usage_gb": _USAGE_GIB, "elapsed_s": _SECS},
    "kv_pool_allocated": {"tokens": _POOL, "k_size_gb": _GIB, "v_size_gb": _GIB, "kv_size_gb": _GIB},
    "memory_pool_end": {"avail_mem_gb": _GIB},
    "mamba_pool_allocated": {
        "slots": (1, MAX_COUNT, "slots"),
        "conv_state_gb": _GIB,
        "ssm_state_gb": _GIB,
    },
    "swa_pool_split": {"full_tokens": _COUNT, "swa_tokens": _COUNT},
    "swa_pool_allocated": {"mem_usage_gb": _GIB, "swa_tokens": _COUNT, "full_tokens": _COUNT},
    "dsv4_memory": {
        # Bytes one full token costs across every DeepSeek-V4 pool; no cell reaches a gigabyte.
        "bytes_per_full_token": (0.0, 1e9, "B/token"),
        "available_gb": _GIB,
        "full_tokens": _COUNT,
        "c128_state_fixed_gb": _GIB,
        "swa_fixed_gb": _GIB,
    },
    "dsv4_pool": {
        "max_num_reqs": _COUNT,
        "full_tokens": _COUNT,
        "swa_tokens": _COUNT,
        "c4_tokens": _COUNT,
        "c128_tokens": _COUNT,
        "c4_state_tokens": _COUNT,
        "c128_state_tokens": _COUNT,
    },
    "cuda_graph": {"avail_mem_gb": _GIB, "mem_usage_gb": _USAGE_GIB, "elapsed_s": _SECS},
    "pool_summary": {
        "max_total_num_tokens": _POOL,
        # -1 is SGLang's "chunked prefill disabled".
        "chunked_prefill_size": (-1, MAX_TOKENS, "tokens"),
        "max_prefill_tokens": _POOL,
        "max_running_requests": (1, MAX_COUNT, ""),
        "context_len": _POOL,
        "available_gpu_mem_gb": _GIB,
    },
    # The operator's --max-total-tokens (any int64 SGLang accepts) against what profiling left, which is
    # negative when the weights alone overflow the budget: the line that explains that, kept as printed.
    "pool_clamped": {"requested": (1, 2**63 - 1, "tokens"), "profiled": (-(2**63), 2**63 - 1, "tokens")},
    "prefill_batch": {
        # Before `token_usage`, which a hybrid line fills from it: the error names the printed field.
        "full_token_usage": _FRACTION,
        "new_seq": _COUNT,
        "new_token": _COUNT,
        "cached_token": _COUNT,
        "token_usage": _FRACTION,
        "running_req": _COUNT,
        "queue_req": _COUNT,
        "input_throughput": _RATE,
        "swa_token_usage": _FRACTION,
        "mamba_usage": _FRACTION,
    },
    "decode_batch": {
        "full_token_usage": _FRACTION,
        "running_req": _COUNT,
        "num_tokens": _COUNT,
        "token_usage": _FRACTION,
        "gen_throughput": _RATE,
        "queue_req": _COUNT,
        "accept_len": (0.0, 1024.0, "tokens"),
        "accept_rate": (0.0, 1.0, ""),
        "swa_token_usage": _FRACTION,
        "swa_tokens": _COUNT,
        "mamba_usage": _FRACTION,
        "mamba_num": _COUNT,
    },
    "http_access": {"status": (100, 599, "")},
}
"""kind → field → its range. A field not named here holds no number, or none the parser reads."""

_KIND_WORDS = {
    "pool_summary": "a pool summary",
    "kv_pool_allocated": "a KV pool",
    "mamba_pool_allocated": "a mamba state pool",
    "swa_pool_split": "a sliding-window pool split",
    "swa_pool_allocated": "a sliding-window pool",
    "dsv4_memory": "a DeepSeek-V4 pool budget",
    "dsv4_pool": "a DeepSeek-V4 pool",
    "pool_clamped": "a pool cap",
}


def _number(x: float) -> str:
    if isinstance(x, int):
        return f"{x:,}" if abs(x) < 10**15 else f"{x:.3g}"
    return f"{x:g}"


def out_of_range(fields: dict[str, Any]) -> str | None:
    """Why a number in these event fields is out of its sane range, in words; None when all are in."""
    spec = RANGES.get(fields["kind"])
    if spec is None:
        return None
    for name, (lo, hi, unit) in spec.items():
        value = fields.get(name)
        # Not `lo <= value <= hi` alone: a NaN compares false both ways (the handlers never make one).
        if value is not None and not (lo <= value <= hi):
            unit_text = f" {unit}" if unit else ""
            return f"{name}={_number(value)} is outside its sane range ({_number(lo)} to {_number(hi)}{unit_text})"
    return None


def checked(fields: dict[str, Any] | None, meta: dict[str, Any]) -> dict[str, Any] | None:
    """A handler's fields, or in their place an `out_of_range` error that keeps the line (`meta["raw"]`)
    when one of their numbers cannot be true."""
    if fields is None:
        return None
    why = out_of_range(fields)
    if why is None:
        return fields
    what = _KIND_WORDS.get(fields["kind"], f"a {fields['kind'].replace('_', ' ')} line")
    return {
        "kind": "error",
        "category": "out_of_range",
        "message": f"{why}: the line is not read as {what}",
        "lines": [meta["raw"]],
    }
