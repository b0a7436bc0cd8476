"""The twin host over SSH: systemctl, drop-ins, the journal (real journalctl), nvidia-smi, forwarding.

One twin runs the simulated SGLang server for the module (tiny time scale); the tests talk to it with an
asyncssh client exactly as the console does. Tests that break the unit (OOM) restore it themselves.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import httpx
import pytest

from console.sources.gpu_agent import agent_argv
from console.twin.host import DEFAULT_UNIT, TwinHost, native_journal_available
from console.twin.layout import GpuInventory
from console.twin.realsd import why_unavailable
from console.twin.unitfile import render_exec
from tests.support.procs import processes_of

UNIT = DEFAULT_UNIT
TIME_SCALE = 0.002
POOLS = {"0.85": 101_134, "0.92": 192_406, "0.94": 218_484}


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwinHost]:
    host = TwinHost(tmp_path_factory.mktemp("twin") / "state", time_scale=TIME_SCALE)
    host.start_sync()
    try:
        yield host
    finally:
        host.stop_sync()
        _assert_no_leftovers(host)


def _assert_no_leftovers(host: TwinHost) -> None:
    left = processes_of(host.layout.root)
    assert not left, f"processes outlived the twin: {left}"


async def connect(host: TwinHost) -> asyncssh.SSHClientConnection:
    return await asyncssh.connect(
        host.ssh_host,
        port=host.ssh_port,
        username=host.user,
        client_keys=[str(host.client_key)],
        known_hosts=str(host.known_hosts),
    )


async def run(conn: asyncssh.SSHClientConnection, command: str) -> asyncssh.SSHCompletedProcess:
    return await conn.run(command, check=False)


def write_dropin(host: TwinHost, flags: dict[str, str], name: str = "50-k26.conf") -> None:
    """A drop-in replacing ExecStart with the fragment's command, some flags changed (as the console does)."""
    svc = host.systemctl("show", "-p", "ExecStart", UNIT).stdout
    argv = svc.split("argv[]=", 1)[1].split(" ; ", 1)[0].split(" ")
    for flag, value in flags.items():
        argv[argv.index(flag) + 1] = value
    path = host.layout.unit_dir / f"{UNIT}.service.d" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"[Service]\nExecStart=\nExecStart={render_exec(argv)}\n")


def drop_dropins(host: TwinHost) -> None:
    d = host.layout.unit_dir / f"{UNIT}.service.d"
    for p in d.glob("*.conf") if d.is_dir() else []:
        p.unlink()


def entries(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def last_invocation(es: list[dict[str, object]]) -> list[dict[str, object]]:
    inv = [e.get("_SYSTEMD_INVOCATION_ID") or e.get("INVOCATION_ID") for e in es]
    starts = [i for i, e in enumerate(es) if str(e.get("MESSAGE", "")).startswith("Starting ")]
    last = inv[starts[-1]]
    return [e for e, i in zip(es, inv, strict=True) if i == last]


def pool_of(es: list[dict[str, object]]) -> int:
    for e in es:
        msg = e.get("MESSAGE")
        if isinstance(msg, str) and "max_total_num_tokens=" in msg:
            return int(msg.split("max_total_num_tokens=", 1)[1].split(",", 1)[0])
    raise AssertionError("no max_total_num_tokens line")


async def test_hosts_toml_is_a_console_hosts_file(twin: TwinHost) -> None:
    from console.sources.hosts import load_hosts

    hosts = load_hosts(twin.hosts_toml)
    cfg = hosts.get("twin")
    assert cfg is not None
    assert cfg.port == twin.ssh_port and cfg.unit == UNIT
    assert cfg.server_url == twin.sglang_url
    assert cfg.identity_file == twin.client_key and cfg.known_hosts == twin.known_hosts


async def test_session_basics_exit_status_streams_and_stand_ins_on_path(twin: TwinHost) -> None:
    async with await connect(twin) as conn:
        res = await run(conn, "echo out; echo err >&2; exit 7")
        assert (res.exit_status, res.stdout, res.stderr) == (7, "out\n", "err\n")
        res = await run(conn, "command -v systemctl nvidia-smi journalctl")
        assert res.stdout.split() == [
            str(twin.layout.bin_dir / n) for n in ("systemctl", "nvidia-smi", "journalctl")
        ]
        res = await run(
            conn, "systemctl is-active sglang-k26-ddtree; systemctl show -P MainPID sglang-k26-ddtree"
        )
        state, pid = res.stdout.split()
        assert state == "active" and int(pid) > 0
        tty = await conn.run("tty; echo $TERM", term_type="xterm-256color", check=False)
        assert tty.stdout.startswith("/dev/pts/") and tty.stdout.rstrip().endswith("xterm-256color")


async def test_wrong_key_is_refused(twin: TwinHost, tmp_path: Path) -> None:
    other = asyncssh.generate_private_key("ssh-ed25519")
    with pytest.raises(asyncssh.PermissionDenied):
        await asyncssh.connect(
            twin.ssh_host,
            port=twin.ssh_port,
            username=twin.user,
            client_keys=[other],
            known_hosts=str(twin.known_hosts),
        )


async def test_channel_close_kills_the_process_group(twin: TwinHost) -> None:
    conn = await connect(twin)
    proc = await conn.create_process("echo $$; sleep 300 & sleep 301; wait")
    pid = int((await proc.stdout.readline()).strip())
    proc.close()
    conn.close()
    await conn.wait_closed()
    for _ in range(200):
        if not Path(f"/proc/{pid}").exists():
            break
        await asyncio.sleep(0.01)
    assert not Path(f"/proc/{pid}").exists()
    # The session's children carry this twin's K26_TWIN_ROOT: only they are looked for.
    deadline = time.monotonic() + 5
    while processes_of(twin.layout.root, cmdline_has="sleep 30") and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert not processes_of(twin.layout.root, cmdline_has="sleep 30")


async def test_restart_with_dropin_needs_daemon_reload_then_changes_pool(twin: TwinHost) -> None:
    async with await connect(twin) as conn:
        write_dropin(twin, {"--mem-fraction-static": "0.92"})
        res = await run(conn, "systemctl restart sglang-k26-ddtree")
        assert res.exit_status == 0
        assert "changed on disk. Run 'systemctl daemon-reload'" in res.stderr
        shown = await run(conn, "systemctl show -p ExecStart sglang-k26-ddtree")
        assert "--mem-fraction-static 0.85" in shown.stdout  # the old command until daemon-reload
        status = await run(conn, "systemctl status sglang-k26-ddtree")
        assert "Warning: The unit file" in status.stderr

        res = await run(
            conn,
            "systemctl daemon-reload && systemctl restart sglang-k26-ddtree && journalctl -u sglang-k26-ddtree -o json -n 200",
        )
        assert res.exit_status == 0, res.stderr
        assert res.stderr == ""
        last = last_invocation(entries(res.stdout))
        msgs = [str(e.get("MESSAGE")) for e in last]
        assert msgs[0] == "Starting sglang-k26-ddtree.service - SGLang Kimi K2.6..."
        # `restart` returns once the unit is active: its "Started" is in, after the pool. The server's
        # last lines (ready to roll, /health answering ExecStartPost=) reach the journal before or after
        # it (a /health access line came last once, in a 5-worker pass).
        started = msgs.index("Started sglang-k26-ddtree.service - SGLang Kimi K2.6.")
        assert started > next(i for i, m in enumerate(msgs) if "max_total_num_tokens=" in m)
        order = [
            next(i for i, m in enumerate(msgs) if needle in m)
            for needle in (
                "Load weight begin",
                "KV Cache is allocated",
                "Memory pool end",
                "max_total_num_tokens=",
                "ready to roll",
            )
        ]
        assert order == sorted(order)
        assert pool_of(last) == POOLS["0.92"]
        server = next(e for e in last if e.get("_SYSTEMD_UNIT") == "sglang-k26-ddtree.service")
        # journald names the process after its executable: the interpreter the twin runs the server with
        interpreter = Path(sys.executable).name
        assert server["SYSLOG_IDENTIFIER"] == interpreter and server["_COMM"] == interpreter[:15]
        assert server["_BOOT_ID"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace(
            "-", ""
        )
        systemd = next(e for e in last if e.get("SYSLOG_IDENTIFIER") == "systemd")
        assert systemd["_PID"] == "1" and systemd["UNIT"] == "sglang-k26-ddtree.service"
        assert systemd["INVOCATION_ID"] == server["_SYSTEMD_INVOCATION_ID"]
        # The stop of the previous invocation precedes it, in systemd's words.
        all_msgs = [str(e.get("MESSAGE")) for e in entries(res.stdout)]
        stop = all_msgs.index("Stopping sglang-k26-ddtree.service - SGLang Kimi K2.6...", 0)
        tail = all_msgs[stop:]
        assert tail.index("sglang-k26-ddtree.service: Deactivated successfully.") < tail.index(
            "Stopped sglang-k26-ddtree.service - SGLang Kimi K2.6."
        )


async def test_incident_pool_sizes_from_dropins_alone(twin: TwinHost) -> None:
    async with await connect(twin) as conn:
        for fraction in ("0.94", "0.85"):
            write_dropin(twin, {"--mem-fraction-static": fraction})
            res = await run(
                conn,
                "systemctl daemon-reload && systemctl restart sglang-k26-ddtree && "
                "journalctl -u sglang-k26-ddtree -o json -n 200",
            )
            assert res.exit_status == 0, res.stderr
            assert pool_of(last_invocation(entries(res.stdout))) == POOLS[fraction]
            assert (
                f"--mem-fraction-static {fraction}"
                in (await run(conn, "systemctl show -p ExecStart sglang-k26-ddtree")).stdout
            )


async def test_journalctl_follow_streams_a_restart_live(twin: TwinHost) -> None:
    async with await connect(twin) as conn:
        cursor = entries((await run(conn, "journalctl -u sglang-k26-ddtree -o json -n 1")).stdout)[-1][
            "__CURSOR"
        ]
        follow = await conn.create_process(
            f"journalctl -u sglang-k26-ddtree -o json -f --after-cursor {shlex.quote(str(cursor))}"
        )
        restart = asyncio.ensure_future(run(conn, "systemctl restart sglang-k26-ddtree"))
        seen: list[tuple[float, str]] = []
        while True:
            line = await asyncio.wait_for(follow.stdout.readline(), 30)
            e = json.loads(line)
            seen.append((time.monotonic(), str(e.get("MESSAGE"))))
            if str(e.get("MESSAGE")).startswith("Started "):
                break
        await restart
        follow.close()
        msgs = [m for _, m in seen]
        # The manager's "Stopping" and the server's own reaction to SIGTERM reach the journal by different
        # roads (PID 1's native socket, the service's stdout stream): either may come first.
        assert "Stopping sglang-k26-ddtree.service - SGLang Kimi K2.6..." in msgs
        assert any("max_total_num_tokens=" in m for m in msgs)
        # Lines arrived while the restart ran, not in one burst at the end.
        first_start = next(t for t, m in seen if m.startswith("Starting "))
        assert seen[-1][0] - first_start > 0.2
    deadline = time.monotonic() + 2
    while processes_of(twin.layout.root, cmdline_has="journalctl") and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert not processes_of(twin.layout.root, cmdline_has="journalctl")


@pytest.mark.serial  # samples every 20 ms must see each phase of a fast restart: measured with no other test running
async def test_nvidia_smi_numbers_move_through_the_phases(twin: TwinHost) -> None:
    query = "nvidia-smi --query-gpu=index,name,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits"
    async with await connect(twin) as conn:
        header = await run(
            conn, "nvidia-smi --query-gpu=index,name,utilization.gpu,memory.used,memory.total --format=csv"
        )
        lines = header.stdout.splitlines()
        assert lines[0] == "index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB]"
        assert (
            len(lines) == 9
            and lines[1].endswith(" MiB, 97887 MiB")
            and ", NVIDIA RTX PRO 6000 Blackwell" in lines[1]
        )
        running = int((await run(conn, query)).stdout.splitlines()[0].split(", ")[2])
        restart = asyncio.ensure_future(run(conn, "systemctl restart sglang-k26-ddtree"))
        used: list[int] = []
        while not restart.done():
            out = (await run(conn, query)).stdout.splitlines()
            if out:
                used.append(int(out[0].split(", ")[2]))
            await asyncio.sleep(0.02)
        assert (await restart).exit_status == 0
        final = int((await run(conn, query)).stdout.splitlines()[0].split(", ")[2])
        assert final == running
        assert min(used) < running  # the GPU emptied while the server restarted
        assert len(set(used)) >= 3  # and filled in steps (weights, pool, graphs)
        apps = await run(
            conn, "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader"
        )
        pid = (await run(conn, "systemctl show -P MainPID sglang-k26-ddtree")).stdout.strip()
        assert apps.stdout.splitlines() and all(
            line.startswith(f"{pid}, ") for line in apps.stdout.splitlines()
        )
        listing = await run(conn, "nvidia-smi -L")
        assert (
            listing.stdout.startswith("GPU 0: NVIDIA RTX PRO 6000 Blackwell")
            and "(UUID: GPU-" in listing.stdout
        )
        agent = await run(conn, "k26-nvml-agent --count 2 --interval 0.01")
        samples = [json.loads(line) for line in agent.stdout.splitlines()]
        assert len(samples) == 2 and samples[0]["gpus"][0]["memory_total"] == 97887 * 1024 * 1024


async def test_python3_reads_the_gpus_through_pynvml_as_nvidia_smi_prints_them(twin: TwinHost) -> None:
    """The console's GPU agent (the script it sends as `python3 -c`) on the twin's python3, which has
    nvidia-ml-py as a real SGLang host's does: the same GPUs, memory and processes as nvidia-smi."""
    query = "--query-gpu=index,uuid,memory.used,memory.total --format=csv,noheader,nounits"
    async with await connect(twin) as conn:
        for _ in range(50):  # a reading between two of the server's writes: the same numbers in both
            # The agent stops at the end of its stdin, as when the console closes the channel.
            async with conn.create_process(shlex.join(agent_argv(0.05))) as proc:
                async with asyncio.timeout(20):
                    line = await proc.stdout.readline()
                proc.stdin.write_eof()
            smi = await run(conn, f"nvidia-smi {query}")
            again = await run(conn, f"nvidia-smi {query}")
            if smi.stdout == again.stdout:
                break
        sample = json.loads(line)
        assert sample["state"] == "ok" and len(sample["gpus"]) == 8, sample
        rows = [line.split(", ") for line in str(smi.stdout).splitlines()]
        assert [
            (g["index"], g["uuid"], g["memory_used_mib"], g["memory_total_mib"]) for g in sample["gpus"]
        ] == [(int(i), uuid, float(used), float(total)) for i, uuid, used, total in rows]
        pid = (await run(conn, "systemctl show -P MainPID sglang-k26-ddtree")).stdout.strip()
        assert all(p["pid"] == int(pid) and p["name"] for g in sample["gpus"] for p in g["processes"])


def test_a_twin_without_nvml_has_no_pynvml(tmp_path: Path) -> None:
    """`nvml=False` on a twin's state directory that had it: the python3 stand-in and pynvml are gone, so
    the session's python3 is the machine's own, with no pynvml of the twin's on its path."""
    for nvml in (True, False):
        host = TwinHost(tmp_path / "state", nvml=nvml)
        host.prepare()
        assert (host.layout.bin_dir / "python3").exists() is nvml
        assert (host.layout.nvml_dir / "pynvml.py").exists() is nvml
    # Whether the machine's own python3 has a pynvml is the machine's business, not the twin's.
    res = subprocess.run(
        ["python3", "-c", "import sys; print(sys.executable, *sys.path, sep='\\n')"],
        env=host.session_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    executable, *path = res.stdout.split("\n")
    assert not Path(executable).is_relative_to(host.layout.root), executable
    assert str(host.layout.nvml_dir) not in path


async def test_port_forward_reaches_the_sglang_http_port(twin: TwinHost) -> None:
    async with await connect(twin) as conn:
        port = int(twin.sglang_url.rsplit(":", 1)[1])
        listener = await conn.forward_local_port("127.0.0.1", 0, "127.0.0.1", port)
        async with httpx.AsyncClient() as client:
            res = await client.get(f"http://127.0.0.1:{listener.get_port()}/health", timeout=5)
        listener.close()
        assert res.status_code == 200


async def test_too_high_fraction_fails_with_cuda_oom_and_a_failed_unit(twin: TwinHost) -> None:
    async with await connect(twin) as conn:
        try:
            write_dropin(twin, {"--mem-fraction-static": "0.97"})
            res = await run(conn, "systemctl daemon-reload && systemctl restart sglang-k26-ddtree")
            assert res.exit_status == 1
            assert "Job for sglang-k26-ddtree.service failed" in res.stderr
            active = await run(conn, "systemctl is-active sglang-k26-ddtree")
            assert (active.exit_status, active.stdout) == (3, "failed\n")
            assert (await run(conn, "systemctl is-failed sglang-k26-ddtree")).exit_status == 0
            log = entries((await run(conn, "journalctl -u sglang-k26-ddtree -o json -n 5000")).stdout)
            msgs = [str(e.get("MESSAGE")) for e in last_invocation(log)]
            assert any("CUDA out of memory" in m for m in msgs)
            # SGLang's launcher kills its own process tree (SIGKILL) when a scheduler fails.
            exited = [
                m for m in msgs if m.startswith("sglang-k26-ddtree.service: Main process exited, code=")
            ]
            assert exited in (
                ["sglang-k26-ddtree.service: Main process exited, code=killed, status=9/KILL"],
                ["sglang-k26-ddtree.service: Main process exited, code=exited, status=1/FAILURE"],
            )
            result = "signal" if "killed" in exited[0] else "exit-code"
            # The readiness wait (ExecStartPost=) is not ended by systemd when the main process dies: it
            # sees $MAINPID gone and exits 1 by itself.
            # Only the manager's own lines keep their order: the unit's stdout reaches journald on another
            # stream, and a traceback's tail can land after systemd's "Main process exited".
            manager = [str(e.get("MESSAGE")) for e in last_invocation(log) if e.get("_TRANSPORT") != "stdout"]
            i = manager.index(exited[0])
            assert manager[i + 1 : i + 4] == [
                "sglang-k26-ddtree.service: Control process exited, code=exited, status=1/FAILURE",
                f"sglang-k26-ddtree.service: Failed with result '{result}'.",
                "Failed to start sglang-k26-ddtree.service - SGLang Kimi K2.6.",
            ]
            status = await run(conn, "systemctl status sglang-k26-ddtree")
            assert status.exit_status == 3 and f"Active: failed (Result: {result})" in status.stdout
        finally:
            drop_dropins(twin)
            twin.systemctl("daemon-reload")
            twin.systemctl("restart", UNIT, check=False)


# --- the service manager with a small fake server (fast, and both journal back-ends) -----------------

FAKE_SERVER = r"""
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: (print("bye", flush=True), sys.exit(0)))
print("hello", " ".join(sys.argv[1:]), flush=True)
print("multi\nline", flush=True)
if "--fail" in sys.argv:
    print("Traceback (most recent call last):", flush=True)
    sys.exit(1)
while True:
    time.sleep(0.05)
"""


def fake_twin(tmp: Path, journal: str) -> TwinHost:
    """`journal`: fallback or native under the simulated systemd, or `real` (a real systemd manager and
    its journald)."""
    script = tmp / "fake_server.py"
    script.write_text(FAKE_SERVER)
    return TwinHost(
        tmp / "state",
        ssh=False,
        journal="native" if journal == "real" else journal,  # type: ignore[arg-type]
        systemd="real" if journal == "real" else "simulated",
        server_command=[sys.executable, str(script)],
        wait_ready=False,
        start_service=False,
        gpus=GpuInventory(name="NVIDIA H100 80GB HBM3", count=1, total_mib=81559),
    )


JOURNALS = [
    "fallback",
    *(["native"] if native_journal_available() else []),
    *(["real"] if why_unavailable() is None else []),
]


@pytest.mark.parametrize("journal", JOURNALS)
async def test_supervisor_lines_cursors_and_failure(tmp_path: Path, journal: str) -> None:
    host = fake_twin(tmp_path, journal)
    await asyncio.to_thread(host.start_blocking)
    try:
        assert host.systemctl("start", UNIT).returncode == 0
        # A Type=simple start returns once the process is forked: wait for its first lines (a stop
        # before Python is up ends it silently by SIGTERM's default action).
        deadline = time.monotonic() + 10
        while True:
            _, out, _ = await host.sh(f"journalctl -u {UNIT} -o json")
            es = entries(out)
            if "line" in [e["MESSAGE"] for e in es] or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)
        # No "Starting": a Type=simple unit without ExecStartPre=/Post= has no activating phase.
        assert [e["MESSAGE"] for e in es][:1] == ["Started sglang-k26-ddtree.service - SGLang Kimi K2.6."]
        follow = await asyncio.create_subprocess_exec(
            str(host.layout.bin_dir / "journalctl"),
            "-u",
            UNIT,
            "-o",
            "json",
            "-f",
            "--after-cursor",
            str(es[-1]["__CURSOR"]),
            env=host.session_env(),
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            # Output lines may still be on their way; the follower sees them and the stop, in order.
            assert host.systemctl("stop", UNIT).returncode == 0
            got: list[str] = []
            # journald reads a service's stdout stream at a lower priority than PID 1's messages:
            # under load "bye" may land after "Stopped". Wait for both.
            while not {"Stopped sglang-k26-ddtree.service - SGLang Kimi K2.6.", "bye"} <= set(got):
                got.append(str(json.loads(await asyncio.wait_for(follow.stdout.readline(), 10))["MESSAGE"]))  # type: ignore[union-attr]
        finally:
            follow.kill()
            await follow.wait()
        _, out, _ = await host.sh(f"journalctl -u {UNIT} -o json")
        msgs = [e["MESSAGE"] for e in entries(out)]
        assert "multi" in msgs and "line" in msgs and "bye" in msgs
        # "Consumed ... CPU time." follows where the manager accounts CPU (a cpu controller in its cgroup).
        if msgs[-1].endswith("CPU time."):
            msgs.pop()
        assert msgs[-2:] == [
            "sglang-k26-ddtree.service: Deactivated successfully.",
            "Stopped sglang-k26-ddtree.service - SGLang Kimi K2.6.",
        ]
        assert (await host.sh(f"systemctl is-active {UNIT}"))[:2] == (3, "inactive\n")

        # A server that exits 1 on its own: systemd's failure lines, a failed unit.
        dropin = host.layout.unit_dir / f"{UNIT}.service.d" / "fail.conf"
        dropin.parent.mkdir(parents=True)
        dropin.write_text(
            f"[Service]\nExecStart=\nExecStart={render_exec([sys.executable, str(tmp_path / 'fake_server.py'), '--fail'])}\n"
        )
        host.systemctl("daemon-reload")
        host.systemctl("start", UNIT)
        for _ in range(300):
            if (await host.sh(f"systemctl is-failed {UNIT}"))[0] == 0:
                break
            await asyncio.sleep(0.01)
        _, out, _ = await host.sh(f"journalctl -u {UNIT} -o cat -n 4")
        tail = out.splitlines()
        if tail[-1].endswith("CPU time."):
            tail.pop()
        assert tail[-3:] == [
            "Traceback (most recent call last):",
            "sglang-k26-ddtree.service: Main process exited, code=exited, status=1/FAILURE",
            "sglang-k26-ddtree.service: Failed with result 'exit-code'.",
        ]
        _rc, out, _ = await host.sh(f"journalctl -u {UNIT} -o json --since=-1min -n 3")
        assert len(entries(out)) == 3
    finally:
        await asyncio.to_thread(host.stop_blocking)
    _assert_no_leftovers(host)


@pytest.mark.parametrize("journal", JOURNALS)
async def test_bad_setting_refuses_to_start(tmp_path: Path, journal: str) -> None:
    host = fake_twin(tmp_path, journal)
    await asyncio.to_thread(host.start_blocking)
    try:
        dropin = host.layout.unit_dir / f"{UNIT}.service.d" / "forgot-reset.conf"
        dropin.parent.mkdir(parents=True)
        dropin.write_text("[Service]\nExecStart=/bin/true\n")
        host.systemctl("daemon-reload")
        res = host.systemctl("start", UNIT, check=False)
        assert res.returncode == 1 and "bad unit file setting" in res.stderr
        _rc, out, _ = await host.sh(f"systemctl cat {UNIT}")
        assert out.startswith(f"# {host.layout.unit_dir / (UNIT + '.service')}\n[Unit]")
        assert f"# {dropin}\n[Service]\nExecStart=/bin/true" in out
    finally:
        await asyncio.to_thread(host.stop_blocking)


def test_cli_rejects_a_bad_scenario_in_one_sentence(tmp_path: Path) -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "console.cli.main",
            "twin",
            "--state-dir",
            str(tmp_path / "s"),
            "--scenario",
            "nope",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert res.stderr.startswith("k26-console: there is no twin scenario 'nope'; known: kimi-k26-rtx6000")
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()  # refused before anything was written


def test_cli_prints_hosts_toml_and_a_working_ssh_command(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "console.cli.main",
            "twin",
            "--state-dir",
            str(tmp_path / "s"),
            "--time-scale",
            str(TIME_SCALE),
            "--no-register",  # never into the hosts.toml of whoever runs the tests
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        hosts_toml = proc.stdout.readline().strip()
        ssh = proc.stdout.readline().strip()
        assert Path(hosts_toml).is_file() and ssh.startswith("ssh ")
        res = subprocess.run(
            [*shlex.split(ssh), "-o", "BatchMode=yes", f"systemctl is-active {UNIT}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert res.stdout == "active\n", res.stderr
    finally:
        proc.send_signal(2)
        proc.wait(30)
    assert proc.returncode == 0
    host = TwinHost(tmp_path / "s")
    _assert_no_leftovers(host)
