"""BatchBuilder.prepare(plan): allocate exactly the KV slots the plan counts, then build the
device tensors of the ForwardBatch and the SamplingBatch in one host-to-device copy.

Data flow: Scheduler.schedule() -> StepPlan -> prepare() -> (ForwardBatch, SamplingBatch)
-> ModelRunner. The only writer of Request.slots / req_pool_index allocations and of the
device req_to_token table.
"""

from __future__ import annotations

from array import array

import torch

from gearshift.attention.base import KVCache
from gearshift.forward_batch import ForwardBatch, ForwardMode
from gearshift.runner.sampler import SamplingBatch
from gearshift.scheduler.kv_pool import ReqRowPool, SlotPool
from gearshift.scheduler.plan import StepPlan


class BatchBuilder:
    def __init__(self, slots: SlotPool, rows: ReqRowPool, kv: KVCache, device: torch.device) -> None:
        self.slots, self.rows, self.kv = slots, rows, kv
        self.device = device
        self.pin = device.type == "cuda"

    def prepare(self, plan: StepPlan, pad_to: int | None = None) -> tuple[ForwardBatch, SamplingBatch]:
        bs = plan.batch_size
        pbs = max(pad_to or bs, bs)
        input_ids: list[int] = []
        positions: list[int] = []
        out_loc: list[int] = []
        token_rows: list[int] = []
        for req, n, prefix in zip(plan.reqs, plan.extend_lens, plan.prefix_lens):
            if req.req_pool_index < 0:
                req.req_pool_index = self.rows.alloc()
            new = self.slots.alloc(n)
            req.slots.extend(new)
            out_loc.extend(new)
            input_ids.extend(req.token_slice(prefix, prefix + n))
            positions.extend(range(prefix, prefix + n))
            token_rows.extend([req.req_pool_index] * n)
        pad = pbs - bs  # padded DECODE rows: dummy row 0, dummy slot 0, one token each
        input_ids += [0] * pad
        positions += [0] * pad
        out_loc += [0] * pad
        token_rows += [0] * pad
        extend = plan.extend_lens + [1] * pad
        prefix = plan.prefix_lens + [0] * pad
        seq = [p + n for p, n in zip(prefix, extend)]
        start, logits_idx, acc = [], [], 0
        for n in extend:
            start.append(acc)
            acc += n
            logits_idx.append(acc - 1)
        rows = [r.req_pool_index for r in plan.reqs] + [0] * pad

        temps, top_p, top_k, seeds, steps = [], [], [], [], []
        for req in plan.reqs:
            p = req.params
            temps.append(p.temperature)
            top_p.append(p.top_p)
            top_k.append(p.top_k)
            seeds.append(req.sampling_seed)
            steps.append(len(req.output_token_ids))
        temps += [0.0] * pad
        top_p += [1.0] * pad
        top_k += [-1] * pad
        seeds += [0] * pad
        steps += [0] * pad

        # array.array converts a list in one C loop; torch.tensor(list) is ~10x slower
        ints = torch.frombuffer(array(
            "q", input_ids + positions + out_loc + token_rows + rows + seq + extend + start
            + prefix + logits_idx + top_k + seeds + steps), dtype=torch.int64)
        floats = torch.frombuffer(array("f", temps + top_p), dtype=torch.float32)
        if self.pin:
            ints, floats = ints.pin_memory(), floats.pin_memory()
        ints = ints.to(self.device, non_blocking=True)
        floats = floats.to(self.device, non_blocking=True)
        t = len(input_ids)
        sizes = [t, t, t, t, pbs, pbs, pbs, pbs, pbs, pbs, pbs, pbs, pbs]
        (d_ids, d_pos, d_loc, d_rows_tok, d_rows, d_seq, d_ext, d_start, d_prefix, d_logits,
         d_topk, d_seeds, d_steps) = ints.split(sizes)
        d_temps, d_top_p = floats.split([pbs, pbs])

        # this step's tokens now live in these slots: record them in req_to_token
        self.kv.req_to_token[d_rows_tok, d_pos] = d_loc.to(torch.int32)

        fb = ForwardBatch(
            mode=plan.mode, batch_size=bs, padded_batch_size=pbs, num_tokens=t,
            input_ids=d_ids, positions=d_pos, out_cache_loc=d_loc, req_pool_indices=d_rows,
            seq_lens=d_seq.to(torch.int32), extend_lens=d_ext.to(torch.int32),
            extend_start_loc=d_start.to(torch.int32), prefix_lens=d_prefix.to(torch.int32),
            logits_indices=d_logits, seq_lens_cpu=seq, extend_lens_cpu=extend,
            prefix_lens_cpu=prefix, max_seq_len=max(seq, default=0),
            max_extend_len=max(extend, default=0),
        )
        params = [r.params for r in plan.reqs]
        sb = SamplingBatch(
            temperatures=d_temps, top_p=d_top_p, top_k=d_topk, seeds=d_seeds, steps=d_steps,
            all_greedy=all(p.temperature == 0.0 for p in params),
            any_greedy=any(p.temperature == 0.0 for p in params),
            need_top_k=any(p.top_k > 0 for p in params),
            need_top_p=any(p.top_p < 1.0 for p in params),
        )
        assert fb.mode is ForwardMode.EXTEND or t == pbs, "DECODE must carry one token per row"
        return fb, sb
