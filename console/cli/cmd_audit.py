"""`k26-console audit HOST`: who changed what on the host, when, and how it ended (newest last).

A change is written twice (its intent before, its outcome after, paired by `op_id`); this shows one line
per change, and an intent with no outcome as in progress (its console holds the lock) or UNFINISHED,
interrupted (its console is gone). Everything read from the host is printed through `terminal_safe`:
an escape sequence in a user name, a profile name or a diff line never reaches the terminal.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from console.cli.errors import EXIT_OK, UsageError
from console.core.audit import AuditEntry, AuditLog, AuditRecord
from console.core.text import json_safe, terminal_safe

if TYPE_CHECKING:  # rich draws the table only: `audit --json` (what scripts run) never imports it
    from rich.table import Table


class AuditReport(BaseModel, defer_build=True):
    """The `audit --json` contract."""

    host: str
    state_dir: str
    entries: list[AuditRecord] = Field(default_factory=list)
    """One per change, oldest first, the last `--limit` of them: the outcome entry (with `started_at`,
    the time of its intent), or an intent without an outcome (`status` in_progress or unfinished)."""
    total: int
    """Changes in the whole trail (an intent and its outcome count once)."""
    skipped: int
    """Lines of audit.jsonl that could not be read (a torn or foreign line); they are left out."""
    unfinished: int = 0
    """Intents with no outcome whose console is gone: applies that were interrupted."""
    trail: list[AuditEntry] = Field(default_factory=list)
    """Every readable line as written, intents included, oldest first (not limited by --limit)."""
    cut: str | None = None
    """What was left out of a trail longer than the part read (its last 1 MiB), in one sentence; the
    figures above are of that part."""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--limit must be at least 1, not {value}")
    return value


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "audit",
        help="who changed what on a host, when, and how it ended",
        description=(
            "Print the host's audit trail (audit.jsonl in its state directory, read over SSH): one line "
            "per apply, restart, rollback, probe and lock break, newest last, with who, when, the "
            "profile, the outcome and the phase durations. Exit 2 when the host cannot be reached."
        ),
    )
    p.add_argument("host", metavar="HOST", help="a hosts-file name or an ssh alias")
    p.add_argument("--hosts", metavar="FILE", help="the hosts file (default: hosts.toml in the config dir)")
    p.add_argument("--limit", type=_positive, metavar="N", help="only the last N entries")
    p.add_argument("--json", action="store_true", help="print one JSON object with the entries")
    p.set_defaults(func=run)


def _read(name: str, hosts_file: str | None) -> tuple[str, AuditLog, list[AuditRecord], str | None]:
    import asyncio

    from console.cli.remote import inventory_host
    from console.sources.hosts import HostsError
    from console.sources.hoststate import HostStateDir, HostStateError
    from console.sources.transport import Backoff, Transport, TransportError

    host = inventory_host(name, hosts_file, strict=False)  # a typo is refused before any connection

    async def fetch() -> tuple[str, AuditLog, list[AuditRecord], str | None]:
        transport = Transport(host, backoff=Backoff(max_attempts=3))
        try:
            # Reading identifies nobody: no heartbeat is written, so `audit` leaves no trace on the host.
            state = HostStateDir(transport, host)
            log, records, _ = await state.audit.read_records()
            return host.state_dir, log, records, state.audit.cut
        finally:
            await transport.close()

    try:
        return asyncio.run(fetch())
    except (HostsError, TransportError, HostStateError) as exc:
        raise UsageError(f"{str(exc).rstrip('.')}.") from None


def _json_text(data: object) -> str:
    """JSON with non-ASCII text kept readable, but DEL, the C1 controls (0x9b is a one-byte CSI), the
    line separators and the bidi and zero-width characters escaped as json.dumps escapes C0: still the
    same JSON, and inert on a terminal."""
    return json_safe(json.dumps(data, ensure_ascii=False))


_OUTCOME_STYLE = {"ok": "green", "refused": "yellow", "started": "cyan"}


def _table(records: list[AuditRecord]) -> Table:
    """One row per change; under it, FORCED with why, and its flag diff, finished or not (what was
    changed is the point of the trail). Every cell is drawn safe: all of it comes from the host."""
    from console.cli.tables import cell, table

    rows = table("when", "who", "action", "profile", "outcome", "what", wrap=("what",))
    for record in records:
        when = record.ts.astimezone().strftime("%Y-%m-%d %H:%M:%S")
        cols = [when, record.who, record.action, record.profile or "-", record.outcome]
        line = record.trail_line()
        prefix = "  ".join(cols) + "  "
        what = line.removeprefix(prefix)
        outcome_style = _OUTCOME_STYLE.get(record.outcome, "red")
        rows.add_row(*(cell(c) for c in cols[:4]), cell(record.outcome, outcome_style), cell(what))
        if record.forced:
            rows.add_row("", "", "", "", "", cell(f"FORCED: {record.forced}", "bold red"))
        for diff_line in record.diff:
            rows.add_row("", "", "", "", "", cell(f"  {diff_line}", "dim"))
    return rows


def run(args: argparse.Namespace) -> int:
    state_dir, log, records, cut = _read(args.host, args.hosts)
    shown = records[-args.limit :] if args.limit else records
    unfinished = sum(1 for r in records if r.status == "unfinished")
    if args.json:
        report = AuditReport(
            host=args.host,
            state_dir=state_dir,
            entries=shown,
            total=len(records),
            skipped=log.skipped,
            unfinished=unfinished,
            trail=log.entries,
            cut=cut,
        )
        sys.stdout.write(_json_text(report.model_dump(mode="json")) + "\n")
        return EXIT_OK
    if not records:
        sys.stdout.write(
            f"no audit entries on {terminal_safe(args.host)} (in {terminal_safe(state_dir)}/audit.jsonl).\n"
        )
    if shown:
        from console.cli.tables import render

        sys.stdout.write(render(_table(shown)))
    if cut is not None:
        sys.stderr.write(f"k26-console: {terminal_safe(cut)}\n")
    if log.skipped:
        sys.stderr.write(
            f"k26-console: skipped {log.skipped} unreadable line(s) of {terminal_safe(state_dir)}/audit.jsonl "
            f"on {terminal_safe(args.host)}.\n"
        )
    return EXIT_OK
