"""CLI argument resolution: --draft-model alone picks the speculative algorithm from the
directory (EAGLE-3 head -> eagle3, any other model -> draft); a bad directory is named."""

from __future__ import annotations

import argparse

import pytest

from gearshift.config import ConfigError
from gearshift.engine_args import add_engine_args, draft_algorithm, engine_kwargs
from gearshift.models.default import DEFAULT_MODEL_DIR


def test_draft_algorithm_from_directory(tmp_path) -> None:
    assert draft_algorithm(str(DEFAULT_MODEL_DIR / "eagle3")) == "eagle3"
    assert draft_algorithm(str(DEFAULT_MODEL_DIR / "target")) == "draft"
    with pytest.raises(SystemExit, match="no config.json"):
        draft_algorithm(str(tmp_path))


def test_engine_kwargs_infers_eagle3() -> None:
    p = argparse.ArgumentParser()
    add_engine_args(p)
    args = p.parse_args(["--draft-model", str(DEFAULT_MODEL_DIR / "eagle3")])
    assert engine_kwargs(args)["speculative_algorithm"] == "eagle3"
    args = p.parse_args(["--draft-model", "x", "--speculative-algorithm", "draft"])
    assert engine_kwargs(args)["speculative_algorithm"] == "draft"


def test_engine_flags_reach_the_config() -> None:
    p = argparse.ArgumentParser()
    add_engine_args(p)
    kw = engine_kwargs(p.parse_args(["--model", "m"]))
    assert kw["overlap_schedule"] is True and "extend_graph_max_tokens" not in kw
    kw = engine_kwargs(p.parse_args(["--model", "m", "--no-overlap-schedule",
                                     "--extend-graph-max-tokens", "0"]))
    assert kw["overlap_schedule"] is False and kw["extend_graph_max_tokens"] == 0
    assert "spec_warmup" not in kw
    kw = engine_kwargs(p.parse_args(["--model", "m", "--no-spec-warmup"]))
    assert kw["spec_warmup"] is False
    assert "spec_sampling" not in kw  # the engine's default
    kw = engine_kwargs(p.parse_args(["--model", "m", "--spec-sampling", "coupled"]))
    assert kw["spec_sampling"] == "coupled"
    with pytest.raises(SystemExit):
        p.parse_args(["--model", "m", "--spec-sampling", "exact"])


def test_the_embedded_model_speculates_unless_told_not_to(tmp_path) -> None:
    """The embedded default model ships its EAGLE-3 head: its engines speculate by default;
    --no-speculation / --speculative-algorithm none turn it off; another model speculates
    only with a draft named."""
    from gearshift.llm import build_engine_config

    p = argparse.ArgumentParser()
    add_engine_args(p)

    def config(*flags):
        return build_engine_config(**engine_kwargs(p.parse_args(["--device", "cpu", *flags])))

    assert config().speculative_algorithm == "eagle3" and config().draft_model is None
    assert config("--model", str(DEFAULT_MODEL_DIR / "target")).speculative_algorithm == "eagle3"
    assert config("--no-speculation").speculative_algorithm is None
    assert config("--speculative-algorithm", "none").speculative_algorithm is None
    assert config("--speculative-algorithm", "ngram").speculative_algorithm == "ngram"
    suffix = config("--speculative-algorithm", "suffix", "--num-draft-tokens", "32",
                    "--suffix-cache-tokens", "0")
    assert (suffix.speculative_algorithm, suffix.num_draft_tokens,
            suffix.suffix_cache_tokens) == ("suffix", 32, 0)
    with pytest.raises(ConfigError, match="suffix_cache_tokens"):
        config("--speculative-algorithm", "suffix", "--suffix-cache-tokens", "-1")
    assert build_engine_config(None, device="cpu", speculative_algorithm=None).speculative_algorithm is None
    other = tmp_path / "m"
    other.mkdir()
    assert build_engine_config(str(other), device="cpu").speculative_algorithm is None
    with pytest.raises(SystemExit, match="speculation is off"):
        engine_kwargs(p.parse_args(["--no-speculation", "--draft-model", "x"]))
