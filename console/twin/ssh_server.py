"""The twin's SSH endpoint: an in-process asyncssh server on loopback.

It behaves like sshd for what the console uses: public-key authentication for one user and one key, each
exec request run by `bash -c` with the twin's session environment (stand-ins first on PATH), stdout and
stderr streamed as they come, the exit status (or signal) forwarded, SSH signals delivered, the process
group killed when the channel closes, a pty when asked for, and direct-tcpip (`ssh -L`) forwarding to
loopback addresses only.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import pty
import signal
import struct
import termios
from collections.abc import Mapping
from pathlib import Path

import asyncssh

_SIGNALS = {s.name.removeprefix("SIG"): s for s in signal.Signals}


def _set_winsize(fd: int, cols: int, rows: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _take_tty() -> None:
    # Runs in the child after setsid(): make the pty its controlling terminal, as sshd does.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class _Sessions(set["_Session"]):
    """A server's sessions, and whether it is closing: a command that starts once it is (its session
    asked before the close, its process forked after) is ended as soon as it exists."""

    closing = False


class _Session(asyncssh.SSHServerSession[bytes]):
    def __init__(
        self,
        env: Mapping[str, str],
        cwd: str,
        peer: tuple[str, int],
        local: tuple[str, int],
        sessions: _Sessions | None = None,
    ) -> None:
        self.sessions = sessions if sessions is not None else _Sessions()
        self.sessions.add(self)
        self.env = dict(env)
        self.env["SSH_CLIENT"] = f"{peer[0]} {peer[1]} {local[1]}"
        self.env["SSH_CONNECTION"] = f"{peer[0]} {peer[1]} {local[0]} {local[1]}"
        self.cwd = cwd
        self.command: str | None = None
        self.term: tuple[str, int, int] | None = None
        self.chan: asyncssh.SSHServerChannel[bytes] | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self.master: int | None = None
        self.writable = asyncio.Event()
        self.writable.set()
        self.closed = False
        self.killed = False
        self.pending_input: list[bytes] = []
        self.eof_pending = False
        self.task: asyncio.Task[None] | None = None

    # --- requests ----------------------------------------------------------------------------------

    def connection_made(self, chan: asyncssh.SSHServerChannel[bytes]) -> None:
        self.chan = chan

    def pty_requested(
        self, term_type: str, term_size: tuple[int, int, int, int], term_modes: Mapping[int, int]
    ) -> bool:
        self.term = (term_type, term_size[0] or 80, term_size[1] or 24)
        return True

    def shell_requested(self) -> bool:
        return True

    def exec_requested(self, command: str) -> bool:
        self.command = command
        return True

    def subsystem_requested(self, subsystem: str) -> bool:
        return False

    def session_started(self) -> None:
        self.task = asyncio.ensure_future(self._run())

    # --- data --------------------------------------------------------------------------------------

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        if self.master is not None:
            with contextlib.suppress(OSError):
                os.write(self.master, data)
        elif self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                self.proc.stdin.write(data)
        else:
            self.pending_input.append(data)

    def eof_received(self) -> bool:
        if self.proc is not None and self.proc.stdin is not None and self.master is None:
            with contextlib.suppress(OSError, RuntimeError):
                self.proc.stdin.close()
        elif self.proc is None:
            self.eof_pending = True
        return True

    def signal_received(self, signal_name: str) -> None:
        sig = _SIGNALS.get(signal_name)
        if sig is not None and self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def terminal_size_changed(self, width: int, height: int, pixwidth: int, pixheight: int) -> None:
        if self.master is not None:
            _set_winsize(self.master, width, height)
            if self.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGWINCH)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def kill(self) -> None:
        """End the session's command and everything it started, now (the twin is going away); a command
        still being started is ended as soon as it exists (`_started`)."""
        self.killed = True
        if self.proc is not None and self.proc.returncode is None:
            self._kill_group(self.proc.pid)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.writable.set()
        if self.proc is not None and self.proc.returncode is None:
            # sshd closes the session's pipes and the process dies of SIGPIPE/SIGHUP; a process that
            # never writes would linger, so the twin ends the whole group outright. The session stays
            # known to the server until then: a twin stopped within that second (the demo, its terminal
            # killed) still ends the group in `TwinSSHServer.close`, where a `journalctl -f` that
            # ignored the hang-up used to outlive it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGHUP)
            asyncio.get_running_loop().call_later(1.0, self._end, self.proc.pid)
        else:
            self.sessions.discard(self)

    def _end(self, pid: int) -> None:
        self._kill_group(pid)
        self.sessions.discard(self)

    def _started(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        if self.killed or self.sessions.closing:
            self._kill_group(proc.pid)

    @staticmethod
    def _kill_group(pid: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

    # --- running -----------------------------------------------------------------------------------

    async def _send(self, data: bytes, stderr: bool) -> None:
        assert self.chan is not None
        if self.closed:
            return
        await self.writable.wait()
        if self.closed:
            return
        with contextlib.suppress(OSError, asyncssh.Error, BrokenPipeError):
            if stderr:
                self.chan.write_stderr(data)
            else:
                self.chan.write(data)

    async def _pump(self, stream: asyncio.StreamReader, stderr: bool) -> None:
        while True:
            data = await stream.read(65536)
            if not data:
                return
            await self._send(data, stderr)

    async def _run(self) -> None:
        assert self.chan is not None
        argv = ["/bin/bash", "-c", self.command] if self.command is not None else ["/bin/bash", "-l"]
        try:
            if self.term is not None:
                rc = await self._run_pty(argv)
            else:
                rc = await self._run_pipes(argv)
        except OSError as exc:
            await self._send(f"k26 twin: cannot run the session command: {exc}\n".encode(), True)
            rc = 255
        if self.closed:
            return
        with contextlib.suppress(OSError, asyncssh.Error):
            if rc < 0:
                name = signal.Signals(-rc).name.removeprefix("SIG")
                self.chan.exit_with_signal(name)
            else:
                self.chan.exit(rc)

    async def _run_pipes(self, argv: list[str]) -> int:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
        )
        self._started(proc)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        for data in self.pending_input:
            proc.stdin.write(data)
        if self.eof_pending:
            proc.stdin.close()
        pumps = [
            asyncio.ensure_future(self._pump(proc.stdout, False)),
            asyncio.ensure_future(self._pump(proc.stderr, True)),
        ]
        rc = await proc.wait()
        # Output still buffered in the pipes belongs to the session; a daemonised grandchild holding
        # the pipes open must not keep the channel open forever.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2):
                await asyncio.gather(*pumps)
        for p in pumps:
            p.cancel()
        return rc

    async def _run_pty(self, argv: list[str]) -> int:
        assert self.term is not None
        term, cols, rows = self.term
        master, slave = pty.openpty()
        _set_winsize(master, cols, rows)
        env = dict(self.env, TERM=term or "xterm")
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=_take_tty,
            )
            self._started(proc)
        finally:
            os.close(slave)
        self.master = master
        for data in self.pending_input:
            os.write(master, data)
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        queue: asyncio.Queue[bytes] = asyncio.Queue()

        def readable() -> None:
            try:
                data = os.read(master, 65536)
            except OSError:
                data = b""
            if not data:
                loop.remove_reader(master)
                done.set()
                return
            queue.put_nowait(data)

        loop.add_reader(master, readable)

        async def forward() -> None:
            while not (done.is_set() and queue.empty()):
                getter = asyncio.ensure_future(queue.get())
                finished = asyncio.ensure_future(done.wait())
                await asyncio.wait({getter, finished}, return_when=asyncio.FIRST_COMPLETED)
                finished.cancel()
                if getter.done():
                    await self._send(getter.result(), False)
                else:
                    getter.cancel()

        forwarder = asyncio.ensure_future(forward())
        rc = await proc.wait()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2):
                await forwarder
        loop.remove_reader(master)
        forwarder.cancel()
        os.close(master)
        self.master = None
        return rc


class _Server(asyncssh.SSHServer):
    def __init__(
        self,
        user: str,
        client_keys: list[asyncssh.SSHKey],
        env: Mapping[str, str],
        cwd: str,
        live: set[asyncssh.SSHServerConnection],
        sessions: _Sessions,
    ) -> None:
        self.live = live
        self.sessions = sessions
        self.user = user
        self.client_keys = {k.public_data for k in client_keys}
        self.env = env
        self.cwd = cwd
        self.conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn
        self.live.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.live.discard(self.conn)

    def begin_auth(self, username: str) -> bool:
        return True

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        return username == self.user and key.public_data in self.client_keys

    def password_auth_supported(self) -> bool:
        return False

    def session_requested(self) -> _Session:
        assert self.conn is not None
        peer = self.conn.get_extra_info("peername")[:2]
        local = self.conn.get_extra_info("sockname")[:2]
        return _Session(self.env, self.cwd, peer, local, self.sessions)

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int) -> bool:
        # The twin is a loopback host: forwarding reaches its own services, never the network.
        return dest_host in ("localhost", "::1") or dest_host.startswith("127.")

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return False


class TwinSSHServer:
    """Serve SSH for a twin until `close()`."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        host_key: Path,
        client_public_key: Path,
        user: str,
        env: Mapping[str, str],
        cwd: Path,
    ) -> None:
        self.host = host
        self.port = port
        self.host_key = host_key
        self.client_public_key = client_public_key
        self.user = user
        self.env = env
        self.cwd = cwd
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._live: set[asyncssh.SSHServerConnection] = set()
        self._sessions = _Sessions()

    async def start(self) -> int:
        self._sessions.closing = False  # open again after a close (a twin's cut and restored network)
        host_key = asyncssh.read_private_key(str(self.host_key))
        client_keys = [asyncssh.read_public_key(str(self.client_public_key))]
        self._acceptor = await asyncssh.create_server(
            lambda: _Server(self.user, client_keys, self.env, str(self.cwd), self._live, self._sessions),
            self.host,
            self.port,
            server_host_keys=[host_key],
            encoding=None,
            allow_scp=False,
            x11_forwarding=False,
            agent_forwarding=False,
        )
        self.port = self._acceptor.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        # A session's SIGHUP-then-SIGKILL runs on this loop, which stops right after: a `journalctl -f`
        # or `tail -F` that ignored the hang-up would outlive the twin. End them all here, and any whose
        # command is still starting as soon as it has started.
        self._sessions.closing = True
        for session in list(self._sessions):
            session.kill()
        self._sessions.clear()
        if self._acceptor is not None:
            self._acceptor.close()
            for conn in list(self._live):
                conn.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._acceptor.wait_closed()
            self._acceptor = None
