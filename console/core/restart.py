"""The safe restart as a pure state machine.

The service controller (sources/service) does the work and tells the machine what happened; the journal
follower feeds it events. The machine never reads a clock: every call takes `now` (seconds, any
monotonic origin), and it records when each phase began and ended.

Phases, in order::

    validate → diff → write_dropin → daemon_reload → restart        (steps the controller runs)
    → stopping → launching → loading_weights → kv_pool → cuda_graphs (followed from the journal)
    → ready | failed
    → verify → record                                                 (steps the controller runs)
    → done

Journal events move the boot forward: `unit` stopping/started, `server_args`/`dist_init` (launching),
`weights_begin`/`weights_loaded` (loading weights), `kv_pool_allocated`/`memory_pool_end` and the pools of
the newer models — `mamba_pool_allocated`, `swa_pool_split`/`swa_pool_allocated`, `dsv4_memory`/`dsv4_pool`
(KV pool; their full pool is the context pool noted),
`cuda_graph` (CUDA graphs), `pool_summary` (pool size noted), `server_ready` (ready), `error` or a failed or
stopped unit after launch (failed). SGLang ≤ 0.5.13 loads a speculative draft after the target's graphs
(weights → pool → graphs again); the boot phases may therefore be entered more than once and their
durations add up. Repeated events (a follower that resumed after a dropped connection) change nothing.

The ETA comes from earlier restarts of the same host: the median duration of each phase still ahead,
plus what is left of the current one. The same history gives every phase of the restart a deadline
(`phase_limit`): the median times `PHASE_FACTOR`, and never less than the median plus a margin; a phase
with no history gets `DEFAULT_PHASE_LIMITS_S`. A boot whose exec failed without a word to the journal
otherwise sits in "launching" until the whole boot timeout (30 min) runs out.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from console.core.events import (
    CudaGraph,
    DistInit,
    Dsv4Memory,
    Dsv4Pool,
    Error,
    Event,
    KvPoolAllocated,
    MambaPoolAllocated,
    MemoryPoolEnd,
    PoolSummary,
    ServerArgs,
    ServerReady,
    SwaPoolAllocated,
    SwaPoolSplit,
    Unit,
    WeightsBegin,
    WeightsLoaded,
)

_POOL_EVENTS = (
    KvPoolAllocated,
    MemoryPoolEnd,
    MambaPoolAllocated,
    SwaPoolSplit,
    SwaPoolAllocated,
    Dsv4Memory,
    Dsv4Pool,
)
"""Lines SGLang prints while it sizes and allocates the KV cache: the KV pool phase."""
_FULL_POOL_EVENTS = (SwaPoolSplit, SwaPoolAllocated, Dsv4Memory, Dsv4Pool)
"""Lines that name the full-attention pool, the context pool, of a sliding-window or DeepSeek-V4 boot (its
KV lines may be the sliding-window pool's)."""


class Phase(StrEnum):
    VALIDATE = "validate"
    DIFF = "diff"
    WRITE_DROPIN = "write_dropin"
    DAEMON_RELOAD = "daemon_reload"
    RESTART = "restart"
    STOPPING = "stopping"
    LAUNCHING = "launching"
    LOADING_WEIGHTS = "loading_weights"
    KV_POOL = "kv_pool"
    CUDA_GRAPHS = "cuda_graphs"
    READY = "ready"
    FAILED = "failed"
    VERIFY = "verify"
    RECORD = "record"
    DONE = "done"


PHASE_LABELS: dict[Phase, str] = {
    Phase.VALIDATE: "validate",
    Phase.DIFF: "diff",
    Phase.WRITE_DROPIN: "write drop-in",
    Phase.DAEMON_RELOAD: "daemon-reload",
    Phase.RESTART: "restart",
    Phase.STOPPING: "stopping",
    Phase.LAUNCHING: "launching",
    Phase.LOADING_WEIGHTS: "loading weights",
    Phase.KV_POOL: "KV pool",
    Phase.CUDA_GRAPHS: "CUDA graphs",
    Phase.READY: "ready",
    Phase.FAILED: "failed",
    Phase.VERIFY: "verify",
    Phase.RECORD: "record",
    Phase.DONE: "done",
}

STEPS: tuple[Phase, ...] = (
    Phase.VALIDATE,
    Phase.DIFF,
    Phase.WRITE_DROPIN,
    Phase.DAEMON_RELOAD,
    Phase.RESTART,
)
"""Phases the controller runs and reports with `step_done`, in order."""
BOOT: tuple[Phase, ...] = (
    Phase.STOPPING,
    Phase.LAUNCHING,
    Phase.LOADING_WEIGHTS,
    Phase.KV_POOL,
    Phase.CUDA_GRAPHS,
)
"""Phases followed from the journal."""
ORDER: tuple[Phase, ...] = (*STEPS, *BOOT, Phase.READY, Phase.VERIFY, Phase.RECORD, Phase.DONE)
_RANK = {p: i for i, p in enumerate(ORDER)}
_RANK[Phase.FAILED] = _RANK[Phase.READY]
_FATAL = {
    "cuda_oom",
    "not_enough_memory",
    "cuda_graph_failed",
    "nccl_timeout",
    "watchdog_timeout",
    "scheduler_exception",
    "traceback",
}

Outcome = Literal["verified", "failed", "refused", "unchanged", "not_verified"]

PHASE_FACTOR = 3.0
"""A phase may take this many times its median over earlier restarts before the restart is failed."""
PHASE_MARGIN_S = 60.0
"""...and never less than its median plus this (a short phase's median is jitter, not a bound)."""
DEFAULT_PHASE_LIMITS_S: dict[Phase, float] = {
    Phase.RESTART: 120.0,  # the `systemctl restart` call itself
    Phase.STOPPING: 150.0,  # systemd's TimeoutStopSec (90 s) then SIGKILL, with room
    Phase.LAUNCHING: 600.0,  # Python imports, NCCL init, the first log lines
    Phase.LOADING_WEIGHTS: 3600.0,  # 400+ GB from a cold network disk
    Phase.KV_POOL: 600.0,
    Phase.CUDA_GRAPHS: 1800.0,
}
"""Deadlines for a phase this host has no history of (the boot timeout still caps the whole boot)."""


class RestartError(ValueError):
    """A call the machine cannot accept in its current phase (a controller bug, not a host problem)."""


class PhaseSpan(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True)

    phase: Phase
    start: float
    end: float | None = None

    @property
    def duration(self) -> float | None:
        return None if self.end is None else self.end - self.start


class RestartRecord(BaseModel, defer_build=True):
    """What a restart did, for the audit log, the profile and later ETAs."""

    profile: str
    host: str | None = None
    purpose: Literal["apply", "rollback"] = "apply"
    started: float
    ended: float | None = None
    outcome: Outcome | None = None
    reason: str | None = None
    spans: list[PhaseSpan] = Field(default_factory=list)
    durations: dict[Phase, float] = Field(default_factory=dict)
    pool_tokens: int | None = None
    available_gpu_mem_gb: float | None = None
    errors: list[str] = Field(default_factory=list)


def median_durations(history: Iterable[Mapping[Phase | str, float]]) -> dict[Phase, float]:
    """Median duration per phase over earlier restarts (each a `RestartRecord.durations`)."""
    samples: dict[Phase, list[float]] = {}
    for durations in history:
        for phase, seconds in durations.items():
            samples.setdefault(Phase(phase), []).append(float(seconds))
    return {p: statistics.median(v) for p, v in samples.items()}


class RestartMachine:
    def __init__(
        self,
        profile: str,
        *,
        now: float,
        host: str | None = None,
        purpose: Literal["apply", "rollback"] = "apply",
        history: Iterable[Mapping[Phase | str, float]] = (),
        phase_factor: float = PHASE_FACTOR,
        phase_margin_s: float = PHASE_MARGIN_S,
        default_limits_s: Mapping[Phase, float] | None = None,
    ) -> None:
        self.profile = profile
        self.phase_factor = phase_factor
        self.phase_margin_s = phase_margin_s
        self.default_limits_s = dict(DEFAULT_PHASE_LIMITS_S if default_limits_s is None else default_limits_s)
        self.host = host
        self.purpose = purpose
        self.started = now
        self.ended: float | None = None
        self.outcome: Outcome | None = None
        self.reason: str | None = None
        self.spans: list[PhaseSpan] = [PhaseSpan(phase=Phase.VALIDATE, start=now)]
        self.pool_tokens: int | None = None
        self._full_pool = False  # pool_tokens came from a line that names the full pool
        self.available_gpu_mem_gb: float | None = None
        self.errors: list[str] = []
        self.replaced_invocation: str | None = None
        """The unit's invocation when the restart was issued: its own end (stopped, or failed when it was
        stopped while still starting) and its last lines are the old boot's, not the new one's."""
        self.expected = median_durations(history)
        self._seen: set[str] = set()
        self._verified_ok = False
        self._paused_s = 0.0  # of the current phase: seconds its deadline did not count (a lost link)

    # ---- state ---------------------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        return self.spans[-1].phase

    @property
    def finished(self) -> bool:
        return self.phase == Phase.DONE

    @property
    def booting(self) -> bool:
        return self.phase in BOOT or self.phase == Phase.RESTART

    def _enter(self, phase: Phase, now: float) -> None:
        if phase == self.phase:
            return
        last = self.spans[-1]
        now = max(now, last.start)  # a clock that steps back must not make a negative duration
        self.spans[-1] = last.model_copy(update={"end": now})
        self.spans.append(PhaseSpan(phase=phase, start=now))
        self._paused_s = 0.0

    def _finish(self, outcome: Outcome, now: float, reason: str | None = None) -> None:
        self._enter(Phase.DONE, now)
        last = self.spans[-1]
        self.spans[-1] = last.model_copy(update={"end": last.start})
        self.ended = last.start
        self.outcome = outcome
        if reason and not self.reason:
            self.reason = reason

    # ---- controller steps ----------------------------------------------------------------------

    def step_done(self, phase: Phase, now: float, *, ok: bool = True, reason: str | None = None) -> None:
        """The controller finished `phase` (one of STEPS, VERIFY or RECORD).

        - validate refused → done, outcome `refused`;
        - diff with `ok=False` means nothing to change → done, outcome `unchanged`;
        - write_dropin / daemon_reload / restart failing → failed, then done (outcome `failed`);
        - verify failing → outcome `not_verified` after record; record → done."""
        if (
            phase == Phase.RESTART
            and self.phase != Phase.RESTART
            and _RANK[self.phase] > _RANK[Phase.RESTART]
        ):
            # The journal got there first (the stop and the new boot were already seen).
            if not ok and self.phase in BOOT:
                self._fail(now, reason or "systemctl restart failed")
            return
        if phase != self.phase:
            raise RestartError(f"{phase.value} reported while the restart is in {self.phase.value}")
        if phase == Phase.VALIDATE:
            if not ok:
                self._finish("refused", now, reason)
                return
            self._enter(Phase.DIFF, now)
        elif phase == Phase.DIFF:
            if not ok:
                self._finish("unchanged", now, reason or "the service already runs this profile")
                return
            self._enter(Phase.WRITE_DROPIN, now)
        elif phase in (Phase.WRITE_DROPIN, Phase.DAEMON_RELOAD):
            if not ok:
                self.reason = reason
                self._enter(Phase.FAILED, now)
                self._finish("failed", now, reason)
                return
            self._enter(ORDER[_RANK[phase] + 1], now)
        elif phase == Phase.RESTART:
            # `systemctl restart` returned: the stop has been requested. Journal events may already have
            # moved the machine on; they arrive before or after this call depending on the connection.
            if not ok:
                self._enter(Phase.FAILED, now)
                self._finish("failed", now, reason)
                return
            self._enter(Phase.STOPPING, now)
        elif phase == Phase.VERIFY:
            if not ok:
                self.reason = reason
            self._verified_ok = ok
            self._enter(Phase.RECORD, now)
        elif phase == Phase.RECORD:
            self._finish("verified" if self._verified_ok else "not_verified", now, reason)
        else:
            raise RestartError(f"{phase.value} is followed from the journal, not reported by the controller")

    def begin_verify(self, now: float) -> None:
        """The boot ended in ready; the controller starts verifying (pool ≥ target, no errors, headroom)."""
        if self.phase != Phase.READY:
            raise RestartError(f"verify starts after ready, not in {self.phase.value}")
        self._enter(Phase.VERIFY, now)

    def finish_failed(self, now: float) -> None:
        """After a failed boot: close the restart (a rollback, if any, is a new machine)."""
        if self.phase != Phase.FAILED:
            raise RestartError(f"the restart is in {self.phase.value}, not failed")
        self._finish("failed", now)

    def timed_out(self, now: float, reason: str) -> None:
        """The controller gave up waiting for the boot (its own deadline)."""
        if self.phase in BOOT or self.phase == Phase.RESTART:
            self.reason = reason
            self.errors.append(reason)
            self._enter(Phase.FAILED, now)

    # ---- journal events ------------------------------------------------------------------------

    def feed(self, event: Event, now: float) -> Phase:
        """Advance on one journal event; returns the phase after it. Events outside the boot (before the
        restart was issued, or after ready/failed) are ignored, and so is a repeated event."""
        if not (self.phase == Phase.RESTART or self.phase in BOOT):
            return self.phase
        key = event.cursor or None
        if key is not None:
            if key in self._seen:
                return self.phase
            self._seen.add(key)
        launched = _RANK[self.phase] >= _RANK[Phase.LAUNCHING]
        if self.replaced_invocation and event.invocation_id == self.replaced_invocation:
            # The old invocation going away (seen on a real systemd: a unit stopped in its start-post
            # phase ends "Failed with result 'signal'"): only its "Stopping" moves the restart on.
            if isinstance(event, Unit) and event.state == "stopping" and not launched:
                self._enter(Phase.STOPPING, now)
            return self.phase
        if isinstance(event, Unit):
            if event.state == "stopping":
                if not launched:
                    self._enter(Phase.STOPPING, now)
            elif event.state in ("starting", "started"):
                if not launched:
                    self._enter(Phase.LAUNCHING, now)
            elif event.state == "failed":
                self._fail(now, event.message or f"the unit failed ({event.result or 'no result given'})")
            elif event.state == "stopped" and launched:
                self._fail(now, event.message or "the service stopped before it was ready")
        elif isinstance(event, ServerArgs | DistInit):
            if not launched:
                self._enter(Phase.LAUNCHING, now)
        elif isinstance(event, WeightsBegin | WeightsLoaded):
            self._boot(Phase.LOADING_WEIGHTS, now)
        elif isinstance(event, _POOL_EVENTS):
            if isinstance(event, _FULL_POOL_EVENTS) and event.full_tokens is not None and not self._full_pool:
                self.pool_tokens = event.full_tokens
                self._full_pool = True
            elif isinstance(event, KvPoolAllocated) and event.tokens is not None and self.pool_tokens is None:
                self.pool_tokens = event.tokens
            self._boot(Phase.KV_POOL, now)
        elif isinstance(event, CudaGraph):
            self._boot(Phase.CUDA_GRAPHS, now)
        elif isinstance(event, PoolSummary):
            self.pool_tokens = event.max_total_num_tokens
            self.available_gpu_mem_gb = event.available_gpu_mem_gb
        elif isinstance(event, ServerReady):
            if launched:
                self._enter(Phase.READY, now)
        elif isinstance(event, Error):
            if launched and event.category in _FATAL:
                self._fail(now, f"{event.category}: {event.message}")
            else:
                self.errors.append(f"{event.category}: {event.message}")
        return self.phase

    def _boot(self, phase: Phase, now: float) -> None:
        # Weights/pool/graphs lines mean the new process runs, even if the start line was missed.
        self._enter(phase, now)

    def _fail(self, now: float, reason: str) -> None:
        self.errors.append(reason)
        self.reason = self.reason or reason
        self._enter(Phase.FAILED, now)

    # ---- timings -------------------------------------------------------------------------------

    def durations(self, now: float | None = None) -> dict[Phase, float]:
        """Seconds spent in each phase so far (repeated phases add up); the open phase counts up to
        `now` when given."""
        out: dict[Phase, float] = {}
        for span in self.spans:
            if span.phase == Phase.DONE:
                continue
            end = span.end if span.end is not None else now
            if end is None:
                continue
            out[span.phase] = out.get(span.phase, 0.0) + max(0.0, end - span.start)
        return out

    def elapsed(self, now: float) -> float:
        return (self.ended if self.ended is not None else now) - self.started

    def eta(self, now: float) -> float | None:
        """Seconds until ready, from earlier restarts' phase durations; None without history or once the
        boot has ended."""
        if not self.expected or _RANK[self.phase] >= _RANK[Phase.READY]:
            return None
        spent = self.durations(now)
        remaining = 0.0
        for phase in ORDER[_RANK[self.phase] : _RANK[Phase.READY]]:
            expected = self.expected.get(phase)
            if expected is None:
                continue
            if phase == self.phase:
                remaining += max(0.0, expected - spent.get(phase, 0.0))
            else:
                remaining += expected
        return remaining

    def phase_limit(self, phase: Phase | None = None) -> float | None:
        """Seconds `phase` (default: the current one) may last before the restart is failed; None for a
        phase without a deadline (the controller's own steps have their command timeouts)."""
        phase = phase or self.phase
        if phase not in self.default_limits_s:
            return None
        expected = self.expected.get(phase)
        if expected is None:
            return self.default_limits_s[phase]
        return max(expected * self.phase_factor, expected + self.phase_margin_s)

    def pause(self, seconds: float) -> None:
        """The current phase's deadline does not count these seconds: the controller could not see the
        host meanwhile (a lost link), so the boot's silence then says nothing about the boot."""
        self._paused_s += max(0.0, seconds)

    def overdue(self, now: float) -> str | None:
        """When the current phase has run past its deadline: why, in words (the caller fails the restart
        with `timed_out`); None while it is on time. Several entries of one phase (a draft model
        loading after the target) each get the whole limit."""
        limit = self.phase_limit()
        if limit is None:
            return None
        spent = now - self.spans[-1].start - self._paused_s
        if spent <= limit:
            return None
        label = PHASE_LABELS[self.phase]
        expected = self.expected.get(self.phase)
        basis = (
            f"earlier restarts of this host took {expected:.1f} s there; the limit is "
            f"{self.phase_factor:g}x that, at least {self.phase_margin_s:g} s more"
            if expected is not None
            else "no earlier restart of this host to judge by; that is the default limit"
        )
        return f"stuck in {label} for {spent:.1f} s, past its deadline of {limit:.1f} s ({basis})"

    def record(self) -> RestartRecord:
        return RestartRecord(
            profile=self.profile,
            host=self.host,
            purpose=self.purpose,
            started=self.started,
            ended=self.ended,
            outcome=self.outcome,
            reason=self.reason,
            spans=list(self.spans),
            durations=self.durations(),
            pool_tokens=self.pool_tokens,
            available_gpu_mem_gb=self.available_gpu_mem_gb,
            errors=list(self.errors),
        )


__all__ = [
    "BOOT",
    "DEFAULT_PHASE_LIMITS_S",
    "ORDER",
    "PHASE_FACTOR",
    "PHASE_LABELS",
    "PHASE_MARGIN_S",
    "STEPS",
    "Outcome",
    "Phase",
    "PhaseSpan",
    "RestartError",
    "RestartMachine",
    "RestartRecord",
    "median_durations",
]
