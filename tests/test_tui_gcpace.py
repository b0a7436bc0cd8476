"""The console's GC pacing: frozen objects are out of the collector's sight, yet nothing leaks for long."""

from __future__ import annotations

import gc
import weakref

from console.tui.gcpace import GcPacer


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_frozen_cycles_are_reclaimed_by_the_periodic_collection() -> None:
    pacer = GcPacer()
    a, b = Node(), Node()
    a.other, b.other = b, a  # a reference cycle: only the collector frees it
    ref = weakref.ref(a)
    try:
        pacer.freeze()
        del a, b
        gc.collect()
        assert ref() is not None  # frozen: a full collection does not even look at it
        pacer.collect()
        assert ref() is None and pacer.collections == 1
    finally:
        gc.unfreeze()


def test_frozen_objects_are_still_freed_by_reference_counting() -> None:
    pacer = GcPacer()
    plain = Node()
    ref = weakref.ref(plain)
    try:
        pacer.freeze()
        del plain
        assert ref() is None  # no cycle: gone the moment nothing refers to it, frozen or not
    finally:
        gc.unfreeze()
