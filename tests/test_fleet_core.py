"""The fleet's polling plan (console/core/fleet.py): intervals from the fleet's size, a fixed budget."""

from __future__ import annotations

import itertools

import pytest

from console.core.fleet import GPU, HEARTBEAT, SERVER, STATE_POLL, fleet_cost_per_s, poll_plan


@pytest.mark.parametrize("hosts", [1, 2, 5, 8])
def test_a_small_fleet_polls_at_one_hosts_pace(hosts: int) -> None:
    plan = poll_plan(hosts)
    assert (plan.gpu_s, plan.server_s, plan.state_poll_s, plan.heartbeat_s) == (1.0, 2.0, 4.0, 5.0)
    assert not plan.over_budget


def test_thirty_two_hosts_share_the_budget() -> None:
    plan = poll_plan(32)
    assert (plan.gpu_s, plan.server_s, plan.state_poll_s, plan.heartbeat_s) == (4.0, 8.0, 16.0, 16.0)
    assert plan.describe() == "GPUs every 4 s, /metrics every 8 s, presence every 16 s"
    # The host on screen keeps its dashboard's pace whatever the fleet's size.
    shown = poll_plan(32, shown=True)
    assert (shown.gpu_s, shown.server_s, shown.state_poll_s, shown.heartbeat_s) == (1.0, 2.0, 4.0, 5.0)


@pytest.mark.parametrize("hosts", [9, 16, 32, 50, 60])
def test_the_fleet_spends_no_more_than_its_budget_plus_the_host_on_screen(hosts: int) -> None:
    cost = fleet_cost_per_s(hosts)
    one = fleet_cost_per_s(1)
    assert cost["gpu_samples"] <= GPU.per_s + one["gpu_samples"]
    assert cost["server_readings"] <= SERVER.per_s + one["server_readings"]
    assert cost["ssh_execs"] <= STATE_POLL.per_s + HEARTBEAT.per_s + one["ssh_execs"]
    assert not poll_plan(hosts).over_budget


def test_intervals_never_shrink_as_the_fleet_grows_and_stop_at_their_ceilings() -> None:
    plans = [poll_plan(n) for n in range(1, 400)]
    for a, b in itertools.pairwise(plans):
        assert b.gpu_s >= a.gpu_s and b.server_s >= a.server_s
        assert b.state_poll_s >= a.state_poll_s and b.heartbeat_s >= a.heartbeat_s
    big = poll_plan(1000)
    assert (big.gpu_s, big.server_s, big.state_poll_s, big.heartbeat_s) == (
        GPU.max_s,
        SERVER.max_s,
        STATE_POLL.max_s,
        HEARTBEAT.max_s,
    )
    assert big.over_budget  # past the ceilings the budget cannot hold, and the plan says so


def test_intervals_are_whole_seconds_once_slowed() -> None:
    for n in range(1, 200):
        plan = poll_plan(n)
        for value in (plan.gpu_s, plan.server_s, plan.state_poll_s, plan.heartbeat_s):
            assert value == int(value)
    assert poll_plan(9).gpu_s == 2.0  # 9 hosts at 8 samples/s: 1.125 s, rounded up
    assert poll_plan(0).hosts == 1
