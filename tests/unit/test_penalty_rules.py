"""Penalties on the logits (runner/penalties.py) against a plain-Python reference of each
rule, row by row: min_tokens, logit_bias, repetition (HF), frequency and presence (OpenAI);
the device count table (rebuilt rows, recorded tokens); the drafts-on-path counts of a
VERIFY tree; draft-vocabulary columns; and SamplingParams' checks.

Data flow (tests only): Requests -> stage_penalties (Stager) -> PenaltyBatch.apply <->
reference(); path_counts <-> a walk up each node's parents.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from penalty_reference import penalised

from gearshift.request import Request, SamplingParams, SamplingParamsError
from gearshift.runner.penalties import (
    PROMPT_BIT,
    TokenCounts,
    path_counts,
    penalty_batch,
    stage_penalties,
)
from gearshift.runner.staging import Stager

V = 12
EOS = 1


def make_req(row: int, prompt: list[int], output: list[int], **params) -> Request:
    req = Request(f"r{row}", prompt, SamplingParams(max_tokens=32, **params), 0, (EOS,))
    req.output_token_ids = list(output)
    req.req_pool_index = row
    return req


CASES = [
    dict(repetition_penalty=1.7),
    dict(repetition_penalty=0.6),
    dict(presence_penalty=1.5, frequency_penalty=-0.7),
    dict(min_tokens=5, stop_token_ids=[4]),
    dict(min_tokens=5, ignore_eos=True, stop_token_ids=[4]),
    dict(logit_bias={3: 2.5, 7: -100.0}),
    dict(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.25,
         logit_bias={0: 1.0}, min_tokens=3),
    {},
]


def _batch(reqs: list[Request], record: list[bool] | None = None, pad: int = 0):
    st = Stager(torch.device("cpu"))
    stage_penalties(st, reqs, pad, record or [True] * len(reqs), [True] * len(reqs))
    return penalty_batch(st.to_device(), reqs)


def test_apply_matches_the_rules_row_by_row():
    gen = torch.Generator().manual_seed(0)
    prompt, output = [2, 5, 5, 9], [5, 3, 3, 3, 8]
    reqs = [make_req(i + 1, prompt, output, **case) for i, case in enumerate(CASES)]
    pb = _batch(reqs, pad=2)  # two neutral padding rows, as a padded DECODE batch
    counts = TokenCounts(len(reqs) + 1, V, torch.device("cpu"))
    counts.reset(pb)
    logits = 3 * torch.randn(len(reqs) + 2, V, generator=gen)
    for out_index in (2, 4, 7):
        steps = torch.full((len(reqs) + 2,), out_index)
        got = pb.apply(logits, counts, None, steps)
        for i, req in enumerate(reqs):
            # min_tokens is judged at out_index (a VERIFY node's), the counts are the output's
            masked = out_index < req.params.min_tokens
            p = replace(req.params, min_tokens=len(output) + 1 if masked else 0)
            want = penalised(logits[i].tolist(), prompt, output, p, (EOS,))
            torch.testing.assert_close(got[i], torch.tensor(want), rtol=0, atol=1e-6)
        assert torch.equal(got[-2:], logits[-2:])  # padding rows untouched


def test_untouched_rows_keep_their_exact_logits():
    """A request without penalties in a penalised batch samples from its own logits, bit
    for bit (0 * count, / 1.0 and + 0 are exact)."""
    reqs = [make_req(1, [1, 2], [3], repetition_penalty=1.5), make_req(2, [1, 2, 3], [3, 3])]
    pb = _batch(reqs)
    counts = TokenCounts(3, V, torch.device("cpu"))
    counts.reset(pb)
    logits = torch.randn(2, V, dtype=torch.bfloat16)
    out = pb.apply(logits, counts, None, torch.zeros(2, dtype=torch.int64))
    assert torch.equal(out[1], logits[1].float())


def test_count_table_rows_are_rebuilt_and_record_sampled_tokens():
    req = make_req(2, [4, 4, 7], [7, 9, 9], frequency_penalty=1.0)
    counts = TokenCounts(4, V, torch.device("cpu"))
    counts.table.fill_(123)  # a previous request's counts
    counts.reset(_batch([req]))
    row = counts.table[2]
    assert row[4] == PROMPT_BIT and row[7] == PROMPT_BIT + 1 and row[9] == 2
    assert int((row != 0).sum()) == 3 and bool((counts.table[1] == 123).all())
    counts.record(torch.tensor([2, 2, 3]), torch.tensor([9, 0, 5]), torch.tensor([1, 1, 0]))
    assert row[9] == 3 and row[0] == 1 and counts.table[3, 5] == 123


def test_records_only_rows_that_sample_with_counted_penalties():
    reqs = [make_req(1, [1], [], presence_penalty=1.0), make_req(2, [1], [], min_tokens=2),
            make_req(3, [1], [], presence_penalty=1.0)]
    pb = _batch(reqs, record=[True, True, False])
    assert pb.record.tolist() == [1, 0, 0] and pb.use_counts


def test_batches_without_counted_penalties_need_no_table():
    pb = _batch([make_req(1, [1], [], logit_bias={2: 1.0}), make_req(2, [1], [])])
    assert not pb.use_counts and pb.init is None
    out = pb.apply(torch.zeros(2, V), None, None, torch.zeros(2, dtype=torch.int64))
    assert out[0, 2] == 1.0 and out[1].abs().sum() == 0


def _walk_path(parents: list[int], depths: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        if depths[node] >= 1:
            path.append(node)
        node = parents[node]
    return path


def test_path_counts_are_the_drafts_on_each_nodes_path():
    from gearshift.speculative.tree import ancestor_mask

    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3], [-1, 0, 1, 2, 3, 4, 5]])
    depths = torch.tensor([[0, 1, 1, 2, 2, 2, 3], [0, 1, 2, 3, 4, 5, 6]])
    tokens = torch.tensor([[5, 3, 3, 5, 1, 3, 3], [2, 2, 2, 4, 2, 4, 0]])
    anc = ancestor_mask(parents, 6)
    req = torch.tensor([0] * 7 + [1] * 7)
    node = torch.arange(7).repeat(2)
    got = path_counts(tokens, anc, depths, req, node, V)
    for f in range(14):
        b, n = int(req[f]), int(node[f])
        want = torch.zeros(V, dtype=torch.int32)
        for m in _walk_path(parents[b].tolist(), depths[b].tolist(), n):
            want[tokens[b, m]] += 1
        assert torch.equal(got[f], want), (b, n)


def test_draft_vocabulary_columns():
    """A draft vocabulary (EAGLE-3) sees the penalties of the target ids its columns stand
    for."""
    cols = torch.tensor([0, 1, 4, 7, 9])  # draft id -> target id
    req = make_req(1, [7], [9, 9], repetition_penalty=2.0, frequency_penalty=0.5,
                   logit_bias={4: 3.0, 5: 9.0}, min_tokens=4)
    pb = _batch([req])
    counts = TokenCounts(2, V, torch.device("cpu"))
    counts.reset(pb)
    full = torch.randn(1, V)
    step = torch.tensor([1])
    want = pb.apply(full, counts, None, step)[:, cols]
    got = pb.apply(full[:, cols], counts, None, step, cols=cols, vocab=V)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("bad", [
    dict(presence_penalty=2.5), dict(frequency_penalty=-3), dict(repetition_penalty=0.0),
    dict(min_tokens=40), dict(min_tokens=-1), dict(logit_bias={-1: 1.0}),
    dict(logit_bias={3: float("nan")}), dict(logprobs=21), dict(prompt_logprobs=-1),
    dict(max_tokens=-1),
])
def test_sampling_params_refuse_out_of_range(bad):
    with pytest.raises(SamplingParamsError):
        SamplingParams(**{"max_tokens": 32, **bad})


def test_logit_bias_is_clamped_and_keys_become_ids():
    p = SamplingParams(logit_bias={"5": 250.0, 7: -1e9, 2: 0.5})
    assert p.logit_bias == {5: 100.0, 7: -100.0, 2: 0.5}
    assert p.processes_logits and not p.uses_counts
    assert not SamplingParams().processes_logits
