"""The prefix-aware router, pure CPU: chained block hashes, the longest cached prefix wins,
load breaks ties and overrides a prefix hit past max_imbalance, dead replicas are skipped,
a restarted replica's cache is forgotten, and the per-replica index is LRU-bounded with a
prefix outliving the blocks that extend it."""

from __future__ import annotations

import pytest

from gearshift.cluster.router import PrefixRouter, ReplicaLoad, block_hashes

A = list(range(100, 164))  # 64 tokens: 4 blocks of 16
B = list(range(500, 564))


def idle(n: int) -> list[ReplicaLoad]:
    return [ReplicaLoad(alive=True, in_flight=0) for _ in range(n)]


def test_block_hashes_chain_and_skip_the_partial_block():
    hs = block_hashes(A[:40])
    assert len(hs) == 2
    assert block_hashes(A)[:2] == hs  # a longer prompt extends the chain
    other = block_hashes([7] + A[1:40])
    assert other[0] != hs[0] and other[1] != hs[1]  # block 1 differs through its parent
    assert block_hashes(A[:15]) == []


def test_repeats_of_a_prefix_follow_the_replica_that_has_it():
    router = PrefixRouter(2)
    loads = idle(2)
    first = router.choose(A + [1, 2], loads)
    assert first.reason == "load" and first.replica == 0
    router.record(first.replica, A + [1, 2])
    # replica 0 is now busier, so a new prefix goes to replica 1 by load
    loads = [ReplicaLoad(True, 1), ReplicaLoad(True, 0)]
    second = router.choose(B, loads)
    assert (second.replica, second.reason) == (1, "load")
    router.record(1, B)
    loads = [ReplicaLoad(True, 3), ReplicaLoad(True, 1)]
    again = router.choose(A + [9, 9, 9], loads)
    assert (again.replica, again.reason, again.matched_tokens) == (0, "prefix", 64)
    assert router.choose(B[:40], loads).replica == 1


def test_the_longest_prefix_wins_and_load_breaks_ties():
    router = PrefixRouter(3)
    router.record(0, A[:32])
    router.record(1, A)
    router.record(2, A)
    loads = [ReplicaLoad(True, 0), ReplicaLoad(True, 5), ReplicaLoad(True, 2)]
    route = router.choose(A, loads)
    assert (route.replica, route.reason) == (2, "prefix")


def test_too_busy_a_prefix_holder_loses_to_the_least_loaded():
    router = PrefixRouter(2, max_imbalance=4)
    router.record(0, A)
    assert router.choose(A, [ReplicaLoad(True, 4), ReplicaLoad(True, 0)]).replica == 0
    route = router.choose(A, [ReplicaLoad(True, 5), ReplicaLoad(True, 0)])
    assert (route.replica, route.reason) == (1, "load")


def test_free_kv_breaks_a_load_tie():
    router = PrefixRouter(2)
    loads = [ReplicaLoad(True, 1, kv_free_fraction=0.2), ReplicaLoad(True, 1, 0.9)]
    assert router.choose(B, loads).replica == 1


def test_idle_replicas_take_turns():
    router = PrefixRouter(3)
    picks = []
    for prompt in (A, B, [3] * 20, [4] * 20):
        route = router.choose(prompt, idle(3))
        router.record(route.replica, prompt)
        picks.append(route.replica)
    assert picks == [0, 1, 2, 0]


def test_dead_replicas_are_skipped_and_none_alive_raises():
    router = PrefixRouter(2)
    router.record(0, A)
    route = router.choose(A, [ReplicaLoad(False, 0), ReplicaLoad(True, 7)])
    assert (route.replica, route.reason) == (1, "load")
    with pytest.raises(LookupError):
        router.choose(A, [ReplicaLoad(False, 0), ReplicaLoad(False, 0)])


def test_forget_drops_a_restarted_replicas_prefixes():
    router = PrefixRouter(2)
    router.record(1, A)
    router.forget(1)
    assert router.choose(A, [ReplicaLoad(True, 0), ReplicaLoad(True, 0)]).reason == "load"


def test_the_index_is_bounded_by_the_kv_cache_and_keeps_prefixes_longest():
    router = PrefixRouter(1)
    router.set_capacity(0, 64)  # 4 blocks
    router.record(0, A)
    router.record(0, B[:32])  # 2 more blocks: A's last two (the leaves) go first
    hashes = block_hashes(A)
    assert router.matched_blocks(0, hashes) == 2
    assert router.matched_blocks(0, block_hashes(B)) == 2


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        PrefixRouter(0)
    with pytest.raises(ValueError):
        PrefixRouter(2, max_imbalance=-1)
