"""The event contract against the parser as it was before its rebuild (issue 19): every corpus file gives
exactly the events, field for field in their JSON form, that the old parser gave.

`tests/data/parser_corpus_events.jsonl.gz` holds, per corpus file, the `model_dump_json()` of each
event the old `console/core/parser.py` (commit 25eafb4) made of it with `parse_text`. A change here is a
change of the contract: regenerate the file only on purpose, and say so.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from console.core.parser import JournalParser, parse_lines, parse_text

GOLDEN = Path(__file__).parent / "data" / "parser_corpus_events.jsonl.gz"


def _golden() -> dict[str, list[dict]]:
    with gzip.open(GOLDEN, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {row["file"]: row["events"] for row in rows}


def _first_difference(expected: list[dict], got: list[dict]) -> str:
    for i, (a, b) in enumerate(zip(expected, got, strict=False)):
        if a != b:
            keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            return f"event {i} ({a.get('raw', '')[:120]!r}): {[(k, a.get(k), b.get(k)) for k in keys]}"
    return f"{len(expected)} events expected, {len(got)} made"


def test_every_corpus_file_gives_the_old_parsers_events(corpus_dir: Path) -> None:
    golden = _golden()
    files = sorted(corpus_dir.rglob("*.log")) + sorted(corpus_dir.rglob("*.journal"))
    assert sorted(p.name for p in files) == sorted(golden)
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        got = [json.loads(e.model_dump_json()) for e in parse_text(text)]
        expected = golden[path.name]
        assert got == expected, (path.name, _first_difference(expected, got))


def test_line_by_line_feed_gives_the_same_events(corpus_dir: Path) -> None:
    golden = _golden()
    for path in sorted(corpus_dir.rglob("*.log")) + sorted(corpus_dir.rglob("*.journal")):
        parser = JournalParser()
        events = []
        for line in path.read_text(encoding="utf-8", errors="replace").removesuffix("\n").split("\n"):
            events += parser.feed(line)
        events += parser.flush()
        got = [json.loads(e.model_dump_json()) for e in events]
        assert got == golden[path.name], (path.name, _first_difference(golden[path.name], got))


def test_a_kinds_filter_builds_exactly_those_events(corpus_dir: Path) -> None:
    # `parse --kinds` builds only the kinds asked for; tracebacks are still grouped (case-01 has two).
    # With neither `log` nor `error` asked for, lines no wanted handler reads are skipped unread.
    for wanted in ({"error", "pool_summary", "kv_pool_allocated"}, {"pool_summary"}, {"log", "cuda_graph"}):
        for path in sorted(corpus_dir.rglob("*.log")) + sorted(corpus_dir.rglob("*.journal")):
            lines = path.read_text(encoding="utf-8", errors="replace").removesuffix("\n").split("\n")
            parser = JournalParser(kinds=wanted)
            got = [e.model_dump_json() for e in parser.feed_many(lines) + parser.flush()]
            assert got == [e.model_dump_json() for e in parse_lines(lines) if e.kind in wanted]


# Line shapes the corpus does not hold, with what the old parser made of them (kind, tp_rank, message).
OLD_SHAPES = [
    (
        "[rank3]: Watchdog caught collective operation timeout",
        ("error", None, "[rank3]: Watchdog caught collective operation timeout"),
    ),
    (
        "[rank3]:[E1119 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout",
        (
            "error",
            3,
            "[E1119 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout",
        ),
    ),
    (
        "[gpu=0] Decode batch. #running-req: 3, #token: 48, gen throughput (token/s): 12.00",
        ("decode_batch", 0, None),
    ),
    ("[gpu_id=1]Decode", ("log", None, "[gpu_id=1]Decode")),
    ("Rank 2: Load weight begin. avail mem=93.12 GB", ("weights_begin", 2, None)),
]


def test_line_shapes_outside_the_corpus_read_as_before() -> None:
    for line, (kind, rank, message) in OLD_SHAPES:
        (event,) = parse_lines([line])
        assert (event.kind, event.tp_rank) == (kind, rank), line
        if message is not None:
            assert event.message == message, line
