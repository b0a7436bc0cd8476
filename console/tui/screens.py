"""Modal screens: help for the focused panel, and the confirmation before anything changes the host."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen, Screen
from textual.widget import Widget
from textual.widgets import Button, Input, Static

from console.tui.themed import outside_content
from console.tui.themes import role_style, themed_content
from console.tui.view import textual_text

KEYS = """\
[b]Keys[/b]
  q            quit                       F1      this help
  ctrl+p       command palette            tab     next panel
  /            filter the event feed (regex; !regex inverts; Esc clears)
  f            follow the feed's tail     a       acknowledge pinned errors
  z            fold / unfold earlier boots
  W            start / stop recording what the hosts send (REC badge; k26-console replay FILE)"""

KEYS_CHANGING = """
  p            profiles: edit, what-if, apply
  r            restart the service (asks first, then followed and verified)
  R            roll back the last apply (asks first)
  P            probe: a synthetic long-context request, decode tok/s by depth
  Apply, restart and roll back take the host's lock: while another console holds it they are
  refused (the bar under the header says who and for what); a stale lock is broken from
  ctrl+p → "Break the stale lock", after a confirmation, and the break is recorded."""

KEYS_READ_ONLY = """
  p            profiles: edit, what-if (saving is local; applying is refused)
  P            probe: a synthetic long-context request, decode tok/s by depth"""

READ_ONLY_NOTE = """
[b]Read-only[/b]: actions that change the host (apply, restart, roll back) are hidden and refused."""

KEYS_FLEET = """
  o            the fleet overview (Enter or a click on a row opens that host's dashboard)"""

PROFILE_KEYS = """\
[b]Keys[/b]
  Esc          back to the dashboard          F1      this help
  ↑ ↓ Enter    pick a profile in the list: it opens, the focus stays in the list
               (tab edits it; unsaved edits are kept per profile)
  ctrl+s       save the profile shown: asks first, with the edit line by line
               (user profile dir, atomic; a bad TOML is never saved)
  ctrl+p       command palette                tab     next pane"""

PROFILE_KEYS_CHANGING = """
  ctrl+r       apply the profile shown (unsaved edits: saved first, after asking): confirm
               its diff and the prediction, then restart and verify"""


def help_keys(read_only: bool, *, profiles: bool = False, fleet: bool = False) -> str:
    """The keys F1 lists: the profiles screen's, else the dashboard's (with `o` when there is a fleet
    overview, two hosts or more)."""
    if profiles:
        return (
            PROFILE_KEYS
            + ("" if read_only else PROFILE_KEYS_CHANGING)
            + (READ_ONLY_NOTE if read_only else "")
        )
    changing = KEYS_READ_ONLY if read_only else KEYS_CHANGING
    return KEYS + (KEYS_FLEET if fleet else "") + changing + (READ_ONLY_NOTE if read_only else "")


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]  # noqa: RUF012

    def __init__(self, panel_help: str, *, read_only: bool, keys: str | None = None) -> None:
        super().__init__()
        self.panel_help = panel_help
        self.read_only = read_only
        self.keys = keys if keys is not None else help_keys(read_only)

    def compose(self) -> ComposeResult:
        body = self.panel_help or "[b]k26-console[/b] — move the focus to a panel (tab) for help on it."
        keys = self.keys
        # Content naming the theme's variables: a help screen is kept installed, and it is drawn in the
        # theme in force whenever it is shown.
        with VerticalScroll(id="help-box"):
            yield Static(themed_content(body), id="help-panel")
            yield Static(themed_content(keys), id="help-keys")
            yield Static(Content.styled("Esc closes", role_style("muted")), id="help-close")

    def on_mount(self) -> None:
        # Focused, so that the arrows and PgUp/PgDn reach what a short terminal cuts off.
        box = self.query_one("#help-box", VerticalScroll)
        box.border_subtitle = "↑↓ PgUp PgDn scroll · Esc closes"
        box.focus()

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
            # Through textual_text, drawn safe: the question and the detail quote the host (a lock's holder
            # and intent, a rollback's target and diff).
            yield Static(textual_text(Text(self.question, "bold")), id="confirm-question")
            if self.detail:
                yield Static(outside_content(self.detail, "muted"), id="confirm-detail")
            with Horizontal(id="confirm-buttons"):
                yield Button("Yes (y)", id="yes", variant="warning")
                yield Button("No (n)", id="no", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class ApplyChoice(StrEnum):
    APPLY = "apply"
    FORCE = "force"


class ApplyConfirmScreen(ModalScreen[ApplyChoice | None]):
    """Before a profile is applied: the diff against the running ExecStart and the predicted outcome.

    A profile the planner (or validation) refuses cannot be applied with `y`; `F` forces it, which is
    how an operator tries it anyway, knowing that the timeline may end in a failure and a rollback.
    Where the command line asks for the profile's name to be typed (a refused profile, a profile that
    changes the program the unit runs), so does this: `name_gate` is that name, and neither `y` nor `F`
    nor a button applies until it is typed (Enter in the field then answers)."""

    BINDINGS = [  # noqa: RUF012 - Textual reads it as a class attribute
        Binding("y", "answer('apply')", "Apply"),
        Binding("F", "answer('force')", "Force"),
        Binding("n,escape", "answer(None)", "Cancel"),
    ]

    def __init__(
        self,
        question: str,
        *,
        ok: bool,
        diff: list[str],
        prediction: Content,
        errors: list[str],
        warnings: list[str],
        name_gate: str | None = None,
        note: str | None = None,
    ) -> None:
        super().__init__()
        self.name_gate = name_gate
        self.note = note
        self.question = question
        self.ok = ok
        self.diff = diff
        self.prediction = prediction
        self.errors = errors
        self.warnings = warnings

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="apply-box"):
            yield Static(textual_text(Text(self.question, "bold")), id="apply-question")
            yield Static(diff_text(self.diff), id="apply-diff")
            yield Static(self.prediction, id="apply-prediction")
            notes = [
                *(outside_content(f"✘ {e}", "bad", bold=True) for e in self.errors),
                *(outside_content(f"⚠ {w}", "warn") for w in self.warnings),
                *([outside_content(self.note, "muted")] if self.note else []),
            ]
            if notes:
                yield Static(Content("\n").join(notes), id="apply-notes")
            if self.name_gate is not None:
                yield Static(
                    textual_text(
                        Text(f"Type {self.name_gate} to {'apply' if self.ok else 'force'} it:", "bold")
                    ),
                    id="apply-gate-label",
                )
                yield Input(placeholder=self.name_gate, id="apply-gate")
            with Horizontal(id="confirm-buttons"):
                if self.ok:
                    yield Button("Apply (y)", id="apply", variant="warning")
                else:
                    yield Button("Force (F)", id="force", variant="error")
                yield Button("Cancel (n)", id="cancel", variant="primary")

    def on_mount(self) -> None:
        if self.name_gate is not None:
            self.query_one("#apply-gate", Input).focus()
        else:
            self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_answer(event.button.id if event.button.id in ("apply", "force") else None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_answer("apply" if self.ok else "force")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # While the name is being typed, y, F and n are letters of it, not answers (Esc still cancels).
        if action == "answer" and parameters and parameters[0] is not None and self.name_gate is not None:
            return isinstance(self.focused, Input) is False
        return True

    def action_answer(self, choice: str | None) -> None:
        if choice == "apply" and not self.ok:
            self.notify("the profile is refused as it stands; F forces it.", severity="warning")
            return
        if choice is not None and self.name_gate is not None:
            typed = self.query_one("#apply-gate", Input).value.strip()
            if typed != self.name_gate:
                self.notify(f"type {self.name_gate} exactly to go on; Esc cancels.", severity="warning")
                self.query_one("#apply-gate", Input).focus()
                return
        self.dismiss(ApplyChoice(choice) if choice else None)


DIFF_ROLES = {"+": "ok", "-": "bad", "~": "warn"}


def diff_text(lines: list[str]) -> Content:
    """Diff lines coloured as a diff reads: + green, - red, ~ yellow."""
    if not lines:
        return outside_content("no change against the running ExecStart", "muted")
    return Content("\n").join(outside_content(line, DIFF_ROLES.get(line[:1])) for line in lines)


def prediction_text(preview: Any, target: int) -> Content:
    """The planner's verdict as the confirmation shows it."""
    head = Content.styled("predicted: ", "bold")
    pool = preview.predicted_pool_tokens
    if pool is None:
        return head + Content.styled(
            "no prediction (the host's journal has not shown a pool to calibrate on)", role_style("muted")
        )
    parts = [
        head,
        Content.styled(
            f"pool {pool:,} tokens", role_style("ok") if pool >= target else role_style("bad", bold=True)
        ),
        Content(f" {'≥' if pool >= target else '<'} target {target:,}"),
    ]
    if preview.headroom_gib is not None:
        parts.append(Content(f", headroom {preview.headroom_gib:.2f} GiB"))
    if preview.fits is True:
        parts.append(Content.styled("  ✔ fits", role_style("ok", bold=True)))
    elif preview.fits is False:
        parts.append(Content.styled("  ✘ does not fit", role_style("bad", bold=True)))
    return Content("").join(parts)


def focused_help(node: Widget | None) -> str:
    """The HELP text of the focused widget or the nearest of its parents that has one."""
    while node is not None:
        text = getattr(node, "HELP", "") or ""
        if text:
            return text
        parent = node.parent
        node = parent if isinstance(parent, Widget) else None
    return ""


class HelpScreens:
    """Each help text is built once and kept installed: composing and styling a new screen on every F1 was
    most of the key's cost under load."""

    def __init__(self, read_only: bool) -> None:
        self.read_only = read_only
        self._names: dict[tuple[str, str], str] = {}

    def screens(self, app: App[Any]) -> list[Screen[Any]]:
        """The help screens installed so far (kept while off the stack)."""
        return [app.get_screen(name) for name in self._names.values()]

    def name_for(self, app: App[Any], text: str, keys: str) -> str:
        name = self._names.get((text, keys))
        if name is None:
            name = f"help-{len(self._names)}"
            app.install_screen(HelpScreen(text, read_only=self.read_only, keys=keys), name)
            self._names[(text, keys)] = name
        return name
