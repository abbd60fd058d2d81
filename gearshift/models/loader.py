"""Build a model from a Hugging Face directory (config.json + safetensors, single file or
sharded with an index) or from a config alone with dummy weights. Safetensors only:
pickled checkpoints are refused, never opened.

Data flow: Engine -> load_model(config) -> LlamaForCausalLM on the target device/dtype.
HF tensor names map onto our fused parameters (q/k/v -> qkv_proj, gate/up -> gate_up_proj).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

from gearshift.config import ConfigError, ModelConfig
from gearshift.models.llama import LlamaForCausalLM
from gearshift.progress import progress

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PRESETS_DIR = Path(__file__).resolve().parent.parent / "presets"


def resolve_model_config(model: str) -> tuple[ModelConfig, Path | None]:
    """A model directory, or a preset name / preset json (for dummy weights)."""
    path = Path(model)
    if path.is_dir():
        return ModelConfig.from_dir(path), path
    preset = PRESETS_DIR / f"{model}.json"
    if path.suffix == ".json" and path.is_file():
        preset = path
    if preset.is_file():
        return ModelConfig.from_dict(json.loads(preset.read_text())), None
    names = sorted(p.stem for p in PRESETS_DIR.glob("*.json"))
    raise ConfigError(f"model {model!r} is neither a directory nor a preset (presets: {names})")


def _param_targets(cfg: ModelConfig) -> dict[str, tuple[str, int, int]]:
    """HF tensor name -> (our parameter name, row offset, row count) for every tensor we need."""
    q, kv, inter = cfg.q_size, cfg.kv_size, cfg.intermediate_size
    out: dict[str, tuple[str, int, int]] = {
        "model.embed_tokens.weight": ("embed_tokens.weight", 0, cfg.vocab_size),
        "model.norm.weight": ("norm.weight", 0, cfg.hidden_size),
    }
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = ("lm_head.weight", 0, cfg.vocab_size)
    for i in range(cfg.num_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        fused = {"q_proj": (0, q), "k_proj": (q, kv), "v_proj": (q + kv, kv)}
        kinds = ["weight", "bias"] if cfg.attention_bias else ["weight"]
        for name, (off, n) in fused.items():
            for kind in kinds:
                out[f"{hf}self_attn.{name}.{kind}"] = (f"{ours}self_attn.qkv_proj.{kind}", off, n)
        out[f"{hf}self_attn.o_proj.weight"] = (f"{ours}self_attn.o_proj.weight", 0, cfg.hidden_size)
        out[f"{hf}mlp.gate_proj.weight"] = (f"{ours}mlp.gate_up_proj.weight", 0, inter)
        out[f"{hf}mlp.up_proj.weight"] = (f"{ours}mlp.gate_up_proj.weight", inter, inter)
        out[f"{hf}mlp.down_proj.weight"] = (f"{ours}mlp.down_proj.weight", 0, cfg.hidden_size)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out[f"{hf}{norm}.weight"] = (f"{ours}{norm}.weight", 0, cfg.hidden_size)
        if cfg.qk_norm:
            for norm in ("q_norm", "k_norm"):
                out[f"{hf}self_attn.{norm}.weight"] = (f"{ours}self_attn.{norm}.weight", 0, cfg.head_dim)
    return out


def safetensors_files(path: Path) -> dict[str, Path]:
    """Tensor name -> file, from model.safetensors.index.json or the single file(s)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map") or {}
        absent = sorted({f for f in weight_map.values() if not (path / f).is_file()})
        if absent:
            raise ConfigError(f"shard file(s) {absent} listed in {index.name} are missing from {str(path)!r}")
        return {name: path / fname for name, fname in weight_map.items()}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        pickled = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt")]
        hint = f" (found {pickled}: pickled checkpoints are not loaded)" if pickled else ""
        raise ConfigError(f"no .safetensors weights in {str(path)!r}{hint}")
    out: dict[str, Path] = {}
    for f in files:
        with safe_open(f, framework="pt") as st:
            out.update({name: f for name in st.keys()})
    return out


def load_model(cfg: ModelConfig, path: Path | None, *, dtype: str, device: str,
               max_positions: int, seed: int = 0) -> LlamaForCausalLM:
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg, max_positions)
    model = model.to(DTYPES[dtype]).to_empty(device=device)
    if cfg.tie_word_embeddings:  # to_empty gave lm_head its own storage: share it again
        model.lm_head.weight = model.embed_tokens.weight
    model.rotary.init_cache(device)
    if path is None:
        _fill_dummy(model, seed)
    else:
        _load_safetensors(model, cfg, path)
    return model.eval().requires_grad_(False)


def _fill_dummy(model: torch.nn.Module, seed: int) -> None:
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if re.search(r"norm\.weight$", name):
            p.data.fill_(1.0)
        else:  # small uniform values, as vLLM's dummy loader does
            p.data.uniform_(-1e-3, 1e-3, generator=gen)


def _load_safetensors(model: torch.nn.Module, cfg: ModelConfig, path: Path) -> None:
    targets = _param_targets(cfg)
    files = safetensors_files(path)
    missing = [n for n in targets if n not in files]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ConfigError(f"checkpoint {str(path)!r} is missing tensor(s) {missing[:3]}{more}")
    params = dict(model.named_parameters())
    by_file: dict[Path, list[str]] = {}
    for name in targets:
        by_file.setdefault(files[name], []).append(name)
    bar = progress(desc="loading weights", total=len(targets), unit="tensor")
    for f, names in by_file.items():
        with safe_open(f, framework="pt") as st:
            for name in names:
                bar.update(1)
                ours, off, rows = targets[name]
                dest = params[ours].data.narrow(0, off, rows)
                src = st.get_tensor(name)
                if tuple(src.shape) != tuple(dest.shape):
                    raise ConfigError(
                        f"tensor {name!r} in {f.name} has shape {tuple(src.shape)}, "
                        f"expected {tuple(dest.shape)} from config.json"
                    )
                dest.copy_(src)
    bar.close()
