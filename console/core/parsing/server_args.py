"""The `server_args=` dump: `ServerArgs(model_path='x', tp_size=8, …)` (≤0.5.13) or a dict repr (0.5.23).

Read as Python literals (`ast.literal_eval`, never `eval`); object reprs SGLang cannot print as
literals (`<Enum.X: 1>`, `PosixPath(...)`) are kept as their text, and a truncated dump gives the
arguments before the cut.
"""

from __future__ import annotations

import ast
from typing import Any


def _split_top_level(text: str) -> list[str]:
    """Split `a=1, b='x, y', c=[1, 2]` on the commas outside quotes and brackets."""
    parts: list[str] = []
    depth = 0
    quote = ""
    start = 0
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def parse_server_args(text: str) -> dict[str, Any]:
    """The dict behind a `server_args=` dump, whichever repr SGLang used; tolerant of truncation."""
    text = text.strip()
    if text.startswith("{"):
        value = _literal(text)
        if isinstance(value, dict):
            return {str(k): v for k, v in value.items()}
        body = text[1:].removesuffix("}")
        args: dict[str, Any] = {}
        for part in _split_top_level(body):
            key, found, value_text = part.partition(":")
            if found:
                args[str(_literal(key.strip()))] = _literal(value_text.strip())
        return args
    open_at = text.find("(")
    body = text[open_at + 1 :] if open_at >= 0 else text
    body = body.removesuffix(")")
    args = {}
    for part in _split_top_level(body):
        key, found, value_text = part.partition("=")
        if found and key.isidentifier():
            args[key] = _literal(value_text)
    return args
