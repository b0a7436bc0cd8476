"""The journald shortcut and the batch path against the general envelope and the careful path.

The parser reads the bulk of a journal (a journald `short` line carrying SGLang's bracket) with a
shortcut of `str.find`s and small caches instead of the envelope's regexes; it must give exactly what
the general envelope gives, and hand every other line to it (other prefixes, tqdm's `\\r`, ANSI colours,
a glued bar, systemd's own lines, malformed stamps and tags) — on the lines below and on mutations of
all of them. `feed_many` must give exactly `feed`'s events for the same lines.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from console.core.events import event_adapter
from console.core.parser import JournalParser, _JournaldSglang, parse_lines
from console.core.parsing.envelope import CACHE_SIZE
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
    # Without a `[pid]`, journald's identifier ends at its first `:` (hypothesis found the shortcut
    # reading past it): `p` is the identifier and `y: [2026…` the message.
    "May 30 21:18:14 h p:y: [2026-05-30 21:18:14 TP0] a colon in an identifier without a pid",
]
# With a `[pid]`, the identifier is read whole (`p:ython3`), as the parser always read such a line.
COLON_IDENT = "May 30 21:18:14 h p:ython3[1]: [2026-05-30 21:18:14 TP0] a colon in the identifier"
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


class _General(JournalParser):
    """The parser without its journald shortcut: every text line read by the general envelope."""

    def __init__(self, host: str | None = None) -> None:
        super().__init__(host)
        self._journald = _NoShortcut()


class _NoShortcut:
    def read(self, line: str) -> None:
        return None


def _general(items: list[Any], size: int = 1) -> list[Any]:
    parser = _General()
    out: list[Any] = []
    for start in range(0, len(items), size):
        out.extend(parser.feed_many(items[start : start + size]))
    return out + parser.flush()


def test_the_shortcut_takes_the_bracketed_journald_lines_and_refuses_the_others() -> None:
    taken = [line for line in LOG_LINES + NUMBER_LINES + REFUSED_LINES if _JournaldSglang().read(line)]
    assert taken == [
        *[line for line in LOG_LINES if ": [2" in line],
        *NUMBER_LINES,
        SGL + "Load weight begin. avail mem=93.12 GB",
        SGL + "INFO:     Started server process [4100]",
        SGL + "Scheduler hit an exception: Traceback (most recent call last):",
    ]


def test_the_shortcut_reads_the_benchmark_journal_as_the_general_envelope_does() -> None:
    spec = importlib.util.spec_from_file_location(
        "bench_parser", Path(__file__).parent / "bench" / "bench_parser.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_parser", bench)
    spec.loader.exec_module(bench)
    lines = bench.build_journal(6_000)
    assert_same(_general(lines, 512), batched(lines, 512))


def test_a_colon_in_journalds_identifier() -> None:
    assert _JournaldSglang().read(COLON_IDENT) is not None
    for events in (careful([COLON_IDENT]), _general([COLON_IDENT])):
        (event,) = events
        assert (event.pid, event.tp_rank, event.ts, event.message) == (
            1,
            0,
            "2026-05-30T21:18:14",
            "a colon in the identifier",
        )
    (event,) = careful([REFUSED_LINES[-1]])
    assert (event.pid, event.tp_rank, event.message[:3]) == (None, None, "y: ")


def test_the_shortcut_gives_what_the_general_envelope_gives() -> None:
    items = LOG_LINES + REFUSED_LINES + NUMBER_LINES + LOG_LINES + [COLON_IDENT]
    assert_same(_general(items), careful(items))
    assert_same(_general(items, 5), batched(items, 5))


def test_the_shortcut_matches_the_envelope_on_every_corpus_line(corpus_dir: Path) -> None:
    for path in sorted(corpus_dir.rglob("*.log")) + sorted(corpus_dir.rglob("*.journal")):
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
        assert_same(_general(lines, 64), batched(lines, 64))


def test_numbers_outside_the_tables_are_read_as_feed_reads_them() -> None:
    events = batched(NUMBER_LINES, 64)
    assert_same(careful(NUMBER_LINES), events)
    assert (events[0].running_req, events[0].token_usage, events[0].queue_req) == (4096, 12.34, 10000)
    assert (events[1].running_req, events[1].token_usage, events[1].queue_req) == (7, 1.5, 0)
    assert (events[2].token_usage, events[2].queue_req) == (123.456, 5000)
    assert events[3].status == 200


def test_batch_built_logs_behave_like_validated_ones() -> None:
    for event in batched(LOG_LINES, 64):
        validated = event_adapter().validate_json(event.model_dump_json())
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
    expected = careful(items)
    assert_same(expected, batched(items, size))
    assert_same(expected, _general(items, size))  # the shortcut reads what the general envelope reads


def test_the_same_words_read_differently_with_and_without_the_bracket() -> None:
    # `Rank 0: ` is another prefix only without SGLang's bracket before it.
    plain = [PREFIX + "Rank 0: weights here", PREFIX + "RuntimeError: boom", PREFIX + "[aiter] import x"]
    bracketed = [SGL + "Rank 0: weights here", SGL + "[aiter] import x"]
    items = plain + bracketed + bracketed + plain
    events = batched(items, 1024)
    assert_same(careful(items), events)
    assert_same(_general(items), events)
    assert [e.tp_rank for e in events if e.raw == PREFIX + "Rank 0: weights here"] == [0, 0]
    assert [e.kind for e in events if e.raw == SGL + "Rank 0: weights here"] == ["log", "log"]
    assert [e.kind for e in events if e.raw == PREFIX + "RuntimeError: boom"] == ["log", "log"]


def test_shortcut_caches_stay_bounded_and_right_after_clearing() -> None:
    # More distinct processes than a cache holds, then the first ones again and some refused ones.
    items = [f"May 30 21:18:14 h python3[{i}]: [2026-05-30 21:18:14 TP{i % 8}] line {i}" for i in range(5000)]
    refused = ["May 30 21:18:14 h python3[1]: [2026-05-30 21:18:14 TP0 XX9] unknown rank tag"]
    items += items[:50] + refused + items[:50] + refused
    parser = JournalParser()
    events = parser.feed_many(items) + parser.flush()
    assert_same(_general(items, 1024), events)
    assert [e.pid for e in events[:3]] == [0, 1, 2]
    assert 0 < len(parser._journald._templates) <= CACHE_SIZE


def test_the_time_read_once_a_minute_takes_each_lines_own_seconds() -> None:
    """The shortcut reads a line's date once a minute and adds the line's own `:SS`; a stamp whose
    seconds are not two ASCII digits is left to the general envelope."""
    lines = [
        f"May 30 22:00:{s:02d} gpu1 python3[7411]: [2026-05-30 22:00:{s:02d} TP0] Decode batch, "
        f"#running-req: 1, #token: 10, token usage: 0.01, cuda graph: True, gen throughput (token/s): 5.00, "
        f"#queue-req: 0"
        for s in (1, 2, 59)
    ]
    odd = [
        lines[0].replace("22:00:01 gpu1", "22:00:\u0661\u0662 gpu1"),  # Arabic-Indic digits in journald's
        lines[0].replace("22:00:01 TP0", "22:00:\u0661\u0662 TP0"),  # … and in SGLang's stamp
        lines[0].replace("22:00:01 gpu1", "22:00:61 gpu1"),
    ]
    shortcut = _JournaldSglang()
    assert [shortcut.read(line)[0]["ts"] for line in lines] == [  # type: ignore[index]
        "2026-05-30T22:00:01",
        "2026-05-30T22:00:02",
        "2026-05-30T22:00:59",
    ]
    assert [shortcut.read(line) for line in odd] == [None, None, None]
    items = lines + odd + lines
    assert_same(_general(items), careful(items))
    assert_same(_general(items, 4), batched(items, 4))
