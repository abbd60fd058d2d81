"""The shipped presets (gearshift/presets/*.json) are real HF config.json files that parse
into the model shapes they are named after.

Data flow: preset json -> ModelConfig.from_dict -> dummy-weight engine / benchmarks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gearshift import config as gearshift_config
from gearshift.config import ModelConfig, RopeScaling

PRESETS_DIR = Path(gearshift_config.__file__).resolve().parent / "presets"

# name: (architecture, layers, hidden, heads, kv_heads, head_dim, vocab, intermediate, tied)
EXPECTED = {
    "llama-3.1-8b": ("llama", 32, 4096, 32, 8, 128, 128256, 14336, False),
    "llama-3.1-70b": ("llama", 80, 8192, 64, 8, 128, 128256, 28672, False),
    "llama-3.2-1b": ("llama", 16, 2048, 32, 8, 64, 128256, 8192, True),
    "qwen2.5-7b": ("qwen2", 28, 3584, 28, 4, 128, 152064, 18944, False),
    "qwen3-8b": ("qwen3", 36, 4096, 32, 8, 128, 151936, 12288, False),
}

# Parameter counts as published on the Hub model cards / safetensors metadata.
EXPECTED_PARAMS = {
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.2-1b": 1_235_814_400,
    "qwen2.5-7b": 7_615_616_512,
    "qwen3-8b": 8_190_735_360,
}


def _load(name: str) -> dict:
    return json.loads((PRESETS_DIR / f"{name}.json").read_text())


def _num_params(c: ModelConfig) -> int:
    h, q, kv = c.hidden_size, c.q_size, c.kv_size
    attn = h * (q + 2 * kv) + q * h + (q + 2 * kv if c.attention_bias else 0)
    attn += 2 * c.head_dim if c.qk_norm else 0
    layer = attn + 3 * h * c.intermediate_size + 2 * h
    embed = c.vocab_size * h
    return embed + c.num_layers * layer + h + (0 if c.tie_word_embeddings else embed)


def test_every_expected_preset_is_shipped() -> None:
    shipped = {p.stem for p in PRESETS_DIR.glob("*.json")}
    assert set(EXPECTED) <= shipped


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_dims(name: str) -> None:
    arch, layers, hidden, heads, kv_heads, head_dim, vocab, inter, tied = EXPECTED[name]
    c = ModelConfig.from_dict(_load(name))
    assert c.architecture == arch
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads) == (
        layers,
        hidden,
        heads,
        kv_heads,
    )
    assert (c.head_dim, c.vocab_size, c.intermediate_size) == (head_dim, vocab, inter)
    assert c.tie_word_embeddings is tied
    assert c.attention_bias is (arch == "qwen2")
    assert c.qk_norm is (arch == "qwen3")
    assert c.eos_token_ids, "presets must name their EOS token"
    assert _num_params(c) == EXPECTED_PARAMS[name]


def test_llama_31_8b_rope() -> None:
    c = ModelConfig.from_dict(_load("llama-3.1-8b"))
    assert c.rope_theta == 500000.0
    assert c.rms_norm_eps == 1e-5
    assert c.max_position_embeddings == 131072
    assert c.rope_scaling == RopeScaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
    )


def test_llama_32_1b_rope() -> None:
    c = ModelConfig.from_dict(_load("llama-3.2-1b"))
    assert c.rope_scaling is not None and c.rope_scaling.factor == 32.0


@pytest.mark.parametrize("name", ["qwen2.5-7b", "qwen3-8b"])
def test_qwen_plain_rope(name: str) -> None:
    c = ModelConfig.from_dict(_load(name))
    assert c.rope_scaling is None
    assert c.rope_theta == 1_000_000.0


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_is_a_valid_hf_config(name: str, tmp_path: Path) -> None:
    """transformers reads the preset as the real config class with the same dims."""
    transformers = pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text((PRESETS_DIR / f"{name}.json").read_text())
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    assert hf.architectures == _load(name)["architectures"]
    c = ModelConfig.from_dict(_load(name))
    assert hf.num_hidden_layers == c.num_layers
    assert hf.num_key_value_heads == c.num_kv_heads
    assert getattr(hf, "head_dim", None) in (None, c.head_dim)
