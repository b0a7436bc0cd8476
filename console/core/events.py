"""Typed events: one frozen dataclass per thing an SGLang host says, serialised through pydantic.

Field names follow SGLang's own words. SGLang prints "GB" where it means GiB; the numbers are kept
exactly as printed (no unit conversion), so `avail_mem_gb` is the GiB figure from the line.

Every event carries the common fields of `EventBase`. Journal metadata (`cursor`, `systemd_unit`,
`invocation_id`, `boot_id`) is filled when the line came from `journalctl -o json`; it is what lets a
follower resume without loss or repetition and lets the state fold events into boots.

Why dataclasses and not pydantic models (issue 19): the parser makes one event per journal line, and
validating each one cost a third of the line (docs/performance.md). The parser's handlers type every
value themselves, so it builds events with `EventBase.of` and no validation; pydantic validates events
where they come from outside (`event_from_json`, `event_adapter()`, `model_validate`) and serialises them
(`model_dump_json`): pydantic reads stdlib dataclasses through its public `TypeAdapter`, and the JSON
form is the one the pydantic models gave, byte for byte (tests/test_parser_contract.py). Events keep
the few model methods the rest of the code uses (`model_dump_json`, `model_dump`, `model_copy`,
`model_validate`, `model_validate_json`), each through the event class's `TypeAdapter`. As fields of
pydantic models (a boot's events, the snapshot's tail) they are taken as they are, not copied.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, TypeAdapter, with_config

from console.core.ranges import (
    MAX_COUNT,
    MAX_GIB,
    MAX_SECONDS,
    MAX_THROUGHPUT,
    MAX_TOKENS,
    MAX_USAGE,
    MIN_MEM_USAGE_GIB,
)

_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}
_new = object.__new__
_setattr = object.__setattr__


def _adapter(cls: type[Any]) -> TypeAdapter[Any]:
    """The class's own adapter, made on first use (17 of them at import would slow every command's start)."""
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


# The sane range of each number an SGLang message carries (console.core.ranges, where the parser
# turns a line outside it into an `out_of_range` error): validated wherever an event comes from outside.
GiB = Annotated[float, Field(ge=0.0, le=MAX_GIB)]
UsageGiB = Annotated[float, Field(ge=MIN_MEM_USAGE_GIB, le=MAX_GIB)]
Seconds = Annotated[float, Field(ge=0.0, le=MAX_SECONDS)]
PoolTokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Rate = Annotated[float, Field(ge=0.0, le=MAX_THROUGHPUT)]
Usage = Annotated[float, Field(ge=0.0, le=MAX_USAGE)]


@with_config(ConfigDict(extra="forbid"))
@dataclass(frozen=True, kw_only=True)
class EventBase:
    """What every event carries: when, where and by which rank it was said, the line itself, and the journal's
    metadata. (Each event class has a docstring, and not for show alone: a dataclass without one gets one made
    from `inspect.signature`, which cost every command that imports the events ~3 ms.)"""

    ts: str | None = None
    """ISO 8601 time of the line (journal time when known, else the time printed in the line).

    Forms, by source: journal JSON `2026-05-30T22:00:23.123456+00:00` (UTC, from the realtime stamp);
    SGLang's own `[2026-05-30 22:00:23 TP0]` prefix `2026-05-30T22:00:23` (host-local, no offset);
    journald `short` text borrows the year of the SGLang stamp on the same line and, without one, keeps
    the yearless ISO 8601 month-day form `--05-30T22:00:23` rather than guessing a year; the old
    `[HH:MM:SS TPn]` prefix gives a bare time `23:17:01`.
    """
    host: str | None = None
    pid: int | None = None
    tp_rank: int | None = None
    dp_rank: int | None = None
    ep_rank: int | None = None
    pp_rank: int | None = None
    attn_cp_rank: int | None = None
    moe_dp_rank: int | None = None
    raw: str = ""
    """The line as received (the journal MESSAGE, or the text line)."""

    cursor: str | None = None
    realtime_us: int | None = None
    systemd_unit: str | None = None
    invocation_id: str | None = None
    boot_id: str | None = None

    @classmethod
    def of(cls, fields: dict[str, Any]) -> Self:
        """The event holding `fields`, already typed, without validation: the parser's constructor.

        The dict becomes the instance's own (the caller gives it up), as `copy` and `pickle` restore an
        instance; a field it lacks reads the class default, which a dataclass keeps as a class attribute.
        So `fields` must hold every field without a plain default: the required ones and those with a
        default factory (`args`, `lines`, `diff`, `durations`). The generated `__init__` would cost more
        than the rest of a line: a frozen dataclass sets each of the 25 fields through
        `object.__setattr__` (docs/performance.md)."""
        event = _new(cls)
        # What a frozen dataclass's own `__init__` does, field by field: `object.__setattr__`.
        _setattr(event, "__dict__", fields)
        return event

    def model_dump_json(self, *, exclude_none: bool = False, indent: int | None = None) -> str:
        return _adapter(type(self)).dump_json(self, exclude_none=exclude_none, indent=indent).decode()

    def model_dump(
        self, *, mode: Literal["python", "json"] = "python", exclude_none: bool = False
    ) -> dict[str, Any]:
        dumped: dict[str, Any] = _adapter(type(self)).dump_python(self, mode=mode, exclude_none=exclude_none)
        return dumped

    def model_copy(self, *, update: Mapping[str, Any] | None = None) -> Self:
        """A copy with `update`'s fields changed, not validated (as pydantic's `model_copy`)."""
        return dataclasses.replace(self, **(update or {}))

    @classmethod
    def model_validate(cls, obj: Any) -> Self:
        validated: Self = _adapter(cls).validate_python(obj)
        return validated

    @classmethod
    def model_validate_json(cls, data: str | bytes) -> Self:
        validated: Self = _adapter(cls).validate_json(data)
        return validated


@dataclass(frozen=True, kw_only=True)
class ServerArgs(EventBase):
    """`server_args=ServerArgs(...)`: the flags the server started with, as SGLang printed them."""

    kind: Literal["server_args"] = "server_args"
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class DistInit(EventBase):
    """`Init torch distributed begin.` / `Init torch distributed ends. mem usage=X GB`."""

    kind: Literal["dist_init"] = "dist_init"
    phase: Literal["begin", "end"]
    mem_usage_gb: UsageGiB | None = None
    elapsed_s: Seconds | None = None


@dataclass(frozen=True, kw_only=True)
class WeightsBegin(EventBase):
    """`Load weight begin. avail mem=X GB`."""

    kind: Literal["weights_begin"] = "weights_begin"
    avail_mem_gb: GiB | None = None


@dataclass(frozen=True, kw_only=True)
class WeightsLoaded(EventBase):
    """`Load weight end. type=…, dtype=…, avail mem=X GB, mem usage=Y GB.` (with the time it took when printed)."""

    kind: Literal["weights_loaded"] = "weights_loaded"
    avail_mem_gb: GiB | None = None
    mem_usage_gb: UsageGiB | None = None
    elapsed_s: Seconds | None = None
    model_type: str | None = None
    dtype: str | None = None
    quant: str | None = None


@dataclass(frozen=True, kw_only=True)
class KvPoolAllocated(EventBase):
    """`KV Cache is allocated. #tokens: N, K size: X GB, V size: Y GB` (or `KV size:` for MLA): the KV pool."""

    kind: Literal["kv_pool_allocated"] = "kv_pool_allocated"
    tokens: PoolTokens | None = None
    k_size_gb: GiB | None = None
    v_size_gb: GiB | None = None
    kv_size_gb: GiB | None = None
    dtype: str | None = None
    label: str | None = None
    """`Full`, `SWA`, ... when SGLang names the pool (0.5.23 hybrid models); None for the plain pool."""


@dataclass(frozen=True, kw_only=True)
class MemoryPoolEnd(EventBase):
    """`Memory pool end. avail mem=X GB`: what the GPU has left once every pool is allocated."""

    kind: Literal["memory_pool_end"] = "memory_pool_end"
    avail_mem_gb: GiB | None = None


@dataclass(frozen=True, kw_only=True)
class MambaPoolAllocated(EventBase):
    """`Mamba Cache is allocated. max_mamba_cache_size: N, conv_state size: X GB, ssm_state size: Y GB`:
    the recurrent-state pool of a hybrid linear-attention model, one slot per request it holds. (With
    speculative decoding SGLang adds the draft's intermediate caches to the line; they are not read.)"""

    kind: Literal["mamba_pool_allocated"] = "mamba_pool_allocated"
    slots: Annotated[int, Field(ge=1, le=MAX_COUNT)] | None = None
    conv_state_gb: GiB | None = None
    ssm_state_gb: GiB | None = None


@dataclass(frozen=True, kw_only=True)
class SwaPoolSplit(EventBase):
    """`Use sliding window memory pool. full_layer_tokens=N, swa_layer_tokens=M` (or `(all SWA).
    swa_layer_tokens=M`): how a sliding-window model's budget was split between its two pools."""

    kind: Literal["swa_pool_split"] = "swa_pool_split"
    full_tokens: Count | None = None
    swa_tokens: Count | None = None


@dataclass(frozen=True, kw_only=True)
class SwaPoolAllocated(EventBase):
    """`SWAKVPool mem usage: X GB, swa size: M, full size: N`: both pools of a sliding-window model."""

    kind: Literal["swa_pool_allocated"] = "swa_pool_allocated"
    mem_usage_gb: GiB | None = None
    swa_tokens: Count | None = None
    full_tokens: Count | None = None


@dataclass(frozen=True, kw_only=True)
class Dsv4Memory(EventBase):
    """`DSv4 memory calculation: bytes_per_full_token=B, available_bytes=X GB, full_token=N`: DeepSeek-V4's
    budget (X GiB, after the slack) divided by its bytes per full token (every pool's share of one token)."""

    kind: Literal["dsv4_memory"] = "dsv4_memory"
    bytes_per_full_token: Annotated[float, Field(ge=0.0, le=1e9)] | None = None
    available_gb: GiB | None = None
    full_tokens: Count | None = None
    c128_state_fixed_gb: GiB | None = None
    swa_fixed_gb: GiB | None = None


@dataclass(frozen=True, kw_only=True)
class Dsv4Pool(EventBase):
    """DeepSeek-V4's pools: `Initialize DeepSeekV4TokenToKVPool with max_num_reqs=R swa_size=… c4_size=…
    c128_size=… c4_state_pool_size=… c128_state_pool_size=…` or `DSV4 pool sizes: full=…, swa=…, c4=…,
    c128=…, c4_state=…, c128_state=…` (v0.5.12+)."""

    kind: Literal["dsv4_pool"] = "dsv4_pool"
    max_num_reqs: Count | None = None
    full_tokens: Count | None = None
    swa_tokens: Count | None = None
    c4_tokens: Count | None = None
    c128_tokens: Count | None = None
    c4_state_tokens: Count | None = None
    c128_state_tokens: Count | None = None


@dataclass(frozen=True, kw_only=True)
class KvCacheDtype(EventBase):
    """`Using KV cache dtype: torch.float8_e4m3fnuz` (≤ v0.5.12; later the KV line carries `dtype:`)."""

    kind: Literal["kv_cache_dtype"] = "kv_cache_dtype"
    dtype: str = ""


@dataclass(frozen=True, kw_only=True)
class CudaGraph(EventBase):
    """`Capture cuda graph begin. … avail mem=X GB` / `Capture cuda graph end. Time elapsed: T s. mem usage=Y GB.`"""

    kind: Literal["cuda_graph"] = "cuda_graph"
    phase: Literal["begin", "end"]
    avail_mem_gb: GiB | None = None
    mem_usage_gb: UsageGiB | None = None
    elapsed_s: Seconds | None = None
    graph: str | None = None
    """What was captured when the line says so: `decode`, `piecewise`, `draft`, `draft extend`, ..."""


@dataclass(frozen=True, kw_only=True)
class PoolSummary(EventBase):
    """`max_total_num_tokens=N, chunked_prefill_size=…, max_prefill_tokens=…, max_running_requests=…, context_len=…,
    available_gpu_mem=X GB`: the pool the scheduler runs with (the figure the capacity gauge reads)."""

    kind: Literal["pool_summary"] = "pool_summary"
    max_total_num_tokens: PoolTokens
    chunked_prefill_size: Annotated[int, Field(ge=-1, le=MAX_TOKENS)] | None = None
    max_prefill_tokens: PoolTokens | None = None
    max_running_requests: Annotated[int, Field(ge=1, le=MAX_COUNT)] | None = None
    context_len: PoolTokens | None = None
    available_gpu_mem_gb: GiB | None = None


@dataclass(frozen=True, kw_only=True)
class PoolClamped(EventBase):
    """`max_total_tokens=N is larger than the profiled value M`: `--max-total-tokens` asked for more than
    memory holds, and SGLang used the profiled value (negative when the weights alone exceed the budget)."""

    kind: Literal["pool_clamped"] = "pool_clamped"
    requested: Annotated[int, Field(ge=1, le=2**63 - 1)]
    profiled: Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]


@dataclass(frozen=True, kw_only=True)
class ServerReady(EventBase):
    """`The server is fired up and ready to roll!`."""

    kind: Literal["server_ready"] = "server_ready"


@dataclass(frozen=True, kw_only=True)
class PrefillBatch(EventBase):
    """`Prefill batch. #new-seq: …, #new-token: …, #cached-token: …, token usage: …, #running-req: …, #queue-req: …`."""

    kind: Literal["prefill_batch"] = "prefill_batch"
    new_seq: Count | None = None
    new_token: Count | None = None
    cached_token: Count | None = None
    token_usage: Usage | None = None
    running_req: Count | None = None
    queue_req: Count | None = None
    input_throughput: Rate | None = None
    cuda_graph: bool | None = None
    full_token_usage: Usage | None = None
    """Hybrid models: the full-attention pool's usage (also in `token_usage` when the line has no other)."""
    swa_token_usage: Usage | None = None
    mamba_usage: Usage | None = None


@dataclass(frozen=True, kw_only=True)
class DecodeBatch(EventBase):
    """`Decode batch. #running-req: …, #token: …, token usage: …, gen throughput (token/s): …, #queue-req: …`."""

    kind: Literal["decode_batch"] = "decode_batch"
    running_req: Count | None = None
    num_tokens: Count | None = None
    token_usage: Usage | None = None
    gen_throughput: Rate | None = None
    queue_req: Count | None = None
    accept_len: Annotated[float, Field(ge=0.0, le=1024.0)] | None = None
    accept_rate: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    cuda_graph: bool | None = None
    full_token_usage: Usage | None = None
    """Hybrid models: the full-attention pool's usage (also in `token_usage` when the line has no other)."""
    swa_token_usage: Usage | None = None
    swa_tokens: Count | None = None
    mamba_usage: Usage | None = None
    mamba_num: Count | None = None
    """Mamba slots held (`mamba num`), several per running request with the radix cache."""


@dataclass(frozen=True, kw_only=True)
class HttpAccess(EventBase):
    """An HTTP access line (`127.0.0.1:54321 - "GET /health HTTP/1.1" 200`): the console's own polls among them."""

    kind: Literal["http_access"] = "http_access"
    method: str
    path: str
    status: Annotated[int, Field(ge=100, le=599)] | None = None
    client: str | None = None


ErrorCategory = Literal[
    "cuda_oom",
    "not_enough_memory",
    "cuda_graph_failed",
    "nccl_timeout",
    "watchdog_timeout",
    "scheduler_exception",
    "sigquit",
    "traceback",
    "out_of_range",
    "other",
]
"""`out_of_range`: a number in a line that no host can print (a pool of -5 tokens); the line is kept
here instead of the event it claimed to be (console.core.ranges)."""


@dataclass(frozen=True, kw_only=True)
class Error(EventBase):
    """An error line, or a whole traceback, in one of the categories an operator acts on."""

    kind: Literal["error"] = "error"
    category: ErrorCategory
    message: str
    lines: list[str] = field(default_factory=list)
    """All journal lines of a multi-line error (a traceback), in order; `[raw]` for a one-line error."""


@dataclass(frozen=True, kw_only=True)
class Unit(EventBase):
    """systemd's own line about the unit (`Starting …`, `Started …`, `Stopping …`, `… failed with result …`)."""

    kind: Literal["unit"] = "unit"
    state: Literal["starting", "started", "stopping", "stopped", "failed"]
    result: str | None = None
    message: str = ""
    restart_counter: int | None = None
    """systemd's restart counter from `Scheduled restart job, restart counter is at N.` (state `starting`)."""


@dataclass(frozen=True, kw_only=True)
class Log(EventBase):
    """Any other line: kept for the feed, read for nothing."""

    kind: Literal["log"] = "log"
    message: str = ""


AuditAction = Literal["apply", "restart", "rollback", "probe", "lock_break", "confirm"]
AuditOutcome = Literal["ok", "failed", "rolled_back", "refused", "aborted", "started", "interrupted"]
"""`started` is an intent written before a change, `interrupted` its outcome when a signal stopped it."""


@dataclass(frozen=True, kw_only=True)
class Audit(EventBase):
    """One line of the host's `audit.jsonl` (see `console.core.audit.AuditEntry`), on the event feed.

    `host` and `ts` are the common fields; `message` (and `raw`) hold the one-line rendering the feed shows.
    It comes from the host's state directory, not from the journal, so it belongs to no boot.
    """

    kind: Literal["audit"] = "audit"
    action: AuditAction
    user: str
    jump_host: str | None = None
    console_id: str | None = None
    profile: str | None = None
    diff: list[str] = field(default_factory=list)
    outcome: AuditOutcome
    summary: str = ""
    durations: dict[str, float] = field(default_factory=dict)
    total_s: float | None = None
    pool_tokens: int | None = None
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class GpuXid(EventBase):
    """An XID critical error the host's GPU driver reported (NVML's event set, read by the GPU agent or
    local NVML), on the feed. It comes from the GPU sampler, not the journal: it belongs to no boot.

    `ts` is when the driver reported it (on the console's clock); `message` (and `raw`) the feed's line,
    `GPU3 XID 79: GPU has fallen off the bus (…)`, in the words of `console.core.gpuhealth.XID_MEANINGS`."""

    kind: Literal["gpu_xid"] = "gpu_xid"
    gpu: Annotated[int, Field(ge=0, le=1024)] | None = None
    """The GPU's index on its host."""
    uuid: str | None = None
    xid: Annotated[int, Field(ge=0, le=65_535)]
    meaning: str | None = None
    """What the XID means, for the common ones; None for an XID the table does not hold."""
    severity: Literal["critical", "warning"] = "critical"
    """`warning` for the XIDs that are most often the application's (13, 31, 43, 45) or a recorded,
    contained memory event (63, 92); `critical` where the GPU itself needs attention."""
    message: str = ""


Event = Annotated[
    ServerArgs
    | DistInit
    | WeightsBegin
    | WeightsLoaded
    | KvPoolAllocated
    | MemoryPoolEnd
    | MambaPoolAllocated
    | SwaPoolSplit
    | SwaPoolAllocated
    | Dsv4Memory
    | Dsv4Pool
    | KvCacheDtype
    | CudaGraph
    | PoolSummary
    | PoolClamped
    | ServerReady
    | PrefillBatch
    | DecodeBatch
    | HttpAccess
    | Error
    | Unit
    | Log
    | Audit
    | GpuXid,
    Field(discriminator="kind"),
]


@functools.cache
def event_adapter() -> TypeAdapter[Event]:
    """The adapter of the `Event` union, made on first use: building it costs ~40 ms, which a command that
    reads no events (`profiles list`, `completion --names`) should not pay at start."""
    return TypeAdapter(Event)


EVENT_TYPES: dict[str, type[EventBase]] = {
    cls.kind: cls
    for cls in (
        ServerArgs,
        DistInit,
        WeightsBegin,
        WeightsLoaded,
        KvPoolAllocated,
        MemoryPoolEnd,
        MambaPoolAllocated,
        SwaPoolSplit,
        SwaPoolAllocated,
        Dsv4Memory,
        Dsv4Pool,
        KvCacheDtype,
        CudaGraph,
        PoolSummary,
        PoolClamped,
        ServerReady,
        PrefillBatch,
        DecodeBatch,
        HttpAccess,
        Error,
        Unit,
        Log,
        Audit,
        GpuXid,
    )
}
"""Each kind's event class."""

EVENT_KINDS: tuple[str, ...] = (
    "server_args",
    "dist_init",
    "weights_begin",
    "weights_loaded",
    "kv_pool_allocated",
    "memory_pool_end",
    "mamba_pool_allocated",
    "swa_pool_split",
    "swa_pool_allocated",
    "dsv4_memory",
    "dsv4_pool",
    "kv_cache_dtype",
    "cuda_graph",
    "pool_summary",
    "pool_clamped",
    "server_ready",
    "prefill_batch",
    "decode_batch",
    "http_access",
    "error",
    "unit",
    "log",
    "audit",
    "gpu_xid",
)


def event_from_json(data: str | bytes) -> Event:
    """Read back one event written by `event.model_dump_json()`."""
    return event_adapter().validate_json(data)
