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
from console.core.source_status import ConnectionStatus, ConnState, FollowerStatus, FollowState
from console.core.state import HostState

__all__ = [
    "ConnState",
    "ConnectionStatus",
    "FollowState",
    "FollowerStatus",
    "HealthState",
    "HostSnapshot",
    "ServerSample",
    "same_server_reading",
]


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
