"""Themes: no colour is written in the widgets or the styles outside console/tui/themes.py, each theme
names every role and reads on its own background, the choice comes from the config or the command
line (one sentence when wrong), the command palette switches it, and the dashboard repaints in it."""

from __future__ import annotations

import ast
import contextlib
import re
import time
from pathlib import Path

import pytest
from rich.style import Style
from textual.color import Color
from textual.strip import Strip

from console.cli.cmd_console import THEME_NAMES, resolve_theme
from console.cli.errors import UsageError
from console.sources.hosts import HostsError, parse_hosts
from console.tui.themes import (
    HIGH_CONTRAST,
    LIGHT,
    ROLES,
    THEMES,
    palette_for,
    role_style,
    themed_content,
)
from tests.test_tui_serving import _show, serving_snapshot
from tests.tui_support import make_app

REPO = Path(__file__).resolve().parents[1]
ALLOWED = {REPO / "console/tui/themes.py"}
"""Where colours may be written: the themes themselves."""
TERMINAL_DEFAULTS = {"default", "none"}
"""Rich's and Textual's names for the terminal's own colours: no colour of ours."""
_MARKUP_TAG = re.compile(r"\[([a-z#][^\[\]/]*)\]")
_CSS_COLOUR = re.compile(r"#[0-9a-fA-F]{3,8}\b|\b(?:rgb|rgba|hsl|hsla)\(")


_VARIABLE = re.compile(r"\$[\w-]+")


def _style_colours(text: str) -> list[str]:
    """The colours a Rich style string names (`bold grey62 on red`), or a Textual one beside its
    variables (`$k26-bad on red`: the variables are the theme's, the rest is not); [] when it is no
    style."""
    try:
        style = Style.parse(_VARIABLE.sub("", text) if "$" in text else text)
    except Exception:  # not a style: a sentence, a key, a label
        return []
    return [
        c.name
        for c in (style.color, style.bgcolor)
        if c is not None and c.name.lower() not in TERMINAL_DEFAULTS
    ]


def python_colours(source: str) -> list[str]:
    """Colours written in Python source: string constants that are Rich styles with a colour, and
    markup tags with one (`[green3]`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            value = node.value
            if len(value) < 60 and "\n" not in value and _style_colours(value):
                found.append(repr(value))
            found += [f"[{tag}]" for tag in _MARKUP_TAG.findall(value) if _style_colours(tag)]
    return found


def default_css_colours(source: str) -> list[str]:
    """Colours written in the stylesheets of Python source (a widget's `DEFAULT_CSS` or `CSS`, which
    the Rich-style scan does not read: a CSS rule is no style string)."""
    found: list[str] = []
    if "CSS" not in source:
        return found  # most modules: parsing them again was a quarter of the scan
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if {"DEFAULT_CSS", "CSS"} & set(names) and isinstance(node.value.value, str):
                found += tcss_colours(node.value.value)
    return found


def tcss_colours(source: str) -> list[str]:
    """Colours written in a Textual stylesheet: hex, rgb()/hsl(), or a colour's name as a value."""
    from textual._color_constants import COLOR_NAME_TO_RGB

    found = []
    for decl in re.findall(r"[\w-]+\s*:\s*([^;{}]+);", re.sub(r"/\*.*?\*/", "", source, flags=re.S)):
        found += _CSS_COLOUR.findall(decl)
        found += [w for w in re.findall(r"(?<![$\w-])[a-z_]+[0-9]*", decl) if w in COLOR_NAME_TO_RGB]
    return found


def test_the_scan_finds_a_colour_where_one_is_written() -> None:
    assert python_colours('t.append("x", "grey62")') == ["'grey62'"]
    assert python_colours('Text("x", "bold white on red3")') == ["'bold white on red3'"]
    assert python_colours('HELP = "[green3]KV[/] [b]bold[/b] [theme.kv]kv[/]"') == ["[green3]"]
    assert python_colours('t.append("x", "bold")') == []
    assert python_colours('log("the pool is not ready")') == []
    assert tcss_colours(".a { background: #303030; color: red; border: round $accent; }") == [
        "#303030",
        "red",
    ]
    assert tcss_colours(".a { background: rgb(1, 2, 3) 50%; }") == ["rgb("]
    assert tcss_colours(".a { border: tall $error; text-wrap: nowrap; }") == []
    widget = 'class W:\n    DEFAULT_CSS = """\n    W { background: $panel; color: #ff0000; }\n    """\n'
    assert default_css_colours(widget) == ["#ff0000"]
    assert default_css_colours(widget.replace("#ff0000", "$k26-muted")) == []
    # a role's variable written in Textual content's style (`$k26-bad`) is no colour
    assert python_colours('Content.styled("x", "bold $k26-bad")') == []
    assert python_colours('Content.styled("x", "$k26-bad on red")') == ["'$k26-bad on red'"]


def test_no_colour_is_written_in_the_widgets_or_the_styles() -> None:
    found = []
    for path in sorted((REPO / "console/tui").glob("*.py")):
        if path not in ALLOWED:
            source = path.read_text()
            found += [f"{path.relative_to(REPO)}: {c}" for c in python_colours(source)]
            found += [f"{path.relative_to(REPO)}: {c}" for c in default_css_colours(source)]
    for path in sorted((REPO / "styles").glob("*.tcss")):
        found += [f"{path.relative_to(REPO)}: {c}" for c in tcss_colours(path.read_text())]
    assert found == [], "colours belong in console/tui/themes.py (a role of the palette)"


def _contrast(a: str, b: str) -> float:
    def luminance(hex_colour: str) -> float:
        def channel(v: int) -> float:
            c = v / 255
            return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

        r, g, b_ = Color.parse(hex_colour).rgb
        return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b_)

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_each_theme_names_every_role_and_its_text_reads() -> None:
    assert tuple(THEMES) == THEME_NAMES  # the CLI's list, kept without importing Textual
    text_roles = ("text", "muted", "faint", "ok", "warn", "bad", "info", "step")
    for name, theme in THEMES.items():
        # every role but the two that are the theme's own foreground and accent
        assert {f"k26-{r}" for r in ROLES if r not in ("text", "accent")} <= set(theme.variables), name
        pal = palette_for(theme)
        background = theme.background or "#121212"
        # WCAG: 4.5:1 for text; the high-contrast theme's labels and verdicts 7:1 (AAA)
        floor = 7.0 if name == HIGH_CONTRAST else 4.5
        for role in text_roles:
            if role == "faint" and name != HIGH_CONTRAST:
                continue  # absent figures and axes: secondary by design
            assert _contrast(pal.colour(role), background) >= floor, (name, role)
    assert palette_for(THEMES[LIGHT]).colours != palette_for(THEMES[HIGH_CONTRAST]).colours


def test_help_markup_names_its_colours_by_role() -> None:
    text = themed_content("[bold theme.bad]errors[/] and [theme.kv]KV[/], \\[flags] [b]as typed[/b]")
    assert text.plain == "errors and KV, [flags] as typed"
    assert [s.style for s in text.spans] == ["bold $k26-bad", "$k26-kv", "b"]
    assert role_style("text") == "$foreground" and role_style("muted", bold=True) == "bold $k26-muted"
    with pytest.raises(ValueError, match="'grey' is no role"):
        themed_content("[theme.grey]x[/]")


def _help_texts() -> list[tuple[str, str]]:
    """Every HELP text of the console's widgets (F1 shows them through `themed_content`)."""
    import importlib
    import pkgutil

    import console.tui

    found = []
    for info in pkgutil.iter_modules(console.tui.__path__):
        module = importlib.import_module(f"console.tui.{info.name}")
        for name, obj in vars(module).items():
            text = getattr(obj, "HELP", None)
            if isinstance(obj, type) and obj.__module__ == module.__name__ and isinstance(text, str) and text:
                found.append((f"{info.name}.{name}", text))
    return found


def test_every_help_names_roles_the_themes_have() -> None:
    helps = _help_texts()
    assert {"panels.GpuPanel", "feed.FeedLog"} <= {name for name, _ in helps}  # the two that name roles
    variables = {v for theme in THEMES.values() for v in theme.variables}
    for name, text in helps:
        content = themed_content(text)  # ValueError on a role the palette does not have
        for span in content.spans:
            for word in str(span.style).split():
                if word.startswith("$k26-"):
                    assert word[1:] in variables, (name, word)


def test_the_theme_comes_from_the_command_line_then_the_config() -> None:
    assert resolve_theme(None, None) == "dark"
    assert resolve_theme(None, "light") == "light"
    assert resolve_theme("high-contrast", "light") == "high-contrast"
    with pytest.raises(UsageError, match=r"^--theme names no theme 'solarized': choose one of dark, light"):
        resolve_theme("solarized", None)
    with pytest.raises(UsageError, match=r"^\[ui\] theme in the hosts file names no theme"):
        resolve_theme(None, "Light")
    assert parse_hosts('[ui]\ntheme = "light"\n').ui.theme == "light"
    assert parse_hosts("").ui.theme is None
    with pytest.raises(HostsError, match=r"ui\.colour is not a known setting"):
        parse_hosts('[ui]\ncolour = "light"\n')
    with pytest.raises(HostsError, match=r"ui must be a table"):
        parse_hosts('ui = "light"\n')


def _colours(strips: list[Strip]) -> set[str]:
    return {
        seg.style.color.triplet.hex.upper()
        for strip in strips
        for seg in strip
        if seg.style is not None and seg.style.color is not None and seg.style.color.triplet is not None
    }


async def test_the_palette_switches_the_theme_and_the_dashboard_repaints_in_it() -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await _show(serving_snapshot())(pilot)
        dash = app.dashboards["gpu1"]
        dark = palette_for(THEMES["dark"])
        light = palette_for(THEMES[LIGHT])

        def drawn() -> set[str]:
            colours: set[str] = set()
            for widget in (dash.serving, dash.gpus, dash.kv, dash.feed.log_widget):
                colours |= _colours(widget.render_lines(widget.region.reset_offset))
            return colours

        before = drawn()
        assert dark.colour("muted") in before and light.colour("muted") not in before
        await pilot.press("ctrl+p")
        await pilot.press(*"theme: light")
        deadline = time.monotonic() + 10  # the palette searches in a worker

        def first_option() -> str:
            return str(app.screen.query("CommandList").first().get_option_at_index(0).prompt)

        while True:
            await pilot.pause(0.05)
            with contextlib.suppress(Exception):  # no list, or no option yet, while it searches
                if "Theme: light" in first_option():
                    break
            assert time.monotonic() < deadline, "the palette never offered Theme: light"
        await pilot.press("enter")
        await pilot.pause()
        assert app.theme == LIGHT
        after = drawn()
        # the figures, the bars and the feed's rows: in the light theme's colours, none in the dark's
        assert {light.colour(r) for r in ("muted", "kv", "info")} <= after
        assert dark.colour("muted") not in after and dark.colour("kv") not in after


async def test_a_theme_of_textual_s_own_defines_every_role_variable() -> None:
    # Content that names `$k26-bad` must draw in the theme's red under one of Textual's own themes too,
    # not fall back to the plain foreground (the app's get_theme_variable_defaults).
    from console.tui.themes import ROLES, palette_for

    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        same = lambda a, b: Color.parse(a) == Color.parse(b)  # noqa: E731
        assert same(app.theme_variables["k26-bad"], palette_for(app.current_theme).colour("bad"))  # ours
        app.theme = "textual-light"
        await pilot.pause()
        theme = app.current_theme
        assert theme.name == "textual-light" and "k26-bad" not in theme.variables
        for role in ROLES:
            assert same(app.theme_variables[f"k26-{role}"], palette_for(theme).colour(role)), role
