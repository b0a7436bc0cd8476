from __future__ import annotations

from collections.abc import Iterator
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
