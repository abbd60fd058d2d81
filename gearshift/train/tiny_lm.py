"""Train the default target: a small Llama (head_dim 128) on the stdlib corpus.

Data flow (default model):  corpus.py -> tokenizer.py -> token-id cache (.npy, uint16)
-> tiny_lm.py (random packed windows, AdamW, cosine LR, bf16 autocast on GPU)
-> HF checkpoint dir (config.json, model.safetensors, tokenizer files, training.json)
-> engine loader / eagle3 trainer / widen.py.

The run stops at `--steps` or after `--minutes` of training, whichever comes first; the
cosine schedule follows the same progress (max of both fractions), so a wall-clock-bound
run still ends at the minimum LR. The weights with the best validation loss are kept and
saved in bf16; the held-out loss in training.json is measured on exactly those weights.

Usage: python -m gearshift.train.tiny_lm --out DIR [--steps N --minutes M --device cuda]
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from gearshift.train import corpus
from gearshift.train import tokenizer as tk
from gearshift.train.args import tiny_lm_args

if TYPE_CHECKING:  # transformers is imported when training starts, not by the CLI parser
    from transformers import LlamaConfig, LlamaForCausalLM

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
SPLITS = corpus.SPLITS


def llama_config(args: argparse.Namespace, vocab_size: int) -> LlamaConfig:
    """The target's shape. head_dim is 128 (Llama-3) so widen.py can embed it anywhere."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=2 * args.seq_len,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        bos_token_id=tk.SPECIAL_TOKENS.index(tk.BOS),
        eos_token_id=tk.SPECIAL_TOKENS.index(tk.EOS),
        pad_token_id=tk.SPECIAL_TOKENS.index(tk.PAD),
    )


def _sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def prepare_tokens(
    tokenizer_dir: Path, data_dir: Path, max_files: int | None = None
) -> dict[str, np.ndarray]:
    """Token ids of every split, from the .npy cache in `data_dir` or freshly encoded.

    The cache is valid for the tokenizer (sha1 of tokenizer.json) and `max_files` it was
    built with; its meta.json records the Python version and corpus it came from, so a
    cache built on one machine can train on another with a different stdlib.
    """
    key = {"tokenizer_sha1": _sha1(tokenizer_dir / "tokenizer.json"), "max_files": max_files}
    meta_path = data_dir / "meta.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if all(meta.get(k) == v for k, v in key.items()):
            print(f"token cache: {data_dir} (built with Python {meta['corpus']['python']})")
            return {s: np.load(data_dir / f"{s}.npy") for s in SPLITS}
    tok = tk.load_tokenizer(tokenizer_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    tokens = {s: tk.encode_split(tok, s, max_files) for s in SPLITS}
    for s, arr in tokens.items():
        np.save(data_dir / f"{s}.npy", arr)
    fp = corpus.fingerprint(None, max_files)
    sizes = {s: int(a.size) for s, a in tokens.items()}
    meta = {**key, "corpus": fp, "num_tokens": sizes}
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    print(f"encoded corpus in {time.time() - t0:.1f}s: {sizes}")
    return tokens


def sample_batch(
    tokens: np.ndarray, batch_size: int, seq_len: int, rng: np.random.Generator
) -> torch.Tensor:
    """Random packed windows of seq_len + 1 tokens: [batch_size, seq_len + 1] int64."""
    starts = rng.integers(0, tokens.size - seq_len - 1, size=batch_size)
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    return torch.from_numpy(tokens[idx].astype(np.int64))


@torch.no_grad()
def evaluate(
    model: LlamaForCausalLM, tokens: np.ndarray, seq_len: int, batch_size: int, device: str
) -> float:
    """Mean next-token loss over non-overlapping windows covering the whole split."""
    model.eval()
    seq_len = min(seq_len, tokens.size - 1)  # tiny test splits may be shorter than a window
    n = (tokens.size - 1) // seq_len
    x_all = torch.from_numpy(tokens[: n * seq_len + 1].astype(np.int64))
    total, count = 0.0, 0
    for start in range(0, n, batch_size):
        rows = range(start, min(start + batch_size, n))
        x = torch.stack([x_all[r * seq_len : (r + 1) * seq_len + 1] for r in rows]).to(device)
        with torch.autocast("cuda", torch.bfloat16, enabled=device.startswith("cuda")):
            logits = model(input_ids=x[:, :-1]).logits  # [batch, seq_len, vocab]
        loss = torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), x[:, 1:].flatten(), reduction="sum"
        )
        total += loss.item()
        count += x[:, 1:].numel()
    model.train()
    return total / max(count, 1)


def add_residual_dropout(model: LlamaForCausalLM, p: float) -> None:
    """Dropout on every attention and MLP output (training mode only), via forward hooks:
    the saved architecture stays plain Llama. Our corpus is small; this slows overfitting."""

    def hook(module: torch.nn.Module, inputs: tuple, output):
        if isinstance(output, tuple):  # attention returns (attn_output, attn_weights)
            return (torch.nn.functional.dropout(output[0], p, module.training), *output[1:])
        return torch.nn.functional.dropout(output, p, module.training)

    if p > 0:
        for layer in model.model.layers:
            layer.self_attn.register_forward_hook(hook)
            layer.mlp.register_forward_hook(hook)


def lr_at(progress: float, step: int, args: argparse.Namespace) -> float:
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return args.min_lr + (args.lr - args.min_lr) * cosine


def train(args: argparse.Namespace) -> dict:
    from transformers import LlamaForCausalLM

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    out, tok_dir = Path(args.out), Path(args.tokenizer)
    data_dir = Path(args.data) if args.data else out.parent / f"{out.name}_tokens"
    tokens = prepare_tokens(tok_dir, data_dir, args.max_files)
    if args.prepare_only:
        return {"data": str(data_dir), **{s: int(a.size) for s, a in tokens.items()}}
    vocab_size = tk.load_tokenizer(tok_dir).get_vocab_size()
    cfg = llama_config(args, vocab_size)
    model = LlamaForCausalLM(cfg).to(args.device)
    model.train()
    add_residual_dropout(model, args.dropout)
    if args.max_epochs is not None:  # an epoch = one pass over the train split's tokens
        epoch_steps = tokens["train"].size / (args.batch_size * args.seq_len)
        args.steps = min(args.steps, math.ceil(args.max_epochs * epoch_steps))
    num_params = sum(p.numel() for p in model.parameters())
    print(f"model: {num_params / 1e6:.2f}M parameters, {cfg.num_hidden_layers} layers")

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), fused=args.device.startswith("cuda"),
    )
    use_bf16 = args.device.startswith("cuda")
    budget_s = args.minutes * 60.0
    best = {"val_loss": float("inf"), "step": 0, "state": None}
    history, step, tokens_seen, t0 = [], 0, 0, time.time()
    losses: list[tuple[int, float]] = []  # (step, train loss) at logging steps
    while True:
        elapsed = time.time() - t0
        progress = max(step / args.steps, elapsed / budget_s)
        if progress >= 1.0:
            break
        lr = lr_at(progress, step, args)
        for group in opt.param_groups:
            group["lr"] = lr
        x = sample_batch(tokens["train"], args.batch_size, args.seq_len, rng).to(args.device)
        with torch.autocast("cuda", torch.bfloat16, enabled=use_bf16):
            logits = model(input_ids=x[:, :-1]).logits  # [batch, seq_len, vocab]
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += x[:, 1:].numel()
        if step % args.log_every == 0 or step == 1:  # .item() syncs: only when logging
            losses.append((step, loss.item()))
            rate = tokens_seen / (time.time() - t0)
            print(f"step {step:6d} loss {losses[-1][1]:.4f} lr {lr:.2e} "
                  f"tok/s {rate:,.0f} elapsed {time.time() - t0:.0f}s", flush=True)
        if step % args.eval_every == 0:
            val = evaluate(model, tokens["val"], args.seq_len, args.batch_size, args.device)
            history.append({"step": step, "train_loss": losses[-1][1], "val_loss": val,
                            "elapsed_s": round(time.time() - t0, 1)})
            print(f"step {step:6d} val_loss {val:.4f}", flush=True)
            if val < best["val_loss"]:
                best = {"val_loss": val, "step": step, "state": copy.deepcopy(model.state_dict())}
    train_seconds = time.time() - t0

    val = evaluate(model, tokens["val"], args.seq_len, args.batch_size, args.device)
    if val < best["val_loss"] or best["state"] is None:
        best = {"val_loss": val, "step": step, "state": None}
    else:
        model.load_state_dict(best["state"])
    with torch.no_grad():  # evaluate exactly the weights we ship (rounded to bf16)
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    heldout = evaluate(model, tokens["heldout"], args.seq_len, args.batch_size, args.device)
    val = evaluate(model, tokens["val"], args.seq_len, args.batch_size, args.device)
    print(f"done: {step} steps, {tokens_seen:,} tokens, {train_seconds:.0f}s; "
          f"best step {best['step']} val {val:.4f} heldout {heldout:.4f}")

    meta_path = data_dir / "meta.json"
    report = {
        "command": " ".join(["python -m gearshift.train.tiny_lm", *sys.argv[1:]]),
        "args": {k: v for k, v in vars(args).items() if isinstance(v, str | int | float | None)},
        "num_parameters": num_params,
        "steps": step,
        "tokens_seen": tokens_seen,
        "train_seconds": round(train_seconds, 1),
        "epochs": round(tokens_seen / max(tokens["train"].size, 1), 2),
        "selected_step": best["step"],
        "val_loss": round(val, 4),
        "heldout_loss": round(heldout, 4),
        "corpus": json.loads(meta_path.read_text()) if meta_path.exists() else None,
        "device": torch.cuda.get_device_name() if use_bf16 else "cpu",
        "torch": torch.__version__,
        "eval_history": history,
        "train_log": [{"step": st, "loss": round(lo, 4)} for st, lo in losses],
    }
    save_checkpoint(model, cfg, tok_dir, out, report)
    return report


def save_checkpoint(
    model: LlamaForCausalLM, cfg: LlamaConfig, tok_dir: Path, out: Path, report: dict
) -> None:
    """HF layout in bf16, plus tokenizer files and training.json."""
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out)
    # Also write the pre-v5 rope keys, as hub Llama configs do, for loaders reading either.
    config = json.loads((out / "config.json").read_text())
    config.setdefault("rope_theta", cfg.rope_parameters["rope_theta"])
    config["architectures"] = ["LlamaForCausalLM"]
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for name in TOKENIZER_FILES:
        if (tok_dir / name).resolve() != (out / name).resolve():
            shutil.copy(tok_dir / name, out / name)
    (out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"saved checkpoint to {out}")


def build_parser(ap: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    return tiny_lm_args(ap)


def main(argv: list[str] | None = None) -> None:
    train(build_parser().parse_args(argv))


if __name__ == "__main__":
    main()
