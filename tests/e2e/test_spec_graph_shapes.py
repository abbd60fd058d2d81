"""The CUDA-graph paths of speculation, run eagerly on CPU: a stand-in for GraphCache
feeds every forward through static copies of its inputs, and batches are padded to graph
sizes (dummy row 0, slot 0) exactly as on the GPU. Greedy output must not change."""

from __future__ import annotations

import pytest
from checkpoints import random_prompts
from eager_graphs import install
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import SamplingParams


@pytest.mark.parametrize("spec,chain_as_extend", [
    (dict(num_draft_tokens=3), False),  # small batch: split-K tree attention
    (dict(num_draft_tokens=3), True),  # large batch: causal extend
    (dict(num_draft_tokens=3, tree_width=2, tree_budget=6), False),
    (dict(num_draft_tokens=3, spec_policy="random"), False),  # K = 0 steps: graphed draft-extend
])
def test_padded_graph_shapes_keep_greedy_output(make_llm, tiny_llama_dir, tmp_path, spec,
                                                chain_as_extend):
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    prompts = random_prompts([5, 17, 3, 30, 9], seed=3)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    ref = [o.token_ids for o in make_llm(tiny_llama_dir).generate(prompts, params)]
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   **{"spec_policy": "always", **spec})
    graphs = install(llm)
    if chain_as_extend:
        llm.engine.runner.split_k_below = 0
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == ref
    kinds = {k[0] for k in graphs.keys}
    assert {"eagle3"} <= kinds and kinds & {"target"}
    greedy = [k[1] for k in graphs.keys if k[0] == "verify-greedy"]
    assert greedy and all(b & (b - 1) == 0 for b in greedy)  # padded: 5 requests -> 8 rows
    if spec.get("spec_policy") == "random":
        assert "draft_extend" in kinds
    assert llm.spec_stats()["proposed"] > 0


def test_graphed_draft_extend_after_accepted_drafts_keeps_acceptance(make_llm):
    """With the shipped pair (real acceptance), VERIFY steps accept drafts and the draft then
    extends over a+1 tokens per request: padded to K+1 tokens and replayed as a graph. Its
    draft state must equal the eager draft-extend's: same proposals, same acceptance."""
    from gearshift.bench.sweep import make_prompts
    from gearshift.models.default import default_target_dir

    kw = dict(speculative_algorithm="eagle3", num_draft_tokens=4, spec_policy="always")
    eager = make_llm(default_target_dir(), **kw)
    prompts = make_prompts(eager.tokenizer, eager.engine.model_config.vocab_size, 3, 40, 0)
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    want = [o.token_ids for o in eager.generate(prompts, params)]
    graphed = make_llm(default_target_dir(), **kw)
    graphs = install(graphed)
    assert [o.token_ids for o in graphed.generate(prompts, params)] == want
    assert any(k[0] == "draft_extend" and k[2] == 5 for k in graphs.keys)  # K+1 wide
    a, b = eager.spec_stats(), graphed.spec_stats()
    assert a["accepted"] > 0 and (a["proposed"], a["accepted"]) == (b["proposed"], b["accepted"])


def test_steps_that_capture_a_graph_are_not_observed(make_llm, tiny_llama_dir, tmp_path,
                                                     monkeypatch):
    """A lazily captured graph makes its step take seconds once: the goodput policy must not
    learn that cost. Observed: VERIFY steps that captured nothing (their wall time), and
    each overlapped DECODE step once resolved, by its device time (its wall time is the
    wait for the step before it, an EXTEND step's say)."""
    from gearshift.engine.overlap import PendingStep
    from gearshift.runner.model_runner import ModelRunner

    monkeypatch.setattr(PendingStep, "device_ms", lambda self: 3.25)  # CUDA events on a GPU
    # where steps run asynchronously (a GPU's, not as launched on the host)
    monkeypatch.setattr(ModelRunner, "runs_on_host", property(lambda self: False))
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=3)
    eng = llm.engine
    graphs = install(llm)
    calls = iter(range(10**6))  # K = 3 and K = 0 in turn (VERIFY, then overlapped DECODE)
    eng.policy.plan = lambda view: [3 * (next(calls) % 2)] * len(view.requests)
    eng._graphs_seen = 0
    seen = []
    eng.policy.observe = lambda k, bs, ctx, ms, ks=None: seen.append((k, ms))
    verify, decode = [], []
    orig_step, orig_forward = eng._launch_and_commit, eng.runner.forward

    def spy_step(plan, t0, planning_s, early):
        before = len(graphs.entries)
        out = orig_step(plan, t0, planning_s, early)
        if plan.mode.value == "verify":
            verify.append(before != len(graphs.entries))  # this step captured a graph
        return out

    def spy_forward(batch, **kw):
        if batch.forward.mode.value != "verify":
            decode.append(batch.forward.mode.value == "decode")
        return orig_forward(batch, **kw)

    eng._launch_and_commit, eng.runner.forward = spy_step, spy_forward
    llm.generate(random_prompts([5, 9, 3], seed=1),
                 SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    assert any(verify) and not all(verify) and any(decode)
    assert [ms for k, ms in seen if k] and all(ms != 3.25 for k, ms in seen if k)
    assert sum(1 for k, _ in seen if k) == verify.count(False)
    assert [ms for k, ms in seen if not k] == [3.25] * sum(decode)


def test_graphed_tree_paths_with_triton_kernels(make_llm, tiny_llama_dir, tmp_path):
    """The sweep's tree (topk 4, depth 4, 16 verify tokens) through the graphed paths with
    the Triton kernels themselves (interpreted on CPU): catches kernel-level misreads that the
    torch backend hides (a stride-0 view read past its storage crashed the H200)."""
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    prompts = random_prompts([6, 13], seed=5)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    ref = [o.token_ids for o in make_llm(tiny_llama_dir).generate(prompts, params)]
    llm = make_llm(tiny_llama_dir, attention_backend="triton", speculative_algorithm="eagle3",
                   draft_model=str(head), tree_width=4, num_draft_tokens=4, tree_budget=16,
                   spec_policy="always")
    graphs = install(llm)
    assert [o.token_ids for o in llm.generate(prompts, params)] == ref
    assert any(k[1] == "expand" for k in graphs.keys if len(k) > 1)
    assert llm.spec_stats()["proposed"] > 0


def test_proposal_graphs_are_keyed_by_padded_batch(make_llm, tiny_llama_dir, tmp_path):
    """Requests finishing at different steps walk the batch through every size; the EAGLE-3
    proposal is padded to the decode graph sizes, so only those sizes are captured (not
    one graph per batch size met while serving)."""
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    prompts = random_prompts([5, 9, 3, 12, 7], seed=2)
    params = [SamplingParams(max_tokens=6 + 3 * i, temperature=0.0, ignore_eos=True)
              for i in range(len(prompts))]
    ref = [o.token_ids for o in make_llm(tiny_llama_dir).generate(prompts, params)]
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=3, spec_policy="always")
    graphs = install(llm)
    assert [o.token_ids for o in llm.generate(prompts, params)] == ref
    sizes = {k[2] for k in graphs.keys if k[:2] == ("eagle3", "expand")}
    assert sizes and sizes <= {1, 2, 4, 8} and len(sizes) >= 2


@pytest.mark.parametrize("chain_as_extend", [False, True])
def test_verify_passes_larger_than_a_prefill_chunk_run_eagerly(make_llm, tiny_llama_dir, tmp_path,
                                                               chain_as_extend):
    """A VERIFY pass over more tokens than max(extend_graph_max_tokens, a prefill chunk) is
    not captured (each shape would keep its activations; such passes are compute-bound):
    here 4 requests x 4 tokens = 16 > 8 run eagerly, a lone request's 4 tokens are graphed."""
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    prompts = random_prompts([5, 9, 3, 7], seed=6)
    params = [SamplingParams(max_tokens=6 + 8 * i, temperature=0.0, ignore_eos=True)
              for i in range(len(prompts))]
    opts = dict(max_num_batched_tokens=8, extend_graph_max_tokens=0)
    ref = [o.token_ids for o in make_llm(tiny_llama_dir, **opts).generate(prompts, params)]
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=3, spec_policy="always", **opts)
    graphs = install(llm)
    if chain_as_extend:
        llm.engine.runner.split_k_below = 0
    runner = llm.engine.runner
    assert runner.max_verify_graph_tokens == 8
    passes, forward = [], runner.forward

    def spy(batch, **kw):
        if batch.verify is not None:
            passes.append((batch.forward.num_tokens, batch.layout.graph is not None))
        return forward(batch, **kw)

    runner.forward = spy
    assert [o.token_ids for o in llm.generate(prompts, params)] == ref
    target = [k for k in graphs.keys if k[0] == "target"]
    tokens = [k[2] if k[1] == "verify-tree" else k[2] * k[3] for k in target]
    assert target and max(tokens) <= 8
    assert {graphed for n, graphed in passes if n > 8} == {False}  # eager past the limit
    assert {graphed for n, graphed in passes if n <= 8} == {True}


def test_verify_step_cost_includes_its_planning(make_llm, tiny_llama_dir):
    """A VERIFY step is synchronous: its planning (the policy's scoring over every running
    request) delays it as much as its forward does, so the cost the policy observes includes
    schedule()'s time (but not the wait for the step before)."""
    import time

    llm = make_llm(tiny_llama_dir, speculative_algorithm="ngram", num_draft_tokens=3,
                   spec_policy="always")
    eng = llm.engine
    seen = []
    eng.policy.observe = lambda k, bs, ctx, ms, ks=None: seen.append((k, ms))
    plan = eng.policy.plan

    def slow_plan(view):
        time.sleep(0.05)  # 50 ms of planning
        return plan(view)

    eng.policy.plan = slow_plan
    llm.generate([[5, 6, 7, 5, 6, 7, 5, 6]],
                 SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    verify_ms = [ms for k, ms in seen if k]
    assert verify_ms and min(verify_ms) >= 50.0


def test_graphed_draft_extends_have_one_width(make_llm, tiny_llama_dir, tmp_path):
    """Every graphed draft-extend is K + 1 tokens wide: after VERIFY steps (whatever was
    accepted, a rejected first draft included), and in catch-ups after plain steps. A
    1-wide family met first in the middle of a run would capture graphs there."""
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=3, spec_policy="random")  # random drafts: rejections
    graphs = install(llm)
    prompts = random_prompts([5, 17, 3, 30, 9], seed=3)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    llm.generate(prompts, params)
    widths = {k[2] for k in graphs.keys if k[0] == "draft_extend"}
    assert widths == {4}
    assert llm.spec_stats()["steps_by_k"].get(0, 0) > 0  # catch-ups after plain steps ran


def _mixed_spec(algo: str, tmp_path, tiny_llama_dir) -> dict:
    if algo == "eagle3":
        head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
        return dict(speculative_algorithm="eagle3", draft_model=str(head))
    if algo == "draft":  # the target drafting for itself: long accepted chains
        return dict(speculative_algorithm="draft", draft_model=str(tiny_llama_dir))
    return dict(speculative_algorithm="ngram")


@pytest.mark.parametrize("algo", ["eagle3", "draft", "ngram"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_mixed_k_chains_verify_on_token_bucket_graphs(make_llm, tiny_llama_dir, tmp_path, algo,
                                                      temperature):
    """A K per request (the random policy) with chains verified as a causal extend: every
    VERIFY pass runs on a graph shape, those that mix K on a token bucket (padded batch + 1
    rows, rows * j tokens); greedy and coupled-sampled output equal plain decoding."""
    prompts = random_prompts([5, 17, 3, 30, 9, 12], seed=3)
    params = [SamplingParams(max_tokens=24, temperature=temperature, seed=i, ignore_eos=True)
              for i in range(len(prompts))]
    ref = [o.token_ids for o in make_llm(tiny_llama_dir).generate(prompts, params)]
    llm = make_llm(tiny_llama_dir, num_draft_tokens=4, spec_policy="random",
                   **_mixed_spec(algo, tmp_path, tiny_llama_dir))
    graphs = install(llm)
    llm.engine.runner.split_k_below = 0
    keys = []
    orig = llm.engine.runner.forward

    def forward(batch, **kw):
        if batch.verify is not None:
            keys.append(batch.layout.graph)
        return orig(batch, **kw)

    llm.engine.runner.forward = forward
    assert [o.token_ids for o in llm.generate(prompts, params)] == ref
    assert llm.spec_stats()["mixed_k_steps"] > 0
    assert None not in keys  # no VERIFY pass ran eagerly
    stats = llm.engine.runner.graph_stats()
    assert stats["verify_eager"] == 0 and stats["verify_graphed"] == len(keys)
    mixed = [k for k in graphs.keys if k[:2] == ("target", "verify-mixed")]
    assert mixed and all(t % (rows - 1) == 0 and 2 <= t // (rows - 1) <= 5
                         for _, _, rows, t in mixed)
    if temperature == 0.0:  # their greedy verification: one graph per (rows, nodes), its
        # inputs gathered from the bucket's rows first
        greedy = [k for k in graphs.keys if k[0] == "verify-greedy" and not k[6]]
        assert greedy and all(k[4] == k[5] == k[1] * k[2] for k in greedy)


def test_mixed_k_chains_with_triton_kernels(make_llm, tiny_llama_dir, tmp_path):
    """The token-bucket layout (a dummy request holding the padding, empty requests after
    it) through the Triton extend kernel itself (interpreted on CPU)."""
    prompts = random_prompts([6, 13, 4], seed=5)
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    ref = [o.token_ids for o in make_llm(tiny_llama_dir).generate(prompts, params)]
    llm = make_llm(tiny_llama_dir, attention_backend="triton", num_draft_tokens=3,
                   spec_policy="random", **_mixed_spec("draft", tmp_path, tiny_llama_dir))
    graphs = install(llm)
    llm.engine.runner.split_k_below = 0
    assert [o.token_ids for o in llm.generate(prompts, params)] == ref
    assert any(k[:2] == ("target", "verify-mixed") for k in graphs.keys)
    assert llm.spec_stats()["mixed_k_steps"] > 0


@pytest.mark.parametrize("algo", ["eagle3", "ngram"])
def test_the_target_pass_is_laid_out_while_the_draft_runs(make_llm, tiny_llama_dir, tmp_path,
                                                         algo):
    """A VERIFY step stages its target pass (the host's largest share of the step) after the
    draft's pass is launched, not before anything runs on the device: the proposer proposes
    before the verify layout is staged, every step; the output equals plain decoding."""
    import gearshift.runner.batch as batch_mod

    prompts = random_prompts([5, 17, 9], seed=4)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    ref = [o.token_ids for o in make_llm(tiny_llama_dir).generate(prompts, params)]
    llm = make_llm(tiny_llama_dir, num_draft_tokens=3, spec_policy="always",
                   **_mixed_spec(algo, tmp_path, tiny_llama_dir))
    install(llm)
    order, proposer = [], llm.engine.spec.proposer
    propose, stage = proposer.propose, batch_mod.stage_verify
    proposer.propose = lambda ctx: order.append("propose") or propose(ctx)

    def staged(*args):
        order.append("stage")
        return stage(*args)

    batch_mod.stage_verify = staged
    try:
        assert [o.token_ids for o in llm.generate(prompts, params)] == ref
    finally:
        batch_mod.stage_verify = stage
    assert order and order == ["propose", "stage"] * (len(order) // 2)


def test_greedy_verification_reads_no_node_rows(make_llm, tiny_llama_dir, tmp_path):
    """Each verified node's logits row is gathered only for per-node work (penalties,
    grammars, logprobs) or coupled targets: a greedy step launches nothing for it."""
    import gearshift.speculative.runner as runner_mod

    calls, orig = [], runner_mod.vl.node_rows
    runner_mod.vl.node_rows = lambda *a: calls.append(1) or orig(*a)
    try:
        llm = make_llm(tiny_llama_dir, num_draft_tokens=3, spec_policy="always",
                       **_mixed_spec("eagle3", tmp_path, tiny_llama_dir))
        install(llm)
        prompts = random_prompts([5, 9], seed=6)
        llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
        assert llm.engine.stats()["verify_steps"] > 0 and not calls
        llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True,
                                             presence_penalty=0.5))
        assert calls
    finally:
        runner_mod.vl.node_rows = orig
