"""`gearshift` command line: generate, serve, bench, train-tiny-lm, train-eagle3,
make-bench-model. Each subcommand lives beside the code it drives and registers itself
here; bad input ends with a one-line message and exit code 2.

Registration is lazy: `main` reads which subcommand argv names and imports only that one's
module (the bench and the server pull in torch, uvicorn, ...); `gearshift --help` or an
unknown name builds every subcommand, so the listing and the errors are argparse's own.
Every parser shows its options' defaults in --help and takes --log-level (INFO by default:
start-up phases report their time) before or after the subcommand.

Data flow: argv -> argparse -> subcommand -> LLM / server / bench / train.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys

from gearshift import __version__
from gearshift.engine_args import add_engine_args, engine_kwargs
from gearshift.logs import LEVELS, set_log_level

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
    kwargs = engine_kwargs(args)  # checked before torch loads
    from gearshift import LLM, SamplingParams

    llm = LLM(**kwargs)
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


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows every option's default, options without help text included, unless the
    help already speaks of it; None and False defaults (unset, off) are left out."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("default" in text.lower() or not action.option_strings or action.default is None
                or action.default is False or action.default == argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)".lstrip()

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and (text := self._get_help_string(action)):
            action = copy.copy(action)  # argparse prints nothing for an option without help
            action.help = text
        return super()._format_action(action)


class Parser(argparse.ArgumentParser):
    """The `gearshift` parsers: subcommands (`add_subparsers`) are built as this class too."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def _log_level_option(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--log-level", type=str.upper, choices=LEVELS, default=default,
                        help="gearshift's messages: INFO (the default) shows start-up progress "
                             "and timings")


def _every_subparser(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield sub
                yield from _every_subparser(sub)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `gearshift` parser with subcommand `command` only (its module alone is imported),
    or with every subcommand (None)."""
    parser = Parser(prog="gearshift", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"gearshift {__version__}")
    _log_level_option(parser, "INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, target in COMMANDS.items():
        if command is None or name == command:
            module, function = target.split(":")
            getattr(importlib.import_module(module), function)(sub)
    for p in _every_subparser(parser):  # SUPPRESS: absent there, the top level's value stands
        _log_level_option(p, argparse.SUPPRESS)
    return parser


def named_command(argv: list[str]) -> str | None:
    """The subcommand argv names, read as the full parser reads it (the top-level options,
    then the name, then the subcommand's own arguments); None for `gearshift --help`, a
    typo or an unknown option before the name: the full parser answers those."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--log-level")
    pre.add_argument("-h", "--help", "--version", action="store_true")
    pre.add_argument("command", nargs="?")
    pre.add_argument("rest", nargs=argparse.REMAINDER)  # the subcommand's, --help included
    known, unknown = pre.parse_known_args(argv)
    if known.help or unknown or known.command not in COMMANDS:
        return None
    return known.command


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--version"]:  # without building (importing) every subcommand
        print(f"gearshift {__version__}")
        return 0
    args = build_parser(named_command(argv)).parse_args(argv)
    set_log_level(args.log_level)
    from gearshift.config import ConfigError
    from gearshift.request import SamplingParamsError

    try:
        return int(args.func(args) or 0)
    except (ConfigError, SamplingParamsError, ValueError, FileNotFoundError) as e:
        print(f"gearshift {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
