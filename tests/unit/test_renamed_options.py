"""One name each for the tree's width and budget: `tree_width` / `tree_budget` in the engine
options, `--tree-width` / `--tree-budget` on every command (`bench sweep` included). The old
names (draft_topk / --draft-topk / --tree-topk, num_verify_tokens / --num-verify-tokens /
--tree-tokens) still work for one release and warn, naming the new one."""

from __future__ import annotations

import argparse

import pytest

from gearshift.bench.sweep import add_args as add_sweep_args
from gearshift.config import ConfigError, EngineConfig
from gearshift.engine_args import add_engine_args, engine_kwargs
from gearshift.llm import build_engine_config

TREE = dict(speculative_algorithm="ngram", device="cpu", num_draft_tokens=3)


def test_the_new_option_names_build_the_tree() -> None:
    cfg = build_engine_config("m", **{**TREE, "speculative_algorithm": "eagle3"},
                              tree_width=2, tree_budget=6)
    assert (cfg.tree_width, cfg.tree_budget, cfg.verify_nodes) == (2, 6, 6)
    with pytest.raises(ConfigError, match="tree_budget must be in"):
        EngineConfig(model="m", speculative_algorithm="eagle3", tree_width=2, tree_budget=99)
    with pytest.raises(ConfigError, match="tree_width must be 1"):
        EngineConfig(model="m", speculative_algorithm="ngram", tree_width=2)


def test_old_option_names_warn_and_still_work() -> None:
    with pytest.warns(FutureWarning, match="draft_topk is deprecated.*use tree_width"):
        cfg = build_engine_config("m", **{**TREE, "speculative_algorithm": "eagle3"},
                                  draft_topk=2)
    assert cfg.tree_width == 2
    with pytest.warns(FutureWarning, match="num_verify_tokens is deprecated.*use tree_budget"):
        cfg = build_engine_config("m", **TREE, num_verify_tokens=3)
    assert cfg.tree_budget == 3
    with pytest.raises(ConfigError, match="draft_topk is the old name of tree_width"):
        build_engine_config("m", **TREE, draft_topk=1, tree_width=1)


def _parser(add) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gearshift")
    add(p)
    return p


def test_old_flags_warn_naming_the_new_ones(capsys) -> None:
    p = _parser(add_engine_args)
    kw = engine_kwargs(p.parse_args(["--model", "m", "--tree-width", "3", "--tree-budget", "8"]))
    assert (kw["tree_width"], kw["tree_budget"]) == (3, 8)
    assert capsys.readouterr().err == ""
    kw = engine_kwargs(p.parse_args(["--model", "m", "--draft-topk", "3",
                                     "--num-verify-tokens", "8"]))
    assert (kw["tree_width"], kw["tree_budget"]) == (3, 8)
    err = capsys.readouterr().err
    assert "--draft-topk is deprecated" in err and "use --tree-width" in err
    assert "--num-verify-tokens is deprecated" in err and "use --tree-budget" in err
    assert "--draft-topk" not in p.format_help()  # listed under its new name only


def test_bench_sweep_takes_the_engine_tree_flags(capsys) -> None:
    p = _parser(add_sweep_args)
    args = p.parse_args([])
    assert (args.tree_width, args.tree_budget) == (4, 16)  # the sweep's tree unless told
    args = p.parse_args(["--tree-topk", "1", "--tree-tokens", "5"])
    assert (args.tree_width, args.tree_budget) == (1, 5)
    err = capsys.readouterr().err
    assert "--tree-topk is deprecated" in err and "use --tree-width" in err
    assert "--tree-tokens is deprecated" in err and "use --tree-budget" in err
