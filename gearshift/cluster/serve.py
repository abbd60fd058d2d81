"""`gearshift serve` on Ray: check the flags, join or start Ray, start the replicas.

A local Ray instance started here counts at least one CPU per rank (Ray's CPUs are
placement slots, not threads: the replicas share the host's threads, launch.replica_config),
and on CUDA must see a GPU per rank, or start-up stops at once saying how many it lacks.

Data flow: server/cli.run -> start_cluster_engine(config, args) -> cluster/launch.py ->
ReplicaSet (the server's engine).
"""

from __future__ import annotations

import logging
import os

from gearshift.config import ConfigError, EngineConfig


def start_cluster_engine(config: EngineConfig, args):
    """The ReplicaSet `serve` runs behind its endpoint."""
    dp = args.data_parallel_size
    if dp < 1:
        raise ConfigError("--data-parallel-size must be >= 1")
    try:
        import ray
    except ImportError:
        raise ConfigError("--data-parallel-size / --ray need Ray: pip install "
                          "'gearshift[ray]'") from None
    from gearshift.cluster.launch import connect_ray, start_replicas

    ranks = dp * config.tensor_parallel_size
    local = not (args.ray_address or os.environ.get("RAY_ADDRESS"))
    connect_ray(args.ray_address, num_cpus=max(os.cpu_count() or 1, ranks) if local else None)
    if local and config.device.startswith("cuda"):
        gpus = ray.cluster_resources().get("GPU", 0)
        if gpus < ranks:
            raise ConfigError(f"{dp} replica(s) of {config.tensor_parallel_size} rank(s) need "
                              f"{ranks} GPUs; this node has {gpus:g} (join a cluster with "
                              "--ray-address)")
    return start_replicas(config, dp, kv_events=args.kv_events,
                          log_level=logging.getLogger("gearshift").level)
