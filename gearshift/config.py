"""Frozen configuration: the model's shape (read from a Hugging Face config.json) and the
engine's options. Built once at start-up, never mutated; derived values are properties.

Data flow: cli / LLM(...) -> EngineConfig -> Engine (scheduler, runner, KV pool).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


MAX_DRAFT = 16  # the deepest draft K a model proposer may be configured with
MAX_SUFFIX_DRAFT = 32  # suffix decoding: long copied spans are worth deeper drafts
# speculative_algorithm values: one proposer, or a model proposer beside suffix decoding
# (a proposer per request and step, chosen by the policy: policy/hybrid.py)
SPEC_ALGORITHMS = ("eagle3", "draft", "ngram", "suffix", "eagle3+suffix", "draft+suffix")


class ConfigError(ValueError):
    """A user-facing configuration or checkpoint problem (bad flag, bad config.json)."""


# EngineConfig.spec_policy: the speculation policies an engine can be built with (policy/);
# `random` (a seeded K per request each step) is for soaks and tests
SPEC_POLICIES = ("goodput", "goodput-request", "always", "off", "threshold", "random")

# engine options renamed, still accepted under their old names for one release: old -> new
RENAMED_OPTIONS = {"draft_topk": "tree_width", "num_verify_tokens": "tree_budget"}


def rename_options(options: dict) -> dict:
    """`options` under their current names: an old name (RENAMED_OPTIONS) warns with a
    FutureWarning naming the new one; old and new together are an error."""
    options = dict(options)
    for old, new in RENAMED_OPTIONS.items():
        if old not in options:
            continue
        if new in options:
            raise ConfigError(f"{old} is the old name of {new}: pass {new} alone")
        warnings.warn(f"engine option {old} is deprecated and goes in the next release: "
                      f"use {new}", FutureWarning, stacklevel=3)
        options[new] = options.pop(old)
    return options


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """`rope_scaling` of type `llama3` (Llama 3.1/3.2); None means plain RoPE."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str  # "llama" | "qwen2" | "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool  # per-head RMSNorm on q and k before RoPE (Qwen3)
    rope_scaling: RopeScaling | None = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_dict(cls, cfg: dict) -> ModelConfig:
        archs = cfg.get("architectures") or []
        arch = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ConfigError(
                f"unknown architecture {archs!r}: supported are {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            scaling = _parse_rope_scaling(cfg.get("rope_scaling") or cfg.get("rope_parameters"))
            eos = cfg.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            rope_theta = cfg.get("rope_theta")
            if rope_theta is None:
                rope_theta = (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
            return cls(
                architecture=arch,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope_theta),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
                qk_norm=arch == "qwen3",
                rope_scaling=scaling,
                eos_token_ids=eos_ids,
                bos_token_id=cfg.get("bos_token_id"),
            )
        except KeyError as e:
            raise ConfigError(f"config.json is missing the field {e.args[0]!r}") from None

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        return cls.from_dict(read_config_json(path, "model"))


def read_config_json(path: str | Path, what: str) -> dict:
    """config.json of a checkpoint directory; ConfigError naming the problem otherwise."""
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        raise ConfigError(f"no config.json in {what} directory {str(path)!r}")
    try:
        return json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{cfg_path} is not valid JSON: {e}") from None


def _parse_rope_scaling(rs: dict | None) -> RopeScaling | None:
    if not rs:
        return None
    kind = rs.get("rope_type") or rs.get("type")
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise ConfigError(f"unsupported rope_scaling type {kind!r} (supported: llama3)")
    return RopeScaling(
        factor=float(rs["factor"]),
        low_freq_factor=float(rs["low_freq_factor"]),
        high_freq_factor=float(rs["high_freq_factor"]),
        original_max_position_embeddings=int(rs["original_max_position_embeddings"]),
    )


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything the engine needs besides the model directory's own files."""

    model: str  # model directory (or a preset name with load_format="dummy")
    device: str = "cpu"
    dtype: str = "float32"  # "float32" | "bfloat16" | "float16"
    load_format: str = "safetensors"  # "safetensors" | "dummy"
    attention_backend: str = "torch"  # "torch" | "triton"
    max_num_seqs: int = 64
    kv_cache_tokens: int | None = None  # None: sized by the start-up memory profile (GPU)
    # the share of the card's total memory the engine may use (weights, activations, graphs
    # and KV cache together, as vLLM's flag of this name); the KV cache takes what the
    # start-up profile of the largest steps leaves (runner/memory_plan.py)
    gpu_memory_utilization: float = 0.9
    kv_memory_fraction: float | None = None  # deprecated: read as gpu_memory_utilization
    max_num_batched_tokens: int = 2048  # prefill chunk budget per step
    max_model_len: int | None = None  # None: min(max_position_embeddings, KV capacity)
    allow_long_max_model_len: bool = False  # max_model_len past max_position_embeddings
    cuda_graphs: bool = True  # decode graphs per padded batch size (CUDA only)
    extend_graph_max_tokens: int = 2048  # EXTEND graphs per padded token count up to this; 0 = off
    overlap_schedule: bool = True  # plan + prepare step n+1 while step n runs on the device
    # keep finished requests' KV (and the draft's) in a radix tree over the KV slots and
    # start later requests after their longest cached prefix (scheduler/prefix_cache.py)
    enable_prefix_caching: bool = True
    # fold the layers' RMSNorm weights into qkv / gate_up and run every step on the fused
    # path: norms and residual adds inside the GEMMs (<= 64 tokens, where the chooser takes
    # the kernels), else RMSNorm alone + cuBLAS with the add in addmm_ (CUDA GPUs with TMA
    # only; models/llama.py)
    fuse_norms: bool = True
    # ranks splitting the model (models/parallel.py), one process and device each; rank 0
    # plans every step for all of them (distributed/)
    tensor_parallel_size: int = 1
    step_trace: str | None = None  # JSONL path: one line per engine step (engine/step_trace.py)
    gc_freeze: bool | None = None  # gc.freeze() the start-up heap (engine/gc_control.py); None: on CUDA
    seed: int = 0
    cpu_threads: int | None = None  # CPU runs; None: runner/startup_checks.default_cpu_threads
    tokenizer: str | None = None  # tokenizer directory; None: the model's own
    chat_template: str | None = None  # Jinja template, or a file holding one; None: the tokenizer's
    served_model_name: str | None = None  # the name clients see; None: the directory's
    # speculative decoding (None = off; see gearshift/speculative/)
    # "eagle3" | "draft" | "ngram" | "suffix" | "eagle3+suffix" | "draft+suffix"
    speculative_algorithm: str | None = None
    draft_model: str | None = None  # EAGLE-3 head or draft model directory
    num_draft_tokens: int = 4  # K: the deepest draft a step may verify (the configured maximum)
    tree_width: int = 1  # 1 = chains only; > 1 = draft trees expanding the top tree_width per step
    tree_budget: int | None = None  # nodes per draft tree, root included; None: from K and width
    spec_policy: str = "goodput"  # goodput | goodput-request | always | off | threshold | random
    # how speculation verifies sampled tokens (a request's SamplingParams.spec_sampling wins):
    # "rejection" keeps the target's distribution; "coupled" also keeps the text: a seeded
    # request gets exactly what plain decoding with that seed gives (speculative/coupled.py).
    # Coupled is the default: on the H200 it ran no slower (docs/benchmarks.md)
    spec_sampling: str = "coupled"
    spec_warmup: bool = True  # CUDA graphs: run every (batch, K) step shape at start-up (graphs, costs)
    ngram_min: int = 1  # n-gram lookup: shortest suffix to match
    ngram_max: int = 4  # longest suffix to match
    # suffix decoding: recent outputs kept to draft from, in tokens (0 = a request's own only)
    suffix_cache_tokens: int = 1 << 16
    # beside a model proposer ("eagle3+suffix"): the deepest suffix draft a step may verify
    # (num_draft_tokens stays the model's)
    suffix_draft_tokens: int = 16

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be float32, bfloat16 or float16, not {self.dtype!r}")
        if self.load_format not in ("safetensors", "dummy"):
            raise ConfigError(f"load_format must be safetensors or dummy, not {self.load_format!r}")
        if self.attention_backend not in ("torch", "triton"):
            raise ConfigError(
                f"attention_backend must be torch or triton, not {self.attention_backend!r}"
            )
        if self.max_num_seqs < 1:
            raise ConfigError("max_num_seqs must be >= 1")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < 16:
            raise ConfigError("kv_cache_tokens must be >= 16")
        if self.max_num_batched_tokens < 1:
            raise ConfigError("max_num_batched_tokens must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"max_model_len must be >= 2, not {self.max_model_len} (the context "
                              "holds a prompt of at least one token and one more)")
        if self.step_trace is not None and not Path(self.step_trace).resolve().parent.is_dir():
            raise ConfigError(f"step_trace: no folder for {self.step_trace!r}")
        if self.extend_graph_max_tokens < 0:
            raise ConfigError("extend_graph_max_tokens must be >= 0 (0 = no EXTEND graphs)")
        if self.kv_memory_fraction is not None:  # the old name: one meaning from here on
            if not 0.0 < self.kv_memory_fraction <= 1.0:
                raise ConfigError("kv_memory_fraction must be in (0, 1]")
            object.__setattr__(self, "gpu_memory_utilization", self.kv_memory_fraction)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError("gpu_memory_utilization must be in (0, 1], the share of the "
                              f"GPU's total memory the engine may use, not "
                              f"{self.gpu_memory_utilization}")
        if self.tensor_parallel_size < 1:
            raise ConfigError("tensor_parallel_size must be >= 1")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ConfigError("cpu_threads must be >= 1")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ConfigError("served_model_name must not be empty")
        if self.spec_sampling not in ("coupled", "rejection"):
            raise ConfigError(f"spec_sampling must be coupled or rejection, not {self.spec_sampling!r}")
        self._validate_spec()

    def _validate_spec(self) -> None:
        algo = self.speculative_algorithm
        if algo is None:
            return
        if algo not in SPEC_ALGORITHMS:
            raise ConfigError(f"speculative_algorithm (--speculative-algorithm) must be one of "
                              f"{', '.join(SPEC_ALGORITHMS)}, not {algo!r}")
        if self.model_algorithm == "draft" and not self.draft_model:
            raise ConfigError(f"speculative_algorithm={algo!r} needs draft_model=DIR")
        if self.hybrid and self.tensor_parallel_size > 1:  # rank 0 alone prices suffix matches
            raise ConfigError(f"speculative_algorithm={algo!r} runs on one rank for now: "
                              "tensor_parallel_size must be 1")
        if self.hybrid and not 1 <= self.suffix_draft_tokens <= MAX_SUFFIX_DRAFT:
            raise ConfigError(f"suffix_draft_tokens (--suffix-draft-tokens) must be in "
                              f"[1, {MAX_SUFFIX_DRAFT}]")
        k_max = MAX_SUFFIX_DRAFT if algo == "suffix" else MAX_DRAFT
        if not 1 <= self.num_draft_tokens <= k_max:
            raise ConfigError(f"num_draft_tokens must be in [1, {k_max}]"
                              + (" (suffix decoding: 32)" if algo != "suffix" else ""))
        if not 1 <= self.tree_width <= 8:
            raise ConfigError("tree_width must be in [1, 8]")
        if algo == "ngram" and self.tree_width != 1:
            raise ConfigError("ngram proposes chains only: tree_width must be 1")
        if self.tree_budget is not None and not (
                2 <= self.tree_budget <= 1 + self.num_draft_tokens * self.tree_width ** 2):
            raise ConfigError("tree_budget must be in [2, 1 + num_draft_tokens * tree_width^2]")
        if self.spec_policy not in SPEC_POLICIES:
            raise ConfigError(f"unknown spec_policy {self.spec_policy!r} "
                              f"({', '.join(SPEC_POLICIES)})")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ConfigError("need 1 <= ngram_min <= ngram_max")
        if self.suffix_cache_tokens < 0:
            raise ConfigError("suffix_cache_tokens must be >= 0 (0 = no output cache)")

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm is not None

    @property
    def hybrid(self) -> bool:
        """A model proposer and suffix decoding, one chosen per request and step."""
        return self.speculative_algorithm in ("eagle3+suffix", "draft+suffix")

    @property
    def model_algorithm(self) -> str | None:
        """The proposer a hybrid's model part is (eagle3, draft), else the algorithm."""
        algo = self.speculative_algorithm
        return algo.split("+")[0] if algo is not None else None

    @property
    def max_draft_len(self) -> int:
        """The deepest draft any proposer of the engine may send to one step."""
        return max(self.num_draft_tokens, self.suffix_draft_tokens) if self.hybrid \
            else self.num_draft_tokens

    @property
    def verify_nodes(self) -> int:
        """Tokens one speculating request sends to verification (root included)."""
        if self.tree_width == 1:
            return self.num_draft_tokens + 1
        return self.tree_budget or min(1 + self.num_draft_tokens * self.tree_width,
                                       1 + self.num_draft_tokens * self.tree_width ** 2)

    @property
    def use_cuda_graphs(self) -> bool:
        return self.cuda_graphs and self.device.startswith("cuda")
