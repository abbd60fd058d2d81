"""`gearshift bench spec-costs`: what speculation costs on this device, at batch 1.

Measures, on one engine (target + EAGLE-3 head; dummy weights from presets unless given):
  * the plain decode step (CUDA-graph replay, device time from CUDA events),
  * the target's VERIFY pass over K+1 tokens (device time of that forward alone),
  * one EAGLE-3 draft step (device time, events around each head step),
and prints their ratios with the measured acceptance (near 0 for random weights: this
bench measures cost, not speed-up). Writes JSON.

Data flow: args -> LLM(speculative eagle3) -> policy off (DECODE) then always K (VERIFY).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

import torch

from gearshift.request import SamplingParams


def write_dummy_head(target_preset_cfg: dict, out: Path, draft_vocab: int, device: str) -> Path:
    """An EAGLE-3 head shaped for the target (public layout), small random weights."""
    from safetensors.torch import save_file

    h = target_preset_cfg["hidden_size"]
    heads, kv = target_preset_cfg["num_attention_heads"], target_preset_cfg["num_key_value_heads"]
    d = target_preset_cfg.get("head_dim") or h // heads
    inter = target_preset_cfg["intermediate_size"]
    g = torch.Generator(device=device).manual_seed(0)

    def rnd(*shape):
        return (torch.rand(*shape, generator=g, device=device) * 2e-3 - 1e-3).to(torch.bfloat16)

    t = {
        "midlayer.input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        "midlayer.hidden_norm.weight": torch.ones(h, dtype=torch.bfloat16),
        "midlayer.post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        "midlayer.self_attn.q_proj.weight": rnd(heads * d, 2 * h),
        "midlayer.self_attn.k_proj.weight": rnd(kv * d, 2 * h),
        "midlayer.self_attn.v_proj.weight": rnd(kv * d, 2 * h),
        "midlayer.self_attn.o_proj.weight": rnd(h, heads * d),
        "midlayer.mlp.gate_proj.weight": rnd(inter, h),
        "midlayer.mlp.up_proj.weight": rnd(inter, h),
        "midlayer.mlp.down_proj.weight": rnd(h, inter),
        "fc.weight": rnd(h, 3 * h), "norm.weight": torch.ones(h, dtype=torch.bfloat16),
        "lm_head.weight": rnd(draft_vocab, h),
        "d2t": torch.zeros(draft_vocab, dtype=torch.int64),
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous().cpu() for k, v in t.items()}, str(out / "model.safetensors"))
    cfg = {k: target_preset_cfg[k] for k in ("hidden_size", "num_attention_heads",
                                             "num_key_value_heads", "intermediate_size",
                                             "rms_norm_eps", "vocab_size",
                                             "max_position_embeddings") if k in target_preset_cfg}
    cfg.update(architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1, head_dim=d,
               draft_vocab_size=draft_vocab, tie_word_embeddings=False,
               rope_theta=target_preset_cfg.get("rope_theta", 500000.0),
               rope_scaling=target_preset_cfg.get("rope_scaling"))
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def measure(llm, k: int, context: int, steps: int) -> dict:
    from gearshift.policy.static import AlwaysPolicy, OffPolicy

    eng = llm.engine
    vocab = eng.model_config.vocab_size
    prompt = torch.randint(10, vocab, (context,), generator=torch.Generator().manual_seed(0))
    draft_ms: list[float] = []
    prop = eng.spec.proposer
    orig_step = prop._step

    def timed_step(ids, hidden, fb):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        out = orig_step(ids, hidden, fb)
        b.record()
        b.synchronize()
        draft_ms.append(a.elapsed_time(b))
        return out

    prop._step = timed_step
    result = {}
    for name, policy in (("decode", OffPolicy()), ("verify", AlwaysPolicy(k))):
        eng.scheduler.policy = policy
        eng.add_request(name, prompt.tolist(), SamplingParams(max_tokens=steps, ignore_eos=True,
                                                              temperature=0.0))
        times = []
        while eng.has_unfinished_requests():
            eng.step()
            mode = eng.last_step.get("mode")
            if mode == ("decode" if name == "decode" else "verify"):
                times.append(eng.runner.last_device_ms())
        result[f"{name}_ms_median"] = statistics.median(times[2:] or times)
        result[f"{name}_steps"] = len(times)
    result["draft_step_ms_median"] = statistics.median(draft_ms) if draft_ms else None
    result["verify_over_decode"] = result["verify_ms_median"] / result["decode_ms_median"]
    if draft_ms:
        result["draft_step_over_decode"] = result["draft_step_ms_median"] / result["decode_ms_median"]
    result["spec_stats"] = eng.spec_stats()
    return result


def run(args) -> int:
    from gearshift import LLM
    from gearshift.bench.offline import environment
    from gearshift.models.loader import PRESETS_DIR

    cfg = json.loads((PRESETS_DIR / f"{args.preset}.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        head = args.draft_model or str(write_dummy_head(cfg, Path(tmp) / "head", args.draft_vocab,
                                                        "cuda"))
        llm = LLM(args.preset, load_format="dummy", speculative_algorithm="eagle3",
                  draft_model=head, num_draft_tokens=args.k, spec_policy="off",
                  max_num_seqs=args.max_num_seqs)
        result = measure(llm, args.k, args.context, args.steps)
    result.update(k=args.k, context=args.context, env=environment(llm))
    print(json.dumps({k: v for k, v in result.items() if k != "env"}, indent=1))
    with open(args.output_json, "w") as f:
        json.dump(result, f, indent=1)
    return 0


def add_args(p) -> None:
    p.add_argument("--preset", default="llama-3.1-8b")
    p.add_argument("--draft-model", default=None, help="EAGLE-3 head (default: dummy weights)")
    p.add_argument("--draft-vocab", type=int, default=32000)
    p.add_argument("--k", type=int, default=4, help="draft tokens: verify covers k+1")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--output-json", default="bench_spec_costs.json")


if __name__ == "__main__":
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="gearshift bench spec-costs")
    add_args(parser)
    sys.exit(run(parser.parse_args()))
