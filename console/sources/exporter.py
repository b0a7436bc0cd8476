"""`k26-console export`'s live half: hosts followed over SSH, and a Prometheus collector over them.

Each host is a `HostExport`: a `HostSession` (journal-derived boots, GPU samples, server health, the SSH
link, reconnecting on its own) plus a slower poll of what the session does not hold (`core.export.
HostExtras`: the host's lock and pending rollback from its state dir, the profile of the newest apply in
its audit trail, the planner's pool for the running flags, the last probe run from the local history).

`ExportCollector` is a prometheus_client custom collector: each scrape builds its metric families from
the newest snapshot and extras of the hosts it holds at that moment, so a scrape is never older than the
state, and a host taken out of the collector takes all its series with it. A host that drops keeps its
last values, with `k26_up` 0, until its session reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

from prometheus_client.metrics_core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from console.core.capacity import CapacityError
from console.core.export import (
    BOOT_PHASES,
    GPU_HEALTH_METRICS,
    PHASE_BUCKETS_S,
    HostExtras,
    HostFigures,
    ProbePoint,
    host_figures,
    phase_durations,
)
from console.core.models import ModelConfigError
from console.core.planning import boot_source, latest_sized, plan_restart, resolve_model
from console.core.probe_history import ProbeRecord
from console.core.snapshot import HostSnapshot
from console.core.state import Boot
from console.core.text import terminal_safe
from console.sources.confirm import read_pending
from console.sources.hosts import HostConfig
from console.sources.hoststate import HostStateDir, HostStateError
from console.sources.probe_history import load_history
from console.sources.profile_store import ProfileStore, applied_target
from console.sources.session import HostSession, SessionOptions
from console.sources.transport import TransportError

BASE_LABELS: tuple[str, ...] = ("host", "unit", "model", "profile")
DEFAULT_POLL_S = 15.0
"""How often the host's state dir, audit trail and the probe history are read (the session streams the
journal, GPUs and health on its own)."""


def _label(value: str) -> str:
    # a label value comes from the host (a model path, a user name): printable, bounded
    return terminal_safe(value)[:200]


class FigureSource(Protocol):
    """What the collector reads a host from: its name and its newest figures."""

    @property
    def name(self) -> str: ...

    def figures(self) -> HostFigures: ...


class FigureCache:
    """`host_figures` for a host's successive snapshots, keeping each boot's phase durations while the
    boot is the same object (boots are immutable: a boot that changed is a new object). A scrape then
    reads the journal's history once, not once per scrape: only the boot being folded is read again."""

    def __init__(self, *, unit: str, model: str | None = None) -> None:
        self.unit = unit
        self.model = model
        self._durations: dict[int, tuple[Boot, dict[str, float]]] = {}

    def figures(self, snap: HostSnapshot, extras: HostExtras | None) -> HostFigures:
        kept = self._durations
        fresh: dict[int, tuple[Boot, dict[str, float]]] = {}
        merged: dict[str, list[float]] = {}
        for boot in snap.state.boots:
            hit = kept.get(boot.index)
            durations = hit[1] if hit is not None and hit[0] is boot else phase_durations(boot)
            fresh[boot.index] = (boot, durations)
            for phase, seconds in durations.items():
                merged.setdefault(phase, []).append(seconds)
        # replaced whole, never mutated: a scrape in another thread keeps the dict it started with
        self._durations = fresh
        return host_figures(snap, extras, unit=self.unit, model=self.model, durations=merged)


class HostExport:
    """One followed host: its session and the extras polled beside it."""

    def __init__(
        self,
        host: HostConfig,
        *,
        poll_s: float = DEFAULT_POLL_S,
        probe_history: Path | None = None,
        store: ProfileStore | None = None,
        session: HostSession | None = None,
    ) -> None:
        self.host = host
        self.poll_s = poll_s
        self.probe_history = probe_history
        self.store = store
        self.session = session or HostSession(host, SessionOptions(keep_events=50))
        self.extras = HostExtras()
        self._state = HostStateDir(self.session.transport, host)
        self._cache = FigureCache(unit=host.unit_name, model=host.model)
        self._task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def snapshot(self) -> HostSnapshot:
        return self.session.snapshot

    def figures(self) -> HostFigures:
        return self._cache.figures(self.snapshot, self.extras)

    async def start(self) -> None:
        await self.session.start()
        self._task = asyncio.get_running_loop().create_task(self._poll(), name=f"export-{self.host.name}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self.session.close()

    async def _poll(self) -> None:
        # Runs for days: a poll that fails in a way not foreseen is said once on stderr and tried again
        # next time, never left to end the task (the extras would then freeze without a word).
        said: str | None = None
        while True:
            try:
                await self.poll_once()
            except Exception as exc:
                what = f"{type(exc).__name__}: {exc}"
                if what != said:
                    sys.stderr.write(
                        terminal_safe(f"k26-console: export: reading {self.host.name}'s state failed: {what}")
                        + "\n"
                    )
                    said = what
            await asyncio.sleep(self.poll_s)

    async def poll_once(self) -> None:
        """Read the extras once; what cannot be read keeps its previous value."""
        update: dict[str, object] = {}
        try:
            async with asyncio.timeout(self.poll_s * 2):
                view = await self._state.board.view()
                audit = await self._state.audit.read()
                pending = None
                if view.pending_rollback is not None:
                    # the record, and whether its timer still waits (it fired, or the host rebooted)
                    pending = await read_pending(self._state, self.host.unit_name, sudo=self.host.sudo)
        except (HostStateError, TransportError, TimeoutError, OSError):
            update["state_ok"] = False
        else:
            lock = view.lock
            update["state_ok"] = True
            update["lock_holder"] = f"{lock.holder.user}@{lock.holder.jump_host}" if lock else None
            update["lock_intent"] = lock.intent if lock else None
            update["pending_deadline"] = pending.deadline.timestamp() if pending else None
            update["pending_active"] = pending.active if pending else None
            profile, target = applied_target(audit, self.store)
            update["profile"] = profile
            update["target_context"] = target
        update.update(self._probe())
        extras = self.extras.model_copy(update=update)
        extras = extras.model_copy(update={"predicted_pool_tokens": self._predicted(extras.target_context)})
        self.extras = extras

    def _probe(self) -> dict[str, object]:
        records: list[ProbeRecord] = load_history(self.probe_history, host=self.host.name)
        if not records:
            return {}
        last = records[-1].run_id
        run = [r for r in records if r.run_id == last]
        points = tuple(
            ProbePoint(
                depth=r.result.depth,
                decode_tok_s=r.result.decode_tok_s,
                bandwidth_gbs=r.result.effective_kv_bandwidth_gbs,
            )
            for r in run
        )
        return {"probe": points, "probe_time": run[-1].when.timestamp()}

    def _predicted(self, target: int | None) -> int | None:
        """The planner's pool for the flags the latest sized boot ran with, calibrated on the boots."""
        boots = self.snapshot.state.boots
        boot = latest_sized(boots)
        if boot is None or boot.server_args is None:
            return None
        goal = target or boot.pool.context_len or boot.pool.tokens
        if not goal:
            return None
        source = boot_source(boot)
        try:
            spec = resolve_model([source], named=self.host.model, boots=boots)
            plan = plan_restart(goal, [source], boots, model=spec, sglang_version=None)
        except (CapacityError, ModelConfigError, ValueError):
            return None
        return plan.predicted_max_total_num_tokens


class ExportCollector(Collector):
    """Metric families built at each scrape from the hosts' newest state."""

    def __init__(self, hosts: Iterable[FigureSource] = ()) -> None:
        self._hosts: dict[str, FigureSource] = {h.name: h for h in hosts}

    def add(self, host: FigureSource) -> None:
        # a new dict, never a mutated one: a scrape running in the server's thread keeps its own view
        self._hosts = {**self._hosts, host.name: host}

    def remove(self, name: str) -> FigureSource | None:
        hosts = dict(self._hosts)
        gone = hosts.pop(name, None)
        self._hosts = hosts
        return gone

    def collect(self) -> Iterator[Metric]:
        return iter(families([h.figures() for h in self._hosts.values()]))


class ExportSet:
    """The followed hosts and their collector; `sync` follows a new list of hosts (a reloaded hosts
    file): a host gone from it leaves the collector (all its series go at the next scrape) and is closed,
    a new one is started, one whose settings changed is started afresh."""

    def __init__(self, *, poll_s: float = DEFAULT_POLL_S, probe_history: Path | None = None) -> None:
        self.poll_s = poll_s
        self.probe_history = probe_history
        self.collector = ExportCollector()
        self.exports: dict[str, HostExport] = {}

    async def sync(self, configs: Sequence[HostConfig]) -> tuple[list[str], list[str]]:
        """(names added or restarted, names removed)."""
        wanted = {c.name: c for c in configs}
        added: list[str] = []
        removed: list[str] = []
        for name, export in list(self.exports.items()):
            if wanted.get(name) != export.host:
                self.collector.remove(name)
                del self.exports[name]
                await export.close()
                if name not in wanted:
                    removed.append(name)
        for name, config in wanted.items():
            if name not in self.exports:
                export = HostExport(config, poll_s=self.poll_s, probe_history=self.probe_history)
                await export.start()
                self.exports[name] = export
                self.collector.add(export)
                added.append(name)
        return added, removed

    async def close(self) -> None:
        for name, export in list(self.exports.items()):
            self.collector.remove(name)
            with contextlib.suppress(Exception):
                await export.close()
        self.exports.clear()


def families(all_figures: Sequence[HostFigures]) -> list[Metric]:
    """The exporter's metric families for these hosts' figures (a family with no host is still listed
    with no samples, so its HELP and TYPE are always there)."""

    def gauge(name: str, doc: str, extra: Sequence[str] = (), unit: str = "") -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=[*BASE_LABELS, *extra], unit=unit)

    up = gauge("k26_up", "1 when the SSH link to the host is up; 0 keeps the host's last values")
    healthy = gauge("k26_server_healthy", "1 when the SGLang server answers its health check")
    pool = gauge("k26_kv_pool_tokens", "tokens the latest boot's KV pool holds (max_total_num_tokens)")
    ctx = gauge("k26_context_length_tokens", "the latest boot's context length (tokens)")
    target = gauge("k26_target_context_tokens", "the applied profile's target context (tokens)")
    predicted = gauge(
        "k26_predicted_pool_tokens",
        "the planner's KV pool for the running flags, calibrated on the host's boots",
    )
    headroom = gauge("k26_headroom_gib", "free GPU memory when the scheduler was ready (GiB, min over ranks)")
    boot_no = gauge(
        "k26_boot_number", "index of the latest boot in the journal read since the exporter started"
    )
    boot_start = gauge("k26_boot_start_time_seconds", "Unix time the latest boot started")
    phase = gauge("k26_boot_phase", "1 for the phase the latest boot is in", ["phase"])
    durations = HistogramMetricFamily(
        "k26_startup_phase_duration_seconds",
        "how long each startup phase took, over the boots seen",
        labels=[*BASE_LABELS, "phase"],
    )
    verdict = gauge(
        "k26_verdict_ok",
        "1 when the latest boot is ready, holds the target and shows no error since it started",
    )
    errors = gauge("k26_errors_since_boot", "errors in the latest boot, by category", ["category"])
    memory = gauge("k26_boot_memory_gib", "the latest boot's GPU memory by part (GiB per GPU)", ["part"])
    gpu_used = gauge("k26_gpu_memory_used_bytes", "GPU memory in use, from the last GPU sample", ["gpu"])
    gpu_total = gauge("k26_gpu_memory_total_bytes", "GPU memory in all, from the last GPU sample", ["gpu"])
    gpu_health = {
        name: gauge(name, f"{words}, from the last GPU sample", ["gpu"])
        for name, (_, words) in GPU_HEALTH_METRICS.items()
    }
    gpu_health["k26_gpu_xid_events"] = gauge(
        "k26_gpu_xid_events", "XID critical-error events of the last hour (NVML back-ends)", ["gpu"]
    )
    gpu_fault = gauge(
        "k26_gpu_fault",
        "1 while a GPU shows the fault (thermal, power, pcie, ecc, remap_pending, remap_failed, xid)",
        ["gpu", "kind"],
    )
    probe_tok = gauge(
        "k26_probe_decode_tokens_per_second", "the last probe's decode tok/s by depth", ["depth"]
    )
    probe_bw = gauge(
        "k26_probe_kv_bandwidth_gbs",
        "the last probe's effective KV read bandwidth (GB/s) by depth",
        ["depth"],
    )
    probe_time = gauge("k26_probe_time_seconds", "Unix time of the last probe run")
    lock = gauge("k26_lock_held", "1 while a console holds the host's lock", ["holder", "intent"])
    pending = gauge(
        "k26_pending_rollback_deadline_seconds",
        "Unix time an armed host-side rollback fires unless confirmed (active=false: its timer is gone)",
        ["active"],
    )

    for f in all_figures:
        base = [_label(f.host), _label(f.unit), _label(f.model), _label(f.profile)]
        up.add_metric(base, 1.0 if f.up else 0.0)
        if f.server_healthy is not None:
            healthy.add_metric(base, 1.0 if f.server_healthy else 0.0)
        for fam, value in (
            (pool, f.pool_tokens),
            (ctx, f.context_len),
            (target, f.target_context),
            (predicted, f.predicted_pool_tokens),
            (headroom, f.headroom_gib),
            (boot_no, f.boot_number),
            (boot_start, f.boot_start_time),
            (probe_time, f.probe_time),
        ):
            if value is not None:
                fam.add_metric(base, float(value))
        if f.pending_deadline is not None:
            pending.add_metric([*base, "false" if f.pending_active is False else "true"], f.pending_deadline)
        if f.verdict_ok is not None:
            verdict.add_metric(base, 1.0 if f.verdict_ok else 0.0)
        if f.boot_phase is not None:
            for p in BOOT_PHASES:
                phase.add_metric([*base, p], 1.0 if p == f.boot_phase else 0.0)
        for name, seconds in sorted(f.phase_durations.items()):
            buckets = [(str(float(b)), float(sum(1 for s in seconds if s <= b))) for b in PHASE_BUCKETS_S]
            buckets.append(("+Inf", float(len(seconds))))
            durations.add_metric([*base, name], buckets, sum(seconds))
        for cat, n in sorted(f.errors.items()):
            errors.add_metric([*base, _label(cat)], float(n))
        for part, gib in sorted(f.memory_gib.items()):
            memory.add_metric([*base, part], gib)
        for gpu, value in sorted(f.gpu_used_bytes.items()):
            gpu_used.add_metric([*base, gpu], value)
        for gpu, value in sorted(f.gpu_total_bytes.items()):
            gpu_total.add_metric([*base, gpu], value)
        for gpu, figures in sorted(f.gpu_health.items()):
            for name, value in figures.items():
                gpu_health[name].add_metric([*base, gpu], value)
        for gpu, kinds in sorted(f.gpu_faults.items()):
            for kind, holds in kinds.items():
                gpu_fault.add_metric([*base, gpu, kind], 1.0 if holds else 0.0)
        for point in f.probe:
            if point.decode_tok_s is not None:
                probe_tok.add_metric([*base, str(point.depth)], point.decode_tok_s)
            if point.bandwidth_gbs is not None:
                probe_bw.add_metric([*base, str(point.depth)], point.bandwidth_gbs)
        lock.add_metric([*base, _label(f.lock_holder), _label(f.lock_intent)], 1.0 if f.lock_held else 0.0)
    return [
        up,
        healthy,
        pool,
        ctx,
        target,
        predicted,
        headroom,
        boot_no,
        boot_start,
        phase,
        durations,
        verdict,
        errors,
        memory,
        gpu_used,
        gpu_total,
        *gpu_health.values(),
        gpu_fault,
        probe_tok,
        probe_bw,
        probe_time,
        lock,
        pending,
    ]
