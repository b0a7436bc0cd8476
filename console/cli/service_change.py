"""What `restart HOST` and `rollback HOST` share: their options, and the change itself, run with the
lock, phases, verification and audit trail of `apply` (console.cli.hostchange)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from console.cli.errors import UsageError
from console.cli.hostchange import (
    BeforeChange,
    ChangeRun,
    Printer,
    add_lock_options,
    add_verify_options,
    ask,
    audited,
    change_host,
    confirm_restart,
)
from console.cli.remote import inventory_host
from console.core.apply import ApplyOutcome, ApplyProgress
from console.core.audit import AuditAction

if TYPE_CHECKING:  # the SSH stack loads only when a command needs it
    from console.sources.hoststate import HostStateDir
    from console.sources.transport import Transport


def add_service_options(p: argparse.ArgumentParser) -> None:
    """The options `restart` and `rollback` share with `apply`."""
    p.add_argument("host", metavar="HOST", help="a host from hosts.toml or an ssh alias")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask before restarting the service")
    p.add_argument("--json", action="store_true", help="JSON lines: each phase, then the outcome")
    add_lock_options(p)
    add_verify_options(p)


def run_service_change(args: argparse.Namespace, action: AuditAction) -> int:
    """`restart` or `rollback` HOST: under the lock, with the phases, the verification and the audit
    trail of `apply`. A host-side rollback still armed by a commit-confirmed apply is settled first
    (`k26-console confirm`): restarting under it would race its timer."""
    from console.sources.confirm import HostRollback
    from console.sources.service import ServiceController

    if args.min_free_gib < 0 or args.boot_timeout <= 0:
        raise UsageError("--min-free-gib must not be negative, --boot-timeout must be positive.")
    host = inventory_host(args.host, args.hosts)
    unit = host.unit_name
    title = f"restart of {unit}" if action == "restart" else "rollback"
    printer = Printer(args.json, tag_rollback=False)
    change = ChangeRun(action, title)

    async def operate(transport: Transport, state: HostStateDir) -> tuple[ApplyOutcome, str | None]:
        controller = ServiceController(
            host,
            transport,
            min_free_gib=args.min_free_gib,
            boot_timeout_s=args.boot_timeout,
        )
        change.phase = "validate"
        armed = await HostRollback(controller, state).pending()
        if armed is not None and armed.active:
            raise UsageError(
                f"{armed.describe(datetime.now(UTC)).rstrip('.')}; settle it first with k26-console confirm "
                f"{host.name} (--rollback-now rolls back); the host is unchanged."
            )
        change.phase = "confirm"
        if not args.yes:
            what = (
                f"Restart {unit} on {host.name} with the flags in force"
                if action == "restart"
                else f"Roll back {unit} on {host.name} to the drop-in before the last apply"
            )
            await ask(
                confirm_restart,
                f"{what}?",
                f"not done: the {title} on {host.name} was not confirmed.",
                f"{action} restarts {unit} on {host.name} and there is no terminal to confirm on; "
                "run it with --yes.",
            )

        def progress(p: ApplyProgress) -> None:
            change.saw(p)
            printer(p)

        async def operation(before_change: BeforeChange) -> ApplyOutcome:
            if action == "restart":
                return await controller.restart(progress=progress, before_change=before_change)
            return await controller.rollback(progress=progress, before_change=before_change)

        return await audited(state, host, change, operation)

    return change_host(host, change, args, operate)
