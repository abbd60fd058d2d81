"""engine/gc_control.py: the start-up heap is frozen (with CUDA graphs by default, or on
request), collection pauses, and the benchmarks' collection counter."""

from __future__ import annotations

import gc
import weakref

import pytest

from gearshift import LLM
from gearshift.engine.gc_control import GcPauses, freeze_heap, gc_paused, thaw_heap


@pytest.fixture
def unfreeze():
    yield
    gc.unfreeze()


def test_freeze_heap_moves_live_objects_to_the_permanent_generation(unfreeze):
    kept = [[i] for i in range(1000)]
    assert freeze_heap() >= len(kept)
    assert gc.get_freeze_count() >= len(kept)


class Node:
    """An object that can hold a reference to another: two make a cycle."""


def dropped_cycle() -> weakref.ref:
    a, b = Node(), Node()
    a.other, b.other = b, a  # freed by the collector only, never by reference counts
    return weakref.ref(a)


def test_thaw_heap_collects_cycles_dropped_after_the_freeze(unfreeze):
    gc.unfreeze()
    assert not thaw_heap()  # nothing frozen: no collection
    a = Node()
    a.self_ = a
    ref = weakref.ref(a)
    freeze_heap()
    del a
    gc.collect()
    assert ref() is not None  # frozen: the collector skips it
    assert thaw_heap() and ref() is None and gc.get_freeze_count() == 0


# built here, not by make_llm: its factory keeps every engine it built until teardown
CPU = dict(device="cpu", dtype="float32", attention_backend="torch", max_num_seqs=4,
           kv_cache_tokens=1024, max_num_batched_tokens=256)


def test_a_second_engine_frees_the_first_ones_frozen_cycles(tiny_llama_dir, unfreeze):
    llm = LLM(model=str(tiny_llama_dir), **CPU, gc_freeze=True)
    engine = weakref.ref(llm.engine)
    engine().self_cycle = engine()  # as any engine holding itself through a callback
    del llm
    gc.collect()
    assert engine() is not None  # frozen at its start-up: kept until the next engine thaws it
    LLM(model=str(tiny_llama_dir), **CPU)
    assert engine() is None


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
