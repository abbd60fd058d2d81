"""The two process groups that connect the ranks of one tensor-parallel engine, built from
torch.distributed backends directly (no global default group: an engine that shuts down
leaves nothing behind, and the next one in the same process starts clean):

    device group    the model's collectives (models/parallel.py): all-reduce after o_proj
                    and down_proj, all-gather of the logits. NCCL on GPUs, gloo on CPUs;
                    COLLECTIVE_TIMEOUT_S
    control group   gloo on the host: rank 0's message before every step (`Channel`). The
                    other ranks wait in it while rank 0 idles, so it never times out; a rank
                    that dies closes its sockets, which ends every wait on it at once

Data flow: distributed/launch.py (rendezvous: a TCPStore) -> connect() -> DeviceComm (in
models/parallel.TensorParallel) + Channel (distributed/engine.py).
"""

from __future__ import annotations

import pickle
from datetime import timedelta

import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT_S = 300  # a collective that long: a rank hangs (a dead one is seen at once)
IDLE_TIMEOUT = timedelta(days=365)


def _gloo(store, rank: int, size: int, timeout: timedelta, local: bool) -> dist.ProcessGroupGloo:
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    # ranks started by the engine talk over loopback whatever the host name resolves to
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1") if local
                     else dist.ProcessGroupGloo.create_default_device()]
    return _numbered(dist.ProcessGroupGloo(store, rank, size, opts))


def _numbered(pg):
    """As torch.distributed builds its own groups: the ranks agree on a sequence number."""
    pg._set_sequence_number_for_group()
    return pg


class _Group:
    """A process group `pg` with rank 0 broadcasting, and the abort both groups share."""

    pg: dist.ProcessGroup

    def _broadcast(self, t: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([t], opts).wait()

    def abort(self) -> None:
        """Fail whatever waits on the group (a rank died while a step's collectives wait on
        it); the group is unusable afterwards."""
        try:
            self.pg.abort()
        except Exception:  # noqa: BLE001 - best effort: the engine raises either way
            pass


class DeviceComm(_Group):
    """Collectives over the ranks' devices; every rank calls each one in the same order."""

    def __init__(self, store, rank: int, size: int, device: torch.device, local: bool) -> None:
        self.rank, self.size, self.device = rank, size, device
        timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
        store = dist.PrefixStore("device", store)
        if device.type == "cuda":
            opts = dist.ProcessGroupNCCL.Options()
            opts.is_high_priority_stream = False
            opts._timeout = timeout
            self.pg = _numbered(dist.ProcessGroupNCCL(store, rank, size, opts))
        else:
            self.pg = _gloo(store, rank, size, timeout, local)
        # connect now: a communicator must exist before CUDA graphs capture its collectives
        self.all_reduce(torch.zeros(1, device=device))

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks, in place; -> x."""
        self.pg.allreduce([x]).wait()
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """[rows, ...] per rank -> [size * rows, ...], rank 0's rows first."""
        out = x.new_empty((self.size * x.shape[0], *x.shape[1:]))
        self.pg._allgather_base(out, x).wait()
        return out

    def min_int(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN
        self.pg.allreduce([t], opts).wait()
        return int(t.item())

    def broadcast_object(self, obj):
        """Rank 0's `obj` on every rank (pickled; start-up decisions, not the hot path)."""
        n = torch.zeros(1, dtype=torch.int64, device=self.device)
        if self.rank == 0:
            data = pickle.dumps(obj)
            n.fill_(len(data))
        self._broadcast(n)
        if self.rank == 0:
            self._broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device))
            return obj
        buf = torch.empty(int(n.item()), dtype=torch.uint8, device=self.device)
        self._broadcast(buf)
        return pickle.loads(buf.cpu().numpy().tobytes())


class Channel(_Group):
    """Rank 0's messages to the other ranks, in order: pickled and broadcast over the
    control group in a fixed buffer (one broadcast for a usual step), a longer message in a
    second one."""

    CAPACITY = 1 << 14

    def __init__(self, store, rank: int, size: int, local: bool) -> None:
        self.rank = rank
        self.pg = _gloo(dist.PrefixStore("control", store), rank, size, IDLE_TIMEOUT, local)
        self.buf = torch.zeros(self.CAPACITY, dtype=torch.uint8)

    def send(self, message) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        head = len(data).to_bytes(8, "little")
        fits = len(data) + 8 <= self.CAPACITY
        packed = head + data if fits else head
        self.buf[: len(packed)] = torch.frombuffer(bytearray(packed), dtype=torch.uint8)
        self._broadcast(self.buf)
        if not fits:
            self._broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8))

    def recv(self):
        self._broadcast(self.buf)
        n = int.from_bytes(self.buf[:8].numpy().tobytes(), "little")
        if n + 8 <= self.CAPACITY:
            return pickle.loads(self.buf[8: 8 + n].numpy().tobytes())
        data = torch.empty(n, dtype=torch.uint8)
        self._broadcast(data)
        return pickle.loads(data.numpy().tobytes())
