"""The prefix cache's radix tree (pure CPU): matches split nodes at the match's end, inserts
hand duplicate slots back, held nodes are never evicted, eviction is least recently used
first and frees whole unreferenced leaves, and the counts behind kv_slots_cached hold.

Data flow (tests only): token lists + slot lists -> PrefixCache -> matches, freed slots.
"""

from __future__ import annotations

from gearshift.scheduler.kv_pool import SlotPool
from gearshift.scheduler.prefix_cache import PrefixCache


def _slots(cache: PrefixCache) -> list[int]:
    return sorted(s for n in cache._nodes() for s in n.slots)


def test_match_finds_the_longest_cached_prefix_and_splits_there():
    c = PrefixCache()
    assert c.insert([1, 2, 3, 4], [11, 12, 13, 14], draft_rows=4) == []
    m = c.match([1, 2, 9])
    assert (m.length, m.slots, m.draft_rows) == (2, [11, 12], 2)
    assert c.depth(m.node) == 2 and m.node.key == [1, 2]  # split: [1 2] -> [3 4]
    assert c.match([1, 2, 3, 4, 5]).slots == [11, 12, 13, 14]
    assert c.match([7]).length == 0
    assert c.num_slots == 4 and _slots(c) == [11, 12, 13, 14]


def test_insert_keeps_the_cached_slots_and_returns_the_duplicates():
    c = PrefixCache()
    c.insert([1, 2, 3], [11, 12, 13], draft_rows=0)
    # a request that computed [1 2] itself, then diverged: its own copies come back
    assert c.insert([1, 2, 5, 6], [21, 22, 25, 26], draft_rows=0) == [21, 22]
    assert c.match([1, 2, 5, 6, 7]).slots == [11, 12, 25, 26]
    # a request that started from the cache: its shared slots are the cache's own
    assert c.insert([1, 2, 3, 8], [11, 12, 13, 38], draft_rows=0) == []
    assert c.num_slots == 6 and c.num_evictable == 6


def test_held_nodes_are_never_evicted_and_eviction_is_lru():
    pool = SlotPool(16, PrefixCache())
    c = pool.cache
    a, b = pool.alloc(3), pool.alloc(3)
    c.insert([1, 2, 3], a, draft_rows=0)
    c.insert([4, 5, 6], b, draft_rows=0)
    c.match([4, 5, 6])  # b used last
    held = c.match([1, 2, 3]).node
    assert c.hold(held) == 3 and c.num_evictable == 3
    assert pool.num_free == 10 and pool.num_available == 13 and pool.num_cached == 3
    got = pool.alloc(12)  # needs 2 more than the free list: evicts b, not the held a
    assert not set(got) & set(a) and set(b) <= set(got) and pool.num_free == 1
    assert c.match([1, 2, 3]).length == 3 and c.match([4, 5, 6]).length == 0
    c.release(held)
    assert c.num_evictable == 3
    pool.free(got)
    assert pool.num_free + pool.num_cached == pool.total


def test_eviction_frees_leaves_first_and_parents_once_childless():
    c = PrefixCache()
    c.insert([1, 2, 3], [1, 2, 3], draft_rows=0)
    c.insert([1, 2, 4], [9, 9, 4], draft_rows=0)  # shares [1 2]: its 9s come back
    assert _slots(c) == [1, 2, 3, 4]
    freed = c.evict(1)
    assert len(freed) == 1 and freed[0] in (3, 4)
    assert sorted(c.evict(10)) == sorted({1, 2, 3, 4} - set(freed))
    assert c.num_slots == 0 and c.clear() == []


def test_draft_rows_stop_at_the_first_node_the_draft_had_not_covered():
    c = PrefixCache()
    c.insert([1, 2, 3, 4], [1, 2, 3, 4], draft_rows=2)
    assert c.match([1, 2, 3, 4]).draft_rows == 2
    # the owner of those slots catches its draft up and inserts again: coverage grows
    c.insert([1, 2, 3, 4], [1, 2, 3, 4], draft_rows=4)
    assert c.match([1, 2, 3, 4]).draft_rows == 4
    assert c.match([1, 2]).draft_rows == 2


def test_hit_statistics_count_prompt_tokens():
    c = PrefixCache()
    c.insert([1, 2, 3], [1, 2, 3], draft_rows=0)
    c.match([1, 2, 7, 8])
    assert (c.queries_tokens, c.hit_tokens) == (4, 2)
