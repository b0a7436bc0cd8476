"""How often the console polls each host when it follows many: a fixed budget shared by the fleet.

One host at the dashboard's pace costs, on the console's side, a GPU sample a second (one line of a
long-lived SSH channel, parsed), a server reading every 2 s (an HTTP request through the SSH forward,
with a `/metrics` scrape parsed and folded into the serving window: ~8 ms of CPU each, measured in
docs/performance.md), and two short SSH exec channels on the host's state directory (the presence poll
every 4 s, the heartbeat every 5 s). Multiplied by 32 hosts that is 32 GPU samples, 16 scrapes and
14 channel opens a second: most of a core for a console nobody is looking at most of.

all-smi (lablup/all-smi) slows its whole fleet in steps by host count (2 s up to 10 hosts, 3 s up to
50, … 6 s past 200). The console does the same from an explicit budget instead: each kind of work has
a number of requests per second the whole fleet may spend, and a host's interval is the fleet's size
divided by that budget, never faster than one host's own pace and never slower than a ceiling past
which the figure would say nothing (a GPU sample older than 10 s). Up to 8 hosts nothing slows; at 32
the GPUs are sampled every 4 s and `/metrics` read every 8 s. Past the ceilings the budget is
exceeded, and `PollPlan.over_budget` says so.

The host whose dashboard is on screen is exempt: it polls at one host's pace (`poll_plan(…, shown=True)`),
so drilling in gives the dashboard its usual life. That one host is on top of the budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Pace:
    """One kind of polling: one host's own interval, the fleet's budget, the slowest it may go."""

    base_s: float
    """The interval of a host followed alone (the dashboard's pace)."""
    per_s: float
    """How many of these the whole fleet may do per second."""
    max_s: float
    """Never slower than this, whatever the fleet's size (the budget is then exceeded)."""

    def interval(self, hosts: int) -> float:
        """Whole seconds at or above the base (sub-second bases are kept as they are)."""
        want = max(self.base_s, hosts / self.per_s)
        if want > self.base_s:
            want = float(math.ceil(want - 1e-9))
        return min(want, max(self.base_s, self.max_s))


GPU = Pace(base_s=1.0, per_s=8.0, max_s=10.0)
"""GPU samples: one line of the sampler's stream each (no channel opened per sample)."""
SERVER = Pace(base_s=2.0, per_s=4.0, max_s=15.0)
"""Server readings: `/health` and `/metrics` through the SSH forward, the scrape parsed and folded."""
STATE_POLL = Pace(base_s=4.0, per_s=2.0, max_s=30.0)
"""Reads of the host's presence and lock: one SSH exec channel each."""
HEARTBEAT = Pace(base_s=5.0, per_s=2.0, max_s=30.0)
"""This console's heartbeat on the host: one SSH exec channel each. Other consoles judge it stale by
the interval it writes, so a slower beat is never mistaken for a console gone."""


@dataclass(frozen=True)
class PollPlan:
    hosts: int
    shown: bool
    gpu_s: float
    server_s: float
    state_poll_s: float
    heartbeat_s: float
    over_budget: bool
    """The fleet is so large that the ceilings hold the intervals: it costs more than the budget."""

    @property
    def exec_per_s(self) -> float:
        """SSH exec channels opened per second on this host's state directory."""
        return 1.0 / self.state_poll_s + 1.0 / self.heartbeat_s

    def describe(self) -> str:
        """Words for the overview's title: what every host not on screen runs at."""
        return (
            f"GPUs every {_secs(self.gpu_s)}, /metrics every {_secs(self.server_s)}, "
            f"presence every {_secs(self.state_poll_s)}"
        )


def _secs(value: float) -> str:
    return f"{value:g} s"


def poll_plan(hosts: int, *, shown: bool = False) -> PollPlan:
    """The intervals of one host of a fleet of `hosts`; `shown`: its dashboard is on screen."""
    n = max(1, hosts)
    paces = (GPU, SERVER, STATE_POLL, HEARTBEAT)
    count = 1 if shown else n
    gpu, server, poll, beat = (p.interval(count) for p in paces)
    over = not shown and any(n / p.per_s > p.max_s for p in paces)
    return PollPlan(
        hosts=n,
        shown=shown,
        gpu_s=gpu,
        server_s=server,
        state_poll_s=poll,
        heartbeat_s=beat,
        over_budget=over,
    )


def fleet_cost_per_s(hosts: int) -> dict[str, float]:
    """What the whole fleet costs per second under its plans, one host on screen: GPU samples, server
    readings and state-dir SSH channels (the figures the budget bounds)."""
    n = max(1, hosts)
    background = poll_plan(n)
    shown = poll_plan(n, shown=True)
    rest = n - 1
    return {
        "gpu_samples": rest / background.gpu_s + 1 / shown.gpu_s,
        "server_readings": rest / background.server_s + 1 / shown.server_s,
        "ssh_execs": rest * background.exec_per_s + shown.exec_per_s,
    }
