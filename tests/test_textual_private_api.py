"""The private parts of Textual the console leans on, each named here and checked for the shape the console
uses: when a Textual upgrade moves one, this module fails, naming it, before a console misbehaves on a
hung-up terminal. Why each is used (and the upstream reports that would make it unnecessary):
docs/textual-upstream.md."""

from __future__ import annotations

import ast
import asyncio
import inspect
import queue
import re
import signal
import tomllib
from contextvars import ContextVar
from pathlib import Path

import textual
from textual import events
from textual.app import App
from textual.drivers._writer_thread import WriterThread
from textual.drivers.linux_driver import LinuxDriver
from textual.widgets import DataTable

ROOT = Path(__file__).resolve().parents[1]

# Every private Textual module the console's code imports, and where (a new one must be added here, with its
# check below).
PRIVATE_MODULES = {
    "textual._xterm_parser": {"console/tui/lifeline.py"},
    "textual._context": {"console/tui/themes.py"},
}
# Every private attribute of a Textual object the console's code reads, writes or overrides, and where.
PRIVATE_ATTRIBUTES = {
    "_file": {"console/tui/lifeline.py"},
    "_writer_thread": {"console/tui/lifeline.py"},
    "_queue": {"console/tui/lifeline.py"},
    "_debug": {"console/tui/lifeline.py"},
    "_auto_restart": {"console/tui/lifeline.py"},
    "_sigtstp_application": {"console/tui/lifeline.py"},
    "_sigcont_application": {"console/tui/lifeline.py"},
    "_exit": {"console/tui/app.py"},
    "_post_selected_message": {"console/tui/fleet.py"},
    "_cell_render_cache": {"console/tui/fleet.py"},
    "_row_render_cache": {"console/tui/fleet.py"},
    "_row_renderable_cache": {"console/tui/fleet.py"},
    "_line_cache": {"console/tui/fleet.py"},
    # Timer's loop, replaced, and what the replacement reads (bug 4 in docs/textual-upstream.md).
    "_run": {"console/tui/timer_slots.py"},
    "_repeat": {"console/tui/timer_slots.py"},
    "_interval": {"console/tui/timer_slots.py"},
    "_active": {"console/tui/timer_slots.py"},
    "_skip": {"console/tui/timer_slots.py"},
    "_reset": {"console/tui/timer_slots.py"},
    "_tick": {"console/tui/timer_slots.py"},
}


def test_textual_is_the_pinned_version() -> None:
    # The checks below were written against this version; a new pin must pass them (or change them with
    # the console's code).
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = next(d for d in deps if d.startswith("textual=="))
    assert pin == f"textual=={textual.__version__}"


def _private_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("textual"):
            if any(part.startswith("_") for part in node.module.split(".")):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("textual") and any(p.startswith("_") for p in alias.name.split(".")):
                    found.add(alias.name)
    return found


def test_every_private_textual_module_the_console_imports_is_named_here() -> None:
    seen: dict[str, set[str]] = {}
    for path in sorted((ROOT / "console").rglob("*.py")):
        for module in _private_imports(path):
            seen.setdefault(module, set()).add(str(path.relative_to(ROOT)))
    assert seen == PRIVATE_MODULES


def test_the_scan_finds_a_private_import(tmp_path: Path) -> None:
    # The positive control of the scan above.
    sample = tmp_path / "sample.py"
    sample.write_text("import textual._compositor\nfrom textual.drivers._writer_thread import WriterThread\n")
    assert _private_imports(sample) == {"textual._compositor", "textual.drivers._writer_thread"}


def test_every_private_attribute_named_here_is_used_where_it_says() -> None:
    # Kept honest both ways: an attribute the console stops using is taken off the list.
    for name, files in PRIVATE_ATTRIBUTES.items():
        for rel in files:
            text = (ROOT / rel).read_text()
            assert re.search(rf"\b{name}\b", text), f"{rel} no longer uses Textual's {name}"


def test_the_xterm_parser_turns_bytes_into_key_events() -> None:
    from textual._xterm_parser import XTermParser

    parser = XTermParser(False)
    got = list(parser.feed("q")) + list(parser.tick())
    keys = [e for e in got if isinstance(e, events.Key)]
    assert [k.key for k in keys] == ["q"]
    # An escape alone is a key only once tick() decides no sequence follows: lifeline's input loop calls it.
    assert hasattr(parser, "tick")


def test_active_app_is_the_context_variable_of_the_running_app() -> None:
    from textual._context import active_app

    assert isinstance(active_app, ContextVar)
    assert active_app.get(None) is None


async def test_the_linux_driver_keeps_what_the_lifeline_driver_overrides() -> None:
    app: App[None] = App()
    # The driver installs its SIGTSTP and SIGCONT handlers when made: this test's worker gets its own back.
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTSTP, signal.SIGCONT)}
    try:
        driver = LinuxDriver(app, debug=False, mouse=False, size=(80, 24))  # it takes the running loop
        assert signal.getsignal(signal.SIGCONT) == driver._sigcont_application
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    # The terminal's file, handed only to the WriterThread (the lifeline wraps it).
    assert driver._file is not None and hasattr(driver._file, "fileno")
    assert driver._writer_thread is None  # made in start_application_mode
    assert driver._debug is False
    assert isinstance(driver._auto_restart, bool)
    assert driver.exit_event.is_set() is False
    for method in ("_sigtstp_application", "_sigcont_application", "run_input_thread", "process_message"):
        assert callable(getattr(driver, method)), method
    # The lifeline's input loop replaces this one: it must still be the loop that feeds an XTermParser.
    source = inspect.getsource(LinuxDriver.run_input_thread)
    assert "XTermParser(self._debug)" in source and "exit_event" in source
    # Its Ctrl+Z handlers are the ones the driver installs for SIGTSTP and SIGCONT (and never removes:
    # LifelineDriver.close does).
    init = inspect.getsource(LinuxDriver.__init__)
    assert "signal.signal(signal.SIGTSTP, self._sigtstp_application)" in init
    assert "signal.signal(signal.SIGCONT, self._sigcont_application)" in init
    assert "WriterThread(self._file)" in inspect.getsource(LinuxDriver.start_application_mode)


def test_the_writer_threads_queue_is_bounded() -> None:
    class Sink:
        def write(self, text: str) -> None: ...
        def flush(self) -> None: ...
        def fileno(self) -> int:
            return 1

    writer = WriterThread(Sink())  # type: ignore[arg-type]
    assert isinstance(writer._queue, queue.Queue)
    # Bounded: a frozen terminal blocks the writer of the 31st write; that is what unblock_output undoes.
    assert writer._queue.maxsize > 0


def test_app_exit_sets_the_flag_the_console_reads() -> None:
    app: App[None] = App()
    assert app._exit is False
    assert re.search(r"self\._exit\s*=\s*True", inspect.getsource(App.exit))


def test_the_data_table_posts_a_selection_from_its_private_method() -> None:
    assert callable(DataTable._post_selected_message)
    source = inspect.getsource(DataTable._post_selected_message)
    assert "RowSelected" in source and "CellSelected" in source


def test_the_data_tables_render_caches_are_lru_caches_keyed_by_the_update_count() -> None:
    # The fleet overview sizes them to its own table (FleetTable.bound_caches): a smaller maxsize must
    # bound them, and only the current update count's entries may be read again.
    from textual.cache import LRUCache

    table: DataTable[str] = DataTable()
    for name in ("_cell_render_cache", "_row_render_cache", "_row_renderable_cache", "_line_cache"):
        cache = getattr(table, name)
        assert isinstance(cache, LRUCache), name
        cache.maxsize = 3
        for key in range(10):
            cache[key] = key
        assert len(cache) <= 4 and 9 in cache, (name, len(cache))
    for method in ("_render_cell", "_render_line_in_row", "_render_line"):
        assert "self._update_count" in inspect.getsource(getattr(DataTable, method)), method


def test_the_timer_loop_the_console_replaces_still_skips_one_slot_too_many() -> None:
    # console/tui/timer_slots.py exists for this line. When an upgrade changes Textual's loop, read the new
    # one: if it ticks on the next slot after falling behind, drop timer_slots.py (and this test).
    from textual.timer import Timer

    from console.tui.timer_slots import STOCK_RUN

    source = inspect.getsource(STOCK_RUN)
    assert "count = int((now - start) / _interval + 1)" in source
    assert "next_timer = start + ((count + 1) * _interval)" in source
    # What the replacement reads and calls, with the names and shapes it uses.
    timer = Timer(App(), 0.5, repeat=3, pause=True)
    assert (timer._repeat, timer._interval, timer._skip, timer._reset) == (3, 0.5, True, False)
    assert isinstance(timer._active, asyncio.Event) and not timer._active.is_set()
    assert list(inspect.signature(Timer._tick).parameters) == ["self", "next_timer", "count"]
    assert "self._run()" in inspect.getsource(Timer._run_timer)
    # A key's frame hurries the screens' repaint timers, found by the name Textual gives them.
    from textual.screen import Screen

    from console.tui.timer_slots import SCREEN_TIMER

    update_timer = Screen._update_timer.fget  # type: ignore[attr-defined]
    assert f'name="{SCREEN_TIMER}"' in inspect.getsource(update_timer)
