"""`k26-console confirm HOST [--rollback-now]`: settle a commit-confirmed apply before its deadline.

An apply arms a rollback on the host that fires unless the new boot is verified in time (console.core.
confirm). When the console that applied is gone (killed, its connection or terminal lost), a returning
operator or a pairing partner settles it here: `confirm` verifies the boot the host runs now and, if it
verifies, disarms the rollback; `--rollback-now` disarms it and rolls back at once, phase by phase. Both
take the host's lock and go into the audit trail.

Exit 0 when settled, 1 when nothing is armed or the boot does not verify (the rollback stays armed), 2 on
bad input, 3 when another console holds the host.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from datetime import UTC, datetime

from console.cli.errors import EXIT_OK, CheckFailed, UsageError
from console.cli.hostchange import Printer, render_outcome, take_lock
from console.cli.remote import connected, inventory_host
from console.core.apply import judge
from console.core.audit import AuditEntry
from console.core.profiles import ProfileError
from console.core.text import terminal_safe
from console.sources.profile_store import ProfileStore


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "confirm",
        help="settle the rollback a commit-confirmed apply armed on a host: confirm the boot, or roll back now",
        description=(
            "Verify the boot HOST runs now (pool >= the applied profile's target, ready, no errors since this "
            "boot) and disarm the host-side rollback armed by `apply`; with --rollback-now, disarm it and roll "
            "back at once. Takes the host's lock; audited. Exit 0 when settled, 1 when nothing is armed or the "
            "boot does not verify (the rollback stays armed), 3 when another console holds the host."
        ),
    )
    p.add_argument("host", metavar="HOST", help="a host from hosts.toml or an ssh alias")
    p.add_argument("--rollback-now", action="store_true", help="roll back now instead of confirming")
    p.add_argument("--break-stale-lock", action="store_true", help="break a lock whose holder is gone")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask before breaking a stale lock")
    p.add_argument("--json", action="store_true", help="JSON lines: the progress of a rollback, the outcome")
    p.add_argument("--hosts", metavar="FILE", help="the hosts file (default: hosts.toml in the config dir)")
    p.set_defaults(func=run)


def _target(profile: str | None) -> int:
    """The applied profile's target context (what its boot must hold), else 1 (ready and no errors)."""
    if profile is None:
        return 1
    with contextlib.suppress(ProfileError, OSError):
        return ProfileStore().load(profile).target_context
    return 1


def run(args: argparse.Namespace) -> int:
    from console.sources.confirm import HostRollback
    from console.sources.hoststate import HostStateDir, HostStateError
    from console.sources.service import ServiceController, ServiceError
    from console.sources.transport import TransportError

    host = inventory_host(args.host, args.hosts)
    printer = Printer(args.json)

    async def main() -> str:
        transport = await connected(host)
        try:
            state = HostStateDir(transport, host)
            controller = ServiceController(host, transport)
            guard = HostRollback(controller, state)
            intent = "roll back now" if args.rollback_now else "confirm the boot"
            async with contextlib.AsyncExitStack() as stack:
                await take_lock(stack, state, intent, args)
                pending = await guard.pending()
                if pending is None:
                    raise CheckFailed(f"no host-side rollback is armed on {host.name}: nothing to confirm.")
                if not pending.active:
                    await guard.disarm()  # a record whose timer is gone: cleared, and said so
                    raise CheckFailed(f"{pending.describe(datetime.now(UTC))}.")
                if args.rollback_now:
                    await guard.disarm()
                    outcome = await controller.rollback(progress=printer)
                    await state.append_audit(
                        AuditEntry.from_outcome(
                            outcome, me=state.me, host=host.name, ts=state.now(), action="rollback"
                        )
                    )
                    if not args.json:
                        for line in render_outcome(outcome):
                            print(terminal_safe(line))
                    if not outcome.ok:
                        raise CheckFailed(outcome.summary)
                    return outcome.summary
                boots = await controller._journal_boots()
                target = _target(pending.profile)
                verdict = judge(boots, target) if boots else None
                if verdict is None or not verdict.ok:
                    why = verdict.summary if verdict else "the journal shows no boot"
                    raise CheckFailed(
                        f"not confirmed: {why.rstrip('.')}; {pending.describe(datetime.now(UTC))} "
                        "(--rollback-now rolls back at once)."
                    )
                await guard.disarm()
                summary = (
                    f"confirmed {pending.profile or host.unit_name} on {host.name} ahead of the host-side "
                    f"rollback: {verdict.summary.rstrip('.')}; the rollback is disarmed."
                )
                await state.append_audit(
                    AuditEntry.by(
                        state.me,
                        ts=state.now(),
                        host=host.name,
                        action="confirm",
                        profile=pending.profile,
                        outcome="ok",
                        summary=summary,
                        op_id=pending.op_id,
                        pool_tokens=verdict.max_total_num_tokens,
                    )
                )
                return summary
        except ServiceError as exc:
            raise CheckFailed(f"{str(exc).rstrip('.')}.") from None
        except (HostStateError, TransportError) as exc:
            raise UsageError(f"{str(exc).rstrip('.')}.") from None
        finally:
            await transport.close()

    summary = asyncio.run(main())
    if not args.rollback_now:
        print(terminal_safe(summary))
    return EXIT_OK
