"""Coupled speculation: sampled tokens that are a function of the target's distribution and
the request's (seed, output index) alone, so speculation never changes a seeded text.

Plain decoding samples output index j by the race of runner/sampler.py,

    token_j = argmax_i  x_i / T - log(-log u(seed, j, i))     x: processed logits

(penalties, logit_bias, min_tokens, grammar mask, top-k / top-p: -inf outside). A coupled
VERIFY step computes that very token at every verified node, with the same function
(sampler.sample) on the node's processed logits at its output index steps + depth, and
then verifies as greedy rows do: accept a draft while it equals the node's token (in a
tree: descend into the child equal to it), emit the node's own token where none does.
Every emitted token is then the one plain decoding emits at that index, whatever K, the
tree, the batch or the load: exact text, hence exactly the target's distribution.

The draft races with the same numbers (`draft_scores`: its own processed logits, the
request's seed, the node's output index, uniforms keyed by target token ids), so it
proposes the target's winner whenever the two distributions agree near the top. Chains
take the race's winner (`draft_tokens`: on CUDA the sampler's fused kernel); trees take
each beam's best children by that noisy score, ranked by its log-softmax (a heuristic for
P(child wins)); n-gram drafts are deterministic and need nothing here.

Data flow: SpecRunner.run -> row_targets -> verify_device.greedy_verify (every row greedy
or coupled), or verify.verify -> verify_coupled per row; proposers/expand.py ->
draft_scores / draft_tokens.
"""

from __future__ import annotations

import torch

from gearshift.runner.sampler import (
    SamplingBatch,
    filter_blocks,
    race_scores,
    race_tokens,
    sample,
    top_k_top_p_filter,
)
from gearshift.speculative.tree import DraftTree


def node_batch(sb: SamplingBatch, req: torch.Tensor, depth: torch.Tensor) -> SamplingBatch:
    """The sampling rows of nodes [F]: request req[f]'s parameters at output index
    steps + depth[f] (penalties, grammar: applied to the logits already)."""
    return SamplingBatch(
        temperatures=sb.temperatures[req], top_p=sb.top_p[req], top_k=sb.top_k[req],
        seeds=sb.seeds[req], steps=sb.steps[req] + depth, all_greedy=sb.all_greedy,
        any_greedy=sb.any_greedy, need_top_k=sb.need_top_k, need_top_p=sb.need_top_p)


def node_tokens(logits: torch.Tensor, req: torch.Tensor, depth: torch.Tensor,
                sb: SamplingBatch) -> torch.Tensor:
    """logits [F, V] (processed) of nodes of requests req [F] at depths [F] -> [F] int64:
    the token plain decoding samples there (greedy rows: the argmax)."""
    return sample(logits, node_batch(sb, req, depth))


def row_targets(logits_t: torch.Tensor, rows_t: torch.Tensor, flat: torch.Tensor,
                tree: DraftTree, sb: SamplingBatch) -> torch.Tensor:
    """The target's token at each row of a VERIFY pass, logits_t [T, V] -> [T] int64, for
    greedy verification: the verified nodes' (flat [F], at rows rows_t [F]) sampled as
    plain decoding would; other rows (a rider's chunk, graph padding) 0."""
    n = tree.num_nodes
    req, node = flat // n, flat % n
    depth = tree.depths[req, node]
    # a block of rows at a time: a large tree step has thousands of [V] rows to sample
    tok = torch.cat([node_tokens(logits_t[rows_t[r]], req[r], depth[r], sb)
                     for r in filter_blocks(rows_t.shape[0], logits_t.shape[-1])])
    return torch.zeros(logits_t.shape[0], dtype=torch.long,
                       device=logits_t.device).index_copy_(0, rows_t, tok)


def _draft_race_rows(logits: torch.Tensor, sb: SamplingBatch,
                     depth_index: int) -> tuple[torch.Tensor, SamplingBatch]:
    """Draft logits [B, W, Vd] -> [B * W, Vd] (top-k / top-p applied) and their sampling
    rows: each beam's request at output index steps + depth_index."""
    b, w, v = logits.shape
    req = torch.arange(b, device=logits.device).repeat_interleave(w)  # [B * W]
    rows = node_batch(sb, req, torch.full_like(req, depth_index))
    flat = logits.reshape(b * w, v)
    if rows.need_top_k or rows.need_top_p:
        flat = top_k_top_p_filter(flat, rows)
    return flat, rows


def draft_scores(logits: torch.Tensor, sb: SamplingBatch, depth_index: int,
                 cols: torch.Tensor | None) -> torch.Tensor:
    """Draft logits [B, W, Vd] (processed) of beams whose children verify at output index
    steps + depth_index -> their race scores [B, W, Vd] float32 (greedy rows: the logits;
    -inf outside top-k / top-p). cols [Vd]: each column's target token id (EAGLE-3)."""
    flat, rows = _draft_race_rows(logits, sb, depth_index)
    return race_scores(flat, rows.temperatures, rows.seeds, rows.steps, cols).view(logits.shape)


def draft_tokens(logits: torch.Tensor, sb: SamplingBatch, depth_index: int,
                 cols: torch.Tensor | None) -> torch.Tensor:
    """A chain's next draft, [B, 1, Vd] (processed) -> [B, 1] int64: the argmax of
    draft_scores without its [B, Vd] scores (on CUDA one fused pass: a draft depth of
    sampled requests would otherwise spend tens of elementwise passes on the race)."""
    flat, rows = _draft_race_rows(logits, sb, depth_index)
    return race_tokens(flat, rows.temperatures, rows.seeds, rows.steps, cols)[:, None]


def per_row(sb: SamplingBatch, coupled: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """`coupled` where the batch row's request couples, else `other` ([B, ...] each)."""
    if sb.all_coupled:
        return coupled
    mask = sb.coupled.view(-1, *([1] * (coupled.dim() - 1)))
    return torch.where(mask, coupled, other)
