"""The texts suffix decoding matches against: a request's own tokens (`RequestIndex`) and a
bounded cache of recent requests' outputs (`OutputCache`), each a suffix automaton.

    RequestIndex   prompt + committed output of one request, extended as tokens commit;
                   rebuilt whenever the request's tokens are no longer what it holds
                   (a preempted or restarted request, a prefix-cache hit: the index reads
                   the tokens, never the KV), so it is never stale
    OutputCache    finished outputs, least recently used first, at most `max_tokens`
                   tokens; one automaton over them joined by separators (distinct negative
                   ids: no match crosses two outputs). Over the limit it drops the least
                   recently used outputs down to half the limit (the newest stays) and rebuilds (amortised:
                   one rebuild per max_tokens / 2 tokens added); an output a draft came
                   from counts as used

Data flow: SuffixProposer.propose -> RequestIndex.sync(tokens) -> longest_repeat (a preview:
match_on, the newest tokens walked, not appended);
OutputCache.match(tail) -> build_draft; finished requests -> OutputCache.add.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict

from gearshift.speculative.proposers.suffix_automaton import SuffixAutomaton
from gearshift.speculative.proposers.suffix_draft import best_of

_UNSEEN = object()


class RequestIndex:
    __slots__ = ("sam", "tokens")

    def __init__(self) -> None:
        self.sam = SuffixAutomaton()
        self.tokens: list[int] = []  # what the automaton holds

    def sync(self, tokens: list[int], limit: int | None = None) -> int:
        """Hold exactly `tokens`: append the new ones, or rebuild if the old ones changed;
        `limit`: append at most that many (the rest at a later sync). -> tokens appended."""
        n = len(self.tokens)
        if len(tokens) < n or tokens[:n] != self.tokens:
            self.sam, self.tokens, n = SuffixAutomaton(), [], 0
        new = tokens[n:] if limit is None else tokens[n:n + limit]
        self.sam.extend(new)
        self.tokens.extend(new)
        return len(new)

    def repeat(self, window: int) -> tuple[int, int]:
        """-> (state, length) of the longest suffix (at most `window` tokens) that occurs
        earlier in the request."""
        return self.sam.longest_repeat(window)

    def best_children(self, state: int, k: int):
        return best_of(self.sam.children(state), k)

    def best_child(self, state: int):
        return self.sam.best_child(state)

    def step(self, state: int, token: int) -> int:
        return self.sam.step(state, token)


class OutputCache:
    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.outputs: OrderedDict[int, list[int]] = OrderedDict()  # id -> tokens, LRU first
        self.tokens = 0  # held in `outputs`
        self._ids = 0
        # (state, k) -> best_children's answer, state -> best_child's, until the next output
        # is added: requests' short matches land on the same common states, with thousands
        # of continuations
        self._best: dict[tuple[int, int], tuple] = {}
        self._rebuild()

    def __len__(self) -> int:
        return len(self.outputs)

    def _rebuild(self) -> None:
        self.sam = SuffixAutomaton()
        self._starts: list[int] = []  # automaton position where each output starts
        self._owner: list[int] = []  # ... and its id
        for oid, toks in self.outputs.items():
            self._append(oid, toks)

    def _append(self, oid: int, tokens: list[int]) -> None:
        self._best.clear()  # a rebuild appends every output it keeps
        self._starts.append(self.sam.size)
        self._owner.append(oid)
        self.sam.extend(tokens)
        self.sam.append(-1 - oid)  # separator: never matched, never proposed

    def add(self, tokens: list[int]) -> None:
        """Cache a finished output (its last max_tokens tokens)."""
        if self.max_tokens <= 0 or not tokens:
            return
        tokens = list(tokens[-self.max_tokens:])
        oid, self._ids = self._ids, self._ids + 1
        self.outputs[oid] = tokens
        self.tokens += len(tokens)
        if self.tokens > self.max_tokens:
            while self.tokens > self.max_tokens // 2 and len(self.outputs) > 1:
                _, old = self.outputs.popitem(last=False)
                self.tokens -= len(old)
            self._rebuild()
        else:
            self._append(oid, tokens)

    def used(self, position: int) -> None:
        """The output holding automaton position `position` drafted: now most recent."""
        i = bisect_right(self._starts, position) - 1
        if i >= 0 and self._owner[i] in self.outputs:
            self.outputs.move_to_end(self._owner[i])

    def match(self, tokens: list[int]) -> tuple[int, int]:
        return self.sam.match(tokens)

    def best_children(self, state: int, k: int):
        best = self._best.get((state, k))
        if best is None:
            best = self._best[state, k] = best_of(self.sam.children(state), k)
        return best

    def best_child(self, state: int):
        best = self._best.get(state, _UNSEEN)  # None is an answer: no continuation
        if best is _UNSEEN:
            best = self._best[state] = self.sam.best_child(state)
        return best

    def step(self, state: int, token: int) -> int:
        return self.sam.step(state, token)

    def last(self, state: int) -> int:
        return self.sam.last[state]
