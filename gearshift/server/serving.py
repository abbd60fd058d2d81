"""From a validated OpenAI request to engine requests and back: tokenise the prompt(s), check
them against the context, submit one engine request per choice, then assemble a complete
response or a stream of server-sent events.

Data flow: app.py handler -> prepare_* (tokenise, check) -> Generation.submit ->
AsyncEngine (one request per choice, one shared queue) -> Generation.events ->
(choice index, delta) -> JSON body or SSE chunks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gearshift.engine.seeds import SEED_BOUND
from gearshift.frontend.async_engine import (
    AsyncEngine,
    EngineDeadError,
    RequestFailedError,
    StreamFailure,
)
from gearshift.request import SamplingParams, SamplingParamsError
from gearshift.server.errors import APIError
from gearshift.server.metrics import ServerMetrics
from gearshift.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    PromptTokensDetails,
    Usage,
)
from gearshift.server.structured import structured_output
from gearshift.server.text_offsets import prompt_offsets
from gearshift.structured.params import StructuredOutput, StructuredOutputError
from gearshift.tokenizer import encode_prompt

_SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}
SEED_HEADER = "x-gearshift-seed"  # every completion's response: the seed that replays it


@dataclass(slots=True)
class Choice:
    """What one choice (one engine request) produced so far."""

    index: int
    request_id: str
    prompt_index: int
    text: str = ""
    num_tokens: int = 0
    finish_reason: str | None = None
    finished: bool = False
    first_token_time: float | None = None
    logprobs: list = field(default_factory=list)  # TokenLogprob per token (if asked)
    unsent_logprobs: list = field(default_factory=list)  # of those, not streamed yet
    prompt_logprobs: list | None = None  # the prompt's (None first), with echo + logprobs
    num_deltas: int = 0  # deltas received (a stream echoes the prompt before the first)
    cached_tokens: int = 0  # prompt tokens the prefix cache served
    offset_walker: Any = None  # the generated tokens' text offsets so far (logprobs.py)


@dataclass
class Generation:
    """The engine requests behind one HTTP request: prompts x n choices."""

    engine: AsyncEngine
    metrics: ServerMetrics
    prompts: list[list[int]]  # token ids per prompt
    params: list[SamplingParams]  # per choice
    n: int
    seed: int  # the request's (given or drawn): choice i of each prompt samples with seed + i
    echo: list[str] | None = None  # completions with echo: the text of each prompt
    echo_offsets: list[list[int]] | None = None  # with echo + logprobs: its tokens' text offsets
    continuous_usage: bool = False  # a stream whose every chunk carries the usage so far
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    arrival: float = field(default_factory=time.monotonic)
    created: int = field(default_factory=lambda: int(time.time()))
    choices: list[Choice] = field(default_factory=list)
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    _by_id: dict[str, Choice] = field(default_factory=dict)

    async def submit(self) -> None:
        """Add every choice to the engine; on any failure abort those already added."""
        for i in range(len(self.params)):
            c = Choice(index=i, request_id=f"{self.request_id}-{i}", prompt_index=i // self.n)
            self.choices.append(c)
            self._by_id[c.request_id] = c
        results = await asyncio.gather(
            *(
                self.engine.add_request(
                    c.request_id, self.prompts[c.prompt_index], self.params[c.index], self.queue
                )
                for c in self.choices
            ),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            self.abort(count=False)
            err = errors[0]
            if isinstance(err, EngineDeadError):
                raise APIError(503, str(err), code="engine_unavailable")
            if isinstance(err, SamplingParamsError):  # a token id beyond the vocabulary
                raise APIError(400, str(err), code="invalid_value")
            if isinstance(err, StructuredOutputError):  # checked before: a fallback
                raise APIError(400, str(err), code="invalid_value")
            if isinstance(err, ValueError):  # PromptError, SamplingParamsError
                raise APIError(400, str(err), param="prompt", code="invalid_prompt")
            raise err
        self.metrics.prompt_tokens.inc(sum(len(p) for p in self.prompts))

    def abort(self, count: bool = True) -> None:
        """Abort every unfinished choice (client gone, or a failed submit); with `count`,
        each counts in the metrics as finished by "abort", with the tokens it produced."""
        for c in self.choices:
            if not c.finished:
                self.engine.abort(c.request_id)
                if count:
                    self._finish(c, "abort")

    def _observe_failure(self, request_id: str) -> None:
        c = self._by_id.get(request_id)
        if c is not None and not c.finished:
            self._finish(c, "error")

    def _finish(self, c: Choice, reason: str | None) -> None:
        c.finished, c.finish_reason = True, reason
        self.metrics.observe_generation(
            arrival=self.arrival, first_token=c.first_token_time, end=time.monotonic(),
            num_tokens=c.num_tokens, finish_reason=reason,
        )

    @property
    def done(self) -> bool:
        return all(c.finished for c in self.choices)

    async def events(self) -> AsyncIterator[tuple[Choice, str]]:
        """(choice, new text) as deltas arrive, until every choice finished."""
        while not self.done:
            item = await self.queue.get()
            if isinstance(item, StreamFailure):
                if isinstance(item.error, RequestFailedError):
                    self._observe_failure(item.request_id)
                    raise item.error
                raise EngineDeadError(str(item.error)) from item.error
            c = self._by_id.get(item.request_id)
            if c is None or c.finished:
                continue
            now = time.monotonic()
            c.cached_tokens = max(c.cached_tokens, getattr(item, "cached_tokens", 0))
            if item.new_token_ids:
                c.num_tokens += len(item.new_token_ids)
                if c.first_token_time is None:
                    c.first_token_time = now
            c.text += item.new_text
            c.num_deltas += 1
            if getattr(item, "logprobs", None):
                c.logprobs += item.logprobs
                c.unsent_logprobs += item.logprobs
            if getattr(item, "prompt_logprobs", None) is not None:
                c.prompt_logprobs = item.prompt_logprobs
            if item.finished:
                self._finish(c, item.finish_reason)
            yield c, item.new_text

    def usage(self) -> Usage:
        prompt = sum(len(p) for p in self.prompts)
        completion = sum(c.num_tokens for c in self.choices)
        cached = [0] * len(self.prompts)  # per prompt: the most any of its choices reused
        for c in self.choices:
            cached[c.prompt_index] = max(cached[c.prompt_index], c.cached_tokens)
        return Usage(
            prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=sum(cached)),
        )


# ---------------------------------------------------------------- preparation


class Offload:
    """Host work that can take long runs in a small, bounded thread pool instead of on the
    event loop, which must keep every other stream flowing: tokenising a long prompt,
    rendering a chat template, parsing a large body. Short work stays inline (a thread hop
    costs more than it saves)."""

    def __init__(self, workers: int = 2, queue: int = 64, min_chars: int = 4096) -> None:
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gearshift-host")
        self.slots = asyncio.Semaphore(queue)  # jobs in or waiting for the pool, at most
        self.min_chars = min_chars

    async def run(self, size: int, fn, *args):
        """fn(*args), in the pool when `size` (characters or bytes) is large."""
        if size < self.min_chars:
            return fn(*args)
        async with self.slots:
            return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def always(self, fn, *args):
        """fn(*args) in the pool, whatever its input's size (grammar compilation)."""
        async with self.slots:
            return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)



def check_model(engine: AsyncEngine, model: str | None) -> None:
    if model is not None and model != engine.model_name:
        raise APIError(
            404, f"the model {model!r} does not exist; this server serves {engine.model_name!r}",
            param="model", code="model_not_found",
        )


def tokenize_prompt(engine: AsyncEngine, prompt: str | list[int],
                    add_special_tokens: bool = True) -> list[int]:
    if isinstance(prompt, list):
        return list(prompt)
    if engine.tokenizer is None:
        raise APIError(400, "this model has no tokenizer: send the prompt as a list of token ids",
                       param="prompt", code="no_tokenizer")
    try:
        ids = encode_prompt(engine.tokenizer, prompt, add_special_tokens)
    except Exception as e:  # the tokenizer refused the text
        raise APIError(400, f"could not tokenise the prompt: {e}", param="prompt") from None
    if not ids:
        raise APIError(400, "prompt is empty after tokenisation", param="prompt")
    return list(ids)


def chat_prompt(engine: AsyncEngine, req: ChatCompletionRequest) -> list[int]:
    tok = engine.tokenizer
    if tok is None or not getattr(tok, "chat_template", None):
        raise APIError(400, "this model has no chat template: use /v1/completions",
                       param="messages", code="no_chat_template")
    messages = [m.template_dict() for m in req.messages]
    try:
        text = tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=req.add_generation_prompt
        )
    except Exception as e:  # jinja2 errors (e.g. the template's raise_exception)
        raise APIError(400, f"the chat template rejected the messages: {e}",
                       param="messages") from None
    try:
        ids = tok.encode(text, add_special_tokens=False)
    except Exception as e:
        raise APIError(400, f"could not tokenise the chat prompt: {e}", param="messages") from None
    if not ids:
        raise APIError(400, "the chat prompt is empty", param="messages")
    return list(ids)


def check_context(engine: AsyncEngine, prompt_len: int, max_tokens: int | None) -> int:
    """The max_tokens to use (None: the rest of the context); 400 when it does not fit."""
    limit = engine.max_model_len
    if prompt_len >= limit:
        raise APIError(
            400, f"the prompt has {prompt_len} tokens; this model's context is {limit} tokens",
            param="prompt", code="context_length_exceeded",
        )
    if max_tokens is None:
        return limit - prompt_len
    if prompt_len + max_tokens > limit:
        raise APIError(
            400,
            f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) = "
            f"{prompt_len + max_tokens} exceeds this model's context of {limit} tokens",
            param="max_tokens", code="context_length_exceeded",
        )
    return max_tokens


def check_vocab(engine: AsyncEngine, req: CompletionRequest | ChatCompletionRequest) -> None:
    """Token ids and counts in the request must fit the model's vocabulary."""
    vocab = engine.vocab_size
    if req.top_k > vocab:
        raise APIError(400, f"top_k ({req.top_k}) exceeds the vocabulary size {vocab}",
                       param="top_k", code="invalid_value")
    bad = [t for t in req.stop_token_ids or () if t >= vocab]
    if bad:
        raise APIError(400, f"stop_token_ids: {bad[0]} is out of range [0, {vocab})",
                       param="stop_token_ids", code="invalid_value")


def request_seed(req: CompletionRequest | ChatCompletionRequest) -> int:
    """The request's seed, or a fresh one: reported with the response, it replays it."""
    return req.seed if req.seed is not None else secrets.randbelow(SEED_BOUND)


def sampling_params(
    req: CompletionRequest | ChatCompletionRequest, max_tokens: int, choice: int, seed: int,
    structured: StructuredOutput | None = None,
) -> SamplingParams:
    """Params of one choice: choice i samples with seed + i (wrapping within 64 bits);
    `structured`: the request's checked constraint."""
    kwargs: dict[str, Any] = dict(
        max_tokens=max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=-1 if req.top_k in (0, -1) else req.top_k,
        seed=(seed + choice + 2**63) % 2**64 - 2**63,
        stop=list(req.stop) if req.stop else None,
        stop_token_ids=req.stop_token_ids,
        ignore_eos=req.ignore_eos,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty,
        min_tokens=req.min_tokens,
        logit_bias={int(k): v for k, v in req.logit_bias.items()} if req.logit_bias else None,
        structured_output=structured,
        **logprob_fields(req),
    )
    for name in ("speculative", "spec_sampling"):
        if getattr(req, name) is not None and name in _SAMPLING_FIELDS:
            kwargs[name] = getattr(req, name)
    try:
        return SamplingParams(**kwargs)
    except SamplingParamsError as e:
        raise APIError(400, str(e), code="invalid_value") from None


def logprob_fields(req: CompletionRequest | ChatCompletionRequest) -> dict[str, Any]:
    """SamplingParams' logprobs / prompt_logprobs for the request's logprob options."""
    if isinstance(req, ChatCompletionRequest):
        return {"logprobs": req.top_logprobs or 0} if req.logprobs else {}
    if req.logprobs is None:
        return {}
    return {"logprobs": req.logprobs, "prompt_logprobs": req.logprobs if req.echo else None}


def echo_text(engine: AsyncEngine, prompt: str | list[int]) -> str:
    if isinstance(prompt, str):
        return prompt
    return engine.tokenizer.decode(prompt) if engine.tokenizer is not None else ""


async def prepare_completion(engine: AsyncEngine, metrics: ServerMetrics, offload: Offload,
                             req: CompletionRequest) -> Generation:
    check_model(engine, req.model)
    check_vocab(engine, req)
    prompts = [await offload.run(len(p) if isinstance(p, str) else 0, tokenize_prompt, engine, p,
                                 req.add_special_tokens) for p in req.prompts]
    max_tokens = [check_context(engine, len(p), req.max_tokens) for p in prompts]
    structured = await structured_output(engine, offload, req)
    seed = request_seed(req)
    params = [
        sampling_params(req, max_tokens[i // req.n], i % req.n, seed, structured)
        for i in range(len(prompts) * req.n)
    ]
    echo = [echo_text(engine, p) for p in req.prompts] if req.echo else None
    offsets = None
    if req.echo and req.logprobs is not None and engine.tokenizer is not None:
        offsets = [await offload.run(8 * len(ids), prompt_offsets, engine.tokenizer, p, ids,
                                     req.add_special_tokens)
                   for p, ids in zip(req.prompts, prompts)]
    return Generation(engine, metrics, prompts, params, req.n, seed, echo, offsets)


async def prepare_chat(engine: AsyncEngine, metrics: ServerMetrics, offload: Offload,
                       req: ChatCompletionRequest) -> Generation:
    check_model(engine, req.model)
    check_vocab(engine, req)
    size = sum(len(m.text()) for m in req.messages)
    prompt = await offload.run(size, chat_prompt, engine, req)
    max_tokens = check_context(engine, len(prompt), req.max_new_tokens)
    structured = await structured_output(engine, offload, req)
    seed = request_seed(req)
    params = [sampling_params(req, max_tokens, i, seed, structured) for i in range(req.n)]
    return Generation(engine, metrics, [prompt], params, req.n, seed)
