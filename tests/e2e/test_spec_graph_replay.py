"""The graphs a VERIFY step adds (EAGLE-3 expansion, greedy verification) behave like CUDA
graphs: a stand-in for GraphCache captures the FIRST body per key and replays only that
one on the key's static inputs (as a CUDA graph would), and fails on any host sync inside
a body. Greedy output must equal plain decoding; sampled chains must run to completion."""

from __future__ import annotations

import pytest
import torch
from checkpoints import random_prompts
from eager_graphs import SharedPoolGraphs, install
from eagle3_checkpoints import make_eagle3_checkpoint
from torch.utils._python_dispatch import TorchDispatchMode

from gearshift import SamplingParams

SYNC_OPS = {"_local_scalar_dense", "item", "nonzero", "masked_select"}


class NoSync(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        assert func.overloadpacket.__name__ not in SYNC_OPS, f"host sync in a graph: {func}"
        return func(*args, **(kwargs or {}))


class ReplayGraphs:
    """Keys of the spec worker's own graphs replay their first body; the target's graphs
    (whose torch-reference attention reads host lengths) re-run the current one."""

    def __init__(self) -> None:
        self.entries: dict = {}
        self.replays: dict = {}

    def run(self, key, fn, inputs):
        own = key[0] == "verify-greedy" or key[:2] == ("eagle3", "expand")
        if key not in self.entries:
            self.entries[key] = (fn, {k: v.clone() for k, v in inputs.items()})
        first, static = self.entries[key]
        assert static.keys() == inputs.keys()
        for k, v in inputs.items():
            static[k].copy_(v)  # also checks shapes are those of the key
        self.replays[key] = self.replays.get(key, 0) + 1
        if not own:  # the target / draft-extend bodies: the torch reference reads lengths
            return fn(static)
        tolist = torch.Tensor.tolist
        torch.Tensor.tolist = lambda *a: pytest.fail("tolist in a graph body")
        try:
            with NoSync():
                return first(static)
        finally:
            torch.Tensor.tolist = tolist


def _engine(make_llm, tiny_llama_dir, head, spec):
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   **{"spec_policy": "always", **spec})
    graphs = install(llm, ReplayGraphs())
    return llm, graphs


@pytest.mark.parametrize("spec,chain_as_extend", [
    (dict(num_draft_tokens=4), False),  # chain, tree attention: path recorded on the device
    (dict(num_draft_tokens=4), True),  # chain verified as a causal extend
    (dict(num_draft_tokens=4, tree_width=4, tree_budget=16), False),  # tree
    (dict(num_draft_tokens=4, spec_policy="random"), True),  # K per request: token buckets
])
def test_replayed_graphs_keep_greedy_output(make_llm, tiny_llama_dir, tmp_path, spec,
                                            chain_as_extend):
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    prompts = random_prompts([5, 17, 3, 30, 9], seed=4)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    ref = [o.token_ids for o in make_llm(tiny_llama_dir).generate(prompts, params)]
    llm, graphs = _engine(make_llm, tiny_llama_dir, head, spec)
    if chain_as_extend:
        llm.engine.runner.split_k_below = 0
    assert [o.token_ids for o in llm.generate(prompts, params)] == ref
    expand = [k for k in graphs.entries if k[:2] == ("eagle3", "expand")]
    greedy = [k for k in graphs.entries if k[0] == "verify-greedy"]
    assert expand and greedy
    assert max(graphs.replays[k] for k in expand + greedy) > 1  # replayed, not re-captured
    # the tree-attention path records accepted paths inside the graph, an extend does not
    assert any(k[-1] for k in greedy) == (not chain_as_extend)
    assert llm.spec_stats()["proposed"] > 0
    if spec.get("spec_policy") == "random":  # steps mixing K replayed their bucket's graphs
        assert llm.spec_stats()["mixed_k_steps"] > 0
        mixed = [k for k in graphs.entries if k[:2] == ("target", "verify-mixed")]
        assert mixed and max(graphs.replays[k] for k in mixed) > 1


def test_sampled_chain_expansion_replays(make_llm, tiny_llama_dir, tmp_path):
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm, graphs = _engine(make_llm, tiny_llama_dir, head,
                          dict(num_draft_tokens=3, spec_sampling="rejection"))
    params = SamplingParams(max_tokens=12, temperature=0.8, top_k=20, top_p=0.9, seed=1,
                            ignore_eos=True)
    outs = llm.generate(random_prompts([6, 11], seed=2), params)
    assert [len(o.token_ids) for o in outs] == [12, 12]
    sampled = [k for k in graphs.entries if k[:2] == ("eagle3", "expand") and not k[-2]]
    assert sampled and not any(k[0] == "verify-greedy" for k in graphs.entries)


@pytest.mark.parametrize("spec,chain_as_extend", [
    (dict(num_draft_tokens=3), False),
    (dict(num_draft_tokens=3), True),
    (dict(num_draft_tokens=3, tree_width=3, tree_budget=8), False),
])
def test_coupled_sampling_replays_and_keeps_the_seeded_text(make_llm, tiny_llama_dir, tmp_path,
                                                            spec, chain_as_extend):
    """Coupled requests (greedy ones beside them) verify in the greedy graphs, from the
    plain sampler's token per node, and expand with the sampling fields as static inputs:
    replayed, the text is plain decoding's."""
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    prompts = random_prompts([5, 17, 3, 30, 9], seed=4)
    params = [SamplingParams(max_tokens=16, temperature=t, top_k=20, top_p=0.9, seed=i,
                             ignore_eos=True) for i, t in enumerate([0.8, 1.0, 0.0, 1.3, 0.6])]
    ref = [o.token_ids for o in make_llm(tiny_llama_dir).generate(prompts, params)]
    llm, graphs = _engine(make_llm, tiny_llama_dir, head, {**spec, "spec_sampling": "coupled"})
    if chain_as_extend:
        llm.engine.runner.split_k_below = 0
    assert [o.token_ids for o in llm.generate(prompts, params)] == ref
    expand = [k for k in graphs.entries if k[:2] == ("eagle3", "expand") and k[-4]]
    greedy = [k for k in graphs.entries if k[0] == "verify-greedy"]
    assert expand and greedy
    assert max(graphs.replays[k] for k in expand + greedy) > 1


@pytest.mark.parametrize("chain_as_extend", [False, True])
def test_sampled_chains_keep_their_drafts_past_the_target_graph(make_llm, chain_as_extend):
    """A VERIFY step reads the draft tree of its expansion graph after the target's graph
    has replayed. CUDA graphs sharing a pool may overwrite one another's outputs that way
    (rejection sampling then gathered p and q at garbage token ids: a device-side assert
    at c=64 on an H200); GraphCache keeps every graph's outputs out of the pool. Over an
    emulation of the shared pool, rejection-sampled chains of the shipped pair (a draft
    vocabulary smaller than the target's, real acceptance) give the text they give when
    no graph touches another's memory; their q distributions share one persistent buffer."""
    from gearshift.bench.sweep import make_prompts
    from gearshift.models.default import default_target_dir

    kw = dict(speculative_algorithm="eagle3", num_draft_tokens=3, spec_policy="always",
              spec_sampling="rejection")
    own = lambda key: key[0] == "verify-greedy" or key[:2] == ("eagle3", "expand")  # noqa: E731
    texts, stats = [], []
    for overwrite in (False, True):
        llm = make_llm(default_target_dir(), **kw)
        graphs = install(llm, SharedPoolGraphs(lambda key: not own(key), overwrite))
        if chain_as_extend:
            llm.engine.runner.split_k_below = 0
        prompts = make_prompts(llm.tokenizer, llm.engine.model_config.vocab_size, 5, 24, 0)
        params = [SamplingParams(max_tokens=10 + 3 * i, temperature=0.7, seed=i,
                                 ignore_eos=True) for i in range(len(prompts))]
        texts.append([o.token_ids for o in llm.generate(prompts, params)])
        stats.append(llm.spec_stats())
        expand = [k for k in graphs.entries if k[:2] == ("eagle3", "expand")]
        assert expand and max(graphs.replays[k] for k in expand) > 1
        assert any(k[0] == "target" for k in graphs.replays)  # between drafting and verifying
        # every shape's q is a view of one buffer, not [B, K + 1, V] floats a graph
        qs = [graphs.entries[k][2].draft_probs for k in expand]
        assert len(qs) > 1 and len({q.untyped_storage().data_ptr() for q in qs}) == 1
    assert texts[1] == texts[0]
    assert stats[1]["accepted"] == stats[0]["accepted"] > 0
