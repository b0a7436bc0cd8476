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
from typing import Any, Protocol

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.command import Hit, Hits, Provider
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Footer, TabbedContent, TabPane

from console.core.profile_store import ProfileStore
from console.core.profiles import Profile, ProfileError
from console.core.snapshot import HostSnapshot
from console.sources.hosts import HostConfig
from console.tui.feed import EventFeed
from console.tui.panels import GpuPanel, HeaderBar, KvPanel, TimelinePanel, VerdictBanner
from console.tui.profiles import HostView, ProfilesScreen
from console.tui.screens import ApplyChoice, ApplyConfirmScreen, ConfirmScreen, HelpScreen, help_keys
from console.tui.view import ApplyTrack, display_boot

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
    controller_options: dict[str, object] = field(default_factory=dict)
    """Passed to `ServiceController` (tests keep its restart history in a temporary `state_dir`)."""


class SnapshotReady(Message):
    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host


class HostDashboard(Vertical):
    """Everything about one host."""

    BINDINGS = [  # noqa: RUF012 - Textual reads it as a class attribute
        Binding("p", "profiles", "Profiles"),
        Binding("r", "restart", "Restart"),
        Binding("R", "rollback", "Roll back"),
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
        self.verdict = VerdictBanner(id="verdict")
        self.snap: HostSnapshot | None = None
        self.track: ApplyTrack | None = None

    def compose(self) -> ComposeResult:
        yield self.header
        yield self.verdict
        with Horizontal(id="top"):
            yield self.gpus
            with Vertical(id="side"):
                yield self.kv
                yield self.timeline
        yield self.feed

    def on_mount(self) -> None:
        self.verdict.display = False
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
        return not (action in MUTATING_ACTIONS and self.read_only)

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
            for entry in app.store.entries():
                yield (
                    f"Apply profile {entry.name} to {host}",
                    partial(app.request_apply, host, entry.name),
                    "shows the diff and the prediction first",
                )
            yield (
                f"Restart the service on {host}",
                partial(app.request_restart, host),
                "after a confirmation; followed on the timeline",
            )
            yield (
                f"Roll back the last apply on {host}",
                partial(app.request_rollback, host),
                "R; restores the previous drop-in, restarts, verifies",
            )
        yield (
            f"Probe {host}: long-context decode speed",
            partial(app.open_probe, host),
            "a synthetic request at chosen depths",
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
    ) -> None:
        """`connect=False` opens the dashboards without sessions: the tests feed snapshots themselves.
        `store` holds the flag profiles (default: the user's, then the shipped examples); `profile` is
        the one the profiles screen opens on."""
        super().__init__()
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
        self.pool_before: dict[str, int | None] = {}
        self.applied: dict[str, str] = {}
        """The profile last applied and verified on each host (the probe keeps its results there)."""
        """Hosts with an apply, rollback or restart in flight (one at a time per host)."""
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
        # Compact: an 80-column pane still shows restart, roll back, quit and help.
        yield Footer(compact=True)

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
        try:
            profile = self.store.load(name)
        except ProfileError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return
        self._preview_apply(host, profile)

    @work(group="preview")
    async def _preview_apply(self, host: str, profile: Profile) -> None:
        ctl = self._controller(host)
        if ctl is None:
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
        # What a rollback must bring back: the pool of the boot this apply replaces.
        self.pool_before[host] = boot.pool.tokens if boot is not None else None
        dash.begin_track(f"apply {profile.name}")
        try:
            # The preview the operator confirmed is the one applied (no second look that could differ).
            outcome = await ctl.apply(
                profile,
                force=force,
                progress=partial(self._progress, host),
                store=self.store,
                preview=preview,
            )
        except Exception as exc:
            self._fail(host, str(exc))
            return
        finally:
            self.busy.pop(host, None)
        if outcome.ok:
            self.applied[host] = profile.name
        self._finish(host, outcome, undoable="write_dropin" in outcome.durations)

    # ---- rollback and restart ----------------------------------------------------------------------

    def request_rollback(self, host: str) -> None:
        if self._refuse_read_only("rolling back") or self._busy(host) or host not in self.dashboards:
            return
        self.push_screen(
            ConfirmScreen(
                f"Roll back the service on {host}?",
                "Restores the drop-in that was in place before the last apply (or removes the console's), "
                "reloads systemd, restarts the server and verifies it. A restart takes minutes on a real host.",
            ),
            partial(self._confirmed_rollback, host),
        )

    def _confirmed_rollback(self, host: str, yes: bool | None) -> None:
        if yes:
            self._run_rollback(host)

    @work(group="apply")
    async def _run_rollback(self, host: str) -> None:
        ctl = self._controller(host)
        dash = self.dashboards.get(host)
        if ctl is None or dash is None or self._busy(host):
            return
        self.busy[host] = "a rollback"
        dash.begin_track("rollback")
        try:
            outcome = await ctl.rollback(
                progress=partial(self._progress, host), expect_pool=self.pool_before.get(host)
            )
        except Exception as exc:
            self._fail(host, str(exc))
            return
        finally:
            self.busy.pop(host, None)
        self._finish(host, outcome, undoable=False)

    def request_restart(self, host: str) -> None:
        if self._refuse_read_only("restarting the service") or self._busy(host):
            return
        dash = self.dashboards.get(host)
        if dash is None:
            return
        unit = dash.entry.config.unit_name if dash.entry.config else "the service"
        self.push_screen(
            ConfirmScreen(
                f"Restart {unit} on {host}?",
                "The server stops and reloads its model with the flags in force; a restart takes minutes "
                "on a real host.",
            ),
            partial(self._confirmed_restart, host),
        )

    def _confirmed_restart(self, host: str, yes: bool | None) -> None:
        if yes:
            self._restart(host)

    @work(group="apply")
    async def _restart(self, host: str) -> None:
        from console.sources.session import HostSession
        from console.sources.transport import TransportError

        # The service controller has no plain restart: systemctl restarts with the flags in force, and
        # the journal plays the boot on the timeline as for any restart.
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

    # ---- probe and help ----------------------------------------------------------------------------

    def open_probe(self, host: str) -> None:
        """The probe screen (console/tui/probe.py) on the host's session; results are kept with the
        profile last verified here, else the one the console was opened with."""
        from console.tui.probe import ProbeScreen

        session = self.sessions.get(host)
        if session is None:
            self.notify(f"{host}: the probe needs a connected host.", severity="warning")
            return
        self.push_screen(ProbeScreen(session, profile=self.applied.get(host) or self.profile))

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
        self.push_screen(HelpScreen(text, read_only=self.read_only, keys=keys))


class ServiceControllerLike(Protocol):
    """What the console uses of `console.sources.service.ServiceController`."""

    async def running_argv(self) -> list[str]: ...
    async def preview(self, profile: Profile) -> Any: ...
    async def apply(self, profile: Profile, **kw: Any) -> Any: ...
    async def rollback(self, **kw: Any) -> Any: ...


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
