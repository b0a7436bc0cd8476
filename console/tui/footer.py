"""The key footer: Textual's, recomposed only when the keys it shows change."""

from __future__ import annotations

from typing import Any

from textual.screen import Screen
from textual.widgets import Footer


class KeyFooter(Footer):
    """Textual's Footer recomposes (ten-odd widgets mounted and styled, then a layout of the whole
    screen) every time its screen's bindings are re-announced: on every focus move, and twice for each
    modal opened and closed, although the keys are mostly the same. Measured under load, that was a
    good part of F1's latency. Here it recomposes when what it would show differs."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._shown: tuple[object, ...] | None = None

    def bindings_changed(self, screen: Screen[Any]) -> None:
        if not (screen.app.app_focus and self.is_attached and screen is self.screen):
            super().bindings_changed(screen)  # nothing is drawn; Textual keeps its own state
            return
        shown = self._keys(screen)
        if shown == self._shown:
            return
        self._shown = shown
        super().bindings_changed(screen)

    def _keys(self, screen: Screen[Any]) -> tuple[object, ...]:
        palette = self.app.COMMAND_PALETTE_BINDING if self.show_command_palette else None
        return tuple(
            (binding.key, binding.description, binding.action, enabled, tooltip, binding.group)
            for (_, binding, enabled, tooltip) in screen.active_bindings.values()
            if binding.show or binding.key == palette
        )
