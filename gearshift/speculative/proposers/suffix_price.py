"""What a suffix draft is worth before it is proposed: its nodes' match scores, calibrated
online against what verification accepted of the suffix drafts that ran.

A node's score (suffix_draft.py) is the chance, were the text to continue as it did
before, that the node is accepted. Text does not always continue as before, so the
policy prices a node by the acceptance measured at its score:

    planning (host)    values(reqs, K): per request, the chain it would draft now, each
                       node priced P(accepted | score) from the map; the scores are kept
    after verify       record(req, accepted): for a request that proposed from suffix
                       decoding, each priced node j of its K: bin(score_j) += (1, j <= a)

    score  0   .1   .2   .3   .4   .5   .6   .7   .8   .9   1
    bin    |  0 |  1 |  2 |  3 |  4 |  5 |  6 |  7 |  8 |  9 |   P = (acc + mid * w) / (n + w)

Each bin starts at its own score (prior weight `PRIOR`) and follows the verify outcomes
by decaying counts, so the map tracks the traffic. A tree step's outcome is its accepted
depth, the same reading as a chain's.

Data flow: Scheduler._view (planning) -> Speculation.suffix_values -> values() ->
PolicyView.suffix_values -> HybridPolicy; SpecRunner.after_commit -> HybridProposer
.observe -> record().
"""

from __future__ import annotations

BINS = 10
PRIOR = 4.0  # node-outcomes of prior weight per bin: its own score
DECAY = 0.995  # per recorded outcome of the bin: recent text weighs most


class ScoreMap:
    """P(accepted | score) by score bin, from decayed verify outcomes."""

    def __init__(self, bins: int = BINS, prior: float = PRIOR, decay: float = DECAY) -> None:
        self.bins, self.prior, self.decay = bins, prior, decay
        self.accepted = [0.0] * bins
        self.proposed = [0.0] * bins

    def _bin(self, score: float) -> int:
        return min(max(int(score * self.bins), 0), self.bins - 1)

    def __call__(self, score: float) -> float:
        b = self._bin(score)
        mid = (b + 0.5) / self.bins
        return (self.accepted[b] + mid * self.prior) / (self.proposed[b] + self.prior)

    def record(self, score: float, accepted: bool) -> None:
        b = self._bin(score)
        self.accepted[b] = self.decay * self.accepted[b] + accepted
        self.proposed[b] = self.decay * self.proposed[b] + 1.0

    def table(self) -> list[float]:
        """P(accepted) per bin, low scores first (spec_stats)."""
        return [round(self((b + 0.5) / self.bins), 3) for b in range(self.bins)]


class SuffixPricer:
    def __init__(self, preview) -> None:
        # preview(req, K) -> SuffixDraft: the chain the proposer would draft for req now
        self.preview = preview
        self.map = ScoreMap()
        self._priced: dict[str, list[float]] = {}  # request id -> scores of the last plan

    def values(self, reqs: list, k: int) -> list[list[float]]:
        """Per request, P(accepted) of each node of its suffix chain of at most k drafts."""
        out, self._priced = [], {}
        for req in reqs:
            scores = self.preview(req, k).scores if req.params.speculative and k else []
            self._priced[req.request_id] = scores
            out.append([self.map(s) for s in scores])
        return out

    def record(self, req, k: int, accepted: int) -> None:
        """A VERIFY outcome of a suffix draft of K = k: `accepted` drafts."""
        scores = self._priced.pop(req.request_id, None)
        for j, s in enumerate((scores or [])[:k]):
            self.map.record(s, j < accepted)
