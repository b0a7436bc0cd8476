"""What one host's controller publishes for the screen: `HostUi`, immutable, replaced on every change.

The controller (console/tui/host_controller.py) owns the host's link, lock, trail and alerts; it hands
each new `HostUi` to the app, which gives it to the host's dashboard (when one is composed) and to the
fleet overview's rows. The widgets draw what it says and never reach back into the controller, the app or
one another: the header's note, the pairing bar, the note under the restart timeline, the gauge's
target from the trail, the alert badge and the lines the feed gets from outside the journal all come
from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from console.core.alerts import Alert, worst
from console.core.audit import AuditEntry
from console.core.events import Event
from console.core.hostfacts import HostFacts
from console.core.pairing import PairingView

OUTSIDE_KEPT = 64
"""Batches of outside lines a state keeps: a dashboard composed late (the overview's hosts are composed
when first shown) places them among the events its snapshot still holds."""


@dataclass(frozen=True)
class OutsideLines:
    """Lines for the feed that do not come from the journal (audit entries, alerts firing and clearing,
    a hook's failure), in the order they arrived."""

    serial: int
    """Counts up per host: a dashboard takes each batch once."""
    after: int
    """Journal events the host's fold had made when they arrived: they go after those."""
    events: tuple[Event, ...]
    entries: tuple[AuditEntry, ...] = ()
    """The audit entries among them: a change made elsewhere replaces this console's verdict."""


@dataclass(frozen=True)
class HostUi:
    """One host as its widgets show what is not in its snapshots."""

    note: str | None = None
    """What the header's link place says before a session exists ("preparing…", "could not start: …")."""
    facts: HostFacts | None = None
    """What the console learned of the host (`k26-console host`), once it has."""
    view: PairingView | None = None
    """The host's consoles and lock, as last read."""
    view_at: datetime | None = None
    """The host's clock for the view (the lock's age counts up with it); None: the view's own time."""
    link_error: str | None = None
    """Why the host's state directory cannot be read now (shown until the next view)."""
    last_change: AuditEntry | None = None
    """The newest apply / restart / rollback on the trail: its line goes under the timeline."""
    applied: tuple[str, int | None] | None = None
    """The profile the trail says was last applied and its target (None: gone or broken here)."""
    alerts: tuple[Alert, ...] = ()
    """The alerts firing now."""
    lines: tuple[OutsideLines, ...] = ()
    """The newest `OUTSIDE_KEPT` batches of outside lines."""

    @property
    def pairing_known(self) -> bool:
        """The bar under the header is shown once the state directory was read or failed to be."""
        return self.view is not None or self.link_error is not None

    @property
    def alert(self) -> tuple[Alert, int] | None:
        """The worst alert firing and how many fire (the header's badge), None when none does."""
        top = worst(self.alerts)
        return (top, len(self.alerts)) if top is not None else None

    def with_lines(self, after: int, events: Sequence[Event], entries: Sequence[AuditEntry] = ()) -> HostUi:
        """This state with one more batch of outside lines."""
        serial = self.lines[-1].serial + 1 if self.lines else 1
        batch = OutsideLines(serial, after, tuple(events), tuple(entries))
        return replace(self, lines=(*self.lines[-(OUTSIDE_KEPT - 1) :], batch))

    def lines_after(self, serial: int) -> tuple[OutsideLines, ...]:
        """The batches newer than `serial`, oldest first."""
        return tuple(b for b in self.lines if b.serial > serial)
