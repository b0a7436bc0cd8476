"""One SSH connection per host, kept up: strict host keys, reconnect with backoff, visible state.

- asyncssh reads the user's `~/.ssh/config` (an alias works as is) and the agent; the hosts file may
  name an `identity_file` and a `known_hosts` file of its own.
- The host key is ALWAYS checked: against the hosts file's `known_hosts`, else the user's own known_hosts
  files. The console decides that itself and hands asyncssh the keys it trusts, because asyncssh takes
  `UserKnownHostsFile none` in the ssh config as "accept any key". Only the host's explicit
  `insecure_skip_host_key_check = true` turns the check off, and then the status says so.
- An unknown or changed host key is refused at once, never accepted: the status says so in one sentence
  with the key type, the SHA256 fingerprint the server presented and the known_hosts line to add once
  that fingerprint is checked, and the transport stops trying (retrying cannot fix it).
- A supervisor that dies of anything unexpected leaves the status FAILED with the reason, so nobody
  waits on "connecting" forever.
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
import logging
import os
import random
import shlex
import socket
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh
from asyncssh.config import SSHClientConfig
from pydantic import BaseModel, ConfigDict, Field

from console.core.snapshot import ConnectionStatus, ConnState
from console.core.text import split_lines
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
    def __init__(
        self,
        sentence: str,
        fingerprint: str | None,
        changed: bool,
        *,
        key_type: str | None = None,
        known_hosts_line: str | None = None,
    ) -> None:
        super().__init__(sentence)
        self.fingerprint = fingerprint
        self.changed = changed
        self.key_type = key_type
        self.known_hosts_line = known_hosts_line
        """The line to add to a known_hosts file once the fingerprint is checked on the host."""


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
        for line in split_lines(self.stderr + "\n" + self.stdout):
            if line.strip():
                return line.strip()
        return f"exit status {self.exit_status}"


def quote(argv: Sequence[str]) -> str:
    if not argv:
        raise ValueError("a remote command needs at least a program name")
    return shlex.join(str(a) for a in argv)


_log = logging.getLogger(__name__)

# Expanded at each connect (HOME decides), like ssh(1).
_DEFAULT_KNOWN_HOSTS = Path("~", ".ssh", "known_hosts")
_GLOBAL_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")
_DEFAULT_SSH_CONFIG = Path("~", ".ssh", "config")

# The short key type ssh-keyscan -t and the host's key file names use.
_KEY_KIND = {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa", "ssh-dss": "dsa"}


def _key_kind(algorithm: str) -> str | None:
    if algorithm.startswith("ecdsa-sha2-"):
        return "ecdsa"
    return _KEY_KIND.get(algorithm)


def _config_paths(value: object) -> list[Path]:
    """The file names an ssh config option lists (asyncssh types them as `object`)."""
    if not isinstance(value, list | tuple):
        return []
    return [Path(str(p)).expanduser() for p in value]


@dataclass(frozen=True)
class _Trust:
    """The host keys the console trusts for one connect, decided before asyncssh sees the ssh config."""

    known: asyncssh.SSHKnownHosts | None
    """All trusted entries; None only for `insecure_skip_host_key_check = true`."""
    files: tuple[tuple[Path, asyncssh.SSHKnownHosts], ...]
    """Each file read, with its own entries (to name the one holding an entry that no longer matches)."""
    add_to: Path | None
    """Where a checked key belongs: the hosts file's known_hosts, else the user's own file."""


@dataclass(frozen=True)
class _Plan:
    options: asyncssh.SSHClientConnectionOptions
    config: list[str]
    trust: _Trust


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
        # None: the user's ~/.ssh/config; tests pass [] so the runner's own config stays out.
        self._ssh_config = ssh_config
        self._rng = rng or random.Random()
        self._conn: asyncssh.SSHClientConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._status = ConnectionStatus(
            host=host.name,
            state=ConnState.CONNECTING,
            since=time.time(),
            host_key_checked=not host.insecure_skip_host_key_check,
        )
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
            host=self.host.name,
            state=state,
            since=time.time(),
            drops=self._drops,
            host_key_checked=not self.host.insecure_skip_host_key_check,
            **fields,
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
            if self.host.insecure_skip_host_key_check:
                # Logged, not printed: with no logging set up (the command line) it reaches stderr as
                # this one line; inside the console the header says it instead.
                _log.warning(
                    "k26-console: WARNING: the host key of %s is NOT checked "
                    "(insecure_skip_host_key_check = true in the hosts file): anyone on the network path "
                    "can pose as this host.",
                    self.host.name,
                )
            self._task = asyncio.get_running_loop().create_task(
                self._supervise(), name=f"ssh-supervisor-{self.host.name}"
            )
            self._task.add_done_callback(self._supervisor_ended)

    def _where(self) -> str:
        return self.host.describe()

    def _config_paths(self) -> list[str]:
        # Resolved here rather than left to asyncssh's default: the options built below must have read
        # the same config that connect() applies, or a decision made on them misses what it says.
        if self._ssh_config is not None:
            return [str(p) for p in self._ssh_config]
        default = _DEFAULT_SSH_CONFIG.expanduser()
        return [str(default)] if os.access(default, os.R_OK) else []

    def _trust(self, config: SSHClientConfig) -> _Trust:
        """The keys to trust. Never taken from asyncssh's own reading of the ssh config, where
        `UserKnownHostsFile none` means "accept any key"; `StrictHostKeyChecking` is not read at all."""
        host = self.host
        if host.insecure_skip_host_key_check:
            return _Trust(known=None, files=(), add_to=None)
        user_default = _DEFAULT_KNOWN_HOSTS.expanduser()
        if host.known_hosts is not None:
            candidates = [host.known_hosts]
            add_to = host.known_hosts
        else:
            # The user's own files: those the ssh config names (none for "none"; /dev/null is no file),
            # ~/.ssh/known_hosts, and the system-wide ones, as ssh(1) reads them.
            named = _config_paths(config.get("UserKnownHostsFile"))
            system = _config_paths(config.get("GlobalKnownHostsFile"))
            candidates = list(dict.fromkeys([*named, user_default, *system, _GLOBAL_KNOWN_HOSTS]))
            add_to = next((p for p in named if p.is_file()), user_default)
        known = asyncssh.SSHKnownHosts()
        files: list[tuple[Path, asyncssh.SSHKnownHosts]] = []
        for path in candidates:
            if not path.is_file():
                continue
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError as exc:
                raise _SetupError(
                    f"the known_hosts file {path} cannot be read: {exc.strerror or exc}"
                ) from None
            try:
                own = asyncssh.SSHKnownHosts(text)
                known.load(text)
            except ValueError as exc:
                raise _SetupError(
                    f"the known_hosts file {path} has a line the console cannot read: {exc}"
                ) from None
            files.append((path, own))
        return _Trust(known=known, files=tuple(files), add_to=add_to)

    def _plan(self) -> _Plan:
        host = self.host
        config = self._config_paths()
        kwargs: dict[str, Any] = {
            "host": host.ssh_host,
            "config": config,
            "connect_timeout": self.connect_timeout,
            "login_timeout": self.connect_timeout,
            "keepalive_interval": self.keepalive_interval,
            "keepalive_count_max": self.keepalive_count_max,
        }
        if host.port is not None:
            kwargs["port"] = host.port
        if host.ssh_user is not None:
            kwargs["username"] = host.ssh_user
        for label, path in (("identity file", host.identity_file), ("known_hosts file", host.known_hosts)):
            if path is not None and not path.is_file():
                raise _SetupError(f"the {label} {path} named for {host.name} does not exist")
        if host.identity_file is not None:
            kwargs["client_keys"] = [str(host.identity_file)]
        try:
            options = asyncssh.SSHClientConnectionOptions(**kwargs)
            trust = self._trust(options.config)
            # An explicit known_hosts wins over anything the ssh config says, here and when connect()
            # rebuilds the options. The SSHKnownHosts object is always truthy: asyncssh would swap an
            # empty value for ~/.ssh/known_hosts; None (the insecure setting only) turns checking off.
            options = asyncssh.SSHClientConnectionOptions(options, known_hosts=trust.known)
        except (OSError, ValueError, asyncssh.Error) as exc:
            raise _SetupError(f"the SSH settings for {host.name} cannot be used: {exc}") from None
        return _Plan(options=options, config=config, trust=trust)

    def _refusal(self, client: _Client, trust: _Trust) -> HostKeyRefused:
        if client.rejected is None or trust.known is None:
            # A revoked key or a host certificate that does not validate: asyncssh refused it before
            # asking us, so there is no key of ours to name.
            return HostKeyRefused(
                f"the host key of {self.host.name} ({self._where()}) could not be verified, "
                "so the console refuses to connect",
                None,
                changed=False,
            )
        host, addr, port, key = client.rejected
        fingerprint = key.get_fingerprint("sha256")
        algorithm, blob = key.export_public_key("openssh").decode().split()[:2]
        kind = _key_kind(algorithm)
        presented = f"{algorithm} {fingerprint}"
        pattern = host if port == 22 else f"[{host}]:{port}"
        line = f"{pattern} {algorithm} {blob}"
        match_port = None if port == 22 else port
        holders = [path for path, entries in trust.files if entries.match(host, addr, match_port)[0]]
        label = ", ".join(str(path) for path, _ in trust.files) or "any known_hosts file (there is none)"
        where = f"{self.host.name} ({addr} port {port})"
        on_host = (
            f"ssh-keygen -lf /etc/ssh/ssh_host_{kind}_key.pub" if kind else "ssh-keygen -lf on its host key"
        )
        keyscan = shlex.join(
            ["ssh-keyscan", *(["-p", str(port)] if port != 22 else []), *(["-t", kind] if kind else []), host]
        )
        add = (
            f"add this line to {trust.add_to}: {line} (the line {keyscan} prints; "
            "add it only once the fingerprint is checked)"
        )
        if holders:
            remove = "; ".join(shlex.join(["ssh-keygen", "-R", pattern, "-f", str(p)]) for p in holders)
            return HostKeyRefused(
                f"the host key of {where} has CHANGED: it presents {presented}, which does not match "
                f"{', '.join(map(str, holders))}, so the console refuses to connect; if the change is "
                f"expected, check the new fingerprint on the host ({on_host}), remove the old entry "
                f"({remove}) and {add}",
                fingerprint,
                changed=True,
                key_type=algorithm,
                known_hosts_line=line,
            )
        return HostKeyRefused(
            f"the host key of {where} is unknown: it presents {presented}, which is not in {label}, so "
            f"the console refuses to connect; check that fingerprint on the host ({on_host}), then {add}",
            fingerprint,
            changed=False,
            key_type=algorithm,
            known_hosts_line=line,
        )

    async def _connect(self) -> tuple[asyncssh.SSHClientConnection, _Client]:
        # Off the event loop: building the options reads the ssh config, key and known_hosts files.
        plan = await asyncio.to_thread(self._plan)
        client = _Client()
        try:
            conn = await asyncssh.connect(
                self.host.ssh_host, options=plan.options, config=plan.config, client_factory=lambda: client
            )
        except asyncssh.HostKeyNotVerifiable:
            raise self._refusal(client, plan.trust) from None
        return conn, client

    def _fail(self, failure: TransportError, **fields: Any) -> None:
        self._failure = failure
        self._set(ConnState.FAILED, reason=str(failure), **fields)

    async def _supervise(self) -> None:
        try:
            await self._keep_up()
        except Exception as exc:  # CancelledError is no Exception: close() and cancels pass through
            # A bug here or a surprise from a library must not leave the status "connecting" with
            # everyone waiting on it: the transport fails, visibly, with the reason.
            _log.debug("the SSH supervisor of %s died", self.host.name, exc_info=exc)
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.abort()  # nobody watches it any more
            self._fail(
                TransportError(
                    f"the connection to {self.host.name} stopped on an unexpected error "
                    f"({type(exc).__name__}: {exc or 'no message'})"
                )
            )

    def _supervisor_ended(self, task: asyncio.Task[None]) -> None:
        # Whatever ended the supervisor (a cancellation from outside included), its last word must be
        # a final state, never "connecting".
        if self._closing or self._status.state in (ConnState.FAILED, ConnState.CLOSED):
            return
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort()  # nobody watches it any more
        how = "was cancelled" if task.cancelled() else "ended"
        self._fail(TransportError(f"the connection supervisor of {self.host.name} {how} unexpectedly"))

    async def _keep_up(self) -> None:
        failures = 0
        while not self._closing:
            if not (self._status.state is ConnState.CONNECTING and self._status.attempt == failures):
                self._set(ConnState.CONNECTING, attempt=failures)
            started = time.monotonic()
            try:
                conn, client = await self._connect()
            except HostKeyRefused as exc:
                self._fail(exc, fingerprint=exc.fingerprint, attempt=failures + 1)
                return
            except _SetupError as exc:
                self._fail(exc, attempt=failures + 1)
                return
            except asyncio.CancelledError:
                raise
            except (OSError, asyncssh.Error, TimeoutError, ValueError) as exc:
                failures += 1
                reason = _describe_error(exc, self._where(), self.connect_timeout)
                fatal = isinstance(exc, asyncssh.PermissionDenied | ValueError)
                limit = self.backoff.max_attempts
                if fatal or (limit is not None and failures >= limit):
                    self._fail(TransportError(reason), attempt=failures)
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
        # Forgotten at once: until the supervisor sees it close, wait_up would hand out the dead one.
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort()

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
