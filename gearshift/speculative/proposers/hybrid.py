"""A model proposer (EAGLE-3 or a draft model) beside suffix decoding: one VERIFY step,
each request drafted by the proposer its plan names (plan.proposers), trees of both
merged into the step's one DraftTree.

    ctx.proposers  [eagle3, suffix, "", eagle3]     ("": K = 0)
    model.propose(ctx, K of its rows)  -> [B, N_m] ─┐  rows padded to the layout's N
    suffix.propose(ctx, K of its rows) -> [B, N_s] ─┴► where(row is suffix, s, m) [B, N]

The model's state is its own: catch-up, draft_extend and the features are the model
proposer's, for every request that speculates, whichever proposer drafted (the scheduler
plans the catch-up of every K > 0, and the draft follows the accepted tokens after commit),
so a request that drafted from its suffix match this step drafts at full acceptance from
the model the next. Rejection-sampled chains carry the model's draft distributions q; a
suffix row's q is one-hot at its tokens (a point mass: min(1, p / q) = p(y), residual p
without y: the point-mass test).

Counters per proposer (drafts, proposed, accepted), and the suffix drafts' verify outcomes
for the calibration that prices them (suffix_price.py), come from observe() after commit.

Data flow: SpecRunner.run -> HybridProposer.propose(ctx) -> DraftTree; SpecRunner
.after_commit -> observe(plan, nodes, accepted); Scheduler (planning) -> price(reqs, K).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from gearshift.runner.staging import to_device
from gearshift.speculative.proposers.base import ProposeContext, Proposer
from gearshift.speculative.proposers.suffix import SuffixProposer
from gearshift.speculative.proposers.suffix_price import SuffixPricer
from gearshift.speculative.tree import DraftTree

SUFFIX = "suffix"


class HybridProposer(Proposer):
    def __init__(self, model: Proposer, name: str, suffix: SuffixProposer) -> None:
        self.model, self.name, self.suffix = model, name, suffix
        self.needs_features, self.aux_layers = model.needs_features, model.aux_layers
        self.shifted_inputs, self.graph_extend = model.shifted_inputs, model.graph_extend
        self.keeps_state = model.keeps_state
        self.pricer = SuffixPricer(suffix.preview, suffix.defer)
        self.stats = {p: {"drafts": 0, "proposed": 0, "accepted": 0} for p in (name, SUFFIX)}
        self.mixed_steps = 0  # VERIFY steps that drafted with both proposers

    # ------------------------------------------------------------------ the model's state
    @property
    def runner(self):
        return self.model.runner

    @runner.setter
    def runner(self, value) -> None:
        self.model.runner = value

    @property
    def full_drafts(self) -> bool:  # the warm-up's steps: both draft every planned node
        return self.suffix.full_drafts

    @full_drafts.setter
    def full_drafts(self, value: bool) -> None:
        self.suffix.full_drafts = self.model.full_drafts = value

    def weights(self):
        return self.model.weights()

    def cost_fraction(self, target: torch.nn.Module) -> float:
        return self.model.cost_fraction(target)

    def scratch_slots(self, k: int, topk: int) -> int:
        return self.model.scratch_slots(k, topk)

    def draft_extend(self, fb, features):
        self.model.draft_extend(fb, features)

    def store_features(self, slots, aux):
        self.model.store_features(slots, aux)

    def stored_features(self):
        return self.model.stored_features()

    def resize_slots(self, num_slots: int) -> None:
        self.model.resize_slots(num_slots)

    def reset_cache(self) -> None:
        self.suffix.reset_cache()

    def __getattr__(self, name: str):  # the model proposer's own (its head, kv, buffers)
        if name == "model":
            raise AttributeError(name)
        return getattr(self.model, name)

    # ------------------------------------------------------------------ a step
    def price(self, reqs: list, k: int) -> list[list[float]]:
        """Per request, P(accepted) of each node of the suffix chain it would draft now."""
        return self.pricer.values(reqs, k)

    def index_ahead(self, reqs: list) -> None:
        """While a VERIFY step's device runs: suffix decoding's indexes catch up."""
        self.suffix.index_ahead(reqs)

    def chosen(self, reqs: list, proposers: list[str]) -> None:
        """The plan made from the latest price(): its proposer per request."""
        self.pricer.chosen(reqs, proposers)

    def propose(self, ctx: ProposeContext) -> tuple[DraftTree, list[int] | None]:
        props = ctx.proposers or [self.name] * len(ctx.reqs)
        is_suffix = [p == SUFFIX for p in props]
        ks_s = [k if s else 0 for k, s in zip(ctx.draft_lens, is_suffix)]
        ks_m = [0 if s else k for k, s in zip(ctx.draft_lens, is_suffix)]
        if not any(ks_s):
            return self.model.propose(ctx)
        tree = ctx.topk > 1
        width = _nodes(ctx, ctx.max_depth)  # the layout's nodes per request (its depth's)
        s_tree, s_found = self.suffix.propose(replace(ctx, draft_lens=ks_s, max_depth=max(ks_s)))
        if not any(ks_m):
            return _padded(s_tree, width, tree), s_found
        depth_m = max(ks_m)
        m_ctx = replace(ctx, draft_lens=ks_m, max_depth=depth_m,
                        num_nodes=ctx.num_nodes if tree else depth_m + 1)
        m_tree, m_found = self.model.propose(m_ctx)
        n_m = m_tree.num_nodes
        found = [s_found[i] if s else
                 (m_found[i] if m_found is not None else (n_m if tree else k + 1) if k else 1)
                 for i, (s, k) in enumerate(zip(is_suffix, ks_m))]
        return merge(_padded(m_tree, width, tree), _padded(s_tree, width, tree),
                     to_device(is_suffix, torch.bool, ctx.roots.device)), found

    def observe(self, plan, nodes: list[int], accepted: list[int]) -> None:
        """A VERIFY step's outcome (host, after commit): counters per proposer; the suffix
        drafts' outcomes calibrate their price. The warm-up's steps are not counted."""
        if self.full_drafts:
            return
        used = {p for p, k in zip(plan.proposers, plan.draft_lens) if k}
        self.mixed_steps += len(used) > 1
        for i, (p, k) in enumerate(zip(plan.proposers, plan.draft_lens)):
            if not k or not plan.decoding[i]:
                continue
            st = self.stats[p]
            st["drafts"] += 1
            st["proposed"] += nodes[i] - 1
            st["accepted"] += accepted[i]
            if p == SUFFIX:
                self.pricer.record(plan.reqs[i], k, accepted[i])

    def counters(self) -> dict:
        """spec_stats()["proposers"]: per proposer drafts, proposed and accepted tokens (the
        suffix proposer's drafts by source too) and the suffix calibration's map."""
        return {self.name: dict(self.stats[self.name]),
                SUFFIX: {**self.suffix.stats, **self.stats[SUFFIX],
                         "calibration": self.pricer.map.table()}}


def _nodes(ctx: ProposeContext, depth: int) -> int:
    """Nodes per request of a step of this depth (SpecRunner.draft_nodes)."""
    if ctx.topk == 1:
        return depth + 1
    return 1 + min(ctx.num_nodes - 1, ctx.topk + (depth - 1) * ctx.topk ** 2)


def _padded(tree: DraftTree, n: int, is_tree: bool) -> DraftTree:
    """`tree` with n nodes per request: extra nodes continue a chain (or hang off the root
    of a tree), token 0, never valid (past each request's nodes)."""
    extra = n - tree.num_nodes
    if extra <= 0:
        return tree
    b, dev = tree.tokens.shape[0], tree.tokens.device
    idx = torch.arange(tree.num_nodes, n, device=dev).expand(b, extra)
    parents = torch.zeros_like(idx) if is_tree else idx - 1
    depths = torch.ones_like(idx) if is_tree else idx
    probs = None
    if tree.draft_probs is not None:
        probs = torch.cat([tree.draft_probs,
                           tree.draft_probs.new_zeros(b, extra, tree.draft_probs.shape[-1])], 1)
    return DraftTree(torch.cat([tree.tokens, torch.zeros_like(idx)], 1),
                     torch.cat([tree.parents, parents], 1), torch.cat([tree.depths, depths], 1),
                     probs)


def merge(model: DraftTree, suffix: DraftTree, is_suffix: torch.Tensor) -> DraftTree:
    """Rows of `suffix` where is_suffix [B], else `model`'s (both [B, N]). Where the model's
    chains carry draft distributions q [B, N, V], a suffix row's q is one-hot at its tokens."""
    rows = is_suffix[:, None]
    probs = None
    if model.draft_probs is not None:
        onehot = torch.zeros_like(model.draft_probs).scatter_(-1, suffix.tokens[..., None], 1.0)
        probs = torch.where(rows[..., None], onehot, model.draft_probs)
    return DraftTree(torch.where(rows, suffix.tokens, model.tokens),
                     torch.where(rows, suffix.parents, model.parents),
                     torch.where(rows, suffix.depths, model.depths), probs)
