"""scripts/bootstrap on a fresh machine: its apt-get waits for another apt's locks instead of failing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _stand_in(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


def test_apt_get_waits_for_the_dpkg_lock(tmp_path: Path) -> None:
    """A copy of the bootstrap runs with a PATH that holds no tmux or journalctl (so it must install them)
    and a stand-in apt-get that records its argv; `sudo` is a stand-in too where the test is not root.
    The copy's `.venv/bin/python` is a stand-in, so nothing is installed for real."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy2(REPO / "scripts" / "bootstrap", repo / "scripts" / "bootstrap")
    (repo / ".venv" / "bin").mkdir(parents=True)
    _stand_in(repo / ".venv" / "bin" / "python", "exit 0\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt-get.argv"
    _stand_in(bin_dir / "apt-get", f'printf "%s\\n" "$*" >> {log}\n')
    _stand_in(bin_dir / "sudo", 'exec "$@"\n')
    for tool in ("dirname", "id", "env"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)

    env = {k: v for k, v in os.environ.items() if k not in ("K26_APT_LOCK_TIMEOUT_S",)}
    env["PATH"] = str(bin_dir)
    done = subprocess.run(
        ["/bin/bash", str(repo / "scripts" / "bootstrap"), "--dev"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert [c.split()[2] for c in calls] == ["update", "install"], calls
    for call in calls:
        assert call.startswith("-o DPkg::Lock::Timeout="), call
        assert int(call.split()[1].split("=")[1]) >= 300, call
    assert "tmux" in calls[1] and "systemd" in calls[1]
