"""The device-side description of one forward pass, derived from a StepPlan.

Data flow: Scheduler.schedule() -> StepPlan -> BatchBuilder.prepare(plan) -> ForwardBatch
-> ModelRunner (model forward, attention backend) -> sampled token ids.

Token layout of an EXTEND batch (requests packed back to back, no padding):

    input_ids      [ r0 t0 t1 t2 | r1 t0 | r2 t0 t1 ]      num_tokens = 6
    extend_start   [ 0,            3,      4        ]      per request
    extend_lens    [ 3,            1,      2        ]
    prefix_lens    [ 5,            9,      0        ]      tokens already in the KV cache
    seq_lens       [ 8,           10,      2        ]      prefix + extend
    logits_indices [ 2,            3,      5        ]      last token of each request

A DECODE batch is the same with every extend_len == 1 (and may be padded to a captured
CUDA-graph size: padded rows point at the reserved dummy slot 0 and dummy row 0).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # prefill chunks (decode requests may ride along as 1-token extends)
    DECODE = "decode"  # exactly one new token per request; CUDA-graph friendly


@dataclass(slots=True)
class ForwardBatch:
    mode: ForwardMode  # set by BatchBuilder from the plan
    batch_size: int  # real requests (<= padded_batch_size)
    padded_batch_size: int  # rows in the per-request tensors (graph size in DECODE)
    num_tokens: int  # rows in the per-token tensors
    # per token                                                   set by BatchBuilder
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    out_cache_loc: torch.Tensor  # [num_tokens] int64: KV slot written by each token
    # per request                                                 set by BatchBuilder
    req_pool_indices: torch.Tensor  # [padded_bs] int64: row of req_to_token
    seq_lens: torch.Tensor  # [padded_bs] int32: KV length after this step
    extend_lens: torch.Tensor  # [padded_bs] int32
    extend_start_loc: torch.Tensor  # [padded_bs] int32
    prefix_lens: torch.Tensor  # [padded_bs] int32
    logits_indices: torch.Tensor  # [padded_bs] int64
    # host copies of the same (from the plan; reading them never syncs the device)
    seq_lens_cpu: list[int]
    extend_lens_cpu: list[int]
    prefix_lens_cpu: list[int]
    max_seq_len: int
    max_extend_len: int
