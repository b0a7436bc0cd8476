"""The restart the console itself runs (apply / rollback / restart), as the timeline merges it with the
journal's phases."""

from __future__ import annotations

from dataclasses import dataclass, field

from console.core.restart import BOOT, PHASE_LABELS, Phase
from console.tui.view import TimelineStep

CONTROLLER_BEFORE: tuple[Phase, ...] = (
    Phase.VALIDATE,
    Phase.DIFF,
    Phase.WRITE_DROPIN,
    Phase.DAEMON_RELOAD,
    Phase.RESTART,
)
CONTROLLER_AFTER: tuple[Phase, ...] = (Phase.VERIFY, Phase.RECORD)


@dataclass
class ApplyTrack:
    """What the service controller has said about the restart it runs on this host: its own steps
    before the boot (validate … restart), the checks after it (verify, record), and the verdict. The
    boot's phases come from the journal, as for any restart; this only adds what the journal cannot see."""

    action: str
    """`apply ctx-200k`, `rollback`, `restart`."""
    phase: str | None = None
    message: str | None = None
    elapsed_s: float = 0.0
    durations: dict[str, float] = field(default_factory=dict)
    eta_s: float | None = None
    done: bool = False
    ok: bool | None = None
    summary: str | None = None
    reasons: tuple[str, ...] = ()
    can_roll_back: bool = False

    def progress(
        self,
        phase: str,
        message: str | None,
        elapsed_s: float,
        durations: dict[str, float],
        eta: float | None,
    ) -> None:
        self.phase = phase
        self.message = message  # what the controller said with this step; the next step replaces it
        self.elapsed_s = elapsed_s
        self.durations = dict(durations)
        self.eta_s = eta

    def finish(self, ok: bool, summary: str, reasons: tuple[str, ...] = (), *, can_roll_back: bool) -> None:
        self.done = True
        self.ok = ok
        self.summary = summary
        self.reasons = reasons
        self.can_roll_back = can_roll_back and not ok

    def steps(self, phases: tuple[Phase, ...]) -> tuple[TimelineStep, ...]:
        """The controller's own steps among `phases`, done / active / pending / failed."""
        order = [p.value for p in (*CONTROLLER_BEFORE, *BOOT, Phase.READY, Phase.FAILED, *CONTROLLER_AFTER)]
        rank = {p: i for i, p in enumerate(order)}
        current = rank.get(self.phase or "", -1)
        out = []
        for p in phases:
            secs = self.durations.get(p.value)
            if self.phase == p.value and not self.done:
                state = "active"
            elif self.done and self.ok is False and self.phase == p.value:
                state = "failed"
            elif p.value in self.durations or rank[p.value] < current:
                state = "done"
            else:
                state = "pending"
            out.append(TimelineStep(p, PHASE_LABELS[p], secs, state))
        return tuple(out)

    def before(self) -> tuple[Phase, ...]:
        """The controller's steps before the boot that this change really takes: a plain restart writes
        no drop-in and reloads nothing (its timeline listed "write drop-in", done in 0.0 s)."""
        if self.action == "restart":
            return (Phase.RESTART,)
        return CONTROLLER_BEFORE

    @property
    def booting(self) -> bool:
        """The controller has restarted the service and the journal now tells the story."""
        return self.phase not in (None, *(p.value for p in CONTROLLER_BEFORE[:-1]))
