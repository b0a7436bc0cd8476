"""The twin's journal: one writer process per twin, fed by every other process through a unix socket.

Native mode: the writer pipes the journal export format into one long-lived `systemd-journal-remote`,
which keeps real journal files under `<root>/journal/`; the real `journalctl --directory=...` reads them,
`-f` included (measured: an entry reaches a following `journalctl -f` about 0.5 ms after it is written).
A single writer is what keeps several producers (the supervisor, `systemctl`) from corrupting the files
and gives every entry one sequence number and a monotonic timestamp, as journald does.

Fallback mode (no systemd-journal-remote or journalctl on this machine): the writer appends each entry to
`<root>/journal/journal.jsonl` exactly as `journalctl -o json` prints it, cursor included, and the
`journalctl` stand-in (console.twin.journalctl) reads that file.

Producers send one JSON object of string fields per line; the writer stamps `__REALTIME_TIMESTAMP`,
`__MONOTONIC_TIMESTAMP`, `_BOOT_ID`, `_MACHINE_ID` and `_HOSTNAME` at receipt, like journald.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import TextIO

from console.twin.layout import JOURNAL_REMOTE, TwinConfig, TwinLayout
from console.twin.units import stop_when_owner_gone

# Fields journald puts first in `-o json` output; the rest follow in the order they were written.
_LEADING = ("__CURSOR", "__REALTIME_TIMESTAMP", "__MONOTONIC_TIMESTAMP", "_BOOT_ID")


def export_entry(fields: dict[str, str]) -> bytes:
    """One entry in the journal export format (binary-safe form for values holding a newline)."""
    out = bytearray()
    for key, value in fields.items():
        data = value.encode("utf-8", "surrogateescape")
        if b"\n" in data:
            out += key.encode() + b"\n" + len(data).to_bytes(8, "little") + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    out += b"\n"
    return bytes(out)


def make_cursor(seqnum_id: str, seqnum: int, boot_id: str, mono: int, realtime: int) -> str:
    x = hashlib.sha1(f"{seqnum_id}{seqnum}{realtime}".encode()).hexdigest()[:16]
    return f"s={seqnum_id};i={seqnum:x};b={boot_id};m={mono:x};t={realtime:x};x={x}"


class _Writer:
    def __init__(self, layout: TwinLayout, cfg: TwinConfig) -> None:
        self.layout = layout
        self.cfg = cfg
        self.last_realtime = 0
        self.last_mono = 0
        self.remote: asyncio.subprocess.Process | None = None
        self.fallback_file: TextIO | None = None
        self.seqnum = 0
        self.seqnum_id = uuid.uuid4().hex

    async def open(self) -> None:
        self.layout.journal_dir.mkdir(parents=True, exist_ok=True)
        if self.cfg.journal == "native":
            self.remote = await asyncio.create_subprocess_exec(
                JOURNAL_REMOTE,
                f"--output={self.layout.journal_dir / 'twin.journal'}",
                "--split-mode=none",
                "-",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
        else:
            path = self.layout.fallback_journal
            # Continue the sequence of an existing file so cursors stay ordered across twin restarts.
            if path.exists():
                with path.open("rb") as f:
                    last = b""
                    for line in f:
                        if line.strip():
                            last = line
                if last:
                    with contextlib.suppress(ValueError, KeyError):
                        cursor = json.loads(last)["__CURSOR"]
                        parts = dict(p.split("=", 1) for p in cursor.split(";"))
                        self.seqnum_id = parts["s"]
                        self.seqnum = int(parts["i"], 16)
            self.fallback_file = path.open("a", encoding="utf-8")

    def stamp(self, fields: dict[str, str]) -> dict[str, str]:
        realtime = max(time.time_ns() // 1000, self.last_realtime + 1)
        mono = max(time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000, self.last_mono + 1)
        self.last_realtime, self.last_mono = realtime, mono
        entry = {
            "__REALTIME_TIMESTAMP": str(realtime),
            "__MONOTONIC_TIMESTAMP": str(mono),
            "_BOOT_ID": self.cfg.boot_id,
        }
        entry.update(fields)
        entry.setdefault("_MACHINE_ID", self.cfg.machine_id)
        entry.setdefault("_HOSTNAME", self.cfg.hostname)
        return entry

    async def write(self, fields: dict[str, str]) -> None:
        entry = self.stamp(fields)
        if self.remote is not None:
            assert self.remote.stdin is not None
            self.remote.stdin.write(export_entry(entry))
            await self.remote.stdin.drain()
        elif self.fallback_file is not None:
            self.seqnum += 1
            cursor = make_cursor(
                self.seqnum_id,
                self.seqnum,
                entry["_BOOT_ID"],
                int(entry["__MONOTONIC_TIMESTAMP"]),
                int(entry["__REALTIME_TIMESTAMP"]),
            )
            ordered = {"__CURSOR": cursor}
            ordered.update({k: entry[k] for k in _LEADING[1:]})
            ordered.update({k: v for k, v in entry.items() if k not in ordered})
            self.fallback_file.write(json.dumps(ordered, ensure_ascii=False) + "\n")
            self.fallback_file.flush()

    async def close(self) -> None:
        if self.remote is not None and self.remote.stdin is not None:
            self.remote.stdin.close()
            try:
                async with asyncio.timeout(5):
                    await self.remote.wait()
            except TimeoutError:
                self.remote.kill()
                await self.remote.wait()
        if self.fallback_file is not None:
            self.fallback_file.close()


async def serve(layout: TwinLayout) -> None:
    """Run the writer until SIGTERM/SIGINT; prints `ready` once producers may connect."""
    cfg = layout.load_config()
    writer = _Writer(layout, cfg)
    await writer.open()
    lock = asyncio.Lock()

    async def handle(reader: asyncio.StreamReader, conn: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                try:
                    fields = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if not isinstance(fields, dict):
                    continue
                ack = fields.pop("_ACK", None)
                async with lock:
                    await writer.write({str(k): str(v) for k, v in fields.items()})
                if ack is not None:
                    if writer.remote is not None:
                        # journal-remote takes ~0.5 ms to put a piped entry into the file; an
                        # acknowledged entry must be readable by the time the producer goes on.
                        await asyncio.sleep(0.02)
                    conn.write(b"ok\n")
                    await conn.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            conn.close()

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(layout.journal_socket)
    server = await asyncio.start_unix_server(handle, sock=sock)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sys.stdout.write("ready\n")
    sys.stdout.flush()

    def owner_gone() -> None:
        # the supervisor notices the same and writes its last systemd lines first: give it that time
        loop.call_later(5.0, stop.set)

    watchdog = asyncio.ensure_future(stop_when_owner_gone(layout, owner_gone))
    await stop.wait()
    watchdog.cancel()
    server.close()
    # Let producers that are still connected (a supervisor writing its last lines) finish.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(2):
            await server.wait_closed()
    await writer.close()


class JournalClient:
    """A producer's connection to the twin's journal writer (blocking; lines are small and local)."""

    def __init__(self, layout: TwinLayout) -> None:
        self.layout = layout
        self.sock: socket.socket | None = None

    def _connect(self) -> socket.socket:
        if self.sock is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(self.layout.journal_socket)
            self.sock = s
        return self.sock

    def send(self, fields: dict[str, str], *, wait: bool = False) -> None:
        """Send one entry; with `wait`, return only once it is in the journal (readers can see it)."""
        payload = dict(fields)
        if wait:
            payload["_ACK"] = "1"
        data = (json.dumps(payload) + "\n").encode()
        for attempt in range(2):
            try:
                s = self._connect()
                s.sendall(data)
                if wait:
                    self._read_ack(s)
                return
            except OSError:
                self.close()
                if attempt:
                    raise

    def _read_ack(self, s: socket.socket) -> None:
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(16)
            if not chunk:
                raise ConnectionError("journal writer went away")
            buf += chunk

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "serve":
        sys.stderr.write("usage: python -m console.twin.journal serve ROOT\n")
        return 2
    layout = TwinLayout(Path(args[1]))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(layout))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
