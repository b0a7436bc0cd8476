"""systemd quoting both ways: a rendered ExecStart= unquotes to exactly the argv, whatever the values."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from console.core.systemd import (
    ExecStartError,
    dropin_path,
    exec_start_lines,
    quote_word,
    render_dropin,
    render_exec_start,
    split_exec_start,
)

HOSTILE = st.text(
    alphabet=st.one_of(
        st.sampled_from(list("\"'\\;$()%{}` \t\n\r\x0b\x0c\x07\x7f&|<>*?#=-@+!:")),
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    ),
    max_size=40,
)
PROGRAM = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1
).filter(lambda s: s[0] not in "-@:+!|")


@settings(max_examples=400, deadline=None)
@given(program=PROGRAM, args=st.lists(HOSTILE, max_size=8))
@example(
    program="/usr/bin/python3",
    args=["--served-model-name", 'a"; rm -rf / #', "$(reboot)", "${HOME}", "%n", "a\nExecStart=/bin/sh"],
)
@example(program="python3", args=["", " ", "\\", "\\\\", "'", '"', "$$", "%%", ";", "\\;", "é✓日本"])
def test_round_trip_is_exact(program: str, args: list[str]) -> None:
    argv = [program, *args]
    line = render_exec_start(argv)
    assert "\n" not in line and "\r" not in line
    assert split_exec_start(line) == argv
    assert split_exec_start("ExecStart=" + line) == argv
    # the drop-in holds exactly one effective ExecStart, and it is this argv
    text = render_dropin(argv, header=["profile x"])
    lines = exec_start_lines(text)
    assert len(lines) == 1
    assert split_exec_start(lines[0]) == argv


@given(word=HOSTILE)
def test_quoted_word_has_no_live_specials(word: str) -> None:
    q = quote_word(word)
    assert q.startswith('"') and q.endswith('"')
    inner = q[1:-1]
    # every % is doubled and every $ is doubled: nothing expands
    assert inner.replace("%%", "").count("%") == 0
    assert inner.replace("$$", "").count("$") == 0
    # no raw control characters reach the unit file
    assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in inner)


def test_systemd_syntax_read_as_systemd_does() -> None:
    line = r"""ExecStart=-/usr/bin/python3 -m sglang.launch_server "a b" 'c d' e"f g"h %% 100%%ok $$HOME ${X} \x41\u00e9 \;"""
    assert split_exec_start(line) == [
        "/usr/bin/python3",
        "-m",
        "sglang.launch_server",
        "a b",
        "c d",
        "ef gh",
        "%",
        "100%ok",
        "$HOME",
        "${X}",
        "Aé",
        ";",
    ]
    assert split_exec_start("@/usr/bin/python3 python -V") == ["python", "-V"]
    assert split_exec_start("/bin/echo %i", specifiers={"i": "inst"}) == ["/bin/echo", "inst"]


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('/bin/echo "open', "quote is not closed"),
        ("/bin/echo a ; /bin/echo b", "more than one command"),
        ("/bin/echo %n", "specifier"),
        ("/bin/echo \\q", "escape"),
        ("/bin/echo \\x00", "not allowed"),
        ("   ", "empty"),
        ("- ", "no program"),
    ],
)
def test_refused_lines(line: str, needle: str) -> None:
    with pytest.raises(ExecStartError, match=needle):
        split_exec_start(line)


@pytest.mark.parametrize(
    "argv", [[], [""], ["-/bin/sh"], ["@x"], ["/bin/echo", "a\x00b"], ["/bin/echo", "\ud800"]]
)
def test_unrenderable_argv(argv: list[str]) -> None:
    with pytest.raises(ExecStartError):
        render_exec_start(argv)


def test_dropin_shape_and_path() -> None:
    text = render_dropin(["/usr/bin/python3", "-m", "sglang.launch_server"], header=["line one", "line two"])
    assert text.splitlines() == [
        "# line one",
        "# line two",
        "[Service]",
        "ExecStart=",
        'ExecStart="/usr/bin/python3" "-m" "sglang.launch_server"',
    ]
    assert dropin_path("sglang") == "/etc/systemd/system/sglang.service.d/50-k26-console.conf"
    assert dropin_path("kimi@1.service").endswith("kimi@1.service.d/50-k26-console.conf")
    for bad in ("../etc", "a b", "x/y", ""):
        with pytest.raises(ExecStartError):
            dropin_path(bad)


def test_exec_start_lines_reset_and_continuation() -> None:
    unit = "[Unit]\nDescription=x\n[Service]\nExecStart=/bin/old\n# comment\nExecStart=\nExecStart=/bin/new \\\n  --flag 1\n"
    assert exec_start_lines(unit) == ["/bin/new    --flag 1"]
    assert split_exec_start(exec_start_lines(unit)[0]) == ["/bin/new", "--flag", "1"]
