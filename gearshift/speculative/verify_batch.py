"""The target's side of a VERIFY step: the batch its forward pass runs over the drafted
nodes (chains as a causal extend, trees with tree attention), and greedy verification
from its argmax, each laid out for a captured CUDA-graph shape where one exists.

    chains:  node j of request i sits at position prefix_i + j; the nodes' slots go to
             req_to_token while building the batch, so ordinary causal extend attention
             reads each prefix once (riders, prefill chunks in the same step, bring their
             chunk; their node 0 is the chunk's last token)
    trees:   one query per valid node; each sees req_to_token[row, :prefix] plus its
             ancestors' slots (forward_batch.py's TreeAttention); the accepted path reaches
             req_to_token on the device after verification (verify_device.record_paths)

Data flow: SpecRunner.run -> chain_batch / tree_batch -> ModelRunner.forward_all ->
greedy_verify (every row greedy or coupled; else verify.verify) -> packed result.
"""

from __future__ import annotations

import torch

from gearshift.forward_batch import ForwardBatch, ForwardMode, TreeAttention
from gearshift.request import Request
from gearshift.runner.batch import Padding, Stager, forward_batch, pad_batch, stage_forward
from gearshift.runner.graphs import mixed_verify_tokens
from gearshift.runner.model_runner import ModelRunner
from gearshift.speculative.tree import DraftTree, ancestor_mask
from gearshift.speculative.verify_device import greedy_packed, pad_flat, pad_greedy_inputs


def chain_batch(runner: ModelRunner, reqs: list[Request], prefix: list[int], tree: DraftTree,
                node_slots: list[list[int]], n_nodes: list[int], n_tree: int, ride: list[bool]):
    """-> (batch, flat node indices, graph key or None, the logits row of each flat node,
    the token rows whose logits the pass computes or None: all of them). With riders
    (eager engines only) the pass computes the nodes' logits alone, not every chunk
    token's."""
    st = Stager(runner.device)
    flat, node_tok, rider_pos, rider_ids, t = [], [], [], [], 0
    extend = [len(s) if r else n for s, r, n in zip(node_slots, ride, n_nodes)]
    for i, (req, p, n, r) in enumerate(zip(reqs, prefix, extend, ride)):
        if r:
            flat.append(i * n_tree)
            node_tok.append(t + n - 1)
            rider_pos.extend(range(t, t + n))
            rider_ids.extend(req.token_slice(p, p + n))
        else:
            flat.extend(i * n_tree + j for j in range(n))
            node_tok.extend(range(t, t + n))
        t += n
    out_loc = [s for slots, n in zip(node_slots, extend) for s in slots[:n]]
    rows = [r.req_pool_index for r in reqs]
    prefix = list(prefix)
    key, mode, b = None, ForwardMode.VERIFY, len(reqs)
    if (runner.shape_graphs is not None and len(set(extend)) == 1 and not any(ride)
            and runner.decode_pad(b) * extend[0] <= runner.max_verify_graph_tokens):
        # uniform candidates per request: pad to a graph batch size (dummy row 0, slot 0)
        n, pad = extend[0], runner.decode_pad(b) - b
        rows, prefix, extend = rows + [0] * pad, prefix + [0] * pad, extend + [n] * pad
        out_loc = out_loc + [0] * (n * pad)
        key = ("verify", len(rows), n)
    stage_forward(st, rows, prefix, extend, [0] * len(out_loc), out_loc, num_real=b)
    st.add_ints("flat", flat)
    st.add_ints("node_tok", node_tok)
    st.add_ints("rider_pos", rider_pos)
    st.add_ints("rider_ids", rider_ids)
    d = st.to_device()
    ids = torch.zeros(len(out_loc), dtype=torch.long, device=d["flat"].device)
    ids[d["node_tok"]] = tree.tokens.view(-1)[d["flat"]]  # riders: their chunk's last token
    ids[d["rider_pos"]] = d["rider_ids"]  # ... is overwritten by the prompt token itself
    d["input_ids"] = ids
    fb = forward_batch(d, mode, b, prefix, extend, runner.kv)
    if any(ride):  # the nodes' logits alone: row j of the pass's logits is node_tok[j]'s
        return fb, d["flat"], key, torch.arange(len(node_tok), device=ids.device), d["node_tok"]
    fb.logits_indices = torch.arange(fb.num_tokens, device=fb.input_ids.device)
    return fb, d["flat"], key, d["node_tok"], None


def mixed_chain_batch(runner: ModelRunner, reqs: list[Request], prefix: list[int],
                      tree: DraftTree, node_slots: list[list[int]], n_nodes: list[int],
                      n_tree: int):
    """Chains of different lengths as one causal extend padded to a token bucket
    (graphs.mixed_verify_tokens), laid out like a padded EXTEND step (runner/batch.py,
    `Padding`): the real requests' T tokens, one dummy request (row 0, slot 0) holding the
    bucket's padding tokens, then empty requests up to padded batch + 1 rows.

        request    r0        r1            | dummy     | empty ...
        tokens     K0 + 1    K1 + 1        | B - T     | 0
        flat       every node of every chain (n_tree each): the nodes past a chain's own
                   K read the first padding token (row T) and are masked by depth <= K

    -> (batch, flat [b * n_tree], graph key, target row of each flat node, row T, the
    drafts each chain verifies [b]: the mask of its flat nodes)."""
    st = Stager(runner.device)
    b, t = len(reqs), sum(n_nodes)
    rows_pad = runner.decode_pad(b)
    bucket = mixed_verify_tokens(rows_pad, t)
    node_tok, starts = [], [0]
    for n in n_nodes:
        node_tok.extend(starts[-1] + j if j < n else t for j in range(n_tree))
        starts.append(starts[-1] + n)
    rows, prefix, extend, _, out_loc = pad_batch(
        ForwardMode.EXTEND, [r.req_pool_index for r in reqs], prefix, n_nodes, [],
        [s for slots, n in zip(node_slots, n_nodes) for s in slots[:n]],
        Padding(rows_pad + 1, bucket))
    stage_forward(st, rows, prefix, extend, [0] * bucket, out_loc, num_real=b)
    st.add_ints("flat", list(range(b * n_tree)))
    st.add_ints("node_tok", node_tok)
    st.add_ints("real_tok", [s + j for s, n in zip(starts, n_nodes) for j in range(n)])
    st.add_ints("real_nodes", [i * n_tree + j for i, n in enumerate(n_nodes) for j in range(n)])
    st.add_ints("k", [n - 1 for n in n_nodes])  # a proposer may draft less than the plan's K
    d = st.to_device()
    ids = torch.zeros(bucket, dtype=torch.long, device=d["flat"].device)
    ids[d["real_tok"]] = tree.tokens.view(-1)[d["real_nodes"]]
    d["input_ids"] = ids
    fb = forward_batch(d, ForwardMode.VERIFY, b, prefix, extend, runner.kv)
    fb.logits_indices = torch.arange(fb.num_tokens, device=ids.device)
    return fb, d["flat"], ("verify-mixed", len(rows), bucket), d["node_tok"], t, d["k"]


def stage_tree_nodes(runner: ModelRunner, reqs: list[Request], prefix: list[int],
                     n_nodes: list[int], n_tree: int) -> tuple[dict[str, torch.Tensor], int]:
    """Per-node index tensors of a tree pass, padded to a graph shape when graphs exist
    (dummy row 0, slot 0). -> (staged tensors, padding tokens)."""
    flat = [i * n_tree + j for i, n in enumerate(n_nodes) for j in range(n)]
    pad = 0
    if runner.shape_graphs is not None:
        pad = runner.decode_pad(len(reqs)) * n_tree - len(flat)
    st = Stager(runner.device)
    st.add_ints("flat", flat)
    st.add_ints("rows", [r.req_pool_index for r, n in zip(reqs, n_nodes) for _ in range(n)]
                + [0] * pad)
    node_prefix = [p for p, n in zip(prefix, n_nodes) for _ in range(n)] + [0] * pad
    st.add_ints("prefix", node_prefix)
    # the batch's int32 fields and index ranges, staged (no conversion launches)
    t_all = len(node_prefix)
    st.add_int32("prefix32", node_prefix)
    st.add_int32("seq32", [p + 1 for p in node_prefix])
    st.add_int32("ones32", [1] * t_all)
    st.add_int32("ar32", list(range(t_all)))
    st.add_ints("ar", list(range(t_all)))
    return st.to_device(), pad


def tree_batch(runner: ModelRunner, tree: DraftTree, slots_bn: torch.Tensor,
               d2: dict[str, torch.Tensor], depth: int, max_prefix: int, pad: int) -> ForwardBatch:
    """`pad` dummy tokens (row 0, slot 0, seeing only slot 0) follow the real ones."""
    b, n = tree.tokens.shape
    flat = d2["flat"]
    anc = tree.ancestors if tree.ancestors is not None else ancestor_mask(tree.parents, depth)
    extra = torch.where(anc, slots_bn[:, None, :], -1).view(b * n, n)[flat]  # [T, N]
    # nodes deeper than their request's K are never accepted; keep their rows in range
    positions = (d2["prefix"][: flat.shape[0]] + tree.depths.view(-1)[flat]).clamp_max(
        runner.max_positions - 1)
    ids, out_loc = tree.tokens.view(-1)[flat], slots_bn.reshape(-1)[flat]
    if pad:
        pad_extra = torch.full((pad, n), -1, dtype=extra.dtype, device=extra.device)
        pad_extra[:, 0] = 0
        extra = torch.cat([extra, pad_extra])
        zeros = ids.new_zeros(pad)
        ids, positions, out_loc = (torch.cat([x, zeros]) for x in (ids, positions, out_loc))
    t = ids.shape[0]
    prefix32 = d2["prefix32"]
    return ForwardBatch(
        mode=ForwardMode.VERIFY, batch_size=t, padded_batch_size=t, num_tokens=t,
        input_ids=ids, positions=positions, out_cache_loc=out_loc,
        req_pool_indices=d2["rows"],
        seq_lens=d2["seq32"], extend_lens=d2["ones32"], extend_start_loc=d2["ar32"],
        prefix_lens=prefix32, logits_indices=d2["ar"], seq_lens_cpu=[], extend_lens_cpu=[],
        prefix_lens_cpu=[], max_seq_len=max_prefix + 1, max_extend_len=1,
        tree=TreeAttention(d2["rows"], prefix32, extra, max_prefix),
    )


def greedy_verify(runner: ModelRunner, tree: DraftTree, target, flat, node_tok, k, depth: int,
                  record, graphed: bool, per_row: int, pad_tok: int | None = None) -> torch.Tensor:
    """Greedy verification from the target's token at each row of its pass, target [T(+pad)]
    (the argmax, or a coupled row's sample; no [B, N, V] logits gathered) -> packed
    [B, 2 * depth + 3]; one CUDA graph per shape after a graphed target forward,
    its batch padded like the target's (a decode graph size), so that requests finishing
    mid-run meet graphs captured at start-up instead of capturing new ones."""
    b, n = tree.tokens.shape
    inputs = {"target": target, "flat": flat, "k": k, "tokens": tree.tokens,
              "parents": tree.parents, "depths": tree.depths}
    if node_tok is not None:
        inputs["node_tok"] = node_tok
    if record is not None:
        inputs.update(zip(("rows", "prefix", "slots"), record))
    req_to_token = runner.kv.req_to_token if record is not None else None
    graphs = runner.shape_graphs
    if not graphed or graphs is None:
        return greedy_packed(inputs, b, n, depth, req_to_token)
    pb = runner.decode_pad(b)
    if pb > b:
        pad_greedy_inputs(inputs, b, pb, n, per_row, pad_tok)
    if node_tok is not None or target.shape[0] >= pb * n:  # sink nodes read a real row
        pad_flat(inputs, pb, n)

    def fn(s):
        return greedy_packed(s, pb, n, depth, req_to_token)

    key = ("verify-greedy", pb, n, depth, inputs["target"].shape[0], inputs["flat"].shape[0],
           node_tok is not None, record is not None)
    return graphs.run(key, fn, inputs)[:b]


def uniform(n_nodes: list[int]) -> int:
    """Nodes per request when every request verifies the same number, else 1."""
    return n_nodes[0] if len(set(n_nodes)) == 1 else 1
