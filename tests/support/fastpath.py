"""The parser fed two ways side by side: `feed` line by line and `feed_many` in chunks (tracebacks held
across chunk edges). The tests assert they build the same events, and that each is exactly what pydantic's
validation reads back of its JSON (the parser builds events without validating them)."""

from __future__ import annotations

import dataclasses
from typing import Any

from console.core.events import event_adapter
from console.core.parser import JournalParser


def careful(items: list[Any], host: str | None = None) -> list[Any]:
    parser = JournalParser(host)
    out: list[Any] = []
    for item in items:
        out.extend(parser.feed(item))
    return out + parser.flush()


def batched(items: list[Any], size: int = 7, *, host: str | None = None) -> list[Any]:
    parser = JournalParser(host)
    out: list[Any] = []
    for start in range(0, len(items), size):
        out.extend(parser.feed_many(items[start : start + size]))
    return out + parser.flush()


def assert_same(expected: list[Any], got: list[Any]) -> None:
    """Equal events, built alike: same type, field values (and their types), JSON, and each one what
    validating its JSON gives."""
    assert len(got) == len(expected)
    for a, b in zip(expected, got, strict=True):
        assert type(a) is type(b)
        assert _values(a) == _values(b)
        assert a.model_dump_json() == b.model_dump_json()
        assert_validates_to_itself(b)


def _values(event: Any) -> list[tuple[str, type, Any]]:
    return [(f.name, type(v), v) for f in dataclasses.fields(event) for v in (getattr(event, f.name),)]


def assert_validates_to_itself(event: Any) -> None:
    """The event is what pydantic's validation makes of its own JSON: same values, of the same types."""
    validated = event_adapter().validate_json(event.model_dump_json())
    assert _values(validated) == _values(event)


def mutate(spec: tuple[str, int, int, str]) -> str:
    """A line with `cut` characters at `at` replaced by `insert` (for hypothesis mutations)."""
    line, at, cut, insert = spec
    return line[:at] + insert + line[at + cut :]
