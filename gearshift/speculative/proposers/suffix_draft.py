r"""From a matched suffix to a draft: the most frequent continuations, as a chain or a tree.

Where the text's end matched (a state of a suffix automaton, the pattern P of length m),
each continuation t has a count: how often P was followed by t. Its probability is its
share of the counts at its parent, a node's score the product along its path: the chance,
were the text to continue as it did before, that verification accepts the node.

    P = "x y"   seen: x y a b (3x), x y a c (1x), x y d (1x)

    root --a (0.8)--> a --b (0.8 * 0.75 = 0.6)
         \                 \-c (0.2)            chain (topk 1): a b
          -d (0.2)                              tree (topk 2, 4 nodes): a, b, d, c

Nodes are added best score first (ties: more occurrences, then the latest), each parent
before its children, until the node budget, the depth K, a score under `min_prob`, or a
depth past `spec_factor` x m (a short match earns a short draft) ends it. The sum of the
scores is the draft's expected accepted length under that model: the policy's price of it.

Data flow: SuffixProposer (suffix.py) -> build_draft(index, state, m, ...) -> SuffixDraft
-> DraftTree rows.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from operator import itemgetter

MIN_PROB = 0.1  # a node whose path's score falls below this is not proposed
SPEC_FACTOR = 1.0  # at most this many draft tokens per matched token


@dataclass(slots=True)
class SuffixDraft:
    tokens: list[int] = field(default_factory=list)  # in topological order
    parents: list[int] = field(default_factory=list)  # node index (0 = the root), per token
    scores: list[float] = field(default_factory=list)  # each node's path probability
    match_len: int = 0  # tokens of the text's end the draft is anchored on
    source: str = ""  # "request" (its own tokens) | "cache" (recent outputs)

    @property
    def expected(self) -> float:
        """Expected accepted tokens, were the text to continue as it did before."""
        return sum(self.scores)

    def depths(self) -> list[int]:
        d = [0]
        for p in self.parents:
            d.append(d[p] + 1)
        return d[1:]


_COUNT, _COUNT_LAST = itemgetter(1), itemgetter(1, 2)


def ranked(children: list[tuple[int, int, int]], k: int | None = None) -> list[tuple[int, int, int]]:
    """(token, count, latest end) best first: more occurrences, then the more recent; the
    best k only when k is given (a short match's state has thousands of continuations, a
    draft wants one or a few: no full sort)."""
    if k is None:
        return sorted(children, key=_COUNT_LAST, reverse=True)
    if k == 1:
        return [max(children, key=_COUNT_LAST)] if children else []
    return heapq.nlargest(k, children, key=_COUNT_LAST)


def best_of(children: list[tuple[int, int, int]], k: int) -> tuple[int, list[tuple[int, int, int]]]:
    """(the continuations' total count, the best k of them): what a draft node needs."""
    return sum(map(_COUNT, children)), ranked(children, k)


def build_draft(index, state: int, match_len: int, depth: int, topk: int, nodes: int,
                min_prob: float = MIN_PROB, spec_factor: float = SPEC_FACTOR) -> SuffixDraft:
    """Best-first expansion from `state` of `index` (best_children(state, k), step(state, t);
    a chain: best_child(state)): at most `nodes` draft tokens, `topk` children per node,
    `depth` deep."""
    draft = SuffixDraft(match_len=match_len)
    depth = min(depth, math.ceil(spec_factor * match_len))
    if match_len <= 0 or depth <= 0 or nodes <= 0:
        return draft
    if topk == 1:
        return _chain(draft, index, state, min(depth, nodes), min_prob)
    order = 0  # creation order breaks score ties: a parent's better children first
    heap: list[tuple[float, int, int, int, int, int]] = []  # -score, order, parent, tok, state, d

    def push(parent: int, s: int, score: float, d: int) -> None:
        nonlocal order
        total, best = index.best_children(s, topk)
        for tok, c, _ in best:
            p = score * c / total
            if p >= min_prob:
                heapq.heappush(heap, (-p, order, parent, tok, s, d))
                order += 1

    push(0, state, 1.0, 1)
    while heap and len(draft.tokens) < nodes:
        neg, _, parent, tok, s, d = heapq.heappop(heap)
        draft.tokens.append(tok)
        draft.parents.append(parent)
        draft.scores.append(-neg)
        if d < depth:
            push(len(draft.tokens), index.step(s, tok), -neg, d + 1)
    return draft


def _chain(draft: SuffixDraft, index, state: int, n: int, min_prob: float) -> SuffixDraft:
    """The best-first expansion at one child a node, written as the walk it is (a preview
    per request and plan: no heap, no ranking lists)."""
    score = 1.0
    while len(draft.tokens) < n:
        best = index.best_child(state)
        if best is None:
            break
        total, tok, c, state = best
        score = score * c / total
        if score < min_prob:
            break
        draft.parents.append(len(draft.tokens))
        draft.tokens.append(tok)
        draft.scores.append(score)
    return draft
