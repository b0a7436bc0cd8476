"""systemd's reading of unit files, as the twin's systemctl applies it (console.twin.unitfile)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from console.twin.unitfile import (
    UnitSyntaxError,
    expand_specifiers,
    parse_exec,
    quote_word,
    render_environment,
    render_exec,
    replace_env_argv,
    split_words,
)
from console.twin.unitload import load_service, parse_unit_text

TABLE = {"n": "sglang.service", "N": "sglang", "p": "sglang", "H": "gpu1", "t": "/run", "i": ""}


def argv(value: str, env: dict[str, str] | None = None) -> list[str]:
    cmds = parse_exec(value, TABLE)
    assert len(cmds) == 1
    return cmds[0].expanded_argv(env or {})


def test_plain_words_and_whitespace() -> None:
    assert argv("/usr/bin/python3  -m\tsglang.launch_server   --tp-size 8 ") == [
        "/usr/bin/python3",
        "-m",
        "sglang.launch_server",
        "--tp-size",
        "8",
    ]


def test_quotes_mid_word_and_empty_arguments() -> None:
    assert argv("/bin/echo a\"b c\"d '' \"\" x'y z'") == ["/bin/echo", "ab cd", "", "", "xy z"]


def test_backslash_escapes_apply_inside_single_quotes_too() -> None:
    # Unlike a shell, systemd decodes C escapes inside single quotes.
    assert argv(r"/bin/echo 'a\tb' \x41 \101 \u00e9 \s \\ \"q\"") == [
        "/bin/echo",
        "a\tb",
        "A",
        "A",
        "é",
        " ",
        "\\",
        '"q"',
    ]


def test_hex_escapes_build_utf8_bytes() -> None:
    assert argv(r"/bin/echo \xc3\xa9") == ["/bin/echo", "é"]


def test_unknown_escape_is_kept_verbatim_with_a_warning() -> None:
    warnings: list[str] = []
    cmds = parse_exec(r"/bin/echo a\qb", TABLE, warnings)
    assert cmds[0].argv == ("/bin/echo", "a\\qb")
    assert warnings and "unknown escape" in warnings[0]


def test_nul_escape_is_refused_then_kept_verbatim() -> None:
    warnings: list[str] = []
    assert parse_exec(r"/bin/echo \x00", TABLE, warnings)[0].argv == ("/bin/echo", "\\x00")


def test_unbalanced_quote_in_first_word_ignores_the_assignment() -> None:
    warnings: list[str] = []
    assert parse_exec('"/bin/echo a', TABLE, warnings) == []
    assert "Unbalanced quoting" in warnings[0]


def test_unbalanced_quote_later_refuses() -> None:
    with pytest.raises(UnitSyntaxError):
        parse_exec('/bin/echo "a b', TABLE)


def test_specifiers_resolve_per_word_after_unquoting() -> None:
    assert argv('/bin/echo %n "%%n" 100%% "%H x" %') == [
        "/bin/echo",
        "sglang.service",
        "%n",
        "100%",
        "gpu1 x",
        "%",
    ]
    with pytest.raises(UnitSyntaxError, match="unknown specifier"):
        parse_exec("/bin/echo %Z", TABLE)


def test_specifier_result_is_not_split_again() -> None:
    table = dict(TABLE, H="two words")
    assert parse_exec("/bin/echo %H", table)[0].argv == ("/bin/echo", "two words")


def test_environment_expansion_rules() -> None:
    env = {"FLAGS": '--a 1 "--b two"', "X": "x y"}
    assert argv("/bin/echo $FLAGS ${X} pre${X}post $$X $${X} $UNSET ${UNSET}", env) == [
        "/bin/echo",
        "--a",
        "1",
        "--b two",
        "x y",
        "prex ypost",
        "$X",
        "${X}",
        "",
    ]


def test_colon_prefix_disables_expansion_and_prefixes_are_recorded() -> None:
    cmd = parse_exec(":-/bin/echo $X", TABLE)[0]
    assert cmd.no_env_expand and cmd.ignore_failure
    assert cmd.expanded_argv({"X": "y"}) == ["/bin/echo", "$X"]


def test_at_prefix_takes_argv0_separately() -> None:
    cmd = parse_exec("@/usr/bin/python3 sglang-server -m x", TABLE)[0]
    assert cmd.path == "/usr/bin/python3"
    assert cmd.argv == ("sglang-server", "-m", "x")


def test_semicolon_separates_commands_and_escaped_semicolon_is_an_argument() -> None:
    cmds = parse_exec(r"/bin/echo a ; /bin/echo b \; c", TABLE)
    assert [c.argv for c in cmds] == [("/bin/echo", "a"), ("/bin/echo", "b", ";", "c")]
    assert parse_exec('/bin/echo ";"', TABLE)[0].argv == ("/bin/echo", ";")


def test_relative_path_with_slash_is_refused() -> None:
    with pytest.raises(UnitSyntaxError):
        parse_exec("bin/python -m x", TABLE)
    assert parse_exec("python3 -m x", TABLE)[0].path == "python3"


def test_environment_assignment_words() -> None:
    assert split_words(r'"A=b c" D=e\tf' + " 'G=h \"i\"' \\'x") == ["A=b c", "D=e\tf", 'G=h "i"', "'x"]


def test_replace_env_argv_unset_whole_word_vanishes() -> None:
    assert replace_env_argv(["/x", "$NOPE", "a"], {}) == ["/x", "a"]


def test_line_continuation_and_comments() -> None:
    text = "[Service]\nExecStart=/bin/echo a \\\n# a comment inside\n  b \\\n  c\n; comment\nType=simple\n"
    assignments, _ = parse_unit_text(text, Path("x.service"))
    assert [(a.key, a.value) for a in assignments] == [("ExecStart", "/bin/echo a  b  c"), ("Type", "simple")]
    assert argv(assignments[0].value) == ["/bin/echo", "a", "b", "c"]


HOSTILE = [
    "",
    " ",
    "two words",
    'quote"inside',
    "single'quote",
    "back\\slash",
    "trailing\\",
    "100%",
    "%n",
    "%%",
    "$HOME",
    "${HOME}",
    "$$",
    ";",
    "\\;",
    "tab\there",
    "new\nline",
    "cr\rhere",
    "é unicode ✓",
    '--served-model-name=Kimi K2.6 "ddtree"',
    "'\"'\"'",
    "\x01ctl",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_rendered_hostile_values_read_back_exactly(value: str) -> None:
    rendered = render_exec(["/usr/bin/python3", "-m", "sglang.launch_server", value, "--after"])
    assert argv(rendered, {"HOME": "/root"}) == [
        "/usr/bin/python3",
        "-m",
        "sglang.launch_server",
        value,
        "--after",
    ]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")), max_size=6
    )
)
def test_render_exec_round_trips_any_argv(words: list[str]) -> None:
    full = ["/usr/bin/python3", *words]
    assert argv(render_exec(full), {"A": "x"}) == full


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")))
def test_render_environment_round_trips(value: str) -> None:
    words = [expand_specifiers(w, TABLE) for w in split_words(render_environment({"K26_X": value}))]
    assert words == [f"K26_X={value}"]


def test_quote_word_leaves_plain_words_alone() -> None:
    assert quote_word("--mem-fraction-static") == "--mem-fraction-static"
    assert quote_word("0.85") == "0.85"


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _load(root: Path, name: str = "sglang.service"):  # type: ignore[no-untyped-def]
    return load_service(root, name, lambda n, f: dict(TABLE, n=n))


def test_dropins_reset_execstart_and_later_files_win(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "sglang.service",
        "[Unit]\nDescription=S\n[Service]\nExecStart=/bin/a 1\nEnvironment=A=1 B=2\n",
    )
    _write(
        tmp_path,
        "sglang.service.d/10-first.conf",
        "[Service]\nExecStart=\nExecStart=/bin/b 2\nEnvironment=A=3\n",
    )
    _write(tmp_path, "sglang.service.d/20-second.conf", "[Service]\nExecStart=\nExecStart=/bin/c 3\n")
    _write(tmp_path, "sglang.service.d/ignored.txt", "[Service]\nExecStart=\n")
    svc = _load(tmp_path)
    assert svc.load_state == "loaded"
    assert [c.argv for c in svc.exec_start] == [("/bin/c", "3")]
    assert svc.environment == {"A": "3", "B": "2"}
    assert [Path(p).name for p in svc.dropin_paths] == ["10-first.conf", "20-second.conf"]


def test_dropin_without_reset_makes_two_execstarts_and_refuses(tmp_path: Path) -> None:
    _write(tmp_path, "sglang.service", "[Service]\nExecStart=/bin/a\n")
    _write(tmp_path, "sglang.service.d/k26.conf", "[Service]\nExecStart=/bin/b\n")
    svc = _load(tmp_path)
    assert svc.load_state == "bad-setting"
    assert "more than one ExecStart" in svc.load_error


def test_missing_unit_is_not_found(tmp_path: Path) -> None:
    assert _load(tmp_path).load_state == "not-found"
