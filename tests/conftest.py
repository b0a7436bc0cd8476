"""What every test gets, however the suite is started (foreground, `&`, nohup, CI, `-n 4`):

- Signals that work: a shell starts a background job with SIGINT (and nohup with SIGHUP) ignored, and an
  ignored signal stays ignored across fork and exec, so a test's `k26-console` child would ignore the
  SIGINT the test sends it. The suite's process catches them with a handler that does nothing instead:
  to the suite the signal is still ignored, but a caught signal is reset to its default at exec, so every
  child starts as it would from a terminal.
- Its own config and state: XDG_CONFIG_HOME, XDG_STATE_HOME, XDG_CACHE_HOME and XDG_DATA_HOME point into a
  directory of this process (each xdist worker has its own), never the operator's real
  ~/.config/k26-console/hosts.toml, which a test that forgot `operator_env` would otherwise read, and
  which parallel workers would write at once.
- An xdist group per module (see `xdist_group_of`), and the `serial` marker (in pyproject.toml) for tests
  that measure time or CPU: `scripts/test` runs those alone, after the parallel pass (see there).
- Modules queued longest first (`LongestFirst`, figures in tests/durations.json), so that no worker is
  left with a long module after the others have finished.
"""

from __future__ import annotations

import asyncio
import inspect
import io
import os
import random
import shutil
import signal
import statistics
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import FrameType

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
CORPUS = SHARED / "corpus"

# The signals a test sends its children; a launcher may have set them ignored (`&`: INT and QUIT, nohup: HUP).
CHILD_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT)
XDG_VARS = ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME")
_xdg_root: Path | None = None


def _still_ignored(signum: int, frame: FrameType | None) -> None:
    """The suite goes on ignoring the signal; only its children get the default back (at exec)."""


IGNORED_ENV = "K26_TESTS_IGNORED_SIGNALS"


def children_start_with_default_signals() -> None:
    """What the suite was started ignoring it goes on ignoring, through a handler (reset at exec). The list
    travels in the environment to xdist's workers, which are children too: a Ctrl-C meant for the shell
    that backgrounded the suite must not stop them either."""
    inherited = {int(n) for n in os.environ.get(IGNORED_ENV, "").split(",") if n}
    ignored = [s for s in CHILD_SIGNALS if signal.getsignal(s) is signal.SIG_IGN or s in inherited]
    for sig in ignored:
        signal.signal(sig, _still_ignored)
    os.environ[IGNORED_ENV] = ",".join(str(int(s)) for s in ignored)


class LongestFirst:
    """Queue the modules longest first (xdist hands a free worker the next module in the queue; with
    `--no-loadscope-reorder`, as `scripts/test` runs it, in this order). Each module's measured time is
    scaled by a factor between 0.75 and 1.25 drawn from the run's seed (pytest-randomly), so modules of
    similar length still come in varying order; the order of the tests inside a module is left as
    pytest-randomly made it. A module's time is the sum of its selected tests' in tests/durations.json; a
    test not there counts as a median one."""

    @pytest.hookimpl(trylast=True)  # after pytest-randomly's shuffle and pytest's own fixture grouping
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        from tests.support.durations import load, plain_nodeid

        durations = load()
        default = statistics.median(durations.values()) if durations else 1.0
        seed = getattr(config.option, "randomly_seed", None)
        cost: dict[str, float] = {}
        for item in items:  # the tests this pass selected (`-m` has deselected the others by now)
            module = item.nodeid.split("::", 1)[0]
            cost[module] = cost.get(module, 0.0) + durations.get(plain_nodeid(item.nodeid), default)
        for module in cost:
            if seed is not None:
                cost[module] *= random.Random(f"{seed}:{module}").uniform(0.75, 1.25)
        first_seen = {m: i for i, m in enumerate(cost)}
        items.sort(
            key=lambda it: (-cost[it.nodeid.split("::", 1)[0]], first_seen[it.nodeid.split("::", 1)[0]])
        )


def pytest_configure(config: pytest.Config) -> None:
    global _xdg_root
    config.pluginmanager.register(LongestFirst(), "k26-longest-first")
    children_start_with_default_signals()
    _xdg_root = Path(tempfile.mkdtemp(prefix="k26-tests-xdg-"))
    for var in XDG_VARS:
        path = _xdg_root / var.removeprefix("XDG_").removesuffix("_HOME").lower()
        path.mkdir()
        os.environ[var] = str(path)


def xdg_root() -> Path:
    """The directory this process's XDG_* variables point into."""
    assert _xdg_root is not None, "pytest_configure has not run"
    return _xdg_root


def pytest_unconfigure(config: pytest.Config) -> None:
    if _xdg_root is not None:
        shutil.rmtree(_xdg_root, ignore_errors=True)


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    if not CORPUS.is_dir():
        pytest.fail(f"the shared corpus is missing at {CORPUS}")
    return CORPUS


@pytest.fixture(autouse=True)
def no_colour_name_misses(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail any test in which Textual met a colour name it does not know.

    A Rich `Text` reaches Textual as content whose string styles Textual parses with its own colour
    names, which lack Rich's (`grey50`, `yellow3`, `steel_blue1`...): the text is drawn in the default
    colour and every render pays ~2 ms for a did-you-mean suggestion. Styles built with
    `console.tui.view.rich_style` (Rich `Style` objects) never take that path."""
    import textual.color

    misses: list[str] = []
    suggest = textual.color.get_suggestion

    def record(word: str, possible: list[str]) -> str | None:
        misses.append(word)
        return suggest(word, possible)

    monkeypatch.setattr(textual.color, "get_suggestion", record)
    yield
    assert not misses, f"Textual could not parse these colour names (use rich_style): {sorted(set(misses))}"


LEFTOVER_GRACE_S = 20.0


# tryfirst: before xdist's worker reads the xdist_group marks into the node ids.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        # First in the list: set up before the test's other fixtures, so torn down after them.
        if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(item.function):
            item.fixturenames.insert(0, "leftover_tasks_end")
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(xdist_group_of(item)))


def xdist_group_of(item: pytest.Item) -> str:
    """The xdist work unit of a test (`scripts/test` runs `--dist loadgroup`): its module, so a module's
    twin, sshd or tmux fixture starts once, in one worker; split by the parameter of a module-scoped
    parametrized fixture (the simulated and the real systemd twin of one module go to two workers).
    A test's own `xdist_group` mark wins. Without xdist the mark does nothing."""
    group = item.nodeid.split("::", 1)[0]
    callspec = getattr(item, "callspec", None)
    info = getattr(item, "_fixtureinfo", None)
    if callspec is None or info is None:
        return group
    for name in sorted(callspec.params):
        defs = info.name2fixturedefs.get(name)
        if defs and defs[-1].scope in ("module", "package", "session"):
            # No "[", "]" or "@": xdist finds the group after the last "@" of the node id.
            group += f":{name}={callspec.indices[name]}"
    return group


@pytest.fixture
async def leftover_tasks_end() -> AsyncIterator[None]:
    """After an async test and its fixtures, cancel the tasks it left running and name any that do
    not end. pytest-asyncio would cancel them too, but waits for them without a bound: a task that
    ignores its cancellation (3.11's `wait_for` dropped one in a journal consumer) hung a CI run for
    300 s and the timeout's dump showed only idle threads, never the task."""
    yield
    me = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    for task in left:
        task.cancel()
    if not left:
        return
    _, pending = await asyncio.wait(left, timeout=LEFTOVER_GRACE_S)
    if pending:
        stacks = []
        for task in pending:
            out = io.StringIO()
            task.print_stack(file=out)
            stacks.append(out.getvalue())
        pytest.fail(
            f"{len(pending)} task(s) left by the test still running {LEFTOVER_GRACE_S:g} s after "
            "cancellation:\n" + "\n".join(stacks)
        )
