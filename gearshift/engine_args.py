"""The engine flags every command that builds an engine shares (`generate`, `serve`,
`bench ...`), and their translation into `LLM` / `EngineConfig` keyword arguments.

Data flow: argparse flags -> engine_kwargs(args) -> llm.build_engine_config -> Engine.
Imports nothing heavy: the CLI parses before loading torch.
"""

from __future__ import annotations

import argparse
import sys

from gearshift.config import SPEC_ALGORITHMS, EngineConfig

GPU_MEMORY_UTILIZATION = EngineConfig.__dataclass_fields__["gpu_memory_utilization"].default


class RenamedFlag(argparse.Action):
    """A flag's old name, kept for one release: it sets the new flag's value and warns,
    naming the new flag; --help lists only the new one."""

    def __init__(self, option_strings, dest, *, new: str, **kwargs) -> None:
        self.new = new
        super().__init__(option_strings, new.lstrip("-").replace("-", "_"),
                         help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"{parser.prog}: warning: {option_string} is deprecated and goes in the next "
              f"release: use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_engine_args(p: argparse.ArgumentParser, *, model_required: bool = False) -> None:
    """Flags shared by every command that builds an engine."""
    g = p.add_argument_group("engine")
    g.add_argument("--model", required=model_required,
                   help="Hugging Face model directory (default: the embedded default model)")
    g.add_argument("--preset", help="a config preset (gearshift/presets) instead of --model")
    g.add_argument("--load-format", choices=["safetensors", "dummy"], default="safetensors")
    g.add_argument("--device", help="cpu | cuda | cuda:N (default: cuda when available)")
    g.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="default: bfloat16 on a GPU, float32 on a CPU")
    g.add_argument("--max-num-seqs", type=int, default=None,
                   help="requests running at once (default: 64)")
    g.add_argument("--kv-cache-tokens", type=int, default=None,
                   help="KV cache slots (default: what --gpu-memory-utilization leaves after "
                        "the start-up memory profile; 16384 on a CPU)")
    g.add_argument("--max-num-batched-tokens", type=int, default=2048)
    g.add_argument("--max-model-len", type=int, default=None,
                   help="context length (default: the model's max_position_embeddings, at most "
                        "the KV cache)")
    g.add_argument("--allow-long-max-model-len", action="store_true",
                   help="accept --max-model-len past the model's max_position_embeddings "
                        "(positions it was never trained on: outputs may degrade)")
    g.add_argument("--tensor-parallel-size", "-tp", type=int, default=None,
                   help="split the model over N GPUs (one process each; default 1); under "
                        "torchrun, its WORLD_SIZE")
    g.add_argument("--tokenizer", help="tokenizer directory (default: the model directory's)")
    g.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="the share of the GPU's total memory the engine may use: weights, "
                        "activations, CUDA graphs and the KV cache, which takes what a "
                        "start-up profile of the largest steps leaves (default "
                        f"{GPU_MEMORY_UTILIZATION}, as vLLM's flag)")
    g.add_argument("--cpu-threads", type=int, default=None,
                   help="torch threads of a CPU run (default: usable CPUs - 1, at most 8 and at "
                        "most torch's own choice: oversubscribed threads slow a run many times)")
    g.add_argument("--attention-backend", choices=["torch", "triton"],
                   help="default: triton on a GPU, torch on a CPU")
    g.add_argument("--no-cuda-graphs", action="store_true")
    g.add_argument("--extend-graph-max-tokens", type=int, default=None,
                   help="CUDA graphs for prefill / mixed steps up to this many tokens (0 = off)")
    g.add_argument("--no-overlap-schedule", action="store_true",
                   help="plan each step only after the previous one finished (debugging)")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=True, help="reuse the KV of cached prompt prefixes (and the draft's)")
    g.add_argument("--disable-prefix-caching", dest="enable_prefix_caching",
                   action="store_false", help="the same as --no-enable-prefix-caching")
    g.add_argument("--step-trace", metavar="PATH",
                   help="write one JSON line per engine step to PATH (mode, batch, K, wall and "
                        "device ms, the host gap before it): benchmarks/trace_report.py")
    g.add_argument("--no-fuse-norms", action="store_true",
                   help="keep RMSNorm and residual adds in their own kernels (default on CUDA "
                        "with TMA: inside the GEMMs where they can be, else the norm alone)")
    g.add_argument("--seed", type=int, default=0)
    s = p.add_argument_group("speculative decoding")
    s.add_argument("--speculative-algorithm", choices=[*SPEC_ALGORITHMS, "none"],
                   help="default: eagle3 with the embedded head for the embedded default model, "
                        "else off unless --draft-model is given; none = off; eagle3+suffix / "
                        "draft+suffix: suffix decoding beside the model's drafts, a proposer "
                        "per request and step chosen by the policy")
    s.add_argument("--no-speculation", dest="speculative_algorithm", action="store_const",
                   const="none", help="the same as --speculative-algorithm none")
    s.add_argument("--draft-model", help="EAGLE-3 head or draft model directory")
    s.add_argument("--num-draft-tokens", type=int,
                   help="K: draft depth (default 4; at most 16, suffix decoding 32)")
    s.add_argument("--tree-width", type=int,
                   help="draft trees of this width (the top N per step); 1 = chains (default)")
    s.add_argument("--tree-budget", type=int,
                   help="nodes per draft tree, root included (default: from the depth and width)")
    s.add_argument("--draft-topk", action=RenamedFlag, new="--tree-width", type=int)
    s.add_argument("--num-verify-tokens", action=RenamedFlag, new="--tree-budget", type=int)
    s.add_argument("--spec-policy",
                   help="goodput (default: one K per step) | goodput-request (a K per request) | "
                        "always | off | threshold | random (a seeded K per request each step: "
                        "for soaks and tests)")
    s.add_argument("--spec-sampling", choices=["coupled", "rejection"],
                   help="how sampled tokens are verified: coupled (default; the text plain "
                        "decoding gives for the request's seed, hence the target's "
                        "distribution) or rejection (the target's distribution, other text); "
                        "a request's spec_sampling field wins")
    s.add_argument("--suffix-cache-tokens", type=int,
                   help="suffix decoding: recent outputs kept to draft from, in tokens "
                        "(default 65536; 0 = each request's own tokens only)")
    s.add_argument("--suffix-draft-tokens", type=int,
                   help="beside a model proposer (eagle3+suffix): the deepest suffix draft "
                        "(default 16, at most 32; --num-draft-tokens stays the model's)")
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
    if not getattr(args, "enable_prefix_caching", True):
        kw["enable_prefix_caching"] = False
    if getattr(args, "no_fuse_norms", False):
        kw["fuse_norms"] = False
    if getattr(args, "extend_graph_max_tokens", None) is not None:
        kw["extend_graph_max_tokens"] = args.extend_graph_max_tokens
    if args.attention_backend:
        kw["attention_backend"] = args.attention_backend
    if getattr(args, "allow_long_max_model_len", False):
        kw["allow_long_max_model_len"] = True
    if getattr(args, "gpu_memory_utilization", None) is not None:
        kw["gpu_memory_utilization"] = args.gpu_memory_utilization
    for name in ("tokenizer", "cpu_threads", "served_model_name", "chat_template",
                 "tensor_parallel_size", "step_trace"):
        if getattr(args, name, None) is not None:
            kw[name] = getattr(args, name)
    for name in ("speculative_algorithm", "draft_model", "num_draft_tokens", "tree_width",
                 "tree_budget", "spec_policy", "spec_sampling", "suffix_cache_tokens",
                 "suffix_draft_tokens"):
        if getattr(args, name, None) is not None:
            kw[name] = getattr(args, name)
    if kw.get("draft_model") and "speculative_algorithm" not in kw:
        kw["speculative_algorithm"] = draft_algorithm(kw["draft_model"])
    if kw.get("draft_model") and kw.get("speculative_algorithm") == "none":
        raise SystemExit("error: --draft-model names a draft, but speculation is off "
                         "(--no-speculation / --speculative-algorithm none)")
    check_engine_kwargs(kw)
    return kw


def check_engine_kwargs(kw: dict) -> None:
    """EngineConfig's own checks on the flags' values, before anything heavy is imported:
    a bad value ends the command at once (ConfigError), not after torch and the model load.
    Defaults that need torch (the device, its dtype) stand in as the CPU's."""
    fixed = {"model": kw.get("model") or "-", "device": kw.get("device") or "cpu",
             "dtype": kw.get("dtype") or "float32"}
    if kw.get("max_num_seqs") is None:
        fixed["max_num_seqs"] = 64
    if kw.get("speculative_algorithm") == "none":  # off (build_engine_config's reading)
        fixed["speculative_algorithm"] = None
    known = EngineConfig.__dataclass_fields__  # build_engine_config names any other key
    EngineConfig(**{k: v for k, v in {**kw, **fixed}.items() if k in known})


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
