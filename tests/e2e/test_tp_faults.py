"""Faults under tensor parallelism end the engine with an error naming the rank, within
seconds, never a hang: a rank killed mid-run, and a rank whose plan differs from rank 0's
(made to disagree on purpose: rank 0 sends it altered policy answers).

Data flow (tests only): LLM(tensor_parallel_size=2) -> steps -> the fault -> RankFailure.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from checkpoints import random_prompts
from conftest import CPU_ENGINE_DEFAULTS
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import LLM, SamplingParams
from gearshift.distributed.engine import RankFailure
from gearshift.distributed.sync import RecordingPolicy

LONG = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)


def _run_until_failure(engine) -> tuple[float, str]:
    """Steps until the engine raises; -> (seconds it took, its message)."""
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as failure:
        while time.monotonic() - t0 < 60:
            engine.step()
    dt = time.monotonic() - t0
    return dt, str(failure.value)


def test_a_killed_rank_ends_the_engine_within_seconds(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), tensor_parallel_size=2, **CPU_ENGINE_DEFAULTS)
    engine = llm.engine
    try:
        for i, prompt in enumerate(random_prompts([5, 9, 14, 3], seed=2)):
            engine.add_request(f"r{i}", prompt, LONG)
        for _ in range(3):
            engine.step()
        os.kill(engine.group.workers[0].pid, signal.SIGKILL)
        dt, message = _run_until_failure(engine)
        assert dt < 10, dt
        assert "rank 1 was killed by signal 9" in message
        with pytest.raises(RankFailure):  # and it stays failed: the server's loop stops
            engine.has_unfinished_requests()
    finally:
        engine.shutdown()


def test_a_rank_that_plans_differently_is_caught(tiny_llama_dir, tmp_path, monkeypatch):
    head = make_eagle3_checkpoint(tmp_path / "head", aux_layer_ids=[0, 1, 1])
    llm = LLM(str(tiny_llama_dir), tensor_parallel_size=2, speculative_algorithm="eagle3",
              draft_model=str(head), spec_policy="always", num_draft_tokens=3,
              **CPU_ENGINE_DEFAULTS)
    engine = llm.engine
    try:
        take = RecordingPolicy.take

        def altered(self):  # rank 1 replays K = 1 where rank 0 drafts 3
            return [[1] * len(a) if isinstance(a, list) else a for a in take(self)]

        for i, prompt in enumerate(random_prompts([5, 9], seed=3)):
            engine.add_request(f"r{i}", prompt, LONG)
        monkeypatch.setattr(RecordingPolicy, "take", altered)
        dt, message = _run_until_failure(engine)
        assert dt < 10, dt
        assert "rank 1 exited with code 1: PlanMismatch: rank 1 planned VERIFY" in message
    finally:
        engine.shutdown()
