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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.command import Hit, Hits, Provider
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Footer, TabbedContent, TabPane

from console.core.snapshot import HostSnapshot
from console.sources.hosts import HostConfig
from console.tui.feed import EventFeed, FeedLog
from console.tui.panels import GpuPanel, HeaderBar, KvPanel, Panel, TimelinePanel
from console.tui.screens import ConfirmScreen, HelpScreen

REPO_ROOT = Path(__file__).resolve().parents[2]


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
    prepare: Callable[[], HostConfig] | None = None
    after_start: Callable[[], object] | None = None
    session_options: dict[str, object] = field(default_factory=dict)


class SnapshotReady(Message):
    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host


class HostDashboard(Vertical):
    """Everything about one host."""

    BINDINGS = [  # noqa: RUF012 - Textual reads it as a class attribute
        Binding("r", "restart", "Restart"),
    ]

    def __init__(
        self,
        entry: HostEntry,
        *,
        read_only: bool,
        target: int | None,
        target_source: str | None,
        clock: Callable[[], float],
    ) -> None:
        super().__init__(id=f"dash-{_dom_id(entry.name)}", classes="dashboard")
        self.entry = entry
        self.read_only = read_only
        self.header = HeaderBar(entry.name, simulated=entry.simulated, read_only=read_only, clock=clock)
        self.gpus = GpuPanel(id="gpus", classes="panel")
        self.kv = KvPanel(target=target, target_source=target_source, id="kv", classes="panel")
        self.timeline = TimelinePanel(id="timeline", classes="panel")
        self.feed = EventFeed(id="feed")
        self.snap: HostSnapshot | None = None

    def compose(self) -> ComposeResult:
        yield self.header
        with Horizontal(id="top"):
            yield self.gpus
            with Vertical(id="side"):
                yield self.kv
                yield self.timeline
        yield self.feed

    def on_mount(self) -> None:
        self.gpus.border_title = "GPUs"
        self.kv.border_title = "KV capacity"
        self.timeline.border_title = "restart"
        self.feed.border_title = "events"

    def show(self, snap: HostSnapshot) -> None:
        self.snap = snap
        self.header.show(snap)
        self.gpus.show(snap)
        self.kv.show(snap)
        self.timeline.show(snap)
        self.feed.show(snap)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Read-only: the binding is hidden from the footer and the action cannot run.
        return not (action == "restart" and self.read_only)

    def action_restart(self) -> None:
        app = self.app
        if isinstance(app, ConsoleApp):
            app.request_restart(self.entry.name)


def _dom_id(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


MUTATING_ACTIONS = frozenset({"restart"})


class ConsoleCommands(Provider):
    """The command palette: switch host, restart, filter, acknowledge, fold, help."""

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
        if not app.read_only:
            yield (
                f"Restart the service on {host}",
                partial(app.request_restart, host),
                "systemctl restart, after a confirmation",
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
        Binding("ctrl+p", "command_palette", "Commands"),
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
    ) -> None:
        """`connect=False` opens the dashboards without sessions: the tests feed snapshots themselves."""
        super().__init__()
        self.entries = entries
        self.read_only = read_only
        self.target = target
        self.target_source = target_source
        self.clock = clock
        self.connect = connect
        self.sessions: dict[str, object] = {}
        self._pending: dict[str, HostSnapshot] = {}
        self._posted: set[str] = set()
        self.dashboards: dict[str, HostDashboard] = {}
        self._closing = False

    def compose(self) -> ComposeResult:
        for entry in self.entries:
            self.dashboards[entry.name] = HostDashboard(
                entry,
                read_only=self.read_only,
                target=self.target,
                target_source=self.target_source,
                clock=self.clock,
            )
        if len(self.entries) == 1:
            yield self.dashboards[self.entries[0].name]
        else:
            with TabbedContent(id="hosts"):
                for entry in self.entries:
                    with TabPane(entry.name, id=f"tab-{_dom_id(entry.name)}"):
                        yield self.dashboards[entry.name]
        yield Footer()

    def on_mount(self) -> None:
        dash = self.active_dashboard
        if dash is not None:
            dash.feed.log_widget.focus()
        if self.connect:
            for entry in self.entries:
                self.run_worker(self._pump(entry), name=f"session-{entry.name}", group="sessions")

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
        if snap is not None and dash is not None:
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
        try:
            await session.start()
            if entry.after_start is not None:
                self.run_worker(asyncio.to_thread(entry.after_start), group="after-start")
            async for snap in session.snapshots():
                self.post_snapshot(snap)
        finally:
            await session.close()

    # ---- actions -----------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action in MUTATING_ACTIONS and self.read_only)

    def request_restart(self, host: str) -> None:
        if self.read_only:
            self.notify("read-only: restarting the service is refused.", severity="warning")
            return
        dash = self.dashboards.get(host)
        if dash is None:
            return
        unit = dash.entry.config.unit_name if dash.entry.config else "the service"
        self.push_screen(
            ConfirmScreen(
                f"Restart {unit} on {host}?",
                "The server stops and reloads its model; a restart takes minutes on a real host.",
            ),
            partial(self._confirmed_restart, host),
        )

    def _confirmed_restart(self, host: str, yes: bool | None) -> None:
        if yes:
            self._restart(host)

    @work(group="restart", exclusive=True)
    async def _restart(self, host: str) -> None:
        from console.sources.session import HostSession
        from console.sources.transport import TransportError

        session = self.sessions.get(host)
        if not isinstance(session, HostSession):
            self.notify(f"{host}: not connected.", severity="error")
            return
        unit = session.host.unit_name
        self.notify(f"{host}: restarting {unit}…", timeout=3)
        try:
            result = await session.transport.run(["systemctl", "restart", unit], timeout=900)
        except TransportError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return
        if result.ok:
            self.notify(f"{host}: systemctl restart {unit} returned.", timeout=3)
        else:
            self.notify(
                f"{host}: systemctl restart failed: {result.first_error_line()}", severity="error", timeout=15
            )

    def action_help(self) -> None:
        focused = self.focused
        text = ""
        node: Widget | None = focused
        while node is not None:
            if isinstance(node, Panel | FeedLog) and node.HELP:
                text = node.HELP
                break
            parent = node.parent
            node = parent if isinstance(parent, Widget) else None
        self.push_screen(HelpScreen(text, read_only=self.read_only))
