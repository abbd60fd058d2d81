"""Log-probabilities in the OpenAI wire formats, from the engine's TokenLogprobs (the
target's log_softmax of the raw logits):

    /v1/completions        {"tokens", "token_logprobs", "top_logprobs", "text_offset"},
                           parallel lists; with echo the prompt's tokens come first, the
                           first with null logprobs
    /v1/chat/completions   {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}

A token's text is the tokenizer's decoding of that token alone (a piece of a multi-byte
character decodes to U+FFFD); without a tokenizer it is "token_id:N".

Data flow: Generation (choices' TokenLogprobs) -> completion_logprobs / chat_logprobs ->
response bodies and stream chunks (app.py).
"""

from __future__ import annotations

from gearshift.request import TokenLogprob
from gearshift.server.protocol import ChatLogprobs, CompletionLogprobs, TokenLogprobEntry, TopLogprob


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


def completion_logprobs(entries: list[TokenLogprob | None], text: TokenText,
                        offset: int = 0, prompt_ids: list[int] | None = None) -> CompletionLogprobs:
    """entries (None: a position without logprobs, the prompt's first); `prompt_ids` names
    the tokens of None entries; `offset`: the text offset of the first token."""
    out = CompletionLogprobs()
    for i, e in enumerate(entries):
        tok = text(e.token_id if e is not None else prompt_ids[i])
        out.tokens.append(tok)
        out.token_logprobs.append(e.logprob if e is not None else None)
        out.top_logprobs.append({text(t): v for t, v in e.top} if e is not None else None)
        out.text_offset.append(offset)
        offset += len(tok)
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
    if not wants_logprobs(gen, c):
        return gen.echo[c.prompt_index], None
    prompt = gen.prompts[c.prompt_index]
    entries = c.prompt_logprobs or [None] * len(prompt)
    return gen.echo[c.prompt_index], completion_logprobs(entries, text, 0, prompt)


def completion_choice_logprobs(gen, c, text: TokenText) -> CompletionLogprobs | None:
    """A whole choice: the prompt's entries first with echo, then the generated tokens'."""
    if not wants_logprobs(gen, c):
        return None
    if gen.echo is None:
        return completion_logprobs(c.logprobs, text)
    prompt_text, prompt = echo_of(gen, c, text)
    out = completion_logprobs(c.logprobs, text, len(prompt_text))
    for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        setattr(out, name, getattr(prompt, name) + getattr(out, name))
    return out


def take_unsent(c) -> list[TokenLogprob]:
    """The choice's token entries not streamed yet (they go out with the next chunk)."""
    entries, c.unsent_logprobs = c.unsent_logprobs, []
    return entries


def completion_chunk_logprobs(gen, c, text: TokenText, new_text: str) -> CompletionLogprobs | None:
    """A stream chunk's: the tokens since the last chunk, offsets into the whole text."""
    if not wants_logprobs(gen, c):
        return None
    start = len(c.text) - len(new_text) + (len(gen.echo[c.prompt_index]) if gen.echo else 0)
    return completion_logprobs(take_unsent(c), text, start)


def chat_choice_logprobs(gen, c, text: TokenText, streaming: bool = False) -> ChatLogprobs | None:
    if not wants_logprobs(gen, c):
        return None
    return chat_logprobs(take_unsent(c) if streaming else c.logprobs, text)
