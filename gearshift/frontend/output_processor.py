"""Incremental, UTF-8-safe detokenisation and stop-string detection (pure CPU).

Data flow: Engine.step() -> StepOutput -> OutputProcessor.process() -> RequestDelta
(new text for streams) ... -> final() -> RequestOutput. Runs beside the engine, not in
its step: the offline LLM calls it between steps, the server on its event-loop side.
When a stop string matches, the caller must abort the request in the engine.

Text held back: a trailing U+FFFD (bytes of an unfinished UTF-8 character) and, while a
stop string could still be forming, the last len(longest stop) - 1 characters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gearshift.request import RequestOutput, SamplingParams, SpecCounts
from gearshift.scheduler.scheduler import StepOutput


@dataclass(slots=True)
class RequestDelta:
    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None
    stop_hit: bool = False  # a stop string matched: abort the request in the engine
    logprobs: list | None = None  # TokenLogprob per new token (params.logprobs set)
    prompt_logprobs: list | None = None  # once, with the first delta (params.prompt_logprobs)
    error: str | None = None  # finish_reason "error": what failed while processing it
    cached_tokens: int = 0  # prompt tokens the prefix cache served


@dataclass(slots=True)
class _State:
    prompt_token_ids: list[int]
    params: SamplingParams
    token_ids: list[int] = field(default_factory=list)
    text: str = ""  # decoded so far (stop-truncated once finished)
    emitted: int = 0  # characters of `text` already handed out
    prefix_offset: int = 0
    read_offset: int = 0
    finished: bool = False
    finish_reason: str | None = None
    spec: tuple | None = None  # speculation counters: SpecCounts' fields
    logprobs: list | None = None  # TokenLogprob per token of token_ids
    prompt_logprobs: list | None = None
    cached_tokens: int = 0  # prompt tokens the prefix cache served
    seed: int | None = None  # what the engine sampled with (add's caller reports it)


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._states: dict[str, _State] = {}

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
            seed: int | None = None) -> None:
        self._states[request_id] = _State(list(prompt_token_ids), params, seed=seed)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._states

    def process(self, out: StepOutput) -> RequestDelta:
        st = self._states[out.request_id]
        if st.finished:  # tokens the engine made before it saw our stop-string abort
            return RequestDelta(out.request_id, [], "", True, st.finish_reason)
        new_ids = list(out.new_token_ids)
        st.token_ids.extend(new_ids)
        st.spec = out.spec
        st.cached_tokens = out.cached_tokens
        if out.logprobs is not None:
            if st.logprobs is None:
                st.logprobs = []
            st.logprobs.extend(out.logprobs)
        if out.prompt_logprobs is not None:
            st.prompt_logprobs = out.prompt_logprobs
        stop_hit = False
        if self.tokenizer is not None:
            new_text = self._decode_new(st)
            st.text += new_text
            stops = st.params.stop or []
            # no stop before min_tokens (as EOS and stop ids, which the sampler masks)
            if stops and new_text and len(st.token_ids) >= st.params.min_tokens:
                window = len(st.text) - len(new_text) - max(map(len, stops)) + 1
                cut = _find_stop(st.text, stops, max(window, 0))
                if cut is not None:
                    st.text = st.text[:cut]
                    stop_hit = True
            if out.finished and not stop_hit:  # flush any held-back partial character
                st.text = self.tokenizer.decode(st.token_ids, skip_special_tokens=True)
        st.finished = out.finished or stop_hit
        st.finish_reason = "stop" if stop_hit else out.finish_reason
        return RequestDelta(out.request_id, new_ids, self._emit(st), st.finished,
                            st.finish_reason, stop_hit, out.logprobs, out.prompt_logprobs,
                            out.error, out.cached_tokens)

    def final(self, request_id: str) -> RequestOutput:
        st = self._states.pop(request_id)
        spec = SpecCounts(*st.spec) if st.spec is not None else None
        return RequestOutput(request_id, st.prompt_token_ids, st.token_ids, st.text,
                             st.finish_reason, st.finished, spec, st.logprobs, st.prompt_logprobs,
                             st.cached_tokens, st.seed)

    def abort(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    # ------------------------------------------------------------------ internals
    def _decode_new(self, st: _State) -> str:
        """vLLM-style incremental decode over a sliding window of token ids."""
        tok = self.tokenizer
        prefix = tok.decode(st.token_ids[st.prefix_offset:st.read_offset],
                            skip_special_tokens=True)
        full = tok.decode(st.token_ids[st.prefix_offset:], skip_special_tokens=True)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            st.prefix_offset, st.read_offset = st.read_offset, len(st.token_ids)
            return full[len(prefix):]
        return ""

    def _emit(self, st: _State) -> str:
        end = len(st.text)
        if not st.finished and st.params.stop:
            end -= max(map(len, st.params.stop)) - 1
        if end <= st.emitted:
            return ""
        chunk = st.text[st.emitted:end]
        st.emitted = end
        return chunk


def _find_stop(text: str, stops: list[str], start: int) -> int | None:
    hits = [i for s in stops if (i := text.find(s, start)) >= 0]
    return min(hits) if hits else None
