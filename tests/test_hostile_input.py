"""Issue 20 items 3-5: hostile text never reaches the terminal raw, lines are split on "\\n" only, and bad
input (huge numbers, empty strings, a missing terminal, a host never reached, an endless line) is one
sentence and exit 2, never a traceback or a hang.

Every CLI run here is either in process (`main([...])` with capsys) or a subprocess with a deadline; the
only network is 127.0.0.1 and names under the reserved `.invalid` TLD, which never resolve.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from console.core.capacity import CapacityError, Observation, PoolConfig, calibrate
from console.core.models import get_model
from console.core.probe import ProbeReport, ProbeResult, ProbeStatus, ProbeTarget, ServerLimits
from console.core.text import (
    CONTROL_PICTURES,
    LineSplitter,
    cut_note,
    json_safe,
    split_lines,
    terminal_safe,
)
from tests.support.cli import CLI, REPO, cli_process
from tests.support.cli import run_main as run

# The hostile strings of the issue: an OSC retitle ended by BEL, a CSI clear screen, a bare CR that
# would overwrite the line, U+2028 (a line break for splitlines), the 8-bit CSI 0x9B (C1), NEL U+0085.
OSC_TITLE = "\x1b]0;pwned\x07"
HOSTILE = [OSC_TITLE, "\x1b[2J\x1b[H", "\x07", "ok\rFAKE", "a\u2028b", "\x9b31m", "x\x85y", "\x7f"]
EVIL = "".join(HOSTILE)


def raw_controls(text: str) -> list[str]:
    """The characters of `text` a terminal would act on (a line break between lines is fine)."""
    return [c for c in text if c != "\n" and ord(c) in CONTROL_PICTURES]


def one_sentence(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().split("\n")
    assert len(lines) == 1, err
    assert lines[0].startswith("k26-console: "), err
    assert not raw_controls(err), repr(err)
    return lines[0]


def cli(*args: str, cwd: Path = REPO, timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
    if not kw or kw == {"stdin": subprocess.DEVNULL}:
        return cli_process(list(args), env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=cwd, timeout=timeout)
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        **kw,  # type: ignore[arg-type]
    )


# ------------------------------------------------------------------ the sanitiser and the line splitter


@pytest.mark.parametrize("hostile", HOSTILE)
def test_terminal_safe_draws_every_hostile_string(hostile: str) -> None:
    safe = terminal_safe(hostile)
    assert not raw_controls(safe) and "\n" not in safe
    assert len(safe) == len(hostile)  # one picture per character: columns stay where they were


def test_json_safe_is_the_same_value_and_nothing_a_terminal_acts_on() -> None:
    document = json.dumps({"message": EVIL, "host": OSC_TITLE}, ensure_ascii=False, indent=2)
    assert raw_controls(document)  # json.dumps leaves DEL, C1 and U+2028 raw
    safe = json_safe(document)
    assert not raw_controls(safe)
    assert json.loads(safe) == json.loads(document)


def test_line_splitter_splits_on_newline_only_and_keeps_the_rest() -> None:
    data = "one\u2028still one\x85and\x1cone\rtqdm\r\ntwo\n".encode()
    splitter = LineSplitter()
    assert splitter.feed(data) == ["one\u2028still one\x85and\x1cone\rtqdm", "two"]
    assert split_lines(data.decode()) == ["one\u2028still one\x85and\x1cone\rtqdm", "two"]


def test_line_splitter_gives_the_same_lines_whatever_the_chunks() -> None:
    data = "α\nβγ\r\n\nlast without newline é".encode()
    whole = LineSplitter()
    expected = whole.feed(data) + whole.flush()
    for size in (1, 2, 3, 5):
        s = LineSplitter()
        got = [line for i in range(0, len(data), size) for line in s.feed(data[i : i + size])] + s.flush()
        assert got == expected == ["α", "βγ", "", "last without newline é"]


def test_a_line_over_the_limit_keeps_its_start_a_note_and_whole_characters() -> None:
    splitter = LineSplitter(limit=10)
    line = "é" * 20  # 40 bytes: the cut at byte 10 falls between two bytes of one character
    lines = [x for i in range(0, 44, 7) for x in splitter.feed((line + "\nnext\n").encode()[i : i + 7])]
    assert lines == ["é" * 5 + cut_note(40, 10), "next"]
    assert splitter.cut == 1


# ------------------------------------------------------------------ 4: nothing raw reaches the terminal


def test_an_error_sentence_quoting_a_hostile_path_is_drawn_safe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / f"journal{EVIL}")
    for argv in (
        ["verify", "--target-context", "1k", "--journal", missing],
        ["plan", "--target-context", "1k", "--journal", missing],
        ["parse", missing],
    ):
        code, out, err = run(argv, capsys)
        assert code == 2 and out == ""
        assert "␛]0;pwned␇" in one_sentence(err)


def test_argparse_messages_are_drawn_safe(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["plan", "--target-context", f"1{OSC_TITLE}"], capsys)
    assert code == 2
    one_sentence(err)


def _hostile_journal(path: Path) -> Path:
    entry = {
        "__CURSOR": "s=1",
        "_HOSTNAME": f"gpu{OSC_TITLE}",
        "SYSLOG_IDENTIFIER": "python3",
        "MESSAGE": f"[2025-11-30 10:00:00] hello {EVIL} end",
        "__REALTIME_TIMESTAMP": "1764496800000000",
    }
    text = (
        f"Nov 30 10:00:00 gpu{OSC_TITLE} python[1]: plain {EVIL} end\n"
        + json.dumps(entry, ensure_ascii=False)
        + "\n"
    )
    path.write_bytes(text.encode())
    return path


def test_parse_prints_hostile_journal_lines_drawn_safe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = _hostile_journal(tmp_path / "evil.journal")
    code, out, err = run(["parse", str(journal)], capsys)
    assert code == 0 and err == ""
    assert not raw_controls(out), repr(out)
    rows = out.rstrip("\n").split("\n")
    assert len(rows) == 3  # the header and one row per line: U+2028 and CR did not make rows
    assert "␛]0;pwned␇" in rows[1] and "␛]0;pwned␇" in rows[2]

    code, out, err = run(["parse", str(journal), "--json"], capsys)
    assert code == 0 and not raw_controls(out), repr(out)
    raws = [json.loads(line)["raw"] for line in out.rstrip("\n").split("\n")]
    assert len(raws) == 2 and all(EVIL in raw for raw in raws)  # the same text for a JSON reader


def _write_model_config(path: Path) -> Path:
    path.write_text(
        json.dumps(
            {
                "model_type": "kimi_k25",
                "text_config": {
                    "num_hidden_layers": 61,
                    "kv_lora_rank": 512,
                    "qk_rope_head_dim": 64,
                    "num_attention_heads": 64,
                },
            }
        )
    )
    return path


def test_plan_output_is_drawn_safe(
    tmp_path: Path, corpus_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The model's name comes from the config file's name; a hostile one must not retitle the window.
    config = _write_model_config(tmp_path / f"{EVIL}config.json")
    argv = [
        "plan",
        "--target-context",
        "200000",
        "--journal",
        str(corpus_dir / "seed-restart-ctx-only.journal"),
        "--model-config",
        str(config),
        "--mem-fraction-static",
        "0.85",
        "--gpu-mem-gib",
        "95.59",
    ]
    code, out, _ = run(argv, capsys)
    assert code in (0, 1) and "␛]0;pwned␇" in out
    assert not raw_controls(out), repr(out)
    code, out, _ = run([*argv, "--json"], capsys)
    assert not raw_controls(out), repr(out)
    assert EVIL in json.loads(out)["model"]


def test_verify_output_is_drawn_safe(
    tmp_path: Path, corpus_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = tmp_path / "evil.journal"
    seed = (corpus_dir / "seed-restart-mfs094.journal").read_bytes()
    journal.write_bytes(
        seed + f"Nov 30 23:59:59 gpu1 python3[1]: RuntimeError: CUDA out of memory {EVIL}\n".encode()
    )
    for extra in ([], ["--json"]):
        code, out, err = run(["verify", "--target-context", "1k", "--journal", str(journal), *extra], capsys)
        assert code in (0, 1)
        assert not raw_controls(out + err), repr(out + err)


def _report(host: str, *, model: str, gpu: str, error: str) -> ProbeReport:
    return ProbeReport(
        host=host,
        run_id="r1",
        started_at=datetime.now(UTC),
        target=ProbeTarget(host=host, model=model, gpu_name=gpu, gpu_count=8),
        limits=ServerLimits(),
        requested_tokens=32,
        results=[
            ProbeResult(depth=8000, requested_tokens=32, status=ProbeStatus.FAILED, error=error),
            ProbeResult(depth=16000, requested_tokens=32, status=ProbeStatus.FAILED, error=error),
        ],
    )


def test_probe_table_is_drawn_safe() -> None:
    from console.cli.cmd_probe import format_table
    from console.sources.probe import report_json

    report = _report(f"gpu{OSC_TITLE}", model=f"kimi{EVIL}", gpu=f"RTX{EVIL}", error=f"server said {EVIL}")
    table = format_table(report)
    assert "␛]0;pwned␇" in table and not raw_controls(table), repr(table)
    assert len(table.rstrip("\n").split("\n")) == 4  # the server's CR and U+2028 made no lines
    document = report_json(report)
    assert not raw_controls(document) and json.loads(document)["host"] == f"gpu{OSC_TITLE}"


def test_profiles_show_list_and_validate_are_drawn_safe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # TOML takes control characters only as escapes, which json.dumps writes the same way.
    notes = json.dumps(f"notes {EVIL} end")
    value = json.dumps(f"served{EVIL}")
    (tmp_path / "evil.toml").write_text(
        f'name = "evil"\ntarget_context = 200000\nsglang_version = "v0.5.12.post1"\nnotes = {notes}\n'
        f'[flags]\nmodel-path = "moonshotai/Kimi-K2.6"\nserved-model-name = {value}\n',
        encoding="utf-8",
    )
    for argv in (["show", "evil"], ["show", "evil", "--json"], ["list"], ["validate", "evil"]):
        code, out, err = run(["profiles", "--dir", str(tmp_path), *argv], capsys)
        assert not raw_controls(out + err), (argv, out + err)
    code, out, _ = run(["profiles", "--dir", str(tmp_path), "show", "evil"], capsys)
    assert code == 0 and "notes ␛]0;pwned␇" in out


# ------------------------------------------------------------------ 3: "\n" only, in files and hosts


class _FakeTransport:
    class host:  # stands in for a HostConfig
        name = "gpu1"

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout

    async def run(self, argv: list[str], timeout: float | None = None) -> object:
        from console.sources.transport import CommandResult

        return CommandResult(argv=tuple(argv), exit_status=0, stdout=self.stdout, stderr="")

    @contextlib.asynccontextmanager
    async def stream(self, argv: list[str], timeout: float | None = None) -> AsyncIterator[object]:
        """The command's stdout in chunks of 7 bytes (lines and characters cut anywhere), as a remote
        stream hands it out (`read_unit_journal` reads it bounded, entry by entry)."""
        data = self.stdout.encode()
        chunks = [data[i : i + 7] for i in range(0, len(data), 7)]

        class _Stream:
            async def read(self, size: int = 0) -> bytes:
                return chunks.pop(0) if chunks else b""

            async def wait(self, timeout: float | None = None) -> int:
                return 0

        yield _Stream()


def test_a_remote_journal_is_split_on_newline_only() -> None:
    from console.sources.journal import read_unit_journal

    entries = [{"__CURSOR": f"s={i}", "MESSAGE": f"text {i} \u2028 \x85 \x1c \r more"} for i in range(3)]
    stdout = "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in entries)
    lines = asyncio.run(read_unit_journal(_FakeTransport(stdout), "sglang"))  # type: ignore[arg-type]
    assert [json.loads(line) for line in lines] == entries


def test_probe_history_keeps_a_record_holding_u2028(tmp_path: Path) -> None:
    from console.sources.probe_history import append_history, load_history

    report = _report("gpu1", model="kimi\u2028k2.6\x85", gpu="RTX", error="a\u2028b\x1e")
    path = append_history(report, tmp_path / "history.jsonl")
    assert len(load_history(path)) == len(report.results)


def test_a_streamed_event_holding_u2028_is_one_event() -> None:
    from console.sources.server import ServerClient

    events = [{"text": "a\u2028b\x85c\x1d", "meta_info": {"completion_tokens": n}} for n in (1, 2)]
    body = "".join(f"data: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events) + "data: [DONE]\n\n"

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body.encode())

    async def collect() -> list[dict[str, object]]:
        client = ServerClient("http://127.0.0.1:1")
        client._http = httpx.AsyncClient(base_url=client.base_url, transport=httpx.MockTransport(answer))
        try:
            return [e async for e in client.generate_stream({"text": "x"})]
        finally:
            await client.aclose()

    assert asyncio.run(collect()) == events


# ------------------------------------------------------------------ 5: numbers in sane ranges


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--gpu-mem-gib", "1e300", "1,024 GiB"),
        ("--gpu-mem-gib", "0", "more than 0"),
        ("--gpu-mem-gib", "nan", "1,024 GiB"),
        ("--min-headroom-gib", "1e300", "from 0 to 1,024 GiB"),
        ("--tp", "100000", "from 1 to 1,024"),
        ("--page-size", "0", "from 1 to 65,536"),
        ("--max-total-tokens", "99999999999Mi", "2,147,483,647"),
        ("--max-running-requests", "1e9", "1,048,576"),
        ("--mem-fraction-static", "inf", "strictly between 0 and 1"),
        ("--target-context", "9" * 5000, "2,147,483,647"),
    ],
)
def test_plan_numbers_out_of_range_are_one_sentence_with_the_range(
    flag: str, value: str, says: str, corpus_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "plan",
        "--target-context",
        "200000",
        "--journal",
        str(corpus_dir / "seed-restart-ctx-only.journal"),
    ]
    argv += ["--model", "kimi-k2.6", "--mem-fraction-static", "0.85", flag, value]
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert says in one_sentence(err)


def test_a_profile_number_out_of_range_is_one_sentence(
    tmp_path: Path, corpus_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "huge.toml"
    profile.write_text('name = "huge"\ntarget_context = 200000\n[flags]\ntp-size = 1e300\n')
    argv = [
        "plan",
        "--target-context",
        "200000",
        "--journal",
        str(corpus_dir / "seed-restart-ctx-only.journal"),
    ]
    code, _, err = run([*argv, "--model", "kimi-k2.6", "--profile", str(profile)], capsys)
    assert code == 2 and "from 1 to 1,024" in one_sentence(err)


def test_the_planner_refuses_memory_no_gpu_has() -> None:
    cfg = PoolConfig(model=get_model("kimi-k2.6"), tp=8)
    seen = [Observation(tokens=101_134, mem_fraction_static=0.85)]
    with pytest.raises(CapacityError, match="1,024 GiB"):
        calibrate(seen, cfg, gpu_mem_gib=1e300)
    with pytest.raises(CapacityError, match="no GPU's memory"):
        calibrate([Observation(tokens=1, pre_gib=1e300, post_gib=1e300)], cfg)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--sweep", "9" * 400], "2,147,483,647"),
        (["--depth", "8k", "--ttft-timeout", "1e300"], "86,400 seconds"),
        (["--depth", "8k", "--stall-timeout", "0"], "86,400 seconds"),
        (["--depth", "8k", "--tokens", "5000"], "4096"),
    ],
)
def test_probe_numbers_out_of_range(args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["probe", "gpu1.invalid", *args], capsys)
    assert code == 2 and out == ""
    assert says in one_sentence(err)


def test_other_numbers_out_of_range(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["profiles", "validate", "ctx-200k", "--min-headroom-gib", "nan"], capsys)
    assert code == 2 and "1,024 GiB" in one_sentence(err)
    code, _, err = run(["open", "gpu1.invalid", "--target-context", "0"], capsys)
    assert code == 2 and "2,147,483,647" in one_sentence(err)


# ------------------------------------------------------------------ 5: empty strings


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([""], "HOST must not be an empty string"),
        (["parse", ""], "FILE must not be an empty string"),
        (["parse", "gpu1.invalid", "--follow", "--hosts", ""], "--hosts needs a value"),
        (["parse", "gpu1.invalid", "--follow", "--hosts="], "--hosts needs a value"),
        (["verify", "--target-context", "1k", "--journal", ""], "--journal needs a value"),
        (["profiles", "show", ""], "NAME must not be an empty string"),
        (["profiles", "--dir", "", "list"], "--dir needs a value"),
    ],
)
def test_empty_strings_are_refused(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert says in one_sentence(err)


def test_twin_with_an_empty_state_dir_writes_nothing_here(tmp_path: Path) -> None:
    res = cli("twin", "--no-register", "--state-dir", "", cwd=tmp_path, timeout=30)
    assert res.returncode == 2 and "--state-dir" in one_sentence(res.stderr)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ 5: twin arguments


def test_twin_state_dir_that_cannot_be_one(tmp_path: Path) -> None:
    # In a subprocess with a deadline: the old code started the twin (and served until interrupted)
    # where it could, and wrote a traceback where it could not.
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    cases = {
        str(a_file): "is a file, not a directory",
        str(a_file / "sub"): "is a file, not a directory",
        str(tmp_path / "missing" / "deeper"): "does not exist",
    }
    for state_dir, says in cases.items():
        res = cli("twin", "--no-register", "--state-dir", state_dir, cwd=tmp_path, timeout=30)
        assert res.returncode == 2 and res.stdout == ""
        assert says in one_sentence(res.stderr)
    assert not (tmp_path / "missing").exists()


def test_twin_unknown_scenario_lists_them_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    code, _, err = run(["twin", "--no-register", "--scenario", "nosuch", "--state-dir", str(state)], capsys)
    assert code == 2 and "kimi-k26-rtx6000" in one_sentence(err)
    assert not state.exists()


# ------------------------------------------------------------------ 5: an endless line


def test_parse_one_huge_line_is_cut_with_a_note_in_bounded_memory(tmp_path: Path) -> None:
    big = tmp_path / "one-line.journal"
    size = 50 << 20
    with big.open("wb") as fh:
        fh.write(b"Nov 30 10:00:00 gpu1 python3[1]: before\n")
        chunk = b"a" * (1 << 20)
        for _ in range(size >> 20):
            fh.write(chunk)
        fh.write(b"\nNov 30 10:00:01 gpu1 python3[1]: after\n")
    # Peak memory of the command itself, read in the child (the old reader held several copies of the
    # line and took minutes: quadratic joins of a growing tail). VmHWM, not ru_maxrss: Linux carries the
    # parent's peak into ru_maxrss across fork and exec, so a big pytest process showed as the child's.
    probe = (
        "import re, sys\n"
        "from console.cli.main import main\n"
        "code = main(sys.argv[1:])\n"
        "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
        "sys.stderr.write(f'maxrss_kib={hwm}\\n')\n"
        "raise SystemExit(code)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", probe, "parse", str(big)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    rows = res.stdout.rstrip("\n").split("\n")
    assert len(rows) == 4 and rows[1].endswith("before") and rows[3].endswith("after")
    assert rows[2].endswith(f" [k26-console: line cut at 1,048,576 of its {size:,} bytes]")
    note, rss = res.stderr.strip().split("\n")
    assert note == (
        "k26-console: 1 line longer than 1,048,576 bytes kept only their start (marked 'line cut' in the output)."
    )
    assert int(rss.removeprefix("maxrss_kib=")) < 150 * 1024  # the line alone is 50 MiB


# ------------------------------------------------------------------ 5: no terminal, no host


def test_open_without_a_terminal_says_so(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[hosts.gpu1]\nssh = "127.0.0.1"\nport = 1\n')
    res = cli("open", "gpu1", "--hosts", str(hosts), stdin=subprocess.DEVNULL, timeout=30)
    assert res.returncode == 2 and res.stdout == ""
    assert "needs a terminal" in one_sentence(res.stderr)


def test_open_on_a_host_nothing_knows_is_refused_with_the_known_hosts(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[hosts.gpu1]\nssh = "127.0.0.1"\nport = 1\n')
    res = cli("open", "gpu-typo.invalid", "--hosts", str(hosts), stdin=subprocess.DEVNULL, timeout=30)
    assert res.returncode == 2 and res.stdout == ""
    line = one_sentence(res.stderr)
    assert "'gpu-typo.invalid' is not a host in" in line and "known hosts: gpu1" in line


def test_demo_without_a_terminal_says_so_and_starts_nothing(tmp_path: Path) -> None:
    state = tmp_path / "twin"
    res = cli("demo", "--state-dir", str(state), stdin=subprocess.DEVNULL, timeout=30)
    assert res.returncode == 2 and "needs a terminal" in one_sentence(res.stderr)
    assert not state.exists()


def test_a_host_name_with_control_characters_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([f"gpu{OSC_TITLE}"], capsys)
    assert code == 2 and out == ""
    assert "is not a host name" in one_sentence(err)


def test_parse_follow_on_a_name_that_never_resolves_is_exit_2(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.toml"
    hosts.write_text("")
    res = cli("parse", "gpu9.invalid", "--follow", "--hosts", str(hosts), timeout=60)
    assert res.returncode == 2 and res.stdout == ""
    # refused by the one host lookup, before any connection is tried
    assert "'gpu9.invalid' is not a host in" in one_sentence(res.stderr)
    assert "does not resolve as a host name" in res.stderr


def test_parse_follow_on_a_port_nobody_listens_on_is_exit_2(tmp_path: Path) -> None:
    with socket.socket() as s:  # a free loopback port, closed again: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(f'[hosts.gpu1]\nssh = "127.0.0.1"\nport = {port}\n')
    res = cli("parse", "gpu1", "--follow", "--hosts", str(hosts), timeout=60)
    assert res.returncode == 2 and res.stdout == ""
    assert "refused the connection" in one_sentence(res.stderr)


class _Relay:
    """A TCP relay on 127.0.0.1 in front of the twin's SSH port; `cut()` drops every open connection
    as a network failure would, and new ones are still accepted (the host comes back)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open: list[socket.socket] = []
        self.accepted = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self.lock:
                self.open += [client, upstream]
                self.accepted += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self.lock:
            for s in self.open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self.open.clear()

    def close(self) -> None:
        self.listener.close()
        self.cut()


def test_parse_follow_waits_out_a_drop_of_a_host_it_reached(tmp_path: Path) -> None:
    from console.twin.host import TwinHost

    twin = TwinHost(tmp_path / "twin", time_scale=0.002)
    twin.start_sync()
    relay = _Relay(twin.ssh_port)
    proc: subprocess.Popen[str] | None = None
    try:
        twin.set_ssh_endpoint("127.0.0.1", relay.port)
        proc = subprocess.Popen(
            [*CLI, "parse", twin.name, "--follow", "--hosts", str(twin.hosts_toml), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        out: queue.Queue[str] = queue.Queue()
        err: queue.Queue[str] = queue.Queue()
        for stream, sink in ((proc.stdout, out), (proc.stderr, err)):
            threading.Thread(
                target=lambda s=stream, q=sink: [q.put(x) for x in iter(s.readline, "")], daemon=True
            ).start()

        def wait_line(
            q: queue.Queue[str], pred: Callable[[str], bool], what: str, timeout: float = 60
        ) -> str:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    line = q.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if pred(line):
                    return line
            raise AssertionError(f"no {what} within {timeout:g} s")

        wait_line(out, lambda line: '"kind"' in line, "first event")
        relay.cut()  # the host was reached: from here a drop is waited out
        wait_line(err, lambda line: line.startswith("k26-console: "), "report of the drop on stderr")
        twin.systemctl("restart", twin.unit, check=False)
        wait_line(out, lambda line: '"kind":"unit"' in line, "event after the drop")
        assert proc.poll() is None and relay.accepted >= 2
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
        assert proc.returncode == 130
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        relay.close()
        twin.stop_sync()


def test_a_hosts_file_name_with_an_escape_sequence_is_refused_drawn(tmp_path: Path) -> None:
    """A host's name in hosts.toml reaches the console's title, tabs and header: one with control characters
    is refused at load, and the sentence shows them as pictures."""
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[hosts."ev\\u001b]0;pwned\\u0007il"]\nssh = "gpu1"\n')
    res = cli("verify", "gpu1", "--target-context", "1000", "--hosts", str(hosts))
    assert res.returncode == 2
    assert not raw_controls(res.stderr), res.stderr
    assert "must hold no control characters" in one_sentence(res.stderr)
