"""Two (and more) consoles on one twin host over real SSH on loopback: presence, the lock, the audit trail.

The twin's SGLang service is not started (pairing does not touch it); every test uses its own state
directory under the twin's home, so tests sharing the module's twin do not see each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from console.core.audit import AuditEntry
from console.core.pairing import BreakRefused, Identity, LockHeld, Presence
from console.sources.hosts import HostConfig, load_hosts
from console.sources.hoststate import PRUNE_PER_READ, HostStateDir, Lock
from console.sources.transport import Transport
from console.twin.host import TwinHost
from tests.support.twins import module_twin
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parent.parent
BEAT = 0.5  # heartbeat interval: a console is stale 3 × 0.5 = 1.5 s after its last beat

ALICE = Identity(user="alice", jump_host="jump1", pid=4242, console_id="alice1")
BOB = Identity(user="bob", jump_host="jump2", pid=5151, console_id="bob2")


twin = module_twin("hoststate-twin", start_service=False)


@pytest.fixture
def config(twin: TwinHost, request: pytest.FixtureRequest) -> HostConfig:
    base = load_hosts(twin.hosts_toml).hosts[twin.name]
    return base.model_copy(update={"state_dir": f"~/.k26-state-{request.node.name}"})


def _dir(twin: TwinHost, config: HostConfig) -> Path:
    """The state directory as the twin's filesystem holds it (the tests' view from outside SSH)."""
    return twin.layout.home_dir / config.state_dir.removeprefix("~/")


@contextlib.asynccontextmanager
async def _consoles(config: HostConfig, *who: Identity) -> AsyncIterator[list[HostStateDir]]:
    """One console per identity, each over its own SSH connection, all connected."""
    transports = [Transport(config, ssh_config=[]) for _ in who]
    try:
        await asyncio.gather(*(t.wait_up(15) for t in transports))
        yield [HostStateDir(t, config, me, heartbeat_s=BEAT) for t, me in zip(transports, who, strict=True)]
    finally:
        await asyncio.gather(*(t.close() for t in transports))


async def test_consoles_see_each_other_and_stale_heartbeats_are_dropped(
    twin: TwinHost, config: HostConfig
) -> None:
    async with _consoles(config, ALICE, BOB) as (a, b):
        await a.board.heartbeat("dashboard")
        await b.board.heartbeat("restart of ctx-200k")
        for console in (a, b):
            seen = {p.who: p.looking_at for p in await console.board.presence()}
            assert seen == {"alice@jump1": "dashboard", "bob@jump2": "restart of ctx-200k"}
        view = await b.board.view()
        assert [p.who for p in view.others(BOB)] == ["alice@jump1"]
        assert view.others(BOB)[0].pid == 4242 and view.lock is None
        files = sorted(p.name for p in (_dir(twin, config) / "presence").iterdir())
        assert files == ["alice1.json", "bob2.json"]

        # Alice's console stops beating (killed); Bob keeps beating until Alice's beat is stale (3 beats).
        deadline = time.monotonic() + 20 * BEAT
        while [p.who for p in (await b.board.view()).presence] != ["bob@jump2"]:
            assert time.monotonic() < deadline, "alice's silent console never went stale"
            await b.board.heartbeat()
            await asyncio.sleep(BEAT)
        # The read that judged it stale removed it (issue 36: whoever reads stale heartbeats prunes them).
        assert not (_dir(twin, config) / "presence" / "alice1.json").exists()
        assert [p.who for p in await b.board.presence()] == ["bob@jump2"]

        await b.board.leave()
        assert await a.board.presence() == []


async def test_second_acquire_is_refused_naming_holder_and_intent(twin: TwinHost, config: HostConfig) -> None:
    async with _consoles(config, ALICE, BOB) as (a, b):
        lock = await a.locks.acquire("apply ctx-200k")
        taken = lock.info.taken_at.astimezone().strftime("%H:%M:%S")
        with pytest.raises(LockHeld) as held:
            await b.locks.acquire("apply ctx-128k")
        assert (
            str(held.value) == f"alice@jump1 holds the lock on twin: apply ctx-200k, since {taken} (pid 4242)"
        )
        assert held.value.stale is False and held.value.info.lock_id == lock.info.lock_id
        # Bob cannot release or break Alice's live lock.
        assert await b.locks.release(lock) is False
        with pytest.raises(BreakRefused, match="its console is alive"):
            await b.locks.break_lock(confirm=True)
        assert json.loads((_dir(twin, config) / "lock").read_text())["lock_id"] == lock.info.lock_id
        assert (await b.board.view()).lock_line() == str(held.value)

        assert await a.locks.release() is True
        assert not (_dir(twin, config) / "lock").exists()
        assert await a.locks.release(lock) is False  # twice is harmless
        lock_b = await b.locks.acquire("apply ctx-128k")
        assert lock_b.info.holder == BOB
        await b.locks.release()


async def test_killed_holder_goes_stale_and_break_needs_confirmation_and_is_audited(
    twin: TwinHost, config: HostConfig, tmp_path: Path
) -> None:
    # A real console process holds the lock through `locked()` (which keeps its heartbeat fresh) ...
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, config.model_dump_json(), str(BEAT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()
        assert line.startswith("held "), holder.stderr.read() if holder.stderr else line
        holder_pid = holder.pid
        async with _consoles(config, BOB) as (b,):
            # ... for longer than the stale window: it is alive, so it can be neither taken nor broken.
            await asyncio.sleep(4 * BEAT)
            with pytest.raises(LockHeld) as alive:
                await b.locks.acquire("apply ctx-128k")
            assert alive.value.stale is False and alive.value.info.holder.pid == holder_pid
            assert "carol@jump3 holds the lock on twin: apply ctx-200k" in str(alive.value)

            holder.send_signal(signal.SIGKILL)  # the console dies mid-restart, without releasing
            holder.wait(10)
            deadline = time.monotonic() + 10
            while not (await b.board.view()).lock_stale:
                assert time.monotonic() < deadline, "the dead holder's lock never went stale"
                await asyncio.sleep(BEAT)
            with pytest.raises(LockHeld) as stale:
                await b.locks.acquire("apply ctx-128k")
            assert stale.value.stale is True
            assert "its console has not been heard from for" in str(stale.value)
            assert str(stale.value).endswith("so the lock may be broken after confirming")

            with pytest.raises(BreakRefused, match="explicit confirmation"):
                await b.locks.break_lock(confirm=False)
            assert (_dir(twin, config) / "lock").exists()
            broken = await b.locks.break_lock(confirm=True, reason="carol's console was killed mid-restart")
            assert broken.holder.user == "carol" and broken.intent == "apply ctx-200k"
            assert not (_dir(twin, config) / "lock").exists()
            with pytest.raises(BreakRefused, match="not locked"):
                await b.locks.break_lock(confirm=True)

            trail = await b.audit.read()
            assert [e.action for e in trail] == ["lock_break"]
            entry = trail[0]
            assert entry.who == "bob@jump2" and entry.outcome == "ok" and entry.host == "twin"
            assert entry.line().startswith(f"bob broke carol@jump3's lock (apply ctx-200k, pid {holder_pid}")
            assert entry.line().endswith(": carol's console was killed mid-restart")
            lock = await b.locks.acquire("apply ctx-128k")
            assert lock.info.holder == BOB
            await b.locks.release()
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(10)


HOLDER = r"""
import asyncio, os, sys
from console.core.pairing import Identity
from console.sources.hosts import HostConfig
from console.sources.hoststate import HostStateDir
from console.sources.transport import Transport

async def main():
    config = HostConfig.model_validate_json(sys.argv[1])
    me = Identity(user="carol", jump_host="jump3", pid=os.getpid(), console_id=f"carol{os.getpid()}")
    async with Transport(config, ssh_config=[]) as t:
        state = HostStateDir(t, config, me, heartbeat_s=float(sys.argv[2]))
        async with state.locks.locked("apply ctx-200k") as lock:
            print("held", lock.info.lock_id, flush=True)
            await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_locked_releases_on_error_and_on_cancel_and_notices_a_broken_lock(
    twin: TwinHost, config: HostConfig
) -> None:
    async with _consoles(config, ALICE, BOB) as (a, b):
        with pytest.raises(RuntimeError, match="drop-in"):
            async with a.locks.locked("apply ctx-200k"):
                raise RuntimeError("the drop-in could not be written")
        assert not (_dir(twin, config) / "lock").exists()

        entered = asyncio.Event()

        async def hold() -> None:
            async with a.locks.locked("apply ctx-200k"):
                entered.set()
                await asyncio.sleep(3600)

        task = asyncio.ensure_future(hold())
        await entered.wait()
        assert (await b.board.view()).lock is not None
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not (_dir(twin, config) / "lock").exists()

        # A console that stopped beating has its lock broken; its next beat finds the lock lost.
        lock: Lock = await a.locks.acquire("apply ctx-200k")
        deadline = time.monotonic() + 20 * BEAT
        while not (await b.board.view()).lock_stale:
            assert time.monotonic() < deadline, "the silent holder's lock never went stale"
            await asyncio.sleep(BEAT / 5)
        await b.locks.break_lock(confirm=True)
        assert not lock.lost
        await a.board.heartbeat()
        assert lock.lost
        assert await a.locks.release(lock) is False


@contextlib.contextmanager
def _held_presence_mv(twin: TwinHost, d: Path) -> Iterator[tuple[Path, Path]]:
    """Files (hold, release): while `hold` exists, the host's `mv` of a presence file in state dir `d`
    waits for `release` (20 beats at most), and leaves `mv-started.PID` and `mv-done.PID` in `d` (a
    stand-in first on the twin's PATH; other directories, and other tests sharing the twin, get the
    real `mv`)."""
    hold, release = d / "hold-mv", d / "release-mv"
    wrapper = twin.layout.bin_dir / "mv"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case "${{3-}}" in "{d}"/presence/*)\n'
        f'  if [ -e "{hold}" ]; then : > "{d}/mv-started.$$"; i=0\n'
        f'    while [ ! -e "{release}" ] && [ $i -lt {round(20 * BEAT / 0.05)} ]; do sleep 0.05; i=$((i + 1)); done\n'
        f'    /bin/mv "$@"; s=$?; : > "{d}/mv-done.$$"; exit $s; fi ;;\n'
        "esac\n"
        'exec /bin/mv "$@"\n'
    )
    wrapper.chmod(0o755)
    try:
        yield hold, release
    finally:
        wrapper.unlink()


def _left_clean(d: Path) -> None:
    """Every held write that started had ended (the host kills a script whose channel closes, so one
    cut off never ends), and nothing of the console is left: no presence, no temp file, no lock."""
    assert len(list(d.glob("mv-done.*"))) == len(list(d.glob("mv-started.*")))
    assert sorted(p.name for p in (d / "presence").iterdir()) == []
    assert not (d / "lock").exists() and list(d.glob(".lock.*")) == []


async def test_a_beat_under_way_when_the_lock_block_ends_lands_before_the_leave(
    twin: TwinHost, config: HostConfig
) -> None:
    """`locked(leave=True)` (what `apply` holds) cancelled its heartbeat, then left. A beat cut off
    mid-write left its temp file (`.<id>.json.<pid>`, seen once after an apply on a loaded machine:
    closing the beat's channel killed its script between the write and the `mv`); one that ran on after
    the leave would put back the presence the leave removed. Here a beat is held on the host until the
    block's end has cancelled it."""
    d = _dir(twin, config)
    with _held_presence_mv(twin, d) as (hold, release):
        async with _consoles(config, ALICE) as (a,):
            end = asyncio.Event()

            async def block() -> None:
                async with a.locks.locked("apply ctx-200k", leave=True):
                    hold.touch()
                    await end.wait()

            task = asyncio.ensure_future(block())
            await eventually(
                lambda: list(d.glob("mv-started.*")), "no heartbeat reached the host", timeout=10
            )
            beat = next(t for t in asyncio.all_tasks() if t.get_name() == "k26-lock-heartbeat")
            end.set()
            await eventually(
                lambda: beat.cancelling() or beat.done(),
                "the block's end never cancelled the beat",
                timeout=10,
            )
            release.touch()
            await task
            _left_clean(d)


async def test_an_apply_cancelled_while_the_host_takes_the_lock_gives_it_back(
    twin: TwinHost, config: HostConfig
) -> None:
    """Cancelled (Ctrl-C) while the host ran the acquire: the lock the host gave was unknown to the
    console, so nothing released it, and its presence stayed: a lock held by a console that was gone,
    for others to break on purpose once it went stale. Here the acquire is held on the host until the
    cancellation has reached it."""
    d = _dir(twin, config)
    with _held_presence_mv(twin, d) as (hold, release):
        async with _consoles(config, ALICE, BOB) as (a, b):
            d.mkdir(exist_ok=True)
            hold.touch()

            async def take() -> None:
                async with a.locks.locked("apply ctx-200k", leave=True):
                    raise AssertionError("the block must not be entered: the acquire was cancelled")

            task = asyncio.ensure_future(take())
            await eventually(
                lambda: list(d.glob("mv-started.*")), "the acquire never reached the host", timeout=10
            )
            task.cancel()
            await asyncio.sleep(0)  # a yield, not a wait: the task takes its cancellation first
            release.touch()
            with pytest.raises(asyncio.CancelledError):
                await task
            _left_clean(d)
            hold.unlink()
            assert (await b.board.view()).lock is None


async def test_a_jump_host_with_a_wrong_clock_does_not_look_stale(twin: TwinHost, config: HostConfig) -> None:
    transports = [Transport(config, ssh_config=[]) for _ in range(2)]
    try:
        # Alice's jump host runs 10 minutes slow: stamped with her clock, her beats would all be stale.
        slow = HostStateDir(transports[0], config, ALICE, heartbeat_s=BEAT, clock=lambda: time.time() - 600)
        b = HostStateDir(transports[1], config, BOB, heartbeat_s=BEAT)
        lock = await slow.locks.acquire("apply ctx-200k")
        view = await b.board.view()
        assert [p.who for p in view.presence] == ["alice@jump1"] and not view.lock_stale
        assert abs((lock.info.taken_at - view.now).total_seconds()) < 5
        with pytest.raises(LockHeld) as held:
            await b.locks.acquire("apply ctx-128k")
        assert held.value.stale is False
        await slow.locks.release(lock)
    finally:
        await asyncio.gather(*(t.close() for t in transports))


async def test_n_consoles_acquiring_at_the_same_instant_exactly_one_wins(
    twin: TwinHost, config: HostConfig
) -> None:
    who = [Identity(user=f"op{i}", jump_host="jump", pid=1000 + i, console_id=f"op{i}") for i in range(8)]
    async with _consoles(config, *who) as consoles:
        for round_ in range(3):
            results = await asyncio.gather(
                *(c.locks.acquire(f"apply round {round_}") for c in consoles), return_exceptions=True
            )
            won = [r for r in results if isinstance(r, Lock)]
            lost = [r for r in results if isinstance(r, LockHeld)]
            assert len(won) == 1 and len(lost) == 7, results
            winner = won[0].info
            assert all(e.info.lock_id == winner.lock_id and not e.stale for e in lost)
            on_host = json.loads((_dir(twin, config) / "lock").read_text())
            assert on_host["lock_id"] == winner.lock_id
            assert await won[0].locks.release()
        # no temporary lock file is left behind by the losers
        assert sorted(p.name for p in _dir(twin, config).iterdir()) == ["presence"]


RACER = r"""
import asyncio, json, os, sys, time
from console.core.pairing import Identity, LockHeld
from console.sources.hosts import HostConfig
from console.sources.hoststate import HostStateDir
from console.sources.transport import Transport

async def main():
    config = HostConfig.model_validate_json(sys.argv[1])
    me = Identity(user=sys.argv[2], jump_host="jump", pid=os.getpid(), console_id=sys.argv[2])
    async with Transport(config, ssh_config=[]) as t:
        await t.wait_up(15)
        state = HostStateDir(t, config, me)
        await state.board.heartbeat("racing")
        print("ready", flush=True)
        go = float(sys.stdin.readline())
        await asyncio.sleep(max(0.0, go - time.time()))
        try:
            lock = await state.locks.acquire("apply " + sys.argv[2])
            print(json.dumps({"won": True, "lock_id": lock.info.lock_id}), flush=True)
            sys.stdin.readline()
            await lock.release()
        except LockHeld as held:
            print(json.dumps({"won": False, "lock_id": held.info.lock_id, "said": str(held)}), flush=True)
        await state.board.leave()

asyncio.run(main())
"""


async def test_separate_processes_acquiring_at_the_same_instant_exactly_one_wins(
    twin: TwinHost, config: HostConfig
) -> None:
    names = ["proc-a", "proc-b", "proc-c"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, config.model_dump_json(), name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for name in names
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        go = time.time() + 0.5
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(f"{go}\n")
            p.stdin.flush()
        results = [json.loads(p.stdout.readline()) for p in procs if p.stdout is not None]
        winners = [n for n, r in zip(names, results, strict=True) if r["won"]]
        assert len(winners) == 1, results
        assert len({r["lock_id"] for r in results}) == 1
        for r in results:
            if not r["won"]:
                assert r["said"].startswith(f"{winners[0]}@jump holds the lock on twin: apply {winners[0]}")
        for p in procs:
            assert p.stdin is not None
            p.stdin.close()
            assert p.wait(20) == 0, p.stderr.read() if p.stderr else ""
        assert not (_dir(twin, config) / "lock").exists()
        assert list((_dir(twin, config) / "presence").iterdir()) == []
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)


def _entry(me: Identity, n: int, diff_lines: int = 0) -> AuditEntry:
    return AuditEntry.by(
        me,
        ts="2026-05-30T12:00:00Z",
        host="twin",
        action="apply",
        outcome="ok",
        profile=f"ctx-{n}",
        summary=f"entry {me.user} {n}",
        diff=[f"+ --flag-{n}-{i} {'v' * 40}" for i in range(diff_lines)],
    )


async def test_concurrent_audit_appends_never_interleave(twin: TwinHost, config: HostConfig) -> None:
    who = [Identity(user=f"op{i}", jump_host="jump", pid=i, console_id=f"op{i}") for i in range(4)]
    async with _consoles(config, *who) as consoles:
        # Lines near the size cap (≈3.7 KB) are the ones a split write would tear.
        entries = {c.me.user: [_entry(c.me, n, diff_lines=60) for n in range(15)] for c in consoles}
        assert all(len(e.to_jsonl()) > 3000 for e in entries["op0"])

        async def writer(c: HostStateDir) -> None:
            for e in entries[c.me.user]:
                await c.audit.append(e)

        await asyncio.gather(*(writer(c) for c in consoles), *(writer(c) for c in consoles))
    raw = (_dir(twin, config) / "audit.jsonl").read_text().splitlines()
    assert len(raw) == 4 * 15 * 2
    parsed = [AuditEntry.model_validate_json(line) for line in raw]  # every line is whole
    for user, mine in entries.items():
        got = [e.summary for e in parsed if e.user == user]
        # each console's own entries keep their order; each was appended twice, concurrently
        assert sorted(got) == sorted([e.summary for e in mine] * 2)


async def test_torn_and_garbage_lines_are_skipped_and_follow_resumes_after_a_drop(
    twin: TwinHost, config: HostConfig
) -> None:
    async with _consoles(config, ALICE, BOB) as (a, b):
        await a.audit.append(_entry(ALICE, 1))
        path = _dir(twin, config) / "audit.jsonl"
        with path.open("a") as f:
            f.write("garbage that is not json\n")
            f.write(_entry(ALICE, 99).to_jsonl()[:50])  # a writer that died mid-line: no newline
        await a.audit.append(_entry(ALICE, 2))  # must not be glued to the torn line
        log = await b.audit.read_log()
        assert [e.summary for e in log.entries] == ["entry alice 1", "entry alice 2"]
        assert log.skipped == 2

        seen: list[str] = []
        got = asyncio.Event()

        async def follow() -> None:
            async for entry in b.audit.follow(after_line=0):
                seen.append(entry.summary)
                if len(seen) >= 5:
                    got.set()

        task = asyncio.ensure_future(follow())
        try:
            await eventually(lambda: len(seen) == 2, timeout=10)
            assert seen == ["entry alice 1", "entry alice 2"]  # the replay
            await a.audit.append(_entry(ALICE, 3))
            await eventually(lambda: len(seen) == 3, timeout=10)
            b.transport.drop()  # the follower's connection dies
            await a.audit.append(_entry(ALICE, 4))
            await a.audit.append(_entry(ALICE, 5))
            await asyncio.wait_for(got.wait(), 15)
            # Nothing twice: the follower reads in order, so a repeat of 4 or 5 would come before a 6th.
            await a.audit.append(_entry(ALICE, 6))
            await eventually(lambda: "entry alice 6" in seen, timeout=10)
            assert seen == [f"entry alice {n}" for n in range(1, 7)]  # nothing lost, nothing twice
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_watch_reports_arrivals_and_the_lock(twin: TwinHost, config: HostConfig) -> None:
    async with _consoles(config, ALICE, BOB) as (a, b):
        await a.board.heartbeat("dashboard")
        views = a.board.watch(poll_s=0.1)
        first = await asyncio.wait_for(anext(views), 10)
        assert [p.who for p in first.presence] == ["alice@jump1"] and first.lock is None
        await b.board.heartbeat("dashboard")
        second = await asyncio.wait_for(anext(views), 10)
        assert [p.who for p in second.presence] == ["alice@jump1", "bob@jump2"]
        await b.locks.acquire("apply ctx-200k")
        third = await asyncio.wait_for(anext(views), 10)
        assert third.lock is not None and third.lock.holder == BOB and not third.lock_stale
        assert third.lock_line().startswith("bob@jump2 holds the lock on twin: apply ctx-200k")
        await views.aclose()
        await b.locks.release()


def test_state_dir_is_expanded_on_the_host_and_can_be_absolute(twin: TwinHost, tmp_path: Path) -> None:
    base = load_hosts(twin.hosts_toml).hosts[twin.name]
    absolute = tmp_path / "shared state"  # a space: everything is passed quoted
    config = base.model_copy(update={"state_dir": str(absolute)})

    async def main() -> None:
        async with _consoles(config, ALICE) as (a,):
            await a.audit.append(_entry(ALICE, 7))
            await a.board.heartbeat()

    asyncio.run(main())
    assert (absolute / "audit.jsonl").is_file() and (absolute / "presence" / "alice1.json").is_file()


def _dead_consoles(presence_dir: Path, count: int, *, prefix: str = "dead") -> list[str]:
    """`count` heartbeats of consoles that died ten minutes ago (a beat every 2 s: stale after 6 s), as
    consoles killed with kill -9 leave them."""
    presence_dir.mkdir(parents=True, exist_ok=True)
    old = datetime.now(UTC) - timedelta(minutes=10)
    names = []
    for i in range(count):
        cid = f"{prefix}{i:05d}"
        gone = Presence(
            user="carol", jump_host="jump9", pid=1000 + i, console_id=cid, since=old, heartbeat=old
        )
        (presence_dir / f"{cid}.json").write_text(gone.model_dump_json() + "\n")
        names.append(f"{cid}.json")
    return names


async def test_readers_prune_stale_heartbeats_a_bounded_share_per_read(
    twin: TwinHost, config: HostConfig
) -> None:
    """Consoles that died leave their heartbeat: every read removes up to PRUNE_PER_READ of the stale
    ones, never a file rewritten since it was judged (a console that came back), nor the heartbeat of
    the console holding the lock (breaking it re-checks that line), nor a file that is no console's."""
    presence = _dir(twin, config) / "presence"
    dead = _dead_consoles(presence, 2 * PRUNE_PER_READ + 37)
    (presence / "notes.json").write_text("not a heartbeat\n")
    async with _consoles(config, ALICE, BOB) as (a, b):
        # alice holds the lock, then her console dies: her beat goes stale
        await a.locks.acquire("apply ctx-200k")
        alice = presence / "alice1.json"
        holder = Presence.model_validate_json(alice.read_text())
        old = datetime.now(UTC) - timedelta(minutes=10)
        alice.write_text(holder.model_copy(update={"heartbeat": old}).model_dump_json() + "\n")
        await b.board.heartbeat("dashboard")

        def left() -> set[str]:
            return {p.name for p in presence.iterdir()} & set(dead)

        view = await b.board.view()
        assert [p.who for p in view.presence] == ["bob@jump2"] and view.lock_stale
        assert len(left()) == len(dead) - PRUNE_PER_READ  # the first read removed its share, no more

        # A console comes back between the look and the removal: its rewritten file stays.
        snap = await b.board.snapshot()
        _, stale, lock, _ = b.board.judge(snap)
        back = sorted(name for name in stale if name in dead)[0]
        revived = Presence.model_validate_json((presence / back).read_text())
        (presence / back).write_text(
            revived.model_copy(update={"heartbeat": datetime.now(UTC)}).model_dump_json()
        )
        removed = await b.board._prune(stale, lock)
        # It was the first of the batch sent (the host lists names in order): the rest of it went.
        assert back not in removed and (presence / back).exists() and len(removed) == PRUNE_PER_READ - 1

        reads = 0
        while left() - {back}:
            reads += 1
            assert reads <= 2, "stale heartbeats outlived the reads that should have pruned them"
            await b.board.view()
        assert alice.exists() and (presence / "notes.json").exists() and (presence / "bob2.json").exists()
        # The holder's stale beat is still there for the break to judge.
        assert (await b.locks.break_lock(True, reason="test")).holder.console_id == "alice1"


@pytest.mark.serial
async def test_five_thousand_stale_heartbeats_do_not_make_a_read_slow(
    twin: TwinHost, config: HostConfig
) -> None:
    """5,000 heartbeats of dead consoles: every read stays under a second (it took ~9 s of the host's time
    when each file was read by a `head` of its own), and the reads prune them."""
    presence = _dir(twin, config) / "presence"
    dead = _dead_consoles(presence, 5000)
    async with _consoles(config, BOB) as (b,):
        await b.board.heartbeat("dashboard")
        took = []
        while any((presence / name).exists() for name in dead):
            assert len(took) < 5000 // PRUNE_PER_READ, "the reads did not prune the dead heartbeats"
            await b.board.heartbeat()  # bob's beat is stale after 1.5 s: he keeps beating, as a console does
            started = time.monotonic()
            view = await b.board.view()
            took.append(time.monotonic() - started)
            assert [p.who for p in view.presence] == ["bob@jump2"]
    assert max(took) < 1.5, took


async def test_a_beat_and_the_view_in_one_run_on_the_host(twin: TwinHost, config: HostConfig) -> None:
    """The console's link writes its heartbeat and reads the state in one SSH channel a beat
    (`beat_and_view`), where a heartbeat task and a watch task each opened one: what each did alone it
    does together, the held lock's check included, and a beat that cannot be written still reads."""
    async with _consoles(config, ALICE, BOB) as (a, b):
        await b.board.heartbeat("profiles")
        runs: list[str] = []
        real_run = a.board.runner.transport.run

        async def counted(argv: object, **kw: object) -> object:
            runs.append(" ".join(map(str, argv))[:60])  # type: ignore[call-overload]
            return await real_run(argv, **kw)  # type: ignore[arg-type]

        a.board.runner.transport.run = counted  # type: ignore[method-assign,assignment]
        await a.board.runner.sync_clock()
        runs.clear()
        view = await a.board.beat_and_view("dashboard")
        assert len(runs) == 1, runs
        assert {p.who: p.looking_at for p in view.presence} == {
            "alice@jump1": "dashboard",
            "bob@jump2": "profiles",
        }
        assert {p.who for p in await b.board.presence()} == {"alice@jump1", "bob@jump2"}
        # one beat later the written heartbeat is newer
        first = next(p.heartbeat for p in view.presence if p.console_id == ALICE.console_id)
        again = await a.board.beat_and_view()
        assert next(p.heartbeat for p in again.presence if p.console_id == ALICE.console_id) > first

        # The lock's check: a lock held is still ours; broken while its holder was silent, it is lost.
        lock: Lock = await a.locks.acquire("apply ctx-200k")
        assert (await a.board.beat_and_view()).lock is not None and not lock.lost
        deadline = time.monotonic() + 20 * BEAT
        while not (await b.board.view()).lock_stale:
            assert time.monotonic() < deadline, "the silent holder's lock never went stale"
            await b.board.heartbeat()
            await asyncio.sleep(BEAT / 5)
        await b.locks.break_lock(confirm=True)
        view = await a.board.beat_and_view()
        assert lock.lost and view.lock is None

        # A presence directory that cannot be made (a file in its place): no beat, the rest still read.
        held = await b.locks.acquire("apply ctx-128k")
        presence = _dir(twin, config) / "presence"
        for f in presence.iterdir():
            f.unlink()
        presence.rmdir()
        presence.write_text("not a directory\n")
        try:
            runs.clear()
            view = await a.board.beat_and_view()
            assert len(runs) == 1 and view.presence == []
            assert view.lock is not None and view.lock.lock_id == held.info.lock_id
        finally:
            presence.unlink()
            presence.mkdir()

        # After leaving: no beat is written again, the view is still read.
        await a.board.leave()
        runs.clear()
        view = await a.board.beat_and_view()
        assert len(runs) == 1 and not (presence / "alice1.json").exists()
        await b.locks.release(held)
