"""`verify HOST` and `parse HOST --follow` over SSH give what their `--journal` / FILE forms give on a
saved copy of the same journal (`journalctl -u UNIT -o json --all`, as the follower reads it)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from console.twin.host import TwinHost
from tests.support.cli import cli_process
from tests.support.twins import module_twin

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "console.cli.main"]


twin = module_twin("cli-twin", time_scale=0.002)


def _saved(twin: TwinHost, tmp_path: Path) -> Path:
    out = subprocess.run(
        [str(twin.layout.bin_dir / "journalctl"), "-u", twin.unit, "-o", "json", "--all", "--no-pager"],
        env=twin.session_env(),
        capture_output=True,
        check=True,
    ).stdout
    path = tmp_path / "saved.journal"
    path.write_bytes(out)
    return path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return cli_process(list(args), cwd=REPO, timeout=60)


def test_verify_host_matches_verify_journal(twin: TwinHost, tmp_path: Path) -> None:
    saved = _saved(twin, tmp_path)
    remote = _cli("verify", "twin", "--hosts", str(twin.hosts_toml), "--target-context", "100000", "--json")
    local = _cli("verify", "--journal", str(saved), "--target-context", "100000", "--json")
    assert remote.returncode == local.returncode and remote.returncode in (0, 1)
    from_host = json.loads(remote.stdout)
    # A host adds what only a host can tell: the commit-confirmed rollback armed there (none here).
    assert from_host.pop("pending_rollback") is None
    assert from_host == json.loads(local.stdout)
    assert "Traceback" not in remote.stderr


def test_verify_unknown_host_is_one_sentence(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.toml"
    hosts.write_text("")
    res = _cli("verify", "no-such-host.invalid", "--hosts", str(hosts), "--target-context", "1000")
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert res.stderr.startswith(
        f"k26-console: 'no-such-host.invalid' is not a host in {hosts} and does not resolve as a host name"
    )
    both = _cli("verify", "x", "--journal", "-", "--target-context", "1000")
    assert both.returncode == 2 and "not both" in both.stderr


def test_parse_follow_streams_what_parse_file_prints(twin: TwinHost, tmp_path: Path) -> None:
    saved = _saved(twin, tmp_path)
    expected = _cli("parse", str(saved), "--json").stdout.splitlines()
    proc = subprocess.Popen(
        [*CLI, "parse", "twin", "--follow", "--hosts", str(twin.hosts_toml), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    got: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        while len(got) < len(expected) and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            got.append(line.rstrip("\n"))
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert got == expected
    assert proc.returncode == 130 and "Traceback" not in err
