"""The suffix proposer on the host, without an engine: drafts from a request's own tokens or
from finished outputs (whichever expects more), what enters the output cache, tokens still
being sampled, and the DraftTree rows a VERIFY step gets (chains and trees)."""

from __future__ import annotations

import torch

from gearshift.request import Request, RequestStatus, SamplingParams
from gearshift.speculative.proposers.base import ProposeContext
from gearshift.speculative.proposers.suffix import MAX_DEFER, SuffixProposer
from gearshift.speculative.tree import ancestor_mask


def request(rid: str, prompt: list[int], output: list[int] = ()) -> Request:
    r = Request(rid, list(prompt), SamplingParams(max_tokens=64), 0)
    r.output_token_ids = list(output)
    r.status = RequestStatus.RUNNING
    return r


def finish(req: Request, reason: str) -> None:
    req.status, req.finish_reason = RequestStatus.FINISHED, reason


CODE = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]


def test_a_request_drafts_what_followed_its_own_text_earlier():
    p = SuffixProposer(cache_tokens=1000)
    req = request("a", CODE + [99] + CODE[:4])
    d = p.draft(req, 8)
    assert d.tokens == CODE[4:8] and d.source == "request" and d.match_len == 4
    req.output_token_ids += CODE[4:6]  # tokens commit: the index extends, the draft moves on
    d = p.draft(req, 8)  # 6 matched: at most 6 drafted, past the copy's end
    assert d.tokens == [*CODE[6:10], 99, 10] and d.match_len == 6
    assert d.expected == 6.0  # every continuation seen once: all certain
    req.output_token_ids[-1] = -5  # a placeholder: a token still being sampled
    req.num_pending = 1
    assert p.draft(req, 8).tokens == []


def test_finished_outputs_feed_later_requests_unless_aborted():
    p = SuffixProposer(cache_tokens=1000)
    done = request("done", [1, 2], CODE)
    cut = request("cut", [3], [50, 51, 52, 53, 54, 55])
    for r in (done, cut):
        p.draft(r, 4)  # indexed while they run
    finish(done, "length")
    finish(cut, "abort")
    p.forget_finished()
    assert p._indexes == {} and len(p.cache) == 1
    new = request("new", [7, 8, 9] + CODE[:3])  # its own text has no repeat: the cache drafts
    d = p.draft(new, 5)
    assert (d.tokens, d.source, d.match_len) == (CODE[3:6], "cache", 3)
    assert p.draft(request("x", [9, 50, 51]), 4).tokens == []  # the aborted output is not there
    p.reset_cache()  # a benchmark point starting cold
    assert len(p.cache) == 0 and p.cache.max_tokens == 1000
    assert p.draft(request("new2", [7, 8, 9] + CODE[:3]), 5).tokens == []
    off = SuffixProposer(cache_tokens=0)
    r = request("r", [1], CODE)
    off.draft(r, 4)
    finish(r, "stop")
    off.forget_finished()
    assert len(off.cache) == 0


def _ctx(reqs, ks, topk=1, nodes=None):
    b = len(reqs)
    roots = torch.tensor([r.all_token_ids[-1] for r in reqs])
    return ProposeContext(reqs, ks, max(ks), topk, nodes or max(ks) + 1, roots,
                          torch.zeros(b, dtype=torch.long), [0] * b,
                          torch.zeros(b, dtype=torch.long), torch.zeros(b, 0, dtype=torch.long),
                          None)


def test_chains_carry_each_requests_own_length():
    p = SuffixProposer(cache_tokens=0)
    reqs = [request("a", CODE + CODE[:4]), request("b", [5, 6, 7]), request("c", CODE + CODE[:6])]
    tree, nodes = p.propose(_ctx(reqs, [4, 3, 2]))
    assert nodes == [5, 1, 3]  # a: 4 drafts; b: no repeat; c: its K of 2
    assert tree.tokens[:, 0].tolist() == [13, 7, 15]  # roots
    assert tree.tokens[0, 1:].tolist() == CODE[4:8]
    assert tree.tokens[2, 1:3].tolist() == CODE[6:8]
    assert tree.parents[0].tolist() == [-1, 0, 1, 2, 3]
    assert p.stats == {"drafts": 3, "draft_tokens": 6, "from_request": 2, "from_cache": 0,
                       "empty": 1}


def test_trees_branch_where_the_text_did():
    p = SuffixProposer(cache_tokens=0, min_prob=0.0)
    # "1 2" was followed by 3 twice and by 4 once: a tree tries 3 first, then 4
    text = [1, 2, 3, 5, 1, 2, 3, 6, 1, 2, 4, 7, 9, 1, 2]
    reqs = [request("a", text), request("b", [8])]
    tree, nodes = p.propose(_ctx(reqs, [2, 2], topk=2, nodes=5))
    assert nodes == [5, 1] and tree.tokens.shape == (2, 5)
    # 3 (2/3), 4 (1/3), then 3's children 6 and 5 (1/3 each; 6 seen later comes first)
    assert tree.tokens[0].tolist() == [2, 3, 4, 6, 5]
    assert tree.parents[0].tolist() == [-1, 0, 0, 1, 1]
    assert tree.depths[0].tolist() == [0, 1, 1, 2, 2]
    anc = ancestor_mask(tree.parents, 2)[0]
    assert anc[3].tolist() == [True, True, False, True, False]


def test_the_warm_up_gets_every_planned_node():
    p = SuffixProposer(cache_tokens=0)
    p.full_drafts = True
    reqs = [request("a", CODE + CODE[:2]), request("b", [5, 6, 7])]
    tree, nodes = p.propose(_ctx(reqs, [4, 3]))
    assert nodes == [5, 4]  # 2 matched drafts + 2 fillers; 3 fillers
    assert tree.tokens[0, 1:].tolist() == [*CODE[2:4], 0, 0]
    assert tree.parents[0].tolist() == [-1, 0, 1, 2, 3]
    tree, nodes = p.propose(_ctx(reqs, [2, 2], topk=2, nodes=5))
    assert nodes == [5, 5]
    assert tree.parents[1].tolist() == [-1, 0, 0, 0, 0] and tree.depths[1].max() == 1
    assert p.stats["drafts"] == 0  # not counted


def test_indexes_catch_up_between_steps_and_a_long_prompt_waits_for_its_index():
    """index_ahead (while a VERIFY step's device runs) appends the running requests' committed
    tokens: the few each committed lately always, those far behind within its budget; once
    it runs, a request far behind prices no suffix draft (defer) while its index is built off
    the plan's critical path, for MAX_DEFER plans at most."""
    p = SuffixProposer(cache_tokens=1000)
    long = request("long", (CODE + [99]) * 10)  # 110 tokens: past INDEX_LAG
    short = request("short", CODE + [99], CODE[:4])
    assert not p.defer(long), "no index_ahead yet: previews build what they need"
    quiet = Request("quiet", list(CODE), SamplingParams(max_tokens=8, speculative=False), 0)
    p.index_ahead([long, short, quiet], budget=40)
    assert len(p.index(short).tokens) == 15, "a request's few new tokens: not budgeted"
    assert len(p.index(long).tokens) == 40
    assert "quiet" not in p._indexes, "a request that opted out is not indexed"
    assert p.defer(long), "70 tokens behind: it waits"
    new = request("new", (CODE + [98]) * 10)
    assert [p.defer(new) for _ in range(MAX_DEFER + 1)] == [True] * MAX_DEFER + [False], \
        "a request whose index is not built in time: its preview builds it"
    assert not p.defer(short), "a few tokens behind: the preview walks them"
    p.index_ahead([short, long])
    assert len(p.index(long).tokens) == 110 and not p.defer(long)
    short.output_token_ids += CODE[4:8]
    d = p.preview(short, 4)  # the new tokens walked on the index, none appended
    assert len(p.index(short).tokens) == 15 and d.tokens == CODE[8:10] + [99, 10]
    short.output_token_ids += CODE[8:10] + [99] + CODE * 6  # past INDEX_LAG: appended
    assert p.preview(short, 4).tokens == CODE[:4]
    assert p.index(short).tokens == short.all_token_ids
    finish(short, "stop")
    p.index_ahead([long])
    assert "short" not in p._indexes and len(p.cache) == 1  # its output entered the cache


def test_a_draft_certain_at_every_node_skips_the_output_cache():
    """No cache draft can expect more than one whose every node is certain: the cache is
    not matched (host time in every plan's previews); a shorter own draft still asks it."""
    p = SuffixProposer(cache_tokens=1000)
    p.cache.add(CODE)
    calls = []
    match = p.cache.match
    p.cache.match = lambda tokens: calls.append(len(tokens)) or match(tokens)
    req = request("a", CODE + [99] + CODE[:4])
    assert p.draft(req, 4).tokens == CODE[4:8] and calls == []
    d = p.draft(req, 8)  # 4 matched: at most 4 own drafts, the cache may draft 8
    assert len(calls) == 1 and d.tokens[:4] == CODE[4:8]
