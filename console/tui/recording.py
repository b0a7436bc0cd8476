"""Recording while you watch: `--record FILE` on `open` / `demo`, and the `W` key that starts and stops
it, with a REC badge over the footer while it runs.

The recorder (`console.sources.recording.Recorder`) writes from its own thread; this module only hands
it to the hosts' sessions and controllers, which put their inputs into it as they arrive.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import platformdirs
from rich.text import Text
from textual.widgets import Static

from console.sources.recording import Recorder, RecordingError
from console.tui.view import textual_text

if TYPE_CHECKING:
    from console.tui.host_controller import HostController


def recordings_dir() -> Path:
    """Where the record key writes when the console was not given `--record FILE`."""
    return Path(platformdirs.user_state_dir("k26-console")) / "recordings"


def default_recording_path(hosts: list[str], directory: Path | None = None) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    name = "-".join("".join(c if c.isalnum() or c in "-_." else "_" for c in h) for h in hosts[:3])
    return (directory or recordings_dir()) / f"{stamp}-{name}.k26rec"


class RecBadge(Static):
    """`● REC 1:23 4.2 MB FILE` while recording; hidden otherwise."""

    DEFAULT_CSS = """
    RecBadge {
        dock: bottom;
        margin-bottom: 1;  /* above the key footer: docked widgets overlap */
        height: 1;
        width: 100%;
        display: none;
        color: $text;
        background: $error 60%;
        text-style: bold;
        padding: 0 1;
    }
    RecBadge.on { display: block; }
    """


class RecordSwitch:
    """The console's one recording (one file for every host it shows), started and stopped at will."""

    def __init__(self, controllers: dict[str, HostController], path: Path | None = None) -> None:
        self.controllers = controllers
        self.path = path
        self.directory: Path | None = None
        """Where a recording started with the key goes (default: `recordings_dir()` when started)."""
        self.recorder: Recorder | None = None
        self.started = 0.0
        self.badge = RecBadge(id="rec-badge")

    @property
    def on(self) -> bool:
        return self.recorder is not None

    def start(self) -> str | None:
        """Start recording; None, or why it could not start (one sentence)."""
        if self.recorder is not None:
            return None
        path = self.path or default_recording_path(list(self.controllers), self.directory)
        # This console's own presence on its hosts is recorded with them: a replay leaves it out.
        me = next((ctl.me.console_id for ctl in self.controllers.values()), None)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            recorder = Recorder(path, hosts=list(self.controllers), console=me).start()
        except (RecordingError, OSError) as exc:
            return str(exc)
        self.path, self.recorder, self.started = path, recorder, time.monotonic()
        for ctl in self.controllers.values():
            ctl.start_recording(recorder)
        self.badge.add_class("on")
        self.show()
        return None

    def stop(self) -> Path | None:
        """Stop recording (the file stays readable and can be appended to); the file, when one was open."""
        recorder, self.recorder = self.recorder, None
        if recorder is None:
            return None
        for ctl in self.controllers.values():
            ctl.stop_recording()
        recorder.close()
        self.badge.remove_class("on")
        return recorder.path

    def show(self) -> None:
        """The badge's line (once a second while recording)."""
        rec = self.recorder
        if rec is None:
            return
        elapsed = int(time.monotonic() - self.started)
        size = rec.bytes_written
        shown = f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"
        text = Text(f"● REC {elapsed // 60}:{elapsed % 60:02d}  {shown}  {rec.path}")
        if rec.error is not None:
            text = Text(f"● REC stopped: {rec.error}")
        self.badge.update(textual_text(text))

    def toggle(self, notify: Any) -> None:
        if self.on:
            path = self.stop()
            notify(f"recording stopped: {path} (k26-console replay {path})", timeout=10)
            return
        problem = self.start()
        if problem is not None:
            notify(f"cannot record: {problem}", severity="error", timeout=15)
        else:
            notify(f"recording to {self.path}", timeout=5)
