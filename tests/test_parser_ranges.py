"""Every number the parser reads from an SGLang message has its sane range (console.core.ranges):
real corpus lines with one number made hostile (below its range, above it) become an `out_of_range` error
that keeps the line, never the event they claimed to be; the events' validators hold the same bounds; and
`verify` on a real journal whose pool line says -5 tokens names the bad line instead of a pool "1,005
short" (issue 36).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from console.core.events import EVENT_TYPES, Error
from console.core.parser import JournalParser, parse_text
from console.core.ranges import RANGES
from console.core.state import fold_boots
from tests.support.cli import run_main

# How each ranged field is printed: the text right before its number.
PRINTED: dict[str, str] = {
    "avail_mem_gb": r"avail mem(?:=|: )",
    "mem_usage_gb": r"mem usage(?:=|: )",
    "elapsed_s": r"elapsed(?:=|: )",
    "tokens": r"#tokens: ",
    "k_size_gb": r"(?<![A-Z])K size: ",
    "v_size_gb": r"(?<![A-Z])V size: ",
    "kv_size_gb": r"KV size: ",
    "max_total_num_tokens": r"max_total_num_tokens=",
    "chunked_prefill_size": r"chunked_prefill_size=",
    "max_prefill_tokens": r"max_prefill_tokens=",
    "max_running_requests": r"max_running_requests=",
    "context_len": r"context_len=",
    "available_gpu_mem_gb": r"available_gpu_mem=",
    "requested": r"max_total_tokens=",
    "profiled": r"the profiled value ",
    "running_req": r"#running-req: ",
    "num_tokens": r"#token: ",
    "token_usage": r"(?<!full )token usage: ",
    "gen_throughput": r"gen throughput \(token/s\): ",
    "queue_req": r"#queue-req: ",
    "accept_len": r"accept len: ",
    "accept_rate": r"accept rate: ",
    "new_seq": r"#new-seq: ",
    "new_token": r"#new-token: ",
    "cached_token": r"#cached-token: ",
    "input_throughput": r"input throughput \(token/s\): ",
    "status": r'HTTP/[0-9.]+" ',
    # The pools of hybrid models (issue 32), each as every version prints it.
    "slots": r"max_mamba_cache_size: ",
    "conv_state_gb": r"(?<!_)conv_state size: ",
    "ssm_state_gb": r"(?<!_)ssm_state size: ",
    "full_tokens": r"(?:full_layer_tokens=|full size: |(?<![a-z_])full_token=|(?<![a-z_])full=)",
    "swa_tokens": r"(?:swa_layer_tokens=|swa size: |swa_size=|(?<![a-z_])swa=|#swa token: )",
    "bytes_per_full_token": r"bytes_per_full_token=",
    "available_gb": r"available_bytes=",
    "c128_state_fixed_gb": r"c128_state_fixed=",
    "swa_fixed_gb": r"swa_fixed=",
    "max_num_reqs": r"max_num_reqs=",
    "c4_tokens": r"(?:c4_size=|(?<![a-z_0-9])c4=)",
    "c128_tokens": r"(?:c128_size=|(?<![a-z_0-9])c128=)",
    "c4_state_tokens": r"(?:c4_state_pool_size=|(?<![a-z_0-9])c4_state=)",
    "c128_state_tokens": r"(?:c128_state_pool_size=|(?<![a-z_0-9])c128_state=)",
    "full_token_usage": r"full token usage: ",
    "swa_token_usage": r"swa token usage: ",
    "mamba_usage": r"mamba usage: ",
    "mamba_num": r"mamba num: ",
}

# Real lines of the kinds the corpus lacks in this shape (the fast path's v0.5.9 decode and prefill
# lines, and the pool cap), as tests/test_parser_property.py keeps them.
EXTRA = [
    "May 30 22:00:23 gpu7 python3[4310]: [2026-05-30 22:00:23 DP0 TP0 EP0] Decode batch, #running-req: 4, "
    "#token: 90000, token usage: 0.41, accept len: 2.91, accept rate: 0.73, cuda graph: True, "
    "gen throughput (token/s): 55.12, #queue-req: 0",
    "May  3 21:18:09 gpu-node-07 python3[4310]: [2026-05-03 21:18:09 TP0] Prefill batch, #new-seq: 1, "
    "#new-token: 11776, #cached-token: 2958, token usage: 0.02, #running-req: 2, #queue-req: 3, "
    "#pending-token: 0, cuda graph: False, input throughput (token/s): 8992.37",
    "2025-02-04 21:21:33 [2025-02-04 05:21:33] max_total_tokens=131072 is larger than the profiled value "
    "-561981. Use the profiled value instead.",
    # The pools of hybrid models: real public lines (tests/data/public-pools/INDEX.md).
    *(
        line
        for name in (
            "qwen35-397b-hybrid-tp2.log",
            "dsv4-flash-mi300x-tp4dp4.log",
            "swa-lines.log",
            "mamba-runtime.log",
            "dsv4-and-draft-lines.log",
        )
        for line in (Path(__file__).parent / "data" / "public-pools" / name).read_text().split("\n")
        if line.strip()
    ),
]


def _number(x: float, *, like: str) -> str:
    """`x` printed as the line printed the number it replaces (a float keeps its decimals)."""
    if "." in like and not isinstance(x, int):
        return f"{x:.2f}"
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"


def _hostile(field: str, lo: float, hi: float, like: str) -> list[str]:
    """Values just past each end of the range, as a line would print them."""
    if field == "status":
        return ["099", "600"]
    out = []
    if lo > -(2**62):
        below = -5 if lo > -5 else (lo - 1 if isinstance(lo, int) else lo - 0.5)
        out.append(_number(below, like=like))
    above = hi * 10 if hi < 2**62 else 2**63
    out.append(_number(above, like=like) if hi < 2**62 else str(above))
    return out


def _samples(corpus_dir: Path) -> dict[tuple[str, str], str]:
    """One real line for each (kind, ranged field) the line prints."""
    lines: list[str] = []
    for path in sorted(corpus_dir.rglob("*.log")) + sorted(corpus_dir.rglob("*.journal")):
        lines += [ln for ln in path.read_text(encoding="utf-8", errors="replace").split("\n") if ln.strip()]
    found: dict[tuple[str, str], str] = {}
    for line in [*EXTRA, *lines]:
        events = JournalParser().feed(line)
        if len(events) != 1 or events[0].kind not in RANGES:
            continue
        event = events[0]
        for field in RANGES[event.kind]:
            if getattr(event, field) is not None and re.search(PRINTED[field], line):
                found.setdefault((event.kind, field), line)
    return found


def _cases(corpus_dir: Path) -> list[tuple[str, str, str, str]]:
    cases = []
    for (kind, field), line in _samples(corpus_dir).items():
        m = re.search(PRINTED[field] + r"(-?[0-9][0-9.]*)", line)
        assert m is not None, (field, line)
        lo, hi, _ = RANGES[kind][field]
        for value in _hostile(field, lo, hi, m.group(1).rstrip(".")):
            number = m.group(1).rstrip(".")
            changed = line[: m.start(1)] + value + line[m.start(1) + len(number) :]
            cases.append((kind, field, value, changed))
    return cases


def test_every_ranged_number_of_a_real_line_out_of_range_is_an_error_never_the_event(
    corpus_dir: Path,
) -> None:
    # Every ranged field of every kind has a real line that prints it.
    assert set(_samples(corpus_dir)) == {(kind, field) for kind in RANGES for field in RANGES[kind]}
    cases = _cases(corpus_dir)
    for _kind, field, value, line in cases:
        events = JournalParser().feed(line) + JournalParser().flush()
        assert len(events) == 1, (field, value, line, events)
        (event,) = events
        assert isinstance(event, Error), (field, value, line, event)
        assert event.category == "out_of_range", (field, value, event)
        assert event.message.startswith(f"{field}="), event.message
        assert event.lines == [line]
        # What the parser built is what validation reads back (no validation on the parser's way).
        assert Error.model_validate_json(event.model_dump_json()) == event


def test_the_events_validators_hold_the_same_bounds() -> None:
    base: dict[str, dict[str, Any]] = {
        "dist_init": {"phase": "end"},
        "cuda_graph": {"phase": "begin"},
        "pool_summary": {"max_total_num_tokens": 1000},
        "pool_clamped": {"requested": 10, "profiled": 5},
        "http_access": {"method": "GET", "path": "/"},
    }
    for kind, fields in RANGES.items():
        cls = EVENT_TYPES[kind]
        for field, (lo, hi, _) in fields.items():
            for ok in (lo, hi):
                cls.model_validate({**base.get(kind, {}), "kind": kind, field: ok})
            for bad in (
                (lo - 1, hi + 1) if isinstance(lo, int) and isinstance(hi, int) else (lo - 0.5, hi * 2)
            ):
                with pytest.raises(ValidationError):
                    cls.model_validate({**base.get(kind, {}), "kind": kind, field: bad})


def test_a_journal_whose_pool_says_minus_five_fails_verify_naming_the_line(
    corpus_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (corpus_dir / "seed-restart-mfs094.journal").read_text()
    assert "max_total_num_tokens=218484" in text
    hostile = tmp_path / "minus-five.journal"
    hostile.write_text(text.replace("max_total_num_tokens=218484", "max_total_num_tokens=-5"))

    boots = fold_boots(parse_text(hostile.read_text()))
    assert boots and boots[-1].pool.tokens is None  # never a pool
    assert [e.category for e in boots[-1].errors] == ["out_of_range"]

    code, out, err = run_main(["verify", "--target-context", "1000", "--journal", str(hostile)], capsys)
    assert code == 1, (out, err)
    said = out + err
    assert "short of" not in said and "-5 tokens" not in said, said
    assert "out_of_range: max_total_num_tokens=-5 is outside its sane range" in said, said

    # The real journal itself verifies its pool as before.
    code, out, err = run_main(
        ["verify", "--target-context", "1000", "--journal", str(corpus_dir / "seed-restart-mfs094.journal")],
        capsys,
    )
    assert "218,484" in out + err and "out_of_range" not in out + err
