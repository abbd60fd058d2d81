"""A VERIFY step's target logits for the requests that process them or score them, so
that speculation stays exact under penalties and logprobs (device, no host sync; a step
where no request uses either calls nothing here):

    penalise     every verified node's logits get the penalties a plain step at its
                 position would apply: the request's counts plus the drafts on the node's
                 own path (runner/penalties.path_counts), min_tokens at output index
                 steps + depth; verification then runs on the processed logits, so greedy
                 output equals penalised plain decoding and sampling keeps the penalised
                 target distribution
    record       the emitted tokens (accepted drafts + bonus) join the request's counts
    path_logprobs  log_softmax of the RAW logits at each node of the accepted path: what a
                 plain step at that position would report

Data flow: SpecRunner.run: ModelRunner.forward -> penalise -> verification -> record /
path_logprobs -> the step's one host sync.
"""

from __future__ import annotations

import torch

from gearshift.runner.logprobs import LogprobPlan, token_logprobs
from gearshift.runner.penalties import PenaltyBatch, TokenCounts, path_counts
from gearshift.speculative.tree import DraftTree, ancestor_mask


def node_rows(flat: torch.Tensor, node_tok: torch.Tensor | None) -> torch.Tensor:
    """[F] the target-logits row of each verified node (chains as an extend: node_tok)."""
    return node_tok if node_tok is not None else torch.arange(flat.shape[0], device=flat.device)


def penalise(pb: PenaltyBatch, counts: TokenCounts | None, logits_t: torch.Tensor,
             tree: DraftTree, flat: torch.Tensor, rows_t: torch.Tensor, steps: torch.Tensor,
             depth: int) -> torch.Tensor:
    """logits_t [T, V] -> a copy whose verified nodes' rows are processed (float32)."""
    n = tree.num_nodes
    req, node = flat // n, flat % n  # [F]
    out_index = steps[req] + tree.depths[req, node]
    extra = None
    if pb.use_counts:
        anc = tree.ancestors if tree.ancestors is not None else ancestor_mask(tree.parents, depth)
        extra = path_counts(tree.tokens, anc, tree.depths, req, node, logits_t.shape[-1])
    processed = pb.apply(logits_t[rows_t], counts, req, out_index, extra)
    return logits_t.float().index_put((rows_t,), processed)


def emitted(packed: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """packed [B, 2D + 4] (verify_device.pack) -> accepted [B], path [B, D+1], tokens [B, D+1]."""
    return packed[:, 0], packed[:, 1:depth + 2], packed[:, depth + 2:2 * depth + 3]


def record(pb: PenaltyBatch, counts: TokenCounts, packed: torch.Tensor, depth: int) -> None:
    """Count each request's emitted tokens (its accepted drafts and the bonus)."""
    accepted, _, tokens = emitted(packed, depth)
    keep = torch.arange(depth + 1, device=tokens.device)[None, :] <= accepted[:, None]
    keep &= pb.record[:, None] > 0
    counts.record(pb.rows[:, None].expand_as(tokens), tokens, keep)


def path_logprobs(lp: LogprobPlan, raw_t: torch.Tensor, flat: torch.Tensor,
                  rows_t: torch.Tensor, packed: torch.Tensor, num_nodes: int, depth: int) -> None:
    """lp.sampled_out: for each request that wants logprobs, the D + 1 positions of its
    accepted path (the caller keeps as many as it emitted)."""
    b = packed.shape[0]
    row_of = torch.zeros(b * num_nodes, dtype=torch.long, device=flat.device)
    row_of[flat] = rows_t
    _, path, tokens = emitted(packed, depth)
    reqs = lp.sampled_dev
    rows = row_of[(reqs[:, None] * num_nodes + path[reqs]).reshape(-1)]
    lp.sampled_out = token_logprobs(raw_t[rows], tokens[reqs].reshape(-1), lp.top_n)
    lp.per_request = depth + 1
