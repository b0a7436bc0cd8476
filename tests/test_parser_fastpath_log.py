"""The batch path's `log` lines and number tables against the careful path (`feed`, one item at a time).

`JournalParser.feed_many` builds a `log` event itself for a journald line whose message nothing else
claims, with or without SGLang's bracket, and reads request counts and token usage from tables. Every
line it might take that way must give exactly `feed`'s events — including the lines it must refuse
(other prefixes, tqdm's `\\r`, ANSI colours, a glued bar, error hints, handler prefixes, a trailing `:`
that may open a traceback, systemd's own lines) and mutations of all of them.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from console.core.events import EVENT_ADAPTER
from console.core.parser import JournalParser, parse_lines
from tests.support.fastpath import assert_same, batched, careful, mutate

PREFIX = "May 30 21:18:14 gpu-node-07 python3[4310]: "
SGL = PREFIX + "[2026-05-30 21:18:14 TP0] "

LOG_LINES = [
    PREFIX + "[aiter] import [module_custom_all_reduce] under /sgl-workspace/aiter/jit/module.so",
    PREFIX + "/usr/lib/python3/dist-packages/torch/cuda/__init__.py:61: FutureWarning: The pynvml package.",
    PREFIX + "  import pynvml  # type: ignore[import]",
    PREFIX,
    PREFIX + " ",
    SGL + "KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_token_ratio: 0.4133 -> 0.6123",
    SGL,
    "May  3 01:02:03 h kernel: plain line from a process without a pid",
    "Dec 31 23:59:59 h python3[7]: [2027-01-01 00:00:00 DP1 TP3 EP3] a message across New Year",
]
REFUSED_LINES = [
    PREFIX + "Rank 0: Load weight begin. avail mem=93.12 GB",
    PREFIX + "[rank3]: Watchdog caught collective operation timeout",
    PREFIX + "[gpu=0] Decode batch. #running-req: 3, #token: 48, gen throughput (token/s): 12.00",
    PREFIX + "[2026-05-30 21:18:14.123 TP0] Decode batch, #running-req: 3, #token: 48, token usage: 0.01",
    PREFIX + "[21:18:14 TP0] old prefix",
    PREFIX + "Loading shards:  50%|#####     | 1/2\rLoading shards: 100%|##########| 2/2",
    PREFIX + "\x1b[32mINFO\x1b[0m coloured",
    PREFIX + "bar 100%|##| 2/2 [00:01<00:00][2026-05-30 21:18:14 TP0] Load weight end. avail mem=27.10 GB",
    PREFIX + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB.",
    PREFIX + "Some NCCL operations have failed or timed out",
    PREFIX + "Load weight begin. avail mem=93.12 GB",
    SGL + "Load weight begin. avail mem=93.12 GB",
    SGL + "INFO:     Started server process [4100]",
    SGL + "Scheduler hit an exception: Traceback (most recent call last):",
    PREFIX + '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 12, in run',
    PREFIX + "RuntimeError: boom",
    "May 30 21:18:15 gpu-node-07 systemd[1]: sglang.service: Failed with result 'exit-code'.",
    "May 30 21:18:15 gpu-node-07 systemd[1]: Started sglang.service - SGLang server.",
    "Foo 30 21:18:14 h python3[1]: [2026-05-30 21:18:14 TP0] not a month",
    "May 30 21:18:14 h a b[1]: three words before the colon",
    "May 30 21:18:14 h p[1]: [2026-05-30 21:18:14 TP0 XX9] unknown rank tag",
]
NUMBER_LINES = [
    SGL + "Decode batch, #running-req: 4096, #token: 1, token usage: 12.34, cuda graph: True, "
    "gen throughput (token/s): 1.00, #queue-req: 10000",
    SGL + "Decode batch, #running-req: 007, #token: 1, token usage: 1.5, cuda graph: True, "
    "gen throughput (token/s): 1.00, #queue-req: 00",
    SGL + "Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 123.456, "
    "#running-req: 0, #queue-req: 5000, cuda graph: True, input throughput (token/s): 1.50",
    SGL + 'INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK',
]


def test_log_lines_are_built_in_the_batch_as_feed_builds_them() -> None:
    items = LOG_LINES + REFUSED_LINES + NUMBER_LINES + LOG_LINES
    expected = careful(items)
    for size in (1, 5, 1024):
        assert_same(expected, batched(items, size))
    assert_same(expected, list(parse_lines(items)))
    kinds = [e.kind for e in batched(LOG_LINES, 64)]
    assert kinds == ["log"] * len(LOG_LINES)
    first = batched(LOG_LINES[:1], 1)[0]
    assert (first.ts, first.host, first.pid, first.message[:7]) == (
        "--05-30T21:18:14",
        "gpu-node-07",
        4310,
        "[aiter]",
    )
    bracketed = batched(LOG_LINES[5:6], 1)[0]
    assert (bracketed.ts, bracketed.tp_rank, bracketed.message[:8]) == ("2026-05-30T21:18:14", 0, "KV cache")
    assert batched(LOG_LINES[-1:], 1)[0].ts == "2026-12-31T23:59:59"


class _Recording(JournalParser):
    """Records what reaches the careful path."""

    def __init__(self) -> None:
        super().__init__()
        self.careful: list[Any] = []

    def _feed(self, item: Any, out: list[Any]) -> None:
        self.careful.append(item)
        super()._feed(item, out)


def test_the_batch_takes_log_lines_itself_and_refuses_the_others() -> None:
    parser = _Recording()
    parser.feed_many(LOG_LINES + NUMBER_LINES[3:])
    assert parser.careful == []
    parser.feed_many(REFUSED_LINES)
    parser.flush()
    assert parser.careful == REFUSED_LINES
    parser = _Recording()
    parser.feed_many(NUMBER_LINES)
    # Counts past the table or with leading zeros; a token usage past it is parsed in place.
    assert parser.careful == NUMBER_LINES[:3]


def test_numbers_outside_the_tables_are_read_as_feed_reads_them() -> None:
    events = batched(NUMBER_LINES, 64)
    assert_same(careful(NUMBER_LINES), events)
    assert (events[0].running_req, events[0].token_usage, events[0].queue_req) == (4096, 12.34, 10000)
    assert (events[1].running_req, events[1].token_usage, events[1].queue_req) == (7, 1.5, 0)
    assert (events[2].token_usage, events[2].queue_req) == (123.456, 5000)
    assert events[3].status == 200


def test_batch_built_logs_behave_like_validated_ones() -> None:
    for event in batched(LOG_LINES, 64):
        validated = EVENT_ADAPTER.validate_json(event.model_dump_json())
        assert validated == event and event == validated
        assert hash(validated) == hash(event)
        assert repr(validated) == repr(event)
        assert validated.model_copy(update={"raw": "x"}) == event.model_copy(update={"raw": "x"})


def test_a_traceback_held_across_log_lines_matches_feed() -> None:
    other = "May 30 21:18:14 gpu-node-07 python3[4311]: "
    items = [
        REFUSED_LINES[13],  # opens a traceback for pid 4310
        other + "[aiter] another process's noise",
        REFUSED_LINES[14],
        other + "  import pynvml  # type: ignore[import]",
        REFUSED_LINES[15],  # its summary
        other + "more noise",
        *LOG_LINES,
    ]
    assert_same(careful(items), batched(items, 3))
    assert sum(e.kind == "error" for e in batched(items, 1024)) == 1


def test_mixed_chunks_match_feed() -> None:
    items: list[Any] = [
        LOG_LINES[0],
        {
            "MESSAGE": "[2026-05-30 21:18:14 TP0] Memory pool end. avail mem=4.38 GB",
            "_PID": "7",
            "__CURSOR": "c",
        },
        LOG_LINES[1].encode(),
        LOG_LINES[2] + "\n" + LOG_LINES[0],
        PREFIX + "x" * 300_000,
        LOG_LINES[5],
    ]
    assert_same(careful(items), batched(items, 1024))
    assert_same(careful(items), list(parse_lines(iter(items))))


_line = st.sampled_from(LOG_LINES + REFUSED_LINES + NUMBER_LINES).flatmap(
    lambda line: st.tuples(
        st.just(line),
        st.integers(0, len(line)),
        st.integers(0, 3),
        st.text(alphabet="0123456789 :.,[]#-TPRrk|abce\r\n\x1b\t\u00e9", max_size=4),
    )
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_line, min_size=1, max_size=12), st.integers(1, 6))
def test_mutated_log_lines_match_feed(specs: list[tuple[str, int, int, str]], size: int) -> None:
    items = [mutate(spec) for spec in specs]
    assert_same(careful(items), batched(items, size))


def test_cached_verdicts_are_per_alternative_and_keep_refusing() -> None:
    # The batch path remembers, per message, whether it is a plain `log`: a message refused once must
    # be refused every time, and the same words read differently with and without SGLang's bracket
    # (`Rank 0: ` is another prefix only without it).
    plain = [PREFIX + "Rank 0: weights here", PREFIX + "RuntimeError: boom", PREFIX + "[aiter] import x"]
    bracketed = [SGL + "Rank 0: weights here", SGL + "[aiter] import x"]
    long_msg = PREFIX + "w" * 600 + " failed"  # past the cached length, judged each time
    items = plain + bracketed + [long_msg] + bracketed + plain + [long_msg]
    parser = _Recording()
    events = parser.feed_many(items) + parser.flush()
    assert_same(careful(items), events)
    refused = [PREFIX + "Rank 0: weights here", PREFIX + "RuntimeError: boom", long_msg]
    assert parser.careful == refused + refused
    assert [e.kind for e in events if e.raw == SGL + "Rank 0: weights here"] == ["log", "log"]


def test_verdict_caches_stay_bounded_and_right_after_clearing() -> None:
    # More distinct messages than a cache holds, then the first ones again and some refused ones.
    items = [f"{PREFIX}noise line {i}" for i in range(5000)]
    refused = [PREFIX + f"step {i} failed" for i in range(3)]  # an error hint: the careful path decides
    items += items[:50] + refused + items[:50] + refused
    parser = _Recording()
    events = parser.feed_many(items) + parser.flush()
    assert_same(careful(items), events)
    sizes = [len(verdicts) for verdicts in parser._log_verdicts.values()]
    assert 0 < max(sizes) <= 4096
    assert parser.careful == refused + refused
