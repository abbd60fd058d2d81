"""Draft state stays valid in every mode: after a stretch of plain decode (K = 0), the
first proposal once speculation resumes equals the proposal of an engine that prefilled
the same sequence from scratch and speculated at once. The draft saw every committed
token while speculation was off, so resuming costs no acceptance."""

from __future__ import annotations

import pytest
from checkpoints import make_tiny_checkpoint
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import SamplingParams
from gearshift.policy.base import Policy, PolicyView


class Scripted(Policy):
    """K = 0 for the first `off_steps` decode steps, then K = 3."""

    def __init__(self, off_steps: int) -> None:
        self.off_steps, self.calls = off_steps, 0

    def plan(self, view: PolicyView) -> list[int]:
        self.calls += 1
        return [0 if self.calls <= self.off_steps else 3] * len(view.requests)


def proposals(llm, prompt: list[int], policy: Policy, count: int = 1) -> list[tuple]:
    """Run until `count` VERIFY steps have proposed: per step (the draft tree's tokens,
    outputs before it)."""
    eng = llm.engine
    eng.set_policy(policy)
    seen: list[tuple[list[int], list[int]]] = []
    orig = eng.spec.proposer.propose

    def spy(ctx):
        tree, nodes = orig(ctx)
        seen.append((tree.tokens[0].tolist(), list(ctx.reqs[0].output_token_ids)))
        return tree, nodes

    eng.spec.proposer.propose = spy
    eng.add_request("r", prompt, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    while len(seen) < count:
        eng.step()
    eng.abort_request("r")
    while eng.has_unfinished_requests():
        eng.step()
    return seen


def first_proposal(llm, prompt: list[int], policy: Policy) -> tuple[list[int], list[int]]:
    """Run until the first VERIFY step: (its draft tree's tokens, outputs before it)."""
    return proposals(llm, prompt, policy)[0]


@pytest.mark.parametrize("algo", ["draft", "eagle3"])
def test_resume_after_plain_decode_proposes_like_a_fresh_engine(make_llm, tiny_llama_dir,
                                                                tmp_path, algo):
    if algo == "eagle3":
        draft = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    else:
        draft = make_tiny_checkpoint(tmp_path / "d", "llama", num_hidden_layers=1, seed=5)
    opts = dict(speculative_algorithm=algo, draft_model=str(draft), num_draft_tokens=3)
    prompt = [5, 9, 13, 2, 7, 11, 3, 8]
    tree_a, out_a = first_proposal(make_llm(tiny_llama_dir, **opts), prompt, Scripted(12))
    assert len(out_a) == 13  # 1 token from prefill + 12 plain decode steps, then speculation
    # the same committed sequence prefilled in one go; its prefill samples the same pending
    # token (greedy), and the very first decode step speculates
    tree_b, out_b = first_proposal(make_llm(tiny_llama_dir, **opts), prompt + out_a[:-1],
                                   Scripted(0))
    assert out_b == out_a[-1:]
    assert len(tree_a) == 4 and tree_a == tree_b
    if algo == "draft":  # anchor: the draft model's own greedy continuation, by HF
        from checkpoints import hf_greedy, load_hf_model

        want = hf_greedy(load_hf_model(draft), prompt + out_a, 3)
        assert tree_a[1:] == want


class Switching(Policy):
    """K per decode step from a list; the last value after it runs out."""

    def __init__(self, ks: list[int]) -> None:
        self.ks, self.calls = ks, 0

    def plan(self, view: PolicyView) -> list[int]:
        self.calls += 1
        return [self.ks[min(self.calls, len(self.ks)) - 1]] * len(view.requests)


def test_graphed_catch_up_after_a_short_stretch_proposes_like_a_fresh_engine(
        make_llm, tiny_llama_dir, tmp_path):
    """K = 3, then two plain steps, then K = 3: the backlog (2 rows + the accepted ones'
    follow-up) fits K + 1 tokens, so the catch-up replays the padded draft-extend graph over
    stored features. The proposal after it equals a fresh engine's on the same sequence."""
    from eager_graphs import install

    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    opts = dict(speculative_algorithm="eagle3", draft_model=str(head), num_draft_tokens=3)
    prompt = [5, 9, 13, 2, 7, 11, 3, 8]
    llm = make_llm(tiny_llama_dir, **opts)
    graphs = install(llm)
    tree_a, out_a = proposals(llm, prompt, Switching([3, 0, 0, 3]), count=2)[1]
    hidden = llm.engine.spec.proposer.head.hidden_size
    assert any(k[0] == "draft_extend" and k[3] == hidden for k in graphs.keys)  # from the store
    fresh = make_llm(tiny_llama_dir, **opts)
    tree_b, out_b = first_proposal(fresh, prompt + out_a[:-1], Switching([3]))
    assert out_b == out_a[-1:] and tree_a == tree_b


def test_an_arrival_does_not_send_the_decoders_catch_up_down_the_eager_path(
        make_llm, tiny_llama_dir, tmp_path):
    """As on a GPU: a request speculates; a new one arrives and its prefill chunks run in
    plain steps (the decoder at K = 0, a row behind each), where the draft also runs over
    the prompt (eagerly, all but its last row). The next VERIFY step catches both up in
    one padded draft-extend graph; a long backlog would go eagerly on its own. Greedy
    output stays plain decoding's."""
    from dataclasses import replace
    from types import SimpleNamespace

    from checkpoints import random_prompts
    from eager_graphs import install

    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    first, arrival = random_prompts([6, 40], seed=4)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    opts = dict(max_num_batched_tokens=16, max_num_seqs=4)
    want = [o.token_ids for o in make_llm(tiny_llama_dir, **opts).generate([first, arrival],
                                                                            params)]
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=3, spec_policy="always", **opts)
    install(llm)
    eng = llm.engine
    eng.scheduler.speculation = replace(eng.scheduler.speculation, mixed=False)  # graphed
    follow = eng.spec.follow
    calls, groups = [], []
    extend, catch_up = follow.extend, follow.catch_up

    def spy_extend(reqs, prefix, lens, aux, token_idx):
        if reqs:
            calls.append((len(reqs), max(lens), follow._graph_width(prefix, lens)))
        return extend(reqs, prefix, lens, aux, token_idx)

    def spy_catch_up(reqs, max_tokens=4096):
        start = len(calls)
        catch_up(reqs, max_tokens)
        groups.append(calls[start:])

    follow.extend, follow.catch_up = spy_extend, spy_catch_up
    got = {"a": [], "b": []}

    def step() -> None:
        for out in eng.step():
            got[out.request_id] += out.new_token_ids

    eng.add_request("a", first, params)
    while eng.stats()["verify_steps"] < 2:
        step()
    eng.add_request("b", arrival, params)
    plain = len(calls)
    while eng.stats()["verify_steps"] < 3:  # b's prefill chunks, then the first VERIFY
        step()
    # b's prompt went through the draft in its plain steps: eagerly, one request, no catch-up
    prompt = [c for g in groups for c in g]
    in_plain = [c for c in calls[plain:] if c not in prompt]
    assert in_plain and all(n == 1 and w is None for n, _, w in in_plain)
    assert sum(rows for _, rows, _ in in_plain) == len(arrival) - 1
    [(n, rows, width)] = groups[-1]  # then both caught up in one graph, K + 1 wide
    assert n == 2 and rows <= 4 and width == 4
    while eng.has_unfinished_requests():
        step()
    assert [got["a"], got["b"]] == want
    # a long backlog (a request decoded plainly for long) goes eagerly, apart from short ones
    short, long = (SimpleNamespace(num_computed_tokens=20, draft_rows=d) for d in (18, 5))
    assert follow._backlog_groups([short, long], 0) == [[short], [long]]
