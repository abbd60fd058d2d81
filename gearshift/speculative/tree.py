r"""Draft trees: the candidates one request sends to verification, as flat node arrays.

Node 0 is the root: the request's pending token (sampled last step, not yet in the KV
cache). Every other node is a draft token whose parent is an earlier node, so nodes are
in topological order. A chain of K drafts is the tree with parents [-1, 0, 1, ..., K-1].

    node:    0    1    2    3    4    5         tokens  [x, a, b, c, d, e]
    tree:        x                               parents [-1, 0, 0, 1, 1, 2]
               /   \                             depths  [0, 1, 1, 2, 2, 2]
              a     b                            ancestors-or-self (tree mask), row = query:
             / \     \                               x: x            c: x a c
            c   d     e                              a: x a          d: x a d
                                                     b: x b          e: x b e

Data flow: proposer.propose() -> DraftTree -> runner/verify_layout.py fills the VERIFY batch
(positions = prefix + depth, extra key slots = ancestors-or-self) -> speculative/verify.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class DraftTree:
    tokens: torch.Tensor  # [B, N] int64 target-vocab ids; column 0 = pending token
    parents: torch.Tensor  # [B, N] int64; -1 for the root
    depths: torch.Tensor  # [B, N] int64; 0 for the root
    draft_probs: torch.Tensor | None = None  # [B, N, V] q of each node's token (chains, sampling)
    ancestors: torch.Tensor | None = None  # [B, N, N] ancestor_mask(parents), when precomputed

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]


def chain_tree(root: torch.Tensor, drafts: torch.Tensor,
               draft_probs: torch.Tensor | None = None) -> DraftTree:
    """root: [B]; drafts: [B, K] -> the chain x -> d1 -> ... -> dK."""
    b, k = drafts.shape
    idx = torch.arange(k + 1, device=drafts.device)
    parents = (idx - 1).expand(b, k + 1).contiguous()
    probs = None
    if draft_probs is not None:  # [B, K, V] -> [B, K+1, V] with a zero row for the root
        probs = torch.cat([torch.zeros_like(draft_probs[:, :1]), draft_probs], dim=1)
    return DraftTree(torch.cat([root[:, None], drafts], dim=1), parents,
                     idx.expand(b, k + 1).contiguous(), probs)


def ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """[B, N] parents -> [B, N, N] bool: mask[b, i, j] = node j is i or an ancestor of i."""
    b, n = parents.shape
    eye = torch.eye(n, dtype=torch.bool, device=parents.device).expand(b, n, n)
    mask = eye.clone()
    cur = torch.arange(n, device=parents.device).expand(b, n)
    for _ in range(max_depth):
        cur = parents.gather(1, cur.clamp_min(0)).where(cur >= 0, cur)
        hit = torch.zeros_like(mask).scatter_(2, cur.clamp_min(0)[..., None], True)
        mask |= hit & (cur >= 0)[..., None]
    return mask


def children_mask(parents: torch.Tensor) -> torch.Tensor:
    """[B, N] -> [B, N, N] bool: child[b, i, j] = parent of j is i."""
    n = parents.shape[1]
    return parents[:, None, :] == torch.arange(n, device=parents.device)[None, :, None]
