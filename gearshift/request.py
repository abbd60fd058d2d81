"""Requests and their results: what the user asks for (SamplingParams), the engine's
per-request state (Request), and what comes back (RequestOutput).

Data flow: LLM.generate / server -> Request -> Scheduler (waiting, running) -> RequestOutput.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

INT32_MAX = 2**31 - 1  # counts and token ids: what the engine stages as int32 / int64


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

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or not 1 <= self.max_tokens <= INT32_MAX:
            raise SamplingParamsError(f"max_tokens must be an integer in [1, {INT32_MAX}], "
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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued; holds no KV slots
    RUNNING = "running"  # admitted; owns KV slots for its computed tokens
    FINISHED = "finished"


@dataclass(slots=True)
class Request:
    """Engine-side state of one sequence. Each field has one writer, named beside it:
    the engine (at arrival), the scheduler (planning, booking and commit), the batch
    builder (allocation), the speculative runner (the draft's state, acceptance counters)
    or the output processor (stop strings)."""

    request_id: str  # engine
    prompt_token_ids: list[int]  # engine
    params: SamplingParams  # engine
    sampling_seed: int  # engine: params.seed, or one drawn at arrival
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
    stop_text_len: int | None = None  # output processor: set when a stop string matched
    arrival_index: int = 0  # scheduler: FIFO order; preemption takes the newest
    spec_proposed: int = 0  # speculative runner: draft tokens sent to verification
    spec_accepted: int = 0  # speculative runner: of which the target accepted
    spec_alpha_num: float = 0.0  # speculative runner: EMA of accepted drafts
    spec_alpha_den: float = 0.0  # speculative runner: EMA of accepted drafts + rejections
    draft_rows: int = 0  # speculative runner: rows the draft has computed (scheduler resets)
    num_pending: int = 0  # scheduler: sampled tokens not committed yet (placeholders)
    closing: bool = False  # scheduler: its last token (by length) is still being sampled

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


@dataclass(slots=True)
class SpecCounts:
    proposed: int  # draft tokens verified for this request
    accepted: int  # draft tokens the target accepted
