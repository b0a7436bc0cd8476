"""`k26-console apply` as an operator runs it, against twins over SSH on loopback.

- every bad input (unknown flag, bad TOML with its line number, unknown host, unwritable drop-in dir, no
  terminal and no --yes) is one sentence on stderr, exit 2, and the host exactly as it was (the drop-in
  directory's files and the unit's invocation compared before and after);
- a profile the planner refuses is exit 1 without --yes, the host untouched;
- the issue's Done-when: `k26-console twin` registers itself in the operator's hosts.toml (keeping what
  was there), and `k26-console apply twin ctx-200k --rollback-on-failure` then ends verified in one
  restart, printing the phase timings.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.twin.host import TwinHost
from tests.support.cli import CLI, CTX200K, cli_process, operator_env, wait_until
from tests.support.twins import module_twin

TIME_SCALE = 0.002


twin = module_twin("cli-twin", time_scale=TIME_SCALE)


def _apply(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return cli_process(["apply", *args], env=operator_env(home), timeout=timeout)


def _host_state(twin: TwinHost) -> tuple[dict[str, str], str]:
    _settled(twin)
    d = twin.layout.unit_dir / f"{twin.unit}.d"
    files = {p.name: p.read_text() for p in sorted(d.iterdir())} if d.is_dir() else {}
    return files, twin.systemctl("show", "-p", "InvocationID,ActiveState,ExecStart", twin.unit).stdout


def _one_sentence(res: subprocess.CompletedProcess[str], code: int) -> str:
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("k26-console: ") and lines[0].endswith("."), res.stderr
    return lines[0]


def _profile(tmp: Path, name: str, text: str) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(text)
    return path


def test_unknown_flag(twin: TwinHost, tmp_path: Path) -> None:
    before = _host_state(twin)
    bad = CTX200K.replace('name = "ctx-200k"', 'name = "typo"').replace(
        "chunked-prefill-size = 8192", "chunked-prefil-sise = 8192"
    )
    res = _apply(
        tmp_path, "twin", str(_profile(tmp_path, "typo", bad)), "--yes", "--hosts", str(twin.hosts_toml)
    )
    line = _one_sentence(res, 2)
    assert "--chunked-prefil-sise" in line and "typo" in line
    assert _host_state(twin) == before


def test_bad_toml_names_its_line(twin: TwinHost, tmp_path: Path) -> None:
    before = _host_state(twin)
    broken = CTX200K.replace('name = "ctx-200k"', 'name = "broken"').replace("tp-size = 8", "tp-size = = 8")
    line_no = broken.splitlines().index("tp-size = = 8") + 1
    path = _profile(tmp_path, "broken", broken)
    res = _apply(tmp_path, "twin", str(path), "--yes", "--hosts", str(twin.hosts_toml))
    line = _one_sentence(res, 2)
    assert f"line {line_no}" in line and "not valid TOML" in line
    assert _host_state(twin) == before


def test_unknown_host(twin: TwinHost, tmp_path: Path) -> None:
    before = _host_state(twin)
    res = _apply(tmp_path, "twni", "ctx-200k", "--yes", "--hosts", str(twin.hosts_toml))
    line = _one_sentence(res, 2)
    assert "'twni'" in line and "known: twin" in line
    assert _host_state(twin) == before


def test_no_terminal_and_no_yes(twin: TwinHost, tmp_path: Path) -> None:
    before = _host_state(twin)
    res = _apply(tmp_path, "twin", "ctx-200k", "--hosts", str(twin.hosts_toml))
    line = _one_sentence(res, 2)
    assert "--yes" in line and "no terminal" in line
    assert "~ --mem-fraction-static 0.85 → 0.93" in res.stdout  # the preview came first
    assert _host_state(twin) == before


def test_planner_refusal_without_yes_is_exit_1(twin: TwinHost, tmp_path: Path) -> None:
    before = _host_state(twin)
    tight = CTX200K.replace('name = "ctx-200k"', 'name = "tight"').replace(
        "mem-fraction-static = 0.93", "mem-fraction-static = 0.97"
    )
    res = _apply(tmp_path, "twin", str(_profile(tmp_path, "tight", tight)), "--hosts", str(twin.hosts_toml))
    line = _one_sentence(res, 1)
    assert "planner refuses tight" in line and "--yes applies it anyway" in line
    assert _host_state(twin) == before


@contextlib.contextmanager
def _unwritable(d: Path) -> Iterator[None]:
    """A directory nobody can create files in: mode 555, and for root (who ignores modes) immutable."""
    d.chmod(0o555)
    immutable = False
    try:
        if os.geteuid() == 0:
            res = subprocess.run(["chattr", "+i", str(d)], capture_output=True, text=True, check=False)
            if res.returncode != 0:
                pytest.skip(
                    f"root ignores directory modes and chattr +i is not allowed here: {res.stderr.strip()}"
                )
            immutable = True
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(d)], check=False)
        d.chmod(0o755)


def test_unwritable_dropin_dir(twin: TwinHost, tmp_path: Path) -> None:
    d = twin.layout.unit_dir / f"{twin.unit}.d"
    d.mkdir(exist_ok=True)
    try:
        before = _host_state(twin)
        with _unwritable(d):
            res = _apply(tmp_path, "twin", "ctx-200k", "--yes", "--hosts", str(twin.hosts_toml))
            after = _host_state(twin)
        line = _one_sentence(res, 2)
        assert f"cannot create a temporary file in the drop-in directory {d} on twin" in line
        assert "the host is unchanged" in line and "sudo = true" in line
        assert after == before
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_done_when_twin_registers_and_apply_verifies(tmp_path: Path) -> None:
    """`k26-console twin` as the README starts it, then `apply twin ctx-200k --rollback-on-failure`."""
    home = tmp_path / "home"
    hosts = home / "config" / "k26-console" / "hosts.toml"
    hosts.parent.mkdir(parents=True)
    hosts.write_text('# my GPU hosts\n[hosts.gpu1]\nssh = "gpu1"   # the big one\nunit = "sglang"\n')
    proc = subprocess.Popen(
        [*CLI, "twin", "--state-dir", str(tmp_path / "twin"), "--time-scale", str(TIME_SCALE)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=operator_env(home),
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline().strip() for _ in range(3)]
        assert lines[2].startswith(f"registered as host 'twin' in {hosts}"), lines
        text = hosts.read_text()
        assert text.startswith("# my GPU hosts\n") and 'ssh = "gpu1"   # the big one' in text
        data = tomllib.loads(text)["hosts"]
        assert set(data) == {"gpu1", "twin"} and data["twin"]["unit_dir"].endswith("/etc/systemd/system")

        # The prompt is the terminal's; --yes stands in for the operator's "y".
        res = _apply(home, "twin", "ctx-200k", "--rollback-on-failure", "--yes", timeout=180)
        assert res.returncode == 0, (res.stdout, res.stderr)
        out = res.stdout
        assert "~ --mem-fraction-static 0.85 → 0.93" in out
        assert "verified: pool " in out and "≥ 200,000" in out
        assert "phase timings" in out
        for label in ("loading weights", "KV pool", "CUDA graphs", "restart"):
            assert f"  {label}" in out
        assert "rollback:" not in out
        # Verified numbers go into the user's copy of the shipped profile; the shipped one is untouched.
        copy = home / "config" / "k26-console" / "profiles" / "ctx-200k.toml"
        assert tomllib.loads(copy.read_text())["verified"]["pool_tokens"] >= 200_000
        assert tomllib.loads(CTX200K).get("verified", {}) == {}
    finally:
        proc.send_signal(2)
        proc.wait(60)
    assert proc.returncode == 0


def test_profiles_validate_includes_the_planner_verdict(twin: TwinHost, tmp_path: Path) -> None:
    def validate(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, "profiles", "validate", *args, "--host", "twin", "--hosts", str(twin.hosts_toml)],
            capture_output=True,
            text=True,
            timeout=60,
            env=operator_env(tmp_path),
        )

    ok = validate("ctx-200k")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "planner (exact calibration)" in ok.stdout and ": fits." in ok.stdout
    tight = CTX200K.replace('name = "ctx-200k"', 'name = "tight"').replace(
        "mem-fraction-static = 0.93", "mem-fraction-static = 0.97"
    )
    refused = validate(str(_profile(tmp_path, "tight", tight)))
    assert refused.returncode == 1
    assert "refused:" in refused.stdout and "2.5" in refused.stdout and "GiB of headroom" in refused.stdout
    # ...and its last word is the refusal: "tight is valid" under it read as a yes (issue 34)
    assert "is valid" not in refused.stdout
    assert refused.stdout.splitlines()[-1] == (
        "tight is refused: its flags are valid for SGLang v0.5.12.post1, but the planner says it does not "
        "fit on twin (apply takes it only with --yes)."
    )


def _settled(twin: TwinHost) -> None:
    """Wait out a unit still between states (an earlier apply's ExecStartPost= health wait keeps it
    "activating" after the server's ready line): "active" against "activating" is not a change, while a
    restart shows in the InvocationID compared beside it."""
    moving = ("activating\n", "deactivating\n", "reloading\n")
    assert wait_until(lambda: twin.systemctl("is-active", twin.unit, check=False).stdout not in moving, 60), (
        twin.systemctl("status", twin.unit, check=False).stdout
    )
