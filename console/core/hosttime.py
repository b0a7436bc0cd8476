"""Dates and numbers read from the host's state files (the lock, presence, the pending-rollback record, the
audit trail), checked where they are read: a value no console or host clock wrote is refused by the model,
so it never reaches the arithmetic and the words made of it (`astimezone`, `now - taken_at`, `round`).

A lock whose `taken_at` was `0001-01-01T00:00:00+14:00` validated as a datetime, then made `astimezone()`
raise OverflowError (its UTC is in year 0) in the sentence that names the holder: a traceback in `restart`,
a crash of the console. A naive date (no offset) validated too, then raised TypeError when subtracted from
the host's aware clock. Refused here, such a file reads as no console's lock (an action that needs the lock
says so in one sentence), an unreadable heartbeat, an unreadable record, or an unreadable audit line
(skipped and counted).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator, AwareDatetime, Field

__all__ = [
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

HOST_TIME_MIN = datetime(1970, 1, 1, tzinfo=UTC)
"""The Unix epoch: a host whose clock was reset reads 1970, never earlier."""
HOST_TIME_MAX = datetime(2200, 1, 1, tzinfo=UTC)
"""Far past any clock's error, and far enough from year 9999 that adding a deadline or an offset to a
date in range can never leave what `datetime` holds."""


def _in_range(value: datetime) -> datetime:
    if not HOST_TIME_MIN <= value < HOST_TIME_MAX:
        raise ValueError("is not a date a host's clock writes (1970 to 2199)")
    return value


HostTime = Annotated[AwareDatetime, AfterValidator(_in_range)]
"""A date with its UTC offset, from 1970 up to 2200: what a console or the host's `date` writes."""

MAX_SECONDS = 30 * 86_400.0
"""The longest span a state file holds (a phase's duration, a heartbeat interval, a confirm deadline):
30 days is far past any restart, and every figure under it, and a sum of a few, prints and rounds."""
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
"""A span in seconds: finite, not negative, at most `MAX_SECONDS` (`round(inf)` raised OverflowError)."""
Span = Annotated[float, Field(ge=-MAX_SECONDS, le=MAX_SECONDS, allow_inf_nan=False)]
"""A measured span (a phase's duration): as `Seconds`, but a clock that stepped back may make it negative,
which the words clamp to 0; refusing it would lose the audit line of a change that happened."""

MAX_PID = 2**31 - 1
MAX_TOKENS = 2**31 - 1
"""A token count (a pool, a target context): the planner's own bound."""
Count = Annotated[int, Field(ge=0, le=MAX_TOKENS)]
"""A count from the host: an integer of tens of thousands of digits validated, then could not be printed
(Python refuses to turn an int of more than 4,300 digits into text)."""
