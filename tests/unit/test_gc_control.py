"""engine/gc_control.py: the start-up heap is frozen (with CUDA graphs by default, or on
request), collection pauses, and the benchmarks' collection counter."""

from __future__ import annotations

import gc

import pytest

from gearshift.engine.gc_control import GcPauses, freeze_heap, gc_paused


@pytest.fixture
def unfreeze():
    yield
    gc.unfreeze()


def test_freeze_heap_moves_live_objects_to_the_permanent_generation(unfreeze):
    kept = [[i] for i in range(1000)]
    assert freeze_heap() >= len(kept)
    assert gc.get_freeze_count() >= len(kept)


def test_gc_paused_restores_the_previous_state():
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()


def test_gc_pauses_counts_collections_by_generation():
    with GcPauses() as pauses:
        gc.collect(0)
        gc.collect(2)
    d = pauses.as_dict()
    assert d["gc_collections"][0] >= 1 and d["gc_collections"][2] >= 1 and d["gc_ms"] >= 0
    gc.collect()  # after exit: not counted
    assert pauses.as_dict() == d


def test_engine_freezes_its_start_up_heap_on_request(make_llm, tiny_llama_dir, unfreeze):
    gc.unfreeze()
    make_llm(tiny_llama_dir)  # CPU, no CUDA graphs: not frozen by default
    assert gc.get_freeze_count() == 0
    make_llm(tiny_llama_dir, gc_freeze=True)
    assert gc.get_freeze_count() > 0
