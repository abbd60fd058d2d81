"""The target's pass of a VERIFY step, laid out (StepBatch.lay_out_target) for the plan's
`Layout` (runner/layout.py) like any other step: its host-known parts (rows, positions,
slots, which token row verifies which node) go in a host-to-device copy of their own,
made while the draft runs; the proposer's tokens fill the rows reserved for them on the
device (`fill_drafts`).

    chain:  node j of request i sits at position prefix_i + j; the nodes' slots go to
            req_to_token while preparing, so ordinary causal extend attention reads each
            prefix once (riders, prefill chunks in the same step, bring their chunk;
            their node 0 is the chunk's last token)
    mixed:  chains of different K as one causal extend padded to a token bucket, laid out
            like a padded EXTEND step (runner/batch.py `pad_batch`):

                request    r0        r1            | dummy     | empty ...
                tokens     K0 + 1    K1 + 1        | B - T     | 0
                flat       every node of every chain (N each): the nodes past a chain's
                           own K read the first padding token (row T), masked by depth <= K

    tree:   one query per valid node; each sees req_to_token[row, :prefix] plus its
            ancestors' slots (forward_batch.py's TreeAttention); the accepted path reaches
            req_to_token on the device after verification (verify_device.record_paths).
            Padding: dummy tokens (row 0, slot 0, seeing only slot 0) after the real ones

Data flow: SpecRunner: proposer.propose -> StepBatch.lay_out_target (while the draft
runs) -> stage_verify (host lists) -> verify_pass (device batch) -> fill_drafts ->
ModelRunner.forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch

from gearshift.attention.base import KVCache
from gearshift.forward_batch import ForwardBatch, ForwardMode, TreeAttention
from gearshift.runner.layout import verify_nodes
from gearshift.runner.staging import Stager, forward_batch, pad_batch, stage_forward
from gearshift.scheduler.plan import Layout, StepPlan


@dataclass(slots=True)
class VerifyPass:
    """What verification reads of the target's pass (written by BatchBuilder.prepare)."""

    layout: Layout
    n_nodes: list[int]  # nodes each request verifies (the root, its drafts)
    offsets: list[int]  # the first token row of each request in the pass
    flat: torch.Tensor  # [V] int64: verified nodes as i * N + j
    node_tok: torch.Tensor | None  # [V] the token row (of the logits) of each flat node;
    #                                 None: the pass's rows are the flat nodes (trees)
    select: torch.Tensor | None  # token rows whose logits the pass computes (riders)
    k: torch.Tensor  # [B] int64: drafts each request verifies (its depth mask)
    per_row: int  # flat nodes per request where uniform (greedy verification's padding)
    pad_tok: int | None  # the mixed layout's first padding token (shorter chains read it)
    fill_tok: torch.Tensor | None = None  # [F] token rows the drafts fill (chains) ...
    fill_flat: torch.Tensor | None = None  # ... from these flat nodes
    slots: torch.Tensor | None = None  # [B, N] node slots (trees: recorded on acceptance)
    tree_index: dict[str, torch.Tensor] | None = None  # per-node tensors of a tree pass


def stage_verify(st: Stager, plan: StepPlan, layout: Layout, slots: list[list[int]],
                 riders: list[list[int]]) -> tuple[list[int], ...]:
    """Host lists of the target pass into the step's copy. `riders`: each request's chunk
    tokens where it rides along ([] otherwise). -> (per-request rows, prefix, extend) of
    the pass (padding included; trees: empty), and each request's tokens in it."""
    b, n_tree = plan.batch_size, layout.nodes
    tokens = verify_nodes(plan, n_tree)  # riders: their chunk
    n_nodes = [min(t, n_tree) for t in tokens]
    if layout.kind == "tree":
        flat = [i * n_tree + j for i, n in enumerate(n_nodes) for j in range(n)]
        pad = layout.tokens - len(flat)
        st.add_ints("t_flat", flat)
        st.add_ints("t_rows", [r.req_pool_index for r, n in zip(plan.reqs, n_nodes)
                               for _ in range(n)] + [0] * pad)
        node_prefix = [p for p, n in zip(plan.prefix_lens, n_nodes) for _ in range(n)] + [0] * pad
        st.add_ints("t_prefix", node_prefix)
        # the batch's int32 fields and index ranges, staged (no conversion launches)
        st.add_int32("t_prefix32", node_prefix)
        st.add_int32("t_seq32", [p + 1 for p in node_prefix])
        st.add_int32("t_ones32", [1] * layout.tokens)
        st.add_int32("t_ar32", list(range(layout.tokens)))
        st.add_ints("t_ar", list(range(layout.tokens)))
        return [], [], [], tokens
    rows = [r.req_pool_index for r in plan.reqs]
    out_loc = [x for s, t in zip(slots, tokens) for x in s[:t]]
    ids = [0] * len(out_loc)  # the drafts' rows, filled on the device
    node_tok, flat, t = [], [], 0
    if layout.kind == "mixed":
        total = sum(n_nodes)  # the first padding token: shorter chains' nodes read it
        for n in n_nodes:
            node_tok.extend(t + j if j < n else total for j in range(n_tree))
            t += n
        flat = list(range(b * n_tree))
        starts = [0, *accumulate(n_nodes)]
        st.add_ints("real_tok", [s + j for s, n in zip(starts, n_nodes) for j in range(n)])
        st.add_ints("real_nodes", [i * n_tree + j for i, n in enumerate(n_nodes) for j in range(n)])
        rows, prefix, extend, ids, out_loc = pad_batch(
            ForwardMode.EXTEND, rows, plan.prefix_lens, n_nodes, ids, out_loc, layout)
    else:
        rider_pos = set()
        for i, (n, chunk) in enumerate(zip(tokens, riders)):
            if chunk:  # node 0 is the chunk's last token; the chunk's own ids fill the rest
                flat.append(i * n_tree)
                node_tok.append(t + n - 1)
                ids[t:t + n] = chunk
                rider_pos.add(i)
            else:
                flat.extend(i * n_tree + j for j in range(n))
                node_tok.extend(range(t, t + n))
            t += n
        prefix, extend = list(plan.prefix_lens), list(tokens)
        if rider_pos:
            st.add_ints("fill_tok", [x for x, f in zip(node_tok, flat)
                                     if f // n_tree not in rider_pos])
            st.add_ints("fill_flat", [f for f in flat if f // n_tree not in rider_pos])
            st.add_ints("node_rows", list(range(len(node_tok))))
        pad = layout.rows - b  # a graph's batch: dummy requests (row 0, slot 0)
        rows, prefix, extend = rows + [0] * pad, prefix + [0] * pad, extend + [n_tree] * pad
        out_loc, ids = out_loc + [0] * (n_tree * pad), ids + [0] * (n_tree * pad)
    stage_forward(st, rows, prefix, extend, ids, out_loc, num_real=b,
                  logits_indices=list(range(len(out_loc))))
    st.add_ints("flat", flat)
    st.add_ints("node_tok", node_tok)
    return rows, prefix, extend, tokens


def verify_pass(d: dict[str, torch.Tensor], plan: StepPlan, layout: Layout,
                lists: tuple[list[int], ...], kv: KVCache) -> tuple[ForwardBatch, VerifyPass]:
    """The pass's ForwardBatch over the staged tensors (chains record their nodes' slots in
    req_to_token now) and what verification reads of it; `lists`: stage_verify's."""
    b, n_tree = plan.batch_size, layout.nodes
    _, prefix, extend, tokens = lists
    n_nodes = [min(t, n_tree) for t in tokens]
    offsets = [0, *accumulate(tokens)][:b]
    uniform = n_nodes[0] if len(set(n_nodes)) == 1 else 1
    if layout.kind == "tree":
        slots = d["node_slots"].view(b, -1)
        slots = slots[:, :n_tree] if slots.shape[1] >= n_tree else \
            torch.nn.functional.pad(slots, (0, n_tree - slots.shape[1]))
        tree = {k[2:]: v for k, v in d.items() if k.startswith("t_")}
        t, p32 = layout.tokens, tree["prefix32"]
        max_prefix = max(plan.prefix_lens)
        fb = ForwardBatch(  # input ids, positions and slots: set by fill_drafts
            mode=ForwardMode.VERIFY, batch_size=t, padded_batch_size=t, num_tokens=t,
            input_ids=tree["prefix"], positions=tree["prefix"], out_cache_loc=tree["prefix"],
            req_pool_indices=tree["rows"], seq_lens=tree["seq32"], extend_lens=tree["ones32"],
            extend_start_loc=tree["ar32"], prefix_lens=p32, logits_indices=tree["ar"],
            seq_lens_cpu=[], extend_lens_cpu=[], prefix_lens_cpu=[], max_seq_len=max_prefix + 1,
            max_extend_len=1, tree=TreeAttention(tree["rows"], p32, None, max_prefix))
        return fb, VerifyPass(layout, n_nodes, offsets, tree["flat"], None, None, d["k"],
                              uniform, None, slots=slots, tree_index=tree)
    fb = forward_batch(d, ForwardMode.VERIFY, b, prefix, extend, kv)
    ride = "node_rows" in d
    vp = VerifyPass(layout, n_nodes, offsets, d["flat"],
                    d["node_rows"] if ride else d["node_tok"], d["node_tok"] if ride else None,
                    d["k"], n_tree if layout.kind == "mixed" else uniform,
                    sum(n_nodes) if layout.kind == "mixed" else None,
                    d["fill_tok"] if ride else d["node_tok"],
                    d["fill_flat"] if ride else d["flat"])
    if layout.kind == "mixed":
        vp.fill_tok, vp.fill_flat = d["real_tok"], d["real_nodes"]
    return fb, vp


def fill_drafts(fb: ForwardBatch, vp: VerifyPass, tokens: torch.Tensor, depths: torch.Tensor,
                ancestors: torch.Tensor | None, max_positions: int) -> None:
    """Write the proposer's tree into the pass's reserved rows, on the device: its tokens
    [B, N] (and for a tree layout each node's depth [B, N] and ancestor mask [B, N, N])."""
    b, n = tokens.shape
    assert n == vp.layout.nodes, f"the draft made {n} nodes a request, the layout has " \
        f"{vp.layout.nodes}"
    if vp.tree_index is None:
        fb.input_ids[vp.fill_tok] = tokens.view(-1)[vp.fill_flat]
        return
    ti, flat, slots = vp.tree_index, vp.flat, vp.slots
    extra = torch.where(ancestors, slots[:, None, :], -1).view(b * n, n)[flat]  # [T, N]
    # nodes deeper than their request's K are never accepted; keep their rows in range
    positions = (ti["prefix"][: flat.shape[0]] + depths.view(-1)[flat]).clamp_max(
        max_positions - 1)
    ids, out_loc = tokens.view(-1)[flat], slots.reshape(-1)[flat]
    pad = vp.layout.tokens - flat.shape[0]
    if pad:
        pad_extra = torch.full((pad, n), -1, dtype=extra.dtype, device=extra.device)
        pad_extra[:, 0] = 0
        extra = torch.cat([extra, pad_extra])
        zeros = ids.new_zeros(pad)
        ids, positions, out_loc = (torch.cat([x, zeros]) for x in (ids, positions, out_loc))
    fb.input_ids, fb.positions, fb.out_cache_loc = ids, positions, out_loc
    fb.tree.extra_slots = extra
