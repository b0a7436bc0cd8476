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

from console.tui.timer_slots import (
    SCREEN_TIMER,
    STOCK_RUN,
    _run_on_slots,
    draw_the_next_frame_at_once,
)

INTERVAL = 0.2
"""Long next to the loop's jitter on a busy machine: the two loops' ticks come 0.5 and 1.5 intervals after the
late one, and the test tells them apart at 1 interval."""

RunLoop = Callable[[Timer], Coroutine[Any, Any, None]]


class _Ticks:
    """When each tick came, and a wait for the n-th (with a deadline) woken by the tick itself."""

    def __init__(self) -> None:
        self.at: list[float] = []
        self._came = asyncio.Event()

    def add(self) -> None:
        self.at.append(time.monotonic())
        self._came.set()

    async def reach(self, n: int, deadline_s: float = 10.0) -> None:
        async with asyncio.timeout(deadline_s):
            while len(self.at) < n:
                self._came.clear()
                await self._came.wait()


async def _after_a_late_tick(run: RunLoop) -> float:
    """Seconds from a late tick to the next one, resumed at once, with `run` as the timer's loop."""
    app: App[None] = App()
    async with app.run_test():
        ticks = _Ticks()
        resume_after: list[bool] = [False]

        def tick() -> None:
            ticks.add()
            timer.pause()
            if resume_after[0]:
                resume_after[0] = False
                timer.resume()

        def resume_late() -> None:
            # Paused since its first tick; resumed in the middle of slot 3, it is late and ticks at once.
            resume_after[0] = True
            timer.resume()

        timer = Timer(app, INTERVAL, callback=tick, pause=True)
        loop = asyncio.create_task(run(timer))
        # asyncio's clock is time.monotonic, the timer's own
        asyncio.get_running_loop().call_at(time.monotonic() + 3.5 * INTERVAL, resume_late)
        timer.resume()
        await ticks.reach(3)
        loop.cancel()
        return ticks.at[2] - ticks.at[1]


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


async def _ticks_after_a_key(name: str, key: bool) -> tuple[float, float]:
    """(second tick - first, third - first) of a timer named `name` run by our loop: paused by each tick,
    resumed at once after the first two, with `draw_the_next_frame_at_once` after the first when `key`."""
    app: App[None] = App()
    async with app.run_test():
        ticks = _Ticks()

        def tick() -> None:
            ticks.add()
            timer.pause()
            if len(ticks.at) < 3:
                timer.resume()
                if key and len(ticks.at) == 1:
                    draw_the_next_frame_at_once()

        timer = Timer(app, INTERVAL, name=name, callback=tick, pause=True)
        loop = asyncio.create_task(_run_on_slots(timer))
        timer.resume()
        await ticks.reach(3)
        loop.cancel()
        at = ticks.at
        return at[1] - at[0], at[2] - at[0]


@pytest.mark.serial
async def test_a_keys_frame_is_drawn_at_once_and_the_next_keeps_its_slot() -> None:
    # A screen's repaint timer that has just ticked is resumed at once: it waits for its next slot, one
    # interval on, unless the app has handled a key, when it ticks at once. The tick after the key's frame
    # is on the slot the timer was waiting for, as if the key's frame had not been.
    keyed_second, keyed_third = await _ticks_after_a_key(SCREEN_TIMER, key=True)
    plain_second, _ = await _ticks_after_a_key(SCREEN_TIMER, key=False)
    other_second, _ = await _ticks_after_a_key("Timer#other", key=True)
    assert keyed_second < INTERVAL / 2 < plain_second, (keyed_second, plain_second)
    assert INTERVAL / 2 < keyed_third < 1.5 * INTERVAL, keyed_third
    # Only a screen's repaints are hurried; the app's other timers keep their slots.
    assert other_second > INTERVAL / 2, other_second


async def test_the_console_app_asks_for_a_keys_frame_after_handling_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import console.tui.app as app_module
    from tests.tui_support import make_app

    asked: list[bool] = []
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        dash = app.dashboards["gpu1"]
        dash.feed.log_widget.focus()
        await pilot.pause()
        polls = dash.feed.show_polls
        monkeypatch.setattr(
            app_module, "draw_the_next_frame_at_once", lambda: asked.append(dash.feed.show_polls != polls)
        )
        await pilot.press("m")
        await pilot.pause()
    # Asked once, after the key's binding (m) had run.
    assert asked == [True]
