"""One row of the fleet overview, computed from a host's newest snapshot without Textual or I/O.

The overview reads the very snapshots the dashboards show (and the controller's firing alerts and
pairing view): each figure here is the one the host's dashboard prints, in fewer words. Levels name
how a cell is coloured (`ok`, `warn`, `critical`, `muted`); the widget maps them onto the theme.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from console.core.alerts import Alert, worst
from console.core.events import DecodeBatch
from console.core.export import verdict_ok
from console.core.pairing import PairingView
from console.core.snapshot import ConnState, HostSnapshot
from console.core.text import terminal_safe
from console.tui.view import display_boot, fmt_duration, fmt_tokens, freshest, kv_gauge, unit_state

COLUMNS: tuple[tuple[str, str], ...] = (
    ("host", "host"),
    ("state", "service"),
    ("pool", "pool / target"),
    ("verdict", "verdict"),
    ("gen", "gen tok/s"),
    ("alert", "alert"),
    ("lock", "lock · consoles"),
    ("seen", "last heard"),
)
"""(key, header) of each column, in order."""

FRESH_S = 5.0
STALE_S = 30.0
"""A host heard from longer ago than this is shown as such even while its link says up."""


@dataclass(frozen=True)
class Cell:
    text: str
    level: str = "normal"
    """`normal`, `ok`, `warn`, `critical` or `muted`."""


@dataclass(frozen=True)
class FleetRow:
    host: str
    cells: tuple[Cell, ...]
    """One per column of `COLUMNS`."""
    unreachable: bool = False

    def cell(self, key: str) -> Cell:
        return self.cells[[k for k, _ in COLUMNS].index(key)]


def _state(snap: HostSnapshot | None, note: str | None) -> tuple[Cell, bool]:
    if snap is None:
        return Cell(note or "not connected", "muted"), False
    conn = snap.connection
    if conn is not None and conn.state in (ConnState.RETRYING, ConnState.FAILED):
        # The link is down: what the journal said last is not news about the host now.
        return Cell(f"unreachable: {conn.describe()}", "critical"), True
    if conn is not None and conn.state is ConnState.CONNECTING:
        return Cell("connecting", "muted"), False
    boot = display_boot(snap.state)
    state = unit_state(snap, boot)
    level = "ok" if state == "ready" else "critical" if state.startswith("failed") else "warn"
    if boot is None:
        level = "muted"
    return Cell(state, level), False


def _gen_tok_s(snap: HostSnapshot) -> float | None:
    """The serving window's generation rate, else the newest decode line's (as the dashboard's chart)."""
    if snap.serving is not None and snap.serving.gen_tok_s is not None:
        return snap.serving.gen_tok_s
    for event in reversed(snap.recent):
        if isinstance(event, DecodeBatch) and event.gen_throughput is not None:
            return event.gen_throughput
    return None


def _lock(view: PairingView | None) -> Cell:
    if view is None:
        return Cell("—", "muted")
    consoles = len(view.presence)
    if view.lock is None:
        return Cell(f"free · {consoles}", "normal")
    who = terminal_safe(view.lock.holder.who)
    intent = terminal_safe(view.lock.intent)
    if view.lock_stale:
        return Cell(f"STALE {who}: {intent} · {consoles}", "critical")
    return Cell(f"{who}: {intent} · {consoles}", "warn")


def _alert(firing: Iterable[Alert]) -> Cell:
    alerts = list(firing)
    top = worst(alerts)
    if top is None:
        return Cell("none", "muted")
    more = f" +{len(alerts) - 1}" if len(alerts) > 1 else ""
    return Cell(f"{top.rule}{more}", "critical" if top.severity == "critical" else "warn")


def seen_cell(snap: HostSnapshot | None, now: float, fresh_s: float = FRESH_S) -> Cell:
    """When the host was last heard from. Under `fresh_s` (the overview passes twice the GPU interval in
    force: a host sampled every 4 s is never fresher than that) it reads `< Ns ago`; older, it counts in
    5-second steps, so a row is redrawn at most every 5 s rather than every second."""
    stamp = freshest(snap) if snap is not None else None
    if snap is None:
        return Cell("—", "muted")
    if stamp is None:
        return Cell("never", "muted")
    age = max(0.0, now - stamp)
    if age < fresh_s:
        return Cell(f"< {fresh_s:g}s ago", "ok")
    shown = age if age >= 60 else 5 * (age // 5)
    return Cell(f"{fmt_duration(shown)} ago", "warn" if age < STALE_S else "critical")


def fleet_row(
    host: str,
    snap: HostSnapshot | None,
    *,
    target: int | None,
    alerts: Iterable[Alert] = (),
    view: PairingView | None = None,
    now: float,
    note: str | None = None,
    fresh_s: float = FRESH_S,
) -> FleetRow:
    """The row of `host`: `snap` is its newest snapshot (None before the first), `target` the
    console's target context, `alerts` the firing ones, `view` its presence and lock, `now` the
    console's clock, `note` what the header says before a session exists (starting, failed)."""
    row = host_row(host, snap, target=target, alerts=alerts, view=view, note=note)
    return with_seen(row, seen_cell(snap, now, fresh_s))


def with_seen(row: FleetRow, seen: Cell) -> FleetRow:
    """The row with its `last heard` cell (the one cell that moves with the clock alone)."""
    return FleetRow(row.host, (*row.cells[:-1], seen), row.unreachable)


def host_row(
    host: str,
    snap: HostSnapshot | None,
    *,
    target: int | None,
    alerts: Iterable[Alert] = (),
    view: PairingView | None = None,
    note: str | None = None,
) -> FleetRow:
    """Every cell but `last heard` (left blank): what only a new snapshot, alert or view can change."""
    name = terminal_safe(host)
    state, unreachable = _state(snap, note)
    blank = Cell("—", "muted")
    if snap is None:
        return FleetRow(host, (Cell(name), state, blank, blank, blank, _alert(alerts), _lock(view), blank))
    gauge = kv_gauge(snap, target=target)
    if gauge.pool_tokens is None:
        pool = Cell("—", "muted")
    else:
        goal = f" / {fmt_tokens(gauge.target)}" if gauge.target is not None else ""
        level = {"ok": "ok", "warn": "warn", "critical": "critical"}.get(gauge.level, "muted")
        pool = Cell(f"{fmt_tokens(gauge.pool_tokens)}{goal}", level)
    verdict = verdict_ok(snap.state.boots, target)
    verdict_cell = (
        Cell("—", "muted") if verdict is None else Cell("ok", "ok") if verdict else Cell("not ok", "critical")
    )
    gen = _gen_tok_s(snap)
    gen_cell = Cell(f"{gen:,.1f}" if gen is not None else "—", "normal" if gen is not None else "muted")
    cells = (Cell(name), state, pool, verdict_cell, gen_cell, _alert(alerts), _lock(view), blank)
    return FleetRow(host, cells, unreachable)
