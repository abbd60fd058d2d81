"""Grammar masks on the device: a step's staged bitmasks applied to logits (no host sync).

    allowed[r, t] = bit t % 32 of bitmask[r, t // 32]
    logits[r, t]  = -inf where not allowed (after penalties, before temperature / top-k / top-p)

A row that allows nothing stays unconstrained: it belongs to a draft node the grammar
rejects (verification never accepts that node, and its row must not become NaN) or to a
finished grammar. Where min_tokens bans every token the grammar allows (EOS, where the
grammar ends), the grammar wins: those tokens come back, at equal scores.

Data flow: BatchBuilder (host bitmask in the step's copy) -> SamplingBatch.grammar ->
ModelRunner.sample_tokens (plain steps); SpecRunner: per verified node (node masks),
and the draft's first level (the pending position's mask).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class GrammarBatch:
    """The bitmask of one step's sampling rows (BatchBuilder writes it; padding rows and
    requests without a grammar have every bit set)."""

    bitmask: torch.Tensor  # [R, W] int32 on the device

    def apply(self, logits: torch.Tensor, banned: bool) -> torch.Tensor:
        """logits [R, V] -> a float32 copy with the disallowed tokens at -inf. `banned`:
        the logits may hold -inf already (min_tokens)."""
        return constrain(logits, blocked_tokens(self.bitmask, logits.shape[-1]), banned)


def blocked_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[R, W] int32 -> [R, vocab_size] bool, True = not allowed; a row that allows nothing
    blocks nothing. Unpacked byte by byte (little-endian words: byte k of word w holds
    tokens 32w + 8k ..), so the scratch is one byte per token, as the result."""
    rows = bitmask.shape[0]
    words = bitmask.masked_fill((bitmask == 0).all(-1, keepdim=True), -1)  # [R, W]
    shifts = torch.arange(8, dtype=torch.uint8, device=bitmask.device)
    bits = (words.view(torch.uint8)[:, :, None] >> shifts) & 1  # [R, 4W, 8]
    return bits.view(rows, -1)[:, :vocab_size] == 0


def constrain(logits: torch.Tensor, blocked: torch.Tensor, banned: bool = True) -> torch.Tensor:
    """logits [R, V] (any float dtype), blocked [R, V] bool -> float32 [R, V], a new tensor.
    With `banned`, a row left with no finite logit gets its allowed tokens back at 0."""
    x = torch.where(blocked, float("-inf"), logits.float())
    if not banned:
        return x
    dead = x.amax(-1, keepdim=True) == float("-inf")  # min_tokens banned what the grammar allows
    return torch.where(dead & ~blocked, 0.0, x)


def draft_blocked(bitmask: torch.Tensor, vocab_size: int,
                  cols: torch.Tensor | None, draft_vocab: int) -> torch.Tensor:
    """[R, Vd] bool: the tokens of a draft vocabulary (cols: each column's target id; None:
    the target's own) not allowed at the pending position; rows where the draft
    vocabulary holds no allowed token block nothing."""
    blocked = blocked_tokens(bitmask, vocab_size)
    blocked = blocked[:, cols] if cols is not None else blocked[:, :draft_vocab]
    return blocked & ~blocked.all(-1, keepdim=True)
