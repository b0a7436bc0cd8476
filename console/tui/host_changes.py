"""A host's changes, each asked first and run under the host's lock: apply a profile, roll back, restart,
break a stale lock; the refusals when another console holds the lock, the progress on the dashboard, and
the outcome on the feed and the audit trail. `HostController` (console/tui/host_controller.py) is made of
this and the session, pairing and alert parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from textual.notifications import SeverityLevel
from textual.screen import Screen

from console.core.audit import AuditAction, AuditEntry
from console.core.pairing import BreakRefused, LockHeld
from console.core.profiles import Profile, ProfileError
from console.tui.pairing import refusal
from console.tui.screens import ApplyChoice, ApplyConfirmScreen, ConfirmScreen, prediction_text
from console.tui.view import display_boot

if TYPE_CHECKING:
    from console.core.pairing import Identity
    from console.sources.profile_store import ProfileStore
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


class ServiceControllerLike(Protocol):
    """What the console uses of `console.sources.service.ServiceController`."""

    async def running_argv(self) -> list[str]: ...
    async def why_not_running(self, profile: Profile) -> str | None: ...
    async def preview(self, profile: Profile) -> Any: ...
    async def apply(self, profile: Profile, **kw: Any) -> Any: ...
    async def rollback(self, **kw: Any) -> Any: ...
    async def restart(self, **kw: Any) -> Any: ...


class HostChanges:
    """The change half of `HostController`: its state is the controller's (set in its `__init__`)."""

    entry: HostEntry
    name: str
    dashboard: HostDashboard
    ui: ConsoleUi
    me: Identity
    store: ProfileStore
    read_only: bool
    link: PairingLink | None
    busy: str | None
    running_argv: list[str] | None
    pool_before: int | None
    applied: str | None
    service_controller: Callable[..., ServiceControllerLike | None]

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

    async def _under_lock(
        self, intent: str, action: AuditAction, start: Callable[[], Awaitable[Any]]
    ) -> Any | None:
        """Take the host's lock for `intent`, run the service controller's operation inside it with its
        track on the timeline, and append the audit entry before letting go. None when refused or
        failed (the operator has been told)."""
        from console.sources.hoststate import HostStateError
        from console.sources.transport import TransportError

        link, host = self.link, self.name
        if link is None:
            self.ui.notify(
                f"{host}: the host's state directory has not been read yet, so the lock cannot be taken; "
                "try again in a moment.",
                severity="warning",
            )
            return None
        outcome: Any | None = None
        try:
            async with link.state.locked(intent) as lock:
                link.poke()
                # The intent goes into the trail before the operation starts, so a console that dies
                # mid-restart leaves an entry readers show as unfinished; no trail, no change.
                started = AuditEntry.intent(
                    self.me,
                    ts=link.state.now(),
                    host=host,
                    action=action,
                    op_id=uuid.uuid4().hex,
                    profile=intent.removeprefix("apply ") if action == "apply" else None,
                    lock_id=lock.info.lock_id,
                    summary=intent,
                )
                try:
                    await link.state.append_audit(started)
                except (HostStateError, TransportError) as exc:
                    self._fail(f"{intent} was not started: the audit trail cannot be written ({exc})")
                    return None
                self.dashboard.begin_track(intent)
                try:
                    outcome = await start()
                except asyncio.CancelledError:
                    # The console is closing mid-operation: say so in the trail before the lock goes.
                    with contextlib.suppress(HostStateError, TransportError, TimeoutError):
                        async with asyncio.timeout(10):
                            await asyncio.shield(
                                link.state.append_audit(
                                    started.interrupted(ts=link.state.now(), phase=None, signal=None)
                                )
                            )
                    raise
                except Exception as exc:
                    failed = started.model_copy(
                        update={
                            "ts": link.state.now(),
                            "outcome": "failed",
                            "phase": None,
                            "summary": str(exc),
                        }
                    )
                    with contextlib.suppress(HostStateError, TransportError):
                        await link.state.append_audit(failed)
                    self._fail(str(exc))
                    return None
                entry = AuditEntry.from_outcome(
                    outcome, me=self.me, host=host, ts=link.state.now(), action=action, started=started
                )
                try:
                    await link.state.append_audit(entry)
                except (HostStateError, TransportError) as exc:
                    self.ui.notify(
                        f"{host}: {intent} happened but its outcome is NOT in the audit trail: {exc}",
                        severity="error",
                        timeout=30,
                    )
                if lock.lost:
                    self.ui.notify(
                        f"{host}: another console broke this console's lock while {intent} ran (it judged "
                        "this console gone); see the audit trail.",
                        severity="error",
                        timeout=30,
                    )
        except LockHeld as held:
            hint = " Break it from the palette (ctrl+p) after confirming." if held.stale else ""
            self.ui.notify(
                f"{host}: {str(held).rstrip('.')}.{hint}", title="locked", severity="warning", timeout=15
            )
            return None
        except (HostStateError, TransportError) as exc:
            self.ui.notify(f"{host}: {exc}", severity="error", timeout=15)
            return outcome
        finally:
            link.poke()
        return outcome

    async def _operate(
        self, doing: str, intent: str, action: AuditAction, start: Callable[[ServiceControllerLike], Any]
    ) -> Any | None:
        """One operation at a time: `start(service)` under the lock while `busy` says `doing`."""
        service = self.service_controller()
        if service is None:
            return None
        if self.busy is not None:
            self.ui.notify(f"{self.name}: {self.busy} is still running.", severity="warning")
            return None
        self.busy = doing
        try:
            return await self._under_lock(intent, action, partial(start, service))
        finally:
            self.busy = None

    def _progress(self, progress: Any) -> None:
        self.dashboard.progress(
            str(progress.phase),
            progress.message,
            float(progress.elapsed_s),
            {str(k): float(v) for k, v in progress.durations.items()},
            progress.eta_s,
        )

    def _finish(self, outcome: Any, *, undoable: bool) -> None:
        reasons = tuple(str(r) for r in outcome.reasons)
        rolled = bool(getattr(outcome, "rolled_back", False))
        self.dashboard.finish_track(
            bool(outcome.ok), str(outcome.summary), reasons, can_roll_back=undoable and not rolled
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
        """Preview the saved profile `name` against the host, confirm, then apply it and verify."""
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
        choice = await self.ui.ask(
            ApplyConfirmScreen(
                f"Apply {profile.name} to {self.name}?",
                ok=bool(preview.ok),
                diff=list(preview.diff),
                prediction=prediction_text(preview, profile.target_context),
                errors=list(preview.errors),
                warnings=list(preview.warnings),
            )
        )
        if choice is None:
            return
        self.ui.show_host(self.name)  # the restart plays on the dashboard's timeline
        snap = self.dashboard.snap
        boot = display_boot(snap.state) if snap is not None else None
        pool = boot.pool.tokens if boot is not None else None
        # The preview the operator confirmed is the one applied (no second look that could differ).
        outcome = await self._operate(
            f"applying {profile.name}",
            f"apply {profile.name}",
            "apply",
            lambda service: service.apply(
                profile,
                force=choice is ApplyChoice.FORCE,
                progress=self._progress,
                store=self.store,
                preview=preview,
            ),
        )
        if outcome is None:
            return
        self.pool_before = pool
        if outcome.ok:
            self.applied = profile.name
        self._finish(outcome, undoable="write_dropin" in outcome.durations)

    async def rollback(self) -> None:
        if self.refuse("a rollback") or not await self._confirm(
            "a rollback",
            ConfirmScreen(
                f"Roll back the service on {self.name}?",
                "Restores the drop-in that was in place before the last apply (or removes the console's), "
                "reloads systemd, restarts the server and verifies it. A restart takes minutes on a real host.",
            ),
        ):
            return
        outcome = await self._operate(
            "rolling back",
            "rollback",
            "rollback",
            lambda service: service.rollback(progress=self._progress, expect_pool=self.pool_before),
        )
        if outcome is not None:
            self._finish(outcome, undoable=False)

    async def restart(self) -> None:
        """The service controller's restart: the flags in force, followed phase by phase and verified,
        inside the host's lock and recorded in its audit trail."""
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
        outcome = await self._operate(
            "restarting", "restart", "restart", lambda service: service.restart(progress=self._progress)
        )
        if outcome is not None:
            self._finish(outcome, undoable=False)

    async def _confirm(self, what: str, screen: ConfirmScreen) -> bool:
        """Ask only once a fresh look says no other console holds the lock (the lock is still taken,
        atomically, when the operation starts)."""
        return await self.look_again(what) and bool(await self.ui.ask(screen))

    async def break_lock(self) -> None:
        """Break a stale lock, only after a confirmation that shows whose it is and for what."""
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
            info = await link.state.break_lock(True, reason="from the console, after confirming")
        except (BreakRefused, HostStateError, TransportError) as exc:
            self.ui.notify(f"{self.name}: {exc}", severity="warning", timeout=15)
        else:
            self.ui.notify(
                f"{self.name}: broke {info.holder.who}'s lock ({info.intent}); recorded in the audit trail."
            )
        link.poke()
