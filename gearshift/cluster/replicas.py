"""N engine replicas behind one OpenAI endpoint: ReplicaSet stands where the server expects
an AsyncEngine (add_request, abort, reset_prefix_cache, snapshot, num_waiting, is_alive,
tokenizer, ...) and routes each request to one replica's AsyncEngine.

    build_app ─► ReplicaSet.add_request ─► PrefixRouter.choose (cluster/router.py)
                                            └► replica i's AsyncEngine ─► ReplicaHandle
                                               ─► Ray actor (cluster/actor.py)

Each replica has its own KV cache, prefix cache and goodput controller. A replica whose
actor dies fails its own requests (EngineDeadError, 503 at the API) and is left out of
routing; Ray restarts the actor (its engine loads again) and the replica rejoins with a
fresh AsyncEngine. The server stops only when every replica is gone for good.

Data flow: cluster/launch.py -> ReplicaSet(replicas) -> server.app.build_app.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from gearshift.cluster.router import PrefixRouter, ReplicaLoad
from gearshift.frontend.async_engine import AsyncEngine, EngineDeadError, EngineSnapshot

log = logging.getLogger("gearshift.cluster")

RESTART_TIMEOUT_S = 300.0  # a replica not back by then is gone for good


@dataclass(eq=False)
class Replica:
    index: int
    actor: Any
    engine: AsyncEngine  # replaced when the actor restarts
    restarts: int = 0
    restarting: bool = False
    gone: bool = False  # not back within RESTART_TIMEOUT_S


class ReplicaSet:
    """The server's engine: one AsyncEngine per replica, a router in front."""

    def __init__(self, replicas: list[Replica], *, router: PrefixRouter | None = None,
                 make_engine: Any = None, restart_timeout: float = RESTART_TIMEOUT_S) -> None:
        if not replicas:
            raise ValueError("a ReplicaSet needs at least one replica")
        self.replicas = replicas
        self.router = router or PrefixRouter(len(replicas))
        # (replica index, actor) -> a started-to-be AsyncEngine over the restarted actor
        self._make_engine = make_engine
        self.restart_timeout = restart_timeout
        first = replicas[0].engine
        self.tokenizer = first.tokenizer
        self.grammars = first.grammars
        self.model_name: str = first.model_name
        self.max_model_len: int = first.max_model_len
        self.vocab_size: int = first.vocab_size
        self.on_death: Any = None  # the server's: called once every replica is gone for good
        self.error: BaseException | None = None
        self.on_shutdown: Any = None  # launch.py's: ends the actors (placement groups end with the job)
        self.routed = {(r.index, why): 0 for r in replicas for why in ("prefix", "load")}
        self._tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------ lifecycle (event loop)
    def start(self) -> None:
        for r in self.replicas:
            self._start(r)

    def _start(self, replica: Replica) -> None:
        replica.engine.on_death = lambda exc, r=replica: self._died(r, exc)
        replica.engine.start()
        kv_total = replica.engine.snapshot.memory.get("kv_slots_total", 0)
        if kv_total:
            self.router.set_capacity(replica.index, kv_total)

    def shutdown(self, timeout: float = 10.0) -> None:
        for task in self._tasks:
            task.cancel()
        for r in self.replicas:
            r.engine.shutdown(timeout)
        if self.on_shutdown is not None:
            self.on_shutdown()

    @property
    def is_alive(self) -> bool:
        return any(r.engine.is_alive for r in self.replicas)

    # ------------------------------------------------------------ counters
    def alive(self) -> list[Replica]:
        return [r for r in self.replicas if r.engine.is_alive]

    @property
    def num_waiting(self) -> int:
        return sum(r.engine.num_waiting for r in self.alive())

    @property
    def num_running(self) -> int:
        return sum(r.engine.num_running for r in self.alive())

    @property
    def num_live_streams(self) -> int:
        return sum(r.engine.num_live_streams for r in self.replicas)

    @property
    def snapshot(self) -> EngineSnapshot:
        """The replicas' counters added up (the live ones)."""
        snaps = [r.engine.snapshot for r in self.alive()]
        memory: dict = {}
        for key in ("kv_slots_total", "kv_slots_free", "kv_slots_cached"):
            memory[key] = sum(s.memory.get(key, 0) for s in snaps)
        for s in snaps[:1]:
            for key in ("tensor_parallel_size", "kv_cache_bytes_per_rank"):
                if key in s.memory:
                    memory[key] = s.memory[key]
        stats: dict = {}
        for snap in snaps:  # top-level counts (steps, tokens, preemptions) add up
            for key, value in snap.stats.items():
                if isinstance(value, int) and not isinstance(value, bool):
                    stats[key] = stats.get(key, 0) + value
        by_k: dict = {}
        for snap in snaps:
            for k, n in ((snap.stats.get("spec") or {}).get("steps_by_k") or {}).items():
                by_k[k] = by_k.get(k, 0) + n
        if by_k:
            stats["spec"] = {"steps_by_k": by_k}
        caches = [s.stats["prefix_cache"] for s in snaps if s.stats.get("prefix_cache")]
        if caches:
            q = sum(c["queries_tokens"] for c in caches)
            h = sum(c["hit_tokens"] for c in caches)
            stats["prefix_cache"] = {"queries_tokens": q, "hit_tokens": h,
                                     "hit_rate": h / q if q else 0.0}
        return EngineSnapshot(num_running=sum(s.num_running for s in snaps),
                              num_waiting=sum(s.num_waiting for s in snaps),
                              memory=memory, stats=stats, time=time.monotonic())

    def loads(self) -> list[ReplicaLoad]:
        out = []
        for r in self.replicas:
            mem = r.engine.snapshot.memory
            total = mem.get("kv_slots_total", 0)
            free = mem.get("kv_slots_free", 0) + mem.get("kv_slots_cached", 0)
            out.append(ReplicaLoad(alive=r.engine.is_alive, in_flight=r.engine.num_live_streams,
                                   kv_free_fraction=free / total if total else 1.0))
        return out

    # ------------------------------------------------------------ requests (event loop)
    async def add_request(self, request_id: str, prompt_token_ids: list[int], params: Any,
                          queue: asyncio.Queue | None = None) -> Any:
        """Route the request and queue it on that replica; a replica found dead on the way
        is skipped."""
        tried: set[int] = set()
        while True:
            loads = [load if i not in tried else ReplicaLoad(False, 0)
                     for i, load in enumerate(self.loads())]
            try:
                route = self.router.choose(prompt_token_ids, loads)
            except LookupError:
                raise EngineDeadError("no replica is running (they are restarting or gone)"
                                      ) from None
            replica = self.replicas[route.replica]
            try:
                stream = await replica.engine.add_request(request_id, prompt_token_ids, params,
                                                          queue)
            except EngineDeadError:
                tried.add(route.replica)
                continue
            self.router.record(route.replica, prompt_token_ids)
            self.routed[(route.replica, route.reason)] += 1
            return stream

    def abort(self, request_id: str) -> None:
        for r in self.replicas:  # only the replica that has it does anything
            r.engine.abort(request_id)

    async def reset_prefix_cache(self) -> int:
        freed = 0
        for r in self.alive():
            try:
                freed += await r.engine.reset_prefix_cache()
            except EngineDeadError:
                continue
            self.router.forget(r.index)
        return freed

    # ------------------------------------------------------------ replica faults
    def _died(self, replica: Replica, exc: BaseException) -> None:
        """On the event loop: the replica's requests have failed; bring it back."""
        log.error("replica %d stopped (%s); %d replica(s) still serving", replica.index, exc,
                  len(self.alive()))
        self.router.forget(replica.index)
        if self._make_engine is None or replica.restarting:
            self._check_gone()
            return
        replica.restarting = True
        task = asyncio.get_running_loop().create_task(self._restart(replica))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _restart(self, replica: Replica) -> None:
        old = replica.engine
        deadline = time.monotonic() + self.restart_timeout
        try:
            engine = await self._make_engine(replica, deadline)
        except Exception as exc:  # noqa: BLE001 - that replica is gone for good
            log.error("replica %d did not come back: %s", replica.index, exc)
            replica.gone, replica.restarting = True, False
            self._check_gone(exc)
            return
        await asyncio.get_running_loop().run_in_executor(None, old.shutdown, 1.0)
        replica.engine, replica.restarting = engine, False
        replica.restarts += 1
        self._start(replica)
        log.warning("replica %d is back (restart %d)", replica.index, replica.restarts)

    def _check_gone(self, exc: BaseException | None = None) -> None:
        if all(r.gone or (self._make_engine is None and not r.engine.is_alive)
               for r in self.replicas):
            self.error = exc or EngineDeadError("every replica stopped")
            if self.on_death is not None:
                self.on_death(self.error)
