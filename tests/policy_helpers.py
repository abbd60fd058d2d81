"""Shared helpers of the policy unit tests: requests with recorded acceptance evidence and a
memory-bound (H200-like roofline) cost table."""

from __future__ import annotations

from gearshift.policy.cost import CostModel
from gearshift.request import Request, SamplingParams


def reqs(n, alpha=None, speculative=True, ctx=100):
    out = []
    for i in range(n):
        r = Request(str(i), [1] * ctx, SamplingParams(speculative=speculative), 0)
        if alpha is not None:  # as if many steps had been observed at this acceptance
            r.spec_alpha_num, r.spec_alpha_den = 1000 * alpha, 1000.0
        out.append(r)
    return out


def memory_bound_costs(num_draft_tokens=5, sizes=(1, 8, 64, 256), knee_tokens=256, floor_ms=4.0):
    """A decode step costs `floor_ms` until the step's tokens pass the knee, then grows
    linearly (an H200-like roofline); K drafts cost bs*(K+1) tokens."""
    m = CostModel()
    for k in range(num_draft_tokens + 1):
        m.base[k] = [[float(bs), floor_ms * max(1.0, bs * (k + 1) / knee_tokens)] for bs in sizes]
        m.attn_ms_per_token[k] = 0.0
    return m


def measured_online(cost: CostModel, times: int = 2) -> CostModel:
    """`cost` as if each of its points had been observed online `times` times: the policy
    owes no fresh exploration to any gear (tests that plan without observing steps)."""
    for k, pts in cost.base.items():
        cost.counts[k] = [times] * len(pts)
    return cost
