"""The prefix cache end to end, on tiny checkpoints: greedy output is the same with the cache
on and off (plain decoding and every proposer, shared prefixes, multi-turn conversations,
eviction under KV pressure, preemption, aborts), cached tokens are reported, a hit never
serves another prompt's KV, and speculation keeps its acceptance on cache hits.

Data flow (tests only): LLM(enable_prefix_caching on / off) -> generate -> token ids, the
engine's prefix-cache and speculation counters.
"""

from __future__ import annotations

import pytest
from checkpoints import random_prompts
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import SamplingParams
from gearshift.policy.static import AlwaysPolicy

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def _workload(seed: int = 5) -> list[list[list[int]]]:
    """Waves of prompts: a shared system prefix with different questions, conversations
    that resend their history plus a new message, and prompts that differ in one token."""
    system, = random_prompts([40], seed=seed)
    questions = random_prompts([6, 9, 3, 12], seed=seed + 1)
    turns = random_prompts([7, 5, 8], seed=seed + 2)
    waves = [[system + q for q in questions]]
    convo = system[:20]
    for t in turns:  # each turn resends the conversation so far
        convo = convo + t
        waves.append([convo, convo[:-1] + [3]])  # and a twin that differs in its last token
    waves.append([system + questions[0][:-1] + [q[-1]] for q in questions])
    return waves


def _run(llm, waves, params=GREEDY) -> list[list[int]]:
    return [o.token_ids for wave in waves for o in llm.generate(wave, params, use_tqdm=False)]


def _spec_options(kind: str, tmp_path, tiny_llama_dir) -> dict:
    if kind == "plain":
        return {}
    if kind in ("ngram", "suffix"):
        return dict(speculative_algorithm=kind, num_draft_tokens=3, spec_policy="always")
    if kind == "draft":
        return dict(speculative_algorithm="draft", draft_model=str(tiny_llama_dir),
                    num_draft_tokens=3, spec_policy="always")
    head = make_eagle3_checkpoint(tmp_path / "head", aux_layer_ids=[0, 1, 1])
    tree = dict(tree_width=4, tree_budget=10) if kind == "eagle3-tree" else {}
    return dict(speculative_algorithm="eagle3", draft_model=str(head), num_draft_tokens=3,
                spec_policy="random", **tree)


@pytest.mark.parametrize("kind", ["plain", "eagle3-chain", "eagle3-tree", "draft", "ngram",
                                  "suffix"])
def test_greedy_output_is_the_same_with_the_cache_on_and_off(make_llm, tiny_llama_dir, tmp_path,
                                                             kind):
    opts = dict(_spec_options(kind, tmp_path, tiny_llama_dir), max_num_batched_tokens=32)
    waves = _workload()
    off = _run(make_llm(tiny_llama_dir, enable_prefix_caching=False, **opts), waves)
    llm = make_llm(tiny_llama_dir, **opts)
    assert _run(llm, waves) == off
    stats = llm.engine.prefix_cache_stats()
    assert stats["hit_tokens"] > 100 and 0 < stats["hit_rate"] < 1


def test_every_cached_token_keeps_its_target_features(make_llm, tiny_llama_dir, tmp_path):
    """EAGLE-3: a cache hit's draft catches up from the stored features of the cached
    prefix, so every committed token's features are stored (also where the draft extended
    over them directly after a VERIFY step)."""
    llm = make_llm(tiny_llama_dir, **_spec_options("eagle3-chain", tmp_path, tiny_llama_dir))
    llm.engine.set_policy(AlwaysPolicy(3))
    _run(llm, _workload())
    eng = llm.engine
    slots = [s for n in eng.slots.cache._nodes() for s in n.slots]
    assert len(slots) > 100
    assert eng.spec.proposer.features[slots].abs().sum(-1).gt(0).all()


def test_eviction_preemption_and_aborts_keep_the_output(make_llm, tiny_llama_dir, tmp_path):
    """A pool too small for the workload: the cache evicts, requests are preempted (and
    restart from what they cached), some are aborted mid-run; greedy output is unchanged."""
    opts = dict(_spec_options("eagle3-chain", tmp_path, tiny_llama_dir), kv_cache_tokens=160,
                max_num_batched_tokens=32, max_num_seqs=8)
    prompts = [p for wave in _workload(seed=9) for p in wave]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    ref = [o.token_ids for o in make_llm(tiny_llama_dir, enable_prefix_caching=False, **opts)
           .generate(prompts, params, use_tqdm=False)]
    llm = make_llm(tiny_llama_dir, **opts)
    eng = llm.engine
    for i, p in enumerate(prompts):
        eng.add_request(f"doomed-{i}", p, params)
    for _ in range(6):
        eng.step()
    for i in range(0, len(prompts), 2):
        eng.abort_request(f"doomed-{i}")
    while eng.has_unfinished_requests():
        eng.step()
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == ref
    assert eng.scheduler.num_preemptions > 0
    assert eng.slots.cache.num_slots <= eng.slots.total


def test_cached_tokens_are_reported(make_llm, tiny_llama_dir):
    llm = make_llm(tiny_llama_dir)
    prefix, = random_prompts([30], seed=3)
    first = llm.generate([prefix + [5, 6]], GREEDY, use_tqdm=False)[0]
    second = llm.generate([prefix + [7, 8]], GREEDY, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 30
    assert llm.reset_prefix_cache() > 0
    third = llm.generate([prefix + [7, 8]], GREEDY, use_tqdm=False)[0]
    assert third.num_cached_tokens == 0 and third.token_ids == second.token_ids


def test_a_hit_never_serves_another_prompts_kv(make_llm, tiny_llama_dir):
    """Prompts that share a prefix and then differ (in the middle or in the last token): each
    one's output equals its solo run with no cache."""
    base, = random_prompts([24], seed=13)
    prompts = [base, base[:-1] + [base[-1] % 50 + 3], base[:10] + [4] + base[11:],
               base[:10] + [4] + base[11:-1] + [9]]
    solo = [make_llm(tiny_llama_dir, enable_prefix_caching=False).generate(
        [p], GREEDY, use_tqdm=False)[0].token_ids for p in prompts]
    llm = make_llm(tiny_llama_dir)
    for _ in range(2):
        for p, want in zip(prompts, solo):
            assert llm.generate([p], GREEDY, use_tqdm=False)[0].token_ids == want


def test_a_full_cache_of_held_prefixes_makes_admission_wait(make_llm, tiny_llama_dir):
    """Every cached slot held by running requests and no free slot: a new request waits for
    one to finish (no crash); a prompt longer than the pool can hold still runs alone."""
    llm = make_llm(tiny_llama_dir, kv_cache_tokens=96, max_num_seqs=4, max_num_batched_tokens=64)
    shared, = random_prompts([40], seed=21)
    outs = llm.generate([shared + [i + 3] for i in range(6)],
                        SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
                        use_tqdm=False)
    assert all(len(o.token_ids) == 12 for o in outs)
    long, = random_prompts([80], seed=22)
    assert len(llm.generate([long], GREEDY, use_tqdm=False)[0].token_ids) == 10


def test_clearing_the_cache_while_requests_run(make_llm, tiny_llama_dir):
    llm = make_llm(tiny_llama_dir)
    eng = llm.engine
    prompts = random_prompts([30, 31, 32], seed=4)
    ref = [o.token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, GREEDY)
    outs: dict[str, list[int]] = {}
    step = 0
    while eng.has_unfinished_requests():
        for o in eng.step():
            outs.setdefault(o.request_id, []).extend(o.new_token_ids)
        if step in (1, 4):
            eng.reset_prefix_cache()  # held prefixes stay; the rest goes
        step += 1
    assert [outs[str(i)] for i in range(3)] == ref


def test_speculation_keeps_its_acceptance_on_cache_hits(make_llm):
    """Multi-turn conversations with the embedded model and its EAGLE-3 head: acceptance
    with the cache on is within 2% of the cache off, and the hit rate with speculation on
    within 1 point of speculation off."""
    from gearshift.models.default import default_target_dir
    from gearshift.train.corpus import load_texts

    target = str(default_target_dir())
    texts = [t for t in load_texts("heldout") if len(t) > 2000][:4]
    opts = dict(speculative_algorithm="eagle3", num_draft_tokens=4, spec_policy="always",
                max_num_batched_tokens=256)
    results = {}
    for name, extra in (("spec-cache", {}), ("spec-off", {"enable_prefix_caching": False}),
                        ("plain-cache", {"speculative_algorithm": None})):
        kw = {**opts, **extra}
        if kw["speculative_algorithm"] is None:
            kw = {"max_num_batched_tokens": 256}
        llm = make_llm(target, **kw)
        tok = llm.tokenizer
        history = [tok.encode(t[:300]) for t in texts]
        for turn in range(3):  # each turn: the history + the model's answer + a new message
            outs = llm.generate(history, SamplingParams(max_tokens=24, temperature=0.0,
                                                        ignore_eos=True), use_tqdm=False)
            history = [h + o.token_ids + tok.encode(t[300 + 100 * turn: 400 + 100 * turn])
                       for h, o, t in zip(history, outs, texts)]
        stats = llm.engine.spec_stats()
        results[name] = (stats.get("acceptance_rate"), llm.engine.prefix_cache_stats())
    with_cache, without = results["spec-cache"][0], results["spec-off"][0]
    assert abs(with_cache - without) <= 0.02 * without, results
    assert abs(results["spec-cache"][1]["hit_rate"] - results["plain-cache"][1]["hit_rate"]) \
        <= 0.01, results
    assert results["spec-cache"][1]["hit_rate"] > 0.5


def test_speculation_switched_on_never_reads_features_it_did_not_keep(make_llm):
    """A policy that never drafts keeps no draft features; prefixes it cached must not serve
    a drafting policy's requests (their draft would catch up from features never stored):
    acceptance after the switch is that of a fresh engine, and the switch is refused while
    requests run."""
    from gearshift.models.default import default_target_dir
    from gearshift.policy.static import OffPolicy
    from gearshift.train.corpus import load_texts

    target = str(default_target_dir())
    opts = dict(speculative_algorithm="eagle3", num_draft_tokens=4, spec_policy="always",
                max_num_batched_tokens=256)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    fresh = make_llm(target, **opts)
    prompts = [fresh.tokenizer.encode(t[:400]) for t in load_texts("heldout")[:4]]
    fresh.generate(prompts, params, use_tqdm=False)
    switched = make_llm(target, **opts)
    eng = switched.engine
    eng.set_policy(OffPolicy())
    switched.generate(prompts, params, use_tqdm=False)
    assert eng.memory_stats()["kv_slots_cached"] > 0
    eng.set_policy(AlwaysPolicy(4))
    before = eng.spec_stats()
    switched.generate(prompts, params, use_tqdm=False)
    after = eng.spec_stats()
    rate = (after["accepted"] - before["accepted"]) / (after["proposed"] - before["proposed"])
    assert rate == pytest.approx(fresh.engine.spec_stats()["acceptance_rate"], abs=1e-9)

    eng.set_policy(OffPolicy())
    eng.add_request("running", prompts[0], params)
    eng.step()
    with pytest.raises(ValueError, match="between requests"):
        eng.set_policy(AlwaysPolicy(4))
    while eng.has_unfinished_requests():
        eng.step()


def test_a_draft_model_takes_over_from_off_mid_run(make_llm, tiny_llama_dir, tmp_path):
    """A draft model catches up from tokens alone, so speculation may start while requests
    that ran without it are running, and on prefixes they cached: greedy output unchanged."""
    from gearshift.policy.static import OffPolicy

    prompts = random_prompts([9, 14, 6], seed=11)
    ref = [o.token_ids for o in make_llm(tiny_llama_dir).generate(prompts, GREEDY,
                                                                 use_tqdm=False)]
    llm = make_llm(tiny_llama_dir, **_spec_options("draft", tmp_path, tiny_llama_dir))
    eng = llm.engine
    eng.set_policy(OffPolicy())
    assert [o.token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)] == ref
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, GREEDY)
    eng.step()
    eng.set_policy(AlwaysPolicy(3))
    outs: dict[str, list[int]] = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            outs.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert [outs[str(i)] for i in range(3)] == ref
    assert eng.spec_stats()["proposed"] > 0
