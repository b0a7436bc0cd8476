"""Lines as a log collector hands them on: a stamp or a name written before SGLang's own prefix.

Real SGLang startups from the corpus, prefixed the way `docker logs -t`, Docker Desktop's log view,
`docker compose logs [-t]` and `kubectl logs [--prefix] --timestamps` print them, must give the events
the bare lines give (pool summary, weights, ready, stats, access lines), with the collector's time.
And `max_total_tokens=N is larger than the profiled value -M`, the line of a misconfigured ROCm run,
is a `pool_clamped` event like any other clamp.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from console.core.events import event_from_json
from console.core.parser import parse_lines, parse_text

# A bare-prefix startup with server_args and ready (case-31), stats and access lines (case-23),
# a Docker Desktop run (case-03) and lines a Python logger wrapped (case-34).
CASES = ("case-31.log", "case-23.log", "case-03.log", "case-34.log")

COLLECTORS: dict[str, tuple[Callable[[int], str], str | None]] = {
    # name: (prefix of line i, the `ts` every event then has (None: `ts_for` below))
    "docker logs -t": (lambda i: f"2026-05-30T22:00:{i % 60:02d}.123456789Z ", None),
    "Docker Desktop": (lambda i: f"2025-02-04 21:21:{i % 60:02d} ", None),
    "docker compose logs": (lambda i: "worker-1  | ", "bare"),
    "docker compose logs (v1)": (lambda i: "sglang_worker_1 | ", "bare"),
    "docker compose logs -t": (lambda i: f"worker-1  | 2026-05-30T22:00:{i % 60:02d}.5Z ", None),
    "kubectl logs --timestamps": (lambda i: f"2026-05-30T22:00:{i % 60:02d}.123456789Z ", None),
    "kubectl logs --timestamps (offset)": (lambda i: f"2026-05-30T23:00:{i % 60:02d}.123456789+01:00 ", None),
    "kubectl logs --prefix --timestamps": (
        lambda i: f"[pod/sglang-0/sglang] 2026-05-30T22:00:{i % 60:02d}.123456789Z ",
        None,
    ),
    "kubectl logs --prefix": (lambda i: "[pod/sglang-0/sglang] ", "bare"),
}


def ts_for(collector: str, i: int) -> str:
    sec = f"{i % 60:02d}"
    return {
        "docker logs -t": f"2026-05-30T22:00:{sec}.123456+00:00",
        "Docker Desktop": f"2025-02-04T21:21:{sec}",
        "docker compose logs -t": f"2026-05-30T22:00:{sec}.5+00:00",
        "kubectl logs --timestamps": f"2026-05-30T22:00:{sec}.123456+00:00",
        "kubectl logs --timestamps (offset)": f"2026-05-30T23:00:{sec}.123456+01:00",
        "kubectl logs --prefix --timestamps": f"2026-05-30T22:00:{sec}.123456+00:00",
    }[collector]


def _without(event: object, *names: str) -> dict:
    data = json.loads(event.model_dump_json())  # type: ignore[attr-defined]
    for name in names:
        data.pop(name, None)
    return data


@pytest.mark.parametrize("collector", sorted(COLLECTORS))
@pytest.mark.parametrize("case", CASES)
def test_a_collectors_prefix_gives_the_bare_lines_events(corpus_dir: Path, case: str, collector: str) -> None:
    bare_lines = (corpus_dir / "public" / case).read_text(encoding="utf-8").removesuffix("\n").split("\n")
    prefix, ts_rule = COLLECTORS[collector]
    lines = [prefix(i) + line for i, line in enumerate(bare_lines)]
    bare = list(parse_lines(bare_lines))
    got = list(parse_lines(lines))
    assert [e.kind for e in got] == [e.kind for e in bare]
    for event, plain in zip(got, bare, strict=True):
        assert event_from_json(event.model_dump_json()) == event
        assert _without(event, "ts", "raw", "lines") == _without(plain, "ts", "raw", "lines")
        if event.kind != "error":  # a traceback's lines are held under its first line's time
            i = lines.index(event.raw)
            assert event.ts == (plain.ts if ts_rule == "bare" else ts_for(collector, i)), event.raw
    kinds = {e.kind for e in got}
    if case == "case-31.log":
        assert {"server_args", "weights_begin", "weights_loaded", "pool_summary", "server_ready"} <= kinds
        (summary,) = [e for e in got if e.kind == "pool_summary"]
        assert summary.max_total_num_tokens == 15387
    if case == "case-34.log":
        assert "weights_begin" in kinds


def test_the_issue_docker_desktop_line() -> None:
    (event,) = parse_text(
        "2025-02-04 21:21:33 [2025-02-04 05:21:33] max_total_num_tokens=38141, chunked_prefill_size=2048, "
        "max_prefill_tokens=16384, max_running_requests=2048, context_len=131072, available_gpu_mem=0.83 GB"
    )
    assert (event.kind, event.max_total_num_tokens, event.ts) == (
        "pool_summary",
        38141,
        "2025-02-04T21:21:33",
    )


def test_a_date_that_is_the_message_itself_stays_in_the_message() -> None:
    # No space after the time: not a collector's stamp.
    (event,) = parse_text("2025-02-04 21:21:33,5 a line of someone's own")
    assert (event.kind, event.message, event.ts) == (
        "log",
        "2025-02-04 21:21:33,5 a line of someone's own",
        None,
    )


NEGATIVE = (
    "[2025-02-04 05:21:33 TP0] max_total_tokens=131072 is larger than the profiled value -561981. "
    "Use the profiled value instead."
)


@pytest.mark.parametrize(
    "line",
    [
        NEGATIVE,
        "2025-02-04 21:21:33 " + NEGATIVE,
        "May 30 22:14:46 dflash-train python[10990]: " + NEGATIVE,
        json.dumps({"MESSAGE": NEGATIVE, "_PID": "10990", "__CURSOR": "c"}),
    ],
)
def test_a_negative_profiled_value_is_a_clamp(line: str) -> None:
    (event,) = parse_text(line)
    assert (event.kind, event.requested, event.profiled, event.tp_rank) == (
        "pool_clamped",
        131072,
        -561981,
        0,
    )
    assert event_from_json(event.model_dump_json()) == event


def test_the_twins_clamp_line_is_still_read() -> None:
    (event,) = parse_text(
        "[2026-05-30 22:14:46 TP0] max_total_tokens=300000 is larger than the profiled value 218484. "
        "Use the profiled value instead."
    )
    assert (event.kind, event.requested, event.profiled) == ("pool_clamped", 300000, 218484)
