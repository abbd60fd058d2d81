"""Tiny random EAGLE-3 draft heads in the public checkpoint layout (as SpecForge / the
EAGLE authors save them, and SGLang / vLLM load them), for tests.

Data flow (tests only): make_eagle3_checkpoint -> draft dir (config.json, model.safetensors)
-> gearshift.models.eagle3_loader.load_eagle3 (next to a target from tests/checkpoints.py).

The draft vocabulary is a sorted random subset of the target's ids (always containing the
special ids 0..2), stored as `d2t` offsets: target id = draft id + d2t[draft id]; `t2d` is
the matching boolean mask over the target vocabulary. `drop`, `tensors` and
`config_overrides` build malformed checkpoints for the loader's error tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from checkpoints import VOCAB_SIZE
from safetensors.torch import save_file

EAGLE3_SHAPE = dict(
    hidden_size=64,  # = the tiny targets' hidden size (tests/checkpoints.py)
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)
DRAFT_VOCAB_SIZE = 160


def draft_vocab_ids(vocab_size: int, draft_vocab_size: int, seed: int = 0) -> torch.Tensor:
    """The target ids the draft vocabulary covers, ascending: [draft_vocab_size] int64."""
    gen = torch.Generator().manual_seed(seed)
    rest = torch.randperm(vocab_size - 3, generator=gen)[: draft_vocab_size - 3] + 3
    return torch.cat([torch.arange(3), rest.sort().values])


def eagle3_tensors(shape: dict, vocab_size: int, draft_vocab_size: int, *, with_embed: bool,
                   target_hidden_size: int | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor of a public-layout checkpoint, random (norms near 1), fp32."""
    h, inter = shape["hidden_size"], shape["intermediate_size"]
    hq, hkv, d = shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"]
    th = target_hidden_size or h
    gen = torch.Generator().manual_seed(seed)

    def rand(*dims: int, std: float = 0.2) -> torch.Tensor:
        return std * torch.randn(dims, generator=gen)

    m = "midlayer."
    t = {
        f"{m}input_layernorm.weight": 1.0 + rand(h, std=0.1),
        f"{m}hidden_norm.weight": 1.0 + rand(h, std=0.1),
        f"{m}post_attention_layernorm.weight": 1.0 + rand(h, std=0.1),
        f"{m}self_attn.q_proj.weight": rand(hq * d, 2 * h),
        f"{m}self_attn.k_proj.weight": rand(hkv * d, 2 * h),
        f"{m}self_attn.v_proj.weight": rand(hkv * d, 2 * h),
        f"{m}self_attn.o_proj.weight": rand(h, hq * d),
        f"{m}mlp.gate_proj.weight": rand(inter, h),
        f"{m}mlp.up_proj.weight": rand(inter, h),
        f"{m}mlp.down_proj.weight": rand(h, inter),
        "fc.weight": rand(h, 3 * th, std=0.1),
        "norm.weight": 1.0 + rand(h, std=0.1),
        "lm_head.weight": rand(draft_vocab_size, h, std=0.5),
    }
    ids = draft_vocab_ids(vocab_size, draft_vocab_size, seed)
    t["d2t"] = ids - torch.arange(draft_vocab_size)  # int64 offsets
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    t["t2d"] = t2d
    if with_embed:
        t["embed_tokens.weight"] = rand(vocab_size, h, std=0.5)
    return t


def make_eagle3_checkpoint(
    path: str | Path,
    *,
    vocab_size: int = VOCAB_SIZE,
    draft_vocab_size: int = DRAFT_VOCAB_SIZE,
    aux_layer_ids: list[int] | None = None,
    with_embed: bool = False,
    target_hidden_size: int | None = None,
    rope_theta: float = 10000.0,
    rope_scaling: dict | None = None,
    seed: int = 0,
    drop: tuple[str, ...] = (),
    tensors: dict[str, torch.Tensor] | None = None,
    config_overrides: dict | None = None,
    **shape_overrides,
) -> Path:
    """Write a tiny random EAGLE-3 head to `path`; return `path`.

    `aux_layer_ids` goes to eagle_config.eagle_aux_hidden_state_layer_ids (None: omitted,
    the loader's default applies). `drop` omits tensors, `tensors` replaces or adds some,
    `config_overrides` patches config.json (a value of None deletes the key).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    shape = {**EAGLE3_SHAPE, **shape_overrides}
    cfg: dict = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        **shape,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": rope_theta,
        "max_position_embeddings": 512,
        "vocab_size": vocab_size,
        "draft_vocab_size": draft_vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    if target_hidden_size is not None:
        cfg["target_hidden_size"] = target_hidden_size
    if rope_scaling is not None:
        cfg["rope_scaling"] = rope_scaling
    if aux_layer_ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_layer_ids)}
    for key, value in (config_overrides or {}).items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg, indent=2))

    t = eagle3_tensors(shape, vocab_size, draft_vocab_size, with_embed=with_embed,
                       target_hidden_size=target_hidden_size, seed=seed)
    t.update(tensors or {})
    t = {name: v.contiguous() for name, v in t.items() if name not in drop}
    save_file(t, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path
