"""What a host session makes of its inputs: the one place where journal entries, GPU samples and server
readings become the state a `HostSnapshot` shows.

`console.sources.session.HostSession` feeds it what its SSH readers bring in; a replay
(`console.sources.replay`) feeds it the same inputs read back from a recording. Both therefore show the
very same boots, pool, serving figures and event tail for the same inputs: there is no second path from
inputs to a snapshot. Nothing here does I/O or reads the clock — times are passed in.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from console.core.events import DecodeBatch, Event, PrefillBatch
from console.core.gpuhealth import XidWatch
from console.core.gpus import HostGpuSample
from console.core.parser import JournalParser
from console.core.serving import DEFAULT_WINDOW_S, Scrape, ServingFigures, TrendPoint
from console.core.serving_history import ServingHistory
from console.core.snapshot import (
    ConnectionStatus,
    FollowerStatus,
    HealthState,
    HostSnapshot,
    ServerSample,
)
from console.core.state import HostState

MAX_SCRAPES = 600
"""The most `/metrics` scrapes a session keeps, whatever its window and interval (one scrape of SGLang
0.5.12 parsed is about 140 samples)."""


class HostFold:
    """The parser, the folded state, the event tail, the latest GPU and server readings and the serving
    window of one host."""

    def __init__(
        self,
        host: str,
        *,
        keep_events: int = 2000,
        serving_window_s: float = DEFAULT_WINDOW_S,
        server_interval_s: float = 2.0,
    ) -> None:
        self.host = host
        self.parser = JournalParser(host=host)
        self.state = HostState.empty()
        self.recent: deque[Event] = deque(maxlen=keep_events)
        self.events_total = 0
        self.gpus: HostGpuSample | None = None
        self.xids = XidWatch()
        self.server: ServerSample | None = None
        # The window's scrapes at the server interval (5 min at 2 s: 151), never more than MAX_SCRAPES.
        self.history = ServingHistory(
            window_s=serving_window_s,
            max_scrapes=min(MAX_SCRAPES, math.ceil(serving_window_s / max(server_interval_s, 0.1)) + 1),
        )
        self.serving: ServingFigures | None = None
        self.trend: tuple[TrendPoint, ...] = ()
        self.max_running: float | None = None

    # ---- inputs ------------------------------------------------------------------------------------

    def journal(self, entries: Iterable[str | bytes | dict[str, Any]]) -> list[Event]:
        """Journal entries (`journalctl -o json` objects) parsed and folded; the events they made."""
        events = self.parser.feed_many(entries)
        self.apply(events)
        return events

    def flush(self) -> list[Event]:
        """The journal went quiet: release a traceback the parser is holding for more lines."""
        events = self.parser.flush()
        self.apply(events)
        return events

    def apply(self, events: list[Event]) -> None:
        if not events:
            return
        self.state = self.state.apply_all(events)
        self.recent.extend(events)
        self.events_total += len(events)

    def seed(self, state: HostState, recent: Iterable[Event], events_total: int) -> None:
        """Start from what another fold had made (a recording begun mid-session): its state and its
        newest events. A traceback the other parser was holding is not carried over."""
        self.state = state
        self.recent.clear()
        self.recent.extend(recent)
        self.events_total = events_total

    def gpu(self, sample: HostGpuSample) -> list[Event]:
        """The newest GPU sample; each XID it carries for the first time joins the event tail (the feed)
        as a `gpu_xid` event, which belongs to no boot. The events it made."""
        self.gpus = sample
        events: list[Event] = list(self.xids.new_events(sample))
        if events:
            self.recent.extend(events)
            self.events_total += len(events)
        return events

    def server_reading(self, sample: ServerSample, max_running: float | None) -> None:
        """Once per server reading (never per repaint): the scrape joins the window, and the window's
        figures are read from what each pair of scrapes added."""
        self.server = sample
        self.max_running = max_running
        if sample.scrape is not None and sample.ts is not None:
            self.history.add(Scrape(ts=sample.ts, metrics=sample.scrape))
            self.trend = tuple(self.history.trend)
        if sample.health is not HealthState.OK and self.serving is None:
            return
        # The newest decode and prefill lines stand in for what the scrapes lack (metrics off).
        decode = prefill = None
        for event in reversed(self.recent):
            if decode is None and isinstance(event, DecodeBatch):
                decode = event
            elif prefill is None and isinstance(event, PrefillBatch):
                prefill = event
            if decode is not None and prefill is not None:
                break
        lines = [e for e in (prefill, decode) if e is not None]
        self.serving = self.history.figures(version=sample.version, max_running=self.max_running, lines=lines)

    # ---- output ------------------------------------------------------------------------------------

    def snapshot(
        self,
        *,
        seq: int,
        ts: float,
        connection: ConnectionStatus | None,
        follower: FollowerStatus,
    ) -> HostSnapshot:
        # model_construct: every part is already a validated, frozen model; re-validating a few thousand
        # events ten times a second would be the session's largest cost.
        return HostSnapshot.model_construct(
            host=self.host,
            seq=seq,
            ts=ts,
            connection=connection,
            follower=follower,
            state=self.state,
            gpus=self.gpus,
            server=self.server,
            recent=tuple(self.recent),
            events_total=self.events_total,
            serving=self.serving,
            serving_trend=self.trend,
        )

    def checkpoint(self) -> HostFold:
        """An independent copy to resume folding from (a replay's seek points). The state, the events,
        the readings and the serving window's entries are immutable and shared; the parser and the
        window's lists are copied."""
        twin = copy.copy(self)
        twin.parser = copy.deepcopy(self.parser)
        twin.recent = deque(self.recent, maxlen=self.recent.maxlen)
        twin.history = _copied(self.history)
        twin.xids = _copied(self.xids)
        return twin


def _copied(value: Any) -> Any:
    """`value` with its own containers (deques, lists, dicts, sets) and its own instances of the console's
    plain classes (the serving window, its running sums), all the way down; the frozen models and
    everything else in them are shared. A deep copy of a full serving window cost a quarter of a
    second a checkpoint; this costs a tenth of a millisecond."""
    if isinstance(value, deque):
        return deque((_copied(v) for v in value), maxlen=value.maxlen)
    if isinstance(value, list):
        return [_copied(v) for v in value]
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, set):
        return set(value)
    if (
        not isinstance(value, BaseModel)
        and type(value).__module__.startswith("console.core.")
        and hasattr(value, "__dict__")
    ):
        twin = copy.copy(value)
        for name, item in vars(value).items():
            setattr(twin, name, _copied(item))
        return twin
    return value
