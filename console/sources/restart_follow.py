"""The restart itself: issue it, follow the new invocation's journal through the boot phases of a
`RestartMachine` (core/restart), verify the boot and turn it into an `ApplyOutcome`. Phase durations of
earlier restarts (per host, in the platform state dir) give the ETA of the next.

While it follows, two things that are not the boot's fault are told apart from a boot that is stuck:
- the SSH link going silent (console.core.link): the phase deadlines pause, the operator is told since
  when the link is lost, and the restart waits for it only as long as the change allows;
- the host's service manager going away (systemctl answers "Failed to connect to bus", "System has not
  been booted with systemd", ...): asked every `MANAGER_CHECK_S` while the journal says nothing, and
  named at once, instead of a phase deadline saying "stuck" minutes later.
A restart that saw its link lost does not go into the ETA history: its phases timed the partition.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import platformdirs
from pydantic import ValidationError

from console.core.apply import ApplyOutcome, ApplyPreview, ApplyProgress, judge
from console.core.events import Event
from console.core.parser import JournalParser
from console.core.profiles import Profile, ProfileError, Verified
from console.core.restart import PHASE_LABELS, Phase, RestartMachine, RestartRecord, median_durations
from console.core.rollback_target import pool_verdict
from console.core.source_status import FollowState
from console.core.state import fold_boots
from console.sources.dropin import DropinWriter
from console.sources.journal import JournalFollower
from console.sources.profile_store import ProfileStore
from console.sources.unit_commands import ServiceError

__all__ = ["HISTORY_KEEP", "ProgressReporter", "RestartFollower", "history_path"]

HISTORY_KEEP = 20
"""Earlier restarts whose phase durations make the ETA (the median of each phase)."""
MANAGER_CHECK_S = 2.0
"""While the boot is followed, how often the host's service manager is asked whether it is still there
(one `systemctl show` over SSH): a dead manager is named within this and one round trip."""


def history_path(host: str, state_dir: Path | None = None) -> Path:
    """Where the phase durations of this host's earlier restarts are kept (JSON lines)."""
    base = state_dir or Path(platformdirs.user_state_dir("k26-console"))
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host) or "host"
    return base / "restarts" / f"{safe}.jsonl"


class RestartFollower(DropinWriter):
    """Restarts the unit and follows, verifies and records the boot; the history makes the ETA."""

    manager_lost: str | None = None
    """Set when the last restart found the host's service manager gone: the sentence naming it."""

    def _machine(self, name: str, purpose: Literal["apply", "rollback"] = "apply") -> RestartMachine:
        return RestartMachine(
            name,
            now=self.clock(),
            host=self.host.name,
            purpose=purpose,
            history=self._history(),
            phase_factor=self.phase_factor,
            phase_margin_s=self.phase_margin_s,
        )

    # ---- history (ETA) -------------------------------------------------------------------------

    def _history(self) -> list[dict[str, float]]:
        path = history_path(self.host.name, self.state_dir)
        try:
            text = path.read_text(encoding="utf-8")
        except (FileNotFoundError, OSError, UnicodeDecodeError):
            return []
        out: list[dict[str, float]] = []
        for line in text.split("\n")[-HISTORY_KEEP * 2 :]:
            with contextlib.suppress(ValueError, ValidationError):
                rec = RestartRecord.model_validate_json(line)
                if rec.outcome == "verified":
                    out.append({str(k): v for k, v in rec.durations.items()})
        return out[-HISTORY_KEEP:]

    def _remember(self, record: RestartRecord) -> None:
        if self.link.ever_lost:
            return  # its phases timed the partition, not the boot
        path = history_path(self.host.name, self.state_dir)
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as fh:
                fh.write(record.model_dump_json() + "\n")

    def expected_boot_s(self) -> float | None:
        """A usual restart on this host (the sum of its median phase durations); None without history."""
        medians = median_durations(self._history())
        return sum(medians.values()) if medians else None

    async def _restart_guarded(self, m: RestartMachine, report: ProgressReporter) -> list[Event]:
        """The restart; a host that cannot be restarted or followed ends the restart as failed (the
        caller may still roll back) instead of leaving it half-reported."""
        try:
            return await self._restart_and_follow(m, report)
        except ServiceError as exc:
            if m.phase == Phase.RESTART:
                m.step_done(Phase.RESTART, self.clock(), ok=False, reason=str(exc).rstrip("."))
            else:
                m.timed_out(self.clock(), str(exc).rstrip("."))
            return []

    async def _restart_and_follow(self, m: RestartMachine, report: ProgressReporter) -> list[Event]:
        """Issue the restart and follow the journal from just before it until ready or failed. The
        follower resumes from its cursor after a dropped connection, so the verdict sees every line."""
        self.manager_lost = None
        info = await self.unit_info()
        m.replaced_invocation = info.invocation_id or None
        cursor = await self._journal_cursor()
        follower = JournalFollower(
            self.transport,
            self.unit,
            cursor=cursor,
            scope_to_invocation=False,
            backlog=0,
            restart_delay_s=0.2,
        )
        parser = JournalParser(host=self.host.name)
        events: list[Event] = []
        follower.start()
        try:
            await self._restart(info.invocation_id)
            m.step_done(Phase.RESTART, self.clock())
            report.emit()
            deadline = self.clock() + self.boot_timeout_s
            next_check = self.clock() + MANAGER_CHECK_S
            while m.phase not in (Phase.READY, Phase.FAILED):
                if self._link_seen() == "back":
                    # The boot went on unseen: its silence meanwhile says nothing about it.
                    m.pause(self.link.last_loss_s)
                    deadline += self.link.last_loss_s
                if self.link.lost:
                    if self.link.expired(self.clock()):
                        m.timed_out(self.clock(), self._give_up_link())
                        report.emit()
                        break
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(1.0):
                            self._feed(m, report, self._parse(parser, await follower.next_batch()), events)
                    continue
                if follower.status.state is FollowState.FAILED:
                    m.timed_out(
                        self.clock(), f"the journal can no longer be followed: {follower.status.detail}"
                    )
                    report.emit()
                    break
                if self.clock() > deadline:
                    m.timed_out(
                        self.clock(), f"no ready line within {self.boot_timeout_s:g} s of the restart"
                    )
                    report.emit()
                    break
                overdue = m.overdue(self.clock())
                if overdue is not None:
                    # A boot that stopped making progress (an exec that failed without a journal line,
                    # a server whose lines no longer reach the journal) ends here, not at the boot timeout.
                    m.timed_out(self.clock(), overdue)
                    report.emit()
                    break
                if self.clock() >= next_check:
                    gone = await self.probe_manager()
                    next_check = self.clock() + MANAGER_CHECK_S
                    if gone is not None:
                        m.timed_out(self.clock(), gone)
                        self.manager_lost = gone
                        report.emit()
                        break
                try:
                    async with asyncio.timeout(1.0):
                        batch = await follower.next_batch()
                except TimeoutError:
                    # Quiet: release a traceback the parser holds (the OOM's last lines).
                    self._feed(m, report, parser.flush(), events)
                    continue
                self._feed(m, report, self._parse(parser, batch), events)
            if m.phase == Phase.FAILED:
                # The lines right after the failure (the rest of a traceback, the unit's own end); none
                # come over a link given up on, nor from a manager that is gone.
                with contextlib.suppress(TimeoutError):
                    if self.link.gave_up or self.manager_lost:
                        raise TimeoutError
                    while True:
                        async with asyncio.timeout(1.0):
                            batch = await follower.next_batch()
                        for entry in batch:
                            events.extend(parser.feed(entry))
                events.extend(parser.flush())
        finally:
            await follower.close()
        return events

    @staticmethod
    def _parse(parser: JournalParser, batch: list[dict[str, Any]]) -> list[Event]:
        fresh: list[Event] = []
        for entry in batch:
            fresh.extend(parser.feed(entry))
        return fresh

    def _feed(
        self, m: RestartMachine, report: ProgressReporter, fresh: list[Event], events: list[Event]
    ) -> None:
        for event in fresh:
            events.append(event)
            before = m.phase
            m.feed(event, self.clock())
            if m.phase != before:
                report.emit()

    async def _finish(
        self,
        m: RestartMachine,
        report: ProgressReporter,
        profile: Profile | None,
        pv: ApplyPreview | None,
        events: list[Event],
        *,
        target: int | None,
        store: ProfileStore | None,
        name: str | None = None,
        whose: str | None = None,
        pool_before: int | None = None,
    ) -> ApplyOutcome:
        """`target`: the pool the boot must reach, the target in force after the change (`whose`: the
        profile it is the target of); without one, `pool_before` (a rollback's pool before the apply)."""
        name = name or (profile.name if profile else "rollback")
        boots = fold_boots(events)
        if m.finished or m.phase == Phase.FAILED or not boots:
            if not m.finished:
                if m.phase != Phase.FAILED:
                    m.timed_out(self.clock(), "the journal showed no boot after the restart")
                m.finish_failed(self.clock())
            report.emit(m.reason)
            reasons = [r for r in [m.reason, *m.errors] if r]
            reasons = list(dict.fromkeys(reasons))
            self._remember(m.record())
            return self._outcome(
                m,
                profile,
                pv,
                ok=False,
                summary=failed_summary(reasons[0] if reasons else None),
                reasons=reasons,
                name=name,
            )
        m.begin_verify(self.clock())
        report.emit()
        verdict = judge(boots, target or pool_before or 1)
        reasons = list(verdict.reasons)
        free = verdict.available_gpu_mem_gb
        if free is not None and free < self.min_free_gib:
            reasons.append(
                f"only {free:.2f} GiB of GPU memory is free at ready, under the {self.min_free_gib:g} GiB a long "
                "prefill needs"
            )
        ok = not reasons
        m.step_done(Phase.VERIFY, self.clock(), ok=ok, reason="; ".join(reasons) or None)
        report.emit()
        recorded: str | None = None
        if ok and store is not None and profile is not None:
            try:
                path = store.record_verified(
                    profile.name,
                    Verified(
                        pool_tokens=verdict.max_total_num_tokens,
                        headroom_gib=round(free, 2) if free is not None else None,
                        when=datetime.now(UTC).replace(microsecond=0),
                        host=self.host.name,
                        sglang_version=profile.sglang_version,
                    ),
                )
                recorded = str(path)
            except (ProfileError, OSError) as exc:
                reasons.append(f"the verified numbers could not be recorded in the profile: {exc}")
        if recorded:
            report.emit(f"verified numbers recorded in {recorded}")
        m.step_done(Phase.RECORD, self.clock())
        report.emit()
        self._remember(m.record())
        tokens = verdict.max_total_num_tokens
        if ok and tokens is not None:
            parts = ["verified: " + pool_verdict(tokens, target, whose=whose, before=pool_before)]
            parts += ["ready", "no errors since this boot"]
            if free is not None:
                parts.append(f"{free:.2f} GiB free at ready")
            summary = ", ".join(parts) + f"; {m.elapsed(self.clock()):.1f} s in all."
        else:
            summary = "not verified: " + "; ".join(reasons) + "."
        out = self._outcome(m, profile, pv, ok=ok, summary=summary, reasons=reasons, name=name)
        out.pool_tokens = tokens
        out.headroom_gib = free
        out.recorded_in = recorded
        return out

    def _outcome(
        self,
        m: RestartMachine,
        profile: Profile | None,
        pv: ApplyPreview | None,
        *,
        ok: bool,
        summary: str,
        reasons: list[str] | None = None,
        name: str | None = None,
    ) -> ApplyOutcome:
        now = self.clock()
        return ApplyOutcome(
            ok=ok,
            profile=name or (profile.name if profile else "rollback"),
            summary=summary,
            outcome=m.outcome or "",
            pool_tokens=m.pool_tokens,
            headroom_gib=m.available_gpu_mem_gb,
            durations={str(k): round(v, 3) for k, v in m.durations(now).items()},
            total_s=round(m.elapsed(now), 3),
            reasons=reasons if reasons is not None else ([m.reason] if m.reason else []),
            diff=list(pv.diff) if pv else [],
        )


def failed_summary(reason: str | None) -> str:
    """The one-line summary of a failed boot: its first reason, cut, as one sentence (a cut reason ends
    in its ellipsis, not in "…." before the next sentence an apply appends, "Rolled back to …")."""
    said = _short(reason) if reason else "the boot failed"
    return f"failed: {said}" + ("" if said.endswith("…") else ".")


def _short(reason: str, limit: int = 160) -> str:
    """A reason cut for the one-line summary (a CUDA OOM message runs to 600 characters)."""
    reason = " ".join(reason.split()).rstrip(".")
    return reason if len(reason) <= limit else reason[: limit - 1].rstrip() + "…"


class ProgressReporter:
    """Sends an ApplyProgress when the phase changes (or a message comes with it)."""

    def __init__(
        self, m: RestartMachine, clock: Callable[[], float], callback: Callable[[ApplyProgress], None] | None
    ) -> None:
        self.m = m
        self.clock = clock
        self.callback = callback
        self._last: Phase | None = None

    def emit(self, message: str | None = None) -> None:
        phase = self.m.phase
        if self.callback is None or (phase == self._last and message is None):
            return
        self._last = phase
        now = self.clock()
        self.callback(
            ApplyProgress(
                phase=phase.value,
                label=PHASE_LABELS[phase],
                message=message,
                elapsed_s=round(self.m.elapsed(now), 3),
                durations={str(k): round(v, 3) for k, v in self.m.durations(now).items()},
                eta_s=None if (eta := self.m.eta(now)) is None else round(eta, 1),
                purpose=self.m.purpose,
            )
        )
