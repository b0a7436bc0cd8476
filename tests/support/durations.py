"""How long each test takes, for the order in which the passes hand modules to workers.

xdist gives a free worker the next module in the queue. By default it queues modules by their number of
tests, so a module of a few long tests (commit-confirmed: 8 tests, ~90 s) started last and kept one
worker busy alone for a minute while the others idled. `tests/conftest.py` queues the modules longest
first instead (each duration scaled by a random factor from the run's seed, so the order still varies),
summing the figures of the tests each pass selected (the timing pass runs other tests of a module than
the parallel pass).

Refresh the figures from JUnit reports of both passes (a test's time is its setup + call + teardown):

    scripts/test -m "not serial" --junitxml=/tmp/parallel.xml
    scripts/test -m serial --junitxml=/tmp/serial.xml
    .venv/bin/python -m tests.support.durations /tmp/parallel.xml /tmp/serial.xml > tests/durations.json
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

DURATIONS = Path(__file__).resolve().parent.parent / "durations.json"
MAX_ID = 250  # ids of tests fed 10,000-digit numbers are left out (they count as a median test)


def plain_nodeid(nodeid: str) -> str:
    """A test's id without the `@group` suffix xdist's loadgroup adds (every group here is a module's
    path, see `xdist_group_of` in tests/conftest.py)."""
    return nodeid.split("@tests/", 1)[0]


def load() -> dict[str, float]:
    """Test id (`tests/test_x.py::test_y[param]`) → seconds; empty when the file is missing or unreadable."""
    try:
        data = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}


def from_junit(*paths: Path) -> dict[str, float]:
    """Seconds per test in JUnit reports. pytest names a test's class `tests.test_x` (or
    `tests.test_x.TestClass`) and the test `test_y[param]`, with xdist's group suffix under loadgroup."""
    out: dict[str, float] = {}
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            parts = case.get("classname", "").split(".")
            if len(parts) < 2 or parts[0] != "tests":
                continue
            nodeid = "::".join([f"tests/{parts[1]}.py", *parts[2:], plain_nodeid(case.get("name", ""))])
            if len(nodeid) <= MAX_ID:
                out[nodeid] = round(float(case.get("time", "0") or 0), 2)
    return dict(sorted(out.items()))


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("usage: python -m tests.support.durations JUNIT.xml... > tests/durations.json\n")
        return 2
    json.dump(from_junit(*map(Path, argv)), sys.stdout, indent=0)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
