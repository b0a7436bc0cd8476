"""The one protocol by which the console changes a host: apply, restart, rollback, confirm, break.

Both front ends (the command line in console/cli, the console in console/tui) run every change through
`HostChanger`, and only render its progress and its result. The sequence, whichever front end starts it:

    lock ─▶ [preview, the operator's yes] ─▶ intent ─▶ arm the host-side rollback ─▶ write the drop-in
         ─▶ reload ─▶ restart ─▶ follow the boot ─▶ verify ─▶ disarm ─▶ outcome ─▶ release

- The lock is taken first (`LockHeld` when another console holds it; a command that exits afterwards
  has its heartbeat removed then too, so a refused apply leaves nothing behind).
- The intent (`outcome="started"`) goes into the audit trail right before the host is first changed:
  no trail, no change.
- A commit-confirmed apply arms the host-side rollback before the drop-in is written (console.sources.
  confirm): from then on the host converges whenever the console stops, and the rollback's timer frees
  this console's lock when it fires.
- The outcome is paired with the intent by `op_id`; a cancellation (a signal the CLI caught, the console
  closing) writes `interrupted` with the phase it came in, and a failure after the first change writes
  `failed`; the lock goes on every exit.

Policy (how long the host waits for a confirmation, a refusal the operator forced and how, whether a
rollback may remove the console's first drop-in) is data, `ChangePolicy`, given by the front end. The
mechanics of each step are the service controller's (console.sources.service).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from console.core.apply import ApplyOutcome, ApplyPreview, ApplyProgress, judge
from console.core.audit import AuditAction, AuditEntry
from console.core.confirm import PendingRollback
from console.core.pairing import LockInfo
from console.sources.confirm import HostRollback, Settled
from console.sources.hoststate import HostStateDir, HostStateError, Lock
from console.sources.transport import TransportError
from console.sources.unit_commands import ServiceError

if TYPE_CHECKING:
    from console.core.profiles import Profile
    from console.sources.profile_store import ProfileStore
    from console.sources.service import ServiceController

__all__ = [
    "RECORD_TIMEOUT_S",
    "ChangePolicy",
    "ChangeResult",
    "ConfirmResult",
    "HostChange",
    "HostChanger",
    "NotSettled",
    "break_stale_lock",
]

RECORD_TIMEOUT_S = 20.0
"""How long an interrupted change tries to write its last audit entry before it lets go anyway."""

Progress = Callable[[ApplyProgress], None]
BeforeChange = Callable[[], Awaitable[None]]

_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class ChangePolicy:
    """What the front end decided about a change (change it with `dataclasses.replace`)."""

    confirm_within_s: float | None = None
    """Apply: arm a host-side rollback that fires unless the new boot is verified within this many
    seconds (None or 0: none is armed)."""
    rollback_on_failure: bool = False
    """Apply: a boot that does not verify is rolled back by this console at once."""
    forced: str | None = None
    """Why and how the operator went past a refusal (the planner's, or the name gate's), for the trail."""
    expect_pool: int | None = None
    """Restart and rollback: the pool the new boot must hold to verify."""
    past_first: bool = False
    """Rollback: it may remove the console's only drop-in (the unit then runs its own ExecStart)."""


@dataclass
class ChangeResult:
    """How a change ended: its outcome, and what the operator must also be told."""

    outcome: ApplyOutcome
    unrecorded: str | None = None
    """The sentence to say when the outcome could not be written to the audit trail (exit 1)."""
    lock_lost: bool = False
    """Another console (or the host's rollback) took this console's lock while the change ran."""


@dataclass
class ConfirmResult:
    ok: bool
    summary: str
    outcome: ApplyOutcome | None = None
    """The rollback's outcome, for `--rollback-now`."""
    unrecorded: str | None = None


class NotSettled(Exception):
    """`confirm` found nothing to settle, or a boot that does not verify; one sentence."""


@dataclass
class HostChange:
    """One change in flight: the lock it holds, the phase it is in, its intent in the audit trail and the
    host-side rollback it armed. A front end that stops it sets `signal` before cancelling its task."""

    action: AuditAction
    title: str
    """How sentences name it: "apply ctx-200k", "restart of sglang.service", "rollback"."""
    profile: str | None = None
    phase: str = "lock"
    purpose: str = ""
    lock: Lock | None = None
    intent: AuditEntry | None = None
    armed: PendingRollback | None = None
    finished: bool = False
    """Its last entry (outcome or interruption) is in the audit trail."""
    signal: str | None = None
    op_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def saw(self, p: ApplyProgress) -> None:
        # A rollback's phases are its own; after an apply they are the rollback of that apply.
        own = "rollback" if self.action == "rollback" else "apply"
        self.purpose = p.purpose
        self.phase = p.phase if p.purpose == own else f"rollback {p.phase}"

    def where(self) -> str:
        return self.phase.replace("_", " ")


class HostChanger:
    """Changes one host through its state directory (lock, audit trail) and its service controller.
    `leave=True` for a command that exits afterwards: its heartbeat goes with the lock."""

    def __init__(self, state: HostStateDir, controller: ServiceController, *, leave: bool) -> None:
        self.state = state
        self.ctl = controller
        self.leave = leave
        self.host = controller.host.name

    # ---- the lock, and what a change leaves in the trail whichever way it ends ----------------------

    @contextlib.asynccontextmanager
    async def begin(
        self, action: AuditAction, title: str, profile: str | None = None
    ) -> AsyncIterator[HostChange]:
        """Hold the host's lock for one change. `LockHeld` when another console holds it (this console's
        heartbeat, written to take it, is removed again when `leave`). A cancellation inside writes the
        `interrupted` entry (with the phase and the front end's `signal`) before the lock goes."""
        change = HostChange(action, title, profile)
        try:
            lock_cm = self.state.locks.locked(title, leave=self.leave)
            change.lock = await lock_cm.__aenter__()
        except Exception:
            if self.leave:
                with contextlib.suppress(TransportError, HostStateError):
                    await self.state.files.remove(f"presence/{self.state.me.console_id}.json")
            raise
        try:
            yield change
        except asyncio.CancelledError:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._record_interruption(change))
            await lock_cm.__aexit__(None, None, None)
            raise
        except BaseException as exc:
            await lock_cm.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        else:
            await lock_cm.__aexit__(None, None, None)

    async def _record_interruption(self, change: HostChange) -> None:
        """The `interrupted` outcome of the intent (or, before any change, an entry saying so), written
        within `RECORD_TIMEOUT_S`: the lock is released after it either way."""
        where = change.where()
        by = f" by {change.signal}" if change.signal else ""
        if change.intent is not None:
            entry = change.intent.interrupted(
                ts=self.state.runner.now(),
                phase=change.phase,
                signal=change.signal,
                summary=f"interrupted{by} in {where}; the outcome of the change is unknown"
                + (
                    f"; the host-side rollback armed fires at {change.armed.deadline:%H:%M:%S} UTC unless "
                    "confirmed"
                    if change.armed is not None
                    else ""
                ),
            )
        else:
            entry = AuditEntry.intent(
                self.state.me,
                ts=self.state.runner.now(),
                host=self.host,
                action=change.action,
                op_id=change.op_id,
                profile=change.profile,
                lock_id=change.lock.info.lock_id if change.lock else None,
            ).interrupted(
                ts=self.state.runner.now(),
                phase=change.phase,
                signal=change.signal,
                summary=f"interrupted{by} in {where}, before anything was changed",
            )
        with contextlib.suppress(HostStateError, TransportError, TimeoutError):
            async with asyncio.timeout(RECORD_TIMEOUT_S):
                await self.state.audit.append(entry)
                change.finished = True

    async def _audited(
        self,
        change: HostChange,
        run: Callable[[BeforeChange], Awaitable[ApplyOutcome]],
        *,
        forced: str | None = None,
        diff: list[str] | None = None,
    ) -> ChangeResult:
        """Run `run`, handing it the callback that writes the intent right before the host is first
        changed; then write the outcome, paired with the intent. A trail that cannot take the intent
        stops the change with the host unchanged; a failure after it writes `failed`."""

        async def write_intent() -> None:
            intent = AuditEntry.intent(
                self.state.me,
                ts=self.state.runner.now(),
                host=self.host,
                action=change.action,
                op_id=change.op_id,
                profile=change.profile,
                diff=diff,
                lock_id=change.lock.info.lock_id if change.lock else None,
                forced=forced,
            )
            try:
                await self.state.audit.append(intent)
            except (HostStateError, TransportError) as exc:
                raise ServiceError(
                    f"{str(exc).rstrip('.')}; the intent could not be written to the audit trail, so nothing "
                    f"was changed on {self.host}"
                ) from None
            change.intent = intent

        try:
            outcome = await run(write_intent)
        except Exception as exc:
            if change.intent is not None:
                failed = change.intent.model_copy(
                    update={
                        "ts": self.state.runner.now(),
                        "outcome": "failed",
                        "phase": change.phase,
                        "summary": str(exc),
                    }
                )
                with contextlib.suppress(HostStateError, TransportError):
                    await self.state.audit.append(failed)
                    change.finished = True
            raise
        lost = bool(change.lock is not None and change.lock.lost)
        if change.intent is None and not (diff or outcome.durations):
            return ChangeResult(outcome, lock_lost=lost)
        entry = AuditEntry.from_outcome(
            outcome,
            me=self.state.me,
            host=self.host,
            ts=self.state.runner.now(),
            action=change.action,
            started=change.intent,
        )
        # A rollback's outcome is named after where it went (the profile put back, the previous drop-in or
        # the unit's own ExecStart): the trail says "rolled back to ctx-200k".
        entry = entry.model_copy(update={"forced": forced, "op_id": change.op_id})
        try:
            await self.state.audit.append(entry)
            change.finished = True
        except (HostStateError, TransportError) as exc:
            done = "verified" if outcome.ok else "ended without verifying"
            return ChangeResult(
                outcome,
                unrecorded=(
                    f"the {change.title} {done} on {self.host}, but its outcome is NOT in the audit trail: "
                    f"{str(exc).rstrip('.')}; the trail shows it as started and unfinished."
                ),
                lock_lost=lost,
            )
        return ChangeResult(outcome, lock_lost=lost)

    def _follow(self, change: HostChange, progress: Progress | None) -> Progress:
        def seen(p: ApplyProgress) -> None:
            change.saw(p)
            if progress is not None:
                progress(p)

        return seen

    # ---- the changes ----------------------------------------------------------------------------------

    async def pending(self) -> PendingRollback | None:
        return await HostRollback(self.ctl, self.state).pending()

    async def refuse_if_armed(self, change: HostChange) -> None:
        """A host-side rollback still armed is settled first (`confirm`): a change under it would race
        its timer. Raises ServiceError (bad input) naming it; the host is unchanged."""
        change.phase = "validate"
        armed = await self.pending()
        if armed is not None and armed.active:
            raise ServiceError(
                f"{armed.describe(datetime.now(UTC)).rstrip('.')}; settle it first with k26-console confirm "
                f"{self.host} (--rollback-now rolls back); the host is unchanged",
                bad_input=True,
            )

    async def apply(
        self,
        change: HostChange,
        profile: Profile,
        preview: ApplyPreview,
        policy: ChangePolicy,
        *,
        store: ProfileStore | None = None,
        progress: Progress | None = None,
    ) -> ChangeResult:
        """Apply `profile` as `preview` showed it (the one the operator said yes to)."""
        me = self.state.me

        def armed(record: PendingRollback) -> None:
            change.armed = record

        async def run(before_change: BeforeChange) -> ApplyOutcome:
            return await self.ctl.apply(
                profile,
                force=True,
                rollback_on_failure=policy.rollback_on_failure,
                progress=self._follow(change, progress),
                store=store,
                preview=preview,
                before_change=before_change,
                confirm_within_s=policy.confirm_within_s or None,
                armed_by=me.user + (f"@{me.jump_host}" if me.jump_host else ""),
                op_id=change.op_id,
                state=self.state,
                lock_id=change.lock.info.lock_id if change.lock else None,
                on_armed=armed,
            )

        return await self._audited(change, run, forced=policy.forced, diff=preview.diff)

    async def restart(
        self, change: HostChange, policy: ChangePolicy, *, progress: Progress | None = None
    ) -> ChangeResult:
        async def run(before_change: BeforeChange) -> ApplyOutcome:
            return await self.ctl.restart(
                progress=self._follow(change, progress),
                expect_pool=policy.expect_pool,
                before_change=before_change,
            )

        return await self._audited(change, run)

    async def rollback(
        self, change: HostChange, policy: ChangePolicy, *, progress: Progress | None = None
    ) -> ChangeResult:
        async def run(before_change: BeforeChange) -> ApplyOutcome:
            return await self.ctl.rollback(
                progress=self._follow(change, progress),
                expect_pool=policy.expect_pool,
                before_change=before_change,
                past_first=policy.past_first,
            )

        return await self._audited(change, run)

    async def confirm(
        self, change: HostChange, *, rollback_now: bool, progress: Progress | None = None
    ) -> ConfirmResult:
        """Settle the host-side rollback an apply armed: verify the boot the host runs and disarm it, or
        (`rollback_now`) disarm it and roll back at once. What is reported is what the host's record
        says: when its timer took the record first, the host rolled back, whatever this console meant.
        NotSettled when nothing is armed or the boot does not verify (the rollback stays armed)."""
        guard = HostRollback(self.ctl, self.state)
        change.phase = "validate"
        pending = await guard.pending()
        if pending is None:
            raise NotSettled(f"no host-side rollback is armed on {self.host}: nothing to confirm")
        if not pending.active:
            await guard.clear_stale()
            raise NotSettled(pending.describe(datetime.now(UTC)))
        what = pending.profile or self.ctl.unit
        if rollback_now:
            change.phase = "disarm"
            settled = await guard.disarm(pending.op_id)
            if settled is not Settled.DISARMED:
                return await self._fired_first(change, pending, "roll back")
            result = await self.rollback(change, ChangePolicy(past_first=True), progress=progress)
            return ConfirmResult(
                result.outcome.ok, result.outcome.summary, result.outcome, unrecorded=result.unrecorded
            )
        change.phase = "verify"
        boots = await self.ctl._journal_boots()
        target = self._target(pending)
        verdict = judge(boots, target) if boots else None
        if verdict is None or not verdict.ok:
            why = verdict.summary if verdict else "the journal shows no boot"
            raise NotSettled(
                f"not confirmed: {why.rstrip('.')}; {pending.describe(datetime.now(UTC))} "
                "(--rollback-now rolls back at once)"
            )
        change.phase = "disarm"
        settled = await guard.disarm(pending.op_id)
        if settled is not Settled.DISARMED:
            return await self._fired_first(change, pending, "confirm")
        summary = (
            f"confirmed {what} on {self.host} ahead of the host-side rollback: "
            f"{verdict.summary.rstrip('.')}; the rollback is disarmed."
        )
        entry = self.state.audit.entry(
            "confirm",
            profile=pending.profile,
            outcome="ok",
            summary=summary,
            op_id=pending.op_id,
            pool_tokens=verdict.max_total_num_tokens,
            lock_id=change.lock.info.lock_id if change.lock else None,
        )
        return ConfirmResult(True, summary, unrecorded=await self._append(change, entry))

    async def _fired_first(self, change: HostChange, pending: PendingRollback, meant: str) -> ConfirmResult:
        summary = (
            f"not settled: the host-side rollback of {pending.profile or self.ctl.unit} fired first (its "
            f"deadline {pending.deadline:%H:%M:%S} UTC passed before this console could {meant}): the host "
            "puts the drop-in from before that apply back and restarts by itself."
        )
        entry = self.state.audit.entry(
            "confirm",
            profile=pending.profile,
            outcome="failed",
            summary=summary,
            op_id=pending.op_id,
            lock_id=change.lock.info.lock_id if change.lock else None,
        )
        return ConfirmResult(False, summary, unrecorded=await self._append(change, entry))

    async def _append(self, change: HostChange, entry: AuditEntry) -> str | None:
        try:
            await self.state.audit.append(entry)
        except (HostStateError, TransportError) as exc:
            return f"{entry.summary} But it is NOT in the audit trail: {str(exc).rstrip('.')}."
        change.finished = True
        return None

    @staticmethod
    def _target(pending: PendingRollback) -> int:
        """The applied profile's target context, as the record keeps it; a record of an older console
        without one: the profile of that name in the local store (a plain name only: nothing the host
        says is ever read as a local path), else 1 (ready and no errors)."""
        if pending.target_context is not None and pending.target_context > 0:
            return pending.target_context
        name = pending.profile or ""
        if _PLAIN_NAME.fullmatch(name) and not name.endswith(".toml"):
            from console.core.profiles import ProfileError
            from console.sources.profile_store import ProfileStore

            with contextlib.suppress(ProfileError, OSError):
                return ProfileStore().load(name).target_context
        return 1

    async def break_lock(self, *, reason: str) -> LockInfo:
        """Break a stale lock (the operator confirmed); BreakRefused says why not. Audited."""
        return await break_stale_lock(self.state, reason=reason)


async def break_stale_lock(state: HostStateDir, *, reason: str) -> LockInfo:
    """Break the lock of a console whose heartbeat is stale, after the operator confirmed: the host
    re-checks it and appends the `lock_break` entry in the same step (console.sources.hoststate). A
    console that reads the host but has no service controller breaks a lock through this too."""
    return await state.locks.break_lock(True, reason=reason)
