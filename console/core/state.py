"""Folding events into the host's state, starting with its boots.

A *boot* is one life of the SGLang server: from its start to its stop (or to the end of what we have
read). Every event belongs to exactly one boot, so "errors since this boot" and "the pool of this boot"
are plain lookups. `HostState.apply(event)` is pure: it returns a new immutable state and never
touches the old one, so a screen can keep a snapshot while the fold moves on.

Boot boundaries (documented in docs/capacity-model.md, "Boots"):
  * a systemd unit start (`starting` / `started`) opens a new boot, unless the current boot has just
    been opened by the same start and holds nothing else yet;
  * a new journal `invocation_id` (JSON journal) or a new machine `boot_id` opens a new boot;
  * a new PID for a scheduler rank already seen in this boot (`TP0`, `DP1 TP1 EP1`, ...) opens a new
    boot: a rank keeps its process for the whole life of the server; only with a startup line (server
    args, distributed init, weights, KV pool, CUDA graphs, pool summary): a traffic, readiness or error
    line from a process the boot has not seen is another process of the unit (an ExecStartPost= shell),
    and so is a second "fired up" line from one;
  * a `server_args=` dump opens a new boot once the current one holds any SGLang line (the dump is
    the first line a server prints);
  * a second pool summary (`max_total_num_tokens=...`) or a second "fired up" line restarts the
    startup sequence: a new boot;
  * once a boot has stopped or failed, the next SGLang line opens a new boot, except an error or a
    line from a PID of the ended boot (a traceback the parser closes after the stop is still its own).
A stop (`stopping` / `stopped`) does not end a boot that holds nothing but unit lines: systemd prints
`Scheduled restart job` (a start) and then `Stopped` before the restart's `Starting` / `Started`.
A journal with SGLang lines but no unit line at all (a pasted excerpt) is one boot, opened by its first
event. Plain `log` lines never open a boot; they are counted in the current one. A line from a PID of the
previous boot that the current boot has not seen is a straggler and goes to the previous boot.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from console.core.events import (
    Audit,
    CudaGraph,
    DecodeBatch,
    DistInit,
    Dsv4Memory,
    Dsv4Pool,
    Error,
    Event,
    GpuXid,
    HttpAccess,
    KvCacheDtype,
    KvPoolAllocated,
    Log,
    MambaPoolAllocated,
    MemoryPoolEnd,
    PoolClamped,
    PoolSummary,
    PrefillBatch,
    ServerArgs,
    ServerReady,
    SwaPoolAllocated,
    SwaPoolSplit,
    Unit,
    WeightsBegin,
    WeightsLoaded,
)

BootPhase = Literal[
    "starting",
    "loading",
    "pool",
    "graphs",
    "scheduler_ready",
    "ready",
    "stopping",
    "stopped",
    "failed",
]
_STARTUP_ORDER: dict[str, int] = {
    "starting": 0,
    "loading": 1,
    "pool": 2,
    "graphs": 3,
    "scheduler_ready": 4,
    "ready": 5,
}
_ENDED: frozenset[str] = frozenset({"stopped", "failed"})

BootOpenedBy = Literal[
    "first_event",
    "unit_start",
    "invocation",
    "host_boot",
    "pid",
    "server_args",
    "startup_repeated",
    "after_stop",
]

_TRAFFIC = (PrefillBatch, DecodeBatch, HttpAccess)


def rank_key(event: Event) -> str | None:
    """`"TP0"`, `"DP1 TP1 EP1"`, ...: which scheduler process printed the line; None for the main process."""
    parts = [
        f"{label}{value}"
        for label, value in (
            ("DP", event.dp_rank),
            ("PP", event.pp_rank),
            ("ATTN_CP", event.attn_cp_rank),
            ("MOE_DP", event.moe_dp_rank),
            ("TP", event.tp_rank),
            ("EP", event.ep_rank),
        )
        if value is not None
    ]
    return " ".join(parts) or None


class Pool(BaseModel, defer_build=True):
    """What a boot showed about its KV pool."""

    model_config = ConfigDict(frozen=True)

    max_total_num_tokens: int | None = None
    """From the scheduler's summary line; authoritative when present."""
    kv_tokens: int | None = None
    """`#tokens` of the first `KV Cache is allocated` line (the full-attention pool of hybrid models)."""
    kv_lines: int = 0
    clamped_from: int | None = None
    """The profiled size when `--max-total-tokens` clamped the pool (`pool_clamped`)."""
    context_len: int | None = None
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    available_gpu_mem_gb: float | None = None
    """Free GPU memory (GiB) when the scheduler was ready: the headroom left at ready."""
    kv_gb: float | None = None
    """GiB of the first KV pool line (K + V, or the MLA latent): the target's first pool on one rank."""
    kv_dtype: str | None = None
    """The KV cache's torch dtype as SGLang printed it (`torch.float8_e4m3fnuz` on MI300X)."""

    # The pools of hybrid models (issue 32); each from the target's own lines, never the draft's.
    full_tokens: int | None = None
    """The full-attention pool of a sliding-window or DeepSeek-V4 model (`max_total_num_tokens`)."""
    swa_tokens: int | None = None
    """The sliding-window pool: tokens of the last window of each request (SWA layers, DSv4's SWA)."""
    swa_pool_gb: float | None = None
    """`SWAKVPool mem usage`: both pools of a sliding-window model together."""
    mamba_slots: int | None = None
    """`max_mamba_cache_size`: recurrent-state slots (a request holds one or more while it runs)."""
    mamba_gb: float | None = None
    """The mamba state pool (conv + SSM state), GiB per GPU: taken from the KV budget before the KV pool."""
    dsv4_bytes_per_full_token: float | None = None
    """DeepSeek-V4's bytes per full token across all its pools (full, SWA, c4, c128, states, indexer)."""
    dsv4_available_gb: float | None = None
    """DeepSeek-V4's pool budget after the slack, as it printed it."""
    dsv4_c4_tokens: int | None = None
    dsv4_c128_tokens: int | None = None
    draft_kv_tokens: int | None = None
    """The speculative draft worker's own KV pool (same token count as the target's, its own cell)."""
    draft_kv_gb: float | None = None
    draft_weights_gb: float | None = None
    """`mem usage` of the draft model's `Load weight end` (the rank's second weights line)."""

    @property
    def tokens(self) -> int | None:
        """The pool a request's context lives in: the summary's, else the full-attention pool of a
        sliding-window or DeepSeek-V4 model, else the first KV pool line."""
        if self.max_total_num_tokens is not None:
            return self.max_total_num_tokens
        return self.full_tokens if self.full_tokens is not None else self.kv_tokens


class Boot(BaseModel, defer_build=True):
    """One life of the server, with the events that belong to it."""

    model_config = ConfigDict(frozen=True)

    index: int
    opened_by: BootOpenedBy
    first_ts: str | None = None
    last_ts: str | None = None
    invocation_id: str | None = None
    boot_id: str | None = None
    unit: str | None = None
    phase: BootPhase = "starting"
    unit_result: str | None = None
    pids: dict[str, int] = Field(default_factory=dict)
    """Scheduler rank → PID seen in this boot."""
    seen_pids: frozenset[int] = frozenset()
    """Every PID that printed an SGLang line in this boot (ranks and the main process)."""
    events: tuple[Event, ...] = ()
    """Lifecycle, startup, pool and error events. Batch statistics, HTTP access lines and plain log
    lines are counted (`traffic_events`, `log_lines`), not kept: they grow without bound."""
    traffic_events: int = 0
    log_lines: int = 0
    server_args: dict[str, Any] | None = None
    pool: Pool = Field(default_factory=Pool)
    errors: tuple[Error, ...] = ()
    weights_begin_gb: dict[str, float] = Field(default_factory=dict)
    """Per rank: free GiB at the first `Load weight begin` (or `Load weight end` avail + usage)."""
    weights_end_gb: dict[str, float] = Field(default_factory=dict)
    """Per rank: free GiB at the last `Load weight end` before that rank's first KV pool."""
    ranks_with_pool: frozenset[str] = frozenset()
    ranks_pool_ended: frozenset[str] = frozenset()
    """Ranks that printed `Memory pool end`: their target pools are done; a KV line after it is the draft's."""
    weights_lines: dict[str, int] = Field(default_factory=dict)
    """Per rank: `Load weight end` lines seen; the second is the speculative draft model's."""
    summaries: int = 0
    ready_lines: int = 0

    @property
    def ended(self) -> bool:
        return self.phase in _ENDED

    @property
    def ready(self) -> bool:
        """The scheduler printed its pool summary (it is serving) or the server said it is fired up."""
        return self.phase in ("scheduler_ready", "ready")

    @property
    def pre_gib(self) -> float | None:
        """Free GPU memory before weights, min over ranks (SGLang's `pre`)."""
        return min(self.weights_begin_gb.values()) if self.weights_begin_gb else None

    @property
    def post_gib(self) -> float | None:
        """Free GPU memory after weights, min over ranks (SGLang's `post`)."""
        return min(self.weights_end_gb.values()) if self.weights_end_gb else None

    @property
    def mem_fraction_static(self) -> float | None:
        value = (self.server_args or {}).get("mem_fraction_static")
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    def arg(self, name: str) -> Any:
        """A server argument of this boot (`None` when the boot showed no `server_args` dump)."""
        return (self.server_args or {}).get(name)

    @property
    def name(self) -> str:
        """The boot as every screen and command names it: by the time of its first journal line (`boot
        03:19:50`). `index` is its place among the boots a reader happened to read (the console counts
        from the invocation it opened on, `verify` over its backlog): the console said boot #5 while
        `snapshot` said #0 of the same boot. Without a time, the index is all there is."""
        ts = self.first_ts
        if ts and "T" in ts:
            return f"boot {ts.split('T', 1)[1][:8]}"
        return f"boot #{self.index}"

    @property
    def fresh(self) -> bool:
        """Nothing but unit lines and log lines yet."""
        return all(isinstance(e, Unit) for e in self.events)


def _key(event: Event) -> str:
    return rank_key(event) or "main"


class HostState(BaseModel, defer_build=True):
    """The host's state as a fold of its events; `apply` returns a new state."""

    model_config = ConfigDict(frozen=True)

    boots: tuple[Boot, ...] = ()

    @classmethod
    def empty(cls) -> HostState:
        """The state before any event. The fold builds its states and boots from typed events without
        validating them (`model_construct`, `model_copy`), as it always updated them: validating builds
        the two models' schemas, the event union's with them, 45 ms at the start of every command that
        reads a journal (`plan`, `verify`, `apply`; docs/performance.md, "The command line's start")."""
        return cls.model_construct()

    @property
    def latest(self) -> Boot | None:
        return self.boots[-1] if self.boots else None

    def apply(self, event: Event) -> HostState:
        if isinstance(event, Audit | GpuXid):
            # from the host's state directory or its GPU sampler, not the journal: it belongs to no boot
            return self
        cur = self.latest
        if cur is not None and len(self.boots) >= 2 and _straggler(self.boots[-2], cur, event):
            prev = _add(self.boots[-2], event)
            return self.model_copy(update={"boots": (*self.boots[:-2], prev, cur)})
        opened = _opens_boot(cur, event)
        if opened is None:
            if cur is None:
                return self
            return self.model_copy(update={"boots": (*self.boots[:-1], _add(cur, event))})
        boot = Boot.model_construct(index=len(self.boots), opened_by=opened, first_ts=event.ts)
        return self.model_copy(update={"boots": (*self.boots, _add(boot, event))})

    def apply_all(self, events: Iterable[Event]) -> HostState:
        """`apply` for each event in turn. A busy server is mostly traffic (decode and prefill stats,
        access lines) and plain log lines, which a boot only counts: a run of them that opens no boot
        is folded into one copy of the state instead of one per line (the same result, measured 2.5x
        cheaper at 2,000 lines/s)."""
        state = self
        run: list[Event] = []
        for event in events:
            if isinstance(event, _QUIET):
                cur = state.latest
                if cur is not None and _opens_boot(cur, event) is None and not _straggles(state, event):
                    run.append(event)
                    continue
            if run:
                state = state._count(run)
                run = []
            state = state.apply(event)
        return state._count(run) if run else state

    def _count(self, run: list[Event]) -> HostState:
        """The current boot with a run of quiet events counted, as `apply` would one by one."""
        cur = self.latest
        assert cur is not None
        upd: dict[str, Any] = {}
        stamps = [e.ts for e in run if e.ts]
        if stamps:
            upd["last_ts"] = stamps[-1]
            if cur.first_ts is None:
                upd["first_ts"] = stamps[0]
        logs = sum(1 for e in run if isinstance(e, Log))
        if logs:
            upd["log_lines"] = cur.log_lines + logs
        if len(run) - logs:
            upd["traffic_events"] = cur.traffic_events + len(run) - logs
        return self.model_copy(update={"boots": (*self.boots[:-1], cur.model_copy(update=upd))})


def fold_boots(events: Iterable[Event]) -> list[Boot]:
    """Every boot in a stream of events, oldest first."""
    return list(HostState.empty().apply_all(events).boots)


_QUIET = (Log, *_TRAFFIC)


def _straggles(state: HostState, event: Event) -> bool:
    return len(state.boots) >= 2 and _straggler(state.boots[-2], state.boots[-1], event)


def _straggler(prev: Boot, cur: Boot, event: Event) -> bool:
    """A late line of the previous boot's processes (e.g. a traceback the parser closed after the restart)."""
    if isinstance(event, Unit | Log) or event.pid is None:
        return False
    return event.pid in prev.seen_pids and event.pid not in cur.seen_pids


def _opens_boot(cur: Boot | None, event: Event) -> BootOpenedBy | None:
    """Why `event` starts a new boot, or None when it belongs to `cur` (or to nothing)."""
    if isinstance(event, Log):
        return None
    if isinstance(event, Unit):
        if event.state not in ("starting", "started"):
            return None
        # With an ExecStartPost= readiness wait systemd says "Started" only once the server is ready:
        # that line closes the start of the running boot, it does not open another.
        if (
            event.state == "started"
            and cur is not None
            and not cur.ended
            and (event.invocation_id is None or cur.invocation_id in (None, event.invocation_id))
        ):
            return None
        if cur is not None and cur.opened_by == "unit_start" and cur.fresh and not cur.ended:
            return None
        return "unit_start"
    if cur is None:
        return "first_event"
    if cur.ended:
        # a dying process's last words (a traceback closed late) still belong to its boot
        if isinstance(event, Error) or (event.pid is not None and event.pid in cur.seen_pids):
            return None
        return "after_stop"
    if event.boot_id and cur.boot_id and event.boot_id != cur.boot_id:
        return "host_boot"
    if event.invocation_id and cur.invocation_id and event.invocation_id != cur.invocation_id:
        return "invocation"
    if _helper(cur, event):
        return None
    key = rank_key(event)
    if key is not None and event.pid is not None and cur.pids.get(key, event.pid) != event.pid:
        return "pid"
    if isinstance(event, ServerArgs) and not cur.fresh:
        return "server_args"
    if (isinstance(event, PoolSummary) and cur.summaries) or (
        isinstance(event, ServerReady) and cur.ready_lines
    ):
        return "startup_repeated"
    return None


_LIFE = (
    ServerArgs,
    DistInit,
    WeightsBegin,
    WeightsLoaded,
    KvPoolAllocated,
    MemoryPoolEnd,
    CudaGraph,
    PoolSummary,
    MambaPoolAllocated,
    SwaPoolSplit,
    SwaPoolAllocated,
    Dsv4Memory,
    Dsv4Pool,
    KvCacheDtype,
)
"""The lines a server prints while it starts: only these, from a process the boot has not seen, can be a
new server's (its ranks' weights, pool and graphs come before any traffic or readiness)."""


def _helper(cur: Boot, event: Event) -> bool:
    """A line from a process the boot has not seen that no starting server prints: another process of the
    unit (an ExecStartPre=/ExecStartPost= shell, a health check, a warm-up script echoing the server's
    lines). It belongs to the current boot and opens none: a readiness wait that prints a rank-tagged
    line after ready made `verify` say "not ready" (the line's new PID read as the rank's restart)."""
    seen = cur.seen_pids
    # A boot that has seen none of its processes yet (a journal begun mid-run) learns them from any line.
    return bool(seen) and event.pid is not None and event.pid not in seen and not isinstance(event, _LIFE)


def _kv_gb(event: KvPoolAllocated) -> float | None:
    """GiB of one KV pool line: K + V, or the single latent buffer of MLA."""
    if event.kv_size_gb is not None:
        return event.kv_size_gb
    if event.k_size_gb is not None and event.v_size_gb is not None:
        return round(event.k_size_gb + event.v_size_gb, 2)
    return None


def _advance(phase: BootPhase, to: BootPhase) -> BootPhase:
    if phase in _ENDED or phase == "stopping":
        return phase
    return to if _STARTUP_ORDER[to] > _STARTUP_ORDER[phase] else phase


def _add(boot: Boot, event: Event) -> Boot:
    """`boot` with `event` folded in."""
    upd: dict[str, Any] = {"last_ts": event.ts or boot.last_ts}
    if boot.first_ts is None and event.ts:
        upd["first_ts"] = event.ts
    if isinstance(event, Log):
        upd["log_lines"] = boot.log_lines + 1
        return boot.model_copy(update=upd)
    if isinstance(event, _TRAFFIC):
        upd["traffic_events"] = boot.traffic_events + 1
        return boot.model_copy(update=upd)

    upd["events"] = (*boot.events, event)
    # A helper's PID is not the boot's: its next line would read as a rank's restart.
    if not isinstance(event, Unit) and not _helper(boot, event):
        for name in ("invocation_id", "boot_id"):
            if getattr(boot, name) is None and getattr(event, name):
                upd[name] = getattr(event, name)
        key = rank_key(event)
        if key is not None and event.pid is not None and key not in boot.pids:
            upd["pids"] = {**boot.pids, key: event.pid}
        if event.pid is not None and event.pid not in boot.seen_pids:
            upd["seen_pids"] = boot.seen_pids | {event.pid}
    if boot.unit is None and event.systemd_unit:
        upd["unit"] = event.systemd_unit

    phase = boot.phase
    pool = boot.pool
    if isinstance(event, Unit):
        # systemd's `Scheduled restart job` (a start) is followed by `Stopped`: a boot that holds
        # nothing but unit lines is not ended by a stop, only by a failure.
        if event.state == "failed" or (event.state in ("stopping", "stopped") and not boot.fresh):
            phase = event.state
            upd["unit_result"] = event.result or boot.unit_result
    elif isinstance(event, ServerArgs):
        upd["server_args"] = dict(event.args)
    elif isinstance(event, DistInit):
        phase = _advance(phase, "loading")
    elif isinstance(event, WeightsBegin):
        phase = _advance(phase, "loading")
        key = _key(event)
        if event.avail_mem_gb is not None and key not in boot.weights_begin_gb:
            upd["weights_begin_gb"] = {**boot.weights_begin_gb, key: event.avail_mem_gb}
    elif isinstance(event, WeightsLoaded):
        phase = _advance(phase, "loading")
        key = _key(event)
        seen = boot.weights_lines.get(key, 0) + 1
        upd["weights_lines"] = {**boot.weights_lines, key: seen}
        if seen >= 2 and event.mem_usage_gb is not None and pool.draft_weights_gb is None:
            # Every worker loads its model once: a rank's second weights line is the draft model's
            # (before the target's pools from v0.5.14, after them before).
            pool = pool.model_copy(update={"draft_weights_gb": event.mem_usage_gb})
        if event.avail_mem_gb is not None and key not in boot.ranks_with_pool:
            upd["weights_end_gb"] = {**boot.weights_end_gb, key: event.avail_mem_gb}
            if key not in boot.weights_begin_gb and event.mem_usage_gb is not None:
                # "mem usage" is (free at load begin) - (free at load end) on this rank.
                begin = round(event.avail_mem_gb + event.mem_usage_gb, 2)
                upd["weights_begin_gb"] = {**boot.weights_begin_gb, key: begin}
    elif isinstance(event, KvPoolAllocated):
        phase = _advance(phase, "pool")
        key = _key(event)
        upd["ranks_with_pool"] = boot.ranks_with_pool | {key}
        size = _kv_gb(event)
        if key in boot.ranks_pool_ended or event.label == "draft":
            # The rank's target pools ended with `Memory pool end`: this pool is the draft worker's.
            if pool.draft_kv_tokens is None:
                pool = pool.model_copy(update={"draft_kv_tokens": event.tokens, "draft_kv_gb": size})
        elif event.tokens is not None and event.label in (None, "Full") and pool.kv_tokens is None:
            pool = pool.model_copy(update={"kv_tokens": event.tokens, "kv_gb": size})
        if event.dtype and pool.kv_dtype is None:
            pool = pool.model_copy(update={"kv_dtype": event.dtype})
        pool = pool.model_copy(update={"kv_lines": pool.kv_lines + 1})
    elif isinstance(event, KvCacheDtype):
        if event.dtype and pool.kv_dtype is None:
            pool = pool.model_copy(update={"kv_dtype": event.dtype})
    elif isinstance(event, MambaPoolAllocated):
        phase = _advance(phase, "pool")
        if pool.mamba_slots is None and _key(event) not in boot.ranks_pool_ended:
            parts = [x for x in (event.conv_state_gb, event.ssm_state_gb) if x is not None]
            pool = pool.model_copy(
                update={"mamba_slots": event.slots, "mamba_gb": round(sum(parts), 2) if parts else None}
            )
    elif isinstance(event, SwaPoolSplit):
        phase = _advance(phase, "pool")
        if pool.swa_tokens is None:
            pool = pool.model_copy(update={"full_tokens": event.full_tokens, "swa_tokens": event.swa_tokens})
    elif isinstance(event, SwaPoolAllocated):
        phase = _advance(phase, "pool")
        if pool.swa_pool_gb is None and _key(event) not in boot.ranks_pool_ended:
            pool = pool.model_copy(
                update={
                    "swa_pool_gb": event.mem_usage_gb,
                    "full_tokens": pool.full_tokens if pool.full_tokens is not None else event.full_tokens,
                    "swa_tokens": pool.swa_tokens if pool.swa_tokens is not None else event.swa_tokens,
                }
            )
    elif isinstance(event, Dsv4Memory):
        phase = _advance(phase, "pool")
        if pool.dsv4_bytes_per_full_token is None:
            pool = pool.model_copy(
                update={
                    "dsv4_bytes_per_full_token": event.bytes_per_full_token,
                    "dsv4_available_gb": event.available_gb,
                    "full_tokens": event.full_tokens,
                }
            )
    elif isinstance(event, Dsv4Pool):
        phase = _advance(phase, "pool")
        if _key(event) not in boot.ranks_pool_ended and pool.dsv4_c4_tokens is None:
            update: dict[str, Any] = {
                "swa_tokens": event.swa_tokens,
                "dsv4_c4_tokens": event.c4_tokens,
                "dsv4_c128_tokens": event.c128_tokens,
            }
            if event.full_tokens is not None:
                # `DSV4 pool sizes: full=…` (v0.5.12+) follows the budget line; with a constraint
                # (`--max-total-tokens`) it is printed again, smaller: the last one is the pool.
                update["full_tokens"] = event.full_tokens
            pool = pool.model_copy(update=update)
    elif isinstance(event, MemoryPoolEnd):
        phase = _advance(phase, "pool")
        upd["ranks_pool_ended"] = boot.ranks_pool_ended | {_key(event)}
    elif isinstance(event, CudaGraph):
        phase = _advance(phase, "graphs")
    elif isinstance(event, PoolClamped):
        pool = pool.model_copy(update={"clamped_from": event.profiled})
    elif isinstance(event, PoolSummary):
        phase = _advance(phase, "scheduler_ready")
        upd["summaries"] = boot.summaries + 1
        pool = pool.model_copy(
            update={
                "max_total_num_tokens": event.max_total_num_tokens,
                "context_len": event.context_len,
                "max_running_requests": event.max_running_requests,
                "chunked_prefill_size": event.chunked_prefill_size,
                "available_gpu_mem_gb": event.available_gpu_mem_gb,
            }
        )
    elif isinstance(event, ServerReady):
        phase = _advance(phase, "ready")
        upd["ready_lines"] = boot.ready_lines + 1
    elif isinstance(event, Error):
        upd["errors"] = (*boot.errors, event)
    upd["phase"] = phase
    upd["pool"] = pool
    return boot.model_copy(update=upd)
