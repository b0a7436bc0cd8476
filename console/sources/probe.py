"""The synthetic long-context probe against a live SGLang server, and the files that keep its results.

A probe is one streamed `/generate` whose prompt is `depth` random token ids (no tokenizer is needed on
the jump host, and a fresh random prefix each run keeps the radix cache from answering it) and which
asks for exactly `new_tokens` tokens (`max_new_tokens = min_new_tokens`, `ignore_eos`). Before anything
is sent, the depth is checked against the server's context length and KV pool (from `/server_info`, or
the journal's `max_total_num_tokens=...` line when the server does not say); a depth that cannot fit is
refused with the reason.

Results are appended to a JSONL history in the platform state dir and, when a profile is named, to the
profile's `[verified] tok_s_at_depth`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from console.core.events import PoolSummary
from console.core.gpus import GpuSample
from console.core.metrics import Histogram, SglangMetrics
from console.core.models import ModelConfigError, find_model, get_model
from console.core.pairing import Identity
from console.core.parser import parse_lines
from console.core.probe import (
    ProbeMeasurement,
    ProbePhase,
    ProbeProgress,
    ProbeReport,
    ProbeResult,
    ProbeStatus,
    ProbeTarget,
    ServerLimits,
    card_peak,
    failed_result,
    fmt_depth,
    generate_payload,
    kv_bytes_per_token,
    live_tok_s,
    random_prompt,
    refusal,
    refused_result,
    summarize,
    sweep_fit,
)
from console.core.text import json_safe
from console.sources.gpus import open_sampler
from console.sources.hosts import HostConfig
from console.sources.journal import read_unit_journal
from console.sources.probe_history import append_history, record_profile
from console.sources.profile_store import ProfileStore
from console.sources.server import ServerClient, ServerError
from console.sources.transport import Backoff, Transport, TransportError

DEFAULT_NEW_TOKENS = 32
DEFAULT_TTFT_TIMEOUT_S = 900.0
"""A 200k-token prefill takes tens of seconds on a healthy host; a stuck one should not hang forever."""
DEFAULT_STALL_TIMEOUT_S = 120.0
"""Longest wait between two tokens once decoding has started (0.7 tok/s is 1.4 s a token)."""

ProgressCallback = Callable[[ProbeProgress], None]


class ProbeError(Exception):
    """The probe cannot run or was cut short; `str()` is one sentence for the operator."""


# ------------------------------------------------------------------------------------------------
# what the server can take, and what it runs on
# ------------------------------------------------------------------------------------------------


def _dict(value: object) -> dict[str, Any]:
    """A JSON object from the server, or an empty one when it sent something else."""
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def limits_from_info(info: dict[str, Any]) -> ServerLimits:
    """Context length, pool and longest input from `/server_info` (older servers: `/get_server_info`)."""
    states = info.get("internal_states")
    state = _dict(states[0]) if isinstance(states, list) and states else {}
    memory = _dict(state.get("memory_usage"))
    return ServerLimits(
        context_len=_int(info.get("context_length")) or _int(info.get("context_len")),
        pool_tokens=_int(info.get("max_total_num_tokens")) or _int(memory.get("token_capacity")),
        max_req_input_len=_int(info.get("max_req_input_len")),
        source="server_info",
    )


def limits_from_journal(lines: Sequence[str]) -> ServerLimits | None:
    """The latest `max_total_num_tokens=..., context_len=...` line of the journal, if any."""
    summary = None
    for event in parse_lines(list(lines)):
        if isinstance(event, PoolSummary):
            summary = event
    if summary is None:
        return None
    return ServerLimits(
        context_len=summary.context_len, pool_tokens=summary.max_total_num_tokens, source="journal"
    )


def target_from(
    host: HostConfig,
    info: dict[str, Any],
    gpu_name: str | None,
    gpu_count: int | None,
    gpu_sample: GpuSample | None = None,
) -> ProbeTarget:
    """The card's peak bandwidth (NVML's own where the GPU sample carries it, else the table's; a card the
    hosts file names is the table's) and the KV cell of the served model (host-file overrides first)."""
    spec = None
    if host.model:
        with contextlib.suppress(ModelConfigError):
            spec = get_model(host.model)
    model_path = info.get("model_path") if isinstance(info.get("model_path"), str) else None
    if spec is None:
        spec = find_model(model_path)
    tp = _int(info.get("tp_size")) or 1
    dtype = info.get("kv_cache_dtype") if isinstance(info.get("kv_cache_dtype"), str) else None
    gpu = host.gpu or gpu_name
    peak, peak_from, peak_source = card_peak(None if host.gpu else gpu_sample, gpu)
    backend = info.get("decode_attention_backend") or info.get("attention_backend")
    return ProbeTarget(
        host=host.name,
        gpu_name=gpu,
        gpu_count=host.gpu_count or gpu_count,
        model=spec.name if spec else model_path,
        tp_size=tp,
        kv_cache_dtype=dtype,
        kv_bytes_per_token_per_gpu=kv_bytes_per_token(spec, tp, dtype),
        peak_bandwidth_gbs=peak,
        peak_from=peak_from,
        peak_source=peak_source,
        attention_backend=str(backend) if backend else None,
        page_size=_int(info.get("page_size")),
    )


def _itl(metrics: SglangMetrics | None) -> Histogram | None:
    return metrics.inter_token_latency if metrics is not None else None


def server_tok_s(before: SglangMetrics | None, after: SglangMetrics | None) -> float | None:
    """Decode tok/s by the server's own clock: inter-token latencies it observed during the probe."""
    a, b = _itl(before), _itl(after)
    if a is None or b is None:
        return None
    count, total = b.count - a.count, b.sum - a.sum
    return count / total if count > 0 and total > 0 else None


# ------------------------------------------------------------------------------------------------
# the prober
# ------------------------------------------------------------------------------------------------


class Prober:
    """Probes one server. `client` reaches its HTTP API; `transport` (when the host is remote) reads the
    journal and runs nvidia-smi. Progress goes to `on_progress` (called in the event loop's thread)."""

    def __init__(
        self,
        client: ServerClient,
        host: HostConfig,
        *,
        transport: Transport | None = None,
        rng: random.Random | None = None,
        ttft_timeout_s: float = DEFAULT_TTFT_TIMEOUT_S,
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.client = client
        self.host = host
        self.transport = transport
        # A fresh prefix each run: seeded from the OS unless a test pins it.
        self.rng = rng or random.Random()
        self.ttft_timeout_s = ttft_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.clock = clock
        self.now = now
        self.target: ProbeTarget | None = None
        self.limits: ServerLimits | None = None

    # ---- what the server is ----------------------------------------------------------------------

    async def _gpu(self) -> tuple[str | None, int | None, GpuSample | None]:
        """The card's name, the GPU count and the first GPU's sample, from one reading of the sampler
        the host allows (the NVML agent, whose sample carries the card's own peak, else nvidia-smi)."""
        if self.host.gpu:
            return self.host.gpu, self.host.gpu_count, None
        if self.transport is None and not self.host.local:
            return None, None, None
        sampler, sample = await open_sampler(self.transport, interval_s=1.0, host=self.host.name)
        await sampler.close()
        named = [g for g in sample.gpus if g.name]
        return (named[0].name if named else None), (len(sample.gpus) or None), (named[0] if named else None)

    async def _journal_limits(self) -> ServerLimits | None:
        if self.transport is None:
            return None
        try:
            lines = await read_unit_journal(self.transport, self.host.unit_name, lines=20_000)
        except TransportError:
            return None
        return limits_from_journal(lines)

    async def prepare(self) -> tuple[ProbeTarget, ServerLimits]:
        """Ask the server (and the host) once: its limits, its model and its cards."""
        health = await self.client.health()
        if health.status_code != 200:
            why = health.detail or f"/health answered {health.status_code}"
            raise ProbeError(f"{self.client.label} is not ready to probe ({why.rstrip('.')})")
        info: dict[str, Any] = {}
        try:
            info = await self.client.server_info()
        except ServerError as exc:
            journal = await self._journal_limits()
            if journal is None:
                raise ProbeError(f"{str(exc).rstrip('.')}, so the probe cannot check its limits.") from None
            limits = journal
        else:
            limits = limits_from_info(info)
            if limits.context_len is None or limits.pool_tokens is None:
                journal = await self._journal_limits()
                if journal is not None:
                    limits = limits.model_copy(
                        update={
                            "context_len": limits.context_len or journal.context_len,
                            "pool_tokens": limits.pool_tokens or journal.pool_tokens,
                            "source": f"{limits.source}+journal",
                        }
                    )
        gpu_name, gpu_count, gpu_sample = await self._gpu()
        self.target = target_from(self.host, info, gpu_name, gpu_count, gpu_sample)
        self.limits = limits
        return self.target, limits

    async def _metrics(self) -> SglangMetrics | None:
        try:
            return await self.client.metrics()
        except ServerError:
            return None

    # ---- one depth -------------------------------------------------------------------------------

    async def _events(self, payload: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The stream's events; the first may take the whole prefill, later ones only a decode step."""
        stream = self.client.generate_stream(payload, timeout_s=None)
        first = True
        try:
            while True:
                wait = self.ttft_timeout_s if first else self.stall_timeout_s
                try:
                    async with asyncio.timeout(wait):
                        event = await anext(stream)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    what = "the first token" if first else "the next token"
                    raise ProbeError(f"no answer within {wait:g} s waiting for {what}") from None
                if _tokens(event) > 0:
                    first = False
                yield event
        finally:
            await stream.aclose()

    async def probe(
        self,
        depth: int,
        new_tokens: int,
        *,
        on_progress: ProgressCallback | None = None,
        index: int = 0,
        total: int = 1,
    ) -> ProbeResult:
        """One depth: refused up front if it cannot fit, else streamed and measured. Cancelling the task
        closes the stream (the server aborts the request) and re-raises after reporting it."""
        if self.target is None or self.limits is None:
            await self.prepare()
        assert self.target is not None and self.limits is not None
        target = self.target
        report = on_progress or (lambda _p: None)
        common: dict[str, Any] = {
            "depth": depth,
            "index": index,
            "total": total,
            "requested_tokens": new_tokens,
        }
        reason = refusal(depth, new_tokens, self.limits)
        if reason is not None:
            result = refused_result(depth, new_tokens, reason, target)
            report(ProbeProgress(phase=ProbePhase.REFUSED, detail=reason, result=result, **common))
            return result
        payload = generate_payload(random_prompt(depth, self.rng), new_tokens)
        before = await self._metrics()
        measurement = ProbeMeasurement(depth=depth, requested_tokens=new_tokens)
        report(ProbeProgress(phase=ProbePhase.PREFILL, **common))
        started = self.clock()
        try:
            async for event in self._events(payload):
                tokens = _tokens(event)
                meta = _dict(event.get("meta_info"))
                measurement.prompt_tokens = _int(meta.get("prompt_tokens")) or measurement.prompt_tokens
                cached = meta.get("cached_tokens")
                if isinstance(cached, int):
                    measurement.cached_tokens = cached
                finish = meta.get("finish_reason")
                if isinstance(finish, dict):
                    measurement.finish_reason = str(finish.get("type") or "finished")
                elif isinstance(finish, str):
                    measurement.finish_reason = finish
                last = measurement.arrivals[-1][1] if measurement.arrivals else 0
                if tokens > last:
                    now = self.clock() - started
                    measurement.arrivals.append((now, tokens))
                    report(
                        ProbeProgress(
                            phase=ProbePhase.DECODING,
                            tokens=tokens,
                            elapsed_s=now,
                            ttft_s=measurement.arrivals[0][0],
                            live_tok_s=live_tok_s(measurement.arrivals),
                            **common,
                        )
                    )
        except asyncio.CancelledError:
            result = failed_result(measurement, target, "the operator cancelled the probe", cancelled=True)
            report(ProbeProgress(phase=ProbePhase.CANCELLED, detail=result.error, result=result, **common))
            raise
        except (ServerError, ProbeError) as exc:
            return self._fail(measurement, _stopped(depth, measurement, str(exc)), report, common)
        got = measurement.arrivals[-1][1] if measurement.arrivals else 0
        if got < new_tokens and measurement.finish_reason in (None, "abort"):
            why = "the stream ended without finishing"
            if measurement.finish_reason == "abort":
                why = "the server aborted the request"
            return self._fail(measurement, _stopped(depth, measurement, why), report, common)
        measurement.server_decode_tok_s = server_tok_s(before, await self._metrics())
        result = summarize(measurement, target)
        elapsed = measurement.arrivals[-1][0] if measurement.arrivals else 0.0
        report(ProbeProgress(phase=ProbePhase.DONE, tokens=got, elapsed_s=elapsed, result=result, **common))
        return result

    def _fail(
        self,
        measurement: ProbeMeasurement,
        error: str,
        report: ProgressCallback,
        common: dict[str, Any],
    ) -> ProbeResult:
        assert self.target is not None
        result = failed_result(measurement, self.target, error)
        report(ProbeProgress(phase=ProbePhase.FAILED, detail=error, result=result, **common))
        return result

    # ---- a sweep ---------------------------------------------------------------------------------

    async def sweep(
        self,
        depths: Sequence[int],
        new_tokens: int,
        *,
        profile: str | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> ProbeReport:
        """The depths in order; a depth that cannot fit is refused without a request and the depths that
        fit still run. When the server dies mid-sweep the rest are marked skipped, not tried."""
        started_at = self.now()
        if self.target is None or self.limits is None:
            await self.prepare()
        assert self.target is not None and self.limits is not None
        results: list[ProbeResult] = []
        for i, depth in enumerate(depths):
            # A depth that cannot fit is refused inside probe() without a request.
            results.append(
                await self.probe(depth, new_tokens, on_progress=on_progress, index=i, total=len(depths))
            )
            if results[-1].status is ProbeStatus.FAILED and not await self._alive():
                # The server is gone: the remaining depths would all fail the same way.
                for j, rest in enumerate(depths[i + 1 :], start=i + 1):
                    reason = "skipped: the server stopped answering during an earlier depth"
                    results.append(
                        refused_result(rest, new_tokens, reason, self.target).model_copy(
                            update={"status": ProbeStatus.FAILED, "diagnosis": reason}
                        )
                    )
                    if on_progress:
                        on_progress(
                            ProbeProgress(
                                phase=ProbePhase.FAILED,
                                depth=rest,
                                index=j,
                                total=len(depths),
                                requested_tokens=new_tokens,
                                detail=reason,
                                result=results[-1],
                            )
                        )
                break
        return ProbeReport(
            host=self.host.name,
            profile=profile,
            run_id=uuid.uuid4().hex[:12],
            started_at=started_at,
            target=self.target,
            limits=self.limits,
            requested_tokens=new_tokens,
            results=results,
            fit=sweep_fit(results, self.target),
        )

    async def _alive(self) -> bool:
        sample = await self.client.health()
        return sample.status_code == 200


def _tokens(event: dict[str, Any]) -> int:
    """Tokens generated so far: `completion_tokens` (cumulative in both streaming modes), else the
    cumulative `output_ids` of the default (non-incremental) stream."""
    meta = event.get("meta_info")
    if isinstance(meta, dict) and isinstance(meta.get("completion_tokens"), int):
        return int(meta["completion_tokens"])
    ids = event.get("output_ids")
    return len(ids) if isinstance(ids, list) else 0


def _stopped(depth: int, measurement: ProbeMeasurement, why: str) -> str:
    got = measurement.arrivals[-1][1] if measurement.arrivals else 0
    where = f"the probe at {fmt_depth(depth)} depth"
    if got == 0:
        return f"{where} got no token: {why.rstrip('.')}"
    return f"{where} stopped after {got} of {measurement.requested_tokens} tokens: {why.rstrip('.')}"


# ------------------------------------------------------------------------------------------------
# one call for the CLI
# ------------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def open_prober(
    host: HostConfig, *, transport: Transport | None = None, **options: Any
) -> AsyncIterator[Prober]:
    """A prober for `host`: through an SSH forward (a transport of its own unless one is given), or
    straight at `server_url` for a host marked `local`."""
    own: Transport | None = None
    if host.local:
        client = ServerClient(host.server_url, label=f"the SGLang server at {host.server_url}")
    else:
        if transport is None:
            own = transport = Transport(host, backoff=Backoff(max_attempts=3))
        try:
            await transport.wait_up(30.0)
            client = await ServerClient.through(transport, host)
        except BaseException:
            if own is not None:
                await own.close()
            raise
    try:
        yield Prober(client, host, transport=transport, **options)
    finally:
        await client.aclose()
        if own is not None:
            await own.close()


async def run_probe(
    host: HostConfig,
    depths: Sequence[int],
    new_tokens: int,
    *,
    profile: str | None = None,
    history: Path | None = None,
    keep: bool = True,
    on_progress: ProgressCallback | None = None,
    store: ProfileStore | None = None,
    **options: Any,
) -> ProbeReport:
    """Probe `depths` on `host` and keep the results (history file; the profile when named)."""
    async with open_prober(host, **options) as prober:
        report = await prober.sweep(depths, new_tokens, profile=profile, on_progress=on_progress)
    if keep:
        keep_report(report, history=history, store=store)
    return report


def keep_report(
    report: ProbeReport, *, history: Path | None = None, store: ProfileStore | None = None
) -> None:
    """History always; the profile's verified section when the run names one and measured something."""
    append_history(report, history)
    if report.profile:
        record_profile(report, report.profile, store)


async def profile_in_force(
    host: HostConfig, transport: Transport, store: ProfileStore | None = None
) -> str | None:
    """The saved profile the host's unit runs as `apply` writes it, or None (none does, or the unit's
    ExecStart cannot be read)."""
    from console.core.apply import why_not_running
    from console.core.profiles import ProfileError
    from console.sources.service import ServiceController, ServiceError

    try:
        running = await ServiceController(host, transport).running_argv()
    except (ServiceError, TransportError):
        return None
    store = store or ProfileStore()
    for entry in store.entries():
        try:
            profile = store.load(entry.name)
        except ProfileError:
            continue
        if why_not_running(profile, running) is None:
            return profile.name
    return None


async def audit_probe(
    transport: Transport,
    host: HostConfig,
    report: ProbeReport,
    took_s: float,
    *,
    me: Identity | None = None,
    store: ProfileStore | None = None,
) -> str | None:
    """Put the run into the host's audit trail (who probed, at which depths, how fast, and the profile
    the host ran: the one the results went into, else the saved profile its unit runs). Returns the
    sentence to show when the trail could not be written: the measurement stands either way. The
    command line's probes said profile `-` where the console's named the profile (it was given
    --profile): both now name what ran."""
    from console.sources.hoststate import HostStateDir, HostStateError

    speeds = ", ".join(
        f"{fmt_depth(r.depth)} {r.decode_tok_s:.2f} tok/s"
        if r.decode_tok_s is not None
        else f"{fmt_depth(r.depth)} {r.status.value}"
        for r in report.results
    )
    state = HostStateDir(transport, host, me)
    try:
        ran = report.profile or await profile_in_force(host, transport, store)
        entry = state.audit.entry(
            "probe",
            profile=ran,
            outcome="ok" if report.ok else "failed",
            summary=f"{speeds}; {report.summary().rstrip('.')}",
            total_s=round(took_s, 3),
        )
        await state.audit.append(entry)
    except (HostStateError, TransportError) as exc:
        return f"the probe could not be written to {host.name}'s audit trail: {exc}"
    return None


def report_json(report: ProbeReport) -> str:
    """The `probe --json` object: the report, plus `summary` and `ok`."""
    data = report.model_dump(mode="json")
    data["ok"] = report.ok
    data["summary"] = report.summary()
    return json_safe(json.dumps(data, ensure_ascii=False))


__all__ = [
    "DEFAULT_NEW_TOKENS",
    "ProbeError",
    "Prober",
    "keep_report",
    "limits_from_info",
    "limits_from_journal",
    "open_prober",
    "report_json",
    "run_probe",
    "server_tok_s",
    "target_from",
]
