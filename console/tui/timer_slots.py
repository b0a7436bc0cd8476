"""Textual's interval timers, made to tick on the first slot still ahead when they have fallen behind.

Textual 8.2.8's `Timer._run` handles a timer that fell behind (`skip=True`, the default) by recomputing its
tick count as `int((now - start) / interval + 1)` and then waiting for slot `count + 1`: the slot after
the next one. Every screen's repaints go through such a timer (`screen_update`, 60 a second), paused while
nothing is dirty. A repaint that starts after a pause is late by definition, so the next repaint cannot come
sooner than one to two frames later (16.7-33 ms), however soon a key asks for it.

Under the bench's 2,000 journal lines a second the console repaints ~10 times a second, each after a
pause, so a quarter of the time a key's answer waited in that gap. The key-to-screen time of `m` had
p95 20-37 ms with the stock timer, 15-16 ms with this one (docs/performance.md, "Frames after a pause"). The
report for upstream is in docs/textual-upstream.md (bug 4); `tests/test_textual_private_api.py` fails
once Textual's own `_run` changes, so this goes when upstream fixes it.

Only the skip's arithmetic differs from Textual's loop. The private parts it reads are listed in that test.
"""

from __future__ import annotations

import asyncio
import time

from textual.timer import EventTargetGone, Timer

STOCK_RUN = Timer._run
"""Textual's own loop, kept for the test that shows what it does."""


async def _run_on_slots(self: Timer) -> None:
    count = 0
    repeat = self._repeat
    interval = self._interval
    await self._active.wait()
    start = time.monotonic()  # Textual's clock on Linux (textual._time.get_time)
    while repeat is None or count <= repeat:
        next_tick = start + (count + 1) * interval
        now = time.monotonic()
        if self._skip and next_tick < now and interval > 0:
            # The slots already gone are skipped; the tick is the first slot still ahead. (No `continue` to
            # the check above, as Textual has: a rounding that lands on a slot gone must not loop.)
            count = int((now - start) / interval)
            if repeat is not None and count > repeat:
                break
            next_tick = start + (count + 1) * interval
        await asyncio.sleep(max(0.0, next_tick - now))
        count += 1
        await self._active.wait()
        if self._reset:
            start = time.monotonic()
            count = 0
            self._reset = False
            continue
        try:
            await self._tick(next_timer=next_tick, count=count)
        except EventTargetGone:
            break


def land_late_ticks_on_the_next_slot() -> None:
    """Every Textual timer started from here on ticks on the next slot after falling behind (a timer already
    running keeps Textual's loop). Called before the app makes its screens; calling it again changes
    nothing."""
    Timer._run = _run_on_slots  # type: ignore[method-assign]
