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


class Arrival:
    """On the graph stand-in: request "a" speculates (K = 3, always); after its second
    VERIFY step a 40-token prompt "b" arrives, prefilled in chunks of a `budget`-token step
    in plain steps (on graphs no chunk rides in a VERIFY step). Records every draft extend
    (requests, longest backlog, graph width or None for eager, inside a catch-up?), each
    catch-up's extends."""

    def __init__(self, make_llm, tiny_llama_dir, tmp_path, budget: int) -> None:
        from checkpoints import random_prompts
        from eager_graphs import install

        head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
        self.first, self.arrival = random_prompts([6, 40], seed=4)
        self.params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
        opts = dict(max_num_batched_tokens=budget, max_num_seqs=4)
        self.want = [o.token_ids for o in make_llm(tiny_llama_dir, **opts).generate(
            [self.first, self.arrival], self.params)]
        llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                       num_draft_tokens=3, spec_policy="always", **opts)
        install(llm)
        self.eng = eng = llm.engine
        self.follow = follow = eng.spec.follow
        self.calls, self.groups = [], []
        extend, catch_up = follow.extend, follow.catch_up
        caught_up: list | None = None

        def spy_extend(reqs, prefix, lens, aux, token_idx):
            if reqs:
                self.calls.append((len(reqs), max(lens), follow._graph_width(prefix, lens),
                                   caught_up is not None))
            return extend(reqs, prefix, lens, aux, token_idx)

        def spy_catch_up(plan, max_tokens=4096):
            nonlocal caught_up
            caught_up = len(self.calls)
            catch_up(plan, max_tokens)
            self.groups.append(self.calls[caught_up:])
            caught_up = None

        follow.extend, follow.catch_up = spy_extend, spy_catch_up
        self.got = {"a": [], "b": []}
        eng.add_request("a", self.first, self.params)
        self.until(2)
        self.arrived = len(self.calls)  # extends before b arrived
        eng.add_request("b", self.arrival, self.params)

    def until(self, verify_steps: int | None = None) -> None:
        """Step to that many VERIFY steps (None: to the end)."""
        eng = self.eng
        while eng.has_unfinished_requests() if verify_steps is None \
                else eng.stats()["verify_steps"] < verify_steps:
            for out in eng.step():
                self.got[out.request_id] += out.new_token_ids


def test_an_arrival_does_not_send_the_decoders_catch_up_down_the_eager_path(
        make_llm, tiny_llama_dir, tmp_path):
    """As on a GPU: a request speculates; a new one arrives and its prefill chunks run in
    plain steps (the decoder at K = 0, a row behind each), where the draft also runs over
    the prompt (eagerly, all but its last row). The next VERIFY step catches both up in
    one padded draft-extend graph; a long backlog would go eagerly on its own. Greedy
    output stays plain decoding's."""
    from types import SimpleNamespace

    run = Arrival(make_llm, tiny_llama_dir, tmp_path, budget=16)
    run.until(3)  # b's prefill chunks in plain steps, then the first VERIFY step
    # b's prompt went through the draft in its plain steps: eagerly, one request at a time
    in_plain = [c for c in run.calls[run.arrived:] if not c[3]]
    assert in_plain and all(n == 1 and w is None for n, _, w, _ in in_plain)
    assert sum(rows for _, rows, _, _ in in_plain) == len(run.arrival) - 1
    [(n, rows, width, _)] = run.groups[-1]  # then both caught up in one graph, K + 1 wide
    assert n == 2 and rows <= 4 and width == 4
    run.until()
    assert [run.got["a"], run.got["b"]] == run.want
    # a long backlog (a request decoded plainly for long) goes eagerly, apart from short ones
    short, long = (SimpleNamespace(num_computed_tokens=20, draft_rows=d) for d in (18, 5))
    assert run.follow._backlog_groups([short, long], {id(short): 20, id(long): 20}) \
        == [[short], [long]]


def test_a_burst_of_prompts_runs_through_the_draft_once_its_prefill_ends(
        make_llm, tiny_llama_dir, tmp_path):
    """Four prompts at once, more than one step's token budget: their chunks fill plain
    steps back to back, and the draft passes over them only in the step whose plan ends
    the prefill (on a GPU the draft's pass would otherwise run between two chunks,
    delaying the next chunk's first tokens). Greedy output stays plain decoding's."""
    from dataclasses import replace

    from checkpoints import random_prompts
    from eager_graphs import install

    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    prompts = random_prompts([20, 20, 20, 20], seed=5)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    opts = dict(max_num_batched_tokens=32, max_num_seqs=4)
    want = [o.token_ids for o in make_llm(tiny_llama_dir, **opts).generate(prompts, params)]
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=3, spec_policy="always", **opts)
    install(llm)
    eng = llm.engine
    eng.scheduler.speculation = replace(eng.scheduler.speculation, mixed=False)
    follow, runs, plans = eng.spec.follow, [], []
    prompts_pass, after_plain = follow.extend_prompts, follow.after_plain

    def spy_plain(plan, aux):
        plans.append(plan.prefill_continues)
        after_plain(plan, aux)

    def spy_prompts(reqs, ends):
        runs.append((len(plans), sorted(r.request_id for r in reqs)))
        prompts_pass(reqs, ends)

    follow.after_plain, follow.extend_prompts = spy_plain, spy_prompts
    got = {str(i): [] for i in range(4)}
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, params)
    while eng.has_unfinished_requests():
        for out in eng.step():
            got[out.request_id] += out.new_token_ids
    assert plans[:3] == [True, True, False]  # 80 prompt tokens in steps of 32
    assert runs[0] == (3, ["0", "1", "2", "3"])  # one pass, once the last chunk ran
    assert [got[str(i)] for i in range(4)] == want
