"""Tiny random checkpoints in the real Hugging Face layout, built with `transformers`.

Data flow (tests only): make_tiny_checkpoint -> model dir (config.json, safetensors,
tokenizer) -> gearshift LLM / HF oracle -> compared outputs.

The weights are drawn with a larger spread than HF's default initialiser so that logits
are far from uniform: greedy tokens are then separated by margins much larger than fp32
noise, which keeps token-for-token comparisons meaningful and stable.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

ARCHS = ("llama", "llama3", "qwen2", "qwen3")

VOCAB_SIZE = 512
BOS_TOKEN = "<|begin|>"
EOS_TOKEN = "<|end|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)  # ids 0, 1, 2 in the tokenizer
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

LLAMA3_ROPE_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

_COMMON = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    bos_token_id=BOS_ID,
    eos_token_id=EOS_ID,
    pad_token_id=PAD_ID,
)

_ARCH_CONFIGS: dict[str, dict] = {
    "llama": dict(head_dim=16, rope_theta=10000.0),
    "llama3": dict(head_dim=16, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE_SCALING),
    "qwen2": dict(num_hidden_layers=3, rope_theta=1000000.0, use_sliding_window=False),
    # Qwen3: head_dim * heads != hidden, as in the real Qwen3 models.
    "qwen3": dict(head_dim=32, rope_theta=1000000.0, use_sliding_window=False),
}


def _build_model(arch: str, config_kwargs: dict) -> torch.nn.Module:
    import transformers as tf

    if arch in ("llama", "llama3"):
        return tf.LlamaForCausalLM(tf.LlamaConfig(**config_kwargs))
    if arch == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**config_kwargs))
    if arch == "qwen3":
        return tf.Qwen3ForCausalLM(tf.Qwen3Config(**config_kwargs))
    raise ValueError(f"unknown tiny arch {arch!r}; choose from {ARCHS}")


@torch.no_grad()
def _randomize_weights(model: torch.nn.Module, seed: int, std: float = 0.2) -> None:
    """Wide random weights; norms near 1 (but not exactly, so they are exercised)."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if "norm" in name:
            p.copy_(1.0 + 0.1 * noise)
        elif name.endswith("bias"):
            p.copy_(0.1 * noise)
        elif "embed_tokens" in name or "lm_head" in name:
            p.copy_(0.5 * noise)  # logits std ~4: top-1 / top-2 gaps far above fp32 noise
        else:
            p.copy_(std * noise)


def _training_text(seed: int = 0) -> list[str]:
    """Fixed pseudo-words plus English so byte-level BPE reaches the full vocab size."""
    rng = random.Random(seed)
    syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(300)]
    english = (
        "The quick brown fox jumps over the lazy dog. Hello world! "
        "Once upon a time there was a small model that liked to generate text. "
        "Speculative decoding shifts gear with load, one token at a time."
    )
    lines = [english] * 20
    lines += [" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(400)]
    return lines


def build_tokenizer(vocab_size: int = VOCAB_SIZE):
    """A tiny byte-level BPE wrapped as a `PreTrainedTokenizerFast` (BOS prepended)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_text(), trainer)
    assert tok.token_to_id(BOS_TOKEN) == BOS_ID and tok.token_to_id(EOS_TOKEN) == EOS_ID
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, BOS_ID)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS_TOKEN, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_tiny_checkpoint(
    path: str | Path,
    arch: str = "llama",
    *,
    sharded: bool = False,
    tie_word_embeddings: bool = False,
    with_tokenizer: bool = True,
    seed: int = 0,
    **config_overrides,
) -> Path:
    """Write a tiny random `arch` checkpoint (fp32 safetensors) to `path`; return `path`.

    arch: "llama" (Llama 2 style), "llama3" (rope_scaling llama3, original context 64),
    "qwen2" (qkv bias), "qwen3" (q/k norm, head_dim 32). `sharded` writes an index json
    and several shards. `config_overrides` are passed to the HF config class.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config_kwargs = {**_COMMON, **_ARCH_CONFIGS[arch], "tie_word_embeddings": tie_word_embeddings}
    config_kwargs.update(config_overrides)
    torch.manual_seed(seed)
    model = _build_model(arch, config_kwargs).to(torch.float32).eval()
    _randomize_weights(model, seed)
    if tie_word_embeddings:
        model.tie_weights()
    save_kwargs: dict = {"safe_serialization": True}
    if sharded:
        save_kwargs["max_shard_size"] = "200KB"
    model.save_pretrained(path, **save_kwargs)
    if with_tokenizer:
        build_tokenizer(config_kwargs["vocab_size"]).save_pretrained(path)
    return path


def load_hf_model(path: str | Path) -> torch.nn.Module:
    """The HF oracle for a tiny checkpoint: fp32, eval mode, eager attention, no EOS stop."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    model.generation_config.eos_token_id = None  # the oracle decodes through EOS
    return model.eval()


@torch.no_grad()
def hf_greedy(model: torch.nn.Module, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """HF `generate` greedy continuation of one prompt, never stopping at EOS."""
    from transformers import GenerationConfig

    assert model.generation_config.eos_token_id is None, "load the oracle with load_hf_model"
    gen_cfg = GenerationConfig(
        do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=PAD_ID
    )
    inp = torch.tensor([prompt_ids], dtype=torch.long)
    out = model.generate(inp, attention_mask=torch.ones_like(inp), generation_config=gen_cfg)
    new = out[0, len(prompt_ids) :].tolist()
    assert len(new) == max_new_tokens, "HF generate stopped early"
    return new


def random_prompts(lengths: list[int], seed: int = 0, vocab: int = VOCAB_SIZE) -> list[list[int]]:
    """Token-id prompts of the given lengths, avoiding the special tokens (ids < 3)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]


def make_perturbed_draft(target_dir, out_dir, noise: float = 0.15, seed: int = 5):
    """A draft model = the target with every matrix perturbed (acceptance ~0.7)."""
    import shutil

    from safetensors.torch import load_file, save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(target_dir / "config.json", out_dir / "config.json")
    gen = torch.Generator().manual_seed(seed)
    weights = {name: w + noise * w.std() * torch.randn(w.shape, generator=gen) if w.dim() > 1 else w
               for name, w in load_file(target_dir / "model.safetensors").items()}
    save_file(weights, out_dir / "model.safetensors", metadata={"format": "pt"})
    return out_dir


def assert_idle_invariant(llm) -> None:
    """When the engine is idle every KV slot is either free or cached: none leaked."""
    stats = llm.memory_stats()
    total, free, cached = stats["kv_slots_total"], stats["kv_slots_free"], stats["kv_slots_cached"]
    assert free + cached == total, f"KV slots leaked while idle: {stats}"


def slot_batch(kv, mode, chunks, slot_of):
    """A ForwardBatch over a hand-built slot cache, built by the engine's own staging code.
    chunks: (req_to_token row, prefix length, new token ids) per request;
    slot_of(row, position) -> the KV slot of that token (recorded in req_to_token)."""
    from gearshift.runner.staging import Stager, forward_batch, stage_forward

    rows = [c[0] for c in chunks]
    prefix = [c[1] for c in chunks]
    extend = [len(c[2]) for c in chunks]
    ids = [t for c in chunks for t in c[2]]
    loc = [slot_of(r, p) for r, p0, toks in chunks for p in range(p0, p0 + len(toks))]
    st = Stager(kv.k.device)
    stage_forward(st, rows, prefix, extend, ids, loc)
    return forward_batch(st.to_device(), mode, len(chunks), prefix, extend, kv)
