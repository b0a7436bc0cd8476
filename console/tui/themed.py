"""Text that follows the theme (console/tui/themes.py says how a theme change repaints).

- `outside_content`: text that may quote the host, as Textual content in a role's colour: the role is the
  theme's variable, read when the text is drawn.
- `Painted`: a `Static` whose Rich text is made by a function. A `Static` keeps the Rich text it was
  given, colours and all, and after a theme change still draws the old theme's colours; a `Painted` keeps
  the function that made its text (which reads `palette()`), and is a `Restyles`: `restyle()` calls it
  again."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import RenderableType
from textual.content import Content
from textual.widgets import Static

from console.core.text import terminal_safe
from console.tui.themes import role_style
from console.tui.view import textual_text

Paint = Callable[[], RenderableType]


def outside_content(text: str, role: str | None = None, *, bold: bool = False) -> Content:
    """Text that may quote the host (a diff line, a lock's holder, a probe's diagnosis) as content in a
    role's colour: drawn safe (`terminal_safe`, line breaks kept), never read as markup."""
    safe = terminal_safe(text, keep_newlines=True)
    return Content.styled(safe, role_style(role, bold=bold)) if role else Content(safe)


class Painted(Static):
    def __init__(
        self, paint: Paint | None = None, *, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(id=id, classes=classes)
        self._paint = paint
        if paint is not None:
            self.update(textual_text(paint()))

    def paint(self, paint: Paint) -> None:
        """Draw what `paint()` makes, now and at each theme change."""
        self._paint = paint
        self.update(textual_text(paint()))

    def restyle(self) -> None:
        if self._paint is not None:
            self.update(textual_text(self._paint()))
