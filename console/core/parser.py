"""Journal lines in, typed events out.

One streaming parser reads what an SGLang host prints, however it reached us:

- `journalctl -o json` objects (as dicts or as their JSON text), journald `short`, `short-iso` and
  `short-precise` text, `docker logs [-t]` and `docker compose logs` prefixes, a Python logger that wraps
  SGLang's lines (`2025-03-07 23:50:27,531 - __main__ - INFO - [...]`), and bare SGLang lines;
- SGLang's own prefix in every version: `[date time TAGS]`, `[date time.ms TAGS]`, the old `[HH:MM:SS TPn]`,
  the v0.1 `Rank N:` form, and the rank tags `DPn PPn ATTN_CPn MOE_DPn TPn EPn` in any order.

Speed matters (a restart of an 8-rank server prints tens of thousands of lines and the console replays
whole journals). `JournalParser.feed_many` (what `parse_lines` and `k26-console parse` use) builds the
bulk of a journal — journald `short` lines from the server's processes: stats, access lines, noise —
with one regex per line and templates cached per process and rank tags (see `_HOT`); every
other item takes the careful path, `feed`'s, which cuts a journald line with `str.find`, takes its parts
from small caches and dispatches the message on its first six characters through a dict. Events are
built without re-validation — the parser has already typed every value (see `_build`). Figures and
what did and did not help: docs/performance.md.

The parser never raises on input: anything it does not know, or cannot make sense of, becomes a `log`
event that keeps the line.

Time stamps (`ts`): journal JSON gives UTC with an offset; SGLang's bracket gives host-local time
without an offset; journald `short` text has no year, so the year is taken from SGLang's bracket on
the same line when there is one (adjusted across New Year) and is otherwise left out in ISO 8601's
yearless month-day form `--MM-DDThh:mm:ss` — a guessed year would be silently wrong in old journals.
"""

from __future__ import annotations

import ast
import json
import re
from collections import deque
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from itertools import chain, repeat
from typing import Any

from pydantic import BaseModel

from console.core.events import (
    CudaGraph,
    DecodeBatch,
    DistInit,
    Error,
    Event,
    HttpAccess,
    KvPoolAllocated,
    Log,
    MemoryPoolEnd,
    PoolClamped,
    PoolSummary,
    PrefillBatch,
    ServerArgs,
    ServerReady,
    Unit,
    WeightsBegin,
    WeightsLoaded,
)

__all__ = [
    "MAX_TRACEBACK_LINES",
    "STALE_TRACEBACK_LINES",
    "JournalParser",
    "parse_lines",
    "parse_text",
]

MAX_TRACEBACK_LINES = 400
"""A held traceback is emitted once it reaches this many lines (SGLang's run to ~60; torch.compile's
to a few hundred); what follows becomes `log` events."""

STALE_TRACEBACK_LINES = 200
"""A traceback held for one process is emitted after this many lines from other processes: a crashed
rank prints its traceback and dies, so nothing from it would ever close it."""

MAX_PARSE_CHARS = 1 << 18
"""Longer lines are kept whole as `log` events without being parsed (a ServerArgs dump is ~25 kB)."""

_BRACKET_CACHE_SIZE = 4096
_CACHE_SIZE = 4096

# ---------------------------------------------------------------------------------------------------
# Event construction without re-validation.
#
# `Model(**fields)` validates every field again (~2.6 µs for a decode line) and `model_construct`
# is slower still on these frozen models (~20 µs measured). The parser has already typed each value,
# so it fills the instance the way `model_construct` does — `__dict__` plus pydantic's three slots —
# in ~0.7 µs. `tests/test_parser.py` round-trips every corpus event through JSON validation to keep
# this honest.

_new = object.__new__
_set_attr = object.__setattr__
# The `__dict__` slot's own setter: what `object.__setattr__(obj, "__dict__", d)` ends in, without
# looking the name up first.
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__pydantic_fields_set__.__set__  # type: ignore[attr-defined]
_set_extra = BaseModel.__pydantic_extra__.__set__  # type: ignore[attr-defined]
_set_private = BaseModel.__pydantic_private__.__set__  # type: ignore[attr-defined]

_DEFAULTS: dict[type[BaseModel], dict[str, Any]] = {}
_FIELDS_SET: dict[type[BaseModel], set[str]] = {}


def _register(cls: type[BaseModel]) -> None:
    defaults: dict[str, Any] = {}
    for name, field in cls.model_fields.items():
        # Fields with a factory (`args`, `lines`) are always passed by the parser.
        defaults[name] = None if field.default_factory is not None else field.default
    _DEFAULTS[cls] = defaults
    # pydantic copies this set before changing it (model_copy), so one set per class can be shared.
    _FIELDS_SET[cls] = set(defaults)


for _cls in (
    CudaGraph,
    DecodeBatch,
    DistInit,
    Error,
    HttpAccess,
    KvPoolAllocated,
    Log,
    MemoryPoolEnd,
    PoolClamped,
    PoolSummary,
    PrefillBatch,
    ServerArgs,
    ServerReady,
    Unit,
    WeightsBegin,
    WeightsLoaded,
):
    _register(_cls)


def _build(cls: type[BaseModel], meta: dict[str, Any], fields: dict[str, Any] | None = None) -> Any:
    values = {**_DEFAULTS[cls], **meta, **fields} if fields else {**_DEFAULTS[cls], **meta}
    obj = _new(cls)
    _set_dict(obj, values)
    _set_fields_set(obj, _FIELDS_SET[cls])
    _set_extra(obj, None)
    _set_private(obj, None)
    return obj


def _shared_dict(cls: type[BaseModel], values: dict[str, Any]) -> dict[str, Any]:
    """`values` (in field order) as an instance dict of `cls` that shares its keys with the class.

    CPython keeps such a dict as a "split table": its copies are a third of the size of a plain dict's
    and quicker to make and free. It behaves exactly as a plain dict; on a Python that does not split
    it, it is a plain dict.
    """
    obj = _new(cls)
    for name, value in values.items():
        _set_attr(obj, name, value)
    shared: dict[str, Any] = obj.__dict__
    return shared


# Number fields that take few values, read by a dict lookup rather than `int()`/`float()` (several times
# the cost here): request counts and HTTP status, and token usage as SGLang prints it (two decimals).
# A count outside the table raises KeyError in `_hot_run` and that line goes the careful way; a token
# usage outside it is parsed there.
_SMALL_INTS: dict[str, int] = {str(i): i for i in range(4096)}
_USAGE: dict[str, float] = {f"{i / 100:.2f}": i / 100 for i in range(1000)}


_STR_ONLY = {str}


# ---------------------------------------------------------------------------------------------------
# Small converters: SGLang prints well-formed numbers, but a truncated or mangled line must not raise.


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    # "nan"/"inf" parse as floats but are not numbers SGLang prints; JSON cannot carry them either.
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def _gb(text: str) -> float | None:
    """`4.38 GB` / `4.38GB` / `4.38` → 4.38."""
    return _float(text.removesuffix("GB").removesuffix(" "))


def _seconds(text: str) -> float | None:
    return _float(text.removesuffix("s").strip())


def _bool(text: str) -> bool | None:
    return True if text == "True" else False if text == "False" else None


# ---------------------------------------------------------------------------------------------------
# Outer prefixes: journald text, docker, compose, a wrapping Python logger.

_MONTHS = {
    "Jan": "01",
    "Feb": "02",
    "Mar": "03",
    "Apr": "04",
    "May": "05",
    "Jun": "06",
    "Jul": "07",
    "Aug": "08",
    "Sep": "09",
    "Oct": "10",
    "Nov": "11",
    "Dec": "12",
}
_MONTH_INITIALS = frozenset(m[0] for m in _MONTHS)

# `May 30 22:00:23 host ident[pid]: msg` (short) and `May 30 22:00:23.123456 ...` (short-precise).
_JOURNAL_SHORT = re.compile(
    r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) ([ \d]\d) (\d\d:\d\d:\d\d(?:\.\d{1,9})?) "
    r"(\S+) (\S+?)(?:\[(\d+)\])?: ?",
    re.ASCII,
)
# `2026-05-30T22:00:23+0000 host ident[pid]: msg` (short-iso, short-iso-precise) and docker's
# `2026-05-30T22:00:23.123456789Z msg` (`docker logs -t`); told apart by the `Z` (see `_outer`).
_ISO_STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d{1,9})?(Z|[+-]\d\d:?\d\d)? ", re.ASCII)
_JOURNAL_ISO_REST = re.compile(r"(\S+) (\S+?)(?:\[(\d+)\])?: ", re.ASCII)
# `2025-03-07 23:50:27,531 - __main__ - INFO - msg` (a Python logger wrapping SGLang, case-34) and the
# `2025-05-02 16:14:33,560 - INFO - flashinfer.jit: ...` form without a logger name.
_PYLOG = re.compile(
    r"(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d),(\d{3}) - (?:\S+ - )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) - ",
    re.ASCII,
)
# `sglang-1  | msg` / `sglang_1 | msg` (docker compose v2 / v1).
_COMPOSE = re.compile(r"([A-Za-z0-9][\w.-]*)\s+\|(?: |$)", re.ASCII)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]", re.ASCII)

# SGLang's bracket anywhere in a line, for a tqdm bar written just before it (case-18).
_GLUED = re.compile(r"\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:\.\d+)?(?: [A-Z_]+\d+)*\] ", re.ASCII)
_DATE = re.compile(r"\d{4}-\d\d-\d\d", re.ASCII)
_TIME = re.compile(r"\d\d:\d\d:\d\d(?:\.\d{1,6})?", re.ASCII)
_TAG = re.compile(r"(ATTN_CP|MOE_DP|DP|PP|TP|EP)(\d+)", re.ASCII)
_TAG_FIELD = {
    "DP": "dp_rank",
    "PP": "pp_rank",
    "ATTN_CP": "attn_cp_rank",
    "MOE_DP": "moe_dp_rank",
    "TP": "tp_rank",
    "EP": "ep_rank",
}
# v0.1's `Rank 0: ...`, torch's `[rank6]:`, v0.2/0.3's `[gpu_id=0]` / `[gpu=0]`.
_RANK_COLON = re.compile(r"Rank (\d+): ", re.ASCII)
_TORCH_RANK = re.compile(r"\[rank(\d+)\]:", re.ASCII)
_GPU_TAG = re.compile(r"\[gpu(?:_id)?=(\d+)\] ", re.ASCII)


def _parse_bracket(inner: str) -> tuple[str, str | None, dict[str, int]] | None:
    """`2026-05-30 22:00:23 TP7` → (ts, date, ranks); None when it is not SGLang's prefix."""
    parts = inner.split(" ")
    head = parts[0]
    if len(parts) >= 2 and len(head) == 10 and _DATE.fullmatch(head) and _TIME.fullmatch(parts[1]):
        date: str | None = head
        ts = f"{head}T{parts[1]}"
        tags = parts[2:]
    elif _TIME.fullmatch(head):
        date = None
        ts = head
        tags = parts[1:]
    else:
        return None
    ranks: dict[str, int] = {}
    for tag in tags:
        m = _TAG.fullmatch(tag)
        if m is not None:
            ranks[_TAG_FIELD[m.group(1)]] = int(m.group(2))
        elif tag:
            # A tag this parser does not know (a future SGLang rank kind): keep the prefix, skip the tag.
            continue
    return ts, date, ranks


def _year_for(month: str, date: str) -> str:
    """Year for a yearless journald stamp in `month`, from SGLang's `date` on the same line."""
    year = int(date[:4])
    sgl_month = date[5:7]
    if month == "12" and sgl_month == "01":
        year -= 1
    elif month == "01" and sgl_month == "12":
        year += 1
    return str(year)


_WHO = re.compile(r"(\S+) (\S+?)(?:\[(\d+)\])?", re.ASCII)
_JOURNAL_CLOCK = re.compile(
    r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) ([ \d]\d) (\d\d:\d\d:\d\d)", re.ASCII
)


def _parse_who(text: str, cache: dict[str, Any]) -> tuple[dict[str, Any], Any] | bool:
    """`host python3[7411]` → ({'host': 'host', 'pid': 7411}, 7411); False for systemd or a non-match."""
    if len(cache) >= _CACHE_SIZE:
        cache.clear()
    m = _WHO.fullmatch(text)
    if m is None:
        return False
    host, ident, pid = m.groups()
    if ident == "systemd":
        return False
    if pid is None:
        return {"host": host}, ident
    return {"host": host, "pid": int(pid)}, int(pid)


def _stamp_ts(journal_clock: str, sglang_stamp: str) -> str | bool:
    """`May 30 22:00:23` + `2026-05-30 22:00:23` → `2026-05-30T22:00:23` (journal time, SGLang's year)."""
    m = _JOURNAL_CLOCK.fullmatch(journal_clock)
    date = sglang_stamp[:10]
    if m is None or not _DATE.fullmatch(date) or not _TIME.fullmatch(sglang_stamp[11:]):
        return False
    month = _MONTHS[m.group(1)]
    return f"{_year_for(month, date)}-{month}-{m.group(2).replace(' ', '0')}T{m.group(3)}"


def _parse_tags(tags: str) -> dict[str, int] | bool:
    """`DP0 TP0 EP0` → {'dp_rank': 0, 'tp_rank': 0, 'ep_rank': 0}; False if a word is not a rank tag."""
    ranks: dict[str, int] = {}
    for tag in tags.split(" ") if tags else ():
        m = _TAG.fullmatch(tag)
        if m is None:
            return False
        ranks[_TAG_FIELD[m.group(1)]] = int(m.group(2))
    return ranks


# ---------------------------------------------------------------------------------------------------
# Message handlers. Each takes the message (prefixes removed) and the line's metadata and returns an
# event, or None when the line only looked like one (it then goes on as a `log`).


def _split_fields(text: str, sep: str) -> dict[str, str]:
    """`#running-req: 5, token usage: 0.29, ` → {'#running-req': '5', 'token usage': '0.29'}."""
    out: dict[str, str] = {}
    for part in text.split(", "):
        key, found, value = part.partition(sep)
        if found:
            out[key.strip()] = value.strip()
    return out


# The current (v0.5.9+) stats lines in one regex each; other versions take the general loop below.
_DECODE_FAST = re.compile(
    r"Decode batch, #running-req: (\d+), #token: (\d+), token usage: (\d+\.\d+), "
    r"(?:accept len: (\d+\.\d+), accept rate: (\d+\.\d+), )?cuda graph: (True|False), "
    r"gen throughput \(token/s\): (\d+\.\d+), #queue-req: (\d+)",
    re.ASCII,
)
_PREFILL_FAST = re.compile(
    r"Prefill batch, #new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+), token usage: (\d+\.\d+), "
    r"#running-req: (\d+), #queue-req: (\d+), (?:#pending-token: \d+, )?cuda graph: (True|False), "
    r"input throughput \(token/s\): (\d+\.\d+)",
    re.ASCII,
)


def _decode(msg: str, meta: dict[str, Any]) -> Event | None:
    m = _DECODE_FAST.match(msg)
    if m is not None:
        running, tokens, usage, accept_len, accept_rate, graph, gen, queue = m.groups()
        return _build(
            DecodeBatch,
            meta,
            {
                "running_req": int(running),
                "num_tokens": int(tokens),
                "token_usage": float(usage),
                "gen_throughput": float(gen),
                "queue_req": int(queue),
                "accept_len": float(accept_len) if accept_len else None,
                "accept_rate": float(accept_rate) if accept_rate else None,
                "cuda_graph": graph == "True",
            },
        )
    if not msg.startswith("Decode batch"):
        return None
    # "Decode batch. #running-req: ..." (≤0.4), "Decode batch, ..." (0.5), "Decode batch [12], ..."
    start = msg.find("#", 12)
    if start < 0:
        return None
    running_req = num_tokens = queue_req = None
    token_usage = gen_throughput = accept_len = accept_rate = None
    cuda_graph = None
    full_tokens = None
    full_usage = None
    for part in msg[start:].split(", "):
        key, found, value = part.partition(": ")
        if not found:
            continue
        if key == "#running-req":
            running_req = _int(value)
        elif key == "#token":
            num_tokens = _int(value)
        elif key == "token usage":
            token_usage = _float(value)
        elif key == "gen throughput (token/s)":
            gen_throughput = _float(value)
        elif key == "#queue-req":
            queue_req = _int(value.rstrip(", "))
        elif key == "cuda graph":
            cuda_graph = _bool(value)
        elif key == "accept len":
            accept_len = _float(value)
        elif key == "accept rate":
            accept_rate = _float(value)
        elif key == "#full token":
            full_tokens = _int(value)
        elif key == "full token usage":
            full_usage = _float(value)
    # Hybrid SWA models print full/swa pairs instead; the full-attention pool is the one that fills.
    if num_tokens is None:
        num_tokens = full_tokens
    if token_usage is None:
        token_usage = full_usage
    return _build(
        DecodeBatch,
        meta,
        {
            "running_req": running_req,
            "num_tokens": num_tokens,
            "token_usage": token_usage,
            "gen_throughput": gen_throughput,
            "queue_req": queue_req,
            "accept_len": accept_len,
            "accept_rate": accept_rate,
            "cuda_graph": cuda_graph,
        },
    )


def _prefill(msg: str, meta: dict[str, Any]) -> Event | None:
    m = _PREFILL_FAST.match(msg)
    if m is not None:
        new_seq, new_token, cached, usage, running, queue, graph, throughput = m.groups()
        return _build(
            PrefillBatch,
            meta,
            {
                "new_seq": int(new_seq),
                "new_token": int(new_token),
                "cached_token": int(cached),
                "token_usage": float(usage),
                "running_req": int(running),
                "queue_req": int(queue),
                "input_throughput": float(throughput),
                "cuda_graph": graph == "True",
            },
        )
    if not msg.startswith("Prefill batch"):
        return None
    start = msg.find("#", 13)
    if start < 0:
        return None
    new_seq = new_token = cached_token = running_req = queue_req = None
    token_usage = input_throughput = full_usage = None
    cuda_graph = None
    for part in msg[start:].split(", "):
        key, found, value = part.partition(": ")
        if not found:
            continue
        if key == "#new-seq":
            new_seq = _int(value)
        elif key == "#new-token":
            new_token = _int(value)
        elif key == "#cached-token":
            cached_token = _int(value)
        elif key == "token usage":
            token_usage = _float(value)
        elif key == "#running-req":
            running_req = _int(value)
        elif key == "#queue-req":
            queue_req = _int(value.rstrip(", "))
        elif key == "input throughput (token/s)":
            input_throughput = _float(value)
        elif key == "cuda graph":
            cuda_graph = _bool(value)
        elif key == "full token usage":
            full_usage = _float(value)
    if token_usage is None:
        token_usage = full_usage
    return _build(
        PrefillBatch,
        meta,
        {
            "new_seq": new_seq,
            "new_token": new_token,
            "cached_token": cached_token,
            "token_usage": token_usage,
            "running_req": running_req,
            "queue_req": queue_req,
            "input_throughput": input_throughput,
            "cuda_graph": cuda_graph,
        },
    )


# uvicorn's access line: `INFO:     127.0.0.1:40052 - "POST /v1/chat/completions HTTP/1.1" 200 OK`
_ACCESS = re.compile(r'INFO: +(\S+) - "([A-Z]+) (\S+)(?: [^"]*)?" (\d{3})', re.ASCII)


def _info(msg: str, meta: dict[str, Any]) -> Event | None:
    m = _ACCESS.match(msg)
    if m is None:
        return None
    client, method, path, status = m.groups()
    return _build(HttpAccess, meta, {"method": method, "path": path, "status": int(status), "client": client})


# `avail mem=4.38 GB`, `mem usage=0.60 GB`, `elapsed=2.62 s`, `Time elapsed: 3.74 s`, `type=X`, ...
_KV = re.compile(r"(avail mem|mem usage|elapsed|type|dtype)(?:=|: )([^,\s]+)", re.ASCII)


def _values(msg: str) -> dict[str, str]:
    return {k: v for k, v in _KV.findall(msg)}


def _load(msg: str, meta: dict[str, Any]) -> Event | None:
    low = msg[:17].lower()
    if low.startswith("load weight begin"):
        v = _values(msg)
        return _build(WeightsBegin, meta, {"avail_mem_gb": _gb(v.get("avail mem", ""))})
    if low.startswith("load weight end"):
        v = _values(msg)
        quant = None
        q = msg.find("quant=")
        if q >= 0:
            # quant_str = `quant=<method>[, bits=…][, quant_algo=…][, fmt=…][, requantization_method=…]`
            tail = msg[q + 6 :]
            a = tail.find(", avail mem=")
            quant = (tail[:a] if a >= 0 else tail).strip() or None
        return _build(
            WeightsLoaded,
            meta,
            {
                "avail_mem_gb": _gb(v.get("avail mem", "")),
                "mem_usage_gb": _gb(v.get("mem usage", "").rstrip(".")),
                "elapsed_s": _seconds(v.get("elapsed", "")),
                "model_type": v.get("type"),
                "dtype": v.get("dtype"),
                "quant": quant,
            },
        )
    return None


def _kv_cache(msg: str, meta: dict[str, Any]) -> Event | None:
    """`[Label ]KV Cache is allocated. [dtype: X, ]#tokens: N, K size: a GB, V size: b GB` or `KV size: c GB`."""
    at = msg.find("KV Cache ")
    if at < 0 or not ("is allocated" in msg or "VA upper bound" in msg):
        return None
    label = msg[:at].strip() or None
    dot = msg.find(". ", at)
    if dot < 0:
        return None
    v = _split_fields(msg[dot + 2 :], ": ")
    return _build(
        KvPoolAllocated,
        meta,
        {
            "tokens": _int(v.get("#tokens", "")),
            "k_size_gb": _gb(v.get("K size", "")),
            "v_size_gb": _gb(v.get("V size", "")),
            "kv_size_gb": _gb(v.get("KV size", "")),
            "dtype": v.get("dtype"),
            "label": label,
        },
    )


def _post_capture(msg: str, meta: dict[str, Any]) -> Event | None:
    """0.5.23's opt-in `Post-capture KV sizing: [draft ]KV cache allocated. dtype: …, #tokens: …, KV size: …`."""
    if not msg.startswith("Post-capture KV sizing: ") or "allocated. " not in msg:
        return None
    v = _split_fields(msg.split("allocated. ", 1)[1], ": ")
    label = "draft" if "draft KV cache" in msg else None
    return _build(
        KvPoolAllocated,
        meta,
        {
            "tokens": _int(v.get("#tokens", "")),
            "kv_size_gb": _gb(v.get("KV size", "")),
            "dtype": v.get("dtype"),
            "label": label,
        },
    )


def _memory(msg: str, meta: dict[str, Any]) -> Event | None:
    if msg.startswith("Memory pool end"):
        return _build(MemoryPoolEnd, meta, {"avail_mem_gb": _gb(_values(msg).get("avail mem", ""))})
    if msg.startswith("Memory baseline taken"):
        # 0.5.23 splits the old `Init torch distributed ends. mem usage=…` across two lines.
        return _build(
            DistInit, meta, {"phase": "end", "mem_usage_gb": _gb(_values(msg).get("mem usage", ""))}
        )
    return None


def _init(msg: str, meta: dict[str, Any]) -> Event | None:
    if msg.startswith(("Init torch distributed begin", "Init parallel begin")):
        return _build(DistInit, meta, {"phase": "begin"})
    if msg.startswith(("Init torch distributed end", "Init parallel end")):
        v = _values(msg)
        return _build(
            DistInit,
            meta,
            {
                "phase": "end",
                "mem_usage_gb": _gb(v.get("mem usage", "")),
                "elapsed_s": _seconds(v.get("elapsed", "")),
            },
        )
    return None


_GRAPH_WORDS = ("cuda graph", "CUDA graph", "cpu graph", "npu graph", "musa graph")


def _capture(msg: str, meta: dict[str, Any]) -> Event | None:
    if not msg.startswith("Capture "):
        return None
    if " failed" in msg[:40]:
        return _build(Error, meta, {"category": "cuda_graph_failed", "message": msg, "lines": [meta["raw"]]})
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
    v = _values(msg)
    return _build(
        CudaGraph,
        meta,
        {
            "phase": phase,
            "avail_mem_gb": _gb(v.get("avail mem", "").rstrip(".")),
            "mem_usage_gb": _gb(v.get("mem usage", "").rstrip(".")),
            "elapsed_s": _seconds(v.get("elapsed", "").rstrip(".")),
            "graph": what or None,
        },
    )


_SUMMARY_FIELDS = {
    "max_total_num_tokens": ("max_total_num_tokens", _int),
    "max_total_num_token": ("max_total_num_tokens", _int),  # v0.1
    "Max_total_num_token": ("max_total_num_tokens", _int),  # v0.1 variant
    "chunked_prefill_size": ("chunked_prefill_size", _int),
    "max_prefill_tokens": ("max_prefill_tokens", _int),
    "max_prefill_num_token": ("max_prefill_tokens", _int),  # v0.1
    "max_running_requests": ("max_running_requests", _int),
    "context_len": ("context_len", _int),
    "available_gpu_mem": ("available_gpu_mem_gb", _gb),
}
_CLAMPED = re.compile(r"max_total_tokens=(\d+) is larger than the profiled value (\d+)", re.ASCII)


def _max_total(msg: str, meta: dict[str, Any]) -> Event | None:
    m = _CLAMPED.match(msg)
    if m is not None:
        return _build(PoolClamped, meta, {"requested": int(m.group(1)), "profiled": int(m.group(2))})
    fields: dict[str, Any] = {}
    for key, value in _split_fields(msg, "=").items():
        spec = _SUMMARY_FIELDS.get(key)
        if spec is not None:
            fields[spec[0]] = spec[1](value.rstrip(", "))
    if fields.get("max_total_num_tokens") is None:
        return None
    return _build(PoolSummary, meta, fields)


def _ready(msg: str, meta: dict[str, Any]) -> Event | None:
    if msg.startswith("The server is fired up and ready to roll"):
        return _build(ServerReady, meta)
    return None


def _server_args(msg: str, meta: dict[str, Any]) -> Event | None:
    if not msg.startswith("server_args="):
        return None
    return _build(ServerArgs, meta, {"args": parse_server_args(msg[12:])})


def _sigquit(msg: str, meta: dict[str, Any]) -> Event | None:
    if msg.startswith(("Received sigquit", "SIGQUIT received")):
        return _build(Error, meta, {"category": "sigquit", "message": msg, "lines": [meta["raw"]]})
    return None


def _not_enough(msg: str, meta: dict[str, Any]) -> Event | None:
    if msg.startswith("Not enough memory"):
        return _build(Error, meta, {"category": "not_enough_memory", "message": msg, "lines": [meta["raw"]]})
    return None


# Dispatch on the message's first six characters: one slice and one dict lookup per line.
_HANDLERS: dict[str, Any] = {
    "Decode": _decode,
    "Prefil": _prefill,
    "INFO: ": _info,
    "Load w": _load,
    "load w": _load,
    "KV Cac": _kv_cache,
    "Full K": _kv_cache,
    "SWA KV": _kv_cache,
    "Memory": _memory,
    "Init t": _init,
    "Init p": _init,
    "Captur": _capture,
    "max_to": _max_total,
    "Max_to": _max_total,
    "The se": _ready,
    "server": _server_args,
    "Receiv": _sigquit,
    "SIGQUI": _sigquit,
    "Not en": _not_enough,
    "Post-c": _post_capture,
}

# Error signatures anywhere in a line that no handler claimed, most specific first. The cheap `in`
# pre-checks on `_ERROR_HINTS` keep ordinary noise lines from paying for the whole table.
_ERROR_SIGNS: tuple[tuple[str, str], ...] = (
    ("CUDA out of memory", "cuda_oom"),
    ("OutOfMemoryError", "cuda_oom"),
    ("HIP out of memory", "cuda_oom"),
    ("Not enough memory", "not_enough_memory"),
    ("leave no GPU memory for the KV cache", "not_enough_memory"),
    ("Memory pool size is too small", "not_enough_memory"),
    ("Capture cuda graph failed", "cuda_graph_failed"),
    ("Capture CUDA graph failed", "cuda_graph_failed"),
    ("Watchdog caught collective operation timeout", "nccl_timeout"),
    ("Some NCCL operations have failed or timed out", "nccl_timeout"),
    ("DistBackendError", "nccl_timeout"),
    ("watchdog timeout", "watchdog_timeout"),
    ("Watchdog timeout", "watchdog_timeout"),
    ("Received sigquit", "sigquit"),
    ("SIGQUIT", "sigquit"),
    ("Scheduler hit an exception", "scheduler_exception"),
    ("hit an exception", "other"),
)
_ERROR_HINTS = ("emory", "ailed", "imeout", "IGQUIT", "igquit", "xception", "rror")


def _error_category(text: str, in_traceback: bool = False) -> str | None:
    for needle, category in _ERROR_SIGNS:
        # Inside a traceback `SIGQUIT` is code (`signal.SIGQUIT`), not the message that it arrived.
        if in_traceback and category == "sigquit":
            continue
        if needle in text:
            return category
    return None


# Python traceback shapes.
_TB_HEAD = "Traceback (most recent call last):"
_EXC_SUMMARY = re.compile(r"[A-Za-z_][\w.]*(?::(?: |$)|$)", re.ASCII)
_NUMBERED = re.compile(r"\d+\. ", re.ASCII)
_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
# Lines SGLang prints under `Capture cuda graph failed: …` / `Fail when using backend …`.
_EXC_TAIL = ("Possible solutions:", "Possible suggestions:", "Open an issue on GitHub")


class _Held:
    """A traceback being collected for one source (process)."""

    __slots__ = ("blank_tail", "first_message", "last_seen", "lines", "meta", "summary", "tail_meta")

    def __init__(self, meta: dict[str, Any], first_message: str, seen: int) -> None:
        self.meta = meta
        self.lines: list[str] = [meta["raw"]]
        self.first_message = first_message
        self.summary: str | None = None
        self.last_seen = seen
        self.tail_meta = meta
        # Metadata of the blank lines at the end so far: they are given back as `log` events when the
        # traceback turns out to have ended before them.
        self.blank_tail: list[dict[str, Any]] = []

    def continues(self, msg: str) -> bool:
        if not msg or msg.isspace():
            return True
        first = msg[0]
        if first == " " or first == "\t":
            return True
        if msg.startswith(_TB_HEAD):
            self.summary = None  # a chained traceback follows; its own summary comes later
            return True
        if msg.startswith(_CHAIN):
            return True
        if self.summary is None:
            if _EXC_SUMMARY.match(msg):
                self.summary = msg
                return True
            return False
        return msg.startswith(_EXC_TAIL) or _NUMBERED.match(msg) is not None


# ---------------------------------------------------------------------------------------------------
# systemd's own lines about the unit.

_UNIT_NAME = re.compile(r"[\w@:.\\-]+\.(?:service|scope|socket|target|timer|mount|slice|path)", re.ASCII)
_RESULT = re.compile(r"Failed with result '([^']+)'", re.ASCII)
_EXITED = re.compile(r"Main process exited, code=(\w+), status=(\d+)", re.ASCII)
_RESTART = re.compile(r"Scheduled restart job, restart counter is at (\d+)", re.ASCII)
_EXIT_RESULT = {"exited": "exit-code", "killed": "signal", "dumped": "core-dump"}


def _unit_event(msg: str, meta: dict[str, Any]) -> Event | None:
    """systemd[1]'s lines about a unit; None for the ones that carry no state (`Consumed …`)."""
    m = _UNIT_NAME.match(msg)
    if m is not None and msg.startswith(": ", m.end()):
        if "systemd_unit" not in meta:
            meta = {**meta, "systemd_unit": m.group(0)}
        rest = msg[m.end() + 2 :]
        if rest.startswith("Main process exited"):
            e = _EXITED.match(rest)
            if e is None:
                return None
            code, status = e.group(1), int(e.group(2))
            if code == "exited" and status == 0:
                return _build(Unit, meta, {"state": "stopped", "message": msg})
            return _build(
                Unit, meta, {"state": "failed", "result": _EXIT_RESULT.get(code, code), "message": msg}
            )
        r = _RESULT.match(rest)
        if r is not None:
            return _build(Unit, meta, {"state": "failed", "result": r.group(1), "message": msg})
        if rest.startswith(("Deactivated successfully", "Succeeded")):
            return _build(Unit, meta, {"state": "stopped", "result": "success", "message": msg})
        s = _RESTART.match(rest)
        if s is not None:
            return _build(
                Unit, meta, {"state": "starting", "message": msg, "restart_counter": int(s.group(1))}
            )
        return None
    for word, state in (
        ("Starting ", "starting"),
        ("Started ", "started"),
        ("Stopping ", "stopping"),
        ("Stopped ", "stopped"),
        ("Failed to start ", "failed"),
    ):
        if msg.startswith(word):
            if "systemd_unit" not in meta:
                name = _UNIT_NAME.match(msg, len(word))
                if name is not None:
                    meta = {**meta, "systemd_unit": name.group(0)}
            return _build(Unit, meta, {"state": state, "message": msg})
    return None


# ---------------------------------------------------------------------------------------------------
# ServerArgs: `ServerArgs(model_path='x', tp_size=8, …)` (≤0.5.13) or a dict repr (0.5.23).


def _split_top_level(text: str) -> list[str]:
    """Split `a=1, b='x, y', c=[1, 2]` on the commas outside quotes and brackets."""
    parts: list[str] = []
    depth = 0
    quote = ""
    start = 0
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        # Reprs of objects (`<Enum.X: 1>`, `PosixPath(...)`) are kept as their text.
        return text


def parse_server_args(text: str) -> dict[str, Any]:
    """The dict behind a `server_args=` dump, whichever repr SGLang used; tolerant of truncation."""
    text = text.strip()
    if text.startswith("{"):
        value = _literal(text)
        if isinstance(value, dict):
            return {str(k): v for k, v in value.items()}
        body = text[1:].removesuffix("}")
        args: dict[str, Any] = {}
        for part in _split_top_level(body):
            key, found, value_text = part.partition(":")
            if found:
                args[str(_literal(key.strip()))] = _literal(value_text.strip())
        return args
    open_at = text.find("(")
    body = text[open_at + 1 :] if open_at >= 0 else text
    body = body.removesuffix(")")
    args = {}
    for part in _split_top_level(body):
        key, found, value_text = part.partition("=")
        if found and key.isidentifier():
            args[key] = _literal(value_text)
    return args


# ---------------------------------------------------------------------------------------------------
# JSON helpers.


def _jtext(value: Any) -> str | None:
    """A journal field: a string, an array of byte values (not valid UTF-8), or several values."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        if not value:
            return ""
        if all(isinstance(b, int) and 0 <= b <= 255 for b in value):
            return bytes(value).decode("utf-8", "replace")
        # A field given several times: journalctl prints an array of its values; take the first.
        return _jtext(value[0])
    return str(value)


def _jint(value: Any) -> int | None:
    text = _jtext(value)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------------
# The hot path (`JournalParser.feed_many` → `_hot_run`): one regex over a whole journald `short` line
# from a process (`May 30 22:00:23 host ident[pid]: msg`) that finds its parts and, for the three lines
# that make up nearly all of a serving journal — decode stats, prefill stats, uvicorn's access line —
# checks and captures the message with the handlers' own regexes, so a match gives exactly the fields
# `_decode` / `_prefill` / `_info` would. Any other message is captured whole, and becomes the `log`
# event the careful path would make when nothing in it could make it more (no handler for its first
# six characters, no error hint, no other prefix, no `\r` or ESC; see `_hot_run`).
#
# The regex only finds where the parts are; the parts that vary little (`host ident[pid]`, SGLang's
# year and month, the rank tags; the minute) are judged once per value by the careful path's own
# functions in `_template` and `_retime`, whose verdicts are cached. Where the regex is looser than
# `_text`'s own paths, those refuse, and the line goes the careful way. What the regex holds itself:
# - `who` has no `:` (so `_text` finds the same `: [`), the stamp is `YYYY-MM-DD hh:mm:ss` and the tags
#   have no `]` (so `_text` finds the same `] `);
# - no trailing `:` or `\r` (the look-behind before `\Z`): `feed` strips a trailing `\r`, and a trailing
#   `:` may open a traceback. (`feed_many` hands it no line with a `\n`: `feed` splits on those.)
# Character classes are kept to negated literals (`[^:]`, `[^\]]`), which sre scans in a tight loop,
# and quantifiers that need no backtracking are possessive: this regex is the largest single cost of
# a line.


def _possessive(pattern: str, *quantified: str) -> str:
    """`pattern` with each of the `quantified` parts made possessive (`\\d+` → `\\d++`, `)?` → `)?+`):
    sre then keeps no backtracking state for them, a good part of a long pattern's cost. Only for parts
    that cannot give anything back to what follows them (digits before `,`, `.` or the end; an optional
    group whose text the next part cannot start with; runs of a class before a character outside it),
    so every match is the same."""
    for part in quantified:
        assert part in pattern, part  # a changed handler regex must be looked at again here
        pattern = pattern.replace(part, part + "+")
    return pattern


def _digits_as_range(pattern: str) -> str:
    """`pattern` with each `\\d` outside a class spelled `[0-9]`: the same set under `re.ASCII`, but sre
    tests a range inline where it calls out to its category table for `\\d` (~270 instructions less per
    stats line). Inside a class (`[\\d.]`) it is left alone."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            pair = pattern[i : i + 2]
            out.append("[0-9]" if pair == "\\d" and not in_class else pair)
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
            j = i + 1
            if pattern[j : j + 1] == "^":
                j += 1
            if pattern[j : j + 1] == "]":  # a leading `]` is a member, not the class's end
                j += 1
            out.append(pattern[i:j])
            i = j
            continue
        if c == "]" and in_class:
            in_class = False
        out.append(c)
        i += 1
    return "".join(out)


_HOT = re.compile(
    _digits_as_range(
        r"(.{12}+):\d\d "
        r"(?:([^:]++: \[\d\d\d\d-\d\d)-\d\d \d\d:\d\d:\d\d([^\]]*+)\] "
        r"(?:"
        + _possessive(_DECODE_FAST.pattern, r"\d+", r", )?")
        + ".*+|"
        + _possessive(_PREFILL_FAST.pattern, r"\d+", r", )?")
        + ".*+|"
        + _possessive(_ACCESS.pattern, r"INFO: +(\S+", r"INFO: +", r"[A-Z]+")
        + ".*+"
        r"|(.*+))"
        r"|([^:]++): (.*+))"
        r"(?<![:\r])\Z"
    ),
    re.ASCII,
)
# `m.lastindex` names the alternative that matched: its last group. Groups 1-3 (the minute, `host
# ident[pid]: [YYYY-MM`, the rank tags) are the key of the line's template; `: [` keeps it unambiguous.
_HOT_DECODE = 3 + _DECODE_FAST.groups
_HOT_PREFILL = _HOT_DECODE + _PREFILL_FAST.groups
_HOT_ACCESS = _HOT_PREFILL + _ACCESS.groups
_HOT_LOG = _HOT_ACCESS + 1  # any other message after SGLang's bracket
_HOT_PLAIN = _HOT_LOG + 2  # a message without SGLang's bracket; the group before it is `host ident[pid]`
_HOT_CLASSES = {
    _HOT_DECODE: DecodeBatch,
    _HOT_PREFILL: PrefillBatch,
    _HOT_ACCESS: HttpAccess,
    _HOT_LOG: Log,
    _HOT_PLAIN: Log,
}
_CHUNK = 1024
# Longer messages are judged each time rather than cached, so a full cache (4,096) stays near 2 MB.
_VERDICT_CHARS = 512


# ---------------------------------------------------------------------------------------------------


class JournalParser:
    """Streaming parser: `feed` one journal item at a time, `flush` at the end of the stream.

    A Python traceback printed over many lines is held and returned as one `error` event once it ends:
    on the next line of the same process that is not part of it, after `MAX_TRACEBACK_LINES` lines,
    after `STALE_TRACEBACK_LINES` lines from other processes, or on `flush`.
    """

    def __init__(self, host: str | None = None) -> None:
        self._host = host
        self._held: dict[Any, _Held] = {}
        self._seen = 0
        self._bracket_cache: dict[str, tuple[str, str | None, dict[str, int]] | None] = {}
        self._who_cache: dict[str, tuple[dict[str, Any], Any] | bool] = {}
        self._ts_cache: dict[str, str | bool] = {}
        self._tag_cache: dict[str, dict[str, int] | bool] = {}
        self._second_cache: tuple[int, str] = (-1, "")
        # One template cache per alternative of `_HOT`, indexed by its last group.
        self._tmpl_cache: list[dict[str, list[Any]]] = [{} for _ in range(_HOT.groups + 1)]
        self._head_cache: dict[str, str] = {}
        # Whether a message `_HOT` captured whole is a plain `log`, per alternative (see `_hot_run`).
        self._log_verdicts: dict[int, dict[str, bool]] = {_HOT_LOG: {}, _HOT_PLAIN: {}}

    # -- public -----------------------------------------------------------------------------------

    def feed(self, item: str | bytes | dict[str, Any]) -> list[Event]:
        out: list[Event] = []
        try:
            self._feed(item, out)
        except Exception as exc:  # the parser never raises on input; keep the line instead
            out.append(self._fallback(item, exc))
        return out

    def flush(self) -> list[Event]:
        out: list[Event] = []
        for key in list(self._held):
            self._close(key, out)
        return out

    def feed_many(self, items: Iterable[str | bytes | dict[str, Any]]) -> list[Event]:
        """`feed` for many items at once: the same events, in order, as feeding them one by one.

        The bulk of a journal (journald `short` text lines from the server's processes) takes one regex
        match, a template lookup and one event build here (`_hot_run`); every other item goes through
        `feed`'s path.
        """
        if not isinstance(items, list | tuple):
            items = list(items)
        out: list[Event] = []
        if not items:
            return out
        # `_hot_run` takes only single text lines of a length the parser reads (`feed` splits on `\n`,
        # which the regex's classes would cross). Checked here for the whole chunk in a few C loops;
        # a chunk that fails goes item by item, in runs.
        try:
            fits = (
                set(map(type, items)) == _STR_ONLY
                and max(map(len, items)) <= MAX_PARSE_CHARS
                and "\n" not in "".join(items)  # type: ignore[arg-type]
            )
        except TypeError:
            fits = False
        if fits:
            self._hot_run(items, out)  # type: ignore[arg-type]
            return out
        run: list[str] = []
        for item in items:
            if type(item) is str and len(item) <= MAX_PARSE_CHARS and "\n" not in item:
                run.append(item)
                continue
            if run:
                self._hot_run(run, out)
                run = []
            try:
                self._feed(item, out)
            except Exception as exc:  # the parser never raises on input; keep the line instead
                out.append(self._fallback(item, exc))
        if run:
            self._hot_run(run, out)
        return out

    def _hot_run(self, items: list[str] | tuple[str, ...], out: list[Event]) -> None:
        """`feed` for single text lines: `_HOT`'s lines built here, the others through `_feed`."""
        append = out.append
        held = self._held
        hot = _HOT.match
        caches = self._tmpl_cache
        log_ok = self._log_verdicts
        handlers = _HANDLERS
        h0, h1, h2, h3, h4, h5, h6 = _ERROR_HINTS  # `_body`'s hints, unrolled below: a loop costs more
        usage = _USAGE
        small = _SMALL_INTS
        new = _new
        set_dict = _set_dict
        set_fields = _set_fields_set
        fields_dec = _FIELDS_SET[DecodeBatch]
        fields_pre = _FIELDS_SET[PrefillBatch]
        fields_acc = _FIELDS_SET[HttpAccess]
        fields_log = _FIELDS_SET[Log]
        int_ = int
        float_ = float
        start = counted = len(out)
        # Each hot line adds one event, so the hot lines since `self._seen` was last brought up to
        # date are `len(out) - counted`.
        for item in items:
            if not held:
                m = hot(item)
                if m is not None:
                    g = m.groups()
                    last = m.lastindex
                    entry = caches[last].get(g[1] + g[2] if last != _HOT_PLAIN else g[24])  # type: ignore[index, operator]
                    if entry is None:
                        entry = self._template(last, g)  # type: ignore[arg-type]
                    # entry: [the event's fields but time, raw line and its own; minute; its ISO head]
                    if entry[0] is not None and (g[0] == entry[1] or self._retime(entry, last, g)):  # type: ignore[arg-type]
                        try:
                            if last == _HOT_DECODE:
                                d = entry[0].copy()
                                d["ts"] = entry[2] + item[12:15]
                                d["raw"] = item
                                d["running_req"] = small[g[3]]
                                d["num_tokens"] = int_(g[4])  # type: ignore[arg-type]
                                try:
                                    d["token_usage"] = usage[g[5]]
                                except KeyError:
                                    d["token_usage"] = float_(g[5])  # type: ignore[arg-type]
                                if g[6] is not None:
                                    d["accept_len"] = float_(g[6])
                                    d["accept_rate"] = float_(g[7])  # type: ignore[arg-type]
                                d["cuda_graph"] = g[8] == "True"
                                d["gen_throughput"] = float_(g[9])  # type: ignore[arg-type]
                                d["queue_req"] = small[g[10]]
                                obj = new(DecodeBatch)
                                set_fields(obj, fields_dec)
                                set_dict(obj, d)
                                append(obj)
                                continue
                            if last == _HOT_ACCESS:
                                d = entry[0].copy()
                                d["ts"] = entry[2] + item[12:15]
                                d["raw"] = item
                                d["client"] = g[19]
                                d["method"] = g[20]
                                d["path"] = g[21]
                                d["status"] = small[g[22]]
                                obj = new(HttpAccess)
                                set_fields(obj, fields_acc)
                                set_dict(obj, d)
                                append(obj)
                                continue
                            if last == _HOT_PREFILL:
                                d = entry[0].copy()
                                d["ts"] = entry[2] + item[12:15]
                                d["raw"] = item
                                d["new_seq"] = small[g[11]]
                                d["new_token"] = int_(g[12])  # type: ignore[arg-type]
                                d["cached_token"] = int_(g[13])  # type: ignore[arg-type]
                                try:
                                    d["token_usage"] = usage[g[14]]
                                except KeyError:
                                    d["token_usage"] = float_(g[14])  # type: ignore[arg-type]
                                d["running_req"] = small[g[15]]
                                d["queue_req"] = small[g[16]]
                                d["cuda_graph"] = g[17] == "True"
                                d["input_throughput"] = float_(g[18])  # type: ignore[arg-type]
                                obj = new(PrefillBatch)
                                set_fields(obj, fields_pre)
                                set_dict(obj, d)
                                append(obj)
                                continue
                        except KeyError:  # a number outside `_SMALL_INTS` / `_USAGE`: the careful way
                            pass
                        else:
                            msg: str = g[last - 1]  # type: ignore[assignment]
                            # A `log` unless `_body` would make more of it (a handler's kind, an error)
                            # or, without SGLang's bracket, `_message` would rewrite it or might read
                            # another prefix in it: those go the careful way. The verdict depends on
                            # the message alone, and library noise repeats word for word: cached per
                            # alternative (one lookup against ten substring searches).
                            verdicts = log_ok[last]
                            plain = verdicts.get(msg)
                            if plain is None:
                                plain = not (
                                    msg[:6] in handlers
                                    or h0 in msg
                                    or h1 in msg
                                    or h2 in msg
                                    or h3 in msg
                                    or h4 in msg
                                    or h5 in msg
                                    or h6 in msg
                                    or (last == _HOT_PLAIN and self._plain_prefixed(msg))
                                )
                                if len(msg) <= _VERDICT_CHARS:
                                    if len(verdicts) >= _CACHE_SIZE:
                                        verdicts.clear()
                                    verdicts[msg] = plain
                            if plain:
                                d = entry[0].copy()
                                d["ts"] = entry[2] + item[12:15]
                                d["raw"] = item
                                d["message"] = msg
                                obj = new(Log)
                                set_fields(obj, fields_log)
                                set_dict(obj, d)
                                append(obj)
                                continue
            self._seen += len(out) - counted
            try:
                self._feed(item, out)
            except Exception as exc:  # the parser never raises on input; keep the line instead
                append(self._fallback(item, exc))
            counted = len(out)
        self._seen += len(out) - counted
        # pydantic's two other slots, for the whole run in C loops: None on every event the parser
        # makes (`_build`'s too, so setting them again on the careful path's events changes nothing).
        events = out[start:] if start else out
        deque(map(_set_extra, events, repeat(None)), maxlen=0)
        deque(map(_set_private, events, repeat(None)), maxlen=0)

    def _plain_prefixed(self, msg: str) -> bool:
        """Whether `_message` would rewrite this message (tqdm's `\\r`) or might read more into it than
        a `log`: another prefix, or a tqdm bar glued to SGLang's bracket. ESC: `_text` strips ANSI."""
        if "\r" in msg or "\x1b" in msg or "][" in msg:
            return True
        first = msg[:1]
        if first == "[":
            if msg.startswith(("[rank", "[gpu")):
                return True
            end = msg.find("] ")
            if end > 0:
                inner = msg[1:end]
                cache = self._bracket_cache
                parsed = cache.get(inner, False)
                if parsed is False:
                    if len(cache) >= _BRACKET_CACHE_SIZE:
                        cache.clear()
                    parsed = cache[inner] = _parse_bracket(inner)
                return parsed is not None
        return first == "R" and msg.startswith("Rank ")

    def _template(self, last: int, g: tuple[str | None, ...]) -> list[Any]:
        """A hot line's template: `[fields, minute, head]` (see `_hot_run`), cached per `_HOT`
        alternative, `host ident[pid]`, SGLang's year-month and rank tags; the fields are None when
        those are not what `_text` accepts on the path it would take."""
        if last == _HOT_PLAIN:
            key: str = g[_HOT_PLAIN - 2]  # type: ignore[assignment]
            who_text, year_month, tags = key, None, None
        else:
            key = g[1] + g[2]  # type: ignore[operator]  # `: [` keeps it unambiguous
            who_text, _, year_month = g[1].partition(": [")  # type: ignore[union-attr]
            tags = g[2]
        cache = self._tmpl_cache[last]
        if len(cache) >= _CACHE_SIZE:
            cache.clear()
        fields: dict[str, Any] | None = None
        who = _parse_who(who_text, {})
        if who is not False:
            cls = _HOT_CLASSES[last]
            if year_month is None:
                # No SGLang bracket: `_JOURNAL_SHORT` reads the same `host ident[pid]` (its ident stops
                # at the same `:`), but only after `_ANSI` has cleaned the line.
                if "\x1b" not in who_text:
                    fields = _shared_dict(cls, {**_DEFAULTS[cls], **who[0]})  # type: ignore[index]
            elif tags is not None and tags[:1] in ("", " "):
                ranks = _parse_tags(tags[1:])
                if ranks is not False:
                    fields = _shared_dict(cls, {**_DEFAULTS[cls], **who[0], **ranks})  # type: ignore[index, dict-item]
        entry = cache[key] = [fields, None, ""]
        return entry

    def _retime(self, entry: list[Any], last: int, g: tuple[str | None, ...]) -> bool:
        """Point a template at this line's minute; False when journald's stamp is not one `_text` reads."""
        clock: str = g[0]  # type: ignore[assignment]
        year_month = None if last == _HOT_PLAIN else g[1][-7:]  # type: ignore[index]
        key = clock + (year_month or "")
        head = self._head_cache.get(key)
        if head is None:
            if len(self._head_cache) >= _CACHE_SIZE:
                self._head_cache.clear()
            head = ""
            stamp = _JOURNAL_CLOCK.fullmatch(clock + ":00")  # the seconds are the regex's `\d\d`
            if stamp is not None:
                month = _MONTHS[stamp.group(1)]
                day = stamp.group(2).replace(" ", "0")
                minute = stamp.group(3)[:5]
                if year_month is None:
                    head = f"--{month}-{day}T{minute}"
                else:
                    # `May 30 21:18` + `2026-05` → `2026-05-30T21:18`: journald's time, SGLang's year.
                    head = f"{_year_for(month, year_month)}-{month}-{day}T{minute}"
            self._head_cache[key] = head
        if not head:
            return False
        entry[1] = clock
        entry[2] = head
        return True

    # -- dispatch ---------------------------------------------------------------------------------

    def _feed(self, item: str | bytes | dict[str, Any], out: list[Event]) -> None:
        if isinstance(item, str):
            line = item
        elif isinstance(item, dict):
            self._json(item, out)
            return
        elif isinstance(item, bytes | bytearray):
            line = bytes(item).decode("utf-8", "replace")
        else:
            line = str(item)
        if line[:1] == "{":
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            if isinstance(obj, dict) and ("MESSAGE" in obj or "__CURSOR" in obj):
                self._json(obj, out)
                return
        if line[-1:] == "\n":
            line = line[:-1]
        if line[-1:] == "\r":
            line = line[:-1]
        if "\n" in line:
            for part in line.split("\n"):
                self._text(part.removesuffix("\r"), out)
        else:
            self._text(line, out)

    def _fallback(self, item: Any, exc: Exception) -> Event:
        if isinstance(item, dict):
            raw = _jtext(item.get("MESSAGE")) or ""
        elif isinstance(item, bytes | bytearray):
            raw = bytes(item).decode("utf-8", "replace")
        else:
            raw = str(item)
        meta: dict[str, Any] = {"raw": raw}
        if self._host is not None:
            meta["host"] = self._host
        return _build(Log, meta, {"message": raw})

    # -- text lines -------------------------------------------------------------------------------

    def _text(self, line: str, out: list[Event]) -> None:
        if line[:1] in _MONTH_INITIALS and line[15:16] == " ":
            # Fast path: a journald `short` line carrying SGLang's bracket, the bulk of any journal:
            # `May 30 22:00:23 host python3[7411]: [2026-05-30 22:00:23 TP0] msg`. Its three parts are
            # looked up in caches rather than parsed: who (`host python3[7411]`: a handful per journal),
            # the rank tags (a handful) and the two clocks (one entry per second).
            j = line.find(": [", 16)
            if j > 0:
                e = line.find("] ", j + 3)
                if e > 0:
                    who_text = line[16:j]
                    who = self._who_cache.get(who_text)
                    if who is None:
                        who = self._who_cache[who_text] = _parse_who(who_text, self._who_cache)
                    inner = line[j + 3 : e]
                    if who is not False and inner[10:11] == " " and inner[19:20] in (" ", ""):
                        # The time is journald's; SGLang's stamp only lends its year (and month, to
                        # tell a New Year apart). The key still holds the whole stamp: a malformed one
                        # must be judged the same whether or not a good one came before it.
                        stamp = line[:15] + inner[:19]
                        ts = self._ts_cache.get(stamp)
                        if ts is None:
                            if len(self._ts_cache) >= _CACHE_SIZE:
                                self._ts_cache.clear()
                            ts = self._ts_cache[stamp] = _stamp_ts(line[:15], inner[:19])
                        tags = inner[20:]
                        ranks = self._tag_cache.get(tags)
                        if ranks is None:
                            if len(self._tag_cache) >= _CACHE_SIZE:
                                self._tag_cache.clear()
                            ranks = self._tag_cache[tags] = _parse_tags(tags)
                        if ts is not False and ranks is not False and len(line) <= MAX_PARSE_CHARS:
                            template, source = who  # type: ignore[misc]
                            meta = {**template, **ranks, "ts": ts, "raw": line}  # type: ignore[dict-item]
                            self._seen += 1
                            self._body(line[e + 2 :], meta, source, True, out)
                            return
        meta: dict[str, Any] = {"raw": line}
        if self._host is not None:
            meta["host"] = self._host
        if len(line) > MAX_PARSE_CHARS:
            self._seen += 1
            out.append(_build(Log, meta, {"message": line}))
            return
        if "\x1b" in line:
            line = _ANSI.sub("", line)
        msg = line
        source: Any = None
        short: tuple[str, str, str] | None = None
        first = line[:1]
        if first in _MONTH_INITIALS:
            m = _JOURNAL_SHORT.match(line)
            if m is not None:
                mon, day, clock, host, ident, pid = m.groups()
                msg = line[m.end() :]
                short = (_MONTHS[mon], day.replace(" ", "0"), clock)
                meta["host"] = host
                if pid is not None:
                    meta["pid"] = source = int(pid)
                else:
                    source = ident
                if ident == "systemd":
                    self._systemd(msg, meta, short, out)
                    return
        elif first.isdigit():
            msg, source, short = self._digit_prefix(line, meta)
        elif first != "[" and first != " " and "|" in line[:64]:
            m = _COMPOSE.match(line)
            if m is not None:
                source = m.group(1)
                msg = line[m.end() :]
                if msg[:1].isdigit():
                    msg, _, _ = self._digit_prefix(msg, meta)
        self._message(msg, meta, source, short, out)

    def _digit_prefix(self, line: str, meta: dict[str, Any]) -> tuple[str, Any, None]:
        """short-iso journald, `docker logs -t`, or a wrapping Python logger; else the line as is."""
        m = _ISO_STAMP.match(line)
        if m is not None:
            stamp, frac, zone = m.groups()
            ts = stamp + (frac[:7] if frac else "")
            rest = line[m.end() :]
            if zone is None or zone == "Z":
                # docker's stamp (always UTC); journald's short-iso always prints an offset.
                meta["ts"] = ts + "+00:00" if zone else ts
                return rest, None, None
            meta["ts"] = ts + (zone if ":" in zone else f"{zone[:3]}:{zone[3:]}")
            j = _JOURNAL_ISO_REST.match(rest)
            if j is None:
                return rest, None, None
            host, ident, pid = j.groups()
            meta["host"] = host
            source: Any = ident
            if pid is not None:
                meta["pid"] = source = int(pid)
            return rest[j.end() :], source, None
        m = _PYLOG.match(line)
        if m is not None:
            meta["ts"] = f"{m.group(1)}T{m.group(2)}.{m.group(3)}"
            return line[m.end() :], None, None
        return line, None, None

    def _systemd(
        self, msg: str, meta: dict[str, Any], short: tuple[str, str, str] | None, out: list[Event]
    ) -> None:
        if short is not None and "ts" not in meta:
            meta["ts"] = f"--{short[0]}-{short[1]}T{short[2]}"
        self._seen += 1
        event = _unit_event(msg, meta)
        out.append(event if event is not None else _build(Log, meta, {"message": msg}))

    # -- the message after the outer prefix ---------------------------------------------------------

    def _message(
        self,
        msg: str,
        meta: dict[str, Any],
        source: Any,
        short: tuple[str, str, str] | None,
        out: list[Event],
    ) -> None:
        """The message after any outer prefix: SGLang's own prefix, then `_body`."""
        self._seen += 1
        if "\r" in msg:
            msg = self._last_frame(msg)
        prefixed = False
        date: str | None = None
        first = msg[:1]
        if first == "[":
            end = msg.find("] ")
            if end > 0:
                inner = msg[1:end]
                cache = self._bracket_cache
                parsed = cache.get(inner, False)
                if parsed is False:
                    if len(cache) >= _BRACKET_CACHE_SIZE:
                        cache.clear()
                    parsed = cache[inner] = _parse_bracket(inner)
                if parsed is not None:
                    ts, date, ranks = parsed  # type: ignore[misc]
                    if "ts" not in meta:
                        meta["ts"] = ts
                    if ranks:
                        meta.update(ranks)
                    msg = msg[end + 2 :]
                    prefixed = True
                elif msg.startswith("[rank"):
                    m = _TORCH_RANK.match(msg)
                    if m is not None:
                        meta["tp_rank"] = int(m.group(1))
                        msg = msg[m.end() :]
                        prefixed = True
                elif msg.startswith("[gpu"):
                    m = _GPU_TAG.match(msg)
                    if m is not None:
                        meta["tp_rank"] = int(m.group(1))
                        msg = msg[m.end() :]
                        prefixed = True
        elif first == "R" and msg.startswith("Rank "):
            m = _RANK_COLON.match(msg)
            if m is not None:
                meta["tp_rank"] = int(m.group(1))
                msg = msg[m.end() :]
                prefixed = True
        if not prefixed and "][" in msg:
            # A tqdm bar written without a newline before SGLang's line (case-18).
            g = _GLUED.search(msg)
            if g is not None:
                self._seen -= 1
                self._message(msg[g.start() :], meta, source, short, out)
                return
        if short is not None:
            if date is not None:
                meta["ts"] = f"{_year_for(short[0], date)}-{short[0]}-{short[1]}T{short[2]}"
            else:
                meta["ts"] = f"--{short[0]}-{short[1]}T{short[2]}"
        self._body(msg, meta, source, prefixed, out)

    def _body(self, msg: str, meta: dict[str, Any], source: Any, prefixed: bool, out: list[Event]) -> None:
        """Traceback grouping, then dispatch on the message's first six characters."""
        if self._held:
            held = self._held
            current = held.get(source)
            if current is not None:
                if not prefixed and current.continues(msg):
                    current.lines.append(meta["raw"])
                    current.last_seen = self._seen
                    if not msg or msg.isspace():
                        current.blank_tail.append(meta)
                    else:
                        current.blank_tail = []
                        current.tail_meta = meta
                    if len(current.lines) >= MAX_TRACEBACK_LINES:
                        self._close(source, out)
                    return
                self._close(source, out)
            if held:
                self._close_others(source, out)

        if msg[-1:] == ":" and (msg.endswith(_TB_HEAD) or msg.startswith("Exception in ")):
            # Hold this line: the frames of its traceback follow on the next lines.
            self._held[source] = _Held(meta, msg, self._seen)
            return

        handler = _HANDLERS.get(msg[:6])
        if handler is not None:
            event = handler(msg, meta)
            if event is not None:
                out.append(event)
                return
        for hint in _ERROR_HINTS:
            if hint in msg:
                category = _error_category(msg)
                if category is not None:
                    out.append(
                        _build(Error, meta, {"category": category, "message": msg, "lines": [meta["raw"]]})
                    )
                    return
                break
        out.append(_build(Log, meta, {"message": msg}))

    @staticmethod
    def _last_frame(msg: str) -> str:
        """A tqdm bar rewrites itself with `\\r`; keep SGLang's line if one hides in it, else the last frame."""
        frames = [f for f in msg.split("\r") if f.strip()]
        if not frames:
            return ""
        for frame in reversed(frames):
            if frame.startswith("[") or "][" in frame:
                g = _GLUED.search(frame)
                if g is not None:
                    return frame[g.start() :]
        return frames[-1]

    # -- tracebacks ---------------------------------------------------------------------------------

    def _close(self, source: Any, out: list[Event]) -> None:
        held = self._held.pop(source)
        blanks = held.blank_tail
        body = held.lines[: len(held.lines) - len(blanks)]
        text = "\n".join(body)
        category = _error_category(text, in_traceback=True) or "traceback"
        if category == "other":
            category = "traceback"
        meta = dict(held.meta)
        meta["raw"] = text
        tail_cursor = held.tail_meta.get("cursor")
        if tail_cursor is not None:
            # A follower resumes after the cursor it last saw: the error's is that of its last line.
            meta["cursor"] = tail_cursor
        message = held.summary or held.first_message
        out.append(_build(Error, meta, {"category": category, "message": message, "lines": body}))
        for blank_meta in blanks:
            out.append(_build(Log, blank_meta, {"message": ""}))

    def _close_others(self, source: Any, out: list[Event]) -> None:
        seen = self._seen
        for key in list(self._held):
            if key == source:
                continue
            held = self._held[key]
            # A rank's traceback interleaves with other ranks' lines; once its summary line is in, or
            # once it has gone quiet, it is over.
            if held.summary is not None or seen - held.last_seen >= STALE_TRACEBACK_LINES:
                self._close(key, out)

    # -- journal JSON ---------------------------------------------------------------------------------

    def _json(self, obj: dict[str, Any], out: list[Event]) -> None:
        meta: dict[str, Any] = {}
        host = _jtext(obj.get("_HOSTNAME")) or self._host
        if host is not None:
            meta["host"] = host
        pid = _jint(obj.get("_PID"))
        if pid is not None:
            meta["pid"] = pid
        cursor = _jtext(obj.get("__CURSOR"))
        if cursor is not None:
            meta["cursor"] = cursor
        realtime = _jint(obj.get("__REALTIME_TIMESTAMP"))
        if realtime is not None:
            meta["realtime_us"] = realtime
            ts = self._iso_utc(realtime)
            if ts is not None:
                meta["ts"] = ts
        ident = _jtext(obj.get("SYSLOG_IDENTIFIER"))
        is_systemd = ident == "systemd" or (pid == 1 and ident in (None, "systemd", "init"))
        unit = _jtext(obj.get("UNIT")) if is_systemd else None
        unit = unit or _jtext(obj.get("_SYSTEMD_UNIT"))
        if unit is not None:
            meta["systemd_unit"] = unit
        invocation = _jtext(obj.get("_SYSTEMD_INVOCATION_ID")) or _jtext(obj.get("INVOCATION_ID"))
        if invocation is not None:
            meta["invocation_id"] = invocation
        boot = _jtext(obj.get("_BOOT_ID"))
        if boot is not None:
            meta["boot_id"] = boot
        message = _jtext(obj.get("MESSAGE")) or ""
        if message[-1:] == "\n":
            message = message[:-1]
        lines = message.split("\n") if "\n" in message else [message]
        source = pid if pid is not None else ident
        for line in lines:
            line_meta = dict(meta)
            line_meta["raw"] = line
            if len(line) > MAX_PARSE_CHARS:
                self._seen += 1
                out.append(_build(Log, line_meta, {"message": line}))
                continue
            if "\x1b" in line:
                line = _ANSI.sub("", line)
            if is_systemd:
                self._systemd(line, line_meta, None, out)
            else:
                self._message(line, line_meta, source, None, out)

    def _iso_utc(self, realtime_us: int) -> str | None:
        seconds, micros = divmod(realtime_us, 1_000_000)
        cached_second, text = self._second_cache
        if seconds != cached_second:
            try:
                text = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
            except (OverflowError, OSError, ValueError):
                return None
            self._second_cache = (seconds, text)
        return f"{text}.{micros:06d}+00:00"


def parse_lines(lines: Iterable[str | bytes | dict[str, Any]], host: str | None = None) -> Iterator[Event]:
    """Events from journal items (text lines, JSON text or dicts; detected per item), flushed at the end.

    A list or tuple is parsed in chunks through `JournalParser.feed_many`; any other iterable one item at
    a time, so a live stream yields each line's events as soon as the line arrives. The events are
    handed on by `itertools.chain` rather than a generator: per event, that is C instead of bytecode.
    """
    parser = JournalParser(host)
    chunks = _chunked(lines) if isinstance(lines, list | tuple) else map(_single, lines)
    return chain(chain.from_iterable(map(parser.feed_many, chunks)), _flushed(parser))


def _chunked(lines: list[Any] | tuple[Any, ...]) -> Iterator[list[Any] | tuple[Any, ...]]:
    for start in range(0, len(lines), _CHUNK):
        yield lines[start : start + _CHUNK]


def _single(item: Any) -> tuple[Any]:
    return (item,)


def _flushed(parser: JournalParser) -> Iterator[Event]:
    """The parser's held events, once everything before has been read."""
    yield from parser.flush()


def parse_text(text: str) -> list[Event]:
    """Events from a whole journal dump. Splits on `\\n` only: a `\\r` inside a line is tqdm's, not a break."""
    if "\r\n" in text:
        text = text.replace("\r\n", "\n")
    if text.endswith("\n"):
        text = text[:-1]
    if not text:
        return []
    return list(parse_lines(text.split("\n")))
