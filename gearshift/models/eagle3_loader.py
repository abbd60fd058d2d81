"""Read an EAGLE-3 draft head in the public checkpoint layout (SpecForge / the EAGLE
authors; served by SGLang and vLLM), check it against the target, and build an Eagle3Head.

Data flow: Engine (speculative_algorithm="eagle3", draft_model=DIR) -> load_eagle3(DIR,
target config, target embedding) -> Eagle3Head on the target's device/dtype. The runner
reads `Eagle3Config.aux_layer_ids(target layers)` to know which target hidden states to
capture and concatenate (in that order) into the head's `fc` input.

Checkpoint directory (safetensors only; pickled weights are refused, never opened):

    config.json   architectures ["LlamaForCausalLMEagle3"], num_hidden_layers 1,
                  hidden_size, num_attention_heads, num_key_value_heads, head_dim?,
                  intermediate_size, rms_norm_eps, rope_theta, rope_scaling? (llama3),
                  vocab_size (= the TARGET's), draft_vocab_size, target_hidden_size?,
                  eagle_config? {"eagle_aux_hidden_state_layer_ids": [a, b, c]}
    *.safetensors midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight [H]
                  midlayer.self_attn.{q,k,v}_proj.weight [heads*D, 2H], o_proj [H, Hq*D]
                  midlayer.mlp.{gate,up}_proj.weight [I, H], down_proj [H, I]
                  fc.weight [H, 3*H_t]   norm.weight [H]   lm_head.weight [draft_vocab, H]
                  d2t [draft_vocab] int64 (target id = draft id + d2t[draft id])
                  embed_tokens.weight [vocab, H]  optional: absent -> the target's embedding
                  t2d [vocab] bool                optional, ignored
    (a leading "model." on tensor names is accepted too.)

Aux layer ids -- which target hidden state each id means:
    id i = the OUTPUT of target decoder layer i (0-based), i.e. the residual stream after
    layer i, before the final norm = HF `output_hidden_states` entry `hidden_states[i + 1]`
    = the INPUT of layer i + 1. The three are concatenated in the listed order into
    [T, 3*H_t]. Taken from `eagle_config.eagle_aux_hidden_state_layer_ids` (or a top-level
    `eagle_aux_hidden_state_layer_ids`); the default for an N-layer target is
    [1, N//2 - 1, N - 4], i.e. the inputs of layers 2, N//2 and N-3 (SGLang's default
    capture points). Every id must lie in [0, N).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from gearshift.config import ConfigError, ModelConfig, RopeScaling, read_config_json
from gearshift.models.eagle3 import Eagle3Head
from gearshift.models.loader import DTYPES, safetensors_files

EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")


@dataclass(frozen=True, slots=True)
class Eagle3Config:
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    vocab_size: int  # the target's vocabulary (embed_tokens rows; d2t maps into it)
    draft_vocab_size: int  # lm_head rows
    target_hidden_size: int  # width of each captured target hidden state (fc reads 3x)
    aux_layer_ids_cfg: tuple[int, ...] | None  # None: the default for the target's depth
    norm_before_residual: bool = False  # vLLM variant: residual = hidden_norm(hidden)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def aux_layer_ids(self, target_num_layers: int) -> list[int]:
        """Target layer indices whose OUTPUT (= HF hidden_states[i + 1]) feeds `fc`, in
        order; default [1, N//2 - 1, N - 4] (the inputs of layers 2, N//2, N-3)."""
        n = target_num_layers
        ids = list(self.aux_layer_ids_cfg or (1, n // 2 - 1, n - 4))
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            how = "configured" if self.aux_layer_ids_cfg else "default"
            raise ConfigError(
                f"EAGLE-3 aux hidden-state layer ids {ids} ({how}) fall outside the target's "
                f"{n} layers (bad: {bad}); set eagle_config.eagle_aux_hidden_state_layer_ids"
            )
        return ids

    @classmethod
    def from_dict(cls, cfg: dict) -> Eagle3Config:
        archs = cfg.get("architectures") or []
        if not any(a in EAGLE3_ARCHITECTURES for a in archs):
            raise ConfigError(
                f"draft architecture {archs!r} is not an EAGLE-3 head "
                f"(expected one of {list(EAGLE3_ARCHITECTURES)})"
            )
        if int(cfg.get("num_hidden_layers", 1)) != 1:
            raise ConfigError(
                f"EAGLE-3 heads with num_hidden_layers={cfg['num_hidden_layers']} are not "
                "supported (expected 1)"
            )
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"EAGLE-3 hidden_act {act!r} is not supported (expected silu)")
        if cfg.get("tie_word_embeddings"):
            raise ConfigError("EAGLE-3 heads with tie_word_embeddings=true are not supported")
        # the decoder-layer fields parse exactly like a Llama config
        layer = ModelConfig.from_dict({**cfg, "architectures": ["LlamaForCausalLM"]})
        if layer.attention_bias:
            raise ConfigError("EAGLE-3 heads with attention_bias=true are not supported")
        vocab = layer.vocab_size
        draft_vocab = int(cfg.get("draft_vocab_size") or vocab)
        if not 0 < draft_vocab <= vocab:
            raise ConfigError(
                f"draft_vocab_size {draft_vocab} must be in [1, vocab_size={vocab}]"
            )
        key = "eagle_aux_hidden_state_layer_ids"
        ids = (cfg.get("eagle_config") or {}).get(key, cfg.get(key))
        if ids is not None:
            if not isinstance(ids, list) or len(ids) != 3 or any(type(i) is not int for i in ids):
                raise ConfigError(
                    f"eagle_aux_hidden_state_layer_ids must be a list of 3 ints, not {ids!r}"
                )
            ids = tuple(ids)
        return cls(
            hidden_size=layer.hidden_size,
            intermediate_size=layer.intermediate_size,
            num_heads=layer.num_heads,
            num_kv_heads=layer.num_kv_heads,
            head_dim=layer.head_dim,
            rms_norm_eps=layer.rms_norm_eps,
            rope_theta=layer.rope_theta,
            rope_scaling=layer.rope_scaling,
            max_position_embeddings=layer.max_position_embeddings,
            vocab_size=vocab,
            draft_vocab_size=draft_vocab,
            target_hidden_size=int(cfg.get("target_hidden_size") or layer.hidden_size),
            aux_layer_ids_cfg=ids,
            norm_before_residual=bool(cfg.get("norm_before_residual", False)),
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> Eagle3Config:
        return cls.from_dict(read_config_json(path, "EAGLE-3 draft"))


def _param_targets(cfg: Eagle3Config) -> dict[str, tuple[str, int, int]]:
    """Checkpoint tensor name -> (our parameter, row offset, row count), required tensors."""
    h, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    m = "midlayer."
    return {
        "fc.weight": ("fc.weight", 0, h),
        "norm.weight": ("norm.weight", 0, h),
        "lm_head.weight": ("lm_head.weight", 0, cfg.draft_vocab_size),
        f"{m}input_layernorm.weight": (f"{m}input_layernorm.weight", 0, h),
        f"{m}hidden_norm.weight": (f"{m}hidden_norm.weight", 0, h),
        f"{m}post_attention_layernorm.weight": (f"{m}post_attention_layernorm.weight", 0, h),
        f"{m}self_attn.q_proj.weight": (f"{m}self_attn.qkv_proj.weight", 0, q),
        f"{m}self_attn.k_proj.weight": (f"{m}self_attn.qkv_proj.weight", q, kv),
        f"{m}self_attn.v_proj.weight": (f"{m}self_attn.qkv_proj.weight", q + kv, kv),
        f"{m}self_attn.o_proj.weight": (f"{m}self_attn.o_proj.weight", 0, h),
        f"{m}mlp.gate_proj.weight": (f"{m}mlp.gate_up_proj.weight", 0, inter),
        f"{m}mlp.up_proj.weight": (f"{m}mlp.gate_up_proj.weight", inter, inter),
        f"{m}mlp.down_proj.weight": (f"{m}mlp.down_proj.weight", 0, h),
    }


def _check_against_target(cfg: Eagle3Config, target: ModelConfig) -> None:
    if cfg.vocab_size != target.vocab_size:
        raise ConfigError(
            f"EAGLE-3 vocab_size {cfg.vocab_size} does not match the target's vocabulary "
            f"({target.vocab_size}): the draft must share the target's tokenizer"
        )
    if cfg.target_hidden_size != target.hidden_size:
        raise ConfigError(
            f"EAGLE-3 head expects target hidden size {cfg.target_hidden_size}, but the target "
            f"has hidden_size {target.hidden_size}"
        )
    cfg.aux_layer_ids(target.num_layers)


def load_eagle3(path: str | Path, target_cfg: ModelConfig, *, dtype: str, device: str,
                max_positions: int, target_embed: nn.Embedding | None) -> Eagle3Head:
    """Build the head from `path`, validated against the target; ConfigError names any
    problem. `target_embed` is shared (not copied) when the checkpoint has no embed_tokens."""
    path = Path(path)
    cfg = Eagle3Config.from_dir(path)
    _check_against_target(cfg, target_cfg)
    files = {name.removeprefix("model."): f for name, f in safetensors_files(path).items()}
    targets = _param_targets(cfg)
    missing = [n for n in targets if n not in files]
    if "d2t" not in files and cfg.draft_vocab_size != cfg.vocab_size:
        missing.append("d2t")
    if missing:
        raise ConfigError(f"EAGLE-3 checkpoint {str(path)!r} is missing tensor(s) {missing}")
    own_embed = "embed_tokens.weight" in files
    if own_embed:
        targets["embed_tokens.weight"] = ("embed_tokens.weight", 0, cfg.vocab_size)
    else:
        _check_shared_embedding(target_embed, cfg, DTYPES[dtype])

    with torch.device("meta"):
        head = Eagle3Head(cfg, max_positions)
    if not own_embed:
        del head.embed_tokens  # drop the meta table before materialising: the target's is used
    head = head.to(DTYPES[dtype]).to_empty(device=device)
    if not own_embed:
        head.embed_tokens = target_embed
    head.rotary.init_cache(device)
    _load_tensors(head, targets, files)
    head.d2t.copy_(_read_d2t(files, cfg) if "d2t" in files else torch.zeros_like(head.d2t))
    return head.eval().requires_grad_(False)


def _check_shared_embedding(embed: nn.Embedding | None, cfg: Eagle3Config,
                            dtype: torch.dtype) -> None:
    if embed is None:
        raise ConfigError(
            "EAGLE-3 checkpoint has no embed_tokens.weight and no target embedding was given"
        )
    want = (cfg.vocab_size, cfg.hidden_size)
    # the whole table's shape: a tensor-parallel target holds its rows of it
    # (models/parallel.VocabParallelEmbedding), and looks the others up through its ranks
    shape = (embed.num_embeddings, embed.embedding_dim)
    if shape != want:
        raise ConfigError(
            f"EAGLE-3 checkpoint has no embed_tokens.weight and the target's embedding has shape "
            f"{shape}, expected {want}"
        )
    if embed.weight.dtype != dtype:
        raise ConfigError(
            f"the shared target embedding is {embed.weight.dtype}, the EAGLE-3 head {dtype}"
        )


def _load_tensors(head: Eagle3Head, targets: dict[str, tuple[str, int, int]],
                  files: dict[str, Path]) -> None:
    params = dict(head.named_parameters())
    for name, (ours, off, rows) in targets.items():
        dest = params[ours].data.narrow(0, off, rows)
        src = _get(files, name)
        if tuple(src.shape) != tuple(dest.shape):
            raise ConfigError(
                f"EAGLE-3 tensor {name!r} has shape {tuple(src.shape)}, expected "
                f"{tuple(dest.shape)} from config.json"
            )
        dest.copy_(src)


def _read_d2t(files: dict[str, Path], cfg: Eagle3Config) -> torch.Tensor:
    d2t = _get(files, "d2t")
    if d2t.dim() != 1 or d2t.shape[0] != cfg.draft_vocab_size:
        raise ConfigError(
            f"EAGLE-3 d2t has shape {tuple(d2t.shape)}, expected ({cfg.draft_vocab_size},) "
            f"= draft_vocab_size"
        )
    if d2t.is_floating_point() or d2t.dtype == torch.bool:
        raise ConfigError(f"EAGLE-3 d2t must hold integer offsets, not {d2t.dtype}")
    target_ids = torch.arange(cfg.draft_vocab_size) + d2t.long()  # [draft_vocab]
    bad = ((target_ids < 0) | (target_ids >= cfg.vocab_size)).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise ConfigError(
            f"EAGLE-3 d2t maps draft id {i} to target id {int(target_ids[i])}, outside the "
            f"target vocabulary [0, {cfg.vocab_size}) ({bad.numel()} such ids)"
        )
    return d2t.long()


def _get(files: dict[str, Path], name: str) -> torch.Tensor:
    with safe_open(files[name], framework="pt") as st:
        return st.get_tensor(name if name in st.keys() else f"model.{name}")
