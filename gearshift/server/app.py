"""The OpenAI-compatible HTTP server: routes, API key, body limits, overload and client
disconnects. Thin by design: it validates, converts and talks to the AsyncEngine.

Data flow: HTTP -> auth -> read_json (size, UTF-8, JSON) -> protocol model -> serving.prepare_*
-> Generation (AsyncEngine requests) -> JSON response or SSE stream; a disconnect watcher
aborts the engine requests as soon as the client goes away.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from gearshift.frontend.async_engine import AsyncEngine, EngineDeadError, RequestFailedError
from gearshift.server.errors import APIError, error_body, from_validation_error, install_error_handlers
from gearshift.server.logprobs import (
    TokenText,
    chat_choice_logprobs,
    completion_choice_logprobs,
    completion_chunk_logprobs,
    echo_of,
)
from gearshift.server.metrics import CONTENT_TYPE, ServerMetrics
from gearshift.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    CompletionChoice,
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
)
from gearshift.server.serving import (
    SEED_HEADER,
    Generation,
    Offload,
    prepare_chat,
    prepare_completion,
)
from gearshift.server.utility import add_utility_routes

DEFAULT_MAX_WAITING = 512
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
_ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models")
_LONE_SURROGATE_HINT = re.compile(r"\\u[dD][89a-fA-F]")


def build_app(
    async_engine: AsyncEngine,
    *,
    api_key: str | None = None,
    max_waiting: int = DEFAULT_MAX_WAITING,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """A FastAPI app serving `async_engine`; the app's lifespan starts and stops its thread."""
    engine = async_engine
    metrics = ServerMetrics()
    if hasattr(engine, "replicas"):  # a ReplicaSet (cluster/): per-replica series too
        from gearshift.cluster.metrics import ReplicaCollector

        metrics.registry.register(ReplicaCollector(engine))
    key = api_key.encode() if api_key else None
    offload: Offload | None = None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        nonlocal offload
        offload = Offload()  # its semaphore belongs to the serving loop
        engine.start()
        yield
        engine.shutdown()
        offload.close()

    # the schema is served below, behind the API key like the rest; no /docs pages
    app = FastAPI(title="Gearshift", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.engine = engine
    app.state.metrics = metrics
    install_error_handlers(app)
    app.add_middleware(_CountRequests, metrics=metrics)

    def require_key(request: Request) -> None:
        if key is None:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key):
            raise APIError(401, "missing or invalid API key (send 'Authorization: Bearer KEY')",
                           code="invalid_api_key")

    def admit(num_choices: int) -> None:
        if not engine.is_alive:
            raise APIError(503, f"the engine is not running: {engine.error!r}",
                           code="engine_unavailable")
        if num_choices > max_waiting:
            raise APIError(400, f"this request asks for {num_choices} choices (n x prompts); "
                           f"this server queues at most {max_waiting}", param="n")
        if engine.num_waiting + num_choices > max_waiting:
            raise APIError(
                503, f"server overloaded: {engine.num_waiting} requests waiting "
                f"(limit {max_waiting}); retry later", code="overloaded",
                headers={"Retry-After": "1"},
            )

    @app.get("/health")
    async def health() -> Response:
        if engine.is_alive:
            return JSONResponse({"status": "ok"})
        return JSONResponse(error_body(503, f"engine not running: {engine.error!r}"), 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(engine.snapshot, engine.num_waiting),
                        media_type=CONTENT_TYPE)

    @app.get("/openapi.json", dependencies=[Depends(require_key)], include_in_schema=False)
    async def openapi() -> Response:
        return JSONResponse(app.openapi())

    @app.get("/v1/models", dependencies=[Depends(require_key)])
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=engine.model_name, max_model_len=engine.max_model_len)])

    add_utility_routes(app, engine, require_key,
                       lambda r: read_json(r, max_body_bytes, offload), _parse)

    @app.post("/v1/completions", dependencies=[Depends(require_key)])
    async def completions(request: Request) -> Response:
        req = _parse(CompletionRequest, await read_json(request, max_body_bytes, offload))
        admit(len(req.prompts) * req.n)
        gen = await prepare_completion(engine, metrics, offload, req)
        gen.continuous_usage = req.continuous_usage_in_stream
        return await _run(request, gen, req.stream, req.include_usage_in_stream,
                          _completion_chunks, _completion_response)

    @app.post("/v1/chat/completions", dependencies=[Depends(require_key)])
    async def chat_completions(request: Request) -> Response:
        req = _parse(ChatCompletionRequest, await read_json(request, max_body_bytes, offload))
        admit(req.n)
        gen = await prepare_chat(engine, metrics, offload, req)
        gen.continuous_usage = req.continuous_usage_in_stream
        return await _run(request, gen, req.stream, req.include_usage_in_stream,
                          _chat_chunks, _chat_response)

    return app


# ---------------------------------------------------------------- request side


async def read_json(request: Request, max_bytes: int, offload: Offload | None = None) -> dict:
    """The body as a JSON object; 413 past `max_bytes`, 400 for bad UTF-8 / JSON / shape.
    A large body is decoded off the event loop (`offload`)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise APIError(413, f"request body of {length} bytes exceeds the limit of {max_bytes}",
                       code="body_too_large")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise APIError(413, f"request body exceeds the limit of {max_bytes} bytes",
                               code="body_too_large")
            chunks.append(chunk)
    except ClientDisconnect:  # nobody will read the answer; 499 as in nginx, for the metrics
        raise APIError(499, "client disconnected while sending the body",
                       code="client_disconnected") from None
    body = b"".join(chunks)
    if offload is not None:
        return await offload.run(len(body), _decode_json, body)
    return _decode_json(body)


def _decode_json(body: bytes) -> dict:
    if not body.strip():
        raise APIError(400, "request body is empty: send a JSON object", code="invalid_json")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(400, f"request body is not valid UTF-8 (bad byte at offset {e.start})",
                       code="invalid_encoding") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise APIError(400, f"request body is not valid JSON: {e.msg} at line {e.lineno} "
                       f"column {e.colno}", code="invalid_json") from None
    except RecursionError:
        raise APIError(400, "request body is nested too deeply", code="invalid_json") from None
    except ValueError as e:  # an integer literal past Python's int-string limit
        raise APIError(400, f"request body has a number too large to read: {e}",
                       code="invalid_json") from None
    if not isinstance(obj, dict):
        raise APIError(400, f"request body must be a JSON object, not {type(obj).__name__}",
                       code="invalid_json")
    if _LONE_SURROGATE_HINT.search(text):  # "\ud800" escapes parse to unencodable strings
        try:
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise APIError(400, "request body contains an unpaired UTF-16 surrogate escape",
                           code="invalid_encoding") from None
    return obj


def _parse(model: type[BaseModel], obj: dict) -> Any:
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise from_validation_error(e) from None


async def _watch_disconnect(request: Request, on_disconnect: Callable[[], None]) -> None:
    """Wait for the client to go away, then call `on_disconnect` (the body is already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            on_disconnect()
            return


async def _run(request: Request, gen: Generation, stream: bool, include_usage: bool,
               chunks: Callable, response: Callable) -> Response:
    await gen.submit()
    watcher = asyncio.create_task(_watch_disconnect(request, gen.abort))
    model = request.app.state.engine.model_name
    seed = {SEED_HEADER: str(gen.seed)}  # replays the response (body field `seed` too)
    if stream:
        return StreamingResponse(
            _sse(gen, watcher, chunks(gen, model, include_usage)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **seed},
        )
    try:
        async for _ in gen.events():
            pass
    except EngineDeadError as e:
        raise APIError(503, str(e), code="engine_unavailable") from None
    except RequestFailedError as e:
        raise APIError(500, f"the engine failed this request: {e}", code="internal_error") from None
    finally:
        watcher.cancel()
        gen.abort()
    return JSONResponse(response(gen, model).model_dump(), headers=seed)


async def _sse(gen: Generation, watcher: asyncio.Task, events: AsyncIterator[dict]
               ) -> AsyncIterator[str]:
    try:
        async for obj in events:
            yield f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
    except EngineDeadError as e:
        yield f"data: {json.dumps(error_body(503, str(e), code='engine_unavailable'))}\n\n"
    except RequestFailedError as e:
        body = error_body(500, f"the engine failed this request: {e}", code="internal_error")
        yield f"data: {json.dumps(body)}\n\n"
    finally:
        watcher.cancel()
        gen.abort()
    yield "data: [DONE]\n\n"


# ---------------------------------------------------------------- response side


def _usage_fields(gen: Generation, include_usage: bool) -> dict:
    """With stream_options.include_usage every chunk carries "usage": null, the last a total;
    with continuous_usage_stats too (vLLM's), each chunk's is the counts so far."""
    if not include_usage:
        return {}
    return {"usage": gen.usage().model_dump() if gen.continuous_usage else None}


async def _completion_chunks(gen: Generation, model: str, include_usage: bool
                             ) -> AsyncIterator[dict]:
    head = dict(id=f"cmpl-{gen.request_id}", created=gen.created, model=model)
    token_text = TokenText(gen.engine.tokenizer)

    def chunk(choice: CompletionChoice) -> dict:
        body = CompletionChunk(**head, choices=[choice]).model_dump(exclude={"usage"})
        return {**body, **_usage_fields(gen, include_usage)}

    async for c, text in gen.events():
        if gen.echo is not None and c.num_deltas == 1:  # the prompt first (its logprobs known now)
            echo, logprobs = echo_of(gen, c, token_text)
            yield chunk(CompletionChoice(index=c.index, text=echo, logprobs=logprobs,
                                         finish_reason=None))
        if not text and not c.finished:
            continue  # tokens whose text is held back: their logprobs go with the next chunk
        yield chunk(CompletionChoice(index=c.index, text=text, finish_reason=c.finish_reason,
                                     logprobs=completion_chunk_logprobs(gen, c, token_text)))
    if include_usage:
        yield CompletionChunk(**head, choices=[], usage=gen.usage()).model_dump()


async def _chat_chunks(gen: Generation, model: str, include_usage: bool) -> AsyncIterator[dict]:
    head = dict(id=f"chatcmpl-{gen.request_id}", created=gen.created, model=model)

    def chunk(choice: ChatChunkChoice) -> dict:
        body = ChatCompletionChunk(**head, choices=[choice]).model_dump(exclude={"usage"})
        body["choices"][0]["delta"] = choice.delta.model_dump(exclude_none=True)
        return {**body, **_usage_fields(gen, include_usage)}

    for c in gen.choices:
        yield chunk(ChatChunkChoice(index=c.index, delta=ChatDelta(role="assistant", content="")))
    token_text = TokenText(gen.engine.tokenizer)
    async for c, text in gen.events():
        if not text and not c.finished:
            continue
        delta = ChatDelta(content=text) if text else ChatDelta()
        yield chunk(ChatChunkChoice(index=c.index, delta=delta, finish_reason=c.finish_reason,
                                    logprobs=chat_choice_logprobs(gen, c, token_text, True)))
    if include_usage:
        yield ChatCompletionChunk(**head, choices=[], usage=gen.usage()).model_dump()


def _completion_response(gen: Generation, model: str) -> CompletionResponse:
    token_text = TokenText(gen.engine.tokenizer)
    return CompletionResponse(
        id=f"cmpl-{gen.request_id}", created=gen.created, model=model, usage=gen.usage(),
        seed=gen.seed, choices=[CompletionChoice(
            index=c.index, text=(gen.echo[c.prompt_index] if gen.echo else "") + c.text,
            logprobs=completion_choice_logprobs(gen, c, token_text),
            finish_reason=c.finish_reason) for c in gen.choices],
    )


def _chat_response(gen: Generation, model: str) -> ChatCompletionResponse:
    token_text = TokenText(gen.engine.tokenizer)
    return ChatCompletionResponse(
        id=f"chatcmpl-{gen.request_id}", created=gen.created, model=model, usage=gen.usage(),
        seed=gen.seed, choices=[ChatChoice(index=c.index, message=AssistantMessage(content=c.text),
                            logprobs=chat_choice_logprobs(gen, c, token_text),
                            finish_reason=c.finish_reason) for c in gen.choices],
    )


# ---------------------------------------------------------------- request counting


class _CountRequests:
    """Pure ASGI middleware: counts /v1 responses by endpoint and status (streams included)."""

    def __init__(self, app: Any, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_status(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            path = scope["path"] if scope["path"] in _ENDPOINTS else "other"
            self.metrics.observe_request(path, status)
