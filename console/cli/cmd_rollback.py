"""`k26-console rollback HOST`: put back the drop-in from before the last apply, restart, verify.

The console's drop-in is replaced by the one it kept, systemd reloaded and the service restarted; the
target and the flags that change are shown first. When there is none kept (the console's drop-in is its
first on the host), the rollback removes it only with --to-unit-default. Exit 0 when the new boot
verifies, 1 when it does not, 2 on bad input (no drop-in of the console's to roll back, or a first one
without --to-unit-default), 3 when another console holds the host, 128+N on signal N.
"""

from __future__ import annotations

import argparse

from console.cli.service_change import add_service_options, run_service_change


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "rollback",
        help="put back the drop-in from before the last apply, restart and verify",
        description=(
            "Take the host's lock, show where the rollback goes and the flags it changes, restore the "
            "drop-in the last apply kept (or, with --to-unit-default, remove the console's first drop-in), "
            "daemon-reload, restart, print the phases with their "
            "timings and verify the new boot as apply does; the intent and the outcome go into the host's "
            "audit trail. Exit 0 when it verifies, 1 when not, 2 on bad input (nothing to roll back), 3 "
            "when another console holds the host."
        ),
    )
    add_service_options(p)
    p.add_argument(
        "--to-unit-default",
        action="store_true",
        help=(
            "when the console's drop-in is its first on the host (no earlier one kept), remove it: the unit "
            "then runs its own ExecStart. Without it such a rollback is refused, so a repeated rollback never "
            "goes back further than meant"
        ),
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return run_service_change(args, "rollback")
