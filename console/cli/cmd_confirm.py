"""`k26-console confirm HOST [--rollback-now]`: settle a commit-confirmed apply before its deadline.

An apply arms a rollback on the host that fires unless the new boot is verified in time (console.core.
confirm). When the console that applied is gone (killed, its connection or terminal lost), a returning
operator or a pairing partner settles it here: `confirm` verifies the boot the host runs now and, if it
verifies, disarms the rollback; `--rollback-now` disarms it and rolls back at once, phase by phase. Both
run through the one change protocol (console.sources.change): the host's lock, the audit trail. The
confirmation and the host's timer cannot both win: what is reported is what the host's record says.

Exit 0 when settled, 1 when nothing is armed, the boot does not verify (the rollback stays armed) or the
host's rollback fired first, 2 on bad input, 3 when another console holds the host.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from console.cli.errors import CheckFailed
from console.cli.hostchange import ChangeRequest, Printer, change_host
from console.cli.remote import inventory_host
from console.core.apply import ApplyOutcome

if TYPE_CHECKING:
    from console.sources.change import ChangeResult, HostChange, HostChanger
    from console.sources.service import ServiceController
    from console.sources.transport import Transport


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "confirm",
        help="settle the rollback a commit-confirmed apply armed on a host: confirm the boot, or roll back now",
        description=(
            "Verify the boot HOST runs now (pool >= the applied profile's target, ready, no errors since this "
            "boot) and disarm the host-side rollback armed by `apply`; with --rollback-now, disarm it and roll "
            "back at once. Takes the host's lock; audited. Exit 0 when settled, 1 when nothing is armed, the "
            "boot does not verify (the rollback stays armed) or the host's rollback fired first, 3 when "
            "another console holds the host."
        ),
    )
    p.add_argument("host", metavar="HOST", help="a host from hosts.toml or an ssh alias")
    p.add_argument("--rollback-now", action="store_true", help="roll back now instead of confirming")
    p.add_argument("--break-stale-lock", action="store_true", help="break a lock whose holder is gone")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask before breaking a stale lock")
    p.add_argument("--json", action="store_true", help="JSON lines: the progress of a rollback, the outcome")
    p.add_argument("--hosts", metavar="FILE", help="the hosts file (default: hosts.toml in the config dir)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from console.sources.change import ChangeResult, NotSettled

    host = inventory_host(args.host, args.hosts)
    printer = Printer(args.json)

    def controller(transport: Transport) -> ServiceController:
        from console.sources.service import ServiceController

        return ServiceController(host, transport)

    async def operate(changer: HostChanger, change: HostChange) -> ChangeResult:
        try:
            result = await changer.confirm(change, rollback_now=args.rollback_now, progress=printer)
        except NotSettled as exc:
            raise CheckFailed(f"{str(exc).rstrip('.')}.") from None
        if result.outcome is not None:  # --rollback-now: the rollback's outcome, printed as apply's
            return ChangeResult(result.outcome, unrecorded=result.unrecorded)
        if not result.ok:
            raise CheckFailed(result.summary)
        outcome = ApplyOutcome(ok=True, profile=change.profile or host.unit_name, summary=result.summary)
        return ChangeResult(outcome, unrecorded=result.unrecorded)

    req = (
        ChangeRequest("rollback", "roll back now")
        if args.rollback_now
        else ChangeRequest("confirm", "confirm the boot")
    )
    return change_host(host, req, args, controller, operate)
