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


def _bootstrap(
    tmp_path: Path, apt_get: str, uv: str | None = None
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """A copy of the bootstrap, run with a PATH that holds no tmux or journalctl (so it must install
    them) and the stand-in `apt-get` given, which records its argv; `sudo` is a stand-in too where the test
    is not root. The copy's `.venv/bin/python` is a stand-in, so nothing is installed for real; it records
    its argv in `python.argv`, and a stand-in `.venv/bin/uv` with the body `uv` (when given) in `uv.argv`."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy2(REPO / "scripts" / "bootstrap", repo / "scripts" / "bootstrap")
    # --dev also caches the twin's SGLang wheel: a stand-in here, nothing is downloaded.
    _stand_in(repo / "scripts" / "fetch-sglang-wheel", "exit 0\n")
    (repo / ".venv" / "bin").mkdir(parents=True)
    _stand_in(repo / ".venv" / "bin" / "python", f'printf "%s\\n" "$*" >> {tmp_path / "python.argv"}\n')
    if uv is not None:
        _stand_in(repo / ".venv" / "bin" / "uv", f'printf "%s\\n" "$*" >> {tmp_path / "uv.argv"}\n' + uv)
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


def _argv(tmp_path: Path, name: str) -> list[str]:
    path = tmp_path / f"{name}.argv"
    return path.read_text().splitlines() if path.exists() else []


def test_uv_installs_the_project_and_pip_with_it(tmp_path: Path) -> None:
    done, _ = _bootstrap(tmp_path, "exit 0\n", uv="exit 0\n")
    assert done.returncode == 0, done.stderr
    assert _argv(tmp_path, "uv") == ["pip install -q --native-tls --python .venv/bin/python -e .[dev] pip"]
    # pip installed nothing: the stand-in python was only asked whether the venv has a pip
    assert [a for a in _argv(tmp_path, "python") if "install" in a] == []


def test_pip_installs_the_project_when_uv_cannot(tmp_path: Path) -> None:
    done, _ = _bootstrap(tmp_path, "exit 0\n", uv='echo "error: Failed to fetch" >&2; exit 2\n')
    assert done.returncode == 0, done.stderr
    assert "uv could not install the project; pip does" in done.stderr
    assert _argv(tmp_path, "python")[-1] == "-m pip install -q -e .[dev]"


def test_pip_installs_the_project_where_uv_could_not_be_had(tmp_path: Path) -> None:
    # No uv in the venv, and the stand-in pip's `install uv` makes none: pip installs, and says nothing.
    done, _ = _bootstrap(tmp_path, "exit 0\n")
    assert done.returncode == 0, done.stderr
    calls = _argv(tmp_path, "python")
    assert "-m pip install -q uv>=0.9" in calls
    assert calls[-1] == "-m pip install -q -e .[dev]"
    assert "uv could not" not in done.stderr
