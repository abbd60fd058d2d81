"""Step-time model t(K, padded batch, context) for the goodput policy.

    t(K, bs, ctx) = base[K](bs) + attn[K] * ctx_tokens          (milliseconds)
    t(T, bs, ctx, D) = t(mean K, bs, ctx) + draft_ms_per_depth * (D - mean K)
                     a chain step mixing K_i: T = sum(K_i + 1) verified tokens, mean
                     K = T / bs - 1 between the gears, D = max K_i (predict_verified);
                     on graphs T is the step's token bucket, a whole K per padded row

K is a gear: 0 = plain decode, 1..num_draft_tokens = chains, num_draft_tokens + 1 = the
engine's draft tree (policy/goodput.py). `base[K]` is a piecewise-linear curve over measured
batch sizes: profiled at start-up on the GPU (target forward over bs*(K+1) tokens plus the
draft's steps), or a roofline default when nothing was measured. Every executed step feeds
its measured wall time back (`observe`), which moves the nearest table points towards it
(fast for a point's first observations, then by an EMA of the error), so the model tracks
the real machine (host work and context growth included) without a user-written table.

Data flow: ModelRunner profile -> CostModel; Engine.step -> GoodputPolicy.observe ->
observe(K, bs, ctx, ms); GoodputPolicy.plan -> GearScorer.scores -> predict(K, bs, ctx).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass
class CostModel:
    # K -> sorted list of (batch size, ms)
    base: dict[int, list[list[float]]] = field(default_factory=dict)
    attn_ms_per_token: dict[int, float] = field(default_factory=dict)  # per context token
    ema: float = 0.1
    # K -> observations per table point: a point's first measurement replaces the prior,
    # the next ones average in (weight 1/(n+1)) until the EMA rate takes over
    counts: dict[int, list[int]] = field(default_factory=dict)
    # K -> (the points list, its batch sizes): the planner predicts every K every step, and
    # rebuilding the x list each time would dominate plan()'s host time
    _xs: dict[int, tuple[list, list[float]]] = field(default_factory=dict, repr=False)
    # the draft's catch-up over rows the requests committed at K = 0, ms per row (a prior:
    # the draft's share of the target's per-token cost in its longest profiled forward)
    catch_up_ms_per_row: float | None = None
    # observe(..., share=True) (the policy's running gear): the step's relative error also
    # moves the other speculative gears' points at the same batch sizes, by this share of
    # the EMA step. What moves one gear's wall time (longer contexts, the host's state)
    # moves its neighbours', so a neighbour priced minutes ago must not look cheaper because
    # the running gear's price followed the drift (goodput would then run a worse gear until
    # its own price caught up). A neighbour's own observations (probes, explorations) move
    # only its own points: they learn its gap to the running gear.
    shared: float = 1.0
    # ms one more draft step adds to a step (per unit of the deepest K beyond the mean K):
    # a mixed step drafts to its deepest request's K but verifies only sum(K_i + 1) tokens
    draft_ms_per_depth: float = 0.0

    @classmethod
    def roofline(cls, weight_bytes: float, flops_per_token: float, kv_bytes_per_token: float,
                 num_draft_tokens: int, batch_sizes: list[int], bandwidth: float = 4.2e12,
                 flops: float = 7.0e14, overhead_ms: float = 0.3, draft_frac: float = 0.05,
                 tree_nodes: int = 0) -> CostModel:
        """A prior from first principles: a step streams the weights once and computes every
        token; drafting costs `draft_frac` of a step per draft step. With `tree_nodes`, gear
        num_draft_tokens + 1 verifies a tree of that many nodes per request."""
        m = cls()
        for k in range(num_draft_tokens + 1 + bool(tree_nodes)):
            pts = []
            for bs in batch_sizes:
                tokens = bs * (tree_nodes if k > num_draft_tokens else 1 + k)
                t = max(weight_bytes / bandwidth, tokens * flops_per_token / flops) * 1e3
                t *= 1 + draft_frac * min(k, num_draft_tokens)
                pts.append([float(bs), t + overhead_ms])
            m.base[k] = pts
            m.attn_ms_per_token[k] = kv_bytes_per_token / bandwidth * 1e3
        m.catch_up_ms_per_row = draft_frac * flops_per_token / flops * 1e3
        m.draft_ms_per_depth = draft_frac * weight_bytes / bandwidth * 1e3
        return m

    def set_measured(self, k: int, points: list[list[float]]) -> None:
        """Replace K's curve by measured (batch size, ms) points (the start-up warm-up's).
        They stay a prior: a point's first online observation (a real step, at real
        context lengths) replaces it, the next ones average in. Points of the old curve
        past the largest measured batch (a CPU measures its smallest batches only) stay,
        scaled to meet the measurement there: the prior's shape, the machine's level."""
        pts = [[float(bs), float(ms)] for bs, ms in sorted(points)]
        old = self.base.get(k)
        if old and pts:
            top, top_ms = pts[-1]
            scale = top_ms / max(_interp(old, top, self._batch_sizes(k, old)), 1e-9)
            pts += [[bs, ms * scale] for bs, ms in old if bs > top]
        self.base[k] = pts
        self.counts[k] = [0] * len(pts)

    def observed(self, k: int, bs: int) -> int:
        """How many online observations the table point(s) predicting (K, bs) have had (the
        fewer of the two around an interpolated bs)."""
        pts = self.base.get(k)
        if not pts:
            return 0
        counts = self.counts.get(k) or [0] * len(pts)
        xs = self._batch_sizes(k, pts)
        i = bisect.bisect_left(xs, bs)
        if i < len(pts) and xs[i] == bs:
            return counts[i]
        return min(counts[max(i - 1, 0)], counts[min(i, len(pts) - 1)])

    def predict(self, k: int, bs: int, ctx_tokens: int) -> float:
        pts = self.base[k]
        return (_interp(pts, bs, self._batch_sizes(k, pts))
                + self.attn_ms_per_token.get(k, 0.0) * ctx_tokens)

    def predict_verified(self, tokens: int, bs: int, ctx_tokens: int, depth: int,
                         kmax: int, padded_bs: int | None = None, bucket=None) -> float:
        """A chain step of `bs` requests verifying `tokens` tokens in all (sum of K_i + 1),
        its deepest draft `depth`: the uniform gears' prices at the padded batch, taken at
        the mean K = tokens / bs - 1 (linear between gears; below K = 1 the 1 -> 2 slope
        from K = 1 down, so a VERIFY step keeps its fixed price over a plain one), plus
        the draft steps the deepest request runs beyond that mean. `bucket(tokens)`: the
        tokens a step mixing K really runs over (its graph's token bucket, over the padded
        batch; runner/graphs.py mixed_verify_tokens), priced as the mean K it pads to."""
        return self.verified_pricer(bs, ctx_tokens, kmax, padded_bs, bucket)(tokens, depth)

    def verified_pricer(self, bs: int, ctx_tokens: int, kmax: int,
                        padded_bs: int | None = None, bucket=None):
        """predict_verified for one batch as a function of (tokens, depth): the gears'
        prices are looked up once (the allocation prices every prefix of its drafts)."""
        pbs = padded_bs or bs
        prices = [self.predict(k, pbs, ctx_tokens) for k in range(kmax + 1)]
        per_depth = self.draft_ms_per_depth

        def price(tokens: int, depth: int) -> float:
            if bucket is not None and depth and tokens != bs * (depth + 1):  # K mixed
                tokens = bucket(tokens) * bs / pbs  # the bucket's tokens per padded row
            mean = min(max(tokens / bs - 1.0, 0.0), float(kmax))
            if mean == 0.0 and depth == 0:
                return prices[0]
            lo = min(max(int(mean), 1), max(kmax - 1, 1))
            hi = min(lo + 1, kmax)
            slope = prices[hi] - prices[lo] if hi > lo else 0.0
            t = max(prices[lo] + (mean - lo) * slope, prices[0])
            return t + per_depth * max(depth - mean, 0.0)
        return price

    def _batch_sizes(self, k: int, pts: list[list[float]]) -> list[float]:
        """The x column of K's curve, cached while the curve is the same list of the same
        length (observe moves y values only; set_measured installs a new list)."""
        cached = self._xs.get(k)
        if cached is None or cached[0] is not pts or len(cached[1]) != len(pts):
            cached = (pts, [p[0] for p in pts])
            self._xs[k] = cached
        return cached[1]

    def observe(self, k: int, bs: int, ctx_tokens: int, ms: float,
                share: bool = False, min_rate: float = 0.0) -> float | None:
        """Move the two table points around `bs` towards the measured step time, by at least
        `min_rate` of the error (`share`: and, by `shared` of the EMA step, the other
        speculative gears' points there).
        -> what was predicted for the step (None: K not modelled, or no time measured)."""
        pts = self.base.get(k)
        if not pts or ms <= 0:
            return None
        pred = self.predict(k, bs, ctx_tokens)
        ms = min(max(ms, 0.5 * pred), 2.0 * pred)  # one sample moves a point at most 2x
        err = ms - pred
        xs = self._batch_sizes(k, pts)
        i = bisect.bisect_left(xs, bs)
        counts = self.counts.setdefault(k, [0] * len(pts))
        exact = i < len(pts) and xs[i] == bs
        for j in {i} if exact else {max(i - 1, 0), min(i, len(pts) - 1)}:
            w = 1.0 if exact or len(pts) == 1 else 0.5
            # the first observation replaces the prior
            rate = max(self.ema, 1.0 / (counts[j] + 1), min_rate)
            pts[j][1] = max(pts[j][1] + rate * w * err, 1e-3)
            counts[j] += 1
            if share and k and self.shared:
                self._share(k, pts[j][0], self.shared * self.ema * w * err / pred)
        return pred

    def _share(self, k: int, bs: float, rel: float) -> None:
        """Scale the other speculative gears' points at batch size `bs` by 1 + rel."""
        for g, pts in self.base.items():
            if g == 0 or g == k:
                continue
            xs = self._batch_sizes(g, pts)
            i = bisect.bisect_left(xs, bs)
            if i < len(pts) and xs[i] == bs:
                pts[i][1] = max(pts[i][1] * (1.0 + rel), 1e-3)


def _interp(pts: list[list[float]], x: float, xs: list[float]) -> float:
    i = bisect.bisect_left(xs, x)
    if i <= 0:  # at or below the smallest measured batch: a step costs at least that
        return pts[0][1]
    if i >= len(pts):  # beyond the last point: extrapolate with the last slope
        if len(pts) == 1:
            return pts[-1][1]
        (x0, y0), (x1, y1) = pts[-2], pts[-1]
        return y1 + (y1 - y0) / (x1 - x0) * (x - x1)
    (x0, y0), (x1, y1) = pts[i - 1], pts[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
