"""`k26-console twin`: a GPU host in a box, reachable over SSH on loopback, until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import platformdirs

from console.cli.errors import UsageError
from console.core.text import terminal_safe

if TYPE_CHECKING:
    from console.twin.host import TwinHost


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
        "--state-dir", metavar="DIR", help="where the twin keeps its files (default: the user state dir)"
    )
    p.add_argument(
        "--name",
        default="twin",
        help="host name in hosts.toml, and the default state dir's name (default: twin); a name another "
        "running twin holds is refused, so two users of one account each pick their own",
    )
    p.add_argument("--scenario", default=None, help="simulated deployment (default: kimi-k26-rtx6000)")
    p.add_argument(
        "--time-scale", type=float, default=None, help="startup time multiplier (1.0 is real time)"
    )
    p.add_argument(
        "--systemd",
        choices=("auto", "real", "simulated"),
        default="auto",
        help="who runs the unit: a real systemd manager in namespaces (needs root, namespaces, cgroup2), "
        "the twin's simulated one, or auto (real where this machine allows it; default)",
    )
    p.add_argument(
        "--gpu",
        choices=("mi300x",),
        default=None,
        help="play the scenario's host with these GPUs instead: mi300x is an AMD Instinct MI300X host "
        "(amd-smi answers; no nvidia-smi, no NVML), so the console reads it with its AMD back-end",
    )
    p.add_argument(
        "--gpu-fault",
        choices=("thermal", "power", "xid79", "pcie"),
        default=None,
        help="play a GPU health fault: thermal (GPU 3 in thermal slowdown), power (every GPU at its power "
        "cap), pcie (GPU 5's link at gen 4 x8), xid79 (GPU 3 falls off the bus a minute after the twin is "
        "up, mid-decode with --load, and is lost from then on; NVIDIA GPUs only)",
    )
    p.add_argument(
        "--no-nvml",
        action="store_true",
        help="play a host whose python3 has no nvidia-ml-py: the console reads its GPUs with nvidia-smi "
        "(by default the twin's python3 has it, as SGLang requires it)",
    )
    p.add_argument(
        "--no-register",
        action="store_true",
        help="do not add the twin to your hosts.toml (by default it is added or updated under its --name, "
        "so `k26-console apply twin PROFILE` works without --hosts)",
    )
    p.add_argument(
        "--load",
        type=float,
        default=None,
        metavar="RPS",
        help="serve a realistic load once the server is up: RPS /generate requests a second (Poisson "
        "arrivals, varied prompts with a shared prefix, 32-384 new tokens), so /metrics and the "
        "dashboard move",
    )
    p.set_defaults(func=run)


def state_dir_argument(text: str | None) -> Path | None:
    """`--state-dir` checked before anything is written: an empty string (which reads as the current
    directory), a file, a parent that does not exist or cannot be written are one sentence each.
    The directory itself may be missing (the twin creates it) or a twin's from an earlier run."""
    if text is None:
        return None
    if not text.strip():
        raise UsageError("--state-dir needs a directory, not an empty string.")
    path = Path(text).expanduser()
    shown = terminal_safe(text)
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"--state-dir {shown} is a file, not a directory.")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"--state-dir {shown} cannot be written (permission denied).")
        return path
    parent = path.absolute().parent
    if not parent.exists():
        raise UsageError(
            f"--state-dir {shown}: its parent directory {terminal_safe(parent)} does not exist (create it first)."
        )
    if not parent.is_dir():
        raise UsageError(f"--state-dir {shown}: {terminal_safe(parent)} is a file, not a directory.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(
            f"--state-dir {shown} cannot be created: {terminal_safe(parent)} is not writable (permission denied)."
        )
    return path


def scenario_argument(name: str | None) -> str | None:
    """`--scenario` checked before a state directory exists: an unknown name lists the known ones."""
    if name is None:
        return None
    from console.twin.scenarios import ALIASES, SCENARIOS, get_scenario

    try:
        get_scenario(name)
    except KeyError:
        known = ", ".join([*SCENARIOS, *sorted(ALIASES)])
        raise UsageError(f"there is no twin scenario {terminal_safe(repr(name))}; known: {known}.") from None
    return name


def register_host(twin_hosts: Path, name: str, target: Path | None = None) -> Path:
    """Merge the twin's entry into the operator's hosts.toml (default: the config dir's): the other hosts,
    comments and order stay; the file is replaced atomically. Raises UsageError when it is not valid TOML."""
    import tomlkit
    import tomlkit.exceptions

    from console.sources.hosts import default_hosts_path
    from console.sources.profile_store import atomic_write_text

    path = target or default_hosts_path()
    entry = tomlkit.parse(twin_hosts.read_text(encoding="utf-8"))["hosts"][name]
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    try:
        doc = tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as exc:
        raise UsageError(
            f"{path} line {exc.line} is not valid TOML, so the twin was not added to it."
        ) from None
    if "hosts" not in doc:
        doc["hosts"] = tomlkit.table(is_super_table=True)
    hosts = doc["hosts"]
    if not isinstance(hosts, dict):
        raise UsageError(f"{path} has a 'hosts' that is not a table, so the twin was not added to it.")
    hosts[name] = entry
    atomic_write_text(path, tomlkit.dumps(doc))
    return path


def name_taken(
    name: str, state_dir: Path, *, default_dir: bool, register: bool, hosts_path: Path | None = None
) -> str | None:
    """Why this twin may not take `name`, in one sentence naming --name, or None: another running twin
    is registered under it in the operator's hosts.toml (registering would point that entry at this
    twin), or holds the state dir the name picks by default. Two users of one account each ran
    `k26-console twin` and the second took over the first's "twin"."""
    from console.sources.hosts import default_hosts_path
    from console.twin.units import pid_alive

    holders: list[tuple[Path, str]] = []
    if default_dir:
        holders.append((state_dir, "uses the state directory"))
    if register:
        path = hosts_path or default_hosts_path()
        root = _registered_twin_root(path, name)
        if root is not None:
            holders.append(
                (root, f"is registered under it in {terminal_safe(path)}, with the state directory")
            )
    for root, how in holders:
        try:
            owner = int((root / "owner.pid").read_text(encoding="ascii").strip())
        except (OSError, ValueError):
            continue
        if owner != os.getpid() and pid_alive(owner):
            return (
                f"the host name {name!r} is taken: another running twin (pid {owner}) {how} "
                f"{terminal_safe(root)}; pick a name of your own with --name NAME."
            )
    return None


def _registered_twin_root(path: Path, name: str) -> Path | None:
    """The state directory of the twin registered as `name` in the hosts file `path` (by its unit_dir,
    ROOT/etc/systemd/system), None when the file has no such entry or it is not a twin's."""
    import tomllib

    try:
        with path.open("rb") as f:
            doc = tomllib.loads(f.read(MAX_HOSTS_BYTES).decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None  # registering says what is wrong with the file
    hosts = doc.get("hosts")
    entry = hosts.get(name) if isinstance(hosts, dict) else None
    unit_dir = entry.get("unit_dir") if isinstance(entry, dict) else None
    if not isinstance(unit_dir, str) or not unit_dir.endswith("/etc/systemd/system"):
        return None
    return Path(unit_dir).parents[2]


MAX_HOSTS_BYTES = 4 << 20
"""More than any hosts file: what `name_taken` reads of one."""


def play_gpu_fault(twin: TwinHost, fault: str) -> str:
    """Write the fault into the twin's GPU conditions (its nvidia-smi, NVML and amd-smi play it); what
    the twin now plays, in one sentence."""
    import datetime

    from console.twin.gpuhealth import XID79_AFTER_S, fault_conditions, write_conditions

    conditions = fault_conditions(fault)
    write_conditions(twin.layout, conditions)
    if fault == "xid79":
        at = datetime.datetime.fromtimestamp(conditions.xids[0].at, datetime.UTC).strftime("%H:%M:%S")
        return f"GPU fault: GPU3 falls off the bus (XID 79) at {at} UTC, {XID79_AFTER_S:.0f} s from now"
    said = {
        "thermal": "GPU3 is in thermal slowdown",
        "power": "every GPU is held at its power cap",
        "pcie": "GPU5's PCIe link runs at gen 4 x8",
    }
    return f"GPU fault: {said[fault]}"


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
    if args.load is not None and not 0 < args.load <= 1000:
        raise UsageError(
            f"--load must be a positive number of requests a second up to 1000, not {args.load}."
        )
    scenario = scenario_argument(args.scenario)
    if args.gpu is not None:
        if args.gpu_fault == "xid79":
            raise UsageError("--gpu-fault xid79 is an NVIDIA driver's event; an AMD host has no XIDs.")
        from console.twin.scenarios import CARD_SEP

        scenario = f"{(scenario or DEFAULT_SCENARIO).partition(CARD_SEP)[0]}{CARD_SEP}{args.gpu}"
    chosen = state_dir_argument(args.state_dir)
    state_dir = chosen or Path(platformdirs.user_state_dir("k26-console")) / "twins" / name
    taken = name_taken(name, state_dir, default_dir=chosen is None, register=not args.no_register)
    if taken is not None:
        raise UsageError(taken)
    twin = TwinHost(
        state_dir,
        name=name,
        scenario=scenario or DEFAULT_SCENARIO,
        time_scale=args.time_scale,
        ssh_port=args.port,
        systemd=args.systemd,
        nvml=not args.no_nvml,
    )

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, stop.set)
        starting = asyncio.ensure_future(twin.start())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            # A signal while the service starts (a boot can take minutes): stopping the host ends the
            # start job, so the start returns too, and nothing is left running.
            sys.stderr.write("k26 twin: interrupted while starting; stopping the service and the host.\n")
            await twin.stop()
            with contextlib.suppress(Exception):
                await starting
            await twin.stop()
            return 130
        stopped.cancel()
        try:
            await starting
        except TwinError as exc:
            raise UsageError(f"{exc}.") from None
        except OSError as exc:
            # The checks above leave little, but a disk can fill or a directory change under us.
            where = terminal_safe(exc.filename) if exc.filename else terminal_safe(state_dir)
            raise UsageError(f"the twin cannot set up {where}: {exc.strerror or exc}.") from None
        try:
            print(twin.hosts_toml, flush=True)
            print(twin.ssh_command(), flush=True)
            if not args.no_register:
                try:
                    registered_in = register_host(twin.hosts_toml, name)
                except (UsageError, OSError) as exc:
                    reason = exc.sentence if isinstance(exc, UsageError) else f"{exc.strerror or exc}."
                    sys.stderr.write(f"k26 twin: not registered: {terminal_safe(reason)}\n")
                else:
                    print(
                        f"registered as host '{name}' in {registered_in} (--name picks another, "
                        f"--no-register skips it); try: k26-console apply {name} ctx-200k --rollback-on-failure",
                        flush=True,
                    )
            # Last, so the lines scripts read first (hosts.toml, ssh, registered) keep their places.
            if twin.systemd_note:
                sys.stderr.write(f"k26 twin: {twin.systemd_note}.\n")
            print(twin.systemd_description, flush=True)
            if args.gpu_fault is not None:
                print(play_gpu_fault(twin, args.gpu_fault), flush=True)
            if args.load is not None:
                from console.twin.load import LoadGenerator

                load = asyncio.ensure_future(LoadGenerator(twin.sglang_url, args.load).run())
                print(f"serving a load of {args.load:g} requests/s on {twin.sglang_url}", flush=True)
                try:
                    await stop.wait()
                finally:
                    load.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await load
            else:
                await stop.wait()
        finally:
            sys.stderr.write("k26 twin: stopping the service and the host.\n")
            await twin.stop()
        return 0

    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(main())
    return 130
