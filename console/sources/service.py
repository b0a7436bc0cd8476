"""The safe restart on a host: validate, diff, write the drop-in, reload, restart, watch, verify, roll back.

`ServiceController(host, transport)` does the work over SSH and tells a `RestartMachine` (core/restart)
what happened; the journal of the new invocation moves the machine through the boot phases. Every remote
command is an argv (the transport quotes it), and with `sudo = true` in hosts.toml the commands that
change the host run as `sudo -n ...`: a rule that wants a password is a clear refusal, never a prompt.

The drop-in `UNIT_DIR/UNIT.service.d/50-k26-console.conf` is written by one remote `sh` script that reads
the text from standard input: temp file in the same directory, then rename, so systemd never reads half
a file. The drop-in it replaces is kept beside it as `50-k26-console.conf.previous` (no `.conf` suffix:
systemd ignores it) for the rollback; when there was none, the rollback removes ours. Before the restart,
the unit is reloaded and read back: if systemd does not load it, or its ExecStart is not the argv
intended, the previous drop-in is put back at once and nothing restarts.

Phase durations of earlier restarts (per host, in the platform state dir) give the ETA of the next.

The controller is built in layers, one module each: the remote commands on the unit (sources/
unit_commands), the drop-in (sources/dropin), the followed and verified restart with its ETA history
(sources/restart_follow), and here what an operator asks for: preview, apply, restart, rollback.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from console.core.apply import (
    ApplyOutcome,
    ApplyPreview,
    ApplyProgress,
    RollbackPreview,
    argv_word_diff,
    host_profile,
    judge,
    planner_verdict,
    why_not_running,
)
from console.core.audit import AuditEntry
from console.core.confirm import PendingRollback
from console.core.flagdrift import version_drift
from console.core.flags import FlagList, UnknownVersion, load_flag_list, split_command
from console.core.link import CONFIRM_MARGIN_S, utc_clock
from console.core.profiles import (
    Profile,
    diff_against_argv,
    is_sglang_launcher,
    profile_argv,
    validate_profile,
)
from console.core.restart import Phase
from console.core.rollback_target import PREVIOUS_DROPIN, RollbackTarget, rollback_target
from console.core.systemd import (
    DROPIN_NAME,
    ExecStartError,
    exec_start_lines,
    render_dropin,
    split_exec_start,
)
from console.sources.confirm import HostRollback, RollbackTimerError, Settled
from console.sources.dropin import BACKUP_SUFFIX
from console.sources.hoststate import HostStateDir, HostStateError
from console.sources.profile_store import ProfileStore
from console.sources.restart_follow import ProgressReporter, RestartFollower, history_path
from console.sources.transport import TransportError
from console.sources.unit_commands import LinkLost, ServiceError, UnitInfo

__all__ = [
    "ApplyOutcome",
    "ApplyPreview",
    "ApplyProgress",
    "ServiceController",
    "ServiceError",
    "UnitInfo",
    "history_path",
]


KEPT_HEAD_BYTES = 4096
"""What is read of the drop-in a rollback puts back: its header, on top, names the profile."""

BeforeChange = Callable[[], Awaitable[None]]
"""Called once, right before the first change to the host (the audit trail's intent is written there):
when it raises, nothing has changed and the operation stops."""


class ServiceController(RestartFollower):
    # ---- preview -------------------------------------------------------------------------------

    host_flags: FlagList | None = None
    """The flag list of the SGLang the host runs (learned: `learn_host_flags`, or handed over by the
    console that learned it): what `preview` checks a profile against, saying what differs when the
    profile was written for another version. None: the profile's own version's shipped list."""
    host_note: str | None = None

    async def learn_host_flags(self) -> None:
        """Learn the host's SGLang and its own flag list (extracted on the host once per version, then
        cached here). When the host cannot be read, or only the shipped list is known, nothing changes and
        `preview` says so."""
        from console.sources.flagcache import host_flag_list
        from console.sources.hostinfo import HostInfoError, learn_host

        try:
            facts = await learn_host(self.host, self.transport, gpus=False)
        except (HostInfoError, TransportError) as exc:
            self.host_note = f"the host's SGLang could not be read ({str(exc).rstrip('.')})"
            return
        if facts.flags.flags_from != "host":
            self.host_note = f"the host's own flag list is not known ({facts.flags.source})"
            return
        self.host_flags = await asyncio.to_thread(host_flag_list, facts)

    def _flag_list(self, profile: Profile) -> FlagList:
        try:
            return load_flag_list(profile.sglang_version)
        except UnknownVersion as exc:
            raise ServiceError(f"{exc}.", bad_input=True) from None

    def _checked_against(self, profile: Profile) -> tuple[FlagList, list[str]]:
        """The flag list to check `profile` against, and what differs from the one it was written for."""
        host = self.host_flags
        if host is None:
            note = [f"{self.host_note}; checked against SGLang {profile.sglang_version}'s shipped list"]
            return self._flag_list(profile), note if self.host_note else []
        try:
            written_for = load_flag_list(profile.sglang_version)
        except UnknownVersion as exc:
            return host, [f"{exc}; checked against SGLang {host.sglang_version}, which the host runs"]
        found = version_drift(profile.flags, written_for, host)
        if found.same_version:
            return host, []
        return host, [found.summary(), *(d.sentence for d in found.profile_flags)]

    async def why_not_running(self, profile: Profile) -> str | None:
        """None when the unit runs `profile` as `apply` writes it; otherwise why not, in words (the flags
        that differ, or why they could not be read). Read fresh: another console, or systemctl by hand,
        may have restarted the unit since the last look."""
        try:
            running = await self.running_argv()
        except (ServiceError, TransportError) as exc:
            return f"its running flags could not be read ({str(exc).rstrip('.')})"
        return why_not_running(profile, running)

    async def preview(self, profile: Profile) -> ApplyPreview:
        """Validate the profile (flags for its SGLang version, the planner calibrated on this host's
        journal) and diff it against the running ExecStart. Reads the host; changes nothing."""
        fl, drift = self._checked_against(profile)
        validation = validate_profile(profile, fl)
        running = await self.running_argv()
        adjusted, notes = host_profile(profile, fl, running)
        self._boots = await self._journal_boots()
        verdict = planner_verdict(
            profile, fl, self._boots, model=self.host.model, min_headroom_gib=self.min_headroom_gib
        )
        errors = [i.message for i in validation.errors]
        warnings = [*drift, *(i.message for i in validation.warnings)]
        if not verdict.checked:
            warnings.append(verdict.summary())
        planner_refused = verdict.checked and verdict.fits is False
        if planner_refused:
            errors.extend(verdict.reasons)
        new_argv: list[str] = []
        diff: list[str] = []
        if validation.ok:
            new_argv = profile_argv(adjusted, fl)
            d = diff_against_argv(running, adjusted, fl)
            diff = d.lines()
            warnings.extend(f"the running ExecStart: {p}" for p in d.problems)
            if not diff and new_argv != running:
                diff = ["~ the same flags, written in another order or spelling"]
        program_changed = False
        if running and new_argv:
            before_cmd, after_cmd = split_command(running)[0], split_command(new_argv)[0]
            if before_cmd != after_cmd:
                program_changed = True
                warnings.append(
                    f"the unit would run another program: {shlex.join(before_cmd)} → {shlex.join(after_cmd)}"
                    + (
                        ""
                        if is_sglang_launcher(after_cmd)
                        else " (not SGLang's launcher, so nothing the console checks applies to it)"
                    )
                    + "; type the profile's name to confirm (or pass --yes)"
                )
        return ApplyPreview(
            profile=profile.name,
            host=self.host.name,
            unit=self.unit,
            ok=validation.ok and not planner_refused,
            valid=validation.ok,
            planner_refused=planner_refused,
            errors=errors,
            warnings=warnings,
            notes=notes,
            diff=diff,
            predicted_pool_tokens=verdict.predicted_pool_tokens,
            headroom_gib=verdict.headroom_gib,
            fits=verdict.fits,
            planner=verdict,
            running_argv=running,
            new_argv=new_argv,
            dropin_path=self.dropin_path,
            program_changed=program_changed,
        )

    # ---- apply ---------------------------------------------------------------------------------

    async def apply(
        self,
        profile: Profile,
        *,
        force: bool = False,
        rollback_on_failure: bool = False,
        progress: Callable[[ApplyProgress], None] | None = None,
        store: ProfileStore | None = None,
        preview: ApplyPreview | None = None,
        before_change: BeforeChange | None = None,
        confirm_within_s: float | None = None,
        armed_by: str = "k26-console",
        op_id: str | None = None,
        state: HostStateDir | None = None,
        lock_id: str | None = None,
        on_armed: Callable[[PendingRollback], None] | None = None,
    ) -> ApplyOutcome:
        """Apply `profile` in one restart and verify it. A profile with invalid flags raises ServiceError
        (bad_input) before anything is touched; one the planner refuses ends `refused` unless `force`.
        `before_change` runs right before the drop-in is written (not at all when nothing changes)."""
        m = self._machine(profile.name)
        report = ProgressReporter(m, self.clock, progress)
        self._watch_link(report.emit)
        report.emit()
        pv = preview or await self.preview(profile)
        if not pv.valid:
            m.step_done(Phase.VALIDATE, self.clock(), ok=False, reason=pv.errors[0] if pv.errors else None)
            raise ServiceError(
                f"profile {profile.name} is not valid for SGLang {profile.sglang_version}: "
                f"{pv.errors[0] if pv.errors else 'see profiles validate'}",
                bad_input=True,
            )
        if pv.planner_refused and not force:
            m.step_done(Phase.VALIDATE, self.clock(), ok=False, reason=" ".join(pv.errors))
            return self._outcome(m, profile, pv, ok=False, summary=f"refused by the planner: {pv.errors[0]}")
        m.step_done(Phase.VALIDATE, self.clock())
        report.emit("forced past the planner's refusal" if pv.planner_refused else None)
        if pv.unchanged:
            m.step_done(Phase.DIFF, self.clock(), ok=False)
            boots = self._boots or await self._journal_boots()
            if not boots:
                return self._outcome(
                    m, profile, pv, ok=False, summary="unchanged, and the journal shows no boot to verify."
                )
            verdict = judge(boots, profile.target_context)
            return self._outcome(
                m,
                profile,
                pv,
                ok=verdict.ok,
                summary=f"unchanged: {self.unit} already runs this profile; {verdict.summary}",
                reasons=verdict.reasons,
            )
        report.emit(f"{len(pv.diff)} change(s) to the running ExecStart")
        m.step_done(Phase.DIFF, self.clock())
        report.emit()
        before_pool = self._boots[-1].pool.tokens if self._boots else None

        try:
            text = render_dropin(
                pv.new_argv,
                header=[
                    f"Written by k26-console: profile {profile.name} (target context "
                    f"{profile.target_context:,} tokens, SGLang {profile.sglang_version}), "
                    f"{datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}.",
                    f"The previous drop-in, if any, is kept as {DROPIN_NAME}{BACKUP_SUFFIX} for the rollback.",
                ],
            )
        except ExecStartError as exc:
            raise ServiceError(
                f"the command cannot be written as a systemd unit: {exc}; the host is unchanged.",
                bad_input=True,
            ) from None
        guard = HostRollback(self, state) if confirm_within_s else None
        if guard is not None:
            try:
                armed_before = await guard.pending()
            except (TransportError, HostStateError) as exc:
                raise ServiceError(
                    f"{str(exc).rstrip('.')}; nothing was written and the service was not restarted"
                ) from None
            if armed_before is not None and armed_before.active:
                raise ServiceError(
                    f"{armed_before.describe(datetime.now(UTC))}; confirm or roll back that change first "
                    "(the host is unchanged)",
                    bad_input=True,
                )
        if before_change is not None:
            await before_change()
        op_id = op_id or uuid.uuid4().hex
        armed: PendingRollback | None = None
        if guard is not None and confirm_within_s:
            # Before the write, holding the drop-in in force now: from here on the host converges by
            # itself, whenever this console stops (a timer that fires before the write restarts nothing).
            armed_at = self.clock()
            try:
                armed = await guard.arm(
                    confirm_within_s,
                    armed_by=armed_by,
                    profile=profile.name,
                    op_id=op_id,
                    target_context=profile.target_context,
                    lock_id=lock_id,
                    holder=state.me.console_id if state is not None else None,
                    audit=self._host_rollback_entry(profile.name, armed_by, confirm_within_s, op_id),
                )
            except RollbackTimerError as exc:
                raise ServiceError(
                    f"{exc}; nothing was written and the service was not restarted "
                    "(--confirm-within 0 applies without a host-side rollback)"
                ) from None
            if on_armed is not None:
                on_armed(armed)
            # A lost link is waited for until just before the timer fires: back by then, the boot is
            # still verified and confirmed here rather than rolled back by a timer that cannot know.
            self.link.give_up_at = armed_at + confirm_within_s - CONFIRM_MARGIN_S
            report.emit(armed.describe(datetime.now(UTC)))
        try:
            await self.write_dropin(text)
        except ServiceError:
            if guard is not None and armed is not None:
                with contextlib.suppress(ServiceError, TransportError, HostStateError):
                    await guard.disarm(op_id)
            raise
        report.emit(
            f"drop-in written to {self.dropin_path}"
            + (
                f"; the previous one kept as {DROPIN_NAME}{BACKUP_SUFFIX}"
                if await self._had_previous()
                else " (there was none before: a rollback removes it)"
            )
        )
        m.step_done(Phase.WRITE_DROPIN, self.clock())
        report.emit()
        try:
            await self._reload_and_check(pv.new_argv)
        except ServiceError:
            if guard is not None and armed is not None:
                with contextlib.suppress(ServiceError, TransportError, HostStateError):
                    await guard.disarm(op_id)
            raise
        m.step_done(Phase.DAEMON_RELOAD, self.clock())
        report.emit()

        events = await self._restart_guarded(m, report)
        outcome = await self._finish(
            m, report, profile, pv, events, target=profile.target_context, store=store
        )
        if guard is not None and armed is not None:
            await self._settle_rollback(guard, armed, outcome, report, rollback_on_failure)
        else:
            self._unreached(outcome, "the new drop-in is in force and")
        if not outcome.ok and rollback_on_failure and (self.link.gave_up or self.manager_lost):
            outcome.summary += " It could not be rolled back from here."
        elif not outcome.ok and rollback_on_failure:
            # The intent written above covers the rollback too: its outcome is this apply's outcome.
            outcome.rollback = await self.rollback(progress=progress, expect_pool=before_pool)
            outcome.rolled_back = True
            tail = "verified" if outcome.rollback.ok else "NOT verified"
            outcome.summary += f" Rolled back to {outcome.rollback.profile}: {tail}."
        return outcome

    def _host_rollback_entry(
        self, profile: str, armed_by: str, within_s: float, op_id: str | None
    ) -> AuditEntry:
        return AuditEntry(
            ts=datetime.now(UTC),
            user="host",
            host=self.host.name,
            action="rollback",
            profile=profile,
            outcome="rolled_back",
            summary=(
                f"the host rolled itself back: {profile} (applied by {armed_by}) was not confirmed within "
                f"{within_s:g} s, so the previous drop-in of {self.unit} is back and the service restarts"
            ),
            op_id=op_id,
            phase="commit-confirmed",
        )

    async def _settle_rollback(
        self,
        guard: HostRollback,
        armed: PendingRollback,
        outcome: ApplyOutcome,
        report: ProgressReporter,
        rollback_on_failure: bool,
    ) -> None:
        """A verified boot confirms the change (the timer is stopped); a failed one is left to the timer,
        unless the console rolls back itself (then the timer is stopped first, the console takes over).
        A lost link is waited for (as the link watch allows) before either; a link given up on, or a
        service manager gone, leaves the host to what it will do by itself, said in one sentence."""
        if self.manager_lost is not None:
            outcome.pending_rollback = armed
            outcome.summary += (
                " The host-side rollback armed is a timer of that service manager: it fires at "
                f"{utc_clock(armed.deadline)} only if the manager is back by then; check the unit and settle "
                f"it with `k26-console confirm {self.host.name}` once it is."
            )
            return
        if not await self._await_link():
            self._left_to_the_timer(armed, outcome, report)
            return
        if not outcome.ok and not rollback_on_failure:
            try:
                waiting = await guard.timer_waiting()
            except (ServiceError, TransportError):
                if self.link.gave_up:
                    self._left_to_the_timer(armed, outcome, report)
                    return
                waiting = True  # unknown: say what was armed
            if not waiting:
                outcome.summary += (
                    " The host-side rollback has fired (the deadline passed before the console could "
                    "confirm): the host runs the previous drop-in again."
                )
                report.emit("the host-side rollback has fired: the previous drop-in is back")
                return
            outcome.pending_rollback = armed
            sentence = armed.describe(datetime.now(UTC))
            outcome.summary += f" {sentence}."
            report.emit(sentence)
            return
        try:
            settled = await self._disarm(guard, armed)
        except (ServiceError, TransportError, HostStateError) as exc:
            outcome.ok = False
            outcome.pending_rollback = armed
            outcome.summary += (
                f" The host-side rollback could NOT be disarmed ({str(exc).rstrip('.')}): it fires at "
                f"{armed.deadline.strftime('%H:%M:%S')} UTC unless stopped."
            )
            return
        if settled is None:
            self._left_to_the_timer(armed, outcome, report)
            return
        if settled is not Settled.DISARMED:
            outcome.ok = False
            outcome.summary += (
                " But the host-side rollback had already fired (its deadline passed before the boot was "
                "verified): the host runs the previous drop-in again."
            )
        elif outcome.ok:
            report.emit("confirmed: the host-side rollback is disarmed")

    async def _disarm(self, guard: HostRollback, armed: PendingRollback) -> Settled | None:
        """Disarm, through a link that may go and come back meanwhile (a disarm is safe to repeat: the
        record it claimed stays its own); None when the change gives up on the link first."""
        tries = 0
        while True:
            try:
                return await guard.disarm(armed.op_id)
            except LinkLost:
                return None
            except TransportError:
                tries += 1
                if not await self._await_link():
                    return None
                if tries > 5:
                    raise

    def _left_to_the_timer(
        self, armed: PendingRollback, outcome: ApplyOutcome, report: ProgressReporter
    ) -> None:
        """The link was given up on with the rollback armed: what the host does next, in one sentence."""
        outcome.ok = False
        outcome.pending_rollback = armed
        if self.link.reason and self.link.reason not in outcome.summary:
            outcome.summary += f" The {self.link.reason}."
        sentence = (
            f"The host-side rollback armed fires at {utc_clock(armed.deadline)} unless `k26-console confirm "
            f"{self.host.name}` reaches the host first: the drop-in from before this apply comes back and "
            f"{self.unit} restarts."
        )
        outcome.summary += f" {sentence}"
        report.emit(sentence)

    # ---- plain restart -------------------------------------------------------------------------

    async def restart(
        self,
        *,
        progress: Callable[[ApplyProgress], None] | None = None,
        expect_pool: int | None = None,
        before_change: BeforeChange | None = None,
    ) -> ApplyOutcome:
        """Restart the unit with the flags in force (nothing written, no profile recorded), follow the
        boot and verify it as an apply is verified: ready, no errors since this boot, free memory at
        ready, and a pool of at least `expect_pool` tokens when given. The outcome is named after the
        unit, so an audit line reads "alice restarted sglang.service"."""
        m = self._machine(self.unit)
        report = ProgressReporter(m, self.clock, progress)
        self._watch_link(report.emit)
        report.emit()
        argv = await self.running_argv()  # the unit exists and has an ExecStart to restart
        m.step_done(Phase.VALIDATE, self.clock())
        report.emit(f"{self.unit} restarts as it is: {len(argv)} argument(s) in its ExecStart")
        m.step_done(Phase.DIFF, self.clock())
        # No drop-in is written and systemd is not reloaded: a plain restart must not pick up unit
        # edits someone left on the host without reviewing them. Each phase is still reported, so the
        # live lines list the phases the outcome's timings list.
        report.emit("nothing written: the drop-in in force stays")
        m.step_done(Phase.WRITE_DROPIN, self.clock())
        report.emit("no daemon-reload: unit edits left on the host are not picked up")
        m.step_done(Phase.DAEMON_RELOAD, self.clock())
        report.emit()
        if before_change is not None:
            await before_change()
        events = await self._restart_guarded(m, report)
        out = await self._finish(
            m, report, None, None, events, target=expect_pool, store=None, name=self.unit
        )
        self._unreached(out, "the restart was issued:")
        return out

    def _unreached(self, outcome: ApplyOutcome, issued: str) -> None:
        """What the host does by itself after a change that lost its link for good, when no host-side
        rollback is armed: one sentence."""
        if self.link.gave_up and self.manager_lost is None:
            outcome.summary += (
                f" Nothing is armed to undo it: {issued} the host boots by itself; `k26-console verify "
                f"{self.host.name}` says how it went once the link is back."
            )

    # ---- rollback ------------------------------------------------------------------------------

    async def rollback_preview(self) -> RollbackPreview:
        """Where a rollback goes: the drop-in the last apply kept, or (none kept) the unit's own ExecStart,
        with the flags that change. Reads the host; changes nothing. ServiceError (bad input) when there is
        no drop-in of the console's to roll back."""
        state = await self._dropin_state()
        if "dropin" not in state and "previous" not in state:
            raise ServiceError(
                f"there is no drop-in by k26-console in {self.dropin_dir} on {self.host.name} to roll back.",
                bad_input=True,
            )
        running = await self.running_argv()
        result = await self._run(["systemctl", "cat", self.unit])
        previous = None
        if "previous" in state:
            prev = await self._run(["cat", "--", f"{self.dropin_path}{BACKUP_SUFFIX}"], privileged=True)
            previous = prev.stdout if prev.ok else None
        after: list[str] = []
        with contextlib.suppress(ExecStartError):
            lines = exec_start_lines(_without_dropin(result.stdout, self.dropin_path, previous))
            after = split_exec_start(lines[-1]) if lines else []
        first = "previous" not in state
        return RollbackPreview(
            host=self.host.name,
            unit=self.unit,
            target=(
                f"the unit's own ExecStart: {self.dropin_path} is the console's first drop-in on this host, "
                "and it is removed"
                if first
                else f"the drop-in the last apply kept ({DROPIN_NAME}{BACKUP_SUFFIX})"
            ),
            past_first=first,
            running_argv=running,
            new_argv=after,
            diff=argv_word_diff(running, after) if after else [],
        )

    async def _kept_dropin(self) -> str | None:
        """The head of the drop-in the last apply kept (its header names the profile), None when it
        cannot be read: the rollback then names it "the previous drop-in"."""
        result = await self._run(
            ["head", "-c", str(KEPT_HEAD_BYTES), "--", f"{self.dropin_path}{BACKUP_SUFFIX}"], privileged=True
        )
        return result.stdout if result.ok else None

    async def rollback(
        self,
        *,
        progress: Callable[[ApplyProgress], None] | None = None,
        expect_pool: int | None = None,
        before_change: BeforeChange | None = None,
        past_first: bool = True,
    ) -> ApplyOutcome:
        """Put the previous drop-in back (or remove ours when there was none, only with `past_first`),
        reload, restart, verify: ready, no errors since this boot, and, when `expect_pool` is given, the
        pool it had before."""
        m = self._machine("rollback", "rollback")
        report = ProgressReporter(m, self.clock, progress)
        self._watch_link(report.emit)
        report.emit()
        state = await self._dropin_state()
        if "dropin" not in state and "previous" not in state:
            m.step_done(Phase.VALIDATE, self.clock(), ok=False, reason="nothing to roll back")
            raise ServiceError(
                f"there is no drop-in by k26-console in {self.dropin_dir} on {self.host.name} to roll back.",
                bad_input=True,
            )
        if "previous" not in state and not past_first:
            m.step_done(Phase.VALIDATE, self.clock(), ok=False, reason="past the console's first drop-in")
            raise ServiceError(
                f"{self.dropin_path} is the console's first drop-in on {self.host.name}: rolling it back "
                "removes it and the unit runs its own ExecStart; pass --to-unit-default to do that (the host "
                "is unchanged)",
                bad_input=True,
            )
        m.step_done(Phase.VALIDATE, self.clock())
        report.emit()  # the diff phase (reading the ExecStart in force) is timed, so it is shown live
        before = await self.running_argv()
        restored = rollback_target(await self._kept_dropin() if "previous" in state else None)
        # Named after where it goes: the audit line reads "alice rolled back to ctx-200k".
        m.profile = restored.name
        m.step_done(Phase.DIFF, self.clock())
        report.emit()
        if before_change is not None:
            await before_change()
        what = await self._restore()
        report.emit(
            f"{_drop_in_named(restored)} is back at {self.dropin_path}"
            if what == "restored"
            else f"{self.dropin_path} removed (there was none before)"
        )
        m.step_done(Phase.WRITE_DROPIN, self.clock())
        report.emit()
        await self._daemon_reload()
        m.step_done(Phase.DAEMON_RELOAD, self.clock())
        report.emit()
        after = await self.running_argv()
        events = await self._restart_guarded(m, report)
        # Verified against the target in force after it: that of the profile put back, else the pool
        # the apply started from (`expect_pool`), never the pool against itself.
        out = await self._finish(
            m,
            report,
            None,
            None,
            events,
            target=restored.target_context,
            store=None,
            name=restored.name,
            whose=restored.profile,
            pool_before=expect_pool if restored.target_context is None else None,
        )
        out.diff = argv_word_diff(before, after)
        self._unreached(out, "the previous drop-in is back and")
        return out


def _drop_in_named(restored: RollbackTarget) -> str:
    return f"the drop-in of {restored.profile}" if restored.profile else PREVIOUS_DROPIN


def _without_dropin(cat: str, path: str, replacement: str | None) -> str:
    """`systemctl cat` output with the console's drop-in (its `# PATH` section) replaced by `replacement`
    (None: left out): the unit as it reads after a rollback."""
    out: list[str] = []
    skipping = False
    for line in cat.split("\n"):
        if line.startswith("# /"):
            skipping = line[2:].strip() == path
            if skipping and replacement is not None:
                out.append(replacement)
        if not skipping:
            out.append(line)
    return "\n".join(out)
