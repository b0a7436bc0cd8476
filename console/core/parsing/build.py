"""Event fields → typed events, without validation: the handlers type every value themselves.

Each event is made with `EventBase.of` (the fields dict becomes the event's own). That every event the
parser makes is exactly what `event_from_json` would read back of it is held by the tests: the golden
of every corpus file's events (tests/test_parser_contract.py) and the round trips through pydantic's
validation in tests/support/fastpath.py (the same values, of the same types), used by
tests/test_parser_fastpath.py and tests/test_parser_property.py.
"""

from __future__ import annotations

from typing import Any, cast

from console.core.events import EVENT_TYPES, Event


def build_events(drafts: list[dict[str, Any]]) -> list[Event]:
    """The events of these fields (`kind` included); each dict becomes its event's."""
    types = EVENT_TYPES
    return [cast(Event, types[draft["kind"]].of(draft)) for draft in drafts]
