"""`gearshift` command line: generate, serve, bench offline|serve, train-tiny-lm,
make-bench-model. Each subcommand lives beside the code it drives and registers itself
here; bad input ends with a one-line message and exit code 2.

Data flow: argv -> argparse -> subcommand -> LLM / server / bench / train.
"""

from __future__ import annotations

import argparse
import logging
import sys

from gearshift.engine_args import add_engine_args, engine_kwargs


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
