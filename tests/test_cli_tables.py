"""The command line's tables and phase lines (issue 18 point 6): drawn by rich with colour on a terminal,
plain aligned text when piped, the same columns either way; --json unchanged."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from console.cli.hostchange import Printer
from console.core.apply import ApplyProgress
from tests.support.cli import CLI, operator_env, run_cli

ESC = "\x1b["
SHIPPED = ["ctx-32k", "ctx-128k", "ctx-200k", "ctx-256k"]


def _columns(line: str) -> list[str]:
    return re.split(r" {2,}", line.strip())


def test_profiles_list_piped_is_a_plain_aligned_table(tmp_path: Path) -> None:
    res = run_cli(tmp_path, "profiles", "list", timeout=60)
    assert res.returncode == 0, res.stderr
    assert ESC not in res.stdout
    header, *rows = res.stdout.splitlines()
    assert _columns(header) == ["name", "target", "sglang", "verified pool", "verified", "origin"]
    assert [_columns(r)[0] for r in rows] == SHIPPED
    assert _columns(rows[2])[:2] == ["ctx-200k", "200,000"]
    # Aligned: the numbers end in one column, each column starts where its header does.
    ends = {r.index(_columns(r)[1]) + len(_columns(r)[1]) for r in rows}
    assert ends == {header.index("target") + len("target")}
    assert {r.index("v0.5") for r in rows} == {header.index("sglang")}
    assert all(line == line.rstrip() for line in res.stdout.splitlines())  # no trailing spaces
    # --json is the same document as before: a list of rows.
    data = json.loads(run_cli(tmp_path, "profiles", "list", "--json", timeout=60).stdout)
    assert [r["name"] for r in data] == SHIPPED and data[2]["target_context"] == 200_000


def _on_a_terminal(home: Path, *args: str, **env: str) -> str:
    """What `k26-console ARGS` writes to a terminal (a pseudo-terminal this test opened)."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [*CLI, *args],
            stdin=subprocess.DEVNULL,
            stdout=follower,
            stderr=subprocess.PIPE,
            env={**operator_env(home), "TERM": "xterm-256color", "COLUMNS": "120", **env},
        )
        os.close(follower)
        follower = -1
        chunks: list[bytes] = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed its side
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_profiles_list_on_a_terminal_has_colour_and_the_same_columns(tmp_path: Path) -> None:
    text = _on_a_terminal(tmp_path, "profiles", "list")
    assert ESC in text
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    header, *rows = plain.splitlines()
    assert _columns(header) == ["name", "target", "sglang", "verified pool", "verified", "origin"]
    assert [_columns(r)[0] for r in rows] == SHIPPED
    # NO_COLOR is honoured on a terminal too.
    assert ESC not in _on_a_terminal(tmp_path, "profiles", "list", NO_COLOR="1")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _phase(phase: str, label: str, message: str | None = None) -> ApplyProgress:
    return ApplyProgress(phase=phase, label=label, message=message, elapsed_s=12.5, durations={})


@pytest.mark.parametrize("terminal", [True, False])
def test_phase_lines_are_coloured_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch, terminal: bool) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    stream = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stdout", stream)
    printer = Printer(False)
    printer(_phase("loading_weights", "loading weights"))
    printer(_phase("failed", "failed", "CUDA out of memory \x1b]0;pwned\x07"))
    text = stream.getvalue()
    assert ("\x1b[" in text) is terminal
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    assert plain.splitlines() == [
        "    12.5 s  loading weights",
        "    12.5 s  failed",
        "            CUDA out of memory ␛]0;pwned␇",  # the host's words drawn safe, coloured or not
    ]
    assert "\x1b]" not in text and "\x07" not in text
