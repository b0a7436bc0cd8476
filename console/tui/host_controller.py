"""One host's controller: its state, session, service controller and pairing link, and the changes the
operator makes to it.

The app keeps one per host and hands it the operator's requests. The controller asks first, takes the
host's lock, runs apply / rollback / restart inside it, keeps the audit trail and plays the progress on
its dashboard; it reaches the app only through `ControllerUi`. What the widgets show of the host beyond
its snapshots (the note, the link's error, the pairing view, the trail's last change and applied target,
the alerts, the feed's outside lines) it publishes as one immutable `HostUi` (console/tui/host_ui.py):
it never writes into a widget.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from textual.message import Message

from console.core.alerts import Alert, Rule, alert_inputs, evaluate
from console.core.audit import AuditEntry
from console.core.events import Event
from console.core.flags import FlagList
from console.core.hostfacts import HostFacts
from console.core.hostfold import HostFold
from console.core.pairing import Identity, PairingView
from console.core.profiles import ProfileError
from console.core.recording import RecordSink
from console.core.serving import ServingFigures
from console.core.snapshot import FollowState, HostSnapshot
from console.sources.profile_store import ProfileStore, applied_target
from console.tui.alert_router import alert_line
from console.tui.host_changes import ConsoleUi, HostChanges
from console.tui.host_entry import HostEntry
from console.tui.host_ui import HostUi
from console.tui.messages import AlertChanged
from console.tui.pairing import TIMELINE_ACTIONS, PairingLink
from console.tui.profiles import HostView
from console.tui.view import display_boot

if TYPE_CHECKING:
    from console.sources.service import ServiceController
    from console.tui.dashboard import HostDashboard

CONSOLE_HEARTBEAT_S = 5.0
CONSOLE_POLL_S = 4.0


class ControllerUi(ConsoleUi, Protocol):
    """What a controller needs of the app besides `ConsoleUi`: where its state goes."""

    def publish(self, host: str, state: HostUi) -> None:
        """`host`'s new state, for its dashboard (if composed) and the overview's row."""

    def take_snapshot(self, snap: HostSnapshot) -> None:
        """Show `snap` now, as a snapshot the session published (the audit lines go after its events)."""

    def post_message(self, message: Message) -> bool: ...

    def dashboard_of(self, host: str) -> HostDashboard:
        """`host`'s dashboard, composed if it was not yet (the change flows play on its timeline)."""
        ...


class HostController(HostChanges):
    def __init__(
        self,
        entry: HostEntry,
        ui: ControllerUi,
        *,
        me: Identity,
        store: ProfileStore,
        read_only: bool,
    ) -> None:
        self.entry = entry
        self.name = entry.name
        self.ui: ControllerUi = ui
        self.published = HostUi()
        """What the widgets show of the host beyond its snapshots, as last published."""
        self.latest: HostSnapshot | None = None
        """The newest snapshot the app took (shown, or held while the host is not on screen)."""
        self.facts: HostFacts | None = None
        """What the console learned of the host (`k26-console host`), once it has."""
        self.host_flags: FlagList | None = None
        """The flag list of the SGLang the host runs (its own, or the shipped one its facts name)."""
        self.leaving = False
        """The console is quitting or lost its terminal: no presence is written from now on."""
        self.me = me
        self.store = store
        self.read_only = read_only
        self.session: Any = None
        """The `HostSession` once started (None: not connected, or a console without sessions)."""
        self.service: ServiceController | None = None
        self.link: PairingLink | None = None
        """The host's presence, lock and audit trail, once its state directory is being read."""
        self.running_argv: list[str] | None = None
        """The running ExecStart argv, for the editor's diff; dropped after every restart."""
        self.busy: str | None = None
        """The apply, rollback or restart in flight (one at a time)."""
        self.pool_before: int | None = None
        """What a rollback must bring back: the pool of the boot the last apply replaced."""
        self.applied: str | None = None
        """The profile last applied and verified here (the probe keeps its results there)."""
        self.pending: HostSnapshot | None = None
        """The newest snapshot not yet shown; older ones are dropped, never queued."""
        self.posted = False
        """A `SnapshotReady` for this host is in flight."""
        self.alerts: dict[str, Alert] = {}
        """The host's firing alerts, by rule."""
        self.recorder: RecordSink | None = None
        """Where this host's inputs are being recorded (`console/tui/recording.py`), or None."""

    @property
    def dashboard(self) -> HostDashboard:
        """The host's dashboard, for the change flows (console/tui/host_changes.py), which run with it on
        screen; everything else the controller shows goes out as its published `HostUi`."""
        return self.ui.dashboard_of(self.name)

    # ---- what the widgets show -----------------------------------------------------------------------

    def _publish(self, state: HostUi) -> None:
        self.published = state
        self.ui.publish(self.name, state)

    def _events_now(self) -> int:
        """Journal events folded so far (outside lines are placed after them)."""
        return self.latest.events_total if self.latest is not None else 0

    def add_lines(self, events: Sequence[Event], entries: Sequence[AuditEntry] = ()) -> None:
        """Lines for the feed from outside the journal: after the events folded so far."""
        self._publish(self.published.with_lines(self._events_now(), events, entries))

    # ---- recording -----------------------------------------------------------------------------------

    def start_recording(self, recorder: RecordSink) -> None:
        """Record this host's inputs from now on: the session's, and the pairing view and audit trail."""
        self.recorder = recorder
        if self.session is not None:
            self.session.start_recording(recorder)
        if self.link is not None and self.link.view is not None:
            recorder.record(self.name, "view", self.link.view)

    def stop_recording(self) -> None:
        self.recorder = None
        if self.session is not None:
            self.session.recorder = None

    # ---- alerts --------------------------------------------------------------------------------------

    def check_alerts(
        self, snap: HostSnapshot, rules: tuple[Rule, ...], serving: ServingFigures | None = None
    ) -> None:
        """Evaluate the rules on a snapshot; what fires or clears goes into the published state (the
        header's badge, a feed line) and to the app as an `AlertChanged` (the bell, the hook). The service's state is the boot's
        (the live view runs no `systemctl show`); `serving` is the session's window of `/metrics`
        scrapes (the snapshot's), and without it the gauges come from the newest `/metrics` reading and
        the window's latencies are absent, so their rules do not fire."""
        if not rules:
            return
        boot = display_boot(snap.state)
        inputs = alert_inputs(
            snap,
            serving,
            boot=boot,
            errors_known=boot is not None or snap.follower.state is FollowState.FOLLOWING,
        )
        result = evaluate(rules, inputs, self.alerts, host=self.name, ts=snap.ts)
        self.alerts = result.firing
        if not result.transitions:
            return
        # The badge and the feed's lines are the host's state; the bell and the hook are the app's.
        state = replace(self.published, alerts=tuple(result.firing.values()))
        lines = [alert_line(alert) for alert in result.transitions]
        self._publish(state.with_lines(snap.events_total, lines))
        worst = result.worst()
        for alert in result.transitions:
            self.ui.post_message(AlertChanged(self.name, alert, worst, len(result.firing)))

    def clear_alerts(self) -> None:
        """None firing: the rules start again (a replay's seek)."""
        self.alerts = {}
        self._publish(replace(self.published, alerts=()))

    # ---- the session -------------------------------------------------------------------------------

    async def pump(
        self, post: Callable[[HostSnapshot], None], lines: Callable[[HostFold], None] | None = None
    ) -> None:
        """Prepare the host if needed, run its session and hand every snapshot to `post`, and the fold
        to `lines` each time journal lines were folded (the feed draws them before the next snapshot)."""
        from console.sources.session import HostSession

        entry = self.entry
        config = entry.config
        if config is None and entry.prepare is not None:
            note = "starting the simulated host…" if entry.simulated else "preparing…"
            self._publish(replace(self.published, note=note))
            try:
                config = await asyncio.to_thread(entry.prepare)
            except Exception as exc:
                self._publish(replace(self.published, note=f"could not start: {exc}"))
                self.ui.notify(f"{self.name}: {exc}", severity="error", timeout=30)
                return
        if config is None:
            return
        session = HostSession(config, entry.session)
        session.on_journal = lines
        self.session = session
        tasks: list[asyncio.Task[None]] = []
        if self.recorder is not None:
            session.start_recording(self.recorder)
        try:
            await session.start()
            if entry.after_start is not None:
                tasks.append(asyncio.create_task(self._after_start(entry.after_start)))
            tasks.append(asyncio.create_task(self._pair(session)))
            if entry.learn:
                tasks.append(asyncio.create_task(self._learn(session)))
            async for snap in session.snapshots():
                post(snap)
        finally:
            for task in tasks:
                task.cancel()
            if self.link is not None:
                await self.link.leave()
            await session.close()

    async def _learn(self, session: Any) -> None:
        """What the host runs (its SGLang and flag list, the model's shape): for the header and the
        profile editor, which validates against the host's own flags once they are known."""
        from console.sources.hostinfo import HostInfoError, learn_with_flags
        from console.sources.transport import TransportError

        try:
            self.facts, flags = await learn_with_flags(session.host, session.transport)
        except (HostInfoError, TransportError, OSError) as exc:
            self.ui.notify(
                f"{self.name}: the console could not learn the host ({exc}); the profile's shipped flag "
                "list and the model catalogue are used.",
                severity="warning",
                timeout=10,
            )
            return
        self._publish(replace(self.published, facts=self.facts))
        if self.facts.flags.flags_from == "host":  # a shipped fallback is no news about the host
            self.host_flags = flags
            if self.service is not None:
                self.service.host_flags = flags

    async def _after_start(self, after_start: Callable[[], object]) -> None:
        try:
            await asyncio.to_thread(after_start)
        except Exception as exc:
            self.ui.notify(f"{self.name}: {exc}", severity="error", timeout=30)

    def service_controller(self, *, quiet: bool = False) -> ServiceController | None:
        """The host's service controller (one, on the session's transport), or None with a sentence for
        the operator when it cannot be had."""
        from console.sources.session import HostSession

        if not isinstance(self.session, HostSession):
            if not quiet:
                self.ui.notify(f"{self.name}: not connected.", severity="error")
            return None
        if self.service is None:
            try:
                from console.sources.service import ServiceController
            except ImportError:
                if not quiet:
                    self.ui.notify("this installation has no service controller.", severity="error")
                return None
            session = self.session
            self.service = ServiceController(
                session.host, session.transport, state_dir=self.entry.restart_history_dir
            )
            self.service.host_flags = self.host_flags
        return self.service

    # ---- pairing: presence, the lock, the audit trail ------------------------------------------

    async def _pair(self, session: Any) -> None:
        from console.sources.hoststate import HostStateDir

        if self.leaving:
            return  # a session that came up as the console left: no heartbeat to leave behind
        options = self.entry.pairing
        # A console is open for days: beat and look every few seconds, not every two (each is an SSH
        # exec on the host; idle CPU was measured at 3.1% of a core with 2 s). Readers judge staleness
        # by each writer's own interval, so a 2 s `apply` and a 5 s console mix fine.
        poll_s = CONSOLE_POLL_S if options.poll_s is None else options.poll_s
        state = HostStateDir(
            session.transport,
            session.host,
            self.me,
            heartbeat_s=CONSOLE_HEARTBEAT_S if options.heartbeat_s is None else options.heartbeat_s,
            stale_factor=options.stale_factor,
        )
        state.board.looking_at = self.ui.looking_at(self.name)
        self.link = PairingLink(
            state,
            on_view=self._on_view,
            on_audit=self._on_audit,
            on_error=self._on_error,
            on_note=self._on_note,
            poll_s=poll_s,
        )
        await self.link.run()

    async def leave(self, timeout_s: float) -> None:
        """Take this console's presence, and a lock it holds, off the host (best effort, bounded)."""
        self.leaving = True
        if self.link is not None:
            await self.link.leave(timeout_s)

    def _on_view(self, view: PairingView) -> None:
        if self.recorder is not None:
            self.recorder.record(self.name, "view", view)
        at = self.link.state.runner.now() if self.link is not None else None
        self._publish(replace(self.published, view=view, view_at=at, link_error=None))

    def _on_note(self, sentence: str) -> None:
        if self.ui.is_running:
            self.ui.notify(f"{self.name}: {sentence}", title="audit trail", severity="warning", timeout=20)

    def _on_error(self, sentence: str) -> None:
        self._publish(replace(self.published, link_error=sentence))

    def _on_audit(self, entries: list[AuditEntry]) -> None:
        if entries and self.recorder is not None:
            self.recorder.record(self.name, "audit", entries)
        if not entries:
            return
        current = getattr(self.session, "current", None)
        if callable(current) and self.ui.is_running:
            # The audit lines go after every journal line read before them (a snapshot still waiting
            # to be shown would put them earlier): the feed's order is then the inputs' order, which a
            # replay of a recording reproduces line for line.
            self.pending = None
            self.ui.take_snapshot(current())
        state = self.published
        applied, target = applied_target(entries, self.store)
        if applied is not None:
            state = replace(state, applied=(applied, target))
        changes = [e for e in entries if e.action in TIMELINE_ACTIONS]
        if changes:
            state = replace(state, last_change=changes[-1])
        self._publish(state.with_lines(self._events_now(), [e.to_event() for e in entries], entries))

    def tick(self) -> None:
        """Once a second: what this console looks at, and the lock's age or an armed rollback's countdown."""
        link = self.link
        if link is None:
            return
        link.state.board.looking_at = self.ui.looking_at(self.name)
        view = link.view
        if view is not None and (view.lock or view.pending_rollback):
            self._publish(replace(self.published, view_at=link.state.runner.now()))

    # ---- what the screens read ---------------------------------------------------------------------

    def host_view(self) -> HostView:
        """The host as the profile editor's what-if and diff need it, from the newest snapshot."""
        snap = self.latest
        config = self.entry.config
        return HostView(
            boots=snap.state.boots if snap is not None else (),
            model=getattr(config, "model", None) if config is not None else None,
            running_argv=self.running_argv,
            host_flags=self.host_flags,
        )

    async def fetch_running_argv(self) -> bool:
        """Read the unit's ExecStart for the editor's diff; True when it was read."""
        service = self.service_controller(quiet=True)
        if service is None:
            return False
        try:
            argv = await service.running_argv()
        except Exception as exc:
            self.ui.notify(
                f"{self.name}: cannot read the running ExecStart: {exc}", severity="warning", timeout=8
            )
            return False
        self.running_argv = list(argv)
        return True

    async def profile_in_force(self, name: str) -> str | None:
        """None when the unit runs profile `name` as `apply` writes it; otherwise why not, in words. A
        probe's tok/s go into a profile's `[verified]` only when that profile is what ran: the
        console's --profile is a goal, not a statement about the server."""
        service = self.service_controller(quiet=True)
        if service is None:
            return f"{self.name} is not connected, so its running flags are not known"
        try:
            profile = await asyncio.to_thread(self.store.load, name)
        except ProfileError as exc:
            return str(exc).rstrip(".")
        return await service.why_not_running(profile)
