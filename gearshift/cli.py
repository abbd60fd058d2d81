"""`gearshift` command line: generate, serve, bench offline|serve, train-tiny-lm,
make-bench-model. Each subcommand lives beside the code it drives and registers itself
here; bad input ends with a one-line message and exit code 2.

Data flow: argv -> argparse -> subcommand -> LLM / server / bench / train.
"""

from __future__ import annotations

import argparse
import logging
import sys


def add_engine_args(p: argparse.ArgumentParser, *, model_required: bool = False) -> None:
    """Flags shared by every command that builds an engine."""
    g = p.add_argument_group("engine")
    g.add_argument("--model", required=model_required,
                   help="Hugging Face model directory (default: the embedded default model)")
    g.add_argument("--preset", help="a config preset (gearshift/presets) instead of --model")
    g.add_argument("--load-format", choices=["safetensors", "dummy"], default="safetensors")
    g.add_argument("--device", help="cpu | cuda | cuda:N (default: cuda when available)")
    g.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    g.add_argument("--max-num-seqs", type=int, default=None)
    g.add_argument("--kv-cache-tokens", type=int, default=None)
    g.add_argument("--max-num-batched-tokens", type=int, default=2048)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--attention-backend", choices=["torch", "triton"])
    g.add_argument("--no-cuda-graphs", action="store_true")
    g.add_argument("--extend-graph-max-tokens", type=int, default=None,
                   help="CUDA graphs for prefill / mixed steps up to this many tokens (0 = off)")
    g.add_argument("--no-overlap-schedule", action="store_true",
                   help="plan each step only after the previous one finished (debugging)")
    g.add_argument("--no-fuse-norms", action="store_true",
                   help="keep RMSNorm and residual adds in their own kernels (default on CUDA "
                        "with TMA: inside the GEMMs where they can be, else the norm alone)")
    g.add_argument("--seed", type=int, default=0)
    s = p.add_argument_group("speculative decoding")
    s.add_argument("--speculative-algorithm", choices=["eagle3", "draft", "ngram"],
                   help="off unless given; eagle3 without --draft-model uses the embedded head")
    s.add_argument("--draft-model", help="EAGLE-3 head or draft model directory")
    s.add_argument("--num-draft-tokens", type=int, help="K: draft depth (default 4)")
    s.add_argument("--draft-topk", type=int, help="1 = chain (default); > 1 = tree width")
    s.add_argument("--num-verify-tokens", type=int, help="tree budget incl. the root")
    s.add_argument("--spec-policy",
                   help="goodput (default) | always | off | threshold | threshold-vllm | random")
    s.add_argument("--no-spec-warmup", action="store_true",
                   help="skip the start-up run of every (batch, K) step shape (graphs + costs)")


def engine_kwargs(args: argparse.Namespace) -> dict:
    if args.preset and args.model:
        raise SystemExit("error: pass either --model or --preset, not both")
    if args.preset and args.load_format != "dummy":
        raise SystemExit("error: --preset has no weights; add --load-format dummy")
    kw = dict(model=args.preset or args.model, device=args.device, dtype=args.dtype,
              max_num_seqs=args.max_num_seqs, kv_cache_tokens=args.kv_cache_tokens,
              seed=args.seed, load_format=args.load_format,
              max_num_batched_tokens=args.max_num_batched_tokens,
              max_model_len=args.max_model_len, cuda_graphs=not args.no_cuda_graphs,
              overlap_schedule=not getattr(args, "no_overlap_schedule", False))
    if getattr(args, "no_spec_warmup", False):
        kw["spec_warmup"] = False
    if getattr(args, "no_fuse_norms", False):
        kw["fuse_norms"] = False
    if getattr(args, "extend_graph_max_tokens", None) is not None:
        kw["extend_graph_max_tokens"] = args.extend_graph_max_tokens
    if args.attention_backend:
        kw["attention_backend"] = args.attention_backend
    for name in ("speculative_algorithm", "draft_model", "num_draft_tokens", "draft_topk",
                 "num_verify_tokens", "spec_policy"):
        if getattr(args, name, None) is not None:
            kw[name] = getattr(args, name)
    if kw.get("draft_model") and "speculative_algorithm" not in kw:
        kw["speculative_algorithm"] = draft_algorithm(kw["draft_model"])
    return kw


def draft_algorithm(draft_dir: str) -> str:
    """`eagle3` for a directory holding an EAGLE-3 head, `draft` for any other model: what
    --draft-model means when --speculative-algorithm is not given."""
    import json
    from pathlib import Path

    from gearshift.models.eagle3_loader import EAGLE3_ARCHITECTURES

    cfg = Path(draft_dir) / "config.json"
    if not cfg.is_file():
        raise SystemExit(f"error: --draft-model {draft_dir}: no config.json there")
    try:
        archs = json.loads(cfg.read_text()).get("architectures") or []
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: --draft-model {draft_dir}: unreadable config.json ({e})") from e
    return "eagle3" if any(a in EAGLE3_ARCHITECTURES for a in archs) else "draft"


def _generate(args: argparse.Namespace) -> int:
    from gearshift import LLM, SamplingParams

    llm = LLM(**engine_kwargs(args))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k, seed=args.sampling_seed,
                            stop=args.stop or None, ignore_eos=args.ignore_eos)
    for prompt, out in zip(args.prompt, llm.generate(args.prompt, params)):
        print((prompt if args.echo else "") + out.text)
    return 0


def _register_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate text offline from one or more prompts")
    add_engine_args(p)
    p.add_argument("--prompt", action="append", required=True, help="repeat for several prompts")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--sampling-seed", type=int, default=None)
    p.add_argument("--stop", action="append")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--echo", action="store_true", help="print the prompt before the completion")
    p.set_defaults(func=_generate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gearshift", description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-level", default="WARNING")
    sub = parser.add_subparsers(dest="command", required=True)
    _register_generate(sub)
    from gearshift.bench.cli import register as register_bench
    from gearshift.server.cli import register as register_serve
    from gearshift.train.cli import register as register_train

    register_serve(sub)
    register_bench(sub)
    register_train(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    from gearshift.config import ConfigError
    from gearshift.request import SamplingParamsError

    try:
        return int(args.func(args) or 0)
    except (ConfigError, SamplingParamsError, ValueError, FileNotFoundError) as e:
        print(f"gearshift {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
