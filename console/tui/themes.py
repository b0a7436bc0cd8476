"""The console's themes (Textual `Theme`s: dark, light, high-contrast) and the palette the widgets draw
with.

The styles in styles/console.tcss name theme variables (`$panel`, `$accent`...). The widgets that build
Rich text in Python (bars, gauge, charts, feed rows, the header's badges) take their colours from
`palette()`: the active app's theme, read into roles (`muted`, `ok`, `bad`, the memory segments...). A
theme names a role with a `k26-<role>` variable; a theme that does not (one of Textual's own) gets the
role from its standard colours, so any theme draws the whole console. This module is the one place in
the widgets where colours are written (tests/test_tui_themes.py scans for others).

A theme change must repaint every screen. Three ways, best first:
- Textual content whose styles name the role's variable (`role_style`, `themed_content`: `$k26-bad`): the
  variable is read when the content is drawn, and Textual redraws every widget when the theme changes.
- A widget that builds its Rich text in `render()` with `palette()`: the same redraw rebuilds it.
- A widget that builds its text once (a `Static` updated with Rich text, a cache of drawn rows) is a
  `Restyles`: after a theme change the app calls `restyle()` on every one, on every screen it holds
  (`restyle_screens`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from rich.style import Style
from textual._context import active_app
from textual.color import Color
from textual.content import Content
from textual.dom import DOMNode
from textual.theme import Theme

DARK, LIGHT, HIGH_CONTRAST = "dark", "light", "high-contrast"
DEFAULT_THEME = DARK

ROLES = (
    "text",
    "muted",
    "faint",
    "ok",
    "warn",
    "bad",
    "info",
    "step",
    "accent",
    "bar-empty",
    "mark",
    "weights",
    "kv",
    "mamba",
    "draft",
    "graphs",
    "other",
    "procs",
    "used",
    "series-1",
    "series-2",
    "series-3",
)
"""What the widgets colour. `muted` labels, `faint` what is less than a label (absent figures, axes),
`ok` / `warn` / `bad` verdicts, `info` neutral highlights (systemd lines, sparklines), `step` the
server's start-up steps in the feed, `bar-empty` the
free part of a bar, `mark` the gauge's marks, the memory segments, and the probe chart's earlier
curves (`series-*`; the current curve is `ok`)."""

THEMES: dict[str, Theme] = {
    # Textual's own dark theme with the colours the console drew before themes (Rich's 256 colours).
    DARK: Theme(
        name=DARK,
        primary="#0178D4",
        secondary="#004578",
        accent="#ffa62b",
        warning="#ffa62b",
        error="#ba3c5b",
        success="#4EBF71",
        foreground="#e0e0e0",
        dark=True,
        variables={
            "k26-muted": "#9e9e9e",
            "k26-faint": "#808080",
            "k26-ok": "#00d700",
            "k26-warn": "#d7d700",
            "k26-bad": "#ff3b3b",
            "k26-info": "#5fafd7",
            "k26-step": "#5f87ff",
            "k26-bar-empty": "#303030",
            "k26-mark": "#4e4e4e",
            "k26-weights": "#005fff",
            "k26-kv": "#00d700",
            "k26-mamba": "#00afaf",
            "k26-draft": "#d75f87",
            "k26-graphs": "#af87d7",
            "k26-other": "#d78700",
            "k26-procs": "#d70000",
            "k26-used": "#5f87af",
            "k26-series-1": "#5fd7ff",
            "k26-series-2": "#d78700",
            "k26-series-3": "#af87d7",
        },
    ),
    # Dark text on a pale background: the verdict colours darkened until they read on it.
    LIGHT: Theme(
        name=LIGHT,
        primary="#004578",
        secondary="#0178D4",
        accent="#b35c00",
        warning="#a86b00",
        error="#b3261e",
        success="#1e7d32",
        foreground="#1c1c1c",
        background="#f5f5f5",
        surface="#ececec",
        panel="#dde3ea",
        dark=False,
        variables={
            "footer-key-foreground": "#0178D4",
            "k26-muted": "#5c5c5c",
            "k26-faint": "#7a7a7a",
            "k26-ok": "#1e7d32",
            "k26-warn": "#8a5a00",
            "k26-bad": "#b3261e",
            "k26-info": "#0b62a8",
            "k26-step": "#1f4fa8",
            "k26-bar-empty": "#d6d6d6",
            "k26-mark": "#9e9e9e",
            "k26-weights": "#1f5fbf",
            "k26-kv": "#2e8b3a",
            "k26-mamba": "#00838f",
            "k26-draft": "#ad1457",
            "k26-graphs": "#7b3fa8",
            "k26-other": "#d9730d",
            "k26-procs": "#b3261e",
            "k26-used": "#4f6f8f",
            "k26-series-1": "#0b7fa8",
            "k26-series-2": "#d9730d",
            "k26-series-3": "#7b3fa8",
        },
    ),
    # Pure colours on black, text white and labels near-white: nothing is told apart by a shade of grey.
    HIGH_CONTRAST: Theme(
        name=HIGH_CONTRAST,
        primary="#00ffff",
        secondary="#ffffff",
        accent="#ffff00",
        warning="#ffff00",
        error="#ff6666",
        success="#00ff00",
        foreground="#ffffff",
        background="#000000",
        surface="#000000",
        panel="#1a1a1a",
        dark=True,
        luminosity_spread=0.3,
        text_alpha=1.0,
        variables={
            "border": "#ffffff",
            "k26-muted": "#e0e0e0",
            "k26-faint": "#c0c0c0",
            "k26-ok": "#00ff00",
            "k26-warn": "#ffff00",
            "k26-bad": "#ff6666",
            "k26-info": "#00ffff",
            "k26-step": "#66b3ff",
            "k26-bar-empty": "#3a3a3a",
            "k26-mark": "#ffffff",
            "k26-weights": "#3399ff",
            "k26-kv": "#00ff00",
            "k26-mamba": "#80ffff",
            "k26-draft": "#ff66cc",
            "k26-graphs": "#ff00ff",
            "k26-other": "#ffaa00",
            "k26-procs": "#ff0000",
            "k26-used": "#00ffff",
            "k26-series-1": "#00ffff",
            "k26-series-2": "#ffaa00",
            "k26-series-3": "#ff00ff",
        },
    ),
}

# A theme without `k26-*` variables: each role from the theme's standard colours.
_FALLBACK = {
    "text": "foreground",
    "muted": "foreground-muted",
    "faint": "foreground-disabled",
    "ok": "success",
    "warn": "warning",
    "bad": "error",
    "info": "text-primary",
    "step": "primary-lighten-2",
    "accent": "accent",
    "bar-empty": "surface-lighten-1",
    "mark": "panel-lighten-2",
    "weights": "primary",
    "kv": "success",
    "mamba": "success-darken-2",
    "draft": "error-lighten-2",
    "graphs": "secondary",
    "other": "warning",
    "procs": "error",
    "used": "primary-lighten-1",
    "series-1": "text-primary",
    "series-2": "text-warning",
    "series-3": "text-secondary",
}

BOLD = Style(bold=True)


@dataclass(frozen=True)
class Palette:
    """The roles of one theme as `#rrggbb` colours (opaque: blended onto the background)."""

    theme: str
    colours: dict[str, str]
    _styles: dict[tuple[str, bool], Style] = field(default_factory=dict, compare=False, repr=False)

    def colour(self, role: str) -> str:
        return self.colours[role]

    def style(self, role: str, *, bold: bool = False) -> Style:
        """The role's foreground (cached: a repaint builds hundreds of spans)."""
        key = (role, bold)
        got = self._styles.get(key)
        if got is None:
            got = self._styles[key] = Style(color=self.colours[role], bold=bold or None)
        return got

    def badge(self, role: str) -> Style:
        """Bold text on the role's colour, black or white, whichever reads on it."""
        key = (f"badge:{role}", True)
        got = self._styles.get(key)
        if got is None:
            bg = Color.parse(self.colours[role])
            fg = "#000000" if bg.brightness >= 0.5 else "#ffffff"
            got = self._styles[key] = Style(bold=True, color=fg, bgcolor=bg.hex6)
        return got

    @property
    def muted(self) -> Style:
        return self.style("muted")

    @property
    def faint(self) -> Style:
        return self.style("faint")

    @property
    def ok(self) -> Style:
        return self.style("ok")

    @property
    def warn(self) -> Style:
        return self.style("warn")

    @property
    def bad(self) -> Style:
        return self.style("bad")

    @property
    def info(self) -> Style:
        return self.style("info")


def _theme_variables(theme: Theme) -> dict[str, str]:
    return {**theme.to_color_system().generate(), **theme.variables}


def palette_for(theme: Theme) -> Palette:
    variables = _theme_variables(theme)
    background = Color.parse(variables["background"])
    colours: dict[str, str] = {}
    for role in ROLES:
        value = variables.get(f"k26-{role}") or variables[_FALLBACK[role]]
        # `#e0e0e099`: a translucent colour is drawn over the background, so it is given blended.
        colours[role] = (background + Color.parse(value)).hex6
    return Palette(theme.name, colours)


def role_variables(theme: Theme) -> dict[str, str]:
    """Every role as its `k26-<role>` variable, for a theme that names none (one of Textual's own): what
    `$k26-bad` in content and stylesheets reads there (the app's `get_theme_variable_defaults`)."""
    found = palette_for(theme)
    return {f"k26-{role}": found.colour(role) for role in ROLES}


_BY_NAME: dict[str, Palette] = {}
"""Palettes by theme name (a theme is registered once under its name; reading one costs ~1 ms)."""


def palette() -> Palette:
    """The palette of the running app's theme (the dark one outside an app: a unit test, the CLI).

    The formatting functions that use it run inside the app's render and message handling, where
    Textual's `active_app` is set; reading it there saves passing the theme through every function.
    """
    app = active_app.get(None)
    name = app.theme if app is not None else DEFAULT_THEME
    got = _BY_NAME.get(name)
    if got is None:
        theme = app.current_theme if app is not None else THEMES[DEFAULT_THEME]
        got = _BY_NAME[name] = palette_for(theme)
    return got


def theme_names() -> list[str]:
    return list(THEMES)


def check_theme(name: str) -> str:
    """The theme's name, or ValueError with the names there are."""
    if name not in THEMES:
        raise ValueError(f"unknown theme {name!r}: choose one of {', '.join(THEMES)}")
    return name


_OWN_VARIABLES = {"text": "foreground", "accent": "accent"}
"""The roles every theme has as a variable of its own (the others are `k26-<role>`)."""


def role_variable(role: str) -> str:
    """The theme variable that holds `role` (`k26-bad`, `foreground`)."""
    if role not in ROLES:
        raise ValueError(f"{role!r} is no role of the palette")
    return _OWN_VARIABLES.get(role, f"k26-{role}")


def role_style(role: str, *, bold: bool = False) -> str:
    """A Textual style naming the role's variable (`bold $k26-bad`), for `Content`: the colour is read
    when the content is drawn, so it is the theme in force then. (In a theme without `k26-*` variables,
    one of Textual's own, such text is drawn in the foreground colour.)"""
    return f"{'bold ' if bold else ''}${role_variable(role)}"


_MARKUP_TAG = re.compile(r"(?<!\\)\[([^\[\]]*)\]")
_THEME_WORD = re.compile(r"(?<![\w.-])theme\.([a-z0-9-]+)")


def themed_content(markup: str) -> Content:
    """Help markup (`[b]`, `[bold theme.bad]errors[/]`) as Textual content whose roles are the theme's
    variables (`$k26-bad`): help screens are kept, and a help drawn this way is in whatever theme is in
    force when it is shown. The markup is ours (help texts), never text from outside."""

    def tag(match: re.Match[str]) -> str:
        inside = _THEME_WORD.sub(lambda r: f"${role_variable(r.group(1))}", match.group(1))
        return f"[{inside}]"

    return Content.from_markup(_MARKUP_TAG.sub(tag, markup))


@runtime_checkable
class Restyles(Protocol):
    """A widget (or screen) that keeps text built in the theme's colours and builds it again when told.
    `restyle()` repaints the node itself; the walk reaches every node, so it need not walk its children."""

    def restyle(self) -> None: ...


def restyle_screens(screens: Iterable[DOMNode]) -> int:
    """`restyle()` on every `Restyles` node of `screens` (the screens themselves included), each once,
    parents before children; how many were restyled."""
    seen: set[int] = set()
    for screen in screens:
        for node in screen.walk_children(with_self=True):
            if isinstance(node, Restyles) and id(node) not in seen:
                seen.add(id(node))
                node.restyle()
    return len(seen)
