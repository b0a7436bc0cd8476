"""A session's serving history: the rolling window of timestamped `/metrics` scrapes and what each successive
pair added, kept so that the window's figures cost one pair's reading per scrape (`console.core.serving`
computes the figures from it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from console.core.events import DecodeBatch, PrefillBatch
from console.core.metrics import MetricsText
from console.core.serving import (
    DEFAULT_WINDOW_S,
    LATENCY_METRICS,
    HistogramDelta,
    PairDelta,
    Scrape,
    ServingFigures,
    TrendPoint,
    merge_deltas,
    pair_delta,
    serving_figures,
    trend_point,
)
from console.core.window_sum import WindowSum

_READ = MetricsText()


def _add_deltas(a: HistogramDelta, b: HistogramDelta) -> HistogramDelta:
    merged = merge_deltas((a, b))
    assert merged is not None  # two deltas in, their sum out
    return merged


class ServingHistory:
    """A bounded, rolling list of timestamped scrapes and what each successive pair added, so that the
    window's figures cost one pair's reading per scrape (a full window of 150 scrapes read afresh costs
    about 0.1 s of CPU). A scrape's samples are dropped once the next pair is read: only its time stays.
    `max_scrapes` bounds it whatever the scrape interval."""

    def __init__(self, *, window_s: float = DEFAULT_WINDOW_S, max_scrapes: int = 151) -> None:
        self.window_s = window_s
        self.scrapes: deque[Scrape] = deque(maxlen=max(2, max_scrapes))
        self.deltas: deque[PairDelta] = deque(maxlen=max(1, max_scrapes - 1))
        self.trend: deque[TrendPoint] = deque(maxlen=max(1, max_scrapes - 1))
        # Each histogram's sum over `deltas`, kept as they come and go (summing the window afresh at
        # every scrape was the console's largest idle cost with the serving panel).
        self._sums: dict[str, WindowSum[HistogramDelta]] = {
            name: WindowSum(_add_deltas) for names in LATENCY_METRICS.values() for name in names
        }

    def _push(self, delta: PairDelta) -> None:
        if len(self.deltas) == self.deltas.maxlen:
            self._pop()
        self.deltas.append(delta)
        for name, window_sum in self._sums.items():
            window_sum.push(delta.histograms.get(name))

    def _pop(self) -> None:
        self.deltas.popleft()
        for window_sum in self._sums.values():
            window_sum.pop()

    def histogram_sums(self) -> dict[str, HistogramDelta | None]:
        """Each latency histogram's increase over the window's pairs (`merge_deltas` of `deltas`)."""
        return {name: window_sum.total() for name, window_sum in self._sums.items()}

    def resize(self, max_scrapes: int) -> None:
        """A new bound (the scrape interval changed); the newest scrapes and pairs are kept."""
        if max(2, max_scrapes) == self.scrapes.maxlen:
            return
        self.scrapes = deque(self.scrapes, maxlen=max(2, max_scrapes))
        self.deltas = deque(self.deltas, maxlen=max(1, max_scrapes - 1))
        self.trend = deque(self.trend, maxlen=max(1, max_scrapes - 1))

    def add(self, scrape: Scrape) -> None:
        if self.scrapes and scrape.ts <= self.scrapes[-1].ts:
            return  # out of order: the window is built on time
        if self.scrapes:
            before = self.scrapes[-1]
            delta = pair_delta(before, scrape)
            self._push(delta)
            self.trend.append(trend_point(delta))
            # Read once: only the newest scrape's samples are needed again (its gauges, the next pair).
            self.scrapes[-1] = Scrape(ts=before.ts, metrics=_READ)
        self.scrapes.append(scrape)
        start = scrape.ts - self.window_s
        while len(self.scrapes) > 1 and self.scrapes[0].ts < start:
            self.scrapes.popleft()
        while self.deltas and self.deltas[0].start_ts < self.scrapes[0].ts:
            self._pop()
        while len(self.trend) > len(self.deltas):
            self.trend.popleft()

    def figures(
        self,
        *,
        version: str | None = None,
        max_running: float | None = None,
        lines: Sequence[DecodeBatch | PrefillBatch] = (),
    ) -> ServingFigures:
        return serving_figures(
            self.scrapes,
            window_s=self.window_s,
            version=version,
            max_running=max_running,
            lines=lines,
            deltas=self.deltas,
            sums=self.histogram_sums(),
        )
