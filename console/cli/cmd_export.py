"""`k26-console export [HOST...] --listen 127.0.0.1:9426`: a Prometheus exporter, headless, for days.

Follows each host over the same SSH sources as the console (`console.sources.exporter`) and serves their
newest state at `/metrics` with prometheus_client: no HOST follows every host in the hosts file. A host
that drops keeps its last values with `k26_up` 0 and reconnects on its own. SIGHUP reads the hosts file
again: a host taken out of it is closed and its series are gone from the next scrape, a new one is
followed. Runs until SIGINT or SIGTERM (exit 0); bad input (an unknown host, a bad or busy address) is one
sentence and exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from console.cli.errors import EXIT_OK, UsageError
from console.core.text import terminal_safe

if TYPE_CHECKING:
    from console.sources.hosts import HostConfig, HostsFile

DEFAULT_LISTEN = "127.0.0.1:9426"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "export",
        help="serve the hosts' state as Prometheus metrics (headless)",
        description=(
            "Follow HOSTs (default: every host in the hosts file) over SSH and serve their pool, boots, "
            "verdict, errors, GPU memory, last probe, lock and pending rollback at http://LISTEN/metrics "
            "for Prometheus. Runs until interrupted."
        ),
    )
    p.add_argument("hosts_", nargs="*", metavar="HOST", help="hosts-file names or ssh aliases")
    p.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="ADDR:PORT",
        help=f"where to serve (default {DEFAULT_LISTEN})",
    )
    p.add_argument("--hosts", metavar="FILE", help="the hosts file (default: hosts.toml in the config dir)")
    p.add_argument(
        "--poll",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="how often the lock, pending rollback, audit and probe history are read (default 15)",
    )
    p.add_argument(
        "--probe-history", metavar="FILE", help="the probe history (default: probes.jsonl in the state dir)"
    )
    p.set_defaults(func=run)


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(f"--listen wants ADDRESS:PORT (like {DEFAULT_LISTEN}), not {text!r}.")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise UsageError(f"--listen wants an IP address (like {DEFAULT_LISTEN}), not {host!r}.") from None
    return host, int(port_text)


def _configs(names: list[str], hosts_file: HostsFile) -> list[HostConfig]:
    from console.cli.hostcheck import unknown_host
    from console.sources.hosts import resolve_host

    if not names:
        raise UsageError("no HOST given and the hosts file lists none: name the hosts to export.")
    for name in names:
        if not name.isprintable() or " " in name:
            raise UsageError(f"{terminal_safe(repr(name))} is not a host name.")
        refused = unknown_host(name, hosts_file)
        if refused is not None:  # a name nothing knows would be retried for days, up=0, unnoticed
            raise UsageError(refused)
    return [resolve_host(name, hosts_file) for name in names]


def run(args: argparse.Namespace) -> int:
    from console.sources.hosts import HostsError, load_hosts

    address, port = parse_listen(args.listen)
    if not args.poll > 0:
        raise UsageError("--poll wants a number of seconds above 0.")
    names = list(args.hosts_)

    def read() -> list[HostConfig]:
        try:
            hosts_file = load_hosts(args.hosts)
            return _configs(names or sorted(hosts_file.hosts), hosts_file)
        except HostsError as exc:
            raise UsageError(f"{str(exc).rstrip('.')}.") from None

    configs = read()
    history = Path(args.probe_history) if args.probe_history else None
    return asyncio.run(_serve(configs, read, address, port, args.poll, history))


async def _first(*events: asyncio.Event) -> None:
    """Wait until one of `events` is set."""
    tasks = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


async def _serve(
    configs: list[HostConfig],
    reread: Callable[[], list[HostConfig]],
    address: str,
    port: int,
    poll_s: float,
    history: Path | None,
) -> int:
    """Serve until SIGINT/SIGTERM; SIGHUP reads the hosts file again (hosts added, removed, changed)."""
    from prometheus_client import CollectorRegistry, start_http_server

    from console.sources.exporter import ExportSet

    hosts = ExportSet(poll_s=poll_s, probe_history=history)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(hosts.collector)
    try:
        server, thread = start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        raise UsageError(f"cannot listen on {address}:{port}: {exc.strerror or exc}.") from None
    stop = asyncio.Event()
    reload = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload.set)
    try:
        await hosts.sync(configs)
        _say(f"exporting {len(configs)} host(s) at http://{address}:{port}/metrics")
        while not stop.is_set():
            await _first(stop, reload)
            if reload.is_set():
                reload.clear()
                try:
                    wanted = reread()
                except UsageError as exc:  # a hosts file being edited: keep the hosts followed now
                    _say(f"hosts not reloaded: {exc.sentence}")
                    continue
                added, removed = await hosts.sync(wanted)
                _say(
                    f"hosts reloaded: {len(wanted)} exported"
                    + (f", started {', '.join(added)}" if added else "")
                    + (f", removed {', '.join(removed)}" if removed else "")
                )
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        await hosts.close()
    return EXIT_OK


def _say(text: str) -> None:
    sys.stderr.write(terminal_safe(f"k26-console: {text}") + "\n")
    sys.stderr.flush()
