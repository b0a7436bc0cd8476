"""The parallel pass queues modules longest first (tests/conftest.py `LongestFirst`), from figures that
tests/support/durations.py reads out of a JUnit report."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.conftest import LongestFirst
from tests.support import durations


def _items(*nodeids: str) -> list[Any]:
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def _order(items: list[Any], seed: int | None) -> list[str]:
    config = SimpleNamespace(option=SimpleNamespace(randomly_seed=seed))
    LongestFirst().pytest_collection_modifyitems(config, items)  # type: ignore[arg-type]
    return [i.nodeid for i in items]


def test_long_modules_go_first_and_a_module_keeps_its_own_order(monkeypatch: Any) -> None:
    monkeypatch.setattr(
        durations, "load", lambda: {"tests/test_a.py": 1.0, "tests/test_b.py": 90.0, "tests/test_c.py": 30.0}
    )
    items = _items(
        "tests/test_a.py::t2",
        "tests/test_c.py::t1",
        "tests/test_b.py::t3",
        "tests/test_a.py::t1",
        "tests/test_b.py::t1",
        "tests/test_new.py::t",
    )
    assert _order(items, None) == [
        "tests/test_b.py::t3",
        "tests/test_b.py::t1",  # 90 s, in the order they came
        "tests/test_c.py::t1",  # 30 s
        "tests/test_new.py::t",  # not measured: the median (30 s), after c, which came first
        "tests/test_a.py::t2",
        "tests/test_a.py::t1",
    ]
    # The seed scales each module's time by 0.75-1.25: 90 s always beats 30 s, 30 s and 30 s may swap.
    for seed in range(20):
        order = _order(_items("tests/test_c.py::x", "tests/test_b.py::x", "tests/test_new.py::x"), seed)
        assert order[0] == "tests/test_b.py::x"
    assert (
        len({tuple(_order(_items("tests/test_c.py::x", "tests/test_new.py::x"), s)) for s in range(20)}) == 2
    )


def test_durations_are_summed_per_module_from_a_junit_report(tmp_path: Path) -> None:
    report = tmp_path / "suite.xml"
    report.write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_x" name="a" time="1.25"/>'
        '<testcase classname="tests.test_x.TestGroup" name="b" time="2.5"/>'
        '<testcase classname="tests.test_y" name="c" time="0.04"/>'
        '<testcase classname="" name="collect" time="9"/>'
        "</testsuite></testsuites>"
    )
    assert durations.from_junit(report) == {"tests/test_x.py": 3.8, "tests/test_y.py": 0.0}


def test_the_committed_figures_name_existing_modules() -> None:
    figures = durations.load()
    assert figures, "tests/durations.json is missing or empty"
    here = Path(__file__).resolve().parent.parent
    assert all((here / module).is_file() for module in figures), [
        m for m in figures if not (here / m).is_file()
    ]
