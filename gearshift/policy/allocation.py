"""Per-request draft lengths by greedy marginal allocation (goodput's per-request mode).

Request i's k-th draft token is worth the probability that it is accepted, a_i^k for a
chain (a_i: i's own per-token acceptance); it costs the step time it adds. Drafts are
taken best first (each request's in order: a_i^k falls with k); the step keeps the prefix
of that order that maximises expected committed tokens per millisecond:

    G(d) = (n + sum of the d best values) / t(n + d verified tokens, deepest draft)

so a draft whose value is below what its time would commit elsewhere is not taken, and a
step spends its verify budget on the requests that accept. A request whose draft is
behind (it committed rows at K = 0) adds its catch-up to t when it takes a draft: the
plan that leaves K = 0 pays for it (the scheduler states those rows: plan.draft_catch_up).
Hysteresis per request: the drafts a request holds from its last plan count `1 + margin`
times their value, so no request's K flaps on noise.

Data flow: GoodputPolicy.plan -> allocate(alphas, limits, step_ms, current, catch_up) -> K_i.
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
             current: list[int] | None = None, margin: float = 0.0,
             catch_up: list[tuple[float, float]] | None = None) -> list[int]:
    """K per request in 0..limits[i]. `step_ms(verified tokens, deepest K)`: the predicted
    step time; `current`: each request's K in its last plan (hysteresis); `catch_up`: per
    request, (ms of its draft's catch-up over the rows it committed at K = 0, output tokens
    it has left): a request that leaves K = 0 pays that catch-up in this step's plan, priced
    as the uniform gears are (policy/scoring.py: spread over the steps it has left, at its
    expected tokens per step)."""
    n = len(alphas)
    cand = []  # (value with hysteresis, request, its k, catch-up ms it adds)
    for i, (a, lim) in enumerate(zip(alphas, limits)):
        p, held = 1.0, current[i] if current else 0
        rows_ms, left = catch_up[i] if catch_up else (0.0, 1.0)
        per_step, spread = 1.0, 0.0  # E_i(k); the catch-up's share at k - 1
        for k in range(1, lim + 1):
            p *= a
            per_step += p
            share = rows_ms * min(per_step / max(left, 1.0), 1.0) if rows_ms else 0.0
            cand.append((p * (1.0 + margin) if k <= held else p, i, k, share - spread))
            spread = share
    # best first; ties in batch order (a request's drafts stay in k order: values fall)
    cand.sort(key=lambda c: (-c[0], c[1], c[2]))
    g, cut = _best_prefix(cand, n, step_ms)
    if catch_up and any(c[3] for c in cand):
        # a request far behind can price every draft after its first out of the step: try
        # the step without the requests that must catch up, and keep the better
        rest = [c for c in cand if not catch_up[c[1]][0]]
        g_rest, cut_rest = _best_prefix(rest, n, step_ms)
        if g_rest > g:
            cand, cut = rest, cut_rest
    ks = [0] * n
    for _, i, k, _ in cand[:cut]:
        ks[i] = max(ks[i], k)
    return ks


def _best_prefix(cand: list[tuple], n: int, step_ms: Callable[[int, int], float]
                 ) -> tuple[float, int]:
    """The prefix of `cand` (best first) that maximises expected committed tokens per ms:
    -> (those tokens per ms, its length)."""
    tokens, depth, extra = float(n), 0, 0.0
    best, cut = tokens / step_ms(n, 0), 0
    for j, (value, _, k, catch) in enumerate(cand):
        tokens += value
        depth = max(depth, k)
        extra += catch
        g = tokens / (step_ms(n + j + 1, depth) + extra)
        if g > best:
            best, cut = g, j + 1
    return best, cut
