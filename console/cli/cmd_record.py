"""`k26-console record HOST --out FILE [--duration 30m]`: record what a host sends, without a screen.

The same sources as the console (the journal, the GPUs, the server's health and `/metrics`, the lock
and the audit trail) go into one recording (`console.sources.recording`); `k26-console replay FILE`
plays it on the console's own dashboard. SIGINT and SIGTERM end it cleanly; a recorder killed outright
leaves a file readable up to its last commit (a second at most before the kill). The recorder is not a
console on the host: it writes no presence heartbeat and never takes the lock.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import signal
import sys
import time
from pathlib import Path

from console.cli.errors import EXIT_OK, UsageError
from console.core.recording import DEFAULT_MAX_AGE_S, DEFAULT_MAX_BYTES, RetentionPolicy

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_AGE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}


def size_bytes(text: str) -> int:
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 500M, 2G)")
    unit = (match.group(2) or "b")[0].lower()
    value = float(match.group(1)) * {"b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}[unit]
    if value < 1024**2:
        raise argparse.ArgumentTypeError(f"{text!r} is under 1 MiB, too small to hold a minute of a host")
    return int(value)


def age_seconds(text: str) -> float:
    match = _AGE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 30m, 12h, 7d)")
    value = float(match.group(1)) * _AGE_UNITS[match.group(2) or "s"]
    if value < 60:
        raise argparse.ArgumentTypeError(f"{text!r} is under a minute")
    return value


def add_record_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--record",
        type=Path,
        metavar="FILE",
        help="record what the hosts send into FILE while you watch (appends to a recording; "
        "k26-console replay FILE plays it); W starts and stops recording either way",
    )


def check_record_path(path: Path | None, hosts: list[str]) -> None:
    """Refuse `--record FILE` before the screen opens: a file that is not a recording, or cannot be
    written (creating it when it does not exist)."""
    if path is None:
        return
    from console.sources.recording import Recorder, RecordingError

    try:
        Recorder(path, hosts=hosts).close()
    except RecordingError as exc:
        raise UsageError(f"{str(exc).rstrip('.')}.") from None


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "record",
        help="record what a host sends (journal, GPUs, /metrics, the lock, the audit trail) without a screen",
        description=(
            "Follow HOST through the console's own sources and record what they bring in, with its time, "
            "into FILE (SQLite with compressed chunks; appended to when FILE is already a recording). "
            "Ctrl-C or SIGTERM ends it; k26-console replay FILE plays it on the console's dashboard."
        ),
    )
    p.add_argument("host", metavar="HOST", help="a hosts-file name or an ssh alias")
    p.add_argument("--out", type=Path, required=True, metavar="FILE", help="the recording (e.g. s.k26rec)")
    p.add_argument(
        "--duration",
        type=age_seconds,
        metavar="DUR",
        help="stop after this long (e.g. 30m, 12h; default: until Ctrl-C)",
    )
    p.add_argument("--hosts", metavar="FILE", help="the hosts file (default: hosts.toml in the config dir)")
    p.add_argument(
        "--max-size",
        type=size_bytes,
        default=DEFAULT_MAX_BYTES,
        metavar="SIZE",
        help=f"drop the oldest chunks past this size (default {DEFAULT_MAX_BYTES // 1024**3}G)",
    )
    p.add_argument(
        "--max-age",
        type=age_seconds,
        default=DEFAULT_MAX_AGE_S,
        metavar="DUR",
        help=f"drop chunks older than this (default {DEFAULT_MAX_AGE_S / 86_400:g}d)",
    )
    p.set_defaults(func=run)


async def _record(host: object, recorder: object, duration: float | None, identity: object) -> None:
    from console.cli.remote import connected
    from console.core.pairing import Identity
    from console.sources.hosts import HostConfig
    from console.sources.hoststate import HostStateDir
    from console.sources.recording import Recorder
    from console.sources.session import HostSession
    from console.tui.pairing import PairingLink

    assert isinstance(host, HostConfig) and isinstance(recorder, Recorder) and isinstance(identity, Identity)
    recorder_identity = identity
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    transport = await connected(host)
    session = HostSession(host, transport=transport)
    session.start_recording(recorder)
    name = host.name
    link = PairingLink(
        HostStateDir(transport, host, recorder_identity),
        on_view=lambda view: recorder.record(name, "view", view),
        on_audit=lambda entries: recorder.record(name, "audit", entries),
        poll_s=4.0,
    )
    pairing = asyncio.create_task(link.watch_only())
    try:
        await session.start()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(duration):
                await stop.wait()
    finally:
        pairing.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pairing
        await session.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _remove_empty(out: Path) -> None:
    """A recording this run created and that holds nothing (the host was never reached): it goes, with
    SQLite's side files, rather than stay as a 32 KB file that `replay` can only say is empty."""
    for path in (out, *(out.with_name(out.name + suffix) for suffix in ("-wal", "-shm", "-journal"))):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def run(args: argparse.Namespace) -> int:
    from console.cli.remote import inventory_host
    from console.sources.hoststate import local_identity
    from console.sources.recording import Recorder, RecordingError

    host = inventory_host(args.host, args.hosts)
    out = Path(args.out)
    created = not out.exists() and not out.is_symlink()
    # The recorder writes no heartbeat; its id is in the file all the same, as a console's is.
    identity = local_identity()
    try:
        recorder = Recorder(
            args.out,
            hosts=[host.name],
            policy=RetentionPolicy(max_bytes=args.max_size, max_age_s=args.max_age),
            console=identity.console_id,
        )
    except RecordingError as exc:
        raise UsageError(f"{str(exc).rstrip('.')}.") from None
    started = time.monotonic()
    sys.stderr.write(f"k26-console: recording {host.name} into {args.out} (Ctrl-C ends it).\n")
    recorder.start()
    try:
        asyncio.run(_record(host, recorder, args.duration, identity))
    except BaseException:
        recorder.close()
        if created and recorder.records == 0:
            _remove_empty(out)
        raise
    recorder.close()
    if recorder.error is not None:
        if created and recorder.records == 0:
            _remove_empty(out)
        raise UsageError(f"the recording stopped: {recorder.error.rstrip('.')}.")
    sys.stderr.write(
        f"k26-console: recorded {recorder.records:,} inputs of {host.name} over "
        f"{time.monotonic() - started:.0f} s into {args.out} ({recorder.bytes_written / 1e6:.1f} MB); "
        f"k26-console replay {args.out} plays it.\n"
    )
    return EXIT_OK
