"""Tensor parallelism: one process per rank, rank 0 planning every step for all of them.

    comm.py     the ranks' process groups: the model's collectives, rank 0's messages
    sync.py     the step message, the plan's fingerprint, the recording / replaying policy
    engine.py   LeaderEngine (rank 0, what users talk to), FollowerEngine (the others)
    launch.py   starting the ranks (by the engine, or torchrun), watching them
    worker.py   the entry point of the ranks the engine starts

The model side (which rank holds which slice of each weight) is models/parallel.py.

Data flow: LLM / serve / bench -> create_engine(config) -> Engine (one GPU) | LeaderEngine.
"""

from __future__ import annotations

import os

from gearshift.config import EngineConfig


def create_engine(config: EngineConfig):
    """The engine for `config`: a plain Engine on one device; with tensor_parallel_size > 1
    (or when torchrun started this process) rank 0's LeaderEngine, every rank started and
    connected. Under torchrun the other ranks serve rank 0 here, then their process ends."""
    torchrun = torchrun_env()
    if config.tensor_parallel_size == 1 and torchrun is None:
        from gearshift.engine.engine import Engine

        return Engine(config)
    from gearshift.distributed.launch import start

    return start(config, torchrun)


def torchrun_env() -> tuple[int, int, int, int] | None:
    """(rank, world size, local rank, local world size) when torchrun started this process."""
    env = os.environ
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return None
    world = int(env["WORLD_SIZE"])
    return (int(env["RANK"]), world, int(env.get("LOCAL_RANK", env["RANK"])),
            int(env.get("LOCAL_WORLD_SIZE", world)))

