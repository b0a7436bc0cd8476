"""A Textual timer that fell behind ticks on the next slot, not the one after (console/tui/timer_slots.py).

The scenario is a screen's repaint timer after a pause: paused after each tick, resumed in the middle of a
slot long after, it ticks at once (late); resumed again straight away, the next tick is due at the next slot.
Textual's own loop waits for the slot after that one, one more interval. Both loops run the same scenario
here, so the test shows the difference it exists for, and fails if ours loses it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from textual.app import App
from textual.timer import Timer

from console.tui.timer_slots import STOCK_RUN, _run_on_slots

INTERVAL = 0.2
"""Long next to the loop's jitter on a busy machine: the two loops' ticks come 0.5 and 1.5 intervals after the
late one, and the test tells them apart at 1 interval."""

RunLoop = Callable[[Timer], Coroutine[Any, Any, None]]


async def _after_a_late_tick(run: RunLoop) -> float:
    """Seconds from a late tick to the next one, resumed at once, with `run` as the timer's loop."""
    app: App[None] = App()
    async with app.run_test():
        ticks: list[float] = []
        resume_after: list[bool] = [False]

        def tick() -> None:
            ticks.append(time.monotonic())
            timer.pause()
            if resume_after[0]:
                resume_after[0] = False
                timer.resume()

        timer = Timer(app, INTERVAL, callback=tick, pause=True)
        loop = asyncio.create_task(run(timer))
        started = time.monotonic()
        timer.resume()
        async with asyncio.timeout(10):
            while len(ticks) < 1:
                await asyncio.sleep(0.01)
        # Paused since its first tick; resumed in the middle of slot 3, it is late and ticks at once.
        await asyncio.sleep(max(0.0, started + 3.5 * INTERVAL - time.monotonic()))
        resume_after[0] = True
        timer.resume()
        async with asyncio.timeout(10):
            while len(ticks) < 3:
                await asyncio.sleep(0.01)
        loop.cancel()
        return ticks[2] - ticks[1]


@pytest.mark.serial
async def test_a_timer_resumed_after_a_late_tick_ticks_on_the_next_slot() -> None:
    ours = await _after_a_late_tick(_run_on_slots)
    stock = await _after_a_late_tick(STOCK_RUN)
    # Ours: the next slot, half an interval on. Textual's: the slot after it, one and a half intervals on.
    assert ours < INTERVAL, (ours, stock)
    assert stock > INTERVAL, (ours, stock)


@pytest.mark.parametrize("repeat", [0, 3])
async def test_a_timer_that_keeps_up_ticks_as_textuals_does(repeat: int) -> None:
    # `repeat` counts as Textual counts it (0: one shot, as set_timer makes); each loop runs to its end.
    app: App[None] = App()
    async with app.run_test():
        counts: dict[str, list[float]] = {}
        for name, run in (("ours", _run_on_slots), ("stock", STOCK_RUN)):
            ticks = counts[name] = []
            timer = Timer(app, 0.02, callback=lambda t=ticks: t.append(time.monotonic()), repeat=repeat)
            await asyncio.wait_for(run(timer), 10)
        assert len(counts["ours"]) == len(counts["stock"]) == repeat + 1


def test_the_console_app_runs_its_timers_on_slots() -> None:
    from console.tui.app import ConsoleApp

    Timer._run = STOCK_RUN  # type: ignore[method-assign]
    ConsoleApp([], connect=False)
    assert Timer._run is _run_on_slots
