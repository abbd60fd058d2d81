"""`text_offset` of the completions logprobs: where each token's text starts in the choice's
returned text, so that `text[offset[i]:offset[i + 1]]` is token i's share of it.

    echoed prompt, given as text   the tokenizer's offset mapping into that very text: the
                                   tokens it adds (BOS) take no room, at offset 0
    echoed prompt, given as ids    the ids' decoding (the echoed text), decoded piece by piece
    generated tokens               their decoding without special tokens (the output's text),
                                   piece by piece, after the echoed prompt

A token that ends in part of a multi-byte character takes no room: that character counts
from the token that completes it. Offsets never pass the end of the returned text (a stop
string cuts it).

Data flow: serving.prepare_completion (prompt offsets) and logprobs.py (generated tokens,
a stream's chunks in turn) -> CompletionLogprobs.text_offset.
"""

from __future__ import annotations


class OffsetWalker:
    """Offsets of a token sequence fed in parts (a stream's chunks), by the same sliding
    window the output processor decodes with."""

    def __init__(self, tokenizer, start: int = 0, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.pos = start  # the text's length so far
        self.ids: list[int] = []
        self.prefix_offset = self.read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)

    def feed(self, ids: list[int]) -> list[int]:
        """The offsets of `ids`, the sequence's next tokens."""
        out = []
        for token_id in ids:
            out.append(self.pos)
            self.ids.append(token_id)
            prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
            full = self._decode(self.ids[self.prefix_offset:])
            if len(full) > len(prefix) and not full.endswith("\ufffd"):
                self.pos += len(full) - len(prefix)
                self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return out


def prompt_offsets(tokenizer, prompt: str | list[int], ids: list[int],
                   add_special_tokens: bool = True) -> list[int]:
    """Offsets of the prompt's tokens `ids` in its echoed text (`prompt` itself, or the ids'
    decoding when the prompt came as ids)."""
    if isinstance(prompt, str):
        try:
            enc = tokenizer(prompt, add_special_tokens=add_special_tokens,
                            return_offsets_mapping=True)
            got, starts = list(enc["input_ids"]), [a for a, _ in enc["offset_mapping"]]
        except (NotImplementedError, TypeError, ValueError):  # a slow tokenizer: no mapping
            got, starts = [], []
        if got[1:] == list(ids):  # encode_prompt dropped a doubled BOS
            got, starts = got[1:], starts[1:]
        if got == list(ids):
            return starts
        return clip(OffsetWalker(tokenizer).feed(ids), len(prompt))
    return OffsetWalker(tokenizer, skip_special_tokens=False).feed(ids)


def clip(offsets: list[int], end: int) -> list[int]:
    return [min(o, end) for o in offsets]
