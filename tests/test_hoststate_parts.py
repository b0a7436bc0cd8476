"""Issue 35 item 3: a host's state directory is five parts over one runner, and `HostStateDir` only holds them.

The parts (the presence board, the lock, the audit trail, the state files) share one `StateRunner`: a
clock offset one of them measured stamps what the others write. `HostStateDir` forwards none of the
parts' methods: a caller names the part (`state.audit.append(entry)`, `state.locks.acquire(...)`).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import cast

import pytest

from console.core.pairing import Identity
from console.sources.hosts import HostConfig, load_hosts
from console.sources.hoststate import HostStateDir
from console.sources.transport import Transport
from console.twin.host import TwinHost
from tests.support.twins import module_twin

ALICE = Identity(user="alice", jump_host="jump1", pid=4242, console_id="alice1")
BOB = Identity(user="bob", jump_host="jump2", pid=5151, console_id="bob2")
SLOW_S = 600.0  # alice's jump host runs 10 minutes slow

MOVED = (
    # the runner's
    "now", "_run", "_run_to_the_end", "_failure", "_sync_clock", "timeout",
    # the presence board's
    "heartbeat", "snapshot", "view", "pending_rollback", "presence", "watch", "keep_alive", "leave",
    "_judge", "_prune", "_presence", "looking_at", "heartbeat_s", "stale_factor",
    # the lock's
    "acquire", "release", "break_lock", "locked", "_beat_while",
    # the audit trail's
    "audit_entry", "append_audit", "audit_cut", "read_audit_log", "read_audit_records", "read_audit",
    "follow_audit",
    # the state files'
    "absolute_path", "put_file", "remove_file",
)  # fmt: skip


twin = module_twin("hoststate-parts-twin", start_service=False)


@pytest.fixture
def config(twin: TwinHost, request: pytest.FixtureRequest) -> HostConfig:
    base = load_hosts(twin.hosts_toml).hosts[twin.name]
    return base.model_copy(update={"state_dir": f"~/.k26-parts-{request.node.name}"})


def test_host_state_dir_holds_the_parts_and_forwards_none_of_their_methods() -> None:
    # Nothing is run: the transport is never used.
    state = HostStateDir(cast(Transport, object()), HostConfig(name="gpu1", ssh="gpu1"), ALICE)
    kept = [name for name in MOVED if hasattr(state, name)]
    assert kept == [], f"HostStateDir forwards {kept}: callers name the part (state.board, state.audit...)"
    runner = state.runner
    assert state.board.runner is runner and state.locks.runner is runner
    assert state.audit.runner is runner and state.files.runner is runner
    assert state.locks.board is state.board and state.audit.board is state.board
    assert state.locks.audit is state.audit
    assert state.me is state.board.me is state.audit.me is ALICE
    assert (state.host.name, state.path, state.transport) == ("gpu1", "~/.k26-console", runner.transport)


async def test_the_offset_the_board_measured_stamps_the_audit_trail_and_the_lock(config: HostConfig) -> None:
    transports = [Transport(config, ssh_config=[]) for _ in range(2)]
    try:
        slow = HostStateDir(transports[0], config, ALICE, clock=lambda: time.time() - SLOW_S)
        b = HostStateDir(transports[1], config, BOB)
        assert slow.runner.offset is None
        # Before any command the host's clock is not known: an entry would carry alice's wrong clock.
        assert (datetime.now(UTC) - slow.audit.entry("probe", outcome="ok").ts).total_seconds() > SLOW_S - 5

        await slow.board.heartbeat("dashboard")  # the board's command measures the host's clock
        assert slow.runner.offset == pytest.approx(SLOW_S, abs=5)
        entry = slow.audit.entry("probe", outcome="ok", summary="stamped with the host's clock")
        assert abs((entry.ts - datetime.now(UTC)).total_seconds()) < 5
        await slow.audit.append(entry)
        lock = await slow.locks.acquire("apply ctx-200k")
        assert abs((lock.info.taken_at - datetime.now(UTC)).total_seconds()) < 5

        # Bob reads both as written: the entry with the host's time, alice present, her lock not stale.
        (read,) = await b.audit.read()
        assert read.ts == entry.ts and read.summary == "stamped with the host's clock"
        view = await b.board.view()
        assert [p.who for p in view.presence] == ["alice@jump1"] and not view.lock_stale
        assert await slow.locks.release(lock) is True
        assert slow.board.held is None
    finally:
        for t in transports:
            await t.close()
