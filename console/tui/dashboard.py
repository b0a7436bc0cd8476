"""One host's dashboard: header, pairing bar, GPUs, generation chart, KV capacity, serving figures,
restart timeline and the event feed. It shows snapshots, the state its host's controller publishes
(`HostUi`, console/tui/host_ui.py: `present`) and the controller's tracks; what the operator asks of the
host leaves it as messages (console/tui/messages.py)."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.actions import SkipAction
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll

from console.core.audit import AuditEntry
from console.core.pairing import Identity
from console.core.snapshot import HostSnapshot
from console.sources.hoststate import local_identity
from console.tui.feed import EventFeed
from console.tui.header import HeaderBar
from console.tui.host_entry import HostEntry
from console.tui.host_ui import HostUi
from console.tui.messages import ProbeRequested, ProfilesRequested, RestartRequested, RollbackRequested
from console.tui.pairing import TIMELINE_ACTIONS, PairingBar, held_by_other, lock_note
from console.tui.panels import GpuPanel, KvPanel, TimelinePanel, VerdictBanner
from console.tui.serving_panel import ServingPanel
from console.tui.themes import palette
from console.tui.throughput import ThroughputChart
from console.tui.track import ApplyTrack
from console.tui.view import display_boot

MUTATING_ACTIONS = frozenset({"restart", "rollback", "apply"})


class HostDashboard(Vertical):
    """Everything about one host."""

    BINDINGS = [  # noqa: RUF012 - Textual reads it as a class attribute
        Binding("p", "profiles", "Profiles"),
        # Out of the footer: an 80-column pane must still show restart, roll back, quit and help. F1 and
        # the palette name it.
        Binding("P", "probe", "Probe", show=False),
        Binding("r", "restart", "Restart"),
        Binding("R", "rollback", "Roll back"),
        # The help says Esc clears the feed's filter: from anywhere on the dashboard, not only its box.
        Binding("escape", "clear_filter", show=False),
    ]

    COMPACT_BELOW_ROWS = 40
    """Shorter than this the panels go compact: the GPU legend moves into the border, the gauge loses its
    mark line, the feed pins one error and the chart shrinks or gives way to its latest figure."""
    TIGHT_BELOW_ROWS = 28
    """Shorter than this (an 80x24 terminal) the side column's panels keep only their top rule and the
    serving panel its first latencies: the KV gauge, the serving figures and the restart's first line
    all fit beside eight GPU bars (the restart panel was out of view at 80x24)."""
    FEED_MIN_ROWS = 5
    """Event rows kept in view whatever the pane's size: the panels above scroll instead."""
    CHART_ROWS = 9
    """The chart's rows at least; beyond them it grows to end level with the side column (9 at most
    left it 2 plot rows tall over 9 blank ones at 160x48), within what the GPU bars leave of the top."""
    CHART_MIN_ROWS = 6
    """Below this many rows the chart gives way to its latest figure."""
    ROOMY_TOP_SHARE = 0.6
    """On a tall pane the panels take at most this share of it; the feed has the rest."""

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
        super().__init__(id=f"dash-{dom_id(entry.name)}", classes="dashboard")
        self.entry = entry
        self.read_only = read_only
        self.header = HeaderBar(
            entry.name, simulated=entry.simulated, sandbox=entry.sandbox, read_only=read_only, clock=clock
        )
        self.gpus = GpuPanel(id="gpus", classes="panel")
        self.kv = KvPanel(target=target, target_source=target_source, id="kv", classes="panel")
        self.target_given = target is not None
        """--target-context or --profile named the gauge's target: the host's trail does not change it."""
        self.timeline = TimelinePanel(id="timeline", classes="panel")
        self.serving = ServingPanel(clock=clock, id="serving", classes="panel")
        self.throughput = ThroughputChart(window_s=300.0, clock=clock, id="throughput")
        self.throughput.add_class("panel")
        self.me = me or local_identity()
        self.pairing = PairingBar(self.me, id="pairing")
        self.feed = EventFeed(id="feed")
        self.verdict = VerdictBanner(id="verdict")
        self.snap: HostSnapshot | None = None
        self.ui = HostUi()
        """The controller's state as last presented."""
        self._ui_drawn = HostUi()
        self._ui_snap: HostSnapshot | None = None
        self._lines_taken = 0
        """The serial of the newest batch of outside lines the feed has."""
        self.composed = False
        """Its widgets are mounted: what it is given before is drawn then."""
        self.bindings_lock_state: tuple[bool, bool] | None = None
        self.track: ApplyTrack | None = None
        self._gpu_rows_fitted = 0

    def compose(self) -> ComposeResult:
        yield self.header
        yield self.pairing
        yield self.verdict
        # The chart sits under the GPU bars: in the side column it pushed the feed down while the
        # eight bars left a column of blank rows beside it (a 160x48 pane showed 14 feed lines).
        # Each column scrolls when the pane is too short for it (keys reach it from the focused panel).
        with Horizontal(id="top"):
            with VerticalScroll(id="main", can_focus=False):
                yield self.gpus
                yield self.throughput
            with VerticalScroll(id="side", can_focus=False):
                yield self.kv
                yield self.serving
                yield self.timeline
        yield self.feed

    def on_mount(self) -> None:
        self.composed = True
        self.verdict.display = False
        # Shown once the host's state directory has been read (a console without a session has none).
        self.pairing.display = False
        # Shown from the first server reading (a console without a session has none).
        self.serving.display = False
        self.gpus.border_title = "GPUs"
        self.kv.border_title = "KV capacity"
        self.throughput.border_title = "generation tok/s"
        self.timeline.border_title = "restart"
        self.serving.border_title = "serving"
        self.feed.border_title = "events"
        # The side column grows and shrinks with its panels (the serving figures come, a restart's
        # phases): the chart beside it follows, so that the two columns end level.
        self.watch(self.query_one("#side"), "virtual_size", self._side_resized, init=False)
        # Composed after its host had been followed a while (the overview's hosts are composed when
        # first shown): what was presented before, then the newest snapshot.
        self._draw_ui()
        if self.snap is not None:
            self.show(self.snap)

    def _side_resized(self) -> None:
        self.fit()

    def on_resize(self) -> None:
        self.fit()

    def on_event_feed_chrome_changed(self) -> None:
        self.fit()

    def fit(self) -> None:
        """Share the pane's rows: the bars above and the lines over the feed first, then at least
        `FEED_MIN_ROWS` event rows, then the panels (which scroll in what is left), then the chart."""
        height = self.size.height
        if height <= 0:
            return
        compact = height < self.COMPACT_BELOW_ROWS
        self.set_class(compact, "compact")
        tight = height < self.TIGHT_BELOW_ROWS
        self.set_class(tight, "tight")
        self.serving.set_tight(tight)
        self.gpus.set_compact(compact)
        self.kv.set_compact(compact)
        self.serving.set_compact(compact)
        self.timeline.set_compact(compact)
        self.feed.set_compact(compact)
        fixed = self.header.outer_size.height or 2
        if self.pairing.display:
            fixed += 1
        if self.verdict.display:
            fixed += 1 if compact else 3
        top = height - fixed - self.feed.reserved_rows(self.FEED_MIN_ROWS)
        if not compact:
            top = min(top, int(height * self.ROOMY_TOP_SHARE))
        top = max(top, 4)
        for column in self.query("#top, #main, #side"):
            column.styles.max_height = top
        self._gpu_rows_fitted = self.gpus.rows_needed()
        room = top - self._gpu_rows_fitted
        chart = room >= self.CHART_MIN_ROWS
        self.throughput.display = chart
        if chart:
            side = self.query_one("#side").virtual_size.height
            floor = self.gpus.styles.min_height
            bars = max(self._gpu_rows_fitted, int(floor.value) if floor is not None else 0)
            self.throughput.styles.height = min(room, max(self.CHART_ROWS, side - bars))
        self.show_figure()

    # ---- the controller's state ------------------------------------------------------------------

    def present(self, ui: HostUi, snap: HostSnapshot | None = None) -> None:
        """The host controller's newest state. `snap` is the host's newest snapshot: the feed takes its
        events up to where each new outside line arrived, so that the lines keep the order they were
        read in, even behind another tab or before the dashboard is composed."""
        self.ui = ui
        self._ui_snap = snap
        if self.composed:
            self._draw_ui()
        elif self.snap is None:
            self.snap = snap  # what it starts from (a change flow reads it at once)

    def _draw_ui(self) -> None:
        before, ui, snap = self._ui_drawn, self.ui, self._ui_snap
        self._ui_drawn, self._ui_snap = ui, None
        if ui.note != before.note:
            self.header.note = ui.note
        if ui.facts is not None and ui.facts is not before.facts:
            self.header.show_facts(ui.facts)
        if ui.alert != before.alert:
            worst, firing = ui.alert if ui.alert is not None else (None, 0)
            self.header.show_alert(worst, firing)
        if ui.applied is not None and ui.applied != before.applied:
            self.learn_applied_target(*ui.applied)
        for batch in ui.lines_after(self._lines_taken):
            if snap is not None:
                self.feed.take_until(snap, batch.after)
            self.feed.add_external(list(batch.events))
            self._changed_elsewhere(batch.entries)
            self._lines_taken = batch.serial
        if (ui.view, ui.view_at, ui.link_error) != (before.view, before.view_at, before.link_error):
            self.pairing.link_error = ui.link_error
            if ui.pairing_known:
                self.show_pairing()
            self.pairing.set_view(ui.view, ui.view_at)
            view = ui.view
            if view is not None:
                # The footer recomposes on every bindings refresh: only when what it greys out can change.
                locked = (held_by_other(view, self.me), view.lock_stale)
                if locked != self.bindings_lock_state:
                    self.bindings_lock_state = locked
                    self.refresh_bindings()
        if (ui.view, ui.view_at, ui.last_change) != (before.view, before.view_at, before.last_change):
            self.timeline.set_note(self.timeline_note(ui))

    def restyle(self) -> None:
        """After a theme change: the note under the timeline is Rich text coloured when it was set (an
        audit line stays until the next entry), so it is set again in the new theme's colours."""
        self.timeline.set_note(self.timeline_note(self._ui_drawn))

    def timeline_note(self, ui: HostUi) -> Text | str | None:
        """Under the timeline: who is changing the host now, else how its last change ended."""
        note = lock_note(ui.view, self.me, ui.view_at)
        if note is not None:
            stale = ui.view is not None and ui.view.lock_stale
            style = palette().style("bad" if stale else "warn", bold=True)
            return Text(note, style)
        return ui.last_change.line() if ui.last_change is not None else None

    def _changed_elsewhere(self, entries: tuple[AuditEntry, ...]) -> None:
        for entry in entries:
            if (entry.action in TIMELINE_ACTIONS or entry.action == "confirm") and (
                entry.console_id != self.me.console_id
            ):
                # Made elsewhere: this console's own last verdict no longer describes the host.
                ok = None if entry.outcome == "started" else entry.outcome == "ok"
                self.supersede(ok, entry.line())

    def learn_applied_target(self, profile: str, target: int | None) -> None:
        """No target given: the gauge takes that of the profile the host's audit trail says it was last
        applied with, as `snapshot` and `export` do (the console said "none" where `export` said 200,000).
        `target` None: that profile is gone or broken here, and the gauge keeps what it had."""
        if self.target_given or target is None:
            return
        source = f"profile {profile}, last applied"
        if (self.kv.target, self.kv.target_source) == (target, source):
            return
        self.kv.target, self.kv.target_source = target, source
        if self.snap is not None:
            self.kv.show(self.snap)

    def show_figure(self) -> None:
        """Without room for the chart, its latest figure goes under the GPU bars."""
        figure = None if self.throughput.display else self.throughput.latest()
        self.gpus.border_subtitle = figure

    def show_pairing(self) -> None:
        if not self.pairing.display:
            self.pairing.display = True
            self.fit()

    def show(self, snap: HostSnapshot) -> None:
        self.snap = snap
        if not self.composed:
            return  # drawn once mounted
        self.header.show(snap)
        self.gpus.show(snap)
        self.kv.show(snap)
        self.timeline.show(snap)
        if self.serving.display != (snap.serving is not None):
            self.serving.display = snap.serving is not None
        self.serving.show(snap)
        self.throughput.show(snap)
        self.feed.show(snap)
        self._verdict_still_true(snap)
        if self.gpus.rows_needed() != self._gpu_rows_fitted:
            self.fit()  # the first sample, or a GPU gone: the chart's room changed
        elif not self.throughput.display:
            self.show_figure()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action not in MUTATING_ACTIONS:
            return True
        # Read-only: the binding is hidden from the footer and the action cannot run.
        if self.read_only:
            return False
        # Another console holds the lock: shown disabled; the key falls through to the app, which
        # says who holds it and for what.
        return None if held_by_other(self.ui.view, self.me) else True

    def action_probe(self) -> None:
        self.post_message(ProbeRequested(self.entry.name))

    def action_restart(self) -> None:
        self.post_message(RestartRequested(self.entry.name))

    def action_rollback(self) -> None:
        self.post_message(RollbackRequested(self.entry.name))

    def action_clear_filter(self) -> None:
        if not self.feed.clear_filter():
            raise SkipAction()
        self.notify("feed filter cleared", timeout=2)

    def action_profiles(self) -> None:
        self.post_message(ProfilesRequested(self.entry.name))

    # ---- the controller's restarts -------------------------------------------------------------

    elsewhere = False
    """The banner describes a change made elsewhere (`supersede`), until this console starts one."""

    last_own_boot: int | None = None
    """The index of the last boot this console's finished change brought up (or found): a later boot,
    or that boot ending, means the verdict no longer describes the host (`_verdict_still_true`)."""

    def begin_track(self, action: str) -> ApplyTrack:
        self.elsewhere = False
        self.last_own_boot = None
        self.track = ApplyTrack(action)
        boot = display_boot(self.snap.state) if self.snap is not None else None
        self.track_started_boot = boot.index if boot is not None else None
        self.timeline.set_track(self.track, boot.index if boot is not None else None)
        if self.verdict.display:
            self.verdict.clear()
            self.fit()
        return self.track

    def progress(
        self, phase: str, message: str | None, elapsed: float, durations: dict[str, float], eta: float | None
    ) -> None:
        if self.track is not None:
            self.track.progress(phase, message, elapsed, durations, eta)
            self.timeline.refresh(layout=True)
            # The change in flight is what the side column is for now: scrolled to it, in a short pane.
            self.call_after_refresh(self.timeline.scroll_visible, animate=False)

    def _verdict_still_true(self, snap: HostSnapshot) -> None:
        """This console's verdict describes the boot its change brought up: a later boot (a restart by
        hand, a crash and systemd's restart) or that boot ending replaces it with what the journal says."""
        own = self.last_own_boot
        track = self.track
        if own is None or track is None or not track.done:
            return
        boot = display_boot(snap.state)
        if boot is None:
            return
        if boot.index > own:
            self.supersede(None, "")
            self.last_own_boot = None
        elif boot.index == own and boot.ended and track.ok:
            how = boot.unit_result or boot.phase
            self.supersede(False, f"the server stopped after {track.action} ({how}): see the feed")
            self.last_own_boot = None

    def supersede(self, ok: bool | None, line: str) -> None:
        """A later change of the host, made elsewhere (another console, the command line, the host's own
        rollback), replaces this console's last verdict: the banner describes the host's latest change,
        whoever made it, and this console's finished track leaves the timeline. `ok` None: in progress."""
        if self.track is not None and not self.track.done:
            return  # this console's own change is running: its verdict comes when it ends
        if self.track is None and not self.elsewhere:
            return  # no verdict of this console's is shown: the note under the timeline says it
        self.elsewhere = True
        self.track = None
        self.timeline.set_track(None)
        if ok is None:
            self.verdict.clear()
        else:
            self.verdict.show_verdict(ok, line, can_roll_back=False)
        self.fit()

    track_started_boot: int | None = None

    def finish_track(
        self,
        ok: bool,
        summary: str,
        reasons: tuple[str, ...],
        *,
        can_roll_back: bool,
        restarts: int = 1,
    ) -> None:
        """`restarts`: how many boots the change brought up (0 unchanged, 2 an apply rolled back)."""
        if self.track is None:
            self.begin_track("restart")
        if self.track_started_boot is not None:
            self.last_own_boot = self.track_started_boot + restarts
        assert self.track is not None
        self.track.finish(ok, summary, reasons, can_roll_back=can_roll_back)
        self.timeline.refresh(layout=True)
        self.verdict.show_verdict(
            ok, f"{self.track.action}: {summary}", can_roll_back=self.track.can_roll_back
        )
        self.fit()


def dom_id(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
