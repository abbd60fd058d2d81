"""Entry point of the ranks 1..N-1 that a tensor-parallel engine starts itself:
`python -m gearshift.distributed.worker`, its launch.WorkerSpec pickled on stdin.

Data flow: launch._spawn -> main() -> launch.run_follower (connect, FollowerEngine.serve).
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time

import torch.distributed as dist

from gearshift.distributed.launch import START_TIMEOUT, exit_now, run_follower


def main() -> None:
    spec = pickle.loads(sys.stdin.buffer.read())
    threading.Thread(target=_exit_with, args=(spec.parent,), name="gearshift-parent",
                     daemon=True).start()
    store = dist.TCPStore("127.0.0.1", spec.port, spec.size, is_master=False,
                          timeout=START_TIMEOUT)
    exit_now(run_follower(spec.config, store, spec.rank, spec.size, local=True))


def _exit_with(parent: int) -> None:
    """Rank 0 gone (killed before it could stop this one): stop too, even when a collective
    waits on it forever (NCCL)."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


if __name__ == "__main__":
    main()
