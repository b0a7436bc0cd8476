"""`k26-console parse` for a person at a terminal: a `rich` table, streamed batch by batch, with every
journal-borne text drawn safe; piped, the plain columns (`tests/test_cli_parse.py`) and `--json` stay."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path

from tests.support.cli import CLI, operator_env

SEED = "seed-restart-mfs094.journal"
_SGR = re.compile(r"\x1b\[[0-9;]*m")


def _on_a_terminal(tmp_path: Path, *args: str, columns: int = 160, timeout: float = 60) -> str:
    """The command's output as a terminal of `columns` shows it (its stdout is a pty)."""
    main, side = pty.openpty()
    env = {**operator_env(tmp_path), "COLUMNS": str(columns), "LINES": "50", "TERM": "xterm-256color"}
    proc = subprocess.Popen([*CLI, *args], stdin=subprocess.DEVNULL, stdout=side, stderr=side, env=env)
    os.close(side)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.5)
            if ready:
                try:
                    data = os.read(main, 65536)
                except OSError:  # EIO: the child closed its side
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=max(1.0, deadline - time.monotonic())) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main)
    return b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")


def test_a_terminal_gets_a_rich_table(corpus_dir: Path, tmp_path: Path) -> None:
    raw = _on_a_terminal(tmp_path, "parse", str(corpus_dir / SEED))
    assert _SGR.search(raw), "no styling: not the rich table"
    text = _SGR.sub("", raw)
    lines = [line for line in text.split("\n") if line.strip()]
    header = next(line for line in lines if "KIND" in line)
    assert header.split() == ["TIME", "HOST", "RANK", "KIND", "DETAIL"]
    rows = [line for line in lines if "dflash-train" in line]
    assert len(rows) == 3
    (summary,) = [row for row in rows if "pool_summary" in row]
    assert summary.lstrip().startswith("2026-05-30 22:14:46") and "TP0" in summary
    assert "max_total_num_tokens=218484" in summary
    # Columns line up: every row's KIND starts where the header's does.
    col = header.index("KIND")
    assert all(row[col:].split()[0] in ("memory_pool_end", "pool_summary") for row in rows)


def test_the_terminal_table_draws_journal_text_safe(tmp_path: Path) -> None:
    journal = tmp_path / "evil.journal"
    journal.write_bytes(
        b"May 30 22:14:46 h\x1b]0;owned\x07ost python[1]: [2026-05-30 22:14:46 TP0] Memory pool end. "
        b"avail mem=4.38 GB\n"
        b"[2026-05-30 22:14:47] a message with \x1b[2J a clear-screen and [bold]markup[/bold]\n"
    )
    raw = _on_a_terminal(tmp_path, "parse", str(journal))
    assert "\x1b]" not in raw and "\x1b[2J" not in raw and "\x07" not in raw
    text = _SGR.sub("", raw)
    assert "[bold]markup[/bold]" in text  # shown as written, not read as rich markup
    assert "memory_pool_end" in text


def test_json_on_a_terminal_is_still_json_lines(corpus_dir: Path, tmp_path: Path) -> None:
    text = _on_a_terminal(tmp_path, "parse", str(corpus_dir / SEED), "--json", "--kinds", "pool_summary")
    (line,) = [line for line in text.split("\n") if line.strip()]
    assert line.startswith('{"ts":"2026-05-30T22:14:46"') and '"max_total_num_tokens":218484' in line


def test_piped_output_stays_plain_columns(corpus_dir: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [*CLI, "parse", str(corpus_dir / SEED)],
        capture_output=True,
        text=True,
        timeout=60,
        env=operator_env(tmp_path),
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert proc.returncode == 0 and "\x1b" not in proc.stdout
    assert proc.stdout.split("\n")[0].split() == ["TIME", "HOST", "RANK", "KIND", "DETAIL"]
