"""N-gram prompt lookup (no model): find the most recent earlier occurrence of the
request's last n tokens (n from ngram_max down to ngram_min) in its own prompt and
output, and propose the tokens that followed it.

Data flow: SpecRunner -> NgramProposer.propose (host-side search) -> chain DraftTree.
"""

from __future__ import annotations

import torch

from gearshift.runner.staging import to_device
from gearshift.speculative.proposers.base import ProposeContext, Proposer
from gearshift.speculative.tree import DraftTree, chain_tree


def lookup(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """The up to k tokens that followed the latest earlier match of tokens' suffix."""
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # latest match first
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


class NgramProposer(Proposer):
    keeps_state = False  # no draft model: nothing to catch up on

    def __init__(self, n_min: int, n_max: int, window: int = 4096) -> None:
        self.n_min, self.n_max, self.window = n_min, n_max, window

    def scratch_slots(self, k: int, topk: int) -> int:
        return 0

    def propose(self, ctx: ProposeContext) -> tuple[DraftTree, list[int]]:
        k = ctx.max_depth
        drafts, nodes = [], []
        for req, kr in zip(ctx.reqs, ctx.draft_lens):
            found = lookup(req.all_token_ids[-self.window:], kr, self.n_min, self.n_max) if kr else []
            nodes.append(1 + len(found))
            drafts.append(found + [0] * (k - len(found)))
        d = to_device(drafts, torch.long, ctx.roots.device).view(len(drafts), k)
        return chain_tree(ctx.roots, d), nodes
