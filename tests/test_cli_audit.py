"""`k26-console audit HOST` against a twin over SSH: the trail, newest last, as lines and as JSON."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from console.core.audit import AuditEntry
from console.core.pairing import Identity
from console.sources.hosts import load_hosts
from console.sources.hoststate import HostStateDir
from console.sources.transport import Transport
from console.twin.host import TwinHost
from tests.support.cli import CLI, REPO
from tests.support.sshd import free_port

T0 = datetime(2026, 5, 30, 12, 0, 0, tzinfo=UTC)
ALICE = Identity(user="alice", jump_host="jump1", pid=4242, console_id="alice1")
BOB = Identity(user="bob", jump_host="jump2", pid=5151, console_id="bob2")

ENTRIES = [
    AuditEntry.by(
        ALICE,
        ts=T0,
        host="twin",
        action="apply",
        profile="ctx-200k",
        outcome="ok",
        diff=["- --mem-fraction-static 0.85", "+ --mem-fraction-static 0.94"],
        summary="ok: the pool holds 218,484 tokens",
        durations={"restart": 2.0, "stopping": 8.0, "loading_weights": 272.0, "kv_pool": 30.0},
        total_s=318.0,
        pool_tokens=218_484,
    ),
    AuditEntry.by(
        BOB,
        ts=T0 + timedelta(minutes=9),
        host="twin",
        action="apply",
        profile="ctx-256k",
        outcome="rolled_back",
        summary="CUDA out of memory in the KV pool",
        durations={"restart": 1.0, "loading_weights": 200.0},
        total_s=230.0,
    ),
    AuditEntry.by(
        BOB,
        ts=T0 + timedelta(minutes=20),
        host="twin",
        action="lock_break",
        outcome="ok",
        summary="broke alice@jump1's lock (apply ctx-200k, pid 4242, taken 12:19:00)",
    ),
]


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwinHost]:
    host = TwinHost(tmp_path_factory.mktemp("audit-twin") / "state", start_service=False)
    host.start_sync()
    try:

        async def seed() -> None:
            config = load_hosts(host.hosts_toml).hosts[host.name]
            async with Transport(config, ssh_config=[]) as t:
                state = HostStateDir(t, config, ALICE)
                for entry in ENTRIES:
                    await state.audit.append(entry)

        asyncio.run(seed())
        # a torn line in the middle, as a console killed mid-write would leave
        trail = host.layout.home_dir / ".k26-console" / "audit.jsonl"
        lines = trail.read_text().splitlines()
        trail.write_text("\n".join([lines[0], lines[1][:30], *lines[1:]]) + "\n")
        yield host
    finally:
        host.stop_sync()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=REPO, timeout=60)


def test_audit_prints_one_line_per_entry_newest_last(twin: TwinHost) -> None:
    res = _cli("audit", "twin", "--hosts", str(twin.hosts_toml))
    assert res.returncode == 0, res.stderr
    header, *body = res.stdout.splitlines()
    assert re.split(r" {2,}", header) == ["when", "who", "action", "profile", "outcome", "what"]
    # Each change's flag diff follows its row, in the last column (issue 18 point 8: text showed none).
    detail = [line.strip() for line in body if line.startswith(" ")]
    assert detail == ["- --mem-fraction-static 0.85", "+ --mem-fraction-static 0.94"]
    assert all(line.index("- --mem") == header.index("what") + 2 for line in body if "- --mem" in line)
    lines = [line for line in body if not line.startswith(" ")]
    assert len(lines) == 3
    local = [e.ts.astimezone().strftime("%Y-%m-%d %H:%M:%S") for e in ENTRIES]
    cols = [re.split(r" {2,}", line, maxsplit=5) for line in lines]
    assert cols[0][:5] == [local[0], "alice@jump1", "apply", "ctx-200k", "ok"]
    assert cols[1][:5] == [local[1], "bob@jump2", "apply", "ctx-256k", "rolled_back"]
    assert cols[2][:5] == [local[2], "bob@jump2", "lock_break", "-", "ok"]
    assert cols[2][5].startswith("bob broke alice@jump1's lock")
    assert "alice applied ctx-200k; restart 5m12s; verified 218,484 tokens" in lines[0]
    assert "phases restart 2.0s, stopping 8.0s, loading_weights 4m32s, kv_pool 30s" in lines[0]
    assert "total 5m18s" in lines[0]
    assert "FAILED, rolled back" in lines[1] and "CUDA out of memory" in lines[1]
    assert res.stderr == "k26-console: skipped 1 unreadable line(s) of ~/.k26-console/audit.jsonl on twin.\n"


def test_audit_json_and_limit(twin: TwinHost) -> None:
    res = _cli("audit", "twin", "--hosts", str(twin.hosts_toml), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["host"] == "twin" and data["total"] == 3 and data["skipped"] == 1
    assert [AuditEntry.model_validate(e) for e in data["entries"]] == ENTRIES
    assert data["entries"][0]["diff"] == ["- --mem-fraction-static 0.85", "+ --mem-fraction-static 0.94"]
    last = json.loads(_cli("audit", "twin", "--hosts", str(twin.hosts_toml), "--json", "--limit", "2").stdout)
    assert [e["action"] for e in last["entries"]] == ["apply", "lock_break"] and last["total"] == 3
    one = _cli("audit", "twin", "--hosts", str(twin.hosts_toml), "--limit", "1")
    assert one.stdout.count("\n") == 2 and "lock_break" in one.stdout.splitlines()[1]  # header, one row


def test_empty_trail_says_so(twin: TwinHost, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(twin.hosts_toml.read_text() + 'state_dir = "~/.k26-console-empty"\n')
    res = _cli("audit", "twin", "--hosts", str(hosts))
    assert res.returncode == 0
    assert res.stdout == "no audit entries on twin (in ~/.k26-console-empty/audit.jsonl).\n"
    data = json.loads(_cli("audit", "twin", "--hosts", str(hosts), "--json").stdout)
    assert data["entries"] == [] and data["total"] == 0
    assert not (twin.layout.home_dir / ".k26-console-empty").exists()  # reading creates nothing


def test_unknown_or_unreachable_host_is_one_sentence_exit_2(tmp_path: Path) -> None:
    empty = tmp_path / "hosts.toml"
    empty.write_text("")
    res = _cli("audit", "no-such-host.invalid", "--hosts", str(empty))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.count("\n") == 1
    assert res.stderr.startswith(
        f"k26-console: 'no-such-host.invalid' is not a host in {empty} and does not resolve as a host name"
    )

    closed = tmp_path / "closed.toml"
    closed.write_text(f'[hosts.gone]\nssh = "127.0.0.1"\nport = {free_port("127.0.0.1")}\n')
    res = _cli("audit", "gone", "--hosts", str(closed))
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "refused the connection" in res.stderr and "Traceback" not in res.stderr

    missing = _cli("audit", "twin", "--hosts", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    bad = _cli("audit", "twin", "--limit", "zero")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
