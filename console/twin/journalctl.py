"""`journalctl` for a twin whose machine lacks systemd-journal-remote: reads `<root>/journal/journal.jsonl`.

Implements what the console and an operator use, with journalctl's semantics: `-u UNIT` (the unit's own
output plus systemd's lines about it), `FIELD=VALUE` matches, `-o short|short-iso|short-precise|cat|json|
json-pretty`, `-n N`, `-f`, `--since/--until`, `--cursor/--after-cursor`, `--show-cursor`, `-q`,
`--no-pager`, `-b` (this twin has one boot), `-t IDENTIFIER`.
"""

from __future__ import annotations

import argparse
import json
import re
import select
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

from console.twin.layout import TwinLayout


class _Args(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"journalctl: {message}\n")
        raise SystemExit(1)


def _parser() -> argparse.ArgumentParser:
    p = _Args(prog="journalctl", add_help=True)
    p.add_argument("-u", "--unit", action="append", default=[])
    p.add_argument("-t", "--identifier", action="append", default=[])
    p.add_argument("-o", "--output", default="short")
    p.add_argument("-n", "--lines", nargs="?", const="10", default=None)
    p.add_argument("-f", "--follow", action="store_true")
    p.add_argument("-S", "--since")
    p.add_argument("-U", "--until")
    p.add_argument("-c", "--cursor")
    p.add_argument("--after-cursor")
    p.add_argument("--show-cursor", action="store_true")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("--no-pager", action="store_true")
    p.add_argument("-a", "--all", action="store_true")
    p.add_argument("-e", "--pager-end", action="store_true")
    p.add_argument("-b", "--boot", nargs="?", const="0")
    p.add_argument("--no-hostname", action="store_true")
    p.add_argument("--system", action="store_true")
    p.add_argument("-D", "--directory")
    p.add_argument("matches", nargs="*")
    return p


_SPAN_UNITS = {
    "us": 1e-6,
    "usec": 1e-6,
    "ms": 1e-3,
    "msec": 1e-3,
    "s": 1,
    "sec": 1,
    "second": 1,
    "seconds": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "minutes": 60,
    "h": 3600,
    "hour": 3600,
    "hours": 3600,
    "d": 86400,
    "day": 86400,
    "days": 86400,
    "w": 604800,
    "week": 604800,
    "weeks": 604800,
}


def parse_time(value: str, now: float | None = None) -> float:
    """systemd.time(7) timestamps journalctl takes: absolute, `@EPOCH`, `now`/`today`/`yesterday`,
    `-5min`, `+1h`, `5 min ago`."""
    now = time.time() if now is None else now
    v = value.strip()
    if v == "now":
        return now
    midnight = datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
    if v == "today":
        return midnight.timestamp()
    if v == "yesterday":
        return (midnight - timedelta(days=1)).timestamp()
    if v == "tomorrow":
        return (midnight + timedelta(days=1)).timestamp()
    if v.startswith("@"):
        return float(v[1:])
    sign = 0
    body = v
    if v.startswith(("-", "+")):
        sign = -1 if v[0] == "-" else 1
        body = v[1:]
    elif v.endswith(" ago"):
        sign = -1
        body = v[: -len(" ago")]
    if sign:
        parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]+)", body)
        if not parts or re.sub(r"[\d.\sa-z]", "", body):
            raise ValueError(value)
        total = 0.0
        for number, unit in parts:
            if unit not in _SPAN_UNITS:
                raise ValueError(value)
            total += float(number) * _SPAN_UNITS[unit]
        return now + sign * total
    for fmt in (
        "%Y-%m-%d %H:%M:%S.%f",
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%d",
        "%H:%M:%S",
        "%H:%M",
    ):
        try:
            parsed = datetime.strptime(v, fmt)
        except ValueError:
            continue
        if fmt.startswith("%H"):
            parsed = datetime.combine(midnight.date(), parsed.time())
        return parsed.timestamp()
    raise ValueError(value)


def _seq(cursor: str) -> int:
    parts = dict(p.split("=", 1) for p in cursor.split(";") if "=" in p)
    return int(parts["i"], 16)


def _unit_name(name: str) -> str:
    return name if "." in name else f"{name}.service"


class _Filter:
    def __init__(self, args: argparse.Namespace) -> None:
        self.units = [_unit_name(u) for u in args.unit]
        self.identifiers = args.identifier
        self.matches: dict[str, set[str]] = {}
        for m in args.matches:
            if m == "+":
                continue
            if "=" not in m:
                raise ValueError(m)
            k, v = m.split("=", 1)
            self.matches.setdefault(k, set()).add(v)

    def __call__(self, e: dict[str, str]) -> bool:
        if self.units and not any(
            e.get("_SYSTEMD_UNIT") == u or (e.get("_PID") == "1" and e.get("UNIT") == u) for u in self.units
        ):
            return False
        if self.identifiers and e.get("SYSLOG_IDENTIFIER") not in self.identifiers:
            return False
        return all(e.get(k) in vs for k, vs in self.matches.items())


def _read_entries(path: Path, offset: int) -> tuple[list[dict[str, str]], int]:
    """Complete lines from `offset`; a line still being written stays for the next read."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    entries = []
    for line in data[:end].split(b"\n"):
        if line.strip():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return entries, offset + end


DATA_THRESHOLD = 4096  # journalctl's default: larger fields print as null in JSON unless --all


def _printable(value: str) -> bool:
    return not any((ord(c) < 32 and c not in "\t\n") or 0x7F <= ord(c) <= 0x9F for c in value)


def _json_fields(e: dict[str, str], show_all: bool) -> dict[str, object]:
    """What real journalctl prints: big fields as null, fields with control characters as byte arrays."""
    out: dict[str, object] = {}
    for k, v in e.items():
        data = v.encode("utf-8", "surrogateescape")
        if not show_all and len(data) > DATA_THRESHOLD and not k.startswith("__"):
            out[k] = None
        elif _printable(v):
            out[k] = v
        else:
            out[k] = list(data)
    return out


def _format(e: dict[str, str], output: str, no_hostname: bool, show_all: bool = False) -> str:
    if output == "json":
        return json.dumps(_json_fields(e, show_all), ensure_ascii=False, separators=(",", ":"))
    if output == "json-pretty":
        return json.dumps(_json_fields(e, show_all), ensure_ascii=False, indent=1)
    msg = e.get("MESSAGE", "")
    if output == "cat":
        return msg
    ts = int(e.get("__REALTIME_TIMESTAMP", "0")) / 1e6
    dt = datetime.fromtimestamp(ts)
    if output == "short-iso":
        stamp = dt.astimezone().isoformat(timespec="seconds")
    elif output == "short-precise":
        stamp = dt.strftime("%b %d %H:%M:%S.%f")
    else:
        stamp = dt.strftime("%b %d %H:%M:%S")
    ident = e.get("SYSLOG_IDENTIFIER") or e.get("_COMM") or "unknown"
    pid = e.get("SYSLOG_PID") or e.get("_PID")
    host = "" if no_hostname else f" {e.get('_HOSTNAME', 'localhost')}"
    who = f"{ident}[{pid}]" if pid else ident
    return f"{stamp}{host} {who}: {msg}"


def run(args: argparse.Namespace, layout: TwinLayout) -> int:
    outputs = {"short", "short-iso", "short-precise", "cat", "json", "json-pretty"}
    if args.output not in outputs:
        sys.stderr.write(f"Unknown output format '{args.output}'.\n")
        return 1
    try:
        flt = _Filter(args)
    except ValueError as exc:
        sys.stderr.write(f"Failed to add match '{exc}': Invalid argument\n")
        return 1
    try:
        since = parse_time(args.since) * 1e6 if args.since else None
        until = parse_time(args.until) * 1e6 if args.until else None
    except ValueError as exc:
        sys.stderr.write(f"Failed to parse timestamp: {exc}\n")
        return 1
    lines: int | None = None
    oldest = False
    if args.lines is not None:
        if args.lines == "all":
            lines = None
        else:
            text = args.lines
            oldest = text.startswith("+")
            try:
                lines = int(text.lstrip("+"))
            except ValueError:
                sys.stderr.write(f"Failed to parse lines '{args.lines}'\n")
                return 1
    elif args.follow or args.pager_end:
        lines = 10 if args.follow else 1000

    path = layout.fallback_journal
    entries, offset = _read_entries(path, 0)
    start_after: int | None = None
    if args.after_cursor or args.cursor:
        try:
            cur = _seq(args.after_cursor or args.cursor)
        except (KeyError, ValueError):
            sys.stderr.write("Failed to seek to cursor: Invalid argument\n")
            return 1
        start_after = cur if args.after_cursor else cur - 1

    def keep(e: dict[str, str]) -> bool:
        rt = int(e.get("__REALTIME_TIMESTAMP", "0"))
        if since is not None and rt < since:
            return False
        if until is not None and rt > until:
            return False
        if start_after is not None and _seq(e["__CURSOR"]) <= start_after:
            return False
        return flt(e)

    shown = [e for e in entries if keep(e)]
    if lines is not None and start_after is None:
        shown = shown[:lines] if oldest else shown[-lines:] if lines else []
    out = sys.stdout
    last_cursor = shown[-1]["__CURSOR"] if shown else None
    try:
        for e in shown:
            out.write(_format(e, args.output, args.no_hostname, args.all) + "\n")
        if not shown and not args.quiet and not args.follow and args.output not in ("json", "cat"):
            out.write("-- No entries --\n")
        if args.show_cursor and last_cursor and not args.follow:
            out.write(f"-- cursor: {last_cursor}\n")
        out.flush()
        if not args.follow:
            return 0
        # Like journalctl, end when the reader of stdout goes away (an SSH channel closed), even while
        # no entry arrives to fail a write on.
        watch = select.poll()
        watch.register(sys.stdout.fileno(), 0)
        while True:
            if any(ev & (select.POLLERR | select.POLLHUP) for _, ev in watch.poll(50)):
                return 0
            new, offset = _read_entries(path, offset)
            shown_now = [e for e in new if keep(e)]
            for e in shown_now:
                out.write(_format(e, args.output, args.no_hostname, args.all) + "\n")
            if shown_now:
                out.flush()
    except BrokenPipeError:
        return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    layout = TwinLayout.from_env()
    try:
        return run(args, layout)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
