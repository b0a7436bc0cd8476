"""Waiting in tests: on a condition, with a deadline, never a bare sleep.

`eventually(predicate, what)` returns as soon as the predicate holds and fails, naming `what`, once the
deadline passes; `stays(predicate, what, for_s=...)` fails as soon as the predicate stops holding within
the window. A `stays` shows that something did NOT happen only if the same window is long enough for it to
happen: pair it with a positive control (the thing happening, under the same wait, where it should).
In a Textual pilot's test pass `pilot=`: the app's messages are processed between polls."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

DEFAULT_TIMEOUT_S = 30.0
POLL_S = 0.05


async def _pause(pilot: Any, seconds: float) -> None:
    if pilot is not None:
        await pilot.pause(seconds)
    else:
        await asyncio.sleep(seconds)


async def eventually(
    predicate: Callable[[], object],
    what: str = "the condition",
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    pilot: Any = None,
    every: float = POLL_S,
    detail: Callable[[], object] | None = None,
) -> None:
    """Wait until `predicate()` is true; an AssertionError naming `what` (and `detail()`, what the test
    saw last) when `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            seen = f"; {detail()}" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{seen}")
        await _pause(pilot, every)


async def stays(
    predicate: Callable[[], object],
    what: str,
    *,
    for_s: float,
    pilot: Any = None,
    every: float = POLL_S,
) -> None:
    """Hold that `predicate()` stays true for `for_s` seconds; an AssertionError naming `what` the moment
    it does not."""
    deadline = time.monotonic() + for_s
    while True:
        if not predicate():
            raise AssertionError(f"{what} stopped holding")
        if time.monotonic() >= deadline:
            return
        await _pause(pilot, min(every, max(0.0, deadline - time.monotonic())))
