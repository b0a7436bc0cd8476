"""What a `HostSession` folds, as it folds it: each GPU sample and server reading with the time it came
(`time.monotonic()`). A reading that reads as the last one is not published at once (`SAME_READING_S`), so
a test that counts or times readings watches the fold, not the snapshots."""

from __future__ import annotations

import time

from console.core.events import Event
from console.core.gpus import HostGpuSample
from console.core.snapshot import ServerSample
from console.sources.session import HostSession


class FoldTap:
    def __init__(self, session: HostSession) -> None:
        self.gpu: list[tuple[float, HostGpuSample]] = []
        self.server: list[tuple[float, ServerSample]] = []
        self.on = True
        """Off: readings are folded and no longer noted."""
        fold = session.fold
        fold_gpu, fold_server = fold.gpu, fold.server_reading

        def gpu(sample: HostGpuSample) -> list[Event]:
            if self.on:
                self.gpu.append((time.monotonic(), sample))
            return fold_gpu(sample)

        def server_reading(sample: ServerSample, max_running: float | None) -> None:
            if self.on:
                self.server.append((time.monotonic(), sample))
            fold_server(sample, max_running)

        fold.gpu = gpu  # type: ignore[method-assign]
        fold.server_reading = server_reading  # type: ignore[method-assign]
