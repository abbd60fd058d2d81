r"""A suffix automaton over token ids, built online: the index suffix decoding drafts from.

Every substring of the text belongs to exactly one state; the strings of a state end at
the same positions (its `endpos`), so they share one occurrence count and one set of
continuations. A transition t from the state of P leads to the state of P t, whose count
is how often P was followed by t: the frequencies a draft chooses by.

    text  a b a b c            state   strings        count  link
                               0       ""             -      -
          a --> 1 --b--> 2     1       a              2      0
          b --> 3 (ab|b)       2       ab, b          2      0
          ...                  ...

Appending a token is amortised O(1) for the automaton, plus one step per state on the new
end's suffix-link chain (each gains an occurrence: `count`, `last`), at most CHAIN steps.
Chains are a few states long in text and code; only long periodic runs ("a a a ...", a
looping output) grow them with the text, and there the walk stops after CHAIN states: the
shortest patterns, seen most often already, stop counting (the cost per token stays
bounded instead of growing with the run). States, links and counts are flat lists; each
state's transitions a dict (token -> state).

Data flow: suffix_index.py appends a request's committed tokens, or a cache's outputs ->
`longest_repeat` / `match` find where the text's end occurred before ->
`children` gives (token, count, last end) per continuation -> suffix_draft.py.
"""

from __future__ import annotations

CHAIN = 256  # suffix-link states a new position is counted in, at most


class SuffixAutomaton:
    __slots__ = ("next", "link", "length", "count", "last", "end", "size")

    def __init__(self) -> None:
        self.next: list[dict[int, int]] = [{}]  # transitions per state
        self.link: list[int] = [-1]  # suffix link: the longest suffix in another state
        self.length: list[int] = [0]  # the longest string of the state
        self.count: list[int] = [0]  # occurrences (|endpos|)
        self.last: list[int] = [-1]  # the latest position a string of the state ends at
        self.end = 0  # the state of the whole text
        self.size = 0  # tokens appended

    def __len__(self) -> int:
        return self.size

    def _state(self, length: int, link: int, count: int, last: int,
               nxt: dict[int, int] | None = None) -> int:
        self.next.append({} if nxt is None else dict(nxt))
        self.link.append(link)
        self.length.append(length)
        self.count.append(count)
        self.last.append(last)
        return len(self.link) - 1

    def append(self, token: int) -> None:
        """Extend the text by one token (the standard online construction), then count
        the new end position in every state on its suffix-link chain."""
        pos = self.size
        self.size += 1
        nxt, link, length = self.next, self.link, self.length
        cur = self._state(length[self.end] + 1, 0, 0, pos)
        p = self.end
        while p != -1 and token not in nxt[p]:
            nxt[p][token] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][token]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:  # split q: its shorter strings now also end here
                clone = self._state(length[p] + 1, link[q], self.count[q], self.last[q], nxt[q])
                while p != -1 and nxt[p].get(token) == q:
                    nxt[p][token] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        self.end = cur
        s, steps = cur, CHAIN
        count, last = self.count, self.last
        while s > 0 and steps:  # every suffix of the text now ends at pos once more
            count[s] += 1
            last[s] = pos
            s = link[s]
            steps -= 1

    def extend(self, tokens) -> None:
        for t in tokens:
            self.append(t)

    def longest_repeat(self, window: int) -> tuple[int, int]:
        """-> (state, length) of the longest suffix of the text's last `window` tokens that
        also ends earlier in the text (so a token followed it there); (0, 0): none does.
        Bounding the pattern by the window keeps periodic text drafting far: its longest
        repeat overall is one period back, and runs into the text's end a period later.
        The text's suffixes are the states on the end's suffix-link chain: no walk over
        the tokens (a preview per request and step)."""
        link, length = self.link, self.length
        s = self.end
        while s and length[link[s]] >= window:  # the state of the window-long suffix
            s = link[s]
        n = min(length[s], window)
        if s and self.count[s] < 2:  # it occurs only at the end: its longest suffix
            s = link[s]  # that occurs elsewhere too
            n = length[s]
        return s, n

    def match_on(self, tokens, window: int) -> tuple[int, int]:
        """-> (state, length) of the longest suffix of text + `tokens` (at most `window`
        tokens) that occurs in the text and is followed by a token there: the text's end
        matched on by walking `tokens` alone, none of them appended (an index that holds
        all of a request's tokens but its newest)."""
        if not tokens:
            return self.longest_repeat(window)
        s, n = self.match(tokens, window, (self.end, min(self.size, window)))
        if s and self.count[s] < 2 and self.last[s] == self.size - 1:  # only at the end:
            s = self.link[s]  # nothing follows it; its longest suffix that occurs elsewhere
            n = self.length[s]
        return s, n

    def match(self, tokens, window: int | None = None,
              start: tuple[int, int] = (0, 0)) -> tuple[int, int]:
        """-> (state, length) of the longest suffix of `tokens` (at most `window` long)
        that occurs in the text (matching statistics: walk the tokens from `start`, a
        state and the length matched there, falling back along suffix links)."""
        nxt, link, length = self.next, self.link, self.length
        s, n = start
        for t in tokens:
            while s and t not in nxt[s]:
                s = link[s]
                n = length[s]
            if t in nxt[s]:
                s, n = nxt[s][t], n + 1
            if window is not None and n > window:
                n = window
                while length[link[s]] >= n:  # the state of the n-long suffix
                    s = link[s]
        return s, n

    def children(self, state: int) -> list[tuple[int, int, int]]:
        """Continuations of the state's strings: (token, count, latest end) per token,
        separators (negative ids) left out."""
        count, last = self.count, self.last
        return [(t, count[c], last[c]) for t, c in self.next[state].items() if t >= 0]

    def best_child(self, state: int) -> tuple[int, int, int, int] | None:
        """(the continuations' total count, the most frequent one's token, its count, its
        state), ties to the latest as `children` ranked would; None: no continuation. A
        chain's step: one pass over the transitions, no list."""
        count, last = self.count, self.last
        total, best, key = 0, None, (-1, -1)
        for t, c in self.next[state].items():
            if t < 0:
                continue
            n = count[c]
            total += n
            if (n, last[c]) > key:
                best, key = (t, c), (n, last[c])
        return None if best is None else (total, best[0], key[0], best[1])

    def step(self, state: int, token: int) -> int:
        return self.next[state][token]
