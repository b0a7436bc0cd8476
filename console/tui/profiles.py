"""The profiles screen: the saved flag profiles per context target, an editor for the TOML with
validation as you type, a live what-if from the capacity model, the diff against the running
`ExecStart`, saving (atomic, comments kept) and, from here, apply.

Nothing typed is lost: each profile keeps its unsaved text while another one is shown, and a text that
is not a readable profile is never written over the good file.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Button, OptionList, Static, TextArea
from textual.widgets.option_list import Option

from console.core.apply import PlannerVerdict
from console.core.flags import FlagList
from console.core.profiles import ProfileError, parse_profile
from console.core.state import Boot
from console.sources.profile_store import ProfileEntry, ProfileStore, shipped_profile_dir
from console.tui.footer import KeyFooter
from console.tui.messages import ApplyRequested
from console.tui.profile_check import (
    EDIT_LINES_SHOWN,
    EditDiff,
    ProfileCheck,
    check_profile_text,
    edit_diff,
    named_in,
)
from console.tui.screens import ConfirmScreen, diff_text
from console.tui.themed import Painted, outside_content
from console.tui.themes import palette, role_style
from console.tui.view import fmt_tokens, outside_text, textual_text

CHECK_DELAY_S = 0.25
"""Validation and the what-if run this long after the last keystroke, not on every one."""


@dataclass(frozen=True)
class HostView:
    """What the screen needs of the host, read when it checks: boots to calibrate on, the model when
    hosts.toml names it, and the running argv for the diff (None: not known yet)."""

    boots: Sequence[Boot] = ()
    model: str | None = None
    running_argv: Sequence[str] | None = None
    host_flags: FlagList | None = None
    """The flag list of the SGLang the host runs, once the console has learned it."""


class ProfileList(OptionList):
    HELP = """\
[b]Profiles[/b] — the saved flag profiles, grouped by the context they are for
(target_context). [b]user[/b] profiles live in your config directory and shadow the
[b]shipped[/b] examples of the same name; saving a shipped one writes a user copy.
● marks a profile with unsaved edits (kept while you look at another one).
↑ ↓ (or a click) open a profile in the editor; the focus stays here, so the next
↑ Enter picks another profile rather than typing into this one: tab moves to the
editor. The profile shown is the one ctrl+s saves and ctrl+r applies."""


class ProfileEditor(TextArea):
    HELP = """\
[b]Profile editor[/b] — the profile's TOML as saved: comments and order are kept.
[b]\\[flags][/b] holds SGLang's flags as on the command line, without the dashes:
true is a bare flag, false leaves it out, a list gives one word each.
After a short pause in typing, the pane on the right checks the text against
SGLang's own flag list for the profile's sglang_version (unknown flags, wrong
types, choices, abbreviations), predicts the KV pool with the capacity model
calibrated on this host's boots, and shows what changes against the running
ExecStart. Changing [b]name[/b] saves under the new name (a new user profile)."""


class CheckPane(VerticalScroll):
    HELP = """\
[b]Checks[/b] — [b]validation[/b]: errors (✘) stop an apply, warnings (⚠) do not;
each names the flag.
[b]what-if[/b]: the pool SGLang would allocate with this profile's
mem-fraction-static, from this host's own boots (exact when a boot showed the
memory before and after the weights), against the profile's target_context, and
the headroom left for CUDA graphs and activations (floor 3 GiB). It is the very
check apply makes before it touches the host.
[b]diff[/b]: + added, - removed, ~ changed, against the unit's running ExecStart
(the unit keeps its own interpreter, --host and --port)."""


class ProfilesScreen(Screen[None]):
    BINDINGS = [  # noqa: RUF012 - Textual reads it as a class attribute
        Binding("escape", "close", "Back", priority=True),
        Binding("ctrl+s", "save", "Save"),
        Binding("ctrl+r", "apply", "Apply"),
    ]

    def __init__(
        self,
        *,
        host: str,
        store: ProfileStore,
        host_view: Callable[[], HostView],
        read_only: bool,
        select: str | None = None,
        check_delay_s: float = CHECK_DELAY_S,
    ) -> None:
        """Apply (ctrl+r) posts `ApplyRequested` with a saved, valid profile's name; the app confirms
        and runs it."""
        super().__init__()
        self.host = host
        self.store = store
        self.host_view = host_view
        self.read_only = read_only
        self.check_delay_s = check_delay_s
        self.entries: list[ProfileEntry] = []
        self.current: str | None = select
        self.saved: dict[str, str] = {}
        """The text on disk of each profile opened, to tell an edit from a reload."""
        self.buffers: dict[str, str] = {}
        """Unsaved texts of profiles not shown right now."""
        self.check: ProfileCheck | None = None
        self._timer: Timer | None = None
        self._checked_text: str | None = None

    # ---- layout --------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Painted(id="profiles-title")
        with Horizontal(id="profiles-body"):
            yield ProfileList(id="profile-list")
            with Vertical(id="profile-editor-box"):
                yield ProfileEditor(
                    "", id="profile-editor", show_line_numbers=True, tab_behavior="focus", soft_wrap=False
                )
                yield Static(id="profile-status")
            with CheckPane(id="profile-side"):
                yield Painted(id="profile-issues")
                yield Painted(id="profile-whatif")
                yield Static(id="profile-diff")
        yield KeyFooter()

    def _title(self) -> None:
        self.query_one("#profiles-title", Painted).paint(self._title_text)

    def _title_text(self) -> Text:
        """The title names the profile shown: the one ctrl+s saves and ctrl+r applies."""
        title = Text()
        title.append(" Profiles ", "bold reverse")
        title.append(f"  host {self.host}", "bold")
        if self.current is not None:
            title.append("  profile ", palette().muted)
            title.append(self.current, "bold")
            if self._dirty(self.current):
                title.append(" ● unsaved", palette().style("warn", bold=True))
        if self.read_only:
            title.append("  READ-ONLY: applying is refused; saving is local", palette().badge("step"))
        return title

    def on_mount(self) -> None:
        self._title()
        self.query_one("#profile-list").border_title = "profiles"
        self.query_one("#profile-side").border_title = "checks"
        self.reload_list()
        names = [e.name for e in self.entries]
        if self.current not in names:
            self.current = names[0] if names else None
        if self.current is not None:
            self.open_profile(self.current)
            self.reload_list()  # the list's cursor on the profile shown
        # Picking comes first: in the editor, the arrows and Enter that pick a profile edit this one.
        self.query_one(ProfileList).focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action == "apply" and self.read_only)

    # ---- the list ------------------------------------------------------------------------------

    def reload_list(self) -> None:
        self.entries = self.store.entries()
        targets: dict[str, int | None] = {}
        for e in self.entries:
            try:
                targets[e.name] = self.store.load(e.name).target_context
            except ProfileError:
                targets[e.name] = None
        options: list[Option | None] = []
        groups = [*sorted({t for t in targets.values() if t is not None}), None]
        for target in groups:
            members = [e for e in self.entries if targets[e.name] == target]
            if not members:
                continue
            head = f"{target:,} tokens" if target is not None else "unreadable"
            options.append(Option(Text(head, "bold"), disabled=True))
            for e in members:
                name = outside_content(e.name)
                prompt = Content.assemble(
                    ("● " if self._dirty(e.name) else "  ", role_style("warn")),
                    name.stylize("bold") if e.name == self.current else name,
                    (f"  {self.origin(e)}", role_style("faint")),
                )
                options.append(Option(prompt, id=e.name))
        plist = self.query_one(ProfileList)
        plist.clear_options()
        plist.add_options(options)
        if self.current is not None:
            with contextlib.suppress(Exception):
                plist.highlighted = plist.get_option_index(self.current)

    def origin(self, entry: ProfileEntry) -> str:
        """`user` for the directory saves go to (the first), `shipped` for the examples."""
        if self.store.dirs and entry.path.parent == self.store.dirs[0]:
            return "user"
        shipped = shipped_profile_dir()
        return "shipped" if shipped is not None and entry.path.parent == shipped else entry.origin

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        # The focus stays in the list: Enter once moved it into the editor, where the operator's next
        # "↑ Enter" (meant to pick another profile) typed a blank line into this one (issue 34).
        self._pick(event.option.id)

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        # The list's cursor is the profile shown: a highlight that opened nothing left ctx-256k in the
        # editor (and under ctrl+r) while the list pointed at ctx-200k.
        if event.option_list.has_focus:
            self._pick(event.option.id)

    def _pick(self, name: str | None) -> None:
        if name and name != self.current:
            self.stash()
            self.open_profile(name)
            self.reload_list()

    # ---- the editor ----------------------------------------------------------------------------

    @property
    def editor(self) -> ProfileEditor:
        return self.query_one(ProfileEditor)

    def _dirty(self, name: str) -> bool:
        text = self.editor.text if name == self.current and self.is_mounted else self.buffers.get(name)
        return text is not None and name in self.saved and text != self.saved[name]

    def stash(self) -> None:
        """Keep the shown profile's unsaved text while another one is opened."""
        if self.current is None:
            return
        text = self.editor.text
        if text != self.saved.get(self.current):
            self.buffers[self.current] = text
        else:
            self.buffers.pop(self.current, None)

    def open_profile(self, name: str) -> None:
        try:
            entry = self.store.find(name)
            disk = self.store.read_text(entry)
        except ProfileError as exc:
            self.notify(str(exc), severity="error")
            return
        self.current = name
        self.saved[name] = disk
        self.editor.load_text(self.buffers.pop(name, disk))
        # Texts: a string border title is read as markup, and a file may be named [x].toml.
        self.editor.border_title = outside_text(f"{name}.toml")
        self.editor.border_subtitle = outside_text(self.origin(entry))
        self.run_check()

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        # Loading a profile posts Changed too, after the check that followed the load.
        if self.check is not None and self.editor.text == self._checked_text:
            return
        self._status()
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_timer(self.check_delay_s, self.run_check)

    def _status(self, note: Content | None = None) -> None:
        self._title()
        parts = []
        if self.current is not None and self._dirty(self.current):
            parts.append(Content.styled("● unsaved", role_style("warn", bold=True)))
        elif self.current is not None:
            parts.append(Content.styled("saved", role_style("ok")))
        if note is not None:
            parts.append(note)
        self.query_one("#profile-status", Static).update(Content("  ").join(parts))

    # ---- checks --------------------------------------------------------------------------------

    @property
    def pending_check(self) -> bool:
        """An edit waits for the debounce delay before it is checked."""
        return self._timer is not None

    def run_check(self) -> ProfileCheck | None:
        """Validate the text, predict its pool, diff it; draw the results. Also called by the tests."""
        self._timer = None
        if self.current is None:
            return None
        view = self.host_view()
        self._checked_text = self.editor.text
        self.check = check_profile_text(
            self._checked_text,
            self.current,
            boots=view.boots,
            running_argv=view.running_argv,
            model=view.model,
            host_flags=view.host_flags,
        )
        check = self.check
        self.query_one("#profile-issues", Painted).paint(lambda: issues_text(check))
        self.query_one("#profile-whatif", Painted).paint(lambda: whatif_text(check.whatif))
        diff = [Content.styled("diff against the running ExecStart", "bold")]
        if check.diff:
            diff.append(diff_text(list(check.diff)))
        if check.diff_note:
            diff.append(outside_content(check.diff_note, "muted"))
        # All bold, as it was drawn (the head's style ran on under the lines).
        self.query_one("#profile-diff", Static).update(Content("\n").join(diff).stylize_before("bold"))
        self._status()
        return self.check

    # ---- actions -------------------------------------------------------------------------------

    def action_close(self) -> None:
        self.stash()
        unsaved = [n for n in self.saved if self._dirty(n)]
        if unsaved:
            self.notify(
                f"unsaved edits kept for this session: {', '.join(unsaved)} (ctrl+s in the editor saves).",
                timeout=6,
            )
        self.dismiss(None)

    def save(self) -> str | None:
        """Save the editor's text; the name it was saved under, or None (the file is left as it was)."""
        if self.current is None:
            return None
        text = self.editor.text
        name = named_in(text, self.current)
        try:
            path = self.store.save_text(name, text)
        except ProfileError as exc:
            self.notify(f"not saved: {exc}", severity="error", timeout=10)
            self._status(outside_content(f"not saved: {exc}", "bad", bold=True))
            return None
        except OSError as exc:
            self.notify(f"not saved: {exc.strerror or exc}.", severity="error", timeout=10)
            return None
        if name != self.current:
            # A new name is a new profile; the one it started from keeps its file (and its own edits).
            self.buffers.pop(self.current, None)
            self.saved[self.current] = self.saved.get(self.current, "")
            self.current = name
        self.saved[name] = text
        self.buffers.pop(name, None)
        self.editor.border_title = outside_text(f"{name}.toml")
        self.editor.border_subtitle = "user"
        self.reload_list()
        self.run_check()
        errors = len(self.check.errors) if self.check else 0
        note = outside_content(f"saved to {path}", "ok")
        if errors:
            note += Content.styled(f" with {errors} error(s): applying it is refused", role_style("warn"))
        self._status(note)
        self.notify(f"saved {name} to {path}", timeout=4)
        return name

    def edit(self) -> EditDiff | None:
        """What saving now would change in the shown profile's file."""
        if self.current is None:
            return None
        return edit_diff(self.saved.get(self.current, ""), self.editor.text, self.current)

    def _ask_to_save(
        self, question: str, edit: EditDiff, then: Callable[[str], object] | None = None
    ) -> None:
        """Ask before writing (the profile, the file, the edit line by line); `then(name)` once saved."""
        path = self.store.dirs[0] / f"{edit.name}.toml" if self.store.dirs else None
        shipped = self.current is not None and any(
            e.name == self.current and self.origin(e) == "shipped" for e in self.entries
        )

        def answered(yes: bool | None) -> None:
            if not yes:
                self._status(Content.styled("not saved: the edit stays in the editor", role_style("muted")))
                return
            name = self.save()
            if name is not None and then is not None:
                then(name)

        screen = SaveConfirmScreen(question, edit, where=str(path) if path else None, shipped=shipped)
        self.app.push_screen(screen, answered)

    def action_save(self) -> None:
        edit = self.edit()
        if edit is None:
            return
        if edit.empty:
            self.notify(f"{edit.name} is as saved: nothing to write.", timeout=4)
            return
        try:
            parse_profile(self.editor.text, name=edit.name)
        except ProfileError:
            self.save()  # refused, with the reason: nothing to ask about
            return
        self._ask_to_save(f"Save {edit.name}?", edit)

    def action_apply(self) -> None:
        if self.read_only:
            self.notify("read-only: applying a profile is refused.", severity="warning")
            return
        check = self.run_check()
        if check is None:
            return
        if not check.ok:
            first = check.errors[0] if check.errors else None
            why = f"{first.where}: {first.message}" if first else "the profile cannot be read"
            self.notify(f"not applied — fix this first: {why}", severity="error", timeout=10)
            return
        edit = self.edit()
        if edit is None:
            return
        if not edit.empty:
            # What is applied is what is saved: the edit is written first, and only once the operator
            # has seen it (a stray Enter once reached the host as a "saved" ctx-256k, unasked).
            self._ask_to_save(
                f"Save the edits to {edit.name}, then apply {edit.name} to {self.host}?",
                edit,
                then=lambda name: self.post_message(ApplyRequested(self.host, name)),
            )
            return
        self.post_message(ApplyRequested(self.host, edit.name))


class SaveConfirmScreen(ConfirmScreen):
    """Before the editor's text is written: which profile, to which file, and the edit line by line,
    with whether it changes the profile at all (a blank line does not)."""

    def __init__(self, question: str, edit: EditDiff, *, where: str | None, shipped: bool) -> None:
        super().__init__(question)
        self.edit = edit
        self.where = where
        self.shipped = shipped

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Static(textual_text(Text(self.question, "bold")), id="confirm-question")
            yield Static(edit_text(self.edit, self.where, self.shipped), id="save-edit")
            with Horizontal(id="confirm-buttons"):
                yield Button("Save (y)", id="yes", variant="warning")
                yield Button("Cancel (n)", id="no", variant="primary")


def edit_text(edit: EditDiff, where: str | None, shipped: bool) -> Content:
    out = Content("")
    if where is not None:
        out = Content.styled("to ", role_style("muted")) + outside_content(where)
        if shipped:
            shipped_name = edit.renamed_from or edit.name
            out += outside_content(f"\n(a user copy: the shipped {shipped_name} stays as it is)", "muted")
    if edit.renamed_from is not None:
        out += outside_content(
            f"\nname = {edit.name!r}: a new profile; {edit.renamed_from} keeps its file", "warn"
        )
    for line in edit.lines[:EDIT_LINES_SHOWN]:
        sign = line.split(": ", 1)[1][:1] if ": " in line else ""
        out += outside_content("\n" + line, "ok" if sign == "+" else "bad" if sign == "-" else None)
    if len(edit.lines) > EDIT_LINES_SHOWN:
        out += Content.styled(
            f"\n… {len(edit.lines) - EDIT_LINES_SHOWN} more changed line(s)", role_style("muted")
        )
    if edit.profile_changed is False:
        out += Content.styled(
            "\nthe profile itself does not change: no flag, target or version differs (only the text)",
            role_style("warn"),
        )
    return out


# ---- rendering of the checks -----------------------------------------------------------------------


def issues_text(check: ProfileCheck) -> Text:
    out = Text()
    out.append("validation", "bold")
    if check.profile is not None:
        out.append(f"  SGLang {check.profile.sglang_version}", palette().muted)
    out.append("\n")
    if not check.issues:
        out.append("✔ the flags are valid", palette().ok)
        return out
    for i, issue in enumerate(check.issues):
        mark, style = (
            ("✘", palette().style("bad", bold=True)) if issue.level == "error" else ("⚠", palette().warn)
        )
        out.append(("\n" if i else "") + f"{mark} ", style)
        where = issue.where.removeprefix("flags.")
        if issue.where != "toml":
            out.append(f"{where}: ", "bold")
        out.append(issue.message, palette().bad if issue.level == "error" else palette().warn)
    return out


def whatif_text(w: PlannerVerdict | None) -> RenderableType:
    head = Text("what-if", "bold")
    if w is None:
        return Group(head, Text("no prediction until the profile reads", palette().muted))
    lines: list[RenderableType] = [head]
    row = Text()
    row.append("pool ", palette().muted)
    if w.predicted_pool_tokens is not None:
        colour = (
            palette().ok if w.predicted_pool_tokens >= w.target_context else palette().style("bad", bold=True)
        )
        row.append(f"{w.predicted_pool_tokens:,} tokens", colour)
        row.append(f"  ({fmt_tokens(w.predicted_pool_tokens)})", palette().muted)
    else:
        row.append("no prediction", palette().muted)
    lines.append(row)
    lines.append(Text.assemble(("target ", palette().muted), f"{w.target_context:,} tokens"))
    if w.headroom_gib is not None:
        ok = w.headroom_gib >= w.min_headroom_gib
        lines.append(
            Text.assemble(
                ("headroom ", palette().muted),
                (f"{w.headroom_gib:.2f} GiB", palette().ok if ok else palette().style("bad", bold=True)),
                (f"  (floor {w.min_headroom_gib:g} GiB)", palette().muted),
            )
        )
    if w.mem_fraction_static is not None:
        lines.append(Text.assemble(("mem-fraction-static ", palette().muted), f"{w.mem_fraction_static:g}"))
    if w.fits is True:
        lines.append(Text("✔ fits", palette().style("ok", bold=True)))
    elif w.fits is False:
        lines.append(Text("✘ does not fit", palette().style("bad", bold=True)))
    elif not w.checked:
        lines.append(Text("not checked", palette().warn))
    for why in w.reasons:
        lines.append(Text(f"  {why}", palette().bad if w.fits is False else palette().muted))
    if w.calibration != "none":
        lines.append(Text(f"calibration: {w.calibration} on this host's boots ({w.model})", palette().faint))
    return Group(*lines)
