"""Tensor parallelism with the ranks placed by Ray: rank 0 is the replica's actor, ranks
1..T-1 are RankActors on the other bundles of the replica's placement group (other nodes
when one node lacks room). They meet at a TCPStore that rank 0 hosts on its node's address,
then run distributed/launch.py's own connect / run_follower / LeaderEngine, so every rank
replays rank 0's plan exactly as when the engine starts its ranks itself.

    ReplicaActor (rank 0)                       RankActor r (bundle r)
    TCPStore(node ip, free port, master)  ◄──   TCPStore(rank 0's ip, port)
    start_leader: wait until T-1 joined         serve(): run_follower (connect,
    -> connect -> LeaderEngine                  FollowerEngine.serve until Shutdown)

The rank actors belong to rank 0's actor: when it dies Ray ends them too, and its restart
starts a new set. Ranks on one node talk over loopback; across nodes gloo and NCCL take
the interface GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME name (or the host name's address).

Data flow: cluster/actor.ReplicaActor -> start_leader(config, pg) -> LeaderEngine.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from gearshift.config import ConfigError, EngineConfig

log = logging.getLogger("gearshift.cluster")


class RankActor:
    """A follower rank (wrapped by ray.remote in start_leader)."""

    def where(self) -> tuple[str, int]:
        """(node address, pid), asked before serve() occupies the actor."""
        import os

        import ray

        return ray.util.get_node_ip_address(), os.getpid()

    def serve(self, config: EngineConfig, host: str, port: int, rank: int, size: int,
              local: bool) -> int:
        import torch.distributed as dist

        from gearshift.distributed.launch import START_TIMEOUT, run_follower

        store = dist.TCPStore(host, port, size, is_master=False, timeout=START_TIMEOUT)
        return run_follower(config, store, rank, size, local)


def start_leader(config: EngineConfig, placement_group: Any):
    """Rank 0's LeaderEngine, ranks 1..T-1 started as actors in `placement_group`."""
    import ray
    import torch.distributed as dist
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from gearshift.distributed.launch import (
        JOINED,
        START_TIMEOUT,
        _free_port,
        _lead,
        connect,
        rank_config,
    )
    from gearshift.models.loader import resolve_model_config
    from gearshift.models.parallel import check_shardable

    size = config.tensor_parallel_size
    check_shardable(resolve_model_config(config.model)[0], size)
    if placement_group is None:
        raise ConfigError("tensor parallelism on Ray needs the replica's placement group")
    gpu = 1.0 if config.device.startswith("cuda") else 0.0
    rank_cls = ray.remote(RankActor)
    ranks = [rank_cls.options(
        num_cpus=1.0, num_gpus=gpu, max_restarts=0,
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group,
                                                             placement_group_bundle_index=r),
    ).remote() for r in range(1, size)]
    host = ray.util.get_node_ip_address()
    where = ray.get([r.where.remote() for r in ranks], timeout=START_TIMEOUT.total_seconds())
    local = all(ip == host for ip, _ in where)
    if local:
        host = "127.0.0.1"
    port = _free_port() if local else _free_port_on(host)
    store = dist.TCPStore(host, port, size, is_master=True, timeout=START_TIMEOUT,
                          wait_for_workers=False)
    cfg = rank_config(config, 0, size)
    served = [r.serve.remote(cfg, host, port, rank, size, local)
              for rank, r in enumerate(ranks, 1)]
    try:
        _wait_joined(store, served, size, JOINED, START_TIMEOUT.total_seconds())
        group = connect(store, 0, size, cfg, local)
    except BaseException:
        for r in ranks:
            ray.kill(r)
        raise
    engine = _lead(cfg, group)
    engine.rank_actors = ranks  # they live as long as the engine
    engine.rank_pids = [pid for _, pid in where]
    threading.Thread(target=_watch, args=(group, served), name="gearshift-rank-actors",
                     daemon=True).start()
    return engine


def _watch(group, served: list) -> None:
    """Rank 0: a rank's actor that ends (killed, its node lost) fails the group at once,
    as the watcher of engine-started ranks does for their processes."""
    import ray

    while not group.closed:
        done, _ = ray.wait(served, num_returns=1, timeout=0.5)
        if not done or group.closed:
            continue
        rank = served.index(done[0]) + 1
        try:
            why = f"rank {rank} exited with code {ray.get(done[0])}"
        except Exception as exc:  # noqa: BLE001 - the actor died
            why = f"rank {rank}'s actor died ({type(exc).__name__})"
        group.fail(why)
        log.error("tensor parallelism: %s", why)
        if group.comm.device.type == "cuda":  # an NCCL wait never ends by itself
            group.comm.abort()
        return


def _free_port_on(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _wait_joined(store, served: list, size: int, key: str, timeout: float) -> None:
    """Until every rank started connecting; a rank that ended first fails it."""
    import ray

    from gearshift.distributed.engine import RankFailure

    deadline = time.monotonic() + timeout
    while store.add(key, 0) < size - 1:
        done, _ = ray.wait(served, num_returns=1, timeout=0)
        if done:
            try:
                code = ray.get(done[0])
            except Exception as exc:  # noqa: BLE001 - the rank's actor died
                raise RankFailure(f"a tensor-parallel rank died while starting: {exc}") from exc
            raise RankFailure(f"a tensor-parallel rank exited with code {code} while starting")
        if time.monotonic() > deadline:
            raise ConfigError(f"the tensor-parallel ranks did not start within {timeout:.0f} s")
        time.sleep(0.05)
