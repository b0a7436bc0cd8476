"""The wheel works wherever it is installed: it carries the stylesheets and the shipped profiles inside
the package, so a fresh venv outside the repository, or the package unpacked into another folder, finds
them (they used to be found through the repository root or `sys.prefix/share`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHIPPED_PROFILES = sorted(p.stem for p in (REPO / "profiles").glob("*.toml"))


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / "config"), XDG_STATE_HOME=str(home / "state"))
    return env


def _run(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
    return done


def _install(args: list[str], cwd: Path, env: dict[str, str]) -> None:
    """`pip install ARGS` as uv runs it, where scripts/bootstrap put uv beside this interpreter (~1 s and
    0.8 s of CPU for the venv's install, pip's ~11 s and 10.7 s), else, or where uv fails (no route to its
    index), pip's own. uv's cache is the operator's (the clean HOME would start an empty one)."""
    uv = Path(sys.executable).parent / "uv"
    if uv.is_file() and os.access(uv, os.X_OK):
        where = subprocess.run([str(uv), "cache", "dir"], capture_output=True, text=True, check=False)
        uv_env = {**env, "UV_CACHE_DIR": where.stdout.strip()} if where.returncode == 0 else env
        done = subprocess.run(
            [str(uv), "pip", "install", "-q", "--native-tls", *args],
            cwd=cwd,
            env=uv_env,
            capture_output=True,
            text=True,
            timeout=600,
            stdin=subprocess.DEVNULL,
        )
        if done.returncode == 0:
            return
    _run([sys.executable, "-m", "pip", "install", "-q", *args], cwd, env, timeout=600)


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, check=False).stdout


@pytest.mark.slow
def test_the_wheel_installed_outside_the_repository_finds_its_styles_and_profiles(tmp_path: Path) -> None:
    # The sources the wheel is built from, copied out so the build leaves nothing in the checkout.
    src = tmp_path / "k26-src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for name in ("console", "styles", "profiles"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _clean_env(tmp_path / "home")
    dist = tmp_path / "dist"
    # `./`-less paths would be read as names on the package index: pass absolute ones.
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(src)], elsewhere, env
    )
    (wheel,) = dist.glob("k26_console-*.whl")
    # Every file of the package (a module or a package added later included), and the two mapped folders.
    wanted = {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "console").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    wanted |= {f"console/shipped/styles/{p.name}" for p in (REPO / "styles").glob("*.tcss")}
    wanted |= {f"console/shipped/profiles/{p.name}" for p in (REPO / "profiles").glob("*.toml")}
    with zipfile.ZipFile(wheel) as zf:
        assert wanted - set(zf.namelist()) == set()
    # scripts/demo showed setuptools' "`project.license` as a TOML table is deprecated" three times.
    assert "deprecated" not in built.stderr and "Warning" not in built.stderr, built.stderr
    venv = tmp_path / "venv"
    # No pip of its own (ensurepip costs 2.4 s of CPU): uv, or this venv's pip, installs into it (`--python`).
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], elsewhere, env)
    _install(["--python", str(venv / "bin" / "python"), str(wheel)], elsewhere, env)

    listed = _run([str(venv / "bin" / "k26-console"), "profiles", "list"], elsewhere, env).stdout
    for name in SHIPPED_PROFILES:
        assert any(
            line.split()[:1] == [name] and line.rstrip().endswith("shipped") for line in listed.splitlines()
        ), listed

    # The same wheel unpacked into another folder (as `pip install --target`, pipx's or a --user site):
    # its stylesheets are found beside its code, not under the interpreter's prefix.
    target = tmp_path / "unpacked"
    _install(["--no-deps", "--target", str(target), str(wheel)], elsewhere, env)
    where = _run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "from console.tui.app import css_paths; print(*css_paths(), sep='\\n')",
        ],
        elsewhere,
        {**env, "PYTHONPATH": str(target)},
    ).stdout
    assert [Path(p).name for p in where.split()] == ["console.tcss"]
    assert all(Path(p).is_relative_to(target) for p in where.split()), where

    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed: the demo's first screen is not checked")
    sock = f"k26-wheel-{os.getpid()}"
    rc_file = tmp_path / "rc"
    demo = (
        f"{venv / 'bin' / 'k26-console'} demo --state-dir {tmp_path / 'twin'}; echo $? > {rc_file}; sleep 5"
    )
    tmux_env = [
        f"{k}={v}" for k, v in env.items() if k in ("HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "PATH")
    ]
    _tmux(
        sock,
        "new",
        "-d",
        "-x",
        "160",
        "-y",
        "48",
        "-c",
        str(elsewhere),
        "env",
        "-u",
        "PYTHONPATH",
        *tmux_env,
        "bash",
        "-c",
        demo,
    )
    try:
        deadline = time.monotonic() + 45
        screen = ""
        while time.monotonic() < deadline:
            screen = _tmux(sock, "capture-pane", "-p")
            # The panels' rounded borders and their titles come from styles/console.tcss.
            if "SIMULATED HOST" in screen and "╭─ GPUs" in screen and "GPU7" in screen:
                break
            time.sleep(0.3)
        else:
            raise AssertionError(f"the demo's first screen never showed its styled panels:\n{screen}")
        _tmux(sock, "send-keys", "q")
        deadline = time.monotonic() + 20
        while not rc_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert rc_file.read_text().strip() == "0"
    finally:
        _tmux(sock, "kill-server")
