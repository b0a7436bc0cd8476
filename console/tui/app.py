"""The full-screen console: one dashboard per host (tabs when there are several), each driven by its
`HostController` (console/tui/host_controller.py).

Sessions run as workers on the app's event loop; each publishes immutable snapshots, and the app keeps only
the newest one per host and posts a single message until the dashboard has taken it, so a host that
talks faster than the terminal repaints costs skipped snapshots, never a queue. Widgets, screens and the
palette ask for things with messages (console/tui/messages.py); the app routes them to the host's
controller and owns only what is shared: screens, help, quitting.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from textual import events
from textual.actions import SkipAction
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widgets import TabbedContent, TabPane

from console.core.hostfold import HostFold
from console.core.pairing import Identity
from console.core.snapshot import HostSnapshot
from console.core.text import terminal_safe
from console.sources.alerts import AlertConfig
from console.sources.hoststate import local_identity
from console.sources.profile_store import ProfileStore
from console.sources.shipped import stylesheets as css_paths
from console.tui.alert_router import AlertRouter
from console.tui.commands import ConsoleCommands
from console.tui.dashboard import MUTATING_ACTIONS, HostDashboard, dom_id
from console.tui.fleet import (
    FLEET_MIN_HOSTS,
    FLEET_TAB,
    OPENS_ON_FLEET,
    FleetPacer,
    FleetRows,
    FleetView,
    RowInputs,
)
from console.tui.footer import KeyFooter
from console.tui.gcpace import GcPacer
from console.tui.host_controller import HostController
from console.tui.host_entry import HostEntry
from console.tui.host_ui import HostUi
from console.tui.messages import (
    AlertChanged,
    ApplyRequested,
    BreakRequested,
    HostChosen,
    ProbeRequested,
    ProfilesRequested,
    RestartRequested,
    RollbackRequested,
    SnapshotReady,
)
from console.tui.pairing import activity, held_by_other
from console.tui.profiles import ProfilesScreen
from console.tui.recording import RecordSwitch
from console.tui.screens import HelpScreens, focused_help, help_keys
from console.tui.themes import DEFAULT_THEME, THEMES, restyle_screens, role_variables
from console.tui.timer_slots import draw_the_next_frame_at_once, land_late_ticks_on_the_next_slot

__all__ = ["ConsoleApp", "HostEntry"]


def _raise(exc: Exception) -> None:
    raise exc


class ConsoleApp(App[int]):
    TITLE = "k26-console"
    CSS_PATH = css_paths()  # type: ignore[assignment]
    COMMANDS = {ConsoleCommands}  # noqa: RUF012
    BINDINGS = [  # noqa: RUF012 - Textual reads it as a class attribute
        Binding("q", "quit", "Quit"),
        Binding("f1", "help", "Help"),
        # The footer shows the palette on its right already.
        Binding("ctrl+p", "command_palette", "Commands", show=False),
        # Reached only when the dashboard's own r / R is disabled because another console holds the
        # lock: the key then says who and for what instead of doing nothing.
        Binding("r", "refused('a restart')", show=False),
        Binding("R", "refused('a rollback')", show=False),
        # Starts / stops recording what the hosts send (console/tui/recording.py); F1 names it.
        Binding("W", "record", "Record", show=False),
        # Back to the fleet overview from a host's dashboard (only with two hosts or more).
        Binding("o", "fleet", "Fleet"),
    ]

    def __init__(
        self,
        entries: list[HostEntry],
        *,
        read_only: bool = False,
        target: int | None = None,
        target_source: str | None = None,
        clock: Callable[[], float] = time.time,
        connect: bool = True,
        store: ProfileStore | None = None,
        profile: str | None = None,
        identity: Identity | None = None,
        alerts: AlertConfig | None = None,
        record: Path | None = None,
        theme: str = DEFAULT_THEME,
    ) -> None:
        """`connect=False` opens the dashboards without sessions: the tests feed snapshots themselves.
        `store` holds the flag profiles (default: the user's, then the shipped examples); `profile` is
        the one the profiles screen opens on. `identity` is who this console says it is on the hosts
        (default: the local login, this machine, this process). `alerts` are the rules, the bell and the
        hook (`console/sources/alerts.py`); None: no alerts. `theme`: dark, light or high-contrast
        (console/tui/themes.py)."""
        # Before any screen makes its repaint timer: a repaint after a pause must not hold the next one
        # back by two frames (console/tui/timer_slots.py).
        land_late_ticks_on_the_next_slot()
        super().__init__()
        for registered in THEMES.values():
            self.register_theme(registered)
        self.me = identity or local_identity()
        self.entries = entries
        self.read_only = read_only
        self.target = target
        self.target_source = target_source
        self.clock = clock
        self.connect = connect
        self.store = store if store is not None else ProfileStore()
        self.profile = profile
        self.hosts: dict[str, HostController] = {}
        """Each host's controller: its session, lock, apply, rollback and restart."""
        for entry in entries:
            self.hosts[entry.name] = HostController(
                entry, self, me=self.me, store=self.store, read_only=read_only
            )
        self.dashboards: dict[str, HostDashboard] = {}
        """Each host's dashboard once composed: the host the console opens on from the start, another when
        it is first shown (a host followed on the overview costs its session, not a dashboard's widgets)."""
        if entries and len(entries) < OPENS_ON_FLEET:
            self.dashboards[entries[0].name] = self.new_dashboard(entries[0])
        self.alerts = alerts
        self.alert_router = (
            AlertRouter(
                alerts,
                say=lambda host, events: self.hosts[host].add_lines(events),
                bell=lambda: self.bell(),
                run=lambda flow: self.run_worker(flow, group="alerts"),
                running=lambda: self.is_running,
            )
            if alerts is not None
            else None
        )
        self._help = HelpScreens(read_only)
        self._pacer = GcPacer()
        self.recording = RecordSwitch(self.hosts, record)
        self._record_at_start = record is not None
        self.theme = theme
        self.fleet: FleetView | None = None
        """The overview (console/tui/fleet.py), with two hosts or more."""
        self.fleet_pacer: FleetPacer | None = None
        self._held: set[str] = set()
        """The hosts whose newest snapshot is not on their dashboard (behind another tab): shown when it
        comes back."""
        if len(entries) >= FLEET_MIN_HOSTS:
            self.fleet_pacer = FleetPacer(entries)
            self.fleet_pacer.show(None if len(entries) >= OPENS_ON_FLEET else entries[0].name)
            rows = FleetRows(
                [e.name for e in entries], self.row_inputs, self.fleet_pacer, target=target, clock=clock
            )
            self.fleet = FleetView([e.name for e in entries], rows.rows, plan=self.fleet_pacer.background)

    def new_dashboard(self, entry: HostEntry) -> HostDashboard:
        """A host's dashboard, made when it is first composed."""
        return HostDashboard(
            entry,
            read_only=self.read_only,
            target=self.target,
            target_source=self.target_source,
            clock=self.clock,
            me=self.me,
        )

    def compose(self) -> ComposeResult:
        if len(self.entries) == 1:
            yield self.dashboards[self.entries[0].name]
        else:
            first = (
                FLEET_TAB if len(self.entries) >= OPENS_ON_FLEET else f"tab-{dom_id(self.entries[0].name)}"
            )
            with TabbedContent(id="hosts", initial=first):
                if self.fleet is not None:
                    with TabPane("fleet", id=FLEET_TAB):
                        yield self.fleet
                for entry in self.entries:
                    # Content, not a string: a string title is read as markup, and a host may be gpu[1].
                    with TabPane(Content(terminal_safe(entry.name)), id=f"tab-{dom_id(entry.name)}"):
                        dash = self.dashboards.get(entry.name)
                        if dash is not None:  # the others are composed when first shown
                            yield dash
        yield self.recording.badge
        # Compact: an 80-column pane still shows restart, roll back, quit and help.
        yield KeyFooter(compact=True)

    def on_key(self, event: events.Key) -> None:
        # Once the key is handled (this runs before App._on_key, which runs the bindings: the call waits
        # its turn behind it), its answer is drawn in the next frame the screen asks for, not held to the
        # frame cap (console/tui/timer_slots.py).
        self.call_later(draw_the_next_frame_at_once)

    def on_mount(self) -> None:
        dash = self.active_dashboard
        if dash is not None:
            dash.feed.log_widget.focus()
        elif self.fleet is not None:
            self.fleet.focus_table()
        # Full collections of everything were 40-140 ms pauses, several a minute under load: see gcpace.
        self.call_after_refresh(self._pacer.install, self.set_interval)
        if self.connect and self._record_at_start:
            problem = self.recording.start()
            if problem is not None:
                self.notify(f"cannot record: {problem}", severity="error", timeout=30)
        self.set_interval(1.0, self.recording.show)
        if self.connect:
            for name, host in self.hosts.items():
                self.run_worker(
                    host.pump(self.post_snapshot, partial(self.post_lines, name)),
                    name=f"session-{name}",
                    group="sessions",
                )
            # The lock's age counts up, and what this console looks at changes with its screens.
            self.set_interval(1.0, self._tick_pairing)

    def get_theme_variable_defaults(self) -> dict[str, str]:
        # Our themes name every role; one of Textual's own gets them from its standard colours, so text
        # that names `$k26-bad` draws in that theme's red, not the plain foreground.
        return role_variables(self.current_theme)

    def watch_theme(self) -> None:
        # After Textual's own watcher, which refreshes the CSS variables (what content naming a role's
        # variable reads) and redraws the widgets: those that keep Rich text made in the old theme's colours
        # make it again (console/tui/themes.py), on every screen held: under the top one, and the help
        # screens kept off the stack. The first theme, set before the app runs, is drawn from the start.
        if not self.is_running:
            return

        def restyle() -> None:
            stack = self.screen_stack
            restyle_screens([*stack, *(s for s in self._help.screens(self) if s not in stack)])

        self.call_next(restyle)

    # ---- hosts ---------------------------------------------------------------------------------------

    @property
    def active_host(self) -> str | None:
        """The host whose tab is on screen; None on the overview."""
        if not self.entries:
            return None
        if len(self.entries) == 1:
            return self.entries[0].name
        with contextlib.suppress(Exception):
            active = self.query_one(TabbedContent).active
            if active == FLEET_TAB:
                return None
            for entry in self.entries:
                if f"tab-{dom_id(entry.name)}" == active:
                    return entry.name
        return self.entries[0].name if len(self.entries) < OPENS_ON_FLEET else None

    @property
    def active_dashboard(self) -> HostDashboard | None:
        host = self.active_host
        return self.dashboards.get(host) if host is not None else None

    def on_screen(self, host: str) -> bool:
        """`host`'s dashboard is the one shown (a single host's always is)."""
        return self.fleet is None or self.active_host == host

    def dashboard_of(self, host: str) -> HostDashboard:
        """`host`'s dashboard, composed now if it was not yet: it starts from what its controller has
        published and the newest snapshot."""
        dash = self.dashboards.get(host)
        if dash is not None:
            return dash
        ctl = self.hosts[host]
        dash = self.new_dashboard(ctl.entry)
        self.dashboards[host] = dash
        dash.present(ctl.published, ctl.latest)
        self._held.discard(host)
        if self.is_running and len(self.entries) > 1:
            self.query_one(f"#tab-{dom_id(host)}", TabPane).mount(dash)
        return dash

    def switch_host(self, name: str) -> None:
        dash = self.dashboard_of(name)
        if len(self.entries) > 1:
            self.query_one(TabbedContent).active = f"tab-{dom_id(name)}"
        self._show_held(name)  # now: a controller reads the dashboard's snapshot right after this
        self.call_after_refresh(dash.feed.log_widget.focus)

    def _show_held(self, name: str) -> None:
        """The newest snapshot of a host back on screen, which its dashboard did not take behind a tab."""
        dash, latest = self.dashboards.get(name), self.hosts[name].latest
        if name in self._held and dash is not None and latest is not None:
            self._held.discard(name)
            dash.show(latest)

    def post_snapshot(self, snap: HostSnapshot) -> None:
        """Hand a snapshot to the dashboard of its host. Only the newest waits; one message is in flight."""
        host = self.hosts.get(snap.host)
        if host is None:
            return
        host.pending = snap
        if not host.posted:
            host.posted = True
            self.post_message(SnapshotReady(snap.host))

    def post_lines(self, name: str, fold: HostFold) -> None:
        """Journal lines just folded, straight to the feed of a host on screen: a line is drawn in the
        next frame, not after the next snapshot (the session publishes at most ten a second, which
        added up to 100 ms to every line). The panels still wait for the snapshot, coalesced."""
        dash = self.dashboards.get(name)
        if dash is None or not self.is_running or self._exit:
            return
        if dash.composed and self.on_screen(name):
            try:
                dash.feed.take(fold.state, fold.recent, fold.events_total)
            except Exception as exc:
                # Raised in the session's task it would end the journal's reading, silently; raised in
                # the app it ends the console with its traceback, as any handler's would.
                self.call_next(_raise, exc)

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        host = self.hosts.get(message.host)
        if host is None:
            return
        host.posted = False
        snap, host.pending = host.pending, None
        # A snapshot that arrives while the app shuts down finds its widgets already gone.
        if snap is not None and self.is_running and not self._exit:
            self.take_snapshot(snap)
            if self.alerts is not None:
                host.check_alerts(snap, self.alerts.rules, snap.serving)

    def take_snapshot(self, snap: HostSnapshot) -> None:
        """The newest snapshot of its host: on its dashboard if on screen; behind another tab (or not yet
        composed) the dashboard would be laid out for nobody, and gets it when it comes on screen (the
        feed takes the events in between from it)."""
        host = self.hosts.get(snap.host)
        if host is None:
            return
        host.latest = snap
        dash = self.dashboards.get(snap.host)
        if dash is None or not self.is_running or self._exit:
            return
        if self.on_screen(snap.host):
            self._held.discard(snap.host)
            dash.show(snap)
        else:
            self._held.add(snap.host)

    def publish(self, host: str, state: HostUi) -> None:
        """A controller's new state: to its host's dashboard, if composed (the overview's rows read it
        from the controller at their next refresh)."""
        dash = self.dashboards.get(host)
        if dash is not None and self.is_running and not self._exit:
            dash.present(state, self.hosts[host].latest)

    def row_inputs(self, host: str) -> RowInputs:
        """What the overview's row of `host` is made of."""
        ctl = self.hosts[host]
        state = ctl.published
        return RowInputs(self.latest_snapshot(host), state.view, state.note, tuple(ctl.alerts.values()))

    def on_alert_changed(self, message: AlertChanged) -> None:
        """A firing or a clearing: the header's badge, a feed line, the bell once per firing, the hook."""
        if self.alert_router is not None:
            self.alert_router.changed(message)

    # ---- what the controllers ask of the app (`ConsoleUi`) -----------------------------------------

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """Every toast, the app's, a screen's or a controller's, as text drawn safe and never as markup
        (`markup` is not honoured): toasts quote the host (a lock holder, a failure's reasons), and one
        holding `[/]` or `[/opt/...]` was a MarkupError that ended the console with its presence left on
        the host."""
        super().notify(
            terminal_safe(message, keep_newlines=True),
            title=terminal_safe(title),
            severity=severity,
            timeout=timeout,
            markup=False,
        )

    async def ask(self, screen: Screen[Any]) -> Any:
        return await self.push_screen_wait(screen)

    def show_host(self, host: str) -> None:
        while isinstance(self.screen, ProfilesScreen):
            self.screen.action_close()
        self.switch_host(host)

    def looking_at(self, host: str) -> str:
        overview = self.fleet is not None and self.active_host is None
        screen = self.screen if self.is_running else None
        return activity(screen, host, self.hosts.get(host), overview=overview, read_only=self.read_only)

    # ---- the fleet overview -------------------------------------------------------------------------

    def latest_snapshot(self, host: str) -> HostSnapshot | None:
        """The newest snapshot of `host`: its dashboard's, or the one it holds for it behind a tab (a
        replay shows its seeks on the dashboards directly)."""
        dash = self.dashboards.get(host)
        if host in self._held or dash is None or dash.snap is None:
            return self.hosts[host].latest
        return dash.snap

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if self.fleet is None or event.tabbed_content.id != "hosts":
            return
        host = self.active_host
        if host is not None:
            self.dashboard_of(host)  # a tab clicked for the first time
            self._show_held(host)
        else:
            self.fleet.refresh_rows()
        if self.fleet_pacer is not None:
            self.fleet_pacer.show(host, self.hosts)

    def action_fleet(self) -> None:
        if self.fleet is None:
            raise SkipAction()
        while isinstance(self.screen, ProfilesScreen):
            self.screen.action_close()
        self.query_one(TabbedContent).active = FLEET_TAB
        self.call_after_refresh(self.fleet.focus_table)

    def _tick_pairing(self) -> None:
        for host in self.hosts.values():
            host.tick()

    # ---- the operator's requests, routed to the host's controller ----------------------------------

    def _start(self, message: RestartRequested | RollbackRequested | ApplyRequested | BreakRequested) -> None:
        host = self.hosts.get(message.host)
        if host is None:
            return
        if isinstance(message, ApplyRequested):
            flow = host.apply(message.profile)
        elif isinstance(message, RollbackRequested):
            flow = host.rollback()
        elif isinstance(message, RestartRequested):
            flow = host.restart()
        else:
            flow = host.break_lock()
        # A worker: the confirmation waits on its screen, and quitting cancels an operation in flight,
        # which then records its interruption in the audit trail.
        self.run_worker(flow, group="apply")

    on_apply_requested = on_rollback_requested = on_restart_requested = on_break_requested = _start

    def on_host_chosen(self, message: HostChosen) -> None:
        self.switch_host(message.host)

    def on_profiles_requested(self, message: ProfilesRequested) -> None:
        self.open_profiles(message.host, message.select)

    def on_probe_requested(self, message: ProbeRequested) -> None:
        self.open_probe(message.host)

    def open_profiles(self, host: str | None = None, select: str | None = None) -> None:
        ctl = self.hosts.get(host or self.active_host or "")
        if ctl is None or isinstance(self.screen, ProfilesScreen):
            return
        screen = ProfilesScreen(
            host=ctl.name,
            store=self.store,
            host_view=ctl.host_view,
            read_only=self.read_only,
            select=select or self.profile,
        )
        self.push_screen(screen)
        if ctl.running_argv is None:

            async def fetch() -> None:
                if await ctl.fetch_running_argv() and screen.is_attached:
                    screen.run_check()

            self.run_worker(fetch(), group="running-argv")

    def open_probe(self, host: str) -> None:
        """The probe screen (console/tui/probe.py) on the host's session; results are kept with the
        profile last verified here, else the one the console was opened with."""
        from console.tui.probe import ProbeScreen

        ctl = self.hosts.get(host)
        if ctl is None or ctl.session is None:
            self.notify(f"{host}: the probe needs a connected host.", severity="warning")
            return
        self.push_screen(
            ProbeScreen(
                ctl.session,
                profile=ctl.applied or self.profile,
                store=self.store,
                profile_check=ctl.profile_in_force,
                me=self.me,
            )
        )

    # ---- help, keys, quitting ----------------------------------------------------------------------

    def action_help_quit(self) -> None:
        """Ctrl-C: the key that quits, as the footer shows it (`q`), where Textual named its ctrl+q."""
        from textual.widgets import Input, TextArea

        quits = [k for k, b in self.active_bindings.items() if b.binding.action in ("quit", "app.quit")]
        if "q" in quits:
            how = "q"
        elif isinstance(self.focused, Input | TextArea):
            how = "Esc, then q"  # q is a letter where one types
        else:
            how = quits[0] if quits else "ctrl+q"
        self.notify(f"Press {how} to quit.", title="Do you want to quit?", markup=False)

    def action_help(self) -> None:
        profiles = isinstance(self.screen, ProfilesScreen)
        keys = help_keys(self.read_only, profiles=profiles, fleet=self.fleet is not None)
        self.push_screen(self._help.name_for(self, focused_help(self.focused), keys))

    def on_unmount(self) -> None:
        self._pacer.release()
        self.recording.stop()

    def action_record(self) -> None:
        self.recording.toggle(self.notify)

    async def action_quit(self) -> None:
        # Leave before the sessions close: the other consoles see this one go at once, not after its
        # heartbeat goes stale.
        await self.leave_hosts()
        self.exit()

    async def leave_hosts(self, timeout_s: float = 3.0) -> None:
        """Take this console's presence, and a lock it holds, off every host (best effort, bounded); also
        what `console.tui.lifeline` does on SIGHUP, SIGTERM or a lost terminal before it exits."""
        await asyncio.gather(*(host.leave(timeout_s) for host in self.hosts.values()))

    def action_refused(self, what: str) -> None:
        dash = self.active_dashboard
        if dash is None or not self.hosts[dash.entry.name].refuse_locked(what):
            raise SkipAction()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "fleet":
            return self.fleet is not None and self.active_host is not None
        if action == "refused":
            # Only while another console holds the lock (read-only keys stay silent and hidden).
            dash = self.active_dashboard
            return (
                not self.read_only
                and dash is not None
                and len(self.screen_stack) == 1
                and held_by_other(self.hosts[dash.entry.name].published.view, self.me)
            )
        return not (action in MUTATING_ACTIONS and self.read_only)
