"""Where a rollback goes, read from the header of the drop-in the last apply kept (the real text both
writers produce), and its verdict in words: never "rolled back to rollback", never "pool X ≥ X"."""

from __future__ import annotations

from console.core.profiles import parse_profile, profile_dropin
from console.core.rollback_target import (
    PREVIOUS_DROPIN,
    UNIT_DEFAULT,
    pool_verdict,
    rollback_target,
)
from console.core.systemd import render_dropin
from console.sources.profile_store import shipped_profile_dir


def _ctx200k_dropin() -> str:
    path = shipped_profile_dir() / "ctx-200k.toml"
    profile = parse_profile(path.read_text(), name="ctx-200k")
    return profile_dropin(profile, when="2026-12-07T10:00:00Z")


def test_the_profile_named_in_the_kept_drop_in_is_where_it_goes() -> None:
    went = rollback_target(_ctx200k_dropin())
    assert (went.name, went.profile, went.target_context) == ("ctx-200k", "ctx-200k", 200_000)


def test_the_service_controllers_header_names_the_profile_too() -> None:
    # The header ServiceController.apply writes (console/sources/service.py).
    text = render_dropin(
        ["python3", "-m", "sglang.launch_server", "--context-length", "131072"],
        header=[
            "Written by k26-console: profile ctx-128k (target context 131,072 tokens, SGLang 0.5.5), "
            "2026-12-07T10:00:00Z.",
            "The previous drop-in, if any, is kept as 50-k26-console.conf.bak for the rollback.",
        ],
    )
    went = rollback_target(text)
    assert (went.name, went.target_context) == ("ctx-128k", 131_072)


def test_without_a_kept_drop_in_it_goes_to_the_units_own_execstart() -> None:
    went = rollback_target(None)
    assert (went.name, went.profile, went.target_context) == (UNIT_DEFAULT, None, None)


def test_a_drop_in_without_the_consoles_header_is_the_previous_drop_in() -> None:
    hand_written = "[Service]\nExecStart=\nExecStart=/usr/bin/python3 -m sglang.launch_server\n"
    assert rollback_target(hand_written).name == PREVIOUS_DROPIN
    # A header below [Service], an absurd target or a name with a terminal escape names nothing.
    late = hand_written + "# Written by k26-console: profile x (target context 1,000 tokens, SGLang 1).\n"
    absurd = "# Written by k26-console: profile big (target context 999,999,999,999 tokens, SGLang 1).\n"
    escape = "# Written by k26-console: profile a\x1b[2J (target context 1,000 tokens, SGLang 1).\n"
    for text in (late, absurd, escape):
        assert rollback_target(text).name == PREVIOUS_DROPIN, text
    # The positive control: the same header on top names its profile.
    assert rollback_target(late.split("\n", 3)[3] + hand_written).name == "x"


def test_the_verdict_names_the_target_it_compares_with_never_the_pool_itself() -> None:
    assert (
        pool_verdict(218_484, 200_000, whose="ctx-200k")
        == "pool 218,484 tokens ≥ 200,000 (ctx-200k's target)"
    )
    assert pool_verdict(101_134, before=101_134) == "pool 101,134 tokens, as before the apply"
    assert pool_verdict(101_200, before=101_134) == "pool 101,200 tokens (101,134 before the apply)"
    assert pool_verdict(101_134) == "pool 101,134 tokens"
    # An apply's own verdict keeps its form.
    assert pool_verdict(218_484, 200_000) == "pool 218,484 tokens ≥ 200,000"
