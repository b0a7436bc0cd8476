"""Dates and numbers read from the host's state files (the lock, presence, the pending-rollback record, the
audit trail), checked where they are read: a value no console or host clock wrote is refused by the model,
so it never reaches the arithmetic and the words made of it (`astimezone`, `now - taken_at`, `round`).

A lock whose `taken_at` was `0001-01-01T00:00:00+14:00` validated as a datetime, then made `astimezone()`
raise OverflowError (its UTC is in year 0) in the sentence that names the holder: a traceback in `restart`,
a crash of the console. A naive date (no offset) validated too, then raised TypeError when subtracted from
the host's aware clock. Refused here, such a file reads as no console's lock (an action that needs the lock
says so in one sentence), an unreadable heartbeat, an unreadable record, or an unreadable audit line
(skipped and counted).

Two strictnesses. What is read from the host (JSON, `model_validate_json`, or Python values with the
`FROM_HOST` context) must be what a console or a host's `date` writes: dates from 1970 up to 2200, spans
of at most 30 days, counts that fit 31 bits. What a console builds itself (from the host's clock, the
journal's timings) only has to be safe to compute with: a host whose clock reads 2300, or a journal whose
timings make a restart take a year, must not turn the console's own lock, heartbeat or audit entry into a
ValidationError in the middle of a change. Other consoles reading such a file refuse it.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, ValidationInfo

__all__ = [
    "FROM_HOST",
    "HOST_TIME_MAX",
    "HOST_TIME_MIN",
    "MAX_PID",
    "MAX_SECONDS",
    "MAX_TOKENS",
    "Count",
    "HostTime",
    "Seconds",
    "Span",
]

FROM_HOST: dict[str, Any] = {"from_host": True}
"""The validation context for values read from the host and decoded first (`json.loads`): checked as
strictly as JSON validated by the model itself."""

HOST_TIME_MIN = datetime(1970, 1, 1, tzinfo=UTC)
"""The Unix epoch: a host whose clock was reset reads 1970, never earlier."""
HOST_TIME_MAX = datetime(2200, 1, 1, tzinfo=UTC)
"""Far past any clock's error, and far from year 9999: adding a deadline or an offset to a date in range
never leaves what `datetime` holds."""
_ANY_TIME_MIN = datetime(1000, 1, 1, tzinfo=UTC)
_ANY_TIME_MAX = datetime(9000, 1, 1, tzinfo=UTC)
"""What a console may build: far enough from datetime's ends that its arithmetic cannot overflow."""

MAX_SECONDS = 30 * 86_400.0
"""The longest span a state file holds (a phase's duration, a confirm deadline): 30 days is far past any
restart, and every figure under it, and a sum of a few, prints and rounds."""
_ANY_SECONDS = 1e12
MAX_PID = 2**31 - 1
MAX_TOKENS = 2**31 - 1
"""A token count (a pool, a target context): the planner's own bound."""
_ANY_COUNT = 10**18


def _from_host(info: ValidationInfo) -> bool:
    return info.mode == "json" or bool(info.context and info.context.get("from_host"))


def _date(value: datetime, info: ValidationInfo) -> datetime:
    lo, hi = (HOST_TIME_MIN, HOST_TIME_MAX) if _from_host(info) else (_ANY_TIME_MIN, _ANY_TIME_MAX)
    if not lo <= value < hi:
        raise ValueError(f"is not a date a host's clock writes ({lo.year} to {hi.year - 1})")
    return value


def _seconds(low: float) -> Any:
    def check(value: float, info: ValidationInfo) -> float:
        bound = MAX_SECONDS if _from_host(info) else _ANY_SECONDS
        # math.isfinite first: NaN compares False with everything, and would pass a range test.
        if not (math.isfinite(value) and low * bound <= value <= bound):
            raise ValueError(f"must be a finite number of seconds from {low * bound:g} to {bound:g}")
        return value

    return AfterValidator(check)


def _count(value: int, info: ValidationInfo) -> int:
    bound = MAX_TOKENS if _from_host(info) else _ANY_COUNT
    if not 0 <= value <= bound:
        raise ValueError(f"must be a count from 0 to {bound:,}")
    return value


HostTime = Annotated[AwareDatetime, AfterValidator(_date)]
"""A date with its UTC offset, from 1970 up to 2200 as read from the host: what a console or the host's
`date` writes."""
Seconds = Annotated[float, _seconds(0.0)]
"""A span in seconds: finite, not negative, at most `MAX_SECONDS` as read (`round(inf)` raised
OverflowError)."""
Span = Annotated[float, _seconds(-1.0)]
"""A measured span (a phase's duration): as `Seconds`, but a clock that stepped back may make it negative,
which the words clamp to 0; refusing it would lose the audit line of a change that happened."""
Count = Annotated[int, AfterValidator(_count)]
"""A count from the host: an integer of tens of thousands of digits validated, then could not be printed
(Python refuses to turn an int of more than 4,300 digits into text)."""
