"""Profiles: the shipped examples, TOML in and out with comments kept, atomic saving, diffs, drop-ins."""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from console.core.flags import load_flag_list
from console.core.profiles import (
    Profile,
    ProfileError,
    Verified,
    diff_against_argv,
    diff_profiles,
    parse_profile,
    profile_argv,
    profile_dropin,
    record_verified,
    update_profile_text,
    validate_profile,
)
from console.core.systemd import exec_start_lines, split_exec_start
from console.sources.profile_store import (
    ProfileStore,
    atomic_write_text,
    shipped_profile_dir,
    user_profile_dir,
)

SHIPPED = Path(__file__).resolve().parent.parent / "profiles"
NAMES = ["ctx-32k", "ctx-128k", "ctx-200k", "ctx-256k"]


def pool(f: float, cell_factor: int = 1) -> int:
    """The incident's calibrated line (bf16 MLA); fp8 KV halves the cell and doubles the pool."""
    return cell_factor * int(1_303_888 * f - 1_007_171)


def comments(text: str) -> list[str]:
    return [m.group(0).strip() for m in re.finditer(r"#.*$", text, re.M)]


@pytest.mark.parametrize("name", NAMES)
def test_shipped_profiles_are_valid_and_reach_their_target(name: str) -> None:
    text = (SHIPPED / f"{name}.toml").read_text()
    prof = parse_profile(text, name=name)
    assert prof.name == name
    result = validate_profile(prof, load_flag_list(prof.sglang_version))
    assert result.ok, result.errors
    assert result.warnings == []
    f = prof.flags["mem-fraction-static"]
    fp8 = prof.flags.get("kv-cache-dtype") == "fp8_e4m3"
    assert pool(f, 2 if fp8 else 1) >= prof.target_context
    assert prof.flags["context-length"] == prof.target_context
    assert "1,303,888" in text  # says where the number came from
    # ≥ 3 GiB headroom by the same estimate as the comments: 4.24 GiB at 0.94, 0.67 GiB per 0.01 below
    assert 4.24 + 66.6 * (0.94 - f) >= 3.0


def test_ctx_256k_says_bf16_does_not_fit() -> None:
    text = (SHIPPED / "ctx-256k.toml").read_text()
    assert "DOES NOT FIT WITH A BF16 KV CACHE" in text
    assert pool(0.954) < 262_144 <= pool(0.974)
    assert parse_profile(text, name="ctx-256k").flags["kv-cache-dtype"] == "fp8_e4m3"


def test_bad_toml_names_the_line() -> None:
    with pytest.raises(ProfileError, match=r"^x\.toml line 3 is not valid TOML: .+\.$"):
        parse_profile('name = "x"\ntarget_context = 1\n[flags\n', name="x")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "target_context = 1\nmem-fraction-static = 0.9\n",
            r"line 2: mem-fraction-static is not a profile setting",
        ),
        ("target_context = -5\n", r"line 1: target_context: input should be greater than 0"),
        ('notes = "x"\n', "target_context is missing"),
        ('target_context = 10\n[verified]\npool_tokens = "many"\n', r"line 3: verified.pool_tokens"),
        ('target_context = 10\nname = "q"\n', "line 2 says name = 'q', but a profile is named by its file"),
    ],
)
def test_schema_errors_are_one_sentence(text: str, needle: str) -> None:
    with pytest.raises(ProfileError, match=needle) as exc:
        parse_profile(text, name="p")
    assert "\n" not in str(exc.value)


def test_profile_names_are_plain() -> None:
    with pytest.raises(ProfileError, match="a profile name is letters"):
        parse_profile("target_context = 10\n", name="a b")


def test_record_verified_keeps_comments_and_order() -> None:
    text = (SHIPPED / "ctx-200k.toml").read_text()
    v = Verified(
        pool_tokens=205_444,
        headroom_gib=4.9,
        tok_s_at_depth={1000: 41.5, 185_000: 0.7},
        when=datetime(2026, 5, 30, 22, 14, 46, tzinfo=UTC),
        host="gpu-01",
    )
    out = record_verified(text, v)
    assert comments(out)[: len(comments(text))] == comments(text)
    assert out.startswith(text.split("[verified]")[0])
    prof = parse_profile(out, name="ctx-200k")
    assert prof.verified == v
    # a second record updates in place
    again = record_verified(out, Verified(pool_tokens=205_500, tok_s_at_depth={1000: 42.0}))
    p2 = parse_profile(again, name="ctx-200k")
    assert p2.verified is not None
    assert p2.verified.pool_tokens == 205_500
    assert p2.verified.tok_s_at_depth == {1000: 42.0, 185_000: 0.7}
    assert p2.verified.host == "gpu-01"
    assert again.count("[verified]") == 1


def test_update_profile_text_keeps_comments() -> None:
    text = (SHIPPED / "ctx-200k.toml").read_text()
    prof = parse_profile(text, name="ctx-200k")
    flags = dict(prof.flags)
    flags["mem-fraction-static"] = 0.935
    del flags["chunked-prefill-size"]
    flags["page-size"] = 1
    out = update_profile_text(text, prof.model_copy(update={"flags": flags}))
    back = parse_profile(out, name="ctx-200k")
    assert back.flags == flags
    assert "mem-fraction-static = 0.935     # T(0.93) = 205,444" in out  # trailing comment kept
    assert comments(out) == comments(text)
    assert update_profile_text(text, prof) == text  # nothing changed → byte-identical


def test_new_profile_text_round_trips() -> None:
    prof = Profile(
        name="mine", target_context=1000, notes="a\nb", flags={"model-path": "m", "cuda-graph-bs": [1, 2]}
    )
    assert parse_profile(update_profile_text("", prof), name="mine") == prof


def test_argv_and_dropin_round_trip() -> None:
    prof = parse_profile((SHIPPED / "ctx-200k.toml").read_text(), name="ctx-200k")
    fl = load_flag_list(prof.sglang_version)
    argv = profile_argv(prof, fl)
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert "--mem-fraction-static" in argv and argv[argv.index("--mem-fraction-static") + 1] == "0.93"
    assert "--trust-remote-code" in argv
    text = profile_dropin(prof, fl)
    assert "[Service]\nExecStart=\nExecStart=" in text
    (line,) = exec_start_lines(text)
    assert split_exec_start(line) == argv


def test_hostile_values_cannot_change_the_command() -> None:
    evil = 'x" --port 1; rm -rf / $(reboot) %n\nExecStart=/bin/sh'
    prof = Profile(name="evil", target_context=10, flags={"model-path": "m", "served-model-name": evil})
    fl = load_flag_list("v0.5.12.post1")
    (line,) = exec_start_lines(profile_dropin(prof, fl))
    argv = split_exec_start(line)
    assert argv == profile_argv(prof, fl)
    assert argv[-1] == evil


def test_diffs_compare_what_the_server_sees() -> None:
    fl = load_flag_list("v0.5.12.post1")
    a = Profile(
        name="a", target_context=200_000, flags={"model-path": "m", "tp": 8, "mem-fraction-static": 0.94}
    )
    b = Profile(
        name="b",
        target_context=200_000,
        flags={"model-path": "m", "tp-size": 8, "mem-fraction-static": 0.940},
    )
    assert diff_profiles(a, b, fl).empty
    c = b.model_copy(update={"flags": {**b.flags, "mem-fraction-static": 0.93, "enable-metrics": True}})
    d = diff_profiles(a, c, fl)
    assert d.lines() == ["~ --mem-fraction-static 0.94 → 0.93", "+ --enable-metrics on"]
    running = split_exec_start(
        '"python3" -m sglang.launch_server --model-path m --tp 8 --mem-frac 0.940 --port 30000'
    )
    d2 = diff_against_argv(running, c, fl)
    assert [(x.key, x.kind) for x in d2.changes] == [
        ("--mem-fraction-static", "changed"),
        ("--port", "removed"),
        ("--enable-metrics", "added"),
    ]
    assert diff_against_argv(
        [
            *running[:3],
            "--model-path",
            "m",
            "--tp-size",
            "8",
            "--mem-fraction-static",
            "0.93",
            "--enable-metrics",
        ],
        c,
        fl,
    ).empty


def test_validation_profile_level_checks() -> None:
    fl = load_flag_list("v0.5.12.post1")
    prof = Profile(name="p", target_context=200_000, flags={"model-path": "m", "context-length": "128k"})
    result = validate_profile(prof, fl)
    assert [i.code for i in result.errors] == ["context_below_target"]
    no_ctx = validate_profile(Profile(name="p", target_context=10, flags={"model-path": "m"}), fl)
    assert no_ctx.ok and [i.code for i in no_ctx.warnings] == ["no_context_length"]
    bad_cmd = Profile(
        name="p", target_context=10, command=["-python3"], flags={"model-path": "m", "context-length": 10}
    )
    assert [i.code for i in validate_profile(bad_cmd, fl).errors] == ["exec_start"]


def test_atomic_write_never_leaves_half_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "p.toml"
    atomic_write_text(target, "old\n")
    os.chmod(target, 0o600)
    atomic_write_text(target, "new\n")
    assert target.read_text() == "new\n"
    assert target.stat().st_mode & 0o777 == 0o600

    def boom(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_text(target, "half")
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.toml"]


def test_store_user_shadows_shipped_and_records(tmp_path: Path) -> None:
    user, shipped = tmp_path / "user", tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "ctx-200k.toml").write_text((SHIPPED / "ctx-200k.toml").read_text())
    (shipped / "other.toml").write_text("target_context = 5\n")
    store = ProfileStore([user, shipped])
    assert [e.name for e in store.entries()] == ["ctx-200k", "other"]
    path = store.record_verified("ctx-200k", Verified(pool_tokens=205_444))
    assert path == user / "ctx-200k.toml"
    assert (shipped / "ctx-200k.toml").read_text() == (SHIPPED / "ctx-200k.toml").read_text()
    assert store.find("ctx-200k").path == user / "ctx-200k.toml"
    assert store.load("ctx-200k").verified == Verified(pool_tokens=205_444)
    assert "# Kimi K2.6" in (user / "ctx-200k.toml").read_text()
    with pytest.raises(ProfileError, match=r"no profile named 'nope'.*known: ctx-200k, other"):
        store.find("nope")
    with pytest.raises(ProfileError):
        store.save_text("broken", "target_context = \n")
    assert not (user / "broken.toml").exists()


def test_default_dirs() -> None:
    assert user_profile_dir().name == "profiles"
    assert "k26-console" in str(user_profile_dir())
    assert shipped_profile_dir() == SHIPPED


def test_the_profile_in_force_follows_applies_and_rollbacks() -> None:
    from console.core.audit import AuditEntry
    from console.core.pairing import Identity
    from console.core.rollback_target import PREVIOUS_DROPIN, UNIT_DEFAULT
    from console.sources.profile_store import applied_profile, applied_target

    alice = Identity(user="alice", jump_host="jump1", pid=1, console_id="a")
    ts = datetime(2026, 12, 7, 6, 0, tzinfo=UTC)

    def entry(action: str, profile: str | None, outcome: str = "ok") -> AuditEntry:
        return AuditEntry.by(alice, ts=ts, host="gpu1", action=action, profile=profile, outcome=outcome)

    applied = [entry("apply", "ctx-200k"), entry("apply", "ctx-256k")]
    assert applied_profile(applied) == "ctx-256k"
    # A rollback to the profile the kept drop-in names puts that one back in force...
    assert applied_profile([*applied, entry("rollback", "ctx-200k")]) == "ctx-200k"
    assert applied_target([*applied, entry("rollback", "ctx-200k")]) == ("ctx-200k", 200_000)
    # ...one to a drop-in of no profile, or to the unit's own ExecStart, leaves none known in force...
    for where in (PREVIOUS_DROPIN, UNIT_DEFAULT, None):
        assert applied_profile([*applied, entry("rollback", where)]) is None
    # ...and a rollback that failed changes nothing, an apply after it counts again.
    assert applied_profile([*applied, entry("rollback", "ctx-200k", "failed")]) == "ctx-256k"
    assert applied_profile([*applied, entry("rollback", None), entry("apply", "ctx-128k")]) == "ctx-128k"
