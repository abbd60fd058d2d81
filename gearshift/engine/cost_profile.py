"""Build the goodput policy's CostModel at start-up.

On CUDA, for a grid of batch sizes: K = 0 replays the captured decode graph of that size;
K > 0 replays the EXTEND graph over bs*(K+1) tokens (what a chain's verification costs;
eager forward where no graph fits), adds the draft's steps and a host-work prior. Online
observations of real steps replace these quickly. On CPU, and under tensor parallelism
(where a rank cannot replay a graph alone: its collectives wait for the other ranks), a
roofline prior, refined online (and by the speculation warm-up's measured steps).

Data flow: Engine.__init__ -> build_cost_model(runner, ...) -> GoodputPolicy.
"""

from __future__ import annotations

import time

import torch

from gearshift.forward_batch import ForwardMode
from gearshift.policy.cost import CostModel
from gearshift.runner.batch import StepBatch
from gearshift.runner.staging import Stager, forward_batch, stage_forward
from gearshift.scheduler.plan import Layout


def profile_batch_sizes(max_num_seqs: int) -> list[int]:
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    return sorted({s for s in sizes if s < max_num_seqs} | {max_num_seqs})


def _time_tokens(runner, num_tokens: int, repeats: int = 3) -> float:
    st = Stager(runner.device)
    stage_forward(st, [0], [0], [num_tokens], [1] * num_tokens, [0] * num_tokens)
    fb = forward_batch(st.to_device(), ForwardMode.EXTEND, 1, [0], [num_tokens], None)
    batch = StepBatch([], None, Layout("extend", 1, num_tokens), fb)
    runner.forward(batch, all_logits=True)  # warm up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        runner.forward(batch, all_logits=True)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeats * 1e3


def build_cost_model(runner, num_draft_tokens: int, max_num_seqs: int, draft_frac: float,
                     tree_nodes: int = 0) -> CostModel:
    """Gears 0..num_draft_tokens (plain, chains) and, with `tree_nodes`, num_draft_tokens + 1
    (the draft tree)."""
    cfg = runner.model.config
    params = sum(p.numel() for p in runner.model.parameters())
    elem = next(runner.model.parameters()).element_size()
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * elem
    sizes = profile_batch_sizes(max_num_seqs)
    if runner.device.type != "cuda":
        return CostModel.roofline(params * elem, 2.0 * params, kv_per_token, num_draft_tokens,
                                  sizes, bandwidth=2e10, flops=1e11, overhead_ms=2.0,
                                  draft_frac=draft_frac, tree_nodes=tree_nodes)
    if runner.tp is not None:  # timing graphs here would need every rank replaying them too:
        # a prior from this rank's share of the weights; the warm-up then measures real steps
        return CostModel.roofline(params * elem, 2.0 * params, kv_per_token, num_draft_tokens,
                                  sizes, bandwidth=4.2e12, flops=7e14, overhead_ms=0.5,
                                  draft_frac=draft_frac, tree_nodes=tree_nodes)
    model = CostModel()
    cache: dict[int, float] = {}
    limit = runner.max_positions
    plain = {bs: _time_plain(runner, bs) for bs in sizes}
    for k in range(num_draft_tokens + 1 + bool(tree_nodes)):
        pts = []
        for bs in sizes:
            if k == 0:
                pts.append([float(bs), plain[bs]])
                continue
            tokens = min(bs * (tree_nodes if k > num_draft_tokens else 1 + k), limit)
            if tokens not in cache:
                cache[tokens] = _time_verify(runner, tokens)
            ms = cache[tokens] + draft_frac * min(k, num_draft_tokens) * plain[bs] + SPEC_HOST_MS
            pts.append([float(bs), ms])
        model.base[k] = pts
        model.attn_ms_per_token[k] = kv_per_token / 4.2e12 * 1e3
    # one more draft step of a mixed step: the draft's share of a small plain step
    model.draft_ms_per_depth = draft_frac * plain[min(sizes)] if sizes else 0.0
    if cache:  # the draft over many rows: its share of the target's per-token cost there
        longest = max(cache)
        model.catch_up_ms_per_row = draft_frac * cache[longest] / longest
    return model


# Host work of a VERIFY step (drafting glue, verification, commit: synchronous, unlike plain
# steps, which overlap scheduling hides): a prior that the measured step times replace.
SPEC_HOST_MS = 2.0


def _time_plain(runner, bs: int) -> float:
    """A plain decode step at batch `bs`: its CUDA graph when captured (what serving runs),
    else an eager forward."""
    if runner.decode_sizes:
        return runner.plain_graph_ms(("decode", runner.decode_pad(bs)))
    return _time_tokens(runner, bs)


def _time_verify(runner, tokens: int) -> float:
    """The target over `tokens` verify tokens: the EXTEND graph of that size when one is
    captured (a chain verifies as a causal extend), else an eager forward."""
    size = runner.extend_pad(tokens)
    if size is not None:
        return runner.plain_graph_ms(("extend", size))
    return _time_tokens(runner, tokens)
