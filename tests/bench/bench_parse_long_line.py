"""`k26-console parse FILE` on one very long line: wall time and peak memory by line size.

    .venv/bin/python tests/bench/bench_parse_long_line.py [MIB ...]   (default: 10 50 200)

Each size runs in a fresh interpreter (peak RSS is per process). The reader keeps at most
LINE_MAX_BYTES (1 MiB) of a line, so time grows linearly with the size and memory stays flat; before
issue 20 a 40 MB line took 10.5 s and a 200 MB one 335 s and 823 MB (a quadratic join of the tail).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHILD = (
    "import resource, sys\n"
    "from console.cli.main import main\n"
    "code = main(sys.argv[1:])\n"
    "sys.stderr.write(f'{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n')\n"
    "raise SystemExit(code)\n"
)


def one(mib: int, where: Path) -> tuple[float, int]:
    path = where / f"line-{mib}.journal"
    with path.open("wb") as fh:
        fh.write(b"Nov 30 10:00:00 gpu1 python3[1]: before\n")
        block = b"a" * (1 << 20)
        for _ in range(mib):
            fh.write(block)
        fh.write(b"\nNov 30 10:00:01 gpu1 python3[1]: after\n")
    started = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-c", CHILD, "parse", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    took = time.perf_counter() - started
    path.unlink()
    return took, int(res.stderr.strip().split("\n")[-1])


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [10, 50, 200]
    with tempfile.TemporaryDirectory(prefix="k26-bench-") as tmp:
        print("| line | wall | peak RSS |")
        print("|---:|---:|---:|")
        for mib in sizes:
            took, rss_kib = one(mib, Path(tmp))
            print(f"| {mib} MiB | {took:.2f} s | {rss_kib / 1024:.0f} MiB |", flush=True)


if __name__ == "__main__":
    main()
