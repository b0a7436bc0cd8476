"""Modal screens: help for the focused panel, and the confirmation before anything changes the host."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

KEYS = """\
[b]Keys[/b]
  q            quit                       F1      this help
  ctrl+p       command palette            tab     next panel
  /            filter the event feed (regex; !regex inverts; Esc clears)
  f            follow the feed's tail     a       acknowledge pinned errors
  z            fold / unfold earlier boots"""

KEYS_CHANGING = """
  r            restart the service (asks first)"""

READ_ONLY_NOTE = """
[b]Read-only[/b]: actions that change the host (restart) are hidden and refused."""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]  # noqa: RUF012

    def __init__(self, panel_help: str, *, read_only: bool) -> None:
        super().__init__()
        self.panel_help = panel_help
        self.read_only = read_only

    def compose(self) -> ComposeResult:
        body = self.panel_help or "[b]k26-console[/b] — move the focus to a panel (tab) for help on it."
        keys = KEYS + ("" if self.read_only else KEYS_CHANGING) + (READ_ONLY_NOTE if self.read_only else "")
        with VerticalScroll(id="help-box"):
            yield Static(Text.from_markup(body), id="help-panel")
            yield Static(Text.from_markup(keys), id="help-keys")
            yield Static(Text("Esc closes", "grey62"), id="help-close")

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [  # noqa: RUF012 - Textual reads it as a class attribute
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str, detail: str = "") -> None:
        super().__init__()
        self.question = question
        self.detail = detail

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Static(Text(self.question, "bold"), id="confirm-question")
            if self.detail:
                yield Static(Text(self.detail, "grey70"), id="confirm-detail")
            with Horizontal(id="confirm-buttons"):
                yield Button("Yes (y)", id="yes", variant="warning")
                yield Button("No (n)", id="no", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
