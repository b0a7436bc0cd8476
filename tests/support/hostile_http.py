"""A hostile SGLang HTTP server on loopback, for the bounded-read tests and the bench (issue 30 item 4).

Each path answers one way a broken or hostile server can (`Hostile(mode)` sets what `/metrics` does;
`/health`, `/server_info` and `/model_info` answer as SGLang's do unless the mode is `slow`, which makes
every answer a slowloris):

- `huge`: a `/metrics` body of `size` bytes with its Content-Length, streamed from one repeated block
  (the server holds 64 KiB whatever the size);
- `huge-chunked`: the same with no length (chunked transfer encoding);
- `gzip`: a small body that inflates to `size` bytes, sent `Content-Encoding: gzip` though the client
  asked for identity;
- `slow`: every answer a byte every `drip_s` seconds;
- `text`: `/metrics` answers `text` as it is (values out of range, say).

A thread per connection; `close()` stops it. Only 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import zlib
from typing import Literal

Mode = Literal["huge", "huge-chunked", "gzip", "slow", "text"]

_BLOCK = b'sglang:num_running_reqs{model_name="m",tp_rank="0"} 1.0\n' * 1200


def gzip_bomb(size: int) -> bytes:
    """`size` bytes of zeros gzip-compressed (about a thousandth of `size`), made without holding them."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    out = [c.compress(zeros) for _ in range(size >> 20)]
    out.append(c.flush())
    return b"".join(out)


class Hostile:
    def __init__(self, mode: Mode, *, size: int = 300_000_000, drip_s: float = 5.0, text: str = "") -> None:
        self.mode = mode
        self.size = size
        self.drip_s = drip_s
        self.text = text
        self.sent = 0
        """Bytes of bodies sent so far (how far a client read before it stopped)."""
        self._bomb = gzip_bomb(size) if mode == "gzip" else b""
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()

    def __enter__(self) -> Hostile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            while not self._stop.is_set():
                request = b""
                while b"\r\n\r\n" not in request:
                    data = conn.recv(4096)
                    if not data:
                        return
                    request += data
                path = request.split(b" ", 2)[1].decode()
                self._answer(conn, path)

    def _send(self, conn: socket.socket, head: str, body: bytes) -> None:
        conn.sendall(head.encode() + b"\r\n\r\n")
        self.sent += len(body)
        conn.sendall(body)

    def _answer(self, conn: socket.socket, path: str) -> None:
        if self.mode == "slow":
            head = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 100
            for byte in head:
                if self._stop.wait(self.drip_s):
                    return
                conn.sendall(bytes([byte]))
                self.sent += 1
            return
        if path != "/metrics":
            body = b'{"version": "0.5.13", "max_running_requests": 8}' if "info" in path else b""
            self._send(conn, f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}", body)
            return
        if self.mode == "text":
            body = self.text.encode()
            self._send(conn, f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}", body)
        elif self.mode == "gzip":
            self._send(
                conn,
                f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(self._bomb)}",
                self._bomb,
            )
        elif self.mode == "huge":
            conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {self.size}\r\n\r\n".encode())
            self._stream(conn, chunked=False)
        else:
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            self._stream(conn, chunked=True)

    def _stream(self, conn: socket.socket, *, chunked: bool) -> None:
        left = self.size
        while left > 0 and not self._stop.is_set():
            block = _BLOCK[: min(left, len(_BLOCK))]
            conn.sendall(f"{len(block):x}\r\n".encode() + block + b"\r\n" if chunked else block)
            self.sent += len(block)
            left -= len(block)
        if chunked:
            conn.sendall(b"0\r\n\r\n")
