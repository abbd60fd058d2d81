"""What a suffix draft is worth before it is proposed: its nodes' match scores, calibrated
online against what verification accepted of the suffix drafts that ran.

A node's score (suffix_draft.py) is the chance, were the text to continue as it did
before, that the node is accepted. Text does not always continue as before, so the
policy prices a node by the acceptance measured at its score:

    planning (host)    values(reqs, K): per request, the chain it would draft now, each
                       node j priced P(accepted | score, depth j) from the map; the scores
                       are kept (a request the plan did not draft by suffix decoding
                       waits a few plans before its next preview: chosen())
    after verify       record(req, K, a): for a request that drafted from suffix decoding,
                       each priced node j <= K: cell(score_j, j) += (1, j <= a)

    score  0   .1   .2   .3   .4   .5   .6   .7   .8   .9   1
    bin    |  0 |  1 |  2 |  3 |  4 |  5 |  6 |  7 |  8 |  9 |   x depth 1, 2, 3-4, 5-8,
                                                                 9-16, 17-32
    P(cell) = (accepted + mid * w) / (proposed + w)

By depth too: a copied span scores 1.0 at every node (each continuation was seen once),
yet text leaves a copy sooner or later, so deep nodes are accepted less often. Each cell
starts at its score (prior weight `PRIOR`) and follows the verify outcomes by decaying
counts, so the map tracks the traffic. A tree step's outcome is its accepted depth, the
same reading as a chain's.

Data flow: Scheduler._view (planning) -> Speculation.suffix_values -> values() ->
PolicyView.suffix_values -> HybridPolicy; SpecRunner.after_commit -> HybridProposer
.observe -> record().
"""

from __future__ import annotations

BINS = 10
DEPTHS = 6  # depth buckets: 1, 2, 3-4, 5-8, 9-16, 17-32
PRIOR = 4.0  # node-outcomes of prior weight per bin: its own score
DECAY = 0.995  # per recorded outcome of the bin: recent text weighs most


def _bucket(depth: int) -> int:
    return min(max(depth - 1, 0).bit_length(), DEPTHS - 1)  # 1, 2, 3-4, 5-8, ...


_BUCKETS = [_bucket(d) for d in range(2 ** (DEPTHS - 2) + 1)]  # deeper: the last bucket


class ScoreMap:
    """P(accepted | score, depth) by score bin and depth bucket, from decayed outcomes."""

    def __init__(self, bins: int = BINS, prior: float = PRIOR, decay: float = DECAY) -> None:
        self.bins, self.prior, self.decay = bins, prior, decay
        self.accepted = [[0.0] * DEPTHS for _ in range(bins)]
        self.proposed = [[0.0] * DEPTHS for _ in range(bins)]
        self._p: list[list[float]] | None = None  # P per cell, until the next record

    def _cell(self, score: float, depth: int) -> tuple[int, int]:
        return min(max(int(score * self.bins), 0), self.bins - 1), _bucket(depth)

    def __call__(self, score: float, depth: int = 1) -> float:
        b, d = self._cell(score, depth)
        mid = (b + 0.5) / self.bins
        return (self.accepted[b][d] + mid * self.prior) / (self.proposed[b][d] + self.prior)

    def chain(self, scores: list[float]) -> list[float]:
        """P(accepted) of a chain's nodes (depth 1, 2, ...) from their scores: a plan asks
        it of every request previewed, the map changes only after a step."""
        if self._p is None:
            self._p = [[self((b + 0.5) / self.bins, 1 << d) for d in range(DEPTHS)]
                       for b in range(self.bins)]
        p, top, buckets, n = self._p, self.bins - 1, _BUCKETS, len(_BUCKETS)
        return [p[min(max(int(s * self.bins), 0), top)][buckets[j] if j < n else DEPTHS - 1]
                for j, s in enumerate(scores, start=1)]

    def record(self, score: float, depth: int, accepted: bool) -> None:
        b, d = self._cell(score, depth)
        self.accepted[b][d] = self.decay * self.accepted[b][d] + accepted
        self.proposed[b][d] = self.decay * self.proposed[b][d] + 1.0
        self._p = None

    def table(self) -> list[float]:
        """P(accepted) per score bin at depth 1, low scores first (spec_stats)."""
        return [round(self((b + 0.5) / self.bins), 3) for b in range(self.bins)]


# a request priced and not drafted by suffix decoding (or with no chain) is previewed again
# only after 1, 2, 4 .. MAX_BACKOFF plans (a preview per request and step is host time that
# grows with the batch: novel text rarely takes its chain); one that takes it, every plan
MAX_BACKOFF = 8


class SuffixPricer:
    def __init__(self, preview, defer=None) -> None:
        # preview(req, K) -> SuffixDraft: the chain the proposer would draft for req now;
        # defer(req) -> True: its index is not built yet, no price this plan (no wait)
        self.preview, self.defer = preview, defer
        self.map = ScoreMap()
        self._priced: dict[str, list[float]] = {}  # request id -> scores of the last plan
        self._quiet: dict[str, list[int]] = {}  # request id -> [plans to skip, last wait]

    def values(self, reqs: list, k: int) -> list[list[float]]:
        """Per request, P(accepted) of each node of its suffix chain of at most k drafts
        ([] while a request waits: see chosen())."""
        out, self._priced, quiet = [], {}, self._quiet
        for req in reqs:
            rid, wait = req.request_id, quiet.get(req.request_id)
            waiting = wait is not None and wait[0] > 0
            if waiting or self.defer is not None and self.defer(req):
                if waiting:
                    wait[0] -= 1
                self._priced[rid] = []
                out.append([])
                continue
            scores = self.preview(req, k).scores if req.params.speculative and k else []
            self._priced[rid] = scores
            out.append(self.map.chain(scores))
            if not scores and req.params.speculative and k:
                self._wait(rid)
        if len(quiet) > 2 * len(reqs) + 64:  # finished requests' entries
            live = {r.request_id for r in reqs}
            self._quiet = {rid: w for rid, w in quiet.items() if rid in live}
        return out

    def chosen(self, reqs: list, proposers: list[str]) -> None:
        """The plan made from the latest values(): a request priced and drafted by suffix
        decoding is previewed every plan; one priced and not, after a wait."""
        for req, name in zip(reqs, proposers):
            rid = req.request_id
            if self._priced.get(rid):
                if name == "suffix":
                    self._quiet.pop(rid, None)
                else:
                    self._wait(rid)

    def _wait(self, rid: str) -> None:
        wait = self._quiet.get(rid)
        n = min(2 * wait[1], MAX_BACKOFF) if wait is not None else 1
        self._quiet[rid] = [n, n]

    def record(self, req, k: int, accepted: int) -> None:
        """A VERIFY outcome of a suffix draft of K = k: `accepted` drafts."""
        scores = self._priced.pop(req.request_id, None)
        for j, s in enumerate((scores or [])[:k], start=1):
            self.map.record(s, j, j <= accepted)
