"""Numbers and `key: value` lists as SGLang prints them. A truncated or mangled line must not raise."""

from __future__ import annotations

import re

_INF = float("inf")


def to_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


_SMALL_COUNTS: dict[str, int] = {str(n): n for n in range(1024)}


def count(digits: str) -> int:
    """A count of digits only (a regex group `\\d+`): requests, sequences, an HTTP status. The small
    ones, most of a journal's, come from a table: `int()` costs several times a dict lookup."""
    n = _SMALL_COUNTS.get(digits)
    return int(digits) if n is None else n


def to_float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    # "nan"/"inf" parse as floats but are not numbers SGLang prints; JSON cannot carry them either.
    return value if value == value and value != _INF and value != -_INF else None


def gb(text: str) -> float | None:
    """`4.38 GB` / `4.38GB` / `4.38` → 4.38 (SGLang's GB are GiB; kept as printed)."""
    return to_float(text.removesuffix("GB").removesuffix(" "))


def seconds(text: str) -> float | None:
    return to_float(text.removesuffix("s").strip())


def to_bool(text: str) -> bool | None:
    return True if text == "True" else False if text == "False" else None


def split_fields(text: str, sep: str) -> dict[str, str]:
    """`#running-req: 5, token usage: 0.29, ` → {'#running-req': '5', 'token usage': '0.29'}."""
    out: dict[str, str] = {}
    for part in text.split(", "):
        key, found, value = part.partition(sep)
        if found:
            out[key.strip()] = value.strip()
    return out


# `avail mem=4.38 GB`, `mem usage=0.60 GB`, `elapsed=2.62 s`, `Time elapsed: 3.74 s`, `type=X`, ...
_KV = re.compile(r"(avail mem|mem usage|elapsed|type|dtype)(?:=|: )([^,\s]+)", re.ASCII)


def named_values(msg: str) -> dict[str, str]:
    """The `avail mem` / `mem usage` / `elapsed` / `type` / `dtype` values anywhere in a message."""
    return dict(_KV.findall(msg))
