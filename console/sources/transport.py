"""One SSH connection per host, kept up: strict host keys, reconnect with backoff, visible state.

- asyncssh reads the user's `~/.ssh/config` (an alias works as is), the agent and `known_hosts`; the
  hosts file may name an `identity_file` and a `known_hosts` file of its own.
- An unknown or changed host key is refused, never accepted: the status says so in one sentence with
  the fingerprint the server presented, and the transport stops trying (retrying cannot fix it).
- After a drop or a failed attempt the supervisor reconnects with exponential backoff and jitter; its
  state (connecting / up / retrying in Ns / failed: reason) is a `ConnectionStatus` anyone can watch.
- Every remote command is an argument list joined with `shlex.join`: nothing from a host name, a unit
  name or a cursor is ever read by the remote shell as syntax.
- `LocalForward` listens on 127.0.0.1 with a port that stays the same across reconnects, and opens a
  fresh SSH channel to the far side for each client connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import random
import shlex
import socket
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import asyncssh
from pydantic import BaseModel, ConfigDict, Field

from console.core.snapshot import ConnectionStatus, ConnState
from console.sources.hosts import HostConfig

__all__ = [
    "Backoff",
    "CommandResult",
    "ConnState",
    "ConnectionStatus",
    "HostKeyRefused",
    "LocalForward",
    "RemoteStream",
    "Transport",
    "TransportError",
    "quote",
]


class Backoff(BaseModel):
    """Exponential backoff with jitter; `max_attempts=None` retries for as long as the console runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    initial_s: float = Field(default=0.5, gt=0)
    factor: float = Field(default=2.0, ge=1)
    max_s: float = Field(default=30.0, gt=0)
    jitter: float = Field(default=0.3, ge=0, le=1)
    """Each delay is drawn from [d·(1-jitter), d]: consoles that lost a host together do not return in step."""
    max_attempts: int | None = Field(default=None, ge=1)
    stable_s: float = Field(default=5.0, ge=0)
    """A connection that lived shorter than this counts as a failed attempt when it drops, so a host
    that accepts and then closes at once is not hammered."""

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """The wait before the next attempt after `failures` consecutive failures; after a drop of a
        healthy connection (`failures == 0`) only a short jittered pause."""
        draw = (rng or random).random()
        if failures <= 0:
            return self.initial_s * self.jitter * draw
        base = min(self.max_s, self.initial_s * self.factor ** (failures - 1))
        return base * (1 - self.jitter * draw)


class TransportError(Exception):
    """The host cannot be reached or a command could not run; `str()` is one sentence."""


class _SetupError(TransportError):
    """The host's settings cannot work (a missing key file): retrying would not help."""


class HostKeyRefused(TransportError):
    def __init__(self, sentence: str, fingerprint: str | None, changed: bool) -> None:
        super().__init__(sentence)
        self.fingerprint = fingerprint
        self.changed = changed


class CommandResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    argv: tuple[str, ...]
    exit_status: int | None
    """None when the command died of a signal or the channel closed before it said."""
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    def first_error_line(self) -> str:
        for line in (self.stderr + "\n" + self.stdout).splitlines():
            if line.strip():
                return line.strip()
        return f"exit status {self.exit_status}"


def quote(argv: Sequence[str]) -> str:
    if not argv:
        raise ValueError("a remote command needs at least a program name")
    return shlex.join(str(a) for a in argv)


_DEFAULT_KNOWN_HOSTS = Path("~", ".ssh", "known_hosts")


class _Client(asyncssh.SSHClient):
    """Records the key a server presented when it was not trusted, to name its fingerprint, and the
    reason a connection ended. Returning False keeps asyncssh's refusal: nothing is accepted here."""

    def __init__(self) -> None:
        self.rejected: tuple[str, str, int, asyncssh.SSHKey] | None = None
        self.lost: Exception | None = None

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self.rejected = (host, addr, port, key)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc


def _describe_error(exc: BaseException, where: str, timeout: float) -> str:
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return f"no answer from {where} within {timeout:g} s"
    if isinstance(exc, ConnectionRefusedError):
        return f"{where} refused the connection (is sshd running there?)"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host name of {where}"
    if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return f"{where} is unreachable ({exc.strerror})"
    if isinstance(exc, asyncssh.PermissionDenied):
        return f"{where} refused our SSH credentials (check the user, the identity file and the agent)"
    if isinstance(exc, asyncssh.DisconnectError):
        return f"{where} closed the connection: {exc.reason or type(exc).__name__}"
    if isinstance(exc, OSError):
        return f"cannot connect to {where}: {exc.strerror or exc}"
    return f"cannot connect to {where}: {exc or type(exc).__name__}"


class Transport:
    """The SSH connection to one host, kept up by a supervisor task.

    `start()` launches the supervisor; `wait_up()` returns the live connection (or raises with the
    reason when the transport has failed); `run()`, `stream()` and `LocalForward` use whatever
    connection is current. `drop()` aborts the current connection (the supervisor reconnects).
    """

    def __init__(
        self,
        host: HostConfig,
        *,
        backoff: Backoff | None = None,
        connect_timeout: float = 10.0,
        keepalive_interval: float = 5.0,
        keepalive_count_max: int = 3,
        ssh_config: Sequence[str | Path] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.host = host
        self.backoff = backoff or Backoff()
        self.connect_timeout = connect_timeout
        self.keepalive_interval = keepalive_interval
        self.keepalive_count_max = keepalive_count_max
        # None: asyncssh's default (~/.ssh/config); tests pass [] so the runner's own config stays out.
        self._ssh_config = ssh_config
        self._rng = rng or random.Random()
        self._conn: asyncssh.SSHClientConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._status = ConnectionStatus(host=host.name, state=ConnState.CONNECTING, since=time.time())
        self._changed = asyncio.Event()
        self._closing = False
        self._drops = 0
        self._failure: TransportError | None = None

    # ---- state -------------------------------------------------------------------------------------

    @property
    def status(self) -> ConnectionStatus:
        return self._status

    @property
    def connection(self) -> asyncssh.SSHClientConnection | None:
        return self._conn if self._status.state is ConnState.UP else None

    def _set(self, state: ConnState, **fields: Any) -> None:
        self._status = ConnectionStatus(
            host=self.host.name, state=state, since=time.time(), drops=self._drops, **fields
        )
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def watch(self) -> AsyncIterator[ConnectionStatus]:
        """The current status, then every change, until the transport is closed."""
        last = None
        while True:
            status, changed = self._status, self._changed
            if status is not last:
                yield status
                last = status
            if status.state is ConnState.CLOSED:
                return
            await changed.wait()

    async def wait_up(self, timeout: float | None = None) -> asyncssh.SSHClientConnection:
        """The live connection; waits through connecting/retrying. Raises `TransportError` with the
        reason once the transport has failed or closed, or when `timeout` passes first."""
        self.start()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            status, changed = self._status, self._changed
            if status.state is ConnState.UP and self._conn is not None and not self._conn.is_closed():
                return self._conn
            if status.state is ConnState.FAILED:
                if self._failure is not None:
                    raise self._failure
                raise TransportError(status.reason or f"cannot connect to {self.host.name}")
            if status.state is ConnState.CLOSED:
                raise TransportError(f"the connection to {self.host.name} is closed")
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise TransportError(f"{self.host.name} is not reachable ({status.describe()})")
            try:
                async with asyncio.timeout(remaining):
                    await changed.wait()
            except TimeoutError:
                continue

    # ---- supervisor ----------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None and not self._closing:
            self._task = asyncio.get_running_loop().create_task(
                self._supervise(), name=f"ssh-supervisor-{self.host.name}"
            )

    def _where(self) -> str:
        return self.host.describe()

    def _options(self) -> asyncssh.SSHClientConnectionOptions:
        host = self.host
        kwargs: dict[str, Any] = {
            "host": host.ssh_host,
            "connect_timeout": self.connect_timeout,
            "login_timeout": self.connect_timeout,
            "keepalive_interval": self.keepalive_interval,
            "keepalive_count_max": self.keepalive_count_max,
        }
        if self._ssh_config is not None:
            kwargs["config"] = [str(p) for p in self._ssh_config]
        if host.port is not None:
            kwargs["port"] = host.port
        if host.ssh_user is not None:
            kwargs["username"] = host.ssh_user
        for label, path in (("identity file", host.identity_file), ("known_hosts file", host.known_hosts)):
            if path is not None and not path.is_file():
                raise _SetupError(f"the {label} {path} named for {host.name} does not exist")
        if host.identity_file is not None:
            kwargs["client_keys"] = [str(host.identity_file)]
        if host.known_hosts is not None:
            kwargs["known_hosts"] = str(host.known_hosts)
        try:
            options = asyncssh.SSHClientConnectionOptions(**kwargs)
        except (OSError, ValueError, asyncssh.Error) as exc:
            raise _SetupError(f"the SSH settings for {host.name} cannot be used: {exc}") from None
        if options.known_hosts is None:
            # `UserKnownHostsFile none` in the ssh config turns asyncssh's checking off; the console
            # never connects unchecked, so fall back to the user's own known_hosts (or to none at
            # all, which refuses every key with its fingerprint).
            default = _DEFAULT_KNOWN_HOSTS.expanduser()
            options = asyncssh.SSHClientConnectionOptions(
                options, known_hosts=str(default) if default.is_file() else b""
            )
        return options

    def _refusal(self, client: _Client, options: asyncssh.SSHClientConnectionOptions) -> HostKeyRefused:
        if client.rejected is None:
            return HostKeyRefused(
                f"the host key of {self.host.name} ({self._where()}) could not be verified, "
                "so the console refuses to connect",
                None,
                changed=False,
            )
        host, addr, port, key = client.rejected
        fingerprint = key.get_fingerprint("sha256")
        presented = f"{key.get_algorithm()} {fingerprint}"
        known = options.known_hosts
        if isinstance(known, str):
            label = known
        elif isinstance(known, list):
            label = ", ".join(map(str, known))
        else:
            label = "any known_hosts file"
        try:
            trusted = asyncssh.match_known_hosts(known, host, addr, None if port == 22 else port)[0]
        except (OSError, ValueError, asyncssh.KeyImportError):
            trusted = []
        where = f"{self.host.name} ({addr} port {port})"
        if trusted:
            return HostKeyRefused(
                f"the host key of {where} has CHANGED: it presents {presented}, which does not match "
                f"{label}, so the console refuses to connect (if the change is expected, remove the old "
                "entry with ssh-keygen -R and check the new fingerprint)",
                fingerprint,
                changed=True,
            )
        return HostKeyRefused(
            f"the host key of {where} is unknown: it presents {presented}, which is not in {label}, so "
            "the console refuses to connect (check the fingerprint, then add it with ssh-keyscan or one "
            "interactive ssh login)",
            fingerprint,
            changed=False,
        )

    async def _connect(self) -> tuple[asyncssh.SSHClientConnection, _Client]:
        options = self._options()
        client = _Client()
        try:
            conn = await asyncssh.connect(self.host.ssh_host, options=options, client_factory=lambda: client)
        except asyncssh.HostKeyNotVerifiable:
            raise self._refusal(client, options) from None
        return conn, client

    async def _supervise(self) -> None:
        failures = 0
        while not self._closing:
            if not (self._status.state is ConnState.CONNECTING and self._status.attempt == failures):
                self._set(ConnState.CONNECTING, attempt=failures)
            started = time.monotonic()
            try:
                conn, client = await self._connect()
            except HostKeyRefused as exc:
                self._failure = exc
                self._set(
                    ConnState.FAILED, reason=str(exc), fingerprint=exc.fingerprint, attempt=failures + 1
                )
                return
            except _SetupError as exc:
                self._failure = exc
                self._set(ConnState.FAILED, reason=str(exc), attempt=failures + 1)
                return
            except asyncio.CancelledError:
                raise
            except (OSError, asyncssh.Error, TimeoutError, ValueError) as exc:
                failures += 1
                reason = _describe_error(exc, self._where(), self.connect_timeout)
                fatal = isinstance(exc, asyncssh.PermissionDenied | ValueError)
                limit = self.backoff.max_attempts
                if fatal or (limit is not None and failures >= limit):
                    self._failure = TransportError(reason)
                    self._set(ConnState.FAILED, reason=reason, attempt=failures)
                    return
                delay = self.backoff.delay(failures, self._rng)
                self._set(ConnState.RETRYING, reason=reason, attempt=failures, retry_in_s=delay)
                await asyncio.sleep(delay)
                continue
            self._conn = conn
            self._set(ConnState.UP, connect_s=time.monotonic() - started)
            up_at = time.monotonic()
            await conn.wait_closed()
            self._conn = None
            if self._closing:
                break
            self._drops += 1
            lost = client.lost
            reason = f"connection to {self._where()} lost" + (f": {lost}" if lost and str(lost) else "")
            # A drop of a healthy connection is not a failure: the first retry comes after a short
            # jittered pause. A connection that dies young counts as a failure and lengthens the wait.
            failures = failures + 1 if time.monotonic() - up_at < self.backoff.stable_s else 0
            delay = self.backoff.delay(failures, self._rng)
            self._set(ConnState.RETRYING, reason=reason, attempt=failures, retry_in_s=delay)
            await asyncio.sleep(delay)
        self._set(ConnState.CLOSED)

    def drop(self) -> None:
        """Abort the current connection as a network failure would; the supervisor reconnects."""
        if self._conn is not None:
            self._conn.abort()

    async def close(self) -> None:
        self._closing = True
        conn, task = self._conn, self._task
        if conn is not None:
            conn.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await conn.wait_closed()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._conn = None
        self._set(ConnState.CLOSED)

    async def __aenter__(self) -> Transport:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- commands ------------------------------------------------------------------------------------

    async def run(
        self, argv: Sequence[str], *, timeout: float | None = 30.0, input: str | None = None
    ) -> CommandResult:
        """Run a command to completion. The exit status is data, not an exception; a lost connection
        or a timeout raises `TransportError`."""
        conn = await self.wait_up(timeout)
        command = quote(argv)
        try:
            process = await conn.create_process(command, encoding="utf-8", errors="replace")
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"{self.host.name}: cannot start {argv[0]}: {exc}") from None
        try:
            if input is not None:
                process.stdin.write(input)
            process.stdin.write_eof()
            async with asyncio.timeout(timeout):
                completed = await process.wait()
        except TimeoutError:
            raise TransportError(f"{self.host.name}: {argv[0]} did not finish within {timeout:g} s") from None
        except (asyncssh.Error, OSError, BrokenPipeError) as exc:
            raise TransportError(
                f"{self.host.name}: lost the connection while running {argv[0]} ({exc})"
            ) from None
        finally:
            process.close()
        return CommandResult(
            argv=tuple(argv),
            exit_status=completed.exit_status,
            stdout=str(completed.stdout or ""),
            stderr=str(completed.stderr or ""),
        )

    @contextlib.asynccontextmanager
    async def stream(
        self, argv: Sequence[str], *, timeout: float | None = None
    ) -> AsyncIterator[RemoteStream]:
        """Start a long-running command; closing the context closes its channel (journalctl -f and the
        GPU agent exit when it closes)."""
        conn = await self.wait_up(timeout)
        try:
            process = await conn.create_process(quote(argv), encoding=None)
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"{self.host.name}: cannot start {argv[0]}: {exc}") from None
        try:
            yield RemoteStream(process, tuple(argv), self.host.name)
        finally:
            process.close()


class RemoteStream:
    """The stdout of a streaming command, line by line, as bytes (no decoding cost, no decode errors)."""

    def __init__(self, process: asyncssh.SSHClientProcess[bytes], argv: tuple[str, ...], host: str) -> None:
        self._process = process
        self.argv = argv
        self._host = host

    async def readline(self) -> bytes:
        """One line with its newline; b"" at the end. A lost connection raises `TransportError`."""
        try:
            return await self._process.stdout.readline()
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"{self._host}: the stream of {self.argv[0]} broke ({exc})") from None

    async def lines(self) -> AsyncIterator[bytes]:
        while True:
            line = await self.readline()
            if not line:
                return
            if not line.endswith(b"\n"):
                # A partial last line means the channel ended mid-line (a drop): it is not data.
                return
            yield line

    async def stderr_text(self, limit: int = 4096) -> str:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                data = await self._process.stderr.read(limit)
            return data.decode("utf-8", "replace")
        return ""

    @property
    def exit_status(self) -> int | None:
        return self._process.exit_status

    async def wait(self, timeout: float | None = None) -> int | None:
        with contextlib.suppress(TimeoutError, asyncssh.Error, OSError):
            async with asyncio.timeout(timeout):
                await self._process.wait_closed()
        return self._process.exit_status

    def write(self, data: bytes) -> None:
        self._process.stdin.write(data)


class LocalForward:
    """127.0.0.1:PORT here → DEST_HOST:DEST_PORT as seen from the remote host, through the transport.

    The listening port stays the same across reconnects: each accepted client opens its own
    direct-tcpip channel on whatever connection is current, so an httpx client built once keeps
    working after the SSH connection comes back.
    """

    def __init__(
        self, transport: Transport, dest_host: str, dest_port: int, *, open_timeout: float = 10.0
    ) -> None:
        self.transport = transport
        self.dest_host = dest_host
        self.dest_port = dest_port
        self.open_timeout = open_timeout
        self._server: asyncio.Server | None = None
        self._writers: set[Any] = set()
        self.port: int = 0

    async def start(self, listen_port: int = 0) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", listen_port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A handler task of asyncio.start_server must not end in CancelledError (asyncio logs it as an
        # unhandled exception), so close() ends the pipes by closing their writers instead.
        self._writers.add(writer)
        remote_writer: Any = None
        try:
            conn = await self.transport.wait_up(self.open_timeout)
            remote_reader, remote_writer = await conn.open_connection(self.dest_host, self.dest_port)
            self._writers.add(remote_writer)

            async def pump(src: Any, dst: Any) -> None:
                try:
                    while data := await src.read(65536):
                        dst.write(data)
                        await dst.drain()
                except (asyncssh.Error, OSError, ConnectionError):
                    pass
                finally:
                    with contextlib.suppress(Exception):
                        dst.write_eof()

            await asyncio.gather(pump(reader, remote_writer), pump(remote_reader, writer))
        except (TransportError, asyncssh.Error, OSError):
            # The client sees a closed connection, as it would if the port were down.
            pass
        except asyncio.CancelledError:
            return
        finally:
            for w in (remote_writer, writer):
                if w is not None:
                    self._writers.discard(w)
                    with contextlib.suppress(Exception):
                        w.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            with contextlib.suppress(Exception):
                w.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self._server.wait_closed()
        self._server = None

    async def __aenter__(self) -> LocalForward:
        if self._server is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
