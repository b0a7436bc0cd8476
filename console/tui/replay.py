"""`k26-console replay FILE`: the console's own dashboard over a recording.

The app is the live `ConsoleApp` without sessions: the recorded inputs are folded by `Replay` (the same
`HostFold` a live session uses) and its snapshots reach the dashboards through the app's own
`post_snapshot`; pairing views and audit entries go to the hosts' own controllers as live. What is
different is only what a replay must not have: every action that changes a host (apply, restart, roll
back, probe, profiles, the lock) has no key, no palette entry and no action here — absent, not refused.

Keys: space play/pause · `.` step · ←/→ ±10 s · shift+←/→ or [ ] ±1 min · n / N the next / previous
restart phase or error · e the next error · g go to a time · + / - speed (0.25–8×) · Home / End.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Input, Static

from console.core.recording import Record, clock_text, parse_at, restart_marks
from console.sources.alerts import AlertConfig
from console.sources.recording import RecordingError
from console.sources.replay import Replay
from console.tui.app import ConsoleApp
from console.tui.dashboard import HostDashboard
from console.tui.host_controller import HostController
from console.tui.host_entry import HostEntry
from console.tui.themes import BOLD, palette

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
TICK_S = 0.1
RECORDS_PER_TICK = 256
"""Records folded per tick at most (a journal record holds up to 256 entries): a burst replayed at 8x
never holds the screen for long; the replay falls behind instead."""
REPLAY_KEYS = """\
[b]Keys (replay)[/b]
  space        play / pause (at the end: from the start)     .      step: the next recorded input
  ← →          10 s back / forward                           [ ]    a minute back / forward (also shift+← →)
  n N          the next / previous restart phase or error    e      the next error
  g            go to a time: 90s, +5m, -30s, 03:12:07 (UTC), an ISO time, start, end
  + -          speed 0.25x to 8x                              Home End  the start / the end
  /            filter the event feed (regex; !regex inverts)  f      follow the feed's tail
  z            fold / unfold earlier boots                    a      acknowledge pinned errors
  q            quit                                           F1     this help
Nothing in a replay reaches a host: apply, restart, roll back, probe, profiles and the lock are absent."""

ABSENT_ACTIONS = frozenset({"restart", "rollback", "apply", "probe", "profiles", "refused", "record"})


class ReplayDashboard(HostDashboard):
    """The host dashboard with none of the keys that reach a host."""

    inherit_bindings = False
    BINDINGS = []  # noqa: RUF012 - Textual reads it as a class attribute

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return action not in ABSENT_ACTIONS


class ReplayBar(Vertical):
    """The timeline (restarts ▲, other phases │, errors ✖, the cursor ◆), where the replay stands, and
    the keys."""

    DEFAULT_CSS = """
    /* Above the key footer, which is docked at the bottom too (docked widgets overlap). */
    ReplayBar { dock: bottom; height: auto; margin-bottom: 1; background: $panel; }
    ReplayBar Static { height: auto; padding: 0 1; }
    ReplayBar Input { display: none; }
    ReplayBar Input.on { display: block; }
    """

    def __init__(self, app: ReplayApp) -> None:
        super().__init__(id="replay-bar")
        self.replay_app = app
        self.line = Static(id="replay-line")
        self.goto = Input(placeholder="go to: 90s, +5m, -30s, 03:12:07, an ISO time, start, end", id="goto")

    def compose(self) -> ComposeResult:
        yield self.line
        yield self.goto

    def on_mount(self) -> None:
        self.show()

    def on_resize(self) -> None:
        self.show()

    def restyle(self) -> None:
        # The line is Rich text in the theme's colours, made again at each tick only while playing.
        self.show()

    def show(self) -> None:
        self.line.update(self.render_text(max(20, self.size.width - 2)))

    def render_text(self, width: int) -> Text:
        app = self.replay_app
        replay = app.replay
        start, end = replay.start, replay.end
        span = max(end - start, 1e-9)
        pal = palette()
        cells = ["─"] * width
        styles = [pal.faint] * width

        def cell(ts: float) -> int:
            return min(width - 1, max(0, int((ts - start) / span * (width - 1))))

        restarts = restart_marks(replay.marks)
        for n, mark in enumerate(replay.marks):
            i = cell(mark.ts)
            if mark.kind == "error":
                cells[i], styles[i] = "✖", pal.style("bad", bold=True)
            elif n in restarts and cells[i] != "✖":
                cells[i], styles[i] = "▲", pal.style("warn", bold=True)
            elif cells[i] == "─":
                cells[i], styles[i] = "│", pal.info
        here = cell(replay.position)
        cells[here], styles[here] = "◆", pal.style("text", bold=True)
        text = Text()
        for char, style in zip(cells, styles, strict=True):
            text.append(char, style)
        state = "seeking…" if app.seeking else ("▶ playing" if app.playing else "❚❚ paused")
        at = replay.position - start
        text.append(
            f"\nREPLAY {state} {app.speed:g}×  {clock_text(replay.position)} UTC  "
            f"+{_hms(at)} of {_hms(end - start)}  ({clock_text(start)}–{clock_text(end)})  {app.path.name}",
            BOLD,
        )
        upcoming = replay.next_mark(replay.position)
        if upcoming is not None:
            text.append(f"  next: {upcoming.label} at {clock_text(upcoming.ts)}", pal.muted)
        if app.problem:
            text.append(f"\n{app.problem}", pal.style("bad", bold=True))
        return text

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.goto.remove_class("on")
        self.replay_app.go_to(event.value)
        self.replay_app.active_feed_focus()


def _hms(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class ReplayApp(ConsoleApp):
    """The console over a recording. Nothing here can reach a host: there is no session, no transport,
    no service controller, and the keys and commands that would use them do not exist."""

    TITLE = "k26-console replay"
    inherit_bindings = False
    ENABLE_COMMAND_PALETTE = False
    COMMANDS = set()  # noqa: RUF012
    BINDINGS = [  # noqa: RUF012 - Textual reads it as a class attribute
        Binding("q,ctrl+q", "quit", "Quit"),
        Binding("f1", "help", "Help"),
        Binding("space", "play", "Play/pause"),
        Binding("full_stop", "step", "Step", show=False),
        Binding("left", "jump(-10)", "-10s", show=False, priority=True),
        Binding("right", "jump(10)", "+10s", show=False, priority=True),
        Binding("shift+left,left_square_bracket", "jump(-60)", "-1min", show=False, priority=True),
        Binding("shift+right,right_square_bracket", "jump(60)", "+1min", show=False, priority=True),
        Binding("n", "mark(1)", "Next phase/error"),
        Binding("N", "mark(-1)", "Previous", show=False),
        Binding("e", "error", "Next error", show=False),
        Binding("g", "goto", "Go to"),
        Binding("plus,equals_sign", "speed(1)", "Faster", show=False),
        Binding("minus", "speed(-1)", "Slower", show=False),
        Binding("home", "edge(0)", "Start", show=False, priority=True),
        Binding("end", "edge(1)", "End", show=False, priority=True),
    ]

    def __init__(
        self,
        replay: Replay,
        path: Path,
        *,
        at: float | None = None,
        speed: float = 1.0,
        alerts: AlertConfig | None = None,
    ) -> None:
        """`alerts`: the rules evaluated again on the replayed snapshots, as live; never the bell nor the
        hook (a replay must not page anybody), whatever the config says."""
        self.replay = replay
        self.path = path
        entries = [HostEntry(name=name) for name in replay.host_names]
        quiet = alerts.model_copy(update={"bell": False, "command": None}) if alerts is not None else None
        super().__init__(entries, read_only=True, connect=False, clock=self._now, alerts=quiet)
        # The live dashboards and controllers, swapped for ones without the keys that reach a host.
        for entry in entries:
            dash = ReplayDashboard(
                entry, read_only=True, target=None, target_source=None, clock=self._now, me=self.me
            )
            dash.throughput.probe_hint = False  # a replay has no probe to suggest
            self.dashboards[entry.name] = dash
            self.hosts[entry.name] = HostController(entry, self, me=self.me, store=self.store, read_only=True)
        self.playing = False
        self.seeking = False
        self.speed = speed
        self.problem: str | None = None
        self.bar = ReplayBar(self)
        self._start_at = at
        self._last_tick = time.monotonic()
        self._shown_seq: dict[str, int] = {}

    def _now(self) -> float:
        return self.replay.position

    def compose(self) -> ComposeResult:
        yield self.bar
        yield from super().compose()

    def on_mount(self) -> None:
        super().on_mount()
        self.run_worker(
            self._seek(self._start_at if self._start_at is not None else self.replay.start), group="seek"
        )
        self.set_interval(TICK_S, self._tick)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("jump", "edge") and isinstance(self.focused, Input):
            return False  # the arrows move the cursor of the box being typed in
        return action not in ABSENT_ACTIONS

    def looking_at(self, host: str) -> str:
        return "replay"

    def action_help(self) -> None:
        from console.tui.screens import HelpScreen

        self.push_screen(HelpScreen("", read_only=True, keys=REPLAY_KEYS))

    def active_feed_focus(self) -> None:
        dash = self.active_dashboard
        if dash is not None:
            dash.feed.log_widget.focus()

    # ---- playing -------------------------------------------------------------------------------------

    def _seek_scheduled(self) -> bool:
        """A seek asked for and not yet over (a worker may not have started yet: space at the end plays
        from the start, and a tick before the seek began saw the end and stopped the play)."""
        return self.seeking or any(w.group == "seek" and not w.is_finished for w in self.workers)

    def _tick(self) -> None:
        now = time.monotonic()
        dt, self._last_tick = now - self._last_tick, now
        if not self.playing or self._seek_scheduled():
            return
        replay = self.replay
        try:
            replay.play_to(replay.position + dt * self.speed, self._on_record, limit=RECORDS_PER_TICK)
        except RecordingError as exc:
            self.problem, self.playing = str(exc), False
        self._publish()
        # At the end: a recording a console still writes has grown meanwhile, else the play stops.
        if replay.next_ts() is None and not replay.refresh():
            self.playing = False
        self.bar.show()

    def _on_record(self, record: Record) -> None:
        """Pairing views and audit entries go to the host's controller, as the live link hands them."""
        ctl = self.hosts.get(record.host)
        if ctl is None:
            return
        if record.kind == "view":
            ctl._on_view(record.payload)
            ctl.dashboard.pairing.set_view(record.payload, datetime.fromtimestamp(record.ts, UTC))
        elif record.kind == "audit":
            # As live: the journal's lines read before the entries are shown first.
            ctl.pending = None
            ctl.dashboard.show(self.replay.snapshot(record.host))
            ctl._on_audit(record.payload)

    def _publish(self) -> None:
        """Each host's snapshot, when it changed, through the app's own path (as a session's)."""
        for name in self.replay.host_names:
            host = self.replay.hosts.get(name)
            if host is not None and self._shown_seq.get(name) != host.seq:
                self._shown_seq[name] = host.seq
                self.post_snapshot(self.replay.snapshot(name))

    # ---- seeking -------------------------------------------------------------------------------------

    async def _seek(self, ts: float) -> None:
        if self.seeking:
            return
        self.seeking = True
        self.bar.show()
        try:
            # Folding up to an hour of input: off the event loop, the screen stays live.
            await asyncio.to_thread(self.replay.seek, ts)
        except RecordingError as exc:
            self.problem = str(exc)
        finally:
            self.seeking = False
        self._redraw()
        self.bar.show()

    def _redraw(self) -> None:
        """Every dashboard as the replay stands now: the feed again from the events kept, with the audit
        entries where they arrived among them."""
        replay = self.replay
        for name in replay.host_names:
            dash, ctl, host = self.dashboards.get(name), self.hosts.get(name), replay.hosts.get(name)
            if dash is None or ctl is None or host is None:
                continue
            snap = replay.snapshot(name)
            ctl.pending = None
            ctl.clear_alerts()
            dash.feed.reset()
            dash.throughput.reset()
            base = snap.events_total - len(snap.recent)
            for count, entries in host.audits:
                if count < base:
                    continue  # older than the events kept: the live feed had them further up
                dash.show(
                    snap.model_copy(update={"recent": snap.recent[: count - base], "events_total": count})
                )
                ctl._on_audit(entries)
            dash.show(snap)
            if host.view is not None:
                ctl._on_view(host.view)
                dash.pairing.set_view(host.view, datetime.fromtimestamp(replay.position, UTC))
            self._shown_seq[name] = host.seq

    def go_to(self, text: str) -> None:
        try:
            at = parse_at(text, self.replay.start, self.replay.end)
        except ValueError as exc:
            self.notify(str(exc), severity="warning", timeout=8)
            return
        self.run_worker(self._seek(at), group="seek", exclusive=True)

    def action_play(self) -> None:
        if self.replay.next_ts() is None and not self.playing:
            self.run_worker(self._seek(self.replay.start), group="seek")
        self.playing = not self.playing
        self._last_tick = time.monotonic()
        self.bar.show()

    def action_step(self) -> None:
        """The next recorded input, applied and shown."""
        self.playing = False
        if self.seeking:
            return
        try:
            self.replay.step(self._on_record)
        except RecordingError as exc:  # a chunk that cannot be read: said once, as a play or seek says it
            self.problem = str(exc)
        self._publish()
        self.bar.show()

    def action_jump(self, seconds: float) -> None:
        self.run_worker(self._seek(self.replay.position + float(seconds)), group="seek")

    def action_mark(self, direction: int) -> None:
        replay = self.replay
        mark = replay.next_mark(replay.position) if direction > 0 else replay.previous_mark(replay.position)
        if mark is None:
            self.notify(
                "no restart phase or error " + ("after" if direction > 0 else "before") + " this point."
            )
            return
        self.run_worker(self._seek(mark.ts), group="seek")

    def action_error(self) -> None:
        mark = self.replay.next_mark(self.replay.position, frozenset({"error"}))
        if mark is None:
            self.notify("no error after this point.")
            return
        self.run_worker(self._seek(mark.ts), group="seek")

    def action_goto(self) -> None:
        self.playing = False
        self.bar.goto.add_class("on")
        self.bar.goto.value = ""
        self.bar.goto.focus()

    def action_speed(self, direction: int) -> None:
        index = min(range(len(SPEEDS)), key=lambda i: abs(SPEEDS[i] - self.speed))
        self.speed = SPEEDS[min(len(SPEEDS) - 1, max(0, index + int(direction)))]
        self.bar.show()

    def action_edge(self, which: int) -> None:
        self.run_worker(self._seek(self.replay.end if which else self.replay.start), group="seek")

    async def action_quit(self) -> None:
        self.exit()

    # ---- for tests ---------------------------------------------------------------------------------

    async def wait_settled(self, timeout: float = 30.0) -> None:
        """Until no seek runs and every host's newest snapshot has been shown."""
        async with asyncio.timeout(timeout):
            while self.seeking or any(h.posted or h.pending is not None for h in self.hosts.values()):
                await asyncio.sleep(0.02)

    def status(self) -> dict[str, Any]:
        return {"position": self.replay.position, "playing": self.playing, "speed": self.speed}
