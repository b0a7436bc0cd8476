"""The reconnect schedule of a transport: exponential backoff with jitter."""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Backoff"]


class Backoff(BaseModel, defer_build=True):
    """Exponential backoff with jitter; `max_attempts=None` retries for as long as the console runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    initial_s: float = Field(default=0.5, gt=0)
    factor: float = Field(default=2.0, ge=1)
    max_s: float = Field(default=30.0, gt=0)
    jitter: float = Field(default=0.3, ge=0, le=1)
    """Each delay is drawn from [d·(1-jitter), d]: consoles that lost a host together do not return in step."""
    max_attempts: int | None = Field(default=None, ge=1)
    stable_s: float = Field(default=5.0, ge=0)
    """A connection that lived shorter than this counts as a failed attempt when it drops, so a host
    that accepts and then closes at once is not hammered."""

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """The wait before the next attempt after `failures` consecutive failures; after a drop of a
        healthy connection (`failures == 0`) only a short jittered pause."""
        draw = (rng or random).random()
        if failures <= 0:
            return self.initial_s * self.jitter * draw
        base = min(self.max_s, self.initial_s * self.factor ** (failures - 1))
        return base * (1 - self.jitter * draw)
