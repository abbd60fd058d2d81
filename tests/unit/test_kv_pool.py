from __future__ import annotations

import pytest

from gearshift.scheduler.kv_pool import OutOfSlotsError, ReqRowPool, SlotPool


def test_slot_pool_never_hands_out_dummy_and_round_trips():
    pool = SlotPool(10)
    a = pool.alloc(4)
    b = pool.alloc(6)
    assert 0 not in a + b and sorted(a + b) == list(range(1, 11))
    assert pool.num_free == 0
    with pytest.raises(OutOfSlotsError):
        pool.alloc(1)
    pool.free(a)
    pool.free(b)
    assert pool.num_free + pool.num_cached == pool.total == 10


def test_row_pool_reserves_row_zero():
    rows = ReqRowPool(3)
    got = [rows.alloc() for _ in range(3)]
    assert sorted(got) == [1, 2, 3]
    with pytest.raises(OutOfSlotsError):
        rows.alloc()
