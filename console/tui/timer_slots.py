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

The loop also draws a key's answer at once. Frames are capped at 60 a second: a repaint asked within a
frame of the last one waits for the next slot. An idle app never meets the cap, since its last frame is long
gone when a key comes. A console repainting ~5 times a second for the data it shows meets it with about one
key in ten, which then waits up to 16.7 ms more. After the app has handled a key
(`draw_the_next_frame_at_once`), a screen's timer that sleeps towards its slot wakes. It draws as soon as
the screen asks for a repaint, and goes back to its slots after that one frame. The data's frames keep the
cap: raising it for everything (`TEXTUAL_FPS=120`) tripled the time of a key with the feed unfiltered
(docs/performance.md).

Apart from these two changes, the loop is Textual's. The private parts it reads are listed in that test.
"""

from __future__ import annotations

import asyncio
import time
import weakref

from textual.timer import EventTargetGone, Timer

STOCK_RUN = Timer._run
"""Textual's own loop, kept for the test that shows what it does."""

SCREEN_TIMER = "screen_update"
"""The name Textual gives every screen's repaint timer (`Screen._update_timer`)."""


class _KeyFrame:
    """A loop's state of the frame a key asked for: whether one is owed, and what wakes the screens'
    timers sleeping towards their slot. One per event loop, so an app's key never reaches another app's
    loop (each test runs its own)."""

    __slots__ = ("owed", "wake")

    def __init__(self) -> None:
        self.owed = False
        self.wake: asyncio.Event | None = None


_KEY_FRAMES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _KeyFrame] = weakref.WeakKeyDictionary()


def _key_frame() -> _KeyFrame:
    loop = asyncio.get_running_loop()
    state = _KEY_FRAMES.get(loop)
    if state is None:
        state = _KEY_FRAMES[loop] = _KeyFrame()
    return state


def draw_the_next_frame_at_once() -> None:
    """The app has handled a key: the next repaint a screen asks for is drawn at once, not at the frame
    cap's next slot. One frame: the repaints after it keep the cap."""
    state = _key_frame()
    state.owed = True
    wake, state.wake = state.wake, None
    if wake is not None:
        wake.set()


async def _sleep_until(timer: Timer, next_tick: float, now: float) -> bool:
    """Sleep until `next_tick`; a screen's timer wakes early, returning True, when a key's frame is owed."""
    delay = next_tick - now
    if timer.name != SCREEN_TIMER:
        await asyncio.sleep(max(0.0, delay))
        return False
    state = _key_frame()
    if state.owed:
        return True
    if delay <= 0:
        return False
    wake = state.wake
    if wake is None:
        wake = state.wake = asyncio.Event()
    try:
        async with asyncio.timeout(delay):
            await wake.wait()
    except TimeoutError:
        return False
    return True


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
        if not await _sleep_until(self, next_tick, now):
            count += 1
        # else: woken early for a key's frame, drawn now; the slot it was waiting for stays the next one
        await self._active.wait()
        if self._reset:
            start = time.monotonic()
            count = 0
            self._reset = False
            continue
        if self.name == SCREEN_TIMER:
            _key_frame().owed = False
        try:
            await self._tick(next_timer=next_tick, count=count)
        except EventTargetGone:
            break


def land_late_ticks_on_the_next_slot() -> None:
    """Every Textual timer started from here on ticks on the next slot after falling behind (a timer already
    running keeps Textual's loop). Called before the app makes its screens; calling it again changes
    nothing."""
    Timer._run = _run_on_slots  # type: ignore[method-assign]
