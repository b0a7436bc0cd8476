"""`k26-console open [HOST]` (and the bare `k26-console HOST`): the full-screen console on real hosts."""

from __future__ import annotations

import argparse
from pathlib import Path

from console.cli.errors import UsageError


def add_target_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--read-only", action="store_true", help="hide and refuse every action that changes the host"
    )
    p.add_argument(
        "--target-context", type=int, metavar="N", help="the context the KV gauge measures the pool against"
    )
    p.add_argument("--profile", metavar="NAME", help="take the gauge's target from this saved profile")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "open",
        help="the full-screen console for a host (bare `k26-console HOST` does the same)",
        description=(
            "Open the console on HOST from the hosts file (or an ssh alias); without HOST, on every host "
            "in the hosts file, one tab each."
        ),
    )
    p.add_argument("host", nargs="?", metavar="HOST", help="a host in hosts.toml or an ssh target")
    p.add_argument("--hosts", type=Path, metavar="FILE", help="the hosts file (default: the user config dir)")
    add_target_options(p)
    p.set_defaults(func=run)


def resolve_target(args: argparse.Namespace) -> tuple[int | None, str | None]:
    """The gauge's target context: --target-context, else the named profile's target."""
    if args.target_context is not None:
        if args.target_context <= 0:
            raise UsageError(
                f"--target-context must be a positive number of tokens, not {args.target_context}."
            )
        return args.target_context, "--target-context"
    if args.profile:
        from console.core.profile_store import ProfileStore
        from console.core.profiles import ProfileError

        try:
            profile = ProfileStore().load(args.profile)
        except (ProfileError, KeyError, LookupError, FileNotFoundError) as exc:
            sentence = str(exc).strip().strip("'\"") or f"there is no profile named {args.profile!r}"
            raise UsageError(sentence if sentence.endswith(".") else f"{sentence}.") from None
        return profile.target_context, f"profile {profile.name}"
    return None, None


def run(args: argparse.Namespace) -> int:
    from console.sources.hosts import HostsError, load_hosts, resolve_host
    from console.tui.app import ConsoleApp, HostEntry

    try:
        hosts = load_hosts(args.hosts)
        configs = [resolve_host(args.host, hosts)] if args.host else list(hosts.hosts.values())
    except HostsError as exc:
        raise UsageError(str(exc)) from None
    if not configs:
        where = hosts.path or "the hosts file"
        raise UsageError(f"no host given and {where} lists none; name a HOST or add [hosts.NAME] tables.")
    target, source = resolve_target(args)
    app = ConsoleApp(
        [HostEntry(name=c.name, config=c) for c in configs],
        read_only=args.read_only,
        target=target,
        target_source=source,
        profile=args.profile,
    )
    return int(app.run() or 0)
