"""The sum of a sliding window (oldest out first) at one or two additions per step: the queue of two
stacks. `ServingHistory` keeps one per latency histogram, so that the window's figures cost a merge
or two per scrape instead of one per pair of scrapes in the window."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class WindowSum(Generic[T]):
    """New values go on the back stack with its running sum; when the oldest must leave and the front
    stack is empty, the back stack is turned over into the front one, each entry holding the sum of
    itself and every newer one in the front, so the front's top is the sum of the whole front. `add`
    must be associative (its order of operands is kept: older first); `None` values count as nothing.
    Exact wherever `add` is (whole-number counts)."""

    def __init__(self, add: Callable[[T, T], T]) -> None:
        self._add_values = add
        self._front: list[T | None] = []
        self._back: list[T | None] = []
        self._back_sum: T | None = None

    def _add(self, a: T | None, b: T | None) -> T | None:
        if a is None or b is None:
            return a if b is None else b
        return self._add_values(a, b)

    def push(self, value: T | None) -> None:
        self._back.append(value)
        self._back_sum = self._add(self._back_sum, value)

    def pop(self) -> None:
        """The oldest value leaves (nothing happens to an empty window)."""
        if not self._front:
            acc: T | None = None
            for value in reversed(self._back):
                acc = self._add(value, acc)
                self._front.append(acc)
            self._back.clear()
            self._back_sum = None
        if self._front:
            self._front.pop()

    def total(self) -> T | None:
        """The sum of the window; None when it holds no value."""
        return self._add(self._front[-1] if self._front else None, self._back_sum)
