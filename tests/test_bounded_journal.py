"""Issue 30 item 1: what a host's journal can hold that the console must read past, bounded.

- An entry over the SSH channel's window (~2 MiB; a native `sd_journal_send` entry may be far larger than
  journald's 48 KiB stream lines) made the follower restart from the same cursor forever: nothing after it
  was ever seen. It is now cut at `ENTRY_MAX_BYTES` with a sentence in its MESSAGE, keeps its cursor (which
  journalctl may print after the huge field), and the entries after it arrive.
- A `__REALTIME_TIMESTAMP` no clock shows (year 10000, negative) is refused: the entry keeps no time.
- A line from another process of the unit (an ExecStartPost= shell) after ready no longer opens a boot.

The journal here is real: journal files written by systemd-journal-remote from the export format, read
by the real journalctl over the real sshd on loopback; the last test runs the twin's unit under its
systemd with an ExecStartPost= drop-in.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.core.parser import parse_lines, parse_text
from console.core.parsing.journal_json import ENTRY_MAX_BYTES, cut_entry
from console.core.state import fold_boots
from console.sources.bounded import BoundedLines, CutLine
from console.sources.hosts import HostConfig
from console.sources.journal import JournalFollower, read_unit_journal
from console.sources.transport import Backoff, Transport
from console.tui.view import clock_text
from tests.support.cli import run_cli, started_twin, wait_until
from tests.support.sshd import SshdHandle, sshd_unavailable_reason, start_sshd

JOURNAL_REMOTE = Path("/lib/systemd/systemd-journal-remote")
UNIT = "sglang.service"
BIG = 3 << 20  # past the SSH channel's 2 MiB window and the 1 MiB entry limit

needs_sshd = pytest.mark.skipif(sshd_unavailable_reason() is not None, reason=sshd_unavailable_reason() or "")
needs_journal = pytest.mark.skipif(
    not os.access(JOURNAL_REMOTE, os.X_OK), reason="systemd-journal-remote is not installed"
)


def _export(fields: dict[str, str]) -> bytes:
    out = bytearray()
    for key, value in fields.items():
        data = value.encode()
        if b"\n" in data:
            out += key.encode() + b"\n" + len(data).to_bytes(8, "little") + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out) + b"\n"


def _journal_file(path: Path, messages: list[str]) -> Path:
    """A journal file holding `messages` as entries of UNIT, written by systemd-journal-remote."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
    now = time.time_ns() // 1000
    mono = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    data = b"".join(
        _export(
            {
                "__REALTIME_TIMESTAMP": str(now + i),
                "__MONOTONIC_TIMESTAMP": str(mono + i),
                "_BOOT_ID": boot,
                "_PID": "4242",
                "_SYSTEMD_UNIT": UNIT,
                "SYSLOG_IDENTIFIER": "python3",
                "MESSAGE": message,
            }
        )
        for i, message in enumerate(messages)
    )
    subprocess.run(
        [str(JOURNAL_REMOTE), f"--output={path}", "--split-mode=none", "-"],
        input=data,
        check=True,
        capture_output=True,
        timeout=30,
    )
    return path


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[SshdHandle]:
    home = tmp_path / "home"
    home.mkdir()
    handle = start_sshd(
        tmp_path / "sshd", listen="127.0.0.2", session_env={"PATH": "/usr/bin:/bin", "HOME": str(home)}
    )
    try:
        yield handle
    finally:
        handle.stop()


def _config(sshd: SshdHandle) -> HostConfig:
    return HostConfig(
        name="gpu-j",
        ssh=f"{sshd.user}@{sshd.host}",
        port=sshd.port,
        unit=UNIT,
        identity_file=sshd.client_key,
        known_hosts=sshd.known_hosts,
    )


MESSAGES = ["first", "big " + "y" * BIG, "third"]


@needs_sshd
@needs_journal
@pytest.mark.sshd
async def test_the_follower_reads_past_an_entry_over_the_ssh_window(tmp_path: Path, sshd: SshdHandle) -> None:
    journal = _journal_file(tmp_path / "big.journal", MESSAGES)
    transport = Transport(_config(sshd), ssh_config=[], backoff=Backoff(max_attempts=3))
    follower = JournalFollower(
        transport,
        UNIT,
        journalctl=("journalctl", "--file", str(journal)),
        scope_to_invocation=False,
        restart_delay_s=0.1,
    )
    try:
        follower.start()
        got: list[dict[str, object]] = []
        async with asyncio.timeout(20):  # before: restarted from "first" forever, "third" never came
            while len(got) < 3:
                got += await follower.next_batch()
        assert [str(e["MESSAGE"])[:5] for e in got] == ["first", "big y", "third"]
        cut = got[1]
        message = str(cut["MESSAGE"])
        assert f" [k26-console: journal entry cut at {ENTRY_MAX_BYTES:,} of its " in message
        assert len(message) < 1000 and "bytes]" in message[-20:]
        # the cut entry keeps what the parser and the state need: its cursor, time, PID and unit
        assert (
            str(cut["__CURSOR"]).startswith("s=") and cut["_PID"] == "4242" and cut["_SYSTEMD_UNIT"] == UNIT
        )
        assert follower.status.restarts == 0 and follower.cursor == got[2]["__CURSOR"]
        (event,) = parse_lines([cut])
        assert event.kind == "log" and event.pid == 4242 and event.realtime_us is not None
    finally:
        await follower.close()
        await transport.close()


@needs_sshd
@needs_journal
@pytest.mark.sshd
async def test_the_follower_holds_a_bounded_number_of_bytes_for_a_lagging_consumer(
    tmp_path: Path, sshd: SshdHandle
) -> None:
    """120 entries of 700 KB (each under the entry limit): a consumer that takes none holds the follower
    at its byte bound, not at 4,096 entries (2.8 GB); then it takes them all, none lost."""
    messages = [f"{n:04d} " + "z" * 700_000 for n in range(120)]
    journal = _journal_file(tmp_path / "many.journal", messages)
    transport = Transport(_config(sshd), ssh_config=[], backoff=Backoff(max_attempts=3))
    follower = JournalFollower(
        transport,
        UNIT,
        journalctl=("journalctl", "--file", str(journal)),
        scope_to_invocation=False,
        queue_max_bytes=8 << 20,
    )
    try:
        follower.start()
        async with asyncio.timeout(20):
            while follower.pending < 12:
                await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # time enough to read on, were it not held
        assert follower.pending <= 13, follower.pending  # 8 MiB and the entry that crossed it
        got: list[str] = []
        async with asyncio.timeout(30):
            while len(got) < len(messages):
                got += [str(e["MESSAGE"]) for e in await follower.next_batch()]
        assert [m[:4] for m in got] == [m[:4] for m in messages]
    finally:
        await follower.close()
        await transport.close()


@needs_sshd
@needs_journal
@pytest.mark.sshd
async def test_a_one_shot_read_cuts_an_entry_and_keeps_the_newest_within_its_bound(
    tmp_path: Path, sshd: SshdHandle
) -> None:
    journal = _journal_file(tmp_path / "big.journal", MESSAGES)
    transport = Transport(_config(sshd), ssh_config=[], backoff=Backoff(max_attempts=3))
    argv = ("journalctl", "--file", str(journal))
    try:
        lines = await read_unit_journal(transport, UNIT, journalctl=argv)
        entries = [json.loads(line) for line in lines]
        assert [e["MESSAGE"][:5] for e in entries] == ["first", "big y", "third"]
        assert sum(len(line) for line in lines) < 10_000  # the 3 MiB entry is cut, not carried
        # past its bound in all, the oldest entries go and the newest stay
        newest = await read_unit_journal(transport, UNIT, journalctl=argv, max_bytes=1500)
        assert [json.loads(line)["MESSAGE"][:5] for line in newest] == ["big y", "third"]
    finally:
        await transport.close()


def test_a_cut_entry_keeps_its_fields_wherever_journalctl_printed_them() -> None:
    entry = {
        "_PID": "7",
        "MESSAGE": 'he said "hi" \\ é\u2028' + "z" * 5000,
        "__CURSOR": "s=1;i=2",
        "__REALTIME_TIMESTAMP": "1700000000000000",
    }
    for text in (json.dumps(entry, ensure_ascii=False), json.dumps(entry, separators=(" , ", " : "))):
        data = (text + "\n").encode()
        splitter = BoundedLines(1000, tail=200)
        (line,) = [x for i in range(0, len(data), 333) for x in splitter.feed(data[i : i + 333])]
        assert type(line) is CutLine and line.size == len(data) - 1 and len(line) == 1000
        cut = cut_entry(bytes(line), line.tail, line.size, 1000)
        assert cut is not None
        assert cut["__CURSOR"] == "s=1;i=2" and cut["_PID"] == "7"
        assert cut["MESSAGE"].startswith('he said "hi" \\ é\u2028zzz')
        assert cut["MESSAGE"].endswith(
            f"[k26-console: journal entry cut at 1,000 of its {line.size:,} bytes]"
        )
    # no cursor before the cut nor after it: no entry a follower could resume after
    assert cut_entry(b'{"MESSAGE":"' + b"x" * 100, b"x" * 50, 10_000, 100) is None


@pytest.mark.parametrize("realtime", ["253402300800000000", "-1000000", "99999999999999999999"])
def test_a_journal_time_no_clock_shows_is_refused(realtime: str) -> None:
    """Year 10000 made the console's clock text raise (ValueError); a negative time was drawn."""
    entry = {"__CURSOR": "c", "__REALTIME_TIMESTAMP": realtime, "_PID": "7", "MESSAGE": "hello"}
    (event,) = parse_lines([json.dumps(entry)])
    assert event.realtime_us is None and event.ts is None
    assert clock_text(event) == "--:--:--"
    ok = {**entry, "__REALTIME_TIMESTAMP": "1700000000000000"}
    (event,) = parse_lines([json.dumps(ok)])
    assert event.realtime_us == 1_700_000_000_000_000 and clock_text(event) == "22:13:20"


def _line(pid: int, rank: str | None, msg: str) -> str:
    tag = f" {rank}" if rank else ""
    return f"May 30 22:00:00 gpu1 python[{pid}]: [2026-05-30 22:00:00{tag}] {msg}"


STARTUP = [
    "May 30 22:00:00 gpu1 systemd[1]: Starting sglang.service - SGLang...",
    _line(100, None, "server_args=ServerArgs(model_path='m', tp_size=1, mem_fraction_static=0.85)"),
    _line(101, "TP0", "Load weight begin. avail mem=85.40 GB"),
    _line(
        101, "TP0", "Load weight end. type=X, dtype=torch.bfloat16, avail mem=19.50 GB, mem usage=65.90 GB."
    ),
    _line(101, "TP0", "KV Cache is allocated. #tokens: 192406, KV size: 6.62 GB"),
    _line(
        101,
        "TP0",
        "max_total_num_tokens=192406, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        "max_running_requests=8, context_len=200000, available_gpu_mem=4.20 GB",
    ),
    _line(100, None, "The server is fired up and ready to roll!"),
]


@pytest.mark.parametrize(
    "helper",
    [
        [
            _line(
                999,
                "TP0",
                "Prefill batch, #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0",
            )
        ],
        [_line(999, None, "The server is fired up and ready to roll!")],
        [
            _line(999, None, "The server is fired up and ready to roll!"),
            _line(
                999,
                "TP0",
                "Decode batch, #running-req: 1, #token: 10, token usage: 0.00, gen throughput (token/s): 1.00, #queue-req: 0",
            ),
        ],
    ],
)
def test_lines_of_another_process_of_the_unit_keep_the_boot_as_it_was(helper: list[str]) -> None:
    (boot,) = fold_boots(parse_text("\n".join([*STARTUP, *helper])))
    assert boot.ready and boot.pool.tokens == 192_406 and 999 not in boot.seen_pids
    # a real restart (its ranks' startup lines from new PIDs) still opens the next boot
    restart = [_line(200, "TP0", "Load weight begin. avail mem=85.40 GB")]
    first, second = fold_boots(parse_text("\n".join([*STARTUP, *helper, *restart])))
    assert first.ready and second.opened_by == "pid" and second.phase == "loading"


def test_verify_says_ready_when_an_exec_start_post_shell_printed_after_ready(tmp_path: Path) -> None:
    """The twin's unit under its systemd, with an ExecStartPost= that echoes a rank-tagged line once the
    server is up: before, `verify` read the shell's PID as TP0's restart and said "not ready"."""
    with started_twin(tmp_path / "twin", time_scale=0.002) as twin:
        dropins = twin.layout.unit_dir / f"{twin.unit}.d"
        dropins.mkdir(parents=True, exist_ok=True)
        echo = "[2026-05-30 22:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00"
        (dropins / "60-post.conf").write_text(
            f"[Service]\nExecStartPost=/bin/sh -c 'sleep 0.3; echo \"{echo}\"'\n"
        )
        twin.systemctl("daemon-reload")
        twin.systemctl("restart", twin.unit)

        def echoed() -> bool:
            journal = subprocess.run(
                [
                    str(twin.layout.bin_dir / "journalctl"),
                    "-u",
                    twin.unit,
                    "-o",
                    "cat",
                    "--no-pager",
                    "-n",
                    "50",
                ],
                capture_output=True,
                text=True,
                timeout=30,
            )
            return "22:00:00 TP0] Prefill batch" in journal.stdout

        assert wait_until(echoed, 30), "the ExecStartPost= line did not reach the journal"
        res = run_cli(
            tmp_path,
            "verify",
            twin.name,
            "--target-context",
            "50000",
            "--hosts",
            str(twin.hosts_toml),
            "--json",
        )
        verdict = json.loads(res.stdout)
        assert verdict["ready"] is True and verdict["phase"] == "ready", res.stdout
        assert res.returncode == 0, res.stderr


def test_an_apply_reads_past_a_native_entry_over_the_ssh_window(tmp_path: Path) -> None:
    """An ExecStartPre= that logs a 3 MiB native entry (as `logger --journald` does) during the restart: before,
    the apply's follower restarted from the entry before it until the phase's deadline ("stuck in loading
    weights", FAILED, while the server was ready seconds later); the run outlived 240 s."""
    with started_twin(tmp_path / "twin", time_scale=0.002) as twin:
        if twin.cfg is None or twin.cfg.systemd != "real":
            # under the simulated manager `logger --journald` writes to this machine's journald, not the twin's
            pytest.skip("a native entry needs the twin's real systemd and journald (root, namespaces)")
        fields = tmp_path / "big.fields"
        fields.write_text("MESSAGE=" + "x" * BIG + "\nSYSLOG_IDENTIFIER=prestart\n")
        dropins = twin.layout.unit_dir / f"{twin.unit}.d"
        dropins.mkdir(parents=True, exist_ok=True)
        sender = Path(__file__).parent / "support" / "journal_native.py"
        (dropins / "60-big.conf").write_text(f"[Service]\nExecStartPre={sys.executable} {sender} {fields}\n")
        twin.systemctl("daemon-reload")
        res = run_cli(
            tmp_path,
            "apply",
            twin.name,
            "ctx-200k",
            "--yes",
            "--json",
            "--hosts",
            str(twin.hosts_toml),
            timeout=90,
        )
        outcome = json.loads(res.stdout.strip().split("\n")[-1])
        assert outcome["type"] == "outcome" and outcome["outcome"] == "verified", res.stdout[-2000:]
        assert res.returncode == 0, res.stderr
        journal = subprocess.run(
            [str(twin.layout.bin_dir / "journalctl"), "-u", twin.unit, "-o", "json", "--all", "--no-pager"],
            capture_output=True,
            timeout=60,
        )
        assert max(len(line) for line in journal.stdout.split(b"\n")) > BIG  # the entry was there, whole
