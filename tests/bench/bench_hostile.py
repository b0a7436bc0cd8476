"""Benchmark of the bounded reads (issue 30 items 4, 6, 8): each command against each bomb of the issue.

    python tests/bench/bench_hostile.py            # prints the table (markdown) and a JSON line
    python tests/bench/bench_hostile.py --quick    # a tenth of each bomb, `open` on two (scripts/bench-smoke)

Each row is one run of the real command in a process of its own (`k26-console snapshot`, `audit`,
`replay`), its peak RSS from `os.wait4` (the child's own `ru_maxrss`) and its wall time, next to the same
command against a well-behaved host in the same run (the baseline: what the command costs anyway, its
interpreter and imports included):

* `snapshot` of a twin host whose `server_url` points at a hostile server on loopback
  (tests/support/hostile_http.py): a 300 MB `/metrics` body; a slowloris (a byte every 5 s); a scrape of
  the twin engine's own `/metrics` with `+Inf` and a negative value. Baseline: a well-formed scrape.
* `audit --limit 5` of the twin: `audit.jsonl` linked to /dev/zero; a legitimate 200 MB trail of real
  entries. Baseline: a trail of 100 entries.
* `replay FILE --at end --json` of a recording of real corpus lines holding a 1.6 MB zlib bomb (1.6 GB
  unpacked). Baseline: the same recording without it.
* `open` (the full-screen console, `k26-console open twin --hosts FILE`) in a real pty (160x48) against
  the same hosts as `snapshot` and `audit` above: it runs OPEN_RUN_S, 3 s with --quick (it reads the journal, the GPUs,
  /metrics, the audit trail), then gets `q`; its row is its peak RSS (the same launcher, `os.wait4`), the
  time from `q` to its exit (the launcher reads the clock as it reaps it), its exit status, and whether
  the pty showed a fragment of the one sentence (reported, not asserted: the screen may wrap it).
  Baseline: the same console on the well-behaved twin (its own engine's /metrics, a trail of 100 entries).

Not a timed test: pytest ignores tests/bench. The same figures (not `open`'s) are asserted (< 300 MB, < 10 s) by the
serial tests in tests/test_bounded_{metrics,audit,recording}.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import pty
import re
import select
import signal
import sqlite3
import struct
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from console.sources.hosts import load_hosts  # noqa: E402
from console.twin.host import TwinHost  # noqa: E402
from tests.support.cli import CLI, operator_env  # noqa: E402
from tests.support.hostile_http import Hostile  # noqa: E402
from tests.support.measured import Measured, run_measured  # noqa: E402
from tests.test_bounded_audit import write_trail  # noqa: E402
from tests.test_bounded_metrics import _twin_scrape, snapshot_argv  # noqa: E402
from tests.test_bounded_recording import T0, _recording, bomb  # noqa: E402


def _row(what: str, bomb_text: str, res: Measured, base: Measured) -> dict[str, object]:
    said = [line for line in res.stderr.strip().split("\n") if line]
    return {
        "command": what,
        "bomb": bomb_text,
        "seconds": round(res.seconds, 2),
        "peak_rss_mib": round(res.peak_rss / 2**20),
        "exit": res.returncode,
        "baseline_seconds": round(base.seconds, 2),
        "baseline_rss_mib": round(base.peak_rss / 2**20),
        "said": said[-1][:160] if said else "",
    }


# ---------------------------------------------------------------------------------------------- open

COLS, ROWS = 160, 48
OPEN_RUN_S = 8.0  # --quick: 3 s
QUIT_WAIT_S = 30.0  # past it after `q`, the console is stopped (SIGTERM, then SIGKILL) and its row says so
_ESC = re.compile(
    rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78]"
)

# Forks the command (on the pty this launcher was given), reaps it with os.wait4 and writes its exit
# status, its own ru_maxrss (KiB) and the monotonic clock at its exit to the file argv[1].
_PTY_LAUNCHER = """
import os, sys, time
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
ended = time.monotonic()
with open(sys.argv[1], "w") as f:
    f.write("%d %d %.6f\\n" % (os.waitstatus_to_exitcode(status), usage.ru_maxrss, ended))
"""


def run_open(
    argv: list[str], env: dict[str, str], out: Path, run_s: float, fragments: tuple[str, ...]
) -> dict[str, object]:
    """`argv` (the console) in a pty for `run_s`, then `q`: its figures, and which of `fragments` the
    screen showed."""
    out.unlink(missing_ok=True)
    pid, fd = pty.fork()
    if pid == 0:  # the child: the launcher, the console under it, both on the pty
        try:
            os.chdir(REPO)
            os.environ.clear()
            os.environ.update(env)
            os.environ.update({"TERM": "xterm-256color", "COLUMNS": str(COLS), "LINES": str(ROWS)})
            os.environ.pop("TEXTUAL", None)
            os.execv(sys.executable, [sys.executable, "-I", "-S", "-c", _PTY_LAUNCHER, str(out), *argv])
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
    chunks: list[bytes] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    return
                if not data:
                    return
                chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started = time.monotonic()
    time.sleep(run_s)
    console = _console_pid(pid)
    alive_at_q = console is not None
    hwm_at_q = _vm_hwm(console) if console is not None else 0
    pressed = time.monotonic()
    with contextlib.suppress(OSError):
        os.write(fd, b"q")
    stopped = ""
    while time.monotonic() - pressed < QUIT_WAIT_S:
        if os.waitpid(pid, os.WNOHANG)[0]:
            break
        time.sleep(0.05)
    else:
        stopped = f"no exit {QUIT_WAIT_S:g} s after q: SIGTERM"
        if console is not None:
            with contextlib.suppress(OSError):
                os.kill(console, signal.SIGTERM)
        for _ in range(50):
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
            time.sleep(0.1)
        else:
            stopped += ", then SIGKILL"
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    time.sleep(0.3)  # what the console wrote last
    done.set()
    reader.join(2)
    with contextlib.suppress(OSError):
        os.close(fd)
    screen = _ESC.sub(b"", b"".join(chunks)).decode("utf-8", "replace")
    flat = re.sub(r"\s+", " ", screen)
    found = [f for f in fragments if f in flat]
    fields = out.read_text().split() if out.exists() else []
    if len(fields) == 3:
        rc, rss, ended = int(fields[0]), int(fields[1]) * 1024, float(fields[2])
    else:  # killed with its launcher: what /proc said at `q`
        rc, rss, ended = -9, hwm_at_q, float("nan")
    tail = flat[-300:] if rc not in (0,) or not alive_at_q else ""
    if os.environ.get("BENCH_SCREENS"):  # a folder: each run's pty text, its escapes removed
        Path(os.environ["BENCH_SCREENS"], f"open-{next(_SCREENS)}.txt").write_text(screen)
    return {
        "ran_s": round(pressed - started, 1),
        "quit_s": round(ended - pressed, 2),
        "peak_rss_mib": round(rss / 2**20),
        "exit": rc,
        "alive_at_q": alive_at_q,
        "shown": found,
        "looked_for": list(fragments),
        "stopped": stopped,
        "tail": tail,
    }


_SCREENS = itertools.count()


def _console_pid(launcher: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        kids = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
        return int(kids[0]) if kids else None
    return None


def _vm_hwm(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _open_row(bomb_text: str, res: dict[str, object], base: dict[str, object]) -> dict[str, object]:
    # The first fragment is the one sentence's; the others, what else the screen may say of it.
    shown = list(res["shown"])  # type: ignore[call-overload]
    looked_for = list(res["looked_for"])  # type: ignore[call-overload]
    if not looked_for:
        said = ""
    elif looked_for[0] in shown:
        said = f"on screen: '{looked_for[0]}'"
    else:
        said = f"'{looked_for[0]}' not found on the pty"
        if shown:
            said += f"; it showed '{shown[0]}'"
    if res["stopped"]:
        said = f"{said}; {res['stopped']}"
    if not res["alive_at_q"]:
        said = f"{said}; it had exited before q: {res['tail']}"
    return {
        "command": "open",
        "bomb": bomb_text,
        "seconds": res["quit_s"],
        "ran_s": res["ran_s"],
        "peak_rss_mib": res["peak_rss_mib"],
        "exit": res["exit"],
        "baseline_seconds": base["quit_s"],
        "baseline_rss_mib": base["peak_rss_mib"],
        "said": said.strip("; "),
    }


def open_argv(name: str, hosts: Path | str) -> list[str]:
    return [*CLI, "open", name, "--hosts", str(hosts)]


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    scale = 10 if quick else 1  # the bombs' sizes divided by it
    run_s = 3.0 if quick else OPEN_RUN_S
    rows: list[dict[str, object]] = []
    opened: list[tuple[str, dict[str, object]]] = []  # `open`'s rows, after the others
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        env = operator_env(tmp)
        twin = TwinHost(tmp / "twin", time_scale=0.002)
        twin.start_sync()
        status = tmp / "open-status"

        def console(hosts: Path | str, *fragments: str) -> dict[str, object]:
            return run_open(open_argv(twin.name, hosts), env, status, run_s, fragments)

        def open_too(text: str) -> bool:
            # --quick (the smoke run) opens the console on one bomb of each kind: each open is ~5 s.
            return not quick or text.startswith(("slowloris", "audit.jsonl"))

        try:
            good = _twin_scrape()
            with Hostile("text", text=good) as server:
                base = run_measured(snapshot_argv(twin, server.url, tmp), env=env, cwd=REPO)
            for text, mode, kw, fragments in (
                (
                    f"{300 // scale} MB /metrics body",
                    "huge",
                    {"size": 300_000_000 // scale},
                    ("bytes for /metrics", "absent: no /metrics"),
                ),
                (
                    "slowloris, 1 byte / 5 s",
                    "slow",
                    {"drip_s": 5.0},
                    ("did not answer /metrics", "absent: no /metrics"),
                ),
                (
                    "+Inf and -3 in /metrics",
                    "text",
                    {"text": _twin_scrape(token_usage="+Inf", num_running_reqs="-3")},
                    ("out of range", "absent: no /metrics", "inf%"),
                ),
            ):
                with Hostile(mode, **kw) as server:  # type: ignore[arg-type]
                    argv = snapshot_argv(twin, server.url, tmp)
                    res = run_measured(argv, env=env, cwd=REPO)
                    if open_too(text):
                        opened.append((text, console(argv[argv.index("--hosts") + 1], *fragments)))
                report = json.loads(res.stdout) if res.stdout.strip() else {}
                row = _row("snapshot", text, res, base)
                row["said"] = "; ".join(report.get("incomplete", []) + report.get("problems", []))[:160]
                rows.append(row)

            config = (
                load_hosts(twin.hosts_toml).hosts[twin.name].model_copy(update={"state_dir": "~/.k26-bench"})
            )
            trail = twin.layout.home_dir / ".k26-bench" / "audit.jsonl"
            trail.parent.mkdir(parents=True, exist_ok=True)
            lines = twin.hosts_toml.read_text().split("\n")
            head = next(i for i, line in enumerate(lines) if line.startswith("[hosts."))
            lines.insert(head + 1, f'state_dir = "{config.state_dir}"')
            hosts = tmp / "audit-hosts.toml"
            hosts.write_text("\n".join(lines))
            argv = [*CLI, "audit", twin.name, "--hosts", str(hosts), "--limit", "5"]
            write_trail(trail, 30_000)
            base = run_measured(argv, env=env, cwd=REPO)
            open_base = console(hosts)  # the well-behaved twin: its own /metrics, a trail of 100 entries
            trail.unlink()
            trail.symlink_to("/dev/zero")
            rows.append(
                _row(
                    "audit --limit 5", "audit.jsonl -> /dev/zero", run_measured(argv, env=env, cwd=REPO), base
                )
            )
            opened.append(("audit.jsonl -> /dev/zero", console(hosts, "not a regular file", "audit.jsonl")))
            trail.unlink()
            write_trail(trail, 200_000_000 // scale)
            rows.append(
                _row(
                    "audit --limit 5",
                    f"a {200 // scale} MB trail",
                    run_measured(argv, env=env, cwd=REPO),
                    base,
                )
            )
            if open_too(f"a {200 // scale} MB trail"):
                opened.append(
                    (
                        f"a {200 // scale} MB trail",
                        console(hosts, "were read", "older ones left out", "audit.jsonl"),
                    )
                )
        finally:
            twin.stop_sync()
        rows.extend(_open_row(text, res, open_base) for text, res in opened)

        clean = _recording(tmp / "clean.k26rec")
        replay = [*CLI, "replay"]
        base = run_measured([*replay, str(clean), "--at", "end", "--json"], env=env, cwd=REPO)
        hostile = _recording(tmp / "bomb.k26rec")
        blob = bomb((1600 << 20) // scale)
        with sqlite3.connect(hostile) as conn:
            conn.execute(
                "INSERT INTO chunks (t0, t1, records, raw_bytes, blob) VALUES (?, ?, 1, 0, ?)",
                (T0 + 1, T0 + 1, blob),
            )
        res = run_measured([*replay, str(hostile), "--at", "end", "--json"], env=env, cwd=REPO)
        rows.append(
            _row(
                "replay --json",
                f"a {len(blob) / 1e6:.2f} MB zlib bomb ({(1600 << 20) // scale / 1e9:.2f} GB unpacked)",
                res,
                base,
            )
        )

    print(f"load average {os.getloadavg()[0]:.1f} at the end, {os.cpu_count()} cores")
    print("| command | bomb | wall | peak RSS | exit | baseline wall / RSS | what it said |")
    print("|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        wall = f"{r['seconds']} s after `q` (ran {r['ran_s']} s)" if "ran_s" in r else f"{r['seconds']} s"
        print(
            f"| `{r['command']}` | {r['bomb']} | {wall} | {r['peak_rss_mib']} MiB | {r['exit']} | "
            f"{r['baseline_seconds']} s / {r['baseline_rss_mib']} MiB | {r['said']} |"
        )
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
