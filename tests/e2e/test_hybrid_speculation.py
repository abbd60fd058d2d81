"""EAGLE-3 beside suffix decoding (`eagle3+suffix`) end to end on the embedded default model
(CPU): greedy output equals plain decoding token for token (chains of mixed proposers and
lengths in one step, trees, the default policy, preemption, the prefix cache on, off and
hit), coupled seeded output equals plain seeded output, and the counters: each request's
proposer histogram, spec_stats() per proposer.

Data flow (tests only): the default model -> LLM (no speculation) = reference token ids <->
LLM(speculative_algorithm="eagle3+suffix", ...) token ids, spec_stats(), outputs' spec.
"""

from __future__ import annotations

import pytest
from copy_prompts import SNIPPET, prompts
from test_suffix_decoding import GREEDY, SAMPLED, run

from gearshift import SamplingParams
from gearshift.config import ConfigError, EngineConfig
from gearshift.models.default import default_target_dir
from gearshift.speculative.proposers.suffix import INDEX_LAG
from gearshift.speculative.proposers.suffix_index import RequestIndex


@pytest.fixture(scope="module")
def model() -> str:
    return str(default_target_dir())


VARIANTS = {
    "always": dict(spec_policy="always"),
    "random": dict(spec_policy="random", suffix_draft_tokens=32),
    "goodput": dict(max_num_seqs=4),
    "tree": dict(tree_width=2, tree_budget=8, spec_policy="always"),
    "tree-random": dict(tree_width=3, tree_budget=10, spec_policy="random"),
    "preempt": dict(spec_policy="always", kv_cache_tokens=256, max_num_batched_tokens=64),
    "no-prefix-cache": dict(spec_policy="always", enable_prefix_caching=False,
                            max_num_batched_tokens=32),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_hybrid_speculation_equals_plain(make_llm, model, variant):
    plain = make_llm(model, speculative_algorithm=None)
    ps = prompts(plain.tokenizer)
    ref = run(plain, ps, GREEDY)
    llm = make_llm(model, speculative_algorithm="eagle3+suffix", **VARIANTS[variant])
    outs = llm.generate(ps, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outs] == ref
    stats = llm.spec_stats()
    assert stats["algorithm"] == "eagle3+suffix"
    own = stats["proposers"]
    assert own["suffix"]["drafts"] > 0 and own["eagle3"]["drafts"] > 0
    assert own["suffix"]["proposed"] + own["eagle3"]["proposed"] == stats["proposed"]
    assert own["suffix"]["accepted"] + own["eagle3"]["accepted"] == stats["accepted"]
    assert llm.engine.spec.proposer.mixed_steps > 0, "no step mixed the two proposers"
    hist = {}
    for o in outs:  # per request: VERIFY steps by proposer
        assert sum(o.spec.proposer_hist.values()) == o.spec.verify_steps
        for p, n in o.spec.proposer_hist.items():
            hist[p] = hist.get(p, 0) + n
    assert hist == {"eagle3": own["eagle3"]["drafts"], "suffix": own["suffix"]["drafts"]}
    if variant == "preempt":
        assert llm.stats()["preemptions"] > 0, "the pool was meant to be too small"
    if variant.startswith("tree"):
        assert stats["tree_steps"] > 0
    if variant in ("always", "random"):  # copying: suffix drafts past EAGLE-3's K of 4
        assert max(k for o in outs for k in o.spec.k_hist) > 4


def test_the_prefix_cache_and_the_output_cache_keep_the_output(make_llm, model):
    plain = make_llm(model, speculative_algorithm=None)
    ps = prompts(plain.tokenizer)
    ref = run(plain, ps, GREEDY)
    llm = make_llm(model, speculative_algorithm="eagle3+suffix", spec_policy="always")
    assert run(llm, ps, GREEDY) == ref
    assert run(llm, ps, GREEDY) == ref
    assert llm.engine.prefix_cache_stats()["hit_tokens"] > 100
    assert llm.spec_stats()["proposers"]["suffix"]["from_cache"] > 0


@pytest.mark.parametrize("variant", ["chain", "tree"])
def test_coupled_hybrid_speculation_keeps_the_seeded_text(make_llm, model, variant):
    plain = make_llm(model, speculative_algorithm=None)
    ps = prompts(plain.tokenizer)
    ref = run(plain, ps, SAMPLED)
    tree = dict(tree_width=2, tree_budget=8) if variant == "tree" else {}
    llm = make_llm(model, speculative_algorithm="eagle3+suffix", spec_policy="always",
                   spec_sampling="coupled", **tree)
    assert run(llm, ps, SAMPLED) == ref
    own = llm.spec_stats()["proposers"]
    assert own["suffix"]["drafts"] > 0 and own["eagle3"]["accepted"] > 5
    assert llm.engine.spec.proposer.mixed_steps > 0


def test_rejection_sampling_mixes_point_masses_with_the_models_drafts(make_llm, model):
    """Sampled chains verified by rejection: EAGLE-3's rows carry q, suffix rows a one-hot
    q (the merged tree's); every request still gets its tokens."""
    plain = make_llm(model, speculative_algorithm=None)
    ps = prompts(plain.tokenizer)
    llm = make_llm(model, speculative_algorithm="eagle3+suffix", spec_policy="always",
                   spec_sampling="rejection")
    outs = llm.generate(ps, SAMPLED, use_tqdm=False)
    assert [len(o.token_ids) for o in outs] == [40] * len(ps)
    assert llm.engine.spec.proposer.mixed_steps > 0


def test_the_copying_request_drafts_from_its_suffix_the_novel_one_from_eagle3(make_llm, model):
    """One batch: a request re-emitting its prompt and a novel one. The copying request's
    VERIFY steps are mostly suffix drafts, accepted at a far higher rate than EAGLE-3's."""
    llm = make_llm(model, speculative_algorithm="eagle3+suffix", spec_policy="always")
    tok = llm.tokenizer
    copy = tok.encode("# tests\n" + SNIPPET + "\n\n" + SNIPPET[:60])
    novel = tok.encode("The history of the city begins")
    sampled = SamplingParams(max_tokens=48, temperature=0.8, seed=3, ignore_eos=True)
    pricer, previews = llm.engine.spec.proposer.pricer, []
    preview = pricer.preview
    pricer.preview = lambda req, k: previews.append(len(req.prompt_token_ids)) or preview(req, k)
    outs = llm.generate([copy, novel], [GREEDY, sampled], use_tqdm=False)
    c, n = (o.spec.proposer_hist for o in outs)
    assert c.get("suffix", 0) > 0 and n.get("eagle3", 0) > n.get("suffix", 0)
    # the plan feeds back who took suffix decoding: the novel request is priced less often
    assert previews.count(len(novel)) < previews.count(len(copy))
    own = llm.spec_stats()["proposers"]
    rate = {p: own[p]["accepted"] / max(own[p]["proposed"], 1) for p in own}
    assert rate["suffix"] > rate["eagle3"]


def test_unknown_combinations_are_refused_naming_the_flag():
    for algo in ("ngram+suffix", "suffix+eagle3", "eagle3+draft"):
        with pytest.raises(ConfigError, match="--speculative-algorithm"):
            EngineConfig(model="-", speculative_algorithm=algo)
    with pytest.raises(ConfigError, match="--suffix-draft-tokens"):
        EngineConfig(model="-", speculative_algorithm="eagle3+suffix", suffix_draft_tokens=33)
    with pytest.raises(ConfigError, match="needs draft_model"):
        EngineConfig(model="-", speculative_algorithm="draft+suffix")
    with pytest.raises(ConfigError, match="tensor_parallel_size must be 1"):
        EngineConfig(model="-", speculative_algorithm="eagle3+suffix", tensor_parallel_size=2)
    cfg = EngineConfig(model="-", speculative_algorithm="eagle3+suffix", num_draft_tokens=4,
                       suffix_draft_tokens=24)
    assert cfg.hybrid and cfg.model_algorithm == "eagle3" and cfg.max_draft_len == 24


def test_the_model_draft_stays_current_for_requests_drafted_from_their_suffix(make_llm, model):
    """After a VERIFY step, a request that drafted from suffix decoding has EAGLE-3's draft
    caught up over every token it committed (its catch-up was planned with the step and
    the draft followed the accepted tokens), as one that drafted from EAGLE-3 has."""
    llm = make_llm(model, speculative_algorithm="eagle3+suffix", spec_policy="always")
    spec = llm.engine.spec
    real, checked = spec.after_commit, []

    def after_commit(plan, result):
        real(plan, result)
        for i, (req, p, k) in enumerate(zip(plan.reqs, plan.proposers, plan.draft_lens)):
            if k and not req.is_finished:
                assert req.draft_rows == plan.prefix_lens[i] + len(result.kept[i]), p
                checked.append(p)
    spec.after_commit = after_commit
    ps = prompts(llm.tokenizer)
    llm.generate(ps, GREEDY, use_tqdm=False)
    assert checked.count("suffix") > 3 and checked.count("eagle3") > 3


def test_a_suffix_engine_alone_keeps_its_drafts_as_acceptance_evidence(make_llm, model):
    """Only a hybrid keeps suffix outcomes out of the acceptance evidence (EAGLE-3's): an
    engine whose one proposer is suffix decoding prices its K from them."""
    llm = make_llm(model, speculative_algorithm="suffix", num_draft_tokens=8,
                   spec_policy="always")
    outs = llm.generate(prompts(llm.tokenizer), GREEDY, use_tqdm=False)
    assert llm.engine.spec.acceptance.population()[0][1] > 0  # greedy requests
    assert all(set(o.spec.proposer_hist) == {"suffix"} for o in outs)


@pytest.mark.parametrize("split", [False, True])
def test_deep_suffix_chains_run_on_shapes_the_warm_up_captured(make_llm, model, split):
    """On the CPU graph stand-in: the warm-up captures the shapes of suffix chains deeper
    than the model's K (the deep depths 8 and 16, their token buckets or split-K tree
    passes, greedy verification and the draft's follow-up of those widths); then copying
    requests verify such chains on those shapes, none eagerly, and the output equals plain
    decoding."""
    from eager_graphs import install

    from gearshift.engine.warmup import warm_up_speculation

    plain = make_llm(model, speculative_algorithm=None)
    ps = prompts(plain.tokenizer)
    ref = run(plain, ps, GREEDY)
    llm = make_llm(model, speculative_algorithm="eagle3+suffix", spec_policy="always",
                   max_num_seqs=4)
    eng = llm.engine
    graphs = install(llm)
    eng.runner.split_k_below = 1024 if split else 0  # split-K tree passes, or causal extends
    assert eng.runner.deep_depths == (8, 16)
    warm_up_speculation(eng, sizes=[1, 2, 4])
    warmed = set(graphs.keys)
    for n in (9, 17):  # greedy verification and the follow-up at each deep width
        assert any(k[0] == "verify-greedy" and k[2] == n for k in warmed)
        assert any(k[0] == "draft_extend" and k[2] == n for k in warmed)
    if split:
        assert {("target", "verify-tree", 4 * n, n) for n in (9, 17)} <= warmed
    else:
        assert {k[3] // 4 for k in warmed if k[:3] == ("target", "verify-mixed", 5)} == \
            {2, 3, 4, 5, 8, 12, 18}  # every bucket of 4 rows (j), coarse past K + 1
    depths, orig = [], eng.runner.forward

    def forward(batch, **kw):
        if batch.verify is not None:
            depths.append((batch.layout.nodes - 1, batch.layout.graph))
        return orig(batch, **kw)

    eng.runner.forward = forward
    assert [o.token_ids for o in llm.generate(ps, GREEDY, use_tqdm=False)] == ref
    deep = [(d, key) for d, key in depths if d > 4]
    assert deep and {d for d, _ in deep} <= {8, 16}
    assert all(key is not None and ("target", *key) in warmed for _, key in depths)
    assert eng.runner.graph_stats()["verify_eager"] == 0


def test_prompts_are_indexed_while_the_device_runs_not_in_a_plan(make_llm, model, monkeypatch):
    """Once VERIFY steps run, suffix decoding's indexes catch up between them (index_ahead,
    while the device runs): a plan's previews append nothing, neither the few tokens a
    request committed since (walked on its index) nor a newly admitted request's long
    prompt (its previews defer; a short one is built). Two running at a time, so that
    requests arrive while others speculate."""
    plain = make_llm(model, speculative_algorithm=None)
    ps = prompts(plain.tokenizer) * 2
    ref = run(plain, ps, GREEDY)
    llm = make_llm(model, speculative_algorithm="eagle3+suffix", spec_policy="always",
                   max_num_seqs=2)
    suffix = llm.engine.spec.proposer.suffix
    phase, appended = ["start"], {"start": [], "ahead": [], "plan": []}
    sync = RequestIndex.sync

    def traced(index, tokens, limit=None):
        held = len(index.tokens)
        n = sync(index, tokens, limit)
        appended[phase[0]].append((held, n))
        return n
    monkeypatch.setattr(RequestIndex, "sync", traced)
    real = suffix.index_ahead

    def index_ahead(reqs, *args):
        phase[0] = "ahead"
        real(reqs, *args)
        phase[0] = "plan"  # from the first call on, plans find the indexes current
    monkeypatch.setattr(suffix, "index_ahead", index_ahead)
    assert run(llm, ps, GREEDY) == ref
    assert sum(n for _, n in appended["ahead"]) > max(len(p) for p in ps), \
        "prompts indexed between steps"
    # a plan builds only a new request's short index; it walks the tokens of an index held
    assert all(not held and n <= INDEX_LAG for held, n in appended["plan"]), appended["plan"]
    assert suffix.stats["from_request"] > 0, "requests drafted from their own tokens"
