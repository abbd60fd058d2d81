"""The ranks' process groups on gloo, two ranks as two threads of this process: the model's
collectives (sum, gather in rank order, min), rank 0's objects broadcast (start-up choices)
and the Channel's messages, short (one broadcast) and long (a second one), in order.

Data flow (tests only): TCPStore -> DeviceComm + Channel per thread -> results compared.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from gearshift.distributed.comm import Channel, DeviceComm
from gearshift.server.background import free_port


def _on_two_ranks(body) -> list:
    """body(rank, comm, channel) on ranks 0 and 1 at once; -> their results."""
    port = free_port()
    stores = [None, None]
    stores[0] = dist.TCPStore("127.0.0.1", port, 2, True, timeout=timedelta(seconds=30),
                              wait_for_workers=False)
    results, errors = [None, None], []

    def run(rank: int) -> None:
        try:
            store = stores[0] if rank == 0 else dist.TCPStore(
                "127.0.0.1", port, 2, False, timeout=timedelta(seconds=30))
            channel = Channel(store, rank, 2, local=True)
            comm = DeviceComm(store, rank, 2, torch.device("cpu"), local=True)
            results[rank] = body(rank, comm, channel)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return results


def test_collectives_and_objects():
    def body(rank, comm, channel):
        x = torch.full((2, 3), float(rank + 1))
        comm.all_reduce(x)
        gathered = comm.all_gather(torch.full((1, 2), float(rank)))
        return (x.tolist(), gathered.tolist(), comm.min_int(10 - rank),
                comm.broadcast_object({"route": {64: 128}} if rank == 0 else None))

    for x, gathered, smallest, obj in _on_two_ranks(body):
        assert x == [[3.0] * 3] * 2 and gathered == [[0.0, 0.0], [1.0, 1.0]]
        assert smallest == 9 and obj == {"route": {64: 128}}


def test_channel_messages_in_order_short_and_long():
    messages = [("step", [1, 2, 3]), {"prompt": list(range(20_000))}, "last"]

    def body(rank, comm, channel):
        if rank == 0:
            for m in messages:
                channel.send(m)
            return messages
        return [channel.recv() for _ in messages]

    sent, received = _on_two_ranks(body)
    assert received == sent
