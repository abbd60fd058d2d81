"""The draft's follow-up over a VERIFY step's accepted tokens, laid out on the device and
launched before the host reads the step (speculative/follow_up.py), leaves the draft
exactly where the host-built follow-up after commit leaves it: the same proposals step by
step (which read the draft's KV and seed, and after plain steps its stored features), for
EAGLE-3 chains and trees, K mixed per request (plain steps between), sampled rows and the
prefix cache on or off, with drafts accepted (scripted: a random head accepts none). On
the graph stand-in, where the early path applies. Greedy text equals plain decoding
either way (test_spec_greedy.py)."""

from __future__ import annotations

import pytest
from checkpoints import make_perturbed_draft, random_prompts
from eager_graphs import install
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import SamplingParams
from gearshift.speculative import verify_batch as vb

PROMPTS = random_prompts([5, 19, 11, 30, 7, 3], seed=8)


def _script_acceptance(monkeypatch) -> None:
    """Chains accept K - (i % 2) drafts of request i: the target's token at each verified
    node is made the next draft's (a random head accepts none, and a follow-up over the
    root alone would hide which rows, slots and features it takes)."""
    orig = vb.greedy_verify

    def scripted(runner, tree, target, flat, node_tok, k, depth, record, **kw):
        n, ks, toks = tree.tokens.shape[1], k.tolist(), tree.tokens.tolist()
        target = target.clone()
        rows = node_tok.tolist() if node_tok is not None else range(flat.shape[0])
        for f, row in zip(flat.tolist(), rows):
            i, j = divmod(f, n)
            a = max(min(ks[i], n - 1) - i % 2, 0)
            if j < a:
                target[row] = toks[i][j + 1]
            elif j == a and j + 1 < n:  # the bonus: anything but the next draft
                target[row] = (toks[i][j + 1] + 1) % runner.model.config.vocab_size
        return orig(runner, tree, target, flat, node_tok, k, depth, record, **kw)

    monkeypatch.setattr(vb, "greedy_verify", scripted)


def _run(make_llm, model_dir, early: bool, **opts):
    """-> (each VERIFY step's drafts until a request first finishes, (proposed, accepted),
    early follow-ups launched)."""
    llm = make_llm(model_dir, max_num_seqs=8, **opts)
    install(llm)
    eng = llm.engine
    follow, proposer, calls, proposals = eng.spec.follow, eng.spec.proposer, [], []
    if early:
        orig = follow.follow_accepted
        follow.follow_accepted = lambda *a: calls.append(1) or orig(*a)
    else:
        follow.follows_early = lambda plan: False
    propose, finished = proposer.propose, eng.scheduler._finish

    def spy(ctx):  # each request's drafts (a chain's nodes past its own K are junk)
        tree, nodes = propose(ctx)
        keep = [tree.num_nodes if ctx.topk > 1 else k + 1 for k in ctx.num_draft_tokens]
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
    return proposals, (stats["proposed"], stats["accepted"]), len(calls)


@pytest.mark.parametrize("case", ["chain", "chain-no-cache", "tree", "random-k", "draft-model"])
def test_early_follow_up_leaves_the_draft_where_the_late_one_does(make_llm, tiny_llama_dir,
                                                                   tmp_path, monkeypatch, case):
    if case != "tree":  # a tree's path is recorded inside verification: its own acceptance
        _script_acceptance(monkeypatch)
    if case == "draft-model":
        spec = dict(speculative_algorithm="draft",
                    draft_model=str(make_perturbed_draft(tiny_llama_dir, tmp_path / "d")))
    else:
        head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
        spec = dict(speculative_algorithm="eagle3", draft_model=str(head))
    spec.update(num_draft_tokens=3, spec_policy="random" if case == "random-k" else "always",
                draft_topk=2 if case == "tree" else 1,
                enable_prefix_caching=case != "chain-no-cache")
    late = _run(make_llm, tiny_llama_dir, early=False, **spec)
    early = _run(make_llm, tiny_llama_dir, early=True, **spec)
    # the draft model extends eagerly (no graphed follow-up): the host lays it out
    assert (early[2] > 5) == (case != "draft-model")
    assert early[:2] == late[:2] and len(early[0]) > 5
    assert early[1][1] > 0 or case == "tree"
