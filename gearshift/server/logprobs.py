"""Log-probabilities in the OpenAI wire formats, from the engine's TokenLogprobs (the
target's log_softmax of the raw logits):

    /v1/completions        {"tokens", "token_logprobs", "top_logprobs", "text_offset"},
                           parallel lists; with echo the prompt's tokens come first, the
                           first with null logprobs; each top_logprobs dict holds the
                           position's token and the N most likely; text_offset indexes the
                           returned text (text_offsets.py)
    /v1/chat/completions   {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}

A token's text is the tokenizer's decoding of that token alone (a piece of a multi-byte
character decodes to U+FFFD); without a tokenizer it is "token_id:N".

Data flow: Generation (choices' TokenLogprobs) -> completion_logprobs / chat_logprobs ->
response bodies and stream chunks (app.py).
"""

from __future__ import annotations

from gearshift.request import TokenLogprob
from gearshift.server.protocol import ChatLogprobs, CompletionLogprobs, TokenLogprobEntry, TopLogprob
from gearshift.server.text_offsets import OffsetWalker, clip


class TokenText:
    """Token id -> its text, decoded once per id."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = (
                self.tokenizer.decode([token_id]) if self.tokenizer is not None
                else f"token_id:{token_id}")
        return text


def completion_logprobs(entries: list[TokenLogprob | None], text: TokenText, offsets: list[int],
                        prompt_ids: list[int] | None = None) -> CompletionLogprobs:
    """entries (None: a position without logprobs, the prompt's first); `prompt_ids` names
    the tokens of None entries; `offsets`: each token's text offset (text_offsets.py)."""
    out = CompletionLogprobs(text_offset=list(offsets))
    for i, e in enumerate(entries):
        out.tokens.append(text(e.token_id if e is not None else prompt_ids[i]))
        out.token_logprobs.append(e.logprob if e is not None else None)
        out.top_logprobs.append(top_with_token(e, text) if e is not None else None)
    return out


def top_with_token(e: TokenLogprob, text: TokenText) -> dict[str, float]:
    """The position's token first, then the N most likely (OpenAI's completions: "up to
    logprobs + 1 elements", as vLLM): the token is there whatever its rank. Two ids that
    decode alike share a key; the position's token keeps its own value."""
    top = {text(e.token_id): e.logprob}
    for t, v in e.top:
        top.setdefault(text(t), v)
    return top


class PlainWalker:
    """Without a tokenizer: offsets of the tokens' own strings ("token_id:N") end to end."""

    def __init__(self, text: TokenText, start: int = 0) -> None:
        self.text, self.pos = text, start

    def feed(self, ids: list[int]) -> list[int]:
        out = []
        for token_id in ids:
            out.append(self.pos)
            self.pos += len(self.text(token_id))
        return out


def chat_logprobs(entries: list[TokenLogprob], text: TokenText) -> ChatLogprobs:
    def top(token_id: int, logprob: float) -> TopLogprob:
        s = text(token_id)
        return TopLogprob(token=s, logprob=logprob, bytes=list(s.encode("utf-8")))

    return ChatLogprobs(content=[
        TokenLogprobEntry(**top(e.token_id, e.logprob).model_dump(),
                          top_logprobs=[top(t, v) for t, v in e.top])
        for e in entries])


# ---------------------------------------------------------------- per choice (app.py)


def wants_logprobs(gen, c) -> bool:
    return gen.params[c.index].logprobs is not None


def echo_of(gen, c, text: TokenText) -> tuple[str, CompletionLogprobs | None]:
    """With echo: the choice's prompt text and, with logprobs, the prompt's entries."""
    echo = gen.echo[c.prompt_index]
    if not wants_logprobs(gen, c):
        return echo, None
    prompt = gen.prompts[c.prompt_index]
    entries = c.prompt_logprobs or [None] * len(prompt)
    offsets = (gen.echo_offsets[c.prompt_index] if gen.echo_offsets is not None
               else PlainWalker(text).feed(prompt))
    return echo, completion_logprobs(entries, text, offsets, prompt)


def generated_offsets(gen, c, text: TokenText, entries: list[TokenLogprob]) -> list[int]:
    """The offsets of the choice's next generated tokens `entries`, after the echoed prompt;
    a finished choice's stay within its text."""
    start = len(gen.echo[c.prompt_index]) if gen.echo is not None else 0
    if c.offset_walker is None:
        c.offset_walker = (OffsetWalker(text.tokenizer, start) if text.tokenizer is not None
                           else PlainWalker(text, start))
    offsets = c.offset_walker.feed([e.token_id for e in entries])
    return clip(offsets, start + len(c.text)) if c.finished else offsets


def completion_choice_logprobs(gen, c, text: TokenText) -> CompletionLogprobs | None:
    """A whole choice: the prompt's entries first with echo, then the generated tokens'."""
    if not wants_logprobs(gen, c):
        return None
    out = completion_logprobs(c.logprobs, text, generated_offsets(gen, c, text, c.logprobs))
    if gen.echo is None:
        return out
    _, prompt = echo_of(gen, c, text)
    for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        setattr(out, name, getattr(prompt, name) + getattr(out, name))
    return out


def take_unsent(c) -> list[TokenLogprob]:
    """The choice's token entries not streamed yet (they go out with the next chunk)."""
    entries, c.unsent_logprobs = c.unsent_logprobs, []
    return entries


def completion_chunk_logprobs(gen, c, text: TokenText) -> CompletionLogprobs | None:
    """A stream chunk's: the tokens since the last chunk, offsets into the whole text."""
    if not wants_logprobs(gen, c):
        return None
    entries = take_unsent(c)
    return completion_logprobs(entries, text, generated_offsets(gen, c, text, entries))


def chat_choice_logprobs(gen, c, text: TokenText, streaming: bool = False) -> ChatLogprobs | None:
    if not wants_logprobs(gen, c):
        return None
    return chat_logprobs(take_unsent(c) if streaming else c.logprobs, text)
