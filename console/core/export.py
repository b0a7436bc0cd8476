"""What `k26-console export` says about one host, as plain numbers: the figures behind its metrics.

`host_figures(snapshot, extras)` reads the newest `HostSnapshot` (journal-derived boots, GPU sample,
server health, SSH link) and the slower facts the exporter polls beside it (`HostExtras`: the lock, the
pending rollback, the profile last applied, the planner's prediction, the last probe) into `HostFigures`.
The collector in `console.sources.exporter` turns figures into Prometheus metric families; nothing here
does I/O or knows the time (the caller passes `now`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import get_args

from pydantic import BaseModel, ConfigDict, Field

from console.core import gpuhealth
from console.core.apply import judge
from console.core.events import (
    CudaGraph,
    Event,
    KvPoolAllocated,
    MemoryPoolEnd,
    PoolSummary,
    ServerReady,
    Unit,
    WeightsBegin,
    WeightsLoaded,
)
from console.core.gpus import GpuSample
from console.core.snapshot import ConnState, HostSnapshot
from console.core.state import Boot, BootPhase

BOOT_PHASES: tuple[BootPhase, ...] = get_args(BootPhase)
"""Every phase a boot can be in: the `phase` label of `k26_boot_phase` (one of them is 1)."""

STARTUP_PHASES: tuple[str, ...] = ("launching", "loading_weights", "kv_pool", "cuda_graphs", "serving")
"""The startup's phases whose durations the histogram counts, in order (the restart machine's names)."""

PHASE_BUCKETS_S: tuple[float, ...] = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600)
"""Histogram buckets for a startup phase, seconds: a second (a small model's graphs) to an hour (400 GB of
weights from a cold network disk)."""

GIB = 1024**3


class ProbePoint(BaseModel, defer_build=True):
    """One depth of the host's last probe run."""

    model_config = ConfigDict(frozen=True)

    depth: int
    decode_tok_s: float | None = None
    bandwidth_gbs: float | None = None


class HostExtras(BaseModel, defer_build=True):
    """What the exporter polls beside the session: the host's state dir, the audit, the planner, probes."""

    model_config = ConfigDict(frozen=True)

    profile: str | None = None
    """The profile of the newest successful apply in the host's audit trail."""
    target_context: int | None = None
    """That profile's target context (tokens)."""
    predicted_pool_tokens: int | None = None
    """The planner's pool for the flags the latest boot ran with, calibrated on the host's boots."""
    lock_holder: str | None = None
    """`user@jump_host` of the console holding the host's lock; None when the lock is free."""
    lock_intent: str | None = None
    pending_deadline: float | None = None
    """Unix time at which an armed host-side rollback fires; None when none is armed."""
    pending_active: bool | None = None
    """Whether that rollback's timer still waits (False: the record is there, the timer is gone)."""
    probe: tuple[ProbePoint, ...] = ()
    probe_time: float | None = None
    """Unix time of the last probe run."""
    state_ok: bool = True
    """False when the last poll of the host's state dir failed (the values above are the previous ones)."""


class HostFigures(BaseModel, defer_build=True):
    """One host's metrics as numbers; None means the series is absent (nothing is known yet)."""

    model_config = ConfigDict(frozen=True)

    host: str
    unit: str
    model: str = ""
    profile: str = ""
    up: bool
    pool_tokens: int | None = None
    context_len: int | None = None
    target_context: int | None = None
    predicted_pool_tokens: int | None = None
    headroom_gib: float | None = None
    boot_number: int | None = None
    boot_start_time: float | None = None
    boot_phase: BootPhase | None = None
    phase_durations: dict[str, list[float]] = Field(default_factory=dict)
    """Per startup phase, its duration in every boot that went through it (seconds)."""
    verdict_ok: bool | None = None
    errors: dict[str, int] = Field(default_factory=dict)
    """Errors since the latest boot, by category."""
    memory_gib: dict[str, float] = Field(default_factory=dict)
    """The latest boot's GPU memory by part (weights, kv_cache, cuda_graphs, free), GiB, per GPU rank min."""
    gpu_used_bytes: dict[str, float] = Field(default_factory=dict)
    gpu_total_bytes: dict[str, float] = Field(default_factory=dict)
    gpu_health: dict[str, dict[str, float]] = Field(default_factory=dict)
    """GPU → `GPU_HEALTH_METRICS` name → value, from the last GPU sample (a figure not read: absent)."""
    gpu_faults: dict[str, dict[str, bool]] = Field(default_factory=dict)
    """GPU → fault kind (`FAULT_KINDS`) → whether it holds; a kind the sample cannot judge is absent."""
    server_healthy: bool | None = None
    probe: tuple[ProbePoint, ...] = ()
    probe_time: float | None = None
    lock_held: bool = False
    lock_holder: str = ""
    lock_intent: str = ""
    pending_deadline: float | None = None
    pending_active: bool | None = None


GPU_HEALTH_METRICS: dict[str, tuple[str, str]] = {
    "k26_gpu_memory_reserved_bytes": ("memory_reserved_mib", "the driver's own reservation (NVML v2)"),
    "k26_gpu_temperature_celsius": ("temperature_c", "GPU temperature"),
    "k26_gpu_temperature_slowdown_celsius": ("temperature_slowdown_c", "where the GPU slows itself down"),
    "k26_gpu_power_watts": ("power_w", "power draw"),
    "k26_gpu_power_limit_watts": ("power_limit_w", "the enforced power limit"),
    "k26_gpu_sm_clock_mhz": ("clock_sm_mhz", "SM clock"),
    "k26_gpu_sm_clock_max_mhz": ("clock_sm_max_mhz", "the SM clock's maximum"),
    "k26_gpu_clock_event_reasons": ("clock_event_reasons", "NVML's clock-event (throttle) reasons bitmask"),
    "k26_gpu_ecc_uncorrected_volatile": ("ecc_uncorrected_volatile", "uncorrectable ECC errors since load"),
    "k26_gpu_pcie_link_gen": ("pcie_gen", "PCIe link generation now"),
    "k26_gpu_pcie_link_width": ("pcie_width", "PCIe link width now (lanes)"),
}
"""The GPU sample's health figures the exporter serves: metric name → (GpuSample field, help)."""
FAULT_KINDS: tuple[str, ...] = (
    "lost",
    "thermal",
    "power",
    "pcie",
    "ecc",
    "remap_pending",
    "remap_failed",
    "xid",
)


def _gpu_health(gpu: GpuSample, watches_xids: bool) -> tuple[dict[str, float], dict[str, bool]]:
    figures: dict[str, float] = {}
    for metric, (field, _) in GPU_HEALTH_METRICS.items():
        value = getattr(gpu, field)
        if value is not None:
            figures[metric] = float(value) * (1024 * 1024 if field == "memory_reserved_mib" else 1)
    if watches_xids:  # NVML's back-ends; nvidia-smi hears of no XID
        figures["k26_gpu_xid_events"] = float(len(gpu.xids))
    active = {f.kind for f in gpuhealth.faults(gpu)}
    known = {
        "lost": True,  # every back-end says when its driver cannot reach a GPU
        "thermal": gpuhealth.thermal_slowdown(gpu),
        "power": gpuhealth.power_capped(gpu),
        "pcie": gpuhealth.pcie_degraded(gpu),
        "ecc": gpu.ecc_uncorrected_volatile is not None or None,
        "remap_pending": gpu.remap_pending,
        "remap_failed": gpu.remap_failed,
        "xid": "k26_gpu_xid_events" in figures or None,
    }
    return figures, {kind: kind in active for kind in FAULT_KINDS if known[kind] is not None}


def epoch(event: Event) -> float | None:
    """An event's Unix time: the journal's realtime stamp, else its ISO stamp; None for a bare time."""
    if event.realtime_us is not None:
        return event.realtime_us / 1e6
    if event.ts and not event.ts.startswith("--"):
        try:
            return datetime.fromisoformat(event.ts).timestamp()
        except ValueError:
            return None
    return None


def phase_marks(boot: Boot) -> dict[str, float]:
    """When a boot entered each startup phase (first event of its kind), Unix seconds."""
    marks: dict[str, float] = {}

    def mark(name: str, ev: Event) -> None:
        t = epoch(ev)
        if t is not None and name not in marks:
            marks[name] = t

    for ev in boot.events:
        if isinstance(ev, Unit) and ev.state in ("starting", "started"):
            mark("launching", ev)
        elif isinstance(ev, WeightsBegin):
            mark("loading_weights", ev)
        elif isinstance(ev, WeightsLoaded | KvPoolAllocated):
            mark("kv_pool", ev)
        elif isinstance(ev, MemoryPoolEnd) or (isinstance(ev, CudaGraph) and ev.phase == "begin"):
            mark("cuda_graphs", ev)
        elif isinstance(ev, PoolSummary | ServerReady):
            mark("serving", ev)
    if "launching" not in marks and boot.first_ts is not None:
        first = boot.events[0] if boot.events else None
        t = epoch(first) if first is not None else None
        if t is not None:
            marks["launching"] = t
    return marks


def phase_durations(boot: Boot) -> dict[str, float]:
    """Seconds each startup phase took in `boot`: from its mark to the next phase's mark. A phase the
    journal does not show is absent; the last one (serving) has no end and no duration."""
    marks = phase_marks(boot)
    seen = [(p, marks[p]) for p in STARTUP_PHASES if p in marks]
    return {p: max(0.0, nxt - t) for (p, t), (_, nxt) in itertools.pairwise(seen)}


def memory_split(boot: Boot) -> dict[str, float]:
    """The boot's GPU memory by part, GiB: weights (free before minus after loading), kv_cache (the
    pools' sizes), cuda_graphs (the graphs' own usage) and free (what the scheduler had left at ready)."""
    parts: dict[str, float] = {}
    pre, post = boot.pre_gib, boot.post_gib
    if pre is not None and post is not None:
        parts["weights"] = max(0.0, pre - post)
    kv = [
        e.kv_size_gb if e.kv_size_gb is not None else (e.k_size_gb or 0.0) + (e.v_size_gb or 0.0)
        for e in boot.events
        if isinstance(e, KvPoolAllocated) and (e.kv_size_gb is not None or e.k_size_gb is not None)
    ]
    if kv:
        # one line per rank and per pool: the first rank's lines (a rank repeats the same sizes)
        parts["kv_cache"] = kv[0] if len(set(kv)) == 1 else max(kv)
    graphs = [e.mem_usage_gb for e in boot.events if isinstance(e, CudaGraph) and e.mem_usage_gb is not None]
    if graphs:
        parts["cuda_graphs"] = max(graphs)
    if boot.pool.available_gpu_mem_gb is not None:
        parts["free"] = boot.pool.available_gpu_mem_gb
    return parts


def all_phase_durations(boots: Iterable[Boot]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for boot in boots:
        for phase, seconds in phase_durations(boot).items():
            out.setdefault(phase, []).append(seconds)
    return out


def verdict_ok(boots: Sequence[Boot], target: int | None) -> bool | None:
    """The post-restart verdict on the latest boot: ready, the pool holds the target (the profile's, else
    the server's context length), no error since it started. None when nothing can be judged."""
    latest = boots[-1] if boots else None
    if latest is None:
        return None
    goal = target if target is not None else latest.pool.context_len
    if goal is None:
        return None
    return judge(list(boots), goal).ok


def host_figures(
    snap: HostSnapshot,
    extras: HostExtras | None,
    *,
    unit: str,
    model: str | None = None,
    durations: Mapping[str, list[float]] | None = None,
) -> HostFigures:
    """`durations`: the boots' phase durations when the caller keeps them (`all_phase_durations` of the
    snapshot's boots otherwise)."""
    extras = extras or HostExtras()
    boots = snap.state.boots
    latest = boots[-1] if boots else None
    conn = snap.connection
    up = conn is not None and conn.state is ConnState.UP
    server = snap.server
    served = (server.model if server is not None else None) or model
    if served is None and latest is not None:
        path = latest.arg("served_model_name") or latest.arg("model_path")
        served = path if isinstance(path, str) else None
    errors: dict[str, int] = {}
    if latest is not None:
        for err in latest.errors:
            errors[err.category] = errors.get(err.category, 0) + 1
    used: dict[str, float] = {}
    total: dict[str, float] = {}
    health: dict[str, dict[str, float]] = {}
    gpu_faults: dict[str, dict[str, bool]] = {}
    if snap.gpus is not None:
        for i, gpu in enumerate(snap.gpus.gpus):
            key = str(gpu.index if gpu.index is not None else i)
            if gpu.memory_used_mib is not None:
                used[key] = gpu.memory_used_mib * 1024 * 1024
            if gpu.memory_total_mib is not None:
                total[key] = gpu.memory_total_mib * 1024 * 1024
            health[key], gpu_faults[key] = _gpu_health(gpu, snap.gpus.backend in ("nvml", "agent"))
    start = None
    if latest is not None:
        marks = phase_marks(latest)
        start = marks.get("launching") or next(iter(sorted(marks.values())), None)
    return HostFigures(
        host=snap.host,
        unit=unit,
        model=served or "",
        profile=extras.profile or "",
        up=up,
        pool_tokens=latest.pool.tokens if latest is not None else None,
        context_len=latest.pool.context_len if latest is not None else None,
        target_context=extras.target_context,
        predicted_pool_tokens=extras.predicted_pool_tokens,
        headroom_gib=latest.pool.available_gpu_mem_gb if latest is not None else None,
        boot_number=latest.index if latest is not None else None,
        boot_start_time=start,
        boot_phase=latest.phase if latest is not None else None,
        phase_durations=dict(durations) if durations is not None else all_phase_durations(boots),
        verdict_ok=verdict_ok(boots, extras.target_context),
        errors=errors,
        memory_gib=memory_split(latest) if latest is not None else {},
        gpu_used_bytes=used,
        gpu_total_bytes=total,
        gpu_health=health,
        gpu_faults=gpu_faults,
        server_healthy=(server.health.value == "ok") if server is not None else None,
        probe=extras.probe,
        probe_time=extras.probe_time,
        lock_held=extras.lock_holder is not None,
        lock_holder=extras.lock_holder or "",
        lock_intent=extras.lock_intent or "",
        pending_deadline=extras.pending_deadline,
        pending_active=extras.pending_active,
    )
