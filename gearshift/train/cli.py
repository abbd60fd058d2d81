"""`gearshift train-tiny-lm`, `gearshift train-eagle3` and `gearshift make-bench-model`.

Data flow: argv -> gearshift/cli.py -> register_*() here -> tiny_lm.train / eagle3.train /
widen.make_bench_model (+ widen_eagle3.make_bench_head).
The CLI registers only the subcommand it runs; transformers is imported only when it runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_TARGET = Path(__file__).resolve().parents[1] / "default_model" / "target"
DTYPES = ("bfloat16", "float16", "float32")


def _train_tiny_lm(args: argparse.Namespace) -> int:
    from gearshift.train import tiny_lm

    tiny_lm.train(args)
    return 0


def _train_eagle3(args: argparse.Namespace) -> int:
    from gearshift.train import eagle3

    eagle3.train(args)
    return 0


def _make_bench_model(args: argparse.Namespace) -> int:
    if bool(args.head) != bool(args.head_out):
        raise SystemExit("make-bench-model: --head and --head-out go together")
    import torch

    from gearshift.train import widen

    out = widen.make_bench_model(
        args.src, args.shape, args.out, seed=args.seed, dtype=getattr(torch, args.dtype),
        device=args.device, shard_gb=args.shard_gb,
    )
    print(f"bench model written to {out}")
    if args.head:
        from gearshift.train import widen_eagle3

        head_out = widen_eagle3.make_bench_head(
            args.head, out, args.head_out, draft_vocab_size=args.head_draft_vocab,
            seed=args.seed, dtype=getattr(torch, args.dtype), device=args.device,
        )
        print(f"bench EAGLE-3 head written to {head_out}")
    return 0


def register_tiny_lm(sub: argparse._SubParsersAction) -> None:
    from gearshift.train.args import tiny_lm_args

    p = sub.add_parser("train-tiny-lm", help="train the default tiny Llama target")
    tiny_lm_args(p)
    p.set_defaults(func=_train_tiny_lm)


def register_eagle3(sub: argparse._SubParsersAction) -> None:
    from gearshift.train.args import eagle3_args

    p = sub.add_parser("train-eagle3", help="train an EAGLE-3 draft head for a target model")
    eagle3_args(p)
    p.set_defaults(func=_train_eagle3)


def register_make_bench_model(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "make-bench-model",
        help="embed a small trained Llama into a bigger Llama shape (same tokens, big cost)",
    )
    p.add_argument("--shape", required=True,
                   help="preset name (gearshift/presets/NAME.json) or path to a config.json")
    p.add_argument("--out", required=True, help="output checkpoint directory")
    p.add_argument("--src", default=str(DEFAULT_TARGET),
                   help="small checkpoint to embed (default: the shipped target)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    p.add_argument("--device", default="cpu", help="where random weights are generated")
    p.add_argument("--shard-gb", type=float, default=4.0, help="max safetensors shard size")
    p.add_argument("--head", default=None,
                   help="also widen this EAGLE-3 head of --src (needs --head-out)")
    p.add_argument("--head-out", default=None, help="output directory of the widened head")
    p.add_argument("--head-draft-vocab", type=int, default=None,
                   help="pad the head's draft vocabulary to N rows that never win "
                        "(32000 matches the public Llama-3.1-8B heads; default: keep)")
    p.set_defaults(func=_make_bench_model)
