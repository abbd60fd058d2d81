"""Shared pytest fixtures: tiny HF checkpoints (built once per session) and the engine's
idle invariant.

Data flow (tests only): tests/checkpoints.py -> session-scoped model dirs -> LLM under test.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before anything imports triton: kernels run interpreted
    os.environ.setdefault("TRITON_INTERPRET", "1")

import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from checkpoints import ARCHS, assert_idle_invariant, make_tiny_checkpoint  # noqa: E402
from interpreter_compat import interpreter_problem  # noqa: E402


def pytest_configure(config) -> None:
    """On CPU every Triton kernel runs interpreted: stop at once, with the reason, where the
    interpreter cannot run them (not with ~90 TypeErrors from inside Triton)."""
    if os.environ.get("TRITON_INTERPRET") == "1" and (problem := interpreter_problem()):
        raise pytest.UsageError(problem)


def _quiet_transformers() -> None:
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


_quiet_transformers()


@pytest.fixture(autouse=True)
def _quiet_gearshift_logs() -> None:
    """gearshift logs start-up progress at INFO by default, and the CLI sets the level:
    tests keep it at WARNING unless they ask otherwise."""
    logging.getLogger("gearshift").setLevel(logging.WARNING)


# Tiny models gain nothing from intra-op threads, and on a shared 2-core CI box spinning
# worker threads make every forward ~10x slower.
torch.set_num_threads(1)


# ---- tiny checkpoints, built once per session -------------------------------------------

_CACHE: dict[tuple, Path] = {}


def _checkpoint(factory: pytest.TempPathFactory, name: str, arch: str, **kwargs) -> Path:
    key = (name, arch, tuple(sorted(kwargs.items())))
    if key not in _CACHE:
        _CACHE[key] = make_tiny_checkpoint(factory.mktemp(name), arch, **kwargs)
    return _CACHE[key]


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(tmp_path_factory, "llama", "llama")


@pytest.fixture(scope="session")
def tiny_llama3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(tmp_path_factory, "llama3", "llama3")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(tmp_path_factory, "qwen2", "qwen2")


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(tmp_path_factory, "qwen3", "qwen3")


@pytest.fixture(scope="session")
def tiny_llama_sharded_tied_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama with tied embeddings (no lm_head.weight stored), split over several shards."""
    return _checkpoint(
        tmp_path_factory, "llama_sharded_tied", "llama", sharded=True, tie_word_embeddings=True
    )


@pytest.fixture(scope="session")
def tiny_no_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model directory with config + weights only: token-id prompts must still work."""
    return _checkpoint(tmp_path_factory, "llama_no_tok", "llama", with_tokenizer=False)


ALL_TINY = (*ARCHS, "llama_sharded_tied")


@pytest.fixture(scope="session", params=ALL_TINY)
def tiny_model_dir(request: pytest.FixtureRequest, tmp_path_factory) -> Path:
    """Every tiny architecture in turn (the test id names it)."""
    if request.param == "llama_sharded_tied":
        return request.getfixturevalue("tiny_llama_sharded_tied_dir")
    return _checkpoint(tmp_path_factory, request.param, request.param)


# ---- engine construction -----------------------------------------------------------------

CPU_ENGINE_DEFAULTS = dict(
    device="cpu",
    dtype="float32",
    attention_backend="torch",
    max_num_seqs=8,
    kv_cache_tokens=4096,
    max_num_batched_tokens=512,
)


@pytest.fixture
def make_llm() -> Iterator[Callable[..., object]]:
    """Factory for `LLM(model=dir, **CPU_ENGINE_DEFAULTS | overrides)`.

    Every engine it built is checked for the idle invariant at teardown.
    """
    from gearshift import LLM

    built: list = []

    def factory(model_dir: str | Path, **overrides):
        llm = LLM(model=str(model_dir), **{**CPU_ENGINE_DEFAULTS, **overrides})
        built.append(llm)
        return llm

    yield factory
    for llm in built:
        assert_idle_invariant(llm)
