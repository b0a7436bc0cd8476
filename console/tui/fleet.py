"""The fleet overview: one row per host, drill-in to its dashboard; and the pace each host polls at.

With two hosts or more in the console the overview is the first tab; with `OPENS_ON_FLEET` or more the
console opens on it. Its rows are computed (`console.tui.fleet_rows`) from the snapshots the app already
received for the dashboards, once a second and only while the overview is on screen: no second path to
the hosts. Enter (or a click) on a row opens that host's dashboard; `o` comes back.

`FleetPacer` applies `console.core.fleet.poll_plan` to every host: the hosts not on screen share the
fleet's budget, the one whose dashboard is on screen polls at one host's pace. An interval the host's
entry sets itself (the tests, the demo's single host) is left alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable

from console.core.alerts import Alert
from console.core.fleet import PollPlan, poll_plan
from console.core.pairing import PairingView
from console.core.snapshot import HostSnapshot
from console.tui.fleet_rows import COLUMNS, FRESH_S, Cell, FleetRow, host_row, seen_cell, with_seen
from console.tui.host_entry import HostEntry
from console.tui.messages import HostChosen

FLEET_MIN_HOSTS = 2
"""The overview exists from two hosts: it is the only view that shows both at once."""
OPENS_ON_FLEET = 4
"""The console opens on the overview from four hosts. With two or three, every host's tab name fits
the tab bar of an 80-column pane and an operator watches one of them closely, so the console opens on
the first host as before (the overview is one tab to the left). From four, the tab bar no longer shows
every host at 80 columns, and which host needs looking at is the first question."""

FLEET_TAB = "tab-fleet"

LEVELS = ("ok", "warn", "critical", "muted")
"""How a cell is coloured, each a component class of the overview (`fleet--ok`...): its colour is the
theme's (`$success`, `$warning`, `$error`); a muted cell (no figure yet) is dim text of the theme's own
foreground."""


class FleetTable(DataTable[Text]):
    """The overview's table; Enter or a click on a row opens that host."""

    HELP = (
        "[b]Fleet overview[/b]\n\nOne row per host, from the same readings as its dashboard: the service's "
        "state (or why it cannot be reached), the KV pool against the target context, the post-restart "
        "verdict, generation tok/s, the worst alert firing, who holds the lock and how many consoles "
        "look at the host, and when it was last heard from.\n\n[b]Enter[/b] (or a click) opens the host's "
        "dashboard; [b]o[/b] comes back here. The title says how often the hosts not on screen are polled."
    )

    def bound_caches(self, rows: int) -> None:
        """Keep four generations of this table's renderings (`rows` rows of `COLUMNS`).

        DataTable keys its render caches by an update count that each update_cell raises, so only the last
        generation's entries are ever read again; its fixed sizes (10,000 cells, 1,000 rows and lines)
        kept ~10,000 stale renderings once a fleet's "last heard" cells had ticked for a minute (32 hosts:
        ~290 cells a second)."""
        cells = (rows + 1) * len(COLUMNS)
        self._cell_render_cache.maxsize = 4 * cells + 64
        for cache in (self._row_render_cache, self._row_renderable_cache, self._line_cache):
            cache.maxsize = 4 * (rows + 1) + 16

    async def _on_click(self, event: events.Click) -> None:
        # DataTable opens a row on the second click (the first only highlights it): one click on a
        # host's row opens it, as Enter does.
        meta = event.style.meta
        row, column = meta.get("row"), meta.get("column")
        on_row = isinstance(row, int) and row >= 0 and isinstance(column, int) and column >= 0
        again = on_row and (row, column) == tuple(self.cursor_coordinate)  # DataTable selects this one
        await super()._on_click(event)
        if on_row and not again and self.cursor_coordinate.row == row:
            self._post_selected_message()  # type: ignore[no-untyped-call]  # unannotated in Textual


class FleetView(Vertical):
    """The overview tab's content: the table, titled with the pace in force."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {f"fleet--{level}" for level in LEVELS}
    DEFAULT_CSS = """
    FleetView > .fleet--ok { color: $success; text-style: not bold; }
    FleetView > .fleet--warn { color: $warning; text-style: not bold; }
    FleetView > .fleet--critical { color: $error; text-style: bold; }
    FleetView > .fleet--muted { text-style: dim; }
    """

    def __init__(
        self, hosts: list[str], rows: Callable[[], list[FleetRow]], *, plan: PollPlan, **kw: Any
    ) -> None:
        super().__init__(id="fleet", classes="fleet", **kw)
        self.hosts = list(hosts)
        self.rows = rows
        """The current rows, one per host in `hosts` order (the app reads them off its controllers)."""
        self.table = FleetTable(id="fleet-table", cursor_type="row", zebra_stripes=True)
        self.plan = plan
        self._shown: dict[str, FleetRow] = {}
        self._styles: dict[str, Style] = {}

    def compose(self) -> ComposeResult:
        yield self.table

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.table.add_column(label, key=key)
        for host in self.hosts:
            self.table.add_row(*(Text("") for _ in COLUMNS), key=host)
        self.table.bound_caches(len(self.hosts))
        self.set_plan(self.plan)
        self.refresh_rows()
        self.set_interval(1.0, self._tick)

    def set_plan(self, plan: PollPlan) -> None:
        self.plan = plan
        over = " (over budget)" if plan.over_budget else ""
        self.border_title = f"fleet · {plan.hosts} hosts · not on screen: {plan.describe()}{over}"
        self.border_subtitle = "the host on screen: its dashboard's own pace · Enter opens · o returns"

    def _tick(self) -> None:
        # Only while the overview is on screen: behind a host's tab its rows would be drawn for nobody.
        if self.is_on_screen:
            self.refresh_rows()

    @property
    def is_on_screen(self) -> bool:
        return self.is_attached and self.display and self.table.region.area > 0

    def refresh_rows(self) -> None:
        """Rows compared with what is drawn; only the cells that changed are updated."""
        self._restyle()
        for row in self.rows():
            before = self._shown.get(row.host)
            if before == row:
                continue
            for i, (key, _) in enumerate(COLUMNS):
                cell = row.cells[i]
                if before is None or before.cells[i] != cell:
                    # A column is measured again only when a cell grows: measuring redraws the table.
                    wider = before is None or len(cell.text) > len(before.cells[i].text)
                    self.table.update_cell(row.host, key, self._text(cell), update_width=wider)
            self._shown[row.host] = row

    def restyle(self) -> None:
        """At once in the app's new theme, on screen or not (the tick redraws only on screen)."""
        self.refresh_rows()

    def _restyle(self) -> None:
        # The component classes' styles follow the theme (Textual applies its CSS again on a change).
        styles = {level: self.get_component_rich_style(f"fleet--{level}", partial=True) for level in LEVELS}
        if styles == self._styles:
            return
        self._styles = styles
        self._shown.clear()  # every cell is drawn again in the theme's colours

    def _text(self, cell: Cell) -> Text:
        style = self._styles.get(cell.level)
        return Text(cell.text, style=style) if style is not None else Text(cell.text)

    def row_text(self, host: str) -> dict[str, str]:
        """The row of `host` as drawn, column key → text (the tests read it)."""
        row = self.table.get_row(host)
        return {key: str(value) for (key, _), value in zip(COLUMNS, row, strict=True)}

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        key = event.row_key.value
        if key is not None:
            self.post_message(HostChosen(key))

    def focus_table(self) -> None:
        self.table.focus()


@dataclass(frozen=True)
class RowInputs:
    """What a host's overview row is made of: its newest snapshot and, from its controller's published
    state, its pairing view, note and firing alerts."""

    snap: HostSnapshot | None
    view: PairingView | None
    note: str | None
    alerts: tuple[Alert, ...]

    def same(self, other: RowInputs) -> bool:
        # Snapshots and views are immutable and replaced when they change: compared by identity.
        return (
            self.snap is other.snap
            and self.view is other.view
            and self.note == other.note
            and self.alerts == other.alerts
        )


class FleetRows:
    """The overview's rows, each from its host's `RowInputs` (`inputs`, which the app reads off the host's
    controller). A row is computed again only when they changed; otherwise only its `last heard` cell
    moves with the clock."""

    def __init__(
        self,
        hosts: list[str],
        inputs: Callable[[str], RowInputs],
        pacer: FleetPacer,
        *,
        target: int | None,
        clock: Callable[[], float],
    ) -> None:
        self.hosts = list(hosts)
        self.inputs = inputs
        self.pacer = pacer
        self.target = target
        self.clock = clock
        self._cache: dict[str, tuple[RowInputs, FleetRow]] = {}

    def rows(self) -> list[FleetRow]:
        now = self.clock()
        # A host sampled every 4 s is never fresher than that: fresh is twice the GPU interval in force.
        fresh = max(FRESH_S, 2 * self.pacer.background.gpu_s)
        rows = []
        for name in self.hosts:
            got = self.inputs(name)
            cached = self._cache.get(name)
            if cached is not None and cached[0].same(got):
                row = cached[1]
            else:
                row = host_row(
                    name, got.snap, target=self.target, alerts=got.alerts, view=got.view, note=got.note
                )
                self._cache[name] = (got, row)
            rows.append(with_seen(row, seen_cell(got.snap, now, fresh)))
        return rows


class FleetPacer:
    """Each host's polling intervals from the fleet's size and which host is on screen."""

    SESSION_KEYS: ClassVar[dict[str, str]] = {"gpu_interval_s": "gpu_s", "server_interval_s": "server_s"}
    PAIRING_KEYS: ClassVar[dict[str, str]] = {"poll_s": "state_poll_s", "heartbeat_s": "heartbeat_s"}

    def __init__(self, entries: list[HostEntry]) -> None:
        self.entries = {e.name: e for e in entries}
        self.size = len(entries)
        # What each entry sets itself stays as it is; the rest follows the plan.
        self.session_keys = {
            e.name: [k for k in self.SESSION_KEYS if getattr(e.session, k) is None] for e in entries
        }
        self.pairing_keys = {
            e.name: [k for k in self.PAIRING_KEYS if getattr(e.pairing, k) is None] for e in entries
        }
        self.on_screen: str | None = None
        self.plans: dict[str, PollPlan] = {}

    @property
    def background(self) -> PollPlan:
        return poll_plan(self.size)

    def show(self, on_screen: str | None, controllers: dict[str, Any] | None = None) -> None:
        """`on_screen`: the host whose dashboard is shown (None: the overview). The plans go into the
        entries (for a session or pairing link started later) and into the running sessions and links
        of `controllers` (name → `HostController`)."""
        self.on_screen = on_screen
        for name, entry in self.entries.items():
            plan = poll_plan(self.size, shown=name == on_screen)
            before = self.plans.get(name)
            self.plans[name] = plan
            paces = {key: getattr(plan, self.SESSION_KEYS[key]) for key in self.session_keys[name]}
            entry.session = replace(entry.session, **paces)
            beats = {key: getattr(plan, self.PAIRING_KEYS[key]) for key in self.pairing_keys[name]}
            entry.pairing = replace(entry.pairing, **beats)
            ctl = controllers.get(name) if controllers is not None else None
            if ctl is not None and plan != before:
                self._retune(name, ctl, plan, before)

    def _retune(self, name: str, ctl: Any, plan: PollPlan, before: PollPlan | None) -> None:
        session = ctl.session
        keys = self.session_keys[name]
        if session is not None and hasattr(session, "set_intervals"):
            session.set_intervals(
                gpu_s=plan.gpu_s if "gpu_interval_s" in keys else None,
                server_s=plan.server_s if "server_interval_s" in keys else None,
            )
        link = ctl.link
        if link is None:
            return
        pairing = self.pairing_keys[name]
        if "poll_s" in pairing:
            link.poll_s = plan.state_poll_s
        if "heartbeat_s" in pairing:
            link.state.board.heartbeat_s = plan.heartbeat_s
        if before is not None and plan.state_poll_s < before.state_poll_s and "poll_s" in pairing:
            link.poke()  # a host brought on screen shows who is there now, not in 16 s
