"""The pure parts of a change that loses its host (issues 36 and 37): the link watch (console.core.link),
the restart's phase clock paused while the host cannot be seen, and systemctl's words for a service
manager that is gone (console.core.systemd.manager_gone), on the lines systemctl 252 prints."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from console.core.link import CONFIRM_MARGIN_S, LinkWatch
from console.core.parser import parse_text
from console.core.restart import Phase, RestartMachine
from console.core.systemd import manager_gone

WALL = datetime(2026, 5, 30, 22, 0, 0, tzinfo=UTC)


def test_a_lost_link_is_waited_for_until_the_armed_rollback_less_the_margin() -> None:
    watch = LinkWatch("gpu7", wait_s=120, give_up_at=100.0 - CONFIRM_MARGIN_S)
    assert watch.update(True, 10.0, WALL) is None and not watch.lost
    assert watch.update(False, 20.0, WALL) == "lost"
    assert watch.update(False, 21.0, WALL) is None  # said once
    assert watch.since() == "link to gpu7 lost since 22:00:00 UTC"
    assert watch.lost_sentence(20.0).endswith("waiting for the link until 22:01:15 UTC (75 s)")
    assert not watch.expired(94.9) and watch.expired(95.0)
    reason = watch.give_up(95.0)
    assert reason == "link to gpu7 lost since 22:00:00 UTC, and it did not come back by 22:01:15 UTC"
    assert watch.give_up(99.0) == reason and watch.gave_up  # once, the same words


def test_without_a_rollback_armed_the_wait_is_bounded_from_each_loss() -> None:
    watch = LinkWatch("gpu7", wait_s=30)
    watch.update(False, 0.0, WALL)
    assert watch.deadline() == 30.0
    assert watch.update(True, 12.5, WALL + timedelta(seconds=12.5)) == "back"
    assert watch.last_loss_s == 12.5 and watch.offline_s == 12.5 and watch.deadline() is None
    assert "back at 22:00:12 UTC after 12.5 s" in watch.back_sentence(12.5, WALL + timedelta(seconds=12.5))
    watch.update(False, 50.0, WALL + timedelta(seconds=50))
    assert watch.deadline() == 80.0 and watch.losses == 2 and watch.ever_lost
    # Lost past the point of waiting at all: it says so without a wait it cannot offer.
    late = LinkWatch("gpu7", give_up_at=10.0)
    late.update(False, 10.0, WALL)
    assert late.lost_sentence(10.0) == "link to gpu7 lost since 22:00:00 UTC: the host goes on by itself"


def test_the_phase_deadline_does_not_count_the_time_the_host_was_not_seen() -> None:
    m = RestartMachine("p", now=0.0, history=[{"loading_weights": 10.0}], phase_factor=3, phase_margin_s=5)
    for step in (Phase.VALIDATE, Phase.DIFF, Phase.WRITE_DROPIN, Phase.DAEMON_RELOAD, Phase.RESTART):
        m.step_done(step, 0.0)
    (begin,) = parse_text("[2026-02-26 16:31:00 TP0] Load weight begin. avail mem=283.96 GB")
    assert m.feed(begin, 1.0) == Phase.LOADING_WEIGHTS
    assert m.phase_limit() == 30.0
    m.pause(25.0)  # a partition of 25 s inside the phase
    assert m.overdue(50.0) is None
    stuck = m.overdue(57.0)
    assert stuck is not None and stuck.startswith("stuck in loading weights for 31.0 s")


def test_systemctl_saying_the_manager_is_gone_is_told_from_a_unit_failure() -> None:
    gone = [
        "System has not been booted with systemd as init system (PID 1). Can't operate.\n"
        "Failed to connect to bus: Host is down\n",
        "Failed to connect to bus: No such file or directory\n",
        "Failed to get properties: Transport endpoint is not connected\n",
    ]
    for text in gone:
        assert manager_gone(text) == text.split("\n")[0].strip()
    assert manager_gone("Unit sglang.service not found.\n") is None
    assert (
        manager_gone("Job for sglang.service failed because the control process exited with error code.\n")
        is None
    )
