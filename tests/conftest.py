from __future__ import annotations

import asyncio
import inspect
import io
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
CORPUS = SHARED / "corpus"


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # First in the list: set up before the test's other fixtures, so torn down after them.
    for item in items:
        if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(item.function):
            item.fixturenames.insert(0, "leftover_tasks_end")


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
