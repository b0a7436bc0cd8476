"""TOML read with a bound on nesting: the hosts file, its `[alerts]` table and the profiles.

`tomllib` recurses once or twice per level of nested arrays and inline tables, so a file nested ~500 deep
(`a = [[[[...]]]]`) raised RecursionError out of every command that reads the hosts file, the exporter's
SIGHUP reload included, as a traceback. Dotted keys (`a.a.a...a = 1`) nest as deep without recursing in
`tomllib`, and then recursed in whatever walked the value. No hosts file or profile nests more than a few
levels, so anything past `MAX_TOML_DEPTH` is refused with one phrase, as bad TOML is.
"""

from __future__ import annotations

import tomllib
from typing import Any

__all__ = ["MAX_TOML_DEPTH", "TomlTooDeep", "load_toml"]

MAX_TOML_DEPTH = 32
"""Tables and arrays inside each other, the document itself counted as one: `[hosts.gpu1]` and
`[alerts]`'s `rules = [...]` are 3 deep, as deep as a hosts file or a shipped profile goes."""


class TomlTooDeep(ValueError):
    """A TOML document nested past `MAX_TOML_DEPTH`; `str()` is a phrase to follow the file's name."""

    def __init__(self) -> None:
        super().__init__(
            f"nests tables or arrays more than {MAX_TOML_DEPTH} levels deep, which no hosts file or profile "
            "needs (the console reads no deeper)"
        )


def _depth_over(data: dict[str, Any], limit: int) -> bool:
    """Whether `data` nests more than `limit` deep; iterative, so a deep document cannot recurse here."""
    stack: list[tuple[object, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values() if isinstance(v, (dict, list)))
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value if isinstance(v, (dict, list)))
    return False


def load_toml(text: str) -> dict[str, Any]:
    """`tomllib.loads(text)`, refusing a document nested past `MAX_TOML_DEPTH` with `TomlTooDeep`; bad
    TOML raises `tomllib.TOMLDecodeError` as before."""
    try:
        data = tomllib.loads(text)
    except RecursionError:
        # tomllib's own stack ran out: caught here, the stack is whole again.
        raise TomlTooDeep() from None
    if _depth_over(data, MAX_TOML_DEPTH):
        raise TomlTooDeep()
    return data
