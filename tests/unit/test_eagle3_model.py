"""EAGLE-3 draft head: loading the public checkpoint layout, forward + logits against an
independent plain-torch implementation of SGLang's formula, and the loader's errors.

Data flow (tests only): tests/eagle3_checkpoints.py -> draft dir -> load_eagle3 (next to a
tiny target from tests/checkpoints.py) -> Eagle3Head over a hand-built slot KV cache with
the torch attention backend  vs  reference() below (full causal attention, HF RoPE).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from checkpoints import slot_batch
from eagle3_checkpoints import DRAFT_VOCAB_SIZE, draft_vocab_ids, make_eagle3_checkpoint
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from gearshift.attention.base import KVCache
from gearshift.attention.torch_backend import TorchBackend
from gearshift.config import ConfigError, ModelConfig
from gearshift.forward_batch import ForwardBatch, ForwardMode
from gearshift.models.eagle3 import Eagle3Head
from gearshift.models.eagle3_loader import Eagle3Config, load_eagle3
from gearshift.models.llama import LlamaForCausalLM
from gearshift.models.loader import load_model

MAX_LEN = 32  # per request row of the hand-built req_to_token table
AUX = [0, 1, 1]  # the tiny targets have 2 layers: the default ids would not fit


@pytest.fixture(scope="module")
def target(tiny_llama_dir: Path) -> tuple[ModelConfig, LlamaForCausalLM]:
    cfg = ModelConfig.from_dir(tiny_llama_dir)
    model = load_model(cfg, tiny_llama_dir, dtype="float32", device="cpu", max_positions=256)
    return cfg, model


def _load(path: Path, target: tuple[ModelConfig, LlamaForCausalLM], **kwargs) -> Eagle3Head:
    cfg, model = target
    opts = dict(dtype="float32", device="cpu", max_positions=256, target_embed=model.embed_tokens)
    return load_eagle3(path, cfg, **{**opts, **kwargs})


# ---- an independent reference: SGLang's llama_eagle3 formula over one whole sequence ------

def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def reference(draft_dir: Path, embed: torch.Tensor, ids: torch.Tensor,
              hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ids: [L] of one sequence at positions 0..L-1; hidden: [L, H] (fc already applied to
    target features) -> (prenorm [L, H], logits [L, draft_vocab])."""
    cfg = json.loads((draft_dir / "config.json").read_text())
    w = load_file(str(draft_dir / "model.safetensors"))
    m, eps = "midlayer.", cfg["rms_norm_eps"]
    hq, hkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    n = ids.shape[0]
    embeds = w.get("embed_tokens.weight", embed)[ids]  # [L, H]
    normed = _rms(hidden, w[f"{m}hidden_norm.weight"], eps)
    residual = normed if cfg.get("norm_before_residual") else hidden
    x = torch.cat([_rms(embeds, w[f"{m}input_layernorm.weight"], eps), normed], dim=-1)
    q = (x @ w[f"{m}self_attn.q_proj.weight"].T).view(n, hq, d).transpose(0, 1)  # [Hq, L, D]
    k = (x @ w[f"{m}self_attn.k_proj.weight"].T).view(n, hkv, d).transpose(0, 1)
    v = (x @ w[f"{m}self_attn.v_proj.weight"].T).view(n, hkv, d).transpose(0, 1)
    rope_cfg = LlamaConfig(
        hidden_size=cfg["hidden_size"], num_attention_heads=hq, head_dim=d,
        rope_theta=cfg["rope_theta"], rope_scaling=cfg.get("rope_scaling"),
        max_position_embeddings=cfg["max_position_embeddings"],
    )
    cos, sin = LlamaRotaryEmbedding(rope_cfg)(x[None], torch.arange(n)[None])  # [1, L, D]
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    k, v = k.repeat_interleave(hq // hkv, dim=0), v.repeat_interleave(hq // hkv, dim=0)
    scores = q @ k.transpose(-1, -2) / d**0.5  # [Hq, L, L]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    o = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v  # [Hq, L, D]
    o = o.transpose(0, 1).reshape(n, hq * d) @ w[f"{m}self_attn.o_proj.weight"].T
    residual = o + residual
    x = _rms(residual, w[f"{m}post_attention_layernorm.weight"], eps)
    gate, up = x @ w[f"{m}mlp.gate_proj.weight"].T, x @ w[f"{m}mlp.up_proj.weight"].T
    prenorm = (torch.nn.functional.silu(gate) * up) @ w[f"{m}mlp.down_proj.weight"].T + residual
    logits = _rms(prenorm, w["norm.weight"], eps) @ w["lm_head.weight"].T
    return prenorm, logits


# ---- a hand-built slot KV cache: request row r, position p -> slot 1 + (r-1)*MAX_LEN + p ---

def make_batch(kv: KVCache, mode: ForwardMode,
                  chunks: list[tuple[int, int, list[int]]]) -> ForwardBatch:
    """chunks: (req_to_token row, prefix length, new token ids) per request."""
    return slot_batch(kv, mode, chunks, lambda r, p: 1 + (r - 1) * MAX_LEN + p)


VARIANTS = {
    "shared_embed": dict(),
    "own_embed_llama3_rope": dict(
        with_embed=True, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    ),
    # a draft narrower than the target (fc: 3*64 -> 32), vLLM's norm_before_residual
    "narrow_norm_before_residual": dict(
        with_embed=True, hidden_size=32, intermediate_size=48, num_attention_heads=2,
        num_key_value_heads=1, target_hidden_size=64,
        config_overrides={"norm_before_residual": True},
    ),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@torch.no_grad()
def test_forward_and_logits_match_reference(variant: str, tmp_path: Path, target) -> None:
    draft_dir = make_eagle3_checkpoint(tmp_path, aux_layer_ids=AUX, **VARIANTS[variant])
    head = _load(draft_dir, target)
    cfg = head.config
    kv = KVCache.allocate(1, 2 * MAX_LEN, cfg.num_kv_heads, cfg.head_dim, 2, MAX_LEN,
                          torch.float32, "cpu")
    attn = TorchBackend(kv, cfg.head_dim**-0.5)
    gen = torch.Generator().manual_seed(1)
    lens = [9, 6]
    toks = [torch.randint(3, cfg.vocab_size, (n + 1,), generator=gen).tolist() for n in lens]
    feats = [torch.randn(n, 3 * cfg.target_hidden_size, generator=gen) for n in lens]

    # two prefill chunks (the second over a cached prefix), target features [T, 3*H_t]
    outs: list[list[torch.Tensor]] = [[], []]
    for bounds in ([(0, 5), (0, 3)], [(5, 9), (3, 6)]):
        fb = make_batch(kv, ForwardMode.EXTEND,
                        [(r + 1, a, toks[r][a:b]) for r, (a, b) in enumerate(bounds)])
        hidden = torch.cat([feats[r][a:b] for r, (a, b) in enumerate(bounds)])
        prenorm = head(fb.input_ids, hidden, fb.positions, fb, attn)
        assert prenorm.shape == (fb.num_tokens, cfg.hidden_size)
        split = prenorm.split(fb.extend_lens_cpu)
        outs[0].append(split[0])
        outs[1].append(split[1])
    # a draft step: one token per request fed with its own previous prenorm [B, H] (no fc)
    last = torch.stack([outs[r][-1][-1] for r in range(2)])  # [2, H]
    fb = make_batch(kv, ForwardMode.DECODE, [(r + 1, lens[r], toks[r][-1:]) for r in range(2)])
    step = head(fb.input_ids, last, fb.positions, fb, attn)  # [2, H]

    embed = target[1].embed_tokens.weight
    fc = load_file(str(draft_dir / "model.safetensors"))["fc.weight"]
    for r in range(2):
        got = torch.cat([*outs[r], step[r:r + 1]])  # [L + 1, H]
        ref_hidden = torch.cat([feats[r] @ fc.T, last[r:r + 1]])
        ref_prenorm, ref_logits = reference(draft_dir, embed, torch.tensor(toks[r]), ref_hidden)
        logits = head.compute_logits(got)
        assert logits.dtype == torch.float32 and logits.shape == (lens[r] + 1, DRAFT_VOCAB_SIZE)
        assert (got - ref_prenorm).abs().max() <= 1e-4
        assert (logits - ref_logits).abs().max() <= 1e-4


def test_draft_to_target_and_embedding_sharing(tmp_path: Path, target) -> None:
    shared = _load(make_eagle3_checkpoint(tmp_path / "a", aux_layer_ids=AUX), target)
    own = _load(make_eagle3_checkpoint(tmp_path / "b", aux_layer_ids=AUX, with_embed=True), target)
    assert shared.embed_tokens is target[1].embed_tokens
    assert own.embed_tokens is not target[1].embed_tokens
    ids = draft_vocab_ids(target[0].vocab_size, DRAFT_VOCAB_SIZE)
    draft = torch.arange(DRAFT_VOCAB_SIZE, dtype=torch.int32)
    mapped = shared.draft_to_target(draft)
    assert mapped.dtype == torch.int64 and torch.equal(mapped, ids)
    assert torch.equal(shared.draft_to_target(draft.view(8, -1)), ids.view(8, -1))


def test_aux_layer_ids(tmp_path: Path, target) -> None:
    default = Eagle3Config.from_dir(make_eagle3_checkpoint(tmp_path / "d"))
    assert default.aux_layer_ids(32) == [1, 15, 28]  # outputs of layers 1, 15, 28
    assert default.aux_layer_ids(8) == [1, 3, 4]
    with pytest.raises(ConfigError, match=r"aux hidden-state layer ids \[1, 0, -2\]"):
        default.aux_layer_ids(2)
    with pytest.raises(ConfigError, match="aux hidden-state layer ids"):
        _load(tmp_path / "d", target)  # the 2-layer target cannot host the default
    given = Eagle3Config.from_dir(make_eagle3_checkpoint(tmp_path / "g", aux_layer_ids=[0, 1, 0]))
    assert given.aux_layer_ids(2) == [0, 1, 0]
    with pytest.raises(ConfigError, match="list of 3 ints"):
        Eagle3Config.from_dir(make_eagle3_checkpoint(tmp_path / "b", aux_layer_ids=[0, 1]))


MALFORMED = {
    "missing_fc": (dict(drop=("fc.weight",)), r"missing tensor\(s\) \['fc.weight'\]"),
    "missing_midlayer": (dict(drop=("midlayer.hidden_norm.weight",)), "midlayer.hidden_norm"),
    "missing_d2t": (dict(drop=("d2t",)), r"missing tensor\(s\) \['d2t'\]"),
    "d2t_length": (dict(tensors={"d2t": torch.zeros(100, dtype=torch.int64)}),
                   r"d2t has shape \(100,\), expected \(160,\)"),
    "d2t_out_of_vocab": (dict(tensors={"d2t": torch.full((160,), 400, dtype=torch.int64)}),
                         "d2t maps draft id 112 to target id 512, outside the target vocabulary"),
    "vocab_mismatch": (dict(vocab_size=500), "vocab_size 500 does not match the target's .*512"),
    "hidden_mismatch": (dict(hidden_size=32, with_embed=True),
                        "expects target hidden size 32, but the target has hidden_size 64"),
    "architecture": (dict(config_overrides={"architectures": ["LlamaForCausalLM"]}),
                     "not an EAGLE-3 head"),
    "two_layers": (dict(config_overrides={"num_hidden_layers": 2}), "num_hidden_layers=2"),
    "draft_vocab_too_big": (dict(config_overrides={"draft_vocab_size": 600}),
                            r"draft_vocab_size 600 must be in \[1, vocab_size=512\]"),
    "tensor_shape": (dict(config_overrides={"intermediate_size": 100}),
                     r"'midlayer.mlp.gate_proj.weight' has shape \(96, 64\), expected \(100, 64\)"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_checkpoints_name_the_problem(case: str, tmp_path: Path, target) -> None:
    kwargs, message = MALFORMED[case]
    path = make_eagle3_checkpoint(tmp_path, aux_layer_ids=AUX, **kwargs)
    with pytest.raises(ConfigError, match=message):
        _load(path, target)


def test_no_embedding_anywhere_and_pickled_weights(tmp_path: Path, target) -> None:
    path = make_eagle3_checkpoint(tmp_path / "a", aux_layer_ids=AUX)
    with pytest.raises(ConfigError, match="no embed_tokens.weight and no target embedding"):
        _load(path, target, target_embed=None)
    pickled = make_eagle3_checkpoint(tmp_path / "b", aux_layer_ids=AUX)
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    with pytest.raises(ConfigError, match="pickled checkpoints are not loaded"):
        _load(pickled, target)


def test_model_prefixed_tensor_names_load(tmp_path: Path, target) -> None:
    path = make_eagle3_checkpoint(tmp_path, aux_layer_ids=AUX)
    tensors = load_file(str(path / "model.safetensors"))
    save_file({f"model.{k}": v for k, v in tensors.items()}, str(path / "model.safetensors"))
    head = _load(path, target)
    assert torch.equal(head.fc.weight, tensors["fc.weight"])
    assert torch.equal(head.d2t, tensors["d2t"])
