"""The pure side of pairing: staleness, the lock sentence, audit entries and their one-line words, the
audit file's tolerance of torn lines, and the `audit` event on the feed."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from console.core.audit import AUDIT_LINE_MAX_BYTES, AuditEntry, parse_audit
from console.core.events import EVENT_KINDS, Audit, event_from_json
from console.core.pairing import (
    Identity,
    LockHeld,
    LockInfo,
    PairingView,
    Presence,
    fmt_span,
    is_stale,
    lock_sentence,
)

T0 = datetime(2026, 5, 30, 12, 1, 33, tzinfo=UTC)
ALICE = Identity(user="alice", jump_host="jump1", pid=4242, console_id="a1")
BOB = Identity(user="bob", jump_host="jump2", pid=5151, console_id="b2")


def _presence(who: Identity, heartbeat: datetime, interval_s: float = 2.0, looking_at: str = "") -> Presence:
    return Presence(
        **who.model_dump(), since=T0, heartbeat=heartbeat, interval_s=interval_s, looking_at=looking_at
    )


def test_heartbeat_is_stale_after_factor_times_its_own_interval() -> None:
    p = _presence(ALICE, T0, interval_s=2.0)
    assert not p.stale(T0 + timedelta(seconds=6.0))
    assert p.stale(T0 + timedelta(seconds=6.01))
    # judged by the writer's pace: a slow beater is not stale where a fast one would be
    slow = _presence(ALICE, T0, interval_s=10.0)
    assert not slow.stale(T0 + timedelta(seconds=25))
    assert is_stale(T0, 1.0, T0 + timedelta(seconds=5), factor=4.0)
    assert not is_stale(T0, 1.0, T0 + timedelta(seconds=3), factor=4.0)


def test_console_id_must_be_a_safe_file_name() -> None:
    for bad in ("../etc", "a b", "", "x" * 65, "a/b"):
        with pytest.raises(ValidationError):
            Identity(user="u", jump_host="j", pid=1, console_id=bad)


def test_lock_held_names_holder_intent_time_and_pid() -> None:
    local = T0.astimezone().strftime("%H:%M:%S")
    info = LockInfo(holder=ALICE, intent="apply ctx-200k", taken_at=T0, lock_id="L1")
    exc = LockHeld(info, stale=False, host="gpu1")
    assert str(exc) == f"alice@jump1 holds the lock on gpu1: apply ctx-200k, since {local} (pid 4242)"
    late = _presence(ALICE, T0)
    stale = LockHeld(info, stale=True, host="gpu1", holder=late, now=T0 + timedelta(seconds=312))
    assert str(stale).endswith(
        "(pid 4242); its console has not been heard from for 5m12s, so the lock may be broken after confirming"
    )
    gone = lock_sentence(info, "gpu1", stale=True)
    assert gone.endswith("; its console has left")


def test_view_signature_ignores_heartbeat_times_but_not_people_or_the_lock() -> None:
    a = _presence(ALICE, T0, looking_at="dashboard")
    a_later = _presence(ALICE, T0 + timedelta(seconds=2), looking_at="dashboard")
    b = _presence(BOB, T0, looking_at="restart")
    v1 = PairingView(host="gpu1", now=T0, presence=[a])
    v2 = PairingView(host="gpu1", now=T0 + timedelta(seconds=2), presence=[a_later])
    assert v1.signature() == v2.signature()
    assert PairingView(host="gpu1", now=T0, presence=[a, b]).signature() != v1.signature()
    moved = _presence(ALICE, T0, looking_at="profiles")
    assert PairingView(host="gpu1", now=T0, presence=[moved]).signature() != v1.signature()
    lock = LockInfo(holder=ALICE, intent="apply ctx-200k", taken_at=T0, lock_id="L1")
    locked = PairingView(host="gpu1", now=T0, presence=[a, b], lock=lock)
    assert locked.signature() != PairingView(host="gpu1", now=T0, presence=[a, b]).signature()
    assert [p.who for p in locked.others(ALICE)] == ["bob@jump2"]
    assert locked.lock_line().startswith("alice@jump1 holds the lock on gpu1: apply ctx-200k")
    assert PairingView(host="gpu1", now=T0).lock_line() == "gpu1 is not locked"


@dataclass
class _Outcome:
    """The shape of console.sources.service.ApplyOutcome."""

    ok: bool
    profile: str | None
    summary: str
    pool_tokens: int | None
    durations: dict[str, float]
    total_s: float | None
    diff: list[str] = field(default_factory=list)
    rolled_back: bool = False
    outcome: str = ""


PHASES = {
    "validate": 0.2,
    "write_dropin": 0.1,
    "restart": 2.0,
    "stopping": 8.0,
    "launching": 20.0,
    "loading_weights": 240.0,
    "kv_pool": 12.0,
    "cuda_graphs": 30.0,
    "verify": 1.5,
}


def test_apply_outcome_renders_as_the_feed_line() -> None:
    outcome = _Outcome(
        ok=True,
        profile="ctx-200k",
        summary="ok: the pool holds 218,484 tokens",
        pool_tokens=218_484,
        durations=PHASES,
        total_s=314.0,
        diff=["- --mem-fraction-static 0.85", "+ --mem-fraction-static 0.94"],
    )
    entry = AuditEntry.from_outcome(outcome, me=ALICE, host="gpu1", ts=T0)
    assert entry.outcome == "ok" and entry.who == "alice@jump1" and entry.console_id == "a1"
    assert entry.restart_s() == pytest.approx(312.0)
    assert entry.line() == "alice applied ctx-200k; restart 5m12s; verified 218,484 tokens"
    trail = entry.trail_line()
    assert " alice@jump1  apply  ctx-200k  ok  " in trail
    assert "loading_weights 4m00s" in trail and "total 5m14s" in trail


def test_failed_apply_that_rolled_back_says_so_with_the_reason() -> None:
    outcome = _Outcome(
        ok=False,
        profile="ctx-256k",
        summary="CUDA out of memory in the KV pool; rolled back to ctx-200k",
        pool_tokens=None,
        durations={"restart": 1.0, "stopping": 5.0, "launching": 10.0, "loading_weights": 100.0},
        total_s=130.0,
        rolled_back=True,
    )
    entry = AuditEntry.from_outcome(outcome, me=BOB, host="gpu1", ts=T0)
    assert entry.outcome == "rolled_back"
    assert entry.line() == (
        "bob applied ctx-256k: FAILED, rolled back; restart 1m56s; "
        "CUDA out of memory in the KV pool; rolled back to ctx-200k"
    )
    failed = AuditEntry.from_outcome(
        _Outcome(ok=False, profile="ctx-256k", summary="x", pool_tokens=None, durations={}, total_s=3.0),
        me=BOB,
        host="gpu1",
        ts=T0,
    )
    assert failed.outcome == "failed" and failed.line() == "bob applied ctx-256k: FAILED; took 3.0s; x"
    refused = AuditEntry.from_outcome(
        _Outcome(
            ok=False,
            profile="ctx-999k",
            summary="no flags reach 999,000 tokens on this host",
            pool_tokens=None,
            durations={},
            total_s=0.0,
            outcome="refused",
        ),
        me=BOB,
        host="gpu1",
        ts=T0,
    )
    assert refused.outcome == "refused"
    assert refused.line() == "bob applied ctx-999k: refused; no flags reach 999,000 tokens on this host"


def test_lock_break_line_names_whose_lock() -> None:
    entry = AuditEntry.by(
        BOB,
        ts=T0,
        host="gpu1",
        action="lock_break",
        outcome="ok",
        summary="broke alice@jump1's lock (apply ctx-200k, pid 4242, taken 12:01:33)",
    )
    assert entry.line() == "bob broke alice@jump1's lock (apply ctx-200k, pid 4242, taken 12:01:33)"


def test_audit_entry_is_an_event_on_the_feed() -> None:
    assert "audit" in EVENT_KINDS
    entry = AuditEntry.from_outcome(
        _Outcome(
            ok=True, profile="ctx-200k", summary="", pool_tokens=218_484, durations=PHASES, total_s=314.0
        ),
        me=ALICE,
        host="gpu1",
        ts=T0,
    )
    event = entry.to_event()
    assert isinstance(event, Audit) and event.kind == "audit"
    assert event.message == event.raw == "alice applied ctx-200k; restart 5m12s; verified 218,484 tokens"
    back = event_from_json(event.model_dump_json())
    assert back == event and back.ts == "2026-05-30T12:01:33+00:00" and back.host == "gpu1"


def test_jsonl_line_fits_one_write_even_with_a_huge_diff() -> None:
    diff = [f"+ --flag-{i} {'x' * 60}" for i in range(200)]
    entry = AuditEntry.by(
        ALICE, ts=T0, host="gpu1", action="apply", outcome="ok", profile="ctx-200k", diff=diff
    )
    line = entry.to_jsonl()
    assert "\n" not in line and len(line.encode()) <= AUDIT_LINE_MAX_BYTES
    back = AuditEntry.model_validate_json(line)
    assert back.diff[:5] == diff[:5]
    assert back.diff[-1].endswith("more diff line(s) not recorded")
    assert int(back.diff[-1].split()[1]) == len(diff) - (len(back.diff) - 1)
    huge = entry.model_copy(update={"diff": [], "summary": "é" * 5000})
    trimmed = AuditEntry.model_validate_json(huge.to_jsonl())
    assert trimmed.summary.endswith("[trimmed]") and len(huge.to_jsonl().encode()) <= AUDIT_LINE_MAX_BYTES
    small = AuditEntry.by(ALICE, ts=T0, host="gpu1", action="probe", outcome="ok")
    assert AuditEntry.model_validate_json(small.to_jsonl()) == small


def test_parse_audit_skips_torn_and_foreign_lines() -> None:
    good = [
        AuditEntry.by(ALICE, ts=T0 + timedelta(minutes=i), host="gpu1", action="restart", outcome="ok")
        for i in range(3)
    ]
    lines = [
        good[0].to_jsonl(),
        good[1].to_jsonl()[:40],  # a writer that died mid-line
        "",
        "not json at all",
        "[1, 2, 3]",
        json.dumps({"ts": "2026-05-30T12:00:00Z", "user": "x"}),  # JSON, but not an entry
        good[1].to_jsonl(),
        json.dumps({**json.loads(good[2].to_jsonl()), "from_the_future": 1}),  # newer console: kept
    ]
    log = parse_audit(lines)
    assert [e.ts for e in log.entries] == [g.ts for g in good]
    assert log.skipped == 4 and log.lines == len(lines)


def test_fmt_span() -> None:
    assert [fmt_span(s) for s in (3.04, 48, 312, 3780)] == ["3.0s", "48s", "5m12s", "1h03m"]
