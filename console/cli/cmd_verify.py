"""`k26-console verify`: after a restart, does the server really hold the target? One line, exit 0 or 1."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime

from console.cli.argtypes import human_int
from console.cli.errors import EXIT_OK, CheckFailed, UsageError
from console.cli.remote_journal import remote_boots
from console.core.apply import Verdict, judge
from console.core.confirm import PendingRollback
from console.core.text import json_safe, terminal_safe

__all__ = ["Verdict", "judge", "register", "run"]  # the verdict lives in core.apply, shared with `apply`


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "verify",
        help="the post-restart verdict: pool >= target, server ready, no errors since this boot",
        description=(
            "Judge the LATEST boot in a journal: the KV pool holds the target, the server is ready, and no "
            "error happened since this boot (errors of earlier boots are listed as stale). "
            "Exit 0 when it holds, 1 when not, 2 on bad input."
        ),
    )
    p.add_argument(
        "--target-context", type=human_int, required=True, metavar="N", help="tokens the pool must hold"
    )
    p.add_argument("--journal", metavar="FILE", help="journal text or JSON ('-' for standard input)")
    p.add_argument(
        "host",
        nargs="?",
        metavar="HOST",
        help="read the unit's journal on HOST over SSH (a hosts-file name or an ssh alias)",
    )
    p.add_argument("--hosts", metavar="FILE", help="the hosts file (default: hosts.toml in the config dir)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.host and args.journal:
        raise UsageError("give either HOST or --journal FILE, not both.")
    pending: PendingRollback | None = None
    if args.host:
        boots, pending = remote_boots(args.host, args.hosts, with_pending=True)
    elif not args.journal:
        raise UsageError(
            "give the journal to judge with --journal FILE ('-' reads standard input) or a HOST."
        )
    else:
        from console.cli.cmd_plan import read_boots  # the planner's file reader, for a file only

        boots = read_boots(args.journal)
    verdict = judge(boots, args.target_context)
    if args.json:
        doc = verdict.model_dump(mode="json")
        if args.host:
            # Armed by a commit-confirmed apply and not yet confirmed: deadline, who, which profile.
            doc["pending_rollback"] = pending.model_dump(mode="json") if pending else None
        sys.stdout.write(json_safe(json.dumps(doc, ensure_ascii=False)) + "\n")
    elif verdict.ok:
        # The summary quotes the journal (error messages, the model path): drawn, never sent raw.
        sys.stdout.write(terminal_safe(verdict.summary) + "\n")
    if pending is not None and not args.json:
        sys.stderr.write(terminal_safe(pending.describe(datetime.now(UTC))) + ".\n")
    if not verdict.ok:
        raise CheckFailed(verdict.summary)
    return EXIT_OK
