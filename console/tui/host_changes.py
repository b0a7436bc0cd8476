"""The console's front end of a host change: apply a profile, roll back, restart, break a stale lock, each
asked first; the refusals when another console holds the lock, the progress on the dashboard, and the
outcome on the feed. The change itself (lock, intent, the host-side rollback an apply arms, outcome,
`interrupted`) is the one protocol of console.sources.change, the command line's too. `HostController`
(console/tui/host_controller.py) is made of this and the session, pairing and alert parts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from textual.notifications import SeverityLevel
from textual.screen import Screen

from console.core.apply import forced_reason
from console.core.audit import AuditAction
from console.core.confirm import default_confirm_within
from console.core.pairing import BreakRefused, LockHeld
from console.core.profiles import ProfileError
from console.tui.pairing import refusal
from console.tui.screens import ApplyChoice, ApplyConfirmScreen, ConfirmScreen, prediction_text
from console.tui.view import display_boot

if TYPE_CHECKING:
    from console.core.apply import ApplyOutcome
    from console.core.pairing import Identity
    from console.sources.change import ChangeResult, HostChange, HostChanger
    from console.sources.profile_store import ProfileStore
    from console.sources.service import ServiceController
    from console.tui.dashboard import HostDashboard
    from console.tui.host_entry import HostEntry
    from console.tui.pairing import PairingLink


class ConsoleUi(Protocol):
    """What a controller needs of the app around it."""

    @property
    def is_running(self) -> bool: ...

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None: ...

    async def ask(self, screen: Screen[Any]) -> Any:
        """Show `screen` and return what it was dismissed with."""
        ...

    def show_host(self, host: str) -> None:
        """Bring `host`'s dashboard to the front, closing the screens over it."""

    def looking_at(self, host: str) -> str:
        """What this console shows of `host` now, as the other consoles read it."""
        ...


class HostChanges:
    """The change half of `HostController`: its state is the controller's (set in its `__init__`)."""

    entry: HostEntry
    name: str
    ui: ConsoleUi
    me: Identity
    store: ProfileStore
    read_only: bool
    link: PairingLink | None
    busy: str | None
    running_argv: list[str] | None
    pool_before: int | None
    applied: str | None
    service_controller: Callable[..., ServiceController | None]

    @property
    def dashboard(self) -> HostDashboard:
        """The host's dashboard, where the change in flight plays (`HostController` has it composed)."""
        raise NotImplementedError

    def refuse_locked(self, what: str) -> bool:
        """Refuse at once, naming the holder and its intent, while another console holds the lock."""
        sentence = refusal(self.link.view if self.link is not None else None, self.me, what)
        if sentence is not None:
            self.ui.notify(f"{self.name}: {sentence}", title="locked", severity="warning", timeout=15)
        return sentence is not None

    async def look_again(self, what: str) -> bool:
        """A fresh look at the lock before asking the operator anything; True when `what` may go on."""
        if self.link is not None:
            await self.link.refresh()
        return not self.refuse_locked(what)

    def refuse(self, what: str) -> bool:
        """Refused now (read-only, another operation running, another console's lock), with a sentence."""
        if self.read_only:
            self.ui.notify(f"read-only: {what} is refused.", severity="warning")
            return True
        if self.busy is not None:
            self.ui.notify(f"{self.name}: {self.busy} is still running.", severity="warning")
            return True
        return self.refuse_locked(what)

    async def _operate(
        self,
        doing: str,
        action: AuditAction,
        title: str,
        run: Callable[[HostChanger, HostChange], Awaitable[ChangeResult]],
        *,
        profile: str | None = None,
    ) -> ApplyOutcome | None:
        """One change at a time, through the change protocol under the host's lock, while `busy` says
        `doing`, its track on the timeline. None when refused or failed (the operator has been told)."""
        from console.sources.change import HostChanger
        from console.sources.hoststate import HostStateError
        from console.sources.transport import TransportError

        service = self.service_controller()
        if service is None:
            return None
        if self.busy is not None:
            self.ui.notify(f"{self.name}: {self.busy} is still running.", severity="warning")
            return None
        link, host = self.link, self.name
        if link is None:
            self.ui.notify(
                f"{host}: the host's state directory has not been read yet, so the lock cannot be taken; "
                "try again in a moment.",
                severity="warning",
            )
            return None
        self.busy = doing
        result: ChangeResult | None = None
        try:
            changer = HostChanger(link.state, service, leave=False)
            async with changer.begin(action, title, profile) as change:
                link.poke()
                self.dashboard.begin_track(title)
                try:
                    result = await run(changer, change)
                except (HostStateError, TransportError):
                    raise
                except Exception as exc:  # the protocol has written `failed`; the operator reads why
                    self._fail(str(exc))
                    return None
        except LockHeld as held:
            hint = " Break it from the palette (ctrl+p) after confirming." if held.stale else ""
            self.ui.notify(
                f"{host}: {str(held).rstrip('.')}.{hint}", title="locked", severity="warning", timeout=15
            )
            return None
        except (HostStateError, TransportError) as exc:
            self.ui.notify(f"{host}: {exc}", severity="error", timeout=15)
            if result is None:
                return None
        finally:
            self.busy = None
            link.poke()
        if result.unrecorded is not None:
            self.ui.notify(f"{host}: {result.unrecorded}", severity="error", timeout=30)
        if result.lock_lost:
            self.ui.notify(
                f"{host}: this console's lock was taken while {title} ran (another console broke it, judging "
                "this console gone, or the host's rollback freed it); see the audit trail.",
                severity="error",
                timeout=30,
            )
        return result.outcome

    def _progress(self, progress: Any) -> None:
        self.dashboard.progress(
            str(progress.phase),
            progress.message,
            float(progress.elapsed_s),
            {str(k): float(v) for k, v in progress.durations.items()},
            progress.eta_s,
        )

    def _finish(self, outcome: ApplyOutcome, *, undoable: bool) -> None:
        reasons = tuple(str(r) for r in outcome.reasons)
        rolled = bool(getattr(outcome, "rolled_back", False))
        restarts = ("restart" in outcome.durations) + bool(
            outcome.rollback is not None and "restart" in outcome.rollback.durations
        )
        self.dashboard.finish_track(
            bool(outcome.ok),
            str(outcome.summary),
            reasons,
            can_roll_back=undoable and not rolled,
            restarts=restarts,
        )
        self.running_argv = None  # the unit's ExecStart may have changed
        if outcome.ok:
            self.ui.notify(f"{self.name}: {outcome.summary}", title="verified", timeout=10)
        else:
            hint = "  R rolls back." if undoable and not rolled else ""
            self.ui.notify(
                f"{self.name}: {outcome.summary}{hint}", title="failed", severity="error", timeout=30
            )

    def _fail(self, sentence: str) -> None:
        self.dashboard.finish_track(False, sentence, (), can_roll_back=False)
        self.ui.notify(f"{self.name}: {sentence}", severity="error", timeout=20)

    # ---- apply, rollback, restart, break: each asks first --------------------------------------------

    async def apply(self, name: str) -> None:
        """Preview the saved profile `name` against the host, confirm (typing its name where the CLI
        would ask for it), then apply it with the CLI's commit-confirmed default and verify."""
        from console.sources.change import ChangePolicy

        if self.refuse(f"applying {name}"):
            return
        try:
            profile = self.store.load(name)
        except ProfileError as exc:
            self.ui.notify(str(exc), severity="error", timeout=10)
            return
        service = self.service_controller()
        if service is None or not await self.look_again(f"applying {profile.name}"):
            return
        self.ui.notify(f"{self.name}: checking {profile.name} against the host…", timeout=3)
        try:
            preview = await service.preview(profile)
        except Exception as exc:
            self.ui.notify(f"{self.name}: {exc}", severity="error", timeout=15)
            return
        confirm_within = self.entry.confirm_within_s
        if confirm_within is None:
            confirm_within = default_confirm_within(service.expected_boot_s())
        choice = await self.ui.ask(
            ApplyConfirmScreen(
                f"Apply {profile.name} to {self.name}?",
                ok=bool(preview.ok),
                diff=list(preview.diff),
                prediction=prediction_text(preview, profile.target_context),
                errors=list(preview.errors),
                warnings=list(preview.warnings),
                name_gate=profile.name if preview.needs_name else None,
                note=(
                    f"Commit-confirmed: {self.name} rolls itself back unless the new boot is verified within "
                    f"{confirm_within:.0f} s (this console confirms it when it verifies)."
                    if confirm_within
                    else "No host-side rollback is armed (--confirm-within 0)."
                ),
            )
        )
        if choice is None:
            return
        self.ui.show_host(self.name)  # the restart plays on the dashboard's timeline
        snap = self.dashboard.snap
        boot = display_boot(snap.state) if snap is not None else None
        pool = boot.pool.tokens if boot is not None else None
        how = "forced from the console" if choice is ApplyChoice.FORCE else "confirmed in the console"
        policy = ChangePolicy(
            confirm_within_s=confirm_within or None,
            forced=forced_reason(preview, f"{how}, its name typed" if preview.needs_name else how),
        )
        # The preview the operator confirmed is the one applied (no second look that could differ).
        outcome = await self._operate(
            f"applying {profile.name}",
            "apply",
            f"apply {profile.name}",
            lambda changer, change: changer.apply(
                change, profile, preview, policy, store=self.store, progress=self._progress
            ),
            profile=profile.name,
        )
        if outcome is None:
            return
        self.pool_before = pool
        if outcome.ok:
            self.applied = profile.name
        self._finish(outcome, undoable="write_dropin" in outcome.durations)

    async def rollback(self) -> None:
        """Show where the rollback goes (the drop-in kept, or the unit's own ExecStart) and the flags it
        changes, confirm, then roll back through the change protocol and verify."""
        from console.sources.change import ChangePolicy, ChangeResult
        from console.sources.confirm import HostRollback
        from console.sources.unit_commands import ServiceError

        if self.refuse("a rollback"):
            return
        service = self.service_controller()
        if service is None or not await self.look_again("a rollback"):
            return
        try:
            pv = await service.rollback_preview()
            armed = await HostRollback(service, self.link.state).pending() if self.link is not None else None
        except Exception as exc:
            self.ui.notify(f"{self.name}: {exc}", severity="warning", timeout=15)
            return
        armed = armed if armed is not None and armed.active else None
        changes = "\n".join(pv.diff) if pv.diff else "no change to the running ExecStart"
        first = (
            "\n\nThis removes the console's FIRST drop-in on this host: nothing of the console's is left."
            if pv.past_first
            else ""
        )
        settles = (
            f"\n\n{armed.describe(datetime.now(UTC))}: it is disarmed first, and this rollback replaces it."
            if armed is not None
            else ""
        )
        if not await self.ui.ask(
            ConfirmScreen(
                f"Roll back the service on {self.name}?",
                f"Back to {pv.target}.\n\n{changes}{first}{settles}\n\nReloads systemd, restarts the "
                "server and verifies it. A restart takes minutes on a real host.",
            )
        ):
            return
        policy = ChangePolicy(expect_pool=self.pool_before, past_first=pv.past_first)

        async def run(changer: HostChanger, change: HostChange) -> ChangeResult:
            if armed is None:
                return await changer.rollback(change, policy, progress=self._progress)
            # The host-side rollback of an apply that did not verify: settled by rolling back now (its
            # record taken first, so the host's timer and this rollback cannot both run).
            settled = await changer.confirm(change, rollback_now=True, progress=self._progress)
            if settled.outcome is None:
                raise ServiceError(settled.summary)
            return ChangeResult(settled.outcome, unrecorded=settled.unrecorded)

        outcome = await self._operate("rolling back", "rollback", "rollback", run)
        if outcome is not None:
            self._finish(outcome, undoable=False)

    async def restart(self) -> None:
        """The service controller's restart: the flags in force, followed phase by phase and verified,
        inside the host's lock and recorded in its audit trail."""
        from console.sources.change import ChangePolicy

        unit = self.entry.config.unit_name if self.entry.config else "the service"
        if self.refuse("a restart") or not await self._confirm(
            "a restart",
            ConfirmScreen(
                f"Restart {unit} on {self.name}?",
                "The server stops and reloads its model with the flags in force, then is verified as after "
                "an apply; a restart takes minutes on a real host.",
            ),
        ):
            return

        async def run(changer: HostChanger, change: HostChange) -> ChangeResult:
            await changer.refuse_if_armed(change)
            return await changer.restart(change, ChangePolicy(), progress=self._progress)

        outcome = await self._operate("restarting", "restart", "restart", run)
        if outcome is not None:
            self._finish(outcome, undoable=False)

    async def _confirm(self, what: str, screen: ConfirmScreen) -> bool:
        """Ask only once a fresh look says no other console holds the lock (the lock is still taken,
        atomically, when the operation starts)."""
        return await self.look_again(what) and bool(await self.ui.ask(screen))

    async def break_lock(self) -> None:
        """Break a stale lock, only after a confirmation that shows whose it is and for what."""
        from console.sources.change import break_stale_lock
        from console.sources.hoststate import HostStateError
        from console.sources.transport import TransportError

        link = self.link
        view = link.view if link is not None else None
        if self.read_only:
            self.ui.notify("read-only: breaking the lock is refused.", severity="warning")
            return
        if link is None or view is None or view.lock is None:
            if view is not None:
                self.ui.notify(f"{self.name} is not locked; there is nothing to break.")
            return
        lock = view.lock
        yes = await self.ui.ask(
            ConfirmScreen(
                f"Break the stale lock on {self.name}?",
                f"{view.lock_line()}.\n\nHolder: {lock.holder.who} (pid {lock.holder.pid}); intent: "
                f"{lock.intent}.\nBreak it only if that console is really gone: what it started may still be "
                "running on the host. The break is recorded in the host's audit trail.",
            )
        )
        if not yes:
            return
        try:
            info = await break_stale_lock(link.state, reason="from the console, after confirming")
        except (BreakRefused, HostStateError, TransportError) as exc:
            self.ui.notify(f"{self.name}: {exc}", severity="warning", timeout=15)
        else:
            self.ui.notify(
                f"{self.name}: broke {info.holder.who}'s lock ({info.intent}); recorded in the audit trail."
            )
        link.poke()
