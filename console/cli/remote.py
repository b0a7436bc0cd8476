"""What the commands that change a host share: the host from the inventory, and a connection to it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from console.cli.errors import UsageError

if TYPE_CHECKING:  # the SSH stack loads only when a command needs it
    from console.sources.hosts import HostConfig
    from console.sources.transport import Transport


def inventory_host(name: str, hosts_file: str | None, *, strict: bool = True) -> HostConfig:
    """The one host lookup of every command that reaches a host, before any connection: `name` from the
    hosts file, else an ssh config alias or a name the resolver knows; anything else is refused in one
    sentence with the known host it is close to (`verify twn` said "cannot resolve the host name of
    twn" after 1.8 s of connection retries, where `open twn` named `twin`). `strict` (the commands that
    change or record the host they reach): with `--hosts FILE` a name outside it is a typo, not an ssh
    alias to try."""
    from console.cli.hostcheck import did_you_mean, unknown_host
    from console.sources.hosts import HostsError, load_hosts, resolve_host

    try:
        hosts = load_hosts(hosts_file)
        if hosts.get(name) is None:
            if strict and hosts_file:
                known = ", ".join(sorted(hosts.hosts)) or "none"
                raise UsageError(
                    f"there is no host {name!r} in {hosts_file}{did_you_mean(name, hosts)} (known: {known})."
                )
            refused = unknown_host(name, hosts)
            if refused is not None:
                raise UsageError(f"{refused}.")
        return resolve_host(name, hosts)
    except HostsError as exc:
        raise UsageError(f"{str(exc).rstrip('.')}.") from None


async def connected(host: HostConfig) -> Transport:
    """A started transport that is up: three tries to reach the host (a name that never answers is an
    error), then a lost connection is waited out rather than given up on."""
    from console.sources.transport import Backoff, Transport, TransportError

    transport = Transport(host, backoff=Backoff(max_attempts=3))
    transport.start()
    try:
        await transport.wait_up(30)
    except (TransportError, TimeoutError) as exc:
        await transport.close()
        raise UsageError(f"{str(exc).rstrip('.') or 'no connection to ' + host.name}.") from None
    transport.backoff = Backoff()
    return transport
