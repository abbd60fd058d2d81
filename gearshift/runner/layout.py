"""The one padding rule: a plan's device shape (`Layout`, scheduler/plan.py), chosen once
when the step is planned, from the plan and the graphs the runner captured.

    DECODE   padded to a decode graph's batch size
    EXTEND   (max_num_seqs + 1 rows, the fastest token bucket at or above its tokens) on
             an EXTEND graph; eager and unpadded past the largest bucket or when a chunk
             scores its prompt tokens (every chunk token's logits)
    VERIFY   chains of one K: a causal extend, on a graph padded to the decode graph's
             batch size; chains of different K: one extend padded to a token bucket
             (`mixed_verify_tokens`); trees, and chains on too few (request, kv head)
             pairs to fill the GPU (split-K tree attention): one query per node. Eager
             (unpadded) without graphs, past the largest verify graph, or where chunks
             ride along (eager engines only). A hybrid's suffix chains deeper than the
             model's K pad to the next deep depth (ModelRunner.chain_depth) and verify as
             mixed (or split-K) on graphs up to DEEP_ROWS requests, eagerly past them

Data flow: Engine._schedule -> ModelRunner.layout(plan) -> plan.layout ->
BatchBuilder.prepare(plan) -> ModelRunner.forward(batch).
"""

from __future__ import annotations

from gearshift.forward_batch import ForwardMode
from gearshift.scheduler.plan import Layout, StepPlan

# (padded requests x kv heads) under which chains verify with split-K (ModelRunner's
# split_k_below: tests move it)
SPLIT_K_BELOW = 64
# the largest padded batch with graphs for deep suffix chains (the warm-up captures their
# shapes up to it); the scheduler caps suffix drafts at the model's K past it
DEEP_ROWS = 64


def plain_layout(runner, plan: StepPlan) -> Layout:
    b, t = plan.batch_size, plan.num_tokens
    if plan.mode is ForwardMode.DECODE:
        rows = runner.decode_pad(b)
        return Layout("decode", rows, rows, graph=("decode", rows) if runner.decode_sizes else None)
    if plan.batch_size < runner.extend_rows and not any(
            r.wants_logprobs and r.wants_prompt_logprobs(p, n)
            for r, p, n in zip(plan.reqs, plan.prefix_lens, plan.extend_lens)):
        tokens = runner.extend_pad(t)
        if tokens is not None:
            return Layout("extend", runner.extend_rows, tokens, graph=("extend", tokens))
    return Layout("extend", b, t)


def split_k(runner, b: int) -> bool:
    """Do b chains verify with split-K tree attention (graphed only)? Few (request, kv
    head) pairs cannot fill the GPU: split-K spreads each prefix over the SMs; beyond
    that, causal extend reads each prefix once. Decided on the PADDED batch, the graph's
    shape: the warm-up runs every graph size exactly, and a 6-request step padded to 8
    must replay what it captured at 8, not capture a new graph mid-run."""
    if runner.shape_graphs is None:
        return False
    return runner.decode_pad(b) * runner.model.num_kv_heads < runner.split_k_below  # this rank's


def verify_nodes(plan: StepPlan, tree_nodes: int) -> list[int]:
    """Nodes each request verifies: a speculating request its chain or tree (at most
    `tree_nodes`, the draft's width), a plain decoder its pending token, a chunk riding
    along its chunk."""
    return [min(n, tree_nodes) if k else (1 if d else n)
            for k, n, d in zip(plan.draft_lens, plan.num_nodes, plan.decoding)]


def verify_layout(runner, plan: StepPlan, tree_nodes: int) -> Layout:
    """`tree_nodes`: nodes of the step's draft tree per request (chains: K_max + 1)."""
    b, graphed = plan.batch_size, runner.shape_graphs is not None
    deep = plan.draft_topk == 1 and tree_nodes - 1 > runner.config.num_draft_tokens
    if deep and (tree_nodes - 1 not in runner.deep_depths or runner.decode_pad(b) > DEEP_ROWS):
        graphed = False  # no graph of this depth: the start-up captured none
    nodes = verify_nodes(plan, tree_nodes)
    ride = not all(plan.decoding)
    limit = runner.max_verify_graph_tokens
    rows = runner.decode_pad(b) if graphed else b
    if plan.draft_topk == 1 and not ride and not split_k(runner, b):
        if len(set(nodes)) == 1 and not deep:  # (deep chains: few buckets, not every K)
            n = nodes[0]
            if graphed and rows * n <= limit:
                return Layout("chain", rows, rows * n, n, ("verify", rows, n))
            return Layout("chain", b, b * n, n)
        # different lengths: a token bucket, unless per-node work (penalties, grammars,
        # logprobs) reads only the verified nodes, or past the largest verify graph
        bucket = runner.verify_bucket(rows, sum(nodes)) if graphed else 0
        if graphed and bucket <= limit and not any(
                r.processes_logits or r.grammar is not None or r.wants_logprobs
                for r in plan.reqs):
            return Layout("mixed", rows + 1, bucket, tree_nodes, ("verify-mixed", rows + 1, bucket))
        return Layout("chain", b, sum(nodes), tree_nodes)
    if plan.draft_topk == 1 and ride:
        return Layout("chain", b, sum(nodes), tree_nodes)
    if graphed and rows * tree_nodes <= limit:
        return Layout("tree", rows, rows * tree_nodes, tree_nodes,
                      ("verify-tree", rows * tree_nodes, tree_nodes))
    return Layout("tree", b, sum(nodes), tree_nodes)
