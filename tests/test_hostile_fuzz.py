"""Issue 30: random text, bytes, dates and numbers from a hostile (or broken) host, through the one text path
and the models of the host's state files (the lock, presence, the pending-rollback record, audit lines),
then into a headless console: no exception, and nothing on its screen a terminal would act on or reorder.

The strings mix random text with what broke the console before: markup (`[/]`, `[/opt/...]`), escape
sequences, C1, bidi overrides and isolates, zero-width characters, lone surrogates (as JSON escapes). Dates
range over every year with offsets up to ±14 h, naive ones, epoch numbers, infinities and text; numbers over
huge, negative, non-finite and non-numeric values. Each state file is written as JSON and read back by the
model the console reads it with: what the model refuses stays out of the console, as on a live host.
"""

from __future__ import annotations

import asyncio
import json
import unicodedata
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from console.core.audit import AuditEntry, parse_audit_line
from console.core.confirm import PendingRollback
from console.core.gpus import GpuSample, HostGpuSample, SamplerState
from console.core.pairing import Identity, LockInfo, PairingView, Presence
from console.core.parser import parse_lines
from console.core.text import json_safe, terminal_safe
from console.tui.messages import BreakRequested
from console.tui.pairing import PairingLink
from console.tui.screens import ConfirmScreen
from tests.tui_support import NOW, make_app, snapshot

NOW_DT = datetime.fromtimestamp(NOW, UTC)
ME = Identity(user="bob", jump_host="jump2", pid=5151, console_id="me1")

# ---------------------------------------------------------------------------------------------- strategies

HOSTILE_CHARS = [
    *"\x00\x07\x08\t\n\r\x1b\x7f\x85\x9b\x9d",
    *"\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c",
    *"\u200b\u200c\u200d\u2060\ufeff\u00ad\U000e0041\U000e007f\u180e\ufff9",
    *"[]/\\$@=#:;'\" ",
    *"aZ0é漢🙂\xa0\ue000",
]
FRAGMENTS = [
    "[/]",
    "[b]",
    "[/b]",
    "[/opt/sglang/bin/python]",
    "[link=https://example.invalid]x[/link]",
    "[@click=app.quit]q[/]",
    "[$accent]",
    "$accent",
    "\\[",
    "\\",
    "\x1b]0;pwned\x07",
    "\x1b]8;;https://example.invalid\x1b\\",
    "\x1b[2J\x1b[H",
    "\u202eexe.txt",
    "\u2066admin\u2069",
    "mallory[/]",
]
TEXT = st.lists(
    st.one_of(
        st.sampled_from(FRAGMENTS),
        st.text(alphabet=st.sampled_from(HOSTILE_CHARS), max_size=6),
        st.text(max_size=6),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),  # lone surrogates, as JSON escapes
    ),
    min_size=1,
    max_size=5,
).map("".join)

GOOD_DATE = "2026-11-30T10:00:00+00:00"
ISO = st.builds(
    lambda y, mo, d, h, off: f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:00:00{off}",
    st.integers(1, 9999),
    st.integers(1, 12),
    st.integers(1, 28),
    st.integers(0, 23),
    st.sampled_from(["+14:00", "-14:00", "Z", "+00:00", "+05:30", ""]),
)
# Raw JSON text for a value: what a file can hold that `json.dumps` would not write (NaN, a 5,000-digit
# number) included.
DATE = st.one_of(
    st.just(json.dumps(GOOD_DATE)),
    st.just(json.dumps(GOOD_DATE)),
    st.just('"0001-01-01T00:00:00+14:00"'),
    st.just('"9999-12-31T23:59:59-14:00"'),
    ISO.map(json.dumps),
    st.integers(-(10**30), 10**30).map(str),
    st.sampled_from(["1e300", "-1e300", "NaN", "Infinity", "-Infinity", "9" * 5000, "null", "[]", "{}"]),
    TEXT.map(json.dumps),
)
NUMBER = st.one_of(
    st.sampled_from(["1", "2.0", "4242", "0", "218484"]),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["1e999", "-1e999", "NaN", "Infinity", "9" * 5000, "-0", '"12"', "true", "null"]),
)
CONSOLE_ID = st.one_of(st.sampled_from(["m1", "carol-3", "me1"]), TEXT)


def _document(values: dict[str, Any], raw: dict[str, str], ascii_only: bool) -> str:
    """A JSON object of `values`, with each `raw` key's value spliced in as the JSON text given (a date or
    a number as a broken file may hold it). Written as a host's bytes and read back as the transport reads
    them: non-ASCII as UTF-8 (lone surrogates become U+FFFD), or everything as escapes."""
    marks = {key: f"@@{i}@@" for i, key in enumerate(raw)}
    text = json.dumps({**values, **marks}, ensure_ascii=ascii_only)
    for key, mark in marks.items():
        text = text.replace(json.dumps(mark), raw[key])
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


@st.composite
def identity(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, str]]:
    return {"user": draw(TEXT), "jump_host": draw(TEXT), "console_id": draw(CONSOLE_ID)}, {
        "pid": draw(NUMBER)
    }


@st.composite
def lock_file(draw: st.DrawFn) -> str:
    who, raw = draw(identity())
    values = {"holder": "@@holder@@", "intent": draw(TEXT), "lock_id": draw(st.sampled_from(["L1", "x"]))}
    holder = _document(who, raw, draw(st.booleans()))
    text = _document(values, {"taken_at": draw(DATE)}, draw(st.booleans()))
    return text.replace('"@@holder@@"', holder)


@st.composite
def presence_file(draw: st.DrawFn) -> str:
    who, raw = draw(identity())
    raw |= {"since": draw(DATE), "heartbeat": draw(DATE), "interval_s": draw(NUMBER)}
    return _document({**who, "looking_at": draw(TEXT)}, raw, draw(st.booleans()))


@st.composite
def pending_file(draw: st.DrawFn) -> str:
    values = {k: draw(TEXT) for k in ("unit", "timer", "armed_by", "profile", "op_id")}
    raw = {"deadline": draw(DATE), "armed_at": draw(DATE)}
    raw |= {"confirm_within_s": draw(NUMBER), "target_context": draw(NUMBER)}
    return _document(values, raw, draw(st.booleans()))


@st.composite
def audit_line(draw: st.DrawFn) -> str:
    actions = ["apply", "restart", "rollback", "probe", "lock_break", "confirm"]
    outcomes = ["ok", "failed", "rolled_back", "refused", "started", "aborted", "interrupted"]
    values: dict[str, Any] = {k: draw(TEXT) for k in ("user", "jump_host", "console_id", "host", "summary")}
    values |= {
        "action": draw(st.one_of(st.sampled_from(actions), TEXT)),
        "outcome": draw(st.one_of(st.sampled_from(outcomes), TEXT)),
        "profile": draw(st.one_of(st.none(), TEXT)),
        "diff": draw(st.lists(TEXT, max_size=3)),
        "phase": draw(st.sampled_from([None, "started", "commit-confirmed", "kv_pool"])),
        "signal": draw(st.one_of(st.none(), TEXT)),
        "forced": draw(st.one_of(st.none(), TEXT)),
        "durations": "@@durations@@",
    }
    raw = {"ts": draw(DATE), "total_s": draw(NUMBER), "pool_tokens": draw(NUMBER), "pid": draw(NUMBER)}
    durations = "{" + ", ".join(f"{json.dumps(k)}: {draw(NUMBER)}" for k in ("kv_pool", "restart")) + "}"
    return _document(values, raw, draw(st.booleans())).replace('"@@durations@@"', durations)


HOST_STATE = st.fixed_dictionaries(
    {
        "lock": lock_file(),
        "presence": st.lists(presence_file(), max_size=2),
        "pending": pending_file(),
        "audit": st.lists(audit_line(), min_size=1, max_size=4),
        "journal": st.lists(
            st.one_of(st.binary(max_size=120), TEXT.map(lambda s: s.encode("utf-8", "surrogatepass"))),
            max_size=4,
        ),
        "words": TEXT,
        "stale": st.booleans(),
    }
)

# -------------------------------------------------------------------------------------------- the checks


def unsafe(text: str) -> list[str]:
    """The characters of `text` a terminal acts on or reorders, or that draw nothing (a line break between
    lines is fine; a no-break space or a private-use glyph draws as itself)."""
    return [
        c for c in text if c != "\n" and not c.isprintable() and unicodedata.category(c) not in ("Zs", "Co")
    ]


def _read(model: Any, text: str) -> Any:
    """What the console reads of a state file: the model, or nothing when the model refuses it."""
    try:
        return model.model_validate_json(text)
    except ValidationError:
        return None


class _Board:
    looking_at = "dashboard"


class _Runner:
    def now(self) -> datetime:
        return NOW_DT


class _State:
    """What the pairing link and the controller read of a host's state directory (its board, its clock)."""

    me = ME
    board = _Board()
    runner = _Runner()


@settings(max_examples=200, deadline=None)
@given(TEXT)
def test_the_text_path_lets_nothing_raw_through(text: str) -> None:
    safe = terminal_safe(text)
    assert not unsafe(safe) and "\n" not in safe, repr(safe)
    assert len(safe) == len(text)  # one character for one: columns and spans stay where they were
    kept = terminal_safe(text, keep_newlines=True)
    assert not unsafe(kept) and kept.count("\n") == text.count("\n")
    document = json.dumps({"m": text}, ensure_ascii=False)
    # The value a JSON reader gets, as from json.dumps's all-ASCII form (a surrogate pair in a Python
    # string reads back as the one character it encodes, whichever way it is written).
    assert not unsafe(json_safe(document))
    assert json.loads(json_safe(document)) == json.loads(json.dumps({"m": text}))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lock_file(), presence_file(), pending_file(), audit_line())
def test_the_state_file_models_refuse_or_give_values_the_words_can_use(
    lock: str, presence: str, pending: str, audit: str
) -> None:
    # Whatever a model accepts must survive the arithmetic and the words made of it: the clock text, the
    # age, the countdown, the audit line.
    if (info := _read(LockInfo, lock)) is not None:
        assert info.taken_at.astimezone().strftime("%H:%M:%S")
        view = PairingView(host="gpu1", now=NOW_DT, lock=info, lock_stale=True)
        assert view.lock_line()
    if (p := _read(Presence, presence)) is not None:
        p.stale(NOW_DT)
        assert p.since.astimezone()
    if (r := _read(PendingRollback, pending)) is not None:
        assert r.describe(NOW_DT)
    entry = parse_audit_line(audit)
    assert entry is None or isinstance(entry, AuditEntry)
    if entry is not None:
        assert entry.line() and entry.to_event()


def _gpus(name: str) -> HostGpuSample:
    gpu = GpuSample(index=0, name=name, utilization_pct=10.0, memory_used_mib=1000.0, memory_total_mib=8000.0)
    return HostGpuSample(state=SamplerState.OK, backend="nvidia-smi", gpus=(gpu,), ts=NOW - 1, host="gpu1")


async def _console(state: dict[str, Any]) -> list[str]:
    """One console fed `state` as a host would: the journal, the GPUs, the pairing view, the audit trail,
    a refusal, a failure, the palette and a confirmation; its screen's lines."""
    lock = _read(LockInfo, state["lock"])
    presence = [p for p in (_read(Presence, t) for t in state["presence"]) if p is not None]
    pending = _read(PendingRollback, state["pending"])
    audits = [e for e in (parse_audit_line(t) for t in state["audit"]) if e is not None]
    lines = [b.decode("utf-8", "replace") for b in state["journal"]]
    events = list(parse_lines(lines, host="gpu1"))
    words = state["words"]
    view = PairingView(
        host="gpu1",
        now=NOW_DT,
        presence=presence,
        lock=lock,
        lock_stale=state["stale"],
        pending_rollback=pending,
    )

    app = make_app()
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        ctl, dash = app.hosts["gpu1"], app.dashboards["gpu1"]
        dash.show(snapshot(events, _gpus(words)))
        link = PairingLink(_State(), on_view=lambda v: None, on_audit=lambda e: None)  # type: ignore[arg-type]
        link.view = view
        ctl.link = link
        ctl._on_view(view)  # as the live link hands them (and a replay does)
        ctl._on_audit(audits)
        ctl.refuse_locked("a restart")
        ctl._fail(f"the restart failed: {words}")
        app.notify(words, title=words)
        await pilot.press("ctrl+p")  # the palette lists the lock's holder and intent
        await pilot.press("escape")
        if lock is not None:
            app.post_message(BreakRequested("gpu1"))  # the confirmation names the holder and intent
            deadline = asyncio.get_running_loop().time() + 10
            while not isinstance(app.screen, ConfirmScreen):
                assert asyncio.get_running_loop().time() < deadline, "no confirmation"
                await pilot.pause(0.02)
            await pilot.pause()
            shown = [strip.text for strip in app.screen._compositor.render_strips()]
            await pilot.press("n")
        else:
            shown = []
        await pilot.pause()
        shown += [strip.text for strip in app.screen._compositor.render_strips()]
    return shown


# What the issue saw, accepted by every model: a holder named `mallory[/]`, paths in brackets, an OSC
# title, a bidi override and a zero-width space, in each file the console reads.
MALLORY = {
    "lock": json.dumps(
        {
            "holder": {"user": "mallory[/]", "jump_host": "evil\u202e", "pid": 4242, "console_id": "m1"},
            "intent": "apply [/opt/sglang]\x1b]0;pwned\x07",
            "taken_at": GOOD_DATE,
            "lock_id": "L1",
        }
    ),
    "presence": [
        json.dumps(
            {
                "user": "mallory[/]",
                "jump_host": "evil",
                "pid": 4242,
                "console_id": "m1",
                "since": GOOD_DATE,
                "heartbeat": GOOD_DATE,
                "looking_at": "[b]profiles\u200b",
            }
        )
    ],
    "pending": json.dumps(
        {
            "unit": "sglang[/]",
            "timer": "t",
            "deadline": "2026-11-30T10:10:00+00:00",
            "armed_at": GOOD_DATE,
            "armed_by": "mallory[/]",
            "profile": "[/opt/x]",
            "confirm_within_s": 600,
        }
    ),
    "audit": [
        json.dumps(
            {
                "ts": GOOD_DATE,
                "user": "mallory[/]",
                "host": "gpu1",
                "action": "apply",
                "profile": "ctx[/]",
                "outcome": "failed",
                "summary": "FAILED: [/opt/sglang/bin/python] \x1b[2J\u202etxt.exe",
                "durations": {"kv_pool": 3.5},
            }
        )
    ],
    "journal": ["Nov 30 10:00:00 gpu1 python3[1]: [/opt/x] \x1b]0;pwned\x07 \u202e\u2066x".encode()],
    "words": "the unit's ExecStart runs [/opt/sglang/bin/python] \x1b]0;pwned\x07\u202e",
    "stale": True,
}


@settings(
    max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@example(MALLORY)
@given(HOST_STATE)
def test_a_headless_console_takes_whatever_the_host_holds(state: dict[str, Any]) -> None:
    shown = asyncio.run(_console(state))
    bad = [line for line in shown if unsafe(line)]
    assert not bad, bad
    if state is MALLORY:  # shown as the text it is, not read as markup (nor dropped)
        screen = "\n".join(shown)
        assert "mallory[/]@evil\ufffd" in screen and "[/opt/sglang/bin/python] ␛]0;pwned␇\ufffd" in screen
