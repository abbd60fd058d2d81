"""An independent plain-torch reference of one speculative step (gpt-fast style: draft K
tokens from q, score K+1 positions with the target, accept d_j with probability
min(1, p_j(d_j) / q_j(d_j)), at the first rejection resample from norm(max(p_j - q_j, 0)),
after K acceptances draw the bonus from p_K), written per request as a Python loop in
float64, and compared with the engine (proposers/expand.expand + speculative/verify.verify) on fixed
seeds: same accepted counts, same emitted tokens.

Both sides use the engine's counter-based random numbers (runner/sampler.seeded_uniform):
  draft j      argmax(q_j / -log U(seed ^ SALT_DRAFT, step + j, V))
  accept j     U(seed ^ SALT_ACCEPT, step + j, 1) < p_j(d_j) / q_j(d_j)
  residual     argmax(r / -log U(seed ^ SALT_RESIDUAL, step + a, V)), r = residual or p_K
  (plain)      argmax(p / -log U(seed, step, V)) for the prefill's token
A tree variant checks the point-mass scheme (children tried in node order, child c of a
depth-d node tested with U(seed ^ SALT_ACCEPT, step + d, C)[c] < p(y) / sum(p), a rejected
child's token removed from p). The end-to-end variant drives a real LLM with a draft model
through one VERIFY step and replays it with HF transformers.

Data flow (tests only): toy LMs / HF models -> reference step <-> expand + verify (engine).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from checkpoints import load_hf_model, make_perturbed_draft, make_tiny_checkpoint, random_prompts

from gearshift import SamplingParams
from gearshift.runner.sampler import SamplingBatch, seeded_uniform
from gearshift.speculative.proposers.expand import ExpandInputs, expand
from gearshift.speculative.verify import SALT_ACCEPT, SALT_DRAFT, SALT_RESIDUAL, verify

LogitsFn = Callable[[list[int]], torch.Tensor]  # token sequence -> next-token logits [V]


def uniforms(seed: int, step: int, n: int) -> torch.Tensor:
    return seeded_uniform(torch.tensor([seed]), torch.tensor([step]), n)[0].double()  # [n]


def processed(logits: torch.Tensor, temp: float, top_p: float) -> torch.Tensor:
    """softmax(logits / T) restricted to the nucleus (strictly better mass < top_p); float64.
    Greedy (T = 0) is the one-hot of the argmax."""
    if temp == 0.0:
        onehot = torch.zeros(logits.shape[-1], dtype=torch.float64)
        return onehot.scatter(0, logits.argmax()[None], 1.0)
    probs = torch.softmax(logits.double() / temp, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        keep = (sorted_p.cumsum(0) - sorted_p) < top_p
        keep[0] = True
        probs = torch.zeros_like(probs).scatter(0, order, sorted_p * keep)
    return probs / probs.sum()


def race(probs: torch.Tensor, seed: int, step: int) -> int:
    """One draw from probs [V] by the exponential race on the given random stream."""
    return int((probs / -torch.log(uniforms(seed, step, probs.shape[0]))).argmax())


def reference_chain_step(ctx: list[int], k: int, target: LogitsFn, draft: LogitsFn, seed: int,
                         step: int, temp: float, top_p: float) -> tuple[int, list[int]]:
    """One speculative step after the sequence ctx (its last token is pending).
    -> (accepted drafts, emitted tokens: accepted drafts + one more)."""
    drafts, qs = [], []
    for j in range(k):
        q = processed(draft(ctx + drafts), temp, top_p)
        drafts.append(race(q, seed ^ SALT_DRAFT, step + j))
        qs.append(q)
    ps = [processed(target(ctx + drafts[:j]), temp, top_p) for j in range(k + 1)]
    for j in range(k):
        p, q, d = ps[j], qs[j], drafts[j]
        if uniforms(seed ^ SALT_ACCEPT, step + j, 1)[0] < min(1.0, float(p[d] / q[d])):
            continue
        residual = (p - q).clamp_min(0.0)
        return j, drafts[:j] + [race(residual / residual.sum(), seed ^ SALT_RESIDUAL, step + j)]
    return k, drafts + [race(ps[k], seed ^ SALT_RESIDUAL, step + k)]


# ---------------------------------------------------------------- toy models, unit level

V, K, B = 12, 3, 600


def toy_models(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Target logits E[t-1] + F[t-2] (a trigram model); draft G[t-1] = E + noise (bigram)."""
    gen = torch.Generator().manual_seed(seed)
    e = 2.0 * torch.randn(V, V, generator=gen)
    f = 0.7 * torch.randn(V, V, generator=gen)
    g = e + 0.8 * torch.randn(V, V, generator=gen)
    return e, f, g


def engine_batch(b: int, temps: list[float], top_p: float, seed: int) -> SamplingBatch:
    gen = torch.Generator().manual_seed(seed)
    t = torch.tensor(temps).repeat(b // len(temps))
    return SamplingBatch(
        temperatures=t, top_p=torch.full((b,), top_p),
        top_k=torch.full((b,), -1, dtype=torch.int64),
        seeds=torch.randint(0, 2**32, (b,), generator=gen),
        steps=torch.randint(0, 5000, (b,), generator=gen),
        all_greedy=all(x == 0 for x in temps), any_greedy=any(x == 0 for x in temps),
        need_top_k=False, need_top_p=top_p < 1.0)


def engine_step(e, f, g, prev, roots, sb: SamplingBatch, topk: int, num_nodes: int,
                ks: torch.Tensor):
    """drafter.expand with the toy draft as its step function, then verify(). -> (tree, res)."""
    b = roots.shape[0]
    x = ExpandInputs(roots=roots, first_logits=g[roots], first_hidden=None,
                     prefix_lens=torch.full((b,), 10), rows=torch.arange(b),
                     scratch=torch.zeros(b, (K - 1) * topk, dtype=torch.int64),
                     base_scratch=torch.zeros(b, 1, dtype=torch.int64), pos_offset=0, depth=K,
                     topk=topk, num_nodes=num_nodes, max_prefix_len=10)
    tree = expand(x, lambda ids, hidden, fb: (g[ids], None), sb, None, V)
    parent_tok = tree.tokens.gather(1, tree.parents.clamp_min(0))  # [B, N]
    parent_tok[:, 0] = prev
    logits = e[tree.tokens] + f[parent_tok]  # [B, N, V]: the target after each node
    valid = tree.depths <= ks[:, None]  # a request drafting K_i < K sees only its depths
    return tree, verify(tree, valid, logits, sb, K, topk)


CHAIN_CASES = {"t1": ([1.0], 1.0), "t0.6-top_p0.8": ([0.6], 0.8),
               "mixed-greedy": ([1.0, 0.0, 0.8], 1.0)}


@pytest.mark.parametrize("case", list(CHAIN_CASES))
def test_chain_step_matches_reference(case):
    temps, top_p = CHAIN_CASES[case]
    e, f, g = toy_models(0)
    gen = torch.Generator().manual_seed(1)
    prev, roots = torch.randint(0, V, (B,), generator=gen), torch.randint(0, V, (B,), generator=gen)
    ks = torch.randint(1, K + 1, (B,), generator=gen)
    sb = engine_batch(B, temps, top_p, seed=2)
    _, res = engine_step(e, f, g, prev, roots, sb, 1, K + 1, ks)

    def target(seq):
        return e[seq[-1]] + f[seq[-2]]

    def draft(seq):
        return g[seq[-1]]

    hist = [0] * (K + 1)
    for i in range(B):
        a, toks = reference_chain_step([int(prev[i]), int(roots[i])], int(ks[i]), target, draft,
                                       int(sb.seeds[i]), int(sb.steps[i]),
                                       float(sb.temperatures[i]), top_p)
        assert int(res.num_accepted[i]) == a, f"row {i}"
        assert res.tokens[i, :a + 1].tolist() == toks, f"row {i}"
        hist[a] += 1
    assert min(hist) > 0, f"every acceptance length must occur: {hist}"


def reference_tree_verify(tokens: list[int], parents: list[int], valid: list[bool],
                          probs: list[torch.Tensor], seed: int, step: int, depth: int,
                          width: int) -> tuple[int, list[int]]:
    """Point-mass multi-draft verification of one request's tree (probs: target per node)."""
    node, out = 0, []
    for d in range(depth):
        p = probs[node].clone()
        u = uniforms(seed ^ SALT_ACCEPT, step + d, width)
        kids = [j for j in range(len(tokens)) if parents[j] == node and valid[j]]
        for c, child in enumerate(kids):
            if u[c] * p.sum() < p[tokens[child]]:
                node = child
                out.append(tokens[child])
                break
            p[tokens[child]] = 0.0
        else:
            return d, out + [race(p, seed ^ SALT_RESIDUAL, step + d)]
    return depth, out + [race(probs[node], seed ^ SALT_RESIDUAL, step + depth)]


@pytest.mark.parametrize("topk,num_nodes,top_p", [(2, 6, 1.0), (3, 8, 0.9)])
def test_tree_step_matches_reference(topk, num_nodes, top_p):
    e, f, g = toy_models(3)
    gen = torch.Generator().manual_seed(4)
    prev, roots = torch.randint(0, V, (B,), generator=gen), torch.randint(0, V, (B,), generator=gen)
    sb = engine_batch(B, [1.0, 0.7], top_p, seed=5)
    tree, res = engine_step(e, f, g, prev, roots, sb, topk, num_nodes, torch.full((B,), K))
    assert tree.draft_probs is None and tree.num_nodes == num_nodes
    hist = [0] * (K + 1)
    for i in range(B):
        toks, par = tree.tokens[i].tolist(), tree.parents[i].tolist()
        assert toks[1] == int(g[roots[i]].argmax())  # the draft's best first token is node 1
        ctx_prev = [int(prev[i]) if j == 0 else toks[par[j]] for j in range(num_nodes)]
        probs = [processed(e[toks[j]] + f[ctx_prev[j]], float(sb.temperatures[i]), top_p)
                 for j in range(num_nodes)]
        a, out = reference_tree_verify(toks, par, [True] * num_nodes, probs, int(sb.seeds[i]),
                                       int(sb.steps[i]), K, topk)
        assert int(res.num_accepted[i]) == a, f"row {i}"
        assert res.tokens[i, :a + 1].tolist() == out, f"row {i}"
        hist[a] += 1
    assert hist[0] > 0 and hist[1] > 0 and hist[2] > 0, hist


# ---------------------------------------------------------------- end to end: one VERIFY step

SMALL = dict(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
             num_attention_heads=2, num_key_value_heads=1, head_dim=16, with_tokenizer=False)


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory):
    target = make_tiny_checkpoint(tmp_path_factory.mktemp("ref_target"), "llama", seed=11, **SMALL)
    return target, make_perturbed_draft(target, tmp_path_factory.mktemp("ref_draft"))


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_engine_verify_step_matches_reference(make_llm, small_pair, top_p):
    target_dir, draft_dir = small_pair
    llm = make_llm(target_dir, speculative_algorithm="draft", draft_model=str(draft_dir),
                   num_draft_tokens=K, spec_policy="always", spec_sampling="rejection",
                   max_num_seqs=64, overlap_schedule=False)  # one step -> its own outputs
    prompts = random_prompts([3 + i % 9 for i in range(40)], seed=12, vocab=16)
    seeds = [(i * 0x9E3779B1 + 17) % 2**32 for i in range(len(prompts))]
    for i, (ids, s) in enumerate(zip(prompts, seeds)):
        llm.engine.add_request(f"r{i}", ids, SamplingParams(max_tokens=16, temperature=1.0,
                                                            top_p=top_p, seed=s, ignore_eos=True))
    first = {o.request_id: o for o in llm.engine.step()}  # prefill: one token each
    assert len(first) == len(prompts)
    verify_out = {o.request_id: o for o in llm.engine.step()}  # one VERIFY step, K = 3
    for i in range(len(prompts)):
        llm.engine.abort_request(f"r{i}")
    assert all(o.spec[0] == K for o in verify_out.values())

    hf_t, hf_d = load_hf_model(target_dir), load_hf_model(draft_dir)

    def logits_fn(model) -> LogitsFn:
        return lambda seq: model(torch.tensor([seq])).logits[0, -1]

    hist = [0] * (K + 1)
    with torch.no_grad():
        for i, (ids, s) in enumerate(zip(prompts, seeds)):
            t1 = race(processed(logits_fn(hf_t)(ids), 1.0, top_p), s, 0)  # plain sampler
            assert first[f"r{i}"].new_token_ids == [t1]
            a, toks = reference_chain_step(ids + [t1], K, logits_fn(hf_t), logits_fn(hf_d), s, 1,
                                           1.0, top_p)
            assert verify_out[f"r{i}"].spec[:2] == (K, a), f"request {i}"  # (proposed, accepted)
            assert verify_out[f"r{i}"].new_token_ids == toks, f"request {i}"
            hist[a] += 1
    assert sum(1 for h in hist if h) >= 3, f"acceptance lengths too uniform: {hist}"
