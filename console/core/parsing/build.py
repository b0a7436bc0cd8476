"""Event fields → typed events, through pydantic's public validation.

The parser collects each event as a plain dict of its fields (`kind` included) and has them validated
in one call per batch: `TypeAdapter(list[Event])` picks each model by `kind` and checks every value,
so an event the parser hands out is exactly what `event_from_json` would read back. One call per batch
rather than one per event keeps pydantic's per-call cost out of the per-line cost.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError

from console.core.events import EVENT_ADAPTER, Event, Log

_EVENTS: TypeAdapter[list[Event]] = TypeAdapter(list[Event])


def build_events(drafts: list[dict[str, Any]]) -> list[Event]:
    if not drafts:
        return []
    try:
        return _EVENTS.validate_python(drafts)
    except ValidationError:
        return [_build_one(draft) for draft in drafts]


def _build_one(draft: dict[str, Any]) -> Event:
    try:
        return EVENT_ADAPTER.validate_python(draft)
    except ValidationError:
        # Not reachable from the parser's own handlers (they type every value); if one ever is, the
        # line is kept as a `log` rather than lost or raised.
        raw = draft.get("raw")
        raw = raw if isinstance(raw, str) else ""
        host = draft.get("host")
        return Log(host=host if isinstance(host, str) else None, raw=raw, message=raw)
