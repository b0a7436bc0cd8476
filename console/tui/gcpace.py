"""Garbage-collector pacing for a long-running console.

A busy host feeds thousands of events a second through bounded buffers: each event outlives the young
generations (it sits in a deque), is promoted to the oldest one, and is freed by reference counting when
it falls off. Every promotion counts towards CPython's "full collection" trigger, so under load a full
collection — a scan of every tracked object, 40-80 ms measured here — ran every few seconds, and each one
was a key press answered late.

`GcPacer` freezes what exists every few seconds (`gc.freeze()`: frozen objects are never scanned, but are
still freed by reference counting the moment nothing refers to them), so a full collection scans only what
arrived since. Garbage with reference cycles that got frozen is reclaimed by an unfreeze and one full
collection every few minutes: one pause there instead of several a minute.
"""

from __future__ import annotations

import gc
from collections.abc import Callable


class GcPacer:
    def __init__(self, *, freeze_every_s: float = 5.0, collect_every_s: float = 300.0) -> None:
        self.freeze_every_s = freeze_every_s
        self.collect_every_s = collect_every_s
        self.collections = 0

    def freeze(self) -> None:
        gc.freeze()

    def collect(self) -> None:
        """Reclaim frozen cycles: thaw, one full collection, freeze what survived."""
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.collections += 1

    def release(self) -> None:
        """Thaw everything (the app is leaving; whatever runs next collects as usual)."""
        gc.unfreeze()

    def install(self, set_interval: Callable[[float, Callable[[], None]], object]) -> None:
        """Start pacing on a scheduler such as Textual's `set_interval`; freezes what exists now."""
        gc.freeze()
        set_interval(self.freeze_every_s, self.freeze)
        set_interval(self.collect_every_s, self.collect)
