"""Errors: the signatures that name a category, and the Python traceback being collected for one process."""

from __future__ import annotations

import re
from typing import Any

# Error signatures anywhere in a line that no handler claimed, most specific first. The cheap `in`
# pre-checks on `HINTS` keep ordinary noise lines from paying for the whole table.
_SIGNS: tuple[tuple[str, str], ...] = (
    ("CUDA out of memory", "cuda_oom"),
    ("OutOfMemoryError", "cuda_oom"),
    ("HIP out of memory", "cuda_oom"),
    ("Not enough memory", "not_enough_memory"),
    ("leave no GPU memory for the KV cache", "not_enough_memory"),
    ("Memory pool size is too small", "not_enough_memory"),
    ("Capture cuda graph failed", "cuda_graph_failed"),
    ("Capture CUDA graph failed", "cuda_graph_failed"),
    ("Watchdog caught collective operation timeout", "nccl_timeout"),
    ("Some NCCL operations have failed or timed out", "nccl_timeout"),
    ("DistBackendError", "nccl_timeout"),
    ("watchdog timeout", "watchdog_timeout"),
    ("Watchdog timeout", "watchdog_timeout"),
    ("Received sigquit", "sigquit"),
    ("SIGQUIT", "sigquit"),
    ("Scheduler hit an exception", "scheduler_exception"),
    ("hit an exception", "other"),
)
HINTS = ("emory", "ailed", "imeout", "IGQUIT", "igquit", "xception", "rror")
"""Every signature holds one of these: a message with none of them is no error."""


def error_category(text: str, in_traceback: bool = False) -> str | None:
    for needle, category in _SIGNS:
        # Inside a traceback `SIGQUIT` is code (`signal.SIGQUIT`), not the message that it arrived.
        if in_traceback and category == "sigquit":
            continue
        if needle in text:
            return category
    return None


def line_error_category(msg: str) -> str | None:
    """The category of a one-line error message, None for any other line."""
    for hint in HINTS:
        if hint in msg:
            return error_category(msg)
    return None


TB_HEAD = "Traceback (most recent call last):"


def opens_traceback(msg: str) -> bool:
    """Whether the frames of a traceback follow this line (`Traceback (…):`, `Exception in thread …:`)."""
    return msg[-1:] == ":" and (msg.endswith(TB_HEAD) or msg.startswith("Exception in "))


_EXC_SUMMARY = re.compile(r"[A-Za-z_][\w.]*(?::(?: |$)|$)", re.ASCII)
_NUMBERED = re.compile(r"\d+\. ", re.ASCII)
_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
# Lines SGLang prints under `Capture cuda graph failed: …` / `Fail when using backend …`.
_EXC_TAIL = ("Possible solutions:", "Possible suggestions:", "Open an issue on GitHub")


class HeldTraceback:
    """A traceback being collected for one source (process)."""

    __slots__ = ("blank_tail", "first_message", "last_seen", "lines", "meta", "summary", "tail_meta")

    def __init__(self, meta: dict[str, Any], first_message: str, seen: int) -> None:
        self.meta = meta
        self.lines: list[str] = [meta["raw"]]
        self.first_message = first_message
        self.summary: str | None = None
        self.last_seen = seen
        self.tail_meta = meta
        # Metadata of the blank lines at the end so far: they are given back as `log` events when the
        # traceback turns out to have ended before them.
        self.blank_tail: list[dict[str, Any]] = []

    def continues(self, msg: str) -> bool:
        if not msg or msg.isspace():
            return True
        first = msg[0]
        if first == " " or first == "\t":
            return True
        if msg.startswith(TB_HEAD):
            self.summary = None  # a chained traceback follows; its own summary comes later
            return True
        if msg.startswith(_CHAIN):
            return True
        if self.summary is None:
            if _EXC_SUMMARY.match(msg):
                self.summary = msg
                return True
            return False
        return msg.startswith(_EXC_TAIL) or _NUMBERED.match(msg) is not None

    def add(self, msg: str, meta: dict[str, Any], seen: int) -> None:
        self.lines.append(meta["raw"])
        self.last_seen = seen
        if not msg or msg.isspace():
            self.blank_tail.append(meta)
        else:
            self.blank_tail = []
            self.tail_meta = meta

    def close(self) -> list[dict[str, Any]]:
        """The `error` event's fields, then a `log` for each blank line after the traceback's end."""
        blanks = self.blank_tail
        body = self.lines[: len(self.lines) - len(blanks)]
        text = "\n".join(body)
        category = error_category(text, in_traceback=True) or "traceback"
        if category == "other":
            category = "traceback"
        fields = dict(self.meta)
        fields["raw"] = text
        tail_cursor = self.tail_meta.get("cursor")
        if tail_cursor is not None:
            # A follower resumes after the cursor it last saw: the error's is that of its last line.
            fields["cursor"] = tail_cursor
        fields.update(kind="error", category=category, message=self.summary or self.first_message, lines=body)
        return [fields] + [{**blank, "kind": "log", "message": ""} for blank in blanks]
