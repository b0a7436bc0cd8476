"""SGLang's messages (the text after every prefix) → event fields: one table, `HANDLERS`.

Each handler takes the message and the line's metadata and returns the event's fields, `kind`
included, or None when the line only looked like one (it then goes on as a `log`). The table is keyed
by the message's first six characters (`PREFIX_CHARS`): one slice and one dict lookup per line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from console.core.parsing.server_args import parse_server_args
from console.core.parsing.values import (
    count,
    gb,
    named_values,
    seconds,
    split_fields,
    to_bool,
    to_float,
    to_int,
)
from console.core.ranges import checked

Fields = dict[str, Any]
Handler = Callable[[str, Fields], Fields | None]

PREFIX_CHARS = 6

# The current (v0.5.9+) stats lines in one regex each; other versions take the general loops below.
# Each group admits only numbers inside their sane range (core/ranges: at most 9 digits of a count,
# a usage under 1,000, a rate under 1e8), so the bulk of a journal needs no range check; a line with a
# number past them goes the general way, which checks.
DECODE = re.compile(
    r"Decode batch, #running-req: (\d{1,9}), #token: (\d{1,9}), token usage: (\d{1,3}\.\d+), "
    r"(?:accept len: (\d{1,3}\.\d+), accept rate: (0\.\d+|1\.0+), )?cuda graph: (True|False), "
    r"gen throughput \(token/s\): (\d{1,8}\.\d+), #queue-req: (\d{1,9})(?!\d)",
    re.ASCII,
)
PREFILL = re.compile(
    r"Prefill batch, #new-seq: (\d{1,9}), #new-token: (\d{1,9}), #cached-token: (\d{1,9}), "
    r"token usage: (\d{1,3}\.\d+), #running-req: (\d{1,9}), #queue-req: (\d{1,9}), "
    r"(?:#pending-token: \d+, )?cuda graph: (True|False), input throughput \(token/s\): (\d{1,8}\.\d+)",
    re.ASCII,
)
# uvicorn's access line: `INFO:     127.0.0.1:40052 - "POST /v1/chat/completions HTTP/1.1" 200 OK`
ACCESS = re.compile(r'INFO: +(\S+) - "([A-Z]+) (\S+)(?: [^"]*)?" (\d{3})', re.ASCII)


def _queue(text: str) -> int | None:
    return to_int(text.rstrip(", "))


# The general stats lines, any version: `Decode batch. #a: 1, b: 2` (≤0.4), `Decode batch, …` (0.5),
# `Decode batch [12], …`, PD's extra fields. Key as printed → (field, converter); hybrid SWA models
# print `#full token` / `full token usage` pairs instead, read as the main figures when those are absent.
_DECODE_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "#running-req": ("running_req", to_int),
    "#token": ("num_tokens", to_int),
    "token usage": ("token_usage", to_float),
    "gen throughput (token/s)": ("gen_throughput", to_float),
    "#queue-req": ("queue_req", _queue),
    "cuda graph": ("cuda_graph", to_bool),
    "accept len": ("accept_len", to_float),
    "accept rate": ("accept_rate", to_float),
    "#full token": ("full_tokens", to_int),
    "full token usage": ("full_usage", to_float),
    "#swa token": ("swa_tokens", to_int),
    "swa token usage": ("swa_token_usage", to_float),
    "mamba num": ("mamba_num", to_int),
    "mamba usage": ("mamba_usage", to_float),
}
_PREFILL_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "#new-seq": ("new_seq", to_int),
    "#new-token": ("new_token", to_int),
    "#cached-token": ("cached_token", to_int),
    "token usage": ("token_usage", to_float),
    "#running-req": ("running_req", to_int),
    "#queue-req": ("queue_req", _queue),
    "input throughput (token/s)": ("input_throughput", to_float),
    "cuda graph": ("cuda_graph", to_bool),
    "full token usage": ("full_usage", to_float),
    "swa token usage": ("swa_token_usage", to_float),
    "mamba usage": ("mamba_usage", to_float),
}


def _stats_fields(
    msg: str, after: int, kind: str, keys: dict[str, tuple[str, Callable[[str], Any]]]
) -> Fields | None:
    start = msg.find("#", after)
    if start < 0:
        return None
    fields: Fields = {"kind": kind}
    for part in msg[start:].split(", "):
        key, found, value = part.partition(": ")
        if found:
            spec = keys.get(key)
            if spec is not None:
                fields[spec[0]] = spec[1](value)
    full_tokens = fields.pop("full_tokens", None)
    full_usage = fields.pop("full_usage", None)
    if fields.get("num_tokens") is None and kind == "decode_batch":
        fields["num_tokens"] = full_tokens
    if fields.get("token_usage") is None:
        fields["token_usage"] = full_usage
    if full_usage is not None:
        # Hybrid models print the full-attention pool's usage beside the SWA or mamba pool's own.
        fields["full_token_usage"] = full_usage
    return fields


def decode(msg: str, meta: Fields) -> Fields | None:
    m = DECODE.match(msg)
    if m is not None:
        running, tokens, usage, accept_len, accept_rate, graph, gen, queue = m.groups()
        return {
            "kind": "decode_batch",
            "running_req": count(running),
            "num_tokens": int(tokens),
            "token_usage": float(usage),
            "gen_throughput": float(gen),
            "queue_req": count(queue),
            "accept_len": float(accept_len) if accept_len else None,
            "accept_rate": float(accept_rate) if accept_rate else None,
            "cuda_graph": graph == "True",
        }
    if not msg.startswith("Decode batch"):
        return None
    return checked(_stats_fields(msg, 12, "decode_batch", _DECODE_KEYS), meta)


def prefill(msg: str, meta: Fields) -> Fields | None:
    m = PREFILL.match(msg)
    if m is not None:
        new_seq, new_token, cached, usage, running, queue, graph, throughput = m.groups()
        return {
            "kind": "prefill_batch",
            "new_seq": count(new_seq),
            "new_token": int(new_token),
            "cached_token": int(cached),
            "token_usage": float(usage),
            "running_req": count(running),
            "queue_req": count(queue),
            "input_throughput": float(throughput),
            "cuda_graph": graph == "True",
        }
    if not msg.startswith("Prefill batch"):
        return None
    return checked(_stats_fields(msg, 13, "prefill_batch", _PREFILL_KEYS), meta)


def access(msg: str, meta: Fields) -> Fields | None:
    m = ACCESS.match(msg)
    if m is None:
        return None
    client, method, path, status = m.groups()
    fields = {
        "kind": "http_access",
        "method": method,
        "path": path,
        "status": count(status),
        "client": client,
    }
    return checked(fields, meta)


def load_weights(msg: str, meta: Fields) -> Fields | None:
    low = msg[:17].lower()
    if low.startswith("load weight begin"):
        return checked(
            {"kind": "weights_begin", "avail_mem_gb": gb(named_values(msg).get("avail mem", ""))}, meta
        )
    if not low.startswith("load weight end"):
        return None
    v = named_values(msg)
    quant = None
    q = msg.find("quant=")
    if q >= 0:
        # quant_str = `quant=<method>[, bits=…][, quant_algo=…][, fmt=…][, requantization_method=…]`
        tail = msg[q + 6 :]
        a = tail.find(", avail mem=")
        quant = (tail[:a] if a >= 0 else tail).strip() or None
    fields = {
        "kind": "weights_loaded",
        "avail_mem_gb": gb(v.get("avail mem", "")),
        "mem_usage_gb": gb(v.get("mem usage", "").rstrip(".")),
        "elapsed_s": seconds(v.get("elapsed", "")),
        "model_type": v.get("type"),
        "dtype": v.get("dtype"),
        "quant": quant,
    }
    return checked(fields, meta)


def kv_cache(msg: str, meta: Fields) -> Fields | None:
    """`[Label ]KV Cache is allocated. [dtype: X, ]#tokens: N, K size: a GB, V size: b GB` or `KV size: c GB`."""
    at = msg.find("KV Cache ")
    if at < 0 or not ("is allocated" in msg or "VA upper bound" in msg):
        return None
    dot = msg.find(". ", at)
    if dot < 0:
        return None
    v = split_fields(msg[dot + 2 :], ": ")
    fields = {
        "kind": "kv_pool_allocated",
        "tokens": to_int(v.get("#tokens", "")),
        "k_size_gb": gb(v.get("K size", "")),
        "v_size_gb": gb(v.get("V size", "")),
        "kv_size_gb": gb(v.get("KV size", "")),
        "dtype": v.get("dtype"),
        "label": msg[:at].strip() or None,
    }
    return checked(fields, meta)


def post_capture(msg: str, meta: Fields) -> Fields | None:
    """0.5.23's opt-in `Post-capture KV sizing: [draft ]KV cache allocated. dtype: …, #tokens: …, KV size: …`."""
    if not msg.startswith("Post-capture KV sizing: ") or "allocated. " not in msg:
        return None
    v = split_fields(msg.split("allocated. ", 1)[1], ": ")
    fields = {
        "kind": "kv_pool_allocated",
        "tokens": to_int(v.get("#tokens", "")),
        "kv_size_gb": gb(v.get("KV size", "")),
        "dtype": v.get("dtype"),
        "label": "draft" if "draft KV cache" in msg else None,
    }
    return checked(fields, meta)


# The pools of hybrid models (issue 32). Each number is read by its name wherever it stands in the line:
# versions add, drop and reorder fields (0.5.23's DSv4 line has eleven), and a name no version printed
# is never guessed at. `-?` lets a negative number reach the range check instead of passing unread.
_NUMBER = r"=?:? ?(-?[0-9][0-9.]*)"
_MAMBA = re.compile(
    r"(max_mamba_cache_size|(?<!_)conv_state size|(?<!_)ssm_state size)" + _NUMBER,
    re.ASCII,
)


def mamba(msg: str, meta: Fields) -> Fields | None:
    """`Mamba Cache is allocated. max_mamba_cache_size: N, conv_state size: X GB, ssm_state size: Y GB`."""
    if not msg.startswith("Mamba Cache is allocated"):
        return None
    v = dict(_MAMBA.findall(msg))
    fields = {
        "kind": "mamba_pool_allocated",
        "slots": to_int(v.get("max_mamba_cache_size", "")),
        "conv_state_gb": to_float(v.get("conv_state size", "").rstrip(".")),
        "ssm_state_gb": to_float(v.get("ssm_state size", "").rstrip(".")),
    }
    return checked(fields, meta)


_SWA_SPLIT = re.compile(r"\b(full_layer_tokens|swa_layer_tokens)=(-?\d+)", re.ASCII)


def swa_split(msg: str, meta: Fields) -> Fields | None:
    """`Use sliding window memory pool. full_layer_tokens=N, swa_layer_tokens=M` (≤0.5.5: `Use Sliding
    window …`; an all-SWA model prints `(all SWA). swa_layer_tokens=M` alone)."""
    if not msg[:30].lower().startswith("use sliding window memory pool"):
        return None
    v = dict(_SWA_SPLIT.findall(msg))
    if not v:
        return None
    fields = {
        "kind": "swa_pool_split",
        "full_tokens": to_int(v.get("full_layer_tokens", "")),
        "swa_tokens": to_int(v.get("swa_layer_tokens", "")),
    }
    return checked(fields, meta)


_SWA_POOL = re.compile(r"(mem usage|VA upper bound|swa size|full size): (-?[0-9][0-9.]*)", re.ASCII)


def swa_pool(msg: str, meta: Fields) -> Fields | None:
    """`SWAKVPool mem usage: X GB, swa size: M, full size: N` (0.5.23 post-capture: `VA upper bound: X GB`)."""
    if not msg.startswith("SWAKVPool "):
        return None
    v: dict[str, str] = dict(_SWA_POOL.findall(msg))
    if "swa size" not in v and "full size" not in v:
        return None
    fields = {
        "kind": "swa_pool_allocated",
        "mem_usage_gb": to_float(v.get("mem usage", v.get("VA upper bound", ""))),
        "swa_tokens": to_int(v.get("swa size", "")),
        "full_tokens": to_int(v.get("full size", "")),
    }
    return checked(fields, meta)


_DSV4_MEMORY = re.compile(
    r"\b(bytes_per_full_token|available_bytes|full_token|c128_state_fixed|swa_fixed)=(-?[0-9][0-9.]*)",
    re.ASCII,
)
_DSV4_POOL = re.compile(
    r"\b(max_num_reqs|full|swa|c4|c128|c4_state|c128_state|swa_size|c4_size|c128_size|c4_state_pool_size"
    r"|c128_state_pool_size)=(-?\d+)",
    re.ASCII,
)
_DSV4_POOL_NAMES = {
    "max_num_reqs": "max_num_reqs",
    "full": "full_tokens",
    "swa": "swa_tokens",
    "swa_size": "swa_tokens",
    "c4": "c4_tokens",
    "c4_size": "c4_tokens",
    "c128": "c128_tokens",
    "c128_size": "c128_tokens",
    "c4_state": "c4_state_tokens",
    "c4_state_pool_size": "c4_state_tokens",
    "c128_state": "c128_state_tokens",
    "c128_state_pool_size": "c128_state_tokens",
}


def dsv4(msg: str, meta: Fields) -> Fields | None:
    """DeepSeek-V4: `DSv4 memory calculation: bytes_per_full_token=B, available_bytes=X GB, full_token=N`
    (`DSV4` from v0.5.12, which also prints `DSV4 pool sizes: full=…, swa=…, c4=…, …`)."""
    low = msg[:24].lower()
    if low.startswith("dsv4 memory calculation"):
        v: dict[str, str] = dict(_DSV4_MEMORY.findall(msg))
        fields: Fields = {
            "kind": "dsv4_memory",
            "bytes_per_full_token": to_float(v.get("bytes_per_full_token", "")),
            "available_gb": to_float(v.get("available_bytes", "")),
            "full_tokens": to_int(v.get("full_token", "")),
            "c128_state_fixed_gb": to_float(v.get("c128_state_fixed", "")),
            "swa_fixed_gb": to_float(v.get("swa_fixed", "")),
        }
        return checked(fields, meta)
    if low.startswith("dsv4 pool sizes") or msg.startswith("Initialize DeepSeekV4TokenToKVPool"):
        fields = {"kind": "dsv4_pool"}
        for name, value in _DSV4_POOL.findall(msg):
            fields[_DSV4_POOL_NAMES[name]] = to_int(value)
        return checked(fields, meta) if len(fields) > 1 else None
    return None


def kv_dtype(msg: str, meta: Fields) -> Fields | None:
    """`Using KV cache dtype: torch.float8_e4m3fnuz` (≤ v0.5.12; MI300X's fp8 is the `fnuz` variant)."""
    if not msg.startswith("Using KV cache dtype: "):
        return None
    return {"kind": "kv_cache_dtype", "dtype": msg[22:].strip()}


def memory(msg: str, meta: Fields) -> Fields | None:
    if msg.startswith("Memory pool end"):
        return checked(
            {"kind": "memory_pool_end", "avail_mem_gb": gb(named_values(msg).get("avail mem", ""))}, meta
        )
    if msg.startswith("Memory baseline taken"):
        # 0.5.23 splits the old `Init torch distributed ends. mem usage=…` across two lines.
        fields = {
            "kind": "dist_init",
            "phase": "end",
            "mem_usage_gb": gb(named_values(msg).get("mem usage", "")),
        }
        return checked(fields, meta)
    return None


def dist_init(msg: str, meta: Fields) -> Fields | None:
    if msg.startswith(("Init torch distributed begin", "Init parallel begin")):
        return {"kind": "dist_init", "phase": "begin"}
    if msg.startswith(("Init torch distributed end", "Init parallel end")):
        v = named_values(msg)
        fields = {
            "kind": "dist_init",
            "phase": "end",
            "mem_usage_gb": gb(v.get("mem usage", "")),
            "elapsed_s": seconds(v.get("elapsed", "")),
        }
        return checked(fields, meta)
    return None


_GRAPH_WORDS = ("cuda graph", "CUDA graph", "cpu graph", "npu graph", "musa graph")


def capture(msg: str, meta: Fields) -> Fields | None:
    """`Capture [piecewise |draft ]cuda graph begin. …` / `… end. Time elapsed: …` / `… failed: …`."""
    if not msg.startswith("Capture "):
        return None
    if " failed" in msg[:40]:
        return {"kind": "error", "category": "cuda_graph_failed", "message": msg, "lines": [meta["raw"]]}
    phase = "begin"
    end = msg.find(" begin.")
    if end < 0:
        phase = "end"
        end = msg.find(" end.")
        if end < 0:
            return None
    what = msg[8:end]
    for word in _GRAPH_WORDS:
        if what.endswith(word):
            what = what[: -len(word)].strip()
            break
    else:
        return None
    what = what.removeprefix("target ")
    v = named_values(msg)
    fields = {
        "kind": "cuda_graph",
        "phase": phase,
        "avail_mem_gb": gb(v.get("avail mem", "").rstrip(".")),
        "mem_usage_gb": gb(v.get("mem usage", "").rstrip(".")),
        "elapsed_s": seconds(v.get("elapsed", "").rstrip(".")),
        "graph": what or None,
    }
    return checked(fields, meta)


_SUMMARY_FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "max_total_num_tokens": ("max_total_num_tokens", to_int),
    "max_total_num_token": ("max_total_num_tokens", to_int),  # v0.1
    "Max_total_num_token": ("max_total_num_tokens", to_int),  # v0.1 variant
    "chunked_prefill_size": ("chunked_prefill_size", to_int),
    "max_prefill_tokens": ("max_prefill_tokens", to_int),
    "max_prefill_num_token": ("max_prefill_tokens", to_int),  # v0.1
    "max_running_requests": ("max_running_requests", to_int),
    "context_len": ("context_len", to_int),
    "available_gpu_mem": ("available_gpu_mem_gb", gb),
}
# The profiled value is negative when the weights and activations already exceed the memory budget
# (a misconfigured ROCm run prints `-561981`): the line the operator most needs explained.
_CLAMPED = re.compile(r"max_total_tokens=(-?\d+) is larger than the profiled value (-?\d+)", re.ASCII)


def max_total(msg: str, meta: Fields) -> Fields | None:
    """`max_total_num_tokens=…, chunked_prefill_size=…, …` or `max_total_tokens=N is larger than …`."""
    m = _CLAMPED.match(msg)
    if m is not None:
        clamped = {"kind": "pool_clamped", "requested": int(m.group(1)), "profiled": int(m.group(2))}
        return checked(clamped, meta)
    fields: Fields = {}
    for key, value in split_fields(msg, "=").items():
        spec = _SUMMARY_FIELDS.get(key)
        if spec is not None:
            fields[spec[0]] = spec[1](value.rstrip(", "))
    if fields.get("max_total_num_tokens") is None:
        return None
    return checked({"kind": "pool_summary", **fields}, meta)


def ready(msg: str, meta: Fields) -> Fields | None:
    if msg.startswith("The server is fired up and ready to roll"):
        return {"kind": "server_ready"}
    return None


def server_args(msg: str, meta: Fields) -> Fields | None:
    if not msg.startswith("server_args="):
        return None
    return {"kind": "server_args", "args": parse_server_args(msg[12:])}


def sigquit(msg: str, meta: Fields) -> Fields | None:
    if msg.startswith(("Received sigquit", "SIGQUIT received")):
        return {"kind": "error", "category": "sigquit", "message": msg, "lines": [meta["raw"]]}
    return None


def not_enough_memory(msg: str, meta: Fields) -> Fields | None:
    if msg.startswith("Not enough memory"):
        return {"kind": "error", "category": "not_enough_memory", "message": msg, "lines": [meta["raw"]]}
    return None


HANDLERS: dict[str, Handler] = {
    "Decode": decode,
    "Prefil": prefill,
    "INFO: ": access,
    "Load w": load_weights,
    "load w": load_weights,
    "KV Cac": kv_cache,
    "Full K": kv_cache,
    "SWA KV": kv_cache,
    "Memory": memory,
    "Init t": dist_init,
    "Init p": dist_init,
    "Captur": capture,
    "max_to": max_total,
    "Max_to": max_total,
    "The se": ready,
    "server": server_args,
    "Receiv": sigquit,
    "SIGQUI": sigquit,
    "Not en": not_enough_memory,
    "Post-c": post_capture,
    "Mamba ": mamba,
    "Use sl": swa_split,
    "Use Sl": swa_split,
    "SWAKVP": swa_pool,
    "DSv4 m": dsv4,
    "DSV4 m": dsv4,
    "DSV4 p": dsv4,
    "Initia": dsv4,
    "Using ": kv_dtype,
}

# Every handler that reads a number may make an `error` instead (core/ranges: out of its sane range).
HANDLER_KINDS: dict[Handler, frozenset[str]] = {
    decode: frozenset({"decode_batch", "error"}),
    prefill: frozenset({"prefill_batch", "error"}),
    access: frozenset({"http_access", "error"}),
    load_weights: frozenset({"weights_begin", "weights_loaded", "error"}),
    kv_cache: frozenset({"kv_pool_allocated", "error"}),
    post_capture: frozenset({"kv_pool_allocated", "error"}),
    memory: frozenset({"memory_pool_end", "dist_init", "error"}),
    dist_init: frozenset({"dist_init", "error"}),
    capture: frozenset({"cuda_graph", "error"}),
    max_total: frozenset({"pool_clamped", "pool_summary", "error"}),
    ready: frozenset({"server_ready"}),
    server_args: frozenset({"server_args"}),
    sigquit: frozenset({"error"}),
    not_enough_memory: frozenset({"error"}),
    mamba: frozenset({"mamba_pool_allocated", "error"}),
    swa_split: frozenset({"swa_pool_split", "error"}),
    swa_pool: frozenset({"swa_pool_allocated", "error"}),
    dsv4: frozenset({"dsv4_memory", "dsv4_pool", "error"}),
    kv_dtype: frozenset({"kv_cache_dtype"}),
}
"""The kinds each handler can make; a message it does not claim becomes a `log` or an `error`."""
