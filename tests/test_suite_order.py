"""The passes queue modules longest first (tests/conftest.py `LongestFirst`), from per-test figures that
tests/support/durations.py reads out of JUnit reports."""

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
    figures = {
        "tests/test_a.py::t1": 0.5,
        "tests/test_a.py::t2": 0.5,
        "tests/test_b.py::t1": 60.0,
        "tests/test_b.py::t3": 30.0,
        "tests/test_b.py::serial_only": 500.0,  # not selected in this pass: does not count
        "tests/test_c.py::t1": 30.0,
    }
    monkeypatch.setattr(durations, "load", lambda: figures)
    items = _items(
        "tests/test_a.py::t2",
        "tests/test_c.py::t1",
        "tests/test_b.py::t3@tests/test_b.py",  # xdist's loadgroup suffix is no part of the test's id
        "tests/test_a.py::t1",
        "tests/test_b.py::t1",
        "tests/test_new.py::t",
    )
    assert _order(items, None) == [
        "tests/test_b.py::t3@tests/test_b.py",  # 90 s, its tests in the order they came
        "tests/test_b.py::t1",
        "tests/test_c.py::t1",  # 30 s
        "tests/test_new.py::t",  # not measured: the median test (30 s), after c, which came first
        "tests/test_a.py::t2",  # 1 s
        "tests/test_a.py::t1",
    ]
    # The seed scales each module's time by 0.75-1.25: 90 s always beats 30 s, 30 s and 30 s may swap.
    for seed in range(20):
        order = _order(_items("tests/test_c.py::t1", "tests/test_b.py::t1", "tests/test_new.py::x"), seed)
        assert order[0] == "tests/test_b.py::t1"
    orders = {tuple(_order(_items("tests/test_c.py::t1", "tests/test_new.py::x"), s)) for s in range(20)}
    assert len(orders) == 2


def test_durations_are_summed_per_module_from_a_junit_report(tmp_path: Path) -> None:
    report = tmp_path / "suite.xml"
    report.write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_x" name="a[p-1]@tests/test_x.py:twin=0" time="1.25"/>'
        '<testcase classname="tests.test_x.TestGroup" name="b" time="2.5"/>'
        '<testcase classname="tests.test_y" name="c" time="0.004"/>'
        '<testcase classname="" name="collect" time="9"/>'
        "</testsuite></testsuites>"
    )
    assert durations.from_junit(report) == {
        "tests/test_x.py::TestGroup::b": 2.5,
        "tests/test_x.py::a[p-1]": 1.25,
        "tests/test_y.py::c": 0.0,
    }


def test_the_committed_figures_name_existing_modules() -> None:
    figures = durations.load()
    assert figures, "tests/durations.json is missing or empty"
    here = Path(__file__).resolve().parent.parent
    gone = {t.split("::", 1)[0] for t in figures} - {
        str(p.relative_to(here)) for p in here.glob("tests/*.py")
    }
    assert not gone, f"tests/durations.json names modules that are gone: {sorted(gone)}"
