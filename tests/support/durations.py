"""How long each test module takes, for the order in which the parallel pass hands modules to workers.

xdist gives a free worker the next module in the queue. By default it queues modules by their number of
tests, so a module of a few long tests (commit-confirmed: 8 tests, ~90 s) started last and kept one
worker busy alone for a minute while the others idled. `tests/conftest.py` queues the modules longest
first instead (each duration scaled by a random factor from the run's seed, so the order still varies),
reading the figures this file holds.

Refresh the figures from a run's JUnit report (its times are setup + call + teardown):

    scripts/test --junitxml=/tmp/suite.xml
    .venv/bin/python -m tests.support.durations /tmp/suite.xml > tests/durations.json
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

DURATIONS = Path(__file__).resolve().parent.parent / "durations.json"


def load() -> dict[str, float]:
    """Module path (`tests/test_x.py`) → seconds; empty when the file is missing or unreadable."""
    try:
        data = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}


def from_junit(path: Path) -> dict[str, float]:
    """Seconds per module in a JUnit report (pytest names a test's class `tests.test_x` or
    `tests.test_x.TestClass`)."""
    totals: dict[str, float] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        if len(parts) < 2 or parts[0] != "tests":
            continue
        module = f"tests/{parts[1]}.py"
        totals[module] = totals.get(module, 0.0) + float(case.get("time", "0") or 0)
    return {k: round(v, 1) for k, v in sorted(totals.items())}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m tests.support.durations JUNIT.xml > tests/durations.json\n")
        return 2
    json.dump(from_junit(Path(argv[0])), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
