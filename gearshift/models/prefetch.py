"""Which weights a decoder layer prefetches into L2, and where (see kernels/prefetch.py).

A `WeightPrefetch` is attached to every DecoderLayer by ModelRunner on CUDA when
`GEARSHIFT_L2_PREFETCH` is on. At each fork point the layer calls the hook; the hook
forks the side stream off the current one there and launches `prefetch_l2` over the head
of the weight that point names:

    point          runs alongside                  prefetches
    after_qkv      RoPE + store, decode attention  o_proj
    after_attn     o_proj                          gate_up (head)
    after_o        the post-attention RMSNorm      gate_up (head)
    after_gate_up  (nothing: down follows)         down (head)
    after_down     the next layer's RMSNorm        the next layer's qkv (head)

Only forwards of at most `max_rows` tokens prefetch (decode-sized steps, where GEMMs
stream weights; larger steps are compute-bound). The model's forward calls `join()` once
at its end.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

POINTS = ("after_qkv", "after_attn", "after_o", "after_gate_up", "after_down")


@dataclass
class PrefetchPlan:
    bytes_at: dict[str, int] = field(default_factory=dict)  # point -> bytes (-1: all)
    max_rows: int = 64
    programs: int = 32
    evict_last: bool = False
    load: bool = False  # real loads instead of prefetch hints

    def __post_init__(self) -> None:
        unknown = set(self.bytes_at) - set(POINTS)
        if unknown:
            raise ValueError(f"unknown prefetch point(s) {sorted(unknown)} (points: {POINTS})")

    @classmethod
    def parse(cls, spec: str, **kw) -> PrefetchPlan:
        """'after_qkv=all,after_down=8M' -> a plan (sizes: bytes, K, M or `all`)."""
        units = {"K": 1 << 10, "M": 1 << 20}
        bytes_at = {}
        for item in filter(None, (s.strip() for s in spec.split(","))):
            point, _, size = item.partition("=")
            if size == "all":
                bytes_at[point] = -1
            elif size[-1:] in units:
                bytes_at[point] = int(float(size[:-1]) * units[size[-1]])
            else:
                bytes_at[point] = int(size)
        return cls(bytes_at, **kw)


def plan_from_env() -> PrefetchPlan | None:
    """GEARSHIFT_L2_PREFETCH: unset / `0` (off) or a spec for `PrefetchPlan.parse`."""
    spec = os.environ.get("GEARSHIFT_L2_PREFETCH", "0")
    return None if spec in ("", "0") else PrefetchPlan.parse(spec)


class WeightPrefetch:
    """The side stream and plan shared by all layers of one model."""

    def __init__(self, plan: PrefetchPlan, device: torch.device) -> None:
        self.plan = plan
        self.side = torch.cuda.Stream(device)
        self.forked = False

    def hook(self, layer, rows: int):
        """A callable `point -> None` for one layer's forward, or None (nothing to do)."""
        if rows > self.plan.max_rows or not self.plan.bytes_at:
            return None
        return lambda point: self.fork(layer, point)

    def fork(self, layer, point: str) -> None:
        nbytes = self.plan.bytes_at.get(point, 0)
        target = _target(layer, point)
        if nbytes == 0 or target is None:
            return
        from gearshift.models.kernels.prefetch import prefetch_l2

        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            prefetch_l2(target, None if nbytes < 0 else nbytes, programs=self.plan.programs,
                        evict_last=self.plan.evict_last, load=self.plan.load)
        self.forked = True

    def join(self) -> None:
        if self.forked:
            torch.cuda.current_stream().wait_stream(self.side)
            self.forked = False


def _target(layer, point: str) -> torch.Tensor | None:
    if point == "after_qkv":
        return layer.self_attn.o_proj.weight
    if point in ("after_attn", "after_o"):
        return layer.mlp.gate_up_proj.weight
    if point == "after_gate_up":
        return layer.mlp.down_proj.weight
    nxt = layer.next_layer  # after_down: () for the last layer
    return nxt[0].self_attn.qkv_proj.weight if nxt else None


def attach(model: torch.nn.Module, plan: PrefetchPlan | None, device: torch.device) -> None:
    """Give every decoder layer of `model` the shared WeightPrefetch (None: detach)."""
    wp = WeightPrefetch(plan, device) if plan is not None else None
    model.prefetch = wp
    layers = list(model.layers)
    for i, layer in enumerate(layers):
        layer.prefetch = wp
        # a tuple, so nn.Module does not register the next layer as a submodule
        layer.next_layer = tuple(layers[i + 1:i + 2])
