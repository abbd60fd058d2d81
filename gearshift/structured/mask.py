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

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [R, V] -> a float32 copy with the disallowed tokens at -inf."""
        return constrain(logits, allowed_tokens(self.bitmask, logits.shape[-1]))


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[R, W] int32 -> [R, vocab_size] bool; rows that allow nothing allow everything."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask[:, :, None] >> shifts) & 1  # [R, W, 32]
    allowed = bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()
    return allowed | ~allowed.any(-1, keepdim=True)


def constrain(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """logits [R, V] (any float dtype), allowed [R, V] bool -> float32 [R, V], a new tensor."""
    x = logits.float().masked_fill(~allowed, float("-inf"))
    dead = torch.isneginf(x).all(-1, keepdim=True)  # min_tokens banned what the grammar allows
    return torch.where(dead & allowed, 0.0, x)


def draft_allowed(bitmask: torch.Tensor, vocab_size: int,
                  cols: torch.Tensor | None, draft_vocab: int) -> torch.Tensor:
    """[R, Vd] bool: the tokens of a draft vocabulary (cols: each column's target id; None:
    the target's own) allowed at the pending position; rows where the draft vocabulary
    holds no allowed token stay unconstrained."""
    allowed = allowed_tokens(bitmask, vocab_size)
    allowed = allowed[:, cols] if cols is not None else allowed[:, :draft_vocab]
    return allowed | ~allowed.any(-1, keepdim=True)
