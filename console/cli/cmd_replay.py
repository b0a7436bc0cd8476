"""`k26-console replay FILE [--at TIME] [--json]`: a recording played on the console's own dashboard, or
the `snapshot --json` report of one moment of it.

Nothing in a replay reaches a host: it opens no connection, and the keys and commands that change a host
(apply, restart, roll back, probe, profiles, the lock) do not exist in it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from console.cli.cmd_plan import human_int
from console.cli.errors import EXIT_CHECK_FAILED, EXIT_OK, UsageError
from console.core.text import json_safe, terminal_safe

if TYPE_CHECKING:
    from console.sources.alerts import AlertConfig


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "replay",
        help="play a recording (k26-console record, --record, W) on the console's dashboard",
        description=(
            "Open the console's dashboard over FILE: play/pause (space), step (.), seek ±10 s (←/→) and "
            "±1 min ([ ]), to the next restart phase or error (n), to a time (g), speed 0.25-8x (+/-). "
            "With --json, print what `snapshot --json` printed at --at instead (exit 1 when an alert "
            "fired then, as snapshot does)."
        ),
    )
    p.add_argument("file", type=Path, metavar="FILE", help="a recording")
    p.add_argument(
        "--at",
        metavar="TIME",
        help="where to start (or the moment --json reports): 90s, +5m, -30s (from the end: write --at=-30s), "
        "03:12:07 (UTC), an ISO time, start (the recording's first state) or end",
    )
    p.add_argument(
        "--json", action="store_true", help="print the snapshot --json report at --at (default: the end)"
    )
    p.add_argument("--host", metavar="NAME", help="the host of a recording of several (--json)")
    p.add_argument("--speed", type=float, default=1.0, help="playing speed, 0.25 to 8 (default 1)")
    p.add_argument(
        "--target-context",
        type=human_int,
        metavar="N",
        help="the context the KV gauge measures the pool against",
    )
    p.add_argument("--profile", metavar="NAME", help="take the gauge's target from this saved profile")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from console.core.recording import parse_at
    from console.sources.recording import RecordingError, RecordingReader
    from console.sources.replay import Replay

    if not 0.25 <= args.speed <= 8:
        raise UsageError(f"--speed must be between 0.25 and 8, not {args.speed:g}.")
    try:
        reader = RecordingReader(args.file)
    except RecordingError as exc:
        raise UsageError(f"{str(exc).rstrip('.')}.") from None
    if not reader.chunks:
        raise UsageError(f"{args.file} holds no recorded input yet.")
    try:
        # Its start is the recording's first state (the hosts' journal backlogs read), not its first input.
        replay = Replay(reader)
        at: float | None = None
        if args.at is not None:
            try:
                at = parse_at(args.at, replay.start, replay.end)
            except ValueError as exc:
                raise UsageError(f"{str(exc).rstrip('.')}.") from None
        if args.json:
            return _print_json(replay, args, reader.end if at is None else at)
        from console.cli.cmd_console import require_terminal, run_console
        from console.tui.replay import ReplayApp

        require_terminal("k26-console replay")
        alerts = _alert_rules()
        return run_console(ReplayApp(replay, args.file, at=at, speed=args.speed, alerts=alerts))
    except RecordingError as exc:
        raise UsageError(f"{str(exc).rstrip('.')}.") from None
    finally:
        reader.close()


def _alert_rules() -> AlertConfig:
    """The `[alerts]` rules of the default hosts file, else the default set (a replay never runs the
    hook nor rings the bell)."""
    from console.sources.alerts import AlertConfigError, load_alert_config

    try:
        return load_alert_config(None)
    except AlertConfigError as exc:
        raise UsageError(str(exc)) from None


def _print_json(replay: object, args: argparse.Namespace, at: float) -> int:
    from console.cli.cmd_console import resolve_target
    from console.cli.cmd_snapshot import ServiceReading, report_of
    from console.core.alerts import service_state_of_boot
    from console.core.serving import DEFAULT_WINDOW_S, serving_figures
    from console.sources.replay import Replay
    from console.tui.view import display_boot

    assert isinstance(replay, Replay)
    names = replay.host_names
    if args.host is not None and args.host not in names:
        raise UsageError(
            f"{args.file} holds no host {terminal_safe(args.host)!r} (it holds {', '.join(names)})."
        )
    if args.host is None and len(names) != 1:
        raise UsageError(f"{args.file} holds {len(names)} hosts ({', '.join(names)}); name one with --host.")
    name = args.host or names[0]
    replay.seek(at)
    snap = replay.snapshot(name)
    boot = display_boot(snap.state)
    figures = snap.serving or serving_figures([], window_s=DEFAULT_WINDOW_S)
    # The live console reads the service's state from the journal's unit lines, and so does a replay.
    svc = ServiceReading(active_state=service_state_of_boot(boot))
    report = report_of(
        name,
        snap,
        svc,
        replay.hosts[name].view,
        figures,
        resolve_target(args),
        _alert_rules(),
        [],
        taken_at=replay.position,
    )
    print(json_safe(json.dumps(report.model_dump(mode="json"), ensure_ascii=False)))
    return EXIT_CHECK_FAILED if report.problems else EXIT_OK
