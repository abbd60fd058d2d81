"""The one padding rule (runner/layout.py): each plan's device shape, chosen from the plan
and the graphs a runner captured, for every mode: DECODE padded to a graph's batch size,
EXTEND to a token bucket, VERIFY as chains of one K, chains of mixed K on a token
bucket, trees (and chains on few rows: split-K), or eagerly. Pure CPU: a stand-in runner.
"""

from __future__ import annotations

from types import SimpleNamespace

from gearshift.forward_batch import ForwardMode
from gearshift.request import Request, SamplingParams
from gearshift.runner.graphs import deep_levels, mixed_verify_tokens, verify_rows
from gearshift.runner.layout import DEEP_ROWS, plain_layout, verify_layout
from gearshift.scheduler.plan import Layout, StepPlan


def runner(graphs: bool = True, kv_heads: int = 32, max_verify: int = 512, deep: int = 0):
    """A runner's layout inputs: the model's K = 4; `deep`: a hybrid's suffix chains up to
    that depth (graphs at the deep depths 8 .. deep)."""
    pad = (lambda b: 1 << (b - 1).bit_length()) if graphs else (lambda b: b)
    per_row = verify_rows(4, deep) if deep else ()
    return SimpleNamespace(
        decode_pad=pad, decode_sizes=[1, 2, 4, 8] if graphs else [], extend_rows=9,
        extend_pad=lambda t: (64 if t <= 64 else None) if graphs else None,
        shape_graphs=object() if graphs else None, max_verify_graph_tokens=max_verify,
        model=SimpleNamespace(num_kv_heads=kv_heads), split_k_below=64,
        config=SimpleNamespace(num_draft_tokens=4), deep_depths=deep_levels(4, deep),
        verify_bucket=lambda rows, t: mixed_verify_tokens(rows, t, per_row))


def request(i: int, computed: int, prompt: int = 6, **params) -> Request:
    req = Request(f"r{i}", list(range(1, prompt + 1)), SamplingParams(**params), 0)
    req.num_computed_tokens = computed
    return req


def plain(mode: ForwardMode, lens: list[int], **params) -> StepPlan:
    plan = StepPlan(mode=mode)
    for i, n in enumerate(lens):
        plan.add(request(i, 6 - n, **params), n)
    return plan


def verify(ks: list[int], topk: int = 1, nodes: int = 0, chunk: int = 0, **params) -> StepPlan:
    """Decoders drafting `ks` (chains: K + 1 nodes; trees: `nodes`), and a prefill chunk of
    `chunk` tokens riding along."""
    plan = StepPlan(mode=ForwardMode.VERIFY, draft_topk=topk)
    for i, k in enumerate(ks):
        plan.add(request(i, 5, **params), 1)
        plan.draft_lens.append(k)
        plan.num_nodes.append((nodes if topk > 1 else k + 1) if k else 1)
        plan.num_scratch.append(k)
    if chunk:
        plan.add(request(len(ks), 0, prompt=chunk + 4), chunk)
        plan.draft_lens.append(0)
        plan.num_nodes.append(chunk)
        plan.num_scratch.append(0)
    return plan


def test_plain_steps_pad_to_their_graphs() -> None:
    r = runner()
    assert plain_layout(r, plain(ForwardMode.DECODE, [1] * 3)) == \
        Layout("decode", 4, 4, graph=("decode", 4))
    assert plain_layout(runner(graphs=False), plain(ForwardMode.DECODE, [1] * 3)) == \
        Layout("decode", 3, 3)
    assert plain_layout(r, plain(ForwardMode.EXTEND, [3, 1])) == \
        Layout("extend", 9, 64, graph=("extend", 64))
    # past the largest bucket, or scoring prompt tokens (every chunk token's logits): eager
    assert plain_layout(r, plain(ForwardMode.EXTEND, [5] * 14)) == Layout("extend", 14, 70)
    assert plain_layout(r, plain(ForwardMode.EXTEND, [3], prompt_logprobs=1)) == \
        Layout("extend", 1, 3)


def test_chains_of_one_k_pad_to_a_decode_graph_size() -> None:
    assert verify_layout(runner(), verify([2, 2, 2]), 3) == \
        Layout("chain", 4, 12, 3, ("verify", 4, 3))
    assert verify_layout(runner(graphs=False), verify([2, 2, 2]), 3) == Layout("chain", 3, 9, 3)
    # past the largest verify graph: eager, unpadded
    assert verify_layout(runner(max_verify=8), verify([2, 2, 2]), 3) == Layout("chain", 3, 9, 3)


def test_deep_suffix_chains_verify_on_few_graph_shapes() -> None:
    """A hybrid's suffix chains deeper than the model's K pad to the next deep depth (8 or
    16 here: the caller's `tree_nodes`) and verify as one extend on a coarse token bucket,
    uniform or not; split-K batches as a tree of that depth. Depths without graphs, and
    batches past DEEP_ROWS, run eagerly, never capturing a graph while serving."""
    r = runner(deep=16)
    assert verify_layout(r, verify([4, 4]), 5) == Layout("chain", 2, 10, 5, ("verify", 2, 5))
    # 2 x 17 real tokens + 1 padding: j = 18 (x 2 rows)
    assert verify_layout(r, verify([16, 16]), 17) == \
        Layout("mixed", 3, 36, 17, ("verify-mixed", 3, 36))
    # 4 rows, 13 + 3 + 1 + 1 real tokens: j = 5 stays; 4 x 9 + 1: j = 10 rounds up to 12
    assert verify_layout(r, verify([12, 2, 0, 0]), 17).graph == ("verify-mixed", 5, 20)
    assert verify_layout(r, verify([8, 8, 8, 8]), 9).graph == ("verify-mixed", 5, 48)
    assert verify_layout(runner(kv_heads=2, deep=16), verify([7, 2]), 9) == \
        Layout("tree", 2, 18, 9, ("verify-tree", 18, 9))
    # no graphs of this depth (the engine's deepest is 8), or too many rows: eager
    assert verify_layout(runner(deep=8), verify([16, 2, 0]), 17) == Layout("chain", 3, 21, 17)
    wide = runner(deep=16)
    wide.decode_pad = lambda b: b
    assert verify_layout(wide, verify([9] + [0] * DEEP_ROWS), 17).graph is None


def test_chains_of_mixed_k_run_on_a_token_bucket() -> None:
    plan = verify([3, 1, 0])
    bucket = mixed_verify_tokens(4, 4 + 2 + 1)
    assert verify_layout(runner(), plan, 4) == \
        Layout("mixed", 5, bucket, 4, ("verify-mixed", 5, bucket))
    # per-node work (penalties) reads only the verified nodes: eager chains
    assert verify_layout(runner(), verify([3, 1, 0], presence_penalty=0.5), 4) == \
        Layout("chain", 3, 7, 4)


def test_trees_and_split_k_chains_verify_one_query_per_node() -> None:
    assert verify_layout(runner(), verify([2, 2], topk=2, nodes=6), 6) == \
        Layout("tree", 2, 12, 6, ("verify-tree", 12, 6))
    # a tree capped below its budget (K cut at the context limit): the draft's own width
    assert verify_layout(runner(), verify([1, 1], topk=2, nodes=6), 3).nodes == 3
    # few (rows x kv heads): chains as a tree (split-K); one decoder at K = 0 verifies its root
    assert verify_layout(runner(kv_heads=2), verify([2, 0, 2]), 3) == \
        Layout("tree", 4, 12, 3, ("verify-tree", 12, 3))
    assert verify_layout(runner(max_verify=8), verify([2, 2], topk=2, nodes=6), 6) == \
        Layout("tree", 2, 12, 6)


def test_chunks_ride_in_an_eager_chain_pass() -> None:
    assert verify_layout(runner(graphs=False), verify([2, 1], chunk=5), 3) == \
        Layout("chain", 3, 3 + 2 + 5, 3)
