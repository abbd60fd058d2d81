"""`eagle3+suffix` (and `draft+suffix`): a proposer and a draft length per request, priced.

The engine's policy (goodput by default: `inner`) plans the model proposer's K as it does
alone. Then each request with a suffix match may take suffix decoding instead, at the
length its match pays for:

    model      E_m(i) = (1 - a_i^(K_i + 1)) / (1 - a_i)    a_i: the request's acceptance
    suffix     E_s(i, K) = 1 + sum_{j <= K} v_ij           v_ij: P(node j accepted), its
                                                           match score calibrated online
                                                           (speculative/proposers/
                                                           suffix_price.py)
    step       G = sum_i E_i / t(verified tokens, the model's deepest K)

With a step-time model (goodput), requests switch to suffix best gain first, each at the K
that maximises G, while G grows by more than `margin`; then the model's remaining requests
decode plainly, least accepting first, where that grows G by more than `margin`. A step
where no request drafts with the model runs no draft pass: the hybrid prices it by its own
table (`free_cost`: the model's gears less their draft steps, then learned from those steps
alone), and the model's gears learn only from steps that ran its draft. A tree step keeps
its shape (one tree per request: a switch adds no verified tokens, suffix wins where it
expects more), unless chains with suffix rows as deep as they pay are predicted to beat it
by the margin (copying requests: drafts past the tree's depth).
Without one (always, random, threshold), suffix takes a request where its drafts valued at
least `min_value` expect more accepted tokens than the model's K. The model's own K and
acceptance evidence are the inner policy's (suffix outcomes feed only the calibration).

`mode`: both (the hybrid), model (EAGLE-3 alone) or suffix (suffix decoding alone, at the
lengths priced as above): one engine compares the three (bench sweep's policies).

Data flow: Scheduler -> plan(view: suffix_values per request) -> K per request, then
step_topk(view), step_proposers(view) -> StepPlan.draft_lens / proposers.
"""

from __future__ import annotations

from collections import Counter

from gearshift.policy.base import Policy, PolicyView
from gearshift.policy.cost import CostModel
from gearshift.policy.scoring import expected_tokens

SUFFIX = "suffix"
MODES = ("both", "model", "suffix")


class HybridPolicy(Policy):
    def __init__(self, inner: Policy, model: str, mode: str = "both", margin: float = 0.02,
                 min_value: float = 0.5, prior: float = 0.6, prior_weight: float = 4.0) -> None:
        if mode not in MODES:
            raise ValueError(f"hybrid mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.inner, self.model, self.mode = inner, model, mode
        self.margin, self.min_value = margin, min_value
        # a request's acceptance: its evidence around the population's (goodput's scorer
        # where the inner policy has one)
        scorer = inner.scorer
        self._prior = scorer.population_prior if scorer is not None else \
            lambda view, greedy=True: _population(view, prior, greedy)
        self.prior_weight = scorer.prior_weight if scorer is not None else prior_weight
        self._proposers: list[str] | None = None
        # mode both: the price of a step no request drafts with the model (the target's
        # pass alone) at K = mean suffix K; built at the first priced plan (model_free_costs)
        self.free_cost: CostModel | None = None
        self._free_log = [0.0, 0.0, 0]  # model-free steps: [measured ms, predicted ms, steps]
        self._topk = 1
        self.picks = {model: 0, SUFFIX: 0}  # request-steps planned per proposer (K > 0)

    prices_suffix = property(lambda self: self.mode != "model")

    # ------------------------------------------------------------------ the inner policy's
    drafts = property(lambda self: self.inner.drafts)
    cost = property(lambda self: self.inner.cost)
    switches = property(lambda self: self.inner.switches)
    reused = property(lambda self: self.inner.reused)
    last_prediction = property(lambda self: self.inner.last_prediction)

    @property
    def prediction_log(self) -> dict[str, list]:
        """The inner policy's [measured ms, predicted ms, steps] per mode, and "free": the
        VERIFY steps no request drafted with the model, against the hybrid's own table."""
        return {**self.inner.prediction_log, **({"free": self._free_log} if self._free_log[2] else {})}
    num_draft_tokens = property(lambda self: self.inner.num_draft_tokens)
    scorer = property(lambda self: self.inner.scorer)
    verify_tokens = property(lambda self: self.inner.verify_tokens)

    def pad(self, bs: int) -> int:
        return self.inner.pad(bs)

    def prepare(self, view: PolicyView) -> None:
        if self.mode != SUFFIX:
            self.inner.prepare(view)

    def observe(self, k: int, bs: int, ctx_tokens: int, ms: float,
                ks: list[int] | None = None) -> None:
        """Steps the model's gears price: its chains and its tree (gear K + 1, while the
        inner policy plans trees); suffix drafts deeper than its K are no gear."""
        kmax = self.inner.num_draft_tokens or k
        gear = k <= kmax or (k == kmax + 1 and self._topk > 1)  # the tree
        if gear and (not ks or max(ks) <= kmax):
            self.inner.observe(k, bs, ctx_tokens, ms, ks)

    def observe_model_free(self, k: int, bs: int, ctx_tokens: int, ms: float,
                           ks: list[int] | None = None) -> None:
        """A VERIFY step no request drafted with the model: the hybrid's own table of such
        steps (no draft pass: the model's gears would read it as a cheap gear k). Alone,
        suffix decoding's steps are the only VERIFY steps: they price its gears as before."""
        if self.mode != "both":
            self.observe(k, bs, ctx_tokens, ms, ks)
            return
        if self.free_cost is None or not k:
            return
        n, pbs = bs, self.inner.pad(bs)
        top = max(self.free_cost.base)
        gear = min(k, top)
        if ks and len(set(ks)) > 1:  # mixed K: its error, carried to its gear's price
            ms *= self.free_cost.predict(gear, pbs, ctx_tokens) / self._free_price(
                n, pbs, ctx_tokens)(n + sum(ks))
        # each gear its own: a cliff at one K (a shape slow on this machine) must not move
        # every other K's price with it
        pred = self.free_cost.observe(gear, pbs, ctx_tokens, ms)
        if pred is not None:
            log = self._free_log
            log[0], log[1], log[2] = log[0] + ms, log[1] + pred, log[2] + 1

    def observe_catch_up(self, rows: int, ms: float) -> None:
        self.inner.observe_catch_up(rows, ms)

    def step_topk(self, view: PolicyView) -> int:
        return self._topk

    def step_proposers(self, view: PolicyView) -> list[str] | None:
        return self._proposers

    # ------------------------------------------------------------------ planning
    def plan(self, view: PolicyView) -> list[int]:
        n = len(view.requests)
        if self.mode == SUFFIX:
            ks, self._topk = [0] * n, 1
        else:
            ks = list(self.inner.plan(view))
            self._topk = self.inner.step_topk(view)
        props = [self.model] * n
        values = view.suffix_values
        if self.mode != "model" and values is not None and any(values):
            alphas = self._alphas(view)
            chains = self._chains_instead(view, ks, alphas, values) if self._topk > 1 else None
            if chains is not None:  # deep suffix chains beat the model's tree
                ks, props, self._topk = *chains, 1
            elif self._topk > 1:
                self._trees(ks, props, alphas, values)
            elif self.cost is not None:
                self._priced(view, ks, props, alphas, values)
            else:
                self._unpriced(view, ks, props, alphas, values)
        self._proposers = props
        for p, k in zip(props, ks):
            if k:
                self.picks[p] += 1
        return ks

    def _alphas(self, view: PolicyView) -> list[float]:
        priors = {g: self._prior(view, g) for g in (True, False)}  # per sampling class
        w = self.prior_weight
        return [min((r.spec_alpha_num + priors[r.params.greedy] * w) / (r.spec_alpha_den + w),
                    0.999) for r in view.requests]

    def _model_tokens(self, a: float, k: int) -> float:
        return expected_tokens(a, k) if self.mode != SUFFIX else 1.0

    def _unpriced(self, view, ks, props, alphas, values) -> None:
        """No step-time model: suffix where its confident drafts expect more."""
        cap = view.suffix_draft_tokens
        for i, v in enumerate(values):
            k = next((j for j, x in enumerate(v[:cap]) if x < self.min_value), len(v[:cap]))
            if k and 1.0 + sum(v[:k]) > self._model_tokens(alphas[i], ks[i]):
                ks[i], props[i] = k, SUFFIX

    def _trees(self, ks, props, alphas, values) -> None:
        """A tree step: the same nodes either way; suffix where its chain expects more."""
        for i, v in enumerate(values):
            if v and ks[i] and 1.0 + sum(v[:ks[i]]) > self._model_tokens(alphas[i], ks[i]):
                props[i] = SUFFIX

    def _chains_instead(self, view, ks, alphas, values) -> tuple[list, list] | None:
        """A tree step's alternative (priced, both proposers): chains, the model's rows at
        the inner policy's best chain gear, suffix rows as deep as they pay (_priced). ->
        (K, proposers) where its predicted goodput beats the tree's (each request's share
        of it, or its suffix chain's at the tree's depth where that expects more) by the
        margin; None: keep the tree."""
        scorer = self.inner.scorer
        if self.mode != "both" or self.cost is None or scorer is None:
            return None
        kmax = self.inner.num_draft_tokens or view.num_draft_tokens
        scores = scorer.scores(view, kmax + 1)
        if kmax + 1 not in scores or not scores[kmax + 1][1]:
            return None
        tokens, ms, _ = scores[kmax + 1]
        share = tokens / len(ks)
        tree = sum(max(share, 1.0 + sum(v[:kmax])) for v in values) / ms
        gear = max(range(1, kmax + 1), key=lambda g: scores[g][2] if g in scores else 0.0)
        chain_ks, chain_props = [gear if k else 0 for k in ks], [self.model] * len(ks)
        best = self._priced(view, chain_ks, chain_props, alphas, values)
        return (chain_ks, chain_props) if best > tree * (1.0 + self.margin) else None

    def _priced(self, view, ks, props, alphas, values) -> float:
        """Switch requests to suffix, best gain first, at the K maximising tokens per ms.
        -> the plan's predicted tokens per ms."""
        n, cap = len(ks), view.suffix_draft_tokens
        if self.mode == "both" and self.free_cost is None:
            self.free_cost = model_free_costs(
                self.cost, self.inner.num_draft_tokens or view.num_draft_tokens, cap)
        price = self._pricer(view)
        tok = [self._model_tokens(a, k) for a, k in zip(alphas, ks)]
        if self.mode == SUFFIX:
            ks[:] = [0] * n
        ver = [k + 1 for k in ks]
        depth = [k for k in ks]  # the model's drafts per request (suffix rows: 0)
        cum = [_cumulative(v[:cap]) for v in values]
        gain = sorted((i for i in range(n) if cum[i]),
                      key=lambda i: tok[i] - cum[i][-1])
        best = sum(tok) / price(sum(ver), max(depth))
        left = Counter(depth)  # the model's depth per request (its deepest prices the step)
        t_all, v_all = sum(tok), sum(ver)
        for i in gain:
            t_rest, v_rest = t_all - tok[i], v_all - ver[i]
            left[depth[i]] -= 1
            d_rest = max((x for x, c in left.items() if c > 0), default=0)
            gs = [(t_rest + e) / price(v_rest + k, d_rest) for k, e in enumerate(cum[i], start=2)]
            g = max(gs)
            if g > best * (1.0 + self.margin):  # the shortest K of the best goodput
                k = gs.index(g) + 1
                best, e = g, cum[i][k - 1]
                tok[i], ver[i], depth[i], ks[i], props[i] = e, k + 1, 0, k, SUFFIX
                t_all, v_all = t_rest + e, v_rest + k + 1
            left[depth[i]] += 1
        if self.mode == "both":
            best = self._plain_model_rows(ks, props, tok, ver, depth, price, best)
        return best

    def _plain_model_rows(self, ks, props, tok, ver, depth, price, best: float) -> float:
        """The model's K was planned for every request; with some drafting from their
        suffix, the rest may no longer pay for the draft pass (saved only once no request
        drafts with the model): its requests go to K = 0, least accepting first, where a
        number of them does better by more than `margin`. -> the plan's tokens per ms."""
        rows = sorted((i for i, k in enumerate(ks) if k and props[i] == self.model),
                      key=lambda i: (tok[i] - 1.0) / ks[i])
        t, v, pick = sum(tok), sum(ver), None
        left = Counter(depth)  # the model's depth per request still drafting
        for j, i in enumerate(rows, start=1):
            t, v = t - tok[i] + 1.0, v - ver[i] + 1
            left[depth[i]] -= 1
            d = max((x for x, n in left.items() if n > 0), default=0)
            g = t / price(v, d)
            if g > best * (1.0 + self.margin) and (pick is None or g > pick[0]):
                pick = (g, j)
        for i in rows[:pick[1]] if pick is not None else []:
            ks[i] = 0
        return best if pick is None else pick[0]

    def _pricer(self, view: PolicyView):
        """(verified tokens, the model's deepest K) -> predicted step ms: the gears' prices
        at the mean K verified (CostModel.verified_pricer), past the deepest gear on the
        last gears' slope (long suffix chains)."""
        n, cost = len(view.requests), self.cost
        kmax = self.inner.num_draft_tokens or view.num_draft_tokens
        pad = self.inner.pad
        ctx = sum(r.num_tokens for r in view.requests)
        vt = self.inner.verify_tokens
        bucket = None if vt is None else (lambda t: vt(n, t))
        pricer = cost.verified_pricer(n, ctx, kmax, padded_bs=pad(n), bucket=bucket)
        top = cost.predict(kmax, pad(n), ctx)
        slope = max(top - cost.predict(max(kmax - 1, 0), pad(n), ctx), 0.0)
        per_depth = cost.draft_ms_per_depth
        free = None if self.free_cost is None else self._free_price(n, pad(n), ctx, bucket)

        def price(tokens: int, depth: int) -> float:
            if tokens == n and depth == 0:
                return pricer(tokens, 0)
            if depth == 0 and free is not None:  # no draft pass: the target's alone
                return free(tokens)
            mean = tokens / n - 1.0
            if mean <= kmax:
                return pricer(tokens, depth)
            return top + (mean - kmax) * slope + per_depth * max(depth - kmax, 0)
        return price


    def _free_price(self, n: int, pbs: int, ctx: int, bucket=None):
        """verified tokens -> ms of a step of n requests none drafting with the model: its
        table's prices at the mean K, linear between gears (below K = 1: gear 1's)."""
        cost = self.free_cost
        top = max(cost.base)
        prices = [cost.predict(k, pbs, ctx) for k in range(top + 1)]

        def price(tokens: int) -> float:
            if bucket is not None:
                tokens = bucket(tokens) * n / pbs
            mean = min(max(tokens / n - 1.0, 1.0), float(top))
            lo = min(int(mean), top - 1) if top > 1 else 1
            hi = min(lo + 1, top)
            return prices[lo] + (mean - lo) * (prices[hi] - prices[lo])
        return price


def model_free_costs(model: CostModel, kmax: int, depth: int) -> CostModel:
    """Gears 1..depth of steps that verify chains of K drafts the model did not propose: the
    model's gears less its K draft steps (draft_ms_per_depth each), past its deepest gear
    on its last gears' slope less a draft step; never below its plain step. A prior: the
    steps observed replace it (CostModel.observe)."""
    per_depth = model.draft_ms_per_depth
    free = CostModel(draft_ms_per_depth=0.0)
    sizes = [bs for bs, _ in model.base[kmax]]
    for k in range(depth + 1):
        g = min(k, kmax)
        pts = []
        for bs in sizes:
            ms, plain = model.predict(g, bs, 0), model.predict(0, bs, 0)
            if k:
                ms -= per_depth * g
            if k > kmax > 1:
                slope = model.predict(kmax, bs, 0) - model.predict(kmax - 1, bs, 0)
                ms += (k - kmax) * max(slope - per_depth, 0.0)
            pts.append([bs, max(ms, plain)])
        free.base[k] = pts
        free.counts[k] = [0] * len(pts)
        free.attn_ms_per_token[k] = model.attn_ms_per_token.get(g, 0.0)
    return free


def _cumulative(values: list[float]) -> list[float]:
    """E_s(K) = 1 + sum of the first K values, for K = 1..len."""
    out, acc = [], 1.0
    for v in values:
        acc += v
        out.append(acc)
    return out


def _population(view: PolicyView, prior: float, greedy: bool, weight: float = 10.0) -> float:
    num, den = view.population[not greedy] if view.population else (0.0, 0.0)
    return (num + prior * weight) / (den + weight)
