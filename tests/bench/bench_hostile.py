"""Benchmark of the bounded reads (issue 30 items 4, 6, 8): each command against each bomb of the issue.

    python tests/bench/bench_hostile.py            # prints the table (markdown) and a JSON line
    python tests/bench/bench_hostile.py --quick    # a tenth of each bomb (scripts/bench-smoke)

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

Not a timed test: pytest ignores tests/bench. The same figures are asserted (< 300 MB, < 10 s) by the
serial tests in tests/test_bounded_{metrics,audit,recording}.py.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import tempfile
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


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    scale = 10 if quick else 1  # the bombs' sizes divided by it
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        env = operator_env(tmp)
        twin = TwinHost(tmp / "twin", time_scale=0.002)
        twin.start_sync()
        try:
            good = _twin_scrape()
            with Hostile("text", text=good) as server:
                base = run_measured(snapshot_argv(twin, server.url, tmp), env=env, cwd=REPO)
            for text, mode, kw in (
                (f"{300 // scale} MB /metrics body", "huge", {"size": 300_000_000 // scale}),
                ("slowloris, 1 byte / 5 s", "slow", {"drip_s": 5.0}),
                (
                    "+Inf and -3 in /metrics",
                    "text",
                    {"text": _twin_scrape(token_usage="+Inf", num_running_reqs="-3")},
                ),
            ):
                with Hostile(mode, **kw) as server:  # type: ignore[arg-type]
                    res = run_measured(snapshot_argv(twin, server.url, tmp), env=env, cwd=REPO)
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
            trail.unlink()
            trail.symlink_to("/dev/zero")
            rows.append(
                _row(
                    "audit --limit 5", "audit.jsonl -> /dev/zero", run_measured(argv, env=env, cwd=REPO), base
                )
            )
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
        finally:
            twin.stop_sync()

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
        print(
            f"| `{r['command']}` | {r['bomb']} | {r['seconds']} s | {r['peak_rss_mib']} MiB | {r['exit']} | "
            f"{r['baseline_seconds']} s / {r['baseline_rss_mib']} MiB | {r['said']} |"
        )
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
