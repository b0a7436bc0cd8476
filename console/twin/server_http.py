"""A small HTTP/1.1 server on asyncio streams with SGLang v0.5.12.post1's endpoints.

Keep-alive, `Content-Length` request bodies, chunked `text/event-stream` responses; one uvicorn-style
access line per request (`INFO:     127.0.0.1:PORT - "POST /generate HTTP/1.1" 200 OK`), printed when the
response starts, as uvicorn does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from console.twin.server_engine import Engine, Request, RequestError, tokenize

VERSION = "0.5.12.post1"
HEALTH_CHECK_TIMEOUT_S = 20.0
MAX_BODY = 64 * 1024 * 1024


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="allow")

    max_new_tokens: int | None = 128
    min_new_tokens: int = 0
    ignore_eos: bool = False
    temperature: float | None = None


class GenerateBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    stream: bool = False
    rid: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: Any = None


class ChatBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stream: bool = False
    stream_options: dict[str, Any] | None = None


@dataclass
class HttpRequest:
    method: str
    target: str
    version: str
    headers: dict[str, str]
    body: bytes
    client: tuple[str, int]

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.target).query)

    def json(self) -> Any:
        return json.loads(self.body or b"{}")


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    stream: AsyncIterator[bytes] | None = None
    on_close: Callable[[], None] | None = None
    headers: dict[str, str] = field(default_factory=dict)


def json_response(data: Any, status: int = 200) -> Response:
    return Response(status=status, body=json.dumps(data, separators=(",", ":")).encode())


def error_response(message: str, status: int = HTTPStatus.BAD_REQUEST) -> Response:
    return json_response({"error": {"message": message}}, status)


class TwinHttpServer:
    """Routes HTTP requests to the engine; `ready` flips once the warm-up request has completed."""

    def __init__(
        self,
        engine_factory: Callable[[], Engine | None],
        server_args: dict[str, Any],
        scheduler_info: dict[str, Any],
        model_info: dict[str, Any],
        internal_state: Callable[[], dict[str, Any]],
        log_main: Callable[[str], None],
    ) -> None:
        self._engine = engine_factory
        self.server_args = server_args
        self.scheduler_info = scheduler_info
        self.model_info = model_info
        self.internal_state = internal_state
        self.log_main = log_main
        self.ready = False
        self.shutting_down = False
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    @property
    def engine(self) -> Engine:
        engine = self._engine()
        assert engine is not None
        return engine

    # ------------------------------------------------------------------ socket
    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._handle_conn, host, port, reuse_address=True)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        for task in list(self._conns):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self._server.wait_closed()

    async def _handle_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._conns.add(task)
        peer = writer.get_extra_info("peername") or ("127.0.0.1", 0)
        try:
            while True:
                req = await self._read_request(reader, (str(peer[0]), int(peer[1])))
                if req is None:
                    break
                keep_alive = (
                    req.headers.get("connection", "").lower() != "close" and req.version == "HTTP/1.1"
                )
                resp = await self._dispatch(req)
                await self._write_response(writer, req, resp, keep_alive)
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
            if task is not None:
                self._conns.discard(task)

    async def _read_request(
        self, reader: asyncio.StreamReader, client: tuple[str, int]
    ) -> HttpRequest | None:
        line = await reader.readline()
        if not line:
            return None
        parts = line.decode("latin-1").strip().split()
        if len(parts) != 3:
            return None
        method, target, version = parts
        headers: dict[str, str] = {}
        while True:
            raw = await reader.readline()
            if raw in (b"\r\n", b"\n", b""):
                break
            name, _, value = raw.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = b""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    await reader.readline()
                    break
                chunks.append(await reader.readexactly(size))
                await reader.readline()
            body = b"".join(chunks)
        else:
            length = int(headers.get("content-length", "0") or 0)
            if length > MAX_BODY:
                return None
            if length:
                body = await reader.readexactly(length)
        return HttpRequest(method.upper(), target, version, headers, body, client)

    async def _write_response(
        self, writer: asyncio.StreamWriter, req: HttpRequest, resp: Response, keep_alive: bool
    ) -> None:
        phrase = HTTPStatus(resp.status).phrase
        head = [
            f"HTTP/1.1 {resp.status} {phrase}",
            f"date: {formatdate(usegmt=True)}",
            "server: uvicorn",
            f"content-type: {resp.content_type}",
        ]
        head += [f"{k}: {v}" for k, v in resp.headers.items()]
        if resp.stream is None:
            head.append(f"content-length: {len(resp.body)}")
        else:
            head.append("transfer-encoding: chunked")
        if not keep_alive:
            head.append("connection: close")
        self.log_main(
            f'INFO:     {req.client[0]}:{req.client[1]} - "{req.method} {req.target} {req.version}" {resp.status} {phrase}'
        )
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        try:
            if resp.stream is None:
                if req.method != "HEAD":
                    writer.write(resp.body)
                await writer.drain()
                return
            async for chunk in resp.stream:
                writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        finally:
            if resp.on_close is not None:
                resp.on_close()

    # ------------------------------------------------------------------ routing
    async def _dispatch(self, req: HttpRequest) -> Response:
        path = req.path
        try:
            handler = self._routes().get(path)
            if handler is None:
                return json_response({"detail": "Not Found"}, 404)
            return await handler(req)
        except (json.JSONDecodeError, ValidationError) as exc:
            return json_response({"detail": str(exc)}, 422)

    def _routes(self) -> dict[str, Callable[[HttpRequest], Awaitable[Response]]]:
        routes: dict[str, Callable[[HttpRequest], Awaitable[Response]]] = {
            "/health": self._health,
            "/health_generate": self._health,
            "/model_info": self._model_info,
            "/get_model_info": self._get_model_info,
            "/server_info": self._server_info,
            "/get_server_info": self._get_server_info,
            "/generate": self._generate,
            "/v1/chat/completions": self._chat,
            "/v1/models": self._models,
            "/flush_cache": self._flush_cache,
        }
        if self.server_args.get("enable_metrics"):
            routes["/metrics"] = self._metrics
        return routes

    async def _health(self, req: HttpRequest) -> Response:
        if self.shutting_down:
            self.log_main("Health check request received during shutdown. Returning 503.")
            return Response(status=503, content_type="text/plain; charset=utf-8")
        if not self.ready:
            return Response(status=503, content_type="text/plain; charset=utf-8")
        engine = self.engine
        probe = engine.submit([0], 1, internal=True, rid=f"HEALTH_CHECK_{time.time()}")
        deadline = time.monotonic() + HEALTH_CHECK_TIMEOUT_S
        while not probe.output_ids and not probe.done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                engine.abort(probe)
                self.log_main(
                    f"Health check failed. Server couldn't get a response from detokenizer for last "
                    f"{int(HEALTH_CHECK_TIMEOUT_S)} seconds. tic start time: {time.strftime('%H:%M:%S')}. "
                    f"last_heartbeat time: {time.strftime('%H:%M:%S')}"
                )
                return Response(status=503, content_type="text/plain; charset=utf-8")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await probe.updates.get()
        return Response(status=200, content_type="text/plain; charset=utf-8")

    async def _model_info(self, req: HttpRequest) -> Response:
        return json_response(self.model_info)

    async def _get_model_info(self, req: HttpRequest) -> Response:
        self.log_main(
            "Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
            "Please use '/model_info' instead."
        )
        return json_response(self.model_info)

    async def _server_info(self, req: HttpRequest) -> Response:
        return json_response(
            {
                **self.server_args,
                **self.scheduler_info,
                "internal_states": [self.internal_state()],
                "version": VERSION,
            }
        )

    async def _get_server_info(self, req: HttpRequest) -> Response:
        self.log_main(
            "Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
            "Please use '/server_info' instead."
        )
        return await self._server_info(req)

    async def _models(self, req: HttpRequest) -> Response:
        name = self.server_args["served_model_name"]
        return json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "sglang",
                        "root": name,
                        "max_model_len": self.scheduler_info.get("context_len"),
                    }
                ],
            }
        )

    async def _flush_cache(self, req: HttpRequest) -> Response:
        if self.engine.flush_cache():
            body = (
                "Cache flushed.\nPlease check backend logs for more details. "
                "(When there are running or waiting requests, the operation will not be performed.)\n"
            )
            return Response(200, body.encode(), "text/plain; charset=utf-8")
        return Response(400, b"Flush cache failed.\n", "text/plain; charset=utf-8")

    async def _metrics(self, req: HttpRequest) -> Response:
        return Response(200, self.engine.metrics_text().encode(), "text/plain; version=0.0.4; charset=utf-8")

    # ------------------------------------------------------------------ /generate
    async def _generate(self, req: HttpRequest) -> Response:
        if req.method not in ("POST", "PUT"):
            return json_response({"detail": "Method Not Allowed"}, 405)
        body = GenerateBody.model_validate(req.json())
        engine = self.engine
        if body.input_ids is not None:
            ids = body.input_ids
        elif body.text is not None:
            ids = tokenize(body.text, engine.scenario.vocab_size) or [1]
        else:
            return error_response("Either text, input_ids or input_embeds should be provided.")
        sp = body.sampling_params
        max_new = sp.max_new_tokens if sp.max_new_tokens is not None else engine.cfg.context_len - len(ids)
        try:
            engine.validate(len(ids), sp.max_new_tokens)
            request = engine.submit(ids, max_new, sp.min_new_tokens, sp.ignore_eos, rid=body.rid)
        except RequestError as exc:
            self.log_main(f"[http_server] Error: {exc}")
            if body.stream:
                return self._stream_error(str(exc))
            return error_response(str(exc))

        if body.stream:

            async def events() -> AsyncIterator[bytes]:
                async for _ in _updates(request):
                    yield b"data: " + _dumps(_generate_payload(request)) + b"\n\n"
                yield b"data: [DONE]\n\n"

            return Response(
                200,
                content_type="text/event-stream; charset=utf-8",
                stream=events(),
                on_close=lambda: engine.abort(request),
            )
        try:
            async for _ in _updates(request):
                pass
        except asyncio.CancelledError:
            engine.abort(request)
            raise
        return json_response(_generate_payload(request))

    def _stream_error(self, message: str) -> Response:
        async def events() -> AsyncIterator[bytes]:
            yield b"data: " + _dumps({"error": {"message": message}}) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return Response(200, content_type="text/event-stream; charset=utf-8", stream=events())

    # ------------------------------------------------------------------ /v1/chat/completions
    async def _chat(self, req: HttpRequest) -> Response:
        if req.method != "POST":
            return json_response({"detail": "Method Not Allowed"}, 405)
        body = ChatBody.model_validate(req.json())
        engine = self.engine
        prompt = "".join(f"<|im_{m.role}|>{_content_text(m.content)}<|im_end|>" for m in body.messages)
        ids = tokenize(prompt + "<|im_assistant|>", engine.scenario.vocab_size)
        max_tokens = body.max_completion_tokens or body.max_tokens
        model = self.server_args["served_model_name"]
        try:
            engine.validate(len(ids), max_tokens)
            max_new = max_tokens if max_tokens is not None else engine.cfg.context_len - len(ids)
            request = engine.submit(ids, max_new, body.min_tokens, body.ignore_eos)
        except RequestError as exc:
            return json_response(
                {
                    "object": "error",
                    "message": str(exc),
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                },
                400,
            )
        created = int(time.time())
        cid = uuid.uuid4().hex
        include_usage = bool((body.stream_options or {}).get("include_usage"))

        if body.stream:

            async def chunks() -> AsyncIterator[bytes]:
                sent = ""
                first = True
                async for _ in _updates(request):
                    delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
                    new_text = request.text[len(sent) :]
                    sent = request.text
                    if new_text:
                        delta["content"] = new_text
                        delta.setdefault("role", None)
                    finish = _openai_finish(request)
                    if first or new_text or finish:
                        yield (
                            b"data: "
                            + _dumps(_chat_chunk(cid, created, model, delta, finish, _matched(request)))
                            + b"\n\n"
                        )
                    first = False
                if include_usage:
                    usage = _usage(request)
                    tail = {
                        "id": cid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": usage,
                    }
                    yield b"data: " + _dumps(tail) + b"\n\n"
                yield b"data: [DONE]\n\n"

            return Response(
                200,
                content_type="text/event-stream; charset=utf-8",
                stream=chunks(),
                on_close=lambda: engine.abort(request),
            )
        async for _ in _updates(request):
            pass
        return json_response(
            {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": request.text,
                            "reasoning_content": None,
                            "tool_calls": None,
                        },
                        "logprobs": None,
                        "finish_reason": _openai_finish(request),
                        "matched_stop": _matched(request),
                    }
                ],
                "usage": _usage(request),
                "metadata": {"weight_version": "default"},
            }
        )


async def _updates(request: Request) -> AsyncIterator[None]:
    """Yield once per engine update of this request, until it is done."""
    while True:
        await request.updates.get()
        while not request.updates.empty():
            request.updates.get_nowait()
        yield None
        if request.done:
            return


def _dumps(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def _generate_payload(request: Request) -> dict[str, Any]:
    return {"text": request.text, "output_ids": list(request.output_ids), "meta_info": request.meta_info()}


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for item in content:
            if isinstance(item, dict) and item.get("type") == "text":
                parts.append(str(item.get("text", "")))
            elif isinstance(item, dict):
                parts.append("<|media_pad|>" * 64)
        return "".join(parts)
    return ""


def _openai_finish(request: Request) -> str | None:
    if request.finish_reason is None:
        return None
    kind = request.finish_reason.get("type")
    return {"length": "length", "stop": "stop", "abort": "abort"}.get(str(kind), str(kind))


def _matched(request: Request) -> Any:
    if request.finish_reason and request.finish_reason.get("type") == "stop":
        return request.finish_reason.get("matched")
    return None


def _usage(request: Request) -> dict[str, Any]:
    return {
        "prompt_tokens": request.prompt_tokens,
        "total_tokens": request.prompt_tokens + len(request.output_ids),
        "completion_tokens": len(request.output_ids),
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
    }


def _chat_chunk(
    cid: str, created: int, model: str, delta: dict[str, Any], finish: str | None, matched: Any
) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": matched}
        ],
        "usage": None,
    }
