"""What one `k26-console` command costs from start to exit: CPU and wall, each command in a fresh process.

    python tests/bench/bench_cli_start.py              # 10 runs of each, prints a table and a JSON line
    python tests/bench/bench_cli_start.py --runs 20

Operators run these in loops (`watch k26-console snapshot`, scripts, Tab completion), and the test suite
starts ~300 of them: most of a short command is the interpreter importing what it needs, not the work.
A twin with its service up serves the commands that reach a host, over SSH on loopback. `--against DIR`
runs another checkout's commands in the same rounds (a change measured against main, on one noisy machine).

Baselines, in the same run: the bare interpreter (`python -c pass`), the libraries a command that
reaches a host cannot do without (`import asyncssh, pydantic`: the floor the table's ratios are taken
against), and those libraries doing what such a command cannot skip. `import pydantic` alone loads
almost nothing (its names load on first use), so the next line builds and validates one model, as any
command that reads a host's answer into a model does; the last adds one SSH connection to the twin (key
exchange, host key check, public-key auth) and one command on it (`true`), with asyncssh alone. What is
above that last line is ours. CPU is the child's user + system time (its own `wait4` rusage, children
included), median over the runs.

The commands run with their bytecode written (PYTHONDONTWRITEBYTECODE is left out of their environment):
with it set and a source newer than its .pyc (a shared tree, a checkout just pulled), every run
recompiled those modules, ~0.1 s of CPU a command that is no cost an installed console pays.

Not a timed test: pytest ignores tests/bench. Figures go in docs/performance.md (by hand).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from console.twin.host import TwinHost  # noqa: E402

JOURNAL = REPO.parent / "shared" / "corpus" / "seed-restart-mfs094.journal"

FLOOR = "baseline: import asyncssh, pydantic"
SSH_FLOOR = "baseline: + one SSH connection and command"

# One pydantic model, built and used: what the first model a command validates costs (the schema
# machinery loads then), whichever model it is.
_MODEL = """
import asyncssh
from pydantic import BaseModel
class Answer(BaseModel):
    text: str
    status: int
Answer.model_validate({"text": "ok", "status": 0})
"""

# And asyncssh as a host command uses it: connect (the twin's key and known_hosts, no ssh config), run
# one command, close. argv: port, user, identity file, known_hosts file.
_SSH_FLOOR = (
    _MODEL
    + """
import asyncio, sys
async def main(port, user, key, known):
    async with asyncssh.connect("127.0.0.1", port=int(port), username=user, client_keys=[key],
                                known_hosts=known, config=[]) as conn:
        await conn.run("true", check=True)
asyncio.run(main(*sys.argv[1:]))
"""
)


def _one(argv: list[str], env: dict[str, str]) -> tuple[float, float, int, str]:
    """(CPU s, wall s, exit status, stderr) of one process; the CPU is its own and its children's."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    err = proc.stderr.read()  # before the wait: a full pipe would block the child
    proc.stderr.close()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime, wall, proc.returncode, err.decode(errors="replace")


def _cases(tree: Path, hosts: str, twin: TwinHost) -> list[tuple[str, list[str], set[int]]]:
    """Each command as (name, argv, the exit codes it may end with), run by `tree`'s own venv and code."""
    py = [str(tree / ".venv" / "bin" / "python")] if tree != REPO else [sys.executable]
    cli = [*py, "-m", "console.cli.main"]
    return [
        ("baseline: python -c pass", [*py, "-c", "pass"], {0}),
        (FLOOR, [*py, "-c", "import asyncssh, pydantic"], {0}),
        ("baseline: + one pydantic model validated", [*py, "-W", "ignore", "-c", _MODEL], {0}),
        (
            SSH_FLOOR,
            [
                *py,
                "-W",
                "ignore",
                "-c",
                _SSH_FLOOR,
                str(twin.ssh_port),
                twin.user,
                str(twin.client_key),
                str(twin.known_hosts),
            ],
            {0},
        ),
        ("completion bash", [*cli, "completion", "bash"], {0}),
        ("profiles list", [*cli, "profiles", "list"], {0}),
        ("parse FILE --kinds pool_summary", [*cli, "parse", str(JOURNAL), "--kinds", "pool_summary"], {0}),
        ("audit twin --json", [*cli, "audit", "twin", "--json", "--hosts", hosts], {0}),
        (
            "verify twin --target-context 200k",
            [*cli, "verify", "twin", "--target-context", "200k", "--hosts", hosts],
            {0, 1},
        ),
        (
            "plan twin --target-context 200k",
            [*cli, "plan", "twin", "--target-context", "200k", "--hosts", hosts],
            {0, 1},
        ),
        # No --yes and no terminal: the preview, then a refusal (the host is left as it was).
        (
            "apply twin ctx-200k (preview only)",
            [*cli, "apply", "twin", "ctx-200k", "--hosts", hosts],
            {0, 1, 2},
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument(
        "--against",
        metavar="DIR",
        type=Path,
        help="another checkout (with its own .venv, e.g. a worktree of main): its commands run in the same "
        "rounds, and the table gives both and the difference",
    )
    args = parser.parse_args()
    trees = [REPO] + ([args.against.resolve()] if args.against else [])

    with tempfile.TemporaryDirectory(prefix="k26-bench-cli-") as tmp:
        root = Path(tmp)
        twin = TwinHost(root / "state", name="twin", time_scale=0.002)
        twin.start_sync()
        try:
            hosts = str(twin.hosts_toml)
            home = {
                "XDG_CONFIG_HOME": str(root / "home" / "config"),
                "XDG_STATE_HOME": str(root / "home" / "state"),
            }
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            runs = [
                (tree, name, argv, ok, {**env, **home, "PYTHONPATH": str(tree)})
                for tree in trees
                for name, argv, ok in _cases(tree, hosts, twin)
            ]
            # Round-robin (each round runs every command of every tree once): a neighbour's load on this
            # shared machine then weighs on every command alike instead of on whichever ran during it.
            cpus: dict[tuple[Path, str], list[float]] = {(t, n): [] for t, n, _, _, _ in runs}
            walls: dict[tuple[Path, str], list[float]] = {(t, n): [] for t, n, _, _, _ in runs}
            for round_ in range(args.runs + 1):
                for tree, name, argv, ok, env in runs:
                    cpu, wall, code, err = _one(argv, env)
                    if code not in ok:
                        print(f"{tree}: {name}: exit {code}: {err.strip()[-500:]}", file=sys.stderr)
                        return 1
                    if round_ > 0:  # round 0 warms the bytecode and the page cache
                        cpus[tree, name].append(cpu)
                        walls[tree, name].append(wall)
        finally:
            twin.stop_sync()

    report: dict[str, dict[str, dict[str, float]]] = {}
    for tree in trees:
        report[str(tree)] = {
            name: {
                "cpu_ms": round(statistics.median(cpus[tree, name]) * 1000, 1),
                "wall_ms": round(statistics.median(walls[tree, name]) * 1000, 1),
            }
            for t, name, _, _, _ in runs
            if t == tree
        }
    this = report[str(REPO)]
    other = report.get(str(trees[-1])) if len(trees) > 1 else None
    # CPU over the floor's (the ratio) and over the last baseline's (what a host command cannot skip)
    floor, ssh_floor = this[FLOOR]["cpu_ms"], this[SSH_FLOOR]["cpu_ms"]
    head = f"{'command':42s} {'cpu ms':>8s} {'wall ms':>8s} {'x floor':>7s} {'x ssh':>6s}"
    print(head + (f" {'against':>8s} {'diff':>7s}" if other else ""))
    for name, row in this.items():
        cpu = row["cpu_ms"]
        line = f"{name:42s} {cpu:8.1f} {row['wall_ms']:8.1f} {cpu / floor:7.2f} {cpu / ssh_floor:6.2f}"
        if other:
            line += f" {other[name]['cpu_ms']:8.1f} {row['cpu_ms'] - other[name]['cpu_ms']:+7.1f}"
        print(line)
    print(json.dumps({"runs": args.runs, "cpu_and_wall_by_tree": report}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
