"""`k26-console export [HOST...] --listen 127.0.0.1:9426`: a Prometheus exporter, headless, for days.

Follows each host over the same SSH sources as the console (`console.sources.exporter`) and serves their
newest state at `/metrics` with prometheus_client: no HOST follows every host in the hosts file. A host
that drops keeps its last values with `k26_up` 0 and reconnects on its own. Runs until SIGINT or SIGTERM
(exit 0); bad input (an unknown host, a bad or busy address) is one sentence and exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from console.cli.errors import EXIT_OK, UsageError
from console.core.text import terminal_safe

if TYPE_CHECKING:
    from console.sources.hosts import HostConfig

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


def run(args: argparse.Namespace) -> int:
    from console.cli.hostcheck import unknown_host
    from console.sources.hosts import HostsError, load_hosts, resolve_host

    address, port = parse_listen(args.listen)
    if not args.poll > 0:
        raise UsageError("--poll wants a number of seconds above 0.")
    try:
        hosts_file = load_hosts(args.hosts)
        names = list(args.hosts_) or sorted(hosts_file.hosts)
        if not names:
            raise UsageError("no HOST given and the hosts file lists none: name the hosts to export.")
        for name in names:
            if not name.isprintable() or " " in name:
                raise UsageError(f"{terminal_safe(repr(name))} is not a host name.")
            refused = unknown_host(name, hosts_file)
            if refused is not None:  # a name nothing knows would be retried for days, up=0, unnoticed
                raise UsageError(refused)
        configs = [resolve_host(name, hosts_file) for name in names]
    except HostsError as exc:
        raise UsageError(f"{str(exc).rstrip('.')}.") from None
    history = Path(args.probe_history) if args.probe_history else None
    return asyncio.run(_serve(configs, address, port, args.poll, history))


async def _serve(
    configs: list[HostConfig], address: str, port: int, poll_s: float, history: Path | None
) -> int:
    from prometheus_client import CollectorRegistry, start_http_server

    from console.sources.exporter import ExportCollector, HostExport

    exports = [HostExport(c, poll_s=poll_s, probe_history=history) for c in configs]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExportCollector(exports))
    try:
        server, thread = start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        raise UsageError(f"cannot listen on {address}:{port}: {exc.strerror or exc}.") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        for e in exports:
            await e.start()
        sys.stderr.write(
            f"k26-console: exporting {len(exports)} host(s) at http://{address}:{port}/metrics\n"
        )
        sys.stderr.flush()
        await stop.wait()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        for e in exports:
            with contextlib.suppress(Exception):
                await e.close()
    return EXIT_OK
