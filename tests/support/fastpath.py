"""The parser fed two ways side by side: `feed` line by line and `feed_many` in chunks (one validation
call per chunk, tracebacks held across chunk edges). The tests assert they build the same events."""

from __future__ import annotations

from typing import Any

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
    """Equal events, built alike: same type, field values and order, JSON, and pydantic's own slots."""
    assert len(got) == len(expected)
    for a, b in zip(expected, got, strict=True):
        assert type(a) is type(b)
        assert list(a.__dict__.items()) == list(b.__dict__.items())  # values and field order
        assert a.model_dump_json() == b.model_dump_json()
        assert a.__pydantic_fields_set__ == b.__pydantic_fields_set__
        assert (a.__pydantic_extra__, a.__pydantic_private__) == (
            b.__pydantic_extra__,
            b.__pydantic_private__,
        )


def mutate(spec: tuple[str, int, int, str]) -> str:
    """A line with `cut` characters at `at` replaced by `insert` (for hypothesis mutations)."""
    line, at, cut, insert = spec
    return line[:at] + insert + line[at + cut :]
