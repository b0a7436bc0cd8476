"""`k26-console demo`: the console on a simulated 8-GPU host (a twin) started in this process."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from console.cli.cmd_console import (
    add_target_options,
    add_theme_option,
    crash_log_dir,
    require_terminal,
    resolve_target,
    resolve_theme,
    run_console,
    say_why_ended,
)
from console.cli.cmd_record import add_record_option, check_record_path
from console.cli.cmd_twin import scenario_argument, state_dir_argument
from console.cli.errors import UsageError

if TYPE_CHECKING:
    from console.sources.hosts import HostConfig
    from console.tui.host_entry import HostEntry
    from console.twin.host import TwinHost

DEMO_TARGET = 200_000
"""The incident's goal: a 200k-token context (the twin boots with the first, too small, flags)."""
DEMO_PROFILE = "ctx-200k"
DEMO_TIME_SCALE = 0.02
"""A five-minute restart plays in about six seconds."""
MAX_DEMO_HOSTS = 32
"""Each twin is a simulated server, a journal writer and an SSH endpoint: 32 is what the fleet benchmark
(tests/bench/bench_fleet.py) follows on a 2-core machine."""


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
        "--state-dir",
        metavar="DIR",
        help="where the twin keeps its files (default: a temporary directory); with --hosts, one "
        "subdirectory per twin",
    )
    p.add_argument(
        "--hosts",
        type=int,
        default=1,
        metavar="N",
        help=f"simulate N hosts (1-{MAX_DEMO_HOSTS}), each a twin on its own loopback address: from 2 the "
        "console has the fleet overview, from 4 it opens on it",
    )
    add_target_options(p)
    add_record_option(p)
    add_theme_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from console.sources.hosts import HostsError, load_hosts
    from console.tui.app import ConsoleApp
    from console.tui.lifeline import Lifeline, end_now
    from console.twin.host import DEFAULT_SCENARIO, TwinHost

    if not 0 < args.time_scale <= 100:
        raise UsageError(f"--time-scale must be a positive number up to 100, not {args.time_scale}.")

    if not 1 <= args.hosts <= MAX_DEMO_HOSTS:
        raise UsageError(f"--hosts must be a whole number from 1 to {MAX_DEMO_HOSTS}, not {args.hosts}.")
    scenario = scenario_argument(args.scenario)
    chosen_dir = state_dir_argument(args.state_dir)
    # Before the sandbox hides the operator's own config: the demo draws in the operator's theme.
    try:
        configured = load_hosts().ui.theme if args.theme is None else None
    except HostsError as exc:
        raise UsageError(str(exc)) from None
    theme = resolve_theme(args.theme, configured)
    crashes = crash_log_dir()  # the operator's: a crash's log must outlive the sandbox
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="k26-demo-")))
        # W records into the sandbox, never the operator's state dir (the demo promises "never yours");
        # what it recorded is kept when the demo ends (`keep_recordings`).
        recordings = scratch / "recordings"
        stack.enter_context(sandbox(scratch / "operator"))
        # After the sandbox: --profile names a shipped profile, never one of the operator's own.
        target, source = resolve_target(args)
        if target is None:
            target, source = DEMO_TARGET, "demo goal"
        names = ["twin"] if args.hosts == 1 else [f"twin-{i + 1}" for i in range(args.hosts)]
        check_record_path(args.record, names)
        require_terminal("k26-console demo")
        base = chosen_dir if chosen_dir is not None else scratch / "twin"
        twins = [
            TwinHost(
                base if args.hosts == 1 else base / name,
                name=name,
                scenario=scenario or DEFAULT_SCENARIO,
                time_scale=args.time_scale,
                # Each its own loopback address, as separate machines would be.
                ssh_host="127.0.0.1" if args.hosts == 1 else f"127.0.0.{10 + i}",
                ssh_port=0,
                start_service=False,
            )
            for i, name in enumerate(names)
        ]
        entries = [_demo_entry(twin) for twin in twins]
        app = ConsoleApp(
            entries,
            read_only=args.read_only,
            target=target,
            target_source=source,
            # The profiles screen opens on the demo's goal: from 0.85 to a verified 200k in one restart.
            profile=args.profile or DEMO_PROFILE,
            theme=theme,
            record=args.record,
        )
        app.recording.directory = recordings
        stop_twin = _Once(lambda: _stop_all(twins))
        # A closed terminal (SIGHUP: tmux kill-server, a dropped SSH), a kill or a stuck exit must still
        # stop the twin's supervisor and server, as `q` does, rather than leave them running.
        lifeline = stack.enter_context(Lifeline(app))
        lifeline.last_resort(stop_twin)
        try:
            code = run_console(app, crashes)
        finally:
            with contextlib.suppress(OSError, ValueError):  # the terminal may be gone (SIGHUP)
                what = "host" if len(twins) == 1 else f"{len(twins)} hosts"
                sys.stderr.write(f"k26-console demo: stopping the simulated {what}.\n")
            stop_twin()
            app.recording.stop()
            kept = keep_recordings(recordings)
            if kept is not None:
                with contextlib.suppress(OSError, ValueError):
                    sys.stderr.write(
                        f"k26-console demo: the recording made with W is kept in {kept} (a temporary "
                        "directory: move it to keep it; the demo's sandbox is removed).\n"
                    )
    if lifeline.fired:
        say_why_ended(lifeline.reason, "stopped the simulated host")
        end_now(lifeline.exit_code(code))
    return code


def _demo_entry(twin: TwinHost) -> HostEntry:
    """The console's entry for one twin: started (in a thread) when the console starts its session."""
    from console.sources.hosts import load_hosts
    from console.sources.session_options import SessionOptions
    from console.tui.host_entry import HostEntry
    from console.twin.host import TwinError

    def prepare() -> HostConfig:
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

    return HostEntry(
        name=twin.name,
        simulated=True,
        sandbox=True,
        prepare=prepare,
        after_start=start_service,
        # One twin samples its GPUs every second, as the demo always did; a fleet follows the console's
        # polling plan (console/core/fleet.py).
        session=SessionOptions(gpu_interval_s=1.0) if twin.name == "twin" else SessionOptions(),
    )


def _stop_all(twins: list[TwinHost]) -> None:
    """Stop every twin, each in its own thread: one at a time, 32 of them took most of a minute."""
    threads = [threading.Thread(target=twin.stop_sync, name=f"stop-{twin.name}") for twin in twins]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


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


def keep_recordings(directory: Path) -> Path | None:
    """The recordings W made in the sandbox, moved out of it before it is removed: into a new temporary
    directory of their own (not the operator's state dir), which is returned; None when there are none."""
    try:
        made = sorted(p for p in directory.iterdir() if p.is_file() and not p.is_symlink())
    except OSError:
        return None
    if not made:
        return None
    kept = Path(tempfile.mkdtemp(prefix="k26-demo-recordings-"))
    for path in made:
        shutil.move(path, kept / path.name)
    return kept


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
