"""What `restart HOST` and `rollback HOST` share: their options, and the change itself, run through the
one change protocol (console.sources.change) with the lock, phases, verification and audit trail of
`apply`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from console.cli.errors import UsageError
from console.cli.hostchange import (
    ChangeRequest,
    Printer,
    add_lock_options,
    add_verify_options,
    ask,
    change_host,
    confirm_restart,
    json_line,
    out,
)
from console.cli.remote import inventory_host
from console.core.audit import AuditAction
from console.core.text import terminal_safe

if TYPE_CHECKING:  # the SSH stack loads only when a command needs it
    from console.core.apply import RollbackPreview
    from console.sources.change import ChangeResult, HostChange, HostChanger
    from console.sources.service import ServiceController
    from console.sources.transport import Transport


def add_service_options(p: argparse.ArgumentParser) -> None:
    """The options `restart` and `rollback` share with `apply`."""
    p.add_argument("host", metavar="HOST", help="a host from hosts.toml or an ssh alias")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask before restarting the service")
    p.add_argument("--json", action="store_true", help="JSON lines: each phase, then the outcome")
    add_lock_options(p)
    add_verify_options(p)


def render_rollback_preview(pv: RollbackPreview) -> list[str]:
    """The preview's lines, each drawn safe: the target and the diff quote the host's drop-ins."""
    lines = [f"rollback of {pv.unit} on {pv.host}: back to {pv.target}"]
    if pv.diff:
        lines.append("changes to the running ExecStart:")
        lines.extend(f"  {d}" for d in pv.diff)
    else:
        lines.append("no change to the running ExecStart (the unit restarts with the same flags).")
    return [terminal_safe(line) for line in lines]


def run_service_change(args: argparse.Namespace, action: AuditAction) -> int:
    """`restart` or `rollback` HOST: under the lock, with the phases, the verification and the audit
    trail of `apply`. A host-side rollback still armed by a commit-confirmed apply is settled first
    (`k26-console confirm`): restarting under it would race its timer."""
    from console.sources.change import ChangePolicy

    if args.min_free_gib < 0 or args.boot_timeout <= 0:
        raise UsageError("--min-free-gib must not be negative, --boot-timeout must be positive.")
    host = inventory_host(args.host, args.hosts)
    unit = host.unit_name
    title = f"restart of {unit}" if action == "restart" else "rollback"
    printer = Printer(args.json, tag_rollback=False)
    past_first = bool(getattr(args, "to_unit_default", False))

    def controller(transport: Transport) -> ServiceController:
        from console.sources.service import ServiceController

        return ServiceController(
            host, transport, min_free_gib=args.min_free_gib, boot_timeout_s=args.boot_timeout
        )

    async def operate(changer: HostChanger, change: HostChange) -> ChangeResult:
        await changer.refuse_if_armed(change)
        if action == "rollback":
            pv = await changer.ctl.rollback_preview()
            if args.json:
                json_line("preview", pv.model_dump(mode="json"))
            else:
                for line in render_rollback_preview(pv):
                    out(line)
            if pv.past_first and not past_first:
                raise UsageError(
                    f"{changer.ctl.dropin_path} is the console's first drop-in on {host.name}: rolling it back "
                    "removes it and the unit runs its own ExecStart; pass --to-unit-default to do that. "
                    "The host is unchanged."
                )
        change.phase = "confirm"
        if not args.yes:
            what = (
                f"Restart {unit} on {host.name} with the flags in force"
                if action == "restart"
                else f"Roll back {unit} on {host.name} as shown above"
            )
            await ask(
                confirm_restart,
                f"{what}?",
                f"not done: the {title} on {host.name} was not confirmed.",
                f"{action} restarts {unit} on {host.name} and there is no terminal to confirm on; "
                "run it with --yes.",
            )
        if action == "restart":
            return await changer.restart(change, ChangePolicy(), progress=printer)
        return await changer.rollback(change, ChangePolicy(past_first=past_first), progress=printer)

    return change_host(host, ChangeRequest(action, title), args, controller, operate)
