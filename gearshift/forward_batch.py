r"""The device-side description of one forward pass, derived from a StepPlan.

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

VERIFY and DRAFT batches carry a `TreeAttention`: every query token sees the committed
keys of its request (req_to_token[row, :prefix_len]) plus an explicit list of extra key
slots (its tree ancestors among this step's tokens, and itself). A chain is the tree in
which each token's extras are all earlier tokens of the chain:

    verify tokens of one request (root = pending token x, drafts a..e, topk 2):
        x                      extra_slots (by node):  x: [x]
       / \                                             a: [x a]      b: [x b]
      a   b                                            c: [x a c]    d: [x a d]
     / \   \                                           e: [x b e]
    c   d   e
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # prefill chunks (decode requests may ride along as 1-token extends)
    DECODE = "decode"  # exactly one new token per request; CUDA-graph friendly
    VERIFY = "verify"  # target over the pending token + draft chain/tree (tree attention)
    DRAFT = "draft"  # one draft-model step over the current frontier of the draft tree
    DRAFT_EXTEND = "draft_extend"  # draft over newly committed tokens (extend attention)


@dataclass(slots=True)
class TreeAttention:
    """Per-token key sets for VERIFY / DRAFT (written by the speculative batch builder)."""

    token_rows: torch.Tensor  # [num_tokens] int64: req_to_token row of each query token
    prefix_lens: torch.Tensor  # [num_tokens] int32: committed keys req_to_token[row, :len]
    extra_slots: torch.Tensor  # [num_tokens, max_extra] int64: more key slots, -1 = none
    max_prefix_len: int  # host copy of max(prefix_lens)


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
    tree: TreeAttention | None = None  # VERIFY / DRAFT only
