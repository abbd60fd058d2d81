"""BatchBuilder.prepare(plan): allocate exactly the KV slots the plan counts, then build the
device tensors of the ForwardBatch and the SamplingBatch in one host-to-device copy.

Data flow: Scheduler.schedule() -> StepPlan -> prepare() -> (ForwardBatch, SamplingBatch)
-> ModelRunner. The only writer of Request.slots / req_pool_index allocations for plain
steps (SpecWorker.prepare does it for VERIFY steps) and of req_to_token for extends.
`extend_batch()` builds the same layout from given tokens and slots (no allocation): the
speculative worker uses it for DRAFT_EXTEND.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import torch

from gearshift.attention.base import KVCache
from gearshift.forward_batch import ForwardBatch, ForwardMode
from gearshift.request import Request
from gearshift.runner.sampler import SamplingBatch
from gearshift.scheduler.kv_pool import ReqRowPool, SlotPool
from gearshift.scheduler.plan import StepPlan


class Stager:
    """Collects host lists, moves them to the device in one copy per dtype."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pin = device.type == "cuda"
        self.ints: list[tuple[str, list[int]]] = []
        self.floats: list[tuple[str, list[float]]] = []

    def add_ints(self, name: str, values: list[int]) -> None:
        self.ints.append((name, values))

    def add_floats(self, name: str, values: list[float]) -> None:
        self.floats.append((name, values))

    def _move(self, items, code: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        if not items:
            return {}
        flat = array(code)
        for _, vals in items:
            flat.extend(vals)
        # array.array converts a list in one C loop; torch.tensor(list) is ~10x slower
        t = torch.frombuffer(flat, dtype=dtype) if len(flat) else torch.empty(0, dtype=dtype)
        if self.pin:
            t = t.pin_memory()
        t = t.to(self.device, non_blocking=True)
        parts = t.split([len(v) for _, v in items])
        return {name: part for (name, _), part in zip(items, parts)}

    def to_device(self) -> dict[str, torch.Tensor]:
        out = self._move(self.ints, "q", torch.int64)
        out.update(self._move(self.floats, "f", torch.float32))
        return out


def stage_forward(st: Stager, rows: Sequence[int], prefix: list[int], extend: list[int],
                  input_ids: list[int], out_loc: list[int]) -> None:
    """Per-token and per-request lists of an extend-layout batch (padding already applied)."""
    positions: list[int] = []
    token_rows: list[int] = []
    start, logits_idx, acc = [], [], 0
    for row, p, n in zip(rows, prefix, extend):
        positions.extend(range(p, p + n))
        token_rows.extend([row] * n)
        start.append(acc)
        acc += n
        logits_idx.append(acc - 1)
    st.add_ints("input_ids", input_ids)
    st.add_ints("positions", positions)
    st.add_ints("out_cache_loc", out_loc)
    st.add_ints("token_rows", token_rows)
    st.add_ints("req_pool_indices", list(rows))
    st.add_ints("seq_lens", [p + n for p, n in zip(prefix, extend)])
    st.add_ints("extend_lens", extend)
    st.add_ints("extend_start_loc", start)
    st.add_ints("prefix_lens", prefix)
    st.add_ints("logits_indices", logits_idx)


def forward_batch(d: dict[str, torch.Tensor], mode: ForwardMode, bs: int, prefix: list[int],
                  extend: list[int], kv: KVCache | None) -> ForwardBatch:
    """ForwardBatch over staged tensors; with `kv`, records the tokens' slots in req_to_token."""
    if kv is not None:  # this step's tokens now live in these slots
        kv.req_to_token[d["token_rows"], d["positions"]] = d["out_cache_loc"].to(torch.int32)
    seq = [p + n for p, n in zip(prefix, extend)]
    return ForwardBatch(
        mode=mode, batch_size=bs, padded_batch_size=len(extend),
        num_tokens=d["input_ids"].shape[0], input_ids=d["input_ids"], positions=d["positions"],
        out_cache_loc=d["out_cache_loc"], req_pool_indices=d["req_pool_indices"],
        seq_lens=d["seq_lens"].to(torch.int32), extend_lens=d["extend_lens"].to(torch.int32),
        extend_start_loc=d["extend_start_loc"].to(torch.int32),
        prefix_lens=d["prefix_lens"].to(torch.int32), logits_indices=d["logits_indices"],
        seq_lens_cpu=seq, extend_lens_cpu=extend, prefix_lens_cpu=prefix,
        max_seq_len=max(seq, default=0), max_extend_len=max(extend, default=0),
    )


def stage_sampling(st: Stager, reqs: list[Request], pad: int) -> None:
    temps, top_p, top_k, seeds, steps = [], [], [], [], []
    for req in reqs:
        p = req.params
        temps.append(p.temperature)
        top_p.append(p.top_p)
        top_k.append(p.top_k)
        seeds.append(req.sampling_seed)
        steps.append(len(req.output_token_ids))
    st.add_floats("temperatures", temps + [0.0] * pad)
    st.add_floats("top_p", top_p + [1.0] * pad)
    st.add_ints("top_k", top_k + [-1] * pad)
    st.add_ints("seeds", seeds + [0] * pad)
    st.add_ints("steps", steps + [0] * pad)


def sampling_batch(d: dict[str, torch.Tensor], reqs: list[Request]) -> SamplingBatch:
    params = [r.params for r in reqs]
    return SamplingBatch(
        temperatures=d["temperatures"], top_p=d["top_p"], top_k=d["top_k"], seeds=d["seeds"],
        steps=d["steps"],
        all_greedy=all(p.temperature == 0.0 for p in params),
        any_greedy=any(p.temperature == 0.0 for p in params),
        need_top_k=any(p.top_k > 0 for p in params),
        need_top_p=any(p.top_p < 1.0 for p in params),
    )


class BatchBuilder:
    def __init__(self, slots: SlotPool, rows: ReqRowPool, kv: KVCache, device: torch.device) -> None:
        self.slots, self.rows, self.kv = slots, rows, kv
        self.device = device

    def prepare(self, plan: StepPlan, pad_to: int | None = None) -> tuple[ForwardBatch, SamplingBatch]:
        bs = plan.batch_size
        pad = max(pad_to or bs, bs) - bs  # padded DECODE rows: dummy row 0, dummy slot 0
        input_ids: list[int] = []
        out_loc: list[int] = []
        for req, n, prefix in zip(plan.reqs, plan.extend_lens, plan.prefix_lens):
            if req.req_pool_index < 0:
                req.req_pool_index = self.rows.alloc()
            new = self.slots.alloc(n)
            req.slots.extend(new)
            out_loc.extend(new)
            input_ids.extend(req.token_slice(prefix, prefix + n))
        st = Stager(self.device)
        prefix = plan.prefix_lens + [0] * pad
        extend = plan.extend_lens + [1] * pad
        stage_forward(st, [r.req_pool_index for r in plan.reqs] + [0] * pad, prefix, extend,
                      input_ids + [0] * pad, out_loc + [0] * pad)
        stage_sampling(st, plan.reqs, pad)
        d = st.to_device()
        fb = forward_batch(d, plan.mode, bs, prefix, extend, self.kv)
        assert fb.mode is ForwardMode.EXTEND or fb.num_tokens == fb.padded_batch_size, \
            "DECODE must carry one token per row"
        return fb, sampling_batch(d, plan.reqs)

    def extend_batch(self, mode: ForwardMode, reqs: list[Request], prefix: list[int],
                     extend: list[int], input_ids: list[int]) -> ForwardBatch:
        """An extend-layout batch over slots the requests already own (no allocation)."""
        out_loc: list[int] = []
        for req, p, n in zip(reqs, prefix, extend):
            out_loc.extend(req.slots[p:p + n])
        st = Stager(self.device)
        stage_forward(st, [r.req_pool_index for r in reqs], prefix, extend, input_ids, out_loc)
        return forward_batch(st.to_device(), mode, len(reqs), prefix, extend, None)
