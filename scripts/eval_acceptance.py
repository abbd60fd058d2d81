"""Acceptance length of an EAGLE-3 head with the real engine, on held-out corpus files.

Data flow: corpus.py held-out split -> first `--prompt-tokens` token ids of N files (BOS
first, as in training) -> gearshift.LLM(target, speculative_algorithm="eagle3",
draft_model=head, ...) per (shape, temperature) -> LLM.spec_stats() -> table + JSON.

Mean accepted length per verify step = (accepted draft tokens + verify steps) / verify
steps: every verify step commits its accepted drafts plus one target token. Greedy runs
are also checked token for token against plain (non-speculative) greedy decoding.

Usage:
    python scripts/eval_acceptance.py --target gearshift/default_model/target \
        --head gearshift/default_model/eagle3 --num-files 12 --out docs/benchmarks/X.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from gearshift import LLM, SamplingParams
from gearshift.train import corpus
from gearshift.train import tokenizer as tk

SHAPES = {  # name -> engine speculation options (policy "always": every step uses this K)
    "chain3": dict(num_draft_tokens=3, draft_topk=1),
    "chain5": dict(num_draft_tokens=5, draft_topk=1),
    "tree_k5_top4_n16": dict(num_draft_tokens=5, draft_topk=4, num_verify_tokens=16),
}


def heldout_prompts(target: Path, num_files: int, prompt_tokens: int) -> list[tuple[str, list[int]]]:
    """(relpath, prompt ids) of `num_files` held-out files evenly spaced in sorted order,
    among files with at least 2 * prompt_tokens tokens."""
    tok = tk.load_tokenizer(target)
    bos = tok.token_to_id(tk.BOS)
    files = []
    for rel, text in corpus.load_files("heldout"):
        ids = tok.encode(text, add_special_tokens=False).ids
        if len(ids) >= 2 * prompt_tokens:
            files.append((rel, [bos, *ids[: prompt_tokens - 1]]))
    if num_files < len(files):
        pick = np.linspace(0, len(files) - 1, num_files).round().astype(int)
        files = [files[i] for i in pick]
    return files


def run(target: Path, prompts: list[list[int]], params: list[SamplingParams], args,
        spec: dict | None) -> tuple[list[list[int]], dict, float]:
    kv = len(prompts) * (args.prompt_tokens + args.max_tokens + 64)
    opts = {}
    if spec:
        opts = dict(speculative_algorithm="eagle3", draft_model=str(args.head),
                    spec_policy="always", **spec)
    llm = LLM(str(target), device=args.device, dtype=args.dtype, seed=args.seed,
              max_num_seqs=len(prompts), kv_cache_tokens=kv, **opts)
    t0 = time.time()
    outs = llm.generate(prompts, params)
    wall = time.time() - t0
    return [o.token_ids for o in outs], llm.engine.spec_stats(), wall


def summarise(stats: dict) -> dict:
    hist = {int(k): v for k, v in stats["accept_len_hist"].items()}
    steps = sum(hist.values())
    return {
        "verify_steps": steps, "steps_by_k": dict(sorted(stats["steps_by_k"].items())),
        "proposed": stats["proposed"], "accepted": stats["accepted"],
        "mean_accept_len": round((stats["accepted"] + steps) / max(steps, 1), 3),
        "draft_acceptance_rate": round(stats["acceptance_rate"], 4),
        "accept_len_hist": dict(sorted(hist.items())),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--head", type=Path, required=True)
    ap.add_argument("--num-files", type=int, default=12)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--out", type=Path, default=None, help="JSON results file")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    files = heldout_prompts(args.target, args.num_files, args.prompt_tokens)
    prompts = [ids for _, ids in files]
    print(f"{len(prompts)} held-out prompts of {args.prompt_tokens} tokens, "
          f"{args.max_tokens} new tokens each")
    results, plain_greedy = [], None
    for temp in args.temperatures:
        params = [SamplingParams(max_tokens=args.max_tokens, temperature=temp, ignore_eos=True,
                                 seed=args.seed + i) for i in range(len(prompts))]
        if temp == 0.0:
            plain_greedy, _, wall = run(args.target, prompts, params, args, None)
            print(f"plain greedy: {wall:.1f}s")
        for name in args.shapes:
            tokens, stats, wall = run(args.target, prompts, params, args, SHAPES[name])
            row = {"shape": name, **SHAPES[name], "temperature": temp, **summarise(stats),
                   "wall_s": round(wall, 1)}
            if temp == 0.0:
                row["greedy_equal_to_plain"] = sum(a == b for a, b in zip(tokens, plain_greedy))
                row["num_prompts"] = len(prompts)
            results.append(row)
            print(f"{name:18s} T={temp:<4} mean accept len {row['mean_accept_len']:.3f} "
                  f"(draft acceptance {row['draft_acceptance_rate']:.3f}, "
                  f"{row['verify_steps']} steps, {wall:.1f}s)"
                  + (f" greedy==plain {row['greedy_equal_to_plain']}/{len(prompts)}"
                     if temp == 0.0 else ""), flush=True)
    report = {
        "command": "python scripts/eval_acceptance.py " + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items() if v is not None),
        "date": datetime.date.today().isoformat(), "device": args.device,
        "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
        "target": str(args.target), "head": str(args.head),
        "head_training": _training_summary(args.head),
        "prompts": [rel for rel, _ in files], "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens, "results": results,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")


def _training_summary(head: Path) -> dict | None:
    path = head / "training.json"
    if not path.exists():
        return None
    t = json.loads(path.read_text())
    return {k: t.get(k) for k in ("steps", "tokens_seen", "train_seconds", "device",
                                  "val_top1_acc_per_step")}


if __name__ == "__main__":
    main()
