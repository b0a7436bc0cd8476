"""SGLang release strings as numbers, for the code that depends on a release (what a release's metrics
are named, whether it reserves a multimodal budget). A module of its own: `verify` and `plan` need it
through the capacity model, and importing it from `serving_metrics` made them build that module's
metric table (two pydantic schemas, 45 instances: ~3.5 ms of every start) for one function."""

from __future__ import annotations


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """`0.5.12.post1` → (0, 5, 12, 1); None when unknown or unreadable."""
    if not version:
        return None
    parts: list[int] = []
    for piece in version.strip().lstrip("v").replace("post", "").replace("rc", ".").split("."):
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None
