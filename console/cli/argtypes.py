"""Argument types the commands share (`--target-context 200k`, a fraction, a count): a light module, so a
command that takes a number of tokens does not import the planner's command to read one."""

from __future__ import annotations

import argparse
import math


def human_int(text: str) -> int:
    """An argparse type for a number of tokens, read by the console's one token-count reader."""
    from console.core.token_count import TokenCountError, read_token_count

    try:
        return read_token_count(text)
    except TokenCountError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def fraction(text: str) -> float:
    """A `--mem-fraction-static`: a number strictly between 0 and 1."""
    try:
        value = finite_float(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (a fraction strictly between 0 and 1)") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction strictly between 0 and 1")
    return value


def positive_int(text: str) -> int:
    if len(text.strip()) > 30:
        raise argparse.ArgumentTypeError(f"{text[:30]!r}… is too large")
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value
