"""The pre-allocation trap, reproduced: 10 requests, tree_width=4, 2 draft steps (16
candidate tokens each), and a policy that flips between speculation and plain decode
every step. In SGLang's attempt the KV slots for 10 x 16 = 160 candidates were reserved
before the worker decided to decode plainly, and the plain-decode graph met 160 rows.
Here every step's allocation and forward shape must match its own plan."""

from __future__ import annotations

import pytest
import torch
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import SamplingParams
from gearshift.forward_batch import ForwardMode
from gearshift.policy.base import Policy, PolicyView


class FlipPolicy(Policy):
    """K = 2 on odd decode steps, K = 0 on even ones; the K = 2 steps alternate between the
    engine's tree (width 4) and chains."""

    def __init__(self) -> None:
        self.calls = 0

    def plan(self, view: PolicyView) -> list[int]:
        self.calls += 1
        return [2 if self.calls % 2 else 0] * len(view.requests)

    def step_topk(self, view: PolicyView) -> int:
        return view.topk if self.calls % 4 == 1 else 1


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_flipping_speculation_never_uses_stale_shapes(make_llm, tiny_llama_dir, tmp_path, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    head = make_eagle3_checkpoint(tmp_path / "head", aux_layer_ids=[0, 1, 1])
    gpu = dict(device="cuda", attention_backend="triton", cuda_graphs=True) if device == "cuda" \
        else {}
    opts = dict(max_num_seqs=16, kv_cache_tokens=4096, **gpu)
    prompts = [[3 + i, 7, 11 + i, 5] for i in range(10)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    ref = [o.token_ids for o in make_llm(tiny_llama_dir, **opts).generate(prompts, params)]

    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=2, tree_width=4, tree_budget=16, **opts)
    eng = llm.engine
    eng.set_policy(FlipPolicy())
    log: list[dict] = []
    orig_alloc, orig_forward = eng.slots.alloc, eng.runner.forward

    def alloc(n):
        log[-1]["allocated"] += n
        return orig_alloc(n)

    def forward(batch, **kw):
        fb = batch.forward
        log[-1]["forward"].append((fb.mode, fb.num_tokens, fb.padded_batch_size))
        return orig_forward(batch, **kw)

    eng.slots.alloc, eng.runner.forward = alloc, forward
    orig_schedule = eng.scheduler.schedule

    def schedule():
        plan = orig_schedule()
        log.append({"plan": plan, "allocated": 0, "forward": []})
        return plan

    eng.scheduler.schedule = schedule
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == ref

    modes = [s["plan"].mode for s in log if s["plan"].reqs]
    assert ForwardMode.VERIFY in modes and ForwardMode.DECODE in modes
    flips = sum(a != b for a, b in zip(modes, modes[1:]))
    assert flips >= 4
    full_steps = {1: 0, 4: 0}
    for step in log:
        plan = step["plan"]
        if not plan.reqs:
            continue
        bs = plan.batch_size
        target = step["forward"][0]
        if plan.mode is ForwardMode.DECODE:
            assert not plan.draft_lens
            assert step["allocated"] == bs  # one slot per request: nothing for drafts
            assert target[0] is ForwardMode.DECODE and target[1] == target[2]  # graph-shaped
            assert target[2] == eng.runner.decode_pad(bs)
        elif plan.mode is ForwardMode.VERIFY:
            # K = 2, or less where a request is about to reach max_tokens (capped at planning)
            assert all(1 <= k <= 2 for k in plan.draft_lens)
            topk = plan.draft_topk
            assert eng.spec.slots_needed(2, 4) == 16 + eng.spec.scratch(2, 4)
            assert eng.spec.slots_needed(2, 1) == 3 + eng.spec.scratch(2, 1)
            assert step["allocated"] == sum(eng.spec.slots_needed(k, topk) for k in plan.draft_lens)
            verify = [f for f in step["forward"] if f[0] is ForwardMode.VERIFY]
            assert len(verify) == 1  # one target pass over every request's candidates
            if plan.draft_lens == [2] * bs:
                # 16 candidates each in a tree step, 3 in a chain step (with CUDA graphs,
                # padded to a graph's batch size)
                n = 16 if topk == 4 else 3
                assert bs * n <= verify[0][1] <= eng.runner.decode_pad(bs) * n
                full_steps[topk] += 1
    assert full_steps[4] >= 2 and full_steps[1] >= 2
    stats = llm.memory_stats()
    assert stats["kv_slots_free"] + stats["kv_slots_cached"] == stats["kv_slots_total"]


def test_failed_verify_step_returns_its_slots(make_llm, tiny_llama_dir):
    """A VERIFY step that fails before its commit gives back every slot it allocated."""
    llm = make_llm(tiny_llama_dir, speculative_algorithm="ngram", num_draft_tokens=3,
                   spec_policy="always")
    eng = llm.engine
    eng.add_request("r", [5, 6, 7, 5, 6, 7, 5, 6], SamplingParams(max_tokens=20, temperature=0.0,
                                                                 ignore_eos=True))
    eng.step()  # prefill
    free_before = eng.slots.num_free

    def boom(*args, **kwargs):
        raise RuntimeError("device fault")

    eng.runner.forward = boom
    with pytest.raises(RuntimeError, match="device fault"):
        eng.step()
    assert eng.slots.num_free == free_before
    eng.abort_request("r")
