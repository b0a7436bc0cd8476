"""The demo is a sandbox (issue 18, point 3) and `scripts/demo` installs once (point 9)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

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
