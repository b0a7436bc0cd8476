"""The console's GC pacing: frozen objects are out of the collector's sight, yet nothing leaks for long.

Each test asserts what the pacer does to the collector itself (the permanent generation that
`gc.freeze()` fills, `gc.get_freeze_count()`), so a pacer whose `freeze`, `collect`, `install` or
`release` did nothing fails here (checked by making each a no-op in turn, issue 19)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator

import pytest

from console.tui.gcpace import GcPacer


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    """Nothing frozen before the test (another test's app may have left a freeze) nor after it."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def _cycle() -> tuple[weakref.ref[Node], Callable[[], None]]:
    """A reference cycle only the collector can free: a weak reference to it, and how to drop it."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    held = [a, b]
    return weakref.ref(a), held.clear


def _seen_by_collector(obj: object) -> bool:
    """Whether `obj` is in one of the generations a collection scans (frozen objects are in none)."""
    return any(o is obj for o in gc.get_objects())


def test_freeze_takes_what_exists_out_of_the_collectors_sight() -> None:
    pacer = GcPacer()
    ref, drop = _cycle()
    assert gc.get_freeze_count() == 0 and _seen_by_collector(ref())
    pacer.freeze()
    assert gc.get_freeze_count() > 1000  # the whole heap of a running interpreter
    assert not _seen_by_collector(ref())
    drop()
    gc.collect()
    assert ref() is not None  # frozen: a full collection does not even look at it


def test_frozen_cycles_are_reclaimed_by_the_periodic_collection() -> None:
    pacer = GcPacer()
    ref, drop = _cycle()
    pacer.freeze()
    drop()
    gc.collect()
    assert ref() is not None
    pacer.collect()
    assert ref() is None and pacer.collections == 1
    # What survived the collection is frozen again: the next full collections stay short.
    assert gc.get_freeze_count() > 1000
    survivor, _ = _cycle()
    assert _seen_by_collector(survivor())  # made after the collection: in sight until the next freeze


def test_frozen_objects_are_still_freed_by_reference_counting() -> None:
    pacer = GcPacer()
    plain = Node()
    ref = weakref.ref(plain)
    pacer.freeze()
    assert not _seen_by_collector(plain)  # it is frozen ...
    del plain
    assert ref() is None  # ... and, with no cycle, gone the moment nothing refers to it


def test_install_freezes_now_and_schedules_both_paces() -> None:
    pacer = GcPacer(freeze_every_s=5.0, collect_every_s=300.0)
    scheduled: dict[float, Callable[[], None]] = {}
    early, drop_early = _cycle()

    def set_interval(interval: float, callback: Callable[[], None]) -> object:
        scheduled[interval] = callback
        return None

    pacer.install(set_interval)
    assert not _seen_by_collector(early()) and gc.get_freeze_count() > 1000  # frozen at install
    assert sorted(scheduled) == [5.0, 300.0]

    late, drop_late = _cycle()  # arrives after install: in sight until the next periodic freeze
    assert _seen_by_collector(late())
    scheduled[5.0]()
    assert not _seen_by_collector(late())

    drop_early()
    drop_late()
    gc.collect()
    assert early() is not None and late() is not None
    scheduled[300.0]()
    assert early() is None and late() is None and pacer.collections == 1


def test_release_thaws_everything() -> None:
    pacer = GcPacer()
    ref, drop = _cycle()
    pacer.freeze()
    assert gc.get_freeze_count() > 0
    pacer.release()
    assert gc.get_freeze_count() == 0 and _seen_by_collector(ref())
    drop()
    gc.collect()
    assert ref() is None  # an app that left collects as usual
