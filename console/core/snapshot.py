"""What the screens and the command line see of one live host: an immutable snapshot.

`HostSnapshot` composes the folded `HostState` (boots, pool, errors) with what the state does not hold:
the SSH link, the journal follower's progress, the latest GPU sample, the server's health and metrics,
and a bounded tail of recent events (the log pane). `console.sources.session` builds a new one whenever
something changes; nothing here does I/O or knows the time — times are passed in.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from console.core.events import Event
from console.core.gpus import HostGpuSample
from console.core.metrics import MetricsText, SglangMetrics
from console.core.serving import ServingFigures, TrendPoint
from console.core.state import HostState


class ConnState(StrEnum):
    CONNECTING = "connecting"
    UP = "up"
    RETRYING = "retrying"
    FAILED = "failed"
    CLOSED = "closed"


class ConnectionStatus(BaseModel, defer_build=True):
    """The SSH link to a host: connecting / up / retrying in Ns / failed: reason."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str
    state: ConnState
    since: float
    """Unix time of the change to this state."""
    attempt: int = 0
    """Consecutive failed attempts so far (0 once up)."""
    retry_in_s: float | None = None
    reason: str | None = None
    """Why the link is not up, in one sentence (the last error)."""
    fingerprint: str | None = None
    """The fingerprint the server presented, when its host key was refused."""
    connect_s: float | None = None
    """How long the last successful connect took (TCP + key exchange + authentication)."""
    drops: int = 0
    """How many times an established connection was lost since the transport started."""
    host_key_checked: bool = True
    """False only when the host's settings say `insecure_skip_host_key_check = true`: every view of the
    link then says the host key is NOT checked."""

    def describe(self) -> str:
        if self.state is ConnState.RETRYING:
            wait = f"retrying in {self.retry_in_s:.0f}s" if self.retry_in_s is not None else "retrying"
            return f"{wait}: {self.reason}" if self.reason else wait
        if self.state is ConnState.FAILED:
            return f"failed: {self.reason}" if self.reason else "failed"
        return self.state.value


class FollowState(StrEnum):
    STARTING = "starting"
    FOLLOWING = "following"
    WAITING = "waiting"
    """The link is down or journalctl ended; the follower resumes from its cursor when it can."""
    FAILED = "failed"
    STOPPED = "stopped"


class FollowerStatus(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True, extra="forbid")

    state: FollowState = FollowState.STARTING
    cursor: str | None = None
    """The cursor of the last journal entry read: where the follower resumes after a drop."""
    entries: int = 0
    """Journal entries read since the follower started (each exactly once)."""
    restarts: int = 0
    """How many times journalctl was started again from the cursor."""
    skipped: int = 0
    """Output lines that were not journal JSON (counted, never fatal)."""
    detail: str | None = None


class HealthState(StrEnum):
    UNKNOWN = "unknown"
    OK = "ok"
    STARTING = "starting"
    """The server answers 503 (loading or shutting down)."""
    DOWN = "down"
    """Nothing answers at the server URL."""
    ERROR = "error"


class ServerSample(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True, extra="forbid")

    health: HealthState = HealthState.UNKNOWN
    status_code: int | None = None
    latency_s: float | None = None
    detail: str | None = None
    metrics: SglangMetrics | None = None
    scrape: MetricsText | None = Field(default=None, exclude=True, repr=False)
    """The `/metrics` text this sample's `metrics` were read from (the session's window keeps it; left
    out of dumps)."""
    ts: float | None = None
    version: str | None = None
    """SGLang's version from `/server_info` (read once each time the server becomes healthy)."""
    model: str | None = None
    """`served_model_name` from `/server_info`."""


class HostSnapshot(BaseModel, defer_build=True):
    """One host at one moment; never mutated, so a screen may hold it while the session moves on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str
    seq: int = 0
    """Increases by one with every snapshot of this host."""
    ts: float = 0.0
    connection: ConnectionStatus | None = None
    follower: FollowerStatus = Field(default_factory=FollowerStatus)
    state: HostState = Field(default_factory=HostState)
    gpus: HostGpuSample | None = None
    server: ServerSample | None = None
    recent: tuple[Event, ...] = ()
    """The newest events of every kind, oldest first, bounded by the session (the log pane)."""
    events_total: int = 0
    """Events the parser has produced since the session started."""
    serving: ServingFigures | None = None
    """The serving figures of the session's window of `/metrics` scrapes (computed once per scrape);
    None before the first server reading."""
    serving_trend: tuple[TrendPoint, ...] = ()
    """One point per scrape interval of the window, oldest first (the panel's sparklines)."""


def same_server_reading(before: ServerSample | None, after: ServerSample) -> bool:
    """`after` reads as `before` did, its time and latency aside: the same verdict and the same scrape
    (`PrometheusReader` gives an unchanged text's reading back as the same object)."""
    return (
        before is not None
        and before.health is after.health
        and before.status_code == after.status_code
        and before.detail == after.detail
        and before.version == after.version
        and before.model == after.model
        and (before.scrape is after.scrape if after.scrape is not None else before.metrics == after.metrics)
    )
