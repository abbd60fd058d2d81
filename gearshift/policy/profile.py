"""Build the goodput policy's CostModel at start-up.

On CUDA: time the target forward over bs*(K+1) tokens for a grid of batch sizes (eager,
synthetic tokens on the dummy slot; a few ms each), add the draft's share, and let online
observations refine it. On CPU: a roofline prior from the model's size, refined online.

Data flow: Engine.__init__ -> build_cost_model(runner, ...) -> GoodputPolicy.
"""

from __future__ import annotations

import time

import torch

from gearshift.forward_batch import ForwardMode
from gearshift.policy.cost import CostModel
from gearshift.scheduler.batch import Stager, forward_batch, stage_forward


def profile_batch_sizes(max_num_seqs: int) -> list[int]:
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    return sorted({s for s in sizes if s < max_num_seqs} | {max_num_seqs})


def _time_tokens(runner, num_tokens: int, repeats: int = 3) -> float:
    st = Stager(runner.device)
    stage_forward(st, [0], [0], [num_tokens], [1] * num_tokens, [0] * num_tokens)
    fb = forward_batch(st.to_device(), ForwardMode.EXTEND, 1, [0], [num_tokens], None)
    runner.forward_all(fb)  # warm up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        runner.forward_all(fb)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeats * 1e3


def build_cost_model(runner, max_k: int, max_num_seqs: int, draft_frac: float,
                     tokens_per_k: int = 1) -> CostModel:
    cfg = runner.model.config
    params = sum(p.numel() for p in runner.model.parameters())
    elem = next(runner.model.parameters()).element_size()
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * elem
    sizes = profile_batch_sizes(max_num_seqs)
    if runner.device.type != "cuda":
        return CostModel.roofline(params * elem, 2.0 * params, kv_per_token, max_k, sizes,
                                  bandwidth=2e10, flops=1e11, overhead_ms=2.0,
                                  draft_frac=draft_frac, tokens_per_k=tokens_per_k)
    model = CostModel()
    cache: dict[int, float] = {}
    limit = runner.max_positions
    for k in range(max_k + 1):
        pts = []
        for bs in sizes:
            tokens = min(bs * (1 + k * tokens_per_k), limit)
            if tokens not in cache:
                cache[tokens] = _time_tokens(runner, tokens)
            pts.append([float(bs), cache[tokens] * (1 + draft_frac * k)])
        model.base[k] = pts
        model.attn_ms_per_token[k] = kv_per_token / 4.2e12 * 1e3
    return model
