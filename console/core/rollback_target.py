"""Where a rollback goes, in words and in a target: the profile named in the header of the drop-in the
last apply kept, else that drop-in or the unit's own ExecStart. A rollback's audit line once read "rolled
back to rollback", and its verdict compared the pool with the pool it had before ("pool X ≥ X")."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

PREVIOUS_DROPIN = "the previous drop-in"
UNIT_DEFAULT = "the unit's own ExecStart"

MAX_TARGET = 100_000_000
"""A target context beyond any model's: a header claiming more is not the console's."""

_HEADER = re.compile(
    r"^#\s*Written by k26-console: profile ([A-Za-z0-9][A-Za-z0-9_.-]{0,63}) "
    r"\(target context ([0-9][0-9,]{0,14}) tokens\b"
)
_HEADER_LINES = 8
"""Only the comment lines on top are the console's header: `[Service]` follows them."""


class RollbackTarget(BaseModel):
    """What the rollback puts back: `name` is the profile's name when the kept drop-in's header names it,
    else `PREVIOUS_DROPIN` or `UNIT_DEFAULT`; `target_context` that profile's target, when known."""

    model_config = ConfigDict(frozen=True)

    name: str
    profile: str | None = None
    target_context: int | None = Field(default=None, gt=0, le=MAX_TARGET)


def rollback_target(previous_dropin: str | None) -> RollbackTarget:
    """`previous_dropin`: the text of the drop-in the last apply kept, None when there is none (the
    rollback removes the console's drop-in). The host's file is untrusted: only a header of the console's
    own form, in the file's first lines, names a profile."""
    if previous_dropin is None:
        return RollbackTarget(name=UNIT_DEFAULT)
    for line in previous_dropin.split("\n", _HEADER_LINES)[:_HEADER_LINES]:
        if not line.startswith("#"):
            break
        found = _HEADER.match(line)
        if found is None:
            continue
        target = int(found.group(2).replace(",", ""))
        if not 0 < target <= MAX_TARGET:
            break
        return RollbackTarget(name=found.group(1), profile=found.group(1), target_context=target)
    return RollbackTarget(name=PREVIOUS_DROPIN)


def pool_verdict(
    tokens: int, target: int | None = None, *, whose: str | None = None, before: int | None = None
) -> str:
    """The verified pool in words, never against itself: against the target in force (`whose`: the
    profile it is the target of), else against the pool `before` the change, else alone."""
    if target is not None and target > 1:
        return f"pool {tokens:,} tokens ≥ {target:,}" + (f" ({whose}'s target)" if whose else "")
    if before is not None:
        if tokens == before:
            return f"pool {tokens:,} tokens, as before the apply"
        return f"pool {tokens:,} tokens ({before:,} before the apply)"
    return f"pool {tokens:,} tokens"
