"""`k26-console restart HOST`: restart the service with the flags in force, watch the phases, verify.

Nothing is written and systemd is not reloaded (unreviewed unit edits left on the host are not picked
up). Exit 0 when the new boot verifies (ready, no errors since this boot, memory free at ready), 1 when
it does not, 2 on bad input, 3 when another console holds the host, 128+N when signal N stopped it.
"""

from __future__ import annotations

import argparse

from console.cli.service_change import add_service_options, run_service_change


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "restart",
        help="restart a host's service with the flags in force, watch the phases and verify the boot",
        description=(
            "Take the host's lock, restart UNIT with the ExecStart in force (no drop-in written, no "
            "daemon-reload), print the phases with their timings and verify the new boot as apply does; "
            "the intent and the outcome go into the host's audit trail. Exit 0 when it verifies, 1 when "
            "not, 2 on bad input, 3 when another console holds the host."
        ),
    )
    add_service_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return run_service_change(args, "restart")
