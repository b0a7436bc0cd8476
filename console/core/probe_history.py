"""Probe history: earlier runs kept beside this one (one record per depth), the tok/s-by-depth curves a chart
draws from them, and the decode-speed points the generation chart reads from the journal.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from pydantic import BaseModel

from console.core.events import DecodeBatch, Event
from console.core.probe import ProbeReport, ProbeResult, ProbeStatus


class ProbeRecord(BaseModel, defer_build=True):
    """One line of the history file: one depth of one run."""

    when: datetime
    run_id: str
    host: str
    profile: str | None = None
    gpu_name: str | None = None
    model: str | None = None
    result: ProbeResult


def records_of(report: ProbeReport) -> list[ProbeRecord]:
    return [
        ProbeRecord(
            when=report.started_at,
            run_id=report.run_id,
            host=report.host,
            profile=report.profile,
            gpu_name=report.target.gpu_name,
            model=report.target.model,
            result=r,
        )
        for r in report.results
    ]


class Curve(BaseModel, defer_build=True):
    """tok/s against depth for one run (or one profile's verified figures)."""

    label: str
    points: list[tuple[int, float]]
    run_id: str | None = None


def curves_from_history(
    records: Iterable[ProbeRecord], host: str, *, exclude_run: str | None = None, limit: int = 3
) -> list[Curve]:
    """The newest `limit` earlier runs on `host`, oldest first, each as a curve of its measured depths."""
    runs: dict[str, list[ProbeRecord]] = {}
    for rec in records:
        if rec.host != host or rec.run_id == exclude_run:
            continue
        if rec.result.status is ProbeStatus.OK and rec.result.decode_tok_s:
            runs.setdefault(rec.run_id, []).append(rec)
    ordered = sorted(runs.values(), key=lambda recs: recs[0].when)[-limit:] if limit > 0 else []
    curves: list[Curve] = []
    for recs in ordered:
        first = recs[0]
        label = first.when.strftime("%m-%d %H:%M") + (f" {first.profile}" if first.profile else "")
        points = sorted({r.result.depth: r.result.decode_tok_s or 0.0 for r in recs}.items())
        curves.append(Curve(label=label, points=points, run_id=first.run_id))
    return curves


def report_curve(report: ProbeReport, label: str = "this run") -> Curve:
    points = sorted(
        (r.depth, r.decode_tok_s) for r in report.results if r.status is ProbeStatus.OK and r.decode_tok_s
    )
    return Curve(label=label, points=points, run_id=report.run_id)


def tok_s_by_depth(report: ProbeReport) -> dict[int, float]:
    """What a profile's `[verified] tok_s_at_depth` keeps: measured depths only, 2 decimals."""
    return {
        r.depth: round(r.decode_tok_s, 2)
        for r in report.results
        if r.status is ProbeStatus.OK and r.decode_tok_s is not None
    }


# ------------------------------------------------------------------------------------------------
# the server's own throughput over time (dashboard chart)
# ------------------------------------------------------------------------------------------------


def _epoch(event: Event) -> float | None:
    if event.realtime_us is not None:
        return event.realtime_us / 1e6
    if event.ts:
        try:
            return datetime.fromisoformat(event.ts).timestamp()
        except ValueError:
            return None
    return None


def throughput_points(events: Iterable[Event]) -> list[tuple[float, float]]:
    """(epoch seconds, gen tok/s) from the `Decode batch` lines SGLang logs every --decode-log-interval
    steps, oldest first; lines without a usable time or figure are skipped."""
    points: list[tuple[float, float]] = []
    for event in events:
        if isinstance(event, DecodeBatch) and event.gen_throughput is not None:
            t = _epoch(event)
            if t is not None:
                points.append((t, event.gen_throughput))
    points.sort()
    return points
