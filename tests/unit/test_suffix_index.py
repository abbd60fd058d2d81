"""Suffix decoding's index against brute force on random token strings: the longest
earlier match of the text's end, every continuation's count and latest end, matches of
another text's tail, and the drafts (the most frequent continuation, chains and trees)."""

from __future__ import annotations

import random

import pytest

from gearshift.speculative.proposers.suffix_automaton import SuffixAutomaton
from gearshift.speculative.proposers.suffix_draft import best_of, build_draft, ranked
from gearshift.speculative.proposers.suffix_index import OutputCache, RequestIndex


def starts(text: list[int], pat: tuple[int, ...]) -> list[int]:
    m = len(pat)
    return [i for i in range(len(text) - m + 1) if tuple(text[i:i + m]) == pat]


def brute_children(text: list[int], pat: tuple[int, ...]) -> dict[int, tuple[int, int]]:
    """token -> (times pat was followed by it, the latest position it did so at)."""
    out: dict[int, tuple[int, int]] = {}
    for i in starts(text, pat):
        j = i + len(pat)
        if j < len(text) and text[j] >= 0:
            c, _ = out.get(text[j], (0, -1))
            out[text[j]] = (c + 1, j)
    return out


def brute_repeat(text: list[int], window: int = 1 << 30) -> int:
    """The longest suffix of text (at most `window` long) that also occurs followed by a
    token."""
    for m in range(min(len(text) - 1, window), 0, -1):
        if any(i + m < len(text) for i in starts(text, tuple(text[-m:]))):
            return m
    return 0


class BruteIndex:
    """States are patterns; counts by scanning the text."""

    def __init__(self, text: list[int]) -> None:
        self.text = text

    def children(self, pat):
        return [(t, c, last) for t, (c, last) in brute_children(self.text, pat).items()]

    def best_children(self, pat, k):
        return best_of(self.children(pat), k)

    def step(self, pat, token):
        return (*pat, token)


def random_text(rng: random.Random, n: int, vocab: int) -> list[int]:
    # some copying, as agentic outputs do: spans of the text so far come back
    text: list[int] = []
    while len(text) < n:
        if text and rng.random() < 0.3:
            i = rng.randrange(len(text))
            text += text[i:i + rng.randint(1, 8)]
        else:
            text.append(rng.randrange(vocab))
    return text[:n]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("window", [1000, 5])
def test_counts_and_longest_repeat_match_brute_force(seed, window):
    rng = random.Random(seed)
    text = random_text(rng, 60, 2 + seed % 4)
    sam = SuffixAutomaton()
    for n in range(1, len(text) + 1):
        sam.append(text[n - 1])
        state, m = sam.longest_repeat(window)
        assert m == brute_repeat(text[:n], window)
        pat = tuple(text[n - m:n]) if m else ()
        got = {t: (c, last) for t, c, last in sam.children(state)}
        assert got == brute_children(text[:n], pat)
    for _ in range(40):  # any substring's state: same continuations as brute force
        i = rng.randrange(len(text))
        pat = tuple(text[i:i + rng.randint(1, 6)])
        s, m = sam.match(pat)
        assert m == len(pat)
        assert {t: (c, last) for t, c, last in sam.children(s)} == brute_children(text, pat)


@pytest.mark.parametrize("seed", range(6))
def test_match_is_the_longest_suffix_found_in_the_text(seed):
    rng = random.Random(100 + seed)
    text = random_text(rng, 80, 4)
    sam = SuffixAutomaton()
    sam.extend(text)
    for _ in range(30):
        tail = random_text(rng, rng.randint(1, 12), 4)
        _, m = sam.match(tail)
        want = max(k for k in range(len(tail) + 1) if k == 0 or starts(text, tuple(tail[-k:])))
        assert m == want


def greedy_chain(text: list[int], k: int, min_prob: float, window: int) -> list[int]:
    """The most frequent continuation of the longest repeated suffix, token by token
    (ties: the one seen latest), written out without the draft builder."""
    m = brute_repeat(text, window)
    pat = tuple(text[len(text) - m:]) if m else None
    out, p = [], 1.0
    while pat is not None and len(out) < min(k, m):
        ch = brute_children(text, pat)
        if not ch:
            break
        tok = max(ch, key=lambda t: ch[t])
        p *= ch[tok][0] / sum(c for c, _ in ch.values())
        if p < min_prob:
            break
        out.append(tok)
        pat = (*pat, tok)
    return out


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("min_prob,window", [(0.0, 64), (0.3, 64), (0.0, 6)])
def test_chain_is_the_most_frequent_continuation(seed, min_prob, window):
    rng = random.Random(200 + seed)
    text = random_text(rng, 70, 3 + seed % 3)
    idx = RequestIndex()
    idx.sync(text)
    state, m = idx.repeat(window)
    d = build_draft(idx, state, m, depth=8, topk=1, nodes=8, min_prob=min_prob)
    assert d.tokens == greedy_chain(text, 8, min_prob, window)
    assert d.parents == list(range(len(d.tokens)))
    assert all(a >= b for a, b in zip(d.scores, d.scores[1:]))  # path probabilities fall


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("topk,nodes", [(2, 6), (3, 12)])
def test_tree_equals_the_brute_force_expansion(seed, topk, nodes):
    rng = random.Random(300 + seed)
    text = random_text(rng, 90, 3)
    idx = RequestIndex()
    idx.sync(text)
    state, m = idx.repeat(64)
    pat = tuple(text[len(text) - m:])
    got = build_draft(idx, state, m, depth=5, topk=topk, nodes=nodes, min_prob=0.05)
    want = build_draft(BruteIndex(text), pat, m, depth=5, topk=topk, nodes=nodes, min_prob=0.05)
    assert (got.tokens, got.parents, got.scores) == (want.tokens, want.parents, want.scores)
    depths = got.depths()
    assert all(p < i + 1 for i, p in enumerate(got.parents))  # topological
    assert max(depths, default=0) <= min(5, m) and len(got.tokens) <= nodes
    for i, p in enumerate(got.parents):  # a node's score: its parent's times its share
        parent = 1.0 if p == 0 else got.scores[p - 1]
        assert got.scores[i] <= parent + 1e-12
    siblings: dict[int, list[int]] = {}
    for i, p in enumerate(got.parents):
        siblings.setdefault(p, []).append(got.tokens[i])
    assert all(len(set(s)) == len(s) <= topk for s in siblings.values())


@pytest.mark.parametrize("seed", range(4))
def test_a_chains_best_child_is_the_head_of_the_ranking(seed):
    """best_child (a chain's step, no lists) answers as best_of over the children does."""
    rng = random.Random(400 + seed)
    sam = SuffixAutomaton()
    for i, t in enumerate(random_text(rng, 120, 2 + seed)):
        sam.append(t)
        if i % 17 == 5:
            sam.append(-1 - i)  # a separator, as the output cache has: never a child
    for state in range(len(sam.link)):
        total, best = best_of(sam.children(state), 1)
        got = sam.best_child(state)
        if not best:
            assert got is None
        else:
            tok, count, _ = best[0]
            assert got == (total, tok, count, sam.step(state, tok))


def test_a_draft_follows_the_latest_of_equally_frequent_continuations():
    idx = RequestIndex()
    idx.sync([5, 1, 2, 5, 3, 4, 5])  # 5 -> 1 and 5 -> 3 once each: the later wins
    state, m = idx.repeat(64)
    assert build_draft(idx, state, m, 4, 1, 4, min_prob=0.0).tokens == [3]
    assert ranked([(1, 1, 1), (3, 1, 4), (7, 2, 0)]) == [(7, 2, 0), (3, 1, 4), (1, 1, 1)]


@pytest.mark.parametrize("k", [1, 2, 4])
def test_the_best_k_continuations_are_the_head_of_the_full_ranking(k):
    rng = random.Random(k)
    for _ in range(200):
        n = rng.randint(0, 40)
        ends = rng.sample(range(1000), n)  # a state's continuations end at distinct positions
        children = [(t, rng.randint(1, 4), e) for t, e in enumerate(ends)]
        assert ranked(children, k) == ranked(children)[:k]


def test_a_short_match_earns_a_short_draft():
    idx = RequestIndex()
    text = [9, 8, 1, 2, 3, 4, 5, 6, 7, 9, 8]  # "9 8" matched: 2 tokens, at most 2 drafted
    idx.sync(text)
    state, m = idx.repeat(64)
    assert m == 2
    assert build_draft(idx, state, m, 8, 1, 8).tokens == [1, 2]
    assert build_draft(idx, state, m, 8, 1, 8, spec_factor=3.0).tokens == [1, 2, 3, 4, 5, 6]


def brute_followed(text: list[int], tail: list[int], window: int) -> int:
    """The longest suffix of text + tail (at most `window` long) that occurs in text
    followed by a token of text."""
    full = text + tail
    for m in range(min(len(full), window), 0, -1):
        if any(i + m < len(text) for i in starts(text, tuple(full[-m:]))):
            return m
    return 0


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("window", [1000, 6])
def test_new_tokens_walked_on_the_text_match_like_brute_force(seed, window):
    """A preview's tokens past the index are walked, not appended: where the end of text +
    tail occurred in the text held, with what followed it there."""
    rng = random.Random(300 + seed)
    text = random_text(rng, 70, 2 + seed % 3)
    sam = SuffixAutomaton()
    sam.extend(text)
    for _ in range(25):
        if rng.random() < 0.5:  # copying on from somewhere in the text, as agents do
            i = rng.randrange(len(text))
            tail = text[i:i + rng.randint(1, 10)]
        else:
            tail = random_text(rng, rng.randint(1, 10), 2 + seed % 3)
        state, m = sam.match_on(tail, window)
        assert m == brute_followed(text, tail, window)
        pat = tuple((text + tail)[-m:]) if m else ()
        got = {t: (c, last) for t, c, last in sam.children(state)}
        assert got == brute_children(text, pat)
    assert len(sam) == len(text), "nothing appended"


def test_request_index_rebuilds_when_its_tokens_change():
    rng = random.Random(7)
    text = random_text(rng, 50, 3)
    idx = RequestIndex()
    idx.sync(text[:30])
    idx.sync(text[:40])  # extended
    assert idx.tokens == text[:40]
    other = text[:20] + [9] * 5  # restarted with other tokens: rebuilt, not extended
    idx.sync(other)
    fresh = SuffixAutomaton()
    fresh.extend(other)
    assert idx.tokens == other
    assert idx.repeat(64)[1] == fresh.longest_repeat(64)[1] == brute_repeat(other)
    s, _ = idx.sam.match([9, 9])
    assert {t for t, _, _ in idx.sam.children(s)} == {9}


def test_output_cache_matches_within_outputs_only():
    cache = OutputCache(1000)
    cache.add([1, 2, 3])
    cache.add([4, 5, 6])
    s, m = cache.match([7, 3, 4])  # "3 4" spans two outputs: only "4" matches
    assert m == 1 and [t for t, _, _ in cache.sam.children(s)] == [5]
    s, m = cache.match([3])  # the end of an output: nothing follows it
    assert m == 1 and cache.sam.children(s) == []
    s, m = cache.match([2])
    assert [t for t, _, _ in cache.sam.children(s)] == [3]


def test_output_cache_best_continuations_follow_every_added_output():
    cache = OutputCache(1000)
    cache.add([1, 2, 3])
    s, _ = cache.match([1])
    assert cache.best_children(s, 1) == (1, [(2, 1, 1)])
    cache.add([1, 5, 0])
    cache.add([1, 5, 0])  # "1 5" now outnumbers "1 2": the remembered answer is stale
    s, _ = cache.match([1])
    assert cache.best_children(s, 1) == best_of(cache.sam.children(s), 1)
    assert cache.best_children(s, 2)[0] == 3 and cache.best_children(s, 1)[1][0][:2] == (5, 2)
    cache.add(list(range(100, 1100)))  # over the limit: rebuilt, older outputs dropped
    s, m = cache.match([1])
    assert m == 0 or cache.best_children(s, 1) == best_of(cache.sam.children(s), 1)


def test_output_cache_counts_like_brute_force_over_its_outputs():
    rng = random.Random(11)
    outs = [random_text(rng, rng.randint(3, 20), 4) for _ in range(8)]
    cache = OutputCache(10_000)
    joined: list[int] = []
    for i, o in enumerate(outs):
        cache.add(o)
        joined += [*o, -1 - i]
    for _ in range(40):
        o = rng.choice(outs)
        i = rng.randrange(len(o))
        pat = tuple(o[i:i + rng.randint(1, 4)])
        s, m = cache.match(list(pat))
        assert m == len(pat)
        got = {t: (c, last) for t, c, last in cache.sam.children(s)}
        assert got == brute_children(joined, pat)


def test_output_cache_drops_least_recently_used_outputs_by_tokens():
    cache = OutputCache(10)
    cache.add([1, 1, 1, 1])  # id 0
    cache.add([2, 2, 2, 2])  # id 1
    s, _ = cache.match([1])
    cache.used(cache.last(s))  # output 0 drafted: now the most recent
    cache.add([3, 3, 3, 3])  # 12 tokens > 10: down to 5 at most, the newest kept
    assert list(cache.outputs.values()) == [[3, 3, 3, 3]]
    assert cache.tokens == 4
    cache.add([4, 4])  # 6: fits
    assert cache.match([1])[1] == 0 and cache.match([2])[1] == 0
    assert cache.match([3, 3])[1] == 2 and cache.match([4])[1] == 1
    cache = OutputCache(16)
    for t in ([1] * 2, [2] * 5, [3] * 5):
        cache.add(t)
    cache.used(cache.last(cache.match([1])[0]))
    cache.add([4] * 6)  # 18 > 16: 1 was used after 2 and 3 were added, so 2 and 3 go
    assert list(cache.outputs.values()) == [[1] * 2, [4] * 6]
    assert cache.match([1, 1])[1] == 2 and cache.match([2])[1] == 0
    assert OutputCache(0).tokens == 0
    off = OutputCache(0)
    off.add([1, 2, 3])
    assert len(off) == 0


def test_a_long_run_costs_a_bounded_walk_per_token_and_still_drafts_the_run():
    from gearshift.speculative.proposers import suffix_automaton

    idx = RequestIndex()
    n = 3 * suffix_automaton.CHAIN
    idx.sync([4] * n)
    state, m = idx.repeat(64)
    assert m == 64  # the pattern: the run's last 64 tokens, seen many times before
    assert build_draft(idx, state, m, 32, 1, 32).tokens == [4] * 32
    one, _ = idx.sam.match([4])
    assert idx.sam.count[one] <= suffix_automaton.CHAIN + 1 < n  # "4" stopped counting
