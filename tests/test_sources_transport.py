"""`sources.transport` against real SSH on loopback (the twin's in-process asyncssh server).

Host keys are refused with the fingerprint, a dead or silent host ends in a clear failed state while the
process carries on, reconnects go through visible states, commands are quoted, and the local forward
keeps one port across reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh
import httpx
import pytest

from console.sources.hosts import HostConfig
from console.sources.remote_command import CommandResult
from console.sources.transport import (
    Backoff,
    ConnState,
    HostKeyRefused,
    LocalForward,
    Transport,
    TransportError,
    cpu_does_aes,
)
from console.twin.ssh_server import TwinSSHServer
from tests.support.blackhole import BlackHole
from tests.support.waiting import eventually

FAST = Backoff(initial_s=0.05, max_s=0.2, stable_s=0)


async def test_a_command_that_starts_while_the_twin_stops_is_ended_as_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session asked for just before the twin's stop, its process forked just after the stop ended the
    sessions it knew: a profiling run found such a `journalctl -f --cursor` (a follower resuming) outliving
    the demo. It is ended as soon as it exists."""
    ep = await _endpoint(tmp_path)
    entered, release = asyncio.Event(), asyncio.Event()
    spawned: list[int] = []
    real_exec = asyncio.create_subprocess_exec

    async def gated(*argv: Any, **kw: Any) -> asyncio.subprocess.Process:
        entered.set()
        await release.wait()
        proc = await real_exec(*argv, **kw)
        spawned.append(proc.pid)
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_exec", gated)
    conn = await _login(ep)
    try:
        await conn.create_process("""sh -c 'trap "" HUP; exec sleep 60'""")
        async with asyncio.timeout(10):
            await entered.wait()
        closing = asyncio.ensure_future(ep.server.close())
        # The stop has begun: it has ended every session it knew of, this one's command not yet forked.
        await eventually(lambda: ep.server._sessions.closing, timeout=10)
        release.set()
        await eventually(lambda: bool(spawned), timeout=10)
        try:
            await eventually(lambda: _dead(spawned[0]), timeout=0.5)
        except TimeoutError:
            raise AssertionError("a command started during the twin's stop outlived it") from None
        await closing
    finally:
        conn.close()
        for pid in spawned:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, 9)


@dataclass
class Endpoint:
    server: TwinSSHServer
    host: HostConfig
    host_key: asyncssh.SSHKey
    dir: Path


async def _endpoint(tmp_path: Path, address: str = "127.0.0.1") -> Endpoint:
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    host_key.write_private_key(tmp_path / "host_key")
    client_key.write_private_key(tmp_path / "id_ed25519")
    client_key.write_public_key(tmp_path / "id_ed25519.pub")
    server = TwinSSHServer(
        host=address,
        port=0,
        host_key=tmp_path / "host_key",
        client_public_key=tmp_path / "id_ed25519.pub",
        user=os.environ.get("USER") or "root",
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C.UTF-8"},
        cwd=tmp_path,
    )
    port = await server.start()
    (tmp_path / "known_hosts").write_text(f"[{address}]:{port} {host_key.export_public_key().decode()}")
    host = HostConfig(
        name="twin",
        ssh=f"{server.user}@{address}",
        port=port,
        identity_file=tmp_path / "id_ed25519",
        known_hosts=tmp_path / "known_hosts",
    )
    return Endpoint(server, host, host_key, tmp_path)


async def _login(ep: Endpoint) -> asyncssh.SSHClientConnection:
    """A plain asyncssh connection to the endpoint (no Transport): what a client that goes away sees."""
    return await asyncssh.connect(
        "127.0.0.1",
        ep.host.port,
        username=ep.server.user,
        client_keys=[str(ep.dir / "id_ed25519")],
        known_hosts=str(ep.dir / "known_hosts"),
    )


@pytest.fixture
async def endpoint(tmp_path: Path) -> AsyncIterator[Endpoint]:
    ep = await _endpoint(tmp_path)
    try:
        yield ep
    finally:
        await ep.server.close()


@contextlib.asynccontextmanager
async def transport(host: HostConfig, **kwargs: object) -> AsyncIterator[Transport]:
    t = Transport(host, ssh_config=[], **kwargs)  # type: ignore[arg-type]
    try:
        yield t
    finally:
        await t.close()


@pytest.mark.serial  # the connect is timed: measured with no other test running
async def test_connects_runs_quoted_commands_and_streams(endpoint: Endpoint) -> None:
    async with transport(endpoint.host) as t:
        started = time.monotonic()
        await t.wait_up(5)
        assert t.status.state is ConnState.UP and t.status.describe() == "up"
        assert t.status.connect_s is not None and time.monotonic() - started < 2
        hostile = ["a b", "$(touch pwned)", "; touch pwned2", "'", '"', "*", "\\n"]
        result = await t.run(["printf", "%s\\n", *hostile])
        assert result.ok and result.stdout.splitlines() == hostile
        assert not (endpoint.dir / "pwned").exists() and not (endpoint.dir / "pwned2").exists()
        failed = await t.run(["sh", "-c", "echo oops >&2; exit 3"])
        assert failed.exit_status == 3 and failed.first_error_line() == "oops"
        async with t.stream(["sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.05; done"]) as s:
            lines = [line async for line in s.lines()]
        assert lines == [b"line1\n", b"line2\n", b"line3\n"]


async def test_changed_host_key_is_refused_with_its_fingerprint(endpoint: Endpoint) -> None:
    impostor = asyncssh.generate_private_key("ssh-ed25519")
    known = endpoint.dir / "known_hosts"
    known.write_text(f"[127.0.0.1]:{endpoint.host.port} {impostor.export_public_key().decode()}")
    async with transport(endpoint.host, backoff=FAST) as t:
        with pytest.raises(HostKeyRefused) as err:
            await t.wait_up(5)
        fingerprint = endpoint.host_key.get_fingerprint("sha256")
        assert err.value.changed and err.value.fingerprint == fingerprint
        sentence = str(err.value)
        assert "CHANGED" in sentence and fingerprint in sentence and str(known) in sentence
        assert "\n" not in sentence
        # Refused for good: no retry can make a wrong key right. The supervisor (the only thing that retries,
        # test_refused_port_retries_with_backoff_then_fails) has ended after one attempt.
        await eventually(lambda: t._task is not None and t._task.done(), timeout=5)
        assert t.status.state is ConnState.FAILED and t.status.attempt == 1
        assert t.status.fingerprint == fingerprint
        assert t.status.describe().startswith("failed: the host key of twin")


async def test_unknown_host_key_is_refused(endpoint: Endpoint) -> None:
    (endpoint.dir / "known_hosts").write_text("")
    async with transport(endpoint.host, backoff=FAST) as t:
        with pytest.raises(HostKeyRefused) as err:
            await t.wait_up(5)
        assert not err.value.changed
        assert "is unknown" in str(err.value)
        assert endpoint.host_key.get_fingerprint("sha256") in str(err.value)
    # A key listed for another host or port does not count either.
    other = endpoint.host_key.export_public_key().decode()
    (endpoint.dir / "known_hosts").write_text(f"[127.0.0.1]:1 {other}")
    async with transport(endpoint.host, backoff=FAST) as t:
        with pytest.raises(HostKeyRefused):
            await t.wait_up(5)


async def test_ssh_config_turning_checks_off_is_not_obeyed(endpoint: Endpoint, tmp_path: Path) -> None:
    """`UserKnownHostsFile none` would make asyncssh accept any key; the console checks anyway."""
    config = tmp_path / "ssh_config"
    config.write_text("Host *\n  UserKnownHostsFile none\n  StrictHostKeyChecking no\n")
    host = endpoint.host.model_copy(update={"known_hosts": None})
    t = Transport(host, ssh_config=[config], backoff=FAST)
    try:
        with pytest.raises(HostKeyRefused):
            await t.wait_up(5)
    finally:
        await t.close()


async def test_an_ssh_config_alias_works_as_is(endpoint: Endpoint, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host twin-alias\n  HostName 127.0.0.1\n  Port {endpoint.host.port}\n  User {endpoint.server.user}\n"
        f"  IdentityFile {endpoint.dir / 'id_ed25519'}\n  UserKnownHostsFile {endpoint.dir / 'known_hosts'}\n"
    )
    t = Transport(HostConfig(name="twin", ssh="twin-alias"), ssh_config=[config])
    try:
        result = await t.run(["echo", "via alias"], timeout=5)
        assert result.stdout == "via alias\n"
    finally:
        await t.close()


async def test_silent_host_fails_clearly_and_the_process_stays_healthy(endpoint: Endpoint) -> None:
    """A host that accepts TCP but never speaks SSH (a hung sshd) ends in `failed: no answer ...`;
    meanwhile a healthy host on the same loop keeps working."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    dead = HostConfig(name="hung", ssh="127.0.0.1", port=port, known_hosts=endpoint.dir / "known_hosts")
    try:
        async with transport(dead, backoff=Backoff(initial_s=0.05, max_attempts=2), connect_timeout=0.4) as t:
            async with transport(endpoint.host) as healthy:
                waiting = asyncio.ensure_future(t.wait_up())
                for _ in range(3):
                    assert (await healthy.run(["true"], timeout=5)).ok
                with pytest.raises(TransportError) as err:
                    await waiting
            assert str(err.value) == f"no answer from 127.0.0.1:{port} within 0.4 s"
            assert t.status.state is ConnState.FAILED and t.status.attempt == 2
            assert t.status.describe() == f"failed: no answer from 127.0.0.1:{port} within 0.4 s"
            with pytest.raises(TransportError):
                await t.run(["true"])
    finally:
        for writer in accepted:
            writer.close()
        server.close()


async def test_refused_port_retries_with_backoff_then_fails() -> None:
    with contextlib.closing(__import__("socket").socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: connections are refused
        host = HostConfig(name="down", ssh="127.0.0.1", port=port)
        backoff = Backoff(initial_s=0.05, factor=2, max_s=1, jitter=0, max_attempts=3)
        async with transport(host, backoff=backoff) as t:
            seen = []

            async def record() -> None:
                async for status in t.watch():
                    seen.append(status)

            watcher = asyncio.ensure_future(record())
            with pytest.raises(TransportError, match="refused the connection"):
                await t.wait_up(5)
            # wait_up returns on the FAILED status; the watcher records it on one of its next turns.
            await eventually(lambda: any(s.state is ConnState.FAILED for s in seen), timeout=5)
            watcher.cancel()
    states = [(s.state, s.attempt, s.retry_in_s) for s in seen]
    assert states[:6] == [
        (ConnState.CONNECTING, 0, None),
        (ConnState.RETRYING, 1, 0.05),
        (ConnState.CONNECTING, 1, None),
        (ConnState.RETRYING, 2, 0.1),
        (ConnState.CONNECTING, 2, None),
        (ConnState.FAILED, 3, None),
    ]
    assert (
        seen[1].describe()
        == f"retrying in 0s: 127.0.0.1:{port} refused the connection (is sshd running there?)"
    )


@pytest.mark.serial  # the reconnect is timed: measured with no other test running
async def test_drop_and_reconnect_go_through_visible_states(endpoint: Endpoint) -> None:
    async with transport(endpoint.host, backoff=Backoff(initial_s=0.2, stable_s=0)) as t:
        await t.wait_up(5)
        seen: list[ConnState] = []

        async def record() -> None:
            async for status in t.watch():
                seen.append(status.state)

        watcher = asyncio.ensure_future(record())
        await asyncio.sleep(0)
        started = time.monotonic()
        t.drop()
        await t.wait_up(5)
        reconnect_s = time.monotonic() - started
        # wait_up returns on the UP status; the watcher records it on its next turn.
        deadline = time.monotonic() + 5
        while len(seen) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        watcher.cancel()
        assert seen == [ConnState.UP, ConnState.RETRYING, ConnState.CONNECTING, ConnState.UP]
        assert t.status.drops == 1 and reconnect_s < 1.0
        assert (await t.run(["echo", "back"])).stdout == "back\n"


async def test_server_side_loss_is_noticed_and_repaired(endpoint: Endpoint) -> None:
    async with transport(endpoint.host, backoff=FAST) as t:
        await t.wait_up(5)
        for conn in list(endpoint.server._live):
            conn.abort()
        # Noticed when the client reads the end of the connection: until then wait_up would hand out
        # the old one.
        await eventually(lambda: t.status.drops == 1, timeout=5)
        await t.wait_up(5)
        assert t.status.drops == 1
        assert (await t.run(["true"])).ok


async def test_local_forward_keeps_its_port_across_reconnects(endpoint: Endpoint) -> None:
    async def http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    web = await asyncio.start_server(http, "127.0.0.1", 0)
    web_port = web.sockets[0].getsockname()[1]
    try:
        async with (
            transport(endpoint.host, backoff=FAST) as t,
            LocalForward(t, "127.0.0.1", web_port) as forward,
            httpx.AsyncClient() as client,
        ):
            assert (await client.get(f"{forward.url}/health")).text == "ok"
            port = forward.port
            t.drop()
            await eventually(
                lambda: t.status.drops == 1, timeout=5
            )  # the request goes through the next connection
            response = await client.get(f"{forward.url}/health")
            assert response.text == "ok" and forward.port == port
    finally:
        web.close()


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    backoff = Backoff(initial_s=0.5, factor=2, max_s=4, jitter=0.3)
    rng = random.Random(7)
    for failures, base in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (9, 4.0)]:
        draws = [backoff.delay(failures, rng) for _ in range(200)]
        assert all(base * 0.7 <= d <= base for d in draws)
        assert max(draws) - min(draws) > base * 0.2  # jitter actually spreads them
    assert all(0 <= backoff.delay(0, rng) <= 0.15 for _ in range(100))


def _dead(pid: int) -> bool:
    """Gone, or a zombie waiting for its parent (this process) to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between open and read
        return True
    return state == "Z"


async def test_a_twin_stopped_right_after_its_client_left_ends_a_command_that_ignored_the_hangup(
    tmp_path: Path,
) -> None:
    """The demo killed with its terminal: the console's SSH connections close, then the twin stops
    within the second its server gives a hung-up command before SIGKILL. A `journalctl -f` that ignored
    the SIGHUP outlived the twin (a CI run found one); the stop now ends it too."""
    ep = await _endpoint(tmp_path)
    conn = await _login(ep)
    proc = await conn.create_process("""sh -c 'trap "" HUP; echo $$; exec sleep 60'""")
    pid = int((await proc.stdout.readline()).strip())
    conn.close()
    await conn.wait_closed()
    try:
        # The server has seen the connection go (its session closed, or forgotten as before the fix).
        await eventually(lambda: all(s.closed for s in ep.server._sessions), timeout=10)
        assert not _dead(pid), "the command should still be in its second of grace"
        await ep.server.close()
        # SIGKILL from the stop, well before the grace second's own kill would come.
        try:
            await eventually(lambda: _dead(pid), timeout=0.5)
        except TimeoutError:
            raise AssertionError("the hung-up command outlived the twin's stop") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, 9)


def test_the_error_line_is_the_error_not_systemctls_warning_before_it() -> None:
    """systemctl 252 warns that a unit changed on disk before it says what failed (and `cat` repeats the
    warning as a comment): the sentence the console writes must quote the failure."""
    warning = (
        "Warning: The unit file, source configuration file or drop-ins of sglang.service changed on disk. "
        "Run 'systemctl daemon-reload' to reload units."
    )
    failed = CommandResult(
        argv=("systemctl", "cat", "sglang.service"),
        exit_status=1,
        stdout=f"# {warning}\n# /etc/systemd/system/sglang.service\n",
        stderr=f"{warning}\nFailed to cat unit: Permission denied\n",
    )
    assert failed.first_error_line() == "Failed to cat unit: Permission denied"
    only_warned = failed.model_copy(update={"stderr": f"{warning}\n"})
    assert only_warned.first_error_line() == warning  # not a line of what `cat` printed
    on_stdout = failed.model_copy(update={"stderr": ""})
    assert on_stdout.first_error_line() == "# /etc/systemd/system/sglang.service"
    silent = failed.model_copy(update={"stderr": "", "stdout": "\n"})
    assert silent.first_error_line() == "exit status 1"


async def test_a_black_holed_link_ends_every_channel_within_the_keepalive_bound(
    endpoint: Endpoint, tmp_path: Path
) -> None:
    """A partition (the traffic black-holed by a proxy, nothing closed): the keepalives the ssh config
    asks for (ServerAliveInterval 1, ServerAliveCountMax 1) end the connection within interval × (count
    + 1), and with it a command waiting for its answer (a TransportError to retry, not a result with no
    exit status) and a stream that says nothing; once the link is back the transport reconnects."""
    with BlackHole(("127.0.0.1", endpoint.host.port or 22)) as hole:
        key = endpoint.host_key.export_public_key().decode().strip()
        (tmp_path / "known_hosts_hole").write_text(f"[127.0.0.1]:{hole.port} {key}\n")
        (tmp_path / "ssh_config").write_text("Host *\n  ServerAliveInterval 1\n  ServerAliveCountMax 1\n")
        host = endpoint.host.model_copy(
            update={"port": hole.port, "known_hosts": tmp_path / "known_hosts_hole"}
        )
        t = Transport(host, ssh_config=[tmp_path / "ssh_config"], backoff=FAST, connect_timeout=1)
        try:
            await t.wait_up(5)
            assert (await t.run(["true"], timeout=5)).ok
            async with t.stream(["sh", "-c", "sleep 60"]) as quiet:
                started = tmp_path / "running-started"
                running = asyncio.ensure_future(
                    t.run(["sh", "-c", 'touch "$1"; exec sleep 60', "sh", str(started)], timeout=60)
                )
                # Both channels open (the host on loopback shares this file system), then the link goes silent.
                deadline = time.monotonic() + 10
                while not started.exists():
                    assert time.monotonic() < deadline, "the command never started on the host"
                    await asyncio.sleep(0.02)
                hole.cut()
                cut = time.monotonic()
                with pytest.raises(TransportError, match=r"lost the connection|cannot start"):
                    async with asyncio.timeout(6):
                        await running
                ended = time.monotonic() - cut
                with pytest.raises(TransportError, match="not responding to keepalive"):
                    async with asyncio.timeout(2):
                        await quiet.readline()
            assert ended <= 3.5, ended  # 1 s × (1 + 1), with room for a busy machine
            assert t.connection is None and t.status.state is not ConnState.UP
            assert "keepalive" in (t.status.reason or "") or t.status.drops == 1
            hole.restore()
            await t.wait_up(10)
            assert (await t.run(["echo", "back"], timeout=5)).stdout == "back\n"
        finally:
            hole.restore()
            await t.close()


def test_the_aes_instructions_are_read_off_cpuinfo() -> None:
    x86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme sse2 aes avx2 sha_ni\n"
    arm = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32\n"
    assert cpu_does_aes(x86) and cpu_does_aes(arm)
    assert not cpu_does_aes(x86.replace(" aes", "")) and not cpu_does_aes(arm.replace(" aes", ""))
    assert not cpu_does_aes("flags_aes: aes\n") and not cpu_does_aes("")


async def test_aes_gcm_is_asked_for_first_unless_the_ssh_config_names_ciphers(
    endpoint: Endpoint, tmp_path: Path
) -> None:
    """On a CPU with AES instructions the link runs AES-GCM (2.0 ms of the console's CPU a command, against
    ChaCha20-Poly1305's 3.1: asyncssh's default order and OpenSSH's put ChaCha first); an ssh config's
    `Ciphers` is obeyed as it is."""
    aes = cpu_does_aes(Path("/proc/cpuinfo").read_text(errors="replace"))
    async with transport(endpoint.host) as t:
        await t.wait_up(5)
        assert t.connection is not None
        chosen = t.connection.get_extra_info("send_cipher")
        assert chosen == ("aes256-gcm@openssh.com" if aes else "chacha20-poly1305@openssh.com")
    config = tmp_path / "ssh_config"
    config.write_text("Host *\n  Ciphers chacha20-poly1305@openssh.com,aes128-ctr\n")
    t = Transport(endpoint.host, ssh_config=[config])
    try:
        await t.wait_up(5)
        assert t.connection is not None
        assert t.connection.get_extra_info("send_cipher") == "chacha20-poly1305@openssh.com"
    finally:
        await t.close()


@pytest.mark.parametrize("opening", ["run", "stream"])
async def test_a_connection_that_closes_as_a_command_is_accepted_is_a_lost_link_not_a_crash(
    endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch, opening: str
) -> None:
    """The server accepts the exec and the connection closes before asyncssh's `create()` resumes: asyncssh
    2.24 then calls `session_started()` on the channel's session it has already dropped (AttributeError on
    None). CI saw it end the demo with exit 1 when `q` closed the link under a worker's command."""
    from asyncssh.channel import SSHChannel
    from asyncssh.constants import MSG_CHANNEL_SUCCESS

    real = SSHChannel._packet_handlers[MSG_CHANNEL_SUCCESS]
    closed: list[bool] = []

    def accept_then_close(chan: SSHChannel[Any], pkttype: int, pktid: int, packet: Any) -> None:
        if not closed and chan._conn is not None and not isinstance(chan._conn, asyncssh.SSHServerConnection):
            # The close comes first and the acceptance after it, in one turn of the loop: asyncssh drops
            # the channels before `create()` wakes up to a request that succeeded.
            closed.append(True)
            chan._conn.close()
        real(chan, pkttype, pktid, packet)

    monkeypatch.setitem(SSHChannel._packet_handlers, MSG_CHANNEL_SUCCESS, accept_then_close)  # type: ignore[arg-type]
    async with transport(endpoint.host, backoff=FAST) as t:
        await t.wait_up(5)
        with pytest.raises(TransportError, match="lost the connection as echo started"):
            if opening == "run":
                await t.run(["echo", "hi"], timeout=5)
            else:
                async with t.stream(["echo", "hi"], timeout=5):
                    pass
        assert closed
        await eventually(lambda: t.status.drops == 1, timeout=5)
        assert (await t.run(["echo", "back"], timeout=5)).stdout == "back\n"
