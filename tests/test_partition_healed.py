"""A network partition mid-restart that heals before the host-side rollback's deadline (issue 36): the
traffic between the console and the twin black-holed by a proxy on loopback (tests/support/partition.py),
nothing closed, at each restart phase of a commit-confirmed `apply`, then let through again. The apply
says "link to twin lost since HH:MM:SS UTC", follows the boot from where the journal stopped, verifies it
and confirms it (the rollback is disarmed) instead of leaving a good boot to the host's timer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from console.twin.host import TwinHost
from tests.support.blackhole import BlackHole
from tests.support.cli import profile_variant, wait_until
from tests.support.partition import Apply, argv_of, hole, operator, serving, settled, twin

__all__ = ["hole", "twin"]  # the module's fixtures, from tests/support/partition


BOOT_PHASES = ["restart", "launching", "loading_weights", "kv_pool", "cuda_graphs"]


@pytest.mark.parametrize("phase", [*BOOT_PHASES, "ready"])
def test_a_link_back_before_the_deadline_ends_in_a_confirmed_boot(
    twin: TwinHost, hole: BlackHole, tmp_path: Path, phase: str
) -> None:
    assert wait_until(lambda: settled(twin), 120)
    hosts, env = operator(twin, hole, tmp_path)
    # Flags that verify (the target is 200k), other than those running now.
    fraction = "0.94" if "0.94" not in argv_of(twin) else "0.95"
    apply = Apply(hosts, env, profile_variant(tmp_path, f"cut-{phase}", fraction=fraction), confirm_within=90)
    try:
        apply.reached(phase, 60)
        hole.cut()
        try:
            apply.saying("lost since", 30)
            # The host goes on booting unseen, to its end: the console has the whole boot to catch up on.
            assert wait_until(lambda: serving(twin), 60), (
                "the twin's boot did not finish during the partition"
            )
        finally:
            hole.restore()
        apply.saying("back at", 30)
        rc, outcome, err = apply.finish(90)
    finally:
        hole.restore()
        apply.close()
    said = apply.said()
    assert rc == 0, (outcome, err, said)
    assert outcome["ok"] is True and outcome["outcome"] == "verified", outcome
    assert "confirmed: the host-side rollback is disarmed" in said
    assert "stuck in" not in said
    assert fraction in argv_of(twin)
    assert wait_until(lambda: settled(twin), 30), "the confirmed apply left its rollback or lock behind"
