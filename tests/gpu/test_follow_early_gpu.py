"""GPU tier (skipped without CUDA): on real CUDA graphs, a VERIFY step launches the draft's
follow-up over its accepted tokens before its sync (speculative/follow_up.py, the result
read through a pinned copy and an event), and leaves the draft where the host-built
follow-up after commit leaves it: the same proposals step by step (acceptance scripted),
for chains and trees. The CPU twin: tests/e2e/test_spec_follow_early.py."""

from __future__ import annotations

import pytest
import torch
from eagle3_checkpoints import make_eagle3_checkpoint
from follow_checks import follow_run, script_acceptance

from gearshift import LLM

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("topk", [1, 2])
def test_early_follow_up_on_cuda_graphs(tiny_llama_dir, tmp_path, monkeypatch, topk):
    if topk == 1:
        script_acceptance(monkeypatch)
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])

    def make(model_dir, **opts):
        return LLM(str(model_dir), device="cuda", dtype="float32", kv_cache_tokens=8192,
                   **opts)

    spec = dict(speculative_algorithm="eagle3", draft_model=str(head), num_draft_tokens=3,
                spec_policy="always", tree_width=topk)
    late = follow_run(make, tiny_llama_dir, early=False, stand_in=False, **spec)
    early = follow_run(make, tiny_llama_dir, early=True, stand_in=False, **spec)
    assert early[2] > 5 and early[:2] == late[:2] and len(early[0]) > 5
