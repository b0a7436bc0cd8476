"""No widget reaches into the app or into another widget's internals (issue 35): a widget draws what it
is given (a snapshot, its host's published `HostUi`) and asks for things with messages; the app and the
host controllers route. Read from the source of console/tui: the widget classes are those the modules
define that are Textual widgets and not screens (a screen, like the app, routes)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

from textual.app import App
from textual.screen import Screen
from textual.widget import Widget

import console.tui

TUI = Path(console.tui.__file__).parent

ALLOWED: dict[tuple[str, str, str], str] = {
    # Textual's own Footer shows the app's keys: the subclass only skips recomposing when they are the
    # same, and reads what Textual's Footer itself reads to know that (the app's focus, the palette key).
    ("footer", "KeyFooter", "app"): "Textual's Footer, whose job is the app's keys",
    # The replay's bar shows where the replay app stands (position, speed, playing) and hands it what is
    # typed in its go-to box: it is the replay app's own control, not a host's widget (console/tui/replay.py
    # is outside the host UI state this test guards; see issue 35's report).
    ("replay", "ReplayBar", "app"): "the replay app's own control bar",
}
"""(module, class, what) → why: each must still be found (a stale allowance fails the test)."""


def reaches(source: str, widgets: set[str], apps: set[str] = frozenset({"App"})) -> set[tuple[str, str]]:
    """(class, what) for each reach in the classes named by `widgets`: `app` for reading `.app` (the
    app, whoever's it is: `self.app`, `self.screen.app`) or taking an app (a parameter annotated with one
    of `apps`), `private NAME` for another object's `_NAME` (its own, `self._x`, `super()._x`, is fine)."""
    found: set[tuple[str, str]] = set()
    for cls in ast.walk(ast.parse(source)):
        if not isinstance(cls, ast.ClassDef) or cls.name not in widgets:
            continue
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute):
                owner = node.value
                own = (isinstance(owner, ast.Name) and owner.id in ("self", "cls")) or (
                    isinstance(owner, ast.Call)
                    and isinstance(owner.func, ast.Name)
                    and owner.func.id == "super"
                )
                if node.attr == "app":
                    found.add((cls.name, "app"))
                elif node.attr.startswith("_") and not node.attr.startswith("__") and not own:
                    found.add((cls.name, f"private {node.attr}"))
            elif isinstance(node, ast.arg) and node.annotation is not None:
                names = {n.id for n in ast.walk(node.annotation) if isinstance(n, ast.Name)}
                names |= {
                    n.value.split(".")[-1]
                    for n in ast.walk(node.annotation)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)
                }
                if names & apps:
                    found.add((cls.name, "app"))
    return found


def tui_modules() -> list[str]:
    return [m.name for m in pkgutil.iter_modules([str(TUI)])]


def classes_of(module: str) -> tuple[set[str], set[str]]:
    """The widget classes and the app classes a console/tui module defines."""
    mod = importlib.import_module(f"console.tui.{module}")
    own = [c for _, c in inspect.getmembers(mod, inspect.isclass) if c.__module__ == mod.__name__]
    widgets = {c.__name__ for c in own if issubclass(c, Widget) and not issubclass(c, Screen)}
    apps = {"App"} | {c.__name__ for c in own if issubclass(c, App)}
    return widgets, apps


def test_the_scan_finds_a_widget_that_reaches_into_the_app_or_another_widget() -> None:
    # The positive control: each way of reaching is found, in widgets only.
    source = """
class Reaching(Widget):
    def __init__(self, owner: "ConsoleApp") -> None:
        self._mine = 1
    def on_mount(self) -> None:
        self.app.hosts["a"].tick()
        self.screen.app.notify("x")
        self.query_one(Other)._rows.clear()
        super()._on_click(None)
class Routing(Screen):
    def on_mount(self) -> None:
        self.app.push_screen(self._x.y._z)
"""
    assert reaches(source, {"Reaching"}, {"App", "ConsoleApp"}) == {
        ("Reaching", "app"),
        ("Reaching", "private _rows"),
    }
    assert reaches(source, set()) == set()


def test_no_widget_reaches_into_the_app_or_another_widgets_internals() -> None:
    found: dict[tuple[str, str, str], None] = {}
    widgets_seen = 0
    for module in tui_modules():
        widgets, apps = classes_of(module)
        widgets_seen += len(widgets)
        source = (TUI / f"{module}.py").read_text()
        for cls, what in sorted(reaches(source, widgets, apps)):
            found[(module, cls, what)] = None
    assert widgets_seen >= 20  # the scan sees the console's widgets (dashboard, panels, feed, bars...)
    unexplained = [key for key in found if key not in ALLOWED]
    assert unexplained == [], "a widget draws what it is given and posts messages; the app routes"
    stale = [key for key in ALLOWED if key not in found]
    assert stale == [], "an allowance no longer needed: remove it"


ROUTERS = ("console.tui.app", "console.tui.replay", "console.tui.host_controller", "console.tui.host_changes")
"""The modules that route: the apps and the host controllers."""


def router_names_used(source: str, widgets: set[str]) -> set[tuple[str, str]]:
    """(class, name) for each name a widget class uses that its module imports from a router."""
    tree = ast.parse(source)
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in ROUTERS
        for alias in node.names
    }
    used: set[tuple[str, str]] = set()
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef) and cls.name in widgets:
            for node in ast.walk(cls):
                if isinstance(node, ast.Name) and node.id in imported:
                    used.add((cls.name, node.id))
                elif (
                    isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in imported
                ):
                    used.add((cls.name, node.value))
    return used


def test_the_import_scan_finds_a_widget_using_the_app() -> None:
    source = """
from console.tui.app import ConsoleApp
from console.tui.host_controller import HostController
class Badge(Widget):
    def bind(self, owner: "ConsoleApp") -> None: ...
class Switch:
    def __init__(self, controllers: dict[str, HostController]) -> None: ...
"""
    assert router_names_used(source, {"Badge"}) == {("Badge", "ConsoleApp")}
    assert router_names_used(source, {"Switch"}) == {("Switch", "HostController")}  # were it a widget


def test_no_widget_uses_what_the_app_or_a_controller_module_defines() -> None:
    offenders = []
    for module in tui_modules():
        if f"console.tui.{module}" in ROUTERS:
            continue
        widgets, _ = classes_of(module)
        offenders += sorted(router_names_used((TUI / f"{module}.py").read_text(), widgets))
    assert offenders == []
