"""Issue 30 item 6: the audit trail is read as its tail, bounded, and only as a regular file.

Before: `audit.jsonl` linked to /dev/zero took `audit` to 2.3 GB in 15 s (`cat` never ended) and the console
to 3.6 GB; a legitimate 200 MB trail took `audit --limit 5` 3.3 GB and 44 s (read, split and validated
whole). Now the host's script refuses what is not a regular file, prints the whole file's line count and
its last `AUDIT_TAIL_BYTES`, and the console reads no more than that, within its timeout.

The twin host over its SSH, with trails of real entries (`AuditEntry.to_jsonl`, as every console writes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import pytest

from console.core.audit import AuditEntry
from console.core.pairing import Identity
from console.sources.hosts import HostConfig, load_hosts
from console.sources.hoststate import AUDIT_TAIL_BYTES, HostStateDir, HostStateError
from console.sources.transport import Transport
from console.twin.host import TwinHost
from tests.support.cli import CLI, REPO, operator_env
from tests.support.measured import run_measured
from tests.support.twins import module_twin
from tests.support.waiting import eventually

ALICE = Identity(user="alice", jump_host="jump1", pid=4242, console_id="alice1")


twin = module_twin("audit-twin", start_service=False)


@pytest.fixture
def config(twin: TwinHost, request: pytest.FixtureRequest) -> HostConfig:
    base = load_hosts(twin.hosts_toml).hosts[twin.name]
    return base.model_copy(update={"state_dir": f"~/.k26-audit-{request.node.name}"})


def _trail(twin: TwinHost, config: HostConfig) -> Path:
    path = twin.layout.home_dir / config.state_dir.removeprefix("~/") / "audit.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _entry(n: int | str) -> str:
    return AuditEntry.by(
        ALICE,
        ts="2026-05-30T12:00:00Z",
        host="twin",
        action="apply",
        outcome="ok",
        profile=f"ctx-{n}",
        summary=f"entry {n}",
        diff=["- --mem-fraction-static 0.85", "+ --mem-fraction-static 0.93"],
    ).to_jsonl()


def write_trail(path: Path, size: int) -> int:
    """A trail of real entries (`entry 0`, `entry 1`, ...) of at least `size` bytes; how many it holds."""
    template = _entry("@N@") + "\n"
    count = size // len(template) + 1
    with path.open("w") as f:
        for start in range(0, count, 10_000):
            f.write(
                "".join(template.replace("@N@", str(n)) for n in range(start, min(count, start + 10_000)))
            )
    return count


def _hosts_for(twin: TwinHost, config: HostConfig, home: Path) -> Path:
    """The twin's hosts.toml with this test's state_dir."""
    lines = twin.hosts_toml.read_text().split("\n")
    head = next(i for i, line in enumerate(lines) if line.startswith("[hosts."))
    lines.insert(head + 1, f'state_dir = "{config.state_dir}"')
    hosts = home / "hosts.toml"
    hosts.write_text("\n".join(lines))
    return hosts


async def test_a_long_trail_is_read_as_its_tail_and_followed_from_its_end(
    twin: TwinHost, config: HostConfig
) -> None:
    path = _trail(twin, config)
    total = write_trail(path, 3 * AUDIT_TAIL_BYTES)
    transport = Transport(config, ssh_config=[])
    try:
        state = HostStateDir(transport, config, ALICE)
        log = await state.audit.read_log()
        assert (
            log.lines == total and log.skipped == 0
        )  # the tail's first, cut line is left out, not "unreadable"
        assert log.entries[-1].summary == f"entry {total - 1}"
        assert (
            1000 < len(log.entries) < total
            and sum(len(e.to_jsonl()) + 1 for e in log.entries) <= AUDIT_TAIL_BYTES
        )
        names = [int(e.summary.split()[1]) for e in log.entries]
        assert names == list(range(total - len(names), total))  # the newest, in order, none twice
        assert state.audit.cut == (
            f"audit.jsonl in {config.state_dir} on {config.name} holds {path.stat().st_size:,} bytes: its last "
            f"{AUDIT_TAIL_BYTES:,} were read ({len(names):,} of its {total:,} lines), the older ones left out."
        )

        # a follower resumes after the whole file's lines: the next entry appended, and only it
        seen: list[str] = []

        async def follow() -> None:
            async for entry in state.audit.follow(after_line=log.lines):
                seen.append(entry.summary)

        task = asyncio.ensure_future(follow())
        try:
            with path.open("a") as f:  # `tail -n +N` prints it whenever the follower's tail starts
                f.write(_entry(999_999) + "\n")
            await eventually(lambda: seen, "the entry appended", timeout=10)
            # Nothing else comes: no line of the old trail is read again. The follower reads in order, so an
            # old line read again would come before a second new one.
            with path.open("a") as f:
                f.write(_entry(1_000_000) + "\n")
            await eventually(lambda: len(seen) >= 2, "the second entry appended", timeout=10)
            assert seen == ["entry 999999", "entry 1000000"]
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    finally:
        await transport.close()


async def test_a_trail_that_is_no_regular_file_is_refused_by_reader_and_follower(
    twin: TwinHost, config: HostConfig
) -> None:
    path = _trail(twin, config)
    path.symlink_to("/dev/zero")
    transport = Transport(config, ssh_config=[])
    try:
        state = HostStateDir(transport, config, ALICE)
        async with asyncio.timeout(20):  # before: `cat /dev/zero` until the timeout, every byte kept
            with pytest.raises(HostStateError) as read:
                await state.audit.read_log()
            with pytest.raises(HostStateError) as followed:
                async for _ in state.audit.follow(after_line=0):
                    pass
    finally:
        await transport.close()
    assert str(read.value).endswith("audit.jsonl is not a regular file.")
    assert str(followed.value).endswith("audit.jsonl is not a regular file.")


def test_audit_prints_the_newest_entries_and_says_what_it_left_out(
    twin: TwinHost, config: HostConfig, tmp_path: Path
) -> None:
    path = _trail(twin, config)
    total = write_trail(path, 2 * AUDIT_TAIL_BYTES)
    hosts = _hosts_for(twin, config, tmp_path)
    res = run_measured(
        [*CLI, "audit", twin.name, "--hosts", str(hosts), "--json", "--limit", "5"],
        env=operator_env(tmp_path),
        cwd=REPO,
    )
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert [e["summary"] for e in report["entries"]] == [f"entry {n}" for n in range(total - 5, total)]
    assert report["cut"].startswith(f"audit.jsonl in {config.state_dir} on {twin.name} holds ")
    res = run_measured(
        [*CLI, "audit", twin.name, "--hosts", str(hosts), "--limit", "2"],
        env=operator_env(tmp_path),
        cwd=REPO,
    )
    assert res.returncode == 0 and f"ctx-{total - 1}" in res.stdout
    (said,) = res.stderr.strip().split("\n")
    assert said.startswith("k26-console: audit.jsonl in ") and said.endswith("the older ones left out.")


@pytest.mark.serial
def test_audit_against_the_issues_trails_returns_in_time_in_bounded_memory(
    twin: TwinHost, config: HostConfig, tmp_path: Path
) -> None:
    """The issue's figures: a trail linked to /dev/zero, and a legitimate 200 MB one."""
    path = _trail(twin, config)
    hosts = _hosts_for(twin, config, tmp_path)
    argv = [*CLI, "audit", twin.name, "--hosts", str(hosts), "--limit", "5"]
    path.symlink_to("/dev/zero")
    zero = run_measured(argv, env=operator_env(tmp_path), cwd=REPO)
    assert zero.returncode == 2 and "Traceback" not in zero.stderr
    (said,) = zero.stderr.strip().split("\n")
    assert said.endswith("audit.jsonl is not a regular file."), said
    path.unlink()
    total = write_trail(path, 200_000_000)
    big = run_measured(argv, env=operator_env(tmp_path), cwd=REPO)
    assert big.returncode == 0 and f"ctx-{total - 1}" in big.stdout, big.stderr
    for res in (zero, big):
        assert res.seconds < 10 and res.peak_rss < 300 << 20, (res.seconds, res.peak_rss)
    print(
        f"\naudit: /dev/zero {zero.seconds:.2f} s {zero.peak_rss >> 20} MiB; 200 MB {big.seconds:.2f} s {big.peak_rss >> 20} MiB"
    )


@pytest.mark.parametrize("trail", ["dev-zero", "long"])
async def test_the_console_says_what_it_did_not_read_of_the_trail(
    twin: TwinHost, config: HostConfig, tmp_path: Path, trail: str
) -> None:
    """The console (headless) on the twin: a trail linked to /dev/zero is refused in one toast (it showed
    nothing and said nothing), and a trail longer than the tail read says that its older entries were left
    out (it showed the tail as if it were the whole trail)."""
    from console.tui.app import ConsoleApp, HostEntry

    path = _trail(twin, config)
    if trail == "dev-zero":
        path.symlink_to("/dev/zero")
        words = "not a regular file"
    else:
        write_trail(path, 2 * AUDIT_TAIL_BYTES)
        words = "the older ones left out"
    entry = HostEntry(twin.name, config=config, simulated=True)
    app = ConsoleApp([entry], target=200_000, target_source="test")
    told: list[str] = []
    shown = app.notify

    def notify(message: str, *args: object, **kw: object) -> None:
        told.append(str(message))
        shown(message, *args, **kw)  # type: ignore[arg-type]

    app.notify = notify  # type: ignore[method-assign]
    async with app.run_test(size=(160, 48)) as pilot:
        deadline = time.monotonic() + 30
        while not any(words in m for m in told):
            assert time.monotonic() < deadline, told
            await pilot.pause(0.2)
    assert sum(words in m for m in told) == 1, told  # said once, not at every poll
