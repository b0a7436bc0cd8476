"""The host lock against what else may be at its path, and against a lock that changes under a release.

- Acquire takes the lock only where there is none: a lock path that is not a regular file (a directory,
  a symbolic link, a named pipe) or a lock file that holds no console's lock (empty, garbage) is
  refused with one sentence, however many consoles try at once, and nothing is taken.
- Release (and leave's release) never removes a lock that is not ours: the lock operations take turns
  under flock(1) on the state directory, and a release moves the lock away before it checks it, putting
  back one that turned out not to be ours. Here stand-ins on the twin's PATH make "another console broke
  the lock and took it" happen in the middle of the release, as a console that takes no turn would.

Every test has its own state directory on the module's twin host (its SGLang service is not started).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from console.core.pairing import Identity, LockInfo
from console.sources.hosts import HostConfig, load_hosts
from console.sources.hoststate import HostStateDir, HostStateError
from console.sources.transport import Transport
from console.twin.host import TwinHost
from tests.support.twins import module_twin
from tests.support.waiting import eventually, stays

BEAT = 0.5
ALICE = Identity(user="alice", jump_host="jump1", pid=4242, console_id="alice1")
BOB = Identity(user="bob", jump_host="jump2", pid=5151, console_id="bob2")
REMOVE_BY_HAND = "nothing was taken — remove it by hand once nobody is changing the service."
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


twin = module_twin("lock-protocol-twin", start_service=False)


@pytest.fixture
def config(twin: TwinHost, request: pytest.FixtureRequest) -> HostConfig:
    base = load_hosts(twin.hosts_toml).hosts[twin.name]
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in request.node.name)
    return base.model_copy(update={"state_dir": f"~/.k26-lock-{name}"})


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


def _real(tool: str) -> str:
    found = shutil.which(tool, path=SYSTEM_PATH)
    assert found is not None, f"no {tool} on {SYSTEM_PATH}"
    return found


@contextlib.contextmanager
def _stand_ins(twin: TwinHost, scripts: dict[str, str]) -> Iterator[None]:
    """Stand-ins for the named tools, first on the twin's PATH for the block."""
    paths = [twin.layout.bin_dir / tool for tool in scripts]
    try:
        for path, text in zip(paths, scripts.values(), strict=True):
            path.write_text("#!/bin/sh\n" + text)
            path.chmod(0o755)
        yield
    finally:
        for path in paths:
            path.unlink(missing_ok=True)


def _bobs_lock() -> LockInfo:
    return LockInfo(holder=BOB, intent="apply ctx-128k", taken_at=datetime.now(UTC), lock_id=uuid.uuid4().hex)


def _put_lock(d: Path, info: LockInfo) -> None:
    """Bob breaks the lock and takes it: a new lock file in its place, in one rename."""
    tmp = d / ".bob-takes-the-lock"
    tmp.write_text(info.model_dump_json() + "\n")
    os.replace(tmp, d / "lock")


@contextlib.contextmanager
def _taken_by_bob_midway(twin: TwinHost, d: Path, bob: LockInfo) -> Iterator[Path]:
    """While the returned file `armed` exists, the first `grep` that reads `d/lock` (once it has read
    it) or `mv` that moves `d/lock` (before it moves it) replaces the lock with Bob's, as a console that
    broke and took it between a release's look at the lock and its removal would, and leaves `fired`."""
    armed, fired, bobs = d / "armed", d / "fired", d / "bobs-lock"
    bobs.write_text(bob.model_dump_json() + "\n")
    take = (
        f'if {_real("mv")} "{armed}" "{fired}" 2>/dev/null; then\n'
        f'  {_real("cp")} "{bobs}" "{d}/.bob-takes-the-lock" && {_real("mv")} -f "{d}/.bob-takes-the-lock" "{d}/lock"\n'
        "fi\n"
    )
    grep = f'for a; do last=$a; done\n{_real("grep")} "$@"; s=$?\nif [ "${{last-}}" = "{d}/lock" ]; then\n{take}fi\nexit $s\n'
    mv = f'if [ "${{1-}}" = "{d}/lock" ]; then\n{take}fi\nexec {_real("mv")} "$@"\n'
    with _stand_ins(twin, {"grep": grep, "mv": mv}):
        yield armed


def _no_leftovers(d: Path) -> None:
    """No temporary lock file of an acquire, release or break is left in the state directory."""
    left = [p.name for p in d.iterdir() if p.name.startswith((".lock.", ".releasing.", ".broken."))]
    assert left == []


# ---- what acquire finds at the lock's path ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["a directory", "a symbolic link", "a named pipe"])
async def test_consoles_racing_for_a_lock_path_that_is_not_a_file_are_all_refused(
    twin: TwinHost, config: HostConfig, kind: str
) -> None:
    """`ln TEMP lock` into a directory (or a link to one) makes a file inside it and succeeds: every
    console "took" the lock. A named pipe made the acquire spin, then fail with a misleading error."""
    d = _dir(twin, config)
    (d / "presence").mkdir(parents=True)
    lock, elsewhere = d / "lock", d / "elsewhere"
    elsewhere.mkdir()
    if kind == "a directory":
        lock.mkdir()
    elif kind == "a symbolic link":
        lock.symlink_to(elsewhere)
    else:
        os.mkfifo(lock)
    who = [ALICE, BOB, Identity(user="carol", jump_host="jump3", pid=6161, console_id="carol3")]
    async with _consoles(config, *who) as consoles:
        results = await asyncio.wait_for(
            asyncio.gather(
                *(c.locks.acquire(f"restart by {c.me.user}") for c in consoles), return_exceptions=True
            ),
            30,
        )
        said = (
            f"the lock path {config.state_dir}/lock on twin is not a regular file ({kind}); {REMOVE_BY_HAND}"
        )
        assert [str(r) for r in results] == [said] * 3, results
        assert all(isinstance(r, HostStateError) for r in results)
        assert await consoles[0].locks.release() is False  # nothing to release: nothing was taken
    assert list(elsewhere.iterdir()) == []
    if kind == "a directory":
        assert lock.is_dir() and list(lock.iterdir()) == []
    _no_leftovers(d)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("", "is empty, so it is no console's lock"),
        ("garbage that is not json\n", "does not hold a console's lock (it is not LockInfo JSON)"),
        ('{"lock_id": "x"}\n', "does not hold a console's lock (it is not LockInfo JSON)"),
        ("\n" + '{"lock_id": "x"}\n', "does not hold a console's lock (it is not LockInfo JSON)"),
    ],
    ids=["empty", "garbage", "other-json", "blank-first-line"],
)
async def test_a_lock_file_that_holds_no_lock_is_refused_at_once_and_left_alone(
    twin: TwinHost, config: HostConfig, content: str, said: str
) -> None:
    d = _dir(twin, config)
    (d / "presence").mkdir(parents=True)
    (d / "lock").write_text(content)
    async with _consoles(config, ALICE, BOB) as consoles:
        t0 = time.monotonic()
        results = await asyncio.wait_for(
            asyncio.gather(*(c.locks.acquire("apply ctx-200k") for c in consoles), return_exceptions=True), 30
        )
        took = time.monotonic() - t0
    sentence = f"the lock file {config.state_dir}/lock on twin {said}; {REMOVE_BY_HAND}"
    assert [str(r) for r in results] == [sentence] * 2, results
    assert all(isinstance(r, HostStateError) for r in results)
    assert took < 5, f"refusing took {took:.1f} s"
    assert (d / "lock").read_text() == content
    _no_leftovers(d)


# ---- a lock that changes under a release --------------------------------------------------------------


async def test_a_release_leaves_a_lock_that_was_broken_and_taken_before_it(
    twin: TwinHost, config: HostConfig
) -> None:
    d = _dir(twin, config)
    async with _consoles(config, ALICE) as (a,):
        lock = await a.locks.acquire("apply ctx-200k")
        bob = _bobs_lock()
        (d / "lock").write_text(bob.model_dump_json() + "\n")  # broken and taken by Bob, in place
        assert await a.locks.release(lock) is False
        assert LockInfo.model_validate_json((d / "lock").read_text()) == bob
    _no_leftovers(d)


def _flock_that_fails() -> str:
    """A flock(1) that cannot lock anything (as on a filesystem without locks): the scripts go on alone."""
    return 'echo "flock: 8: Bad file descriptor" >&2\nexit 65\n'


@pytest.mark.parametrize("turns", ["flock", "no-flock"])
@pytest.mark.parametrize("how", ["release", "leave"])
async def test_a_lock_broken_and_taken_during_a_release_is_not_removed(
    twin: TwinHost, config: HostConfig, how: str, turns: str
) -> None:
    """The release looked at the lock (Alice's), then removed whatever was there: Bob's lock, taken
    meanwhile by a console that took no turn. Also with no flock on the host."""
    d = _dir(twin, config)
    async with _consoles(config, ALICE) as (a,):
        lock = await a.locks.acquire("apply ctx-200k")
        bob = _bobs_lock()
        with contextlib.ExitStack() as stack:
            if turns == "no-flock":
                stack.enter_context(_stand_ins(twin, {"flock": _flock_that_fails()}))
            armed = stack.enter_context(_taken_by_bob_midway(twin, d, bob))
            armed.touch()
            if how == "release":
                released = await a.locks.release(lock)
            else:
                await a.board.leave()
                released = lock.released
        assert (d / "fired").exists(), "Bob never took the lock during the release"
        assert (d / "lock").exists(), "the release removed Bob's lock"
        assert LockInfo.model_validate_json((d / "lock").read_text()) == bob
        assert released is False
    _no_leftovers(d)


@pytest.mark.skipif(shutil.which("flock", path=SYSTEM_PATH) is None, reason="no flock(1) on this machine")
@pytest.mark.parametrize("how", ["release", "leave"])
async def test_a_release_takes_its_turn_behind_a_break_under_way(
    twin: TwinHost, config: HostConfig, how: str
) -> None:
    """A break (or an acquire) under way holds the state directory's flock; a release waits for it, and
    then finds the lock it came to release broken and taken by Bob: it leaves that one alone."""
    d = _dir(twin, config)
    asked = d / "turn-asked"
    # A flock(1) that says when a script asks for the state directory's turn (fd 8 or any other).
    ask = (
        f'for f in /proc/$$/fd/*; do [ "$(readlink "$f")" = "{d}" ] && : > "{asked}"; done\n'
        f'exec {_real("flock")} "$@"\n'
    )
    async with _consoles(config, ALICE) as (a,):
        lock = await a.locks.acquire("apply ctx-200k")
        bob = _bobs_lock()
        fd = os.open(d, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with _stand_ins(twin, {"flock": ask}):
                task = asyncio.ensure_future(a.locks.release(lock) if how == "release" else a.board.leave())
                await eventually(
                    lambda: asked.exists() or task.done(), "the release never reached the host", timeout=10
                )
                # It waits its turn (and, once the turn is free below, goes ahead: wait_for(task)).
                await stays(lambda: not task.done(), "the release waiting its turn", for_s=0.3)
                _put_lock(d, bob)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        got = await asyncio.wait_for(task, 15)
        assert (got if how == "release" else lock.released) is False
        assert LockInfo.model_validate_json((d / "lock").read_text()) == bob
    _no_leftovers(d)


async def test_a_second_leave_waits_for_the_first_on_the_wire(twin: TwinHost, config: HostConfig) -> None:
    """`q` leaves the host, then exits; SIGHUP 30 ms later made the lifeline leave too. The second leave
    returned at once (the link had "left"), the lifeline exited the app, and the exit cut the first
    leave off mid-command: the heartbeat stayed on the host (a CI failure of test_terminal_loss). The
    second now waits for the first; an `rm` on the host that waits for a gate keeps the first on the wire."""
    from console.tui.pairing import PairingLink

    d = _dir(twin, config)
    beat = d / "presence" / f"{ALICE.console_id}.json"
    asked, gate = d / "rm-asked", d / "rm-gate"
    held_rm = (
        f'if [ "${{2-}}" = "{beat}" ]; then\n'
        f'  : > "{asked}"\n'
        f'  while [ ! -e "{gate}" ]; do sleep 0.05; done\n'
        f"fi\n"
        f'exec {_real("rm")} "$@"\n'
    )
    async with _consoles(config, ALICE) as (a,):
        await a.board.heartbeat()
        assert beat.exists()  # the control: there is a heartbeat to take off
        link = PairingLink(a, on_view=lambda view: None, on_audit=lambda entries: None)
        with _stand_ins(twin, {"rm": held_rm}):
            first = asyncio.ensure_future(link.leave(10.0))  # q's
            await eventually(lambda: asked.exists() or first.done(), "the leave never reached the host's rm")
            assert not first.done()
            second = asyncio.ensure_future(link.leave(10.0))  # the lifeline's
            await stays(lambda: not second.done(), "the second leave waiting for the first", for_s=0.5)
            gate.touch()
            await asyncio.wait_for(second, 15)
        assert not beat.exists(), "the second leave returned with the heartbeat still on the host"
        await asyncio.wait_for(first, 15)
