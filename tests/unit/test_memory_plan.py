"""The KV cache's size from a measured memory budget (runner/memory_plan.py), on fake
numbers: what gpu_memory_utilization x the card leaves after weights, draft, buffers, the
profiled activations peak, graph pools and memory outside PyTorch, in whole slots; a
configuration that cannot fit fails with the numbers and the flags to change.

Data flow (tests only): MemoryBudget(fake bytes) -> plan_kv_slots -> KvPlan.
"""

from __future__ import annotations

import dataclasses

import pytest

from gearshift.config import ConfigError, EngineConfig
from gearshift.runner.memory_plan import (
    GIB,
    MemoryBudget,
    generated_tokens,
    plan_kv_slots,
    profile_slots,
    prompt_len,
    provisional_slots,
    warmup_generated,
)

SLOT = 128 * 1024 + 12 * 1024  # an 8B target's K/V + an EAGLE-3 layer + its features, bf16


def _budget(**kw) -> MemoryBudget:
    base = dict(total=80 * GIB, utilization=0.9, weights=15 * GIB, draft=GIB, buffers=GIB // 2,
                activations=9 * GIB, graph_pools=3 * GIB, warmup_peak=0, outside_torch=GIB,
                bytes_per_slot=SLOT, min_slots=30_000)
    return MemoryBudget(**{**base, **kw})


def test_slots_fill_what_the_utilization_leaves():
    b = _budget()
    plan = plan_kv_slots(b)
    left = int(80 * GIB * 0.9) - (15 + 1 + 0.5 + 9 + 3 + 1) * GIB
    assert plan.slots == int(left // SLOT) - 1  # slot 0, the dummy, is allocated too
    assert plan.kv_bytes <= left < plan.kv_bytes + SLOT
    # the headroom is the rest of the card: (1 - utilization) x total, plus the last part-slot
    assert int(0.1 * 80 * GIB) <= plan.headroom < int(0.1 * 80 * GIB) + SLOT + 1


def test_the_cache_shrinks_as_the_profiled_peak_grows():
    small = plan_kv_slots(_budget(activations=4 * GIB)).slots
    large = plan_kv_slots(_budget(activations=12 * GIB)).slots
    assert large < small
    assert small - large in (8 * GIB // SLOT, 8 * GIB // SLOT + 1)
    # graph pools and memory outside PyTorch count the same way
    assert plan_kv_slots(_budget(activations=4 * GIB, graph_pools=11 * GIB)).slots == large
    assert plan_kv_slots(_budget(activations=4 * GIB, outside_torch=9 * GIB)).slots == large


def test_a_capture_pass_peak_above_activations_and_pools_takes_their_place():
    """The warm-up's captures peaked higher (eager steps and fragmentation beside the pools)
    than the largest step's activations plus the pools that stay: the peak counts instead."""
    base = plan_kv_slots(_budget()).slots  # activations 9 + graph pools 3
    assert plan_kv_slots(_budget(warmup_peak=10 * GIB)).slots == base  # below 12: no change
    assert plan_kv_slots(_budget(warmup_peak=20 * GIB)).slots == plan_kv_slots(
        _budget(activations=17 * GIB)).slots
    assert "capture pass peak 20.00" in plan_kv_slots(_budget(warmup_peak=20 * GIB)).describe()


def test_a_lower_utilization_gives_a_smaller_cache():
    assert plan_kv_slots(_budget(utilization=0.8)).slots < plan_kv_slots(_budget()).slots


def test_a_configuration_that_cannot_fit_fails_with_the_numbers_and_the_flags():
    with pytest.raises(ConfigError) as e:
        plan_kv_slots(_budget(activations=50 * GIB))
    msg = str(e.value)
    assert "does not fit" in msg and "72.0 GiB" in msg  # 0.9 x 80
    assert "activations peak 50.0" in msg and "weights 15.0" in msg
    assert "30,000 slots" in msg
    for flag in ("--max-num-seqs", "--gpu-memory-utilization", "--max-num-batched-tokens"):
        assert flag in msg
    # just enough for the largest step fits; one slot fewer does not
    fit = plan_kv_slots(_budget())
    plan_kv_slots(_budget(min_slots=fit.slots))
    with pytest.raises(ConfigError):
        plan_kv_slots(_budget(min_slots=fit.slots + 1))


def test_the_start_up_line_names_where_memory_went():
    line = plan_kv_slots(_budget()).describe()
    for part in ("weights 15.00", "draft 1.00", "activations peak 9.00", "graph pools 3.00",
                 "outside PyTorch 1.00", "KV cache", "slots", "headroom", "80.0 GiB",
                 "gpu_memory_utilization 0.9"):
        assert part in line, part
    assert "draft" not in plan_kv_slots(_budget(draft=0)).describe()


def test_the_provisional_cache_holds_the_profiles_requests():
    cfg = EngineConfig(model="m", max_num_seqs=256, max_num_batched_tokens=2048,
                       speculative_algorithm="eagle3", num_draft_tokens=4, tree_width=4,
                       tree_budget=32)
    n = prompt_len(cfg, 8192)
    assert n * 256 >= 2048  # the prompts fill one prefill budget
    per = n + generated_tokens(cfg) + cfg.verify_nodes + 1 + 3 * 4  # + nodes, scratch
    assert profile_slots(cfg, 8192) >= 256 * per
    plain = dataclasses.replace(cfg, speculative_algorithm=None, tree_width=1,
                                tree_budget=None)
    assert profile_slots(plain, 8192) < profile_slots(cfg, 8192)
    # the provisional cache also holds the capture pass's warm-up at max_num_seqs requests
    warm = 4 + generated_tokens(cfg) + warmup_generated(4, True, 0)
    assert provisional_slots(cfg, 8192) >= max(profile_slots(cfg, 8192), 256 * warm)
    assert provisional_slots(plain, 8192) == profile_slots(plain, 8192)
    # a short context caps the prompts below its limit
    assert prompt_len(dataclasses.replace(cfg, max_num_seqs=1), 64) + generated_tokens(cfg) < 64


def test_gpu_memory_utilization_is_validated_and_the_old_name_maps_onto_it():
    assert EngineConfig(model="m").gpu_memory_utilization == 0.9
    assert EngineConfig(model="m", kv_memory_fraction=0.7).gpu_memory_utilization == 0.7
    for bad in (0.0, 1.5):
        with pytest.raises(ConfigError, match="gpu_memory_utilization"):
            EngineConfig(model="m", gpu_memory_utilization=bad)
