"""Suffix decoding (no model): draft what followed, earlier, the longest suffix of the text.

Two indexes (suffix_index.py) answer for a request: its own prompt and committed output
(`RequestIndex`, extended as tokens commit), and recent requests' outputs (`OutputCache`,
`suffix_cache_tokens` at most, least recently used dropped first). From where each matches
the text's end (its last MATCH_WINDOW tokens at most) the most frequent continuations make
a draft, a chain or, on an engine with a tree width, a tree (suffix_draft.py); the draft
expecting more accepted tokens wins.
Each draft carries its match length and a score per node (`SuffixDraft`), and `draft()`
answers on the host before a step is planned: what a policy prices a suffix draft by.

Drafts are point masses (no draft distribution), so verification is exact as for any
deterministic proposer: greedy, rejection (trees: sequential tests) and coupled.

Data flow: SpecRunner -> SuffixProposer.propose(ctx) -> per request draft(req, K) (host)
-> chain_tree / DraftTree rows (one copy to the device) -> verification. Requests seen
finished at a later propose leave their index; their outputs enter the cache (aborted
or failed ones do not). Requests never indexed (never previewed or drafted for, nor
running through a VERIFY step) keep their outputs out of the cache. While a VERIFY
step's device runs, index_ahead brings the running requests' indexes up to their
committed tokens, so that a new request's prompt is not indexed on a plan's critical path
(its previews defer: defer()), and a plan's previews append nothing: a step's new tokens
are walked on the index (SuffixAutomaton.match_on).
"""

from __future__ import annotations

import torch

from gearshift.request import Request
from gearshift.runner.staging import to_device
from gearshift.speculative.proposers.base import ProposeContext, Proposer
from gearshift.speculative.proposers.suffix_draft import MIN_PROB, SPEC_FACTOR, SuffixDraft, build_draft
from gearshift.speculative.proposers.suffix_index import OutputCache, RequestIndex
from gearshift.speculative.tree import DraftTree, chain_tree

MATCH_WINDOW = 64  # the longest pattern matched: the request's last tokens
# once the engine indexes between steps (index_ahead), a preview walks at most this many
# tokens past a request's index (appending none on the plan's critical path): a request
# further behind (a new request's prompt) prices no suffix draft while index_ahead builds
# its index, for MAX_DEFER plans at most (then its preview builds it)
INDEX_LAG = 64
MAX_DEFER = 8
# tokens of far-behind indexes index_ahead appends at most per call (while the device runs;
# the few each running request committed in a step are appended apart from it)
INDEX_AHEAD = 2048


def committed(req: Request) -> list[int] | None:
    """The request's tokens, None while one is still being sampled (a placeholder)."""
    tokens = req.all_token_ids
    return None if tokens and min(tokens[-req.num_pending - 1:]) < 0 else tokens


def filled(draft: SuffixDraft, n: int, tree: bool) -> SuffixDraft:
    """The draft with n tokens (warm-up: every planned node exists): token 0 on, as more
    chain links or, in a tree, more children of the root (depth 1: within any K)."""
    extra = n - len(draft.tokens)
    if extra <= 0:
        return draft
    start = len(draft.tokens)
    parents = [0] * extra if tree else list(range(start, start + extra))
    return SuffixDraft(draft.tokens + [0] * extra, draft.parents + parents,
                       draft.scores + [0.0] * extra, draft.match_len, draft.source)


class SuffixProposer(Proposer):
    keeps_state = False  # no draft model: the indexes read committed tokens

    def __init__(self, cache_tokens: int, min_prob: float = MIN_PROB,
                 spec_factor: float = SPEC_FACTOR, window: int = MATCH_WINDOW) -> None:
        self.cache = OutputCache(cache_tokens)
        self.min_prob, self.spec_factor, self.window = min_prob, spec_factor, window
        self._indexes: dict[str, tuple[Request, RequestIndex]] = {}
        # request id -> (its tokens, the chain preview() priced): propose() drafts it again
        # only where the tokens moved on since
        self._planned: dict[str, tuple[int, SuffixDraft]] = {}
        self._ahead = False  # index_ahead has run: previews may defer long index builds
        self._deferred: dict[str, int] = {}  # request id -> plans its preview waited
        # drafts by source and their tokens (spec_stats()["proposers"]["suffix"], /metrics)
        self.stats = {"drafts": 0, "draft_tokens": 0, "from_request": 0, "from_cache": 0,
                      "empty": 0}

    def scratch_slots(self, k: int, topk: int) -> int:
        return 0

    def _held(self, req: Request) -> RequestIndex | None:
        entry = self._indexes.get(req.request_id)
        return entry[1] if entry is not None and entry[0] is req else None

    def index(self, req: Request) -> RequestIndex:
        idx = self._held(req)
        if idx is None:
            idx = RequestIndex()
            self._indexes[req.request_id] = (req, idx)
        return idx

    def draft(self, req: Request, k: int, topk: int = 1, nodes: int | None = None) -> SuffixDraft:
        """The request's draft of at most k deep (`nodes` tokens, `topk` children a node):
        from its own tokens or from the output cache, whichever expects more."""
        planned = self._planned.pop(req.request_id, None)
        if planned is not None and topk == 1 and planned[0] == req.num_tokens \
                and req.num_pending == 0:  # the chain priced when the step was planned
            d = planned[1]
            n = min(k, len(d.tokens))
            return SuffixDraft(d.tokens[:n], d.parents[:n], d.scores[:n], d.match_len,
                               d.source)
        tokens = committed(req)
        return self._draft(req, len(tokens) if tokens else 0, k, topk, nodes)

    def preview(self, req: Request, k: int) -> SuffixDraft:
        """The chain of at most k drafts the request would get now, on the host before its
        step is planned (what a policy prices). A token still being sampled (an overlapped
        step's) is not known yet: the chain is drafted one token further from the tokens
        known, its first node (the guess for that token) dropped, and the others' scores
        stay unconditional on it."""
        pending = req.num_pending
        end = req.num_tokens - pending  # the tokens known
        if pending and min(req.token_slice(end - 1, end), default=0) < 0:
            return SuffixDraft()
        d = self._draft(req, end, k + pending, 1, k + pending)
        if not pending:
            self._planned[req.request_id] = (req.num_tokens, d)  # proposed as priced
            return d
        return SuffixDraft(d.tokens[pending:], [max(p - pending, 0) for p in d.parents[pending:]],
                           d.scores[pending:], d.match_len, d.source)

    def defer(self, req: Request) -> bool:
        """Should the plan being made price no suffix draft for `req`, its index being more
        than INDEX_LAG tokens behind while the engine indexes between steps (index_ahead)?
        For MAX_DEFER plans in a row at most: then the preview builds the index itself."""
        if not self._ahead:
            return False
        rid = req.request_id
        idx = self._held(req)
        held = len(idx.tokens) if idx is not None else 0
        waited = self._deferred.pop(rid, 0)
        if req.num_tokens - held <= INDEX_LAG or waited >= MAX_DEFER:
            return False
        self._deferred[rid] = waited + 1
        return True

    def index_ahead(self, reqs: list[Request], budget: int = INDEX_AHEAD) -> None:
        """Host work while a VERIFY step's device runs (Scheduler.prepare_next): finished
        requests leave, their outputs entering the cache, and the indexes of `reqs` (the
        running requests) take their committed tokens: each the few it committed lately,
        then those far behind (new prompts) at most `budget` tokens in all, so that the
        next plan's previews append nothing."""
        self._ahead = True
        self.forget_finished()
        far = []
        for req in reqs:
            tokens = committed(req) if req.params.speculative else None
            if not tokens:
                continue
            idx = self.index(req)
            if len(tokens) - len(idx.tokens) <= INDEX_LAG:
                idx.sync(tokens)
            else:
                far.append((idx, tokens))
        for idx, tokens in far:
            if budget <= 0:
                break
            budget -= idx.sync(tokens, budget)
        live = {r.request_id for r in reqs}
        self._deferred = {rid: n for rid, n in self._deferred.items() if rid in live}

    def _draft(self, req: Request, end: int, k: int, topk: int,
               nodes: int | None) -> SuffixDraft:
        """The draft after the request's first `end` tokens."""
        if end <= 0 or k <= 0:
            return SuffixDraft()
        nodes = k if nodes is None else nodes
        idx = self.index(req)
        state, m = self._match(req, idx, end)
        best = build_draft(idx, state, m, k, topk, nodes, self.min_prob, self.spec_factor)
        best.source = "request"
        if len(self.cache) and best.expected < nodes:  # else certain at every node: none beats it
            cstate, cm = self.cache.match(req.token_slice(max(end - self.window, 0), end))
            other = build_draft(self.cache, cstate, cm, k, topk, nodes, self.min_prob,
                                self.spec_factor)
            if other.expected > best.expected:
                other.source, best = "cache", other
                self.cache.used(self.cache.last(cstate))
        return best

    def _match(self, req: Request, idx: RequestIndex, end: int) -> tuple[int, int]:
        """(state, length) of the longest suffix of the request's first `end` tokens (the
        window's at most) that occurred earlier in them. Once index_ahead runs, the tokens
        committed since it did (a step's: INDEX_LAG at most) are walked on the index, not
        appended: index_ahead appends them while the device runs. Only the last token held
        is checked here (sync checks them all, off the path): a stale index would cost a
        draft, never a token."""
        n = len(idx.tokens)
        if self._ahead and n and n <= end <= n + INDEX_LAG \
                and req.token_slice(n - 1, n) == idx.tokens[-1:]:
            return idx.sam.match_on(req.token_slice(n, end), self.window)
        idx.sync(req.token_slice(0, end))
        return idx.repeat(self.window)

    def reset_cache(self) -> None:
        self.cache = OutputCache(self.cache.max_tokens)

    def forget_finished(self) -> None:
        """Finished requests leave their index; their outputs enter the output cache unless
        they were aborted or failed (warm-up's dummy requests are aborted)."""
        done = [rid for rid, (req, _) in self._indexes.items() if req.is_finished]
        for rid in done:
            req, _ = self._indexes.pop(rid)
            if req.finish_reason in ("stop", "length"):
                self.cache.add([t for t in req.output_token_ids if t >= 0])

    def propose(self, ctx: ProposeContext) -> tuple[DraftTree, list[int]]:
        if not self._ahead:  # else index_ahead does it while the device runs
            self.forget_finished()
        tree = ctx.topk > 1
        k = ctx.max_depth
        # draft tokens a request may send at most: a tree fills the layout's nodes as an
        # expansion of this depth and width would (SpecRunner.draft_nodes)
        n = min(ctx.num_nodes - 1, ctx.topk + (k - 1) * ctx.topk ** 2) if tree else k
        drafts = [self.draft(req, kr, ctx.topk if tree else 1, n) if kr else SuffixDraft()
                  for req, kr in zip(ctx.reqs, ctx.draft_lens)]
        self._planned.clear()  # previews of requests that did not draft: stale next step
        if self.full_drafts:  # the warm-up's steps: not counted
            drafts = [filled(d, n if tree else kr, tree) if kr else d
                      for d, kr in zip(drafts, ctx.draft_lens)]
        else:
            self._count(drafts, ctx.draft_lens)
        nodes = [1 + len(d.tokens) for d in drafts]
        dev = ctx.roots.device
        if not tree:
            rows = [d.tokens + [0] * (k - len(d.tokens)) for d in drafts]
            return chain_tree(ctx.roots, to_device(rows, torch.long, dev).view(len(rows), k)), nodes
        # a tree of n + 1 nodes per request: the root, the draft, then unused nodes (never
        # valid: verification reads each request's first `nodes` only)
        toks, parents, depths = [], [], []
        for dr in drafts:
            pad = n - len(dr.tokens)
            toks.append([0, *dr.tokens, *[0] * pad])
            parents.append([-1, *dr.parents, *[0] * pad])
            depths.append([0, *dr.depths(), *[1] * pad])
        t, p, dp = to_device([toks, parents, depths], torch.long, dev).unbind(0)  # [3, B, N]
        t = torch.cat([ctx.roots[:, None], t[:, 1:]], dim=1)
        return DraftTree(t, p.contiguous(), dp.contiguous()), nodes

    def _count(self, drafts: list[SuffixDraft], ks: list[int]) -> None:
        s = self.stats
        for d, kr in zip(drafts, ks):
            if not kr:
                continue
            s["drafts"] += 1
            s["draft_tokens"] += len(d.tokens)
            s["empty" if not d.tokens else "from_" + d.source] += 1
