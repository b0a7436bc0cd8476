"""Pairing: who is on a host (presence), who may change it (the lock), and the words for them.
The audit trail (what was done) is `console.core.audit`.

Pure: the models, the staleness rule and the words. `console.sources.hoststate` keeps them in the host's
state directory over SSH.

Times are aware datetimes on the HOST's clock: consoles on different jump hosts judge each other's
heartbeats against one clock, so a jump host whose clock is off cannot make a live lock look stale.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from console.core.confirm import PendingRollback
from console.core.hosttime import MAX_PID, HostTime

__all__ = [
    "DEFAULT_HEARTBEAT_S",
    "DEFAULT_STALE_FACTOR",
    "BreakRefused",
    "Identity",
    "LockHeld",
    "LockInfo",
    "PairingView",
    "Presence",
    "fmt_span",
    "is_stale",
    "lock_sentence",
]

DEFAULT_HEARTBEAT_S = 2.0
DEFAULT_STALE_FACTOR = 3.0
"""A heartbeat older than factor × its interval is stale: two missed beats are a slow link, three a
console that is gone."""
MAX_HEARTBEAT_S = 600.0
"""The slowest heartbeat a presence file may claim: its console is judged gone 30 minutes after its last."""


class Identity(BaseModel, defer_build=True):
    """One console: who runs it, on which jump host, as which process, under which random id."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Bounded: read back from the host's files, they reach the bar, the notes and every refusal.
    user: str = Field(min_length=1, max_length=256)
    jump_host: str = Field(min_length=1, max_length=256)
    pid: int = Field(ge=0, le=MAX_PID)
    console_id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """A file name on the host (`presence/<console_id>.json`), so only safe characters."""

    @property
    def who(self) -> str:
        return f"{self.user}@{self.jump_host}"

    def same_console(self, other: Identity) -> bool:
        return self.console_id == other.console_id


class Presence(Identity):
    """The heartbeat file of one open console."""

    since: HostTime
    heartbeat: HostTime
    interval_s: float = Field(default=DEFAULT_HEARTBEAT_S, gt=0, le=MAX_HEARTBEAT_S, allow_inf_nan=False)
    """The holder's own heartbeat interval: readers judge staleness by the writer's pace, not theirs.
    Bounded: a heartbeat claiming `inf` (or a day) would never go stale, and its lock never be breakable."""
    looking_at: str = Field(default="", max_length=1024)
    """What the console shows now: "dashboard", "restart of ctx-200k", ..."""

    @property
    def identity(self) -> Identity:
        return Identity(user=self.user, jump_host=self.jump_host, pid=self.pid, console_id=self.console_id)

    def age_s(self, now: datetime) -> float:
        return (now - self.heartbeat).total_seconds()

    def stale(self, now: datetime, factor: float = DEFAULT_STALE_FACTOR) -> bool:
        return is_stale(self.heartbeat, self.interval_s, now, factor)


def is_stale(
    heartbeat: datetime, interval_s: float, now: datetime, factor: float = DEFAULT_STALE_FACTOR
) -> bool:
    """The staleness rule: a heartbeat older than `factor` × its interval."""
    return (now - heartbeat).total_seconds() > factor * interval_s


class LockInfo(BaseModel, defer_build=True):
    """The content of the host's `lock` file, written once when the lock is taken."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    holder: Identity
    intent: str = Field(min_length=1, max_length=1024)
    """What the holder is doing: "apply ctx-200k", "rollback", "restart"."""
    taken_at: HostTime
    lock_id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """Unique per acquisition: release and break remove only the lock they saw, never a newer one."""


def _clock(ts: datetime) -> str:
    return ts.astimezone().strftime("%H:%M:%S")


def fmt_span(seconds: float) -> str:
    """5m12s, 48s, 1h03m: how an operator says how long a restart took."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"
    if seconds < 3600:
        m, s = divmod(round(seconds), 60)
        return f"{m}m{s:02d}s"
    h, rest = divmod(round(seconds), 3600)
    return f"{h}h{rest // 60:02d}m"


def lock_sentence(
    info: LockInfo,
    host: str,
    *,
    stale: bool = False,
    holder: Presence | None = None,
    now: datetime | None = None,
) -> str:
    """'alice@jump1 holds the lock on gpu1: apply ctx-200k, since 12:01:33 (pid 4242)' and, when the
    holder has gone quiet, how long ago it was last heard from."""
    text = (
        f"{info.holder.who} holds the lock on {host}: {info.intent}, since {_clock(info.taken_at)} "
        f"(pid {info.holder.pid})"
    )
    if stale:
        if holder is not None and now is not None:
            text += f"; its console has not been heard from for {fmt_span(holder.age_s(now))}"
        else:
            text += "; its console has left"
    return text


class LockHeld(Exception):
    """Another console holds the lock; `str()` names the holder and its intent."""

    def __init__(
        self,
        info: LockInfo,
        stale: bool,
        *,
        host: str,
        holder: Presence | None = None,
        now: datetime | None = None,
    ) -> None:
        self.info = info
        self.stale = stale
        self.host = host
        self.holder = holder
        self.now = now
        sentence = lock_sentence(info, host, stale=stale, holder=holder, now=now)
        super().__init__(sentence + (", so the lock may be broken after confirming" if stale else ""))


class BreakRefused(Exception):
    """A lock break that may not happen (no confirmation, a live holder, no lock); `str()` says why."""


class PairingView(BaseModel, defer_build=True):
    """Who is on a host and who holds its lock, at one moment of the host's clock."""

    model_config = ConfigDict(frozen=True)

    host: str
    now: datetime
    presence: list[Presence] = Field(default_factory=list)
    """Live consoles only (stale heartbeats are left out)."""
    lock: LockInfo | None = None
    lock_stale: bool = False
    """The holder's heartbeat is stale or gone: the lock may be broken after confirming."""
    pending_rollback: PendingRollback | None = None
    """A commit-confirmed rollback armed on the host (its record; whether its timer waits is not read
    here, `active` stays True)."""

    def signature(self) -> tuple[object, ...]:
        """What a screen shows, without the heartbeat times that change every beat."""
        return (
            tuple(sorted((p.console_id, p.who, p.pid, p.looking_at) for p in self.presence)),
            self.lock.lock_id if self.lock else None,
            self.lock_stale,
            self.pending_rollback.deadline if self.pending_rollback else None,
        )

    def others(self, me: Identity) -> list[Presence]:
        return [p for p in self.presence if p.console_id != me.console_id]

    def lock_line(self) -> str:
        if self.lock is None:
            return f"{self.host} is not locked"
        holder = next((p for p in self.presence if p.console_id == self.lock.holder.console_id), None)
        return lock_sentence(self.lock, self.host, stale=self.lock_stale, holder=holder, now=self.now)
