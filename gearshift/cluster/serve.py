"""`gearshift serve` on Ray: check the flags, join or start Ray, start the replicas.

Data flow: server/cli.run -> start_cluster_engine(config, args) -> cluster/launch.py ->
ReplicaSet (the server's engine).
"""

from __future__ import annotations

import logging

from gearshift.config import ConfigError, EngineConfig


def start_cluster_engine(config: EngineConfig, args):
    """The ReplicaSet `serve` runs behind its endpoint."""
    if args.data_parallel_size < 1:
        raise ConfigError("--data-parallel-size must be >= 1")
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError("--data-parallel-size / --ray need Ray: pip install "
                          "'gearshift[ray]'") from None
    from gearshift.cluster.launch import connect_ray, start_replicas

    connect_ray(args.ray_address)
    return start_replicas(config, args.data_parallel_size, kv_events=args.kv_events,
                          log_level=logging.getLogger("gearshift").level)
