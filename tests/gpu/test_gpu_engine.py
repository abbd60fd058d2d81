"""GPU tier (skipped without CUDA): Triton attention + decode CUDA graphs give the same
greedy tokens as the torch reference backend, in fp32, with batching, chunked prefill
and preemption."""

from __future__ import annotations

import pytest
import torch

from gearshift import LLM, SamplingParams
from gearshift.policy.base import PolicyView

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _run(model_dir, backend, graphs, prompts, **kw):
    llm = LLM(str(model_dir), device="cuda", dtype="float32", attention_backend=backend,
              cuda_graphs=graphs, **{"max_num_seqs": 8, "kv_cache_tokens": 4096, **kw})
    outs = llm.generate(prompts, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    stats = llm.memory_stats()
    assert stats["kv_slots_free"] + stats["kv_slots_cached"] == stats["kv_slots_total"]
    return [o.token_ids for o in outs], llm


@pytest.mark.parametrize("kw", [{}, {"max_num_batched_tokens": 16},
                                {"kv_cache_tokens": 160, "max_num_batched_tokens": 64}])
def test_triton_graphs_match_torch_reference(tiny_llama_dir, kw):
    prompts = [list(range(3, 3 + n)) for n in (5, 17, 33, 2, 60, 9)]
    ref, _ = _run(tiny_llama_dir, "torch", False, prompts, **kw)
    got, llm = _run(tiny_llama_dir, "triton", True, prompts, **kw)
    assert llm.engine.runner.decode_sizes and ("decode", 1) in llm.engine.runner.shape_graphs.entries
    assert got == ref


def test_qwen3_triton_matches_hf(tiny_qwen3_dir):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(tiny_qwen3_dir), dtype=torch.float32).cuda()
    prompt = list(range(5, 25))
    want = hf.generate(torch.tensor([prompt]).cuda(), max_new_tokens=40, min_new_tokens=40, do_sample=False,
                       eos_token_id=None)[0, len(prompt):].tolist()
    got, _ = _run(tiny_qwen3_dir, "triton", True, [prompt])
    assert got[0] == want


@pytest.mark.parametrize("spec", [
    dict(speculative_algorithm="eagle3", num_draft_tokens=3, spec_policy="always"),
    dict(speculative_algorithm="eagle3", num_draft_tokens=3, tree_width=2, tree_budget=6,
         spec_policy="always"),
    dict(speculative_algorithm="ngram", num_draft_tokens=4, spec_policy="random"),
    dict(speculative_algorithm="suffix", num_draft_tokens=12, spec_policy="random"),
    dict(speculative_algorithm="suffix", num_draft_tokens=6, tree_width=2, tree_budget=8,
         spec_policy="always"),
])
def test_speculation_on_gpu_matches_plain(tiny_llama_dir, tmp_path, spec):
    """Triton attention (extend for chains, tree kernel for trees) + decode graphs with
    feature capture: greedy speculative output equals plain output, fp32."""
    from eagle3_checkpoints import make_eagle3_checkpoint

    spec = dict(spec)
    if spec["speculative_algorithm"] == "eagle3":
        spec["draft_model"] = str(make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1]))
    prompts = [list(range(3, 3 + n)) for n in (5, 17, 33, 2, 60, 9)]
    ref, _ = _run(tiny_llama_dir, "triton", True, prompts)
    got, llm = _run(tiny_llama_dir, "triton", True, prompts, **spec)
    assert got == ref
    assert llm.engine.spec_stats()["proposed"] > 0


def test_hybrid_deep_suffix_chains_on_gpu_match_plain():
    """eagle3+suffix on the embedded default model: prompts that copy their code draft
    suffix chains past the model's K = 4; those verify on graphs the warm-up captured (none
    eagerly, none captured while serving) and greedy output equals plain decoding, fp32."""
    from gearshift.models.default import default_target_dir

    model = default_target_dir()
    from copy_prompts import prompts as copy_prompts

    plain = LLM(str(model), device="cuda", dtype="float32", speculative_algorithm=None)
    prompts = copy_prompts(plain.tokenizer)
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    ref = [o.token_ids for o in plain.generate(prompts, params)]
    llm = LLM(str(model), device="cuda", dtype="float32", max_num_seqs=8, kv_cache_tokens=8192,
              speculative_algorithm="eagle3+suffix", spec_policy="always")
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == ref
    assert max(k for o in outs for k in o.spec.k_hist) > 4  # deep suffix chains ran
    assert llm.engine.runner.graph_stats()["verify_eager"] == 0
    assert llm.engine.stats()["late"]["graph_captures"] == 0


def test_serving_copies_to_the_device_from_pinned_memory_only(monkeypatch):
    """A copy from pageable host memory may first wait for the stream's queued work: inside a
    VERIFY step (suffix rows beside the model's, the draft following) the host would stall
    behind the device and the step's later launches start on an idle device. Every
    host-to-device copy the engine makes while serving is from pinned memory."""
    import traceback

    from copy_prompts import prompts as copy_prompts

    from gearshift.models.default import default_target_dir

    llm = LLM(str(default_target_dir()), device="cuda", dtype="float32", max_num_seqs=8,
              kv_cache_tokens=8192, speculative_algorithm="eagle3+suffix", spec_policy="always")
    pageable, real = [], torch.Tensor.to

    def to(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if self.device.type == "cpu" and out.device.type == "cuda" and not self.is_pinned():
            pageable.append("".join(traceback.format_stack(limit=5)[:-1]))
        return out
    monkeypatch.setattr(torch.Tensor, "to", to)
    outs = llm.generate(copy_prompts(llm.tokenizer),
                        SamplingParams(max_tokens=48, temperature=0, ignore_eos=True))
    monkeypatch.undo()
    assert llm.engine.spec_stats()["proposers"]["suffix"]["drafts"] > 0
    assert any(o.spec.proposer_hist.get("eagle3") for o in outs), "both proposers drafted"
    assert not pageable, f"{len(pageable)} pageable copies, e.g.\n{pageable[0]}"


@pytest.mark.parametrize("topk", [1, 2, 4])
def test_speculation_graphs_at_larger_batch(tiny_llama_dir, tmp_path, topk):
    """40 requests x 2 kv heads: chains verify as graphed causal extend (padded batch),
    trees as padded graphed tree attention; output equals plain decoding."""
    from eagle3_checkpoints import make_eagle3_checkpoint

    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    prompts = [list(range(3 + i % 7, 3 + i % 7 + 4 + i % 13)) for i in range(40)]
    spec = dict(speculative_algorithm="eagle3", draft_model=str(head), num_draft_tokens=3,
                spec_policy="always", max_num_seqs=48)
    if topk == 4:  # the bench sweep's tree: topk 4, depth 4, 16 verify tokens
        spec.update(tree_width=4, num_draft_tokens=4, tree_budget=16)
    elif topk > 1:
        spec.update(tree_width=topk, tree_budget=6)
    ref, _ = _run(tiny_llama_dir, "triton", True, prompts, max_num_seqs=48)
    got, llm = _run(tiny_llama_dir, "triton", True, prompts, **spec)
    assert got == ref
    keys = {k[:2] for k in llm.engine.runner.shape_graphs.entries}
    assert any(k[0] == "target" for k in keys)


def test_goodput_cost_profile_replays_the_captured_graphs(tiny_llama_dir, tmp_path):
    """The start-up cost model times plain decode by replaying the decode graphs and K > 0
    by the EXTEND graphs: finite, positive, and speculation never predicted cheaper."""
    from eagle3_checkpoints import make_eagle3_checkpoint

    from gearshift.engine.cost_profile import SPEC_HOST_MS, build_cost_model

    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = LLM(str(tiny_llama_dir), device="cuda", dtype="float32", attention_backend="triton",
              max_num_seqs=16, kv_cache_tokens=4096, speculative_algorithm="eagle3",
              draft_model=str(head), num_draft_tokens=3)
    runner = llm.engine.runner
    cost = build_cost_model(runner, 3, 16, 0.1)
    for k in range(4):
        assert all(0 < ms < 1e3 for _, ms in cost.base[k])
    for (_, t0), (_, t3) in zip(cost.base[0], cost.base[3]):
        assert t3 >= t0 + SPEC_HOST_MS * 0.99
    out = llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    assert len(out[0].token_ids) == 8


def test_cost_profile_after_real_steps_keeps_the_kv(tiny_llama_dir, tmp_path):
    """Timed again after real steps (as `bench sweep` builds goodput after its warm-up), the
    graphs replay on their capture layout, not the last step's inputs: no gather past a
    smaller graph's rows, and a cached prefix's KV is untouched (a hit gives the same text)."""
    from eagle3_checkpoints import make_eagle3_checkpoint

    from gearshift.engine.cost_profile import build_cost_model

    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = LLM(str(tiny_llama_dir), device="cuda", dtype="float32", attention_backend="triton",
              max_num_seqs=16, kv_cache_tokens=4096, max_num_batched_tokens=256,
              speculative_algorithm="eagle3", draft_model=str(head), num_draft_tokens=3)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompts = [list(range(3, 3 + n)) for n in (200, 150, 9)]
    first = [o.token_ids for o in llm.generate(prompts, params)]
    kv = llm.engine.runner.kv
    k, v = kv.k.clone(), kv.v.clone()
    build_cost_model(llm.engine.runner, 3, 16, 0.1)
    torch.cuda.synchronize()
    # slot 0 is the dummy request's: only it may change
    assert torch.equal(kv.k[:, 1:], k[:, 1:]) and torch.equal(kv.v[:, 1:], v[:, 1:])
    assert [o.token_ids for o in llm.generate(prompts, params)] == first


def test_goodput_engine_warms_up_every_shape_before_serving(tiny_llama_dir, tmp_path):
    """With CUDA graphs, a goodput engine runs every (decode graph size, K) step at start-up:
    measured costs for each K, no graph captured while serving a mixed load afterwards,
    prefill chunks never ride in (eager) VERIFY steps, output equals plain decoding."""
    from eagle3_checkpoints import make_eagle3_checkpoint

    from gearshift.policy.static import AlwaysPolicy

    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    prompts = [list(range(3 + i % 7, 3 + i % 7 + 4 + i % 13)) for i in range(12)]
    ref, _ = _run(tiny_llama_dir, "triton", True, prompts, max_num_seqs=16)
    llm = LLM(str(tiny_llama_dir), device="cuda", dtype="float32", attention_backend="triton",
              max_num_seqs=16, kv_cache_tokens=8192, speculative_algorithm="eagle3",
              draft_model=str(head), num_draft_tokens=3)
    eng = llm.engine
    assert sorted(eng.measured_costs) == [0, 1, 2, 3]
    assert [p[0] for p in eng.measured_costs[3]] == eng.runner.decode_sizes
    assert eng.scheduler.speculation.mixed is False
    captured = len(eng.runner.shape_graphs.entries)
    for k in (3, 1, 0, 2):  # every K at several batch sizes, requests finishing at random
        eng.set_policy(AlwaysPolicy(k))
        params = [SamplingParams(max_tokens=5 + 3 * i, temperature=0, ignore_eos=True)
                  for i in range(len(prompts))]
        got = [o.token_ids for o in llm.generate(prompts, params)]
        assert got == [r[:5 + 3 * i] for i, r in enumerate(ref)]
    assert len(eng.runner.shape_graphs.entries) == captured


def test_tree_engine_warms_up_and_serves_chains_and_trees(tiny_llama_dir, tmp_path):
    """An engine that verifies trees (the bench sweep's: width 4, depth 4, 16 nodes) warms
    up chains K = 1..4, the tree (gear 5) and plain decode at every graph size; afterwards
    chain steps, tree steps and plain steps, mixed step by step (the random policy), never
    capture a graph while serving, and output equals plain decoding (fp32)."""
    from eagle3_checkpoints import make_eagle3_checkpoint

    from gearshift.policy.randomized import RandomPolicy
    from gearshift.policy.static import AlwaysPolicy

    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    prompts = [list(range(3 + i % 7, 3 + i % 7 + 4 + i % 13)) for i in range(12)]
    ref, _ = _run(tiny_llama_dir, "triton", True, prompts, max_num_seqs=16)
    llm = LLM(str(tiny_llama_dir), device="cuda", dtype="float32", attention_backend="triton",
              max_num_seqs=16, kv_cache_tokens=8192, speculative_algorithm="eagle3",
              draft_model=str(head), num_draft_tokens=4, tree_width=4, tree_budget=16)
    eng = llm.engine
    assert sorted(eng.measured_costs) == [0, 1, 2, 3, 4, 5]
    assert eng.policy.top_gear(PolicyView([], 0, 4, None, 4)) == 5  # may pick trees
    captured = len(eng.runner.shape_graphs.entries)
    # uniform chains, then trees: shapes the warm-up captured; then random K and shape per
    # step (depths the warm-up did not run are captured on first use)
    for policy in (AlwaysPolicy(4, topk=1), AlwaysPolicy(4), RandomPolicy(4, seed=3)):
        eng.set_policy(policy)
        params = [SamplingParams(max_tokens=5 + 3 * i, temperature=0, ignore_eos=True)
                  for i in range(len(prompts))]
        got = [o.token_ids for o in llm.generate(prompts, params)]
        assert got == [r[:5 + 3 * i] for i, r in enumerate(ref)]
        if not isinstance(policy, RandomPolicy):
            assert len(eng.runner.shape_graphs.entries) == captured
    stats = llm.spec_stats()
    assert stats["tree_steps"] > 0 and stats["chain_steps"] > 0
