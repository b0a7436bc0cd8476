"""The twin behind the real OpenSSH sshd on 127.0.0.2: the console's commands reach the stand-ins."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import pytest

from console.twin.host import DEFAULT_UNIT, TwinHost
from tests.support.procs import processes_of
from tests.support.sshd import SshdHandle, sshd_unavailable_reason, start_sshd

pytestmark = [
    pytest.mark.sshd,
    pytest.mark.skipif(
        sshd_unavailable_reason() is not None, reason=f"real sshd: {sshd_unavailable_reason()}"
    ),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TwinHost, SshdHandle]]:
    base = tmp_path_factory.mktemp("twin-sshd")
    twin = TwinHost(base / "state", ssh=False, time_scale=0.002)
    twin.start_sync()
    try:
        sshd = start_sshd(
            base / "sshd",
            listen="127.0.0.2",
            host_key=twin.host_key,
            client_key=twin.client_key,
            session_env=twin.session_env(),
        )
        try:
            twin.set_ssh_endpoint(sshd.host, sshd.port)
            yield twin, sshd
        finally:
            sshd.stop()
    finally:
        twin.stop_sync()


async def connect(sshd: SshdHandle) -> asyncssh.SSHClientConnection:
    return await asyncssh.connect(
        sshd.host,
        port=sshd.port,
        username=sshd.user,
        client_keys=[str(sshd.client_key)],
        known_hosts=str(sshd.known_hosts),
    )


async def test_restart_then_journal_shows_the_startup_with_its_pool(
    served: tuple[TwinHost, SshdHandle],
) -> None:
    _twin, sshd = served
    async with await connect(sshd) as conn:
        res = await conn.run(
            f"systemctl restart {DEFAULT_UNIT} && journalctl -u {DEFAULT_UNIT} -o json -n 200", check=False
        )
        assert res.exit_status == 0, res.stderr
        es = [json.loads(line) for line in str(res.stdout).splitlines()]
        starts = [
            i
            for i, e in enumerate(es)
            if e.get("MESSAGE") == "Starting sglang-k26-ddtree.service - SGLang Kimi K2.6..."
        ]
        last = [str(e.get("MESSAGE")) for e in es[starts[-1] :]]
        pool = next(i for i, m in enumerate(last) if "max_total_num_tokens=101134," in m)
        # `restart` returns once the unit is active, so its "Started" is in. The server's "ready to roll"
        # is printed as its /health turns OK, which ends the unit's ExecStartPost=: the two lines reach
        # the journal in either order (the server's came last once, in a 5-worker pass).
        assert pool < last.index("Started sglang-k26-ddtree.service - SGLang Kimi K2.6.")


async def test_stand_ins_first_on_path_and_follow_ends_with_the_channel(
    served: tuple[TwinHost, SshdHandle],
) -> None:
    twin, sshd = served

    # The follower this test starts: a journalctl that carries this twin's state directory (in its
    # command line or its K26_TWIN_ROOT); another console's journalctl on the machine is not counted.
    def followers() -> list[str]:
        return processes_of(twin.layout.root, cmdline_has="journalctl")

    async with await connect(sshd) as conn:
        res = await conn.run("command -v systemctl nvidia-smi journalctl; echo $HOME", check=False)
        assert str(res.stdout).split() == [
            *(str(twin.layout.bin_dir / n) for n in ("systemctl", "nvidia-smi", "journalctl")),
            str(twin.layout.home_dir),
        ]
        smi = await conn.run(
            "nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits", check=False
        )
        used, total = str(smi.stdout).splitlines()[0].split(", ")
        assert int(total) == 97887 and 0 < int(used) < int(total)
        follow = await conn.create_process(f"journalctl -u {DEFAULT_UNIT} -o json -f -n 1")
        assert json.loads(await asyncio.wait_for(follow.stdout.readline(), 10))["_SYSTEMD_UNIT"]
        assert followers(), "the follower is not found while it runs: the check below would prove nothing"
        follow.close()

    deadline = time.monotonic() + 5
    while followers() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert not followers()


def test_openssh_client_reaches_the_twin(served: tuple[TwinHost, SshdHandle]) -> None:
    twin, sshd = served
    res = subprocess.run(
        sshd.ssh_argv(f"systemctl is-active {DEFAULT_UNIT}"), capture_output=True, text=True, timeout=30
    )
    assert res.stdout == "active\n", res.stderr + sshd.log()
    assert Path(twin.hosts_toml).read_text().count(f"port = {sshd.port}") == 1
