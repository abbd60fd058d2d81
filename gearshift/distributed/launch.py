"""Start the ranks of a tensor-parallel engine, connect them, and watch them.

    launched by the engine (tensor_parallel_size N > 1):
        this process is rank 0; ranks 1..N-1 run `python -m gearshift.distributed.worker`
        (a fresh interpreter: the caller's __main__ is not imported again and no CUDA state
        is forked), meeting at a TCPStore on 127.0.0.1:<free port>; rank r uses cuda:base+r
    launched by torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set):
        every process is one rank, on cuda:LOCAL_RANK; rank 0 returns its LeaderEngine, the
        others serve it and exit when it shuts down (torchrun ends all of them if one fails)

A Group is one rank's connection: its TensorParallel (the model's collectives), the
Channel (rank 0's messages) and, on rank 0, a watcher that notices within a fraction of a
second when another rank exits or reports an error; the engine then raises RankFailure.

Data flow: distributed.create_engine -> start() -> LeaderEngine (rank 0) | run_follower().
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
import time
import traceback
import weakref
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from gearshift.config import ConfigError, EngineConfig
from gearshift.distributed.comm import Channel, DeviceComm
from gearshift.distributed.sync import Shutdown
from gearshift.models.parallel import TensorParallel, check_shardable

log = logging.getLogger("gearshift.distributed")

JOINED = "gearshift/joined"  # ranks 1.. add one each when they start connecting
FAILED = "gearshift/failed/"  # + rank: the error a rank raised, one line
START_TIMEOUT = timedelta(seconds=120)


@dataclass(eq=False)
class Group:
    rank: int
    size: int
    store: object
    tp: TensorParallel
    channel: Channel
    workers: list[subprocess.Popen] = field(default_factory=list)  # rank 0, engine-launched
    busy: bool = False  # rank 0 is inside a step (its collectives may be in flight)
    closed: bool = False
    _failure: str | None = None
    _watcher: threading.Thread | None = None

    @property
    def comm(self) -> DeviceComm:
        return self.tp.comm

    def watch(self) -> None:
        """Rank 0: poll the other ranks (their processes, or what they reported) from now on."""
        self._watcher = threading.Thread(target=self._watch, name="gearshift-ranks", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self.closed:
            failure = self._poll()
            if failure is not None and not self.closed:  # not the ranks told to stop
                self.fail(failure)
                log.error("tensor parallelism: %s", failure)
                if self.comm.device.type == "cuda":  # an NCCL wait never ends by itself
                    self.comm.abort()
                return
            time.sleep(0.1)

    def _poll(self) -> str | None:
        for rank, proc in enumerate(self.workers, 1):
            code = proc.poll()
            if code is not None:
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                return f"rank {rank} {how}" + self._reported(rank, ": ")
        if not self.workers:  # torchrun: only what the ranks reported
            for rank in range(1, self.size):
                if self.store.check([f"{FAILED}{rank}"]):
                    return f"rank {rank} failed" + self._reported(rank, ": ")
        return None

    def _reported(self, rank: int, sep: str) -> str:
        try:
            if self.store.check([f"{FAILED}{rank}"]):
                return sep + self.store.get(f"{FAILED}{rank}").decode(errors="replace")
        except Exception:  # noqa: BLE001 - the store may be gone with the rank hosting it
            pass
        return ""

    def fail(self, why: str) -> None:
        """Rank 0 itself broke the lockstep: every later call raises."""
        if self._failure is None:
            self._failure = why

    def failure(self, wait: float = 0.0) -> str | None:
        """What ended another rank, or None; waits up to `wait` seconds for the watcher."""
        deadline = time.monotonic() + wait
        while self._failure is None and self._watcher is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        return self._failure

    def goodbye(self, timeout: float = 10.0) -> None:
        """Rank 0: tell the other ranks to stop (unless a step is in flight: its collectives
        hold them; then they follow rank 0 out) and close. Also run when the engine is
        collected or the interpreter exits without shutdown()."""
        if self.closed:
            return
        self.closed = True  # before they exit: the watcher must not take that for a fault
        if self.busy or self._failure is not None:
            timeout = 0.0
        else:
            try:
                self.channel.send(Shutdown([]))
            except Exception:  # noqa: BLE001 - a rank is gone: close() stops the rest
                timeout = 0.0
        self.close(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Rank 0: wait for the other ranks to exit (they were told to), then stop the
        stragglers."""
        self.closed = True
        deadline = time.monotonic() + timeout
        for proc in self.workers:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join()
        if self.comm.device.type == "cuda":
            _agree_on_kernels(None)


def start(config: EngineConfig, torchrun: tuple[int, int, int, int] | None):
    """The engine of this process: rank 0's LeaderEngine (or, under torchrun, a follower's
    serve loop, then the end of the process)."""
    from gearshift.models.loader import resolve_model_config

    size = config.tensor_parallel_size
    check_shardable(resolve_model_config(config.model)[0], size)
    if torchrun is not None:
        rank, world, local_rank, local_world = torchrun
        if world != size:
            raise ConfigError(f"torchrun started {world} process(es): pass "
                              f"--tensor-parallel-size {world}")
        config = rank_config(config, local_rank, size)
        store = dist.PrefixStore("gearshift", next(dist.rendezvous("env://",
                                                                   timeout=START_TIMEOUT))[0])
        if rank:
            exit_now(run_follower(config, store, rank, size, local_world == world))
        return _lead(config, connect(store, 0, size, config, local_world == world))
    base = _check_devices(config, size)
    port = _free_port()
    store = dist.TCPStore("127.0.0.1", port, size, is_master=True, timeout=START_TIMEOUT,
                          wait_for_workers=False)
    workers = [_spawn(rank_config(config, base + r, size), r, size, port)
               for r in range(1, size)]
    try:
        _wait_joined(store, workers, size)
        group = connect(store, 0, size, rank_config(config, base, size), True)
    except BaseException:
        for proc in workers:
            proc.kill()
        raise
    group.workers = workers
    return _lead(rank_config(config, base, size), group)


def rank_config(config: EngineConfig, device_index: int, size: int) -> EngineConfig:
    """A rank's own config: its GPU, or its share of the CPU threads."""
    if config.device.startswith("cuda"):
        return replace(config, device=f"cuda:{device_index}")
    if config.cpu_threads is None:
        from gearshift.runner.startup_checks import default_cpu_threads

        return replace(config, cpu_threads=max(1, default_cpu_threads() // size))
    return config


def connect(store, rank: int, size: int, config: EngineConfig, local: bool) -> Group:
    device = torch.device(config.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    channel = Channel(store, rank, size, local)
    comm = DeviceComm(store, rank, size, device, local)
    if device.type == "cuda":
        _agree_on_kernels(comm)
    group = Group(rank, size, store, TensorParallel(rank, size, comm), channel)
    if rank == 0:
        group.watch()
    return group


def run_follower(config: EngineConfig, store, rank: int, size: int, local: bool) -> int:
    """A follower rank's life: connect, build the engine, serve rank 0; -> exit code. An
    error goes to stderr and, one line, to the store, where rank 0 reads it."""
    from gearshift.distributed.engine import FollowerEngine

    logging.getLogger("gearshift").setLevel(logging.WARNING)  # rank 0 reports progress
    try:
        store.add(JOINED, 1)
        FollowerEngine(config, connect(store, rank, size, config, local)).serve()
        return 0
    except BaseException as e:  # noqa: BLE001 - reported, then the process ends
        print(f"gearshift rank {rank}: {traceback.format_exc()}", file=sys.stderr, flush=True)
        try:
            store.set(f"{FAILED}{rank}", f"{type(e).__name__}: {e}")
        except Exception:  # noqa: BLE001 - rank 0 (the store) may be gone already
            pass
        return 1


def exit_now(code: int) -> None:
    """End a follower rank's process once it has served: no interpreter teardown, where
    destroying the process groups' threads has aborted a process after a clean shutdown."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _lead(config: EngineConfig, group: Group):
    from gearshift.distributed.engine import LeaderEngine, RankFailure

    try:
        engine = LeaderEngine(config, group)
        weakref.finalize(engine, group.goodbye)  # no shutdown() call: at exit at the latest
        return engine
    except RuntimeError as e:  # a collective failed: say which rank went
        failure = group.failure(wait=5.0)
        group.close(timeout=5.0)
        if failure is not None:
            raise RankFailure(failure) from e
        raise
    except BaseException:
        group.close(timeout=5.0)
        raise


def _check_devices(config: EngineConfig, size: int) -> int:
    """The first GPU's index (0 on a CPU); one line when fewer than `size` GPUs are there."""
    if not config.device.startswith("cuda"):
        return 0
    base = torch.device(config.device).index or 0
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if base + size > count:
        raise ConfigError(f"tensor_parallel_size {size} needs GPUs cuda:{base}..cuda:"
                          f"{base + size - 1}; {count} visible")
    return base


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class WorkerSpec:
    """What `python -m gearshift.distributed.worker` reads from its stdin."""

    config: EngineConfig
    rank: int
    size: int
    port: int
    parent: int  # rank 0's pid: the worker exits when rank 0 is gone


def _spawn(config: EngineConfig, rank: int, size: int, port: int) -> subprocess.Popen:
    root = str(Path(__file__).resolve().parents[2])  # this checkout's gearshift, not another
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen([sys.executable, "-m", "gearshift.distributed.worker"],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env)
    proc.stdin.write(pickle.dumps(WorkerSpec(config, rank, size, port, os.getpid())))
    proc.stdin.close()
    return proc


def _wait_joined(store, workers: list[subprocess.Popen], size: int) -> None:
    """Until every worker has started connecting; a worker that exits first fails it."""
    deadline = time.monotonic() + START_TIMEOUT.total_seconds()
    while store.add(JOINED, 0) < size - 1:
        for rank, proc in enumerate(workers, 1):
            if proc.poll() is not None:
                from gearshift.distributed.engine import RankFailure

                raise RankFailure(f"rank {rank} exited with code {proc.returncode} while starting")
        if time.monotonic() > deadline:
            raise ConfigError(f"the tensor-parallel ranks did not start within "
                              f"{START_TIMEOUT.total_seconds():.0f} s")
        time.sleep(0.05)


def _agree_on_kernels(comm: DeviceComm | None) -> None:
    """Rank 0 picks each few-row GEMM's kernel for every rank (kernels/skinny_select.py)."""
    from gearshift.kernels.skinny_select import CHOOSER

    CHOOSER.agree = comm.broadcast_object if comm is not None else None
