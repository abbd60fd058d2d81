"""Train an EAGLE-3 draft head for a frozen Llama-family target (online, as SpecForge does).

Data flow (default model):  token ids (corpus cache) -> target (HF `LlamaForCausalLM`,
frozen, `output_hidden_states`) -> features [B, T, 3*H_t] + target logits [B, T, V]
-> Eagle3Trainable (eagle3_head.py: training-time test over S draft steps) -> soft-label
loss -> config.json + model.safetensors in the public EAGLE-3 layout -> models/eagle3_loader.py.

Loss: soft cross-entropy to the target's distribution restricted (and renormalised) to
the draft vocabulary, over rows whose target argmax lies in the draft vocabulary, step s
weighted by 0.8^(s-1). Accuracy: the draft's argmax (mapped to target ids) equals the
target's argmax, over every valid row.

Usage: gearshift train-eagle3 --target DIR --out DIR [--minutes M --steps N ...]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from gearshift.train.args import DEFAULT_TOKEN_CACHE, eagle3_args
from gearshift.train.eagle3_head import Eagle3Trainable, HeadShape, head_config, save_head

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM



def select_draft_vocab(tokens: np.ndarray, vocab_size: int, size: int) -> torch.Tensor:
    """The `size` most frequent token ids of `tokens`, ascending: [size] int64."""
    counts = np.bincount(tokens.astype(np.int64), minlength=vocab_size)[:vocab_size]
    top = np.argsort(-counts, kind="stable")[:size]
    return torch.from_numpy(np.sort(top)).long()


@torch.no_grad()
def target_outputs(target: LlamaForCausalLM, ids: torch.Tensor,
                   aux: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """ids: [B, T] -> (features [B, T, 3*H_t] = cat of hidden_states[i + 1] for the aux
    ids, target logits [B, T, V] float32)."""
    out = target(input_ids=ids, output_hidden_states=True)
    feats = torch.cat([out.hidden_states[i + 1] for i in aux], dim=-1)
    return feats.float(), out.logits.float()


def ttt_loss(logits: list[torch.Tensor], target_logits: torch.Tensor, draft_ids: torch.Tensor,
             t2d: torch.Tensor, decay: float = 0.8) -> tuple[torch.Tensor, list[float]]:
    """Weighted soft-label loss over the TTT steps and per-step top-1 accuracy.
    target_logits: [B, T, V]; t2d: [V] draft index of each target id, -1 outside."""
    t = target_logits.shape[1]
    tgt_p = target_logits[..., draft_ids].softmax(-1)  # [B, T, Vd] restricted, renormalised
    tgt_arg = t2d[target_logits.argmax(-1)]  # [B, T] draft index of the target argmax, or -1
    total, accs = target_logits.new_zeros(()), []
    for s, lg in enumerate(logits, start=1):
        n = t - s  # rows 0..T-1-s have a target p_{i+s}
        p, arg, lp = tgt_p[:, s:], tgt_arg[:, s:], lg[:, :n].float().log_softmax(-1)
        mask = (arg >= 0).float()  # [B, n]
        ce = -(p * lp).sum(-1)
        total = total + decay ** (s - 1) * (ce * mask).sum() / mask.sum().clamp_min(1.0)
        accs.append((lg[:, :n].argmax(-1) == arg).float().mean().item())
    return total, accs


def load_tokens(data: str | None, target_dir: Path) -> dict[str, np.ndarray]:
    """Token ids: a .npy file (last 2% = val), a cache dir with train.npy (+ val.npy), or
    None: the stdlib corpus cache (.cache/corpus_tokens, built with the target's tokenizer)."""
    if data and data.endswith(".npy"):
        arr = np.load(data)
        cut = int(arr.size * 0.98)
        return {"train": arr[:cut], "val": arr[cut:]}
    if data and (Path(data) / "train.npy").exists() and not (Path(data) / "meta.json").exists():
        d = Path(data)
        val = d / "val.npy"
        return {"train": np.load(d / "train.npy"), "val": np.load(val) if val.exists() else None}
    from gearshift.train import tiny_lm

    return tiny_lm.prepare_tokens(target_dir, Path(data) if data else DEFAULT_TOKEN_CACHE)


def sample_windows(tokens: np.ndarray, batch: int, seq_len: int,
                   rng: np.random.Generator) -> torch.Tensor:
    starts = rng.integers(0, tokens.size - seq_len, size=batch)
    return torch.from_numpy(tokens[starts[:, None] + np.arange(seq_len)].astype(np.int64))


def build_head(args: argparse.Namespace, target: LlamaForCausalLM, target_dir: Path,
               draft_ids: torch.Tensor) -> Eagle3Trainable:
    from gearshift.config import ModelConfig
    from gearshift.models.eagle3_loader import Eagle3Config
    from gearshift.models.layers import RotaryEmbedding

    tcfg = ModelConfig.from_dir(target_dir)
    n = tcfg.num_layers
    aux = tuple(args.aux_layers) if args.aux_layers else (1, n // 2 - 1, n - 4)
    shape = HeadShape(
        hidden_size=tcfg.hidden_size,
        intermediate_size=args.intermediate_size or tcfg.intermediate_size,
        num_heads=args.num_heads or tcfg.num_heads,
        num_kv_heads=args.num_kv_heads or tcfg.num_kv_heads,
        head_dim=tcfg.head_dim, rms_norm_eps=tcfg.rms_norm_eps, vocab_size=tcfg.vocab_size,
        draft_vocab_size=int(draft_ids.numel()), target_hidden_size=tcfg.hidden_size,
        aux_layer_ids=aux,  # type: ignore[arg-type]
    )
    Eagle3Config.from_dict(head_config(shape, target_dir)).aux_layer_ids(n)  # validate early
    rope = RotaryEmbedding(tcfg.head_dim, tcfg.max_position_embeddings, tcfg.rope_theta,
                           tcfg.rope_scaling)
    head = Eagle3Trainable(shape, target.get_input_embeddings().weight.float(),
                           rope.cos, rope.sin, draft_ids)
    if args.init_from_target:  # warm start: the target's own output layer on the draft rows
        with torch.no_grad():
            head.lm_head.weight.copy_(target.get_output_embeddings().weight[draft_ids].float())
            head.norm.weight.copy_(target.model.norm.weight.float())
    return head


def load_trainable(head_dir: Path, target: LlamaForCausalLM,
                   target_dir: Path) -> Eagle3Trainable:
    """A saved head (this trainer's layout) back as a training module, e.g. to resume."""
    from safetensors.torch import load_file

    cfg = json.loads((Path(head_dir) / "config.json").read_text())
    tensors = load_file(str(Path(head_dir) / "model.safetensors"))
    draft_ids = torch.arange(cfg["draft_vocab_size"]) + tensors["d2t"]
    args = argparse.Namespace(
        aux_layers=cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
        intermediate_size=cfg["intermediate_size"], num_heads=cfg["num_attention_heads"],
        num_kv_heads=cfg["num_key_value_heads"], init_from_target=False)
    head = build_head(args, target, target_dir, draft_ids)
    head.load_state_dict({k: v.float() if v.is_floating_point() else v
                          for k, v in tensors.items() if k != "t2d"})
    return head


@torch.no_grad()
def evaluate(head: Eagle3Trainable, target: LlamaForCausalLM, tokens: np.ndarray,
             args: argparse.Namespace, t2d: torch.Tensor, windows: int = 16) -> list[float]:
    """Per-step top-1 accuracy on fixed, evenly spaced windows of a held-out split."""
    seq = min(args.seq_len, tokens.size - 1)
    starts = np.linspace(0, tokens.size - seq - 1, windows).astype(np.int64)
    ids = torch.from_numpy(tokens[starts[:, None] + np.arange(seq)].astype(np.int64))
    accs = np.zeros(args.ttt_steps)
    for chunk in ids.to(args.device).split(args.batch_size):
        feats, tl = target_outputs(target, chunk, head.shape.aux_layer_ids)
        _, a = ttt_loss(head(chunk, feats, args.ttt_steps), tl, head.d2t + torch.arange(
            head.shape.draft_vocab_size, device=chunk.device), t2d)
        accs += np.array(a) * chunk.shape[0]
    return [round(float(a), 4) for a in accs / ids.shape[0]]


def train(args: argparse.Namespace) -> dict:
    from transformers import LlamaForCausalLM

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    target_dir, out = Path(args.target), Path(args.out)
    tokens = load_tokens(args.data, target_dir)
    target = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    target = target.to(args.device).eval().requires_grad_(False)
    vocab = target.config.vocab_size
    if args.resume:
        head = load_trainable(Path(args.resume), target, target_dir).to(args.device)
        draft_ids = torch.arange(head.shape.draft_vocab_size) + head.d2t.cpu()
    else:
        draft_ids = select_draft_vocab(tokens["train"], vocab, args.draft_vocab_size)
        head = build_head(args, target, target_dir, draft_ids).to(args.device)
    head.embed, head.cos, head.sin = (x.to(args.device) for x in (head.embed, head.cos, head.sin))
    draft_ids = draft_ids.to(args.device)
    t2d = torch.full((vocab,), -1, dtype=torch.long, device=args.device)
    t2d[draft_ids] = torch.arange(draft_ids.numel(), device=args.device)
    params = [p for p in head.parameters() if p.requires_grad]
    num_params = sum(p.numel() for p in params)
    print(f"EAGLE-3 head: {num_params / 1e6:.2f}M parameters, draft vocab {draft_ids.numel()}, "
          f"aux layers {list(head.shape.aux_layer_ids)}, TTT steps {args.ttt_steps}", flush=True)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    budget_s, step, t0, log = args.minutes * 60.0, 0, time.time(), []
    while True:
        progress = max(step / args.steps, (time.time() - t0) / budget_s)
        if progress >= 1.0:
            break
        warm = min(1.0, (step + 1) / args.warmup_steps)
        lr = args.lr * warm * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))
        for group in opt.param_groups:
            group["lr"] = lr
        ids = sample_windows(tokens["train"], args.batch_size, args.seq_len, rng).to(args.device)
        feats, target_logits = target_outputs(target, ids, head.shape.aux_layer_ids)
        loss, accs = ttt_loss(head(ids, feats, args.ttt_steps), target_logits, draft_ids, t2d)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        opt.step()
        step += 1
        if step % args.log_every == 0 or step == 1:
            log.append({"step": step, "loss": round(loss.item(), 4),
                        "acc": [round(a, 3) for a in accs]})
            print(f"step {step:5d} loss {loss.item():.4f} lr {lr:.2e} acc/step "
                  f"{' '.join(f'{a:.3f}' for a in accs)} elapsed {time.time() - t0:.0f}s",
                  flush=True)
    train_seconds = time.time() - t0
    val = tokens.get("val")
    val_acc = evaluate(head, target, val, args, t2d) if val is not None and val.size > 64 else None
    print(f"done: {step} steps in {train_seconds:.0f}s; val acc/step {val_acc}", flush=True)
    report = {
        "command": _command_line() if args.record_command else None,
        "args": {k: v for k, v in vars(args).items() if isinstance(v, str | int | float | None)},
        "shape": asdict(head.shape), "num_parameters": num_params, "steps": step,
        "tokens_seen": step * args.batch_size * args.seq_len,
        "train_seconds": round(train_seconds, 1), "val_top1_acc_per_step": val_acc,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__, "train_log": log,
    }
    save_head(head.cpu(), target_dir, out, args.save_dtype, report)
    print(f"saved EAGLE-3 head to {out}", flush=True)
    return report


def _command_line() -> str:
    """This run as a `gearshift train-eagle3 ...` command (from the CLI or `-m`)."""
    argv = sys.argv[1:]
    return " ".join(["gearshift train-eagle3", *argv[argv[:1] == ["train-eagle3"]:]])


def build_parser(ap: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    return eagle3_args(ap)


def main(argv: list[str] | None = None) -> None:
    train(build_parser().parse_args(argv))


if __name__ == "__main__":
    main()
