"""The SGLang HTTP API of a host, reached through an SSH local port forward.

SGLang usually listens on 127.0.0.1 of the GPU host, so the console opens a `LocalForward` on its own
loopback and talks plain HTTP to it with httpx. Endpoints (sglang.md §5): `/health` (200 ready, 503
while starting or shutting down), `/get_server_info` (older and newer servers; newer ones also answer
`/server_info`), `/get_model_info` (`/model_info`), `/metrics` (only with `--enable-metrics`), and the
streaming `/generate` that the probe builds on.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

import httpx

from console.core.metrics import PrometheusReader, SglangMetrics
from console.core.snapshot import HealthState, ServerSample
from console.core.text import LineSplitter
from console.sources.hosts import HostConfig
from console.sources.transport import LocalForward, Transport


class ServerError(Exception):
    """The server answered with an error, or did not answer; `str()` is one sentence."""

    def __init__(self, sentence: str, status_code: int | None = None) -> None:
        super().__init__(sentence)
        self.status_code = status_code


class ServerClient:
    """httpx against one SGLang server. `base_url` is what this machine can reach (the forward)."""

    def __init__(self, base_url: str, *, timeout_s: float = 10.0, label: str = "the server") -> None:
        self.base_url = base_url.rstrip("/")
        self.label = label
        # No proxies from the environment: the URL is a loopback forward, never a proxied host.
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s, trust_env=False)
        self._forward: LocalForward | None = None
        # One server scraped every few seconds: its unchanged families are not parsed again.
        self._reader = PrometheusReader()

    @classmethod
    async def through(
        cls, transport: Transport, host: HostConfig | None = None, *, timeout_s: float = 10.0
    ) -> ServerClient:
        """A client for the host's `server_url`, through a local forward over `transport`."""
        host = host or transport.host
        forward = LocalForward(transport, host.server_host, host.server_port)
        await forward.start()
        client = cls(forward.url, timeout_s=timeout_s, label=f"the SGLang server of {host.name}")
        client._forward = forward
        return client

    async def aclose(self) -> None:
        await self._http.aclose()
        if self._forward is not None:
            await self._forward.close()
            self._forward = None

    async def __aenter__(self) -> ServerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- requests ------------------------------------------------------------------------------------

    async def _get(self, path: str) -> httpx.Response:
        try:
            return await self._http.get(path)
        except httpx.TimeoutException:
            raise ServerError(f"{self.label} did not answer {path} in time") from None
        except httpx.HTTPError as exc:
            raise ServerError(f"{self.label} is not reachable ({type(exc).__name__})") from None

    async def _json(self, *paths: str) -> dict[str, Any]:
        """GET the first of `paths` the server knows (404 → try the next); a JSON object."""
        response = None
        for path in paths:
            response = await self._get(path)
            if response.status_code != 404:
                break
        assert response is not None
        if response.status_code != 200:
            raise ServerError(
                f"{self.label} answered {response.status_code} to {response.request.url.path}",
                response.status_code,
            )
        try:
            data = response.json()
        except ValueError:
            raise ServerError(f"{self.label} sent something that is not JSON for {paths[0]}") from None
        if not isinstance(data, dict):
            raise ServerError(f"{self.label} sent JSON that is not an object for {paths[0]}")
        return data

    def _down(self, exc: httpx.HTTPError) -> ServerSample:
        return ServerSample(
            health=HealthState.DOWN,
            detail=f"{self.label} does not answer ({type(exc).__name__})",
            ts=time.time(),
        )

    async def health(self) -> ServerSample:
        """`/health` as a sample: ok (200), starting (503), down (no answer), error (anything else)."""
        started = time.monotonic()
        try:
            response = await self._http.get("/health")
        except httpx.HTTPError as exc:
            return self._down(exc)
        latency = time.monotonic() - started
        code = response.status_code
        if code == 200:
            health, detail = HealthState.OK, None
        elif code == 503:
            health, detail = HealthState.STARTING, response.text.strip()[:200] or None
        else:
            health, detail = HealthState.ERROR, f"/health answered {code}"
        return ServerSample(health=health, status_code=code, latency_s=latency, detail=detail, ts=time.time())

    async def server_info(self) -> dict[str, Any]:
        # The current name first: the old one answers too, but logs a deprecation warning every call.
        return await self._json("/server_info", "/get_server_info")

    async def model_info(self) -> dict[str, Any]:
        return await self._json("/model_info", "/get_model_info")

    async def metrics_text(self) -> str:
        response = await self._get("/metrics")
        if response.status_code != 200:
            hint = " (start the server with --enable-metrics)" if response.status_code == 404 else ""
            raise ServerError(
                f"{self.label} answered {response.status_code} to /metrics{hint}", response.status_code
            )
        return response.text

    async def metrics(self) -> SglangMetrics:
        return SglangMetrics.from_metrics(self._reader.read(await self.metrics_text()))

    async def light_sample(self) -> ServerSample:
        """Liveness without a generation: `/metrics` (its numbers come along), else `/get_model_info`
        when metrics are off. SGLang's `/health` runs a one-token generation on the server (see
        `sample`), which a console polling every few seconds should not inflict on a busy host."""
        started = time.monotonic()
        try:
            response = await self._http.get("/metrics")
            if response.status_code == 404:
                response = await self._http.get("/model_info")
                if response.status_code == 404:
                    response = await self._http.get("/get_model_info")
        except httpx.HTTPError as exc:
            return self._down(exc)
        latency = time.monotonic() - started
        code = response.status_code
        if code != 200:
            # not a verdict on health: the caller asks /health for one
            return ServerSample(
                health=HealthState.ERROR,
                status_code=code,
                detail=f"{response.url.path} answered {code}",
                ts=time.time(),
            )
        metrics = scrape = None
        if response.url.path == "/metrics":
            scrape = self._reader.read(response.text)
            metrics = SglangMetrics.from_metrics(scrape)
        return ServerSample(
            health=HealthState.OK,
            status_code=code,
            latency_s=latency,
            metrics=metrics,
            scrape=scrape,
            ts=time.time(),
        )

    async def sample(self, *, with_metrics: bool = True) -> ServerSample:
        """Health, and metrics when the server is up (a failed scrape leaves them None)."""
        sample = await self.health()
        if with_metrics and sample.health is HealthState.OK:
            # A failed scrape (metrics off, a hiccup) must not hide a healthy server.
            with contextlib.suppress(ServerError):
                scrape = self._reader.read(await self.metrics_text())
                sample = sample.model_copy(
                    update={"metrics": SglangMetrics.from_metrics(scrape), "scrape": scrape}
                )
        return sample

    async def generate_stream(
        self, payload: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> AsyncGenerator[dict[str, Any]]:
        """POST /generate with `"stream": true`; yields each `data:` event as a dict until `[DONE]`.

        An `{"error": ...}` event raises `ServerError` with the server's message. `timeout_s` bounds the
        wait for each chunk (a long prompt's first token can take minutes: None waits as long as it takes).
        """
        body = {**payload, "stream": True}
        timeout = httpx.Timeout(10.0, read=timeout_s)
        try:
            async with self._http.stream("POST", "/generate", json=body, timeout=timeout) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode("utf-8", "replace")
                    raise ServerError(
                        f"{self.label} refused the request ({response.status_code}): {_error_message(text)}",
                        response.status_code,
                    )
                async for line in _sse_lines(response):
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    try:
                        event = json.loads(data)
                    except ValueError:
                        continue
                    if isinstance(event, dict) and "error" in event:
                        raise ServerError(f"{self.label} reported an error: {_error_message(data)}")
                    if isinstance(event, dict):
                        yield event
        except httpx.TimeoutException:
            raise ServerError(f"{self.label} stopped streaming (no chunk within {timeout_s} s)") from None
        except httpx.HTTPError as exc:
            raise ServerError(f"{self.label} broke the stream ({type(exc).__name__})") from None


async def _sse_lines(response: httpx.Response) -> AsyncIterator[str]:
    """The stream's lines, split on "\n" only. httpx's `aiter_lines` splits like str.splitlines, so a
    generated U+2028, U+0085 or \x1c in an event's JSON (SGLang writes them raw) cut the event in two,
    neither half parsed, and its tokens went uncounted."""
    splitter = LineSplitter()
    async for chunk in response.aiter_bytes():
        for line in splitter.feed(chunk):
            yield line
    for line in splitter.flush():
        yield line


def _error_message(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:200] or "no details"
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict):
            return str(error.get("message") or error)[:200]
        return str(error)[:200]
    return text.strip()[:200]
