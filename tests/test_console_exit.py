"""A console that dies of an exception exits non-zero and says, in one sentence, where its traceback is
(before, every crash of the console exited 0: markup from a host, a date, a NaN)."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Static

from console.cli.cmd_console import run_console


class _Breaks(App[None]):
    def compose(self) -> ComposeResult:
        yield Static("about to break")

    def on_mount(self) -> None:
        raise ValueError("year 10000 is out of range")


class _Quits(App[None]):
    def on_mount(self) -> None:
        self.exit()


def test_a_console_that_dies_of_an_exception_exits_1_and_names_its_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_console(_Breaks(), tmp_path / "logs", headless=True)
    err = capsys.readouterr().err
    assert code == 1
    line = next(ln for ln in err.splitlines() if ln.startswith("k26-console: the console stopped"))
    assert "ValueError: year 10000 is out of range" in line
    logs = list((tmp_path / "logs").glob("crash-*.log"))
    assert len(logs) == 1 and str(logs[0]) in line
    text = logs[0].read_text()
    assert "Traceback" in text and "raise ValueError" in text
    assert oct(logs[0].stat().st_mode & 0o777) == "0o600"


def test_a_console_that_quits_exits_0_and_writes_no_log(tmp_path: Path) -> None:
    assert run_console(_Quits(), tmp_path / "logs", headless=True) == 0
    assert not (tmp_path / "logs").exists()
