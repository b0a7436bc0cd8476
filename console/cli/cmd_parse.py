"""`k26-console parse [FILE|-] [--json] [--kinds k1,k2]`: journal text or JSON in, events out.

On a terminal the events are a `rich` table; piped or redirected, plain columns (stable for `grep`,
`awk` and the tests); with `--json`, one JSON object a line. Reads `journalctl` output in any form the parser knows (short text, JSON, docker, bare SGLang lines) from
a file or standard input, one line at a time, so `journalctl -o json -f | k26-console parse -` streams.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from console.cli.errors import UsageError
from console.core.events import EVENT_KINDS, Event, EventBase
from console.core.parser import JournalParser
from console.core.text import LINE_MAX_BYTES, LineSplitter, json_safe, terminal_safe

_COMMON = frozenset(f.name for f in dataclasses.fields(EventBase)) | {"kind"}
_RANK_TAGS = (
    ("dp_rank", "DP"),
    ("pp_rank", "PP"),
    ("attn_cp_rank", "ATTN_CP"),
    ("moe_dp_rank", "MOE_DP"),
    ("tp_rank", "TP"),
    ("ep_rank", "EP"),
)
_TIME_W, _HOST_W, _RANK_W, _KIND_W = 19, 14, 11, 17
CONNECT_ATTEMPTS = 3
"""Tries before a host never reached is an error (the same as verify, probe, audit and apply)."""
CONNECT_TIMEOUT_S = 30.0


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
    """The reference reading, one line at a time (the tests hold `_chunks` to it for lines under the
    limit): split on b"\n" only, since a "\r" inside a line is a tqdm frame, not a line break."""
    for raw in stream:
        yield raw.decode("utf-8", "replace").removesuffix("\n").removesuffix("\r")


def _chunks(
    stream: IO[bytes], size: int = 1 << 16, splitter: LineSplitter | None = None
) -> Iterator[list[str]]:
    """The stream's lines, a list at a time: whatever has arrived (`read1`), so a live pipe still streams.

    Split on b"\n" only (a "\r" inside a line is a tqdm frame, not a line break), each line decoded on its
    own, one trailing "\r" cut, and none longer than `LINE_MAX_BYTES`: a longer one keeps its start and a
    note, so one endless line costs linear time and bounded memory.
    """
    splitter = splitter or LineSplitter()
    read = getattr(stream, "read1", None) or stream.read
    while True:
        data = read(size)
        if not data:
            break
        lines = splitter.feed(data)
        if lines:
            yield lines
    last = splitter.flush()
    if last:
        yield last


def _batches(
    stream: IO[bytes], splitter: LineSplitter, kinds: frozenset[str] | None
) -> Iterator[list[Event]]:
    """`_events` a batch at a time (what has arrived), for the terminal's table."""
    parser = JournalParser(kinds=kinds)
    for chunk in _chunks(stream, splitter=splitter):
        yield parser.feed_many(chunk)
    yield parser.flush()


def _events(
    stream: IO[bytes], splitter: LineSplitter | None = None, kinds: frozenset[str] | None = None
) -> Iterator[Event]:
    """Events of a journal stream through the parser's batch path, flushed at the end; with `kinds`,
    only those are built (the others cost their reading, not their building)."""
    for batch in _batches(stream, splitter or LineSplitter(), kinds):
        yield from batch


def _rich_rows(as_json: bool) -> _RichRows | None:
    """A `rich` table for a person at a terminal; plain columns for a pipe or a file (and `--json`)."""
    return _RichRows() if not as_json and sys.stdout.isatty() else None


def _ranks(event: EventBase) -> str:
    return " ".join(
        f"{tag}{getattr(event, name)}" for name, tag in _RANK_TAGS if getattr(event, name) is not None
    )


def _detail(event: Event) -> str:
    # `event.kind` tested on the event itself (not a copy in a local) narrows the union to its class.
    if event.kind == "log":
        return event.message
    if event.kind == "error":
        extra = f" ({len(event.lines)} lines)" if len(event.lines) > 1 else ""
        return f"{event.category}: {event.message}{extra}"
    if event.kind == "unit":
        unit = f"{event.systemd_unit} " if event.systemd_unit else ""
        result = f" ({event.result})" if event.result else ""
        return f"{unit}{event.state}{result}: {event.message}"
    if event.kind == "server_args":
        args = event.args
        shown = ", ".join(
            f"{k}={args[k]!r}" for k in ("model_path", "tp_size", "mem_fraction_static") if k in args
        )
        return f"{len(args)} args" + (f": {shown}" if shown else "")
    parts = []
    for f in dataclasses.fields(event):  # the fields in order
        value = getattr(event, f.name)
        if f.name in _COMMON or value is None:
            continue
        parts.append(f"{f.name}={value}")
    return " ".join(parts)


def _fit(text: str, width: int) -> str:
    return text.ljust(width) if len(text) <= width else text[: width - 1] + "…"


def _row(event: Event) -> str:
    # Every field but the fixed ones comes from the journal: control characters are drawn, not sent (an
    # ESC in a host name or a message would retitle the window or move the cursor), and a line break in
    # a message stays one row.
    ts = terminal_safe((event.ts or "")[:19].replace("T", " "))
    return " ".join(
        (
            _fit(ts, _TIME_W),
            _fit(terminal_safe(event.host or ""), _HOST_W),
            _fit(_ranks(event), _RANK_W),
            _fit(event.kind, _KIND_W),
            terminal_safe(_detail(event).replace("\n", " ")),
        )
    )


_KIND_STYLE = {
    "error": "bold red",
    "pool_summary": "bold green",
    "pool_clamped": "bold yellow",
    "server_ready": "green",
    "unit": "cyan",
    "log": "dim",
}


class _RichRows:
    """The table on a terminal: `rich` tables with fixed columns, one per batch of events, so rows
    stream as they arrive (`journalctl -f | k26-console parse -`) and line up from batch to batch."""

    def __init__(self) -> None:
        from rich.console import Console

        self._console = Console(highlight=False, soft_wrap=False)
        self._header = True

    def write(self, events: list[Event]) -> None:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        if not events and not self._header:
            return
        table = Table(box=box.SIMPLE_HEAD if self._header else None, show_header=self._header, pad_edge=False)
        table.add_column("TIME", width=_TIME_W, no_wrap=True)
        table.add_column("HOST", width=_HOST_W, no_wrap=True, overflow="ellipsis")
        table.add_column("RANK", width=_RANK_W, no_wrap=True, overflow="ellipsis")
        table.add_column("KIND", width=_KIND_W, no_wrap=True)
        table.add_column("DETAIL", ratio=1, overflow="fold")
        for event in events:
            # Text objects, not markup: a `[bold]` in a journal line is shown as written. Control
            # characters are drawn safe first (an ESC in a host name would move the cursor).
            table.add_row(
                Text(terminal_safe((event.ts or "")[:19].replace("T", " "))),
                Text(terminal_safe(event.host or "")),
                Text(_ranks(event)),
                Text(event.kind, style=_KIND_STYLE.get(event.kind, "")),
                Text(terminal_safe(_detail(event).replace("\n", " "))),
            )
        self._console.print(table)
        self._header = False


def _write(
    events: Iterable[Event],
    as_json: bool,
    kinds: frozenset[str] | None,
    header: bool = True,
    rich_rows: _RichRows | None = None,
) -> None:
    if rich_rows is not None and not as_json:
        rich_rows.write([e for e in events if kinds is None or e.kind in kinds])
        return
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
        out.write(
            json_safe(event.model_dump_json(exclude_none=True)) + "\n" if as_json else _row(event) + "\n"
        )
    out.flush()


def _follow(name: str, hosts_file: str | None, as_json: bool, kinds: frozenset[str] | None) -> int:
    """`parse HOST --follow`: the same rows as `parse FILE`, live; link changes go to stderr.

    The rule of every command that reaches a host: a host never reached (a name that does not resolve,
    a refused connection) is an error after a few tries, exit 2; once the journal flows, a drop is
    waited out and the follow resumes from its cursor.
    """
    import asyncio

    from console.cli.remote import inventory_host
    from console.sources.hosts import HostsError
    from console.sources.journal import follow_unit_events
    from console.sources.transport import Backoff, Transport, TransportError

    rich_rows = _rich_rows(as_json)
    host = inventory_host(name, hosts_file, strict=False)  # a typo is refused before any connection

    async def follow() -> None:
        transport = Transport(host, backoff=Backoff(max_attempts=CONNECT_ATTEMPTS))
        reporter: asyncio.Future[None] | None = None

        async def report() -> None:
            async for status in transport.watch():
                if status.state.value != "up":
                    sys.stderr.write(f"k26-console: {terminal_safe(status.describe())}\n")

        try:
            await transport.wait_up(CONNECT_TIMEOUT_S)
            # Reached once: from here on a lost connection is waited out rather than given up on.
            transport.backoff = Backoff()
            reporter = asyncio.ensure_future(report())
            _write((), as_json, kinds, rich_rows=rich_rows)
            async for events in follow_unit_events(transport, host.unit_name, host=host.name):
                _write(events, as_json, kinds, header=False, rich_rows=rich_rows)
        finally:
            if reporter is not None:
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
    splitter = LineSplitter()
    rich_rows = _rich_rows(args.json)
    try:
        if rich_rows is not None:
            for batch in _batches(stream, splitter, kinds):
                rich_rows.write(batch)
        else:
            _write(_events(stream, splitter, kinds), args.json, kinds)
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            raise
        raise UsageError(f"cannot read {args.file}: {exc.strerror or exc}.") from None
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    if splitter.cut:
        # The cut lines carry their own note; this says it once where a --kinds filter or a pipe hides it.
        many = f"{splitter.cut:,} lines" if splitter.cut > 1 else "1 line"
        sys.stderr.write(
            f"k26-console: {many} longer than {LINE_MAX_BYTES:,} bytes kept only their start "
            f"(marked 'line cut' in the output).\n"
        )
    return 0
