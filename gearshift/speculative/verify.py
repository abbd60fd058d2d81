"""Lossless verification of a draft tree against the target's logits (device, no sync).

Greedy rows use one-hot target distributions, which turns both schemes below into
"accept while the draft equals the target's argmax, then emit the argmax":
  * chains whose drafts were SAMPLED from the draft distribution q (draft_probs given):
    standard speculative rejection sampling: accept d_j with probability
    min(1, p(d_j) / q(d_j)); at the first rejection emit a sample of norm(max(p - q, 0));
    after K acceptances emit a sample of p.
  * trees (and chains drafted deterministically): the draft nodes are point masses, so at
    each node the children are tried in order: child y is accepted with probability
    p(y) / sum(p) of the current residual p, else p(y) := 0 and the next child is tried;
    if none is accepted, emit a sample of the residual. This is sampling from p by
    sequential tests, hence exactly lossless (SpecInfer-style multi-draft, target-only).
Randomness is counter-based (runner/sampler.py): (request seed ^ salt, output index).
Requests that couple skip both: they verify against the plain sampler's own token at each
node (speculative/coupled.py), which keeps their seeded text too.

Data flow: SpecRunner.run: target VERIFY logits [B, N, V] + DraftTree -> VerifyResult ->
host (one sync) -> StepResult -> Scheduler.commit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gearshift.runner.sampler import SamplingBatch, apply_top_k_top_p, seeded_uniform
from gearshift.speculative import coupled
from gearshift.speculative.tree import DraftTree, children_mask

SALT_ACCEPT = 0x5EED0001
SALT_RESIDUAL = 0x5EED0002
SALT_DRAFT = 0x5EED0003  # used by proposers that sample drafts


@dataclass(slots=True)
class VerifyResult:
    num_accepted: torch.Tensor  # [B] int64: accepted draft tokens (the bonus not counted)
    path: torch.Tensor  # [B, D+1] int64 node index per depth (root first; padded with the last)
    tokens: torch.Tensor  # [B, D+1] int64: accepted drafts then the bonus token at [num_accepted]
    # [B] int64: what the tree's top-1 chain (each node's first child: the draft's argmax)
    # alone would have accepted; the goodput policy's paired tree-vs-chain evidence. None:
    # not computed (sampled rows)
    chain_accepted: torch.Tensor | None = None


def target_probs(logits: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
    """logits: [B, N, V] -> processed target distributions p [B, N, V] (one-hot for greedy)."""
    b, n, v = logits.shape
    temps = sb.temperatures[:, None, None]
    probs = torch.softmax(logits / temps.clamp_min(1e-5), dim=-1)
    if sb.need_top_k or sb.need_top_p:
        flat = apply_top_k_top_p(probs.view(b * n, v), sb.top_k.repeat_interleave(n),
                                 sb.top_p.repeat_interleave(n), sb.need_top_k, sb.need_top_p)
        probs = flat.view(b, n, v)
        probs = probs / probs.sum(-1, keepdim=True)
    if sb.any_greedy:
        onehot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        probs = torch.where(temps == 0, onehot, probs)
    return probs


def _sample(p: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """One draw per row of the (unnormalised) distribution p [B, V] (exponential race)."""
    exp = -torch.log(seeded_uniform(seeds ^ SALT_RESIDUAL, steps, p.shape[-1]))
    return (p / exp).argmax(-1)


def verify(tree: DraftTree, valid: torch.Tensor, logits: torch.Tensor, sb: SamplingBatch,
           max_depth: int, max_children: int) -> VerifyResult:
    """tree nodes [B, N]; valid [B, N] bool; logits [B, N, V] float32 (target at each node).
    Requests that couple (sb.coupled) verify by speculative/coupled.py, the others by the
    schemes above."""
    if sb.all_greedy:
        return verify_greedy(tree, valid, logits, max_depth)
    if sb.all_coupled:
        return verify_coupled(tree, valid, logits, sb, max_depth)
    res = verify_sampled(tree, valid, logits, sb, max_depth, max_children)
    if sb.coupled is not None:
        res = _merge(sb, verify_coupled(tree, valid, logits, sb, max_depth), res)
    return res


def verify_coupled(tree: DraftTree, valid: torch.Tensor, logits: torch.Tensor,
                   sb: SamplingBatch, max_depth: int) -> VerifyResult:
    """Greedy verification against the token plain decoding samples at each node (its race
    at output index steps + depth): the emitted text is plain decoding's."""
    b, n, v = logits.shape
    req = torch.arange(b, device=logits.device).repeat_interleave(n)
    target = coupled.node_tokens(logits.view(b * n, v), req, tree.depths.reshape(-1), sb)
    return verify_greedy_ids(tree, valid, target.view(b, n), max_depth)


def _merge(sb: SamplingBatch, by_coupling: VerifyResult, other: VerifyResult) -> VerifyResult:
    """Each request's result from its own scheme."""
    chain = other.chain_accepted if other.chain_accepted is not None \
        else torch.full_like(other.num_accepted, -1)
    return VerifyResult(*(coupled.per_row(sb, x, y) for x, y in (
        (by_coupling.num_accepted, other.num_accepted), (by_coupling.path, other.path),
        (by_coupling.tokens, other.tokens), (by_coupling.chain_accepted, chain))))


def verify_greedy(tree: DraftTree, valid: torch.Tensor, logits: torch.Tensor,
                  max_depth: int) -> VerifyResult:
    """What both schemes reduce to when every row is greedy (one-hot p), without building
    [B, N, V] distributions: from the root, follow the first child (in node order) whose
    token is the target's argmax at its parent; emit the argmax where no child matches."""
    return verify_greedy_ids(tree, valid, logits.argmax(-1), max_depth)


def verify_greedy_ids(tree: DraftTree, valid: torch.Tensor, target: torch.Tensor,
                      max_depth: int) -> VerifyResult:
    """verify_greedy from the target's argmax token at each node, target: [B, N] int64.
    Graph-safe (no host sync, shapes fixed by B, N and max_depth)."""
    b, n = target.shape
    rows = torch.arange(b, device=target.device)
    kids = children_mask(tree.parents) & valid[:, None, :]  # [B, N(parent), N(child)]
    match = kids & (tree.tokens[:, None, :] == target[:, :, None])
    first = torch.where(match.any(-1), match.to(torch.int8).argmax(-1), -1)  # [B, N]
    # the top-1 chain: children come in the draft's score order, so a node's first child
    # is its argmax; it is accepted where that child is the target's argmax
    top = kids.to(torch.int8).argmax(-1)  # [B, N]
    top_ok = kids.any(-1) & (tree.tokens.gather(1, top) == target)
    chain = torch.zeros(b, dtype=torch.long, device=target.device)
    cur = torch.zeros(b, dtype=torch.long, device=target.device)
    alive = torch.ones(b, dtype=torch.bool, device=target.device)
    accepted = torch.zeros_like(cur)
    path, toks = [cur], []
    c_cur, c_alive = cur, alive
    for _ in range(max_depth):
        c_alive = c_alive & top_ok[rows, c_cur]
        chain += c_alive.long()
        c_cur = top[rows, c_cur]
        nxt = first[rows, cur]
        moved = alive & (nxt >= 0)
        accepted += moved.long()
        alive &= moved
        cur = torch.where(moved, nxt, cur)
        path.append(cur)
        toks.append(tree.tokens[rows, cur])
    bonus = target[rows, cur]
    tokens = torch.stack(toks + [bonus], dim=1) if toks else bonus[:, None]  # [B, D+1]
    tokens = tokens.scatter(1, accepted[:, None], bonus[:, None])
    return VerifyResult(accepted, torch.stack(path, dim=1), tokens, chain)


def verify_sampled(tree: DraftTree, valid: torch.Tensor, logits: torch.Tensor,
                   sb: SamplingBatch, max_depth: int, max_children: int) -> VerifyResult:
    """The general scheme (any mix of greedy and sampled rows)."""
    b, n, _ = logits.shape
    dev = logits.device
    p_all = target_probs(logits, sb)  # [B, N, V]
    rows = torch.arange(b, device=dev)
    kids = children_mask(tree.parents) & valid[:, None, :]  # [B, N(parent), N(child)]
    order = torch.where(kids, torch.arange(n, device=dev), n).sort(-1).values[..., :max_children]
    child_idx = torch.where(order < n, order, -1)  # [B, N, C] children in node order

    cur = torch.zeros(b, dtype=torch.long, device=dev)
    alive = torch.ones(b, dtype=torch.bool, device=dev)
    accepted = torch.zeros(b, dtype=torch.long, device=dev)
    residual = p_all[:, 0].clone()  # [B, V] distribution to draw from at the stop node
    path, toks = [cur], []
    use_q = tree.draft_probs is not None
    for d in range(max_depth):
        step = sb.steps + d
        p = p_all[rows, cur].clone()  # [B, V]
        moved = torch.zeros(b, dtype=torch.bool, device=dev)
        nxt = cur.clone()
        u = seeded_uniform(sb.seeds ^ SALT_ACCEPT, step, max_children)  # [B, C]
        for c in range(max_children):
            child = child_idx[rows, cur, c]  # [B]
            ok = (child >= 0) & alive & ~moved
            y = tree.tokens[rows, child.clamp_min(0)]
            py = p.gather(1, y[:, None])[:, 0]
            if use_q:
                qy = tree.draft_probs[rows, child.clamp_min(0)].gather(1, y[:, None])[:, 0]
                take = ok & (u[:, c] * qy < py)
                reject_now = ok & ~take  # residual max(p - q, 0)
                q = tree.draft_probs[rows, child.clamp_min(0)]
                p = torch.where(reject_now[:, None], (p - q).clamp_min(0.0), p)
            else:
                take = ok & (u[:, c] * p.sum(-1) < py)
                p = torch.where((ok & ~take)[:, None], p.scatter(1, y[:, None], 0.0), p)
            nxt = torch.where(take, child, nxt)
            moved |= take
        # requests that stopped here draw their token from what is left of p
        stop_now = alive & ~moved
        residual = torch.where(stop_now[:, None], p, residual)
        accepted += moved.long()
        alive &= moved
        cur = nxt
        path.append(cur)
        toks.append(tree.tokens[rows, cur])
    # survivors of all depths draw the bonus from the target at their last node
    residual = torch.where(alive[:, None], p_all[rows, cur], residual)
    bonus = _sample(residual, sb.seeds, sb.steps + accepted)
    tokens = torch.stack(toks + [bonus], dim=1) if toks else bonus[:, None]  # [B, D+1]
    tokens = tokens.scatter(1, accepted[:, None], bonus[:, None])
    return VerifyResult(accepted, torch.stack(path, dim=1), tokens)
