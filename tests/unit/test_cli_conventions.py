"""vLLM-style command-line conventions: `gearshift --version`, --log-level before or after
the subcommand, defaults in every --help, `serve MODEL` (or --model, not both), and the
flags that map onto engine options (--gpu-memory-utilization -> gpu_memory_utilization, ...).

Data flow (tests only): argv -> gearshift.cli (parsers, main) -> namespace / engine kwargs /
exit code and stderr.
"""

from __future__ import annotations

import argparse
import socket

import pytest

import gearshift
from gearshift.cli import _every_subparser, build_parser, main, named_command
from gearshift.engine_args import engine_kwargs


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"gearshift {gearshift.__version__}"
    with pytest.raises(SystemExit) as e:  # through the full parser
        main(["--log-level", "ERROR", "--version"])
    assert e.value.code == 0
    assert gearshift.__version__ in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "level"), [
    (["serve"], "INFO"),
    (["--log-level", "ERROR", "serve"], "ERROR"),
    (["serve", "--log-level", "debug"], "DEBUG"),
    (["--log-level", "ERROR", "serve", "--log-level", "WARNING"], "WARNING"),
    (["bench", "offline", "--log-level", "DEBUG"], "DEBUG"),
    (["generate", "--prompt", "x", "--log-level", "warning"], "WARNING"),
])
def test_log_level_before_or_after_the_subcommand(argv, level):
    assert build_parser(named_command(argv)).parse_args(argv).log_level == level


def test_log_level_is_checked():
    with pytest.raises(SystemExit):
        build_parser("serve").parse_args(["serve", "--log-level", "LOUD"])


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_every_help_shows_the_defaults():
    parsers = list(_every_subparser(build_parser()))
    assert len(parsers) >= 10  # every subcommand, bench's included
    for p in parsers:
        text = _flat(p.format_help())
        for action in p._actions:
            default = action.default
            if (not action.option_strings or default is None or default is False
                    or default == argparse.SUPPRESS or "default" in (action.help or "").lower()
                    or action.help == argparse.SUPPRESS):  # hidden: an old flag's name
                continue
            assert f"(default: {default})" in text, (p.prog, action.option_strings)
    serve = _flat(build_parser("serve")._subparsers._group_actions[0].choices["serve"]
                  .format_help())
    assert "--port PORT (default: 8000)" in serve
    assert "total memory the engine may use" in serve and "(default 0.9, as vLLM" in serve


def _serve_args(argv: list[str]) -> argparse.Namespace:
    return build_parser("serve").parse_args(["serve", *argv])


def test_serve_takes_the_model_as_a_positional():
    assert _serve_args(["some/dir", "--port", "1"]).model_tag == "some/dir"
    assert _serve_args(["--port", "1", "some/dir"]).model_tag == "some/dir"
    assert _serve_args(["--model", "d"]).model_tag is None


def test_serve_model_given_twice_is_an_error(capsys):
    assert main(["serve", "a", "--model", "b"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gearshift serve: error:") and "'a'" in err and "'b'" in err
    assert "\n" not in err


def test_engine_flags_map_onto_engine_options():
    args = _serve_args(["m", "--model", "x", "--gpu-memory-utilization", "0.5", "--tokenizer",
                        "tok", "--cpu-threads", "3", "--allow-long-max-model-len",
                        "--served-model-name", "org/name", "--chat-template", "{{ x }}"])
    kw = engine_kwargs(args)
    assert kw["gpu_memory_utilization"] == 0.5 and kw["tokenizer"] == "tok"
    assert kw["cpu_threads"] == 3 and kw["allow_long_max_model_len"] is True
    assert kw["served_model_name"] == "org/name" and kw["chat_template"] == "{{ x }}"
    kw = engine_kwargs(_serve_args(["--model", "x"]))
    assert not {"gpu_memory_utilization", "tokenizer", "cpu_threads", "allow_long_max_model_len",
                "served_model_name", "chat_template"} & set(kw)


def test_busy_port_stops_serve_before_the_model_loads(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # a model that does not exist: the port is checked first, so the port is named
        assert main(["serve", "/no/such/model", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"gearshift serve: error: port {port} on 127.0.0.1 is already in use: pick "
                   "another with --port")


def test_port_out_of_range(capsys):
    assert main(["serve", "--port", "70000"]) == 2
    assert "port 70000" in capsys.readouterr().err
