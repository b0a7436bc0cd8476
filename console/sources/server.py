"""The SGLang HTTP API of a host, reached through an SSH local port forward.

SGLang usually listens on 127.0.0.1 of the GPU host, so the console opens a `LocalForward` on its own
loopback and talks plain HTTP to it with httpx. Endpoints (sglang.md §5): `/health` (200 ready, 503
while starting or shutting down), `/get_server_info` (older and newer servers; newer ones also answer
`/server_info`), `/get_model_info` (`/model_info`), `/metrics` (only with `--enable-metrics`), and the
streaming `/generate` that the probe builds on.

Every answer but the probe's stream is read through one place (`ServerClient._fetch`): at most a size
for its endpoint (`METRICS_MAX_BYTES` for `/metrics`, `JSON_MAX_BYTES` for the JSON ones), uncompressed
(the client asks for `identity`; a compressed body is refused, never inflated), all of it within
`timeout_s` from the request (httpx's own timeout is per read: a server sending a byte every few seconds
never tripped it). Past either, one sentence says what was cut and where.
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from console.core.metrics import MetricsText, PrometheusReader, SglangMetrics
from console.core.snapshot import HealthState, ServerSample
from console.core.text import LineSplitter
from console.sources.hosts import HostConfig
from console.sources.transport import LocalForward, Transport

METRICS_MAX_BYTES = 8 << 20
"""The largest `/metrics` body read (8 MiB): SGLang's is ~30 KB a rank, a few hundred KB with many DP ranks."""
JSON_MAX_BYTES = 4 << 20
"""The largest JSON answer read (`/server_info`, `/model_info`; 4 MiB): SGLang's are a few KB."""
HEALTH_MAX_BYTES = 64 << 10
"""The largest `/health` (or other liveness) body read: SGLang's is empty or one line."""


class AnswerTooLarge(Exception):
    """A body past its limit; `str()` is the sentence."""


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer read within its bounds: the status, the path asked, and the whole body."""

    status_code: int
    path: str
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.body)


class ServerError(Exception):
    """The server answered with an error, or did not answer; `str()` is one sentence."""

    def __init__(self, sentence: str, status_code: int | None = None) -> None:
        super().__init__(sentence)
        self.status_code = status_code


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every client, verifying as httpx does by default: httpx made one per client,
    loading the CA bundle each time (0.67 MB per host, 21 MB of a 32-host fleet's RSS), though the
    console speaks plain HTTP to its loopback forwards and never uses it."""
    return httpx.create_ssl_context()


class ServerClient:
    """httpx against one SGLang server. `base_url` is what this machine can reach (the forward)."""

    def __init__(self, base_url: str, *, timeout_s: float = 10.0, label: str = "the server") -> None:
        self.base_url = base_url.rstrip("/")
        self.label = label
        self.timeout_s = timeout_s
        # No proxies from the environment: the URL is a loopback forward, never a proxied host. Bodies
        # uncompressed: a compressed one would be inflated before its size could be checked.
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=timeout_s,
            trust_env=False,
            headers={"Accept-Encoding": "identity"},
            verify=_tls(),
        )
        self._forward: LocalForward | None = None
        # One server scraped every few seconds: its unchanged families are not parsed again.
        self._reader = PrometheusReader()
        self._last_figures: tuple[MetricsText, SglangMetrics] | None = None

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

    async def _fetch(self, path: str, limit: int) -> Answer:
        """GET `path`: the whole answer, at most `limit` bytes of body, within `timeout_s` in all.
        Raises httpx.HTTPError (no answer), TimeoutError (not all of it in time) or AnswerTooLarge."""
        async with asyncio.timeout(self.timeout_s):
            async with self._http.stream("GET", path) as response:
                encoding = response.headers.get("content-encoding", "identity").strip().lower()
                if encoding not in ("", "identity"):
                    raise AnswerTooLarge(
                        f"{self.label} sent {path} compressed ({encoding[:20]}) though asked not to: not read"
                    )
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > limit:
                    raise AnswerTooLarge(
                        f"{self.label} sent {int(declared):,} bytes for {path}, over the {limit:,}-byte "
                        "limit: not read"
                    )
                parts: list[bytes] = []
                size = 0
                async for chunk in response.aiter_raw():
                    size += len(chunk)
                    if size > limit:
                        raise AnswerTooLarge(
                            f"{self.label} sent more than {limit:,} bytes for {path}: cut there, not read"
                        )
                    parts.append(chunk)
                return Answer(response.status_code, response.url.path, b"".join(parts))

    async def _get(self, path: str, limit: int = JSON_MAX_BYTES) -> Answer:
        try:
            return await self._fetch(path, limit)
        except (httpx.TimeoutException, TimeoutError):
            raise ServerError(f"{self.label} did not answer {path} within {self.timeout_s:g} s") from None
        except AnswerTooLarge as exc:
            raise ServerError(str(exc)) from None
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
                f"{self.label} answered {response.status_code} to {response.path}",
                response.status_code,
            )
        try:
            data = response.json()
        except (ValueError, RecursionError):
            raise ServerError(f"{self.label} sent something that is not JSON for {paths[0]}") from None
        if not isinstance(data, dict):
            raise ServerError(f"{self.label} sent JSON that is not an object for {paths[0]}")
        return data

    def _failed(self, path: str, exc: Exception) -> ServerSample:
        """A liveness request that got no whole answer: nothing (down), or not all of it in time or in
        bounds (an error, with the sentence)."""
        if isinstance(exc, httpx.HTTPError) and not isinstance(exc, httpx.TimeoutException):
            return self._down(exc)
        detail = (
            str(exc)
            if isinstance(exc, AnswerTooLarge)
            else f"{self.label} did not answer {path} within {self.timeout_s:g} s"
        )
        return ServerSample(health=HealthState.ERROR, detail=detail, ts=time.time())

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
            response = await self._fetch("/health", HEALTH_MAX_BYTES)
        except (httpx.HTTPError, TimeoutError, AnswerTooLarge) as exc:
            return self._failed("/health", exc)
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
        response = await self._get("/metrics", METRICS_MAX_BYTES)
        if response.status_code != 200:
            hint = " (start the server with --enable-metrics)" if response.status_code == 404 else ""
            raise ServerError(
                f"{self.label} answered {response.status_code} to /metrics{hint}", response.status_code
            )
        return response.text

    def _figures(self, scrape: MetricsText) -> SglangMetrics:
        """The figures of a scrape, made once for a scrape read again (`PrometheusReader` gives an
        unchanged text's reading back)."""
        last = self._last_figures
        if last is None or last[0] is not scrape:
            last = self._last_figures = (scrape, SglangMetrics.from_metrics(scrape))
        return last[1]

    async def metrics(self) -> SglangMetrics:
        return self._figures(self._reader.read(await self.metrics_text()))

    async def light_sample(self) -> ServerSample:
        """Liveness without a generation: `/metrics` (its numbers come along), else `/get_model_info`
        when metrics are off. SGLang's `/health` runs a one-token generation on the server (see
        `sample`), which a console polling every few seconds should not inflict on a busy host."""
        started = time.monotonic()
        path = "/metrics"
        try:
            response = await self._fetch(path, METRICS_MAX_BYTES)
            if response.status_code == 404:
                path = "/model_info"
                response = await self._fetch(path, JSON_MAX_BYTES)
                if response.status_code == 404:
                    path = "/get_model_info"
                    response = await self._fetch(path, JSON_MAX_BYTES)
        except (httpx.HTTPError, TimeoutError, AnswerTooLarge) as exc:
            return self._failed(path, exc)
        latency = time.monotonic() - started
        code = response.status_code
        if code != 200:
            # not a verdict on health: the caller asks /health for one
            return ServerSample(
                health=HealthState.ERROR,
                status_code=code,
                detail=f"{response.path} answered {code}",
                ts=time.time(),
            )
        metrics = scrape = None
        if response.path == "/metrics":
            scrape = self._reader.read(response.text)
            metrics = self._figures(scrape)
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
            # A failed scrape (metrics off, a hiccup, an answer refused) must not hide a healthy server;
            # its sentence goes with the sample, for the screen to say why there are no figures.
            try:
                scrape = self._reader.read(await self.metrics_text())
            except ServerError as exc:
                sample = sample.model_copy(update={"detail": str(exc)})
            else:
                sample = sample.model_copy(update={"metrics": self._figures(scrape), "scrape": scrape})
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
