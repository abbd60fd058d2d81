"""A CPU stand-in for runner.shape_graphs (ShapeGraphs' contract without CUDA): each key's
static inputs are fresh copies and fn re-runs on them, so the graphed speculation paths
(padded shapes, static-input bodies) run eagerly in CPU tests."""

from __future__ import annotations


class EagerGraphs:
    def __init__(self) -> None:
        self.keys: set = set()
        self.entries: dict = {}  # like ShapeGraphs: one entry per captured shape

    def run(self, key, fn, inputs):
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
    return graphs
