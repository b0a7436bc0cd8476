"""`k26-console demo`: the console on a simulated 8-GPU host (a twin) started in this process."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from console.cli.cmd_console import (
    add_target_options,
    add_theme_option,
    require_terminal,
    resolve_target,
    resolve_theme,
    say_why_ended,
)
from console.cli.cmd_twin import scenario_argument, state_dir_argument
from console.cli.errors import UsageError

DEMO_TARGET = 200_000
"""The incident's goal: a 200k-token context (the twin boots with the first, too small, flags)."""
DEMO_PROFILE = "ctx-200k"
DEMO_TIME_SCALE = 0.02
"""A five-minute restart plays in about six seconds."""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "demo",
        help="the console on a simulated 8-GPU SGLang host (no GPU, no network: loopback only)",
        description=(
            "Start a twin host on a free loopback port with scaled timing and open the console on it. "
            "Everything shown comes from the twin through the same SSH, journal and GPU sources as a "
            "real host."
        ),
    )
    p.add_argument(
        "--time-scale", type=float, default=DEMO_TIME_SCALE, help="startup time multiplier (1.0 is real time)"
    )
    p.add_argument("--scenario", default=None, help="simulated deployment (default: the twin's default)")
    p.add_argument(
        "--state-dir", metavar="DIR", help="where the twin keeps its files (default: a temporary directory)"
    )
    add_target_options(p)
    add_theme_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from console.sources.hosts import HostsError, load_hosts
    from console.tui.app import ConsoleApp, HostEntry
    from console.tui.lifeline import Lifeline, end_now
    from console.twin.host import DEFAULT_SCENARIO, TwinError, TwinHost

    if not 0 < args.time_scale <= 100:
        raise UsageError(f"--time-scale must be a positive number up to 100, not {args.time_scale}.")
    scenario = scenario_argument(args.scenario)
    chosen_dir = state_dir_argument(args.state_dir)
    # Before the sandbox hides the operator's own config: the demo draws in the operator's theme.
    try:
        configured = load_hosts().ui.theme if args.theme is None else None
    except HostsError as exc:
        raise UsageError(str(exc)) from None
    theme = resolve_theme(args.theme, configured)
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="k26-demo-")))
        stack.enter_context(sandbox(scratch / "operator"))
        # After the sandbox: --profile names a shipped profile, never one of the operator's own.
        target, source = resolve_target(args)
        if target is None:
            target, source = DEMO_TARGET, "demo goal"
        require_terminal("k26-console demo")
        state_dir = chosen_dir if chosen_dir is not None else scratch / "twin"
        twin = TwinHost(
            state_dir,
            name="twin",
            scenario=scenario or DEFAULT_SCENARIO,
            time_scale=args.time_scale,
            ssh_port=0,
            start_service=False,
        )

        def prepare():
            try:
                twin.start_sync()
            except TwinError as exc:
                raise RuntimeError(f"the simulated host did not start: {exc}") from None
            config = load_hosts(twin.hosts_toml).get(twin.name)
            if config is None:
                raise RuntimeError("the simulated host wrote no hosts entry")
            return config

        def start_service() -> None:
            # Started once the console follows the journal, so the boot plays on the timeline. Without
            # waiting for the boot: a quit in the meantime would wait for it (asyncio.run's executor
            # shutdown), ~6 s past a SIGTERM.
            twin.systemctl("start", "--no-block", twin.unit, check=False)

        entry = HostEntry(
            name="twin",
            simulated=True,
            sandbox=True,
            prepare=prepare,
            after_start=start_service,
            session_options={"gpu_interval_s": 1.0},
        )
        app = ConsoleApp(
            [entry],
            read_only=args.read_only,
            target=target,
            target_source=source,
            # The profiles screen opens on the demo's goal: from 0.85 to a verified 200k in one restart.
            profile=args.profile or DEMO_PROFILE,
            theme=theme,
        )
        stop_twin = _Once(twin.stop_sync)
        # A closed terminal (SIGHUP: tmux kill-server, a dropped SSH), a kill or a stuck exit must still
        # stop the twin's supervisor and server, as `q` does, rather than leave them running.
        lifeline = stack.enter_context(Lifeline(app))
        lifeline.last_resort(stop_twin)
        try:
            code = int(app.run() or 0)
        finally:
            with contextlib.suppress(OSError, ValueError):  # the terminal may be gone (SIGHUP)
                sys.stderr.write("k26-console demo: stopping the simulated host.\n")
            stop_twin()
    if lifeline.fired:
        say_why_ended(lifeline.reason, "stopped the simulated host")
        end_now(lifeline.exit_code(code))
    return code


SANDBOX_DIRS = {
    "XDG_CONFIG_HOME": "config",
    "XDG_STATE_HOME": "state",
    "XDG_DATA_HOME": "data",
    "XDG_CACHE_HOME": "cache",
}


@contextlib.contextmanager
def sandbox(root: Path) -> Iterator[None]:
    """The demo's own config, profile, probe-history and restart-history dirs, under `root`, for this
    process and its children while it runs. An Apply in the demo once wrote `ctx-256k.toml` with a
    `[verified]` table into the operator's `~/.config/k26-console/profiles/`, and the demo listed that
    user's profiles and probes. Everything that finds those dirs asks platformdirs, which reads these
    variables at each call; the shipped profiles stay visible (they are not the operator's)."""
    before = {var: os.environ.get(var) for var in SANDBOX_DIRS}
    try:
        for var, name in SANDBOX_DIRS.items():
            path = root / name
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.environ[var] = str(path)
        yield
    finally:
        for var, value in before.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


class _Once:
    """`fn` run once, by whichever thread comes first (the main thread, or the lifeline's last resort
    while the main thread is stuck); the second caller waits for the first."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self._fn = fn
        self._lock = threading.Lock()
        self._done = False

    def __call__(self) -> None:
        with self._lock:
            if not self._done:
                self._done = True
                self._fn()
