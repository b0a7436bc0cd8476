"""scripts/bootstrap on a fresh machine: its apt-get waits for another apt's locks instead of failing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HELD = "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 (apt-get)"


def _stand_in(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


def _bootstrap(tmp_path: Path, apt_get: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """A copy of the bootstrap, run with a PATH that holds no tmux or journalctl (so it must install
    them) and the stand-in `apt-get` given, which records its argv; `sudo` is a stand-in too where the test
    is not root. The copy's `.venv/bin/python` is a stand-in, so nothing is installed for real."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy2(REPO / "scripts" / "bootstrap", repo / "scripts" / "bootstrap")
    # --dev also caches the twin's SGLang wheel: a stand-in here, nothing is downloaded.
    _stand_in(repo / "scripts" / "fetch-sglang-wheel", "exit 0\n")
    (repo / ".venv" / "bin").mkdir(parents=True)
    _stand_in(repo / ".venv" / "bin" / "python", "exit 0\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt-get.argv"
    _stand_in(bin_dir / "apt-get", f'printf "%s\\n" "$*" >> {log}\n' + apt_get)
    _stand_in(bin_dir / "sudo", 'exec "$@"\n')
    for tool in ("dirname", "id", "env", "grep", "sleep", "wc", "cat"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    env = {k: v for k, v in os.environ.items() if not k.startswith("K26_APT_")}
    env.update(PATH=str(bin_dir), K26_APT_RETRY_S="0.1", APT_CALLS=str(log))
    done = subprocess.run(
        ["/bin/bash", str(repo / "scripts" / "bootstrap"), "--dev"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    return done, log.read_text().splitlines() if log.exists() else []


def test_apt_get_waits_for_the_dpkg_lock_and_retries_the_lists_lock(tmp_path: Path) -> None:
    # The first `update` meets another apt's lists lock (which DPkg::Lock::Timeout does not cover).
    first_update_held = (
        f'if [ "$3" = update ] && [ "$(wc -l < "$APT_CALLS")" = 1 ]; then echo "{HELD}" >&2; exit 100; fi\n'
    )
    done, calls = _bootstrap(tmp_path, first_update_held)
    assert done.returncode == 0, done.stderr
    assert [c.split()[2] for c in calls] == ["update", "update", "install"], calls
    for call in calls:
        assert call.startswith("-o DPkg::Lock::Timeout="), call
        assert int(call.split()[1].split("=")[1]) >= 300, call
    assert "tmux" in calls[2] and "systemd" in calls[2]
    assert "another apt holds its lock" in done.stderr


def test_an_apt_error_that_is_no_lock_fails_at_once_with_apts_words(tmp_path: Path) -> None:
    done, calls = _bootstrap(tmp_path, 'echo "E: Unable to locate package tmux" >&2; exit 100\n')
    assert done.returncode != 0
    assert len(calls) == 1 and "E: Unable to locate package tmux" in done.stderr
