"""What a host's sources say of themselves: the SSH link's state and the journal follower's.

Apart from the snapshot that carries them (console.core.snapshot) so that the sources and the commands
reaching a host import these alone: the snapshot brings the serving figures and the metric table built at
import (~10 ms of every `verify HOST`).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

__all__ = ["ConnState", "ConnectionStatus", "FollowState", "FollowerStatus"]


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
