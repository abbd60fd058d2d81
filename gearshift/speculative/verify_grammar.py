"""Grammar masks in a VERIFY step: every verified node samples under the mask of its
request's grammar advanced along the node's path (the drafts it would accept before it),
exactly what a plain step at that position would apply. Greedy output then equals plain
constrained decoding, sampling keeps the masked target distribution, and a draft the
grammar refuses is never accepted (its parent's mask gives it probability 0).

    propose -> TreeOnHost (async copy of the tree's tokens and parents)
            -> target forward launched (device)
            -> node_masks: each grammar's matcher walks its request's tree and rolls back
               (host, while the device runs) -> one copy to the device
            -> constrain: the masks on the verified nodes' logits (after the penalties)
            -> verification

A step where no request has a grammar calls nothing here.

Data flow: SpecRunner.run -> TreeOnHost / node_masks / constrain -> verify.
"""

from __future__ import annotations

import torch

from gearshift.request import Request
from gearshift.speculative.tree import DraftTree
from gearshift.structured.mask import blocked_tokens
from gearshift.structured.mask import constrain as constrain_rows
from gearshift.structured.matcher import tree_masks


class TreeOnHost:
    """The proposal's tokens and parents, copied to the host behind the draft's work."""

    def __init__(self, tree: DraftTree) -> None:
        t = torch.stack([tree.tokens, tree.parents])  # [2, B, N] int64
        self.event = None
        if t.is_cuda:
            self.host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            self.host.copy_(t, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = t

    def lists(self) -> tuple[list[list[int]], list[list[int]]]:
        """(tokens, parents) [B][N]: waits for the copy only, not for later device work."""
        if self.event is not None:
            self.event.synchronize()
        tokens, parents = self.host.tolist()
        return tokens, parents


def node_masks(reqs: list[Request], tree: TreeOnHost, n_nodes: list[int], num_nodes: int,
               device: torch.device) -> torch.Tensor:
    """[B * num_nodes, W] int32 on the device: request i's node j at row i * num_nodes + j."""
    tokens, parents = tree.lists()
    vocab = next(r.grammar.vocab_size for r in reqs if r.grammar is not None)
    masks = tree_masks(reqs, tokens, parents, n_nodes, num_nodes, vocab)
    if device.type == "cuda":
        masks = masks.pin_memory()
    return masks.to(device, non_blocking=True)


def constrain(logits_t: torch.Tensor, masks: torch.Tensor, flat: torch.Tensor,
              rows_t: torch.Tensor, banned: bool) -> torch.Tensor:
    """logits_t [T, V] -> float32 copy whose verified nodes' rows are masked; flat [F]: the
    nodes (request * num_nodes + node), rows_t [F]: their rows in logits_t; `banned`: the
    penalties may have set -inf (min_tokens)."""
    blocked = blocked_tokens(masks[flat], logits_t.shape[-1])  # [F, V]
    rows = constrain_rows(logits_t[rows_t], blocked, banned)
    return logits_t.float().index_put((rows_t,), rows)
