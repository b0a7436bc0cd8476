"""A realistic load on the twin's SGLang stand-in: `k26-console twin --load RPS`.

Requests arrive as a Poisson process at RPS a second (exponential gaps, seeded), each a `/generate` of a
chat-like prompt (a shared system prefix, so the radix cache hits as on a real deployment, plus a
question of 50 to 1,500 words) asking for 32 to 384 new tokens. They go over loopback HTTP like any
client's, so the server's queue, batches, stats lines and `/metrics` histograms move as they would under
traffic. A refused or failed request (the server restarting) is counted and the load goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass

import httpx

SYSTEM_PREFIX = (
    "You are a careful assistant for the operations team. Answer briefly, cite the log line you rely on, "
    "and say when you do not know. "
) * 8
_WORDS = ("the", "pool", "decode", "server", "restart", "token", "cache", "queue", "batch", "depth",
          "memory", "graph", "latency", "request", "prefill", "rank", "model", "context")  # fmt: skip


@dataclass
class LoadStats:
    sent: int = 0
    ok: int = 0
    failed: int = 0


class LoadGenerator:
    def __init__(self, url: str, rps: float, *, seed: int = 26, max_in_flight: int = 256) -> None:
        if rps <= 0:
            raise ValueError("the load needs a positive rate")
        self.url = url.rstrip("/")
        self.rps = rps
        self.rng = random.Random(seed)
        self.stats = LoadStats()
        self._slots = asyncio.Semaphore(max_in_flight)

    def payload(self) -> dict[str, object]:
        words = " ".join(self.rng.choice(_WORDS) for _ in range(self.rng.randint(50, 1500)))
        return {
            "text": f"{SYSTEM_PREFIX}\nQuestion {self.rng.randrange(1 << 30)}: {words}?",
            "sampling_params": {
                "max_new_tokens": self.rng.randint(32, 384),
                "temperature": 0.7,
                "ignore_eos": self.rng.random() < 0.5,
            },
        }

    async def _one(self, http: httpx.AsyncClient, body: dict[str, object]) -> None:
        try:
            response = await http.post("/generate", json=body)
            if response.status_code == 200:
                self.stats.ok += 1
            else:
                self.stats.failed += 1
        except httpx.HTTPError:
            self.stats.failed += 1
        finally:
            self._slots.release()

    async def run(self) -> None:
        """Until cancelled; in-flight requests are cancelled with it."""
        tasks: set[asyncio.Task[None]] = set()
        async with httpx.AsyncClient(base_url=self.url, timeout=600.0, trust_env=False) as http:
            try:
                while True:
                    await asyncio.sleep(self.rng.expovariate(self.rps))
                    if self._slots.locked():
                        continue  # the server is far behind: a real client would time out too
                    await self._slots.acquire()
                    self.stats.sent += 1
                    task = asyncio.get_running_loop().create_task(self._one(http, self.payload()))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            finally:
                for task in list(tasks):
                    task.cancel()
                for task in list(tasks):
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
