"""The dashboard's header: the host, its service and boot, the served model and SGLang version, the pool
against the target, the worst alert firing and how long ago the host was last heard from.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Group, RenderableType
from rich.style import Style
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from console.core.alerts import Alert
from console.core.hostfacts import HostFacts
from console.core.snapshot import ConnState, HealthState, HostSnapshot
from console.core.state import Boot
from console.core.text import terminal_safe
from console.tui.themes import BOLD, palette
from console.tui.view import (
    boot_name,
    display_boot,
    fmt_duration,
    freshest,
    model_name,
    textual_text,
    unit_state,
)


class HeaderBar(Widget):
    """Host, service, link, server and model, and how old the newest sample is.

    Its two lines are a reactive attribute, made again from what it shows whenever that may have
    changed (a snapshot, an alert, the host's facts, the note, the clock's tick, the width): Textual
    repaints the header when their text changes, and only then."""

    DEFAULT_CLASSES = "header-bar"

    lines: reactive[tuple[Text, Text] | None] = reactive(None, init=False)
    """What the header says (styled), as it was last made: a change repaints it."""
    note: reactive[str | None] = reactive(None, init=False)
    """What the link's place says before a session exists ("preparing…", "could not start: …")."""

    def __init__(
        self,
        host: str,
        *,
        simulated: bool,
        read_only: bool,
        clock: Callable[[], float],
        sandbox: bool = False,
    ) -> None:
        super().__init__()
        self.host = host
        self.simulated = simulated
        self.sandbox = sandbox
        self.read_only = read_only
        self.clock = clock
        self.snap: HostSnapshot | None = None
        self.facts: HostFacts | None = None
        self._drawn_age: tuple[str, Style] | None = None
        self.alert: tuple[Alert, int] | None = None
        """The worst firing alert and how many fire (the badge), None when none does."""

    def show(self, snap: HostSnapshot) -> None:
        # Ten snapshots a second under load: the lines are made again (a fraction of a millisecond) and
        # the header repaints only when they read differently, such as a stale age now fresh.
        self.snap = snap
        self._update()

    def show_alert(self, worst: Alert | None, firing: int) -> None:
        self.alert = (worst, firing) if worst is not None else None
        self._update()

    def show_facts(self, facts: HostFacts) -> None:
        """What the console learned of the host: its SGLang when the server does not say, the KV cell of
        the model's own config.json."""
        self.facts = facts
        self._update()

    def watch_note(self) -> None:
        self._update()

    def on_resize(self) -> None:
        self._update()  # the second line's order depends on the width

    def _update(self) -> None:
        self.lines = self._make()

    def on_mount(self) -> None:
        self._update()
        # The age of the freshest sample moves with the clock even when the host is quiet.
        self.set_interval(1.0, self._tick)

    WIDE_COLUMNS = 120
    """Narrower than this the second line puts the sample's age first (at 80 columns it fell off)."""

    FRESH_S = 5.0
    """Younger than this the age reads `< 5s ago`: a 1 Hz sampler's age cycling 0-1 s said nothing, and
    repainting it cost a frame a second (~0.3% of a core, measured). Older, it counts up every second."""

    def age_label(self) -> tuple[str, Style]:
        """The freshest sample's age as shown, and its style."""
        stamp = freshest(self.snap) if self.snap is not None else None
        if stamp is None:
            return "none yet", palette().faint
        age = max(0.0, self.clock() - stamp)
        if age < self.FRESH_S:
            return f"< {self.FRESH_S:g}s ago", palette().ok
        return f"{fmt_duration(age)} ago", palette().warn if age < 30 else palette().bad

    def _tick(self) -> None:
        if self.age_label() != self._drawn_age:
            self._update()

    def render(self) -> RenderableType:
        # Made again, not the reactive's: a theme change repaints the header in its new colours.
        return Group(*self._make())

    def _make(self) -> tuple[Text, Text]:
        """The header's two lines, from what it shows now."""
        snap = self.snap
        line1 = Text()
        line1.append(f" {self.host} ", "bold reverse")
        if self.simulated:
            line1.append(" SIMULATED HOST ", palette().badge("warn"))
        if self.sandbox:
            # Profiles saved, verified restarts and probes go to a temporary directory, not the operator's.
            line1.append(" SANDBOX ", palette().badge("info"))
        if self.read_only:
            line1.append(" READ-ONLY ", palette().badge("step"))
        if snap is not None and snap.connection is not None and not snap.connection.host_key_checked:
            # A badge up front like the two above, so a long link reason cannot push it off the line:
            # the hosts file turned the host-key check off for this host.
            line1.append(" host key NOT checked ", palette().badge("bad"))
        if self.alert is not None:
            alert, firing = self.alert
            more = f" +{firing - 1}" if firing > 1 else ""
            style = palette().badge("bad") if alert.severity == "critical" else palette().badge("accent")
            line1.append(f" ALERT {alert.rule}{more} ", style)  # a rule's normal form: [a-z0-9_ <>=.-]
        boot = display_boot(snap.state) if snap is not None else None
        line1.append("  service ", palette().muted)
        state = unit_state(snap, boot) if snap is not None else "—"
        style = (
            palette().style("ok", bold=True)
            if state == "ready"
            else palette().style("bad", bold=True)
            if state.startswith("failed")
            else BOLD
        )
        line1.append(state, style)
        line1.append("  link ", palette().muted)
        conn = snap.connection if snap is not None else None
        if conn is None:
            line1.append(self.note or "not connected", palette().warn)
        else:
            cstyle = {ConnState.UP: palette().ok, ConnState.FAILED: palette().style("bad", bold=True)}.get(
                conn.state, palette().warn
            )
            line1.append(conn.describe(), cstyle)
        if snap is not None and snap.server is not None:
            line1.append("  http ", palette().muted)
            health = snap.server.health
            line1.append(
                health.value,
                palette().ok
                if health is HealthState.OK
                else palette().warn
                if health is HealthState.STARTING
                else palette().bad,
            )
            if snap.server.detail and (
                health is HealthState.ERROR or (health is HealthState.OK and snap.server.metrics is None)
            ):
                # The sentence of an answer refused (too large, too slow, not what SGLang sends): the
                # operator reads why there are no figures, here where the server's state is.
                line1.append(f": {terminal_safe(snap.server.detail)[:160]}", palette().bad)

        server = snap.server if snap is not None else None
        facts = self.facts
        version = (
            (server.version if server is not None else None)
            or _version(boot)
            or (facts.sglang.version if facts is not None else None)
        )
        model = model_name(boot) or (server.model if server is not None else None)
        self._drawn_age = age = self.age_label()
        # Each line stays one row: a line that wrapped pushed the second off the bar's two rows (at
        # 120 columns the age went). Cut at the edge instead, the least telling words last.
        line1.no_wrap, line1.overflow = True, "ellipsis"
        width = self.size.width
        if not width or width >= self.WIDE_COLUMNS:
            wide = self._wide_line(version, model, boot, age)
            if not width or wide.cell_len <= width:
                return textual_text(line1), textual_text(wide)
        # Narrow (or the wide line does not fit): the age first, where the edge cannot cut it off; the
        # model last.
        line2 = Text(" ", no_wrap=True, overflow="ellipsis")
        line2.append("fresh ", palette().muted)
        line2.append(*age)
        if boot is not None:
            line2.append(f"  {boot_name(boot)}", palette().muted)
        line2.append("  SGLang ", palette().muted)
        line2.append(version or "—", "bold" if version else palette().faint)
        line2.append("  ", palette().muted)
        line2.append(model or "—", "bold")
        return textual_text(line1), textual_text(line2)

    def _wide_line(
        self, version: str | None, model: str | None, boot: Boot | None, age: tuple[str, Style]
    ) -> Text:
        """The second line on a wide pane: what runs, then the boot and the sample's age."""
        facts = self.facts
        line2 = Text(" ", no_wrap=True, overflow="ellipsis")
        line2.append("SGLang ", palette().muted)
        line2.append(version or "version not reported", "bold" if version else palette().faint)
        line2.append("  model ", palette().muted)
        line2.append(model or "—", "bold")
        shape = facts.model.shape if facts is not None else None
        if facts is not None and shape is not None:
            # The cell the planner uses, and whether it came from the host's config.json or the catalogue.
            line2.append(f"  {shape.cell_bytes:,} B/token ", palette().muted)
            line2.append(f"({facts.model.config_from or 'catalogue'})", palette().faint)
        if boot is not None:
            line2.append(f"  {boot_name(boot)}", palette().muted)
        line2.append("  freshest sample ", palette().muted)
        line2.append(*age)
        return line2


def _version(boot: Boot | None) -> str | None:
    # SGLang does not print its version in the journal (the header prefers /server_info's); some builds
    # put it in the args dump.
    if boot is None:
        return None
    value = boot.arg("version") or boot.arg("sglang_version")
    return str(value) if value else None
