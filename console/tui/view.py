"""What the dashboard shows, computed from a `HostSnapshot` without Textual, clocks or I/O.

The widgets only lay these figures out; keeping the arithmetic here lets the tests check the numbers
without a terminal, and lets a snapshot test pin every figure by pinning the snapshot.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import TypeVar

from rich.console import Group
from rich.style import Style
from rich.text import Span, Text

from console.core.capacity import DEFAULT_MIN_HEADROOM_GIB, MAMBA_SLOTS_PER_REQUEST
from console.core.events import (
    CudaGraph,
    DecodeBatch,
    Dsv4Memory,
    Dsv4Pool,
    Event,
    KvPoolAllocated,
    MambaPoolAllocated,
    MemoryPoolEnd,
    PrefillBatch,
    SwaPoolAllocated,
    Unit,
    WeightsLoaded,
)
from console.core.gpuhealth import faults, health_json
from console.core.gpus import SamplerState
from console.core.pools import PoolReading, pool_readings
from console.core.restart import BOOT, PHASE_LABELS, Phase, RestartMachine
from console.core.snapshot import HostSnapshot
from console.core.state import Boot, HostState, Pool, rank_key
from console.core.text import terminal_safe
from console.tui.themes import palette

MIB_PER_GIB = 1024.0


@lru_cache(maxsize=256)
def rich_style(name: str) -> Style:
    """A Rich style object for a Rich style name. A Text whose own style is a string is parsed again
    by Textual at every render with its own colour names, which lack Rich's `grey62`, `yellow3`...:
    each such miss computed a did-you-mean suggestion (~2 ms) and drew the default colour."""
    return Style.parse(name)


_R = TypeVar("_R")


def outside_text(text: object, style: str | Style = "") -> Text:
    """Text from outside (a host, a file) as Textual must get it: a Rich `Text`, never markup, drawn
    safe (`terminal_safe`, line breaks kept)."""
    return Text(terminal_safe(text, keep_newlines=True), style=style)


def markup_literal(text: object) -> str:
    """`text` drawn safe and written as Textual markup that reads back as exactly that text, for the
    few places Textual reads a string only as markup (a command palette entry's help). Textual's own
    `escape` leaves `[/` and a trailing backslash as they are, which then fail to parse."""
    return terminal_safe(text).replace("[", "\\[")


def textual_text(renderable: _R) -> _R:
    """Hand Textual a Rich `Text` with its styles as Rich `Style` objects (see `rich_style`): Textual
    turns a Text into its own content and parses string styles with its own colour names, so `grey50`
    or `green3` in help markup came out in the default colour and cost a did-you-mean search at every
    render. The Texts of a Group are handled alike; other renderables are drawn by Rich itself and pass
    through.

    The text itself is drawn safe here (`terminal_safe`, line breaks kept): a Text is never read as
    markup, but Rich passes ESC and the bidi and zero-width characters to the terminal as they are, and
    much of what a widget shows quotes the host. One character for one, so the spans stay where they were."""
    if isinstance(renderable, Group):
        for part in renderable.renderables:
            textual_text(part)
        return renderable
    if not isinstance(renderable, Text):
        return renderable
    plain = renderable.plain
    if not plain.isprintable():
        renderable.plain = terminal_safe(plain, keep_newlines=True)
    if isinstance(renderable.style, str) and renderable.style:
        renderable.style = rich_style(renderable.style)
    if any(isinstance(span.style, str) for span in renderable.spans):
        renderable.spans = [
            Span(span.start, span.end, rich_style(span.style)) if isinstance(span.style, str) else span
            for span in renderable.spans
        ]
    return renderable


# ---- boots -----------------------------------------------------------------------------------------


def display_boot(state: HostState) -> Boot | None:
    """The boot the dashboard describes.

    A unit whose start waits for readiness (`ExecStartPost=` polling /health) logs `Started` after the
    server is up; the fold then opens a boot that holds nothing but that line. Showing that empty boot
    would blank the pool and the GPU breakdown of a healthy server, so it is skipped while the boot before
    it is still alive.
    """
    boots = state.boots
    if not boots:
        return None
    latest = boots[-1]
    if len(boots) >= 2 and not boots[-2].ended and latest.fresh:  # noqa: SIM102
        if all(isinstance(e, Unit) and e.state == "started" for e in latest.events):
            return boots[-2]
    return latest


# ---- time ------------------------------------------------------------------------------------------


def event_time(event: Event) -> float | None:
    """Seconds of an event's time (journal realtime when known, else its printed ISO time)."""
    if event.realtime_us is not None:
        return event.realtime_us / 1e6
    if not event.ts or event.ts.startswith("--") or "T" not in event.ts:
        return None
    try:
        stamp = datetime.fromisoformat(event.ts)
    except ValueError:
        return None
    if stamp.tzinfo is None:
        # Printed host-local time without an offset: only differences between events are used.
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def clock_text(event: Event) -> str:
    """`HH:MM:SS` of an event, in the host's own printed time when there is one."""
    if event.ts and "T" in event.ts:
        return event.ts.split("T", 1)[1][:8]
    if event.ts and len(event.ts) >= 8 and event.ts[2] == ":":
        return event.ts[:8]
    if event.realtime_us is not None:
        return datetime.fromtimestamp(event.realtime_us / 1e6, UTC).strftime("%H:%M:%S")
    return "--:--:--"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        m, s = divmod(round(seconds), 60)
        return f"{m}m{s:02d}s" if m else f"{s}s"
    h, rest = divmod(int(seconds), 3600)
    return f"{h}h{rest // 60:02d}m"


def fmt_tokens(n: float | None) -> str:
    if n is None:
        return "—"
    if n >= 1_000_000:
        return f"{n / 1_000_000:.2f}M"
    if n >= 10_000:
        return f"{n / 1000:.0f}k"
    if n >= 1000:
        return f"{n / 1000:.1f}k"
    return f"{n:.0f}"


# ---- GPUs ------------------------------------------------------------------------------------------

SEGMENTS: tuple[str, ...] = ("weights", "kv", "mamba", "draft", "graphs", "other", "procs")
SEGMENT_LABELS: dict[str, str] = {
    "reserved": "driver reserved",
    "weights": "weights",
    "kv": "KV pool",
    "mamba": "mamba pool",
    "draft": "draft model",
    "graphs": "CUDA graphs",
    "other": "other (SGLang)",
    "procs": "other processes",
    "used": "used",
}


@dataclass(frozen=True)
class GpuRow:
    index: int
    name: str | None
    total_gib: float | None
    used_gib: float | None
    util_pct: float | None
    parts: tuple[tuple[str, float], ...] = ()
    """(segment, GiB) in bar order; empty when the journal has not said enough (plain used/total)."""
    reserved_gib: float | None = None
    """The driver's own reservation (NVML v2, nvidia-smi): drawn as its own segment, not in used."""
    memory_info: str | None = None
    """`v2` (used as nvidia-smi counts it) or `v1` (an old driver: used includes the reservation)."""
    health: dict[str, object] | None = None
    """The GPU's health as `snapshot --json` prints it (`core/gpuhealth.health_json`); None when the
    back-end read none of it."""
    faults: tuple[tuple[str, str], ...] = ()
    """(tag, severity) of each fault, the most serious first: `("XID 79", "critical")`."""

    @property
    def free_gib(self) -> float | None:
        if self.total_gib is None or self.used_gib is None:
            return None
        return max(0.0, self.total_gib - self.used_gib - (self.reserved_gib or 0.0))

    @property
    def detailed(self) -> bool:
        return bool(self.parts)


@dataclass(frozen=True)
class RankMemory:
    weights: float | None = None
    kv: float | None = None
    graphs: float | None = None
    mamba: float | None = None
    """The mamba state pool (conv + SSM state) of a hybrid linear-attention model; None for any other."""
    draft: float | None = None
    """The speculative draft model's weights and pools; None without a draft."""


GIB_BYTES = 1024.0**3


def rank_memory(boot: Boot | None) -> dict[int, RankMemory]:
    """What SGLang said each TP rank holds, in GiB (SGLang prints GB for GiB): the weights' `mem usage`,
    the KV pools' sizes, the mamba state pool, the draft model's, the CUDA graphs' `mem usage` (summed:
    speculative decoding captures twice).

    The draft's is told apart as the fold tells it (`console/core/state.py`): a scheduler's second
    weights line is the draft model's, and a pool it allocates after its own `Memory pool end` the draft
    worker's. A sliding-window model's `SWAKVPool mem usage` is both its KV pools (the two KV lines add
    up to it), DeepSeek-V4's pools are its bytes per full token times its full pool."""
    if boot is None:
        return {}
    weights: dict[int, float] = {}
    kv: dict[int, float] = {}
    graphs: dict[int, float] = {}
    mamba: dict[int, float] = {}
    draft: dict[int, float] = {}
    whole_kv: dict[int, float] = {}
    """Per rank: the KV pools' size from one line that counts all of them (SWAKVPool, DSv4)."""
    dsv4: dict[int, tuple[float, int | None]] = {}
    weights_lines: dict[str, int] = {}
    ended: set[str] = set()

    def add(to: dict[int, float], rank: int, gib: float) -> None:
        to[rank] = to.get(rank, 0.0) + gib

    for e in boot.events:
        rank = e.tp_rank if e.tp_rank is not None else (0 if e.dp_rank is None else None)
        if rank is None:
            continue
        proc = rank_key(e) or "main"
        if isinstance(e, WeightsLoaded):
            weights_lines[proc] = seen = weights_lines.get(proc, 0) + 1
            if e.mem_usage_gb is not None:
                add(draft if seen >= 2 else weights, rank, e.mem_usage_gb)
        elif isinstance(e, KvPoolAllocated):
            size = e.kv_size_gb
            if size is None and (e.k_size_gb is not None or e.v_size_gb is not None):
                size = (e.k_size_gb or 0.0) + (e.v_size_gb or 0.0)
            if size is not None:
                add(draft if proc in ended or e.label == "draft" else kv, rank, size)
        elif isinstance(e, MambaPoolAllocated):
            parts = [x for x in (e.conv_state_gb, e.ssm_state_gb) if x is not None]
            if parts:
                add(draft if proc in ended else mamba, rank, sum(parts))
        elif isinstance(e, SwaPoolAllocated) and e.mem_usage_gb is not None and proc not in ended:
            whole_kv[rank] = e.mem_usage_gb
        elif isinstance(e, Dsv4Memory) and e.bytes_per_full_token is not None and proc not in ended:
            dsv4[rank] = (e.bytes_per_full_token, e.full_tokens)
            if e.full_tokens is not None:
                whole_kv[rank] = e.bytes_per_full_token * e.full_tokens / GIB_BYTES
            elif e.available_gb is not None:
                whole_kv[rank] = e.available_gb
        elif isinstance(e, Dsv4Pool) and e.full_tokens is not None and rank in dsv4 and proc not in ended:
            # `DSV4 pool sizes: full=…` is printed again, smaller, when a constraint cut the pool.
            whole_kv[rank] = dsv4[rank][0] * e.full_tokens / GIB_BYTES
        elif isinstance(e, MemoryPoolEnd):
            ended.add(proc)
        elif isinstance(e, CudaGraph) and e.phase == "end" and e.mem_usage_gb is not None:
            add(graphs, rank, e.mem_usage_gb)
    kv.update(whole_kv)
    ranks = set(weights) | set(kv) | set(graphs) | set(mamba) | set(draft)
    return {
        r: RankMemory(weights.get(r), kv.get(r), graphs.get(r), mamba.get(r), draft.get(r)) for r in ranks
    }


def gpu_rows(snap: HostSnapshot, boot: Boot | None = None) -> list[GpuRow]:
    """One row per GPU. GPU *i* is taken to hold TP rank *i* (how SGLang places ranks on the visible
    GPUs); the split is shown only while the boot that reported it is alive."""
    sample = snap.gpus
    if sample is None or not sample.gpus:
        return []
    boot = boot if boot is not None else display_boot(snap.state)
    per_rank = rank_memory(boot) if boot is not None and not boot.ended else {}
    pids = boot.seen_pids if boot is not None else frozenset()
    rows = []
    for pos, g in enumerate(sample.gpus):
        index = g.index if g.index is not None else pos
        total = g.memory_total_mib / MIB_PER_GIB if g.memory_total_mib is not None else None
        used = g.memory_used_mib / MIB_PER_GIB if g.memory_used_mib is not None else None
        parts: tuple[tuple[str, float], ...] = ()
        mem = per_rank.get(index)
        if mem is not None and mem.weights is not None and used is not None and total is not None:
            ours = used
            procs = 0.0
            known = [p for p in g.processes if p.used_memory_mib is not None]
            if known and any(p.pid in pids for p in known):
                ours = sum(p.used_memory_mib or 0.0 for p in known if p.pid in pids) / MIB_PER_GIB
                procs = max(0.0, used - ours)
            left = ours
            split: list[tuple[str, float]] = []
            segments = [("weights", mem.weights), ("kv", mem.kv)]
            # A boot with neither keeps the split it always had (no empty segments in snapshot --json).
            segments += [
                (name, v) for name, v in (("mamba", mem.mamba), ("draft", mem.draft)) if v is not None
            ]
            segments.append(("graphs", mem.graphs))
            for name, value in segments:
                take = min(max(0.0, value or 0.0), left)
                split.append((name, take))
                left -= take
            split.append(("other", max(0.0, left)))
            split.append(("procs", procs))
            parts = tuple(split)
        reserved = g.memory_reserved_mib / MIB_PER_GIB if g.memory_reserved_mib is not None else None
        said = health_json(g)
        read = len(said) > 1 or said["faults"]  # more than the (empty) fault list
        rows.append(
            GpuRow(
                index,
                g.name,
                total,
                used,
                g.utilization_pct,
                parts,
                reserved_gib=reserved,
                memory_info=g.memory_info,
                health=said if read else None,
                faults=tuple((f.tag, f.severity) for f in faults(g)),
            )
        )
    return rows


# ---- KV capacity -----------------------------------------------------------------------------------

Level = str  # "ok" | "warn" | "critical" | "unknown"


@dataclass(frozen=True)
class KvGauge:
    pool_tokens: int | None
    target: int | None
    target_source: str | None
    """Where the target came from: a profile name, `--target-context`, or None."""
    context_length: int | None
    headroom_gib: float | None
    used_tokens: float | None
    usage: float | None
    """Fraction of the pool in use now (0..1)."""
    usage_source: str | None
    level: Level
    reasons: tuple[str, ...] = field(default_factory=tuple)
    pools: tuple[PoolGauge, ...] = ()
    """Each pool of a boot that has more than one (hybrid, sliding-window, DeepSeek-V4, a speculative
    draft), the full (context) pool first; empty for a boot with the one KV pool, drawn as it always was."""
    limit: tuple[str, str] | None = None
    """(pool, why): the pool that bounds the context target (else --context-length), in a few words;
    None where `pools` is empty."""


POOL_LABELS = {
    "full": "full",
    "swa": "SWA",
    "mamba": "mamba",
    "draft": "draft",
    "dsv4_c4": "c4",
    "dsv4_c128": "c128",
}


@dataclass(frozen=True)
class PoolGauge:
    """One pool of the boot, at the precision the gauge prints it."""

    name: str
    """`full`, `swa`, `mamba`, `draft`, `dsv4_c4`, `dsv4_c128` (`console/core/pools.PoolReading`)."""
    size: int | None
    unit: str = "tokens"
    gib: float | None = None
    usage: float | None = None
    """In use now, 0..1, rounded to the whole percent printed: a repaint only when that changes."""

    @property
    def label(self) -> str:
        return POOL_LABELS.get(self.name, self.name)

    def words(self, *, short: bool = False) -> str:
        """`full 580,364 14%`, `mamba 82 slots (7.42 GiB)`, `SWA 423k`; `short`: for a narrow column."""
        if self.size is None:
            size = "—"
        elif self.unit == "slots":
            size = f"{self.size:,} slots"
        elif self.name == "full" and not short:
            size = f"{self.size:,}"
        else:
            size = fmt_tokens(self.size)
        said = f"{self.label} {size}"
        if self.gib is not None and not short:
            said += f" ({self.gib:.2f} GiB)"
        if self.usage is not None:
            said += f" {self.usage:.0%}"
        return said


_SERVED_POOLS = {"full": "kv", "swa": "swa", "mamba": "mamba"}
"""A pool of the boot → its name among /metrics' pools (`ServingFigures.pools`)."""


def _several_pools(pool: Pool) -> bool:
    return any(
        v is not None for v in (pool.swa_tokens, pool.mamba_slots, pool.draft_kv_tokens, pool.dsv4_c4_tokens)
    )


def pool_gauges(
    snap: HostSnapshot, boot: Boot | None, batch: DecodeBatch | PrefillBatch | None, full_usage: float | None
) -> tuple[PoolGauge, ...]:
    """The boot's pools with their use (`/metrics`, else the newest batch line of this boot), or () for a
    boot with one pool."""
    if boot is None or not _several_pools(boot.pool):
        return ()
    readings: list[PoolReading] = pool_readings(boot, () if batch is None else (batch,))
    served = {p.name: p.usage for p in snap.serving.pools} if snap.serving is not None else {}
    out = []
    for r in readings:
        usage = full_usage if r.pool == "full" else served.get(_SERVED_POOLS.get(r.pool, ""), r.usage)
        out.append(PoolGauge(r.pool, r.size, r.unit, r.gib, None if usage is None else round(usage, 2)))
    return tuple(out)


def pool_limit(
    pools: tuple[PoolGauge, ...], boot: Boot | None, target: int | None, ctx: int | None
) -> tuple[str, str] | None:
    """Which pool bounds the context target, as the planner names it (`capacity_plan._pools`): a request's
    whole context lives in the full pool (a sliding-window pool keeps only the window, DeepSeek-V4's c4 /
    c128 pools a compressed copy, the mamba pool one state per request); once the full pool holds it, a
    hybrid model's mamba slots cap how many requests run at once."""
    if not pools or boot is None:
        return None
    by = {p.name: p for p in pools}
    full = by["full"].size
    aim, what = (target, "T") if target is not None else (ctx, "--context-length")
    if full is not None and aim is not None and full < aim:
        return "full", f"full {full:,} < {what} {aim:,}"
    holds = f"full holds {what}" if aim is not None else "full holds each request's context"
    mamba = by.get("mamba")
    if mamba is not None and mamba.size is not None:
        per = 1 if boot.arg("disable_radix_cache") else MAMBA_SLOTS_PER_REQUEST
        running = max(1, mamba.size // per)
        return "mamba", f"mamba: ≤ {running:,} running ({mamba.size:,} slots, {per} each); {holds}"
    swa = by.get("swa")
    if swa is not None and swa.size is not None:
        return "full", f"{holds}; SWA {fmt_tokens(swa.size)} holds the running windows"
    return "full", holds


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def boot_name(boot: Boot) -> str:
    """A boot as every screen and command names it (`Boot.name`: `boot 03:19:50`)."""
    return boot.name


def of_boot(event: Event, boot: Boot | None) -> bool:
    """Whether a traffic line (which boots count, not keep) was printed by `boot`'s server: by one of
    its processes, else (a line without a PID, a boot that has printed nothing yet) not before it began.
    A replay carried "in use 185k tokens (90%)" from the last decode line into a fresh boot."""
    if boot is None:
        return True
    if not boot.ready and boot.opened_by != "first_event":
        return False  # a server not serving yet (or no more) has no load of its own
    if event.pid is not None and boot.seen_pids:
        return event.pid in boot.seen_pids
    starts = [t for t in (event_time(e) for e in boot.events[:3]) if t is not None]
    at = event_time(event)
    return not starts or (at is not None and at >= min(starts))


def kv_gauge(
    snap: HostSnapshot,
    *,
    target: int | None = None,
    target_source: str | None = None,
    min_headroom_gib: float = DEFAULT_MIN_HEADROOM_GIB,
) -> KvGauge:
    boot = display_boot(snap.state)
    metrics = snap.server.metrics if snap.server is not None else None
    pool = boot.pool.tokens if boot is not None else None
    if pool is None and metrics is not None and metrics.max_total_num_tokens:
        pool = int(metrics.max_total_num_tokens)
    ctx = None
    if boot is not None:
        ctx = boot.pool.context_len or _int(boot.arg("context_length"))
    if ctx is None and metrics is not None and metrics.context_len:
        ctx = int(metrics.context_len)
    headroom = boot.pool.available_gpu_mem_gb if boot is not None else None

    used: float | None = None
    usage: float | None = None
    source: str | None = None
    several = boot is not None and _several_pools(boot.pool)
    batch: DecodeBatch | PrefillBatch | None = None
    if several:
        # The newest batch line of this boot: a hybrid model's other pools' use (a prefill line says it too).
        for e in reversed(snap.recent):
            if isinstance(e, DecodeBatch | PrefillBatch):
                batch = e if of_boot(e, boot) else None
                break
    if metrics is not None and metrics.kv_used_tokens is not None and snap.server is not None:
        used = metrics.kv_used_tokens
        usage = metrics.token_usage if metrics.token_usage is not None else None
        source = "/metrics"
    else:
        for e in reversed(snap.recent):
            if isinstance(e, DecodeBatch) and e.token_usage is not None:
                if not of_boot(e, boot):
                    break  # the previous server's load is not this boot's (its pool is not even sized)
                usage = e.token_usage
                used = e.num_tokens
                source = "decode stats"
                break
    if usage is None and used is not None and pool:
        usage = used / pool
    if used is None and usage is not None and pool:
        used = usage * pool

    reasons: list[str] = []
    level = "ok"

    def worse(to: str, why: str) -> None:
        nonlocal level
        reasons.append(why)
        if to == "critical" or level == "ok":
            level = to

    if pool is None:
        level = "unknown"
    else:
        if boot is not None and boot.ended:
            # the pool belonged to a server that is gone: its size says nothing about what runs now
            worse(
                "critical" if boot.phase == "failed" else "warn",
                f"the server {boot.phase}: no pool in service",
            )
        if target is not None and pool < target:
            worse("critical", f"pool {fmt_tokens(pool)} < target {fmt_tokens(target)}")
        if ctx is not None and pool < ctx:
            worse("warn", f"pool {fmt_tokens(pool)} < --context-length {fmt_tokens(ctx)}")
        if headroom is not None and headroom < min_headroom_gib:
            worse(
                "critical" if headroom < min_headroom_gib / 2 else "warn",
                f"headroom {headroom:.2f} GiB < {min_headroom_gib:g} GiB",
            )
        if usage is not None and usage >= 0.9:
            worse("critical" if usage >= 0.98 else "warn", f"pool {usage:.0%} in use")
    pools = pool_gauges(snap, boot, batch, usage) if several else ()
    for p in pools[1:]:
        if p.usage is not None and p.usage >= 0.9 and p.name != "draft":
            # A full mamba or sliding-window pool holds requests back though the full pool has room.
            worse("critical" if p.usage >= 0.98 else "warn", f"{p.label} pool {p.usage:.0%} in use")
    return KvGauge(
        pool,
        target,
        target_source,
        ctx,
        headroom,
        used,
        usage,
        source,
        level,
        tuple(reasons),
        pools,
        pool_limit(pools, boot, target, ctx),
    )


# ---- restart timeline ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimelineStep:
    phase: Phase
    label: str
    seconds: float | None
    state: str
    """`done`, `active`, `pending`, `failed`."""


@dataclass(frozen=True)
class Timeline:
    boot_index: int
    steps: tuple[TimelineStep, ...]
    elapsed: float | None
    eta: float | None
    outcome: str
    """`running`, `ready`, `failed`, `stopped`."""
    reason: str | None = None
    name: str = ""
    """The boot as every screen names it (`boot_name`)."""


def _machine(
    boot: Boot, stop_at: float | None, history: list[dict[Phase | str, float]]
) -> RestartMachine | None:
    times = [t for t in (event_time(e) for e in boot.events) if t is not None]
    if not times:
        return None
    start = stop_at if stop_at is not None and stop_at <= times[0] else times[0]
    m = RestartMachine("observed", now=start, history=history)
    # The boot was observed, not commanded: the controller's own steps took no time here.
    for step in (Phase.VALIDATE, Phase.DIFF, Phase.WRITE_DROPIN, Phase.DAEMON_RELOAD):
        m.step_done(step, start)
    m.step_done(Phase.RESTART, start)
    last = start
    for e in boot.events:
        t = event_time(e)
        last = max(last, t) if t is not None else last
        m.feed(e, last)
    return m


def _stop_time(prev: Boot | None) -> float | None:
    """When the previous boot was asked to stop: the start of this restart."""
    if prev is None:
        return None
    for e in prev.events:
        if isinstance(e, Unit) and e.state in ("stopping", "stopped"):
            return event_time(e)
    return None


def restart_timeline(state: HostState, now: float) -> Timeline | None:
    """The phases of the current (or last) boot with their durations, and an ETA from earlier boots.
    `now` is the snapshot's time, so a pinned snapshot renders a pinned timeline."""
    boot = display_boot(state)
    if boot is None:
        return None
    idx = state.boots.index(boot)
    history: list[dict[Phase | str, float]] = []
    for i, earlier in enumerate(state.boots[:idx]):
        m = _machine(earlier, _stop_time(state.boots[i - 1]) if i else None, [])
        if m is not None and m.phase == Phase.READY:
            history.append({p: s for p, s in m.durations().items() if p in BOOT})
    m = _machine(boot, _stop_time(state.boots[idx - 1]) if idx else None, history)
    if m is None:
        return None
    last_seen = max((t for t in (event_time(e) for e in boot.events) if t is not None), default=now)
    live = not boot.ended and m.phase not in (Phase.READY, Phase.FAILED)
    # Journal realtime stamps share our clock; a pasted log's host-local times do not, so a running
    # phase of such a boot counts up to its last line only.
    same_clock = any(e.realtime_us is not None for e in boot.events)
    clock = max(now, last_seen) if live and same_clock else last_seen
    spent = m.durations(clock if live else None)
    ready_at = next((s.start for s in m.spans if s.phase in (Phase.READY, Phase.FAILED)), None)
    steps = []
    order = [*BOOT, Phase.READY]
    current = m.phase
    for phase in order:
        if phase == Phase.READY and current == Phase.FAILED:
            steps.append(TimelineStep(Phase.FAILED, PHASE_LABELS[Phase.FAILED], None, "failed"))
            continue
        seen = phase in spent
        if phase == current and phase != Phase.READY:
            st = "active"
        elif (phase == Phase.READY and current == Phase.READY) or seen:
            st = "done"
        else:
            st = "pending"
        secs = spent.get(phase) if phase != Phase.READY else None
        steps.append(TimelineStep(phase, PHASE_LABELS[phase], secs, st))
    if boot.ended and current not in (Phase.READY, Phase.FAILED):
        outcome = "failed" if boot.phase == "failed" else "stopped"
    elif current == Phase.FAILED:
        outcome = "failed"
    elif current == Phase.READY:
        outcome = "stopped" if boot.ended else "ready"
    else:
        outcome = "running"
    elapsed = (ready_at if ready_at is not None else clock) - m.started
    eta = m.eta(clock) if outcome == "running" else None
    return Timeline(boot.index, tuple(steps), elapsed, eta, outcome, m.reason, boot_name(boot))


# ---- event feed ------------------------------------------------------------------------------------

KIND_ROLES: dict[str, tuple[str, bool]] = {
    "error": ("bad", True),
    "unit": ("info", False),
    "server_args": ("step", False),
    "dist_init": ("step", False),
    "weights_begin": ("step", False),
    "weights_loaded": ("step", True),
    "kv_pool_allocated": ("kv", True),
    "memory_pool_end": ("kv", False),
    "pool_summary": ("kv", True),
    "pool_clamped": ("warn", False),
    "cuda_graph": ("graphs", False),
    "server_ready": ("ok", True),
    "prefill_batch": ("muted", False),
    "decode_batch": ("muted", False),
    "http_access": ("faint", False),
    "log": ("muted", False),
    "audit": ("info", True),
}
"""The feed's colour of each kind of event: a theme role (console/tui/themes.py), bold or not."""


def kind_style(kind: str) -> Style | str:
    """The style of an event kind's feed row in the app's theme ("" for a kind without one)."""
    got = KIND_ROLES.get(kind)
    return palette().style(got[0], bold=got[1]) if got is not None else ""


_PREFIX = re.compile(r"^\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:\.\d+)?(?: [^\]]*)?\]\s*")


def event_text(event: Event) -> str:
    """The line without SGLang's `[date time TPn]` prefix (the feed prints time and rank itself)."""
    if event.kind == "error":
        return getattr(event, "message", "") or event.raw
    text = event.raw or getattr(event, "message", "")
    return _PREFIX.sub("", text, count=1)


def rank_label(event: Event) -> str:
    if event.tp_rank is not None:
        return f"TP{event.tp_rank}"
    if event.dp_rank is not None:
        return f"DP{event.dp_rank}"
    return ""


# Every repeat is bounded: with `.*?\d+/\d+` a long run of digits (a tensor or a hex dump printed on
# one line) backtracked quadratically: 0.7 s for a 16,000-character line, 108 s for 200,000.
_PROGRESS = re.compile(
    r"(?P<what>[^:|()\[\]]{1,200}?)\s{0,8}(?:\([^)]{0,200}\))?:\s{1,8}\d{1,3}%(?: Completed)?\s{0,8}"
    r"\|[^\[]{0,400}?\d{1,12}/\d{1,12}\s{0,4}\["
)


def progress_key(event: Event) -> tuple[str, str] | None:
    """The rank and the name of what a tqdm progress line counts ("Loading safetensors checkpoint
    shards", "Capturing batches"), or None for any other line. In a terminal tqdm redraws one line;
    the journal keeps every redraw (64 lines for a 64-shard checkpoint), so the feed shows the newest
    of a run of them in one row."""
    if event.kind != "log":
        return None
    m = _PROGRESS.match(event_text(event))
    return (rank_label(event), m["what"]) if m else None


def is_blank(event: Event) -> bool:
    """An unparsed line with nothing on it (tqdm's carriage returns leave them in the journal)."""
    return event.kind == "log" and not event_text(event).strip()


def feed_line(event: Event) -> str:
    """The searchable text of a feed line (the filter matches on what the operator reads)."""
    return f"{clock_text(event)} {rank_label(event):4} {event.kind:17} {event_text(event)}"


def unit_state(snap: HostSnapshot, boot: Boot | None) -> str:
    """Words for the service: the boot's phase, or what systemd said last."""
    if boot is None:
        return "no boot seen"
    words = {
        "starting": "starting",
        "loading": "loading weights",
        "pool": "allocating KV pool",
        "graphs": "capturing CUDA graphs",
        "scheduler_ready": "serving (scheduler ready)",
        "ready": "ready",
        "stopping": "stopping",
        "stopped": "stopped",
        "failed": "failed",
    }
    text = words.get(boot.phase, boot.phase)
    if boot.unit_result and boot.phase in ("failed", "stopped"):
        text += f" ({boot.unit_result})"
    return text


def model_name(boot: Boot | None) -> str | None:
    if boot is None:
        return None
    for key in ("served_model_name", "model_path"):
        value = boot.arg(key)
        if isinstance(value, str) and value:
            return value
    return None


def freshest(snap: HostSnapshot) -> float | None:
    """Unix time of the newest thing heard from the host: a GPU sample the host answered (even "no
    GPUs"), an HTTP answer from the server (even a 503), a journal line. A failed tick is stamped too,
    but it was heard from nobody: counted, an unreachable host read `< 5s ago`."""
    stamps = []
    if snap.gpus is not None and snap.gpus.ts is not None and snap.gpus.state is not SamplerState.ERROR:
        stamps.append(snap.gpus.ts)
    if snap.server is not None and snap.server.ts is not None and snap.server.status_code is not None:
        stamps.append(snap.server.ts)
    if snap.recent and snap.recent[-1].realtime_us is not None:
        stamps.append(snap.recent[-1].realtime_us / 1e6)
    return max(stamps) if stamps else None
