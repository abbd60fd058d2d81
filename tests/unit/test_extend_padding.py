"""The padded EXTEND layout of the CUDA-graph path, checked on CPU: the pure layout
(`pad_batch` + `stage_forward`), the token buckets, and engine runs in which every EXTEND
step is laid out for a bucket and run eagerly, or through the graph cache's static
inputs with a CPU emulation of CUDA graphs (eager_graphs.SharedPoolGraphs): real rows'
logits, aux features and KV equal the unpadded run's, and the only extra writes go to
dummy row 0 / slot 0.

Data flow (tests only): Scheduler plan -> ModelRunner.layout -> BatchBuilder.prepare
(padded) -> ModelRunner.forward (eager | GraphCache.run) vs the same engine unpadded.
"""

from __future__ import annotations

import pytest
import torch
from checkpoints import random_prompts
from eager_graphs import SharedPoolGraphs

from gearshift import SamplingParams
from gearshift.forward_batch import ForwardMode
from gearshift.runner.graphs import (
    extend_token_buckets,
    fastest_at_or_above,
    pick_bucket,
)
from gearshift.runner.staging import Stager, pad_batch, stage_forward
from gearshift.scheduler.plan import Layout


def test_extend_token_buckets() -> None:
    assert extend_token_buckets(0) == []
    assert extend_token_buckets(40) == [40]
    assert extend_token_buckets(200) == [64, 128, 192, 200]
    assert extend_token_buckets(512) == list(range(64, 513, 64))
    assert extend_token_buckets(1100) == list(range(64, 513, 64)) + [640, 768, 896, 1024, 1100]
    sizes = extend_token_buckets(200)
    assert [pick_bucket(sizes, n) for n in (1, 64, 65, 199, 200, 201)] == \
        [64, 64, 128, 200, 200, None]


def test_fastest_graph_at_or_above() -> None:
    """Each bucket runs in the fastest captured graph of its size or larger (ties: the
    smallest): a GEMM tiling can make a smaller shape slower than a larger one."""
    times = {64: 3.0, 128: 3.5, 192: 3.4, 256: 4.0, 448: 17.0, 512: 14.0, 576: 16.0}
    assert fastest_at_or_above(times) == {64: 64, 128: 192, 192: 192, 256: 256, 448: 512,
                                          512: 512, 576: 576}
    assert fastest_at_or_above({64: 1.0, 128: 1.0}) == {64: 64, 128: 128}
    assert fastest_at_or_above({}) == {}


def test_extend_pad_follows_the_route(make_llm, tiny_llama_dir) -> None:
    runner = make_llm(tiny_llama_dir).engine.runner
    runner.extend_sizes = [64, 128, 192]
    assert [runner.extend_pad(n) for n in (1, 64, 65, 192, 193)] == [64, 64, 128, 192, None]
    runner.extend_route = {64: 64, 128: 192, 192: 192}
    assert [runner.extend_pad(n) for n in (1, 64, 65, 192, 193)] == [64, 64, 192, 192, None]


def _staged(rows, prefix, extend, ids, loc, num_real):
    st = Stager(torch.device("cpu"))
    stage_forward(st, rows, prefix, extend, ids, loc, num_real=num_real)
    return {k: v.tolist() for k, v in st.to_device().items()}


def test_extend_padding_layout() -> None:
    # three real requests (rows 5, 2, 7) with 6 tokens, padded to 10 tokens over 6 rows
    ids, loc = [11, 12, 13, 14, 15, 16], [21, 22, 23, 24, 25, 26]
    rows, prefix, extend, ids_p, loc_p = pad_batch(
        ForwardMode.EXTEND, [5, 2, 7], [4, 9, 0], [3, 1, 2], ids, loc, Layout("extend", rows=6, tokens=10))
    assert rows == [5, 2, 7, 0, 0, 0]
    assert prefix == [4, 9, 0, 0, 0, 0]
    assert extend == [3, 1, 2, 4, 0, 0]  # one dummy request holds all padding tokens
    assert ids_p == ids + [0] * 4 and loc_p == loc + [0] * 4  # token id 0, dummy slot 0
    d = _staged(rows, prefix, extend, ids_p, loc_p, num_real=3)
    assert d["positions"] == [4, 5, 6, 9, 0, 1, 0, 1, 2, 3]
    assert d["token_rows"] == [5, 5, 5, 2, 7, 7, 0, 0, 0, 0]
    assert d["extend_start_loc"] == [0, 3, 4, 6, 10, 10]  # empty requests start at T_pad
    assert d["seq_lens"] == [7, 10, 2, 4, 0, 0]
    assert d["logits_indices"] == [2, 3, 5, 0, 0, 0]  # padding rows read token 0
    assert d["req_pool_indices"] == rows and d["extend_lens"] == extend


def test_extend_padding_exact_fit_and_overflow() -> None:
    rows, prefix, extend, ids, loc = pad_batch(
        ForwardMode.EXTEND, [3], [0], [8], list(range(8)), list(range(1, 9)), Layout("extend", 4, 8))
    assert (rows, prefix, extend) == ([3, 0, 0, 0], [0, 0, 0, 0], [8, 0, 0, 0])
    assert ids == list(range(8)) and loc == list(range(1, 9))  # no padding token
    with pytest.raises(AssertionError):
        pad_batch(ForwardMode.EXTEND, [3], [0], [9], [0] * 9, [1] * 9, Layout("extend", 4, 8))
    with pytest.raises(AssertionError):  # no row left for the dummy request
        pad_batch(ForwardMode.EXTEND, [1, 2], [0, 0], [1, 1], [0, 0], [1, 2], Layout("extend", 2, 8))


def test_decode_padding_layout_and_no_padding() -> None:
    rows, prefix, extend, ids, loc = pad_batch(
        ForwardMode.DECODE, [4, 6], [10, 3], [1, 1], [7, 8], [30, 31], Layout("decode", 4, 4))
    assert (rows, prefix, extend) == ([4, 6, 0, 0], [10, 3, 0, 0], [1, 1, 1, 1])
    assert ids == [7, 8, 0, 0] and loc == [30, 31, 0, 0]
    args = ([4], [2], [3], [1, 2, 3], [5, 6, 7])
    out = pad_batch(ForwardMode.EXTEND, *args, None)
    assert out == args and all(a is not b for a, b in zip(out, args))  # copies, not aliases


# ---- engine level: padded (eager) == unpadded -------------------------------------------

ENGINE = dict(max_num_seqs=8, max_num_batched_tokens=40, kv_cache_tokens=1024)
BUCKETS = [16, 32, 48]  # every EXTEND step of ENGINE fits (<= 40 tokens)


def _record(engine, mode: str) -> list[dict]:
    """mode "eager" / "graph": lay EXTEND steps out for BUCKETS (the layout Engine._schedule
    takes from runner.layout(plan)) and run them eagerly / on the ("extend", tokens) graphs
    of the graph cache; "ref": unpadded.
    Records each EXTEND forward's batch, logits [rows, vocab] and aux."""
    runner = engine.runner
    log: list[dict] = []
    if mode != "ref":
        runner.extend_sizes = list(BUCKETS)
    replaying, current = [], []  # inside a graph's replay; the step's own batch
    if mode == "graph":
        runner.shape_graphs = graphs = SharedPoolGraphs()
        runner.capture_plain_graphs(BUCKETS, [])
        run_graph = graphs.run

        def run_and_log(key, fn, inputs):
            replaying.append(key)
            try:
                out = run_graph(key, fn, inputs)
            finally:
                replaying.pop()
            log.append(dict(fb=current[-1], logits=(out[0] if runner.capture else out).clone()))
            return out

        graphs.run = run_and_log
    forward, run = runner._forward_logits, runner._sample_step

    def forward_logits(fb):
        out = forward(fb)
        if fb.mode is ForwardMode.EXTEND and not replaying:
            log.append(dict(fb=fb, logits=(out[0] if runner.capture else out).clone()))
        return out

    def run_and_keep_aux(fb, sb, graph_key):
        current.append(fb)
        tokens, aux = run(fb, sb, graph_key)
        if fb.mode is ForwardMode.EXTEND and aux is not None:
            log[-1]["aux"] = aux.clone()
        return tokens, aux

    runner._forward_logits, runner._sample_step = forward_logits, run_and_keep_aux
    return log


@pytest.mark.parametrize("backend,capture,mode", [
    ("torch", False, "eager"), ("triton", True, "eager"), ("triton", True, "graph")])
def test_padded_extend_matches_unpadded(make_llm, tiny_llama_dir, monkeypatch, backend, capture,
                                        mode) -> None:
    """Same requests through two engines in lockstep; one lays every EXTEND step out for a
    bucket. Triton runs interpreted here (TRITON_INTERPRET=1): the extend kernel sees the
    padded grid (in "graph" mode the grid of the capture-time batch, whose host fields
    are the graph's constants); `capture` also returns aux features, as for EAGLE-3."""
    engines = [make_llm(tiny_llama_dir, attention_backend=backend, **ENGINE).engine
               for _ in range(2)]
    for e in engines:
        e.runner.capture = (0, 1) if capture else ()  # before the graphs capture their outputs
    logs = [_record(engines[0], "ref"), _record(engines[1], mode)]
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(random_prompts([30, 5, 70, 12, 3, 45], seed=1)):
        for e in engines:
            e.add_request(str(i), prompt, params)
    tokens: list[dict] = [{}, {}]
    while engines[0].has_unfinished_requests():
        for e, toks in zip(engines, tokens):
            for out in e.step():
                toks.setdefault(out.request_id, []).extend(out.new_token_ids)
        ref_kv, pad_kv = (e.runner.kv for e in engines)
        # real slots and rows: identical to the unpadded run (extra writes: slot 0, row 0)
        torch.testing.assert_close(pad_kv.k[:, 1:], ref_kv.k[:, 1:], atol=1e-5, rtol=0)
        torch.testing.assert_close(pad_kv.v[:, 1:], ref_kv.v[:, 1:], atol=1e-5, rtol=0)
        assert torch.equal(pad_kv.req_to_token[1:], ref_kv.req_to_token[1:])
        assert not pad_kv.req_to_token[0].any()  # row 0 only ever points at slot 0
        assert not ref_kv.k[:, 0].any() and not ref_kv.req_to_token[0].any()
    assert not engines[1].has_unfinished_requests()
    assert tokens[0] == tokens[1] and len(tokens[0]) == 6

    ref, pad = logs
    assert len(ref) == len(pad) >= 4
    mixed = 0
    for r, p in zip(ref, pad):
        bs, fb = r["fb"].batch_size, p["fb"]
        t = r["fb"].num_tokens
        assert fb.padded_batch_size == ENGINE["max_num_seqs"] + 1 and fb.batch_size == bs
        assert fb.num_tokens == pick_bucket(BUCKETS, t) and fb.max_extend_len == fb.num_tokens
        assert p["logits"].shape[0] == fb.padded_batch_size
        torch.testing.assert_close(p["logits"][:bs], r["logits"], atol=1e-5, rtol=0)
        if capture:  # callers get the real tokens' features only, in the same order
            assert p["aux"].shape == r["aux"].shape == (t, 2 * 64)
            torch.testing.assert_close(p["aux"], r["aux"], atol=1e-5, rtol=0)
        mixed += 1 in fb.extend_lens_cpu[:bs] and max(fb.extend_lens_cpu[:bs]) > 1
    assert mixed, "no step had a prefill chunk with decoders riding along"
    stats = engines[1].runner.graph_stats()
    graphed = len(pad) if mode == "graph" else 0
    assert stats["extend_graphed"] == graphed and stats["extend_eager"] == len(pad) - graphed



def test_padded_extend_with_uninitialised_memory(make_llm, tiny_llama_dir, monkeypatch) -> None:
    """Fresh buffers full of NaN (as recycled memory can be): the torch backend must write
    every row of a padded EXTEND step, padding included, and masked keys must not reach
    real rows. Before the fix the dummy request's rows stayed uninitialised, their NaNs
    reached slot 0's K/V, and decode rows that mask slot 0 still read NaN (0 * NaN)
    and sampled token 0 (seen in CI, after other tests had freed NaN-filled memory)."""
    empty_like = torch.empty_like

    def nan_empty_like(t, *args, **kwargs):
        out = empty_like(t, *args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty_like", nan_empty_like)
    test_padded_extend_matches_unpadded(make_llm, tiny_llama_dir, monkeypatch, "torch", False,
                                        "eager")


def test_masked_keys_never_reach_the_output_even_when_not_finite() -> None:
    """The reference attention (decode, extend, tree) gathers keys past a request's length
    (slot 0 or stale slots) and masks them; a NaN or inf there must not leak through the
    zero weights (0 * NaN = NaN)."""
    from gearshift.attention.torch_backend import _attend

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 1, 8, generator=g) for _ in range(3))
    k, v = k[:, :2].expand(2, 2, 1, 8).repeat(1, 1, 5, 1), v[:, :2].repeat(1, 1, 5, 1)
    mask = torch.tensor([[True, True, True, False, False], [True] * 5])[:, None, None, :]
    ref = _attend(q, k, v, mask, 0.5)
    k[0, :, 3:], v[0, :, 3:] = float("nan"), float("inf")  # past request 0's length
    out = _attend(q, k, v, mask, 0.5)
    assert torch.isfinite(out).all() and torch.equal(out, ref)


