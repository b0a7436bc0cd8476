"""An interrupted or unrecordable apply (issue 20, items 2, 3 and 5), as an operator meets it on a twin.

- SIGINT, SIGHUP and SIGTERM in the middle of a boot: exit 128+N with one sentence, the lock and the
  heartbeat gone from the host, and the trail holding the intent and its `interrupted` outcome with the
  phase (the old apply exited 143 keeping the lock, and wrote nothing);
- SIGKILL: the intent stays alone, and `audit` shows it unfinished once its console is judged gone;
- a full disk under the state directory after the intent: the apply exits 1 saying its outcome is not
  recorded (it exited 0 with a warning);
- a full disk under the drop-in directory: the sentence names ENOSPC, not sudo.

The stalled boot is a profile whose program is `/bin/sh -c 'exec sleep N'` (forced with --yes): the twin
starts it and it never logs, so the apply sits in "launching". Signals go to the apply this test started,
in its own session, with SIGINT and SIGHUP set back to their defaults (a suite started in the background
inherits SIGINT ignored, and the apply rightly keeps an ignored signal ignored).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.twin.host import TwinHost
from tests.support.cli import CLI, lock_looks_stale, operator_env, profile_variant, wait_until


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwinHost]:
    # The simulated systemd: the full-disk tests mount a tmpfs over the twin's drop-in and state dirs, in
    # this machine's mount namespace; a real manager reads its unit files from a namespace of its own.
    host = TwinHost(tmp_path_factory.mktemp("interrupt-twin") / "state", time_scale=0.02, systemd="simulated")
    host.start_sync()
    try:
        yield host
    finally:
        host.stop_sync()


def _sleeper(tmp: Path, name: str, seconds: int) -> Path:
    return profile_variant(tmp, name, command=f'["/bin/sh", "-c", "exec sleep {seconds}", "sh"]')


def _defaults() -> None:
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


class Apply:
    """`k26-console apply` in its own session, its stdout read line by line on a thread."""

    def __init__(self, twin: TwinHost, home: Path, profile: Path, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [
                *CLI,
                "apply",
                "twin",
                str(profile),
                "--hosts",
                str(twin.hosts_toml),
                "--yes",
                "--confirm-within",
                "0",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=operator_env(home),
            start_new_session=True,
            preexec_fn=_defaults,  # resets two signal dispositions, nothing else
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_for(self, words: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                line = self.lines.get(timeout=0.1)
                self.seen.append(line)
                if words in line:
                    return
            assert self.proc.poll() is None or not self.lines.empty(), ("apply ended", "".join(self.seen))
        raise AssertionError(f"{words!r} not printed within {timeout} s: {''.join(self.seen)}")

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        rc = self.proc.wait(timeout)
        assert self.proc.stderr is not None
        return rc, self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def _state(twin: TwinHost) -> Path:
    return twin.layout.home_dir / ".k26-console"


def _presence(twin: TwinHost) -> list[str]:
    d = _state(twin) / "presence"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def _trail(twin: TwinHost) -> list[dict[str, object]]:
    path = _state(twin) / "audit.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().split("\n") if line.strip().startswith("{")]


def _audit(twin: TwinHost, home: Path) -> dict[str, object]:
    res = subprocess.run(
        [*CLI, "audit", "twin", "--hosts", str(twin.hosts_toml), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=operator_env(home),
    )
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT])
def test_a_signal_releases_the_lock_and_records_the_phase(
    twin: TwinHost, tmp_path: Path, sig: signal.Signals
) -> None:
    presence = _presence(twin)
    before = len(_trail(twin))
    apply = Apply(twin, tmp_path, _sleeper(tmp_path, f"sleep-{sig.name.lower()}", 600 + int(sig)))
    try:
        apply.wait_for("launching")
        assert (_state(twin) / "lock").exists()
        os.kill(apply.proc.pid, sig)
        rc, err = apply.finish(60)
    finally:
        apply.kill()
    assert rc == 128 + int(sig), (rc, err)
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert f"interrupted by {sig.name} in launching" in err and "the lock is released" in err, err
    # --confirm-within 0: no host-side rollback was armed, and the sentence does not claim one.
    assert "host-side rollback" not in err, err
    assert not (_state(twin) / "lock").exists()
    assert _presence(twin) == presence
    written = _trail(twin)[before:]
    assert [(e["outcome"], e["phase"]) for e in written] == [
        ("started", "started"),
        ("interrupted", "launching"),
    ]
    assert written[0]["op_id"] == written[1]["op_id"] and written[1]["signal"] == sig.name
    record = _audit(twin, tmp_path)["entries"][-1]  # type: ignore[index]
    assert record["outcome"] == "interrupted" and record["status"] == "finished"


def test_sigkill_leaves_an_intent_that_reads_as_unfinished_once_its_console_is_gone(
    twin: TwinHost, tmp_path: Path
) -> None:
    apply = Apply(twin, tmp_path, _sleeper(tmp_path, "sleep-killed", 700))
    try:
        apply.wait_for("launching")
        os.killpg(apply.proc.pid, signal.SIGKILL)
        apply.proc.wait(10)
    finally:
        apply.kill()
    assert _trail(twin)[-1]["outcome"] == "started"
    first = _audit(twin, tmp_path)["entries"][-1]  # type: ignore[index]
    assert first["profile"] == "sleep-killed" and first["status"] in ("in_progress", "unfinished")
    # Three missed 2 s heartbeats make the lock stale: waited for in the twin's files, then `audit` (a CLI
    # start each) is asked until it says so too.
    assert wait_until(lambda: lock_looks_stale(twin), 30, max_interval_s=0.2), "the lock never looked stale"
    deadline = time.monotonic() + 30
    while True:
        last = _audit(twin, tmp_path)["entries"][-1]  # type: ignore[index]
        if last["status"] == "unfinished":
            break
        assert time.monotonic() < deadline, last
        time.sleep(0.5)
    assert "UNFINISHED, interrupted" in last["note"] and "stale lock" in last["note"]
    # the host is handed back: the stale lock is removed as a break would
    (_state(twin) / "lock").unlink()


@contextlib.contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A small tmpfs over `where` (its files copied in first), unmounted afterwards with them put back."""
    keep = where.parent / f".{where.name}.keep"
    existed = where.exists()
    if existed:
        where.rename(keep)
    where.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)], check=True)
    try:
        if existed:
            subprocess.run(["cp", "-a", f"{keep}/.", str(where)], check=True)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        where.rmdir()
        if existed:
            keep.rename(where)


def _fill(fs: Path) -> None:
    """Every block of the file system at `fs` taken (the filler is removed with the tmpfs)."""
    subprocess.run(["dd", "if=/dev/zero", f"of={fs}/filler", "bs=4k"], capture_output=True, check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_full_disk_under_the_dropin_dir_is_named(twin: TwinHost, tmp_path: Path) -> None:
    hosts = ["--hosts", str(twin.hosts_toml)]
    dropins = twin.layout.unit_dir / f"{twin.unit}.d"
    with _tmpfs(dropins, "64k") as fs:
        _fill(fs)
        before = sorted(p.name for p in fs.iterdir())
        res = subprocess.run(
            [
                *CLI,
                "apply",
                "twin",
                # A fraction no other test here applies: whatever ran before, this apply has a drop-in
                # to write (with the one already running it would change nothing and exit 0).
                str(profile_variant(tmp_path, "full-dropin", fraction="0.92")),
                "--yes",
                "--confirm-within",
                "0",
                *hosts,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=operator_env(tmp_path),
            stdin=subprocess.DEVNULL,
        )
        after = sorted(p.name for p in fs.iterdir())
    assert res.returncode == 2, (res.stdout[-2000:], res.stderr)
    assert "No space left on device" in res.stderr and "ENOSPC" in res.stderr, res.stderr
    assert "sudo" not in res.stderr and "the host is unchanged" in res.stderr
    assert after == before  # no temporary file left


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_an_outcome_that_cannot_be_recorded_exits_non_zero(twin: TwinHost, tmp_path: Path) -> None:
    with _tmpfs(_state(twin), "1m") as fs:
        start = len(_trail(twin))
        apply = Apply(twin, tmp_path, profile_variant(tmp_path, "full-trail", fraction="0.94"))
        try:
            deadline = time.monotonic() + 60
            while not any(e["outcome"] == "started" for e in _trail(twin)[start:]):
                assert time.monotonic() < deadline and apply.proc.poll() is None, apply.seen
                time.sleep(0.02)
            # The disk fills while the boot runs: every free block, then the slack of the trail's last
            # page (blank, which readers pass over), so not one more byte fits anywhere.
            _fill(fs)
            trail = fs / "audit.jsonl"
            slack = -trail.stat().st_size % 4096
            with contextlib.suppress(OSError), trail.open("a") as fh:
                fh.write(" " * max(slack - 1, 0) + "\n")
            assert apply.proc.poll() is None, (
                "the apply ended before the disk filled: the twin boots too fast"
            )
            rc, err = apply.finish(240)
        finally:
            apply.kill()
        assert not (fs / "lock").exists()
    out = "".join(apply.seen) + "".join(apply.lines.queue)
    assert rc == 1, (rc, out[-2000:], err)
    assert "verified" in out or "failed" in out, out
    assert "outcome is NOT in the audit trail" in err and "started and unfinished" in err, err
    assert "Traceback" not in err and err.count("\n") == 1
