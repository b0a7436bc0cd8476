"""`k26-console parse`: JSON lines, the table, --kinds, stdin, and one-sentence errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from console.cli.main import main

SEED = "seed-restart-mfs094.journal"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["parse", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_done_when_check(corpus_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, str(corpus_dir / SEED), "--json")
    assert (code, err) == (0, "")
    events = [json.loads(line) for line in out.splitlines()]
    (summary,) = [e for e in events if e["kind"] == "pool_summary"]
    assert summary["max_total_num_tokens"] == 218484 and summary["tp_rank"] == 0
    ends = [e for e in events if e["kind"] == "memory_pool_end"]
    assert [e["avail_mem_gb"] for e in ends] == [4.38, 4.38]
    assert all("dp_rank" not in e for e in events)  # None fields are left out, `kind` is kept


def test_table_is_aligned(corpus_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, str(corpus_dir / SEED))
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["TIME", "HOST", "RANK", "KIND", "DETAIL"]
    assert len(rows) == 3
    col = header.index("KIND")
    assert all(row[col:].split()[0] in ("memory_pool_end", "pool_summary") for row in rows)
    assert rows[2].startswith("2026-05-30 22:14:46 dflash-train")
    assert "max_total_num_tokens=218484" in rows[2] and "TP0" in rows[2]


def test_kinds_filter(corpus_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys, str(corpus_dir / "public" / "case-01.log"), "--json", "--kinds", "error, pool_summary"
    )
    assert code == 0
    kinds = [json.loads(line)["kind"] for line in out.splitlines()]
    assert kinds == ["error", "error"]


def test_unknown_kind_is_one_sentence(corpus_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, str(corpus_dir / SEED), "--kinds", "pool,error")
    assert code == 2 and out == ""
    assert err.startswith("k26-console: unknown event kind 'pool'") and err.count("\n") == 1
    code, _, err = _run(capsys, str(corpus_dir / SEED), "--kinds", " , ")
    assert code == 2 and "at least one event kind" in err


def test_missing_file_and_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, str(tmp_path / "nope.journal"))
    assert (code, out) == (2, "")
    assert err == f"k26-console: no such file: {tmp_path / 'nope.journal'}.\n"
    code, _, err = _run(capsys, str(tmp_path))
    assert code == 2 and "is a directory" in err and "Traceback" not in err


def test_stdin_dash_and_default(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    data = b"[2026-05-30 22:00:23 TP1] Memory pool end. avail mem=4.38 GB\nnot valid \xff utf-8\n"
    for argv in (["-", "--json"], ["--json"]):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
        code, out, _ = _run(capsys, *argv)
        assert code == 0
        first, second = (json.loads(line) for line in out.splitlines())
        assert (first["kind"], first["avail_mem_gb"], first["tp_rank"]) == ("memory_pool_end", 4.38, 1)
        assert second["kind"] == "log" and "\ufffd" in second["message"]


def test_journal_json_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entry = {
        "__CURSOR": "s=1;i=2",
        "__REALTIME_TIMESTAMP": "1780179284000000",
        "_PID": "10990",
        "_HOSTNAME": "gpu7",
        "MESSAGE": "[2026-05-30 22:14:46 TP0] max_total_num_tokens=218484, context_len=200000",
    }
    path = tmp_path / "j.json"
    path.write_text(json.dumps(entry) + "\n")
    code, out, _ = _run(capsys, str(path), "--json")
    (event,) = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert (event["kind"], event["cursor"], event["host"], event["max_total_num_tokens"]) == (
        "pool_summary",
        "s=1;i=2",
        "gpu7",
        218484,
    )


def test_console_script_end_to_end(corpus_dir: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "console.cli.main",
            "parse",
            str(corpus_dir / SEED),
            "--json",
            "--kinds",
            "pool_summary",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["max_total_num_tokens"] == 218484
    bad = subprocess.run(
        [sys.executable, "-m", "console.cli.main", "parse", "/nonexistent/x.journal"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and bad.stderr == "k26-console: no such file: /nonexistent/x.journal.\n"
