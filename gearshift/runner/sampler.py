"""Token sampling without host synchronisation: greedy, temperature, top-k, top-p.

Data flow: BatchBuilder -> SamplingBatch; ModelRunner: logits [B, V] -> sample -> token ids
[B] (CUDA: the fused race kernel of kernels/sample.py; elsewhere as `sample_ref`).

Randomness is counter-based: the uniform for (request seed, output index, token id) is an
integer hash, so a seeded request yields the same tokens whatever batch it runs in, after
preemption and recompute, and under CUDA graphs.

Sampling is a race (Gumbel-max): each row picks

    argmax_i  logit_i / T  -  log(E_i),        E_i = -log(u_i) ~ Exp(1) i.i.d.

which draws exactly from softmax(logit / T): log(p_i / E_i) = logit_i / T - log Z - log E_i,
so this is the argmax of p_i / E_i, the exponential race (token i wins with probability
p_i) that this sampler used before, one monotone map away: the same token up to float
rounding, with nothing normalised and no cumulative sum. Greedy rows (T = 0) take
argmax_i logit_i; ties go to the lowest index, as torch.argmax.

u is capped at the largest float32 below 1: 128 of the 2**32 hashes round to 1.0, and
E = 0 made that token win whatever its probability (some token in 0.4% of rows at a 128k
vocabulary; 0 / 0 = NaN, which argmax picks, when top-k / top-p had zeroed it). Near 1
float32 resolves u to 2**-24, so E is never below 6e-8: tokens with p well below 1e-8 are
not drawn; above that the bias is below (6e-8 / p)**2 relative.

Top-k / top-p rows are filtered first (`top_k_top_p_filter`: a sort, dropped tokens get
logit -inf), then race like every other row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gearshift import env
from gearshift.kernels.counter_rng import (  # noqa: F401 (the sampler's names for its callers)
    HASH_MUL,
    MIN_TEMPERATURE,
    STEP_OFFSET,
    U_MAX,
    hash32,
    seeded_uniform,
)
from gearshift.runner.logprobs import LogprobPlan
from gearshift.runner.penalties import PenaltyBatch
from gearshift.structured.mask import GrammarBatch


@dataclass(slots=True)
class SamplingBatch:
    temperatures: torch.Tensor  # [B] float32; 0 = greedy          set by BatchBuilder
    top_p: torch.Tensor  # [B] float32
    top_k: torch.Tensor  # [B] int64; -1 = off
    seeds: torch.Tensor  # [B] int64 (32-bit values)
    steps: torch.Tensor  # [B] int64: index of the output token being sampled
    all_greedy: bool  # host flags from the plan: skip work no request needs
    any_greedy: bool
    need_top_k: bool
    need_top_p: bool
    # penalties, logit_bias, min_tokens (runner/penalties.py); None: no request uses any
    penalties: PenaltyBatch | None = None
    # requests that want logprobs (runner/logprobs.py); None: no request does
    logprobs: LogprobPlan | None = None
    # allowed-token bitmasks of grammar-constrained rows (structured/mask.py); None: no
    # request in the step has a grammar
    grammar: GrammarBatch | None = None
    # VERIFY steps: the sampled requests whose speculation is coupled to this race
    # (speculative/coupled.py), set by BatchBuilder; None: no request's is
    coupled: torch.Tensor | None = None  # [B] bool
    all_coupled: bool = False  # host: every sampled request's is (no rejection sampling)


# tokens per block of rows the top-k / top-p filter sorts at once: its scratch (the sort's
# keys, int64 order and buffers, cumulative sums: tens of bytes a token) stays bounded at
# any batch, where every row of a large VERIFY step at once would not fit beside the KV cache
FILTER_BLOCK_TOKENS = 1 << 24


def filter_blocks(rows: int, vocab: int) -> list[slice]:
    """The row blocks the top-k / top-p filter works through, one after another."""
    step = max(1, FILTER_BLOCK_TOKENS // vocab)
    return [slice(i, min(i + step, rows)) for i in range(0, max(rows, 1), step)]


def top_k_top_p_drop(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                     need_top_k: bool, need_top_p: bool) -> torch.Tensor:
    """[B, V] bool, in vocabulary order: the tokens outside each row's top-k / nucleus.
    A token is kept when it ranks below k and the mass of strictly more likely tokens is
    below p; the most likely token is always kept."""
    blocks = filter_blocks(*probs.shape)
    if len(blocks) == 1:
        return _drop_block(probs, top_k, top_p, need_top_k, need_top_p)
    drop = torch.empty_like(probs, dtype=torch.bool)
    for r in blocks:
        drop[r] = _drop_block(probs[r], top_k[r], top_p[r], need_top_k, need_top_p)
    return drop


def _drop_block(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                need_top_k: bool, need_top_p: bool) -> torch.Tensor:
    sorted_p, order = probs.sort(dim=-1, descending=True)
    drop = torch.zeros_like(sorted_p, dtype=torch.bool)
    if need_top_k:
        rank = torch.arange(probs.shape[-1], device=probs.device)[None, :]
        k = torch.where(top_k > 0, top_k, probs.shape[-1])[:, None]
        drop |= rank >= k
    if need_top_p:
        before = sorted_p.cumsum(dim=-1) - sorted_p  # mass of strictly better tokens
        # rows at top_p = 1 keep everything: a cumulative sum rounding up to 1 must not drop
        # their rarest tokens only when another row of the batch asks for top-p
        drop |= (before >= top_p[:, None]) & (top_p < 1.0)[:, None]
    drop[:, 0] = False  # always keep the most likely token
    return torch.zeros_like(drop).scatter_(-1, order, drop)


def apply_top_k_top_p(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                      need_top_k: bool, need_top_p: bool) -> torch.Tensor:
    """Zero the probabilities outside each row's top-k / nucleus. probs: [B, V]."""
    return probs.masked_fill(top_k_top_p_drop(probs, top_k, top_p, need_top_k, need_top_p), 0.0)


def top_k_top_p_filter(logits: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
    """logits [B, V] -> a copy with -inf outside the top-k / nucleus of each sampled row
    (greedy rows untouched), ranked on softmax(logits / T) like the speculative paths;
    a block of rows at a time (`filter_blocks`)."""
    blocks = filter_blocks(*logits.shape)
    if len(blocks) == 1:
        return _filter_block(logits, sb, blocks[0])
    out = torch.empty_like(logits)
    for r in blocks:
        out[r] = _filter_block(logits[r], sb, r)
    return out


def _filter_block(logits: torch.Tensor, sb: SamplingBatch, r: slice) -> torch.Tensor:
    temperatures = sb.temperatures[r]
    temps = temperatures.clamp_min(MIN_TEMPERATURE)[:, None]  # [B, 1]
    probs = torch.softmax(logits.float() / temps, dim=-1)  # [B, V]
    drop = _drop_block(probs, sb.top_k[r], sb.top_p[r], sb.need_top_k, sb.need_top_p)
    drop &= (temperatures > 0)[:, None]
    return logits.masked_fill(drop, float("-inf"))


def race_scores(logits: torch.Tensor, temperatures: torch.Tensor, seeds: torch.Tensor,
                steps: torch.Tensor, cols: torch.Tensor | None = None) -> torch.Tensor:
    """[B, V] float32 whose row argmax is the row's token (the reference of the kernel's
    per-token score): logit for greedy rows, logit / T - log(-log(u)) for the others.
    cols [V]: the token id of each column (seeded_uniform); None: column i is token i."""
    x = logits.float()  # [B, V]
    u = seeded_uniform(seeds, steps, x.shape[-1], cols)  # [B, V]
    temps = temperatures.clamp_min(MIN_TEMPERATURE)[:, None]  # [B, 1]
    scores = x / temps - torch.log(-torch.log(u))
    return torch.where(temperatures[:, None] == 0, x, scores)


def sample_ref(logits: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
    """logits: [B, V] (fp32 / bf16 / fp16) -> token ids [B] int64, in plain torch."""
    if sb.all_greedy:
        return logits.argmax(dim=-1)
    if sb.need_top_k or sb.need_top_p:
        logits = top_k_top_p_filter(logits, sb)
    return race_scores(logits, sb.temperatures, sb.seeds, sb.steps).argmax(dim=-1)


# GEARSHIFT_SAMPLER=torch: the torch path on CUDA too (an escape hatch for new GPU types)
_TORCH_ONLY = env.SAMPLER.get() == "torch"


def sample(logits: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
    """logits: [B, V] (fp32 / bf16 / fp16) -> token ids [B] int64. No host sync.
    CUDA: one fused pass (kernels/sample.py) after the optional top-k / top-p
    filter; elsewhere what `sample_ref` does. Both choose the same tokens up to float
    rounding."""
    if (sb.need_top_k or sb.need_top_p) and not sb.all_greedy:
        logits = top_k_top_p_filter(logits, sb)
    return race_tokens(logits, sb.temperatures, sb.seeds, sb.steps, greedy_only=sb.all_greedy)


def race_tokens(logits: torch.Tensor, temperatures: torch.Tensor, seeds: torch.Tensor,
                steps: torch.Tensor, cols: torch.Tensor | None = None, *,
                greedy_only: bool = False) -> torch.Tensor:
    """race_scores(...).argmax(-1) -> [B] int64 (greedy_only: every row greedy, the plain
    argmax): on CUDA the fused kernel (one pass, no [B, V] scratch), elsewhere torch."""
    if not logits.is_cuda or _TORCH_ONLY:
        if greedy_only:
            return logits.argmax(dim=-1)
        return race_scores(logits, temperatures, seeds, steps, cols).argmax(dim=-1)
    from gearshift.kernels.sample import race_argmax

    return race_argmax(logits, temperatures, seeds, steps, cols, greedy_only=greedy_only)
