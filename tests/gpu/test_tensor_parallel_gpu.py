"""GPU tier of tensor parallelism (skipped without CUDA): NCCL with one rank under
torchrun (the distributed path on one GPU, CUDA graphs capturing its collectives) and, with
two GPUs, TP=2 against one GPU, plain and speculating, in fp32.

Data flow (tests only): torchrun / LLM(tensor_parallel_size=...) on cuda -> greedy tokens
compared with a one-GPU engine's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [list(range(3, 3 + n)) for n in (5, 17, 33, 2, 60, 9)]
GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
OPTS = dict(device="cuda", dtype="float32", max_num_seqs=8, kv_cache_tokens=4096)

SCRIPT = """
import json, sys
from gearshift import LLM, SamplingParams
llm = LLM(sys.argv[1], device="cuda", dtype="float32", max_num_seqs=8, kv_cache_tokens=4096)
outs = llm.generate(json.loads(sys.argv[2]), SamplingParams(max_tokens=40, temperature=0,
                                                            ignore_eos=True), use_tqdm=False)
assert llm.engine.runner.tp is not None and llm.engine.runner.decode_sizes
print(json.dumps([o.token_ids for o in outs]))
"""


def _tokens(model_dir, **kw) -> list[list[int]]:
    llm = LLM(str(model_dir), **OPTS, **kw)
    try:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    finally:
        if hasattr(llm.engine, "shutdown"):
            llm.engine.shutdown()


def test_one_rank_under_torchrun_equals_one_gpu(tiny_llama_dir, tmp_path):
    script = tmp_path / "one_rank.py"
    script.write_text(SCRIPT)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "1", str(script), str(tiny_llama_dir),
                          json.dumps(PROMPTS)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == _tokens(tiny_llama_dir)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("spec", [{}, dict(num_draft_tokens=3, spec_policy="always"),
                                  dict(num_draft_tokens=3, tree_width=2, tree_budget=6,
                                       spec_policy="random")])
def test_tp2_equals_one_gpu(tiny_llama_dir, tmp_path, spec):
    if spec:
        head = make_eagle3_checkpoint(tmp_path / "head", aux_layer_ids=[0, 1, 1])
        spec = dict(spec, speculative_algorithm="eagle3", draft_model=str(head))
    assert _tokens(tiny_llama_dir, tensor_parallel_size=2, **spec) == _tokens(tiny_llama_dir)

