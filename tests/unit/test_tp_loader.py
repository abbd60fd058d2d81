"""Each tensor-parallel rank reads only its shard of the checkpoint: the tensors it asks
safetensors for have its slice's shape, the bytes it reads are about 1/size of the split
weights plus the replicated norms, and the ranks' shards put together are the checkpoint.
No process group is needed: loading involves no collective.

Data flow (tests only): tiny HF checkpoint -> load_model(..., tp=TensorParallel(r, 2)) with
safe_open recorded -> shapes, bytes, reassembled weights.
"""

from __future__ import annotations

import json

import pytest
import torch
from checkpoints import make_tiny_checkpoint
from safetensors import safe_open
from safetensors.torch import load_file

from gearshift.config import ConfigError, ModelConfig
from gearshift.models import loader
from gearshift.models.parallel import TensorParallel, check_shardable


class _Recorder:
    """safe_open whose tensors (whole or sliced) are logged as (name, shape, bytes)."""

    def __init__(self, reads: list) -> None:
        self.reads = reads

    def __call__(self, path, framework="pt"):
        reads = self.reads

        class Handle:
            def __enter__(self):
                self.st = safe_open(path, framework=framework)
                self.inner = self.st.__enter__()
                return self

            def __exit__(self, *exc):
                return self.st.__exit__(*exc)

            def keys(self):
                return self.inner.keys()

            def get_tensor(self, name):
                t = self.inner.get_tensor(name)
                reads.append((name, tuple(t.shape), t.numel() * t.element_size()))
                return t

            def get_slice(self, name):
                view = self.inner.get_slice(name)

                class Sliced:
                    def get_shape(self):
                        return view.get_shape()

                    def __getitem__(self, index):
                        t = view[index]
                        reads.append((name, tuple(t.shape), t.numel() * t.element_size()))
                        return t

                return Sliced()

        return Handle()


def _load(model_dir, rank: int, size: int, monkeypatch):
    reads: list = []
    monkeypatch.setattr(loader, "safe_open", _Recorder(reads))
    cfg = ModelConfig.from_dir(model_dir)
    model = loader.load_model(cfg, model_dir, dtype="float32", device="cpu", max_positions=64,
                              tp=TensorParallel(rank, size))
    return model, reads


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_each_rank_reads_its_shard_only(tmp_path, monkeypatch, kv_heads):
    model_dir = make_tiny_checkpoint(tmp_path / "qwen2", "qwen2", num_key_value_heads=kv_heads)
    hf = load_file(str(next(model_dir.glob("*.safetensors"))))
    total = sum(t.numel() * t.element_size() for t in hf.values())
    shards = [_load(model_dir, r, 2, monkeypatch) for r in range(2)]
    for model, reads in shards:
        read = sum(n for _, _, n in reads)
        assert len(reads) == len(hf)  # every tensor once, split ones as slices
        # 4 heads, 2 or 1 kv heads, 128 intermediate, 512 vocabulary: all split in halves,
        # but a single KV head is read by both ranks
        replicated = sum(hf[n].numel() * 4 for n in hf if "norm" in n)
        if kv_heads == 1:
            replicated += sum(hf[n].numel() * 4 for n in hf if "k_proj" in n or "v_proj" in n)
        assert read == pytest.approx((total - replicated) / 2 + replicated)
        attn = model.layers[0].self_attn
        assert (attn.num_heads, attn.num_kv_heads) == (2, 1)
        assert tuple(model.embed_tokens.weight.shape) == (256, 64)
        assert tuple(model.layers[0].mlp.down_proj.weight.shape) == (64, 64)
    # the shards put together are the checkpoint
    (m0, _), (m1, _) = shards
    q = 2 * 16  # a rank's two query heads of head_dim 16 (hidden 64 / 4 heads)
    for name, dim in (("q_proj", 0), ("o_proj", 1)):
        parts = []
        for m in (m0, m1):
            a = m.layers[0].self_attn
            w = a.qkv_proj.weight[:q] if name == "q_proj" else a.o_proj.weight
            parts.append(w)
        assert torch.equal(torch.cat(parts, dim), hf[f"model.layers.0.self_attn.{name}.weight"])
    k_rows = [m.layers[0].self_attn.qkv_proj.weight[q:q + 16] for m in (m0, m1)]
    full_k = hf["model.layers.0.self_attn.k_proj.weight"]
    assert torch.equal(torch.cat(k_rows) if kv_heads == 2 else k_rows[0], full_k)
    assert torch.equal(torch.cat([m.embed_tokens.weight for m in (m0, m1)]),
                       hf["model.embed_tokens.weight"])
    down = torch.cat([m.layers[1].mlp.down_proj.weight for m in (m0, m1)], dim=1)
    assert torch.equal(down, hf["model.layers.1.mlp.down_proj.weight"])


def test_vocabulary_rows_pad_the_last_rank(tmp_path, monkeypatch):
    model_dir = make_tiny_checkpoint(tmp_path / "odd", "llama", vocab_size=515,
                                     with_tokenizer=False)
    hf = load_file(str(next(model_dir.glob("*.safetensors"))))
    rows = []
    for r in range(2):
        model, _ = _load(model_dir, r, 2, monkeypatch)
        assert model.embed_tokens.weight.shape[0] == 258  # ceil(515 / 2)
        assert model.embed_tokens.count == (258, 257)[r]
        rows.append(model.lm_head.weight[: model.embed_tokens.count])
        assert not model.lm_head.weight[model.embed_tokens.count:].any()
    assert torch.equal(torch.cat(rows), hf["lm_head.weight"])


def _cfg(heads: int, kv_heads: int, intermediate: int) -> ModelConfig:
    return ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "vocab_size": 64,
                                  "hidden_size": 16 * heads, "intermediate_size": intermediate,
                                  "num_hidden_layers": 1, "num_attention_heads": heads,
                                  "num_key_value_heads": kv_heads})


def test_what_cannot_be_split_is_named():
    check_shardable(_cfg(8, 2, 96), 2)
    check_shardable(_cfg(8, 2, 96), 8)  # 2 KV heads, each on 4 ranks
    with pytest.raises(ConfigError, match="must divide the model's 8 attention heads"):
        check_shardable(_cfg(8, 2, 96), 3)
    with pytest.raises(ConfigError, match="model.s 3 KV heads"):
        check_shardable(_cfg(12, 3, 96), 2)
    with pytest.raises(ConfigError, match="intermediate size 90"):
        check_shardable(_cfg(8, 2, 90), 4)


def test_the_70b_preset_splits_into_halves_no_h200_exceeds():
    """Llama-3.1-70B (141 GB in bf16) at TP=2: each rank's shard, built on the meta device,
    holds half the weights (70.6 GB: an H200 holds 141 GB)."""
    from gearshift.models.llama import LlamaForCausalLM

    cfg = ModelConfig.from_dict(json.loads((loader.PRESETS_DIR / "llama-3.1-70b.json").read_text()))
    per_rank = []
    for rank in range(2):
        with torch.device("meta"):
            model = LlamaForCausalLM(cfg, 16, TensorParallel(rank, 2)).to(torch.bfloat16)
        per_rank.append(sum(p.numel() * p.element_size() for p in model.parameters()))
    whole = 70_553_706_496 * 2
    norms = (2 * cfg.num_layers + 1) * cfg.hidden_size * 2  # replicated on both ranks
    assert per_rank[0] == per_rank[1] == (whole - norms) // 2 + norms
    assert per_rank[0] < 71e9
