"""Checks of the draft's early follow-up (speculative/follow_up.py) shared by the CPU and
GPU tiers: acceptance scripted through the target's tokens, and a run that records each
VERIFY step's drafts."""

from __future__ import annotations

from checkpoints import random_prompts
from eager_graphs import install

from gearshift import SamplingParams
from gearshift.speculative import runner as spec_runner

PROMPTS = random_prompts([5, 19, 11, 30, 7, 3], seed=8)


def script_acceptance(monkeypatch) -> None:
    """Chains accept K - (i % 2) drafts of request i: the target's token at each verified
    node is made the next draft's (a random head accepts none, and a follow-up over the
    root alone would hide which rows, slots and features it takes)."""
    orig = spec_runner.greedy_verify

    def scripted(runner, tree, target, flat, node_tok, k, depth, record, *rest):
        n, ks, toks = tree.tokens.shape[1], k.tolist(), tree.tokens.tolist()
        target = target.clone()
        rows = node_tok.tolist() if node_tok is not None else range(flat.shape[0])
        for f, row in zip(flat.tolist(), rows):
            i, j = divmod(f, n)
            if ks[i] == 0:  # plain (a prefill chunk riding along): the target's own token
                continue
            a = max(min(ks[i], n - 1) - i % 2, 0)
            if j < a:
                target[row] = toks[i][j + 1]
            elif j == a and j + 1 < n:  # the bonus: anything but the next draft
                target[row] = (toks[i][j + 1] + 1) % runner.model.config.vocab_size
        return orig(runner, tree, target, flat, node_tok, k, depth, record, *rest)

    monkeypatch.setattr(spec_runner, "greedy_verify", scripted)


def follow_run(make_llm, model_dir, early: bool, stand_in: bool = True, **opts):
    """An engine from `make_llm` (on the graph stand-in unless told) generating PROMPTS,
    the early follow-up on or off. -> (each VERIFY step's drafts until a request first
    finishes, (proposed, accepted), early follow-ups launched, VERIFY steps with a prefill
    chunk riding along until then)."""
    llm = make_llm(model_dir, max_num_seqs=8, **opts)
    if stand_in:
        install(llm)
    eng = llm.engine
    follow, proposer, calls, proposals = eng.spec.follow, eng.spec.proposer, [], []
    if early:
        orig = follow.follow_accepted
        follow.follow_accepted = lambda *a: calls.append(1) or orig(*a)
    else:
        follow.follows_early = lambda plan, width: False
    propose, finished = proposer.propose, eng.scheduler._finish
    riders = []

    def spy(ctx):  # each request's drafts (a chain's nodes past its own K are junk)
        tree, nodes = propose(ctx)
        if not finish:  # a prefill chunk rides along: a request at K = 0 not yet decoding
            riders.append(any(r.num_computed_tokens < len(r.prompt_token_ids) for r in ctx.reqs))
        keep = [tree.num_nodes if ctx.topk > 1 else k + 1 for k in ctx.draft_lens]
        if proposals is not None and not finish:
            proposals.append([t[:n] for t, n in zip(tree.tokens.tolist(), keep)])
        return tree, nodes

    # once a request finishes, the early follow-up (launched before it is known) has run
    # over it too: a different batch, whose GEMMs round differently, so the comparison ends
    finish: list = []
    proposer.propose = spy
    eng.scheduler._finish = lambda req, reason: finish.append(1) or finished(req, reason)
    params = [SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True),
              SamplingParams(max_tokens=40, temperature=0.9, seed=3, ignore_eos=True)]
    llm.generate(PROMPTS, [params[i % 3 == 2] for i in range(len(PROMPTS))])
    stats = llm.spec_stats()
    return proposals, (stats["proposed"], stats["accepted"]), len(calls), sum(riders)
