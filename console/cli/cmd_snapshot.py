"""`k26-console snapshot HOST [--json] [--window 5m] [--sample 2s]`: one reading of what the dashboard
shows, printed once, for scripts and cron.

The GPUs' memory split, the KV pool (and its target when the boot says one), the serving figures
(`core/serving.py`: latency percentiles, rates, running and queued requests, KV tokens), the service's
state, the current boot, and who is on the host (presence and the lock). Latency percentiles need two
`/metrics` scrapes: one at the start and one `--sample` later; the report says what the window really
covered. Exit 0 when nothing is wrong, 1 when an alert fires (the rules of the config file's `[alerts]`
table, else the default set: the service not active, errors since this boot, TTFT p99, queue, KV, GPU
memory; `core/alerts.py`) or the service's state cannot be read, 2 on bad input (a bad `[alerts]` table
included) or an unreachable host.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import re
import time
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from console.cli.cmd_plan import human_int
from console.cli.errors import EXIT_CHECK_FAILED, EXIT_OK, UsageError
from console.core.alerts import Alert, alert_inputs, evaluate
from console.core.events import DecodeBatch, GpuXid, PrefillBatch
from console.core.metrics import parse_prometheus
from console.core.pools import pool_readings
from console.core.serving import DEFAULT_WINDOW_S, Scrape, ServingFigures, serving_figures
from console.core.text import json_safe, terminal_safe

if TYPE_CHECKING:  # the SSH stack loads only when a command needs it
    from console.core.pairing import PairingView
    from console.core.snapshot import HostSnapshot
    from console.sources.alerts import AlertConfig
    from console.sources.hosts import HostConfig
    from console.sources.transport import Transport

MAX_WINDOW_S = 7 * 86_400.0
MAX_SAMPLE_S = 600.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str, *, lo: float, hi: float) -> float:
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 2s, 5m, 1h)")
    value = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if not lo <= value <= hi:
        raise argparse.ArgumentTypeError(f"{text!r} is out of range ({lo:g} to {hi:g} seconds)")
    return value


def _window(text: str) -> float:
    return duration(text, lo=1.0, hi=MAX_WINDOW_S)


def _sample(text: str) -> float:
    return duration(text, lo=0.1, hi=MAX_SAMPLE_S)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "snapshot",
        help="one reading of everything the dashboard shows, printed once (for scripts and cron)",
        description=(
            "Read the host once and exit: GPU memory split, KV pool and target, serving figures (TTFT, "
            "inter-token and end-to-end latency and queue time at p50/p90/p99, tok/s, running and queued "
            "requests, KV tokens per DP rank, cache hit rate, speculative acceptance), the service's state, "
            "the current boot, presence and the lock. Percentiles come from two /metrics scrapes --sample "
            "apart; the report says the window they really cover. Exit 0 when no alert fires, 1 when one "
            "does (the [alerts] rules of the hosts file, else the default set: the service not active, "
            "errors since this boot, TTFT p99 > 5 s, queue > 16, KV used > 95%, a GPU with < 1 GiB free) "
            "or the service's state cannot be read, 2 on bad input or when the host cannot be reached."
        ),
    )
    p.add_argument("host", metavar="HOST", help="a hosts-file name or an ssh alias")
    p.add_argument("--hosts", metavar="FILE", help="the hosts file (default: hosts.toml in the config dir)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of text")
    p.add_argument(
        "--window",
        type=_window,
        default=DEFAULT_WINDOW_S,
        metavar="DUR",
        help="the serving figures' window (default 5m; a one-shot reading covers at most --sample of it)",
    )
    p.add_argument(
        "--sample",
        type=_sample,
        default=2.0,
        metavar="DUR",
        help="time between the two /metrics scrapes the percentiles are read from (default 2s)",
    )
    p.add_argument(
        "--timeout",
        type=lambda t: duration(t, lo=1.0, hi=600.0),
        default=30.0,
        metavar="DUR",
        help="how long to wait for the journal, GPUs and server to answer (default 30s)",
    )
    p.add_argument(
        "--target-context",
        type=human_int,
        metavar="N",
        help="the context the KV pool is measured against (as the console's gauge)",
    )
    p.add_argument("--profile", metavar="NAME", help="take the pool's target from this saved profile")
    p.set_defaults(func=run)


class ServiceReading(BaseModel, defer_build=True):
    active_state: str | None = None
    sub_state: str | None = None
    load_state: str | None = None
    error: str | None = None


class BootReading(BaseModel, defer_build=True):
    index: int
    """Its place among the boots this reading saw (from the unit's current invocation): not an identity."""
    name: str = ""
    """`boot 03:19:50`: the time of its first journal line, as the console and `verify` name it."""
    phase: str
    state: str
    first_ts: str | None = None
    invocation_id: str | None = None
    model: str | None = None
    errors: list[str] = []


class SnapshotReport(BaseModel, defer_build=True):
    """The `snapshot --json` contract."""

    host: str
    taken_at: float
    service: ServiceReading
    boot: BootReading | None = None
    gpus: list[dict[str, Any]] = []
    gpu_state: str | None = None
    gpu_events: list[dict[str, Any]] = []
    """The XID events the reading saw happen (`gpu_xid`, console/core/events.py), oldest first."""
    pool: dict[str, Any] | None = None
    pools: list[dict[str, Any]] = []
    """Each pool of the boot against its use (full, sliding-window, mamba slots, draft, DeepSeek-V4's):
    `console/core/pools.pool_readings`."""
    server_health: str | None = None
    server_version: str | None = None
    serving: ServingFigures
    presence: list[dict[str, Any]] = []
    lock: dict[str, Any] | None = None
    lock_stale: bool = False
    incomplete: list[str] = []
    """What did not answer within --timeout (its part of the report is missing, not made up)."""
    alerts: list[Alert] = []
    """The alerts that fire on this reading (`core/alerts.py`; the hook is not run)."""
    problems: list[str] = []
    """The firing alerts' messages, and a service whose state cannot be read: exit 1 when any."""


SCRAPE_DEADLINE_S = 5.0
"""The most one request to the server may take, its whole answer included (a loopback forward answers
/metrics in well under a second): a server that sends a byte every few seconds costs 5 s, once."""


async def _scrape(client: Any, ts: float, failed: list[str]) -> Scrape | None:
    """One /metrics scrape; None (and why, in `failed`) when there is no whole one within its bounds."""
    from console.sources.server import ServerError

    try:
        text = await client.metrics_text()
    except ServerError as exc:
        failed.append(str(exc))
        return None
    return Scrape(ts=ts, metrics=parse_prometheus(text))


async def applied_target_of(host: HostConfig, transport: Transport) -> tuple[int | None, str | None]:
    """With no --target-context or --profile: the target of the profile the host was last applied with
    (its audit trail), read as `export` reads it; (None, None) when there is none or no trail."""
    from console.sources.hoststate import HostStateDir, HostStateError
    from console.sources.profile_store import applied_target
    from console.sources.transport import TransportError

    try:
        entries = await HostStateDir(transport, host).audit.read()
    except (HostStateError, TransportError):
        return None, None
    name, target = applied_target(entries)
    return (target, f"profile {name} (last applied)") if target is not None else (None, None)


async def _read(
    host: HostConfig,
    transport: Transport,
    args: argparse.Namespace,
    target: tuple[int | None, str | None],
    alerts: AlertConfig,
) -> SnapshotReport:
    from console.core.snapshot import FollowState
    from console.sources.hoststate import HostStateDir, HostStateError
    from console.sources.server import ServerClient, ServerError
    from console.sources.session import HostSession, SessionOptions
    from console.sources.transport import TransportError
    from console.sources.unit_commands import ServiceError, UnitCommands
    from console.tui.view import display_boot

    incomplete: list[str] = []
    session = HostSession(host, SessionOptions(server_interval_s=1.0), transport=transport)
    client = await ServerClient.through(transport, host, timeout_s=min(args.timeout, SCRAPE_DEADLINE_S))
    try:
        await session.start()

        async def service() -> ServiceReading:
            try:
                info = await UnitCommands(host, transport).unit_info()
            except ServiceError as exc:
                return ServiceReading(error=str(exc))
            return ServiceReading(
                active_state=info.active_state, sub_state=info.sub_state, load_state=info.load_state
            )

        async def pairing() -> Any:
            with contextlib.suppress(HostStateError, TransportError):
                return await HostStateDir(transport, host).board.view()
            incomplete.append("presence and lock")
            return None

        async def scrapes() -> tuple[list[Scrape], float | None, str | None]:
            loop = asyncio.get_running_loop()
            failed: list[str] = []
            first = await _scrape(client, loop.time(), failed)
            max_running: float | None = None
            version: str | None = None
            if first is None and failed and "not reachable" not in failed[0]:
                # no whole answer in time or in bounds: asking again would cost as much, for nothing
                incomplete.append(f"server ({failed[0].rstrip('.')})")
                return [], max_running, version
            await asyncio.sleep(args.sample)
            second = await _scrape(client, loop.time(), failed)
            with contextlib.suppress(ServerError):
                info = await client.server_info()
                if isinstance(info.get("max_running_requests"), int | float):
                    max_running = float(info["max_running_requests"])
                version = str(info["version"]) if info.get("version") else None
            return [s for s in (first, second) if s is not None], max_running, version

        def settled(snap: HostSnapshot) -> bool:
            return (
                snap.follower.state is FollowState.FOLLOWING
                and snap.gpus is not None
                and snap.server is not None
            )

        async def wait() -> HostSnapshot:
            try:
                return await session.wait_for(settled, timeout=args.timeout)
            except TimeoutError:
                snap = session.snapshot
                if snap.follower.state is not FollowState.FOLLOWING:
                    incomplete.append("journal")
                if snap.gpus is None:
                    incomplete.append("GPUs")
                if snap.server is None:
                    incomplete.append("server")
                return snap

        async with asyncio.timeout(args.timeout + args.sample + 30):
            svc, view, (scraped, max_running, version), snap = await asyncio.gather(
                service(), pairing(), scrapes(), wait()
            )
        if target[0] is None:
            target = await applied_target_of(host, transport)
    finally:
        await client.aclose()
        await session.close()

    boot = display_boot(snap.state)
    figures = serving_figures(
        scraped,
        window_s=args.window,
        version=version or (snap.server.version if snap.server else None),
        max_running=max_running,
        lines=[e for e in (boot.events if boot else ()) if isinstance(e, DecodeBatch | PrefillBatch)][-50:],
    )
    return report_of(host.name, snap, svc, view, figures, target, alerts, incomplete, taken_at=time.time())


def report_of(
    host: str,
    snap: HostSnapshot,
    svc: ServiceReading,
    view: PairingView | None,
    figures: ServingFigures,
    target: tuple[int | None, str | None],
    alerts: AlertConfig,
    incomplete: list[str],
    *,
    taken_at: float,
) -> SnapshotReport:
    """The report of one reading of a host: what `snapshot --json` prints. A replay builds it from a
    recording's snapshot (`k26-console replay FILE --at TIME --json`)."""
    from console.tui.view import boot_name, display_boot, gpu_rows, kv_gauge, model_name, unit_state

    boot = display_boot(snap.state)
    gauge = kv_gauge(snap, target=target[0], target_source=target[1])
    boot_reading = None
    if boot is not None:
        boot_reading = BootReading(
            index=boot.index,
            name=boot_name(boot),
            phase=str(boot.phase),
            state=unit_state(snap, boot),
            first_ts=boot.first_ts,
            invocation_id=boot.invocation_id,
            model=model_name(boot),
            errors=[f"{e.category}: {e.message}" for e in boot.errors],
        )
    inputs = alert_inputs(
        snap,
        figures,
        boot=boot,
        service_state=svc.active_state,
        service_detail=svc.sub_state,
        errors_known="journal" not in incomplete,
    )
    firing = list(evaluate(alerts.rules, inputs, host=host, ts=taken_at).firing.values())
    problems = [a.message for a in firing]
    if figures.refused:
        # A server exporting +Inf or a negative count is broken: its figures are left out, and said so.
        values = ", ".join(f"{name} {value}" for name, value in sorted(figures.refused.items())[:5])
        problems.append(f"the server's /metrics held values out of range, left out: {values}")
    if svc.error is not None:
        problems.append(f"the service's state cannot be read: {svc.error}")
    return SnapshotReport(
        host=host,
        taken_at=taken_at,
        service=svc,
        boot=boot_reading,
        gpus=[dataclasses.asdict(row) | {"free_gib": row.free_gib} for row in gpu_rows(snap, boot)],
        gpu_state=str(snap.gpus.state) if snap.gpus else None,
        gpu_events=[e.model_dump(mode="json") for e in snap.recent if isinstance(e, GpuXid)],
        # Each pool is the report's `pools`; the gauge keeps which of them bounds the target (`limit`).
        pool={k: v for k, v in dataclasses.asdict(gauge).items() if k != "pools"},
        pools=[r.model_dump(mode="json") for r in pool_readings(boot, snap.recent)],
        server_health=str(snap.server.health) if snap.server else None,
        server_version=figures.version,
        serving=figures,
        presence=[p.model_dump(mode="json") for p in view.presence] if view is not None else [],
        lock=view.lock.model_dump(mode="json") if view is not None and view.lock else None,
        lock_stale=bool(view.lock_stale) if view is not None else False,
        incomplete=incomplete,
        alerts=firing,
        problems=problems,
    )


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1000:.1f} ms"


def _num(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "—" if value is None else fmt.format(value)


def _health_words(health: dict[str, Any] | None) -> str:
    """`; 33 °C, 79/700 W, SM 345/1980 MHz, P0, PCIe gen 5 x16; THERMAL: …` (what the back-end read)."""
    if not health:
        return ""
    said = []
    if health.get("temperature_c") is not None:
        said.append(f"{health['temperature_c']:.0f} °C")
    if health.get("power_w") is not None:
        limit = f"/{health['power_limit_w']:.0f}" if health.get("power_limit_w") is not None else ""
        said.append(f"{health['power_w']:.0f}{limit} W")
    if health.get("clock_sm_mhz") is not None:
        top = f"/{health['clock_sm_max_mhz']:.0f}" if health.get("clock_sm_max_mhz") is not None else ""
        said.append(f"SM {health['clock_sm_mhz']:.0f}{top} MHz")
    if health.get("pstate") is not None:
        said.append(f"P{health['pstate']}")
    if health.get("pcie_gen") is not None and health.get("pcie_width") is not None:
        said.append(f"PCIe gen {health['pcie_gen']} x{health['pcie_width']}")
    faults = [f["words"] for f in health.get("faults", [])]
    return "".join(f"; {w}" for w in [", ".join(said), *faults] if w)


def _lines(r: SnapshotReport) -> list[str]:
    s = r.serving
    out = [f"host {r.host}"]
    svc = r.service
    out.append(
        f"service: {svc.active_state} ({svc.sub_state})" if svc.error is None else f"service: {svc.error}"
    )
    if r.boot is not None:
        b = r.boot
        out.append(f"{b.name}: {b.state}, since {b.first_ts or '?'}, model {b.model or '?'}")
        out.extend(f"  error: {e}" for e in b.errors[:5])
    else:
        out.append("boot: none seen in the journal")
    out.append(f"server: {r.server_health or '?'}, SGLang {r.server_version or '?'}")
    for g in r.gpus:
        parts = ", ".join(f"{name} {gib:.1f}" for name, gib in g["parts"]) or "no split known"
        if g.get("reserved_gib") is not None:
            parts = f"driver reserved {g['reserved_gib']:.1f}; {parts}"
        elif g.get("memory_info") == "v1":
            parts = f"used includes the driver's reservation (NVML v1); {parts}"
        out.append(
            f"GPU{g['index']}: {_num(g['used_gib'], '{:.1f}')}/{_num(g['total_gib'], '{:.1f}')} GiB ({parts})"
            + _health_words(g.get("health"))
        )
    if r.pool is not None:
        pool = r.pool
        out.append(
            f"KV pool: {_num(pool['pool_tokens'])} tokens, target {_num(pool['target'])}"
            + (f" ({pool['target_source']})" if pool["target_source"] else "")
            + f", context {_num(pool['context_length'])}, used {_num(pool['used_tokens'])}; {pool['level']}"
            + (f": {'; '.join(pool['reasons'])}" if pool["reasons"] else "")
        )
    if len(r.pools) > 1:
        out.append("pools: " + " · ".join(_pool_words(p) for p in r.pools))
        limit = (r.pool or {}).get("limit")
        if limit:
            out.append(f"  limit ({limit[0]}): {limit[1]}")
    covered = f"{s.covered_s:.1f}s" if s.covered_s is not None else "one scrape or none"
    out.append(f"serving (window {s.window_s:g}s asked, {covered} covered, {s.scrapes} scrapes):")
    for name, lat in (("TTFT", s.ttft), ("ITL", s.itl), ("e2e", s.e2e), ("queue", s.queue_time)):
        if lat is None:
            out.append(f"  {name}: absent ({s.absent.get(_field(name), '?')})")
        else:
            out.append(
                f"  {name}: p50 {_ms(lat.p50)}  p90 {_ms(lat.p90)}  p99 {_ms(lat.p99)}  ({lat.count:.0f} obs)"
            )
    run_of = f" of {s.max_running:.0f}" if s.max_running is not None else ""
    out.append(f"  requests: {_num(s.running)} running{run_of}, {_num(s.queued)} queued")
    out.append(f"  KV tokens: {_num(s.kv_used)} of {_num(s.kv_pool)}; usage {_num(s.token_usage, '{:.2f}')}"
               + (f" (fullest pool: {s.full_pool})" if s.full_pool else ""))  # fmt: skip
    out.extend(f"    DP{r_.dp_rank}: {_num(r_.used)} of {_num(r_.pool)}" for r_ in s.kv_ranks)
    out.append(
        f"  gen {_num(s.gen_tok_s, '{:.1f}')} tok/s, prefill {_num(s.prefill_tok_s, '{:.1f}')} tok/s, "
        f"cache hit {_num(s.cache_hit_rate, '{:.2f}')}"
    )
    out.extend(_serving_families(s))
    if s.spec_accept_length is not None:
        out.append(
            f"  spec accept length {s.spec_accept_length:.2f}, rate {_num(s.spec_accept_rate, '{:.2f}')}"
        )
    out.append(f"presence: {len(r.presence)} console(s); lock: " + ("held" if r.lock else "free"))
    if r.incomplete:
        out.append("no answer within --timeout from: " + ", ".join(r.incomplete))
    out.extend(f"alert ({a.severity}) {a.rule}: {a.message}" for a in r.alerts)
    out.append("problems: " + ("; ".join(r.problems) if r.problems else "none"))
    return [terminal_safe(line) for line in out]


def _pool_words(p: dict[str, Any]) -> str:
    """`mamba 82 slots (7.42 GiB), 20 used (100%)`: one of `SnapshotReport.pools`."""
    size = "?" if p.get("size") is None else f"{p['size']:,}"
    said = f"{p['pool']} {size} {p.get('unit') or 'tokens'}"
    if p.get("gib") is not None:
        said += f" ({p['gib']:.2f} GiB)"
    used, usage = p.get("used"), p.get("usage")
    if used is not None or usage is not None:
        said += f", {_num(used)} used" + (f" ({usage:.0%})" if usage is not None else "")
    return said


def _serving_families(s: ServingFigures) -> list[str]:
    """The newer /metrics families where the server exports them: the pools beside the full one, the
    page layout, PD's KV transfers, the hierarchical cache, the engines, and what was read as today's."""
    out = []
    if any(p.name != "kv" for p in s.pools):
        out.append(
            "  pools: "
            + "; ".join(
                f"{p.name} {_num(p.used)} of {_num(p.capacity)}, usage {p.usage:.2f}" for p in s.pools
            )
        )
    if s.page_size is not None or s.num_pages is not None:
        out.append(f"  page size {_num(s.page_size)}, {_num(s.num_pages)} pages")
    t = s.kv_transfer
    if t is not None:
        read = "over the window" if t.read == "window" else "the last transfer"
        out.append(
            f"  KV transfer ({read}): latency {_num(t.latency_ms, '{:.1f}')} ms, p99 "
            f"{_num(t.latency_p99_ms, '{:.1f}')} ms, {_num(t.speed_gb_s, '{:.2f}')} GB/s, "
            f"bootstrap {_num(t.bootstrap_ms, '{:.1f}')} ms, alloc {_num(t.alloc_ms, '{:.1f}')} ms, "
            f"{_num(t.total_mb, '{:.1f}')} MB, {_num(t.transfers)} transfers"
        )
    h = s.hicache
    if h is not None:
        out.append(
            f"  hicache: host {_num(h.host_used_tokens)} of {_num(h.host_total_tokens)} tokens; tok/s backup "
            f"{_num(h.backup_tok_s)}, prefetch {_num(h.prefetch_tok_s)}, load back {_num(h.load_back_tok_s)}"
        )
    if s.engine_types and s.engine_types != ("unified",):
        out.append("  engines: " + ", ".join(s.engine_types))  # PD disaggregation's prefill / decode
    if s.read_as:
        out.append("  read as today's: " + "; ".join(f"{old} -> {new}" for old, new in s.read_as.items()))
    return out


def _field(name: str) -> str:
    return {"TTFT": "ttft", "ITL": "itl", "e2e": "e2e", "queue": "queue_time"}[name]


def run(args: argparse.Namespace) -> int:
    from console.cli.cmd_console import resolve_target
    from console.cli.remote import connected, inventory_host
    from console.sources.alerts import AlertConfigError, load_alert_config

    target = resolve_target(args)
    host = inventory_host(args.host, args.hosts)
    try:
        alerts = load_alert_config(args.hosts)
    except AlertConfigError as exc:
        raise UsageError(str(exc)) from None

    async def go() -> SnapshotReport:
        transport = await connected(host)
        try:
            return await _read(host, transport, args, target, alerts)
        finally:
            await transport.close()

    from console.sources.transport import TransportError

    try:
        report = asyncio.run(go())
    except TransportError as exc:
        raise UsageError(f"{terminal_safe(str(exc)).rstrip('.')}.") from None
    except TimeoutError:
        raise UsageError(
            f"{terminal_safe(host.name)} did not give a whole reading within {args.timeout + args.sample + 30:g} s."
        ) from None
    if args.json:
        print(json_safe(json.dumps(report.model_dump(mode="json"), ensure_ascii=False)))
    else:
        print("\n".join(_lines(report)))
    return EXIT_CHECK_FAILED if report.problems else EXIT_OK
