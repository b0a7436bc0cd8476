"""The SSH link to a host during a change, as the change sees it: up, lost since when, back, given up on.

A partition mid-restart (the traffic black-holed, nothing closed) is not a boot that is stuck: the host
goes on booting by itself, and an armed host-side rollback goes on counting. So while the link is lost
the restart's phase deadlines are paused, the operator is told "link to HOST lost since HH:MM:SS UTC",
and the change waits for the link only as long as it still can do something with it:

- with a commit-confirmed rollback armed, until `CONFIRM_MARGIN_S` before its deadline: a link back by
  then still lets the console verify the boot and confirm it, instead of leaving a good boot to the
  timer; past that, the sentence says what the host will do (the rollback fires at T unless
  `k26-console confirm HOST` reaches it first);
- without one, `LINK_WAIT_S` after the loss.

Pure: the controller (console.sources.restart_follow) reads the transport's state and the clocks and
hands them in; every time is the caller's monotonic clock, and the wall clock only names the moments.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

__all__ = ["CONFIRM_MARGIN_S", "LINK_WAIT_S", "LinkWatch", "utc_clock"]

LINK_WAIT_S = 120.0
"""How long a change with no host-side rollback armed waits for a lost link before it gives up on it."""
CONFIRM_MARGIN_S = 5.0
"""A change with a rollback armed gives up on the link this long before the rollback's deadline: the
time a link back at the last moment needs to catch up with the journal, verify and disarm."""


def utc_clock(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%H:%M:%S UTC")


@dataclass
class LinkWatch:
    """The link as one change saw it. `update` each time the transport's state is read."""

    host: str
    wait_s: float = LINK_WAIT_S
    give_up_at: float | None = None
    """A fixed time (the caller's monotonic clock) to give up by when the link is lost: an armed
    rollback's deadline less `CONFIRM_MARGIN_S`. None: `wait_s` after each loss."""
    lost_at: float | None = None
    lost_wall: datetime | None = None
    offline_s: float = 0.0
    """Seconds the link was lost, over the losses that ended."""
    losses: int = 0
    last_loss_s: float = 0.0
    """How long the last loss that ended lasted."""
    reason: str | None = None
    """Why the change gave up on the link, once it has."""

    @property
    def lost(self) -> bool:
        return self.lost_at is not None

    @property
    def gave_up(self) -> bool:
        return self.reason is not None

    @property
    def ever_lost(self) -> bool:
        return self.losses > 0

    def update(self, up: bool, now: float, wall: datetime) -> Literal["lost", "back"] | None:
        """The link's state now; "lost" or "back" when that changed since the last update."""
        if not up and self.lost_at is None:
            self.lost_at, self.lost_wall = now, wall
            self.losses += 1
            return "lost"
        if up and self.lost_at is not None:
            self.last_loss_s = max(0.0, now - self.lost_at)
            self.offline_s += self.last_loss_s
            self.lost_at = None
            return "back"
        return None

    def deadline(self) -> float | None:
        """When the change gives up on the lost link (None while it is up)."""
        if self.lost_at is None:
            return None
        if self.give_up_at is not None:
            return self.give_up_at
        return self.lost_at + self.wait_s

    def expired(self, now: float) -> bool:
        deadline = self.deadline()
        return deadline is not None and now >= deadline

    def _wall(self, at: float) -> datetime:
        assert self.lost_at is not None and self.lost_wall is not None
        return self.lost_wall + timedelta(seconds=at - self.lost_at)

    def since(self) -> str:
        """`link to HOST lost since HH:MM:SS UTC`."""
        assert self.lost_wall is not None
        return f"link to {self.host} lost since {utc_clock(self.lost_wall)}"

    def lost_sentence(self, now: float) -> str:
        """What the operator is told when the link goes: the host goes on, and how long the change waits."""
        deadline = self.deadline()
        assert deadline is not None
        left = deadline - now
        if left < 1.0:
            return f"{self.since()}: the host goes on by itself"
        return (
            f"{self.since()}: the host goes on by itself; waiting for the link until "
            f"{utc_clock(self._wall(deadline))} ({left:.0f} s)"
        )

    def back_sentence(self, now: float, wall: datetime) -> str:
        return (
            f"link to {self.host} back at {utc_clock(wall)} after {self.last_loss_s:.1f} s; the change goes on "
            "from where the host is"
        )

    def give_up(self, now: float) -> str:
        """Give up on the lost link (once; later calls give the same words): why the change ends, without
        what the host will do (the caller knows whether a rollback is armed)."""
        if self.reason is None:
            if self.lost_at is None or self.lost_wall is None:
                self.reason = f"the link to {self.host} was lost"
            else:
                self.reason = f"{self.since()}, and it did not come back by {utc_clock(self._wall(now))}"
        return self.reason
