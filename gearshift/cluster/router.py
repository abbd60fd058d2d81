"""Which replica takes a request: the one that most likely holds the longest prefix of its
prompt in its KV cache, unless that replica is much busier than the least loaded one; with
no cached prefix anywhere, the least loaded (requests in flight, then free KV, then fewest sent so far).

The router keeps, per replica, the chained hashes of the prompt blocks it sent there
(BLOCK_TOKENS tokens a block, as llm-d's approximate prefix scorer does), least recently
used first out, at most as many blocks as that replica's KV cache holds. It learns nothing
from the engines themselves, so it can be wrong after evictions; a wrong guess costs a
prefill, never a wrong answer.

    prompt tokens ─► block_hashes ─► longest run of leading hashes each replica holds
                                      │ best > 0 and its load within max_imbalance of
                                      │ the least loaded one ─► that replica ("prefix")
                                      └ otherwise ─► least loaded replica ("load")

Pure CPU, no Ray: cluster/replicas.py asks it, the tests drive it directly.
Data flow: ReplicaSet.add_request -> PrefixRouter.choose -> record -> the replica's engine.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from gearshift.scheduler.block_hashes import BLOCK_TOKENS, block_hashes

DEFAULT_MAX_IMBALANCE = 8  # in-flight requests a prefix hit may put on a replica beyond the least


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """What the router reads of one replica when it routes (set by ReplicaSet)."""

    alive: bool
    in_flight: int  # requests sent and not yet finished
    kv_free_fraction: float = 1.0  # free + cached KV slots / total, as last reported


@dataclass(frozen=True, slots=True)
class Route:
    replica: int
    reason: str  # "prefix" | "load"
    matched_tokens: int  # prompt tokens the chosen replica is believed to hold


class PrefixRouter:
    def __init__(self, num_replicas: int, *, block_tokens: int = BLOCK_TOKENS,
                 max_imbalance: int = DEFAULT_MAX_IMBALANCE,
                 capacity_blocks: int = 1 << 16) -> None:
        if num_replicas < 1 or block_tokens < 1 or max_imbalance < 0:
            raise ValueError("num_replicas and block_tokens must be >= 1, max_imbalance >= 0")
        self.block_tokens = block_tokens
        self.max_imbalance = max_imbalance
        self._capacity = [capacity_blocks] * num_replicas
        self._blocks: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_replicas)]
        self._assigned = [0] * num_replicas  # requests recorded per replica: spreads ties

    def set_capacity(self, replica: int, kv_slots: int) -> None:
        """The replica's KV cache size in tokens: it holds at most that many blocks."""
        self._capacity[replica] = max(1, kv_slots // self.block_tokens)
        self._trim(replica)

    def forget(self, replica: int) -> None:
        """The replica restarted: its cache is empty."""
        self._blocks[replica].clear()

    def matched_blocks(self, replica: int, hashes: list[int]) -> int:
        blocks = self._blocks[replica]
        n = 0
        for h in hashes:
            if h not in blocks:
                break
            n += 1
        return n

    def choose(self, token_ids: list[int], loads: list[ReplicaLoad]) -> Route:
        """The replica for a prompt; raises LookupError when none is alive."""
        alive = [i for i, load in enumerate(loads) if load.alive]
        if not alive:
            raise LookupError("no replica is alive")

        def busy(i: int) -> tuple[int, float, int, int]:
            return loads[i].in_flight, -loads[i].kv_free_fraction, self._assigned[i], i

        least = min(alive, key=busy)
        hashes = block_hashes(token_ids, self.block_tokens)
        matched = {i: self.matched_blocks(i, hashes) for i in alive}
        best = max(matched.values())
        if best > 0:
            pick = min((i for i in alive if matched[i] == best), key=busy)
            if loads[pick].in_flight - loads[least].in_flight <= self.max_imbalance:
                return Route(pick, "prefix", best * self.block_tokens)
        return Route(least, "load", matched[least] * self.block_tokens)

    def record(self, replica: int, token_ids: list[int]) -> None:
        """The prompt went to `replica`: its blocks are (about to be) cached there."""
        self._assigned[replica] += 1
        blocks = self._blocks[replica]
        # the first block last: most recently used, evicted after the blocks that extend it
        for h in reversed(block_hashes(token_ids, self.block_tokens)):
            blocks[h] = None
            blocks.move_to_end(h)
        self._trim(replica)

    def _trim(self, replica: int) -> None:
        blocks = self._blocks[replica]
        while len(blocks) > self._capacity[replica]:
            blocks.popitem(last=False)
