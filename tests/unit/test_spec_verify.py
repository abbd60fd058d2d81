"""verify(): greedy acceptance rules on hand-built trees, and statistical exactness of both
sampling schemes (chain rejection sampling with q, tree point-mass tests) on a tiny vocabulary.

The statistical tests use a toy "language model" given by tables: the target logits for the
token at depth d after tokens t_1..t_d are L[d][t_1, ..., t_d] ([V]). One verify() call emits
t_1..t_{a+1}; the remaining tokens up to depth D+1 are then sampled directly from the target
(what the next steps would do), so under losslessness the emitted (t_1, ..., t_{D+1}) has
exactly the joint distribution prod_d p_d(t_d | t_<d). A chi-square goodness-of-fit test
compares counts over all V^(D+1) sequences (cells with expected count < 5 pooled) with a
false-alarm rate of 1e-4 per test (p-value from the exact chi-square tail). Seeds are fixed,
so each test is deterministic; 1e-4 is the chance that a correct engine fails for a given
seed choice.

Data flow (tests only): tables -> DraftTree + node logits -> speculative/verify.py -> VerifyResult.
"""

from __future__ import annotations

import pytest
import torch

from gearshift.runner.sampler import SamplingBatch, seeded_uniform
from gearshift.speculative.tree import DraftTree, chain_tree
from gearshift.speculative.verify import SALT_DRAFT, verify

ALPHA = 1e-4  # false-alarm rate of every chi-square test in this file
M32 = 0xFFFFFFFF
SEED_MUL = 0x9E3779B1  # odd: seeds (i * SEED_MUL) mod 2**32 are distinct 32-bit values


def sampling_batch(n: int, temp: float = 1.0, top_p: float = 1.0, step: int = 7,
                   temps: torch.Tensor | None = None) -> SamplingBatch:
    t = torch.full((n,), temp) if temps is None else temps
    return SamplingBatch(
        temperatures=t, top_p=torch.full((n,), top_p),
        top_k=torch.full((n,), -1, dtype=torch.int64),
        seeds=(torch.arange(n, dtype=torch.int64) * SEED_MUL) & M32,
        steps=torch.full((n,), step, dtype=torch.int64),
        all_greedy=bool((t == 0).all()), any_greedy=bool((t == 0).any()),
        need_top_k=False, need_top_p=top_p < 1.0)


def processed(logits: torch.Tensor, temp: float, top_p: float) -> torch.Tensor:
    """Target / draft distribution: softmax(logits / T), nucleus top_p (a token is kept
    when the mass of strictly more likely tokens is < top_p), renormalised. [..., V]."""
    probs = torch.softmax(logits.double() / temp, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = (sorted_p.cumsum(-1) - sorted_p) < top_p
        keep[..., 0] = True
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def nucleus_margin(logits: torch.Tensor, temp: float, top_p: float) -> float:
    """Distance of every row's cumulative masses from top_p (float32 vs float64 safety)."""
    probs = torch.softmax(logits.double() / temp, dim=-1).sort(-1, descending=True).values
    return float(((probs.cumsum(-1) - probs) - top_p).abs().min())


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of integer counts [C] to probabilities [C]; cells with expected
    count < 5 are pooled. Impossible cells (p == 0) must be empty."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    assert counts[probs == 0].sum() == 0, "a token of target probability 0 was emitted"
    counts, probs = counts[probs > 0], probs[probs > 0]
    exp = probs * counts.sum()
    small = exp < 5
    obs_cells, exp_cells = counts[~small], exp[~small]
    if small.any():  # pool the small cells; a pool still < 5 joins the smallest cell
        pool_obs, pool_exp = counts[small].sum(), exp[small].sum()
        if pool_exp < 5:
            i = exp_cells.argmin()
            obs_cells, exp_cells = obs_cells.clone(), exp_cells.clone()
            obs_cells[i] += pool_obs
            exp_cells[i] += pool_exp
        else:
            obs_cells = torch.cat([obs_cells, pool_obs[None]])
            exp_cells = torch.cat([exp_cells, pool_exp[None]])
    stat = ((obs_cells - exp_cells) ** 2 / exp_cells).sum()
    dof = obs_cells.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2))


def lookup(table: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
    """table [V]*d + [V], prefix [N, d] -> rows [N, V]."""
    if prefix.shape[1] == 0:
        return table.expand(prefix.shape[0], -1)
    return table[tuple(prefix.unbind(1))]


def joint(tables: list[torch.Tensor]) -> torch.Tensor:
    """Per-depth conditional tables -> joint probability of the sequence [V]*(D+1)."""
    out = tables[0]
    for t in tables[1:]:
        out = out[..., None] * t
    return out


def complete(tokens: torch.Tensor, accepted: torch.Tensor, probs: list[torch.Tensor],
             gen: torch.Generator) -> torch.Tensor:
    """Keep the emitted tokens[:, :a+1], sample the rest from the target tables. [N, D+1]."""
    seq = tokens.clone()
    for j in range(1, len(probs)):
        draw = torch.multinomial(lookup(probs[j], seq[:, :j]).float(), 1, generator=gen)[:, 0]
        seq[:, j] = torch.where(accepted < j, draw, seq[:, j])
    return seq


def seq_counts(seq: torch.Tensor, v: int) -> torch.Tensor:
    flat = torch.zeros(seq.shape[0], dtype=torch.int64)
    for j in range(seq.shape[1]):
        flat = flat * v + seq[:, j]
    return torch.bincount(flat, minlength=v ** seq.shape[1])


# ---------------------------------------------------------------- greedy rules

def test_greedy_chain_accepts_longest_matching_prefix_plus_argmax():
    v, k = 10, 4
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(k + 2, k + 1, v, generator=gen)  # one row per match length 0..K+1
    target = logits.argmax(-1)  # [B, K+1]: the target's choice after each node
    drafts = target[:, :k].clone()
    for m in range(k + 1):  # row m matches exactly m drafts (row K+1: all, like row K)
        if m < k:
            drafts[m, m] = (target[m, m] + 1) % v
            drafts[m, m + 1:] = (target[m, m + 1:k] + 3) % v  # later mismatches do not matter
    b = drafts.shape[0]
    root = torch.full((b,), 5)
    for probs in (None, torch.zeros(b, k, v).scatter_(-1, drafts[..., None], 1.0)):
        res = verify(chain_tree(root, drafts, probs), torch.ones(b, k + 1, dtype=torch.bool),
                     logits, sampling_batch(b, temp=0.0), k, 1)
        want = torch.tensor([0, 1, 2, 3, 4, 4])
        assert res.num_accepted.tolist() == want.tolist()
        for i, a in enumerate(want.tolist()):
            assert res.tokens[i, :a].tolist() == drafts[i, :a].tolist()
            assert res.tokens[i, a] == target[i, a]  # the bonus: argmax at the stop node
            assert res.path[i].tolist() == list(range(a + 1)) + [a] * (k - a)


def _branching_tree(b: int) -> tuple[DraftTree, torch.Tensor]:
    """root(0) -> a(1), b(2); a -> c(3), d(4); b -> e(5), f(6). Logits whose argmax picks
    the SECOND child at depth 1 (b) and the second child of b at depth 2 (f)."""
    tokens = torch.tensor([9, 1, 2, 3, 4, 5, 6]).expand(b, 7).clone()
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, 2]).expand(b, 7).clone()
    depths = torch.tensor([0, 1, 1, 2, 2, 2, 2]).expand(b, 7).clone()
    logits = torch.zeros(b, 7, 10)
    logits[:, 0, 2] = 5.0  # after the root: token 2 = node b
    logits[:, 1, 3] = 5.0  # after a: c (not on the path)
    logits[:, 2, 6] = 5.0  # after b: token 6 = node f
    logits[:, 6, 7] = 5.0  # after f: bonus 7
    return DraftTree(tokens, parents, depths), logits


def test_greedy_tree_follows_matching_child_at_each_depth():
    tree, logits = _branching_tree(2)
    res = verify(tree, torch.ones(2, 7, dtype=torch.bool), logits,
                 sampling_batch(2, temp=0.0), 2, 2)
    assert res.num_accepted.tolist() == [2, 2]
    assert res.path.tolist() == [[0, 2, 6]] * 2
    assert res.tokens.tolist() == [[2, 6, 7]] * 2


def test_greedy_tree_reports_what_its_top_1_chain_alone_accepts():
    """chain_accepted: the walk through each node's FIRST child (the draft's argmax) only,
    paired evidence for goodput's tree gain. Row 0: the target picks b (second child):
    the tree accepts 2, its top-1 chain root -> a none. Row 1: the target picks a, then
    c: both accept 2. Row 2: a, then d (second child of a): tree 2, top-1 chain 1."""
    tree, logits = _branching_tree(3)
    logits[1:] = 0.0
    logits[1:, 0, 1] = 5.0  # after the root: a
    logits[1, 1, 3] = 5.0  # row 1, after a: c
    logits[2, 1, 4] = 5.0  # row 2, after a: d
    res = verify(tree, torch.ones(3, 7, dtype=torch.bool), logits,
                 sampling_batch(3, temp=0.0), 2, 2)
    assert res.num_accepted.tolist() == [2, 2, 2]
    assert res.chain_accepted.tolist() == [0, 2, 1]
    # a chain is its own top-1 chain
    chain = chain_tree(torch.full((2,), 5), torch.tensor([[1, 3], [1, 3]]))
    res = verify(chain, torch.ones(2, 3, dtype=torch.bool), logits[1:, [0, 1, 3]],
                 sampling_batch(2, temp=0.0), 2, 1)
    assert res.num_accepted.tolist() == res.chain_accepted.tolist() == [2, 1]


def test_invalid_nodes_are_never_accepted_greedy():
    tree, logits = _branching_tree(3)
    valid = torch.ones(3, 7, dtype=torch.bool)
    valid[0, 2] = False  # b (and so its subtree) missing: nothing matches at depth 1
    valid[1, 6] = False  # f missing: stop at b, emit f's token from the target's argmax
    valid[2, 5:] = False
    res = verify(tree, valid, logits, sampling_batch(3, temp=0.0), 2, 2)
    assert res.num_accepted.tolist() == [0, 1, 1]
    assert res.path.tolist() == [[0, 0, 0], [0, 2, 2], [0, 2, 2]]
    assert res.tokens[:, 0].tolist() == [2, 2, 2] and res.tokens[1:, 1].tolist() == [6, 6]


def test_greedy_rows_exact_inside_a_sampling_batch():
    """Mixed batch (any_greedy, not all_greedy): greedy rows still follow the argmax."""
    tree, logits = _branching_tree(64)
    temps = torch.tensor([0.0, 1.0]).repeat(32)
    res = verify(tree, torch.ones(64, 7, dtype=torch.bool), logits,
                 sampling_batch(64, temps=temps), 2, 2)
    assert res.tokens[::2].tolist() == [[2, 6, 7]] * 32
    assert res.num_accepted[::2].tolist() == [2] * 32


# ---------------------------------------------------------------- sampling: exactness

V, DEPTH, N = 6, 2, 40000
CASES = [(1.0, 1.0), (0.7, 0.8)]  # (temperature, top_p)


def _lm(seed: int, temp: float, top_p: float):
    """Target logits tables L[d] ([V]*(d+1)) and a related draft M[d] for d < DEPTH."""
    gen = torch.Generator().manual_seed(seed)
    target = [1.5 * torch.randn((V,) * (d + 1), generator=gen) for d in range(DEPTH + 1)]
    draft = [t + torch.randn(t.shape, generator=gen) for t in target[:DEPTH]]
    if top_p < 1.0:  # float32 (engine) and float64 (here) must agree on every nucleus
        assert min(nucleus_margin(t, temp, top_p) for t in target + draft) > 1e-4
    return target, draft


@pytest.mark.parametrize("temp,top_p", CASES)
def test_chain_rejection_sampling_is_exact(temp, top_p):
    target, draft = _lm(1, temp, top_p)
    sb = sampling_batch(N, temp, top_p)
    p = [processed(t, temp, top_p) for t in target]
    drafts = torch.empty(N, 0, dtype=torch.int64)
    qs = []
    for j in range(DEPTH):  # drafts sampled from q as the drafter does (exponential race)
        q = lookup(processed(draft[j], temp, top_p), drafts).float()  # [N, V]
        e = -torch.log(seeded_uniform(sb.seeds ^ SALT_DRAFT, sb.steps + j, V))
        drafts = torch.cat([drafts, (q / e).argmax(-1, keepdim=True)], 1)
        qs.append(q)
    tree = chain_tree(torch.zeros(N, dtype=torch.int64), drafts, torch.stack(qs, 1))
    logits = torch.stack([lookup(target[j], drafts[:, :j]) for j in range(DEPTH + 1)], 1)
    res = verify(tree, torch.ones(N, DEPTH + 1, dtype=torch.bool), logits, sb, DEPTH, 1)

    hist = torch.bincount(res.num_accepted, minlength=DEPTH + 1)
    assert (hist > N // 20).all(), f"every acceptance length must be exercised: {hist}"
    seq = complete(res.tokens, res.num_accepted, p, torch.Generator().manual_seed(2))
    assert chi2_pvalue(torch.bincount(seq[:, 0], minlength=V), p[0]) > ALPHA
    assert chi2_pvalue(seq_counts(seq, V), joint(p)) > ALPHA


@pytest.mark.parametrize("temp,top_p", CASES)
def test_mixed_proposers_in_one_chain_step_are_exact(temp, top_p):
    """One step, two proposers (eagle3+suffix): even rows drafted by sampling from q (the
    model), odd rows deterministic drafts (suffix decoding, point masses), merged into one
    tree whose suffix rows carry a one-hot q (proposers/hybrid.py merge). Both halves keep
    the target's joint law."""
    from gearshift.speculative.proposers.hybrid import merge

    target, draft = _lm(6, temp, top_p)
    sb = sampling_batch(N, temp, top_p)
    p = [processed(t, temp, top_p) for t in target]
    drafts = torch.empty(N, 0, dtype=torch.int64)
    qs = []
    for j in range(DEPTH):
        q = lookup(processed(draft[j], temp, top_p), drafts).float()  # [N, V]
        e = -torch.log(seeded_uniform(sb.seeds ^ SALT_DRAFT, sb.steps + j, V))
        drafts = torch.cat([drafts, (q / e).argmax(-1, keepdim=True)], 1)
        qs.append(q)
    root = torch.zeros(N, dtype=torch.int64)
    model = chain_tree(root, drafts, torch.stack(qs, 1))
    fixed = torch.zeros(N, 0, dtype=torch.int64)  # a copied span: the draft's 2nd choice
    for j in range(DEPTH):
        nxt = lookup(draft[j], fixed).argsort(-1, descending=True)[:, 1:2]
        fixed = torch.cat([fixed, nxt], 1)
    is_suffix = torch.arange(N) % 2 == 1
    tree = merge(model, chain_tree(root, fixed), is_suffix)
    assert tree.draft_probs[is_suffix, 1:].amax(-1).eq(1.0).all()
    seq_drafts = tree.tokens[:, 1:]
    logits = torch.stack([lookup(target[j], seq_drafts[:, :j]) for j in range(DEPTH + 1)], 1)
    res = verify(tree, torch.ones(N, DEPTH + 1, dtype=torch.bool), logits, sb, DEPTH, 1)

    seq = complete(res.tokens, res.num_accepted, p, torch.Generator().manual_seed(7))
    for rows in (~is_suffix, is_suffix):
        assert (res.num_accepted[rows] > 0).any()
        assert chi2_pvalue(torch.bincount(seq[rows, 0], minlength=V), p[0]) > ALPHA
        assert chi2_pvalue(seq_counts(seq[rows], V), joint(p)) > ALPHA


def _tree_shapes(p: list[torch.Tensor]) -> list[tuple[list[int], list[int], list[bool]]]:
    """Three 7-node trees (tokens, parents, valid) built from the target's own ranking:
    high-probability children, low-probability children (one of target probability 0 under
    top-p, and a duplicate child token),
    and a deterministic chain. Invalid nodes carry the most tempting token."""
    def rank(prefix: tuple[int, ...], support: bool = False) -> list[int]:
        probs = p[len(prefix)][prefix]
        order = probs.argsort(descending=True).tolist()
        return [t for t in order if probs[t] > 0] if support else order

    r0 = rank(())
    a, b = r0[0], r0[1]
    top = ([0, a, b, rank((a,))[0], rank((a,))[1], rank((b,))[0], rank((b,))[1]],
           [-1, 0, 0, 1, 1, 2, 2], [True] * 6 + [False])
    lo, z = rank((), support=True)[-1], r0[-1]  # z has probability 0 under top-p
    low = ([0, lo, z, lo, rank((lo,), support=True)[-1], rank((lo,))[0], rank((z,))[0]],
           [-1, 0, 0, 0, 1, 1, 2], [True] * 6 + [False])
    c1 = r0[2]
    chain = ([0, c1, rank((c1,))[1], r0[0], r0[0], r0[0], r0[0]],
             [-1, 0, 1, 0, 0, 0, 0], [True, True, True, False, False, False, False])
    return [top, low, chain]


@pytest.mark.parametrize("temp,top_p", CASES)
def test_tree_point_mass_scheme_is_exact(temp, top_p):
    target, _ = _lm(3, temp, top_p)
    p = [processed(t, temp, top_p) for t in target]
    shapes = _tree_shapes(p)
    n_shapes = len(shapes)
    shape_of = torch.arange(N) % n_shapes
    tok = torch.tensor([s[0] for s in shapes])[shape_of]  # [N, 7]
    par = torch.tensor([s[1] for s in shapes])[shape_of]
    valid = torch.tensor([s[2] for s in shapes])[shape_of]
    depth = torch.where(par < 0, 0, torch.where(par == 0, 1, 2))
    logits = torch.empty(N, 7, V)
    for i in range(7):  # node i's logits: the target after the node's path
        parent_tok = tok.gather(1, par[:, i:i + 1].clamp_min(0))[:, 0]
        path = torch.stack([parent_tok, tok[:, i]], 1)
        d = depth[:, i]
        logits[:, i] = torch.where(
            d[:, None] == 0, target[0].expand(N, V),
            torch.where(d[:, None] == 1, lookup(target[1], tok[:, i:i + 1]),
                        lookup(target[2], path)))
    garbage = 10 * torch.randn(N, 7, V, generator=torch.Generator().manual_seed(4))
    logits = torch.where(valid[..., None], logits, garbage)
    tree = DraftTree(tok, par, depth)
    res = verify(tree, valid, logits, sampling_batch(N, temp, top_p), DEPTH, 3)

    on_path = valid.gather(1, res.path)
    assert on_path.all(), "an invalid node was accepted"
    path_tok = tok.gather(1, res.path[:, 1:])  # accepted tokens are the path's tokens
    for j in range(DEPTH):
        rows = res.num_accepted > j
        assert (res.tokens[rows, j] == path_tok[rows, j]).all()
    seq = complete(res.tokens, res.num_accepted, p, torch.Generator().manual_seed(5))
    for s in range(n_shapes):
        rows = shape_of == s
        assert (res.num_accepted[rows] > 0).any()
        assert chi2_pvalue(torch.bincount(seq[rows, 0], minlength=V), p[0]) > ALPHA, s
        assert chi2_pvalue(seq_counts(seq[rows], V), joint(p)) > ALPHA, s


def test_greedy_fast_path_equals_the_general_scheme():
    """verify() on an all-greedy batch takes verify_greedy (no [B, N, V] distributions);
    it must give what the general scheme gives with one-hot targets, on random trees with
    duplicate sibling tokens, invalid nodes and chains with draft probabilities."""
    from gearshift.speculative.verify import verify_greedy, verify_sampled

    g = torch.Generator().manual_seed(3)
    b, n, v, depth, width = 64, 9, 5, 3, 3
    parents = torch.tensor([-1, 0, 0, 0, 1, 1, 2, 4, 4]).expand(b, n)
    depths = torch.tensor([0, 1, 1, 1, 2, 2, 2, 3, 3]).expand(b, n)
    tokens = torch.randint(0, v, (b, n), generator=g)  # small vocab: many matches, duplicates
    valid = torch.rand(b, n, generator=g) > 0.15
    valid[:, 0] = True
    logits = torch.randn(b, n, v, generator=g)
    tree = DraftTree(tokens, parents, depths)
    sb = sampling_batch(b, temp=0.0)
    fast = verify_greedy(tree, valid, logits, depth)
    slow = verify_sampled(tree, valid, logits, sb, depth, width)
    assert (fast.num_accepted > 0).any() and (fast.num_accepted == 0).any()
    for a, c in ((fast.num_accepted, slow.num_accepted), (fast.path, slow.path),
                 (fast.tokens, slow.tokens)):
        assert torch.equal(a, c)
    drafts = torch.randint(0, v, (b, 4), generator=g)
    q = torch.softmax(torch.randn(b, 5, v, generator=g), -1)
    chain = chain_tree(tokens[:, 0], drafts, q)
    ones = torch.ones(b, 5, dtype=torch.bool)
    logits = torch.randn(b, 5, v, generator=g)
    fast = verify_greedy(chain, ones, logits, 4)
    slow = verify_sampled(chain, ones, logits, sb, 4, 1)
    assert torch.equal(fast.tokens, slow.tokens) and torch.equal(fast.num_accepted,
                                                                 slow.num_accepted)
