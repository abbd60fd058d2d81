"""Broken model directories fail at load time with a ConfigError whose message names the
problem (the tensor, the architecture, the file), and pickled weights are never loaded.

Data flow: model dir -> config / loader -> ConfigError raised from LLM(...).
"""

from __future__ import annotations

import json
import pickle
import re
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from gearshift.config import ConfigError

WEIGHTS = "model.safetensors"
MISSING = "model.layers.1.mlp.down_proj.weight"
RESHAPED = "model.layers.0.self_attn.k_proj.weight"


def _copy(src: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(src, tmp_path / "model"))


def _rewrite_weights(model_dir: Path, edit) -> None:
    tensors = load_file(model_dir / WEIGHTS)
    edit(tensors)
    save_file(tensors, model_dir / WEIGHTS, metadata={"format": "pt"})


def _load(make_llm, model_dir: Path, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern) as err:
        make_llm(model_dir)
    assert isinstance(err.value, ValueError)


def test_missing_tensor_is_named(tiny_llama_dir: Path, make_llm, tmp_path: Path) -> None:
    model_dir = _copy(tiny_llama_dir, tmp_path)
    _rewrite_weights(model_dir, lambda t: t.pop(MISSING))
    _load(make_llm, model_dir, re.escape(MISSING))


def test_missing_lm_head_when_untied_is_named(tiny_qwen2_dir: Path, make_llm, tmp_path) -> None:
    model_dir = _copy(tiny_qwen2_dir, tmp_path)
    _rewrite_weights(model_dir, lambda t: t.pop("lm_head.weight"))
    _load(make_llm, model_dir, re.escape("lm_head.weight"))


def test_missing_qkv_bias_is_named(tiny_qwen2_dir: Path, make_llm, tmp_path: Path) -> None:
    name = "model.layers.2.self_attn.v_proj.bias"
    model_dir = _copy(tiny_qwen2_dir, tmp_path)
    _rewrite_weights(model_dir, lambda t: t.pop(name))
    _load(make_llm, model_dir, re.escape(name))


def test_wrong_shape_is_named(tiny_llama_dir: Path, make_llm, tmp_path: Path) -> None:
    model_dir = _copy(tiny_llama_dir, tmp_path)

    def reshape(t: dict) -> None:
        t[RESHAPED] = t[RESHAPED][:-1].clone()  # one output row short

    _rewrite_weights(model_dir, reshape)
    _load(make_llm, model_dir, re.escape(RESHAPED))


def test_unknown_architecture_is_named(tiny_llama_dir: Path, make_llm, tmp_path: Path) -> None:
    model_dir = _copy(tiny_llama_dir, tmp_path)
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["architectures"] = ["MambaForCausalLM"]
    (model_dir / "config.json").write_text(json.dumps(cfg))
    _load(make_llm, model_dir, "MambaForCausalLM")


def test_missing_config_is_named(tiny_llama_dir: Path, make_llm, tmp_path: Path) -> None:
    model_dir = _copy(tiny_llama_dir, tmp_path)
    (model_dir / "config.json").unlink()
    _load(make_llm, model_dir, re.escape("config.json"))


def test_missing_model_dir_is_named(make_llm, tmp_path: Path) -> None:
    _load(make_llm, tmp_path / "does-not-exist", "does-not-exist")


def test_missing_shard_is_named(tiny_llama_sharded_tied_dir: Path, make_llm, tmp_path) -> None:
    model_dir = _copy(tiny_llama_sharded_tied_dir, tmp_path)
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    (model_dir / shard).unlink()
    _load(make_llm, model_dir, re.escape(shard))


class _Tripwire:
    """Unpickling this object creates `path`: proof that someone ran pickle."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_pickle_only_checkpoint_is_refused(tiny_llama_dir: Path, make_llm, tmp_path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    shutil.copy(tiny_llama_dir / "config.json", model_dir / "config.json")
    tripwire = tmp_path / "unpickled.txt"
    (model_dir / "pytorch_model.bin").write_bytes(pickle.dumps({"w": _Tripwire(tripwire)}))
    _load(make_llm, model_dir, "(?i)safetensors")
    assert not tripwire.exists(), "the loader unpickled pytorch_model.bin"
