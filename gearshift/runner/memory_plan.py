"""The KV cache's size from measured memory: pure arithmetic, no device.

    the card's total memory
    ├── gpu_memory_utilization x total: what the engine may use
    │     weights (target) + draft (its weights) + buffers (tables, workspaces, scratch)
    │     + activations (the profiled peak of the largest steps, above everything resident)
    │     + graph pools (CUDA graphs' private memory, measured over every capture)
    │       (or, if larger, the start-up's capture pass peak: pools, eager steps and the
    │        allocator's fragmentation at once, instead of activations + graph pools)
    │     + outside PyTorch (CUDA context, libraries, other processes)
    │     + KV cache (slots x bytes per slot: target K/V, the draft's K/V, EAGLE-3 features)
    └── headroom: the rest (the allocator's slack, fragmentation)

Data flow: engine/memory_profile.py measures a MemoryBudget on the device at start-up ->
plan_kv_slots(budget) -> KvPlan (the slots to allocate, the start-up log line).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gearshift.config import ConfigError, EngineConfig

GIB = 2**30


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes measured at start-up (engine/memory_profile.py) and what a slot costs."""

    total: int  # the card's memory
    utilization: float  # gpu_memory_utilization: the share of `total` the engine may use
    weights: int  # the target's parameters
    draft: int  # the draft's parameters (EAGLE-3 head or draft model; 0 without)
    buffers: int  # other resident tensors: req_to_token, workspaces, penalty counts, ...
    activations: int  # the largest profiled step's peak above everything resident
    graph_pools: int  # CUDA graphs' private pools (0 without graphs)
    warmup_peak: int  # the capture pass's peak of reserved memory above the eager state
    outside_torch: int  # device memory PyTorch's allocator does not hold
    bytes_per_slot: int  # target K/V + the draft's K/V + EAGLE-3's stored features
    min_slots: int  # the fewest slots the largest planned step needs

    @property
    def usable(self) -> int:
        return int(self.total * self.utilization)

    @property
    def before_kv(self) -> int:
        """Everything but the KV cache."""
        return (self.weights + self.draft + self.buffers + self.outside_torch
                + max(self.activations + self.graph_pools, self.warmup_peak))


@dataclass(frozen=True)
class KvPlan:
    budget: MemoryBudget
    slots: int  # KV slots to allocate (slot 0, the dummy, comes on top)

    @property
    def kv_bytes(self) -> int:
        return (self.slots + 1) * self.budget.bytes_per_slot

    @property
    def headroom(self) -> int:
        return self.budget.total - self.budget.before_kv - self.kv_bytes

    def describe(self) -> str:
        """One start-up line: where the card's memory went."""
        b = self.budget
        parts = [("weights", b.weights), ("draft", b.draft), ("buffers", b.buffers),
                 ("activations peak", b.activations), ("graph pools", b.graph_pools),
                 ("capture pass peak", b.warmup_peak),
                 ("outside PyTorch", b.outside_torch)]
        items = ", ".join(f"{name} {n / GIB:.2f} GiB" for name, n in parts
                          if n or name == "weights")
        return (f"memory of {b.total / GIB:.1f} GiB (gpu_memory_utilization {b.utilization:g}): "
                f"{items}, KV cache {self.slots:,} slots ({self.kv_bytes / GIB:.2f} GiB), "
                f"headroom {self.headroom / GIB:.2f} GiB")


def plan_kv_slots(budget: MemoryBudget) -> KvPlan:
    """The most KV slots that fit gpu_memory_utilization x total beside everything else.
    Raises ConfigError, with the numbers and the flags to change, when fewer than
    budget.min_slots fit."""
    b = budget
    if b.bytes_per_slot <= 0:
        raise ValueError("bytes_per_slot must be positive")
    left = b.usable - b.before_kv
    slots = max(left // b.bytes_per_slot - 1, 0)  # slot 0 is the dummy
    plan = KvPlan(b, slots)
    if slots < b.min_slots:
        need = (b.min_slots + 1) * b.bytes_per_slot
        raise ConfigError(
            f"the configuration does not fit the GPU: of {b.usable / GIB:.1f} GiB "
            f"(gpu_memory_utilization {b.utilization:g} x {b.total / GIB:.1f} GiB), "
            f"{b.before_kv / GIB:.1f} GiB go to weights {b.weights / GIB:.1f}, draft "
            f"{b.draft / GIB:.1f}, buffers {b.buffers / GIB:.1f}, activations peak "
            f"{b.activations / GIB:.1f}, graph pools {b.graph_pools / GIB:.1f} (the capture "
            f"pass's peak {b.warmup_peak / GIB:.1f}) and memory "
            f"outside PyTorch {b.outside_torch / GIB:.1f}, leaving "
            f"{max(left, 0) / GIB:.2f} GiB for the KV cache, which needs at least "
            f"{need / GIB:.2f} GiB ({b.min_slots:,} slots) for the largest step; pass a "
            "smaller --max-num-seqs or --max-num-batched-tokens, a larger "
            "--gpu-memory-utilization, or fewer draft tokens (--num-draft-tokens, "
            "--tree-budget)")
    return plan


# the provisional cache the start-up profile runs on (engine/memory_profile.py)
def prompt_len(config: EngineConfig, max_positions: int) -> int:
    """Prompts of this length fill one prefill budget across max_num_seqs requests (at
    least 4 tokens; short of the context limit)."""
    fill = math.ceil(config.max_num_batched_tokens / config.max_num_seqs)
    return max(1, min(max(fill, 4), max_positions - generated_tokens(config) - 8))


def generated_tokens(config: EngineConfig) -> int:
    """Tokens a profile request commits: the prefill's one, a tree and a chain step of at
    most K + 1 each, a plain decode step."""
    return 2 + (2 * (config.num_draft_tokens + 1) if config.speculative else 0)


def _step_slots(config: EngineConfig) -> int:
    """Node and scratch slots of the widest VERIFY step, per request (an upper bound)."""
    if not config.speculative:
        return 1
    k = config.num_draft_tokens
    return max(config.verify_nodes, k + 1) + 1 + (k - 1) * config.tree_width


def profile_slots(config: EngineConfig, max_positions: int) -> int:
    """What the profile's requests hold at once (one set at a time): the largest step."""
    per_request = prompt_len(config, max_positions) + generated_tokens(config) + _step_slots(config)
    return config.max_num_seqs * (per_request + 2) + 16


# the speculation warm-up's dummy prompts (engine/warmup.py)
WARMUP_PROMPT_LEN = 4


def warmup_generated(num_draft: int, tree: bool, repeats: int, capture: bool = True) -> int:
    """Tokens a speculation warm-up request commits: prefill's one, repeats + 1 steps of
    K + 1 at most per K > 0, repeats + 2 plain steps; with graphs (`capture`) 2 untimed
    steps at max K and the mixed-K plans."""
    untimed = 2 + num_draft * (num_draft + 1) // 2 if capture else 0
    return 1 + sum(n * (k + 1) for k, n in
                   [*((k, repeats + 1) for k in range(1, num_draft + 1 + tree)),
                    (0, repeats + 2), (num_draft, untimed)])


def provisional_slots(config: EngineConfig, max_positions: int) -> int:
    """The provisional cache: the largest step (profile_slots), and with speculation the
    capture pass's warm-up at max_num_seqs requests."""
    slots = profile_slots(config, max_positions)
    if config.speculative:
        per_request = (WARMUP_PROMPT_LEN + _step_slots(config)
                       + warmup_generated(config.num_draft_tokens, config.tree_width > 1, 0))
        slots = max(slots, config.max_num_seqs * (per_request + 2) + 16)
    return slots
