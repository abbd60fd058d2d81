"""Widening an EAGLE-3 head with its target (gearshift/train/widen_eagle3.py): on the widened
target's features the big head computes the small head's function, and the big pair has
the small pair's tokens and acceptance in the real engine.

Data flow (tests only): tests/checkpoints.py target (hidden 64, 4 layers) + a head from
tests/eagle3_checkpoints.py -> widen.make_bench_model (hidden 128, 8q/4kv heads, 6 layers,
vocab +50) + widen_eagle3.make_bench_head -> HF features into a plain-torch head reference
(draft logits), and gearshift.LLM with speculation (tokens, accepted / proposed counts).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from checkpoints import load_hf_model, make_tiny_checkpoint, random_prompts
from eagle3_checkpoints import make_eagle3_checkpoint
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from gearshift import SamplingParams
from gearshift.train import widen, widen_eagle3

AUX = [2, 0, 1]  # HF's last hidden_states entry is after the final norm: not N - 1 here
AUX_ENGINE = [0, 1, 3]  # the engine captures pre-norm outputs, the last real layer too
BIG = dict(hidden_size=128, intermediate_size=192, num_hidden_layers=6, num_attention_heads=8,
           num_key_value_heads=4, vocab_size=512 + 50)
VD = 160  # the random heads' draft vocabulary (tests/eagle3_checkpoints.py default)


def _widen_target(src: Path, out: Path, **overrides) -> Path:
    shape = {**json.loads((src / "config.json").read_text()), **BIG, **overrides}
    (out.parent / f"{out.name}.shape.json").write_text(json.dumps(shape))
    return widen.make_bench_model(src, str(out.parent / f"{out.name}.shape.json"), out,
                                  dtype=torch.float32)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("widen_e3")
    small = make_tiny_checkpoint(root / "t", "llama", num_hidden_layers=4, with_tokenizer=False)
    return {"root": root, "small": small, "big": _widen_target(small, root / "bt"),
            "big_same_vocab": _widen_target(small, root / "bt_v", vocab_size=512)}


# ---- a plain-torch reference of the head over one sequence (SGLang's formula) ------------

def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rot(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def head_ref(head_dir: Path, embed: torch.Tensor, ids: torch.Tensor,
             hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [L]; hidden: target features [L, 3*H_t] or a previous prenorm [L, H]
    -> (prenorm [L, H], draft logits [L, draft_vocab])."""
    cfg = json.loads((head_dir / "config.json").read_text())
    w = load_file(str(head_dir / "model.safetensors"))
    m, eps, n = "midlayer.", cfg["rms_norm_eps"], ids.shape[0]
    hq, hkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    if hidden.shape[-1] != cfg["hidden_size"]:
        hidden = hidden @ w["fc.weight"].T  # [L, H]
    x = torch.cat([_rms(w.get("embed_tokens.weight", embed)[ids], w[f"{m}input_layernorm.weight"],
                        eps), _rms(hidden, w[f"{m}hidden_norm.weight"], eps)], dim=-1)
    proj = lambda p, heads: (x @ w[f"{m}self_attn.{p}_proj.weight"].T).view(n, heads, hd)
    q, k, v = (proj("q", hq).transpose(0, 1), proj("k", hkv).transpose(0, 1),
               proj("v", hkv).transpose(0, 1))  # [heads, L, hd]
    rope = LlamaConfig(hidden_size=cfg["hidden_size"], num_attention_heads=hq, head_dim=hd,
                       rope_theta=cfg["rope_theta"],
                       max_position_embeddings=cfg["max_position_embeddings"])
    cos, sin = LlamaRotaryEmbedding(rope)(x[None], torch.arange(n)[None])  # [1, L, hd]
    q, k = q * cos + _rot(q) * sin, k * cos + _rot(k) * sin
    k, v = k.repeat_interleave(hq // hkv, 0), v.repeat_interleave(hq // hkv, 0)
    scores = (q @ k.transpose(-1, -2) / hd**0.5).masked_fill(
        ~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))  # [Hq, L, L]
    o = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, hq * hd)
    residual = o @ w[f"{m}self_attn.o_proj.weight"].T + hidden
    y = _rms(residual, w[f"{m}post_attention_layernorm.weight"], eps)
    gate, up = y @ w[f"{m}mlp.gate_proj.weight"].T, y @ w[f"{m}mlp.up_proj.weight"].T
    prenorm = (torch.nn.functional.silu(gate) * up) @ w[f"{m}mlp.down_proj.weight"].T + residual
    return prenorm, _rms(prenorm, w["norm.weight"], eps) @ w["lm_head.weight"].T


def _features(target_dir: Path, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the target's input embedding table, aux features [L, 3*H]: id i = hidden_states[i+1])."""
    model = load_hf_model(target_dir)
    with torch.no_grad():
        hs = model(input_ids=ids[None], output_hidden_states=True).hidden_states
    return model.model.embed_tokens.weight.detach(), torch.cat([hs[i + 1][0] for i in AUX], -1)


@pytest.mark.parametrize("own_embed,pad_vd,big", [
    (False, 0, "big"), (False, 40, "big"), (True, 0, "big"), (True, 40, "big"),
    (False, 0, "big_same_vocab"),  # no target vocab padding: no constant channel anywhere
])
def test_widened_head_computes_small_heads_function(pair, own_embed: bool, pad_vd: int,
                                                    big: str) -> None:
    root = pair["root"] / f"e{int(own_embed)}_{pad_vd}_{big}"
    head = make_eagle3_checkpoint(root / "h", aux_layer_ids=AUX, with_embed=own_embed, seed=4)
    big_head = widen_eagle3.make_bench_head(head, pair[big], root / "bh", dtype=torch.float32,
                                            draft_vocab_size=VD + pad_vd if pad_vd else None)
    ids = torch.tensor(random_prompts([40], seed=5)[0])
    runs = []
    for target, h in ((pair["small"], head), (pair[big], big_head)):
        embed, feats = _features(target, ids)
        pre1, logits1 = head_ref(h, embed, ids[1:], feats[:-1])  # row t: token t+1, feature t
        d2t = load_file(str(h / "model.safetensors"))["d2t"]
        draft = logits1.argmax(-1)
        pre2, logits2 = head_ref(h, embed, draft + d2t[draft], pre1)  # a second draft step
        runs.append((pre1, logits1, logits2))
    (p_s, l1_s, l2_s), (p_b, l1_b, l2_b) = runs
    cfg = json.loads((big_head / "config.json").read_text())
    beta = cfg["gearshift_widened"]["constant"]
    assert (beta > 0) == (big == "big")
    assert cfg["draft_vocab_size"] == VD + pad_vd and cfg["hidden_size"] == 128
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == AUX
    assert (p_b[:, :64] - p_s).abs().max().item() <= 1e-3  # the real residual stream
    if beta > 0:
        assert torch.all(p_b[:, 64] == beta)  # the constant channel: exactly beta, every step
    assert p_b[:, 64 + (beta > 0):].abs().max().item() < 1e-4  # added channels: tiny
    for small, big in ((l1_s, l1_b), (l2_s, l2_b)):
        assert small.std().item() > 1.0  # draft logits far from flat: the check is meaningful
        assert (big[:, :VD] - small).abs().max().item() <= 1e-3
        assert torch.equal(big.argmax(-1), small.argmax(-1))
        if pad_vd:
            assert (big[:, VD:].max(-1).values < small.min(-1).values - 100).all()


def test_added_parts_cost_full_price(pair) -> None:
    head = make_eagle3_checkpoint(pair["root"] / "hc", aux_layer_ids=AUX)
    small_cfg = json.loads((head / "config.json").read_text())
    big_cfg = json.loads((pair["big"] / "config.json").read_text())
    cfg, t = widen_eagle3.widen_eagle3(small_cfg, load_file(str(head / "model.safetensors")),
                                       big_cfg, seed=1)
    assert t["fc.weight"].shape == (128, 3 * 128) and "embed_tokens.weight" not in t
    q = t["midlayer.self_attn.q_proj.weight"]  # [8 heads * 16, 2 * 128]
    assert q.shape == (128, 256) and 0.01 < q[64:].std() < 0.03  # added heads read everything
    o = t["midlayer.self_attn.o_proj.weight"]
    assert (o[65:] != 0).float().mean() > 0.9 and o[65:].abs().max() < 1e-5
    assert torch.all(o[64] == 0) and torch.all(t["midlayer.mlp.down_proj.weight"][64] == 0)
    a = big_cfg["gearshift_widened"]["constant"]
    assert t["fc.weight"][64].count_nonzero() == 1 and t["fc.weight"][64, 64] == 1.0  # beta=a
    assert torch.all(t["fc.weight"][:, [64, 192, 320]][:64] == 0)  # a never reaches real rows
    eps_small = small_cfg["rms_norm_eps"]
    assert cfg["rms_norm_eps"] == pytest.approx((64 * eps_small - a * a) / 128)
    with pytest.raises(ValueError, match="eps"):  # a shared embedding's a^2 needs room in eps
        widen_eagle3.widen_eagle3({**small_cfg, "rms_norm_eps": 1e-8},
                                  load_file(str(head / "model.safetensors")), big_cfg)


@pytest.mark.parametrize("own_embed", [False, True])
def test_norms_exact_where_eps_matters(pair, own_embed: bool) -> None:
    """Vectors so small that eps is half of the RMS: every head norm of the big head, on a
    vector in its layout (real channels, beta in channel 64, tiny elsewhere), gives the small
    norm's values exactly (beta^2 cancelled in eps_big, weights scaled by sqrt(h/H))."""
    head = make_eagle3_checkpoint(pair["root"] / f"hn{int(own_embed)}", aux_layer_ids=AUX,
                                  with_embed=own_embed, config_overrides={"rms_norm_eps": 1e-3})
    small_cfg = json.loads((head / "config.json").read_text())
    small_sd = load_file(str(head / "model.safetensors"))
    cfg, t = widen_eagle3.widen_eagle3(small_cfg, small_sd,
                                       json.loads((pair["big"] / "config.json").read_text()))
    beta, eps = cfg["gearshift_widened"]["constant"], small_cfg["rms_norm_eps"]
    assert beta**2 == pytest.approx(64 * eps / 2 if own_embed else 64 * 1e-6 / 2)  # own, or a
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(0)) * eps**0.5  # [16, h]
    x_big = torch.cat([x, torch.full((16, 1), beta), 1e-7 * torch.randn(16, 63)], 1)  # [16, H]
    for name in [n for n in t if n.endswith("norm.weight")]:
        want = _rms(x, small_sd[name], eps)
        got = _rms(x_big, t[name], cfg["rms_norm_eps"])[:, :64]
        assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item(), name
        for wrong in (eps, 64 * eps / 128) if own_embed else (eps,):  # eps (or beta) unhandled
            assert (_rms(x_big, t[name], wrong)[:, :64] - want).abs().max() > 1e-2 * want.abs().max()

def _near_bigram_pair(pair: dict) -> tuple[Path, Path]:
    """A target whose layers only nudge a bigram model, and a hand-built head that copies
    the next token's embedding through self-attending heads into the target's own output
    layer: random weights would accept ~nothing, this pair accepts ~25% of the drafts."""
    root = pair["root"] / "bigram"
    target = root / "t"
    shutil.copytree(pair["small"], target)
    sd = load_file(str(target / "model.safetensors"))
    for k in sd:
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            sd[k] = sd[k] * 0.01
    save_file(sd, str(target / "model.safetensors"), metadata={"format": "pt"})
    gen = torch.Generator().manual_seed(5)
    noise = lambda *s, std=0.02: std * torch.randn(s, generator=gen)
    eye_emb = torch.cat([torch.eye(64), torch.zeros(64, 64)], 1)  # reads the embedding half
    tensors = {
        "midlayer.self_attn.q_proj.weight": 4.0 * eye_emb + noise(64, 128),
        "midlayer.self_attn.k_proj.weight": eye_emb + noise(64, 128),
        "midlayer.self_attn.v_proj.weight": eye_emb + noise(64, 128),
        "midlayer.self_attn.o_proj.weight": 4.0 * torch.eye(64) + noise(64, 64),
        "midlayer.mlp.down_proj.weight": noise(64, 96, std=0.01),
        "fc.weight": noise(64, 192),
        "norm.weight": sd["model.norm.weight"].clone(),
        "lm_head.weight": sd["lm_head.weight"][:500].clone(),
        "d2t": torch.zeros(500, dtype=torch.int64),
    }
    head = make_eagle3_checkpoint(root / "h", aux_layer_ids=AUX_ENGINE, num_key_value_heads=4,
                                  draft_vocab_size=500, tensors=tensors, drop=("t2d",))
    return target, head


def test_engine_big_pair_keeps_tokens_and_acceptance(pair, make_llm) -> None:
    small_t, small_h = _near_bigram_pair(pair)
    big_t = _widen_target(small_t, small_t.parent / "bt")
    big_h = widen_eagle3.make_bench_head(small_h, big_t, small_t.parent / "bh",
                                         dtype=torch.float32, draft_vocab_size=540)
    prompts = random_prompts([5, 17, 30, 11], seed=7)
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    spec = dict(speculative_algorithm="eagle3", num_draft_tokens=3, spec_policy="always")
    runs = []
    for target, head in ((small_t, small_h), (big_t, big_h)):
        llm = make_llm(target, draft_model=str(head), **spec)
        outs = llm.generate(prompts, greedy)
        stats = llm.engine.spec_stats()
        runs.append(([o.token_ids for o in outs], stats["accepted"], stats["proposed"],
                     stats["accept_len_hist"]))
    (tok_s, acc_s, prop_s, hist_s), (tok_b, acc_b, prop_b, hist_b) = runs
    assert tok_b == tok_s
    assert (acc_b, prop_b) == (acc_s, prop_s) and hist_b == hist_s
    assert 0.15 < acc_s / prop_s < 0.9  # real, partial acceptance: its equality means something
    plain = make_llm(big_t).generate(prompts, greedy)
    assert [o.token_ids for o in plain] == tok_s  # speculation stays lossless on the big pair


def test_cli_widens_target_and_head(pair) -> None:
    from gearshift.cli import main
    from gearshift.config import ModelConfig
    from gearshift.models.eagle3_loader import load_eagle3
    from gearshift.models.loader import load_model

    root = pair["root"] / "cli"
    head = make_eagle3_checkpoint(root / "h", aux_layer_ids=AUX)
    shape = root / "shape.json"
    shape.write_text(json.dumps({**json.loads((pair["small"] / "config.json").read_text()), **BIG}))
    argv = ["make-bench-model", "--shape", str(shape), "--out", str(root / "bt"), "--src",
            str(pair["small"]), "--dtype", "bfloat16", "--head", str(head), "--head-out",
            str(root / "bh"), "--head-draft-vocab", "200"]
    assert main(argv) == 0
    cfg = ModelConfig.from_dir(root / "bt")
    target = load_model(cfg, root / "bt", dtype="bfloat16", device="cpu", max_positions=64)
    big_head = load_eagle3(root / "bh", cfg, dtype="bfloat16", device="cpu", max_positions=64,
                           target_embed=target.embed_tokens)
    assert big_head.config.draft_vocab_size == 200 and big_head.config.hidden_size == 128
    assert big_head.config.aux_layer_ids(cfg.num_layers) == AUX
    assert big_head.embed_tokens is target.embed_tokens  # shared, as in the small head
    assert big_head.lm_head.weight.dtype == torch.bfloat16
