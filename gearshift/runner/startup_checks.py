"""Start-up checks, run before any weight loads, each failing with one line that names the
problem and the way out: the device exists, the attention backend can run on it, and the
context fits the model's positions; plus the CPU thread count of CPU runs.

Data flow: ModelRunner.__init__ -> check_device(config), set_cpu_threads(config),
context_limit(config, model_cfg) -> the positions RoPE is built for.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch

from gearshift import env
from gearshift.config import ConfigError, EngineConfig, ModelConfig

log = logging.getLogger("gearshift.runner")

MAX_DEFAULT_CPU_THREADS = 8


def check_device(config: EngineConfig) -> None:
    device = config.device
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ConfigError(f"device must be cpu, cuda or cuda:N, not {device!r}")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            why = ("this torch build has no CUDA support" if torch.version.cuda is None
                   else "torch finds no CUDA GPU")
            raise ConfigError(f"device {device!r}: {why} (torch {torch.__version__}); "
                              "use --device cpu")
        index = torch.device(device).index
        if index is not None and index >= torch.cuda.device_count():
            raise ConfigError(f"device {device!r}: only {torch.cuda.device_count()} CUDA "
                              "device(s) visible")
    elif config.attention_backend == "triton" and not env.triton_interpret():
        raise ConfigError("the triton attention backend needs a CUDA GPU: on a CPU use "
                          "--attention-backend torch (TRITON_INTERPRET=1 runs the kernels in "
                          "Triton's interpreter, for tests)")


def context_limit(config: EngineConfig, model_cfg: ModelConfig) -> int:
    """The positions the model is built for: max_model_len, or the model's own limit. Past
    max_position_embeddings the model never saw a position and its output degrades, so
    that needs allow_long_max_model_len."""
    trained = model_cfg.max_position_embeddings
    if config.max_model_len is None:
        return trained
    if config.max_model_len > trained:
        if not config.allow_long_max_model_len:
            raise ConfigError(
                f"max_model_len {config.max_model_len} exceeds the model's "
                f"max_position_embeddings {trained}; pass --allow-long-max-model-len "
                "(allow_long_max_model_len=True) to use positions it was not trained on")
        log.warning("max_model_len %d exceeds the model's max_position_embeddings %d: "
                    "outputs past position %d may be wrong", config.max_model_len, trained,
                    trained)
    return config.max_model_len


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota (a
    container limited to 2 CPUs on a 64-core host reports 64 to torch)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cpus, quota) if quota else cpus)


def _cgroup_quota() -> int | None:
    try:
        v2 = Path("/sys/fs/cgroup/cpu.max")
        if v2.is_file():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else max(1, int(quota) // int(period))
        v1 = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
        if v1.is_file():
            quota = int(v1.read_text())
            period = int((v1.parent / "cpu.cfs_period_us").read_text())
            return None if quota <= 0 else max(1, quota // period)
    except (OSError, ValueError):
        pass
    return None


def default_cpu_threads() -> int:
    """Intra-op threads of a CPU run: one usable CPU left to the engine's host thread and
    the server's event loop, at most what torch was set to and at most 8. Workers that
    outnumber the free cores spin against each other: on a shared 2-core machine that
    made a run 20x slower."""
    return max(1, min(usable_cpus() - 1, torch.get_num_threads(), MAX_DEFAULT_CPU_THREADS))


def set_cpu_threads(config: EngineConfig) -> int:
    threads = config.cpu_threads or default_cpu_threads()
    torch.set_num_threads(threads)
    return threads
