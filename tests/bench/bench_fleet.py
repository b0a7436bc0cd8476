"""What the console costs following a fleet: N twins over SSH on loopback, the real app in a real pty.

    python tests/bench/bench_fleet.py                     # 32 twins, 30 s windows
    python tests/bench/bench_fleet.py --hosts 8 --seconds 20

Phases, each an idle window (the twins' services ready, no load) after a settle:

* **baseline**: the same console following one twin (its first), a single dashboard;
* **fleet, overview**: the console following every twin, opened on the fleet overview (the hosts share
  the polling budget of `console.core.fleet`);
* **fleet, one dashboard**: the same console after Enter on the first row: that host at its dashboard's
  pace, the others on the budget;
* **fleet, fixed pace** (`--fixed`, on by default): every host at one host's pace (GPUs 1 s, /metrics
  2 s, presence 4 s, heartbeat 5 s), as the console polled before the fleet plan: what the plan saves.

Figures: the console's CPU (utime+stime from /proc/PID/stat over the window, % of one core), its RSS
(/proc/PID/status), the SSH channels it opened per second per host over the window (exec sessions and
direct-tcpip forwards, counted in the console process by wrapping asyncssh's `create_process` and
`open_connection`), the exec sessions open on the twins' side at the end of the window (long-lived
streams: journal, GPU stream, audit tail), and how many hosts the console saw up with their server
ready. The console runs on a CPU of its own (as bench_console.py's `--cpus split`); the twins (their
SSH servers in this process, their journal writers and simulated servers) on the others.

Not a timed test: pytest ignores tests/bench. Figures go in docs/performance.md (by hand).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.bench.bench_console import Terminal, split_cpus  # noqa: E402

FIXED_SESSION = {"gpu_interval_s": 1.0, "server_interval_s": 2.0}
FIXED_PAIRING = {"poll_s": 4.0, "heartbeat_s": 5.0}


# ---------------------------------------------------------------------------------------------- child


def child_console(hosts: str, counts: str, fixed: bool) -> None:
    """The console on every host of `hosts`, as `k26-console open` runs it (without learning the hosts'
    SGLang: a one-off at start, not an idle cost); its SSH channel counts go to `counts` every second."""
    import asyncssh

    from console.core.snapshot import ConnState, HealthState
    from console.sources.hosts import load_hosts
    from console.sources.session_options import SessionOptions
    from console.tui.app import ConsoleApp, HostEntry
    from console.tui.host_entry import PairingOptions

    traced = os.environ.get("K26_BENCH_TRACEMALLOC")
    if traced:
        # Where the fleet's memory is: the allocation sites still live, by line, written on SIGUSR1 (the
        # parent sends it at the end of its window). tracemalloc's own bookkeeping inflates RSS: its
        # figures are for the breakdown, not for the RSS row.
        import signal
        import tracemalloc

        tracemalloc.start(1)

        def dump(*_: object) -> None:
            snap = tracemalloc.take_snapshot()
            lines = [f"total {sum(s.size for s in snap.statistics('filename')) / 2**20:.1f} MiB"]
            for key in ("filename", "lineno"):
                for stat in snap.statistics(key)[:60]:
                    lines.append(f"{key} {stat.size / 2**20:8.2f} MiB {stat.count:8} {stat.traceback}")
            Path(traced).write_text("\n".join(lines) + "\n")

        signal.signal(signal.SIGUSR1, dump)

    opened = {"exec": 0, "tcpip": 0}
    create_process = asyncssh.SSHClientConnection.create_process
    open_connection = asyncssh.SSHClientConnection.open_connection

    async def counted_process(self: Any, *args: Any, **kw: Any) -> Any:
        opened["exec"] += 1
        return await create_process(self, *args, **kw)

    async def counted_connection(self: Any, *args: Any, **kw: Any) -> Any:
        opened["tcpip"] += 1
        return await open_connection(self, *args, **kw)

    asyncssh.SSHClientConnection.create_process = counted_process  # type: ignore[method-assign]
    asyncssh.SSHClientConnection.open_connection = counted_connection  # type: ignore[method-assign]

    configs = list(load_hosts(hosts).hosts.values())
    entries = [
        HostEntry(
            c.name,
            config=c,
            session=SessionOptions(**FIXED_SESSION) if fixed else SessionOptions(),
            pairing=PairingOptions(**FIXED_PAIRING) if fixed else PairingOptions(),
        )
        for c in configs
    ]
    app = ConsoleApp(entries, target=200_000, target_source="--target-context")

    def report() -> None:
        path = Path(counts)
        while True:
            up = 0
            for name in app.hosts:
                with contextlib.suppress(Exception):
                    snap = app.latest_snapshot(name)
                    if (
                        snap is not None
                        and snap.connection is not None
                        and snap.connection.state is ConnState.UP
                        and snap.server is not None
                        and snap.server.health is HealthState.OK
                    ):
                        up += 1
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({**opened, "up": up, "t": time.monotonic()}))
            tmp.replace(path)
            time.sleep(1.0)

    threading.Thread(target=report, daemon=True).start()
    app.run()


# ---------------------------------------------------------------------------------------------- twins


def merged_hosts(twins: list[Any], path: Path) -> Path:
    """One hosts file with every twin's `[hosts.NAME]` table."""
    import tomlkit

    doc = tomlkit.document()
    table = tomlkit.table(is_super_table=True)
    for twin in twins:
        own = tomlkit.parse(Path(twin.hosts_toml).read_text())
        table[twin.name] = own["hosts"][twin.name]  # type: ignore[index]
    doc["hosts"] = table
    path.write_text(tomlkit.dumps(doc))
    return path


def start_twins(root: Path, count: int, time_scale: float) -> list[Any]:
    """Start `count` twins, each on its own 127.0.0.x, their services started together; returns as many
    as started (a twin that cannot start ends the list, and the bench says how many it holds)."""
    from console.twin.host import TwinError, TwinHost

    twins: list[Any] = []
    for i in range(count):
        twin = TwinHost(
            root / f"t{i:02d}",
            name=f"t{i:02d}",
            time_scale=time_scale,
            ssh_host=f"127.0.0.{40 + i}",
            systemd="simulated",
            start_service=False,
        )
        try:
            twin.start_sync()
        except (TwinError, OSError) as exc:
            _say(f"twin {i} did not start ({exc}); going on with {len(twins)}")
            break
        twins.append(twin)
    for twin in twins:
        twin.systemctl("start", "--no-block", twin.unit, check=False)
    deadline = time.monotonic() + 120 + 10 * len(twins)
    waiting = list(twins)
    while waiting and time.monotonic() < deadline:
        waiting = [
            t for t in waiting if t.systemctl("is-active", t.unit, check=False).stdout.strip() != "active"
        ]
        time.sleep(1.0)
    if waiting:
        _say(f"{len(waiting)} twins did not become active: {[t.name for t in waiting]}")
    return twins


def twin_sessions(twins: list[Any]) -> int:
    """Exec sessions open on the twins' side now (their SSH servers run in this process)."""
    total = 0
    for twin in twins:
        ssh = getattr(twin, "_ssh", None)
        total += len(getattr(ssh, "_sessions", ()))
    return total


def stop_twins(twins: list[Any]) -> None:
    """Each twin by its own `stop_sync`, all at once (one at a time, 32 took most of a minute)."""

    def stop(twin: Any) -> None:
        with contextlib.suppress(Exception):
            twin.stop_sync()

    threads = [threading.Thread(target=stop, args=(t,)) for t in twins]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


# ---------------------------------------------------------------------------------------------- phases


def read_counts(path: Path, timeout: float = 5.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ValueError):
            return dict(json.loads(path.read_text()))
        if time.monotonic() > deadline:
            return {"exec": 0, "tcpip": 0, "up": 0, "t": time.monotonic()}
        time.sleep(0.1)


def wait_up(counts: Path, hosts: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    up = 0
    while time.monotonic() < deadline:
        up = int(read_counts(counts).get("up", 0))
        if up >= hosts:
            break
        time.sleep(1.0)
    return up


def window(term: Terminal, counts: Path, twins: list[Any], hosts: int, seconds: float) -> dict[str, float]:
    c0, cpu0, t0 = read_counts(counts), term.cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    c1, cpu1, t1 = read_counts(counts), term.cpu_seconds(), time.monotonic()
    span = t1 - t0
    smaps = os.environ.get("K26_BENCH_SMAPS")
    if smaps:
        # The console's memory map at the end of the window, for where its RSS is outside Python's heap.
        Path(f"{smaps}.{hosts}").write_bytes(Path(f"/proc/{term.pid}/smaps").read_bytes())
    traced = os.environ.get("K26_BENCH_TRACEMALLOC")
    if traced:
        Path(traced).unlink(missing_ok=True)
        os.kill(term.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 60
        while not Path(traced).exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        if not Path(traced).exists():
            _say(f"the console wrote no allocation dump to {traced} within 60 s")
    return {
        "hosts": hosts,
        "up": c1.get("up", 0),
        "cpu_pct": round(100 * (cpu1 - cpu0) / span, 2),
        "rss_mb": round(term.rss_mb(), 1),
        "exec_per_host_s": round((c1["exec"] - c0["exec"]) / (c1["t"] - c0["t"]) / hosts, 3),
        "tcpip_per_host_s": round((c1["tcpip"] - c0["tcpip"]) / (c1["t"] - c0["t"]) / hosts, 3),
        "open_sessions_per_host": round(twin_sessions(twins) / hosts, 2),
        "tty_bytes_per_s": round(term.bytes_between(t0, t1) / span, 0),
    }


def phase(
    me: str,
    hosts_file: Path,
    twins: list[Any],
    cpus: set[int] | None,
    *,
    settle: float,
    seconds: float,
    fixed: bool = False,
    drill: bool = False,
) -> dict[str, float]:
    counts = hosts_file.with_suffix(".counts.json")
    counts.unlink(missing_ok=True)
    argv = [me, "--child", "console", "--hosts-file", str(hosts_file), "--counts", str(counts)]
    term = Terminal([*argv, "--fixed"] if fixed else argv, cpus)
    try:
        up = wait_up(counts, len(twins), 60 + 3 * len(twins))
        if up < len(twins):
            _say(f"only {up} of {len(twins)} hosts up and ready in the console before the window")
        if drill:
            term.write(b"\r")  # Enter on the overview's first row: that host's dashboard
        time.sleep(settle)
        term.trim()
        return window(term, counts, twins, len(twins), seconds)
    finally:
        term.close()


# ---------------------------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=32, help="twins to follow (default 32)")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of each measuring window")
    ap.add_argument(
        "--settle", type=float, default=20.0, help="seconds after every host is up, before a window"
    )
    ap.add_argument("--time-scale", type=float, default=0.02, help="the twins' startup time multiplier")
    ap.add_argument(
        "--phases",
        default="baseline,overview,dashboard,fixed",
        help="which phases to run, comma-separated (default: all four)",
    )
    ap.add_argument("--child", choices=["console"], help=argparse.SUPPRESS)
    ap.add_argument("--hosts-file", help=argparse.SUPPRESS)
    ap.add_argument("--counts", help=argparse.SUPPRESS)
    ap.add_argument("--fixed", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "console":
        child_console(args.hosts_file, args.counts, args.fixed)
        return 0

    me = str(Path(__file__).resolve())
    cpus = split_cpus()
    figures: dict[str, Any] = {"cpus": f"console on CPU {sorted(cpus or [])}, twins on the rest"}
    with tempfile.TemporaryDirectory(prefix="k26-bench-fleet-") as tmp:
        root = Path(tmp)
        # The consoles' own config, profiles and caches stay in the temporary directory.
        for var in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
            (root / var).mkdir()
            os.environ[var] = str(root / var)
        _say(f"starting {args.hosts} twins")
        started = time.monotonic()
        twins = start_twins(root / "twins", args.hosts, args.time_scale)
        figures["twins"] = len(twins)
        figures["twins_start_s"] = round(time.monotonic() - started, 1)
        try:
            if not twins:
                _say("no twin started")
                return 1
            one = merged_hosts(twins[:1], root / "one.toml")
            fleet = merged_hosts(twins, root / "fleet.toml")
            wanted = set(args.phases.split(","))
            timing = {"settle": args.settle, "seconds": args.seconds}
            if "baseline" in wanted:
                _say("baseline: the console following one twin")
                figures["baseline"] = phase(me, one, twins[:1], cpus, **timing)
            if "overview" in wanted:
                _say(f"fleet: the console following {len(twins)} twins, on the overview")
                figures["overview"] = phase(me, fleet, twins, cpus, **timing)
            if "dashboard" in wanted:
                _say("fleet: one host's dashboard on screen")
                figures["dashboard"] = phase(me, fleet, twins, cpus, **timing, drill=True)
            if "fixed" in wanted:
                _say("fleet: every host at one host's pace (no plan)")
                figures["fixed"] = phase(me, fleet, twins, cpus, **timing, fixed=True, drill=True)
        finally:
            _say("stopping the twins")
            stop_twins(twins)
    figures["loadavg"] = os.getloadavg()
    report(figures)
    print(json.dumps(figures))
    return 0


def report(f: dict[str, Any]) -> None:
    rows = [("baseline (1 twin)", f.get("baseline"))]
    n = f.get("twins")
    if f.get("baseline") and f.get("overview"):
        base, fleet = f["baseline"], f["overview"]
        f["rss_mb_per_extra_host"] = round((fleet["rss_mb"] - base["rss_mb"]) / max(1, fleet["hosts"] - 1), 2)
    rows += [
        (f"{n} twins, overview", f.get("overview")),
        (f"{n} twins, one dashboard", f.get("dashboard")),
        (f"{n} twins, fixed pace, one dashboard", f.get("fixed")),
    ]
    print(f"\n{f['cpus']}; twins started in {f['twins_start_s']} s; load average {f.get('loadavg')}")
    if "rss_mb_per_extra_host" in f:
        print(f"RSS per host beyond the first (overview): {f['rss_mb_per_extra_host']} MB")
    print(
        f"{'what':38} {'up':>5} {'CPU %':>7} {'CPU %/host':>10} {'RSS MB':>7} {'exec/s/host':>11} "
        f"{'tcpip/s/host':>12} {'open/host':>9} {'tty KiB/s':>9}"
    )
    for label, r in rows:
        if not r:
            continue
        print(
            f"{label:38} {r['up']:>5.0f} {r['cpu_pct']:>7.2f} {r['cpu_pct'] / r['hosts']:>10.3f} "
            f"{r['rss_mb']:>7.1f} {r['exec_per_host_s']:>11.3f} {r['tcpip_per_host_s']:>12.3f} "
            f"{r['open_sessions_per_host']:>9.2f} {r['tty_bytes_per_s'] / 1024:>9.2f}"
        )


def _say(text: str) -> None:
    sys.stderr.write(f"bench: {text}\n")
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
