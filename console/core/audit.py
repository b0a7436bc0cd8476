"""The audit trail: what was done to a host, by whom, with what outcome and phase timings. One JSON line
per entry in the host's `audit.jsonl` (an intent before a change, its outcome after, paired by `op_id`),
read back tolerantly, and rendered as the one line the feed and `k26-console audit` show.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from console.core.events import Audit, AuditAction, AuditOutcome
from console.core.hosttime import FROM_HOST, MAX_PID, Count, HostTime, Span
from console.core.pairing import Identity, PairingView, fmt_span

__all__ = [
    "AUDIT_LINE_MAX_BYTES",
    "RESTART_PHASES",
    "AuditAction",
    "AuditEntry",
    "AuditLog",
    "AuditOutcome",
    "AuditRecord",
    "AuditStatus",
    "OutcomeLike",
    "pair_audit",
    "parse_audit",
    "parse_audit_line",
    "restart_seconds",
]

AUDIT_LINE_MAX_BYTES = 3800
"""An audit line is appended by one `printf >>` (O_APPEND). A shell's printf writes a line this short in
one write(2), and Linux never interleaves two O_APPEND writes to a regular file; a longer line can be
split by the shell's output buffer (strace: bash's printf splits an 8,000-byte line in two, dash's one over
8 KiB), so entries are trimmed to fit."""

RESTART_PHASES: tuple[str, ...] = (
    "restart",
    "stopping",
    "launching",
    "loading_weights",
    "kv_pool",
    "cuda_graphs",
)
"""The phases (names of `console.core.restart.Phase`) that make up "the restart" an operator waits for:
from `systemctl restart` until the server is ready."""


class OutcomeLike(Protocol):
    """What `console.sources.service.ApplyOutcome` carries; an audit entry is made from any such result."""

    @property
    def ok(self) -> bool: ...
    @property
    def profile(self) -> str | None: ...
    @property
    def summary(self) -> str: ...
    @property
    def pool_tokens(self) -> int | None: ...
    @property
    def durations(self) -> Mapping[str, float]: ...
    @property
    def total_s(self) -> float | None: ...
    @property
    def diff(self) -> list[str]: ...
    @property
    def rolled_back(self) -> bool: ...


def restart_seconds(durations: Mapping[str, float]) -> float | None:
    """How long the restart itself took (systemctl restart → ready), from the phase durations."""
    spans = [float(durations[p]) for p in RESTART_PHASES if p in durations]
    return sum(spans) if spans else None


class AuditEntry(BaseModel, defer_build=True):
    """One line of `audit.jsonl`: who did what to the host, when, and how it ended.

    A change is written twice: its intent (`outcome="started"`, `phase="started"`) before the host is
    touched, then its outcome with the same `op_id`. A console killed in between leaves the intent alone,
    and readers (`pair_audit`) show it as unfinished once its writer no longer holds the lock. A signal
    the console can catch ends it with `outcome="interrupted"` and the `phase` it was in.

    Extending: every field after `outcome` is optional with a default, and readers ignore fields they do
    not know, so a later console adds one (a host-side rollback timer's deadline, say) to the intent or
    the outcome without breaking an older reader, which still pairs the two by `op_id`."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    # extra="ignore": a newer console may add fields; an older one must still read the trail.

    ts: HostTime
    user: str
    jump_host: str | None = None
    console_id: str | None = None
    host: str
    action: AuditAction
    profile: str | None = None
    diff: list[str] = Field(default_factory=list)
    """The flag diff lines, as `console.core.profiles` renders them ("- --mem-fraction-static 0.85")."""
    outcome: AuditOutcome
    summary: str = ""
    durations: dict[str, Span] = Field(default_factory=dict)
    """Seconds per phase (`console.core.restart.Phase` names)."""
    total_s: Span | None = None
    pool_tokens: Count | None = None
    op_id: str | None = None
    """Pairs an intent (`started`) with its outcome; None on entries written by single-line consoles."""
    phase: str | None = None
    """`started` on an intent; on an `interrupted` outcome the restart phase it was stopped in."""
    pid: int | None = Field(default=None, ge=0, le=MAX_PID)
    """The writing console's process."""
    lock_id: str | None = None
    """The lock the writer held: while that lock is on the host with a live holder, its intent is in
    progress, not unfinished."""
    signal: str | None = None
    """The signal that interrupted the operation ("SIGTERM")."""
    forced: str | None = None
    """Why the operator had to force the change with --yes ("the planner refused it"); None when
    nothing was forced."""

    @property
    def who(self) -> str:
        return f"{self.user}@{self.jump_host}" if self.jump_host else self.user

    @classmethod
    def by(cls, me: Identity, **fields: object) -> AuditEntry:
        return cls.model_validate(
            {"user": me.user, "jump_host": me.jump_host, "console_id": me.console_id, **fields}
        )

    @classmethod
    def from_outcome(
        cls,
        outcome: OutcomeLike,
        *,
        me: Identity,
        host: str,
        ts: datetime,
        action: AuditAction = "apply",
        started: AuditEntry | None = None,
    ) -> AuditEntry:
        """The entry for an apply / rollback / restart result of the service controller (the outcome of
        the intent `started`, when one was written)."""
        verdict: AuditOutcome = "ok" if outcome.ok else ("rolled_back" if outcome.rolled_back else "failed")
        if not outcome.ok and getattr(outcome, "outcome", None) == "refused":
            verdict = "refused"  # stopped before anything changed (validation, the planner)
        return cls.by(
            me,
            ts=ts,
            host=host,
            action=action,
            profile=outcome.profile,
            diff=list(outcome.diff),
            outcome=verdict,
            summary=outcome.summary,
            durations={str(k): float(v) for k, v in outcome.durations.items()},
            total_s=outcome.total_s,
            pool_tokens=outcome.pool_tokens,
            **_follows(started),
        )

    @classmethod
    def intent(
        cls,
        me: Identity,
        *,
        ts: datetime,
        host: str,
        action: AuditAction,
        op_id: str,
        profile: str | None = None,
        diff: list[str] | None = None,
        lock_id: str | None = None,
        summary: str = "",
        **more: object,
    ) -> AuditEntry:
        """What is about to be done, written before the host is touched. `more` carries fields a later
        console adds (none are needed to pair the intent with its outcome)."""
        return cls.by(
            me,
            ts=ts,
            host=host,
            action=action,
            profile=profile,
            diff=list(diff or []),
            outcome="started",
            phase="started",
            op_id=op_id,
            pid=me.pid,
            lock_id=lock_id,
            summary=summary,
            **more,
        )

    def interrupted(
        self, *, ts: datetime, phase: str | None, signal: str | None = None, summary: str = ""
    ) -> AuditEntry:
        """The outcome of this intent when the operation was stopped in `phase` (by `signal`)."""
        where = f" in {phase}" if phase else ""
        by = f" by {signal}" if signal else ""
        return self.model_copy(
            update={
                "ts": ts,
                "outcome": "interrupted",
                "phase": phase,
                "signal": signal,
                "summary": summary or f"interrupted{by}{where}",
            }
        )

    # ---- words -------------------------------------------------------------------------------------

    def restart_s(self) -> float | None:
        return restart_seconds(self.durations)

    def line(self) -> str:
        """The feed line: 'alice applied ctx-200k; restart 5m12s; verified 218,484 tokens'."""
        profile = self.profile or "the service"
        head = {
            "apply": f"{self.user} applied {profile}",
            "restart": f"{self.user} restarted {self.profile or 'the server'}",
            "rollback": f"{self.user} rolled back to {profile}"
            if self.profile
            else f"{self.user} rolled back",
            "probe": f"{self.user} probed {self.profile}" if self.profile else f"{self.user} ran a probe",
            "lock_break": f"{self.user} {self.summary}"
            if self.summary.startswith("broke ")
            else f"{self.user} broke the lock",
            "confirm": f"{self.user} confirmed {profile} ahead of the host-side rollback",
        }[self.action]
        if self.phase == "commit-confirmed":
            # Written by the host itself when a commit-confirmed apply went unconfirmed.
            return f"the host rolled itself back from {profile}: not confirmed in time"
        if self.outcome == "started":
            head = {
                "apply": f"{self.user} started applying {profile}",
                "restart": f"{self.user} started restarting {self.profile or 'the server'}",
                "rollback": f"{self.user} started a rollback",
                "probe": f"{self.user} started a probe",
                "lock_break": f"{self.user} started breaking the lock",
                "confirm": f"{self.user} started confirming {profile}",
            }[self.action]
        parts = [head]
        if self.outcome not in ("ok", "started"):
            parts[0] += {
                "failed": ": FAILED",
                "rolled_back": ": FAILED, rolled back",
                "refused": ": refused",
                "aborted": ": aborted",
                "interrupted": ": INTERRUPTED",
            }[self.outcome]
        restart = self.restart_s()
        if restart is not None:
            parts.append(f"restart {fmt_span(restart)}")
        elif self.total_s and self.action != "lock_break":
            parts.append(f"took {fmt_span(self.total_s)}")
        if self.pool_tokens is not None:
            word = "verified" if self.outcome == "ok" else "pool"
            parts.append(f"{word} {self.pool_tokens:,} tokens")
        if self.summary and (
            self.outcome not in ("ok", "started")
            or self.action == "probe"
            or (self.action == "lock_break" and not self.summary.startswith("broke "))
        ):
            parts.append(self.summary)
        return "; ".join(parts)

    def trail_line(self) -> str:
        """The `k26-console audit` line: when, who, what, how it ended, how long each phase took."""
        when = self.ts.astimezone().strftime("%Y-%m-%d %H:%M:%S")
        cols = [when, self.who, self.action, self.profile or "-", self.outcome]
        tail = [self.line()]
        if self.durations:
            tail.append("phases " + ", ".join(f"{name} {fmt_span(s)}" for name, s in self.durations.items()))
        if self.total_s is not None:
            tail.append(f"total {fmt_span(self.total_s)}")
        return "  ".join(cols) + "  " + " | ".join(tail)

    def to_event(self) -> Audit:
        line = self.line()
        return Audit(
            ts=self.ts.isoformat(),
            host=self.host,
            raw=line,
            message=line,
            action=self.action,
            user=self.user,
            jump_host=self.jump_host,
            console_id=self.console_id,
            profile=self.profile,
            diff=list(self.diff),
            outcome=self.outcome,
            summary=self.summary,
            durations=dict(self.durations),
            total_s=self.total_s,
            pool_tokens=self.pool_tokens,
        )

    def to_jsonl(self) -> str:
        """One JSON line (no newline) of at most `AUDIT_LINE_MAX_BYTES`: a long diff or summary is trimmed
        (and says so) rather than risk a split write that another console's append could land inside."""
        entry = self
        text = entry.model_dump_json()
        if len(text.encode()) <= AUDIT_LINE_MAX_BYTES:
            return text
        diff = list(entry.diff)
        while diff and len(text.encode()) > AUDIT_LINE_MAX_BYTES:
            diff = diff[:-2]
            shown = [*diff, f"... {len(self.diff) - len(diff)} more diff line(s) not recorded"]
            entry = self.model_copy(update={"diff": shown})
            text = entry.model_dump_json()
        if len(text.encode()) > AUDIT_LINE_MAX_BYTES:
            over = len(text.encode()) - AUDIT_LINE_MAX_BYTES
            summary = entry.summary.encode()[: max(0, len(entry.summary.encode()) - over - 16)]
            entry = entry.model_copy(update={"summary": summary.decode(errors="ignore") + " [trimmed]"})
            text = entry.model_dump_json()
        if len(text.encode()) > AUDIT_LINE_MAX_BYTES:
            raise ValueError("an audit entry does not fit on one line even without its diff and summary")
        return text


def _follows(started: AuditEntry | None) -> dict[str, object]:
    """The fields an outcome copies from its intent so that readers pair them."""
    if started is None:
        return {}
    return {"op_id": started.op_id, "lock_id": started.lock_id, "pid": started.pid}


AuditStatus = Literal["finished", "in_progress", "unfinished"]


class AuditRecord(AuditEntry):
    """One operation as a reader shows it: the outcome entry, or the intent when no outcome was written.

    `status`: `finished` (an outcome was written, `interrupted` included), `in_progress` (an intent
    whose writer still holds its lock), `unfinished` (an intent whose writer is gone: killed, or its
    machine lost, before it could say how the change ended)."""

    status: AuditStatus = "finished"
    started_at: datetime | None = None
    """When the intent was written (None for entries that had none)."""
    note: str = ""

    def line(self) -> str:
        base = super().line()
        return f"{base}; {self.note}" if self.note else base


def pair_audit(entries: Iterable[AuditEntry], view: PairingView | None = None) -> list[AuditRecord]:
    """The trail as operations, newest last: each intent paired with its outcome (shown where the
    outcome is), an intent without one shown where it was written, as in progress or unfinished.

    `view` is the host's presence and lock now; without it an intent without an outcome is unfinished
    (nothing says its writer is still at work)."""
    rows: list[AuditRecord | None] = []
    pending: dict[str, int] = {}
    for entry in entries:
        data = entry.model_dump()
        if entry.outcome == "started" and entry.op_id:
            pending[entry.op_id] = len(rows)
            rows.append(AuditRecord.model_validate(data))
            continue
        started_at = None
        if entry.op_id and entry.op_id in pending:
            index = pending.pop(entry.op_id)
            intent = rows[index]
            rows[index] = None
            started_at = intent.ts if intent is not None else None
        rows.append(AuditRecord.model_validate({**data, "started_at": started_at}))
    for op_id, index in pending.items():
        intent = rows[index]
        assert intent is not None and intent.op_id == op_id
        rows[index] = _unfinished(intent, view)
    return [r for r in rows if r is not None]


def _unfinished(intent: AuditRecord, view: PairingView | None) -> AuditRecord:
    lock = view.lock if view is not None else None
    holds = lock is not None and intent.lock_id is not None and lock.lock_id == intent.lock_id
    if holds and view is not None and not view.lock_stale:
        return intent.model_copy(
            update={
                "status": "in_progress",
                "started_at": intent.ts,
                "note": "in progress (its console holds the lock)",
            }
        )
    if holds:
        why = "its console stopped without recording an outcome, and its stale lock is still there"
    else:
        why = "no outcome was recorded and its console no longer holds the lock"
    return intent.model_copy(
        update={
            "status": "unfinished",
            "started_at": intent.ts,
            "note": f"UNFINISHED, interrupted: {why}; the host may run the old or the new flags",
        }
    )


class AuditLog(BaseModel, defer_build=True):
    """The trail as read: the entries in file order (oldest first) and how many lines were unreadable."""

    entries: list[AuditEntry] = Field(default_factory=list)
    skipped: int = 0
    lines: int = 0
    """Lines read, readable or not: a follower resumes after this many."""


def parse_audit_line(line: str) -> AuditEntry | None:
    """One line of `audit.jsonl`, or None for a torn or foreign line (never an exception)."""
    line = line.strip()
    if not line:
        return None
    try:
        data = json.loads(line)
        if not isinstance(data, dict):
            return None
        return AuditEntry.model_validate(data, context=FROM_HOST)
    except (ValueError, ValidationError, RecursionError):
        # RecursionError: json.loads recurses per nested array, so a line of a few thousand `[` raised
        # it out of a reader that promises never to.
        return None


def parse_audit(lines: Iterable[str]) -> AuditLog:
    entries: list[AuditEntry] = []
    skipped = count = 0
    for line in lines:
        count += 1
        entry = parse_audit_line(line)
        if entry is not None:
            entries.append(entry)
        elif line.strip():
            skipped += 1
    return AuditLog(entries=entries, skipped=skipped, lines=count)
