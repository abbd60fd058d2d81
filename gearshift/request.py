"""Requests and their results: what the user asks for (SamplingParams), the engine's
per-request state (Request), and what comes back (RequestOutput).

Data flow: LLM.generate / server -> Request -> Scheduler (waiting, running) -> RequestOutput.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gearshift.structured.params import StructuredOutput

if TYPE_CHECKING:
    from gearshift.structured.matcher import RequestGrammar

INT32_MAX = 2**31 - 1  # counts and token ids: what the engine stages as int32 / int64
MAX_LOGPROBS = 20  # most alternatives per position a request may ask for (as OpenAI)
LOGIT_BIAS_LIMIT = 100.0  # logit_bias values are clamped to [-100, 100] (as OpenAI)
SPEC_SAMPLING = ("coupled", "rejection")  # how speculation verifies sampled tokens


class SamplingParamsError(ValueError):
    """Raised for sampling parameters out of range; the message names the field."""


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    speculative: bool = True  # False: this request never speculates (plain decode)
    # penalties over the logits before temperature (runner/penalties.py): presence and
    # frequency over generated tokens (OpenAI), repetition over prompt + generated (HF)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0  # EOS and stop_token_ids are masked until this many tokens exist
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    # log-probabilities (of the raw logits): the sampled token's and the `logprobs` most
    # likely per generated token; `prompt_logprobs` the same for every prompt token
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # the output must match this (a JSON schema, regex, grammar, ...): structured/
    structured_output: StructuredOutput | None = None
    # how speculation verifies this request's sampled tokens: "coupled" (the text plain
    # decoding with its seed gives), "rejection" (its distribution); None: the engine's
    spec_sampling: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or not 0 <= self.max_tokens <= INT32_MAX:
            raise SamplingParamsError(f"max_tokens must be an integer in [0, {INT32_MAX}], "
                                      f"got {self.max_tokens!r}")
        if not 0.0 <= float(self.temperature) <= 100.0:
            raise SamplingParamsError(f"temperature must be in [0, 100], got {self.temperature!r}")
        if not 0.0 < float(self.top_p) <= 1.0:
            raise SamplingParamsError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k != -1) \
                or self.top_k > INT32_MAX:
            raise SamplingParamsError(f"top_k must be -1 (off) or in [1, vocabulary size], "
                                      f"got {self.top_k!r}")
        if self.seed is not None and (not isinstance(self.seed, int)
                                      or not -(2**63) <= self.seed < 2**63):
            raise SamplingParamsError(f"seed must be a 64-bit integer, got {self.seed!r}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None and any(not isinstance(s, str) or not s for s in self.stop):
            raise SamplingParamsError("stop must be a non-empty string or list of non-empty strings")
        if self.stop_token_ids is not None and any(
            not isinstance(t, int) or not 0 <= t <= INT32_MAX for t in self.stop_token_ids
        ):
            raise SamplingParamsError("stop_token_ids must be a list of token ids")
        self._check_penalties()
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(self, name)
            if n is not None and (not isinstance(n, int) or not 0 <= n <= MAX_LOGPROBS):
                raise SamplingParamsError(f"{name} must be an integer in [0, {MAX_LOGPROBS}], "
                                          f"got {n!r}")
        if self.spec_sampling not in SPEC_SAMPLING + (None,):
            raise SamplingParamsError(f"spec_sampling must be one of {', '.join(SPEC_SAMPLING)} "
                                      f"or None, got {self.spec_sampling!r}")
        so = self.structured_output
        if so is not None and not isinstance(so, StructuredOutput):
            raise SamplingParamsError(f"structured_output must be a StructuredOutput, got {so!r}")

    def _check_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not -2.0 <= v <= 2.0:
                raise SamplingParamsError(f"{name} must be in [-2, 2], got {v!r}")
        rp = self.repetition_penalty
        if not isinstance(rp, (int, float)) or not 0.0 < rp <= 100.0:
            raise SamplingParamsError(f"repetition_penalty must be in (0, 100], got {rp!r}")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise SamplingParamsError(
                f"min_tokens must be an integer in [0, max_tokens], got {self.min_tokens!r}")
        if self.logit_bias:
            bias = {}
            for tok, v in self.logit_bias.items():
                tok = int(tok) if isinstance(tok, str) and tok.isdigit() else tok
                if not isinstance(tok, int) or tok < 0 or not isinstance(v, (int, float)) \
                        or not math.isfinite(v):
                    raise SamplingParamsError(
                        "logit_bias must map non-negative token ids to finite numbers")
                bias[tok] = min(max(float(v), -LOGIT_BIAS_LIMIT), LOGIT_BIAS_LIMIT)
            self.logit_bias = bias

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_counts(self) -> bool:
        """A penalty that reads the request's token counts."""
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)

    @property
    def processes_logits(self) -> bool:
        """Anything that changes the logits before sampling (penalties, bias, min_tokens)."""
        return self.uses_counts or bool(self.logit_bias) or self.min_tokens > 0


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued; holds no KV slots
    RUNNING = "running"  # admitted; owns KV slots for its computed tokens
    FINISHED = "finished"


@dataclass(slots=True)
class Request:
    """Engine-side state of one sequence. Each field has one writer, named beside it:
    the engine (at arrival), the scheduler (planning, booking and commit), the batch
    builder (allocation) or the speculative runner (the draft's state, acceptance
    counters)."""

    request_id: str  # engine
    prompt_token_ids: list[int]  # engine
    params: SamplingParams  # engine
    sampling_seed: int  # engine: params.seed (or one drawn at arrival) mixed to 32 bits
    eos_token_ids: tuple[int, ...] = ()  # engine
    # scheduler: committed tokens, and placeholders -(tag + index + 1) for tokens still
    # being sampled (engine/overlap.py) until their step commits
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING  # scheduler
    num_computed_tokens: int = 0  # scheduler: tokens whose KV is in the cache (or booked)
    # batch builder appends the slots it allocates; scheduler keeps / frees them at commit
    slots: list[int] = field(default_factory=list)  # KV slot per computed token
    req_pool_index: int = -1  # batch builder allocates, scheduler frees: req_to_token row
    finish_reason: str | None = None  # scheduler: "length" | "stop" | "abort"
    spec_proposed: int = 0  # speculative runner: draft tokens sent to verification
    spec_accepted: int = 0  # speculative runner: of which the target accepted
    # scheduler (planning): decode steps planned with K > 0, and how many at each K (0 too)
    spec_verify_steps: int = 0
    spec_k_hist: dict[int, int] = field(default_factory=dict)
    spec_proposer_hist: dict[str, int] = field(default_factory=dict)  # ... by proposer (K > 0)
    spec_alpha_num: float = 0.0  # speculative runner: EMA of accepted drafts
    spec_alpha_den: float = 0.0  # speculative runner: EMA of accepted drafts + rejections
    draft_rows: int = 0  # speculative runner: rows the draft has computed (scheduler resets)
    num_pending: int = 0  # scheduler: sampled tokens not committed yet (placeholders)
    closing: bool = False  # scheduler: its last token (by length) is still being sampled
    prompt_logprobs_planned: int = 0  # batch builder: prompt positions 1.. asked for so far
    # engine: the prompt's log-probabilities as steps read them (position 0 has none)
    prompt_logprobs: list[TokenLogprob] | None = None
    prompt_logprobs_sent: bool = False  # engine: handed to an output already
    # from params at construction: read for every request of every step, where the
    # SamplingParams properties cost ten times more
    processes_logits: bool = field(init=False)
    wants_logprobs: bool = field(init=False)

    # scheduler: the prefix-cache node its cached prefix ends at (held while it runs), and
    # the prompt tokens the cache served at its first admission (usage reporting)
    cache_node: object | None = None
    num_cached_tokens: int = 0
    # engine (at arrival, from params.structured_output); the scheduler advances it over
    # every committed token
    grammar: RequestGrammar | None = None
    # engine (at arrival): speculation verifies it by coupling (params.spec_sampling, else
    # the engine's spec_sampling)
    coupled: bool = False
    arrival_time: float = 0.0  # engine (at arrival): perf_counter; the step trace's waits

    def __post_init__(self) -> None:
        p = self.params
        self.processes_logits = p.processes_logits
        self.wants_logprobs = p.logprobs is not None or p.prompt_logprobs is not None

    def wants_prompt_logprobs(self, prefix: int, n: int) -> bool:
        """Does computing tokens prefix..prefix+n-1 yield prompt logprobs not asked for yet?
        (the logits at position t score prompt token t + 1)"""
        if self.params.prompt_logprobs is None:
            return False
        return min(prefix + n, len(self.prompt_token_ids) - 1) > max(
            prefix, self.prompt_logprobs_planned)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """all_token_ids[start:end] without concatenating prompt and output."""
        p = len(self.prompt_token_ids)
        if start >= p:
            return self.output_token_ids[start - p:end - p]
        if end <= p:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - p]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens only
    text: str
    finish_reason: str | None  # "length" | "stop" | None while running
    finished: bool = False
    spec: SpecCounts | None = None  # speculation counters (None when not speculating)
    logprobs: list[TokenLogprob] | None = None  # per generated token (params.logprobs set)
    # per prompt token, None for the first (params.prompt_logprobs set)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # the seed it sampled with (params.seed, or the one drawn at arrival): generating
    # again with SamplingParams(seed=this) gives the same text
    seed: int | None = None


@dataclass(slots=True)
class TokenLogprob:
    """log_softmax of the target's raw logits (before temperature, penalties and bias) at
    one position: the token there and the most likely tokens, best first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), `logprobs` of them


@dataclass(slots=True)
class SpecCounts:
    proposed: int  # draft tokens verified for this request
    accepted: int  # draft tokens the target accepted
    verify_steps: int = 0  # decode steps that verified drafts for it (K > 0)
    k_hist: dict[int, int] = field(default_factory=dict)  # decode steps by the K it was given
    # VERIFY steps by the proposer that drafted for it (eagle3, suffix, ...)
    proposer_hist: dict[str, int] = field(default_factory=dict)
