"""Start N engine replicas as Ray actors and put them behind one ReplicaSet.

    connect_ray()      join RAY_ADDRESS / --ray-address, or start a local Ray instance;
                       workers import this checkout's gearshift (PYTHONPATH in runtime_env)
    start_replicas()   per replica: a placement group of T bundles (one per tensor-parallel
                       rank: a GPU each on CUDA, a CPU each otherwise; PACK, so ranks spill
                       to other nodes only when one node lacks room), the replica's actor on
                       bundle 0 (restarted by Ray when it dies), then a ReplicaHandle and an
                       AsyncEngine over it in this process

Data flow: `gearshift serve --data-parallel-size N` (server/cli.py) -> start_replicas ->
ReplicaSet -> build_app -> uvicorn.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from gearshift.config import ConfigError, EngineConfig

log = logging.getLogger("gearshift.cluster")

MAX_RESTARTS = 8  # per replica; then it is gone and the others serve on
START_TIMEOUT_S = 600.0  # resources granted and the engine loaded


def connect_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join a running Ray cluster (`address`, else $RAY_ADDRESS) or start a local one."""
    import ray

    if ray.is_initialized():
        return
    root = str(Path(__file__).resolve().parents[2])  # this checkout's gearshift, not another
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env_vars = {"PYTHONPATH": path}
    if "TRITON_INTERPRET" in os.environ:
        env_vars["TRITON_INTERPRET"] = os.environ["TRITON_INTERPRET"]
    opts: dict[str, Any] = dict(runtime_env={"env_vars": env_vars}, log_to_driver=True,
                                include_dashboard=False)
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, **opts)
    else:
        ray.init(num_cpus=num_cpus, **opts)


def replica_config(config: EngineConfig, data_parallel_size: int) -> EngineConfig:
    """On a CPU, the replicas share this host's threads (each rank gets its own share in
    distributed/launch.rank_config)."""
    if config.device.startswith("cuda") or config.cpu_threads is not None:
        return config
    from gearshift.runner.startup_checks import default_cpu_threads

    return replace(config, cpu_threads=max(1, default_cpu_threads() // data_parallel_size))


def _numbered(config: EngineConfig, index: int, data_parallel_size: int) -> EngineConfig:
    """Replica `index`'s config: its own --step-trace file (PATH.replicaI) when several."""
    if config.step_trace is None or data_parallel_size == 1:
        return config
    return replace(config, step_trace=f"{config.step_trace}.replica{index}")


def _bundles(config: EngineConfig) -> list[dict]:
    rank = {"GPU": 1.0, "CPU": 1.0} if config.device.startswith("cuda") else {"CPU": 1.0}
    return [dict(rank) for _ in range(config.tensor_parallel_size)]


def start_replicas(config: EngineConfig, data_parallel_size: int, *, kv_events: str | None = None,
                   max_restarts: int = MAX_RESTARTS, start_timeout: float = START_TIMEOUT_S,
                   log_level: int = logging.WARNING):
    """A ReplicaSet of `data_parallel_size` replicas (Ray must be connected)."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from gearshift.cluster.actor import ReplicaActor
    from gearshift.cluster.replicas import Replica, ReplicaSet
    from gearshift.cluster.router import PrefixRouter
    from gearshift.models.loader import resolve_model_config
    from gearshift.structured.compiler import GrammarCompiler
    from gearshift.tokenizer import load_engine_tokenizer

    if data_parallel_size < 1:
        raise ConfigError("--data-parallel-size must be >= 1")
    config = replica_config(config, data_parallel_size)
    if config.device.startswith("cuda"):  # each actor sees its own GPU as cuda:0
        config = replace(config, device="cuda")
    actor_cls = ray.remote(ReplicaActor)
    groups, actors = [], []
    for i in range(data_parallel_size):
        pg = placement_group(_bundles(config), strategy="PACK")
        groups.append(pg)
        gpu = 1.0 if config.device.startswith("cuda") else 0.0
        actors.append(actor_cls.options(
            num_cpus=1.0, num_gpus=gpu,
            max_restarts=max_restarts, max_task_retries=0, max_concurrency=4,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0),
        ).remote(_numbered(config, i, data_parallel_size), i, pg, kv_events, log_level))
    deadline = time.monotonic() + start_timeout
    try:
        ready = ray.wait([pg.ready() for pg in groups], num_returns=len(groups),
                         timeout=min(120.0, start_timeout))[0]
        if len(ready) < len(groups):
            raise ConfigError(
                f"the Ray cluster cannot place {data_parallel_size} replica(s) of "
                f"{_bundles(config)} each (ray status shows what it has)")
        infos = ray.get([a.info.remote() for a in actors],
                        timeout=max(1.0, deadline - time.monotonic()))
    except BaseException:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        raise
    _, path = resolve_model_config(config.model)
    tokenizer = load_engine_tokenizer(config, path)
    grammars = GrammarCompiler(tokenizer, infos[0]["vocab_size"], tuple(infos[0]["eos_token_ids"]))

    def engine_over(actor: Any, info: dict, index: int):
        from gearshift.cluster.handle import ReplicaHandle
        from gearshift.frontend.async_engine import AsyncEngine

        handle = ReplicaHandle(actor, info, index, tokenizer, grammars)
        return AsyncEngine(handle)

    async def restarted(replica: Replica, deadline: float):
        """Once Ray has the replica's actor back (its engine loaded): an engine over it."""
        handle = replica.engine.engine
        if replica.restarts >= max_restarts:
            raise RuntimeError(f"it restarted {replica.restarts} times already")
        if handle.engine_failed:  # the engine raised but the actor lives: restart it
            ray.kill(replica.actor, no_restart=False)
        while True:
            try:
                info = await asyncio.wait_for(asyncio.wrap_future(
                    replica.actor.info.remote().future()), timeout=10.0)
                if info["pid"] != handle.pid:
                    return engine_over(replica.actor, info, replica.index)
            except Exception:  # noqa: BLE001 - still restarting (or gone: the deadline says)
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("its actor did not restart in time")
            await asyncio.sleep(0.5)

    replicas = [Replica(i, a, engine_over(a, info, i)) for i, (a, info) in
                enumerate(zip(actors, infos))]
    router = PrefixRouter(data_parallel_size)
    for i, info in enumerate(infos):
        router.set_capacity(i, info["kv_slots_total"])
    rs = ReplicaSet(replicas, router=router, make_engine=restarted)

    def release() -> None:  # the placement groups go with this driver's job
        for actor in actors:
            ray.kill(actor, no_restart=True)

    rs.on_shutdown = release
    return rs

