"""Per-request draft lengths by greedy marginal allocation (goodput's per-request mode).

Request i's k-th draft token is worth the probability that it is accepted, a_i^k for a
chain (a_i: i's own per-token acceptance); it costs the step time it adds. Drafts are
taken best first (each request's in order: a_i^k falls with k); the step keeps the prefix
of that order that maximises expected committed tokens per millisecond:

    G(d) = (n + sum of the d best values) / t(n + d verified tokens, deepest draft)

so a draft whose value is below what its time would commit elsewhere is not taken, and a
step spends its verify budget on the requests that accept. Hysteresis per request: the
drafts a request holds from its last plan count `1 + margin` times their value, so no
request's K flaps on noise.

Data flow: GoodputPolicy.plan -> allocate(alphas, limits, step_ms, current) -> K_i.
"""

from __future__ import annotations

from collections.abc import Callable


def chain_gear(ks: list[int]) -> int:
    """The cost model's gear of a chain step of K_i per request: the uniform gear nearest
    their mean (it verifies about as many tokens: CostModel.predict_verified); 0 = plain."""
    if not any(ks):
        return 0
    return max(1, min(round(sum(ks) / len(ks)), max(ks)))


def allocate(alphas: list[float], limits: list[int], step_ms: Callable[[int, int], float],
             current: list[int] | None = None, margin: float = 0.0) -> list[int]:
    """K per request in 0..limits[i]. `step_ms(verified tokens, deepest K)`: the predicted
    step time; `current`: each request's K in its last plan (hysteresis)."""
    n = len(alphas)
    cand = []  # (value with hysteresis, request, its k)
    for i, (a, lim) in enumerate(zip(alphas, limits)):
        p, held = 1.0, current[i] if current else 0
        for k in range(1, lim + 1):
            p *= a
            cand.append((p * (1.0 + margin) if k <= held else p, i, k))
    # best first; ties in batch order (a request's drafts stay in k order: values fall)
    cand.sort(key=lambda c: (-c[0], c[1], c[2]))
    tokens, depth = float(n), 0
    best, cut = tokens / step_ms(n, 0), 0
    for j, (value, _, k) in enumerate(cand):
        tokens += value
        depth = max(depth, k)
        g = tokens / step_ms(n + j + 1, depth)
        if g > best:
            best, cut = g, j + 1
    ks = [0] * n
    for _, i, k in cand[:cut]:
        ks[i] = max(ks[i], k)
    return ks
