"""What a step captures or compiles after the start-up warm-up is logged and counted
(runner/serving_watch.py): Engine.stats()["late"], and the step trace marks the step.
Graphs on the CPU emulation of GraphCache (eager_graphs.SharedPoolGraphs); Triton's
post-compile hook called as Triton calls it; the GEMM chooser with its measurement stubbed
(it times on CUDA only)."""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from types import SimpleNamespace

from checkpoints import random_prompts
from eager_graphs import SharedPoolGraphs, install
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import SamplingParams
from gearshift.engine.step_trace import StepTrace
from gearshift.engine.warmup import warm_up_speculation
from gearshift.runner.serving_watch import ServingWatch


@contextmanager
def runner_log():
    """The messages gearshift.runner logs inside the block (gearshift's loggers do not
    propagate to the root, where caplog listens)."""
    records: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("gearshift.runner")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def test_graphs_captured_after_the_warm_up_are_logged_and_counted(make_llm, tiny_llama_dir,
                                                                  tmp_path):
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=3, spec_policy="always", max_num_seqs=8)
    eng = llm.engine
    graphs = install(llm, SharedPoolGraphs())
    warm_up_speculation(eng, sizes=[1])  # the warm-up's own captures are not counted
    eng.watch.start(eng.runner)
    assert graphs.watch is eng.watch and eng.stats()["late"]["graph_captures"] == 0
    eng.step_stats.trace = StepTrace(str(tmp_path / "t.jsonl"), None, eng.watch)
    before = len(graphs.entries)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    with runner_log() as messages:
        llm.generate(random_prompts([5, 9, 3, 7], seed=1), params)  # batch 4: not warmed
    late = eng.stats()["late"]
    assert late["graph_captures"] == len(graphs.entries) - before > 0
    assert sum("captured a CUDA graph while serving" in m for m in messages) \
        == late["graph_captures"]
    eng.step_stats.trace.flush()
    lines = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert sum(x.get("late", {}).get("captures", 0) for x in lines) == late["graph_captures"]
    with runner_log() as messages:  # the same shapes again
        llm.generate(random_prompts([6, 8, 4, 7], seed=2), params)
    assert eng.stats()["late"]["graph_captures"] == late["graph_captures"]
    assert not messages


def test_triton_compiles_while_serving_are_counted():
    import triton.knobs as knobs

    from gearshift.runner.jit_log import triton_compiles

    quiet, loud = ServingWatch(), ServingWatch()
    hook = lambda: knobs.runtime.jit_post_compile_hook  # noqa: E731
    quiet.start()
    assert hook() is not None
    loud.start()  # the engine that started last hears of the process's compiles
    with runner_log() as messages:
        hook()(fn=SimpleNamespace(name="decode_attention"), key="k", repr="r", compile={})
    assert (quiet.triton_compiles, loud.triton_compiles) == (0, 1)
    assert any("decode_attention" in m for m in messages)
    with triton_compiles() as bench:  # a bench's block around ours: each hears it once
        loud.start()
        hook()(fn=SimpleNamespace(name="y"), key="k", repr="r", compile={})
    assert bench == ["y"] and loud.triton_compiles == 2
    loud.start()  # that block restored the hook it found: the next start chains ours again
    hook()(fn=SimpleNamespace(name="z"), key="k", repr="r", compile={})
    assert loud.triton_compiles == 3
    loud.watching = False  # before start(): nothing is counted
    hook()(fn=SimpleNamespace(name="x"), key="k", repr="r", compile={})
    assert loud.triton_compiles == 3


def test_gemm_shapes_timed_while_serving_are_counted(monkeypatch):
    import torch

    from gearshift.kernels import skinny_select

    chooser, watch = skinny_select.SkinnyChooser("auto"), ServingWatch().start()
    chooser.watch = watch
    timed = []
    monkeypatch.setattr(chooser, "_measure", lambda key, w, b: timed.append(key))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)

    def tensor(*shape):  # what choose() reads of a CUDA tensor
        return SimpleNamespace(is_cuda=True, shape=shape, dtype=torch.bfloat16,
                               dim=lambda: len(shape), stride=lambda d: 1)

    w = tensor(256, 64)
    with runner_log() as messages:
        for rows in (3, 4, 3, 9):  # buckets 4, 4, 4, 16: two shapes timed
            chooser.choose(tensor(rows, 64), w, None)
    assert len(timed) == 2 and watch.stats()["gemm_choices"] == 2 == len(messages)
    assert "rows 16, N 256, K 64" in messages[1]
    assert watch.counts() == (0, 0, 2)
    watch.watching = False  # not yet started (the warm-up): measured, not counted
    chooser.choose(tensor(40, 64), w, None)
    assert len(timed) == 3 and watch.stats()["gemm_choices"] == 2


def test_allocator_growth_and_retries_after_the_warm_up_are_counted(monkeypatch):
    """On CUDA the stats carry the caching allocator's segments taken and retries since
    watching started (torch's counters, stubbed here), and the GEMM chooser reports to
    the watch."""
    import torch

    from gearshift.kernels.skinny_select import CHOOSER

    monkeypatch.setattr(CHOOSER, "watch", None)
    counts = {"segment.all.allocated": 40, "num_alloc_retries": 1}
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: dict(counts))
    runner = SimpleNamespace(shape_graphs=None, device=SimpleNamespace(type="cuda"))
    watch = ServingWatch().start(runner)
    assert CHOOSER.watch is watch
    assert (watch.stats()["device_mallocs"], watch.stats()["alloc_retries"]) == (0, 0)
    counts.update({"segment.all.allocated": 43, "num_alloc_retries": 3})
    assert (watch.stats()["device_mallocs"], watch.stats()["alloc_retries"]) == (3, 2)
    assert "device_mallocs" not in ServingWatch().start().stats()  # not on CUDA: no counts
