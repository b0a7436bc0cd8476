"""The demo is a sandbox (issue 18, point 3) and `scripts/demo` installs once (point 9)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli import operator_env, profile_variant, wait_until
from tests.support.tmux import PANE_SIZE

REPO = Path(__file__).resolve().parent.parent


def _demo_checkout(root: Path) -> Path:
    """`scripts/demo` in a checkout of its own whose `scripts/bootstrap` stands in for pip: it counts its
    runs and installs an entry point that prints its arguments (the script under test is the real one)."""
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(REPO / "scripts" / "demo", root / "scripts" / "demo")
    shutil.copy2(REPO / "pyproject.toml", root / "pyproject.toml")
    bootstrap = root / "scripts" / "bootstrap"
    bootstrap.write_text(
        "#!/usr/bin/env bash\n"
        "set -euo pipefail\n"
        'cd "$(dirname "$0")/.."\n'
        "echo installed >> installs\n"
        "mkdir -p .venv/bin\n"
        f"ln -sf {sys.executable} .venv/bin/python\n"
        "printf '#!/bin/sh\\necho \"k26-console $*\"\\n' > .venv/bin/k26-console\n"
        "chmod +x .venv/bin/k26-console\n"
    )
    bootstrap.chmod(0o755)
    return root


def _run_demo(root: Path) -> str:
    res = subprocess.run(
        [str(root / "scripts" / "demo"), "--time-scale", "0.5"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def _installs(root: Path) -> int:
    path = root / "installs"
    return len(path.read_text().split()) if path.exists() else 0


def test_scripts_demo_installs_once_and_again_only_when_needed(tmp_path: Path) -> None:
    root = _demo_checkout(tmp_path / "checkout")
    assert _run_demo(root) == "k26-console demo --time-scale 0.5\n"
    assert _installs(root) == 1
    for _ in range(2):
        assert _run_demo(root) == "k26-console demo --time-scale 0.5\n"
    assert _installs(root) == 1, "scripts/demo reinstalled an unchanged package"
    # New dependencies or entry points: pyproject.toml changed, so once more.
    with (root / "pyproject.toml").open("a") as f:
        f.write("\n# a new dependency\n")
    _run_demo(root)
    _run_demo(root)
    assert _installs(root) == 2
    # A .venv that lost its entry point, or whose python is gone, is installed again.
    (root / ".venv" / "bin" / "k26-console").unlink()
    _run_demo(root)
    (root / ".venv" / "bin" / "python").unlink()
    _run_demo(root)
    assert _installs(root) == 4


# ---- the demo's own config, profiles and history -----------------------------------------------------


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(
        ["tmux", "-S", sock, *args], capture_output=True, text=True, check=False, timeout=30
    ).stdout


def _wait_screen(sock: str, predicate: Callable[[str], bool], timeout_s: float, what: str) -> str:
    screen = ""

    def shows() -> bool:
        nonlocal screen
        screen = _tmux(sock, "capture-pane", "-p")
        return predicate(screen)

    assert wait_until(shows, timeout_s, interval_s=0.2), f"the demo never showed {what}:\n{screen}"
    return screen


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its content: what the operator has, to compare before and after."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_demo_applies_and_verifies_in_its_sandbox_never_in_the_operators_dirs(tmp_path: Path) -> None:
    home = tmp_path / "operator"
    # The operator's own: a profile of theirs, a probe history, a restart history.
    (home / "config" / "k26-console" / "profiles").mkdir(parents=True, exist_ok=True)
    profile_variant(home / "config" / "k26-console" / "profiles", "mine-256k", fraction="0.9")
    (home / "state" / "k26-console").mkdir(parents=True)
    (home / "state" / "k26-console" / "probes.jsonl").write_text("")
    before = _tree(home)
    scratch = tmp_path / "tmp"  # the demo's TMPDIR: where its sandbox must be
    scratch.mkdir()
    rc = tmp_path / "rc"
    env = " ".join(f"{k}={v}" for k, v in operator_env(home).items() if k.startswith(("XDG_", "PYTHONPATH")))
    cmd = (
        PANE_SIZE
        + f"cd {REPO} && env {env} TMPDIR={scratch} TERM=xterm-256color {sys.executable} -m console.cli.main "
        f"demo --state-dir {tmp_path / 'twin'} --time-scale 0.02; echo $? > {rc}; sleep 30"
    )
    sock = str(tmp_path / "tmux.sock")  # a server of its own, its socket in the test's directory
    _tmux(sock, "new", "-d", "-x", "160", "-y", "48", cmd)
    try:
        screen = _wait_screen(sock, lambda s: "pool 101,134 tokens" in s, 60, "its first boot")
        assert "SIMULATED HOST" in screen and "SANDBOX" in screen.split("\n")[0], screen
        # W records into the sandbox (it wrote into the operator's state dir), and what it recorded is
        # kept when the demo ends, in a temporary directory of its own.
        _tmux(sock, "send-keys", "W")
        _wait_screen(sock, lambda s: "● REC" in s, 10, "the REC badge")
        _tmux(sock, "send-keys", "W")
        _wait_screen(sock, lambda s: "recording stopped" in s, 10, "the recording stopped")
        # The palette offers the shipped profiles, not the operator's own.
        _tmux(sock, "send-keys", "C-p")
        _wait_screen(sock, lambda s: "Search for commands" in s, 10, "the palette")
        _tmux(sock, "send-keys", "-l", "Apply profile")
        screen = _wait_screen(sock, lambda s: "Apply profile ctx-200k to twin" in s, 10, "the apply entries")
        assert "mine-256k" not in screen, screen
        _tmux(sock, "send-keys", "-l", " ctx-200k")
        _wait_screen(sock, lambda s: "Apply profile ctx-200k to twin" in s, 10, "ctx-200k")
        _tmux(sock, "send-keys", "Enter")
        _wait_screen(sock, lambda s: "Apply ctx-200k to twin?" in s, 30, "the apply confirmation")
        _tmux(sock, "send-keys", "y")
        # Verified: its [verified] table is written into the sandbox's copy of the profile.
        sandboxed = list(scratch.glob("k26-demo-*/operator/config"))
        assert len(sandboxed) == 1, sandboxed
        verified = sandboxed[0] / "k26-console" / "profiles" / "ctx-200k.toml"
        assert wait_until(lambda: verified.exists() and "[verified]" in verified.read_text(), 90), _tmux(
            sock, "capture-pane", "-p"
        )
        _tmux(sock, "send-keys", "q")
        assert wait_until(rc.exists, 30), _tmux(sock, "capture-pane", "-p")
        # An exit of 1 is the console dying of an error: the pane says which, the crash log has the rest.
        crashes = {str(p.relative_to(home)): p.read_text()[-4000:] for p in home.rglob("*.log")}
        assert rc.read_text().strip() == "0", (_tmux(sock, "capture-pane", "-p"), crashes)
        said = " ".join(_tmux(sock, "capture-pane", "-p").split())
    finally:
        _tmux(sock, "kill-server")
    assert _tree(home) == before, "the demo changed the operator's own config or history"
    # The sandbox is gone; the recording is kept where the demo said.
    (kept,) = list(scratch.iterdir())
    assert kept.name.startswith("k26-demo-recordings-"), kept
    (recording,) = list(kept.iterdir())
    assert recording.suffix == ".k26rec" and recording.stat().st_size > 0
    assert f"the recording made with W is kept in {kept}" in said, said
