"""The audit trail read back whole (issue 20, items 3 and 4): an intent paired with its outcome, an intent
without one shown as in progress or unfinished, lines holding U+2028 / U+0085 read as the valid JSON they
are, and nothing from the host reaching the terminal as an escape sequence.

The readers run against a twin over SSH (no service: only its state directory is used); the pairing rule
itself is also checked on its own, with the lock and heartbeats a reader would see.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from console.core.audit import AuditEntry, pair_audit
from console.core.pairing import Identity, LockInfo, PairingView, Presence
from console.sources.hosts import load_hosts
from console.sources.hoststate import HostStateDir
from console.sources.transport import Transport
from console.twin.host import TwinHost
from tests.support.cli import CLI, REPO
from tests.support.twins import module_twin

T0 = datetime(2026, 6, 1, 9, 0, 0, tzinfo=UTC)
ALICE = Identity(user="alice", jump_host="jump1", pid=4242, console_id="alice1")
BOB = Identity(user="bob", jump_host="jump2", pid=5151, console_id="bob2")


def _intent(who: Identity, minutes: int, op: str, profile: str, lock_id: str = "L1") -> AuditEntry:
    return AuditEntry.intent(
        who,
        ts=T0 + timedelta(minutes=minutes),
        host="twin",
        action="apply",
        op_id=op,
        profile=profile,
        diff=["~ --mem-fraction-static 0.85 → 0.9"],
        lock_id=lock_id,
    )


def _outcome(intent: AuditEntry, minutes: int, outcome: str = "ok") -> AuditEntry:
    return intent.model_copy(
        update={"ts": T0 + timedelta(minutes=minutes), "outcome": outcome, "phase": None, "summary": "done"}
    )


def _view(lock_id: str | None, holder_alive: bool) -> PairingView:
    now = T0 + timedelta(hours=1)
    presence = []
    if holder_alive:
        presence.append(Presence(**ALICE.model_dump(), since=now, heartbeat=now))
    lock = (
        LockInfo(holder=ALICE, intent="apply b", taken_at=now, lock_id=lock_id)
        if lock_id is not None
        else None
    )
    return PairingView(host="twin", now=now, presence=presence, lock=lock, lock_stale=not holder_alive)


# ---- the pairing rule ---------------------------------------------------------------------------------


def test_an_intent_and_its_outcome_are_one_change() -> None:
    a = _intent(ALICE, 0, "op-a", "ctx-a")
    records = pair_audit([a, _outcome(a, 5)])
    assert len(records) == 1
    (r,) = records
    assert (
        r.status == "finished"
        and r.outcome == "ok"
        and r.started_at == a.ts
        and r.ts == a.ts + timedelta(minutes=5)
    )


@pytest.mark.parametrize(
    ("view", "status", "words"),
    [
        (None, "unfinished", "UNFINISHED, interrupted: no outcome was recorded"),
        (_view(None, holder_alive=False), "unfinished", "no longer holds the lock"),
        (_view("L2", holder_alive=True), "unfinished", "no longer holds the lock"),  # a newer lock
        (_view("L1", holder_alive=False), "unfinished", "its stale lock is still there"),
        (_view("L1", holder_alive=True), "in_progress", "in progress"),
    ],
)
def test_an_intent_without_an_outcome(view: PairingView | None, status: str, words: str) -> None:
    a = _intent(ALICE, 0, "op-a", "ctx-a")
    b = _intent(ALICE, 10, "op-b", "ctx-b", lock_id="L1")
    records = pair_audit([a, _outcome(a, 5), b], view)
    assert [r.status for r in records] == ["finished", status]
    assert words in records[-1].note and words in records[-1].line()
    assert records[-1].line().startswith("alice started applying ctx-b")


def test_an_unfinished_apply_keeps_its_place_before_a_later_break() -> None:
    """A killed apply's intent, then the break of its lock, then the next apply: three changes in the
    order they began."""
    killed = _intent(ALICE, 0, "op-k", "killed")
    brk = AuditEntry.by(BOB, ts=T0 + timedelta(minutes=3), host="twin", action="lock_break", outcome="ok")
    nxt = _intent(BOB, 4, "op-n", "next", lock_id="L9")
    records = pair_audit([killed, brk, nxt, _outcome(nxt, 9)])
    assert [(r.action, r.profile, r.status) for r in records] == [
        ("apply", "killed", "unfinished"),
        ("lock_break", None, "finished"),
        ("apply", "next", "finished"),
    ]


def test_an_interrupted_outcome_names_the_signal_and_the_phase() -> None:
    a = _intent(ALICE, 0, "op-a", "ctx-a")
    stop = a.interrupted(ts=T0 + timedelta(minutes=2), phase="launching", signal="SIGTERM")
    (r,) = pair_audit([a, stop])
    assert r.status == "finished" and r.outcome == "interrupted" and r.phase == "launching"
    assert "INTERRUPTED" in r.line() and "SIGTERM" in r.line() and "launching" in r.line()


def test_a_field_from_a_newer_console_does_not_break_pairing() -> None:
    """A later console adds fields (a host-side rollback timer, say) to the intent: this one still pairs."""
    a = _intent(ALICE, 0, "op-a", "ctx-a")
    newer = json.loads(a.to_jsonl()) | {"rollback_timer": {"deadline": "2026-06-01T09:05:00Z", "unit": "x"}}
    read = AuditEntry.model_validate(newer)
    records = pair_audit([read, _outcome(a, 5)])
    assert [r.status for r in records] == ["finished"]


# ---- over SSH ------------------------------------------------------------------------------------------


twin = module_twin("audit-pair-twin", start_service=False)


def _hosts(twin: TwinHost, tmp: Path, state_dir: str) -> Path:
    """A hosts file for the twin with a state directory of the test's own."""
    path = tmp / "hosts.toml"
    path.write_text(twin.hosts_toml.read_text() + f'state_dir = "{state_dir}"\n')
    return path


def _seed(twin: TwinHost, hosts: Path, entries: list[AuditEntry]) -> None:
    async def seed() -> None:
        config = load_hosts(hosts).hosts[twin.name]
        async with Transport(config, ssh_config=[]) as t:
            state = HostStateDir(t, config, ALICE)
            for entry in entries:
                await state.audit.append(entry)

    asyncio.run(seed())


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=REPO, timeout=60)


def test_line_separators_inside_values_hide_no_entry(twin: TwinHost, tmp_path: Path) -> None:
    """U+2028 and U+0085 in a profile name and a summary: valid JSON, one line each on disk; every
    entry reads back and none is counted unreadable (the old reader split them with str.splitlines)."""
    hosts = _hosts(twin, tmp_path, "~/.k26-console-separators")
    entries = [
        AuditEntry.by(ALICE, ts=T0, host="twin", action="apply", profile="ctx\u2028200k", outcome="ok"),
        AuditEntry.by(
            ALICE,
            ts=T0 + timedelta(minutes=1),
            host="twin",
            action="probe",
            outcome="ok",
            summary="a\x85b\x1cc",
        ),
        AuditEntry.by(BOB, ts=T0 + timedelta(minutes=2), host="twin", action="restart", outcome="ok"),
    ]
    _seed(twin, hosts, entries)
    on_disk = (twin.layout.home_dir / ".k26-console-separators" / "audit.jsonl").read_bytes().split(b"\n")
    assert len([line for line in on_disk if line]) == 3 and all(json.loads(line) for line in on_disk if line)

    res = _cli("audit", "twin", "--hosts", str(hosts), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["skipped"] == 0 and data["total"] == 3, data
    assert [AuditEntry.model_validate(e) for e in data["trail"]] == entries
    text = _cli("audit", "twin", "--hosts", str(hosts))
    assert text.returncode == 0 and text.stderr == "", text.stderr
    # The header, three rows and the final newline: the separators are drawn, they split no row.
    assert len(text.stdout.split("\n")) == 5
    assert "\u2028" not in text.stdout and "\x85" not in text.stdout


HOSTILE_USER = "mallory\x1b]0;owned\x07"
HOSTILE_PROFILE = "ctx\x1b[2J\x1b[H-200k"
HOSTILE_DIFF = ["~ --mem-fraction-static 0.85 → 0.9\x1b[8m", "+ --served-model-name \x9b31mred\r"]


def test_hostile_strings_reach_the_terminal_as_pictures(twin: TwinHost, tmp_path: Path) -> None:
    hosts = _hosts(twin, tmp_path, "~/.k26-console-hostile")
    who = Identity(user=HOSTILE_USER, jump_host="jump\x1bP", pid=7, console_id="mallory7")
    intent = AuditEntry.intent(
        who, ts=T0, host="twin", action="apply", op_id="op-h", profile=HOSTILE_PROFILE, diff=HOSTILE_DIFF
    )
    done = AuditEntry.by(
        who,
        ts=T0 + timedelta(minutes=1),
        host="twin",
        action="apply",
        profile=HOSTILE_PROFILE,
        diff=HOSTILE_DIFF,
        outcome="failed",
        summary="boom\x1b[31m",
    )
    _seed(twin, hosts, [done, intent])
    res = _cli("audit", "twin", "--hosts", str(hosts))
    assert res.returncode == 0, res.stderr
    for raw in ("\x1b", "\x07", "\x9b", "\r"):
        assert raw not in res.stdout, (raw, res.stdout)
    assert "mallory␛]0;owned␇" in res.stdout and "ctx␛[2J␛[H-200k" in res.stdout
    # the unfinished intent's diff is printed under it (what may be half-applied), made safe too
    assert "    + --served-model-name \ufffd31mred␍" in res.stdout
    js = _cli("audit", "twin", "--hosts", str(hosts), "--json")
    assert js.returncode == 0
    for raw in ("\x1b", "\x07", "\x9b", "\r"):
        assert raw not in js.stdout
    data = json.loads(js.stdout)
    assert data["trail"][1]["diff"] == HOSTILE_DIFF and data["trail"][1]["user"] == HOSTILE_USER


def test_audit_shows_an_unfinished_apply(twin: TwinHost, tmp_path: Path) -> None:
    """An intent whose console left no outcome and holds no lock: `audit` says UNFINISHED, --json says
    status unfinished and counts it."""
    hosts = _hosts(twin, tmp_path, "~/.k26-console-unfinished")
    a = _intent(ALICE, 0, "op-a", "ctx-a")
    b = _intent(ALICE, 10, "op-b", "ctx-b", lock_id="gone")
    _seed(twin, hosts, [a, _outcome(a, 5), b])
    res = _cli("audit", "twin", "--hosts", str(hosts))
    assert res.returncode == 0, res.stderr
    header, *body = res.stdout.rstrip("\n").split("\n")
    assert header.split()[:2] == ["when", "who"], header
    lines = [line for line in body if not line.startswith(" ")]
    assert len(lines) == 2, body  # two changes; each one's diff under it
    assert "alice applied ctx-a" in lines[0]
    assert "started" in lines[1] and "UNFINISHED, interrupted" in lines[1] and "ctx-b" in lines[1]
    assert body[-1].strip() == "~ --mem-fraction-static 0.85 → 0.9"  # the unfinished one's, last
    data = json.loads(_cli("audit", "twin", "--hosts", str(hosts), "--json").stdout)
    assert data["total"] == 2 and data["unfinished"] == 1 and len(data["trail"]) == 3
    assert [e["status"] for e in data["entries"]] == ["finished", "unfinished"]
