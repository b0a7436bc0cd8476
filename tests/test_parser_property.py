"""Property tests: whatever arrives — random bytes, mangled real lines, odd JSON — the parser returns events
and never raises, and every event it builds is one pydantic would accept."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from console.core.events import EVENT_KINDS, event_from_json
from console.core.parser import JournalParser, parse_lines
from tests.support.fastpath import assert_validates_to_itself

CORPUS = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus"


def _real_lines() -> list[str]:
    lines: list[str] = []
    for path in sorted(CORPUS.rglob("*.log")) + sorted(CORPUS.rglob("*.journal")):
        for line in path.read_text(encoding="utf-8", errors="replace").split("\n"):
            if line.strip():
                lines.append(line[:2000])
    # The journald, JSON and systemd shapes the corpus does not hold.
    lines += [
        "May 30 22:00:23 gpu7 python3[4310]: [2026-05-30 22:00:23 DP0 TP0 EP0] Decode batch, #running-req: 4, "
        "#token: 90000, token usage: 0.41, cuda graph: True, gen throughput (token/s): 55.12, #queue-req: 0",
        "May 30 22:00:23 gpu7 systemd[1]: sglang.service: Failed with result 'exit-code'.",
        "2026-05-30T22:00:23+0000 gpu7 python3[4310]: [2026-05-30 22:00:23 TP1] Memory pool end. avail mem=4.38 GB",
        '{"MESSAGE": "[2026-05-30 22:00:23 TP1] Memory pool end. avail mem=4.38 GB", "_PID": "7", '
        '"__REALTIME_TIMESTAMP": "1780179284123456", "__CURSOR": "c"}',
        "sglang-1  | [2026-05-30 22:00:23 TP1] KV Cache is allocated. #tokens: 218484, KV size: 14.30 GB",
        "Rank 0: max_total_num_token=115621, max_prefill_num_token=19269, context_len=4096, ",
        # Log collectors' prefixes (docker -t, Docker Desktop, compose -t, kubectl --prefix --timestamps).
        "2026-05-30T22:00:23.123456789Z [2026-05-30 22:00:23 TP1] Memory pool end. avail mem=4.38 GB",
        "2025-02-04 21:21:33 [2025-02-04 05:21:33] max_total_tokens=131072 is larger than the profiled value "
        "-561981. Use the profiled value instead.",
        "worker-1  | 2026-05-30T22:00:23.5Z 2025-03-07 23:50:27,727 - __main__ - INFO - [2025-03-07 23:50:27 TP0] "
        "Load weight begin. avail mem=22.46 GB",
        "[pod/sglang-0/sglang] 2026-05-30T23:00:23.1+01:00 [2026-05-30 22:00:23 TP0] KV Cache is allocated. "
        "#tokens: 218484, KV size: 14.30 GB",
    ]
    return lines


REAL = _real_lines()
NOISE = st.sampled_from(
    [
        *"[]:|\r\n\t ,.=#\x1b\x00{}\"'0123456789TPDE",
        "] ",
        ": [",
        "TP",
        "\r",
        "Traceback (most recent call last):",
    ]
)


@st.composite
def mutated_line(draw: st.DrawFn) -> str:
    line = draw(st.sampled_from(REAL))
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["cut", "insert", "delete", "truncate", "swap_digits", "dup"]))
        n = len(line)
        i = draw(st.integers(0, n))
        if op == "cut" and n:
            j = draw(st.integers(i, n))
            line = line[:i] + line[j:]
        elif op == "insert":
            line = line[:i] + draw(st.one_of(NOISE, st.text(max_size=8))) + line[i:]
        elif op == "delete" and i < n:
            line = line[:i] + line[i + 1 :]
        elif op == "truncate":
            line = line[:i]
        elif op == "swap_digits":
            line = line.translate(str.maketrans("0123456789", "".join(draw(st.permutations("0123456789")))))
        elif op == "dup":
            line = line[:i] + line[i:] + line[i:]
    return line


def _check(events: list) -> None:
    for e in events:
        assert e.kind in EVENT_KINDS
        assert event_from_json(e.model_dump_json()) == e
        # Built without validation: every value must already be of its field's type (1 == 1.0 == True).
        assert_validates_to_itself(e)


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.binary(max_size=600))
def test_random_bytes(data: bytes) -> None:
    parser = JournalParser()
    events = parser.feed(data) + parser.flush()
    assert events
    _check(events)
    text_events = list(parse_lines([data.decode("latin-1")]))
    assert text_events
    _check(text_events)


@SETTINGS
@given(st.lists(mutated_line(), min_size=1, max_size=25))
def test_mutated_real_lines(lines: list[str]) -> None:
    parser = JournalParser(host="h")
    events = []
    for line in lines:
        got = parser.feed(line)
        assert isinstance(got, list)
        events += got
    events += parser.flush()
    assert events
    _check(events)
    # Every line is somewhere: in its own event, or among a grouped traceback's lines.
    assert sum(len(e.lines) if e.kind == "error" else 1 for e in events) >= len(lines)


JSON_VALUE = st.one_of(
    st.none(),
    st.text(max_size=30),
    st.integers(-(2**70), 2**70),
    st.lists(st.integers(-5, 300), max_size=40),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@SETTINGS
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "MESSAGE": st.one_of(JSON_VALUE, mutated_line()),
            "__CURSOR": JSON_VALUE,
            "__REALTIME_TIMESTAMP": st.one_of(JSON_VALUE, st.integers(0, 2**64).map(str)),
            "_PID": st.one_of(JSON_VALUE, st.integers(0, 10**6).map(str)),
            "_HOSTNAME": JSON_VALUE,
            "SYSLOG_IDENTIFIER": st.one_of(JSON_VALUE, st.just("systemd")),
            "UNIT": JSON_VALUE,
            "_SYSTEMD_UNIT": JSON_VALUE,
            "INVOCATION_ID": JSON_VALUE,
            "_BOOT_ID": JSON_VALUE,
        },
    )
)
def test_odd_journal_json(entry: dict) -> None:
    events = list(parse_lines([entry]))
    assert events
    _check(events)
