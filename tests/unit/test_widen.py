"""Widening (gearshift/train/widen.py): the big model computes the small one's function.

A tiny random Llama (hidden 64, head_dim 32, 2 layers) is widened to hidden 128, 4 q / 2 kv
heads, 3 layers, vocab +50; HF transformers runs both in fp32 and must agree.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from gearshift.train import widen

SMALL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 256,
    "initializer_range": 0.02, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2,
}
BIG = {
    **SMALL, "vocab_size": 150, "hidden_size": 128, "intermediate_size": 160,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
}


def _small_model(tied: bool) -> tuple[dict, LlamaForCausalLM]:
    cfg = {**SMALL, "tie_word_embeddings": tied}
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).float().eval()
    with torch.no_grad():  # a peaked, non-trivial function: larger weights, uneven norms
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.5 * torch.rand_like(p))
            else:
                p.normal_(0.0, 0.15 if p.dim() == 2 and "embed" not in name else 0.5)
    return cfg, model


def _big_model(cfg: dict, sd: dict) -> LlamaForCausalLM:
    model = LlamaForCausalLM(LlamaConfig(**cfg)).float().eval()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected
    assert set(missing) <= ({"lm_head.weight"} if cfg.get("tie_word_embeddings") else set())
    model.tie_weights()
    return model


@pytest.mark.parametrize("small_tied,big_tied", [(True, False), (False, False), (True, True)])
def test_widened_model_matches_small(small_tied: bool, big_tied: bool) -> None:
    small_cfg, small = _small_model(small_tied)
    big_shape = {**BIG, "tie_word_embeddings": big_tied}
    big_cfg = widen.widen_config(small_cfg, big_shape)
    sd = widen.widen_state_dict(small_cfg, small.state_dict(), big_shape, seed=1)
    big = _big_model(big_cfg, sd)
    assert big_cfg["hidden_size"] == 128 and big_cfg["num_hidden_layers"] == 3
    assert big_cfg["rope_theta"] == SMALL["rope_theta"]  # the small model's RoPE is kept

    ids = torch.randint(3, SMALL["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = small(input_ids=ids).logits  # [2, 24, 100]
        out = big(input_ids=ids).logits  # [2, 24, 150]
    real, pad = out[..., : SMALL["vocab_size"]], out[..., SMALL["vocab_size"] :]
    if not big_tied:  # a tied embedding shifts all real logits of a position equally
        assert (real - ref).abs().max().item() <= 1e-3
    lp_ref = torch.log_softmax(ref, -1)
    lp_big = torch.log_softmax(out, -1)[..., : SMALL["vocab_size"]]
    assert (lp_big - lp_ref).abs().max().item() <= 1e-3
    assert (pad.max(-1).values < real.min(-1).values - 100).all()
    assert ref.std().item() > 1.0  # the check is meaningful: logits are far from flat

    prompt = ids[:, :8]
    kw = {"max_new_tokens": 16, "do_sample": False, "pad_token_id": 2}
    with torch.no_grad():
        want = small.generate(prompt, attention_mask=torch.ones_like(prompt), **kw)
        got = big.generate(prompt, attention_mask=torch.ones_like(prompt), **kw)
    assert want.shape[1] == 24
    assert torch.equal(got, want)


def test_added_parts_are_random_not_zero() -> None:
    small_cfg, small = _small_model(True)
    sd = widen.widen_state_dict(small_cfg, small.state_dict(), BIG, seed=0)
    o_added = sd["model.layers.2.self_attn.o_proj.weight"]  # an appended layer: [128, 128]
    assert (o_added != 0).float().mean() > 0.9 and o_added.abs().max() < 1e-5
    q_added = sd["model.layers.2.self_attn.q_proj.weight"]
    assert 0.01 < q_added.std() < 0.03  # full-size random inputs: the layer costs full price
    assert torch.all(o_added[64] == 0)  # nothing writes the constant channel


def test_head_placement_respects_gqa_groups() -> None:
    assert widen.head_placement(2, 1, 32, 8) == ([0, 1], [0] + [-1] * 7)
    q_slot, kv_src = widen.head_placement(4, 4, 32, 8)  # MHA small into GQA big
    assert q_slot == [0, 4, 8, 12] and kv_src[:4] == [0, 1, 2, 3]
    q_slot, kv_src = widen.head_placement(4, 1, 4, 4)  # one kv head copied into four groups
    assert q_slot == [0, 1, 2, 3] and kv_src == [0, 0, 0, 0]
    for h, slot in enumerate(q_slot):
        assert kv_src[slot // 1] == h // 4
    with pytest.raises(ValueError):
        widen.head_placement(8, 1, 4, 2)


def test_make_bench_model_writes_sharded_checkpoint(tmp_path) -> None:
    small_cfg, small = _small_model(True)
    src = tmp_path / "small"
    small.save_pretrained(src)
    (tmp_path / "shape.json").write_text(json.dumps(BIG))
    out = widen.make_bench_model(src, str(tmp_path / "shape.json"), tmp_path / "big",
                                 dtype=torch.float32, shard_gb=64 * 1024 / 2**30)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    big = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.arange(3, 20)[None]
    with torch.no_grad():
        diff = big(input_ids=ids).logits[..., :100] - small(input_ids=ids).logits
    assert diff.abs().max().item() <= 1e-3
    with pytest.raises(ValueError):
        widen.widen_config(BIG, SMALL)  # cannot shrink
