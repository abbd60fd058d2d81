"""Start-up checks that stop a run with one clear line before anything loads: a CUDA
device without CUDA, the Triton backend on a CPU without the interpreter, max_model_len
past the model's positions (unless allowed); and the default CPU thread count.

Data flow (tests only): EngineConfig / argv -> runner/startup_checks.py (or gearshift.cli
main) -> ConfigError / exit code 2 with its line on stderr.
"""

from __future__ import annotations

import pytest
import torch

from gearshift.cli import main
from gearshift.config import ConfigError, EngineConfig, ModelConfig
from gearshift.models.loader import resolve_model_config
from gearshift.runner import startup_checks
from gearshift.runner.startup_checks import (
    check_device,
    context_limit,
    default_cpu_threads,
    set_cpu_threads,
)

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")


@no_cuda
def test_cuda_device_without_cuda():
    with pytest.raises(ConfigError, match="device 'cuda'.*use --device cpu"):
        check_device(EngineConfig(model="m", device="cuda"))


@no_cuda
def test_cli_cuda_without_cuda_is_one_line(capsys):
    assert main(["generate", "--device", "cuda", "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("gearshift generate: error: device 'cuda':")
    assert not any("Traceback" in line for line in err)


def test_unknown_device():
    with pytest.raises(ConfigError, match="cpu, cuda or cuda:N"):
        check_device(EngineConfig(model="m", device="gpu0"))


def test_triton_on_cpu_needs_the_interpreter(monkeypatch, capsys):
    config = EngineConfig(model="m", device="cpu", attention_backend="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    check_device(config)  # the tests' path: kernels interpreted
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ConfigError, match="--attention-backend torch"):
        check_device(config)
    assert main(["generate", "--device", "cpu", "--attention-backend", "triton",
                 "--prompt", "x"]) == 2
    assert "triton attention backend needs a CUDA GPU" in capsys.readouterr().err


def _model_config() -> ModelConfig:
    return resolve_model_config("llama-3.2-1b")[0]  # max_position_embeddings 131072


def test_max_model_len_past_the_model_needs_the_flag():
    cfg = _model_config()
    assert context_limit(EngineConfig(model="m"), cfg) == 131072
    assert context_limit(EngineConfig(model="m", max_model_len=4096), cfg) == 4096
    with pytest.raises(ConfigError, match="--allow-long-max-model-len"):
        context_limit(EngineConfig(model="m", max_model_len=200_000), cfg)
    allowed = EngineConfig(model="m", max_model_len=200_000, allow_long_max_model_len=True)
    assert context_limit(allowed, cfg) == 200_000


@pytest.mark.parametrize(("cpus", "torch_threads", "expected"), [
    (1, 1, 1), (2, 2, 1), (4, 4, 3), (64, 64, 8), (64, 2, 2),
])
def test_default_cpu_threads(monkeypatch, cpus, torch_threads, expected):
    monkeypatch.setattr(startup_checks, "usable_cpus", lambda: cpus)
    monkeypatch.setattr(torch, "get_num_threads", lambda: torch_threads)
    assert default_cpu_threads() == expected


def test_usable_cpus_honours_a_cgroup_quota(monkeypatch):
    monkeypatch.setattr(startup_checks.os, "sched_getaffinity", lambda _: set(range(64)))
    monkeypatch.setattr(startup_checks, "_cgroup_quota", lambda: 2)
    assert startup_checks.usable_cpus() == 2
    monkeypatch.setattr(startup_checks, "_cgroup_quota", lambda: None)
    assert startup_checks.usable_cpus() == 64


def test_cpu_threads_are_set(monkeypatch):
    before = torch.get_num_threads()
    try:
        assert set_cpu_threads(EngineConfig(model="m", cpu_threads=2)) == 2
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ConfigError, match="cpu_threads"):
        EngineConfig(model="m", cpu_threads=0)


@pytest.mark.parametrize("length", [-1, 0, 1])
def test_a_context_without_room_for_a_prompt_and_a_token_is_refused(length):
    with pytest.raises(ConfigError, match=f"max_model_len must be >= 2, not {length}"):
        EngineConfig(model="m", max_model_len=length)
    assert EngineConfig(model="m", max_model_len=2).max_model_len == 2
