"""GPU tier (skipped without CUDA): `--step-trace` writes a VERIFY step's CUDA-event times
(speculative/timing.py): its draft proposal inside its device span, the span inside its
wall time."""

from __future__ import annotations

import json

import pytest
import torch
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_verify_steps_carry_draft_and_span_times(tiny_llama_dir, tmp_path):
    path = tmp_path / "t.jsonl"
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = LLM(str(tiny_llama_dir), device="cuda", dtype="float32", max_num_seqs=4,
              kv_cache_tokens=4096, speculative_algorithm="eagle3", draft_model=str(head),
              num_draft_tokens=3, spec_policy="always", step_trace=str(path))
    llm.generate([list(range(3, 20))] * 2,
                 SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    verify = [x for x in map(json.loads, path.read_text().splitlines())
              if x["mode"] == "verify"]
    assert verify
    for x in verify:
        assert 0 <= x["catch_up_ms"] and 0 < x["draft_ms"] <= x["span_ms"] <= x["ms"] * 1.05
        assert 0 < x["draft_host_ms"] < x["ms"]
