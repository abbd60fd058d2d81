"""The EAGLE-3 trainer (gearshift/train/eagle3.py) on a tiny random 4-layer target.

Data flow (tests only): tests/checkpoints.py target + a tiny token stream -> train-eagle3
-> head dir -> models/eagle3_loader.load_eagle3 -> Eagle3Head over a slot KV cache with
the torch attention backend  vs  the trainer's own (TTT) forward on the same inputs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from checkpoints import make_tiny_checkpoint, slot_batch
from transformers import LlamaForCausalLM

from gearshift.attention.base import KVCache
from gearshift.attention.torch_backend import TorchBackend
from gearshift.config import ModelConfig
from gearshift.forward_batch import ForwardBatch, ForwardMode
from gearshift.models.eagle3_loader import load_eagle3
from gearshift.models.loader import load_model
from gearshift.train import eagle3

MAX_LEN = 64  # req_to_token row length of the hand-built KV cache
TTT = 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("e3train")
    target_dir = make_tiny_checkpoint(root / "target", num_hidden_layers=4)
    # a tiny stream the target's structure can be learned from: repeated random "lines"
    rng = np.random.default_rng(0)
    lines = [rng.integers(3, 300, size=rng.integers(5, 12)) for _ in range(40)]
    stream = np.concatenate([lines[i] for i in rng.integers(0, 40, size=3000)])
    np.save(root / "tokens.npy", stream.astype(np.uint16))
    out = root / "head"
    args = eagle3.build_parser().parse_args([
        "--target", str(target_dir), "--out", str(out), "--data", str(root / "tokens.npy"),
        "--steps", "30", "--minutes", "5", "--batch-size", "4", "--seq-len", "32",
        "--ttt-steps", str(TTT), "--draft-vocab-size", "200", "--intermediate-size", "96",
        "--lr", "3e-3", "--warmup-steps", "3", "--log-every", "1", "--save-dtype", "float32",
    ])
    args.record_command = False
    report = eagle3.train(args)
    return {"root": root, "target": target_dir, "out": out, "report": report,
            "stream": stream}


def test_loss_falls_and_layout(setup) -> None:
    report, out = setup["report"], setup["out"]
    losses = [e["loss"] for e in report["train_log"]]
    assert report["steps"] == 30 and len(losses) == 30
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:3])
    assert len(report["train_log"][-1]["acc"]) == TTT
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["draft_vocab_size"] == 200 and cfg["vocab_size"] == 512
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 1, 0]  # N = 4
    # the draft vocabulary: the 200 most frequent ids of the training split, ascending
    from safetensors.torch import load_file

    t = load_file(str(out / "model.safetensors"))
    ids = torch.arange(200) + t["d2t"]
    counts = np.bincount(setup["stream"][: int(setup["stream"].size * 0.98)], minlength=512)
    assert torch.all(ids[1:] > ids[:-1])
    assert counts[ids.numpy()].min() >= np.sort(counts)[::-1][199]
    assert "embed_tokens.weight" not in t and t["fc.weight"].shape == (64, 3 * 64)


def _batch(kv: KVCache, mode: ForwardMode,
              chunks: list[tuple[int, int, list[int]]]) -> ForwardBatch:
    """chunks: (req_to_token row, prefix length, new token ids); slot = row * MAX_LEN + pos."""
    return slot_batch(kv, mode, chunks, lambda r, p: r * MAX_LEN + p)


@torch.no_grad()
def test_saved_head_matches_training_forward(setup) -> None:
    """Step 1 (draft-extend with target features) over whole windows, and steps 2..S (the
    engine's draft steps: own prenorm, one row further each step) at each window's last
    valid row, fp32, 1e-4."""
    target_dir, out = setup["target"], setup["out"]
    cfg = ModelConfig.from_dir(target_dir)
    engine_target = load_model(cfg, target_dir, dtype="float32", device="cpu", max_positions=256)
    head = load_eagle3(out, cfg, dtype="float32", device="cpu", max_positions=256,
                       target_embed=engine_target.embed_tokens)
    hf = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    trainable = eagle3.load_trainable(out, hf, target_dir)
    lens = [20, 13]
    gen = torch.Generator().manual_seed(3)
    windows = [torch.randint(3, 512, (n,), generator=gen) for n in lens]
    kv = KVCache.allocate(1, 3 * MAX_LEN, head.config.num_kv_heads, head.config.head_dim, 2,
                          MAX_LEN, torch.float32, "cpu")
    attn = TorchBackend(kv, head.config.head_dim ** -0.5)
    for r, ids in enumerate(windows, start=1):
        feats, _ = eagle3.target_outputs(hf, ids[None], trainable.shape.aux_layer_ids)
        ref = trainable(ids[None], feats, TTT)  # S x [1, n, Vd]
        n = ids.shape[0]
        # step 1 (DRAFT_EXTEND): row i consumes token i+1 and the features of position i
        fb = _batch(kv, ForwardMode.DRAFT_EXTEND, [(r, 0, ids[1:].tolist())])
        prenorm = head(fb.input_ids, feats[0, : n - 1], fb.positions, fb, attn)  # [n-1, H]
        assert (head.compute_logits(prenorm) - ref[0][0, : n - 1]).abs().max() <= 1e-4
        # steps 2..S at row i = n-1-S: the engine's depth-s row sits at position i+s-1
        i = n - 1 - TTT
        fb = _batch(kv, ForwardMode.DRAFT_EXTEND, [(r, 0, ids[1:i + 2].tolist())])
        hidden = head(fb.input_ids, feats[0, : i + 1], fb.positions, fb, attn)[-1:]  # [1, H]
        for s in range(2, TTT + 1):
            fb = _batch(kv, ForwardMode.DECODE, [(r, i + s - 1, [int(ids[i + s])])])
            hidden = head(fb.input_ids, hidden, fb.positions, fb, attn)
            got = head.compute_logits(hidden)[0]
            assert (got - ref[s - 1][0, i]).abs().max() <= 1e-4, f"step {s}"


def test_cli_exits_zero(setup, tmp_path: Path) -> None:
    out = tmp_path / "cli_head"
    cmd = [sys.executable, "-m", "gearshift.cli", "train-eagle3", "--target", str(setup["target"]),
           "--out", str(out), "--data", str(setup["root"] / "tokens.npy"), "--steps", "2",
           "--batch-size", "2", "--seq-len", "16", "--ttt-steps", "3",
           "--draft-vocab-size", "64", "--intermediate-size", "32"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()
    assert json.loads((out / "training.json").read_text())["steps"] == 2


SHIPPED = Path(eagle3.__file__).resolve().parents[1] / "default_model"


def test_shipped_head_loads_and_speculates_losslessly() -> None:
    """The default head (trained by train-eagle3) fits the package budget, loads against the
    shipped target, and greedy speculation reproduces plain greedy decoding."""
    if not (SHIPPED / "eagle3" / "model.safetensors").exists():
        pytest.skip("no shipped EAGLE-3 head")
    total = sum(f.stat().st_size for f in SHIPPED.rglob("*") if f.is_file())
    head_bytes = sum(f.stat().st_size for f in (SHIPPED / "eagle3").iterdir())
    assert head_bytes < 4e6 and total < 20e6
    from gearshift import LLM, SamplingParams

    prompt = "import os\n\n\ndef read_lines(path):\n    with open(path) as f:\n"
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    plain = LLM(str(SHIPPED / "target"), device="cpu", kv_cache_tokens=256, max_num_seqs=1)
    spec = LLM(str(SHIPPED / "target"), device="cpu", kv_cache_tokens=256, max_num_seqs=1,
               speculative_algorithm="eagle3", draft_model=str(SHIPPED / "eagle3"),
               num_draft_tokens=3, spec_policy="always")  # goodput on CPU may stop early
    want = plain.generate(prompt, params)[0].token_ids
    assert spec.generate(prompt, params)[0].token_ids == want
    stats = spec.engine.spec_stats()
    assert stats["proposed"] > 0 and stats["accepted"] > 0
