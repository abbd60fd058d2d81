"""Every mode takes the one step pipeline: schedule() -> prepare(plan) -> run -> commit.

A scripted policy drives a mix of DECODE, EXTEND, mixed (decoders riding in a prefill
step, or prefill chunks riding in a chain VERIFY step) and VERIFY steps (chains and
trees, K varying per step), with requests arriving mid-run. After every step:
  * the slots allocated equal the plan's count (`StepPlan.num_slots`), all of them by
    BatchBuilder.prepare;
  * the commit left every slot accounted for: free + owned by running requests == total,
    and each running request owns one slot per computed token;
and greedy output equals plain decoding. The structural rules (one commit entry point, no
allocation outside the batch builder) are checked on the source.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from checkpoints import random_prompts
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import SamplingParams
from gearshift.forward_batch import ForwardMode
from gearshift.policy.base import Policy, PolicyView

GEARSHIFT = Path(__file__).resolve().parents[2] / "gearshift"


class Scripted(Policy):
    """K per decode step from a fixed cycle; every other speculative step a tree."""

    CYCLE = [0, 2, 1, 3, 0, 2, 2, 1]

    def __init__(self) -> None:
        self.calls = 0

    def plan(self, view: PolicyView) -> list[int]:
        self.calls += 1
        return [self.CYCLE[self.calls % len(self.CYCLE)]] * len(view.requests)

    def step_topk(self, view: PolicyView) -> int:
        return view.topk if self.calls % 2 else 1


def _accounted(eng) -> int:
    """Distinct slots that are free, cached, or owned by a running request (a cached prefix
    is shared: counted once); a slot in two of those places would be a double booking."""
    free = eng.slots._free
    cached = [s for n in eng.slots.cache._nodes() for s in n.slots] if eng.slots.cache else []
    owned = [s for r in eng.scheduler.running for s in r.slots]
    everywhere = set(free) | set(cached) | set(owned)
    assert len(free) == len(set(free)) and not set(free) & (set(cached) | set(owned))
    return len(everywhere)


def _drive(llm, prompts, params, arrive_every: int) -> tuple[dict, list]:
    """Requests arrive one every `arrive_every` steps; -> (outputs by id, per-step records)."""
    eng = llm.engine
    orig_alloc, orig_prepare = eng.slots.alloc, eng.builder.prepare
    log: list[dict] = []

    def alloc(n):
        log[-1]["allocated"] += n
        return orig_alloc(n)

    def prepare(plan):
        log[-1]["prepares"].append(plan)
        batch = orig_prepare(plan)
        log[-1]["staged"] = batch.staged
        return batch

    eng.slots.alloc, eng.builder.prepare = alloc, prepare
    outs: dict[str, list[int]] = {}
    pending = list(enumerate(prompts))
    step = 0
    while pending or eng.has_unfinished_requests():
        if pending and step % arrive_every == 0:
            i, p = pending.pop(0)
            eng.add_request(str(i), p, params)
        log.append({"allocated": 0, "prepares": []})
        for o in eng.step():
            outs.setdefault(o.request_id, []).extend(o.new_token_ids)
        step += 1
        running = eng.scheduler.running
        assert _accounted(eng) == eng.slots.total, f"step {step}: slots unaccounted"
        for r in running:
            assert len(r.slots) == r.num_computed_tokens, f"step {step}: {r.request_id}"
        for plan in log[-1]["prepares"]:  # this step's own plan (VERIFY or plain)
            assert log[-1]["allocated"] == sum(plan.num_slots), f"step {step}: {plan.mode}"
    return outs, log


@pytest.mark.parametrize("shape", ["tree", "chain"])
def test_every_mode_allocates_its_plan_and_commits_once(make_llm, tiny_llama_dir, tmp_path,
                                                       shape):
    """tree: a tree-capable engine (width 4); steps with a prefill chunk are mixed EXTEND
    steps with their decoders at K = 0. chain: prefill chunks ride in the VERIFY pass."""
    head = make_eagle3_checkpoint(tmp_path / "head", aux_layer_ids=[0, 1, 1])
    prompts = random_prompts([9, 30, 4, 17, 45, 6], seed=3)
    params = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)
    opts = dict(max_num_batched_tokens=16, kv_cache_tokens=2048)
    ref = {str(i): o.token_ids for i, o in enumerate(
        make_llm(tiny_llama_dir, **opts).generate(prompts, params))}
    tree = dict(tree_width=4, tree_budget=12) if shape == "tree" else {}
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=3, **tree, **opts)
    llm.engine.set_policy(Scripted())
    outs, log = _drive(llm, prompts, params, arrive_every=3)
    assert outs == ref
    plans = [p for s in log for p in s["prepares"]]
    modes = {p.mode for p in plans}
    assert modes == {ForwardMode.EXTEND, ForwardMode.DECODE, ForwardMode.VERIFY}
    verify = [p for p in plans if p.mode is ForwardMode.VERIFY]
    assert len({max(p.draft_lens) for p in verify}) >= 2  # K varied
    if shape == "tree":
        assert {p.draft_topk for p in verify} == {1, 4}  # chains and trees
        mixed = [p for p in plans if p.mode is ForwardMode.EXTEND and any(p.decoding)
                 and not all(p.decoding)]
        assert mixed  # decoders rode along in a prefill step
    else:
        riders = [p for p in verify if not all(p.decoding)]
        assert riders  # prefill chunks rode along in a chain VERIFY step
        assert all(n == e for p in riders for n, e, d in
                   zip(p.num_nodes, p.extend_lens, p.decoding) if not d)
        # node slots are staged as wide as the chains: a chunk reads its own from the host
        for s in log:
            p = s["prepares"][-1] if s["prepares"] else None
            if p is not None and any(p is r for r in riders):
                width = max(n for n, d in zip(p.num_nodes, p.decoding) if d)
                assert s["staged"]["node_slots"].numel() == p.batch_size * width
    stats = llm.memory_stats()
    assert stats["kv_slots_free"] + stats["kv_slots_cached"] == stats["kv_slots_total"]


def _calls(path: Path, attr: str) -> list[str]:
    """`x.<attr>(...)` call sites in a source file, as `x.attr` text."""
    tree = ast.parse(path.read_text())
    return [ast.unparse(n.func) for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == attr]


def test_one_commit_entry_point_and_allocation_only_in_the_batch_builder():
    from gearshift.scheduler.scheduler import Scheduler

    public = [n for n in dir(Scheduler) if not n.startswith("_") and callable(getattr(Scheduler, n))]
    assert [n for n in public if "commit" in n or "resolve" in n or "advance" in n] == ["commit"]
    allocators = {str(p.relative_to(GEARSHIFT)) for p in GEARSHIFT.rglob("*.py")
                  for call in _calls(p, "alloc") if "slots" in call}
    assert allocators == {"runner/batch.py"}
