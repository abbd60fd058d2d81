"""`gearshift` command line: generate, serve, bench, train-tiny-lm, train-eagle3,
make-bench-model. Each subcommand lives beside the code it drives and registers itself
here; bad input ends with a one-line message and exit code 2.

Registration is lazy: `main` reads which subcommand argv names and imports only that one's
module (the bench and the server pull in torch, uvicorn, ...); `gearshift --help` or an
unknown name builds every subcommand, so the listing and the errors are argparse's own.

Data flow: argv -> argparse -> subcommand -> LLM / server / bench / train.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from gearshift.engine_args import add_engine_args, engine_kwargs

# subcommand -> "module:function" that adds its parser to the `gearshift` subparsers,
# in the order `gearshift --help` lists them
COMMANDS = {
    "generate": "gearshift.cli:register_generate",
    "serve": "gearshift.server.cli:register",
    "bench": "gearshift.bench.cli:register",
    "train-tiny-lm": "gearshift.train.cli:register_tiny_lm",
    "train-eagle3": "gearshift.train.cli:register_eagle3",
    "make-bench-model": "gearshift.train.cli:register_make_bench_model",
}


def _generate(args: argparse.Namespace) -> int:
    from gearshift import LLM, SamplingParams

    llm = LLM(**engine_kwargs(args))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k, seed=args.sampling_seed,
                            stop=args.stop or None, ignore_eos=args.ignore_eos)
    for prompt, out in zip(args.prompt, llm.generate(args.prompt, params)):
        print((prompt if args.echo else "") + out.text)
    return 0


def register_generate(sub) -> None:
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


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `gearshift` parser with subcommand `command` only (its module alone is imported),
    or with every subcommand (None)."""
    parser = argparse.ArgumentParser(prog="gearshift", description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-level", default="WARNING")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, target in COMMANDS.items():
        if command is None or name == command:
            module, function = target.split(":")
            getattr(importlib.import_module(module), function)(sub)
    return parser


def named_command(argv: list[str]) -> str | None:
    """The subcommand argv names, read as the full parser reads it (the top-level options,
    then the name, then the subcommand's own arguments); None for `gearshift --help`, a
    typo or an unknown option before the name: the full parser answers those."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--log-level")
    pre.add_argument("-h", "--help", action="store_true")
    pre.add_argument("command", nargs="?")
    pre.add_argument("rest", nargs=argparse.REMAINDER)  # the subcommand's, --help included
    known, unknown = pre.parse_known_args(argv)
    if known.help or unknown or known.command not in COMMANDS:
        return None
    return known.command


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(named_command(argv)).parse_args(argv)
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
