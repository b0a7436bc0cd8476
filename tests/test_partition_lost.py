"""A network partition mid-restart that outlasts the host-side rollback's deadline T (issue 36): the
traffic between the console and the twin black-holed by a proxy on loopback (tests/support/partition.py),
nothing closed. The apply says "link to twin lost since HH:MM:SS UTC" while it waits, ends before T with
one sentence saying what the host will do (the rollback fires at T unless `k26-console confirm twin`
reaches it first), and the host's rollback puts the flags from before back and takes the dead apply's lock.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from console.core.confirm import PENDING_FILE
from console.twin.host import TwinHost
from tests.support.blackhole import BlackHole
from tests.support.cli import profile_variant, run_cli, wait_until
from tests.support.partition import Apply, argv_of, hole, operator, settled, state_dir, twin

__all__ = ["hole", "twin"]  # the module's fixtures, from tests/support/partition

LOST = re.compile(r"link to twin lost since (\d\d:\d\d:\d\d) UTC")


@pytest.mark.parametrize("phase", ["restart", "loading_weights"])
def test_a_link_that_stays_lost_ends_the_apply_before_the_deadline_and_the_host_rolls_back(
    twin: TwinHost, hole: BlackHole, tmp_path: Path, phase: str
) -> None:
    confirm_within = 18
    assert wait_until(lambda: settled(twin), 120)
    before = argv_of(twin)
    hosts, env = operator(twin, hole, tmp_path)
    apply = Apply(hosts, env, profile_variant(tmp_path, f"lost-{phase}", fraction="0.94"), confirm_within)
    try:
        armed = apply.saying("host-side rollback of profile", 60)
        apply.reached(phase, 60)
        hole.cut()
        try:
            apply.saying("lost since", 30)
            rc, outcome, err = apply.finish(confirm_within + 10)
            ended = time.monotonic()
        finally:
            hole.restore()
    finally:
        hole.restore()
        apply.close()
    said = apply.said()
    summary = str(outcome["summary"])
    assert rc == 1 and outcome["ok"] is False, (outcome, err, said)
    assert "stuck in" not in said
    # Ended before the host-side rollback's deadline, saying what the host does then.
    assert ended - armed < confirm_within, (ended - armed, said)
    assert LOST.search(summary), summary
    fires = re.search(
        r"The host-side rollback armed fires at (\d\d:\d\d:\d\d) UTC unless `k26-console confirm twin` reaches "
        r"the host first",
        summary,
    )
    assert fires, summary
    # Before T the rollback is still armed, at the time the sentence names, and the apply's lock still
    # held: the console had no link to release it by.
    pending = json.loads((state_dir(twin) / PENDING_FILE).read_text())
    deadline = datetime.fromisoformat(str(pending["deadline"])).astimezone(UTC)
    assert fires.group(1) == deadline.strftime("%H:%M:%S")
    assert (state_dir(twin) / "lock").exists()
    # The host rolls back by itself, and frees the dead apply's lock.
    assert wait_until(lambda: settled(twin) and argv_of(twin) == before, confirm_within + 90), argv_of(twin)
    audit = run_cli(tmp_path, "audit", "twin", "--json", "--hosts", str(twin.hosts_toml))
    entries = [json.loads(line) for line in audit.stdout.splitlines() if line.strip()]
    trail = entries[0]["trail"] if len(entries) == 1 and "trail" in entries[0] else entries
    assert any(e.get("user") == "host" and e.get("profile") == f"lost-{phase}" for e in trail), trail[-5:]
