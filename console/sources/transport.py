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
- SSH keepalives bound the silence of the connection, and so of every channel on it: a host that stops
  answering (a partition black-holes the traffic, nothing is closed) is a drop after `interval × (count
  + 1)` seconds, 5 × 4 by default; the ssh config's `ServerAliveInterval`/`ServerAliveCountMax` set them
  as they do for ssh(1). Without them a command's channel would wait out its own timeout and a
  `journalctl -f` would wait forever.
- A caller that has given up on a lost link (`give_up_on_link`) makes every bounded wait for it fail at
  once until the connection is up again: what it still tries on its way out (an audit line, the lock)
  says so at once instead of waiting 15 s each.
- Every remote command is an argument list joined with `shlex.join`: nothing from a host name, a unit
  name or a cursor is ever read by the remote shell as syntax.
- `LocalForward` listens on 127.0.0.1 with a port that stays the same across reconnects, and opens a
  fresh SSH channel to the far side for each client connection.

The connection and its supervisor are here; the pieces they use have modules of their own, re-exported
here: the backoff (sources/backoff), a command's result and errors (sources/remote_command), the host
keys trusted and the refusal (sources/hostkeys), streams and port forwards (sources/ssh_channels).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from console.core.source_status import ConnectionStatus, ConnState
from console.sources.backoff import Backoff
from console.sources.hostkeys import HostKeyRefused, RecordingClient, Trust, refusal, trusted_keys
from console.sources.hosts import HostConfig
from console.sources.remote_command import CommandResult, SetupError, TransportError, quote
from console.sources.ssh_channels import LocalForward, RemoteStream

__all__ = [
    "AES_FIRST",
    "Backoff",
    "CommandResult",
    "ConnState",
    "ConnectionStatus",
    "HostKeyRefused",
    "LocalForward",
    "RemoteStream",
    "Transport",
    "TransportError",
    "cpu_does_aes",
    "quote",
]


_log = logging.getLogger(__name__)

# Expanded at each connect (HOME decides), like ssh(1).
_DEFAULT_SSH_CONFIG = Path("~", ".ssh", "config")

KEEPALIVE_INTERVAL_S = 5.0
"""Seconds of silence from the host before a keepalive is sent (ssh's ServerAliveInterval)."""
KEEPALIVE_COUNT_MAX = 3
"""Keepalives left unanswered before the connection counts as lost (ssh's ServerAliveCountMax)."""
AES_FIRST = (
    "aes256-gcm@openssh.com",
    "aes128-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes256-ctr",
    "aes192-ctr",
    "aes128-ctr",
)
"""The ciphers asked for, in this order, on a machine whose CPU does AES (and where the ssh config names
none): asyncssh's defaults with AES-GCM first. asyncssh runs ChaCha20-Poly1305 as several OpenSSL calls a
packet; AES-GCM is one. On this project's x86 machine: 2.0 ms of the console's CPU per command run on the
host, against 3.1 ms, and 47 ms per 4 MB read against 65 (an idle console runs ~15 a minute, and reads
the GPUs, the journal and /metrics through the same cipher)."""


def cpu_does_aes(cpuinfo: str) -> bool:
    """Whether /proc/cpuinfo's text names the AES instructions (x86 `flags`, Arm `Features`)."""
    for line in cpuinfo.split("\n"):
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return "aes" in value.split()
    return False


@functools.cache
def _this_cpu_does_aes() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return cpu_does_aes(f.read(65_536))  # the first CPU's lines are enough
    except OSError:
        return False


@dataclass(frozen=True)
class _Plan:
    options: asyncssh.SSHClientConnectionOptions
    config: list[str]
    trust: Trust


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
        keepalive_interval: float | None = None,
        keepalive_count_max: int | None = None,
        ssh_config: Sequence[str | Path] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.host = host
        self.backoff = backoff or Backoff()
        self.connect_timeout = connect_timeout
        # None: the ssh config's ServerAlive* where it sets them, else KEEPALIVE_* (see `_plan`).
        self.keepalive_interval = keepalive_interval
        self.keepalive_count_max = keepalive_count_max
        self._given_up = False
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
        """The live connection; None while there is none, including the moment between a connection
        closing (a keepalive unanswered) and the supervisor noticing it."""
        conn = self._conn
        if self._status.state is not ConnState.UP or conn is None or conn.is_closed():
            return None
        return conn

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
            if self._given_up and timeout is not None:
                raise TransportError(f"{self.host.name} is not reachable ({status.describe()})")
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

    def _plan(self) -> _Plan:
        host = self.host
        config = self._config_paths()
        kwargs: dict[str, Any] = {
            "host": host.ssh_host,
            "config": config,
            "connect_timeout": self.connect_timeout,
            "login_timeout": self.connect_timeout,
        }
        if self.keepalive_interval is not None:
            kwargs["keepalive_interval"] = self.keepalive_interval
        if self.keepalive_count_max is not None:
            kwargs["keepalive_count_max"] = self.keepalive_count_max
        if host.port is not None:
            kwargs["port"] = host.port
        if host.ssh_user is not None:
            kwargs["username"] = host.ssh_user
        for label, path in (("identity file", host.identity_file), ("known_hosts file", host.known_hosts)):
            if path is not None and not path.is_file():
                raise SetupError(f"the {label} {path} named for {host.name} does not exist")
        if host.identity_file is not None:
            kwargs["client_keys"] = [str(host.identity_file)]
        try:
            options = asyncssh.SSHClientConnectionOptions(**kwargs)
            trust = trusted_keys(self.host, options.config)
            # Keepalives always (asyncssh sends none by default): the ssh config's where it sets them.
            alive: dict[str, Any] = {}
            if "keepalive_interval" not in kwargs and options.config.get("ServerAliveInterval") is None:
                alive["keepalive_interval"] = KEEPALIVE_INTERVAL_S
            if "keepalive_count_max" not in kwargs and options.config.get("ServerAliveCountMax") is None:
                alive["keepalive_count_max"] = KEEPALIVE_COUNT_MAX
            if options.config.get("Ciphers") is None and _this_cpu_does_aes():
                alive["encryption_algs"] = AES_FIRST
            # An explicit known_hosts wins over anything the ssh config says, here and when connect()
            # rebuilds the options. The SSHKnownHosts object is always truthy: asyncssh would swap an
            # empty value for ~/.ssh/known_hosts; None (the insecure setting only) turns checking off.
            options = asyncssh.SSHClientConnectionOptions(options, known_hosts=trust.known, **alive)
        except (OSError, ValueError, asyncssh.Error) as exc:
            raise SetupError(f"the SSH settings for {host.name} cannot be used: {exc}") from None
        return _Plan(options=options, config=config, trust=trust)

    async def _connect(self) -> tuple[asyncssh.SSHClientConnection, RecordingClient]:
        # Off the event loop: building the options reads the ssh config, key and known_hosts files.
        plan = await asyncio.to_thread(self._plan)
        client = RecordingClient()
        try:
            conn = await asyncssh.connect(
                self.host.ssh_host, options=plan.options, config=plan.config, client_factory=lambda: client
            )
        except asyncssh.HostKeyNotVerifiable:
            raise refusal(self.host, client, plan.trust) from None
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
            except SetupError as exc:
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
            self._given_up = False
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

    def give_up_on_link(self) -> None:
        """The caller waited for a lost connection as long as it would: until the connection is up again,
        every wait with a timeout (`run`, `wait_up(timeout)`) fails at once; waits without one (a journal
        follower's) go on waiting, and the supervisor goes on reconnecting."""
        if self.connection is None:
            self._given_up = True
            # Waits already under way see it now, not at their own timeout (a heartbeat's, 15 s).
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()

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

    async def open_process(
        self, conn: asyncssh.SSHClientConnection, argv: Sequence[str], *, encoding: str | None
    ) -> asyncssh.SSHClientProcess[Any]:
        """Start `argv` (quoted) on `conn`; a refusal or a lost connection raises `TransportError`."""
        try:
            return await conn.create_process(quote(argv), encoding=encoding, errors="replace")
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"{self.host.name}: cannot start {argv[0]}: {exc}") from None
        except AttributeError as exc:
            # asyncssh 2.24: a connection closed in the same turn of the loop as the server accepted the
            # exec drops the channel's session before `create()` wakes up, which then calls
            # `session_started()` on None. The command's fate is unknown: a lost link, like any other.
            if exc.name != "session_started":
                raise
            raise TransportError(f"{self.host.name}: lost the connection as {argv[0]} started") from None

    async def run(
        self, argv: Sequence[str], *, timeout: float | None = 30.0, input: str | None = None
    ) -> CommandResult:
        """Run a command to completion. The exit status is data, not an exception; a lost connection
        or a timeout raises `TransportError`."""
        conn = await self.wait_up(timeout)
        process = await self.open_process(conn, argv, encoding="utf-8")
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
        if completed.exit_status is None and completed.exit_signal is None and conn.is_closed():
            # The channel ended with the connection, the command's fate unknown: a lost link (a
            # keepalive that went unanswered), to wait out and retry like any other, not a result.
            raise TransportError(f"{self.host.name}: lost the connection while running {argv[0]}")
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
        process = await self.open_process(conn, argv, encoding=None)
        try:
            yield RemoteStream(process, tuple(argv), self.host.name)
        finally:
            process.close()
