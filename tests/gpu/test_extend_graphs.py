"""GPU tier (skipped without CUDA): EXTEND steps replayed as CUDA graphs (one per padded
token count, max_num_seqs + 1 rows) equal eager EXTEND, in fp32: per step (the same
padded batch through the graph and eagerly: logits of the real rows, aux features of the
real tokens) and end to end (greedy tokens vs an engine without EXTEND graphs), with mixed
prefill + decode steps at several chunk sizes, with an EAGLE-3 draft consuming the aux
features, and with steps beyond the largest bucket falling back to eager.

Data flow (tests only): LLM(triton, cuda graphs) -> Engine.step -> ModelRunner.layout ->
BatchBuilder.prepare (padded) -> GraphCache.run of the ("extend", tokens) graph, checked
against ModelRunner._forward_logits on the same batch.
"""

from __future__ import annotations

import pytest
import torch
from checkpoints import assert_idle_invariant

from gearshift import LLM, SamplingParams
from gearshift.runner.graphs import extend_token_buckets
from gearshift.runner.model_runner import graph_inputs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPT_LENS = (10, 300, 37, 150, 64, 12, 233, 90, 45, 180, 17, 120)  # 12 requests
ROWS = 16  # max_num_seqs


def _prompts(lens=PROMPT_LENS) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(3, 512, (n,), generator=gen).tolist() for n in lens]


def _llm(model_dir, **kw) -> LLM:
    opts = dict(device="cuda", dtype="float32", attention_backend="triton", cuda_graphs=True,
                max_num_seqs=ROWS, kv_cache_tokens=8192)
    return LLM(str(model_dir), **{**opts, **kw})


def _check_graphs_against_eager(llm: LLM) -> list[tuple[int, bool]]:
    """Before every graphed EXTEND step, run the same padded batch through the graph and
    eagerly and compare (re-running a step rewrites identical KV).
    -> (real tokens, prefill chunk with decoders riding along) per graphed step."""
    runner = llm.engine.runner
    run, checked = runner._sample_step, []

    def checked_run(fb, sb, graph_key):
        graphs = runner.shape_graphs
        if graph_key is not None and graph_key[0] == "extend" and graph_key in graphs.entries:
            out = graphs.run(graph_key, None, graph_inputs(fb))
            got = [t.clone() for t in out] if runner.capture else [out.clone()]
            ref = runner._forward_logits(fb)
            ref = list(ref) if runner.capture else [ref]
            bs, t = fb.batch_size, sum(fb.extend_lens_cpu[: fb.batch_size])
            assert got[0].shape[0] == fb.padded_batch_size == ROWS + 1
            torch.testing.assert_close(got[0][:bs], ref[0][:bs], atol=1e-4, rtol=1e-4)
            if runner.capture:  # aux [T_pad, ...]: the real tokens come first
                torch.testing.assert_close(got[1][:t], ref[1][:t], atol=1e-4, rtol=1e-4)
            lens = fb.extend_lens_cpu[:bs]
            checked.append((t, 1 in lens and max(lens) > 1))
        tokens, aux = run(fb, sb, graph_key)
        if aux is not None and fb.mode.value == "extend" and fb.padded_batch_size > fb.batch_size:
            assert aux.shape[0] == sum(fb.extend_lens_cpu[: fb.batch_size])
        return tokens, aux

    runner._sample_step = checked_run
    return checked


def _generate(llm: LLM, prompts, max_tokens: int = 24) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outs = [o.token_ids for o in llm.generate(prompts, params)]
    assert_idle_invariant(llm)
    return outs


@pytest.mark.parametrize("chunk", [64, 200])
def test_extend_graphs_match_eager(tiny_llama_dir, chunk):
    """12 requests of 10..300 prompt tokens, chunked prefill with decoders riding along."""
    prompts = _prompts()
    ref_llm = _llm(tiny_llama_dir, max_num_batched_tokens=chunk, extend_graph_max_tokens=0)
    ref = _generate(ref_llm, prompts)
    assert not ref_llm.engine.runner.extend_sizes
    assert ref_llm.engine.runner.graph_stats()["extend_graphed"] == 0

    llm = _llm(tiny_llama_dir, max_num_batched_tokens=chunk)
    runner = llm.engine.runner
    assert runner.extend_sizes == extend_token_buckets(chunk + ROWS)
    assert all(("extend", t) in runner.shape_graphs.entries for t in runner.extend_sizes)
    checked = _check_graphs_against_eager(llm)
    assert _generate(llm, prompts) == ref
    stats = runner.graph_stats()
    assert stats["extend_graphed"] == len(checked) >= 3
    assert stats["extend_eager"] == 0  # every EXTEND step fits a bucket
    assert stats["decode_graphed"] > 0
    assert max(t for t, _ in checked) <= chunk
    assert any(mixed for _, mixed in checked), "no graphed step mixed prefill and decode"


def test_steps_past_the_largest_bucket_run_eagerly(tiny_llama_dir):
    # the long prompts fill 200-token steps (eager: past the 64-token bucket); the short
    # ones then make a step that fits it (graphed)
    prompts, short = _prompts(), _prompts((9, 14, 20))
    ref_llm = _llm(tiny_llama_dir, max_num_batched_tokens=200, extend_graph_max_tokens=0)
    ref = _generate(ref_llm, prompts), _generate(ref_llm, short)
    llm = _llm(tiny_llama_dir, max_num_batched_tokens=200, extend_graph_max_tokens=64)
    assert llm.engine.runner.extend_sizes == [64]
    checked = _check_graphs_against_eager(llm)
    assert (_generate(llm, prompts), _generate(llm, short)) == ref
    stats = llm.engine.runner.graph_stats()
    assert stats["extend_graphed"] == len(checked) > 0 and stats["extend_eager"] > 0


@pytest.mark.parametrize("spec", [
    dict(num_draft_tokens=3, spec_policy="random"),  # chains: EXTEND steps between VERIFY ones
    dict(num_draft_tokens=3, tree_width=2, tree_budget=6, spec_policy="always"),
])
def test_extend_graphs_with_eagle3_draft(tiny_llama_dir, tmp_path, spec):
    """The graphs also return the target features the draft consumes (aux [T_pad, 3H]); the
    draft follows every graphed EXTEND step, and greedy output equals plain decoding."""
    from eagle3_checkpoints import make_eagle3_checkpoint

    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    prompts = _prompts()
    ref = _generate(_llm(tiny_llama_dir, max_num_batched_tokens=64, extend_graph_max_tokens=0),
                    prompts)
    llm = _llm(tiny_llama_dir, max_num_batched_tokens=64, speculative_algorithm="eagle3",
               draft_model=str(head), **spec)
    assert llm.engine.runner.capture  # the graphs were captured with aux outputs
    checked = _check_graphs_against_eager(llm)
    assert _generate(llm, prompts) == ref
    assert llm.engine.runner.graph_stats()["extend_graphed"] == len(checked) > 0
    assert llm.spec_stats()["proposed"] > 0


def test_every_bucket_is_routed_to_a_graph_at_or_above_it(tiny_llama_dir) -> None:
    """Start-up times every EXTEND graph and routes each bucket to the fastest one at or
    above it; steps pad to that route."""
    llm = _llm(tiny_llama_dir, max_num_batched_tokens=256)
    runner = llm.engine.runner
    sizes = runner.extend_sizes
    assert sizes and set(runner.extend_route) == set(sizes)
    assert all(runner.extend_route[s] >= s and runner.extend_route[s] in sizes for s in sizes)
    times = {s: runner.plain_graph_ms(("extend", s)) for s in sizes}
    for s in sizes:
        assert times[runner.extend_route[s]] > 0
        assert runner.extend_pad(s) == runner.extend_route[s]
    out = llm.generate(_prompts()[:4], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert all(len(o.token_ids) == 8 for o in out)
    assert_idle_invariant(llm)
