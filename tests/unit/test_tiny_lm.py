"""The default target's trainer (gearshift/train/tiny_lm.py) on a tiny corpus subset."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from gearshift.train import corpus, tiny_lm
from gearshift.train import tokenizer as tk
from gearshift.train.args import DEFAULT_TOKENIZER


def test_trains_saves_and_reloads(tmp_path) -> None:
    tok = tk.train_tokenizer(corpus.load_texts("train", max_files=20), vocab_size=512)
    tok_dir = tk.save_tokenizer(tok, tmp_path / "tok")
    out = tmp_path / "lm"
    args = tiny_lm.build_parser().parse_args([
        "--out", str(out), "--tokenizer", str(tok_dir), "--device", "cpu",
        "--steps", "20", "--minutes", "5", "--max-files", "6", "--batch-size", "8",
        "--seq-len", "64", "--lr", "1e-2", "--warmup-steps", "2", "--log-every", "1",
        "--eval-every", "10", "--hidden-size", "64", "--intermediate-size", "128",
        "--num-layers", "2", "--head-dim", "32",
    ])
    report = tiny_lm.train(args)

    log = [e["loss"] for e in report["train_log"]]
    assert report["steps"] == 20 and len(log) == 20
    assert np.mean(log[-5:]) < log[0] - 0.5  # from ~ln(512) = 6.2, the loss falls
    assert report["heldout_loss"] < log[0]
    assert report["tokens_seen"] == 20 * 8 * 64

    saved = json.loads((out / "training.json").read_text())
    assert saved["heldout_loss"] == report["heldout_loss"]
    assert (tmp_path / "lm_tokens" / "train.npy").exists()  # token cache beside the output
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["head_dim"] == 32

    model = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    hf_tok = AutoTokenizer.from_pretrained(out)
    ids = hf_tok("def f(x):\n", return_tensors="pt")["input_ids"]
    gen = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=2)
    assert gen.shape[1] == ids.shape[1] + 8

    cached = tiny_lm.prepare_tokens(tok_dir, tmp_path / "lm_tokens", max_files=6)
    assert cached["train"].dtype == np.uint16 and cached["train"].size > 1000


SHIPPED = DEFAULT_TOKENIZER  # gearshift/default_model/target


def test_shipped_target_loads_and_writes_python() -> None:
    if not (SHIPPED / "model.safetensors").exists():
        pytest.skip("no shipped weights")
    report = json.loads((SHIPPED / "training.json").read_text())
    model = LlamaForCausalLM.from_pretrained(SHIPPED, dtype=torch.float32).eval()
    assert model.config.head_dim == 128 and 7e6 < report["num_parameters"] < 12e6
    assert sum(p.numel() for p in model.parameters()) == report["num_parameters"]
    tok = AutoTokenizer.from_pretrained(SHIPPED)
    ids = tok("import os\n\n\ndef main():\n", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    text = tok.decode(out[0, ids.shape[1]:])
    assert text.startswith("    ")  # a function body is indented
