"""The batch path (`JournalParser.feed_many`, used by `parse_lines` and `k26-console parse`) against the
careful path (`feed`, one item at a time): exactly the same events, field for field and in field order,
on every corpus line, on the benchmark journal and on mutations of the stats and access lines. A batch
holds tracebacks across its edges; its events, built without validation, are checked to behave as
events pydantic validated do."""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from console.cli.cmd_parse import _chunks, _lines
from console.core.events import event_adapter
from console.core.parser import parse_lines
from tests.support.fastpath import assert_same, batched, careful, mutate

_BENCH = Path(__file__).parent / "bench" / "bench_parser.py"

HOT_LINES = [
    "May 30 21:18:14 gpu-node-07 python3[4310]: [2026-05-30 21:18:14 TP0] Decode batch, #running-req: 3, "
    "#token: 448733, token usage: 0.99, cuda graph: True, gen throughput (token/s): 26.13, #queue-req: 2",
    "Dec 31 23:59:59 h python3[7]: [2027-01-01 00:00:00 DP1 TP3 EP3] Decode batch, #running-req: 3, "
    "#token: 48, token usage: 0.01, accept len: 2.91, accept rate: 0.73, cuda graph: False, "
    "gen throughput (token/s): 126.13, #queue-req: 0",
    "May  3 21:18:09 gpu-node-07 python3[4310]: [2026-05-03 21:18:09 TP0] Prefill batch, #new-seq: 1, "
    "#new-token: 11776, #cached-token: 2958, token usage: 2.02, #running-req: 2, #queue-req: 3, "
    "#pending-token: 0, cuda graph: False, input throughput (token/s): 8992.37",
    "Jan  1 00:00:01 h python3[9]: [2025-12-31 23:59:59 PP1 ATTN_CP0 MOE_DP2] Prefill batch, #new-seq: 1, "
    "#new-token: 7, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, cuda graph: True, "
    "input throughput (token/s): 1.50",
    'May 30 21:18:11 gpu-node-07 python3[4300]: [2026-05-30 21:18:11] INFO:     127.0.0.1:57961 - "POST '
    '/v1/chat/completions HTTP/1.1" 200 OK',
    'May 30 21:18:11 gpu-node-07 python3[4300]: [2026-05-30 21:18:11] INFO:     10.0.0.2:1 - "GET /health" 503',
]
OTHER_LINES = [
    "May 30 21:18:14 gpu-node-07 python3[4310]: [2026-05-30 21:18:14 TP0] Scheduler hit an exception: "
    "Traceback (most recent call last):",
    '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 12, in run',
    "May 30 21:18:14 gpu-node-07 python3[4310]:     self.step()",
    "May 30 21:18:14 gpu-node-07 python3[4310]: RuntimeError: boom",
    "May 30 21:18:15 gpu-node-07 systemd[1]: sglang.service: Failed with result 'exit-code'.",
    "May 30 21:18:15 gpu-node-07 python3[4311]:   import pynvml  # type: ignore[import]",
    '{"MESSAGE": "[2026-05-30 21:18:14 TP0] Decode batch, #running-req: 3, #token: 1, token usage: 0.01, '
    'cuda graph: True, gen throughput (token/s): 1.00, #queue-req: 0", "_PID": "4310", "__CURSOR": "c1"}',
]


def test_hot_lines_take_the_batch_path_and_match_feed() -> None:
    items = HOT_LINES + OTHER_LINES + HOT_LINES
    assert_same(careful(items), batched(items))
    assert_same(careful(items), list(parse_lines(items)))
    assert_same(careful(items), list(parse_lines(iter(items))))
    assert_same(careful(items, host="h1"), batched(items, host="h1", size=1000))
    kinds = [e.kind for e in batched(HOT_LINES)]
    assert kinds == ["decode_batch"] * 2 + ["prefill_batch"] * 2 + ["http_access"] * 2
    first = batched(HOT_LINES[:2])
    assert first[0].ts == "2026-05-30T21:18:14" and first[0].tp_rank == 0 and first[0].pid == 4310
    assert first[1].ts == "2026-12-31T23:59:59"  # journald's December, SGLang's January: last year
    assert (first[1].dp_rank, first[1].tp_rank, first[1].ep_rank, first[1].accept_rate) == (1, 3, 3, 0.73)


def test_every_corpus_line_matches_feed(corpus_dir: Path) -> None:
    files = sorted(corpus_dir.rglob("*.log")) + sorted(corpus_dir.rglob("*.journal"))
    assert files
    for path in files:
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
        assert_same(careful(lines), batched(lines, size=64))
        assert_same(careful(lines), list(parse_lines(lines)))


def _bench_module() -> Any:
    spec = importlib.util.spec_from_file_location("bench_parser", _BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_parser", module)
    spec.loader.exec_module(module)
    return module


def test_benchmark_journal_matches_feed() -> None:
    lines = _bench_module().build_journal(20_000)
    expected = careful(lines)
    assert_same(expected, list(parse_lines(lines)))
    assert sum(e.kind == "decode_batch" for e in expected) > 5_000


def test_batch_built_events_behave_like_validated_ones() -> None:
    for event in batched(HOT_LINES):
        validated = event_adapter().validate_json(event.model_dump_json())
        assert validated == event and event == validated
        assert hash(validated) == hash(event)
        assert validated.model_dump() == event.model_dump()
        assert validated.model_dump_json() == event.model_dump_json()
        assert repr(validated) == repr(event)
        assert validated.model_copy(update={"raw": "x"}) == event.model_copy(update={"raw": "x"})
        with pytest.raises(dataclasses.FrozenInstanceError):
            event.raw = "changed"  # type: ignore[misc]


_mutation = st.sampled_from(HOT_LINES + OTHER_LINES[:3]).flatmap(
    lambda line: st.tuples(
        st.just(line),
        st.integers(0, len(line)),
        st.integers(0, 3),
        st.text(alphabet="0123456789 :.,[]#-TPDEabc\r\n\x1b\u00e9", max_size=4),
    )
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_mutation, min_size=1, max_size=12))
def test_mutated_hot_lines_match_feed(specs: list[tuple[str, int, int, str]]) -> None:
    items = [mutate(spec) for spec in specs]
    assert_same(careful(items), batched(items, size=5))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.integers(1, 40))
def test_cli_chunks_give_the_same_lines(data: bytes, size: int) -> None:
    expected = list(_lines(io.BytesIO(data)))
    got = [line for chunk in _chunks(io.BufferedReader(io.BytesIO(data)), size) for line in chunk]  # type: ignore[arg-type]
    assert got == expected
