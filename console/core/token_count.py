"""The one reader of a number of tokens written by a person: `200000`, `200_000`, `200,000`, `200k`,
`200K`, `25.6k`, `1M`, `128Ki`.

It is SGLang's own grammar (`flags.human_readable_int`, what the server's argparse accepts) with what
people type besides: an upper-case `K` and thousands commas. It refuses what no context or KV pool
reaches: the G and T suffixes (a billion tokens would need petabytes of KV cache; `1G` is far more often
a slip for `1M` or a memory size), and anything past int32, the most SGLang indexes.
"""

from __future__ import annotations

import re
from decimal import Decimal

from console.core.capacity import MAX_TOKENS, range_text
from console.core.flags import human_readable_int

MAX_WORD_CHARS = 40
"""Longer words are refused before any arithmetic (`int()` of thousands of digits is slow)."""

_SPAN = f"{range_text(1, MAX_TOKENS)} tokens, the most SGLang indexes"
_WORD = re.compile(r"(?P<number>[0-9][0-9_,]*(?:\.[0-9]+)?)\s*(?P<suffix>[A-Za-z]*)")
_GROUPED = re.compile(r"[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?")
_UNDERSCORED = re.compile(r"[0-9]+(?:_[0-9]+)*(?:\.[0-9]+)?")
_SUFFIXES = {"k": "k", "K": "k", "M": "M", "Ki": "Ki", "Mi": "Mi"}
_SCALE = {"k": 1000, "M": 1_000_000}
_TOO_LARGE_SUFFIXES = {"G", "Gi", "T", "Ti"}


class TokenCountError(ValueError):
    """A word that is not a number of tokens; the message is one sentence that says why."""


def read_token_count(text: str) -> int:
    """A number of tokens, 1 to MAX_TOKENS; TokenCountError (one sentence) otherwise."""
    word = text.strip()
    shown = repr(word) if len(word) <= MAX_WORD_CHARS else repr(word[:MAX_WORD_CHARS]) + "…"
    if len(word) > MAX_WORD_CHARS:
        raise TokenCountError(f"{shown} is too many tokens ({_SPAN})")
    if word.startswith("-"):
        raise TokenCountError(f"{shown} is not a positive number of tokens ({_SPAN})")
    match = _WORD.fullmatch(word)
    if match is None:
        raise TokenCountError(
            f"{shown} is not a whole number of tokens (write 200000, 200,000, 200k, 25.6k or 1M; {_SPAN})"
        )
    number, suffix = match["number"], match["suffix"]
    if suffix in _TOO_LARGE_SUFFIXES:
        raise TokenCountError(
            f"{shown} is refused: {suffix} counts billions or more of tokens, which no context or KV pool "
            f"reaches (did you mean {number}M?); token counts take k, K, M, Ki or Mi"
        )
    if suffix and suffix not in _SUFFIXES:
        raise TokenCountError(
            f"{shown} has the suffix {suffix!r}, which is not one for tokens (k, K, M, Ki or Mi: 200k, 1M)"
        )
    if "," in number and not _GROUPED.fullmatch(number):
        raise TokenCountError(f"{shown} is not a whole number of tokens (commas group thousands: 200,000)")
    if "_" in number and not _UNDERSCORED.fullmatch(number):
        raise TokenCountError(f"{shown} is not a whole number of tokens (underscores group digits: 200_000)")
    if "." in number and not suffix:
        raise TokenCountError(f"{shown} is not a whole number of tokens (a decimal needs k or M: 25.6k)")
    plain = number.replace(",", "").replace("_", "")
    sglang_word = plain + (_SUFFIXES[suffix] if suffix else "")
    try:
        value = human_readable_int(sglang_word)
    except ValueError as exc:  # decimals with an IEC suffix, as SGLang refuses them
        raise TokenCountError(f"{shown} is not a whole number of tokens ({exc})") from None
    if "." in plain and Decimal(plain) * _SCALE[_SUFFIXES[suffix]] != value:
        raise TokenCountError(f"{shown} is not a whole number of tokens (SGLang would cut it to {value:,})")
    if value <= 0:
        raise TokenCountError(f"{shown} is not a positive number of tokens ({_SPAN})")
    if value > MAX_TOKENS:
        raise TokenCountError(f"{shown} is too many tokens ({_SPAN})")
    return value


__all__ = ["MAX_WORD_CHARS", "TokenCountError", "read_token_count"]
