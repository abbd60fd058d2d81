"""Parity with Hugging Face transformers on tiny random checkpoints of every architecture:
prefill logits, and greedy tokens under plain batching, chunked prefill and preemption.

Data flow: tiny HF checkpoint -> gearshift LLM (engine: scheduler -> runner -> sampler)
vs transformers (forward / generate) on the same files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from checkpoints import assert_idle_invariant, hf_greedy, load_hf_model, random_prompts
from interpreter_compat import interpreter_problem

from gearshift import SamplingParams

NEW_TOKENS = 40
# Different lengths; 50 + 40 reaches position 90, past llama3's original context of 64.
BATCH_PROMPTS = random_prompts([3, 11, 24, 50], seed=1)
# ~20-token prompts x 40 new tokens = 240 tokens of KV, more than a 100-slot pool holds.
PREEMPT_PROMPTS = random_prompts([18, 20, 22, 19], seed=2)
LOGITS_PROMPT = random_prompts([100], seed=3)[0]


def _greedy(max_tokens: int = NEW_TOKENS) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="session")
def hf_oracle():
    """hf_oracle(dir) -> HF model; hf_oracle.greedy(dir, prompt, n) -> cached HF tokens."""

    class Oracle:
        def __init__(self) -> None:
            self.models: dict[str, torch.nn.Module] = {}
            self.tokens: dict[tuple, list[int]] = {}

        def __call__(self, model_dir: Path) -> torch.nn.Module:
            key = str(model_dir)
            if key not in self.models:
                self.models[key] = load_hf_model(model_dir)
            return self.models[key]

        def greedy(self, model_dir: Path, prompt: list[int], n: int = NEW_TOKENS) -> list[int]:
            key = (str(model_dir), tuple(prompt), n)
            if key not in self.tokens:
                self.tokens[key] = hf_greedy(self(model_dir), prompt, n)
            return self.tokens[key]

    return Oracle()


def _assert_same_tokens(outs, refs: list[list[int]], prompts: list[list[int]]) -> None:
    assert len(outs) == len(refs)
    for i, (out, ref) in enumerate(zip(outs, refs, strict=True)):
        if out.token_ids != ref:
            first = next((j for j, (a, b) in enumerate(zip(out.token_ids, ref)) if a != b), None)
            pytest.fail(
                f"prompt {i} (len {len(prompts[i])}): tokens differ from HF at step {first}:\n"
                f"  gearshift {out.token_ids}\n  hf        {ref}"
            )
        assert out.finish_reason == "length"


@torch.no_grad()
def test_prefill_logits_match_hf(tiny_model_dir: Path, make_llm, hf_oracle) -> None:
    llm = make_llm(tiny_model_dir)
    assert hasattr(llm.engine, "prefill_logits"), "engine needs the prefill_logits debug helper"
    logits = llm.engine.prefill_logits(LOGITS_PROMPT)  # [len, vocab]
    ref = hf_oracle(tiny_model_dir)(torch.tensor([LOGITS_PROMPT])).logits[0]  # [len, vocab]
    assert tuple(logits.shape) == tuple(ref.shape)
    diff = (logits.float().cpu() - ref).abs().max().item()
    assert diff <= 1e-4, f"max |logits - hf| = {diff:.3g}"
    assert_idle_invariant(llm)


def test_greedy_batch_matches_hf_generate(tiny_model_dir: Path, make_llm, hf_oracle) -> None:
    llm = make_llm(tiny_model_dir)
    outs = llm.generate(BATCH_PROMPTS, _greedy())
    refs = [hf_oracle.greedy(tiny_model_dir, p) for p in BATCH_PROMPTS]
    _assert_same_tokens(outs, refs, BATCH_PROMPTS)
    assert_idle_invariant(llm)


def test_greedy_chunked_prefill_matches_hf(tiny_model_dir: Path, make_llm, hf_oracle) -> None:
    """A 16-token budget splits the 24- and 50-token prompts into several prefill chunks."""
    llm = make_llm(tiny_model_dir, max_num_batched_tokens=16)
    outs = llm.generate(BATCH_PROMPTS, _greedy())
    refs = [hf_oracle.greedy(tiny_model_dir, p) for p in BATCH_PROMPTS]
    _assert_same_tokens(outs, refs, BATCH_PROMPTS)
    assert_idle_invariant(llm)


def test_greedy_under_preemption_matches_hf(tiny_model_dir: Path, make_llm, hf_oracle) -> None:
    """4 requests needing ~60 slots each share a 100-slot pool: the newest get preempted,
    requeued and recomputed, and no token changes."""
    llm = make_llm(tiny_model_dir, kv_cache_tokens=100, max_num_seqs=4)
    assert llm.memory_stats()["kv_slots_total"] <= 128, "pool must be small to force preemption"
    outs = llm.generate(PREEMPT_PROMPTS, _greedy())
    refs = [hf_oracle.greedy(tiny_model_dir, p) for p in PREEMPT_PROMPTS]
    _assert_same_tokens(outs, refs, PREEMPT_PROMPTS)
    assert llm.stats()["preemptions"] > 0, "the pool was meant to be too small"
    assert_idle_invariant(llm)


def test_engine_reusable_across_generate_calls(tiny_llama_dir: Path, make_llm, hf_oracle) -> None:
    llm = make_llm(tiny_llama_dir, kv_cache_tokens=100, max_num_seqs=4)
    for prompts in (PREEMPT_PROMPTS[:2], PREEMPT_PROMPTS, PREEMPT_PROMPTS[3:]):
        outs = llm.generate(prompts, _greedy(24))
        refs = [hf_oracle.greedy(tiny_llama_dir, p, 24) for p in prompts]
        _assert_same_tokens(outs, refs, prompts)
        assert_idle_invariant(llm)


# ---- triton backend, interpreted on CPU ---------------------------------------------------

_TRITON_BACKEND = Path(__file__).resolve().parents[2] / "gearshift/attention/triton_backend.py"
_TRITON_SCRIPT = """
import json, sys
from gearshift import LLM, SamplingParams
model, prompts, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
llm = LLM(model=model, device="cpu", dtype="float32", attention_backend="triton",
          max_num_seqs=4, kv_cache_tokens=256, max_num_batched_tokens=16)
outs = llm.generate(prompts, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
print(json.dumps({"tokens": [o.token_ids for o in outs], "stats": llm.memory_stats()}))
"""


@pytest.mark.skipif(not _TRITON_BACKEND.exists(), reason="triton attention backend not written yet")
def test_triton_backend_interpreted_matches_hf(tiny_qwen3_dir: Path, hf_oracle) -> None:
    """Triton kernels (prefill chunks over the slot pool, then decode) under
    TRITON_INTERPRET=1, in a fresh process: the env var must precede kernel definition."""
    pytest.importorskip("triton")
    if problem := interpreter_problem():  # a GPU machine's triton (the CPU run stops earlier)
        pytest.skip(problem)
    prompts, n = random_prompts([5, 21], seed=4), 6
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _TRITON_SCRIPT, str(tiny_qwen3_dir), json.dumps(prompts), str(n)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    refs = [hf_oracle.greedy(tiny_qwen3_dir, p, n) for p in prompts]
    assert result["tokens"] == refs
    stats = result["stats"]
    assert stats["kv_slots_free"] + stats["kv_slots_cached"] == stats["kv_slots_total"]


@torch.no_grad()
def test_folded_norms_match_hf(tiny_model_dir: Path, make_llm, hf_oracle, monkeypatch) -> None:
    """fold_norms (on CUDA with TMA the runner applies it at load): the RMSNorm weights
    folded into qkv / gate_up. Every forward then runs DecoderLayer.forward_fused (norm
    inside the product after it, residual add inside the product before it; above the
    skinny chooser's 64 rows the norm alone, then cuBLAS) and never the add + norm layer
    (it raises here). Against HF: logits of a 20-token prompt and of a 100-token one, and
    greedy generation."""
    from gearshift.models.layers import DecoderLayer

    llm = make_llm(tiny_model_dir)
    model = llm.engine.runner.model
    model.fold_norms()

    def unfused(*args, **kwargs):
        raise AssertionError("a folded model ran the add + norm layer")

    monkeypatch.setattr(DecoderLayer, "forward", unfused)
    assert model.norms_folded
    assert all(bool((layer.input_layernorm.weight == 1).all()) for layer in model.layers)
    hf = hf_oracle(tiny_model_dir)
    for prompt in (LOGITS_PROMPT[:20], LOGITS_PROMPT):
        logits = llm.engine.prefill_logits(prompt)
        ref = hf(torch.tensor([prompt])).logits[0]
        diff = (logits.float() - ref).abs().max().item()
        assert diff <= 1e-4, f"{len(prompt)} tokens: max |logits - hf| = {diff:.3g}"
    refs = [hf_oracle.greedy(tiny_model_dir, p) for p in BATCH_PROMPTS]
    _assert_same_tokens(llm.generate(BATCH_PROMPTS, _greedy()), refs, BATCH_PROMPTS)
    assert_idle_invariant(llm)


@torch.no_grad()
def test_folded_norms_capture_the_same_features(tiny_llama_dir: Path, make_llm) -> None:
    """The fused path's EAGLE-3 features (the residual stream after the captured layers)
    and final hidden states equal the unfolded model's."""
    from gearshift.forward_batch import ForwardMode
    from gearshift.request import Request
    from gearshift.scheduler.plan import StepPlan

    prompt = LOGITS_PROMPT[:30]
    outs = []
    for fold in (False, True):
        llm = make_llm(tiny_llama_dir)
        engine, runner = llm.engine, llm.engine.runner
        if fold:
            runner.model.fold_norms()
        req = Request("probe", list(prompt), SamplingParams(max_tokens=1), 0)
        plan = StepPlan(mode=ForwardMode.EXTEND)
        plan.add(req, len(prompt))
        try:
            fb = engine.builder.prepare(plan).forward
            outs.append(runner.model(fb.input_ids, fb.positions, fb, runner.attn, capture=(0, 1)))
        finally:
            engine.scheduler._release(req)
    for plain, fused in zip(outs[0], outs[1], strict=True):
        torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-4)
