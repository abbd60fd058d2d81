"""Host-side bookkeeping of KV-cache slots and req_to_token rows (pure CPU).

Slot layout (page size 1: one slot holds one token's K and V in every layer):

    slot id   0        1   2   3   4   5  ...  total
             [dummy]  [r0 ][r0 ][r1 ][   ][r0 ] ...
              ^ reserved: padded CUDA-graph rows write here; never handed out

    req_to_token[row, pos] = slot of token `pos` of the request that owns `row`;
    row 0 is reserved for padded rows as well.

Invariant (tested): when the engine is idle, free + cached == total, where `cached`
counts the slots held only by the prefix cache (prefix_cache.py): evictable, so they count
as available, and an allocation that finds the free list short evicts them.
"""

from __future__ import annotations


class OutOfSlotsError(RuntimeError):
    """Raised when an allocation exceeds the free slots (a scheduler bug: it plans by count)."""


class SlotPool:
    """Free list of token slots 1..total (slot 0 is the reserved dummy)."""

    def __init__(self, total: int, cache=None) -> None:
        self.total = total
        self._free: list[int] = list(range(total, 0, -1))  # pop() hands out low ids first
        self.cache = cache  # PrefixCache | None

    def reset(self, total: int) -> None:
        """Every slot free, `total` of them (the KV cache was reallocated: nothing cached)."""
        if self.cache is not None:
            self.cache.clear()
        self.total = total
        self._free = list(range(total, 0, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return self.cache.num_evictable if self.cache is not None else 0

    @property
    def num_available(self) -> int:
        """Free slots and those the cache would give up."""
        return len(self._free) + self.num_cached

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free) and self.cache is not None:
            self._free.extend(self.cache.evict(n - len(self._free), batch=True))
        if n > len(self._free):
            raise OutOfSlotsError(f"asked for {n} KV slots, {len(self._free)} free")
        if n == 0:
            return []
        out = self._free[-n:]
        del self._free[-n:]
        out.reverse()
        return out

    def free(self, slots: list[int]) -> None:
        self._free.extend(slots)

    def clear_cache(self) -> int:
        """Free every slot only the prefix cache holds; -> how many."""
        freed = self.cache.clear() if self.cache is not None else []
        self.free(freed)
        return len(freed)

    def stats(self) -> dict:
        return {"kv_slots_total": self.total, "kv_slots_free": self.num_free,
                "kv_slots_cached": self.num_cached}


class ReqRowPool:
    """Rows of the req_to_token table, 1..max_num_seqs (row 0 is the reserved dummy)."""

    def __init__(self, max_num_seqs: int) -> None:
        self.size = max_num_seqs
        self._free = list(range(max_num_seqs, 0, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self) -> int:
        if not self._free:
            raise OutOfSlotsError("no free req_to_token row")
        return self._free.pop()

    def free(self, row: int) -> None:
        self._free.append(row)
