"""`k26-console twin`: a GPU host in a box, reachable over SSH on loopback, until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

import platformdirs

from console.cli.errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "twin",
        help="run a simulated GPU host (SGLang, systemd, journal, nvidia-smi) reachable over SSH",
        description=(
            "Start a twin host on 127.0.0.1: prints the path of its hosts.toml and an ssh command that "
            "reaches it, then runs until interrupted."
        ),
    )
    p.add_argument("--port", type=int, default=0, help="SSH port on 127.0.0.1 (default: a free one)")
    p.add_argument(
        "--state-dir", type=Path, help="where the twin keeps its files (default: the user state dir)"
    )
    p.add_argument("--name", default="twin", help="host name in hosts.toml (default: twin)")
    p.add_argument("--scenario", default=None, help="simulated deployment (default: kimi-k26-rtx6000)")
    p.add_argument(
        "--time-scale", type=float, default=None, help="startup time multiplier (1.0 is real time)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from console.twin.host import DEFAULT_SCENARIO, TwinError, TwinHost

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, not {args.port}.")
    if args.time_scale is not None and not 0 < args.time_scale <= 100:
        raise UsageError(f"--time-scale must be a positive number up to 100, not {args.time_scale}.")
    name = args.name.strip()
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise UsageError(
            f"--name must be a host name of letters, digits, '-', '_' or '.', not {args.name!r}."
        )
    state_dir = args.state_dir or Path(platformdirs.user_state_dir("k26-console")) / "twins" / name
    twin = TwinHost(
        state_dir,
        name=name,
        scenario=args.scenario or DEFAULT_SCENARIO,
        time_scale=args.time_scale,
        ssh_port=args.port,
    )

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await twin.start()
        except TwinError as exc:
            raise UsageError(f"{exc}.") from None
        try:
            print(twin.hosts_toml, flush=True)
            print(twin.ssh_command(), flush=True)
            await stop.wait()
        finally:
            sys.stderr.write("k26 twin: stopping the service and the host.\n")
            await twin.stop()
        return 0

    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(main())
    return 130
