"""Commands run in a tmux pane the size the test asked for."""

from __future__ import annotations

# Prefixed to a pane's command. Under pytest the shell tmux runs the command in exports COLUMNS=80 and
# LINES=24 (read before the pane took its -x/-y size), and Textual, through Rich, takes them over the
# pane's own size: the console drew at 80 columns in a 160-column pane.
PANE_SIZE = "unset COLUMNS LINES; "
