"""`k26-console parse [FILE|-] [--json] [--kinds k1,k2]`: journal text or JSON in, events out.

Reads `journalctl` output in any form the parser knows (short text, JSON, docker, bare SGLang lines) from
a file or standard input, one line at a time, so `journalctl -o json -f | k26-console parse -` streams.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from console.cli.errors import UsageError
from console.core.events import EVENT_KINDS, EventBase
from console.core.parser import JournalParser

_COMMON = frozenset(EventBase.model_fields) | {"kind"}
_RANK_TAGS = (
    ("dp_rank", "DP"),
    ("pp_rank", "PP"),
    ("attn_cp_rank", "ATTN_CP"),
    ("moe_dp_rank", "MOE_DP"),
    ("tp_rank", "TP"),
    ("ep_rank", "EP"),
)
_TIME_W, _HOST_W, _RANK_W, _KIND_W = 19, 14, 11, 17


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "parse",
        help="turn journal lines (text or `journalctl -o json`) into events",
        description="Journal text or JSON in, events out: a table, or one JSON object a line with --json.",
    )
    p.add_argument(
        "file", nargs="?", default="-", metavar="FILE", help="journal file; '-' or none reads stdin"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object per event")
    p.add_argument("--kinds", metavar="K1,K2", help="only these event kinds (e.g. error,pool_summary)")
    p.add_argument(
        "--follow",
        action="store_true",
        help="FILE names a host: follow its unit's journal live over SSH (a hosts-file name or an ssh alias)",
    )
    p.add_argument("--hosts", metavar="FILE", help="the hosts file for --follow (default: the config dir)")
    p.set_defaults(func=run)


def _kinds(spec: str | None) -> frozenset[str] | None:
    if spec is None:
        return None
    wanted = [k.strip() for k in spec.split(",") if k.strip()]
    if not wanted:
        raise UsageError("--kinds needs at least one event kind, e.g. --kinds error,pool_summary.")
    unknown = [k for k in wanted if k not in EVENT_KINDS]
    if unknown:
        raise UsageError(
            f"unknown event kind {', '.join(repr(k) for k in unknown)} in --kinds; known kinds: {', '.join(EVENT_KINDS)}."
        )
    return frozenset(wanted)


def _open(path: str) -> IO[bytes]:
    if path == "-":
        return sys.stdin.buffer
    p = Path(path)
    try:
        return p.open("rb")
    except FileNotFoundError:
        raise UsageError(f"no such file: {path}.") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory, not a journal file.") from None
    except PermissionError:
        raise UsageError(f"cannot read {path}: permission denied.") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}.") from None


def _lines(stream: IO[bytes]) -> Iterator[str]:
    # Split on b"\n" only: a "\r" inside a line is a tqdm frame, not a line break.
    for raw in stream:
        yield raw.decode("utf-8", "replace").removesuffix("\n").removesuffix("\r")


def _chunks(stream: IO[bytes], size: int = 1 << 16) -> Iterator[list[str]]:
    """The stream's lines, a list at a time: whatever has arrived (`read1`), so a live pipe still streams.

    The same lines as `_lines`: split on b"\n" only, each decoded on its own, one trailing "\r" cut.
    """
    read1 = getattr(stream, "read1", None)
    if read1 is None:
        for line in _lines(stream):
            yield [line]
        return
    tail = b""
    while True:
        data = read1(size)
        if not data:
            break
        parts = (tail + data).split(b"\n") if tail else data.split(b"\n")
        tail = parts.pop()
        if parts:
            yield [raw.decode("utf-8", "replace").removesuffix("\r") for raw in parts]
    if tail:
        yield [tail.decode("utf-8", "replace").removesuffix("\r")]


def _events(stream: IO[bytes]) -> Iterator[Any]:
    """Events of a journal stream through the parser's batch path, flushed at the end."""
    parser = JournalParser()
    for chunk in _chunks(stream):
        yield from parser.feed_many(chunk)
    yield from parser.flush()


def _ranks(event: Any) -> str:
    return " ".join(
        f"{tag}{getattr(event, name)}" for name, tag in _RANK_TAGS if getattr(event, name) is not None
    )


def _detail(event: Any) -> str:
    kind = event.kind
    if kind == "log":
        return event.message
    if kind == "error":
        extra = f" ({len(event.lines)} lines)" if len(event.lines) > 1 else ""
        return f"{event.category}: {event.message}{extra}"
    if kind == "unit":
        unit = f"{event.systemd_unit} " if event.systemd_unit else ""
        result = f" ({event.result})" if event.result else ""
        return f"{unit}{event.state}{result}: {event.message}"
    if kind == "server_args":
        args = event.args
        shown = ", ".join(
            f"{k}={args[k]!r}" for k in ("model_path", "tp_size", "mem_fraction_static") if k in args
        )
        return f"{len(args)} args" + (f": {shown}" if shown else "")
    parts = []
    for name, value in event.__dict__.items():
        if name in _COMMON or value is None:
            continue
        parts.append(f"{name}={value}")
    return " ".join(parts)


def _fit(text: str, width: int) -> str:
    return text.ljust(width) if len(text) <= width else text[: width - 1] + "…"


def _row(event: Any) -> str:
    ts = (event.ts or "")[:19].replace("T", " ")
    return " ".join(
        (
            _fit(ts, _TIME_W),
            _fit(event.host or "", _HOST_W),
            _fit(_ranks(event), _RANK_W),
            _fit(event.kind, _KIND_W),
            _detail(event).replace("\n", " "),
        )
    )


def _write(events: Iterable[Any], as_json: bool, kinds: frozenset[str] | None, header: bool = True) -> None:
    out = sys.stdout
    if header and not as_json:
        out.write(
            " ".join(
                (_fit("TIME", _TIME_W), _fit("HOST", _HOST_W), _fit("RANK", _RANK_W), _fit("KIND", _KIND_W))
            )
            + " DETAIL\n"
        )
    for event in events:
        if kinds is not None and event.kind not in kinds:
            continue
        out.write(event.model_dump_json(exclude_none=True) + "\n" if as_json else _row(event) + "\n")
    out.flush()


def _follow(name: str, hosts_file: str | None, as_json: bool, kinds: frozenset[str] | None) -> int:
    """`parse HOST --follow`: the same rows as `parse FILE`, live; link changes go to stderr."""
    import asyncio

    from console.sources.hosts import HostsError, load_hosts, resolve_host
    from console.sources.journal import follow_unit_events
    from console.sources.transport import Transport, TransportError

    async def follow() -> None:
        host = resolve_host(name, load_hosts(hosts_file))
        transport = Transport(host)

        async def report() -> None:
            async for status in transport.watch():
                if status.state.value != "up":
                    sys.stderr.write(f"k26-console: {host.name}: {status.describe()}\n")

        reporter = asyncio.ensure_future(report())
        try:
            _write((), as_json, kinds)
            async for events in follow_unit_events(transport, host.unit_name, host=host.name):
                _write(events, as_json, kinds, header=False)
        finally:
            reporter.cancel()
            await transport.close()

    try:
        asyncio.run(follow())
    except (HostsError, TransportError) as exc:
        raise UsageError(f"{str(exc).rstrip('.')}.") from None
    return 0


def run(args: argparse.Namespace) -> int:
    kinds = _kinds(args.kinds)
    if args.follow:
        if args.file == "-":
            raise UsageError("--follow needs a HOST to follow, e.g. k26-console parse gpu1 --follow.")
        return _follow(args.file, args.hosts, args.json, kinds)
    stream = _open(args.file)
    try:
        _write(_events(stream), args.json, kinds)
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            raise
        raise UsageError(f"cannot read {args.file}: {exc.strerror or exc}.") from None
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    return 0
