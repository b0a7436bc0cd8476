"""The command palette: switch host, theme, profiles, apply, restart, roll back, probe, filter, help.

Each command posts the same message a key would (console/tui/messages.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Protocol, runtime_checkable

from textual.command import Hit, Hits, Provider
from textual.content import Content
from textual.fuzzy import Matcher
from textual.message import Message

from console.core.pairing import Identity
from console.core.text import terminal_safe
from console.sources.profile_store import ProfileStore
from console.tui.dashboard import HostDashboard
from console.tui.host_entry import HostEntry
from console.tui.messages import (
    ApplyRequested,
    BreakRequested,
    HostChosen,
    ProbeRequested,
    ProfilesRequested,
    RestartRequested,
    RollbackRequested,
)
from console.tui.pairing import held_by_other, intent_phrase
from console.tui.themes import THEMES
from console.tui.view import markup_literal


@runtime_checkable
class PaletteSource(Protocol):
    """What the palette reads of the console."""

    entries: Sequence[HostEntry]
    read_only: bool
    me: Identity
    store: ProfileStore

    @property
    def active_dashboard(self) -> HostDashboard | None: ...

    def action_help(self) -> None: ...


class ConsoleCommands(Provider):
    def _post(self, message: Message) -> Callable[[], object]:
        return partial(self.app.post_message, message)

    def _set_theme(self, name: str) -> None:
        # `[ui] theme` in the config file is the lasting choice; this one lasts the session.
        self.app.theme = name

    def _commands(self) -> Iterable[tuple[str, Callable[[], object], str]]:
        app = self.app
        if not isinstance(app, PaletteSource):
            return
        for entry in app.entries:
            if len(app.entries) > 1:
                yield (
                    f"Switch to host {entry.name}",
                    self._post(HostChosen(entry.name)),
                    "show its dashboard",
                )
        for name in THEMES:
            yield (
                f"Theme: {name}",
                partial(self._set_theme, name),
                "in use"
                if name == self.app.theme
                else "for this session (the config file's ui.theme keeps one)",
            )
        dash = app.active_dashboard
        if dash is None:
            return
        host = dash.entry.name
        yield ("Profiles: edit, what-if, apply", self._post(ProfilesRequested(host)), "p")
        if not app.read_only:
            # While another console holds the lock the entries stay listed, marked refused: choosing
            # one says who holds it and for what.
            view = dash.pairing.view
            locked = (
                f"refused now: {view.lock.holder.who} is {intent_phrase(view.lock.intent)}"
                if view is not None and view.lock is not None and held_by_other(view, app.me)
                else None
            )
            if locked and view is not None and view.lock_stale:
                yield (
                    f"Break the stale lock on {host}",
                    self._post(BreakRequested(host)),
                    f"{view.lock.holder.who}'s console has gone quiet; asks first, then recorded"
                    if view.lock is not None
                    else "asks first",
                )
            for profile in app.store.entries():
                yield (
                    f"Apply profile {profile.name} to {host}",
                    self._post(ApplyRequested(host, profile.name)),
                    locked or "shows the diff and the prediction first",
                )
            yield (
                f"Restart the service on {host}",
                self._post(RestartRequested(host)),
                locked or "r; after a confirmation; followed on the timeline",
            )
            yield (
                f"Roll back the last apply on {host}",
                self._post(RollbackRequested(host)),
                locked or "R; restores the previous drop-in, restarts, verifies",
            )
        yield (
            f"Probe {host}: long-context decode speed",
            self._post(ProbeRequested(host)),
            "P; a synthetic request at chosen depths",
        )
        yield ("Filter the event feed", dash.feed.action_filter, "regex; ! inverts")
        yield ("Clear the event filter", partial(dash.feed.set_filter, ""), "show every line")
        yield ("Acknowledge errors", dash.feed.action_ack, "unpin this boot's errors")
        yield ("Toggle follow tail", dash.feed.action_follow, "keep the newest line in view")
        yield ("Fold / unfold earlier boots", dash.feed.action_fold, "show earlier boots' lines")
        yield ("Help for the focused panel", app.action_help, "F1")

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, callback, help_text in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(
                    score, _highlight(matcher, name), callback, text=name, help=markup_literal(help_text)
                )

    async def discover(self) -> Hits:
        for name, callback, help_text in self._commands():
            yield Hit(1.0, Content(terminal_safe(name)), callback, text=name, help=markup_literal(help_text))


def _highlight(matcher: Matcher, name: str) -> Content:
    """`name` with the letters the query matched highlighted, as `Matcher.highlight` does, but read as
    text: names and helps quote the host (a lock holder, its intent) and `highlight` reads markup, where
    a holder named `mallory[/]` is a MarkupError that ends the console. The palette reads a string help as
    markup too: `markup_literal` writes it as markup that reads back as the text."""
    safe = terminal_safe(name)
    content = Content(safe)
    _, offsets = matcher.fuzzy_search.match(matcher.query, safe)
    for offset in offsets:
        if not safe[offset].isspace():
            content = content.stylize(matcher.match_style, offset, offset + 1)
    return content
