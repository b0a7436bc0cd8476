"""The full-screen console: one dashboard per host (tabs when there are several), fed by `HostSession`s.

Sessions run as tasks on the app's event loop; each publishes immutable snapshots, and the app keeps only
the newest one per host and posts a single message until the dashboard has taken it, so a host that
talks faster than the terminal repaints costs skipped snapshots, never a queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from rich.text import Text
from textual import work
from textual.actions import SkipAction
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.command import Hit, Hits, Provider
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widget import Widget
from textual.widgets import TabbedContent, TabPane

from console.core.pairing import AuditAction, AuditEntry, BreakRefused, Identity, LockHeld, PairingView
from console.core.profile_store import ProfileStore
from console.core.profiles import Profile, ProfileError
from console.core.snapshot import HostSnapshot
from console.sources.hosts import HostConfig
from console.sources.hoststate import local_identity
from console.tui.feed import EventFeed
from console.tui.footer import KeyFooter
from console.tui.gcpace import GcPacer
from console.tui.pairing import (
    TIMELINE_ACTIONS,
    PairingBar,
    PairingLink,
    held_by_other,
    intent_phrase,
    lock_note,
    refusal,
)
from console.tui.panels import GpuPanel, HeaderBar, KvPanel, TimelinePanel, VerdictBanner
from console.tui.probe import ThroughputChart
from console.tui.profiles import HostView, ProfilesScreen
from console.tui.screens import ApplyChoice, ApplyConfirmScreen, ConfirmScreen, HelpScreen, help_keys
from console.tui.view import ApplyTrack, display_boot, rich_style

REPO_ROOT = Path(__file__).resolve().parents[2]
CONSOLE_HEARTBEAT_S = 5.0
CONSOLE_POLL_S = 4.0


def css_paths() -> list[Path]:
    """The stylesheets: `styles/` at the repository root (a checkout or an editable install), else the
    copy an installed package keeps under `<prefix>/share/k26-console/styles`."""
    for folder in (REPO_ROOT / "styles", Path(sys.prefix) / "share" / "k26-console" / "styles"):
        found = sorted(folder.glob("*.tcss"))
        if found:
            return found
    return []


@dataclass
class HostEntry:
    """One host the console shows. `prepare` (blocking, run in a thread) produces the config when it is
    not known up front (the demo starts its twin first); `after_start` runs once the session is up."""

    name: str
    config: HostConfig | None = None
    simulated: bool = False
    sandbox: bool = False
    """The console's config, profiles and histories are a temporary sandbox (the demo): the header says so."""
    prepare: Callable[[], HostConfig] | None = None
    after_start: Callable[[], object] | None = None
    session_options: dict[str, object] = field(default_factory=dict)
    controller_options: dict[str, object] = field(default_factory=dict)
    """Passed to `ServiceController` (tests keep its restart history in a temporary `state_dir`)."""
    pairing_options: dict[str, object] = field(default_factory=dict)
    """Passed to `HostStateDir` (`heartbeat_s`, `stale_factor`), except `poll_s`: how often the
    presence directory and the lock are read."""


class SnapshotReady(Message):
    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host


class HostDashboard(Vertical):
    """Everything about one host."""

    BINDINGS = [  # noqa: RUF012 - Textual reads it as a class attribute
        Binding("p", "profiles", "Profiles"),
        # Out of the footer: an 80-column pane must still show restart, roll back, quit and help. F1 and
        # the palette name it.
        Binding("P", "probe", "Probe", show=False),
        Binding("r", "restart", "Restart"),
        Binding("R", "rollback", "Roll back"),
    ]

    THROUGHPUT_MIN_ROWS = 40
    """The throughput chart needs rows the GPU bars, the gauge and the feed need more on a short pane."""

    def __init__(
        self,
        entry: HostEntry,
        *,
        read_only: bool,
        target: int | None,
        target_source: str | None,
        clock: Callable[[], float],
        me: Identity | None = None,
    ) -> None:
        super().__init__(id=f"dash-{_dom_id(entry.name)}", classes="dashboard")
        self.entry = entry
        self.read_only = read_only
        self.header = HeaderBar(
            entry.name, simulated=entry.simulated, sandbox=entry.sandbox, read_only=read_only, clock=clock
        )
        self.gpus = GpuPanel(id="gpus", classes="panel")
        self.kv = KvPanel(target=target, target_source=target_source, id="kv", classes="panel")
        self.timeline = TimelinePanel(id="timeline", classes="panel")
        self.throughput = ThroughputChart(window_s=300.0, clock=clock, id="throughput")
        self.throughput.add_class("panel")
        self.pairing = PairingBar(me or local_identity(), id="pairing")
        self.feed = EventFeed(id="feed")
        self.verdict = VerdictBanner(id="verdict")
        self.snap: HostSnapshot | None = None
        self.bindings_lock_state: tuple[bool, bool] | None = None
        self.track: ApplyTrack | None = None

    def compose(self) -> ComposeResult:
        yield self.header
        yield self.pairing
        yield self.verdict
        # The chart sits under the GPU bars: in the side column it pushed the feed down while the
        # eight bars left a column of blank rows beside it (a 160x48 pane showed 14 feed lines).
        with Horizontal(id="top"):
            with Vertical(id="main"):
                yield self.gpus
                yield self.throughput
            with Vertical(id="side"):
                yield self.kv
                yield self.timeline
        yield self.feed

    def on_mount(self) -> None:
        self.verdict.display = False
        # Shown once the host's state directory has been read (a console without a session has none).
        self.pairing.display = False
        self.gpus.border_title = "GPUs"
        self.kv.border_title = "KV capacity"
        self.throughput.border_title = "generation tok/s"
        self.timeline.border_title = "restart"
        self.feed.border_title = "events"

    def on_resize(self) -> None:
        self.throughput.display = self.size.height >= self.THROUGHPUT_MIN_ROWS

    def show(self, snap: HostSnapshot) -> None:
        self.snap = snap
        self.header.show(snap)
        self.gpus.show(snap)
        self.kv.show(snap)
        self.timeline.show(snap)
        self.throughput.show(snap)
        self.feed.show(snap)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action not in MUTATING_ACTIONS:
            return True
        # Read-only: the binding is hidden from the footer and the action cannot run.
        if self.read_only:
            return False
        # Another console holds the lock: shown disabled; the key falls through to the app, which
        # says who holds it and for what.
        return None if held_by_other(self.pairing.view, self.pairing.me) else True

    def action_probe(self) -> None:
        app = self.app
        if isinstance(app, ConsoleApp):
            app.open_probe(self.entry.name)

    def action_restart(self) -> None:
        app = self.app
        if isinstance(app, ConsoleApp):
            app.request_restart(self.entry.name)

    def action_rollback(self) -> None:
        app = self.app
        if isinstance(app, ConsoleApp):
            app.request_rollback(self.entry.name)

    def action_profiles(self) -> None:
        app = self.app
        if isinstance(app, ConsoleApp):
            app.open_profiles(self.entry.name)

    # ---- the controller's restarts -------------------------------------------------------------

    def begin_track(self, action: str) -> ApplyTrack:
        self.track = ApplyTrack(action)
        boot = display_boot(self.snap.state) if self.snap is not None else None
        self.timeline.set_track(self.track, boot.index if boot is not None else None)
        self.verdict.clear()
        return self.track

    def progress(
        self, phase: str, message: str | None, elapsed: float, durations: dict[str, float], eta: float | None
    ) -> None:
        if self.track is not None:
            self.track.progress(phase, message, elapsed, durations, eta)
            self.timeline.refresh(layout=True)

    def finish_track(self, ok: bool, summary: str, reasons: tuple[str, ...], *, can_roll_back: bool) -> None:
        if self.track is None:
            self.begin_track("restart")
        assert self.track is not None
        self.track.finish(ok, summary, reasons, can_roll_back=can_roll_back)
        self.timeline.refresh(layout=True)
        self.verdict.show_verdict(
            ok, f"{self.track.action}: {summary}", can_roll_back=self.track.can_roll_back
        )


def _dom_id(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


MUTATING_ACTIONS = frozenset({"restart", "rollback", "apply"})


class ConsoleCommands(Provider):
    """The command palette: switch host, profiles, apply, restart, roll back, probe, filter, help."""

    def _commands(self) -> Iterable[tuple[str, Callable[[], object], str]]:
        app = self.app
        assert isinstance(app, ConsoleApp)
        for entry in app.entries:
            if len(app.entries) > 1:
                yield (
                    f"Switch to host {entry.name}",
                    partial(app.switch_host, entry.name),
                    "show its dashboard",
                )
        dash = app.active_dashboard
        if dash is None:
            return
        host = dash.entry.name
        yield ("Profiles: edit, what-if, apply", partial(app.open_profiles, host), "p")
        if not app.read_only:
            # While another console holds the lock the entries stay listed, marked refused: choosing
            # one says who holds it and for what.
            view = dash.pairing.view
            locked = (
                f"refused now: {view.lock.holder.who} is {intent_phrase(view.lock.intent)}"
                if view is not None and view.lock is not None and held_by_other(view, app.me)
                else None
            )
            if locked and view is not None and view.lock_stale:
                yield (
                    f"Break the stale lock on {host}",
                    partial(app.request_break, host),
                    f"{view.lock.holder.who}'s console has gone quiet; asks first, then recorded"
                    if view.lock is not None
                    else "asks first",
                )
            for entry in app.store.entries():
                yield (
                    f"Apply profile {entry.name} to {host}",
                    partial(app.request_apply, host, entry.name),
                    locked or "shows the diff and the prediction first",
                )
            yield (
                f"Restart the service on {host}",
                partial(app.request_restart, host),
                locked or "r; after a confirmation; followed on the timeline",
            )
            yield (
                f"Roll back the last apply on {host}",
                partial(app.request_rollback, host),
                locked or "R; restores the previous drop-in, restarts, verifies",
            )
        yield (
            f"Probe {host}: long-context decode speed",
            partial(app.open_probe, host),
            "P; a synthetic request at chosen depths",
        )
        yield ("Filter the event feed", dash.feed.action_filter, "regex; ! inverts")
        yield ("Clear the event filter", partial(dash.feed.set_filter, ""), "show every line")
        yield ("Acknowledge errors", dash.feed.action_ack, "unpin this boot's errors")
        yield ("Toggle follow tail", dash.feed.action_follow, "keep the newest line in view")
        yield ("Fold / unfold earlier boots", dash.feed.action_fold, "show earlier boots' lines")
        yield ("Help for the focused panel", app.action_help, "F1")

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, callback, help_text in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)

    async def discover(self) -> Hits:
        for name, callback, help_text in self._commands():
            yield Hit(1.0, name, callback, help=help_text)


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
    ) -> None:
        """`connect=False` opens the dashboards without sessions: the tests feed snapshots themselves.
        `store` holds the flag profiles (default: the user's, then the shipped examples); `profile` is
        the one the profiles screen opens on. `identity` is who this console says it is on the hosts
        (default: the local login, this machine, this process)."""
        super().__init__()
        self.me = identity or local_identity()
        self.links: dict[str, PairingLink] = {}
        """Each connected host's presence, lock and audit trail."""
        self.last_audit: dict[str, AuditEntry] = {}
        """The newest apply / restart / rollback on each host's trail: its line goes under the timeline."""
        self.entries = entries
        self.read_only = read_only
        self.target = target
        self.target_source = target_source
        self.clock = clock
        self.connect = connect
        self.store = store if store is not None else ProfileStore()
        self.profile = profile
        self.sessions: dict[str, object] = {}
        self.controllers: dict[str, ServiceControllerLike] = {}
        self.running_argv: dict[str, list[str]] = {}
        """Each host's running ExecStart argv, for the editor's diff; dropped after every restart."""
        self.busy: dict[str, str] = {}
        """Hosts with an apply, rollback or restart in flight (one at a time per host)."""
        self.pool_before: dict[str, int | None] = {}
        self.applied: dict[str, str] = {}
        """The profile last applied and verified on each host (the probe keeps its results there)."""
        self._help_screens: dict[tuple[str, str], str] = {}
        self._pending: dict[str, HostSnapshot] = {}
        self._leaving = False
        self._posted: set[str] = set()
        self.dashboards: dict[str, HostDashboard] = {}
        self._closing = False
        self._pacer = GcPacer()

    def compose(self) -> ComposeResult:
        for entry in self.entries:
            self.dashboards[entry.name] = HostDashboard(
                entry,
                read_only=self.read_only,
                target=self.target,
                target_source=self.target_source,
                clock=self.clock,
                me=self.me,
            )
        if len(self.entries) == 1:
            yield self.dashboards[self.entries[0].name]
        else:
            with TabbedContent(id="hosts"):
                for entry in self.entries:
                    with TabPane(entry.name, id=f"tab-{_dom_id(entry.name)}"):
                        yield self.dashboards[entry.name]
        # Compact: an 80-column pane still shows restart, roll back, quit and help.
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        dash = self.active_dashboard
        if dash is not None:
            dash.feed.log_widget.focus()
        # Full collections of everything were 40-140 ms pauses, several a minute under load: see gcpace.
        self.call_after_refresh(self._pacer.install, self.set_interval)
        if self.connect:
            for entry in self.entries:
                self.run_worker(self._pump(entry), name=f"session-{entry.name}", group="sessions")
            # The lock's age counts up, and what this console looks at changes with its screens.
            self.set_interval(1.0, self._tick_pairing)

    # ---- hosts ---------------------------------------------------------------------------------------

    @property
    def active_dashboard(self) -> HostDashboard | None:
        if not self.dashboards:
            return None
        if len(self.entries) == 1:
            return self.dashboards[self.entries[0].name]
        with contextlib.suppress(Exception):
            tabs = self.query_one(TabbedContent)
            active = tabs.active
            for entry in self.entries:
                if f"tab-{_dom_id(entry.name)}" == active:
                    return self.dashboards[entry.name]
        return self.dashboards[self.entries[0].name]

    def switch_host(self, name: str) -> None:
        if len(self.entries) > 1:
            self.query_one(TabbedContent).active = f"tab-{_dom_id(name)}"
        dash = self.dashboards.get(name)
        if dash is not None:
            self.call_after_refresh(dash.feed.log_widget.focus)

    def post_snapshot(self, snap: HostSnapshot) -> None:
        """Hand a snapshot to the dashboard of its host. Only the newest waits; one message is in flight."""
        self._pending[snap.host] = snap
        if snap.host not in self._posted:
            self._posted.add(snap.host)
            self.post_message(SnapshotReady(snap.host))

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        self._posted.discard(message.host)
        snap = self._pending.pop(message.host, None)
        dash = self.dashboards.get(message.host)
        # A snapshot that arrives while the app shuts down finds its widgets already gone.
        if snap is not None and dash is not None and self.is_running and not self._exit:
            dash.show(snap)

    async def _pump(self, entry: HostEntry) -> None:
        from console.sources.session import HostSession

        dash = self.dashboards[entry.name]
        config = entry.config
        if config is None and entry.prepare is not None:
            dash.header.note = "starting the simulated host…" if entry.simulated else "preparing…"
            dash.header.refresh()
            try:
                config = await asyncio.to_thread(entry.prepare)
            except Exception as exc:
                dash.header.note = f"could not start: {exc}"
                dash.header.refresh()
                self.notify(f"{entry.name}: {exc}", severity="error", timeout=30)
                return
        if config is None:
            return
        session = HostSession(config, **entry.session_options)  # type: ignore[arg-type]
        self.sessions[entry.name] = session
        pairing: asyncio.Task[None] | None = None
        try:
            await session.start()
            if entry.after_start is not None:
                self.run_worker(asyncio.to_thread(entry.after_start), group="after-start")
            pairing = asyncio.get_running_loop().create_task(self._pair(entry.name, session))
            async for snap in session.snapshots():
                self.post_snapshot(snap)
        finally:
            if pairing is not None:
                pairing.cancel()
            link = self.links.get(entry.name)
            if link is not None:
                await link.leave()
            await session.close()

    # ---- pairing: presence, the lock, the audit trail ------------------------------------------

    async def _pair(self, host: str, session: Any) -> None:
        from console.sources.hoststate import HostStateDir

        if self._leaving:
            return  # a session that came up as the console left: no heartbeat to leave behind
        options = dict(self.dashboards[host].entry.pairing_options)
        # A console is open for days: beat and look every few seconds, not every two (each is an SSH
        # exec on the host; idle CPU was measured at 3.1% of a core with 2 s). Readers judge staleness
        # by each writer's own interval, so a 2 s `apply` and a 5 s console mix fine.
        options.setdefault("heartbeat_s", CONSOLE_HEARTBEAT_S)
        poll_s = float(options.pop("poll_s", CONSOLE_POLL_S))  # type: ignore[arg-type]
        state = HostStateDir(session.transport, session.host, self.me, **options)  # type: ignore[arg-type]
        state.looking_at = self._looking_at(host)
        link = PairingLink(
            state,
            on_view=partial(self._on_pairing_view, host),
            on_audit=partial(self._on_audit, host),
            on_error=partial(self._on_pairing_error, host),
            poll_s=poll_s,
        )
        self.links[host] = link
        await link.run()

    def _on_pairing_view(self, host: str, view: PairingView) -> None:
        dash = self.dashboards.get(host)
        if dash is None or not self.is_running:
            return
        dash.pairing.link_error = None
        dash.pairing.display = True
        dash.pairing.set_view(view, self._host_now(host))
        # The footer recomposes on every bindings refresh: only when what it greys out can change.
        locked = (held_by_other(view, self.me), view.lock_stale)
        if locked != dash.bindings_lock_state:
            dash.bindings_lock_state = locked
            dash.refresh_bindings()
        self._show_note(host)

    def _on_pairing_error(self, host: str, sentence: str) -> None:
        dash = self.dashboards.get(host)
        if dash is None or not self.is_running:
            return
        dash.pairing.link_error = sentence
        dash.pairing.display = True
        dash.pairing.refresh()

    def _on_audit(self, host: str, entries: list[AuditEntry]) -> None:
        dash = self.dashboards.get(host)
        if dash is None or not entries or not self.is_running:
            return
        dash.feed.add_external([e.to_event() for e in entries])
        for entry in entries:
            if entry.action in TIMELINE_ACTIONS:
                self.last_audit[host] = entry
        self._show_note(host)

    def _host_now(self, host: str) -> Any:
        link = self.links.get(host)
        return link.state.now() if link is not None else None

    def _show_note(self, host: str) -> None:
        """Under the timeline: who is changing the host now, else how its last change ended."""
        dash = self.dashboards.get(host)
        link = self.links.get(host)
        if dash is None or link is None:
            return
        view = link.view
        note = lock_note(view, self.me, link.state.now())
        if note is not None:
            style = "bold red" if view is not None and view.lock_stale else "bold yellow3"
            dash.timeline.set_note(Text(note, rich_style(style)))
            return
        last = self.last_audit.get(host)
        dash.timeline.set_note(last.line() if last is not None else None)

    def _looking_at(self, host: str) -> str:
        from console.tui.probe import ProbeScreen

        screen = self.screen if self.is_running else None
        if isinstance(screen, ProfilesScreen) and screen.host == host:
            what = f"profiles {screen.current}" if screen.current else "profiles"
        elif isinstance(screen, ProbeScreen) and getattr(screen.host, "name", screen.host) == host:
            what = "probe"
        elif host in self.busy:
            what = self.busy[host]
        else:
            what = "dashboard"
        if self.read_only:
            return "read-only" if what == "dashboard" else f"read-only, {what}"
        return what

    def _tick_pairing(self) -> None:
        for host, link in self.links.items():
            link.state.looking_at = self._looking_at(host)
            view = link.view
            dash = self.dashboards.get(host)
            # Every second while a lock's age or an armed rollback's countdown is on the bar.
            if view is not None and (view.lock or view.pending_rollback) and dash is not None:
                dash.pairing.set_view(view, link.state.now())
                self._show_note(host)

    def _refuse_locked(self, host: str, what: str) -> bool:
        """Refuse at once, naming the holder and its intent, while another console holds the lock."""
        link = self.links.get(host)
        sentence = refusal(link.view if link is not None else None, self.me, what)
        if sentence is not None:
            self.notify(f"{host}: {sentence}", title="locked", severity="warning", timeout=15)
        return sentence is not None

    async def _look_again(self, host: str, what: str) -> bool:
        """A fresh look at the lock before asking the operator anything; True when `what` may go on."""
        link = self.links.get(host)
        if link is not None:
            await link.refresh()
        return not self._refuse_locked(host, what)

    async def _under_lock(
        self, host: str, intent: str, action: AuditAction, start: Callable[[], Awaitable[Any]]
    ) -> Any | None:
        """Take the host's lock for `intent`, run the controller's operation inside it with its track on
        the timeline, and append the audit entry before letting go. None when refused or failed (the
        operator has been told)."""
        from console.sources.hoststate import HostStateError
        from console.sources.transport import TransportError

        link = self.links.get(host)
        dash = self.dashboards.get(host)
        if link is None or dash is None:
            self.notify(
                f"{host}: the host's state directory has not been read yet, so the lock cannot be taken; "
                "try again in a moment.",
                severity="warning",
            )
            return None
        outcome: Any | None = None
        try:
            async with link.state.locked(intent) as lock:
                link.poke()
                # The intent goes into the trail before the operation starts, so a console that dies
                # mid-restart leaves an entry readers show as unfinished; no trail, no change.
                started = AuditEntry.intent(
                    self.me,
                    ts=link.state.now(),
                    host=host,
                    action=action,
                    op_id=uuid.uuid4().hex,
                    profile=intent.removeprefix("apply ") if action == "apply" else None,
                    lock_id=lock.info.lock_id,
                    summary=intent,
                )
                try:
                    await link.state.append_audit(started)
                except (HostStateError, TransportError) as exc:
                    self._fail(host, f"{intent} was not started: the audit trail cannot be written ({exc})")
                    return None
                dash.begin_track(intent)
                try:
                    outcome = await start()
                except asyncio.CancelledError:
                    # The console is closing mid-operation: say so in the trail before the lock goes.
                    with contextlib.suppress(HostStateError, TransportError, TimeoutError):
                        async with asyncio.timeout(10):
                            await asyncio.shield(
                                link.state.append_audit(
                                    started.interrupted(ts=link.state.now(), phase=None, signal=None)
                                )
                            )
                    raise
                except Exception as exc:
                    failed = started.model_copy(
                        update={
                            "ts": link.state.now(),
                            "outcome": "failed",
                            "phase": None,
                            "summary": str(exc),
                        }
                    )
                    with contextlib.suppress(HostStateError, TransportError):
                        await link.state.append_audit(failed)
                    self._fail(host, str(exc))
                    return None
                entry = AuditEntry.from_outcome(
                    outcome, me=self.me, host=host, ts=link.state.now(), action=action, started=started
                )
                try:
                    await link.state.append_audit(entry)
                except (HostStateError, TransportError) as exc:
                    self.notify(
                        f"{host}: {intent} happened but its outcome is NOT in the audit trail: {exc}",
                        severity="error",
                        timeout=30,
                    )
                if lock.lost:
                    self.notify(
                        f"{host}: another console broke this console's lock while {intent} ran (it judged "
                        "this console gone); see the audit trail.",
                        severity="error",
                        timeout=30,
                    )
        except LockHeld as held:
            hint = " Break it from the palette (ctrl+p) after confirming." if held.stale else ""
            self.notify(
                f"{host}: {str(held).rstrip('.')}.{hint}", title="locked", severity="warning", timeout=15
            )
            return None
        except (HostStateError, TransportError) as exc:
            self.notify(f"{host}: {exc}", severity="error", timeout=15)
            return outcome
        finally:
            link.poke()
        return outcome

    def request_break(self, host: str) -> None:
        """Break a stale lock, only after a confirmation that shows whose it is and for what."""
        link = self.links.get(host)
        view = link.view if link is not None else None
        if self._refuse_read_only("breaking the lock") or view is None or view.lock is None:
            if view is not None and view.lock is None:
                self.notify(f"{host} is not locked; there is nothing to break.")
            return
        lock = view.lock
        self.push_screen(
            ConfirmScreen(
                f"Break the stale lock on {host}?",
                f"{view.lock_line()}.\n\nHolder: {lock.holder.who} (pid {lock.holder.pid}); intent: "
                f"{lock.intent}.\nBreak it only if that console is really gone: what it started may still be "
                "running on the host. The break is recorded in the host's audit trail.",
            ),
            partial(self._confirmed_break, host),
        )

    def _confirmed_break(self, host: str, yes: bool | None) -> None:
        if yes:
            self._break(host)

    @work(group="pairing")
    async def _break(self, host: str) -> None:
        from console.sources.hoststate import HostStateError
        from console.sources.transport import TransportError

        link = self.links.get(host)
        if link is None:
            return
        try:
            info = await link.state.break_lock(True, reason="from the console, after confirming")
        except (BreakRefused, HostStateError, TransportError) as exc:
            self.notify(f"{host}: {exc}", severity="warning", timeout=15)
        else:
            self.notify(
                f"{host}: broke {info.holder.who}'s lock ({info.intent}); recorded in the audit trail."
            )
        link.poke()

    def on_unmount(self) -> None:
        self._pacer.release()

    async def action_quit(self) -> None:
        # Leave before the sessions close: the other consoles see this one go at once, not after its
        # heartbeat goes stale.
        await self.leave_hosts()
        self.exit()

    async def leave_hosts(self, timeout_s: float = 3.0) -> None:
        """Take this console's presence, and a lock it holds, off every host (best effort, bounded); also
        what `console.tui.lifeline` does on SIGHUP, SIGTERM or a lost terminal before it exits."""
        self._leaving = True
        await asyncio.gather(*(link.leave(timeout_s) for link in self.links.values()))

    def action_refused(self, what: str) -> None:
        dash = self.active_dashboard
        if dash is None or not self._refuse_locked(dash.entry.name, what):
            raise SkipAction()

    # ---- actions -----------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "refused":
            # Only while another console holds the lock (read-only keys stay silent and hidden).
            dash = self.active_dashboard
            return (
                not self.read_only
                and dash is not None
                and len(self.screen_stack) == 1
                and held_by_other(dash.pairing.view, self.me)
            )
        return not (action in MUTATING_ACTIONS and self.read_only)

    def _refuse_read_only(self, what: str) -> bool:
        if self.read_only:
            self.notify(f"read-only: {what} is refused.", severity="warning")
        return self.read_only

    def _controller(self, host: str, *, quiet: bool = False) -> ServiceControllerLike | None:
        """The host's service controller (one per host, on the session's transport), or None with a
        sentence for the operator when it cannot be had."""
        from console.sources.session import HostSession

        session = self.sessions.get(host)
        if not isinstance(session, HostSession):
            if not quiet:
                self.notify(f"{host}: not connected.", severity="error")
            return None
        ctl = self.controllers.get(host)
        if ctl is None:
            try:
                from console.sources.service import ServiceController
            except ImportError:
                if not quiet:
                    self.notify("this installation has no service controller.", severity="error")
                return None
            options = self.dashboards[host].entry.controller_options
            ctl = ServiceController(session.host, session.transport, **options)  # type: ignore[arg-type]
            self.controllers[host] = ctl
        return ctl

    def _busy(self, host: str) -> bool:
        if host in self.busy:
            self.notify(f"{host}: {self.busy[host]} is still running.", severity="warning")
            return True
        return False

    def _progress(self, host: str, progress: Any) -> None:
        dash = self.dashboards.get(host)
        if dash is not None:
            dash.progress(
                str(progress.phase),
                progress.message,
                float(progress.elapsed_s),
                {str(k): float(v) for k, v in progress.durations.items()},
                progress.eta_s,
            )

    def _finish(self, host: str, outcome: Any, *, undoable: bool) -> None:
        dash = self.dashboards.get(host)
        reasons = tuple(str(r) for r in outcome.reasons)
        rolled = bool(getattr(outcome, "rolled_back", False))
        if dash is not None:
            dash.finish_track(
                bool(outcome.ok), str(outcome.summary), reasons, can_roll_back=undoable and not rolled
            )
        self.running_argv.pop(host, None)  # the unit's ExecStart may have changed
        if outcome.ok:
            self.notify(f"{host}: {outcome.summary}", title="verified", timeout=10)
        else:
            hint = "  R rolls back." if undoable and not rolled else ""
            self.notify(f"{host}: {outcome.summary}{hint}", title="failed", severity="error", timeout=30)

    def _fail(self, host: str, sentence: str) -> None:
        dash = self.dashboards.get(host)
        if dash is not None:
            dash.finish_track(False, sentence, (), can_roll_back=False)
        self.notify(f"{host}: {sentence}", severity="error", timeout=20)

    # ---- profiles and apply ------------------------------------------------------------------------

    def open_profiles(self, host: str | None = None, select: str | None = None) -> None:
        dash = self.dashboards.get(host) if host else self.active_dashboard
        if dash is None:
            return
        host = dash.entry.name
        if isinstance(self.screen, ProfilesScreen):
            return
        screen = ProfilesScreen(
            host=host,
            store=self.store,
            host_view=partial(self.host_view, host),
            read_only=self.read_only,
            select=select or self.profile,
            apply=partial(self.request_apply, host),
        )
        self.push_screen(screen)
        if host not in self.running_argv:
            self._fetch_running_argv(host, screen)

    def host_view(self, host: str) -> HostView:
        """The host as the profile editor's what-if and diff need it, from the newest snapshot."""
        dash = self.dashboards[host]
        snap = dash.snap
        config = dash.entry.config
        return HostView(
            boots=snap.state.boots if snap is not None else (),
            model=getattr(config, "model", None) if config is not None else None,
            running_argv=self.running_argv.get(host),
        )

    @work(group="running-argv")
    async def _fetch_running_argv(self, host: str, screen: ProfilesScreen) -> None:
        ctl = self._controller(host, quiet=True)
        if ctl is None:
            return
        try:
            argv = await ctl.running_argv()
        except Exception as exc:
            self.notify(f"{host}: cannot read the running ExecStart: {exc}", severity="warning", timeout=8)
            return
        self.running_argv[host] = list(argv)
        if screen.is_attached:
            screen.run_check()

    def request_apply(self, host: str, name: str) -> None:
        """Confirm, then apply the saved profile `name` on `host` (the palette and the profiles screen)."""
        if self._refuse_read_only("applying a profile") or self._busy(host):
            return
        if self._refuse_locked(host, f"applying {name}"):
            return
        try:
            profile = self.store.load(name)
        except ProfileError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return
        self._preview_apply(host, profile)

    @work(group="preview")
    async def _preview_apply(self, host: str, profile: Profile) -> None:
        ctl = self._controller(host)
        if ctl is None or not await self._look_again(host, f"applying {profile.name}"):
            return
        self.notify(f"{host}: checking {profile.name} against the host…", timeout=3)
        try:
            preview = await ctl.preview(profile)
        except Exception as exc:
            self.notify(f"{host}: {exc}", severity="error", timeout=15)
            return
        screen = ApplyConfirmScreen(
            f"Apply {profile.name} to {host}?",
            ok=bool(preview.ok),
            diff=list(preview.diff),
            prediction=prediction_text(preview, profile.target_context),
            errors=list(preview.errors),
            warnings=list(preview.warnings),
        )
        self.push_screen(screen, partial(self._confirmed_apply, host, profile, preview))

    def _confirmed_apply(self, host: str, profile: Profile, preview: Any, choice: ApplyChoice | None) -> None:
        if choice is None:
            return
        # The restart plays on the dashboard's timeline.
        while isinstance(self.screen, ProfilesScreen):
            self.screen.action_close()
        self.switch_host(host)
        self._run_apply(host, profile, preview, choice is ApplyChoice.FORCE)

    @work(group="apply")
    async def _run_apply(self, host: str, profile: Profile, preview: Any, force: bool) -> None:
        ctl = self._controller(host)
        dash = self.dashboards.get(host)
        if ctl is None or dash is None or self._busy(host):
            return
        self.busy[host] = f"applying {profile.name}"
        boot = display_boot(dash.snap.state) if dash.snap is not None else None
        pool = boot.pool.tokens if boot is not None else None
        try:
            # The preview the operator confirmed is the one applied (no second look that could differ).
            outcome = await self._under_lock(
                host,
                f"apply {profile.name}",
                "apply",
                partial(
                    ctl.apply,
                    profile,
                    force=force,
                    progress=partial(self._progress, host),
                    store=self.store,
                    preview=preview,
                ),
            )
        finally:
            self.busy.pop(host, None)
        if outcome is None:
            return
        # What a rollback must bring back: the pool of the boot this apply replaced.
        self.pool_before[host] = pool
        if outcome.ok:
            self.applied[host] = profile.name
        self._finish(host, outcome, undoable="write_dropin" in outcome.durations)

    # ---- rollback and restart ----------------------------------------------------------------------

    def request_rollback(self, host: str) -> None:
        if self._refuse_read_only("rolling back") or self._busy(host) or host not in self.dashboards:
            return
        if self._refuse_locked(host, "a rollback"):
            return
        self._confirm_unlocked(
            host,
            "a rollback",
            ConfirmScreen(
                f"Roll back the service on {host}?",
                "Restores the drop-in that was in place before the last apply (or removes the console's), "
                "reloads systemd, restarts the server and verifies it. A restart takes minutes on a real host.",
            ),
            partial(self._confirmed_rollback, host),
        )

    @work(group="preview")
    async def _confirm_unlocked(
        self, host: str, what: str, screen: ConfirmScreen, then: Callable[[bool | None], None]
    ) -> None:
        """Ask only once a fresh look says no other console holds the lock (the lock is still taken,
        atomically, when the operation starts)."""
        if await self._look_again(host, what):
            self.push_screen(screen, then)

    def _confirmed_rollback(self, host: str, yes: bool | None) -> None:
        if yes:
            self._run_rollback(host)

    @work(group="apply")
    async def _run_rollback(self, host: str) -> None:
        ctl = self._controller(host)
        dash = self.dashboards.get(host)
        if ctl is None or dash is None or self._busy(host):
            return
        self.busy[host] = "rolling back"
        try:
            outcome = await self._under_lock(
                host,
                "rollback",
                "rollback",
                partial(
                    ctl.rollback,
                    progress=partial(self._progress, host),
                    expect_pool=self.pool_before.get(host),
                ),
            )
        finally:
            self.busy.pop(host, None)
        if outcome is not None:
            self._finish(host, outcome, undoable=False)

    def request_restart(self, host: str) -> None:
        if self._refuse_read_only("restarting the service") or self._busy(host):
            return
        dash = self.dashboards.get(host)
        if dash is None or self._refuse_locked(host, "a restart"):
            return
        unit = dash.entry.config.unit_name if dash.entry.config else "the service"
        self._confirm_unlocked(
            host,
            "a restart",
            ConfirmScreen(
                f"Restart {unit} on {host}?",
                "The server stops and reloads its model with the flags in force, then is verified as after "
                "an apply; a restart takes minutes on a real host.",
            ),
            partial(self._confirmed_restart, host),
        )

    def _confirmed_restart(self, host: str, yes: bool | None) -> None:
        if yes:
            self._restart(host)

    @work(group="apply")
    async def _restart(self, host: str) -> None:
        """The controller's restart: the flags in force, followed phase by phase and verified, inside
        the host's lock and recorded in its audit trail."""
        ctl = self._controller(host)
        if ctl is None or self._busy(host):
            return
        self.busy[host] = "restarting"
        try:
            outcome = await self._under_lock(
                host, "restart", "restart", partial(ctl.restart, progress=partial(self._progress, host))
            )
        finally:
            self.busy.pop(host, None)
        if outcome is not None:
            self._finish(host, outcome, undoable=False)

    # ---- probe and help ----------------------------------------------------------------------------

    def open_probe(self, host: str) -> None:
        """The probe screen (console/tui/probe.py) on the host's session; results are kept with the
        profile last verified here, else the one the console was opened with."""
        from console.tui.probe import ProbeScreen

        session = self.sessions.get(host)
        if session is None:
            self.notify(f"{host}: the probe needs a connected host.", severity="warning")
            return
        self.push_screen(
            ProbeScreen(
                session,
                profile=self.applied.get(host) or self.profile,
                store=self.store,
                profile_check=partial(self.profile_in_force, host),
            )
        )

    async def profile_in_force(self, host: str, name: str) -> str | None:
        """None when the unit on `host` runs profile `name` as `apply` writes it; otherwise why not, in
        words. A probe's tok/s go into a profile's `[verified]` only when that profile is what ran:
        the console's --profile is a goal, not a statement about the server."""
        ctl = self._controller(host, quiet=True)
        if ctl is None:
            return f"{host} is not connected, so its running flags are not known"
        try:
            profile = await asyncio.to_thread(self.store.load, name)
        except ProfileError as exc:
            return str(exc).rstrip(".")
        return await ctl.why_not_running(profile)

    def action_help(self) -> None:
        node: Widget | None = self.focused
        text = ""
        while node is not None:
            text = getattr(node, "HELP", "") or ""
            if text:
                break
            parent = node.parent
            node = parent if isinstance(parent, Widget) else None
        keys = help_keys(self.read_only, profiles=isinstance(self.screen, ProfilesScreen))
        # Each help text is built once and kept installed: composing and styling a new screen on
        # every F1 was most of the key's cost under load.
        name = self._help_screens.get((text, keys))
        if name is None:
            name = f"help-{len(self._help_screens)}"
            self.install_screen(HelpScreen(text, read_only=self.read_only, keys=keys), name)
            self._help_screens[(text, keys)] = name
        self.push_screen(name)


class ServiceControllerLike(Protocol):
    """What the console uses of `console.sources.service.ServiceController`."""

    async def running_argv(self) -> list[str]: ...
    async def why_not_running(self, profile: Profile) -> str | None: ...
    async def preview(self, profile: Profile) -> Any: ...
    async def apply(self, profile: Profile, **kw: Any) -> Any: ...
    async def rollback(self, **kw: Any) -> Any: ...
    async def restart(self, **kw: Any) -> Any: ...


def prediction_text(preview: Any, target: int) -> Text:
    """The planner's verdict as the confirmation shows it."""
    out = Text()
    out.append("predicted: ", "bold")
    pool = preview.predicted_pool_tokens
    if pool is None:
        out.append("no prediction (the host's journal has not shown a pool to calibrate on)", "grey62")
        return out
    out.append(f"pool {pool:,} tokens", "green3" if pool >= target else "bold red")
    out.append(f" {'≥' if pool >= target else '<'} target {target:,}")
    if preview.headroom_gib is not None:
        out.append(f", headroom {preview.headroom_gib:.2f} GiB")
    if preview.fits is True:
        out.append("  ✔ fits", "bold green3")
    elif preview.fits is False:
        out.append("  ✘ does not fit", "bold red")
    return out
