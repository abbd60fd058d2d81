"""A deterministic stand-in for `gearshift.engine.engine.Engine` (same public contract), so the
server can be tested without a model: fast, predictable text, and full control over speed,
admission and failures. It also checks the contract's threading rule (one thread only).

Data flow (tests only): AsyncEngine -> FakeEngine.add_request / step -> StepOutput ->
OutputProcessor (real) with a byte-level tokenizer -> server.

Generated text: each request walks through STORY (bytes, so multi-byte UTF-8 characters
arrive one token at a time), starting at an offset set by the prompt (and by the seed when
sampling), one token per step (`tokens_per_step` for multi-token steps, as speculation).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from gearshift.engine.engine import PromptError
from gearshift.request import SamplingParams, TokenLogprob
from gearshift.scheduler.scheduler import StepOutput
from gearshift.structured.compiler import GrammarCompiler

STORY = "Once upon a time, the fox said héllo to the wörld ✓ and ran away. "
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2
BYTE_OFFSET = 3  # byte b is token id b + 3
VOCAB_SIZE = 256 + BYTE_OFFSET
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def byte_tokenizer():
    """A byte-level `PreTrainedTokenizerFast`: one token per UTF-8 byte, BOS prepended."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=_byte_of)
    vocab = {"<|begin|>": BOS_ID, "<|end|>": EOS_ID, "<|pad|>": PAD_ID}
    vocab.update({ch: _byte_of(ch) + BYTE_OFFSET for ch in alphabet})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|begin|>", "<|end|>", "<|pad|>"])
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin|> $A", special_tokens=[("<|begin|>", BOS_ID)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin|>", eos_token="<|end|>", pad_token="<|pad|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _byte_of(ch: str) -> int:
    """The byte a ByteLevel alphabet character stands for (GPT-2's byte map)."""
    return _GPT2_CHAR_TO_BYTE[ch]


def _gpt2_char_to_byte() -> dict[str, int]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


_GPT2_CHAR_TO_BYTE = _gpt2_char_to_byte()
STORY_TOKENS = [b + BYTE_OFFSET for b in STORY.encode()]


def expected_tokens(prompt: list[int], params: SamplingParams, n: int) -> list[int]:
    """The first `n` tokens FakeEngine generates for this prompt (greedy or seeded)."""
    start = _offset(prompt, params)
    return [STORY_TOKENS[(start + i) % len(STORY_TOKENS)] for i in range(n)]


def fake_logprob(token: int, position: int, n: int) -> TokenLogprob:
    """A made-up but checkable entry: the token's logprob encodes its position (prompt
    positions negative), its alternatives are the next ids: from the token itself when
    generated, after it in the prompt (whose token is not among the N most likely)."""
    value = -1.0 - position / 1000
    if position < 0:
        return TokenLogprob(token, value, [(token + k, value + 0.1 * (n + 1 - k))
                                           for k in range(1, n + 1)])
    return TokenLogprob(token, value, [(token + k, value - k) for k in range(n)])


def expected_text(prompt: list[int], params: SamplingParams, n: int) -> str:
    return bytes(t - BYTE_OFFSET for t in expected_tokens(prompt, params, n)).decode(
        errors="replace"
    )


def _offset(prompt: list[int], params: SamplingParams) -> int:
    base = sum(prompt)
    if params.temperature > 0:
        base += params.seed if params.seed is not None else random.randrange(1 << 30)
    return base % len(STORY_TOKENS)


@dataclass
class _Req:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    offset: int
    generated: list[int] = field(default_factory=list)


class FakeEngine:
    """Engine contract, no model. `step_delay` seconds per step; `paused` blocks admission."""

    def __init__(self, *, max_num_seqs: int = 8, kv_slots: int = 4096, max_model_len: int = 256,
                 step_delay: float = 0.0, tokens_per_step: int = 1, eos_after: int | None = None,
                 model_name: str = "fake-model") -> None:
        self.tokenizer = byte_tokenizer()
        # checks structured-output requests as the engine does (the text is not constrained)
        self.grammars = GrammarCompiler(self.tokenizer, VOCAB_SIZE, (EOS_ID,))
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.vocab_size = VOCAB_SIZE
        self.max_num_seqs = max_num_seqs
        self.kv_slots_total = kv_slots
        self.step_delay = step_delay
        self.tokens_per_step = tokens_per_step
        self.eos_after = eos_after
        self.paused = threading.Event()  # set: no admission (requests stay waiting)
        self.fail_next_step: BaseException | None = None
        self.waiting: list[_Req] = []
        self.running: list[_Req] = []
        self.aborted: list[tuple[str, str]] = []
        self.params_seen: dict[str, SamplingParams] = {}  # request id -> its params
        self._stats = {"steps": 0, "tokens_generated": 0}
        self.prefix_cache_resets = 0
        self._thread: int | None = None

    # ---------------------------------------------------------------- contract
    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams) -> None:
        self._check_thread()
        if not prompt_token_ids:
            raise PromptError("the prompt is empty")
        bad = [t for t in prompt_token_ids if not 0 <= t < VOCAB_SIZE]
        if bad:
            raise PromptError(f"prompt token id {bad[0]} is out of range [0, {VOCAB_SIZE})")
        if len(prompt_token_ids) + params.max_tokens > self.max_model_len:
            raise PromptError("prompt + max_tokens exceeds the maximum context length")
        offset = _offset(prompt_token_ids, params)
        self.params_seen[request_id] = params
        self.waiting.append(_Req(request_id, list(prompt_token_ids), params, offset))

    def abort_request(self, request_id: str, reason: str = "abort") -> None:
        self._check_thread()
        for queue in (self.running, self.waiting):
            for r in queue:
                if r.request_id == request_id:
                    queue.remove(r)
                    self.aborted.append((request_id, reason))
                    return

    def step(self, emit=None) -> list[StepOutput]:
        self._check_thread()
        if self.fail_next_step is not None:
            err, self.fail_next_step = self.fail_next_step, None
            raise err
        if self.step_delay:
            time.sleep(self.step_delay)
        self._admit()
        outputs = []
        for r in list(self.running):
            new = [] if r.params.max_tokens == 0 else self._next_tokens(r)
            first = not r.generated
            r.generated += new
            finished, reason = self._finished(r)
            if finished:
                self.running.remove(r)
            out = StepOutput(r.request_id, new, finished, reason)
            if r.params.logprobs is not None:
                out.logprobs = [fake_logprob(t, len(r.generated) - len(new) + i, r.params.logprobs)
                                for i, t in enumerate(new)]
            if r.params.prompt_logprobs is not None and first:
                out.prompt_logprobs = [None] + [fake_logprob(t, -i, r.params.prompt_logprobs)
                                                for i, t in enumerate(r.prompt[1:], 1)]
            outputs.append(out)
        self._stats["steps"] += 1
        self._stats["tokens_generated"] += sum(len(o.new_token_ids) for o in outputs)
        return outputs

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def reset_prefix_cache(self) -> int:
        self.prefix_cache_resets += 1
        return 0

    def memory_stats(self) -> dict:
        used = sum(len(r.prompt) + len(r.generated) for r in self.running)
        return {"kv_slots_total": self.kv_slots_total, "kv_slots_free": self.kv_slots_total - used,
                "kv_slots_cached": 0}

    def num_running(self) -> int:
        return len(self.running)

    def num_waiting(self) -> int:
        return len(self.waiting)

    def stats(self) -> dict:
        by_k = {self.tokens_per_step - 1: self._stats["steps"]}
        return dict(self._stats, steps_by_k=by_k, spec={"steps_by_k": by_k})

    # ---------------------------------------------------------------- test helpers
    def live_request_ids(self) -> set[str]:
        return {r.request_id for r in self.running + self.waiting}

    # ---------------------------------------------------------------- internals
    def _admit(self) -> None:
        if self.paused.is_set():
            return
        while self.waiting and len(self.running) < self.max_num_seqs:
            self.running.append(self.waiting.pop(0))

    def _next_tokens(self, r: _Req) -> list[int]:
        left = r.params.max_tokens - len(r.generated)
        tokens = []
        for _ in range(min(self.tokens_per_step, left)):
            i = len(r.generated) + len(tokens)
            if self.eos_after is not None and i >= self.eos_after and not r.params.ignore_eos:
                tokens.append(EOS_ID)
                break
            tok = STORY_TOKENS[(r.offset + i) % len(STORY_TOKENS)]
            tokens.append(tok)
            if r.params.stop_token_ids and tok in r.params.stop_token_ids:
                break
        return tokens

    def _finished(self, r: _Req) -> tuple[bool, str | None]:
        if r.params.max_tokens == 0:
            return True, "length"
        last = r.generated[-1] if r.generated else None
        if last == EOS_ID and not r.params.ignore_eos:
            return True, "stop"
        if r.params.stop_token_ids and last in r.params.stop_token_ids:
            return True, "stop"
        if len(r.generated) >= r.params.max_tokens:
            return True, "length"
        return False, None

    def _check_thread(self) -> None:
        me = threading.get_ident()
        if self._thread is None:
            self._thread = me
        assert self._thread == me, "FakeEngine called from two threads (the Engine is not thread-safe)"


@contextmanager
def fake_server(*, api_key: str | None = None, max_waiting: int = 512,
                max_body_bytes: int = 1 << 20, limits: dict | None = None,
                **engine_kwargs) -> Iterator[FakeServer]:
    """A live uvicorn server on a free 127.0.0.1 port serving a FakeEngine."""
    from gearshift.frontend.async_engine import AsyncEngine
    from gearshift.server.app import build_app
    from gearshift.server.background import BackgroundServer

    engine = FakeEngine(**engine_kwargs)
    async_engine = AsyncEngine(engine)
    app = build_app(async_engine, api_key=api_key, max_waiting=max_waiting,
                    max_body_bytes=max_body_bytes)
    with BackgroundServer(app, **(limits or {})) as srv:
        yield FakeServer(srv.base_url, engine, async_engine)


@dataclass
class FakeServer:
    base_url: str
    engine: FakeEngine
    async_engine: object

    def metric(self, name: str) -> float:
        """One unlabelled sample of GET /metrics."""
        import httpx

        for line in httpx.get(self.base_url + "/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until the engine holds no request and the metrics show every KV slot free."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (not self.engine.live_request_ids()
                    and self.metric("gearshift_kv_slots_free")
                    == self.metric("gearshift_kv_slots_total")):
                return
            time.sleep(0.02)
        raise AssertionError(f"engine not idle: live={self.engine.live_request_ids()}")
