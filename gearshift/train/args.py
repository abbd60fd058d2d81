"""The flags of `gearshift train-tiny-lm` and `gearshift train-eagle3` (also their modules'
`python -m` entry points), apart from the trainers so that the CLI builds them without
importing torch.

Data flow: gearshift/train/cli.py (register_*) and tiny_lm / eagle3 main -> these parsers ->
tiny_lm.train / eagle3.train.
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_TOKENIZER = Path(__file__).resolve().parents[1] / "default_model" / "target"
DEFAULT_TOKEN_CACHE = Path(".cache") / "corpus_tokens"


def tiny_lm_args(ap: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    ap = ap or argparse.ArgumentParser(description="Train the default tiny Llama target.")
    ap.add_argument("--out", required=True, help="checkpoint directory to write")
    ap.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER),
                    help="directory holding tokenizer.json (default: the shipped one)")
    ap.add_argument("--data", default=None,
                    help="token-id cache directory (default: <out>_tokens next to --out)")
    ap.add_argument("--device", default="auto", help="cuda | cpu | auto")
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--minutes", type=float, default=6.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr", type=float, default=2e-4)
    ap.add_argument("--warmup-steps", type=int, default=200)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.0, help="residual-branch dropout")
    ap.add_argument("--max-epochs", type=float, default=None, help="caps --steps")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--max-files", type=int, default=None, help="first N files per split")
    ap.add_argument("--prepare-only", action="store_true",
                    help="build the token-id cache (e.g. to carry to another machine) and exit")
    ap.add_argument("--hidden-size", type=int, default=256)
    ap.add_argument("--intermediate-size", type=int, default=640)
    ap.add_argument("--num-layers", type=int, default=8)
    ap.add_argument("--num-heads", type=int, default=2)
    ap.add_argument("--num-kv-heads", type=int, default=1)
    ap.add_argument("--head-dim", type=int, default=128)
    return ap



def eagle3_args(ap: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    ap = ap or argparse.ArgumentParser(description="Train an EAGLE-3 draft head.")
    ap.add_argument("--target", required=True, help="target HF Llama checkpoint directory")
    ap.add_argument("--out", required=True, help="head directory to write")
    ap.add_argument("--data", default=None,
                    help="token ids: a .npy file, a dir with train.npy, or a corpus cache dir "
                         f"(default: {DEFAULT_TOKEN_CACHE}, built with the target's tokenizer)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda")
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup-steps", type=int, default=50)
    ap.add_argument("--grad-clip", type=float, default=0.5)
    ap.add_argument("--ttt-steps", type=int, default=5, choices=range(1, 8), metavar="3..7")
    ap.add_argument("--draft-vocab-size", type=int, default=3072)
    ap.add_argument("--intermediate-size", type=int, default=None, help="default: target's")
    ap.add_argument("--num-heads", type=int, default=None, help="default: target's")
    ap.add_argument("--num-kv-heads", type=int, default=None, help="default: target's")
    ap.add_argument("--aux-layers", type=int, nargs=3, default=None,
                    help="target layer ids (default [1, N//2-1, N-4])")
    ap.add_argument("--resume", default=None,
                    help="start from a saved head (its shape and draft vocabulary)")
    ap.add_argument("--no-init-from-target", dest="init_from_target", action="store_false",
                    help="random lm_head/norm instead of the target's rows")
    ap.add_argument("--save-dtype", choices=("bfloat16", "float16", "float32"),
                    default="bfloat16")
    ap.add_argument("--log-every", type=int, default=10)
    ap.set_defaults(record_command=True)
    return ap
