"""`k26-console audit HOST`: who changed what on the host, when, and how it ended (newest last)."""

from __future__ import annotations

import argparse
import json
import sys

from pydantic import BaseModel, Field

from console.cli.errors import EXIT_OK, UsageError
from console.core.pairing import AuditEntry, AuditLog


class AuditReport(BaseModel):
    """The `audit --json` contract."""

    host: str
    state_dir: str
    entries: list[AuditEntry] = Field(default_factory=list)
    """Oldest first, the last `--limit` of them."""
    total: int
    """Readable entries in the whole trail."""
    skipped: int
    """Lines of audit.jsonl that could not be read (a torn or foreign line); they are left out."""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("--limit must be at least 1")
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


def _read(name: str, hosts_file: str | None) -> tuple[str, AuditLog]:
    import asyncio

    from console.sources.hosts import HostsError, load_hosts, resolve_host
    from console.sources.hoststate import HostStateDir, HostStateError
    from console.sources.transport import Backoff, Transport, TransportError

    async def fetch() -> tuple[str, AuditLog]:
        host = resolve_host(name, load_hosts(hosts_file))
        transport = Transport(host, backoff=Backoff(max_attempts=3))
        try:
            # Reading identifies nobody: no heartbeat is written, so `audit` leaves no trace on the host.
            return host.state_dir, await HostStateDir(transport, host).read_audit_log()
        finally:
            await transport.close()

    try:
        return asyncio.run(fetch())
    except (HostsError, TransportError, HostStateError) as exc:
        raise UsageError(f"{str(exc).rstrip('.')}.") from None


def run(args: argparse.Namespace) -> int:
    state_dir, log = _read(args.host, args.hosts)
    entries = log.entries[-args.limit :] if args.limit else log.entries
    if args.json:
        report = AuditReport(
            host=args.host, state_dir=state_dir, entries=entries, total=len(log.entries), skipped=log.skipped
        )
        sys.stdout.write(json.dumps(report.model_dump(mode="json"), ensure_ascii=False) + "\n")
        return EXIT_OK
    if not log.entries:
        sys.stdout.write(f"no audit entries on {args.host} (in {state_dir}/audit.jsonl).\n")
    for entry in entries:
        sys.stdout.write(entry.trail_line() + "\n")
    if log.skipped:
        sys.stderr.write(
            f"k26-console: skipped {log.skipped} unreadable line(s) of {state_dir}/audit.jsonl on {args.host}.\n"
        )
    return EXIT_OK
