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
from gearshift.models.parallel import TensorParallel, shard_slices
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


Target = tuple[str, int, int, "tuple[int, slice, int] | None"]


def _param_targets(cfg: ModelConfig, tp: TensorParallel | None = None) -> dict[str, Target]:
    """HF tensor name -> (our parameter name, row offset, row count, the part read) for every
    tensor we need. The part: None = the whole tensor; under tensor parallelism (split dim,
    this rank's slice along it, the tensor's whole extent there) (models/parallel.py)."""
    q, kv, inter = cfg.q_size, cfg.kv_size, cfg.intermediate_size
    shard = shard_slices(cfg, tp) if tp is not None else {}

    def place(ours: str, kind: str | None, off: int, rows: int) -> Target:
        if kind not in shard:
            return ours, off, rows, None
        dim, part, start, full = shard[kind]
        return ours, start, part.stop - part.start if dim == 0 else rows, (dim, part, full)

    out: dict[str, Target] = {
        "model.embed_tokens.weight": place("embed_tokens.weight", "vocab", 0, cfg.vocab_size),
        "model.norm.weight": place("norm.weight", None, 0, cfg.hidden_size),
    }
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = place("lm_head.weight", "vocab", 0, cfg.vocab_size)
    for i in range(cfg.num_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        fused = {"q_proj": ("q", 0, q), "k_proj": ("k", q, kv), "v_proj": ("v", q + kv, kv)}
        kinds = ["weight", "bias"] if cfg.attention_bias else ["weight"]
        for name, (kind, off, n) in fused.items():
            for what in kinds:
                out[f"{hf}self_attn.{name}.{what}"] = place(f"{ours}self_attn.qkv_proj.{what}",
                                                            kind, off, n)
        out[f"{hf}self_attn.o_proj.weight"] = place(f"{ours}self_attn.o_proj.weight", "o", 0,
                                                    cfg.hidden_size)
        out[f"{hf}mlp.gate_proj.weight"] = place(f"{ours}mlp.gate_up_proj.weight", "gate", 0, inter)
        out[f"{hf}mlp.up_proj.weight"] = place(f"{ours}mlp.gate_up_proj.weight", "up", inter, inter)
        out[f"{hf}mlp.down_proj.weight"] = place(f"{ours}mlp.down_proj.weight", "down", 0,
                                                 cfg.hidden_size)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out[f"{hf}{norm}.weight"] = place(f"{ours}{norm}.weight", None, 0, cfg.hidden_size)
        if cfg.qk_norm:
            for norm in ("q_norm", "k_norm"):
                out[f"{hf}self_attn.{norm}.weight"] = place(f"{ours}self_attn.{norm}.weight", None,
                                                            0, cfg.head_dim)
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
               max_positions: int, seed: int = 0,
               tp: TensorParallel | None = None) -> LlamaForCausalLM:
    """`tp`: build and read only this rank's part of every split weight (models/parallel.py);
    no rank ever holds the whole model."""
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg, max_positions, tp)
    model = model.to(DTYPES[dtype]).to_empty(device=device)
    if cfg.tie_word_embeddings:  # to_empty gave lm_head its own storage: share it again
        model.lm_head.weight = model.embed_tokens.weight
    if tp is not None:  # the last rank's padding rows of the vocabulary are never loaded
        model.embed_tokens.weight.data.zero_()
        model.lm_head.weight.data.zero_()
    model.rotary.init_cache(device)
    if path is None:
        _fill_dummy(model, seed)
    else:
        _load_safetensors(model, cfg, path, tp)
    return model.eval().requires_grad_(False)


def _fill_dummy(model: torch.nn.Module, seed: int) -> None:
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if re.search(r"norm\.weight$", name):
            p.data.fill_(1.0)
        else:  # small uniform values, as vLLM's dummy loader does
            p.data.uniform_(-1e-3, 1e-3, generator=gen)


def _load_safetensors(model: torch.nn.Module, cfg: ModelConfig, path: Path,
                      tp: TensorParallel | None = None) -> None:
    targets = _param_targets(cfg, tp)
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
                ours, off, rows, part = targets[name]
                dest = params[ours].data.narrow(0, off, rows)
                src = st.get_tensor(name) if part is None else _read_part(st, name, f, *part)
                if tuple(src.shape) != tuple(dest.shape):
                    raise ConfigError(
                        f"tensor {name!r} in {f.name} has shape {tuple(src.shape)}, "
                        f"expected {tuple(dest.shape)} from config.json"
                    )
                dest.copy_(src)
    bar.close()


def _read_part(st, name: str, f: Path, dim: int, part: slice, full: int) -> torch.Tensor:
    """This rank's slice of tensor `name` along `dim`, read without the rest of it."""
    view = st.get_slice(name)
    shape = view.get_shape()
    if len(shape) <= dim or shape[dim] != full:
        raise ConfigError(f"tensor {name!r} in {f.name} has shape {tuple(shape)}, expected "
                          f"{full} along dim {dim} from config.json")
    return view[(slice(None),) * dim + (part,)]
