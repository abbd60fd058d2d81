"""Per-request grammar state and the host side of its token masks.

A request's `RequestGrammar` has accepted exactly its committed output tokens
(Scheduler.commit advances it), so its next-token mask is what a plain step at the next
position samples under. A VERIFY step needs the mask at every drafted node: the matcher
walks each node's path (its accepted drafts) and rolls back, ending where it started.

Bitmask layout (xgrammar's): int32 [rows, ceil(vocab / 32)], bit t % 32 of word t // 32
set = token t allowed. All bits set = unconstrained (requests without a grammar, rows that
sample nothing); no bit set = nothing can follow (a node the grammar rejects: never
accepted, mask.py leaves it unconstrained).

Data flow: BatchBuilder.prepare -> step_masks (host, in the step's one copy) ->
GrammarBatch; SpecRunner -> tree_masks after the proposal -> node masks.
"""

from __future__ import annotations

import torch

from gearshift.faults import RequestFault


class GrammarViolation(ValueError):
    """A committed token the grammar does not allow (the masks make this a bug)."""


class RequestGrammar:
    __slots__ = ("matcher", "vocab_size")

    def __init__(self, matcher, vocab_size: int) -> None:
        self.matcher = matcher  # xgrammar.GrammarMatcher over the committed output
        self.vocab_size = vocab_size

    def accept(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise GrammarViolation(f"token {token} does not follow the request's grammar")

    @property
    def terminated(self) -> bool:
        """The grammar ended and a stop token was accepted: nothing may follow."""
        return self.matcher.is_terminated()

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """bitmask[row] = the next token's mask (left unconstrained once terminated)."""
        if not self.matcher.is_terminated():
            self.matcher.fill_next_token_bitmask(bitmask, row)

    def fill_tree(self, bitmask: torch.Tensor, tokens: list[int], parents: list[int]) -> None:
        """bitmask [N, W] (all bits set on entry): row j = the mask after node j's path
        (node 0, the pending token, is accepted already). Nodes below one the grammar
        rejects keep all bits set; the rejected node gets none."""
        if self.matcher.is_terminated():
            return
        n = len(tokens)
        first, sibling, last = [-1] * n, [-1] * n, [-1] * n
        for j in range(1, n):  # nodes come in creation order: parents before children
            p = parents[j]
            if not 0 <= p < j:  # not in the tree (never verified)
                continue
            if last[p] < 0:
                first[p] = j
            else:
                sibling[last[p]] = j
            last[p] = j
        self.matcher.traverse_draft_tree(torch.tensor(first), torch.tensor(sibling),
                                         torch.tensor(tokens), bitmask)


def bitmask_width(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def unconstrained(rows: int, vocab_size: int) -> torch.Tensor:
    """[rows, W] int32 host bitmask with every token allowed."""
    return torch.full((rows, bitmask_width(vocab_size)), -1, dtype=torch.int32)


def step_masks(reqs, sample: list[bool], pad: int) -> torch.Tensor:
    """A plain step's host bitmask: one row per request that samples under a grammar, all
    bits set for the others and for `pad` padding rows. A request whose grammar fails
    raises RequestFault (the engine fails it alone)."""
    vocab = next(r.grammar.vocab_size for r in reqs if r.grammar is not None)
    out = unconstrained(len(reqs) + pad, vocab)
    for i, (req, smp) in enumerate(zip(reqs, sample)):
        if req.grammar is not None and smp and not req.is_finished:
            try:
                req.grammar.fill(out, i)
            except Exception as e:  # noqa: BLE001 - the request's fault, raised with it
                raise RequestFault(req, e) from e
    return out


def tree_masks(reqs, tokens: list[list[int]], parents: list[list[int]], n_nodes: list[int],
               num_nodes: int, vocab_size: int) -> torch.Tensor:
    """A VERIFY step's node masks [B * num_nodes, W]: request i's node j at row
    i * num_nodes + j, over its first n_nodes[i] nodes (tokens / parents: [B][num_nodes]
    host lists of the draft tree)."""
    out = unconstrained(len(reqs) * num_nodes, vocab_size)
    for i, (req, n) in enumerate(zip(reqs, n_nodes)):
        if req.grammar is not None and not req.is_finished:
            rows = out[i * num_nodes: i * num_nodes + n]
            req.grammar.fill_tree(rows, tokens[i][:n], parents[i][:n])
    return out

