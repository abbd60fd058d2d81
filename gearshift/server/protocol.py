"""OpenAI wire format: pydantic models for the request bodies the server accepts and the
response bodies it returns. Validation here is structural (types, ranges, unsupported
options); checks that need the model (context length, token ids) happen in app.py.

Data flow: HTTP body -> CompletionRequest / ChatCompletionRequest -> SamplingParams ->
AsyncEngine; RequestDelta -> *Response / *Chunk -> HTTP body.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from gearshift.server.openai_fields import drop_neutral
from gearshift.structured.params import MAX_CHOICES

MAX_N = 64  # most choices (n x prompts) one request may ask for
MAX_STOP = 16  # most stop strings
MAX_STOP_CHARS = 1024  # longest stop string
MAX_STOP_TOKEN_IDS = 256  # most stop token ids
MAX_LOGIT_BIAS = 300  # most logit_bias entries (as OpenAI)
INT32_MAX = 2**31 - 1  # counts and token ids (the engine stages them as int32 / int64)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # seeds
MAX_LOGPROBS = 20  # most alternatives per token (logprobs / top_logprobs)


class _Strict(BaseModel):
    """Strict JSON types: "10" is not an int, 1 is not a bool; unknown keys are refused (as
    the OpenAI API refuses them), OpenAI fields Gearshift does not implement too unless at
    their neutral value (openai_fields.py); an explicit null means "the default" (as
    clients send for unset options)."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _unimplemented_openai_fields(cls, data: Any) -> Any:
        return drop_neutral(cls.__name__, data, cls.model_fields)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: with include_usage, every chunk's counts so far


class JsonSchemaFormat(_Strict):
    name: str = Field("response", max_length=256)  # a label, as in OpenAI's API
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None  # the schema is always enforced


class ResponseFormat(_Strict):
    """OpenAI's response_format (chat; an extension in completions, as in vLLM)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_for_json_schema(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise ValueError("type 'json_schema' needs json_schema.schema")
        return self


class StructuredOutputs(_Strict):
    """vLLM's structured_outputs extension: exactly one constraint (serving checks it)."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")  # a JSON schema
    regex: str | None = None
    choice: list[str] | None = Field(None, max_length=MAX_CHOICES)
    grammar: str | None = None  # EBNF (xgrammar's GBNF-style syntax, a `root` rule)
    json_object: bool | None = None


class _SamplingFields(_Strict):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1, le=INT32_MAX)  # extension; -1 or 0: off; <= vocab (serving)
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: str | list[str] | None = None
    # extension (as in vLLM); ids must be in the vocabulary (serving)
    stop_token_ids: list[int] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    ignore_eos: bool = False  # extension
    speculative: bool | None = None  # extension; False opts this request out of speculation
    # extension: how speculation verifies sampled tokens; "coupled" keeps a seed's plain text
    spec_sampling: Literal["coupled", "rejection"] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)  # over generated tokens
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None  # token id -> bias, clamped to [-100, 100]
    repetition_penalty: float = Field(1.0, gt=0.0, le=100.0)  # extension (HF semantics)
    min_tokens: int = Field(0, ge=0, le=INT32_MAX)  # extension: EOS and stop ids masked until then
    response_format: ResponseFormat | None = None  # completions: an extension
    structured_outputs: StructuredOutputs | None = None  # extension (vLLM's convention)

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, v: str | list[str] | None) -> list[str] | None:
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else v
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings are allowed")
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        if any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"stop strings must be at most {MAX_STOP_CHARS} characters")
        return stops or None

    @field_validator("stop_token_ids")
    @classmethod
    def _check_stop_ids(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(not 0 <= t <= INT32_MAX for t in v):
            raise ValueError("stop_token_ids must be token ids (non-negative, in the vocabulary)")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _check_logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v and any(not k.isdigit() or len(k) > 10 for k in v):
            raise ValueError("logit_bias keys must be token ids (strings of digits)")
        if v and len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias may hold at most {MAX_LOGIT_BIAS} entries")
        return v

    @property
    def include_usage_in_stream(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage_in_stream(self) -> bool:
        return self.include_usage_in_stream and self.stream_options.continuous_usage_stats


class CompletionRequest(_SamplingFields):
    """POST /v1/completions. A prompt is a string, a list of token ids, or a batch of either."""

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False  # the prompt (and with logprobs its logprobs) before the completion
    max_tokens: int | None = Field(16, ge=0, le=INT32_MAX)  # 0: with echo, the prompt scored alone
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # alternatives per token
    add_special_tokens: bool = True  # vLLM's: the tokenizer's BOS before a text prompt
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix is not supported")
        return v

    @field_validator("max_tokens")
    @classmethod
    def _zero_with_echo(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v == 0 and not info.data.get("echo"):
            raise ValueError("max_tokens must be at least 1 (0 only with echo: true)")
        return v

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v: str | list) -> str | list:
        if v == "" or v == [] or (isinstance(v, list) and any(p == "" or p == [] for p in v)):
            raise ValueError("prompt must not be empty")
        return v

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of is not supported (it must be null or equal to n)")
        if len(self.prompts) * self.n > MAX_N:
            raise ValueError(f"n times the number of prompts must be at most {MAX_N}")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """The batch of prompts: each a string or a list of token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = Field(None, validate_default=True)
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _content_required(cls, v: str | list | None, info: ValidationInfo) -> str | list | None:
        role = info.data.get("role")
        if v is None and role in ("system", "developer", "user"):
            raise ValueError(f"a {role} message needs 'content'")
        return v

    def template_dict(self) -> dict:
        """The message as chat templates read it."""
        out = {"role": self.role, "content": self.text()}
        return out | {"name": self.name} if self.name is not None else out

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions. The prompt is the tokenizer's chat template over messages."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Any] | None = None
    add_generation_prompt: bool = True  # extension
    safety_identifier: str | None = None  # an end-user id for the provider's abuse checks, as user

    @model_validator(mode="after")
    def _check_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, v: list | None) -> list | None:
        if v:
            raise ValueError("tools are not supported")
        return v

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens else self.max_tokens


# ---------------------------------------------------------------- responses


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens served from the prefix cache


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class CompletionLogprobs(BaseModel):
    """Legacy completions format: parallel lists over the choice's tokens (the prompt's
    first with echo, whose first token has no logprob)."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    seed: int | None = None  # extension: the request's seed, given or drawn (serving.py)


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprobEntry(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[TokenLogprobEntry] | None = None
    refusal: list[TokenLogprobEntry] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    seed: int | None = None  # extension: the request's seed, given or drawn (serving.py)


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "gearshift"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
