"""The one padding rule (runner/layout.py): each plan's device shape, chosen from the plan
and the graphs a runner captured, for every mode: DECODE padded to a graph's batch size,
EXTEND to a token bucket, VERIFY as chains of one K, chains of mixed K on a token
bucket, trees (and chains on few rows: split-K), or eagerly. Pure CPU: a stand-in runner.
"""

from __future__ import annotations

from types import SimpleNamespace

from gearshift.forward_batch import ForwardMode
from gearshift.request import Request, SamplingParams
from gearshift.runner.graphs import mixed_verify_tokens
from gearshift.runner.layout import plain_layout, verify_layout
from gearshift.scheduler.plan import Layout, StepPlan


def runner(graphs: bool = True, kv_heads: int = 32, max_verify: int = 512):
    pad = (lambda b: 1 << (b - 1).bit_length()) if graphs else (lambda b: b)
    return SimpleNamespace(
        decode_pad=pad, decode_sizes=[1, 2, 4, 8] if graphs else [], extend_rows=9,
        extend_pad=lambda t: (64 if t <= 64 else None) if graphs else None,
        shape_graphs=object() if graphs else None, max_verify_graph_tokens=max_verify,
        model=SimpleNamespace(num_kv_heads=kv_heads), split_k_below=64, graph_draft_depth=4)


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


def test_chains_deeper_than_the_captured_k_run_eagerly() -> None:
    """A hybrid's suffix drafts go deeper than the K the warm-up captured graphs for: such a
    step runs unpadded and eagerly, never capturing a graph while serving."""
    assert verify_layout(runner(), verify([4, 4]), 5) == Layout("chain", 2, 10, 5, ("verify", 2, 5))
    assert verify_layout(runner(), verify([16, 16]), 17) == Layout("chain", 2, 34, 17)
    # mixed with the model's chains: eager too, each chain its own length
    assert verify_layout(runner(), verify([16, 2, 0]), 17) == Layout("chain", 3, 21, 17)


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
