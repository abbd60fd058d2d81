"""CPU stand-ins for CUDA graphs. EagerGraphs (runner.shape_graphs' contract without CUDA):
each key's static inputs are fresh copies and fn re-runs on them, so the graphed
speculation paths (padded shapes, static-input bodies) run eagerly in CPU tests.
SharedPoolGraphs: the real GraphCache over an emulation of CUDA graphs sharing a pool."""

from __future__ import annotations

import torch

from gearshift.runner.graphs import GraphCache, map_tensors


class EagerGraphs:
    def __init__(self) -> None:
        self.keys: set = set()
        self.entries: dict = {}  # like GraphCache: one entry per captured shape
        self.watch = None  # like GraphCache: told of each new shape (serving_watch.py)

    def capture(self, key, fn, inputs, owned=True):
        return self.run(key, fn, inputs)

    def run(self, key, fn, inputs):
        if key not in self.keys and self.watch is not None:
            self.watch.captured(key, 0.0)
        self.keys.add(key)
        self.entries.setdefault(key, None)
        static = {k: v.clone() for k, v in inputs.items()}
        return fn(static)


def install(llm, graphs=None):
    """Give an engine a stand-in (EagerGraphs unless given), with decode graph sizes of
    powers of two. -> the stand-in."""
    runner = llm.engine.runner
    runner.shape_graphs = graphs = graphs if graphs is not None else EagerGraphs()
    runner.decode_pad = lambda bs: 1 << (bs - 1).bit_length()  # 5 requests -> 8 rows
    engine = llm.engine
    if engine.spec is not None:  # as the engine plans once its graphs exist: no riders
        engine.scheduler.speculation = engine.spec.speculation()
    return graphs


class SharedPoolGraphs(GraphCache):
    """The real GraphCache on CPU, with what a CUDA graph in a shared pool does to memory:
    a replay re-runs the FIRST body on the key's static inputs and writes what that body
    allocated at capture in place (a graph's addresses are fixed), and the replay of any
    graph may overwrite what another graph's capture allocated in the pool (here: always,
    with -1 / NaN / True). Keys for which `rerun(key)` holds (the target's and the
    draft-extend's, whose torch-reference attention reads host lengths) run their current
    body eagerly, as replays that overwrite too. `overwrite=False`: the same replays, and
    no graph touches another's memory (what a pool of its own per graph would give)."""

    def __init__(self, rerun=lambda key: False, overwrite: bool = True) -> None:
        super().__init__(pool=object())  # no CUDA pool handle on CPU
        self.rerun, self.overwrite = rerun, overwrite
        self.in_pool: dict[tuple, list[torch.Tensor]] = {}  # what each capture allocated
        self.replays: dict[tuple, int] = {}
        self._key: tuple | None = None

    def run(self, key, fn, inputs):
        if self.rerun(key):
            self.replayed(key)
            return fn({k: v.clone() for k, v in inputs.items()})
        return super().run(key, fn, inputs)

    def capture(self, key, fn, inputs, owned=True):
        self._key = key
        return super().capture(key, fn, inputs, owned)

    def replayed(self, key) -> None:
        self.replays[key] = self.replays.get(key, 0) + 1
        if not self.overwrite:
            return
        with torch.inference_mode():
            for other, tensors in self.in_pool.items():
                if other != key:
                    for t in tensors:
                        t.fill_(True if t.dtype == torch.bool else
                                -1 if not t.is_floating_point() else float("nan"))

    def _warm_up(self, fn, static):
        return fn(static), fn(static)

    def _capture(self, body):
        key, out = self._key, body()
        allocated: list[torch.Tensor] = []  # a new storage each call: the capture's own

        def note(a, b):
            if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
                allocated.append(a)
            return a

        map_tensors(note, out, body())
        self.in_pool[key] = allocated
        return _Replay(self, key, body, out, allocated), out


class _Replay:
    def __init__(self, graphs: SharedPoolGraphs, key, body, out, allocated) -> None:
        self.graphs, self.key, self.body, self.out = graphs, key, body, out
        self.allocated = {id(t) for t in allocated}

    def replay(self) -> None:
        self.graphs.replayed(self.key)
        map_tensors(lambda o, n: o.copy_(n) if id(o) in self.allocated else o,
                    self.out, self.body())
