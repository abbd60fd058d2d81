"""Device side of a VERIFY step's result, graph-safe (no host sync): which nodes went
through the target (`node_valid`), greedy verification as one graph body over static
inputs (`greedy_packed`, its batch padded by `pad_greedy_inputs` and `pad_flat`), the
accepted paths' slots written to req_to_token (`record_paths`), and the [B, 2 * D + 4]
result the host reads in the step's one copy (`pack`).

Data flow: SpecRunner.run -> greedy_verify (every row greedy or coupled; else
verify.verify + pack) -> .tolist() (host).
"""

from __future__ import annotations

import torch

from gearshift.speculative.tree import DraftTree
from gearshift.speculative.verify import VerifyResult, verify_greedy_ids


def pad_greedy_inputs(s: dict[str, torch.Tensor], b: int, pb: int, n: int, per_row: int,
                      pad_tok: int | None = None) -> None:
    """Pad greedy verification's inputs from b to pb requests in place: dummy requests with
    K = 0 (only their root is valid, nothing is accepted), `per_row` flat nodes each read
    from the target's padding tokens (`pad_tok`: all from that one row), and a recorded
    path on the dummy req_to_token row 0 at slot 0."""
    extra = pb - b
    dev = s["k"].device

    def rows_like(t: torch.Tensor, value: int | None) -> torch.Tensor:
        more = t[:1].expand(extra, *t.shape[1:]) if value is None else \
            t.new_full((extra, *t.shape[1:]), value)
        return torch.cat([t, more])

    s["k"] = rows_like(s["k"], 0)
    s["tokens"] = rows_like(s["tokens"], 0)
    s["parents"], s["depths"] = rows_like(s["parents"], None), rows_like(s["depths"], None)
    pad_nodes = (torch.arange(b, pb, device=dev)[:, None] * n
                 + torch.arange(per_row, device=dev)).view(-1)  # node j of dummy request i
    s["flat"] = torch.cat([s["flat"], pad_nodes.to(s["flat"].dtype)])
    if "node_tok" in s and pad_tok is not None:
        s["node_tok"] = torch.cat([s["node_tok"], s["node_tok"].new_full((extra * per_row,),
                                                                         pad_tok)])
    elif "node_tok" in s:  # chains: the target's padding tokens follow the real ones
        start = b * per_row
        s["node_tok"] = torch.cat([s["node_tok"], torch.arange(
            start, start + extra * per_row, device=dev, dtype=s["node_tok"].dtype)])
    if "rows" in s:
        s["rows"], s["prefix"], s["slots"] = (rows_like(s[x], 0) for x in ("rows", "prefix", "slots"))


def pad_flat(s: dict[str, torch.Tensor], b: int, n: int) -> None:
    """Pad `flat` in place to b * n entries with the sink node b * n, which counts for
    nothing, so that a graph's shape does not depend on how many nodes the requests' own K
    add up to (a split-K step of chains with different K verifies only each one's nodes)."""
    extra = b * n - s["flat"].shape[0]
    if extra <= 0:
        return
    s["flat"] = torch.cat([s["flat"], s["flat"].new_full((extra,), b * n)])
    if "node_tok" in s:
        s["node_tok"] = torch.cat([s["node_tok"], s["node_tok"].new_zeros(extra)])


def node_valid(flat: torch.Tensor, k: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
    """[B, N] bool: the node went through the target and is within its request's own K
    (`flat` may name the sink node B * N: see pad_flat)."""
    b, n = depths.shape
    valid = torch.zeros(b * n + 1, dtype=torch.bool, device=flat.device).index_fill_(0, flat, True)
    return valid[: b * n].view(b, n) & (depths <= k[:, None])


def pack(res: VerifyResult) -> torch.Tensor:
    """-> [B, 2 * D + 4]: accepted count, path [D + 1], tokens [D + 1], what the top-1
    chain alone would have accepted (-1: not computed) (one host copy)."""
    chain = res.chain_accepted if res.chain_accepted is not None \
        else torch.full_like(res.num_accepted, -1)
    return torch.cat([res.num_accepted[:, None], res.path, res.tokens, chain[:, None]], 1)


def record_paths(req_to_token: torch.Tensor, rows: torch.Tensor, prefix: torch.Tensor,
                 slots: torch.Tensor, res: VerifyResult) -> None:
    """req_to_token[row, L + j] = slot of the j-th accepted node, j <= accepted (columns
    past it repeat the last write). rows, prefix: [B]; slots: [B, N] node slots."""
    d1 = res.path.shape[1]
    j = torch.minimum(torch.arange(d1, device=rows.device)[None, :], res.num_accepted[:, None])
    slot = slots.gather(1, res.path.gather(1, j))  # [B, D + 1]
    req_to_token[rows[:, None].expand(-1, d1), prefix[:, None] + j] = slot.to(req_to_token.dtype)


def greedy_packed(s: dict[str, torch.Tensor], b: int, n: int, depth: int,
                  req_to_token: torch.Tensor | None) -> torch.Tensor:
    """Graph body of greedy verification over static inputs `s` (see _verify_greedy)."""
    flat = s["flat"]
    tgt = s["target"][s["node_tok"]] if "node_tok" in s else s["target"][: flat.shape[0]]
    target = torch.zeros(b * n + 1, dtype=tgt.dtype, device=tgt.device).index_copy_(0, flat, tgt)
    target = target[: b * n]  # without the sink
    tree = DraftTree(s["tokens"], s["parents"], s["depths"])
    res = verify_greedy_ids(tree, node_valid(flat, s["k"], s["depths"]), target.view(b, n), depth)
    if req_to_token is not None:
        record_paths(req_to_token, s["rows"], s["prefix"], s["slots"], res)
    return pack(res)


def greedy_verify(runner, tree: DraftTree, target, flat, node_tok, k, depth: int, record,
                  layout, per_row: int, pad_tok: int | None = None) -> torch.Tensor:
    """Greedy verification from the target's token at each row of its pass, target [T(+pad)]
    (the argmax, or a coupled row's sample; no [B, N, V] logits gathered) -> packed
    [B, 2 * depth + 3]; one CUDA graph per shape after a graphed target pass (its
    `layout`), its batch padded like the target's (a decode graph size), so that requests
    finishing mid-run meet graphs captured at start-up instead of capturing new ones."""
    b, n = tree.tokens.shape
    inputs = {"target": target, "flat": flat, "k": k, "tokens": tree.tokens,
              "parents": tree.parents, "depths": tree.depths}
    if node_tok is not None:
        inputs["node_tok"] = node_tok
    if record is not None:
        inputs.update(zip(("rows", "prefix", "slots"), record))
    req_to_token = runner.kv.req_to_token if record is not None else None
    graphs = runner.shape_graphs
    if layout.graph is None or graphs is None:
        return greedy_packed(inputs, b, n, depth, req_to_token)
    pb = runner.decode_pad(b)
    if pb > b:
        pad_greedy_inputs(inputs, b, pb, n, per_row, pad_tok)
    if layout.kind == "mixed":  # every node's row gathered first: one graph per (rows, N),
        inputs["target"] = inputs["target"][inputs.pop("node_tok")]  # not per token bucket
        node_tok = None
    elif node_tok is not None or target.shape[0] >= pb * n:  # sink nodes read a real row
        pad_flat(inputs, pb, n)

    def fn(s):
        return greedy_packed(s, pb, n, depth, req_to_token)

    key = ("verify-greedy", pb, n, depth, inputs["target"].shape[0], inputs["flat"].shape[0],
           node_tok is not None, record is not None)
    return graphs.run(key, fn, inputs)[:b]
