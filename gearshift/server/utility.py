"""The routes beside the OpenAI API that vLLM users reach for: one model's card, the
tokenizer both ways, and the version. Behind the API key like /v1.

    GET  /v1/models/{id}   the served model's card; 404 naming any other id
    POST /tokenize         {"prompt" | "messages", "add_special_tokens"} ->
                           {"tokens", "count", "max_model_len", "token_strs"}
    POST /detokenize       {"tokens"} -> {"prompt"}; 400 for ids outside the vocabulary
                           (both also under /v1, where a client's base URL points)
    GET  /version          {"version"}

Data flow: app.build_app -> add_utility_routes(app, ...) -> handlers -> engine.tokenizer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel, Field, model_validator

from gearshift import __version__
from gearshift.frontend.async_engine import EngineDeadError
from gearshift.server.errors import APIError
from gearshift.server.protocol import ChatMessage, ModelCard, _Strict
from gearshift.server.serving import check_model
from gearshift.tokenizer import ChatTemplateError, encode_prompt, render_chat


class TokenizeRequest(_Strict):
    """A prompt, or chat messages rendered by the chat template (as a chat request would)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None  # None: True for a prompt; the template writes them
    add_generation_prompt: bool = True  # messages only
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send either 'prompt' or 'messages'")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]


def add_utility_routes(app: FastAPI, engine: Any, require_key: Callable[[Request], None],
                       read_body: Callable[[Request], Awaitable[dict]],
                       parse: Callable[[type[BaseModel], dict], Any]) -> None:
    """Register the routes on `app`; `read_body` and `parse` are app.py's, so bodies get the
    same limits and errors as /v1."""
    auth = [Depends(require_key)]

    @app.post("/reset_prefix_cache", dependencies=auth)
    async def reset_prefix_cache() -> dict:
        """Admin: drop the cached prefixes no running request holds."""
        try:
            freed = await engine.reset_prefix_cache()
        except EngineDeadError as e:
            raise APIError(503, str(e), code="engine_unavailable") from None
        return {"kv_slots_freed": freed}

    @app.get("/v1/models/{model_id:path}", dependencies=auth)
    async def model_card(model_id: str) -> ModelCard:
        check_model(engine, model_id)
        return ModelCard(id=engine.model_name, max_model_len=engine.max_model_len)

    @app.post("/tokenize", dependencies=auth)
    @app.post("/v1/tokenize", dependencies=auth)
    async def tokenize(request: Request) -> TokenizeResponse:
        req = parse(TokenizeRequest, await read_body(request))
        check_model(engine, req.model)
        tok = _tokenizer(engine, "prompt" if req.prompt is not None else "messages")
        if req.prompt is not None:
            special = True if req.add_special_tokens is None else req.add_special_tokens
            tokens = encode_prompt(tok, req.prompt, special)  # as a completion's prompt
        else:
            try:
                text = render_chat(tok, [m.template_dict() for m in req.messages],
                                   req.add_generation_prompt)
            except ChatTemplateError as e:
                raise APIError(400, str(e), param="messages", code=e.code) from None
            tokens = tok.encode(text, add_special_tokens=bool(req.add_special_tokens))
        tokens = list(tokens)
        strs = tok.convert_ids_to_tokens(tokens) if req.return_token_strs else None
        return TokenizeResponse(count=len(tokens), max_model_len=engine.max_model_len,
                                tokens=tokens, token_strs=strs)

    @app.post("/detokenize", dependencies=auth)
    @app.post("/v1/detokenize", dependencies=auth)
    async def detokenize(request: Request) -> dict:
        req = parse(DetokenizeRequest, await read_body(request))
        check_model(engine, req.model)
        tok = _tokenizer(engine, "tokens")
        vocab = len(tok)
        bad = next((t for t in req.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is outside the tokenizer's vocabulary "
                           f"[0, {vocab})", param="tokens", code="invalid_value")
        return {"prompt": tok.decode(req.tokens)}

    @app.get("/version", dependencies=auth)
    async def version() -> dict:
        return {"version": __version__}


def _tokenizer(engine: Any, param: str):
    if engine.tokenizer is None:
        raise APIError(400, "this model has no tokenizer", param=param, code="no_tokenizer")
    return engine.tokenizer
