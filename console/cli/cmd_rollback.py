"""`k26-console rollback HOST`: put back the drop-in from before the last apply, restart, verify.

The console's drop-in is replaced by the one it kept (or removed when there was none), systemd reloaded
and the service restarted. Exit 0 when the new boot verifies, 1 when it does not, 2 on bad input (no
drop-in of the console's to roll back), 3 when another console holds the host, 128+N on signal N.
"""

from __future__ import annotations

import argparse

from console.cli.service_change import add_service_options, run_service_change


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "rollback",
        help="put back the drop-in from before the last apply, restart and verify",
        description=(
            "Take the host's lock, restore the drop-in the last apply kept (or remove the console's "
            "drop-in when there was none before), daemon-reload, restart, print the phases with their "
            "timings and verify the new boot as apply does; the intent and the outcome go into the host's "
            "audit trail. Exit 0 when it verifies, 1 when not, 2 on bad input (nothing to roll back), 3 "
            "when another console holds the host."
        ),
    )
    add_service_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return run_service_change(args, "rollback")
