"""Pairing on the dashboard: who else is on the host, who holds its lock, and the audit trail live.

`PairingLink` is the glue between one host's `HostStateDir` (over the session's SSH transport) and the
dashboard: it heartbeats this console's presence, watches the presence directory and the lock, and
follows `audit.jsonl`, handing each change to callbacks on the app's loop. `PairingBar` is the one line
under the header that shows it; the words (the bar, the timeline note, a refusal) are plain functions so
the tests read them without a screen.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import datetime
from typing import Any

from rich.text import Text
from textual.widget import Widget

from console.core.audit import AuditEntry
from console.core.pairing import Identity, PairingView, fmt_span
from console.sources.hoststate import HostStateDir, HostStateError
from console.sources.transport import TransportError
from console.tui.themes import palette
from console.tui.view import textual_text

__all__ = [
    "AUDIT_BACKLOG",
    "TIMELINE_ACTIONS",
    "PairingBar",
    "PairingLink",
    "held_by_other",
    "intent_phrase",
    "lock_note",
    "pairing_text",
    "refusal",
]

AUDIT_BACKLOG = 5
"""Entries of the trail shown on the feed when the console opens: enough to see what happened last."""
TIMELINE_ACTIONS = frozenset({"apply", "restart", "rollback"})
"""Audit actions whose line goes under the restart timeline (a probe or a lock break does not restart)."""


def intent_phrase(intent: str) -> str:
    """'apply ctx-200k' → 'applying ctx-200k': how the note says what the holder is doing."""
    verb, _, rest = intent.partition(" ")
    words = {"apply": "applying", "rollback": "rolling back", "restart": "restarting", "probe": "probing"}
    if verb not in words:
        return intent
    if not rest:
        rest = {"restart": "the service", "probe": "the server"}.get(verb, "")
    return f"{words[verb]} {rest}".rstrip()


def held_by_other(view: PairingView | None, me: Identity) -> bool:
    return view is not None and view.lock is not None and view.lock.holder.console_id != me.console_id


def lock_note(view: PairingView | None, me: Identity, now: datetime | None = None) -> str | None:
    """The timeline's note while another console holds the lock: 'bob@jump2 is applying ctx-200k (lock
    held 1m12s)', or, when its console has gone quiet, that the lock may be broken. None otherwise."""
    if view is None or view.lock is None or not held_by_other(view, me):
        return None
    lock = view.lock
    held = fmt_span(((now or view.now) - lock.taken_at).total_seconds())
    if view.lock_stale:
        return (
            f"{lock.holder.who}'s lock ({lock.intent}, held {held}) is stale: its console has gone quiet; "
            f"ctrl+p → Break the stale lock on {view.host}"
        )
    return f"{lock.holder.who} is {intent_phrase(lock.intent)} (lock held {held})"


def refusal(view: PairingView | None, me: Identity, what: str) -> str | None:
    """Why `what` ("applying ctx-200k", "a restart") is refused now, naming the holder and its intent;
    None when no other console holds the lock."""
    if view is None or view.lock is None or not held_by_other(view, me):
        return None
    head = view.lock_line().rstrip(".")
    if view.lock_stale:
        return f"{head}; {what} is refused until the stale lock is broken (ctrl+p → Break the stale lock)."
    return f"{head}; {what} is refused until it is released."


def _clock(ts: datetime) -> str:
    return ts.astimezone().strftime("%H:%M:%S")


def pairing_text(
    view: PairingView | None, me: Identity, now: datetime | None = None, *, link_error: str | None = None
) -> Text:
    """The bar: the lock, then the other consoles (who, what they look at, since when)."""
    out = Text(no_wrap=True, overflow="ellipsis")
    if view is None:
        out.append(link_error or "pairing: reading the host's state directory…", palette().muted)
        return out
    # The lock first: on a narrow pane the bar is cut on the right, and the lock is what stops a change.
    lock = view.lock
    if lock is None:
        out.append("lock free", palette().ok)
    elif not held_by_other(view, me):
        out.append(f"lock held by this console: {lock.intent}", palette().style("warn", bold=True))
    else:
        held = fmt_span(((now or view.now) - lock.taken_at).total_seconds())
        if view.lock_stale:
            out.append("STALE lock ", palette().style("bad", bold=True))
            out.append(f"{lock.holder.who}: {lock.intent}, {held}; its console has gone quiet", palette().bad)
        else:
            out.append("locked ", palette().style("warn", bold=True))
            out.append(f"by {lock.holder.who}: {lock.intent}, {held}", palette().warn)
    pending = view.pending_rollback
    if pending is not None:
        # A commit-confirmed apply not yet confirmed: the host rolls itself back at the deadline.
        left = max(0.0, pending.seconds_left(now or view.now))
        out.append("  │  ", palette().faint)
        out.append("ROLLBACK ARMED ", palette().style("bad", bold=True))
        out.append(
            f"{pending.profile or pending.unit} by {pending.armed_by}: fires in {fmt_span(left)} unless "
            "confirmed (k26-console confirm)",
            palette().bad,
        )
    out.append("  │  ", palette().faint)
    others = view.others(me)
    if others:
        out.append("with ", palette().muted)
        for i, p in enumerate(others):
            if i:
                out.append(", ", palette().muted)
            out.append(p.who, palette().style("info", bold=True))
            detail = f" ({p.looking_at}, " if p.looking_at else " ("
            out.append(f"{detail}since {_clock(p.since)})", palette().muted)
    else:
        out.append(f"no other console on {view.host}", palette().muted)
    if link_error:
        out.append(f"  ({link_error})", palette().muted)
    return out


class PairingBar(Widget):
    """One line under the header: the other consoles on this host and the lock."""

    DEFAULT_CLASSES = "pairing-bar"
    HELP = (
        "[b]Pairing[/b]\nThe other consoles open on this host (user@jump host, what they show, since when) "
        "and the host's lock: free, held by this console, held by another (apply, restart and roll back "
        "are refused until it is released) or stale (its console has gone quiet; ctrl+p → Break the "
        "stale lock, after a confirmation). ROLLBACK ARMED: an apply armed a rollback on the host that fires "
        "at the deadline unless its boot is confirmed (k26-console confirm HOST, or --rollback-now). Every "
        "change to the service is recorded in the host's audit.jsonl and shown on the feed."
    )

    def __init__(self, me: Identity, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.me = me
        self.view: PairingView | None = None
        self.now: datetime | None = None
        self.link_error: str | None = None

    def set_view(self, view: PairingView | None, now: datetime | None = None) -> None:
        self.view = view
        self.now = now
        self.refresh()

    def render(self) -> Text:
        return textual_text(pairing_text(self.view, self.me, self.now, link_error=self.link_error))


class PairingLink:
    """One host's presence, lock and audit trail for the console, over the session's transport."""

    def __init__(
        self,
        state: HostStateDir,
        *,
        on_view: Callable[[PairingView], None],
        on_audit: Callable[[list[AuditEntry]], None],
        on_error: Callable[[str], None] | None = None,
        on_note: Callable[[str], None] | None = None,
        poll_s: float = 2.0,
        backlog: int = AUDIT_BACKLOG,
    ) -> None:
        """`on_error`: the link cannot read the host's state (shown until the next view); `on_note`: a
        sentence about the audit trail the operator must read once (a trail refused, or read in part)."""
        self.state = state
        self.on_view = on_view
        self.on_audit = on_audit
        self.on_error = on_error
        self.on_note = on_note or on_error
        self.poll_s = poll_s
        self.backlog = backlog
        self.view: PairingView | None = None
        self._leaving: asyncio.Future[None] | None = None
        self._wake = asyncio.Event()

    @property
    def me(self) -> Identity:
        return self.state.me

    @property
    def left(self) -> bool:
        """This console has left the host (or is leaving it): set by the first `leave`."""
        return self._leaving is not None

    async def run(self) -> None:
        """Heartbeat, watch and follow until cancelled."""
        tasks = [
            asyncio.create_task(self._beat_and_watch(), name="k26-pairing-heartbeat"),
            asyncio.create_task(self._follow(), name="k26-pairing-audit"),
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait(tasks)

    async def watch_only(self) -> None:
        """Watch the lock and follow the audit trail without a heartbeat, until cancelled: a headless
        recorder (`k26-console record`) is not a console on the host."""
        await asyncio.gather(self._watch(), self._follow())

    def poke(self) -> None:
        """Look again now rather than at the next poll (after this console took, released or broke
        the lock)."""
        self._wake.set()

    async def refresh(self, *, beat: bool = False) -> PairingView | None:
        """A fresh look at the lock and the consoles, published as any other; None when the host's
        state directory cannot be read right now. `beat`: this console's heartbeat is written by the
        same run on the host."""
        board = self.state.board
        try:
            view = await (board.beat_and_view() if beat else board.view())
        except (TransportError, HostStateError) as exc:
            if self.on_error is not None:
                self.on_error(str(exc))
            return None
        self._publish(view)
        return view

    def _publish(self, view: PairingView) -> None:
        changed = self.view is None or view.signature() != self.view.signature()
        self.view = view
        if changed:
            self.on_view(view)

    async def _watch(self, *, beat: bool = False) -> None:
        # Not `PresenceBoard.watch`: a poke must be able to cut the wait short.
        while True:
            await self.refresh(beat=beat)
            self._wake.clear()
            # Read each time: the fleet plan changes both paces while the link runs.
            every = min(self.poll_s, self.state.board.heartbeat_s) if beat else self.poll_s
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every):
                    await self._wake.wait()

    async def _beat_and_watch(self) -> None:
        """Heartbeat and watch in one run on the host, at the sooner of the two paces (a poke too): at a
        console's 5 s beat and 4 s poll, 15 SSH channels a minute where a heartbeat task and a watch task
        opened 27 (each ~3 ms of the console's CPU)."""
        await self._watch(beat=True)

    async def _follow(self) -> None:
        said: str | None = None
        while True:
            try:
                log = await self.state.audit.read_log()
                break
            except TransportError:
                await asyncio.sleep(self.poll_s)
            except HostStateError as exc:
                # A trail the host refuses to read (not a regular file, say): said once, then tried again.
                if str(exc) != said and self.on_note is not None:
                    said = str(exc)
                    self.on_note(said)
                await asyncio.sleep(self.poll_s)
        cut = self.state.audit.cut
        if cut and self.on_note is not None:
            self.on_note(cut)  # only the trail's tail was read: the operator is told what was left out
        if log.entries and self.backlog:
            self.on_audit(log.entries[-self.backlog :])
        try:
            async for entry in self.state.audit.follow(after_line=log.lines):
                self.on_audit([entry])
        except HostStateError as exc:
            if self.on_error is not None:
                self.on_error(str(exc))

    async def leave(self, timeout: float = 3.0) -> None:
        """Take this console's heartbeat off the host (and a lock it still holds); best effort.

        Once: a second call waits for the first's removal (within its own `timeout`) rather than
        returning at once. SIGHUP 30 ms after `q` had the lifeline's leave return while q's was still
        on the wire, and the app's exit then cut it off: the heartbeat stayed on the host."""
        if self._leaving is None:
            self._leaving = asyncio.ensure_future(self._leave(timeout))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                # shielded: a caller that stops waiting (its bound, a cancel) leaves the removal running
                await asyncio.shield(self._leaving)

    async def _leave(self, timeout: float) -> None:
        transport = getattr(self.state, "transport", None)
        if transport is not None and getattr(transport, "connection", True) is None:
            # No link now (never made, or lost): nothing can be taken off the host, and waiting for a
            # reconnection kept a console whose host was unreachable 3.4 s on its way out. Its
            # heartbeat goes stale there instead, and a lock it held with it.
            return
        with contextlib.suppress(TransportError, HostStateError, TimeoutError, OSError):
            async with asyncio.timeout(timeout):
                await self.state.board.leave()


def activity(screen: object, host: str, ctl: Any, *, overview: bool, read_only: bool) -> str:
    """What this console is looking at on `host`, as its presence tells the other consoles: the profiles
    (and which), the probe, the change in flight, the fleet overview or the dashboard."""
    from console.tui.probe import ProbeScreen
    from console.tui.profiles import ProfilesScreen

    if isinstance(screen, ProfilesScreen) and screen.host == host:
        what = f"profiles {screen.current}" if screen.current else "profiles"
    elif isinstance(screen, ProbeScreen) and getattr(screen.host, "name", screen.host) == host:
        what = "probe"
    elif ctl is not None and ctl.busy is not None:
        what = ctl.busy
    elif overview:
        what = "fleet overview"
    else:
        what = "dashboard"
    if read_only:
        return "read-only" if what == "dashboard" else f"read-only, {what}"
    return what
