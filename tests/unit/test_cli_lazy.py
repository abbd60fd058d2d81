"""The `gearshift` CLI registers only the subcommand it runs: importing it, or running a
subcommand, loads no bench or server module (nor torch) unless that subcommand needs them;
every subcommand's --help still parses."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from gearshift.cli import COMMANDS, build_parser, named_command

ROOT = Path(__file__).resolve().parents[2]

LOADED = """
import sys
print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('gearshift.')}
             & {'bench', 'server'}), 'torch' in sys.modules)
"""


def _python(code: str) -> str:
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip().splitlines()[-1]


def test_importing_the_cli_loads_no_bench_server_or_torch():
    assert _python("import gearshift.cli\n" + LOADED) == "[] False"


@pytest.mark.parametrize("argv,loaded", [
    (["generate", "--help"], "[] False"),
    (["make-bench-model", "--help"], "[] False"),
    (["serve", "--help"], "['server'] False"),
])
def test_a_subcommand_loads_only_its_own_modules(argv, loaded):
    code = ("import contextlib, io\nfrom gearshift.cli import main\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            f"    main({argv!r})\n" + LOADED)
    assert _python(code) == loaded


@pytest.mark.parametrize("argv,expect", [
    (["bench", "--help"], ["offline", "sweep", "serve", "soak"]),
    (["bench", "sweep", "--help"], ["--policies", "--model"]),
    (["serve", "--help"], ["--port", "--api-key", "--model"]),
    (["--help"], list(COMMANDS)),
])
def test_help_still_parses(argv, expect):
    res = subprocess.run([sys.executable, "-m", "gearshift.cli", *argv], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    for word in expect:
        assert word in res.stdout


@pytest.mark.parametrize("argv,command", [
    (["bench", "sweep", "--help"], "bench"),
    (["--log-level", "DEBUG", "serve", "--port", "1"], "serve"),
    (["train-eagle3", "-h"], "train-eagle3"),
    (["--help"], None),
    (["-h", "bench"], None),  # the top-level help, listing every subcommand
    (["--bogus", "bench"], None),  # the full parser's error
    (["benhc"], None),
    ([], None),
])
def test_named_command_reads_argv_as_the_parser_does(argv, command):
    assert named_command(argv) == command


def test_each_registration_adds_the_subcommand_it_is_named_for():
    """COMMANDS maps a name to the function that registers it: the lazy parser for that name
    has exactly that subcommand, and the full parser has them all, in order."""
    def names(parser):
        return list(parser._subparsers._group_actions[0].choices)

    assert names(build_parser()) == list(COMMANDS)
    for name in COMMANDS:
        assert names(build_parser(name)) == [name]


def test_bench_without_its_extra_stops_at_once_with_the_install_command(monkeypatch, capsys):
    """rich and matplotlib come with the [bench] extra: without them `gearshift bench ...`
    says so before measuring anything (its --help still works)."""
    import sys

    from gearshift.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(SystemExit) as e:
        main(["bench", "sweep", "--model", "nowhere"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "[bench] extra (matplotlib not installed)" in err
    assert "pip install 'gearshift[bench]'" in err
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0


def test_full_help_loads_no_torch_and_answers_within_a_second():
    """`gearshift --help` builds every subcommand's parser (bench and server modules load)
    without torch, transformers or numpy: it answers in well under a second."""
    code = ("import contextlib, io, sys\nfrom gearshift.cli import main\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['--help'])\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', "
            "'numpy'}), sorted({m.split('.')[1] for m in sys.modules "
            "if m.startswith('gearshift.')} & {'bench', 'server', 'train'}))")
    assert _python(code) == "[] ['bench', 'server', 'train']"
    best = min(_timed([sys.executable, "-m", "gearshift.cli", "--help"]) for _ in range(3))
    assert best < 1.0, f"gearshift --help took {best:.2f} s"


def _timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return time.perf_counter() - t0


@pytest.mark.parametrize("argv,message", [
    (["serve", "--max-model-len", "0"], "max_model_len must be >= 2, not 0"),
    (["generate", "--prompt", "x", "--max-model-len", "1"], "max_model_len must be >= 2, not 1"),
    (["serve", "--max-num-seqs", "0"], "max_num_seqs must be >= 1"),
    (["bench", "offline", "--max-num-batched-tokens", "0"], "max_num_batched_tokens must be >= 1"),
])
def test_a_bad_engine_flag_stops_at_once_in_one_line(argv, message):
    """Engine flags are checked before torch loads (or a model, or a server starts): exit
    code 2 and one line naming the value."""
    code = ("import contextlib, sys\nfrom gearshift.cli import main\n"
            f"rc = main({argv!r})\n"
            "print(rc, 'torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.stdout.split() == ["2", "False"], res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gearshift {argv[0]}: error: ")
    assert message in lines[0]
